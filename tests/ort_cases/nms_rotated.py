"""ORT smoke cases of opbridge::NmsRotated and mmdeploy::NMSRotated (the node mmdeploy's exporter writes for
mmrotate's detectors, built here as its symbolic builds it): mmcv's published boxes, mmdeploy's test inputs,
labels, empty inputs, bad shapes."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ._common import DTYPES, expect_error, one_node_model, session

# mmcv's tests/test_ops/test_nms_rotated.py: (cx, cy, w, h, angle, score), labels; kept [3, 1, 0] at IoU 0.5.
BOXES = [
    [6.0, 3.0, 8.0, 7.0, 0.5, 0.7],
    [3.0, 6.0, 9.0, 11.0, 0.6, 0.8],
    [3.0, 7.0, 10.0, 12.0, 0.3, 0.5],
    [1.0, 4.0, 13.0, 7.0, 0.6, 0.9],
]
LABELS = [1, 0, 1, 0]


def nms_model(dtype=np.float32, labels=False, **attributes) -> bytes:
    elem = DTYPES[dtype]
    inputs = ["boxes", "scores"] + (["labels"] if labels else [])
    types = {"boxes": (elem, None), "scores": (elem, None), "labels": (TensorProto.INT64, None)}
    return one_node_model(
        helper.make_node("NmsRotated", inputs, ["keep"], domain="opbridge", **attributes),
        [helper.make_tensor_value_info(n, *types[n]) for n in inputs],
        [helper.make_tensor_value_info("keep", TensorProto.INT64, None)],
    )


def mmdeploy_model(dtype=np.float32, **attributes) -> bytes:
    """As mmdeploy's ONNXNMSRotatedOp.symbolic: NMSRotated(boxes [B, N, 5], scores [B, C, N]) -> [K, 3]."""
    elem = DTYPES[dtype]
    return one_node_model(
        helper.make_node("NMSRotated", ["boxes", "scores"], ["keep_inds"], domain="mmdeploy", **attributes),
        [
            helper.make_tensor_value_info("boxes", elem, ["b", "n", 5]),
            helper.make_tensor_value_info("scores", elem, ["b", "c", "n"]),
        ],
        [helper.make_tensor_value_info("keep_inds", TensorProto.INT64, None)],
        domains=("mmdeploy",),
    )


def check_published_values(library: str) -> None:
    for dtype in (np.float32, np.float64):
        boxes = np.array(BOXES, dtype)
        feeds = {"boxes": boxes[:, :5], "scores": boxes[:, 5]}
        (keep,) = session(library, nms_model(dtype, iou_threshold=0.5)).run(None, feeds)
        assert keep.tolist() == [3, 1, 0], keep
        flipped = {"boxes": boxes[:, :5] * np.array([1, 1, 1, 1, -1], dtype), "scores": boxes[:, 5]}
        (keep,) = session(library, nms_model(dtype, iou_threshold=0.5, clockwise=0)).run(None, flipped)
        assert keep.tolist() == [3, 1, 0], keep
        # One NMS per label: box 2 (label 1) is no longer suppressed by box 1 (label 0), as mmcv's batched_nms.
        (keep,) = session(library, nms_model(dtype, labels=True, iou_threshold=0.5)).run(
            None, {**feeds, "labels": np.array(LABELS, np.int64)}
        )
        assert keep.tolist() == [3, 1, 0, 2], keep
        (keep,) = session(library, nms_model(dtype, iou_threshold=0.5)).run(
            None, {"boxes": np.zeros((0, 5), dtype), "scores": np.zeros(0, dtype)}
        )
        assert keep.shape == (0,)


def check_mmdeploy_node(library: str) -> None:
    """mmdeploy's tests/test_ops/test_ops.py::test_nms_rotated inputs; rows (batch, class, box)."""
    boxes = np.array([[[60, 75, 20, 50, 0], [65, 80, 10, 40, 0], [30, 30, 40, 40, 0]]] * 2, np.float32)
    scores = np.array(
        [
            [[0.5, 0.1, 0.1], [0.1, 0.6, 0.1], [0.1, 0.1, 0.7], [0.1, 0.1, 0.1]],
            [[0.1, 0.1, 0.1], [0.7, 0.1, 0.1], [0.1, 0.6, 0.1], [0.1, 0.1, 0.5]],
        ],
        np.float32,
    )
    expected = {
        0.0: [
            [0, 0, 0],
            [0, 0, 2],
            [0, 1, 1],
            [0, 1, 2],
            [0, 2, 2],
            [0, 2, 0],
            [0, 3, 0],
            [0, 3, 2],
            [1, 0, 0],
            [1, 0, 2],
            [1, 1, 0],
            [1, 1, 2],
            [1, 2, 1],
            [1, 2, 2],
            [1, 3, 2],
            [1, 3, 0],
        ],
        0.1: [[0, 0, 0], [0, 1, 1], [0, 2, 2], [1, 1, 0], [1, 2, 1], [1, 3, 2]],
    }
    for iou_threshold in (0.1, 0.3):
        for score_threshold, rows in expected.items():
            sess = session(library, mmdeploy_model(iou_threshold=iou_threshold, score_threshold=score_threshold), 2)
            (out,) = sess.run(None, {"boxes": boxes, "scores": scores})
            assert out.tolist() == rows, (iou_threshold, score_threshold, out.tolist())
    # IoU 0.4 between boxes 0 and 1: suppressed only above the threshold (> 0.3), not at 0.5.
    (out,) = session(library, mmdeploy_model(iou_threshold=0.5, score_threshold=0.0)).run(
        None, {"boxes": boxes[:1], "scores": np.array([[[0.9, 0.8, 0.1]]], np.float32)}
    )
    assert out.tolist() == [[0, 0, 0], [0, 0, 1], [0, 0, 2]], out.tolist()
    expect_error(
        lambda: session(library, mmdeploy_model(iou_threshold=0.5, score_threshold=0.0)).run(
            None, {"boxes": boxes, "scores": scores[:, :, :2]}
        ),
        "mmdeploy::NMSRotated",
        "input scores (index 1)",
    )


def check_bad_input(library: str) -> None:
    sess = session(library, nms_model(iou_threshold=0.5))
    expect_error(
        lambda: sess.run(None, {"boxes": np.ones((3, 5), np.float32), "scores": np.ones(2, np.float32)}),
        "opbridge::NmsRotated",
        "scores must have shape [N]",
        "N = boxes.shape[0] = 3",
    )
    expect_error(lambda: session(library, nms_model(iou_threshold=1)), "attribute 'iou_threshold' must be a float")


CHECKS = [check_published_values, check_mmdeploy_node, check_bad_input]
