"""opbridge's ORT CUDA library (cpp/ort/cuda, libopbridge_ort_cuda.so): the same nodes for ONNX Runtime's CUDA
execution provider.

On a machine with an NVIDIA GPU and onnxruntime-gpu: each node placed on the CUDA execution provider (the session
refuses CPU fallback, so a node that found no CUDA kernel fails the test) against an independent reference (numpy,
torchvision's deform_conv2d, the grid_sample reference of MSDA, in float64) and against the CPU library's node
(float64 within 1e-10: one arithmetic, two devices), mmcv/mmdeploy node names included, and bad input answered by
an error status. Everywhere: the host side (the library is built where nvcc is and exports one function; an ORT
without the CUDA execution provider never loads it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

import opbridge_ort  # noqa: E402
from opbridge.ops.ms_deform_attn import reference as msda_reference  # noqa: E402
from opbridge.ops.ms_deform_attn import sample_inputs as msda_inputs  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # ort_cases/: the CPU nodes' cases and numpy references


def _library_dir():
    try:
        return os.path.dirname(opbridge_ort.library_path())
    except FileNotFoundError:
        return None


CUDA_LIBRARY = os.path.join(_library_dir() or "", "libopbridge_ort_cuda.so")
HAS_CUDA_EP = (
    "CUDAExecutionProvider" in ort.get_available_providers()
    and torch.cuda.is_available()
    and os.path.isfile(CUDA_LIBRARY)
)
needs_cuda_ep = pytest.mark.skipif(
    not HAS_CUDA_EP, reason="needs an NVIDIA GPU, onnxruntime-gpu and opbridge's ORT CUDA library"
)
ELEMENT = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.float16: TensorProto.FLOAT16}


# --- host side: every machine ---------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) where opbridge_ort was built")
def test_the_ort_cuda_library_is_built_where_nvcc_is_and_exports_one_function():
    if _library_dir() is None:
        pytest.skip("opbridge_ort's library is not installed here")
    assert os.path.isfile(CUDA_LIBRARY), f"{CUDA_LIBRARY} was not built although nvcc is on PATH"
    with open(CUDA_LIBRARY, "rb") as f:
        data = f.read()
    assert b"opbridge_ort_cuda_ops" in data
    # Static CUDA runtime: no libcudart to find at load time.
    assert b"libcudart.so" not in data


@pytest.mark.skipif(not os.path.isfile(CUDA_LIBRARY), reason="this opbridge_ort was built without its CUDA library")
def test_the_ort_cuda_library_checks_the_driver_before_it_registers_nodes(stand_in_driver):
    """libopbridge_ort_cuda.so says whether this process can run it (libopbridge_ort.so asks before taking its
    nodes): a driver of its CUDA major release or newer can; an older one gets a sentence naming both versions."""
    code = (
        "import ctypes, sys\n"
        "library = ctypes.CDLL(sys.argv[1])\n"
        "message = ctypes.create_string_buffer(512)\n"
        "print(library.opbridge_ort_cuda_problem(message, 512), message.value.decode())\n"
    )

    def problem(driver):
        env = {**os.environ, "LD_LIBRARY_PATH": stand_in_driver(driver)}
        result = subprocess.run([sys.executable, "-c", code, CUDA_LIBRARY], capture_output=True, text=True, env=env,
                                timeout=120, check=True)  # fmt: skip
        found, _, message = result.stdout.strip().partition(" ")
        return int(found), message

    assert problem(99000) == (0, "")
    found, message = problem(11080)
    assert found == 2 and "supports CUDA 11.8" in message and "libopbridge_ort_cuda.so" in message, message


def test_the_gpu_benchmarks_node_cases_are_models_the_cpu_library_runs():
    """The GPU benchmark's rows of the nodes ORT has no kernel for (python -m opbridge.tools.bench_cuda on a GPU)
    time one-node models built here: each, built small, runs on the CPU provider with opbridge's library and gives
    a non-empty output, so that a borrowed GPU's one run does not fail on a model."""
    from opbridge.tools import bench_cuda_more

    cases = bench_cuda_more.ort_node_cases(scale=16)
    assert {op for op, *_ in cases} == {"NMSRotated", "NMSMatch", "cummax", "MMCVCornerPool", "MMCVPSAMask",
                                         "MMCVCARAFE", "MMCVMaskedConv2d"}  # fmt: skip
    for op, _, model, feeds in cases:
        out = _run(model, {name: tensor.numpy() for name, tensor in feeds.items()}, cuda=False)
        assert out.size > 0, op
    if not HAS_CUDA_EP:
        assert bench_cuda_more.ort_node_rows(1) == []


# --- on the GPU -----------------------------------------------------------------------------------------------------


def _model(op_type, domain, inputs, output_dtype, attributes=None):
    """One node; inputs: [(name, array)] (None for an omitted optional input)."""
    graph_inputs = [
        helper.make_tensor_value_info(name, ELEMENT.get(array.dtype.type, TensorProto.INT64), list(array.shape))
        for name, array in inputs
        if array is not None
    ]
    node = helper.make_node(
        op_type, [name if array is not None else "" for name, array in inputs], ["out"], domain=domain,
        **(attributes or {}),
    )  # fmt: skip
    graph = helper.make_graph([node], "g", graph_inputs, [helper.make_tensor_value_info("out", output_dtype, None)])
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(domain, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


def _run(model, feeds, cuda):
    return _run_all(model, feeds, cuda)[0]


def _run_all(model, feeds, cuda):
    options = opbridge_ort.session_options()
    if cuda:
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")  # every node on the GPU, or fail
    providers = ["CUDAExecutionProvider"] if cuda else ["CPUExecutionProvider"]
    session = ort.InferenceSession(model, options, providers=providers)
    if cuda:
        assert session.get_providers()[0] == "CUDAExecutionProvider"
    return session.run(None, {k: v for k, v in feeds.items() if v is not None})


def _close(actual, expected, dtype):
    tol = {np.float64: 1e-10, np.float32: 1e-4, np.float16: 1e-3}[dtype]
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol)


@needs_cuda_ep
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shapes", [((3, 4, 5), (3, 4, 5)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (5,))])
def test_my_add_on_the_cuda_ep(dtype, shapes):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shapes[0]).astype(dtype)
    b = rng.standard_normal(shapes[1]).astype(dtype)
    model = _model("MyAdd", "opbridge", [("A", a), ("B", b)], ELEMENT[dtype])
    out = _run(model, {"A": a, "B": b}, cuda=True)
    acc = np.float64 if dtype == np.float64 else np.float32
    expected = (2 * a.astype(acc) + b.astype(acc)).astype(dtype)
    np.testing.assert_array_equal(out, expected)


