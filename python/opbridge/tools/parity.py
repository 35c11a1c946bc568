"""The parity matrix: PyTorch output vs ONNX Runtime output for every op x call
path x exporter x lowering x opset x dtype, each cell over same-shape and
broadcast operands, exported with a static batch and with a dynamic one (run at
another batch size than exported).

Cells come from the op specs (opbridge.specs), so a new op is covered by adding
its spec. ``python -m opbridge parity --help`` runs it; ``nox -s parity`` is the
main job.

Every cell exports the way a user does after ``import opbridge``: plain
``torch.onnx.export`` inside ``opbridge.onnx.lowering(kind)`` (the one
exception: the TorchScript-based exporter's ``function`` lowering, whose
functions only :func:`opbridge.onnx.export` can attach). Cells run in worker
processes, grouped by (op, call path, exporter, dtype) so that what an export
builds once per process (torch's ONNX registry per opset, the decomposition
tables) is shared by many cells; the largest groups start first.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import json
import os
import sys
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .. import specs

EXPORTERS = ("legacy", "dynamo")
#: static: exported and run at one batch size; dynamic: a dynamic batch, run at another; unknown (the
#: TorchScript-based exporter only): every dimension of every input and output dynamic, so that a lowering meets
#: no static size at all, as in module code that computes sizes from traced shapes; run at another batch size.
BATCH_KINDS = ("static", "dynamic", "unknown")
EXPORT_BATCH, DYNAMIC_RUN_BATCH = 2, 5
#: The TorchScript-based exporter's opsets in the matrix start where the tutorials do.
LEGACY_MIN_MATRIX_OPSET = 9

_DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bool: "bool",
}
# (rtol, atol) for ORT vs PyTorch; float16 allows the two roundings of Mul+Add vs one.
_TOLERANCES = {
    "float32": (1e-5, 1e-6),
    "float64": (1e-12, 1e-12),
    "float16": (2e-3, 2e-3),
    "int32": (0, 0),
    "int64": (0, 0),
    "bool": (0, 0),
}


@dataclass(frozen=True)
class Cell:
    """One row of the table; it runs every operand kind x batch kind of the op."""

    op: str
    path: str
    exporter: str
    lowering: str
    opset: int
    dtype: str


@dataclass
class SubResult:
    operands: str
    batch: str
    passed: bool
    max_error: float | None
    detail: str = ""


@dataclass
class CellResult:
    cell: Cell
    status: str  # "pass", "fail", or "n/a" (failed where the spec expects it, see reason)
    max_error: float | None
    seconds: float
    subresults: list[SubResult]
    reason: str = ""

    @property
    def detail(self) -> str:
        if self.status == "n/a":
            return f"expected: {self.reason}"
        failed = [s for s in self.subresults if not s.passed]
        if len({s.detail for s in failed}) == 1 and len(failed) == len(self.subresults):
            return failed[0].detail  # the same reason everywhere: say it once
        return "; ".join(f"{s.operands}/{s.batch}: {s.detail}" for s in failed)


def matrix_opsets(exporter: str) -> range:
    from ..onnx import supported_opsets

    opsets = supported_opsets(exporter == "dynamo")
    if exporter == "legacy":
        return range(max(opsets.start, LEGACY_MIN_MATRIX_OPSET), opsets.stop)
    return opsets


def cells(
    ops: Iterable[str] | None = None,
    exporters: Iterable[str] = EXPORTERS,
    lowerings: Iterable[str] = specs.LOWERING_KINDS,
    opsets: Iterable[int] | None = None,
    dtypes: Iterable[str] | None = None,
    paths: Iterable[str] | None = None,
) -> list[Cell]:
    """Every cell of the matrix, filtered by the given selections."""
    chosen_opsets = set(opsets) if opsets is not None else None
    result = []
    for spec in specs.all_specs():
        if ops is not None and spec.name not in set(ops):
            continue
        if spec.call_paths and not spec.is_available():  # e.g. torchvision's ops do not load here
            continue
        for path in spec.call_paths:
            if paths is not None and path not in set(paths):
                continue
            for exporter in exporters:
                for lowering in lowerings:
                    for opset in matrix_opsets(exporter):
                        if chosen_opsets is not None and opset not in chosen_opsets:
                            continue
                        if not any(lw.kind == lowering and lw.supports(opset) for lw in spec.lowerings):
                            continue
                        for dtype in spec.dtypes:
                            name = _DTYPE_NAMES[dtype]
                            if dtypes is None or name in set(dtypes):
                                result.append(Cell(spec.name, path, exporter, lowering, opset, name))
    return result


def _batch_dims(small: Sequence[torch.Tensor], large: Sequence[torch.Tensor]) -> list[list[int]]:
    """Per tensor, the dims whose size follows the batch (found by comparing two batch sizes)."""
    return [[d for d in range(t.dim()) if t.shape[d] != u.shape[d]] for t, u in zip(small, large, strict=True)]


def _as_tuple(output) -> tuple[torch.Tensor, ...]:
    return tuple(output) if isinstance(output, (tuple, list)) else (output,)


def run_subcase(spec: specs.OpSpec, cell: Cell, operands: str, batch: str) -> SubResult:
    import onnxruntime

    import opbridge_ort

    dtype = next(d for d in spec.dtypes if _DTYPE_NAMES[d] == cell.dtype)
    module = spec.module(cell.path, operands)
    if dtype.is_floating_point:
        module = module.to(dtype)  # parameters follow the cell's dtype
    export_inputs = spec.sample_inputs(dtype, operands, EXPORT_BATCH)
    run_batch = EXPORT_BATCH if batch == "static" else DYNAMIC_RUN_BATCH
    run_inputs = spec.sample_inputs(dtype, operands, run_batch)
    with torch.no_grad():
        expected = _as_tuple(module(*run_inputs))
        export_outputs = _as_tuple(module(*export_inputs))
    output_names = [f"out{i}" for i in range(len(expected))]
    input_names = list(spec.input_names[: len(export_inputs)])
    kwargs: dict = {"input_names": input_names, "output_names": output_names}
    if cell.exporter == "dynamo":
        kwargs["verbose"] = False  # no per-step progress lines from the exporter
    if batch == "unknown":
        names = input_names + output_names
        tensors = [*export_inputs, *export_outputs]
        kwargs["dynamic_axes"] = {
            n: {d: f"{n}_{d}" for d in range(t.dim())} for n, t in zip(names, tensors, strict=True) if t.dim()
        }
    elif batch == "dynamic":
        dims = _batch_dims(export_inputs, spec.sample_inputs(dtype, operands, DYNAMIC_RUN_BATCH))
        dims += _batch_dims(export_outputs, expected)
        if cell.exporter == "dynamo":  # torch.export's own form; dynamic_axes would be converted with a warning
            batch_dim = torch.export.Dim("batch")
            kwargs["dynamic_shapes"] = tuple({d: batch_dim for d in ds} or None for ds in dims[: len(export_inputs)])
        else:
            names = input_names + output_names
            kwargs["dynamic_axes"] = {n: {d: "batch" for d in ds} for n, ds in zip(names, dims, strict=True) if ds}
    with warnings.catch_warnings():
        # The exporters' advice (deprecations, axis naming) is not a parity failure.
        warnings.simplefilter("ignore")
        model = _export(module, export_inputs, cell, kwargs)
    custom_nodes = [n.op_type for n in model.graph.node if n.domain == specs.CUSTOM_DOMAIN]
    function_nodes = [n.op_type for n in model.graph.node if n.domain == specs.FUNCTION_DOMAIN]
    if cell.lowering != "custom" and custom_nodes:
        return SubResult(operands, batch, False, None, f"{cell.lowering} lowering emitted custom nodes {custom_nodes}")
    if cell.lowering == "custom" and not custom_nodes:
        return SubResult(operands, batch, False, None, "custom lowering emitted no opbridge node")
    if cell.lowering == "function" and not (function_nodes and model.functions):
        return SubResult(operands, batch, False, None, "function lowering emitted no function call")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    if cell.lowering != "custom":
        # Standard and function lowerings must run without opbridge's library: prove it.
        session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    else:
        session = opbridge_ort.InferenceSession(model, options)
    feeds = {name: t.numpy() for name, t in zip(input_names, run_inputs, strict=True)}
    got = session.run(None, feeds)
    rtol, atol = spec.tolerances.get(cell.dtype, _TOLERANCES[cell.dtype])
    max_error = 0.0
    for ort_out, torch_out in zip(got, expected, strict=True):
        want = torch_out.numpy()
        if ort_out.shape != want.shape or ort_out.dtype != want.dtype:
            return SubResult(
                operands, batch, False, None,
                f"ORT gave {ort_out.dtype}{list(ort_out.shape)}, PyTorch {want.dtype}{list(want.shape)}",
            )  # fmt: skip
        if want.size:  # the same inf, or NaN where PyTorch has NaN, is agreement (np.allclose's equal_nan below)
            a, b = ort_out.astype(np.float64), want.astype(np.float64)
            with np.errstate(invalid="ignore"):  # inf - inf
                difference = np.where((a == b) | (np.isnan(a) & np.isnan(b)), 0.0, np.abs(a - b))
            max_error = max(max_error, float(np.max(difference)))
        if not np.allclose(ort_out, want, rtol=rtol, atol=atol, equal_nan=True):
            return SubResult(operands, batch, False, max_error, f"max error {max_error:.3g} > rtol {rtol}/atol {atol}")
    return SubResult(operands, batch, True, max_error)


def _export(module: torch.nn.Module, inputs: tuple, cell: Cell, kwargs: dict):
    """The cell's model as a user exports it: plain torch.onnx.export under opbridge.onnx.lowering."""
    import onnx

    from .. import onnx as opbridge_onnx

    if cell.exporter == "legacy" and cell.lowering == "function":
        return opbridge_onnx.export(module, inputs, None, opset_version=cell.opset, dynamo=False, lowering="function",
                                    **kwargs)  # fmt: skip
    with opbridge_onnx.lowering(cell.lowering):
        if cell.exporter == "dynamo":
            return torch.onnx.export(module, inputs, dynamo=True, opset_version=cell.opset, **kwargs).model_proto
        buffer = io.BytesIO()
        torch.onnx.export(module, inputs, buffer, dynamo=False, opset_version=cell.opset, **kwargs)
        return onnx.load_from_string(buffer.getvalue())


