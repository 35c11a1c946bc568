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
tables) is shared by many cells; the largest groups start first. Within a group
the cells share what is the same for all of them (:class:`Shared`): the inputs,
PyTorch's outputs and, for the dynamo exporter, the captured and decomposed
program; each cell still translates at its opset under its lowering, optimizes,
and runs in ONNX Runtime, and fails on its own. ``--no-share`` runs every cell
on its own; the JSON report's ``seconds`` of each case say where the time went
(see PHASES).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import ctypes
import dataclasses
import functools
import io
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
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
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bool: "bool",
}
#: The half-precision dtypes. Their cells compare ONNX Runtime's output with the float64 value of the same inputs
#: (the half inputs and the module's half parameters, widened exactly), not with PyTorch's half output: opbridge's
#: ops and lowerings compute half storage in float32 and round once (docs/api.md, "Precision and autocast"), which
#: is that value within one rounding; torch's own half kernels (e.g. torchvision's CPU deform_conv2d, grid_sample)
#: may round at every step, and no tolerance would tell those apart from a wrong lowering.
HALF = ("float16", "bfloat16")
#: The unit roundoff of each half dtype: a rounding to nearest is off by at most this much of the value.
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
#: Half of float16's smallest subnormal step: a rounding's error where relative bounds no longer hold.
_SUBNORMAL_ROUNDING = {"float16": 2.0**-25, "bfloat16": 0.0}

# (rtol, atol) for ORT vs PyTorch. Half dtypes (HALF): ORT vs the float64 value, |got - want| <= rtol * |want| +
# atol * max|want| (the output's largest magnitude: a scale-free allowance for the float32 arithmetic inside, which
# is off by a fraction of the largest terms) + a subnormal's rounding; by default rtol is one rounding.
_TOLERANCES = {
    "float32": (1e-5, 1e-6),
    "float64": (1e-12, 1e-12),
    "float16": (UNIT_ROUNDOFF["float16"], UNIT_ROUNDOFF["float16"] / 256),
    "bfloat16": (UNIT_ROUNDOFF["bfloat16"], UNIT_ROUNDOFF["bfloat16"] / 256),
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
    #: phase (see PHASES) -> seconds
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)


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


def representative_opsets() -> set[int]:
    """The TorchScript-based exporter's 9, 13, 17 and newest, the dynamo exporter's 18 and newest: every opset range
    of the ops' lowerings has one (``--quick``; the half-precision cells' opsets)."""
    return {9, 13, 17, 18, matrix_opsets("legacy")[-1], matrix_opsets("dynamo")[-1]} - {
        o for o in (13, 17) if o not in matrix_opsets("legacy")
    }


#: dtypes whose cells run at the representative opsets only, unless opsets are chosen: half storage casts to
#: float32 around the same lowerings (specs.half_storage), so each lowering's opset range needs one opset, and the
#: main job stays inside its time (docs/architecture.md).
REPRESENTATIVE_ONLY = set(HALF)
#: ONNX has bfloat16 from opset 13 (Cast-13 and the ops of that release): a bfloat16 cell below it is n/a.
BFLOAT16_MIN_OPSET = 13


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
    representative = representative_opsets()
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
                            if name in REPRESENTATIVE_ONLY and chosen_opsets is None and opset not in representative:
                                continue
                            if dtypes is None or name in set(dtypes):
                                result.append(Cell(spec.name, path, exporter, lowering, opset, name))
    return result


def _batch_kinds(exporter: str) -> tuple[str, ...]:
    """The batch kinds a cell of ``exporter`` runs: the dynamo exporter keeps symbolic sizes, so its dynamic batch
    is the same test as ``unknown``."""
    return tuple(batch for batch in BATCH_KINDS if batch != "unknown" or exporter == "legacy")


def _batch_dims(small: Sequence[torch.Tensor], large: Sequence[torch.Tensor]) -> list[list[int]]:
    """Per tensor, the dims whose size follows the batch (found by comparing two batch sizes)."""
    return [[d for d in range(t.dim()) if t.shape[d] != u.shape[d]] for t, u in zip(small, large, strict=True)]


