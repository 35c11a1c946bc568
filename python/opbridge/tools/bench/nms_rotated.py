"""nms_rotated's benchmark (float32, 2,000 and 500 clustered proposals, IoU threshold 0.1 and 0.5):

``torch_op``          ``opbridge.nms_rotated``;
``torch_vectorized``  the straightforward tensor version written for this benchmark: the IoU matrix of all pairs
                      (box_iou_rotated's vectorised baseline), then the greedy pass over the sorted boxes;
``ort_custom``        ORT ``opbridge::NmsRotated``.
"""

from __future__ import annotations

from functools import partial

import torch

import opbridge

from . import Bench, Target, ort_session
from .box_iou_rotated import proposals, vectorized_iou

CASES = {"2000 boxes, iou 0.1": (2000, 0.1), "2000 boxes, iou 0.5": (2000, 0.5), "500 boxes, iou 0.5": (500, 0.5)}
TARGETS = [Target("torch_op", "torch_vectorized", 10.0)]


def vectorized_nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> torch.Tensor:
    order = scores.argsort(descending=True, stable=True)
    iou = vectorized_iou(boxes[order], boxes[order])
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    keep = []
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(i)
        suppressed |= iou[i] > threshold
    return order[torch.tensor(keep, dtype=torch.int64)]


def fixed_point_nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """vectorized_nms without a step per box (the GPU benchmark's baseline): greedy suppression solved as a fixed
    point, keep[j] = no kept earlier box overlaps j, iterated on the boxes' device until it stops changing (exact:
    one pass per link of the longest suppression chain, each [N, N])."""
    order = scores.argsort(descending=True, stable=True)
    suppresses = torch.triu(vectorized_iou(boxes[order], boxes[order]) > threshold, 1)
    keep = torch.ones(len(order), dtype=torch.bool, device=boxes.device)
    while True:
        again = ~(suppresses & keep[:, None]).any(0)
        if torch.equal(again, keep):
            return order[keep]
        keep = again


class _Model(torch.nn.Module):
    def __init__(self, threshold: float) -> None:
        super().__init__()
        self.threshold = threshold

    def forward(self, boxes, scores):
        return opbridge.nms_rotated(boxes, scores, self.threshold)[1]


def run(bench: Bench) -> None:
    from ...onnx import export

    for case, (count, threshold) in CASES.items():
        boxes = proposals(count, 2)
        scores = torch.rand(count, generator=torch.Generator().manual_seed(3))
        keep = opbridge.nms_rotated(boxes, scores, threshold)[1]
        if vectorized_nms(boxes, scores, threshold).tolist() != keep.tolist():
            raise AssertionError(f"nms_rotated {case}: the vectorised baseline keeps other boxes")
        model = export(
            _Model(threshold),
            (boxes[:5], scores[:5]),
            None,
            opset_version=17,
            dynamo=False,
            lowering="custom",
            input_names=["boxes", "scores"],
            dynamic_axes={"boxes": {0: "n"}, "scores": {0: "n"}},
        )
        feeds = {"boxes": boxes.numpy(), "scores": scores.numpy()}
        record = partial(bench.record, "nms_rotated", case)
        for threads in bench.threads:
            torch.set_num_threads(threads)
            record(
                threads,
                "torch_op",
                partial(opbridge.nms_rotated, boxes, scores, threshold),
                f"{len(keep)} of {count} kept",
            )
            record(threads, "torch_vectorized", partial(vectorized_nms, boxes, scores, threshold))
            session = ort_session(model, threads, True)
            if session.run(None, feeds)[0].tolist() != keep.tolist():
                raise AssertionError(f"nms_rotated {case}: ORT keeps other boxes")
            record(threads, "ort_custom", partial(session.run, None, feeds))
