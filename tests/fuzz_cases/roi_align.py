"""Fuzz target of mmcv::MMCVRoiAlign (``ort.mmcv.MMCVRoiAlign``): maps up to 2x3x8x8, up to 6 rois, avg and max,
aligned or not, fixed and adaptive grids; batch indices out of range, fractional or NaN; NaN, infinite, huge,
empty and inverted rois; output sizes of 0, sampling ratios above 4096, scales of 0, NaN or inf; wrong ranks and
roi widths, other and mixed dtypes; modes other than "avg"/"max", ints for strings and floats; missing,
empty-named and extra inputs. No torch op of opbridge's runs this node (mmcv's RoIAlign; torchvision's for avg)."""

from __future__ import annotations

import math

import numpy as np

from ._common import INVALID_ACCEPTED, MATCH, chance, close_values, run_one_node

ORT_NODE = "MMCVRoiAlign"
ORT_DOMAIN = "mmcv"
ORT_ALIASES = ["mmdeploy::MMCVRoiAlign"]
NAMES = ["input", "rois"]
FLOATS = [np.float32, np.float64]
DEFAULTS = {"output_height": None, "output_width": None, "spatial_scale": 1.0, "sampling_ratio": 0, "mode": "avg",
            "aligned": 1}  # fmt: skip


def config(rng, kind: str) -> dict:
    n, c, h, w, k = (int(rng.integers(lo, hi)) for lo, hi in ((1, 3), (0, 4), (1, 9), (1, 9), (0, 7)))
    dtype = FLOATS[int(rng.integers(0, 2))]
    attrs = {"output_height": int(rng.integers(1, 4)), "output_width": int(rng.integers(1, 4)),
             "spatial_scale": float(rng.choice([1.0, 0.5, 0.25, 2.0])), "sampling_ratio": int(rng.choice([0, 1, 2, 3])),
             "mode": str(rng.choice(["avg", "max"])), "aligned": int(chance(rng, 0.5))}  # fmt: skip
    cfg = {"input": [n, c, h, w], "rois": [k, 5], "dtypes": [dtype, dtype], "special": chance(rng, 0.2),
           "batch_index": None, "attrs": attrs, "inputs": list(NAMES)}  # fmt: skip
    if chance(rng, 0.08):
        cfg[NAMES[int(rng.integers(0, 2))]] = [[n, c, h], [k, 4], [k, 6], [5], [1, n, c, h, w]][int(rng.integers(0, 5))]
    if chance(rng, 0.08):
        cfg["dtypes"][int(rng.integers(0, 2))] = [np.float16, np.int32, np.int64, np.float64][int(rng.integers(0, 4))]
    if chance(rng, 0.1):
        cfg["batch_index"] = float(rng.choice([-1.0, 0.5, np.nan, np.inf, 2.0, 3.0]))
    if chance(rng, 0.15):
        name = list(attrs)[int(rng.integers(0, 6))]
        bad = {"output_height": [0, -1, 65537, 2.0], "output_width": [0, -3, 2**40, 1.0],
               "spatial_scale": [0.0, -1.0, float("nan"), float("inf"), 1], "sampling_ratio": [4097, 2**31, 2.0],
               "mode": ["mean", "", "MAX", 1], "aligned": [2, -1, 1.0]}[name]  # fmt: skip
        cfg["attrs"][name] = bad[int(rng.integers(0, len(bad)))]
    if chance(rng, 0.05):
        del cfg["attrs"][list(attrs)[int(rng.integers(0, 6))]]
    if chance(rng, 0.06):
        cfg["inputs"] = [["input"], ["input", ""], ["", "rois"], [*NAMES, "input"]][int(rng.integers(0, 4))]
    return cfg


