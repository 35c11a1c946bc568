"""Every ```python block of the README and docs/ runs, so the docs cannot rot; every other code block says why it
is not run (``<!-- not run: reason -->`` on the line before it).

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


NOT_RUN = re.compile(r"<!-- not run: (\S.*\S) -->")


def _fences(path: Path) -> list[tuple[int, str, str]]:
    """(line, language, the line before) of every fenced code block."""
    lines = path.read_text().split("\n")
    opening, found = None, []
    for number, line in enumerate(lines):
        if not line.startswith("```"):
            continue
        if opening is None:
            opening = number
            found.append((number + 1, line[3:].strip(), lines[number - 1] if number else ""))
        else:
            opening = None
    assert opening is None, f"{path.name}: a code block opened at line {opening + 1} is never closed"
    return found


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in DOCUMENTS])
def test_every_code_block_runs_or_says_why_not(path):
    """```python blocks run (test_doc_examples_run); any other block (```py, ```bash, ```text, ...) carries a
    reason it is not run, so a snippet cannot silently stop being true."""
    unmarked = [
        f"{path.name}:{line} (```{language})"
        for line, language, before in _fences(path)
        if language != "python" and not NOT_RUN.fullmatch(before.strip())
    ]
    assert not unmarked, "code blocks neither run nor marked '<!-- not run: reason -->': " + ", ".join(unmarked)


def test_the_marker_check_catches_an_unmarked_block(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n\n```bash\nrm -rf /\n```\n\n<!-- not run: fine -->\n```text\noutput\n```\n")
    with pytest.raises(AssertionError, match=r"page.md:3 \(```bash\)"):
        test_every_code_block_runs_or_says_why_not(page)


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


def test_readme_table_is_current():
    """README's short table is generated from the op specs and the sources (the nodes each C++ file registers, the
    CUDA library's nodes, the torch ops with a CUDA kernel): a node or a CUDA kernel cannot be added or dropped
    without it."""
    from opbridge.tools import catalog

    assert catalog.main(["--check-readme", str(ROOT / "README.md")]) == 0, (
        "README.md's table is stale: run python -m opbridge ops --readme README.md"
    )


def test_readme_table_reads_the_sources(tmp_path):
    """The CUDA column follows cpp/ort/cuda/<op>.cc and cpp/cuda/: a copy of the sources without the CUDA
    registrations of one node and one torch op gives a table that says so."""
    import shutil

    import opbridge
    from opbridge.tools import catalog

    opbridge._load()
    for part in ("cpp/ort", "cpp/cuda"):
        shutil.copytree(ROOT / part, tmp_path / part)
    ops = tmp_path / "cpp/ort/cuda/psa_mask.cc"
    registration = "OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVPSAMask"
    assert registration in ops.read_text()
    ops.write_text(ops.read_text().replace(registration, "// (mmcv, MMCVPSAMask"))
    (tmp_path / "cpp/cuda/nms_rotated.cu").unlink()
    table = catalog.readme_table(tmp_path)
    nms = next(line for line in table.splitlines() if line.startswith("| `nms_rotated`"))
    assert nms.endswith("| no / yes |"), nms
    assert "— / all but `mmcv::SoftNonMaxSuppression`, `mmcv::MMCVPSAMask` |" in table
    assert catalog.readme_table(ROOT) != table
