"""RoIAlign over rotated regions: opbridge::roi_align_rotated (mmcv's ``roi_align_rotated``), differentiable in its
input.

The op's pieces, each named after it: the kernel (cpp/kernels/roi_align_rotated.h: forward and backward), its
schema and CPU adapters (cpp/torch/roi_align_rotated.cpp), its CUDA adapters (cpp/cuda/roi_align_rotated.cu), its ORT
adapter (cpp/ort/roi_align_rotated.cc:
``opbridge::RoiAlignRotated``, and ``mmcv::MMCVRoIAlignRotated`` / ``mmdeploy::MMCVRoIAlignRotated``, the nodes
mmcv's and mmdeploy's exporters write), and this module.

Lowerings: ``custom``, one ``opbridge::RoiAlignRotated`` node (any opset); ``standard`` (opset >= 11), bilinear
sampling from Gather: every roi's sample points (the adaptive grid of ``sampling_ratio=0`` is padded to the largest
roi's and masked), four corner rows of channels-last features per point.
"""

from __future__ import annotations

import math
from typing import Union

import torch
from torch import Tensor

from .. import _autocast, _checks, specs

__all__ = ["roi_align_rotated"]
NN_MODULES = ["RoIAlignRotated"]

_OP = "opbridge.roi_align_rotated"
IntPair = Union[int, tuple[int, int], list[int]]  # noqa: UP007  (TorchScript reads typing.Union, not |)


def _size(value: IntPair) -> list[int]:
    """An int or a pair as a list of two (TorchScript-compatible: each refined type spelled out)."""
    if isinstance(value, int):
        return [value, value]
    if isinstance(value, list):
        return [value[0], value[1]]
    return [value[0], value[1]]


def roi_align_rotated(
    input: Tensor,
    rois: Tensor,
    output_size: IntPair,
    spatial_scale: float = 1.0,
    sampling_ratio: int = 0,
    aligned: bool = True,
    clockwise: bool = False,
) -> Tensor:
    """RoIAlign over rotated boxes: mmcv's ``roi_align_rotated``.

    Args:
        input: ``[N, C, H, W]`` features.
        rois: ``[K, 6]`` = ``(batch index, cx, cy, w, h, angle)`` in image coordinates, angle in radians;
            the batch index an integer in ``[0, N)``.
        output_size: ``int`` or ``(height, width)`` of each roi's output.
        spatial_scale: feature pixels per image pixel (1 / the feature stride), > 0.
        sampling_ratio: bilinear samples per bin along each axis; ``<= 0``: adaptive, ``ceil(roi size / output
            size)``.
        aligned: shift the roi by half a pixel (the pixel model of RoIAlign v2, detectron2's ``ROIAlignRotated``);
            ``False`` is mmcv's legacy mode, where a roi is at least one feature pixel wide and high.
        clockwise: whether a positive angle turns the box clockwise in image coordinates (y down); mmcv's default
            is counter-clockwise. detectron2's rois (degrees, counter-clockwise, always aligned):
            ``roi_align_rotated(x, rois_in_radians, size, scale, ratio, aligned=True, clockwise=False)``.

    Returns:
        ``[K, C, output height, output width]`` of the input's dtype. A sample beyond one pixel outside the map
        reads 0 (mmcv's bilinear rule); a roi with a NaN or infinite number gives NaN.

    Raises:
        TypeError: input or rois is not a tensor, output_size not an int or a pair of ints.
        ValueError: an output size below 1, or a spatial_scale that is not a positive finite number.
        RuntimeError: shapes disagree, dtypes are not float32/float64/float16/bfloat16 or do not pair, a batch
            index is not an integer in [0, N), or the tensors are on different devices.

    Runs on the CPU and on CUDA (the same double-precision sample positions). The rois are checked on the host:
    on CUDA each call copies them there once (a wrong batch index is a RuntimeError, not a read out of bounds;
    that copy keeps the op out of CUDA graphs). Differentiable in ``input`` (deterministic backward on the CPU;
    on CUDA the gradient is added with atomics, see ``torch.use_deterministic_algorithms``; rois get no
    gradient, as in mmcv). Exports to one
    ``opbridge::RoiAlignRotated`` node or to standard ops (opset >= 11; see :mod:`opbridge.onnx`).
    """
    if not torch.jit.is_scripting():
        _checks.tensor(_OP, "input", input)
        _checks.tensor(_OP, "rois", rois)
        output_size = _checks.int_pair(_OP, "output_size", output_size, minimum=1)
        if isinstance(spatial_scale, bool) or not isinstance(spatial_scale, (int, float)):
            raise TypeError(f"{_OP}: spatial_scale must be a number, got {type(spatial_scale).__name__}")
        # Comparisons, not math.isfinite: torch.compile traces them on a symbolic float (dynamic=True), where
        # math.isfinite broke the graph. NaN fails both.
        if not (0 < spatial_scale < math.inf):
            raise ValueError(f"{_OP}: spatial_scale must be a positive finite number, got {spatial_scale}")
    size = _size(output_size)
    return torch.ops.opbridge.roi_align_rotated(
        input, rois, size[0], size[1], float(spatial_scale), int(sampling_ratio), bool(aligned), bool(clockwise)
    )


