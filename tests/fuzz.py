"""Fuzzing opbridge's ops: hostile models and inputs must never crash or hang the process.

    python tests/fuzz.py [--cases N] [--seed S] [--targets ...] [--library PATH] [--json FILE]
    python tests/fuzz.py --replay TARGET:SEED:CASE      # one case, in this process, printing it

Targets: ``ort.MyAdd``, ``ort.DeformConv2d`` and ``ort.MultiScaleDeformableAttention`` (the ORT library, with
onnxruntime, onnx and numpy only) and ``torch.my_add``, ``torch.deform_conv2d`` and ``torch.ms_deform_attn``
(``torch.ops.opbridge``, when torch and opbridge import).
Each case is generated from (seed, target, case number) alone, so any case can be replayed. A case mixes
valid configurations with adversarial ones: attributes negative, zero, huge or of the wrong length, missing
or extra; shapes mismatched, empty, huge or of rank 0 to 8; unsupported or mixed dtypes; missing, empty and
extra inputs; NaN and infinite values. Every case must end in one of:

- ``match``: the op ran, the configuration is valid (by the Python predicates below, written from the ops'
  definitions) and the output equals the numpy reference;
- ``rejected``: the op raised an error (an ORT error status or a Python exception).

Anything else fails the run: ``mismatch`` (wrong values, or an invalid configuration accepted), ``crash``
(the worker process died: a signal, or a sanitizer report) and ``hang`` (no progress for --timeout
seconds). Cases run in worker processes, so a crash is recorded with its case number and the run goes on.
Under `nox -s sanitize` both libraries are built with AddressSanitizer and UndefinedBehaviorSanitizer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # the numpy reference lives in ort_cases/deform_conv2d.py
ORT_TARGETS = ["ort.MyAdd", "ort.DeformConv2d", "ort.MultiScaleDeformableAttention"]
TORCH_TARGETS = ["torch.my_add", "torch.deform_conv2d", "torch.ms_deform_attn"]
HUGE = [2**31 - 1, 2**31, 2**32 + 1, 2**62, 2**63 - 1]
FLOAT_DTYPES = [np.float32, np.float64, np.float16]
# Set by --no-huge-allocations: under AddressSanitizer a failing `operator new` (in the runtime, for an output
# of terabytes) aborts instead of throwing std::bad_alloc, so those cases run only without ASan.
NO_HUGE = "OPBRIDGE_FUZZ_NO_HUGE_ALLOCATIONS"


def case_rng(seed: int, target: str, case: int) -> np.random.Generator:
    return np.random.default_rng([seed, sum(map(ord, target)) * 7919 + len(target), case])


def chance(rng, p: float) -> bool:
    return bool(rng.random() < p)


def random_values(rng, shape, dtype, special: bool, huge: bool = True):
    """Normal values; with `special`, a tenth of them NaN, +-inf, -0.0 or (with `huge`) 1e30."""
    values = rng.standard_normal(shape) * 3 if all(d >= 0 for d in shape) else np.zeros(0)
    if special and values.size:
        flat = values.reshape(-1)
        picks = rng.integers(0, flat.size, size=max(1, flat.size // 10))
        flat[picks] = rng.choice([np.nan, np.inf, -np.inf, -0.0] + ([1e30] if huge else []), size=picks.size)
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(dtype)


# ---------------------------------------------------------------------------------------------------
# my_add: configurations, validity, reference


def my_add_config(rng) -> dict:
    def shape(rank):
        return [int(rng.choice([1, 1, 1, 2, 3, 4, 0, 5, 7])) for _ in range(rank)]

    rank_a, rank_b = int(rng.integers(0, 9)), int(rng.integers(0, 9))
    a, b = shape(rank_a), shape(rank_b)
    # Usually broadcastable: copy b's trailing dims into a, then drop some to 1.
    if chance(rng, 0.7):
        for i in range(1, min(rank_a, rank_b) + 1):
            a[-i] = b[-i] if chance(rng, 0.8) else 1
    if math.prod(a) * max(1, math.prod(b)) > 4096 or math.prod(b) * max(1, math.prod(a)) > 4096:
        a, b = a[:3], b[:3]  # keep the arrays small; huge outputs come from the case below
    # A broadcast whose output cannot be allocated (2^40 elements), from small inputs.
    if chance(rng, 0.03) and not os.environ.get(NO_HUGE):
        a, b = [2**20, 1], [1, 2**20]
    dtypes = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_]
    weights = [0.3, 0.25, 0.2, 0.08, 0.07, 0.05, 0.05]
    dtype_a = dtypes[rng.choice(len(dtypes), p=weights)]
    dtype_b = dtype_a if chance(rng, 0.9) else dtypes[rng.choice(len(dtypes), p=weights)]
    inputs = ["A", "B"]
    if chance(rng, 0.06):
        inputs = [["A"], ["A", "B", "A"], ["A", ""], ["", "B"]][int(rng.integers(0, 4))]
    return {"a": a, "b": b, "dtype_a": dtype_a, "dtype_b": dtype_b, "inputs": inputs,
            "special": chance(rng, 0.15), "extra_attribute": chance(rng, 0.05)}  # fmt: skip


def broadcast_shape(a, b):
    try:
        return list(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        return None


def my_add_valid(cfg) -> bool:
    return (
        cfg["inputs"] == ["A", "B"]
        and cfg["dtype_a"] == cfg["dtype_b"]
        and cfg["dtype_a"] in FLOAT_DTYPES
        and broadcast_shape(cfg["a"], cfg["b"]) is not None
    )


def my_add_reference(a, b):
    compute = np.float32 if a.dtype == np.float16 else a.dtype
    with np.errstate(over="ignore", invalid="ignore"):
        return (2 * a.astype(compute) + b.astype(compute)).astype(a.dtype)


def same_values(got, want) -> bool:
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    return bool(np.array_equal(got, want, equal_nan=True))


# ---------------------------------------------------------------------------------------------------
# deform_conv2d: configurations, validity, reference


def deform_config(rng, symmetric_pads: bool) -> dict:
    """A valid small configuration, then (usually) one or more adversarial mutations."""
    groups, offset_groups = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    c = groups * offset_groups * int(rng.integers(1, 3))
    kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    cfg = {
        "n": int(rng.integers(0, 3)), "c": c, "h": int(rng.integers(1, 8)), "w": int(rng.integers(1, 8)),
        "c_out": groups * int(rng.integers(1, 3)), "kernel": [kh, kw],
        "strides": [int(rng.integers(1, 3)), int(rng.integers(1, 3))],
        "dilations": [int(rng.integers(1, 3)), int(rng.integers(1, 3))],
        "groups": groups, "offset_groups": offset_groups, "bias": chance(rng, 0.6), "mask": chance(rng, 0.6),
        "dtype": [np.float32, np.float64][int(rng.integers(0, 2))], "special": chance(rng, 0.1),
        "omit_attributes": [], "extra_inputs": 0, "empty_names": [],
    }  # fmt: skip
    p = [int(rng.integers(0, 3))] * 2 if symmetric_pads else [int(rng.integers(0, 3)) for _ in range(2)]
    cfg["pads"] = [p[0], p[1], p[0], p[1]] if symmetric_pads else [p[0], p[1], int(rng.integers(0, 3)), 0]
    out_h, out_w = deform_out_size(cfg)
    cfg["weight_shape"] = [cfg["c_out"], c // groups, kh, kw]
    taps = kh * kw
    cfg["offset_shape"] = [cfg["n"], 2 * offset_groups * taps, max(out_h, 1), max(out_w, 1)]
    cfg["mask_shape"] = [cfg["n"], offset_groups * taps, max(out_h, 1), max(out_w, 1)]
    cfg["bias_shape"] = [cfg["c_out"]]
    cfg["input_shape"] = [cfg["n"], c, cfg["h"], cfg["w"]]
    for _ in range(int(rng.choice([0, 0, 1, 1, 2, 3]))):
        mutate_deform(rng, cfg, symmetric_pads)
    return cfg


def deform_out_size(cfg):
    (sh, sw), (dh, dw), (kh, kw) = cfg["strides"][:2], cfg["dilations"][:2], cfg["kernel"][:2]
    pads = cfg["pads"]
    out_h = (cfg["h"] + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1 if sh > 0 else 0
    out_w = (cfg["w"] + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1 if sw > 0 else 0
    return out_h, out_w


def mutate_deform(rng, cfg, symmetric_pads: bool) -> None:
    kind = int(rng.integers(0, 15))
    value = lambda: int(rng.choice([0, -1, -2, 3, 5, *HUGE, -(2**63)]))  # noqa: E731
    if kind == 0:
        cfg["strides"] = [value(), cfg["strides"][-1]] if chance(rng, 0.7) else cfg["strides"][:1]
    elif kind == 1:
        cfg["dilations"] = [cfg["dilations"][0], value()] if chance(rng, 0.7) else cfg["dilations"] * 2
    elif kind == 2:
        pads = list(cfg["pads"])
        i = int(rng.integers(0, len(pads)))
        pads[i] = value()
        if symmetric_pads and len(pads) == 4:
            pads[(i + 2) % 4] = pads[i]
        cfg["pads"] = pads if chance(rng, 0.8) else pads[:3]
    elif kind == 3:
        cfg["groups"] = value() if chance(rng, 0.5) else cfg["groups"] + 1
    elif kind == 4:
        cfg["offset_groups"] = value() if chance(rng, 0.5) else cfg["offset_groups"] + 1
    elif kind == 5:  # offset of the wrong shape
        shape = list(cfg["offset_shape"]) or [1]
        shape[int(rng.integers(0, len(shape)))] += int(rng.choice([-1, 1, 2]))
        cfg["offset_shape"] = [max(0, d) for d in shape]
    elif kind == 6:
        shape = list(cfg["mask_shape"]) or [1]
        shape[int(rng.integers(0, len(shape)))] += int(rng.choice([-1, 1]))
        cfg["mask_shape"], cfg["mask"] = [max(0, d) for d in shape], True
    elif kind == 7:
        cfg["bias_shape"], cfg["bias"] = [cfg["c_out"] + int(rng.choice([-1, 1, 5]))], True
    elif kind == 8:  # a tensor of another rank (0 to 8)
        name = str(rng.choice(["input_shape", "weight_shape", "offset_shape", "mask_shape", "bias_shape"]))
        rank = int(rng.integers(0, 9))
        cfg[name] = [int(rng.integers(1, 3)) for _ in range(rank)]
        cfg["mask"] = cfg["mask"] or name == "mask_shape"
        cfg["bias"] = cfg["bias"] or name == "bias_shape"
    elif kind == 9:  # empty dimensions
        name = str(rng.choice(["input_shape", "weight_shape", "offset_shape"]))
        shape = list(cfg[name]) or [1]
        shape[int(rng.integers(0, len(shape)))] = 0
        cfg[name] = shape
    elif kind == 10:
        cfg["kernel_shape_attribute"] = [int(rng.integers(-1, 5)) for _ in range(int(rng.integers(0, 4)))]
    elif kind == 11:
        cfg["omit_attributes"] = list(rng.choice(["strides", "pads", "dilations", "group", "offset_group"], 2))
    elif kind == 12:
        cfg["dtype_w"] = [np.float32, np.float64, np.int32][int(rng.integers(0, 3))]
    elif kind == 13:  # an attribute of the wrong type (floats for integers); ORT only, torch's schema is typed
        cfg["float_attribute"] = str(rng.choice(["strides", "pads", "dilations", "group", "offset_group"]))
    else:
        choice = int(rng.integers(0, 3))
        if choice == 0:
            cfg["extra_inputs"] = 1
        elif choice == 1:
            cfg["empty_names"] = [str(rng.choice(["X", "W", "offset", "B", "mask"]))]
        else:
            cfg["input_shape"] = [1, 2**20, 2**20, 2**10]  # declared only: never allocated (see feeds)


def effective_attributes(cfg) -> dict:
    """The attributes as the op sees them, with ONNX DeformConv's defaults for omitted ones."""
    defaults = {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1, "offset_group": 1}
    given = {"strides": cfg["strides"], "pads": cfg["pads"], "dilations": cfg["dilations"],
             "group": cfg["groups"], "offset_group": cfg["offset_groups"]}  # fmt: skip
    return {k: (defaults[k] if k in cfg["omit_attributes"] else v) for k, v in given.items()}


