"""Non-maximum suppression of rotated boxes: opbridge::nms_rotated (mmcv's ``nms_rotated``).

The op's pieces, each named after it: the kernel (cpp/kernels/nms_rotated.h, on box_iou_rotated.h's exact
intersection), its schema and CPU adapter (cpp/torch/nms_rotated.cpp), its CUDA adapter
(cpp/cuda/nms_rotated.cu), its ORT adapter (cpp/ort/nms_rotated.cc:
``opbridge::NmsRotated``, and ``mmdeploy::NMSRotated``, the node mmdeploy's exporter writes for mmrotate's
detectors), and this module.

How many boxes survive depends on the data: the fake kernel declares the size as data-dependent, so
``torch.export``, ``torch.compile`` and both ONNX exporters carry it as a dynamic dimension. One lowering,
``custom`` (a greedy NMS is a loop no standard ONNX op expresses; ONNX's NonMaxSuppression is axis-aligned).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from .. import _autocast, _checks, specs
from ..specs import LoweringError

__all__ = ["nms_rotated"]
NN_MODULES: list[str] = []

_OP = "opbridge.nms_rotated"


def nms_rotated(
    boxes: Tensor,
    scores: Tensor,
    iou_threshold: float,
    labels: Optional[Tensor] = None,  # noqa: UP045  (TorchScript)
    clockwise: bool = True,
) -> tuple[Tensor, Tensor]:
    """Greedy non-maximum suppression of rotated boxes: mmcv's ``nms_rotated``.

    Args:
        boxes: ``[N, 5]`` boxes ``(cx, cy, w, h, angle)``, angle in radians.
        scores: ``[N]``, the boxes' dtype.
        iou_threshold: a box is dropped when a kept box of higher score overlaps it with IoU > iou_threshold.
        labels: ``[N]`` integer classes, or None. With labels only boxes of one label suppress each other (one
            NMS per class: what mmcv's ``batched_nms`` computes; mmcv's own ``nms_rotated(labels=...)`` ignores
            them on CPU and CUDA).
        clockwise: as in :func:`opbridge.box_iou_rotated`; detectron2's boxes (degrees, counter-clockwise):
            angles in radians and ``clockwise=False``.

    Returns:
        ``(dets, keep)``: ``dets [K, 6]`` = the kept boxes as given and their scores, ``keep [K]`` int64
        indices, both in decreasing score order (equal scores keep their input order; NaN scores first, as
        torch's descending sort). Empty inputs give ``[0, 6]`` and ``[0]`` (mmcv returns the input and None).

    Raises:
        TypeError: boxes or scores is not a tensor, labels not a tensor or None, iou_threshold not a number.
        RuntimeError: shapes disagree, dtypes differ or are not float32/float64/float16/bfloat16, labels are not
            integers, or the tensors are on different devices.

    On CUDA the suppression runs on the GPU (a bitmask of the overlapping pairs and the greedy pass over it, as
    torchvision's ``nms``; the same IoU and order as on the CPU); the host waits once for the number kept.

    mmcv's CPU kernel suppresses at IoU >= iou_threshold; its CUDA kernel and mmdeploy's NMSRotated at
    IoU > iou_threshold, as here (the two differ only for an IoU exactly at the threshold). Not
    differentiable. Exports to one ``opbridge::NmsRotated`` node (``lowering="custom"``).
    """
    if not torch.jit.is_scripting():
        _checks.tensor(_OP, "boxes", boxes)
        _checks.tensor(_OP, "scores", scores)
        _checks.tensor(_OP, "labels", labels, optional=True)
        if isinstance(iou_threshold, bool) or not isinstance(iou_threshold, (int, float)):
            raise TypeError(f"{_OP}: iou_threshold must be a number, got {type(iou_threshold).__name__}")
    keep = torch.ops.opbridge.nms_rotated(boxes, scores, float(iou_threshold), labels, bool(clockwise))
    dets = torch.cat([boxes[keep], scores[keep].unsqueeze(1)], dim=1)
    return dets, keep


@torch.library.register_fake("opbridge::nms_rotated")
def _nms_rotated_fake(boxes, scores, iou_threshold, labels=None, clockwise=True):
    # Defaults as in the schema: tracers drop trailing arguments left at their defaults.
    op = "opbridge::nms_rotated"
    _checks.one_device(op, boxes=boxes, scores=scores, labels=labels)
    torch._check(
        boxes.dim() == 2 and boxes.shape[1] == 5 and scores.dim() == 1 and scores.shape[0] == boxes.shape[0],
        lambda: f"{op}: boxes must be [N, 5] and scores [N], got {tuple(boxes.shape)} and {tuple(scores.shape)}",
    )
    _checks.float_storage(op, "boxes", boxes)
    torch._check(boxes.dtype == scores.dtype, lambda: f"{op}: boxes and scores must have the same dtype")
    kept = torch.library.get_ctx().new_dynamic_size()
    torch._check(kept <= boxes.shape[0])
    return boxes.new_empty((kept,), dtype=torch.int64)


AUTOCAST = _autocast.Rule("float32")
_autocast.register("opbridge::nms_rotated", AUTOCAST)


# --- ONNX ------------------------------------------------------------------------------------------------------------


def _custom(b, boxes, scores, iou_threshold, labels=None, clockwise=True):
    # Defaults as in the schema: the dynamo exporter drops trailing arguments left at their defaults.
    threshold = float(b.value(iou_threshold, "f"))
    if not math.isfinite(threshold):
        raise LoweringError(f"nms_rotated export: iou_threshold must be a finite number, got {threshold}")
    inputs = [boxes, scores]
    if not b.is_none(labels):
        inputs.append(b.op("Cast", labels, to=7))  # any integer type: INT64
    out = b.op(
        "NmsRotated",
        *inputs,
        domain=specs.CUSTOM_DOMAIN,
        iou_threshold=threshold,
        clockwise=int(bool(b.value(clockwise, "b"))),
    )
    b.set_type(out, boxes, [None], dtype=torch.int64)
    return out


_LOWERINGS = [
    specs.Lowering(
        "custom",
        specs.half_storage(_custom, native=(torch.float16,), floating_output=False),
        min_opset=9,
        note="opbridge::NmsRotated",
    )
]


# --- parity and reference ------------------------------------------------------------------------------------------

_KINDS = ("plain", "labels", "counter_clockwise")


class _Model(torch.nn.Module):
    def __init__(self, operands: str = "plain") -> None:
        super().__init__()
        self.clockwise = operands != "counter_clockwise"

    def forward(self, boxes: Tensor, scores: Tensor, labels: Optional[Tensor] = None):  # noqa: UP045
        return nms_rotated(boxes, scores, 0.3, labels, self.clockwise)


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    """Clusters of overlapping boxes (so that some are suppressed), ties in score, a zero-size box."""
    generator = torch.Generator().manual_seed(batch)
    count = 6 * batch
    centers = torch.rand(batch, 2, generator=generator, dtype=torch.float64) * 20
    member = torch.arange(count) % batch
    boxes = torch.cat(
        [
            centers[member] + torch.randn(count, 2, generator=generator, dtype=torch.float64),
            torch.rand(count, 2, generator=generator, dtype=torch.float64) * 4 + 2,
            (torch.rand(count, 1, generator=generator, dtype=torch.float64) - 0.5) * math.pi,
        ],
        1,
    )
    boxes[-1, 3] = 0.0
    scores = torch.rand(count, generator=generator, dtype=torch.float64).round(decimals=1)  # ties
    inputs = [boxes.to(dtype), scores.to(dtype)]
    if operands == "labels":
        inputs.append(torch.randint(0, 2, (count,), generator=generator))
    return tuple(inputs)


def reference(boxes: Tensor, scores: Tensor, labels: Tensor | None = None, operands: str = "plain"):
    """Greedy NMS over box_iou_rotated's polygon-clipping reference, in plain Python (float64)."""
    from .box_iou_rotated import overlap

    clockwise = operands != "counter_clockwise"
    b, s = boxes.double().tolist(), scores.double().tolist()
    order = sorted(range(len(s)), key=lambda i: (not math.isnan(s[i]), -s[i] if not math.isnan(s[i]) else 0.0))
    keep: list[int] = []
    for i in order:
        if all(
            (labels is not None and int(labels[i]) != int(labels[k])) or not overlap(b[k], b[i], "iou", clockwise) > 0.3
            for k in keep
        ):
            keep.append(i)
    index = torch.tensor(keep, dtype=torch.int64)
    return torch.cat([boxes.double()[index], scores.double()[index].unsqueeze(1)], 1), index


SPEC = specs.register(
    specs.OpSpec(
        name="nms_rotated",
        torch_op="opbridge::nms_rotated",
        doc="non-maximum suppression of rotated boxes (mmcv semantics)",
        lowerings=_LOWERINGS,
        custom_node=specs.CustomNode(
            op_type="NmsRotated",
            inputs=("boxes", "scores", "labels"),
            outputs=("keep",),
            types=("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"),
            doc="mmcv's nms_rotated: boxes [N, 5], scores [N], labels [N] (optional) -> kept indices [K] (int64), "
            "decreasing score; suppress at IoU > iou_threshold, within a label.",
            optional_inputs=("labels",),
            attributes=(("clockwise", "int"), ("iou_threshold", "float")),
            int64_inputs=("labels",),
            int64_outputs=("keep",),
        ),
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths={"torch.ops": _Model},
        sample_inputs=_sample_inputs,
        operand_kinds=_KINDS,
        input_names=("boxes", "scores", "labels"),
        reference=reference,
        extra={"data_dependent_output": "the number of kept boxes"},
    )
)
