"""docs/compatibility.md names the wheel file (and its SHA-256) behind every matrix run, and what the tests run
under those wheels gave."""

from __future__ import annotations

from opbridge.tools import compatibility


def _report(torch: str, wheel: str | None, tests: dict | None = None, python: str = "3.11.7") -> dict:
    cell = {"op": "my_add", "exporter": "dynamo", "lowering": "custom", "opset": 18, "dtype": "float32",
            "status": "pass", "max_error": 0.0, "cases": [], "reason": ""}  # fmt: skip
    environment = {"torch": torch, "onnxruntime": "1.31.1", "python": python}
    report = {"environment": environment, "cells": [cell], "summary": "1 pass"}
    if tests:
        report["tests"] = {"files": ["test_packaging.py"], **tests}
    if wheel:
        report["wheels"] = {
            "opbridge": {"file": wheel, "sha256": "ab" * 32},
            "opbridge_ort": {"file": "opbridge_ort-0.1.0-py3-none-manylinux_2_34_x86_64.whl", "sha256": "cd" * 32},
        }
    return report


def _repository(path):
    """A git repository at `path`, and a function running git there (returning its output)."""
    import subprocess

    def git(*args):
        return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True,
                              text=True).stdout.strip()  # fmt: skip

    git("init", "-q")
    git("config", "user.email", "ci@example.invalid")
    git("config", "user.name", "ci")
    return git


def test_each_run_names_its_wheel_and_each_wheel_its_runs():
    stable = "opbridge-0.1.0.210-cp311-cp311-manylinux_2_34_x86_64.whl"
    text, failures = compatibility.render(
        [_report("2.10.0", stable), _report("2.15.0+cu130", stable), _report("2.9.1", None)]
    )
    assert failures == 0
    assert f"| torch 2.10.0 / ORT 1.31.1 / Python 3.11 | `{stable}` ({'ab' * 6}); sources not recorded |" in text
    assert "| torch 2.9.1 / ORT 1.31.1 / Python 3.11 | not recorded |" in text
    runs = "torch 2.10.0 / ORT 1.31.1 / Python 3.11; torch 2.15.0 / ORT 1.31.1 / Python 3.11"
    assert f"| `{stable}` | `{'ab' * 32}` | 2: {runs} |" in text


def test_tests_under_the_wheels_are_shown_and_a_failure_fails_the_report():
    stable = "opbridge-0.1.0.210-cp311-cp311-manylinux_2_34_x86_64.whl"
    passing = _report("2.12.1", stable, {"passed": 40, "failed": 0, "skipped": 2})
    text, failures = compatibility.render([passing, _report("2.14.1", stable)])
    assert failures == 0
    assert "| 1 pass | 40 passed, 2 skipped (test_packaging.py) |" in text
    assert "| 1 pass | not run on this axis |" in text
    failing = _report("2.13.0", stable, {"passed": 39, "failed": 1, "skipped": 2})
    text, failures = compatibility.render([passing, failing])
    assert failures == 1
    assert "**1 failed**, 39 passed, 2 skipped" in text


def test_reports_of_separate_jobs_merge_into_one_table_with_a_column_per_python(tmp_path, capsys):
    """The release workflow's last job: every matrix job's JSON report in one directory (as its artifacts are
    downloaded), merged by the report's command line into one document; a run per Python, in version order."""
    import json

    for python in ("3.13.0", "3.10.13", "3.11.7"):
        wheel = f"opbridge-0.1.0.210-cp3{python.split('.')[1]}-manylinux_2_17_x86_64.whl"
        report = _report("2.14.1", wheel, {"passed": 40, "failed": 0, "skipped": 2}, python=python)
        (tmp_path / f"py{python}-torch2.14.1-ortnewest.json").write_text(json.dumps(report))
    out = tmp_path / "compatibility.md"
    assert compatibility.main(["compatibility", str(tmp_path), str(out)]) == 0
    text = out.read_text()
    header = next(line for line in text.splitlines() if line.startswith("| exporter |"))
    columns = [f"torch 2.14.1 / ORT 1.31.1 / Python {p}" for p in ("3.10", "3.11", "3.13")]
    assert header == "| exporter | lowering | opset | " + " | ".join(columns) + " |"
    assert "cp313" in text and "3 runs" in capsys.readouterr().out


