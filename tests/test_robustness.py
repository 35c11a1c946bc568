"""Robustness: concurrency, memory, and a short fuzz pass (the long one is `nox -s fuzz`; under sanitizers,
`nox -s sanitize`). See docs/robustness.md."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import torch

import opbridge
import opbridge_ort

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))
from ort_cases.deform_conv2d import deform_case, deform_model  # noqa: E402
from ort_cases.my_add import my_add_model  # noqa: E402

THREADS = 8


def run_in_threads(work, threads: int = THREADS) -> list:
    """work(i) in `threads` threads started together; returns their results, re-raising any error."""
    results, errors = [None] * threads, []
    barrier = threading.Barrier(threads)

    def body(i):
        try:
            barrier.wait()
            results[i] = work(i)
        except BaseException as error:
            errors.append(error)

    pool = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    if errors:
        raise errors[0]
    return results


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_one_session_from_eight_threads_gives_identical_results():
    rng = np.random.default_rng(0)
    feeds, attributes = deform_case(rng, np.float32)
    deform = opbridge_ort.InferenceSession(deform_model(np.float32, **attributes))
    my_add = opbridge_ort.InferenceSession(my_add_model(np.float32, None, None))
    a, b = rng.standard_normal((64, 1000), dtype=np.float32), rng.standard_normal(1000, dtype=np.float32)
    want_deform = deform.run(None, feeds)[0]
    want_add = my_add.run(None, {"A": a, "B": b})[0]

    def work(_):
        same = 0
        for _ in range(40):  # 8 threads x 40 = 320 runs of each session
            same += np.array_equal(deform.run(None, feeds)[0], want_deform)
            same += np.array_equal(my_add.run(None, {"A": a, "B": b})[0], want_add)
        return same

    assert run_in_threads(work) == [80] * THREADS


def test_sessions_created_concurrently_all_work():
    model = my_add_model(np.float32, [3], [3])
    a, b = np.arange(3, dtype=np.float32), np.ones(3, dtype=np.float32)

    def work(_):
        outs = []
        for _ in range(5):
            session = opbridge_ort.InferenceSession(model)  # registers the library in every session
            outs.append(session.run(None, {"A": a, "B": b})[0])
        return outs

    for outs in run_in_threads(work):
        for out in outs:
            np.testing.assert_array_equal(out, 2 * a + b)


def test_torch_ops_are_safe_from_many_threads():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(300, 257, generator=gen), torch.randn(257, generator=gen)
    x, offset = torch.randn(2, 4, 9, 9, generator=gen), torch.randn(2, 18, 9, 9, generator=gen)
    weight, mask = torch.randn(6, 4, 3, 3, generator=gen), torch.rand(2, 9, 9, 9, generator=gen)
    want_add = opbridge.my_add(a, b)
    want_deform = opbridge.deform_conv2d(x, offset, weight, padding=(1, 1), mask=mask)

    def work(_):
        ok = 0
        for _ in range(30):
            ok += torch.equal(opbridge.my_add(a, b), want_add)
            ok += torch.equal(opbridge.deform_conv2d(x, offset, weight, padding=(1, 1), mask=mask), want_deform)
        return ok

    assert run_in_threads(work) == [60] * THREADS


_SESSIONS_AND_RUNS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import opbridge_ort
from ort_cases.deform_conv2d import deform_case, deform_model


def rss_bytes():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


feeds, attributes = deform_case(np.random.default_rng(1), np.float32)
model = deform_model(np.float32, **attributes)


def create_and_run(count):
    for _ in range(count):
        session = opbridge_ort.InferenceSession(model)
        session.run(None, feeds)
        del session


create_and_run(200)
before = rss_bytes()
create_and_run(800)
grown_sessions = rss_bytes() - before
session = opbridge_ort.InferenceSession(model)
for _ in range(200):
    session.run(None, feeds)
before = rss_bytes()
for _ in range(2000):
    session.run(None, feeds)
print(json.dumps({"sessions": grown_sessions, "runs": rss_bytes() - before}))
"""


