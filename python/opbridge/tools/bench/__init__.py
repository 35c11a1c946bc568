"""``python -m opbridge bench``: opbridge's kernels against their baselines, in one run.

Every row times one path (an ORT session or a torch call) at 1 and 2 threads.
The paths of one case and thread count are timed together, in ``--repeat``
interleaved rounds (:func:`interleaved_times`), the median of each path's runs
reported: a shared machine's speed drifts, and the ratios need every path of a
case timed under the same drift. Each path's
output is checked against its baseline's before it is timed. Ratios are taken
against baselines measured in the same run, never against stored numbers.

This package is the harness. What is timed lives with each op, in ``<op>.py``
named after it (the module docstring lists its paths), found here as op modules
are (no list is kept; names starting with an underscore are helpers), and the
``framework`` section (``_framework.py``: import time, export caches). Each of
them declares:

- ``run(bench: Bench) -> None``: times every path, checking each path's output
  first (:func:`check_close`; an ORT session: :func:`checked_run`), and adds rows with
  ``bench.record(op, case, threads, path, fn, note)`` (``fn=None`` and a note
  starting ``n/a`` for a path that cannot run here);
- ``TARGETS: list[Target]``: the bars, a path against a baseline path of the
  same op, case and thread count;
- optionally ``notes(rows: list[Row]) -> list[str]``: lines added under the
  op's section of the report (and printed at the end of the run).

ORT sessions run with ``intra_op_num_threads`` = threads and IO binding (inputs
and the output preallocated, so no copies are timed); torch runs with
``torch.set_num_threads`` and allocates its output in every call, as users do.
"""

from __future__ import annotations

import ctypes
import datetime
import importlib
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import numpy as np
import onnx
import onnxruntime as ort
import torch

import opbridge
import opbridge_ort

from ..._cli import BENCH_FRAMEWORK, bench_sections

MEBI = 1 << 20


@dataclass
class Row:
    op: str
    case: str
    threads: int
    path: str
    median_ms: float | None
    runs_ms: list[float] = field(default_factory=list)
    note: str = ""


class Target(NamedTuple):
    """A bar: baseline time / ``path`` time must reach ``bar`` (above 1: the path is faster; against a bound such
    as ``triad`` or ``gemm``, the fraction of it reached). ``bar`` None: the ratio is reported without a bar;
    ``cases`` None: the bar holds in every case of the op."""

    path: str
    baseline: str
    bar: float | None
    cases: frozenset[str] | None = None


def sections() -> dict[str, ModuleType]:
    """Every op's bench module (``<op>.py`` here), then the ``framework`` section: the names ``--ops`` takes."""
    return {
        name: importlib.import_module(f"{__name__}._{name}" if name == BENCH_FRAMEWORK else f"{__name__}.{name}")
        for name in bench_sections()
    }


def time_call(fn: Callable[[], object], warmup: int, repeat: int) -> list[float]:
    """Times of `fn` (ms): ``warmup`` runs, then ``repeat`` timed runs, back to back."""
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1e3)
    return runs


#: Idle seconds before each slice of a path: the previous slice's spinning threads have parked by then (ORT's
#: intra-op workers spin about 35 ms after a run, OpenMP's and OpenVINO's less) instead of taking a core.
SETTLE_S = 0.05
#: A path's first slice warms up for ``--warmup`` runs and at least this long (first-touch page faults, caches).
WARMUP_S = 0.05
#: Each path is timed for at least this long in all (and at least ``--repeat`` runs, at most MAX_RUNS): the
#: median of a millisecond path is then one of hundreds of runs, not of seven.
TIMED_S = 0.3
MAX_RUNS = 400
#: A path faster than this (ms) gets one warm-up run before each later slice (the other paths evicted its data).
_REWARM_MS = 20.0


