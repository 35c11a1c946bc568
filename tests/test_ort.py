"""The ORT custom-op library and the torch-free opbridge_ort package."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

import opbridge
import opbridge_ort

TESTS = Path(__file__).parent


def test_ort_smoke_checks_without_torch(tmp_path):
    """Hand-built models, bad shapes/dtypes/arity, in a process that never imports torch."""
    result = subprocess.run(
        [sys.executable, str(TESTS / "ort_smoke.py"), opbridge_ort.library_path()],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 failed" in result.stdout and "torch was not imported" in result.stdout


def test_importing_opbridge_ort_does_not_import_torch(tmp_path):
    script = (
        "import sys, numpy as np, opbridge_ort\n"
        "from ort_cases.my_add import my_add_model\n"
        "s = opbridge_ort.InferenceSession(my_add_model(np.float32, [2], [2]))\n"
        "(c,) = s.run(None, {'A': np.ones(2, np.float32), 'B': np.ones(2, np.float32)})\n"
        "assert (c == 3).all()\n"
        "assert 'torch' not in sys.modules, 'opbridge_ort imported torch'\n"
    )
    env = {"PYTHONPATH": str(TESTS)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr


def test_opbridge_ort_is_reexported():
    assert opbridge.ort is opbridge_ort


def test_library_path_and_session_options():
    path = Path(opbridge_ort.library_path())
    assert path.is_file() and path.name == "libopbridge_ort.so"
    options = opbridge_ort.session_options()
    # Registering twice on the same options is harmless (ORT would reject a duplicate domain).
    assert opbridge_ort.session_options(options) is options
    sys.path.insert(0, str(TESTS))
    try:
        from ort_cases.my_add import my_add_model
    finally:
        sys.path.remove(str(TESTS))
    session = onnxruntime.InferenceSession(my_add_model(np.float64, [3], [1]), options)
    (c,) = session.run(None, {"A": np.arange(3.0), "B": np.ones(1)})
    np.testing.assert_array_equal(c, [1.0, 3.0, 5.0])


def test_inference_session_accepts_path_bytes_and_proto(tmp_path):
    import onnx

    sys.path.insert(0, str(TESTS))
    try:
        from ort_cases.my_add import my_add_model
    finally:
        sys.path.remove(str(TESTS))
    data = my_add_model(np.float32, ["n"], ["n"])
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    feeds = {"A": np.ones(4, np.float32), "B": np.full(4, 2, np.float32)}
    for model in (data, str(path), path, onnx.load_from_string(data)):
        (c,) = opbridge_ort.InferenceSession(model).run(None, feeds)
        np.testing.assert_array_equal(c, np.full(4, 4, np.float32))


def test_missing_library_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("OPBRIDGE_ORT_LIBRARY", str(tmp_path / "nope.so"))
    with pytest.raises(FileNotFoundError, match=r"OPBRIDGE_ORT_LIBRARY points to .* cmake"):
        opbridge_ort.library_path()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("size", ["chunks", "beyond the cache"])
def test_intra_op_threads(threads, size):
    """Several parallel chunks with a broadcast row; and an output larger than the last-level cache, which takes
    the streaming-store loop (cpp/kernels/my_add.h)."""
    sys.path.insert(0, str(TESTS))
    try:
        from conftest import beyond_last_level_cache
        from ort_cases.my_add import my_add_model
    finally:
        sys.path.remove(str(TESTS))
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = opbridge_ort.InferenceSession(my_add_model(np.float32, [None, None], [None]), options)
    shape = (7, 300_001) if size == "chunks" else (1, beyond_last_level_cache())
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(shape[1]).astype(np.float32)
    (c,) = session.run(None, {"A": a, "B": b})
    np.testing.assert_array_equal(c, 2 * a + b)


def _thread_cpu_ticks() -> dict[str, int]:
    """utime + stime of every thread of this process, in clock ticks (/proc/self/task/*/stat)."""
    ticks = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        ticks[task.name] = int(fields[11]) + int(fields[12])
    return ticks


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc to see per-thread CPU time")
def test_deform_conv2d_honours_intra_op_num_threads():
    """With intra_op_num_threads=1 the whole deformable convolution (sampling and OpenBLAS GEMM) runs on the
    calling thread; with 2, a second thread does a real share of it. Checked by per-thread CPU time."""
    sys.path.insert(0, str(TESTS))
    try:
        from ort_cases.deform_conv2d import deform_model
    finally:
        sys.path.remove(str(TESTS))
    rng = np.random.default_rng(0)
    feeds = {
        "X": rng.standard_normal((1, 64, 64, 64), dtype=np.float32),
        "W": rng.standard_normal((64, 64, 3, 3), dtype=np.float32),
        "offset": rng.standard_normal((1, 18, 64, 64), dtype=np.float32),
        "B": rng.standard_normal(64, dtype=np.float32),
        "mask": rng.random((1, 9, 64, 64), dtype=np.float32),
    }
    model = deform_model(np.float32, strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1, offset_group=1)
    caller = str(threading.get_native_id())
    # Loading the library loads OpenBLAS, whose idle pool threads spin for a moment before they sleep (once per
    # process; see docs/architecture.md): load it, let them settle, then measure.
    opbridge_ort.InferenceSession(model).run(None, feeds)
    time.sleep(1.0)
    shares = {}
    for threads in (1, 2):
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        session = opbridge_ort.InferenceSession(model, options)
        session.run(None, feeds)
        before = _thread_cpu_ticks()
        # Enough runs for at least 0.5 s of CPU time (in 10 ms ticks), however fast the machine.
        for _ in range(1000):
            for _ in range(10):
                session.run(None, feeds)
            after = _thread_cpu_ticks()
            spent = {tid: after[tid] - before.get(tid, 0) for tid in after}
            total = sum(spent.values())
            if total >= 50:
                break
        assert total >= 50, f"too little work to measure ({total} ticks)"
        shares[threads] = 1 - spent.get(caller, 0) / total
    assert shares[1] < 0.1, f"with 1 intra-op thread, {shares[1]:.0%} of the CPU time was on other threads"
    assert shares[2] > 0.2, f"with 2 intra-op threads, only {shares[2]:.0%} of the CPU time was on other threads"
