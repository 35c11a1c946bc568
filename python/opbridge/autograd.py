"""The classic pattern: a torch.autograd.Function over the pybind11 kernel, with
a backward and a ``symbolic`` for the TorchScript-based ONNX exporter."""

from __future__ import annotations

import torch

from . import _C
from .ops import my_add_backward

__all__ = ["MyAddFunction"]


class MyAddFunction(torch.autograd.Function):
    """``MyAddFunction.apply(a, b) == 2 * a + b`` through ``opbridge._C.my_add``."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.a_shape, ctx.b_shape = a.shape, b.shape
        return _C.my_add(a, b)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return my_add_backward(grad, ctx.a_shape, ctx.b_shape, ctx.needs_input_grad)

    @staticmethod
    def symbolic(g, a, b):
        # The lowering (standard / custom / function) and opset come from the
        # export in progress; see opbridge.onnx.
        from .onnx import _legacy

        return _legacy.symbolic_for("my_add")(g, a, b)
