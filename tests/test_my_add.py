"""my_add on the PyTorch side: every call path against plain torch math, bad
input, autograd, opcheck, and the compilers/tracers (export, compile, script)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import opbridge
from conftest import TOLERANCES, beyond_last_level_cache, randn

CALL_PATHS = {
    "opbridge.my_add": opbridge.my_add,
    "torch.ops": torch.ops.opbridge.my_add,
    "pybind": opbridge._C.my_add,
    "autograd.Function": opbridge.MyAddFunction.apply,
    "nn.Module": opbridge.nn.MyAdd(),
}

SHAPES = [
    ((4, 5), (4, 5)),  # same shape
    ((4, 5), (5,)),  # row broadcast
    ((4, 1), (1, 5)),  # both broadcast
    ((2, 1, 3), (4, 1)),  # rank differs, both broadcast
    ((), ()),  # 0-d
    ((), (3, 2)),  # 0-d with a matrix
    ((0, 3), (3,)),  # empty
    ((2, 0), (1, 1)),  # empty after broadcast
    ((2, 1, 3, 1, 2, 1, 2), (3, 4, 2, 5, 2)),  # rank 7
    ((70000,), (1,)),  # several parallel chunks
    ((3, 70001), (70001,)),
]


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Independent of our kernel: torch's own arithmetic in float64."""
    return (2 * a.double() + b.double()).to(a.dtype)


@pytest.mark.parametrize("path", CALL_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
@pytest.mark.parametrize(("a_shape", "b_shape"), SHAPES, ids=str)
def test_matches_torch_math(path, dtype, a_shape, b_shape, generator):
    a, b = randn(a_shape, dtype, generator), randn(b_shape, dtype, generator)
    out = CALL_PATHS[path](a, b)
    expected = reference(a, b)
    assert out.shape == expected.shape and out.dtype == dtype and out.is_contiguous()
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(out, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("path", CALL_PATHS)
def test_non_contiguous_inputs(path, generator):
    base = randn((6, 8, 4), generator=generator)
    a = base.transpose(0, 2)  # (4, 8, 6), strided
    b = randn((8, 12), generator=generator)[:, ::2]  # (8, 6), every other column
    out = CALL_PATHS[path](a, b)
    torch.testing.assert_close(out, 2 * a + b, rtol=0, atol=0)
    expanded = randn((1, 6), generator=generator).expand(8, 6)  # stride 0
    torch.testing.assert_close(CALL_PATHS[path](expanded, b), 2 * expanded + b, rtol=0, atol=0)


@pytest.mark.parametrize("path", CALL_PATHS)
def test_bad_inputs_raise_clear_errors(path):
    call = CALL_PATHS[path]
    with pytest.raises(
        RuntimeError, match=r"opbridge::my_add: a of shape \[2, 3\] and b of shape \[4\] cannot be broadcast"
    ):
        call(torch.ones(2, 3), torch.ones(4))
    with pytest.raises(
        RuntimeError,
        match=r"opbridge::my_add: a and b must have the same dtype, got a: torch\.float32 and b: torch\.float64",
    ):
        call(torch.ones(2), torch.ones(2, dtype=torch.float64))
    with pytest.raises(
        RuntimeError,
        match=r"opbridge::my_add: expected float32, float64, float16 or bfloat16 tensors, got torch\.int32",
    ):
        call(torch.ones(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32))


def test_meta_tensors_follow_the_fake_kernel():
    # The fake kernel is what torch.export/compile see: same shape rules and checks.
    with torch.device("meta"):
        out = opbridge.my_add(torch.empty(3, 1, 5), torch.empty(4, 1))
        assert out.shape == (3, 4, 5)
        with pytest.raises(RuntimeError, match="same dtype"):
            opbridge.my_add(torch.empty(2), torch.empty(2, dtype=torch.float64))


@pytest.mark.parametrize(
    ("a_shape", "b_shape"), [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (2,))], ids=str
)
@pytest.mark.parametrize("path", ["opbridge.my_add", "autograd.Function"])
def test_gradients(path, a_shape, b_shape, generator):
    a = randn(a_shape, torch.float64, generator).requires_grad_()
    b = randn(b_shape, torch.float64, generator).requires_grad_()
    assert torch.autograd.gradcheck(CALL_PATHS[path], (a, b))
    assert torch.autograd.gradgradcheck(CALL_PATHS[path], (a, b))
    # Against autograd of the plain expression.
    grad = randn(torch.broadcast_shapes(a_shape, b_shape), torch.float64, generator)
    got = torch.autograd.grad(CALL_PATHS[path](a, b), (a, b), grad)
    want = torch.autograd.grad(2 * a + b, (a, b), grad)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize(
    "args",
    [
        (torch.randn(3, 4), torch.randn(3, 4)),
        (torch.randn(3, 4, dtype=torch.float64, requires_grad=True), torch.randn(4, dtype=torch.float64)),
        (torch.randn(2, 1, 4, requires_grad=True), torch.randn(3, 1, requires_grad=True)),
        (torch.randn(()), torch.randn(5)),
        (torch.randn(0, 4), torch.randn(4)),
        (torch.randn(3, 4).t(), torch.randn(4, 3)),
        (torch.randn(2, 3, dtype=torch.float16), torch.randn(2, 3, dtype=torch.float16)),
    ],
    ids=lambda args: "-".join(f"{list(t.shape)}" for t in args),
)
def test_opcheck(args):
    torch.library.opcheck(torch.ops.opbridge.my_add.default, args)


def test_torch_export_with_dynamic_shapes():
    batch = torch.export.Dim("batch")
    program = torch.export.export(
        opbridge.nn.MyAdd(), (torch.randn(2, 3, 5), torch.randn(5)), dynamic_shapes=({0: batch}, None)
    )
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert torch.ops.opbridge.my_add.default in targets
    a, b = torch.randn(7, 3, 5), torch.randn(5)
    torch.testing.assert_close(program.module()(a, b), 2 * a + b)


@pytest.mark.parametrize("path", ["opbridge.my_add", "pybind", "autograd.Function"])
def test_torch_export_records_the_op_for_every_call_path(path):
    class Model(torch.nn.Module):
        def forward(self, a, b):
            return CALL_PATHS[path](a, b)

    program = torch.export.export(Model(), (torch.randn(2, 3), torch.randn(3)))
    a, b = torch.randn(2, 3), torch.randn(3)
    torch.testing.assert_close(program.module()(a, b), 2 * a + b)


def test_torch_compile_dynamic():
    compiled = torch.compile(opbridge.my_add, dynamic=True, fullgraph=True, backend="aot_eager")
    for n in (2, 5, 9):
        a, b = torch.randn(n, 4), torch.randn(4)
        torch.testing.assert_close(compiled(a, b), 2 * a + b)


def test_torchscript_script_and_save_load(tmp_path):
    scripted = torch.jit.script(opbridge.nn.MyAdd())
    assert "opbridge::my_add" in str(scripted.inlined_graph)
    path = tmp_path / "my_add.pt"
    scripted.save(str(path))
    loaded = torch.jit.load(str(path))
    a, b = torch.randn(3, 4), torch.randn(4)
    torch.testing.assert_close(loaded(a, b), 2 * a + b)
    # A fresh process that only imports opbridge (for the op) loads and runs it.
    script = (
        "import sys, torch, opbridge\n"
        "m = torch.jit.load(sys.argv[1])\n"
        "a, b = torch.ones(2, 3), torch.ones(3)\n"
        "assert torch.equal(m(a, b), torch.full((2, 3), 3.0))\n"
    )
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, cwd=tmp_path)


