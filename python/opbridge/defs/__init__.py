"""The specs of opbridge's ops and mappings (see opbridge.specs); importing registers them."""

from . import aten, my_add  # noqa: F401
