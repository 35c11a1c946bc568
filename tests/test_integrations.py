"""opbridge.patch_model on transformers' own models: every family with multi-scale deformable attention, found by
scanning transformers' sources, computes what the library's own forward computes (float64), trains (the same
gradients). The op's export through both exporters and every lowering is the parity matrix's (its shape-reading
call path); whole-model exports are the model sweep's (opbridge.tools.models, tests/test_models.py)."""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest
import torch

import opbridge
from opbridge.ops import ms_deform_attn as msda_module
from opbridge.tools import models

transformers = pytest.importorskip("transformers", reason="transformers is not installed (the test extra has it)")

_HOOK = re.compile(r"""use_kernel_forward_from_hub\(\s*["']MultiScaleDeformableAttention["']\s*\)""")


def _family(model_class: str) -> str:
    return getattr(transformers, model_class).__module__.split(".")[2]


def test_every_hooked_family_is_served():
    """A family transformers marks with the MSDA kernel hook (found in its sources, not from a list) must be in the
    sweep's zoo (built, and served by patch_model): a new family fails here, naming itself."""
    root = pathlib.Path(transformers.__file__).parent / "models"
    hooked = {path.parent.name for path in root.glob("*/modeling_*.py") if _HOOK.search(path.read_text())}
    assert len(hooked) >= 10, f"the scan found only {sorted(hooked)}: has transformers moved the hook?"
    covered = {_family(name) for name in models.TRANSFORMERS_MSDA}
    missing = sorted(hooked - covered)
    assert not missing, f"transformers families with the MSDA hook missing from opbridge.tools.models: {missing}"


def _build(model_class: str, dtype=torch.float64, **overrides):
    config, extra = models.TRANSFORMERS_MSDA[model_class]
    config = config()
    for name, value in overrides.items():
        setattr(config, name, value)
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval().to(dtype)
    # The layers' initialisation puts sampling points exactly on pixel centres, where bilinear sampling has no
    # derivative (each kernel picks a side): a small perturbation moves them off, as training does.
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(5), dtype=dtype) * 0.02)
    size = 128 if not model_class.startswith(("LwDetr", "RfDetr")) else 256
    wrapper = models._HuggingFaceWrapper(model, extra)
    pixels = torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(3), dtype=dtype)
    models._unit_scale_convolutions(wrapper, (pixels,))  # random backbones' features vanish otherwise
    return wrapper, pixels


@pytest.fixture
def op_calls(monkeypatch):
    calls = []
    original = msda_module.ms_deform_attn

    def counting(*args):
        calls.append(args[0].shape)
        return original(*args)

    monkeypatch.setattr(msda_module, "ms_deform_attn", counting)
    return calls


def _loss(output: torch.Tensor) -> torch.Tensor:
    weights = torch.randn(output.shape, generator=torch.Generator().manual_seed(7), dtype=output.dtype)
    return (output * weights.to(output.device)).sum()


@pytest.mark.parametrize("model_class", sorted(models.TRANSFORMERS_MSDA))
def test_patched_family_matches_the_library(model_class, op_calls):
    _check_patched_matches_the_library(model_class, *_build(model_class), op_calls)


@pytest.mark.parametrize("model_class, points", [("DFineModel", [3, 6, 3]), ("Deimv2Model", [4, 2, 1])])
def test_per_level_point_counts_match_the_library(model_class, points, op_calls):
    """D-FINE's and DEIMv2's configs may give each level its own number of points (their tests use [3, 6, 3]):
    served by padding the shorter levels with samples the op skips."""
    model, pixels = _build(model_class, decoder_n_points=points)
    assert any(getattr(m, "num_points_list", None) == points for m in model.modules())
    _check_patched_matches_the_library(model_class, model, pixels, op_calls)


def _check_patched_matches_the_library(model_class, model, pixels, op_calls):
    expected = model(pixels)
    assert expected.std() > 1e-3, f"{model_class}: a degenerate output ({expected.std():.3g}) would compare vacuously"
    _loss(expected).backward()
    expected_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    with opbridge.patch_model(model) as patch:
        assert patch, f"{model_class}: patch_model swapped nothing"
        got = model(pixels)
        assert op_calls, f"{model_class}: the patched model never called opbridge's op ({patch.swapped})"
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
        _loss(got).backward()
    got_grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got_grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-8, atol=1e-10, msg=f"{model_class}: grad of {name}")
    # restore() undid it: the library's own forward again.
    calls = len(op_calls)
    model(pixels)
    assert len(op_calls) == calls


def test_tensors_the_op_cannot_take_are_handed_back():
    """A device without an opbridge kernel (meta here; CUDA without the CUDA library), or tensors on two devices,
    go back to the library's own code; CUDA is served exactly where the CUDA library has the op."""
    from opbridge import _extension, integrations

    value = torch.zeros(1, 4, 2, 8)
    locations, weights = torch.zeros(1, 3, 2, 1, 2, 2), torch.zeros(1, 3, 2, 1, 2)
    assert integrations._served(value, locations, weights)
    assert not integrations._served(value.to("meta"), locations.to("meta"), weights.to("meta"))
    assert not integrations._served(value, locations.to("meta"), weights)
    assert integrations._has_cuda_kernel("ms_deform_attn") == (_extension.cuda_library is not None)


def test_variant_the_op_does_not_cover_keeps_the_library_function(op_calls):
    """RT-DETR v2 with the "discrete" (nearest) method: the library's own function runs (same result, no op call)."""
    config, _ = models.TRANSFORMERS_MSDA["RTDetrV2Model"]
    torch.manual_seed(0)
    model = transformers.RTDetrV2Model(config().__class__(**{**config().to_dict(), "decoder_method": "discrete"}))
    model = models._HuggingFaceWrapper(model.eval().double())
    pixels = torch.rand(1, 3, 128, 128, dtype=torch.float64)
    expected = model(pixels)
    with opbridge.patch_model(model):
        torch.testing.assert_close(model(pixels), expected, rtol=0, atol=0)
    assert not op_calls


