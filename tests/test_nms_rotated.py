"""nms_rotated against mmcv's published boxes and batched_nms table, an independent greedy reference over polygon
clipping, torch.export with the data-dependent output size, and its custom node through both exporters with
numbers of boxes that change at run time."""

from __future__ import annotations

import math
import warnings

import numpy as np
import onnx
import pytest
import torch

import opbridge
import opbridge_ort
from opbridge.ops.nms_rotated import reference
from rotated_helpers import export

# mmcv tests/test_ops/test_nms_rotated.py: (cx, cy, w, h, angle, score)
BOXES = torch.tensor(
    [
        [6.0, 3.0, 8.0, 7.0, 0.5, 0.7],
        [3.0, 6.0, 9.0, 11.0, 0.6, 0.8],
        [3.0, 7.0, 10.0, 12.0, 0.3, 0.5],
        [1.0, 4.0, 13.0, 7.0, 0.6, 0.9],
    ]
)
LABELS = torch.tensor([1, 0, 1, 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_published_values(dtype):
    boxes = BOXES.to(dtype)
    dets, keep = opbridge.nms_rotated(boxes[:, :5], boxes[:, 5], 0.5)
    assert keep.tolist() == [3, 1, 0] and keep.dtype == torch.int64
    torch.testing.assert_close(dets, boxes[[3, 1, 0]])
    flipped = boxes[:, :5] * torch.tensor([1, 1, 1, 1, -1], dtype=dtype)
    dets, keep = opbridge.nms_rotated(flipped, boxes[:, 5], 0.5, clockwise=False)
    assert keep.tolist() == [3, 1, 0]
    torch.testing.assert_close(dets[:, :5], flipped[[3, 1, 0]])  # the boxes as given
    # With labels, one NMS per label: mmcv's batched_nms(class_agnostic=False) table, [3, 1, 0, 2].
    dets, keep = opbridge.nms_rotated(boxes[:, :5], boxes[:, 5], 0.5, LABELS)
    assert keep.tolist() == [3, 1, 0, 2]
    torch.testing.assert_close(dets, boxes[[3, 1, 0, 2]])


def _clusters(generator, count, dtype=torch.float64):
    centers = torch.rand(max(count // 5, 1), 2, generator=generator, dtype=torch.float64) * 30
    member = torch.arange(count) % centers.shape[0]
    boxes = torch.cat(
        [
            centers[member] + torch.randn(count, 2, generator=generator, dtype=torch.float64),
            torch.rand(count, 2, generator=generator, dtype=torch.float64) * 5 + 1,
            (torch.rand(count, 1, generator=generator, dtype=torch.float64) - 0.5) * math.pi,
        ],
        1,
    )
    scores = torch.rand(count, generator=generator, dtype=torch.float64).round(decimals=1)  # many ties
    return boxes.to(dtype), scores.to(dtype)


@pytest.mark.parametrize("operands", ["plain", "labels", "counter_clockwise"])
def test_matches_reference(generator, operands):
    for count in (1, 7, 60):
        boxes, scores = _clusters(generator, count)
        labels = torch.randint(0, 3, (count,), generator=generator) if operands == "labels" else None
        dets, keep = opbridge.nms_rotated(boxes, scores, 0.3, labels, operands != "counter_clockwise")
        want_dets, want_keep = reference(boxes, scores, labels, operands=operands)
        assert keep.tolist() == want_keep.tolist()
        torch.testing.assert_close(dets, want_dets)
        assert 0 < len(keep) < count or count < 5


def test_threshold_edges_and_empty():
    boxes = torch.tensor([[0.0, 0.0, 4.0, 2.0, 0.0], [1.0, 0.0, 4.0, 2.0, 0.0]])  # IoU 3/5
    scores = torch.tensor([0.9, 0.8])
    assert opbridge.nms_rotated(boxes, scores, 0.6)[1].tolist() == [0, 1]  # suppressed only above the threshold
    assert opbridge.nms_rotated(boxes, scores, 0.59)[1].tolist() == [0]
    assert opbridge.nms_rotated(boxes, torch.tensor([0.5, 0.5]), 0.1)[1].tolist() == [0]  # ties: input order
    dets, keep = opbridge.nms_rotated(torch.zeros(0, 5), torch.zeros(0), 0.5)
    assert dets.shape == (0, 6) and keep.shape == (0,)
    nan_box = torch.tensor([[math.nan, 0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 1.0, 1.0, 0.0]])
    assert opbridge.nms_rotated(nan_box, torch.tensor([0.9, 0.8]), 0.1)[1].tolist() == [0, 1]


def test_opcheck_and_torch_export(generator):
    boxes, scores = _clusters(generator, 20, torch.float32)
    torch.library.opcheck(torch.ops.opbridge.nms_rotated.default, (boxes, scores, 0.3, None, True))

    class Model(torch.nn.Module):
        def forward(self, boxes, scores):
            return opbridge.nms_rotated(boxes, scores, 0.3)

    count = torch.export.Dim("count")
    program = torch.export.export(Model(), (boxes, scores), dynamic_shapes=({0: count}, {0: count}))
    for n in (5, 33):
        b, s = _clusters(generator, n, torch.float32)
        for got, want in zip(program.module()(b, s), Model()(b, s), strict=True):
            torch.testing.assert_close(got, want)


class _Head(torch.nn.Module):
    def __init__(self, labels=False):
        super().__init__()
        self.labels = labels

    def forward(self, boxes, scores, labels=None):
        return opbridge.nms_rotated(boxes, scores, 0.3, labels if self.labels else None)


@pytest.mark.parametrize(("dynamo", "opset"), [(False, 11), (False, 17), (True, 18)])
@pytest.mark.parametrize("labels", [False, True])
def test_custom_node_with_changing_box_counts(generator, dynamo, opset, labels):
    boxes, scores = _clusters(generator, 12, torch.float32)
    names = ("boxes", "scores", "labels")[: 2 + labels]
    args = (boxes, scores, torch.randint(0, 2, (12,), generator=generator))[: 2 + labels]
    proto = export(_Head(labels), args, names, {n: {0: "count"} for n in names}, opset, dynamo, "custom")
    assert ("opbridge", "NmsRotated") in {(n.domain, n.op_type) for n in proto.graph.node}
    session = opbridge_ort.InferenceSession(proto)
    for count in (40, 3, 0):
        b, s = _clusters(generator, count, torch.float32)
        feeds = {"boxes": b.numpy(), "scores": s.numpy()}
        label = torch.randint(0, 2, (count,), generator=generator)
        if labels:
            feeds["labels"] = label.numpy()
        dets, keep = session.run(None, feeds)
        want_dets, want_keep = _Head(labels)(b, s, label)
        assert keep.tolist() == want_keep.tolist()
        np.testing.assert_allclose(dets, want_dets.numpy())


def test_standard_lowering_is_refused_with_a_way_out():
    with pytest.raises(Exception, match="custom"):
        export(
            _Head(),
            _clusters(torch.Generator().manual_seed(0), 5, torch.float32),
            ("boxes", "scores"),
            {},
            17,
            False,
            "standard",
        )


CONTRACT_CASES = {
    "opbridge.nms_rotated": [
        (lambda: opbridge.nms_rotated(torch.ones(2, 5), None, 0.5), TypeError, ["scores must be a tensor"]),
        (lambda: opbridge.nms_rotated(torch.ones(2, 5), torch.ones(2), "0.5"), TypeError, ["iou_threshold"]),
        (lambda: opbridge.nms_rotated(torch.ones(2, 5), torch.ones(3), 0.5), RuntimeError, ["scores", "N = "]),
        (lambda: opbridge.nms_rotated(torch.ones(2, 4), torch.ones(2), 0.5), RuntimeError, ["[N, 5]"]),
        (
            lambda: opbridge.nms_rotated(torch.ones(2, 5), torch.ones(2), 0.5, torch.ones(2)),
            RuntimeError,
            ["labels must be an integer tensor"],
        ),
        (
            lambda: opbridge.nms_rotated(torch.ones(2, 5), torch.ones(2), 0.5, torch.ones(3, dtype=torch.int64)),
            RuntimeError,
            ["labels must have shape [N]"],
        ),
        (
            lambda: opbridge.nms_rotated(torch.ones(2, 5), torch.ones(2, dtype=torch.float64), 0.5),
            RuntimeError,
            ["same dtype"],
        ),
        (
            lambda: opbridge.nms_rotated(torch.ones(2, 5), torch.ones(2, device="meta"), 0.5),
            RuntimeError,
            ["one device"],
        ),
    ],
}


class _MmdeployNMSRotated(torch.autograd.Function):
    """Built as mmdeploy's ONNXNMSRotatedOp (mmdeploy/mmcv/ops/nms_rotated.py) builds it: a forward of per-batch,
    per-class NMS rows (batch, class, box) and a symbolic writing mmdeploy::NMSRotated with float attributes."""

    @staticmethod
    def forward(ctx, boxes, scores, iou_threshold: float, score_threshold: float):
        rows = []
        for b in range(scores.shape[0]):
            for c in range(scores.shape[1]):
                valid = (scores[b, c] > score_threshold).nonzero().squeeze(1)
                if len(valid):
                    keep = valid[opbridge.nms_rotated(boxes[b, valid], scores[b, c, valid], iou_threshold)[1]]
                    rows += [[b, c, int(k)] for k in keep]
        return torch.tensor(rows, dtype=torch.int64).reshape(-1, 3)

    @staticmethod
    def symbolic(g, boxes, scores, iou_threshold, score_threshold):
        return g.op("mmdeploy::NMSRotated", boxes, scores, iou_threshold_f=float(iou_threshold),
                    score_threshold_f=float(score_threshold))  # fmt: skip


def test_mmdeploy_node_as_its_symbolic_writes_it(generator, tmp_path):
    """mmdeploy's _multiclass_nms_rotated path (boxes [B, N, 5], scores [B, C, N]) exported by the TorchScript
    exporter through its own symbolic, run by opbridge's library with other batch, class and box counts."""

    class Multiclass(torch.nn.Module):
        def forward(self, boxes, scores):
            return _MmdeployNMSRotated.apply(boxes, scores, 0.1, 0.05)

    def inputs(batch, classes, count):
        boxes = torch.stack([_clusters(generator, count, torch.float32)[0] for _ in range(batch)])
        return boxes, torch.rand(batch, classes, count, generator=generator)

    path = tmp_path / "mmdeploy_nms.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Multiclass(), inputs(2, 3, 10), str(path), opset_version=11, dynamo=False,
                          input_names=["boxes", "scores"], output_names=["keep_inds"],
                          dynamic_axes={"boxes": {0: "b", 1: "n"}, "scores": {0: "b", 1: "c", 2: "n"}})  # fmt: skip
    model = onnx.load(str(path))
    assert [(n.domain, n.op_type) for n in model.graph.node] == [("mmdeploy", "NMSRotated")]
    session = opbridge_ort.InferenceSession(str(path))
    for batch, classes, count in ((2, 3, 10), (1, 5, 40), (3, 1, 0)):
        boxes, scores = inputs(batch, classes, count)
        (rows,) = session.run(None, {"boxes": boxes.numpy(), "scores": scores.numpy()})
        assert rows.tolist() == Multiclass()(boxes, scores).tolist()
