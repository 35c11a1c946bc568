"""The export-time rewrites (python/opbridge/rewrites.py): each computes what the library code it replaces computes
(bit for bit, float64 and float32), keeps sizes symbolic under torch.export and traced under the TorchScript
tracer, is applied by patch_model only to the code it was written for, and is undone by the Patch; a patched
Deformable DETR exports with a dynamic image size and batch with torch's default exporter and runs in ONNX Runtime
at another size and batch as in eager."""

from __future__ import annotations

import importlib
import sys
import types
import warnings

import pytest
import torch

import opbridge
from opbridge import rewrites
from opbridge.integrations import Patch

pytest.importorskip("transformers", reason="transformers is not installed (the test extra has it)")

#: (module, class) of the deformable encoders whose get_reference_points the rewrite replaces.
ENCODERS = [
    ("transformers.models.deformable_detr.modeling_deformable_detr", "DeformableDetrEncoder"),
    ("transformers.models.grounding_dino.modeling_grounding_dino", "GroundingDinoEncoder"),
    ("transformers.models.mm_grounding_dino.modeling_mm_grounding_dino", "MMGroundingDinoEncoder"),
    ("transformers.models.mask2former.modeling_mask2former", "Mask2FormerPixelDecoderEncoderOnly"),
    ("transformers.models.oneformer.modeling_oneformer", "OneFormerPixelDecoderEncoderOnly"),
]


def _encoder(module_name: str, class_name: str):
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        pytest.skip(f"{module_name} is not in this transformers")
    return module, getattr(module, class_name)


@pytest.mark.parametrize(("module_name", "class_name"), ENCODERS, ids=[c for _, c in ENCODERS])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
def test_reference_points_equal_the_librarys(module_name, class_name, dtype):
    _, encoder = _encoder(module_name, class_name)
    library = vars(encoder)["get_reference_points"].__func__
    generator = torch.Generator().manual_seed(0)
    for shapes in ([(7, 9), (4, 5), (2, 3), (1, 1)], [(25, 38)], [(13, 1), (1, 13)], [(100, 152), (50, 76)]):
        ratios = (0.4 + 0.6 * torch.rand(2, len(shapes), 2, generator=generator, dtype=torch.float64)).to(dtype)
        assert torch.equal(rewrites.reference_points(shapes, ratios, "cpu"), library(shapes, ratios, "cpu"))


@pytest.mark.parametrize(("module_name", "class_name"), ENCODERS, ids=[c for _, c in ENCODERS])
def test_the_library_functions_are_the_code_the_rewrite_was_written_for(module_name, class_name):
    _, encoder = _encoder(module_name, class_name)
    assert rewrites.fingerprint(vars(encoder)["get_reference_points"].__func__) in rewrites.REFERENCE_POINTS


def test_the_fingerprint_ignores_names_and_docstrings_but_not_code():
    def a(shapes, ratios):
        """One docstring."""
        return [torch.linspace(0.5, h - 0.5, h) * ratios for h, _ in shapes]

    def b(sizes, valid):
        return [torch.linspace(0.5, height - 0.5, height) * valid for height, _ in sizes]

    def c(shapes, ratios):
        return [torch.linspace(0.5, h - 0.5, h) / ratios for h, _ in shapes]

    assert rewrites.fingerprint(a) == rewrites.fingerprint(b) != rewrites.fingerprint(c)
    assert rewrites.fingerprint(len) is None  # no Python source


def test_size_aware_as_tensor_is_torchs_for_numbers():
    shim = rewrites.SizeAwareTorch()
    for data, kwargs in (([(3, 4), (5, 6)], dict(dtype=torch.long)), ([(3, 4)], {}), ([1.5, 2.0], {}), (7, {})):
        expected = torch.as_tensor(data, **kwargs)
        found = shim.as_tensor(data, **kwargs)
        assert found.dtype == expected.dtype and torch.equal(found, expected)
    assert shim.cat is torch.cat and shim.nn is torch.nn


