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
                outputs=[
                    OpSchema.FormalParameter(name, "tensor(int64)" if name in node.int64_outputs else "T")
                    for name in node.outputs
                ],
                type_constraints=[("T", list(node.types), "element types the opbridge ORT library implements")],
            )
        )


#: Domain of placeholder nodes for op outputs that have no ONNX form (e.g. torchvision::roi_pool's argmax, used
#: only by its backward). A placeholder whose output the model does not use is removed after the export
#: (opbridge.onnx._torch_hooks); one whose output is used makes the export fail, naming the op and output. If a
#: placeholder ever reached a runtime, ONNX Runtime would refuse the model: never a silently wrong value.
UNEXPORTED_DOMAIN = "opbridge.unexported"


def register_unexported_schema(op_type: str) -> None:
    """The schema of a placeholder node (onnxscript needs one to emit it); idempotent."""
    import onnx
    from onnx.defs import OpSchema

    with _lock:
        if onnx.defs.has(op_type, UNEXPORTED_DOMAIN):
            return
        every_type = [f"tensor({t})" for t in ("float", "double", "float16", "int64", "int32", "bool")]
        onnx.defs.register_schema(
            OpSchema(
                op_type,
                UNEXPORTED_DOMAIN,
                1,
                doc="placeholder for an output with no ONNX form; removed from the model if unused",
                inputs=[OpSchema.FormalParameter("like", "T")],
                outputs=[OpSchema.FormalParameter("output", "U")],
                attributes=[OpSchema.Attribute("why", OpSchema.AttrType.STRING, "", required=False)],
                type_constraints=[("T", every_type, ""), ("U", every_type, "")],
            )
        )
