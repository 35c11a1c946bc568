"""Python face of opbridge's torch ops: wrappers, fake kernels, autograd.

The kernels and schemas are C++ (cpp/torch); everything that torch needs around
them is registered here, in Python, as torch.library recommends.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["deform_conv2d", "my_add"]


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


def _pair(value, name: str) -> list[int]:
    if isinstance(value, int):
        return [value, value]
    values = [int(v) for v in value]
    if len(values) != 2:
        raise ValueError(f"opbridge.deform_conv2d: {name} must be an int or a pair of ints, got {value!r}")
    return values


def deform_conv2d(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride=(1, 1),
    padding=(0, 0),
    dilation=(1, 1),
    mask: Tensor | None = None,
) -> Tensor:
    """Deformable convolution v1 (``mask=None``) and v2: ``torch.ops.opbridge.deform_conv2d``.

    Same signature and semantics as ``torchvision.ops.deform_conv2d``:

    Args:
        input: ``[N, C_in, H, W]``.
        offset: ``[N, 2 * offset_groups * kh * kw, H_out, W_out]``, (dy, dx) per kernel tap.
        weight: ``[C_out, C_in / groups, kh, kw]``; ``groups`` follows from the shapes.
        bias: ``[C_out]`` or None.
        stride, padding, dilation: an int or a pair (height, width).
        mask: ``[N, offset_groups * kh * kw, H_out, W_out]`` or None.

    float32 or float64, CPU. Exports to ONNX ``DeformConv`` (opset >= 19), to standard
    ops below that, or to one ``opbridge::DeformConv2d`` node (see opbridge.onnx.export).
    Not differentiable (forward only).
    """
    return torch.ops.opbridge.deform_conv2d(
        input,
        offset,
        weight,
        bias,
        _pair(stride, "stride"),
        _pair(padding, "padding"),
        _pair(dilation, "dilation"),
        mask,
    )


@torch.library.register_fake("opbridge::deform_conv2d")
def _deform_conv2d_fake(input, offset, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), mask=None):
    # Defaults as in the schema: tracers drop trailing arguments left at their defaults.
    stride, padding, dilation = (
        _pair(v, n) for v, n in ((stride, "stride"), (padding, "padding"), (dilation, "dilation"))
    )
    torch._check(
        input.dim() == 4 and weight.dim() == 4 and offset.dim() == 4,
        lambda: (
            "opbridge::deform_conv2d: input, weight and offset must be 4-D, got shapes "
            f"{tuple(input.shape)}, {tuple(weight.shape)} and {tuple(offset.shape)}"
        ),
    )
    for name, tensor in (("offset", offset), ("weight", weight), ("bias", bias), ("mask", mask)):
        torch._check(
            tensor is None or tensor.dtype == input.dtype,
            lambda name=name, tensor=tensor: (
                f"opbridge::deform_conv2d: {name} must have the dtype of input ({input.dtype}), got {tensor.dtype}"
            ),
        )
    kernel_h, kernel_w = weight.shape[2], weight.shape[3]
    out_h = (input.shape[2] + 2 * padding[0] - dilation[0] * (kernel_h - 1) - 1) // stride[0] + 1
    out_w = (input.shape[3] + 2 * padding[1] - dilation[1] * (kernel_w - 1) - 1) // stride[1] + 1
    return input.new_empty((input.shape[0], weight.shape[0], out_h, out_w))
