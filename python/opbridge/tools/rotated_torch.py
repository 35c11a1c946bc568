"""The rotated ops written as vectorized torch (mmcv's semantics), on any device: the GPU benchmarks' baseline for
what a user without a kernel would run (``python -m opbridge.tools.bench_cuda``, "Rotated ops on CUDA"). Not used by
the ops; tests/test_rotated_torch.py checks each against the ops' float64 references.

- :func:`box_iou_rotated`: the intersection by Green's theorem, each edge of one box clipped against the other's
  four half-planes (an interval of its parameter), in chunks of rows so memory stays bounded.
- :func:`nms_rotated`: the IoU matrix of the boxes sorted by score, then greedy suppression solved as a fixed point
  (keep[j] = no kept earlier box overlaps j), iterated on the device until it stops changing: exact, one pass per
  link of the longest suppression chain.
- :func:`roi_align_rotated`: every bin's sample points rotated and read by gathers with mmcv's bilinear rules, for a
  fixed ``sampling_ratio`` (> 0); differentiable in ``input`` through autograd.
"""

from __future__ import annotations

import torch
from torch import Tensor


def corners(boxes: Tensor, clockwise: bool = True) -> Tensor:
    """[..., 5] boxes (cx, cy, w, h, angle) -> [..., 4, 2] corners, counter-clockwise (positive area)."""
    centre, w, h = boxes[..., :2], boxes[..., 2], boxes[..., 3]
    angle = boxes[..., 4] if clockwise else -boxes[..., 4]
    c, s = torch.cos(angle), torch.sin(angle)
    u = torch.stack([-w, w, w, -w], -1) / 2
    v = torch.stack([-h, -h, h, h], -1) / 2
    return (
        torch.stack([c[..., None] * u - s[..., None] * v, s[..., None] * u + c[..., None] * v], -1)
        + centre[..., None, :]
    )


def _cross(a: Tensor, b: Tensor) -> Tensor:
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def _inside_area(polygon: Tensor, clip: Tensor, closed: bool) -> Tensor:
    """Twice Green's integral (x dy - y dx) over the parts of `polygon`'s edges inside convex `clip` ([..., 4, 2]
    each). `closed`: an edge on clip's boundary counts where it runs the boundary's way (once for the two boxes)."""
    start, direction = polygon, polygon.roll(-1, -2) - polygon  # edges i
    origin, edge = clip, clip.roll(-1, -2) - clip  # half-planes k: cross(edge_k, p - origin_k) >= 0
    alpha = _cross(edge[..., None, :, :], start[..., :, None, :] - origin[..., None, :, :])  # [..., i, k]
    beta = _cross(edge[..., None, :, :], direction[..., :, None, :])
    ratio = -alpha / torch.where(beta == 0, torch.ones_like(beta), beta)
    lower = torch.where(beta > 0, ratio, torch.full_like(ratio, -torch.inf)).amax(-1).clamp(min=0)
    upper = torch.where(beta < 0, ratio, torch.full_like(ratio, torch.inf)).amin(-1).clamp(max=1)
    if closed:
        same_way = (edge[..., None, :, :] * direction[..., :, None, :]).sum(-1) > 0
        parallel_inside = (alpha > 0) | ((alpha == 0) & same_way)
    else:
        parallel_inside = alpha > 0
    valid = (upper > lower) & ~((beta == 0) & ~parallel_inside).any(-1)
    a = start + lower[..., None] * direction
    b = start + upper[..., None] * direction
    return torch.where(valid, _cross(a, b), torch.zeros_like(lower)).sum(-1)