def _widened(tensors: Sequence[torch.Tensor], cell: Cell) -> tuple[torch.Tensor, ...]:
    """A half cell's inputs in float64 (exactly their values); other cells' inputs as they are."""
    if cell.dtype not in HALF:
        return tuple(tensors)
    return tuple(t.double() if t.dtype.is_floating_point else t for t in tensors)


def _as_tuple(output) -> tuple[torch.Tensor, ...]:
    return tuple(output) if isinstance(output, (tuple, list)) else (output,)


@dataclass
class _Case:
    """What every cell of a group exports and checks for one operand kind and batch kind."""

    module: torch.nn.Module
    export_inputs: tuple[torch.Tensor, ...]
    run_inputs: tuple[torch.Tensor, ...]
    expected: tuple[torch.Tensor, ...]
    input_names: list[str]
    #: torch.onnx.export's keyword arguments: input and output names, the batch kind's dynamic axes or shapes
    kwargs: dict


def _case(spec: specs.OpSpec, cell: Cell, operands: str, batch: str) -> _Case:
    dtype = next(d for d in spec.dtypes if _DTYPE_NAMES[d] == cell.dtype)
    module = spec.module(cell.path, operands)
    if dtype.is_floating_point:
        module = module.to(dtype)  # parameters follow the cell's dtype
    export_inputs = spec.sample_inputs(dtype, operands, EXPORT_BATCH)
    run_batch = EXPORT_BATCH if batch == "static" else DYNAMIC_RUN_BATCH
    run_inputs = spec.sample_inputs(dtype, operands, run_batch)
    # Half cells: the float64 value of the same half inputs and parameters (see HALF).
    reference = copy.deepcopy(module).to(torch.float64) if cell.dtype in HALF else module
    with torch.no_grad():
        expected = _as_tuple(reference(*_widened(run_inputs, cell)))
        export_outputs = _as_tuple(reference(*_widened(export_inputs, cell)))
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
    return _Case(module, export_inputs, run_inputs, expected, input_names, kwargs)


class Shared:
    """What the cells of a group (op, call path, exporter, dtype) have in common, computed by the first cell that
    needs it and reused by the others; :func:`run_group` keeps one per group.

    * Per operand kind and batch kind: the module, its inputs and PyTorch's outputs.
    * For the dynamo exporter, per operand kind and batch kind: the program that ``torch.export`` captured from the
      module (the exporter's first step, which does not consult the lowering) and its decompositions, one per set
      of ops that the exporter's registry has ONNX rules for (see :func:`_sharing_decompositions`).

    Only what succeeded is kept, so a subcase that fails there fails again, with its own error, in every cell.
    """

    def __init__(self) -> None:
        self.cases: dict[tuple, _Case] = {}
        #: subcase key -> a program captured from its module, decomposed once (in its own export) and never again
        self.programs: dict[tuple, torch.export.ExportedProgram] = {}
        #: (subcase key, torch's state) -> [(ops with rules, the decomposition of the subcase's program, its ops)]
        self.decomposed: dict[tuple, list[tuple[frozenset, torch.export.ExportedProgram, frozenset]]] = {}

    def case(self, spec: specs.OpSpec, cell: Cell, operands: str, batch: str) -> _Case:
        key = _subcase_key(cell, operands, batch)
        if key not in self.cases:
            self.cases[key] = _case(spec, cell, operands, batch)
        return self.cases[key]

    def decomposition(self, key: tuple, ops: frozenset) -> torch.export.ExportedProgram | None:
        """The subcase's program decomposed for a registry with rules for ``ops``, if made already: for exactly
        those ops, or for more ops none of which occurs in it. (Decomposing keeps whole the ops that have a rule
        and breaks the others down: a rule for an op that never occurs changes nothing.)"""
        for other_ops, decomposed, contained in self.decomposed.get((key, _torch_state()), ()):
            if other_ops == ops or (ops < other_ops and not (other_ops - ops) & contained):
                return decomposed
        return None


