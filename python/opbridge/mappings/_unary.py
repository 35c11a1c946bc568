"""Helpers of the mappings of unary ATen ops: how the parity matrix calls them and their inputs."""

from __future__ import annotations

import torch

from .. import specs


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


def unary_spec(name: str, torch_fn, onnx_op: str, min_opset: int, domain_transform, reference, **extra) -> specs.OpSpec:
    return specs.register(
        specs.OpSpec(
            name=name,
            torch_op=f"aten::{name}",
            doc=f"aten::{name} -> ONNX {onnx_op}",
            lowerings=[specs.Lowering("standard", lambda b, x: b.op(onnx_op, x), min_opset=min_opset, note=onnx_op)],
            dtypes=extra.pop("dtypes", (torch.float32, torch.float64)),
            call_paths={"torch": unary_module(torch_fn)},
            sample_inputs=unary_inputs(domain_transform),
            input_names=("x",),
            reference=reference,
            **extra,
        )
    )
