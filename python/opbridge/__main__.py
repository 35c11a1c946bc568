"""``python -m opbridge COMMAND``: the parity matrix (``parity``), what a model needs (``inspect``),
the benchmarks (``bench``), the table of ops and mappings (``ops``)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "parity": "opbridge.parity",
        "inspect": "opbridge_ort.inspect",
        "bench": "opbridge.bench",
        "ops": "opbridge.catalog",
    }
    if not argv or argv[0] not in commands:
        print(
            "usage: python -m opbridge {parity,inspect,bench,ops} [options]   (e.g. python -m opbridge parity --help)",
            file=sys.stderr,
        )
        return 2
    import importlib

    return importlib.import_module(commands[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