def _torch_state() -> tuple[int, int]:
    """New decompositions, or op libraries loaded since, change what a decomposition gives (as in _torch_hooks)."""
    return len(torch._decomp.decomposition_table), len(torch.ops.loaded_libraries)


def _subcase_key(cell: Cell, operands: str, batch: str) -> tuple:
    return cell.op, cell.path, cell.exporter, cell.dtype, operands, batch


#: What the time of a subcase is spent on, in the JSON report's ``seconds`` of each case. ``decompose``: the dynamo
#: exporter's decomposition of the captured program, where this subcase computed it (see _sharing_decompositions);
#: ``export``: the rest of the export (capture, translation, opset conversion, optimization, serialization).
PHASES = ("inputs", "export", "decompose", "session", "run", "compare")


class _Clock:
    """Adds the seconds spent in each ``with clock(phase):`` block to ``seconds``; a block inside another counts for
    itself only (the export's decomposition is not export time too)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._open: list[str] = []

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        self._open.append(phase)
        try:
            yield
        finally:
            self._open.pop()
            elapsed = time.perf_counter() - start
            self.seconds[phase] = self.seconds.get(phase, 0.0) + elapsed
            if self._open:
                self.seconds[self._open[-1]] = self.seconds.get(self._open[-1], 0.0) - elapsed


def run_subcase(
    spec: specs.OpSpec, cell: Cell, operands: str, batch: str, shared: Shared | None = None, clock: _Clock | None = None
) -> SubResult:
    import onnxruntime

    import opbridge_ort

    shared = shared if shared is not None else Shared()
    clock = clock if clock is not None else _Clock()
    with clock("inputs"):
        case = shared.case(spec, cell, operands, batch)
        # Copies: whatever an exporter does to the tensors it is given stays in this cell.
        export_inputs = tuple(t.clone() for t in case.export_inputs)
        run_inputs = tuple(t.clone() for t in case.run_inputs)
    with warnings.catch_warnings(), clock("export"):
        # The exporters' advice (deprecations, axis naming) is not a parity failure.
        warnings.simplefilter("ignore")
        if cell.exporter == "dynamo":
            model = _export_dynamo(shared, _subcase_key(cell, operands, batch), case, export_inputs, cell, clock)
        else:
            model = _export(case.module, export_inputs, cell, dict(case.kwargs))
    custom_nodes = [n.op_type for n in model.graph.node if n.domain == specs.CUSTOM_DOMAIN]
    function_nodes = [n.op_type for n in model.graph.node if n.domain == specs.FUNCTION_DOMAIN]
    if cell.lowering != "custom" and custom_nodes:
        return SubResult(operands, batch, False, None, f"{cell.lowering} lowering emitted custom nodes {custom_nodes}")
    if cell.lowering == "custom" and not custom_nodes:
        return SubResult(operands, batch, False, None, "custom lowering emitted no opbridge node")
    if cell.lowering == "function" and not (function_nodes and model.functions):
        return SubResult(operands, batch, False, None, "function lowering emitted no function call")
    with clock("session"):
        options = onnxruntime.SessionOptions()  # ORT's defaults, graph optimizations included, as users get them
        options.intra_op_num_threads = 1
        if cell.lowering != "custom":
            # Standard and function lowerings must run without opbridge's library: prove it.
            session = onnxruntime.InferenceSession(
                model.SerializeToString(), options, providers=["CPUExecutionProvider"]
            )
        else:
            session = opbridge_ort.InferenceSession(model, options)
    with clock("run"):
        got = ort_run(session, dict(zip(case.input_names, run_inputs, strict=True)))
    with clock("compare"):
        return _compare(got, case.expected, spec, cell, operands, batch)


def ort_run(session, feeds: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """``session``'s outputs on ``feeds``, as tensors. numpy has no bfloat16: bfloat16 inputs go in as ORT values
    of their bits, and outputs come back through an I/O binding (ORT allocates them; their bits are copied out)."""
    import onnxruntime

    if not any(t.dtype == torch.bfloat16 for t in feeds.values()) and not any(
        o.type == "tensor(bfloat16)" for o in session.get_outputs()
    ):
        return [torch.from_numpy(np.asarray(o)) for o in session.run(None, {k: t.numpy() for k, t in feeds.items()})]
    from onnx import TensorProto

    if not hasattr(onnxruntime.OrtValue, "ortvalue_from_numpy_with_onnx_type"):
        raise RuntimeError(_NO_BFLOAT16_FEED)
    binding = session.io_binding()
    bound = []  # the inputs' values and their (contiguous) buffers live until the run is done
    for name, tensor in feeds.items():
        data = tensor.contiguous()
        if tensor.dtype == torch.bfloat16:
            bits = data.view(torch.int16).numpy().view(np.uint16)
            value = onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, TensorProto.BFLOAT16)
        else:
            value = onnxruntime.OrtValue.ortvalue_from_numpy(data.numpy())
        bound.append((data, value))
        binding.bind_ortvalue_input(name, value)
    for output in session.get_outputs():
        binding.bind_output(output.name, "cpu")
    session.run_with_iobinding(binding)
    outputs = []
    for value in binding.get_outputs():
        if value.data_type() != "tensor(bfloat16)":
            outputs.append(torch.from_numpy(value.numpy()))
            continue
        shape = value.shape()
        size = int(np.prod(shape, dtype=np.int64))
        bits = np.zeros(size, np.uint16)
        if size:
            ctypes.memmove(bits.ctypes.data, value.data_ptr(), 2 * size)
        outputs.append(torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).reshape(shape))
    return outputs


_NO_BFLOAT16_FEED = (
    "this ONNX Runtime's Python API cannot feed bfloat16 (it lacks OrtValue.ortvalue_from_numpy_with_onnx_type)"
)


def _dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def _compare(got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], spec: specs.OpSpec, cell: Cell,
             operands: str, batch: str) -> SubResult:  # fmt: skip
    """ORT's outputs against the expected ones: the same dtype and shape, and values within the cell's tolerance
    (see _TOLERANCES); the same infinity, or NaN where a NaN is expected, is agreement."""
    rtol, atol = spec.tolerances.get(cell.dtype, _TOLERANCES[cell.dtype])
    half = cell.dtype in HALF
    max_error = 0.0
    for ort_out, want in zip(got, expected, strict=True):
        # A half cell's expected floating outputs are float64 values of what should come back in the half dtype.
        want_dtype = want.dtype
        if half and want.is_floating_point():
            want_dtype = next(d for d, n in _DTYPE_NAMES.items() if n == cell.dtype)
        if ort_out.shape != want.shape or ort_out.dtype != want_dtype:
            return SubResult(
                operands, batch, False, None,
                f"ORT gave {_dtype_name(ort_out.dtype)}{list(ort_out.shape)}, expected "
                f"{_dtype_name(want_dtype)}{list(want.shape)}",
            )  # fmt: skip
        if not want.numel():
            continue
        a, b = ort_out.double(), want.double()
        agree = (a == b) | (a.isnan() & b.isnan())
        difference = torch.where(agree, 0.0, (a - b).abs().nan_to_num(nan=math.inf))
        max_error = max(max_error, float(difference.max()))
        if not want.is_floating_point():  # indices, counts, masks: equal
            allowed = torch.zeros_like(b)
        elif half:
            finite = b[b.isfinite()].abs()
            scale = float(finite.max()) if finite.numel() else 0.0
            allowed = rtol * b.abs() + atol * scale + _SUBNORMAL_ROUNDING[cell.dtype]
        else:
            allowed = rtol * b.abs() + atol
        # An expected infinity or NaN is met by the same value only (its allowance would be infinite).
        if not bool((agree | (b.isfinite() & (difference <= allowed))).all()):
            bound = f"rtol {rtol:.3g}/atol {atol:.3g}" + (" of the largest |value|" if half else "")
            reference = " from the float64 value" if half else ""
            return SubResult(operands, batch, False, max_error, f"max error {max_error:.3g}{reference} > {bound}")
    return SubResult(operands, batch, True, max_error)


def _export_dynamo(shared: Shared, key: tuple, case: _Case, inputs: tuple, cell: Cell, clock: _Clock):
    """The dynamo export of subcase ``key`` in ``cell``: of the program captured in an earlier cell if there is one
    (torch.onnx.export takes an ExportedProgram for a module), else of the module; see _sharing_decompositions."""
    program = shared.programs.get(key)
    try:
        with _sharing_decompositions(shared, key, clock):
            return _export(program if program is not None else case.module, inputs, cell, dict(case.kwargs))
    except Exception as error:
        if not any(isinstance(e, _FreshCaptureNeeded) for e in _causes(error)):
            raise
    with _sharing_decompositions(shared, key, clock):
        return _export(case.module, inputs, cell, dict(case.kwargs))


class _FreshCaptureNeeded(Exception):
    """The export needs a decomposition not made yet, of a program decomposed already: it starts again from the
    module."""


def _causes(error: BaseException) -> Iterator[BaseException]:
    """The error and those it was raised from (the exporter wraps what fails inside it)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


