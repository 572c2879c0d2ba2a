"""``--cluster`` over SSH: one OpenSSH server on three loopback addresses (all of 127/8 is
loopback) stands for the three online nodes of the example cluster snapshot, whose ``.members``
gives them 127.0.0.1-3; each node is reached at its member address with the first host's user,
port and SSH options, and reads its own tree beside the first one's.

The ``live`` tests make each node's tree a live node (as ``tests/sshd/conftest.py`` does for one
host): the cluster's PCI mapping then goes through the Proxmox API, answered by the stand-in
pvesh of :mod:`tests.support.standins` (Proxmox VE cannot run here), and the post-actions by
stand-ins that only log, found first on the PATH of each node's commands."""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import proxgpu.cli.hosts
from proxgpu.apply.journal import history
from proxgpu.cli import main
from proxgpu.host import DirectoryHost, connect
from proxgpu.host.ssh import SSHOptions
from proxgpu.paths import PCI_MAPPING
from proxgpu.pve.mapping import mapping_lines
from tests.support.pvevalidate import assert_all_ok, validate
from tests.support.sshd import SSHD, Sshd, running_sshd
from tests.support.standins import ToolsHost, fake_pvesh, fake_tool, pvesh_calls
from tests.support.tools import require_tool
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


NODES = ("pve1", "pve2", "pve3")