MSDA_CONFIGS = [
    dict(batch=2, levels=((6, 8), (3, 4), (2, 2), (1, 1)), queries=11, heads=2, channels=32, points=3),
    dict(batch=1, levels=((5, 7), (3, 3)), queries=9, heads=3, channels=16, points=2),
    dict(batch=1, levels=((4, 5),), queries=7, heads=1, channels=100, points=2),  # channels not a vector multiple
    dict(batch=1, levels=((64, 64), (32, 32), (16, 16), (8, 8)), queries=5440, heads=8, channels=32, points=4),
]
MSDA_NODES = [("MultiScaleDeformableAttention", "opbridge"), ("MMCVMultiScaleDeformableAttention", "mmdeploy")]


SPECIAL_LOCATIONS = [float("nan"), 0.5, 1e30, -1e30, float("inf"), -0.25, 1.25]


def _msda_feeds(dtype, config, special=SPECIAL_LOCATIONS):
    """Inputs with a few NaN, infinite and far locations first, which the op samples as off the map (zero)."""
    value, shapes, starts, locations, weights = msda_inputs(torch.float64, **config)
    locations = locations.clone()
    locations.view(-1)[: len(special)] = torch.tensor(special, dtype=torch.float64)
    feeds = dict(value=value, spatial_shapes=shapes, level_start_index=starts, sampling_locations=locations,
                 attention_weights=weights)  # fmt: skip
    with np.errstate(over="ignore"):  # float16: the far locations become infinite, still off the map
        return {k: v.numpy().astype(dtype) if v.is_floating_point() else v.numpy() for k, v in feeds.items()}


@needs_cuda_ep
@pytest.mark.parametrize("node", MSDA_NODES, ids=lambda n: n[1])
@pytest.mark.parametrize("config", MSDA_CONFIGS, ids=lambda c: f"D{c['channels']}Q{c['queries']}")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ms_deform_attn_on_the_cuda_ep(node, config, dtype):
    feeds = _msda_feeds(dtype, config)
    model = _model(*node, list(feeds.items()), ELEMENT[dtype])
    out = _run(model, feeds, cuda=True)
    # The reference (grid_sample) propagates NaN: it gets the same inputs with those locations far off the map.
    off_map = [x if abs(x) < 1e6 else -10.0 for x in SPECIAL_LOCATIONS]  # NaN, inf and 1e30 (abs(nan) < 1e6 is False)
    reference_feeds = _msda_feeds(np.float64, config, special=off_map)
    expected = msda_reference(*(torch.from_numpy(v) for v in reference_feeds.values())).numpy()
    _close(out, expected, dtype)
    if dtype == np.float64:
        _close(out, _run(model, feeds, cuda=False), dtype)  # the CPU library's node: same arithmetic


@needs_cuda_ep
@pytest.mark.parametrize("node", MSDA_NODES, ids=lambda n: n[1])
@pytest.mark.parametrize("config", MSDA_CONFIGS, ids=lambda c: f"D{c['channels']}Q{c['queries']}")
def test_ms_deform_attn_float16_node_runs_on_the_gpu_and_rounds_the_float64_value_once(node, config):
    """A float16 model's MSDA node (a model after .half()) runs on the CUDA provider (no CPU fallback allowed by
    _run), reading float16 and computing in float32: within one float16 rounding of the float64 value of its
    float16 inputs."""
    feeds = _msda_feeds(np.float16, config)
    model = _model(*node, list(feeds.items()), ELEMENT[np.float16])
    out = _run(model, feeds, cuda=True)
    assert out.dtype == np.float16
    off_map = [x if abs(x) < 1e6 else -10.0 for x in SPECIAL_LOCATIONS]
    halves = _msda_feeds(np.float16, config, special=off_map)  # the same float16 values, NaN/inf/far moved off the map
    expected = msda_reference(*(torch.from_numpy(v.astype(np.float64) if v.dtype == np.float16 else v)
                                for v in halves.values())).numpy()  # fmt: skip
    error = np.abs(out.astype(np.float64) - expected)
    bound = 2.0**-11 * np.abs(expected) + 2.0**-24 + 1e-5 * max(1.0, float(np.abs(expected).max()))
    assert (error <= bound).all(), f"max excess {float((error - bound).max())}"


@needs_cuda_ep
def test_ms_deform_attn_bad_level_table_is_an_error_status_on_the_cuda_ep():
    feeds = _msda_feeds(np.float32, MSDA_CONFIGS[0])
    feeds["level_start_index"] = feeds["level_start_index"] + 1
    model = _model(*MSDA_NODES[0], list(feeds.items()), TensorProto.FLOAT)
    with pytest.raises(Exception, match=r"MultiScaleDeformableAttention.*level_start_index"):
        _run(model, feeds, cuda=True)


DEFORM_CONFIGS = [
    dict(batch=2, channels=6, size=(9, 11), out_channels=4, kernel=(3, 3), groups=1, offset_groups=2,
         stride=(1, 2), padding=(1, 1), dilation=(1, 1), mask=True, bias=True),
    dict(batch=1, channels=8, size=(7, 6), out_channels=6, kernel=(2, 3), groups=2, offset_groups=4,
         stride=(2, 1), padding=(0, 2), dilation=(2, 1), mask=False, bias=False),
    dict(batch=2, channels=64, size=(20, 24), out_channels=96, kernel=(3, 3), groups=1, offset_groups=1,
         stride=(1, 1), padding=(1, 1), dilation=(1, 1), mask=True, bias=True),  # several 64-wide tiles
]  # fmt: skip


