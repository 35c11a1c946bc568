"""The command line's parsers, importable without torch: ``python -m opbridge COMMAND --help`` answers
in a fraction of a second, and a bad argument is reported before anything heavy loads."""

from __future__ import annotations

import argparse
import importlib.util
import os
import pkgutil
from pathlib import Path

#: Kept equal to opbridge.specs.LOWERING_KINDS and opbridge.tools.parity.EXPORTERS (tests/test_contract.py checks).
LOWERING_KINDS = ("standard", "custom", "function")
EXPORTERS = ("legacy", "dynamo")
#: The bench section that is not an op: import time and export caches (python/opbridge/tools/bench/_framework.py).
BENCH_FRAMEWORK = "framework"

COMMANDS = {
    "parity": "the parity matrix: ONNX Runtime vs PyTorch for every op, call path, exporter, lowering, opset, dtype",
    "inspect": "what a model needs to run in ONNX Runtime, with and without the opbridge library",
    "bench": "the benchmarks, with ratios against baselines measured in the same run",
    "ops": "the table of opbridge's ops and mappings (docs/ops.md)",
    "coverage": "the coverage sweep: PyTorch's op samples through both exporters into ORT, without and with opbridge",
    "models": "the model sweep: torchvision and transformers models through both exporters into ORT, without and with "
    "opbridge",
}


def main_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m opbridge",
        description="opbridge's commands; `python -m opbridge COMMAND --help` for each.",
        epilog="\n".join(f"  {name:8} {text}" for name, text in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=list(COMMANDS), help="the command to run")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the command's own arguments")
    return parser


def parity_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m opbridge parity", description=COMMANDS["parity"] + ".")
    parser.add_argument("--ops", nargs="+", help="ops to run (default: all; an unknown name lists the valid ones)")
    parser.add_argument("--exporters", nargs="+", choices=EXPORTERS, default=list(EXPORTERS))
    parser.add_argument("--lowerings", nargs="+", choices=LOWERING_KINDS, default=list(LOWERING_KINDS))
    parser.add_argument("--opsets", nargs="+", type=int, help="opsets to run (default: all each exporter supports)")
    parser.add_argument("--dtypes", nargs="+", help="dtypes to run, e.g. float32 (default: all the op supports)")
    parser.add_argument("--paths", nargs="+", help="call paths to run, e.g. pybind (default: all)")
    parser.add_argument(
        "--quick", action="store_true",
        help="representative opsets only (legacy: 9, 13, 17 and its newest; dynamo: 18 and its newest)",
    )  # fmt: skip
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    parser.add_argument(
        "--no-share", action="store_true",
        help="run every cell on its own: no inputs, captured programs or decompositions shared within a group "
        "(slower; for checking that sharing changes no result)",
    )  # fmt: skip
    parser.add_argument("--json", help="write the results to this JSON file")
    return parser


def bench_sections() -> list[str]:
    """What ``bench --ops`` takes: every op's benchmark, python/opbridge/tools/bench/<op>.py (found without importing
    it, which would import torch; names starting with an underscore are helpers), in name order, then
    ``framework``."""
    package = importlib.util.find_spec(f"{__package__}.tools.bench")
    found = pkgutil.iter_modules(package.submodule_search_locations)
    return [*sorted(info.name for info in found if not info.name.startswith("_")), BENCH_FRAMEWORK]


def bench_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m opbridge bench", description=COMMANDS["bench"] + ".")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--warmup", type=int, default=2, help="warm-up runs of each path (and 0.05 s at least)")
    parser.add_argument(
        "--repeat", type=int, default=7, help="interleaved rounds: timed runs of each path, at least (and 0.3 s)"
    )
    sections = bench_sections()
    parser.add_argument("--ops", nargs="+", choices=sections, default=sections)
    parser.add_argument("--parity-report", type=Path, help="a `nox -s parity` JSON report, for its throughput")
    parser.add_argument("--triad-library", help="libopbridge_bench.so (the triad); built by `nox -s bench`")
    parser.add_argument("--json", type=Path, help="write rows and ratios here")
    parser.add_argument("--markdown", type=Path, help="write the Markdown report here (docs/benchmarks.md)")
    return parser


