"""The release workflow (.github/workflows/release.yml) and the tools it runs: its job matrix is generated from the
noxfile (one job per compatibility cell, python/opbridge/tools/ci_matrix.py), the cells' reports merge into
docs/compatibility.md (tests/test_compatibility_report.py), and every wheel passes one audit
(python/opbridge/tools/repair_wheel.py, also cibuildwheel's repair step). The workflow cannot run here; its
lint is `nox -s lint`."""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

from opbridge.tools import ci_matrix, cuda_toolkit, repair_wheel

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


@functools.cache
def _noxfile():
    """The noxfile's constants (loaded once per process: nox registers its sessions at import)."""
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_job_matrix_is_every_matrix_session_of_the_noxfile():
    """What the workflow's `plan` job runs, on the real noxfile: one job per (Python, torch, ORT) of MATRIX_RUNS,
    the Python axis included, each naming the nox session that runs it."""
    listed = subprocess.run([sys.executable, "-m", "nox", "-l", "--json", "-t", "matrix"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    jobs = ci_matrix.jobs(json.loads(listed))["include"]
    noxfile = _noxfile()
    assert {(j["python"], j["torch"], j["onnxruntime"]) for j in jobs} == set(noxfile.MATRIX_RUNS)
    assert len(jobs) == len(noxfile.MATRIX_RUNS)
    assert {j["python"] for j in jobs if j["torch"] == noxfile.TORCH} >= {"3.10", "3.11", "3.12", "3.13"}
    for job in jobs:
        assert job["session"] == f"matrix(py{job['python']}-torch{job['torch']}-ort{job['onnxruntime']})"


def test_the_job_matrix_refuses_what_is_not_a_matrix_cell(tmp_path, capsys):
    with pytest.raises(ValueError, match="no 'matrix' session"):
        ci_matrix.jobs([{"name": "tests", "session": "tests", "python": None, "call_spec": {}}])
    with pytest.raises(ValueError, match="has no"):
        ci_matrix.jobs([{"name": "matrix", "session": "matrix(x)", "python": "3.12", "call_spec": {"torch": "2.14.1"}}])
    cell = {"name": "matrix", "session": "matrix(a)", "python": "3.12", "call_spec": {"torch": "2", "onnxruntime": "1"}}
    with pytest.raises(ValueError, match="twice"):
        ci_matrix.jobs([cell, cell])
    listing = tmp_path / "sessions.json"
    listing.write_text("not json")
    assert ci_matrix.main(["ci_matrix", str(listing)]) == 1
    assert "ci_matrix:" in capsys.readouterr().err


def test_the_workflow_runs_the_generated_matrix_and_merges_its_reports():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    jobs = workflow["jobs"]
    plan = " ".join(step.get("run", "") for step in jobs["plan"]["steps"])
    assert "nox -l --json -t matrix" in plan and "python/opbridge/tools/ci_matrix.py" in plan
    assert jobs["matrix"]["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert set(jobs["matrix"]["needs"]) == {"wheels", "runtime-wheel", "plan"}
    matrix_steps = jobs["matrix"]["steps"]
    assert any("nox -s" in step.get("run", "") and step.get("env", {}).get("SESSION") == "${{ matrix.session }}"
               for step in matrix_steps)  # fmt: skip
    assert any(step.get("with", {}).get("path") == "reports/matrix/*.json" for step in matrix_steps)
    report = jobs["report"]
    assert report["needs"] == "matrix"
    assert any(step.get("with", {}).get("path") == "reports/matrix" for step in report["steps"])
    assert any("nox -s report" in step.get("run", "") for step in report["steps"])
    # The wheel jobs build what `nox -s wheels` builds: the stable wheel and each classic torch's.
    targets = {entry["target"] for entry in jobs["wheels"]["strategy"]["matrix"]["include"]}
    noxfile = _noxfile()
    assert targets == {t for t in noxfile.WHEEL_TARGETS if t != "runtime"}


def test_cibuildwheel_builds_every_python_with_the_wheels_settings():
    """pyproject.toml's cibuildwheel config: a wheel per CPython of the noxfile's PYTHONS in the manylinux_2_28
    image, with the same CMake settings as `nox -s wheels` and the same repair and audit."""
    noxfile = _noxfile()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    assert sorted(config["build"]) == sorted(f"cp{p.replace('.', '')}-manylinux_x86_64" for p in noxfile.PYTHONS)
    assert config["manylinux-x86_64-image"] == "manylinux_2_28"
    settings = {f"--config-settings={k}={v}" for k, v in config["config-settings"].items()}
    assert settings == set(noxfile.WHEEL_DEFINES)
    assert "repair_wheel.py" in config["repair-wheel-command"]
    runtime = tomllib.loads((ROOT / "python" / "runtime" / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    assert "repair_wheel.py" in runtime["repair-wheel-command"]
    assert {f"--config-settings={k}={v}" for k, v in runtime["config-settings"].items()} == set(noxfile.WHEEL_DEFINES)


def test_the_wheels_build_their_cuda_libraries_as_nox_does():
    """The stable wheels carry the CUDA ops and the runtime wheel the ORT CUDA nodes, built with the pinned toolkit
    (cuda_toolkit.py installs it where CUDACXX points); the classic wheels carry none: in the workflow's matrix, in
    cibuildwheel's settings and in `nox -s wheels` (WHEEL_CUDA)."""
    noxfile = _noxfile()
    nvcc = str(cuda_toolkit.nvcc(Path("/tmp/opbridge-cuda")))
    torch_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    runtime = tomllib.loads((ROOT / "python" / "runtime" / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    for config, variable, target in ((torch_config, "OPBRIDGE_BUILD_CUDA", "stable"),
                                     (runtime, "OPBRIDGE_BUILD_ORT_CUDA", "runtime")):  # fmt: skip
        assert config["environment"][variable] == noxfile.WHEEL_CUDA[target][variable] == "ON"
        assert config["environment"]["CUDACXX"] == nvcc
        assert "cuda_toolkit.py /tmp/opbridge-cuda" in config["before-build"]
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    wheels = workflow["jobs"]["wheels"]
    for entry in wheels["strategy"]["matrix"]["include"]:
        expected = noxfile.WHEEL_CUDA.get(entry["target"], {}).get("OPBRIDGE_BUILD_CUDA", "OFF")
        assert entry["cuda"] == expected, entry
    (build,) = [step for step in wheels["steps"] if "cibuildwheel" in step.get("uses", "")]
    environment = build["env"]["CIBW_ENVIRONMENT_LINUX"]
    assert "OPBRIDGE_BUILD_CUDA=${{ matrix.cuda }}" in environment and f"CUDACXX={nvcc}" in environment


def _audit(tag: str, external: list[str]) -> dict:
    return {"sym_tag": tag, "external_libs": {name: None for name in external}, "unsupported_isa": []}


def test_the_audit_refuses_a_wheel_newer_than_manylinux_2_28_or_carrying_copies():
    fine = _audit("manylinux_2_17_x86_64", ["libtorch_cpu.so", "libscipy_openblas.so"])
    assert repair_wheel.problems(fine, ["opbridge/_C.so"]) == []
    assert repair_wheel.problems(_audit("manylinux2014_x86_64", []), []) == []
    assert repair_wheel.problems(_audit("manylinux_2_28_x86_64", []), []) == []
    newer = repair_wheel.problems(_audit("manylinux_2_35_x86_64", []), [])
    assert newer and "manylinux_2_35" in newer[0]
    assert repair_wheel.problems(_audit("linux_x86_64", []), [])
    grafted = repair_wheel.problems(fine, ["opbridge.libs/libstdc++-abc.so.6"])
    assert grafted and "grafted" in grafted[0]
    outside = repair_wheel.problems(_audit("manylinux_2_17_x86_64", ["libfoo.so.1"]), [])
    assert outside and "libfoo.so.1" in outside[0]
