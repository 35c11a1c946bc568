"""Rotated feature alignment: opbridge::rotated_feature_align (mmcv's ``rotated_feature_align``, S2A-Net's and
R3Det's feature refinement), differentiable in its features.

The op's pieces, each named after it: the kernel (cpp/kernels/rotated_feature_align.h), its schema and CPU
adapters (cpp/torch/rotated_feature_align.cpp), its CUDA adapters (cpp/cuda/rotated_feature_align.cu), its ORT
adapter (cpp/ort/rotated_feature_align.cc:
``opbridge::RotatedFeatureAlign``, and ``mmcv::MMCVRotatedFeatureAlign``, the node mmcv's symbolic writes), and
this module.

Lowerings: ``custom``, one ``opbridge::RotatedFeatureAlign`` node (any opset); ``standard`` (opset >= 11), the
bilinear samples of roi_align_rotated's standard lowering at each pixel's box center (and corners).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import _autocast, _checks, specs
from ..specs import LoweringError
from .roi_align_rotated import Bilinear, _bilinear, float64_cos_gap

__all__ = ["rotated_feature_align"]
NN_MODULES: list[str] = []

_OP = "opbridge.rotated_feature_align"


def rotated_feature_align(
    features: Tensor, best_rboxes: Tensor, spatial_scale: float = 1 / 8, points: int = 1
) -> Tensor:
    """Refines features with samples at each pixel's rotated box: mmcv's ``rotated_feature_align``.

    ``out[n, c, h, w] = features[n, c, h, w] + sum over the points of bilinear(features[n, c], point)``.

    Args:
        features: ``[N, C, H, W]``.
        best_rboxes: ``[N, H, W, 5]``, one box per pixel, in image coordinates: ``(y, x, w, h, angle)`` -- mmcv's
            kernel reads the first number as the row (y) and the second as the column (x), whatever its docstring
            says; angle in radians.
        spatial_scale: feature pixels per image pixel (1 / the stride), > 0; mmcv's default 1/8.
        points: 1 (the box center) or 5 (the center and the four corners,
            ``center +- w/2 (cos a, sin a) +- h/2 (-sin a, cos a)`` in (x, y)).

    Returns:
        ``[N, C, H, W]`` of the features' dtype; NaN at a pixel whose box has a NaN or infinite number.

    Raises:
        TypeError: features or best_rboxes is not a tensor, spatial_scale not a number.
        ValueError: points not 1 or 5, spatial_scale not a positive finite number.
        RuntimeError: shapes disagree, dtypes are not float32/float64/float16/bfloat16 or do not pair, or the
            tensors are on different devices.

    Runs on the CPU and on CUDA (the same double-precision sample positions). Differentiable in ``features``
    (deterministic backward on the CPU; on CUDA the gradient is added with atomics, see
    ``torch.use_deterministic_algorithms``; the boxes get no gradient, as in mmcv). Exports to one
    ``opbridge::RotatedFeatureAlign`` node or to standard ops (opset >= 11; see :mod:`opbridge.onnx`).
    """
    if not torch.jit.is_scripting():
        _checks.tensor(_OP, "features", features)
        _checks.tensor(_OP, "best_rboxes", best_rboxes)
        if isinstance(spatial_scale, bool) or not isinstance(spatial_scale, (int, float)):
            raise TypeError(f"{_OP}: spatial_scale must be a number, got {type(spatial_scale).__name__}")
        # Comparisons, not math.isfinite: torch.compile traces them on a symbolic float (dynamic=True), where
        # math.isfinite broke the graph. NaN fails both.
        if not (0 < spatial_scale < math.inf):
            raise ValueError(f"{_OP}: spatial_scale must be a positive finite number, got {spatial_scale}")
        if points not in (1, 5) or isinstance(points, bool):
            raise ValueError(f"{_OP}: points must be 1 (the box center) or 5 (center and corners), got {points}")
    return torch.ops.opbridge.rotated_feature_align(features, best_rboxes, float(spatial_scale), int(points))


@torch.library.register_fake("opbridge::rotated_feature_align")
def _rotated_feature_align_fake(features, best_rboxes, spatial_scale, points=1):
    # Defaults as in the schema: tracers drop trailing arguments left at their defaults.
    op = "opbridge::rotated_feature_align"
    _checks.one_device(op, features=features, best_rboxes=best_rboxes)
    torch._check(
        features.dim() == 4 and best_rboxes.dim() == 4 and best_rboxes.shape[3] == 5,
        lambda: (
            f"{op}: features must be [N, C, H, W] and best_rboxes [N, H, W, 5], got {tuple(features.shape)} "
            f"and {tuple(best_rboxes.shape)}"
        ),
    )
    _checks.float_storage(op, "features", features)
    _checks.same_dtype(op, "features", features, "best_rboxes", best_rboxes, precise=True)
    return torch.empty_like(features, memory_format=torch.contiguous_format)


AUTOCAST = _autocast.Rule("native", precise=(1,))  # boxes in float32
_autocast.register("opbridge::rotated_feature_align", AUTOCAST)


@torch.library.register_fake("opbridge::rotated_feature_align_backward")
def _rotated_feature_align_backward_fake(grad_output, best_rboxes, spatial_scale, points):
    _checks.one_device("opbridge::rotated_feature_align_backward", grad_output=grad_output, best_rboxes=best_rboxes)
    return torch.empty_like(grad_output, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output) -> None:
    _, best_rboxes, spatial_scale, points = inputs
    ctx.save_for_backward(best_rboxes)
    ctx.geometry = (spatial_scale, points)


def _backward(ctx, grad: Tensor):
    (best_rboxes,) = ctx.saved_tensors
    grad_features = None
    if ctx.needs_input_grad[0]:
        _checks.alert_not_deterministic("opbridge::rotated_feature_align_backward", grad)
        grad_features = torch.ops.opbridge.rotated_feature_align_backward(grad, best_rboxes, *ctx.geometry)
    return grad_features, None, None, None


torch.library.register_autograd("opbridge::rotated_feature_align", _backward, setup_context=_setup_context)


def _double_backward_setup(ctx, inputs, output) -> None:
    _, best_rboxes, spatial_scale, points = inputs
    ctx.save_for_backward(best_rboxes)
    ctx.geometry = (spatial_scale, points)


def _double_backward(ctx, grad: Tensor):
    # The backward is linear in grad_output, and its adjoint is the forward (without the identity term twice):
    # the gradient of <g, backward(grad_output)> w.r.t. grad_output is forward(g).
    (best_rboxes,) = ctx.saved_tensors
    return torch.ops.opbridge.rotated_feature_align(grad, best_rboxes, *ctx.geometry), None, None, None


torch.library.register_autograd(
    "opbridge::rotated_feature_align_backward", _double_backward, setup_context=_double_backward_setup
)


# --- ONNX ------------------------------------------------------------------------------------------------------------


def _attributes(b, spatial_scale, points) -> tuple[float, int]:
    scale, count = float(b.value(spatial_scale, "f")), int(b.value(points, "i"))
    if count not in (1, 5):
        raise LoweringError(f"rotated_feature_align export: points must be 1 or 5, got {count}")
    return scale, count


def _custom(b, features, best_rboxes, spatial_scale, points=1):
    # Defaults as in the schema: the dynamo exporter drops trailing arguments left at their defaults.
    scale, count = _attributes(b, spatial_scale, points)
    out = b.op(
        "RotatedFeatureAlign", features, best_rboxes, domain=specs.CUSTOM_DOMAIN, spatial_scale=scale, points=count
    )
    b.set_type(out, features, b.static_shape(features))
    return out


def _standard(b, features, best_rboxes, spatial_scale, points=1):
    scale, count = _attributes(b, spatial_scale, points)
    i64 = b.constant
    s = Bilinear(b, features)
    const = s.const

    def field(index):  # [N, H, W, 1]
        return b.op("Gather", best_rboxes, i64([index]), axis=3)

    y, x = b.op("Mul", field(0), const(scale)), b.op("Mul", field(1), const(scale))
    ys, xs = [y], [x]
    if count == 5:
        w, h = b.op("Mul", field(2), const(scale / 2)), b.op("Mul", field(3), const(scale / 2))
        cos, sin = b.cos_sin(field(4), like=best_rboxes)
        wx, wy = b.op("Mul", cos, w), b.op("Mul", sin, w)
        hx, hy = b.op("Neg", b.op("Mul", sin, h)), b.op("Mul", cos, h)
        for sign_w, sign_h in ((1, 1), (-1, 1), (-1, -1), (1, -1)):
            dy = b.op("Add" if sign_h > 0 else "Sub", wy if sign_w > 0 else b.op("Neg", wy), hy)
            dx = b.op("Add" if sign_h > 0 else "Sub", wx if sign_w > 0 else b.op("Neg", wx), hx)
            ys.append(b.op("Add", y, dy))
            xs.append(b.op("Add", x, dx))
    py = b.op("Concat", *ys, axis=3) if count > 1 else y  # [N, H, W, P]
    px = b.op("Concat", *xs, axis=3) if count > 1 else x
    batch = b.op("Gather", b.op("Shape", features), i64(0), axis=0)
    batch_index = b.op("Reshape", b.iota(batch), i64([-1, 1, 1, 1]))
    sampled = b.reduce("Sum", s.sample(batch_index, py, px), [3])  # [N, H, W, C]
    out = b.op("Add", features, b.op("Transpose", sampled, perm=[0, 3, 1, 2]))
    # NaN at a pixel whose box has a NaN or infinite number, as the kernel (x - x: 0 when finite).
    poison = b.reduce("Sum", b.op("Sub", best_rboxes, best_rboxes), [3], keepdims=False)  # [N, H, W]
    return b.op("Add", out, b.unsqueeze(poison, 1))


_LOWERINGS = [
    specs.Lowering("standard", specs.half_storage(_standard), min_opset=11, note="Gather bilinear sampling"),
    specs.Lowering(
        "custom",
        specs.half_storage(_custom, native=(torch.float16,)),
        min_opset=9,
        note="opbridge::RotatedFeatureAlign",
    ),
]


# --- parity and reference ------------------------------------------------------------------------------------------

_KINDS = {"center": (0.25, 1), "corners": (0.5, 5)}


class _Model(torch.nn.Module):
    def __init__(self, operands: str = "center") -> None:
        super().__init__()
        self.spatial_scale, self.points = _KINDS[operands]

    def forward(self, features: Tensor, best_rboxes: Tensor) -> Tensor:
        return rotated_feature_align(features, best_rboxes, self.spatial_scale, self.points)


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(batch)
    height, width = 5, 6
    features = torch.randn(batch, 3, height, width, generator=generator, dtype=torch.float64)
    boxes = torch.cat(
        [
            torch.rand(batch, height, width, 2, generator=generator, dtype=torch.float64) * 28 - 2,
            torch.rand(batch, height, width, 2, generator=generator, dtype=torch.float64) * 16,
            (torch.rand(batch, height, width, 1, generator=generator, dtype=torch.float64) - 0.5) * 4,
        ],
        3,
    )
    return features.to(dtype), boxes.to(dtype)


def reference(
    features: Tensor, best_rboxes: Tensor, spatial_scale: float = 1 / 8, points: int = 1, operands: str | None = None
) -> Tensor:
    """mmcv's definition in plain Python loops (float64): the independent reference of the tests."""
    if operands is not None:
        spatial_scale, points = _KINDS[operands]
    x = features.double()
    out = x.clone()
    for n in range(x.shape[0]):
        for h in range(x.shape[2]):
            for w in range(x.shape[3]):
                cy, cx, bw, bh, angle = best_rboxes[n, h, w].double().tolist()
                if not all(math.isfinite(v * spatial_scale) for v in (cy, cx, bw, bh, angle)):
                    out[n, :, h, w] = math.nan
                    continue
                cy, cx, bw, bh = cy * spatial_scale, cx * spatial_scale, bw * spatial_scale, bh * spatial_scale
                spots = [(cy, cx)]
                if points == 5:
                    c, s = math.cos(angle), math.sin(angle)
                    for sw, sh in ((1, 1), (-1, 1), (-1, -1), (1, -1)):
                        spots.append((cy + sw * s * bw / 2 + sh * c * bh / 2, cx + sw * c * bw / 2 - sh * s * bh / 2))
                for py, px in spots:
                    out[n, :, h, w] += _bilinear(x[n], py, px)
    return out


SPEC = specs.register(
    specs.OpSpec(
        name="rotated_feature_align",
        torch_op="opbridge::rotated_feature_align",
        doc="rotated feature alignment (S2A-Net / R3Det, mmcv semantics)",
        lowerings=_LOWERINGS,
        custom_node=specs.CustomNode(
            op_type="RotatedFeatureAlign",
            inputs=("features", "best_rboxes"),
            outputs=("output",),
            types=("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"),
            doc="mmcv's rotated_feature_align: features [N, C, H, W], best_rboxes [N, H, W, 5] -> [N, C, H, W]; "
            "the attributes of mmcv's MMCVRotatedFeatureAlign.",
            attributes=(("points", "int"), ("spatial_scale", "float")),
        ),
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths={"torch.ops": _Model},
        sample_inputs=_sample_inputs,
        operand_kinds=tuple(_KINDS),
        input_names=("features", "best_rboxes"),
        reference=reference,
        known_gaps=float64_cos_gap,
    )
)
