"""ORT smoke cases of opbridge::BoxIouRotated: mmcv's published IoU / IoF tables, both angle conventions,
aligned pairs, empty inputs, and bad shapes and attributes."""

from __future__ import annotations

import numpy as np
from onnx import helper

from ._common import DTYPES, expect_error, one_node_model, session

# mmcv's tests/test_ops/test_box_iou_rotated.py: inputs and the expected values (4 decimals, atol 1e-4).
BOXES1 = [[1.0, 1.0, 3.0, 4.0, 0.5], [2.0, 2.0, 3.0, 4.0, 0.6], [7.0, 7.0, 8.0, 8.0, 0.4]]
BOXES2 = [[0.0, 2.0, 2.0, 5.0, 0.3], [2.0, 1.0, 3.0, 3.0, 0.5], [5.0, 5.0, 6.0, 7.0, 0.4]]
IOUS = [[0.3708, 0.4351, 0.0000], [0.1104, 0.4487, 0.0424], [0.0000, 0.0000, 0.3622]]
IOFS = [[0.4959, 0.5306, 0.0000], [0.1823, 0.5420, 0.1832], [0.0000, 0.0000, 0.4404]]


def iou_model(dtype=np.float32, **attributes) -> bytes:
    elem = DTYPES[dtype]
    return one_node_model(
        helper.make_node("BoxIouRotated", ["boxes1", "boxes2"], ["overlaps"], domain="opbridge", **attributes),
        [helper.make_tensor_value_info(n, elem, None) for n in ("boxes1", "boxes2")],
        [helper.make_tensor_value_info("overlaps", elem, None)],
    )


def check_published_values(library: str) -> None:
    for dtype in (np.float32, np.float64):
        b1, b2 = np.array(BOXES1, dtype), np.array(BOXES2, dtype)
        flip = np.array([1, 1, 1, 1, -1], dtype)
        flipped1, flipped2 = b1 * flip, b2 * flip
        for mode, table in ((0, IOUS), (1, IOFS)):
            for clockwise, (x, y) in ((1, (b1, b2)), (0, (flipped1, flipped2))):
                (full,) = session(library, iou_model(dtype, mode=mode, clockwise=clockwise)).run(
                    None, {"boxes1": x, "boxes2": y}
                )
                np.testing.assert_allclose(full, table, atol=1e-4)
                (pairs,) = session(library, iou_model(dtype, mode=mode, aligned=1, clockwise=clockwise), 2).run(
                    None, {"boxes1": x, "boxes2": y}
                )
                np.testing.assert_allclose(pairs, np.diag(table), atol=1e-4)


def check_empty_and_degenerate(library: str) -> None:
    sess = session(library, iou_model())
    (out,) = sess.run(None, {"boxes1": np.zeros((0, 5), np.float32), "boxes2": np.ones((3, 5), np.float32)})
    assert out.shape == (0, 3)
    same = np.array([[4.0, 5.0, 3.0, 2.0, 0.3]], np.float32)
    (out,) = sess.run(None, {"boxes1": same, "boxes2": same})
    np.testing.assert_allclose(out, [[1.0]], atol=1e-6)
    zero = np.array([[4.0, 5.0, 0.0, 2.0, 0.3]], np.float32)
    (out,) = sess.run(None, {"boxes1": zero, "boxes2": same})
    assert out[0, 0] == 0.0
    (out,) = sess.run(None, {"boxes1": np.array([[np.nan, 0, 1, 1, 0]], np.float32), "boxes2": same})
    assert np.isnan(out[0, 0])


def check_bad_input(library: str) -> None:
    sess = session(library, iou_model())
    expect_error(
        lambda: sess.run(None, {"boxes1": np.ones((2, 4), np.float32), "boxes2": np.ones((2, 5), np.float32)}),
        "opbridge::BoxIouRotated",
        "input boxes1 (index 0)",
        "[boxes, 5]",
        "[2, 4]",
    )
    aligned = session(library, iou_model(aligned=1))
    expect_error(
        lambda: aligned.run(None, {"boxes1": np.ones((2, 5), np.float32), "boxes2": np.ones((3, 5), np.float32)}),
        "aligned",
        "2 and 3",
    )
    expect_error(
        lambda: session(library, iou_model(mode=2)).run(
            None, {"boxes1": np.ones((1, 5), np.float32), "boxes2": np.ones((1, 5), np.float32)}
        ),
        "mode must be 0 (iou) or 1 (iof)",
    )
    expect_error(lambda: session(library, iou_model(clockwise=3)), "attribute 'clockwise' must be 0 or 1")
    expect_error(lambda: session(library, iou_model(mode=0.5)), "attribute 'mode' must be an integer")


CHECKS = [check_published_values, check_empty_and_degenerate, check_bad_input]
