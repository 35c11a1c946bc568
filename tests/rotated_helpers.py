"""What the rotated-detection ops' tests share (box_iou_rotated, nms_rotated, roi_align_rotated,
rotated_feature_align): an export with dynamic sizes through either exporter."""

from __future__ import annotations

import contextlib
import io
import warnings

import torch

import opbridge


def export(model, args, names, dynamic: dict, opset: int, dynamo: bool, lowering: str):
    """dynamic: input name -> {axis: size name}; for the dynamo exporter each name becomes one torch.export Dim."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if dynamo:
            dims: dict = {}
            shapes = tuple(
                {axis: dims.setdefault(name, torch.export.Dim(name)) for axis, name in dynamic.get(n, {}).items()}
                or None
                for n in names
            )
            return opbridge.onnx.export(
                model,
                args,
                None,
                opset_version=opset,
                dynamo=True,
                lowering=lowering,
                input_names=list(names),
                dynamic_shapes=shapes,
            )
        return opbridge.onnx.export(
            model,
            args,
            None,
            opset_version=opset,
            dynamo=False,
            lowering=lowering,
            input_names=list(names),
            dynamic_axes=dynamic,
        )
