"""The coverage sweep: which PyTorch ops export correctly, with which exporter, at which opset, with and
without opbridge.

Driven by PyTorch's own op database (``torch.testing._internal.common_methods_invocations.op_db``: each
OpInfo's sample inputs, written by PyTorch's developers) plus torchvision's detection ops (samples below). For
each op, dtype (float32, and int64 / bool where the op takes them) and its first samples, a one-op module is
exported with both of torch's exporters at representative opsets, run in ONNX Runtime and compared with eager.
Each case is classified:

- ``ok``: ORT's outputs match eager (same shapes and dtypes; floats to rtol 1e-3 / atol 1e-4, NaN where eager
  has NaN; integers and bools exactly);
- ``wrong result``: the model exports and runs but computes something else (the worst outcome: silent);
- ``ORT refuses``: ORT cannot load or run the exported model;
- ``export fails``: the exporter raises;
- ``not comparable``: the case cannot be judged (random output, eager itself fails on the sample, no tensor
  output, complex values), with the reason; never counted as passing;
- ``timeout`` / ``crash``: the case exceeded the per-case time limit or killed its worker process.

The sweep runs twice, in separate worker processes: ``without`` opbridge (torch as it ships) and ``with``
(after ``import opbridge``: its export rules registered, its ORT library in the session). Each case has an id,
``MODE:OP:DTYPE:SAMPLE:EXPORTEROPSET`` (e.g. ``with:scatter_reduce.mean:float32:0:dynamo18``);
``python -m opbridge coverage --case ID`` replays one in-process and prints the traceback or the differing
values.

Workers are subprocesses (``python -m opbridge coverage --worker MODE``) that take units (op, dtype) on stdin
and print one JSON line per case; the parent restarts a worker that hangs past the per-case timeout or dies,
and resumes its unit after the case that hung.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import itertools
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("without", "with")
LEGACY_OPSETS = (11, 13, 17, 20)
DYNAMO_OPSETS = (18, "newest")
DTYPES = ("float32", "int64", "bool")
#: Statuses from worst to best: the order of the gap tables.
STATUSES = ("wrong result", "crash", "ORT refuses", "export fails", "timeout", "not comparable", "ok")
FLOAT_TOLERANCE = (1e-3, 1e-4)  # (rtol, atol)

#: The op_db names of the ops opbridge's mappings cover (the CI guard runs all of their cases).
MAPPED = (
    "acosh", "asinh", "atanh", "sinh", "cosh", "bitwise_not", "nn.functional.selu", "scatter_reduce.*",
    "nn.functional.grid_sample", "floor_divide", "any",
    "nn.functional.softplus", "torchvision.*",
)  # fmt: skip

#: Wrong results the sweep finds for ops opbridge does not map, each with its cause, found by replaying the case
#: (``--case ID``). tests/test_coverage.py checks that a wrong result in the CI subset is fixed or explained here.
KNOWN_CAUSES: dict[str, str] = {
    "pow": "TorchScript exporter, opset < 12: ONNX Pow has no integer types there; it computes in float32 and "
    "returns float32 where torch returns int64",
    "__rpow__": "as pow: integer power below opset 12 returns float32",
    "addcmul": "TorchScript exporter: integer addcmul returns float32 (its value is multiplied as a float)",
    "angle": "dynamo exporter: angle of an integer tensor keeps int64 where torch returns float32",
    "diagonal": "TorchScript exporter, opset >= 13: the diagonal of an integer or bool tensor comes back float32",
    "linspace": "TorchScript exporter: integer linspace returns float32",
    "nn.functional.pairwise_distance": "TorchScript exporter: 1-D inputs give shape [1] where torch gives []",
    "cdist": "TorchScript exporter: cdist with p != 2 (the sample: p = 1.0) gives wrong distances and NaN",
    "_native_batch_norm_legit": "dynamo exporter: batch norm in training mode (batch statistics) is exported "
    "with the running statistics",
    "native_batch_norm": "dynamo exporter: batch norm in training mode is exported with the running statistics",
    "nn.functional.batch_norm": "dynamo exporter: training=True is exported with the running statistics",
    "nn.functional.avg_pool2d": "both exporters ignore divisor_override (the op_db samples set it)",
    "nn.functional.avg_pool3d": "both exporters ignore divisor_override (the op_db samples set it)",
    "nn.functional.cosine_embedding_loss": "dynamo exporter, bool inputs: a NaN where torch gives a number",
    "nonzero": "empty/0-d input: ORT returns shape [0, 1] where torch returns [0, 0]",
    "special.erfcx": "dynamo exporter: erfcx decomposed as exp(x^2) * erfc(x), which loses precision for x > ~3",
    "special.log_ndtr": "dynamo exporter: log(ndtr(x)) decomposed directly, imprecise in the lower tail",
    "topk": "ties among integers: ORT and torch return different (equally valid) indices of equal values",
    "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu": "dynamo exporter: the auxiliary logsumexp "
    "output has another layout ([N, L, H] vs [N, H, L])",
    "nn.functional.unfold": "TorchScript exporter, an empty batch (0, C, H, W): the process dies (a crash, "
    "not a Python error)",
}


# ----------------------------------------------------------------------------------------------- the ops


@dataclass(frozen=True)
class Sample:
    args: tuple
    kwargs: dict


@dataclass(frozen=True)
class SweptOp:
    """An op of the sweep: its id, the callable, the dtypes it takes, and its samples for a dtype."""

    key: str
    fn: Callable[..., Any]
    dtypes: frozenset[str]
    samples: Callable[[str], Iterator[Sample]]
    #: why its output cannot be compared whatever the sample (random numbers, uninitialized memory), or ""
    incomparable: str = ""


def _dtype(name: str):
    import torch

    return getattr(torch, name)


def _op_db_ops() -> list[SweptOp]:
    import warnings

    import torch

    with warnings.catch_warnings():  # torch's test helpers warn on import (hypothesis missing, ...)
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db

    _unseed_random_ops()
    ops = []
    seen = set()
    for info in op_db:
        key = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        if key in seen:
            continue
        seen.add(key)
        supported = info.supported_dtypes("cpu")
        dtypes = frozenset(name for name in DTYPES if getattr(torch, name) in supported)

        def samples(dtype: str, info=info) -> Iterator[Sample]:
            for sample in info.sample_inputs("cpu", _dtype(dtype), requires_grad=False):
                yield Sample((sample.input, *sample.args), dict(sample.kwargs))

        ops.append(SweptOp(key, info.op, dtypes, samples, _incomparable(info)))
    return ops


def _unseed_random_ops() -> None:
    """op_db wraps its random ops in wrapper_set_seed, which seeds every call: eager would look deterministic
    while an exported model draws other numbers. Without it, two eager calls under different seeds tell a
    random sample (dropout p > 0) from a deterministic one (p = 0) of the same op."""
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.testing._internal") and callable(getattr(module, "wrapper_set_seed", None)):
            module.wrapper_set_seed = _call


def _call(op, *args, **kwargs):
    return op(*args, **kwargs)


def _incomparable(info) -> str:
    """empty* ops return uninitialized memory, which two eager calls may happen to share."""
    if info.name.split(".")[-1].startswith(("empty", "new_empty")):
        return "uninitialized output (empty tensors hold whatever memory held)"
    return ""


def _boxes(generator, count: int, size: float, batch: int):
    import torch

    corners = torch.rand(count, 2, generator=generator) * size * 0.7
    extent = 0.5 + torch.rand(count, 2, generator=generator) * size * 0.5
    index = torch.randint(0, batch, (count, 1), generator=generator).float()
    return torch.cat([index, corners, corners + extent], dim=1)


def _torchvision_ops() -> list[SweptOp]:
    """torchvision's detection ops (not in op_db), with samples in the shapes detectors use."""
    import torch

    def make(key: str, call: Callable, variants: Sequence[dict], channels: int) -> SweptOp:
        def samples(dtype: str) -> Iterator[Sample]:
            generator = torch.Generator().manual_seed(0)
            for variant in variants:
                features = torch.randn(2, channels, 12, 16, generator=generator)
                boxes = _boxes(generator, 5, 16.0 / variant.get("spatial_scale", 1.0), 2)
                yield Sample((features, boxes), dict(variant))

        return SweptOp(f"torchvision.{key}", call, frozenset({"float32"}), samples)

    def roi_align(x, boxes, **kw):
        import torchvision

        return torchvision.ops.roi_align(x, boxes, **kw)

    def roi_pool(x, boxes, **kw):
        import torchvision

        return torchvision.ops.roi_pool(x, boxes, **kw)

    def ps_roi_align(x, boxes, **kw):
        import torchvision

        return torchvision.ops.ps_roi_align(x, boxes, **kw)

    def ps_roi_pool(x, boxes, **kw):
        import torchvision

        return torchvision.ops.ps_roi_pool(x, boxes, **kw)

    def nms(boxes, scores, iou_threshold):
        import torchvision

        return torchvision.ops.nms(boxes, scores, iou_threshold)

    def nms_samples(dtype: str) -> Iterator[Sample]:
        generator = torch.Generator().manual_seed(0)
        boxes = _boxes(generator, 20, 32.0, 1)[:, 1:]
        yield Sample((boxes, torch.rand(20, generator=generator)), {"iou_threshold": 0.3})

    align = [
        {"output_size": (3, 3), "spatial_scale": 0.5, "sampling_ratio": 2, "aligned": True},
        {"output_size": (2, 4), "spatial_scale": 1.0, "sampling_ratio": -1, "aligned": False},
        {"output_size": (3, 3), "spatial_scale": 0.25, "sampling_ratio": -1, "aligned": True},
    ]
    pool = [{"output_size": (3, 3), "spatial_scale": 0.5}, {"output_size": (2, 4), "spatial_scale": 1.0}]
    return [
        make("roi_align", roi_align, align, 3),
        make("roi_pool", roi_pool, pool, 3),
        make("ps_roi_align", ps_roi_align, [{"output_size": 3, "spatial_scale": 0.5, "sampling_ratio": 2}], 18),
        make("ps_roi_pool", ps_roi_pool, [{"output_size": (2, 2), "spatial_scale": 0.5}], 8),
        SweptOp("torchvision.nms", nms, frozenset({"float32"}), nms_samples),
    ]


