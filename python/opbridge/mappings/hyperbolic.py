"""asinh, acosh, atanh, sinh, cosh -> the ONNX ops of the same names (opset >= 9).

torch's TorchScript-based exporter cannot export these five at any opset 9..20
(measured on torch 2.14; see docs/tutorial.md), although ONNX has all of them
since opset 9.
"""

from __future__ import annotations

import numpy
import torch

from ._unary import unary_spec

# Inputs are moved into each function's domain (acosh: x >= 1, atanh: |x| < 1).
for _name, _onnx, _domain in [
    ("asinh", "Asinh", lambda x: 3 * x),
    ("acosh", "Acosh", lambda x: 1 + x.abs() * 3),
    ("atanh", "Atanh", lambda x: 0.99 * torch.tanh(x)),
    ("sinh", "Sinh", lambda x: 3 * x),
    ("cosh", "Cosh", lambda x: 3 * x),
]:
    unary_spec(
        _name,
        getattr(torch, _name),
        _onnx,
        9,
        _domain,
        known_gaps=lambda cell, _onnx=_onnx: (
            f"ONNX Runtime implements {_onnx} for float32 only (no float64 kernel)" if cell.dtype == "float64" else None
        ),
        # numpy's implementation, independent of torch's
        reference=lambda x, _name=_name: (
            torch.from_numpy(getattr(numpy, "arc" + _name[1:])(x.numpy()))
            if _name.startswith("a")
            else torch.from_numpy(getattr(numpy, _name)(x.numpy()))
        ),
    )
