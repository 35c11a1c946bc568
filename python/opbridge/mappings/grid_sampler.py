"""aten::grid_sampler (``torch.nn.functional.grid_sample``, 4-D) at opsets 11-15, from Gather.

The TorchScript-based exporter has a rule from opset 16 only (ONNX GridSample), yet mmdeploy's default pipeline
exports at opset 11 and Qualcomm's toolchain stops at 12. This rule serves opsets 11-15 (torch's own from 16):
bilinear and nearest, padding zeros, border and reflection, both ``align_corners``; batch and sizes dynamic.

The input goes channels-last and zero-padded (1 before, 2 after) so that a Gather index fetches a pixel's
channels; coordinates are unnormalized, reflected or clipped as the padding mode says (PyTorch's
``grid_sampler_compute_source_index``), then clamped into [-1, size] (NaN to -1), where off-map corners read the
zero padding. Bicubic raises (use opset >= 16), as do 5-D inputs.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import specs
from ..specs import LoweringError

_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
_PADDINGS = {0: "zeros", 1: "border", 2: "reflection"}


def _grid_sampler(b, input, grid, interpolation_mode, padding_mode, align_corners):
    mode = _MODES.get(int(b.value(interpolation_mode, "i")))
    padding = _PADDINGS.get(int(b.value(padding_mode, "i")))
    align = bool(b.value(align_corners, "b"))
    shape = b.static_shape(input)
    if shape is None or len(shape) != 4:
        raise LoweringError(f"grid_sample export below opset 16: only 4-D inputs [N, C, H, W], got shape {shape}")
    if mode not in ("bilinear", "nearest") or padding is None:
        raise LoweringError(f"grid_sample export below opset 16: mode={mode!r} is not supported; export at opset >= 16")
    channels = shape[1]
    if channels is None:
        raise LoweringError("grid_sample export: the channel count of input must be static")
    i64 = b.constant

    def const(value):
        return b.constant_like(value, input)

    def as_float(value):
        return b.op("Cast", value, to=_onnx_float(b, input))

    def dim(value, index):
        return b.op("Gather", b.op("Shape", value), i64([index]), axis=0)  # 1-D, one element

    n_1d, height, width = dim(input, 0), dim(input, 2), dim(input, 3)
    grid_shape = b.op("Shape", grid)
    size_h, size_w = b.op("Reshape", as_float(height), i64([])), b.op("Reshape", as_float(width), i64([]))

    def source(coordinate, size):
        """PyTorch's grid_sampler_compute_source_index, then NaN -> -1 and a clamp into [-1, size]."""
        if align:
            x = b.op("Mul", b.op("Add", coordinate, const(1.0)), b.op("Div", b.op("Sub", size, const(1.0)), const(2.0)))
        else:
            x = b.op("Div", b.op("Sub", b.op("Mul", b.op("Add", coordinate, const(1.0)), size), const(1.0)), const(2.0))
        last = b.op("Sub", size, const(1.0))
        if padding == "reflection":
            low, span = (const(0.0), last) if align else (const(-0.5), size)  # reflect over [low, low + span]
            distance = b.op("Abs", b.op("Sub", x, low))
            safe_span = b.op("Max", span, const(1e-30))  # a 1-pixel map (align_corners) reflects to 0
            flips = b.op("Floor", b.op("Div", distance, safe_span))
            extra = b.op("Sub", distance, b.op("Mul", flips, safe_span))
            odd = b.op("Equal", b.op("Sub", flips, b.op("Mul", b.op("Floor", b.op("Div", flips, const(2.0))),
                                                              const(2.0))), const(1.0))  # fmt: skip
            x = b.op("Add", b.op("Where", odd, b.op("Sub", span, extra), extra), low)
            x = b.op("Where", b.op("Greater", span, const(0.0)), x, b.op("Mul", x, const(0.0)))
        if padding in ("border", "reflection"):
            x = b.op("Max", b.op("Min", x, last), const(0.0))
        x = b.op("Where", b.op("IsNaN", x), const(-1.0), x)
        return b.op("Max", b.op("Min", x, size), const(-1.0))

    gx = b.op("Gather", grid, i64(0), axis=3)  # [N, Ho, Wo]
    gy = b.op("Gather", grid, i64(1), axis=3)
    x, y = source(gx, size_w), source(gy, size_h)
    padded = b.op("Pad", b.op("Transpose", input, perm=[0, 2, 3, 1]), i64([0, 1, 1, 0, 0, 2, 2, 0]))
    rows = b.op("Reshape", padded, i64([-1, channels]))  # (n * (H+3) + y + 1) * (W+3) + x + 1
    padded_w = b.op("Reshape", b.op("Add", width, i64([3])), i64([]))
    padded_h = b.op("Reshape", b.op("Add", height, i64([3])), i64([]))
    first = b.op("Reshape", b.op("Mul", b.iota(b.op("Reshape", n_1d, i64([]))), padded_h), i64([-1, 1, 1]))

    def index(yy, xx):  # float pixel coordinates in [-1, size] -> rows
        iy = b.op("Cast", b.op("Add", yy, const(1.0)), to=7)
        ix = b.op("Cast", b.op("Add", xx, const(1.0)), to=7)
        return b.op("Add", b.op("Mul", b.op("Add", first, iy), padded_w), ix)

    def unsqueeze(value):  # [N, Ho, Wo] -> [N, Ho, Wo, 1]
        return b.op("Unsqueeze", value, i64([3])) if b.opset >= 13 else b.op("Unsqueeze", value, axes=[3])

    if mode == "nearest":
        sampled = b.op("Gather", rows, index(b.op("Round", y), b.op("Round", x)), axis=0)  # Round: half to even
    else:
        x0, y0 = b.op("Floor", x), b.op("Floor", y)
        lx, ly = b.op("Sub", x, x0), b.op("Sub", y, y0)
        hx, hy = b.op("Sub", const(1.0), lx), b.op("Sub", const(1.0), ly)
        top_left = index(y0, x0)
        right, down = i64(1), padded_w
        corners = ((top_left, hy, hx), (b.op("Add", top_left, right), hy, lx), (b.op("Add", top_left, down), ly, hx),
                   (b.op("Add", b.op("Add", top_left, down), right), ly, lx))  # fmt: skip
        terms = [b.op("Mul", b.op("Gather", rows, i, axis=0), unsqueeze(b.op("Mul", wy, wx))) for i, wy, wx in corners]
        sampled = b.op("Sum", *terms)  # [N, Ho, Wo, C]
    out = b.op("Transpose", sampled, perm=[0, 3, 1, 2])
    out_shape = b.op("Concat", n_1d, i64([channels]), b.op("Slice", grid_shape, i64([1]), i64([3]), i64([0])), axis=0)
    return b.op("Reshape", out, out_shape)


