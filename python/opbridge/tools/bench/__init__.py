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
                    (ORT >= 1.25); ``ort_decomposition``: opbridge's standard-ops lowering (opset 18, dynamic
                    batch and image size); ``ort_dce_exporter``: the standard-ops model of the PyPI package
                    ``deform-conv2d-onnx-exporter`` 1.2.0 (opset 12, static shapes; installed by ``nox -s bench``),
    ``gemm``        the GEMMs of the same sizes alone (OpenBLAS, its own threads),
    ``torch_op``    ``opbridge.deform_conv2d``; ``torch_torchvision``: torchvision's CPU kernel.

ms_deform_attn (float32; Deformable DETR's encoder self-attention: every pixel of every level queries, d_model
256 = 8 heads x 32 channels, 4 levels, 4 points; an 800x1333 and a 512x512 image at strides 8-64):
    ``ort_custom``  ORT ``opbridge::MultiScaleDeformableAttention``; ``ort_standard``: the GridSample lowering,
    ``torch_op``    ``opbridge.ms_deform_attn``; ``torch_reference``: the grid_sample reference
                    (Deformable DETR's pure-PyTorch path), ``torch_backward`` / ``torch_reference_backward``:
                    the gradients of value, sampling_locations and attention_weights through each.

ORT sessions run with ``intra_op_num_threads`` = threads and IO binding (inputs
and the output preallocated, so no copies are timed); torch runs with
``torch.set_num_threads`` and allocates its output in every call, as users do.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import platform
import statistics
import sys
import time
import warnings
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

    # ms_deform_attn ----------------------------------------------------------------------------------
    def ms_deform_attn(self) -> None:
        from .ops.ms_deform_attn import _OpModel, reference

        for case, levels in MSDA_CASES.items():
            inputs = _msda_inputs(levels)
            want = opbridge.ms_deform_attn(*inputs).numpy()
            torch.testing.assert_close(torch.from_numpy(want), reference(*inputs), rtol=1e-4, atol=1e-4)
            names = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]
            models = {}
            for path, lowering in (("ort_custom", "custom"), ("ort_standard", "standard")):
                with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    models[path] = opbridge.onnx.export(_OpModel(), inputs, opset_version=17, dynamo=False,
                                                        lowering=lowering, input_names=names)  # fmt: skip
            feeds = {n: t.numpy() for n, t in zip(names, inputs, strict=True)}
            leaves = [t.detach().clone().requires_grad_(t.dtype.is_floating_point) for t in inputs]
            wrt = [leaves[0], leaves[3], leaves[4]]
            grad = torch.ones_like(torch.from_numpy(want))

            def backward_of(op, leaves=leaves, wrt=wrt, grad=grad):
                out = op(*leaves)
                return lambda: torch.autograd.grad(out, wrt, grad, retain_graph=True)

            record = partial(self.record, "ms_deform_attn", case)
            for threads in self.threads:
                torch.set_num_threads(threads)
                for path, model in models.items():
                    session = ort_session(model, threads, path == "ort_custom")
                    out = np.empty(want.shape, dtype=np.float32)
                    run = bound_run(session, feeds, out)
                    run()
                    _check(path, out, want, 1e-4, 1e-4)
                    record(threads, path, run)
                record(threads, "torch_op", partial(opbridge.ms_deform_attn, *inputs))
                record(threads, "torch_reference", partial(reference, *inputs))
                ours, theirs = backward_of(opbridge.ms_deform_attn), backward_of(reference)
                for a, b in zip(ours(), theirs(), strict=True):  # float32 sums of thousands of terms
                    _check("torch_backward", a.numpy(), b.numpy(), 1e-3, 1e-4 * float(b.abs().max()))
                record(threads, "torch_backward", ours)
                record(threads, "torch_reference_backward", theirs)

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
            "ort_decomposition": _export(module, args, 18, "standard", dynamic=True),
            "ort_dce_exporter": _dce_exporter_model(module, args, torchvision_op),
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
                if isinstance(model, str):  # why there is no model
                    record(threads, path, None, model)
                    continue
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
            self._deform_backward(record, threads, torchvision_op, (x, offset, weight, bias, mask))

    def _deform_backward(self, record, threads: int, torchvision_op, tensors) -> None:
        """All five gradients (input, offset, weight, bias, mask), opbridge's backward vs torchvision's."""
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        x, offset, weight, bias, mask = leaves

        def backward_of(op):
            out = op(x, offset, weight, bias, (1, 1), (1, 1), (1, 1), mask)
            grad_out = torch.ones_like(out)
            return lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True)

        ours = backward_of(opbridge.deform_conv2d)
        if torchvision_op is None:
            record(threads, "torch_backward", ours)
            record(threads, "torchvision_backward", None, "n/a: torchvision's compiled ops do not load with this torch")
            return
        theirs = backward_of(torchvision_op)
        for name, got, want in zip(("input", "offset", "weight", "bias", "mask"), ours(), theirs(), strict=True):
            _check(f"torch_backward {name}", got.numpy(), want.numpy(), 1e-3, 1e-3)
        record(threads, "torch_backward", ours)
        record(threads, "torchvision_backward", theirs)


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


