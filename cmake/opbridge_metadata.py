"""scikit-build-core metadata provider: the opbridge wheel's version and torch requirement, from the torch it is
built against (builds run without isolation, so torch is imported from the build interpreter, or from the
interpreter named by the environment variable OPBRIDGE_TORCH_PYTHON).

Two kinds of wheel come from the same sources (cpp/torch/api.h):

* the **stable-ABI** wheel, built against torch >= 2.10: it loads on that torch and every later one, so it
  requires ``torch>=2.10``;
* a **classic** wheel, built against one older torch X.Y.Z: it loads only there, so it requires ``torch==X.Y.Z``.

Index-ready versions, no local labels (``+torch2.9.1`` is refused by package indexes): all are the release of
the runtime wheel (python/runtime/pyproject.toml, which the torch wheel requires exactly), with a fourth
component naming the torch ABI floor, major * 100 + minor: 0.1.0.206 (torch 2.6), 0.1.0.209 (torch 2.9),
0.1.0.210 (stable, torch >= 2.10). pip takes the highest version whose requirements hold, so with the installed
torch named (``pip install --find-links dist opbridge torch==2.9.1``) it picks the wheel that loads under it, and
the stable wheel wherever it can.

The kind follows the build's torch (stable from 2.10), or the environment variable OPBRIDGE_TORCH_ABI
(``stable`` / ``classic``), the same rule as cmake/OpbridgeTorch.cmake.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # scikit-build-core depends on tomli there
    import tomli as tomllib

STABLE_FLOOR = (2, 10)
# The release, shared with the runtime wheel: its pyproject.toml holds it.
RUNTIME_PYPROJECT = Path(__file__).resolve().parent.parent / "python" / "runtime" / "pyproject.toml"


def release() -> str:
    return tomllib.loads(RUNTIME_PYPROJECT.read_text())["project"]["version"]


def _torch_version() -> str:
    other = os.environ.get("OPBRIDGE_TORCH_PYTHON")
    if other:  # the torch of another environment (cmake/OpbridgeTorch.cmake reads the same variable)
        import subprocess

        code = "import torch; print(torch.__version__)"
        return (
            subprocess.run([other, "-c", code], check=True, capture_output=True, text=True).stdout.strip().split("+")[0]
        )
    try:
        import torch
    except ImportError as error:
        raise RuntimeError(
            "opbridge is built against the torch of the build environment, but torch is not importable there. "
            "Install torch first, then build without isolation: pip install --no-build-isolation ."
        ) from error
    return torch.__version__.split("+", 1)[0]


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def torch_layer(torch: str, requested: str | None = None) -> str:
    """'stable' or 'classic' for a build against `torch` (`requested`: OPBRIDGE_TORCH_ABI, if set)."""
    requested = (requested or "auto").lower()
    if requested not in {"auto", "stable", "classic"}:
        raise RuntimeError(f"OPBRIDGE_TORCH_ABI must be auto, stable or classic, got {requested!r}")
    if requested == "auto":
        return "stable" if _release(torch) >= STABLE_FLOOR else "classic"
    if requested == "stable" and _release(torch) < STABLE_FLOOR:
        raise RuntimeError(f"the stable-ABI build needs torch >= 2.10 to build against, found {torch}")
    return requested


def metadata(field: str, version: str, requirements: list[str], torch: str, layer: str) -> Any:
    """The wheel's `field` ('version' or 'dependencies') for release `version`, built against `torch`."""
    floor = STABLE_FLOOR if layer == "stable" else _release(torch)
    if field == "version":
        return f"{version}.{floor[0] * 100 + floor[1]}"
    if field == "dependencies":
        pin = f"torch>={floor[0]}.{floor[1]}" if layer == "stable" else f"torch=={torch}"
        return [*requirements, f"opbridge-ort=={version}", pin]
    raise RuntimeError(f"opbridge_metadata provides 'version' and 'dependencies', not {field!r}")


def dynamic_metadata(field: str, settings: dict[str, Any] | None = None, project: Any = None) -> Any:
    settings = settings or {}
    torch = _torch_version()
    layer = torch_layer(torch, os.environ.get("OPBRIDGE_TORCH_ABI"))
    return metadata(field, release(), settings.get("base", []), torch, layer)
