"""Fuzz target of mmcv::MMCVCARAFE (``ort.mmcv.MMCVCARAFE``; MMCVCARAFENaive runs the same kernel and checks):
maps up to 2x4x6x6, kernels 1 to 7 and even ones, groups dividing the channels or not, scales 1 to 3 and
fractional ones; NaN and infinite values; masks of the wrong shape, wrong ranks, empty maps, other and mixed
dtypes; missing attributes, ints for the float scale; missing and extra inputs. No torch op of opbridge's runs
this node (mmcv's CARAFE)."""

from __future__ import annotations

import numpy as np

from ._common import INVALID_ACCEPTED, MATCH, chance, close_values, random_values, run_one_node

ORT_NODE = "MMCVCARAFE"
ORT_DOMAIN = "mmcv"
ORT_ALIASES = ["mmcv::MMCVCARAFENaive"]
FLOATS = [np.float32, np.float64]
NAMES = ["features", "masks"]


def config(rng, kind: str) -> dict:
    n, h, w = int(rng.integers(0, 3)), int(rng.integers(0, 7)), int(rng.integers(0, 7))
    group = int(rng.choice([1, 2]))
    c = group * int(rng.integers(1, 3))
    k, s = int(rng.choice([1, 3, 5, 7])), int(rng.integers(1, 4))
    dtype = FLOATS[int(rng.integers(0, 2))]
    cfg = {"features": [n, c, h, w], "masks": [n, group * k * k, h * s, w * s], "dtypes": [dtype, dtype],
           "special": chance(rng, 0.15), "inputs": list(NAMES),
           "attrs": {"kernel_size": k, "group_size": group, "scale_factor": float(s)}}  # fmt: skip
    if chance(rng, 0.1):
        cfg["masks"] = [[n, group * k * k + 1, h * s, w * s], [n, group * k * k, h * s + 1, w * s],
                        [group * k * k, h * s, w * s]][int(rng.integers(0, 3))]  # fmt: skip
    if chance(rng, 0.12):
        name = ["kernel_size", "group_size", "scale_factor"][int(rng.integers(0, 3))]
        bad = {"kernel_size": [2, 0, -1, 3.0], "group_size": [3, 0, -2],
               "scale_factor": [1.5, 0.0, -1.0, 2, float("nan")]}[name]  # fmt: skip
        cfg["attrs"][name] = bad[int(rng.integers(0, len(bad)))]
    if chance(rng, 0.04):
        del cfg["attrs"][["kernel_size", "group_size", "scale_factor"][int(rng.integers(0, 3))]]
    if chance(rng, 0.06):
        cfg["dtypes"][int(rng.integers(0, 2))] = [np.float16, np.int64, np.float64][int(rng.integers(0, 3))]
    if chance(rng, 0.05):
        cfg["inputs"] = [["features"], ["features", ""], [*NAMES, "masks"]][int(rng.integers(0, 3))]
    return cfg


def run_ort(session, rng, cfg):
    from ort_cases.carafe import carafe_reference

    x = random_values(rng, cfg["features"], np.float64, cfg["special"]).astype(cfg["dtypes"][0])
    masks = random_values(rng, cfg["masks"], np.float64, False).astype(cfg["dtypes"][1])
    out, refused = run_one_node(session, ORT_NODE, cfg["inputs"], {"features": x, "masks": masks}, cfg["attrs"],
                                cfg["dtypes"][0], domain=ORT_DOMAIN)  # fmt: skip
    if refused:
        return refused
    a = {"group_size": 1, **cfg["attrs"]}
    k, group, scale = a.get("kernel_size"), a["group_size"], a.get("scale_factor")
    if cfg["inputs"] != NAMES or x.dtype != masks.dtype or x.dtype.type not in FLOATS or x.ndim != 4:
        return INVALID_ACCEPTED
    if type(k) is not int or k < 1 or k % 2 == 0 or type(group) is not int or group < 1 or x.shape[1] % group:
        return INVALID_ACCEPTED
    if type(scale) is not float or not (scale >= 1 and scale == int(scale)):
        return INVALID_ACCEPTED
    s = int(scale)
    if masks.shape != (x.shape[0], group * k * k, x.shape[2] * s, x.shape[3] * s):
        return INVALID_ACCEPTED
    with np.errstate(invalid="ignore", over="ignore"):
        want = carafe_reference(x, masks, k, group, s).astype(x.dtype)
    return MATCH if close_values(out, want, x.dtype.type) else ("mismatch", "values differ")
