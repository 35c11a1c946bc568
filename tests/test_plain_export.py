"""`import opbridge` is enough: plain torch.onnx.export, both exporters, every op and mapping, with the
standard lowering by default; choosing another lowering is one call. Also the private hooks this needs on
the installed torch (the matrix runs this file on every supported torch), and the light import."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import warnings

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import opbridge
import opbridge_ort
from opbridge import specs
from opbridge.onnx import _torch_hooks
from opbridge.tools import parity

SPECS = [s for s in specs.all_specs() if s.call_paths and s.is_available()]


def _plain_export(module, inputs, dynamo: bool) -> onnx.ModelProto:
    """What a user writes: no opset, no translation table, no opbridge call."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch's notice about dynamo=False
        if dynamo:
            return torch.onnx.export(module, inputs, dynamo=True, verbose=False).model_proto
        buffer = io.BytesIO()
        torch.onnx.export(module, inputs, buffer, dynamo=False)
        return onnx.load_from_string(buffer.getvalue())


def _run(model: onnx.ModelProto, inputs, library: bool = False):
    names = [i.name for i in model.graph.input]
    feeds = {name: t.numpy() for name, t in zip(names, inputs, strict=True)}
    if library:
        return opbridge_ort.InferenceSession(model).run(None, feeds)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_plain_torch_onnx_export_of_every_op(spec, dynamo):
    path = next(iter(spec.call_paths))
    module = spec.module(path)
    dtype = spec.dtypes[0]
    inputs = spec.sample_inputs(dtype, spec.operand_kinds[0], 2)
    opset = (
        torch.onnx._constants.ONNX_DEFAULT_OPSET if not dynamo else max(18, torch.onnx._constants.ONNX_DEFAULT_OPSET)
    )
    if not any(lowering.kind == "standard" and lowering.supports(opset) for lowering in spec.lowerings):
        pytest.skip(f"{spec.name} has no standard lowering at torch's default opset {opset}")
    model = _plain_export(module, inputs, dynamo)
    domains = {n.domain for n in model.graph.node}
    assert domains <= {"", "ai.onnx"}, f"the default lowering must be standard ONNX, got domains {domains}"
    with torch.no_grad():
        expected = module(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)  # ops with several outputs: each
    gap = spec.known_gaps and spec.known_gaps(
        parity.Cell(spec.name, path, "dynamo" if dynamo else "legacy", "standard", opset, parity._DTYPE_NAMES[dtype])
    )
    try:
        got = _run(model, inputs)
    except Exception as error:  # a runtime gap the spec names (e.g. no ORT kernel) is not opbridge's failure
        if gap:
            pytest.skip(f"ONNX Runtime cannot run it here: {gap}")
        raise AssertionError(f"{spec.name}: {error}") from error
    assert len(got) == len(expected), f"{spec.name}: {len(got)} outputs in ONNX Runtime, {len(expected)} in eager"
    for ort_out, torch_out in zip(got, expected, strict=True):
        np.testing.assert_allclose(ort_out, torch_out.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_lowering_block_chooses_custom_nodes(dynamo):
    module, inputs = opbridge.nn.MyAdd().eval(), (torch.randn(2, 3), torch.randn(3))
    with opbridge.onnx.lowering("custom"):
        assert opbridge.onnx.current_lowering() == "custom"
        model = _plain_export(module, inputs, dynamo)
    assert opbridge.onnx.current_lowering() == "standard"
    assert [(n.domain, n.op_type) for n in model.graph.node] == [("opbridge", "MyAdd")]
    (got,) = _run(model, inputs, library=True)
    np.testing.assert_allclose(got, (2 * inputs[0] + inputs[1]).numpy(), rtol=1e-6)
    # And after the block, standard again.
    assert {n.op_type for n in _plain_export(module, inputs, dynamo).graph.node} <= {
        "Constant",
        "Mul",
        "Add",
        "CastLike",
    }


def test_default_lowering_for_the_process():
    module, inputs = opbridge.nn.MyAdd().eval(), (torch.randn(2, 3), torch.randn(3))
    previous = opbridge.onnx.set_default_lowering("custom")
    try:
        assert previous == "standard"
        model = _plain_export(module, inputs, dynamo=True)
        assert [n.op_type for n in model.graph.node] == ["MyAdd"]
        with opbridge.onnx.lowering("standard"):  # a block overrides the default
            assert "MyAdd" not in {n.op_type for n in _plain_export(module, inputs, dynamo=True).graph.node}
    finally:
        opbridge.onnx.set_default_lowering(previous)
    with pytest.raises(ValueError, match="lowering must be one of 'standard', 'custom', 'function'"):
        opbridge.onnx.set_default_lowering("fused")
    with pytest.raises(ValueError, match="lowering must be one of"), opbridge.onnx.lowering("Custom"):
        pass


def test_torchs_own_dynamo_rules_stay_for_ops_it_translates():
    """The ATen mappings exist for the TorchScript-based exporter; with the dynamo exporter torch's own rules
    stay (e.g. bitwise_not of a bool mask is Not, which ONNX Runtime runs; BitwiseNot has no bool kernel)."""

    class Model(torch.nn.Module):
        def forward(self, mask, x):
            return torch.where(~mask, x, torch.asinh(x))

    mask, x = torch.tensor([True, False, True]), torch.randn(3)
    model = _plain_export(Model().eval(), (mask, x), dynamo=True)
    assert "BitwiseNot" not in {n.op_type for n in model.graph.node}
    (got,) = _run(model, (mask, x))
    np.testing.assert_allclose(got, Model()(mask, x).numpy(), rtol=1e-6)


def test_lowering_blocks_are_per_thread():
    seen = {}

    def worker():
        seen["thread"] = opbridge.onnx.current_lowering()

    with opbridge.onnx.lowering("custom"):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        seen["main"] = opbridge.onnx.current_lowering()
    assert seen == {"thread": "standard", "main": "custom"}


def test_function_lowering_with_plain_dynamo_export_carries_the_functions(tmp_path):
    module, inputs = opbridge.nn.MyAdd().eval(), (torch.randn(2, 3), torch.randn(3))
    path = tmp_path / "model.onnx"
    with opbridge.onnx.lowering("function"):
        torch.onnx.export(module, inputs, str(path), dynamo=True, opset_version=20, verbose=False)
    model = onnx.load(str(path))
    assert [f.name for f in model.functions] == ["MyAdd"]
    onnx.checker.check_model(model, full_check=True)
    (got,) = _run(model, inputs)  # no library: the function's body runs
    np.testing.assert_allclose(got, (2 * inputs[0] + inputs[1]).numpy(), rtol=1e-6)


def test_function_lowering_with_plain_legacy_export_fails_clearly():
    module, inputs = opbridge.nn.MyAdd().eval(), (torch.randn(2, 3), torch.randn(3))
    with (
        opbridge.onnx.lowering("function"),
        pytest.raises(Exception, match=r"opbridge.onnx.export\(.*lowering='function'"),
    ):
        _plain_export(module, inputs, dynamo=False)


def test_the_callers_translation_table_wins_and_does_not_leak():
    """opbridge's entries are defaults: the caller's own custom_translation_table overrides them for that
    export only (torch's registry, which opbridge builds once per opset, is copied for every export)."""
    from onnxscript import opset18 as op

    def my_add_as_sub(a, b):
        return op.Sub(a, b)

    module, inputs = opbridge.nn.MyAdd().eval(), (torch.randn(2, 3), torch.randn(3))
    table = {torch.ops.opbridge.my_add.default: my_add_as_sub}
    program = torch.onnx.export(module, inputs, dynamo=True, custom_translation_table=table, verbose=False)
    assert [n.op_type for n in program.model_proto.graph.node] == ["Sub"]
    plain = torch.onnx.export(module, inputs, dynamo=True, verbose=False)
    assert "Sub" not in {n.op_type for n in plain.model_proto.graph.node}


def test_the_hooks_apply_to_this_torch():
    """The private hooks of opbridge.onnx._torch_hooks: on a torch that moved them, this fails."""
    torch.onnx.export(opbridge.nn.MyAdd().eval(), (torch.randn(2), torch.randn(2)), dynamo=True, verbose=False)
    assert _torch_hooks.status == dict.fromkeys(
        (_torch_hooks.COMPAT, _torch_hooks.REGISTRATION, _torch_hooks.DECOMPOSITION), "installed"
    )


def test_import_is_light():
    """`import opbridge` loads neither onnx, onnxscript, onnxruntime nor torchvision (nox -s bench measures the
    time it adds to `import torch`)."""
    script = (
        "import sys, torch, opbridge\n"
        "heavy = ['onnx', 'onnxscript', 'onnxruntime', 'torchvision', 'torch.onnx._internal.exporter._registration']\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "print(heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_star_import_does_not_shadow_nn_or_onnx():
    namespace: dict = {"nn": "mine", "onnx": "mine"}
    exec("from opbridge import *", namespace)
    assert namespace["nn"] == "mine" and namespace["onnx"] == "mine"
    assert namespace["my_add"] is opbridge.my_add and namespace["deform_conv2d"] is opbridge.deform_conv2d


def test_a_users_symbolic_unregistered_after_an_export_leaves_opbridges_rule():
    """mmdeploy's rewriters register their own symbolic over one opbridge has (aten::grid_sampler at opset 16) for an
    export and unregister it after: opbridge's rule must come back, not torch's builtin one. Seen through a float64
    grid_sample at opset 16, which opbridge lowers to Gathers (ONNX Runtime has no float64 GridSample-16) and torch's
    rule to GridSample; a registration the user still holds at another opset stays theirs."""

    class Sample(torch.nn.Module):
        def forward(self, x, grid):
            return torch.nn.functional.grid_sample(x, grid, align_corners=False)

    x = torch.randn(1, 2, 5, 6, dtype=torch.float64)
    grid = torch.rand(1, 3, 4, 2, dtype=torch.float64) * 2 - 1

    def op_types(opset: int) -> set[str]:
        buffer = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Sample(), (x, grid), buffer, opset_version=opset, dynamo=False)
        return {node.op_type for node in onnx.load_from_string(buffer.getvalue()).graph.node}

    def theirs(g, input, grid, *args):
        return g.op("GridSample", input, grid)

    assert "GridSample" not in op_types(16)
    torch.onnx.register_custom_op_symbolic("aten::grid_sampler", theirs, 16)
    torch.onnx.register_custom_op_symbolic("aten::grid_sampler", theirs, 11)
    try:
        assert "GridSample" in op_types(16)
        torch.onnx.unregister_custom_op_symbolic("aten::grid_sampler", 16)
        assert "GridSample" not in op_types(16)  # opbridge's rule again
        assert "GridSample" in op_types(11)  # the user's, still registered
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::grid_sampler", 16)
        torch.onnx.unregister_custom_op_symbolic("aten::grid_sampler", 11)
    assert "GridSample" not in op_types(11) and "GridSample" not in op_types(16)


def _session(model: onnx.ModelProto) -> onnxruntime.InferenceSession:
    """An ORT session of the model; a skip where this ONNX Runtime predates the model's opset (the matrix runs these
    tests under ORT releases as old as 1.16, which know opsets up to 19-23)."""
    try:
        return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as error:
        if "ValidateOpsetForDomain" in str(error):
            opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
            pytest.skip(f"ONNX Runtime {onnxruntime.__version__} predates the model's opsets {opsets}")
        raise


_TIE_CASES = [("legacy", o) for o in sorted({16, 17, 20, parity.matrix_opsets("legacy")[-1]})]
_TIE_CASES += [("dynamo", o) for o in sorted({18, 20, parity.matrix_opsets("dynamo")[-1]})]


@pytest.mark.parametrize(("exporter", "opset"), _TIE_CASES)
def test_nearest_reflection_grid_sample_breaks_ties_as_torch_does(exporter, opset):
    """A coordinate exactly halfway between pixels, reflected: torch reflects, then rounds half to even (-1.5 -> 0.5
    -> pixel 0); ONNX Runtime's GridSample (1.32) rounds first (-1.5 -> -2 -> pixel 1). opbridge's rules for both
    exporters sample nearest-with-reflection with their Gathers instead of torch's GridSample rules; half grids hit
    such ties often (the parity matrix's float16 cells found it)."""

    class Sample(torch.nn.Module):
        def forward(self, x, grid):
            return torch.nn.functional.grid_sample(x, grid, "nearest", "reflection", align_corners=False)

    x = torch.arange(12, dtype=torch.float32).reshape(1, 1, 3, 4)
    pixels = torch.tensor([-1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 4.5, 5.5], dtype=torch.float64)  # ties, unnormalized
    gx = (2 * pixels + 1) / 4 - 1  # exact in float32; the row: the middle one (y = 1.0)
    grid = torch.stack([gx, torch.zeros_like(gx)], -1).reshape(1, 1, -1, 2).float()
    if exporter == "dynamo":
        model = torch.onnx.export(
            Sample().eval(), (x, grid), dynamo=True, opset_version=opset, verbose=False
        ).model_proto
    else:
        buffer = io.BytesIO()
        torch.onnx.export(Sample().eval(), (x, grid), buffer, dynamo=False, opset_version=opset)
        model = onnx.load_from_string(buffer.getvalue())
    assert "GridSample" not in {n.op_type for n in model.graph.node}
    (got,) = _session(model).run(None, {"x": x.numpy(), "grid": grid.numpy()})
    np.testing.assert_array_equal(got, Sample()(x, grid).numpy())


@pytest.mark.parametrize("opset", sorted({18, 20, parity.matrix_opsets("dynamo")[-1]}))
@pytest.mark.parametrize("rank", [4, 5])
def test_dynamo_grid_sample_stays_one_grid_sample_node_as_torchs_rule(opset, rank):
    """opbridge's dynamo rule for grid_sample replaces torch's for two cases only (nearest with reflection; float64
    below opset 20): a float32 bilinear grid_sample of either rank stays one GridSample node, as torch writes it."""

    class Sample(torch.nn.Module):
        def forward(self, x, grid):
            return torch.nn.functional.grid_sample(x, grid, "bilinear", "border", align_corners=True)

    x = torch.randn((1, 2, 3, 4, 5)[:rank] if rank == 5 else (1, 2, 4, 5))
    grid = torch.rand((1, 2, 3, 4, 3) if rank == 5 else (1, 3, 4, 2)) * 2.4 - 1.2
    model = torch.onnx.export(Sample().eval(), (x, grid), dynamo=True, opset_version=opset, verbose=False).model_proto
    assert [n.op_type for n in model.graph.node] == ["GridSample"]
    if rank == 5 and opset < 20:
        return  # GridSample is 4-D in ONNX before opset 20 (torch writes it all the same; ONNX Runtime runs it)
    (got,) = _session(model).run(None, {"x": x.numpy(), "grid": grid.numpy()})
    np.testing.assert_allclose(got, Sample()(x, grid).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [16, 17])
def test_dynamo_grid_sample_asked_below_opset_18_keeps_the_asked_opset(opset):
    """The dynamo exporter builds at opset 18 and converts down; the Gathers' Pad-18 does not convert, so below 18
    opbridge's rule leaves even nearest-with-reflection to torch's GridSample: the model has the asked opset."""

    class Sample(torch.nn.Module):
        def forward(self, x, grid):
            return torch.nn.functional.grid_sample(x, grid, "nearest", "reflection", align_corners=False)

    x, grid = torch.randn(1, 2, 4, 5), torch.rand(1, 3, 4, 2) * 2.4 - 1.2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Failed to convert the model to the target version" would be a warning
        model = torch.onnx.export(Sample().eval(), (x, grid), dynamo=True, opset_version=opset, verbose=False)
    model = model.model_proto
    assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {opset}
    assert [n.op_type for n in model.graph.node] == ["GridSample"]
