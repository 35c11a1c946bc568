"""ORT smoke cases of mmcv::NonMaxSuppression and mmcv::SoftNonMaxSuppression (the nodes mmcv's nms and soft_nms
symbolics write: floats iou_threshold, sigma, min_score, ints method and offset): mmcv's published values, the
offset, an IoU exactly at the threshold, numpy references written from the definitions on random clusters, and
bad shapes and attributes. tests/test_openmmlab.py also checks hard NMS against torchvision.ops.nms."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper

from ._common import DTYPES, expect_error, one_node_model, session

# mmcv's tests/test_ops/test_nms.py boxes and scores.
BOXES = [[6.0, 3.0, 8.0, 7.0], [3.0, 6.0, 9.0, 11.0], [3.0, 7.0, 10.0, 12.0], [1.0, 4.0, 13.0, 7.0]]
SCORES = [0.6, 0.9, 0.7, 0.2]
SOFT_PUBLISHED = {  # method -> (dets, inds) at iou_threshold 0.3, sigma 0.5, min_score 0.01
    1: ([[3, 6, 9, 11, 0.9], [6, 3, 8, 7, 0.6], [3, 7, 10, 12, 0.29024392], [1, 4, 13, 7, 0.2]], [1, 0, 2, 3]),
    2: (
        [[3, 6, 9, 11, 0.9], [6, 3, 8, 7, 0.59630775], [3, 7, 10, 12, 0.35275510], [1, 4, 13, 7, 0.18650459]],
        [1, 0, 2, 3],
    ),
    0: ([[3, 6, 9, 11, 0.9], [6, 3, 8, 7, 0.6], [1, 4, 13, 7, 0.2]], [1, 0, 3]),
}


def nms_model(dtype=np.float32, **attributes) -> bytes:
    elem = DTYPES[dtype]
    return one_node_model(
        helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["indices"], domain="mmcv", **attributes),
        [helper.make_tensor_value_info("boxes", elem, None), helper.make_tensor_value_info("scores", elem, None)],
        [helper.make_tensor_value_info("indices", TensorProto.INT64, None)],
        domains=("mmcv",),
    )


def soft_nms_model(dtype=np.float32, **attributes) -> bytes:
    elem = DTYPES[dtype]
    return one_node_model(
        helper.make_node("SoftNonMaxSuppression", ["boxes", "scores"], ["dets", "inds"], domain="mmcv", **attributes),
        [helper.make_tensor_value_info("boxes", elem, None), helper.make_tensor_value_info("scores", elem, None)],
        [helper.make_tensor_value_info("dets", elem, None), helper.make_tensor_value_info("inds", TensorProto.INT64,
                                                                                          None)],
        domains=("mmcv",),
    )  # fmt: skip


def soft_symbolic(iou_threshold=0.3, sigma=0.5, min_score=1e-3, method=1, offset=0) -> dict:
    """The attributes as mmcv's SoftNMSop.symbolic writes them."""
    return {"iou_threshold": float(iou_threshold), "sigma": float(sigma), "min_score": float(min_score),
            "method": int(method), "offset": int(offset)}  # fmt: skip


def iou(a, b, offset):
    area = lambda r: (r[2] - r[0] + offset) * (r[3] - r[1] + offset)  # noqa: E731
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]) + offset)
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]) + offset)
    union = area(a) + area(b) - w * h
    return w * h / union if union != 0 else (math.nan if w * h == 0 else math.copysign(math.inf, w * h))


def nms_reference(boxes, scores, iou_threshold, offset):
    """Greedy NMS: decreasing score (stable, NaN first), suppressed when IoU with a kept box > threshold."""
    boxes, scores = np.asarray(boxes, np.float64).tolist(), np.asarray(scores, np.float64).tolist()
    order = sorted(range(len(scores)), key=lambda i: (not math.isnan(scores[i]), -scores[i] if not
                                                      math.isnan(scores[i]) else 0.0))  # fmt: skip
    keep: list[int] = []
    for i in order:
        if all(not iou(boxes[k], boxes[i], offset) > iou_threshold for k in keep):
            keep.append(i)
    return keep