def deform_valid(cfg, attributes: dict, use_bias: bool, use_mask: bool) -> bool:
    """ONNX DeformConv's (and torchvision's) constraints, written independently of the C++ checks."""
    x, w, o = cfg["input_shape"], cfg["weight_shape"], cfg["offset_shape"]
    if (
        cfg.get("dtype_w", cfg["dtype"]) != cfg["dtype"]
        or cfg["extra_inputs"]
        or cfg["empty_names"][:1] in (["X"], ["W"], ["offset"])
    ):
        return False
    if len(x) != 4 or len(w) != 4 or len(o) != 4:
        return False
    strides, pads, dilations = attributes["strides"], attributes["pads"], attributes["dilations"]
    groups, offset_groups = attributes["group"], attributes["offset_group"]
    if len(strides) != 2 or len(dilations) != 2 or len(pads) != 4:
        return False
    if min(strides) <= 0 or min(dilations) <= 0 or min(pads) < 0 or max(pads) > 2**40:
        return False
    n, c, h, wd = x
    c_out, c_per_group, kh, kw = w
    kernel_attr = cfg.get("kernel_shape_attribute")
    if kernel_attr is not None and kernel_attr != [] and kernel_attr != [kh, kw]:
        return False
    if kh <= 0 or kw <= 0 or c_out <= 0 or groups <= 0 or offset_groups <= 0:
        return False
    if c % groups or c_out % groups or c_per_group * groups != c or c % offset_groups:
        return False
    out_h = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    out_w = (wd + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    if (
        h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1 < 0
        or wd + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1 < 0
    ):
        return False
    if out_h <= 0 or out_w <= 0:
        return False
    if o != [n, 2 * offset_groups * kh * kw, out_h, out_w]:
        return False
    if use_mask and cfg["mask_shape"] != [n, offset_groups * kh * kw, out_h, out_w]:
        return False
    return not (use_bias and cfg["bias_shape"] != [c_out])


def deform_arrays(rng, cfg) -> dict | None:
    """Input arrays; None when a declared shape is too large to allocate (the model still gets built)."""
    shapes = {"X": cfg["input_shape"], "W": cfg["weight_shape"], "offset": cfg["offset_shape"],
              "B": cfg["bias_shape"], "mask": cfg["mask_shape"]}  # fmt: skip
    if any(math.prod(s) > 200_000 for s in shapes.values()):
        return None
    arrays = {}
    for name, shape in shapes.items():
        dtype = cfg.get("dtype_w", cfg["dtype"]) if name == "W" else cfg["dtype"]
        # No 1e30 here: sums of such terms cancel differently in float32 than in the float64 reference.
        arrays[name] = random_values(rng, shape, dtype, cfg["special"] and name != "W", huge=False)
        if name == "offset":
            arrays[name] = (arrays[name] * 1.5).astype(dtype)
        if name == "mask":
            arrays[name] = np.abs(arrays[name]).astype(dtype)
    return arrays


def deform_reference(arrays, attributes):
    from ort_cases.deform_conv2d import deform_conv2d_reference  # on sys.path once, at import

    x, w, offset = arrays["X"], arrays["W"], arrays["offset"]
    if x.shape[0] == 0:  # an empty batch: an empty output
        return np.zeros((0, w.shape[0], *offset.shape[2:]), dtype=x.dtype)
    with np.errstate(all="ignore"):
        return deform_conv2d_reference(
            arrays["X"], arrays["W"], arrays["offset"], arrays.get("B"), arrays.get("mask"),
            stride=attributes["strides"], pads=attributes["pads"], dilation=attributes["dilations"],
            groups=attributes["group"], offset_groups=attributes["offset_group"],
        )  # fmt: skip


def close_values(got, want, dtype) -> bool:
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    tol = 1e-4 if dtype == np.float32 else 1e-10
    return bool(np.allclose(got, want, rtol=tol, atol=tol, equal_nan=True))


# ---------------------------------------------------------------------------------------------------
# ms_deform_attn: configurations, validity, reference

MSDA_NAMES = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]


