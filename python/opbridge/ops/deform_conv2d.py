"""Deformable convolution: opbridge::deform_conv2d, and the export rules of torchvision::deform_conv2d.

The op's pieces, each named after it: the kernel (cpp/kernels/deform_conv2d.h),
its schema and CPU adapter (cpp/torch/deform_conv2d.cpp), its ORT adapter
(cpp/ort/deform_conv2d.cc), and this module: the Python wrapper (torchvision's
signature and semantics), fake kernel, ``nn.Module`` twin, lowerings and specs.

Both torch ops lower the same three ways:

* ``standard``, opset >= 19: ONNX ``DeformConv`` (ONNX Runtime has a kernel from 1.25);
* ``standard``, opset < 19: a decomposition into standard ops (bilinear sampling
  with Gather, then a grouped MatMul) that keeps batch and spatial sizes dynamic,
  for runtimes that can load no custom library;
* ``custom``: one ``opbridge::DeformConv2d`` node with DeformConv's inputs and
  attributes, run by opbridge's ORT library (any ORT >= 1.16, any opset).
"""

from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor

from .. import _autocast, _checks, _eager, specs
from ..specs import LoweringError

#: Public names: ``opbridge.<name>``; ``NN_MODULES`` go to ``opbridge.nn``.
__all__ = ["deform_conv2d"]
NN_MODULES = ["DeformConv2d", "ModulatedDeformConv2dPack", "DeformConv2dPack"]


# --- torch ---------------------------------------------------------------------------------------------------------


_OP = "opbridge.deform_conv2d"
IntPair = Union[int, tuple[int, int], list[int]]  # noqa: UP007  (TorchScript reads typing.Union, not |)


def _pair(value: IntPair) -> list[int]:
    """An int or a pair as a list of two (TorchScript-compatible; the eager path checks types first)."""
    if isinstance(value, int):
        return [value, value]
    if isinstance(value, list):
        return [value[0], value[1]]
    return [value[0], value[1]]  # a tuple (TorchScript needs each refined type spelled out)


def deform_conv2d(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,  # noqa: UP045  (TorchScript)
    stride: IntPair = (1, 1),
    padding: IntPair = (0, 0),
    dilation: IntPair = (1, 1),
    mask: Optional[Tensor] = None,  # noqa: UP045  (TorchScript)
) -> Tensor:
    """Deformable convolution v1 (``mask=None``) and v2: ``torch.ops.opbridge.deform_conv2d``.

    Same signature and semantics as ``torchvision.ops.deform_conv2d``:

    Args:
        input: ``[N, C_in, H, W]``.
        offset: ``[N, 2 * offset_groups * kh * kw, H_out, W_out]``, (dy, dx) per kernel tap.
        weight: ``[C_out, C_in / groups, kh, kw]``; ``groups`` follows from the shapes.
        bias: ``[C_out]`` or None.
        stride, padding, dilation: an int or a pair of ints (height, width); stride and dilation >= 1,
            padding >= 0. Floats and bools are refused, as torchvision does.
        mask: ``[N, offset_groups * kh * kw, H_out, W_out]`` or None.

    Returns:
        ``[N, C_out, H_out, W_out]`` of the input's dtype.

    Raises:
        TypeError: a required tensor is missing or not a tensor; stride, padding or dilation is not an int or
            a pair of ints.
        ValueError: stride or dilation below 1, padding below 0.
        RuntimeError: input is not float32/float64/float16/bfloat16, weight or bias lacks input's dtype,
            offset or mask has neither input's dtype nor (beside a half input) float32, a tensor is not on the
            CPU (or, for meta and fake tensors, not all on one device), or the shapes disagree (the message gives
            the numbers).

    float32, float64, float16 or bfloat16 (offset and mask may stay float32 beside a half input), CPU or CUDA.
    Differentiable in input, offset, weight, bias and mask (the backward is a C++ kernel, deterministic on the CPU;
    double backward raises). Scriptable (``torch.jit.script``), traceable by
    ``torch.export`` and ``torch.compile``. Exports to ONNX ``DeformConv`` (opset >= 19), to standard ops
    below that, or to one ``opbridge::DeformConv2d`` node (see :mod:`opbridge.onnx`).

    Memory: the forward (here and in the ORT node) copies the input channels-last and the weight into scratch memory
    that the calling thread keeps for its next call, and each worker thread its block of sampled columns (about 4 MiB);
    at most 512 MiB a block, larger requests are freed after the call (docs/architecture.md).

    GEMMs: float32 products run on oneDNN (torch's ``mkldnn::_linear_pointwise``) on x86 CPUs that are not Intel's
    and have AVX-512, where MKL runs AVX2 code (about twice as fast there), and on torch's BLAS (``aten::mm``)
    elsewhere and for float64. The environment variable ``OPBRIDGE_CPU_GEMM=blas`` or ``onednn``, read once per
    process, overrides the choice. Half inputs compute in float32 and round once (docs/api.md), except bfloat16 on
    the CPU where :func:`cpu_bf16_products` is true (CPUs with AVX512-BF16): the sampled columns are rounded to
    bfloat16 and multiplied in bfloat16 (the library's GEMM: AMX tiles on CPUs with them, else ``vdpbf16ps``; float32
    sums, bias added before the output's rounding; the ORT library's bfloat16 node runs the same), 1.7-1.85x the
    float32 forward on AMD EPYC Zen 5 and 1.8-3.5x on an Intel Xeon with AMX (one thread, 2026-11-29), and the
    output carries two roundings.
    ``OPBRIDGE_CPU_BF16_GEMM=0`` (or 1) decides.
    """
    if not torch.jit.is_scripting():
        for name, value in (("input", input), ("offset", offset), ("weight", weight)):
            _checks.tensor(_OP, name, value)
        _checks.tensor(_OP, "bias", bias, optional=True)
        _checks.tensor(_OP, "mask", mask, optional=True)
        stride = _checks.int_pair(_OP, "stride", stride, minimum=1)
        padding = _checks.int_pair(_OP, "padding", padding, minimum=0)
        dilation = _checks.int_pair(_OP, "dilation", dilation, minimum=1)
        tensors = (input, offset, weight, bias, mask)
        if _eager.plain(tensors):  # host time: see opbridge/_eager.py
            args = (input, offset, weight, bias, _pair(stride), _pair(padding), _pair(dilation), mask)
            return _eager.run(_EagerFunction, torch.ops.opbridge.deform_conv2d.default, args, tensors)
    return torch.ops.opbridge.deform_conv2d(
        input, offset, weight, bias, _pair(stride), _pair(padding), _pair(dilation), mask
    )


