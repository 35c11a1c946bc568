"""The ORT custom-op library and the torch-free opbridge_ort package."""

from __future__ import annotations

import subprocess
import sys
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
        "from ort_smoke import my_add_model\n"
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
        from ort_smoke import my_add_model
    finally:
        sys.path.remove(str(TESTS))
    session = onnxruntime.InferenceSession(my_add_model(np.float64, [3], [1]), options)
    (c,) = session.run(None, {"A": np.arange(3.0), "B": np.ones(1)})
    np.testing.assert_array_equal(c, [1.0, 3.0, 5.0])


def test_inference_session_accepts_path_bytes_and_proto(tmp_path):
    import onnx

    sys.path.insert(0, str(TESTS))
    try:
        from ort_smoke import my_add_model
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
def test_intra_op_threads(threads):
    sys.path.insert(0, str(TESTS))
    try:
        from ort_smoke import my_add_model
    finally:
        sys.path.remove(str(TESTS))
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = opbridge_ort.InferenceSession(my_add_model(np.float32, [None, None], [None]), options)
    a = np.random.default_rng(0).standard_normal((7, 300_001)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(300_001).astype(np.float32)
    (c,) = session.run(None, {"A": a, "B": b})
    np.testing.assert_array_equal(c, 2 * a + b)
