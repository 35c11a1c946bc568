"""The wrappers' lean eager path (opbridge/_eager.py): the same values and gradients as the registered op and its
registered autograd, taken only where nothing needs the registered path (tracers, compilers, transforms, autocast,
tensor subclasses)."""

from __future__ import annotations

import pytest
import torch

import opbridge
from opbridge.ops.ms_deform_attn import sample_inputs as msda_inputs


def _msda(requires_grad: bool):
    value, shapes, starts, locations, weights = msda_inputs(torch.float64, batch=2)
    leaves = [t.requires_grad_(requires_grad) for t in (value, locations, weights)]
    return (leaves[0], shapes, starts, leaves[1], leaves[2]), leaves


def _dcn(requires_grad: bool):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 6, 7, dtype=torch.float64, generator=generator)
    offset = torch.randn(2, 18, 6, 7, dtype=torch.float64, generator=generator)
    weight = torch.randn(5, 4, 3, 3, dtype=torch.float64, generator=generator)
    bias = torch.randn(5, dtype=torch.float64, generator=generator)
    mask = torch.rand(2, 9, 6, 7, dtype=torch.float64, generator=generator)
    leaves = [t.requires_grad_(requires_grad) for t in (x, offset, weight, bias, mask)]
    return leaves


CASES = {
    "ms_deform_attn": (
        lambda grad: _msda(grad),
        lambda args: opbridge.ms_deform_attn(*args),
        lambda args: torch.ops.opbridge.ms_deform_attn(*args),
    ),
    "deform_conv2d": (
        lambda grad: (lambda t: (t, t))(_dcn(grad)),
        lambda a: opbridge.deform_conv2d(a[0], a[1], a[2], a[3], padding=1, mask=a[4]),
        lambda a: torch.ops.opbridge.deform_conv2d(a[0], a[1], a[2], a[3], (1, 1), (1, 1), (1, 1), a[4]),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_eager_path_gives_the_registered_values_and_gradients(name):
    make, wrapper, registered = CASES[name]
    args, leaves = make(True)
    lean = wrapper(args)
    assert type(lean.grad_fn).__name__.startswith("_EagerFunction"), lean.grad_fn
    reference = registered(args)
    assert not type(reference.grad_fn).__name__.startswith("_EagerFunction")
    torch.testing.assert_close(lean, reference, rtol=0, atol=0)
    grad = torch.randn(lean.shape, dtype=lean.dtype, generator=torch.Generator().manual_seed(1))
    for got, expected in zip(torch.autograd.grad(lean, leaves, grad), torch.autograd.grad(reference, leaves, grad),
                             strict=True):  # fmt: skip
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.autograd.gradcheck(lambda *t: wrapper(_replace(args, leaves, t)), leaves, atol=1e-6, rtol=1e-4)
    # Only some inputs requiring gradients: the others get None, as from the registered autograd.
    args, leaves = make(False)
    leaves[0].requires_grad_()
    out = wrapper(args)
    (only,) = torch.autograd.grad(out.sum(), [leaves[0]])
    assert only is not None and leaves[1].grad is None


def _replace(args, leaves, new):
    mapping = {id(old): fresh for old, fresh in zip(leaves, new, strict=True)}
    return tuple(mapping.get(id(a), a) for a in args)


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_gradient_recorded_where_none_is_needed(name):
    make, wrapper, _ = CASES[name]
    args, _ = make(False)
    assert wrapper(args).grad_fn is None
    args, _ = make(True)
    with torch.no_grad():
        assert wrapper(args).grad_fn is None


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_registered_path_runs_under_autocast_tracing_and_transforms(name):
    make, wrapper, _ = CASES[name]
    args, _ = make(True)
    floats = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    floats = [a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
              for a in floats]  # fmt: skip
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = wrapper(floats)
    assert not type(out.grad_fn).__name__.startswith("_EagerFunction")
    out.float().sum().backward()  # the registered autograd saw the autocast-cast inputs
    traced = torch.jit.trace(lambda *t: wrapper(t), tuple(a.detach() for a in args), check_trace=False)
    assert "opbridge::" in str(traced.graph)
