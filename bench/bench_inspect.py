"""Round trips and wall time of ``proxgpu inspect`` over loopback SSH, against a bare ``ssh true``.

Starts a throwaway OpenSSH server on 127.0.0.1 (see tests/support/sshd.py), then for each host
shape measures, in the same run, every action in turns (so that the machine's drift during the
run weighs on the floor and on proxgpu alike):

* floor: OpenSSH's own client running ``true`` on that server (connect, authenticate, one command);
* proxgpu: connect, gather and build the inventory, in process, with the same key and known_hosts,
  over each transport (paramiko, and OpenSSH's ssh with one shared connection).

Beside each wall time, where the CPU went per run: the client's (this process's own for what runs
in process, and every child's: ssh, the whole ``proxgpu`` command) and the server's (every
connection's sshd and the commands it ran, read from the test sshd's reaped children), so that the
floor's and proxgpu's parts can be read side by side. On a machine of few cores where client and
server share the CPUs, the wall time follows the sum of the two.

Host shapes: this machine ("/"), the ct200 example (8 GPUs) and a synthetic 64-GPU tree, so that
the round-trip count can be seen not to grow with the number of GPUs. Last, the whole command
``proxgpu inspect --host ... --json`` as a child process against the same floor, per transport,
run as a user runs it: the command of a plain install (:mod:`bench.plain`), not the checkout's
editable one.

Run: python bench/bench_inspect.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.plain import plain_install  # noqa: E402
from bench.timing import Sample, byte_compiled, interleaved  # noqa: E402
from proxgpu.host.base import Host  # noqa: E402
from proxgpu.host.openssh import OpenSSHHost  # noqa: E402
from proxgpu.host.ssh import SSHHost, SSHOptions  # noqa: E402
from proxgpu.inspection import inspect  # noqa: E402
from tests.support.sshd import Sshd, running_sshd  # noqa: E402

RUNS = 15
TRANSPORTS: dict[str, type[Host]] = {"paramiko": SSHHost, "openssh": OpenSSHHost}


def ssh_true(server: Sshd) -> None:
    subprocess.run(
        [
            "ssh",
            "-F",
            "/dev/null",
            "-p",
            str(server.port),
            "-i",
            str(server.identity_file),
            "-o",
            f"UserKnownHostsFile={server.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            f"{server.user}@127.0.0.1",
            "true",
        ],
        check=True,
        capture_output=True,
    )


def proxgpu_inspect(server: Sshd, root: str, config: Path, client: str) -> int:
    options = SSHOptions(
        identity_file=str(server.identity_file),
        known_hosts=str(server.known_hosts),
        ssh_config=str(config),
    )
    with TRANSPORTS[client](server.target, options, root=root) as host:  # type: ignore[call-arg]
        inventory = inspect(host)
        assert inventory.hostname
        return host.commands_run


def synthetic_64_gpu_tree(base: Path) -> Path:
    """ct200 with 56 more GPUs: copies of one GPU's sysfs entries at new bus numbers."""
    root = base / "gpu64"
    shutil.copytree(REPO / "examples/hosts/ct200", root, symlinks=True)
    devices = root / "sys/bus/pci/devices"
    for bus in range(0x20, 0x20 + 56):
        for function in ("0", "1"):
            shutil.copytree(
                devices / f"0000:01:00.{function}",
                devices / f"0000:{bus:02x}:00.{function}",
                symlinks=True,
            )
    return root


def main() -> None:
    byte_compiled(REPO / "proxgpu")
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_sshd(Path(tmp)) as server,
        plain_install() as bin_dir,
    ):
        config = Path(tmp) / "empty_ssh_config"
        config.touch()
        shapes = {
            "this machine (/)": "/",
            "ct200 (8 GPUs)": str(REPO / "examples/hosts/ct200"),
            "synthetic (64 GPUs)": str(synthetic_64_gpu_tree(Path(tmp))),
        }
        # Every action in turns, the floor among them (see bench.timing.interleaved).
        actions: dict[str, Callable[[], object]] = {FLOOR: partial(ssh_true, server)}
        # What each line says beside its times: in process, the round trips it took.
        said: dict[str, str] = {}
        for client in TRANSPORTS:
            for name, root in shapes.items():
                label = f"{client:8} {name:22}"
                actions[label] = partial(proxgpu_inspect, server, root, config, client)
                said[label] = f"round trips {proxgpu_inspect(server, root, config, client)}"
        # The whole command, as a user runs it from a plain install (bench.plain): interpreter
        # start, imports, connect, inspect.
        ct200 = str(REPO / "examples/hosts/ct200")
        for client in TRANSPORTS:
            label = f"{client:8} {'proxgpu inspect --json':22}"
            actions[label] = partial(cli_inspect, bin_dir, server, ct200, config, client)
            said[label] = "whole process"
        taken = interleaved(actions, RUNS, server=server.served_cpu_seconds)
        floor = taken.pop(FLOOR)
        print(
            f"floor: ssh true over loopback: {floor.wall * 1000:.1f} ms (median of {RUNS}); "
            f"{floor.cpu_line()}"
        )
        for label, one in taken.items():
            print(f"{label} {said[label]}  {compared(one, floor)}")


FLOOR = "floor"


def compared(taken: Sample, floor: Sample) -> str:
    """A run's wall time, its ratio to the floor's, and its CPU beside the floor's."""
    return (
        f"wall {taken.wall * 1000:7.1f} ms  ratio to floor {taken.wall / floor.wall:5.2f}  "
        f"{taken.cpu_line()}"
    )


def cli_inspect(bin_dir: Path, server: Sshd, root: str, config: Path, client: str) -> None:
    """``proxgpu inspect --host ... --json`` as a child process of the installed command in
    ``bin_dir``, outside the checkout, with the same key and hosts."""
    subprocess.run(
        [
            str(bin_dir / "proxgpu"),
            "inspect",
            "--host",
            server.target,
            "--root",
            root,
            "-i",
            str(server.identity_file),
            "--known-hosts",
            str(server.known_hosts),
            "--ssh-config",
            str(config),
            "--ssh-client",
            client,
            "--json",
        ],
        check=True,
        capture_output=True,
        cwd="/",
    )


if __name__ == "__main__":
    main()
