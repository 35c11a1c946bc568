"""ms_deform_attn's benchmark (float32; Deformable DETR's encoder self-attention: every pixel of every level
queries, d_model 256 = 8 heads x 32 channels, 4 levels, 4 points; an 800x1333 and a 512x512 image at strides 8-64).

    ``ort_custom``  ORT ``opbridge::MultiScaleDeformableAttention``; ``ort_standard``: the GridSample lowering,
                    ``ort_handwritten``: the same computation as a graph written by hand for these static shapes
                    (:func:`handwritten_model`: one GridSample per level, then per level a Mul and a ReduceSum, as
                    a person writing the graph would), the bar that lowering is held to,
                    ``openvino_standard`` / ``openvino_default``: that lowering in OpenVINO's CPU plugin, float32
                    and at the plugin's default precision (``_openvino.py``),
    ``torch_op``    ``opbridge.ms_deform_attn``; ``torch_reference``: the grid_sample reference
                    (Deformable DETR's pure-PyTorch path), ``torch_backward`` / ``torch_reference_backward``:
                    the gradients of value, sampling_locations and attention_weights through each.
    ``roofline``    the essential work alone (``libopbridge_bench``, cpp/bench/gather_roofline.cpp): the same value
                    rows gathered and summed with the same weights, from a table of rows and weights computed
                    beforehand, in the forward's order (value copied head by head, blocks of queries run one head
                    after the other), compiled for this CPU; ``roofline_backward``: the
                    backward's (each row dotted with the output gradient, the weighted gradient added into the
                    row's gradient), head by head as the backward runs. ``ort_custom`` / ``torch_op`` against
                    ``roofline`` is the share of the bound reached (docs/architecture.md).

The report's notes give the forward's rate of gathered value bytes against the triad's memory bandwidth.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import warnings
from functools import partial

import numpy as np
import onnx
import torch

import opbridge

from . import Bench, Row, Target, _openvino, check_close, checked_run, cpu_has_bf16, ort_session
from .my_add import triad_bandwidth

TARGETS = [
    Target("ort_custom", "roofline", 0.5),
    Target("torch_op", "roofline", 0.5),
    Target("torch_backward", "roofline_backward", 0.35),
    Target("ort_custom", "ort_standard", 10.0),
    Target("ort_standard", "ort_handwritten", 0.9),
    Target("ort_custom", "openvino_standard", 1.0),
    Target("torch_op", "torch_reference", 15.0),
    Target("torch_backward", "torch_reference_backward", 3.0),
    # Half precision against the same op in float32 (issue 44's bar on CPUs with bfloat16 instructions; elsewhere the
    # ratio is reported without a bar). The op reads a bfloat16 value as stored, with float32 arithmetic.
    Target("torch_op_bf16", "torch_op", 1.2 if cpu_has_bf16() else None),
    Target("ort_custom_fp16", "ort_custom", None),
]

#: The encoder's feature maps (H, W) at strides 8, 16, 32, 64.
CASES = {
    "800x1333 enc": [(100, 167), (50, 84), (25, 42), (13, 21)],
    "512x512 enc": [(64, 64), (32, 32), (16, 16), (8, 8)],
}
HEADS, CHANNELS, POINTS = 8, 32, 4
_NAMES = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]


def run(bench: Bench) -> None:
    from ...ops.ms_deform_attn import _OpModel, reference

    for case, levels in CASES.items():
        inputs = encoder_inputs(levels)
        want = opbridge.ms_deform_attn(*inputs).numpy()
        torch.testing.assert_close(torch.from_numpy(want), reference(*inputs), rtol=1e-4, atol=1e-4)
        models = {}
        for path, lowering in (("ort_custom", "custom"), ("ort_standard", "standard")):
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                models[path] = opbridge.onnx.export(_OpModel(), inputs, opset_version=17, dynamo=False,
                                                    lowering=lowering, input_names=_NAMES)  # fmt: skip
        models["ort_handwritten"] = handwritten_model(levels, inputs[3].shape[1])
        # float16 deployment (the model after .half()) and bfloat16 training (value bfloat16 under autocast,
        # locations and weights float32).
        half_inputs = tuple(t.half() if t.is_floating_point() else t for t in inputs)
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            half_model = opbridge.onnx.export(_OpModel(), half_inputs, opset_version=17, dynamo=False,
                                              lowering="custom", input_names=_NAMES)  # fmt: skip
        half_want = opbridge.ms_deform_attn(*half_inputs).numpy()
        half_feeds = {n: t.numpy() for n, t in zip(_NAMES, half_inputs, strict=True)}
        bf16_inputs = (inputs[0].bfloat16(), *inputs[1:])
        scale = float(np.abs(want).max())
        feeds = {n: t.numpy() for n, t in zip(_NAMES, inputs, strict=True)}
        leaves = [t.detach().clone().requires_grad_(t.dtype.is_floating_point) for t in inputs]
        wrt = [leaves[0], leaves[3], leaves[4]]
        grad = torch.ones_like(torch.from_numpy(want))

        def backward_of(op, leaves=leaves, wrt=wrt, grad=grad):
            out = op(*leaves)
            return lambda: torch.autograd.grad(out, wrt, grad, retain_graph=True)

        record = partial(bench.record, "ms_deform_attn", case)
        for threads in bench.threads:
            torch.set_num_threads(threads)
            for path, model in models.items():
                session = ort_session(model, threads, path == "ort_custom")
                session_feeds = {i.name: feeds[i.name] for i in session.get_inputs()}
                record(threads, path, checked_run(path, session, session_feeds, want, 1e-4, 1e-4))
            _openvino.record_paths(record, threads, models["ort_standard"], feeds, want, 1e-4, 1e-4)
            roofline_paths(bench, record, threads, inputs, want, grad.numpy())
            record(threads, "torch_op", partial(opbridge.ms_deform_attn, *inputs))
            bf16_out = opbridge.ms_deform_attn(*bf16_inputs).float().numpy()
            check_close("torch_op_bf16", bf16_out, want, 0.02, 0.02 * scale)
            record(threads, "torch_op_bf16", partial(opbridge.ms_deform_attn, *bf16_inputs))
            session = ort_session(half_model, threads, True)
            record(threads, "ort_custom_fp16",
                   checked_run("ort_custom_fp16", session, half_feeds, half_want, 0, 2e-3 * scale))  # fmt: skip
            record(threads, "torch_reference", partial(reference, *inputs))
            ours, theirs = backward_of(opbridge.ms_deform_attn), backward_of(reference)
            smooth = off_the_seams(inputs[3], levels)
            for i, (a, b) in enumerate(zip(ours(), theirs(), strict=True)):  # float32 sums of thousands of terms
                a, b = (a[smooth], b[smooth]) if i == 1 else (a, b)
                check_close("torch_backward", a.numpy(), b.numpy(), 1e-3, 1e-4 * float(b.abs().max()))
            record(threads, "torch_backward", ours)
            record(threads, "torch_reference_backward", theirs)


def encoder_inputs(levels) -> tuple[torch.Tensor, ...]:
    """Encoder self-attention inputs: every pixel queries around its own centre (offsets of a few pixels), as a
    trained Deformable DETR does; softmax-normalized attention weights."""
    from ...ops.ms_deform_attn import sample_inputs

    generator = torch.Generator().manual_seed(0)
    value, shapes, starts, _, _ = sample_inputs(torch.float32, 1, levels, 1, HEADS, CHANNELS, POINTS)
    centres = []
    for height, width in levels:
        y, x = torch.meshgrid((torch.arange(height) + 0.5) / height, (torch.arange(width) + 0.5) / width,
                              indexing="ij")  # fmt: skip
        centres.append(torch.stack([x.flatten(), y.flatten()], -1))
    queries = torch.cat(centres)  # [Lq, 2]
    count = queries.shape[0]
    spread = 2.0 / torch.tensor([[w, h] for h, w in levels], dtype=torch.float32)  # ~2 pixels of each level
    offsets = torch.randn(1, count, HEADS, len(levels), POINTS, 2, generator=generator)
    locations = queries[None, :, None, None, None, :] + offsets * spread[None, None, None, :, None, :]
    weights = torch.randn(1, count, HEADS, len(levels) * POINTS, generator=generator).softmax(-1)
    return value, shapes, starts, locations.contiguous(), weights.view(1, count, HEADS, len(levels), -1)


def off_the_seams(locations: torch.Tensor, levels, pixels: float = 1e-3) -> torch.Tensor:
    """Where the gradient of sampling_locations is defined: the coordinate more than `pixels` from a seam of the
    bilinear grid (x * W - 0.5 an integer), on which the derivative jumps from one cell's slope to the next. There
    float32 rounding picks a side (640x640's encoder has a sample whose x * W - 0.5 is 69.0 in float32 and
    68.999998 in float64: gradients 30.9 and -15.0, each right for its side), so two correct implementations may
    differ by the jump."""
    sizes = torch.tensor([[w, h] for h, w in levels], dtype=torch.float64)  # [L, 2]: x scales by W, y by H
    position = locations.double() * sizes[None, None, None, :, None, :] - 0.5
    return (position - position.round()).abs() > pixels


def handwritten_model(levels, queries: int, batch: int = 1) -> onnx.ModelProto:
    """The forward as an opset-17 graph written by hand with onnx.helper for static shapes (value, sampling_locations
    and attention_weights in, the op's output out), the way Deformable DETR's pure-PyTorch path computes it: value to
    [N*M, D, S] and each level's slice to [N*M, D, H, W]; locations to grid_sample's [-1, 1] and to [N*M, L, Lq, P, 2];
    per level a GridSample (bilinear, zeros, align_corners=0) to [N*M, D, Lq, P], a Mul by that level's weights
    [N*M, 1, Lq, P] and a ReduceSum over P; the levels' Sum, back to [N, Lq, M*D]. (Concatenating the levels before
    one Mul and ReduceSum, as the PyTorch path does, measured slower in ORT.)"""
    from onnx import TensorProto, helper, numpy_helper

    n, lq, m, d, p, count = batch, queries, HEADS, CHANNELS, POINTS, len(levels)
    keys = sum(h * w for h, w in levels)
    nodes, constants = [], {}

    def const(*values: int) -> str:
        name = "c_" + "_".join(str(v).replace("-", "m") for v in values)
        constants.setdefault(name, numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def node(op: str, inputs: list[str], output: str, **attributes) -> str:
        nodes.append(helper.make_node(op, inputs, [output], **attributes))
        return output

    values = node("Reshape", [node("Transpose", ["value"], "value_t", perm=[0, 2, 3, 1]), const(n * m, d, keys)], "v")
    constants["two"] = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    constants["one"] = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    grid = node("Sub", [node("Mul", ["sampling_locations", "two"], "grid_2x"), "one"], "grid")
    grid = node("Transpose", [grid], "grid_t", perm=[0, 2, 3, 1, 4, 5])
    grid = node("Reshape", [grid, const(n * m, count, lq, p, 2)], "grids")
    weights = node("Reshape", [node("Transpose", ["attention_weights"], "attn_t", perm=[0, 2, 1, 3, 4]),
                               const(n * m, 1, lq, count * p)], "attn")  # fmt: skip
    sums, start = [], 0
    for level, (height, width) in enumerate(levels):
        piece = node("Slice", [values, const(start), const(start + height * width), const(2)], f"v{level}")
        piece = node("Reshape", [piece, const(n * m, d, height, width)], f"map{level}")
        where = node("Gather", [grid, const(level)], f"grid{level}", axis=1)  # [N*M, 1, Lq, P, 2]
        where = node("Reshape", [where, const(n * m, lq, p, 2)], f"grid{level}_r")
        sampled = node(
            "GridSample", [piece, where], f"s{level}", mode="bilinear", padding_mode="zeros", align_corners=0
        )
        level_weights = node("Slice", [weights, const(level * p), const((level + 1) * p), const(3)], f"a{level}")
        product = node("Mul", [sampled, level_weights], f"p{level}")
        sums.append(node("ReduceSum", [product, const(-1)], f"r{level}", keepdims=0))  # [N*M, D, Lq]
        start += height * width
    total = node("Reshape", [node("Sum", sums, "total"), const(n, m * d, lq)], "total_r")
    node("Transpose", [total], "out", perm=[0, 2, 1])
    graph = helper.make_graph(
        nodes, "ms_deform_attn_handwritten",
        [helper.make_tensor_value_info("value", TensorProto.FLOAT, [n, keys, m, d]),
         helper.make_tensor_value_info("sampling_locations", TensorProto.FLOAT, [n, lq, m, count, p, 2]),
         helper.make_tensor_value_info("attention_weights", TensorProto.FLOAT, [n, lq, m, count, p])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [n, lq, m * d])], list(constants.values()),
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def corner_table(inputs, head_major: bool, value_head_major: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per (query, head) group, the value rows (key * M + m; ``value_head_major``: m * S + key, rows of value
    copied head by head) of every sample's four bilinear corners and their weights (attention weight times bilinear
    weight), in numpy from the definition; a corner off the map reads its level's first row of the same head with
    weight 0 (a row of its own head: the backward's threads own disjoint heads). Groups query-major or head-major
    (the backward's order)."""
    value, shapes, starts, locations, weights = (t.numpy() for t in inputs)
    heads = value.shape[2]
    rows, taps = [], []
    for level, (height, width) in enumerate(shapes.tolist()):
        x = locations[0, :, :, level, :, 0].astype(np.float64) * width - 0.5  # [Lq, M, P]
        y = locations[0, :, :, level, :, 1].astype(np.float64) * height - 0.5
        x0, y0 = np.floor(x), np.floor(y)
        a = weights[0, :, :, level, :].astype(np.float64)
        for dy in (0, 1):
            for dx in (0, 1):
                xx, yy = x0 + dx, y0 + dy
                inside = (xx >= 0) & (xx < width) & (yy >= 0) & (yy < height)
                bilinear = (1 - np.abs(x - xx)) * (1 - np.abs(y - yy))
                key = starts[level] + np.where(inside, yy * width + xx, 0).astype(np.int64)
                head = np.arange(heads)[None, :, None]
                keys = value.shape[1]
                rows.append(head * keys + key if value_head_major else key * heads + head)  # off the map: see above
                taps.append(np.where(inside, a * bilinear, 0.0))
    row = np.stack(rows, -1).reshape(locations.shape[1], heads, -1)  # [Lq, M, taps]
    weight = np.stack(taps, -1).reshape(row.shape)
    if head_major:
        row, weight = row.transpose(1, 0, 2), weight.transpose(1, 0, 2)
    return np.ascontiguousarray(row, np.int32), np.ascontiguousarray(weight, np.float32)


