"""Fetch ONNX Runtime's C/C++ headers into a cache directory, version pinned.

PyPI's onnxruntime wheels ship the shared library but no headers, so the build needs them from elsewhere. Tried
in order, each verified against a pinned SHA-256 and unpacked with the standard library only (no apt, dpkg or
tar binaries needed):

1. an archive you give: OPBRIDGE_ORT_ARCHIVE=<path or URL> of an ONNX Runtime release archive (.tgz/.zip) or a
   libonnxruntime-dev .deb, checked against OPBRIDGE_ORT_ARCHIVE_SHA256 when set (offline installs);
2. Debian's ``libonnxruntime-dev`` 1.21.0 from the Debian mirror this machine's apt sources name (or
   OPBRIDGE_DEBIAN_MIRROR, a Debian archive URI);
3. ONNX Runtime's own release archive for Linux x64 (OPBRIDGE_ORT_RELEASE_URL overrides where it is fetched
   from, e.g. a local copy), which is what machines without Debian sources (Ubuntu, Fedora, Arch, containers)
   use.

Usage: python fetch_ort_headers.py CACHE_DIR   -> prints the include directory
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
import zipfile
from pathlib import Path

ORT_HEADERS_VERSION = "1.21.0"
DEB_PATH = "pool/main/o/onnxruntime/libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb"
DEB_SHA256 = "14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08"
# ONNX Runtime's release archive (Linux x64 CPU build): the headers of the oldest ONNX Runtime the library supports
# (1.16; it negotiates the API version with the runtime it is loaded into). The digest is the one other projects
# pin for this file (e.g. astro-informatics/sopt's CMake lookup).
RELEASE_VERSION = "1.16.3"
RELEASE_URL = (
    f"https://github.com/microsoft/onnxruntime/releases/download/v{RELEASE_VERSION}/"
    f"onnxruntime-linux-x64-{RELEASE_VERSION}.tgz"
)
RELEASE_SHA256 = "b072f989d6315ac0e22dcb4771b083c5156d974a3496ac3504c77f4062eb248e"
REQUIRED = ("onnxruntime_c_api.h", "onnxruntime_cxx_api.h", "onnxruntime_lite_custom_op.h")
HELP = (
    "Give the headers yourself: -DOPBRIDGE_ORT_INCLUDE_DIR=<dir> (CMake) or the environment variable "
    "OPBRIDGE_ORT_INCLUDE_DIR=<dir>, a directory holding "
    + ", ".join(REQUIRED)
    + " from ONNX Runtime >= 1.16 (the include/ of an official release archive, or Debian/Ubuntu's "
    "libonnxruntime-dev); or OPBRIDGE_ORT_ARCHIVE=<path or URL> of such an archive (optionally with "
    "OPBRIDGE_ORT_ARCHIVE_SHA256); or OPBRIDGE_DEBIAN_MIRROR=<Debian archive URI>; or OPBRIDGE_ORT_RELEASE_URL=<URL "
    f"or path> of onnxruntime-linux-x64-{RELEASE_VERSION}.tgz."
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


def _keep_header(name: str, destination: Path, data: bytes) -> None:
    (destination / Path(name).name).write_bytes(data)


def extract_headers(deb: bytes, destination: Path) -> None:
    """Unpack include/onnxruntime/*.h from a .deb (an ar archive holding data.tar.*)."""
    if not deb.startswith(b"!<arch>\n"):
        raise RuntimeError("the file is not a Debian package")
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
                if member.isfile() and "/include/onnxruntime/" in member.name and member.name.endswith(".h"):
                    _keep_header(member.name, destination, archive.extractfile(member).read())
        return
    raise RuntimeError("no data.tar member in the Debian package")


def extract_release_headers(data: bytes, destination: Path) -> None:
    """Unpack <top>/include/*.h from an ONNX Runtime release archive (.tgz, or .zip), or the .deb layout."""
    if data.startswith(b"!<arch>\n"):
        extract_headers(data, destination)
        return
    if data.startswith(b"PK"):
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for name in archive.namelist():
                if "/include/" in "/" + name and name.endswith(".h"):
                    _keep_header(name, destination, archive.read(name))
        return
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:  # a TarError says it is no .tgz (caught by install)
        for member in archive.getmembers():
            if member.isfile() and "/include/" in "/" + member.name and member.name.endswith(".h"):
                _keep_header(member.name, destination, archive.extractfile(member).read())


def read(location: str) -> bytes:
    """The bytes at a URL (http, https, file) or a local path."""
    if "://" not in location:
        return Path(location).expanduser().read_bytes()
    with urllib.request.urlopen(location, timeout=60) as response:
        return response.read()


def install(data: bytes, expected_sha256: str | None, extract, include_dir: Path) -> str | None:
    """Verifies and unpacks one candidate into include_dir; returns None, or why it was not usable."""
    digest = hashlib.sha256(data).hexdigest()
    if expected_sha256 and digest != expected_sha256.lower():
        return f"SHA-256 {digest} does not match the pinned {expected_sha256}"
    include_dir.parent.mkdir(parents=True, exist_ok=True)
    # Unpack next to the final place, then rename: a concurrent or interrupted build never sees a half-written
    # cache.
    with tempfile.TemporaryDirectory(dir=include_dir.parent) as staging:
        try:
            extract(data, Path(staging))
        except (RuntimeError, tarfile.TarError, zipfile.BadZipFile, OSError) as error:
            return f"cannot unpack it: {error}"
        missing = [name for name in REQUIRED if not (Path(staging) / name).is_file()]
        if missing:
            return f"it lacks {', '.join(missing)}"
        try:
            os.replace(staging, include_dir)
        except OSError:
            if not include_dir.is_dir():
                raise
        os.makedirs(staging, exist_ok=True)  # so TemporaryDirectory's cleanup succeeds
    return None


def candidates() -> list[tuple[str, str, str | None, object]]:
    """(what, location, pinned SHA-256, extract) in the order they are tried."""
    found = []
    if os.environ.get("OPBRIDGE_ORT_ARCHIVE"):
        location = os.environ["OPBRIDGE_ORT_ARCHIVE"]
        found.append(("OPBRIDGE_ORT_ARCHIVE", location, os.environ.get("OPBRIDGE_ORT_ARCHIVE_SHA256"),
                      extract_release_headers))  # fmt: skip
    for mirror in debian_mirrors():
        found.append(("Debian mirror", mirror.rstrip("/") + "/" + DEB_PATH, DEB_SHA256, extract_headers))
    release = os.environ.get("OPBRIDGE_ORT_RELEASE_URL") or RELEASE_URL
    found.append(("ONNX Runtime release archive", release, RELEASE_SHA256, extract_release_headers))
    return found


def cache_dir_for(cache: Path) -> Path:
    return cache / f"onnxruntime-{ORT_HEADERS_VERSION}" / "include"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    cache = Path(argv[0])
    # One cache entry per source kind: the Debian headers (1.21) and the release archive's (1.16) both serve.
    for include_dir in (cache_dir_for(cache), cache / f"onnxruntime-{RELEASE_VERSION}" / "include"):
        if all((include_dir / name).is_file() for name in REQUIRED):
            print(include_dir)
            return 0
    tried = (
        [] if debian_mirrors() else ["Debian mirror: none in this machine's apt sources (nor OPBRIDGE_DEBIAN_MIRROR)"]
    )
    for what, location, sha256, extract in candidates():
        include_dir = cache_dir_for(cache) if extract is extract_headers else (
            cache / ("onnxruntime-user-archive" if what == "OPBRIDGE_ORT_ARCHIVE" else f"onnxruntime-{RELEASE_VERSION}")
            / "include"
        )  # fmt: skip
        try:
            data = read(location)
        except (OSError, ValueError) as error:
            tried.append(f"{what} {location}: {error}")
            continue
        problem = install(data, sha256, extract, include_dir)
        if problem is None:
            print(include_dir)
            return 0
        tried.append(f"{what} {location}: {problem}")
    print("opbridge: could not get ONNX Runtime's headers. Tried:\n  " + "\n  ".join(tried) + f"\n{HELP}",
          file=sys.stderr)  # fmt: skip
    return 1


if __name__ == "__main__":
    sys.exit(main())
