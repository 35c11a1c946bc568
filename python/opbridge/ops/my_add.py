"""my_add(a, b) = 2 * a + b: the minimal op, and the pattern every op slice follows.

The op's pieces, each named after it: the kernel (cpp/kernels/my_add.h), its
schema, CPU adapter and pybind11 binding (cpp/torch/my_add.cpp), its ORT adapter
(cpp/ort/my_add.cc), and this module: the Python wrapper, fake kernel,
autograd, the classic ``autograd.Function``, the ``nn.Module`` twin, the ONNX
lowerings and the spec (parity inputs and reference).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _autocast, _checks, specs
from ..onnx import functions

#: Public names: ``opbridge.<name>``; ``NN_MODULES`` go to ``opbridge.nn``.
__all__ = ["MyAddFunction", "my_add"]
NN_MODULES = ["MyAdd"]


# --- torch ---------------------------------------------------------------------------------------------------------


def my_add(a: Tensor, b: Tensor) -> Tensor:
    """Return ``2 * a + b``: ``torch.ops.opbridge.my_add``.

    Args:
        a, b: tensors (CPU, or CUDA with opbridge's CUDA library) of the same floating dtype (float32, float64,
            float16 or bfloat16) whose shapes broadcast together; any rank, empty and non-contiguous tensors
            included.

    Returns:
        A new contiguous tensor of the broadcast shape and the inputs' dtype.

    Differentiable in both inputs, traceable by ``torch.jit.script``/``trace``,
    ``torch.export`` and ``torch.compile``, and exportable to ONNX with either of
    torch's exporters (see :mod:`opbridge.onnx`).

    Raises:
        TypeError: ``a`` or ``b`` is not a tensor.
        RuntimeError: dtypes differ or are not floating, shapes do not broadcast, or a tensor is not on the
            CPU (meta and fake tensors go to the fake kernel, which requires one device for both).
    """
    if not torch.jit.is_scripting():
        _checks.tensor("opbridge.my_add", "a", a)
        _checks.tensor("opbridge.my_add", "b", b)
    return torch.ops.opbridge.my_add(a, b)


@torch.library.register_fake("opbridge::my_add")
def _my_add_fake(a: Tensor, b: Tensor) -> Tensor:
    _checks.one_device("opbridge::my_add", a=a, b=b)
    torch._check(
        a.dtype == b.dtype,
        lambda: f"opbridge::my_add: a and b must have the same dtype, got a: {a.dtype} and b: {b.dtype}",
    )
    _checks.float_storage("opbridge::my_add", "a", a)
    shape = torch.broadcast_shapes(a.shape, b.shape)
    return a.new_empty(shape)


AUTOCAST = _autocast.Rule("promote")
_autocast.register("opbridge::my_add", AUTOCAST)


def _backward(grad: Tensor, a_shape: torch.Size, b_shape: torch.Size, needs_input_grad) -> tuple:
    """Gradients of 2 * a + b, summed back over broadcast dimensions."""
    grad_a = (2 * grad).sum_to_size(a_shape) if needs_input_grad[0] else None
    grad_b = grad.sum_to_size(b_shape) if needs_input_grad[1] else None
    return grad_a, grad_b


def _setup_context(ctx, inputs, output) -> None:
    a, b = inputs
    ctx.a_shape, ctx.b_shape = a.shape, b.shape


def _autograd(ctx, grad: Tensor) -> tuple:
    return _backward(grad, ctx.a_shape, ctx.b_shape, ctx.needs_input_grad)


torch.library.register_autograd("opbridge::my_add", _autograd, setup_context=_setup_context)


class MyAddFunction(torch.autograd.Function):
    """The classic pattern: ``MyAddFunction.apply(a, b) == 2 * a + b`` through the
    pybind11 function ``opbridge._C.my_add``, with a backward and a ``symbolic`` for
    the TorchScript-based ONNX exporter."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor) -> Tensor:
        from .. import _C

        ctx.a_shape, ctx.b_shape = a.shape, b.shape
        return _C.my_add(a, b)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _backward(grad, ctx.a_shape, ctx.b_shape, ctx.needs_input_grad)

    @staticmethod
    def symbolic(g, a, b):
        # The lowering (standard / custom / function) and opset come from the export in progress.
        from ..onnx import _legacy

        return _legacy.symbolic_for("my_add")(g, a, b)


