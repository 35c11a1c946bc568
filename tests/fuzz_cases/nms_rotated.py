"""Fuzz targets of nms_rotated (``ort.NmsRotated``, ``torch.nms_rotated``): 0 to 40 clustered boxes, tied, NaN and
infinite scores, labels or none; NaN, infinite and huge numbers, zero- and negative-size boxes; wrong shapes,
other and mixed dtypes, float or int32 labels; odd thresholds; bad attributes; missing, empty-named and extra
inputs. Kept indices are compared exactly unless an IoU lies within 1e-6 of the threshold."""

from __future__ import annotations

import math

import numpy as np

from ._common import INVALID_ACCEPTED, MATCH, chance, one_node_model, rejected, tensor_info, to_torch
from .box_iou_rotated import overlap, random_boxes

ORT_NODE = "NmsRotated"
#: Other projects' names of the node, run by the same kernel and checks (tests/ort_cases cover their
#: attribute forms).
ORT_ALIASES = ["mmdeploy::NMSRotated"]
FLOATS = [np.float32, np.float64]


def config(rng, kind: str) -> dict:
    n = int(rng.integers(0, 41))
    dtype = FLOATS[int(rng.integers(0, 2))]
    threshold = float(rng.uniform(0, 1)) if chance(rng, 0.85) else float(rng.choice([0.0, 1.0, -0.5, 1.5, np.nan]))
    cfg = {"boxes": [n, 5], "scores": [n], "labels": [n] if chance(rng, 0.4) else None, "dtypes": [dtype, dtype],
           "label_dtype": np.int64, "special": chance(rng, 0.2), "ties": chance(rng, 0.3),
           "spread": 4 + 8 * rng.random(),
           "attrs": {"iou_threshold": threshold, "clockwise": int(chance(rng, 0.5))}, "inputs": None}  # fmt: skip
    if chance(rng, 0.1):
        cfg[["boxes", "scores"][int(rng.integers(0, 2))]] = [[n, 4], [n + 1], [n, 5, 1], [], [n + 1, 5]][
            int(rng.integers(0, 5))
        ]
    if cfg["labels"] is not None and chance(rng, 0.1):
        cfg["labels"] = [[n + 1], [n, 1], []][int(rng.integers(0, 3))]
    if chance(rng, 0.08):
        cfg["dtypes"][int(rng.integers(0, 2))] = [np.float16, np.int64, np.float64][int(rng.integers(0, 3))]
    if cfg["labels"] is not None and chance(rng, 0.1):
        cfg["label_dtype"] = [np.int32, np.float32][int(rng.integers(0, 2))]
    if chance(rng, 0.08):
        cfg["attrs"][["iou_threshold", "clockwise"][int(rng.integers(0, 2))]] = [1, 2, 0.5, None][
            int(rng.integers(0, 4))
        ]
    names = ["boxes", "scores"] + (["labels"] if cfg["labels"] is not None else [])
    if kind == "ort" and chance(rng, 0.08):
        names = [["boxes"], ["boxes", "scores", ""], ["boxes", "", "labels"], ["", "scores"], [*names, "boxes"]][
            int(rng.integers(0, 5))
        ]
    cfg["inputs"] = names
    if "labels" in names and cfg["labels"] is None:
        cfg["labels"] = [n]
    return cfg