#: The encoder's feature maps (H, W) at strides 8, 16, 32, 64.
MSDA_CASES = {
    "800x1333 enc": [(100, 167), (50, 84), (25, 42), (13, 21)],
    "512x512 enc": [(64, 64), (32, 32), (16, 16), (8, 8)],
}
MSDA_HEADS, MSDA_CHANNELS, MSDA_POINTS = 8, 32, 4


def _msda_inputs(levels) -> tuple[torch.Tensor, ...]:
    """Encoder self-attention inputs: every pixel queries around its own centre (offsets of a few pixels), as a
    trained Deformable DETR does; softmax-normalized attention weights."""
    from .ops.ms_deform_attn import sample_inputs

    generator = torch.Generator().manual_seed(0)
    value, shapes, starts, _, _ = sample_inputs(torch.float32, 1, levels, 1, MSDA_HEADS, MSDA_CHANNELS, MSDA_POINTS)
    centres = []
    for height, width in levels:
        y, x = torch.meshgrid((torch.arange(height) + 0.5) / height, (torch.arange(width) + 0.5) / width,
                              indexing="ij")  # fmt: skip
        centres.append(torch.stack([x.flatten(), y.flatten()], -1))
    queries = torch.cat(centres)  # [Lq, 2]
    count = queries.shape[0]
    spread = 2.0 / torch.tensor([[w, h] for h, w in levels], dtype=torch.float32)  # ~2 pixels of each level
    offsets = torch.randn(1, count, MSDA_HEADS, len(levels), MSDA_POINTS, 2, generator=generator)
    locations = queries[None, :, None, None, None, :] + offsets * spread[None, None, None, :, None, :]
    weights = torch.randn(1, count, MSDA_HEADS, len(levels) * MSDA_POINTS, generator=generator).softmax(-1)
    return value, shapes, starts, locations.contiguous(), weights.view(1, count, MSDA_HEADS, len(levels), -1)


def msda_gathered_bytes(levels) -> int:
    """Bytes of value one forward reads per query: heads x levels x points x 4 corners x channels x 4 bytes."""
    return MSDA_HEADS * len(levels) * MSDA_POINTS * 4 * MSDA_CHANNELS * 4


def _export(module: torch.nn.Module, args: tuple, opset: int, lowering: str, dynamic: bool = False) -> onnx.ModelProto:
    names = ["input", "offset", "mask"]
    axes = {name: {0: "batch", 2: f"{name}_height", 3: f"{name}_width"} for name in names} if dynamic else None
    with contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        return opbridge.onnx.export(
            module, args, opset_version=opset, dynamo=False, lowering=lowering,
            input_names=names, output_names=["output"], dynamic_axes=axes,
        )  # fmt: skip


