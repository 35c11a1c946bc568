"""Fuzz targets of box_iou_rotated (``ort.BoxIouRotated``, ``torch.box_iou_rotated``): 0 to 12 boxes, identical,
zero- and negative-size ones; NaN, infinite and huge (1e30) numbers; wrong ranks and last dims, unequal counts
with aligned, other and mixed dtypes; bad attributes (mode 2, a float for an int, a flag of 3); missing,
empty-named and extra inputs."""

from __future__ import annotations

import math

import numpy as np

from ._common import INVALID_ACCEPTED, MATCH, chance, close_values, rejected, run_one_node, to_torch

ORT_NODE = "BoxIouRotated"
NAMES = ["boxes1", "boxes2"]
FLOATS = [np.float32, np.float64]
SPECIAL = [np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, -2.0]


def config(rng, kind: str) -> dict:
    n = int(rng.integers(0, 13))
    m = n if chance(rng, 0.5) else int(rng.integers(0, 13))
    dtype = FLOATS[int(rng.integers(0, 2))]
    cfg = {"shapes": [[n, 5], [m, 5]], "dtypes": [dtype, dtype], "special": chance(rng, 0.25), "inputs": list(NAMES),
           "attrs": {"mode": int(rng.integers(0, 2)), "aligned": int(chance(rng, 0.4)),
                     "clockwise": int(chance(rng, 0.5))}}  # fmt: skip
    if chance(rng, 0.1):  # a wrong rank or last dim
        which = int(rng.integers(0, 2))
        cfg["shapes"][which] = [[n], [n, 4], [n, 6], [n, 5, 1], []][int(rng.integers(0, 5))]
    if chance(rng, 0.08):
        cfg["dtypes"][int(rng.integers(0, 2))] = [np.float16, np.int32, np.int64, np.float64][int(rng.integers(0, 4))]
    if chance(rng, 0.1):
        name = ["mode", "aligned", "clockwise"][int(rng.integers(0, 3))]
        cfg["attrs"][name] = [2, -1, 3, 0.5, 1.0, None][int(rng.integers(0, 6))]
    if kind == "ort" and chance(rng, 0.06):
        cfg["inputs"] = [["boxes1"], ["boxes1", ""], ["", "boxes2"], ["boxes1", "boxes2", "boxes1"]][
            int(rng.integers(0, 4))
        ]
    return cfg


def random_boxes(rng, shape, dtype, special):
    if len(shape) != 2 or shape[1] != 5:
        values = rng.standard_normal(shape) * 3
    else:
        count = shape[0]
        values = np.concatenate([rng.uniform(0, 8, (count, 2)), rng.uniform(0.2, 6, (count, 2)),
                                 rng.uniform(-math.pi, math.pi, (count, 1))], axis=1)  # fmt: skip
        if special and count:
            flat = values.reshape(-1)
            picks = rng.integers(0, flat.size, size=max(1, flat.size // 8))
            flat[picks] = rng.choice(SPECIAL, size=picks.size)
    return values.astype(dtype)


def valid(cfg, kind) -> bool:
    (s1, s2), (d1, d2), attrs = cfg["shapes"], cfg["dtypes"], cfg["attrs"]
    if cfg["inputs"] != NAMES or d1 != d2 or d1 not in FLOATS:
        return False
    if len(s1) != 2 or len(s2) != 2 or s1[1] != 5 or s2[1] != 5:
        return False
    flags = {k: (v if v is not None or kind == "torch" else {"mode": 0, "aligned": 0, "clockwise": 1}[k])
             for k, v in attrs.items()}  # fmt: skip
    if any(type(v) is not int for v in flags.values()) or flags["mode"] not in (0, 1):
        return False
    if flags["aligned"] not in (0, 1) or flags["clockwise"] not in (0, 1):
        return False
    return not flags["aligned"] or s1[0] == s2[0]


def _polygon(box):
    cx, cy, w, h, angle = box
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + c * u - s * v, cy + s * u + c * v) for u, v in ((-w / 2, -h / 2), (w / 2, -h / 2),
                                                                  (w / 2, h / 2), (-w / 2, h / 2))]  # fmt: skip


def _clip(subject, clip):
    """Sutherland-Hodgman: the part of `subject` inside the convex counter-clockwise polygon `clip`."""
    out = subject
    for i in range(len(clip)):
        (ax, ay), (bx, by) = clip[i], clip[(i + 1) % len(clip)]
        points, out = out, []
        for j in range(len(points)):
            p, q = points[j], points[(j + 1) % len(points)]
            sp = (bx - ax) * (p[1] - ay) - (by - ay) * (p[0] - ax)
            sq = (bx - ax) * (q[1] - ay) - (by - ay) * (q[0] - ax)
            if sp >= 0:
                out.append(p)
            if (sp >= 0) != (sq >= 0):
                t = sp / (sp - sq)
                out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
        if not out:
            return []
    return out


