"""ONNX functions written in onnxscript, embedded in exported models.

A ``function`` lowering exports an op as a single call node in the
``opbridge.functions`` domain; the model carries the function's definition, so
any ONNX runtime runs it (no library), and a graph viewer shows one node.

The dynamo exporter inlines model-local functions when it converts opsets, so
both exporters emit the call node as an opaque node and opbridge attaches the
definition after export (:func:`attach`).

Register a function with :func:`register`; the body is a plain function in
onnxscript syntax, using ``op`` (an onnxscript opset) for standard ops::

    from onnxscript import opset18 as op
    from onnxscript.onnx_types import FLOAT

    def Selu(X: FLOAT) -> FLOAT:
        ...
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx
from onnx.defs import OpSchema

from opbridge_ort.inspect import iter_nodes

from .. import specs


@dataclass(frozen=True)
class FunctionDef:
    name: str
    body: Callable
    inputs: Sequence[str]
    outputs: Sequence[str]
    types: Sequence[str]
    doc: str


_FUNCTIONS: dict[str, FunctionDef] = {}


def register(body: Callable, *, inputs: Sequence[str], outputs: Sequence[str] = ("Y",), types=None, doc="") -> str:
    """Registers ``body`` (onnxscript syntax) as the function ``opbridge.functions::<body.__name__>``.

    Returns the function's name, for ``Lowering(kind="function", function=name)``.
    """
    name = body.__name__
    types = tuple(types or ("tensor(float)", "tensor(double)", "tensor(float16)"))
    existing = _FUNCTIONS.get(name)
    if existing is not None and existing.body is not body:
        raise ValueError(f"an ONNX function named {name!r} is already registered in {specs.FUNCTION_DOMAIN}")
    _FUNCTIONS[name] = FunctionDef(name, body, tuple(inputs), tuple(outputs), types, doc)
    if not onnx.defs.has(name, specs.FUNCTION_DOMAIN):
        # onnxscript (the dynamo exporter) needs a schema to emit the call node.
        onnx.defs.register_schema(
            OpSchema(
                name,
                specs.FUNCTION_DOMAIN,
                1,
                doc=doc or f"ONNX function {name}, defined in the model",
                inputs=[OpSchema.FormalParameter(i, "T") for i in inputs],
                outputs=[OpSchema.FormalParameter(o, "T") for o in outputs],
                type_constraints=[("T", list(types), "")],
            )
        )
    return name


@functools.cache
def function_proto(name: str, opset: int) -> onnx.FunctionProto:
    """The definition of function ``name`` for a model whose default opset is ``opset``."""
    import onnxscript

    definition = _FUNCTIONS[name]
    compiled = onnxscript.script(onnxscript.values.Opset(specs.FUNCTION_DOMAIN, 1))(definition.body)
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
