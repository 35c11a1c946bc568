"""``python -m opbridge inspect``: what a model needs and what to do about it."""

from __future__ import annotations

import subprocess
import sys

import onnx
import pytest
import torch
from onnx import TensorProto, helper

import opbridge
import opbridge_ort
from opbridge import specs
from ort_cases.deform_conv2d import mmcv_model


def _run(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd)


def _one_node_model(path, domain, op_type, opset=17):
    node = helper.make_node(op_type, ["x"], ["y"], domain=domain)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8  # what every supported ORT reads (onnx writes its newest, which ORT may not read yet)
    onnx.save(model, str(path))


def test_custom_model_needs_the_library(tmp_path):
    path = tmp_path / "custom.onnx"
    args = (torch.randn(2, 3), torch.randn(3))
    opbridge.onnx.export(opbridge.nn.MyAdd().eval(), args, path, opset_version=17, dynamo=False, lowering="custom")
    result = _run("-m", "opbridge", "inspect", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("opbridge ") and "MyAdd" in ln)
    assert line.split()[2:5] == ["1", "NO", "yes"]
    assert "register_custom_ops_library(opbridge_ort.library_path())" in result.stdout
    assert "session without the opbridge library: fails" in result.stdout
    assert "is not a registered function/op" in result.stdout
    assert "session with the opbridge library:    loads" in result.stdout


def test_unknown_custom_domain_explains_the_famous_error(tmp_path):
    """The classic tutorial's deform_conv2d export: a custom:: node no runtime knows."""
    path = tmp_path / "broken.onnx"
    _one_node_model(path, "custom", "deform_conv2d")
    result = _run("-m", "opbridge_ort", "inspect", str(path), cwd=tmp_path)
    assert result.returncode == 1
    assert "unknown custom domain 'custom'" in result.stdout
    assert "lowering='standard'" in result.stdout


def test_missing_kernel_and_opset_advice(tmp_path):
    path = tmp_path / "ms.onnx"
    _one_node_model(path, "com.microsoft", "NoSuchOpAnywhere")
    result = _run("-m", "opbridge_ort", "inspect", str(path), cwd=tmp_path)
    assert result.returncode == 1 and "no kernel in this onnxruntime" in result.stdout


def test_inspect_is_torch_free(tmp_path):
    path = tmp_path / "plain.onnx"
    _one_node_model(path, "", "Relu")
    script = (
        "import sys; from opbridge_ort.inspect import main\n"
        f"rc = main([{str(path)!r}])\n"
        "assert 'torch' not in sys.modules\n"
        "sys.exit(rc)\n"
    )
    result = _run("-c", script, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Relu" in result.stdout


def test_not_a_model(tmp_path):
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"not a model")
    result = _run("-m", "opbridge", "inspect", str(path), cwd=tmp_path)
    assert result.returncode == 2 and "cannot read" in result.stderr


@pytest.mark.parametrize("spec", [s for s in specs.all_specs() if s.custom_node], ids=lambda s: s.name)
def test_opbridge_ort_ops_list_matches_the_specs(spec):
    """opbridge_ort reads the op list from the library itself: it cannot drift from what is built."""
    assert opbridge_ort.ops().get(spec.custom_node.op_type) == specs.CUSTOM_DOMAIN_VERSION
    assert opbridge_ort.ops() == opbridge_ort.OPS
    assert set(opbridge_ort.ops()) == {s.custom_node.op_type for s in specs.all_specs() if s.custom_node}


