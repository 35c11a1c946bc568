"""opbridge.patch_model beyond transformers: Ultralytics' RT-DETR and Roboflow's RF-DETR (the rfdetr package) run
opbridge's op, with the libraries' own forward and backward (float64), and export as its node.

Skipped where the library is not installed (it is not one of opbridge's dependencies: `pip install ultralytics`,
`pip install rfdetr`)."""

from __future__ import annotations

import warnings

import pytest
import torch

import opbridge
from opbridge.ops import ms_deform_attn as msda_module

SHAPES = [(8, 10), (4, 5), (2, 3)]
KEYS = sum(h * w for h, w in SHAPES)


@pytest.fixture
def op_calls(monkeypatch):
    calls = []
    original = msda_module.ms_deform_attn

    def counting(*args):
        calls.append(args[3].shape)
        return original(*args)

    monkeypatch.setattr(msda_module, "ms_deform_attn", counting)
    return calls


def _perturbed(module):
    """Off the initial grid of sampling offsets (samples on pixel centres, where bilinear sampling has no
    derivative)."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.1)
    return module


def _same_forward_and_backward(module, args, leaves, op_calls):
    expected = module(*args)
    expected_grads = torch.autograd.grad(expected.square().sum(), [*leaves, *module.parameters()])
    with opbridge.patch_model(module) as patch:
        assert patch, "patch_model swapped nothing"
        got = module(*args)
        assert op_calls, f"the patched module never called opbridge's op ({patch.swapped})"
        got_grads = torch.autograd.grad(got.square().sum(), [*leaves, *module.parameters()])
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    for a, b in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
    calls = len(op_calls)
    module(*args)  # restored: the library's own function again
    assert len(op_calls) == calls
    return patch


@pytest.mark.parametrize("points", [2, 4])
def test_ultralytics_msdeformattn_runs_the_op(op_calls, points):
    transformer = pytest.importorskip("ultralytics.nn.modules.transformer")
    module = _perturbed(transformer.MSDeformAttn(d_model=32, n_levels=3, n_heads=4, n_points=2).double())
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, 7, 32, dtype=torch.float64, generator=generator).requires_grad_()
    value = torch.randn(2, KEYS, 32, dtype=torch.float64, generator=generator).requires_grad_()
    boxes = torch.rand(2, 7, 1, points, dtype=torch.float64, generator=generator)  # centres, or boxes (cx, cy, w, h)
    _same_forward_and_backward(module, (query, boxes, value, SHAPES), [query, value], op_calls)


@pytest.mark.parametrize("export_mode", [False, True], ids=["eager-layout", "export-layout"])
def test_rfdetr_msdeformattn_runs_the_op(op_calls, export_mode):
    modules = pytest.importorskip("rfdetr.models.ops.modules.ms_deform_attn")
    module = _perturbed(modules.MSDeformAttn(d_model=32, n_levels=3, n_heads=4, n_points=2).double())
    module._export = export_mode  # rfdetr's export mode folds (levels, points) into one axis
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(2, 7, 32, dtype=torch.float64, generator=generator).requires_grad_()
    value = torch.randn(2, KEYS, 32, dtype=torch.float64, generator=generator).requires_grad_()
    reference = torch.rand(2, 7, 3, 2, dtype=torch.float64, generator=generator)
    shapes = torch.tensor(SHAPES)
    starts = torch.tensor([0, 80, 100])
    args = (query, reference, value, shapes, starts, None, SHAPES)
    _same_forward_and_backward(module, args, [query, value], op_calls)


def test_a_release_whose_function_differs_is_left_alone(monkeypatch):
    """Version guard: a library function with other parameters is not patched blindly."""
    transformer = pytest.importorskip("ultralytics.nn.modules.transformer")

    def multi_scale_deformable_attn_pytorch(value, shapes, locations, weights, extra):  # another release
        raise AssertionError("not called")

    monkeypatch.setattr(transformer, "multi_scale_deformable_attn_pytorch", multi_scale_deformable_attn_pytorch)
    module = transformer.MSDeformAttn(d_model=32, n_levels=3, n_heads=4, n_points=2)
    with pytest.warns(UserWarning, match="multi_scale_deformable_attn_pytorch has parameters"):
        patch = opbridge.patch_model(module)
    assert not patch and transformer.multi_scale_deformable_attn_pytorch is multi_scale_deformable_attn_pytorch


def test_ultralytics_rtdetr_model_is_served_and_exports_the_node(tmp_path, op_calls):
    """The whole RT-DETR of Ultralytics (rtdetr-l.yaml, random weights, no download): same detections as its own code
    (float64), and an export with the custom lowering carries opbridge's node."""
    tasks = pytest.importorskip("ultralytics.nn.tasks")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tasks.RTDETRDetectionModel("rtdetr-l.yaml", verbose=False).eval()
    pixels = torch.rand(1, 3, 128, 128, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model.double()(pixels)[0]
        with opbridge.patch_model(model) as patch:
            assert patch.swapped == [
                "ultralytics.nn.modules.transformer.multi_scale_deformable_attn_pytorch",
                "ultralytics.nn.modules.head.RTDETRDecoder (anchors from the sizes under torch.export)",
            ]
            got = model(pixels)[0]
    assert op_calls and len(op_calls) == sum(type(m).__name__ == "MSDeformAttn" for m in model.modules())
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)

    class Boxes(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x)[0]

    with opbridge.patch_model(model), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's notes on the model's own code
        exported = opbridge.onnx.export(Boxes(model.float()), (pixels.float(),), None, lowering="custom",
                                        dynamo=False, opset_version=17)  # fmt: skip
    assert "MultiScaleDeformableAttention" in {n.op_type for n in exported.graph.node if n.domain == "opbridge"}


