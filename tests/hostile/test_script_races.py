"""The host scripts leave no window between a look and the act it allows (issue 21, point 2):
a temp file's mode and owner are set through the descriptor that made it, not through a name
that may have been swapped since, and the gather step reads no file through a link out of the
root even for the moment before the link check looks.

Each case runs the real scripts (the prelude's ``put_tmp``, ``gather.sh``) with ``sh`` on a tree
in the scratch folder, makes the swap an attacker would (deterministically, from inside the
command being written, or beforehand for the gather), and asserts the exact outcome and that
nothing outside the scratch folder changed: no byte, no mode.
"""

from __future__ import annotations

import base64
import os
import shutil
from importlib import resources
from pathlib import Path

import pytest

from proxgpu.host import DirectoryHost, LocalHost
from proxgpu.host.scripts import run_script
from proxgpu.inspection.archived import ARCHIVE_MARKER
from proxgpu.inspection.capture import Capture, parse_gather_output
from tests.support.hostile import scene

SECRET = b"root:$6$outside-the-tree-hash:19000::::::\n"


def put_tmp(tmp: Path, mode: str, command: str, *args: str) -> int:
    """Run the prelude's ``put_tmp TMP MODE 077 - sh -c COMMAND sh ARGS...``: its exit status."""
    prelude = resources.files("proxgpu").joinpath("scripts", "prelude.sh").read_text()
    script = f'{prelude}\nt=$1 m=$2 c=$3\nshift 3\nput_tmp "$t" "$m" 077 - sh -c "$c" sh "$@"'
    done = LocalHost().run(["sh", "-c", script, "sh", str(tmp), mode, command, *args])
    return done.returncode


@pytest.mark.parametrize("swap", ["ln", "ln -s"], ids=["hard-link", "symlink"])
def test_a_temp_file_swapped_while_written_is_refused_and_the_file_swapped_in_keeps_its_mode(
    tmp_path: Path, swap: str
) -> None:
    """The command that fills the temp file replaces its name with a link to a file outside,
    as someone who can write the directory could between the write and the chmod."""
    hostile = scene(tmp_path)
    victim = hostile.victim("shadow", SECRET, mode=0o600)
    tmp = hostile.tree / "etc" / ".modules.proxgpu-tmp"
    command = f'printf new; rm -f -- "$1"; {swap} -- "$2" "$1"'
    assert put_tmp(tmp, "644", command, str(tmp), str(victim)) == 1
    assert victim.read_bytes() == SECRET
    assert victim.stat().st_mode & 0o777 == 0o600
    hostile.assert_outside_unchanged()


def test_a_temp_file_left_alone_gets_its_bytes_and_mode(tmp_path: Path) -> None:
    hostile = scene(tmp_path)
    tmp = hostile.tree / "etc" / ".modules.proxgpu-tmp"
    assert put_tmp(tmp, "640", "printf new") == 0
    assert (tmp.read_bytes(), tmp.stat().st_mode & 0o777) == (b"new", 0o640)
    hostile.assert_outside_unchanged()


def _gathered(tree: Path) -> tuple[bytes, Capture]:
    """Everything the gather step sent for ``tree``, before any check of where files are (its
    output with the archives of config files decoded), and that output parsed."""
    out = run_script(DirectoryHost(str(tree)), "gather", str(tree)).stdout
    sent = b"\n".join(
        base64.b64decode(line.removeprefix(ARCHIVE_MARKER))
        if line.startswith(ARCHIVE_MARKER)
        else line
        for line in out.split(b"\n")
    )
    return sent, parse_gather_output(out)