def test_mmcv_nodes_run_with_the_library(tmp_path):
    """A model mmcv/mmdeploy exported (MMCVModulatedDeformConv2d) is reported as runnable with the library."""
    assert ("mmcv", "MMCVModulatedDeformConv2d") in opbridge_ort.foreign_ops()
    path = tmp_path / "mmcv.onnx"
    path.write_bytes(mmcv_model("mmdeploy", groups=1, deform_groups=1, stride=[1, 1], padding=[1, 1], dilation=[1, 1]))
    result = _run("-m", "opbridge_ort", "inspect", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mmdeploy node run by the opbridge library" in result.stdout


def test_inspect_says_which_nodes_run_on_the_cuda_provider(tmp_path):
    """The CUDA column: the library's CUDA nodes (read from libopbridge_ort_cuda.so) yes, its CPU-only nodes no,
    standard ops by onnxruntime's own CUDA kernels (unknown to a CPU-only onnxruntime: '?')."""
    import onnxruntime

    from opbridge_ort.inspect import inspect_model

    nodes = [
        helper.make_node("grid_sampler", ["x", "g"], ["s"], domain="mmcv"),
        helper.make_node("NmsRotated", ["b", "sc"], ["keep"], domain="opbridge"),
        helper.make_node("NMSRotated", ["b3", "sc3"], ["selected"], domain="mmdeploy"),
        helper.make_node("SoftNonMaxSuppression", ["b", "sc"], ["values", "indices"], domain="mmcv"),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x", "g", "b", "sc", "b3", "sc3")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "keep", "selected", "values")],
    )
    imports = [helper.make_opsetid(d, v) for d, v in (("", 17), ("mmcv", 1), ("opbridge", 1), ("mmdeploy", 1))]
    _, reports = inspect_model(helper.make_model(graph, opset_imports=imports))
    cuda = {(r.domain, r.op_type): r.cuda for r in reports}
    has_cuda_library = opbridge_ort.cuda_library_path() is not None
    assert cuda[("mmcv", "grid_sampler")] == ("yes" if has_cuda_library else "no")
    assert cuda[("opbridge", "NmsRotated")] == ("yes" if has_cuda_library else "no")
    assert cuda[("mmdeploy", "NMSRotated")] == ("yes" if has_cuda_library else "no")
    assert cuda[("mmcv", "SoftNonMaxSuppression")] == "no"  # a node the CUDA library does not have
    assert cuda[("", "Relu")] == ("yes" if "CUDAExecutionProvider" in onnxruntime.get_available_providers() else "?")
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=imports), str(path))
    result = _run("-m", "opbridge_ort", "inspect", str(path), cwd=tmp_path)
    assert "CUDA" in result.stdout.splitlines()[4] and "CUDA: whether the node runs" in result.stdout, result.stdout


def _mixed_model():
    """mmcv::grid_sampler on float16 features and a float32 grid, opbridge::MyAdd on bfloat16 values (cast from float
    inputs inside the graph)."""
    nodes = [
        helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
        helper.make_node("grid_sampler", ["xh", "g"], ["s"], domain="mmcv"),
        helper.make_node("MyAdd", ["xb", "xb"], ["a"], domain="opbridge"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, 2, 2]) for n in ("x", "g")],
        [
            helper.make_tensor_value_info("s", TensorProto.FLOAT16, None),
            helper.make_tensor_value_info("a", TensorProto.BFLOAT16, None),
        ],
    )
    imports = [helper.make_opsetid(d, v) for d, v in (("", 17), ("mmcv", 1), ("opbridge", 1))]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8
    return model