def cpu_bf16_products() -> bool:
    """Whether this process's CPU op multiplies bfloat16 input in bfloat16: its sampled columns rounded to bfloat16,
    then a bfloat16 GEMM with float32 sums (two roundings: the columns' and the output's; the float32 path rounds
    once). The choice of kernels/linear_bf16.h (bf16_products_chosen), which the ORT library's bfloat16 deformable
    convolution nodes make too, read the same way: ``OPBRIDGE_CPU_BF16_GEMM=0`` or ``1`` if
    set (the library reads it once, at its first bfloat16 call), else whether the CPU has AVX512-BF16. The backward
    computes in float32 either way."""
    forced = os.environ.get("OPBRIDGE_CPU_BF16_GEMM")
    if forced in ("0", "1"):
        return forced == "1"
    if platform.machine() not in ("x86_64", "AMD64", "i386", "i686"):
        return False
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return " avx512_bf16" in cpuinfo.read()
    except OSError:
        return False


@torch.library.register_fake("opbridge::deform_conv2d")
def _deform_conv2d_fake(input, offset, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), mask=None):
    # Defaults as in the schema: tracers drop trailing arguments left at their defaults.
    op = "opbridge::deform_conv2d"
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    _checks.one_device(op, input=input, offset=offset, weight=weight, bias=bias, mask=mask)
    torch._check(
        input.dim() == 4 and weight.dim() == 4 and offset.dim() == 4,
        lambda: (
            f"{op}: input, weight and offset must be 4-D, got shapes "
            f"{tuple(input.shape)}, {tuple(weight.shape)} and {tuple(offset.shape)}"
        ),
    )
    _checks.float_storage(op, "input", input)
    for name, tensor, precise in (("offset", offset, True), ("weight", weight, False), ("bias", bias, False),
                                  ("mask", mask, True)):  # fmt: skip
        _checks.same_dtype(op, "input", input, name, tensor, precise)
    torch._check(
        weight.shape[1] > 0 and input.shape[1] % weight.shape[1] == 0,
        lambda: (
            f"{op}: weight.shape[1] (in_channels / groups = {weight.shape[1]}) must divide the {input.shape[1]} "
            f"channels of input; got input of shape {tuple(input.shape)} and weight of shape {tuple(weight.shape)}"
        ),
    )
    kernel_h, kernel_w = weight.shape[2], weight.shape[3]
    out_h = (input.shape[2] + 2 * padding[0] - dilation[0] * (kernel_h - 1) - 1) // stride[0] + 1
    out_w = (input.shape[3] + 2 * padding[1] - dilation[1] * (kernel_w - 1) - 1) // stride[1] + 1
    return input.new_empty((input.shape[0], weight.shape[0], out_h, out_w))


AUTOCAST = _autocast.Rule("native", precise=(1, 7))  # offset, mask in float32
_autocast.register("opbridge::deform_conv2d", AUTOCAST)


@torch.library.register_fake("opbridge::deform_conv2d_backward")
def _deform_conv2d_backward_fake(grad_out, input, offset, weight, bias, stride, padding, dilation, mask):
    _checks.one_device("opbridge::deform_conv2d_backward", grad_out=grad_out, input=input, offset=offset,
                       weight=weight, bias=bias, mask=mask)  # fmt: skip
    return (
        torch.empty_like(input, memory_format=torch.contiguous_format),
        torch.empty_like(offset, memory_format=torch.contiguous_format),
        torch.empty_like(weight, memory_format=torch.contiguous_format),
        weight.new_empty((weight.shape[0],) if bias is not None else (0,)),
        torch.empty_like(mask, memory_format=torch.contiguous_format) if mask is not None else input.new_empty((0,)),
    )


def _setup_context(ctx, inputs, output) -> None:
    input, offset, weight, bias, stride, padding, dilation, mask = inputs
    ctx.save_for_backward(input, offset, weight, bias, mask)
    ctx.geometry = (_pair(stride), _pair(padding), _pair(dilation))


def _backward(ctx, grad: Tensor):
    input, offset, weight, bias, mask = ctx.saved_tensors
    stride, padding, dilation = ctx.geometry
    _checks.alert_not_deterministic("opbridge::deform_conv2d_backward", input)
    grads = torch.ops.opbridge.deform_conv2d_backward(
        grad, input, offset, weight, bias, stride, padding, dilation, mask
    )
    grad_input, grad_offset, grad_weight, grad_bias, grad_mask = grads
    needs = ctx.needs_input_grad
    return (
        grad_input if needs[0] else None,
        grad_offset if needs[1] else None,
        grad_weight if needs[2] else None,
        grad_bias if bias is not None and needs[3] else None,
        None,
        None,
        None,
        grad_mask if mask is not None and needs[7] else None,
    )


