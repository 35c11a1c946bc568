"""Export with both exporters and both lowerings, checked in ONNX Runtime against
PyTorch (the parity cells), plus the exported models' structure and the errors."""

from __future__ import annotations

import onnx
import onnxruntime
import pytest
import torch

import opbridge
import opbridge_ort
from opbridge.tools import parity

# A spread of opsets: the legacy exporter's bounds and the common ones, and the
# dynamo exporter's first and last. `nox -s parity` runs every opset.
LEGACY_OPSETS = sorted({9, 11, 13, 17, max(opbridge.onnx.supported_opsets(dynamo=False))})
DYNAMO_OPSETS = sorted({18, max(opbridge.onnx.supported_opsets(dynamo=True))})
CELLS = parity.cells(exporters=["legacy"], opsets=LEGACY_OPSETS) + parity.cells(
    exporters=["dynamo"], opsets=DYNAMO_OPSETS
)


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: f"{c.op}-{c.path}-{c.exporter}-{c.lowering}-{c.opset}-{c.dtype}")
def test_parity_cell(cell):
    """ORT vs PyTorch for same-shape and broadcast operands, static and dynamic batch."""
    result = parity.run_cell(cell)
    # n/a only where the op's spec names a known gap (e.g. ORT has no float64 Asinh kernel).
    assert result.status in ("pass", "n/a"), result.detail
    assert result.status == "pass" or result.reason


def _export(tmp_path, lowering, dynamo, opset, **kwargs):
    path = tmp_path / "model.onnx"
    a, b = torch.randn(2, 3, 4), torch.randn(4)
    if dynamo:
        kwargs["dynamic_shapes"] = ({0: torch.export.Dim("batch")}, None)
    else:
        kwargs["dynamic_axes"] = {"a": {0: "batch"}, "c": {0: "batch"}}
    model = opbridge.onnx.export(
        opbridge.nn.MyAdd().eval(), (a, b), path, opset_version=opset, dynamo=dynamo, lowering=lowering,
        input_names=["a", "b"], output_names=["c"], **kwargs,
    )  # fmt: skip
    assert path.is_file()
    assert onnx.load(str(path)).graph == model.graph
    return model


EXPORTERS = [pytest.param(False, 17, id="legacy-17"), pytest.param(True, 18, id="dynamo-18")]


@pytest.mark.parametrize(("dynamo", "opset"), EXPORTERS)
def test_custom_lowering_declares_the_domain_and_types(tmp_path, dynamo, opset):
    model = _export(tmp_path, "custom", dynamo, opset)
    nodes = [(n.domain, n.op_type) for n in model.graph.node]
    assert nodes == [("opbridge", "MyAdd")]
    assert {o.domain: o.version for o in model.opset_import}.get("opbridge") == 1
    onnx.checker.check_model(model, full_check=True)  # the registered schema validates the node
    # The custom node's output carries its element type and shape, batch dim symbolic.
    (output,) = [v for v in model.graph.output if v.name == model.graph.node[0].output[0]]
    tensor_type = output.type.tensor_type
    assert tensor_type.elem_type == onnx.TensorProto.FLOAT
    dims = [d.dim_param or d.dim_value for d in tensor_type.shape.dim]
    assert len(dims) == 3 and isinstance(dims[0], str) and dims[1:] == [3, 4]
    assert [i.name for i in model.graph.input] == ["a", "b"] and [o.name for o in model.graph.output] == ["c"]


