"""Fuzz target of mmcv::MMCVCornerPool (``ort.mmcv.MMCVCornerPool``): maps up to 2x3x7x7, the four modes and
modes out of range, ties, NaN and infinite values; ranks other than 4, empty maps; float and double, other
dtypes; a float or missing mode; missing, empty-named and extra inputs. No torch op of opbridge's runs this node
(mmcv's CornerPool is torch.cummax on a flipped map)."""

from __future__ import annotations

import numpy as np

from ._common import INVALID_ACCEPTED, MATCH, chance, random_values, run_one_node

ORT_NODE = "MMCVCornerPool"
ORT_DOMAIN = "mmcv"
FLOATS = [np.float32, np.float64]
# What the node takes: also float16 (computed in float32; the values are copies, so exactly).
ACCEPTED = [*FLOATS, np.float16]


def config(rng, kind: str) -> dict:
    shape = [int(rng.integers(lo, hi)) for lo, hi in ((0, 3), (0, 4), (0, 8), (0, 8))]
    cfg = {"shape": shape, "dtype": FLOATS[int(rng.integers(0, 2))], "attrs": {"mode": int(rng.integers(0, 4))},
           "special": chance(rng, 0.3), "inputs": ["input"]}  # fmt: skip
    if chance(rng, 0.08):
        cfg["shape"] = [shape[:3], [*shape, 2], []][int(rng.integers(0, 3))]
    if chance(rng, 0.1):
        cfg["attrs"]["mode"] = [4, -1, 2**40, 1.0][int(rng.integers(0, 4))]
    if chance(rng, 0.04):
        del cfg["attrs"]["mode"]
    if chance(rng, 0.06):
        cfg["dtype"] = [np.float16, np.int64, np.int32][int(rng.integers(0, 3))]
    if chance(rng, 0.05):
        cfg["inputs"] = [[""], ["input", "input"]][int(rng.integers(0, 2))]
    return cfg


def run_ort(session, rng, cfg):
    from ort_cases.cummax import CORNER_MODES, corner_pool_reference

    x = random_values(rng, cfg["shape"], np.float64, cfg["special"]).round(0).astype(cfg["dtype"])
    out, refused = run_one_node(session, ORT_NODE, cfg["inputs"], {"input": x}, cfg["attrs"], cfg["dtype"],
                                domain=ORT_DOMAIN)  # fmt: skip
    if refused:
        return refused
    mode = cfg["attrs"].get("mode", 0)
    if cfg["inputs"] != ["input"] or cfg["dtype"] not in ACCEPTED or x.ndim != 4 or mode not in (0, 1, 2, 3):
        return INVALID_ACCEPTED
    if type(mode) is not int:
        return INVALID_ACCEPTED
    want = corner_pool_reference(x, CORNER_MODES[mode])
    return MATCH if np.array_equal(out, want, equal_nan=True) else ("mismatch", "values differ")
