"""ORT smoke cases of mmcv::MMCVCARAFE and mmcv::MMCVCARAFENaive (the nodes mmcv's CARAFE symbolics write for
mmdetection's CARAFE FPN: ints kernel_size and group_size, float scale_factor): kernels 1 to 5, scales 1 to 3,
groups, against a numpy reference written from the definition, a hand-worked case, and bad shapes and attributes.
tests/test_openmmlab.py also checks it against a torch unfold formulation."""

from __future__ import annotations

import numpy as np
from onnx import helper

from ._common import DTYPES, expect_error, one_node_model, session

NODES = ("MMCVCARAFE", "MMCVCARAFENaive")


def carafe_model(op_type="MMCVCARAFE", dtype=np.float32, **attributes) -> bytes:
    elem = DTYPES[dtype]
    return one_node_model(
        helper.make_node(op_type, ["features", "masks"], ["output"], domain="mmcv", **attributes),
        [helper.make_tensor_value_info("features", elem, None), helper.make_tensor_value_info("masks", elem, None)],
        [helper.make_tensor_value_info("output", elem, None)],
        domains=("mmcv",),
    )


def as_symbolic(kernel_size: int, group_size: int, scale_factor: int) -> dict:
    return {"kernel_size": kernel_size, "group_size": group_size, "scale_factor": float(scale_factor)}


def carafe_reference(features, masks, kernel_size, group_size, scale):
    """Each output pixel a k x k window of the input around its source pixel, weighted by its group's mask."""
    features, masks = np.asarray(features, np.float64), np.asarray(masks, np.float64)
    n, c, h, w = features.shape
    r = (kernel_size - 1) // 2
    padded = np.zeros((n, c, h + 2 * r, w + 2 * r))
    padded[:, :, r : r + h, r : r + w] = features
    ys, xs = np.arange(h * scale) // scale, np.arange(w * scale) // scale
    out = np.zeros((n, c, h * scale, w * scale))
    groups = masks.reshape(n, group_size, kernel_size * kernel_size, h * scale, w * scale)
    for i in range(kernel_size):
        for j in range(kernel_size):
            window = padded[:, :, ys[:, None] + i, xs[None, :] + j]  # [n, c, H s, W s]
            weight = np.repeat(groups[:, :, i * kernel_size + j], c // group_size, axis=1)
            out += window * weight
    return out


def check_against_reference(library: str) -> None:
    rng = np.random.default_rng(0)
    for dtype, tolerance in ((np.float32, 1e-5), (np.float64, 1e-12)):
        for kernel, group, scale in ((5, 1, 2), (3, 2, 3), (1, 1, 1), (3, 4, 2)):
            x = rng.standard_normal((2, 8, 5, 6)).astype(dtype)
            masks = rng.random((2, group * kernel * kernel, 5 * scale, 6 * scale)).astype(dtype)
            for op_type in NODES:
                (out,) = session(library, carafe_model(op_type, dtype, **as_symbolic(kernel, group, scale)), 2).run(
                    None, {"features": x, "masks": masks}
                )
                want = carafe_reference(x, masks, kernel, group, scale)
                np.testing.assert_allclose(out, want, rtol=tolerance, atol=tolerance, err_msg=op_type)


def check_hand_values(library: str) -> None:
    """A 2x2 map, kernel 3, scale 2, every mask weight 1: each output pixel sums the 3x3 window (inside the map)
    around its source pixel, i.e. the whole map (10) everywhere."""
    x = np.array([[[[1.0, 2.0], [3.0, 4.0]]]], np.float32)
    (out,) = session(library, carafe_model(**as_symbolic(3, 1, 2))).run(
        None, {"features": x, "masks": np.ones((1, 9, 4, 4), np.float32)}
    )
    np.testing.assert_array_equal(out, np.full((1, 1, 4, 4), 10.0))
    # Only the centre tap (index 4): nearest upsampling.
    masks = np.zeros((1, 9, 4, 4), np.float32)
    masks[:, 4] = 1
    (out,) = session(library, carafe_model(**as_symbolic(3, 1, 2))).run(None, {"features": x, "masks": masks})
    np.testing.assert_array_equal(out[0, 0], np.kron(x[0, 0], np.ones((2, 2))))


def check_bad_input(library: str) -> None:
    sess = session(library, carafe_model(**as_symbolic(3, 1, 2)))
    x = np.ones((1, 2, 3, 3), np.float32)
    expect_error(lambda: sess.run(None, {"features": x, "masks": np.ones((1, 9, 6, 5), np.float32)}),
                 "mmcv::MMCVCARAFE", "input masks (index 1)", "[1, 9, 6, 6]")  # fmt: skip
    expect_error(lambda: sess.run(None, {"features": x[0], "masks": np.ones((1, 9, 6, 6), np.float32)}), "4-D")
    bad_attributes = [
        (as_symbolic(2, 1, 2), "'kernel_size' must be an odd"),
        (as_symbolic(3, 3, 2), "'group_size' must be a positive divisor"),
        ({**as_symbolic(3, 1, 2), "scale_factor": 1.5}, "'scale_factor' must be an integer"),
    ]
    for attrs, fragment in bad_attributes:
        bad = session(library, carafe_model(**attrs))
        expect_error(lambda b=bad: b.run(None, {"features": x, "masks": np.ones((1, 9, 6, 6), np.float32)}), fragment)


CHECKS = [check_against_reference, check_hand_values, check_bad_input]
