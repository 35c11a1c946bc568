"""The benchmark harness (`nox -s bench`): it runs every path on small sizes, checks outputs before
timing them, and computes ratios and target verdicts from the rows. No timings are asserted."""

from __future__ import annotations

import importlib.util
import itertools
import sys

import numpy as np
import onnx
import pytest

from opbridge.tools import bench
from opbridge.tools.bench import _framework, _openvino, deform_conv2d, my_add


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(my_add, "SIZES", {"1 Mi": 4096})
    monkeypatch.setattr(deform_conv2d, "SHAPES", [deform_conv2d.DeformShape(2, 4, 6, 5, 7, offset_groups=2)])


def test_bench_runs_every_path_on_small_sizes(tiny, tmp_path):
    json_path, md_path = tmp_path / "bench.json", tmp_path / "benchmarks.md"
    status = bench.main(["--threads", "1", "--warmup", "0", "--repeat", "1", "--json", str(json_path),
                         "--markdown", str(md_path), "--ops", "my_add", "deform_conv2d"])  # fmt: skip
    assert status == 0
    import json

    report = json.loads(json_path.read_text())
    timed = {(r["op"], r["path"]) for r in report["rows"] if r["median_ms"] is not None}
    for op, path in [("my_add", "ort_custom"), ("my_add", "ort_standard"), ("my_add", "torch_op"),
                     ("my_add", "torch_eager"), ("deform_conv2d", "ort_custom"),
                     ("deform_conv2d", "ort_decomposition"), ("deform_conv2d", "torch_op"),
                     ("deform_conv2d", "torch_backward")]:  # fmt: skip
        assert (op, path) in timed, f"{op} {path} was not timed"
    # Without the triad helper the bound is reported as not measured, not silently dropped.
    triad = [r for r in report["rows"] if r["path"] == "triad"]
    assert triad and all(r["median_ms"] is None and "triad-library" in r["note"] for r in triad)
    text = md_path.read_text()
    assert "## my_add: times (ms)" in text and "## deform_conv2d: ratios" in text
    if importlib.util.find_spec("openvino") is not None:  # installed by `nox -s bench`
        assert ("deform_conv2d", "openvino_standard") in timed and ("deform_conv2d", "openvino_default") in timed
        assert "| ort_custom | openvino_standard |" in text and "openvino_default" in text and "max abs error" in text


