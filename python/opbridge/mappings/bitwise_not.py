"""aten::bitwise_not -> ONNX BitwiseNot (integers, opset >= 18), ``-1 - x`` below 18, or Not (bool).

torch's TorchScript-based exporter fails on bitwise_not of integers at every
opset (measured on torch 2.14), although ONNX has BitwiseNot since opset 18;
below it, two's complement gives ``~x == -1 - x`` exactly (``255 - x`` for uint8).
"""

from __future__ import annotations

import torch

from .. import specs
from ._unary import unary_module


def _bitwise_not(b, x):
    dtype = b.dtype(x)
    if dtype == torch.bool:
        return b.op("Not", x)
    if b.opset >= 18:
        return b.op("BitwiseNot", x)
    all_ones = 255 if dtype == torch.uint8 else -1
    if b.exporter == "legacy":
        return b.op("Sub", b.op("Constant", value=torch.tensor(all_ones, dtype=dtype)), x)
    return b.op("Sub", b.op("CastLike", b.op("Constant", value_int=all_ones), x), x)


specs.register(
    specs.OpSpec(
        name="bitwise_not",
        torch_op="aten::bitwise_not",
        doc="aten::bitwise_not -> ONNX BitwiseNot (integers, opset >= 18; -1 - x below) or Not (bool)",
        lowerings=[
            specs.Lowering("standard", _bitwise_not, min_opset=9, note="BitwiseNot (opset >= 18), -1 - x below")
        ],
        dtypes=(torch.int32, torch.int64),
        call_paths={"torch": unary_module(torch.bitwise_not)},
        sample_inputs=lambda dtype, operands, batch: (
            torch.randint(-1000, 1000, (batch, 3, 4), generator=torch.Generator().manual_seed(batch), dtype=dtype),
        ),
        input_names=("x",),
        reference=lambda x: torch.from_numpy(~x.numpy()),
    )
)
