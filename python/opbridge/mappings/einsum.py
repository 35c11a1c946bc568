"""aten::einsum below opset 12 for the TorchScript-based exporter, whose rule emits ONNX Einsum (opset 12:
"Support for this operator was added in version 12").

transformers' OneFormer and Mask2Former compute their mask logits with ``torch.einsum("bqc,bchw->bqhw", ...)``,
and many transformers and timm blocks use einsum for attention: with opbridge's sdpa rule OneFormer reached
opset 11 and stopped here. The rule contracts the operands left to right, as a batched matrix product each:

- labels only one operand has and nothing later needs are summed out first (ReduceSum);
- the two operands are transposed to [shared kept labels, own labels, contracted labels], their own and contracted
  labels flattened (sizes read at run time: Shape, Gather, Mul), multiplied (MatMul, which broadcasts the shared
  kept labels), and unflattened;
- the last operand is summed over what the output drops and transposed to the output's order.

Explicit (``->``) and implicit outputs, spaces, ``...`` (its rank read from the exporter's known rank) and any
number of operands are covered; a label repeated within one operand (a diagonal or trace) is refused with an error
that names opset 12. From opset 12 on, torch's own rule (one Einsum node) runs.
"""

from __future__ import annotations

import string

import numpy as np
import torch

from .. import specs


def _parse(equation: str, ranks: list[int]) -> tuple[list[list[str]], list[str]]:
    """Labels per operand and of the output; ``...`` becomes labels ``.0``, ``.1``, ... aligned from the right."""
    equation = equation.replace(" ", "")
    inputs, arrow, output = equation.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(ranks):
        raise specs.LoweringError(
            f"einsum export: {equation!r} names {len(terms)} operands, the call passes {len(ranks)}"
        )
    extras = []
    for term, rank in zip(terms, ranks, strict=True):
        letters = term.replace("...", "")
        if any(c not in string.ascii_letters for c in letters) or term.count("...") > 1:
            raise specs.LoweringError(f"einsum export: cannot read the subscripts {term!r} of {equation!r}")
        extras.append(rank - len(letters))
        if extras[-1] < 0 or (extras[-1] and "..." not in term):
            raise specs.LoweringError(f"einsum export: subscripts {term!r} do not fit an operand of rank {rank}")
    ellipsis_rank = max(extras, default=0)
    labels = []
    for term, extra in zip(terms, extras, strict=True):
        head, _, tail = term.partition("...")
        labels.append([*head, *(f".{i}" for i in range(ellipsis_rank - extra, ellipsis_rank)), *tail])
    if any(len(set(term)) != len(term) for term in labels):
        raise specs.LoweringError(
            f"einsum export: {equation!r} repeats a subscript within one operand (a diagonal or trace), which this "
            "rule does not lower below opset 12: export with opset_version >= 12 (one ONNX Einsum)"
        )
    dots = [f".{i}" for i in range(ellipsis_rank)]
    if arrow:
        head, _, tail = output.partition("...")
        out = [*head, *(dots if "..." in output else []), *tail]
    else:  # implicit: the ellipsis, then the labels used once, alphabetically
        counts = [label for term in labels for label in term if not label.startswith(".")]
        out = dots + sorted({c for c in counts if counts.count(c) == 1})
    known = {label for term in labels for label in term}
    if any(label not in known for label in out):
        raise specs.LoweringError(f"einsum export: the output of {equation!r} names a subscript no operand has")
    return labels, out


class _Term:
    """A value with one label per dimension."""

    def __init__(self, value, labels: list[str]) -> None:
        self.value, self.labels = value, labels


def _sum_out(b, term: _Term, keep: set[str]) -> _Term:
    axes = [i for i, label in enumerate(term.labels) if label not in keep]
    if not axes:
        return term
    return _Term(b.reduce("Sum", term.value, axes), [label for label in term.labels if label in keep])


def _transpose(b, term: _Term, order: list[str]) -> _Term:
    perm = [term.labels.index(label) for label in order]
    if perm == list(range(len(perm))):
        return term
    return _Term(b.op("Transpose", term.value, perm=perm), order)


def _sizes(b, value, axes: list[int]):
    """1-D int64 of the sizes of ``axes`` (empty for none)."""
    return b.op("Gather", b.op("Shape", value), b.constant(axes), axis=0)


def _product(b, value, axes: list[int]):
    """1-D int64 [the product of the sizes of ``axes``] (1 for none)."""
    total = b.constant([1])
    for axis in axes:
        total = b.op("Mul", total, _sizes(b, value, [axis]))
    return total


