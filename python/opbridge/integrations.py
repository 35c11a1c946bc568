"""opbridge's ops inside other libraries' models, with one call: :func:`patch_model`.

Hugging Face transformers carries multi-scale deformable attention (MSDA) as a pure-PyTorch ``grid_sample`` loop
in many model families. ``patch_model(model)`` finds those layers in a built model and makes them call
:func:`opbridge.ms_deform_attn` (the C++ kernel: faster eager forward and backward on the CPU, and on CUDA where
opbridge's CUDA library is installed; one ONNX node or a dynamic-shape standard lowering at export), and gives
back a :class:`Patch` that undoes it. What it serves:

* the layer transformers marks for faster kernels (``@use_kernel_forward_from_hub("MultiScaleDeformableAttention")``:
  Deformable DETR, RT-DETR, Grounding DINO, MM Grounding DINO, OmDet-Turbo, LW-DETR, RF-DETR, PP-DocLayout v2-v4 and
  any later family with that layer): found by its class name and call signature, its instances get opbridge's
  forward, as transformers' own ``kernels`` extension point would swap it (that path needs a ``kernels`` release in
  the range the installed transformers accepts, and has no CPU mapping for this layer);
* ``multi_scale_deformable_attention`` of Mask2Former and OneFormer (the same function without
  ``level_start_index``): a module-level function, swapped in its module while the patch is active;
* Ultralytics' RT-DETR (``multi_scale_deformable_attn_pytorch`` in ``ultralytics.nn.modules.transformer``) and
  Roboflow's RF-DETR / LW-DETR in the ``rfdetr`` package (``ms_deform_attn_core_pytorch``, value in its
  ``[N, M, D, S]`` layout): the module-level function the model's attention calls, swapped while the patch is
  active, where its parameters are the ones served (another release: a warning, and nothing swapped); Ultralytics'
  oriented YOLO is left alone: its rotated NMS is Fast-NMS on ProbIoU, not the polygon IoU of ``nms_rotated``;
* ``multi_scale_deformable_attention_v2`` of RT-DETR v2 (a module-level function, swapped while the patch is
  active): served where it computes MSDA (bilinear ``method="default"``, also with per-level point counts, padded
  to the largest with samples the op skips); the ``"discrete"`` (nearest, border-clamped) method falls through to the
  library's own function. D-FINE and DEIMv2 bind that function per instance (``ms_deformable_attn_core``): the
  instances' attribute is swapped, with the same rules.

``patch_model`` also applies the export-time rewrites of :mod:`opbridge.rewrites` to the same modules: the code that
turns the image size into constants of the exported graph (``torch.linspace`` over a feature map's size, the level
table built with ``torch.as_tensor``, a ``torch.tensor`` of sizes) computes the same values from the sizes instead.

Every replacement hands the call back to the library's own code where opbridge's op cannot serve it (a CUDA
tensor without opbridge's CUDA library, tensors on different devices, dtypes the op does not take together), so a
patched model never fails where the unpatched one works.
Half-precision layers (``model.half()``, ``model.bfloat16()``, autocast) are served: the op stores float16/bfloat16
and computes in float32.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

#: The layer name transformers gives the MSDA layer in its kernel hub hook.
HUB_LAYER_NAME = "MultiScaleDeformableAttention"
_HUB_PARAMETERS = ("value", "value_spatial_shapes", "value_spatial_shapes_list", "level_start_index",
                   "sampling_locations", "attention_weights", "im2col_step")  # fmt: skip


def _has_cuda_kernel(op: str) -> bool:
    """Whether this installation runs opbridge::`op` on CUDA tensors (its CUDA library is loaded and has the op)."""
    from . import _extension

    return _extension.cuda_library is not None and f"opbridge::{op}" not in _extension.cuda_refusals


def _served(value: torch.Tensor, *precise: torch.Tensor, op: str = "ms_deform_attn") -> bool:
    """Whether opbridge's op takes these tensors as they come: on one device it runs on (the CPU, or CUDA where the
    CUDA library has the op), in the dtype rules of the op (locations and weights in value's dtype, or float32
    beside float16/bfloat16), or under autocast on that device, whose rule for the op casts them
    (python/opbridge/_autocast.py; it leaves float64 alone)."""
    from ._checks import FLOAT_STORAGE, HALF

    tensors = (value, *precise)
    device = value.device
    if any(t.device != device or t.dtype not in FLOAT_STORAGE for t in tensors):
        return False
    if device.type != "cpu" and not (device.type == "cuda" and _has_cuda_kernel(op)):
        return False
    if torch.is_autocast_enabled(device.type) and (
        all(t.dtype != torch.float64 for t in tensors) or all(t.dtype == torch.float64 for t in tensors)
    ):
        return True
    return all(t.dtype == value.dtype or (value.dtype in HALF and t.dtype == torch.float32) for t in precise)


def _int64(size) -> torch.Tensor:
    if isinstance(size, torch.Tensor):  # a traced size is int64 already: no Cast in the graph
        return size if size.dtype == torch.int64 else size.to(torch.int64)
    return torch.scalar_tensor(size, dtype=torch.int64)


def _level_table(value_spatial_shapes) -> tuple[torch.Tensor, torch.Tensor]:
    """(spatial_shapes [L, 2] int64, level_start_index [L]) from a tensor or a list of (H, W)."""
    if isinstance(value_spatial_shapes, torch.Tensor):
        shapes = value_spatial_shapes.to(torch.int64)
    else:  # sizes as ints, or as the 0-d tensors the TorchScript tracer gives for a traced shape (kept traced)
        shapes = torch.stack([_int64(size) for pair in value_spatial_shapes for size in pair]).view(-1, 2)
    areas = shapes.prod(1)
    return shapes, areas.cumsum(0) - areas  # each level's start: the areas before it (two nodes in a graph)


def _hub_layer_forward(self, value, value_spatial_shapes, value_spatial_shapes_list, level_start_index,
                       sampling_locations, attention_weights, im2col_step):  # fmt: skip
    """The forward of transformers' ``MultiScaleDeformableAttention`` layer, on opbridge's op."""
    from .ops.ms_deform_attn import ms_deform_attn

    if not _served(value, sampling_locations, attention_weights):
        return type(self).forward(self, value, value_spatial_shapes, value_spatial_shapes_list, level_start_index,
                                  sampling_locations, attention_weights, im2col_step)  # fmt: skip
    if torch.jit.is_tracing() and value_spatial_shapes_list is not None:
        # The TorchScript tracer: the library builds value_spatial_shapes with torch.as_tensor, a constant of the
        # trace, while the list holds the traced sizes; the table from the list keeps the image size dynamic.
        shapes, starts = _level_table(value_spatial_shapes_list)
        return ms_deform_attn(value, shapes, starts, sampling_locations, attention_weights)
    return ms_deform_attn(value, value_spatial_shapes.to(torch.int64), level_start_index.to(torch.int64),
                          sampling_locations, attention_weights)  # fmt: skip


def _function_v1(original: Callable) -> Callable:
    """Mask2Former's / OneFormer's ``multi_scale_deformable_attention(value, value_spatial_shapes,
    sampling_locations, attention_weights)`` on opbridge's op."""

    @functools.wraps(original)
    def multi_scale_deformable_attention(value, value_spatial_shapes, sampling_locations, attention_weights):
        from .ops.ms_deform_attn import ms_deform_attn

        if not _served(value, sampling_locations, attention_weights):
            return original(value, value_spatial_shapes, sampling_locations, attention_weights)
        shapes, starts = _level_table(value_spatial_shapes)
        return ms_deform_attn(value, shapes, starts, sampling_locations, attention_weights)

    multi_scale_deformable_attention.__opbridge_original__ = original
    return multi_scale_deformable_attention


