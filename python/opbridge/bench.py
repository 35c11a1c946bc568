"""``python -m opbridge bench``: opbridge's kernels against their baselines, in one run.

Every row times one path (an ORT session or a torch call) at 1 and 2 threads:
warm-up calls, then ``--repeat`` timed calls, the median reported. Each path's
output is checked against its baseline's before it is timed. Ratios are taken
against baselines measured in the same run, never against stored numbers.

my_add (float32, 1 Mi and 64 Mi elements):
    ``triad``       the memory-bandwidth bound: c = 2a + b in C++ (``libopbridge_bench``),
    ``ort_custom``  ORT ``opbridge::MyAdd``; ``ort_standard``: ORT ``Mul`` + ``Add``,
    ``torch_op``    ``opbridge.my_add``; ``torch_eager``: ``2 * a + b``.
deform_conv2d (float32, 3x3, with mask):
    ``ort_custom``  ORT ``opbridge::DeformConv2d``; ``ort_standard``: ORT's ``DeformConv``
                    (ORT >= 1.25); ``ort_decomposition``: opbridge's standard-ops lowering (opset 18),
    ``gemm``        the GEMMs of the same sizes alone (OpenBLAS, its own threads),
    ``torch_op``    ``opbridge.deform_conv2d``; ``torch_torchvision``: torchvision's CPU kernel.

ORT sessions run with ``intra_op_num_threads`` = threads and IO binding (inputs
and the output preallocated, so no copies are timed); torch runs with
``torch.set_num_threads`` and allocates its output in every call, as users do.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper

import opbridge
import opbridge_ort

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


@dataclass
class DeformShape:
    batch: int
    in_channels: int
    out_channels: int
    height: int
    width: int
    offset_groups: int = 1

    @property
    def name(self) -> str:
        groups = f" og{self.offset_groups}" if self.offset_groups > 1 else ""
        return f"N{self.batch} C{self.in_channels}->{self.out_channels} {self.height}x{self.width}{groups}"


DEFORM_SHAPES = [
    DeformShape(1, 64, 64, 128, 128),
    DeformShape(1, 256, 256, 50, 84),
    DeformShape(4, 128, 128, 32, 32),
    DeformShape(1, 256, 256, 50, 84, offset_groups=4),
]
MY_ADD_SIZES = {"1 Mi": MEBI, "64 Mi": 64 * MEBI}


def time_call(fn: Callable[[], object], warmup: int, repeat: int) -> list[float]:
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1e3)
    return runs


def ort_session(model: onnx.ModelProto, threads: int, with_library: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if with_library:
        options = opbridge_ort.session_options(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def bound_run(session: ort.InferenceSession, inputs: dict[str, np.ndarray], output: np.ndarray) -> Callable[[], None]:
    """A zero-copy run: inputs and the output bound to numpy buffers."""
    binding = session.io_binding()
    keep = []
    for name, array in inputs.items():
        value = ort.OrtValue.ortvalue_from_numpy(array)
        keep.append(value)
        binding.bind_ortvalue_input(name, value)
    out_value = ort.OrtValue.ortvalue_from_numpy(output)
    keep.append(out_value)
    binding.bind_ortvalue_output(session.get_outputs()[0].name, out_value)

    def run() -> None:
        session.run_with_iobinding(binding)

    run.keep = keep  # the OrtValues must outlive the binding
    return run


def _check(name: str, got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> None:
    if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol):
        error = float(np.max(np.abs(got.astype(np.float64) - want))) if got.shape == want.shape else "shape"
        raise AssertionError(f"{name}: output differs from the baseline (max abs error {error})")


class Bench:
    def __init__(self, threads: list[int], warmup: int, repeat: int, triad_library: str | None) -> None:
        self.threads, self.warmup, self.repeat = threads, warmup, repeat
        self.rows: list[Row] = []
        self.triad = None
        if triad_library:
            library = ctypes.CDLL(triad_library)
            self.triad = library.opbridge_bench_triad
            self.triad.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int]
            self.triad.restype = None

    def record(self, op: str, case: str, threads: int, path: str, fn: Callable[[], object] | None, note: str = ""):
        runs = time_call(fn, self.warmup, self.repeat) if fn is not None else []
        row = Row(op, case, threads, path, statistics.median(runs) if runs else None, runs, note)
        self.rows.append(row)
        shown = f"{row.median_ms:10.3f} ms" if row.median_ms is not None else "       n/a   "
        print(f"  {op:14} {case:24} {threads}t  {path:18} {shown}  {note}", flush=True)
        return row

    # my_add ------------------------------------------------------------------------------------------
    def my_add(self) -> None:
        models = {"ort_custom": _elementwise_model(custom=True), "ort_standard": _elementwise_model(custom=False)}
        for case, numel in MY_ADD_SIZES.items():
            self._my_add_case(case, numel, models)

    def _my_add_case(self, case: str, numel: int, models: dict[str, onnx.ModelProto]) -> None:
        rng = np.random.default_rng(0)
        a = rng.standard_normal(numel, dtype=np.float32)
        b = rng.standard_normal(numel, dtype=np.float32)
        want = 2 * a + b
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        torch_op, torch_eager = partial(opbridge.my_add, ta, tb), lambda: 2 * ta + tb
        for threads in self.threads:
            torch.set_num_threads(threads)
            if self.triad is not None:
                c = np.empty_like(a)
                triad = partial(self.triad, c.ctypes.data, a.ctypes.data, b.ctypes.data, numel, threads)
                triad()
                _check("triad", c, want, 0, 0)
                self.record("my_add", case, threads, "triad", triad)
            else:
                self.record("my_add", case, threads, "triad", None, "no --triad-library")
            for path, model in models.items():
                session = ort_session(model, threads, path == "ort_custom")
                out = np.empty_like(a)
                run = bound_run(session, {"A": a, "B": b}, out)
                run()
                _check(path, out, want, 1e-6, 1e-6)
                self.record("my_add", case, threads, path, run)
            _check("torch_op", torch_op().numpy(), want, 1e-6, 1e-6)
            self.record("my_add", case, threads, "torch_op", torch_op)
            self.record("my_add", case, threads, "torch_eager", torch_eager)

    # deform_conv2d -----------------------------------------------------------------------------------
    def deform_conv2d(self) -> None:
        torchvision_op = _torchvision_deform_conv2d()
        blas = _OpenBLAS.load()
        for shape in DEFORM_SHAPES:
            self._deform_case(shape, torchvision_op, blas)

    def _deform_case(self, shape: DeformShape, torchvision_op, blas: _OpenBLAS | None) -> None:
        torch.manual_seed(0)
        module = opbridge.nn.DeformConv2d(shape.in_channels, shape.out_channels, 3, padding=1).eval()
        x = torch.randn(shape.batch, shape.in_channels, shape.height, shape.width)
        taps = 9 * shape.offset_groups
        offset = 2 * torch.randn(shape.batch, 2 * taps, shape.height, shape.width)
        mask = torch.rand(shape.batch, taps, shape.height, shape.width)
        args = (x, offset, mask)
        with torch.no_grad():
            want = module(*args).numpy()
        inputs = {"input": x.numpy(), "offset": offset.numpy(), "mask": mask.numpy()}
        models = {
            "ort_custom": _export(module, args, 19, "custom"),
            "ort_standard": _export(module, args, 19, "standard"),
            "ort_decomposition": _export(module, args, 18, "standard"),
        }
        weight, bias = module.weight.detach(), module.bias.detach()

        def torch_op():
            with torch.no_grad():
                return module(*args)

        def torch_torchvision():
            return torchvision_op(x, offset, weight, bias, padding=(1, 1), mask=mask)

        record = partial(self.record, "deform_conv2d", shape.name)
        for threads in self.threads:
            torch.set_num_threads(threads)
            for path, model in models.items():
                try:
                    session = ort_session(model, threads, path == "ort_custom")
                except Exception as error:  # ORT <= 1.24 has no DeformConv kernel
                    record(threads, path, None, f"n/a: {str(error).splitlines()[0][:80]}")
                    continue
                out = np.empty(want.shape, dtype=np.float32)
                run = bound_run(session, inputs, out)
                run()
                _check(path, out, want, 1e-4, 1e-4)
                record(threads, path, run)
            if blas is not None:
                record(threads, "gemm", blas.gemm_call(shape, threads), "OpenBLAS sgemm, same sizes")
            else:
                record(threads, "gemm", None, "n/a: no scipy-openblas32")
            _check("torch_op", torch_op().numpy(), want, 1e-4, 1e-4)
            record(threads, "torch_op", torch_op)
            if torchvision_op is None:
                record(
                    threads, "torch_torchvision", None, "n/a: torchvision's compiled ops do not load with this torch"
                )
            else:
                _check("torch_torchvision", torch_torchvision().numpy(), want, 1e-4, 1e-4)
                record(threads, "torch_torchvision", torch_torchvision)


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


def _export(module: torch.nn.Module, args: tuple, opset: int, lowering: str) -> onnx.ModelProto:
    with contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        return opbridge.onnx.export(
            module, args, opset_version=opset, dynamo=False, lowering=lowering,
            input_names=["input", "offset", "mask"], output_names=["output"],
        )  # fmt: skip


def _torchvision_deform_conv2d():
    try:
        import torchvision.ops

        torch.ops.torchvision.deform_conv2d  # noqa: B018  (raises when the compiled ops do not load)
    except (ImportError, AttributeError, RuntimeError):
        return None
    return torchvision.ops.deform_conv2d


class _OpenBLAS:
    """The GEMMs of a deform conv alone, through scipy-openblas32 (the ORT library's BLAS)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library
        self.sgemm = library.scipy_cblas_sgemm
        self.sgemm.restype = None
        pointer, integer, real = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        self.sgemm.argtypes = [integer] * 6 + [real, pointer, integer, pointer, integer, real, pointer, integer]

    @classmethod
    def load(cls) -> _OpenBLAS | None:
        try:
            import scipy_openblas32
        except ImportError:
            return None
        lib_dir = Path(scipy_openblas32.get_lib_dir())
        return cls(ctypes.CDLL(str(lib_dir / scipy_openblas32.get_library(fullname=True))))

    def gemm_call(self, shape: DeformShape, threads: int) -> Callable[[], None]:
        m, k, n = shape.out_channels, shape.in_channels * 9, shape.height * shape.width
        rng = np.random.default_rng(0)
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        c = np.empty((m, n), dtype=np.float32)

        def run() -> None:
            # OpenBLAS's own threads for the baseline; back to 1 after, which is what the ORT library sets
            # (the process shares this OpenBLAS with it).
            self.library.scipy_openblas_set_num_threads(threads)
            try:
                for _ in range(shape.batch):
                    self.sgemm(101, 111, 111, m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, n, 0.0, c.ctypes.data, n)
            finally:
                self.library.scipy_openblas_set_num_threads(1)

        run()
        _check("gemm", c, a @ b, 1e-3, 1e-3)
        return run


# Report ------------------------------------------------------------------------------------------------

# The bars: (op, path, baseline path, target of baseline time / path time, cases it applies to).
# A ratio above 1 means the path is faster; against `triad` and `gemm` it is the fraction of the bound.
TARGETS = [
    ("my_add", "ort_custom", "ort_standard", 1.5, {"64 Mi"}),
    ("my_add", "ort_custom", "triad", 0.85, {"64 Mi"}),
    ("my_add", "torch_op", "torch_eager", 1.5, {"64 Mi"}),
    ("deform_conv2d", "ort_custom", "ort_standard", 1.0, None),
    ("deform_conv2d", "ort_custom", "ort_decomposition", None, None),
    ("deform_conv2d", "ort_custom", "gemm", 0.5, None),
    ("deform_conv2d", "torch_op", "torch_torchvision", 3.0, None),
]


def ratios(rows: list[Row]) -> list[dict]:
    """Every (path, baseline) pair of TARGETS measured in `rows`, with its ratio and whether it meets its bar."""
    index = {(r.op, r.case, r.threads, r.path): r for r in rows}
    out = []
    for op, path, baseline, target, cases in TARGETS:
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


def markdown(rows: list[Row], summary: list[dict], environment: dict) -> str:
    lines = [
        "# Benchmarks",
        "",
        "Generated by `nox -s bench` (`python -m opbridge bench`); do not edit by hand. Medians of "
        f"{environment['repeat']} timed runs after {environment['warmup']} warm-up runs, on "
        f"{environment['machine']}: torch {environment['torch']}, onnxruntime {environment['onnxruntime']}.",
        "A ratio is baseline time / opbridge time (above 1: opbridge is faster); for `triad` and `gemm` it is "
        "the fraction of the bound reached. Paths and method: `python/opbridge/bench.py`; how the kernels get "
        "there: [architecture.md](architecture.md#performance).",
        "",
    ]
    for op in ("my_add", "deform_conv2d"):
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
        lines += [""] + [f"- {note}" for note in notes] + ([""] if notes else [])
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opbridge bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--ops", nargs="+", choices=["my_add", "deform_conv2d"], default=["my_add", "deform_conv2d"])
    parser.add_argument("--triad-library", help="libopbridge_bench.so (the triad); built by `nox -s bench`")
    parser.add_argument("--json", type=Path, help="write rows and ratios here")
    parser.add_argument("--markdown", type=Path, help="write the Markdown report here (docs/benchmarks.md)")
    args = parser.parse_args(argv)

    bench = Bench(args.threads, args.warmup, args.repeat, args.triad_library)
    environment = {
        "torch": torch.__version__, "onnxruntime": ort.__version__, "opbridge": opbridge.__version__,
        "python": platform.python_version(), "machine": f"{_cpu_name()}, {_cpu_count()} cores",
        "warmup": args.warmup, "repeat": args.repeat,
    }  # fmt: skip
    print(f"opbridge bench: torch {environment['torch']}, onnxruntime {environment['onnxruntime']}, "
          f"threads {args.threads}, {args.warmup} warm-up + {args.repeat} timed runs each", flush=True)  # fmt: skip
    start = time.perf_counter()
    for op in args.ops:
        getattr(bench, op)()
    summary = ratios(bench.rows)
    print(f"\n{'op':14} {'case':24} thr {'path':12} {'baseline':18} ratio   target")
    for item in summary:
        ratio = f"{item['ratio']:6.2f}" if item["ratio"] is not None else "   n/a"
        target = f">= {item['target']}" if item["target"] is not None else ""
        flag = {True: "", False: "  MISSED", None: ""}[item["met"]]
        print(f"{item['op']:14} {item['case']:24} {item['threads']}t  {item['path']:12} {item['baseline']:18} "
              f"{ratio}  {target}{flag}")  # fmt: skip
    missed = [item for item in summary if item["met"] is False]
    print(f"bench: {time.perf_counter() - start:.0f} s; {len(missed)} of "
          f"{sum(item['met'] is not None for item in summary)} targets missed")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"environment": environment, "rows": [asdict(r) for r in bench.rows], "ratios": summary}
        args.json.write_text(json.dumps(payload, indent=1))
    if args.markdown:
        args.markdown.write_text(markdown(bench.rows, summary, environment))
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(main())
