from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

import opbridge  # noqa: F401  (registers the ops, fake kernels, autograd and export rules)


def pytest_configure(config):
    # torch's dynamo warns once on CPython 3.13.0 exactly ("Guards may run slower on Python 3.13.0. Consider upgrading
    # to Python 3.13.1+."), and pyproject's "error" filter turned that into an InternalTorchDynamoError inside every
    # torch.compile test there: a note about the interpreter, not a fault of opbridge's.
    config.addinivalue_line("filterwarnings", "ignore:Guards may run slower on Python 3.13.0:RuntimeWarning")


TOLERANCES = {torch.float32: (1e-6, 1e-6), torch.float64: (1e-12, 1e-12), torch.float16: (1e-3, 1e-3)}


@pytest.fixture
def stand_in_driver(tmp_path):
    """`stand_in_driver(13000)`: a directory holding a libcuda.so.1 whose cuDriverGetVersion says that CUDA version
    (its only entry point: enough for the driver checks, which create no context), for LD_LIBRARY_PATH."""

    def build(cuda_version: int) -> str:
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            pytest.skip("needs a C compiler to build a stand-in NVIDIA driver library")
        directory = tmp_path / f"driver-{cuda_version}"
        directory.mkdir()
        source = directory / "driver.c"
        source.write_text(f"int cuDriverGetVersion(int* version) {{ *version = {cuda_version}; return 0; }}\n")
        subprocess.run([compiler, "-shared", "-fPIC", "-o", str(directory / "libcuda.so.1"), str(source)], check=True)
        return str(directory)

    return build


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def randn(shape, dtype=torch.float32, generator=None) -> torch.Tensor:
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)


def beyond_last_level_cache(itemsize: int = 4) -> int:
    """An element count whose array is larger than the last-level cache (one instance, from sysfs; 8 MiB where
    unknown) and odd: my_add writes such outputs with streaming stores (cpp/kernels/my_add.h)."""
    from pathlib import Path

    sizes = {}
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level, size = (index / "level").read_text().strip(), (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        sizes[int(level)] = int(size.rstrip("KMG")) * scale
    cache = max(sizes[max(sizes)] if sizes else 0, 8 << 20)
    return cache // itemsize + 12_345
