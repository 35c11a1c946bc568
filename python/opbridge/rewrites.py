"""Export-time rewrites: replacements of library code that turns a model's image size into constants of the
exported graph, applied by :func:`opbridge.patch_model` (and undone by its ``Patch``), in the way mmdeploy's
function rewriters make OpenMMLab models export.

The DETR family builds tensors from sizes in two ways that both exporters freeze: ``torch.as_tensor`` of a list of
(height, width) pairs (the level table: a constant of the graph under either exporter), and ``torch.linspace(a, b,
n)`` with ``n`` a feature map's size (reference points, proposals, position grids: torch.export specializes the
step count to the exported size, the TorchScript tracer records it as a number). In the transformers modules that
do either, patch_model replaces the module's ``torch`` by :class:`SizeAwareTorch`: torch itself, except that
these two functions, given symbolic sizes (torch.export) or traced ones (the TorchScript tracer's 0-d tensors),
build the same numbers from the sizes instead of freezing them. Given plain numbers (eager mode, training) they
are torch's own functions, so a patched model computes exactly what it computed before; tests/test_rewrites.py
checks the exported values at other sizes against eager.

transformers' own helper ``torch_int`` (``int()`` of a size, outside the TorchScript tracer) freezes a symbolic size
too: where a module uses transformers' ``torch_int``, it gets one that hands a symbolic size on as it is (RT-DETR's
and its successors' position embeddings). And the models' export branches, taken under ``torch.jit.is_tracing()``
("always interpolate when tracing": DINOv2's position embeddings in RF-DETR), are taken under torch.export too.

OmDet-Turbo's text embeddings go through content-keyed caches and per-image loops that the exporters unroll for
the exported batch: while an exporter traces, its ``get_language_embedding`` computes them without either
(:func:`apply_to_language_embeddings`), and its decoder's ``len()`` of the batch stays a size.

Ultralytics' heads (RT-DETR's decoder, the YOLO heads) cache anchors built for the last input's size; under
torch.export they forget that size, so the anchors come from the symbolic sizes (:func:`apply_to_layers`).

What it serves (transformers 5.x; found by reading the modules, not from a list): Deformable DETR, Grounding DINO,
MM Grounding DINO, LW-DETR, RF-DETR, Mask2Former, OneFormer (the level table and the reference points), RT-DETR and
the models built on its code (``torch_int``), and every other module of a patched model with ``torch.linspace``.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types

import torch

__all__ = [
    "SizeAwareTorch",
    "apply",
    "apply_to_language_embeddings",
    "apply_to_layers",
    "regroup_by_size",
    "task_embeddings",
]


def _symbolic(size) -> bool:
    return isinstance(size, torch.SymInt) or (isinstance(size, torch.Tensor) and torch.jit.is_tracing())


def _size_tensor(size, dtype: torch.dtype, device) -> torch.Tensor:
    if isinstance(size, torch.Tensor):
        return size.to(device=device, dtype=dtype).reshape(())
    return torch.full((), size, dtype=dtype, device=device)


def _exporting() -> bool:
    """Whether an exporter traces: the TorchScript tracer or torch.export (not torch.compile, not eager mode)."""
    return torch.jit.is_tracing() or torch.compiler.is_exporting()


class _ExportAwareJit(types.ModuleType):
    """``torch.jit``, except that ``is_tracing()`` is also true while torch.export traces: transformers' models take
    their export-friendly branch under tracing ("always interpolate when tracing", DINOv2's position embeddings in
    RF-DETR), and torch.export needs it as much as the TorchScript tracer does."""

    def __init__(self) -> None:
        super().__init__("torch.jit")

    def __getattr__(self, name: str):
        return getattr(torch.jit, name)

    @staticmethod
    def is_tracing() -> bool:
        return _exporting()


class SizeAwareTorch(types.ModuleType):
    """``torch``, except for sizes that are symbolic (torch.export) or traced (the TorchScript tracer's 0-d
    tensors): ``as_tensor`` of a list of size tuples and ``tensor`` of a flat list holding sizes stack them, and
    ``linspace`` with such a step count is
    ``start + arange(steps) * (end - start) / (steps - 1)``, so the tensor follows the input's size instead of being
    a constant of the graph; ``jit.is_tracing()`` is true under torch.export too (the models' export branches). For
    numbers, outside an export, and everything else, it is torch's own (attribute lookups go to torch)."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str):
        return getattr(torch, name)

    jit = _ExportAwareJit()

    @staticmethod
    def as_tensor(data, dtype=None, device=None):
        if (
            isinstance(data, list | tuple)
            and data
            and all(isinstance(row, list | tuple) for row in data)
            and any(_symbolic(size) for row in data for size in row)
        ):
            dtype = dtype or torch.int64
            return torch.stack([torch.stack([_size_tensor(size, dtype, device) for size in row]) for row in data])
        return torch.as_tensor(data, dtype=dtype, device=device)

    @staticmethod
    def tensor(data, *args, dtype=None, device=None, **kwargs):
        # A list of size tuples (OmDet-Turbo's level table) is as_tensor's case.
        if (
            not args
            and not kwargs
            and isinstance(data, list | tuple)
            and data
            and all(isinstance(row, list | tuple) for row in data)
        ):
            return SizeAwareTorch.as_tensor(data, dtype=dtype, device=device)
        # A flat list of numbers and sizes (PP-DocLayout v3's `torch.tensor([width, height, width, height])`): the
        # TorchScript tracer would turn each traced size into a Python number, a constant of the graph.
        if (
            not args
            and not kwargs
            and isinstance(data, list | tuple)
            and any(_symbolic(item) for item in data)
            and all(isinstance(item, int | float | torch.SymInt | torch.Tensor) for item in data)
            and all(not isinstance(item, torch.Tensor) or item.dim() == 0 for item in data)
        ):
            if dtype is None:  # torch.tensor's inference: floating if any item is, else int64
                floating = any(
                    isinstance(item, float) or (isinstance(item, torch.Tensor) and item.is_floating_point())
                    for item in data
                )
                dtype = torch.get_default_dtype() if floating else torch.int64
            return torch.stack([_size_tensor(item, dtype, device) for item in data])
        return torch.tensor(data, *args, dtype=dtype, device=device, **kwargs)

    @staticmethod
    def linspace(start, end, steps, *args, **kwargs):
        if args or not _symbolic(steps) or set(kwargs) - {"dtype", "device"}:
            return torch.linspace(start, end, steps, *args, **kwargs)
        # start + i * (end - start) / (steps - 1), i < steps: the same numbers (the step of a grid of cell centres
        # or corners is 1, exact), with the count a symbolic or traced size.
        dtype = kwargs.get("dtype") or torch.get_default_dtype()
        # Half types compute in float32 and round once, as torch's own linspace does; an integer linspace truncates
        # a float64 one, as torch's. The index is an int64 arange cast to that type: the TorchScript exporter has
        # no arange of a traced count in a half type ("tensor does not have a device").
        work = dtype if dtype in (torch.float32, torch.float64) else torch.float64
        if dtype.is_floating_point and dtype not in (torch.float32, torch.float64):
            work = torch.float32
        index = torch.arange(steps, device=kwargs.get("device"), dtype=torch.int64).to(work)
        if isinstance(steps, torch.Tensor):
            step = torch.as_tensor(end - start, dtype=torch.float64) / (steps - 1).clamp(min=1).to(torch.float64)
            return (index * step.to(work) + start).to(dtype)
        return (index * ((end - start) / torch.sym_max(steps - 1, 1)) + start).to(dtype)


#: The libraries whose modules are rewritten, and the code that makes such a module's ``torch`` become
#: :class:`SizeAwareTorch`: rfdetr builds its level table with ``torch.as_tensor(spatial_shapes_hw)`` under
#: torch.export (a constant of the graph) and takes DINOv2's export branch under ``torch.jit.is_tracing()`` only.
_SIZE_LINES = {
    "transformers.": (
        "torch.as_tensor(spatial_shapes_list",
        "torch.linspace(",
        "torch.tensor([width, height",  # PP-DocLayout v3's mask_to_box_coordinate, OmDet-Turbo's anchors
        "torch.tensor(new_vision_shapes_list",  # OmDet-Turbo's level table
    ),
    "rfdetr.": ("torch.as_tensor(spatial_shapes_hw", "torch.linspace(", "torch.jit.is_tracing()"),
}


def _swap(patch, owner, name: str, replacement, label: str) -> None:
    original = vars(owner)[name] if name in vars(owner) else getattr(owner, name)
    setattr(owner, name, replacement)
    patch._undo.append(functools.partial(setattr, owner, name, original))
    patch.swapped.append(label)


def _size_aware_int(original):
    """transformers' ``torch_int`` (a size as a Python int, or as an int64 tensor under the TorchScript tracer),
    except that a symbolic size (torch.export) stays symbolic: ``int()`` of it would freeze the exported size."""

    @functools.wraps(original)
    def torch_int(x):
        return x if isinstance(x, torch.SymInt) else original(x)

    torch_int.__opbridge_original__ = original
    return torch_int


#: Modules whose ``int()`` of a size builds a tensor (OmDet-Turbo's sine-cosine position embedding,
#: ``torch.arange(int(width))``): their global ``int`` hands a symbolic or traced size on, as ``torch_int`` does.
_INT_LINES = {"transformers.": ("torch.arange(int(width)",)}

#: Modules that take the batch size as ``len()`` of a tensor (OmDet-Turbo's decoder input, whose query indices and
#: views are built from it): the TorchScript tracer makes ``len()`` a number, a constant of the graph. Their global
#: ``len`` gives a tensor's traced or symbolic first size while an exporter traces.
_LEN_LINES = {"transformers.": ("batch_size = len(vision_features)",)}


def _size_aware_builtin_int(value=0, *args):
    """``int``, except that a symbolic (torch.export) or traced (TorchScript tracer) size stays one: ``int()`` of it
    would freeze the exported size. Only integer sizes pass: ``int()`` of a traced float truncates, as before."""
    if (
        not args
        and _symbolic(value)
        and (not isinstance(value, torch.Tensor) or (value.dim() == 0 and not value.is_floating_point()))
    ):
        return value
    return int(value, *args)


def _size_aware_len(obj):
    """``len``, except that a tensor's first size stays a traced (TorchScript tracer) or symbolic (torch.export) size
    while an exporter traces: ``len()`` of it would be a number, the exported batch."""
    if isinstance(obj, torch.Tensor) and obj.dim() > 0 and _exporting():
        return obj.shape[0]
    return len(obj)


def _library_torch_int():
    generic = sys.modules.get("transformers.utils.generic")
    return getattr(generic, "torch_int", None)


def apply(module_names, patch) -> None:
    """The rewrites for the transformers and rfdetr modules of a model (``module_names``), recorded in ``patch``:
    modules whose global ``torch`` is torch and that build tensors from sizes (``_SIZE_LINES``) see
    :class:`SizeAwareTorch` instead. A module whose ``torch`` is something else already (another patch, another
    library's shim) is left alone."""
    for name in sorted(module_names):
        module = sys.modules.get(name)
        lines = next((lines for prefix, lines in _SIZE_LINES.items() if name.startswith(prefix)), None)
        if module is None or lines is None:
            continue
        source = _source(module) or ""
        if getattr(module, "torch", None) is torch and any(line in source for line in lines):
            _swap(patch, module, "torch", SizeAwareTorch(), f"{name}.torch (as_tensor, tensor, linspace)")
        for builtin, replacement, table in (
            ("int", _size_aware_builtin_int, _INT_LINES),
            ("len", _size_aware_len, _LEN_LINES),
        ):
            builtin_lines = next((lines for prefix, lines in table.items() if name.startswith(prefix)), ())
            if builtin not in vars(module) and any(line in source for line in builtin_lines):
                setattr(module, builtin, replacement)
                patch._undo.append(functools.partial(vars(module).pop, builtin, None))
                patch.swapped.append(f"{name}.{builtin} (sizes stay symbolic)")
        library_int = _library_torch_int()
        if library_int is not None and getattr(module, "torch_int", None) is library_int:
            _swap(patch, module, "torch_int", _size_aware_int(library_int), f"{name}.torch_int")


#: Ultralytics' heads keep anchors built for the last input's size and rebuild them when it changes (these lines;
#: ``dynamic=True`` rebuilds them always, which is how Ultralytics' own TorchScript export keeps sizes dynamic).
#: Under torch.export the comparison sees the example's sizes, equal to the last eager call's, so the cached
#: anchors become constants of the graph; ``dynamic=True`` cannot serve torch.export either (RT-DETR's top-k then
#: takes a tensor k). The rewrite forgets the cached size while torch.export traces: the anchors are built from the
#: symbolic sizes, and eager mode rebuilds them on its next call.
_CACHED_SIZES = {"self.shapes != shapes": "shapes", "self.shape != shape": "shape"}


def apply_to_layers(model: torch.nn.Module, patch) -> None:
    """The rewrites of a model's Ultralytics layers that cache a size (``_CACHED_SIZES``), recorded in ``patch``:
    an instance forward that forgets the cached size under torch.export (a bound method, so that a deep copy of the
    model, as Ultralytics' exporter makes, calls its own layer)."""
    for layer in model.modules():
        cls = type(layer)
        if cls.__module__.startswith("ultralytics.") and "forward" not in vars(layer) and _cached_sizes(cls):
            layer.forward = types.MethodType(_forgetting_forward(cls), layer)
            patch._undo.append(functools.partial(vars(layer).pop, "forward", None))
            patch.swapped.append(f"{cls.__module__}.{cls.__qualname__} (anchors from the sizes under torch.export)")


@functools.cache
def _cached_sizes(cls: type) -> tuple[str, ...]:
    source = "".join(_source(k) or "" for k in cls.__mro__ if k.__module__.startswith("ultralytics."))
    return tuple(name for line, name in _CACHED_SIZES.items() if line in source)


@functools.cache
def _forgetting_forward(cls: type):
    """``cls.forward`` with the cached sizes forgotten under torch.export; its signature is the forward's (which
    torch.export matches its dynamic_shapes against)."""
    forward = cls.forward

    @functools.wraps(forward)
    def forgetting(self, *args, **kwargs):
        if not torch.compiler.is_exporting():
            return forward(self, *args, **kwargs)
        # The layer's plain attributes (the cache: size, anchors) as they were before the trace, restored after it:
        # what the trace stores there is symbolic, and an eager call after the export must not meet it.
        before = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        for name in _cached_sizes(cls):
            setattr(self, name, None)
        try:
            return forward(self, *args, **kwargs)
        finally:
            for name in [k for k in vars(self) if not k.startswith("_") and k not in before]:
                delattr(self, name)
            for name, value in before.items():
                setattr(self, name, value)

    return forgetting


#: OmDet-Turbo's text embeddings (transformers' ``get_language_embedding``) go through content-keyed caches, one
#: loop pass per prompt (``.tolist()`` of each prompt's tokens is the key), and regroup the class embeddings image by
#: image in a loop over ``classes_structure``: an exporter unrolls both loops for the exported batch, and a cache
#: filled by an eager call before the export would make its embeddings constants of the graph. The task prompts'
#: embeddings are cut to the longest prompt with ``.item()``, which the TorchScript tracer makes a number: a longer
#: prompt at run time would be cut to the exported prompt's length. The rewrite computes the same embeddings from
#: the inputs while an exporter traces (one text-model call for the classes, one for the tasks, cut to a length
#: computed in the graph, the regrouping as one gather); in eager mode (and under torch.compile) the library's own
#: method runs, caches and all. These lines of the installed code (the model's methods, the language backbone's
#: forward) are what it relies on; where one is missing it is not applied.
_LANGUAGE_EMBEDDING_LINES = {
    "get_language_embedding": ("for size in classes_structure", "pad_size = max_class_size - size"),
    "get_cached_class_embeddings": ('self.language_backbone(not_cached_classes_ids, encode_type="class")',),
    "get_cached_task_embeddings": ('encode_type="task"', "torch.cat(total_task_features, dim=1)"),
}
_LANGUAGE_BACKBONE_LINES = (
    "text_outputs = self.model(hidden_states)",
    "pooled_output = text_outputs[0]",
    "max_len = (mask != 0).sum(1).max().item()",
    "truncated_output = pooled_output[:, :max_len, :]",
    "return truncated_output.transpose(0, 1), truncated_mask",
)


def regroup_by_size(embeddings: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Rows of ``embeddings`` ([sum(sizes), D]) regrouped by group: ``[max(sizes), len(sizes), D]``, group ``b``'s
    rows in column ``b``, zeros past its size. What OmDet-Turbo's loop over ``classes_structure`` builds, as one
    gather that follows the sizes under either exporter."""
    sizes = sizes.to(torch.int64)
    slot = torch.arange(sizes.max(), device=embeddings.device)[:, None]
    row = (torch.cumsum(sizes, 0) - sizes)[None, :] + slot
    row = row.clamp(max=embeddings.shape[0] - 1).clamp(min=0)
    gathered = embeddings[row]
    return torch.where((slot < sizes[None, :])[..., None], gathered, gathered.new_zeros(()))


def task_embeddings(text_model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor):
    """OmDet-Turbo's task prompt embeddings ([length, batch, D]) and mask ([batch, length]), cut to the longest
    prompt (``length``, the most nonzero mask entries of a row) in the graph: what its language backbone computes
    with ``.item()``, which the TorchScript tracer would make the exported prompt's length."""
    pooled = text_model(ids)[0]
    keep = torch.arange((mask != 0).sum(1).max(), device=mask.device)
    return pooled.index_select(1, keep).transpose(0, 1), mask.index_select(1, keep)


@functools.cache
def _language_embedding_rewrite(cls: type, backbone: type):
    """``cls.get_language_embedding``, computed without the caches and loops while an exporter traces; None where
    the installed code is not the code the rewrite serves (``_LANGUAGE_EMBEDDING_LINES``, and
    ``_LANGUAGE_BACKBONE_LINES`` in the forward of ``backbone``, the language backbone's class)."""
    for method, lines in _LANGUAGE_EMBEDDING_LINES.items():
        source = _source(getattr(cls, method, None)) or ""
        if not all(line in source for line in lines):
            return None
    if not all(line in (_source(getattr(backbone, "forward", None)) or "") for line in _LANGUAGE_BACKBONE_LINES):
        return None
    original = cls.get_language_embedding

    @functools.wraps(original)
    def get_language_embedding(self, classes_ids, classes_mask, tasks_ids, tasks_mask, classes_structure):
        if not _exporting():
            return original(self, classes_ids, classes_mask, tasks_ids, tasks_mask, classes_structure)
        classes = self.language_backbone(classes_ids, encode_type="class").to(self.device)
        tasks, task_mask = task_embeddings(self.language_backbone.model, tasks_ids, tasks_mask)
        return regroup_by_size(classes, classes_structure), tasks.to(self.device), task_mask.to(self.device)

    return get_language_embedding


def apply_to_language_embeddings(model: torch.nn.Module, patch) -> None:
    """The rewrite of OmDet-Turbo's text embeddings (``_LANGUAGE_EMBEDDING_LINES``) on each of the model's
    transformers modules that has them, recorded in ``patch``; a module whose installed code differs is left as it
    is, with a warning."""
    for layer in model.modules():
        cls = type(layer)
        owner = next((k for k in cls.__mro__ if "get_language_embedding" in vars(k)), None)
        if owner is None or not owner.__module__.startswith("transformers.") or "get_language_embedding" in vars(layer):
            continue
        if not isinstance(getattr(layer, "language_backbone", None), torch.nn.Module):
            continue  # the method is inherited (OmDet-Turbo's decoder) by a module that has no text model to call
        rewrite = _language_embedding_rewrite(cls, type(layer.language_backbone))
        if rewrite is None:
            import warnings

            warnings.warn(
                f"opbridge.patch_model: {cls.__module__}.{cls.__qualname__}.get_language_embedding is not the code "
                "opbridge's export rewrite serves (another transformers release): left as it is, so an export "
                "keeps the batch it was exported with (ONNX Runtime refuses another batch)",
                UserWarning,
                stacklevel=3,
            )
            continue
        layer.get_language_embedding = types.MethodType(rewrite, layer)
        patch._undo.append(functools.partial(vars(layer).pop, "get_language_embedding", None))
        patch.swapped.append(
            f"{cls.__module__}.{cls.__qualname__}.get_language_embedding (no caches or loops under an exporter)"
        )


def _source(obj) -> str | None:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return None
