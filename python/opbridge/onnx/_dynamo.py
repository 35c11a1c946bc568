"""Export rules for the dynamo exporter (torch.onnx.export(..., dynamo=True)):
a custom_translation_table built from the op specs."""

from __future__ import annotations

from collections.abc import Callable

from .. import specs
from .builder import dynamo_translation

#: The lowest opset the dynamo exporter produces (it builds at 18 and converts up).
MIN_OPSET = 18


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


def translation_table(lowering: str = "standard", opset_version: int = MIN_OPSET) -> dict:
    """``custom_translation_table`` entries for every opbridge op.

    Pass it to ``torch.onnx.export(..., dynamo=True, custom_translation_table=...)``
    yourself, or let :func:`opbridge.onnx.export` do it. An op with no lowering
    of that kind at that opset gets an entry that fails with a clear error if the
    model uses the op.
    """
    table = {}
    for spec in specs.all_specs():
        try:
            overload = spec.overload
        except (AttributeError, RuntimeError):  # e.g. torchvision's ops where torchvision is absent
            continue
        try:
            table[overload] = dynamo_translation(spec.lowering(lowering, opset_version).build, opset_version)
        except specs.LoweringError as error:
            table[overload] = _unsupported(error)
    return table