class _GradientLikeTheLibrary(torch.autograd.Function):
    """Identity whose backward hands on value's gradient in the memory layout the library's grid_sample loop
    gives it ([N, S, M, D] with S innermost, as from [N, M, D, S]) instead of opbridge's contiguous one. Same values,
    one copy. Why: D-FINE and DEIMv2 feed ``value`` straight from their encoder's feature maps (no projection),
    so its gradient reaches the encoder's BatchNorm layers as a channels-last view whose size-1 batch dim has a
    non-canonical stride, and torch's CPU BatchNorm backward computes wrong gradients from such a tensor (torch
    2.14.1; tests/test_integrations.py::test_value_gradient_reaches_batch_norm_in_a_layout_torch_gets_right). In the
    library's layout the gradient arrives NCHW-contiguous and BatchNorm is right."""

    @staticmethod
    def forward(ctx, value):
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad):
        return grad.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


def _training(value: torch.Tensor) -> bool:
    return value.requires_grad and torch.is_grad_enabled() and not torch.compiler.is_compiling()


#: Where a padded sample lies: outside every map, so the op reads nothing for it and its weight (zero) meets no value.
_OUTSIDE = -8.0


def _points_per_level(sampling_locations, attention_weights, points: list[int]):
    """[N, Lq, M, sum(P_l), 2] and [N, Lq, M, sum(P_l)] with P_l points on level l -> the op's [N, Lq, M, L, P, 2]
    and [N, Lq, M, L, P], P = max(P_l). A level with fewer points is padded with samples outside the map and zero
    weight: the op skips them, so the sum over the real samples is unchanged (same bits) and so are the gradients
    of the real ones."""
    n, queries, heads = sampling_locations.shape[:3]
    most = max(points)
    if len(set(points)) == 1:
        return (sampling_locations.reshape(n, queries, heads, len(points), most, 2),
                attention_weights.reshape(n, queries, heads, len(points), most))  # fmt: skip
    levels_locations, levels_weights = [], []
    for locations, weights, count in zip(sampling_locations.split(points, dim=3),
                                         attention_weights.split(points, dim=3), points, strict=True):  # fmt: skip
        pad = most - count
        if pad:
            locations = torch.cat([locations, locations.new_full((n, queries, heads, pad, 2), _OUTSIDE)], dim=3)
            weights = torch.cat([weights, weights.new_zeros((n, queries, heads, pad))], dim=3)
        levels_locations.append(locations)
        levels_weights.append(weights)
    return torch.stack(levels_locations, dim=3), torch.stack(levels_weights, dim=3)


