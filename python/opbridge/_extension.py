"""Loads the compiled ops (libopbridge_ops.so) and opbridge._C, their pybind11 module, with a clear error when they
cannot work."""

from __future__ import annotations

import ctypes
import importlib
import os
import warnings
from types import ModuleType

import torch

REINSTALL = "pip install --no-build-isolation --force-reinstall <opbridge source or wheel built for this torch>"


def _public(version: str) -> str:
    # "2.14.1+cu130" and "2.14.1+cpu" are builds of the same release and share the C++ ABI we use.
    return version.split("+", 1)[0]


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in _public(version).split(".")[:2])


def compatible(build_info: ModuleType, torch_version: str) -> bool:
    """Whether a build loads under `torch_version`: a stable-ABI build (TORCH_ABI "stable") on its floor and every
    later torch, a classic build only on the torch it was compiled against."""
    if getattr(build_info, "TORCH_ABI", "classic") == "stable":
        return _release(torch_version) >= _release(build_info.STABLE_FLOOR)
    return _public(build_info.TORCH_VERSION) == _public(torch_version)


def load() -> ModuleType:
    try:
        build_info = importlib.import_module("opbridge._build_info")
    except ImportError as error:
        raise ImportError(
            "opbridge's compiled extension is not installed (opbridge/_build_info.py is missing): "
            f"opbridge must be built, not imported from its source tree. Build and install it with {REINSTALL}"
        ) from error
    built_for = build_info.TORCH_VERSION
    if getattr(build_info, "TORCH_ABI", "classic") == "stable" and not compatible(build_info, torch.__version__):
        raise ImportError(
            f"this opbridge is built on the LibTorch stable ABI and needs torch >= {build_info.STABLE_FLOOR}, but "
            f"torch {torch.__version__} is installed. Either upgrade torch, or install the opbridge wheel built for "
            f"torch {_public(torch.__version__)} (pip install --find-links <wheel directory> opbridge "
            f"torch=={_public(torch.__version__)}) or build it for this torch: {REINSTALL}"
        )
    if not compatible(build_info, torch.__version__):
        raise ImportError(
            f"opbridge was built for torch {built_for}, but torch {torch.__version__} is installed; the "
            f"compiled ops only load under the torch they were built for. Either install torch=="
            f"{_public(built_for)}, or rebuild opbridge for this torch: {REINSTALL}"
        )
    _load_ops(build_info)
    try:
        module = importlib.import_module("opbridge._C")
    except ImportError as error:
        raise ImportError(
            f"opbridge's compiled ops (opbridge._C, built for torch {built_for}, "
            f"{getattr(build_info, 'TORCH_ABI', 'classic')} ABI) failed to load under torch "
            f"{torch.__version__}: {error}. Rebuild them: {REINSTALL}"
        ) from error
    _load_cuda(build_info)
    return module


def _load_ops(build_info: ModuleType) -> None:
    """Registers the ops: libopbridge_ops.so beside _C (the same file for every Python), through torch's own
    loader. Loading it twice is harmless (torch.ops.load_library keeps a loaded library's handle)."""
    path = os.path.join(os.path.dirname(build_info.__file__), getattr(build_info, "OPS_LIBRARY", "libopbridge_ops.so"))
    if not os.path.exists(path):
        raise ImportError(f"opbridge's ops library {path} is missing from this installation. Reinstall it: {REINSTALL}")
    try:
        torch.ops.load_library(path)
    except OSError as error:
        raise ImportError(
            f"opbridge's compiled ops ({path}, built for torch {build_info.TORCH_VERSION}, "
            f"{getattr(build_info, 'TORCH_ABI', 'classic')} ABI) failed to load under torch {torch.__version__}: "
            f"{error}. Rebuild them: {REINSTALL}"
        ) from error


#: The path of the CUDA ops' library once loaded (a CUDA build of torch and an opbridge built with nvcc), else None.
cuda_library: str | None = None