def msda_config(rng) -> dict:
    """Usually a valid problem, then a few of: wrong sizes in the level table (negative, huge, not tiling S,
    starts off by one), mismatched or wrong-rank shapes, empty dims, other dtypes, NaN/inf/far locations."""
    levels = int(rng.integers(1, 4))
    sizes = [[int(rng.integers(0, 5)), int(rng.integers(1, 6))] for _ in range(levels)]
    batch, queries, heads = int(rng.integers(0, 3)), int(rng.integers(0, 5)), int(rng.integers(1, 3))
    channels, points = int(rng.integers(0, 5)), int(rng.integers(1, 3))
    cfg = {"sizes": sizes, "starts": None, "keys": None, "batch": batch, "queries": queries, "heads": heads,
           "channels": channels, "points": points, "dtype": np.float32 if chance(rng, 0.6) else np.float64,
           "index_dtype": np.int64, "special": chance(rng, 0.3), "far": chance(rng, 0.3), "shape_edits": [],
           "inputs": list(MSDA_NAMES)}  # fmt: skip
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
        cfg["inputs"] = MSDA_NAMES[: int(rng.integers(0, 5))] if chance(rng, 0.5) else [*MSDA_NAMES, "value"]
    return cfg


def msda_arrays(rng, cfg) -> dict | None:
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