@pytest.fixture
def live(cluster: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each node's tree a live node with pvesh; returns the directory of each node's tools."""
    tools = tmp_path / "tools"
    tools.mkdir()
    log = 'echo "$(basename "$0") $*" >> "$(dirname "$0")/actions.log"\n'
    for node in NODES:
        fake_pvesh(tools / node, root=cluster / node)
        for name in ("update-initramfs", "proxmox-boot-tool", "systemctl"):
            fake_tool(tools / node, name, log)
        (cluster / node / "usr/bin").mkdir(exist_ok=True)
        (cluster / node / "usr/bin/pvesh").touch()  # inspection finds pvesh

    def live_connect(host: str | None, root: str | None, options: SSHOptions | None) -> object:
        if host is None or root is None:
            return connect(host, root, options)
        return ToolsHost(host, options, root, tools / Path(root).name)

    monkeypatch.setattr(proxgpu.cli.hosts, "connect", live_connect)
    return tools


def mapping_calls(tools: Path) -> dict[str, list[list[str]]]:
    """Each node's pvesh calls on /cluster/mapping/pci."""
    calls = {node: pvesh_calls(tools / node) for node in NODES}
    return {
        n: [c for c in cs if c[1].startswith("/cluster/mapping/pci")] for n, cs in calls.items()
    }


def option(call: list[str], name: str) -> list[str]:
    return [value for key, value in itertools.pairwise(call) if key == name]


def sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def test_live_apply_writes_the_mapping_once_through_the_api_and_rollback_puts_it_back(
    nodes_sshd: Sshd, tmp_path: Path, cluster: Path, live: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ssh = ssh_argv(nodes_sshd, tmp_path, cluster)
    written = cluster / "pve1/etc/pve/mapping/pci.cfg"
    original, digest = written.read_text(), sha1(written)
    assert main(["apply", *ssh, *GUESTS, "--yes"]) == 0
    out = capsys.readouterr().out
    assert "with pve1's apply, through the Proxmox API" in out
    [call] = mapping_calls(live)["pve1"]
    assert call[:2] == ["set", "/cluster/mapping/pci/gpu-vfio"]
    assert option(call, "--digest") == [digest], "Proxmox checks the file is as planned"
    nodes = [v.split("node=")[1].split(",")[0] for v in option(call, "--map")]
    assert nodes == ["pve4"] + ["pve1"] * 4 + ["pve2"] * 2 + ["pve3"] * 3
    assert not mapping_calls(live)["pve2"] and not mapping_calls(live)["pve3"], "written once"
    # Proxmox rewrote the file in its own order; its parser reads every node's lines.
    assert [k for k, _ in mapping_lines(written.read_text())["gpu-vfio"]].count("map") == 10
    assert_all_ok(validate([("pci-mapping", written.resolve())]))
    [entry] = history(DirectoryHost(str(cluster / "pve1")))
    [record] = [f for f in entry.files if f.path == PCI_MAPPING]
    assert (
        record.via == "api"
        and record.sha256_after == hashlib.sha256(written.read_bytes()).hexdigest()
    ), "journaled with the hash of the file Proxmox wrote"
    assert main(["verify", *ssh]) == 0
    capsys.readouterr()

    # Someone adds a mapping of their own: it is no drift, and the rollback keeps it.
    theirs = "other-gpus\n\tmap id=10de:2230,node=pve2,path=0000:83:00\n"
    written.write_text(written.read_text() + theirs)
    applied = sha1(written)
    assert main(["rollback", *ssh, "--yes"]) == 0
    capsys.readouterr()
    [_, back] = mapping_calls(live)["pve1"]
    assert back[:2] == ["set", "/cluster/mapping/pci/gpu-vfio"]
    assert option(back, "--digest") == [applied]
    now = mapping_lines(written.read_text())
    assert now == {**mapping_lines(original), "other-gpus": mapping_lines(theirs)["other-gpus"]}
    vm = cluster / "pve1/etc/pve/nodes/pve1/qemu-server/300.conf"
    assert "hostpci" not in vm.read_text()


def test_verify_reports_drift_of_the_mapping_and_rollback_refuses_naming_it(
    nodes_sshd: Sshd, tmp_path: Path, cluster: Path, live: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ssh = ssh_argv(nodes_sshd, tmp_path, cluster)
    assert main(["apply", *ssh, *GUESTS, "--yes"]) == 0
    capsys.readouterr()
    written = cluster / "pve1/etc/pve/mapping/pci.cfg"
    # An admin takes pve2's GPUs out of the mapping.
    kept = [line for line in written.read_text().splitlines() if "node=pve2" not in line]
    written.write_text("\n".join(kept) + "\n")
    assert main(["verify", *ssh]) == 17
    captured = capsys.readouterr()
    drift = [line for line in captured.out.splitlines() if PCI_MAPPING in line]
    assert len(drift) == 2 and all("node=pve2" in line and "is gone" in line for line in drift)
    assert main(["rollback", *ssh, "--yes"]) == 10
    err = capsys.readouterr().err
    assert f"{PCI_MAPPING}: changed since apply" in err and "pve1: failed (exit 10)" in err
    assert len(mapping_calls(live)["pve1"]) == 1, "only the apply's write"
    assert written.read_text() == "\n".join(kept) + "\n"
    vm = cluster / "pve1/etc/pve/nodes/pve1/qemu-server/300.conf"
    assert "hostpci0: mapping=gpu-vfio" in vm.read_text(), "nothing was rolled back"


def test_a_concurrent_change_of_the_mapping_makes_the_apply_refuse(
    nodes_sshd: Sshd, tmp_path: Path, cluster: Path, live: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    written = cluster / "pve1/etc/pve/mapping/pci.cfg"
    theirs = "\nother-gpus\n\tmap id=10de:2230,node=pve2,path=0000:83:00\n"
    # Between proxgpu's own check of the file and Proxmox's lock, another write lands.
    (live / "pve1/mapping-race").write_text(theirs)
    expected = written.read_text() + theirs
    ssh = ssh_argv(nodes_sshd, tmp_path, cluster)
    assert main(["apply", *ssh, *GUESTS, "--yes"]) == 10
    err = capsys.readouterr().err
    assert f"{PCI_MAPPING}: changed while being applied: Proxmox refused mapping gpu-vfio" in err
    assert "detected modified configuration" in err
    assert "pve2: not touched" in err and "pve3: not touched" in err
    assert written.read_text() == expected, "the other write stands, nothing of proxgpu's"
    vm = cluster / "pve1/etc/pve/nodes/pve1/qemu-server/300.conf"
    assert "hostpci" not in vm.read_text()
    [entry] = history(DirectoryHost(str(cluster / "pve1")))
    assert entry.status == "failed"


def test_a_failure_after_the_mapping_write_puts_it_back_through_the_api(
    nodes_sshd: Sshd, tmp_path: Path, cluster: Path, live: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_tool(live / "pve1", "update-initramfs", "echo 'no space left' >&2; exit 1\n")
    written = cluster / "pve1/etc/pve/mapping/pci.cfg"
    original, digest = written.read_text(), sha1(written)
    ssh = ssh_argv(nodes_sshd, tmp_path, cluster)
    assert main(["apply", *ssh, *GUESTS, "--yes"]) != 0
    err = capsys.readouterr().err
    assert "every file was restored" in err and "pve2: not touched" in err
    [wrote, back] = mapping_calls(live)["pve1"]
    assert option(wrote, "--digest") == [digest]
    assert back[:2] == ["set", "/cluster/mapping/pci/gpu-vfio"]
    # Back through the API, with the digest of the file the apply had written.
    assert option(back, "--map") == [
        v for k, v in mapping_lines(original)["gpu-vfio"] if k == "map"
    ]
    assert option(back, "--digest") != [digest]
    assert mapping_lines(written.read_text()) == mapping_lines(original)
    [entry] = history(DirectoryHost(str(cluster / "pve1")))
    assert entry.status == "failed"


@pytest.mark.parametrize(
    "hostile",
    [
        ("ip", "127.0.0.2$(touch {canary})"),
        ("ip", "fe80::1%$(touch {canary})"),
        ("name", "pve2;touch {canary}"),
    ],
)
def test_a_hostile_member_list_runs_nothing_on_the_admins_machine(
    nodes_sshd: Sshd,
    tmp_path: Path,
    cluster: Path,
    hostile: tuple[str, str],
) -> None:
    """The member list is host data: an address with shell syntax, with an ssh_config whose
    ``Match exec`` and ``ProxyCommand`` expand ``%h`` in a shell (both common), must run nothing
    and reach nothing; the list is refused naming its line."""
    canary = tmp_path / "ran"
    members_path = cluster / "pve1/etc/pve/.members"
    members = json.loads(members_path.read_text())
    field, value = hostile[0], hostile[1].format(canary=canary)
    if field == "ip":
        members["nodelist"]["pve2"]["ip"] = value
    else:
        members["nodelist"][value] = members["nodelist"].pop("pve2")
    members_path.write_text(json.dumps(members, indent=1))
    argv = ssh_argv(nodes_sshd, tmp_path, cluster)
    config = tmp_path / "ssh_config"
    config.write_text(
        'Match exec "test %h = never || true"\n  ConnectTimeout 5\n'
        "Host 127.0.0.2*\n  ProxyCommand sh -c 'exec nc %h %p'\n"
    )
    # Its own process: paramiko runs Match exec through invoke, which reads the terminal's stdin.
    ran = subprocess.run(
        [sys.executable, "-m", "proxgpu", "inspect", *argv, "--json"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert not canary.exists(), "a command in the member list ran on the admin's machine"
    assert ran.returncode != 0
    assert "/etc/pve/.members:" in ran.stdout + ran.stderr, ran.stdout + ran.stderr
    assert "refused" in ran.stdout + ran.stderr


def test_a_cluster_plan_says_what_each_nodes_containers_hold(
    nodes_sshd: Sshd, tmp_path: Path, cluster: Path, live: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each node is planned once every node is read (which guest is where); what the
    containers hold is then read on their own nodes. No LXC runs here: pve1's lxc-info is a
    stand-in naming CT 200's init, 4242, whose root in the tree holds another user space than
    the node's module; pve3's has none, so CT 150 (stopped, on LVM) is unknown there."""
    running = '[ "$*" = "-n 200 -p" ] || exit 1\necho "PID:          4242"\n'
    fake_tool(live / "pve1", "lxc-info", running)
    fake_tool(live / "pve3", "lxc-info", "exit 0\n")
    lib = cluster / "pve1/proc/4242/root/usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libnvidia-ml.so.550.100").touch()
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.550.100")
    argv = ["plan", *ssh_argv(nodes_sshd, tmp_path, cluster), "--lxc", "200", "--lxc", "150"]
    assert main([*argv, *GUESTS, "--json"]) == 0
    hosts = json.loads(capsys.readouterr().out)["hosts"]
    [ct200] = hosts["pve1"]["userspace"]
    assert (ct200["vmid"], ct200["holds"]["state"], ct200["holds"]["nvml"]) == (
        200,
        "running",
        "550.100",
    )
    [ct150] = hosts["pve3"]["userspace"]
    assert (ct150["vmid"], ct150["holds"]["state"]) == (150, "stopped")
    assert ct150["holds"]["why"] == "storage 'local-lvm' is not in /etc/pve/storage.cfg"
    assert main([*argv, *GUESTS]) == 0
    said = capsys.readouterr().out
    assert (
        "next step: CT 200 holds NVIDIA's user space 550.100 (read through its init's root), but "
        "the host's nvidia module is 575.57.08"
    ) in said
