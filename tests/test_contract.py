"""The API contract (docs/api.md), table-driven: for every public entry point, bad inputs and the error type
plus the words its message must contain (the argument's name and the expectation). A public name added
without cases fails `test_every_entry_point_has_cases`. Also: no op returns a result for inputs on mixed
devices, and the command line answers --help on stdout, fast, and lists valid values on bad ones."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

import opbridge
import opbridge_ort
from opbridge import _cli, _slices, specs
from opbridge.tools import parity

X = torch.randn(1, 4, 5, 5)


def _my_add_model():
    return opbridge.nn.MyAdd().eval(), (torch.randn(2), torch.randn(2))


# entry point -> [(call, error type, words the message must contain)]. An op's own entry points have their
# cases in its test file (tests/test_<op>.py: CONTRACT_CASES), so adding an op edits no shared file.
CASES: dict[str, list] = {
    "opbridge.onnx.export": [
        (
            lambda: opbridge.onnx.export(*_my_add_model(), None, lowering="fused"),
            ValueError,
            ["lowering must be one of", "fused"],
        ),
        (
            lambda: opbridge.onnx.export(*_my_add_model(), None, opset_version="17"),
            TypeError,
            ["opset_version must be an int", "'17'"],
        ),
        (
            lambda: opbridge.onnx.export(*_my_add_model(), None, opset_version=8, dynamo=False),
            ValueError,
            ["opset_version=8", "9..20"],
        ),
        (
            lambda: opbridge.onnx.export(*_my_add_model(), None, opset_version=9, dynamo=True),
            ValueError,
            ["use dynamo=False"],
        ),
        (
            lambda: opbridge.onnx.export(*_my_add_model(), None, dynamo="yes"),
            TypeError,
            ["dynamo must be True or False"],
        ),
    ],
    "opbridge.onnx.register_mapping": [
        (
            lambda: opbridge.onnx.register_mapping("aten::log1p", lambda b, x: x, kind="standart"),
            ValueError,
            ["kind must be one of", "standart"],
        ),
        (
            lambda: opbridge.onnx.register_mapping("aten::log1p", lambda b, x: x, min_opset=15, max_opset=10),
            ValueError,
            ["min_opset=15", "max_opset=10"],
        ),
        (lambda: opbridge.onnx.register_mapping("aten::log1p", "Log1p"), TypeError, ["build must be a function"]),
        (lambda: opbridge.onnx.register_mapping("aten::asinhh", lambda b, x: x), ValueError, ["no op 'aten::asinhh'"]),
        (lambda: opbridge.onnx.register_mapping("asinh", lambda b, x: x), ValueError, ["'namespace::name'"]),
        (lambda: opbridge.onnx.register_mapping("aten::log1p", lambda b: b), TypeError, ["build(b, self)"]),
        (
            lambda: opbridge.onnx.register_mapping("aten::log1p", lambda b, x: x, min_opset="9"),
            TypeError,
            ["min_opset must be an int"],
        ),
        (
            lambda: opbridge.onnx.register_mapping("aten::asinh", lambda b, x: b.op("Asinh", x)),
            ValueError,
            ["already has a mapping", "built into opbridge", "override=True"],
        ),
    ],
    "opbridge.patch_model": [
        (lambda: opbridge.patch_model("model"), TypeError, ["opbridge.patch_model", "torch.nn.Module", "str"]),
    ],
    "opbridge.onnx.lowering": [
        (lambda: opbridge.onnx.lowering("fused").__enter__(), ValueError, ["lowering must be one of", "fused"]),
    ],
    "opbridge.onnx.set_default_lowering": [
        (lambda: opbridge.onnx.set_default_lowering("Custom"), ValueError, ["lowering must be one of", "Custom"]),
    ],
    "opbridge.onnx.translation_table": [
        (lambda: opbridge.onnx.translation_table("fused"), ValueError, ["unknown lowering 'fused'"]),
    ],
    "opbridge.onnx.supported_opsets": [
        (lambda: opbridge.onnx.supported_opsets("dynamo"), TypeError, ["dynamo must be True or False"]),
    ],
    "opbridge.onnx.functions": [
        (
            lambda: opbridge.onnx.functions.register("F", "not a function", inputs=("X",)),
            TypeError,
            ["make_body must be a function"],
        ),
    ],
    "opbridge_ort.library_path": [
        (
            lambda: _with_env({"OPBRIDGE_ORT_LIBRARY": "/nonexistent/lib.so"}, opbridge_ort.library_path),
            FileNotFoundError,
            ["OPBRIDGE_ORT_LIBRARY", "/nonexistent/lib.so"],
        ),
    ],
    "opbridge_ort.ops": [
        (lambda: opbridge_ort.ops("/nonexistent/lib.so"), FileNotFoundError, ["/nonexistent/lib.so"]),
    ],
    "opbridge_ort.foreign_ops": [
        (lambda: opbridge_ort.foreign_ops("/nonexistent/lib.so"), FileNotFoundError, ["/nonexistent/lib.so"]),
    ],
    "opbridge_ort.cuda_architectures": [
        (lambda: opbridge_ort.cuda_architectures("/nonexistent/lib.so"), FileNotFoundError, ["/nonexistent/lib.so"]),
        (lambda: opbridge_ort.cuda_architectures(opbridge_ort.__file__), ValueError, ["not a 64-bit ELF library"]),
        (lambda: opbridge_ort.cuda_architectures(opbridge_ort.library_path()), ValueError, ["no CUDA fat binary"]),
        (lambda: opbridge_ort.cuda_architectures(_truncated_elf()), ValueError, ["not a readable ELF library"]),
    ],
    "opbridge_ort.session_options": [
        (lambda: opbridge_ort.session_options("options"), TypeError, ["onnxruntime.SessionOptions", "str"]),
    ],
    "opbridge_ort.InferenceSession": [
        (lambda: opbridge_ort.InferenceSession(123), TypeError, ["model must be a path", "int"]),
        (lambda: opbridge_ort.InferenceSession(b"not a model"), Exception, ["protobuf parsing failed"]),
    ],
}


def _op_cases() -> dict[str, list]:
    """CONTRACT_CASES of every op's test file, tests/test_<op>.py."""
    import importlib

    found: dict[str, list] = {}
    for module in _slices.op_modules():
        name = module.__name__.rsplit(".", 1)[1]
        found.update(getattr(importlib.import_module(f"test_{name}"), "CONTRACT_CASES", {}))
    return found