def test_runs_accumulate_in_the_store_and_older_wheels_are_marked_stale(tmp_path, capsys):
    """Each matrix run adds its reports to the committed store instead of replacing the page: a later run of some
    torch versions keeps the others; a run of the same wheel and versions replaces its old report; runs of wheels
    built from older sources stay listed, marked stale, without a column."""
    import json

    def write(directory, name, report):
        directory.mkdir(exist_ok=True)
        (directory / name).write_text(json.dumps(report))

    def versioned(torch, version, sha):
        report = _report(torch, f"opbridge-{version}-cp311-cp311-manylinux_2_17_x86_64.whl")
        report["environment"]["opbridge"] = version
        report["wheels"]["opbridge"]["sha256"] = sha * 32
        return report

    out, store = tmp_path / "compatibility.md", tmp_path / "compatibility-runs.json"
    write(tmp_path / "first", "a.json", versioned("2.10.0", "0.1.0.210", "aa"))
    write(tmp_path / "first", "b.json", versioned("2.11.0", "0.1.0.210", "aa"))
    assert compatibility.main(["c", str(tmp_path / "first"), str(out)]) == 0
    assert store.is_file() and len(json.loads(store.read_text())["runs"]) == 2
    # The classic wheel of the same release (its fourth component is its torch floor, 206) is current too.
    classic = versioned("2.6.0", "0.1.0.206", "cc")
    assert not compatibility.stale([versioned("2.10.0", "0.1.0.210", "aa"), classic])
    # A second matrix run of one torch version only, from newer sources: the other run stays, marked stale.
    write(tmp_path / "second", "c.json", versioned("2.10.0", "0.1.1.210", "bb"))
    assert compatibility.main(["c", str(tmp_path / "second"), str(out)]) == 0
    text = out.read_text()
    assert len(json.loads(store.read_text())["runs"]) == 3
    assert (
        "torch 2.11.0 / ORT 1.31.1 / Python 3.11 | `opbridge-0.1.0.210" in text
        and "**stale** (opbridge 0.1.0.210)" in text
    )
    header = next(line for line in text.splitlines() if line.startswith("| exporter |"))
    assert header == "| exporter | lowering | opset | torch 2.10.0 / ORT 1.31.1 / Python 3.11 |"
    # The same wheel and versions again: replaced, not added; and the page re-renders from the store alone.
    write(tmp_path / "third", "c.json", versioned("2.10.0", "0.1.1.210", "bb"))
    assert compatibility.main(["c", str(tmp_path / "third"), str(out)]) == 0
    assert len(json.loads(store.read_text())["runs"]) == 3
    assert compatibility.main(["c", str(tmp_path / "absent"), str(out)]) == 0
    assert out.read_text() == text
    assert "3 runs, 0 new, 2 stale" in capsys.readouterr().out


def test_a_failure_in_a_stale_run_does_not_fail_the_report():
    stable = "opbridge-0.1.0.210-cp311-cp311-manylinux_2_34_x86_64.whl"
    old = _report("2.12.1", stable, {"passed": 39, "failed": 1, "skipped": 2})
    old["environment"]["opbridge"] = "0.1.0.210"
    new = _report("2.12.1", stable.replace("0.1.0", "0.1.1"), {"passed": 40, "failed": 0, "skipped": 2})
    new["environment"]["opbridge"] = "0.1.1.210"
    text, failures = compatibility.render([old, new])
    assert failures == 0 and "stale: not counted" in text


