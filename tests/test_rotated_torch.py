"""The vectorized torch versions of the rotated ops (opbridge.tools.rotated_torch, the GPU benchmarks' baseline)
against the ops' float64 references (polygon clipping and plain loops), on the CPU: a baseline that computed
something else would make the benchmark's comparison meaningless."""

from __future__ import annotations

import pytest
import torch

from opbridge.ops import box_iou_rotated as box_iou_module
from opbridge.ops import nms_rotated as nms_module
from opbridge.ops import roi_align_rotated as roi_module
from opbridge.tools import rotated_torch
from test_box_iou_rotated import _random_boxes as random_boxes


def _random_boxes(count: int, seed: int, spread: float = 8.0) -> torch.Tensor:
    return random_boxes(torch.Generator().manual_seed(seed), count, spread)


@pytest.mark.parametrize("mode", ["iou", "iof"])
@pytest.mark.parametrize("clockwise", [True, False])
def test_box_iou_rotated_matches_polygon_clipping(mode, clockwise):
    boxes1, boxes2 = box_iou_module._sample_inputs(torch.float64, "iou", 4)  # identical, nested, touching, zero size
    boxes1 = torch.cat([boxes1, _random_boxes(9, 1)])
    boxes2 = torch.cat([boxes2, _random_boxes(7, 2), boxes1[-3:]])  # more identical pairs, at arbitrary angles
    got = rotated_torch.box_iou_rotated(boxes1, boxes2, mode, clockwise, rows=5)  # several chunks of rows
    operands = {"iou": "iou", "iof": "iof"}[mode]
    want = torch.tensor(
        [[box_iou_module.overlap(a, b, operands, clockwise) for b in boxes2.tolist()] for a in boxes1.tolist()],
        dtype=torch.float64,
    )
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    assert float(want.max()) > 0.99 and int((want == 0).sum()) > 0  # the cases exercise full and empty overlaps


def test_box_iou_rotated_of_axis_aligned_boxes_is_the_axis_aligned_iou():
    import torchvision

    boxes = _random_boxes(40, 3, spread=10.0)
    boxes[:, 4] = 0
    boxes[5] = boxes[4]
    xyxy = torch.cat([boxes[:, :2] - boxes[:, 2:4] / 2, boxes[:, :2] + boxes[:, 2:4] / 2], 1)
    torch.testing.assert_close(rotated_torch.box_iou_rotated(boxes, boxes), torchvision.ops.box_iou(xyxy, xyxy))


@pytest.mark.parametrize("batch", [2, 5, 9])
def test_nms_rotated_keeps_what_greedy_nms_keeps(batch):
    boxes, scores = nms_module._sample_inputs(torch.float64, "plain", batch)[:2]
    kept = rotated_torch.nms_rotated(boxes, scores, 0.3)
    want = nms_module.reference(boxes, scores)[1]
    assert kept.tolist() == want.tolist()
    assert len(want) < len(boxes)  # something was suppressed


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("clockwise", [True, False])
@pytest.mark.parametrize("ratio", [1, 2])
def test_roi_align_rotated_matches_the_loops(aligned, clockwise, ratio):
    x, rois = roi_module._sample_inputs(torch.float64, "default", 2)  # inside, across the border, outside, tiny
    got = rotated_torch.roi_align_rotated(x, rois, (3, 2), 0.75, ratio, aligned, clockwise)
    want = roi_module.reference(x, rois, (3, 2), 0.75, ratio, aligned, clockwise)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_roi_align_rotated_is_differentiable_in_the_input():
    x, rois = roi_module._sample_inputs(torch.float64, "default", 2)
    x.requires_grad_()
    torch.autograd.gradcheck(lambda x: rotated_torch.roi_align_rotated(x, rois, (2, 2), 1.0, 2), (x,))


def test_roi_align_rotated_needs_a_fixed_sampling_ratio():
    x, rois = roi_module._sample_inputs(torch.float64, "default", 2)
    with pytest.raises(ValueError, match="sampling_ratio > 0"):
        rotated_torch.roi_align_rotated(x, rois, (2, 2), 1.0, 0)
