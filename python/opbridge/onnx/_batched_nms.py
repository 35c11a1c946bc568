"""torchvision's detectors through ``torch.export``: an export-time form of ``torchvision.ops.batched_nms``.

torchvision's ``batched_nms`` picks an algorithm by box count (``boxes.numel() > 4000``) and its coordinate-trick
branch returns early on ``boxes.numel() == 0``. After score filtering the box count is data-dependent, so
``torch.export`` (the dynamo ONNX exporter) stops on those branches: Faster R-CNN, RetinaNet, FCOS, SSDlite,
Mask R-CNN and Keypoint R-CNN all fail there. While an export traces (``torch.compiler.is_exporting()``), opbridge
answers the call with a branch-free per-class NMS instead: every class's boxes are shifted by
``class * (extent + 1)``, where ``extent`` spans all coordinates and 0 (so that boxes of different classes never
overlap, negative coordinates included, and an empty input needs no branch), then one ``torchvision.ops.nms``.
It keeps exactly the boxes that per-class NMS keeps, in decreasing score order, which is what torchvision's own
branches return (its tracing path uses the same trick). Outside an export the original function runs.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch


def batched_nms_for_export(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float):
    import torchvision

    zero = boxes.new_zeros(1)
    flat = torch.cat([boxes.reshape(-1), zero])
    extent = flat.max() - flat.min() + 1
    shifted = boxes + (idxs.to(boxes) * extent)[:, None]
    return torchvision.ops.nms(shifted, scores, iou_threshold)


def install(ops_module: ModuleType) -> None:
    """Wraps ``torchvision.ops.boxes.batched_nms`` and the ``torchvision.ops`` re-export, once; ``ops_module`` is
    ``torchvision.ops``, just imported (``torchvision`` itself may still be importing)."""
    import sys

    boxes_module = sys.modules.get("torchvision.ops.boxes")
    if boxes_module is None:
        return
    original = getattr(boxes_module, "batched_nms", None)
    if original is None or getattr(original, "__opbridge_wrapped__", False):
        return

    @functools.wraps(original)
    def batched_nms(boxes, scores, idxs, iou_threshold):
        if torch.compiler.is_exporting() and not torch.jit.is_scripting():
            return batched_nms_for_export(boxes, scores, idxs, iou_threshold)
        return original(boxes, scores, idxs, iou_threshold)

    batched_nms.__opbridge_wrapped__ = True
    batched_nms.__wrapped__ = original
    boxes_module.batched_nms = batched_nms
    if getattr(ops_module, "batched_nms", None) is original:
        ops_module.batched_nms = batched_nms
