"""cmake/fetch_ort_headers.py: where the build gets ONNX Runtime's headers on a machine without them, tested
offline with archives built here (the layouts of ONNX Runtime's release archive, a .zip, and Debian's .deb)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import pathlib
import tarfile
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADERS = ("onnxruntime_c_api.h", "onnxruntime_cxx_api.h", "onnxruntime_lite_custom_op.h", "onnxruntime_float16.h")


@pytest.fixture
def fetch(monkeypatch):
    spec = importlib.util.spec_from_file_location("fetch_ort_headers", ROOT / "cmake" / "fetch_ort_headers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "debian_mirrors", lambda: [])  # a machine without Debian sources
    for name in ("OPBRIDGE_ORT_ARCHIVE", "OPBRIDGE_ORT_ARCHIVE_SHA256", "OPBRIDGE_ORT_RELEASE_URL"):
        monkeypatch.delenv(name, raising=False)
    return module


def _tgz(top="onnxruntime-linux-x64-1.16.3", headers=HEADERS) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name in [*(f"include/{h}" for h in headers), "lib/libonnxruntime.so.1.16.3", "README.md"]:
            data = f"// {name}\n".encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for header in HEADERS:
            archive.writestr(f"onnxruntime-win-x64-1.16.3/include/{header}", f"// {header}\n")
    return buffer.getvalue()


def _deb() -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as archive:
        for header in HEADERS:
            body = f"// {header}\n".encode()
            info = tarfile.TarInfo(f"./usr/include/onnxruntime/{header}")
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    members = [(b"debian-binary", b"2.0\n"), (b"data.tar.xz", data.getvalue())]
    out = b"!<arch>\n"
    for name, body in members:
        out += name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6) + b"100644".ljust(8)
        out += str(len(body)).encode().ljust(10) + b"`\n" + body + (b"\n" if len(body) % 2 else b"")
    return out


@pytest.mark.parametrize("kind", ["tgz", "zip", "deb"])
def test_a_given_archive_is_verified_and_unpacked(fetch, tmp_path, monkeypatch, capsys, kind):
    archive = tmp_path / f"ort.{kind}"
    archive.write_bytes({"tgz": _tgz, "zip": _zip, "deb": _deb}[kind]())
    monkeypatch.setenv("OPBRIDGE_ORT_ARCHIVE", str(archive))
    monkeypatch.setenv("OPBRIDGE_ORT_ARCHIVE_SHA256", hashlib.sha256(archive.read_bytes()).hexdigest())
    monkeypatch.setenv("OPBRIDGE_ORT_RELEASE_URL", str(tmp_path / "absent.tgz"))
    assert fetch.main([str(tmp_path / "cache")]) == 0
    include = pathlib.Path(capsys.readouterr().out.strip())
    assert sorted(p.name for p in include.iterdir()) == sorted(HEADERS)  # headers only, flattened
    assert "onnxruntime_c_api.h" in (include / "onnxruntime_c_api.h").read_text()  # the file's own content


def test_the_release_archive_is_the_fallback_without_debian_sources_and_is_pinned(fetch, tmp_path, monkeypatch, capsys):
    """No Debian mirror: the release archive is fetched (here from a local copy) and must match the pinned
    SHA-256; a different file is refused."""
    release = tmp_path / "onnxruntime-linux-x64-1.16.3.tgz"
    release.write_bytes(_tgz())
    monkeypatch.setenv("OPBRIDGE_ORT_RELEASE_URL", release.as_uri())
    assert fetch.main([str(tmp_path / "cache")]) == 1  # our archive is not the pinned one
    error = capsys.readouterr().err
    assert f"does not match the pinned {fetch.RELEASE_SHA256}" in error
    monkeypatch.setattr(fetch, "RELEASE_SHA256", hashlib.sha256(release.read_bytes()).hexdigest())
    assert fetch.main([str(tmp_path / "cache")]) == 0
    include = pathlib.Path(capsys.readouterr().out.strip())
    assert include.name == "include" and (include / "onnxruntime_lite_custom_op.h").is_file()
    assert fetch.main([str(tmp_path / "cache")]) == 0  # from the cache now, without fetching
    monkeypatch.setenv("OPBRIDGE_ORT_RELEASE_URL", str(tmp_path / "gone.tgz"))
    assert fetch.main([str(tmp_path / "cache")]) == 0


def test_the_error_names_every_way_tried_and_how_to_give_the_headers(fetch, tmp_path, monkeypatch, capsys):
    incomplete = tmp_path / "incomplete.tgz"
    incomplete.write_bytes(_tgz(headers=("onnxruntime_c_api.h",)))
    monkeypatch.setenv("OPBRIDGE_ORT_ARCHIVE", str(incomplete))
    monkeypatch.setenv("OPBRIDGE_ORT_RELEASE_URL", str(tmp_path / "absent.tgz"))
    assert fetch.main([str(tmp_path / "cache")]) == 1
    error = capsys.readouterr().err
    assert "it lacks onnxruntime_cxx_api.h, onnxruntime_lite_custom_op.h" in error
    assert "Debian mirror: none in this machine's apt sources" in error
    assert "ONNX Runtime release archive" in error and "absent.tgz" in error
    for way in (
        "OPBRIDGE_ORT_INCLUDE_DIR",
        "OPBRIDGE_ORT_ARCHIVE",
        "OPBRIDGE_DEBIAN_MIRROR",
        "OPBRIDGE_ORT_RELEASE_URL",
    ):
        assert way in error
    not_an_archive = tmp_path / "page.html"
    not_an_archive.write_text("<html>rate limited</html>")
    monkeypatch.setenv("OPBRIDGE_ORT_ARCHIVE", str(not_an_archive))
    assert fetch.main([str(tmp_path / "cache")]) == 1
    assert "cannot unpack it" in capsys.readouterr().err


def test_the_release_pin_names_an_official_archive(fetch):
    assert fetch.RELEASE_URL.endswith(f"/v{fetch.RELEASE_VERSION}/onnxruntime-linux-x64-{fetch.RELEASE_VERSION}.tgz")
    assert len(fetch.RELEASE_SHA256) == 64 and int(fetch.RELEASE_SHA256, 16) >= 0
