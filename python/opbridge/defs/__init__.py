"""The specs of opbridge's ops and mappings (see opbridge.specs); importing registers them."""

from . import aten, deform_conv2d, my_add  # noqa: F401
