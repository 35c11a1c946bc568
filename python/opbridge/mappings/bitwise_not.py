"""aten::bitwise_not -> ONNX BitwiseNot (integers, opset >= 18) or Not (bool).

torch's TorchScript-based exporter fails on bitwise_not of integers at every
opset (measured on torch 2.14), although ONNX has BitwiseNot since opset 18.
"""

from __future__ import annotations

import torch

from .. import specs
from ._unary import unary_module


def _bitwise_not(b, x):
    if b.exporter == "legacy" and x.type().scalarType() == "Bool":
        return b.op("Not", x)
    return b.op("BitwiseNot", x)


specs.register(
    specs.OpSpec(
        name="bitwise_not",
        torch_op="aten::bitwise_not",
        doc="aten::bitwise_not -> ONNX BitwiseNot (integers, opset >= 18) or Not (bool)",
        lowerings=[specs.Lowering("standard", _bitwise_not, min_opset=18, note="BitwiseNot (Not for bool)")],
        dtypes=(torch.int32, torch.int64),
        call_paths={"torch": unary_module(torch.bitwise_not)},
        sample_inputs=lambda dtype, operands, batch: (
            torch.randint(-1000, 1000, (batch, 3, 4), generator=torch.Generator().manual_seed(batch), dtype=dtype),
        ),
        input_names=("x",),
        reference=lambda x: torch.from_numpy(~x.numpy()),
    )
)