@torch.library.register_fake("opbridge::roi_align_rotated")
def _roi_align_rotated_fake(
    input, rois, pooled_height, pooled_width, spatial_scale=1.0, sampling_ratio=0, aligned=True, clockwise=False
):
    # Defaults as in the schema: tracers drop trailing arguments left at their defaults.
    op = "opbridge::roi_align_rotated"
    _checks.one_device(op, input=input, rois=rois)
    torch._check(
        input.dim() == 4 and rois.dim() == 2 and rois.shape[1] == 6,
        lambda: f"{op}: input must be [N, C, H, W] and rois [K, 6], got {tuple(input.shape)} and {tuple(rois.shape)}",
    )
    _checks.float_storage(op, "input", input)
    _checks.same_dtype(op, "input", input, "rois", rois, precise=True)
    return input.new_empty((rois.shape[0], input.shape[1], pooled_height, pooled_width))


AUTOCAST = _autocast.Rule("float32", like=0)  # torchvision's roi_align rule
_autocast.register("opbridge::roi_align_rotated", AUTOCAST)


@torch.library.register_fake("opbridge::roi_align_rotated_backward")
def _roi_align_rotated_backward_fake(
    grad_output, input, rois, pooled_height, pooled_width, spatial_scale, sampling_ratio, aligned, clockwise
):
    _checks.one_device("opbridge::roi_align_rotated_backward", grad_output=grad_output, input=input, rois=rois)
    return torch.empty_like(input, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output) -> None:
    input, rois, *attributes = inputs
    ctx.save_for_backward(input, rois)
    ctx.attributes = attributes


def _backward(ctx, grad: Tensor):
    input, rois = ctx.saved_tensors
    grad_input = None
    if ctx.needs_input_grad[0]:
        _checks.alert_not_deterministic("opbridge::roi_align_rotated_backward", input)
        grad_input = torch.ops.opbridge.roi_align_rotated_backward(grad, input, rois, *ctx.attributes)
    return (grad_input, None, None, None, None, None, None, None)


torch.library.register_autograd("opbridge::roi_align_rotated", _backward, setup_context=_setup_context)


def _no_double_backward(ctx, *grads):
    raise RuntimeError(
        "opbridge::roi_align_rotated: gradients of its gradients (double backward) are not supported; leave "
        "create_graph=False"
    )


torch.library.register_autograd(
    "opbridge::roi_align_rotated_backward", _no_double_backward, setup_context=lambda ctx, inputs, output: None
)


class RoIAlignRotated(torch.nn.Module):
    """mmcv's ``RoIAlignRotated`` over :func:`opbridge.roi_align_rotated`: the same arguments and defaults, and
    mmcv's deprecated names ``out_size`` (for ``output_size``) and ``sample_num`` (for ``sampling_ratio``) that
    mmrotate's configs use. ``forward(input, rois)``. Scriptable.
    """

    def __init__(
        self,
        output_size: IntPair | None = None,
        spatial_scale: float | None = None,
        sampling_ratio: int = 0,
        aligned: bool = True,
        clockwise: bool = False,
        *,
        out_size: IntPair | None = None,
        sample_num: int | None = None,
    ) -> None:
        super().__init__()
        op = "opbridge.nn.RoIAlignRotated"
        if out_size is not None:
            if output_size is not None:
                raise TypeError(f"{op}: pass output_size or its old name out_size, not both")
            output_size = out_size
        if sample_num is not None:
            sampling_ratio = sample_num
        if output_size is None or spatial_scale is None:
            raise TypeError(f"{op}: output_size and spatial_scale are required")
        self.output_size = tuple(_checks.int_pair(op, "output_size", output_size, minimum=1))
        if not (math.isfinite(float(spatial_scale)) and spatial_scale > 0):
            raise ValueError(f"{op}: spatial_scale must be a positive finite number, got {spatial_scale}")
        self.spatial_scale = float(spatial_scale)
        self.sampling_ratio, self.aligned, self.clockwise = int(sampling_ratio), bool(aligned), bool(clockwise)

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        return roi_align_rotated(
            input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned, self.clockwise
        )

    def extra_repr(self) -> str:
        return (
            f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, sampling_ratio="
            f"{self.sampling_ratio}, aligned={self.aligned}, clockwise={self.clockwise}"
        )


