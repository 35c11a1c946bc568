"""ORT smoke cases of opbridge::MyAdd: values against numpy, bad shapes, dtypes and arity."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ._common import DTYPES, expect_error, one_node_model, session


def my_add_model(dtype=np.float32, a_shape=None, b_shape=None, inputs=("A", "B"), opset=17) -> bytes:
    """A one-node model C = opbridge::MyAdd(A, B); shapes may use None or names for dynamic dims."""
    elem = DTYPES[dtype]
    return one_node_model(
        helper.make_node("MyAdd", list(inputs), ["C"], domain="opbridge"),
        [helper.make_tensor_value_info(n, elem, shape) for n, shape in (("A", a_shape), ("B", b_shape)) if n in inputs],
        [helper.make_tensor_value_info("C", elem, None)],
        opset,
    )


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
    model = one_node_model(
        helper.make_node("MyAdd", ["A", "B"], ["C"], domain="opbridge"),
        [
            helper.make_tensor_value_info("A", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("B", TensorProto.DOUBLE, [2]),
        ],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, None)],
    )
    expect_error(lambda: session(library, model), "MyAdd")


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


CHECKS = [check_values, check_bad_shapes, check_bad_dtype, check_bad_arity, check_registration_is_repeatable]
