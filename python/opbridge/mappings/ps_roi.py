"""torchvision::ps_roi_align and torchvision::ps_roi_pool (position-sensitive RoI pooling, R-FCN) -> standard ONNX.

Neither exporter has a rule for them (torch 2.14.1 / torchvision 0.29.1). Both ops return (output,
channel_mapping); output bin (ph, pw) of output channel c reads input channel (c * PH + ph) * PW + pw, and
channel_mapping holds that index (int32), which the rules compute exactly.

* ps_roi_align (opset >= 16): torchvision samples each bin like roi_align with ``aligned=True`` (boxes shifted by
  half a pixel, no minimum size) and averages; RoiAlign-16 in half_pixel mode does that for every input channel,
  and the position-sensitive channel of each bin is then picked out (a [P, P] identity mask and a sum over
  the group, P = PH * PW). RoiAlign computes P times the bins needed; no exporter rule exists to compare with.
* ps_roi_pool (opset >= 11): torchvision's integer bins (box corners rounded half away from zero, sizes of at
  least one pixel, floor/ceil bin edges, clipped to [0, size - 1] as torchvision's forward does) averaged
  through an integral image (float64 cumulative sums: four gathers per bin whatever its size), 0 for an
  empty bin.
"""

from __future__ import annotations

import math

import torch

from .. import specs
from ..onnx.builder import ONNX_TYPES
from ..specs import LoweringError
from . import roi_align, roi_pool

_DOUBLE, _INT64, _INT32 = (ONNX_TYPES[t] for t in (torch.float64, torch.int64, torch.int32))
_ELEMENT = ONNX_TYPES


