"""opbridge_ort: run models that use opbridge's custom ONNX ops in ONNX Runtime.

This package never imports torch: a deployment needs only ``onnxruntime``.

    import opbridge_ort
    session = opbridge_ort.InferenceSession("model.onnx")
    outputs = session.run(None, {"a": a, "b": b})

or, with your own session options::

    options = opbridge_ort.session_options()      # or session_options(existing)
    session = onnxruntime.InferenceSession("model.onnx", options)

The library (``library_path()``) registers the ``opbridge`` domain; ``ops()``
lists its ops (e.g. MyAdd and DeformConv2d, the latter with the inputs and
attributes of ONNX DeformConv), read from the library file itself. It works
with ONNX Runtime 1.16 and newer.
"""

from __future__ import annotations

import functools
import os
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnxruntime

__all__ = [
    "DOMAIN",
    "OPS",
    "InferenceSession",
    "cuda_architectures",
    "cuda_library_path",
    "foreign_ops",
    "library_path",
    "ops",
    "session_options",
]

#: The ONNX domain of opbridge's custom ops.
DOMAIN = "opbridge"
# How inspect's report of a library node begins where the library has no kernel for its inputs' element types.
NO_KERNEL_FOR_TYPES = "no kernel in the opbridge library for these input types"
# How ONNX Runtime refuses a custom node's input element types: a type no kernel declares, a mix none declares.
TYPE_REFUSALS = ("Type Error: Type 'tensor(", "no kernel def matches")
_LIBRARY_NAME = "libopbridge_ort.so"
_CUDA_LIBRARY_NAME = "libopbridge_ort_cuda.so"
# Each op's C++ file leaves this marker in the library (OPBRIDGE_ORT_OP in cpp/ort/api.h).
_OP_MARKER = re.compile(rb"opbridge-ort-op:([A-Za-z_][A-Za-z0-9_]*):([0-9]+)\x00")
_FOREIGN_MARKER = re.compile(
    rb"opbridge-ort-foreign-op:([A-Za-z_][A-Za-z0-9_.]*):([A-Za-z_][A-Za-z0-9_]*):([0-9]+)\x00"
)
# Marks session options that already carry the library: registering it twice
# would make ORT refuse the duplicate "opbridge" domain.
_REGISTERED_KEY = "opbridge.custom_ops_library"


def library_path() -> str:
    """Absolute path of the opbridge ONNX Runtime custom-op library.

    The environment variable ``OPBRIDGE_ORT_LIBRARY`` overrides it (e.g. a library
    built alone with CMake). Raises FileNotFoundError, saying what to do, if the
    library is missing.
    """
    override = os.environ.get("OPBRIDGE_ORT_LIBRARY")
    path = Path(override) if override else Path(__file__).with_name(_LIBRARY_NAME)
    if not path.is_file():
        where = "OPBRIDGE_ORT_LIBRARY points to" if override else "opbridge_ort expects"
        raise FileNotFoundError(
            f"{where} the custom-op library at {path}, but there is no such file. Reinstall the package "
            "(pip install ./python/runtime from an opbridge checkout: the opbridge-ort package), or build the "
            "library with CMake "
            "(cmake -S . -B build -DOPBRIDGE_BUILD_TORCH=OFF && cmake --build build) and set "
            "OPBRIDGE_ORT_LIBRARY to build/cpp/ort/libopbridge_ort.so."
        )
    return str(path.resolve())


def cuda_library_path() -> str | None:
    """Absolute path of the library's CUDA nodes (``libopbridge_ort_cuda.so``, beside :func:`library_path`), or None
    where this installation has none (built without nvcc). The main library opens it by itself when the runtime has
    the CUDA execution provider; :func:`ops` and :func:`foreign_ops` of this path list the nodes that then run on
    the GPU."""
    try:
        path = Path(library_path()).with_name(_CUDA_LIBRARY_NAME)
    except FileNotFoundError:
        return None
    return str(path) if path.is_file() else None


def cuda_architectures(path: str) -> dict[str, list[int]]:
    """The GPUs a CUDA library has code for, read from its fat binary (the ELF section ``.nv_fatbin``):
    ``{"sm": [75, 80, ...], "ptx": [120]}``, machine code by compute capability and PTX, which a newer GPU's
    driver compiles at load. Works on opbridge's CUDA libraries (``cuda_library_path()``, and the torch wheel's
    ``libopbridge_cuda.so``) without a GPU or CUDA. Raises ValueError for a file with no fat binary."""
    data = Path(path).read_bytes()
    if data[:5] != b"\x7fELF\x02":
        raise ValueError(f"{path} is not a 64-bit ELF library")
    try:
        fatbin = _section(data, b".nv_fatbin")
    except (struct.error, ValueError, IndexError) as error:
        raise ValueError(f"{path} is not a readable ELF library (its section table: {error})") from error
    if fatbin is None:
        raise ValueError(f"{path} has no CUDA fat binary (.nv_fatbin section)")
    try:
        return _fatbin_architectures(fatbin)
    except (struct.error, ValueError) as error:
        raise ValueError(f"{path}: its CUDA fat binary is not one this reader knows ({error})") from error


def _fatbin_architectures(fatbin: bytes) -> dict[str, list[int]]:
    found: dict[str, set[int]] = {"sm": set(), "ptx": set()}
    position = 0
    # Fat binaries one after another, each a 16-byte header (magic, version, header size, size of its entries)
    # and entries (kind 1: PTX, 2: ELF machine code; the compute capability at byte 28 of the entry's header).
    while position + 16 <= len(fatbin):
        magic, _, header, size = struct.unpack_from("<IHHQ", fatbin, position)
        if magic != 0xBA55ED50:
            break
        entry, end = position + header, position + header + size
        while entry < end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", fatbin, entry)
            (architecture,) = struct.unpack_from("<I", fatbin, entry + 28)
            if entry_header + payload == 0:
                raise ValueError(f"an empty entry at byte {entry}")
            if kind in (1, 2):
                found["ptx" if kind == 1 else "sm"].add(architecture)
            entry += entry_header + payload
        position = end
    return {kind: sorted(values) for kind, values in found.items()}


