"""aten::linspace for the TorchScript-based exporter: one step where the step count is 1.

torch's rule (torch 2.14.1) is ``start + arange(steps) * (end - start) / (steps - 1)``: with a traced step count
that is 1 at run time (a feature map one pixel high or wide: Deformable DETR's reference points on its last level,
``torch.linspace(0.5, h - 0.5, h)``) the step is 0 / 0 and the output NaN where torch gives ``[start]``. Without
opbridge such a model often fails to load for another reason (a float64 grid that ONNX Runtime's GridSample does not
take), which opbridge's grid_sampler rule mends, so the NaN would reach the output. This rule keeps torch's rule and
takes ``start`` where the count is 1 (``Where``: the NaN branch is not selected), and casts to the asked dtype
(torch's rule ignores it: float64 out of a float32 linspace of constant ends, float32 out of a float64 one of a
traced count). The dynamo exporter keeps its own rule.
"""

from __future__ import annotations

import torch

from .. import specs
from ..onnx.builder import C10_DTYPES, ONNX_TYPES


def _linspace(b, start, end, steps, dtype, *rest):
    # aten::linspace(start, end, steps, dtype, layout, device, pin_memory)
    from ..onnx import _torch_hooks

    builtin = _torch_hooks.legacy_builtin_symbolic("aten::linspace", b.opset)
    if builtin is None:
        raise specs.UnknownToExporter(f"aten::linspace: torch has no rule at opset {b.opset}")
    asked = torch.get_default_dtype() if b.is_none(dtype) else C10_DTYPES.get(b.value(dtype, "i"))
    if asked not in ONNX_TYPES:
        raise specs.UnknownToExporter(f"aten::linspace: dtype {asked} has no ONNX type here")
    # Half dtypes select in float32 and round once (ONNX Runtime's CPU has no bfloat16 Where).
    inner = torch.float32 if asked in specs.HALF_DTYPES else asked
    out = b.op("Cast", builtin(b.g, start, end, steps, dtype, *rest), to=ONNX_TYPES[inner])
    count = b.constant_value(steps)
    if count is None or int(count) == 1:
        first = b.op("Cast", b.op("Reshape", start, b.constant([1])), to=ONNX_TYPES[inner])
        one = b.op("Equal", b.op("Cast", steps, to=ONNX_TYPES[torch.int64]), b.constant(1))  # a traced count: any int
        out = b.op("Where", one, first, out)
    return out if inner == asked else b.op("Cast", out, to=ONNX_TYPES[asked])


class _Linspace(torch.nn.Module):
    """Cell centres along a traced size: ``6 - batch`` steps (4 at the export's batch of 2, 1 at the run's 5)."""

    def forward(self, x):
        steps = 6 - x.shape[0]
        points = torch.linspace(0.5, steps - 0.5, steps, dtype=x.dtype)
        if x.dtype in specs.HALF_DTYPES:  # the rest in float32: ORT's CPU has no bfloat16 ReduceSum, Add
            return (x.float().sum(dim=(1, 2)).mean() * 0 + points.float()).to(x.dtype)
        return x.sum(dim=(1, 2)).mean() * 0 + points


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    return (torch.randn(batch, 3, 2, generator=generator, dtype=torch.float64).to(dtype),)


def _reference(x):
    steps = 6 - x.shape[0]
    return torch.tensor([0.5 + i for i in range(steps)], dtype=torch.float64).to(x.dtype)


def _known_gaps(cell) -> str | None:
    if cell.exporter == "dynamo":
        return "torch.export specializes a linspace's step count (an int): the dynamic batch is exported static"
    return None


specs.register(
    specs.OpSpec(
        name="linspace",
        torch_op="aten::linspace",
        doc="aten::linspace -> torch's rule, with Where(steps == 1, start, ...): torch's divides 0 by 0 there",
        lowerings=[specs.Lowering("standard", _linspace, min_opset=9, note="torch's rule; Where for one step")],
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths={"traced count": _Linspace},
        sample_inputs=_sample_inputs,
        input_names=("x",),
        reference=_reference,
        known_gaps=_known_gaps,
    )
)