# --- ONNX ------------------------------------------------------------------------------------------------------------


def _attributes(b, pooled_height, pooled_width, spatial_scale, sampling_ratio, aligned, clockwise) -> dict:
    return {
        "output_height": int(b.value(pooled_height, "i")),
        "output_width": int(b.value(pooled_width, "i")),
        "spatial_scale": float(b.value(spatial_scale, "f")),
        "sampling_ratio": int(b.value(sampling_ratio, "i")),
        "aligned": int(bool(b.value(aligned, "b"))),
        "clockwise": int(bool(b.value(clockwise, "b"))),
    }


def _custom(
    b, input, rois, pooled_height, pooled_width, spatial_scale=1.0, sampling_ratio=0, aligned=True, clockwise=False
):
    # Defaults as in the schema: the dynamo exporter drops trailing arguments left at their defaults.
    a = _attributes(b, pooled_height, pooled_width, spatial_scale, sampling_ratio, aligned, clockwise)
    out = b.op("RoiAlignRotated", input, rois, domain=specs.CUSTOM_DOMAIN, **a)
    x, r = b.static_shape(input), b.static_shape(rois)
    b.set_type(
        out, input, [r[0] if r else None, x[1] if x and len(x) == 4 else None, a["output_height"], a["output_width"]]
    )
    return out


class Bilinear:
    """mmcv's bilinear sampling (0 beyond one pixel outside, clamped onto the map inside that margin) from standard
    ops: a map's channels-last rows ``[N * H * W, C]`` read at float positions. Shared with
    rotated_feature_align's lowering."""

    def __init__(self, b, features):
        self.b, self.like = b, features
        i64 = b.constant
        shape = b.op("Shape", features)
        self.height, self.width = (b.op("Gather", shape, i64(i), axis=0) for i in (2, 3))  # scalars
        self.height_f, self.width_f = (self.cast(v) for v in (self.height, self.width))
        channels = b.op("Gather", shape, i64([1]), axis=0)
        self.rows = b.op(
            "Reshape", b.op("Transpose", features, perm=[0, 2, 3, 1]), b.op("Concat", i64([-1]), channels, axis=0)
        )

    def const(self, value: float):
        return self.b.constant_like(value, self.like)

    def cast(self, value):
        b = self.b
        if b.opset >= 15:
            return b.op("CastLike", value, self.like)
        return b.op("Cast", value, to=1 if b.dtype(self.like) == torch.float32 else 11)

    def sample(self, batch_index, y, x, weight=None):
        """sum over the points' corners of rows * bilinear weight (* ``weight``): ``[..., C]`` for positions
        ``y, x`` of shape ``[...]`` and an int64 ``batch_index`` broadcasting against them."""
        b, const = self.b, self.const
        zero, one = const(0.0), const(1.0)
        last_y, last_x = b.op("Sub", self.height_f, one), b.op("Sub", self.width_f, one)
        y = b.op("Where", b.op("IsNaN", y), const(-2.0), y)  # NaN: outside
        x = b.op("Where", b.op("IsNaN", x), const(-2.0), x)
        inside = b.op(
            "And",
            b.op("And", b.op("Not", b.op("Less", y, const(-1.0))), b.op("Not", b.op("Greater", y, self.height_f))),
            b.op("And", b.op("Not", b.op("Less", x, const(-1.0))), b.op("Not", b.op("Greater", x, self.width_f))),
        )
        inside = b.op(
            "And", inside, b.op("And", b.op("Greater", self.height_f, zero), b.op("Greater", self.width_f, zero))
        )
        y, x = b.op("Min", b.op("Max", y, zero), self.height_f), b.op("Min", b.op("Max", x, zero), self.width_f)
        y0, x0 = b.op("Floor", y), b.op("Floor", x)
        at_last_y, at_last_x = b.op("Not", b.op("Less", y0, last_y)), b.op("Not", b.op("Less", x0, last_x))
        y0, x0 = b.op("Where", at_last_y, last_y, y0), b.op("Where", at_last_x, last_x, x0)
        y, x = b.op("Where", at_last_y, y0, y), b.op("Where", at_last_x, x0, x)
        y1, x1 = b.op("Min", b.op("Add", y0, one), last_y), b.op("Min", b.op("Add", x0, one), last_x)
        ly, lx = b.op("Sub", y, y0), b.op("Sub", x, x0)
        hy, hx = b.op("Sub", one, ly), b.op("Sub", one, lx)
        if weight is not None:
            hy, ly = b.op("Mul", hy, weight), b.op("Mul", ly, weight)
        base = b.op("Mul", batch_index, b.op("Mul", self.height, self.width))
        total = None
        for cy, cx, wy, wx in ((y0, x0, hy, hx), (y0, x1, hy, lx), (y1, x0, ly, hx), (y1, x1, ly, lx)):
            iy = b.op("Cast", b.op("Max", cy, zero), to=7)  # in range where inside; clamped (weight 0) elsewhere
            ix = b.op("Cast", b.op("Max", cx, zero), to=7)
            index = b.op("Add", base, b.op("Add", b.op("Mul", iy, self.width), ix))
            term = b.op("Mul", b.op("Gather", self.rows, index, axis=0), b.unsqueeze(b.op("Mul", wy, wx), -1))
            total = term if total is None else b.op("Add", total, term)
        return b.op("Where", b.unsqueeze(inside, -1), total, zero)


