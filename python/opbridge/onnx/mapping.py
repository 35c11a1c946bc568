"""Add an ONNX mapping for any torch op in a few lines, once for both exporters.

    import opbridge

    # aten::logaddexp -> standard ONNX ops, for opsets >= 9
    opbridge.onnx.register_mapping("aten::logaddexp", logaddexp, min_opset=9)

After this, plain ``torch.onnx.export`` (either exporter), ``opbridge.onnx.export``
and ``opbridge.onnx.translation_table()`` use it. ``b`` is a builder
(:mod:`opbridge.onnx.builder`); non-tensor arguments reach the function as
graph constants in the legacy exporter: read them with ``b.value(arg)``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable

import torch

from .. import specs
from . import _legacy


def _schema(torch_op: str):
    """The op's schema; raises ValueError saying what to do if torch does not know the op."""
    namespace, _, name = torch_op.partition("::")
    overload = "default"
    if "." in name:
        name, overload = name.split(".", 1)
    if namespace == "torchvision":
        with contextlib.suppress(Exception):  # if it fails, the op is reported missing below
            import torchvision  # noqa: F401  (registers torchvision's ops)
    try:
        return getattr(getattr(getattr(torch.ops, namespace), name), overload)._schema
    except (AttributeError, RuntimeError):
        hint = (
            "check the spelling" if namespace == "aten" else f"import the library that defines {namespace}'s ops first"
        )
        raise ValueError(f"register_mapping: torch has no op {torch_op!r} ({hint})") from None


def _check_arity(torch_op: str, build: Callable, schema) -> None:
    """``build(b, *args)`` must accept the op's arguments: all of them (the TorchScript-based exporter passes
    every one) and the required ones alone (the dynamo exporter drops trailing arguments left at defaults)."""
    try:
        signature = inspect.signature(build)
    except (TypeError, ValueError):
        return  # a builtin or C function: nothing to check
    arguments = [a for a in schema.arguments if not a.kwarg_only]
    required = [a for a in arguments if not a.has_default_value()]
    for count in {len(arguments), len(required)}:
        try:
            signature.bind(*range(1 + count))
        except TypeError:
            names = ", ".join(a.name for a in arguments)
            raise TypeError(
                f"register_mapping: build must take the builder and {torch_op}'s arguments, build(b, {names}) "
                f"(arguments with defaults may have defaults), got build{signature}"
            ) from None


def register_mapping(
    torch_op: str,
    build: Callable,
    *,
    min_opset: int = 1,
    max_opset: int | None = None,
    kind: str = "standard",
    name: str | None = None,
    function: str | None = None,
    override: bool = False,
) -> specs.OpSpec:
    """Maps ``torch_op`` ("namespace::name", e.g. "aten::logaddexp") to ONNX with ``build(b, *args)``.

    Checked now, not at export: ``torch_op`` must exist in torch (import the library that defines it first),
    ``build`` must be callable with the builder and the op's arguments, ``kind`` one of
    ``"standard"``, ``"custom"``, ``"function"``, and ``min_opset <= max_opset`` (ints >= 1).

    Outside ``[min_opset, max_opset]`` both exporters use their own rule for the op, as without opbridge.
    Mapping an op opbridge already maps (built in, or registered before) raises ValueError unless
    ``override=True``, which replaces that mapping.

    Registers the legacy exporter's symbolic right away; the dynamo exporter's translation is added to every
    export. Returns the op spec (add more lowerings by registering a full :class:`opbridge.specs.OpSpec`).

    Raises:
        TypeError: ``torch_op`` is not a string, ``build`` is not callable or has the wrong arity, an opset is
            not an int.
        ValueError: malformed ``torch_op``, unknown op or kind, empty opset range, or an existing mapping
            without ``override=True``.
    """
    if not isinstance(torch_op, str) or "::" not in torch_op:
        raise ValueError(f"register_mapping: torch_op must be 'namespace::name' (e.g. 'aten::asinh'), got {torch_op!r}")
    if not callable(build):
        raise TypeError(f"register_mapping: build must be a function build(b, *args), got {type(build).__name__}")
    if kind not in specs.LOWERING_KINDS:
        raise ValueError(
            f"register_mapping: kind must be one of {', '.join(map(repr, specs.LOWERING_KINDS))}, got {kind!r}"
        )
    for label, value in (("min_opset", min_opset), ("max_opset", max_opset)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise TypeError(f"register_mapping: {label} must be an int >= 1, got {value!r}")
    if max_opset is not None and max_opset < min_opset:
        raise ValueError(f"register_mapping: min_opset={min_opset} is above max_opset={max_opset}: no opset left")
    if kind == "function" and function is None:
        raise ValueError("register_mapping: a 'function' mapping needs function=<name from opbridge.onnx.functions>")
    _check_arity(torch_op, build, _schema(torch_op))
    existing = [s for s in specs.all_specs() if s.torch_op == torch_op]
    if existing and not override:
        origin = "built into opbridge" if existing[0] in specs.builtin_specs() else "registered before"
        raise ValueError(
            f"register_mapping: {torch_op} already has a mapping ({origin}: {existing[0].name!r}); pass "
            "override=True to replace it"
        )
    for old in existing:
        specs.unregister(old.name)
    spec = specs.register(
        specs.OpSpec(
            name=name or torch_op.replace("::", "."),
            torch_op=torch_op,
            doc=f"{torch_op} (mapping registered with opbridge.onnx.register_mapping)",
            lowerings=[specs.Lowering(kind, build, min_opset=min_opset, max_opset=max_opset, function=function)],
            dynamo_overrides_torch=True,  # the user's rule wins over torch's own, with both exporters
        )
    )
    _legacy.register_symbolics(only=spec)
    return spec
