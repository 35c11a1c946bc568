"""Fuzz targets of mmcv::NonMaxSuppression (``ort.mmcv.NonMaxSuppression``) and, in soft_nms.py,
mmcv::SoftNonMaxSuppression: 0 to 40 clustered boxes, tied, NaN and infinite scores; NaN, infinite, inverted and
empty boxes; offsets 0 and 1 and out of range; thresholds of 0, 1, negative or NaN; wrong shapes, other and mixed
dtypes; missing attributes, ints for floats; missing, empty-named and extra inputs. Kept indices are compared
exactly unless an IoU lies within 1e-6 of the threshold. No torch op of opbridge's runs these nodes."""

from __future__ import annotations

import math

import numpy as np

from ._common import INVALID_ACCEPTED, MATCH, chance, run_one_node

ORT_NODE = "NonMaxSuppression"
ORT_DOMAIN = "mmcv"
FLOATS = [np.float32, np.float64]


def config(rng, kind: str) -> dict:
    n = int(rng.integers(0, 41))
    threshold = float(rng.uniform(0, 1)) if chance(rng, 0.85) else float(rng.choice([0.0, 1.0, -0.5, 1.5, np.nan]))
    cfg = {"boxes": [n, 4], "scores": [n], "dtypes": [FLOATS[int(rng.integers(0, 2))]] * 2,
           "special": chance(rng, 0.2), "ties": chance(rng, 0.3),
           "attrs": {"iou_threshold": threshold, "offset": int(chance(rng, 0.3))},
           "inputs": ["boxes", "scores"]}  # fmt: skip
    if chance(rng, 0.1):
        cfg[["boxes", "scores"][int(rng.integers(0, 2))]] = [[n, 5], [n + 1], [n, 4, 1], [], [n + 1, 4]][
            int(rng.integers(0, 5))
        ]
    if chance(rng, 0.08):
        cfg["dtypes"][int(rng.integers(0, 2))] = [np.float16, np.int64, np.float64][int(rng.integers(0, 3))]
    if chance(rng, 0.1):
        name = ["iou_threshold", "offset"][int(rng.integers(0, 2))]
        cfg["attrs"][name] = {"iou_threshold": [1, None], "offset": [2, -1, 1.0, None]}[name][int(rng.integers(0, 2))]
    if chance(rng, 0.06):
        cfg["inputs"] = [["boxes"], ["boxes", ""], ["", "scores"], ["boxes", "scores", "boxes"]][
            int(rng.integers(0, 4))
        ]
    return cfg


def input_arrays(rng, cfg) -> dict:
    shape = cfg["boxes"]
    if len(shape) == 2 and shape[1] == 4:
        centers, sizes = rng.uniform(0, 30, (shape[0], 2)), rng.uniform(-1, 12, (shape[0], 2))
        if cfg["ties"]:
            centers, sizes = centers.round(0), sizes.round(0)
        boxes = np.concatenate([centers - sizes / 2, centers + sizes / 2], axis=1)
    else:
        boxes = rng.standard_normal(shape) if all(d >= 0 for d in shape) else np.zeros(0)
    scores = rng.random(cfg["scores"]) if all(d >= 0 for d in cfg["scores"]) else np.zeros(0)
    if cfg["ties"]:
        scores = scores.round(1)
    for array in (boxes, scores):
        if cfg["special"] and array.size:
            picks = rng.integers(0, array.size, size=max(1, array.size // 8))
            array.reshape(-1)[picks] = rng.choice([np.nan, np.inf, -np.inf])
    with np.errstate(over="ignore", invalid="ignore"):
        return {"boxes": boxes.astype(cfg["dtypes"][0]), "scores": scores.astype(cfg["dtypes"][1])}


def valid(cfg, arrays, attrs) -> bool:
    boxes, scores = arrays["boxes"], arrays["scores"]
    if cfg["inputs"] != ["boxes", "scores"] or boxes.dtype != scores.dtype or boxes.dtype.type not in FLOATS:
        return False
    if boxes.ndim != 2 or boxes.shape[1] != 4 or scores.shape != boxes.shape[:1]:
        return False
    return (
        all(type(attrs.get(k)) is t for k, t in (("iou_threshold", float), ("offset", int)))
        and attrs["offset"] in (0, 1)
        and math.isfinite(attrs["iou_threshold"])
    )


def near_threshold(boxes, offset, threshold) -> bool:
    from ort_cases.nms import iou

    b = boxes.astype(np.float64).tolist()
    return any(abs(iou(b[i], b[j], offset) - threshold) < 1e-6 for i in range(len(b)) for j in range(i + 1, len(b)))


def run_ort(session, rng, cfg):
    from ort_cases.nms import nms_reference

    arrays = input_arrays(rng, cfg)
    attrs = {k: v for k, v in cfg["attrs"].items() if v is not None}
    keep, refused = run_one_node(session, ORT_NODE, cfg["inputs"], arrays, attrs, np.int64, domain=ORT_DOMAIN)
    if refused:
        return refused
    attrs.setdefault("offset", 0)
    if not valid(cfg, arrays, attrs):
        return INVALID_ACCEPTED
    threshold = float(np.float32(attrs["iou_threshold"]))
    if near_threshold(arrays["boxes"], attrs["offset"], threshold):
        return MATCH  # an IoU at the threshold: either answer is right
    with np.errstate(invalid="ignore", over="ignore"):
        want = nms_reference(arrays["boxes"], arrays["scores"], threshold, attrs["offset"])
    if keep.dtype != np.int64 or keep.tolist() != want:
        return ("mismatch", f"kept {keep.tolist()}, want {want}"[:300])
    return MATCH
