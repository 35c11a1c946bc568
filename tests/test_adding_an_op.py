"""docs/adding-an-op.md, followed mechanically: an op is one slice of files named after it, and nothing
else. Each piece the page lists is checked for every op, in both directions (a C++ file without its
Python module fails as much as the reverse), and each failure says which file is missing what."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

import opbridge
import opbridge_ort
from opbridge import _slices, specs

ROOT = Path(__file__).parent.parent
FUZZ_CASES = ROOT / "tests" / "fuzz_cases"
BENCH = ROOT / "python" / "opbridge" / "tools" / "bench"
OP_MODULES = {module.__name__.rsplit(".", 1)[1]: module for module in _slices.op_modules()}
SCHEMA = re.compile(r'OPBRIDGE_LIBRARY_FRAGMENT\(\w+\)\s*\{[^}]*?m\.def\(\s*"(\w+)\(', re.S)
ORT_OP = re.compile(r"OPBRIDGE_ORT_OP\((\w+),\s*(\d+),")


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def _torch_schemas() -> dict[str, Path]:
    """op name -> the cpp/torch file whose OPBRIDGE_LIBRARY_FRAGMENT (cpp/torch/api.h) defines it."""
    found = {}
    for path in sorted((ROOT / "cpp" / "torch").glob("*.cpp")):
        for name in SCHEMA.findall(path.read_text()):
            found[name] = path
    return found


def _ort_ops() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "cpp" / "ort").glob("*.cc")):
        for op_type, _ in ORT_OP.findall(path.read_text()):
            found[op_type] = path
    return found


def _own_spec(name: str) -> specs.OpSpec:
    matching = [s for s in specs.all_specs() if s.torch_op == f"opbridge::{name}"]
    assert matching, f"python/opbridge/ops/{name}.py registers no specs.OpSpec with torch_op='opbridge::{name}'"
    return matching[0]


def test_every_torch_schema_has_its_python_module():
    for name, path in _torch_schemas().items():
        if name.startswith(f"{path.stem}_"):
            continue  # a helper op of the file's op (e.g. its backward), defined next to it
        assert path.name == f"{name}.cpp", f"{path.relative_to(ROOT)} defines opbridge::{name}: name it {name}.cpp"
        assert name in OP_MODULES, (
            f"{path.relative_to(ROOT)} defines opbridge::{name}, but python/opbridge/ops/{name}.py is missing"
        )


def test_every_ort_op_belongs_to_an_op_with_that_custom_node():
    custom_nodes = {s.custom_node.op_type: s for s in specs.all_specs() if s.custom_node is not None}
    for op_type, path in _ort_ops().items():
        assert op_type in custom_nodes, (
            f"{path.relative_to(ROOT)} registers opbridge::{op_type}, but no op spec declares "
            f"custom_node=specs.CustomNode('{op_type}', ...)"
        )
        assert path.name == f"{custom_nodes[op_type].torch_op.split('::')[1]}.cc", (
            f"{path.relative_to(ROOT)}: name the ORT adapter of {custom_nodes[op_type].torch_op} after the op"
        )


@pytest.mark.parametrize("name", sorted(OP_MODULES))
def test_every_piece_of_an_op_exists(name):
    module = OP_MODULES[name]
    spec = _own_spec(name)
    kernel = ROOT / "cpp" / "kernels" / f"{name}.h"
    assert kernel.is_file(), f"{kernel.relative_to(ROOT)} is missing (the framework-free kernel)"
    torch_file = ROOT / "cpp" / "torch" / f"{name}.cpp"
    assert _torch_schemas().get(name) == torch_file, f"{torch_file.relative_to(ROOT)} must define the schema of {name}"
    assert f'OPBRIDGE_IMPL(m, "{name}"' in torch_file.read_text(), (
        f"{torch_file.relative_to(ROOT)} registers no CPU kernel"
    )
    test_file = ROOT / "tests" / f"test_{name}.py"
    assert test_file.is_file(), f"tests/test_{name}.py is missing"
    # The public names the module lists are published, and nothing else is needed for them.
    for public in module.__all__:
        assert getattr(opbridge, public) is getattr(module, public), f"opbridge.{public} is not {module.__name__}'s"
    for nn_name in getattr(module, "NN_MODULES", ()):
        assert getattr(opbridge.nn, nn_name) is getattr(module, nn_name)
    assert spec.call_paths and spec.sample_inputs and spec.reference, (
        f"{module.__name__}: the spec needs call_paths, sample_inputs and a reference for the parity matrix"
    )
    if spec.custom_node is not None:
        ort_file = ROOT / "cpp" / "ort" / f"{name}.cc"
        assert _ort_ops().get(spec.custom_node.op_type) == ort_file, (
            f"{ort_file.relative_to(ROOT)} must register opbridge::{spec.custom_node.op_type} with OPBRIDGE_ORT_OP"
        )
        assert opbridge_ort.ops().get(spec.custom_node.op_type) == specs.CUSTOM_DOMAIN_VERSION, (
            f"the built ORT library does not register {spec.custom_node.op_type}: rebuild it"
        )
        cases = ROOT / "tests" / "ort_cases" / f"{_snake(spec.custom_node.op_type)}.py"
        assert cases.is_file(), f"{cases.relative_to(ROOT)} is missing (the op's ORT smoke cases)"


@pytest.mark.parametrize("name", sorted(OP_MODULES))
def test_every_op_has_fuzz_targets_and_a_benchmark(name):
    for path, what in ((FUZZ_CASES / f"{name}.py", "fuzz targets"), (BENCH / f"{name}.py", "benchmark")):
        assert path.is_file(), f"{path.relative_to(ROOT)} is missing (the op's {what}): see docs/adding-an-op.md"


@pytest.mark.parametrize("name", sorted(OP_MODULES))
def test_every_op_has_a_fake_kernel(name):
    """torch.export and the dynamo exporter need one: a fake-tensor call must give the eager output's shape."""
    spec = _own_spec(name)
    module = spec.module(next(iter(spec.call_paths)))
    inputs = spec.sample_inputs(spec.dtypes[0], spec.operand_kinds[0], 2)
    expected = module(*inputs)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    # A shape environment, for ops whose output size depends on the data (e.g. nms_rotated's kept boxes): their
    # fake kernel answers with an unbacked size, which the spec must declare (extra["data_dependent_output"]).
    with FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()) as mode:
        fake = module(*[mode.from_tensor(t, static_shapes=True) for t in inputs])
    pairs = zip(fake, expected, strict=True) if isinstance(expected, tuple) else [(fake, expected)]
    for got, want in pairs:
        assert got.dtype == want.dtype and got.dim() == want.dim(), (got, want)
        for size, eager in zip(got.shape, want.shape, strict=True):
            if isinstance(size, torch.SymInt) and not isinstance(eager, torch.SymInt):
                assert spec.extra.get("data_dependent_output"), f"{name}: an unbacked size in an undeclared op"
            else:
                assert size == eager, (got.shape, want.shape)


