"""aten::cummax and aten::cummin (values and indices) for both exporters, neither of which has a rule for them
(torch 2.14.1: the TorchScript-based exporter "is not supported"; the dynamo exporter's torchlib entry raises
NotImplementedError). ONNX has no running maximum either.

transformers' Grounding DINO and MM Grounding DINO build their text attention mask with ``torch.cummax`` and
``torch.cummin`` over the token positions: neither exported with ``dynamo=True``, nor with ``dynamo=False`` when
the token ids are a model input.

The rule compares every position with every earlier one along ``dim`` (n x n, so memory grows with the square of
that size: fine for token and box counts, not for long signals), with sizes computed at run time:

- values[i] = max (min) of x[j] over j <= i;
- indices[i] = the last j <= i where x[j] equals values[i] (torch keeps the later of equal elements);
- NaN, as in torch: from the first NaN on, the value is NaN and the index that of the latest NaN.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import specs
from ..onnx.builder import ONNX_TYPES


def _extremum(b, self, dim, kind: str):
    shape = b.static_shape(self)
    if shape is None:
        raise specs.UnknownToExporter(f"aten::cum{kind} export needs the rank of self; the exporter does not know it")
    dtype = b.dtype(self, "self")
    if dtype == torch.bool:  # as 0/1 integers (ONNX's comparisons and reductions take no bool), values back to bool
        values, indices = _extremum(b, b.op("Cast", self, to=ONNX_TYPES[torch.int32]), dim, kind)
        return b.op("Cast", values, to=ONNX_TYPES[torch.bool]), indices
    rank = len(shape)
    dim = int(b.value(dim, "i"))
    if rank == 0:  # torch: the element itself, index 0
        return b.op("Identity", self), b.constant(0)
    dim = dim + rank if dim < 0 else dim
    if not 0 <= dim < rank:
        raise specs.LoweringError(f"aten::cum{kind}: dim {dim} is out of range for a tensor of rank {rank}")
    i64 = b.constant
    n = b.op("Gather", b.op("Shape", self), i64([dim]), axis=0)  # 1-D, one element
    positions = b.iota(b.op("Reshape", n, i64([])))  # int64 [n]
    # earlier[i, j] = j <= i, shaped [n, n, 1, ...] to broadcast against x unsqueezed at dim: [..., 1(i), n(j), ...]
    earlier = b.op("Not", b.op("Greater", b.unsqueeze(positions, 0), b.unsqueeze(positions, 1)))
    if rank - dim - 1:  # [n, n, 1, ...]
        earlier = b.unsqueeze(earlier, list(range(2, rank - dim + 1)))
    pairs = b.unsqueeze(self, dim)  # x[j] at axis dim + 1
    j_axis = dim + 1
    if dtype.is_floating_point:
        never = float("-inf") if kind == "max" else float("inf")
        extreme = b.constant_like(never, self)
        nan = b.op("IsNaN", pairs)
        finite = b.op("Where", b.op("Or", nan, b.op("Not", earlier)), extreme, pairs)
        nan_before = b.op("And", nan, earlier)
        seen_nan = b.op(
            "Cast", b.reduce("Max", b.op("Cast", nan_before, to=ONNX_TYPES[torch.int32]), [j_axis]), to=9
        )  # BOOL [..., n(i), ...]
        values = b.reduce(kind.capitalize(), finite, [j_axis])
        values = b.op("Where", seen_nan, b.constant_like(float("nan"), self), values)
        seen = b.unsqueeze(seen_nan, j_axis)  # ORT's Where has no bool kernel: And/Or
        equal_before = b.op("And", earlier, _equal(b, pairs, values, j_axis, True))
        hit = b.op("Or", b.op("And", seen, nan_before), b.op("And", b.op("Not", seen), equal_before))
    else:
        info = torch.iinfo(dtype)
        never = info.min if kind == "max" else info.max
        extreme = b.op("Cast", b.constant(never), to=ONNX_TYPES[dtype])
        values = b.reduce(kind.capitalize(), b.op("Where", earlier, pairs, extreme), [j_axis])
        hit = b.op("And", earlier, _equal(b, pairs, values, j_axis, False))
    # the j of each hit at axis j_axis (others -1), its largest over j
    trailing = rank - dim - 1
    j_positions = b.op("Reshape", positions, i64([-1] + [1] * trailing)) if trailing else positions
    indices = b.reduce("Max", b.op("Where", hit, j_positions, i64(-1)), [j_axis])
    return values, indices


def _equal(b, pairs, values, j_axis, floating: bool):
    """pairs == values (unsqueezed at j_axis); Equal takes floats from opset 11, below it: neither < nor >."""
    values = b.unsqueeze(values, j_axis)
    if b.opset >= 11 or not floating:
        return b.op("Equal", pairs, values)
    return b.op("Not", b.op("Or", b.op("Less", pairs, values), b.op("Greater", pairs, values)))


def _cummax(b, self, dim):
    return _extremum(b, self, dim, "max")


def _cummin(b, self, dim):
    return _extremum(b, self, dim, "min")


class _Cumulative(torch.nn.Module):
    def __init__(self, fn, dim: int) -> None:
        super().__init__()
        self.fn, self.dim = fn, dim

    def forward(self, x):
        values, indices = self.fn(x, self.dim)
        return values, indices


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    """Small integers (many ties), and for floats NaN in some rows and ±inf."""
    generator = torch.Generator().manual_seed(batch)
    x = torch.randint(-4, 5, (batch, 6, 3), generator=generator).to(torch.float64)
    if dtype.is_floating_point:
        x = x + torch.rand(x.shape, generator=generator).round(decimals=1)
        x[0, 2, 0] = float("nan")
        x[-1, 4, 1] = float("nan")
        x[-1, 1, 1] = float("nan")
        x[0, 3, 2] = float("inf")
        x[-1, 0, 2] = -float("inf")
    return (x.to(dtype),)


def _reference(x, kind: str, dim: int):
    """A running extremum written from torch's documented semantics, over numpy arrays."""
    data = np.moveaxis(x.numpy(), dim, -1)
    values, indices = np.empty_like(data), np.zeros(data.shape, dtype=np.int64)
    better = np.greater_equal if kind == "max" else np.less_equal
    for row in np.ndindex(data.shape[:-1]):
        best, where = data[row][0], 0
        for j, value in enumerate(data[row]):
            if np.isnan(value) or (not np.isnan(best) and better(value, best)):
                best, where = value, j
            values[row][j], indices[row][j] = best, where
    return torch.from_numpy(np.moveaxis(values, -1, dim)), torch.from_numpy(np.moveaxis(indices, -1, dim))


