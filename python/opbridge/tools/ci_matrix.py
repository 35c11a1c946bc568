"""The release workflow's job matrix, generated from the noxfile (.github/workflows/release.yml):

    nox -l --json -t matrix | python python/opbridge/tools/ci_matrix.py

reads nox's session list (its JSON: one entry per parametrized session, with `name`, `session`, `python` and
`call_spec`) and prints a GitHub Actions matrix, `{"include": [...]}`, with one job per compatibility cell: the
`matrix` sessions, each with the nox session to run and its Python, torch and ORT. The noxfile stays the one
place where the cells are listed; a cell added there is a job in the next release run. Standard library only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: The nox session each job runs (one per Python x torch x ORT).
SESSION = "matrix"


def jobs(sessions: list[dict]) -> dict:
    """The GitHub matrix of the `matrix` sessions in nox's JSON session list."""
    include = []
    for entry in sessions:
        if entry.get("name") != SESSION:
            continue
        spec = entry.get("call_spec", {})
        missing = [key for key in ("torch", "onnxruntime") if key not in spec]
        if missing or not entry.get("python"):
            raise ValueError(f"nox session {entry.get('session')!r} has no {missing or ['python']}: not a matrix cell")
        include.append({"session": entry["session"], "python": entry["python"], "torch": spec["torch"],
                        "onnxruntime": spec["onnxruntime"]})  # fmt: skip
    if not include:
        raise ValueError(f"nox lists no {SESSION!r} session: run `nox -l --json -t matrix` in the repository root")
    names = [job["session"] for job in include]
    if len(set(names)) != len(names):
        raise ValueError(f"nox lists a session twice: {names}")
    return {"include": include}


def main(argv: list[str]) -> int:
    text = Path(argv[1]).read_text() if len(argv) > 1 else sys.stdin.read()
    try:
        matrix = jobs(json.loads(text))
    except (ValueError, json.JSONDecodeError) as error:
        print(f"ci_matrix: {error}", file=sys.stderr)
        return 1
    print(json.dumps(matrix, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
