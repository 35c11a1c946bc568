"""Fuzz targets of rotated_feature_align (``ort.RotatedFeatureAlign``, ``torch.rotated_feature_align``): maps up
to 8x8 with one box per pixel, 1 or 5 points; NaN, infinite, huge, zero and negative box numbers; boxes of the
wrong batch, height, width or last dim, wrong ranks, empty maps, other and mixed dtypes; points 0, 3 or a float,
a scale of 0, NaN or inf, an int scale; missing, empty-named and extra inputs."""

from __future__ import annotations

import math

import numpy as np

from ._common import INVALID_ACCEPTED, MATCH, chance, close_values, rejected, run_one_node, to_torch

ORT_NODE = "RotatedFeatureAlign"
#: Other projects' names of the node, run by the same kernel and checks (tests/ort_cases cover their
#: attribute forms).
ORT_ALIASES = ["mmcv::MMCVRotatedFeatureAlign"]
NAMES = ["features", "best_rboxes"]
FLOATS = [np.float32, np.float64]
SPECIAL = [np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, -2.0]


def config(rng, kind: str) -> dict:
    n, c, h, w = (int(rng.integers(lo, hi)) for lo, hi in ((0, 3), (0, 4), (0, 9), (0, 9)))
    dtype = FLOATS[int(rng.integers(0, 2))]
    cfg = {"features": [n, c, h, w], "best_rboxes": [n, h, w, 5], "dtypes": [dtype, dtype],
           "special": chance(rng, 0.25),
           "attrs": {"spatial_scale": float(rng.choice([1.0, 0.5, 0.125, 2.0])), "points": int(rng.choice([1, 5]))},
           "inputs": list(NAMES)}  # fmt: skip
    if chance(rng, 0.12):
        edits = [[n + 1, h, w, 5], [n, h + 1, w, 5], [n, h, w + 1, 5], [n, h, w, 4], [n, h, w], [n, c, h, w, 5]]
        cfg["best_rboxes"] = edits[int(rng.integers(0, len(edits)))]
    if chance(rng, 0.05):
        cfg["features"] = [[n, c, h], [1, n, c, h, w]][int(rng.integers(0, 2))]
    if chance(rng, 0.08):
        cfg["dtypes"][int(rng.integers(0, 2))] = [np.float16, np.int32, np.int64, np.float64][int(rng.integers(0, 4))]
    if chance(rng, 0.12):
        name = ["spatial_scale", "points"][int(rng.integers(0, 2))]
        bad = {"spatial_scale": [0.0, -1.0, float("nan"), float("inf"), 1, None],
               "points": [0, 3, 2, -1, 5.0, None]}[name]  # fmt: skip
        cfg["attrs"][name] = bad[int(rng.integers(0, len(bad)))]
    if kind == "ort" and chance(rng, 0.06):
        cfg["inputs"] = [["features"], ["features", ""], ["", "best_rboxes"], [*NAMES, "features"]][
            int(rng.integers(0, 4))
        ]
    return cfg


def input_arrays(rng, cfg):
    x = rng.standard_normal(cfg["features"]) * 3
    shape = cfg["best_rboxes"]
    scale = cfg["attrs"]["spatial_scale"]
    scale = scale if isinstance(scale, float) and 0.1 < scale < 10 else 1.0
    if len(shape) == 4 and shape[3] == 5:
        n, h, w = shape[:3]
        boxes = np.concatenate([rng.uniform(-2, h + 2, (n, h, w, 1)) / scale,
                                rng.uniform(-2, w + 2, (n, h, w, 1)) / scale,
                                rng.uniform(0, 6, (n, h, w, 2)) / scale,
                                rng.uniform(-math.pi, math.pi, (n, h, w, 1))], axis=3)  # fmt: skip
        if cfg["special"] and boxes.size:
            flat = boxes.reshape(-1)
            picks = rng.integers(0, flat.size, size=max(1, flat.size // 10))
            flat[picks] = rng.choice(SPECIAL, size=picks.size)
    else:
        boxes = rng.standard_normal(shape)
    return x.astype(cfg["dtypes"][0]), boxes.astype(cfg["dtypes"][1])


def valid(cfg, x, boxes, scale, points) -> bool:
    if cfg["inputs"] != NAMES or x.dtype != boxes.dtype or x.dtype.type not in FLOATS or x.ndim != 4:
        return False
    if boxes.shape != (x.shape[0], x.shape[2], x.shape[3], 5):
        return False
    if type(points) is not int or points not in (1, 5):
        return False
    return type(scale) is float and math.isfinite(scale) and scale > 0


def reference(x, boxes, scale, points):
    from ort_cases.rotated_feature_align import reference as align

    b = boxes.astype(np.float64)
    bad = ~np.isfinite(b).all(axis=3)
    with np.errstate(over="ignore", invalid="ignore"):
        out = align(x.astype(np.float64), np.where(bad[..., None], 0.0, b), scale, points)
    out.transpose(0, 2, 3, 1)[bad] = np.nan
    return out


def compare(out, x, boxes, scale, points):
    want = reference(x, boxes, scale, points).astype(x.dtype)
    return MATCH if close_values(out, want, x.dtype.type) else ("mismatch", "values differ")


def run_ort(session, rng, cfg):

    x, boxes = input_arrays(rng, cfg)
    arrays = {"features": x, "best_rboxes": boxes}
    attrs = {k: v for k, v in cfg["attrs"].items() if v is not None}
    out, refused = run_one_node(session, "RotatedFeatureAlign", cfg["inputs"], arrays, attrs, cfg["dtypes"][0])
    if refused:
        return refused
    scale = 1.0 if attrs.get("spatial_scale") is None else attrs["spatial_scale"]
    scale = float(np.float32(scale)) if type(scale) is float else scale
    points = attrs.get("points", 1)
    if not valid(cfg, x, boxes, scale, points):
        return INVALID_ACCEPTED
    return compare(out, x, boxes, scale, points)


def run_torch(rng, cfg):
    import torch

    x, boxes = input_arrays(rng, cfg)
    scale = 0.125 if cfg["attrs"]["spatial_scale"] is None else cfg["attrs"]["spatial_scale"]
    points = 1 if cfg["attrs"]["points"] is None else cfg["attrs"]["points"]
    try:
        out = torch.ops.opbridge.rotated_feature_align(to_torch(x), to_torch(boxes), scale, points)
    except Exception as error:
        return rejected(error)
    scale = float(scale)  # the schema's float takes an int
    if not valid(cfg, x, boxes, scale, points):
        return INVALID_ACCEPTED
    return compare(out.numpy(), x, boxes, scale, points)
