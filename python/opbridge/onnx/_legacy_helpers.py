"""Small helpers for writing symbolics of the TorchScript-based exporter."""

from __future__ import annotations

import torch

from ..specs import LoweringError

_SCALAR_TYPES = {"Float": torch.float32, "Double": torch.float64, "Half": torch.float16, "BFloat16": torch.bfloat16}


def dtype_of(value, op: str, argument: str) -> torch.dtype:
    """The torch dtype of a graph value, or a clear error if the exporter does not know it."""
    scalar_type = value.type().scalarType() if isinstance(value.type(), torch._C.TensorType) else None
    if scalar_type not in _SCALAR_TYPES:
        raise LoweringError(
            f"{op}: the ONNX export needs the dtype of {argument!r}, but the exporter knows it as {scalar_type!r}. "
            "Pass example inputs of a floating dtype."
        )
    return _SCALAR_TYPES[scalar_type]


def _broadcast(a: list | None, b: list | None) -> list | None:
    if a is None or b is None:
        return None
    rank = max(len(a), len(b))
    a = [1] * (rank - len(a)) + list(a)
    b = [1] * (rank - len(b)) + list(b)
    out = []
    for x, y in zip(a, b, strict=True):
        if x == 1:
            out.append(y)
        elif y == 1 or y is None or x == y:
            out.append(x)
        else:  # x is None and y is a known size other than 1
            out.append(y)
    return out


def set_broadcast_type(out, a, b) -> None:
    """Gives a custom node's output the dtype of ``a`` and the broadcast shape of a and b.

    ONNX shape inference knows nothing of custom domains; without this the output
    would carry no type and downstream shape inference would stop there.
    """
    a_type, b_type = a.type(), b.type()
    if not isinstance(a_type, torch._C.TensorType) or a_type.scalarType() is None:
        return
    sizes = _broadcast(
        a_type.varyingSizes(), b_type.varyingSizes() if isinstance(b_type, torch._C.TensorType) else None
    )
    out.setType(a_type.with_sizes(sizes) if sizes is not None else a_type)
