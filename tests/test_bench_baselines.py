"""The benchmarks' tensor versions of the rotated ops (python/opbridge/tools/bench: the CPU benchmark's
``torch_vectorized`` baselines, which the GPU benchmark also runs on the GPU) against the ops' float64 references
(polygon clipping and plain loops), on the CPU: a baseline that computed something else would make the comparison
meaningless."""

from __future__ import annotations

import pytest
import torch

from opbridge.ops import box_iou_rotated as box_iou_module
from opbridge.ops import nms_rotated as nms_module
from opbridge.ops import roi_align_rotated as roi_module
from opbridge.tools.bench import roi_align_rotated as roi_bench
from opbridge.tools.bench.box_iou_rotated import vectorized_iou
from opbridge.tools.bench.nms_rotated import fixed_point_nms, vectorized_nms
from test_box_iou_rotated import _random_boxes as random_boxes


def test_vectorized_iou_matches_polygon_clipping():
    generator = torch.Generator().manual_seed(1)
    boxes1, boxes2 = random_boxes(generator, 23, 8.0), random_boxes(generator, 17, 8.0)
    boxes2[:5] = boxes1[:5]  # identical pairs at arbitrary angles (each edge on the other box's border)
    boxes2[5, :2] = boxes1[6, :2]  # a box inside another
    boxes2[5, 2:] = boxes1[6, 2:] * torch.tensor([0.5, 0.5, 1.0])
    got = vectorized_iou(boxes1, boxes2, chunk=6)  # several chunks of rows
    want = box_iou_module.reference(boxes1, boxes2)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    assert float(want.max()) > 0.999 and int((want == 0).sum()) > 0  # full and empty overlaps exercised


@pytest.mark.parametrize("nms", [vectorized_nms, fixed_point_nms])
@pytest.mark.parametrize("batch", [2, 5, 9])
def test_the_tensor_nms_keeps_what_greedy_nms_keeps(nms, batch):
    boxes, scores = nms_module._sample_inputs(torch.float64, "plain", batch)[:2]
    keep = boxes[:, 2] * boxes[:, 3] > 0  # the baselines take boxes with positive sizes
    boxes, scores = boxes[keep], scores[keep]
    want = nms_module.reference(boxes, scores)[1]
    assert nms(boxes, scores, 0.3).tolist() == want.tolist()
    assert len(want) < len(boxes)  # something was suppressed


def test_the_tensor_roi_align_rotated_matches_the_loops():
    x, rois = roi_module._sample_inputs(torch.float64, "default", 2)  # inside, across the border, outside, tiny
    rois[:, 1:5] /= roi_bench.SCALE
    got = roi_bench.vectorized(x, rois)
    want = roi_module.reference(x, rois, roi_bench.SIZE, roi_bench.SCALE, roi_bench.RATIO, True, False)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