def _function_v2(original: Callable) -> Callable:
    """RT-DETR v2's / D-FINE's / DEIMv2's ``multi_scale_deformable_attention_v2(value, value_spatial_shapes,
    sampling_locations [N, Lq, M, sum(P_l), 2], attention_weights [N, Lq, M, sum(P_l)], num_points_list,
    method)``: MSDA with bilinear sampling (``method="default"``) and P_l points on level l (the op's P = max(P_l),
    shorter levels padded with samples the op skips); ``"discrete"`` runs the library's function."""

    @functools.wraps(original)
    def multi_scale_deformable_attention_v2(value, value_spatial_shapes, sampling_locations, attention_weights,
                                            num_points_list, method="default"):  # fmt: skip
        from .ops.ms_deform_attn import ms_deform_attn

        points = [int(p) for p in num_points_list]
        if method != "default" or not points or min(points) < 1 or not _served(value, sampling_locations,
                                                                               attention_weights):  # fmt: skip
            return original(value, value_spatial_shapes, sampling_locations, attention_weights, num_points_list,
                            method)  # fmt: skip
        shapes, starts = _level_table(value_spatial_shapes)
        locations, weights = _points_per_level(sampling_locations, attention_weights, points)
        value = _GradientLikeTheLibrary.apply(value) if _training(value) else value
        return ms_deform_attn(value, shapes, starts, locations, weights)

    multi_scale_deformable_attention_v2.__opbridge_original__ = original
    return multi_scale_deformable_attention_v2