def test_a_thousand_sessions_and_runs_leave_memory_flat():
    """Session create/run/destroy with the library registered, then repeated runs: RSS must not grow with
    the count. Measured between the 200th and the 1000th session, so allocator warm-up is not counted, in a process
    of its own: in a test worker that ran hundreds of other tests first, the allocator's state alone moved RSS by up
    to 12 MiB over the same 800 sessions (2026-11-27), where a fresh process grows by 0.06 MiB."""
    result = subprocess.run([sys.executable, "-c", _SESSIONS_AND_RUNS, str(Path(__file__).parent)],
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    grown = json.loads(result.stdout.strip().splitlines()[-1])
    # A leak of even 1 KiB per session or per run would exceed these bounds (800 KiB and 2 MiB).
    assert grown["sessions"] < 800 * 1024, f"RSS grew by {grown['sessions'] / 2**20:.1f} MiB over 800 sessions"
    assert grown["runs"] < 2 * 2**20, f"RSS grew by {grown['runs'] / 2**20:.1f} MiB over 2000 runs"


def test_short_fuzz_pass(tmp_path):
    """The CI slice of `nox -s fuzz`: every target, a few hundred cases, in worker processes."""
    report = tmp_path / "fuzz.json"
    result = subprocess.run(
        [sys.executable, str(TESTS / "fuzz.py"), "--cases", "300", "--seed", "1", "--json", str(report)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads(report.read_text())["results"]
    import fuzz

    assert {r["target"] for r in results} == set(fuzz.ORT_TARGETS + fuzz.TORCH_TARGETS)
    for r in results:
        # Both outcomes occur: the generator reaches valid configurations and hostile ones.
        assert r["counts"].get("match", 0) > 30 and r["counts"].get("rejected", 0) > 30, r


def test_every_op_has_fuzz_targets():
    """Each op of torch.ops.opbridge and of the ORT library is fuzzed: tests/fuzz_cases/<op>.py declares both."""
    import fuzz
    from opbridge import _slices, specs

    fuzzed_ops = {target.split(".", 1)[1] for target in fuzz.TORCH_TARGETS}
    for module in _slices.op_modules():
        name = module.__name__.rsplit(".", 1)[1]
        assert name in fuzzed_ops, (
            f"opbridge::{name} has no fuzz targets: add tests/fuzz_cases/{name}.py (see docs/adding-an-op.md)"
        )
    fuzzed_nodes = {target.split(".", 1)[1] for target in fuzz.ORT_TARGETS}
    owners = {s.custom_node.op_type: s.torch_op.split("::")[1] for s in specs.all_specs() if s.custom_node}
    for op_type in opbridge_ort.ops():
        owner = owners.get(op_type) or re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", op_type).lower()
        assert op_type in fuzzed_nodes, (
            f"the ORT op opbridge::{op_type} has no fuzz target: set ORT_NODE = {op_type!r} in "
            f"tests/fuzz_cases/{owner}.py (see docs/adding-an-op.md)"
        )


def test_every_foreign_node_is_fuzzed():
    """Each node of mmcv's or mmdeploy's that the ORT library runs has a fuzz target (ORT_DOMAIN), or shares the
    kernel and checks of one that has (ORT_ALIASES)."""
    import fuzz

    covered = set()
    for module, kind in fuzz.TARGETS.values():
        if kind == "ort":
            covered.add(f"{getattr(module, 'ORT_DOMAIN', 'opbridge')}::{module.ORT_NODE}")
            covered.update(getattr(module, "ORT_ALIASES", []))
    missing = sorted(f"{d}::{t}" for d, t in opbridge_ort.foreign_ops() if f"{d}::{t}" not in covered)
    assert not missing, f"foreign nodes without a fuzz target: {missing} (ORT_DOMAIN / ORT_ALIASES in fuzz_cases)"


def test_fuzz_detects_a_crash(tmp_path):
    """The driver must notice a worker that dies (here: a target that segfaults on purpose)."""
    script = tmp_path / "crashing_fuzz.py"
    source = (TESTS / "fuzz.py").read_text()
    signature = "def run_case(target: str, seed: int, case: int, library: str | None):"
    assert signature in source
    source = source.replace(signature, f"{signature}\n    if case == 3:\n        import ctypes; ctypes.string_at(0)\n")
    script.write_text(source)
    for cases in ("fuzz_cases", "ort_cases"):  # the targets and the numpy references the fuzzer imports
        shutil.copytree(TESTS / cases, tmp_path / cases)
    report = tmp_path / "fuzz.json"
    result = subprocess.run(
        [sys.executable, str(script), "--cases", "6", "--targets", "ort.MyAdd", "--json", str(report)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    (target,) = json.loads(report.read_text())["results"]
    assert [(f["case"], f["outcome"]) for f in target["failures"]] == [(3, "crash")]
    assert sum(target["counts"].values()) == 6  # the other five cases still ran