def msda_valid(cfg, arrays, allow_float16=False) -> bool:
    """Written from the op's definition: what a correct implementation must accept."""
    if cfg["inputs"] != MSDA_NAMES or cfg["index_dtype"] != np.int64:
        return False
    if cfg["dtype"] == np.float16 and not allow_float16:
        return False
    v, sizes, starts, loc, attn = (arrays[n] for n in MSDA_NAMES)
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


def msda_reference(arrays):
    from ort_cases.multi_scale_deformable_attention import ms_deform_attn_reference

    with np.errstate(over="ignore", invalid="ignore"):
        return ms_deform_attn_reference(*(arrays[n] for n in MSDA_NAMES))


# ---------------------------------------------------------------------------------------------------
# Targets: each returns (outcome, detail)


class OrtTargets:
    def __init__(self, library: str) -> None:
        import onnxruntime as ort

        self.ort, self.library = ort, library

    def _session(self, model):
        options = self.ort.SessionOptions()
        options.intra_op_num_threads = 2
        options.log_severity_level = 4  # rejections are expected: keep the log quiet
        options.register_custom_ops_library(self.library)
        return self.ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def my_add(self, rng, cfg):
        from onnx import helper

        elem = {np.float32: 1, np.float64: 11, np.float16: 10, np.int32: 6, np.int64: 7, np.uint8: 2, np.bool_: 9}
        a = random_values(rng, cfg["a"], cfg["dtype_a"], cfg["special"]) if math.prod(cfg["a"]) < 2**21 else None
        b = random_values(rng, cfg["b"], cfg["dtype_b"], cfg["special"]) if math.prod(cfg["b"]) < 2**21 else None
        attributes = {"unexpected": 3} if cfg["extra_attribute"] else {}
        node = helper.make_node("MyAdd", cfg["inputs"], ["C"], domain="opbridge", **attributes)
        declared = [("A", cfg["dtype_a"]), ("B", cfg["dtype_b"])]
        inputs = [helper.make_tensor_value_info(n, elem[d], None) for n, d in declared if n in cfg["inputs"]]
        graph = helper.make_graph(
            [node], "fuzz", inputs, [helper.make_tensor_value_info("C", elem[cfg["dtype_a"]], None)]
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)]
        )
        model.ir_version = 8
        try:
            session = self._session(model)
            feeds = {n: v for n, v in (("A", a), ("B", b)) if n in cfg["inputs"] and v is not None}
            (out,) = session.run(None, feeds)
        except Exception as error:
            return "rejected", str(error)[:200]
        if not my_add_valid(cfg):
            return "mismatch", "an invalid configuration was accepted"
        want = my_add_reference(a, b)
        return ("match", "") if same_values(out, want) else ("mismatch", f"values differ: {out!r} vs {want!r}"[:300])

    def deform_conv2d(self, rng, cfg):
        import onnx
        from onnx import helper

        elem = {np.float32: 1, np.float64: 11, np.int32: 6}
        attributes = effective_attributes(cfg)
        node_attributes = {k: v for k, v in attributes.items() if k not in cfg["omit_attributes"]}
        if "kernel_shape_attribute" in cfg:
            node_attributes["kernel_shape"] = cfg["kernel_shape_attribute"]
        wrong_type = cfg.get("float_attribute")
        if wrong_type in node_attributes:
            value = node_attributes[wrong_type]
            node_attributes[wrong_type] = [float(v) for v in value] if isinstance(value, list) else float(value)
        names = ["X", "W", "offset"] + (["B"] if cfg["bias"] or cfg["mask"] else []) + (["mask"] if cfg["mask"] else [])
        if names[3:4] == ["B"] and not cfg["bias"]:
            names[3] = ""  # B omitted by an empty name, mask given
        names = ["" if n in cfg["empty_names"] else n for n in names] + ["X"] * cfg["extra_inputs"]
        kernel_shape = node_attributes.pop("kernel_shape", None)
        node = helper.make_node("DeformConv2d", names, ["Y"], domain="opbridge", **node_attributes)
        if kernel_shape is not None:  # may be empty: typed explicitly
            node.attribute.append(
                helper.make_attribute("kernel_shape", kernel_shape, attr_type=onnx.AttributeProto.INTS)
            )
        dtypes = {"W": cfg.get("dtype_w", cfg["dtype"])}
        inputs = [helper.make_tensor_value_info(n, elem[dtypes.get(n, cfg["dtype"])], None)
                  for n in dict.fromkeys(names) if n]  # fmt: skip
        graph = helper.make_graph(
            [node], "fuzz", inputs, [helper.make_tensor_value_info("Y", elem[cfg["dtype"]], None)]
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)]
        )
        model.ir_version = 8
        arrays = deform_arrays(rng, cfg)
        try:
            session = self._session(model)
            if arrays is None:
                return "rejected", "declared shapes only (too large to feed); the model loaded"
            (out,) = session.run(None, {n: arrays[n] for n in dict.fromkeys(names) if n})
        except Exception as error:
            return "rejected", str(error)[:200]
        use_bias, use_mask = "B" in names, "mask" in names
        if wrong_type in node_attributes or not deform_valid(cfg, attributes, use_bias, use_mask):
            return "mismatch", "an invalid configuration was accepted"
        feeds = {k: v for k, v in arrays.items() if (k != "B" or use_bias) and (k != "mask" or use_mask)}
        want = deform_reference(feeds, attributes)
        ok = close_values(out, want, cfg["dtype"])
        return (
            ("match", "")
            if ok
            else ("mismatch", f"max error {np.nanmax(np.abs(out - want)) if out.shape == want.shape else 'shape'}")
        )

    def ms_deform_attn(self, rng, cfg):
        from onnx import helper

        elem = {np.float32: 1, np.float64: 11, np.float16: 10, np.int32: 6, np.int64: 7}
        arrays = msda_arrays(rng, cfg)
        if arrays is None:
            return "rejected", "skipped: shapes too large to feed"
        names = cfg["inputs"]
        node = helper.make_node("MultiScaleDeformableAttention", names, ["out"], domain="opbridge")
        inputs = [helper.make_tensor_value_info(n, elem[arrays[n].dtype.type], None) for n in dict.fromkeys(names)]
        graph = helper.make_graph(
            [node], "fuzz", inputs, [helper.make_tensor_value_info("out", elem[cfg["dtype"]], None)]
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)]
        )
        model.ir_version = 8
        try:
            session = self._session(model)
            (out,) = session.run(None, {n: arrays[n] for n in dict.fromkeys(names)})
        except Exception as error:
            return "rejected", str(error)[:200]
        if not msda_valid(cfg, arrays):
            return "mismatch", "an invalid configuration was accepted"
        want = msda_reference(arrays)
        return ("match", "") if close_values(out, want, cfg["dtype"]) else ("mismatch", "values differ")