def _standard(
    b, input, rois, pooled_height, pooled_width, spatial_scale=1.0, sampling_ratio=0, aligned=True, clockwise=False
):
    a = _attributes(b, pooled_height, pooled_width, spatial_scale, sampling_ratio, aligned, clockwise)
    ph, pw = a["output_height"], a["output_width"]
    i64 = b.constant
    s = Bilinear(b, input)
    const = s.const

    def column(index):
        return b.op("Gather", rois, i64(index), axis=1)  # [K]

    offset = 0.5 if a["aligned"] else 0.0
    scale = const(a["spatial_scale"])
    cx = b.op("Sub", b.op("Mul", column(1), scale), const(offset))
    cy = b.op("Sub", b.op("Mul", column(2), scale), const(offset))
    w, h = b.op("Mul", column(3), scale), b.op("Mul", column(4), scale)
    if not a["aligned"]:
        w, h = b.op("Max", w, const(1.0)), b.op("Max", h, const(1.0))
    theta = b.op("Neg", column(5)) if a["clockwise"] else column(5)
    cos, sin = b.cos_sin(theta, like=rois)

    def axis(length, pooled: int):
        """Offsets from the roi's center along one axis, [K, pooled, G], the grid sizes [K] and the mask [K, 1, G]
        of the points that exist (an adaptive grid is padded to the largest roi's)."""
        bin_size = b.op("Div", length, const(float(pooled)))
        if a["sampling_ratio"] > 0:
            grid = const(float(a["sampling_ratio"]))
            steps = b.tensor(torch.arange(a["sampling_ratio"], dtype=b.dtype(input)))
            grids, mask = b.op("Expand", grid, b.op("Shape", length)), None
        else:
            grids = b.op("Max", b.op("Ceil", bin_size), const(0.0))
            grids = b.op("Where", b.op("IsNaN", grids), const(1.0), grids)
            largest = b.reduce("Max", b.op("Concat", grids, b.op("Reshape", const(1.0), i64([1])), axis=0), [0])
            steps = s.cast(b.iota(b.op("Cast", largest, to=7)))
            mask = b.op("Less", b.op("Reshape", steps, i64([1, 1, -1])), b.op("Reshape", grids, i64([-1, 1, 1])))
        bins = b.tensor(torch.arange(pooled, dtype=b.dtype(input)).reshape(1, -1, 1))
        per_bin = b.op("Reshape", bin_size, i64([-1, 1, 1]))
        step = b.op("Div", per_bin, b.op("Reshape", b.op("Max", grids, const(1.0)), i64([-1, 1, 1])))
        start = b.op("Mul", b.op("Reshape", length, i64([-1, 1, 1])), const(-0.5))
        offsets = b.op(
            "Add",
            b.op("Add", start, b.op("Mul", bins, per_bin)),
            b.op("Mul", b.op("Add", b.op("Reshape", steps, i64([1, 1, -1])), const(0.5)), step),
        )
        return offsets, grids, mask

    yy, grid_h, mask_h = axis(h, ph)  # [K, PH, Gh]
    xx, grid_w, mask_w = axis(w, pw)  # [K, PW, Gw]
    yy5 = b.unsqueeze(yy, [3, 4])  # [K, PH, Gh, 1, 1]
    xx5 = b.unsqueeze(xx, [1, 2])  # [K, 1, 1, PW, Gw]

    def per_roi(v):
        return b.op("Reshape", v, i64([-1, 1, 1, 1, 1]))

    y = b.op("Add", b.op("Sub", b.op("Mul", yy5, per_roi(cos)), b.op("Mul", xx5, per_roi(sin))), per_roi(cy))
    x = b.op("Add", b.op("Add", b.op("Mul", yy5, per_roi(sin)), b.op("Mul", xx5, per_roi(cos))), per_roi(cx))
    weight = None
    if mask_h is not None:  # the padded points of an adaptive grid weigh 0
        mask = b.op("And", b.unsqueeze(mask_h, [3, 4]), b.unsqueeze(mask_w, [1, 2]))
        weight = s.cast(mask)
    batch_index = per_roi(b.op("Cast", column(0), to=7))
    samples = s.sample(batch_index, y, x, weight)  # [K, PH, Gh, PW, Gw, C]
    count = b.op("Max", b.op("Mul", grid_h, grid_w), const(1.0))
    pooled = b.op("Div", b.reduce("Sum", samples, [2, 4]), b.op("Reshape", count, i64([-1, 1, 1, 1])))
    out = b.op("Transpose", pooled, perm=[0, 3, 1, 2])  # [K, C, PH, PW]
    # NaN for a roi with a NaN or infinite number, as the kernel (x - x: 0 when finite).
    poison = b.reduce("Sum", b.op("Sub", rois, rois), [1])
    return b.op("Add", out, b.op("Reshape", poison, i64([-1, 1, 1, 1])))


