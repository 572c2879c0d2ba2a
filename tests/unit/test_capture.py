"""Reading the gather script's output (proxgpu.inspection.capture), with no host involved."""

from __future__ import annotations

import base64
import io
import tarfile

from proxgpu.inspection.capture import parse_gather_output


def test_unreadable_files_are_reported_not_captured() -> None:
    capture = parse_gather_output(
        b"#proxgpu-gather\t1\n#uid\t1000\n#section\traw\netc/pve/lxc/100.conf\0!unreadable\n#end\n"
    )
    assert capture.unreadable == ["/etc/pve/lxc/100.conf"]
    assert capture.raw == {}
    assert capture.uid == 1000


def _archive(*members: tuple[str, bytes | None]) -> bytes:
    """A tar of regular files (name, bytes) and symlinks (name, None), as GNU tar makes one."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            member = tarfile.TarInfo(name)
            if data is None:
                member.type, member.linkname = tarfile.SYMTYPE, "/etc/shadow"
                tar.addfile(member)
            else:
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def _raw_section(wanted: dict[str, str], archives: bytes) -> bytes:
    lines = b"".join(f"{path}\0@{member}\n".encode() for path, member in wanted.items())
    return b"#section\traw\n" + lines + b"#archive\t" + base64.b64encode(archives) + b"\n#end\n"


def test_archived_files_are_read_from_every_archive_and_a_link_archived_is_unreadable() -> None:
    wanted = {
        "etc/pve/lxc/200.conf": "1/200.conf",
        "etc/pve/lxc/201.conf": "1/201.conf",
        "etc/modprobe.d/vfio.conf": "2/vfio.conf",
        "etc/modprobe.d/gone.conf": "2/gone.conf",
    }
    first = _archive(("1/200.conf", b"cores: 8\n"), ("1/201.conf", None))
    second = _archive(("2/vfio.conf", b"options vfio-pci ids=10de:2bb5\n"))
    capture = parse_gather_output(_raw_section(wanted, first + second))
    assert capture.raw == {
        "/etc/pve/lxc/200.conf": b"cores: 8\n",
        "/etc/modprobe.d/vfio.conf": b"options vfio-pci ids=10de:2bb5\n",
    }
    assert sorted(capture.unreadable) == ["/etc/modprobe.d/gone.conf", "/etc/pve/lxc/201.conf"]


def test_a_damaged_archive_keeps_what_came_before_and_leaves_the_rest_unreadable() -> None:
    wanted = {"etc/a.conf": "1/a.conf", "etc/b.conf": "2/b.conf"}
    first = _archive(("1/a.conf", b"a\n"))
    whole = first + _archive(("2/b.conf", b"b" * 2000))
    # Cut in b.conf's bytes, after its header (512 bytes).
    capture = parse_gather_output(_raw_section(wanted, whole[: len(first) + 1500]))
    assert capture.raw == {"/etc/a.conf": b"a\n"}
    assert capture.unreadable == ["/etc/b.conf"]
    garbled = parse_gather_output(
        _raw_section(wanted, whole).replace(b"#archive\t", b"#archive\t!")
    )
    assert (garbled.raw, sorted(garbled.unreadable)) == ({}, ["/etc/a.conf", "/etc/b.conf"])
