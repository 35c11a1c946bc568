"""OpenVINO's CPU plugin on an op's standard ONNX form: the runtime users could pick instead of ORT (issue 25).

    ``openvino_standard``  in float32 (``INFERENCE_PRECISION_HINT`` f32), so its times compare with ORT's,
    ``openvino_default``   at the plugin's default precision, what a user gets without asking: bfloat16 on a CPU
                           with AVX512-BF16 or AMX, for the layers the plugin runs in it; timed without a bar, its
                           error against the reference in the row's note and the op's notes.

Both run on the case's static shapes (the model reshaped to its inputs, which lets the plugin plan every layer
once, as users deploying OpenVINO do) with ``INFERENCE_NUM_THREADS`` = threads in one stream under the latency
hint, without hyper-threading or pinning (ORT's session threads are not pinned either). Inputs and the output are
tensors over numpy buffers, set once on one infer request, so no copies are timed (ORT's IO binding).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from . import Row, check_close

PATHS = ("openvino_standard", "openvino_default")
_NOT_INSTALLED = "n/a: openvino not installed"


def record_paths(record: Callable, threads: int, model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                 want: np.ndarray, rtol: float, atol: float) -> None:  # fmt: skip
    """Both OpenVINO paths of one case, through `record(threads, path, fn, note)`: ``openvino_standard`` checked
    against `want` like every path, ``openvino_default`` only run, its max abs error noted."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        for path in PATHS:
            record(threads, path, None, _NOT_INSTALLED)
        return
    for path, precision in zip(PATHS, ("f32", None), strict=True):
        try:
            compiled = compile_model(model, feeds, threads, precision)
        except Exception as error:  # an operator or opset the plugin does not read
            record(threads, path, None, f"n/a: {str(error).strip().splitlines()[0][:80]}")
            continue
        run, out = bound_request(compiled, feeds, want)
        run()
        if precision is not None:
            check_close(path, out, want, rtol, atol)
            record(threads, path, run)
            continue
        error, largest = float(np.max(np.abs(out.astype(np.float64) - want))), float(np.max(np.abs(want)))
        used = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
        record(threads, path, run, f"default precision {used}: max abs error {error:.2g} (outputs up to {largest:.2g})")


def compile_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int, precision: str | None):
    """`model` for the CPU plugin on the shapes of `feeds`, at `threads` threads; `precision` None: the plugin's
    default (what a user gets without asking)."""
    import openvino as ov

    core = ov.Core()
    network = core.read_model(model.SerializeToString())
    network.reshape({port: ov.PartialShape(list(_feed(port, feeds).shape)) for port in network.inputs})
    config = {
        "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
        "ENABLE_HYPER_THREADING": False, "ENABLE_CPU_PINNING": False,
    }  # fmt: skip
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    return core.compile_model(network, "CPU", config)


def bound_request(compiled, feeds: dict[str, np.ndarray], want: np.ndarray) -> tuple[Callable[[], None], np.ndarray]:
    """A zero-copy run of `compiled` (inputs and the output are tensors over numpy buffers) and its output."""
    import openvino as ov

    request = compiled.create_infer_request()
    buffers = [np.ascontiguousarray(_feed(port, feeds)) for port in compiled.inputs]
    out = np.empty(want.shape, dtype=want.dtype)
    for port, buffer in zip(compiled.inputs, buffers, strict=True):
        request.set_tensor(port, ov.Tensor(buffer, shared_memory=True))
    request.set_output_tensor(0, ov.Tensor(out, shared_memory=True))

    def run() -> None:
        request.infer()

    # The tensors view these arrays and the request does not own its compiled model: all must live as long as
    # `run`, which the harness calls after this returns (Bench.record times a case's paths together).
    run.keep = (buffers, out, compiled)
    return run, out


def _feed(port, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The array of an input port: a port has several names (an input read straight into a Cast takes the Cast's
    output name too), one of them the ONNX input's."""
    return next(feeds[name] for name in port.get_names() if name in feeds)


def notes(op: str, rows: list[Row]) -> list[str]:
    """One line per ``openvino_default`` row of `op`: its time beside OpenVINO's f32 and ``ort_custom``, and what
    its default precision cost in accuracy."""
    times = {(r.case, r.threads, r.path): r.median_ms for r in rows if r.op == op}
    found = []
    for r in rows:
        if r.op != op or r.path != "openvino_default" or r.median_ms is None:
            continue
        f32, ours = times.get((r.case, r.threads, "openvino_standard")), times.get((r.case, r.threads, "ort_custom"))
        beside = ", ".join(f"{name}: {ms:.2f} ms" for name, ms in (("f32", f32), ("ort_custom", ours)) if ms)
        found.append(f"{r.case}, {r.threads}t: openvino_default {r.median_ms:.2f} ms ({beside}), {r.note}")
    return found
