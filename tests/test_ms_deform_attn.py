"""ms_deform_attn against the grid_sample reference (Deformable DETR's pure-PyTorch path, forward and
gradients), gradcheck, opcheck, torch.compile, the autograd.Function and nn.Module twins, the three
lowerings at two image sizes, mmdeploy's node, and a Deformable-DETR-style encoder end to end."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import opbridge
import opbridge_ort
from detr_encoder import Encoder, features
from opbridge.ops.ms_deform_attn import reference, sample_inputs

NAMES = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}

# (levels, queries, heads, channels per head, points)
CONFIGS = [
    ([(6, 7), (3, 4), (2, 1), (1, 1)], 7, 2, 5, 3),
    ([(5, 5)], 4, 1, 4, 1),
    ([(4, 9), (2, 5)], 3, 3, 30, 2),
    ([(3, 3), (2, 2), (1, 2)], 5, 8, 32, 4),
    ([(8, 3), (4, 2)], 2, 1, 71, 2),
    # An encoder's shape (every key queries, queries * L * P >= 4 * keys): the kernel runs head by head on a
    # head-major copy of value; the shapes above keep the inputs' order.
    ([(6, 8), (3, 4), (2, 2)], 64, 4, 32, 4),
]


def _id(config):
    levels, queries, heads, channels, points = config
    return f"L{len(levels)}-q{queries}-m{heads}-d{channels}-p{points}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("config", CONFIGS, ids=_id)
def test_matches_grid_sample_reference(config, dtype):
    levels, queries, heads, channels, points = config
    args = sample_inputs(dtype, 2, levels, queries, heads, channels, points)
    torch.testing.assert_close(opbridge.ms_deform_attn(*args), reference(*args), rtol=TOLERANCE[dtype],
                               atol=TOLERANCE[dtype])  # fmt: skip


def test_an_encoder_too_large_for_the_cache_runs_head_by_head_and_matches_the_reference():
    """Value of 16 MB (8 heads x 64 channels on 8,064 keys, every key a query): the forward runs each head over every
    query, on head-major copies kept in the calling thread's scratch from call to call (ms_deform_attn_head_passes).
    Checked against the reference in torch, twice (the scratch reused) around a smaller call, and in ORT with the
    output the runtime allocates and with a NumPy output 16 bytes past a cache line (IO binding)."""
    levels = [(64, 96), (32, 48), (16, 24)]
    keys = sum(h * w for h, w in levels)
    big = sample_inputs(torch.float32, 1, levels, keys, 8, 64, 4, seed=3)
    small = sample_inputs(torch.float32, 1, [(6, 8), (3, 4), (2, 2)], 64, 4, 32, 4, seed=4)
    # float32 pixel positions on a 96-pixel-wide map are good to about 1e-5 of a pixel, in the op and the reference
    # alike: a tolerance of 1e-4, against errors of order 1 from a wrong head, key or output row.
    tolerance = dict(rtol=1e-4, atol=1e-4)
    want = reference(*big)
    for args, expected in ((big, want), (small, reference(*small)), (big, want)):
        torch.testing.assert_close(opbridge.ms_deform_attn(*args), expected, **tolerance)
    session = opbridge_ort.InferenceSession(_mmdeploy_model())
    feeds = {n: t.numpy() for n, t in zip(NAMES, big, strict=True)}
    expected = want.numpy()
    np.testing.assert_allclose(session.run(None, feeds)[0], expected, **tolerance)
    storage = np.zeros(want.numel() + 16, np.float32)
    offset = (16 - storage.ctypes.data % 64) % 64 // 4  # 16 bytes past a 64-byte line
    out = storage[offset : offset + want.numel()].reshape(want.shape)
    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_cpu_input(name, array)
    binding.bind_output(session.get_outputs()[0].name, "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
    session.run_with_iobinding(binding)
    np.testing.assert_allclose(out, expected, **tolerance)


def _leaves(args):
    return [a.clone().requires_grad_(a.dtype.is_floating_point) for a in args]


@pytest.mark.parametrize("config", CONFIGS, ids=_id)
def test_gradients_match_grid_sample_autograd(config):
    levels, queries, heads, channels, points = config
    args = _leaves(sample_inputs(torch.float64, 2, levels, queries, heads, channels, points))
    grad = torch.randn(2, queries, heads * channels, dtype=torch.float64)
    wrt = [args[0], args[3], args[4]]
    ours = torch.autograd.grad(opbridge.ms_deform_attn(*args), wrt, grad)
    theirs = torch.autograd.grad(reference(*args), wrt, grad)
    for name, a, b in zip(["value", "sampling_locations", "attention_weights"], ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("channels", [4, 30, 32, 64, 71, 1025])
def test_gradcheck(channels):
    heads = 2 if channels < 1025 else 1
    args = _leaves(sample_inputs(torch.float64, 2, [(3, 4), (2, 2), (1, 3)], 3, heads, channels, 2, seed=channels))

    def op(value, locations, weights):
        return opbridge.ms_deform_attn(value, args[1], args[2], locations, weights)

    assert torch.autograd.gradcheck(op, (args[0], args[3], args[4]), fast_mode=channels >= 64)


def test_opcheck():
    args = sample_inputs(torch.float32, 2)
    leaves = [a.requires_grad_(a.dtype.is_floating_point) for a in (t.clone() for t in args)]
    for inputs in (args, leaves):
        torch.library.opcheck(torch.ops.opbridge.ms_deform_attn.default, inputs)


def test_backward_is_deterministic_across_thread_counts():
    args = _leaves(sample_inputs(torch.float32, 2, [(9, 11), (5, 6)], 50, 4, 16, 4))
    grad = torch.randn(2, 50, 64)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2, 1):
            torch.set_num_threads(count)
            results.append(torch.autograd.grad(opbridge.ms_deform_attn(*args), [args[0], args[3], args[4]], grad))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a, b)


def test_locations_far_outside_or_nan_sample_zeros():
    value, shapes, starts, locations, weights = _leaves(sample_inputs(torch.float64, 1))
    far = locations.detach().clone()
    far[0, 0] = float("nan")
    far[0, 1] = 1e30
    far[0, 2] = -float("inf")
    far[0, 3, :, :, :, 0] = float("nan")  # x only
    far.requires_grad_()
    out = opbridge.ms_deform_attn(value, shapes, starts, far, weights)
    assert torch.all(out[0, :4] == 0)
    # The other queries are unaffected: the reference on the finite rows.
    torch.testing.assert_close(
        out[0, 4:], reference(value, shapes, starts, far, weights)[0, 4:], rtol=1e-12, atol=1e-12
    )
    grads = torch.autograd.grad(out.sum(), [value, far, weights])
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.all(grads[1][0, :4] == 0) and torch.all(grads[2][0, :4] == 0)


def test_empty_levels_and_batches():
    # A level of area 0 contributes nothing; the reference drops it.
    value, shapes, starts, locations, weights = sample_inputs(torch.float64, 2, [(0, 4), (3, 3)], 5, 2, 3, 2)
    out = opbridge.ms_deform_attn(value, shapes, starts, locations, weights)
    keep = reference(value, shapes[1:], starts[1:] - 0, locations[:, :, :, 1:], weights[:, :, :, 1:])
    torch.testing.assert_close(out, keep, rtol=1e-12, atol=1e-12)
    empty = sample_inputs(torch.float32, 0)
    assert opbridge.ms_deform_attn(*empty).shape == (0, 7, 10)


def test_integer_level_table_of_any_integer_type():
    args = sample_inputs(torch.float64, 2)
    expected = reference(*args)
    for dtype in (torch.int32, torch.int16):
        got = opbridge.ms_deform_attn(args[0], args[1].to(dtype), args[2].to(dtype), *args[3:])
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_autograd_function_is_the_op():
    args = _leaves(sample_inputs(torch.float64, 2))
    out = opbridge.MSDeformAttnFunction.apply(*args, 64)
    torch.testing.assert_close(out, reference(*args), rtol=1e-12, atol=1e-12)
    out.sum().backward()
    assert args[0].grad is not None and args[3].grad is not None and args[4].grad is not None
    # The explicit forward/backward pair (for code that subclasses it) agrees with the op's autograd.
    fresh = _leaves(sample_inputs(torch.float64, 2))
    direct = super(opbridge.MSDeformAttnFunction, opbridge.MSDeformAttnFunction).apply(*fresh, 64)
    direct.sum().backward()
    torch.testing.assert_close(fresh[3].grad, args[3].grad)


def test_torch_compile_of_a_training_step():
    torch.manual_seed(0)
    layer = opbridge.nn.MultiScaleDeformableAttention(32, 4, 2, 2)
    levels = [(5, 6), (3, 3)]
    value, shapes, starts, _, _ = sample_inputs(torch.float32, 2, levels, 4, 4, 8, 2)
    value = value.reshape(2, -1, 32)
    query, refs = torch.randn(2, 6, 32), torch.rand(2, 6, 2, 2)

    def step(module):
        module.zero_grad()
        loss = module(query, refs, value, shapes, starts).square().mean()
        loss.backward()
        return loss, [p.grad.clone() for p in module.parameters()]

    eager_loss, eager_grads = step(layer)
    compiled_loss, compiled_grads = step(torch.compile(layer, backend="aot_eager", fullgraph=True))
    torch.testing.assert_close(compiled_loss, eager_loss)
    for a, b in zip(compiled_grads, eager_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_module_matches_the_reference_layer_and_has_detr_keys():
    torch.manual_seed(0)
    layer = opbridge.nn.MultiScaleDeformableAttention(16, 2, 2, 3).double()
    assert set(layer.state_dict()) == {f"{m}.{p}" for m in ("sampling_offsets", "attention_weights", "value_proj",
                                                             "output_proj") for p in ("weight", "bias")}  # fmt: skip
    torch.nn.init.normal_(layer.attention_weights.weight)
    levels = [(4, 5), (2, 3)]
    shapes = torch.tensor(levels)
    starts = torch.tensor([0, 20])
    value = torch.randn(2, 26, 16, dtype=torch.float64)
    query = torch.randn(2, 3, 16, dtype=torch.float64)
    mask = torch.zeros(2, 26, dtype=torch.bool)
    mask[1, 20:] = True
    for refs in (torch.rand(2, 3, 2, 2, dtype=torch.float64), torch.rand(2, 3, 2, 4, dtype=torch.float64)):
        out = layer(query, refs, value, shapes, starts, key_padding_mask=mask)
        # Written out from Deformable DETR's MSDeformAttn.forward, with the grid_sample reference.
        v = layer.value_proj(value).masked_fill(mask[..., None], 0.0).view(2, 26, 2, 8)
        offsets = layer.sampling_offsets(query).view(2, 3, 2, 2, 3, 2)
        weights = layer.attention_weights(query).view(2, 3, 2, 6).softmax(-1).view(2, 3, 2, 2, 3)
        if refs.shape[-1] == 2:
            normalizer = torch.tensor([[5, 4], [3, 2]], dtype=torch.float64)
            locations = refs[:, :, None, :, None, :] + offsets / normalizer[None, None, None, :, None, :]
        else:
            locations = refs[:, :, None, :, None, :2] + offsets / 3 * refs[:, :, None, :, None, 2:] * 0.5
        expected = layer.output_proj(reference(v, shapes, starts, locations, weights))
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="reference_points must end in 2"):
        layer(query, torch.rand(2, 3, 2, 3, dtype=torch.float64), value, shapes, starts)


def _export(model, args, opset, dynamo, lowering, dynamic):
    """dynamic: input name -> {axis: name} (legacy) / the same turned into torch.export Dims (dynamo)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            dims = {}
            shapes = tuple(
                {axis: dims.setdefault(name, torch.export.Dim(name)) for axis, name in dynamic.get(n, {}).items()}
                or None
                for n in NAMES[: len(args)]
            )
            return opbridge.onnx.export(model, args, None, opset_version=opset, dynamo=True, lowering=lowering,
                                        input_names=NAMES[: len(args)], dynamic_shapes=shapes)  # fmt: skip
        return opbridge.onnx.export(model, args, None, opset_version=opset, dynamo=False, lowering=lowering,
                                    input_names=NAMES[: len(args)], dynamic_axes=dynamic)  # fmt: skip


