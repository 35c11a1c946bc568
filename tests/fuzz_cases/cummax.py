"""Fuzz target of mmcv::cummax (``ort.mmcv.cummax``; mmcv::cummin is the same kernel with the comparison turned):
ranks 0 to 5, sizes 0 to 6, every axis and axes out of range, ties, NaN and infinite values; float, double and
int64, other dtypes; a float or missing dim; missing, empty-named and extra inputs. No torch op of opbridge's runs
this node (torch.cummax is torch's own)."""

from __future__ import annotations

import numpy as np

from ._common import INVALID_ACCEPTED, MATCH, chance, random_values, run_one_node

ORT_NODE = "cummax"
ORT_DOMAIN = "mmcv"
ORT_ALIASES = ["mmcv::cummin"]
TYPES = [np.float32, np.float64, np.int64]
# What the node takes: also float16 (computed in float32; the values are copies, so exactly).
ACCEPTED = [*TYPES, np.float16]


def config(rng, kind: str) -> dict:
    rank = int(rng.integers(0, 6))
    shape = [int(rng.integers(0, 7)) if chance(rng, 0.1) else int(rng.integers(1, 7)) for _ in range(rank)]
    dim = int(rng.integers(-max(rank, 1), max(rank, 1)))
    cfg = {"shape": shape, "dtype": TYPES[int(rng.integers(0, 3))], "attrs": {"dim": dim},
           "special": chance(rng, 0.3), "inputs": ["input"]}  # fmt: skip
    if chance(rng, 0.1):
        cfg["attrs"]["dim"] = [rank, -rank - 1, 2**40, 0.0, 1.5][int(rng.integers(0, 5))]
    if chance(rng, 0.04):
        del cfg["attrs"]["dim"]
    if chance(rng, 0.06):
        cfg["dtype"] = [np.float16, np.int32, np.uint8][int(rng.integers(0, 3))]
    if chance(rng, 0.05):
        cfg["inputs"] = [[""], ["input", "input"]][int(rng.integers(0, 2))]
    return cfg


def run_ort(session, rng, cfg):
    from ort_cases.cummax import cumulative_reference

    dtype = cfg["dtype"]
    values = random_values(rng, cfg["shape"], np.float64, cfg["special"] and dtype != np.int64).round(0)
    x = values.astype(dtype) if dtype != np.int64 else (values * 3).astype(np.int64)
    results, refused = run_one_node(session, ORT_NODE, cfg["inputs"], {"input": x}, cfg["attrs"], None,
                                    domain=ORT_DOMAIN, outputs=[dtype, np.int64])  # fmt: skip
    if refused:
        return refused
    dim, rank = cfg["attrs"].get("dim", 0), max(len(cfg["shape"]), 1)
    if cfg["inputs"] != ["input"] or dtype not in ACCEPTED or type(dim) is not int or not -rank <= dim < rank:
        return INVALID_ACCEPTED
    want_values, want_indices = cumulative_reference(x, dim, True)
    got_values, got_indices = results
    if got_values.dtype != x.dtype or not np.array_equal(got_values, want_values, equal_nan=dtype != np.int64):
        return ("mismatch", "values differ")
    return MATCH if np.array_equal(got_indices, want_indices) else ("mismatch", "indices differ")
