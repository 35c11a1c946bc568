"""aten::outer (torch.outer / torch.ger) below opset 12, where torch's TorchScript-based exporter has no rule
("Support for this operator was added in version 12": its rule is an Einsum).

transformers' RT-DETR family builds its 2-D sine position embedding with ``torch.outer``: RT-DETR, RT-DETR v2,
D-FINE, DEIMv2 and PP-DocLayout v2-v4 failed at opset 11 on it. The rule: ``self[:, None] * other[None, :]``
(Unsqueeze, Mul), the operands first cast to their promoted dtype as torch does. From opset 12 on, torch's own
rule runs.
"""

from __future__ import annotations

import torch

from .. import specs
from ..onnx.builder import ONNX_TYPES


def _outer(b, self, other):
    promoted = torch.promote_types(b.dtype(self, "self"), b.dtype(other, "vec2"))
    left, right = (x if b.dtype(x) == promoted else b.op("Cast", x, to=ONNX_TYPES[promoted]) for x in (self, other))
    return b.op("Mul", b.op("Unsqueeze", left, axes=[1]), b.op("Unsqueeze", right, axes=[0]))


class _Outer(torch.nn.Module):
    def forward(self, a, b):
        return torch.outer(a, b)


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    a = torch.randn(batch, generator=generator, dtype=torch.float64) * 10
    b = torch.randn(5, generator=generator, dtype=torch.float64) * 10
    return a.to(dtype), b.to(dtype)


def _reference(a, b):
    return torch.from_numpy(a.numpy()[:, None] * b.numpy()[None, :])


specs.register(
    specs.OpSpec(
        name="outer",
        torch_op="aten::outer",
        doc="aten::outer below opset 12 -> Unsqueeze, Mul (torch's TorchScript-exporter rule needs Einsum, opset 12)",
        lowerings=[specs.Lowering("standard", _outer, min_opset=9, max_opset=11, note="Unsqueeze, Mul")],
        dtypes=(torch.float32, torch.float16, torch.bfloat16, torch.int64),
        call_paths={"torch": _Outer},
        sample_inputs=_sample_inputs,
        input_names=("a", "b"),
        reference=_reference,
    )
)
