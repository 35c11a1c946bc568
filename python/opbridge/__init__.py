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

import os
import sys
import threading

_lock = threading.RLock()
_loaded = False
_loading = False  # while _load runs, imports of submodules probe attributes: they must not start it again
__all__: list[str] = []  # filled by _load


def _load() -> None:
    """Everything ``import opbridge`` does (idempotent). Runs at import, except when the process is opbridge's
    own command line (``python -m opbridge`` / the ``opbridge`` script), whose commands call it when they need
    the ops, so that ``--help`` and ``inspect`` answer without importing torch."""
    global _loading
    with _lock:
        if _loaded or _loading:
            return
        _loading = True
        try:
            _load_now()
        finally:
            _loading = False


def _load_now() -> None:
    global _loaded, _C, __all__
    import torch  # noqa: F401  (the extension links against torch's libraries: load them first)

    from . import _extension

    _C = _extension.load()
    from . import _slices, nn, onnx, ops, specs  # noqa: F401
    from .integrations import patch_model

    globals().update(_slices.public_names(), patch_model=patch_model)
    _slices.mapping_modules()
    specs.mark_builtin()
    onnx._register()

    import opbridge_ort

    globals()["ort"] = opbridge_ort  # opbridge.ort: the torch-free runtime helpers
    # `from opbridge import *` gives the ops' functions and classes, not submodules that would shadow the
    # caller's own `nn` or `onnx`.
    __all__ = sorted([*_slices.public_names(), "patch_model"])
    _loaded = True


def _is_own_command_line() -> bool:
    if sys.argv[:1] == ["-m"]:  # `python -m X` while X is being located: is X opbridge?
        original = list(getattr(sys, "orig_argv", []))
        return "-m" in original[:-1] and original[original.index("-m") + 1] in ("opbridge", "opbridge.__main__")
    main = sys.modules.get("__main__")
    return os.path.basename(getattr(main, "__file__", "") or "") == "opbridge"  # the console script


def _is_submodule(name: str) -> bool:
    import pkgutil

    return any(module.name == name for module in pkgutil.iter_modules(__path__))


#: The tools' homes before ``opbridge.tools``: ``opbridge.parity`` is ``opbridge.tools.parity``, imported on first use.
_TOOLS = ("bench", "catalog", "compatibility", "coverage", "models", "parity")


def __getattr__(name: str):
    if name in _TOOLS:
        import importlib

        module = globals()[name] = importlib.import_module(f"{__name__}.tools.{name}")
        return module
    # Under opbridge's own command line the load is deferred: the first attribute a command uses loads it.
    # Not a submodule's name: `from opbridge import specs` probes the attribute before importing the submodule,
    # and a load started by that probe, in the middle of importing an op's module, would miss that op's names.
    if not _loaded and not _loading and not name.startswith("__") and not _is_submodule(name):
        _load()
        if name in globals():
            return globals()[name]
    raise AttributeError(f"module 'opbridge' has no attribute {name!r}")


try:
    from importlib.metadata import version as _version

    __version__ = _version("opbridge")
except Exception:  # not installed as a distribution
    __version__ = "0.1.0"

if not _is_own_command_line():
    _load()
