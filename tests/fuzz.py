"""Fuzzing opbridge's ops: hostile models and inputs must never crash or hang the process.

    python tests/fuzz.py [--cases N] [--seed S] [--targets ...] [--library PATH] [--json FILE]
    python tests/fuzz.py --replay TARGET:SEED:CASE      # one case, in this process, printing it

Each op's targets live in tests/fuzz_cases/<op>.py (the contract: tests/fuzz_cases/__init__.py), found there
(no list of ops is kept here): ``ort.<Node>`` runs the op's node (e.g. ``ort.MyAdd``) in the ORT library, with
onnxruntime, onnx and numpy only, and ``torch.<op>`` calls ``torch.ops.opbridge.<op>`` (when torch and opbridge
import).
Each case is generated from (seed, target, case number) alone, so any case can be replayed. A case mixes
valid configurations with adversarial ones: attributes negative, zero, huge or of the wrong length, missing
or extra; shapes mismatched, empty, huge or of rank 0 to 8; unsupported or mixed dtypes; missing, empty and
extra inputs; NaN and infinite values. Every case must end in one of:

- ``match``: the op ran, the configuration is valid (by the op module's predicate, written from the op's
  definition) and the output equals the module's numpy reference;
- ``rejected``: the op raised an error (an ORT error status or a Python exception).

Anything else fails the run: ``mismatch`` (wrong values, or an invalid configuration accepted), ``crash``
(the worker process died: a signal, or a sanitizer report) and ``hang`` (no progress for --timeout
seconds). Cases run in worker processes, so a crash is recorded with its case number and the run goes on.
Under `nox -s sanitize` both libraries are built with AddressSanitizer and UndefinedBehaviorSanitizer.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import subprocess
import sys
import time
from collections import Counter
from functools import partial
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # fuzz_cases/, and the numpy references of ort_cases/
import fuzz_cases  # noqa: E402
from fuzz_cases._common import NO_HUGE, case_rng, ort_session  # noqa: E402


def op_modules() -> list[ModuleType]:
    """tests/fuzz_cases/<op>.py, in name order (helpers start with an underscore)."""
    return [
        importlib.import_module(f"fuzz_cases.{info.name}")
        for info in pkgutil.iter_modules(fuzz_cases.__path__)
        if not info.name.startswith("_")
    ]


def ort_target(module: ModuleType) -> str:
    """``ort.<Node>`` for a node of the opbridge domain, ``ort.<domain>.<node>`` for another project's node."""
    domain = getattr(module, "ORT_DOMAIN", "opbridge")
    return f"ort.{module.ORT_NODE}" if domain == "opbridge" else f"ort.{domain}.{module.ORT_NODE}"


def _targets(modules: list[ModuleType]) -> dict[str, tuple[ModuleType, str]]:
    ort = {ort_target(module): (module, "ort") for module in modules if module.ORT_NODE}
    torch = {f"torch.{module.__name__.rsplit('.', 1)[1]}": (module, "torch") for module in modules
             if hasattr(module, "run_torch")}  # fmt: skip
    return ort | torch


#: target -> (the op's fuzz module, "ort" or "torch")
TARGETS = _targets(op_modules())
ORT_TARGETS = [target for target, (_, kind) in TARGETS.items() if kind == "ort"]
TORCH_TARGETS = [target for target, (_, kind) in TARGETS.items() if kind == "torch"]


def prepare(target: str) -> None:
    """Once per process, before the target's first case: the torch targets need opbridge's ops registered."""
    if TARGETS[target][1] == "torch":
        import opbridge  # noqa: F401


def run_case(target: str, seed: int, case: int, library: str | None):
    module, kind = TARGETS[target]
    rng = case_rng(seed, target, case)
    cfg = module.config(rng, kind)
    if kind == "ort":
        return cfg, module.run_ort(partial(ort_session, library), rng, cfg)
    return cfg, module.run_torch(rng, cfg)


# ---------------------------------------------------------------------------------------------------
# Worker and driver


def worker(target: str, seed: int, start: int, count: int, library: str | None) -> int:
    prepare(target)
    for case in range(start, start + count):
        print(f"start {case}", flush=True)
        try:
            _, (outcome, detail) = run_case(target, seed, case, library)
        except Exception:  # a bug of this harness, not of the op: reported as such
            import traceback

            outcome, detail = "harness-error", traceback.format_exc()[-600:]
        print(f"done {case} {outcome} {json.dumps(detail)}", flush=True)
    return 0


