"""``--cluster`` over SSH: one OpenSSH server on three loopback addresses (all of 127/8 is
loopback) stands for the three online nodes of the example cluster snapshot, whose ``.members``
gives them 127.0.0.1-3; each node is reached at its member address with the first host's user,
port and SSH options, and reads its own tree beside the first one's."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxgpu.cli import main
from tests.conftest import require_tool
from tests.support.sshd import SSHD, Sshd, running_sshd
from tests.support.trees import EXAMPLES

pytestmark = pytest.mark.sshd

GUESTS = ["--vm", "300", "--vm", "310", "--vm", "320", "--mapping", "gpu-vfio"]


@pytest.fixture
def nodes_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """sshd on 127.0.0.1, .2 and .3: pve1, pve2 and pve3 of cluster-3 (pve4, .4, is offline)."""
    require_tool(SSHD, "openssh-server")
    addresses = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
    with running_sshd(tmp_path_factory.mktemp("sshd"), addresses) as server:
        yield server


def ssh_argv(server: Sshd, tmp_path: Path, root: Path) -> list[str]:
    empty = tmp_path / "ssh_config"
    empty.touch()
    return [
        "--host", server.target, "--root", str(root / "pve1"), "--cluster",
        "-i", str(server.identity_file), "--known-hosts", str(server.known_hosts),
        "--ssh-config", str(empty),
    ]  # fmt: skip


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    root = tmp_path / "cluster"
    shutil.copytree(EXAMPLES / "cluster-3", root, symlinks=True)
    return root


def test_plan_reaches_every_online_node_at_its_member_address(
    nodes_sshd: Sshd, tmp_path: Path, cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", *ssh_argv(nodes_sshd, tmp_path, cluster), *GUESTS, "--json", "-v"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert list(document["hosts"]) == ["pve1", "pve2", "pve3"]
    hosts = {n: d["changes"]["host"] for n, d in document["hosts"].items()}
    assert hosts == {
        "pve1": nodes_sshd.target,
        "pve2": f"{nodes_sshd.user}@127.0.0.2:{nodes_sshd.port}",
        "pve3": f"{nodes_sshd.user}@127.0.0.3:{nodes_sshd.port}",
    }
    assert "127.0.0.4" not in captured.err, "the offline node is never connected to"
    assert "node=pve3" in document["cluster"]["mapping"]["after"]


def test_apply_rolls_out_node_by_node_with_the_mapping_written_once(
    nodes_sshd: Sshd, tmp_path: Path, cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ssh = ssh_argv(nodes_sshd, tmp_path, cluster)
    assert main(["apply", *ssh, *GUESTS, "--yes", "--skip-guest-check"]) == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.endswith(": ok")] == [
        "pve1: ok",
        "pve2: ok",
        "pve3: ok",
    ]
    mapping = (cluster / "pve1/etc/pve/mapping/pci.cfg").read_text()
    assert all(f"node={node}," in mapping for node in ("pve1", "pve2", "pve3", "pve4"))
    for node, vmid in (("pve1", 300), ("pve2", 310), ("pve3", 320)):
        vm = cluster / node / f"etc/pve/nodes/{node}/qemu-server/{vmid}.conf"
        assert "hostpci0: mapping=gpu-vfio" in vm.read_text()
    assert main(["history", *ssh, "--json"]) == 0
    history = json.loads(capsys.readouterr().out)["hosts"]
    assert {n: len(entries) for n, entries in history.items()} == {"pve1": 1, "pve2": 1, "pve3": 1}


def test_a_node_that_cannot_be_reached_stops_the_apply_before_any_node(
    nodes_sshd: Sshd, tmp_path: Path, cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for node in ("pve1", "pve2", "pve3"):
        members = cluster / node / "etc/pve/.members"
        # pve3 answers at an address nothing listens on: it is down, though pmxcfs says online.
        members.write_text(members.read_text().replace("127.0.0.3", "127.0.0.5"))
    argv = ["apply", *ssh_argv(nodes_sshd, tmp_path, cluster), *GUESTS, "--connect-timeout", "2"]
    assert main([*argv, "--yes", "--skip-guest-check"]) == 3
    captured = capsys.readouterr()
    assert "Nothing was applied: pve3 could not be planned." in captured.out
    assert "pve3: failed (exit 3)" in captured.err
    vm = cluster / "pve1/etc/pve/nodes/pve1/qemu-server/300.conf"
    assert "hostpci" not in vm.read_text(), "no node changed"


def test_snapshot_over_ssh_is_a_tree_per_node_that_plans_the_same(
    nodes_sshd: Sshd, tmp_path: Path, cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "snap"
    argv = ["snapshot", *ssh_argv(nodes_sshd, tmp_path, cluster), "-o", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == ["pve1", "pve2", "pve3"]
    assert (out / "pve2/etc/pve/qemu-server").readlink() == Path("nodes/pve2/qemu-server")
    plans = []
    for root in (cluster, out):
        assert main(["plan", "--root", str(root), "--cluster", *GUESTS, "--json"]) == 0
        plans.append(json.loads(capsys.readouterr().out)["cluster"]["mapping"])
    assert plans[0] == plans[1]
