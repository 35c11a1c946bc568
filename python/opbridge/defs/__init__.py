"""The specs of opbridge's ops (see opbridge.specs); importing registers them."""

from . import my_add  # noqa: F401
