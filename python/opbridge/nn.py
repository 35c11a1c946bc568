"""nn.Module twins of opbridge's ops."""

from __future__ import annotations

import math

import torch

from . import ops

__all__ = ["DeformConv2d", "MyAdd"]


class MyAdd(torch.nn.Module):
    """``MyAdd()(a, b) == 2 * a + b``; see :func:`opbridge.my_add`."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ops.my_add(a, b)


class DeformConv2d(torch.nn.Module):
    """``torchvision.ops.DeformConv2d``'s twin over :func:`opbridge.deform_conv2d`.

    ``forward(input, offset, mask=None)``; the offset (and mask) usually come
    from a regular convolution of the input.
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1, groups: int = 1,
        bias: bool = True,
    ) -> None:  # fmt: skip
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"groups={groups} must divide in_channels={in_channels} and out_channels={out_channels}")
        kernel = ops._pair(kernel_size, "kernel_size")
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.weight = torch.nn.Parameter(torch.empty(out_channels, in_channels // groups, *kernel))
        self.bias = torch.nn.Parameter(torch.empty(out_channels)) if bias else None
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.weight[0].numel())
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return ops.deform_conv2d(input, offset, self.weight, self.bias, self.stride, self.padding, self.dilation, mask)
