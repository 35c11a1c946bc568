"""Fuzz targets of roi_align_rotated (``ort.RoiAlignRotated``, ``torch.roi_align_rotated``): maps up to 10x10, up
to 8 rois, fixed and adaptive grids, both pixel models and angle conventions; batch indices out of range, not
integers or NaN; NaN, infinite, huge, zero and negative roi numbers; output sizes of 0 or above 65536, a sampling
ratio above 4096, a scale of 0, NaN or inf; wrong ranks, empty maps, other and mixed dtypes; an int for a float
attribute (and back); missing, empty-named and extra inputs."""

from __future__ import annotations

import math

import numpy as np

from ._common import INVALID_ACCEPTED, MATCH, chance, close_values, rejected, run_one_node, to_torch

ORT_NODE = "RoiAlignRotated"
#: Other projects' names of the node, run by the same kernel and checks (tests/ort_cases cover their
#: attribute forms).
ORT_ALIASES = ["mmcv::MMCVRoIAlignRotated", "mmdeploy::MMCVRoIAlignRotated"]
NAMES = ["input", "rois"]
FLOATS = [np.float32, np.float64]
SPECIAL = [np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, -2.0]
DEFAULTS = {"output_height": 1, "output_width": 1, "spatial_scale": 1.0, "sampling_ratio": 0, "aligned": 1,
            "clockwise": 0}  # fmt: skip


def config(rng, kind: str) -> dict:
    n, c, h, w, k = (int(rng.integers(lo, hi)) for lo, hi in ((1, 3), (0, 4), (0, 11), (0, 11), (0, 9)))
    n = 0 if chance(rng, 0.08) else n
    dtype = FLOATS[int(rng.integers(0, 2))]
    attrs = {"output_height": int(rng.integers(1, 5)), "output_width": int(rng.integers(1, 5)),
             "spatial_scale": float(rng.choice([1.0, 0.5, 0.25, 2.0])),
             "sampling_ratio": int(rng.choice([0, 0, 1, 2, 3, -1])),
             "aligned": int(chance(rng, 0.5)), "clockwise": int(chance(rng, 0.5))}  # fmt: skip
    cfg = {"input": [n, c, h, w], "rois": [k, 6], "dtypes": [dtype, dtype], "attrs": attrs, "special": chance(rng, 0.2),
           "batch_index": None, "inputs": list(NAMES)}  # fmt: skip
    if chance(rng, 0.08):
        edits = [[n, c, h], [k, 5], [k, 6, 1], [6], [1, n, c, h, w]]
        cfg[NAMES[int(rng.integers(0, 2))]] = edits[int(rng.integers(0, 5))]
    if chance(rng, 0.08):
        cfg["dtypes"][int(rng.integers(0, 2))] = [np.float16, np.int32, np.int64, np.float64][int(rng.integers(0, 4))]
    if chance(rng, 0.1):
        cfg["batch_index"] = float(rng.choice([-1.0, 0.5, np.nan, np.inf, 1e30, 2.0, 3.0]))
    if chance(rng, 0.15):
        name = list(DEFAULTS)[int(rng.integers(0, 6))]
        bad = {"output_height": [0, -1, 65537, 2**31, 65536, 2.0], "output_width": [0, -3, 65537, 2**40, 65536, 1.0],
               "spatial_scale": [0.0, -1.0, float("nan"), float("inf"), 1, 1e-30],
               "sampling_ratio": [4097, 2**31, -(2**31), 2.0], "aligned": [2, 1.0],
               "clockwise": [3, -1]}[name]  # fmt: skip
        cfg["attrs"][name] = bad[int(rng.integers(0, len(bad)))]
        if cfg["attrs"][name] == 65536:  # a valid but large output: one roi, one column
            cfg["rois"], cfg["attrs"]["output_width" if name == "output_height" else "output_height"] = [1, 6], 1
            cfg["attrs"]["sampling_ratio"] = 1
    if chance(rng, 0.05):
        del cfg["attrs"][list(DEFAULTS)[int(rng.integers(0, 6))]]
    if kind == "ort" and chance(rng, 0.06):
        cfg["inputs"] = [["input"], ["input", ""], ["", "rois"], ["input", "rois", "input"]][int(rng.integers(0, 4))]
    return cfg