def test_gather_never_reads_a_file_linked_out_of_the_tree(tmp_path: Path) -> None:
    hostile = scene(tmp_path)
    victim = hostile.victim("shadow.conf", SECRET)
    modprobe = hostile.tree / "etc" / "modprobe.d"
    modprobe.mkdir(parents=True, exist_ok=True)
    (modprobe / "evil.conf").symlink_to(victim)
    (hostile.tree / "etc" / "inside.conf").write_bytes(b"options kvm ignore_msrs=1\n")
    (modprobe / "kvm.conf").symlink_to("../inside.conf")
    sent, capture = _gathered(hostile.tree)
    assert b"outside-the-tree" not in sent
    assert "/etc/modprobe.d/evil.conf" in capture.unreadable
    inside = b"options kvm ignore_msrs=1\n"
    assert capture.raw["/etc/modprobe.d/kvm.conf"] == inside, "a link inside the tree is read"
    hostile.assert_outside_unchanged()


def test_gather_never_reads_a_config_swapped_for_a_link_out_after_its_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap comes between the script's look at the file and its reading: a ``tar`` first on
    PATH makes it, then runs the real one."""
    hostile = scene(tmp_path)
    victim = hostile.victim("shadow.conf", SECRET)
    modprobe = hostile.tree / "etc" / "modprobe.d"
    modprobe.mkdir(parents=True, exist_ok=True)
    (modprobe / "kvm.conf").write_bytes(b"options kvm ignore_msrs=1\n")
    (modprobe / "vfio.conf").write_bytes(b"options vfio-pci ids=10de:2bb5\n")
    swapping = hostile.scratch / "bin"
    swapping.mkdir()
    real_tar = shutil.which("tar")
    (swapping / "tar").write_text(
        f'#!/bin/sh\nln -sf {victim} {modprobe}/kvm.conf\nexec {real_tar} "$@"\n'
    )
    (swapping / "tar").chmod(0o755)
    monkeypatch.setenv("PATH", f"{swapping}:{os.environ['PATH']}")
    sent, capture = _gathered(hostile.tree)
    assert (modprobe / "kvm.conf").is_symlink(), "the swap was made"
    assert b"outside-the-tree" not in sent
    assert "/etc/modprobe.d/kvm.conf" in capture.unreadable
    assert capture.raw["/etc/modprobe.d/vfio.conf"] == b"options vfio-pci ids=10de:2bb5\n"
    hostile.assert_outside_unchanged()


def test_gather_never_reads_a_directory_swapped_for_a_link_out_after_it_was_entered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory itself is moved aside and a link out of the tree put in its place, between
    the script's entering it and tar's reading: tar reads the directory that was entered."""
    hostile = scene(tmp_path)
    outside = hostile.victim("kvm.conf", SECRET).parent
    modprobe = hostile.tree / "etc" / "modprobe.d"
    modprobe.mkdir(parents=True, exist_ok=True)
    (modprobe / "kvm.conf").write_bytes(b"options kvm ignore_msrs=1\n")
    swapping = hostile.scratch / "bin"
    swapping.mkdir()
    aside = hostile.tree / "etc" / "moved-aside"
    (swapping / "tar").write_text(
        f"#!/bin/sh\nmv {modprobe} {aside} && ln -s {outside} {modprobe}\n"
        f'exec {shutil.which("tar")} "$@"\n'
    )
    (swapping / "tar").chmod(0o755)
    monkeypatch.setenv("PATH", f"{swapping}:{os.environ['PATH']}")
    sent, capture = _gathered(hostile.tree)
    assert modprobe.is_symlink(), "the swap was made"
    assert b"outside-the-tree" not in sent
    assert capture.raw["/etc/modprobe.d/kvm.conf"] == b"options kvm ignore_msrs=1\n"
    hostile.assert_outside_unchanged()


def test_gather_never_reads_through_a_directory_linked_out_of_the_tree(tmp_path: Path) -> None:
    hostile = scene(tmp_path)
    target = hostile.link_out("etc/pve/qemu-server")
    (target / "300.conf").write_bytes(SECRET)
    hostile.settle()
    sent, _ = _gathered(hostile.tree)
    assert b"outside-the-tree" not in sent
    hostile.assert_outside_unchanged()
