"""Add an ONNX mapping for any torch op in a few lines, once for both exporters.

    import opbridge

    # aten::asinh -> ONNX Asinh, for opsets >= 9
    opbridge.onnx.register_mapping("aten::asinh", lambda b, x: b.op("Asinh", x), min_opset=9)

After this, ``torch.onnx.export(..., dynamo=False)`` exports the op, and
``opbridge.onnx.export`` (either exporter) and
``opbridge.onnx.translation_table()`` include it. ``b`` is a builder
(:mod:`opbridge.onnx.builder`); non-tensor arguments reach the function as
graph constants in the legacy exporter: read them with ``b.value(arg)``.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import specs
from . import _legacy


def register_mapping(
    torch_op: str,
    build: Callable,
    *,
    min_opset: int = 1,
    max_opset: int | None = None,
    kind: str = "standard",
    name: str | None = None,
    function: str | None = None,
) -> specs.OpSpec:
    """Maps ``torch_op`` ("namespace::name", e.g. "aten::asinh") to ONNX with ``build(b, *args)``.

    Registers the legacy exporter's symbolic right away; the dynamo exporter's
    translation comes from :func:`opbridge.onnx.translation_table` /
    :func:`opbridge.onnx.export`. Returns the op spec (add more lowerings by
    registering a full :class:`opbridge.specs.OpSpec` instead).
    """
    if "::" not in torch_op:
        raise ValueError(f"torch_op must be 'namespace::name' (e.g. 'aten::asinh'), got {torch_op!r}")
    spec = specs.register(
        specs.OpSpec(
            name=name or torch_op.replace("::", "."),
            torch_op=torch_op,
            doc=f"{torch_op} (mapping registered with opbridge.onnx.register_mapping)",
            lowerings=[specs.Lowering(kind, build, min_opset=min_opset, max_opset=max_opset, function=function)],
        )
    )
    _legacy.register_symbolics(only=spec)
    return spec