def test_ultralytics_own_export_path_writes_the_node_with_dynamic_sizes(tmp_path, monkeypatch):
    """`YOLO(...).export(format="onnx", dynamic=True)` (Ultralytics' own export, here RT-DETR from its yaml, random
    weights) under patch_model and the custom lowering: every MSDA layer is one opbridge node, batch and image size
    stay dynamic, and ONNX Runtime with opbridge's library runs it at another batch and size."""
    ultralytics = pytest.importorskip("ultralytics")
    onnxruntime = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    import opbridge_ort

    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ultralytics.RTDETR("rtdetr-l.yaml")
        layers = sum(type(m).__name__ == "MSDeformAttn" for m in model.model.modules())
        with opbridge.patch_model(model.model), opbridge.onnx.lowering("custom"):
            path = model.export(format="onnx", dynamic=True, imgsz=160, simplify=False)
    graph = onnx.load(path).graph
    assert sum(n.domain == "opbridge" and n.op_type == "MultiScaleDeformableAttention" for n in graph.node) == layers
    (images,) = graph.input
    assert [d.dim_param or d.dim_value for d in images.type.tensor_type.shape.dim] == ["batch", 3, "height", "width"]
    session = onnxruntime.InferenceSession(path, opbridge_ort.session_options())
    (out, *_) = session.run(None, {images.name: torch.rand(2, 3, 128, 192).numpy()})
    assert out.shape[0] == 2 and bool(torch.isfinite(torch.from_numpy(out)).all())


def test_rfdetr_own_export_path_writes_the_node_with_a_dynamic_batch(tmp_path, monkeypatch):
    """rfdetr's own `export(dynamic_batch=True)` (RF-DETR Nano, random weights, no download) under patch_model and
    the custom lowering: every MSDA layer is one opbridge node, and ONNX Runtime with opbridge's library runs it at
    another batch (rfdetr's export fixes the image size itself: its `shape` argument)."""
    rfdetr = pytest.importorskip("rfdetr")
    onnxruntime = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    import opbridge_ort

    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detector = rfdetr.RFDETRNano(pretrain_weights=None, device="cpu")
        network = detector.model.model
        layers = sum(type(m).__name__ == "MSDeformAttn" for m in network.modules())
        with opbridge.patch_model(network), opbridge.onnx.lowering("custom"):
            path = str(detector.export(output_dir=str(tmp_path), dynamic_batch=True, verbose=False))
    graph = onnx.load(path).graph
    assert sum(n.domain == "opbridge" and n.op_type == "MultiScaleDeformableAttention" for n in graph.node) == layers
    (images,) = graph.input
    size = [d.dim_param or d.dim_value for d in images.type.tensor_type.shape.dim]
    assert isinstance(size[0], str), size
    session = onnxruntime.InferenceSession(path, opbridge_ort.session_options())
    outputs = session.run(None, {images.name: torch.rand(2, *size[1:]).numpy()})
    assert all(o.shape[0] == 2 for o in outputs)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("library", ["ultralytics", "rfdetr"])
