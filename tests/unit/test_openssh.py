"""What the OpenSSH transport reads from ssh_config, a master that does not answer or answers
what the protocol never does, and a command's input bounded by its deadline."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from proxgpu.host import openssh
from proxgpu.host.local import run_bounded
from proxgpu.host.sshclient import why_openssh
from proxgpu.host.sshcommon import known_hosts_files
from proxgpu.host.sshmaster import find_master, master_alive, run_session


def test_quoted_known_hosts_names_stay_whole() -> None:
    config = {"userknownhostsfile": ["'/k h/known' ~/k2"], "globalknownhostsfile": ["none"]}
    assert known_hosts_files(config) == ["/k h/known", str(Path("~/k2").expanduser())]


def test_a_master_that_does_not_answer_or_is_not_there_is_no_master(tmp_path: Path) -> None:
    # A real socket that takes the connection and never answers: a master stuck or ending.
    control = tmp_path / "control"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.bind(str(control))
        silent.listen()
        started = time.monotonic()
        assert master_alive(str(control), timeout=0.5) is False
        assert time.monotonic() - started < 2
    assert master_alive(str(tmp_path / "nothing"), timeout=0.5) is False


@pytest.mark.parametrize("value", ["none", "NONE"])
def test_none_names_no_known_hosts_file(value: str) -> None:
    assert known_hosts_files({"globalknownhostsfile": [value], "userknownhostsfile": []}) == []


def test_input_a_command_stops_reading_midway_does_not_hold_it_past_the_deadline() -> None:
    # A real local reader standing in for the remote command: it takes a few KiB, then reads
    # no more, so the pipe is left with less room than one write (what ssh's pipe is left
    # with when the remote stops reading).
    reader = ("sh", "-c", "head -c 5000 >/dev/null; exec sleep 8")
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        run_bounded(reader, b"x" * 5_000_000, started + 1, 1 << 20)
    assert time.monotonic() - started < 3


@pytest.mark.skipif(openssh.ssh_binary() is None, reason="needs OpenSSH's ssh for ssh -G")
def test_an_identity_file_with_a_blank_set_only_in_ssh_config_stays_whole(tmp_path: Path) -> None:
    # ssh -G prints IdentityFile one file a line, unquoted (readconf.c's dump_cfg_strarray):
    # the line is the name. Its -cert.pub beside it is found only under the whole name.
    keys = tmp_path / "my keys"
    keys.mkdir()
    (keys / "id").write_text("")
    (keys / "id-cert.pub").write_text("")
    config = tmp_path / "ssh_config"
    text = f'Host pve1\n  IdentityFile "{keys}/id"\n  IdentityFile /elsewhere/id2\n'
    config.write_text(text)
    resolved = openssh.resolved_config(["ssh", "-F", str(config), "pve1"], "pve1")
    assert resolved["identityfile"][:2] == [f"{keys}/id", "/elsewhere/id2"]
    reason = why_openssh(resolved, "pve1", text)
    assert reason == "a user certificate (IdentityFile's -cert.pub)"


def _serve_once(control: Path, answers: list[bytes]) -> threading.Thread:
    """A stand-in master on a real socket (no OpenSSH master answers malformed): it greets as
    the mux protocol's version 4 does, then sends ``answers`` whatever it is asked."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(control))
    server.listen()

    def serve() -> None:
        with server, server.accept()[0] as peer:
            peer.sendall(struct.pack(">III", 8, 1, 4))  # MUX_MSG_HELLO, version 4
            peer.settimeout(5)
            with contextlib.suppress(OSError):
                peer.recv(65536)
            for answer in answers:
                peer.sendall(answer)
            with contextlib.suppress(OSError):
                while peer.recv(65536):
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    "answer",
    [
        struct.pack(">I", 1 << 31),  # a length of 2 GiB: never allocated
        struct.pack(">I", 2) + b"\0\0",  # too short for a message type
        struct.pack(">III", 8, 0x80000006, 1),  # "session opened" without its id
    ],
    ids=["huge", "short", "no-session-id"],
)
def test_a_malformed_answer_on_the_control_socket_runs_nothing_and_connects_nowhere(
    tmp_path: Path, answer: bytes
) -> None:
    """Whatever answers on the control socket, ssh runs no command, makes no connection of its
    own (its fallback's ProxyCommand fails at once), and the session says it never opened."""
    control = tmp_path / "control"
    served = _serve_once(control, [answer])
    marker = tmp_path / "ran"
    session = run_session(
        str(control),
        f"touch {marker}",
        stdin=None,
        deadline=time.monotonic() + 10,
        max_output=1 << 20,
        log=str(tmp_path / "log"),
    )
    served.join(10)
    assert (session.opened, session.status, session.refused) == (False, None, "")
    assert not marker.exists()
    assert not (tmp_path / "log").exists(), "ssh's log is removed once read"
    assert find_master(str(tmp_path / "nothing")) is None
