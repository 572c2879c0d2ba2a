"""``proxgpu run`` and ``check-gpus`` through the command line on copies of the ct200 example,
with a BMC display and a GPU on vfio-pci written into the tree, inside a container's view of it,
and for real: a child Python run bound to this machine's node 0 reports its CPUs, environment
and memory policy from inside."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_mock import MockerFixture

from proxgpu.cli import main
from proxgpu.cpulist import format_cpulist
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from tests.support.trees import REPO, copy_example

PCI = "sys/bus/pci/devices"
NODES = "sys/devices/system/node"
#: ``__NR_get_mempolicy`` where the child can ask for its policy (see proxgpu.pipeline.numabind).
GET_MEMPOLICY = {"x86_64": 239, "aarch64": 236, "riscv64": 236}


def add_bmc_display(root: Path, address: str = "0000:02:00.0") -> None:
    """An ASPEED AST2600 on ast on node 0's root bus, as sysfs shows a BMC's display."""
    device = root / "sys/devices/pci0000:00" / address
    device.mkdir(parents=True)
    attributes = {"vendor": "0x1a03", "device": "0x2000", "class": "0x030000", "numa_node": "0"}
    for name, value in {**attributes, "local_cpulist": "0-31", "boot_vga": "1"}.items():
        (device / name).write_text(value + "\n")
    (root / "sys/bus/pci/drivers/ast").mkdir()
    (device / "driver").symlink_to("../../../bus/pci/drivers/ast")
    (root / PCI / address).symlink_to(f"../../../devices/pci0000:00/{address}")


def to_vfio(root: Path, address: str) -> None:
    """The GPU bound to vfio-pci: nvidia no longer lists it in /proc/driver/nvidia/gpus."""
    link = root / PCI / address / "driver"
    link.unlink()
    link.symlink_to("../../../../bus/pci/drivers/vfio-pci")
    (root / "sys/bus/pci/drivers/vfio-pci").mkdir(exist_ok=True)
    for entry in (root / "proc/driver/nvidia/gpus" / address).iterdir():
        entry.unlink()
    (root / "proc/driver/nvidia/gpus" / address).rmdir()


def in_container(root: Path, minors: list[int]) -> None:
    """The tree as a container sees the host: LXC's boot id, only these /dev/nvidiaN."""
    (root / "dev/.lxc-boot-id").write_text("2f8e1a0c-6a4b-4e0b-9a51-1c7f0e3d2b64\n")
    for node in (root / "dev").glob("nvidia[0-9]*"):
        if int(node.name.removeprefix("nvidia")) not in minors:
            node.unlink()


@pytest.fixture
def server(tmp_path: Path) -> Path:
    """ct200 with a BMC display at 02:00.0 and 11:00.0 on vfio-pci: CUDA numbers 7 GPUs."""
    root = copy_example(tmp_path)
    add_bmc_display(root)
    to_vfio(root, "0000:11:00.0")
    return root