def interleaved_times(fns: list[Callable[[], object]], warmup: int, rounds: int,
                      before: Callable[[int], None] | None = None) -> list[list[float]]:  # fmt: skip
    """Times (ms) of each of `fns`, taken in `rounds` rounds that give each fn one slice in turn: SETTLE_S idle,
    warm-up (the first slice: `warmup` runs and WARMUP_S; later slices of a fast fn: one run), then timed runs,
    at least one and TIMED_S / `rounds` of them. A shared machine's speed drifts by 2x within seconds (another
    tenant on the core's sibling thread); interleaving gives every path of a case the same drift, so their ratios
    hold where back-to-back timing of one path then the next did not. `before(i)`: called before fn i's slice."""
    runs: list[list[float]] = [[] for _ in fns]
    per_slice_ms, cap = TIMED_S * 1e3 / rounds, max(1, MAX_RUNS // rounds)
    for round_index in range(rounds):
        for i, fn in enumerate(fns):
            if before is not None:
                before(i)
            time.sleep(SETTLE_S)
            if round_index == 0:
                start, count = time.perf_counter(), 0
                while count < warmup or time.perf_counter() - start < WARMUP_S:
                    fn()
                    count += 1
            elif statistics.median(runs[i]) < _REWARM_MS:
                fn()
            taken: list[float] = []
            while not taken or (sum(taken) < per_slice_ms and len(taken) < cap):
                start = time.perf_counter()
                fn()
                taken.append((time.perf_counter() - start) * 1e3)
            runs[i] += taken
    return runs


def cpu_has_bf16() -> bool:
    """Whether this CPU has bfloat16 dot-product instructions (AVX512-BF16 or AMX-BF16): where the half-precision
    paths' bars apply (docs/benchmarks.md)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def ort_session(model: onnx.ModelProto, threads: int, with_library: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if with_library:
        options = opbridge_ort.session_options(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def bound_run(
    session: ort.InferenceSession, inputs: dict[str, np.ndarray], output: np.ndarray, uint16_as: int | None = None
) -> Callable[[], None]:
    """A zero-copy run: inputs and the output bound to numpy buffers. ``uint16_as``: the ONNX element type that
    uint16 buffers hold (bfloat16 bits: numpy has no bfloat16)."""

    def as_value(array: np.ndarray) -> ort.OrtValue:
        if uint16_as is not None and array.dtype == np.uint16:
            return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array, uint16_as)
        return ort.OrtValue.ortvalue_from_numpy(array)

    binding = session.io_binding()
    keep = []
    for name, array in inputs.items():
        value = as_value(array)
        keep.append(value)
        binding.bind_ortvalue_input(name, value)
    out_value = as_value(output)
    keep.append(out_value)
    binding.bind_ortvalue_output(session.get_outputs()[0].name, out_value)

    def run() -> None:
        session.run_with_iobinding(binding)

    run.keep = keep  # the OrtValues must outlive the binding
    return run


def checked_run(
    name: str, session: ort.InferenceSession, inputs: dict[str, np.ndarray], want: np.ndarray, rtol: float, atol: float
) -> Callable[[], None]:
    """A zero-copy run of `session` (see :func:`bound_run`) whose output was checked against `want` once."""
    out = np.empty(want.shape, dtype=want.dtype)
    run = bound_run(session, inputs, out)
    run()
    check_close(name, out, want, rtol, atol)
    return run


def check_close(name: str, got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> None:
    """A path's output against its baseline's, before either is timed."""
    if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol):
        error = float(np.max(np.abs(got.astype(np.float64) - want))) if got.shape == want.shape else "shape"
        raise AssertionError(f"{name}: output differs from the baseline (max abs error {error})")


class Bench:
    """The run's settings and rows; each section's ``run`` adds its rows with :meth:`record`."""

    def __init__(self, threads: list[int], warmup: int, repeat: int, triad_library: str | None) -> None:
        self.threads, self.warmup, self.repeat = threads, warmup, repeat
        self.rows: list[Row] = []
        #: paths of one case waiting to be timed together: (row, fn, torch thread count at record time)
        self._pending: list[tuple[Row, Callable[[], object], int]] = []
        #: the memory-bandwidth bound, c = 2a + b in C++ (libopbridge_bench), or None without --triad-library
        self.triad = None
        #: the whole helper library (libopbridge_bench: the triad, the rooflines of gathers), or None
        self.helpers: ctypes.CDLL | None = None
        if triad_library:
            library = self.helpers = ctypes.CDLL(triad_library)
            self.triad = library.opbridge_bench_triad
            self.triad.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int]
            self.triad.restype = None

    def record(self, op: str, case: str, threads: int, path: str, fn: Callable[[], object] | None, note: str = ""):
        """Adds a row for `path`; `fn` is timed with the other paths of the same op, case and thread count, in
        interleaved rounds (:func:`interleaved_times`), when the first path of another case is recorded or at
        :meth:`flush`. `fn` runs then at the torch thread count set now; it must stay valid until then."""
        row = Row(op, case, threads, path, None, [], note)
        self.rows.append(row)
        if fn is None:
            self._show(row)
            return row
        first = self._pending[0][0] if self._pending else None
        if first is not None and (first.op, first.case, first.threads) != (op, case, threads):
            self.flush()
        self._pending.append((row, fn, torch.get_num_threads()))
        return row

    def flush(self) -> None:
        """Times the pending paths of one case (see :meth:`record`) and fills in their rows."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        current = torch.get_num_threads()
        runs = interleaved_times([fn for _, fn, _ in pending], self.warmup, self.repeat,
                                 before=lambda i: torch.set_num_threads(pending[i][2]))  # fmt: skip
        torch.set_num_threads(current)
        for (row, _, _), times in zip(pending, runs, strict=True):
            row.runs_ms, row.median_ms = times, statistics.median(times)
            self._show(row)

    @staticmethod
    def _show(row: Row) -> None:
        shown = f"{row.median_ms:10.3f} ms" if row.median_ms is not None else "       n/a   "
        print(f"  {row.op:14} {row.case:24} {row.threads}t  {row.path:18} {shown}  {row.note}", flush=True)


# Report ------------------------------------------------------------------------------------------------


def ratios(rows: list[Row]) -> list[dict]:
    """Every (path, baseline) pair of the sections' TARGETS measured in `rows`, with its ratio and whether it
    meets its bar."""
    index = {(r.op, r.case, r.threads, r.path): r for r in rows}
    out = []
    for op, module in sections().items():
        for path, baseline, target, cases in module.TARGETS:
            for r in rows:
                if r.op != op or r.path != path:
                    continue
                base = index.get((op, r.case, r.threads, baseline))
                if base is None:
                    continue
                ratio = base.median_ms / r.median_ms if base.median_ms and r.median_ms else None
                bar = target if cases is None or r.case in cases else None
                out.append({"op": op, "case": r.case, "threads": r.threads, "path": path, "baseline": baseline,
                            "ratio": ratio, "target": bar,
                            "met": None if ratio is None or bar is None else ratio >= bar})  # fmt: skip
    return out


def section_notes(module: ModuleType, rows: list[Row]) -> list[str]:
    notes = getattr(module, "notes", None)
    return notes(rows) if notes is not None else []


def markdown(rows: list[Row], summary: list[dict], environment: dict, parity_report: Path | None = None) -> str:
    lines = [
        "# Benchmarks",
        "",
        "Generated by `nox -s bench` (`python -m opbridge bench`); do not edit by hand. A case's paths are timed "
        f"in {environment['repeat']} interleaved rounds (each slice after {SETTLE_S:g} s idle; {environment['warmup']} "
        f"warm-up runs first); a time is the median of a path's runs, at least {environment['repeat']} and "
        f"{TIMED_S:g} s of them, on {environment.get('date', 'an unrecorded date')}, on "
        f"{environment['machine']}: torch {environment['torch']}, onnxruntime {environment['onnxruntime']}; "
        f"the ORT library's GEMM: {environment.get('openblas') or 'n/a'}.",
        "A ratio is baseline time / opbridge time (above 1: opbridge is faster); for `triad`, `gemm` and the "
        "rooflines it is the fraction of the bound reached. Paths and method: `python/opbridge/tools/bench/` (one "
        "module per op); how the kernels get there: [architecture.md](architecture.md#performance).",
        "",
    ]
    for op, module in sections().items():
        op_rows = [r for r in rows if r.op == op]
        if not op_rows:
            continue
        paths = list(dict.fromkeys(r.path for r in op_rows))
        cases = list(dict.fromkeys((r.case, r.threads) for r in op_rows))
        lines += [f"## {op}: times (ms)", "", "| case | threads | " + " | ".join(paths) + " |",
                  "|---|---:|" + "---:|" * len(paths)]  # fmt: skip
        for case, threads in cases:
            cells = []
            for path in paths:
                row = next((r for r in op_rows if (r.case, r.threads, r.path) == (case, threads, path)), None)
                cells.append(f"{row.median_ms:.2f}" if row and row.median_ms is not None else "n/a")
            lines.append(f"| {case} | {threads} | " + " | ".join(cells) + " |")
        lines += ["", f"## {op}: ratios", "", "| case | threads | opbridge path | baseline | ratio | target | met |",
                  "|---|---:|---|---|---:|---:|---|"]  # fmt: skip
        for item in (s for s in summary if s["op"] == op):
            ratio = f"{item['ratio']:.2f}" if item["ratio"] is not None else "n/a"
            target = f">= {item['target']}" if item["target"] is not None else "-"
            met = {True: "yes", False: "**no**", None: "-"}[item["met"]]
            lines.append(f"| {item['case']} | {item['threads']} | {item['path']} | {item['baseline']} | {ratio} | "
                         f"{target} | {met} |")  # fmt: skip
        notes = sorted({f"{r.path}: {r.note}" for r in op_rows if r.note.startswith("n/a")})
        notes += section_notes(module, rows)
        lines += [""] + [f"- {note}" for note in notes] + ([""] if notes else [])
    lines += parity_section(parity_report)
    return "\n".join(lines).rstrip() + "\n"


# `nox -s parity` before opbridge shared the exporters' per-process work (main at 715cb7a), measured
# 2026-11-22 on the machine of docs/benchmarks.md (AMD EPYC, 2 cores; 879 s on an Intel Xeon of the same kind):
# the baseline of the throughput below.
PARITY_BEFORE = {"cells": 774, "seconds": 370.0, "commit": "715cb7a"}


def parity_section(report: Path | None) -> list[str]:
    """The parity matrix's throughput from a `nox -s parity` report, against PARITY_BEFORE."""
    import re

    if report is None or not report.is_file():
        return []
    text = json.loads(report.read_text()).get("summary", "")
    match = re.search(r"\((\d+) cells.* in (\d+) s", text)
    if not match:
        return []
    cells, seconds = int(match.group(1)), float(match.group(2))
    before = PARITY_BEFORE
    return [
        "## parity matrix (nox -s parity)", "",
        "| run | cells | seconds | cells/s |", "|---|---:|---:|---:|",
        f"| before ({before['commit']}) | {before['cells']} | {before['seconds']:.0f} | "
        f"{before['cells'] / before['seconds']:.2f} |",
        f"| this run ({report.name}) | {cells} | {seconds:.0f} | {cells / seconds:.2f} |", "",
        f"- {text}", "",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from ..._cli import bench_parser

    args = bench_parser().parse_args(argv)
    opbridge._load()  # deferred under `python -m opbridge`; the op modules imported below need it done

    bench = Bench(args.threads, args.warmup, args.repeat, args.triad_library)
    environment = {
        "torch": torch.__version__, "onnxruntime": ort.__version__, "opbridge": opbridge.__version__,
        "python": platform.python_version(), "machine": f"{cpu_name()}, {_cpu_count()} cores",
        "warmup": args.warmup, "repeat": args.repeat, "openblas": openblas_kernels(),
        "date": datetime.date.today().isoformat(),
    }  # fmt: skip
    print(f"opbridge bench: torch {environment['torch']}, onnxruntime {environment['onnxruntime']}, "
          f"threads {args.threads}, each case's paths in {args.repeat} interleaved rounds", flush=True)  # fmt: skip
    start = time.perf_counter()
    modules = sections()
    for op in args.ops:
        modules[op].run(bench)
        bench.flush()
    summary = ratios(bench.rows)
    print(f"\n{'op':14} {'case':24} thr {'path':12} {'baseline':18} ratio   target")
    for item in summary:
        ratio = f"{item['ratio']:6.2f}" if item["ratio"] is not None else "   n/a"
        target = f">= {item['target']}" if item["target"] is not None else ""
        flag = {True: "", False: "  MISSED", None: ""}[item["met"]]
        print(f"{item['op']:14} {item['case']:24} {item['threads']}t  {item['path']:12} {item['baseline']:18} "
              f"{ratio}  {target}{flag}")  # fmt: skip
    for op in args.ops:
        for note in section_notes(modules[op], bench.rows):
            print(f"{op}: {note}")
    missed = [item for item in summary if item["met"] is False]
    print(f"bench: {time.perf_counter() - start:.0f} s; {len(missed)} of "
          f"{sum(item['met'] is not None for item in summary)} targets missed")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"environment": environment, "rows": [asdict(r) for r in bench.rows], "ratios": summary}
        args.json.write_text(json.dumps(payload, indent=1))
    if args.markdown:
        args.markdown.write_text(markdown(bench.rows, summary, environment, args.parity_report))
    return 0


def openblas_kernels() -> str | None:
    """Which kernels the ORT library's OpenBLAS (scipy-openblas32) runs in this process, and why where the
    environment chose them: ``OPENBLAS_CORETYPE`` overrides OpenBLAS's own choice for the CPU (a machine that sets
    ``OPENBLAS_CORETYPE=Haswell`` runs AVX2 kernels on an AVX-512 CPU, about half the GEMM speed)."""
    import ctypes
    import os

    try:
        import scipy_openblas32

        library = ctypes.CDLL(str(Path(scipy_openblas32.get_lib_dir()) / scipy_openblas32.get_library(fullname=True)))
        library.scipy_openblas_get_corename.restype = ctypes.c_char_p
        kernels = library.scipy_openblas_get_corename().decode()
    except (ImportError, OSError, AttributeError):
        return None
    forced = os.environ.get("OPENBLAS_CORETYPE")
    text = f"OpenBLAS {kernels} kernels" + (f" (OPENBLAS_CORETYPE={forced} in the environment)" if forced else "")
    # The library's rule (cpp/ort/gemm.cc): ORT's own Gemm where OpenBLAS runs narrower kernels than the CPU has.
    choice = os.environ.get("OPBRIDGE_ORT_GEMM")
    narrower = "AVX-512" in cpu_name() and kernels not in ("SkylakeX", "Cooperlake", "SapphireRapids")
    if choice == "runtime" or (choice != "openblas" and narrower):
        text += "; the deformable convolutions' products run on ORT's own Gemm (MLAS) instead"
    return text


def cpu_name() -> str:
    """The CPU's model name and, on x86-64, the level whose clones of the kernels run on it (target_clones)."""
    name, flags = platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        bf16 = ", AVX512-BF16" if "avx512_bf16" in flags else ""
        return f"{name} (x86-64-v4: AVX-512{bf16})"
    if {"avx2", "fma", "bmi2"} <= flags:
        return f"{name} (x86-64-v3: AVX2)"
    return name


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
