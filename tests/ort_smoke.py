"""Checks of the opbridge ORT custom-op library with nothing but onnxruntime,
onnx and numpy: no torch, no pytest, no opbridge Python package.

    python tests/ort_smoke.py path/to/libopbridge_ort.so [--models DIR]

Runs every op's cases (tests/ort_cases/<op>.py: hand-built models against numpy,
and malformed models and inputs that must fail with an error naming the op,
never crash), and checks that the library registers every op whose case module
exists; with --models, also the models tests/export_reference_models.py exported
(with PyTorch's outputs). Used by ctest (a C++ developer's build), by
`nox -s ort_versions` (old and newest ORT) and by the pytest suite. Prints one
line per check and "N passed, N failed".
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
import traceback
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).parent))
import ort_cases
from ort_cases._common import expect_error, session


def case_modules() -> list:
    """tests/ort_cases/<op>.py, in name order (helpers start with an underscore)."""
    return [
        importlib.import_module(f"ort_cases.{info.name}")
        for info in pkgutil.iter_modules(ort_cases.__path__)
        if not info.name.startswith("_")
    ]


def check_old_runtime_is_refused(library: str) -> None:
    """Below ORT 1.16 the library must refuse to register, with a message, not crash."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])], "identity",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    expect_error(lambda: session(library, model.SerializeToString()), "too old", ">= 1.16")


def check_every_op_has_cases(library: str) -> None:
    """Each op the library registers has a case module named after it (FooBar -> ort_cases/foo_bar.py)."""
    registered = {
        m.group(1).decode() for m in re.finditer(rb"opbridge-ort-op:(\w+):\d+\x00", Path(library).read_bytes())
    }
    snake = {re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower(): name for name in registered}
    modules = {module.__name__.split(".")[-1] for module in case_modules()}
    missing = sorted(f"tests/ort_cases/{name}.py (for {op})" for name, op in snake.items() if name not in modules)
    assert not missing, f"ops without ORT smoke cases: {', '.join(missing)}"


def runtime_version() -> tuple[int, int]:
    major, minor = ort.__version__.split(".")[:2]
    return int(major), int(minor)


def check_exported_models(library: str, directory: str) -> None:
    """Models exported by tests/export_reference_models.py, against PyTorch's saved outputs."""
    models = sorted(Path(directory).glob("*.onnx"))
    assert models, f"no exported models in {directory}"
    for path in models:
        data = np.load(path.with_suffix(".npz"))
        expected = data["expected"]
        try:
            sess = session(library, path.read_bytes())
        except Exception as error:
            if "Unsupported model IR version" not in str(error):
                raise
            # Expected: e.g. ORT 1.16 reads IR <= 9, the dynamo exporter writes IR 10.
            print(f"     {path.name}: n/a, this onnxruntime cannot read its IR version ({error})".splitlines()[0])
            continue
        (got,) = sess.run(None, {name: data[name] for name in data.files if name != "expected"})
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=path.name)
        print(f"     {path.name}: max error {float(np.abs(got - expected).max()):.1e}")


def main(argv: list[str]) -> int:
    models = None
    if len(argv) == 4 and argv[2] == "--models":
        models = argv[3]
        argv = argv[:2]
    if len(argv) != 2:
        print(__doc__)
        return 2
    library = argv[1]
    print(f"onnxruntime {ort.__version__}, onnx {onnx.__version__}, library {library}")
    passed = failed = 0
    checks = [check_every_op_has_cases, *(check for module in case_modules() for check in module.CHECKS)]
    if runtime_version() < (1, 16):
        checks = [check_old_runtime_is_refused]
    if models and runtime_version() >= (1, 16):
        checks = [*checks, lambda library: check_exported_models(library, models)]
        checks[-1].__name__ = "check_exported_models"
    for check in checks:
        try:
            check(library)
        except Exception:
            failed += 1
            print(f"FAIL {check.__name__}\n{traceback.format_exc()}")
        else:
            passed += 1
            print(f"ok   {check.__name__}")
    if "torch" in sys.modules:
        failed += 1
        print("FAIL torch was imported")
    else:
        print("ok   torch was not imported")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
