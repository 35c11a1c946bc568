"""deform_conv2d on the PyTorch side and through export: against torchvision
(where its compiled ops load) and against a plain numpy reference (always)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import opbridge
import opbridge_ort
from ort_cases.deform_conv2d import deform_conv2d_reference


def _torchvision_ops():
    try:
        import torchvision

        torch.ops.torchvision.deform_conv2d  # noqa: B018  (raises if the compiled ops do not load)
        return torchvision
    except Exception:
        return None


torchvision = _torchvision_ops()
needs_torchvision = pytest.mark.skipif(
    torchvision is None, reason="torchvision's compiled ops do not load with this torch (e.g. the CPU-only build)"
)

# (N, C_in, H, W, C_out, kernel, stride, padding, dilation, groups, offset_groups, mask, bias)
CONFIGS = [
    (1, 4, 7, 6, 5, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, True, True),
    (2, 6, 9, 8, 4, (3, 2), (2, 1), (0, 2), (1, 2), 2, 3, False, True),  # non-square kernel, groups, 3 offset groups
    (2, 8, 5, 5, 8, (1, 3), (1, 2), (1, 0), (2, 1), 4, 2, True, False),
    (3, 3, 4, 11, 3, (2, 2), (1, 1), (2, 2), (1, 1), 3, 1, True, True),  # depthwise
    (1, 2, 10, 10, 2, (5, 5), (3, 3), (2, 2), (1, 1), 1, 2, False, False),
]


def _inputs(config, dtype, seed=0):
    n, c, h, w, c_out, (kh, kw), stride, padding, dilation, groups, offset_groups, use_mask, use_bias = config
    g = torch.Generator().manual_seed(seed)
    out_h = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    out_w = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    x = torch.randn(n, c, h, w, generator=g, dtype=dtype)
    weight = torch.randn(c_out, c // groups, kh, kw, generator=g, dtype=dtype)
    offset = 2 * torch.randn(n, 2 * offset_groups * kh * kw, out_h, out_w, generator=g, dtype=dtype)
    mask = torch.rand(n, offset_groups * kh * kw, out_h, out_w, generator=g, dtype=dtype) if use_mask else None
    bias = torch.randn(c_out, generator=g, dtype=dtype) if use_bias else None
    return x, offset, weight, bias, stride, padding, dilation, mask, groups, offset_groups


TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(map(str, c[:5])) + f"-k{c[5]}")
def test_matches_numpy_reference(config, dtype):
    x, offset, weight, bias, stride, padding, dilation, mask, groups, offset_groups = _inputs(config, dtype)
    out = opbridge.deform_conv2d(x, offset, weight, bias, stride, padding, dilation, mask)
    expected = deform_conv2d_reference(
        x.numpy(), weight.numpy(), offset.numpy(), None if bias is None else bias.numpy(),
        None if mask is None else mask.numpy(), stride, (*padding, *padding), dilation, groups, offset_groups,
    )  # fmt: skip
    np.testing.assert_allclose(out.numpy(), expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@needs_torchvision
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(map(str, c[:5])) + f"-k{c[5]}")
def test_matches_torchvision(config, dtype):
    x, offset, weight, bias, stride, padding, dilation, mask, _, _ = _inputs(config, dtype)
    ours = opbridge.deform_conv2d(x, offset, weight, bias, stride, padding, dilation, mask)
    theirs = torchvision.ops.deform_conv2d(x, offset, weight, bias, stride, padding, dilation, mask)
    torch.testing.assert_close(ours, theirs, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@needs_torchvision
def test_module_twin_matches_torchvision_module():
    ours = opbridge.nn.DeformConv2d(4, 6, (3, 2), stride=1, padding=(1, 0), groups=2)
    theirs = torchvision.ops.DeformConv2d(4, 6, (3, 2), stride=1, padding=(1, 0), groups=2)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 4, 8, 8)
    offset = torch.randn(2, 2 * 6, 8, 7)
    torch.testing.assert_close(ours(x, offset), theirs(x, offset))


def test_bad_inputs_raise_clear_errors():
    x, offset, weight, bias, _, _, _, mask, _, _ = _inputs(CONFIGS[0], torch.float32)
    call = opbridge.deform_conv2d
    cases = [
        (lambda: call(x[0], offset, weight), "input must be 4-D"),
        (lambda: call(x, offset[:, :4], weight), "offset.shape\\[1\\] \\(4\\) must be a multiple of 2 \\* kernel_h"),
        (lambda: call(x, offset[:, :, :2], weight, padding=1), "offset must have shape \\[1, 18, 7, 6\\]"),
        (lambda: call(x, offset, weight[:, :3], padding=1), "in_channels / groups = 3\\) must divide the 4 channels"),
        (lambda: call(x, offset, weight, bias[:2], padding=1), "bias must have 5 elements"),
        (lambda: call(x, offset, weight, None, 1, 1, 1, mask[:, :2]), "mask must have shape"),
        (lambda: call(x, offset, weight.double(), padding=1), "weight must have the dtype of input"),
        (lambda: call(x.int(), offset, weight), "expected float32 or float64"),
        (
            lambda: torch.ops.opbridge.deform_conv2d(x, offset, weight, None, [0, 0], [1, 1], [1, 1], None),
            "must be positive",
        ),
        (lambda: torch.ops.opbridge.deform_conv2d(x, offset, weight, None, [1, 1], [-1, -1], [1, 1], None), "not be"),
        (lambda: call(x[:, :, :1, :1], offset, weight), "does not fit"),
    ]
    for run, pattern in cases:
        with pytest.raises(RuntimeError, match=pattern):
            run()


@pytest.mark.parametrize("config", CONFIGS[:3], ids=lambda c: "x".join(map(str, c[:5])))
def test_opcheck(config):
    x, offset, weight, bias, stride, padding, dilation, mask, _, _ = _inputs(config, torch.float64)
    args = (x, offset, weight, bias, list(stride), list(padding), list(dilation), mask)
    # Forward only (no autograd formula): skip the autograd registration check.
    torch.library.opcheck(
        torch.ops.opbridge.deform_conv2d.default,
        args,
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic"),
    )


def _model(use_torchvision: bool):
    class Model(torch.nn.Module):
        """The tutorial's model: a Conv2d predicts offsets and a mask for a deformable conv."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.offsets = torch.nn.Conv2d(3, 2 * 9 + 9, 3, padding=1)
            self.weight = torch.nn.Parameter(torch.randn(4, 3, 3, 3))
            self.bias = torch.nn.Parameter(torch.randn(4))

        def forward(self, x):
            predicted = self.offsets(x)
            offset, mask = predicted[:, :18], torch.sigmoid(predicted[:, 18:])
            ops = torchvision.ops if use_torchvision else opbridge
            return ops.deform_conv2d(x, offset, self.weight, self.bias, padding=(1, 1), mask=mask)

    return Model().eval()