def input_arrays(rng, cfg):
    x = rng.standard_normal(cfg["input"]) * 3
    shape, n = cfg["rois"], (cfg["input"] + [1])[0]
    scale = cfg["attrs"].get("spatial_scale", 1.0)
    scale = scale if isinstance(scale, float) and 0.1 < scale < 10 else 1.0
    if len(shape) == 2 and shape[1] == 5:
        k, (h, w) = shape[0], (cfg["input"] + [8, 8, 8, 8])[2:4]
        start = rng.uniform(-2, [w + 1, h + 1], (k, 2))
        size = rng.uniform(-1, 6, (k, 2))  # some inverted
        rois = np.concatenate([rng.integers(0, max(n, 1), (k, 1)), start / scale, (start + size) / scale], axis=1)
        if cfg["special"] and k:
            flat = rois[:, 1:].reshape(-1)
            picks = rng.integers(0, flat.size, size=max(1, flat.size // 6))
            flat[picks] = rng.choice([np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0], size=picks.size)
            rois[:, 1:] = flat.reshape(k, 4)
        if cfg["batch_index"] is not None and k:
            rois[int(rng.integers(0, k)), 0] = cfg["batch_index"]
    else:
        rois = rng.standard_normal(shape)
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(cfg["dtypes"][0]), rois.astype(cfg["dtypes"][1])


def grid_ok(rois, a) -> bool:
    """Adaptive grids of huge rois are refused (more than 2**26 samples per roi)."""
    if a["sampling_ratio"] > 0:
        return True
    offset = 0.5 if a["aligned"] else 0.0
    for _, x1, y1, x2, y2 in rois.astype(np.float64).tolist():
        with np.errstate(over="ignore", invalid="ignore"):
            w = (x2 * a["spatial_scale"] - offset) - (x1 * a["spatial_scale"] - offset)
            h = (y2 * a["spatial_scale"] - offset) - (y1 * a["spatial_scale"] - offset)
        if not (math.isfinite(w) and math.isfinite(h)):
            continue
        w, h = (w, h) if a["aligned"] else (max(w, 1.0), max(h, 1.0))
        gh, gw = max(math.ceil(h / a["output_height"]), 0), max(math.ceil(w / a["output_width"]), 0)
        if gh * gw * a["output_height"] * a["output_width"] > 2**26:
            return False
    return True


def valid(cfg, x, rois, a) -> bool:
    if cfg["inputs"] != NAMES or x.dtype != rois.dtype or x.dtype.type not in FLOATS or x.ndim != 4:
        return False
    if rois.ndim != 2 or rois.shape[1] != 5 or a["mode"] not in ("avg", "max") or a["aligned"] not in (0, 1):
        return False
    ints = ("output_height", "output_width", "sampling_ratio", "aligned")
    if any(type(a[key]) is not int for key in ints) or type(a["spatial_scale"]) is not float:
        return False
    if not (1 <= a["output_height"] <= 65536 and 1 <= a["output_width"] <= 65536 and a["sampling_ratio"] <= 4096):
        return False
    if not (math.isfinite(a["spatial_scale"]) and a["spatial_scale"] > 0):
        return False
    for index in rois[:, 0].astype(np.float64).tolist():
        if not (math.isfinite(index) and index == int(index) and 0 <= index < x.shape[0]):
            return False
    return grid_ok(rois, a)


def run_ort(session, rng, cfg):
    from ort_cases.roi_align import roi_align_reference

    x, rois = input_arrays(rng, cfg)
    out, refused = run_one_node(session, ORT_NODE, cfg["inputs"], {"input": x, "rois": rois}, cfg["attrs"],
                                cfg["dtypes"][0], domain=ORT_DOMAIN)  # fmt: skip
    if refused:
        return refused
    a = {**DEFAULTS, **cfg["attrs"]}
    if type(a["spatial_scale"]) is float:
        a["spatial_scale"] = float(np.float32(a["spatial_scale"]))
    if not valid(cfg, x, rois, a):
        return INVALID_ACCEPTED
    with np.errstate(over="ignore", invalid="ignore"):
        want = roi_align_reference(x, rois, (a["output_height"], a["output_width"]), a["spatial_scale"],
                                   a["sampling_ratio"], a["mode"], a["aligned"]).astype(x.dtype)  # fmt: skip
    return MATCH if close_values(out, want, x.dtype.type) else ("mismatch", "values differ")