def ops_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m opbridge ops", description=COMMANDS["ops"] + ".")
    parser.add_argument("--markdown", type=Path, help="write the table here (docs/ops.md)")
    parser.add_argument("--check", type=Path, help="exit 1 if this file differs from the table")
    parser.add_argument(
        "--readme", type=Path, help="rewrite the short table of this README (from the sources beside it)"
    )
    parser.add_argument("--check-readme", type=Path, help="exit 1 if this README's short table is stale")
    return parser


def coverage_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m opbridge coverage", description=COMMANDS["coverage"] + ".")
    parser.add_argument("--ops", nargs="+", help="op names or glob patterns, e.g. 'scatter_reduce.*' (default: all)")
    parser.add_argument("--subset", choices=["ci"], help="ci: the ops opbridge maps plus every 40th other op")
    parser.add_argument("--modes", nargs="+", choices=["without", "with"], default=["without", "with"],
                        help="without and/or with `import opbridge` (default: both)")  # fmt: skip
    dtypes = ["float32", "int64", "bool"]
    parser.add_argument("--dtypes", nargs="+", choices=dtypes, default=dtypes, help="sample dtypes, where taken")
    parser.add_argument("--samples", type=int, default=2,
                        help="samples per op for float32 (half as many, at least 1, for the others)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds one case may take")
    parser.add_argument("--budget-minutes", type=float, help="start no unit after this many minutes")
    parser.add_argument("--json", type=Path, help="write every case here (reports/coverage.json)")
    parser.add_argument("--markdown", type=Path, help="write the report here (docs/coverage.md)")
    parser.add_argument("--log", type=Path, help="append the workers' stderr here")
    parser.add_argument("--case", help="replay one case by its id, in this process, printing everything")
    parser.add_argument("--report-from", type=Path, help="rewrite --markdown/--json from a JSON report, no sweep")
    parser.add_argument("--update", type=Path,
                        help="a full JSON report whose cases of the selected --ops this sweep replaces")  # fmt: skip
    parser.add_argument("--worker", choices=["without", "with"], help=argparse.SUPPRESS)
    return parser


def models_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m opbridge models", description=COMMANDS["models"] + ".")
    parser.add_argument("--models", nargs="+", help="model names or patterns (default: all), e.g. 'transformers.*'")
    parser.add_argument("--fast", action="store_true", help="the fast subset (what `nox -s tests` runs)")
    parser.add_argument("--exporters", nargs="+", choices=EXPORTERS, help="exporters (default: both)")
    parser.add_argument("--case", help="replay one case by its id, e.g. with:torchvision.resnet18:legacy17")
    parser.add_argument("--timing", action="store_true", help="with --case: also time eager and ORT")
    parser.add_argument("--json-line", action="store_true", help="with --case: print the result as one JSON line")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per case (default 300)")
    parser.add_argument(
        "--dtype", choices=("float32", "float16"), default="float32",
        help="cast each model and its inputs to this dtype before the export (float16: model.half()); "
        "the report: docs/models-float16.md",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write every case here (reports/models.json)")
    parser.add_argument("--markdown", type=Path, help="write the report here (docs/models.md)")
    parser.add_argument(
        "--speed", action="store_true", help="time Deformable DETR as published, without and with opbridge, and stop"
    )
    parser.add_argument("--image", type=int, default=512, help="with --speed: the image size (default 512)")
    parser.add_argument("--threads", type=int, default=1, help="with --speed: threads for torch and ORT (default 1)")
    return parser


PARSERS = {
    "parity": parity_parser,
    "bench": bench_parser,
    "ops": ops_parser,
    "coverage": coverage_parser,
    "models": models_parser,
}
