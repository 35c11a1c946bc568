"""The torch ops on the stable-ABI layer against the same ops on the classic layer (cpp/torch/api.h), same torch,
same machine, same run: `nox -s bench_layers`.

The parent process alternates child processes, one per build and round (stable, classic, stable, classic, ...),
so that drift of a shared machine falls on both; each child times every case (median of `--repeat` runs after
warm-up) and prints JSON. The classic build is the installed package with its `_C`, ops library and `_build_info`
swapped for the classic build's (`--classic-build`), staged in a directory put first on PYTHONPATH. `--before-build`
adds a third: the torch ops of an earlier commit (what users had before the torch layer), staged the same way.

Prints, per case and thread count, the median over rounds of each build's time and the ratios classic / stable
and before / stable (> 1: the stable build is faster); writes them with --json and --markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def child(threads: list[int], warmup: int, repeat: int) -> dict[str, float]:
    import torch

    import opbridge
    from opbridge.tools.bench import deform_conv2d, ms_deform_attn, my_add, time_call

    opbridge._load()
    results: dict[str, float] = {}
    cases = []
    generator = torch.Generator().manual_seed(0)
    for name, numel in my_add.SIZES.items():
        a, b = torch.randn(numel, generator=generator), torch.randn(numel, generator=generator)
        cases.append((f"my_add {name}", lambda a=a, b=b: opbridge.my_add(a, b)))
    for shape in deform_conv2d.SHAPES[:3]:
        x = torch.randn(shape.batch, shape.in_channels, shape.height, shape.width, generator=generator)
        offset = 2 * torch.randn(shape.batch, 18, shape.height, shape.width, generator=generator)
        mask = torch.rand(shape.batch, 9, shape.height, shape.width, generator=generator)
        weight = torch.randn(shape.out_channels, shape.in_channels, 3, 3, generator=generator) * 0.05
        bias = torch.randn(shape.out_channels, generator=generator)
        args = (x, offset, weight, bias, (1, 1), (1, 1), (1, 1), mask)
        cases.append((f"deform_conv2d {shape.name}", lambda args=args: torch.ops.opbridge.deform_conv2d(*args)))
        grad = torch.randn(shape.batch, shape.out_channels, shape.height, shape.width, generator=generator)
        cases.append(
            (
                f"deform_conv2d_backward {shape.name}",
                lambda args=args, grad=grad: torch.ops.opbridge.deform_conv2d_backward(grad, *args),
            )
        )
    for name, levels in ms_deform_attn.CASES.items():
        inputs = ms_deform_attn.encoder_inputs(levels)
        cases.append((f"ms_deform_attn {name}", lambda inputs=inputs: torch.ops.opbridge.ms_deform_attn(*inputs)))
        grad = torch.randn_like(torch.ops.opbridge.ms_deform_attn(*inputs))
        cases.append(
            (
                f"ms_deform_attn_backward {name}",
                lambda inputs=inputs, grad=grad: torch.ops.opbridge.ms_deform_attn_backward(grad, *inputs),
            )
        )
    for count in threads:
        torch.set_num_threads(count)
        for name, call in cases:
            results[f"{name} | {count}t"] = statistics.median(time_call(call, warmup, repeat))
    return results


def stage(build: Path, directory: Path) -> Path:
    """The installed opbridge package with another build's extension and build info (a CMake build dir)."""
    import opbridge

    package = Path(opbridge.__file__).parent
    staged = directory / "opbridge"
    ignored = shutil.ignore_patterns("_C.*.so", "libopbridge_ops.so", "_build_info.py", "__pycache__")
    shutil.copytree(package, staged, ignore=ignored)
    torch_dir = build / "cpp" / "torch"
    for built in [*torch_dir.glob("_C.*.so"), torch_dir / "libopbridge_ops.so", torch_dir / "_build_info.py"]:
        shutil.copy2(built, staged / built.name)
    return directory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classic-build", type=Path, help="CMake build dir of the classic layer (parent mode)")
    parser.add_argument("--before-build", type=Path, help="CMake build dir of the torch ops of an earlier commit")
    parser.add_argument("--before-label", default="before", help="what --before-build is (e.g. the commit)")
    parser.add_argument("--before-description", help="the report's words for --before-build (default: a commit)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path, help="write the table (docs/bench-layers.md)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.threads, args.warmup, args.repeat)))
        return 0
    if args.classic_build is None:
        parser.error("--classic-build is required")
    builds = {"stable": None, "classic": args.classic_build}
    if args.before_build:
        builds["before"] = args.before_build
    times: dict[str, dict[str, list[float]]] = {build: {} for build in builds}
    with tempfile.TemporaryDirectory() as tmp:
        staged = {build: stage(path, Path(tmp) / build) for build, path in builds.items() if path}
        command = [sys.executable, __file__, "--child", "--warmup", str(args.warmup), "--repeat", str(args.repeat),
                   "--threads", *map(str, args.threads)]  # fmt: skip
        for round_ in range(args.rounds):
            for build in builds:
                env = dict(os.environ)
                if build in staged:
                    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(staged[build]), env.get("PYTHONPATH")]))
                check_build(build, staged.get(build), env)
                output = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
                for case, milliseconds in json.loads(output.splitlines()[-1]).items():
                    times[build].setdefault(case, []).append(milliseconds)
                print(f"round {round_ + 1}/{args.rounds}: {build} done", flush=True)
    rows = []
    others = [build for build in builds if build != "stable"]
    print(f"\n{'case':52} {'stable ms':>10}" + "".join(f" {b + ' ms':>10} {b + '/stable':>15}" for b in others))
    for case in times["stable"]:
        row = {"case": case, "stable_ms": statistics.median(times["stable"][case])}
        for build in others:
            row[f"{build}_ms"] = statistics.median(times[build][case])
        row["ratio"] = row["classic_ms"] / row["stable_ms"]
        if "before" in builds:
            row["before_ratio"] = row["before_ms"] / row["stable_ms"]
        rows.append(row)
        print(f"{case:52} {row['stable_ms']:10.3f}" + "".join(
            f" {row[f'{b}_ms']:10.3f} {row[f'{b}_ms'] / row['stable_ms']:15.3f}" for b in others))  # fmt: skip
    for build in others:
        ratios = [row[f"{build}_ms"] / row["stable_ms"] for row in rows]
        print(f"geometric mean {build}/stable: {statistics.geometric_mean(ratios):.3f}; "
              f"range {min(ratios):.3f} .. {max(ratios):.3f} over {len(rows)} cases")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"rows": rows, "rounds": args.rounds, "before": args.before_label if args.before_build else None}
        args.json.write_text(json.dumps(report, indent=1))
    if args.markdown:
        args.markdown.write_text(markdown(rows, args))
    return 0