def drive(target: str, seed: int, cases: int, library: str | None, batch: int, timeout: float, env) -> dict:
    counts, failures = Counter(), []
    case, started = 0, time.perf_counter()
    while case < cases:
        count = min(batch, cases - case)
        command = [sys.executable, __file__, "--worker", target, "--seed", str(seed), "--start", str(case),
                   "--count", str(count)] + (["--library", library] if library else [])  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
            stdout, stderr, code, hung = done.stdout, done.stderr, done.returncode, False
        except subprocess.TimeoutExpired as expired:
            stdout = (expired.stdout or b"").decode() if isinstance(expired.stdout, bytes) else expired.stdout or ""
            stderr, code, hung = "", None, True
        last_started, finished = None, set()
        for line in stdout.splitlines():
            parts = line.split(" ", 3)
            if parts[0] == "start":
                last_started = int(parts[1])
            elif parts[0] == "done":
                finished.add(int(parts[1]))
                counts[parts[2]] += 1
                if parts[2] not in ("match", "rejected"):
                    failures.append({"target": target, "case": int(parts[1]), "outcome": parts[2],
                                     "detail": json.loads(parts[3])})  # fmt: skip
        if code == 0 and len(finished) == count:
            case += count
            continue
        # The worker died or hung in the case it started last: record it, go on after it.
        culprit = last_started if last_started is not None and last_started not in finished else case + len(finished)
        outcome = "hang" if hung else "crash"
        counts[outcome] += 1
        lines = stderr.strip().splitlines()
        # The sanitizer's report when there is one (its first lines say what and where), else the end.
        report = next((i for i, line in enumerate(lines) if "runtime error" in line or "ERROR: " in line), None)
        tail = "\n".join(lines[report : report + 12] if report is not None else lines[-12:])
        failures.append({"target": target, "case": culprit, "outcome": outcome, "returncode": code, "stderr": tail})
        print(f"  {target} case {culprit}: {outcome} (exit {code})\n{tail}", flush=True)
        case = culprit + 1
    elapsed = time.perf_counter() - started
    print(f"{target:20} {cases} cases in {elapsed:6.1f} s: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
          flush=True)  # fmt: skip
    return {"target": target, "cases": cases, "seconds": round(elapsed, 1), "counts": dict(counts),
            "failures": failures}  # fmt: skip


def default_library() -> str | None:
    try:
        import opbridge_ort

        return opbridge_ort.library_path()
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000, help="cases per target (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--targets", nargs="+", choices=ORT_TARGETS + TORCH_TARGETS)
    parser.add_argument("--library", help="libopbridge_ort.so (default: opbridge_ort.library_path())")
    parser.add_argument("--batch", type=int, default=250, help="cases per worker process")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per batch before it counts as a hang")
    parser.add_argument("--json", type=Path, help="write counts and failures here")
    parser.add_argument("--no-huge-allocations", action="store_true", help="no terabyte outputs (for ASan runs)")
    parser.add_argument("--replay", help="TARGET:SEED:CASE -- run one case here and print it")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    library = args.library or os.environ.get("OPBRIDGE_ORT_LIBRARY") or default_library()
    if args.no_huge_allocations:
        os.environ[NO_HUGE] = "1"  # inherited by the workers
    if args.worker:
        return worker(args.worker, args.seed, args.start, args.count, library)
    if args.replay:
        target, seed, case = args.replay.split(":")
        prepare(target)
        cfg, result = run_case(target, int(seed), int(case), library)
        print(json.dumps(cfg, default=str, indent=1), "\n", result)
        return 0
    targets = args.targets or ORT_TARGETS + (TORCH_TARGETS if _has_torch() else [])
    if any(t.startswith("ort.") for t in targets) and library is None:
        parser.error("no ORT library: pass --library or install opbridge_ort")
    print(f"fuzz: seed {args.seed}, {args.cases} cases per target: {', '.join(targets)}", flush=True)
    results = [drive(t, args.seed, args.cases, library, args.batch, args.timeout, os.environ.copy()) for t in targets]
    failures = [f for r in results for f in r["failures"]]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"seed": args.seed, "results": results}, indent=1, default=str))
    for failure in failures[:20]:
        print(f"FAILED {failure['target']} case {failure['case']}: {failure['outcome']} "
              f"(replay: python tests/fuzz.py --replay {failure['target']}:{args.seed}:{failure['case']})")  # fmt: skip
    print(f"fuzz: {sum(r['cases'] for r in results)} cases, {len(failures)} failures")
    return 1 if failures else 0


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("opbridge") is not None


if __name__ == "__main__":
    sys.exit(main())