def all_ops() -> list[SweptOp]:
    ops = _op_db_ops()
    try:
        from .. import specs

        if specs.torchvision_op_loads("roi_align")():
            ops += _torchvision_ops()
    except ImportError:
        pass
    return ops


def select(ops: Sequence[SweptOp], patterns: Sequence[str] | None) -> list[SweptOp]:
    if not patterns:
        return list(ops)
    return [op for op in ops if any(fnmatch.fnmatchcase(op.key, p) for p in patterns)]


def ci_subset(ops: Sequence[SweptOp], every: int = 40) -> list[SweptOp]:
    """The CI guard's ops: every op opbridge maps, plus every ``every``-th of the rest (by name)."""
    mapped = select(ops, MAPPED)
    rest = sorted((op for op in ops if op not in mapped), key=lambda op: op.key)
    return mapped + rest[::every]


# ------------------------------------------------------------------------------------------------ cases


@dataclass(frozen=True)
class Config:
    exporter: str
    opset: int

    @property
    def label(self) -> str:
        return f"{self.exporter}{self.opset}"


def configs() -> list[Config]:
    import torch.onnx._constants as constants

    newest = constants.ONNX_MAX_OPSET
    legacy_max = getattr(constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", 20)
    result = [Config("legacy", o) for o in LEGACY_OPSETS if o <= legacy_max]
    result += [Config("dynamo", newest if o == "newest" else o) for o in DYNAMO_OPSETS]
    return list(dict.fromkeys(result))


@dataclass
class CaseResult:
    id: str
    mode: str
    op: str
    dtype: str
    sample: int
    exporter: str
    opset: int
    status: str
    detail: str = ""
    max_error: float | None = None
    seconds: float = 0.0


def case_id(mode: str, op: str, dtype: str, sample: int, config: Config) -> str:
    return f"{mode}:{op}:{dtype}:{sample}:{config.label}"


def parse_case_id(text: str) -> tuple[str, str, str, int, Config]:
    match = re.fullmatch(r"(with|without):(.+):(\w+):(\d+):(legacy|dynamo)(\d+)", text)
    if not match:
        raise ValueError(f"not a case id: {text!r} (expected MODE:OP:DTYPE:SAMPLE:EXPORTEROPSET, "
                         "e.g. with:scatter_reduce.mean:float32:0:dynamo18)")  # fmt: skip
    mode, op, dtype, sample, exporter, opset = match.groups()
    return mode, op, dtype, int(sample), Config(exporter, int(opset))


def _one_line(error: BaseException) -> str:
    text = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    text = re.sub(r"0x[0-9a-f]+", "0x…", text)
    text = re.sub(r"/[\w./+-]+/(site-packages|lib)/", "…/", text)
    return f"{type(error).__name__}: {text}"[:300]


class _NotComparable(Exception):
    pass


def _tensor_leaves(value) -> tuple[list, Any]:
    from torch.utils import _pytree

    return _pytree.tree_flatten(value)


def _build_module(op: SweptOp, sample: Sample):
    """A module whose forward takes the sample's tensors (named i0, i1, ...) and calls the op."""
    import torch
    from torch.utils import _pytree

    leaves, spec = _pytree.tree_flatten((sample.args, sample.kwargs))
    positions = [k for k, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[k] for k in positions]
    if any(t.is_complex() for t in tensors):
        raise _NotComparable("complex input (ONNX has no complex type)")
    if any(t.layout != torch.strided for t in tensors):
        raise _NotComparable("sparse input")

    class OneOp(torch.nn.Module):
        def call(self, *inputs):
            filled = list(leaves)
            for k, tensor in zip(positions, inputs, strict=True):
                filled[k] = tensor
            args, kwargs = _pytree.tree_unflatten(filled, spec)
            return op.fn(*args, **kwargs)

    names = [f"i{k}" for k in range(len(tensors))]
    namespace: dict[str, Any] = {}
    exec(f"def forward(self, {', '.join(names)}):\n    return self.call({', '.join(names)})\n", namespace)
    OneOp.forward = namespace["forward"]
    return OneOp().eval(), tuple(t.clone() for t in tensors), names


def _eager(module, inputs) -> list:
    import torch

    output = module(*[t.clone() for t in inputs])
    leaves, _ = _tensor_leaves(output)
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    if not tensors:
        raise _NotComparable(f"no tensor output ({type(output).__name__})")
    if any(t.is_complex() for t in tensors):
        raise _NotComparable("complex output (ONNX has no complex type)")
    return [t.detach().contiguous() for t in tensors]


def _same(a, b) -> bool:
    import torch

    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(torch.nan_to_num(x), torch.nan_to_num(y))
        for x, y in zip(a, b, strict=True)
    )


