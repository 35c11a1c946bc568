"""``python -m opbridge COMMAND``: the parity matrix (``parity``), what a model needs (``inspect``),
the benchmarks (``bench``), the table of ops and mappings (``ops``). Arguments are parsed before anything
heavy is imported; ``--help`` prints to stdout and exits 0."""

from __future__ import annotations

import importlib
import os
import sys

MODULES = {"parity": "opbridge.tools.parity", "inspect": "opbridge_ort.inspect", "bench": "opbridge.tools.bench",
           "ops": "opbridge.tools.catalog", "coverage": "opbridge.tools.coverage",
           "models": "opbridge.tools.models"}  # fmt: skip


#: Under ``bench``: cycles (a power of two) an idle OpenBLAS worker spins before it sleeps. By default 2^28, about
#: 0.1 s, so a path timed after the baseline's two-thread OpenBLAS GEMM found one of the two cores busy (a 6 ms
#: deform_conv2d forward took 22 ms right after it; the bench's 0.05 s settle did not cover it). 2^20 cycles is well
#: under a millisecond, and still longer than the gaps between a timed path's back-to-back calls.
OPENBLAS_THREAD_TIMEOUT = "20"


def _quiet_openblas() -> None:
    """Sets OPENBLAS_THREAD_TIMEOUT for the command line's ``bench`` (unless the user set it). OpenBLAS reads it when
    it loads: where numpy, and with it numpy's OpenBLAS, is loaded already, the same command line starts again."""
    if "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = OPENBLAS_THREAD_TIMEOUT
    if "numpy" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])  # interpreter flags and all


def main(argv: list[str] | None = None) -> int:
    """The command line (``argv`` None: ``sys.argv``), or one command called from a program (``argv`` given: the
    process and its environment are left as they are)."""
    from ._cli import PARSERS, main_parser

    command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in MODULES:
        main_parser().parse_args(argv)  # --help (exit 0), or an error listing the commands (exit 2)
        return 2
    command, arguments = argv[0], argv[1:]
    if command in PARSERS:
        PARSERS[command]().parse_args(arguments)  # parse errors and --help before the heavy imports
    if command == "bench" and command_line:
        _quiet_openblas()
    module = importlib.import_module(MODULES[command])
    return module.main(arguments)


if __name__ == "__main__":
    sys.exit(main())
