"""Overlaps of rotated boxes: opbridge::box_iou_rotated (mmcv's ``box_iou_rotated``).

The op's pieces, each named after it: the kernel (cpp/kernels/box_iou_rotated.h, the exact intersection of two
rotated rectangles, shared with nms_rotated), its schema and CPU adapter (cpp/torch/box_iou_rotated.cpp), its CUDA
adapter (cpp/cuda/box_iou_rotated.cu), its ORT adapter (cpp/ort/box_iou_rotated.cc, ``opbridge::BoxIouRotated``),
and this module.

Lowerings: ``custom``, one ``opbridge::BoxIouRotated`` node (any opset); ``standard``, the same intersection from
standard ops (opset >= 11): each edge of one box clipped against the other box's four half-planes, the clipped
pieces summed by Green's theorem. It materialises [N, M, 4, 4] tensors (about 40 floats per pair and temporary):
fine for the few hundred boxes of a detection head, memory-bound for thousands (the custom node computes pairs
one at a time).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import _autocast, _checks, specs
from .roi_align_rotated import float64_cos_gap

__all__ = ["box_iou_rotated"]
NN_MODULES: list[str] = []

_OP = "opbridge.box_iou_rotated"
_MODES = ("iou", "iof")


def box_iou_rotated(
    boxes1: Tensor, boxes2: Tensor, mode: str = "iou", aligned: bool = False, clockwise: bool = True
) -> Tensor:
    """IoU (or IoF) of rotated boxes: mmcv's ``box_iou_rotated``.

    Args:
        boxes1: ``[N, 5]`` boxes ``(cx, cy, w, h, angle)``, angle in radians.
        boxes2: ``[M, 5]``, same layout and dtype.
        mode: ``"iou"`` (intersection over union) or ``"iof"`` (intersection over the area of the box of
            ``boxes1``).
        aligned: pairs ``(boxes1[i], boxes2[i])`` only (N == M), giving ``[N]``.
        clockwise: whether a positive angle turns the box clockwise in image coordinates (y down), mmcv's default;
            ``False`` negates the angles first. detectron2's boxes (degrees, counter-clockwise):
            ``box_iou_rotated(b1r, b2r, clockwise=False)`` with the angles in radians
            (``b[:, 4] = torch.deg2rad(b[:, 4])``).

    Returns:
        ``[N, M]`` (``[N]`` when aligned) of the boxes' dtype. A box of area below 1e-14 (zero or negative size)
        overlaps nothing (0); a box with a NaN or infinite number gives NaN.

    Raises:
        TypeError: a box set is not a tensor.
        ValueError: ``mode`` is not "iou" or "iof".
        RuntimeError: shapes are not ``[*, 5]``, dtypes differ or are not float32/float64/float16/bfloat16, the
            tensors are on different devices, or ``aligned`` with different box counts.

    Exact polygon intersection, computed in float64 whatever the dtype, on the CPU and on CUDA (the same
    functions). Not differentiable (like mmcv's).
    Exports to one ``opbridge::BoxIouRotated`` node or to standard ops (opset >= 11; see :mod:`opbridge.onnx`).
    """
    if not torch.jit.is_scripting():
        _checks.tensor(_OP, "boxes1", boxes1)
        _checks.tensor(_OP, "boxes2", boxes2)
        if mode not in _MODES:
            raise ValueError(f"{_OP}: mode must be 'iou' or 'iof', got '{mode}'")
    flag = 1 if mode == "iof" else 0
    return torch.ops.opbridge.box_iou_rotated(boxes1, boxes2, flag, bool(aligned), bool(clockwise))


@torch.library.register_fake("opbridge::box_iou_rotated")
def _box_iou_rotated_fake(boxes1, boxes2, mode=0, aligned=False, clockwise=True):
    # Defaults as in the schema: tracers drop trailing arguments left at their defaults.
    op = "opbridge::box_iou_rotated"
    _checks.one_device(op, boxes1=boxes1, boxes2=boxes2)
    torch._check(
        boxes1.dim() == 2 and boxes1.shape[1] == 5 and boxes2.dim() == 2 and boxes2.shape[1] == 5,
        lambda: f"{op}: boxes must have shape [boxes, 5], got {tuple(boxes1.shape)} and {tuple(boxes2.shape)}",
    )
    _checks.float_storage(op, "boxes1", boxes1)
    torch._check(boxes1.dtype == boxes2.dtype, lambda: f"{op}: boxes1 and boxes2 must have the same dtype")
    if aligned:
        torch._check(boxes1.shape[0] == boxes2.shape[0], lambda: f"{op}: aligned=True needs as many boxes in both")
        return boxes1.new_empty((boxes1.shape[0],))
    return boxes1.new_empty((boxes1.shape[0], boxes2.shape[0]))


AUTOCAST = _autocast.Rule("float32", like=0)
_autocast.register("opbridge::box_iou_rotated", AUTOCAST)


# --- ONNX ------------------------------------------------------------------------------------------------------------


def _flags(b, mode, aligned, clockwise) -> tuple[int, bool, bool]:
    return int(b.value(mode, "i")), bool(b.value(aligned, "b")), bool(b.value(clockwise, "b"))


def _out_sizes(b, boxes1, boxes2, aligned: bool) -> list[int | None]:
    s1, s2 = b.static_shape(boxes1), b.static_shape(boxes2)
    rows = s1[0] if s1 is not None and len(s1) == 2 else None
    cols = s2[0] if s2 is not None and len(s2) == 2 else None
    return [rows] if aligned else [rows, cols]


def _custom(b, boxes1, boxes2, mode=0, aligned=False, clockwise=True):
    # Defaults as in the schema: the dynamo exporter drops trailing arguments left at their defaults.
    mode, aligned, clockwise = _flags(b, mode, aligned, clockwise)
    out = b.op(
        "BoxIouRotated",
        boxes1,
        boxes2,
        domain=specs.CUSTOM_DOMAIN,
        mode=mode,
        aligned=int(aligned),
        clockwise=int(clockwise),
    )
    b.set_type(out, boxes1, _out_sizes(b, boxes1, boxes2, aligned))
    return out


def _standard(b, boxes1, boxes2, mode=0, aligned=False, clockwise=True):
    """The intersection by Green's theorem from standard ops: see cpp/kernels/box_iou_rotated.h for the method
    (this is its vectorised form, in the boxes' dtype, relative to the first box's center)."""
    mode, aligned, clockwise = _flags(b, mode, aligned, clockwise)
    i64 = b.constant
    float32 = b.dtype(boxes1) == torch.float32

    def const(value: float):
        return b.constant_like(value, boxes1)

    def column(boxes, index):
        return b.op("Gather", boxes, i64(index), axis=1)  # [K]

    def corners(boxes):
        """[K, 4] x and y of the corners relative to the center (counter-clockwise in a y-up frame), [K] area."""
        w, h, angle = column(boxes, 2), column(boxes, 3), column(boxes, 4)
        if not clockwise:
            angle = b.op("Neg", angle)
        cos, sin = (b.unsqueeze(v, 1) for v in b.cos_sin(angle, like=boxes))
        ux = b.op("Mul", b.unsqueeze(w, 1), b.tensor(torch.tensor([[-0.5, 0.5, 0.5, -0.5]], dtype=b.dtype(boxes))))
        uy = b.op("Mul", b.unsqueeze(h, 1), b.tensor(torch.tensor([[-0.5, -0.5, 0.5, 0.5]], dtype=b.dtype(boxes))))
        x = b.op("Sub", b.op("Mul", cos, ux), b.op("Mul", sin, uy))
        y = b.op("Add", b.op("Mul", sin, ux), b.op("Mul", cos, uy))
        return x, y, b.op("Mul", w, h)

    ax, ay, area1 = corners(boxes1)
    bx, by, area2 = corners(boxes2)
    # Both boxes' corners over the pairs, in a frame centered on the box of boxes1: [N, 4] (aligned) or [N, M, 4].
    if aligned:
        dx = b.unsqueeze(b.op("Sub", column(boxes2, 0), column(boxes1, 0)), 1)
        dy = b.unsqueeze(b.op("Sub", column(boxes2, 1), column(boxes1, 1)), 1)
        area1_p, area2_p = area1, area2
    else:
        dx = b.unsqueeze(b.op("Sub", b.unsqueeze(column(boxes2, 0), 0), b.unsqueeze(column(boxes1, 0), 1)), 2)
        dy = b.unsqueeze(b.op("Sub", b.unsqueeze(column(boxes2, 1), 0), b.unsqueeze(column(boxes1, 1), 1)), 2)
        ax, ay, bx, by = b.unsqueeze(ax, 1), b.unsqueeze(ay, 1), b.unsqueeze(bx, 0), b.unsqueeze(by, 0)
        area1_p, area2_p = b.unsqueeze(area1, 1), b.unsqueeze(area2, 0)
    bx, by = b.op("Add", bx, dx), b.op("Add", by, dy)
    rank = 2 if aligned else 3  # the corner axis is rank - 1
    # Distances below this count as zero (a piece on the other box's edge), relative to the box's size.
    scale = b.op(
        "Add",
        b.reduce("Max", b.op("Abs", ax), [rank - 1], keepdims=True),
        b.reduce("Max", b.op("Abs", ay), [rank - 1], keepdims=True),
    )
    tolerance = b.unsqueeze(b.op("Mul", scale, const(1e-6 if float32 else 1e-10)), rank)
    if not aligned:
        ax, ay = b.op("Expand", ax, b.op("Shape", bx)), b.op("Expand", ay, b.op("Shape", by))

    def boundary_inside(px, py, qx, qy, owns_shared: bool):
        """Twice the area swept by p's boundary inside q: each edge of p (axis rank - 1) clipped against each
        half-plane of q (axis rank), the surviving piece [t0, t1] of the edge summed as cross(start, end)."""
        roll = i64([1, 2, 3, 0])
        dx_, dy_ = (b.op("Sub", b.op("Gather", v, roll, axis=rank - 1), v) for v in (px, py))
        ex, ey = (b.op("Sub", b.op("Gather", v, roll, axis=rank - 1), v) for v in (qx, qy))
        epx, epy, edx, edy = (b.unsqueeze(v, rank) for v in (px, py, dx_, dy_))
        hqx, hqy, hex_, hey = (b.unsqueeze(v, rank - 1) for v in (qx, qy, ex, ey))
        f0 = b.op("Sub", b.op("Mul", hex_, b.op("Sub", epy, hqy)), b.op("Mul", hey, b.op("Sub", epx, hqx)))
        fd = b.op("Sub", b.op("Mul", hex_, edy), b.op("Mul", hey, edx))
        e_length = b.op("Sqrt", b.op("Add", b.op("Mul", hex_, hex_), b.op("Mul", hey, hey)))
        d_length = b.op("Sqrt", b.op("Add", b.op("Mul", edx, edx), b.op("Mul", edy, edy)))
        limit = b.op("Mul", const(1e-6 if float32 else 1e-12), b.op("Mul", e_length, d_length))
        parallel = b.op("Not", b.op("Greater", b.op("Abs", fd), limit))
        distance = b.op("Div", f0, b.op("Max", e_length, const(1e-30)))
        keeps = b.op("Greater", distance, tolerance)  # parallel, on the inner side
        if owns_shared:  # or on the edge's line, running the same way
            on_line = b.op("Not", b.op("Less", distance, b.op("Neg", tolerance)))
            same_way = b.op("Greater", b.op("Add", b.op("Mul", hex_, edx), b.op("Mul", hey, edy)), const(0.0))
            keeps = b.op("Or", keeps, b.op("And", on_line, same_way))
        t = b.op("Div", b.op("Neg", f0), b.op("Where", parallel, const(1.0), fd))
        entering = b.op("And", b.op("Not", parallel), b.op("Greater", fd, const(0.0)))
        leaving = b.op("And", b.op("Not", parallel), b.op("Less", fd, const(0.0)))
        blocked = b.op("And", parallel, b.op("Not", keeps))  # the whole edge is outside
        lower = b.op("Where", entering, t, b.op("Where", blocked, const(2.0), const(0.0)))
        upper = b.op("Where", leaving, t, const(1.0))
        t0 = b.op("Max", b.reduce("Max", lower, [rank], keepdims=False), const(0.0))
        t1 = b.op("Min", b.reduce("Min", upper, [rank], keepdims=False), const(1.0))
        x0, y0 = b.op("Add", px, b.op("Mul", t0, dx_)), b.op("Add", py, b.op("Mul", t0, dy_))
        x1, y1 = b.op("Add", px, b.op("Mul", t1, dx_)), b.op("Add", py, b.op("Mul", t1, dy_))
        cross = b.op("Sub", b.op("Mul", x0, y1), b.op("Mul", y0, x1))
        return b.reduce("Sum", b.op("Where", b.op("Less", t0, t1), cross, const(0.0)), [rank - 1], keepdims=False)

    twice = b.op("Add", boundary_inside(ax, ay, bx, by, True), boundary_inside(bx, by, ax, ay, False))
    inter = b.op("Max", b.op("Min", b.op("Mul", twice, const(0.5)), b.op("Min", area1_p, area2_p)), const(0.0))
    base = area1_p if mode == 1 else b.op("Sub", b.op("Add", area1_p, area2_p), inter)
    ratio = b.op("Div", inter, b.op("Where", b.op("Greater", inter, const(0.0)), base, const(1.0)))
    degenerate = b.op("Or", b.op("Less", area1_p, const(1e-14)), b.op("Less", area2_p, const(1e-14)))
    ratio = b.op("Where", degenerate, const(0.0), ratio)
    # NaN where a box has a NaN or infinite number, as the kernel: x - x is 0 for finite x, NaN otherwise.
    poison1 = b.reduce("Sum", b.op("Sub", boxes1, boxes1), [1], keepdims=False)
    poison2 = b.reduce("Sum", b.op("Sub", boxes2, boxes2), [1], keepdims=False)
    if not aligned:
        poison1, poison2 = b.unsqueeze(poison1, 1), b.unsqueeze(poison2, 0)
    return b.op("Add", ratio, b.op("Add", poison1, poison2))


_LOWERINGS = [
    specs.Lowering("standard", specs.half_storage(_standard), min_opset=11, note="Green's theorem over clipped edges"),
    specs.Lowering(
        "custom", specs.half_storage(_custom, native=(torch.float16,)), min_opset=9, note="opbridge::BoxIouRotated"
    ),
]


# --- parity and reference ------------------------------------------------------------------------------------------

_KINDS = {
    "iou": ("iou", False, True),
    "iof": ("iof", False, True),
    "aligned": ("iou", True, True),
    "counter_clockwise": ("iof", False, False),
}


class _Model(torch.nn.Module):
    def __init__(self, operands: str = "iou") -> None:
        super().__init__()
        self.mode, self.aligned, self.clockwise = _KINDS[operands]

    def forward(self, boxes1: Tensor, boxes2: Tensor) -> Tensor:
        return box_iou_rotated(boxes1, boxes2, self.mode, self.aligned, self.clockwise)


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int) -> tuple[Tensor, Tensor]:
    """Boxes that overlap in every way: identical pairs, a box inside another, touching edges, a zero-size box,
    boxes far apart, arbitrary angles."""
    generator = torch.Generator().manual_seed(batch)
    # One size for both box counts: the parity matrix gives every dimension that varies with the batch one name.
    rows = cols = 3 * batch
    b1 = torch.cat(
        [
            torch.rand(rows, 2, generator=generator, dtype=torch.float64) * 8,
            torch.rand(rows, 2, generator=generator, dtype=torch.float64) * 5 + 0.5,
            (torch.rand(rows, 1, generator=generator, dtype=torch.float64) - 0.5) * 2 * math.pi,
        ],
        1,
    )
    b2 = torch.cat(
        [
            torch.rand(cols, 2, generator=generator, dtype=torch.float64) * 8,
            torch.rand(cols, 2, generator=generator, dtype=torch.float64) * 5 + 0.5,
            (torch.rand(cols, 1, generator=generator, dtype=torch.float64) - 0.5) * 2 * math.pi,
        ],
        1,
    )
    b2[0] = b1[0]  # identical
    b2[1] = torch.tensor([b1[1, 0], b1[1, 1], b1[1, 2] * 0.5, b1[1, 3] * 0.5, b1[1, 4]])  # inside, same angle
    b1[2] = torch.tensor([1.0, 1.0, 2.0, 2.0, 0.0])
    b2[2] = torch.tensor([3.0, 1.0, 2.0, 2.0, 0.0])  # touching along an edge
    b1[-1, 2] = 0.0  # zero width
    return b1.to(dtype), b2.to(dtype)


def _polygon(box: list[float], clockwise: bool) -> list[tuple[float, float]]:
    cx, cy, w, h, angle = box
    angle = angle if clockwise else -angle
    c, s = math.cos(angle), math.sin(angle)
    return [
        (cx + c * u - s * v, cy + s * u + c * v)
        for u, v in ((-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2))
    ]


def _clip(subject: list[tuple[float, float]], clip: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sutherland-Hodgman: the part of polygon `subject` inside the convex counter-clockwise polygon `clip`."""
    out = subject
    for i in range(len(clip)):
        (ax, ay), (bx, by) = clip[i], clip[(i + 1) % len(clip)]

        def side(p, ax=ax, ay=ay, bx=bx, by=by):
            return (bx - ax) * (p[1] - ay) - (by - ay) * (p[0] - ax)

        points, out = out, []
        for j in range(len(points)):
            p, q = points[j], points[(j + 1) % len(points)]
            sp, sq = side(p), side(q)
            if sp >= 0:
                out.append(p)
            if (sp >= 0) != (sq >= 0):
                t = sp / (sp - sq)
                out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
        if not out:
            return []
    return out


def _area(polygon: list[tuple[float, float]]) -> float:
    return 0.5 * sum(p[0] * q[1] - q[0] * p[1] for p, q in zip(polygon, polygon[1:] + polygon[:1], strict=True))


def overlap(box1: list[float], box2: list[float], mode: str = "iou", clockwise: bool = True) -> float:
    """One pair by polygon clipping (Sutherland-Hodgman), float64: the independent reference of the tests."""
    if not all(math.isfinite(v) for v in (*box1, *box2)):
        return math.nan
    area1, area2 = box1[2] * box1[3], box2[2] * box2[3]
    if area1 < 1e-14 or area2 < 1e-14:
        return 0.0
    inter = abs(_area(_clip(_polygon(box1, clockwise), _polygon(box2, clockwise))))
    return inter / area1 if mode == "iof" else inter / (area1 + area2 - inter)


def reference(boxes1: Tensor, boxes2: Tensor, operands: str = "iou") -> Tensor:
    mode, aligned, clockwise = _KINDS[operands]
    a, b = boxes1.double().tolist(), boxes2.double().tolist()
    if aligned:
        return torch.tensor([overlap(x, y, mode, clockwise) for x, y in zip(a, b, strict=True)], dtype=torch.float64)
    return torch.tensor([[overlap(x, y, mode, clockwise) for y in b] for x in a], dtype=torch.float64).reshape(
        len(a), len(b)
    )


SPEC = specs.register(
    specs.OpSpec(
        name="box_iou_rotated",
        torch_op="opbridge::box_iou_rotated",
        doc="IoU / IoF of rotated boxes (mmcv semantics)",
        lowerings=_LOWERINGS,
        custom_node=specs.CustomNode(
            op_type="BoxIouRotated",
            inputs=("boxes1", "boxes2"),
            outputs=("overlaps",),
            types=("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"),
            doc="mmcv's box_iou_rotated: [N, 5] x [M, 5] boxes (cx, cy, w, h, angle) -> [N, M] (aligned: [N]).",
            attributes=(("aligned", "int"), ("clockwise", "int"), ("mode", "int")),
        ),
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths={"torch.ops": _Model},
        sample_inputs=_sample_inputs,
        operand_kinds=tuple(_KINDS),
        input_names=("boxes1", "boxes2"),
        reference=reference,
        known_gaps=float64_cos_gap,
        tolerances={"float32": (1e-4, 1e-5)},
    )
)