class _Op(torch.nn.Module):
    def forward(self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
        return opbridge.ms_deform_attn(value, spatial_shapes, level_start_index, sampling_locations,
                                       attention_weights)  # fmt: skip


LOWERING_CELLS = [(False, 11, "standard"), (False, 13, "standard"), (False, 16, "standard"), (False, 20, "standard"),
                  (False, 12, "custom"), (True, 18, "standard"), (True, 18, "custom")]  # fmt: skip


@pytest.mark.parametrize(("dynamo", "opset", "lowering"), LOWERING_CELLS)
def test_lowerings_at_another_batch_and_image_size(dynamo, opset, lowering):
    args = sample_inputs(torch.float32, 2)
    dynamic = {"value": {0: "batch", 1: "keys"}, "sampling_locations": {0: "batch", 1: "queries"},
               "attention_weights": {0: "batch", 1: "queries"}}  # fmt: skip
    proto = _export(_Op(), args, opset, dynamo, lowering, dynamic)
    ops = {(n.domain, n.op_type) for n in proto.graph.node}
    if lowering == "custom":
        assert ("opbridge", "MultiScaleDeformableAttention") in ops
    else:
        assert all(domain == "" for domain, _ in ops)
        assert (("", "GridSample") in ops) == (opset >= 16)
    session = opbridge_ort.InferenceSession(proto)
    # An empty batch, and no queries (a Reshape's 0 is "the input's size there" unless allowzero says otherwise).
    for batch, levels, queries in [(2, None, 7), (3, [(9, 5), (4, 6), (2, 2), (1, 3)], 11), (0, None, 7), (2, None, 0)]:
        inputs = sample_inputs(torch.float32, batch, levels or [(6, 7), (3, 4), (2, 1), (1, 1)], queries, seed=5)
        (got,) = session.run(None, {n: t.numpy() for n, t in zip(NAMES, inputs, strict=True)})
        assert got.shape == (batch, queries, 10)
        if batch and queries:
            np.testing.assert_allclose(got, reference(*inputs).numpy(), rtol=1e-5, atol=1e-5)


def _mmdeploy_model(dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    """The node mmdeploy's symbolic of MultiScaleDeformableAttnFunction writes (mmdeploy/mmcv/ops/
    multi_scale_deform_attn.py): five inputs, attribute im2col_step, domain mmdeploy."""
    node = helper.make_node("MMCVMultiScaleDeformableAttention", NAMES, ["output"], domain="mmdeploy", im2col_step=64)
    graph = helper.make_graph(
        [node], "mmdeploy_msda",
        # Shapes left open: the kernel, not the runtime's shape check, must catch bad ones.
        [helper.make_tensor_value_info(name, TensorProto.INT64 if "index" in name or "shapes" in name else dtype, None)
         for name in NAMES],
        [helper.make_tensor_value_info("output", dtype, None)],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 11), helper.make_opsetid("mmdeploy", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_mmdeploy_node_runs_on_the_library(dtype):
    proto = _mmdeploy_model(TensorProto.FLOAT if dtype == torch.float32 else TensorProto.DOUBLE)
    session = opbridge_ort.InferenceSession(proto)
    args = sample_inputs(dtype, 2)
    (got,) = session.run(None, {n: t.numpy() for n, t in zip(NAMES, args, strict=True)})
    np.testing.assert_allclose(got, reference(*args).numpy(), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


# Run in a subprocess under OPBRIDGE_CPU_ISA: the torch op's forward and gradients and the ORT node's output for an
# encoder's shape (head-major) and a decoder's (query-major), float32 and float64, written to an .npz.
_ISA_SCRIPT = """
import sys
import numpy as np, torch
import opbridge, opbridge_ort
from opbridge.ops.ms_deform_attn import sample_inputs
sys.path.insert(0, sys.argv[2])
from test_ms_deform_attn import NAMES, _mmdeploy_model
from onnx import TensorProto
out = {}
for dtype, proto in ((torch.float32, TensorProto.FLOAT), (torch.float64, TensorProto.DOUBLE)):
    session = opbridge_ort.InferenceSession(_mmdeploy_model(proto))
    for name, queries in (("encoder", 180), ("decoder", 5)):
        args = sample_inputs(dtype, 2, [(6, 8), (3, 4), (2, 2)], queries, 4, 33, 4, seed=7)
        leaves = [a.clone().requires_grad_(a.dtype.is_floating_point) for a in args]
        result = opbridge.ms_deform_attn(*leaves)
        grads = torch.autograd.grad(result, [leaves[0], leaves[3], leaves[4]], torch.ones_like(result))
        key = f"{name}-{dtype}"
        out[key] = result.detach().numpy()
        out[key + "-ort"] = session.run(None, {n: t.numpy() for n, t in zip(NAMES, args)})[0]
        for i, g in enumerate(grads):
            out[f"{key}-grad{i}"] = g.numpy()
# Half storage (read as stored where the instruction set allows, widened first elsewhere): 32 channels (whole
# registers) and 33 (a tail), float32 or half locations and weights; the ORT float16 node.
session = opbridge_ort.InferenceSession(_mmdeploy_model(TensorProto.FLOAT16))
for name, queries in (("encoder", 180), ("decoder", 5)):
    for channels in (32, 33):
        args = sample_inputs(torch.float32, 2, [(6, 8), (3, 4), (2, 2)], queries, 4, channels, 4, seed=7)
        for dtype in (torch.bfloat16, torch.float16):
            for inputs in ("float32", "half"):
                loc, attn = (a.to(dtype) if inputs == "half" else a for a in args[3:])
                result = opbridge.ms_deform_attn(args[0].to(dtype), args[1], args[2], loc, attn)
                out[f"{name}-{channels}-{dtype}-{inputs}"] = result.view(torch.int16).numpy()
        feeds = [a.half() if a.is_floating_point() else a for a in args]
        out[f"{name}-{channels}-ort-float16"] = session.run(None, {n: t.numpy() for n, t in zip(NAMES, feeds)})[0]
np.savez(sys.argv[1], **out)
"""


def test_every_instruction_set_gives_the_same_bits(tmp_path):
    """The CPU kernels are built once per x86-64 instruction set and chosen at run time (OPBRIDGE_CPU_ISA caps the
    choice): AVX-512F, AVX2 and baseline give the same bits, in torch (forward and gradients) and in ORT, in both of
    the forward's orders, and with bfloat16 and float16 storage (read as stored or widened first, by instruction
    set). On a CPU without an instruction set, the cap above it changes nothing and still agrees."""
    results = {}
    for isa in ("avx512f", "avx2", "baseline"):
        path = tmp_path / f"{isa}.npz"
        env = dict(os.environ, OPBRIDGE_CPU_ISA=isa)
        subprocess.run([sys.executable, "-c", _ISA_SCRIPT, str(path), str(Path(__file__).parent)], env=env,
                       check=True)  # fmt: skip
        results[isa] = dict(np.load(path))
    assert len(results["avx512f"]) == 40
    for isa in ("avx2", "baseline"):
        for key, want in results["avx512f"].items():
            got = results[isa][key]
            error = np.abs(got - want).max()
            assert got.tobytes() == want.tobytes(), f"{key}: {isa} differs from avx512f (max abs difference {error})"


def test_an_unknown_instruction_set_cap_is_named_and_ignored():
    """OPBRIDGE_CPU_ISA with a value that is no instruction set says so on stderr (once) and caps nothing."""
    script = (
        "import torch, opbridge\n"
        "from opbridge.ops.ms_deform_attn import sample_inputs, reference\n"
        "args = sample_inputs(torch.float64, 2)\n"
        "torch.testing.assert_close(opbridge.ms_deform_attn(*args), reference(*args))\n"
        "opbridge.ms_deform_attn(*args)\n"
    )
    env = dict(os.environ, OPBRIDGE_CPU_ISA="AVX-2")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stderr.count("OPBRIDGE_CPU_ISA=AVX-2 is not one of baseline, avx2, avx512f") == 1, done.stderr


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda a: a.__setitem__(2, torch.tensor([0, 41, 54, 56])), ["level_start_index[1] = 41", "must be 42"]),
        (lambda a: a.__setitem__(1, torch.tensor([[6, 7], [3, 4], [2, 1], [1, 2]])), ["cover 58 keys", "57"]),
        (lambda a: a.__setitem__(1, torch.tensor([[6, 7], [3, 4], [-2, 1], [1, 1]])), ["non-negative sizes"]),
        (lambda a: a.__setitem__(3, a[3][..., :1]), ["sampling_locations must have shape"]),
        (lambda a: a.__setitem__(4, a[4][:, :3]), ["attention_weights must have shape"]),
        (lambda a: a.__setitem__(0, a[0][0]), ["value must be 4-D"]),
        (lambda a: a.__setitem__(1, a[1][:2]), ["level_start_index"]),
    ],
)
def test_bad_inputs_give_clear_errors_in_torch_and_ort(change, words):
    args = list(sample_inputs(torch.float32, 2))
    change(args)
    with pytest.raises(RuntimeError) as raised:
        opbridge.ms_deform_attn(*args)
    for word in words:
        assert word in str(raised.value)
    session = opbridge_ort.InferenceSession(_mmdeploy_model())
    with pytest.raises(Exception) as raised:
        session.run(None, {n: t.numpy() for n, t in zip(NAMES, args, strict=True)})
    assert "MMCVMultiScaleDeformableAttention" in str(raised.value)
    for word in words:
        assert word.replace("value must", "input value (index 0) must") in str(raised.value).replace(
            "input spatial_shapes (index 1)", "spatial_shapes").replace(
            "input level_start_index (index 2)", "level_start_index").replace(
            "input sampling_locations (index 3)", "sampling_locations").replace(
            "input attention_weights (index 4)", "attention_weights")  # fmt: skip


@pytest.mark.parametrize(("dynamo", "lowering", "opset"),
                         [(False, "custom", 17), (False, "standard", 17), (False, "standard", 11), (True, "custom", 18),
                          (True, "standard", 18)])  # fmt: skip
def test_detr_encoder_exports_and_runs_at_two_image_sizes(dynamo, lowering, opset):
    """The tutorial's encoder (small: 2 layers, d_model 32, 4 heads, 3 levels, 2 points), exported once, run at
    the exported image size and at another, against eager."""
    torch.manual_seed(0)
    encoder = Encoder(d_model=32, heads=4, levels=3, points=2, layers=2, ffn=64).eval()

    class ThreeLevels(torch.nn.Module):  # named inputs (torch.export's dynamic_shapes follow the signature)
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, level0, level1, level2):
            return self.encoder(level0, level1, level2)

    model = ThreeLevels().eval()
    sizes = [(8, 10), (4, 5), (2, 3)]
    args = features(1, sizes, 32)
    names = [f"level{i}" for i in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            batch = torch.export.Dim("batch")
            shapes = tuple({0: batch, 2: torch.export.Dim(f"h{i}"), 3: torch.export.Dim(f"w{i}")} for i in range(3))
            proto = opbridge.onnx.export(model, args, None, opset_version=opset, dynamo=True, lowering=lowering,
                                         input_names=names, dynamic_shapes=shapes)  # fmt: skip
        else:
            axes = {n: {0: "batch", 2: f"{n}_h", 3: f"{n}_w"} for n in names}
            proto = opbridge.onnx.export(model, args, None, opset_version=opset, dynamo=False, lowering=lowering,
                                         input_names=names, dynamic_axes=axes)  # fmt: skip
    session = opbridge_ort.InferenceSession(proto)
    for batch, run_sizes in [(1, sizes), (2, [(11, 7), (6, 4), (3, 2)])]:
        inputs = features(batch, run_sizes, 32, seed=1)
        (got,) = session.run(None, {n: t.numpy() for n, t in zip(names, inputs, strict=True)})
        with torch.no_grad():
            expected = model(*inputs).numpy()
        np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4)