def to_torch(array):
    """A tensor of the array's exact shape (np.ascontiguousarray would turn a 0-d array into shape (1,))."""
    import torch

    return torch.from_numpy(np.array(array, order="C", copy=True))


class TorchTargets:
    def __init__(self) -> None:
        import torch

        import opbridge  # noqa: F401  (registers torch.ops.opbridge)

        self.torch = torch

    def my_add(self, rng, cfg):
        torch = self.torch
        if math.prod(cfg["a"]) >= 2**21 or math.prod(cfg["b"]) >= 2**21:
            # Broadcast views of one element: huge shapes without memory.
            a = torch.zeros(1, dtype=torch.float32).expand(cfg["a"]) if all(d > 0 for d in cfg["a"]) else None
            b = torch.zeros(1, dtype=torch.float32).expand(cfg["b"]) if all(d > 0 for d in cfg["b"]) else None
            if a is None or b is None:
                return "rejected", "skipped: empty huge shape"
            try:
                torch.ops.opbridge.my_add(a, b)
            except Exception as error:
                return "rejected", str(error)[:200]
            return "mismatch", "a huge output was accepted"
        a = to_torch(random_values(rng, cfg["a"], cfg["dtype_a"], cfg["special"]))
        b = to_torch(random_values(rng, cfg["b"], cfg["dtype_b"], cfg["special"]))
        if chance(rng, 0.3) and a.dim() >= 2:  # a non-contiguous view with the same values
            a = a.transpose(0, 1).contiguous().transpose(0, 1)
        if chance(rng, 0.1) and b.dim() >= 1 and b.shape[-1] > 0:
            b = torch.cat([b, b], dim=-1)[..., ::2]
        args = [a, b]
        if cfg["inputs"] != ["A", "B"]:
            args = [a] if len(cfg["inputs"]) == 1 else [a, b, a]
        try:
            out = torch.ops.opbridge.my_add(*args)
        except Exception as error:
            return "rejected", str(error)[:200]
        if not my_add_valid(cfg):
            return "mismatch", "an invalid configuration was accepted"
        want = my_add_reference(a.numpy(), b.numpy())
        return ("match", "") if same_values(out.numpy(), want) else ("mismatch", "values differ")

    def deform_conv2d(self, rng, cfg):
        torch = self.torch
        arrays = deform_arrays(rng, cfg)
        if arrays is None:
            return "rejected", "skipped: declared shapes too large to allocate"
        attributes = effective_attributes(cfg)
        t = {k: to_torch(v) for k, v in arrays.items()}
        pads = attributes["pads"]
        padding = pads[:2] if len(pads) == 4 and pads[:2] == pads[2:] else pads[:2] + [1] * (len(pads) > 4)
        try:
            out = torch.ops.opbridge.deform_conv2d(
                t["X"], t["offset"], t["W"], t["B"] if cfg["bias"] else None, attributes["strides"], padding,
                attributes["dilations"], t["mask"] if cfg["mask"] else None,
            )  # fmt: skip
        except Exception as error:
            return "rejected", str(error)[:200]
        # torchvision's signature infers groups from the shapes; the attributes given only matter through them.
        x, w, o = cfg["input_shape"], cfg["weight_shape"], cfg["offset_shape"]
        inferred = dict(attributes, pads=[*padding, *padding])
        if len(x) == 4 and len(w) == 4 and len(o) == 4 and w[1] > 0 and w[2] * w[3] > 0:
            inferred["group"] = x[1] // w[1] if x[1] % w[1] == 0 else -1
            inferred["offset_group"] = o[1] // (2 * w[2] * w[3]) if o[1] % (2 * w[2] * w[3]) == 0 else -1
        plain = dict(cfg, extra_inputs=0, empty_names=[], omit_attributes=[], kernel_shape_attribute=None)
        plain.pop("kernel_shape_attribute")
        if not deform_valid(plain, inferred, cfg["bias"], cfg["mask"]):
            return "mismatch", "an invalid configuration was accepted"
        feeds = {k: v for k, v in arrays.items() if (k != "B" or cfg["bias"]) and (k != "mask" or cfg["mask"])}
        want = deform_reference(feeds, inferred)
        return ("match", "") if close_values(out.numpy(), want, cfg["dtype"]) else ("mismatch", "values differ")

    def ms_deform_attn(self, rng, cfg):
        arrays = msda_arrays(rng, cfg)
        if arrays is None:
            return "rejected", "skipped: shapes too large to allocate"
        t = {k: to_torch(v) for k, v in arrays.items()}
        args = [t[n] for n in cfg["inputs"]]
        try:
            out = self.torch.ops.opbridge.ms_deform_attn(*args)
        except Exception as error:
            return "rejected", str(error)[:200]
        # The torch op takes the level table in any integer dtype.
        if not msda_valid(dict(cfg, index_dtype=np.int64), arrays):
            return "mismatch", "an invalid configuration was accepted"
        want = msda_reference(arrays)
        return ("match", "") if close_values(out.numpy(), want, cfg["dtype"]) else ("mismatch", "values differ")


