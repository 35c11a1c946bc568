"""deform_conv2d on the PyTorch side and through export: against torchvision
(where its compiled ops load) and against a plain numpy reference (always)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import opbridge
import opbridge_ort
from ort_cases.deform_conv2d import deform_conv2d_reference


def _torchvision_ops():
    try:
        import torchvision

        torch.ops.torchvision.deform_conv2d  # noqa: B018  (raises if the compiled ops do not load)
        return torchvision
    except Exception:
        return None


torchvision = _torchvision_ops()
needs_torchvision = pytest.mark.skipif(
    torchvision is None, reason="torchvision's compiled ops do not load with this torch (e.g. the CPU-only build)"
)

# (N, C_in, H, W, C_out, kernel, stride, padding, dilation, groups, offset_groups, mask, bias)
CONFIGS = [
    (1, 4, 7, 6, 5, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, True, True),
    (2, 6, 9, 8, 4, (3, 2), (2, 1), (0, 2), (1, 2), 2, 3, False, True),  # non-square kernel, groups, 3 offset groups
    (2, 8, 5, 5, 8, (1, 3), (1, 2), (1, 0), (2, 1), 4, 2, True, False),
    (3, 3, 4, 11, 3, (2, 2), (1, 1), (2, 2), (1, 1), 3, 1, True, True),  # depthwise
    (1, 2, 10, 10, 2, (5, 5), (3, 3), (2, 2), (1, 1), 1, 2, False, False),
    # Channel runs past the CPU kernels' 16-lane vectors: 20 channels a group and offset group (a vector and a tail),
    # and 18 a group across 4 groups in one offset group.
    (1, 40, 5, 6, 6, (3, 3), (1, 1), (1, 1), (1, 1), 2, 2, True, True),
    (2, 72, 4, 5, 8, (3, 3), (1, 1), (1, 1), (1, 1), 4, 1, True, False),
]


def _inputs(config, dtype, seed=0):
    n, c, h, w, c_out, (kh, kw), stride, padding, dilation, groups, offset_groups, use_mask, use_bias = config
    g = torch.Generator().manual_seed(seed)
    out_h = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    out_w = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    x = torch.randn(n, c, h, w, generator=g, dtype=dtype)
    weight = torch.randn(c_out, c // groups, kh, kw, generator=g, dtype=dtype)
    offset = 2 * torch.randn(n, 2 * offset_groups * kh * kw, out_h, out_w, generator=g, dtype=dtype)
    mask = torch.rand(n, offset_groups * kh * kw, out_h, out_w, generator=g, dtype=dtype) if use_mask else None
    bias = torch.randn(c_out, generator=g, dtype=dtype) if use_bias else None
    return x, offset, weight, bias, stride, padding, dilation, mask, groups, offset_groups


TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(map(str, c[:5])) + f"-k{c[5]}")
def test_matches_numpy_reference(config, dtype):
    x, offset, weight, bias, stride, padding, dilation, mask, groups, offset_groups = _inputs(config, dtype)
    out = opbridge.deform_conv2d(x, offset, weight, bias, stride, padding, dilation, mask)
    expected = deform_conv2d_reference(
        x.numpy(), weight.numpy(), offset.numpy(), None if bias is None else bias.numpy(),
        None if mask is None else mask.numpy(), stride, (*padding, *padding), dilation, groups, offset_groups,
    )  # fmt: skip
    np.testing.assert_allclose(out.numpy(), expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@needs_torchvision
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(map(str, c[:5])) + f"-k{c[5]}")
def test_matches_torchvision(config, dtype):
    x, offset, weight, bias, stride, padding, dilation, mask, _, _ = _inputs(config, dtype)
    ours = opbridge.deform_conv2d(x, offset, weight, bias, stride, padding, dilation, mask)
    theirs = torchvision.ops.deform_conv2d(x, offset, weight, bias, stride, padding, dilation, mask)
    torch.testing.assert_close(ours, theirs, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@needs_torchvision
def test_module_twin_matches_torchvision_module():
    ours = opbridge.nn.DeformConv2d(4, 6, (3, 2), stride=1, padding=(1, 0), groups=2)
    theirs = torchvision.ops.DeformConv2d(4, 6, (3, 2), stride=1, padding=(1, 0), groups=2)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 4, 8, 8)
    offset = torch.randn(2, 2 * 6, 8, 7)
    torch.testing.assert_close(ours(x, offset), theirs(x, offset))


def test_bad_inputs_raise_clear_errors():
    x, offset, weight, bias, _, _, _, mask, _, _ = _inputs(CONFIGS[0], torch.float32)
    call = opbridge.deform_conv2d
    cases = [
        (lambda: call(x[0], offset, weight), "input must be 4-D"),
        (lambda: call(x, offset[:, :4], weight), "offset.shape\\[1\\] \\(4\\) must be a multiple of 2 \\* kernel_h"),
        (lambda: call(x, offset[:, :, :2], weight, padding=1), "offset must have shape \\[1, 18, 7, 6\\]"),
        (lambda: call(x, offset, weight[:, :3], padding=1), "in_channels / groups = 3\\) must divide the 4 channels"),
        (lambda: call(x, offset, weight, bias[:2], padding=1), "bias must have 5 elements"),
        (lambda: call(x, offset, weight, None, 1, 1, 1, mask[:, :2]), "mask must have shape"),
        (lambda: call(x, offset, weight.double(), padding=1), "weight must have the dtype of input"),
        (lambda: call(x.int(), offset, weight), "expected float32, float64, float16 or bfloat16"),
        (
            lambda: torch.ops.opbridge.deform_conv2d(x, offset, weight, None, [0, 0], [1, 1], [1, 1], None),
            "must be positive",
        ),
        (lambda: torch.ops.opbridge.deform_conv2d(x, offset, weight, None, [1, 1], [-1, -1], [1, 1], None), "not be"),
        (lambda: call(x[:, :, :1, :1], offset, weight), "does not fit"),
    ]
    for run, pattern in cases:
        with pytest.raises(RuntimeError, match=pattern):
            run()


@pytest.mark.parametrize("config", CONFIGS[:3], ids=lambda c: "x".join(map(str, c[:5])))
def test_opcheck(config):
    """Every opcheck test, the autograd registration included, for the op and its backward."""
    x, offset, weight, bias, stride, padding, dilation, mask, _, _ = _inputs(config, torch.float64)
    tensors = [t.requires_grad_() for t in (x, offset, weight, bias, mask) if t is not None]
    args = (x, offset, weight, bias, list(stride), list(padding), list(dilation), mask)
    torch.library.opcheck(torch.ops.opbridge.deform_conv2d.default, args)
    grad_out = torch.randn_like(opbridge.deform_conv2d(*args))
    backward_args = (grad_out, *(a.detach() if isinstance(a, torch.Tensor) else a for a in args))
    torch.library.opcheck(torch.ops.opbridge.deform_conv2d_backward.default, backward_args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))  # fmt: skip
    assert tensors


# --- backward ----------------------------------------------------------------------------------------------------

BACKWARD_CONFIGS = [
    *CONFIGS,
    (0, 4, 6, 5, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, True, True),  # empty batch
    (2, 4, 6, 7, 4, (2, 3), (1, 1), (0, 0), (2, 1), 2, 4, True, True),  # one channel per offset group
]


def _grads(call, inputs, grad_out):
    tensors = [t for t in inputs if t is not None]
    return torch.autograd.grad(call(*inputs), tensors, grad_out, allow_unused=False)


def _with_grad(config, dtype, seed=0):
    x, offset, weight, bias, stride, padding, dilation, mask, _, _ = _inputs(config, dtype, seed)
    leaves = [t.requires_grad_() if t is not None else None for t in (x, offset, weight, bias, mask)]
    return leaves, (stride, padding, dilation)


@needs_torchvision
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("config", BACKWARD_CONFIGS, ids=lambda c: "x".join(map(str, c[:5])) + f"-k{c[5]}")
def test_gradients_match_torchvision(config, dtype):
    (x, offset, weight, bias, mask), (stride, padding, dilation) = _with_grad(config, dtype)

    def ours(x, offset, weight, bias, mask):
        return opbridge.deform_conv2d(x, offset, weight, bias, stride, padding, dilation, mask)

    def theirs(x, offset, weight, bias, mask):
        return torchvision.ops.deform_conv2d(x, offset, weight, bias, stride, padding, dilation, mask)

    inputs = (x, offset, weight, bias, mask)
    grad_out = torch.randn_like(ours(*inputs).detach())
    tolerance = {torch.float32: 2e-4, torch.float64: 1e-10}[dtype]
    for got, want in zip(_grads(ours, inputs, grad_out), _grads(theirs, inputs, grad_out), strict=True):
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("config", BACKWARD_CONFIGS, ids=lambda c: "x".join(map(str, c[:5])) + f"-k{c[5]}")
def test_gradcheck(config):
    """Finite differences in float64: independent of any other implementation."""
    small = (min(config[0], 1), *config[1:])  # one image keeps it quick; the batch is covered above
    (x, offset, weight, bias, mask), (stride, padding, dilation) = _with_grad(small, torch.float64)

    def call(x, offset, weight, bias, mask):
        return opbridge.deform_conv2d(x, offset, weight, bias, stride, padding, dilation, mask)

    # Offsets of exact integers would sit on the kinks of bilinear sampling; randn never gives them.
    assert torch.autograd.gradcheck(call, (x, offset, weight, bias, mask), eps=1e-6, atol=1e-5)


def test_backward_is_deterministic():
    config = (2, 8, 12, 12, 8, (3, 3), (1, 1), (1, 1), (1, 1), 2, 2, True, True)
    (x, offset, weight, bias, mask), (stride, padding, dilation) = _with_grad(config, torch.float32)

    def call(*inputs):
        return opbridge.deform_conv2d(inputs[0], inputs[1], inputs[2], inputs[3], stride, padding, dilation,
                                      inputs[4])  # fmt: skip

    grad_out = torch.randn(2, 8, 12, 12)
    first = _grads(call, (x, offset, weight, bias, mask), grad_out)
    for _ in range(3):
        for a, b in zip(first, _grads(call, (x, offset, weight, bias, mask), grad_out), strict=True):
            assert torch.equal(a, b)


# Run in a subprocess under OPBRIDGE_CPU_GEMM: forward and all five gradients of a float32 convolution large enough
# for several pixel blocks per image (so each GEMM writes a block of the output's rows, ldc != n) with two weight
# groups (strided GEMM operands), at two threads; and which of torch's GEMM ops ran, from the profiler at one.
_GEMM_SCRIPT = """
import sys
import numpy as np, torch
sys.path.insert(0, sys.argv[2])
import opbridge
from test_deform_conv2d import GEMM_CONFIG, _inputs, _grads
x, offset, weight, bias, stride, padding, dilation, mask, _, _ = _inputs(GEMM_CONFIG, torch.float64)
x, offset, weight, bias, mask = (t.float().requires_grad_() for t in (x, offset, weight, bias, mask))
def call(x, offset, weight, bias, mask):
    return opbridge.deform_conv2d(x, offset, weight, bias, stride, padding, dilation, mask)
