"""Packaging: which torch a build loads under (stable ABI from 2.10, classic builds on their own torch), the wheels'
versions and requirements, one owner per installed file, and the stable build's use of torch's C shim only.

The matrix (`nox -t matrix`) runs this file against the installed wheels on every supported torch."""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import opbridge
from opbridge import _extension

ROOT = Path(__file__).parent.parent
BUILD_INFO = importlib.import_module("opbridge._build_info")
PUBLIC = torch.__version__.split("+")[0]
TORCH_RELEASE = tuple(int(p) for p in PUBLIC.split(".")[:2])
OPS_LIBRARY = Path(BUILD_INFO.__file__).parent / BUILD_INFO.OPS_LIBRARY


@pytest.fixture
def provider():
    sys.path.insert(0, str(ROOT / "cmake"))
    try:
        yield importlib.import_module("opbridge_metadata")
    finally:
        sys.path.remove(str(ROOT / "cmake"))


def test_classic_build_under_another_torch_names_both_versions(monkeypatch):
    other = "2.6.0" if PUBLIC != "2.6.0" else "2.9.1"  # any release but the running one (the matrix runs 2.6.0)
    monkeypatch.setattr(BUILD_INFO, "TORCH_ABI", "classic")
    monkeypatch.setattr(BUILD_INFO, "TORCH_VERSION", other)
    with pytest.raises(ImportError) as error:
        _extension.load()
    message = str(error.value)
    assert f"built for torch {other}" in message and torch.__version__ in message
    assert f"install torch=={other}" in message and "--no-build-isolation" in message


def test_a_missing_or_foreign_ops_library_is_an_import_error_saying_what_to_do(monkeypatch, tmp_path):
    """libopbridge_ops.so gone from the installation, or a file torch cannot load in its place: ImportError naming
    the file and the reinstall, never a crash."""
    monkeypatch.setattr(BUILD_INFO, "OPS_LIBRARY", "libopbridge_ops_gone.so")
    with pytest.raises(ImportError, match=r"ops library .*libopbridge_ops_gone\.so is missing.*Reinstall"):
        _extension.load()
    foreign = tmp_path / "not_a_library.so"
    foreign.write_bytes(b"not an ELF file")
    monkeypatch.setattr(BUILD_INFO, "OPS_LIBRARY", str(foreign))  # an absolute name replaces the directory
    with pytest.raises(ImportError, match=r"not_a_library\.so, built for torch .* failed to load under torch"):
        _extension.load()


def test_stable_build_under_an_older_torch_names_the_floor(monkeypatch):
    monkeypatch.setattr(BUILD_INFO, "TORCH_ABI", "stable")
    monkeypatch.setattr(BUILD_INFO, "STABLE_FLOOR", "99.0")
    with pytest.raises(ImportError) as error:
        _extension.load()
    message = str(error.value)
    assert "stable ABI" in message and "torch >= 99.0" in message and torch.__version__ in message
    assert f"--find-links <wheel directory> opbridge torch=={PUBLIC}" in message


@pytest.mark.parametrize(
    ("abi", "built_for", "running", "loads"),
    [
        ("stable", "2.10.0", "2.10.0", True),
        ("stable", "2.10.0", "2.15.0+cu130", True),
        ("stable", "2.10.0", "3.0.0", True),
        ("stable", "2.10.0", "2.9.1", False),
        ("classic", "2.9.1", "2.9.1+cpu", True),
        ("classic", "2.9.1", "2.9.0", False),
        ("classic", "2.6.0", "2.10.0", False),
    ],
)
def test_which_torch_a_build_loads_under(monkeypatch, abi, built_for, running, loads):
    monkeypatch.setattr(BUILD_INFO, "TORCH_ABI", abi)
    monkeypatch.setattr(BUILD_INFO, "TORCH_VERSION", built_for)
    monkeypatch.setattr(BUILD_INFO, "STABLE_FLOOR", "2.10")
    assert _extension.compatible(BUILD_INFO, running) is loads


