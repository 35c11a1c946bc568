"""The CUDA toolkit the wheels are built with, from PyPI's NVIDIA packages (`nox -s wheels`, and cibuildwheel's
before-build step in pyproject.toml and python/runtime/pyproject.toml):

    python python/opbridge/tools/cuda_toolkit.py DIR

installs the pinned compiler, runtime and CCCL (PACKAGES) into DIR with pip and prints the path of its nvcc last
(give it to CMake as CUDACXX or CMAKE_CUDA_COMPILER). The same toolkit on every Linux, no system CUDA and no
vendor repository: NVIDIA publishes nvcc 13 as wheels. pip lays the packages out as one toolkit (bin/, nvvm/,
include/, lib/) except for the `lib64` nvcc's profile links against, which is added here as a link to lib/. A DIR
that already holds these versions is reused. Standard library only.

CUDA 13's runtime, linked statically into the CUDA libraries, needs an NVIDIA driver for CUDA >= 13.0 (R580 or
newer); opbridge checks the driver when it loads them (docs/packaging.md, "CUDA in the wheels").
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

#: The toolkit: nvcc and its front ends (nvcc, crt, nvvm), the runtime (headers, libcudart_static.a) and CCCL
#: (cub, for the radix sort of nms_rotated), all of one CUDA release.
CUDA_RELEASE = "13.0"
PACKAGES = {
    "nvidia-cuda-nvcc": "13.0.88",
    "nvidia-cuda-crt": "13.0.88",
    "nvidia-nvvm": "13.0.88",
    "nvidia-cuda-runtime": "13.0.96",
    "nvidia-cuda-cccl": "13.0.85",
}
#: Where the packages put the toolkit, relative to DIR.
TOOLKIT = Path("nvidia") / "cu13"


def nvcc(directory: Path) -> Path:
    return directory / TOOLKIT / "bin" / "nvcc"


def install(directory: Path) -> Path:
    """The toolkit in `directory` (installed unless already there); returns its nvcc."""
    marker = directory / "opbridge-cuda-toolkit.json"
    if marker.exists() and json.loads(marker.read_text()) == PACKAGES and nvcc(directory).exists():
        return nvcc(directory)
    requirements = [f"{name}=={version}" for name, version in PACKAGES.items()]
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade", "--target",
                    str(directory), *requirements], check=True)  # fmt: skip
    root = directory / TOOLKIT
    for tools in (root / "bin", root / "nvvm" / "bin"):
        for tool in tools.iterdir():
            if tool.is_file():
                tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    lib64 = root / "lib64"
    if not lib64.exists():
        os.symlink("lib", lib64)
    version = subprocess.run([str(nvcc(directory)), "--version"], check=True, capture_output=True, text=True).stdout
    if f"release {CUDA_RELEASE}" not in version:
        raise RuntimeError(f"{nvcc(directory)} is not CUDA {CUDA_RELEASE}: {version}")
    marker.write_text(json.dumps(PACKAGES))
    return nvcc(directory)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(install(Path(argv[1]).resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
