"""ORT smoke cases of opbridge::RoiAlignRotated, mmcv::MMCVRoIAlignRotated and mmdeploy::MMCVRoIAlignRotated
(the nodes mmcv's and mmdeploy's symbolics write, with their attributes): mmcv's published table, mmdeploy's test
inputs, non-square outputs, rois of other batch items, and bad rois, shapes and attributes."""

from __future__ import annotations

import math

import numpy as np
from onnx import helper

from ._common import DTYPES, expect_error, one_node_model, session

MAP = [[1.0, 2.0, 5.0, 6.0], [3.0, 4.0, 7.0, 8.0], [9.0, 10.0, 13.0, 14.0], [11.0, 12.0, 15.0, 16.0]]
# mmcv's tests/test_ops/test_roi_align_rotated.py: (input, roi, output) at (2, 2), scale 1, ratio 2, aligned.
PUBLISHED = [
    ([[[[1.0, 2.0], [3.0, 4.0]]]], [0.0, 0.5, 0.5, 1.0, 1.0, 0.0], [[[[1.0, 1.25], [1.5, 1.75]]]]),
    ([[[[1.0, 2.0], [3.0, 4.0]]]], [0.0, 0.5, 0.5, 1.0, 1.0, math.pi / 2], [[[[1.5, 1.0], [1.75, 1.25]]]]),
    (
        [[[[1.0, 2.0], [3.0, 4.0]], [[4.0, 3.0], [2.0, 1.0]]]],
        [0.0, 0.5, 0.5, 1.0, 1.0, 0.0],
        [[[[1.0, 1.25], [1.5, 1.75]], [[4.0, 3.75], [3.5, 3.25]]]],
    ),
    ([[MAP]], [0.0, 1.5, 1.5, 3.0, 3.0, 0.0], [[[[1.9375, 4.75], [7.5625, 10.375]]]]),
    ([[MAP]], [0.0, 1.5, 1.5, 3.0, 3.0, math.pi / 2], [[[[7.5625, 1.9375], [10.375, 4.75]]]]),
]
NODES = (("RoiAlignRotated", "opbridge"), ("MMCVRoIAlignRotated", "mmcv"), ("MMCVRoIAlignRotated", "mmdeploy"))


def roi_model(dtype=np.float32, op_type="RoiAlignRotated", domain="opbridge", **attributes) -> bytes:
    elem = DTYPES[dtype]
    return one_node_model(
        helper.make_node(op_type, ["input", "rois"], ["output"], domain=domain, **attributes),
        [helper.make_tensor_value_info("input", elem, None), helper.make_tensor_value_info("rois", elem, None)],
        [helper.make_tensor_value_info("output", elem, None)],
        domains=(domain,),
    )


def as_symbolic(output_height, output_width, spatial_scale, sampling_ratio, aligned, clockwise) -> dict:
    """The attributes as mmcv's and mmdeploy's symbolics write them (ints for the flags, a float scale)."""
    return {
        "output_height": output_height,
        "output_width": output_width,
        "spatial_scale": float(spatial_scale),
        "sampling_ratio": sampling_ratio,
        "aligned": int(aligned),
        "clockwise": int(clockwise),
    }


