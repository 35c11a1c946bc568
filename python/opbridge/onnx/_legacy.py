"""Export rules for the TorchScript-based exporter (torch.onnx.export(..., dynamo=False)).

One symbolic per op is registered with torch.onnx.register_custom_op_symbolic;
it picks the spec's lowering for the opset being exported and for the lowering
kind chosen by opbridge.onnx.export (``standard`` for a plain torch.onnx.export).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch

from .. import specs
from .builder import LegacyBuilder

# The legacy exporter gives symbolics no way to receive options, so the lowering
# chosen for the export in progress travels in a thread-local.
_state = threading.local()
#: The lowest opset the TorchScript-based exporter accepts.
MIN_OPSET = 7


@contextlib.contextmanager
def lowering_scope(kind: str) -> Iterator[None]:
    previous = getattr(_state, "lowering", None)
    _state.lowering = kind
    try:
        yield
    finally:
        _state.lowering = previous


def current_lowering() -> str:
    return getattr(_state, "lowering", None) or "standard"


def symbolic_for(name: str) -> Callable:
    spec = specs.get(name)

    def symbolic(g, *args):
        return spec.lowering(current_lowering(), g.opset).build(LegacyBuilder(g), *args)

    symbolic.__name__ = f"{name}_symbolic"
    return symbolic


def register_symbolics(only: specs.OpSpec | None = None) -> None:
    for spec in [only] if only is not None else specs.all_specs():
        minimum = max(MIN_OPSET, min(lw.min_opset for lw in spec.lowerings))
        torch.onnx.register_custom_op_symbolic(spec.torch_op, symbolic_for(spec.name), minimum)


def max_opset() -> int:
    from torch.onnx import _constants

    return getattr(_constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", _constants.ONNX_MAX_OPSET)