def run_case(targets, target: str, seed: int, case: int):
    rng = case_rng(seed, target, case)
    kind, op = target.split(".")
    if op == "MyAdd" or op == "my_add":
        cfg = my_add_config(rng)
        return cfg, (targets.my_add(rng, cfg))
    if op == "MultiScaleDeformableAttention" or op == "ms_deform_attn":
        cfg = msda_config(rng)
        return cfg, targets.ms_deform_attn(rng, cfg)
    cfg = deform_config(rng, symmetric_pads=(kind == "torch"))
    return cfg, targets.deform_conv2d(rng, cfg)


def make_targets(target: str, library: str | None):
    if target.startswith("ort."):
        return OrtTargets(library)
    return TorchTargets()


# ---------------------------------------------------------------------------------------------------
# Worker and driver


def worker(target: str, seed: int, start: int, count: int, library: str | None) -> int:
    targets = make_targets(target, library)
    for case in range(start, start + count):
        print(f"start {case}", flush=True)
        try:
            _, (outcome, detail) = run_case(targets, target, seed, case)
        except Exception:  # a bug of this harness, not of the op: reported as such
            import traceback

            outcome, detail = "harness-error", traceback.format_exc()[-600:]
        print(f"done {case} {outcome} {json.dumps(detail)}", flush=True)
    return 0


