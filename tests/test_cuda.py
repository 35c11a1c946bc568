"""opbridge's CUDA ops (cpp/cuda, libopbridge_cuda.so).

On a machine with an NVIDIA GPU and a CUDA build of torch: each CUDA op against the CPU op (float64 within 1e-10:
one arithmetic, two devices) and against an independent reference (torchvision's CUDA kernels, plain PyTorch
math), gradcheck and opcheck on CUDA, CUDA-graph capture (the ops run on torch's current stream), torch.compile of
a training step, and a Deformable-DETR encoder's training step. Everywhere: the host side (the library is built
where nvcc is, and a CPU-only torch never loads it).
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys

import pytest
import torch

import opbridge
from opbridge import _extension
from opbridge.ops.ms_deform_attn import reference as msda_reference
from opbridge.ops.ms_deform_attn import sample_inputs as msda_inputs

BUILD_INFO = importlib.import_module("opbridge._build_info")
HAS_GPU = torch.cuda.is_available() and _extension.cuda_library is not None
needs_gpu = pytest.mark.skipif(
    not HAS_GPU, reason="needs an NVIDIA GPU, a CUDA build of torch and opbridge's CUDA library"
)
CUDA = torch.device("cuda")


# --- host side: every machine ---------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) where opbridge was built")
def test_the_cuda_library_is_built_where_nvcc_is():
    if BUILD_INFO.TORCH_ABI != "stable":
        pytest.skip("the CUDA ops are built on the stable-ABI torch layer only (torch >= 2.10)")
    assert BUILD_INFO.CUDA_LIBRARY == "libopbridge_cuda.so"
    assert os.path.isfile(os.path.join(os.path.dirname(BUILD_INFO.__file__), BUILD_INFO.CUDA_LIBRARY))
    assert "90" in BUILD_INFO.CUDA_ARCHITECTURES.split(",")


def test_the_cuda_library_is_loaded_only_under_a_cuda_torch():
    if torch.version.cuda is None or not BUILD_INFO.CUDA_LIBRARY:
        assert _extension.cuda_library is None
    else:
        assert _extension.cuda_library is not None and os.path.isfile(_extension.cuda_library)


@pytest.mark.skipif(not BUILD_INFO.CUDA_LIBRARY, reason="this opbridge was built without its CUDA library (no nvcc)")
def test_the_cuda_library_loads_into_any_torch_and_leaves_the_cpu_ops_alone():
    """Loaded by hand into this process's torch (CPU-only in CI): no driver is needed to load it (static CUDA
    runtime, the CUDA shim of torch looked up only when a CUDA op runs), and the CPU kernels still answer."""
    path = os.path.join(os.path.dirname(BUILD_INFO.__file__), BUILD_INFO.CUDA_LIBRARY)
    code = (
        "import torch, opbridge\n"
        f"torch.ops.load_library({path!r})\n"
        "a = torch.arange(6.0).view(2, 3)\n"
        "assert torch.equal(opbridge.my_add(a, a), 3 * a)\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


# --- on the GPU -----------------------------------------------------------------------------------------------------


def _close(actual, expected, dtype, terms: int = 32):
    """Within rounding of sums of up to `terms` products (the devices sum in different orders: the GPU's lanes
    and warp shuffles, the CPU's vector widths)."""
    tolerance = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3}[dtype] * max(1, terms // 32)
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=tolerance, atol=tolerance)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize(
    "shapes", [((5, 7), (5, 7)), ((4, 1, 3), (5, 3)), ((), (3, 2)), ((2, 3, 4, 5), (1, 3, 1, 5))], ids=str
)
def test_my_add_matches_the_cpu_op_and_torch(dtype, shapes):
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(s, generator=generator, dtype=torch.float64).to(dtype) for s in shapes)
    out = opbridge.my_add(a.to(CUDA), b.to(CUDA))
    assert out.device.type == "cuda" and out.dtype == dtype
    # 2 * a is exact, so one rounding on either device: the same bits as the CPU kernel.
    assert torch.equal(out.cpu(), opbridge.my_add(a, b))
    torch.testing.assert_close(out.cpu(), (2 * a.double() + b.double()).to(dtype))


