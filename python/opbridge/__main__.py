"""``python -m opbridge COMMAND``: the parity matrix (``parity``), what a model needs (``inspect``),
the benchmarks (``bench``), the table of ops and mappings (``ops``). Arguments are parsed before anything
heavy is imported; ``--help`` prints to stdout and exits 0."""

from __future__ import annotations

import importlib
import sys

MODULES = {"parity": "opbridge.tools.parity", "inspect": "opbridge_ort.inspect", "bench": "opbridge.tools.bench",
           "ops": "opbridge.tools.catalog", "coverage": "opbridge.tools.coverage",
           "models": "opbridge.tools.models"}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from ._cli import PARSERS, main_parser

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in MODULES:
        main_parser().parse_args(argv)  # --help (exit 0), or an error listing the commands (exit 2)
        return 2
    command, arguments = argv[0], argv[1:]
    if command in PARSERS:
        PARSERS[command]().parse_args(arguments)  # parse errors and --help before the heavy imports
    module = importlib.import_module(MODULES[command])
    return module.main(arguments)


if __name__ == "__main__":
    sys.exit(main())
