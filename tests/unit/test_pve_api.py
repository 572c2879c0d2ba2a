"""The Proxmox API through proxmoxer's command backend, carried by proxgpu's own hosts.

Proxmox VE cannot be installed here, so a :class:`Canned` host takes pvesh's place: it runs
nothing and returns what pvesh prints (only outputs of the shapes real pvesh prints: a JSON
answer, a ``NNN Text`` status line on stderr, a warning on stderr). The stand-in ``pvesh`` script
on PATH is in ``tests/local/test_pve_api.py``.
"""

from __future__ import annotations

import shlex

import pytest

from proxgpu.errors import PveApiError
from proxgpu.host.base import CommandResult, Host, command_line
from proxgpu.pve.api import (
    HostSession,
    config_update,
    guest_status,
    proxmox_api,
    pvesh_warnings,
    same_config,
)

DIGEST_REFUSED = (
    b"400 Parameter verification failed.\n"
    b"digest: detected modified configuration - file changed by other user? Try again.\n"
)


class Canned(Host):
    """A host that records each argument list and answers with canned pvesh output."""

    def __init__(self, *answers: tuple[int, bytes, bytes]) -> None:
        super().__init__()
        self.name = "root@pve1"
        self.root = "/"
        self.answers = list(answers)
        self.argvs: list[tuple[str, ...]] = []

    def _run(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float) -> CommandResult:
        self.argvs.append(argv)
        returncode, stdout, stderr = self.answers.pop(0)
        return CommandResult(argv, returncode, stdout, stderr)


def test_the_installed_proxmoxer_takes_the_exit_status_from_the_host() -> None:
    # pyproject pins proxmoxer >= 2.3: before it, a backend's _exec returned (stdout, stderr)
    # only, and a request through HostSession could not even unpack its answer.
    session = HostSession(Canned((3, b"", b"500 pvesh crashed\n"), (0, b'{"a": 1}\n', b"")))
    failed = session.request("GET", "/nodes/pve1/qemu/300/status/current")
    assert (failed.status_code, failed.exit_code) == (500, 3)
    answered = session.request("GET", "/version")
    assert (answered.status_code, answered.exit_code, answered.content) == (200, 0, '{"a": 1}\n')


def test_a_request_is_one_pvesh_argument_list_run_by_the_host() -> None:
    host = Canned((0, b"", b""))
    api = proxmox_api(host)
    api.nodes("pve1").qemu(300).config.put(hostpci0="0000:81:00,pcie=1", delete="numa", digest="d")
    assert host.argvs == [
        (
            "pvesh",
            "set",
            "/nodes/pve1/qemu/300/config",
            "-hostpci0",
            "0000:81:00,pcie=1",
            "-delete",
            "numa",
            "-digest",
            "d",
            "--output-format",
            "json",
        )
    ]
    assert host.commands_run == 1
    # Over SSH the list becomes a command line in proxgpu's one quoting place, losslessly.
    assert shlex.split(command_line(host.argvs[0])) == list(host.argvs[0])


def test_guest_status_reads_the_status_object() -> None:
    host = Canned((0, b'{"status":"running","vmid":300}\n', b""))
    assert guest_status(proxmox_api(host), "pve1", "qemu", 300) == "running"
    assert host.argvs[0][:3] == ("pvesh", "get", "/nodes/pve1/qemu/300/status/current")


def test_a_warning_on_stderr_does_not_turn_success_into_an_error() -> None:
    # proxmoxer alone would call this a 500: stderr without a status line.
    host = Canned((0, b'{"status":"stopped"}\n', b"trying to acquire lock...\nOK\n"))
    api = proxmox_api(host)
    assert guest_status(api, "pve1", "lxc", 200) == "stopped"
    session = api._store["session"]
    assert isinstance(session, HostSession) and session.warnings == [
        "trying to acquire lock...",
        "OK",
    ]
    host.answers.append((0, b'{"status":"stopped"}\n', b"trying to acquire lock...\nOK\n"))
    guest_status(api, "pve1", "lxc", 200)
    assert pvesh_warnings(api) == ["trying to acquire lock...", "OK"], "each line once"


def test_an_api_error_is_one_line_naming_the_host_and_the_path() -> None:
    host = Canned((255, b"", DIGEST_REFUSED))
    with pytest.raises(PveApiError) as err:
        proxmox_api(host).nodes("pve1").qemu(300).config.put(digest="0" * 40)
    assert str(err.value) == (
        "root@pve1: PUT /nodes/pve1/qemu/300/config: 400 Parameter verification failed: "
        "digest: detected modified configuration - file changed by other user? Try again."
    )
    assert (err.value.status, err.value.path, err.value.exit_code) == (
        400,
        "/nodes/pve1/qemu/300/config",
        7,
    )


@pytest.mark.parametrize(
    ("answer", "detail"),
    [
        ((1, b"", b""), "pvesh exited with 1"),
        ((127, b"", b"sh: 1: pvesh: not found\n"), "sh: 1: pvesh: not found"),
    ],
    ids=["silent-failure", "no-pvesh"],
)
def test_a_failure_without_a_status_line_is_still_a_failure(
    answer: tuple[int, bytes, bytes], detail: str
) -> None:
    with pytest.raises(PveApiError, match=f"GET /nodes/pve1/qemu/300/status/current: {detail}$"):
        guest_status(proxmox_api(Canned(answer)), "pve1", "qemu", 300)


def test_config_update_sets_what_changed_and_deletes_what_went() -> None:
    before = "#desc\nnuma: 0\naffinity: 0-3\nhostpci0: 0000:01:00\n\n[snap]\nnuma: 0\n"
    after = "#desc\nnuma: 1\nhostpci1: 0000:81:00,pcie=1\n\n[snap]\nnuma: 0\n"
    assert config_update(before, after) == {
        "numa": "1",
        "hostpci1": "0000:81:00,pcie=1",
        "delete": "affinity,hostpci0",
    }
    assert config_update(before, before) == {}


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("numa: 0\n[snap]\nnuma: 0\n", "numa: 1\n[snap]\nnuma: 1\n"),
        ("#old\nnuma: 0\n", "#new\nnuma: 1\n"),
        ("numa: 0\n[PENDING]\nmemory: 4096\n", "numa: 1\n[PENDING]\nmemory: 4096\n"),
        ("args: -a\n", "args: -cpu host\n"),
    ],
    ids=["snapshot-section", "description", "pending-changes", "value-like-an-option"],
)
def test_config_update_refuses_what_the_api_cannot_express(before: str, after: str) -> None:
    assert config_update(before, after) is None


def test_same_config_ignores_the_order_of_main_keys_only() -> None:
    a = "#d\nb: 2\na: 1\n\n[s]\nc: 3\n"
    assert same_config(a, "#d\na: 1\nb: 2\n\n[s]\nc: 3\n")
    assert not same_config(a, "#d\na: 1\nb: 2\n\n[t]\nc: 3\n")
    assert not same_config(a, "#e\na: 1\nb: 2\n\n[s]\nc: 3\n")
    assert not same_config(a, "#d\na: 1\nb: 3\n\n[s]\nc: 3\n")