_ARGS = sample_inputs(torch.float32, 1)

CONTRACT_CASES = {
    "opbridge.ms_deform_attn": [
        (lambda: opbridge.ms_deform_attn(None, *_ARGS[1:]), TypeError, ["value must be a tensor", "NoneType"]),
        (lambda: opbridge.ms_deform_attn(*_ARGS[:3], [0.5], _ARGS[4]), TypeError, ["sampling_locations"]),
        (
            lambda: opbridge.ms_deform_attn(_ARGS[0].int(), *_ARGS[1:]),
            RuntimeError,
            ["float32, float64, float16 or bfloat16"],
        ),
        (
            lambda: opbridge.ms_deform_attn(*_ARGS[:3], _ARGS[3].double(), _ARGS[4]),
            RuntimeError,
            ["sampling_locations must have the dtype of value"],
        ),
        (
            lambda: opbridge.ms_deform_attn(_ARGS[0], _ARGS[1].float(), *_ARGS[2:]),
            RuntimeError,
            ["spatial_shapes must be an integer tensor"],
        ),
        (
            lambda: opbridge.ms_deform_attn(_ARGS[0].to("meta"), *_ARGS[1:]),
            RuntimeError,
            ["one device", "value on meta"],
        ),
    ],
    "opbridge.MSDeformAttnFunction": [
        (lambda: opbridge.MSDeformAttnFunction.apply(None, *_ARGS[1:], 64), TypeError, ["value must be a tensor"]),
    ],
    "opbridge.ms_deform_attn_level_table": [
        (lambda: opbridge.ms_deform_attn_level_table(torch.randn(3)), ValueError, ["features[0]", "[N, C, H, W]"]),
        (lambda: opbridge.ms_deform_attn_level_table(), ValueError, ["feature maps"]),
    ],
    "opbridge.nn.MultiScaleDeformableAttention": [
        (lambda: opbridge.nn.MultiScaleDeformableAttention(30, 8), ValueError, ["num_heads=8", "embed_dims=30"]),
        (lambda: opbridge.nn.MultiScaleDeformableAttention(32, 0), ValueError, ["num_heads must be >= 1"]),
        (lambda: opbridge.nn.MultiScaleDeformableAttention(32.0), TypeError, ["embed_dims"]),
    ],
}
