"""Turns the parity matrix's JSON reports into docs/compatibility.md.

    python python/opbridge/tools/compatibility.py REPORTS_DIR docs/compatibility.md [STORE]   (nox -s report)

Standard library only (no torch), so it runs anywhere. Runs accumulate: every run ever reported is kept in STORE
(default: docs/compatibility-runs.json beside the page, committed), condensed to what the page shows, keyed by its
opbridge wheel (file and SHA-256) and versions (torch, ORT, Python); a new report of the same key replaces the
old one, any other run stays. A run of a wheel built from older sources than the newest run's (a lower opbridge
release, major.minor.patch) is marked stale and listed, but gets no column in the op tables. One table per op: a
row per (exporter, lowering, opset), a column per current run (torch x ORT x Python); each cell is pass (with the
max error), FAIL, or n/a with a footnoted reason. Exits 1 if any current cell failed unexpectedly or any test
failed under a current run's wheels.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path


def _run_name(environment: dict) -> str:
    python = ".".join(environment.get("python", "?").split(".")[:2])
    return f"torch {environment['torch'].split('+')[0]} / ORT {environment['onnxruntime']} / Python {python}"


def _version_key(name: str) -> tuple:
    parts = name.replace("torch ", "").replace("ORT ", "").replace("Python ", "").split(" / ")
    return tuple(tuple(int(p) for p in part.split(".")[:3] if p.isdigit()) for part in parts)


_CELL_FIELDS = ("op", "exporter", "lowering", "opset", "dtype", "status", "max_error", "reason")


def condense(report: dict) -> dict:
    """A report as the store keeps it: its environment, wheels, summary and tests, and per cell only what the page
    shows (the first case's detail of a failing cell)."""
    cells = []
    for cell in report["cells"]:
        kept = {k: cell.get(k) for k in _CELL_FIELDS}
        if cell.get("status") == "fail":
            kept["cases"] = [{"detail": str((cell.get("cases") or [{}])[0].get("detail", ""))[:200]}]
        cells.append(kept)
    return {k: report[k] for k in ("environment", "wheels", "summary", "tests") if k in report} | {"cells": cells}


def run_key(report: dict) -> str:
    """A run's identity: its opbridge wheel (file, SHA-256) and versions."""
    wheel = report.get("wheels", {}).get("opbridge", {})
    env = report["environment"]
    python = ".".join(env.get("python", "?").split(".")[:2])
    return " | ".join([wheel.get("file", "-"), wheel.get("sha256", "-"), env["torch"], env["onnxruntime"], python])


def _opbridge_version(report: dict) -> tuple:
    version = report["environment"].get("opbridge", "")
    return tuple(int(p) for p in version.split("+")[0].split(".") if p.isdigit())


def merge(stored: list[dict], new: list[dict]) -> list[dict]:
    """The stored runs with the new ones added; a new run replaces a stored run of the same key."""
    runs = {run_key(r): r for r in stored}
    runs.update({run_key(r): condense(r) for r in new})
    return [runs[key] for key in sorted(runs)]


def stale(reports: list[dict], root: Path | None = None) -> set[str]:
    """Keys of the runs whose opbridge wheel was built from older sources than the newest runs': an older release
    (major.minor.patch; the fourth component is not the sources' but the oldest torch a wheel loads under, 206, 209,
    210: the classic and stable wheels of one release, so it is not compared), and, within a release, once any run
    records the sources its wheel was built from (wheels since 2026-11-28): the runs that record none, and, where
    `root` is the git checkout and some run's sources are its current ones, every run whose sources are not."""
    releases = [_opbridge_version(r)[:3] for r in reports if _opbridge_version(r)]
    newest = max(releases, default=())
    old = {run_key(r) for r in reports if _opbridge_version(r) and _opbridge_version(r)[:3] < newest}
    rest = [r for r in reports if run_key(r) not in old]
    if not any(_source(r) for r in rest):
        return old
    labels = {source: sources_label(source, root) for source in {_source(r) for r in rest}}
    if any(label.endswith("(current)") for label in labels.values()):
        return old | {run_key(r) for r in rest if not labels[_source(r)].endswith("(current)")}
    return old | {run_key(r) for r in rest if not _source(r)}


def _source(report: dict) -> str | None:
    source = report["environment"].get("opbridge sources")
    return None if source in (None, "", "-") else source


# What the sources label of a run compares: the files a wheel is built from.
SOURCE_PATHS = ("cpp", "python", "cmake", "CMakeLists.txt", "pyproject.toml")


def sources_label(source: str | None, root: Path | None) -> str:
    """A run's sources as the runs table says them: the commit its opbridge wheel was built from (its build info,
    recorded since 2026-11-28) and, where `root` is the git checkout the report is made in, whether the wheel's files
    (SOURCE_PATHS) are still the same there: "current", or "older" where they changed since."""
    if not source or source == "-":
        return "sources not recorded"
    commit, _, changes = source.partition("+")
    if changes:
        return f"sources {commit} with uncommitted changes"
    if root is None or not (root / ".git").exists():
        return f"sources {commit}"
    try:
        same = subprocess.run(["git", "-C", str(root), "diff", "--quiet", commit, "--", *SOURCE_PATHS],
                              capture_output=True, timeout=60).returncode  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return f"sources {commit}"
    return {0: f"sources {commit} (current)", 1: f"sources {commit} (older: the C++ or Python changed since)"}.get(
        same, f"sources {commit} (not in this checkout)"
    )


def render(reports: list[dict], root: Path | None = None) -> tuple[str, int]:
    """The page and its number of failing cells; `root`: the checkout whose sources each run's are compared with."""
    old = stale(reports, root)
    current = [r for r in reports if run_key(r) not in old]
    runs = sorted({_run_name(r["environment"]) for r in current}, key=_version_key)
    by_op: dict[str, dict[tuple, dict[str, list[dict]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for report in current:
        run = _run_name(report["environment"])
        for cell in report["cells"]:
            by_op[cell["op"]][(cell["exporter"], cell["lowering"], cell["opset"])][run].append(cell)
    reasons: dict[str, int] = {}
    failures = 0
    lines = [
        "# Compatibility",
        "",
        "Generated by `nox -t matrix` (`python/opbridge/tools/compatibility.py`) from the parity matrix run on the",
        "*installed wheels* of each torch version and CPython (pip picks each Python's own wheel). A cell covers",
        "every call path and dtype of the op, each exported with same-shape and broadcast (or with/without mask)",
        "operands and with a static and a dynamic batch: **pass** (max |ORT − PyTorch| over all of them), **FAIL**,",
        "or **n/a** (expected not to run; the footnote says why). A blank cell was not run (e.g. an opset the",
        "exporter lacks). On the torch and Python axes each run also runs tests/test_plain_export.py and",
        'tests/test_packaging.py against the installed wheels ("tests under the wheel"). Runs accumulate across',
        "matrix runs (docs/compatibility-runs.json). Each wheel built since 2026-11-28 records the commit it was",
        "built from: the runs table says whether the C++ and Python of that commit are the sources here (current)",
        'or changed since (older); runs of earlier wheels say "sources not recorded". A run of an older release, or,',
        "once a run of the current sources exists, a run of any other sources (or of unrecorded ones) is marked",
        "stale and has no column below.",
        "",
        "## Runs",
        "",
        "| run | opbridge wheel (SHA-256, first 12) | cells | summary | tests under the wheel | versions |",
        "|---|---|---|---|---|---|",
    ]
    served: dict[tuple[str, str], list[str]] = defaultdict(list)
    for report in sorted(reports, key=lambda r: _version_key(_run_name(r["environment"]))):
        env = report["environment"]
        shown_versions = {k: v for k, v in env.items() if k not in ("torch", "onnxruntime", "opbridge sources")}
        versions = ", ".join(f"{k} {v}" for k, v in shown_versions.items())
        wheels = report.get("wheels", {})
        for record in wheels.values():
            served[(record["file"], record["sha256"])].append(_run_name(env))
        wheel = wheels.get("opbridge")
        shown = f"`{wheel['file']}` ({wheel['sha256'][:12]})" if wheel else "not recorded"
        if wheel:
            shown += f"; {sources_label(env.get('opbridge sources'), root)}"
        if run_key(report) in old:
            shown += f" **stale** (opbridge {env.get('opbridge', '?')})"
        tests = report.get("tests")
        if run_key(report) in old:
            tested = "stale: not counted"
        elif tests:
            failures += tests["failed"]
            outcome = f"**{tests['failed']} failed**, " if tests["failed"] else ""
            tested = f"{outcome}{tests['passed']} passed, {tests['skipped']} skipped ({', '.join(tests['files'])})"
        else:
            tested = "not run on this axis"
        lines.append(
            f"| {_run_name(env)} | {shown} | {len(report['cells'])} | {report['summary']} | {tested} | {versions} |"
        )
    if served:  # the wheels of the runs above, stale ones included
        lines += ["", "## Wheels", "", "Each file that served a run above, as `nox -s wheels` built it:", "",
                  "| wheel | SHA-256 | runs |", "|---|---|---|"]  # fmt: skip
        for (file, sha256), runs_served in sorted(served.items()):
            lines.append(f"| `{file}` | `{sha256}` | {len(runs_served)}: {'; '.join(runs_served)} |")
    for op in sorted(by_op):
        lines += ["", f"## {op}", "", "| exporter | lowering | opset | " + " | ".join(runs) + " |",
                  "|---|---|---|" + "---|" * len(runs)]  # fmt: skip
        for key in sorted(by_op[op]):
            row = [key[0], key[1], str(key[2])]
            for run in runs:
                cells = by_op[op][key].get(run)
                if not cells:
                    row.append("")
                    continue
                statuses = {c["status"] for c in cells}
                errors = [c["max_error"] for c in cells if c["max_error"] is not None]
                if "fail" in statuses:
                    failures += 1
                    details = "; ".join(sorted({str(c["cases"][0].get("detail", ""))[:80] for c in cells}))
                    row.append(f"**FAIL** ({details})")
                elif statuses == {"pass"}:
                    row.append(f"pass {max(errors):.0e}" if errors else "pass")
                else:
                    notes = []
                    for c in cells:
                        if c["status"] == "n/a":
                            number = reasons.setdefault(c["reason"], len(reasons) + 1)
                            notes.append(f"{c['dtype']}: n/a[^{number}]")
                    passed = [c for c in cells if c["status"] == "pass"]
                    row.append(", ".join(sorted(set(notes))) + ("; others pass" if passed else ""))
            lines.append("| " + " | ".join(row) + " |")
    if reasons:
        lines += ["", "## Why cells are n/a", ""]
        lines += [f"[^{number}]: {reason}" for reason, number in sorted(reasons.items(), key=lambda item: item[1])]
    lines.append("")
    return "\n".join(lines), failures


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[2])
    store = Path(argv[3]) if len(argv) == 4 else out.with_name(out.stem + "-runs.json")
    stored = json.loads(store.read_text())["runs"] if store.is_file() else []
    paths = sorted(Path(argv[1]).glob("*.json")) if Path(argv[1]).is_dir() else []
    if not paths and not stored:
        print(f"no reports in {argv[1]} and no stored runs in {store}: run `nox -t matrix` first", file=sys.stderr)
        return 2
    new = [json.loads(p.read_text()) for p in paths]
    reports = merge(stored, new)
    store.write_text(json.dumps({"runs": reports}, indent=None, separators=(",", ":")) + "\n")
    root = Path(__file__).resolve().parents[3]
    text, failures = render(reports, root)
    out.write_text(text)
    old = stale(reports, root)
    for report in new:
        print(f"new: {_run_name(report['environment'])}: {report['summary']}")
    print(f"wrote {out} ({len(reports)} runs, {len(new)} new, {len(old)} stale; stored in {store}); "
          f"{failures} failing table cells")  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
