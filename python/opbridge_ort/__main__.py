"""``python -m opbridge_ort inspect MODEL.onnx`` (torch-free)."""

import sys

from .inspect import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "inspect":
        print("usage: python -m opbridge_ort inspect MODEL.onnx", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(args[1:]))
