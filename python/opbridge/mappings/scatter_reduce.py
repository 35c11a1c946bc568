"""aten::scatter_reduce.two -> ONNX ScatterElements with a reduction (opset >= 16; amax/amin >= 18).

What the exporters get wrong (measured on torch 2.14.1 / onnxscript 0.7.2 / ORT 1.31.1): the dynamo exporter
exports ``reduce="mean"`` and the model runs with a wrong result (max difference 1.45 on a 5x3 example); the
TorchScript-based exporter refuses ``reduce="mean"`` and ``include_self=False``. Both are standard ops:

* ``include_self=False``: first write the reduction's identity (0, 1, -inf/+inf or the integer limits) where
  ``src`` lands, then reduce into that;
* ``mean``: a scatter-add of ``src`` and one of ones (the count, plus one for ``self`` when included), then
  sum / count; positions nothing lands on keep ``self``.

Only the ``index``-shaped corner of ``src`` is used, as torch does.
"""

from __future__ import annotations

import torch

from .. import specs
from ..onnx.builder import ONNX_TYPES
from ..specs import LoweringError

_REDUCTIONS = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min", "mean": "add"}


def _identity(b, reduce: str, like, dtype: torch.dtype):
    """The reduction's identity as a scalar of ``like``'s element type (``dtype``)."""
    if reduce in ("sum", "mean"):
        value = 0
    elif reduce == "prod":
        value = 1
    elif dtype.is_floating_point:
        value = float("-inf") if reduce == "amax" else float("inf")
    else:
        info = torch.iinfo(dtype)
        value = info.min if reduce == "amax" else info.max
    if b.exporter == "legacy":
        return b.op("Constant", value=torch.tensor(value, dtype=dtype))
    constant = b.op("Constant", value_float=value) if isinstance(value, float) else b.op("Constant", value_int=value)
    return b.op("CastLike", constant, like)


def _scatter_reduce(b, self, dim, index, src, reduce, include_self=True):
    arguments = (self, dim, index, src, reduce, include_self)
    dim = int(b.value(dim, "i"))
    reduce = b.value(reduce, "s")
    include_self = bool(b.value(include_self, "b")) if not b.is_none(include_self) else True
    if reduce not in _REDUCTIONS:
        raise LoweringError(f"scatter_reduce export: unknown reduce {reduce!r}; torch has {sorted(_REDUCTIONS)}")
    if reduce in ("amax", "amin") and b.opset < 18:
        if b.exporter == "legacy" and include_self:
            # torch's own rule writes ScatterElements-16 with reduction max/min, which the ONNX standard adds in
            # opset 18 but ONNX Runtime runs (measured: correct on ORT 1.31): keep what works without opbridge.
            from ..onnx import _torch_hooks

            builtin = _torch_hooks.legacy_builtin_symbolic("aten::scatter_reduce", b.opset)
            if builtin is not None:
                return builtin(b.g, *arguments)
        raise LoweringError(f"scatter_reduce export: reduce={reduce!r} needs ScatterElements' max/min, opset >= 18")
    dtype = b.dtype(self, "self")
    boolean = dtype == torch.bool
    if boolean:
        if reduce == "mean":
            raise LoweringError("scatter_reduce export: torch has no reduce='mean' of bools")
        # 0/1 as int32: sum and amax are OR, prod and amin AND once cast back (non-zero -> True).
        int32 = ONNX_TYPES[torch.int32]
        self, src, dtype = b.op("Cast", self, to=int32), b.op("Cast", src, to=int32), torch.int32
    index_shape = b.op("Shape", index)
    rank = len(b.static_shape(index) or []) or None
    if rank is None:
        raise LoweringError("scatter_reduce export: the rank of index must be known")
    # The index-shaped corner of src.
    updates = b.op("Slice", src, b.constant([0] * rank), index_shape, b.constant(list(range(rank))))

    def scatter(data, values, reduction):
        if reduction == "none":
            return b.op("ScatterElements", data, index, values, axis=dim)
        return b.op("ScatterElements", data, index, values, axis=dim, reduction=reduction)

    def filled(value_like_scalar):  # a tensor of index's shape holding one scalar
        return b.op("Expand", value_like_scalar, index_shape)

    base = self if include_self else scatter(self, filled(_identity(b, reduce, self, dtype)), "none")
    total = scatter(base, updates, _REDUCTIONS[reduce])
    if boolean:
        return b.op("Cast", total, to=ONNX_TYPES[torch.bool])
    if reduce != "mean":
        return total
    one = _identity(b, "prod", self, dtype)
    counts = scatter(b.op("Mul", self, _identity(b, "sum", self, dtype)), filled(one), "add")  # how many land there
    # With self: one more term. Without: where nothing landed, total is self, divided by 1.
    counts = b.op("Add", counts, one) if include_self else b.op("Max", counts, one)
    quotient = b.op("Div", total, counts)
    if dtype.is_floating_point:
        return quotient
    # Integers: torch floors the quotient, ONNX's Div truncates; the count is positive, so a negative remainder
    # means the truncated quotient is one too large.
    remainder = b.op("Sub", total, b.op("Mul", quotient, counts))
    return b.op(
        "Where", b.op("Less", remainder, _identity(b, "sum", self, dtype)), b.op("Sub", quotient, one), quotient
    )


