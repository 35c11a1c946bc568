"""Export rules for the dynamo exporter (torch.onnx.export(..., dynamo=True)):
translations built from the op specs.

``import opbridge`` makes plain ``torch.onnx.export(..., dynamo=True)`` use them
(see opbridge.onnx._torch_hooks); :func:`translation_table` gives them as a
``custom_translation_table`` for an explicit export.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import specs
from .builder import dynamo_translation

#: The lowest opset the dynamo exporter produces (it builds at 18 and converts up).
MIN_OPSET = 18
#: Namespaces whose ops torch's dynamo exporter translates itself (many of them): where an
#: opbridge mapping of such an op has no lowering, torch's own rule applies.
TORCH_TRANSLATES = ("aten", "prims", "torchvision")


def max_opset() -> int:
    import onnx

    try:
        from onnxscript.version_converter._version_converter import SUPPORTED_MAX_ONNX_OPSET
    except ImportError:  # an onnxscript that moved it: trust onnx
        SUPPORTED_MAX_ONNX_OPSET = onnx.defs.onnx_opset_version()
    return min(SUPPORTED_MAX_ONNX_OPSET, onnx.defs.onnx_opset_version())


def _unsupported(error: specs.LoweringError) -> Callable:
    def translation(*args, **kwargs):
        raise error

    return translation


def translation_table(lowering: str | None = None, opset_version: int = MIN_OPSET) -> dict:
    """``custom_translation_table`` entries for every opbridge op and mapping.

    ``lowering`` defaults to the current one (:func:`opbridge.onnx.lowering`).
    Pass the table to ``torch.onnx.export(..., dynamo=True, custom_translation_table=...)``
    yourself, or let :func:`opbridge.onnx.export` (or plain ``torch.onnx.export``
    after ``import opbridge``) do it. An opbridge op with no lowering of that kind
    at that opset gets an entry that fails with a clear error if the model uses
    it. A mapping of an op torch's dynamo exporter already translates (``aten::*``, ``torchvision::*``) gets an
    entry only for a ``custom`` or ``function`` lowering, or if its spec sets ``dynamo_overrides_torch`` (torch's
    rule is missing or wrong there; mappings registered with ``register_mapping`` do); otherwise torch's own
    rule applies.
    """
    from ._state import current_lowering

    kind = lowering or current_lowering()
    opset = max(opset_version, MIN_OPSET)  # the exporter builds at >= 18 and converts down
    table = {}
    for spec in specs.all_specs():
        overload = spec.resolve_overload()  # None: e.g. torchvision's ops where torchvision is not loaded
        if overload is None:
            continue
        try:
            lowering = spec.lowering(kind, opset)
        except specs.LoweringError as error:
            if spec.namespace not in TORCH_TRANSLATES:  # nobody else can export the op: say why not
                table[overload] = _unsupported(error)
            continue
        if spec.namespace in TORCH_TRANSLATES and lowering.kind == "standard" and not spec.dynamo_overrides_torch:
            continue  # torch's dynamo exporter has its own standard rule for the op (the mapping serves the legacy one)
        table[overload] = dynamo_translation(lowering.build, opset, opset_version)
        # Other overloads the same lowering reads, where an older torch hands them to the translator undecomposed.
        for name in spec.extra.get("dynamo_overloads", ()):
            other = getattr(overload.overloadpacket, name, None)
            if other is not None:
                table[other] = table[overload]
    return table
