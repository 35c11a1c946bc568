"""ONNX functions written in onnxscript, embedded in exported models.

A ``function`` lowering exports an op as a single call node in the
``opbridge.functions`` domain; the model carries the function's definition, so
any ONNX runtime runs it (no library), and a graph viewer shows one node.

The dynamo exporter inlines model-local functions when it converts opsets, so
both exporters emit the call node as an opaque node and opbridge attaches the
definition after export (:func:`attach`).

Register a function with :func:`register`, giving a function that returns the
body: the body is a plain function in onnxscript syntax, using ``op`` (an
onnxscript opset) for standard ops. onnxscript is imported only when a model
needs the function, so declaring one costs nothing at ``import opbridge``::

    def _selu_body():
        from onnxscript import opset18 as op

        def Selu(X):
            ...
            return op.Where(...)

        return Selu

    SELU = functions.register("Selu", _selu_body, inputs=("X",), outputs=("Y",))

Parameters carry no type annotations: a function's types come from the schema
(``types``), and onnxscript accepts only a few annotation forms (it reports the
others as errors while compiling).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import specs

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True)
class FunctionDef:
    name: str
    make_body: Callable[[], Callable]
    inputs: Sequence[str]
    outputs: Sequence[str]
    types: Sequence[str]
    doc: str


_FUNCTIONS: dict[str, FunctionDef] = {}
_schemas_lock = threading.Lock()


def register(
    name: str,
    make_body: Callable[[], Callable],
    *,
    inputs: Sequence[str],
    outputs: Sequence[str] = ("Y",),
    types: Sequence[str] | None = None,
    doc: str = "",
) -> str:
    """Registers the function ``opbridge.functions::<name>``; ``make_body()`` returns its body.

    Returns ``name``, for ``Lowering(kind="function", function=name)``.
    """
    if not callable(make_body):
        raise TypeError(f"make_body must be a function returning the onnxscript body of {name!r}, got {make_body!r}")
    types = tuple(types or ("tensor(float)", "tensor(double)", "tensor(float16)"))
    existing = _FUNCTIONS.get(name)
    if existing is not None and existing.make_body is not make_body:
        raise ValueError(f"an ONNX function named {name!r} is already registered in {specs.FUNCTION_DOMAIN}")
    _FUNCTIONS[name] = FunctionDef(name, make_body, tuple(inputs), tuple(outputs), types, doc)
    return name


def register_schemas() -> None:
    """ONNX schemas of the functions' call nodes: onnxscript (the dynamo exporter) needs
    them to emit the nodes, onnx.checker to validate them. Called by the exporters' builders."""
    import onnx
    from onnx.defs import OpSchema

    with _schemas_lock:
        for definition in _FUNCTIONS.values():
            if onnx.defs.has(definition.name, specs.FUNCTION_DOMAIN):
                continue
            onnx.defs.register_schema(
                OpSchema(
                    definition.name,
                    specs.FUNCTION_DOMAIN,
                    1,
                    doc=definition.doc or f"ONNX function {definition.name}, defined in the model",
                    inputs=[OpSchema.FormalParameter(i, "T") for i in definition.inputs],
                    outputs=[OpSchema.FormalParameter(o, "T") for o in definition.outputs],
                    type_constraints=[("T", list(definition.types), "")],
                )
            )


@functools.cache
def function_proto(name: str, opset: int) -> onnx.FunctionProto:
    """The definition of function ``name`` for a model whose default opset is ``opset``."""
    import onnxscript

    definition = _FUNCTIONS[name]
    compiled = onnxscript.script(onnxscript.values.Opset(specs.FUNCTION_DOMAIN, 1))(definition.make_body())
    proto = compiled.to_function_proto()
    # The body is written against one opset; its ops (chosen to be stable across
    # the lowering's opset range) are declared at the model's version, as ONNX
    # requires a function to import the same default-domain version as its model.
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = opset
    return proto


def attach(model: onnx.ModelProto) -> onnx.ModelProto:
    """Adds the definitions of the opbridge functions that ``model``'s nodes call (in place)."""
    import onnx

    from opbridge_ort.inspect import iter_nodes

    called = {n.op_type for n in iter_nodes(model.graph) if n.domain == specs.FUNCTION_DOMAIN}
    if not called:
        return model
    opsets = {entry.domain: entry.version for entry in model.opset_import}
    default_opset = opsets.get("", opsets.get("ai.onnx", onnx.defs.onnx_opset_version()))
    present = {(f.domain, f.name) for f in model.functions}
    for name in sorted(called):
        if name not in _FUNCTIONS:
            raise KeyError(f"model calls {specs.FUNCTION_DOMAIN}::{name}, which opbridge does not define")
        if (specs.FUNCTION_DOMAIN, name) not in present:
            model.functions.append(function_proto(name, default_opset))
    if specs.FUNCTION_DOMAIN not in opsets:
        model.opset_import.append(onnx.helper.make_opsetid(specs.FUNCTION_DOMAIN, 1))
    return model


def call(name: str, *, set_type: Callable | None = None) -> Callable:
    """A builder lowering that calls function ``name`` (one node)."""

    def build(b, *args):
        out = b.op(name, *args, domain=specs.FUNCTION_DOMAIN)
        if set_type is not None:
            set_type(b, out, *args)
        return out

    return build
