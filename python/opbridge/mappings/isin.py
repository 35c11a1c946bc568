"""aten::isin for the TorchScript-based exporter, which has no rule for it (torch 2.14.1: "Exporting the operator
'aten::isin' to ONNX opset version 17 is not supported").

transformers' Grounding DINO and MM Grounding DINO call it on the prompt's token ids (``torch.isin(input_ids,
special_tokens)``): exported with the prompt as an input of the model, they fail without this rule. Each element is
compared with every test element (Equal, broadcast over a new last axis) and matches are counted (ReduceSum > 0);
``invert`` negates that. Both operands take their promoted dtype first, as torch compares them. The dynamo exporter
gets the same rule: its own decomposes isin into a sort and ``aten::searchsorted`` where a size is dynamic, which it
cannot translate ("No ONNX function found for aten.searchsorted.Tensor", torch 2.14.1).
"""

from __future__ import annotations

import numpy as np
import torch

from .. import specs


def _isin(b, elements, test_elements, assume_unique=None, invert=None):
    inverted = invert is not None and not b.is_none(invert) and bool(b.value(invert, "b"))
    try:
        common = torch.promote_types(b.dtype(elements, "elements"), b.dtype(test_elements, "test_elements"))
        elements, test_elements = (t if b.dtype(t) == common else b.cast(t, common) for t in (elements, test_elements))
    except specs.UnknownToExporter:
        if b.opset < 15:
            raise
        test_elements = b.op("CastLike", test_elements, elements)
    flat = b.op("Reshape", test_elements, b.constant([-1]))  # a scalar too
    equal = b.op("Equal", b.unsqueeze(elements, -1), flat)  # [..., K]
    found = b.op("Greater", b.reduce("Sum", b.op("Cast", equal, to=7), [-1]), b.constant(0))
    return b.op("Not", found) if inverted else found


class _IsIn(torch.nn.Module):
    def __init__(self, invert: bool = False) -> None:
        super().__init__()
        self.invert = invert

    def forward(self, elements, test_elements):
        return torch.isin(elements, test_elements, invert=self.invert)


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    elements = torch.randint(0, 12, (batch, 7), generator=generator).to(dtype)
    test_elements = torch.tensor([3, 5, 11, 40], dtype=dtype)  # 40: in no row
    return elements, test_elements


def _reference(elements, test_elements, path: str = "tensor"):
    return torch.from_numpy(np.isin(elements.numpy(), test_elements.numpy(), invert=path == "invert"))


specs.register(
    specs.OpSpec(
        name="isin",
        torch_op="aten::isin.Tensor_Tensor",
        doc="aten::isin -> Equal against every test element, ReduceSum > 0 (Not for invert); the TorchScript-based "
        "exporter has no rule",
        lowerings=[
            specs.Lowering(
                "standard",
                specs.half_storage(_isin, floating_output=False),
                min_opset=11,
                note="Unsqueeze, Equal, ReduceSum, Greater",
            )
        ],
        dtypes=(torch.int64, torch.float32, torch.float16, torch.bfloat16),
        call_paths={"tensor": _IsIn, "invert": lambda: _IsIn(invert=True)},
        sample_inputs=_sample_inputs,
        input_names=("elements", "test_elements"),
        reference=_reference,
        dynamo_overrides_torch=True,
    )
)