def _export(module, inputs, names: list[str], config: Config) -> bytes:
    import io

    import torch

    if config.exporter == "dynamo":
        program = torch.onnx.export(module, inputs, dynamo=True, opset_version=config.opset, verbose=False)
        return program.model_proto.SerializeToString()
    buffer = io.BytesIO()
    torch.onnx.export(module, inputs, buffer, dynamo=False, opset_version=config.opset, input_names=names)
    return buffer.getvalue()


def _session(model: bytes, mode: str):
    import onnxruntime

    if mode == "with":
        import opbridge_ort

        options = opbridge_ort.session_options()
    else:
        options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _feeds(session, inputs, names: list[str]) -> dict:
    """The model's inputs by name (i0, i1, ...), or by position where the exporter renamed them (the dynamo
    exporter calls a mutated input ``i0_orig``)."""
    declared = [i.name for i in session.get_inputs()]
    if all(name in names for name in declared):
        return {name: inputs[names.index(name)].numpy() for name in declared}
    return {name: tensor.numpy() for name, tensor in zip(declared, inputs, strict=False)}


def _compare(got: list, want: list) -> tuple[bool, str, float | None]:
    import numpy as np

    if len(got) != len(want):
        return False, f"ORT gave {len(got)} outputs, eager {len(want)}", None
    worst = 0.0
    for k, (ort_value, tensor) in enumerate(zip(got, want, strict=True)):
        expected = tensor.numpy()
        ort_value = np.asarray(ort_value)
        if ort_value.shape != expected.shape:
            return False, f"output {k}: ORT shape {list(ort_value.shape)}, eager {list(expected.shape)}", None
        if ort_value.dtype != expected.dtype:
            return False, f"output {k}: ORT dtype {ort_value.dtype}, eager {expected.dtype}", None
        if expected.dtype.kind in "fc":
            rtol, atol = FLOAT_TOLERANCE
            both = np.isfinite(expected) & np.isfinite(ort_value)
            if expected.size and both.any():
                worst = max(worst, float(np.max(np.abs(ort_value[both].astype(np.float64) - expected[both]))))
            if not np.allclose(ort_value, expected, rtol=rtol, atol=atol, equal_nan=True):
                nan_mismatch = int(np.sum(np.isnan(ort_value) != np.isnan(expected)))
                extra = f", {nan_mismatch} NaN mismatches" if nan_mismatch else ""
                return False, f"output {k}: max abs error {worst:.3g}{extra}", worst
        elif not np.array_equal(ort_value, expected):
            wrong = int(np.sum(ort_value != expected))
            return False, f"output {k}: {wrong} of {expected.size} values differ", None
    return True, "", worst


