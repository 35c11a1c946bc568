"""roi_align_rotated against mmcv's published outputs and gradients, torchvision's roi_align at angle 0 (an
independent implementation), a plain-Python reference at any angle, gradcheck, opcheck, the nn.Module twin with
mmrotate's config names, and both lowerings through both exporters with roi counts that change at run time."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import opbridge
import opbridge_ort
from opbridge.ops.roi_align_rotated import reference
from rotated_helpers import export

MAP = [[1.0, 2.0, 5.0, 6.0], [3.0, 4.0, 7.0, 8.0], [9.0, 10.0, 13.0, 14.0], [11.0, 12.0, 15.0, 16.0]]
GRAD4 = [
    [0.47265625, 0.42968750, 0.42968750, 0.04296875],
    [0.42968750, 0.39062500, 0.39062500, 0.03906250],
    [0.42968750, 0.39062500, 0.39062500, 0.03906250],
    [0.04296875, 0.03906250, 0.03906250, 0.00390625],
]
GRAD2 = [[3.0625, 0.4375], [0.4375, 0.0625]]
# mmcv tests/test_ops/test_roi_align_rotated.py: (input, rois, output, input gradient)
PUBLISHED = [
    ([[[[1.0, 2.0], [3.0, 4.0]]]], [[0.0, 0.5, 0.5, 1.0, 1.0, 0]], [[[[1.0, 1.25], [1.5, 1.75]]]], [[GRAD2]]),
    ([[[[1.0, 2.0], [3.0, 4.0]]]], [[0.0, 0.5, 0.5, 1.0, 1.0, math.pi / 2]], [[[[1.5, 1], [1.75, 1.25]]]], [[GRAD2]]),
    (
        [[[[1.0, 2.0], [3.0, 4.0]], [[4.0, 3.0], [2.0, 1.0]]]],
        [[0.0, 0.5, 0.5, 1.0, 1.0, 0]],
        [[[[1.0, 1.25], [1.5, 1.75]], [[4.0, 3.75], [3.5, 3.25]]]],
        [[GRAD2, GRAD2]],
    ),
    ([[MAP]], [[0.0, 1.5, 1.5, 3.0, 3.0, 0]], [[[[1.9375, 4.75], [7.5625, 10.375]]]], [[GRAD4]]),
    ([[MAP]], [[0.0, 1.5, 1.5, 3.0, 3.0, math.pi / 2]], [[[[7.5625, 1.9375], [10.375, 4.75]]]], [[GRAD4]]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", range(len(PUBLISHED)))
def test_published_values_and_gradients(dtype, case):
    x, rois, expected, grad = PUBLISHED[case]
    x = torch.tensor(x, dtype=dtype, requires_grad=True)
    out = opbridge.roi_align_rotated(x, torch.tensor(rois, dtype=dtype), (2, 2), 1.0, 2, True)
    torch.testing.assert_close(out, torch.tensor(expected, dtype=dtype), atol=1e-3, rtol=0)
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(x.grad, torch.tensor(grad, dtype=dtype), atol=1e-3, rtol=0)


def _rois(generator, count, batch, height, width, dtype=torch.float64):
    return torch.cat(
        [
            torch.randint(0, batch, (count, 1), generator=generator).to(torch.float64),
            torch.rand(count, 1, generator=generator, dtype=torch.float64) * (width + 4) - 2,
            torch.rand(count, 1, generator=generator, dtype=torch.float64) * (height + 4) - 2,
            torch.rand(count, 2, generator=generator, dtype=torch.float64) * 12 + 0.2,
            (torch.rand(count, 1, generator=generator, dtype=torch.float64) - 0.5) * 4 * math.pi,
        ],
        1,
    ).to(dtype)


@pytest.mark.parametrize(("ratio", "aligned"), [(2, True), (0, True), (0, False), (3, False)])
def test_angle_zero_is_torchvision_roi_align(generator, ratio, aligned):
    torchvision = pytest.importorskip("torchvision")
    try:
        torch.ops.torchvision.roi_align  # noqa: B018
    except (AttributeError, RuntimeError):
        pytest.skip("torchvision's compiled ops do not load with this torch")
    x = torch.randn(2, 3, 12, 10, generator=generator, dtype=torch.float64)
    rois = _rois(generator, 9, 2, 24, 20)
    rois[:, 5] = 0
    rois[:, 3:5] += 2.0  # at least a feature pixel: torchvision's legacy mode widens smaller rois from a corner
    boxes = torch.stack(
        [
            rois[:, 0],
            rois[:, 1] - rois[:, 3] / 2,
            rois[:, 2] - rois[:, 4] / 2,
            rois[:, 1] + rois[:, 3] / 2,
            rois[:, 2] + rois[:, 4] / 2,
        ],
        1,
    )
    got = opbridge.roi_align_rotated(x, rois, (3, 4), 0.5, ratio, aligned)
    want = torchvision.ops.roi_align(x, boxes, (3, 4), 0.5, ratio, aligned)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize(
    "config", [((2, 3), 0.5, 0, True, False), ((3, 3), 1.0, 2, False, True), (4, 0.25, 1, True, True)]
)
def test_matches_reference_at_any_angle(generator, config):
    x = torch.randn(2, 3, 8, 9, generator=generator, dtype=torch.float64)
    rois = _rois(generator, 12, 2, 8 / config[1], 9 / config[1])
    torch.testing.assert_close(opbridge.roi_align_rotated(x, rois, *config), reference(x, rois, *config))


def test_detectron2_convention(generator):
    """detectron2's ROIAlignRotated: angles in degrees, counter-clockwise, always aligned."""
    x = torch.randn(1, 2, 7, 7, generator=generator, dtype=torch.float64)
    rois = torch.tensor([[0.0, 3.0, 3.5, 4.0, 2.0, 30.0]], dtype=torch.float64)
    radians = rois.clone()
    radians[:, 5] = torch.deg2rad(rois[:, 5])
    got = opbridge.roi_align_rotated(x, radians, (2, 2), 1.0, 2, aligned=True, clockwise=False)
    # By hand: the bin centers of a 4 x 2 box turned 30 degrees counter-clockwise on screen.
    c, s = math.cos(math.radians(30)), math.sin(math.radians(30))
    for i, j in np.ndindex(2, 2):
        total = torch.zeros(2, dtype=torch.float64)
        for iy, ix in np.ndindex(2, 2):
            yy, xx = -1.0 + i + (iy + 0.5) * 0.5, -2.0 + j * 2 + (ix + 0.5)
            total += _bilinear(x[0], yy * c - xx * s + 3.0, yy * s + xx * c + 2.5)
        torch.testing.assert_close(got[0, :, i, j], total / 4)