@pytest.mark.parametrize(("dynamo", "opset"), EXPORTERS)
def test_custom_node_inside_a_graph_has_value_info(tmp_path, dynamo, opset):
    class Model(torch.nn.Module):
        def forward(self, a, b):
            return torch.relu(opbridge.my_add(a, b))

    a, b = torch.randn(2, 3), torch.randn(3)
    model = opbridge.onnx.export(
        Model().eval(), (a, b), None, opset_version=opset, dynamo=dynamo, lowering="custom", input_names=["a", "b"]
    )
    custom_output = next(n.output[0] for n in model.graph.node if n.domain == "opbridge")
    infos = {v.name: v for v in model.graph.value_info}
    assert custom_output in infos, "no type/shape information for the custom node's output"
    shape = [d.dim_value for d in infos[custom_output].type.tensor_type.shape.dim]
    assert infos[custom_output].type.tensor_type.elem_type == onnx.TensorProto.FLOAT and shape == [2, 3]
    got = opbridge_ort.InferenceSession(model).run(None, {"a": a.numpy(), "b": b.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(got), torch.relu(2 * a + b))


@pytest.mark.parametrize(("dynamo", "opset"), EXPORTERS)
def test_standard_lowering_uses_only_standard_ops(tmp_path, dynamo, opset):
    model = _export(tmp_path, "standard", dynamo, opset)
    assert {n.domain for n in model.graph.node} <= {""}
    assert {n.op_type for n in model.graph.node} <= {"Constant", "Mul", "Add"}
    assert "opbridge" not in {o.domain for o in model.opset_import}
    # Runs in a plain ORT session, no library registered.
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    a, b = torch.randn(6, 3, 4), torch.randn(4)
    torch.testing.assert_close(torch.from_numpy(session.run(None, {"a": a.numpy(), "b": b.numpy()})[0]), 2 * a + b)


def test_plain_torch_onnx_export_works_after_import(tmp_path):
    """`import opbridge` is enough for the TorchScript-based exporter (standard lowering)."""
    path = tmp_path / "plain.onnx"
    torch.onnx.export(
        opbridge.nn.MyAdd().eval(), (torch.randn(2, 3), torch.randn(3)), str(path), dynamo=False, opset_version=9
    )
    assert [n.op_type for n in onnx.load(str(path)).graph.node if n.op_type != "Constant"] == ["Mul", "Add"]


def test_plain_dynamo_export_with_the_translation_table(tmp_path):
    program = torch.onnx.export(
        opbridge.nn.MyAdd().eval(), (torch.randn(2, 3), torch.randn(3)), dynamo=True, opset_version=18, verbose=False,
        custom_translation_table=opbridge.onnx.translation_table("custom", 18),
    )  # fmt: skip
    assert [n.op_type for n in program.model_proto.graph.node] == ["MyAdd"]


def test_dynamic_axes_also_work_with_dynamo():
    """opbridge converts legacy-style dynamic_axes for the dynamo exporter, keeping the axis names."""
    model = opbridge.onnx.export(
        opbridge.nn.MyAdd().eval(), (torch.randn(2, 3), torch.randn(3)), None, opset_version=18, dynamo=True,
        lowering="custom", input_names=["a", "b"], output_names=["c"],
        dynamic_axes={"a": {0: "batch"}, "c": {0: "batch"}},
    )  # fmt: skip
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    a, b = torch.randn(5, 3), torch.randn(3)
    (c,) = opbridge_ort.InferenceSession(model).run(None, {"a": a.numpy(), "b": b.numpy()})
    torch.testing.assert_close(torch.from_numpy(c), 2 * a + b)


def test_bad_export_arguments():
    args = (torch.randn(2), torch.randn(2))
    with pytest.raises(ValueError, match="lowering must be one of 'standard', 'custom'"):
        opbridge.onnx.export(opbridge.nn.MyAdd(), args, None, lowering="fused")
    with pytest.raises(ValueError, match=r"opset_version=9 is outside .* dynamo exporter .* use dynamo=False"):
        opbridge.onnx.export(opbridge.nn.MyAdd(), args, None, opset_version=9, dynamo=True)
    with pytest.raises(ValueError, match="opset_version=99 is outside"):
        opbridge.onnx.export(opbridge.nn.MyAdd(), args, None, opset_version=99, dynamo=False)


def test_integer_inputs_fail_export_with_the_ops_message():
    args = (torch.ones(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64))
    with pytest.raises(Exception, match="expected float32, float64, float16 or bfloat16"):
        opbridge.onnx.export(opbridge.nn.MyAdd(), args, None, opset_version=17, dynamo=False)


@pytest.mark.parametrize("name", ["asinh", "acosh", "atanh", "sinh", "cosh"])
@pytest.mark.parametrize("opset", [9, 13, max(opbridge.onnx.supported_opsets(dynamo=False))])
def test_plain_legacy_export_of_aten_ops_that_torch_cannot_export(tmp_path, name, opset):
    """The issue's example: torch.onnx.export(..., dynamo=False, opset_version=9) of asinh works after import."""

    class Model(torch.nn.Module):
        def forward(self, x):
            return getattr(torch, name)(x)

    x = torch.rand(2, 3) * 0.5 + (1.5 if name == "acosh" else 0.0)
    path = tmp_path / "model.onnx"
    torch.onnx.export(Model().eval(), (x,), str(path), dynamo=False, opset_version=opset, input_names=["x"])
    onnx_op = name.capitalize()
    assert [n.op_type for n in onnx.load(str(path)).graph.node] == [onnx_op]
    (y,) = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})
    torch.testing.assert_close(torch.from_numpy(y), getattr(torch, name)(x))