def drive(target: str, seed: int, cases: int, library: str | None, batch: int, timeout: float, env) -> dict:
    counts, failures = Counter(), []
    case, started = 0, time.perf_counter()
    while case < cases:
        count = min(batch, cases - case)
        command = [sys.executable, __file__, "--worker", target, "--seed", str(seed), "--start", str(case),
                   "--count", str(count)] + (["--library", library] if library else [])  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
            stdout, stderr, code, hung = done.stdout, done.stderr, done.returncode, False
        except subprocess.TimeoutExpired as expired:
            stdout = (expired.stdout or b"").decode() if isinstance(expired.stdout, bytes) else expired.stdout or ""
            stderr, code, hung = "", None, True
        last_started, finished = None, set()
        for line in stdout.splitlines():
            parts = line.split(" ", 3)
            if parts[0] == "start":
                last_started = int(parts[1])
            elif parts[0] == "done":
                finished.add(int(parts[1]))
                counts[parts[2]] += 1
                if parts[2] not in ("match", "rejected"):
                    failures.append({"target": target, "case": int(parts[1]), "outcome": parts[2],
                                     "detail": json.loads(parts[3])})  # fmt: skip
        if code == 0 and len(finished) == count:
            case += count
            continue
        # The worker died or hung in the case it started last: record it, go on after it.
        culprit = last_started if last_started is not None and last_started not in finished else case + len(finished)
        outcome = "hang" if hung else "crash"
        counts[outcome] += 1
        lines = stderr.strip().splitlines()
        # The sanitizer's report when there is one (its first lines say what and where), else the end.
        report = next((i for i, line in enumerate(lines) if "runtime error" in line or "ERROR: " in line), None)
        tail = "\n".join(lines[report : report + 12] if report is not None else lines[-12:])
        failures.append({"target": target, "case": culprit, "outcome": outcome, "returncode": code, "stderr": tail})
        print(f"  {target} case {culprit}: {outcome} (exit {code})\n{tail}", flush=True)
        case = culprit + 1
    elapsed = time.perf_counter() - started
    print(f"{target:20} {cases} cases in {elapsed:6.1f} s: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
          flush=True)  # fmt: skip
    return {"target": target, "cases": cases, "seconds": round(elapsed, 1), "counts": dict(counts),
            "failures": failures}  # fmt: skip