@needs_gpu
def test_my_add_reads_strided_and_broadcast_inputs_in_place():
    a = torch.randn(6, 8, device=CUDA, dtype=torch.float64)
    b = torch.randn(8, 6, device=CUDA, dtype=torch.float64)
    for x, y in ((a[:, ::2], b.t()[::1, ::2]), (a.t(), b), (a[::2], b[:, 0])):
        assert torch.equal(opbridge.my_add(x, y), 2 * x + y)


def _msda_on(device, dtype, **kwargs):
    value, shapes, starts, locations, weights = msda_inputs(torch.float64, **kwargs)
    return tuple(t.to(device, dtype if t.is_floating_point() else t.dtype) for t in (value, shapes, starts, locations,
                                                                                     weights))  # fmt: skip


MSDA_CONFIGS = [
    dict(batch=2, levels=((6, 8), (3, 4), (2, 2), (1, 1)), queries=11, heads=2, channels=32, points=3),
    dict(batch=1, levels=((5, 7), (3, 3)), queries=9, heads=3, channels=16, points=2),  # 16 lanes a row
    dict(batch=2, levels=((4, 6), (2, 3)), queries=5, heads=2, channels=48, points=4),  # 2 channels a lane
    dict(batch=1, levels=((4, 5),), queries=7, heads=1, channels=100, points=2),  # 4 channels a lane, a tail
    dict(batch=1, levels=((3, 3), (2, 2)), queries=6, heads=2, channels=3, points=2),  # a few lanes, shared warps
    # 36 samples a row over 32 lanes (a partial second round of samples), 64 vectors a row (two passes of the lanes)
    dict(batch=1, levels=((5, 6), (3, 3), (2, 2), (1, 2)), queries=40, heads=2, channels=256, points=9),
]


