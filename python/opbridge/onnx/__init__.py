"""Export models that use opbridge ops to ONNX, with either of PyTorch's exporters.

``lowering`` chooses how each opbridge op appears in the ONNX graph:

* ``"standard"``: only standard ONNX ops (e.g. my_add -> Constant, Mul, Add);
  any ONNX runtime can run the model, no library needed.
* ``"custom"``: one node per op in the ``opbridge`` domain (e.g. opbridge::MyAdd),
  run in ONNX Runtime by the opbridge library (see :mod:`opbridge_ort`).
* ``"function"``: one call per op of an ONNX function (written in onnxscript)
  that the model carries; any runtime runs it, a viewer shows one node.

An op has a lowering of a kind only for some opsets; asking for one it lacks
raises :class:`LoweringError` naming what exists. Ops that opbridge maps but has
no lowering of the requested kind for (e.g. ATen ops, which have only standard
lowerings) use their standard lowering instead.

After ``import opbridge``, plain ``torch.onnx.export`` (either exporter) knows
every op and mapping, with the standard lowering. Choose another for a block
of code or for the whole process::

    with opbridge.onnx.lowering("custom"):
        torch.onnx.export(model, args, "model.onnx")

    opbridge.onnx.set_default_lowering("custom")
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

import torch

from .. import specs
from ..specs import LOWERING_KINDS, LoweringError
from . import _dynamo, _legacy, _state, _torch_hooks, functions
from ._dynamo import translation_table
from ._schemas import register_schemas
from ._state import current_lowering, lowering, set_default_lowering
from ._state import lowering as _lowering_block  # export() has an argument named lowering
from .builder import DynamoBuilder, LegacyBuilder
from .mapping import register_mapping

if TYPE_CHECKING:
    import onnx

__all__ = [
    "LOWERING_KINDS",
    "DynamoBuilder",
    "LegacyBuilder",
    "LoweringError",
    "current_lowering",
    "export",
    "functions",
    "lowering",
    "register_mapping",
    "register_schemas",
    "set_default_lowering",
    "supported_opsets",
    "translation_table",
]


def supported_opsets(dynamo: bool) -> range:
    """Opsets opbridge exports with the given exporter under the installed torch and onnxscript: the
    TorchScript-based one (``dynamo=False``) 9 .. 20, the dynamo one 18 .. the newest onnxscript converts to
    (25 with onnxscript 0.7). The parity matrix runs every one of them."""
    if not isinstance(dynamo, bool):
        raise TypeError(f"supported_opsets: dynamo must be True or False, got {dynamo!r}")
    if dynamo:
        return range(_dynamo.MIN_OPSET, _dynamo.max_opset() + 1)
    return range(_legacy.MIN_OPSET, _legacy.max_opset() + 1)


def export(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    f: str | os.PathLike | io.BytesIO | None = None,
    *,
    opset_version: int | None = None,
    dynamo: bool = True,
    lowering: str = "standard",
    **kwargs: Any,
) -> onnx.ModelProto:
    """Export ``model`` to ONNX with opbridge's ops lowered as ``lowering`` asks.

    Plain ``torch.onnx.export`` works too after ``import opbridge`` (see the module
    docstring); this function adds the lowering as an argument, opset checks with
    clear messages, legacy-style ``dynamic_axes`` for the dynamo exporter, and
    returns the model.

    Args:
        model, args: as for ``torch.onnx.export``.
        f: where to write the model (path or binary file object); None writes nothing.
        opset_version: the ONNX opset; defaults to torch's default for that exporter.
            See :func:`supported_opsets`.
        dynamo: True for the dynamo exporter (torch's default), False for the
            TorchScript-based one.
        lowering: ``"standard"``, ``"custom"`` or ``"function"`` (see the module docstring).
        **kwargs: passed on to ``torch.onnx.export`` (``input_names``,
            ``output_names``, ``dynamic_axes``, ``dynamic_shapes``, ...).

    Returns:
        The exported model as an ``onnx.ModelProto``.
    """
    if lowering not in LOWERING_KINDS:
        raise ValueError(f"lowering must be one of {', '.join(map(repr, LOWERING_KINDS))}, got {lowering!r}")
    for reserved in ("dynamo", "opset_version"):
        kwargs.pop(reserved, None)
    if opset_version is not None and (isinstance(opset_version, bool) or not isinstance(opset_version, int)):
        raise TypeError(f"opset_version must be an int (e.g. 18) or None, got {opset_version!r}")
    if not isinstance(dynamo, bool):
        raise TypeError(f"dynamo must be True or False, got {dynamo!r}")
    if opset_version is None:
        from torch.onnx import _constants

        opset_version = min(_constants.ONNX_DEFAULT_OPSET, max(supported_opsets(dynamo)))
    supported = supported_opsets(dynamo)
    if opset_version not in supported:
        exporter = "dynamo" if dynamo else "TorchScript-based (dynamo=False)"
        hint = "use dynamo=False for lower opsets" if dynamo and opset_version < supported.start else ""
        raise ValueError(
            f"opset_version={opset_version} is outside what the {exporter} exporter produces with torch "
            f"{torch.__version__}: {supported.start}..{supported.stop - 1}. {hint}".rstrip()
        )
    with _lowering_block(lowering):
        if dynamo:
            return _export_dynamo(model, args, f, opset_version, lowering, kwargs)
        return _export_legacy(model, args, f, opset_version, lowering, kwargs)


def _export_legacy(model, args, f, opset_version, lowering, kwargs) -> onnx.ModelProto:
    if lowering == "custom":
        kwargs["custom_opsets"] = {specs.CUSTOM_DOMAIN: specs.CUSTOM_DOMAIN_VERSION, **kwargs.get("custom_opsets", {})}
    elif lowering == "function":
        kwargs["custom_opsets"] = {specs.FUNCTION_DOMAIN: 1, **kwargs.get("custom_opsets", {})}
    import onnx

    buffer = io.BytesIO()
    token = _state.functions_attached.set(True)  # functions.attach below adds the definitions
    try:
        torch.onnx.export(model, args, buffer, dynamo=False, opset_version=opset_version, **kwargs)
    finally:
        _state.functions_attached.reset(token)
    model_proto = functions.attach(onnx.load_from_string(buffer.getvalue()))
    _write(model_proto, f)
    return model_proto


def _export_dynamo(model, args, f, opset_version, lowering, kwargs) -> onnx.ModelProto:
    if "dynamic_axes" in kwargs and "dynamic_shapes" not in kwargs:
        kwargs["dynamic_shapes"] = _dynamic_axes_to_shapes(
            args, kwargs.get("input_names"), kwargs.get("output_names"), kwargs.pop("dynamic_axes")
        )
    table = translation_table(lowering, opset_version)
    table.update(kwargs.pop("custom_translation_table", None) or {})  # the user's own entries win
    external_data = kwargs.pop("external_data", None)
    program = torch.onnx.export(
        model, args, None, dynamo=True, opset_version=opset_version, custom_translation_table=table, **kwargs
    )
    model_proto = functions.attach(program.model_proto)
    if f is not None:
        if isinstance(f, (str, os.PathLike)) and lowering != "function":
            program.save(f, external_data=external_data)  # handles models too large for one protobuf
        else:
            _write(model_proto, f)
    return model_proto


def _dynamic_axes_to_shapes(args, input_names, output_names, dynamic_axes) -> tuple:
    """The legacy exporter's ``dynamic_axes`` as torch.export ``dynamic_shapes``.

    torch's own conversion is deprecated; axes with the same name share one
    torch.export.Dim, so the exported graph keeps the user's axis names. Output
    entries are dropped: the dynamo exporter derives output shapes itself.
    """
    import re

    names = list(input_names or [])
    dims: dict[str, torch.export.Dim] = {}
    shapes = []
    for index, arg in enumerate(args):
        axes = dynamic_axes.get(names[index]) if index < len(names) else None
        if not isinstance(arg, torch.Tensor) or not axes:
            shapes.append(None)
            continue
        if not isinstance(axes, dict):  # a list of dims: name them after the input
            axes = {dim: f"{names[index]}_dim{dim}" for dim in axes}
        spec = {}
        for dim, axis_name in axes.items():
            identifier = re.sub(r"\W", "_", str(axis_name))
            identifier = identifier if identifier[:1].isalpha() else f"d_{identifier}"
            spec[dim] = dims.setdefault(identifier, torch.export.Dim(identifier))
        shapes.append(spec)
    unknown = set(dynamic_axes) - set(names) - set(output_names or [])
    if unknown:
        raise ValueError(
            f"dynamic_axes names {sorted(unknown)}, which are not in input_names {names} or output_names; "
            "with dynamo=True, name every input in input_names (or pass dynamic_shapes)"
        )
    return tuple(shapes)


def _write(model_proto: onnx.ModelProto, f) -> None:
    import onnx

    if f is None:
        return
    if isinstance(f, (str, os.PathLike)):
        onnx.save(model_proto, f)
    else:
        f.write(model_proto.SerializeToString())


def _register() -> None:
    """Called once by ``import opbridge``, after the op specs are defined: the legacy
    exporter's symbolics now (cheap), the dynamo exporter's rules when torch loads it."""
    _legacy.register_symbolics()
    _torch_hooks.install()
