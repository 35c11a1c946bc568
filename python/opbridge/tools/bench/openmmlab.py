"""The nodes mmcv and mmdeploy write (docs/openmmlab.md) against the standard ONNX operator that does the same work,
in ORT (float32):

``ort_custom``    the node run by the opbridge library: ``mmdeploy::grid_sampler``, ``mmcv::MMCVRoiAlign``,
                  ``mmcv::NonMaxSuppression``;
``ort_standard``  ONNX ``GridSample`` (opset 16), ``RoiAlign`` (opset 16, half_pixel: mmcv's aligned=1),
                  ``NonMaxSuppression`` (opset 11; its selected indices compared with ours).

Cases: grid_sampler as Mask2Former's and DINO's multi-scale deformable attention falls back to it on a CPU export
(one level's 8 heads x 32 channels, 100 x 100, 10,000 queries x 4 points) and as PointRend's point head samples (256
channels, 64 x 64, 2,000 points); RoIAlign as a Faster R-CNN head (1,000 rois, 7 x 7, 256 channels of a stride-4
map of an 800 x 800 image, adaptive sampling); NMS as an RPN (2,000 clustered boxes, IoU 0.7).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx
from onnx import TensorProto, helper

from . import Bench, Target, checked_run, ort_session

TARGETS = [Target("ort_custom", "ort_standard", 1.0)]
GRID_CASES = {"grid_sampler MSDA level 100x100": (8, 32, 100, 100, 10_000, 4),
              "grid_sampler PointRend 2000 points": (1, 256, 64, 64, 2_000, 1)}  # fmt: skip
ROI_CASE, NMS_CASE = "MMCVRoiAlign 1000 rois 7x7 C256", "NonMaxSuppression 2000 boxes"
FLOAT = TensorProto.FLOAT


def _model(nodes, inputs, outputs, opset: int, domain: str | None = None, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "bench", inputs, outputs, initializer=list(initializers))
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8
    return model


def _info(name: str, elem=FLOAT):
    return helper.make_tensor_value_info(name, elem, None)


def grid_models() -> dict[str, onnx.ModelProto]:
    attrs = {"interpolation_mode": 0, "padding_mode": 0, "align_corners": 0}
    custom = helper.make_node("grid_sampler", ["input", "grid"], ["out"], domain="mmdeploy", **attrs)
    standard = helper.make_node("GridSample", ["input", "grid"], ["out"], mode="bilinear", padding_mode="zeros",
                                align_corners=0)  # fmt: skip
    io = ([_info("input"), _info("grid")], [_info("out")])
    return {"ort_custom": _model([custom], *io, 16, "mmdeploy"), "ort_standard": _model([standard], *io, 16)}


def roi_models(scale: float) -> dict[str, onnx.ModelProto]:
    attrs = {"output_height": 7, "output_width": 7, "spatial_scale": scale, "sampling_ratio": 0}
    custom = helper.make_node("MMCVRoiAlign", ["input", "rois"], ["out"], domain="mmcv", mode="avg", aligned=1, **attrs)
    # The standard form: batch indices and boxes split out of the [K, 5] rois, as mmcv's fallback symbolic does.
    split = [
        helper.make_node("Gather", ["rois", "zero"], ["index_float"], axis=1),
        helper.make_node("Cast", ["index_float"], ["index"], to=TensorProto.INT64),
        helper.make_node("Slice", ["rois", "one", "five", "one"], ["boxes"]),
        helper.make_node("RoiAlign", ["input", "boxes", "index"], ["out"], mode="avg",
                         coordinate_transformation_mode="half_pixel", **attrs),
    ]  # fmt: skip
    constants = [helper.make_tensor("zero", TensorProto.INT64, [], [0]), helper.make_tensor("one", TensorProto.INT64,
                 [1], [1]), helper.make_tensor("five", TensorProto.INT64, [1], [5])]  # fmt: skip
    io = ([_info("input"), _info("rois")], [_info("out")])
    return {"ort_custom": _model([custom], *io, 16, "mmcv"), "ort_standard": _model(split, *io, 16, None, constants)}


def nms_models(threshold: float) -> dict[str, onnx.ModelProto]:
    custom = helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["keep"], domain="mmcv",
                              iou_threshold=threshold, offset=0)  # fmt: skip
    standard = [
        helper.make_node("Unsqueeze", ["boxes", "zero"], ["boxes3"]),
        helper.make_node("Unsqueeze", ["scores", "zero"], ["scores2"]),
        helper.make_node("Unsqueeze", ["scores2", "zero"], ["scores3"]),
        helper.make_node("NonMaxSuppression", ["boxes3", "scores3", "max_out", "iou"], ["selected"]),
        helper.make_node("Gather", ["selected", "two"], ["keep"], axis=1),
    ]
    constants = [helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
                 helper.make_tensor("two", TensorProto.INT64, [], [2]),
                 helper.make_tensor("max_out", TensorProto.INT64, [1], [1 << 30]),
                 helper.make_tensor("iou", FLOAT, [1], [threshold])]  # fmt: skip
    io = ([_info("boxes"), _info("scores")], [_info("keep", TensorProto.INT64)])
    return {"ort_custom": _model([custom], *io, 13, "mmcv"), "ort_standard": _model(standard, *io, 13, None, constants)}


def rpn_boxes(count: int, rng) -> tuple[np.ndarray, np.ndarray]:
    centers = rng.uniform(0, 800, (count // 20, 2)).repeat(20, 0) + rng.normal(0, 8, (count, 2))
    sizes = rng.uniform(16, 200, (count, 2))
    boxes = np.concatenate([centers - sizes / 2, centers + sizes / 2], 1).astype(np.float32)
    return boxes, rng.random(count).astype(np.float32)


def _nms_run(session, feeds, want):
    (keep,) = session.run(None, feeds)
    if keep.tolist() != want:
        raise AssertionError("NonMaxSuppression: kept indices differ from the standard operator's")
    return partial(session.run, None, feeds)


def run(bench: Bench) -> None:
    rng = np.random.default_rng(0)
    models = grid_models()
    for case, (n, c, h, w, queries, points) in GRID_CASES.items():
        feeds = {"input": rng.standard_normal((n, c, h, w)).astype(np.float32),
                 "grid": rng.uniform(-1.05, 1.05, (n, queries, points, 2)).astype(np.float32)}  # fmt: skip
        for threads in bench.threads:
            standard = ort_session(models["ort_standard"], threads, False)
            want = standard.run(None, feeds)[0]
            for path, model in models.items():
                session = ort_session(model, threads, path == "ort_custom")
                bench.record("openmmlab", case, threads, path, checked_run(path, session, feeds, want, 1e-4, 1e-5))
    scale = 1 / 4
    starts = rng.uniform(0, 700, (1000, 2))
    rois = np.concatenate([np.zeros((1000, 1)), starts, starts + rng.uniform(16, 300, (1000, 2))], 1)
    feeds = {"input": rng.standard_normal((1, 256, 200, 200)).astype(np.float32), "rois": rois.astype(np.float32)}
    models = roi_models(scale)
    for threads in bench.threads:
        want = ort_session(models["ort_standard"], threads, False).run(None, feeds)[0]
        for path, model in models.items():
            session = ort_session(model, threads, path == "ort_custom")
            bench.record("openmmlab", ROI_CASE, threads, path, checked_run(path, session, feeds, want, 1e-4, 1e-4))
    boxes, scores = rpn_boxes(2000, rng)
    feeds = {"boxes": boxes, "scores": scores}
    models = nms_models(0.7)
    for threads in bench.threads:
        want = ort_session(models["ort_standard"], threads, False).run(None, feeds)[0].tolist()
        for path, model in models.items():
            session = ort_session(model, threads, path == "ort_custom")
            bench.record("openmmlab", NMS_CASE, threads, path, _nms_run(session, feeds, want))