class _ScatterReduce(torch.nn.Module):
    def __init__(self, reduce: str, include_self: bool) -> None:
        super().__init__()
        self.reduce, self.include_self = reduce, include_self

    def forward(self, x, index, src):
        return torch.scatter_reduce(x, 1, index, src, self.reduce, include_self=self.include_self)


def _paths() -> dict:
    paths = {}
    for reduce in ("mean", "sum", "prod", "amax", "amin"):
        for include_self in (True, False):
            name = f"{reduce}{'' if include_self else '_exclude_self'}"
            paths[name] = lambda reduce=reduce, include_self=include_self: _ScatterReduce(reduce, include_self)
    return paths


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    x = torch.randn(batch, 5, 3, generator=generator, dtype=torch.float64)
    index = torch.randint(0, 5, (batch, 4, 3), generator=generator)  # duplicates, and rows nothing lands on
    src = torch.randn(batch, 6, 3, generator=generator, dtype=torch.float64)  # larger than index: a corner is used
    return x.to(dtype), index, src.to(dtype)


def _reference(x, index, src, path: str = "mean"):
    """Written from the definition, one element at a time; ``path`` names the mode (``amax_exclude_self``)."""
    reduce, _, exclude = path.partition("_")
    include_self = not exclude
    out = x.clone().double()
    hits = torch.zeros_like(out)
    for n, i, j in torch.cartesian_prod(*(torch.arange(s) for s in index.shape)).tolist():
        k = int(index[n, i, j])
        v = float(src[n, i, j])
        if hits[n, k, j] == 0 and not include_self:
            out[n, k, j] = v
        elif reduce in ("sum", "mean"):
            out[n, k, j] += v
        elif reduce == "prod":
            out[n, k, j] *= v
        elif reduce == "amax":
            out[n, k, j] = max(out[n, k, j], v)
        else:
            out[n, k, j] = min(out[n, k, j], v)
        hits[n, k, j] += 1
    if reduce == "mean":
        out = out / torch.where(hits > 0, hits + (1 if include_self else 0), torch.ones_like(hits))
    return out.to(x.dtype)


def _known_gaps(cell) -> str | None:
    if cell.opset < 18 and ("amax" in cell.path or "amin" in cell.path):
        return "ScatterElements has max/min reductions from opset 18"
    if cell.opset < 16:
        return "ScatterElements has reductions from opset 16 (torch's own rule below that: sum/prod, include_self)"
    return None


specs.register(
    specs.OpSpec(
        name="scatter_reduce",
        torch_op="aten::scatter_reduce.two",
        doc="aten::scatter_reduce -> ONNX ScatterElements (mean and include_self=False too)",
        lowerings=[
            # float16/bfloat16 reduced in float32 and rounded once: ONNX Runtime's CPU ScatterElements has no
            # reductions of float16 ("CPU execution provider: MLFloat16 data type is not supported with
            # ScatterElements opset 16 when reduction is 'add'", ORT 1.32)
            specs.Lowering(
                "standard",
                specs.half_storage(_scatter_reduce),
                min_opset=16,
                note="ScatterElements with reduction",
            )
        ],
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths=_paths(),
        sample_inputs=_sample_inputs,
        input_names=("x", "index", "src"),
        reference=_reference,
        known_gaps=_known_gaps,
        # torch's dynamo rule computes mean wrongly: this one replaces it.
        dynamo_overrides_torch=True,
    )
)