CASES.update(_op_cases())

# Public names that take no arguments a user could get wrong, or are types and constants: why each has no cases.
NO_BAD_INPUT = {
    "opbridge.onnx.current_lowering": "takes no arguments",
    "opbridge.onnx.register_schemas": "takes no arguments",
    "opbridge.onnx.LOWERING_KINDS": "a constant",
    "opbridge.onnx.LoweringError": "an exception type",
    "opbridge.onnx.DynamoBuilder": "constructed by the exporters for lowering functions, not by users",
    "opbridge.onnx.LegacyBuilder": "constructed by the exporters for lowering functions, not by users",
    "opbridge_ort.DOMAIN": "a constant",
    "opbridge_ort.OPS": "a constant (the library's op list)",
    "opbridge_ort.cuda_library_path": "takes no arguments (None where there is no CUDA library, never an error)",
}


def _truncated_elf() -> str:
    """The first 100 bytes of opbridge's ORT library: an ELF header whose section table lies beyond the file."""
    import os
    import tempfile

    path = Path(tempfile.gettempdir()) / f"opbridge-truncated-elf-{os.getpid()}.so"
    path.write_bytes(Path(opbridge_ort.library_path()).read_bytes()[:100])
    return str(path)


def _with_env(env: dict, call):
    import os

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return call()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _public_entry_points() -> set[str]:
    names = {f"opbridge.{n}" for n in opbridge.__all__}
    names |= {f"opbridge.nn.{n}" for n in opbridge.nn.__all__}
    names |= {f"opbridge.onnx.{n}" for n in opbridge.onnx.__all__}
    names |= {f"opbridge_ort.{n}" for n in opbridge_ort.__all__}
    names |= {
        f"opbridge._C.{n}" for n in dir(opbridge._C) if callable(getattr(opbridge._C, n)) and not n.startswith("_")
    }
    return names