@contextlib.contextmanager
def _sharing_decompositions(shared: Shared, key: tuple, clock: _Clock) -> Iterator[None]:
    """While a dynamo export of subcase ``key`` runs: decomposes its captured program once per set of ops with ONNX
    rules, and hands that decomposition to every later export of the subcase with the same set.

    The exporter decomposes the captured program (``run_decompositions``: ~0.2 s even for a one-node graph, mostly
    spent on torch's decomposition tables) into the ops its registry has rules for, which it keeps whole; then it
    translates (consulting the rules of the cell's lowering and opset), converts the opset and optimizes, which
    every cell still does for itself. The decomposition depends on the program and that set of ops alone, and the
    set is the same across the lowerings and most opsets of a group (a lowering changes which rule an op has, not
    whether it has one; torch's set grows at opset 23): it is the work that is the same across cells. Translation
    only reads the decomposed program. A program is never decomposed twice: that is not reliable (with
    data-dependent sizes, as nms_rotated's, a second decomposition can fail), so an export that needs a new
    decomposition of a program decomposed already stops (_FreshCaptureNeeded) and starts again from the module.

    The hook is private (``torch.onnx._internal.exporter._core``); on a torch without it every cell decomposes for
    itself, which is slower and the same (as ``parity --no-share`` does anyway).
    """
    try:
        from torch.onnx._internal.exporter import _core, _decomp

        prepare = _core._prepare_exported_program_for_export
        implemented_ops = _decomp.get_onnx_implemented_overloads
    except (ImportError, AttributeError):
        yield
        return

    @functools.wraps(prepare)
    def prepare_once(exported_program, *args, **kwargs):
        registry = kwargs.get("registry", args[0] if args else None)
        if registry is None:
            return prepare(exported_program, *args, **kwargs)
        ops = frozenset(implemented_ops(registry))
        decomposed = shared.decomposition(key, ops)
        if decomposed is not None:
            return decomposed
        if exported_program is shared.programs.get(key):
            raise _FreshCaptureNeeded
        with clock("decompose"):
            decomposed = prepare(exported_program, *args, **kwargs)  # a new program: the captured one stays as it is
        shared.programs[key] = exported_program
        shared.decomposed.setdefault((key, _torch_state()), []).append((ops, decomposed, _targets(decomposed)))
        return decomposed

    _core._prepare_exported_program_for_export = prepare_once
    try:
        yield
    finally:
        _core._prepare_exported_program_for_export = prepare


