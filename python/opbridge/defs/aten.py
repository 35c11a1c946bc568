"""ATen ops that the installed torch's TorchScript-based exporter cannot export
although ONNX has the op, found by trying every opset 9..20 (see
docs/tutorial.md): on torch 2.14 asinh, acosh, atanh, sinh and cosh fail at
every opset (ONNX has them since 9) and bitwise_not of integers fails at every
opset although ONNX has BitwiseNot since 18. Plus selu, the tutorial's example
of an ONNX function written in onnxscript.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from onnxscript import opset18 as op
from onnxscript.onnx_types import DOUBLE, FLOAT, FLOAT16

from .. import specs
from ..onnx import functions

T = TypeVar("T", FLOAT, DOUBLE, FLOAT16)


def _unary_module(fn):
    class Unary(torch.nn.Module):
        def forward(self, x):
            return fn(x)

    Unary.__name__ = f"Call_{fn.__name__}"
    return Unary


def _unary_inputs(transform):
    def sample(dtype: torch.dtype, operands: str, batch: int) -> tuple[torch.Tensor]:
        x = torch.randn((batch, 3, 4), generator=torch.Generator().manual_seed(batch), dtype=torch.float64)
        return (transform(x).to(dtype),)

    return sample


def _unary_spec(
    name: str, torch_fn, onnx_op: str, min_opset: int, domain_transform, reference, **extra
) -> specs.OpSpec:
    return specs.register(
        specs.OpSpec(
            name=name,
            torch_op=f"aten::{name}",
            doc=f"aten::{name} -> ONNX {onnx_op}",
            lowerings=[specs.Lowering("standard", lambda b, x: b.op(onnx_op, x), min_opset=min_opset)],
            dtypes=extra.pop("dtypes", (torch.float32, torch.float64)),
            call_paths={"torch": _unary_module(torch_fn)},
            sample_inputs=_unary_inputs(domain_transform),
            input_names=("x",),
            reference=reference,
            **extra,
        )
    )


# Inputs are moved into each function's domain (acosh: x >= 1, atanh: |x| < 1).
for _name, _onnx, _domain in [
    ("asinh", "Asinh", lambda x: 3 * x),
    ("acosh", "Acosh", lambda x: 1 + x.abs() * 3),
    ("atanh", "Atanh", lambda x: 0.99 * torch.tanh(x)),
    ("sinh", "Sinh", lambda x: 3 * x),
    ("cosh", "Cosh", lambda x: 3 * x),
]:
    _unary_spec(
        _name,
        getattr(torch, _name),
        _onnx,
        9,
        _domain,
        known_gaps=lambda cell, _onnx=_onnx: (
            f"ONNX Runtime implements {_onnx} for float32 only (no float64 kernel)" if cell.dtype == "float64" else None
        ),
        # numpy's implementation, independent of torch's
        reference=lambda x, _name=_name: (
            torch.from_numpy(getattr(__import__("numpy"), "arc" + _name[1:])(x.numpy()))
            if _name.startswith("a")
            else torch.from_numpy(getattr(__import__("numpy"), _name)(x.numpy()))
        ),
    )


def _bitwise_not(b, x):
    if b.exporter == "legacy" and x.type().scalarType() == "Bool":
        return b.op("Not", x)
    return b.op("BitwiseNot", x)


specs.register(
    specs.OpSpec(
        name="bitwise_not",
        torch_op="aten::bitwise_not",
        doc="aten::bitwise_not -> ONNX BitwiseNot (integers, opset >= 18) or Not (bool)",
        lowerings=[specs.Lowering("standard", _bitwise_not, min_opset=18)],
        dtypes=(torch.int32, torch.int64),
        call_paths={"torch": _unary_module(torch.bitwise_not)},
        sample_inputs=lambda dtype, operands, batch: (
            torch.randint(-1000, 1000, (batch, 3, 4), generator=torch.Generator().manual_seed(batch), dtype=dtype),
        ),
        input_names=("x",),
        reference=lambda x: torch.from_numpy(~x.numpy()),
    )
)


# The tutorial's onnxscript example: SELU as an ONNX function.
def Selu(X: T) -> T:
    alpha = op.CastLike(op.Constant(value_float=1.6732632423543772), X)
    gamma = op.CastLike(op.Constant(value_float=1.0507009873554805), X)
    zero = op.CastLike(op.Constant(value_float=0.0), X)
    negative = op.Mul(gamma, op.Sub(op.Mul(alpha, op.Exp(X)), alpha))
    positive = op.Mul(gamma, X)
    return op.Where(op.LessOrEqual(X, zero), negative, positive)


def _selu_gaps(cell) -> str | None:
    if cell.exporter == "dynamo" and cell.lowering == "function" and specs.torch_version() < (2, 13):
        return (
            "torch <= 2.9's dynamo exporter decomposes aten::selu before it consults custom translations "
            "(seen on 2.6 and 2.9), so no function is emitted"
        )
    if cell.dtype == "float64" and cell.lowering == "standard":
        return (
            "ONNX Runtime implements Selu for float32 only (float64 runs only at opset 18, where ORT expands "
            "Selu's ONNX function body instead)"
        )
    return None


_SELU = functions.register(Selu, inputs=("X",), outputs=("Y",), doc="SELU: gamma * (x > 0 ? x : alpha * (e^x - 1))")

specs.register(
    specs.OpSpec(
        name="selu",
        torch_op="aten::selu",
        doc="aten::selu -> ONNX Selu, or an onnxscript function",
        lowerings=[
            specs.Lowering("standard", lambda b, x: b.op("Selu", x), min_opset=9),
            # LessOrEqual needs opset 12, CastLike 15.
            specs.Lowering(
                "function",
                functions.call(
                    _SELU,
                    set_type=lambda b, out, x: (
                        b.set_type(out, x, x.type().varyingSizes()) if b.exporter == "legacy" else None
                    ),
                ),
                min_opset=15,
                function=_SELU,
            ),
        ],
        dtypes=(torch.float32, torch.float64),
        call_paths={"torch": _unary_module(torch.nn.functional.selu)},
        sample_inputs=_unary_inputs(lambda x: 2 * x),
        input_names=("x",),
        reference=lambda x: torch.where(
            x > 0, 1.0507009873554805 * x, 1.0507009873554805 * 1.6732632423543772 * (torch.exp(x) - 1)
        ),
        # ONNX Selu's alpha and gamma are float attributes: float64 results carry their float32 rounding.
        tolerances={"float64": (1e-6, 1e-6)},
        known_gaps=_selu_gaps,
    )
)
