"""box_iou_rotated against mmcv's published tables and an independent polygon-clipping reference
(Sutherland-Hodgman), robustness (identical, nearly identical, degenerate, far from the origin), opcheck, and both
lowerings through both exporters with box counts that change at run time."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import opbridge
import opbridge_ort
from opbridge.ops.box_iou_rotated import overlap
from rotated_helpers import export

# mmcv tests/test_ops/test_box_iou_rotated.py
BOXES1 = [[1.0, 1.0, 3.0, 4.0, 0.5], [2.0, 2.0, 3.0, 4.0, 0.6], [7.0, 7.0, 8.0, 8.0, 0.4]]
BOXES2 = [[0.0, 2.0, 2.0, 5.0, 0.3], [2.0, 1.0, 3.0, 3.0, 0.5], [5.0, 5.0, 6.0, 7.0, 0.4]]
IOUS = [[0.3708, 0.4351, 0.0000], [0.1104, 0.4487, 0.0424], [0.0000, 0.0000, 0.3622]]
IOFS = [[0.4959, 0.5306, 0.0000], [0.1823, 0.5420, 0.1832], [0.0000, 0.0000, 0.4404]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize(("mode", "table"), [("iou", IOUS), ("iof", IOFS)])
def test_published_values(dtype, mode, table):
    b1, b2 = torch.tensor(BOXES1, dtype=dtype), torch.tensor(BOXES2, dtype=dtype)
    expected = torch.tensor(table, dtype=dtype)
    torch.testing.assert_close(opbridge.box_iou_rotated(b1, b2, mode), expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(opbridge.box_iou_rotated(b1, b2, mode, aligned=True), expected.diag(), atol=1e-4, rtol=0)
    flip = torch.tensor([1, 1, 1, 1, -1], dtype=dtype)
    torch.testing.assert_close(
        opbridge.box_iou_rotated(b1 * flip, b2 * flip, mode, clockwise=False), expected, atol=1e-4, rtol=0
    )


def _random_boxes(generator, count, spread=10.0):
    return torch.cat(
        [
            torch.rand(count, 2, generator=generator, dtype=torch.float64) * spread,
            torch.rand(count, 2, generator=generator, dtype=torch.float64) * 6 + 0.1,
            (torch.rand(count, 1, generator=generator, dtype=torch.float64) - 0.5) * 4 * math.pi,
        ],
        1,
    )


@pytest.mark.parametrize("mode", ["iou", "iof"])
@pytest.mark.parametrize("clockwise", [True, False])
def test_matches_polygon_clipping(generator, mode, clockwise):
    b1, b2 = _random_boxes(generator, 40), _random_boxes(generator, 30)
    got = opbridge.box_iou_rotated(b1, b2, mode, clockwise=clockwise)
    want = torch.tensor(
        [[overlap(x, y, mode, clockwise) for y in b2.tolist()] for x in b1.tolist()], dtype=torch.float64
    )
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    assert (want > 0).float().mean() > 0.2  # the boxes do overlap: the test exercises the geometry


def test_robust_cases():
    box = torch.tensor([[3.0, -2.0, 4.0, 1.5, 0.7]], dtype=torch.float64)
    assert opbridge.box_iou_rotated(box, box).item() == pytest.approx(1.0, abs=1e-12)
    for angle in (0.0, math.pi / 2, math.pi, 1e-9):  # the same rectangle under another angle / a hair apart
        turned = box.clone()
        turned[0, 4] += angle
        expected = 1.0 if angle in (0.0, math.pi, 1e-9) else overlap(box[0].tolist(), turned[0].tolist())
        assert opbridge.box_iou_rotated(box, turned).item() == pytest.approx(expected, abs=1e-7)
    inside = torch.tensor([[3.0, -2.0, 2.0, 0.75, 0.7]], dtype=torch.float64)
    assert opbridge.box_iou_rotated(inside, box, "iof").item() == pytest.approx(1.0, abs=1e-12)
    assert opbridge.box_iou_rotated(box, inside).item() == pytest.approx(0.25, abs=1e-12)
    touching = torch.tensor([[0.0, 0.0, 2.0, 2.0, 0.0], [2.0, 0.0, 2.0, 2.0, 0.0], [1.0, 0.0, 2.0, 2.0, 0.0]])
    iou = opbridge.box_iou_rotated(touching, touching)
    assert iou[0, 1] == 0 and iou[0, 2] == pytest.approx(1 / 3, abs=1e-6)
    zero = torch.tensor([[3.0, -2.0, 0.0, 1.5, 0.7], [3.0, -2.0, -4.0, 1.5, 0.7]], dtype=torch.float64)
    assert (opbridge.box_iou_rotated(zero, box) == 0).all()
    # Far from the origin, huge and tiny: the result does not depend on where the pair is.
    for shift, scale in ((1e6, 1.0), (0.0, 1e5), (1e3, 1e-4)):
        a, b = _random_boxes(torch.Generator().manual_seed(3), 8), _random_boxes(torch.Generator().manual_seed(4), 8)
        moved = [t.clone() for t in (a, b)]
        for t in moved:
            t[:, :4] *= scale
            t[:, :2] += shift
        torch.testing.assert_close(opbridge.box_iou_rotated(*moved), opbridge.box_iou_rotated(a, b), atol=1e-7, rtol=0)
    nan = torch.tensor([[math.nan, 0.0, 1.0, 1.0, 0.0], [0.0, 0.0, math.inf, 1.0, 0.0]], dtype=torch.float64)
    assert opbridge.box_iou_rotated(nan, box).isnan().all()


def test_shapes_and_empty():
    assert opbridge.box_iou_rotated(torch.zeros(0, 5), torch.ones(4, 5)).shape == (0, 4)
    assert opbridge.box_iou_rotated(torch.ones(3, 5), torch.zeros(0, 5)).shape == (3, 0)
    assert opbridge.box_iou_rotated(torch.zeros(0, 5), torch.zeros(0, 5), aligned=True).shape == (0,)


def test_opcheck(generator):
    b1, b2 = _random_boxes(generator, 5).float(), _random_boxes(generator, 4).float()
    for args in ((b1, b2, 0, False, True), (b1, b2[:5].repeat(2, 1)[:5], 1, True, False)):
        torch.library.opcheck(torch.ops.opbridge.box_iou_rotated.default, args)


class _Pairwise(torch.nn.Module):
    def __init__(self, mode="iou", aligned=False, clockwise=True):
        super().__init__()
        self.mode, self.aligned, self.clockwise = mode, aligned, clockwise

    def forward(self, boxes1, boxes2):
        return opbridge.box_iou_rotated(boxes1, boxes2, self.mode, self.aligned, self.clockwise)


@pytest.mark.parametrize("lowering", ["standard", "custom"])
@pytest.mark.parametrize(("dynamo", "opset"), [(False, 11), (False, 17), (True, 18), (True, 20)])
@pytest.mark.parametrize(("mode", "clockwise"), [("iou", True), ("iof", False)])
def test_export_with_changing_box_counts(generator, lowering, dynamo, opset, mode, clockwise):
    model = _Pairwise(mode, clockwise=clockwise)
    args = (_random_boxes(generator, 6).float(), _random_boxes(generator, 5).float())
    proto = export(model, args, ("boxes1", "boxes2"), {"boxes1": {0: "n"}, "boxes2": {0: "m"}}, opset, dynamo, lowering)
    ops = {(n.domain, n.op_type) for n in proto.graph.node}
    assert (("opbridge", "BoxIouRotated") in ops) == (lowering == "custom")
    session = opbridge_ort.InferenceSession(proto)
    for n, m in ((9, 4), (1, 12), (0, 3)):
        a, b = _random_boxes(generator, n).float(), _random_boxes(generator, m).float()
        a[: min(n, m)] = b[: min(n, m)]  # identical pairs too
        (got,) = session.run(None, {"boxes1": a.numpy(), "boxes2": b.numpy()})
        np.testing.assert_allclose(got, model(a, b).numpy(), atol=2e-5)
    aligned = _Pairwise(mode, aligned=True, clockwise=clockwise)
    proto = export(
        aligned,
        (args[0], args[0].flip(0)),
        ("boxes1", "boxes2"),
        {"boxes1": {0: "n"}, "boxes2": {0: "n"}},
        opset,
        dynamo,
        lowering,
    )
    a, b = _random_boxes(generator, 7).float(), _random_boxes(generator, 7).float()
    (got,) = opbridge_ort.InferenceSession(proto).run(None, {"boxes1": a.numpy(), "boxes2": b.numpy()})
    np.testing.assert_allclose(got, aligned(a, b).numpy(), atol=2e-5)


CONTRACT_CASES = {
    "opbridge.box_iou_rotated": [
        (lambda: opbridge.box_iou_rotated(torch.ones(2, 5), None), TypeError, ["boxes2 must be a tensor"]),
        (lambda: opbridge.box_iou_rotated(torch.ones(2, 5), torch.ones(2, 5), "giou"), ValueError, ["'iou' or 'iof'"]),
        (lambda: opbridge.box_iou_rotated(torch.ones(2, 4), torch.ones(2, 5)), RuntimeError, ["[boxes, 5]", "[2, 4]"]),
        (
            lambda: opbridge.box_iou_rotated(torch.ones(2, 5), torch.ones(3, 5), aligned=True),
            RuntimeError,
            ["aligned=True", "2 and 3"],
        ),
        (
            lambda: opbridge.box_iou_rotated(torch.ones(2, 5), torch.ones(2, 5, dtype=torch.float64)),
            RuntimeError,
            ["same dtype"],
        ),
        (
            lambda: opbridge.box_iou_rotated(torch.ones(2, 5, dtype=torch.int64), torch.ones(2, 5, dtype=torch.int64)),
            RuntimeError,
            ["float32, float64, float16 or bfloat16", "torch.int64"],
        ),
        (
            lambda: opbridge.box_iou_rotated(torch.ones(2, 5), torch.ones(2, 5, device="meta")),
            RuntimeError,
            ["one device"],
        ),
    ],
}


def test_standard_lowering_is_float64_exact_at_any_angle(generator):
    """ONNX Runtime has float64 Cos/Sin kernels only from 1.30: the float64 standard lowering computes them from
    Mul/Add/Round (builder.cos_sin, TorchScript-based exporter), to float64 precision, for angles far outside
    [-pi, pi] too."""
    model = _Pairwise()
    boxes = _random_boxes(generator, 12)
    boxes[:, 4] *= 60  # angles up to about +-380 radians
    proto = export(model, (boxes, boxes.flip(0)), ("boxes1", "boxes2"), {}, 17, False, "standard")
    assert not {n.op_type for n in proto.graph.node} & {"Cos", "Sin"}
    (got,) = opbridge_ort.InferenceSession(proto).run(None, {"boxes1": boxes.numpy(), "boxes2": boxes.flip(0).numpy()})
    np.testing.assert_allclose(got, model(boxes, boxes.flip(0)).numpy(), atol=1e-10, rtol=0)
