"""Fuzz target of mmdeploy::grid_sampler (``ort.mmdeploy.grid_sampler``; mmcv::grid_sampler shares its kernel and
checks): maps up to 9x9, grids up to 6x6, every interpolation, padding and align_corners; NaN, infinite and huge
grid values; grids of the wrong batch, last dim or rank, empty maps and grids, other and mixed dtypes; modes out
of range, float attributes; missing, empty-named and extra inputs. No torch op of opbridge's runs this node."""

from __future__ import annotations

import numpy as np

from ._common import INVALID_ACCEPTED, MATCH, chance, close_values, random_values, run_one_node

ORT_NODE = "grid_sampler"
ORT_DOMAIN = "mmdeploy"
ORT_ALIASES = ["mmcv::grid_sampler"]
NAMES = ["input", "grid"]
FLOATS = [np.float32, np.float64]
MODES = ("bilinear", "nearest", "bicubic"), ("zeros", "border", "reflection")


def config(rng, kind: str) -> dict:
    n, c, h, w, ho, wo = (int(rng.integers(lo, hi)) for lo, hi in ((0, 3), (0, 4), (1, 10), (1, 10), (0, 7), (0, 7)))
    dtype = FLOATS[int(rng.integers(0, 2))]
    attrs = {"interpolation_mode": int(rng.integers(0, 3)), "padding_mode": int(rng.integers(0, 3)),
             "align_corners": int(chance(rng, 0.5))}  # fmt: skip
    cfg = {"input": [n, c, h, w], "grid": [n, ho, wo, 2], "dtypes": [dtype, dtype], "special": chance(rng, 0.2),
           "attrs": attrs, "inputs": list(NAMES)}  # fmt: skip
    if chance(rng, 0.1):
        edits = [[n + 1, ho, wo, 2], [n, ho, wo, 3], [n, ho, wo], [n, ho, wo, 2, 1], [2]]
        cfg["grid"] = edits[int(rng.integers(0, len(edits)))]
    if chance(rng, 0.06):
        cfg["input"] = [[n, c, h], [n, c, 0, w], [1, n, c, h, w]][int(rng.integers(0, 3))]
    if chance(rng, 0.08):
        cfg["dtypes"][int(rng.integers(0, 2))] = [np.float16, np.int32, np.int64, np.float64][int(rng.integers(0, 4))]
    if chance(rng, 0.12):
        name = list(attrs)[int(rng.integers(0, 3))]
        cfg["attrs"][name] = [3, -1, 2**40, 1.0, 2][int(rng.integers(0, 5))]
    if chance(rng, 0.05):
        del cfg["attrs"][list(attrs)[int(rng.integers(0, 3))]]
    if chance(rng, 0.06):
        cfg["inputs"] = [["input"], ["input", ""], ["", "grid"], [*NAMES, "input"]][int(rng.integers(0, 4))]
    return cfg


def valid(cfg, x, grid, a) -> bool:
    if cfg["inputs"] != NAMES or x.dtype != grid.dtype or x.dtype.type not in FLOATS:
        return False
    if any(type(v) is not int for v in a.values()):
        return False
    if not (0 <= a["interpolation_mode"] <= 2 and 0 <= a["padding_mode"] <= 2 and a["align_corners"] in (0, 1)):
        return False
    if x.ndim != 4 or grid.ndim != 4 or grid.shape[3] != 2 or grid.shape[0] != x.shape[0]:
        return False
    return not ((x.shape[2] == 0 or x.shape[3] == 0) and x.shape[0] * x.shape[1] * grid.shape[1] * grid.shape[2])


def run_ort(session, rng, cfg):
    from ort_cases.grid_sampler import grid_sample_reference

    x = random_values(rng, cfg["input"], cfg["dtypes"][0], False)
    grid = rng.uniform(-1.5, 1.5, cfg["grid"]) if all(d >= 0 for d in cfg["grid"]) else np.zeros(0)
    if cfg["special"] and grid.size:
        flat = grid.reshape(-1)
        picks = rng.integers(0, flat.size, size=max(1, flat.size // 6))
        # Huge coordinates reflect to an arbitrary pixel that depends on rounding: not for reflection.
        huge = [1e30, -1e30, 1e8] if cfg["attrs"].get("padding_mode") != 2 else []
        flat[picks] = rng.choice([np.nan, np.inf, -np.inf, *huge], size=picks.size)
    with np.errstate(over="ignore"):
        grid = grid.astype(cfg["dtypes"][1])
    out, refused = run_one_node(session, ORT_NODE, cfg["inputs"], {"input": x, "grid": grid}, cfg["attrs"],
                                cfg["dtypes"][0], domain=ORT_DOMAIN)  # fmt: skip
    if refused:
        return refused
    a = {"interpolation_mode": 0, "padding_mode": 0, "align_corners": 0, **cfg["attrs"]}
    if not valid(cfg, x, grid, a):
        return INVALID_ACCEPTED
    with np.errstate(invalid="ignore", over="ignore"):
        want = grid_sample_reference(x, grid, MODES[0][a["interpolation_mode"]], MODES[1][a["padding_mode"]],
                                     bool(a["align_corners"])).astype(x.dtype)  # fmt: skip
    return MATCH if close_values(out, want, x.dtype.type) else ("mismatch", "values differ")
