"""opbridge's CUDA ops (cpp/cuda, libopbridge_cuda.so).

On a machine with an NVIDIA GPU and a CUDA build of torch: each CUDA op against the CPU op (float64 within 1e-10:
one arithmetic, two devices) and against an independent reference (torchvision's CUDA kernels, plain PyTorch
math), gradcheck and opcheck on CUDA, CUDA-graph capture (the ops run on torch's current stream), torch.compile of
a training step, and a Deformable-DETR encoder's training step. Everywhere: the host side (the library is built
where nvcc is, and a CPU-only torch never loads it).
"""

from __future__ import annotations

import importlib
import math
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
    # CMake's spelling: "75-real,...,90-real,...,120" (machine code only, or machine code and PTX).
    assert "90" in {architecture.split("-")[0] for architecture in BUILD_INFO.CUDA_ARCHITECTURES.split(",")}


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


def _cmake_architectures(listed: str) -> dict[str, list[int]]:
    """CMake's CUDA_ARCHITECTURES ("75-real,90": machine code; "-virtual": PTX only; plain: both) as
    cuda_architectures reports them."""
    found: dict[str, set[int]] = {"sm": set(), "ptx": set()}
    for entry in filter(None, listed.split(",")):
        number, _, kind = entry.partition("-")
        for key in {"real": ["sm"], "virtual": ["ptx"], "": ["sm", "ptx"]}[kind]:
            found[key].add(int(number))
    return {key: sorted(values) for key, values in found.items()}


@pytest.mark.skipif(not BUILD_INFO.CUDA_LIBRARY, reason="this opbridge was built without its CUDA library (no nvcc)")
def test_the_cuda_library_has_code_for_the_architectures_it_was_built_for():
    """Read from the library's fat binary (opbridge_ort.cuda_architectures), not from the build's word."""
    import opbridge_ort

    path = os.path.join(os.path.dirname(BUILD_INFO.__file__), BUILD_INFO.CUDA_LIBRARY)
    found = opbridge_ort.cuda_architectures(path)
    assert found == _cmake_architectures(BUILD_INFO.CUDA_ARCHITECTURES)
    assert found["ptx"] and max(found["ptx"]) >= max(found["sm"])  # PTX of the newest, for later GPUs
    with pytest.raises(ValueError, match="no CUDA fat binary"):
        opbridge_ort.cuda_architectures(os.path.join(os.path.dirname(BUILD_INFO.__file__), BUILD_INFO.OPS_LIBRARY))


def test_the_driver_check_follows_cudas_minor_version_compatibility():
    """A runtime of CUDA 13.x runs on any driver for CUDA 13.0 or newer, not on a CUDA 12 driver."""
    assert _extension.driver_problem("13.0", 13000) == ""
    assert _extension.driver_problem("13.0", 13020) == ""
    assert _extension.driver_problem("13.2", 13000) == ""  # minor-version compatibility
    assert _extension.driver_problem("12.8", 13000) == ""
    problem = _extension.driver_problem("13.0", 12080)
    assert "supports CUDA 12.8" in problem and "CUDA >= 13.0" in problem and "R580" in problem
    assert "docs/packaging.md" in problem
    assert _extension.driver_problem("13.0", None) == ""  # no driver: no GPU to run on, nothing to say
    assert _extension.driver_problem("", 11000) == ""  # a build that did not record its runtime


@pytest.mark.skipif(torch.version.cuda is None or not BUILD_INFO.CUDA_LIBRARY,
                    reason="needs a CUDA build of torch and an opbridge with its CUDA library")  # fmt: skip