def test_patched_layers_export_as_the_node_with_either_exporter(library, dynamo):
    """The libraries' attention layers (rfdetr's in its export mode, which its own export() sets), patched, export
    as opbridge::MultiScaleDeformableAttention with both exporters and run in ONNX Runtime as in eager."""
    import numpy as np

    opbridge_ort = pytest.importorskip("opbridge_ort")
    generator = torch.Generator().manual_seed(4)
    query, value = torch.randn(2, 7, 32, generator=generator), torch.randn(2, KEYS, 32, generator=generator)
    if library == "ultralytics":
        layer = pytest.importorskip("ultralytics.nn.modules.transformer").MSDeformAttn(32, 3, 4, 2).eval()
        inputs = (query, torch.rand(2, 7, 1, 2, generator=generator), value)

        def call(q, reference, v):
            return layer(q, reference, v, SHAPES)
    else:
        layer = pytest.importorskip("rfdetr.models.ops.modules.ms_deform_attn").MSDeformAttn(32, 3, 4, 2).eval()
        layer._export = True
        inputs = (query, torch.rand(2, 7, 3, 2, generator=generator), value, torch.tensor(SHAPES),
                  torch.tensor([0, 80, 100]))  # fmt: skip

        def call(q, reference, v, shapes, starts):
            return layer(q, reference, v, shapes, starts, None, SHAPES)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, *args):
            return call(*args)

    with opbridge.patch_model(layer), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = Layer()(*inputs)
        model = opbridge.onnx.export(Layer(), inputs, None, lowering="custom", dynamo=dynamo, opset_version=18)
    assert {n.op_type for n in model.graph.node if n.domain == "opbridge"} == {"MultiScaleDeformableAttention"}
    session = opbridge_ort.InferenceSession(model.SerializeToString())
    feeds = {i.name: a.numpy() for i, a in zip(model.graph.input, inputs, strict=False)}
    np.testing.assert_allclose(session.run(None, feeds)[0], expected.detach().numpy(), rtol=1e-5, atol=1e-6)


_OBB_EXPORT = """
import sys, warnings
if sys.argv[1] == "with":
    import opbridge
import numpy, onnx, onnxruntime, torch, ultralytics

warnings.simplefilter("ignore")
torch.manual_seed(0)
model = ultralytics.YOLO("yolo11n-obb.yaml")
if sys.argv[1] == "with":
    # nothing of opbridge's computes ProbIoU fast-NMS: only the head's anchors rewrite (for torch.export) applies
    assert all("under torch.export" in label for label in opbridge.patch_model(model.model).swapped)
path = model.export(format="onnx", nms=True, dynamic=True, imgsz=160, simplify=False, conf=0.0001)
session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
images = torch.rand(2, 3, 160, 192, generator=torch.Generator().manual_seed(1)).numpy()
numpy.save(sys.argv[2] + ".npy", session.run(None, {session.get_inputs()[0].name: images})[0])
open(sys.argv[2] + ".txt", "w").write(" ".join(n.op_type for n in onnx.load(path).graph.node))
"""


def test_ultralytics_obb_export_with_its_rotated_nms_is_the_same_with_opbridge(tmp_path):
    """YOLO11n-OBB's own export with its rotated NMS in the graph (`nms=True`: Fast-NMS on ProbIoU, a Gaussian
    similarity that no opbridge op computes -- opbridge's nms_rotated is greedy NMS on polygon IoU, which would keep
    other boxes -- so patch_model swaps no op in it): `import opbridge` and patch_model change neither the graph nor
    the detections (each export in a process of its own, random weights, no download)."""
    pytest.importorskip("ultralytics")
    import subprocess
    import sys

    import numpy as np

    script = tmp_path / "export.py"
    script.write_text(_OBB_EXPORT)
    for mode in ("without", "with"):
        (tmp_path / mode).mkdir()
        subprocess.run([sys.executable, str(script), mode, str(tmp_path / mode / "out")], cwd=tmp_path / mode,
                       check=True, capture_output=True, timeout=600)  # fmt: skip
    without, with_ = (np.load(tmp_path / m / "out.npy") for m in ("without", "with"))
    assert without.shape[0] == 2 and without.shape[-1] == 7  # (cx, cy, w, h, score, class, angle) per image
    np.testing.assert_array_equal(with_, without)
    assert (tmp_path / "with" / "out.txt").read_text() == (tmp_path / "without" / "out.txt").read_text()


@pytest.mark.parametrize("model", ["ultralytics.rtdetr-l", "rfdetr.RFDETRNano"])
def test_patched_models_export_a_dynamic_size_and_batch_with_torch_export(model):
    """The model sweep's case with opbridge and torch's default exporter (opset 18): exported at batch 2, ONNX Runtime
    matches eager at another image size and at batch 3 (Ultralytics: its heads' cached anchors rebuilt from the
    symbolic sizes; rfdetr: its level table and DINOv2's export branch, opbridge.rewrites)."""
    from opbridge.tools import models

    pytest.importorskip(model.split(".")[0])
    result = models.run_case(model, True, "dynamo", 18)
    assert (result.outcome, result.batch) == ("ok", "dynamic"), result
