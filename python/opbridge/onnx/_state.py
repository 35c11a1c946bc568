"""Which lowering opbridge's ops get when a model is exported.

Plain ``torch.onnx.export`` (either exporter) gives no way to pass options to
export rules, so the lowering travels here: a process-wide default
(``standard`` unless :func:`set_default_lowering` says otherwise) and, over it,
the innermost :func:`lowering` block of the current thread or task.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from ..specs import LOWERING_KINDS

_default = "standard"
_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("opbridge_lowering", default=None)


def _check(kind: str) -> str:
    if kind not in LOWERING_KINDS:
        raise ValueError(f"lowering must be one of {', '.join(map(repr, LOWERING_KINDS))}, got {kind!r}")
    return kind


def current_lowering() -> str:
    """The lowering an export started now would use."""
    return _override.get() or _default


def set_default_lowering(kind: str) -> str:
    """Sets the lowering of every later export in this process; returns the previous default.

    ``opbridge.onnx.set_default_lowering("custom")`` makes plain ``torch.onnx.export``
    emit one ``opbridge`` node per op (run by ``opbridge_ort``) instead of standard ONNX ops.
    """
    global _default
    previous, _default = _default, _check(kind)
    return previous


@contextlib.contextmanager
def lowering(kind: str) -> Iterator[str]:
    """Exports inside the block lower opbridge's ops as ``kind``::

        with opbridge.onnx.lowering("custom"):
            torch.onnx.export(model, args, "model.onnx")   # either exporter

    Blocks nest; each thread (and asyncio task) has its own.
    """
    token = _override.set(_check(kind))
    try:
        yield kind
    finally:
        _override.reset(token)


# Set while opbridge.onnx.export runs the TorchScript-based exporter, which then adds the
# definitions of the ONNX functions the model calls; plain torch.onnx.export(dynamo=False) cannot.
functions_attached: contextvars.ContextVar[bool] = contextvars.ContextVar("opbridge_functions_attached", default=False)