def _merged_levels(sampling_locations, attention_weights, levels: int):
    """Locations [N, Lq, M, L * P, 2] (or the op's [N, Lq, M, L, P, 2]) and weights [N, Lq, M, L * P] (or
    [N, Lq, M, L, P]), levels-major as Ultralytics and rfdetr fold them -> the op's layout; None where the shapes do
    not fit that reading (the library's own function then runs)."""
    if sampling_locations.dim() == 6 and attention_weights.dim() in (4, 5):
        n, queries, heads, lv, points = sampling_locations.shape[:5]
        return sampling_locations, attention_weights.reshape(n, queries, heads, lv, points)
    if sampling_locations.dim() != 5 or attention_weights.dim() != 4:
        return None
    # levels x points is the layer's configuration, the same for every input: read as a number, without the
    # TorchScript tracer's note that a traced size became one (the sweep names the first such note as a model's cause)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        total = int(sampling_locations.shape[3])
    if total % levels:
        return None
    n, queries, heads = sampling_locations.shape[:3]
    return (sampling_locations.reshape(n, queries, heads, levels, total // levels, 2),
            attention_weights.reshape(n, queries, heads, levels, total // levels))  # fmt: skip


def _function_ultralytics(original: Callable) -> Callable:
    """Ultralytics' ``multi_scale_deformable_attn_pytorch(value [N, S, M, D], value_spatial_shapes (list of (H, W)),
    sampling_locations [N, Lq, M, L * P, 2] (older releases [N, Lq, M, L, P, 2]), attention_weights
    [N, Lq, M, L * P])`` (RT-DETR's MSDeformAttn) on opbridge's op."""

    @functools.wraps(original)
    def multi_scale_deformable_attn_pytorch(value, value_spatial_shapes, sampling_locations, attention_weights):
        from .ops.ms_deform_attn import ms_deform_attn

        merged = _merged_levels(sampling_locations, attention_weights, len(value_spatial_shapes))
        if merged is None or not _served(value, sampling_locations, attention_weights):
            return original(value, value_spatial_shapes, sampling_locations, attention_weights)
        shapes, starts = _level_table(value_spatial_shapes)
        return ms_deform_attn(value, shapes, starts, *merged)

    multi_scale_deformable_attn_pytorch.__opbridge_original__ = original
    return multi_scale_deformable_attn_pytorch


def _function_rfdetr(original: Callable) -> Callable:
    """rfdetr's ``ms_deform_attn_core_pytorch(value [N, M, D, S], value_spatial_shapes [L, 2], sampling_locations
    [N, Lq, M, L, P, 2] (export mode: [N, Lq, M, L * P, 2]), attention_weights [N, Lq, M, L * P],
    value_spatial_shapes_hw=None)`` (RF-DETR's and LW-DETR's MSDeformAttn) on opbridge's op; the level table from
    the shapes tensor, which keeps the sizes traced at export."""

    @functools.wraps(original)
    def ms_deform_attn_core_pytorch(value, value_spatial_shapes, sampling_locations, attention_weights,
                                    value_spatial_shapes_hw=None):  # fmt: skip
        from .ops.ms_deform_attn import ms_deform_attn

        table = value_spatial_shapes if isinstance(value_spatial_shapes, torch.Tensor) else value_spatial_shapes_hw
        merged = None
        if table is not None and value.dim() == 4:
            merged = _merged_levels(sampling_locations, attention_weights, len(table))
        if merged is None or not _served(value, sampling_locations, attention_weights):
            return original(value, value_spatial_shapes, sampling_locations, attention_weights,
                            value_spatial_shapes_hw=value_spatial_shapes_hw)  # fmt: skip
        shapes, starts = _level_table(table)
        value = value.permute(0, 3, 1, 2)  # [N, M, D, S] -> the op's [N, S, M, D]
        return ms_deform_attn(value, shapes, starts, *merged)

    ms_deform_attn_core_pytorch.__opbridge_original__ = original
    return ms_deform_attn_core_pytorch


#: function name -> wrapper, for the module-level MSDA functions of transformers' families.
_FUNCTIONS = {"multi_scale_deformable_attention": _function_v1, "multi_scale_deformable_attention_v2": _function_v2}

#: Other libraries: (module name prefix, function name) -> (wrapper, the parameters the installed function must have:
#: a release whose function differs is left alone, with a warning, never patched blindly).
_LIBRARY_FUNCTIONS = {
    ("ultralytics.", "multi_scale_deformable_attn_pytorch"): (
        _function_ultralytics,
        ("value", "value_spatial_shapes", "sampling_locations", "attention_weights"),
    ),
    ("rfdetr.", "ms_deform_attn_core_pytorch"): (
        _function_rfdetr,
        ("value", "value_spatial_shapes", "sampling_locations", "attention_weights", "value_spatial_shapes_hw"),
    ),
}


def _swap_library_functions(name: str, source, patch) -> None:
    for (prefix, function_name), (wrap, parameters) in _LIBRARY_FUNCTIONS.items():
        original = getattr(source, function_name, None)
        if not name.startswith(prefix) or not callable(original) or hasattr(original, "__opbridge_original__"):
            continue
        try:
            found = tuple(inspect.signature(original).parameters)
        except (TypeError, ValueError):
            found = ()
        if found != parameters:
            import warnings

            warnings.warn(
                f"opbridge.patch_model: {name}.{function_name} has parameters {found}, not the {parameters} it "
                "serves (another release of the library): left as it is",
                UserWarning,
                stacklevel=3,
            )
            continue
        setattr(source, function_name, wrap(original))
        patch._undo.append(functools.partial(setattr, source, function_name, original))
        patch.swapped.append(f"{name}.{function_name}")


@dataclass
class Patch:
    """What :func:`patch_model` changed; ``restore()`` (or leaving a ``with`` block) undoes it."""

    #: "<qualified class name>" of each layer instance whose forward was swapped, and "<module>.<function>" of
    #: each swapped function or instance attribute.
    swapped: list[str] = field(default_factory=list)
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()
        self.swapped.clear()

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.restore()

    def __bool__(self) -> bool:
        return bool(self.swapped)


def is_hub_msda_layer(module: torch.nn.Module) -> bool:
    """Whether ``module`` is transformers' MSDA layer (class name and forward signature, not a hand list)."""
    cls = type(module)
    if cls.__name__ != HUB_LAYER_NAME or not cls.__module__.startswith("transformers."):
        return False
    if getattr(cls, "kernel_layer_name", HUB_LAYER_NAME) != HUB_LAYER_NAME:
        return False
    try:
        parameters = tuple(inspect.signature(cls.forward).parameters)[1:]
    except (TypeError, ValueError):
        return False
    return parameters == _HUB_PARAMETERS


def patch_model(model: torch.nn.Module) -> Patch:
    """Makes the multi-scale deformable attention of a transformers model run on opbridge's op (see the module
    docs for what is served); returns a :class:`Patch` whose ``restore()`` undoes it (also a context manager).

    The model computes what it computed before (float64: to ~1e-12), trains (opbridge's C++ backward) and exports
    with either exporter (``opbridge::MultiScaleDeformableAttention`` with the ``custom`` lowering, standard ONNX
    ops otherwise, with a dynamic image size). Raises TypeError if ``model`` is not an ``nn.Module``;
    ``bool(patch)`` is False where the model has nothing opbridge serves.

    Layers are patched per instance; the module-level functions of Mask2Former, OneFormer and RT-DETR v2 (and
    Ultralytics' RT-DETR, rfdetr's RF-DETR) are swapped in their module, so until ``restore()`` every model of
    those families in the process runs opbridge's op, not only ``model``: compare against an unpatched model
    after ``restore()`` (or in another process).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"opbridge.patch_model: expected a torch.nn.Module, got {type(model).__name__}")
    patch = Patch()
    modules_seen: set[str] = set()
    for module in model.modules():
        cls = type(module)
        if is_hub_msda_layer(module) and "forward" not in vars(module):
            module.forward = types.MethodType(_hub_layer_forward, module)
            patch._undo.append(functools.partial(vars(module).pop, "forward", None))
            patch.swapped.append(f"{cls.__module__}.{cls.__qualname__}")
        # D-FINE and DEIMv2 bind multi_scale_deformable_attention_v2 at construction: swap the instance's attribute.
        core = vars(module).get("ms_deformable_attn_core")
        if (
            callable(core)
            and getattr(core, "__name__", "") == "multi_scale_deformable_attention_v2"
            and not hasattr(core, "__opbridge_original__")
        ):
            module.ms_deformable_attn_core = _function_v2(core)
            patch._undo.append(functools.partial(setattr, module, "ms_deformable_attn_core", core))
            patch.swapped.append(f"{cls.__module__}.{cls.__qualname__}.ms_deformable_attn_core")
        modules_seen.add(cls.__module__)
    # Mask2Former, OneFormer, RT-DETR v2 (and Ultralytics' RT-DETR, rfdetr's RF-DETR) call a module-level function
    # at call time: swap it in the module.
    for name in sorted(modules_seen):
        source = sys.modules.get(name)
        if source is None:
            continue
        _swap_library_functions(name, source, patch)
        if not name.startswith("transformers."):
            continue
        for function_name, wrap in _FUNCTIONS.items():
            original = getattr(source, function_name, None)
            if callable(original) and not hasattr(original, "__opbridge_original__"):
                setattr(source, function_name, wrap(original))
                patch._undo.append(functools.partial(setattr, source, function_name, original))
                patch.swapped.append(f"{name}.{function_name}")
    # The export-time rewrites of the same modules' size code (opbridge/rewrites.py).
    from . import rewrites

    rewrites.apply(modules_seen, patch)
    rewrites.apply_to_layers(model, patch)
    rewrites.apply_to_language_embeddings(model, patch)
    return patch