def _targets(program: torch.export.ExportedProgram) -> frozenset:
    """The ops that the program's graphs (its subgraphs included) call."""
    return frozenset(
        node.target
        for graph_module in program.graph_module.modules()
        if isinstance(graph_module, torch.fx.GraphModule)
        for node in graph_module.graph.nodes
        if node.op == "call_function"
    )


def _export(model: torch.nn.Module | torch.export.ExportedProgram, inputs: tuple, cell: Cell, kwargs: dict):
    """The cell's model as a user exports it: plain torch.onnx.export under opbridge.onnx.lowering. ``model`` is
    the module, or (dynamo) the program torch.export captured from it in an earlier cell."""
    import onnx

    from .. import onnx as opbridge_onnx

    if cell.exporter == "legacy" and cell.lowering == "function":
        return opbridge_onnx.export(model, inputs, None, opset_version=cell.opset, dynamo=False, lowering="function",
                                    **kwargs)  # fmt: skip
    with opbridge_onnx.lowering(cell.lowering):
        if cell.exporter == "dynamo":
            return torch.onnx.export(model, inputs, dynamo=True, opset_version=cell.opset, **kwargs).model_proto
        buffer = io.BytesIO()
        torch.onnx.export(model, inputs, buffer, dynamo=False, opset_version=cell.opset, **kwargs)
        return onnx.load_from_string(buffer.getvalue())