def test_openvino_paths_are_rows_marked_na_without_openvino(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` raises ImportError
    rows = []
    want = np.zeros(3, dtype=np.float32)
    _openvino.record_paths(lambda *row: rows.append(row), 2, onnx.ModelProto(), {}, want, 1e-4, 1e-4)
    assert rows == [(2, path, None, "n/a: openvino not installed") for path in _openvino.PATHS]


def test_outputs_are_checked_before_timing():
    want = np.arange(6, dtype=np.float32)
    bench.check_close("same", want.copy(), want, 0, 0)
    with pytest.raises(AssertionError, match="differs from the baseline"):
        bench.check_close("off by one", want + 1, want, 1e-6, 1e-6)
    with pytest.raises(AssertionError, match="differs"):
        bench.check_close("wrong shape", want[:3], want, 1e-6, 1e-6)


def test_a_cases_paths_are_timed_in_interleaved_rounds_at_their_thread_counts(monkeypatch):
    """Bench.record defers timing; the case's paths then run slice by slice in turn, each at the torch thread count
    set when it was recorded, and the next case's first record times the previous case."""
    import torch

    monkeypatch.setattr(bench, "SETTLE_S", 0.0)
    monkeypatch.setattr(bench, "WARMUP_S", 0.0)
    calls = []

    def path(name):
        return lambda: calls.append((name, torch.get_num_threads()))

    harness, previous = bench.Bench([1, 2], warmup=1, repeat=3, triad_library=None), torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        harness.record("op", "case", 1, "a", path("a"))
        torch.set_num_threads(2)
        harness.record("op", "case", 1, "b", path("b"))
        harness.record("op", "case", 1, "none", None, "n/a: missing here")
        assert calls == [] and [r.median_ms for r in harness.rows] == [None, None, None]
        harness.record("op", "other case", 1, "c", path("c"))  # times "case"
        names = [name for name, _ in calls]
        assert set(calls) == {("a", 1), ("b", 2)} and names[0] == "a" and names.index("b") < len(names) // 2
        switches = sum(1 for x, y in itertools.pairwise(names) if x != y)
        assert switches == 2 * 3 - 1  # a's slice, b's slice, 3 rounds
        assert [len(r.runs_ms) >= 3 for r in harness.rows[:2]] == [True, True] and harness.rows[2].runs_ms == []
        assert harness.rows[0].median_ms is not None and harness.rows[3].median_ms is None
        harness.flush()
        assert harness.rows[3].median_ms is not None and ("c", 2) in calls
    finally:
        torch.set_num_threads(previous)
    assert torch.get_num_threads() == previous


def row(op, case, threads, path, ms):
    return bench.Row(op, case, threads, path, ms, [ms])


def test_ratios_and_targets():
    rows = [
        row("my_add", "64 Mi", 1, "ort_custom", 40.0),
        row("my_add", "64 Mi", 1, "ort_standard", 100.0),  # 2.5x faster: meets >= 1.5
        row("my_add", "64 Mi", 1, "triad", 30.0),  # 0.75 of the bound: misses >= 0.85
        row("my_add", "1 Mi", 1, "ort_custom", 1.0),
        row("my_add", "1 Mi", 1, "ort_standard", 1.2),  # 1.2x, but the bar is for 64 Mi only
        row("deform_conv2d", "N1", 2, "ort_custom", 10.0),
        row("deform_conv2d", "N1", 2, "ort_standard", None),  # n/a (old ORT): no ratio, no verdict
    ]
    found = {(r["case"], r["path"], r["baseline"]): r for r in bench.ratios(rows)}
    standard = found[("64 Mi", "ort_custom", "ort_standard")]
    assert standard["ratio"] == pytest.approx(2.5) and standard["met"] is True
    triad = found[("64 Mi", "ort_custom", "triad")]
    assert triad["ratio"] == pytest.approx(0.75) and triad["met"] is False
    small = found[("1 Mi", "ort_custom", "ort_standard")]
    assert small["ratio"] == pytest.approx(1.2) and small["target"] is None and small["met"] is None
    missing = found[("N1", "ort_custom", "ort_standard")]
    assert missing["ratio"] is None and missing["met"] is None
    text = bench.markdown(rows, bench.ratios(rows), {"repeat": 1, "warmup": 0, "machine": "m", "torch": "t",
                                                     "onnxruntime": "o"})  # fmt: skip
    assert "| 64 Mi | 1 | ort_custom | triad | 0.75 | >= 0.85 | **no** |" in text


def test_framework_rows_and_parity_section(tmp_path):
    """The import and export timings run in fresh interpreters; the parity report's throughput is read back."""
    rows = _framework.framework_rows(repeat=1)
    paths = {(r.case, r.path) for r in rows if r.median_ms and r.median_ms > 0}
    assert paths == {
        ("import", "import_torch"),
        ("import", "import_opbridge"),
        ("dynamo export, one node", "export_cached"),
        ("dynamo export, one node", "export_uncached"),
    }
    assert _framework.import_added_ms(rows) is not None
    report = tmp_path / "parity.json"
    report.write_text('{"summary": "parity: 5 passed, 0 failed, 1 n/a as expected (6 cells, 20 export+run cases) '
                      'in 3 s, 2.00 cells/s; torch x, onnxruntime y"}')  # fmt: skip
    section = "\n".join(bench.parity_section(report))
    assert "| this run (parity.json) | 6 | 3 | 2.00 |" in section and "| before (" in section


def test_ms_deform_attn_paths_on_small_maps(monkeypatch, tmp_path):
    """Every ms_deform_attn path runs (each output checked against the op's before timing), the hand-written graph
    included; the rooflines are rows marked n/a without the helper library."""
    from opbridge.tools.bench import ms_deform_attn

    monkeypatch.setattr(ms_deform_attn, "CASES", {"tiny": [(6, 5), (3, 3)]})
    json_path = tmp_path / "bench.json"
    status = bench.main(["--threads", "1", "--warmup", "0", "--repeat", "1", "--json", str(json_path),
                         "--ops", "ms_deform_attn"])  # fmt: skip
    assert status == 0
    import json

    rows = json.loads(json_path.read_text())["rows"]
    timed = {r["path"] for r in rows if r["median_ms"] is not None}
    assert {"ort_custom", "ort_standard", "ort_handwritten", "torch_op", "torch_backward"} <= timed


def test_handwritten_ms_deform_attn_graph_matches_grid_sample_reference():
    """The bench's hand-written GridSample graph computes the op: against the grid_sample reference in torch, on
    maps with samples off every edge, two images."""
    import onnxruntime as ort
    import torch

    from opbridge.ops.ms_deform_attn import reference
    from opbridge.tools.bench import ms_deform_attn

    levels = [(7, 5), (4, 3)]
    inputs = list(ms_deform_attn.encoder_inputs(levels))
    inputs = [torch.cat([t, t.flip(1) * 1.5 - 0.2]) if i in (0, 3) else t for i, t in enumerate(inputs)]
    inputs[4] = torch.cat([inputs[4], inputs[4].flip(1)])
    model = ms_deform_attn.handwritten_model(levels, inputs[3].shape[1], batch=2)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"value": inputs[0].numpy(), "sampling_locations": inputs[3].numpy(),
                                "attention_weights": inputs[4].numpy()})  # fmt: skip
    want = reference(*inputs)
    assert ((inputs[3] < 0) | (inputs[3] > 1)).any()
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


def test_location_gradients_are_compared_off_the_bilinear_seams():
    """The gradient of a sampling location jumps where x * W - 0.5 is an integer; the bench compares it only away
    from there. Checked on the float32 sample that exposed it (640x640 encoder: 69.0 in float32)."""
    import torch

    from opbridge.tools.bench import ms_deform_attn

    levels = [(80, 80)]
    x = torch.tensor(69.5 / 80, dtype=torch.float32)  # on a seam: 69.5 / 80 * 80 - 0.5 = 69
    locations = torch.stack([torch.stack([x, torch.tensor(0.3)]), torch.tensor([0.31, 0.3])])  # [2, 2]
    mask = ms_deform_attn.off_the_seams(locations.view(1, 2, 1, 1, 1, 2), levels).view(2, 2)
    assert mask.tolist() == [[False, True], [True, True]]  # y = 0.3 * 80 - 0.5 = 23.5, x = 0.31 * 80 - 0.5 = 24.3