def overlap(a, b, mode: int, clockwise: bool) -> float:
    """One pair in float64, relative to a's center; NaN for a non-finite number, 0 for an area below 1e-14."""
    if not all(math.isfinite(v) for v in (*a, *b)):
        return math.nan
    area1, area2 = a[2] * a[3], b[2] * b[3]
    if area1 < 1e-14 or area2 < 1e-14:
        return 0.0
    sign = 1.0 if clockwise else -1.0
    pa = _polygon([0.0, 0.0, a[2], a[3], sign * a[4]])
    pb = _polygon([b[0] - a[0], b[1] - a[1], b[2], b[3], sign * b[4]])
    poly = _clip(pb, pa)
    inter = abs(0.5 * sum(p[0] * q[1] - q[0] * p[1] for p, q in zip(poly, poly[1:] + poly[:1], strict=True)))
    return inter / area1 if mode == 1 else inter / (area1 + area2 - inter)


def check(out, b1, b2, mode, aligned, clockwise):
    """Values against the reference; pairs with a huge number (ill-conditioned corners) only need [0, 1]."""
    a, b = b1.astype(np.float64).tolist(), b2.astype(np.float64).tolist()
    pairs = list(zip(a, b, strict=True)) if aligned else [(x, y) for x in a for y in b]
    want = np.array([overlap(x, y, mode, clockwise) for x, y in pairs], np.float64)
    huge = np.array([any(abs(v) >= 1e15 and math.isfinite(v) for v in (*x, *y)) for x, y in pairs], bool)
    got = out.reshape(-1).astype(np.float64)
    shape = (len(a),) if aligned else (len(a), len(b))
    if out.shape != shape or out.dtype != b1.dtype:
        return ("mismatch", f"shape or dtype {out.shape} {out.dtype}, want {shape} {b1.dtype}")
    if huge.any():
        g = got[huge & ~np.isnan(want)]
        if not (np.isfinite(g).all() and (g >= -1e-6).all() and (g <= 1 + 1e-4).all()):
            return ("mismatch", f"a ratio outside [0, 1] for huge boxes: {g!r}"[:300])
    keep = ~huge
    if not close_values(got[keep].astype(b1.dtype), want[keep].astype(b1.dtype), b1.dtype.type):
        bad = np.flatnonzero(~np.isclose(got[keep], want[keep], rtol=1e-4, atol=1e-4, equal_nan=True))[:3]
        return ("mismatch", f"values differ at {bad}: {got[keep][bad]} vs {want[keep][bad]}")
    return MATCH


def flag(attrs, name, default):
    return default if attrs[name] is None else attrs[name]


def run_ort(session, rng, cfg):

    shapes, dtypes = cfg["shapes"], cfg["dtypes"]
    arrays = {n: random_boxes(rng, s, d, cfg["special"]) for n, s, d in zip(NAMES, shapes, dtypes, strict=True)}
    attrs = {k: v for k, v in cfg["attrs"].items() if v is not None}
    out, refused = run_one_node(session, "BoxIouRotated", cfg["inputs"], arrays, attrs, cfg["dtypes"][0])
    if refused:
        return refused
    if not valid(cfg, "ort"):
        return INVALID_ACCEPTED
    a = cfg["attrs"]
    return check(out, arrays["boxes1"], arrays["boxes2"], flag(a, "mode", 0), flag(a, "aligned", 0),
                 flag(a, "clockwise", 1))  # fmt: skip


def run_torch(rng, cfg):
    import torch

    arrays = [random_boxes(rng, s, d, cfg["special"]) for s, d in zip(cfg["shapes"], cfg["dtypes"], strict=True)]
    a = cfg["attrs"]
    mode = flag(a, "mode", 0)
    aligned, clockwise = bool(flag(a, "aligned", 0)), bool(flag(a, "clockwise", 1))
    try:
        out = torch.ops.opbridge.box_iou_rotated(to_torch(arrays[0]), to_torch(arrays[1]), mode, aligned, clockwise)
    except Exception as error:
        return rejected(error)
    # The torch op's flags are bools: only the mode can be out of range.
    if not valid(dict(cfg, attrs={"mode": mode, "aligned": int(aligned), "clockwise": int(clockwise)}), "torch"):
        return INVALID_ACCEPTED
    return check(out.numpy(), arrays[0], arrays[1], mode, aligned, clockwise)
