"""my_add(a, b) = 2 * a + b: the spec every later op follows."""

from __future__ import annotations

from typing import TypeVar

import torch
from onnxscript import opset18 as op
from onnxscript.onnx_types import DOUBLE, FLOAT, FLOAT16

from .. import specs
from ..onnx import functions


def _standard(b, x, y):
    return b.op("Add", b.op("Mul", x, b.constant_like(2.0, x)), y)


def _custom(b, x, y):
    out = b.op("MyAdd", x, y, domain=specs.CUSTOM_DOMAIN)
    b.set_broadcast_type(out, x, y)
    return out


T = TypeVar("T", FLOAT, DOUBLE, FLOAT16)


def MyAdd(A: T, B: T) -> T:
    two = op.CastLike(op.Constant(value_float=2.0), A)
    return op.Add(op.Mul(A, two), B)


_FUNCTION = functions.register(MyAdd, inputs=("A", "B"), outputs=("C",), doc="C = 2 * A + B (broadcasting)")


class _TorchOp(torch.nn.Module):
    def forward(self, a, b):
        return torch.ops.opbridge.my_add(a, b)


class _Pybind(torch.nn.Module):
    def forward(self, a, b):
        from .. import _C

        return _C.my_add(a, b)


class _AutogradFunction(torch.nn.Module):
    def forward(self, a, b):
        from ..autograd import MyAddFunction

        return MyAddFunction.apply(a, b)


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * batch + len(operands))
    if operands == "same":
        shapes = (batch, 3, 5), (batch, 3, 5)
    elif operands == "broadcast":  # both operands broadcast: (B, 1, 5) with (3, 1) -> (B, 3, 5)
        shapes = (batch, 1, 5), (3, 1)
    else:
        raise ValueError(f"unknown operand kind {operands!r}")
    return tuple(torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype) for shape in shapes)


SPEC = specs.register(
    specs.OpSpec(
        name="my_add",
        torch_op="opbridge::my_add",
        doc="2 * a + b with broadcasting",
        lowerings=[
            # Constant, Mul and Add exist in every opset the exporters produce.
            specs.Lowering("standard", _standard, min_opset=7),
            specs.Lowering("custom", _custom, min_opset=7),
            # The function body uses CastLike (opset 15) to match the input's dtype.
            specs.Lowering(
                "function",
                functions.call(_FUNCTION, set_type=lambda b, out, x, y: b.set_broadcast_type(out, x, y)),
                min_opset=15,
                function=_FUNCTION,
            ),
        ],
        custom_node=specs.CustomNode(
            op_type="MyAdd",
            inputs=("A", "B"),
            outputs=("C",),
            types=("tensor(float)", "tensor(double)", "tensor(float16)"),
            doc="C = 2 * A + B with multidirectional (NumPy) broadcasting.",
        ),
        dtypes=(torch.float32, torch.float64),
        call_paths={"torch.ops": _TorchOp, "pybind": _Pybind, "autograd.Function": _AutogradFunction},
        sample_inputs=_sample_inputs,
        operand_kinds=("same", "broadcast"),
        input_names=("a", "b"),
        reference=lambda a, b: (2 * a.double() + b.double()).to(a.dtype),
    )
)