def test_check_gpus_numbers_as_cuda_does_past_the_bmc_and_vfio_gpus(
    server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Counting every display controller, 2,3 was 11:00.0 and 61:00.0, both on node 0.
    assert main(["check-gpus", "2,3", "--root", str(server)]) == 18
    err = capsys.readouterr().err
    assert "node 0 holds 2 (0000:71:00.0); node 1 holds 3 (0000:81:00.0)" in err
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in err
    assert main(["check-gpus", "0000:02:00.0", "--root", str(server), "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["message"] == (
        f"0000:02:00.0: CUDA does not see it on dir:{server}: "
        "0000:02:00.0 is the BMC's display controller, not a GPU"
    )


def test_run_dry_run_prints_the_environment_and_the_command(
    server: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    no_numactl: str,
) -> None:
    monkeypatch.setenv("PATH", no_numactl)
    argv = ["run", "--tp", "4", "--root", str(server), "--dry-run", "--", "bench", "--tp", "4"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    # Node 0 has three CUDA GPUs left, so node 1's four: CUDA's 3-6.
    assert out.splitlines() == [
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES=3,4,5,6",
        "bench --tp 4",
    ]
    # The host as it was given (--root), as every other message spells it.
    head = f"proxgpu: dir:{server}: TP=4 on NUMA node 1: CUDA GPUs 3,4,5,6 (0000:81:00.0, "
    assert err.startswith(head)
    assert "CPUs 32-63 and node 1's memory" in err and err.count("\n") == 1


def test_run_dry_run_json_names_the_gpus_and_the_numactl_command(
    server: Path,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    numactl = stand_in_numactl(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    argv = ["run", "--tp", "2", "--node", "0", "--root", str(server), "--dry-run", "--json"]
    assert main([*argv, "--", "bench"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [(g["index"], g["address"]) for g in document["gpus"]] == [
        (0, "0000:01:00.0"),
        (1, "0000:61:00.0"),
    ]
    assert document["command"] == [str(numactl), "--cpunodebind=0", "--membind=0", "--", "bench"]
    assert document["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_in_a_container_run_and_check_gpus_number_its_own_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    in_container(root, [4, 5, 6, 7])
    assert main(["inspect", "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["container"] == "/dev/.lxc-boot-id"
    assert main(["check-gpus", "0,1,2,3", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("GPUs 0,1,2,3 are all on NUMA node 1")
    assert "CUDA's indexes in this container" in out
    assert main(["run", "--tp", "4", "--root", str(root), "--dry-run", "--", "x"]) == 0
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--tp", "5", "--", "x"], "ct200: no NUMA node has 5 CUDA GPUs: node 0 has 3, node 1"),
        (["--tp", "4", "--node", "0", "--", "x"], "NUMA node 0 has fewer than 4 CUDA GPUs"),
        (["--tp", "1"], "name the command to run: proxgpu run --tp N -- COMMAND..."),
        (["--tp", "1", "--", "x"], "describes another host, so the command would run here"),
    ],
)
def test_run_refusals_exit_2_on_one_line(
    server: Path, argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--root", str(server), *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


# The real thing: proxgpu execs a Python child that reports what it was given.
CHILD = """
import ctypes, json, os, sys
mode, mask = ctypes.c_int(-1), (ctypes.c_ulong * 16)()
libc = ctypes.CDLL(None, use_errno=True)
number = ctypes.c_long(int(sys.argv[1]))
status = libc.syscall(number, ctypes.byref(mode), mask, ctypes.c_ulong(16 * 64 + 1),
                      None, ctypes.c_ulong(0))
print(json.dumps({
    "cpus": sorted(os.sched_getaffinity(0)),
    "policy": [status, mode.value, mask[0]],
    "env": {k: v for k, v in os.environ.items() if k.startswith("CUDA_")},
}))
"""


def this_machine(tmp_path: Path) -> tuple[Path, list[int]]:
    """ct200 with node 0 on this machine's first allowed CPU (node 1 the others): binding to
    node 0 must narrow the child's CPUs, and node 0 is a node this kernel has."""
    if not Path("/", NODES, "node0").is_dir():
        pytest.skip("this kernel shows no NUMA node 0")
    if platform.machine() not in GET_MEMPOLICY:
        pytest.skip(f"get_mempolicy's number on {platform.machine()} is not known here")
    allowed = sorted(os.sched_getaffinity(0))
    root = copy_example(tmp_path)
    # This machine's identity, as a snapshot taken here holds it: run binds to such a tree's
    # GPUs and CPUs only when it is this machine's.
    for name in ("etc/machine-id", "etc/hostname"):
        mine = Path("/", name)
        if mine.is_file():
            (root / name).write_bytes(mine.read_bytes())
    nodes = {"0": format_cpulist(allowed[:1]), "1": format_cpulist(allowed[1:] or [1])}
    for node, cpus in nodes.items():
        (root / NODES / f"node{node}/cpulist").write_text(cpus + "\n")
    # A device's local CPUs are its node's: inspection refuses CPUs the host does not have.
    for local in root.glob("sys/devices/**/local_cpulist"):
        node = (local.parent / "numa_node").read_text().strip()
        local.write_text(nodes.get(node, nodes["0"]) + "\n")
    return root, allowed[:1]


@pytest.fixture(scope="module")
def no_numactl(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PATH with every command of this one but numactl (gather needs sh, grep, find...)."""
    farm = tmp_path_factory.mktemp("no-numactl")
    for directory in os.environ["PATH"].split(os.pathsep):
        for tool in Path(directory).glob("*") if Path(directory).is_dir() else []:
            link = farm / tool.name
            if tool.name != "numactl" and not link.is_symlink():
                link.symlink_to(tool)
    return str(farm)


def run_child(root: Path, path: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``proxgpu run`` with this PATH, execing ``argv`` (default: :data:`CHILD`)."""
    command = [sys.executable, "-m", "proxgpu", "run", "--tp", "2", "--node", "0", "--root"]
    env = {**os.environ, "PATH": path, "PYTHONPATH": str(REPO)}
    env["CUDA_VISIBLE_DEVICES"] = "7"  # inherited: proxgpu's choice replaces it
    child = argv or (sys.executable, "-c", CHILD, str(GET_MEMPOLICY[platform.machine()]))
    return subprocess.run(
        [*command, str(root), "--", *child],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_run_binds_the_child_to_node_0_without_numactl(tmp_path: Path, no_numactl: str) -> None:
    root, cpus = this_machine(tmp_path)
    done = run_child(root, no_numactl)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["cpus"] == cpus
    assert report["env"] == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1"}
    status, mode, mask = report["policy"]
    assert (status, mode, mask) == (0, 2, 1), "MPOL_BIND to node 0 only"
    assert "bound by sched_setaffinity and set_mempolicy" in done.stderr


def test_run_execs_numactl_when_it_is_installed(tmp_path: Path, no_numactl: str) -> None:
    root, _ = this_machine(tmp_path)
    stand_in_numactl(tmp_path / "bin")
    done = run_child(root, f"{tmp_path / 'bin'}:{no_numactl}")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "bin/numactl.args").read_text().split()[:3] == [
        "--cpunodebind=0",
        "--membind=0",
        "--",
    ]
    # The stand-in binds nothing: the child keeps the CPUs and policy it inherited.
    report = json.loads(done.stdout)
    assert report["cpus"] == sorted(os.sched_getaffinity(0))
    assert report["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "bound by numactl" in done.stderr


def test_a_command_that_is_not_there_exits_127(tmp_path: Path, no_numactl: str) -> None:
    root, _ = this_machine(tmp_path)
    done = run_child(root, no_numactl, "no-such-command")
    assert done.returncode == 127
    assert done.stderr.splitlines()[-1] == "proxgpu: no-such-command: command not found"


def stand_in_numactl(directory: Path) -> Path:
    """A numactl that records its options and runs the command after ``--``."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "numactl"
    script.write_text(
        f'#!/bin/sh\necho "$@" > {directory}/numactl.args\n'
        'while [ "$1" != -- ]; do shift; done\nshift\nexec "$@"\n'
    )
    script.chmod(0o755)
    return script


@pytest.fixture
def one_cpu() -> Iterator[int]:
    """This process narrowed to its first allowed CPU, as a container's cpuset narrows it."""
    before = os.sched_getaffinity(0)
    cpu = min(before)
    os.sched_setaffinity(0, {cpu})
    yield cpu
    os.sched_setaffinity(0, before)


def test_on_this_machine_run_claims_only_the_cpus_it_may_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mocker: MockerFixture, one_cpu: int
) -> None:
    root, _ = this_machine(tmp_path)
    # The inventory is this machine's (no --root), but its GPUs are ct200's: this one has none.
    tree = inspect(DirectoryHost(str(root)))
    mocker.patch("proxgpu.cli.launch.inspect", return_value=tree)
    assert main(["run", "--tp", "2", "--node", "0", "--dry-run", "--json", "--", "x"]) == 0
    assert json.loads(capsys.readouterr().out)["cpus"] == str(one_cpu)


def test_with_root_run_describes_the_tree_not_this_machines_cpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], one_cpu: int
) -> None:
    root = copy_example(tmp_path)
    argv = ["run", "--tp", "2", "--node", "1", "--root", str(root), "--dry-run", "--json"]
    assert main([*argv, "--", "x"]) == 0
    document = json.loads(capsys.readouterr().out)
    # ct200's node 1, though this process may run on one CPU only.
    assert document["cpus"] == "32-63"
    assert "CPUs 32-63 and node 1's memory" in document["summary"]