def _dce_exporter_model(module: torch.nn.Module, args: tuple, torchvision_op) -> onnx.ModelProto | str:
    """The baseline decomposition of ``deform-conv2d-onnx-exporter`` 1.2.0 (its opset 12, static shapes), or why
    there is none. It exports torchvision's op through a legacy-exporter symbolic; on torch >= 2.14 it needs
    ``JitScalarType`` from its new home."""
    if torchvision_op is None:
        return "n/a: torchvision's compiled ops do not load with this torch"
    try:
        import deform_conv2d_onnx_exporter as dce
    except ImportError:
        return "n/a: pip install deform-conv2d-onnx-exporter==1.2.0"
    if dce.JitScalarType is None:  # torch >= 2.14 moved it
        from torch.onnx._internal.torchscript_exporter import _type_utils

        dce.JitScalarType = _type_utils.JitScalarType
    dce.register_deform_conv2d_onnx_op()
    weight, bias = module.weight.detach(), module.bias.detach()

    class Torchvision(torch.nn.Module):
        def forward(self, x, offset, mask):
            return torchvision_op(x, offset, weight, bias, padding=(1, 1), mask=mask)

    buffer = io.BytesIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Torchvision(), args, buffer, opset_version=12, dynamo=False,
                              input_names=["input", "offset", "mask"], output_names=["output"])  # fmt: skip
    finally:  # its symbolic (registered from opset 12 up) must not replace opbridge's in this process
        torch.onnx.unregister_custom_op_symbolic("torchvision::deform_conv2d", 12)
    return onnx.load_from_string(buffer.getvalue())


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
    ("deform_conv2d", "ort_decomposition", "ort_dce_exporter", 1.5, None),
    ("deform_conv2d", "ort_custom", "gemm", 0.5, None),
    ("deform_conv2d", "torch_op", "torch_torchvision", 3.0, None),
    ("deform_conv2d", "torch_backward", "torchvision_backward", 3.0, None),
    ("ms_deform_attn", "ort_custom", "ort_standard", 10.0, None),
    ("ms_deform_attn", "torch_op", "torch_reference", 5.0, None),
    ("ms_deform_attn", "torch_backward", "torch_reference_backward", 3.0, None),
    ("framework", "export_cached", "export_uncached", 2.0, None),
]


# --- the framework: import time and one dynamo export, each in fresh interpreters ---------------------------------

_IMPORT_SCRIPT = "import time; t = time.perf_counter(); import torch{extra}; print(time.perf_counter() - t)"
_EXPORT_SCRIPT = """
import time, warnings
warnings.simplefilter("ignore")
import torch, opbridge
module, args = opbridge.nn.MyAdd().eval(), (torch.randn(2, 3), torch.randn(3))
times = []
for _ in range({runs}):
    start = time.perf_counter()
    torch.onnx.export(module, args, dynamo=True, verbose=False)
    times.append(time.perf_counter() - start)
print(sorted(times[1:])[len(times[1:]) // 2])
"""


def _interpreter_seconds(script: str, env: dict | None = None) -> float:
    import os
    import subprocess

    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                            env={**os.environ, **(env or {})})  # fmt: skip
    return float(result.stdout.strip().splitlines()[-1])


def framework_rows(repeat: int) -> list[Row]:
    """`import torch` vs `import torch, opbridge` (medians over fresh interpreters), and the median time of a
    one-node dynamo export in a warm process with opbridge's export caches and without (OPBRIDGE_EXPORT_CACHE=0)."""
    rows = []
    for path, extra in (("import_torch", ""), ("import_opbridge", ", opbridge")):
        times = [_interpreter_seconds(_IMPORT_SCRIPT.format(extra=extra)) for _ in range(max(repeat, 3))]
        rows.append(Row("framework", "import", 1, path, 1000 * statistics.median(times), [1000 * t for t in times]))
    for path, cache in (("export_cached", "1"), ("export_uncached", "0")):
        seconds = _interpreter_seconds(_EXPORT_SCRIPT.format(runs=max(repeat, 3) + 1), {"OPBRIDGE_EXPORT_CACHE": cache})
        rows.append(Row("framework", "dynamo export, one node", 1, path, 1000 * seconds, [1000 * seconds]))
    return rows


