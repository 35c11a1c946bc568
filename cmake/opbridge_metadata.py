"""scikit-build-core metadata provider: pins the opbridge wheel to the torch it is built against.

The C++ extension only loads under the torch it was compiled with, so the wheel
says so: ``dependencies`` gets ``torch==X.Y.Z`` and the version a local label
``+torchX.Y.Z``, so that one ``dist/`` holds a wheel per torch version. torch is
imported from the build interpreter (builds run without isolation).
"""

from __future__ import annotations

from typing import Any


def _torch_version() -> str:
    try:
        import torch
    except ImportError as error:
        raise RuntimeError(
            "opbridge is built against the torch of the build environment, but torch is not importable there. "
            "Install torch first, then build without isolation: pip install --no-build-isolation ."
        ) from error
    return torch.__version__.split("+", 1)[0]


def dynamic_metadata(field: str, settings: dict[str, Any] | None = None, project: Any = None) -> Any:
    settings = settings or {}
    torch = _torch_version()
    if field == "version":
        return f"{settings['base']}+torch{torch}"
    if field == "dependencies":
        return [*settings.get("base", []), f"torch=={torch}"]
    raise RuntimeError(f"opbridge_metadata provides 'version' and 'dependencies', not {field!r}")
