"""Fuzz target of mmcv::MMCVPSAMask (``ort.mmcv.MMCVPSAMask``): maps up to 2x7x7, windows up to 9x9 (even, odd,
larger than the map), both types; types out of range, mask sizes of 0, one value or three, floats; channels that
do not match the window, wrong ranks, empty maps, other dtypes; missing and extra inputs. No torch op of
opbridge's runs this node (mmcv's PSAMask)."""

from __future__ import annotations

import numpy as np

from ._common import INVALID_ACCEPTED, MATCH, chance, random_values, run_one_node

ORT_NODE = "MMCVPSAMask"
ORT_DOMAIN = "mmcv"
FLOATS = [np.float32, np.float64]
# What the node takes: also float16 (computed in float32; the values are copies, so exactly).
ACCEPTED = [*FLOATS, np.float16]


def config(rng, kind: str) -> dict:
    mask = [int(rng.integers(1, 10)), int(rng.integers(1, 10))]
    n, h, w = int(rng.integers(0, 3)), int(rng.integers(0, 8)), int(rng.integers(0, 8))
    cfg = {"shape": [n, mask[0] * mask[1], h, w], "dtype": FLOATS[int(rng.integers(0, 2))],
           "attrs": {"psa_type": int(rng.integers(0, 2)), "mask_size": mask}, "special": chance(rng, 0.2),
           "inputs": ["input"]}  # fmt: skip
    if chance(rng, 0.1):
        cfg["shape"] = [[n, mask[0] * mask[1] + 1, h, w], [mask[0] * mask[1], h, w], [n, 1, h, w]][
            int(rng.integers(0, 3))
        ]
    if chance(rng, 0.12):
        name = ["psa_type", "mask_size"][int(rng.integers(0, 2))]
        bad = {"psa_type": [2, -1, 1.0], "mask_size": [[0, 3], [3], [3, 3, 3], [-1, 2], [5000, 1], 1.0]}[name]
        cfg["attrs"][name] = bad[int(rng.integers(0, len(bad)))]
    if chance(rng, 0.04):
        del cfg["attrs"][["psa_type", "mask_size"][int(rng.integers(0, 2))]]
    if chance(rng, 0.06):
        cfg["dtype"] = [np.float16, np.int64, np.int32][int(rng.integers(0, 3))]
    if chance(rng, 0.05):
        cfg["inputs"] = [[""], ["input", "input"]][int(rng.integers(0, 2))]
    return cfg


def run_ort(session, rng, cfg):
    from ort_cases.psa_mask import psa_mask_reference

    x = random_values(rng, cfg["shape"], np.float64, cfg["special"]).astype(cfg["dtype"])
    out, refused = run_one_node(session, ORT_NODE, cfg["inputs"], {"input": x}, cfg["attrs"], cfg["dtype"],
                                domain=ORT_DOMAIN)  # fmt: skip
    if refused:
        return refused
    psa_type, mask = cfg["attrs"].get("psa_type", 0), cfg["attrs"].get("mask_size")
    mask = [mask, mask] if type(mask) is int else mask
    if (
        cfg["inputs"] != ["input"]
        or cfg["dtype"] not in ACCEPTED
        or psa_type not in (0, 1)
        or type(psa_type) is not int
    ):
        return INVALID_ACCEPTED
    if not isinstance(mask, list) or len(mask) != 2 or not all(type(v) is int and 1 <= v <= 4096 for v in mask):
        return INVALID_ACCEPTED
    if x.ndim != 4 or x.shape[1] != mask[0] * mask[1]:
        return INVALID_ACCEPTED
    want = psa_mask_reference(x, psa_type, mask)
    return MATCH if np.array_equal(out, want, equal_nan=True) else ("mismatch", "values differ")
