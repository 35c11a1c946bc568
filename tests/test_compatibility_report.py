"""docs/compatibility.md names the wheel file (and its SHA-256) behind every matrix run."""

from __future__ import annotations

from opbridge import compatibility


def _report(torch: str, wheel: str | None) -> dict:
    cell = {"op": "my_add", "exporter": "dynamo", "lowering": "custom", "opset": 18, "dtype": "float32",
            "status": "pass", "max_error": 0.0, "cases": [], "reason": ""}  # fmt: skip
    report = {"environment": {"torch": torch, "onnxruntime": "1.31.1"}, "cells": [cell], "summary": "1 pass"}
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