def _contract(b, left: _Term, right: _Term, keep: set[str]) -> _Term:
    left = _sum_out(b, left, keep | set(right.labels))
    right = _sum_out(b, right, keep | set(left.labels))
    batch = [label for label in left.labels if label in right.labels and label in keep]
    summed = [label for label in left.labels if label in right.labels and label not in keep]
    own_left = [label for label in left.labels if label not in right.labels]
    own_right = [label for label in right.labels if label not in left.labels]
    left = _transpose(b, left, batch + own_left + summed)
    right = _transpose(b, right, batch + summed + own_right)
    nb, nl, ns = len(batch), len(own_left), len(summed)
    batch_axes = list(range(nb))

    def flat(value, first, second):  # [batch..., prod(first axes), prod(second axes)]
        parts = [_sizes(b, value, batch_axes)] if nb else []
        return b.op(
            "Reshape", value, b.op("Concat", *parts, _product(b, value, first), _product(b, value, second), axis=0)
        )

    product = b.op(
        "MatMul",
        flat(left.value, list(range(nb, nb + nl)), list(range(nb + nl, nb + nl + ns))),
        flat(right.value, list(range(nb, nb + ns)), list(range(nb + ns, nb + ns + len(own_right)))),
    )
    parts = [_sizes(b, product, batch_axes)] if nb else []  # the broadcast batch sizes
    if nl:
        parts.append(_sizes(b, left.value, list(range(nb, nb + nl))))
    if own_right:
        parts.append(_sizes(b, right.value, list(range(nb + ns, nb + ns + len(own_right)))))
    shape = b.op("Concat", *parts, axis=0) if len(parts) > 1 else (parts[0] if parts else b.constant([]))
    return _Term(b.op("Reshape", product, shape), batch + own_left + own_right)


def _einsum(b, equation, tensors, path=None):
    equation = b.value(equation, "s")
    operands = b.values(tensors)
    ranks = []
    for index, operand in enumerate(operands):
        shape = b.static_shape(operand)
        if shape is None:
            raise specs.UnknownToExporter(
                f"einsum export needs the rank of operand {index}; the exporter does not know it"
            )
        ranks.append(len(shape))
    dtypes = {b.dtype(operand, f"operand {index}") for index, operand in enumerate(operands)}
    if len(dtypes) > 1:
        raise specs.LoweringError(f"einsum export: operands of different dtypes {sorted(map(str, dtypes))}")
    labels, out = _parse(equation, ranks)
    terms = [_Term(operand, term) for operand, term in zip(operands, labels, strict=True)]
    result = terms[0]
    for index, term in enumerate(terms[1:], start=1):
        later = {label for t in terms[index + 1 :] for label in t.labels}
        result = _contract(b, result, term, set(out) | later)
    result = _transpose(b, _sum_out(b, result, set(out)), out)
    return result.value if result.value is not operands[0] else b.op("Identity", result.value)


#: operand kind (the equation) -> the operands' shapes at batch size B (the parity matrix's batch dim follows B).
_EQUATIONS = {
    "bqc,bchw->bqhw": lambda n: [(n, 3, 4), (n, 4, 5, 6)],  # OneFormer's and Mask2Former's mask logits
    "bnkc,bmkc->bknm": lambda n: [(n, 5, 2, 4), (n, 3, 2, 4)],  # OneFormer's text attention
    "bhwc,hkc->bhwk": lambda n: [(n, 3, 4, 5), (3, 2, 5)],  # relative position terms (SAM, ViTDet)
    "ij,jk": lambda n: [(n, 4), (4, 3)],  # implicit output: "ik"
    "... pd, ...qd -> ...pq": lambda n: [(n, 2, 3, 4), (2, 5, 4)],  # ellipsis with broadcasting, spaces
    "ijk->kj": lambda n: [(n, 3, 4)],  # one operand: a sum and a transpose
    "i,i->": lambda n: [(n,), (n,)],  # a scalar
    "bi,ij,jk->bk": lambda n: [(n, 3), (3, 4), (4, 2)],  # three operands
}


class _Einsum(torch.nn.Module):
    def __init__(self, operands: str) -> None:
        super().__init__()
        self.equation = operands

    def forward(self, *tensors):
        return torch.einsum(self.equation, *tensors)


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    generator = torch.Generator().manual_seed(batch)
    shapes = _EQUATIONS[operands](batch)
    return tuple(torch.randint(-5, 6, shape, generator=generator).to(dtype) for shape in shapes)


def _reference(*tensors, operands: str):
    """numpy's einsum."""
    return torch.from_numpy(np.asarray(np.einsum(operands.replace(" ", ""), *(t.numpy() for t in tensors))))


specs.register(
    specs.OpSpec(
        name="einsum",
        torch_op="aten::einsum",
        doc="aten::einsum below opset 12 -> ReduceSum, Transpose, MatMul per operand pair (torch's "
        "TorchScript-exporter rule needs Einsum, opset 12)",
        lowerings=[specs.Lowering("standard", _einsum, min_opset=9, max_opset=11, note="ReduceSum, Transpose, MatMul")],
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64),
        call_paths={"torch": _Einsum},
        sample_inputs=_sample_inputs,
        operand_kinds=tuple(_EQUATIONS),
        input_names=("a", "b", "c"),
        reference=_reference,
    )
)