grad_out = torch.randn(call(x, offset, weight, bias, mask).shape, generator=torch.Generator().manual_seed(1))
# Which GEMM runs, at 1 thread: the profiler sees the ops of the calling thread (tasks that run on torch's worker
# threads may not be recorded); the values at 2 threads.
torch.set_num_threads(1)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
    _grads(call, (x, offset, weight, bias, mask), grad_out)
names = {event.key for event in profile.key_averages()}
torch.set_num_threads(2)
out = call(x, offset, weight, bias, mask)
grads = _grads(call, (x, offset, weight, bias, mask), grad_out)
np.savez(sys.argv[1], out=out.detach().numpy(), **{f"grad{i}": g.numpy() for i, g in enumerate(grads)},
         onednn="mkldnn::_linear_pointwise" in names, blas="aten::mm" in names)
"""
# 24x30 = 720 output pixels: blocks of 192; 2 groups of 8 input channels (GEMM depth 72, row stride 144).
GEMM_CONFIG = (2, 16, 24, 30, 12, (3, 3), (1, 1), (1, 1), (1, 1), 2, 2, True, True)


def _gemm_config_reference() -> np.ndarray:
    """GEMM_CONFIG's convolution by the numpy reference, in float64."""
    x, offset, weight, bias, stride, padding, dilation, mask, groups, offset_groups = _inputs(
        GEMM_CONFIG, torch.float64
    )
    return deform_conv2d_reference(x.numpy(), weight.numpy(), offset.numpy(), bias.numpy(), mask.numpy(), stride,
                                   (*padding, *padding), dilation, groups, offset_groups)  # fmt: skip


