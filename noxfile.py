"""Developer and CI entry points.

    nox -s tests          build opbridge against the default torch and run the test suite (CI runs this)
    nox -s parity         the main job: the export/ORT parity matrix on the default versions
    nox -s ort_versions   the ORT library alone (no torch) against an old, a middle and the newest ORT
    nox -s lint           ruff and clang-format

Sessions share helpers; versions are parameters. Each session keeps its own
virtualenv and CMake build directory, so re-runs are incremental.
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).parent
# The default versions (see docs/architecture.md): torch's build with working torchvision ops.
TORCH = "2.14.1"
TORCHVISION = "0.29.1"
BUILD_REQUIREMENTS = ["scikit-build-core>=0.10", "cmake>=3.21", "ninja"]
# 1.15 must be refused with a clear message; 1.16 is the oldest supported; None is the newest release.
ORT_VERSIONS = ["1.15.1", "1.16.3", "1.20.1", "1.24.4", None]
EXPORTED_MODELS = ROOT / "reports" / "exported-models"


def install_opbridge(session: nox.Session, torch: str = TORCH, torchvision: str | None = TORCHVISION) -> None:
    """torch first, then opbridge built against it (never in an isolated build env:
    pip would build against whatever torch it downloads)."""
    session.install(f"torch=={torch}", *([f"torchvision=={torchvision}"] if torchvision else []))
    session.install(*BUILD_REQUIREMENTS)
    build_dir = ROOT / "build" / f"nox-{session.name}"
    session.install("--no-build-isolation", f"--config-settings=build-dir={build_dir}", ".[test]")


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
    """Build against the default torch, run the C++ kernel tests (ctest) and pytest."""
    install_opbridge(session)
    build_dir = ROOT / "build" / "nox-ctest"
    build_ort_library_alone(session, build_dir)
    session.run("ctest", "--test-dir", str(build_dir), "--output-on-failure")
    session.run("pytest", *session.posargs)


@nox.session(default=False)
def parity(session: nox.Session) -> None:
    """The main job: every parity cell on the default versions; a failing cell fails the session."""
    install_opbridge(session)
    (ROOT / "reports").mkdir(exist_ok=True)
    session.run("python", "-m", "opbridge", "parity", "--json", str(ROOT / "reports" / "parity.json"), *session.posargs)
    # Real exported models for `nox -s ort_versions`, whose venvs have no torch.
    session.run("python", str(ROOT / "tests" / "export_reference_models.py"), str(EXPORTED_MODELS))


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


@nox.session(default=True)
def lint(session: nox.Session) -> None:
    """ruff (lint + format) for Python, clang-format for C++."""
    session.install("ruff", "clang-format")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    sources = sorted(str(p) for p in (ROOT / "cpp").rglob("*") if p.suffix in {".h", ".cc", ".cpp"})
    session.run("clang-format", "--dry-run", "--Werror", *sources)
