"""The nodes mmcv and mmdeploy write for ONNX Runtime, run by the opbridge library: against torch's and
torchvision's own ops (the ORT cases in tests/ort_cases check them against published values and numpy references on
old and new ORT), a real model exported with mmdeploy's node, the node table (docs/openmmlab.md) and inspect."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import helper

import opbridge_ort
from opbridge_ort import openmmlab

TESTS = Path(__file__).parent
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))
from ort_cases import carafe, cummax, deform_conv2d, grid_sampler, masked_conv2d, nms, roi_align  # noqa: E402

torchvision = pytest.importorskip("torchvision", reason="the torchvision references need torchvision")


def run(model: bytes, feeds: dict, threads: int = 2):
    options = opbridge_ort.session_options()
    options.intra_op_num_threads = threads
    return opbridge_ort.InferenceSession(model, options).run(None, feeds)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding", grid_sampler.PADDINGS)
@pytest.mark.parametrize("interpolation", grid_sampler.INTERPOLATIONS)
def test_grid_sampler_matches_torch(interpolation, padding, align_corners, dtype):
    rng = np.random.default_rng(0)
    x, grid = rng.standard_normal((2, 3, 6, 9)).astype(dtype), rng.uniform(-1.3, 1.3, (2, 5, 7, 2)).astype(dtype)
    want = F.grid_sample(torch.from_numpy(x), torch.from_numpy(grid), interpolation, padding, align_corners).numpy()
    attrs = grid_sampler.as_symbolic(interpolation, padding, align_corners)
    for domain in ("mmcv", "mmdeploy"):
        (out,) = run(grid_sampler.grid_model(dtype, domain, **attrs), {"input": x, "grid": grid})
        tolerance = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(out, want, rtol=tolerance, atol=tolerance)
    # The ORT cases' numpy reference agrees with torch too, so the checks on old ORTs stand on it.
    np.testing.assert_allclose(grid_sampler.grid_sample_reference(x, grid, interpolation, padding, align_corners), want,
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_grid_sampler_large_grid_matches_torch():
    """75,000 output pixels per image: the kernel holds the taps of 65,536 at a time, so this crosses a span."""
    rng = np.random.default_rng(7)
    x, grid = rng.standard_normal((2, 3, 50, 60)), rng.uniform(-1.1, 1.1, (2, 300, 250, 2))
    for interpolation in grid_sampler.INTERPOLATIONS:
        attrs = grid_sampler.as_symbolic(interpolation, "border", True)
        (out,) = run(grid_sampler.grid_model(np.float64, "mmdeploy", **attrs), {"input": x, "grid": grid})
        want = F.grid_sample(torch.from_numpy(x), torch.from_numpy(grid), interpolation, "border", True)
        np.testing.assert_allclose(out, want.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("aligned", [True, False])
def test_roi_align_avg_matches_torchvision(aligned):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 12, 15)).astype(np.float32)
    start = rng.uniform(-2, 12, (20, 2))
    rois = np.concatenate([rng.integers(0, 2, (20, 1)), start, start + rng.uniform(0, 20, (20, 2))], 1)
    rois[:4, 1:] = rois[:4, [3, 4, 1, 2]]  # x2 < x1 and y2 < y1: samples run backwards (aligned) or 1 px (not)
    rois = rois.astype(np.float32)
    for scale, ratio, size in ((0.5, 0, (7, 7)), (1.0, 2, (3, 5)), (0.25, 1, (2, 2))):
        attrs = roi_align.as_symbolic(size, scale, ratio, "avg", aligned)
        (out,) = run(roi_align.roi_align_model(**attrs), {"input": x, "rois": rois})
        want = torchvision.ops.roi_align(torch.from_numpy(x), torch.from_numpy(rois), size, scale, ratio, aligned)
        np.testing.assert_allclose(out, want.numpy(), rtol=1e-5, atol=1e-5)


def test_nms_matches_torchvision():
    rng = np.random.default_rng(2)
    for _ in range(5):
        boxes, scores = nms.random_clusters(rng, 200, rounded=False)
        boxes, scores = boxes.astype(np.float32), scores.astype(np.float32)
        for threshold in (0.3, 0.5, 0.7):
            (keep,) = run(nms.nms_model(iou_threshold=threshold, offset=0), {"boxes": boxes, "scores": scores})
            want = torchvision.ops.nms(torch.from_numpy(boxes), torch.from_numpy(scores), threshold)
            assert keep.tolist() == want.tolist()


@pytest.mark.parametrize("op_type", ["cummax", "cummin"])
def test_cummax_cummin_match_torch(op_type):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4, 5)).round(1)
    x[1, 2, 1] = np.nan
    for dtype in (np.float32, np.float64, np.int64):
        data = (np.nan_to_num(x) * 10).astype(dtype) if dtype == np.int64 else x.astype(dtype)
        for dim in range(-3, 3):
            values, indices = run(cummax.cumulative_model(op_type, dtype, dim=dim), {"input": data})
            want = getattr(torch, op_type)(torch.from_numpy(data), dim)
            np.testing.assert_array_equal(values, want.values.numpy())
            np.testing.assert_array_equal(indices, want.indices.numpy())


@pytest.mark.parametrize("mode", range(4))
def test_corner_pool_matches_mmcv_formula(mode):
    """mmcv's CornerPool on torch >= 1.5: flip (top, left), torch.cummax along H (top, bottom) or W, flip back."""
    x = torch.randn(2, 3, 6, 7, generator=torch.Generator().manual_seed(mode))
    dim = 2 if mode < 2 else 3
    flip = mode in (0, 2)
    want = torch.cummax(x.flip(dim) if flip else x, dim).values
    want = want.flip(dim) if flip else want
    (out,) = run(cummax.cumulative_model("MMCVCornerPool", mode=mode), {"input": x.numpy()})
    np.testing.assert_array_equal(out, want.numpy())