def soft_nms_reference(boxes, scores, iou_threshold, sigma, min_score, method, offset):
    """Soft NMS as mmcv defines it: pick the highest remaining score (first position on ties), decay the others
    by it (naive / linear at IoU >= threshold, gaussian exp(-IoU^2 / sigma)), drop those below min_score by moving
    the last remaining box into their place."""
    work = [[list(map(float, b)), float(s), i] for i, (b, s) in enumerate(zip(boxes, scores, strict=True))]
    dets, inds, i = [], [], 0
    while i < len(work):
        best = max(range(i, len(work)), key=lambda p: (work[p][1], -p))
        work[i], work[best] = work[best], work[i]
        box, score, index = work[i]
        dets.append([*box, score])
        inds.append(index)
        p = i + 1
        while p < len(work):
            overlap = iou(box, work[p][0], offset)
            if method == 2:
                weight = math.exp(-(overlap * overlap) / sigma)
            else:
                weight = (0.0 if method == 0 else 1.0 - overlap) if overlap >= iou_threshold else 1.0
            work[p][1] *= weight
            if work[p][1] < min_score:
                work[p] = work[-1]
                work.pop()
            else:
                p += 1
        i += 1
    return np.array(dets, np.float64).reshape(-1, 5), inds


def check_published_values(library: str) -> None:
    for dtype in (np.float32, np.float64):
        boxes, scores = np.array(BOXES, dtype), np.array(SCORES, dtype)
        (indices,) = session(library, nms_model(dtype, iou_threshold=0.3, offset=0)).run(
            None, {"boxes": boxes, "scores": scores}
        )
        assert indices.dtype == np.int64 and indices.tolist() == [1, 0, 3], indices
        for method, (want_dets, want_inds) in SOFT_PUBLISHED.items():
            sess = session(library, soft_nms_model(dtype, **soft_symbolic(0.3, 0.5, 0.01, method, 0)))
            dets, inds = sess.run(None, {"boxes": boxes, "scores": scores})
            assert inds.dtype == np.int64 and inds.tolist() == want_inds, (method, inds)
            np.testing.assert_allclose(dets, want_dets, rtol=1e-6, atol=1e-6)


def check_offset_and_threshold(library: str) -> None:
    def run(boxes, scores, **attributes):
        feeds = {"boxes": np.array(boxes, np.float32), "scores": np.array(scores, np.float32)}
        return session(library, nms_model(**attributes)).run(None, feeds)[0].tolist()

    touching = [[0, 0, 1, 1], [1, 0, 2, 1]]  # pixel-inclusive (offset 1), they share a column: IoU 2/6
    assert run(touching, [0.9, 0.8], iou_threshold=0.3, offset=0) == [0, 1]
    assert run(touching, [0.9, 0.8], iou_threshold=0.3, offset=1) == [0]
    assert run([[0, 0, 2, 1], [0, 0, 1, 1]], [0.9, 0.8], iou_threshold=0.5, offset=0) == [0, 1]  # IoU = 0.5: kept
    assert run([[0, 0, 2, 1], [0, 0, 1, 1]], [0.9, 0.8], iou_threshold=0.49, offset=0) == [0]
    assert run(np.zeros((0, 4)), np.zeros(0), iou_threshold=0.5, offset=0) == []

    # soft NMS with offset 1, a higher min_score, and a lone box below min_score (the first pick is kept).
    def soft(boxes, scores, **attributes):
        feeds = {"boxes": np.array(boxes, np.float32), "scores": np.array(scores, np.float32)}
        return session(library, soft_nms_model(**soft_symbolic(**attributes))).run(None, feeds)

    dets, inds = soft(BOXES, SCORES, iou_threshold=0.3, min_score=0.01, offset=1)
    assert inds.tolist() == [1, 0, 2, 3] and abs(dets[2, 4] - 0.25454545) < 1e-6
    dets, inds = soft(BOXES, SCORES, iou_threshold=0.3, min_score=0.5)
    assert inds.tolist() == [1, 0] and dets.shape == (2, 5)
    dets, inds = soft([[0, 0, 1, 1]], [0.001], min_score=0.01)
    assert inds.tolist() == [0] and dets.tolist() == [[0, 0, 1, 1, np.float32(0.001)]]
    dets, inds = soft(np.zeros((0, 4)), np.zeros(0))
    assert dets.shape == (0, 5) and inds.shape == (0,)


