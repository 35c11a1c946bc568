"""Every ```python block of the README and docs/ runs, so the docs cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [
    pytest.param(match.group(1), id=f"{path.name}:{path.read_text()[: match.start()].count(chr(10)) + 1}")
    for path in DOCUMENTS
    for match in re.finditer(r"```python\n(.*?)```", path.read_text(), flags=re.S)
]


def test_there_are_examples():
    assert BLOCKS, "no python examples found in the docs"


@pytest.mark.parametrize("code", BLOCKS)
def test_doc_example_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples may write files: only under tmp_path
    exec(compile(code, "<doc example>", "exec"), {"__name__": "__doc_example__"})