def test_every_entry_point_has_cases():
    missing = sorted(_public_entry_points() - set(CASES) - set(NO_BAD_INPUT))
    assert not missing, (
        f"public entry points without contract cases: {missing} (an op's go in CONTRACT_CASES of tests/test_<op>.py, "
        "the rest in tests/test_contract.py)"
    )


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [pytest.param(*case, id=f"{name}-{index}") for name, cases in CASES.items() for index, case in enumerate(cases)],
)
def test_bad_input_gives_a_clear_error(call, error, words):
    with pytest.raises(error) as raised:
        call()
    message = str(raised.value)
    for word in words:
        assert word in message, f"the message lacks {word!r}: {message}"


OP_PATHS = [
    pytest.param(spec, path, id=f"{spec.name}-{path}")
    for spec in specs.builtin_specs()
    if spec.namespace == "opbridge"
    for path in spec.call_paths
]


@pytest.mark.parametrize(("spec", "path"), OP_PATHS)
def test_no_op_returns_a_result_for_mixed_devices(spec, path):
    """Each input in turn on the meta device, the rest on the CPU: an error, never an output."""
    module = spec.module(path)
    inputs = spec.sample_inputs(spec.dtypes[0], spec.operand_kinds[0], 2)
    parameters = [p.device for p in module.parameters()]
    for index in range(len(inputs)):
        mixed = [t.to("meta") if i == index else t for i, t in enumerate(inputs)]
        if len({t.device for t in mixed} | set(parameters)) < 2:
            continue  # a lone input on meta, nothing else: not mixed (the meta test below covers it)
        with pytest.raises(RuntimeError, match=r"device|meta|Meta"):
            module(*mixed)


@pytest.mark.parametrize(("spec", "path"), OP_PATHS)
def test_meta_inputs_give_meta_outputs(spec, path):
    """All on the meta device: the fake kernel answers with the output's shape, on meta."""
    module = spec.module(path).to("meta")
    inputs = spec.sample_inputs(spec.dtypes[0], spec.operand_kinds[0], 2)
    if spec.extra.get("data_dependent_output"):  # meta tensors cannot carry a size known only from the data
        with pytest.raises(RuntimeError, match="data-dependent"):
            module(*[t.to("meta") for t in inputs])
        return
    with torch.no_grad():
        expected = spec.module(path)(*inputs)
    out = module(*[t.to("meta") for t in inputs])
    assert out.device.type == "meta" and out.shape == expected.shape


@pytest.mark.parametrize("scripted", ["function", "module"])
def test_torchscript_scripts_and_survives_save_and_load(tmp_path, scripted):
    deform = opbridge.nn.DeformConv2d(4, 6, 3, padding=1)
    offset = torch.randn(1, 18, 5, 5)
    expected = deform(X, offset)
    if scripted == "module":
        compiled = torch.jit.script(deform)
        got_fn = lambda m: m(X, offset)  # noqa: E731
    else:

        class Calls(torch.nn.Module):
            def forward(self, x, o, w):
                return opbridge.deform_conv2d(x, o, w, None, (1, 1), 1) + opbridge.my_add(x, x).sum()

        compiled = torch.jit.script(Calls())
        expected = Calls()(X, offset, deform.weight)
        got_fn = lambda m: m(X, offset, deform.weight)  # noqa: E731
    torch.testing.assert_close(got_fn(compiled), expected)
    torch.jit.save(compiled, str(tmp_path / "m.pt"))
    torch.testing.assert_close(got_fn(torch.jit.load(str(tmp_path / "m.pt"))), expected)


