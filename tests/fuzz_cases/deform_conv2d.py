"""Fuzz targets of deform_conv2d (``ort.DeformConv2d``, ``torch.deform_conv2d``): a valid small configuration,
then mutations: strides, dilations, pads and group counts negative, zero, huge or of the wrong length; tensors of
the wrong shape, rank 0 to 8, or with empty dimensions; a kernel_shape attribute that disagrees; attributes
omitted or of the wrong type; a weight of another dtype; extra and empty-named inputs; declared shapes too large
to allocate; NaN and infinite values."""

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

ORT_NODE = "DeformConv2d"
#: Other projects' names of the node, run by the same kernel and checks (tests/ort_cases cover their
#: attribute forms).
ORT_ALIASES = [
    "mmcv::MMCVModulatedDeformConv2d",
    "mmdeploy::MMCVModulatedDeformConv2d",
    "mmcv::MMCVDeformConv2d",
    "mmdeploy::MMCVDeformConv2d",
]


def config(rng, kind: str) -> dict:
    """A valid small configuration, then (usually) one or more adversarial mutations. The torch op takes
    symmetric padding (torchvision's signature), the ONNX node four pads."""
    symmetric_pads = kind == "torch"
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
    out_h, out_w = out_size(cfg)
    cfg["weight_shape"] = [cfg["c_out"], c // groups, kh, kw]
    taps = kh * kw
    cfg["offset_shape"] = [cfg["n"], 2 * offset_groups * taps, max(out_h, 1), max(out_w, 1)]
    cfg["mask_shape"] = [cfg["n"], offset_groups * taps, max(out_h, 1), max(out_w, 1)]
    cfg["bias_shape"] = [cfg["c_out"]]
    cfg["input_shape"] = [cfg["n"], c, cfg["h"], cfg["w"]]
    for _ in range(int(rng.choice([0, 0, 1, 1, 2, 3]))):
        mutate(rng, cfg, symmetric_pads)
    return cfg


def out_size(cfg):
    (sh, sw), (dh, dw), (kh, kw) = cfg["strides"][:2], cfg["dilations"][:2], cfg["kernel"][:2]
    pads = cfg["pads"]
    out_h = (cfg["h"] + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1 if sh > 0 else 0
    out_w = (cfg["w"] + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1 if sw > 0 else 0
    return out_h, out_w


def mutate(rng, cfg, symmetric_pads: bool) -> None:
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


def inferred_groups(cfg, attributes: dict) -> tuple[int, int]:
    """(group, offset_group): a count of 0 is inferred by the node from the shapes (the custom lowering writes 0
    when the exporter does not know it), group from the input and weight channels, offset_group from the
    offset's channels."""
    (_, c, _, _), (_, c_per_group, kh, kw), o = cfg["input_shape"], cfg["weight_shape"], cfg["offset_shape"]
    groups, offset_groups = attributes["group"], attributes["offset_group"]
    if groups == 0 and c_per_group > 0 and c % c_per_group == 0:
        groups = c // c_per_group
    if offset_groups == 0 and kh * kw > 0 and len(o) == 4 and o[1] % (2 * kh * kw) == 0:
        offset_groups = o[1] // (2 * kh * kw)
    return groups, offset_groups


def valid(cfg, attributes: dict, use_bias: bool, use_mask: bool) -> bool:
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
    groups, offset_groups = inferred_groups(cfg, attributes)
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


def input_arrays(rng, cfg) -> dict | None:
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


def reference(arrays, attributes):
    from ort_cases.deform_conv2d import deform_conv2d_reference  # tests/ is on sys.path

    x, w, offset = arrays["X"], arrays["W"], arrays["offset"]
    if x.shape[0] == 0:  # an empty batch: an empty output
        return np.zeros((0, w.shape[0], *offset.shape[2:]), dtype=x.dtype)
    with np.errstate(all="ignore"):
        return deform_conv2d_reference(
            arrays["X"], arrays["W"], arrays["offset"], arrays.get("B"), arrays.get("mask"),
            stride=attributes["strides"], pads=attributes["pads"], dilation=attributes["dilations"],
            groups=attributes["group"], offset_groups=attributes["offset_group"],
        )  # fmt: skip


def run_ort(session, rng, cfg):
    import onnx
    from onnx import helper

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
        node.attribute.append(helper.make_attribute("kernel_shape", kernel_shape, attr_type=onnx.AttributeProto.INTS))
    dtypes = {"W": cfg.get("dtype_w", cfg["dtype"])}
    inputs = [tensor_info(n, dtypes.get(n, cfg["dtype"])) for n in dict.fromkeys(names) if n]
    model = one_node_model(node, inputs, [tensor_info("Y", cfg["dtype"])])
    arrays = input_arrays(rng, cfg)
    try:
        loaded = session(model)
        if arrays is None:
            return "rejected", "declared shapes only (too large to feed); the model loaded"
        (out,) = loaded.run(None, {n: arrays[n] for n in dict.fromkeys(names) if n})
    except Exception as error:
        return rejected(error)
    use_bias, use_mask = "B" in names, "mask" in names
    if wrong_type in node_attributes or not valid(cfg, attributes, use_bias, use_mask):
        return INVALID_ACCEPTED
    feeds = {k: v for k, v in arrays.items() if (k != "B" or use_bias) and (k != "mask" or use_mask)}
    groups, offset_groups = inferred_groups(cfg, attributes)
    want = reference(feeds, {**attributes, "group": groups, "offset_group": offset_groups})
    if close_values(out, want, cfg["dtype"]):
        return MATCH
    return "mismatch", f"max error {np.nanmax(np.abs(out - want)) if out.shape == want.shape else 'shape'}"


def run_torch(rng, cfg):
    import torch

    arrays = input_arrays(rng, cfg)
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
        return rejected(error)
    # torchvision's signature infers groups from the shapes; the attributes given only matter through them.
    x, w, o = cfg["input_shape"], cfg["weight_shape"], cfg["offset_shape"]
    inferred = dict(attributes, pads=[*padding, *padding])
    if len(x) == 4 and len(w) == 4 and len(o) == 4 and w[1] > 0 and w[2] * w[3] > 0:
        inferred["group"] = x[1] // w[1] if x[1] % w[1] == 0 else -1
        inferred["offset_group"] = o[1] // (2 * w[2] * w[3]) if o[1] % (2 * w[2] * w[3]) == 0 else -1
    plain = dict(cfg, extra_inputs=0, empty_names=[], omit_attributes=[], kernel_shape_attribute=None)
    plain.pop("kernel_shape_attribute")
    if not valid(plain, inferred, cfg["bias"], cfg["mask"]):
        return INVALID_ACCEPTED
    feeds = {k: v for k, v in arrays.items() if (k != "B" or cfg["bias"]) and (k != "mask" or cfg["mask"])}
    want = reference(feeds, inferred)
    return MATCH if close_values(out.numpy(), want, cfg["dtype"]) else ("mismatch", "values differ")