def test_a_driver_too_old_for_the_cuda_library_gives_one_warning_and_the_cpu_ops_work(stand_in_driver):
    """Under a driver for CUDA 12.8 (a stand-in libcuda) the library built with CUDA 13 is not loaded: one
    RuntimeWarning at import, the CPU ops answer, and the ops' CUDA kernels are refusals that give the reason."""
    code = (
        "import warnings, torch\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import opbridge\n"
        "    from opbridge import _extension\n"
        "said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]\n"
        "assert len(said) == 1 and 'supports CUDA 12.8' in said[0], said\n"
        "assert _extension.cuda_library is None\n"
        "a = torch.arange(6.0).view(2, 3)\n"
        "assert torch.equal(opbridge.my_add(a, a), 3 * a)\n"
        "refusal = _extension.cuda_refusals['opbridge::ms_deform_attn']\n"
        "try:\n"
        "    refusal(a)\n"
        "except RuntimeError as error:\n"
        "    assert 'supports CUDA 12.8' in str(error) and 'R580' in str(error), error\n"
        "else:\n"
        "    raise AssertionError('no refusal')\n"
        "print('ok')\n"
    )
    runtime = BUILD_INFO.CUDA_RUNTIME if hasattr(BUILD_INFO, "CUDA_RUNTIME") else ""
    if not runtime.startswith("13."):
        pytest.skip(f"the stand-in driver says CUDA 12.8, older only than a CUDA 13 library (this one: {runtime!r})")
    env = {**os.environ, "LD_LIBRARY_PATH": stand_in_driver(12080)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
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
@pytest.mark.parametrize("locations_dtype", ["half", "float32"])
@pytest.mark.parametrize("config", MSDA_CONFIGS, ids=lambda c: f"D{c['channels']}-LP{len(c['levels']) * c['points']}")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_ms_deform_attn_half_backward_is_the_float32_backward_rounded_once(config, dtype, locations_dtype):
    """The CUDA backward reads half grad_output and value as stored (vector loads where D allows, float32 arithmetic
    and gradient buffers): its gradients are the float32 backward's on the widened values, each rounded once to its
    input's dtype (up to the float32 sums' order: one unit in the last place), with locations and weights in half or,
    as autocast gives them, in float32."""
    value, shapes, starts, locations, weights = _msda_on(CUDA, torch.float64, **config)
    precise = dtype if locations_dtype == "half" else torch.float32
    half = [value.to(dtype), locations.to(precise), weights.to(precise)]
    grad = torch.randn(value.shape[0], locations.shape[1], value.shape[2] * value.shape[3], device=CUDA).to(dtype)
    leaves = [t.detach().requires_grad_() for t in half]
    out = opbridge.ms_deform_attn(leaves[0], shapes, starts, leaves[1], leaves[2])
    got = torch.autograd.grad(out, leaves, grad)
    wide = [t.detach().float().requires_grad_() for t in half]
    wide_out = opbridge.ms_deform_attn(wide[0], shapes, starts, wide[1], wide[2])
    want = torch.autograd.grad(wide_out, wide, grad.float())
    for name, g, w, leaf in zip(("value", "locations", "weights"), got, want, leaves, strict=True):
        assert g.dtype == leaf.dtype and g.shape == leaf.shape, name
        rounded = w.to(g.dtype)
        # One unit in the last place of the rounded value (float32 sums in another order), or an absolute floor for
        # values near 0 (where cancellation leaves float32 noise).
        ulp = torch.finfo(g.dtype).eps * rounded.float().abs() + 1e-3 * w.abs().max()
        assert bool(((g.float() - rounded.float()).abs() <= ulp).all()), name


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


# --- the rotated-detection ops ----------------------------------------------------------------------------------------


def test_every_op_has_a_cuda_kernel_or_a_refusal_that_says_what_to_do():
    """Under a CUDA torch every opbridge op answers CUDA tensors: with the CUDA library's kernel, or (an op it lacks,
    or no CUDA library) with a RuntimeError naming the op, the device and the way out, not the dispatcher's
    "Could not run ... with arguments from the 'CUDA' backend"."""
    if torch.version.cuda is None:
        pytest.skip("a CPU-only torch cannot make CUDA tensors: there is no CUDA dispatch to fill")
    names = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("opbridge::"))
    assert "opbridge::nms_rotated" in names and "opbridge::roi_align_rotated_backward" in names
    for name in names:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA"), name
    if _extension.cuda_library is not None:  # the library covers every op: nothing is left to a refusal
        assert [n for n in _extension.cuda_refusals if n.startswith("opbridge::")] == []


