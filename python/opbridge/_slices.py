"""Finds opbridge's op modules (python/opbridge/ops/) and mappings (python/opbridge/mappings/).

No list of ops is kept anywhere: every module of those packages is imported
(names starting with an underscore are helpers), in name order. An op module
publishes ``__all__`` (names for ``opbridge``) and ``NN_MODULES`` (names for
``opbridge.nn``).
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from . import mappings, ops


def _modules(package: ModuleType) -> list[ModuleType]:
    return [
        importlib.import_module(f"{package.__name__}.{info.name}")
        for info in pkgutil.iter_modules(package.__path__)
        if not info.name.startswith("_")
    ]


def op_modules() -> list[ModuleType]:
    return _modules(ops)


def mapping_modules() -> list[ModuleType]:
    return _modules(mappings)


def _collect(attribute: str) -> dict[str, object]:
    found: dict[str, object] = {}
    for module in op_modules():
        for name in getattr(module, attribute, ()):
            if name in found:
                raise ImportError(
                    f"opbridge: {module.__name__} and another op module both publish {name!r} ({attribute})"
                )
            found[name] = getattr(module, name)
    return found


def public_names() -> dict[str, object]:
    """``opbridge.<name>`` of every op module's ``__all__``."""
    return _collect("__all__")


def nn_modules() -> dict[str, object]:
    """``opbridge.nn.<name>`` of every op module's ``NN_MODULES``."""
    return _collect("NN_MODULES")
