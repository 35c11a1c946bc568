"""Every ```python block of the README and docs/ runs, so the docs cannot rot.

The blocks of one page run in order in one namespace, as a reader would run them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(path: Path) -> list[tuple[int, str]]:
    text = path.read_text()
    return [
        (text[: match.start()].count("\n") + 1, match.group(1))
        for match in re.finditer(r"```python\n(.*?)```", text, flags=re.S)
    ]


PAGES = [pytest.param(path, id=path.name) for path in DOCUMENTS if _blocks(path)]


def test_there_are_examples():
    assert len(PAGES) >= 2, "the README and the tutorial must have python examples"


@pytest.mark.parametrize("path", PAGES)
def test_doc_examples_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples may write files: only under tmp_path
    namespace = {"__name__": "__doc_example__"}
    for line, code in _blocks(path):
        try:
            exec(compile(code, f"{path.name}:{line}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"the example at {path.name}:{line} failed: {error!r}") from error


def test_ops_table_is_current():
    """docs/ops.md is generated from the registered op modules and mappings: a new op cannot be missing."""
    from opbridge.tools import catalog

    assert catalog.main(["--check", str(ROOT / "docs" / "ops.md")]) == 0, (
        "docs/ops.md is stale: run python -m opbridge ops --markdown docs/ops.md"
    )