def _deform(dtype, c):
    rng = np.random.default_rng(1)
    kh, kw = c["kernel"]
    out_h = (c["size"][0] + 2 * c["padding"][0] - c["dilation"][0] * (kh - 1) - 1) // c["stride"][0] + 1
    out_w = (c["size"][1] + 2 * c["padding"][1] - c["dilation"][1] * (kw - 1) - 1) // c["stride"][1] + 1
    taps = c["offset_groups"] * kh * kw
    x = rng.standard_normal((c["batch"], c["channels"], *c["size"]))
    w = rng.standard_normal((c["out_channels"], c["channels"] // c["groups"], kh, kw))
    offset = 2.0 * rng.standard_normal((c["batch"], 2 * taps, out_h, out_w))
    mask = rng.random((c["batch"], taps, out_h, out_w)) if c["mask"] else None
    bias = rng.standard_normal(c["out_channels"]) if c["bias"] else None
    import torchvision

    t = lambda a: None if a is None else torch.from_numpy(a)  # noqa: E731
    geometry = dict(stride=c["stride"], padding=c["padding"], dilation=c["dilation"])
    expected = torchvision.ops.deform_conv2d(t(x), t(offset), t(w), t(bias), mask=t(mask), **geometry).numpy()
    cast = lambda a: None if a is None else a.astype(dtype)  # noqa: E731
    return cast(x), cast(w), cast(offset), cast(mask), cast(bias), expected


@needs_cuda_ep
@pytest.mark.parametrize("path", ["cublas", "fused"])
@pytest.mark.parametrize("config", DEFORM_CONFIGS, ids=lambda c: f"C{c['channels']}G{c['groups']}")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_deform_conv2d_on_the_cuda_ep(config, dtype, path, monkeypatch):
    """The deformable convolution nodes on the GPU against torchvision (float64 within 1e-10) and the CPU node, by
    both of the CUDA library's paths: im2col with the process's cuBLAS (OPBRIDGE_ORT_CUDA_DCN=cublas: that path or
    an error, never the fallback) and the fused kernel (OPBRIDGE_ORT_CUDA_DCN=fused)."""
    monkeypatch.setenv("OPBRIDGE_ORT_CUDA_DCN", path)
    x, w, offset, mask, bias, expected = _deform(dtype, config)
    c = config
    attributes = dict(strides=list(c["stride"]), pads=[*c["padding"], *c["padding"]], dilations=list(c["dilation"]),
                      group=c["groups"], offset_group=c["offset_groups"], kernel_shape=list(c["kernel"]))  # fmt: skip
    inputs = [("X", x), ("W", w), ("offset", offset), ("B", bias), ("mask", mask)]
    model = _model("DeformConv2d", "opbridge", inputs, ELEMENT[dtype], attributes)
    out = _run(model, dict(inputs), cuda=True)
    tol = 1e-10 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(out, expected, rtol=tol, atol=tol)
    if dtype == np.float64:
        np.testing.assert_allclose(out, _run(model, dict(inputs), cuda=False), rtol=1e-12, atol=1e-12)
    # mmcv's and mmdeploy's nodes (DCNv2 with a mask; DCNv1 without mask and bias) run the same kernel.
    mmcv = dict(stride=list(c["stride"]), padding=list(c["padding"]), dilation=list(c["dilation"]),
                groups=c["groups"], deform_groups=c["offset_groups"])  # fmt: skip
    if mask is not None:
        inputs = [("input", x), ("offset", offset), ("mask", mask), ("weight", w), ("bias", bias)]
        for domain in ("mmcv", "mmdeploy"):
            model = _model("MMCVModulatedDeformConv2d", domain, inputs, ELEMENT[dtype], mmcv)
            np.testing.assert_allclose(_run(model, dict(inputs), cuda=True), expected, rtol=tol, atol=tol)
    elif bias is None:
        inputs = [("input", x), ("offset", offset), ("weight", w)]
        for domain in ("mmcv", "mmdeploy"):
            model = _model("MMCVDeformConv2d", domain, inputs, ELEMENT[dtype], mmcv)
            np.testing.assert_allclose(_run(model, dict(inputs), cuda=True), expected, rtol=tol, atol=tol)


@needs_cuda_ep
def test_deform_conv2d_node_runs_on_the_runtimes_own_cublas_without_torch(tmp_path):
    """In a process without torch (a deployment), the float32 DeformConv2d node finds the cuBLAS that
    onnxruntime-gpu's CUDA provider loaded (another CUDA release than the library's static runtime, as the case
    may be), runs im2col and its GEMMs on it (OPBRIDGE_ORT_CUDA_DCN=cublas: that path or an error) and matches
    torchvision."""
    config = DEFORM_CONFIGS[0]
    x, w, offset, mask, bias, expected = _deform(np.float32, config)
    c = config
    attributes = dict(strides=list(c["stride"]), pads=[*c["padding"], *c["padding"]], dilations=list(c["dilation"]),
                      group=c["groups"], offset_group=c["offset_groups"], kernel_shape=list(c["kernel"]))  # fmt: skip
    inputs = [("X", x), ("W", w), ("offset", offset), ("B", bias), ("mask", mask)]
    (tmp_path / "model.onnx").write_bytes(_model("DeformConv2d", "opbridge", inputs, ELEMENT[np.float32], attributes))
    np.savez(tmp_path / "feeds.npz", **{name: array for name, array in inputs if array is not None})
    code = (
        "import sys, numpy as np, onnxruntime as ort, opbridge_ort\n"
        "options = opbridge_ort.session_options()\n"
        "options.add_session_config_entry('session.disable_cpu_ep_fallback', '1')\n"
        "session = ort.InferenceSession('model.onnx', options, providers=['CUDAExecutionProvider'])\n"
        "feeds = dict(np.load('feeds.npz'))\n"
        "np.save('out.npy', session.run(None, feeds)[0])\n"
        "maps = open('/proc/self/maps').read()\n"
        "print(sorted({line.split('/')[-1] for line in maps.splitlines() if 'libcublas.so' in line}))\n"
        "assert 'torch' not in sys.modules\n"
    )
    env = {**os.environ, "OPBRIDGE_ORT_CUDA_DCN": "cublas"}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "libcublas.so" in result.stdout, result.stdout
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, rtol=1e-4, atol=1e-4)


@needs_cuda_ep
@pytest.mark.parametrize("config", DEFORM_CONFIGS, ids=lambda c: f"C{c['channels']}G{c['groups']}")
def test_deform_conv2d_float16_nodes_run_on_the_gpu_and_round_the_float64_value_once(config):
    """A float16 model's deformable convolution nodes (opbridge, mmcv and mmdeploy forms) run on the CUDA provider
    (_run allows no CPU fallback), reading float16 and computing in float32: within one float16 rounding of the
    float64 value of their float16 inputs (torchvision in float64), plus float32 sums over up to 576 products."""
    import torchvision

    x, w, offset, mask, bias, _ = _deform(np.float16, config)
    c = config
    t = lambda a: None if a is None else torch.from_numpy(a.astype(np.float64))  # noqa: E731
    geometry = dict(stride=c["stride"], padding=c["padding"], dilation=c["dilation"])
    expected = torchvision.ops.deform_conv2d(t(x), t(offset), t(w), t(bias), mask=t(mask), **geometry).numpy()
    scale = float(np.abs(expected).max())

    def check(out):
        assert out.dtype == np.float16
        error = np.abs(out.astype(np.float64) - expected)
        bound = 2.0**-11 * np.abs(expected) + 2.0**-24 + 1e-5 * max(1.0, scale)
        assert (error <= bound).all(), f"max excess {float((error - bound).max())}"

    attributes = dict(strides=list(c["stride"]), pads=[*c["padding"], *c["padding"]], dilations=list(c["dilation"]),
                      group=c["groups"], offset_group=c["offset_groups"], kernel_shape=list(c["kernel"]))  # fmt: skip
    inputs = [("X", x), ("W", w), ("offset", offset), ("B", bias), ("mask", mask)]
    check(_run(_model("DeformConv2d", "opbridge", inputs, ELEMENT[np.float16], attributes), dict(inputs), cuda=True))
    mmcv = dict(stride=list(c["stride"]), padding=list(c["padding"]), dilation=list(c["dilation"]),
                groups=c["groups"], deform_groups=c["offset_groups"])  # fmt: skip
    if mask is not None:
        inputs = [("input", x), ("offset", offset), ("mask", mask), ("weight", w), ("bias", bias)]
        for domain in ("mmcv", "mmdeploy"):
            model = _model("MMCVModulatedDeformConv2d", domain, inputs, ELEMENT[np.float16], mmcv)
            check(_run(model, dict(inputs), cuda=True))
    elif bias is None:
        inputs = [("input", x), ("offset", offset), ("weight", w)]
        for domain in ("mmcv", "mmdeploy"):
            model = _model("MMCVDeformConv2d", domain, inputs, ELEMENT[np.float16], mmcv)
            check(_run(model, dict(inputs), cuda=True))


@needs_cuda_ep
def test_deform_conv2d_bad_shapes_are_an_error_status_on_the_cuda_ep():
    x, w, offset, mask, bias, _ = _deform(np.float32, DEFORM_CONFIGS[0])
    inputs = [("X", x), ("W", w), ("offset", offset[:, :-2]), ("B", bias), ("mask", mask)]
    attributes = dict(strides=[1, 2], pads=[1, 1, 1, 1], offset_group=2, kernel_shape=[3, 3])
    model = _model("DeformConv2d", "opbridge", inputs, TensorProto.FLOAT, attributes)
    with pytest.raises(Exception, match=r"DeformConv2d.*offset"):
        _run(model, dict(inputs), cuda=True)


# --- grid_sampler (mmcv's and mmdeploy's node for grid_sample) ------------------------------------------------------


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) where opbridge_ort was built")
def test_the_ort_cuda_library_registers_its_nodes_and_inspect_sees_them():
    """Host side: the CUDA library leaves a marker for each node it registers (the same macro registers it), and
    opbridge_ort.cuda_library_path() / inspect read them."""
    if _library_dir() is None:
        pytest.skip("opbridge_ort's library is not installed here")
    assert opbridge_ort.cuda_library_path() == os.path.realpath(CUDA_LIBRARY)
    nodes = {("opbridge", op) for op in opbridge_ort.ops(CUDA_LIBRARY)} | set(opbridge_ort.foreign_ops(CUDA_LIBRARY))
    for node in [("opbridge", "MyAdd"), ("opbridge", "MultiScaleDeformableAttention"), ("opbridge", "DeformConv2d"),
                 ("mmcv", "grid_sampler"), ("mmdeploy", "grid_sampler"),
                 ("mmdeploy", "MMCVMultiScaleDeformableAttention"), ("mmcv", "MMCVModulatedDeformConv2d"),
                 ("opbridge", "RoiAlignRotated"), ("mmcv", "MMCVRoIAlignRotated"), ("mmdeploy", "MMCVRoIAlignRotated"),
                 ("opbridge", "RotatedFeatureAlign"), ("mmcv", "MMCVRotatedFeatureAlign"),
                 ("opbridge", "BoxIouRotated"), ("mmcv", "MMCVRoiAlign"), ("mmdeploy", "MMCVRoiAlign"),
                 ("mmcv", "NonMaxSuppression"), ("opbridge", "NmsRotated"), ("mmdeploy", "NMSRotated"),
                 ("mmdeploy", "NMSMatch"),
                 ("mmcv", "cummax"), ("mmcv", "cummin"), ("mmcv", "MMCVCornerPool"),
                 ("mmcv", "MMCVPSAMask"), ("mmcv", "MMCVCARAFE"), ("mmcv", "MMCVCARAFENaive"),
                 ("mmcv", "MMCVMaskedConv2d")]:  # fmt: skip
        assert node in nodes, node
    # Every CUDA node is also a CPU node of the main library (the CPU provider is the fallback).
    cpu = {("opbridge", op) for op in opbridge_ort.ops()} | set(opbridge_ort.foreign_ops())
    assert nodes <= cpu