class MyAdd(torch.nn.Module):
    """``MyAdd()(a, b) == 2 * a + b``; see :func:`opbridge.my_add`."""

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return my_add(a, b)


# --- ONNX ----------------------------------------------------------------------------------------------------------


def _standard(b, x, y):
    return b.op("Add", b.op("Mul", x, b.constant_like(2.0, x)), y)


def _custom(b, x, y):
    out = b.op("MyAdd", x, y, domain=specs.CUSTOM_DOMAIN)
    b.set_broadcast_type(out, x, y)
    return out


def _function_body():
    from onnxscript import opset18 as op

    def MyAdd(A, B):
        two = op.CastLike(op.Constant(value_float=2.0), A)
        return op.Add(op.Mul(A, two), B)

    return MyAdd


_FUNCTION = functions.register(
    "MyAdd", _function_body, inputs=("A", "B"), outputs=("C",), doc="C = 2 * A + B (broadcasting)"
)


# --- parity: how the matrix calls the op, its inputs and reference ------------------------------------------------


class _Pybind(torch.nn.Module):
    def forward(self, a, b):
        from .. import _C

        return _C.my_add(a, b)


class _AutogradFunction(torch.nn.Module):
    def forward(self, a, b):
        return MyAddFunction.apply(a, b)


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(1000 * batch + len(operands))
    if operands == "same":
        shapes = (batch, 3, 5), (batch, 3, 5)
    elif operands == "broadcast":  # both operands broadcast: (B, 1, 5) with (3, 1) -> (B, 3, 5)
        shapes = (batch, 1, 5), (3, 1)
    else:
        raise ValueError(f"unknown operand kind {operands!r}")
    return tuple(torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype) for shape in shapes)


SPEC = specs.register(
    specs.OpSpec(
        name="my_add",
        torch_op="opbridge::my_add",
        doc="2 * a + b with broadcasting",
        lowerings=[
            # Constant, Mul and Add exist in every opset the exporters produce.
            # float16 as it is (ORT's Mul and Add take it); bfloat16 in float32 (they do not on the CPU).
            specs.Lowering(
                "standard",
                specs.half_storage(_standard, native=(torch.float16,)),
                min_opset=7,
                note="Constant, Mul, Add",
            ),
            specs.Lowering(
                "custom",
                specs.half_storage(_custom, native=specs.HALF_DTYPES),
                min_opset=7,
                note="opbridge::MyAdd",
            ),
            # The function body uses CastLike (opset 15) to match the input's dtype.
            specs.Lowering(
                "function",
                specs.half_storage(
                    functions.call(_FUNCTION, set_type=lambda b, out, x, y: b.set_broadcast_type(out, x, y)),
                    native=(torch.float16,),
                ),
                min_opset=15,
                function=_FUNCTION,
                note="onnxscript function MyAdd",
            ),
        ],
        custom_node=specs.CustomNode(
            op_type="MyAdd",
            inputs=("A", "B"),
            outputs=("C",),
            types=("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"),
            doc="C = 2 * A + B with multidirectional (NumPy) broadcasting.",
        ),
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths={"torch.ops": MyAdd, "pybind": _Pybind, "autograd.Function": _AutogradFunction},
        sample_inputs=_sample_inputs,
        operand_kinds=("same", "broadcast"),
        input_names=("a", "b"),
        reference=lambda a, b: (2 * a.double() + b.double()).to(a.dtype),
    )
)