def input_arrays(rng, cfg):
    x = rng.standard_normal(cfg["input"]) * 3
    shape, (n, _, h, w) = cfg["rois"], (cfg["input"] + [1] * 4)[:4]
    scale = cfg["attrs"].get("spatial_scale", 1.0)
    scale = scale if isinstance(scale, float) and 0.1 < scale < 10 else 1.0
    if len(shape) == 2 and shape[1] == 6:
        k = shape[0]
        rois = np.concatenate([rng.integers(0, max(n, 1), (k, 1)), rng.uniform(-2, w + 2, (k, 1)) / scale,
                               rng.uniform(-2, h + 2, (k, 1)) / scale, rng.uniform(0, 8, (k, 2)) / scale,
                               rng.uniform(-math.pi, math.pi, (k, 1))], axis=1)  # fmt: skip
        if cfg["special"] and k:
            flat = rois[:, 1:].reshape(-1)
            picks = rng.integers(0, flat.size, size=max(1, flat.size // 8))
            flat[picks] = rng.choice(SPECIAL, size=picks.size)
            rois[:, 1:] = flat.reshape(k, 5)
        if cfg["batch_index"] is not None and k:
            rois[int(rng.integers(0, k)), 0] = cfg["batch_index"]
    else:
        rois = rng.standard_normal(shape)
    return x.astype(cfg["dtypes"][0]), rois.astype(cfg["dtypes"][1])


def attributes(cfg, ort: bool) -> dict:
    a = {**DEFAULTS, **cfg["attrs"]}
    if ort and type(a["spatial_scale"]) is float:
        a["spatial_scale"] = float(np.float32(a["spatial_scale"]))
    return a


def grid(roi, a):
    """(cx, cy, w, h, theta, gh, gw) of one roi in feature pixels, or None when a number is not finite."""
    scale, offset = a["spatial_scale"], 0.5 if a["aligned"] else 0.0
    cx, cy, w, h = roi[1] * scale - offset, roi[2] * scale - offset, roi[3] * scale, roi[4] * scale
    if not all(math.isfinite(v) for v in (cx, cy, w, h, roi[5])):
        return None
    if not a["aligned"]:
        w, h = max(w, 1.0), max(h, 1.0)
    ratio, ph, pw = a["sampling_ratio"], a["output_height"], a["output_width"]
    gh = ratio if ratio > 0 else max(math.ceil(h / ph), 0)
    gw = ratio if ratio > 0 else max(math.ceil(w / pw), 0)
    return cx, cy, w, h, -roi[5] if a["clockwise"] else roi[5], gh, gw


def valid(cfg, x, rois, a) -> bool:
    if cfg["inputs"] != NAMES or x.dtype != rois.dtype or x.dtype.type not in FLOATS or x.ndim != 4:
        return False
    if rois.ndim != 2 or rois.shape[1] != 6 or any(type(a[k]) is not int for k in DEFAULTS if k != "spatial_scale"):
        return False
    scale = a["spatial_scale"]
    if type(scale) is not float or not (math.isfinite(scale) and scale > 0) or a["sampling_ratio"] > 4096:
        return False
    if not (1 <= a["output_height"] <= 65536 and 1 <= a["output_width"] <= 65536):
        return False
    if a["aligned"] not in (0, 1) or a["clockwise"] not in (0, 1):
        return False
    for roi in rois.astype(np.float64).tolist():
        if not (roi[0] == int(roi[0]) if math.isfinite(roi[0]) else False) or not 0 <= roi[0] < x.shape[0]:
            return False
        g = grid(roi, a)
        if g is not None and a["sampling_ratio"] <= 0 and g[5] * g[6] * a["output_height"] * a["output_width"] > 2**26:
            return False
    return True


def bilinear(plane, y, x):
    """mmcv's bilinear rule, vectorised: plane [C, H, W], points y, x of one shape -> [C, *shape]."""
    height, width = plane.shape[-2:]
    outside = (y < -1.0) | (y > height) | (x < -1.0) | (x > width)
    if height == 0 or width == 0:
        return np.zeros(plane.shape[:1] + y.shape)
    y, x = np.clip(y, 0.0, height), np.clip(x, 0.0, width)
    y0, x0 = y.astype(np.int64), x.astype(np.int64)
    y = np.where(y0 >= height - 1, height - 1.0, y)
    x = np.where(x0 >= width - 1, width - 1.0, x)
    y0, x0 = np.minimum(y0, height - 1), np.minimum(x0, width - 1)
    y1, x1 = np.minimum(y0 + 1, height - 1), np.minimum(x0 + 1, width - 1)
    ly, lx = y - y0, x - x0
    value = ((1 - ly) * (1 - lx) * plane[:, y0, x0] + (1 - ly) * lx * plane[:, y0, x1]
             + ly * (1 - lx) * plane[:, y1, x0] + ly * lx * plane[:, y1, x1])  # fmt: skip
    return np.where(outside, 0.0, value)


def reference(x, rois, a):
    ph, pw = a["output_height"], a["output_width"]
    x = x.astype(np.float64)
    out = np.zeros((rois.shape[0], x.shape[1], ph, pw))
    for k, roi in enumerate(rois.astype(np.float64).tolist()):
        g = grid(roi, a)
        if g is None:
            out[k] = np.nan
            continue
        cx, cy, w, h, theta, gh, gw = g
        if gh * gw == 0:
            continue
        yy = -h / 2 + np.arange(ph)[:, None] * h / ph + (np.arange(gh)[None, :] + 0.5) * h / ph / gh  # [ph, gh]
        xx = -w / 2 + np.arange(pw)[:, None] * w / pw + (np.arange(gw)[None, :] + 0.5) * w / pw / gw  # [pw, gw]
        yy, xx = yy[:, :, None, None], xx[None, None, :, :]
        with np.errstate(over="ignore", invalid="ignore"):
            py = yy * math.cos(theta) - xx * math.sin(theta) + cy
            px = yy * math.sin(theta) + xx * math.cos(theta) + cx
            out[k] = bilinear(x[int(roi[0])], py, px).sum(axis=(2, 4)) / (gh * gw)
    return out


def compare(out, x, rois, a):
    want = reference(x, rois, a).astype(x.dtype)
    return MATCH if close_values(out, want, x.dtype.type) else ("mismatch", "values differ")


def run_ort(session, rng, cfg):

    x, rois = input_arrays(rng, cfg)
    arrays = {"input": x, "rois": rois}
    out, refused = run_one_node(session, "RoiAlignRotated", cfg["inputs"], arrays, cfg["attrs"], cfg["dtypes"][0])
    if refused:
        return refused
    a = attributes(cfg, ort=True)
    if not valid(cfg, x, rois, a):
        return INVALID_ACCEPTED
    return compare(out, x, rois, a)


def run_torch(rng, cfg):
    import torch

    x, rois = input_arrays(rng, cfg)
    a = attributes(cfg, ort=False)
    a["aligned"], a["clockwise"] = int(bool(a["aligned"])), int(bool(a["clockwise"]))  # bools in the schema
    try:
        out = torch.ops.opbridge.roi_align_rotated(to_torch(x), to_torch(rois), a["output_height"], a["output_width"],
                                                   a["spatial_scale"], a["sampling_ratio"], bool(a["aligned"]),
                                                   bool(a["clockwise"]))  # fmt: skip
    except Exception as error:
        return rejected(error)
    if type(a["spatial_scale"]) is int:  # the schema's float takes an int
        a["spatial_scale"] = float(a["spatial_scale"])
    if not valid(cfg, x, rois, a):
        return INVALID_ACCEPTED
    return compare(out.numpy(), x, rois, a)