def _load_cuda(build_info: ModuleType) -> None:
    """Registers the CUDA implementations of the ops (libopbridge_cuda.so beside _C), only under a CUDA build of
    torch: a CPU-only torch never loads it. A library that fails to load leaves the CPU ops working and says why."""
    global cuda_library
    name = getattr(build_info, "CUDA_LIBRARY", "")
    if torch.version.cuda is None:
        return
    if not name:
        refuse_cuda("opbridge", "this opbridge was built without its CUDA library (no CUDA compiler at build time)")
        return
    path = os.path.join(os.path.dirname(build_info.__file__), name)
    problem = driver_problem(getattr(build_info, "CUDA_RUNTIME", ""), cuda_driver_version())
    if problem:
        warnings.warn(
            f"opbridge's CUDA ops ({path}) are not loaded: {problem}. The CPU ops work; CUDA tensors passed to "
            "opbridge's ops raise an error that says this.",
            RuntimeWarning,
            stacklevel=3,
        )
        refuse_cuda("opbridge", problem)
        return
    try:
        torch.ops.load_library(path)
    except OSError as error:
        warnings.warn(
            f"opbridge's CUDA ops ({path}) failed to load under torch {torch.__version__}: {error}. The CPU ops "
            f"work; CUDA tensors passed to opbridge's ops will fail. Reinstall opbridge: {REINSTALL}",
            RuntimeWarning,
            stacklevel=3,
        )
        refuse_cuda("opbridge", f"its CUDA library failed to load: {error}")
        return
    cuda_library = path  # it has a kernel for every op (tests/test_cuda.py checks): no scan at import


def cuda_driver_version() -> int | None:
    """The CUDA version the NVIDIA driver supports (1000 * major + 10 * minor, as cuDriverGetVersion gives it), or
    None without a driver. Asks libcuda directly: no CUDA context is created."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return version.value


def driver_problem(runtime: str, driver: int | None) -> str:
    """Why a CUDA library linked with CUDA `runtime` ("13.0") cannot run under a driver for CUDA `driver`, or "".
    CUDA's minor-version compatibility: a runtime runs on any driver of its major release or newer. Without a
    driver (None) there is nothing to run on and nothing to say; a build that did not record its runtime ("")
    is trusted."""
    if driver is None or not runtime:
        return ""
    needed = int(runtime.split(".")[0])
    if driver // 1000 >= needed:
        return ""
    return (
        f"the NVIDIA driver supports CUDA {driver // 1000}.{driver % 1000 // 10}, but opbridge's CUDA library is "
        f"built with CUDA {runtime} and needs a driver for CUDA >= {needed}.0"
        + (" (R580 or newer)" if needed == 13 else "")
        + ". Update the NVIDIA driver, or build opbridge from source with this machine's CUDA toolkit "
        '(docs/packaging.md, "CUDA in the wheels")'
    )


#: The CUDA kernels that only refuse, by op name (see refuse_cuda).
cuda_refusals: dict[str, object] = {}
_refusing_libraries: list[torch.library.Library] = []


def refuse_cuda(namespace: str, reason: str) -> list[str]:
    """Gives every op of `namespace` without a CUDA kernel one that raises a RuntimeError naming the op, the device
    and what to do, in place of the dispatcher's "Could not run ... with arguments from the 'CUDA' backend" (which
    tells a user nothing). Returns the ops it covered."""
    covered = []
    library = None
    for qualified in sorted(torch._C._dispatch_get_all_op_names()):
        op_namespace, _, name = qualified.partition("::")
        if op_namespace != namespace or torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CUDA"):
            continue
        if library is None:
            library = torch.library.Library(namespace, "IMPL")
            _refusing_libraries.append(library)

        def refuse(*args, _qualified=qualified, **kwargs):
            devices = sorted({str(a.device) for a in args if isinstance(a, torch.Tensor)})
            raise RuntimeError(
                f"{_qualified} cannot run on CUDA tensors (got tensors on {', '.join(devices) or 'cuda'}): {reason}. "
                "Move its inputs to the CPU (tensor.cpu()) and the result back (.cuda()), or install an opbridge "
                "with its CUDA library (the stable-ABI wheels carry it; a source build needs nvcc: docs/packaging.md)."
            )

        library.impl(name, refuse, "CUDA")
        cuda_refusals[qualified] = refuse
        covered.append(qualified)
    return covered