REFERENCE_CASES = [
    pytest.param(spec, path, dtype, operands, id=f"{spec.name}-{path}-{str(dtype)[6:]}-{operands}")
    for spec in specs.all_specs()
    if spec.reference is not None and spec.is_available()
    for path in spec.call_paths
    for dtype in spec.dtypes
    # A mapping's half cells test its export rule (parity, against the float64 value); eagerly they would run torch's
    # own half kernels (which may round at every step, or not exist), not opbridge's.
    if spec.namespace == "opbridge" or dtype not in specs.HALF_DTYPES
    for operands in spec.operand_kinds
]


@pytest.mark.parametrize(("spec", "path", "dtype", "operands"), REFERENCE_CASES)
def test_every_op_matches_its_reference(spec, path, dtype, operands):
    """Every op and mapping, every call path of the parity matrix, against the spec's independent reference."""
    module = spec.module(path, operands)
    if dtype.is_floating_point:
        module = module.to(dtype)
    inputs = spec.sample_inputs(dtype, operands, 3)
    with torch.no_grad():
        got = module(*inputs)
    # A reference that takes `path` computes what that call path asks for (e.g. scatter_reduce's modes).
    # ... and one that takes `operands` is given the operand kind (e.g. einsum's equation).
    parameters = inspect.signature(spec.reference).parameters
    extra = {k: v for k, v in (("path", path), ("operands", operands)) if k in parameters}
    if dtype in specs.HALF_DTYPES:
        _assert_close_to_float64_reference(spec, inputs, extra, got, dtype)
        return
    expected = spec.reference(*inputs, **extra)
    tolerance = {torch.float32: 2e-5, torch.float64: 1e-10}.get(dtype, 0)
    if isinstance(got, tuple):  # several outputs (values and indices), each in its own dtype
        expected = tuple(e.to(g.dtype) for g, e in zip(got, expected, strict=True))
    else:
        expected = expected.to(got.dtype)
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance, equal_nan=True)


