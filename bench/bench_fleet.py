"""Wall time of ``proxgpu inspect`` over many hosts in one run, against one host, whole process.

Starts a throwaway OpenSSH server on 127.0.0.1 (tests/support/sshd.py) and names it 64 times in
an ssh_config (gpu1 ... gpu64), so that each name is its own connection: key exchange,
authentication, one command. Measured in the same run, each the median of a few runs:

* one: ``proxgpu inspect --host gpu1 --root TREE --json`` as a child process;
* fleet: the same with ``--host gpu1,...,gpu64`` and ``--forks N`` for a few N.

The goal is 64 hosts in at most 3x the time of one. Run: python bench/bench_fleet.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.timing import median_seconds  # noqa: E402
from tests.support.sshd import Sshd, running_sshd  # noqa: E402

RUNS = 3
HOSTS = 64


def write_config(server: Sshd, path: Path) -> None:
    path.write_text(
        "".join(
            f"Host gpu{n}\n  HostName 127.0.0.1\n  Port {server.port}\n  User {server.user}\n"
            f"  IdentityFile {server.identity_file}\n  UserKnownHostsFile {server.known_hosts}\n"
            for n in range(1, HOSTS + 1)
        )
    )


def inspect(config: Path, tree: Path, hosts: int, forks: int) -> None:
    names = ",".join(f"gpu{n}" for n in range(1, hosts + 1))
    argv = [sys.executable, "-m", "proxgpu", "inspect", "--host", names, "--root", str(tree)]
    argv += ["--ssh-config", str(config), "--forks", str(forks), "--json"]
    subprocess.run(argv, check=True, capture_output=True, timeout=600)


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        tree = work / "ct200"
        shutil.copytree(REPO / "examples/hosts/ct200", tree, symlinks=True)
        (work / "sshd").mkdir()
        with running_sshd(work / "sshd") as server:
            config = work / "ssh_config"
            write_config(server, config)
            one = median_seconds(partial(inspect, config, tree, 1, 1), RUNS, warmups=1)
            print(f"1 host: {one:.2f} s")
            for forks in (5, 16, 64):
                many = median_seconds(partial(inspect, config, tree, HOSTS, forks), RUNS, warmups=0)
                print(f"{HOSTS} hosts, --forks {forks}: {many:.2f} s = {many / one:.1f}x one host")


if __name__ == "__main__":
    main()
