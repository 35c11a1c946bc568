"""aten::floor_divide (``a // b`` on tensors) for the TorchScript-based exporter: floor, not truncation.

torch's own rule (torch 2.14.1) truncates the quotient, so every negative non-integral quotient comes out one too
large, for floats and integers alike (measured by the coverage sweep: ``tensor([-8.48, -1.77]) // 3.61`` gives
``[-2, 0]`` in ONNX Runtime, ``[-3, -1]`` in eager) — a silently wrong model wherever ``//`` meets a negative
number (box decoding, grid offsets). The dynamo exporter's rule, ``Floor(a / b)``, is one too large where
``a / b`` rounds up to an integer (``1.0 // 0.1`` is 9 in torch, 10 there): this rule replaces it too.

Dynamic integer sizes cost one node: a dividend computed from a dynamic dimension of a shape, over a positive
constant, is one ``Div`` (truncation is the floor there); RF-DETR's TorchScript export doubled in nodes before
(1624 -> 3242 with opbridge imported). Sizes the exporter knows keep the correction (see the rule).

Floats follow torch's ``div_floor`` (the quotient of ``a - fmod(a, b)``, corrected by one where the remainder's
sign differs from ``b``'s; ``a / b`` where ``b == 0``); integers correct the truncated quotient where the
remainder is non-zero and of the other sign than ``b``.
"""

from __future__ import annotations

import torch

from .. import specs
from ..onnx.builder import ONNX_TYPES as _ONNX_TYPES
from ..specs import LoweringError


def _floor_divide(b, self, other):
    if isinstance(other, (int, float)):  # the dynamo exporter passes a Python scalar divisor as it is
        b_type = torch.float32 if isinstance(other, float) else torch.int64
        other = b.op("Constant", value_float=other) if isinstance(other, float) else b.op("Constant", value_int=other)
    else:
        b_type = b.dtype(other, "other")
    a_type = b.dtype(self, "self")
    if a_type.is_floating_point or b_type.is_floating_point:
        result = a_type if a_type.is_floating_point else torch.float32  # torch's promotion of a scalar divisor
    else:
        result = a_type
    if result.is_floating_point and b.opset < 10:
        raise LoweringError("floor_divide export of floating-point values needs ONNX Mod (fmod), opset >= 10; "
                            "torch's own rule below it truncates instead of flooring")  # fmt: skip
    a = self if a_type == result else b.op("Cast", self, to=_ONNX_TYPES[result])
    d = other if b_type == result else b.op("Cast", other, to=_ONNX_TYPES[result])
    if not result.is_floating_point and b.exporter == "legacy":
        # A size the exporter does not know (a dynamic dimension of a shape, over a stride or a patch size) divided
        # by a positive constant: truncation is the floor there, one Div (RF-DETR's TorchScript export doubled in
        # nodes with the correction chain, 1624 -> 3242). Sizes the exporter knows keep the chain: a Div it could
        # fold lets its constant folding turn a model's linspace grids into float64 constants (transformers'
        # Mask2Former: the sampling grids of its grid_sample came out float64, and the model no longer loaded).
        d_value = b.constant_value(d)
        if d_value is not None and d_value.numel() and bool((d_value > 0).all()) and b.dynamic_size(a):
            return b.op("Div", a, d)
    zero = b.op("Cast", b.constant(0), to=_ONNX_TYPES[result])
    one = b.op("Cast", b.constant(1), to=_ONNX_TYPES[result])
    if result.is_floating_point:
        remainder = b.op("Mod", a, d, fmod=1)
        quotient = b.op("Div", b.op("Sub", a, remainder), d)
    else:
        quotient = b.op("Div", a, d)  # truncated
        remainder = b.op("Sub", a, b.op("Mul", quotient, d))

    def nonzero(value):  # Less/Greater: Equal takes floats only from opset 11
        return b.op("Or", b.op("Less", value, zero), b.op("Greater", value, zero))

    signs_differ = b.op("Xor", b.op("Less", remainder, zero), b.op("Less", d, zero))
    adjust = b.op("And", nonzero(remainder), signs_differ)
    quotient = b.op("Where", adjust, b.op("Sub", quotient, one), quotient)
    if not result.is_floating_point:
        return quotient
    floored = b.op("Floor", quotient)  # the quotient is integral up to rounding: snap it as torch does
    half = b.op("Cast", b.constant_like(0.5, a) if a_type == result else b.op("Constant", value_float=0.5),
                to=_ONNX_TYPES[result])  # fmt: skip
    floored = b.op("Where", b.op("Greater", b.op("Sub", quotient, floored), half), b.op("Add", floored, one), floored)
    return b.op("Where", b.op("Not", nonzero(d)), b.op("Div", a, d), floored)


class _FloorDivide(torch.nn.Module):
    def forward(self, x, y):
        return x // y


class _FloorDivideScalar(torch.nn.Module):
    def forward(self, x, y):
        if x.dtype in specs.HALF_DTYPES:  # the rest in float32: ORT's CPU has no bfloat16 Mul, Add
            return ((x // -3).float() + y.float() * 0).to(x.dtype)
        return x // -3 + y * 0


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    if dtype.is_floating_point:
        x = torch.randn(batch, 3, 8, generator=generator, dtype=torch.float64) * 10
        y = torch.randn(batch, 3, 8, generator=generator, dtype=torch.float64) * 3
        x[..., 0], y[..., 0] = 6.0, -3.0  # exact quotient
        x[..., 1], y[..., 1] = 1.0, 0.1  # a / b rounds to 10, the floor quotient is 9
        return x.to(dtype), y.to(dtype)
    x = torch.randint(-50, 50, (batch, 3, 8), generator=generator, dtype=dtype)
    y = torch.randint(1, 9, (batch, 3, 8), generator=generator, dtype=dtype)
    return x, y * (torch.randint(0, 2, (batch, 3, 8), generator=generator, dtype=dtype) * 2 - 1)  # no zero


def _reference(x, y, path: str = "tensor"):
    """Python's own floor division, one element at a time (// on Python numbers floors)."""
    divisor = torch.full_like(y, -3) if path == "scalar" else y
    values = [a // d for a, d in zip(x.flatten().tolist(), divisor.flatten().tolist(), strict=True)]
    return torch.tensor(values, dtype=x.dtype).reshape(x.shape)


specs.register(
    specs.OpSpec(
        name="floor_divide",
        torch_op="aten::floor_divide",
        doc="aten::floor_divide (a // b) -> Div/Mod with floor rounding (torch's TorchScript-exporter rule truncates)",
        lowerings=[
            specs.Lowering(
                "standard", specs.half_storage(_floor_divide), min_opset=9, note="Div, Mod (floats, opset >= 10), Where"
            )
        ],
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32),
        call_paths={"tensor": _FloorDivide, "scalar": _FloorDivideScalar},
        sample_inputs=_sample_inputs,
        input_names=("x", "y"),
        reference=_reference,
        known_gaps=lambda cell: (
            "floats need Mod (fmod, opset >= 10): the export raises below it"
            if cell.opset < 10 and cell.dtype.startswith("float")
            else None
        ),
        # torch's dynamo rule floors a / b, which is one too large where a / b rounds up to an integer (1 // 0.1)
        dynamo_overrides_torch=True,
    )
)
