"""Fuzz targets of ms_deform_attn (``ort.MultiScaleDeformableAttention``, ``torch.ms_deform_attn``)."""

from __future__ import annotations

import math

import numpy as np

from ._common import (
    HUGE,
    INVALID_ACCEPTED,
    MATCH,
    chance,
    close_values,
    one_node_model,
    random_values,
    rejected,
    tensor_info,
    to_torch,
)

ORT_NODE = "MultiScaleDeformableAttention"
#: Other projects' names of the node, run by the same kernel and checks (tests/ort_cases cover their
#: attribute forms).
ORT_ALIASES = ["mmdeploy::MMCVMultiScaleDeformableAttention"]
NAMES = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]


def config(rng, kind: str) -> dict:
    """Usually a valid problem, then a few of: wrong sizes in the level table (negative, huge, not tiling S,
    starts off by one), mismatched or wrong-rank shapes, empty dims, other dtypes, NaN/inf/far locations."""
    levels = int(rng.integers(1, 4))
    sizes = [[int(rng.integers(0, 5)), int(rng.integers(1, 6))] for _ in range(levels)]
    batch, queries, heads = int(rng.integers(0, 3)), int(rng.integers(0, 5)), int(rng.integers(1, 3))
    channels, points = int(rng.integers(0, 5)), int(rng.integers(1, 3))
    cfg = {"sizes": sizes, "starts": None, "keys": None, "batch": batch, "queries": queries, "heads": heads,
           "channels": channels, "points": points, "dtype": np.float32 if chance(rng, 0.6) else np.float64,
           "index_dtype": np.int64, "special": chance(rng, 0.3), "far": chance(rng, 0.3), "shape_edits": [],
           "inputs": list(NAMES)}  # fmt: skip
    if chance(rng, 0.15):
        cfg["sizes"][int(rng.integers(0, levels))][int(rng.integers(0, 2))] = int(rng.choice([-1, -7, *HUGE]))
    if chance(rng, 0.1):
        cfg["starts"] = "off"
    if chance(rng, 0.1):
        cfg["keys"] = int(rng.integers(0, 40))
    if chance(rng, 0.15):  # one input's shape edited: (input index, dimension or None for rank, new size)
        cfg["shape_edits"].append((int(rng.integers(0, 5)), int(rng.integers(-1, 6)), int(rng.integers(0, 4))))
    if chance(rng, 0.05):
        cfg["dtype"] = np.float16
    if chance(rng, 0.05):
        cfg["index_dtype"] = np.int32
    if chance(rng, 0.05):
        cfg["inputs"] = NAMES[: int(rng.integers(0, 5))] if chance(rng, 0.5) else [*NAMES, "value"]
    return cfg