def _section(data: bytes, wanted: bytes) -> bytes | None:
    """The bytes of a 64-bit ELF file's section named `wanted`, or None."""
    (table,) = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    # Each section header's name, offset and size (skipping its type, flags and address).
    headers = [struct.unpack_from("<I20xQQ", data, table + i * entry_size) for i in range(count)]
    names_offset = headers[names_index][1]
    for name, offset, size in headers:
        start = names_offset + name
        if data[start : data.index(b"\0", start)] == wanted:
            return data[offset : offset + size]
    return None


@functools.cache
def _ops_of(path: str, modified: float) -> dict[str, int]:
    return {m.group(1).decode(): int(m.group(2)) for m in _OP_MARKER.finditer(Path(path).read_bytes())}


@functools.cache
def _foreign_ops_of(path: str, modified: float) -> dict[tuple[str, str], int]:
    found = _FOREIGN_MARKER.finditer(Path(path).read_bytes())
    return {(m.group(1).decode(), m.group(2).decode()): int(m.group(3)) for m in found}


def ops(library: str | os.PathLike | None = None) -> dict[str, int]:
    """The ops the library registers in the ``opbridge`` domain, with the domain version that
    introduced each: read from the library file (default :func:`library_path`), without
    loading it into a runtime and without importing onnxruntime."""
    path = os.fspath(library) if library is not None else library_path()
    return dict(_ops_of(path, os.path.getmtime(path)))


def foreign_ops(library: str | os.PathLike | None = None) -> dict[tuple[str, str], int]:
    """Nodes of other projects' domains the library also runs, ``{(domain, op_type): version}``: e.g.
    ``("mmcv", "MMCVModulatedDeformConv2d")``, which mmcv's and mmdeploy's exporters write, so models they
    exported run with :func:`InferenceSession` on every ORT >= 1.16. Read from the library file."""
    path = os.fspath(library) if library is not None else library_path()
    return dict(_foreign_ops_of(path, os.path.getmtime(path)))


def __getattr__(name: str) -> Any:
    if name == "OPS":  # what ops() says of the installed library; read when first asked for
        return ops()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_registered(options: onnxruntime.SessionOptions) -> bool:
    try:
        return options.get_session_config_entry(_REGISTERED_KEY) == "1"
    except Exception:  # ORT raises when the key is absent
        return False


def session_options(options: onnxruntime.SessionOptions | None = None) -> onnxruntime.SessionOptions:
    """Session options with the opbridge library registered.

    Registers on ``options`` if given, otherwise on new default options, and returns them. Options that
    already carry the library (from this function, or from ``options.register_custom_ops_library(
    library_path())`` by hand) keep it once: registering twice is harmless.

    Raises:
        TypeError: ``options`` is not an ``onnxruntime.SessionOptions``.
        FileNotFoundError: the library is missing (see :func:`library_path`).
    """
    import onnxruntime

    if options is None:
        options = onnxruntime.SessionOptions()
    if not isinstance(options, onnxruntime.SessionOptions):
        raise TypeError(f"options must be an onnxruntime.SessionOptions or None, got {type(options).__name__}")
    if not _is_registered(options):
        options.register_custom_ops_library(library_path())
    return options


def InferenceSession(
    model: Any,
    sess_options: onnxruntime.SessionOptions | None = None,
    providers: list[Any] | None = None,
    **kwargs: Any,
) -> onnxruntime.InferenceSession:
    """``onnxruntime.InferenceSession`` with the opbridge library registered.

    ``model`` is a path, serialized bytes or an ``onnx.ModelProto``. Providers default to the CPU provider; pass
    ``providers=["CUDAExecutionProvider", "CPUExecutionProvider"]`` (with onnxruntime-gpu) to place nodes on the GPU:
    the library's CUDA nodes (:func:`cuda_library_path`; ``python -m opbridge_ort inspect`` says which) then run
    there, the others on the CPU provider.
    """
    import onnxruntime

    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    elif isinstance(model, os.PathLike):
        model = os.fspath(model)
    if not isinstance(model, (str, bytes)):
        raise TypeError(
            f"model must be a path, the bytes of a serialized model or an onnx.ModelProto, got {type(model).__name__}"
        )
    try:
        return onnxruntime.InferenceSession(
            model,
            sess_options=session_options(sess_options),
            providers=providers if providers is not None else ["CPUExecutionProvider"],
            **kwargs,
        )
    except Exception as error:
        # ORT's message for a library node given element types it has no kernel for names neither the input nor
        # the types it takes ("no kernel def matches node inputs"): inspect's check of each node says both.
        refused = any(text in str(error) for text in TYPE_REFUSALS)
        problems = _element_type_problems(model) if refused else []
        if not problems:
            raise
        message = f"{error}\n" + "\n".join(problems)
        try:
            better = type(error)(message)
        except Exception:
            better = RuntimeError(message)
        raise better from error


def _element_type_problems(model: str | bytes) -> list[str]:
    """What inspect says of the library's nodes in ``model`` that have no kernel for their inputs' element types."""
    try:
        import onnx

        from .inspect import inspect_model

        proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model, load_external_data=False)
        _, reports = inspect_model(proto)
    except Exception:  # no onnx, or a model it cannot read: ORT's own error stands
        return []
    return [f"{r.domain}::{r.op_type}: {r.how}" for r in reports if r.how.startswith(NO_KERNEL_FOR_TYPES)]
