"""my_add's benchmark (float32, 1 Mi and 64 Mi elements): the minimal bench module.

``triad``       the memory-bandwidth bound: c = 2a + b in C++ (``libopbridge_bench``, ``--triad-library``),
``ort_custom``  ORT ``opbridge::MyAdd``; ``ort_standard``: ORT ``Mul`` + ``Add``,
``torch_op``    ``opbridge.my_add``; ``torch_eager``: ``2 * a + b``.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

import opbridge

from . import MEBI, Bench, Row, Target, check_close, checked_run, ort_session

SIZES = {"1 Mi": MEBI, "64 Mi": 64 * MEBI}
#: The case whose triad measures the memory bandwidth (other ops' notes compare against it).
BANDWIDTH_CASE = "64 Mi"

TARGETS = [
    Target("ort_custom", "ort_standard", 1.5, frozenset({BANDWIDTH_CASE})),
    Target("ort_custom", "triad", 0.85, frozenset({BANDWIDTH_CASE})),
    Target("torch_op", "torch_eager", 1.5, frozenset({BANDWIDTH_CASE})),
]


def run(bench: Bench) -> None:
    models = {"ort_custom": _elementwise_model(custom=True), "ort_standard": _elementwise_model(custom=False)}
    for case, numel in SIZES.items():
        _case(bench, case, numel, models)


def _case(bench: Bench, case: str, numel: int, models: dict[str, onnx.ModelProto]) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal(numel, dtype=np.float32)
    b = rng.standard_normal(numel, dtype=np.float32)
    want = 2 * a + b
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    torch_op, torch_eager = partial(opbridge.my_add, ta, tb), lambda: 2 * ta + tb
    record = partial(bench.record, "my_add", case)
    for threads in bench.threads:
        torch.set_num_threads(threads)
        if bench.triad is not None:
            c = np.empty_like(a)
            triad = partial(bench.triad, c.ctypes.data, a.ctypes.data, b.ctypes.data, numel, threads)
            triad.keep = c  # timed later, with the case's other paths (Bench.record): c must outlive the loop
            triad()
            check_close("triad", c, want, 0, 0)
            record(threads, "triad", triad)
        else:
            record(threads, "triad", None, "no --triad-library")
        for path, model in models.items():
            session = ort_session(model, threads, path == "ort_custom")
            record(threads, path, checked_run(path, session, {"A": a, "B": b}, want, 1e-6, 1e-6))
        check_close("torch_op", torch_op().numpy(), want, 1e-6, 1e-6)
        record(threads, "torch_op", torch_op)
        record(threads, "torch_eager", torch_eager)


def triad_bandwidth(rows: list[Row]) -> dict[int, float]:
    """threads -> the memory bandwidth (GB/s) the triad reached in this run: it reads a and b, writes c."""
    return {
        r.threads: 3 * SIZES[BANDWIDTH_CASE] * 4 / (r.median_ms / 1000) / 1e9
        for r in rows
        if r.op == "my_add" and r.path == "triad" and r.case == BANDWIDTH_CASE and r.median_ms
    }


def _elementwise_model(custom: bool) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N"]) for n in ("A", "B")]
    output = helper.make_tensor_value_info("C", TensorProto.FLOAT, ["N"])
    if custom:
        nodes = [helper.make_node("MyAdd", ["A", "B"], ["C"], domain="opbridge")]
        initializers = []
    else:
        nodes = [helper.make_node("Mul", ["A", "two"], ["twice"]), helper.make_node("Add", ["twice", "B"], ["C"])]
        initializers = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])]
    graph = helper.make_graph(nodes, "my_add", inputs, [output], initializers)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("opbridge", 1)] if custom else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)
