"""A Deformable-DETR-style encoder over opbridge's multi-scale deformable attention, as the tutorial's
"deploying a DETR-family model" builds it: layers of (deformable self-attention + FFN), post-norm, on the
flattened multi-level maps of a backbone.

Everything that depends on the image size (the level table, the reference points) is computed from the
feature maps with tensor ops, so an exported model takes any image size without re-export.
"""

from __future__ import annotations

import torch
from torch import Tensor

import opbridge


class EncoderLayer(torch.nn.Module):
    def __init__(self, d_model: int, heads: int, levels: int, points: int, ffn: int) -> None:
        super().__init__()
        self.attention = opbridge.nn.MultiScaleDeformableAttention(d_model, heads, levels, points)
        self.norm1 = torch.nn.LayerNorm(d_model)
        self.ffn = torch.nn.Sequential(torch.nn.Linear(d_model, ffn), torch.nn.ReLU(), torch.nn.Linear(ffn, d_model))
        self.norm2 = torch.nn.LayerNorm(d_model)

    def forward(self, src, pos, reference_points, spatial_shapes, level_start_index):
        attended = self.attention(src + pos, reference_points, src, spatial_shapes, level_start_index)
        src = self.norm1(src + attended)
        return self.norm2(src + self.ffn(src))


class Encoder(torch.nn.Module):
    """forward(*features): features[l] is [N, d_model, H_l, W_l]; returns the encoded memory [N, S, d_model]."""

    def __init__(self, d_model: int = 256, heads: int = 8, levels: int = 4, points: int = 4, layers: int = 6,
                 ffn: int = 1024) -> None:  # fmt: skip
        super().__init__()
        self.level_embed = torch.nn.Parameter(torch.randn(levels, d_model) * 0.1)
        self.position = torch.nn.Linear(2, d_model)  # a learned embedding of the normalized (x, y)
        self.layers = torch.nn.ModuleList(EncoderLayer(d_model, heads, levels, points, ffn) for _ in range(layers))

    @staticmethod
    def _centres(feature: Tensor) -> Tensor:
        """[N, H*W, 2]: the normalized (x, y) of each pixel centre, from tensor ops only."""
        ones = torch.ones_like(feature[:, 0])  # [N, H, W]
        y = (ones.cumsum(1) - 0.5) / ones.sum(1, keepdim=True)
        x = (ones.cumsum(2) - 0.5) / ones.sum(2, keepdim=True)
        return torch.stack([x.flatten(1), y.flatten(1)], -1)

    def forward(self, *features: Tensor) -> Tensor:
        spatial_shapes, level_start_index = opbridge.ms_deform_attn_level_table(*features)
        src = torch.cat([f.flatten(2).transpose(1, 2) for f in features], 1)  # [N, S, d_model]
        centres = [self._centres(f) for f in features]
        pos = torch.cat([self.position(c) + self.level_embed[level] for level, c in enumerate(centres)], 1)
        reference_points = torch.cat(centres, 1)[:, :, None].expand(-1, -1, len(features), -1)
        for layer in self.layers:
            src = layer(src, pos, reference_points, spatial_shapes, level_start_index)
        return src


def features(batch: int, sizes, d_model: int, seed: int = 0, dtype=torch.float32) -> tuple[Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, d_model, h, w, generator=generator, dtype=dtype) for h, w in sizes)


def strides_of(height: int, width: int, strides=(8, 16, 32, 64)) -> list[tuple[int, int]]:
    """The feature-map sizes of a height x width image at the given strides (ceil, as ResNet's)."""
    return [(-(-height // s), -(-width // s)) for s in strides]


def main() -> int:
    """The full-size check of the issue: a 6-layer encoder (d_model 256, 8 heads, 4 levels, 4 points) on the
    maps of an 800x1333 image, exported with both exporters and both lowerings, run in ORT at that size and at
    a second one (640x960) without re-export, against eager. Prints the max error and the ORT time of each.

        python tests/detr_encoder.py
    """
    import time
    import warnings

    import numpy as np

    import opbridge_ort

    torch.manual_seed(0)
    model = Encoder().eval()

    class FourLevels(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = model

        def forward(self, p3, p4, p5, p6):
            return self.encoder(p3, p4, p5, p6)

    wrapper = FourLevels().eval()
    names = ["p3", "p4", "p5", "p6"]
    sizes = {"800x1333": strides_of(800, 1333), "640x960": strides_of(640, 960)}
    inputs = {name: features(1, levels, 256, seed=1) for name, levels in sizes.items()}
    with torch.no_grad():
        expected = {name: model(*args).numpy() for name, args in inputs.items()}
    for dynamo, opset, lowering in [(False, 17, "standard"), (False, 17, "custom"), (True, 18, "standard"),
                                    (True, 18, "custom")]:  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if dynamo:
                dims = tuple({2: torch.export.Dim.DYNAMIC, 3: torch.export.Dim.DYNAMIC} for _ in names)
                proto = opbridge.onnx.export(wrapper, inputs["800x1333"], None, opset_version=opset, dynamo=True,
                                             lowering=lowering, input_names=names, dynamic_shapes=dims)  # fmt: skip
            else:
                axes = {n: {2: f"{n}_h", 3: f"{n}_w"} for n in names}
                proto = opbridge.onnx.export(wrapper, inputs["800x1333"], None, opset_version=opset, dynamo=False,
                                             lowering=lowering, input_names=names, dynamic_axes=axes)  # fmt: skip
        session = opbridge_ort.InferenceSession(proto)
        for size, args in inputs.items():
            feeds = {n: t.numpy() for n, t in zip(names, args, strict=True)}
            start = time.perf_counter()
            (got,) = session.run(None, feeds)
            seconds = time.perf_counter() - start
            error = float(np.abs(got - expected[size]).max())
            print(f"{'dynamo' if dynamo else 'legacy'} opset {opset} {lowering:8} {size:9} S={got.shape[1]:6} "
                  f"max error {error:.2e}  ORT {seconds * 1000:.0f} ms", flush=True)  # fmt: skip
            assert error < 1e-3, error
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
