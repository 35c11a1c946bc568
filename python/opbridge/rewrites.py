"""Export-time rewrites: small replacements of library code that turns a model's image size into constants of the
exported graph, applied by :func:`opbridge.patch_model` (and undone by its ``Patch``), in the way mmdeploy's
function rewriters make OpenMMLab models export. Each computes the same values as the code it replaces in eager
mode (tests/test_rewrites.py: equal in float64 and float32) and keeps the sizes symbolic under ``torch.export``
(the default exporter) and traced under the TorchScript exporter.

Each rewrite is version-guarded: it replaces a library function only where that function is the code it was
written for (a fingerprint of its syntax tree, names and docstring aside), and leaves any other release alone with a
warning. What they serve (transformers 5.x):

* ``get_reference_points`` of the deformable encoders (Deformable DETR, Grounding DINO, MM Grounding DINO,
  Mask2Former, OneFormer): the cell centres of each level come from ``torch.linspace(0.5, h - 0.5, h)``, whose
  step count torch.export specializes to the exported size; :func:`reference_points` builds them from
  ``torch.arange(h) + 0.5``, the same numbers (each centre is exact either way).
* ``torch.as_tensor(spatial_shapes_list)`` in the same models' forward (and LW-DETR's and RF-DETR's): a tensor built
  from a list of sizes is a constant of the graph under both exporters. In those modules ``torch`` is replaced by
  :class:`SizeAwareTorch`, which is torch except that ``as_tensor`` of a list of size pairs that are symbolic
  (torch.export) or traced (the TorchScript exporter) stacks them as tensors; for plain numbers it is torch's own.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import sys
import textwrap
import types
import warnings

import torch

__all__ = ["SizeAwareTorch", "apply", "fingerprint", "reference_points"]


def fingerprint(function) -> str | None:
    """A short hash of a function's syntax tree without its name, decorators and docstring, with its local names
    renamed in order of appearance (so ``level`` and ``lvl`` match); None where its source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None
    definition = tree.body[0]
    if not isinstance(definition, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    body = definition.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring
    names: dict[str, str] = {}

    def canonical(name: str) -> str:
        return names.setdefault(name, f"v{len(names)}")

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.Name:
            if node.id not in ("torch", "enumerate", "zip", "range", "len"):
                node.id = canonical(node.id)
            return node

        def visit_arg(self, node: ast.arg) -> ast.arg:
            node.arg = canonical(node.arg)
            node.annotation = None
            return node

    arguments = Rename().visit(definition.args)
    body = [Rename().visit(statement) for statement in body]
    dump = ast.dump(arguments, annotate_fields=False) + "".join(ast.dump(s, annotate_fields=False) for s in body)
    return hashlib.sha256(dump.encode()).hexdigest()[:16]


def reference_points(spatial_shapes_list, valid_ratios: torch.Tensor, device) -> torch.Tensor:
    """The deformable encoder's reference points: for each level (height, width) the centre of every cell,
    (x + 0.5) / (valid ratio * width) and (y + 0.5) / (valid ratio * height), row-major, all levels concatenated,
    [batch, sum(h * w), 1, 2], then times every level's valid ratios: [batch, sum(h * w), levels, 2]. The centres
    come from ``arange`` (a size torch.export keeps symbolic), equal to the linspace of the library's function."""
    points = []
    for level, (height, width) in enumerate(spatial_shapes_list):
        rows = torch.arange(height, dtype=valid_ratios.dtype, device=device) + 0.5
        columns = torch.arange(width, dtype=valid_ratios.dtype, device=device) + 0.5
        y, x = torch.meshgrid(rows, columns, indexing="ij")
        y = y.reshape(-1)[None] / (valid_ratios[:, None, level, 1] * height)
        x = x.reshape(-1)[None] / (valid_ratios[:, None, level, 0] * width)
        points.append(torch.stack((x, y), -1))
    return torch.cat(points, 1)[:, :, None] * valid_ratios[:, None]


#: Fingerprints of the library functions :func:`reference_points` replaces (transformers 5.x's
#: ``get_reference_points`` of Deformable DETR's, Grounding DINO's, MM Grounding DINO's, Mask2Former's and
#: OneFormer's encoders: one function, copied between the families).
REFERENCE_POINTS = {"9ab90eb7cfeee071"}


def _symbolic(size) -> bool:
    return isinstance(size, torch.SymInt) or (isinstance(size, torch.Tensor) and torch.jit.is_tracing())


def _size_tensor(size, dtype: torch.dtype, device) -> torch.Tensor:
    if isinstance(size, torch.Tensor):
        return size.to(dtype=dtype).reshape(())
    return torch.full((), size, dtype=dtype, device=device)


class SizeAwareTorch(types.ModuleType):
    """``torch``, except that ``as_tensor`` of a list of size tuples holding symbolic sizes (torch.export) or traced
    ones (the TorchScript tracer's 0-d tensors) stacks them, so the tensor follows the input's size instead of
    being a constant of the graph. Everything else is torch's own (attribute lookups go to torch)."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str):
        return getattr(torch, name)

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


#: The line of the modules whose ``torch`` becomes :class:`SizeAwareTorch`.
_SPATIAL_SHAPES_LINE = "torch.as_tensor(spatial_shapes_list"


def _swap(patch, owner, name: str, replacement, label: str) -> None:
    original = vars(owner)[name] if name in vars(owner) else getattr(owner, name)
    setattr(owner, name, replacement)
    patch._undo.append(functools.partial(setattr, owner, name, original))
    patch.swapped.append(label)


def apply(module_names, patch) -> None:
    """The rewrites for the transformers modules of a model (``module_names``), recorded in ``patch``."""
    for name in sorted(module_names):
        module = sys.modules.get(name)
        if module is None or not name.startswith("transformers."):
            continue
        for cls in list(vars(module).values()):
            if not isinstance(cls, type) or cls.__module__ != name:
                continue
            raw = vars(cls).get("get_reference_points")
            if not isinstance(raw, staticmethod) or getattr(raw.__func__, "__opbridge_rewrite__", False):
                continue
            found = fingerprint(raw.__func__)
            if found in REFERENCE_POINTS:
                _swap(patch, cls, "get_reference_points", staticmethod(reference_points),
                      f"{name}.{cls.__qualname__}.get_reference_points")  # fmt: skip
            elif "linspace" in (_source(raw.__func__) or ""):
                warnings.warn(
                    f"opbridge.patch_model: {name}.{cls.__qualname__}.get_reference_points is not the code its "
                    f"export rewrite was written for (fingerprint {found}; another transformers release): left as it "
                    "is, so its exported graph may keep the image size it was exported at",
                    UserWarning,
                    stacklevel=3,
                )
        if getattr(module, "torch", None) is torch and _SPATIAL_SHAPES_LINE in (_source(module) or ""):
            _swap(patch, module, "torch", SizeAwareTorch(), f"{name}.torch.as_tensor")


def _source(obj) -> str | None:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return None


reference_points.__opbridge_rewrite__ = True