for _kind, _build in (("max", _cummax), ("min", _cummin)):
    specs.register(
        specs.OpSpec(
            name=f"cum{_kind}",
            torch_op=f"aten::cum{_kind}",
            doc=f"aten::cum{_kind} -> an n x n comparison along dim, Reduce{_kind.capitalize()} (values) and the last "
            "matching position (indices); no exporter of torch has a rule",
            # Half values compared in float32 (exact: widening is; ORT's CPU has no bfloat16 IsNaN, Where or ReduceMax).
            lowerings=[
                specs.Lowering(
                    "standard",
                    specs.half_storage(_build, floating_output=(True, False)),
                    min_opset=9,
                    note=f"Reduce{_kind.capitalize()} of n x n",
                )
            ],
            dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64),
            call_paths={
                "dim1": lambda _kind=_kind: _Cumulative(getattr(torch, f"cum{_kind}"), 1),
                "dim-1": lambda _kind=_kind: _Cumulative(getattr(torch, f"cum{_kind}"), -1),
            },
            sample_inputs=_sample_inputs,
            input_names=("x",),
            reference=lambda x, path, _kind=_kind: _reference(x, _kind, 1 if path == "dim1" else -1),
            tolerances={"float32": (0.0, 0.0), "float64": (0.0, 0.0)},
            dynamo_overrides_torch=True,
        )
    )
