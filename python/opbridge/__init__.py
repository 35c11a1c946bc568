"""opbridge: custom PyTorch operators that export to ONNX and run in ONNX Runtime.

Importing opbridge loads the compiled ops (``torch.ops.opbridge.*``), imports
every op module (python/opbridge/ops/: wrappers, fake kernels, autograd,
``nn.Module`` twins, ONNX lowerings) and mapping (python/opbridge/mappings/),
and registers the export rules for both of torch's exporters: after it, plain
``torch.onnx.export(...)`` exports opbridge's ops with the standard lowering
(see :mod:`opbridge.onnx` to choose another). Nothing heavy is imported here:
onnx, onnxscript and torchvision load when an export or a test needs them.
"""

from __future__ import annotations

import torch  # noqa: F401  (the extension links against torch's libraries: load them first)

from . import _extension

_C = _extension.load()

from . import _slices, nn, onnx, ops, specs  # noqa: E402, F401

globals().update(_slices.public_names())
_slices.mapping_modules()
specs.mark_builtin()
onnx._register()

import opbridge_ort as ort  # noqa: E402, F401  (opbridge.ort, the torch-free runtime helpers)

try:
    from importlib.metadata import version as _version

    __version__ = _version("opbridge")
except Exception:  # not installed as a distribution
    __version__ = "0.1.0"

# `from opbridge import *` gives the ops' functions and classes, not submodules that would shadow
# the caller's own `nn` or `onnx`.
__all__ = sorted(_slices.public_names())
