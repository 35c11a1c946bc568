"""ms_deform_attn: multi-scale deformable attention, the core op of Deformable DETR and its family
(DINO, Co-DETR, Mask2Former, GroundingDINO, BEVFormer, ...).

Semantics of Deformable DETR's ``ms_deform_attn_core_pytorch`` and mmcv's
``multi_scale_deformable_attn_pytorch``: for each query and head, the sum over levels and points
of attention weight times the value sampled bilinearly at pixel (x * W_l - 0.5, y * H_l - 0.5),
zero outside the map (``grid_sample`` with ``align_corners=False``, ``padding_mode="zeros"``).

Lowerings (dynamic batch and image size: the level table is read from tensors at run time):

* ``custom``: one ``opbridge::MultiScaleDeformableAttention`` node (any opset), run by opbridge's
  ORT library; the library also runs mmdeploy's ``mmdeploy::MMCVMultiScaleDeformableAttention``.
* ``standard``, opset >= 16: ``GridSample`` per level;
* ``standard``, opset 11-15: a Gather-based bilinear decomposition.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch
from torch import Tensor

from .. import _autocast, _checks, _eager, specs

#: Public names: ``opbridge.<name>``; ``NN_MODULES`` go to ``opbridge.nn``.
__all__ = ["MSDeformAttnFunction", "ms_deform_attn", "ms_deform_attn_level_table"]
NN_MODULES = ["MultiScaleDeformableAttention"]

_OP = "opbridge.ms_deform_attn"


# --- torch ---------------------------------------------------------------------------------------------------------


def ms_deform_attn(
    value: Tensor,
    spatial_shapes: Tensor,
    level_start_index: Tensor,
    sampling_locations: Tensor,
    attention_weights: Tensor,
) -> Tensor:
    """Multi-scale deformable attention: ``torch.ops.opbridge.ms_deform_attn``.

    Args:
        value: ``[N, S, M, D]``, the flattened maps of every level (S = sum of H_l * W_l), M heads of D channels.
        spatial_shapes: ``[L, 2]`` integer, (H_l, W_l) of each level.
        level_start_index: ``[L]`` integer, where each level starts in S (0, H_0 * W_0, ...); must agree
            with ``spatial_shapes``.
        sampling_locations: ``[N, Lq, M, L, P, 2]``, normalized (x, y): 0 and 1 are the map's outer edges.
        attention_weights: ``[N, Lq, M, L, P]``.

    Returns:
        ``[N, Lq, M * D]`` of value's dtype.

    Raises:
        TypeError: an argument is not a tensor.
        RuntimeError: value is not float32/float64/float16/bfloat16, sampling_locations or attention_weights has
            neither value's dtype nor (beside a half value) float32 (the level table: any integer type), the
            tensors are on different devices, the shapes disagree, or the level table does not tile S (the message
            gives the numbers).

    A location outside the map (or NaN) samples zeros. float32, float64, float16 or bfloat16 (sampling_locations
    and attention_weights may stay float32 beside a half value: float32 arithmetic inside, the output rounded once
    to value's dtype; docs/api.md, "Precision and autocast"), on the CPU, or on an NVIDIA GPU with opbridge's CUDA
    library. Differentiable in value, sampling_locations and attention_weights (deterministic C++
    backward on the CPU; on CUDA grad_value is added with atomics; double backward raises).

    On CUDA the level table may be on the GPU (as models build it) or on the CPU. A table on the CPU is checked
    before the kernels run, with a RuntimeError; one on the GPU is not copied to the host (that would synchronize
    every call and keep the op out of CUDA graphs): the kernels check it on the device, and a table that does not
    tile S stops them with a device-side assertion ("device-side assert triggered"), as torch's own CUDA kernels do
    for an index out of range.
    Scriptable, traceable by ``torch.export`` and ``torch.compile``; exports to one
    ``opbridge::MultiScaleDeformableAttention`` node or to standard ONNX ops (see :mod:`opbridge.onnx`).

    Memory: on an encoder's map whose value takes 12 MiB or more (800x1333 with 8 x 32 channels: 23 MB), the
    forward (here and in the ORT node) copies value and the sampling inputs head by head into scratch memory that
    the calling thread keeps for its next call (57 MB for that encoder, at most 512 MiB; docs/architecture.md).
    """
    if not torch.jit.is_scripting():
        for name, tensor in (("value", value), ("spatial_shapes", spatial_shapes),
                             ("level_start_index", level_start_index), ("sampling_locations", sampling_locations),
                             ("attention_weights", attention_weights)):  # fmt: skip
            _checks.tensor(_OP, name, tensor)
        args = (value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
        if _eager.plain(args):  # host time: see opbridge/_eager.py
            return _eager.run(_EagerFunction, torch.ops.opbridge.ms_deform_attn.default, args)
    return torch.ops.opbridge.ms_deform_attn(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    )


@torch.library.register_fake("opbridge::ms_deform_attn")
def _ms_deform_attn_fake(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    op = "opbridge::ms_deform_attn"
    _checks.one_device(op, value=value, sampling_locations=sampling_locations, attention_weights=attention_weights)
    _level_table_device(op, value, spatial_shapes, level_start_index)
    torch._check(
        value.dim() == 4 and sampling_locations.dim() == 6 and attention_weights.dim() == 5,
        lambda: (
            f"{op}: value must be 4-D [N, S, M, D], sampling_locations 6-D [N, Lq, M, L, P, 2] and "
            f"attention_weights 5-D [N, Lq, M, L, P]; got shapes {tuple(value.shape)}, "
            f"{tuple(sampling_locations.shape)} and {tuple(attention_weights.shape)}"
        ),
    )
    _checks.float_storage(op, "value", value)
    for name, tensor in (("sampling_locations", sampling_locations), ("attention_weights", attention_weights)):
        _checks.same_dtype(op, "value", value, name, tensor, precise=True)
    torch._check(
        not spatial_shapes.dtype.is_floating_point and not level_start_index.dtype.is_floating_point,
        lambda: f"{op}: spatial_shapes and level_start_index must be integer tensors (int64)",
    )
    n, _, heads, channels = value.shape
    torch._check(
        sampling_locations.shape[0] == n and sampling_locations.shape[2] == heads,
        lambda: (
            f"{op}: sampling_locations {tuple(sampling_locations.shape)} must match value's batch and heads "
            f"{(n, heads)}"
        ),
    )
    return value.new_empty((n, sampling_locations.shape[1], heads * channels))


AUTOCAST = _autocast.Rule("native", precise=(3, 4))  # locations, weights in float32
_autocast.register("opbridge::ms_deform_attn", AUTOCAST)


def _level_table_device(op: str, value: Tensor, spatial_shapes: Tensor, level_start_index: Tensor) -> None:
    """The level table on value's device or on the CPU, both halves on one (the kernels' rule)."""
    devices = {spatial_shapes.device, level_start_index.device}
    torch._check(
        devices in ({value.device}, {torch.device("cpu")}),
        lambda: (
            f"{op}: spatial_shapes and level_start_index must both be on the device of value ({value.device}) or "
            f"both on the CPU, got {spatial_shapes.device} and {level_start_index.device}"
        ),
    )


@torch.library.register_fake("opbridge::ms_deform_attn_backward")
def _ms_deform_attn_backward_fake(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                                  attention_weights):  # fmt: skip
    _checks.one_device("opbridge::ms_deform_attn_backward", grad_output=grad_output, value=value,
                       sampling_locations=sampling_locations, attention_weights=attention_weights)  # fmt: skip
    return tuple(
        torch.empty_like(t, memory_format=torch.contiguous_format)
        for t in (value, sampling_locations, attention_weights)
    )


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad: Tensor):
    value, spatial_shapes, level_start_index, locations, weights = ctx.saved_tensors
    _checks.alert_not_deterministic("opbridge::ms_deform_attn_backward", value)
    grad_value, grad_locations, grad_weights = torch.ops.opbridge.ms_deform_attn_backward(
        grad, value, spatial_shapes, level_start_index, locations, weights
    )
    needs = ctx.needs_input_grad
    return (
        grad_value if needs[0] else None,
        None,
        None,
        grad_locations if needs[3] else None,
        grad_weights if needs[4] else None,
    )


torch.library.register_autograd("opbridge::ms_deform_attn", _backward, setup_context=_setup_context)


class _EagerFunction(torch.autograd.Function):
    """The registered autograd as a plain Function, for the wrapper's eager calls (opbridge/_eager.py)."""

    @staticmethod
    def forward(ctx, value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
        _setup_context(ctx, (value, spatial_shapes, level_start_index, sampling_locations, attention_weights), None)
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.opbridge.ms_deform_attn.default(
                value, spatial_shapes, level_start_index, sampling_locations, attention_weights
            )

    backward = staticmethod(_backward)


def _no_double_backward(ctx, *grads):
    raise RuntimeError(
        "opbridge::ms_deform_attn: gradients of its gradients (double backward) are not supported; leave "
        "create_graph=False"
    )


torch.library.register_autograd(
    "opbridge::ms_deform_attn_backward", _no_double_backward, setup_context=lambda ctx, inputs, output: None
)


class MSDeformAttnFunction(torch.autograd.Function):
    """Deformable DETR's ``MSDeformAttnFunction`` and mmcv's ``MultiScaleDeformableAttnFunction``, on the CPU
    and exportable: the same call, ``apply(value, spatial_shapes, level_start_index, sampling_locations,
    attention_weights, im2col_step)``, so an existing model switches by one assignment::

        import models.ops.functions.ms_deform_attn_func as detr   # Deformable DETR (and DINO, ...)
        detr.MSDeformAttnFunction = opbridge.MSDeformAttnFunction
        import models.ops.modules.ms_deform_attn as detr_module
        detr_module.MSDeformAttnFunction = opbridge.MSDeformAttnFunction

    ``apply`` calls :func:`ms_deform_attn` (the registered torch op, whose autograd is the same C++ backward),
    so the model also exports with both ONNX exporters, traces with ``torch.export`` and compiles; a Python
    autograd.Function would be opaque to all of them. ``im2col_step`` (a CUDA batching knob) is accepted and
    ignored. ``forward``/``backward`` exist for code that subclasses or calls them directly.
    """

    @staticmethod
    def apply(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, im2col_step=64):
        return ms_deform_attn(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)

    @staticmethod
    def forward(ctx, value, spatial_shapes, level_start_index, sampling_locations, attention_weights, im2col_step=64):
        _setup_context(ctx, (value, spatial_shapes, level_start_index, sampling_locations, attention_weights), None)
        return torch.ops.opbridge.ms_deform_attn(
            value, spatial_shapes, level_start_index, sampling_locations, attention_weights
        )

    @staticmethod
    def backward(ctx, grad_output):
        value, spatial_shapes, level_start_index, locations, weights = ctx.saved_tensors
        grads = torch.ops.opbridge.ms_deform_attn_backward(
            grad_output.contiguous(), value, spatial_shapes, level_start_index, locations, weights
        )
        return grads[0], None, None, grads[1], grads[2], None


class MultiScaleDeformableAttention(torch.nn.Module):
    """The multi-scale deformable attention layer of Deformable DETR (``MSDeformAttn``): sampling offsets and
    attention weights predicted from the query, a value projection of the flattened multi-level maps, the
    op, an output projection. Parameters and ``state_dict`` keys as Deformable DETR's and mmcv's
    (``sampling_offsets``, ``attention_weights``, ``value_proj``, ``output_proj``), and their initialisation.

    ``forward(query, reference_points, value, spatial_shapes, level_start_index, key_padding_mask=None)``:

    * query ``[N, Lq, embed_dims]``; value ``[N, S, embed_dims]`` (the flattened levels);
    * reference_points ``[N, Lq, L, 2]`` normalized (x, y), or ``[N, Lq, L, 4]`` boxes (cx, cy, w, h);
    * spatial_shapes ``[L, 2]``, level_start_index ``[L]`` (integer tensors; take them from the feature
      maps' shapes with tensor ops and an export keeps the image size dynamic);
    * key_padding_mask ``[N, S]`` bool, True where value is padding (zeroed).

    Returns ``[N, Lq, embed_dims]``.
    """

    def __init__(self, embed_dims: int = 256, num_heads: int = 8, num_levels: int = 4, num_points: int = 4) -> None:
        super().__init__()
        op = "opbridge.nn.MultiScaleDeformableAttention"
        embed_dims, num_heads, num_levels, num_points = (
            _checks.int_pair(op, name, (value, value), minimum=1)[0]
            for name, value in (
                ("embed_dims", embed_dims),
                ("num_heads", num_heads),
                ("num_levels", num_levels),
                ("num_points", num_points),
            )
        )
        if embed_dims % num_heads:
            raise ValueError(f"{op}: num_heads={num_heads} must divide embed_dims={embed_dims}")
        self.embed_dims, self.num_heads, self.num_levels, self.num_points = (
            embed_dims,
            num_heads,
            num_levels,
            num_points,
        )
        samples = num_heads * num_levels * num_points
        self.sampling_offsets = torch.nn.Linear(embed_dims, samples * 2)
        self.attention_weights = torch.nn.Linear(embed_dims, samples)
        self.value_proj = torch.nn.Linear(embed_dims, embed_dims)
        self.output_proj = torch.nn.Linear(embed_dims, embed_dims)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Deformable DETR's initialisation: offsets start on a ring of directions (one per head, growing
        with the point index), uniform attention, Xavier-uniform projections."""
        torch.nn.init.constant_(self.sampling_offsets.weight, 0.0)
        angles = torch.arange(self.num_heads, dtype=torch.float32) * (2.0 * math.pi / self.num_heads)
        grid = torch.stack([angles.cos(), angles.sin()], -1)
        grid = (grid / grid.abs().max(-1, keepdim=True)[0]).view(self.num_heads, 1, 1, 2)
        grid = grid.repeat(1, self.num_levels, self.num_points, 1)
        grid = grid * torch.arange(1, self.num_points + 1, dtype=torch.float32).view(1, 1, -1, 1)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(grid.view(-1))
        torch.nn.init.constant_(self.attention_weights.weight, 0.0)
        torch.nn.init.constant_(self.attention_weights.bias, 0.0)
        for linear in (self.value_proj, self.output_proj):
            torch.nn.init.xavier_uniform_(linear.weight)
            torch.nn.init.constant_(linear.bias, 0.0)

    def forward(
        self,
        query: Tensor,
        reference_points: Tensor,
        value: Tensor,
        spatial_shapes: Tensor,
        level_start_index: Tensor,
        key_padding_mask: Optional[Tensor] = None,  # noqa: UP045  (TorchScript)
    ) -> Tensor:
        n, queries = query.shape[0], query.shape[1]
        keys = value.shape[1]
        heads, levels, points = self.num_heads, self.num_levels, self.num_points
        v = self.value_proj(value)
        if key_padding_mask is not None:
            v = v.masked_fill(key_padding_mask[..., None], 0.0)
        v = v.view(n, keys, heads, self.embed_dims // heads)
        offsets = self.sampling_offsets(query).view(n, queries, heads, levels, points, 2)
        weights = self.attention_weights(query).view(n, queries, heads, levels * points).softmax(-1)
        weights = weights.view(n, queries, heads, levels, points)
        if reference_points.shape[-1] == 2:
            # (W, H) in the reference points' precision: under autocast the offsets are bfloat16, in which a
            # 1333-pixel width is 1336.
            dtype = torch.promote_types(offsets.dtype, reference_points.dtype)
            size = torch.stack([spatial_shapes[..., 1], spatial_shapes[..., 0]], -1).to(dtype)
            locations = reference_points[:, :, None, :, None, :] + offsets / size[None, None, None, :, None, :]
        elif reference_points.shape[-1] == 4:
            locations = (reference_points[:, :, None, :, None, :2]
                         + offsets / points * reference_points[:, :, None, :, None, 2:] * 0.5)  # fmt: skip
        else:
            raise ValueError(
                "opbridge.nn.MultiScaleDeformableAttention: reference_points must end in 2 (x, y) or 4 "
                f"(cx, cy, w, h), got shape {tuple(reference_points.shape)}"
            )
        out = ms_deform_attn(v, spatial_shapes, level_start_index, locations, weights)
        return self.output_proj(out)

    def extra_repr(self) -> str:
        return (f"embed_dims={self.embed_dims}, num_heads={self.num_heads}, num_levels={self.num_levels}, "
                f"num_points={self.num_points}")  # fmt: skip


def ms_deform_attn_level_table(*features: Tensor) -> tuple[Tensor, Tensor]:
    """``(spatial_shapes, level_start_index)`` of feature maps ``[N, C, H_l, W_l]``, built with tensor ops from
    their shapes, so that an exported model reads the image size at run time instead of baking it in.

    Raises:
        TypeError: a feature map is not a tensor.
        ValueError: no feature maps, or one that is not 4-D ``[N, C, H, W]``.
    """
    op = "opbridge.ms_deform_attn_level_table"
    if not features:
        raise ValueError(f"{op}: give the feature maps of the levels, [N, C, H, W] each")
    for level, feature in enumerate(features):
        _checks.tensor(op, f"features[{level}]", feature)
        if feature.dim() != 4:
            raise ValueError(f"{op}: features[{level}] must be 4-D [N, C, H, W], got shape {tuple(feature.shape)}")
    if torch.jit.is_tracing():  # the TorchScript-based exporter: sizes as traced tensors
        shapes = torch.stack([torch._shape_as_tensor(f)[-2:] for f in features]).to(torch.int64)
    else:  # eager, torch.export (symbolic sizes become graph values), torch.compile
        shapes = torch.stack([torch.scalar_tensor(size, dtype=torch.int64) for f in features for size in f.shape[-2:]])
        shapes = shapes.view(len(features), 2)
    if features[0].device.type != "cpu":  # on the maps' device, as the model's other tensors (CUDA training)
        shapes = shapes.to(features[0].device)
    areas = shapes[:, 0] * shapes[:, 1]
    starts = torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])
    return shapes, starts


# --- the independent reference: grid_sample per level (Deformable DETR's pure-PyTorch path) ------------------------


def reference(value, spatial_shapes, level_start_index, sampling_locations, attention_weights) -> Tensor:
    """Multi-scale deformable attention from ``torch.nn.functional.grid_sample``, written from the definition
    (Deformable DETR's ``ms_deform_attn_core_pytorch`` semantics): an independent check of the kernel, and the
    baseline of the benchmarks. Differentiable through grid_sample."""
    n, _, heads, channels = value.shape
    _, queries, _, _, points, _ = sampling_locations.shape
    sizes = [(int(h), int(w)) for h, w in spatial_shapes.tolist()]
    starts = [int(s) for s in level_start_index.tolist()]
    grids = 2 * sampling_locations - 1
    out = value.new_zeros(n * heads, channels, queries)
    for level, (height, width) in enumerate(sizes):
        v = value[:, starts[level] : starts[level] + height * width]  # [N, HW, M, D]
        v = v.permute(0, 2, 3, 1).reshape(n * heads, channels, height, width)
        grid = grids[:, :, :, level].permute(0, 2, 1, 3, 4).reshape(n * heads, queries, points, 2)
        sampled = torch.nn.functional.grid_sample(v, grid, mode="bilinear", padding_mode="zeros",
                                                  align_corners=False)  # [NM, D, Lq, P]  # fmt: skip
        weight = attention_weights[:, :, :, level].permute(0, 2, 1, 3).reshape(n * heads, 1, queries, points)
        out = out + (sampled * weight).sum(-1)
    return out.view(n, heads * channels, queries).transpose(1, 2).contiguous()


# --- ONNX ----------------------------------------------------------------------------------------------------------
#
# No lowering needs a static size: heads, channels, levels, points, batch, keys and queries are all read from the
# inputs' shapes at run time (Shape, Gather), so module code that computes them from traced shapes exports with the
# TorchScript-based exporter too. Only the GridSample lowering loops over the levels in the graph; where the exporter
# does not know their count, the level-free Gather lowering serves instead.


def _known(shape, rank: int, index: int) -> int | None:
    return shape[index] if shape is not None and len(shape) == rank else None


def _custom(b, value, spatial_shapes, level_start_index, locations, weights):
    out = b.op("MultiScaleDeformableAttention", value, spatial_shapes, level_start_index, locations, weights,
               domain=specs.CUSTOM_DOMAIN)  # fmt: skip
    v, loc = b.static_shape(value), b.static_shape(locations)
    heads, channels = _known(v, 4, 2), _known(v, 4, 3)
    b.set_type(out, value, [_known(v, 4, 0), _known(loc, 6, 1), heads * channels if heads and channels else None])
    return out


class _Graph:
    """Sizes read at run time, and helpers shared by the standard lowerings."""

    def __init__(self, b, value, locations):
        self.b = b
        self.like = value
        v_shape, loc_shape = b.op("Shape", value), b.op("Shape", locations)
        self.n_1d, self.s_1d, self.m_1d, self.d_1d = (self.part(v_shape, i) for i in range(4))
        self.lq_1d, self.p_1d = self.part(loc_shape, 1), self.part(loc_shape, 4)

    def part(self, shape, index):  # one dim of a Shape output, as a 1-D int64 tensor
        return self.b.op("Gather", shape, self.b.constant([index]), axis=0)

    def shape(self, *parts):  # a Reshape target from ints and 1-D int64 tensors (no -1: empty batches stay valid)
        b = self.b
        return b.op("Concat", *(b.constant(list(p)) if isinstance(p, tuple) else p for p in parts), axis=0)

    def reshape(self, data, *parts, allowzero: bool = False):
        """data to the shape of ``parts`` (see shape()). ``allowzero`` (opset >= 14) where a 0 in it must be a size:
        Reshape takes a 0 for "the input's size there" by default, which is right wherever a 0 can only stand where
        the input has one too, and wrong where it can move to another axis (0 queries in GridSample's grid)."""
        b = self.b
        zeros = {"allowzero": 1} if allowzero and b.opset >= 14 else {}
        return b.op("Reshape", data, self.shape(*parts), **zeros)

    def scalar(self, one_d):
        return self.b.op("Reshape", one_d, self.b.constant([]))

    def const(self, value: float):
        return self.b.constant_like(value, self.like)

    def as_float(self, value):
        b = self.b
        return (
            b.op("CastLike", value, self.like) if b.opset >= 15 else b.op("Cast", value, to=_onnx_dtype(b, self.like))
        )

    def reduce_sum(self, value, axes: list[int]):
        return self.b.reduce("Sum", value, axes)

    def unsqueeze(self, value, axis: int):
        return self.b.unsqueeze(value, axis)


def _onnx_dtype(b, like) -> int:
    import onnx

    return {torch.float32: onnx.TensorProto.FLOAT, torch.float64: onnx.TensorProto.DOUBLE}[b.dtype(like, "value")]


def _levels(b, spatial_shapes, locations, weights) -> int | None:
    """The number of levels if the exporter knows it (from any of the three inputs that carry it)."""
    candidates = (_known(b.static_shape(spatial_shapes), 2, 0), _known(b.static_shape(locations), 6, 3),
                  _known(b.static_shape(weights), 5, 3))  # fmt: skip
    return next((c for c in candidates if c is not None), None)


def _as_int64(b, table):
    """A level table (any integer type) as INT64: the table itself where the exporter knows it is (as models build
    it), a Cast otherwise."""
    try:
        return table if b.dtype(table, "level table") == torch.int64 else b.op("Cast", table, to=7)
    except specs.UnknownToExporter:
        return b.op("Cast", table, to=7)


def _grid_sample(b, value, spatial_shapes, level_start_index, locations, weights):
    """GridSample per level (opset >= 16), as Deformable DETR's pure-PyTorch path, in few nodes: value split into
    its levels at level_start_index (the op's contract, checked in eager: the levels tile S in order), each level's
    P points sampled in one GridSample and weighted and summed over its points there, and the levels added in one
    Sum. (One weighted sum over a Concat of every level's samples is 4 nodes fewer per level but copies the samples,
    [N*M, D, Lq, L*P], once more: 12-18% slower in ONNX Runtime on Deformable DETR's encoders, docs/architecture.md.)
    The Gather lowering serves instead where the number of levels is unknown to the exporter, and for float64 below
    opset 20 (ONNX Runtime has no float64 kernel of GridSample-16)."""
    levels = _levels(b, spatial_shapes, locations, weights)
    if levels is None or (b.opset < 20 and b.dtype(value, "value") == torch.float64):
        return _gathered(b, value, spatial_shapes, level_start_index, locations, weights)
    g = _Graph(b, value, locations)
    shapes, starts = (_as_int64(b, t) for t in (spatial_shapes, level_start_index))
    ends = b.op("Concat", b.op("Slice", starts, b.constant([1]), b.constant([levels])), g.s_1d, axis=0)
    nm_1d = b.op("Mul", g.n_1d, g.m_1d)
    planes = b.op("Transpose", value, perm=[0, 2, 3, 1])  # [N, M, D, S]
    # locations [N, Lq, M, L, P, 2] -> [N, M, Lq, L, P, 2] in [-1, 1]
    grids = b.op("Transpose", b.op("Sub", b.op("Mul", locations, g.const(2.0)), g.const(1.0)), perm=[0, 2, 1, 3, 4, 5])
    # weights [N, Lq, M, L, P] -> [N*M, 1, Lq, L, P]
    attention = g.reshape(b.op("Transpose", weights, perm=[0, 2, 1, 3, 4]), nm_1d, (1,), g.lq_1d, (levels,), g.p_1d)
    mode = "linear" if b.opset >= 20 else "bilinear"
    terms = []
    for level in range(levels):
        at = b.constant([level])
        hw = b.op("Gather", shapes, b.constant(level), axis=0)  # [2]
        plane = b.op("Slice", planes, b.op("Gather", starts, at), b.op("Gather", ends, at), b.constant([3]))
        plane = g.reshape(plane, nm_1d, g.d_1d, hw, allowzero=True)  # [NM, D, H, W]
        grid = b.op("Gather", grids, b.constant(level), axis=3)
        grid = g.reshape(grid, nm_1d, g.lq_1d, g.p_1d, (2,), allowzero=True)  # [NM, Lq, P, 2]: Lq may be 0
        sampled = b.op("GridSample", plane, grid, align_corners=0, mode=mode, padding_mode="zeros")  # [NM, D, Lq, P]
        weight = b.op("Gather", attention, b.constant(level), axis=3)  # [NM, 1, Lq, P]
        terms.append(g.reduce_sum(b.op("Mul", sampled, weight), [3]))  # [NM, D, Lq]
    out = b.op("Sum", *terms) if levels > 1 else terms[0]
    out = g.reshape(out, g.n_1d, b.op("Mul", g.m_1d, g.d_1d), g.lq_1d)
    return b.op("Transpose", out, perm=[0, 2, 1])


def _gathered(b, value, spatial_shapes, level_start_index, locations, weights):
    """Bilinear sampling from Gather (opset >= 11), every level at once: each sample's level gives its map's size
    and start in S by broadcasting over the level axis, so neither the number of levels nor any other size needs
    to be known to the exporter. value goes into rows of D channels, one per (n, key, head); each of a sample's four
    corners reads one row, weighted by its bilinear weight times the attention weight, and by zero where the corner
    lies outside its map (NaN positions count as outside)."""
    g = _Graph(b, value, locations)
    i64 = b.constant
    shapes = b.op("Cast", spatial_shapes, to=7)  # any integer type: INT64
    starts = b.op("Reshape", b.op("Cast", level_start_index, to=7), i64([-1, 1]))  # [L, 1]: broadcasts over P
    heights = b.op("Reshape", b.op("Gather", shapes, i64(0), axis=1), i64([-1, 1]))
    widths = b.op("Reshape", b.op("Gather", shapes, i64(1), axis=1), i64([-1, 1]))
    heights_f, widths_f = g.as_float(heights), g.as_float(widths)

    def position(axis, size):
        # Clamped into [-2, size] (NaN to -2): a position outside the map stays outside, and the casts below
        # only meet finite values.
        p = b.op("Sub", b.op("Mul", b.op("Gather", locations, i64(axis), axis=5), size), g.const(0.5))
        p = b.op("Where", b.op("IsNaN", p), g.const(-2.0), p)
        return b.op("Max", b.op("Min", p, size), g.const(-2.0))

    x, y = position(0, widths_f), position(1, heights_f)  # [N, Lq, M, L, P]
    x0, y0 = b.op("Floor", x), b.op("Floor", y)
    lx, ly = b.op("Sub", x, x0), b.op("Sub", y, y0)
    hx, hy = b.op("Sub", g.const(1.0), lx), b.op("Sub", g.const(1.0), ly)
    hy, ly = b.op("Mul", hy, weights), b.op("Mul", ly, weights)
    last_x, last_y = b.op("Sub", widths_f, g.const(1.0)), b.op("Sub", heights_f, g.const(1.0))
    zero = g.const(0.0)
    heads = g.scalar(g.m_1d)
    # The row of (n, key, m) is (n * S + key) * M + m; key = start + cy * W + cx.
    batch_base = b.op("Reshape", b.op("Mul", b.iota(g.scalar(g.n_1d)), g.scalar(g.s_1d)), i64([-1, 1, 1, 1, 1]))
    head_of_row = b.op("Reshape", b.iota(heads), i64([-1, 1, 1]))  # broadcasts over [N, Lq, M, L, P]
    rows = g.reshape(value, b.op("Mul", b.op("Mul", g.n_1d, g.s_1d), g.m_1d), g.d_1d)  # [N*S*M, D]
    terms = []
    for dy, dx, wy, wx in ((0, 0, hy, hx), (0, 1, hy, lx), (1, 0, ly, hx), (1, 1, ly, lx)):
        cx = b.op("Add", x0, g.const(float(dx))) if dx else x0
        cy = b.op("Add", y0, g.const(float(dy))) if dy else y0
        inside = b.op(
            "And",
            b.op("And", b.op("Not", b.op("Less", cx, zero)), b.op("Not", b.op("Greater", cx, last_x))),
            b.op("And", b.op("Not", b.op("Less", cy, zero)), b.op("Not", b.op("Greater", cy, last_y))),
        )
        weight = b.op("Where", inside, b.op("Mul", wy, wx), zero)
        # Clamped into the map so that every index is valid (its weight is zero where it was outside).
        ix = b.op("Cast", b.op("Max", b.op("Min", cx, last_x), zero), to=7)
        iy = b.op("Cast", b.op("Max", b.op("Min", cy, last_y), zero), to=7)
        key = b.op("Add", starts, b.op("Add", b.op("Mul", iy, widths), ix))
        row = b.op("Add", b.op("Mul", b.op("Add", batch_base, key), heads), head_of_row)
        terms.append(b.op("Mul", b.op("Gather", rows, row, axis=0), g.unsqueeze(weight, 5)))  # [N, Lq, M, L, P, D]
    out = g.reduce_sum(b.op("Sum", *terms), [3, 4])  # [N, Lq, M, D]
    return g.reshape(out, g.n_1d, g.lq_1d, b.op("Mul", g.m_1d, g.d_1d))


def _value_typed(lowering):
    """The lowering with sampling_locations and attention_weights in value's element type. Eager has the three in
    one dtype (the op checks it), but an exporter can type them otherwise: the TorchScript exporter computes
    transformers' reference points (``torch.linspace(..., dtype=float32)``) in float64, so the locations reach the
    graph as double beside a float value, which ORT's kernels (GridSample, opbridge's node) refuse. A Cast to value's
    type is what eager computes; where the exporter knows no dtype, CastLike (opset >= 15) does the same at run time."""

    @functools.wraps(lowering)
    def typed(b, value, spatial_shapes, level_start_index, locations, weights):
        try:
            want = b.dtype(value, "value")
            cast = [t if b.dtype(t, "sampling input") == want else b.op("Cast", t, to=_onnx_dtype(b, value))
                    for t in (locations, weights)]  # fmt: skip
        except specs.UnknownToExporter:
            cast = [b.op("CastLike", t, value) for t in (locations, weights)] if b.opset >= 15 else [locations, weights]
        return lowering(b, value, spatial_shapes, level_start_index, *cast)

    return typed


# Half storage (specs.half_storage): float32 inside, as the op computes; the custom node's float16 kernel takes a
# float16 model as it is.
_LOWERINGS = [
    specs.Lowering(
        "standard",
        specs.half_storage(_value_typed(_grid_sample)),
        min_opset=16,
        note="GridSample per level (float64 < opset 20: Gather)",
    ),
    specs.Lowering(
        "standard",
        specs.half_storage(_value_typed(_gathered)),
        min_opset=11,
        max_opset=15,
        note="Gather bilinear decomposition",
    ),
    specs.Lowering(
        "custom",
        specs.half_storage(_value_typed(_custom), native=(torch.float16,)),
        min_opset=9,
        note="opbridge::MultiScaleDeformableAttention",
    ),
]


# --- parity ---------------------------------------------------------------------------------------------------------

#: (H, W) of the parity levels: a non-square map, a 1-pixel-wide one, and a 1x1.
_LEVELS = [(6, 7), (3, 4), (2, 1), (1, 1)]
_HEADS, _CHANNELS, _QUERIES, _POINTS = 2, 5, 7, 3


class _OpModel(torch.nn.Module):
    def forward(self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
        return ms_deform_attn(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)


class _FunctionModel(torch.nn.Module):
    def forward(self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
        return MSDeformAttnFunction.apply(value, spatial_shapes, level_start_index, sampling_locations,
                                          attention_weights, 64)  # fmt: skip


class _ShapeReadingModel(torch.nn.Module):
    """The op as module code often calls it: head size, levels and points read from the traced shapes
    (``N, S, C = value.shape; value.view(N, S, heads, C // heads)``), so the exporter sees computed sizes."""

    def forward(self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
        flat = value.flatten(2)  # [N, S, C], as a value projection gives it
        n, keys, embed = flat.shape
        heads = _HEADS  # a module's constant, as in real layers
        queries, levels, points = sampling_locations.shape[1], spatial_shapes.shape[0], attention_weights.shape[-1]
        v = flat.view(n, keys, heads, embed // heads)
        locations = sampling_locations.reshape(n, queries, -1).view(n, queries, heads, levels, points, 2)
        weights = attention_weights.reshape(n, queries, -1).view(n, queries, heads, levels, points)
        return ms_deform_attn(v, spatial_shapes, level_start_index, locations, weights)


def sample_inputs(dtype: torch.dtype, batch: int, levels=_LEVELS, queries: int = _QUERIES, heads: int = _HEADS,
                  channels: int = _CHANNELS, points: int = _POINTS, seed: int = 0) -> tuple[Tensor, ...]:  # fmt: skip
    """Inputs of the op: locations spread a little beyond [0, 1] (some samples fall off the map)."""
    generator = torch.Generator().manual_seed(seed + 1000 * batch)
    shapes = torch.tensor(levels, dtype=torch.int64)
    areas = shapes[:, 0] * shapes[:, 1]
    starts = torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])
    keys = int(areas.sum())
    value = torch.randn(batch, keys, heads, channels, generator=generator, dtype=torch.float64)
    locations = torch.rand(batch, queries, heads, len(levels), points, 2, generator=generator, dtype=torch.float64)
    locations = locations * 1.2 - 0.1
    weights = torch.rand(batch, queries, heads, len(levels), points, generator=generator, dtype=torch.float64)
    return value.to(dtype), shapes, starts, locations.to(dtype), weights.to(dtype)


def _sample_inputs(dtype: torch.dtype, operands: str, batch: int):
    return sample_inputs(dtype, batch)


def _known_gaps(cell) -> str | None:
    return None


specs.register(
    specs.OpSpec(
        name="ms_deform_attn",
        torch_op="opbridge::ms_deform_attn",
        doc="multi-scale deformable attention (Deformable DETR)",
        lowerings=_LOWERINGS,
        custom_node=specs.CustomNode(
            op_type="MultiScaleDeformableAttention",
            inputs=("value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"),
            outputs=("output",),
            types=("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"),
            doc="Deformable DETR's multi-scale deformable attention: output [N, Lq, M * D].",
            int64_inputs=("spatial_shapes", "level_start_index"),
        ),
        dtypes=(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        call_paths={"torch.ops": _OpModel, "autograd.Function": _FunctionModel, "shape-reading": _ShapeReadingModel},
        sample_inputs=_sample_inputs,
        input_names=("value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"),
        reference=reference,
        known_gaps=_known_gaps,
    )
)
