"""Fuzz target of mmdeploy::NMSMatch (``ort.mmdeploy.NMSMatch``): 1 or 2 batches of 0 to 25 clustered boxes, 1 to
3 classes, tied, NaN and infinite scores and boxes; thresholds of any value, empty or longer threshold tensors;
wrong shapes, other and mixed dtypes; missing, empty-named and extra inputs. Rows compared exactly unless an IoU
lies within 1e-6 of the threshold. No torch op of opbridge's runs this node."""

from __future__ import annotations

import numpy as np

from ._common import INVALID_ACCEPTED, MATCH, chance, run_one_node

ORT_NODE = "NMSMatch"
ORT_DOMAIN = "mmdeploy"
NAMES = ["boxes", "scores", "iou_threshold", "score_threshold"]
FLOATS = [np.float32, np.float64]


def config(rng, kind: str) -> dict:
    b, n, c = int(rng.integers(1, 3)), int(rng.integers(0, 26)), int(rng.integers(1, 4))
    cfg = {"boxes": [b, n, 4], "scores": [b, c, n], "thresholds": [[1], [1]],
           "values": [float(rng.uniform(0, 1)), float(rng.choice([0.0, 0.05, 0.5]))],
           "dtypes": [FLOATS[int(rng.integers(0, 2))]] * 4, "special": chance(rng, 0.2), "ties": chance(rng, 0.3),
           "inputs": list(NAMES)}  # fmt: skip
    if chance(rng, 0.1):
        cfg[["boxes", "scores"][int(rng.integers(0, 2))]] = [[b, n, 5], [b + 1, c, n], [n, 4], [b, c, n + 1]][
            int(rng.integers(0, 4))
        ]
    if chance(rng, 0.08):
        cfg["thresholds"][int(rng.integers(0, 2))] = [[0], [2], [1, 1], []][int(rng.integers(0, 4))]
    if chance(rng, 0.08):
        cfg["values"][int(rng.integers(0, 2))] = float(rng.choice([np.nan, -1.0, 2.0, np.inf]))
    if chance(rng, 0.08):
        cfg["dtypes"][int(rng.integers(0, 4))] = [np.float16, np.int64, np.float64][int(rng.integers(0, 3))]
    if chance(rng, 0.05):
        cfg["inputs"] = [NAMES[:3], [*NAMES[:3], ""], [*NAMES, "boxes"]][int(rng.integers(0, 3))]
    return cfg


def run_ort(session, rng, cfg):
    from ort_cases.nms_match import nms_match_reference

    from .nms import near_threshold

    shape = cfg["boxes"]
    if len(shape) == 3 and shape[2] == 4:
        centers, sizes = rng.uniform(0, 30, (*shape[:2], 2)), rng.uniform(-1, 12, (*shape[:2], 2))
        boxes = np.concatenate([centers - sizes / 2, centers + sizes / 2], axis=2)
    else:
        boxes = rng.standard_normal(shape)
    scores = rng.random(cfg["scores"])
    if cfg["ties"]:
        boxes, scores = boxes.round(0), scores.round(1)
    if cfg["special"] and scores.size:
        scores.reshape(-1)[rng.integers(0, scores.size, max(1, scores.size // 8))] = np.nan
    arrays = {"boxes": boxes.astype(cfg["dtypes"][0]), "scores": scores.astype(cfg["dtypes"][1])}
    for name, shape, value, dtype in zip(NAMES[2:], cfg["thresholds"], cfg["values"], cfg["dtypes"][2:], strict=True):
        arrays[name] = np.full(shape, value).astype(dtype)
    out, refused = run_one_node(session, ORT_NODE, cfg["inputs"], arrays, {}, np.int64, domain=ORT_DOMAIN)
    if refused:
        return refused
    dtypes = {arrays[n].dtype for n in NAMES}
    if cfg["inputs"] != NAMES or len(dtypes) != 1 or arrays["boxes"].dtype.type not in FLOATS:
        return INVALID_ACCEPTED
    boxes, scores = arrays["boxes"], arrays["scores"]
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[0] != boxes.shape[0]:
        return INVALID_ACCEPTED
    if scores.shape[2] != boxes.shape[1] or 0 in cfg["thresholds"][0] + cfg["thresholds"][1]:
        return INVALID_ACCEPTED
    iou_threshold, score_threshold = arrays["iou_threshold"].reshape(-1)[0], arrays["score_threshold"].reshape(-1)[0]
    if any(near_threshold(boxes[b], 0, float(iou_threshold)) for b in range(boxes.shape[0])):
        return MATCH  # an IoU at the threshold: either answer is right
    want = nms_match_reference(boxes, scores, iou_threshold, score_threshold)
    return MATCH if np.array_equal(out, want) else ("mismatch", f"{out.tolist()} vs {want.tolist()}"[:300])