def _onnx_float(b, like) -> int:
    import onnx

    return {torch.float32: onnx.TensorProto.FLOAT, torch.float64: onnx.TensorProto.DOUBLE}[b.dtype(like)]


class _GridSample(torch.nn.Module):
    def __init__(self, mode: str, padding_mode: str, align_corners: bool) -> None:
        super().__init__()
        self.options = mode, padding_mode, align_corners

    def forward(self, x, grid):
        mode, padding_mode, align_corners = self.options
        return torch.nn.functional.grid_sample(x, grid, mode=mode, padding_mode=padding_mode,
                                               align_corners=align_corners)  # fmt: skip


def _paths() -> dict:
    return {
        f"{mode}_{padding}{'_aligned' if align else ''}": (
            lambda mode=mode, padding=padding, align=align: _GridSample(mode, padding, align)
        )
        for mode in ("bilinear", "nearest")
        for padding in ("zeros", "border", "reflection")
        for align in (False, True)
    }


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    x = torch.randn(batch, 3, 5, 7, generator=generator, dtype=torch.float64)
    grid = torch.rand(batch, 4, 6, 2, generator=generator, dtype=torch.float64) * 3.2 - 1.6  # beyond [-1, 1] too
    return x.to(dtype), grid.to(dtype)


def _reflect(x, low, high):
    """Reflect x into [low, high] (high > low), as a ball bouncing between the two walls."""
    span = high - low
    d = abs(x - low)
    flips, extra = divmod(d, span)
    return low + (span - extra if int(flips) % 2 else extra)


def _reference(x, grid, path: str = "bilinear_zeros"):
    """grid_sample written from its definition, one output element at a time (numpy)."""
    mode, padding, *aligned = path.split("_")
    align = bool(aligned)
    n, c, h, w = x.shape
    data, g = x.double().numpy(), grid.double().numpy()
    out = np.zeros((n, c, *grid.shape[1:3]))
    for b_, i, j in np.ndindex(n, *grid.shape[1:3]):
        coords = []
        for value, size in ((g[b_, i, j, 0], w), (g[b_, i, j, 1], h)):
            p = (value + 1) / 2 * (size - 1) if align else ((value + 1) * size - 1) / 2
            if padding == "reflection" and np.isfinite(p):
                p = (_reflect(p, 0, size - 1) if size > 1 else 0.0) if align else _reflect(p, -0.5, size - 0.5)
            elif padding == "reflection":
                p = np.nan  # infinitely far: no pixel
            if padding in ("border", "reflection"):
                p = min(max(p, 0), size - 1)
            coords.append(p)
        px, py = coords
        if mode == "nearest":
            taps = [(np.rint(py), np.rint(px), 1.0)]
        else:
            x0, y0 = np.floor(px), np.floor(py)
            taps = [
                (y0 + dy, x0 + dx, (1 - abs(py - y0 - dy)) * (1 - abs(px - x0 - dx))) for dy in (0, 1) for dx in (0, 1)
            ]
        for yy, xx, weight in taps:
            if 0 <= yy < h and 0 <= xx < w:
                out[b_, :, i, j] += weight * data[b_, :, int(yy), int(xx)]
    return torch.from_numpy(out).to(x.dtype)


def _known_gaps(cell) -> str | None:
    if cell.opset < 11:
        return "the Gather rule needs opset >= 11 (Round, Range)"
    if cell.opset >= 16 and cell.dtype == "float64" and cell.opset < 20:
        return "torch's own rule from opset 16 writes GridSample-16, which ONNX Runtime has no float64 kernel of"
    return None


specs.register(
    specs.OpSpec(
        name="grid_sampler",
        torch_op="aten::grid_sampler",
        doc="aten::grid_sampler (grid_sample, 4-D) -> Gather bilinear/nearest at opsets 11-15",
        lowerings=[specs.Lowering("standard", _grid_sampler, min_opset=11, max_opset=15, note="Gather, 4-D")],
        dtypes=(torch.float32, torch.float64),
        call_paths=_paths(),
        sample_inputs=_sample_inputs,
        input_names=("x", "grid"),
        reference=_reference,
        known_gaps=_known_gaps,
    )
)
