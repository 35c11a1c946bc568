"""aten::cumsum for the TorchScript-based exporter: torch's result type and torch's arithmetic, opsets 11 and up.

torch's rule (torch 2.14.1) writes one ``CumSum`` in whatever type it meets, and gets the type wrong:
- no cast where no ``dtype`` is asked, so a bool or int32 input keeps its type where torch promotes it to int64
  (``mask.cumsum(1)`` of a boolean mask: a model ONNX Runtime refuses, "Type 'tensor(bool)' ... of operator
  (CumSum) ... is invalid"; int32: int32 out where eager gives int64);
- a float16 or bfloat16 ``CumSum`` below opset 14, which ONNX does not have: transformers' Deformable DETR after
  ``model.half()`` at opset 11 (its sine position embedding's ``pixel_mask.cumsum(1, dtype=float16)``) exported a
  model no runtime loads; and a bfloat16 one, which ONNX Runtime's CPU provider has no kernel for at any opset.

This rule casts to torch's result type (the asked ``dtype``, else the input's, integers and bool promoted to int64)
and sums there; half types are summed in float32 and rounded once, as torch's own kernels do (their accumulator is
float32), and narrow integers in int64 (the same wrap-around once cast back).

The dynamo exporter keeps its own rule, which gets these right. One gap there is torch's and not in a rule: a half
input's cumsum without ``dtype`` is decomposed into float32 and the cast back to the half type is lost in the
translation, so the output is float32 where eager's is half (``x.cumsum(1, dtype=x.dtype)`` keeps the type).
"""

from __future__ import annotations

import torch

from .. import specs
from ..onnx.builder import C10_DTYPES, ONNX_TYPES

# The types ONNX's CumSum-11 takes that torch has (the half types come with CumSum-14, which ORT's CPU has no
# bfloat16 kernel of): everything else is summed in one of them.
_SUMMED = (torch.int32, torch.int64, torch.float32, torch.float64)


def _cumsum(b, self, dim, dtype=None):
    # aten::cumsum(Tensor self, int dim, *, ScalarType? dtype=None)
    axis = b.value(dim, "i")
    if not isinstance(axis, int):
        raise specs.UnknownToExporter("aten::cumsum: the dimension is not a constant")
    source = b.dtype(self, "self")
    if b.is_none(dtype):
        target = source if source.is_floating_point else torch.int64
    else:
        code = b.value(dtype, "i")  # a c10 ScalarType code
        target = C10_DTYPES.get(code) if isinstance(code, int) else None
    if target is None or target == torch.bool or target not in ONNX_TYPES:
        raise specs.UnknownToExporter(f"aten::cumsum: no ONNX sum for the asked dtype {target}")
    compute = target if target in _SUMMED else torch.float32 if target.is_floating_point else torch.int64
    x = self if source == compute else b.op("Cast", self, to=ONNX_TYPES[compute])
    shape = b.static_shape(self)
    scalar = shape is not None and len(shape) == 0
    if scalar:  # torch sums a 0-d tensor along dim 0 or -1: itself
        x = b.op("Reshape", x, b.constant([1]))
    out = b.op("CumSum", x, b.constant(axis))
    if scalar:
        out = b.op("Reshape", out, b.constant([]))
    return out if compute == target else b.op("Cast", out, to=ONNX_TYPES[target])


class _CumSum(torch.nn.Module):
    """``x.cumsum(1)``; a mask's running count in x's dtype (DETR's sine position embedding); bool and int32 counts,
    which torch promotes to int64."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form

    def forward(self, x):
        if self.form == "values":
            return x.cumsum(1)
        positive = x.float() > 0  # compared in float32: ORT's CPU has no bfloat16 Greater
        if self.form == "mask count":
            return positive.cumsum(1, dtype=x.dtype)
        return positive.cumsum(-1) + positive.int().cumsum(-1)


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    return (torch.randn(batch, 40, 3, generator=generator, dtype=torch.float64).to(dtype),)


def _reference(x, path: str):
    if path == "values":
        return x.double().cumsum(1).to(x.dtype)
    if path == "mask count":
        return (x > 0).double().cumsum(1).to(x.dtype)
    return 2 * torch.tensor((x > 0).long().tolist()).cumsum(-1)


def _known_gaps(cell) -> str | None:
    if cell.exporter == "dynamo" and cell.path == "values" and cell.dtype in ("float16", "bfloat16"):
        return (
            "torch.export decomposes a half cumsum into float32 and the dynamo exporter drops the cast back "
            "(torch's; the output is float32)"
        )
    return None


specs.register(
    specs.OpSpec(
        name="cumsum",
        torch_op="aten::cumsum",
        doc="aten::cumsum -> Cast to torch's result type (half types: float32, rounded once), CumSum: torch's rule "
        "keeps bool/int32 inputs' type and writes half CumSums below opset 14",
        lowerings=[specs.Lowering("standard", _cumsum, min_opset=11, note="Cast, CumSum (Reshape for 0-d), Cast")],
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths={form: (lambda form=form: _CumSum(form)) for form in ("values", "mask count", "integer counts")},
        sample_inputs=_sample_inputs,
        input_names=("x",),
        reference=_reference,
        known_gaps=_known_gaps,
    )
)