@pytest.mark.parametrize("gemm", ["blas", "onednn", "mkl"])
def test_both_cpu_gemms_compute_the_convolution_and_its_gradients(tmp_path, gemm):
    """The float32 GEMMs run on torch's BLAS or on oneDNN (torch's mkldnn::_linear_pointwise), chosen by CPU and
    OPBRIDGE_CPU_GEMM (cpp/torch/cpu_gemm.h): each, forced, is the one that runs (a value that is neither is named
    on stderr once and leaves the CPU's choice), and computes the forward (against the numpy reference) and the
    gradients (against torchvision's in float64 where its ops load, else against our float64 op, whose GEMMs are
    always torch's BLAS; test_gradcheck covers that one by finite differences)."""
    path = tmp_path / "result.npz"
    env = dict(os.environ, OPBRIDGE_CPU_GEMM=gemm)
    command = [sys.executable, "-c", _GEMM_SCRIPT, str(path), str(Path(__file__).parent)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    result = dict(np.load(path))
    warning = "OPBRIDGE_CPU_GEMM=mkl is not one of blas, onednn"
    assert done.stderr.count(warning) == (gemm == "mkl"), done.stderr
    if gemm == "mkl":
        assert bool(result["onednn"]) != bool(result["blas"]), result
    else:
        assert bool(result["onednn"]) == (gemm == "onednn") and bool(result["blas"]) == (gemm == "blas"), result
    x, offset, weight, bias, stride, padding, dilation, mask, _, _ = _inputs(GEMM_CONFIG, torch.float64)
    expected = _gemm_config_reference()
    np.testing.assert_allclose(result["out"], expected, rtol=1e-4, atol=1e-4)
    leaves = [t.requires_grad_() for t in (x, offset, weight, bias, mask)]
    reference_op = torchvision.ops.deform_conv2d if torchvision is not None else opbridge.deform_conv2d

    def call(x, offset, weight, bias, mask):
        return reference_op(x, offset, weight, bias, stride, padding, dilation, mask)

    grad_out = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1)).double()
    for i, want in enumerate(_grads(call, leaves, grad_out)):
        np.testing.assert_allclose(result[f"grad{i}"], want.numpy(), rtol=2e-4, atol=2e-4, err_msg=f"gradient {i}")