def test_same_release_other_build_is_accepted(monkeypatch):
    """2.14.1+cpu and 2.14.1+cu130 share the C++ ABI a classic build uses."""
    monkeypatch.setattr(BUILD_INFO, "TORCH_ABI", "classic")
    monkeypatch.setattr(BUILD_INFO, "TORCH_VERSION", PUBLIC + "+someotherbuild")
    assert _extension.load() is importlib.import_module("opbridge._C")


def test_metadata_provider_versions_and_requirements(provider):
    release = provider.release()
    assert release == metadata.version("opbridge-ort"), "the runtime wheel's pyproject.toml holds the release"
    assert provider.metadata("version", "0.1.0", [], "2.10.0", "stable") == "0.1.0.210"
    assert provider.metadata("version", "0.1.0", [], "2.15.0", "stable") == "0.1.0.210"
    assert provider.metadata("version", "0.1.0", [], "2.9.1", "classic") == "0.1.0.209"
    assert provider.metadata("version", "0.1.0", [], "2.6.0", "classic") == "0.1.0.206"
    assert provider.metadata("dependencies", "0.1.0", ["numpy"], "2.14.1", "stable") == [
        "numpy",
        "opbridge-ort==0.1.0",
        "torch>=2.10",
    ]
    assert provider.metadata("dependencies", "0.1.0", [], "2.9.1", "classic") == [
        "opbridge-ort==0.1.0",
        "torch==2.9.1",
    ]
    with pytest.raises(RuntimeError, match="provides 'version' and 'dependencies'"):
        provider.metadata("name", "0.1.0", [], "2.10.0", "stable")


def test_metadata_provider_picks_the_layer_as_cmake_does(provider):
    assert provider.torch_layer("2.10.0") == "stable"
    assert provider.torch_layer("2.15.0") == "stable"
    assert provider.torch_layer("2.9.1") == "classic"
    assert provider.torch_layer("2.14.1", "classic") == "classic"
    with pytest.raises(RuntimeError, match=r"needs torch >= 2\.10"):
        provider.torch_layer("2.9.1", "stable")
    with pytest.raises(RuntimeError, match="auto, stable or classic"):
        provider.torch_layer("2.14.1", "fast")
    cmake = (ROOT / "cmake" / "OpbridgeTorch.cmake").read_text()
    assert f"set(OPBRIDGE_TORCH_STABLE_FLOOR {provider.STABLE_FLOOR[0]}.{provider.STABLE_FLOOR[1]})" in cmake


def _stand_in_wheel(directory: Path, name: str, version: str, requires: list[str]) -> None:
    """A wheel carrying only metadata: what pip's resolver reads."""
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    metadata_text = "".join(
        [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", *(f"Requires-Dist: {r}\n" for r in requires)]
    )
    with zipfile.ZipFile(directory / f"{stem}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{info}/METADATA", metadata_text)
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")


@pytest.mark.parametrize(
    ("torch_version", "expected"),
    [
        ("2.6.0", "0.1.0.206"),
        ("2.9.1", "0.1.0.209"),
        ("2.10.0", "0.1.0.210"),
        ("2.15.0", "0.1.0.210"),
        ("2.16.0", "0.1.0.210"),  # a torch released after the wheel
        ("2.8.0", None),  # no wheel loads under it: pip must refuse rather than pick one
    ],
)
def test_pip_picks_the_wheel_that_loads_under_the_installed_torch(provider, tmp_path, torch_version, expected):
    """The version scheme under pip's own resolver, offline: opbridge wheels with the versions and requirements the
    metadata provider gives (stable from 2.10, classic 2.6.0 and 2.9.1), stand-in torch and opbridge-ort wheels, and
    the README's install (`opbridge torch==<installed>`)."""
    for torch_release, layer in [("2.6.0", "classic"), ("2.9.1", "classic"), ("2.10.0", "stable")]:
        version = provider.metadata("version", "0.1.0", [], torch_release, layer)
        _stand_in_wheel(
            tmp_path, "opbridge", version, provider.metadata("dependencies", "0.1.0", [], torch_release, layer)
        )
    _stand_in_wheel(tmp_path, "opbridge-ort", "0.1.0", [])
    for torch_release in ["2.6.0", "2.8.0", "2.9.1", "2.10.0", "2.15.0", "2.16.0"]:
        _stand_in_wheel(tmp_path, "torch", torch_release, [])
    report = tmp_path / "report.json"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-index", "--find-links",
         str(tmp_path), "--quiet", "--report", str(report), "opbridge", f"torch=={torch_version}"],
        capture_output=True, text=True, env=environment,
    )  # fmt: skip
    if expected is None:
        assert result.returncode != 0 and "opbridge" in result.stderr, result.stderr
        return
    assert result.returncode == 0, result.stderr
    chosen = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert chosen["opbridge"] == expected
    assert chosen["torch"] == torch_version and chosen["opbridge-ort"] == "0.1.0"


