"""Reading the gather script's output (proxgpu.inspection.capture), with no host involved."""

from __future__ import annotations

from proxgpu.inspection.capture import parse_gather_output


def test_unreadable_files_are_reported_not_captured() -> None:
    capture = parse_gather_output(
        b"#proxgpu-gather\t1\n#uid\t1000\n#section\traw\netc/pve/lxc/100.conf\0!unreadable\n#end\n"
    )
    assert capture.unreadable == ["/etc/pve/lxc/100.conf"]
    assert capture.raw == {}
    assert capture.uid == 1000