def _geometry(b, input, pooled_height, pooled_width, op: str):
    """(PH, PW, C_out): C_out a 1-D int64 tensor, C / (PH * PW), read at run time where the exporter does not
    know the input's channel count."""
    height, width = int(b.value(pooled_height, "i")), int(b.value(pooled_width, "i"))
    shape = b.static_shape(input)
    channels = shape[1] if shape is not None and len(shape) == 4 else None
    if channels is None:
        channels_in = b.op("Gather", b.op("Shape", input), b.constant([1]), axis=0)
        return height, width, b.op("Div", channels_in, b.constant([height * width]))
    if channels % (height * width):
        raise LoweringError(f"torchvision::{op}: input channels ({channels}) must be a multiple of "
                            f"pooled height * width ({height} * {width})")  # fmt: skip
    return height, width, b.constant([channels // (height * width)])


def _shape(b, *parts):
    """A shape from ints and 1-D int64 tensors."""
    return b.op("Concat", *(b.constant([p]) if isinstance(p, int) else p for p in parts), axis=0)


def _count(b, channels_out, *factors: int):
    """C_out * factors as a scalar int64 tensor (a Range limit)."""
    return b.op("Reshape", b.op("Mul", channels_out, b.constant([math.prod(factors)])), b.constant([]))


def _channel_mapping(b, rois, height: int, width: int, channels_out):
    """channel_mapping [R, C_out, PH, PW] (int32): (c * PH + ph) * PW + pw."""
    pattern = b.op("Reshape", b.op("Range", b.constant(0), _count(b, channels_out, height, width), b.constant(1)),
                   _shape(b, 1, channels_out, height, width))  # fmt: skip
    rois_count = b.op("Slice", b.op("Shape", rois), b.constant([0]), b.constant([1]))
    shape = _shape(b, rois_count, channels_out, height, width)
    return b.op("Cast", b.op("Expand", pattern, shape), to=_INT32)


def _ps_roi_align(b, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio):
    height, width, channels_out = _geometry(b, input, pooled_height, pooled_width, "ps_roi_align")
    group = height * width
    batch = b.op("Cast", b.op("Gather", rois, b.constant(0), axis=1), to=_INT64)
    boxes = b.op("Gather", rois, b.constant([1, 2, 3, 4]), axis=1)
    pooled = b.op("RoiAlign", input, boxes, batch, coordinate_transformation_mode="half_pixel", mode="avg",
                  output_height=height, output_width=width, spatial_scale=float(b.value(spatial_scale, "f")),
                  sampling_ratio=max(int(b.value(sampling_ratio, "i")), 0))  # fmt: skip
    # [R, C_out, group (input channel within the group), group (bin)]: keep the diagonal.
    grouped = b.op("Reshape", pooled, _shape(b, -1, channels_out, group, group))
    zeros = b.op("ConstantOfShape", b.constant([group, group]))
    mask = b.op("Cast", b.op("EyeLike", zeros), to=_ELEMENT[b.dtype(input)])
    picked = b.op("ReduceSum", b.op("Mul", grouped, mask), b.constant([2]), keepdims=0)
    output = b.op("Reshape", picked, _shape(b, -1, channels_out, height, width))
    return output, _channel_mapping(b, rois, height, width, channels_out)


def _round_half_away(b, value, like):
    """C's round(): halves away from zero (ONNX Round goes to even)."""
    half = b.constant_like(0.5, like)
    return b.op("Mul", b.op("Sign", value), b.op("Floor", b.op("Add", b.op("Abs", value), half)))


def _edges(b, start, end, bins: int, size, like):
    """torchvision's bin edges along one axis: (first, last) [R, bins] as int64, clipped to [0, size - 1]."""
    one = b.constant_like(1.0, like)
    extent = b.op("Max", b.op("Sub", end, start), one)
    bin_size = b.op("Div", extent, b.constant_like(float(bins), like))
    steps = b.op("Cast", b.op("Range", b.constant(0), b.constant(bins), b.constant(1)), to=_ELEMENT[b.dtype(like)])
    steps = b.op("Reshape", steps, b.constant([1, bins]))
    first = b.op("Add", b.op("Floor", b.op("Mul", steps, bin_size)), start)
    last = b.op("Add", b.op("Ceil", b.op("Mul", b.op("Add", steps, one), bin_size)), start)
    top = b.op("Sub", size, one)

    def clip(edge):
        return b.op("Cast", b.op("Max", b.op("Min", edge, top), b.constant_like(0.0, like)), to=_INT64)

    return clip(first), clip(last)


def _ps_roi_pool(b, input, rois, spatial_scale, pooled_height, pooled_width):
    height, width, channels_out = _geometry(b, input, pooled_height, pooled_width, "ps_roi_pool")
    element = _ELEMENT[b.dtype(input)]
    scale = b.constant_like(float(b.value(spatial_scale, "f")), rois)
    corners = _round_half_away(b, b.op("Mul", b.op("Gather", rois, b.constant([1, 2, 3, 4]), axis=1), scale), rois)

    def column(k):
        return b.op("Gather", corners, b.constant([k]), axis=1)  # [R, 1]

    shape = b.op("Shape", input)
    map_height = b.op("Cast", b.op("Gather", shape, b.constant(2)), to=element)
    map_width = b.op("Cast", b.op("Gather", shape, b.constant(3)), to=element)
    h_first, h_last = _edges(b, column(1), column(3), height, map_height, rois)
    w_first, w_last = _edges(b, column(0), column(2), width, map_width, rois)
    # Integral image with a zero first row and column, flattened: sum of x[:h, :w] at (h, w).
    integral = b.op("CumSum", b.op("CumSum", b.op("Cast", input, to=_DOUBLE), b.constant(2)), b.constant(3))
    integral = b.op("Pad", integral, b.constant([0, 0, 1, 1, 0, 0, 0, 0]))
    flat = b.op("Reshape", integral, b.constant([-1]))
    row = b.op("Add", b.op("Gather", shape, b.constant([3])), b.constant([1]))  # W + 1, [1]
    plane = b.op("Mul", b.op("Add", b.op("Gather", shape, b.constant([2])), b.constant([1])), row)  # (H+1)(W+1)
    channels = b.op("Gather", shape, b.constant([1]))
    batch = b.op("Cast", b.op("Gather", rois, b.constant([0]), axis=1), to=_INT64)  # [R, 1], truncated as torch
    channel_in = b.op("Reshape", b.op("Range", b.constant(0), _count(b, channels_out, height, width),
                                      b.constant(1)), _shape(b, 1, channels_out, height, width))  # fmt: skip
    base = b.op("Mul", b.op("Add", b.op("Mul", b.op("Reshape", batch, b.constant([-1, 1, 1, 1])), channels),
                            channel_in), plane)  # fmt: skip

    def at(h, w):  # h [R, PH], w [R, PW] -> integral values [R, C_out, PH, PW]
        h = b.op("Reshape", h, b.constant([-1, 1, height, 1]))
        w = b.op("Reshape", w, b.constant([-1, 1, 1, width]))
        return b.op("Gather", flat, b.op("Add", base, b.op("Add", b.op("Mul", h, row), w)))

    total = b.op("Add", b.op("Sub", b.op("Sub", at(h_last, w_last), at(h_first, w_last)), at(h_last, w_first)),
                 at(h_first, w_first))  # fmt: skip
    area = b.op("Mul", b.op("Reshape", b.op("Sub", h_last, h_first), b.constant([-1, 1, height, 1])),
                b.op("Reshape", b.op("Sub", w_last, w_first), b.constant([-1, 1, 1, width])))  # fmt: skip
    mean = b.op("Div", total, b.op("Cast", area, to=_DOUBLE))  # NaN where empty: replaced by 0 below
    zero = b.op("Cast", b.constant(0), to=_DOUBLE)
    output = b.op("Cast", b.op("Where", b.op("Greater", area, b.constant(0)), mean, zero), to=element)
    return output, _channel_mapping(b, rois, height, width, channels_out)


# --- tests: call paths, samples, references -------------------------------------------------------------------


class _PsRoiAlign(torch.nn.Module):
    def __init__(self, output_size, spatial_scale: float, sampling_ratio: int) -> None:
        super().__init__()
        self.arguments = (output_size, spatial_scale, sampling_ratio)

    def forward(self, x, rois):
        import torchvision

        return torchvision.ops.ps_roi_align(x, rois, *self.arguments)


class _PsRoiPool(torch.nn.Module):
    def __init__(self, output_size, spatial_scale: float) -> None:
        super().__init__()
        self.arguments = (output_size, spatial_scale)

    def forward(self, x, rois):
        import torchvision

        return torchvision.ops.ps_roi_pool(x, rois, *self.arguments)


_ALIGN_PATHS = {"fixed": ((3, 2), 0.5, 2), "adaptive": ((2, 2), 1.0, -1)}
_POOL_PATHS = {"scale_half": ((3, 2), 0.5), "scale_one": ((2, 2), 1.0)}


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    return roi_pool.sample_inputs(dtype, operands, batch, channels=2 * 3 * 2)  # C_out * PH * PW for every path


def _ps_roi_align_reference(x, rois, path: str = "fixed"):
    """ps_roi_align from torchvision's definition, one bin and sample at a time."""
    (pooled_h, pooled_w), scale, sampling_ratio = _ALIGN_PATHS[path]
    channels_out = x.shape[1] // (pooled_h * pooled_w)
    data = x.double()
    out = torch.zeros(len(rois), channels_out, pooled_h, pooled_w, dtype=torch.float64)
    for r, (index, x1, y1, x2, y2) in enumerate(rois.double().tolist()):
        start_w, start_h = x1 * scale - 0.5, y1 * scale - 0.5
        roi_w, roi_h = x2 * scale - 0.5 - start_w, y2 * scale - 0.5 - start_h
        bin_h, bin_w = roi_h / pooled_h, roi_w / pooled_w
        grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_h / pooled_h)
        grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_w / pooled_w)
        for ph in range(pooled_h):
            for pw in range(pooled_w):
                channels = [(c * pooled_h + ph) * pooled_w + pw for c in range(channels_out)]
                total = torch.zeros(channels_out, dtype=torch.float64)
                for iy in range(grid_h):
                    for ix in range(grid_w):
                        y = start_h + ph * bin_h + (iy + 0.5) * bin_h / grid_h
                        xx = start_w + pw * bin_w + (ix + 0.5) * bin_w / grid_w
                        total += roi_align._bilinear(data[int(index)][channels], y, xx)
                out[r, :, ph, pw] = total / (grid_h * grid_w)
    return out.to(x.dtype)