def test_installed_metadata_is_index_ready_and_follows_the_build():
    version = metadata.version("opbridge")
    assert "+" not in version, "no local version labels in what users install"
    release = metadata.version("opbridge-ort")
    requirements = metadata.requires("opbridge")
    assert f"opbridge-ort=={release}" in requirements
    if BUILD_INFO.TORCH_ABI == "stable":
        assert version == f"{release}.210"
        assert "torch>=2.10" in requirements
    else:
        major, minor = (int(p) for p in BUILD_INFO.TORCH_VERSION.split(".")[:2])
        assert version == f"{release}.{major * 100 + minor}"
        assert f"torch=={BUILD_INFO.TORCH_VERSION.split('+')[0]}" in requirements


def test_one_owner_per_installed_file():
    """The torch wheel depends on the runtime wheel instead of carrying opbridge_ort: uninstalling one never
    removes the other's files."""
    torch_wheel_files = {str(f) for f in metadata.files("opbridge") or []}
    runtime_files = {str(f) for f in metadata.files("opbridge-ort") or []}
    assert not any(f.startswith("opbridge_ort/") for f in torch_wheel_files)
    assert any(f.startswith("opbridge_ort/libopbridge_ort") for f in runtime_files)
    assert not any(f.startswith("opbridge/") for f in runtime_files)
    assert not torch_wheel_files & runtime_files - {f for f in runtime_files if ".dist-info" in f}


def test_build_layer_is_the_one_for_this_torch():
    assert opbridge._C.TORCH_ABI == BUILD_INFO.TORCH_ABI
    if TORCH_RELEASE >= (2, 10) and BUILD_INFO.TORCH_ABI == "stable":
        expected = "pyobject" if TORCH_RELEASE >= (2, 14) else "torch.ops"
        assert expected in opbridge._C.PYTHON_CALL_PATH


