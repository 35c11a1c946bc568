"""rotated_feature_align's benchmark (float32; S2A-Net's refinement of a stride-8 level of a 1024 x 1024 image:
256 channels, 128 x 128, 5 points, and 1 point):

``torch_op``          ``opbridge.rotated_feature_align``;
``torch_vectorized``  the tensor version written for this benchmark: every pixel's points at once, four corner
                      gathers from channels-last features;
``ort_custom``        ORT ``opbridge::RotatedFeatureAlign``; ``ort_standard``: opbridge's standard-ops lowering.
"""

from __future__ import annotations

from functools import partial

import torch

import opbridge

from . import Bench, Target, check_close, checked_run, ort_session
from .roi_align_rotated import gather_bilinear

CASES = {"C256 128x128 5 points": 5, "C256 128x128 1 point": 1}
TARGETS = [Target("torch_op", "torch_vectorized", None), Target("ort_custom", "ort_standard", None)]
SCALE = 1 / 8
SHAPE = (1, 256, 128, 128)  # N, C, H, W


def vectorized(features: torch.Tensor, boxes: torch.Tensor, points: int) -> torch.Tensor:
    n = features.shape[0]
    y, x = boxes[..., 0] * SCALE, boxes[..., 1] * SCALE
    ys, xs = [y], [x]
    if points == 5:
        bw, bh, a = boxes[..., 2] * SCALE / 2, boxes[..., 3] * SCALE / 2, boxes[..., 4]
        wx, wy, hx, hy = a.cos() * bw, a.sin() * bw, -a.sin() * bh, a.cos() * bh
        for sw, sh in ((1, 1), (-1, 1), (-1, -1), (1, -1)):
            ys.append(y + sw * wy + sh * hy)
            xs.append(x + sw * wx + sh * hx)
    y, x = torch.stack(ys, -1), torch.stack(xs, -1)  # [N, H, W, P]
    out = gather_bilinear(features, torch.arange(n)[:, None, None, None], y, x)
    return features + out.sum(3).permute(0, 3, 1, 2)


class _Model(torch.nn.Module):
    def __init__(self, points: int) -> None:
        super().__init__()
        self.points = points

    def forward(self, features, best_rboxes):
        return opbridge.rotated_feature_align(features, best_rboxes, SCALE, self.points)


def run(bench: Bench) -> None:
    from ...onnx import export

    generator = torch.Generator().manual_seed(0)
    n, _, h, w = SHAPE
    features = torch.randn(*SHAPE, generator=generator)
    centers = torch.rand(n, h, w, 2, generator=generator) * torch.tensor([h, w]) / SCALE
    sizes = torch.rand(n, h, w, 2, generator=generator) * 120 + 8
    boxes = torch.cat([centers, sizes, (torch.rand(n, h, w, 1, generator=generator) - 0.5) * 3], 3)
    feeds = {"features": features.numpy(), "best_rboxes": boxes.numpy()}
    for case, points in CASES.items():
        want = opbridge.rotated_feature_align(features, boxes, SCALE, points)
        models = {
            path: export(
                _Model(points),
                (features, boxes),
                None,
                opset_version=17,
                dynamo=False,
                lowering=lowering,
                input_names=["features", "best_rboxes"],
            )
            for path, lowering in (("ort_custom", "custom"), ("ort_standard", "standard"))
        }
        record = partial(bench.record, "rotated_feature_align", case)
        for threads in bench.threads:
            torch.set_num_threads(threads)
            check_close("torch_vectorized", vectorized(features, boxes, points).numpy(), want.numpy(), 1e-4, 1e-4)
            record(threads, "torch_op", partial(opbridge.rotated_feature_align, features, boxes, SCALE, points))
            record(threads, "torch_vectorized", partial(vectorized, features, boxes, points))
            for path, model in models.items():
                session = ort_session(model, threads, path == "ort_custom")
                record(threads, path, checked_run(path, session, feeds, want.numpy(), 1e-4, 1e-4))
