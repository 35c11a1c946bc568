"""Repairs a built wheel to its manylinux tag and audits it: the one definition of what a released wheel may
contain, used by `nox -s wheels` and by cibuildwheel's repair step (pyproject.toml, .github/workflows/release.yml):

    python python/opbridge/tools/repair_wheel.py WHEEL DEST_DIR

`auditwheel repair` tags the wheel, vendoring nothing of torch's, ORT's, OpenMP's or OpenBLAS's (EXCLUDES: the
environment provides them; a second copy would break them). Its own verdict cannot be told which libraries are
left out on purpose ("consistent with linux_x86_64" because of libtorch_cpu.so), so the audit is made here:
the symbol versions allow CEILING (manylinux_2_28, torch's own floor) or an older policy, nothing was grafted
into the wheel, every external library outside the policy is one of EXCLUDES, and no instruction set beyond the
platform's baseline is required. Prints the repaired wheel's path last; exits 1 on any violation. Needs
auditwheel (and patchelf) on PATH; standard library otherwise.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import zipfile
from fnmatch import fnmatch
from pathlib import Path

#: Never vendored: torch's libraries, ONNX Runtime's, OpenMP (the classic build's at::parallel_for must use the
#: libgomp torch loads: libgomp.so.1, or libgomp-<hash>.so.1 in torch 2.6) and the OpenBLAS of the
#: scipy-openblas32 wheel the runtime wheel depends on.
EXCLUDES = ["libtorch.so", "libtorch_cpu.so", "libtorch_python.so", "libc10.so", "libonnxruntime.so*", "libgomp.so.1",
            "libgomp-*.so.1", "libscipy_openblas*.so"]  # fmt: skip
#: The newest manylinux policy a wheel may need (glibc major, minor).
CEILING = (2, 28)


def manylinux_glibc(tag: str) -> tuple[int, int] | None:
    """(2, 17) for manylinux_2_17_x86_64 (or its alias manylinux2014_x86_64); None for a tag that is no manylinux."""
    aliases = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
    found = re.match(r"manylinux_(\d+)_(\d+)_", tag)
    return (int(found[1]), int(found[2])) if found else aliases.get(tag.split("_")[0])


def problems(audit: dict, names: list[str]) -> list[str]:
    """What is wrong with a repaired wheel, given `auditwheel show --json` and the names in the wheel."""
    found = []
    glibc = manylinux_glibc(audit["sym_tag"])
    if glibc is None or glibc > CEILING:
        found.append(f"its symbol versions need {audit['sym_tag']}, newer than manylinux_{CEILING[0]}_{CEILING[1]}")
    grafted = [n for n in names if ".libs/" in n]
    if grafted:
        found.append(f"libraries were grafted into it: {grafted}")
    unexpected = [lib for lib in audit["external_libs"] if not any(fnmatch(lib, p) for p in EXCLUDES)]
    if unexpected:
        found.append(f"it needs external libraries outside the policy: {unexpected}")
    if audit.get("unsupported_isa"):
        found.append(f"it needs instructions beyond the platform's baseline: {audit['unsupported_isa']}")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    raw, dest = Path(argv[1]), Path(argv[2])
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.whl"))
    excludes = [arg for name in EXCLUDES for arg in ("--exclude", name)]
    subprocess.run(["auditwheel", "repair", *excludes, "-w", str(dest), str(raw)], check=True)
    stem = raw.name.split("-linux_")[0]
    made = [w for w in dest.glob(f"{stem}-*manylinux*.whl") if w not in before] or list(
        dest.glob(f"{stem}-*manylinux*.whl")
    )
    if len(made) != 1:
        print(f"repair_wheel: expected one repaired wheel for {raw.name} in {dest}, found {made}", file=sys.stderr)
        return 1
    wheel = made[0]
    # The wheel's own files only: with the default search path auditwheel would also read the symbol versions of
    # system copies of excluded libraries (this machine's libgomp.so.1 needs glibc 2.34), which never load: the
    # environment's torch provides its own.
    with tempfile.TemporaryDirectory() as nowhere:
        shown = subprocess.run(["auditwheel", "show", "--json", "--ldpaths", nowhere, str(wheel)], check=True,
                               capture_output=True, text=True)  # fmt: skip
    audit = json.loads(shown.stdout)
    with zipfile.ZipFile(wheel) as archive:
        wrong = problems(audit, archive.namelist())
    if wrong:
        print(f"repair_wheel: {wheel.name}: " + "; ".join(wrong), file=sys.stderr)
        return 1
    print(
        f"{wheel.name}: symbol tag {audit['sym_tag']} (at most manylinux_{CEILING[0]}_{CEILING[1]}), nothing "
        f"vendored, external libraries {sorted(audit['external_libs'])} (left to the environment on purpose)"
    )
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
