"""Many hosts in one run, through the command line against a real sshd on loopback: the same
server under several names in an ssh_config (one of them a closed port, standing for a host that
is down), each reached over its own connection."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from proxgpu.cli import main
from tests.support.sshd import Sshd, free_port
from tests.support.trees import copy_example

pytestmark = pytest.mark.sshd


def fleet_config(sshd: Sshd, tmp_path: Path, names: list[str], down: str = "") -> Path:
    config = tmp_path / "ssh_config"
    blocks = [
        f"Host {name}\n  HostName 127.0.0.1\n  Port {free_port() if name == down else sshd.port}\n"
        f"  User {sshd.user}\n  IdentityFile {sshd.identity_file}\n"
        f"  UserKnownHostsFile {sshd.known_hosts}\n"
        for name in names
    ]
    config.write_text("".join(blocks))
    return config


def test_inspect_of_several_hosts_is_one_document_keyed_by_target(
    sshd: Sshd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    config = fleet_config(sshd, tmp_path, ["gpu1", "gpu2", "gpu3", "down1"], down="down1")
    argv = ["inspect", "--ssh-config", str(config), "--root", str(root), "--json"]
    code = main([*argv, "--host", "gpu1,gpu2", "--host", "down1", "--host", "gpu3"])
    captured = capsys.readouterr()
    hosts = json.loads(captured.out)["hosts"]
    assert list(hosts) == ["gpu1", "gpu2", "down1", "gpu3"], "in the order given"
    assert all(len(hosts[h]["gpus"]) == 8 for h in ("gpu1", "gpu2", "gpu3"))
    assert hosts["down1"]["error"]["code"] == 3 == code, "the worst code; the others reported"
    assert "down1: failed (exit 3)" in captured.err and "gpu3: ok" in captured.err


def test_inspect_of_several_hosts_loads_neither_pydantic_nor_the_planner(
    sshd: Sshd, tmp_path: Path
) -> None:
    # A fresh interpreter running the whole command: reading a fleet needs no plan or picture.
    root = copy_example(tmp_path)
    config = fleet_config(sshd, tmp_path, ["gpu1", "gpu2"])
    argv = ["inspect", "--ssh-config", str(config), "--root", str(root), "--json"]
    script = (
        "import sys\n"
        "from proxgpu.cli import main\n"
        f"code = main({[*argv, '--host', 'gpu1,gpu2']!r})\n"
        "loaded = [m for m in ('pydantic', 'jinja2', 'proxgpu.planning') if m in sys.modules]\n"
        "print(code, loaded, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stderr.splitlines()[-1] == "0 []"
    assert list(json.loads(done.stdout)["hosts"]) == ["gpu1", "gpu2"]


def test_text_output_is_one_section_per_host(
    sshd: Sshd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    config = fleet_config(sshd, tmp_path, ["gpu1", "gpu2"])
    argv = ["plan", "--ssh-config", str(config), "--root", str(root), "--lxc", "200"]
    assert main([*argv, "--vm", "300", "--host", "gpu1,gpu2"]) == 0
    out = capsys.readouterr().out
    assert out.index("== gpu1 ==") < out.index("== gpu2 ==")
    assert out.count("Plan for ct200") == 2
    # Each section's next step applies that host's plan on that host, and on no other.
    first, second = out.split("== gpu2 ==")
    assert "`proxgpu apply --host gpu1 --root" in first and "--host gpu2" not in first
    assert "`proxgpu apply --host gpu2 --root" in second and "--host gpu1" not in second


def test_a_rollout_stops_at_the_first_failure_and_says_who_was_touched(
    sshd: Sshd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    config = fleet_config(sshd, tmp_path, ["gpu1", "down1", "gpu2"], down="down1")
    argv = ["apply", "--ssh-config", str(config), "--root", str(root), "--lxc", "200"]
    argv += ["--vm", "300", "--yes", "--skip-guest-check"]
    assert main([*argv, "--host", "gpu1,down1,gpu2"]) == 3
    err = capsys.readouterr().err
    assert "gpu1: ok" in err and "down1: failed (exit 3)" in err
    assert "gpu2: not touched (an earlier host failed)" in err
    assert "hostpci0" in (root / "etc/pve/qemu-server/300.conf").read_text(), "gpu1 applied"


def test_several_hosts_are_never_changed_without_yes(
    sshd: Sshd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    config = fleet_config(sshd, tmp_path, ["gpu1", "gpu2"])
    argv = ["apply", "--ssh-config", str(config), "--root", str(root), "--lxc", "200"]
    assert main([*argv, "--host", "gpu1,gpu2"]) == 2
    assert "pass --yes" in capsys.readouterr().err
    assert "hostpci0" not in (root / "etc/pve/qemu-server/300.conf").read_text()


def test_each_hosts_steps_are_prefixed_with_the_host_and_its_end_said(
    sshd: Sshd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    config = fleet_config(sshd, tmp_path, ["gpu1", "gpu2"])
    argv = ["apply", "--ssh-config", str(config), "--root", str(root), "--lxc", "200"]
    assert main([*argv, "--vm", "300", "--yes", "--skip-guest-check", "--host", "gpu1,gpu2"]) == 0
    err = capsys.readouterr().err.splitlines()
    gpu1 = [line for line in err if line.startswith("gpu1: [")]
    assert any("] preflight: checking" in line for line in gpu1), err
    assert any("] write: replacing" in line for line in gpu1), err
    # Said as they happen: gpu1's steps, then its end, then gpu2's (one host at a time; gpu2
    # shares the tree, so it finds nothing left to change).
    assert err.index(gpu1[-1]) < err.index("gpu1: ok") < err.index("gpu2: ok")


def test_several_hosts_write_one_output_file_or_a_snapshot_each(
    sshd: Sshd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    config = fleet_config(sshd, tmp_path, ["gpu1", "gpu2"])
    ssh = ["--ssh-config", str(config), "--root", str(root), "--host", "gpu1,gpu2"]
    both = tmp_path / "both.json"
    assert main(["inspect", *ssh, "--json", "-o", str(both)]) == 0
    assert list(json.loads(both.read_text())["hosts"]) == ["gpu1", "gpu2"]
    snap = tmp_path / "snap"
    assert main(["snapshot", *ssh, "-o", str(snap)]) == 0
    assert sorted(p.name for p in snap.iterdir()) == ["gpu1", "gpu2"]
    capsys.readouterr()
    assert main(["inspect", "--root", str(snap / "gpu2"), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["gpus"]) == 8, "each tree reads back"


def test_a_fleet_verify_says_which_host_drifted_on_its_own_line(
    sshd: Sshd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    config = fleet_config(sshd, tmp_path, ["gpu1", "gpu2"])
    ssh = ["--ssh-config", str(config), "--root", str(root)]
    apply = ["apply", *ssh, "--lxc", "200", "--vm", "300", "--yes", "--skip-guest-check"]
    assert main([*apply, "--host", "gpu1"]) == 0
    assert main(["verify", *ssh, "--host", "gpu1,gpu2"]) == 0
    assert "gpu1: ok" in capsys.readouterr().err
    vm = root / "etc/pve/qemu-server/300.conf"
    vm.write_text(vm.read_text().replace("hostpci0:", "#hostpci0:"))
    assert main(["verify", *ssh, "--host", "gpu1,gpu2"]) == 17
    err = capsys.readouterr().err
    assert "gpu1: failed (exit 17)" in err and "gpu2: failed (exit 17)" in err
    assert ": ok" not in err