def test_every_ops_wrapper_scripts():
    """torch.jit.script compiles each op's Python wrapper (with the test above, which scripts deform_conv2d and
    my_add, every op's), argument checks included (TorchScript compiles them although a scripted call skips them: an
    f-string's !r conversion there had made two rotated ops unscriptable)."""

    class Calls(torch.nn.Module):
        def forward(self, boxes, scores, features, rois, rboxes, value, shapes, starts, locations, weights):
            return (
                opbridge.box_iou_rotated(boxes, boxes, "iof"),
                opbridge.nms_rotated(boxes, scores, 0.5),
                opbridge.roi_align_rotated(features, rois, 2, 0.5, 2),
                opbridge.rotated_feature_align(features, rboxes, 0.5, 5),
                opbridge.ms_deform_attn(value, shapes, starts, locations, weights),
            )

    g = torch.Generator().manual_seed(0)
    boxes = torch.cat([torch.rand(6, 2, generator=g) * 8, torch.rand(6, 2, generator=g) * 4 + 1,
                       torch.rand(6, 1, generator=g)], 1)  # fmt: skip
    rois = torch.cat([torch.zeros(6, 1), boxes], 1)
    features = torch.randn(1, 3, 8, 8, generator=g)
    rboxes = torch.cat([torch.rand(1, 8, 8, 4, generator=g) * 8, torch.rand(1, 8, 8, 1, generator=g)], 3)
    shapes, starts = torch.tensor([[4, 4], [2, 2]]), torch.tensor([0, 16])
    value = torch.randn(1, 20, 2, 4, generator=g)
    locations, weights = torch.rand(1, 3, 2, 2, 2, 2, generator=g), torch.rand(1, 3, 2, 2, 2, generator=g)
    inputs = (boxes, torch.rand(6, generator=g), features, rois, rboxes, value, shapes, starts, locations, weights)
    scripted = torch.jit.script(Calls())
    for got, want in zip(scripted(*inputs), Calls()(*inputs), strict=True):
        torch.testing.assert_close(got, want)


def test_deform_conv2d_module_matches_torchvision_attributes_and_state_dict():
    torchvision = pytest.importorskip("torchvision")
    for kwargs in ({}, {"bias": False, "groups": 2, "stride": 2, "padding": (1, 0), "dilation": 2}):
        ours, theirs = opbridge.nn.DeformConv2d(4, 6, 3, **kwargs), torchvision.ops.DeformConv2d(4, 6, 3, **kwargs)
        for attribute in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups"):
            assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
        assert list(ours.state_dict()) == list(theirs.state_dict())
        assert (ours.bias is None) == (theirs.bias is None)
        ours.load_state_dict(theirs.state_dict())
        theirs.load_state_dict(ours.state_dict())
        assert repr(ours) == repr(theirs)
    module = opbridge.nn.DeformConv2d(4, 6, 3)
    torch.manual_seed(0)
    module.reset_parameters()
    first = module.weight.detach().clone()
    torch.manual_seed(0)
    module.reset_parameters()
    torch.testing.assert_close(module.weight, first)
    bound = 1 / (4 * 9) ** 0.5
    assert module.bias.abs().max() <= bound


def test_cli_constants_match_the_code():
    assert _cli.LOWERING_KINDS == specs.LOWERING_KINDS and _cli.EXPORTERS == parity.EXPORTERS


def test_tools_keep_their_old_names():
    """`from opbridge import parity` (the tools' home before opbridge.tools) still works; `import opbridge` imports
    no tool."""
    code = "import sys, opbridge; print(sorted(m for m in sys.modules if m.startswith('opbridge.tools')))"
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0 and probe.stdout.strip() == "[]", probe.stdout + probe.stderr[-2000:]
    from opbridge import parity as old_home

    assert old_home is parity and opbridge.catalog is importlib.import_module("opbridge.tools.catalog")


