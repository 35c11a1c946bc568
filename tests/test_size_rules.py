"""Rules on sizes cost nothing where nothing is needed (issue: RF-DETR's TorchScript export doubled in nodes with
opbridge imported, from the floor_divide rule's sign corrections on traced sizes)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import onnx
import onnxruntime
import torch

import opbridge  # noqa: F401  (the rules under test)


class _Sizes(torch.nn.Module):
    """What detection models do with traced sizes: a feature map's size over a stride, a patch grid."""

    def forward(self, x):
        h, w = x.shape[2] // 4, x.shape[3] // 2
        n = x.shape[0] // 1
        return x[:, :, :h, :w].reshape(n, -1, h * w) * (x.shape[1] // 3)


class _Signed(torch.nn.Module):
    def forward(self, x):
        return x // 3, x // -3


def _export(model, args, path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), dynamo=False, **kwargs)
    return onnx.load(str(path))


_WITHOUT = """
import sys, warnings, torch, onnx
warnings.simplefilter("ignore")
sys.path.insert(0, {tests!r})
from test_size_rules import _Sizes
torch.onnx.export(_Sizes(), (torch.randn(2, 3, 16, 12),), {path!r}, dynamo=False, input_names=["x"],
                  dynamic_axes={{"x": {{0: "n", 2: "h", 3: "w"}}}})
"""


def test_dynamic_sizes_over_constants_export_as_one_div_each(tmp_path):
    dynamic = {"x": {0: "n", 2: "h", 3: "w"}}
    model = _export(_Sizes(), (torch.randn(2, 3, 16, 12),), tmp_path / "with.onnx", input_names=["x"],
                    dynamic_axes=dynamic)  # fmt: skip
    kinds = [n.op_type for n in model.graph.node]
    assert "Xor" not in kinds and "Where" not in kinds, kinds
    # Without opbridge (a process that never imports it): not fewer nodes than with it.
    subprocess.run([sys.executable, "-c", _WITHOUT.format(tests=str(__import__("pathlib").Path(__file__).parent),
                                                          path=str(tmp_path / "without.onnx"))],
                   check=True, capture_output=True)  # fmt: skip
    without = len(onnx.load(str(tmp_path / "without.onnx")).graph.node)
    assert len(kinds) <= without, (len(kinds), without)
    session = onnxruntime.InferenceSession(str(tmp_path / "with.onnx"), providers=["CPUExecutionProvider"])
    for shape in [(2, 3, 16, 12), (1, 3, 23, 9), (3, 3, 4, 2)]:  # channels are static in this export
        x = torch.randn(shape)
        np.testing.assert_allclose(session.run(None, {"x": x.numpy()})[0], _Sizes()(x).numpy())
    static = _export(_Sizes(), (torch.randn(2, 3, 16, 12),), tmp_path / "static.onnx", input_names=["x"])
    np.testing.assert_allclose(
        onnxruntime.InferenceSession(static.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": np.ones((2, 3, 16, 12), np.float32)}
        )[0],
        _Sizes()(torch.ones(2, 3, 16, 12)).numpy(),
    )


def test_signed_values_still_floor(tmp_path):
    """Where the dividend may be negative the correction stays: -7 // 3 is -3, not truncation's -2."""
    x = torch.tensor([-7, -6, -1, 0, 1, 7], dtype=torch.int64)
    _export(_Signed(), (x,), tmp_path / "signed.onnx", input_names=["x"], dynamic_axes={"x": {0: "n"}})
    session = onnxruntime.InferenceSession(str(tmp_path / "signed.onnx"), providers=["CPUExecutionProvider"])
    for got, expected in zip(session.run(None, {"x": x.numpy()}), _Signed()(x), strict=True):
        np.testing.assert_array_equal(got, expected.numpy())
