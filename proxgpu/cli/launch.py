"""``proxgpu run --tp N -- COMMAND...``: run a job on N GPUs of one NUMA node of this machine.

The choice is the library's (:func:`~proxgpu.planning.jobs.place_job`, from this machine's
inventory, or ``--root DIR``'s); here it becomes the job's environment and binding: the runtime's
variables, ``numactl --cpunodebind=K --membind=K`` when numactl is installed, else the kernel's
CPU affinity and memory policy set on this process (:mod:`~proxgpu.cli.numabind`), which the
command inherits through ``execve``. One line on stderr says what was chosen; ``--dry-run``
prints the environment and the command instead of running it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

from proxgpu.cli.commandline import CommandLine
from proxgpu.cli.hosts import open_host
from proxgpu.cli.numabind import bind_to_node
from proxgpu.cpulist import parse_cpulist
from proxgpu.errors import ProxgpuError, UsageError
from proxgpu.inspection import inspect
from proxgpu.planning.jobs import JobPlacement, place_job

#: As env(1) and the shells: the command was not found, or found but could not be run.
NOT_FOUND = 127
CANNOT_RUN = 126
#: How ``run`` binds the job when numactl is not installed.
BY_PROXGPU = "sched_setaffinity and set_mempolicy"


def cmd_run(line: CommandLine) -> int:
    """Choose the GPUs, CPUs and memory node, then exec the command bound to them."""
    if not line.job:
        raise UsageError("name the command to run: proxgpu run --tp N -- COMMAND...")
    with open_host(line) as host:
        inventory = inspect(host, line.gpus)
    # This machine's limits (a container's cpuset shows in the affinity the kernel gives every
    # process in it) apply to this machine only: a --root tree is described as it is.
    usable = None if line.root is not None else os.sched_getaffinity(0)
    job = place_job(inventory, line.tp, line.node, usable)
    if line.root is not None and not line.dry_run and not same_machine(line.root):
        # The tree describes another machine: its GPUs' indexes and CPUs are not this one's.
        raise UsageError(
            f"--root {line.root} describes another host, so the command would run here bound to "
            "its GPUs and CPUs: add --dry-run to see what that host would get, or run it there"
        )
    numactl = shutil.which("numactl")
    node = job.numa_node
    bound = [numactl, f"--cpunodebind={node}", f"--membind={node}", "--"] if numactl else []
    argv = [*bound, *line.job]
    dropped = [name for name in job.unset if name in os.environ]
    said = summary(inventory.source, job, "numactl" if numactl else BY_PROXGPU, dropped)
    if not line.quiet:
        print(f"proxgpu: {said}", file=sys.stderr)
    if line.dry_run:
        if line.json:
            document = {"host": inventory.hostname, **job.model_dump(mode="json")}
            print(json.dumps({**document, "command": argv, "summary": said}, indent=2))
        else:
            for key, value in job.environment.items():
                print(f"{key}={shlex.quote(value)}")
            print(shlex.join(argv))
        return 0
    environment = {k: v for k, v in os.environ.items() if k not in job.unset}
    environment.update(job.environment)
    if not numactl:
        bind_to_node(node, parse_cpulist(job.cpus))
    return _exec(argv, environment)


def same_machine(root: str) -> bool:
    """Whether the tree at ``root`` is this machine's (a snapshot taken here): its
    ``/etc/machine-id``, or where neither has one its ``/etc/hostname``, is this machine's.

    >>> same_machine("/"), same_machine("examples/hosts/ct200")
    (True, False)
    """
    for name in ("etc/machine-id", "etc/hostname"):
        here, there = _first_line(Path("/", name)), _first_line(Path(root, name))
        if here or there:
            return here == there
    return False


def _first_line(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip() or None
    except OSError:
        return None


def summary(host: str, job: JobPlacement, binder: str, dropped: list[str]) -> str:
    """The one line ``run`` prints: what it chose, how it binds, how the indexes are meant.

    >>> from proxgpu.planning.placement import GpuPlacement
    >>> gpus = [GpuPlacement(index=i, address=f"0000:{b}:00.0", model=None, numa_node=1)
    ...         for i, b in [(4, "81"), (5, "91")]]
    >>> job = JobPlacement(runtime="CUDA", numa_node=1, cpus="32-63", gpus=gpus,
    ...                    environment={}, numbering="CUDA's indexes")
    >>> summary("pve1", job, "numactl", [])
    "pve1: TP=2 on NUMA node 1: CUDA GPUs 4,5 (0000:81:00.0, 0000:91:00.0), CPUs 32-63 and \
node 1's memory, bound by numactl (CUDA's indexes)"
    """
    indexes = ",".join(str(gpu.index) for gpu in job.gpus)
    addresses = ", ".join(gpu.address for gpu in job.gpus)
    drops = f"; drops the inherited {', '.join(dropped)}" if dropped else ""
    passed = f"; passed over {'; '.join(job.passed_over)}" if job.passed_over else ""
    return (
        f"{host}: TP={len(job.gpus)} on NUMA node {job.numa_node}: {job.runtime} "
        f"{'GPU' if len(job.gpus) == 1 else 'GPUs'} {indexes} "
        f"({addresses}), CPUs {job.cpus} and node {job.numa_node}'s memory, bound by {binder} "
        f"({job.numbering}){drops}{passed}"
    )


def _exec(argv: list[str], environment: dict[str, str]) -> int:
    """Replace this process with the command.

    :raises ProxgpuError: exiting 127 when the command is not found, 126 when it cannot run.
    """
    # exec discards what Python still buffers.
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, environment)
    except FileNotFoundError:
        error = ProxgpuError(f"{argv[0]}: command not found")
        error.exit_code = NOT_FOUND
    except OSError as exc:
        error = ProxgpuError(f"{argv[0]}: cannot run it: {exc.strerror}")
        error.exit_code = CANNOT_RUN
    raise error