def run_case(mode: str, op: SweptOp, dtype: str, index: int, sample: Sample, config: Config,
             want: list | Exception) -> CaseResult:  # fmt: skip
    """One case; ``want`` is the eager output (or why the sample cannot be compared)."""
    start = time.perf_counter()
    result = CaseResult(case_id(mode, op.key, dtype, index, config), mode, op.key, dtype, index,
                        config.exporter, config.opset, "ok")  # fmt: skip
    if isinstance(want, Exception):
        result.status, result.detail = "not comparable", str(want)
        return result
    try:
        module, inputs, names = _build_module(op, sample)
        model = _export(module, inputs, names, config)
    except Exception as error:
        result.status, result.detail = "export fails", _one_line(error)
    else:
        try:
            session = _session(model, mode)
            got = session.run(None, _feeds(session, inputs, names))
        except Exception as error:
            result.status, result.detail = "ORT refuses", _one_line(error)
        else:
            good, detail, result.max_error = _compare(got, want)
            if not good:
                result.status, result.detail = "wrong result", detail
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def eager_reference(op: SweptOp, sample: Sample) -> list | Exception:
    """The eager outputs, or why the sample cannot be compared (random output, eager fails, ...)."""
    import torch

    if op.incomparable:
        return _NotComparable(op.incomparable)
    try:
        module, inputs, _ = _build_module(op, sample)
        torch.manual_seed(0)
        first = _eager(module, inputs)
        for seed in range(1, 6):  # a random op can repeat itself on a tiny output; not five times in a row
            torch.manual_seed(seed)
            if not _same(first, _eager(module, inputs)):
                return _NotComparable("random output (eager calls under different seeds differ)")
    except _NotComparable as reason:
        return reason
    except Exception as error:
        return _NotComparable(f"eager fails on the sample: {_one_line(error)}")
    return first