def float64_cos_gap(cell) -> str | None:
    """The cells of a float64 standard lowering that ONNX Runtime < 1.30 cannot run: the dynamo exporter's graph keeps
    Cos/Sin (see ``builder.cos_sin``), which have no float64 kernel there. Shared by the rotated ops."""
    if cell.exporter == "dynamo" and cell.lowering == "standard" and cell.dtype == "float64":
        import onnxruntime

        if tuple(int(v) for v in onnxruntime.__version__.split(".")[:2]) < (1, 30):
            return f"ONNX Runtime {onnxruntime.__version__} has no float64 Cos/Sin kernel (added in 1.30)"
    return None


_LOWERINGS = [
    specs.Lowering("standard", specs.half_storage(_standard), min_opset=11, note="Gather bilinear sampling"),
    specs.Lowering(
        "custom", specs.half_storage(_custom, native=(torch.float16,)), min_opset=9, note="opbridge::RoiAlignRotated"
    ),
]


# --- parity and reference ------------------------------------------------------------------------------------------

#: operand kind -> (output size, spatial_scale, sampling_ratio, aligned, clockwise)
_KINDS = {
    "fixed": ((3, 2), 0.5, 2, True, False),
    "adaptive": ((2, 3), 0.5, 0, True, False),
    "legacy_clockwise": ((3, 3), 1.0, 0, False, True),
}


class _Model(torch.nn.Module):
    def __init__(self, operands: str = "fixed") -> None:
        super().__init__()
        size, scale, ratio, aligned, clockwise = _KINDS[operands]
        self.layer = RoIAlignRotated(size, scale, ratio, aligned, clockwise)

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        return self.layer(input, rois)


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int) -> tuple[Tensor, Tensor]:
    """A map and rois of every kind: inside, across the border, partly outside, tiny, rotated by any angle."""
    generator = torch.Generator().manual_seed(batch)
    x = torch.randn(batch, 3, 9, 11, generator=generator, dtype=torch.float64)
    count = 5  # a fixed count (the parity matrix names every dimension that varies with the batch alike)
    rois = torch.cat(
        [
            torch.arange(count, dtype=torch.float64).remainder(batch)[:, None],
            torch.rand(count, 2, generator=generator, dtype=torch.float64) * 24 - 1,
            torch.rand(count, 2, generator=generator, dtype=torch.float64) * 12 + 0.3,
            (torch.rand(count, 1, generator=generator, dtype=torch.float64) - 0.5) * 2 * math.pi,
        ],
        1,
    )
    return x.to(dtype), rois.to(dtype)


