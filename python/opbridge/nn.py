"""nn.Module twins of opbridge's ops (each defined in its op's module, python/opbridge/ops/<op>.py)."""

from __future__ import annotations

from ._slices import nn_modules

globals().update(nn_modules())
__all__ = sorted(nn_modules())  # the names found in the op modules