def test_inspect_checks_the_element_types_of_the_library_nodes(tmp_path):
    """A library node is reported by the element types of its inputs, not by its op type alone: the library's
    grid_sampler has no kernel for float16 features beside a float32 grid (NO, with the types it takes), its bfloat16
    MyAdd runs on the CPU only (so not on the CUDA provider)."""
    from opbridge_ort.inspect import _cuda_column, inspect_model

    _, reports = inspect_model(_mixed_model())
    by_op = {(r.domain, r.op_type): r for r in reports}
    grid, add = by_op[("mmcv", "grid_sampler")], by_op[("opbridge", "MyAdd")]
    assert not grid.with_library and grid.cuda == "-"
    assert grid.how == (
        "no kernel in the opbridge library for these input types (xh: float16, g: float); "
        "it takes every floating input float, double, float16 or bfloat16"
    )
    assert add.with_library and add.element_types == {"bfloat16"}
    assert _cuda_column(add, {("opbridge", "MyAdd")}, None) == "no"
    add.element_types = {"float16"}
    assert _cuda_column(add, {("opbridge", "MyAdd")}, None) == "yes"
    path = tmp_path / "mixed.onnx"
    onnx.save(_mixed_model(), str(path))
    result = _run("-m", "opbridge_ort", "inspect", str(path), cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    row = next(line for line in result.stdout.splitlines() if "grid_sampler" in line and "kernel" in line)
    assert row.split()[3:6] == ["NO", "NO", "-"], row
    assert "mmcv::grid_sampler: cast the node's floating inputs to one type it takes" in result.stdout


def test_session_error_names_the_inputs_whose_types_have_no_kernel():
    """ORT refuses a float16 DeformConv2d with a float32 offset with a message naming neither the input nor the types
    the node takes; opbridge_ort.InferenceSession adds both (inspect's check) to ORT's own error."""
    node = helper.make_node("DeformConv2d", ["X", "W", "offset"], ["Y"], domain="opbridge", kernel_shape=[3, 3])
    inputs = [("X", TensorProto.FLOAT16), ("W", TensorProto.FLOAT16), ("offset", TensorProto.FLOAT)]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(name, t, None) for name, t in inputs],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)])
    model.ir_version = 8
    with pytest.raises(Exception) as caught:
        opbridge_ort.InferenceSession(model)
    assert type(caught.value).__module__.startswith("onnxruntime"), type(caught.value)  # ORT's own error, extended
    assert (
        "opbridge::DeformConv2d: no kernel in the opbridge library for these input types (X: float16, W: float16, "
        "offset: float); it takes every floating input float, double, float16 or bfloat16"
    ) in str(caught.value)
    model.graph.input[2].type.tensor_type.elem_type = TensorProto.FLOAT16  # one type: loads
    assert opbridge_ort.InferenceSession(model) is not None


def test_inspect_creates_one_session_per_kind_of_library_node(monkeypatch):
    """The element-type check creates each distinct (node kind, input types, attributes) alone once, not once per
    node: a model of many layers of one op stays cheap to inspect."""
    from opbridge_ort import inspect as inspect_module

    calls = []
    original = inspect_module._loads_alone
    monkeypatch.setattr(inspect_module, "_loads_alone", lambda *a: calls.append(a[1]) or original(*a))
    nodes = [helper.make_node("MyAdd", ["x", f"y{i}" if i else "x"], [f"y{i + 1}"], domain="opbridge", name=f"add{i}")
             for i in range(6)]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y6", TensorProto.FLOAT, [2])],
        value_info=[helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [2]) for i in range(1, 6)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)])
    model.ir_version = 8
    from opbridge_ort.inspect import inspect_model

    _, reports = inspect_model(model)
    assert [r.with_library for r in reports] == [True]
    assert len(calls) == 1, calls


def test_inspect_checks_the_element_types_of_nodes_in_subgraphs():
    """The same mixed grid_sampler inside an If's branch (a value of the outer graph read by name): reported NO with
    the types, as in the main graph."""
    from opbridge_ort.inspect import inspect_model

    inner = _mixed_model().graph
    branch = helper.make_graph(list(inner.node), "branch", [], list(inner.output))
    other = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["s2"], to=TensorProto.FLOAT16),
            helper.make_node("Cast", ["x"], ["a2"], to=TensorProto.BFLOAT16),
        ],
        "other",
        [],
        [
            helper.make_tensor_value_info("s2", TensorProto.FLOAT16, None),
            helper.make_tensor_value_info("a2", TensorProto.BFLOAT16, None),
        ],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["s", "a"], then_branch=branch, else_branch=other),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        list(inner.input),
        list(inner.output),
        initializer=[helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])],
    )
    model = helper.make_model(graph, opset_imports=list(_mixed_model().opset_import))
    model.ir_version = 8
    _, reports = inspect_model(model)
    grid = next(r for r in reports if (r.domain, r.op_type) == ("mmcv", "grid_sampler"))
    assert not grid.with_library
    assert "these input types (xh: float16, g: float)" in grid.how