def check_build(build: str, staged: Path | None, env: dict[str, str]) -> None:
    """The child must import the build it is timed as: the installed stable one, or the staged copy."""
    script = "import opbridge._build_info as b, opbridge; print(getattr(b, 'TORCH_ABI', 'classic'), opbridge.__file__)"
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    abi, location = result.stdout.split()
    if staged is None and abi != "stable":
        raise SystemExit(f"expected the installed stable build, the child imports the {abi} one ({location})")
    if staged is not None and not Path(location).is_relative_to(staged):
        raise SystemExit(f"expected the {build} build staged in {staged}, the child imports {location}")
    if build == "classic" and abi != "classic":
        raise SystemExit(f"expected the classic build, the child imports the {abi} one")


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    import platform

    import torch

    from opbridge.tools.bench import cpu_name

    before = args.before_label if args.before_build else None
    columns = [("classic", "classic")] + ([("before", before)] if before else [])

    def summary(build: str, label: str) -> str:
        ratios = [row[f"{build}_ms"] / row["stable_ms"] for row in rows]
        return (f"- {label} / stable: geometric mean **{statistics.geometric_mean(ratios):.3f}** (range "
                f"{min(ratios):.3f} .. {max(ratios):.3f} over {len(rows)} cases)")  # fmt: skip

    compared = ""
    if before:
        compared = ", and " + (args.before_description or f"the torch ops as commit `{before}` built them "
                                                            f"(`-- --before {before}`)")  # fmt: skip
    lines = [
        "# The torch ops on the stable-ABI layer and on the classic layer",
        "",
        "Generated by `nox -s bench_layers` (`tests/bench_layers.py`): the same op sources (cpp/torch/<op>.cpp) built",
        "on `cpp/torch/api_stable.h` (what the wheel for torch >= 2.10 ships) and on `cpp/torch/api_classic.h`",
        f"(ATen), both against torch {torch.__version__}{compared}, timed in alternating processes ({args.rounds} "
        f"rounds; each time is the median over rounds of the median of {args.repeat} runs after {args.warmup} "
        "warm-up runs).",
        f"Machine: {platform.processor() or platform.machine()} ({cpu_name()}), {os.cpu_count()} cores, Python "
        f"{platform.python_version()}. A ratio > 1: the stable build is faster.",
        "",
        *(summary(build, label) for build, label in columns),
        "",
        "| case | threads | stable (ms) | "
        + " | ".join(f"{label} (ms) | {label} / stable" for _, label in columns)
        + " |",
        "|---|---|---|" + "---|---|" * len(columns),
    ]
    for row in rows:
        case, threads = row["case"].rsplit(" | ", 1)
        cells = " | ".join(f"{row[f'{b}_ms']:.3f} | {row[f'{b}_ms'] / row['stable_ms']:.3f}" for b, _ in columns)
        lines.append(f"| {case} | {threads} | {row['stable_ms']:.3f} | {cells} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