def _assert_close_to_float64_reference(spec, inputs, extra, got, dtype):
    """Half precision: the reference in float64 on the same (half) inputs, as the ops compute (float32 inside, one
    rounding; docs/api.md). The call path's module holds its parameters rounded to the half type where the
    reference's model keeps them in float32, and some references compute in their inputs' dtype, so the bound is a
    few roundings of the output's largest magnitude rather than one per element (tests/test_mixed_precision.py
    checks the one-rounding bound op by op)."""
    wide = [t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
    expected = spec.reference(*wide, **extra)
    unit = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dtype]
    pairs = zip(got, expected, strict=True) if isinstance(got, tuple) else [(got, expected)]
    for g, e in pairs:
        if not g.dtype.is_floating_point:
            assert torch.equal(g, e.to(g.dtype)), f"{spec.name}: indices differ from the reference's"
            continue
        assert g.dtype == dtype, f"{spec.name}: a {dtype} input gave a {g.dtype} output"
        scale = float(e.abs().nan_to_num(posinf=0, neginf=0).max()) if e.numel() else 0.0
        tolerance = 16 * unit * max(scale, 1.0)
        torch.testing.assert_close(g.double(), e.double(), rtol=2 * unit, atol=tolerance, equal_nan=True)


def test_no_shared_op_list_remains():
    """The files every op used to edit no longer name ops."""
    names = set(OP_MODULES)
    shared = [
        ROOT / "CMakeLists.txt", ROOT / "cpp" / "torch" / "CMakeLists.txt", ROOT / "cpp" / "ort" / "CMakeLists.txt",
        ROOT / "cpp" / "ort" / "api.h", ROOT / "cpp" / "ort" / "register.cc",
        ROOT / "cpp" / "torch" / "python" / "module.cpp",
        ROOT / "python" / "opbridge" / "__init__.py", ROOT / "python" / "opbridge" / "nn.py",
        ROOT / "python" / "opbridge_ort" / "__init__.py", ROOT / "tests" / "ort_smoke.py",
        ROOT / "cpp" / "tests" / "CMakeLists.txt", ROOT / "python" / "opbridge" / "_cli.py",
        ROOT / "tests" / "fuzz.py", *FUZZ_CASES.glob("_*.py"), *BENCH.glob("_*.py"),
    ]  # fmt: skip
    for path in shared:
        text = path.read_text()
        for name in names:
            assert not re.search(rf"\b{name}\b", text), f"{path.relative_to(ROOT)} names the op {name}"


def test_torch_knows_each_schema_once():
    for name in OP_MODULES:
        assert hasattr(torch.ops.opbridge, name), f"torch.ops.opbridge.{name} is not registered: is _C rebuilt?"