class _SpatialShapes(torch.nn.Module):
    """A level table built as the DETR family builds it: a list of (height, width) of feature maps."""

    def forward(self, x):
        maps = [x, x[:, :, ::2, ::2]]
        as_tensor = rewrites.SizeAwareTorch().as_tensor
        shapes = as_tensor([tuple(m.shape[2:]) for m in maps], dtype=torch.long, device=x.device)
        return shapes * 1


def test_size_aware_as_tensor_keeps_sizes_symbolic_under_torch_export():
    size = {2: torch.export.Dim("height", min=4, max=256), 3: torch.export.Dim("width", min=4, max=256)}
    program = torch.export.export(_SpatialShapes(), (torch.randn(1, 2, 12, 20),), dynamic_shapes=({**size},))
    out = program.module()(torch.randn(1, 2, 30, 18))
    assert out.tolist() == [[30, 18], [15, 9]]


def test_size_aware_as_tensor_keeps_sizes_traced_under_the_torchscript_tracer():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(_SpatialShapes(), (torch.randn(1, 2, 12, 20),))
    assert traced(torch.randn(1, 2, 30, 18)).tolist() == [[30, 18], [15, 9]]


def test_a_function_that_is_not_the_one_written_for_is_left_alone_with_a_warning(monkeypatch):
    module = types.ModuleType("transformers.models.opbridge_test.modeling_opbridge_test")

    class Encoder:
        @staticmethod
        def get_reference_points(spatial_shapes_list, valid_ratios, device):
            return [torch.linspace(0.25, h - 0.25, h) for h, _ in spatial_shapes_list]

    Encoder.__module__ = module.__name__
    module.Encoder = Encoder
    monkeypatch.setitem(sys.modules, module.__name__, module)
    patch = Patch()
    with pytest.warns(UserWarning, match="get_reference_points is not the code its export rewrite was written for"):
        rewrites.apply({module.__name__}, patch)
    assert not patch and isinstance(vars(Encoder)["get_reference_points"], staticmethod)


def _tiny_deformable_detr():
    from opbridge.tools.models import CASES

    model, inputs = CASES["transformers.DeformableDetrModel"].build()[:2]
    return model, inputs


def test_patch_model_rewrites_deformable_detr_and_restore_undoes_it():
    model, _ = _tiny_deformable_detr()
    module = sys.modules["transformers.models.deformable_detr.modeling_deformable_detr"]
    library = vars(module.DeformableDetrEncoder)["get_reference_points"]
    with opbridge.patch_model(model) as patch:
        assert any(s.endswith("DeformableDetrEncoder.get_reference_points") for s in patch.swapped), patch.swapped
        assert any(s.endswith("modeling_deformable_detr.torch.as_tensor") for s in patch.swapped), patch.swapped
        assert isinstance(module.torch, rewrites.SizeAwareTorch)
    assert module.torch is torch and vars(module.DeformableDetrEncoder)["get_reference_points"] is library


def test_patched_deformable_detr_exports_a_dynamic_size_and_batch_with_the_default_exporter(tmp_path):
    """torch.onnx.export (dynamo) of a patched Deformable DETR (random weights, small config): ONNX Runtime at
    another image size and batch matches eager; without the rewrites the graph keeps the exported size."""
    onnxruntime = pytest.importorskip("onnxruntime")
    import opbridge_ort

    model, inputs = _tiny_deformable_detr()
    (pixels,) = inputs
    other = torch.rand(2, 3, pixels.shape[2] + 32, pixels.shape[3] - 32, generator=torch.Generator().manual_seed(1))
    dims = {0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO}
    path = tmp_path / "detr.onnx"
    with opbridge.patch_model(model), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (pixels,), str(path), dynamic_shapes=(dims,), input_names=["pixel_values"])
        expected = model(other)
    session = onnxruntime.InferenceSession(str(path), opbridge_ort.session_options())
    (found, *_) = session.run(None, {"pixel_values": other.numpy()})
    torch.testing.assert_close(torch.from_numpy(found), expected, rtol=1e-3, atol=1e-4)
