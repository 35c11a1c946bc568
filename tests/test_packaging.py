"""Packaging: the wheel is pinned to its torch, and says so when the torch differs."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

from opbridge import _extension

ROOT = Path(__file__).parent.parent


def test_import_under_another_torch_names_both_versions(monkeypatch):
    build_info = importlib.import_module("opbridge._build_info")
    monkeypatch.setattr(build_info, "TORCH_VERSION", "2.6.0")
    with pytest.raises(ImportError) as error:
        _extension.load()
    message = str(error.value)
    assert "built for torch 2.6.0" in message and torch.__version__ in message
    assert "install torch==2.6.0" in message and "--no-build-isolation" in message


def test_same_release_other_build_is_accepted(monkeypatch):
    """2.14.1+cpu and 2.14.1+cu130 share the C++ ABI opbridge uses."""
    build_info = importlib.import_module("opbridge._build_info")
    monkeypatch.setattr(build_info, "TORCH_VERSION", torch.__version__.split("+")[0] + "+someotherbuild")
    assert _extension.load() is importlib.import_module("opbridge._C")


def test_metadata_provider_pins_the_build_torch():
    sys.path.insert(0, str(ROOT / "cmake"))
    try:
        provider = importlib.import_module("opbridge_metadata")
    finally:
        sys.path.remove(str(ROOT / "cmake"))
    public = torch.__version__.split("+")[0]
    assert provider.dynamic_metadata("version", {"base": "0.1.0"}) == f"0.1.0+torch{public}"
    assert provider.dynamic_metadata("dependencies", {"base": ["numpy"]}) == ["numpy", f"torch=={public}"]
    with pytest.raises(RuntimeError, match="provides 'version' and 'dependencies'"):
        provider.dynamic_metadata("name", {})


def test_installed_metadata_carries_the_pin():
    from importlib.metadata import requires, version

    public = torch.__version__.split("+")[0]
    assert version("opbridge").endswith(f"+torch{public}")
    assert f"torch=={public}" in requires("opbridge")