def random_clusters(rng, count, rounded=True):
    """Overlapping boxes; `rounded`: whole-pixel boxes and two-digit scores, so that ties and IoUs exactly at a
    threshold occur (float64 only: float32 arithmetic may round such a tie either way)."""
    centers, sizes, scores = rng.uniform(0, 40, (count, 2)), rng.uniform(2, 12, (count, 2)), rng.random(count)
    if rounded:
        centers, sizes, scores = centers.round(0), sizes.round(0), scores.round(2)
    return np.concatenate([centers - sizes / 2, centers + sizes / 2], axis=1), scores


#: The threshold as the float attribute holds it, as a Python float (numpy would compare an IoU with a float32
#: threshold in float32).
F32_0_3 = float(np.float32(0.3))


def check_against_reference(library: str) -> None:
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        for _ in range(4):
            boxes, scores = random_clusters(rng, 40, rounded=dtype == np.float64)
            boxes, scores = boxes.astype(dtype), scores.astype(dtype)
            for offset in (0, 1):
                for threshold in (0.1, 0.45, 0.7):
                    (got,) = session(library, nms_model(dtype, iou_threshold=threshold, offset=offset)).run(
                        None, {"boxes": boxes, "scores": scores}
                    )
                    assert got.tolist() == nms_reference(boxes, scores, float(np.float32(threshold)), offset)
                for method in (0, 1, 2):
                    attrs = soft_symbolic(0.3, 0.5, 0.05, method, offset)
                    dets, inds = session(library, soft_nms_model(dtype, **attrs)).run(
                        None, {"boxes": boxes, "scores": scores}
                    )
                    want_dets, want_inds = soft_nms_reference(boxes, scores, F32_0_3, 0.5, float(np.float32(0.05)),
                                                              method, offset)  # fmt: skip
                    assert inds.tolist() == want_inds, (method, offset)
                    np.testing.assert_allclose(dets, want_dets, rtol=1e-5, atol=1e-6)


def check_bad_input(library: str) -> None:
    sess = session(library, nms_model(iou_threshold=0.5, offset=0))
    expect_error(lambda: sess.run(None, {"boxes": np.ones((3, 5), np.float32), "scores": np.ones(3, np.float32)}),
                 "mmcv::NonMaxSuppression", "input boxes (index 0)", "[N, 4]")  # fmt: skip
    expect_error(lambda: sess.run(None, {"boxes": np.ones((3, 4), np.float32), "scores": np.ones(2, np.float32)}),
                 "input scores (index 1)", "N = boxes.shape[0] = 3")  # fmt: skip
    expect_error(lambda: session(library, nms_model(iou_threshold=0.5, offset=2)), "attribute 'offset' must be 0 or 1")
    expect_error(lambda: session(library, nms_model(offset=0)), "attribute 'iou_threshold'", "required")
    expect_error(lambda: session(library, soft_nms_model(**soft_symbolic(method=3))), "attribute 'method'", "gaussian")
    expect_error(lambda: session(library, soft_nms_model(**soft_symbolic(method=2, sigma=0.0))), "attribute 'sigma'")
    soft = session(library, soft_nms_model(**soft_symbolic()))
    expect_error(lambda: soft.run(None, {"boxes": np.ones((2, 4), np.float32), "scores": np.ones((2, 1), np.float32)}),
                 "mmcv::SoftNonMaxSuppression", "input scores (index 1)")  # fmt: skip


CHECKS = [check_published_values, check_offset_and_threshold, check_against_reference, check_bad_input]
