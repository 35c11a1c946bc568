"""Loads opbridge._C, the compiled ops, with a clear error when it cannot work."""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

REINSTALL = "pip install --no-build-isolation --force-reinstall <opbridge source or wheel built for this torch>"


def _public(version: str) -> str:
    # "2.14.1+cu130" and "2.14.1+cpu" are builds of the same release and share the C++ ABI we use.
    return version.split("+", 1)[0]


def load() -> ModuleType:
    try:
        build_info = importlib.import_module("opbridge._build_info")
    except ImportError as error:
        raise ImportError(
            "opbridge's compiled extension is not installed (opbridge/_build_info.py is missing): "
            f"opbridge must be built, not imported from its source tree. Build and install it with {REINSTALL}"
        ) from error
    built_for = build_info.TORCH_VERSION
    if _public(built_for) != _public(torch.__version__):
        raise ImportError(
            f"opbridge was built for torch {built_for}, but torch {torch.__version__} is installed; the "
            f"compiled ops only load under the torch they were built for. Either install torch=="
            f"{_public(built_for)}, or rebuild opbridge for this torch: {REINSTALL}"
        )
    try:
        return importlib.import_module("opbridge._C")
    except ImportError as error:
        raise ImportError(
            f"opbridge's compiled ops (opbridge._C, built for torch {built_for}) failed to load under torch "
            f"{torch.__version__}: {error}. Rebuild them: {REINSTALL}"
        ) from error
