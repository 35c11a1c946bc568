"""Python face of opbridge's torch ops: wrappers, fake kernels, autograd.

The kernels and schemas are C++ (cpp/torch); everything that torch needs around
them is registered here, in Python, as torch.library recommends.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["my_add"]


def my_add(a: Tensor, b: Tensor) -> Tensor:
    """Return ``2 * a + b``: ``torch.ops.opbridge.my_add``.

    Args:
        a, b: CPU tensors of the same floating dtype (float32, float64 or float16)
            whose shapes broadcast together; any rank, empty and non-contiguous
            tensors included.

    Returns:
        A new contiguous tensor of the broadcast shape and the inputs' dtype.

    Differentiable in both inputs, traceable by ``torch.jit.script``/``trace``,
    ``torch.export`` and ``torch.compile``, and exportable to ONNX
    (see :func:`opbridge.onnx.export`).
    """
    return torch.ops.opbridge.my_add(a, b)


@torch.library.register_fake("opbridge::my_add")
def _my_add_fake(a: Tensor, b: Tensor) -> Tensor:
    torch._check(
        a.dtype == b.dtype,
        lambda: f"opbridge::my_add: a and b must have the same dtype, got a: {a.dtype} and b: {b.dtype}",
    )
    torch._check(
        a.dtype in (torch.float32, torch.float64, torch.float16),
        lambda: f"opbridge::my_add: expected float32, float64 or float16 tensors, got {a.dtype}",
    )
    shape = torch.broadcast_shapes(a.shape, b.shape)
    return a.new_empty(shape)


def my_add_backward(grad: Tensor, a_shape: torch.Size, b_shape: torch.Size, needs_input_grad) -> tuple:
    """Gradients of 2 * a + b, summed back over broadcast dimensions."""
    grad_a = (2 * grad).sum_to_size(a_shape) if needs_input_grad[0] else None
    grad_b = grad.sum_to_size(b_shape) if needs_input_grad[1] else None
    return grad_a, grad_b


def _my_add_setup_context(ctx, inputs, output) -> None:
    a, b = inputs
    ctx.a_shape, ctx.b_shape = a.shape, b.shape


def _my_add_autograd(ctx, grad: Tensor) -> tuple:
    return my_add_backward(grad, ctx.a_shape, ctx.b_shape, ctx.needs_input_grad)


torch.library.register_autograd("opbridge::my_add", _my_add_autograd, setup_context=_my_add_setup_context)
