"""deform_conv2d's benchmark (float32, 3x3, with mask).

``ort_custom``  ORT ``opbridge::DeformConv2d``; ``ort_standard``: ORT's ``DeformConv``
                (ORT >= 1.25); ``ort_decomposition``: opbridge's standard-ops lowering (opset 18, dynamic
                batch and image size); ``ort_dce_exporter``: the standard-ops model of the PyPI package
                ``deform-conv2d-onnx-exporter`` 1.2.0 (opset 12, static shapes; installed by ``nox -s bench``),
``openvino_standard``  the opset-18 lowering in OpenVINO's CPU plugin, float32 (OpenVINO does not read
                ``DeformConv``-19); ``openvino_default``: the same at the plugin's default precision (``_openvino.py``),
``gemm``        the GEMMs of the same sizes alone: the faster of OpenBLAS's (its own threads) and ORT's own
                (a MatMul node, MLAS), the two the ORT node can use (cpp/ort/gemm.h); the note names it,
``torch_op``    ``opbridge.deform_conv2d``; ``torch_torchvision``: torchvision's CPU kernel,
``torch_op_bf16`` / ``torch_op_fp16``  the op with half input, weight and bias (offset and mask float32, as
                autocast calls it); ``ort_custom_bf16`` / ``ort_custom_fp16``: a bfloat16 node (inputs bound as
                bfloat16) and the float16 model's node,
``torch_backward`` / ``torchvision_backward``  all five gradients through each; ``torch_train`` /
                ``torchvision_train``: a training step's share, the forward and all five gradients.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import statistics
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import torch

import opbridge

from . import (
    Bench,
    Row,
    Target,
    _openvino,
    bound_run,
    check_close,
    checked_run,
    cpu_has_bf16,
    ort_session,
    time_call,
)

TARGETS = [
    Target("ort_custom", "ort_standard", 1.0),
    Target("ort_custom", "ort_decomposition", None),
    Target("ort_custom", "openvino_standard", 1.0),
    Target("ort_decomposition", "ort_dce_exporter", 1.5),
    Target("ort_custom", "gemm", 0.5),
    Target("torch_op", "torch_torchvision", 3.0),
    Target("torch_backward", "torchvision_backward", 3.0),
    Target("torch_train", "torchvision_train", 3.0),
    # Half precision against the same op in float32 (issue 44's bars, on CPUs with bfloat16 instructions; the ops
    # convert half storage to float32 today, so elsewhere the ratio is reported without a bar).
    Target("torch_op_bf16", "torch_op", 1.5 if cpu_has_bf16() else None),
    Target("torch_op_fp16", "torch_op", None),
    Target("ort_custom_bf16", "ort_custom", 1.5 if cpu_has_bf16() else None),
    Target("ort_custom_fp16", "ort_custom", None),
]
_NO_TORCHVISION = "n/a: torchvision's compiled ops do not load with this torch"


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


SHAPES = [
    DeformShape(1, 64, 64, 128, 128),
    DeformShape(1, 256, 256, 50, 84),
    DeformShape(4, 128, 128, 32, 32),
    DeformShape(1, 256, 256, 50, 84, offset_groups=4),
]


def run(bench: Bench) -> None:
    torchvision_op = _torchvision_deform_conv2d()
    blas = _OpenBLAS.load()
    for shape in SHAPES:
        _case(bench, shape, torchvision_op, blas)


def _case(bench: Bench, shape: DeformShape, torchvision_op, blas: _OpenBLAS | None) -> None:
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
    # float16 deployment: the model after .half(), its custom node run by the library's float16 kernel.
    half_module = opbridge.nn.DeformConv2d(shape.in_channels, shape.out_channels, 3, padding=1).eval()
    half_module.load_state_dict(module.state_dict())
    half_module = half_module.half()
    half_args = tuple(t.half() for t in args)
    with torch.no_grad():
        half_want = half_module(*half_args).numpy()
    half_model = _export(half_module, half_args, 19, "custom")
    half_inputs = {name: value.astype(np.float16) for name, value in inputs.items()}
    scale = float(np.abs(want).max())

    def torch_op():
        with torch.no_grad():
            return module(*args)

    def torch_torchvision():
        return torchvision_op(x, offset, weight, bias, padding=(1, 1), mask=mask)

    record = partial(bench.record, "deform_conv2d", shape.name)
    for threads in bench.threads:
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
            record(threads, path, checked_run(path, session, inputs, want, 1e-4, 1e-4))
        _openvino.record_paths(record, threads, models["ort_decomposition"], inputs, want, 1e-4, 1e-4)
        record(threads, "gemm", *_fastest_gemm(blas, shape, threads))
        check_close("torch_op", torch_op().numpy(), want, 1e-4, 1e-4)
        record(threads, "torch_op", torch_op)
        # As autocast calls it: input, weight and bias in the half type, offset and mask in float32.
        for path, dtype in (("torch_op_bf16", torch.bfloat16), ("torch_op_fp16", torch.float16)):
            half = [x.to(dtype), offset, weight.to(dtype), bias.to(dtype), mask]

            def half_op(half=half):
                with torch.no_grad():
                    return opbridge.deform_conv2d(half[0], half[1], half[2], half[3], padding=(1, 1), mask=half[4])

            check_close(path, half_op().float().numpy(), want, 0.03, 0.03 * scale)
            record(threads, path, half_op)
        session = ort_session(half_model, threads, True)
        half_run = checked_run("ort_custom_fp16", session, half_inputs, half_want, 0, 2e-3 * scale)
        record(threads, "ort_custom_fp16", half_run)
        session = ort_session(_bfloat16_node_model(module, shape.offset_groups), threads, True)
        record(threads, "ort_custom_bf16", _bfloat16_run(session, inputs, want, scale))
        if torchvision_op is None:
            record(threads, "torch_torchvision", None, _NO_TORCHVISION)
        else:
            check_close("torch_torchvision", torch_torchvision().numpy(), want, 1e-4, 1e-4)
            record(threads, "torch_torchvision", torch_torchvision)
        _backward(record, threads, torchvision_op, (x, offset, weight, bias, mask))


def _bfloat16_bits(array) -> np.ndarray:
    """bfloat16 values (rounded to nearest even) as their bits: numpy has no bfloat16."""
    return torch.as_tensor(np.asarray(array, np.float32)).bfloat16().view(torch.int16).numpy().view(np.uint16)


def _bfloat16_node_model(module, offset_groups: int) -> onnx.ModelProto:
    """One bfloat16 ``opbridge::DeformConv2d`` node with the module's weights: what a bfloat16 export by another tool
    holds (opbridge's exporter writes casts around a float32 node for a bfloat16 model, which runs on any provider)."""
    from onnx import TensorProto, helper

    def initializer(name, tensor):
        bits = _bfloat16_bits(tensor.detach().numpy())
        return helper.make_tensor(name, TensorProto.BFLOAT16, list(tensor.shape), bits.tobytes(), raw=True)

    attributes = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1}
    node = helper.make_node("DeformConv2d", ["input", "W", "offset", "B", "mask"], ["output"], domain="opbridge",
                            offset_group=offset_groups, **attributes)  # fmt: skip
    info = partial(helper.make_tensor_value_info, elem_type=TensorProto.BFLOAT16, shape=None)
    weights = [initializer("W", module.weight), initializer("B", module.bias)]
    inputs = [info(name) for name in ("input", "offset", "mask")]
    graph = helper.make_graph([node], "deform_conv2d_bfloat16", inputs, [info("output")], initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid("opbridge", 1)])
    model.ir_version = 8
    return model


