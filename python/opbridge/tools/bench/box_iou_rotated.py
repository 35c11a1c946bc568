"""box_iou_rotated's benchmark (float32, 2,000 x 2,000 boxes of a detector's proposals, and 500 x 500):

``torch_op``          ``opbridge.box_iou_rotated``;
``torch_vectorized``  the same intersection written with tensors for this benchmark: every edge of one box
                      clipped against the other box's four half-planes for all pairs at once (``[rows, M, 4, 4]``
                      tensors, 250 rows at a time), areas by Green's theorem;
``ort_custom``        ORT ``opbridge::BoxIouRotated``; ``ort_standard``: opbridge's standard-ops lowering.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import torch

import opbridge

from . import Bench, Target, check_close, checked_run, ort_session

CASES = {"2000 x 2000 boxes": 2000, "500 x 500 boxes": 500}
TARGETS = [
    Target("torch_op", "torch_vectorized", 10.0),
    Target("ort_custom", "ort_standard", None),
]


def proposals(count: int, seed: int = 0) -> torch.Tensor:
    """Rotated boxes as a detector proposes them: clustered on objects of a 1024 x 1024 image."""
    generator = torch.Generator().manual_seed(seed)
    objects = torch.rand(max(count // 20, 1), 2, generator=generator) * 1024
    centers = objects[torch.randint(0, objects.shape[0], (count,), generator=generator)]
    centers = centers + torch.randn(count, 2, generator=generator) * 8
    sizes = torch.rand(count, 2, generator=generator) * 60 + 10
    angles = (torch.rand(count, 1, generator=generator) - 0.5) * math.pi
    return torch.cat([centers, sizes, angles], 1)


def _corners(boxes: torch.Tensor):
    cos, sin = boxes[:, 4].cos()[:, None], boxes[:, 4].sin()[:, None]
    ux = boxes[:, 2:3] * boxes.new_tensor([-0.5, 0.5, 0.5, -0.5])
    uy = boxes[:, 3:4] * boxes.new_tensor([-0.5, -0.5, 0.5, 0.5])
    return cos * ux - sin * uy, sin * ux + cos * uy  # [K, 4] each, relative to the center


def _inside_sum(px, py, qx, qy):
    """Twice the area swept by the edges of p inside q, for all pairs: [..., 4] corners -> [...]."""
    dx, dy = px.roll(-1, -1) - px, py.roll(-1, -1) - py
    ex, ey = qx.roll(-1, -1) - qx, qy.roll(-1, -1) - qy
    f0 = ex[..., None, :] * (py[..., :, None] - qy[..., None, :]) - ey[..., None, :] * (
        px[..., :, None] - qx[..., None, :]
    )
    fd = ex[..., None, :] * dy[..., :, None] - ey[..., None, :] * dx[..., :, None]
    t = -f0 / torch.where(fd == 0, torch.ones_like(fd), fd)
    lower = torch.where(fd > 0, t, torch.where((fd == 0) & (f0 < 0), torch.full_like(t, 2.0), torch.zeros_like(t)))
    upper = torch.where(fd < 0, t, torch.ones_like(t))
    t0, t1 = lower.amax(-1).clamp(min=0), upper.amin(-1).clamp(max=1)
    x0, y0, x1, y1 = px + t0 * dx, py + t0 * dy, px + t1 * dx, py + t1 * dy
    return torch.where(t0 < t1, x0 * y1 - y0 * x1, torch.zeros_like(t0)).sum(-1)


def vectorized_iou(boxes1: torch.Tensor, boxes2: torch.Tensor, chunk: int = 250) -> torch.Tensor:
    """IoU of all pairs with tensor ops only, on the boxes' device (the CPU and GPU benchmarks' baseline; boxes with
    positive sizes)."""
    ax, ay = _corners(boxes1)
    bx, by = _corners(boxes2)
    area1, area2 = boxes1[:, 2] * boxes1[:, 3], boxes2[:, 2] * boxes2[:, 3]
    rows = []
    for start in range(0, boxes1.shape[0], chunk):
        end = min(start + chunk, boxes1.shape[0])
        dx = boxes2[None, :, 0] - boxes1[start:end, None, 0]
        dy = boxes2[None, :, 1] - boxes1[start:end, None, 1]
        qx, qy = bx[None] + dx[..., None], by[None] + dy[..., None]  # [R, M, 4]
        px, py = ax[start:end, None].expand_as(qx), ay[start:end, None].expand_as(qy)
        inter = 0.5 * (_inside_sum(px, py, qx, qy) + _inside_sum(qx, qy, px, py))
        inter = torch.minimum(inter.clamp(min=0), torch.minimum(area1[start:end, None], area2[None]))
        rows.append(inter / (area1[start:end, None] + area2[None] - inter))
    return torch.cat(rows)


class _Model(torch.nn.Module):
    def forward(self, boxes1, boxes2):
        return opbridge.box_iou_rotated(boxes1, boxes2)


def run(bench: Bench) -> None:
    from ...onnx import export

    for case, count in CASES.items():
        boxes1, boxes2 = proposals(count, 0), proposals(count, 1)
        want = opbridge.box_iou_rotated(boxes1, boxes2).numpy()
        feeds = {"boxes1": boxes1.numpy(), "boxes2": boxes2.numpy()}
        record = partial(bench.record, "box_iou_rotated", case)
        models = {
            path: export(
                _Model(),
                (boxes1[:4], boxes2[:3]),
                None,
                opset_version=17,
                dynamo=False,
                lowering=lowering,
                input_names=["boxes1", "boxes2"],
                dynamic_axes={"boxes1": {0: "n"}, "boxes2": {0: "m"}},
            )
            for path, lowering in (("ort_custom", "custom"), ("ort_standard", "standard"))
        }
        for threads in bench.threads:
            torch.set_num_threads(threads)
            check_close("torch_vectorized", vectorized_iou(boxes1, boxes2).numpy(), want, 1e-3, 1e-3)
            record(threads, "torch_op", partial(opbridge.box_iou_rotated, boxes1, boxes2))
            record(threads, "torch_vectorized", partial(vectorized_iou, boxes1, boxes2))
            for path, model in models.items():
                if path == "ort_standard" and count > 1000:
                    record(threads, path, None, "n/a: [N, M, 4, 4] tensors of 2,000 x 2,000 pairs (GBs)")
                    continue
                session = ort_session(model, threads, path == "ort_custom")
                record(threads, path, checked_run(path, session, feeds, want.astype(np.float32), 1e-3, 1e-3))