torch.library.register_autograd("opbridge::deform_conv2d", _backward, setup_context=_setup_context)


class _EagerFunction(torch.autograd.Function):
    """The registered autograd as a plain Function, for the wrapper's eager calls (opbridge/_eager.py)."""

    @staticmethod
    def forward(ctx, input, offset, weight, bias, stride, padding, dilation, mask):
        _setup_context(ctx, (input, offset, weight, bias, stride, padding, dilation, mask), None)
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.opbridge.deform_conv2d.default(
                input, offset, weight, bias, stride, padding, dilation, mask
            )

    backward = staticmethod(_backward)


def _no_double_backward(ctx, *grads):
    raise RuntimeError(
        "opbridge::deform_conv2d: gradients of its gradients (double backward) are not supported; compute the "
        "second-order terms another way (e.g. torch.func with a finite-difference estimate) or leave "
        "create_graph=False"
    )


torch.library.register_autograd(
    "opbridge::deform_conv2d_backward", _no_double_backward, setup_context=lambda ctx, inputs, output: None
)


class DeformConv2d(torch.nn.Module):
    """``torchvision.ops.DeformConv2d``'s drop-in twin over :func:`opbridge.deform_conv2d`: the same arguments,
    defaults, attributes (``in_channels``, ``out_channels``, ``kernel_size``, ``stride``, ``padding``,
    ``dilation``, ``groups``), initialisation (``reset_parameters``) and ``state_dict`` keys (``weight``, and
    ``bias``, registered as None with ``bias=False``), so checkpoints load both ways.

    ``forward(input, offset, mask=None)``; the offset (and mask) usually come from a regular convolution of
    the input. Scriptable.

    Raises:
        TypeError: a size argument is not an int (or a pair of ints).
        ValueError: ``groups`` does not divide ``in_channels`` and ``out_channels``, or a size is out of range.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: IntPair,
        stride: IntPair = 1,
        padding: IntPair = 0,
        dilation: IntPair = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__()
        op = "opbridge.nn.DeformConv2d"
        in_channels, out_channels, groups = (
            _checks.int_pair(op, name, (value, value), minimum=1)[0]  # an int >= 1, as a Python int
            for name, value in (("in_channels", in_channels), ("out_channels", out_channels), ("groups", groups))
        )
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"{op}: groups={groups} must divide in_channels={in_channels} and out_channels={out_channels}"
            )
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = tuple(_checks.int_pair(op, "kernel_size", kernel_size, minimum=1))
        self.stride = tuple(_checks.int_pair(op, "stride", stride, minimum=1))
        self.padding = tuple(_checks.int_pair(op, "padding", padding, minimum=0))
        self.dilation = tuple(_checks.int_pair(op, "dilation", dilation, minimum=1))
        self.weight = torch.nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torchvision's (and ``nn.Conv2d``'s) initialisation: Kaiming-uniform weight, uniform bias."""
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.weight[0].numel())
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor, offset: Tensor, mask: Optional[Tensor] = None) -> Tensor:  # noqa: UP045
        return deform_conv2d(input, offset, self.weight, self.bias, self.stride, self.padding, self.dilation, mask)

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        text += f", padding={self.padding}" if self.padding != (0, 0) else ""
        text += f", dilation={self.dilation}" if self.dilation != (1, 1) else ""
        text += f", groups={self.groups}" if self.groups != 1 else ""
        return text + (", bias=False" if self.bias is None else "")


class _MMCVPack(DeformConv2d):
    """What mmcv's ``DeformConv2dPack`` (DCNv1) and ``ModulatedDeformConv2dPack`` (DCNv2) share: a deformable
    convolution that predicts its own offsets (and mask) with a regular convolution of its input, ``conv_offset``.
    Arguments, attributes (``deform_groups``), initialisation and ``state_dict`` keys (``weight``, ``bias``,
    ``conv_offset.weight``, ``conv_offset.bias``) are mmcv's, so mmcv checkpoints (mmdet, mmseg, mmpose, ...)
    load without mmcv; the arithmetic is opbridge's op (offset channels as mmcv's and torchvision's: (dy, dx) per
    kernel position, per offset group)."""

    _version = 2  # mmcv's layers' version (its "<layer>_offset" keys of version 1 cannot be renamed by a layer on
    # torch >= 2.1, which hands each module only the keys under its own prefix)
    _maps_per_position = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntPair, stride: IntPair = 1,
                 padding: IntPair = 0, dilation: IntPair = 1, groups: int = 1, deform_groups: int = 1,
                 bias: bool | str = True, deformable_groups: int | None = None) -> None:  # fmt: skip
        op = f"opbridge.nn.{type(self).__name__}"
        if deformable_groups is not None:  # mmcv's deprecated name
            deform_groups = deformable_groups
        deform_groups = _checks.int_pair(op, "deform_groups", (deform_groups, deform_groups), minimum=1)[0]
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bool(bias))
        if self.in_channels % deform_groups:
            raise ValueError(f"{op}: deform_groups={deform_groups} must divide in_channels={self.in_channels}")
        self.deform_groups = deform_groups
        maps = deform_groups * self._maps_per_position * self.kernel_size[0] * self.kernel_size[1]
        self.conv_offset = torch.nn.Conv2d(
            self.in_channels, maps, self.kernel_size, self.stride, self.padding, self.dilation, bias=True
        )
        self.init_weights()

    def reset_parameters(self) -> None:
        self.init_weights()

    def init_weights(self) -> None:
        """mmcv's: weight uniform in +-1/sqrt(in_channels * kh * kw), zero bias, zero ``conv_offset`` (the
        convolution starts as a regular one: zero offsets, and mask 0.5 for DCNv2)."""
        bound = 1.0 / math.sqrt(self.in_channels * self.kernel_size[0] * self.kernel_size[1])
        torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)
        if hasattr(self, "conv_offset"):
            torch.nn.init.zeros_(self.conv_offset.weight)
            torch.nn.init.zeros_(self.conv_offset.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", deform_groups={self.deform_groups}" if self.deform_groups != 1 else "")