def run_cell(cell: Cell, shared: Shared | None = None) -> CellResult:
    """Runs one cell; ``shared`` carries what the cells of its group computed before (see :class:`Shared`)."""
    spec = specs.get(cell.op)
    shared = shared if shared is not None else Shared()
    start = time.perf_counter()
    subresults = []
    for operands in spec.operand_kinds:
        for batch in _batch_kinds(cell.exporter):
            clock = _Clock()
            try:
                subresult = run_subcase(spec, cell, operands, batch, shared, clock)
            except Exception as error:  # a failed export or run is a failed cell, with its reason
                first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
                subresult = SubResult(operands, batch, False, None, f"{type(error).__name__}: {first_line[:1000]}")
            subresult.seconds = clock.seconds
            subresults.append(subresult)
    errors = [s.max_error for s in subresults if s.max_error is not None]
    status = "pass" if all(s.passed for s in subresults) else "fail"
    reason = spec.known_gaps(cell) if spec.known_gaps else None
    reason = reason or _dtype_gap(spec, cell, subresults) or _environment_gap(subresults)
    if status == "fail" and reason:
        status = "n/a"
    return CellResult(cell, status, max(errors) if errors else None, time.perf_counter() - start, subresults, reason)


#: ONNX Runtime's words for a node it has no kernel for (at load, or when it assigns kernels).
_NO_KERNEL = ("Could not find an implementation for", "Type Error: Type 'tensor(")


def _dtype_gap(spec: specs.OpSpec, cell: Cell, subresults: Sequence[SubResult]) -> str:
    """Why a half cell cannot pass whatever opbridge does, where its failures say so: bfloat16 below opset 13; the
    TorchScript-based exporter running a torch or torchvision CPU kernel that takes no half input (it runs the model
    to trace it); torch's own dynamo rule, which opbridge leaves in place, emitting half nodes that ONNX Runtime's CPU
    provider has no kernel for."""
    failed = [s for s in subresults if not s.passed]
    if cell.dtype not in HALF or not failed:
        return ""
    # A wrong value or dtype is a failure whatever else the cell meets: only exports and loads that fail are gaps.
    if any(s.max_error is not None or s.detail.startswith("ORT gave") for s in failed):
        return ""
    if cell.dtype == "bfloat16" and cell.opset < BFLOAT16_MIN_OPSET:
        return f"ONNX has bfloat16 from opset {BFLOAT16_MIN_OPSET} (Cast-13): a bfloat16 model needs opset 13 or newer"
    if all(_NO_BFLOAT16_FEED in s.detail for s in failed):
        return _NO_BFLOAT16_FEED
    torch_name = "BFloat16" if cell.dtype == "bfloat16" else "Half"
    ours = spec.namespace == specs.CUSTOM_DOMAIN  # opbridge's own ops take every half dtype: never a gap of theirs
    if (
        not ours
        and cell.exporter == "legacy"
        and all(f"not implemented for '{torch_name}'" in s.detail for s in failed)
    ):
        return (
            f"the TorchScript-based exporter runs the model to trace it, and torch's (or torchvision's) CPU kernel of "
            f"{spec.torch_op} takes no {cell.dtype}; the dynamo exporter does not run it"
        )
    torch_rule = cell.exporter == "dynamo" and cell.lowering == "standard" and not spec.dynamo_overrides_torch
    if torch_rule and not ours and all(any(words in s.detail for words in _NO_KERNEL) for s in failed):
        return (
            f"torch's own dynamo rule for {spec.torch_op}, which opbridge leaves in place, emits {cell.dtype} nodes "
            "that ONNX Runtime's CPU provider has no kernel for"
        )
    return ""