def run_cell(cell: Cell) -> CellResult:
    spec = specs.get(cell.op)
    start = time.perf_counter()
    subresults = []
    for operands in spec.operand_kinds:
        for batch in BATCH_KINDS:
            if batch == "unknown" and cell.exporter != "legacy":
                continue  # the dynamo exporter keeps symbolic sizes: its dynamic batch is the same test
            try:
                subresults.append(run_subcase(spec, cell, operands, batch))
            except Exception as error:  # a failed export or run is a failed cell, with its reason
                first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
                subresults.append(
                    SubResult(operands, batch, False, None, f"{type(error).__name__}: {first_line[:1000]}")
                )
    errors = [s.max_error for s in subresults if s.max_error is not None]
    status = "pass" if all(s.passed for s in subresults) else "fail"
    reason = (spec.known_gaps(cell) if spec.known_gaps else None) or _environment_gap(subresults)
    if status == "fail" and reason:
        status = "n/a"
    return CellResult(cell, status, max(errors) if errors else None, time.perf_counter() - start, subresults, reason)


# Failures that come from the runtime's or exporter's version, not from opbridge: recognised by their
# message, reported as n/a with this reason.
_ENVIRONMENT_GAPS = {
    "Unsupported model IR version": "this ONNX Runtime cannot read the IR version the exporter writes "
    "(e.g. ORT 1.16 reads IR <= 9; torch's dynamo exporter writes IR 10)",
    "ValidateOpsetForDomain": "this ONNX Runtime predates the model's opset (e.g. ORT 1.20 knows opsets <= 21)",
}