@pytest.mark.parametrize("use_torchvision", [False, pytest.param(True, marks=needs_torchvision)],
                         ids=["opbridge", "torchvision"])  # fmt: skip
@pytest.mark.parametrize(
    ("dynamo", "opset", "lowering"),
    [(False, 11, "standard"), (False, 19, "standard"), (False, 12, "custom"), (True, 18, "standard"),
     (True, 20, "standard"), (True, 18, "custom")],
)  # fmt: skip
def test_dynamic_batch_and_spatial_size(tmp_path, use_torchvision, dynamo, opset, lowering):
    model = _model(use_torchvision)
    x = torch.randn(2, 3, 12, 10)
    axes = {"x": {0: "batch", 2: "height", 3: "width"}}
    proto = opbridge.onnx.export(
        model, (x,), None, opset_version=opset, dynamo=dynamo, lowering=lowering, input_names=["x"],
        dynamic_axes=axes if not dynamo else None,
        **({"dynamic_shapes": ({0: torch.export.Dim("batch"), 2: torch.export.Dim("height"),
                                3: torch.export.Dim("width")},)} if dynamo else {}),
    )  # fmt: skip
    ops = {(n.domain, n.op_type) for n in proto.graph.node}
    if lowering == "custom":
        assert ("opbridge", "DeformConv2d") in ops
    elif opset >= 19:
        assert ("", "DeformConv") in ops
    else:
        assert ("", "DeformConv") not in ops and all(domain == "" for domain, _ in ops)
    session = opbridge_ort.InferenceSession(proto)
    for shape in [(1, 3, 12, 10), (3, 3, 7, 15)]:  # other batch and spatial sizes than exported
        other = torch.randn(shape)
        (y,) = session.run(None, {"x": other.numpy()})
        torch.testing.assert_close(torch.from_numpy(y), model(other), rtol=1e-4, atol=1e-4)