class ModulatedDeformConv2dPack(_MMCVPack):
    """mmcv's ``ModulatedDeformConv2dPack`` (registered there as ``DCNv2``) on opbridge's op: ``forward(x)``;
    ``conv_offset`` gives ``3 * deform_groups * kh * kw`` maps, split in three: the first two thirds are the
    offsets, the last third the mask through a sigmoid. ``bias`` defaults to True (mmcv's ``"auto"`` reads as
    True). See :class:`DeformConv2dPack` for DCNv1."""

    _maps_per_position = 3

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        first, second, mask = torch.chunk(self.conv_offset(x), 3, dim=1)
        offset = torch.cat((first, second), dim=1)
        return deform_conv2d(x, offset, self.weight, self.bias, self.stride, self.padding, self.dilation,
                             torch.sigmoid(mask))  # fmt: skip


class DeformConv2dPack(_MMCVPack):
    """mmcv's ``DeformConv2dPack`` (DCNv1) on opbridge's op: ``forward(x)``; ``conv_offset`` gives the
    ``2 * deform_groups * kh * kw`` offsets; no mask. mmcv's DCNv1 has no bias (``bias=True`` raises there):
    the default here is ``bias=False`` as in mmcv, and True is allowed."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntPair, stride: IntPair = 1,
                 padding: IntPair = 0, dilation: IntPair = 1, groups: int = 1, deform_groups: int = 1,
                 bias: bool = False, deformable_groups: int | None = None, im2col_step: int = 32) -> None:  # fmt: skip
        # im2col_step: mmcv's CUDA batching knob, accepted for its configs, no effect here.
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, deform_groups,
                         bias, deformable_groups)  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        return deform_conv2d(x, self.conv_offset(x), self.weight, self.bias, self.stride, self.padding,
                             self.dilation)  # fmt: skip


# --- ONNX ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attributes:
    """The convolution's parameters; a size the exporter does not know is None (module code that reads sizes
    from traced shapes, or inputs exported with every dimension dynamic)."""

    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int | None
    offset_groups: int | None
    kernel: tuple[int, int] | None
    out_channels: int | None
    in_channels: int | None

    def onnx(self, unknown_groups: str | None = None) -> dict:
        """The ONNX DeformConv attributes. A group count the exporter does not know is written as 0 (inferred
        from the shapes at run time by opbridge's ORT kernel) for the custom node; ONNX DeformConv needs the
        number: ``unknown_groups`` names the lowering for the error."""
        if unknown_groups is not None and (self.groups is None or self.offset_groups is None):
            raise LoweringError(
                f"deform_conv2d export ({unknown_groups}): ONNX DeformConv's 'group' and 'offset_group' attributes "
                "must be numbers in the model, and they follow from the channel counts (input.shape[1] / "
                "weight.shape[1], offset.shape[1] / (2 * kh * kw)), which the exporter does not know here "
                f"(groups={self.groups}, offset_groups={self.offset_groups}). Keep the channel dims static (out of "
                "dynamic_axes), or export with lowering='custom', whose node infers them at run time."
            )
        attributes = {
            "strides": list(self.stride),
            "pads": [self.padding[0], self.padding[1], self.padding[0], self.padding[1]],
            "dilations": list(self.dilation),
            "group": 0 if self.groups is None else self.groups,
            "offset_group": 0 if self.offset_groups is None else self.offset_groups,
        }
        if self.kernel is not None:  # optional in ONNX: taken from the weight's shape
            attributes["kernel_shape"] = list(self.kernel)
        return attributes


def _ints(value) -> list[int]:
    return [int(value), int(value)] if isinstance(value, int) else [int(v) for v in value]


def _dims(b, value) -> list[int | None]:
    """The 4 sizes the exporter knows (None where it does not; all None where not even the rank is known: the
    op itself requires 4-D tensors)."""
    shape = b.static_shape(value)
    return list(shape) if shape is not None and len(shape) == 4 else [None] * 4


def _attributes(b, x, weight, offset, stride, padding, dilation, groups=None, offset_groups=None) -> Attributes:
    x_shape, w_shape, o_shape = _dims(b, x), _dims(b, weight), _dims(b, offset)
    kernel = (w_shape[2], w_shape[3]) if None not in w_shape[2:] else None
    if groups is None and x_shape[1] is not None and w_shape[1]:
        groups = x_shape[1] // w_shape[1]
    if offset_groups is None and o_shape[1] is not None and kernel is not None:
        offset_groups = o_shape[1] // (2 * kernel[0] * kernel[1])
    return Attributes(
        tuple(stride), tuple(padding), tuple(dilation), groups, offset_groups, kernel, w_shape[0], x_shape[1]
    )


def _out_sizes(b, x, a: Attributes) -> list[int | None]:
    shape = _dims(b, x)
    sizes = [shape[0], a.out_channels]
    for axis in (0, 1):
        size = shape[2 + axis]
        if size is None or a.kernel is None:
            sizes.append(None)
            continue
        span = a.dilation[axis] * (a.kernel[axis] - 1) + 1
        sizes.append((size + 2 * a.padding[axis] - span) // a.stride[axis] + 1)
    return sizes


def _deform_conv_node(b, op_type, domain, x, weight, offset, bias, mask, a: Attributes):
    inputs = [x, weight, offset]
    if bias is None and mask is not None:  # B precedes mask in DeformConv's inputs
        bias = b.zeros(a.out_channels, like=x) if a.out_channels is not None else _zero_bias(b, weight)
    if bias is not None:
        inputs.append(bias)
    if mask is not None:
        inputs.append(mask)
    out = b.op(op_type, *inputs, domain=domain, **a.onnx(None if domain else "ONNX DeformConv"))
    b.set_type(out, x, _out_sizes(b, x, a))
    return out


def _zero_bias(b, weight):
    """Zeros [weight.shape[0]] of weight's element type, sized at run time."""
    if b.opset < 15:
        raise LoweringError(
            "deform_conv2d export: a mask without a bias needs a zero bias of out_channels (weight.shape[0]) "
            "elements, and the exporter does not know that size here; keep weight's shape static, or export at "
            "opset >= 15"
        )
    channels = b.op("Gather", b.op("Shape", weight), b.constant([0]), axis=0)
    return b.op("CastLike", b.op("ConstantOfShape", channels), weight)


def _decomposed(b, x, weight, offset, bias, mask, a: Attributes):
    """DeformConv from standard ops (opset >= 9), dynamic batch and spatial sizes.

    Follows torchvision: the sample of channel c at kernel tap k=(i, j) for output
    pixel p=(oy, ox) is bilinear(x[n, c], oy*sh - ph + i*dh + dy, ox*sw - pw + j*dw + dx),
    zero outside the image, times the mask; then one MatMul per weight group.

    Layout, chosen for speed in ONNX Runtime: the input goes channels-last and zero-padded
    (1 row/column before, 2 after), so every Gather index fetches the C/offset_groups contiguous
    channels of one pixel, and a sample position clamped into [-1, H] x [-1, W] needs no validity
    masks (outside the image all four corners are padding zeros). Samples are laid out
    [N, P, offset group, tap, channel], which is already the MatMul's row-major [N*P, C*K] operand.
    """
    if a.kernel is None:  # the taps are laid out in the graph
        raise LoweringError(
            "deform_conv2d export (the Gather + MatMul decomposition of opsets 9-18): the kernel size "
            "(weight.shape[2:]) must be known to the exporter; keep weight's shape static, or export with "
            "lowering='custom' (any opset) or at opset >= 19 (ONNX DeformConv)"
        )
    kh, kw = a.kernel
    taps = kh * kw
    i64 = b.constant

    def const(value):
        return b.constant_like(value, x)

    def dim(shape, index):  # a scalar int64 dim of a Shape output
        return b.op("Gather", shape, i64(index), axis=0)

    def as_float(value):
        return b.op("CastLike", value, x) if b.opset >= 15 else b.op("Cast", value, to=_onnx_dtype(b, x))

    def clamp(value, low, high):
        if b.opset >= 12:  # ORT has no float64 kernel of Clip-11
            return b.op("Clip", value, low, high)
        return b.op("Max", b.op("Min", value, high), low)

    def shape(*parts):  # a Reshape target from ints and 1-D int64 tensors, with no -1 (empty batches stay valid)
        return b.op("Concat", *(i64(list(p)) if isinstance(p, tuple) else p for p in parts), axis=0)

    def size(known, runtime):
        """A size as a 1-tuple (for shape()) where the exporter knows it, else its 1-D tensor computed at run time."""
        return (known,) if known is not None else runtime()

    def product(*parts):  # of sizes from size(): a 1-tuple if all are known
        if all(isinstance(p, tuple) for p in parts):
            return (math.prod(p[0] for p in parts),)
        tensors = [i64(list(p)) if isinstance(p, tuple) else p for p in parts]
        out = tensors[0]
        for t in tensors[1:]:
            out = b.op("Mul", out, t)
        return out

    def as_tensor(part):  # a size from size() as a 1-D int64 tensor
        return i64(list(part)) if isinstance(part, tuple) else part

    x_shape, offset_shape, w_shape = b.op("Shape", x), b.op("Shape", offset), b.op("Shape", weight)
    channels = size(a.in_channels, lambda: dim(x_shape, [1]))
    out_channels = size(a.out_channels, lambda: dim(w_shape, [0]))
    per_group = size(a.in_channels // a.groups if a.in_channels and a.groups else None, lambda: dim(w_shape, [1]))
    groups = size(a.groups, lambda: b.op("Div", as_tensor(channels), as_tensor(per_group)))
    offset_groups = size(a.offset_groups, lambda: b.op("Div", dim(offset_shape, [1]), i64([2 * taps])))
    group_channels = size(
        a.in_channels // a.offset_groups if a.in_channels and a.offset_groups else None,
        lambda: b.op("Div", as_tensor(channels), as_tensor(offset_groups)),
    )
    batch, height, width = dim(x_shape, 0), dim(x_shape, 2), dim(x_shape, 3)
    out_w = dim(offset_shape, 3)
    pixels = b.op("Mul", dim(offset_shape, 2), out_w)
    n_1d, p_1d = dim(offset_shape, [0]), b.op("Reshape", pixels, i64([1]))
    position = b.iota(pixels)  # p = oy * W_out + ox
    oy = b.op("Div", position, out_w)
    ox = b.op("Sub", position, b.op("Mul", oy, out_w))
    # base[p, 1, k] = o * stride - pad + tap * dilation, k = i * kw + j
    tap_i = torch.tensor([k // kw for k in range(taps)], dtype=torch.float64)
    tap_j = torch.tensor([k % kw for k in range(taps)], dtype=torch.float64)
    column = i64([-1, 1, 1])
    base_y = b.op("Add", b.op("Reshape", b.op("Mul", as_float(oy), const(float(a.stride[0]))), column),
                  _float_constant(b, x, tap_i * a.dilation[0] - a.padding[0]))  # fmt: skip
    base_x = b.op("Add", b.op("Reshape", b.op("Mul", as_float(ox), const(float(a.stride[1]))), column),
                  _float_constant(b, x, tap_j * a.dilation[1] - a.padding[1]))  # fmt: skip
    # offset [N, 2*G*K, Ho, Wo] -> [N, P, G, K, 2]; dy, dx: [N, P, G, K]
    offsets = b.op(
        "Transpose", b.op("Reshape", offset, shape(n_1d, offset_groups, (taps, 2), p_1d)), perm=[0, 4, 1, 2, 3]
    )
    # Positions clamped into [-1, H] x [-1, W]: a sample outside the image then reads padding only.
    y = clamp(b.op("Add", base_y, b.op("Gather", offsets, i64(0), axis=4)), const(-1.0), as_float(height))
    xs = clamp(b.op("Add", base_x, b.op("Gather", offsets, i64(1), axis=4)), const(-1.0), as_float(width))
    y0, x0 = b.op("Floor", y), b.op("Floor", xs)
    ly, lx = b.op("Sub", y, y0), b.op("Sub", xs, x0)
    hy, hx = b.op("Sub", const(1.0), ly), b.op("Sub", const(1.0), lx)
    if mask is not None:  # [N, G*K, Ho, Wo] -> [N, P, G, K], folded into the row weights
        m = b.op("Transpose", b.op("Reshape", mask, shape(n_1d, offset_groups, (taps,), p_1d)), perm=[0, 3, 1, 2])
        hy, ly = b.op("Mul", hy, m), b.op("Mul", ly, m)
    # x [N, C, H, W] -> zero-padded channels-last rows [N * (H+3) * (W+3) * G, C/G]
    pads = [0, 0, 1, 1, 0, 0, 2, 2]
    padded = b.op("Pad", x, i64(pads)) if b.opset >= 11 else b.op("Pad", x, pads=pads)
    rows = b.op("Reshape", b.op("Transpose", padded, perm=[0, 2, 3, 1]), shape((-1,), group_channels))
    padded_w = b.op("Add", width, i64(3))
    offset_groups_scalar = b.op("Reshape", as_tensor(offset_groups), i64([]))
    row_stride = b.op("Mul", padded_w, offset_groups_scalar)  # rows between vertical neighbours
    first_row = b.op("Reshape", b.op("Mul", b.iota(batch), b.op("Add", height, i64(3))), i64([-1, 1, 1, 1]))
    iy = b.op("Cast", b.op("Add", y0, const(1.0)), to=7)  # INT64, in [0, H + 1]
    ix = b.op("Cast", b.op("Add", x0, const(1.0)), to=7)
    top_left = b.op(
        "Add",
        b.op("Mul", b.op("Add", b.op("Mul", b.op("Add", first_row, iy), padded_w), ix), offset_groups_scalar),
        b.op("Reshape", b.iota(offset_groups_scalar), i64([-1, 1])),  # [G, 1]: the group's row in a pixel
    )
    right = offset_groups_scalar
    corners = (
        (top_left, hy, hx),
        (b.op("Add", top_left, right), hy, lx),
        (b.op("Add", top_left, row_stride), ly, hx),
        (b.op("Add", b.op("Add", top_left, row_stride), right), ly, lx),
    )

    def last_axis(value):  # [N, P, G, K] -> [N, P, G, K, 1]
        return b.unsqueeze(value, 4)

    terms = [
        b.op("Mul", b.op("Gather", rows, index, axis=0), last_axis(b.op("Mul", wy, wx))) for index, wy, wx in corners
    ]  # each [N, P, G, K, C/G]
    sampled = b.op("Sum", *terms)
    # MatMul operands with no empty batch dimension (ORT's MatMul refuses to broadcast one): rows N*P.
    rows_1d = b.op("Mul", n_1d, p_1d)
    if a.groups == 1:  # columns [N*P, G*K*C/G] x kernel [G*K*C/G, Co]
        columns = b.op("Reshape", sampled, shape(rows_1d, product((taps,), channels)))
        kernel = b.op(
            "Transpose",
            b.op("Reshape", b.op("Transpose", b.op("Reshape", weight, shape(out_channels, offset_groups,
                 group_channels, (taps,))), perm=[0, 1, 3, 2]), shape(out_channels, (-1,))),
            perm=[1, 0],
        )  # fmt: skip
        product_ = b.op("Reshape", b.op("MatMul", columns, kernel), shape(n_1d, p_1d, out_channels))
        out = b.op("Transpose", product_, perm=[0, 2, 1])  # [N, Co, P]
    else:  # per weight group: columns [groups, N*P, K*C/groups] x kernel [groups, K*C/groups, Co/groups]
        out_per_group = (
            (a.out_channels // a.groups,) if a.out_channels and a.groups
            else b.op("Div", as_tensor(out_channels), as_tensor(groups))
        )  # fmt: skip
        by_tap = b.op("Transpose", sampled, perm=[0, 1, 3, 2, 4])  # [N, P, K, G, C/G]
        columns = b.op(
            "Transpose", b.op("Reshape", by_tap, shape(rows_1d, (taps,), groups, per_group)), perm=[2, 0, 1, 3]
        )
        columns = b.op("Reshape", columns, shape(groups, rows_1d, product((taps,), per_group)))
        kernel = b.op(
            "Reshape",
            b.op("Transpose", b.op("Reshape", weight, shape(groups, out_per_group, per_group, (taps,))),
                 perm=[0, 3, 2, 1]),
            shape(groups, product((taps,), per_group), out_per_group),
        )  # fmt: skip
        product_ = b.op("Reshape", b.op("MatMul", columns, kernel), shape(groups, n_1d, p_1d, out_per_group))
        out = b.op("Transpose", product_, perm=[1, 0, 3, 2])  # [N, groups, Co/groups, P]
    out_shape = b.op(
        "Concat", b.op("Gather", offset_shape, i64([0]), axis=0), as_tensor(out_channels),
        b.op("Gather", offset_shape, i64([2, 3]), axis=0), axis=0,
    )  # fmt: skip
    out = b.op("Reshape", out, out_shape)
    if bias is not None:
        out = b.op("Add", out, b.op("Reshape", bias, shape((1,), out_channels, (1, 1))))
    return out


def _float_constant(b, like, values: torch.Tensor):
    """A constant of the element type of ``like`` (small integers: exact in float)."""
    if b.exporter == "legacy":
        return b.g.op("Constant", value_t=values.to(b.dtype(like)))
    return b.op("CastLike", b.op("Constant", value_floats=[float(v) for v in values.flatten()]), like)


def _onnx_dtype(b, like) -> int:
    import onnx

    return {torch.float32: onnx.TensorProto.FLOAT, torch.float64: onnx.TensorProto.DOUBLE}[b.dtype(like)]


# --- the two torch ops' argument conventions, mapped onto one lowering -------------------------------------------


def _opbridge_args(b, x, offset, weight, bias=None, stride=1, padding=0, dilation=1, mask=None):
    # Defaults as in the schema: the dynamo exporter drops trailing arguments left at their defaults.
    bias = None if b.is_none(bias) else bias
    mask = None if b.is_none(mask) else mask
    stride, padding, dilation = (_ints(b.value(v, "is")) for v in (stride, padding, dilation))
    return x, weight, offset, bias, mask, _attributes(b, x, weight, offset, stride, padding, dilation)


def _torchvision_args(b, x, weight, offset, mask, bias, sh, sw, ph, pw, dh, dw, groups, offset_groups, use_mask):
    ints = [b.value(v, "i") for v in (sh, sw, ph, pw, dh, dw, groups, offset_groups)]
    use_mask = bool(b.value(use_mask, "b"))
    a = _attributes(b, x, weight, offset, ints[0:2], ints[2:4], ints[4:6], ints[6], ints[7])
    return x, weight, offset, bias, (mask if use_mask else None), a


def _lowerings(parse) -> list[specs.Lowering]:
    def deform_conv(b, *args):
        x, weight, offset, bias, mask, a = parse(b, *args)
        if a.groups is None or a.offset_groups is None:
            # DeformConv's group attributes must be numbers; the decomposition reads them at run time.
            return _decomposed(b, x, weight, offset, bias, mask, a)
        return _deform_conv_node(b, "DeformConv", "", x, weight, offset, bias, mask, a)

    def decomposed(b, *args):
        x, weight, offset, bias, mask, a = parse(b, *args)
        return _decomposed(b, x, weight, offset, bias, mask, a)

    def custom(b, *args):
        x, weight, offset, bias, mask, a = parse(b, *args)
        return _deform_conv_node(b, "DeformConv2d", specs.CUSTOM_DOMAIN, x, weight, offset, bias, mask, a)

    return [
        specs.Lowering(
            "standard",
            specs.half_storage(deform_conv),
            min_opset=19,
            note="DeformConv (the decomposition where the exporter does not know the group counts)",
        ),
        specs.Lowering(
            "standard", specs.half_storage(decomposed), min_opset=9, max_opset=18, note="Gather + MatMul decomposition"
        ),
        # The node's float16 kernel takes a float16 model as it is (ORT's CPU library).
        specs.Lowering(
            "custom", specs.half_storage(custom, native=(torch.float16,)), min_opset=9, note="opbridge::DeformConv2d"
        ),
    ]


# --- parity: the tutorial's model, a Conv2d predicting offsets (and a mask) for a deformable conv ------------------

_CONFIG = {"in_channels": 4, "out_channels": 6, "kernel": 3, "groups": 2, "offset_groups": 2}


class _DeformModel(torch.nn.Module):
    def __init__(self, use_torchvision: bool) -> None:
        super().__init__()
        c, k = _CONFIG["in_channels"], _CONFIG["kernel"]
        generator = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(
            torch.randn(_CONFIG["out_channels"], c // _CONFIG["groups"], k, k, generator=generator)
        )
        self.bias = torch.nn.Parameter(torch.randn(_CONFIG["out_channels"], generator=generator))
        self.use_torchvision = use_torchvision

    def forward(self, x, offset, mask=None):
        if self.use_torchvision:
            import torchvision

            return torchvision.ops.deform_conv2d(x, offset, self.weight, self.bias, padding=1, mask=mask)
        return deform_conv2d(x, offset, self.weight, self.bias, padding=1, mask=mask)


def reference(input, offset, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), mask=None) -> Tensor:
    """Deformable convolution in plain torch math, float64, written from the definition (torchvision's
    semantics): an independent check of the kernel, sharing no code with it."""
    x = input.double()
    n, channels, height, width = x.shape
    out_channels, channels_per_group, kernel_h, kernel_w = weight.shape
    taps, groups = kernel_h * kernel_w, channels // channels_per_group
    offset_groups = offset.shape[1] // (2 * taps)
    out_h, out_w = offset.shape[2:]
    tap = torch.arange(taps)
    # Sampling positions [N, offset groups, taps, H_out, W_out].
    offsets = offset.double().reshape(n, offset_groups, taps, 2, out_h, out_w)
    rows = (torch.arange(out_h) * stride[0] - padding[0]).view(-1, 1) + (tap // kernel_w * dilation[0]).view(-1, 1, 1)
    cols = (torch.arange(out_w) * stride[1] - padding[1]).view(1, -1) + (tap % kernel_w * dilation[1]).view(-1, 1, 1)
    y, xs = rows + offsets[:, :, :, 0], cols + offsets[:, :, :, 1]
    planes = x.reshape(n, offset_groups, channels // offset_groups, height * width)
    sampled = torch.zeros(n, offset_groups, channels // offset_groups, taps, out_h, out_w, dtype=torch.float64)
    inside = (y > -1) & (y < height) & (xs > -1) & (xs < width)
    for corner_y in (torch.floor(y), torch.floor(y) + 1):
        for corner_x in (torch.floor(xs), torch.floor(xs) + 1):
            valid = inside & (corner_y >= 0) & (corner_y <= height - 1) & (corner_x >= 0) & (corner_x <= width - 1)
            weight_of_corner = (1 - (y - corner_y).abs()) * (1 - (xs - corner_x).abs()) * valid
            if height * width == 0:
                continue  # an empty image samples zeros
            index = (torch.nan_to_num(corner_y).clamp(0, height - 1) * width
                     + torch.nan_to_num(corner_x).clamp(0, width - 1)).long()  # fmt: skip
            flat_index = index.reshape(n, offset_groups, 1, -1).expand(-1, -1, channels // offset_groups, -1)
            values = torch.gather(planes, 3, flat_index).reshape(sampled.shape)
            sampled += values * torch.nan_to_num(weight_of_corner).unsqueeze(2)
    if mask is not None:
        sampled *= mask.double().reshape(n, offset_groups, 1, taps, out_h, out_w)
    columns = sampled.reshape(n, groups, channels_per_group * taps, out_h * out_w)
    kernel = weight.double().reshape(groups, out_channels // groups, channels_per_group * taps)
    out = torch.einsum("gok,ngkp->ngop", kernel, columns).reshape(n, out_channels, out_h, out_w)
    if bias is not None:
        out = out + bias.double().view(1, -1, 1, 1)
    return out.to(input.dtype)


def _model_reference(x, offset, mask=None) -> Tensor:
    """The parity model's output from :func:`reference`, with the model's (seeded) parameters."""
    model = _DeformModel(use_torchvision=False)
    return reference(x, offset, model.weight.detach(), model.bias.detach(), padding=(1, 1), mask=mask)


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    c, k, g = _CONFIG["in_channels"], _CONFIG["kernel"], _CONFIG["offset_groups"]
    height, width = 7, 9  # padding 1, 3x3: the output has the input's size
    x = torch.randn(batch, c, height, width, generator=generator, dtype=torch.float64)
    offset = 2 * torch.randn(batch, 2 * g * k * k, height, width, generator=generator, dtype=torch.float64)
    inputs = [x.to(dtype), offset.to(dtype)]
    if operands == "mask":
        inputs.append(torch.rand(batch, g * k * k, height, width, generator=generator, dtype=torch.float64).to(dtype))
    return tuple(inputs)


def _known_gaps(cell) -> str | None:
    if cell.lowering == "standard" and cell.opset >= 19:
        import onnxruntime

        version = tuple(int(v) for v in onnxruntime.__version__.split(".")[:2])
        if version < (1, 25):
            return f"ONNX Runtime {onnxruntime.__version__} has no DeformConv kernel (added in 1.25)"
    return None


_COMMON = {
    "dtypes": (torch.float32, torch.float64, torch.float16, torch.bfloat16),
    "operand_kinds": ("mask", "no_mask"),
    "sample_inputs": _sample_inputs,
    "input_names": ("x", "offset", "mask"),
    "reference": _model_reference,
    "known_gaps": _known_gaps,
    "custom_node": specs.CustomNode(
        op_type="DeformConv2d",
        inputs=("X", "W", "offset", "B", "mask"),
        outputs=("Y",),
        types=("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"),
        doc="ONNX DeformConv's semantics, inputs and attributes (B and mask optional).",
        optional_inputs=("B", "mask"),
        attributes=(
            ("dilations", "ints"),
            ("group", "int"),
            ("kernel_shape", "ints"),
            ("offset_group", "int"),
            ("pads", "ints"),
            ("strides", "ints"),
        ),
    ),
}

specs.register(
    specs.OpSpec(
        name="deform_conv2d",
        torch_op="opbridge::deform_conv2d",
        doc="deformable convolution (torchvision semantics)",
        lowerings=_lowerings(_opbridge_args),
        call_paths={"torch.ops": lambda: _DeformModel(use_torchvision=False)},
        **_COMMON,
    )
)


def _torchvision_gaps(cell) -> str | None:
    if cell.exporter == "dynamo" and specs.torch_version() < (2, 13):
        return (
            "torch <= 2.9's dynamo exporter translates torchvision::deform_conv2d itself, ignoring "
            "custom_translation_table (seen on 2.6 and 2.9): no custom node, and DeformConv even below opset 19"
        )
    return _known_gaps(cell)


specs.register(
    specs.OpSpec(
        name="torchvision.deform_conv2d",
        torch_op="torchvision::deform_conv2d",
        doc="torchvision's deformable convolution",
        lowerings=_lowerings(_torchvision_args),
        call_paths={"torchvision": lambda: _DeformModel(use_torchvision=True)},
        # Checked when the matrix needs it, not at import: importing torchvision costs a second.
        available=specs.torchvision_op_loads("deform_conv2d"),
        # torch's own dynamo rule emits DeformConv, which needs opset >= 19 and ORT >= 1.25: ours also serves
        # opsets 18 and below with the decomposition.
        dynamo_overrides_torch=True,
        **{**_COMMON, "custom_node": None, "known_gaps": _torchvision_gaps},
    )
)