def _environment_gap(subresults: Sequence[SubResult]) -> str:
    failed = [s for s in subresults if not s.passed]
    for fragment, reason in _ENVIRONMENT_GAPS.items():
        if failed and all(fragment in s.detail for s in failed):
            return reason
    return ""


def _worker_init() -> None:
    import warnings

    warnings.simplefilter("ignore")  # the exporters' deprecation chatter would drown the table
    os.environ.setdefault("TORCH_LOGS", "")
    import opbridge  # noqa: F401  registers the ops and export rules in the worker

    torch.set_num_threads(1)


COLUMNS = ("op", "call path", "exporter", "lowering", "opset", "dtype", "result", "max error")


def _row(result: CellResult) -> list[str]:
    c = result.cell
    error = "-" if result.max_error is None else f"{result.max_error:.1e}"
    return [c.op, c.path, c.exporter, c.lowering, str(c.opset), c.dtype, result.status.upper(), error]


def _format_row(values: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True))


def _groups(selected: Sequence[Cell]) -> list[list[Cell]]:
    """Cells sharing (op, call path, exporter, dtype), largest (by estimated time) first."""
    groups: dict[tuple, list[Cell]] = {}
    for cell in selected:
        groups.setdefault((cell.op, cell.path, cell.exporter, cell.dtype), []).append(cell)
    return sorted(groups.values(), key=lambda cells: -sum(_cost(c) for c in cells))


def _cost(cell: Cell) -> float:
    """Relative time of a cell (measured: a dynamo export takes ~10x a TorchScript-based one)."""
    return len(specs.get(cell.op).operand_kinds) * (10.0 if cell.exporter == "dynamo" else 1.0)