def test_torchscript_trace_records_the_op():
    traced = torch.jit.trace(lambda a, b: opbridge._C.my_add(a, b), (torch.randn(2, 3), torch.randn(3)))
    assert "opbridge::my_add" in str(traced.graph)
    a, b = torch.randn(5, 3), torch.randn(3)
    torch.testing.assert_close(traced(a, b), 2 * a + b)


def test_multithreaded_kernel_matches_single_thread():
    a, b = torch.randn(3, 200_003), torch.randn(200_003)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = opbridge.my_add(a, b)
        torch.set_num_threads(max(2, previous))
        multi = opbridge.my_add(a, b)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(single, multi)


@pytest.mark.parametrize("threads", [1, 2])
def test_outputs_beyond_the_cache_are_exact(threads):
    """Outputs larger than the last-level cache take the streaming-store loop (16-byte vectors, scalar tails):
    exact against torch's 2 * a + b (2a is exact, one rounding), on inputs 4 bytes off any vector boundary."""
    count = beyond_last_level_cache()
    a, b = torch.randn(count + 1)[1:], torch.randn(count + 3)[3:]
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        out = opbridge.my_add(a, b)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(out, 2 * a + b)
    a2, b1 = a[: count - 7].view(1, -1).expand(2, -1), b[: count - 7]  # two rows, b broadcast over them
    assert torch.equal(opbridge.my_add(a2, b1), 2 * a2 + b1)


# The contract of this op's public entry points (docs/api.md), run by tests/test_contract.py: bad inputs, the
# error type and the words its message must contain.
CONTRACT_CASES = {
    "opbridge.my_add": [
        (lambda: opbridge.my_add(torch.ones(2), None), TypeError, ["opbridge.my_add", "b must be a tensor"]),
        (lambda: opbridge.my_add([1.0], torch.ones(2)), TypeError, ["a must be a tensor", "list"]),
        (
            lambda: opbridge.my_add(torch.ones(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32)),
            RuntimeError,
            ["float32, float64, float16 or bfloat16", "torch.int32"],
        ),
        (lambda: opbridge.my_add(torch.ones(2), torch.ones(2, dtype=torch.float64)), RuntimeError, ["same dtype"]),
        (lambda: opbridge.my_add(torch.ones(2, 3), torch.ones(4)), RuntimeError, ["[2, 3]", "[4]", "broadcast"]),
        (lambda: opbridge.my_add(torch.ones(2), torch.ones(2, device="meta")), RuntimeError, ["one device", "meta"]),
    ],
    "opbridge._C.my_add": [
        (lambda: opbridge._C.my_add(torch.ones(2), None), TypeError, ["my_add"]),
        (lambda: opbridge._C.my_add(torch.ones(2), torch.ones(3)), RuntimeError, ["cannot be broadcast"]),
    ],
    "opbridge.MyAddFunction": [
        (lambda: opbridge.MyAddFunction.apply(torch.ones(2), torch.ones(3)), RuntimeError, ["cannot be broadcast"]),
        (
            lambda: opbridge.MyAddFunction.apply(torch.ones(2), torch.ones(2, device="meta")),
            RuntimeError,
            ["one device"],
        ),
    ],
    "opbridge.nn.MyAdd": [
        (lambda: opbridge.nn.MyAdd()(torch.ones(2), None), TypeError, ["b must be a tensor"]),
    ],
}
