"""ORT smoke cases of mmdeploy::NMSMatch (the node mmdeploy's multiclass_nms_match writes: boxes [B, N, 4],
scores [B, C, N], and the two thresholds as one-element float inputs): mmdeploy's published test inputs against
the rows mmdeploy's own ORT kernel (1.3.1) returns for them, its edge cases (IoU and score exactly at the
thresholds, chains, ties), a numpy reference written from the definition on random clusters, and bad shapes."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ._common import DTYPES, expect_error, one_node_model, session

# mmdeploy's tests/test_ops/test_nms_match_small.py: one batch (the test repeats it), scores [boxes, classes].
BOXES = [[291.1746, 316.2263, 343.5029, 347.7312], [288.4846, 315.0447, 343.7267, 346.5630],
         [288.5307, 318.1989, 341.6425, 349.7222], [918.9102, 83.7463, 933.3920, 164.9041],
         [895.5786, 78.2361, 907.8049, 172.0883], [292.5816, 316.5563, 340.3462, 352.9989],
         [609.4592, 83.5447, 631.2532, 144.0749], [917.7308, 85.5870, 933.2839, 168.4530],
         [895.5138, 79.3596, 908.2865, 171.0418], [291.4747, 318.6987, 347.1208, 349.5754]]  # fmt: skip
SCORES = [[0.9577, 0.9745, 0.3030, 0.6589, 0.2742], [0.1618, 0.7963, 0.5124, 0.6964, 0.6850],
          [0.8425, 0.4843, 0.9489, 0.8068, 0.7340], [0.7337, 0.4340, 0.9923, 0.0704, 0.4506],
          [0.3090, 0.5606, 0.6939, 0.3764, 0.6920], [0.0044, 0.7986, 0.2221, 0.2782, 0.4378],
          [0.7293, 0.2735, 0.8381, 0.0264, 0.6278], [0.7144, 0.1066, 0.4125, 0.4041, 0.8819],
          [0.4963, 0.7891, 0.6908, 0.1499, 0.5584], [0.4385, 0.6035, 0.0508, 0.0662, 0.5938]]  # fmt: skip
# Rows (class, kept, suppressed) of batch 0 from mmdeploy 1.3.1's own ONNX Runtime kernel, thresholds 0.1, 0.1.
PUBLISHED_ROWS = [[0, 0, 2], [0, 0, 9], [0, 0, 1], [0, 0, 5], [0, 3, 7], [0, 8, 4],
                  [1, 0, 5], [1, 0, 1], [1, 0, 9], [1, 0, 2], [1, 8, 4], [1, 3, 7],
                  [2, 3, 7], [2, 2, 1], [2, 2, 0], [2, 2, 5], [2, 2, 9], [2, 4, 8],
                  [3, 2, 1], [3, 2, 0], [3, 2, 5], [3, 2, 9], [3, 7, 3], [3, 4, 8],
                  [4, 7, 3], [4, 2, 1], [4, 2, 9], [4, 2, 5], [4, 2, 0], [4, 4, 8]]  # fmt: skip


def nms_match_model(dtype=np.float32) -> bytes:
    elem = DTYPES[dtype]
    names = ["boxes", "scores", "iou_threshold", "score_threshold"]
    return one_node_model(
        helper.make_node("NMSMatch", names, ["matches"], domain="mmdeploy"),
        [helper.make_tensor_value_info(n, elem, None) for n in names],
        [helper.make_tensor_value_info("matches", TensorProto.INT64, None)],
        domains=("mmdeploy",),
    )


def run(library, boxes, scores, iou_threshold, score_threshold, dtype=np.float32, threads=1):
    feeds = {"boxes": np.asarray(boxes, dtype), "scores": np.asarray(scores, dtype),
             "iou_threshold": np.array([iou_threshold], dtype),
             "score_threshold": np.array([score_threshold], dtype)}  # fmt: skip
    return session(library, nms_match_model(dtype), threads).run(None, feeds)[0]


def nms_match_reference(boxes, scores, iou_threshold, score_threshold):
    """Rows (batch, class, kept, suppressed), written from the definition (mmdeploy's kernel)."""
    boxes, scores = np.asarray(boxes), np.asarray(scores)
    rows = []
    for b in range(boxes.shape[0]):
        x = boxes[b]  # intersection and union in the boxes' type, the 1e-10 and the division in double
        area = (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])
        for c in range(scores.shape[1]):
            s = scores[b, c]
            order = sorted(range(len(s)), key=lambda i: (not np.isnan(s[i]), -s[i] if not np.isnan(s[i]) else 0.0))
            alive = {i: True for i in order}
            for r, i in enumerate(order):
                if not alive[i]:
                    continue
                for j in order[r + 1 :]:
                    if not alive[j]:
                        continue
                    zero = x.dtype.type(0)
                    w = max(zero, min(x[i, 2], x[j, 2]) - max(x[i, 0], x[j, 0]))
                    h = max(zero, min(x[i, 3], x[j, 3]) - max(x[i, 1], x[j, 1]))
                    inter = w * h
                    overlap = x.dtype.type(float(inter) / (float(area[i] + area[j] - inter) + 1e-10))
                    if overlap >= iou_threshold:
                        alive[j] = False
                        if s[i] > score_threshold:
                            rows.append([b, c, i, j])
    return np.array(rows, np.int64).reshape(-1, 4)


