"""Wall time of ``proxgpu inspect`` over many hosts against OpenSSH's own fan-out, in one run.

Starts a throwaway OpenSSH server on 127.0.0.1 (tests/support/sshd.py) and names it 64 times in
an ssh_config (gpu1 ... gpu64), so that each name is its own connection: key exchange,
authentication, commands. For 16 and for 64 hosts, at ``--forks`` 5 and 16, each the median of a
few runs in the same process:

* proxgpu: ``proxgpu inspect --host gpu1,...,gpuN --json --forks F`` as a child, each host
  inspected twice over: as a live host is (its own ``/``: here this machine's, which has no GPU,
  so the gather reads less than on a GPU host), and as a tree (``--root TREE``, a copy of the
  ct200 example's eight GPUs), where the gather also checks that no file it read came through
  a link out of the tree, work a live host does not need;
* the floor: OpenSSH's ``ssh NAME true`` to the same N names, F at a time (what ``xargs -P F``
  does), whose server side (sshd's key exchange and authentication per connection) is the same
  as a live host's inspection over SSH, but for the gather itself;
* for the trees, a second floor whose server side is the same in full: ``ssh NAME COMMAND``,
  COMMAND being the very gather command proxgpu sends for the tree (the script, its check and
  all). On this machine every "host" is the same two cores, so the server's work is charged to
  the wall time of both sides; on a real fleet each host does its own. A tree's gather costs
  its host some 30 ms of CPU more than ``true``, reading eight GPUs and checking every path for
  a link out of the tree: measured against ``ssh true``, that is the tree's server work, not
  proxgpu's client, that is weighed. Both ratios are printed.

The floors and both kinds run in turns, so that a drift of the machine's speed during the run
weighs on each alike.

The goal is proxgpu at most 0.7x the floor whose server side is its own (``ssh true`` for live
hosts, the gather through ``ssh`` for trees): one process that reuses its interpreter, keys and
config across hosts should beat a fresh ``ssh`` per host even though it also runs the inspection.
Each side also reports where its CPU went, per host: the client's (proxgpu's process, or the
``ssh`` processes; the cost a real fleet puts on the admin's machine) and the server's (each
connection's sshd and the commands it ran: ``true``, or proxgpu's gather script), read from the
test sshd's reaped children. On a machine of few cores the wall time follows the sum of the two:
what the floor's client spends per host (OpenSSH's default post-quantum key exchange) is what
proxgpu's fan-out can save. Run on a quiet machine: python bench/bench_fleet.py
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.timing import Sample, byte_compiled, interleaved  # noqa: E402
from proxgpu.host.scripts import script_argv  # noqa: E402
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


def inspect(config: Path, tree: Path | None, hosts: int, forks: int) -> None:
    """``proxgpu inspect`` of the first ``hosts`` names, ``forks`` at a time: each host's tree
    ``tree``, or, with ``None``, the host itself."""
    names = ",".join(f"gpu{n}" for n in range(1, hosts + 1))
    argv = [sys.executable, "-m", "proxgpu", "inspect", "--host", names]
    argv += ["--root", str(tree)] if tree is not None else []
    argv += ["--ssh-config", str(config), "--forks", str(forks), "--json"]
    # No timeouts in what is timed: with one, Python polls for the child's exit with sleeps of
    # up to 50 ms.
    subprocess.run(argv, check=True, capture_output=True)


def ssh_fleet(config: Path, hosts: int, forks: int, command: str = "true") -> None:
    """A floor: OpenSSH's own ``ssh NAME COMMAND`` to the same names, ``forks`` at a time."""

    def one(n: int) -> None:
        argv = ["ssh", "-F", str(config), f"gpu{n}", command]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)

    with ThreadPoolExecutor(max_workers=forks) as pool:
        list(pool.map(one, range(1, hosts + 1)))


def gather_command(tree: Path) -> str:
    """The command line proxgpu sends a host to read ``tree`` (run_script's, check included)."""
    return shlex.join(script_argv(str(tree), "gather", str(tree), "check", bulk=True))


GOAL = 0.7


def verdict(many: Sample, floor: Sample) -> str:
    """``many``'s wall time as a ratio to ``floor``'s, held to the goal.

    >>> verdict(Sample(0.5, 0, None), Sample(1.0, 0, None))
    '0.50x (within the 0.7x goal)'
    """
    ratio = many.wall / floor.wall
    return f"{ratio:.2f}x ({'within' if ratio <= GOAL else 'over'} the {GOAL}x goal)"


def compare(server: Sshd, config: Path, tree: Path, hosts: int, forks: int) -> str:
    """Four lines: each floor's median wall time, then for each kind of host (live, tree)
    proxgpu's, its ratio to the floor whose server side is its own (a tree's also to ``ssh
    true``), and each side's CPU per host, client and server. All run in turns (see
    bench.timing.interleaved)."""
    floors = {"ssh true": "true", "ssh running the tree's gather": gather_command(tree)}
    actions: dict[str, Callable[[], object]] = {
        name: partial(ssh_fleet, config, hosts, forks, command) for name, command in floors.items()
    }
    for kind, root in (("live hosts", None), ("trees", tree)):
        actions[kind] = partial(inspect, config, root, hosts, forks)
    taken = interleaved(actions, RUNS, server=server.served_cpu_seconds)
    true, same = taken["ssh true"], taken["ssh running the tree's gather"]
    live, trees = taken["live hosts"], taken["trees"]
    return "\n".join(
        [
            f"{hosts} hosts, --forks {forks}: ssh true fan-out {true.wall:.2f} s "
            f"(per host: {true.cpu_line(hosts)})",
            f"    proxgpu, live hosts: {live.wall:.2f} s, ratio {verdict(live, true)}; "
            f"per host: {live.cpu_line(hosts)}",
            f"  ssh running the tree's gather, fanned out: {same.wall:.2f} s "
            f"(per host: {same.cpu_line(hosts)})",
            f"    proxgpu, trees: {trees.wall:.2f} s, ratio {verdict(trees, same)}, "
            f"{trees.wall / true.wall:.2f}x of ssh true; per host: {trees.cpu_line(hosts)}",
        ]
    )


def main() -> None:
    byte_compiled(REPO / "proxgpu")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        tree = work / "ct200"
        shutil.copytree(REPO / "examples/hosts/ct200", tree, symlinks=True)
        (work / "sshd").mkdir()
        with running_sshd(work / "sshd") as server:
            config = work / "ssh_config"
            write_config(server, config)
            for hosts in (16, 64):
                for forks in (5, 16):
                    print(compare(server, config, tree, hosts, forks), flush=True)


if __name__ == "__main__":
    main()