#: What `import opbridge` may add to `import torch` (issue 10).
IMPORT_BUDGET_MS = 1000.0


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


def markdown(rows: list[Row], summary: list[dict], environment: dict, parity_report: Path | None = None) -> str:
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
    for op in ("my_add", "deform_conv2d", "ms_deform_attn", "framework"):
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
        if op == "ms_deform_attn":
            notes += msda_limit_notes(rows)
        if op == "framework":
            added = import_added_ms(rows)
            if added is not None:
                verdict = "yes" if added <= IMPORT_BUDGET_MS else "**no**"
                notes.append(f"`import opbridge` adds {added:.0f} ms to `import torch` (goal <= "
                             f"{IMPORT_BUDGET_MS:.0f} ms: {verdict})")  # fmt: skip
        lines += [""] + [f"- {note}" for note in notes] + ([""] if notes else [])
    lines += parity_section(parity_report)
    return "\n".join(lines).rstrip() + "\n"


def msda_limit_notes(rows: list[Row]) -> list[str]:
    """The forward's rate of gathered value bytes (GB/s) against the triad's memory bandwidth of the same run."""
    triad = {r.threads: r for r in rows if r.op == "my_add" and r.path == "triad" and r.case == "64 Mi"}
    notes = []
    for r in rows:
        if r.op != "ms_deform_attn" or r.path not in ("ort_custom", "torch_op") or not r.median_ms:
            continue
        levels = MSDA_CASES[r.case]
        queries = sum(h * w for h, w in levels)
        rate = queries * msda_gathered_bytes(levels) / (r.median_ms / 1000) / 1e9
        bound = triad.get(r.threads)
        triad_rate = 3 * 64 * MEBI * 4 / (bound.median_ms / 1000) / 1e9 if bound and bound.median_ms else None
        versus = f" (triad: {triad_rate:.1f} GB/s)" if triad_rate else ""
        notes.append(f"{r.case}, {r.threads}t, {r.path}: {rate:.1f} GB/s of value gathered{versus}")
    return notes


def import_added_ms(rows: list[Row]) -> float | None:
    times = {r.path: r.median_ms for r in rows if r.op == "framework" and r.case == "import"}
    if "import_torch" not in times or "import_opbridge" not in times:
        return None
    return times["import_opbridge"] - times["import_torch"]


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
    from ._cli import bench_parser

    args = bench_parser().parse_args(argv)
    opbridge._load()  # deferred under `python -m opbridge`; the op modules imported below need it done

    bench = Bench(args.threads, args.warmup, args.repeat, args.triad_library)
    environment = {
        "torch": torch.__version__, "onnxruntime": ort.__version__, "opbridge": opbridge.__version__,
        "python": platform.python_version(), "machine": f"{cpu_name()}, {_cpu_count()} cores",
        "warmup": args.warmup, "repeat": args.repeat,
    }  # fmt: skip
    print(f"opbridge bench: torch {environment['torch']}, onnxruntime {environment['onnxruntime']}, "
          f"threads {args.threads}, {args.warmup} warm-up + {args.repeat} timed runs each", flush=True)  # fmt: skip
    start = time.perf_counter()
    for op in args.ops:
        if op == "framework":
            bench.rows += framework_rows(args.repeat)
        else:
            getattr(bench, op)()
    summary = ratios(bench.rows)
    print(f"\n{'op':14} {'case':24} thr {'path':12} {'baseline':18} ratio   target")
    for item in summary:
        ratio = f"{item['ratio']:6.2f}" if item["ratio"] is not None else "   n/a"
        target = f">= {item['target']}" if item["target"] is not None else ""
        flag = {True: "", False: "  MISSED", None: ""}[item["met"]]
        print(f"{item['op']:14} {item['case']:24} {item['threads']}t  {item['path']:12} {item['baseline']:18} "
              f"{ratio}  {target}{flag}")  # fmt: skip
    added = import_added_ms(bench.rows)
    if added is not None:
        print(f"import opbridge adds {added:.0f} ms to import torch (goal <= {IMPORT_BUDGET_MS:.0f} ms)")
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


def cpu_name() -> str:
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
