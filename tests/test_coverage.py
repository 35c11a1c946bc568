"""The coverage sweep's CI guard and its machinery.

The guard runs the sweep's CI subset (every op opbridge maps, plus every 40th other op of PyTorch's op database)
without and with opbridge: a new torch that breaks one of opbridge's rules, or an exporter change that makes an
op silently wrong, fails here. The full sweep is `nox -s coverage` (docs/coverage.md).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytest.importorskip("expecttest", reason="torch's op database (torch.testing._internal) needs expecttest")

from opbridge.tools import coverage

# What opbridge's rules cannot do, by design or because ONNX / ORT cannot (each says why); any other case of a
# mapped op that is not ok with opbridge fails the guard.
_MAPPED_LIMITS = {
    "scatter_reduce": "ScatterElements has reductions from opset 16 (max/min from 18)",
    "floor_divide": "floats need Mod's fmod from opset 10; integer division by zero is undefined in ORT",
    "torchvision.roi_align": "aligned=True needs opset >= 16; ORT has no RoiAlign-22 kernel (opset >= 22 models)",
    "torchvision.ps_roi_align": "RoiAlign's half_pixel mode needs opset >= 16; ORT has no RoiAlign-22 kernel",
}


def _limit(result: coverage.CaseResult) -> str | None:
    base = result.op.split(".")[0] if not result.op.startswith("torchvision.") else result.op
    if base == "scatter_reduce" and (result.opset < 16 or (result.opset < 18 and result.op.endswith(("amax", "amin")))):
        return _MAPPED_LIMITS[base]
    if base.startswith("torchvision.") and result.status == "ORT refuses" and "(22)" in result.detail:
        return "ORT has no RoiAlign-22 / MaxRoiPool-22 kernel (opset >= 22 models)"
    if base in ("torchvision.roi_align", "torchvision.ps_roi_align") and result.opset < 16:
        return _MAPPED_LIMITS[base] if result.status == "export fails" else None
    return None


@pytest.fixture(scope="module")
def guard_results():
    ops = coverage.ci_subset(coverage.all_ops())
    units = coverage.units_for(ops, coverage.MODES, coverage.DTYPES, samples=1)
    return ops, coverage.run_units(units, jobs=2, timeout=120, budget=None, progress=None)


def test_guard_covers_the_mapped_ops(guard_results):
    ops, results = guard_results
    keys = {op.key for op in ops}
    assert {"asinh", "scatter_reduce.mean", "nn.functional.grid_sample", "nn.functional.selu"} <= keys
    assert len(keys) > 25  # the mapped ops and a sample of the rest
    assert {r.mode for r in results} == set(coverage.MODES)


def test_no_wrong_result_with_opbridge(guard_results):
    _, results = guard_results
    wrong = [r for r in results if r.mode == "with" and r.status in ("wrong result", "crash")]
    unexplained = [r for r in wrong if r.op not in coverage.KNOWN_CAUSES and r.op.split(".")[0] not in
                   coverage.KNOWN_CAUSES]  # fmt: skip
    assert not unexplained, "\n".join(f"{r.id}: {r.status}: {r.detail}" for r in unexplained)
    mapped = coverage.select(coverage.all_ops(), coverage.MAPPED)
    mapped_keys = {op.key for op in mapped}
    assert not [r.id for r in wrong if r.op in mapped_keys], "a wrong result for an op opbridge maps"


def test_mapped_ops_export_and_match_with_opbridge(guard_results):
    _, results = guard_results
    mapped_keys = {op.key for op in coverage.select(coverage.all_ops(), coverage.MAPPED)}
    failing = [
        r for r in results
        if r.mode == "with" and r.op in mapped_keys and r.status not in ("ok", "not comparable") and not _limit(r)
    ]  # fmt: skip
    assert not failing, "\n".join(f"{r.id}: {r.status}: {r.detail}" for r in failing)


def test_opbridge_never_makes_a_case_worse(guard_results):
    """For the ops opbridge maps (the others' legacy-exporter results can depend on what the worker exported
    before, so the two runs may differ for reasons outside opbridge)."""
    _, results = guard_results
    mapped_keys = {op.key for op in coverage.select(coverage.all_ops(), coverage.MAPPED)}
    worse = []
    rank = {status: k for k, status in enumerate(coverage.STATUSES)}
    for pair in coverage.pairs([r for r in results if r.op in mapped_keys]).values():
        before, after = pair.get("without"), pair.get("with")
        if not (before and after) or _limit(after):
            continue
        lost = before.status == "ok" and after.status != "ok"
        silent = after.status in ("wrong result", "crash") and rank[after.status] < rank.get(before.status, 0)
        if lost or silent:
            worse.append(f"{after.id}: {after.status}: {after.detail}")
    assert not worse, "\n".join(worse)


# --- the machinery: a case can fail, and a case replays from its id ---


@torch.library.custom_op("opbridge_coverage_test::plus_one", mutates_args=())
def _plus_one(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@_plus_one.register_fake
def _(x):
    return torch.empty_like(x)


def test_a_wrong_export_is_classified_wrong_result():
    from torch.onnx import register_custom_op_symbolic, unregister_custom_op_symbolic

    register_custom_op_symbolic("opbridge_coverage_test::plus_one", lambda g, x: g.op("Identity", x), 17)
    try:
        op = coverage.SweptOp("plus_one", torch.ops.opbridge_coverage_test.plus_one, frozenset({"float32"}),
                              lambda dtype: iter([coverage.Sample((torch.zeros(3),), {})]))  # fmt: skip
        sample = next(op.samples("float32"))
        want = coverage.eager_reference(op, sample)
        result = coverage.run_case("without", op, "float32", 0, sample, coverage.Config("legacy", 17), want)
        assert result.status == "wrong result", result
        assert "max abs error 1" in result.detail
        fails = coverage.run_case("without", op, "float32", 0, sample, coverage.Config("legacy", 11), want)
        assert fails.status == "export fails", fails  # the symbolic exists from opset 17 only
    finally:
        unregister_custom_op_symbolic("opbridge_coverage_test::plus_one", 17)


def test_random_ops_are_not_comparable():
    op = coverage.SweptOp("rand_like", torch.rand_like, frozenset({"float32"}),
                          lambda dtype: iter([coverage.Sample((torch.zeros(4),), {})]))  # fmt: skip
    reason = coverage.eager_reference(op, next(op.samples("float32")))
    assert isinstance(reason, Exception) and "random" in str(reason)


def test_compare_checks_shape_dtype_values_and_nans():
    import numpy as np

    want = [torch.tensor([1.0, float("nan"), 3.0])]
    assert coverage._compare([np.array([1.0, np.nan, 3.00001], np.float32)], want)[0]
    assert not coverage._compare([np.array([1.0, 2.0, 3.0], np.float32)], want)[0]  # NaN lost
    assert not coverage._compare([np.array([1.0, np.nan, 3.0], np.float64)], want)[0]  # dtype
    assert not coverage._compare([np.array([[1.0, np.nan, 3.0]], np.float32)], want)[0]  # shape
    assert not coverage._compare([np.array([1, 2], np.int64)], [torch.tensor([1, 3])])[0]


def test_case_ids_round_trip_and_replay():
    config = coverage.Config("dynamo", 18)
    identifier = coverage.case_id("with", "scatter_reduce.mean", "float32", 0, config)
    assert coverage.parse_case_id(identifier) == ("with", "scatter_reduce.mean", "float32", 0, config)
    with pytest.raises(ValueError, match="MODE:OP:DTYPE:SAMPLE"):
        coverage.parse_case_id("scatter_reduce")
    replay = subprocess.run([sys.executable, "-m", "opbridge", "coverage", "--case", identifier],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert replay.returncode == 0, replay.stdout[-2000:] + replay.stderr[-2000:]
    assert '"status": "ok"' in replay.stdout
