"""``proxgpu run --tp N -- COMMAND...``: run a job on N GPUs of one NUMA node of this machine.

The choice is the library's (:func:`~proxgpu.planning.jobs.place_job`, from this machine's
inventory, or ``--root DIR``'s), and so are the binding and the exec
(:mod:`~proxgpu.pipeline.launch`); here they are said: one line on stderr says what was chosen,
``--dry-run`` prints the environment and the command instead of running it.
"""

from __future__ import annotations

import json
import os
import shlex
import sys

from proxgpu.cli.commandline import CommandLine
from proxgpu.cli.hosts import open_host
from proxgpu.errors import UsageError
from proxgpu.inspection import inspect
from proxgpu.model import plain
from proxgpu.pipeline.launch import bound_command, run_job, same_machine
from proxgpu.planning.jobs import JobPlacement, place_job


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
    argv, binder = bound_command(job, line.job)
    dropped = [name for name in job.unset if name in os.environ]
    said = summary(inventory.source, job, binder, dropped)
    if not line.quiet:
        print(f"proxgpu: {said}", file=sys.stderr)
    if line.dry_run:
        if line.json:
            document = {"host": inventory.hostname, **plain(job)}
            print(json.dumps({**document, "command": argv, "summary": said}, indent=2))
        else:
            for key, value in job.environment.items():
                print(f"{key}={shlex.quote(value)}")
            print(shlex.join(argv))
        return 0
    run_job(job, argv, binder)


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