def default_library() -> str | None:
    try:
        import opbridge_ort

        return opbridge_ort.library_path()
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000, help="cases per target (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--targets", nargs="+", choices=ORT_TARGETS + TORCH_TARGETS)
    parser.add_argument("--library", help="libopbridge_ort.so (default: opbridge_ort.library_path())")
    parser.add_argument("--batch", type=int, default=250, help="cases per worker process")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per batch before it counts as a hang")
    parser.add_argument("--json", type=Path, help="write counts and failures here")
    parser.add_argument("--no-huge-allocations", action="store_true", help="no terabyte outputs (for ASan runs)")
    parser.add_argument("--replay", help="TARGET:SEED:CASE -- run one case here and print it")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    library = args.library or os.environ.get("OPBRIDGE_ORT_LIBRARY") or default_library()
    if args.no_huge_allocations:
        os.environ[NO_HUGE] = "1"  # inherited by the workers
    if args.worker:
        return worker(args.worker, args.seed, args.start, args.count, library)
    if args.replay:
        target, seed, case = args.replay.split(":")
        cfg, result = run_case(make_targets(target, library), target, int(seed), int(case))
        print(json.dumps(cfg, default=str, indent=1), "\n", result)
        return 0
    targets = args.targets or ORT_TARGETS + (TORCH_TARGETS if _has_torch() else [])
    if any(t.startswith("ort.") for t in targets) and library is None:
        parser.error("no ORT library: pass --library or install opbridge_ort")
    print(f"fuzz: seed {args.seed}, {args.cases} cases per target: {', '.join(targets)}", flush=True)
    results = [drive(t, args.seed, args.cases, library, args.batch, args.timeout, os.environ.copy()) for t in targets]
    failures = [f for r in results for f in r["failures"]]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"seed": args.seed, "results": results}, indent=1, default=str))
    for failure in failures[:20]:
        print(f"FAILED {failure['target']} case {failure['case']}: {failure['outcome']} "
              f"(replay: python tests/fuzz.py --replay {failure['target']}:{args.seed}:{failure['case']})")  # fmt: skip
    print(f"fuzz: {sum(r['cases'] for r in results)} cases, {len(failures)} failures")
    return 1 if failures else 0


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("opbridge") is not None


if __name__ == "__main__":
    sys.exit(main())
