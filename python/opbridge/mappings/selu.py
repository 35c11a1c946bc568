"""aten::selu -> ONNX Selu, or the tutorial's example of an ONNX function written in onnxscript."""

from __future__ import annotations

import torch

from .. import specs
from ..onnx import functions
from ._unary import unary_inputs, unary_module


# The tutorial's onnxscript example: SELU as an ONNX function (onnxscript is imported when a model needs it).
def _selu_body():
    from onnxscript import opset18 as op

    def Selu(X):
        alpha = op.CastLike(op.Constant(value_float=1.6732632423543772), X)
        gamma = op.CastLike(op.Constant(value_float=1.0507009873554805), X)
        zero = op.CastLike(op.Constant(value_float=0.0), X)
        negative = op.Mul(gamma, op.Sub(op.Mul(alpha, op.Exp(X)), alpha))
        positive = op.Mul(gamma, X)
        return op.Where(op.LessOrEqual(X, zero), negative, positive)

    return Selu


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


_SELU = functions.register(
    "Selu", _selu_body, inputs=("X",), outputs=("Y",), doc="SELU: gamma * (x > 0 ? x : alpha * (e^x - 1))"
)

specs.register(
    specs.OpSpec(
        name="selu",
        torch_op="aten::selu",
        doc="aten::selu -> ONNX Selu, or an onnxscript function",
        lowerings=[
            specs.Lowering("standard", specs.half_storage(lambda b, x: b.op("Selu", x)), min_opset=9, note="Selu"),
            # LessOrEqual needs opset 12, CastLike 15.
            specs.Lowering(
                "function",
                specs.half_storage(
                    functions.call(
                        _SELU,
                        set_type=lambda b, out, x: (
                            b.set_type(out, x, x.type().varyingSizes()) if b.exporter == "legacy" else None
                        ),
                    )
                ),
                min_opset=15,
                function=_SELU,
                note="onnxscript function Selu",
            ),
        ],
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths={"torch": unary_module(torch.nn.functional.selu)},
        sample_inputs=unary_inputs(lambda x: 2 * x),
        input_names=("x",),
        reference=lambda x: torch.where(
            x > 0, 1.0507009873554805 * x, 1.0507009873554805 * 1.6732632423543772 * (torch.exp(x) - 1)
        ),
        # ONNX Selu's alpha and gamma are float attributes: float64 results carry their float32 rounding.
        tolerances={"float64": (1e-6, 1e-6)},
        known_gaps=_selu_gaps,
    )
)