@pytest.mark.parametrize(("dynamo", "opset"), [(False, 15), (False, 20), (True, 18), (True, 23)])
def test_function_lowering_is_one_node_with_an_embedded_function(tmp_path, dynamo, opset):
    class Model(torch.nn.Module):
        def forward(self, a, b, x):
            return torch.nn.functional.selu(opbridge.my_add(a, b)) + torch.nn.functional.selu(x)

    a, b, x = torch.randn(2, 3), torch.randn(3), torch.randn(2, 3)
    path = tmp_path / "model.onnx"
    opbridge.onnx.export(
        Model().eval(), (a, b, x), path, opset_version=opset, dynamo=dynamo, lowering="function",
        input_names=["a", "b", "x"],
    )  # fmt: skip
    model = onnx.load(str(path))
    calls = sorted(n.op_type for n in model.graph.node if n.domain == "opbridge.functions")
    assert calls == ["MyAdd", "Selu", "Selu"]
    assert sorted(f.name for f in model.functions) == ["MyAdd", "Selu"]
    onnx.checker.check_model(model, full_check=True)
    # Any runtime: a plain ORT session, no opbridge library.
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"a": a.numpy(), "b": b.numpy(), "x": x.numpy()})
    torch.testing.assert_close(torch.from_numpy(y), Model()(a, b, x))


def test_function_lowering_below_its_opset_says_what_exists():
    with pytest.raises(Exception, match=r"no 'function' ONNX lowering at opset 13.*function \(opset 15"):
        opbridge.onnx.export(
            opbridge.nn.MyAdd().eval(), (torch.randn(2), torch.randn(2)), None, opset_version=13, dynamo=False,
            lowering="function",
        )  # fmt: skip


@torch.library.custom_op("opbridge_test::triple", mutates_args=())
def _triple(x: torch.Tensor) -> torch.Tensor:
    return 3 * x


@_triple.register_fake
def _(x):
    return torch.empty_like(x)


def test_register_mapping_serves_both_exporters():
    """A user's mapping for an op no exporter knows, in one call."""
    opbridge.onnx.register_mapping(
        "opbridge_test::triple", lambda b, x: b.op("Mul", x, b.constant_like(3.0, x)), min_opset=9
    )

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.ops.opbridge_test.triple(x)

    x = torch.randn(4)
    for dynamo, opset in ((False, 9), (True, 18)):
        model = opbridge.onnx.export(Model().eval(), (x,), None, opset_version=opset, dynamo=dynamo, input_names=["x"])
        assert "Mul" in {n.op_type for n in model.graph.node}
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        torch.testing.assert_close(torch.from_numpy(session.run(None, {"x": x.numpy()})[0]), 3 * x)
    with pytest.raises(ValueError, match=r"already has a mapping .* pass override=True"):
        opbridge.onnx.register_mapping("opbridge_test::triple", lambda b, x: x)


@pytest.mark.parametrize("opset", [11, 17])
def test_isin_with_a_scalar_or_another_dtype_exports_with_the_torchscript_exporter(opset):
    """aten::isin's other overloads and mixed dtypes (the parity cells take two tensors of one dtype): a scalar test
    element, and int32 elements against int64 test elements, both compared as torch does."""

    class Model(torch.nn.Module):
        def forward(self, ids, narrow):
            return torch.isin(ids, 3), torch.isin(narrow, ids, invert=True)

    ids = torch.tensor([[1, 3, 5], [3, 7, 9]])
    narrow = torch.tensor([5, 6, 3], dtype=torch.int32)
    model = opbridge.onnx.export(Model(), (ids, narrow), None, dynamo=False, opset_version=opset,
                                 input_names=["ids", "narrow"])  # fmt: skip
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"ids": ids.numpy(), "narrow": narrow.numpy()})
    for value, want in zip(got, Model()(ids, narrow), strict=True):
        assert value.tolist() == want.tolist()