def test_double_backward_raises_clearly():
    (x, offset, weight, bias, mask), (stride, padding, dilation) = _with_grad(CONFIGS[0], torch.float64)
    out = opbridge.deform_conv2d(x, offset, weight, bias, stride, padding, dilation, mask)
    (grad_x,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        grad_x.sum().backward()


# mmcv's published DCNv1 / DCNv2 values (tests/test_ops/test_deform_conv.py, test_modulated_deform_conv.py):
# a Conv2d predicts the offsets (and mask) of a 1-channel deformable convolution; the forward and every
# gradient, of the input, the deformable weight and the offset convolution, are given to 2-3 decimals.
MMCV_V1 = {
    "input": [[[[1.0, 2.0, 3.0], [0.0, 1.0, 2.0], [3.0, 5.0, 2.0]]]],
    "offset_weight": [[0.1, 0.4, 0.6, 0.1], [0.3, 0.2, 0.1, 0.3], [0.5, 0.5, 0.2, 0.8], [0.8, 0.3, 0.9, 0.1],
                      [0.3, 0.1, 0.2, 0.5], [0.3, 0.7, 0.5, 0.3], [0.6, 0.2, 0.5, 0.3], [0.4, 0.1, 0.8, 0.4]],
    "offset_bias": [0.7, 0.1, 0.8, 0.5, 0.6, 0.5, 0.4, 0.7],
    "weight": [0.4, 0.2, 0.1, 0.9],
    "out": [[[[1.650, 0.0], [0.000, 0.0]]]],
    "x_grad": [[[[-0.666, 0.204, 0.000], [0.030, -0.416, 0.012], [0.000, 0.252, 0.129]]]],
    "offset_weight_grad": [[[1.44, 2.88], [0.00, 1.44]], [[-0.72, -1.44], [0.00, -0.72]],
                           [[0.00, 0.00], [0.00, 0.00]], [[0.00, 0.00], [0.00, 0.00]],
                           [[-0.10, -0.20], [0.00, -0.10]], [[-0.08, -0.16], [0.00, -0.08]],
                           [[-0.54, -1.08], [0.00, -0.54]], [[-0.54, -1.08], [0.00, -0.54]]],
    "offset_bias_grad": [1.44, -0.72, 0.0, 0.0, -0.10, -0.08, -0.54, -0.54],
    "weight_grad": [[[[3.62, 0.0], [0.40, 0.18]]]],
}  # fmt: skip
MMCV_V2 = {
    "input": [[[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]]],
    "out": [[[[0.5, 1.5, 2.5, 1.5], [1.0, 3.0, 5.0, 3.0], [1.0, 3.0, 5.0, 3.0], [0.5, 1.5, 2.5, 1.5]]]],
    "x_grad": [[[[2.0, 2.0, 2.0], [2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]]],
    "weight_grad": [[[[9.0, 9.0], [9.0, 9.0]]]],
    "offset_weight_grad": [[[-7.0, -4.0], [0.0, 0.0]], [[-9.0, 7.5], [-6.0, 5.0]], [[-4.0, -7.0], [0.0, 0.0]],
                           [[-7.5, -9.0], [-5.0, -6.0]], [[-7.0, -4.0], [-7.0, -4.0]], [[-6.0, 5.0], [-9.0, 7.5]],
                           [[-4.0, -7.0], [-4.0, -7.0]], [[-5.0, -6.0], [-7.5, -9.0]], [[10.5, 6.0], [7.0, 4.0]],
                           [[6.0, 10.5], [4.0, 7.0]], [[7.0, 4.0], [10.5, 6.0]], [[4.0, 7.0], [6.0, 10.5]]],
    "offset_bias_grad": [-3.0, -1.5, -3.0, -1.5, -3.0, -1.5, -3.0, -1.5, 4.5, 4.5, 4.5, 4.5],
}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("batch", [1, 10])
def test_mmcv_dcn_v1_published_values(dtype, batch):
    v1 = MMCV_V1
    x = torch.tensor(v1["input"], dtype=dtype).repeat(batch, 1, 1, 1).requires_grad_()
    conv_offset = torch.nn.Conv2d(1, 8, 2).to(dtype)
    with torch.no_grad():
        conv_offset.weight.copy_(torch.tensor(v1["offset_weight"]).reshape(8, 1, 2, 2))
        conv_offset.bias.copy_(torch.tensor(v1["offset_bias"]))
    weight = torch.tensor(v1["weight"], dtype=dtype).reshape(1, 1, 2, 2).requires_grad_()
    out = opbridge.deform_conv2d(x, conv_offset(x), weight)
    out.backward(torch.ones_like(out))
    expect = lambda name: torch.tensor(v1[name], dtype=dtype)  # noqa: E731
    torch.testing.assert_close(out, expect("out").repeat(batch, 1, 1, 1), rtol=0, atol=1e-3)
    torch.testing.assert_close(x.grad, expect("x_grad").repeat(batch, 1, 1, 1), rtol=0, atol=1e-3)
    # Parameter gradients sum over the batch.
    torch.testing.assert_close(conv_offset.weight.grad / batch, expect("offset_weight_grad").reshape(8, 1, 2, 2),
                               rtol=0, atol=1e-3)  # fmt: skip
    torch.testing.assert_close(conv_offset.bias.grad / batch, expect("offset_bias_grad"), rtol=0, atol=1e-3)
    torch.testing.assert_close(weight.grad / batch, expect("weight_grad"), rtol=0, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_mmcv_dcn_v2_published_values(dtype):
    """Zero offsets sample exactly on pixels: the offset gradients follow the [floor, floor + 1] convention."""
    v2 = MMCV_V2
    x = torch.tensor(v2["input"], dtype=dtype).requires_grad_()
    conv_offset = torch.nn.Conv2d(1, 3 * 4, 2, padding=1).to(dtype)
    torch.nn.init.zeros_(conv_offset.weight)
    torch.nn.init.zeros_(conv_offset.bias)
    weight = torch.ones(1, 1, 2, 2, dtype=dtype, requires_grad=True)
    o1, o2, mask = torch.chunk(conv_offset(x), 3, dim=1)  # mmcv's ModulatedDeformConv2dPack layout
    out = opbridge.deform_conv2d(x, torch.cat((o1, o2), dim=1), weight, None, 1, 1, 1, torch.sigmoid(mask))
    out.sum().backward()
    expect = lambda name: torch.tensor(v2[name], dtype=dtype)  # noqa: E731
    torch.testing.assert_close(out, expect("out"), rtol=0, atol=1e-6)
    torch.testing.assert_close(x.grad, expect("x_grad"), rtol=0, atol=1e-6)
    torch.testing.assert_close(weight.grad, expect("weight_grad"), rtol=0, atol=1e-6)
    torch.testing.assert_close(conv_offset.weight.grad, expect("offset_weight_grad").reshape(12, 1, 2, 2),
                               rtol=0, atol=1e-6)  # fmt: skip
    torch.testing.assert_close(conv_offset.bias.grad, expect("offset_bias_grad"), rtol=0, atol=1e-6)


def test_integer_sizes_of_any_integer_type():
    """numpy integers are integers (torchvision accepts them too); floats and bools are not."""
    x, offset, weight = torch.randn(1, 4, 5, 5), torch.zeros(1, 18, 5, 5), torch.randn(6, 4, 3, 3)
    expected = opbridge.deform_conv2d(x, offset, weight, padding=1)
    for padding in (np.int64(1), (np.int32(1), 1), [1, 1]):
        torch.testing.assert_close(opbridge.deform_conv2d(x, offset, weight, padding=padding), expected)
    module = opbridge.nn.DeformConv2d(np.int64(4), 6, np.int64(3))
    assert type(module.in_channels) is int and module.kernel_size == (3, 3)


def test_offset_gradient_on_the_border():
    """A sample exactly on the border of the padded-out region (y or x == -1 or == size) lies outside: its
    value is 0 and so is its offset gradient (mmcv's convention, which mmcv's published DCNv2 values depend
    on). torchvision differs there only: it takes the one-sided derivative from inside the image."""
    x = torch.arange(1.0, 10.0, dtype=torch.float64).reshape(1, 1, 3, 3)
    offset = torch.zeros(1, 2, 1, 1, dtype=torch.float64, requires_grad=True)
    weight = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    # A 1x1 kernel with padding 1 and stride 5: the only output samples (y, x) = (-1, -1).
    out = opbridge.deform_conv2d(x, offset, weight, None, 5, 1)
    assert out.item() == 0.0
    out.sum().backward()
    assert offset.grad.abs().sum().item() == 0.0
    # Just inside, at (-0.5, -0.5), the derivative is that of the cell [-1, 0]: 0.5 * x[0, 0] in y and in x.
    inside = torch.tensor([[[[0.5]], [[0.5]]]], dtype=torch.float64, requires_grad=True)
    opbridge.deform_conv2d(x, inside, weight, None, 5, 1).sum().backward()
    torch.testing.assert_close(inside.grad.flatten(), torch.tensor([0.5, 0.5], dtype=torch.float64))


class _TinyDeformNet(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        # Small random offsets: zero ones would put the padding taps exactly on the image border, where
        # torchvision's offset gradient differs by convention (see test_offset_gradient_on_the_border).
        self.offsets = torch.nn.Conv2d(3, 27, 3, padding=1)
        torch.nn.init.normal_(self.offsets.weight, std=0.01)
        torch.nn.init.normal_(self.offsets.bias, std=0.01)
        self.deform = layer

    def forward(self, x):
        predicted = self.offsets(x)
        return self.deform(x, predicted[:, :18], torch.sigmoid(predicted[:, 18:]))


def _train(layer, steps=8):
    torch.manual_seed(0)
    model, x = _TinyDeformNet(layer), torch.randn(4, 3, 8, 8)
    with torch.no_grad():  # a reachable target: another deformable convolution of the same input
        teacher_weight = torch.randn(5, 3, 3, 3) / 3
        target = opbridge.deform_conv2d(x, 0.5 * torch.randn(4, 18, 8, 8), teacher_weight, None, 1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model


@needs_torchvision
def test_training_fine_tunes_a_torchvision_checkpoint_like_torchvision():
    torch.manual_seed(1)
    theirs = torchvision.ops.DeformConv2d(3, 5, 3, padding=1)
    ours = opbridge.nn.DeformConv2d(3, 5, 3, padding=1)
    ours.load_state_dict(theirs.state_dict())  # a torchvision checkpoint
    their_losses, their_model = _train(theirs)
    our_losses, our_model = _train(ours)
    assert our_losses[-1] < 0.95 * our_losses[0], our_losses
    np.testing.assert_allclose(our_losses, their_losses, rtol=1e-4)
    for (name, a), (_, b) in zip(our_model.named_parameters(), their_model.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_training_reduces_the_loss():
    losses, model = _train(opbridge.nn.DeformConv2d(3, 5, 3, padding=1))
    assert losses[-1] < 0.95 * losses[0] and all(b < a for a, b in itertools.pairwise(losses)), losses
    assert model.offsets.weight.grad.abs().sum() > 0  # the offsets learn too


def test_torch_compile_of_a_training_step():
    """The compiled model's forward and (AOT-autograd) backward give eager's loss and gradients."""
    torch.manual_seed(0)
    model = _TinyDeformNet(opbridge.nn.DeformConv2d(3, 5, 3, padding=1))
    x, target = torch.randn(2, 3, 6, 6), torch.randn(2, 5, 6, 6)

    def step(forward):
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(forward(x), target)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    eager_loss, eager_grads = step(model)
    compiled_loss, compiled_grads = step(torch.compile(model, backend="aot_eager", fullgraph=True))
    torch.testing.assert_close(compiled_loss, eager_loss)
    for grad, expected in zip(compiled_grads, eager_grads, strict=True):
        torch.testing.assert_close(grad, expected)


def _model(use_torchvision: bool):
    class Model(torch.nn.Module):
        """The tutorial's model: a Conv2d predicts offsets and a mask for a deformable conv."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.offsets = torch.nn.Conv2d(3, 2 * 9 + 9, 3, padding=1)
            self.weight = torch.nn.Parameter(torch.randn(4, 3, 3, 3))
            self.bias = torch.nn.Parameter(torch.randn(4))

        def forward(self, x):
            predicted = self.offsets(x)
            offset, mask = predicted[:, :18], torch.sigmoid(predicted[:, 18:])
            ops = torchvision.ops if use_torchvision else opbridge
            return ops.deform_conv2d(x, offset, self.weight, self.bias, padding=(1, 1), mask=mask)

    return Model().eval()


@pytest.mark.parametrize("use_torchvision", [False, pytest.param(True, marks=needs_torchvision)],
                         ids=["opbridge", "torchvision"])  # fmt: skip
@pytest.mark.parametrize(
    ("dynamo", "opset", "lowering"),
    [(False, 11, "standard"), (False, 19, "standard"), (False, 12, "custom"), (True, 18, "standard"),
     (True, 20, "standard"), (True, 18, "custom")],
)  # fmt: skip
def test_dynamic_batch_and_spatial_size(tmp_path, use_torchvision, dynamo, opset, lowering):
    model = _model(use_torchvision)
    x = torch.randn(2, 3, 12, 10)
    axes = {"x": {0: "batch", 2: "height", 3: "width"}}
    proto = opbridge.onnx.export(
        model, (x,), None, opset_version=opset, dynamo=dynamo, lowering=lowering, input_names=["x"],
        dynamic_axes=axes if not dynamo else None,
        **({"dynamic_shapes": ({0: torch.export.Dim("batch"), 2: torch.export.Dim("height"),
                                3: torch.export.Dim("width")},)} if dynamo else {}),
    )  # fmt: skip
    ops = {(n.domain, n.op_type) for n in proto.graph.node}
    if lowering == "custom":
        assert ("opbridge", "DeformConv2d") in ops
    elif opset >= 19:
        assert ("", "DeformConv") in ops
    else:
        assert ("", "DeformConv") not in ops and all(domain == "" for domain, _ in ops)
    session = opbridge_ort.InferenceSession(proto)
    for shape in [(1, 3, 12, 10), (3, 3, 7, 15)]:  # other batch and spatial sizes than exported
        other = torch.randn(shape)
        (y,) = session.run(None, {"x": other.numpy()})
        torch.testing.assert_close(torch.from_numpy(y), model(other), rtol=1e-4, atol=1e-4)


class _Functional(torch.nn.Module):
    def __init__(self, weight, bias, stride, padding, dilation):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)
        self.bias = None if bias is None else torch.nn.Parameter(bias)
        self.options = stride, padding, dilation

    def forward(self, x, offset, mask):
        return opbridge.deform_conv2d(x, offset, self.weight, self.bias, *self.options, mask=mask)


@pytest.mark.filterwarnings("ignore:# The axis name:UserWarning")  # torch.export's note on the shared batch Dim
@pytest.mark.parametrize(("dynamo", "opset"), [(False, 9), (False, 11), (False, 13), (False, 18), (True, 18)])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(map(str, c[:5])) + f"-k{c[5]}")
def test_standard_decomposition_on_every_option(config, dynamo, opset):
    """The Gather + MatMul decomposition (opset < 19) against the numpy reference, float64: every option of
    CONFIGS, run at the exported sizes, at a new batch and image size, with offsets far outside the image,
    and with an empty batch."""
    x, offset, weight, bias, stride, padding, dilation, mask, groups, offset_groups = _inputs(config, torch.float64)
    n, c, h, w, c_out, (kh, kw) = config[:6]
    mask = torch.rand(offset.shape[0], offset.shape[1] // 2, *offset.shape[2:], dtype=torch.float64)
    model = _Functional(weight, bias, stride, padding, dilation).eval()
    names = ["x", "offset", "mask"]
    if dynamo:
        batch = torch.export.Dim("batch", min=0)
        extra = {"dynamic_shapes": {k: {0: batch, 2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO} for k in names}}
    else:
        extra = {"dynamic_axes": {k: {0: "batch", 2: f"{k}_h", 3: f"{k}_w"} for k in names}}
    proto = opbridge.onnx.export(model, (x, offset, mask), None, opset_version=opset, dynamo=dynamo,
                                 lowering="standard", input_names=names, **extra)  # fmt: skip
    assert all(node.domain == "" and node.op_type != "DeformConv" for node in proto.graph.node)
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    g = torch.Generator().manual_seed(1)
    for batch, height, width, spread in [(n, h, w, 2.0), (n + 1, h + 3, w + 2, 2.0), (2, h, w, 40.0), (0, h, w, 2.0)]:
        out_h = (height + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
        out_w = (width + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
        inputs = (
            torch.randn(batch, c, height, width, generator=g, dtype=torch.float64),
            spread * torch.randn(batch, 2 * offset_groups * kh * kw, out_h, out_w, generator=g, dtype=torch.float64),
            torch.rand(batch, offset_groups * kh * kw, out_h, out_w, generator=g, dtype=torch.float64),
        )
        (got,) = session.run(None, {k: v.numpy() for k, v in zip(names, inputs, strict=True)})
        assert got.shape == (batch, c_out, out_h, out_w)
        if batch:
            expected = deform_conv2d_reference(
                inputs[0].numpy(), weight.numpy(), inputs[1].numpy(), None if bias is None else bias.numpy(),
                inputs[2].numpy(), stride, (*padding, *padding), dilation, groups, offset_groups,
            )  # fmt: skip
            np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)


def test_standard_deformconv_model_runs_on_ort_with_the_kernel():
    version = tuple(int(v) for v in onnxruntime.__version__.split(".")[:2])
    proto = opbridge.onnx.export(_model(False), (torch.randn(1, 3, 8, 8),), None, opset_version=19, dynamo=False)
    assert "DeformConv" in {n.op_type for n in proto.graph.node}
    onnx.checker.check_model(proto)
    if version >= (1, 25):
        onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    else:
        with pytest.raises(Exception, match="DeformConv"):
            onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.skipif(
    tuple(int(v) for v in onnxruntime.__version__.split(".")[:2]) < (1, 25),
    reason="this onnxruntime has no DeformConv kernel (added in 1.25) to compare with",
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(map(str, c[:5])) + f"-k{c[5]}")
def test_custom_kernel_matches_ort_deformconv(config, dtype):
    """opbridge::DeformConv2d against ONNX Runtime's own DeformConv on the same inputs and attributes."""
    x, offset, weight, bias, stride, padding, dilation, mask, _, _ = _inputs(config, dtype)

    class Model(torch.nn.Module):
        def forward(self, x, offset, weight, *rest):
            bias_, mask_ = (rest[0] if bias is not None else None), (rest[-1] if mask is not None else None)
            return opbridge.deform_conv2d(x, offset, weight, bias_, stride, padding, dilation, mask_)

    inputs = (x, offset, weight, *([bias] if bias is not None else []), *([mask] if mask is not None else []))
    names = ["x", "offset", "weight", "bias", "mask"][:3] + (["bias"] if bias is not None else [])
    names += ["mask"] if mask is not None else []
    feeds = {n: t.numpy() for n, t in zip(names, inputs, strict=True)}
    outputs = []
    for lowering in ("standard", "custom"):
        proto = opbridge.onnx.export(
            Model().eval(), inputs, None, opset_version=19, dynamo=False, lowering=lowering, input_names=names
        )
        outputs.append(opbridge_ort.InferenceSession(proto).run(None, feeds)[0])
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=TOLERANCE[dtype] * 10, atol=TOLERANCE[dtype] * 10)


# Run in a subprocess under OPBRIDGE_ORT_GEMM: the ORT node (opbridge::DeformConv2d, float32) on GEMM_CONFIG's
# convolution (pixel blocks whose products write rows of a wider output, two groups: strided operands).
_ORT_GEMM_SCRIPT = """
import sys
import numpy as np, onnxruntime, torch
sys.path.insert(0, sys.argv[2])
import opbridge, opbridge_ort
from test_deform_conv2d import GEMM_CONFIG, _inputs
x, offset, weight, bias, stride, padding, dilation, mask, _, _ = _inputs(GEMM_CONFIG, torch.float64)
inputs = tuple(t.float() for t in (x, offset, weight, bias, mask))
class Model(torch.nn.Module):
    def forward(self, x, offset, weight, bias, mask):
        return opbridge.deform_conv2d(x, offset, weight, bias, stride, padding, dilation, mask)
names = ["x", "offset", "weight", "bias", "mask"]
proto = opbridge.onnx.export(Model().eval(), inputs, None, opset_version=19, dynamo=False, lowering="custom",
                             input_names=names)
assert [n.op_type for n in proto.graph.node] == ["DeformConv2d"], [n.op_type for n in proto.graph.node]
feeds = {n: t.numpy() for n, t in zip(names, inputs)}
out = []
for threads in (1, 2):
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    out.append(opbridge_ort.InferenceSession(proto, options).run(None, feeds)[0])
np.savez(sys.argv[1], one=out[0], two=out[1])
"""


@pytest.mark.parametrize("gemm", ["openblas", "runtime", "mkl"])
def test_both_ort_gemms_compute_the_convolution(tmp_path, gemm):
    """The ORT node's float32 products run on the library's OpenBLAS or on the runtime's own Gemm kernel (MLAS,
    through OrtApi::CreateOp / InvokeOp), chosen by OpenBLAS's kernels and OPBRIDGE_ORT_GEMM (cpp/ort/gemm.h): each,
    forced, computes the convolution (against the numpy reference) at 1 and 2 threads, and nothing on stderr says
    the runtime's kernel could not be created; a value that is neither is named on stderr once."""
    path = tmp_path / "result.npz"
    env = dict(os.environ, OPBRIDGE_ORT_GEMM=gemm)
    command = [sys.executable, "-c", _ORT_GEMM_SCRIPT, str(path), str(Path(__file__).parent)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    assert done.stderr.count("OPBRIDGE_ORT_GEMM=mkl is not one of openblas, runtime") == (gemm == "mkl"), done.stderr
    assert "could not be created" not in done.stderr, done.stderr
    result = dict(np.load(path))
    expected = _gemm_config_reference()
    for threads in ("one", "two"):
        np.testing.assert_allclose(result[threads], expected, rtol=1e-4, atol=1e-4, err_msg=f"{threads} thread(s)")


# The contract of this op's public entry points (docs/api.md), run by tests/test_contract.py: bad inputs, the
# error type and the words its message must contain.
_X = torch.randn(1, 4, 5, 5)
_W = torch.randn(6, 4, 3, 3)
_OFFSET = torch.zeros(1, 18, 3, 3)
CONTRACT_CASES = {
    "opbridge.deform_conv2d": [
        (lambda: opbridge.deform_conv2d(_X, None, _W), TypeError, ["offset must be a tensor", "NoneType"]),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, bias="b"), TypeError, ["bias must be a tensor or None"]),
        (
            lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, stride=(1.7, 1.7)),
            TypeError,
            ["stride must be an int or a pair of ints", "1.7"],
        ),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, stride=1.5), TypeError, ["stride", "1.5"]),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, padding=(0.9, 0.9)), TypeError, ["padding", "0.9"]),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, dilation=True), TypeError, ["dilation", "True"]),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, padding=np.float64(1)), TypeError, ["padding", "1.0"]),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, stride=(1, 2, 3)), TypeError, ["stride", "pair"]),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, padding=-1), ValueError, ["padding must be >= 0"]),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W, stride=0), ValueError, ["stride must be >= 1"]),
        (
            lambda: opbridge.deform_conv2d(_X, _OFFSET, torch.randn(6, 8, 3, 3)),
            RuntimeError,
            ["in_channels / groups = 8", "4 channels of input"],
        ),
        (
            lambda: opbridge.deform_conv2d(_X.int(), _OFFSET.int(), _W.int()),
            RuntimeError,
            ["float32, float64, float16 or bfloat16"],
        ),
        (
            lambda: opbridge.deform_conv2d(_X, _OFFSET.double(), _W),
            RuntimeError,
            ["offset must have the dtype of input"],
        ),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET, _W.to("meta")), RuntimeError, ["one device", "weight on meta"]),
        (lambda: opbridge.deform_conv2d(_X, _OFFSET[:, :3], _W), RuntimeError, ["offset"]),
        (lambda: opbridge.deform_conv2d(_X[0], _OFFSET, _W), RuntimeError, ["4-D"]),
    ],
    "opbridge.nn.DeformConv2d": [
        (lambda: opbridge.nn.DeformConv2d(4, 6, 3, groups=4), ValueError, ["groups=4", "out_channels=6"]),
        (lambda: opbridge.nn.DeformConv2d(4, 6, 1.5), TypeError, ["kernel_size", "1.5"]),
        (lambda: opbridge.nn.DeformConv2d(4.0, 6, 3), TypeError, ["in_channels"]),
        (lambda: opbridge.nn.DeformConv2d(0, 6, 3), ValueError, ["in_channels must be >= 1"]),
        (lambda: opbridge.nn.DeformConv2d(4, 6, 3, stride=0), ValueError, ["stride must be >= 1"]),
        (lambda: opbridge.nn.DeformConv2d(4, 6, 3)(_X, None), TypeError, ["offset must be a tensor"]),
    ],
    "opbridge.nn.ModulatedDeformConv2dPack": [
        (
            lambda: opbridge.nn.ModulatedDeformConv2dPack(4, 6, 3, deform_groups=3),
            ValueError,
            ["deform_groups=3 must divide in_channels=4"],
        ),
        (
            lambda: opbridge.nn.ModulatedDeformConv2dPack(4, 6, 3, deform_groups=0),
            ValueError,
            ["deform_groups must be >= 1"],
        ),
        (lambda: opbridge.nn.ModulatedDeformConv2dPack(4, 6, 2.5), TypeError, ["kernel_size", "2.5"]),
        (lambda: opbridge.nn.ModulatedDeformConv2dPack(4, 6, 3)(_X[:, :2]), RuntimeError, ["4", "channels"]),
    ],
    "opbridge.nn.DeformConv2dPack": [
        (lambda: opbridge.nn.DeformConv2dPack(4, 6, 3, groups=3), ValueError, ["groups=3"]),
        (
            lambda: opbridge.nn.DeformConv2dPack(4, 6, 3, deformable_groups=8),
            ValueError,
            ["deform_groups=8 must divide in_channels=4"],
        ),
    ],
}