# Failures that come from the runtime's or exporter's version, not from opbridge: recognised by their
# message, reported as n/a with this reason.
_ENVIRONMENT_GAPS = {
    "Unsupported model IR version": "this ONNX Runtime cannot read the IR version the exporter writes "
    "(e.g. ORT 1.16 reads IR <= 9; torch's dynamo exporter writes IR 10)",
    "ValidateOpsetForDomain": "this ONNX Runtime predates the model's opset (e.g. ORT 1.20 knows opsets <= 21)",
}
#: Gaps of one ONNX Runtime release line only (the fragment, the release prefix, the reason): elsewhere the same
#: failure is a failure.
_RELEASE_GAPS = [
    ("FusedMatMul", ("1.16.", "1.20.", "1.23.", "1.24."),
     "ONNX Runtime 1.16 to 1.24 fuses Transpose + MatMul into com.microsoft.FusedMatMul, which it has no float64 "
     "kernel for: the session fails at the default optimization level (ORT_ENABLE_BASIC, or ORT 1.32, run the same "
     "model; measured in the matrix's 1.16.3, 1.20.1, 1.23 and 1.24.4 cells, 2026-11-27; releases between 1.24 "
     "and 1.32 were not run)"),
]  # fmt: skip


def _environment_gap(subresults: Sequence[SubResult]) -> str:
    failed = [s for s in subresults if not s.passed]
    for fragment, reason in _ENVIRONMENT_GAPS.items():
        if failed and all(fragment in s.detail for s in failed):
            return reason
    import onnxruntime

    for fragment, releases, reason in _RELEASE_GAPS:
        if (
            failed
            and onnxruntime.__version__.startswith(releases)
            and all("Failed to find kernel" in s.detail and fragment in s.detail for s in failed)
        ):
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
    return sorted(groups.values(), key=lambda cells: -_group_cost(cells))


#: Relative times, measured (docs/architecture.md): a dynamo export+run case (translation, optimization, ORT
#: session) ~3.5x a TorchScript-based one; decomposing a captured program, which the cells of a group share, ~14x.
_DYNAMO_CASE_COST, _DECOMPOSITION_COST = 3.5, 14.0


def _cost(cell: Cell) -> float:
    """Relative time of a cell's own export+run cases."""
    cases = len(specs.get(cell.op).operand_kinds) * len(_batch_kinds(cell.exporter))
    return cases * (_DYNAMO_CASE_COST if cell.exporter == "dynamo" else 1.0)


def _group_cost(cells_of_group: Sequence[Cell]) -> float:
    """Relative time of a group: its cells, and for the dynamo exporter one decomposition per captured program."""
    cost = sum(_cost(cell) for cell in cells_of_group)
    first = cells_of_group[0]
    if first.exporter == "dynamo":
        cost += _DECOMPOSITION_COST * len(specs.get(first.op).operand_kinds) * len(_batch_kinds("dynamo"))
    return cost