def input_arrays(rng, cfg) -> dict:
    boxes = random_boxes(rng, cfg["boxes"], np.float64, cfg["special"])
    if len(cfg["boxes"]) == 2 and cfg["boxes"][1] == 5:  # clusters: some boxes overlap others
        boxes[:, :2] *= cfg["spread"] / 8
    scores = np.array(rng.random(cfg["scores"]), dtype=np.float64)
    if cfg["ties"]:
        scores = scores.round(1)
    if cfg["special"] and scores.size:
        picks = rng.integers(0, scores.size, size=max(1, scores.size // 8))
        scores.reshape(-1)[picks] = rng.choice([np.nan, np.inf, -np.inf])
    labels = None if cfg["labels"] is None else rng.integers(0, 3, cfg["labels"]).astype(cfg["label_dtype"])
    with np.errstate(over="ignore", invalid="ignore"):
        return {"boxes": boxes.astype(cfg["dtypes"][0]), "scores": scores.astype(cfg["dtypes"][1]), "labels": labels}


def valid(cfg, arrays, kind) -> bool:
    boxes, scores, labels = arrays["boxes"], arrays["scores"], arrays["labels"]
    given = [n for n in cfg["inputs"] if n]
    if cfg["inputs"][:2] != ["boxes", "scores"] or len(cfg["inputs"]) > 3:
        return False
    if given not in (["boxes", "scores"], ["boxes", "scores", "labels"]):
        return False
    if boxes.dtype != scores.dtype or boxes.dtype.type not in FLOATS or boxes.ndim != 2 or boxes.shape[1] != 5:
        return False
    if scores.shape != boxes.shape[:1]:
        return False
    if "labels" in given:
        integer = labels.dtype == np.int64 if kind == "ort" else np.issubdtype(labels.dtype, np.integer)
        if not integer or labels.shape != boxes.shape[:1]:
            return False
    threshold, clockwise = cfg["attrs"]["iou_threshold"], cfg["attrs"]["clockwise"]
    if kind == "ort" and threshold is not None and type(threshold) is not float:
        return False
    return clockwise is None or (type(clockwise) is int and clockwise in (0, 1))


def check(keep, arrays, threshold, clockwise, use_labels):
    b = arrays["boxes"].astype(np.float64).tolist()
    s = arrays["scores"].astype(np.float64).tolist()
    labels = arrays["labels"].tolist() if use_labels else None
    n = len(s)
    iou = [[overlap(b[i], b[j], 0, clockwise) if i < j else 0.0 for j in range(n)] for i in range(n)]
    iou = [[iou[min(i, j)][max(i, j)] for j in range(n)] for i in range(n)]
    if any(abs(iou[i][j] - threshold) < 1e-6 for i in range(n) for j in range(i + 1, n)):
        return MATCH  # an IoU at the threshold: either answer is right
    order = sorted(range(n), key=lambda i: (not math.isnan(s[i]), -s[i] if not math.isnan(s[i]) else 0.0))
    want: list[int] = []
    for i in order:
        if all((labels is not None and labels[i] != labels[k]) or not iou[k][i] > threshold for k in want):
            want.append(i)
    if keep.dtype != np.int64 or keep.shape != (len(want),) or keep.tolist() != want:
        return ("mismatch", f"kept {keep.tolist()} ({keep.dtype}), want {want}"[:300])
    return MATCH


def run_ort(session, rng, cfg):
    from onnx import helper

    arrays = input_arrays(rng, cfg)
    attrs = {k: v for k, v in cfg["attrs"].items() if v is not None}
    node = helper.make_node("NmsRotated", cfg["inputs"], ["keep"], domain="opbridge", **attrs)
    names = [n for n in dict.fromkeys(cfg["inputs"]) if n]
    model = one_node_model(node, [tensor_info(n, arrays[n].dtype.type) for n in names], [tensor_info("keep", np.int64)])
    try:
        (keep,) = session(model).run(None, {n: arrays[n] for n in names})
    except Exception as error:
        return rejected(error)
    if not valid(cfg, arrays, "ort"):
        return INVALID_ACCEPTED
    a = cfg["attrs"]
    threshold = float(np.float32(0.5 if a["iou_threshold"] is None else a["iou_threshold"]))
    return check(keep, arrays, threshold, a["clockwise"] != 0, "labels" in names)


def run_torch(rng, cfg):
    import torch

    arrays = input_arrays(rng, cfg)
    a = cfg["attrs"]
    threshold = 0.5 if a["iou_threshold"] is None else a["iou_threshold"]
    clockwise = a["clockwise"] if a["clockwise"] is not None else 1
    labels = None if arrays["labels"] is None else to_torch(arrays["labels"])
    try:
        keep = torch.ops.opbridge.nms_rotated(to_torch(arrays["boxes"]), to_torch(arrays["scores"]), threshold, labels,
                                              bool(clockwise))  # fmt: skip
    except Exception as error:
        return rejected(error)
    if not valid(dict(cfg, attrs={"iou_threshold": threshold, "clockwise": int(bool(clockwise))}), arrays, "torch"):
        return INVALID_ACCEPTED
    return check(keep.numpy(), arrays, float(threshold), bool(clockwise), labels is not None)