# --- mmcv's DCN layers: DeformConv2dPack (DCNv1) and ModulatedDeformConv2dPack (DCNv2) -----------------------------

#: the state_dict keys of mmcv's layers (mmcv/ops/deform_conv.py, modulated_deform_conv.py)
MMCV_KEYS = {"weight", "conv_offset.weight", "conv_offset.bias"}


def _mmcv_pack(cls_name, **kwargs):
    layer = getattr(opbridge.nn, cls_name)(**kwargs).double()
    with torch.no_grad():  # mmcv's init zeroes conv_offset (no deformation): draw it so the offsets matter
        generator = torch.Generator().manual_seed(4)
        for parameter in layer.conv_offset.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64) * 0.3)
    return layer


@needs_torchvision
@pytest.mark.parametrize(
    "cls_name, kwargs",
    [
        ("ModulatedDeformConv2dPack", dict(in_channels=4, out_channels=6, kernel_size=3, padding=1)),
        ("ModulatedDeformConv2dPack",
         dict(in_channels=6, out_channels=4, kernel_size=(3, 2), stride=2, padding=(1, 0), dilation=(1, 2), groups=2,
              deform_groups=3)),
        ("DeformConv2dPack", dict(in_channels=4, out_channels=6, kernel_size=3, padding=1, deform_groups=2)),
        ("DeformConv2dPack", dict(in_channels=4, out_channels=4, kernel_size=3, stride=2, groups=2, bias=True)),
    ],
)  # fmt: skip
def test_mmcv_pack_computes_mmcvs_function_with_torchvision(cls_name, kwargs):
    """mmcv's forward written out with torchvision's deform_conv2d: offsets from conv_offset (DCNv2: the first two
    thirds; the last third through a sigmoid is the mask)."""
    layer = _mmcv_pack(cls_name, **kwargs)
    x = torch.randn(2, layer.in_channels, 9, 8, dtype=torch.float64, requires_grad=True)
    maps = layer.conv_offset(x)
    if cls_name == "ModulatedDeformConv2dPack":
        first, second, mask = torch.chunk(maps, 3, dim=1)
        offset, mask = torch.cat((first, second), 1), torch.sigmoid(mask)
    else:
        offset, mask = maps, None
    want = torchvision.ops.deform_conv2d(x, offset, layer.weight, layer.bias, layer.stride, layer.padding,
                                         layer.dilation, mask)  # fmt: skip
    got = layer(x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad(got.sum(), [x, *layer.parameters()])
    want_grads = torch.autograd.grad(want.sum(), [x, *layer.parameters()])
    for a, b in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_mmcv_pack_state_dict_and_init_are_mmcvs():
    v2 = opbridge.nn.ModulatedDeformConv2dPack(4, 6, 3, padding=1, deform_groups=2)
    assert set(v2.state_dict()) == MMCV_KEYS | {"bias"}
    assert v2.conv_offset.out_channels == 2 * 3 * 9 and v2.deform_groups == 2
    v1 = opbridge.nn.DeformConv2dPack(4, 6, 3, deformable_groups=2)  # mmcv's deprecated name
    assert set(v1.state_dict()) == MMCV_KEYS and v1.bias is None and v1.conv_offset.out_channels == 2 * 2 * 9
    for layer in (v1, v2):
        assert not layer.conv_offset.weight.any() and not layer.conv_offset.bias.any()
        assert layer.weight.abs().max() <= 1 / (4 * 9) ** 0.5
    assert not v2.bias.any()
    # With conv_offset zero, DCNv2 is a regular convolution with every tap weighted by sigmoid(0) = 1/2.
    x = torch.randn(1, 4, 6, 6)
    want = torch.nn.functional.conv2d(x, v2.weight, v2.bias, padding=1) * 0.5
    torch.testing.assert_close(v2(x), want + v2.bias.view(1, -1, 1, 1) * 0.5, rtol=1e-5, atol=1e-5)


def test_mmcv_pack_loads_an_mmcv_checkpoint():
    """A parent model's checkpoint with mmcv's keys and metadata loads, strictly, into the same model built with
    opbridge's layer."""
    source = opbridge.nn.ModulatedDeformConv2dPack(4, 6, 3, padding=1)
    with torch.no_grad():
        for parameter in source.parameters():
            parameter.copy_(torch.randn(parameter.shape))
    checkpoint = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), source).state_dict()
    assert {k for k in checkpoint if k.startswith("1.")} == {f"1.{k}" for k in MMCV_KEYS | {"bias"}}
    assert checkpoint._metadata["1"]["version"] == 2  # mmcv's ModulatedDeformConv2dPack._version
    target = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), opbridge.nn.ModulatedDeformConv2dPack(4, 6, 3, padding=1))
    target.load_state_dict(checkpoint)
    for name, value in target.state_dict().items():
        assert torch.equal(value, checkpoint[name]), name
