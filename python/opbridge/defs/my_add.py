"""my_add(a, b) = 2 * a + b: the spec every later op follows."""

from __future__ import annotations

import onnxscript
import torch
from onnxscript import opset18 as op

from .. import specs
from ..onnx import _legacy_helpers as helpers

_opbridge = onnxscript.values.Opset(specs.CUSTOM_DOMAIN, specs.CUSTOM_DOMAIN_VERSION)


def _legacy_standard(g, a, b):
    two = g.op("Constant", value_t=torch.tensor(2, dtype=helpers.dtype_of(a, "opbridge::my_add", "a")))
    return g.op("Add", g.op("Mul", a, two), b)


def _legacy_custom(g, a, b):
    out = g.op(f"{specs.CUSTOM_DOMAIN}::MyAdd", a, b)
    helpers.set_broadcast_type(out, a, b)
    return out


def _dynamo_standard(a, b):
    return op.Add(op.Mul(a, op.CastLike(2.0, a)), b)


def _dynamo_custom(a, b):
    return _opbridge.MyAdd(a, b)


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
            specs.Lowering("standard", _legacy_standard, _dynamo_standard, min_opset=7),
            specs.Lowering("custom", _legacy_custom, _dynamo_custom, min_opset=7),
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