def test_standard_deformconv_model_runs_on_ort_with_the_kernel():
    version = tuple(int(v) for v in onnxruntime.__version__.split(".")[:2])
    proto = opbridge.onnx.export(_model(False), (torch.randn(1, 3, 8, 8),), None, opset_version=19, dynamo=False)
    assert "DeformConv" in {n.op_type for n in proto.graph.node}
    onnx.checker.check_model(proto)
    if version >= (1, 25):
        onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    else:
        with pytest.raises(Exception, match="DeformConv"):
            onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.skipif(
    tuple(int(v) for v in onnxruntime.__version__.split(".")[:2]) < (1, 25),
    reason="this onnxruntime has no DeformConv kernel (added in 1.25) to compare with",
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(map(str, c[:5])) + f"-k{c[5]}")
def test_custom_kernel_matches_ort_deformconv(config, dtype):
    """opbridge::DeformConv2d against ONNX Runtime's own DeformConv on the same inputs and attributes."""
    x, offset, weight, bias, stride, padding, dilation, mask, _, _ = _inputs(config, dtype)

    class Model(torch.nn.Module):
        def forward(self, x, offset, weight, *rest):
            bias_, mask_ = (rest[0] if bias is not None else None), (rest[-1] if mask is not None else None)
            return opbridge.deform_conv2d(x, offset, weight, bias_, stride, padding, dilation, mask_)

    inputs = (x, offset, weight, *([bias] if bias is not None else []), *([mask] if mask is not None else []))
    names = ["x", "offset", "weight", "bias", "mask"][:3] + (["bias"] if bias is not None else [])
    names += ["mask"] if mask is not None else []
    feeds = {n: t.numpy() for n, t in zip(names, inputs, strict=True)}
    outputs = []
    for lowering in ("standard", "custom"):
        proto = opbridge.onnx.export(
            Model().eval(), inputs, None, opset_version=19, dynamo=False, lowering=lowering, input_names=names
        )
        outputs.append(opbridge_ort.InferenceSession(proto).run(None, feeds)[0])
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=TOLERANCE[dtype] * 10, atol=TOLERANCE[dtype] * 10)


# The contract of this op's public entry points (docs/api.md), run by tests/test_contract.py: bad inputs, the
# error type and the words its message must contain.
_X = torch.randn(1, 4, 5, 5)
_W = torch.randn(6, 4, 3, 3)
_OFFSET = torch.zeros(1, 18, 3, 3)
CONTRACT_CASES = {
    "opbridge.deform_conv2d": [
        (lambda: opbridge.deform_conv2d(_X, None, _W), TypeError, ["offset must be a tensor", "NoneType"]),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, bias="b"), TypeError, ["bias must be a tensor or None"]),
        (
            lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, stride=(1.7, 1.7)),
            TypeError,
            ["stride must be an int or a pair of ints", "1.7"],
        ),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, stride=1.5), TypeError, ["stride", "1.5"]),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, padding=(0.9, 0.9)), TypeError, ["padding", "0.9"]),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, dilation=True), TypeError, ["dilation", "True"]),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, stride=(1, 2, 3)), TypeError, ["stride", "pair"]),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, padding=-1), ValueError, ["padding must be >= 0"]),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, stride=0), ValueError, ["stride must be >= 1"]),
        (
            lambda: opbridge.deform_conv2d(_X, _OFFSET, torch.randn(6, 8, 3, 3)),
            RuntimeError,
            ["in_channels / groups = 8", "4 channels of input"],
        ),
        (lambda: opbridge.deform_conv2d(_X.int(), _OFFSET.int(), _W.int()), RuntimeError, ["float32 or float64"]),
        (
            lambda: opbridge.deform_conv2d(_X, _OFFSET.double(), _W),
            RuntimeError,
            ["offset must have the dtype of input"],
        ),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W.to("meta")), RuntimeError, ["one device", "weight on meta"]),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET[:, :3], _W), RuntimeError, ["offset"]),
        (lambda: opbridge.deform_conv2d(_X[0], _OFFSET, _W), RuntimeError, ["4-D"]),
    ],
    "opbridge.nn.DeformConv2d": [
        (lambda: opbridge.nn.DeformConv2d(4, 6, 3, groups=4), ValueError, ["groups=4", "out_channels=6"]),
        (lambda: opbridge.nn.DeformConv2d(4, 6, 1.5), TypeError, ["kernel_size", "1.5"]),
        (lambda: opbridge.nn.DeformConv2d(4.0, 6, 3), TypeError, ["in_channels"]),
        (lambda: opbridge.nn.DeformConv2d(0, 6, 3), ValueError, ["in_channels must be >= 1"]),
        (lambda: opbridge.nn.DeformConv2d(4, 6, 3, stride=0), ValueError, ["stride must be >= 1"]),
        (lambda: opbridge.nn.DeformConv2d(4, 6, 3)(_X, None), TypeError, ["offset must be a tensor"]),
    ],
}
