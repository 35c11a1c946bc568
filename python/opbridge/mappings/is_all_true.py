"""aten::_is_all_true for the dynamo exporter, which has no rule for it (torch 2.14.1: "No ONNX function found for
aten._is_all_true").

``torch._check_tensor_all`` -- transformers' ``torch_compilable_check`` while exporting -- leaves this op in the
exported program: RT-DETR v2, D-FINE and DEIMv2 check that their level sizes add up to the sequence length, so
none of them exported with ``dynamo=True``. The rule: no element is False (an empty tensor is all true, as in
torch): count the False elements, compare with zero.
"""

from __future__ import annotations

import torch

from .. import specs


def _is_all_true(b, self):
    falses = b.op("Cast", b.op("Not", b.op("Cast", self, to=9)), to=7)  # BOOL, negated, as INT64 counts
    total = b.op("ReduceSum", falses, keepdims=0)  # no axes: every element (0 for an empty tensor)
    return b.op("Equal", total, b.constant(0))


class _IsAllTrue(torch.nn.Module):
    def forward(self, x):
        return torch.ops.aten._is_all_true(x)


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    x = torch.rand(batch, 4, 5, generator=generator) > (0.5 if batch % 2 else -1.0)  # odd batch: some False
    return (x.to(dtype),)


def _known_gaps(cell) -> str | None:
    if cell.exporter == "dynamo" and specs.torch_version() < (2, 10):
        return (
            "torch 2.6's dynamo exporter decomposes aten::_is_all_true itself before translating, and its "
            "decomposition fails on dynamic sizes (SystemError in the reduction's dtype conversion): a loud failure "
            "in torch, seen on 2.6.0"
        )
    return None


def _reference(x):
    return torch.tensor(bool(x.numpy().all()))


specs.register(
    specs.OpSpec(
        name="_is_all_true",
        torch_op="aten::_is_all_true",
        doc="aten::_is_all_true -> Not, ReduceSum of the False count, Equal 0 (torch's dynamo exporter has no rule)",
        lowerings=[specs.Lowering("standard", _is_all_true, min_opset=9, note="Not, ReduceSum, Equal")],
        dtypes=(torch.bool,),
        call_paths={"op": _IsAllTrue},
        sample_inputs=_sample_inputs,
        input_names=("x",),
        reference=_reference,
        known_gaps=_known_gaps,
        dynamo_overrides_torch=True,
    )
)
