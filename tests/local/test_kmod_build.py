"""Building and finding the pinned kmod releases (tests/kmod), without the network: each test
serves its tarball by a ``file://`` URL, as Debian's archive serves the real ones over HTTP. The
real builds are checked where they are used: each binding test's kmod says its version."""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from tests.kmod.build import BuildError, build_release, download, main
from tests.kmod.builds import (
    ENV,
    TOOLS,
    KmodUnavailableError,
    Release,
    cache_dir,
    load_manifest,
    locate,
)


def _tarball(path: Path, name: str = "kmod-0/README") -> bytes:
    """A small ``.tar.xz`` holding one file ``name``, written to ``path``; its bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as archive:
        member = tarfile.TarInfo(name)
        member.size = 5
        archive.addfile(member, io.BytesIO(b"kmod\n"))
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def _release(url: str, sha256: str) -> Release:
    return replace(load_manifest()[-1], version="0", url=url, sha256=sha256)


def _built(directory: Path, release: Release) -> Path:
    """``directory`` laid out as a finished build of ``release``: its ``bin`` folder."""
    tools = directory / release.version / "bin"
    tools.mkdir(parents=True)
    for name in TOOLS:
        (tools / name).write_text("#!/bin/sh\n")
        (tools / name).chmod(0o755)
    return tools


def test_a_pinned_tarball_naming_a_file_outside_its_folder_is_not_unpacked(tmp_path: Path) -> None:
    # Whether or not this Python has tarfile's extraction filters (3.11.4 and later).
    served = tmp_path / "kmod_0.orig.tar.xz"
    release = _release(served.as_uri(), hashlib.sha256(_tarball(served, "../evil")).hexdigest())
    with pytest.raises(BuildError, match=r"\.\./evil in the tarball .* not unpacked"):
        build_release(release, tmp_path / "cache", jobs=1)
    assert not list(tmp_path.rglob("evil"))


def test_a_tarball_that_is_not_the_pinned_one_is_refused(tmp_path: Path) -> None:
    served = tmp_path / "kmod_0.orig.tar.xz"
    _tarball(served)
    release = _release(served.as_uri(), "0" * 64)
    with pytest.raises(BuildError, match=r"not the pinned 0{64}") as refused:
        build_release(release, tmp_path / "cache", jobs=1)
    assert hashlib.sha256(served.read_bytes()).hexdigest() in str(refused.value)
    assert list((tmp_path / "cache").iterdir()) == []


def test_the_pinned_tarball_is_downloaded_whole(tmp_path: Path) -> None:
    served = tmp_path / "kmod_0.orig.tar.xz"
    body = _tarball(served)
    target = tmp_path / "got.tar.xz"
    download(_release(served.as_uri(), hashlib.sha256(body).hexdigest()), target)
    assert target.read_bytes() == body


def test_a_finished_build_is_kept_and_found(tmp_path: Path) -> None:
    release = _release((tmp_path / "absent.tar.xz").as_uri(), "0" * 64)
    tools = _built(tmp_path / "builds", release)
    assert build_release(release, tmp_path / "builds", jobs=1) is False
    assert locate(release, {ENV: str(tmp_path / "builds")}) == tools
    xdg = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    cached = _built(cache_dir(xdg), release)
    assert locate(release, {**xdg, ENV: ""}) == cached


def test_a_build_missing_a_name_is_not_found_and_says_the_two_ways(tmp_path: Path) -> None:
    release = _release("file:///absent", "0" * 64)
    (_built(tmp_path, release) / "modprobe").unlink()
    with pytest.raises(KmodUnavailableError) as missing:
        locate(release, {ENV: str(tmp_path)})
    said = str(missing.value)
    assert "\n" not in said and "/0/bin/modprobe is missing" in said
    assert "python3 -m tests.kmod.build" in said and f"{ENV}=DIR" in said


def test_the_command_fails_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "versions.toml"
    manifest.write_text(
        '[[kmod]]\nversion = "0"\ndebian = "0"\nproxmox = "0"\nbuild = "meson"\n'
        f'url = "{(tmp_path / "absent.tar.xz").as_uri()}"\nsha256 = "{"0" * 64}"\n'
    )
    assert main(["--dest", str(tmp_path / "cache"), "--manifest", str(manifest)]) == 1
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "cannot download" in said and ENV in said