def test_patch_model_rejects_a_non_module():
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        opbridge.patch_model("model")


def test_every_served_family_module_is_importable():
    for model_class in models.TRANSFORMERS_MSDA:
        importlib.import_module(getattr(transformers, model_class).__module__)


def test_value_gradient_reaches_batch_norm_in_a_layout_torch_gets_right():
    """D-FINE's pattern: an encoder feature map (BatchNorm) flattened to MSDA's value without a projection. The
    gradient opbridge hands on for value must give BatchNorm's parameters their true gradients (torch 2.14.1's CPU
    BatchNorm backward is wrong for a channels-last gradient whose size-1 batch dim has a non-canonical stride,
    the layout opbridge's contiguous gradient takes after the model's flatten/transpose)."""
    from opbridge.integrations import _GradientLikeTheLibrary

    heads, channels, height, width = 2, 8, 6, 5
    norm = torch.nn.BatchNorm2d(heads * channels).double().eval()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.running_var.uniform_(0.5, 2.0)
    feature = torch.randn(1, heads * channels, height, width, dtype=torch.float64)
    value = norm(feature).flatten(2).transpose(1, 2).reshape(1, height * width, heads, channels)
    gradient = torch.randn(value.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (grad_bias,) = torch.autograd.grad(_GradientLikeTheLibrary.apply(value), norm.bias, gradient.contiguous())
    # BatchNorm's bias gradient is the sum of the output gradient over batch and space, per channel.
    want = gradient.reshape(height * width, heads * channels).sum(0)
    torch.testing.assert_close(grad_bias, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("exporter, opset", [("legacy", 17), ("dynamo", 18)])
@pytest.mark.parametrize("lowering", ["custom", "standard"])
@pytest.mark.parametrize(
    "model_class, overrides", [("DeformableDetrModel", {}), ("DFineModel", {"decoder_n_points": [3, 6, 3]})]
)
def test_patched_model_exports_with_each_lowering(model_class, overrides, lowering, exporter, opset, tmp_path):
    """A patched model (the hub layer; the v2 function with per-level point counts) exports with opbridge's one
    node (custom) or standard ONNX ops and runs in ORT as in eager (at the exported size: these models' own code
    fixes the image size, see docs/models.md)."""
    import warnings

    import numpy as np
    import onnx

    import opbridge_ort

    model, pixels = _build(model_class, torch.float32, **overrides)
    opbridge.patch_model(model)
    with torch.no_grad():
        expected = model(pixels).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's and torch.export's notes on the model's own code
        path = str(tmp_path / "model.onnx")
        proto = opbridge.onnx.export(model, (pixels,), path, opset_version=opset, dynamo=exporter == "dynamo",
                                     lowering=lowering, input_names=["pixels"])  # fmt: skip
    nodes = {(n.domain, n.op_type) for n in onnx.load(str(tmp_path / "model.onnx")).graph.node}
    has_node = ("opbridge", "MultiScaleDeformableAttention") in nodes
    assert has_node == (lowering == "custom"), sorted(d for d in nodes if d[0])
    got = opbridge_ort.InferenceSession(proto).run(None, {"pixels": pixels.numpy()})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_level_table_from_traced_sizes_stays_dynamic():
    """Under the TorchScript tracer a feature map's shape gives 0-d tensors: the level table built from them must
    follow the input's size in the trace (transformers' own table, from torch.as_tensor, is a constant of it)."""
    from opbridge.integrations import _level_table

    def table(x):
        levels = [(x.shape[2], x.shape[3]), (x.shape[2] // 2, x.shape[3] // 2)]
        shapes, starts = _level_table(levels)
        return shapes, starts

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(table, torch.zeros(1, 1, 8, 6))
    shapes, starts = traced(torch.zeros(1, 1, 12, 10))
    assert shapes.tolist() == [[12, 10], [6, 5]] and starts.tolist() == [0, 120]


def test_published_deformable_detr_config_runs_in_ort():
    """transformers' Deformable DETR at its published configuration (d_model 256, 8 heads, 4 levels x 4 points),
    exported as a user does (plain torch.onnx.export, opset 17, no patch_model): the TorchScript exporter types the
    sampling grid float64 while the input is float32, and ONNX Runtime refuses such a GridSample; opbridge's
    grid_sampler rule gives the grid the input's dtype, as eager torch requires."""
    import io
    import warnings

    import numpy as np
    import onnxruntime
    import transformers

    torch.manual_seed(0)
    backbone = transformers.ResNetConfig(
        depths=[1, 1, 1, 1],
        hidden_sizes=[8, 16, 32, 64],
        layer_type="basic",
        out_features=["stage2", "stage3", "stage4"],
    )
    config = transformers.DeformableDetrConfig(backbone_config=backbone, encoder_layers=1, decoder_layers=1)
    model = transformers.DeformableDetrModel(config).eval()
    pixels = torch.randn(1, 3, 128, 128)
    with torch.no_grad():
        expected = model(pixels).last_hidden_state.numpy()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on transformers' own code
        torch.onnx.export(model, (pixels,), buffer, dynamo=False, opset_version=17, input_names=["pixel_values"],
                          output_names=["init_reference_points", "last_hidden_state"])  # fmt: skip
    session = onnxruntime.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    (got,) = session.run(["last_hidden_state"], {"pixel_values": pixels.numpy()})
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
