"""The ``framework`` section of the benchmarks: what opbridge costs besides its kernels, each measured in fresh
interpreters.

    ``import_torch`` / ``import_opbridge``  ``import torch`` vs ``import torch, opbridge`` (medians over fresh
                    interpreters),
    ``export_cached`` / ``export_uncached``  the median time of a one-node dynamo export in a warm process, with
                    opbridge's export caches and without (``OPBRIDGE_EXPORT_CACHE=0``).
"""

from __future__ import annotations

import statistics
import sys

from . import Bench, Row, Target

TARGETS = [Target("export_cached", "export_uncached", 2.0)]

#: What `import opbridge` may add to `import torch` (issue 10).
IMPORT_BUDGET_MS = 1000.0

_IMPORT_SCRIPT = "import time; t = time.perf_counter(); import torch{extra}; print(time.perf_counter() - t)"
_EXPORT_SCRIPT = """
import time, warnings
warnings.simplefilter("ignore")
import torch, opbridge
module, args = opbridge.nn.MyAdd().eval(), (torch.randn(2, 3), torch.randn(3))
times = []
for _ in range({runs}):
    start = time.perf_counter()
    torch.onnx.export(module, args, dynamo=True, verbose=False)
    times.append(time.perf_counter() - start)
print(sorted(times[1:])[len(times[1:]) // 2])
"""


def _interpreter_seconds(script: str, env: dict | None = None) -> float:
    import os
    import subprocess

    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                            env={**os.environ, **(env or {})})  # fmt: skip
    return float(result.stdout.strip().splitlines()[-1])


def run(bench: Bench) -> None:
    bench.rows += framework_rows(bench.repeat)


def framework_rows(repeat: int) -> list[Row]:
    """The import times and the export times, at least 3 fresh interpreters (or runs) each."""
    found = []
    for path, extra in (("import_torch", ""), ("import_opbridge", ", opbridge")):
        times = [_interpreter_seconds(_IMPORT_SCRIPT.format(extra=extra)) for _ in range(max(repeat, 3))]
        found.append(Row("framework", "import", 1, path, 1000 * statistics.median(times), [1000 * t for t in times]))
    for path, cache in (("export_cached", "1"), ("export_uncached", "0")):
        seconds = _interpreter_seconds(_EXPORT_SCRIPT.format(runs=max(repeat, 3) + 1), {"OPBRIDGE_EXPORT_CACHE": cache})
        found.append(Row("framework", "dynamo export, one node", 1, path, 1000 * seconds, [1000 * seconds]))
    return found


def import_added_ms(rows: list[Row]) -> float | None:
    times = {r.path: r.median_ms for r in rows if r.op == "framework" and r.case == "import"}
    if "import_torch" not in times or "import_opbridge" not in times:
        return None
    return times["import_opbridge"] - times["import_torch"]


def notes(rows: list[Row]) -> list[str]:
    added = import_added_ms(rows)
    if added is None:
        return []
    verdict = "yes" if added <= IMPORT_BUDGET_MS else "**no**"
    return [f"`import opbridge` adds {added:.0f} ms to `import torch` (goal <= {IMPORT_BUDGET_MS:.0f} ms: {verdict})"]
