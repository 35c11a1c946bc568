"""aten::any for the TorchScript-based exporter: true where any element is non-zero, negative ones included.

torch's own rule (torch 2.14.1) sums the input cast to integers and tests ``> 0``, so ``torch.any`` of a float
tensor is False when its non-zero elements are negative or cancel out (the coverage sweep: ``any(-8.48)`` is
True in eager, False in ONNX Runtime) — at every opset. This rule casts to bool first (non-zero and NaN are
True, as in torch), then counts. The dynamo exporter is right and keeps its own rule.
"""

from __future__ import annotations

import torch

from .. import specs


def _any(b, self, dim=None, keepdim=None):
    hits = b.op("Cast", b.op("Cast", self, to=9), to=7)  # BOOL (non-zero), then INT64: counts
    keep = int(bool(b.value(keepdim, "b"))) if keepdim is not None and not b.is_none(keepdim) else 0
    axes = None
    if dim is not None and not b.is_none(dim):
        try:
            axes = b.value(dim, "i")  # any.dim: one int
        except (TypeError, ValueError, RuntimeError):
            axes = b.value(dim, "is")  # any.dims: a list
        axes = [int(axes)] if not isinstance(axes, (list, tuple)) else [int(a) for a in axes]
    total = b.op("ReduceSum", hits, keepdims=0) if axes is None else b.reduce("Sum", hits, axes, keepdims=keep)
    return b.op("Greater", total, b.constant(0))


class _Any(torch.nn.Module):
    def __init__(self, dim=None, keepdim: bool = False) -> None:
        super().__init__()
        self.dim, self.keepdim = dim, keepdim

    def forward(self, x):
        return torch.any(x) if self.dim is None else torch.any(x, self.dim, keepdim=self.keepdim)


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    x = torch.randn(batch, 4, 5, generator=generator, dtype=torch.float64)
    x = torch.where(x > 0.3, -x, torch.zeros_like(x))  # zeros and negative values only
    x[:, 1] = 0  # an all-zero row
    if not dtype.is_floating_point:
        x = (x * 10).round()
    return (x.to(dtype),)


def _reference(x, path: str = "all"):
    nonzero = x.double().numpy() != 0
    if path == "all":
        return torch.tensor(bool(nonzero.any()))
    return torch.from_numpy(nonzero.any(axis=1, keepdims=path == "dim_keepdim"))


specs.register(
    specs.OpSpec(
        name="any",
        torch_op="aten::any",
        doc="aten::any -> Cast to bool, ReduceSum, Greater (torch's TorchScript-exporter rule misses negatives)",
        lowerings=[specs.Lowering("standard", _any, min_opset=9, note="Cast, ReduceSum, Greater")],
        dtypes=(torch.float32, torch.float16, torch.bfloat16, torch.int64),
        call_paths={"all": _Any, "dim": lambda: _Any(1), "dim_keepdim": lambda: _Any(1, True)},
        sample_inputs=_sample_inputs,
        input_names=("x",),
        reference=_reference,
    )
)