def run_group(cells_of_group: Sequence[Cell]) -> list[CellResult]:
    return [run_cell(cell) for cell in cells_of_group]


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def run(selected: Sequence[Cell], jobs: int = 1, stream=sys.stdout, progress=sys.stderr) -> list[CellResult]:
    """Runs the cells (in ``jobs`` processes), printing each row as it completes and, on ``progress``,
    how many cells are done and an estimate of the time left."""
    widths = [max(len(COLUMNS[0]), 8), 17, 8, 8, 5, 7, 6, 9]
    print(_format_row(COLUMNS, widths), file=stream)
    print(_format_row(["-" * w for w in widths], widths), file=stream, flush=True)
    results: list[CellResult] = []
    groups = _groups(selected)
    total_cost = sum(_cost(c) for c in selected)
    done_cost = 0.0
    start = time.perf_counter()

    def report(group_results: list[CellResult]) -> None:
        nonlocal done_cost
        for result in group_results:
            results.append(result)
            done_cost += _cost(result.cell)
            line = _format_row(_row(result), widths)
            if result.status != "pass":
                line += f"  {result.detail[:400]}"
            print(line, file=stream, flush=True)
        if progress is not None:
            elapsed = time.perf_counter() - start
            left = elapsed * (total_cost - done_cost) / done_cost if done_cost else 0.0
            print(
                f"parity: {len(results)}/{len(selected)} cells done, {_duration(elapsed)} elapsed, "
                f"about {_duration(left)} left",
                file=progress,
                flush=True,
            )

    if jobs <= 1:
        _worker_init()
        for group in groups:
            report(run_group(group))
    else:
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # fresh interpreters: no torch state shared by fork
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_init) as pool:
            futures = [pool.submit(run_group, group) for group in groups]
            for future in concurrent.futures.as_completed(futures):
                report(future.result())
    order = {cell: index for index, cell in enumerate(selected)}
    return sorted(results, key=lambda r: order[r.cell])


def summary(results: Sequence[CellResult], seconds: float) -> str:
    passed = sum(r.status == "pass" for r in results)
    expected = sum(r.status == "n/a" for r in results)
    failed = len(results) - passed - expected
    subcases = sum(len(r.subresults) for r in results)
    import onnxruntime

    rate = len(results) / seconds if seconds > 0 else 0.0
    return (
        f"parity: {passed} passed, {failed} failed, {expected} n/a as expected ({len(results)} cells, "
        f"{subcases} export+run cases) in {seconds:.0f} s, {rate:.2f} cells/s; "
        f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}"
    )


def environment() -> dict[str, str]:
    """Versions of everything the matrix depends on."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for package in ("opbridge", "torch", "torchvision", "onnxruntime", "onnx", "onnxscript", "numpy"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "-"
    versions["python"] = sys.version.split()[0]
    return versions


def to_json(results: Sequence[CellResult]) -> list[dict]:
    return [
        {
            **dataclasses.asdict(r.cell),
            "status": r.status,
            "reason": r.reason,
            "max_error": r.max_error,
            "seconds": round(r.seconds, 3),
            "cases": [dataclasses.asdict(s) for s in r.subresults],
        }
        for r in results
    ]


def main(argv: Sequence[str] | None = None) -> int:
    from .._cli import parity_parser

    parser = parity_parser()
    args = parser.parse_args(argv)

    import opbridge

    opbridge._load()  # the specs register on import (under `python -m opbridge`, when a command needs them)
    known = sorted(s.name for s in specs.all_specs())
    unknown = sorted(set(args.ops or ()) - set(known))
    if unknown:
        parser.error(f"unknown op(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    opsets = args.opsets
    if args.quick and opsets is None:
        opsets = {9, 13, 17, 18, matrix_opsets("legacy")[-1], matrix_opsets("dynamo")[-1]} - {
            o for o in (13, 17) if o not in matrix_opsets("legacy")
        }
    selected = cells(args.ops, args.exporters, args.lowerings, opsets, args.dtypes, args.paths)
    if not selected:
        print("parity: no cell matches the selection", file=sys.stderr)
        return 2
    print(f"parity: {len(selected)} cells on {args.jobs} worker(s)", flush=True)
    start = time.perf_counter()
    results = run(selected, args.jobs)
    seconds = time.perf_counter() - start
    failures = [r for r in results if r.status == "fail"]
    if failures:
        print("\nfailed cells:")
        for r in failures:
            print("  " + "  ".join(_row(r)[:6]) + f": {r.detail}")
    print("\n" + summary(results, seconds))
    if args.json:
        document = {"summary": summary(results, seconds), "environment": environment(), "cells": to_json(results)}
        with open(args.json, "w") as stream:
            json.dump(document, stream, indent=1)
    return 1 if failures else 0
