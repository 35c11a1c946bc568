"""Op specs: each opbridge op declared once, with its ONNX lowerings per opset.

From these specs come the legacy exporter's symbolics (opbridge.onnx._legacy),
the dynamo exporter's translations (opbridge.onnx._dynamo), the ONNX schemas of
the custom nodes (opbridge.onnx._schemas), the parity matrix (opbridge.tools.parity)
and the docs' tables. An op's spec lives in its own module
(``python/opbridge/ops/<op>.py``, or ``python/opbridge/mappings/<name>.py`` for
export rules of ops that torch or torchvision own), which ``import opbridge``
finds and imports: adding an op edits no list.

This module imports nothing heavy (no onnx, onnxscript or torchvision): specs
are declared at ``import opbridge``; what a lowering needs is imported when an
export runs it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import _checks

#: Lowering kinds: only standard ONNX ops / one node of opbridge's ORT library /
#: one call of an ONNX function (written in onnxscript) embedded in the model.
LOWERING_KINDS = ("standard", "custom", "function")
CUSTOM_DOMAIN = "opbridge"
CUSTOM_DOMAIN_VERSION = 1
#: Domain of the model-local ONNX functions of ``function`` lowerings.
FUNCTION_DOMAIN = "opbridge.functions"


@dataclass(frozen=True)
class Lowering:
    """One way to express an op in ONNX, valid for opsets [min_opset, max_opset].

    ``build(b, *args)`` adds the nodes through a builder (opbridge.onnx.builder),
    which serves both exporters. A ``function`` lowering names an ONNX function
    (``function``, see opbridge.onnx.functions) that the exported model carries.
    """

    kind: str
    build: Callable[..., Any]
    min_opset: int = 1
    max_opset: int | None = None
    function: str | None = None
    #: what the lowering emits, for the docs' op table (e.g. "DeformConv"); default: the kind alone
    note: str = ""

    def supports(self, opset: int) -> bool:
        return opset >= self.min_opset and (self.max_opset is None or opset <= self.max_opset)


@dataclass(frozen=True)
class CustomNode:
    """The schema of the op's node in the opbridge domain (for the custom lowering)."""

    op_type: str
    inputs: Sequence[str]
    outputs: Sequence[str]
    types: Sequence[str]
    doc: str
    optional_inputs: Sequence[str] = ()
    #: (name, "int" | "ints" | "float" | "floats" | "string") of each (optional) attribute.
    attributes: Sequence[tuple[str, str]] = ()
    #: inputs of type int64 whatever ``types`` says (sizes, indices).
    int64_inputs: Sequence[str] = ()
    #: outputs of type int64 whatever ``types`` says (indices).
    int64_outputs: Sequence[str] = ()


