"""ms_deform_attn's benchmark (float32; Deformable DETR's encoder self-attention: every pixel of every level
queries, d_model 256 = 8 heads x 32 channels, 4 levels, 4 points; an 800x1333 and a 512x512 image at strides 8-64).

    ``ort_custom``  ORT ``opbridge::MultiScaleDeformableAttention``; ``ort_standard``: the GridSample lowering,
    ``torch_op``    ``opbridge.ms_deform_attn``; ``torch_reference``: the grid_sample reference
                    (Deformable DETR's pure-PyTorch path), ``torch_backward`` / ``torch_reference_backward``:
                    the gradients of value, sampling_locations and attention_weights through each.

The report's notes give the forward's rate of gathered value bytes against the triad's memory bandwidth.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from functools import partial

import torch

import opbridge

from . import Bench, Row, Target, check_close, checked_run, ort_session
from .my_add import triad_bandwidth

TARGETS = [
    Target("ort_custom", "ort_standard", 10.0),
    Target("torch_op", "torch_reference", 5.0),
    Target("torch_backward", "torch_reference_backward", 3.0),
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
                record(threads, path, checked_run(path, session, feeds, want, 1e-4, 1e-4))
            record(threads, "torch_op", partial(opbridge.ms_deform_attn, *inputs))
            record(threads, "torch_reference", partial(reference, *inputs))
            ours, theirs = backward_of(opbridge.ms_deform_attn), backward_of(reference)
            for a, b in zip(ours(), theirs(), strict=True):  # float32 sums of thousands of terms
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
    return found
