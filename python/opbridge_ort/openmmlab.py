"""Every custom node mmcv (1.x, 2.x) and mmdeploy wrote for ONNX Runtime, and whether the opbridge library runs it.

Torch-free. ``python -m opbridge inspect`` reads it to say why a node does not run; docs/openmmlab.md holds
:func:`markdown_table`'s output (tests/test_openmmlab.py keeps the two and the library in step: a node marked as
running must be in the library, and every node the library runs for mmcv or mmdeploy must be here).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NODES", "Node", "find", "markdown_table"]


@dataclass(frozen=True)
class Node:
    domain: str
    op_type: str
    written_by: str  # the exporter code that writes the node
    old_kernels: str  # the ONNX Runtime libraries that ran it before ("none" if none did)
    models: str  # model families whose export contains it
    runs: bool  # whether the opbridge library runs it
    note: str = ""  # for a node that does not run: why, and what to do instead


_MMCV_GRID = "mmcv 1.x `mmcv/onnx/symbolic.py` (register_extra_symbolics)"
_NOT_YET = "not implemented in opbridge yet"

NODES: tuple[Node, ...] = (
    Node(
        "mmdeploy",
        "grid_sampler",
        "mmdeploy `pytorch/symbolics/grid_sampler.py`",
        "mmdeploy (ORT <= 1.15)",
        "every `F.grid_sample` at export: Mask2Former, DINO and Deformable DETR exported on CPU (MSDA's fallback), "
        "PointRend, Mask R-CNN mask pasting, BasicVSR flow warps",
        True,
    ),
    Node("mmcv", "grid_sampler", _MMCV_GRID, "mmcv 1.x", "the same families exported by mmcv 1.x", True),
    Node(
        "mmdeploy",
        "MMCVDeformConv2d",
        "mmdeploy `mmcv/ops/deform_conv.py`",
        "none (TensorRT plugin only)",
        "DCNv1 (`type='DCN'`): Faster R-CNN + DCN, RepPoints, VFNet, Guided Anchoring, TOOD, CenterPoint",
        True,
    ),
    Node("mmcv", "MMCVDeformConv2d", "mmcv `ops/deform_conv.py`", "mmcv 1.3.15-1.7", "the same families", True),
    Node(
        "mmdeploy",
        "MMCVModulatedDeformConv2d",
        "mmdeploy `mmcv/ops/modulated_deform_conv.py`",
        "mmdeploy (ORT <= 1.15)",
        "DCNv2: mmdet dconv/mdconv configs, CenterNet, DBNet(++) r50-dcnv2, FCOS3D",
        True,
    ),
    Node(
        "mmcv",
        "MMCVModulatedDeformConv2d",
        "mmcv `ops/modulated_deform_conv.py`",
        "mmcv 1.3.12-1.7, mmdeploy",
        "the same families",
        True,
    ),
    Node(
        "mmdeploy",
        "MMCVMultiScaleDeformableAttention",
        "mmdeploy `mmcv/ops/multi_scale_deform_attn.py`",
        "none (TensorRT plugin only)",
        "Deformable DETR, DINO, DDQ, Mask2Former exported on a GPU",
        True,
    ),
    Node(
        "mmdeploy",
        "MMCVRoIAlignRotated",
        "mmdeploy `mmcv/ops/roi_align_rotated.py`",
        "mmdeploy (ORT <= 1.15)",
        "mmrotate two-stage heads: Rotated Faster R-CNN, Oriented R-CNN, RoI Transformer",
        True,
    ),
    Node(
        "mmcv",
        "MMCVRoIAlignRotated",
        "mmcv `ops/roi_align_rotated.py`",
        "mmcv 1.3.2-1.7",
        "mmrotate 0.x exported by mmcv",
        True,
    ),
    Node(
        "mmdeploy",
        "NMSRotated",
        "mmdeploy `mmcv/ops/nms_rotated.py`",
        "mmdeploy (ORT <= 1.15)",
        "every mmrotate detector (multiclass_nms with nms_rotated): Rotated RetinaNet, Oriented R-CNN, RTMDet-R",
        True,
    ),
    Node(
        "mmdeploy",
        "NMSMatch",
        "mmdeploy `mmcv/ops/nms_match.py`",
        "mmdeploy 1.3.1 (ORT <= 1.15)",
        "none in mmdeploy's own rewriters; models that call multiclass_nms_match",
        True,
    ),
    Node(
        "mmdeploy",
        "MMCVRoiAlign",
        "mmdeploy 0.1-0.3 `mmcv/ops/roi_align.py`",
        "mmdeploy 0.1-0.3",
        "two-stage detectors exported by mmdeploy 0.1-0.3 (later versions write ONNX RoiAlign)",
        True,
    ),
    Node(
        "mmcv",
        "MMCVRoiAlign",
        "mmcv 1.x `ops/roi_align.py`",
        "mmcv 1.2.5-1.7",
        "two-stage mmdet 2.x detectors (Faster/Mask/Cascade R-CNN) exported by mmcv",
        True,
    ),
    Node(
        "mmcv",
        "NonMaxSuppression",
        "mmcv 1.x `ops/nms.py` (NMSop)",
        "mmcv 1.2.7-1.7",
        "mmdet 2.x detectors exported with mmcv's ORT library loaded",
        True,
    ),
    Node(
        "mmcv",
        "SoftNonMaxSuppression",
        "mmcv `ops/nms.py` (SoftNMSop)",
        "mmcv 1.2.3-1.7",
        "configs with `nms=dict(type='soft_nms')`",
        True,
    ),
    Node(
        "mmcv",
        "MMCVCornerPool",
        "mmcv 1.x `ops/corner_pool.py`",
        "mmcv 1.3.4-1.7",
        "CornerNet, CentripetalNet (torch < 1.7 exports; later ones write cummax)",
        True,
    ),
    Node("mmcv", "cummax", _MMCV_GRID, "mmcv 1.3.4-1.7", "CornerNet and CentripetalNet corner pools", True),
    Node("mmcv", "cummin", _MMCV_GRID, "mmcv 1.3.4-1.7", "torch.cummin in an mmcv 1.x export", True),
    Node(
        "mmcv",
        "MMCVRotatedFeatureAlign",
        "mmcv `ops/rotated_feature_align.py`",
        "mmcv 1.5.1-1.7",
        "mmrotate R3Det (feature refinement)",
        True,
    ),
    Node("mmcv", "MMCVPSAMask", "mmcv `ops/psa_mask.py`", "none", "mmseg PSANet (16 configs)", True),
    Node(
        "mmcv",
        "MMCVMaskedConv2d",
        "mmcv `ops/masked_conv.py`",
        "none",
        "mmdet Guided Anchoring (GA-RPN, GA-Faster R-CNN, GA-RetinaNet; 16 configs)",
        True,
    ),
    Node(
        "mmcv",
        "PrRoIPool",
        "mmcv `ops/prroi_pool.py`",
        "none",
        "mmtracking MixFormer, PrDiMP (3-7 configs)",
        False,
        _NOT_YET,
    ),
    Node(
        "mmcv",
        "MMCVDeformRoIPool",
        "mmcv `ops/deform_roi_pool.py`",
        "none",
        "mmdet Faster R-CNN dpool/mdpool (2 configs)",
        False,
        _NOT_YET,
    ),
    Node("mmcv", "MMCVCARAFE", "mmcv `ops/carafe.py`", "none", "mmdet CARAFE FPN (2 configs)", True),
    Node("mmcv", "MMCVCARAFENaive", "mmcv `ops/carafe.py`", "none", "none found in OpenMMLab configs", True),
    Node(
        "mmcv",
        "MMCVBorderAlign",
        "mmcv `ops/border_align.py`",
        "none",
        "none found (BorderDet is not in mmdet)",
        False,
        _NOT_YET,
    ),
    Node(
        "mmcv",
        "MMCVSigmoidFocalLoss",
        "mmcv 1.x `ops/focal_loss.py`",
        "none",
        "training only",
        False,
        "a training loss: export the model without its loss",
    ),
    Node(
        "mmcv",
        "MMCVSoftmaxFocalLoss",
        "mmcv 1.x `ops/focal_loss.py`",
        "none",
        "training only",
        False,
        "a training loss: export the model without its loss",
    ),
    Node(
        "mmcv",
        "MMCVSyncBatchNorm",
        "mmcv `ops/sync_bn.py`",
        "none",
        "training only",
        False,
        "convert SyncBatchNorm to BatchNorm2d before export (mmcv's revert_sync_batchnorm)",
    ),
    Node(
        "mmdeploy",
        "TRTBatchedNMS",
        "mmdeploy `mmcv/ops/nms.py`",
        "none (TensorRT plugin only)",
        "mmdet detectors exported for TensorRT",
        False,
        "a TensorRT node: export with mmdeploy's onnxruntime deploy config (standard NonMaxSuppression)",
    ),
    Node(
        "mmdeploy",
        "TRTBatchedRotatedNMS",
        "mmdeploy `mmcv/ops/nms_rotated.py`",
        "none (TensorRT plugin only)",
        "mmrotate detectors exported for TensorRT",
        False,
        "a TensorRT node: export with mmdeploy's onnxruntime deploy config (NMSRotated, which opbridge runs)",
    ),
    Node(
        "mmdeploy",
        "MMCVMultiLevelRoiAlign",
        "mmdeploy `codebase/mmdet/.../single_level_roi_extractor.py`",
        "none (TensorRT plugin only)",
        "two-stage detectors exported for TensorRT",
        False,
        "a TensorRT node: export with mmdeploy's onnxruntime deploy config (ONNX RoiAlign)",
    ),
)


def find(domain: str, op_type: str) -> Node | None:
    """The table's entry of a node, or None."""
    return next((n for n in NODES if (n.domain, n.op_type) == (domain, op_type)), None)


def markdown_table() -> str:
    """The status table of docs/openmmlab.md."""
    lines = ["| node | written by | ORT kernels before | models | opbridge |", "|---|---|---|---|---|"]
    for n in NODES:
        status = "runs" if n.runs else f"not yet: {n.note}" if n.note == _NOT_YET else f"no: {n.note}"
        lines.append(f"| `{n.domain}::{n.op_type}` | {n.written_by} | {n.old_kernels} | {n.models} | {status} |")
    return "\n".join(lines) + "\n"