def input_arrays(rng, cfg) -> dict | None:
    sizes = np.array(cfg["sizes"], dtype=np.int64)
    areas = [h * w if h >= 0 and w >= 0 and h < 2**31 and w < 2**31 else 0 for h, w in cfg["sizes"]]
    starts = np.concatenate([[0], np.cumsum(areas)[:-1]]).astype(np.int64)
    if cfg["starts"] == "off":
        starts = starts + np.arange(len(starts))
    keys = cfg["keys"] if cfg["keys"] is not None else int(sum(areas))
    if keys > 2000:
        return None
    n, q, m, d, p, levels = cfg["batch"], cfg["queries"], cfg["heads"], cfg["channels"], cfg["points"], len(sizes)
    shapes = [[n, keys, m, d], [levels, 2], [levels], [n, q, m, levels, p, 2], [n, q, m, levels, p]]
    for index, dim, size in cfg["shape_edits"]:
        if dim < 0 or dim >= len(shapes[index]):
            shapes[index] = shapes[index][:-1] if shapes[index] else [size]  # the rank changes
        else:
            shapes[index][dim] = size
    if any(math.prod(s) > 50000 for s in shapes):
        return None
    locations = rng.random(shapes[3]) * 1.4 - 0.2
    if cfg["far"] and locations.size:
        flat = locations.reshape(-1)
        picks = rng.integers(0, flat.size, size=max(1, flat.size // 5))
        flat[picks] = rng.choice([np.nan, np.inf, -np.inf, 1e30, -1e30, 3.0, -2.0], size=picks.size)
    with np.errstate(over="ignore", invalid="ignore"):
        arrays = {
            "value": random_values(rng, shapes[0], cfg["dtype"], cfg["special"]),
            "spatial_shapes": np.resize(sizes, shapes[1]).astype(cfg["index_dtype"]),
            "level_start_index": np.resize(starts, shapes[2]).astype(cfg["index_dtype"]),
            "sampling_locations": locations.astype(cfg["dtype"]),
            "attention_weights": random_values(rng, shapes[4], cfg["dtype"], cfg["special"]),
        }
    return arrays


def valid(cfg, arrays) -> bool:
    """Written from the op's definition: what a correct implementation must accept (float16 too: half storage,
    float32 arithmetic)."""
    if cfg["inputs"] != NAMES or cfg["index_dtype"] != np.int64:
        return False
    v, sizes, starts, loc, attn = (arrays[n] for n in NAMES)
    if v.ndim != 4 or sizes.ndim != 2 or sizes.shape[1] != 2 or sizes.shape[0] < 1 or starts.shape != sizes.shape[:1]:
        return False
    n, keys, m, _ = v.shape
    if loc.ndim != 6 or loc.shape[0] != n or loc.shape[2] != m or loc.shape[3] != sizes.shape[0] or loc.shape[5] != 2:
        return False
    if attn.shape != loc.shape[:5]:
        return False
    total = 0
    for (h, w), start in zip(sizes.tolist(), starts.tolist(), strict=True):
        if h < 0 or w < 0 or h >= 2**31 or w >= 2**31 or start != total:
            return False
        total += h * w
    return total == keys


def reference(arrays):
    from ort_cases.multi_scale_deformable_attention import ms_deform_attn_reference

    # float16 inputs: the definition in float64 on their values, rounded once (numpy would compute in float16).
    wide = [arrays[n].astype(np.float64) if arrays[n].dtype == np.float16 else arrays[n] for n in NAMES]
    with np.errstate(over="ignore", invalid="ignore"):
        return ms_deform_attn_reference(*wide).astype(arrays["value"].dtype)


def run_ort(session, rng, cfg):
    from onnx import helper

    arrays = input_arrays(rng, cfg)
    if arrays is None:
        return "rejected", "skipped: shapes too large to feed"
    names = cfg["inputs"]
    node = helper.make_node("MultiScaleDeformableAttention", names, ["out"], domain="opbridge")
    inputs = [tensor_info(n, arrays[n].dtype.type) for n in dict.fromkeys(names)]
    model = one_node_model(node, inputs, [tensor_info("out", cfg["dtype"])])
    try:
        (out,) = session(model).run(None, {n: arrays[n] for n in dict.fromkeys(names)})
    except Exception as error:
        return rejected(error)
    if not valid(cfg, arrays):
        return INVALID_ACCEPTED
    want = reference(arrays)
    return MATCH if close_values(out, want, cfg["dtype"]) else ("mismatch", "values differ")


def run_torch(rng, cfg):
    import torch

    arrays = input_arrays(rng, cfg)
    if arrays is None:
        return "rejected", "skipped: shapes too large to allocate"
    t = {k: to_torch(v) for k, v in arrays.items()}
    args = [t[n] for n in cfg["inputs"]]
    try:
        out = torch.ops.opbridge.ms_deform_attn(*args)
    except Exception as error:
        return rejected(error)
    # The torch op takes the level table in any integer dtype.
    if not valid(dict(cfg, index_dtype=np.int64), arrays):
        return INVALID_ACCEPTED
    want = reference(arrays)
    return MATCH if close_values(out.numpy(), want, cfg["dtype"]) else ("mismatch", "values differ")