def run_unit(mode: str, op: SweptOp, dtype: str, samples: int, skip: set[str]) -> Iterator[tuple[str, Any]]:
    """("start", id) before each case and ("result", CaseResult) after it."""
    import torch

    torch.manual_seed(0)
    try:
        chosen = list(itertools.islice(op.samples(dtype), samples))
    except Exception as error:
        chosen = []
        for config in configs():
            yield "result", CaseResult(case_id(mode, op.key, dtype, 0, config), mode, op.key, dtype, 0,
                                       config.exporter, config.opset, "not comparable",
                                       f"its sample inputs fail: {_one_line(error)}")  # fmt: skip
    for index, sample in enumerate(chosen):
        want = None
        for config in configs():
            identifier = case_id(mode, op.key, dtype, index, config)
            if identifier in skip:
                continue
            if want is None:
                want = eager_reference(op, sample)
            yield "start", identifier
            yield "result", run_case(mode, op, dtype, index, sample, config, want)


# ------------------------------------------------------------------------------------------- the workers


def _prepare_process(mode: str) -> None:
    import warnings

    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)
    if mode == "with":
        import opbridge

        opbridge._load()
    _share_torchlib_registry()


def _share_torchlib_registry() -> None:
    """torch's dynamo exporter rebuilds its registry of torchlib functions on every export (~0.4 s of a
    0.6 s one-op export, measured with cProfile on torch 2.14); the sweep builds it once per opset and gives
    each export a copy. A registry is only mutated by registering into it (custom translation tables, which
    go into the copy), so the copy behaves as a fresh one. Skipped where torch's internals differ."""
    try:
        from torch.onnx._internal.exporter import _registration
    except ImportError:
        return
    registry_class = getattr(_registration, "ONNXRegistry", None)
    original = getattr(registry_class, "from_torchlib", None)
    if original is None or getattr(original, "_opbridge_cached", False):
        return
    cache: dict = {}

    def from_torchlib(*args, **kwargs):
        key = (args, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = original(*args, **kwargs)
        template = cache[key]
        fresh = object.__new__(type(template))
        fresh.__dict__.update(template.__dict__)
        fresh.functions = {k: list(v) for k, v in template.functions.items()}
        return fresh

    try:
        probe = original()
        if not isinstance(getattr(probe, "functions", None), dict):
            return
    except Exception:
        return
    from_torchlib._opbridge_cached = True
    registry_class.from_torchlib = staticmethod(from_torchlib)


def _ops_by_key() -> dict[str, SweptOp]:
    return {op.key: op for op in all_ops()}


def worker(mode: str) -> int:
    """Reads units (JSON lines) on stdin, writes events (JSON lines) on stdout."""
    # The protocol gets a private copy of stdout; file descriptor 1 (print, C++ code, ORT's logger) goes to
    # stderr, so nothing an op, an exporter or a library prints can corrupt it.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _prepare_process(mode)
    ops = _ops_by_key()
    for line in sys.stdin:
        unit = json.loads(line)
        op = ops[unit["op"]]
        for kind, value in run_unit(mode, op, unit["dtype"], unit["samples"], set(unit.get("skip", ()))):
            payload = dataclasses.asdict(value) if kind == "result" else value
            out.write(json.dumps({kind: payload}) + "\n")
            out.flush()
        out.write(json.dumps({"done": unit["op"]}) + "\n")
        out.flush()
    return 0


@dataclass
class Unit:
    mode: str
    op: str
    dtype: str
    samples: int
    skip: list[str] = dataclasses.field(default_factory=list)


class _Worker:
    def __init__(self, mode: str, log):
        command = [sys.executable, "-m", "opbridge", "coverage", "--worker", mode]
        environment = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                        text=True, bufsize=1, env=environment)  # fmt: skip
        # A thread moves the worker's lines into a queue: waiting on the pipe itself (select) would miss lines
        # already read into the file object's buffer.
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        with self.process.stdout:  # closed here, at the worker's end (EOF)
            for line in self.process.stdout:
                self.lines.put(line)
        self.lines.put("")

    def send(self, unit: Unit) -> None:
        self.process.stdin.write(json.dumps(dataclasses.asdict(unit)) + "\n")
        self.process.stdin.flush()

    def read(self, timeout: float) -> dict | None:
        """The next event, None on timeout; raises EOFError if the worker died."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if not line:
            raise EOFError
        return json.loads(line) if line.startswith("{") else {}

    def kill(self) -> None:
        self.process.kill()
        self.close()

    def close(self) -> None:
        if not self.process.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
        self.process.wait()


def run_units(units: Sequence[Unit], jobs: int, timeout: float, budget: float | None, progress=sys.stderr,
              log_path: Path | None = None) -> list[CaseResult]:  # fmt: skip
    """Runs the units on ``jobs`` worker processes per mode; returns every case's result. Units not started
    within ``budget`` seconds are reported as not run."""
    pending = list(units)
    lock = threading.Lock()
    results: list[CaseResult] = []
    start = time.perf_counter()
    done_units = 0
    log = open(log_path, "a") if log_path else subprocess.DEVNULL  # noqa: SIM115

    def take(mode: str) -> Unit | None:
        with lock:
            for k, unit in enumerate(pending):
                if unit.mode == mode:
                    return pending.pop(k)
        return None

    def slot(mode: str) -> None:
        nonlocal done_units
        current: _Worker | None = None
        while True:
            if budget is not None and time.perf_counter() - start > budget:
                return
            unit = take(mode)
            if unit is None:
                break
            while unit is not None:
                if current is None:
                    current = _Worker(mode, log)
                current.send(unit)
                running, started = None, time.perf_counter()
                try:
                    while True:
                        event = current.read(max(1.0, timeout - (time.perf_counter() - started)))
                        if event is None:
                            if time.perf_counter() - started < timeout:
                                continue
                            raise TimeoutError
                        if "start" in event:
                            running, started = event["start"], time.perf_counter()
                        elif "result" in event:
                            with lock:
                                results.append(CaseResult(**event["result"]))
                            running = None
                            unit.skip.append(event["result"]["id"])
                        elif "done" in event:
                            unit = None
                            break
                except (TimeoutError, EOFError) as stop:
                    current.kill()
                    current = None
                    if running is None:  # died or hung outside a case (loading): give the unit up
                        running = case_id(mode, unit.op, unit.dtype, 0, configs()[0])
                    _, op, dtype, sample, config = parse_case_id(running)
                    status = "timeout" if isinstance(stop, TimeoutError) else "crash"
                    detail = f"no answer in {timeout:.0f} s" if status == "timeout" else "the worker process died"
                    with lock:
                        results.append(CaseResult(running, mode, op, dtype, sample, config.exporter, config.opset,
                                                  status, detail))  # fmt: skip
                    unit.skip.append(running)
            with lock:
                done_units += 1
                if progress is not None:
                    elapsed = time.perf_counter() - start
                    print(f"coverage: {done_units}/{len(units)} units, {len(results)} cases, {elapsed:.0f} s",
                          file=progress, flush=True)  # fmt: skip
        if current is not None:
            current.close()

    modes = sorted({u.mode for u in units}, key=MODES.index)
    threads = [threading.Thread(target=slot, args=(mode,)) for mode in modes for _ in range(max(1, jobs // len(modes)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for unit in pending:
        for config in configs():
            identifier = case_id(unit.mode, unit.op, unit.dtype, 0, config)
            results.append(CaseResult(identifier, unit.mode, unit.op, unit.dtype, 0, config.exporter, config.opset,
                                      "not run", "the sweep's time budget ran out"))  # fmt: skip
    if log_path:
        log.close()
    return results


def replay(identifier: str) -> int:
    """Runs one case in this process, printing what happened in full."""
    mode, key, dtype, index, config = parse_case_id(identifier)
    _prepare_process(mode)
    ops = _ops_by_key()
    if key not in ops:
        print(f"coverage: no op {key!r} in this torch's op database", file=sys.stderr)
        return 2
    op = ops[key]
    import torch

    torch.manual_seed(0)
    sample = next(itertools.islice(op.samples(dtype), index, None))
    print(f"case {identifier}\nsample: {sample}")
    want = eager_reference(op, sample)
    result = run_case(mode, op, dtype, index, sample, config, want)
    print(json.dumps(dataclasses.asdict(result), indent=1))
    if result.status in ("export fails", "ORT refuses"):
        module, inputs, names = _build_module(op, sample)
        try:
            model = _export(module, inputs, names, config)
            session = _session(model, mode)
            session.run(None, _feeds(session, inputs, names))
        except Exception:
            traceback.print_exc()
    if result.status == "wrong result":
        module, inputs, names = _build_module(op, sample)
        session = _session(_export(module, inputs, names, config), mode)
        got = session.run(None, _feeds(session, inputs, names))
        for k, (ort_value, tensor) in enumerate(zip(got, want, strict=False)):
            print(f"output {k}\n  eager: {tensor}\n  ORT:   {ort_value}")
    return 0 if result.status in ("ok", "not comparable") else 1


# ------------------------------------------------------------------------------------------------ report


def _key(result: CaseResult) -> tuple:
    return (result.op, result.dtype, result.sample, result.exporter, result.opset)


def pairs(results: Sequence[CaseResult]) -> dict[tuple, dict[str, CaseResult]]:
    """Case (op, dtype, sample, exporter, opset) -> {mode: result}."""
    paired: dict[tuple, dict[str, CaseResult]] = defaultdict(dict)
    for result in results:
        paired[_key(result)][result.mode] = result
    return paired


def totals(results: Sequence[CaseResult]) -> dict[str, dict[str, dict[str, int]]]:
    """ "exporter opset" -> mode -> status -> count."""
    table: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
    for result in results:
        table[f"{result.exporter} {result.opset}"][result.mode][result.status] += 1
    return table


def _cause(result: CaseResult) -> str:
    base = result.op.split(".")[0]
    known = KNOWN_CAUSES.get(result.op) or KNOWN_CAUSES.get(base)
    return f"{known} ({result.detail})" if known and result.status in ("wrong result", "crash") else result.detail


def gaps(results: Sequence[CaseResult]) -> list[dict]:
    """What still fails after opbridge, grouped by (op, dtype, status, cause), worst first."""
    groups: dict[tuple, list[CaseResult]] = defaultdict(list)
    for result in results:
        if result.mode == "with" and result.status != "ok":
            groups[(result.op, result.dtype, result.status, _cause(result)[:160])].append(result)
    rows = []
    for (op, dtype, status, cause), members in groups.items():
        labels = sorted({f"{m.exporter} {m.opset}" for m in members}, key=_config_order)
        rows.append({"op": op, "dtype": dtype, "status": status, "cause": cause, "where": labels,
                     "cases": len(members), "example": members[0].id})  # fmt: skip
    order = {status: k for k, status in enumerate((*STATUSES, "not run"))}
    return sorted(rows, key=lambda r: (order[r["status"]], r["op"], r["dtype"]))


def fixed(results: Sequence[CaseResult]) -> list[dict]:
    """Cases that fail without opbridge and pass with it."""
    rows: dict[tuple, list] = defaultdict(list)
    for pair in pairs(results).values():
        before, after = pair.get("without"), pair.get("with")
        if before and after and after.status == "ok" and before.status != "ok":
            rows[(after.op, after.dtype, before.status)].append(after)
    return [
        {"op": op, "dtype": dtype, "before": status, "cases": len(members),
         "where": sorted({f"{m.exporter} {m.opset}" for m in members}, key=_config_order)}
        for (op, dtype, status), members in sorted(rows.items())
    ]  # fmt: skip


def _config_order(label: str) -> tuple:
    exporter, opset = label.split()
    return (exporter != "legacy", int(opset))


def markdown(results: Sequence[CaseResult], meta: dict) -> str:
    shown = [s for s in STATUSES if s != "ok"]
    lines = [
        "# Export coverage: PyTorch ops through torch's two ONNX exporters into ONNX Runtime",
        "",
        "Generated by `nox -s coverage` (`python -m opbridge coverage --markdown docs/coverage.md --json "
        "reports/coverage.json`); do not edit by hand. What is swept and how each case is judged: the docstring of "
        "python/opbridge/tools/coverage.py and docs/architecture.md.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["environment"].items()) + ".",
        f"Sweep: {meta['ops']} ops ({meta['units']} op x dtype units), up to {meta['samples']} samples each, "
        f"{len(results)} cases in {meta['seconds'] / 60:.1f} min on {meta['jobs']} worker(s); "
        f"per-case timeout {meta['timeout']:.0f} s."
        + (
            f" Re-swept since with the current rules (`--update`): {', '.join(meta['updated'])}."
            if meta.get("updated")
            else ""
        ),
        "",
        "Replay any case: `python -m opbridge coverage --case ID` (ids in reports/coverage.json and below).",
        "",
        "## Totals per exporter and opset (cases; without opbridge → with opbridge)",
        "",
        "| exporter | opset | ok | " + " | ".join(shown) + " |",
        "|---|---:|---:|" + "---:|" * len(shown),
    ]
    table = totals(results)
    for label in sorted(table, key=_config_order):
        exporter, opset = label.split()
        counts = table[label]

        def cell(status: str, counts=counts) -> str:
            before, after = counts["without"].get(status, 0), counts["with"].get(status, 0)
            return str(before) if before == after else f"{before} → {after}"

        lines.append(f"| {exporter} | {opset} | " + " | ".join(cell(s) for s in ("ok", *shown)) + " |")
    fixed_rows = fixed(results)
    lines += ["", f"## Fixed by opbridge ({sum(r['cases'] for r in fixed_rows)} cases)", "",
              "| op | dtype | without opbridge | cases | exporter/opset |", "|---|---|---|---:|---|"]  # fmt: skip
    for row in fixed_rows:
        lines.append(f"| {row['op']} | {row['dtype']} | {row['before']} | {row['cases']} | {', '.join(row['where'])} |")
    gap_rows = gaps(results)
    lines += ["", "## Remaining gaps with opbridge, worst first", "",
              "Wrong results first (silent), then ORT refusals, export failures, timeouts, and the cases that "
              "cannot be compared (with why). One row per op, dtype, outcome and cause.",
              "", "| outcome | op | dtype | cause | exporter/opset | cases | example id |",
              "|---|---|---|---|---|---:|---|"]  # fmt: skip
    for row in gap_rows:
        cause = row["cause"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {row['status']} | {row['op']} | {row['dtype']} | {cause} | {', '.join(row['where'])} | "
                     f"{row['cases']} | `{row['example']}` |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _write_reports(results: Sequence[CaseResult], meta: dict, json_path: Path | None, markdown_path: Path | None):
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        document = {**meta, "totals": totals(results), "gaps": gaps(results), "fixed": fixed(results),
                    "cases": [dataclasses.asdict(r) for r in results]}  # fmt: skip
        json_path.write_text(json.dumps(document, indent=1) + "\n")
    if markdown_path:
        markdown_path.write_text(markdown(results, meta))


def units_for(ops: Sequence[SweptOp], modes: Sequence[str], dtypes: Sequence[str], samples: int) -> list[Unit]:
    units = []
    for op in ops:
        for dtype in dtypes:
            if dtype in op.dtypes:
                per_dtype = samples if dtype == "float32" else max(1, samples // 2)
                units += [Unit(mode, op.key, dtype, per_dtype) for mode in modes]
    return units


def main(argv: Sequence[str] | None = None) -> int:
    from .._cli import coverage_parser

    args = coverage_parser().parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if args.case:
        return replay(args.case)
    if args.report_from:
        document = json.loads(args.report_from.read_text())
        results = [CaseResult(**case) for case in document["cases"]]
        meta = {key: document[key] for key in ("environment", "ops", "units", "samples", "seconds", "jobs", "timeout")}
        meta["updated"] = document.get("updated", [])
        _write_reports(results, meta, args.json, args.markdown)
        return 0
    import warnings

    from . import parity

    warnings.simplefilter("ignore")
    ops = all_ops()
    chosen = ci_subset(ops) if args.subset == "ci" else select(ops, args.ops)
    if not chosen:
        print(f"coverage: no op matches {args.ops}", file=sys.stderr)
        return 2
    units = units_for(chosen, args.modes, args.dtypes, args.samples)
    print(f"coverage: {len(chosen)} ops, {len(units)} units on {args.jobs} worker(s)", file=sys.stderr, flush=True)
    start = time.perf_counter()
    budget = args.budget_minutes * 60 if args.budget_minutes else None
    results = run_units(units, args.jobs, args.timeout, budget, log_path=args.log)
    seconds = time.perf_counter() - start
    meta = {"environment": parity.environment(), "ops": len(chosen), "units": len(units), "samples": args.samples,
            "seconds": seconds, "jobs": args.jobs, "timeout": args.timeout}  # fmt: skip
    if args.update:  # the selected ops' cases replace theirs in an earlier full report; the rest is kept
        document = json.loads(args.update.read_text())
        swept = {op.key for op in chosen}
        kept = [CaseResult(**case) for case in document["cases"] if case["op"] not in swept]
        meta = {key: document[key] for key in ("environment", "ops", "units", "samples", "seconds", "jobs", "timeout")}
        meta["updated"] = sorted(set(document.get("updated", [])) | swept)
        results = kept + results
    order = {mode: k for k, mode in enumerate(MODES)}
    results.sort(key=lambda r: (order[r.mode], r.op, r.dtype, r.sample, _config_order(f"{r.exporter} {r.opset}")))
    _write_reports(results, meta, args.json, args.markdown)
    counts = defaultdict(int)
    for result in results:
        counts[(result.mode, result.status)] += 1
    for mode in args.modes:
        summary = ", ".join(f"{counts[(mode, s)]} {s}" for s in (*STATUSES[::-1], "not run") if counts[(mode, s)])
        print(f"coverage {mode} opbridge: {summary}")
    print(f"coverage: {len(results)} cases in {seconds / 60:.1f} min")
    return 0


__all__ = ["all_ops", "ci_subset", "configs", "fixed", "gaps", "main", "run_unit", "totals"]
