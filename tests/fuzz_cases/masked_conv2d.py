"""Fuzz target of mmcv::MMCVMaskedConv2d (``ort.mmcv.MMCVMaskedConv2d``): one image up to 4x7x7, kernels up to
4x4, paddings 0 to 3, sparse and dense float or bool masks, with and without bias; NaN and infinite features;
strides other than 1, negative or huge paddings, one value or three, floats; batches of two, masks and weights of
the wrong shape, masked positions outside the output, other dtypes; missing and extra inputs. No torch op of
opbridge's runs this node (mmcv's MaskedConv2d)."""

from __future__ import annotations

import numpy as np

from ._common import INVALID_ACCEPTED, MATCH, chance, close_values, random_values, run_one_node

ORT_NODE = "MMCVMaskedConv2d"
ORT_DOMAIN = "mmcv"
FLOATS = [np.float32, np.float64]
# What the node takes: also float16 (computed in float32, rounded once).
ACCEPTED = [*FLOATS, np.float16]
NAMES = ["features", "mask", "weight", "bias"]


def config(rng, kind: str) -> dict:
    c, h, w, o = (int(rng.integers(lo, hi)) for lo, hi in ((1, 5), (1, 8), (1, 8), (1, 5)))
    kh, kw, pad = int(rng.integers(1, 5)), int(rng.integers(1, 5)), [int(rng.integers(0, 4)), int(rng.integers(0, 4))]
    dtype = FLOATS[int(rng.integers(0, 2))]
    cfg = {"features": [1, c, h, w], "mask": [1, h, w], "weight": [o, c, kh, kw], "bias": [o], "dtype": dtype,
           "mask_dtype": "bool" if chance(rng, 0.4) else "same", "density": float(rng.choice([0.0, 0.3, 1.0])),
           "special": chance(rng, 0.15), "attrs": {"padding": pad, "stride": [1, 1]},
           "inputs": list(NAMES) if chance(rng, 0.7) else NAMES[:3]}  # fmt: skip
    if chance(rng, 0.1):
        name = ["features", "mask", "weight", "bias"][int(rng.integers(0, 4))]
        cfg[name] = {"features": [2, c, h, w], "mask": [1, h, w + 1], "weight": [o, c + 1, kh, kw],
                     "bias": [o + 1]}[name]  # fmt: skip
    if chance(rng, 0.1):
        name = ["padding", "stride"][int(rng.integers(0, 2))]
        cfg["attrs"][name] = {"padding": [-1, 0], "stride": [2, 1]}[name] if chance(rng, 0.5) else [1, 1, 1]
    if chance(rng, 0.05):
        cfg["dtype"] = [np.float16, np.int64][int(rng.integers(0, 2))]
    if chance(rng, 0.05):
        cfg["inputs"] = [NAMES[:2], ["features", "", "weight"], [*NAMES, "bias"]][int(rng.integers(0, 3))]
    return cfg


def run_ort(session, rng, cfg):
    from ort_cases.masked_conv2d import masked_conv_reference

    dtype = cfg["dtype"]
    arrays = {n: random_values(rng, cfg[n], np.float64, cfg["special"] and n == "features").astype(dtype)
              for n in ("features", "weight", "bias")}  # fmt: skip
    score = rng.random(cfg["mask"]) - (1 - cfg["density"])
    arrays["mask"] = score > 0 if cfg["mask_dtype"] == "bool" else score.astype(dtype)
    out, refused = run_one_node(session, ORT_NODE, cfg["inputs"], arrays, cfg["attrs"], dtype, domain=ORT_DOMAIN)
    if refused:
        return refused
    pad, stride = cfg["attrs"]["padding"], cfg["attrs"]["stride"]
    if cfg["inputs"] not in (NAMES, NAMES[:3]) or dtype not in ACCEPTED or stride != [1, 1] or len(pad) != 2:
        return INVALID_ACCEPTED
    f, m, w = arrays["features"], arrays["mask"], arrays["weight"]
    if min(pad) < 0 or f.shape[0] != 1 or m.shape != (1, *f.shape[2:]) or w.shape[1] != f.shape[1]:
        return INVALID_ACCEPTED
    if "bias" in cfg["inputs"] and arrays["bias"].shape != (w.shape[0],):
        return INVALID_ACCEPTED
    out_h, out_w = f.shape[2] + 2 * pad[0] - w.shape[2] + 1, f.shape[3] + 2 * pad[1] - w.shape[3] + 1
    ys, xs = np.nonzero(m[0] > 0)
    if len(ys) and (ys.max() >= out_h or xs.max() >= out_w):
        return INVALID_ACCEPTED
    bias = arrays["bias"] if "bias" in cfg["inputs"] else None
    if dtype == np.float16:  # the definition in float64 on the float16 values (numpy would compute in float16)
        f, m, w = (a.astype(np.float64) if a.dtype == np.float16 else a for a in (f, m, w))
        bias = None if bias is None else bias.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        want = masked_conv_reference(f, m, w, bias, pad).astype(dtype)
    return MATCH if close_values(out, want, dtype) else ("mismatch", "values differ")