def test_dcn_v1_matches_torchvision():
    rng = np.random.default_rng(4)
    for domain in ("mmcv", "mmdeploy"):
        feeds, a = deform_conv2d.deform_case(rng, np.float32, pads=(2, 1, 2, 1), stride=(1, 2), dilation=(2, 1))
        attrs = deform_conv2d.dcn_v1_attributes(domain, 2, 1, a["strides"], a["dilations"], a["group"],
                                                a["offset_group"])  # fmt: skip
        (out,) = run(deform_conv2d.dcn_v1_model(domain, **attrs),
                     {"input": feeds["X"], "offset": feeds["offset"], "weight": feeds["W"]})  # fmt: skip
        want = torchvision.ops.deform_conv2d(torch.from_numpy(feeds["X"]), torch.from_numpy(feeds["offset"]),
                                             torch.from_numpy(feeds["W"]), stride=(1, 2), padding=(2, 1),
                                             dilation=(2, 1))  # fmt: skip
        np.testing.assert_allclose(out, want.numpy(), rtol=1e-4, atol=1e-4)


def test_dcn_v1_published_value():
    """mmcv's tests/test_ops/test_deform_conv.py: a 3x3 map, a 2x2 kernel and the offsets of its offset conv."""
    x = np.array([[[[1.0, 2.0, 3.0], [0.0, 1.0, 2.0], [3.0, 5.0, 2.0]]]], np.float32)
    offset_weight = np.array([[0.1, 0.4, 0.6, 0.1], [0.3, 0.2, 0.1, 0.3], [0.5, 0.5, 0.2, 0.8], [0.8, 0.3, 0.9, 0.1],
                              [0.3, 0.1, 0.2, 0.5], [0.3, 0.7, 0.5, 0.3], [0.6, 0.2, 0.5, 0.3], [0.4, 0.1, 0.8, 0.4]],
                             np.float32).reshape(8, 1, 2, 2)  # fmt: skip
    offset_bias = torch.tensor([0.7, 0.1, 0.8, 0.5, 0.6, 0.5, 0.4, 0.7])
    offset = F.conv2d(torch.from_numpy(x), torch.from_numpy(offset_weight), offset_bias).numpy()
    weight = np.array([0.4, 0.2, 0.1, 0.9], np.float32).reshape(1, 1, 2, 2)
    attrs = deform_conv2d.dcn_v1_attributes("mmcv", 0, 0, (1, 1), (1, 1), 1, 1)
    (out,) = run(deform_conv2d.dcn_v1_model("mmcv", **attrs), {"input": x, "offset": offset, "weight": weight})
    np.testing.assert_allclose(out, [[[[1.650, 0.0], [0.0, 0.0]]]], atol=1e-3)


