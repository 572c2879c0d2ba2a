"""Wall time of ``proxgpu inspect`` over many hosts in one run, against one host, whole process.

Starts a throwaway OpenSSH server on 127.0.0.1 (tests/support/sshd.py) and names it 64 times in
an ssh_config (gpu1 ... gpu64), so that each name is its own connection: key exchange,
authentication, one command. Measured in the same run, each the median of a few runs:

* one: ``proxgpu inspect --host gpu1 --root TREE --json`` as a child process;
* fleet: the same with ``--host gpu1,...,gpu64`` and ``--forks N`` for a few N.

The goal is 64 hosts in at most 3x the time of one. The floor of the fleet is OpenSSH's own
``ssh NAME true`` to the same 64 names with the same concurrency: every connection's key exchange
runs on this machine, client and server side alike. Where the time goes: each fleet run also
reports the CPU time it used, proxgpu's own (its child's rusage) and the whole machine's (busy
time in /proc/stat, which takes in sshd and the shell scripts on the "hosts", all on this
machine), and the floors that CPU time sets: busy seconds divided by the cores, and the same for
the "hosts" alone, which share this machine's cores as no real fleet does. Run on a quiet
machine: python bench/bench_fleet.py
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
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
    # No timeouts in what is timed: with one, Python polls for the child's exit with sleeps of
    # up to 50 ms.
    subprocess.run(argv, check=True, capture_output=True)


def ssh_fleet(config: Path, hosts: int, forks: int) -> None:
    """The floor: OpenSSH's own ``ssh NAME true`` to the same names, ``forks`` at a time."""

    def one(n: int) -> None:
        subprocess.run(["ssh", "-F", str(config), f"gpu{n}", "true"], check=True)

    with ThreadPoolExecutor(max_workers=forks) as pool:
        list(pool.map(one, range(1, hosts + 1)))


def busy_seconds() -> float:
    """CPU time the whole machine has spent busy (every state but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def client_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_report(config: Path, tree: Path, hosts: int, forks: int, one: float) -> str:
    """One run's wall time, CPU time (proxgpu's, the machine's) and the floors the CPU sets: the
    whole machine's, and that of the "hosts" alone (sshd and the scripts), as a multiple of
    ``one`` (one host's wall time), which no client, however cheap, can get under here."""
    busy, client, start = busy_seconds(), client_seconds(), time.perf_counter()
    inspect(config, tree, hosts, forks)
    wall = time.perf_counter() - start
    busy, client = busy_seconds() - busy, client_seconds() - client
    cores = os.cpu_count() or 1
    hosts_alone = (busy - client) / cores
    return (
        f"wall {wall:.2f} s; CPU: proxgpu {client:.2f} s, whole machine {busy:.2f} s "
        f"(sshd and the host scripts {busy - client:.2f} s); floor on {cores} cores "
        f"{busy / cores:.2f} s, of which the hosts alone {hosts_alone:.2f} s = "
        f"{hosts_alone / one:.1f}x one host"
    )


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
            print(f"  1 host: {cpu_report(config, tree, 1, 1, one)}")
            for forks in (5, 16, 64):
                many = median_seconds(partial(inspect, config, tree, HOSTS, forks), RUNS, warmups=0)
                floor = median_seconds(partial(ssh_fleet, config, HOSTS, forks), RUNS, warmups=0)
                print(
                    f"{HOSTS} hosts, --forks {forks}: {many:.2f} s = {many / one:.1f}x one host; "
                    f"ssh true to the {HOSTS} names, {forks} at a time: {floor:.2f} s "
                    f"(proxgpu = {many / floor:.2f}x that)"
                )
                print(f"  {cpu_report(config, tree, HOSTS, forks, one)}")


if __name__ == "__main__":
    main()
