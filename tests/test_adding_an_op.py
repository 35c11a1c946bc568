"""docs/adding-an-op.md, followed mechanically: every op with a custom ONNX node has each piece the page
lists, so a skipped step fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import opbridge_ort
from opbridge import specs

ROOT = Path(__file__).parent.parent
OPS = [s for s in specs.all_specs() if s.custom_node is not None and s.torch_op.startswith("opbridge::")]


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_every_piece_exists(spec):
    op = spec.torch_op.split("::")[1]
    ort_file = _snake(spec.custom_node.op_type)
    assert (ROOT / "cpp" / "kernels" / f"{op}.h").is_file()
    assert f'm.def("{op}(' in (ROOT / "cpp/torch/schemas.cpp").read_text().replace('m.def(\n      "', 'm.def("')
    torch_adapter = ROOT / "cpp" / "torch" / "cpu" / f"{op}.cpp"
    assert f'm.impl("{op}"' in torch_adapter.read_text()
    assert f"cpu/{op}.cpp" in (ROOT / "cpp/torch/CMakeLists.txt").read_text()
    assert (ROOT / "cpp" / "ort" / f"{ort_file}.cc").is_file()
    assert f"{ort_file}.cc" in (ROOT / "cpp/ort/CMakeLists.txt").read_text()
    assert f"void append_{ort_file}(" in (ROOT / "cpp/ort/api.h").read_text()
    assert f"append_{ort_file}(ops);" in (ROOT / "cpp/ort/register.cc").read_text()
    assert spec.custom_node.op_type in opbridge_ort.OPS
    assert f'"opbridge::{op}"' in (ROOT / "python/opbridge/ops.py").read_text()  # fake kernel