def _dynamic_symbols(library: Path) -> tuple[list[str], list[str]]:
    """(NEEDED libraries, undefined dynamic symbols) of an ELF file."""
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    needed = [line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
    symbols = subprocess.run(
        ["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout.split()
    return needed, [s for s in symbols if s not in {"U", "w", "v"}]


@pytest.mark.skipif(BUILD_INFO.TORCH_ABI != "stable", reason="the classic build (torch < 2.10) links ATen by design")
@pytest.mark.skipif(not (shutil.which("readelf") and shutil.which("nm")), reason="needs binutils (readelf, nm)")
def test_stable_build_uses_only_torchs_c_shim():
    """TORCH_STABLE_ONLY in effect: the module imports no C++ symbol of c10, ATen or torch (whose ABI changes with
    every release), links neither libc10, libtorch_python nor an OpenMP runtime, and reaches torch only through
    the C functions of the stable shim."""
    shim = set()
    for library in (Path(opbridge._C.__file__), OPS_LIBRARY):
        needed, undefined = _dynamic_symbols(library)
        assert not [n for n in needed if n.startswith(("libc10", "libtorch_python", "libgomp", "libiomp"))], needed
        cxx_torch = [s for s in undefined if s.startswith(("_ZN3c10", "_ZN2at", "_ZN5torch", "_ZNK3c10", "_ZNK2at"))]
        assert not cxx_torch, f"C++ symbols of torch in {library.name}: {cxx_torch[:10]}"
        shim |= {s.split("@")[0] for s in undefined if s.startswith(("aoti_torch_", "torch_"))}
    assert {"torch_call_dispatcher", "torch_parallel_for"} <= shim


@pytest.mark.skipif(not (shutil.which("readelf") and shutil.which("nm")), reason="needs binutils (readelf, nm)")
def test_ops_library_has_no_python():
    """libopbridge_ops.so (every op's registration) neither links libpython nor uses a symbol of the Python C API
    or pybind11, so one file serves every Python; only opbridge._C is per Python. It is what torch loaded."""
    needed, undefined = _dynamic_symbols(OPS_LIBRARY)
    assert not [n for n in needed if n.startswith(("libpython", "libtorch_python"))], needed
    python_api = [s for s in undefined if s.startswith(("Py", "_Py", "_ZN8pybind11"))]
    assert not python_api, f"Python symbols in {OPS_LIBRARY.name}: {python_api[:10]}"
    assert OPS_LIBRARY.resolve() in {Path(p).resolve() for p in torch.ops.loaded_libraries}


def test_pybind_my_add_takes_and_returns_torch_tensors():
    """opbridge._C.my_add on whichever path this torch offers (see PYTHON_CALL_PATH): values, autograd through
    the registered op, and a clear error for a non-tensor."""
    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64)
    out = opbridge._C.my_add(a, b)
    assert type(out) is torch.Tensor
    torch.testing.assert_close(out, 2 * a + b, rtol=0, atol=0)
    out.sum().backward()
    torch.testing.assert_close(a.grad, torch.full_like(a, 2.0))
    with pytest.raises(TypeError, match=r"opbridge::my_add: b must be a torch.Tensor, got int"):
        opbridge._C.my_add(a, 3)
    with pytest.raises(RuntimeError, match=r"a and b must have the same dtype, got a: torch.float64"):
        opbridge._C.my_add(a, b.float())


def test_errors_thrown_in_the_libraries_reach_the_caller():
    """An error raised inside the installed libraries (C++ exceptions; in a wheel libstdc++ is linked into each
    library, its symbols hidden) reaches Python whole: the ops library's checks as torch's RuntimeError, and the
    ORT library's as an error status of the session run naming the op and the input, never an abort."""
    with pytest.raises(RuntimeError, match=r"opbridge::my_add: a of shape \[2\] and b of shape \[3\] cannot"):
        torch.ops.opbridge.my_add(torch.ones(2), torch.ones(3))
    value = torch.zeros(1, 4, 2, 8)
    shapes, starts = torch.tensor([[2, 2]]), torch.tensor([0])
    locations, weights = torch.zeros(1, 3, 2, 1, 1, 2), torch.ones(1, 3, 2, 1, 1)
    with pytest.raises(RuntimeError, match=r"ms_deform_attn"):
        torch.ops.opbridge.ms_deform_attn(value, shapes, starts, locations.double(), weights)
    onnx = pytest.importorskip("onnx", reason="needs onnx to write the ORT model")
    ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime")
    import numpy as np

    import opbridge_ort

    helper, TensorProto = onnx.helper, onnx.TensorProto

    node = helper.make_node("MyAdd", ["a", "b"], ["c"], domain="opbridge")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "ab"],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), opbridge_ort.session_options(),
                                   providers=["CPUExecutionProvider"])  # fmt: skip
    with pytest.raises(Exception, match=r"opbridge::MyAdd.*input A") as error:
        session.run(None, {"a": np.ones((2, 3), np.float32), "b": np.ones((4,), np.float32)})
    assert type(error.value).__module__.startswith("onnxruntime"), type(error.value)


def test_both_cuda_libraries_have_code_for_the_same_gpus():
    """The torch ops' CUDA library and the ORT nodes' serve the same GPUs (the wheels: WHEEL_CUDA_ARCHITECTURES
    of the noxfile, sm_75 to sm_120 and PTX), read from their fat binaries."""
    import opbridge_ort

    ort_library = opbridge_ort.cuda_library_path()
    if not BUILD_INFO.CUDA_LIBRARY or ort_library is None:
        pytest.skip("needs both CUDA libraries (opbridge and opbridge_ort built where nvcc is, or the wheels)")
    torch_library = Path(BUILD_INFO.__file__).parent / BUILD_INFO.CUDA_LIBRARY
    found = opbridge_ort.cuda_architectures(str(torch_library))
    assert found == opbridge_ort.cuda_architectures(ort_library)
    assert found["sm"] and found["ptx"] and max(found["ptx"]) >= max(found["sm"])