def check_published_values(library: str) -> None:
    boxes = np.array([BOXES, BOXES])
    scores = np.array([SCORES, SCORES]).transpose(0, 2, 1)  # [batch, classes, boxes], as the test permutes
    want = [[0, *row] for row in PUBLISHED_ROWS] + [[1, *row] for row in PUBLISHED_ROWS]
    for dtype in (np.float32, np.float64):
        out = run(library, boxes, scores, 0.1, 0.1, dtype, threads=2)
        assert out.dtype == np.int64 and out.tolist() == want, out.tolist()


def check_edge_cases(library: str) -> None:
    at_half = [[[0, 0, 2, 1], [0, 0, 1, 1]]]  # IoU exactly 0.5
    assert run(library, at_half, [[[0.9, 0.8]]], 0.5, 0.0).tolist() == [[0, 0, 0, 1]]  # >= suppresses
    assert run(library, at_half, [[[0.9, 0.8]]], 0.5000001, 0.0).shape == (0, 4)
    assert run(library, at_half, [[[0.5, 0.4]]], 0.5, 0.5).shape == (0, 4)  # a keeper at the score threshold
    assert run(library, at_half, [[[0.5, 0.4]]], 0.5, 0.49).tolist() == [[0, 0, 0, 1]]
    chain = [[[0, 0, 5, 1], [3, 0, 8, 1], [6, 0, 11, 1]]]  # A-B and B-C IoU 0.25, A-C 0
    assert run(library, chain, [[[0.9, 0.8, 0.7]]], 0.2, 0.0).tolist() == [[0, 0, 0, 1]]
    same = [[[0, 0, 1, 1]] * 3]
    assert run(library, same, [[[0.5, 0.5, 0.5]]], 0.5, 0.0).tolist() == [[0, 0, 0, 1], [0, 0, 0, 2]]
    pair = [[[0, 0, 10, 10], [1, 1, 10, 10.5]], [[0, 0, 10, 10], [1, 1, 10, 10.5]]]
    scores = [[[0.3, 0.6], [0.9, 0.1]], [[0.3, 0.6], [0.9, 0.1]]]
    assert run(library, pair, scores, 0.5, 0.05).tolist() == [[0, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0],
                                                              [1, 1, 0, 1]]  # fmt: skip
    assert run(library, np.zeros((1, 0, 4)), np.zeros((1, 3, 0)), 0.5, 0.0).shape == (0, 4)


def check_against_reference(library: str) -> None:
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        centers, sizes = rng.uniform(0, 40, (2, 30, 2)), rng.uniform(2, 12, (2, 30, 2))
        boxes = np.concatenate([centers - sizes / 2, centers + sizes / 2], axis=2).astype(dtype)
        scores = rng.random((2, 3, 30)).astype(dtype)
        for iou_threshold, score_threshold in ((0.1, 0.05), (0.4, 0.5), (0.7, 0.0)):
            out = run(library, boxes, scores, iou_threshold, score_threshold, dtype, threads=2)
            want = nms_match_reference(boxes, scores, dtype(iou_threshold), dtype(score_threshold))
            np.testing.assert_array_equal(out, want)


def check_bad_input(library: str) -> None:
    sess = session(library, nms_match_model())
    good = {"boxes": np.ones((1, 3, 4), np.float32), "scores": np.ones((1, 2, 3), np.float32),
            "iou_threshold": np.array([0.5], np.float32), "score_threshold": np.array([0.1], np.float32)}  # fmt: skip
    changes = [
        ({"boxes": np.ones((1, 3, 5), np.float32)}, "input boxes (index 0)"),
        ({"scores": np.ones((1, 2, 4), np.float32)}, "[batch, classes, boxes] = [1, classes, 3]"),
        ({"iou_threshold": np.zeros(0, np.float32)}, "iou_threshold (index 2) must hold one"),
        ({"score_threshold": np.zeros((0, 1), np.float32)}, "score_threshold (index 3)"),
    ]
    for change, fragment in changes:
        expect_error(lambda c=change: sess.run(None, {**good, **c}), "mmdeploy::NMSMatch", fragment)


CHECKS = [check_published_values, check_edge_cases, check_against_reference, check_bad_input]
