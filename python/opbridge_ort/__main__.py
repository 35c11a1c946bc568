"""``python -m opbridge_ort inspect MODEL.onnx`` (torch-free)."""

import sys

USAGE = """usage: python -m opbridge_ort inspect [-h] MODEL.onnx

Says whether ONNX Runtime can run an ONNX model, with and without the opbridge library, and what to do when
it cannot (python -m opbridge_ort inspect --help for details)."""


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if not argv or argv[0] != "inspect":
        print(USAGE, file=sys.stderr)
        return 2
    from .inspect import main as inspect_main

    return inspect_main(argv[1:], prog="python -m opbridge_ort inspect")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
