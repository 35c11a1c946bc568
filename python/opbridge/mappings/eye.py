"""aten::eye for the TorchScript-based exporter: an identity of any dtype that ONNX Runtime runs.

torch's rule (torch 2.14.1) is ``EyeLike`` of zeros of the asked dtype, and ONNX Runtime has EyeLike kernels for
float, double, int32, int64 and uint64 only: ``torch.eye(n, dtype=torch.bool)`` (Grounding DINO's text attention
mask, computed in the graph when the prompt is an input of the model) exports and then fails to load ("Could not
find an implementation for EyeLike(9)"). This rule builds the identity in int64 and casts it to the asked dtype
(none where it is int64). Sizes may be traced (a dynamic size of the model's input). The dynamo exporter keeps its
own rule.
"""

from __future__ import annotations

import torch

from .. import specs
from ..onnx.builder import C10_DTYPES, ONNX_TYPES


def _eye(b, *args):
    # aten::eye(n, dtype, layout, device, pin_memory) or aten::eye.m(n, m, dtype, layout, device, pin_memory)
    n, m, dtype = (args[0], args[0], args[1]) if len(args) == 5 else args[:3]
    scalar_type = None if dtype is None or b.is_none(dtype) else b.value(dtype, "i")
    dtype = C10_DTYPES.get(6 if scalar_type is None else scalar_type)  # none given: torch's default, float32
    onnx_type = ONNX_TYPES.get(dtype)
    if onnx_type is None:
        raise specs.UnknownToExporter(f"aten::eye: dtype {scalar_type} has no ONNX type here")
    shape = b.op("Concat", *(b.op("Reshape", b.op("Cast", size, to=7), b.constant([1])) for size in (n, m)), axis=0)
    identity = b.op("EyeLike", b.op("ConstantOfShape", shape, value=torch.tensor([0], dtype=torch.int64)))
    return identity if onnx_type == 7 else b.op("Cast", identity, to=onnx_type)


class _Eye(torch.nn.Module):
    """An identity over the input's last dims (sizes the export traces), as a mask or as values."""

    def __init__(self, mask: bool) -> None:
        super().__init__()
        self.mask = mask

    def forward(self, x):
        if self.mask:
            identity = torch.eye(x.shape[-1], dtype=torch.bool)
        else:
            identity = torch.eye(x.shape[-2], x.shape[-1], dtype=x.dtype)
        if x.dtype in specs.HALF_DTYPES:  # the rest in float32: ORT's CPU has no bfloat16 Where, Add
            wide = x.float()
            out = torch.where(identity, wide, torch.zeros_like(wide)) if self.mask else wide + identity.float()
            return out.to(x.dtype)
        return torch.where(identity, x, torch.zeros_like(x)) if self.mask else x + identity


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    return (torch.randn(batch, 4, 4, generator=generator, dtype=torch.float64).to(dtype),)


def _reference(x, path: str = "mask"):
    identity = torch.from_numpy(__import__("numpy").eye(x.shape[-1])).to(x.dtype)
    return x * identity if path == "mask" else x + identity


specs.register(
    specs.OpSpec(
        name="eye",
        torch_op="aten::eye",
        doc="aten::eye -> EyeLike of int64 zeros, Cast to the asked dtype (torch's rule is EyeLike of that dtype, "
        "which ONNX Runtime has no bool kernel for)",
        lowerings=[specs.Lowering("standard", _eye, min_opset=9, note="ConstantOfShape, EyeLike, Cast")],
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths={"mask": lambda: _Eye(mask=True), "values": lambda: _Eye(mask=False)},
        sample_inputs=_sample_inputs,
        input_names=("x",),
        reference=_reference,
    )
)
