"""Runs cpp/tests/leak_check.cpp (opbridge_leak_check) against the onnxruntime of this Python.

    python tests/leak_check.py path/to/opbridge_leak_check path/to/libopbridge_ort.so [sessions]

Writes the two models it needs (opbridge::MyAdd and opbridge::DeformConv2d, with the input shapes the
program feeds) into a temporary directory, finds onnxruntime's own libonnxruntime.so and runs the program;
its exit status is ours. Used by ctest (plain build: resident memory must stay flat) and by
`nox -s sanitize` (ASan build: LeakSanitizer reports at exit).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime

sys.path.insert(0, str(Path(__file__).parent))
from ort_cases.deform_conv2d import deform_model
from ort_cases.my_add import my_add_model


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    program, library, *rest = argv
    runtime = sorted((Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so*"))
    if not runtime:
        print("this onnxruntime package has no libonnxruntime.so", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as directory:
        models = Path(directory)
        (models / "my_add.onnx").write_bytes(my_add_model(np.float32, [3, 4], [4]))
        attributes = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 2, "offset_group": 2}
        (models / "deform.onnx").write_bytes(deform_model(np.float32, **attributes))
        command = [program, str(runtime[0]), library, str(models / "my_add.onnx"), str(models / "deform.onnx"), *rest]
        return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