def _bilinear(plane, y, x):
    y0, x0 = math.floor(y), math.floor(x)
    ly, lx = y - y0, x - x0
    return (
        (1 - ly) * (1 - lx) * plane[:, y0, x0]
        + (1 - ly) * lx * plane[:, y0, x0 + 1]
        + ly * (1 - lx) * plane[:, y0 + 1, x0]
        + ly * lx * plane[:, y0 + 1, x0 + 1]
    )


def test_gradcheck_and_opcheck(generator):
    x = torch.randn(2, 2, 6, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    rois = _rois(generator, 4, 2, 6, 5)
    for ratio, aligned, clockwise in ((2, True, False), (0, False, True)):

        def op(t, ratio=ratio, aligned=aligned, clockwise=clockwise):
            return opbridge.roi_align_rotated(t, rois, (2, 3), 1.0, ratio, aligned, clockwise)

        assert torch.autograd.gradcheck(op, (x,))
    for args in (
        (x.detach().float(), rois.float(), 2, 3, 0.5, 0, True, False),
        (x.detach(), rois, 3, 2, 1.0, 2, False, True),
    ):
        torch.library.opcheck(torch.ops.opbridge.roi_align_rotated.default, args)


def test_module_with_mmrotate_config_names(generator):
    layer = opbridge.nn.RoIAlignRotated(out_size=7, spatial_scale=0.25, sample_num=2, clockwise=True)
    assert layer.output_size == (7, 7) and layer.sampling_ratio == 2
    x = torch.randn(1, 4, 16, 16, generator=generator)
    rois = _rois(generator, 3, 1, 64, 64, torch.float32)
    torch.testing.assert_close(layer(x, rois), opbridge.roi_align_rotated(x, rois, 7, 0.25, 2, True, True))
    scripted = torch.jit.script(layer)
    torch.testing.assert_close(scripted(x, rois), layer(x, rois))


def test_bad_rois_fail_loudly():
    x = torch.ones(2, 1, 4, 4)
    for index in (2.0, -1.0, 0.5, math.nan):
        with pytest.raises(RuntimeError, match=r"batch index\) must be an integer in \[0, 2\)"):
            opbridge.roi_align_rotated(x, torch.tensor([[index, 1, 1, 2, 2, 0]]), 2)
    for w, h, size in ((1e9, 1e9, 2), (1e30, 3.0, (2, 1)), (1e30, 3.0, 1), (3.0, 1e38, 2)):  # counts beyond int64 too
        with pytest.raises(RuntimeError, match="sampling_ratio > 0"):
            opbridge.roi_align_rotated(x, torch.tensor([[0, 1, 1, w, h, 0.5]]), size)
    out = opbridge.roi_align_rotated(x, torch.tensor([[0, math.nan, 1, 2, 2, 0], [1, 1, 1, 2, 2, 0]]), 2)
    assert out[0].isnan().all() and not out[1].isnan().any()
    assert opbridge.roi_align_rotated(x, torch.zeros(0, 6), 2).shape == (0, 1, 2, 2)


class _Layer(torch.nn.Module):
    def __init__(self, ratio):
        super().__init__()
        self.layer = opbridge.nn.RoIAlignRotated((3, 2), 0.5, ratio, True, False)

    def forward(self, input, rois):
        return self.layer(input, rois)


@pytest.mark.parametrize("lowering", ["standard", "custom"])
@pytest.mark.parametrize(("dynamo", "opset"), [(False, 11), (False, 16), (True, 18)])
@pytest.mark.parametrize("ratio", [2, 0])
def test_export_with_changing_roi_counts(generator, lowering, dynamo, opset, ratio):
    model = _Layer(ratio)
    args = (torch.randn(2, 3, 10, 12, generator=generator), _rois(generator, 5, 2, 20, 24, torch.float32))
    proto = export(
        model, args, ("input", "rois"), {"input": {0: "n", 2: "h", 3: "w"}, "rois": {0: "k"}}, opset, dynamo, lowering
    )
    ops = {(n.domain, n.op_type) for n in proto.graph.node}
    assert (("opbridge", "RoiAlignRotated") in ops) == (lowering == "custom")
    session = opbridge_ort.InferenceSession(proto)
    for n, k, h, w in ((1, 17, 7, 9), (3, 2, 12, 10), (2, 0, 10, 12)):
        x, rois = torch.randn(n, 3, h, w, generator=generator), _rois(generator, k, n, 2 * h, 2 * w, torch.float32)
        (got,) = session.run(None, {"input": x.numpy(), "rois": rois.numpy()})
        np.testing.assert_allclose(got, model(x, rois).numpy(), atol=2e-5)


CONTRACT_CASES = {
    "opbridge.roi_align_rotated": [
        (lambda: opbridge.roi_align_rotated(torch.ones(1, 1, 4, 4), None, 2), TypeError, ["rois must be a tensor"]),
        (lambda: opbridge.roi_align_rotated(torch.ones(1, 1, 4, 4), torch.zeros(1, 6), 0), ValueError, [">= 1"]),
        (lambda: opbridge.roi_align_rotated(torch.ones(1, 1, 4, 4), torch.zeros(1, 6), 2.5), TypeError, ["int"]),
        (
            lambda: opbridge.roi_align_rotated(torch.ones(1, 1, 4, 4), torch.zeros(1, 6), 2, 0.0),
            ValueError,
            ["positive finite"],
        ),
        (lambda: opbridge.roi_align_rotated(torch.ones(1, 4, 4), torch.zeros(1, 6), 2), RuntimeError, ["4-D"]),
        (lambda: opbridge.roi_align_rotated(torch.ones(1, 1, 4, 4), torch.zeros(1, 5), 2), RuntimeError, ["[rois, 6]"]),
        (
            lambda: opbridge.roi_align_rotated(torch.ones(1, 1, 4, 4), torch.tensor([[3.0, 1, 1, 1, 1, 0]]), 2),
            RuntimeError,
            ["batch index", "[0, 1)"],
        ),
        (
            lambda: opbridge.roi_align_rotated(torch.ones(1, 1, 4, 4), torch.zeros(1, 6, dtype=torch.float64), 2),
            RuntimeError,
            ["dtype of input"],
        ),
        (
            lambda: opbridge.roi_align_rotated(torch.ones(1, 1, 4, 4), torch.zeros(1, 6, device="meta"), 2),
            RuntimeError,
            ["one device"],
        ),
    ],
    "opbridge.nn.RoIAlignRotated": [
        (lambda: opbridge.nn.RoIAlignRotated(7), TypeError, ["output_size and spatial_scale are required"]),
        (lambda: opbridge.nn.RoIAlignRotated(7, -1.0), ValueError, ["positive finite"]),
        (lambda: opbridge.nn.RoIAlignRotated(7, 1.0, out_size=7), TypeError, ["not both"]),
    ],
}


class _MmdeployRoIAlignRotated(torch.autograd.Function):
    """As mmdeploy's rewrite of mmcv's RoIAlignRotated symbolic (mmdeploy/mmcv/ops/roi_align_rotated.py): the node
    mmdeploy::MMCVRoIAlignRotated with int attributes for the sizes and flags and a float scale; and as mmcv's own
    symbolic, mmcv::MMCVRoIAlignRotated (which writes output_width = output_height: square outputs only)."""

    @staticmethod
    def forward(ctx, input, rois, domain: str, size, scale: float, ratio: int, aligned: bool, clockwise: bool):
        return opbridge.roi_align_rotated(input, rois, size, scale, ratio, aligned, clockwise)

    @staticmethod
    def symbolic(g, input, rois, domain, size, scale, ratio, aligned, clockwise):
        attributes = {"output_height_i": size[0], "output_width_i": size[1], "spatial_scale_f": scale,
                      "sampling_ratio_i": ratio, "aligned_i": aligned, "clockwise_i": clockwise}  # fmt: skip
        return g.op(f"{domain}::MMCVRoIAlignRotated", input, rois, **attributes)


@pytest.mark.parametrize(("domain", "size"), [("mmdeploy", (7, 5)), ("mmcv", (7, 7))])
def test_nodes_as_mmdeploy_and_mmcv_symbolics_write_them(generator, tmp_path, domain, size):
    import warnings

    import onnx

    class Head(torch.nn.Module):
        def forward(self, input, rois):
            return _MmdeployRoIAlignRotated.apply(input, rois, domain, size, 0.25, 2, True, True)

    path = tmp_path / f"{domain}.onnx"
    args = (torch.randn(2, 4, 16, 16, generator=generator), _rois(generator, 5, 2, 64, 64, torch.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Head(), args, str(path), opset_version=11, dynamo=False, input_names=["input", "rois"],
                          dynamic_axes={"input": {0: "n", 2: "h", 3: "w"}, "rois": {0: "k"}})  # fmt: skip
    assert [(n.domain, n.op_type) for n in onnx.load(str(path)).graph.node] == [(domain, "MMCVRoIAlignRotated")]
    session = opbridge_ort.InferenceSession(str(path))
    for n, k, h in ((2, 5, 16), (1, 23, 10), (3, 0, 8)):
        x, rois = torch.randn(n, 4, h, h, generator=generator), _rois(generator, k, n, 4 * h, 4 * h, torch.float32)
        (got,) = session.run(None, {"input": x.numpy(), "rois": rois.numpy()})
        np.testing.assert_allclose(got, Head()(x, rois).numpy(), atol=1e-5)