def _cli_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "command",
    [
        ("opbridge",),
        ("opbridge", "parity"),
        ("opbridge", "bench"),
        ("opbridge", "ops"),
        ("opbridge", "coverage"),
        ("opbridge", "inspect"),
        ("opbridge_ort",),
        ("opbridge_ort", "inspect"),
    ],
    ids=" ".join,
)
def test_cli_help_on_stdout(command):
    result = _cli_run(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m ") and "``" not in result.stdout
    assert f"python -m {' '.join(command)}" in result.stdout


@pytest.mark.parametrize("command", [("opbridge", "--help"), ("opbridge", "parity", "--help"),
                                     ("opbridge", "bench", "--help"),  # finds the op benchmarks: must not import them
                                     ("opbridge_ort", "inspect", "--help")], ids=" ".join)  # fmt: skip
def test_cli_help_does_not_import_torch(command):
    probe = subprocess.run([sys.executable, "-X", "importtime", "-m", *command], capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in probe.stderr.splitlines() if "|" in line}
    assert "torch" not in imported, f"python -m {' '.join(command)} imported torch"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("opbridge", "nosuch"), ["invalid choice", "parity"]),
        (("opbridge", "parity", "--ops", "nosuch"), ["unknown op(s) nosuch", "my_add"]),
        (("opbridge", "parity", "--exporters", "jit"), ["invalid choice", "legacy"]),
        (("opbridge", "coverage", "--ops", "nosuch*"), ["no op matches", "nosuch*"]),
        (("opbridge_ort", "nosuch"), ["usage: python -m opbridge_ort inspect"]),
    ],
)
def test_cli_selection_errors_list_the_valid_values(args, words):
    result = _cli_run(*args)
    assert result.returncode == 2
    for word in words:
        assert word in result.stderr, result.stderr


@pytest.mark.parametrize("content", [b"", b"not a model"], ids=["empty", "junk"])
def test_inspect_exits_non_zero_on_files_that_are_not_models(tmp_path, content):
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    result = _cli_run("opbridge_ort", "inspect", str(path))
    assert result.returncode == 2 and "cannot read" in result.stderr


def test_inspect_exits_non_zero_when_no_session_can_be_created(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    # Structurally valid, but the Add's inputs disagree in type: no runtime can create a session.
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])], "bad",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("b", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])],
    )  # fmt: skip
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    result = _cli_run("opbridge_ort", "inspect", str(path))
    assert result.returncode == 1 and "does not load" in result.stderr


def test_session_options_that_already_carry_the_library(tmp_path):
    """inspect's own advice (register by hand), then opbridge_ort's helpers: the library is kept once."""
    from ort_cases.my_add import my_add_model

    options = onnxruntime.SessionOptions()
    options.register_custom_ops_library(opbridge_ort.library_path())
    options.register_custom_ops_library(opbridge_ort.library_path())
    session = opbridge_ort.InferenceSession(my_add_model(np.float32, [2], [2]), opbridge_ort.session_options(options))
    (c,) = session.run(None, {"A": np.ones(2, np.float32), "B": np.ones(2, np.float32)})
    assert (c == 3).all()


def test_bench_quiets_openblas_idle_spinning(monkeypatch):
    """`python -m opbridge bench` runs with OPENBLAS_THREAD_TIMEOUT set (OpenBLAS's idle workers otherwise spin about
    0.1 s after a two-thread call and slow the next timed path): numpy, and so its OpenBLAS, is loaded here, so the
    command line starts again, interpreter flags and all, with the variable set."""
    import opbridge.__main__ as cli

    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "x")  # restored after the test, whatever main does
    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT")
    command = ["bench", "--ops", "my_add", "--repeat", "1"]
    monkeypatch.setattr(sys, "argv", ["opbridge", *command])
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-X", "importtime", "-m", "opbridge", *command])
    started = []

    def execv(path, args):
        started.append((path, args, os.environ.get("OPENBLAS_THREAD_TIMEOUT")))
        raise SystemExit(0)

    monkeypatch.setattr(cli.os, "execv", execv)
    with pytest.raises(SystemExit):
        cli.main()
    assert started == [(sys.executable, [sys.executable, "-X", "importtime", "-m", "opbridge", *command],
                        cli.OPENBLAS_THREAD_TIMEOUT)]  # fmt: skip


def test_bench_called_from_a_program_keeps_its_process(monkeypatch):
    """main(["bench", ...]) from a program runs the command there: no new process, the environment unchanged."""
    import opbridge.__main__ as cli

    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "x")
    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT")
    monkeypatch.setattr(cli.os, "execv", lambda *args: pytest.fail("main started a new process"))
    ran = []
    stub = type("Bench", (), {"main": staticmethod(lambda arguments: ran.append(arguments) or 0)})
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: stub)
    assert cli.main(["bench", "--ops", "my_add"]) == 0
    assert ran == [["--ops", "my_add"]] and "OPENBLAS_THREAD_TIMEOUT" not in os.environ
