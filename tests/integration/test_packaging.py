"""proxgpu as installed: a wheel built and installed into a directory of its own, and
``python -m proxgpu``, each run as a separate process from another directory; and the sdist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

from tests.support.tools import require_tool
from tests.support.trees import EXAMPLES, REPO

CT200 = str(EXAMPLES / "ct200")


def test_installed_wheel_works_from_any_directory(tmp_path: Path) -> None:
    """`pip install .` (not editable) must ship the gather script and the templates."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(REPO),
        ],
        check=True,
        cwd=tmp_path,
        capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [
            target / "bin" / "proxgpu",
            "plan",
            "--root",
            CT200,
            "--lxc",
            "200",
            "--vm",
            "300",
            "--json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert [g["role"] for g in document["groups"]] == ["host", "vfio"]
    assert document["changes"]["changed"], "the templates were found and rendered"
    location = subprocess.run(
        [sys.executable, "-c", "import proxgpu.templates as t; print(t.__path__[0])"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert location.startswith(str(target)), "the test must exercise the installed copy"
    # Proxmox's AGPL sources are test data, read from outside the tree: none of them, nor the
    # harness that loads them, is installed.
    assert not (target / "tests").exists() and not list(target.rglob("*.pm"))


def test_python_dash_m_runs_the_cli() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxgpu", "inspect", "--root", CT200],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0 and "ct200" in result.stdout


def test_sdist_carries_the_tests_examples_man_page_and_licence(tmp_path: Path) -> None:
    """The sdist is what distributions build and test from: the whole tests/ tree with the
    example hosts and the documentation (docs/) it reads, the man page, the licence (declared as
    SPDX) and the changelog."""
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(tmp_path), "."],
        check=True,
        cwd=REPO,
        capture_output=True,
        timeout=600,
    )
    (sdist,) = tmp_path.glob("proxgpu-*.tar.gz")
    with tarfile.open(sdist) as archive:
        top = sdist.name.removesuffix(".tar.gz")
        names = {m.name.removeprefix(top + "/") for m in archive.getmembers() if m.isfile()}
        links = {
            m.name.removeprefix(top + "/"): m.linkname for m in archive.getmembers() if m.issym()
        }
        info = archive.extractfile(f"{top}/PKG-INFO")
        assert info is not None
        metadata = info.read().decode()

    def walk(under: str) -> list[Path]:
        # Not into linked directories: sysfs's bus/pci/devices links to the devices' own tree.
        return [
            Path(where, name)
            for where, dirs, names in os.walk(REPO / under)
            if "__pycache__" not in Path(where).parts
            for name in dirs + names
        ]

    def files(under: str) -> set[str]:
        return {
            p.relative_to(REPO).as_posix()
            for p in walk(under)
            if p.is_file() and not p.is_symlink() and not p.name.endswith(".pyc")
        }

    missing = (files("tests") | files("examples/hosts") | files("docs")) - names
    assert not missing, sorted(missing)[:10]
    # sysfs's driver and iommu_group links: without them the example GPUs have no driver.
    on_disk = {
        p.relative_to(REPO).as_posix(): os.readlink(p)
        for under in ("tests", "examples")
        for p in walk(under)
        if p.is_symlink()
    }
    assert on_disk and links == on_disk
    shipped = {"LICENSE", "CHANGELOG.md", "man/proxgpu.1", "proxgpu/ansible/proxgpu_split.py"}
    assert shipped <= names
    assert "License-Expression: MIT" in metadata and "License-File: LICENSE" in metadata
    # The changelog's link references point into this repository (tests/unit/test_changelog.py).
    urls = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]
    assert f"Project-URL: Source, {urls['Source']}" in metadata
    assert not any(n.endswith(".pyc") for n in names)
    # The harness is the project's own; Proxmox's sources stay in their cache or offline copy.
    harness = "tests/proxmox/harness/"
    assert {"tests/proxmox/sources.toml", harness + "pve-check"} <= names
    perl = [n for n in names if n.startswith("tests/") and n.endswith(".pm")]
    assert perl and all(n.startswith(harness + "lib/ProxgpuCheck/") for n in perl)
    assert not any("/src/PVE/" in n or "/src/test/" in n for n in names)

    # Unpacked, it inspects as the checkout does (drivers read through the links), and builds.
    with tarfile.open(sdist) as archive:
        # Extraction filters came with Python 3.11.4; Debian 12's 3.11.2 predates them.
        if hasattr(tarfile, "tar_filter"):
            archive.extractall(tmp_path / "unpacked", filter="tar")
        else:
            archive.extractall(tmp_path / "unpacked")
    unpacked = tmp_path / "unpacked" / top
    assert inspect_json(unpacked / "examples/hosts/ct200") == inspect_json(EXAMPLES / "ct200")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "wheel"),
            str(unpacked),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    assert list((tmp_path / "wheel").glob("proxgpu-*.whl"))


def inspect_json(root: Path) -> dict[str, object]:
    """``proxgpu inspect --json`` of a tree, without the field naming where it was read."""
    done = subprocess.run(
        [sys.executable, "-m", "proxgpu", "inspect", "--root", str(root), "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    document: dict[str, object] = json.loads(done.stdout)
    document.pop("source", None)
    return document


def test_the_wheel_installs_the_man_page_where_man_finds_it(tmp_path: Path) -> None:
    """`man proxgpu` after `pip install`: the wheel carries share/man/man1/proxgpu.1, and man-db
    finds it beside the installed bin/ on PATH, with no MANPATH."""
    man = require_tool("man", "man-db")
    wheels, prefix = tmp_path / "wheels", tmp_path / "prefix"
    pip = [sys.executable, "-m", "pip", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)]
    subprocess.run(build, check=True, cwd=tmp_path, capture_output=True)
    (wheel,) = wheels.glob("proxgpu-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        inside = [n for n in archive.namelist() if n.endswith("share/man/man1/proxgpu.1")]
        assert inside and archive.read(inside[0]).decode() == (REPO / "man/proxgpu.1").read_text()
    # --target, not --prefix: pip would uninstall the proxgpu of the environment running it.
    install = [*pip, "install", "--no-deps", "--target", str(prefix), str(wheel)]
    subprocess.run(install, check=True, cwd=tmp_path, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k != "MANPATH"}
    env |= {"PATH": f"{prefix / 'bin'}:/usr/bin:/bin", "MANPAGER": "cat", "MANWIDTH": "100"}
    found = subprocess.run(
        [man, "-w", "proxgpu"], env=env, capture_output=True, text=True, check=False
    )
    assert found.stdout.strip() == str(prefix / "share/man/man1/proxgpu.1"), found.stderr
    shown = subprocess.run([man, "proxgpu"], env=env, capture_output=True, text=True, check=True)
    for section in ("EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES"):
        assert f"\n{section}\n" in shown.stdout, section
