"""aten::arange in float16, bfloat16 and float64 for the TorchScript-based exporter: one float64 ``Range``, then a
``Cast`` to the asked type.

torch's rule (torch 2.14.1, opsets 11 and up) casts ``start``, ``end`` and ``step`` to the asked dtype and writes
one ``Range``:
- ONNX's ``Range`` takes no float16 or bfloat16, so a half ``torch.arange(n, dtype=x.dtype)`` exported a model
  that no runtime loads ("Type 'tensor(float16)' of input parameter ... of operator (Range) ... is invalid").
  Sine position embeddings are written so: transformers' Mask2Former and OneFormer exported after ``model.half()``
  failed to load in ONNX Runtime, with or without opbridge.
- A float64 range the exporter can compute (every bound known: a static size) is computed by its constant
  propagation with float32 numbers: ``torch.arange(0.5, 5, 0.3, dtype=torch.float64)`` came out up to 2e-7 off.

This rule sizes and fills the range in float64 and rounds once to the asked type, which is torch's own arithmetic
(its CPU kernel computes ``start + i * step`` in float64 for float32, float64 and the half types, and sizes every
range in float64). float32 and integer ranges go to torch's rule unchanged. The dynamo exporter keeps its own rule:
it computes half ranges in float32 (they load and run) and float64 ranges in float32 too (the parity cell of a
fractional float64 step is n/a with that reason).
"""

from __future__ import annotations

import math

import torch

from .. import specs
from ..onnx.builder import C10_DTYPES, ONNX_TYPES

# torch's overloads by argument count, as its rule reads them: where each puts its dtype.
# arange(end, dtype, layout, device, pin_memory), arange(start, end, dtype, ...),
# arange(start, end, step, dtype, ...)
_DTYPE_AT = {5: 1, 6: 2, 7: 3}


def _number(value) -> float | int | None:
    """The number a start, end or step holds where it is a constant (a Python float of the trace is a double), or
    None for a traced one."""
    node = value.node()
    if node.kind() in ("prim::Constant", "onnx::Constant") and node.hasAttribute("value"):
        kind = node.kindOf("value")
        if kind in ("f", "i"):
            return node.f("value") if kind == "f" else node.i("value")
        if kind == "t" and node.t("value").numel() == 1:
            return node.t("value").item()
    return None


def _arange(b, *args):
    from ..onnx import _torch_hooks

    builtin = _torch_hooks.legacy_builtin_symbolic("aten::arange", b.opset)
    if builtin is None:
        raise specs.UnknownToExporter(f"aten::arange: torch has no rule at opset {b.opset}")
    at = _DTYPE_AT.get(len(args))
    asked = None
    if at is not None and not b.is_none(args[at]):
        code = b.value(args[at], "i")
        asked = C10_DTYPES.get(code) if isinstance(code, int) else None
    if asked not in (*specs.HALF_DTYPES, torch.float64):
        return builtin(b.g, *args)
    # torch sizes a range in float64 and computes its values in float64 (float32 for half types on the GPU) before
    # one rounding; torch's rule casts a traced end to the asked type (ONNX Range has no half types).
    numbers = [_number(a) for a in args[:at]]
    start, end, step = (0, numbers[0], 1) if at == 1 else (*numbers, 1) if at == 2 else numbers
    if None not in (start, end, step):
        # Known at export: torch's own arange (the exporter's constant propagation would compute a float64 Range
        # from float32 numbers).
        return b.tensor(torch.arange(start, end, step, dtype=asked))

    def wide(value, number):  # a float64 value: the double the trace recorded, or a traced number cast
        if number is None:
            return b.op("Cast", value, to=ONNX_TYPES[torch.float64])
        return b.tensor(torch.tensor(number, dtype=torch.float64))

    bounds = [wide(a, n) for a, n in zip(args[:at], numbers, strict=True)]
    one = wide(None, 1)
    start, end, step = (wide(None, 0), bounds[0], one) if at == 1 else (*bounds, one) if at == 2 else bounds
    out = b.op("Range", start, end, step)
    return out if asked == torch.float64 else b.op("Cast", out, to=ONNX_TYPES[asked])


class _Arange(torch.nn.Module):
    """Ranges of a traced length (``batch + 3``) in ``x``'s dtype, through each of torch's overloads."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form

    def forward(self, x):
        n = x.shape[0] + 3
        if self.form == "end":
            points = torch.arange(n, dtype=x.dtype)
        elif self.form == "start, end":
            points = torch.arange(1, n, dtype=x.dtype)
        else:
            points = torch.arange(0.5, n, 0.3, dtype=x.dtype)
        # x's values reach the output (else the exporter drops the input); in float32 for half types: ORT's CPU
        # has no bfloat16 ReduceSum or Add. Exact: the range's rounding is the only one.
        wide = torch.float32 if x.dtype in specs.HALF_DTYPES else x.dtype
        return (x.to(wide).sum() * 0 + points.to(wide)).to(x.dtype)


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    return (torch.randn(batch, 2, generator=generator, dtype=torch.float64).to(dtype),)


def _reference(x, path: str):
    n = x.shape[0] + 3
    start, step = {"end": (0.0, 1.0), "start, end": (1.0, 1.0)}.get(path, (0.5, 0.3))
    count = math.ceil((n - start) / step)  # as torch sizes a range
    return torch.tensor([start + i * step for i in range(count)], dtype=torch.float64).to(x.dtype)


def _known_gaps(cell) -> str | None:
    if cell.exporter == "dynamo" and cell.dtype == "float64" and cell.path == "start, end, step":
        return "torch's dynamo rule (kept) computes a float64 range in float32: a fractional step is 4e-7 off"
    return None


specs.register(
    specs.OpSpec(
        name="arange",
        torch_op="aten::arange",
        doc="aten::arange in float16/bfloat16/float64 -> Range in float64, Cast: ONNX's Range takes no half type, "
        "and a float64 range of a static size came out float32-accurate",
        lowerings=[
            specs.Lowering("standard", _arange, min_opset=11, note="float64 Range (Cast for half); others torch's rule")
        ],
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths={form: (lambda form=form: _Arange(form)) for form in ("end", "start, end", "start, end, step")},
        sample_inputs=_sample_inputs,
        input_names=("x",),
        reference=_reference,
        known_gaps=_known_gaps,
    )
)
