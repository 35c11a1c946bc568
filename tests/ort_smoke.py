"""Checks of the opbridge ORT custom-op library with nothing but onnxruntime,
onnx and numpy: no torch, no pytest, no opbridge Python package.

    python tests/ort_smoke.py path/to/libopbridge_ort.so

Runs hand-built opbridge::MyAdd models against numpy, and malformed models and
inputs that must fail with an error naming the op, never crash. Used by ctest
(a C++ developer's build), by `nox -s ort_versions` (old and newest ORT) and by
the pytest suite. Prints one line per check and "N passed, N failed".
"""

from __future__ import annotations

import sys
import traceback

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

DTYPES = {
    np.float32: TensorProto.FLOAT,
    np.float64: TensorProto.DOUBLE,
    np.float16: TensorProto.FLOAT16,
    np.int32: TensorProto.INT32,
}


def my_add_model(dtype=np.float32, a_shape=None, b_shape=None, inputs=("A", "B"), opset=17) -> bytes:
    """A one-node model C = opbridge::MyAdd(A, B); shapes may use None or names for dynamic dims."""
    elem = DTYPES[dtype]
    node = helper.make_node("MyAdd", list(inputs), ["C"], domain="opbridge")
    graph = helper.make_graph(
        [node],
        "my_add",
        [
            helper.make_tensor_value_info(name, elem, shape)
            for name, shape in (("A", a_shape), ("B", b_shape))
            if name in inputs
        ],
        [helper.make_tensor_value_info("C", elem, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("opbridge", 1)])
    model.ir_version = 8  # readable by every ORT from 1.16 on
    return model.SerializeToString()


def session(library: str, model: bytes, threads: int = 1) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(library)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def expect_error(call, *fragments: str) -> str:
    try:
        call()
    except Exception as error:  # ORT raises its own exception types per version
        message = str(error)
        missing = [f for f in fragments if f not in message]
        if missing:
            raise AssertionError(f"error message lacks {missing}: {message}") from None
        return message
    raise AssertionError("expected an error, got none")


def check_values(library: str) -> None:
    rng = np.random.default_rng(0)
    cases = [
        ((2, 3), (2, 3)),
        ((4, 1, 5), (3, 1)),
        ((), (7,)),
        ((0, 3), (1, 3)),
        ((1000, 257), (257,)),
        ((65536 * 3 + 5,), ()),
    ]
    for dtype, tolerance in ((np.float32, 1e-6), (np.float64, 1e-12), (np.float16, 1e-3)):
        for a_shape, b_shape in cases:
            a = rng.standard_normal(a_shape).astype(dtype)
            b = rng.standard_normal(b_shape).astype(dtype)
            for threads in (1, 2):
                sess = session(library, my_add_model(dtype, [None] * len(a_shape), [None] * len(b_shape)), threads)
                (c,) = sess.run(None, {"A": a, "B": b})
                expected = 2 * a.astype(np.float64) + b.astype(np.float64)
                assert c.dtype == dtype and c.shape == expected.shape, (c.dtype, c.shape, expected.shape)
                np.testing.assert_allclose(c.astype(np.float64), expected, rtol=tolerance, atol=tolerance)


def check_bad_shapes(library: str) -> None:
    sess = session(library, my_add_model(np.float32, ["n", "m"], ["k"]))
    expect_error(
        lambda: sess.run(None, {"A": np.ones((2, 3), np.float32), "B": np.ones(4, np.float32)}),
        "opbridge::MyAdd",
        "input A (index 0) of shape [2, 3]",
        "input B (index 1) of shape [4]",
        "cannot be broadcast",
    )
    # The session stays usable after an error.
    (c,) = sess.run(None, {"A": np.ones((2, 3), np.float32), "B": np.ones(3, np.float32)})
    assert (c == 3).all()


def check_bad_dtype(library: str) -> None:
    # No int32 kernel: the runtime refuses the model when the session is created.
    expect_error(lambda: session(library, my_add_model(np.int32, [2], [2])), "MyAdd")
    # Mixed dtypes in one model.
    node = helper.make_node("MyAdd", ["A", "B"], ["C"], domain="opbridge")
    graph = helper.make_graph(
        [node],
        "mixed",
        [
            helper.make_tensor_value_info("A", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("B", TensorProto.DOUBLE, [2]),
        ],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)])
    model.ir_version = 8
    expect_error(lambda: session(library, model.SerializeToString()), "MyAdd")


def check_bad_arity(library: str) -> None:
    # Too few, an omitted (empty-named) and too many inputs: refused at load time.
    for inputs in (("A",), ("A", ""), ("A", "B", "A")):
        expect_error(lambda inputs=inputs: session(library, my_add_model(np.float32, [2], [2], inputs=inputs)), "MyAdd")


def check_registration_is_repeatable(library: str) -> None:
    for _ in range(3):
        (c,) = session(library, my_add_model(np.float32, [2], [2])).run(
            None, {"A": np.ones(2, np.float32), "B": np.ones(2, np.float32)}
        )
        assert (c == 3).all()


def check_old_runtime_is_refused(library: str) -> None:
    """Below ORT 1.16 the library must refuse to register, with a message, not crash."""
    expect_error(lambda: session(library, my_add_model(np.float32, [2], [2])), "too old", ">= 1.16")


CHECKS = [check_values, check_bad_shapes, check_bad_dtype, check_bad_arity, check_registration_is_repeatable]


def runtime_version() -> tuple[int, int]:
    major, minor = ort.__version__.split(".")[:2]
    return int(major), int(minor)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    library = argv[1]
    print(f"onnxruntime {ort.__version__}, onnx {onnx.__version__}, library {library}")
    passed = failed = 0
    for check in CHECKS if runtime_version() >= (1, 16) else [check_old_runtime_is_refused]:
        try:
            check(library)
        except Exception:
            failed += 1
            print(f"FAIL {check.__name__}\n{traceback.format_exc()}")
        else:
            passed += 1
            print(f"ok   {check.__name__}")
    if "torch" in sys.modules:
        failed += 1
        print("FAIL torch was imported")
    else:
        print("ok   torch was not imported")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
