"""Fuzz target of mmcv::SoftNonMaxSuppression (``ort.mmcv.SoftNonMaxSuppression``): nms.py's boxes and scores
(continuous values: a decayed tie may round either way), the three methods and methods out of range, sigma of 0
or NaN, min_score and thresholds at and beyond their ends, offsets; wrong shapes, other dtypes; missing and extra
inputs. Picks compared exactly and scores to 1e-5, unless an IoU lies within 1e-5 of the threshold."""

from __future__ import annotations

import math

import numpy as np

from . import nms
from ._common import INVALID_ACCEPTED, MATCH, chance, run_one_node

ORT_NODE = "SoftNonMaxSuppression"
ORT_DOMAIN = "mmcv"
DEFAULTS = {"iou_threshold": 0.3, "sigma": 0.5, "min_score": 1e-3, "method": 1, "offset": 0}


def config(rng, kind: str) -> dict:
    cfg = nms.config(rng, kind)
    cfg["ties"] = False
    cfg["attrs"] = {"iou_threshold": float(rng.uniform(0, 1)), "sigma": float(rng.uniform(0.1, 1)),
                    "min_score": float(rng.choice([1e-3, 0.05, 0.3, 0.0])), "method": int(rng.integers(0, 3)),
                    "offset": int(chance(rng, 0.3))}  # fmt: skip
    if chance(rng, 0.12):
        name = list(DEFAULTS)[int(rng.integers(0, 5))]
        bad = {"iou_threshold": [np.nan, 1, -1.0, 2.0], "sigma": [0.0, np.nan, -1.0, 1], "min_score": [np.nan, 2.0],
               "method": [3, -1, 1.0], "offset": [2, 1.0]}[name]  # fmt: skip
        cfg["attrs"][name] = bad[int(rng.integers(0, len(bad)))]
    if chance(rng, 0.05):
        del cfg["attrs"][list(DEFAULTS)[int(rng.integers(0, 5))]]
    return cfg


def valid(cfg, arrays, a) -> bool:
    if not nms.valid(cfg, arrays, {"iou_threshold": a["iou_threshold"], "offset": a["offset"]}):
        return False
    if any(type(a[k]) is not float for k in ("sigma", "min_score")) or type(a["method"]) is not int:
        return False
    if a["method"] not in (0, 1, 2) or math.isnan(a["min_score"]):
        return False
    return a["method"] != 2 or (math.isfinite(a["sigma"]) and a["sigma"] > 0)


def run_ort(session, rng, cfg):
    from ort_cases.nms import soft_nms_reference

    arrays = nms.input_arrays(rng, cfg)
    dtype = cfg["dtypes"][0]
    results, refused = run_one_node(session, ORT_NODE, cfg["inputs"], arrays, cfg["attrs"], None, domain=ORT_DOMAIN,
                                    outputs=[dtype, np.int64])  # fmt: skip
    if refused:
        return refused
    a = {**DEFAULTS, **cfg["attrs"]}
    a = {k: float(np.float32(v)) if type(v) is float else v for k, v in a.items()}
    if not valid(cfg, arrays, a):
        return INVALID_ACCEPTED
    boxes, scores = arrays["boxes"], arrays["scores"]
    if a["method"] != 2 and nms.near_threshold(boxes, a["offset"], a["iou_threshold"]):
        return MATCH  # an IoU at the threshold: either answer is right
    if not (np.isfinite(boxes).all() and np.isfinite(scores).all()):
        return MATCH  # NaN scores pick in an order mmcv leaves undefined; only "no crash" is checked
    want_dets, want_inds = soft_nms_reference(boxes, scores, a["iou_threshold"], a["sigma"], a["min_score"],
                                              a["method"], a["offset"])  # fmt: skip
    dets, inds = results
    if inds.tolist() != want_inds:
        return ("mismatch", f"picked {inds.tolist()}, want {want_inds}"[:300])
    tolerance = 1e-5 if dtype == np.float32 else 1e-10
    if dets.shape != want_dets.shape or not np.allclose(dets, want_dets, rtol=tolerance, atol=tolerance):
        return ("mismatch", "dets differ")
    return MATCH
