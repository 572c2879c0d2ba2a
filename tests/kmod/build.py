"""Build the kmod releases the tests run, exactly as ``tests/kmod/versions.toml`` pins them.

``python3 -m tests.kmod.build`` (from the repository's root; standard library, a C toolchain,
autotools and meson) downloads each release's Debian source tarball, checks its sha256, builds
only the ``kmod`` tool and writes it, with ``depmod`` and ``modprobe`` as links to it, to the
cache (``$XDG_CACHE_HOME/proxgpu/kmod/VERSION/bin``, see :func:`tests.kmod.builds.cache_dir`) or
to ``--dest DIR``: the layout ``PROXGPU_KMOD_BUILDS`` takes. A release already built there is not
built again; a build is moved into place only once complete, so an interrupted one leaves none.

>>> main(["--help"])  # doctest: +ELLIPSIS
usage: python3 -m tests.kmod.build ...
0
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from tests.kmod.builds import ENV, MANIFEST, TOOLS, Release, cache_dir, load_manifest, missing
from tests.support.pinned import last_line

#: Seconds the download may take (a tarball is about 250 KB), and one build step.
DOWNLOAD_TIMEOUT = 120
STEP_TIMEOUT = 1800
#: What each build system needs, as Debian names the packages.
PACKAGES = {"autotools": "gcc make autoconf automake libtool", "meson": "gcc meson ninja-build"}
# Only what the tests need: no compressed modules, no signatures, no documentation, nothing
# installed; what is left needs nothing but libc. Debian's prefix and sysconfdir, which name the
# config directories kmod reads by default (/etc/modprobe.d, /usr/lib/modprobe.d), as its own.
DEBIAN_DIRS = ["--prefix=/usr", "--sysconfdir=/etc"]
CONFIGURE = [
    *DEBIAN_DIRS,
    "--disable-manpages",
    "--disable-test-modules",
    *(f"--without-{library}" for library in ("zstd", "xz", "zlib", "openssl")),
]
MESON = [
    *DEBIAN_DIRS,
    "-Dmanpages=false",
    *(f"-D{library}=disabled" for library in ("zstd", "xz", "zlib", "openssl")),
    *(f"-D{shell}completiondir=no" for shell in ("bash", "fish", "zsh")),
]


class BuildError(Exception):
    """A release could not be built; the message is one line naming it and what to do."""


def _run(command: list[str], cwd: Path, release: Release) -> None:
    program = shutil.which(command[0])
    if program is None:
        raise BuildError(
            f"{command[0]} not found, which {release} needs: "
            f"apt-get install {PACKAGES[release.build]}, or set {ENV}=DIR"
        )
    try:
        result = subprocess.run(
            [program, *command[1:]],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as timeout:
        raise BuildError(f"{release}: {command[0]} took over {STEP_TIMEOUT} s") from timeout
    if result.returncode != 0:
        said = last_line(result.stderr or result.stdout)
        raise BuildError(f"{release}: {' '.join(command)} failed in {cwd}: {said}")


def download(release: Release, target: Path) -> None:
    """Write ``release``'s tarball to ``target``; :class:`BuildError` unless its sha256 is the
    pinned one."""
    digest = hashlib.sha256()
    try:
        with (
            urllib.request.urlopen(release.url, timeout=DOWNLOAD_TIMEOUT) as answer,
            target.open("wb") as out,
        ):
            while chunk := answer.read(1 << 16):
                digest.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError) as error:
        raise BuildError(
            f"cannot download {release.url} ({error}): check the network, or set {ENV}=DIR"
        ) from error
    if digest.hexdigest() != release.sha256:
        raise BuildError(
            f"{release.url} has sha256 {digest.hexdigest()}, not the pinned {release.sha256}"
            f" ({MANIFEST.name}): it is not the release the tests pin"
        )


def unpack(tarball: Path, into: Path) -> Path:
    """Extract ``tarball`` (its names kept inside ``into``) and return its one top folder."""
    with tarfile.open(tarball) as archive:
        # Checked here, not only by the data filter: Python before 3.11.4 has none (Debian 12's
        # python3, which .ci/run builds with, is 3.11.2).
        _inside(archive, into)
        if hasattr(tarfile, "data_filter"):
            archive.extractall(into, filter="data")
        else:
            archive.extractall(into)
    (top,) = [path for path in into.iterdir() if path.is_dir()]
    return top


def _inside(archive: tarfile.TarFile, into: Path) -> None:
    """Refuse a member named, or linking, outside ``into``, and any device or FIFO."""
    root = into.resolve()
    for member in archive.getmembers():
        where = (root / member.name).resolve()
        target = (where.parent / member.linkname).resolve() if member.issym() else where
        if member.islnk():
            target = (root / member.linkname).resolve()
        if not (where.is_relative_to(root) and target.is_relative_to(root)) or member.isdev():
            raise BuildError(
                f"{member.name} in the tarball is a device or reaches outside {into}: not unpacked"
            )


def compile_autotools(release: Release, source: Path, jobs: int) -> Path:
    """Build the ``kmod`` tool in ``source`` with autotools; the binary."""
    # configure.ac includes gtk-doc's makefile, which gtkdocize would copy in: the docs are off,
    # so an empty one does (as kmod's own autogen.sh does without gtk-doc).
    (source / "libkmod/docs/gtk-doc.make").touch()
    _run(["autoreconf", "--force", "--install"], source, release)
    _run(["sh", "./configure", *CONFIGURE], source, release)
    _run(["make", f"-j{jobs}", "tools/kmod"], source, release)
    return source / "tools/kmod"


def compile_meson(release: Release, source: Path, jobs: int) -> Path:
    """Build the ``kmod`` tool in ``source`` with meson; the binary."""
    _run(["meson", "setup", "build", *MESON], source, release)
    _run(["ninja", f"-j{jobs}", "-C", "build", "kmod"], source, release)
    return source / "build/kmod"


COMPILERS = {"autotools": compile_autotools, "meson": compile_meson}


def install(binary: Path, tools: Path) -> None:
    """``tools/kmod`` a copy of ``binary``, and its other names links to it."""
    tools.mkdir(parents=True)
    shutil.copy2(binary, tools / "kmod")
    for name in TOOLS[1:]:
        (tools / name).symlink_to("kmod")


def build_release(release: Release, destination: Path, jobs: int) -> bool:
    """Make ``destination/VERSION/bin`` a build of ``release``; False when it already was.

    Raises :class:`BuildError`.
    """
    if not missing(destination, release):
        return False
    compile_ = COMPILERS.get(release.build)
    if compile_ is None:
        raise BuildError(f"{release}: unknown build {release.build!r} in {MANIFEST.name}")
    destination.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{release.version}-", dir=destination) as work:
        tarball = Path(work) / Path(release.url).name
        download(release, tarball)
        source = unpack(tarball, Path(work) / "src")
        done = Path(work) / "done"
        install(compile_(release, source, jobs), done / "bin")
        target = destination / release.version
        if target.exists():
            target.rename(Path(work) / "old")
        done.rename(target)
    return True


def build(releases: Sequence[Release], destination: Path, jobs: int) -> list[str]:
    """Build every release (see :func:`build_release`); one report line each, with its time."""
    reports = []
    for release in releases:
        started = time.monotonic()
        built = build_release(release, destination, jobs)
        state = f"built in {time.monotonic() - started:.0f} s" if built else "already built"
        reports.append(f"{release}: {state}")
    return reports


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m tests.kmod.build",
        description="Build the kmod releases pinned in tests/kmod/versions.toml.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--dest", type=Path, default=cache_dir(), help="the folder to fill (default: %(default)s)"
    )
    parser.add_argument(
        "--jobs", type=int, default=2, help="parallel compile jobs (default: %(default)s)"
    )
    parser.add_argument("--manifest", type=Path, default=MANIFEST, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: 0 when every release is built, 1 (one line on stderr) when not."""
    try:
        options = _parser().parse_args(argv)
    except SystemExit as done:
        return int(done.code or 0)
    try:
        for line in build(load_manifest(options.manifest), options.dest, options.jobs):
            print(line, flush=True)
    except BuildError as error:
        print(f"tests.kmod.build: {error}", file=sys.stderr)
        return 1
    print(f"{options.dest}: ready for the tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