def check_published_values(library: str) -> None:
    for op_type, domain in NODES:
        for dtype in (np.float32, np.float64):
            sess = session(library, roi_model(dtype, op_type, domain, **as_symbolic(2, 2, 1.0, 2, True, False)))
            for x, roi, expected in PUBLISHED:
                (out,) = sess.run(None, {"input": np.array(x, dtype), "rois": np.array([roi], dtype)})
                np.testing.assert_allclose(out, expected, atol=1e-6)
    # mmdeploy's test_roi_align_rotated at (4, 4), scale 2, ratio 4, and a non-square output (mmcv's own symbolic
    # writes output_width = output_height; the node itself honours both).
    x, rois = np.array([[[[1.0, 2.0], [3.0, 4.0]]]], np.float32), np.array([[0.0, 0.5, 0.5, 1.0, 1.0, 0.0]], np.float32)
    (out,) = session(library, roi_model(**as_symbolic(4, 4, 2.0, 4, True, False))).run(None, {"input": x, "rois": rois})
    np.testing.assert_allclose(
        out[0, 0],
        [[1.0, 1.25, 1.75, 2.0], [1.5, 1.75, 2.25, 2.5], [2.5, 2.75, 3.25, 3.5], [3.0, 3.25, 3.75, 4.0]],
        atol=1e-6,
    )
    (out,) = session(library, roi_model(**as_symbolic(1, 2, 1.0, 2, True, False))).run(None, {"input": x, "rois": rois})
    np.testing.assert_allclose(out[0, 0], [[1.25, 1.5]], atol=1e-6)
    # The legacy mode (aligned=0) with an adaptive grid, a roi at 60 degrees.
    (out,) = session(library, roi_model(**as_symbolic(2, 2, 1.0, 0, False, False))).run(
        None, {"input": np.array([[MAP]], np.float32), "rois": np.array([[0, 1.5, 1.5, 3, 3, math.pi / 3]], np.float32)}
    )
    np.testing.assert_allclose(out[0, 0], [[7.845011, 3.789183], [13.210817, 9.154989]], atol=1e-5)


def check_batches_and_empty(library: str) -> None:
    sess = session(library, roi_model(**as_symbolic(2, 2, 1.0, 2, True, False)), 2)
    x = np.stack([np.array([[MAP]], np.float32)[0], 2 * np.array([[MAP]], np.float32)[0]])  # [2, 1, 4, 4]
    rois = np.array([[1, 1.5, 1.5, 3, 3, 0], [0, 1.5, 1.5, 3, 3, 0]], np.float32)
    (out,) = sess.run(None, {"input": x, "rois": rois})
    np.testing.assert_allclose(out[0], 2 * out[1], atol=1e-6)
    (out,) = sess.run(None, {"input": x, "rois": np.zeros((0, 6), np.float32)})
    assert out.shape == (0, 1, 2, 2)


def check_bad_input(library: str) -> None:
    for op_type, domain in NODES:
        sess = session(library, roi_model(np.float32, op_type, domain, **as_symbolic(2, 2, 1.0, 2, True, False)))
        x = np.ones((2, 1, 4, 4), np.float32)
        for index in (2.0, -1.0, 0.5, float("nan")):
            expect_error(
                lambda i=index, sess=sess, x=x: sess.run(
                    None, {"input": x, "rois": np.array([[i, 1, 1, 2, 2, 0]], np.float32)}
                ),
                f"{domain}::{op_type}",
                "batch index",
                "[0, 2)",
            )
        expect_error(
            lambda s=sess, x=x: s.run(None, {"input": x, "rois": np.ones((1, 5), np.float32)}),
            "input rois (index 1)",
            "[rois, 6]",
        )
        expect_error(
            lambda s=sess: s.run(None, {"input": np.ones((1, 4, 4), np.float32), "rois": np.ones((1, 6), np.float32)}),
            "4-D",
        )
    bad_size = session(library, roi_model(**as_symbolic(0, 2, 1.0, 2, True, False)))
    expect_error(
        lambda: bad_size.run(None, {"input": np.ones((1, 1, 4, 4), np.float32), "rois": np.zeros((1, 6), np.float32)}),
        "output size",
    )
    huge = session(library, roi_model(**as_symbolic(2, 2, 1.0, 0, True, False)))
    expect_error(
        lambda: huge.run(
            None, {"input": np.ones((1, 1, 4, 4), np.float32), "rois": np.array([[0, 1, 1, 1e9, 1e9, 0]], np.float32)}
        ),
        "sampling_ratio > 0",
    )
    expect_error(
        lambda: session(library, roi_model(**{**as_symbolic(2, 2, 1.0, 2, True, False), "aligned": 2})),
        "attribute 'aligned' must be 0 or 1",
    )


CHECKS = [check_published_values, check_batches_and_empty, check_bad_input]
