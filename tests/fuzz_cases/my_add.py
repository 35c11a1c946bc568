"""Fuzz targets of my_add (``ort.MyAdd``, ``torch.my_add``): the minimal fuzz module. Shapes of rank 0 to 8,
broadcastable or not, empty or (rarely) with an output of 2^40 elements; seven dtypes, sometimes mixed; missing,
empty-named and extra inputs; an unexpected attribute; NaN and infinite values."""

from __future__ import annotations

import math
import os

import numpy as np

from ._common import (
    INVALID_ACCEPTED,
    MATCH,
    NO_HUGE,
    chance,
    one_node_model,
    random_values,
    rejected,
    same_values,
    tensor_info,
    to_torch,
)

ORT_NODE = "MyAdd"
FLOAT_DTYPES = [np.float32, np.float64, np.float16]


def config(rng, kind: str) -> dict:
    def shape(rank):
        return [int(rng.choice([1, 1, 1, 2, 3, 4, 0, 5, 7])) for _ in range(rank)]

    rank_a, rank_b = int(rng.integers(0, 9)), int(rng.integers(0, 9))
    a, b = shape(rank_a), shape(rank_b)
    # Usually broadcastable: copy b's trailing dims into a, then drop some to 1.
    if chance(rng, 0.7):
        for i in range(1, min(rank_a, rank_b) + 1):
            a[-i] = b[-i] if chance(rng, 0.8) else 1
    if math.prod(a) * max(1, math.prod(b)) > 4096 or math.prod(b) * max(1, math.prod(a)) > 4096:
        a, b = a[:3], b[:3]  # keep the arrays small; huge outputs come from the case below
    # A broadcast whose output cannot be allocated (2^40 elements), from small inputs.
    if chance(rng, 0.03) and not os.environ.get(NO_HUGE):
        a, b = [2**20, 1], [1, 2**20]
    dtypes = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_]
    weights = [0.3, 0.25, 0.2, 0.08, 0.07, 0.05, 0.05]
    dtype_a = dtypes[rng.choice(len(dtypes), p=weights)]
    dtype_b = dtype_a if chance(rng, 0.9) else dtypes[rng.choice(len(dtypes), p=weights)]
    inputs = ["A", "B"]
    if chance(rng, 0.06):
        inputs = [["A"], ["A", "B", "A"], ["A", ""], ["", "B"]][int(rng.integers(0, 4))]
    return {"a": a, "b": b, "dtype_a": dtype_a, "dtype_b": dtype_b, "inputs": inputs,
            "special": chance(rng, 0.15), "extra_attribute": chance(rng, 0.05)}  # fmt: skip


def broadcast_shape(a, b):
    try:
        return list(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        return None


def valid(cfg) -> bool:
    return (
        cfg["inputs"] == ["A", "B"]
        and cfg["dtype_a"] == cfg["dtype_b"]
        and cfg["dtype_a"] in FLOAT_DTYPES
        and broadcast_shape(cfg["a"], cfg["b"]) is not None
    )


def reference(a, b):
    compute = np.float32 if a.dtype == np.float16 else a.dtype
    with np.errstate(over="ignore", invalid="ignore"):
        return (2 * a.astype(compute) + b.astype(compute)).astype(a.dtype)


def run_ort(session, rng, cfg):
    from onnx import helper

    a = random_values(rng, cfg["a"], cfg["dtype_a"], cfg["special"]) if math.prod(cfg["a"]) < 2**21 else None
    b = random_values(rng, cfg["b"], cfg["dtype_b"], cfg["special"]) if math.prod(cfg["b"]) < 2**21 else None
    attributes = {"unexpected": 3} if cfg["extra_attribute"] else {}
    node = helper.make_node("MyAdd", cfg["inputs"], ["C"], domain="opbridge", **attributes)
    declared = [("A", cfg["dtype_a"]), ("B", cfg["dtype_b"])]
    inputs = [tensor_info(n, d) for n, d in declared if n in cfg["inputs"]]
    model = one_node_model(node, inputs, [tensor_info("C", cfg["dtype_a"])])
    try:
        feeds = {n: v for n, v in (("A", a), ("B", b)) if n in cfg["inputs"] and v is not None}
        (out,) = session(model).run(None, feeds)
    except Exception as error:
        return rejected(error)
    if not valid(cfg):
        return INVALID_ACCEPTED
    want = reference(a, b)
    return MATCH if same_values(out, want) else ("mismatch", f"values differ: {out!r} vs {want!r}"[:300])


def run_torch(rng, cfg):
    import torch

    if math.prod(cfg["a"]) >= 2**21 or math.prod(cfg["b"]) >= 2**21:
        # Broadcast views of one element: huge shapes without memory.
        a = torch.zeros(1, dtype=torch.float32).expand(cfg["a"]) if all(d > 0 for d in cfg["a"]) else None
        b = torch.zeros(1, dtype=torch.float32).expand(cfg["b"]) if all(d > 0 for d in cfg["b"]) else None
        if a is None or b is None:
            return "rejected", "skipped: empty huge shape"
        try:
            torch.ops.opbridge.my_add(a, b)
        except Exception as error:
            return rejected(error)
        return "mismatch", "a huge output was accepted"
    a = to_torch(random_values(rng, cfg["a"], cfg["dtype_a"], cfg["special"]))
    b = to_torch(random_values(rng, cfg["b"], cfg["dtype_b"], cfg["special"]))
    if chance(rng, 0.3) and a.dim() >= 2:  # a non-contiguous view with the same values
        a = a.transpose(0, 1).contiguous().transpose(0, 1)
    if chance(rng, 0.1) and b.dim() >= 1 and b.shape[-1] > 0:
        b = torch.cat([b, b], dim=-1)[..., ::2]
    args = [a, b]
    if cfg["inputs"] != ["A", "B"]:
        args = [a] if len(cfg["inputs"]) == 1 else [a, b, a]
    try:
        out = torch.ops.opbridge.my_add(*args)
    except Exception as error:
        return rejected(error)
    if not valid(cfg):
        return INVALID_ACCEPTED
    want = reference(a.numpy(), b.numpy())
    return MATCH if same_values(out.numpy(), want) else ("mismatch", "values differ")