def run_group(cells_of_group: Sequence[Cell], share: bool = True) -> list[CellResult]:
    """Runs a group's cells, sharing what they have in common (:class:`Shared`; ``share=False``: nothing, every
    cell on its own); results in the group's order."""
    if not share:
        return [run_cell(cell) for cell in cells_of_group]
    shared = Shared()  # one group's: dropped with it
    # Newest opset first: torch's dynamo registry has rules for the most ops there, and a decomposition for more
    # ops serves the older opsets too where the extra ops do not occur (Shared.decomposition).
    order = sorted(range(len(cells_of_group)), key=lambda index: -cells_of_group[index].opset)
    results = {index: run_cell(cells_of_group[index], shared) for index in order}
    return [results[index] for index in range(len(cells_of_group))]


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def run(
    selected: Sequence[Cell], jobs: int = 1, stream=sys.stdout, progress=sys.stderr, share: bool = True
) -> list[CellResult]:
    """Runs the cells (in ``jobs`` processes), printing each row as it completes and, on ``progress``,
    how many cells are done and an estimate of the time left. ``share=False``: every cell on its own, sharing
    nothing with the others of its group (slower; the results are the same)."""
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
            report(run_group(group, share))
    else:
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # fresh interpreters: no torch state shared by fork
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_init) as pool:
            futures = [pool.submit(run_group, group, share) for group in groups]
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


def phases(results: Sequence[CellResult]) -> dict[str, dict[str, float]]:
    """Seconds of cell time per exporter and phase (see PHASES), summed over the cases."""
    totals: dict[str, dict[str, float]] = {}
    for result in results:
        exporter = totals.setdefault(result.cell.exporter, dict.fromkeys(PHASES, 0.0))
        for case in result.subresults:
            for phase, seconds in case.seconds.items():
                exporter[phase] += seconds
    return totals


def phase_summary(results: Sequence[CellResult]) -> str:
    """Where the cells' time went, per exporter: seconds per case, and the share of each phase."""
    parts = []
    for exporter, seconds in phases(results).items():
        total = sum(seconds.values())
        cases = sum(len(r.subresults) for r in results if r.cell.exporter == exporter)
        shares = ", ".join(f"{phase} {100 * s / total:.0f}%" for phase, s in seconds.items() if total and s)
        parts.append(f"{exporter} {total:.0f} s, {1000 * total / max(cases, 1):.0f} ms/case ({shares})")
    return "parity: time in cells: " + "; ".join(parts)


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
    try:  # the git commit the installed opbridge was built from (its build info; older builds have none)
        from opbridge import _build_info

        versions["opbridge sources"] = getattr(_build_info, "SOURCE", "") or "-"
    except ImportError:
        versions["opbridge sources"] = "-"
    return versions


def to_json(results: Sequence[CellResult]) -> list[dict]:
    return [
        {
            **dataclasses.asdict(r.cell),
            "status": r.status,
            "reason": r.reason,
            "max_error": r.max_error,
            "seconds": round(r.seconds, 3),
            "cases": [
                {**dataclasses.asdict(s), "seconds": {k: round(v, 4) for k, v in s.seconds.items()}}
                for s in r.subresults
            ],
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
        opsets = representative_opsets()
    selected = cells(args.ops, args.exporters, args.lowerings, opsets, args.dtypes, args.paths)
    if not selected:
        print("parity: no cell matches the selection", file=sys.stderr)
        return 2
    print(f"parity: {len(selected)} cells on {args.jobs} worker(s)", flush=True)
    start = time.perf_counter()
    results = run(selected, args.jobs, share=not args.no_share)
    seconds = time.perf_counter() - start
    failures = [r for r in results if r.status == "fail"]
    if failures:
        print("\nfailed cells:")
        for r in failures:
            print("  " + "  ".join(_row(r)[:6]) + f": {r.detail}")
    print("\n" + summary(results, seconds))
    print(phase_summary(results))
    if args.json:
        document = {
            "summary": summary(results, seconds),
            "environment": environment(),
            "phases": phases(results),
            "cells": to_json(results),
        }
        with open(args.json, "w") as stream:
            json.dump(document, stream, indent=1)
    return 1 if failures else 0