def test_a_refusal_names_the_op_the_device_and_the_way_out():
    if torch.version.cuda is None:
        pytest.skip("a CPU-only torch has no CUDA dispatch key to register a refusal under")
    library = torch.library.Library("opbridge_refusal_test", "DEF")
    library.define("twice(Tensor x) -> Tensor")
    library.impl("twice", lambda x: 2 * x, "CPU")
    covered = _extension.refuse_cuda("opbridge_refusal_test", "no kernel for this test")
    assert covered == ["opbridge_refusal_test::twice"]
    assert torch._C._dispatch_has_kernel_for_dispatch_key("opbridge_refusal_test::twice", "CUDA")
    assert torch.equal(torch.ops.opbridge_refusal_test.twice(torch.ones(2)), torch.full((2,), 2.0))
    with pytest.raises(RuntimeError, match=r"opbridge_refusal_test::twice cannot run on CUDA.*no kernel for this test"
                       r".*tensor\.cpu\(\)"):  # fmt: skip
        _extension.cuda_refusals["opbridge_refusal_test::twice"](torch.ones(2))
    assert _extension.refuse_cuda("opbridge_refusal_test", "again") == []  # covered once


def _rotated_boxes(generator, count, dtype, spread=20.0):
    """Clustered boxes (many overlaps), angles over two turns."""
    centers = torch.rand(max(count // 4, 1), 2, generator=generator, dtype=torch.float64) * spread
    member = torch.arange(count) % centers.shape[0]
    boxes = torch.cat(
        [
            centers[member] + torch.randn(count, 2, generator=generator, dtype=torch.float64),
            torch.rand(count, 2, generator=generator, dtype=torch.float64) * 6 + 0.5,
            (torch.rand(count, 1, generator=generator, dtype=torch.float64) - 0.5) * 4 * math.pi,
        ],
        1,
    )
    return boxes.to(dtype)


_ROTATED_TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _same(actual, expected, dtype):
    """The devices run the same double-precision functions; their libms may differ in the last bits."""
    assert actual.device.type == "cuda" and actual.dtype == expected.dtype
    tolerance = _ROTATED_TOLERANCE[dtype]
    torch.testing.assert_close(actual.cpu(), expected, rtol=tolerance, atol=tolerance, equal_nan=True)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("aligned", [False, True], ids=["pairwise", "aligned"])
def test_box_iou_rotated_matches_the_cpu_op(dtype, aligned):
    generator = torch.Generator().manual_seed(1)
    a = _rotated_boxes(generator, 70, torch.float64)
    b = a[torch.randperm(70, generator=generator)] if aligned else _rotated_boxes(generator, 45, torch.float64)
    # Degenerate rows: an identical box, a zero-size box, a NaN.
    b[0] = a[0]
    a[1, 2] = 0.0
    a[2, 0] = float("nan")
    a, b = a.to(dtype), b.to(dtype)
    for mode in ("iou", "iof"):
        for clockwise in (True, False):
            expected = opbridge.box_iou_rotated(a, b, mode, aligned, clockwise)
            _same(opbridge.box_iou_rotated(a.to(CUDA), b.to(CUDA), mode, aligned, clockwise), expected, dtype)
    if not aligned:
        assert opbridge.box_iou_rotated(a[:0].to(CUDA), b.to(CUDA)).shape == (0, b.shape[0])


@needs_gpu
@pytest.mark.parametrize("count", [1, 63, 64, 65, 300, 1000])
@pytest.mark.parametrize("operands", ["plain", "labels", "counter_clockwise"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
def test_nms_rotated_keeps_what_the_cpu_op_keeps(count, operands, dtype):
    generator = torch.Generator().manual_seed(count)
    boxes = _rotated_boxes(generator, count, torch.float64, spread=4.0 * count**0.5).to(dtype)
    scores = torch.rand(count, generator=generator, dtype=torch.float64).round(decimals=1).to(dtype)  # many ties
    if count > 5:
        scores[3], scores[4], scores[5] = float("nan"), 0.0, -0.0  # NaN first; -0 ties +0
    labels = torch.randint(0, 3, (count,), generator=generator) if operands == "labels" else None
    clockwise = operands != "counter_clockwise"
    for threshold in (0.1, 0.5):
        _, expected = opbridge.nms_rotated(boxes, scores, threshold, labels, clockwise)
        dets, keep = opbridge.nms_rotated(
            boxes.to(CUDA), scores.to(CUDA), threshold, None if labels is None else labels.to(CUDA), clockwise
        )
        assert keep.device.type == "cuda" and keep.dtype == torch.int64
        assert keep.cpu().tolist() == expected.tolist()
        assert dets.shape == (len(expected), 6)
    assert opbridge.nms_rotated(boxes[:0].to(CUDA), scores[:0].to(CUDA), 0.5)[1].shape == (0,)


def _forward_and_backward_match(op, features, geometry, generator):
    """op(features, geometry) on CUDA against the CPU op: the output, and the features' gradient of a random
    output gradient (a sum over the samples that read each pixel: the GPU adds it in another order)."""
    dtype = features.dtype
    x_cpu, x_gpu = features.clone().requires_grad_(), features.to(CUDA).requires_grad_()
    out_cpu, out_gpu = op(x_cpu, geometry), op(x_gpu, geometry.to(CUDA))
    tolerance = _ROTATED_TOLERANCE[dtype] * 4
    torch.testing.assert_close(out_gpu.detach().cpu(), out_cpu.detach(), rtol=tolerance, atol=tolerance, equal_nan=True)
    grad = torch.randn(out_cpu.shape, generator=generator, dtype=torch.float64).to(dtype)
    (grad_cpu,) = torch.autograd.grad(out_cpu, x_cpu, grad)
    (grad_gpu,) = torch.autograd.grad(out_gpu, x_gpu, grad.to(CUDA))
    torch.testing.assert_close(grad_gpu.cpu(), grad_cpu, rtol=tolerance, atol=tolerance)


def _roi_inputs(generator, dtype, batch=2, channels=5, height=9, width=11, count=13):
    features = torch.randn(batch, channels, height, width, generator=generator, dtype=torch.float64)
    rois = torch.cat(
        [
            torch.randint(0, batch, (count, 1), generator=generator).to(torch.float64),
            torch.rand(count, 1, generator=generator, dtype=torch.float64) * (width + 4) - 2,
            torch.rand(count, 1, generator=generator, dtype=torch.float64) * (height + 4) - 2,
            torch.rand(count, 2, generator=generator, dtype=torch.float64) * 12 + 0.2,
            (torch.rand(count, 1, generator=generator, dtype=torch.float64) - 0.5) * 4 * math.pi,
        ],
        1,
    )
    return features.to(dtype), rois.to(dtype)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
@pytest.mark.parametrize(("ratio", "aligned", "clockwise"), [(2, True, False), (0, True, True), (0, False, False)])
def test_roi_align_rotated_forward_and_backward_match_the_cpu_op(dtype, ratio, aligned, clockwise):
    generator = torch.Generator().manual_seed(2)
    features, rois = _roi_inputs(generator, dtype)
    rois[4, 3] = float("nan")  # a NaN roi: NaN output, no gradient
    args = dict(output_size=(3, 2), spatial_scale=0.75, sampling_ratio=ratio, aligned=aligned, clockwise=clockwise)
    _forward_and_backward_match(lambda x, r: opbridge.roi_align_rotated(x, r, **args), features, rois, generator)
    # rois beside float16 features may stay float32 (the precise input)
    if dtype == torch.float16:
        mixed = opbridge.roi_align_rotated(features.to(CUDA), rois.float().to(CUDA), **args)
        assert mixed.dtype == torch.float16


@needs_gpu
def test_roi_align_rotated_checks_rois_on_cuda():
    generator = torch.Generator().manual_seed(3)
    features, rois = _roi_inputs(generator, torch.float32)
    rois[2, 0] = 5  # batch 2: no image 5
    with pytest.raises(RuntimeError, match=r"rois\[2, 0\] \(the batch index\) must be an integer in \[0, 2\)"):
        opbridge.roi_align_rotated(features.to(CUDA), rois.to(CUDA), 2)
    with pytest.raises(RuntimeError, match="one device"):
        opbridge.roi_align_rotated(features.to(CUDA), rois, 2)
    assert opbridge.roi_align_rotated(features.to(CUDA), rois[:0].to(CUDA), 2).shape == (0, 5, 2, 2)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
@pytest.mark.parametrize("points", [1, 5])
def test_rotated_feature_align_forward_and_backward_match_the_cpu_op(dtype, points):
    generator = torch.Generator().manual_seed(4)
    n, c, h, w = 2, 4, 7, 9
    features = torch.randn(n, c, h, w, generator=generator, dtype=torch.float64).to(dtype)
    boxes = torch.cat(
        [
            torch.rand(n, h, w, 2, generator=generator, dtype=torch.float64) * 80 - 8,
            torch.rand(n, h, w, 2, generator=generator, dtype=torch.float64) * 40,
            (torch.rand(n, h, w, 1, generator=generator, dtype=torch.float64) - 0.5) * 6,
        ],
        3,
    ).to(dtype)
    boxes[1, 2, 3, 1] = float("inf")
    _forward_and_backward_match(
        lambda x, b: opbridge.rotated_feature_align(x, b, 1 / 8, points), features, boxes, generator
    )


@needs_gpu
def test_rotated_ops_gradcheck_opcheck_and_determinism_on_cuda():
    generator = torch.Generator().manual_seed(5)
    features, rois = _roi_inputs(generator, torch.float64, batch=1, channels=2, height=5, width=6, count=3)
    x = features.to(CUDA).requires_grad_()
    roi_args = (rois.to(CUDA), 2, 2, 1.0, 2, True, False)
    torch.autograd.gradcheck(lambda t: torch.ops.opbridge.roi_align_rotated(t, *roi_args), (x,))
    torch.library.opcheck(torch.ops.opbridge.roi_align_rotated, (x, *roi_args))
    boxes = torch.rand(1, 5, 6, 5, generator=generator, dtype=torch.float64).to(CUDA) * 30
    torch.autograd.gradcheck(lambda t: opbridge.rotated_feature_align(t, boxes, 1 / 8, 5), (x,))
    torch.library.opcheck(torch.ops.opbridge.rotated_feature_align, (x, boxes, 0.125, 5))
    previous = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="atomic"):
            opbridge.roi_align_rotated(x, rois.to(CUDA), 2).sum().backward()
        with pytest.raises(RuntimeError, match="atomic"):
            opbridge.rotated_feature_align(x, boxes).sum().backward()
    finally:
        torch.use_deterministic_algorithms(previous)


@needs_gpu
def test_patch_model_serves_a_transformers_model_on_cuda(monkeypatch):
    """patch_model on a CUDA model: the op runs on the GPU, forward and gradients as the library's own code."""
    pytest.importorskip("transformers")
    from opbridge.ops import ms_deform_attn as msda_module
    from test_integrations import _build, _check_patched_matches_the_library

    calls = []
    original = msda_module.ms_deform_attn

    def counting(*args):
        calls.append(args[0].device)
        return original(*args)

    monkeypatch.setattr(msda_module, "ms_deform_attn", counting)
    model, pixels = _build("DeformableDetrModel")
    _check_patched_matches_the_library("DeformableDetrModel", model.to(CUDA), pixels.to(CUDA), calls)
    assert calls and all(device.type == "cuda" for device in calls)