def test_each_run_says_whether_its_wheels_sources_are_the_checkouts(tmp_path):
    """A wheel records the commit it was built from (its build info); the runs table says whether the C++ and
    Python of that commit are the checkout's (current) or changed since (older), and the commit alone where the
    report is made outside a checkout."""
    git = _repository(tmp_path)
    (tmp_path / "cpp").mkdir()
    (tmp_path / "cpp" / "op.h").write_text("int a;\n")
    git("add", ".")
    git("commit", "-qm", "first")
    first = git("rev-parse", "--short=12", "HEAD")
    (tmp_path / "README.md").write_text("docs only\n")
    git("add", ".")
    git("commit", "-qm", "docs")
    docs = git("rev-parse", "--short=12", "HEAD")
    assert compatibility.sources_label(first, tmp_path) == f"sources {first} (current)"  # only docs changed since
    (tmp_path / "cpp" / "op.h").write_text("int b;\n")
    git("commit", "-qam", "kernel")
    assert compatibility.sources_label(docs, tmp_path) == f"sources {docs} (older: the C++ or Python changed since)"
    assert compatibility.sources_label(first + "+changes", tmp_path) == f"sources {first} with uncommitted changes"
    assert compatibility.sources_label("0123456789ab", tmp_path) == "sources 0123456789ab (not in this checkout)"
    assert compatibility.sources_label(first, None) == f"sources {first}"
    assert (
        compatibility.sources_label("-", tmp_path)
        == compatibility.sources_label(None, None)
        == ("sources not recorded")
    )
    report = _report("2.14.1", "opbridge-0.1.0.210-cp311-cp311-manylinux_2_34_x86_64.whl")
    report["environment"]["opbridge sources"] = docs
    text, _ = compatibility.render([report], tmp_path)
    assert f"; sources {docs} (older: the C++ or Python changed since) |" in text
    assert "opbridge sources" not in text.split("## Runs")[1].split("## Wheels")[0]  # in its column, not twice


def test_once_a_run_of_the_current_sources_exists_runs_of_other_sources_are_stale(tmp_path):
    """Runs of one release accumulate across wheel builds; once the store holds a run of a wheel built from the
    checkout's sources, the runs of wheels built from other sources (older C++ or Python, or not recorded) are
    stale: listed, not counted, no column, even where they share a column's torch x ORT x Python."""
    git = _repository(tmp_path)
    (tmp_path / "python").mkdir()
    (tmp_path / "python" / "op.py").write_text("a = 1\n")
    git("add", ".")
    git("commit", "-qm", "first")
    first = git("rev-parse", "--short=12", "HEAD")
    (tmp_path / "python" / "op.py").write_text("a = 2\n")
    git("commit", "-qam", "second")
    second = git("rev-parse", "--short=12", "HEAD")

    def run(torch, source, sha, failed=0):
        report = _report(torch, f"opbridge-0.1.0.210-cp311-cp311-{sha}.whl", {"passed": 1, "failed": failed,
                                                                               "skipped": 0})  # fmt: skip
        report["environment"]["opbridge"] = "0.1.0.210"
        report["wheels"]["opbridge"]["sha256"] = sha * 32
        if source:
            report["environment"]["opbridge sources"] = source
        report["cells"][0]["status"] = "fail" if failed else "pass"
        report["cells"][0]["cases"] = [{"detail": "wrong"}] if failed else []
        return report

    unrecorded, older, current = (
        run("2.10.0", None, "aa", failed=1),
        run("2.10.0", first, "bb", 1),
        run("2.10.0", second, "cc"),
    )
    other_torch = run("2.11.0", first, "dd")
    reports = [unrecorded, older, current, other_torch]
    keys = {compatibility.run_key(r) for r in (unrecorded, older, other_torch)}
    assert compatibility.stale(reports, tmp_path) == keys
    text, failures = compatibility.render(reports, tmp_path)
    assert failures == 0, "the failing cells and tests of the stale runs count"
    header = next(line for line in text.splitlines() if line.startswith("| exporter |"))
    assert header == "| exporter | lowering | opset | torch 2.10.0 / ORT 1.31.1 / Python 3.11 |"
    assert text.count("**stale**") == 3 and "| **FAIL**" not in text and text.count("stale: not counted") == 3
    # Without a run of the current sources (all older), only the unrecorded run is stale; its failure is not
    # counted, the older run's is.
    assert compatibility.stale([unrecorded, older], tmp_path) == {compatibility.run_key(unrecorded)}
    assert compatibility.render([unrecorded, older], tmp_path)[1] == 2
    # Outside a checkout nothing is current: a run that records its sources still makes an unrecorded one stale.
    assert compatibility.stale([unrecorded, current], None) == {compatibility.run_key(unrecorded)}
