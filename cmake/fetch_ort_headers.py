"""Fetch ONNX Runtime's C/C++ headers into a cache directory, version pinned.

PyPI's onnxruntime wheels ship the shared library but no headers, so the build
needs them from elsewhere. Debian packages them as ``libonnxruntime-dev``: a
small .deb that we download from the Debian mirror this machine is already
configured with (read from its apt sources, or given by the user), verify
against a pinned SHA-256, and unpack with the standard library only (no apt or
dpkg needed, so it also works outside Debian given a mirror).

Usage: python fetch_ort_headers.py CACHE_DIR   -> prints the include directory
Environment: OPBRIDGE_DEBIAN_MIRROR overrides the mirror (a Debian archive URI).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

ORT_HEADERS_VERSION = "1.21.0"
DEB_PATH = "pool/main/o/onnxruntime/libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb"
DEB_SHA256 = "14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08"
REQUIRED = ("onnxruntime_c_api.h", "onnxruntime_cxx_api.h", "onnxruntime_lite_custom_op.h")
HELP = (
    "Give the headers yourself instead: -DOPBRIDGE_ORT_INCLUDE_DIR=<dir> (CMake) or the environment "
    "variable OPBRIDGE_ORT_INCLUDE_DIR=<dir>, pointing at a directory holding "
    + ", ".join(REQUIRED)
    + " (from ONNX Runtime >= 1.16: an official release archive's include/, or Debian's "
    "libonnxruntime-dev). Or set OPBRIDGE_DEBIAN_MIRROR to a Debian archive URI."
)


def debian_mirrors() -> list[str]:
    """Debian archive URIs from the environment or the system's apt sources."""
    if os.environ.get("OPBRIDGE_DEBIAN_MIRROR"):
        return [os.environ["OPBRIDGE_DEBIAN_MIRROR"]]
    uris: list[str] = []
    sources = [Path("/etc/apt/sources.list")]
    parts = Path("/etc/apt/sources.list.d")
    if parts.is_dir():
        sources += sorted(parts.glob("*.sources")) + sorted(parts.glob("*.list"))
    for source in sources:
        try:
            text = source.read_text()
        except OSError:
            continue
        uris += re.findall(r"^\s*URIs:\s*(\S+)", text, flags=re.M)
        uris += re.findall(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)", text, flags=re.M)
    # The main archive, not the security one; it carries every suite's pool.
    return [u for u in dict.fromkeys(uris) if u.rstrip("/").endswith("/debian")]


def extract_headers(deb: bytes, destination: Path) -> None:
    """Unpack include/onnxruntime/*.h from a .deb (an ar archive holding data.tar.*)."""
    if not deb.startswith(b"!<arch>\n"):
        raise RuntimeError("downloaded file is not a Debian package")
    offset = 8
    while offset + 60 <= len(deb):
        header = deb[offset : offset + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = deb[offset + 60 : offset + 60 + size]
        offset += 60 + size + (size % 2)
        if not name.startswith("data.tar"):
            continue
        with tarfile.open(fileobj=io.BytesIO(body)) as archive:
            for member in archive.getmembers():
                file_name = Path(member.name).name
                if member.isfile() and "/include/onnxruntime/" in member.name and file_name.endswith(".h"):
                    data = archive.extractfile(member).read()
                    (destination / file_name).write_bytes(data)
        return
    raise RuntimeError("no data.tar member in the Debian package")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    include_dir = Path(sys.argv[1]) / f"onnxruntime-{ORT_HEADERS_VERSION}" / "include"
    if all((include_dir / name).is_file() for name in REQUIRED):
        print(include_dir)
        return 0
    mirrors = debian_mirrors()
    if not mirrors:
        print(f"opbridge: no Debian mirror found to fetch ONNX Runtime headers. {HELP}", file=sys.stderr)
        return 1
    errors = []
    for mirror in mirrors:
        url = mirror.rstrip("/") + "/" + DEB_PATH
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                deb = response.read()
        except OSError as error:
            errors.append(f"{url}: {error}")
            continue
        digest = hashlib.sha256(deb).hexdigest()
        if digest != DEB_SHA256:
            errors.append(f"{url}: SHA-256 {digest} does not match the pinned {DEB_SHA256}")
            continue
        include_dir.parent.mkdir(parents=True, exist_ok=True)
        # Unpack next to the final place, then rename: a concurrent or interrupted
        # build never sees a half-written cache.
        with tempfile.TemporaryDirectory(dir=include_dir.parent) as staging:
            extract_headers(deb, Path(staging))
            missing = [name for name in REQUIRED if not (Path(staging) / name).is_file()]
            if missing:
                errors.append(f"{url}: package lacks {missing}")
                continue
            try:
                os.replace(staging, include_dir)
            except OSError:
                if not include_dir.is_dir():
                    raise
            os.makedirs(staging, exist_ok=True)  # so TemporaryDirectory's cleanup succeeds
        print(include_dir)
        return 0
    print("opbridge: could not fetch ONNX Runtime headers:\n  " + "\n  ".join(errors) + f"\n{HELP}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
