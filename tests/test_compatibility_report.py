"""docs/compatibility.md names the wheel file (and its SHA-256) behind every matrix run, and what the tests run
under those wheels gave."""

from __future__ import annotations

from opbridge.tools import compatibility


def _report(torch: str, wheel: str | None, tests: dict | None = None) -> dict:
    cell = {"op": "my_add", "exporter": "dynamo", "lowering": "custom", "opset": 18, "dtype": "float32",
            "status": "pass", "max_error": 0.0, "cases": [], "reason": ""}  # fmt: skip
    report = {"environment": {"torch": torch, "onnxruntime": "1.31.1"}, "cells": [cell], "summary": "1 pass"}
    if tests:
        report["tests"] = {"files": ["test_packaging.py"], **tests}
    if wheel:
        report["wheels"] = {
            "opbridge": {"file": wheel, "sha256": "ab" * 32},
            "opbridge_ort": {"file": "opbridge_ort-0.1.0-py3-none-manylinux_2_34_x86_64.whl", "sha256": "cd" * 32},
        }
    return report


def test_each_run_names_its_wheel_and_each_wheel_its_runs():
    stable = "opbridge-0.1.0.210-cp311-cp311-manylinux_2_34_x86_64.whl"
    text, failures = compatibility.render(
        [_report("2.10.0", stable), _report("2.15.0+cu130", stable), _report("2.9.1", None)]
    )
    assert failures == 0
    assert f"| torch 2.10.0 / ORT 1.31.1 | `{stable}` ({'ab' * 6}) |" in text
    assert "| torch 2.9.1 / ORT 1.31.1 | not recorded |" in text
    assert f"| `{stable}` | `{'ab' * 32}` | 2: torch 2.10.0 / ORT 1.31.1; torch 2.15.0 / ORT 1.31.1 |" in text


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