def _bilinear(plane: Tensor, y: float, x: float) -> Tensor:
    height, width = plane.shape[-2:]
    if y < -1.0 or y > height or x < -1.0 or x > width or height == 0 or width == 0:
        return plane.new_zeros(plane.shape[:-2])
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= height - 1:
        y0, y = height - 1, float(height - 1)
    if x0 >= width - 1:
        x0, x = width - 1, float(width - 1)
    y1, x1 = min(y0 + 1, height - 1), min(x0 + 1, width - 1)
    ly, lx = y - y0, x - x0
    return (
        (1 - ly) * (1 - lx) * plane[..., y0, x0]
        + (1 - ly) * lx * plane[..., y0, x1]
        + ly * (1 - lx) * plane[..., y1, x0]
        + ly * lx * plane[..., y1, x1]
    )


def reference(
    input: Tensor,
    rois: Tensor,
    output_size=(2, 2),
    spatial_scale=1.0,
    sampling_ratio=0,
    aligned=True,
    clockwise=False,
    operands: str | None = None,
) -> Tensor:
    """mmcv's definition in plain Python loops (float64): the independent reference of the tests."""
    if operands is not None:
        output_size, spatial_scale, sampling_ratio, aligned, clockwise = _KINDS[operands]
    ph, pw = _size(output_size)
    x = input.double()
    out = torch.zeros(rois.shape[0], x.shape[1], ph, pw, dtype=torch.float64)
    for k, roi in enumerate(rois.double().tolist()):
        offset = 0.5 if aligned else 0.0
        cx, cy = roi[1] * spatial_scale - offset, roi[2] * spatial_scale - offset
        w, h = roi[3] * spatial_scale, roi[4] * spatial_scale
        if not all(math.isfinite(v) for v in (cx, cy, w, h, roi[5])):
            out[k] = math.nan
            continue
        if not aligned:
            w, h = max(w, 1.0), max(h, 1.0)
        theta = -roi[5] if clockwise else roi[5]
        gh = sampling_ratio if sampling_ratio > 0 else max(math.ceil(h / ph), 0)
        gw = sampling_ratio if sampling_ratio > 0 else max(math.ceil(w / pw), 0)
        plane = x[int(roi[0])]
        for i in range(ph):
            for j in range(pw):
                total = torch.zeros(x.shape[1], dtype=torch.float64)
                for iy in range(gh):
                    yy = -h / 2 + i * h / ph + (iy + 0.5) * h / ph / gh
                    for ix in range(gw):
                        xx = -w / 2 + j * w / pw + (ix + 0.5) * w / pw / gw
                        total += _bilinear(
                            plane,
                            yy * math.cos(theta) - xx * math.sin(theta) + cy,
                            yy * math.sin(theta) + xx * math.cos(theta) + cx,
                        )
                out[k, :, i, j] = total / max(gh * gw, 1)
    return out


SPEC = specs.register(
    specs.OpSpec(
        name="roi_align_rotated",
        torch_op="opbridge::roi_align_rotated",
        doc="RoIAlign over rotated boxes (mmcv semantics)",
        lowerings=_LOWERINGS,
        custom_node=specs.CustomNode(
            op_type="RoiAlignRotated",
            inputs=("input", "rois"),
            outputs=("output",),
            types=("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"),
            doc="mmcv's roi_align_rotated: input [N, C, H, W], rois [K, 6] (batch, cx, cy, w, h, angle) -> "
            "[K, C, output_height, output_width]; the attributes of mmcv's MMCVRoIAlignRotated.",
            attributes=(
                ("aligned", "int"),
                ("clockwise", "int"),
                ("output_height", "int"),
                ("output_width", "int"),
                ("sampling_ratio", "int"),
                ("spatial_scale", "float"),
            ),
        ),
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths={"torch.ops": _Model},
        sample_inputs=_sample_inputs,
        operand_kinds=tuple(_KINDS),
        input_names=("input", "rois"),
        reference=reference,
        known_gaps=float64_cos_gap,
    )
)
