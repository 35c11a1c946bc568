"""torchvision's batched_nms under torch.export (the dynamo exporter): opbridge answers it with a branch-free
per-class NMS while an export traces, so torchvision's detectors export; the result must be what per-class NMS
keeps, and outside an export torchvision's own function runs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import opbridge  # noqa: F401  (installs the wrapper when torchvision.ops is imported)

torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")
ops = pytest.importorskip("torchvision.ops", reason="torchvision.ops is not available")
from opbridge.onnx._batched_nms import batched_nms_for_export  # noqa: E402


def _per_class_nms(boxes, scores, idxs, threshold):
    """The definition, class by class with torchvision's nms, merged by decreasing score."""
    kept = []
    for label in idxs.unique():
        where = torch.nonzero(idxs == label).flatten()
        kept.append(where[torchvision.ops.nms(boxes[where], scores[where], threshold)])
    kept = torch.cat(kept) if kept else torch.empty(0, dtype=torch.int64)
    return kept[scores[kept].argsort(descending=True, stable=True)]


def _boxes(count, classes, seed, offset=0.0):
    generator = torch.Generator().manual_seed(seed)
    corner = torch.rand(count, 2, generator=generator) * 50 + offset
    size = torch.rand(count, 2, generator=generator) * 20 + 1
    scores = torch.rand(count, generator=generator)
    idxs = torch.randint(0, classes, (count,), generator=generator)
    return torch.cat([corner, corner + size], 1), scores, idxs


@pytest.mark.parametrize("count, classes, offset", [(300, 4, 0.0), (2000, 7, 0.0), (400, 3, -80.0), (1, 1, 0.0)])
def test_matches_per_class_nms(count, classes, offset):
    boxes, scores, idxs = _boxes(count, classes, seed=count, offset=offset)
    want = _per_class_nms(boxes, scores, idxs, 0.5)
    assert torch.equal(batched_nms_for_export(boxes, scores, idxs, 0.5), want)


def test_negative_coordinates_do_not_merge_classes():
    # torchvision's coordinate trick shifts by class * (max + 1): with negative coordinates, two boxes of
    # different classes can then overlap; opbridge's shift spans min..max.
    boxes = torch.tensor([[-10.0, -10.0, 0.0, 0.0], [-10.0, -10.0, 0.0, 0.0]])
    scores, idxs = torch.tensor([0.9, 0.8]), torch.tensor([0, 1])
    assert batched_nms_for_export(boxes, scores, idxs, 0.5).tolist() == [0, 1]


def test_empty_input():
    out = batched_nms_for_export(torch.empty(0, 4), torch.empty(0), torch.empty(0, dtype=torch.int64), 0.5)
    assert out.shape == (0,) and out.dtype == torch.int64


def test_outside_an_export_torchvision_runs():
    assert getattr(ops.boxes.batched_nms, "__opbridge_wrapped__", False)
    assert ops.batched_nms is ops.boxes.batched_nms
    boxes, scores, idxs = _boxes(3000, 5, seed=3)  # > 4000 coordinates: torchvision's per-class loop
    original = ops.boxes.batched_nms.__wrapped__
    assert torch.equal(ops.batched_nms(boxes, scores, idxs, 0.5), original(boxes, scores, idxs, 0.5))


class _Detector(torch.nn.Module):
    """The detectors' pattern: keep scores over a threshold (a data-dependent count), then batched_nms."""

    def forward(self, boxes, scores, idxs):
        keep = torch.where(scores > 0.3)[0]
        boxes, scores, idxs = boxes[keep], scores[keep], idxs[keep]
        kept = ops.batched_nms(boxes, scores, idxs, 0.5)
        return boxes[kept], scores[kept]


# torchvision's fake kernel for nms (an output of data-dependent length) calls a torch API torch now deprecates
@pytest.mark.filterwarnings("ignore:`create_unbacked_symint` is deprecated:FutureWarning")
def test_dynamo_export_runs_in_ort():
    onnxruntime = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    pytest.importorskip("onnxscript", reason="onnxscript is not installed")
    model = _Detector().eval()
    example = _boxes(1500, 4, seed=5)  # 6000 coordinates: torchvision would branch on the count
    with warnings.catch_warnings():  # torch.onnx's notes on axis names shared by the three inputs
        warnings.simplefilter("ignore", UserWarning)
        program = torch.onnx.export(model, example, dynamo=True, opset_version=18,
                                    dynamic_shapes=({0: "count"},) * 3)  # fmt: skip
    session = onnxruntime.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed, count in ((5, 1500), (6, 700)):
        inputs = _boxes(count, 4, seed=seed)
        want = model(*inputs)
        got = session.run(None, {name.name: t.numpy() for name, t in zip(session.get_inputs(), inputs, strict=True)})
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-6)
