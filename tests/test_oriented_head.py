"""An oriented-detection head end to end (what mmrotate's Oriented R-CNN does after the RPN): rotated RoIAlign of
the proposals on a feature map, a small MLP, box decoding, rotated NMS. Exported with both exporters and run in
ONNX Runtime with numbers of proposals the export never saw."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import opbridge
import opbridge_ort
from rotated_helpers import export


class OrientedHead(torch.nn.Module):
    def __init__(self, channels: int = 8, stride: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.align = opbridge.nn.RoIAlignRotated(out_size=7, spatial_scale=1 / stride, sample_num=2, clockwise=True)
        self.mlp = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(channels * 49, 32), torch.nn.ReLU(), torch.nn.Linear(32, 6)
        )

    def forward(self, features, proposals):
        rois = torch.cat([torch.zeros_like(proposals[:, :1]), proposals], 1)  # one image
        out = self.mlp(self.align(features, rois))
        deltas, logits = out[:, :5] * 0.1, out[:, 5]
        cx = proposals[:, 0] + deltas[:, 0] * proposals[:, 2]
        cy = proposals[:, 1] + deltas[:, 1] * proposals[:, 3]
        w, h = proposals[:, 2] * deltas[:, 2].exp(), proposals[:, 3] * deltas[:, 3].exp()
        angle = proposals[:, 4] + deltas[:, 4]
        boxes = torch.stack([cx, cy, w, h, angle], 1)
        return opbridge.nms_rotated(boxes, logits.sigmoid(), 0.1)


def _proposals(count: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    objects = torch.rand(4, 2, generator=generator) * 200 + 28
    centers = objects[torch.arange(count) % 4] + torch.randn(count, 2, generator=generator) * 6
    return torch.cat([centers, torch.rand(count, 2, generator=generator) * 40 + 10,
                      (torch.rand(count, 1, generator=generator) - 0.5) * math.pi], 1)  # fmt: skip


@pytest.mark.parametrize(("dynamo", "opset"), [(False, 11), (False, 17), (True, 18)])
def test_oriented_head_exports_and_runs_with_any_number_of_proposals(dynamo, opset):
    head = OrientedHead().eval()
    features = torch.randn(1, 8, 32, 32, generator=torch.Generator().manual_seed(1))
    args = (features, _proposals(20, 0))
    proto = export(head, args, ("features", "proposals"), {"proposals": {0: "proposals"}}, opset, dynamo, "custom")
    ops = {(n.domain, n.op_type) for n in proto.graph.node}
    assert {("opbridge", "RoiAlignRotated"), ("opbridge", "NmsRotated")} <= ops
    session = opbridge_ort.InferenceSession(proto)
    kept = []
    for count, seed in ((20, 0), (57, 1), (3, 2), (1, 3)):
        proposals = _proposals(count, seed)
        with torch.no_grad():
            want_dets, want_keep = head(features, proposals)
        dets, keep = session.run(None, {"features": features.numpy(), "proposals": proposals.numpy()})
        assert keep.tolist() == want_keep.tolist()
        np.testing.assert_allclose(dets, want_dets.numpy(), rtol=1e-5, atol=1e-5)
        kept.append(len(keep))
    assert kept[1] < 57 and kept[1] > 1  # NMS did suppress, and kept more than one object


def test_torch_compile():
    """The four ops under torch.compile (dynamic sizes): the wrappers' checks trace, the fake kernels answer, and
    RoIAlign's and the feature alignment's backwards run; NMS's data-dependent size is captured as such."""
    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(5)
    features = torch.randn(1, 8, 32, 32, generator=generator, requires_grad=True)
    proposals = _proposals(12, 4)
    rois = torch.cat([torch.zeros(12, 1), proposals], 1)
    boxes = torch.cat(
        [torch.rand(1, 32, 32, 2, generator=generator) * 256, torch.rand(1, 32, 32, 3, generator=generator)], 3
    )

    def dense(features, rois, boxes):
        aligned = opbridge.roi_align_rotated(features, rois, 7, 1 / 8, 2, True, True)
        refined = opbridge.rotated_feature_align(features, boxes, 1 / 8, 5)
        defaults = opbridge.roi_align_rotated(features, rois, 2)  # spatial_scale's default (once a graph break)
        loss = aligned.sum() + refined.sum() + defaults.sum()
        return loss, opbridge.box_iou_rotated(rois[:, 1:], rois[:, 1:])

    compiled = torch.compile(dense, fullgraph=True, dynamic=True)
    (loss, iou), (want_loss, want_iou) = compiled(features, rois, boxes), dense(features, rois, boxes)
    torch.testing.assert_close(loss, want_loss)
    torch.testing.assert_close(iou, want_iou)
    (grad,) = torch.autograd.grad(loss, features)
    (want_grad,) = torch.autograd.grad(want_loss, features)
    torch.testing.assert_close(grad, want_grad)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        nms = torch.compile(lambda b, s: opbridge.nms_rotated(b, s, 0.2), fullgraph=True, dynamic=True)
        scores = torch.rand(12, generator=generator)
        for got, want in zip(nms(proposals, scores), opbridge.nms_rotated(proposals, scores, 0.2), strict=True):
            torch.testing.assert_close(got, want)