def forward_order(queries: int, heads: int, samples: int, keys: int, channels: int) -> np.ndarray:
    """The (query, head) groups (index query * M + m) in the order the head-major forward runs them
    (cpp/kernels/ms_deform_attn.h): where value's head-major copy (float32) takes 12 MiB or more
    (ms_deform_attn_head_passes), head 0's queries, then head 1's, ...; below, blocks of queries sized as the kernel
    sizes them (their inputs, float32, in 256 KiB), in each block head 0's queries, then head 1's, ..."""
    if heads * (keys + 1) * channels * 4 >= 12 << 20:
        return (np.arange(queries)[None, :] * heads + np.arange(heads)[:, None]).reshape(-1)
    block = min(1024, max(1, (256 << 10) // (4 * heads * samples * 3)))
    order = []
    for first in range(0, queries, block):
        q = np.arange(first, min(queries, first + block))
        order.append((q[None, :] * heads + np.arange(heads)[:, None]).reshape(-1))
    return np.concatenate(order)


def aligned(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `array` starting on a 64-byte boundary, as the kernels' own buffers do: NumPy's large
    arrays start 16 bytes past one, and a roofline whose 64-byte row loads each span two cache lines is no bound."""
    buffer = np.empty(array.nbytes + 64, np.uint8)
    start = -buffer.ctypes.data % 64
    out = buffer[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def roofline_paths(bench: Bench, record, threads: int, inputs, want: np.ndarray, grad_out: np.ndarray) -> None:
    """Times the forward's and the backward's roofline (cpp/bench/gather_roofline.cpp), each checked first: the
    forward against the op's output, the backward's gradient of value against torch's autograd of the reference."""
    helpers = bench.helpers
    if helpers is None:
        for path in ("roofline", "roofline_backward"):
            record(threads, path, None, "n/a: no --triad-library (libopbridge_bench)")
        return
    for name in ("opbridge_bench_gather_forward", "opbridge_bench_gather_backward"):
        getattr(helpers, name).restype = ctypes.c_int
    value = inputs[0].numpy()
    _, keys, heads, channels = value.shape
    queries = inputs[3].shape[1]
    # The forward's order (cpp/kernels/ms_deform_attn.h, head-major on these encoders): value copied head by head,
    # each head over every query (800x1333) or blocks of queries, each block's queries one head after the other.
    value_t = aligned(value[0].transpose(1, 0, 2))
    rows, weights = corner_table(inputs, head_major=False, value_head_major=True)
    groups, taps = queries * heads, rows.shape[-1]
    order = forward_order(queries, heads, taps // 4, keys, channels)
    rows = aligned(rows.reshape(groups, taps)[order])
    weights = aligned(weights.reshape(groups, taps)[order])
    out = aligned(np.empty((groups, channels), np.float32))

    def forward():
        status = helpers.opbridge_bench_gather_forward(
            ctypes.c_void_p(value_t.ctypes.data), ctypes.c_void_p(rows.ctypes.data),
            ctypes.c_void_p(weights.ctypes.data), ctypes.c_int64(groups), ctypes.c_int64(taps),
            ctypes.c_int64(channels), ctypes.c_void_p(out.ctypes.data), ctypes.c_int(threads),
        )  # fmt: skip
        if status:
            raise RuntimeError("roofline: channels must be 32 or 64")

    forward()
    in_query_order = np.empty_like(out)
    in_query_order[order] = out
    check_close("roofline", in_query_order.reshape(want.shape), want, 1e-4, 1e-4)
    record(threads, "roofline", forward, "gathers and multiply-adds alone, from a table")
    rows_b, weights_b = (aligned(a) for a in corner_table(inputs, head_major=True))
    grad = aligned(grad_out.reshape(queries, heads, channels).transpose(1, 0, 2))
    grad_value = aligned(np.zeros((keys, heads, channels), np.float32))
    dots = aligned(np.empty(rows_b.shape, np.float32))

    def backward():
        grad_value.fill(0.0)
        helpers.opbridge_bench_gather_backward(
            ctypes.c_void_p(value.ctypes.data), ctypes.c_void_p(rows_b.ctypes.data),
            ctypes.c_void_p(weights_b.ctypes.data), ctypes.c_void_p(grad.ctypes.data), ctypes.c_int64(groups),
            ctypes.c_int64(taps), ctypes.c_int64(channels), ctypes.c_int64(heads),
            ctypes.c_void_p(grad_value.ctypes.data), ctypes.c_void_p(dots.ctypes.data), ctypes.c_int(threads),
        )  # fmt: skip

    backward()
    leaf = inputs[0].detach().clone().requires_grad_(True)
    from ...ops.ms_deform_attn import reference

    (expected,) = torch.autograd.grad(reference(leaf, *inputs[1:]), leaf, torch.from_numpy(grad_out))
    check_close("roofline_backward", grad_value, expected[0].numpy(), 1e-3, 1e-4 * float(expected.abs().max()))
    record(threads, "roofline_backward", backward, "gathers, dots and scatters alone, from a table")


def gathered_bytes(levels) -> int:
    """Bytes of value one forward reads per query: heads x levels x points x 4 corners x channels x 4 bytes."""
    return HEADS * len(levels) * POINTS * 4 * CHANNELS * 4


def notes(rows: list[Row]) -> list[str]:
    """The forward's rate of gathered value bytes (GB/s) against the triad's memory bandwidth of the same run."""
    forward = [r for r in rows if r.op == "ms_deform_attn" and r.path in ("ort_custom", "torch_op") and r.median_ms]
    bandwidth = triad_bandwidth(rows) if forward else {}
    found = []
    for r in forward:
        levels = CASES[r.case]
        queries = sum(h * w for h, w in levels)
        rate = queries * gathered_bytes(levels) / (r.median_ms / 1000) / 1e9
        triad_rate = bandwidth.get(r.threads)
        versus = f" (triad: {triad_rate:.1f} GB/s)" if triad_rate else ""
        found.append(f"{r.case}, {r.threads}t, {r.path}: {rate:.1f} GB/s of value gathered{versus}")
    return found + _openvino.notes("ms_deform_attn", rows)