def _ps_roi_pool_reference(x, rois, path: str = "scale_half"):
    """ps_roi_pool from torchvision's definition: the mean of each integer bin, 0 for an empty one."""
    pooled, scale = _POOL_PATHS[path]
    channels_out = x.shape[1] // (pooled[0] * pooled[1])
    height, width = x.shape[-2:]
    out = torch.zeros(len(rois), channels_out, *pooled, dtype=torch.float64)
    for r, (index, *box) in enumerate(rois.double().tolist()):
        for (ph, pw), (hs, he, ws, we) in roi_pool.pool_windows(box, scale, pooled, height, width, 0, True).items():
            if he > hs and we > ws:
                channels = [(c * pooled[0] + ph) * pooled[1] + pw for c in range(channels_out)]
                out[r, :, ph, pw] = x[int(index)][channels, hs:he, ws:we].double().mean(dim=(-2, -1))
    return out.to(x.dtype)


def _align_gaps(cell) -> str | None:
    if cell.opset < 16:
        return "needs RoiAlign's half_pixel mode (opset >= 16); the export raises below that"
    return specs.ORT_NO_OPSET22_ROI_KERNELS if cell.opset >= 22 else None


def _lowering(build, min_opset: int, note: str) -> specs.Lowering:
    """Half inputs pooled in float32 and rounded once; the channel mapping (int64) stays."""
    return specs.Lowering(
        "standard", specs.half_storage(build, floating_output=(True, False)), min_opset=min_opset, note=note
    )


specs.register(
    specs.OpSpec(
        name="torchvision.ps_roi_align",
        torch_op="torchvision::ps_roi_align",
        doc="torchvision::ps_roi_align -> RoiAlign (half_pixel) and a position-sensitive channel pick",
        lowerings=[_lowering(_ps_roi_align, 16, "RoiAlign-16, Mul, ReduceSum")],
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths={name: (lambda a=a: _PsRoiAlign(*a)) for name, a in _ALIGN_PATHS.items()},
        sample_inputs=_sample_inputs,
        input_names=("x", "rois"),
        reference=_ps_roi_align_reference,
        known_gaps=_align_gaps,
        available=specs.torchvision_op_loads("ps_roi_align"),
        dynamo_overrides_torch=True,  # torch has no dynamo rule
    )
)

specs.register(
    specs.OpSpec(
        name="torchvision.ps_roi_pool",
        torch_op="torchvision::ps_roi_pool",
        doc="torchvision::ps_roi_pool -> integer bins averaged through an integral image (CumSum, Gather)",
        lowerings=[_lowering(_ps_roi_pool, 11, "CumSum, Gather")],
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths={name: (lambda a=a: _PsRoiPool(*a)) for name, a in _POOL_PATHS.items()},
        sample_inputs=_sample_inputs,
        input_names=("x", "rois"),
        reference=_ps_roi_pool_reference,
        available=specs.torchvision_op_loads("ps_roi_pool"),
        dynamo_overrides_torch=True,  # torch has no dynamo rule
    )
)
