"""opbridge: custom PyTorch operators that export to ONNX and run in ONNX Runtime.

Importing opbridge loads the compiled ops (``torch.ops.opbridge.*``), registers
their fake kernels and autograd formulas, and registers their ONNX export rules
for the TorchScript-based exporter (``torch.onnx.export(..., dynamo=False)``).
Use :func:`opbridge.onnx.export` to choose a lowering or to export with the
dynamo exporter.
"""

from __future__ import annotations

import torch  # noqa: F401  (the extension links against torch's libraries: load them first)

from . import _extension

_C = _extension.load()

# ops registers the fake kernels and autograd formulas; defs, the op specs.
from . import defs, nn, onnx, ops  # noqa: E402, F401
from .autograd import MyAddFunction  # noqa: E402
from .ops import deform_conv2d, my_add  # noqa: E402

onnx._register()

import opbridge_ort as ort  # noqa: E402

try:
    from importlib.metadata import version as _version

    __version__ = _version("opbridge")
except Exception:  # not installed as a distribution
    __version__ = "0.1.0"
__all__ = ["MyAddFunction", "deform_conv2d", "my_add", "nn", "onnx", "ops", "ort"]
