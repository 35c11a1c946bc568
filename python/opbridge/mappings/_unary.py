"""Helpers of the mappings of unary ATen ops: how the parity matrix calls them and their inputs."""

from __future__ import annotations

import torch

from .. import specs
from ..onnx.builder import ONNX_TYPES


def unary_module(fn):
    class Unary(torch.nn.Module):
        def forward(self, x):
            return fn(x)

    Unary.__name__ = f"Call_{fn.__name__}"
    return Unary


def unary_inputs(transform):
    def sample(dtype: torch.dtype, operands: str, batch: int) -> tuple[torch.Tensor]:
        x = torch.randn((batch, 3, 4), generator=torch.Generator().manual_seed(batch), dtype=torch.float64)
        return (transform(x).to(dtype),)

    return sample


def float_unary(onnx_op: str):
    """A lowering ``x -> onnx_op(x)`` that, as torch, computes integer and bool inputs in float32 (ONNX's math ops
    take floating types only)."""

    def build(b, x):
        try:
            floating = b.dtype(x).is_floating_point
        except specs.LoweringError:  # the exporter does not know the dtype: leave it as it is
            floating = True
        return b.op(onnx_op, x if floating else b.op("Cast", x, to=ONNX_TYPES[torch.float32]))

    return build


def unary_spec(name: str, torch_fn, onnx_op: str, min_opset: int, domain_transform, reference, **extra) -> specs.OpSpec:
    return specs.register(
        specs.OpSpec(
            name=name,
            torch_op=f"aten::{name}",
            doc=f"aten::{name} -> ONNX {onnx_op}",
            lowerings=[
                specs.Lowering("standard", specs.half_storage(float_unary(onnx_op)), min_opset=min_opset, note=onnx_op)
            ],
            dtypes=extra.pop("dtypes", (torch.float32, torch.float64, torch.float16, torch.bfloat16)),
            call_paths={"torch": unary_module(torch_fn)},
            sample_inputs=unary_inputs(domain_transform),
            input_names=("x",),
            reference=reference,
            **extra,
        )
    )
