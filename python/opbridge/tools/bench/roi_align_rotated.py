"""roi_align_rotated's benchmark (float32; an Oriented R-CNN head: 1,000 rois, 7 x 7, 256 channels, a stride-8
map of a 1024 x 1024 image, sampling_ratio 2 as mmrotate's configs):

``torch_op``          ``opbridge.roi_align_rotated``;
``torch_vectorized``  the tensor version written for this benchmark: all sample points at once, four corner
                      gathers from channels-last features;
``torch_torchvision`` the same rois at angle 0 through ``torchvision.ops.roi_align`` (axis-aligned: what the
                      rotation costs), against ``torch_op_angle0``;
``ort_custom``        ORT ``opbridge::RoiAlignRotated``; ``ort_standard``: opbridge's standard-ops lowering.
"""

from __future__ import annotations

import math
from functools import partial

import torch

import opbridge

from . import Bench, Target, check_close, checked_run, ort_session

CASES = {"1000 rois 7x7 C256": (1000, 256), "200 rois 7x7 C256": (200, 256)}
TARGETS = [
    Target("torch_op", "torch_vectorized", 3.0),
    Target("torch_op_angle0", "torch_torchvision", None),
    Target("ort_custom", "ort_standard", None),
]
SIZE, SCALE, RATIO = (7, 7), 1 / 8, 2
MAP = 128  # the feature map is MAP x MAP


def rois(count: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    centers = torch.rand(count, 2, generator=generator) * torch.tensor([width, height]) / SCALE
    sizes = torch.rand(count, 2, generator=generator) * 150 + 16
    angles = (torch.rand(count, 1, generator=generator) - 0.5) * math.pi
    return torch.cat([torch.zeros(count, 1), centers, sizes, angles], 1)


def vectorized(features: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
    """mmcv's definition with tensors (aligned, counter-clockwise, a fixed sampling ratio), on the inputs' device
    (the CPU and GPU benchmarks' baseline)."""
    ph, pw = SIZE
    cx, cy = rois[:, 1] * SCALE - 0.5, rois[:, 2] * SCALE - 0.5
    rw, rh, theta = rois[:, 3] * SCALE, rois[:, 4] * SCALE, rois[:, 5]
    arange = partial(torch.arange, device=rois.device)
    steps = (arange(RATIO) + 0.5) / RATIO
    yy = -rh[:, None, None] / 2 + (arange(ph)[None, :, None] + steps) * (rh / ph)[:, None, None]  # [K, PH, G]
    xx = -rw[:, None, None] / 2 + (arange(pw)[None, :, None] + steps) * (rw / pw)[:, None, None]
    yy, xx = yy[:, :, :, None, None], xx[:, None, None]
    cos, sin = theta.cos()[:, None, None, None, None], theta.sin()[:, None, None, None, None]
    y = yy * cos - xx * sin + cy[:, None, None, None, None]
    x = yy * sin + xx * cos + cx[:, None, None, None, None]
    out = gather_bilinear(features, rois[:, 0].long()[:, None, None, None, None], y, x)
    return (out.sum((2, 4)) / (RATIO * RATIO)).permute(0, 3, 1, 2)


def gather_bilinear(features: torch.Tensor, batch: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """mmcv's bilinear samples of ``features [N, C, H, W]`` at positions ``y, x`` of any shape (with ``batch``
    broadcasting against them): ``[..., C]``, four corner gathers from channels-last rows. Shared with
    rotated_feature_align's baseline."""
    _, c, h, w = features.shape
    inside = (y >= -1) & (y <= h) & (x >= -1) & (x <= w)
    y, x = y.clamp(min=0), x.clamp(min=0)
    y0, x0 = y.floor().clamp(max=h - 1), x.floor().clamp(max=w - 1)
    y, x = torch.where(y0 >= h - 1, y0, y), torch.where(x0 >= w - 1, x0, x)
    y1, x1 = (y0 + 1).clamp(max=h - 1), (x0 + 1).clamp(max=w - 1)
    ly, lx = y - y0, x - x0
    rows = features.permute(0, 2, 3, 1).reshape(-1, c)
    out = 0
    for cy, cx, weight in ((y0, x0, (1 - ly) * (1 - lx)), (y0, x1, (1 - ly) * lx), (y1, x0, ly * (1 - lx)),
                           (y1, x1, ly * lx)):  # fmt: skip
        out = out + rows[batch * h * w + cy.long() * w + cx.long()] * (weight * inside)[..., None]
    return out


class _Model(torch.nn.Module):
    def forward(self, input, rois):
        return opbridge.roi_align_rotated(input, rois, SIZE, SCALE, RATIO, True, False)


def run(bench: Bench) -> None:
    from ...onnx import export

    torchvision_op = _torchvision_roi_align()
    for case, (count, channels) in CASES.items():
        features = torch.randn(1, channels, MAP, MAP, generator=torch.Generator().manual_seed(0))
        r = rois(count, MAP, MAP)
        want = opbridge.roi_align_rotated(features, r, SIZE, SCALE, RATIO)
        flat = r.clone()
        flat[:, 5] = 0
        boxes = torch.stack(
            [
                flat[:, 0],
                flat[:, 1] - flat[:, 3] / 2,
                flat[:, 2] - flat[:, 4] / 2,
                flat[:, 1] + flat[:, 3] / 2,
                flat[:, 2] + flat[:, 4] / 2,
            ],
            1,
        )
        models = {
            path: export(
                _Model(),
                (features, r[:3]),
                None,
                opset_version=17,
                dynamo=False,
                lowering=lowering,
                input_names=["input", "rois"],
                dynamic_axes={"rois": {0: "k"}},
            )
            for path, lowering in (("ort_custom", "custom"), ("ort_standard", "standard"))
        }
        feeds = {"input": features.numpy(), "rois": r.numpy()}
        record = partial(bench.record, "roi_align_rotated", case)
        for threads in bench.threads:
            torch.set_num_threads(threads)
            check_close("torch_vectorized", vectorized(features, r).numpy(), want.numpy(), 1e-4, 1e-4)
            record(threads, "torch_op", partial(opbridge.roi_align_rotated, features, r, SIZE, SCALE, RATIO))
            record(threads, "torch_vectorized", partial(vectorized, features, r))
            record(threads, "torch_op_angle0", partial(opbridge.roi_align_rotated, features, flat, SIZE, SCALE, RATIO))
            if torchvision_op is None:
                record(threads, "torch_torchvision", None, "n/a: torchvision's compiled ops do not load")
            else:
                check_close(
                    "torch_torchvision",
                    torchvision_op(features, boxes, SIZE, SCALE, RATIO, True).numpy(),
                    opbridge.roi_align_rotated(features, flat, SIZE, SCALE, RATIO).numpy(),
                    1e-4,
                    1e-4,
                )
                record(threads, "torch_torchvision", partial(torchvision_op, features, boxes, SIZE, SCALE, RATIO, True))
            for path, model in models.items():
                session = ort_session(model, threads, path == "ort_custom")
                record(threads, path, checked_run(path, session, feeds, want.numpy(), 1e-4, 1e-4))


def _torchvision_roi_align():
    try:
        import torchvision.ops

        torch.ops.torchvision.roi_align  # noqa: B018  (raises when the compiled ops do not load)
    except (ImportError, AttributeError, RuntimeError):
        return None
    return torchvision.ops.roi_align