def test_masked_conv2d_matches_torch_conv2d():
    """mmcv's masked convolution is conv2d (stride 1) where mask > 0 and 0 elsewhere."""
    generator = torch.Generator().manual_seed(5)
    x, weight, bias = (torch.randn(1, 8, 12, 10, generator=generator), torch.randn(6, 8, 3, 3, generator=generator),
                       torch.randn(6, generator=generator))  # fmt: skip
    mask = torch.rand(1, 12, 10, generator=generator) > 0.6
    model = masked_conv2d.masked_conv_model(np.float32, bool, True, padding=1, stride=1)
    (out,) = run(model, {"features": x.numpy(), "mask": mask.numpy(), "weight": weight.numpy(), "bias": bias.numpy()})
    want = F.conv2d(x, weight, bias, padding=1) * mask[:, None]
    np.testing.assert_allclose(out, want.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op_type", carafe.NODES)
def test_carafe_matches_torch_unfold(op_type):
    """CARAFE as its paper writes it with tensors: the k x k neighbourhoods (unfold), nearest-upsampled by the
    scale, weighted by each group's reassembly kernel."""
    generator = torch.Generator().manual_seed(6)
    n, c, h, w, k, group, scale = 2, 8, 6, 5, 5, 2, 2
    x = torch.randn(n, c, h, w, generator=generator)
    masks = torch.randn(n, group * k * k, h * scale, w * scale, generator=generator).softmax(1)
    (out,) = run(carafe.carafe_model(op_type, **carafe.as_symbolic(k, group, scale)),
                 {"features": x.numpy(), "masks": masks.numpy()})  # fmt: skip
    windows = F.unfold(x, k, padding=(k - 1) // 2).view(n, group, c // group, k * k, h, w)
    windows = windows.repeat_interleave(scale, 4).repeat_interleave(scale, 5)
    want = torch.einsum("ngckyx,ngkyx->ngcyx", windows, masks.view(n, group, k * k, h * scale, w * scale))
    np.testing.assert_allclose(out, want.reshape(n, c, h * scale, w * scale).numpy(), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------------------
# A real model, exported as mmdeploy exports it


class _PointSampler(torch.nn.Module):
    """PointRend's point head input and Mask2Former's masked-attention sampling: grid_sample of a feature map at
    points predicted from it (bilinear, zeros, align_corners=False, as mmcv's point_sample)."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.points = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(4), torch.nn.Conv2d(8, 2, 1), torch.nn.Tanh())
        self.head = torch.nn.Conv2d(8, 5, 1)

    def forward(self, image):
        features = self.features(image)
        grid = self.points(features).permute(0, 2, 3, 1)  # [N, 4, 4, 2] in [-1, 1]
        sampled = F.grid_sample(features, grid, "bilinear", "zeros", align_corners=False)
        coarse = F.grid_sample(features, grid * 1.2, "bicubic", "border", align_corners=True)
        return self.head(sampled + coarse)


def _mmdeploy_grid_sampler(g, input, grid, interpolation_mode, padding_mode, align_corners):
    """What mmdeploy's grid_sampler symbolic writes (mmdeploy/pytorch/symbolics/grid_sampler.py's contract)."""
    from torch.onnx.symbolic_helper import _maybe_get_const

    return g.op("mmdeploy::grid_sampler", input, grid,
                interpolation_mode_i=_maybe_get_const(interpolation_mode, "i"),
                padding_mode_i=_maybe_get_const(padding_mode, "i"),
                align_corners_i=_maybe_get_const(align_corners, "b"))  # fmt: skip


def test_model_exported_with_mmdeploys_grid_sampler_runs(tmp_path):
    torch.manual_seed(0)
    model, image = _PointSampler().eval(), torch.randn(2, 3, 16, 20)
    torch.onnx.register_custom_op_symbolic("aten::grid_sampler", _mmdeploy_grid_sampler, 16)
    try:
        path = tmp_path / "point_sampler.onnx"
        torch.onnx.export(model, (image,), str(path), input_names=["image"], opset_version=16, dynamo=False)
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::grid_sampler", 16)
    nodes = [(n.domain, n.op_type) for n in onnx.load(str(path)).graph.node]
    assert nodes.count(("mmdeploy", "grid_sampler")) == 2
    (out,) = opbridge_ort.InferenceSession(str(path)).run(None, {"image": image.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(out, model(image).numpy(), rtol=1e-4, atol=1e-5)


def test_transformers_mask2former_exported_with_mmdeploys_grid_sampler_runs(tmp_path):
    """transformers' Mask2Former (random weights, a small config): its pixel decoder's deformable attention runs
    on grid_sample on a CPU, which mmdeploy exports as mmdeploy::grid_sampler nodes; opbridge_ort runs them."""
    transformers = pytest.importorskip("transformers", reason="the model test needs transformers (the test extra)")
    from opbridge.tools import models

    torch.manual_seed(0)
    model = transformers.Mask2FormerModel(models._config("Mask2FormerConfig", **models._MASK_FORMER)()).eval()

    class Outputs(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values):
            out = self.inner(pixel_values=pixel_values)
            return out.pixel_decoder_last_hidden_state, out.transformer_decoder_last_hidden_state

    wrapped, pixels = Outputs(model).eval(), torch.randn(1, 3, 224, 224)
    path = tmp_path / "mask2former.onnx"
    torch.onnx.register_custom_op_symbolic("aten::grid_sampler", _mmdeploy_grid_sampler, 16)
    try:
        torch.onnx.export(wrapped, (pixels,), str(path), input_names=["pixel_values"], opset_version=16, dynamo=False)
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::grid_sampler", 16)
    nodes = [(n.domain, n.op_type) for n in onnx.load(str(path)).graph.node]
    assert nodes.count(("mmdeploy", "grid_sampler")) == 3  # one per feature level
    outputs = opbridge_ort.InferenceSession(str(path)).run(None, {"pixel_values": pixels.numpy()})
    with torch.no_grad():
        for got, want in zip(outputs, wrapped(pixels), strict=True):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------------------------------------------
# The node table and inspect


def test_node_table_matches_the_library():
    runs = {(n.domain, n.op_type) for n in openmmlab.NODES if n.runs}
    library = set(opbridge_ort.foreign_ops())
    assert runs == library, f"marked as running but not in the library: {sorted(runs - library)}; " + (
        f"in the library but not marked: {sorted(library - runs)}"
    )
    assert all(n.note for n in openmmlab.NODES if not n.runs), "a node opbridge does not run needs a reason"


def test_docs_table_is_current():
    text = (ROOT / "docs" / "openmmlab.md").read_text()
    assert openmmlab.markdown_table() in text, (
        "docs/openmmlab.md's table is stale: paste python -c 'from opbridge_ort import openmmlab; "
        "print(openmmlab.markdown_table())'"
    )


def _one_node_file(tmp_path, domain, op_type, inputs, outputs) -> Path:
    node = helper.make_node(op_type, [n for n, _ in inputs], [n for n, _ in outputs], domain=domain)
    info = lambda name, shape: helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)  # noqa: E731
    graph = helper.make_graph([node], "g", [info(*i) for i in inputs], [info(*o) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])
    model.ir_version = 8
    path = tmp_path / f"{op_type}.onnx"
    onnx.save(model, str(path))
    return path


def test_inspect_explains_openmmlab_nodes(tmp_path):
    runs = _one_node_file(tmp_path, "mmdeploy", "grid_sampler", [("input", [1, 1, 4, 4]), ("grid", [1, 2, 2, 2])],
                          [("out", None)])  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "opbridge_ort", "inspect", str(runs)], capture_output=True,
                            text=True)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mmdeploy node run by the opbridge library" in result.stdout
    missing = _one_node_file(tmp_path, "mmcv", "PrRoIPool", [("features", [1, 4, 2, 2]), ("rois", [1, 5])],
                             [("out", None)])  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "opbridge_ort", "inspect", str(missing)], capture_output=True,
                            text=True)  # fmt: skip
    assert result.returncode == 1
    assert "mmcv node the opbridge library does not run" in result.stdout
    assert "not implemented in opbridge yet" in result.stdout and "prroi_pool.py" in result.stdout


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("interpolation", grid_sampler.INTERPOLATIONS)
def test_grid_sampler_channels_last_matches_torch_and_the_planar_path(interpolation, dtype):
    """Grids that sample a map many times over (out pixels >= 2 x its pixels) with 4+ channels run channels-last
    (cpp/kernels/grid_sample.h); 37 channels cover its 16-channel vectors, 4 x 4 transposes and scalar ends. Each
    channel run alone takes the planar path: both must give the same bits. A NaN in the map's first pixel, whose
    offset the taps off the map carry, must not reach the samples that do not read it."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 37, 7, 9)).astype(dtype)
    x[:, :, 0, 0] = np.nan
    grid = rng.uniform(-1.4, 1.4, (2, 11, 13, 2)).astype(dtype)  # 143 samples of a 63-pixel map, some off it
    for padding, align_corners in (("zeros", False), ("border", True), ("reflection", False)):
        attrs = grid_sampler.as_symbolic(interpolation, padding, align_corners)
        model = grid_sampler.grid_model(dtype, "mmdeploy", **attrs)
        (out,) = run(model, {"input": x, "grid": grid}, threads=2)
        want = F.grid_sample(torch.from_numpy(x), torch.from_numpy(grid), interpolation, padding, align_corners)
        tolerance = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(out, want.numpy(), rtol=tolerance, atol=tolerance, equal_nan=True)
        assert np.isnan(out).any() and not np.isnan(out).all()
        for channel in (0, 16, 36):
            (alone,) = run(model, {"input": np.ascontiguousarray(x[:, channel : channel + 1]), "grid": grid})
            np.testing.assert_array_equal(alone[:, 0], out[:, channel])