@dataclass(frozen=True)
class OpSpec:
    """An opbridge op: its torch op, its lowerings, and how to test it."""

    name: str
    torch_op: str  # "namespace::name", the TORCH_LIBRARY schema name
    doc: str
    lowerings: Sequence[Lowering]
    custom_node: CustomNode | None = None
    #: dtypes the op supports; the parity matrix runs each.
    dtypes: Sequence[torch.dtype] = (torch.float32,)
    #: name -> factory of an nn.Module calling the op that way (torch op, pybind, autograd.Function, ...).
    #: The parity matrix runs each; an op without call paths is not in the matrix. A factory that takes an
    #: ``operands`` argument is given the operand kind (e.g. einsum's equation): build them with :meth:`module`.
    call_paths: dict[str, Callable[[], torch.nn.Module]] = field(default_factory=dict)
    #: (dtype, operands, batch) -> example inputs; ``operands`` is one of ``operand_kinds``.
    #: The parity matrix finds the batch dims by comparing two batch sizes.
    sample_inputs: Callable[[torch.dtype, str, int], tuple[torch.Tensor, ...]] | None = None
    operand_kinds: Sequence[str] = ("default",)
    input_names: Sequence[str] = ()
    #: independent reference implementation (plain torch math), for tests; called with the sample inputs, and
    #: with ``path=`` (the call path's name) and ``operands=`` (the operand kind) too when it takes them.
    reference: Callable[..., torch.Tensor] | None = None
    #: parity tolerances that differ from the defaults: dtype name -> (rtol, atol).
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: cell -> why it is expected not to run (e.g. ORT has no kernel), or None. Such a
    #: cell is still run; if it fails, the matrix shows n/a with this reason, not a failure.
    known_gaps: Callable[[Any], str | None] | None = None
    #: whether the torch op can exist in this environment (e.g. torchvision's ops need a
    #: torchvision whose compiled ops load); checked when the matrix or an export needs the op,
    #: never at import. None: always.
    available: Callable[[], bool] | None = None
    #: for an op torch's dynamo exporter translates itself (aten, torchvision): whether the standard lowering
    #: replaces torch's rule there too (because it is missing or wrong); otherwise the mapping serves the
    #: TorchScript-based exporter, and custom/function lowerings both.
    dynamo_overrides_torch: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return self.torch_op.split("::")[0]

    @property
    def symbolic_name(self) -> str:
        """``namespace::name`` without an overload (``aten::scatter_reduce.two`` -> ``aten::scatter_reduce``): the
        key of the TorchScript-based exporter's symbolic registry."""
        return self.torch_op.split(".")[0]

    def module(self, path: str, operands: str | None = None) -> torch.nn.Module:
        """The call path's module in eval mode, for ``operands`` (default: the first operand kind) if its factory
        takes them."""
        factory = self.call_paths[path]
        if "operands" in inspect.signature(factory).parameters:
            return factory(operands=operands or self.operand_kinds[0]).eval()
        return factory().eval()

    def is_available(self) -> bool:
        return self.available is None or bool(self.available())

    def resolve_overload(self) -> Any | None:
        """The torch OpOverload if its library is loaded, else None; never imports a library."""
        namespace, name = self.torch_op.split("::")
        name, _, overload = name.partition(".")
        try:
            return getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
        except (AttributeError, RuntimeError):
            return None

    def lowering(self, kind: str, opset: int) -> Lowering:
        """The lowering of ``kind`` valid at ``opset``; raises LoweringError (saying what exists) if none."""
        if kind not in LOWERING_KINDS:
            raise ValueError(f"unknown lowering {kind!r}; choose one of {', '.join(LOWERING_KINDS)}")
        if kind != "standard" and not any(lw.kind == kind for lw in self.lowerings):
            kind = "standard"  # an op with no lowering of this kind at all keeps its standard one
        for lowering in self.lowerings:
            if lowering.kind == kind and lowering.supports(opset):
                return lowering
        available = (
            ", ".join(f"{lw.kind} (opset {lw.min_opset}..{lw.max_opset or 'newest'})" for lw in self.lowerings)
            or "none"
        )
        raise LoweringError(
            f"{self.torch_op} has no {kind!r} ONNX lowering at opset {opset}. Available: {available}. "
            "Pick another opset or lowering in opbridge.onnx.export(..., opset_version=..., lowering=...)."
        )


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch, for gaps that depend on it."""
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


#: The half storage types: float32 arithmetic inside, one rounding (docs/api.md, "Precision and autocast").
HALF_DTYPES = _checks.HALF


def _known_dtype(b, value) -> torch.dtype | None:
    if value is None or isinstance(value, (bool, int, float, str, list, tuple)):
        return None
    try:
        return b.dtype(value)
    except (LoweringError, AttributeError, TypeError, RuntimeError):
        return None


def half_storage(
    build: Callable[..., Any], *, native: Sequence[torch.dtype] = (), floating_output: bool | Sequence[bool] = True
):
    """``build`` for half storage (docs/api.md, "Precision and autocast"): where the op's first argument is float16
    or bfloat16, its half arguments are cast to float32, ``build`` builds in float32 and the output is cast back,
    which is the op's own arithmetic (float32, one rounding) on any runtime: ORT has no bfloat16 GridSample, no
    float16 DeformConv and no float16 GridSample on CUDA, and a decomposition in half arithmetic would round at every
    node. ``native``: the half dtypes
    ``build``'s nodes take as they are where every floating argument has that dtype (a custom node with a float16
    kernel); ``floating_output`` False: the output is not floating (indices) and stays as built; a sequence: per
    output of a build that returns several (cummax's values and indices)."""

    @functools.wraps(build)
    def lowered(b, *args, **kwargs):
        main = _known_dtype(b, args[0]) if args else None
        if main not in HALF_DTYPES:
            return build(b, *args, **kwargs)
        dtypes = [_known_dtype(b, a) for a in args]
        keyword_dtypes = {k: _known_dtype(b, v) for k, v in kwargs.items()}
        floating = [d for d in (*dtypes, *keyword_dtypes.values()) if d is not None and d.is_floating_point]
        if main in native and all(d == main for d in floating):
            return build(b, *args, **kwargs)
        args = [b.cast(a, torch.float32) if d in HALF_DTYPES else a for a, d in zip(args, dtypes, strict=True)]
        kwargs = {k: b.cast(v, torch.float32) if keyword_dtypes[k] in HALF_DTYPES else v for k, v in kwargs.items()}
        out = build(b, *args, **kwargs)
        if isinstance(out, (tuple, list)):
            floating = [floating_output] * len(out) if isinstance(floating_output, bool) else floating_output
            return tuple(b.cast(o, main) if f else o for o, f in zip(out, floating, strict=True))
        single = floating_output if isinstance(floating_output, bool) else floating_output[0]
        return b.cast(out, main) if single else out

    return lowered


class LoweringError(RuntimeError):
    """An op cannot be expressed in ONNX with the requested lowering and opset."""


class UnknownToExporter(LoweringError):
    """The lowering needs a dtype, rank or size that the exporter does not know at this node (e.g. inside a
    ``prim::Loop`` block, where the TorchScript-based exporter loses dtypes). For an op torch has its own rule for,
    the export hands the node back to that rule (as without opbridge) instead of failing."""


_REGISTRY: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"an opbridge op named {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Removes a spec (``register_mapping(..., override=True)`` replacing a mapping)."""
    _REGISTRY.pop(name, None)
    _BUILTIN.discard(name)


def get(name: str) -> OpSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no opbridge op named {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def all_specs() -> list[OpSpec]:
    return list(_REGISTRY.values())


_BUILTIN: set[str] = set()


def mark_builtin() -> None:
    """Called by ``import opbridge`` once the op modules and mappings are imported: what ships with opbridge,
    as opposed to mappings users register later."""
    _BUILTIN.update(_REGISTRY)


def builtin_specs() -> list[OpSpec]:
    return [spec for name, spec in _REGISTRY.items() if name in _BUILTIN]


#: Why a model of opset >= 22 with RoiAlign or MaxRoiPool does not run in ONNX Runtime (a known-gap reason).
ORT_NO_OPSET22_ROI_KERNELS = (
    "ONNX Runtime (<= 1.31, CPU) has no kernel for RoiAlign-22 / MaxRoiPool-22, the versions an opset >= 22 model "
    "uses: export with opset_version <= 21"
)


def torchvision_op_loads(name: str) -> Callable[[], bool]:
    """An ``OpSpec.available`` for a torchvision op: True when torchvision imports and its compiled op ``name``
    loads (not on e.g. the CPU-only torch). Imports torchvision only when first called; the answer is kept."""

    @functools.cache
    def available() -> bool:
        try:
            import torchvision  # noqa: F401

            return hasattr(torch.ops.torchvision, name)
        except Exception:  # no torchvision, or its compiled ops do not load
            return False

    return available