def _bfloat16_run(session, inputs: dict[str, np.ndarray], want: np.ndarray, scale: float) -> Callable[[], None]:
    """A zero-copy run of the bfloat16 node on the inputs rounded to bfloat16, checked once against float32's."""
    out = np.empty(want.shape, np.uint16)
    halves = {name: _bfloat16_bits(value) for name, value in inputs.items()}
    run = bound_run(session, halves, out, uint16_as=onnx.TensorProto.BFLOAT16)
    run()
    got = torch.from_numpy(out.view(np.int16)).view(torch.bfloat16).float().numpy()
    check_close("ort_custom_bf16", got, want, 0.03, 0.03 * scale)
    return run


def notes(rows: list[Row]) -> list[str]:
    return _openvino.notes("deform_conv2d", rows)


def _backward(record, threads: int, torchvision_op, tensors) -> None:
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
        record(threads, "torchvision_backward", None, _NO_TORCHVISION)
        return
    theirs = backward_of(torchvision_op)
    for name, got, want in zip(("input", "offset", "weight", "bias", "mask"), ours(), theirs(), strict=True):
        check_close(f"torch_backward {name}", got.numpy(), want.numpy(), 1e-3, 1e-3)
    record(threads, "torch_backward", ours)
    record(threads, "torchvision_backward", theirs)

    def train_step(op):  # a training step's share: the forward and all five gradients
        def step():
            out = op(x, offset, weight, bias, (1, 1), (1, 1), (1, 1), mask)
            return torch.autograd.grad(out, leaves, torch.ones_like(out))

        return step

    record(threads, "torch_train", train_step(opbridge.deform_conv2d))
    record(threads, "torchvision_train", train_step(torchvision_op))


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
        return _NO_TORCHVISION
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


def _fastest_gemm(blas: _OpenBLAS | None, shape: DeformShape, threads: int) -> tuple[Callable[[], None], str]:
    """The bound of the ORT node's products: OpenBLAS's sgemm or ORT's MatMul (MLAS) of the same sizes, whichever is
    faster here (the median of 5 runs after 2 warm-up runs decides), with a note naming it."""
    m, k, n = shape.out_channels, shape.in_channels * 9, shape.height * shape.width
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((shape.batch, k, n), dtype=np.float32)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["a", "b"], ["c"])], "gemm",
        [onnx.helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [m, k]),
         onnx.helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [shape.batch, k, n])],
        [onnx.helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [shape.batch, m, n])],
    )  # fmt: skip
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    model.ir_version = 8  # readable by every ORT the bench supports
    session = ort_session(model, threads, with_library=False)
    c = np.empty((shape.batch, m, n), dtype=np.float32)
    runtime = bound_run(session, {"a": a, "b": b}, c)
    runtime()
    check_close("gemm", c, a @ b, 1e-3, 1e-3)
    candidates = [(runtime, "ORT MatMul (MLAS), same sizes")]
    if blas is not None:
        candidates.append((blas.gemm_call(shape, threads), "OpenBLAS sgemm, same sizes"))

    return min(candidates, key=lambda candidate: statistics.median(time_call(candidate[0], 2, 5)))


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
        check_close("gemm", c, a @ b, 1e-3, 1e-3)
        return run
