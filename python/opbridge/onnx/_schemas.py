"""ONNX schemas of opbridge's custom nodes, registered with onnx.defs.

onnxscript (and so the dynamo exporter) needs a schema to emit a node of a
custom domain, and onnx.checker uses it to validate exported models.
"""

from __future__ import annotations

import threading

from .. import specs
from . import functions

_lock = threading.Lock()
_done_for: tuple[int, int] | None = None  # (specs, functions) already registered


def register_schemas() -> None:
    """Registers the schemas of every custom node and function call (idempotent; imports onnx).

    Called by the exporters' builders, so the schemas exist before a node is emitted,
    and after any op or mapping registered late."""
    global _done_for
    counts = (len(specs.all_specs()), len(functions._FUNCTIONS))
    if counts == _done_for:
        return
    import onnx

    # onnx's reference evaluator (imported by onnxscript's optimizer, which the dynamo exporter runs) indexes
    # every schema by name once, when first imported, and refuses a name in two domains (opbridge::MyAdd and
    # the function opbridge.functions::MyAdd): let it index before opbridge's schemas exist.
    import onnx.reference.op_run
    from onnx.defs import OpSchema

    attribute_types = {
        "int": OpSchema.AttrType.INT,
        "ints": OpSchema.AttrType.INTS,
        "float": OpSchema.AttrType.FLOAT,
        "floats": OpSchema.AttrType.FLOATS,
        "string": OpSchema.AttrType.STRING,
    }
    functions.register_schemas()
    with _lock:
        _register_custom_nodes(onnx, OpSchema, attribute_types)
        _done_for = counts


def _register_custom_nodes(onnx, OpSchema, attribute_types) -> None:
    for spec in specs.all_specs():
        node = spec.custom_node
        if node is None or onnx.defs.has(node.op_type, specs.CUSTOM_DOMAIN):
            continue
        onnx.defs.register_schema(
            OpSchema(
                node.op_type,
                specs.CUSTOM_DOMAIN,
                specs.CUSTOM_DOMAIN_VERSION,
                doc=node.doc,
                inputs=[
                    OpSchema.FormalParameter(
                        name,
                        "tensor(int64)" if name in node.int64_inputs else "T",
                        param_option=OpSchema.FormalParameterOption.Optional
                        if name in node.optional_inputs
                        else OpSchema.FormalParameterOption.Single,
                    )
                    for name in node.inputs
                ],
                attributes=[
                    OpSchema.Attribute(name, attribute_types[kind], "", required=False)
                    for name, kind in node.attributes
                ],
                outputs=[OpSchema.FormalParameter(name, "T") for name in node.outputs],
                type_constraints=[("T", list(node.types), "element types the opbridge ORT library implements")],
            )
        )