@needs_gpu
@pytest.mark.parametrize("table", ["cuda", "cpu"], ids=lambda d: f"table-on-{d}")
@pytest.mark.parametrize("config", MSDA_CONFIGS, ids=lambda c: f"D{c['channels']}-LP{len(c['levels']) * c['points']}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ms_deform_attn_forward_and_backward_match_the_cpu_op(config, dtype, table):
    """The level table on the GPU (read and checked by the kernels) or on the CPU (checked on the host and passed
    by value, as the ORT CUDA node does): the same results as the CPU op."""
    cpu = [t.requires_grad_(t.is_floating_point()) for t in _msda_on("cpu", dtype, **config)]
    gpu = [t.detach().to(CUDA if t.is_floating_point() else table).requires_grad_(t.is_floating_point()) for t in cpu]
    out_cpu, out_gpu = opbridge.ms_deform_attn(*cpu), opbridge.ms_deform_attn(*gpu)
    _close(out_gpu, out_cpu, dtype)
    _close(out_gpu, msda_reference(*cpu), dtype)
    grad = torch.randn_like(out_cpu)
    grads_cpu = torch.autograd.grad(out_cpu, [cpu[0], cpu[3], cpu[4]], grad)
    grads_gpu = torch.autograd.grad(out_gpu, [gpu[0], gpu[3], gpu[4]], grad.to(CUDA))
    for actual, expected in zip(grads_gpu, grads_cpu, strict=True):
        _close(actual, expected, dtype, terms=config["channels"])  # a location's gradient sums a row of D


@needs_gpu
def test_ms_deform_attn_samples_far_outside_or_nan_give_zeros():
    value, shapes, starts, locations, weights = _msda_on(CUDA, torch.float64, batch=1, levels=((4, 4),), queries=4,
                                                         heads=1, channels=8, points=1)  # fmt: skip
    locations[0, 0] = 5.0
    locations[0, 1] = -3.0
    locations[0, 2] = float("nan")
    out = opbridge.ms_deform_attn(value, shapes, starts, locations, weights)
    assert torch.equal(out[0, :3], torch.zeros_like(out[0, :3]))
    assert out[0, 3].abs().sum() > 0


@needs_gpu
def test_ms_deform_attn_gradcheck_and_opcheck_on_cuda():
    inputs = _msda_on(CUDA, torch.float64, batch=1, levels=((3, 4), (2, 2)), queries=3, heads=2, channels=5, points=2)
    value, shapes, starts, locations, weights = inputs
    leaves = [value.requires_grad_(), shapes, starts, locations.requires_grad_(), weights.requires_grad_()]
    assert torch.autograd.gradcheck(opbridge.ms_deform_attn, leaves, eps=1e-6, atol=1e-5)
    torch.library.opcheck(torch.ops.opbridge.ms_deform_attn.default, tuple(leaves))


@needs_gpu
def test_ms_deform_attn_level_table_is_checked_on_cuda():
    """A level table on the CPU is checked before the kernels run (a RuntimeError naming the numbers); mixed
    devices are refused."""
    value, shapes, starts, locations, weights = _msda_on(CUDA, torch.float32, batch=1, levels=((3, 4), (2, 2)),
                                                         queries=3, heads=1, channels=4, points=1)  # fmt: skip
    with pytest.raises(RuntimeError, match="level_start_index"):
        opbridge.ms_deform_attn(value, shapes.cpu(), starts.cpu() + 1, locations, weights)
    with pytest.raises(RuntimeError, match="cover 20 keys"):
        opbridge.ms_deform_attn(value, (shapes + 1).cpu(), torch.tensor([0, 20]), locations, weights)
    with pytest.raises(RuntimeError, match="device"):
        opbridge.ms_deform_attn(value, shapes, starts, locations.cpu(), weights)
    with pytest.raises(RuntimeError, match="both on the CPU"):
        opbridge.ms_deform_attn(value, shapes.cpu(), starts, locations, weights)


_BAD_TABLE = """
import ctypes, os, sys, torch, opbridge
from opbridge.ops.ms_deform_attn import sample_inputs
value, shapes, starts, locations, weights = (t.cuda() for t in sample_inputs(torch.float32, 1, ((3, 4), (2, 2)), 3, 1,
                                                                              4, 1))
opbridge.ms_deform_attn(value, shapes, starts, locations, weights)
torch.cuda.synchronize()
print("good table ran", flush=True)
bad = {"starts": (shapes, starts + 1), "areas": (shapes + 1, starts), "negative": (-shapes, starts)}[sys.argv[1]]
try:
    opbridge.ms_deform_attn(value, *bad, locations, weights)
    torch.cuda.synchronize()
except RuntimeError as error:
    print("raised:", error, flush=True)
    ctypes.CDLL(None).fflush(None)  # the device's assertion message, printed through C's stdout
    os._exit(3)  # no interpreter teardown on a CUDA context the assertion ended
print("no error", flush=True)
"""


@needs_gpu
@pytest.mark.parametrize("fault", ["starts", "areas", "negative"])
def test_ms_deform_attn_level_table_on_the_gpu_is_checked_by_the_kernel(fault):
    """A level table in GPU memory is not copied to the host: a bad one stops the kernel with a device-side
    assertion that names the op (in a process of its own: such an error ends the process's CUDA context)."""
    result = subprocess.run([sys.executable, "-c", _BAD_TABLE, fault], capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert "good table ran" in result.stdout, output
    assert result.returncode == 3 and "raised:" in result.stdout, output
    assert "device-side assert" in result.stdout, output
    assert "opbridge::ms_deform_attn: spatial_shapes" in output, output


def _deform_inputs(device, dtype, batch=2, channels=6, size=(9, 11), out_channels=4, kernel=(3, 3), groups=1,
                   offset_groups=2, stride=(1, 2), padding=(1, 1), dilation=(1, 1), mask=True, bias=True,
                   offset_scale=2.0):  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    kh, kw = kernel
    out_h = (size[0] + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    out_w = (size[1] + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1

    def rand(*shape, scale=1.0):
        return (torch.randn(shape, generator=generator, dtype=torch.float64) * scale).to(device, dtype)

    args = dict(
        input=rand(batch, channels, *size),
        offset=rand(batch, 2 * offset_groups * kh * kw, out_h, out_w, scale=offset_scale),
        weight=rand(out_channels, channels // groups, kh, kw),
        bias=rand(out_channels) if bias else None,
        mask=torch.rand(batch, offset_groups * kh * kw, out_h, out_w, generator=generator, dtype=torch.float64).to(
            device, dtype
        )
        if mask
        else None,
    )
    return args, dict(stride=stride, padding=padding, dilation=dilation)


DEFORM_CONFIGS = [
    dict(),
    dict(groups=2, offset_groups=3, mask=False, bias=False),
    dict(batch=1, channels=4, size=(7, 6), kernel=(2, 3), stride=(2, 1), padding=(0, 2), dilation=(2, 1)),
    # several tiles of 16 x 16 output pixels for the input gradient, partial ones at the edges, and offsets large
    # enough that many corners fall outside a tile's window
    dict(batch=2, channels=3, size=(40, 37), out_channels=2, offset_groups=1, stride=(1, 1), offset_scale=6.0),
    # a window over 32 KB in float64 (the untiled input gradient), not in float32
    dict(
        batch=1,
        channels=2,
        size=(170, 9),
        out_channels=2,
        offset_groups=1,
        stride=(1, 1),
        padding=(0, 1),
        dilation=(80, 1),
    ),
]


def _deform_grads(args, geometry, grad):
    leaves = {k: v.detach().requires_grad_() for k, v in args.items() if v is not None}
    out = opbridge.deform_conv2d(leaves["input"], leaves["offset"], leaves["weight"], leaves.get("bias"),
                                 mask=leaves.get("mask"), **geometry)  # fmt: skip
    names = sorted(leaves)
    return out, dict(zip(names, torch.autograd.grad(out, [leaves[n] for n in names], grad), strict=True))


@needs_gpu
@pytest.mark.parametrize("config", DEFORM_CONFIGS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_deform_conv2d_forward_and_backward_match_the_cpu_op_and_torchvision(config, dtype):
    torchvision = pytest.importorskip("torchvision")
    cpu_args, geometry = _deform_inputs("cpu", dtype, **config)
    gpu_args = {k: v.to(CUDA) if v is not None else None for k, v in cpu_args.items()}
    out_cpu = opbridge.deform_conv2d(**cpu_args, **geometry)
    grad = torch.randn_like(out_cpu)
    out_gpu, grads_gpu = _deform_grads(gpu_args, geometry, grad.to(CUDA))
    _, grads_cpu = _deform_grads(cpu_args, geometry, grad)
    _close(out_gpu, out_cpu, dtype)
    for name in grads_cpu:
        _close(grads_gpu[name], grads_cpu[name], dtype)
    # torchvision's CUDA kernels: an independent implementation of the same definition.
    leaves = {k: v.detach().requires_grad_() for k, v in gpu_args.items() if v is not None}
    expected = torchvision.ops.deform_conv2d(leaves["input"], leaves["offset"], leaves["weight"], leaves.get("bias"),
                                             mask=leaves.get("mask"), **geometry)  # fmt: skip
    names = sorted(leaves)
    expected_grads = dict(
        zip(names, torch.autograd.grad(expected, [leaves[n] for n in names], grad.to(CUDA)), strict=True)
    )
    tolerance = 1e-9 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(out_gpu, expected, rtol=tolerance, atol=tolerance)
    for name in names:
        torch.testing.assert_close(grads_gpu[name], expected_grads[name], rtol=tolerance, atol=tolerance)


@needs_gpu
def test_deform_conv2d_in_chunks_of_images_matches_the_cpu_op():
    """Columns over 256 MB: the CUDA op samples and multiplies a few images at a time."""
    cpu_args, geometry = _deform_inputs("cpu", torch.float64, batch=5, channels=64, size=(128, 128), out_channels=8,
                                        stride=(1, 1), offset_groups=1)  # fmt: skip
    gpu_args = {k: v.to(CUDA) for k, v in cpu_args.items()}
    out_cpu = opbridge.deform_conv2d(**cpu_args, **geometry)
    grad = torch.randn_like(out_cpu)
    out_gpu, grads_gpu = _deform_grads(gpu_args, geometry, grad.to(CUDA))
    _, grads_cpu = _deform_grads(cpu_args, geometry, grad)
    _close(out_gpu, out_cpu, torch.float64)
    for name in grads_cpu:
        _close(grads_gpu[name], grads_cpu[name], torch.float64)


@needs_gpu
def test_deform_conv2d_gradcheck_and_opcheck_on_cuda():
    args, geometry = _deform_inputs(CUDA, torch.float64, batch=1, channels=2, size=(4, 5), out_channels=2,
                                    offset_groups=1)  # fmt: skip
    names = ["input", "offset", "weight", "bias", "mask"]
    leaves = [args[n].requires_grad_() for n in names]

    def call(input, offset, weight, bias, mask):
        return opbridge.deform_conv2d(input, offset, weight, bias, mask=mask, **geometry)

    assert torch.autograd.gradcheck(call, leaves, eps=1e-6, atol=1e-5)
    torch.library.opcheck(
        torch.ops.opbridge.deform_conv2d.default,
        (
            leaves[0],
            leaves[1],
            leaves[2],
            leaves[3],
            geometry["stride"],
            geometry["padding"],
            geometry["dilation"],
            leaves[4],
        ),
    )


@needs_gpu
def test_deform_conv2d_mixed_devices_fail_clearly():
    args, geometry = _deform_inputs(CUDA, torch.float32)
    args["weight"] = args["weight"].cpu()
    with pytest.raises(RuntimeError, match="weight must be on the device of input"):
        opbridge.deform_conv2d(**args, **geometry)


@needs_gpu
def test_the_ops_run_on_torchs_current_stream():
    """A CUDA graph captures only work on the capturing stream: a kernel on any other stream fails the capture."""
    a = torch.randn(1000, device=CUDA)
    args, geometry = _deform_inputs(CUDA, torch.float32)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on the side stream, as CUDA graphs require
        opbridge.my_add(a, a), opbridge.deform_conv2d(**args, **geometry)
    torch.cuda.current_stream().wait_stream(stream)
    msda = _msda_on(CUDA, torch.float32, **MSDA_CONFIGS[0])  # the level table on the GPU: no copy to the host
    with torch.cuda.stream(stream):  # warm-up on the side stream, as CUDA graphs require
        opbridge.ms_deform_attn(*msda)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        added = opbridge.my_add(a, a)
        convolved = opbridge.deform_conv2d(**args, **geometry)
        attended = opbridge.ms_deform_attn(*msda)
    a.copy_(torch.randn(1000, device=CUDA))
    msda[0].copy_(torch.randn_like(msda[0]))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(added, 3 * a)
    _close(convolved, opbridge.deform_conv2d(**args, **geometry), torch.float32)
    _close(attended, msda_reference(*msda), torch.float32)


@needs_gpu
def test_cuda_backward_follows_torchs_deterministic_setting():
    args, geometry = _deform_inputs(CUDA, torch.float32)
    leaves = {k: v.requires_grad_() for k, v in args.items()}
    previous = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="atomic"):
            opbridge.deform_conv2d(**leaves, **geometry).sum().backward()
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="atomic"):
            opbridge.deform_conv2d(**leaves, **geometry).sum().backward()
    finally:
        torch.use_deterministic_algorithms(previous)


class _Block(torch.nn.Module):
    """A DCNv2 layer and an MSDA layer in one trainable block."""

    def __init__(self) -> None:
        super().__init__()
        self.dcn = opbridge.nn.DeformConv2d(8, 8, 3, padding=1)
        self.offsets = torch.nn.Conv2d(8, 27, 3, padding=1)
        self.attention = opbridge.nn.MultiScaleDeformableAttention(8, 2, 1, 2)

    def forward(self, x):
        offsets = self.offsets(x)
        y = self.dcn(x, offsets[:, :18], torch.sigmoid(offsets[:, 18:]))
        n, _c, h, w = y.shape
        tokens = y.flatten(2).transpose(1, 2)
        shapes = torch.tensor([[h, w]], device=x.device)
        starts = torch.zeros(1, dtype=torch.int64, device=x.device)
        ones = torch.ones(n, h, w, device=x.device)
        ref = torch.stack([(ones.cumsum(2) - 0.5).flatten(1) / w, (ones.cumsum(1) - 0.5).flatten(1) / h], -1)
        return self.attention(tokens, ref[:, :, None], tokens, shapes, starts).sum(-1)


@needs_gpu
@pytest.mark.filterwarnings("ignore::UserWarning")  # inductor's advice (TF32, online softmax) is no failure
def test_torch_compile_of_a_training_step_on_cuda():
    torch.manual_seed(0)
    model = _Block().to(CUDA)
    with torch.no_grad():  # off the initial grid of offsets, whose samples sit on cell borders (kinks of bilinear)
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    x = torch.randn(2, 8, 10, 12, device=CUDA)

    def step(module):
        module.zero_grad()
        loss = module(x).square().mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in module.parameters()]

    eager_loss, eager_grads = step(model)
    compiled_loss, compiled_grads = step(torch.compile(model, fullgraph=True))
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-4, atol=1e-5)
    for actual, expected in zip(compiled_grads, eager_grads, strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-3, atol=1e-5)


@needs_gpu
def test_a_detr_encoder_trains_on_cuda_as_on_the_cpu():
    from detr_encoder import Encoder, features

    torch.manual_seed(0)
    cpu_model = Encoder(d_model=64, heads=4, levels=3, points=2, layers=2, ffn=128).double()
    gpu_model = Encoder(d_model=64, heads=4, levels=3, points=2, layers=2, ffn=128).double().to(CUDA)
    gpu_model.load_state_dict(cpu_model.state_dict())
    maps = features(2, [(12, 16), (6, 8), (3, 4)], 64, dtype=torch.float64)
    target = torch.randn(2, sum(h * w for h, w in [(12, 16), (6, 8), (3, 4)]), 64, dtype=torch.float64)
    losses = {}
    for name, model, device in (("cpu", cpu_model, "cpu"), ("cuda", gpu_model, CUDA)):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        losses[name] = []
        for _ in range(3):
            optimizer.zero_grad()
            loss = (model(*(m.to(device) for m in maps)) - target.to(device)).square().mean()
            loss.backward()
            optimizer.step()
            losses[name].append(loss.item())
    assert losses["cuda"][-1] < losses["cuda"][0]
    torch.testing.assert_close(torch.tensor(losses["cuda"]), torch.tensor(losses["cpu"]), rtol=1e-9, atol=1e-12)
    for (name, p_cpu), p_gpu in zip(cpu_model.named_parameters(), gpu_model.parameters(), strict=True):
        torch.testing.assert_close(p_gpu.cpu(), p_cpu, rtol=1e-8, atol=1e-10, msg=name)
