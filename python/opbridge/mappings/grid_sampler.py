"""aten::grid_sampler (``torch.nn.functional.grid_sample``) from Gather: 4-D at opsets 11-15, 5-D at 11-19.

The TorchScript-based exporter has a rule from opset 16 only (ONNX GridSample), yet mmdeploy's default pipeline
exports at opset 11 and Qualcomm's toolchain stops at 12; and GridSample is 4-D only before opset 20, so 5-D
(volumetric) inputs fail at 16-19. This rule serves 4-D at opsets 11-15 (torch's own GridSample-16 from 16,
except float64, which ONNX Runtime has no GridSample-16 kernel of) and 5-D at 11-19 (torch's GridSample-20 from
20): bilinear (trilinear in 5-D) and nearest, padding zeros, border and reflection, both ``align_corners``;
batch and sizes dynamic. Nearest with reflection it serves at every opset: ONNX Runtime's GridSample (1.32) rounds a
coordinate exactly halfway between pixels before it reflects it, where torch reflects first (-1.5 samples pixel 1,
torch pixel 0), and half-precision grids hit such ties often.

For the dynamo exporter, whose own rule is one GridSample of any rank at any opset, this rule is that GridSample
too, except for nearest with reflection and for float64 below opset 20 (ONNX Runtime has no GridSample-16 kernel of
it), which it samples with the Gathers, from opset 18 (the exporter builds at 18 and converts down; the Gathers'
Pad-18 does not convert, so an export asked at 16 or 17 keeps torch's GridSample).

The input goes channels-last and zero-padded (1 before, 2 after on every spatial axis) so that a Gather index
fetches a pixel's channels; coordinates are unnormalized, reflected or clipped as the padding mode says
(PyTorch's ``grid_sampler_compute_source_index``), then clamped into [-1, size] (NaN to -1), where off-map
corners read the zero padding. Bicubic raises here (it needs 4-D and opset >= 16).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from .. import specs
from ..onnx.builder import ONNX_TYPES
from ..specs import LoweringError, UnknownToExporter

_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
_PADDINGS = {0: "zeros", 1: "border", 2: "reflection"}


def _grid_sampler(b, input, grid, interpolation_mode, padding_mode, align_corners):
    mode = _MODES.get(int(b.value(interpolation_mode, "i")))
    padding = _PADDINGS.get(int(b.value(padding_mode, "i")))
    align = bool(b.value(align_corners, "b"))
    shape = b.static_shape(input)
    if shape is None:
        raise UnknownToExporter("grid_sample export: the exporter does not know the rank of input (4-D or 5-D)")
    if len(shape) not in (4, 5):
        raise LoweringError(f"grid_sample export: input must be 4-D [N, C, H, W] or 5-D [N, C, D, H, W], got {shape}")
    # Eager torch requires one dtype for both; the TorchScript exporter may type the grid float64 or not know it
    # (transformers' Deformable DETR: reference points from traced sizes), and ONNX Runtime's GridSample refuses a
    # float64 grid for a float32 input: the grid takes the input's dtype.
    try:
        target = b.dtype(input)
    except UnknownToExporter:
        target = None
    if target is not None:
        try:
            known = b.dtype(grid, "grid")
        except UnknownToExporter:
            known = None
        if known != target:
            grid = b.op("Cast", grid, to=ONNX_TYPES[target])
    ties_wrong = mode == "nearest" and padding == "reflection"
    float64 = target == torch.float64
    if b.exporter == "dynamo":
        # torch's dynamo rule is one GridSample, any rank: so is this one, except where the Gathers give the right
        # result and GridSample does not (nearest with reflection; float64 below opset 20, which ONNX Runtime has
        # no GridSample-16 kernel of). Bicubic, and modes the Gathers do not serve, stay GridSample.
        # Not for an export asked below opset 18: the Gathers' Pad-18 could not be converted down to it.
        gathers = mode in ("bilinear", "nearest") and padding is not None and b.target_opset >= 18
        gathers = gathers and (ties_wrong or (float64 and b.opset < 20))
        if not gathers:
            names = {"bilinear": "linear", "bicubic": "cubic"} if b.opset >= 20 else {}
            return b.op("GridSample", input, grid, align_corners=int(align), mode=names.get(mode, mode),
                        padding_mode=padding)  # fmt: skip
    elif not ties_wrong and ((b.opset >= 16 and len(shape) == 4 and not float64) or b.opset >= 20):
        # TorchScript-based exporter: torch's own rule (ONNX GridSample) serves 4-D from opset 16 and 5-D from 20;
        # not float64 below 20, which ONNX Runtime has no GridSample-16 kernel of (this rule's Gathers run in
        # float64); never nearest with reflection, where ONNX Runtime's GridSample (1.32) rounds a coordinate
        # halfway between pixels before it reflects it (torch reflects, then rounds half to even): -1.5 samples
        # pixel 1 where torch samples 0, and half grids hit such ties often.
        from ..onnx import _torch_hooks

        builtin = _torch_hooks.legacy_builtin_symbolic("aten::grid_sampler", b.opset)
        if builtin is None:
            raise LoweringError(f"grid_sample export: torch has no rule at opset {b.opset}")
        return builtin(b.g, input, grid, interpolation_mode, padding_mode, align_corners)
    if mode not in ("bilinear", "nearest") or padding is None:
        raise LoweringError(f"grid_sample export at opset {b.opset}: mode={mode!r} is not supported here; "
                            "bicubic needs 4-D inputs and opset >= 16")  # fmt: skip
    spatial = len(shape) - 2  # 2: (H, W); 3: (D, H, W)
    i64 = b.constant

    def const(value):
        return b.constant_like(value, input)

    def as_float(value):
        return b.op("Cast", value, to=_onnx_float(b, input))

    def dim(value, index):
        return b.op("Gather", b.op("Shape", value), i64([index]), axis=0)  # 1-D, one element

    n_1d, channels = dim(input, 0), dim(input, 1)
    sizes = [dim(input, 2 + k) for k in range(spatial)]  # outermost first: (D,) H, W
    grid_shape = b.op("Shape", grid)

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

    # The grid's last axis is (x, y[, z]): innermost spatial axis first.
    coords = [
        source(b.op("Gather", grid, i64(spatial - 1 - k), axis=spatial + 1), b.op("Reshape", as_float(size), i64([])))
        for k, size in enumerate(sizes)
    ]  # outermost first, each [N, *out]
    perm = [0, *range(2, spatial + 2), 1]  # channels last
    pads = [0] + [1] * spatial + [0] + [0] + [2] * spatial + [0]
    padded = b.op("Pad", b.op("Transpose", input, perm=perm), i64(pads))
    rows = b.op("Reshape", padded, b.op("Concat", i64([-1]), channels, axis=0))
    padded_sizes = [b.op("Reshape", b.op("Add", size, i64([3])), i64([])) for size in sizes]
    strides = [None] * spatial  # rows between neighbours along each spatial axis
    stride = i64(1)
    for k in reversed(range(spatial)):
        strides[k] = stride
        stride = b.op("Mul", stride, padded_sizes[k])
    first = b.op("Reshape", b.op("Mul", b.iota(b.op("Reshape", n_1d, i64([]))), stride), i64([-1] + [1] * spatial))

    def index(points):  # float pixel coordinates in [-1, size], outermost first -> rows of the padded map
        total = first
        for point, step in zip(points, strides, strict=True):
            total = b.op("Add", total, b.op("Mul", b.op("Cast", b.op("Add", point, const(1.0)), to=7), step))
        return total

    def unsqueeze(value):  # [N, *out] -> [N, *out, 1]
        return b.unsqueeze(value, spatial + 1)

    if mode == "nearest":
        sampled = b.op("Gather", rows, index([b.op("Round", c) for c in coords]), axis=0)  # Round: half to even
    else:
        lows = [b.op("Floor", c) for c in coords]
        fractions = [b.op("Sub", c, low) for c, low in zip(coords, lows, strict=True)]
        weights = [(b.op("Sub", const(1.0), f), f) for f in fractions]  # (weight of low, of high)
        base = index(lows)
        terms = []
        for corner in itertools.product((0, 1), repeat=spatial):
            rows_at = base
            weight = None
            for k, high in enumerate(corner):
                if high:
                    rows_at = b.op("Add", rows_at, strides[k])
                weight = weights[k][high] if weight is None else b.op("Mul", weight, weights[k][high])
            terms.append(b.op("Mul", b.op("Gather", rows, rows_at, axis=0), unsqueeze(weight)))
        sampled = b.op("Sum", *terms)  # [N, *out, C]
    out = b.op("Transpose", sampled, perm=[0, spatial + 1, *range(1, spatial + 1)])
    out_sizes = b.op("Slice", grid_shape, i64([1]), i64([spatial + 1]), i64([0]))
    return b.op("Reshape", out, b.op("Concat", n_1d, channels, out_sizes, axis=0))


def _onnx_float(b, like) -> int:
    return ONNX_TYPES[b.dtype(like)]


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
    """``operands``: "4d" (N, C, H, W) or "5d" (N, C, D, H, W); grid points up to 1.6 beyond [-1, 1]."""
    generator = torch.Generator().manual_seed(batch)
    sizes, out = ((5, 7), (4, 6)) if operands == "4d" else ((3, 4, 5), (2, 3, 4))
    x = torch.randn(batch, 3, *sizes, generator=generator, dtype=torch.float64)
    grid = torch.rand(batch, *out, len(sizes), generator=generator, dtype=torch.float64) * 3.2 - 1.6
    return x.to(dtype), grid.to(dtype)


def _reflect(x, low, high):
    """Reflect x into [low, high] (high > low), as a ball bouncing between the two walls."""
    span = high - low
    d = abs(x - low)
    flips, extra = divmod(d, span)
    return low + (span - extra if int(flips) % 2 else extra)


def _reference(x, grid, path: str = "bilinear_zeros"):
    """grid_sample written from its definition, one output element at a time (numpy), 4-D or 5-D."""
    mode, padding, *aligned = path.split("_")
    align = bool(aligned)
    sizes = x.shape[2:]  # outermost first
    spatial = len(sizes)
    data, g = x.double().numpy(), grid.double().numpy()
    out = np.zeros((x.shape[0], x.shape[1], *grid.shape[1:-1]))
    for position in np.ndindex(x.shape[0], *grid.shape[1:-1]):
        coords = []
        for k, size in enumerate(sizes):
            value = g[position][spatial - 1 - k]  # the grid lists x (innermost) first
            p = (value + 1) / 2 * (size - 1) if align else ((value + 1) * size - 1) / 2
            if padding == "reflection" and np.isfinite(p):
                p = (_reflect(p, 0, size - 1) if size > 1 else 0.0) if align else _reflect(p, -0.5, size - 0.5)
            elif padding == "reflection":
                p = np.nan  # infinitely far: no pixel
            if padding in ("border", "reflection"):
                p = min(max(p, 0), size - 1)
            coords.append(p)
        if mode == "nearest":
            taps = [(tuple(np.rint(c) for c in coords), 1.0)]
        else:
            lows = [np.floor(c) for c in coords]
            taps = []
            for corner in itertools.product((0, 1), repeat=spatial):
                point = tuple(low + d for low, d in zip(lows, corner, strict=True))
                weight = np.prod([1 - abs(c - p) for c, p in zip(coords, point, strict=True)])
                taps.append((point, weight))
        for point, weight in taps:
            if all(0 <= p < size for p, size in zip(point, sizes, strict=True)):
                out[(position[0], slice(None), *position[1:])] += (
                    weight * data[(position[0], slice(None), *(int(p) for p in point))]
                )
    return torch.from_numpy(out).to(x.dtype)


def _known_gaps(cell) -> str | None:
    if cell.opset < 11:
        return "the Gather rule needs opset >= 11 (Round, Range)"
    return None


specs.register(
    specs.OpSpec(
        name="grid_sampler",
        torch_op="aten::grid_sampler",
        doc="aten::grid_sampler (grid_sample) -> Gather bilinear/nearest: 4-D at opsets 11-15, 5-D at 11-19, "
        "nearest with reflection at every opset (ONNX Runtime's GridSample breaks its ties otherwise than torch), "
        "float64 below 20; GridSample elsewhere, as torch's rules",
        lowerings=[
            specs.Lowering(
                "standard",
                # float16/bfloat16 sampled in float32 and rounded once: the Gather decomposition in half arithmetic
                # rounds at every node (10x the error), and ONNX Runtime's GridSample has no float16 CUDA kernel
                specs.half_storage(_grid_sampler),
                min_opset=11,
                note="Gather; GridSample for 4-D from 16 (float64: from 20) and 5-D from 20 (dynamo: 18), except "
                "nearest with reflection",
            )
        ],
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths=_paths(),
        sample_inputs=_sample_inputs,
        operand_kinds=("4d", "5d"),
        input_names=("x", "grid"),
        reference=_reference,
        known_gaps=_known_gaps,
        # torch's dynamo rule (GridSample) samples nearest-with-reflection ties wrong in ONNX Runtime, and float64
        # below opset 20 does not run there
        dynamo_overrides_torch=True,
    )
)