def _grid_inputs(dtype, batch=2, channels=5, height=7, width=9, out=(6, 8)):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, channels, height, width))
    grid = rng.uniform(-1.3, 1.3, (batch, *out, 2))
    grid[0, 0, :4, 0] = [np.nan, np.inf, 1e30, -1.0]  # read nothing, nothing, nothing, the border
    with np.errstate(over="ignore"):  # float16: 1e30 becomes infinite, which also reads nothing
        return x.astype(dtype), grid.astype(dtype)


@needs_cuda_ep
@pytest.mark.parametrize("domain", ["mmcv", "mmdeploy"])
@pytest.mark.parametrize("interpolation", [0, 1, 2], ids=["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", [0, 1, 2], ids=["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_grid_sampler_on_the_cuda_ep(domain, interpolation, padding, align_corners, dtype):
    """float16 (a model after .half()) runs on the GPU too (_run allows no CPU fallback): read as stored, float32
    arithmetic, the float64 value of its float16 inputs within one rounding."""
    x, grid = _grid_inputs(dtype)
    attributes = dict(interpolation_mode=interpolation, padding_mode=padding, align_corners=align_corners)
    model = _model("grid_sampler", domain, [("input", x), ("grid", grid)], ELEMENT[dtype], attributes)
    out = _run(model, {"input": x, "grid": grid}, cuda=True)
    # Against torch's grid_sample (float64; the non-finite grid points read nothing, as torch's CUDA kernel does).
    mode = ("bilinear", "nearest", "bicubic")[interpolation]
    pad = ("zeros", "border", "reflection")[padding]
    wide = grid.astype(np.float64)
    finite = np.isfinite(wide).all(-1) & (np.abs(wide) < 1e10).all(-1)
    safe_grid = torch.from_numpy(np.where(finite[..., None], wide, 0))
    expected = torch.nn.functional.grid_sample(
        torch.from_numpy(x.astype(np.float64)),
        safe_grid,
        mode=mode,
        padding_mode=pad,
        align_corners=bool(align_corners),
    ).numpy()
    check = np.broadcast_to(finite[:, None], expected.shape)
    if padding == 0:
        _close(out[check], expected[check], dtype)
    # The same bits as the CPU node (one arithmetic, no fused multiply-adds on either device).
    np.testing.assert_array_equal(out, _run(model, {"input": x, "grid": grid}, cuda=False))


@needs_cuda_ep
def test_grid_sampler_bad_shapes_are_an_error_status_on_the_cuda_ep():
    x, grid = _grid_inputs(np.float32)
    model = _model("grid_sampler", "mmdeploy", [("input", x), ("grid", grid[:1])], TensorProto.FLOAT)
    with pytest.raises(Exception, match=r"grid_sampler.*grid \(index 1\)"):
        _run(model, {"input": x, "grid": grid[:1]}, cuda=True)


# --- the rotated-detection nodes ------------------------------------------------------------------------------------


def _rotated_rois(rng, count, batch, height, width):
    return np.concatenate(
        [
            rng.integers(0, batch, (count, 1)).astype(np.float64),
            rng.uniform(-2, width + 2, (count, 1)),
            rng.uniform(-2, height + 2, (count, 1)),
            rng.uniform(0.2, 12, (count, 2)),
            rng.uniform(-2 * np.pi, 2 * np.pi, (count, 1)),
        ],
        1,
    )


@needs_cuda_ep
@pytest.mark.parametrize("node", [("RoiAlignRotated", "opbridge"), ("MMCVRoIAlignRotated", "mmcv"),
                                  ("MMCVRoIAlignRotated", "mmdeploy")], ids=lambda n: n[1])  # fmt: skip
@pytest.mark.parametrize(("ratio", "aligned", "clockwise"), [(2, 1, 0), (0, 1, 1), (0, 0, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_roi_align_rotated_on_the_cuda_ep(node, ratio, aligned, clockwise, dtype):
    """Against torch's roi_align_rotated (the CPU op, itself checked against torchvision and mmcv's published values)
    and the CPU node."""
    import opbridge

    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 9, 11)).astype(dtype)
    rois = _rotated_rois(rng, 13, 2, 9, 11).astype(dtype)
    rois[4, 3] = np.nan
    attributes = dict(output_height=3, output_width=2, spatial_scale=0.75, sampling_ratio=ratio, aligned=aligned,
                      clockwise=clockwise)  # fmt: skip
    model = _model(node[0], node[1], [("input", x), ("rois", rois)], ELEMENT[dtype], attributes)
    out = _run(model, {"input": x, "rois": rois}, cuda=True)
    expected = opbridge.roi_align_rotated(torch.from_numpy(x), torch.from_numpy(rois), (3, 2), 0.75, ratio,
                                          bool(aligned), bool(clockwise)).numpy()  # fmt: skip
    np.testing.assert_allclose(out, expected, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6, equal_nan=True)
    bad = rois.copy()
    bad[2, 0] = 7
    with pytest.raises(Exception, match=r"rois \(index 1\)\[2, 0\] \(the batch index\)"):
        _run(model, {"input": x, "rois": bad}, cuda=True)


@needs_cuda_ep
@pytest.mark.parametrize("node", [("RotatedFeatureAlign", "opbridge"), ("MMCVRotatedFeatureAlign", "mmcv")])
@pytest.mark.parametrize("points", [1, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rotated_feature_align_on_the_cuda_ep(node, points, dtype):
    import opbridge

    rng = np.random.default_rng(2)
    features = rng.standard_normal((2, 4, 7, 9)).astype(dtype)
    boxes = np.concatenate(
        [rng.uniform(-8, 72, (2, 7, 9, 2)), rng.uniform(0, 40, (2, 7, 9, 2)), rng.uniform(-3, 3, (2, 7, 9, 1))], 3
    ).astype(dtype)
    attributes = dict(spatial_scale=0.125, points=points)
    model = _model(node[0], node[1], [("features", features), ("best_rboxes", boxes)], ELEMENT[dtype], attributes)
    out = _run(model, {"features": features, "best_rboxes": boxes}, cuda=True)
    expected = opbridge.rotated_feature_align(torch.from_numpy(features), torch.from_numpy(boxes), 0.125, points)
    np.testing.assert_allclose(out, expected.numpy(), rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)


@needs_cuda_ep
@pytest.mark.parametrize("aligned", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_box_iou_rotated_on_the_cuda_ep(aligned, dtype):
    import opbridge

    rng = np.random.default_rng(3)
    boxes1 = np.concatenate([rng.uniform(0, 20, (30, 2)), rng.uniform(0.5, 6, (30, 2)), rng.uniform(-6, 6, (30, 1))], 1)
    boxes2 = boxes1[::-1].copy() if aligned else boxes1[:17] + rng.uniform(-1, 1, (17, 5))
    boxes1, boxes2 = boxes1.astype(dtype), boxes2.astype(dtype)
    for mode in (0, 1):
        attributes = dict(mode=mode, aligned=aligned, clockwise=1)
        model = _model(
            "BoxIouRotated", "opbridge", [("boxes1", boxes1), ("boxes2", boxes2)], ELEMENT[dtype], attributes
        )
        out = _run(model, {"boxes1": boxes1, "boxes2": boxes2}, cuda=True)
        expected = opbridge.box_iou_rotated(torch.from_numpy(boxes1), torch.from_numpy(boxes2), ("iou", "iof")[mode],
                                            bool(aligned)).numpy()  # fmt: skip
        np.testing.assert_allclose(out, expected, rtol=1e-6 if dtype == np.float32 else 1e-12, atol=1e-7)


@needs_cuda_ep
@pytest.mark.parametrize("domain", ["mmcv", "mmdeploy"])
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize(("ratio", "aligned"), [(2, 1), (0, 1), (0, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mmcv_roi_align_on_the_cuda_ep(domain, mode, ratio, aligned, dtype):
    """Against the CPU node (itself checked against torchvision's roi_align and mmcv's values): the maximum bit for
    bit, the average within float rounding (the CPU kernel sums separably, the GPU sample by sample)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 5, 9, 11)).astype(dtype)
    starts = rng.uniform(-2, 9, (13, 2))
    rois = np.concatenate([rng.integers(0, 2, (13, 1)), starts, starts + rng.uniform(0.2, 8, (13, 2))], 1).astype(dtype)
    attributes = dict(output_height=3, output_width=2, spatial_scale=0.75, sampling_ratio=ratio, mode=mode,
                      aligned=aligned)  # fmt: skip
    model = _model("MMCVRoiAlign", domain, [("input", x), ("rois", rois)], ELEMENT[dtype], attributes)
    feeds = {"input": x, "rois": rois}
    out, cpu = _run(model, feeds, cuda=True), _run(model, feeds, cuda=False)
    if mode == "max":
        np.testing.assert_array_equal(out, cpu)
    else:
        tolerance = 1e-12 if dtype == np.float64 else 2e-6
        np.testing.assert_allclose(out, cpu, rtol=tolerance, atol=tolerance)


def _clustered_boxes(rng, count, width, spread=20.0):
    """Boxes around a few centers (many overlaps, ties and NaN among the scores checked separately)."""
    centers = rng.uniform(0, spread, (max(count // 4, 1), 2))[np.arange(count) % max(count // 4, 1)]
    centers = centers + rng.standard_normal((count, 2))
    sizes = rng.uniform(0.5, 6, (count, 2))
    if width == 4:
        return np.concatenate([centers - sizes / 2, centers + sizes / 2], 1)
    return np.concatenate([centers, sizes, rng.uniform(-6, 6, (count, 1))], 1)


@needs_cuda_ep
@pytest.mark.parametrize("count", [1, 63, 64, 65, 700])
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mmcv_nms_on_the_cuda_ep(count, offset, dtype):
    """The kept indices of mmcv::NonMaxSuppression on the GPU equal the CPU node's (itself checked against mmcv's
    values and torchvision's nms), in order: equal scores, a NaN score and a NaN box included."""
    rng = np.random.default_rng(count + offset)
    boxes = _clustered_boxes(rng, count, 4).astype(dtype)
    scores = rng.uniform(0, 1, count).round(2).astype(dtype)  # rounding makes ties
    if count > 3:
        scores[1], boxes[2, 0] = np.nan, np.nan
    for threshold in (0.0, 0.3, 0.7):
        model = _model("NonMaxSuppression", "mmcv", [("boxes", boxes), ("scores", scores)], TensorProto.INT64,
                       dict(iou_threshold=threshold, offset=offset))  # fmt: skip
        feeds = {"boxes": boxes, "scores": scores}
        np.testing.assert_array_equal(_run(model, feeds, cuda=True), _run(model, feeds, cuda=False))


@needs_cuda_ep
@pytest.mark.parametrize("count", [1, 64, 300])
@pytest.mark.parametrize("labelled", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nms_rotated_node_on_the_cuda_ep(count, labelled, dtype):
    """opbridge::NmsRotated on the GPU keeps what opbridge.nms_rotated keeps on the CPU (and the CPU node)."""
    import opbridge

    rng = np.random.default_rng(count)
    boxes = _clustered_boxes(rng, count, 5).astype(dtype)
    scores = rng.uniform(0, 1, count).round(2).astype(dtype)
    labels = rng.integers(0, 3, count).astype(np.int64) if labelled else None
    inputs = [("boxes", boxes), ("scores", scores), ("labels", labels)]
    model = _model("NmsRotated", "opbridge", inputs, TensorProto.INT64, dict(iou_threshold=0.3, clockwise=1))
    feeds = {"boxes": boxes, "scores": scores, "labels": labels}
    expected = opbridge.nms_rotated(torch.from_numpy(boxes), torch.from_numpy(scores), 0.3,
                                    None if labels is None else torch.from_numpy(labels))[1].numpy()  # fmt: skip
    np.testing.assert_array_equal(_run(model, feeds, cuda=True), expected)
    np.testing.assert_array_equal(_run(model, feeds, cuda=False), expected)


def _per_class_nms_rotated(boxes, scores, iou_threshold, score_threshold):
    """mmdeploy's NMSRotated as a loop over (batch, class) of opbridge.nms_rotated on the CPU: rows (b, c, box)."""
    import opbridge

    rows = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            (candidates,) = np.nonzero(scores[b, c] > score_threshold)
            if candidates.size == 0:
                continue
            chosen = torch.from_numpy(boxes[b][candidates]), torch.from_numpy(scores[b, c][candidates])
            keep = opbridge.nms_rotated(*chosen, iou_threshold)[1].numpy()
            rows += [(b, c, int(candidates[k])) for k in keep]
    return np.array(rows, np.int64).reshape(-1, 3)


@needs_cuda_ep
@pytest.mark.parametrize(("batch", "classes", "count"), [(1, 1, 1), (2, 3, 64), (2, 4, 65), (1, 15, 300), (3, 70, 20)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mmdeploy_nms_rotated_on_the_cuda_ep(batch, classes, count, dtype):
    """mmdeploy::NMSRotated (mmrotate's detectors) on the GPU: per (batch, class), the boxes above score_threshold
    suppressed among themselves; the rows equal a per-class loop of opbridge.nms_rotated and the CPU node's, in
    order (ties, a NaN score and a NaN box included; every score below the threshold: no rows)."""
    rng = np.random.default_rng(batch * 1000 + classes * 10 + count)
    boxes = np.stack([_clustered_boxes(rng, count, 5) for _ in range(batch)]).astype(dtype)
    scores = rng.uniform(0, 1, (batch, classes, count)).round(2).astype(dtype)  # rounding makes ties
    if count > 3:
        scores[0, 0, 1], boxes[0, 2, 0] = np.nan, np.nan
    feeds = {"boxes": boxes, "scores": scores}
    for iou_threshold, score_threshold in ((0.3, 0.05), (0.1, 0.5), (0.7, -1.0), (0.3, 1.0)):
        model = _model("NMSRotated", "mmdeploy", [("boxes", boxes), ("scores", scores)], TensorProto.INT64,
                       dict(iou_threshold=iou_threshold, score_threshold=score_threshold))  # fmt: skip
        expected = _per_class_nms_rotated(boxes, scores, iou_threshold, score_threshold)
        assert score_threshold < 1.0 or expected.shape == (0, 3)
        np.testing.assert_array_equal(_run(model, feeds, cuda=True), expected)
        np.testing.assert_array_equal(_run(model, feeds, cuda=False), expected)


@needs_cuda_ep
@pytest.mark.parametrize(("batch", "classes", "count"), [(1, 1, 1), (2, 5, 10), (2, 3, 64), (1, 4, 65), (2, 6, 200)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mmdeploy_nms_match_on_the_cuda_ep(batch, classes, count, dtype):
    """mmdeploy::NMSMatch on the GPU: the rows (batch, class, kept, suppressed) of a numpy reference written from
    mmdeploy's definition and of the CPU node, in order (ties, a NaN score and a NaN box included); the thresholds
    are inputs, read in host memory. mmdeploy's published rows too."""
    from ort_cases import nms_match as cases

    rng = np.random.default_rng(batch * 1000 + classes * 10 + count)
    boxes = np.stack([_clustered_boxes(rng, count, 4) for _ in range(batch)]).astype(dtype)
    scores = rng.uniform(0, 1, (batch, classes, count)).round(2).astype(dtype)  # rounding makes ties
    if count > 3:
        scores[0, 0, 1], boxes[0, 2, 0] = np.nan, np.nan
    model = cases.nms_match_model(dtype)
    for iou_threshold, score_threshold in ((0.1, 0.05), (0.4, 0.5), (0.7, -1.0), (0.3, 1.0)):
        feeds = {"boxes": boxes, "scores": scores, "iou_threshold": np.array([iou_threshold], dtype),
                 "score_threshold": np.array([score_threshold], dtype)}  # fmt: skip
        expected = cases.nms_match_reference(boxes, scores, dtype(iou_threshold), dtype(score_threshold))
        np.testing.assert_array_equal(_run(model, feeds, cuda=True), expected)
        np.testing.assert_array_equal(_run(model, feeds, cuda=False), expected)
    published = np.array([cases.BOXES] * 2, dtype), np.array([cases.SCORES] * 2, dtype).transpose(0, 2, 1)
    feeds = {"boxes": published[0], "scores": published[1], "iou_threshold": np.array([0.1], dtype),
             "score_threshold": np.array([0.1], dtype)}  # fmt: skip
    want = [[b, *row] for b in (0, 1) for row in cases.PUBLISHED_ROWS]
    assert _run(model, feeds, cuda=True).tolist() == want


@needs_cuda_ep
def test_mmdeploy_nms_rotated_with_more_tasks_than_a_grid_layer_on_the_cuda_ep():
    """66000 (batch, class) tasks: more than the 65535 a grid's z dimension takes, so the mask kernel loops over
    them; the GPU's rows equal the CPU node's (itself checked against a per-class loop above)."""
    rng = np.random.default_rng(5)
    boxes = _clustered_boxes(rng, 3, 5)[None].astype(np.float32)
    scores = rng.uniform(0, 1, (1, 66000, 3)).round(2).astype(np.float32)
    model = _model("NMSRotated", "mmdeploy", [("boxes", boxes), ("scores", scores)], TensorProto.INT64,
                   dict(iou_threshold=0.3, score_threshold=0.2))  # fmt: skip
    feeds = {"boxes": boxes, "scores": scores}
    expected = _run(model, feeds, cuda=False)
    assert expected.shape[0] > 66000 and set(expected[:, 1]) >= {0, 65535, 65999}
    np.testing.assert_array_equal(_run(model, feeds, cuda=True), expected)


# --- mmcv's cummax, cummin and MMCVCornerPool -----------------------------------------------------------------------


@needs_cuda_ep
@pytest.mark.parametrize("op_type", ["cummax", "cummin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_cummax_cummin_on_the_cuda_ep(op_type, dtype):
    """Values and indices of mmcv::cummax / cummin on the GPU equal torch.cummax / torch.cummin's (ties take the
    last index, a NaN propagates with the index of the last NaN) and the CPU node's, along every axis."""
    from ort_cases import cummax as cases

    rng = np.random.default_rng(7)
    x = rng.integers(-3, 4, (3, 70, 5, 33)).astype(dtype)  # small integers: many ties
    if dtype != np.int64:
        x[0, 5, 1, 2], x[1, :, 2, 7] = np.nan, np.nan
    reference = torch.cummax if op_type == "cummax" else torch.cummin
    for dim in range(-4, 4):
        model = cases.cumulative_model(op_type, dtype, dim=dim)
        values, indices = _run_all(model, {"input": x}, cuda=True)
        want = reference(torch.from_numpy(x), dim)
        np.testing.assert_array_equal(values, want.values.numpy())
        np.testing.assert_array_equal(indices, want.indices.numpy())
        for got, cpu in zip((values, indices), _run_all(model, {"input": x}, cuda=False), strict=True):
            np.testing.assert_array_equal(got, cpu)


@needs_cuda_ep
@pytest.mark.parametrize("mode", range(4))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_corner_pool_on_the_cuda_ep(mode, dtype):
    """mmcv::MMCVCornerPool on the GPU: mmcv's formula (flip for top and left, torch.cummax along H or W, flip
    back) and the CPU node's result."""
    from ort_cases import cummax as cases

    x = np.random.default_rng(mode).standard_normal((2, 5, 37, 66)).astype(dtype)
    dim, flip = 2 if mode < 2 else 3, mode in (0, 2)
    t = torch.from_numpy(x)
    want = torch.cummax(t.flip(dim) if flip else t, dim).values
    want = (want.flip(dim) if flip else want).numpy()
    model = cases.cumulative_model("MMCVCornerPool", dtype, mode=mode)
    np.testing.assert_array_equal(_run(model, {"input": x}, cuda=True), want)
    np.testing.assert_array_equal(_run(model, {"input": x}, cuda=False), want)


# --- mmcv's MMCVPSAMask and MMCVCARAFE ------------------------------------------------------------------------------


@needs_cuda_ep
@pytest.mark.parametrize("psa_type", [0, 1])
@pytest.mark.parametrize(("size", "mask"), [((5, 7), (3, 3)), ((4, 6), (4, 5)), ((3, 2), (9, 9)), ((13, 17), (7, 9))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_psa_mask_on_the_cuda_ep(psa_type, size, mask, dtype):
    """mmcv::MMCVPSAMask on the GPU: the numpy reference written from the definition, and the CPU node, exactly
    (odd and even windows, windows larger than the map)."""
    from ort_cases import psa_mask as cases

    x = np.random.default_rng(1).standard_normal((2, mask[0] * mask[1], *size)).astype(dtype)
    model = cases.psa_mask_model(dtype, psa_type=psa_type, mask_size=list(mask))
    want = cases.psa_mask_reference(x, psa_type, mask)
    np.testing.assert_array_equal(_run(model, {"input": x}, cuda=True), want)
    np.testing.assert_array_equal(_run(model, {"input": x}, cuda=False), want)


@needs_cuda_ep
@pytest.mark.parametrize("op_type", ["MMCVCARAFE", "MMCVCARAFENaive"])
@pytest.mark.parametrize(("kernel", "group", "scale"), [(5, 1, 2), (3, 2, 3), (1, 1, 1), (3, 4, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_carafe_on_the_cuda_ep(op_type, kernel, group, scale, dtype):
    """mmcv's CARAFE nodes on the GPU: the numpy reference (float64), and the CPU node bit for bit (the same taps
    added in the same order, no fused multiply-adds on either device)."""
    from ort_cases import carafe as cases

    rng = np.random.default_rng(kernel * 100 + group * 10 + scale)
    x = rng.standard_normal((2, 8, 9, 11)).astype(dtype)
    masks = rng.random((2, group * kernel * kernel, 9 * scale, 11 * scale)).astype(dtype)
    model = cases.carafe_model(op_type, dtype, **cases.as_symbolic(kernel, group, scale))
    feeds = {"features": x, "masks": masks}
    out = _run(model, feeds, cuda=True)
    tolerance = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(out, cases.carafe_reference(x, masks, kernel, group, scale), rtol=tolerance,
                               atol=tolerance)  # fmt: skip
    np.testing.assert_array_equal(out, _run(model, feeds, cuda=False))


@needs_cuda_ep
@pytest.mark.parametrize(
    ("kernel", "padding"), [((3, 3), (1, 1)), ((1, 1), (0, 0)), ((3, 5), (1, 2)), ((2, 2), (1, 0))]
)
@pytest.mark.parametrize("mask_dtype", ["float", bool])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_masked_conv2d_on_the_cuda_ep(kernel, padding, mask_dtype, dtype):
    """mmcv::MMCVMaskedConv2d on the GPU (its mask read in host memory): the float64 numpy reference and the CPU
    node, with and without bias, an empty mask giving zeros, and a masked position outside the output refused."""
    from ort_cases import masked_conv2d as cases

    rng = np.random.default_rng(kernel[0] * 10 + padding[1])
    kh, kw = kernel
    x = rng.standard_normal((1, 16, 23, 31)).astype(dtype)
    weight = rng.standard_normal((12, 16, kh, kw)).astype(dtype)
    bias = rng.standard_normal(12).astype(dtype)
    out_h, out_w = 23 + 2 * padding[0] - kh + 1, 31 + 2 * padding[1] - kw + 1
    score = np.zeros((1, 23, 31))
    score[:, : min(23, out_h), : min(31, out_w)] = rng.random((1, min(23, out_h), min(31, out_w))) - 0.4
    tolerance = 1e-10 if dtype == np.float64 else 1e-4
    for values in (score, np.zeros_like(score)):
        mask = (values > 0) if mask_dtype is bool else values.astype(dtype)
        for with_bias in (True, False):
            model = cases.masked_conv_model(dtype, bool if mask_dtype is bool else dtype, with_bias,
                                            padding=list(padding), stride=[1, 1])  # fmt: skip
            feeds = {"features": x, "mask": mask, "weight": weight} | ({"bias": bias} if with_bias else {})
            out = _run(model, feeds, cuda=True)
            want = cases.masked_conv_reference(x, values, weight, bias if with_bias else None, padding)
            np.testing.assert_allclose(out, want, rtol=tolerance, atol=tolerance)
            np.testing.assert_allclose(out, _run(model, feeds, cuda=False), rtol=tolerance, atol=tolerance)
    if out_h < 23 or out_w < 31:  # a position the output does not have
        outside = np.zeros((1, 23, 31), bool if mask_dtype is bool else dtype)
        outside[0, 22, 30] = 1
        model = cases.masked_conv_model(dtype, bool if mask_dtype is bool else dtype, False, padding=list(padding),
                                        stride=[1, 1])  # fmt: skip
        with pytest.raises(Exception, match="outside the output"):
            _run(model, {"features": x, "mask": outside, "weight": weight}, cuda=True)


# --- float16 on the CUDA provider -----------------------------------------------------------------------------------


def _float16_cases():
    from test_mixed_precision import _float16_node_cases

    return [case for case in _float16_node_cases() if case[0] != "mmcv::SoftNonMaxSuppression"]


# Nodes whose float32 kernels sum in another order on each device (the CPU's GEMM, double sums of RoIAlign's
# samples): their float32 results agree to rounding, so their float16 results may differ by one unit in the last
# place where a float32 value lies next to a float16 rounding boundary. The others are exact on both devices.
ROUNDING_FLOAT16 = ("mmcv::MMCVMaskedConv2d", "mmcv::MMCVRoiAlign", "RoIAlignRotated", "RoiAlignRotated",
                    "RotatedFeatureAlign", "BoxIouRotated")  # fmt: skip


@needs_cuda_ep
@pytest.mark.parametrize("index", range(18))
def test_float16_nodes_on_the_cuda_ep_give_the_cpu_nodes_result(index):
    """Every CUDA node of a float16 model (mmcv's, mmdeploy's and opbridge's rotated nodes: inputs widened to
    float32 on the device, the float32 kernel, the output rounded once) runs on the GPU and gives the CPU node's
    float16 result (the CPU node is its float32 node rounded once: tests/test_mixed_precision.py): bit for bit, or
    within one unit in the last place for the nodes whose float32 sums differ in order between the devices (index
    outputs always equal). SoftNonMaxSuppression has no CUDA kernel."""
    cases = _float16_cases()
    assert len(cases) == 18, "update the parametrization's range to the number of cases"
    name, build, feeds = cases[index]
    model = build(np.float16)
    feeds = {k: v.astype(np.float16) if v.dtype.kind == "f" else v for k, v in feeds.items()}
    for got, want in zip(_run_all(model, feeds, cuda=True), _run_all(model, feeds, cuda=False), strict=True):
        assert got.dtype == want.dtype, name
        if got.dtype == np.float16 and any(part in name for part in ROUNDING_FLOAT16):
            np.testing.assert_array_max_ulp(got, want, maxulp=1)
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)


@needs_cuda_ep
def test_mmdeploy_nms_match_with_more_tasks_than_a_grid_layer_on_the_cuda_ep():
    """NMSMatch over 66000 (batch, class) tasks (the mask kernel loops over the grid's z layers; the match rows'
    sort spans every task): the GPU's rows equal the CPU node's."""
    from ort_cases import nms_match as cases

    rng = np.random.default_rng(6)
    boxes = _clustered_boxes(rng, 3, 4)[None].astype(np.float32)
    boxes[0, 1] = boxes[0, 0] + 0.01  # box 1 nearly box 0: rows in every task where box 0 or 1 leads
    scores = rng.uniform(0, 1, (1, 66000, 3)).round(2).astype(np.float32)
    feeds = {"boxes": boxes, "scores": scores, "iou_threshold": np.array([0.5], np.float32),
             "score_threshold": np.array([0.1], np.float32)}  # fmt: skip
    model = cases.nms_match_model(np.float32)
    expected = _run(model, feeds, cuda=False)
    assert expected.shape[0] > 50000 and set(expected[:, 1]) >= {0, 65535, 65999}
    np.testing.assert_array_equal(_run(model, feeds, cuda=True), expected)