def box_iou_rotated(
    boxes1: Tensor, boxes2: Tensor, mode: str = "iou", clockwise: bool = True, rows: int | None = None
) -> Tensor:
    """[N, 5] x [M, 5] -> [N, M] IoU (or IoF with mode="iof") of rotated boxes, as opbridge.box_iou_rotated."""
    n, m = boxes1.shape[0], boxes2.shape[0]
    rows = rows or max(1, (1 << 22) // max(m, 1))  # [rows, M, 4, 4] temporaries of 2^26 elements
    area1, area2 = boxes1[:, 2] * boxes1[:, 3], boxes2[:, 2] * boxes2[:, 3]
    second = corners(boxes2, clockwise)
    out = []
    for first in range(0, n, rows):
        chunk = boxes1[first : first + rows]
        centre = chunk[:, None, None, :2]  # each pair in the first box's frame: less cancellation
        a = (corners(chunk, clockwise)[:, None] - centre).expand(-1, m, -1, -1)
        b = second[None] - centre
        inter = ((_inside_area(a, b, closed=True) + _inside_area(b, a, closed=False)) / 2).clamp(min=0)
        a1, a2 = area1[first : first + rows, None], area2[None]
        union = a1 if mode == "iof" else a1 + a2 - inter
        empty = (a1 < 1e-14) | (a2 < 1e-14)
        out.append(torch.where(empty, torch.zeros_like(inter), inter / torch.where(empty, 1, union)))
    return torch.cat(out) if out else boxes1.new_zeros(0, m)


def nms_rotated(boxes: Tensor, scores: Tensor, iou_threshold: float, clockwise: bool = True) -> Tensor:
    """Indices of the kept boxes, by descending score (ties: the lower index first), as opbridge.nms_rotated's."""
    order = torch.sort(scores, descending=True, stable=True).indices
    sorted_boxes = boxes[order]
    suppresses = torch.triu(box_iou_rotated(sorted_boxes, sorted_boxes, clockwise=clockwise) > iou_threshold, 1)
    keep = torch.ones(order.shape[0], dtype=torch.bool, device=boxes.device)
    while True:
        again = ~(suppresses & keep[:, None]).any(0)
        if torch.equal(again, keep):
            return order[keep]
        keep = again


def roi_align_rotated(
    input: Tensor,
    rois: Tensor,
    output_size: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool = True,
    clockwise: bool = False,
) -> Tensor:
    """[N, C, H, W] and [K, 6] rois (batch, cx, cy, w, h, angle) -> [K, C, ph, pw], as opbridge.roi_align_rotated
    for sampling_ratio > 0 (each bin's sampling_ratio^2 points, averaged)."""
    if sampling_ratio <= 0:
        raise ValueError(
            "this vectorized version needs a fixed sampling_ratio > 0 (mmcv's adaptive one varies per roi)"
        )
    ph, pw = output_size
    g = sampling_ratio
    n, c, height, width = input.shape
    offset = 0.5 if aligned else 0.0
    cx, cy = rois[:, 1] * spatial_scale - offset, rois[:, 2] * spatial_scale - offset
    w, h = rois[:, 3] * spatial_scale, rois[:, 4] * spatial_scale
    if not aligned:
        w, h = w.clamp(min=1.0), h.clamp(min=1.0)
    theta = -rois[:, 5] if clockwise else rois[:, 5]

    def steps(bins: int) -> Tensor:  # each bin's g sample positions, as fractions of the box's side
        first = torch.arange(bins, device=rois.device, dtype=rois.dtype)[:, None] * g
        return (first + torch.arange(g, device=rois.device, dtype=rois.dtype) + 0.5).reshape(-1) / (bins * g)

    yy = -h[:, None] / 2 + h[:, None] * steps(ph)  # [K, ph * g]
    xx = -w[:, None] / 2 + w[:, None] * steps(pw)  # [K, pw * g]
    cos, sin = torch.cos(theta)[:, None, None], torch.sin(theta)[:, None, None]
    y = yy[:, :, None] * cos - xx[:, None, :] * sin + cy[:, None, None]  # [K, ph * g, pw * g]
    x = yy[:, :, None] * sin + xx[:, None, :] * cos + cx[:, None, None]
    valid = (y >= -1) & (y <= height) & (x >= -1) & (x <= width)
    y, x = y.clamp(min=0), x.clamp(min=0)
    y0, x0 = y.floor(), x.floor()
    y = torch.where(y0 >= height - 1, torch.full_like(y, height - 1), y)
    x = torch.where(x0 >= width - 1, torch.full_like(x, width - 1), x)
    y0, x0 = y0.clamp(max=height - 1), x0.clamp(max=width - 1)
    ly, lx = y - y0, x - x0
    y0, x0 = y0.long(), x0.long()
    y1, x1 = (y0 + 1).clamp(max=height - 1), (x0 + 1).clamp(max=width - 1)
    pixels = input.permute(0, 2, 3, 1).reshape(n * height * width, c)
    base = rois[:, 0].long()[:, None, None] * (height * width)
    out = 0
    for yi, xi, weight in ((y0, x0, (1 - ly) * (1 - lx)), (y0, x1, (1 - ly) * lx), (y1, x0, ly * (1 - lx)),
                           (y1, x1, ly * lx)):  # fmt: skip
        weight = torch.where(valid, weight, torch.zeros_like(weight))
        out = out + pixels[(base + yi * width + xi).reshape(-1)].reshape(*weight.shape, c) * weight[..., None]
    k = rois.shape[0]
    out = out.reshape(k, ph, g, pw, g, c).mean((2, 4))
    return out.permute(0, 3, 1, 2).to(input.dtype)
