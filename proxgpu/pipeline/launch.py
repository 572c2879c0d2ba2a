"""Run a job on the GPUs, CPUs and memory of one NUMA node of this machine, as
:func:`~proxgpu.planning.jobs.place_job` placed it (``proxgpu run``): the runtime's variables
in its environment, bound with ``numactl --cpunodebind=K --membind=K`` when numactl is installed,
else by this process's CPU affinity and memory policy (:mod:`~proxgpu.pipeline.numabind`), which
the command inherits through ``execve``.

>>> from proxgpu.planning.jobs import JobPlacement
>>> job = JobPlacement(runtime="CUDA", numa_node=1, cpus="32-63", gpus=[], environment={},
...                    numbering="CUDA's indexes")
>>> argv, binder = bound_command(job, ["vllm", "serve"])
>>> argv[-2:], binder in ("numactl", BY_PROXGPU)
(['vllm', 'serve'], True)
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from proxgpu.cpulist import parse_cpulist
from proxgpu.errors import ProxgpuError
from proxgpu.pipeline.numabind import bind_to_node
from proxgpu.planning.jobs import JobPlacement

#: As env(1) and the shells: the command was not found, or found but could not be run.
NOT_FOUND = 127
CANNOT_RUN = 126
#: How a job is bound when numactl is not installed.
BY_PROXGPU = "sched_setaffinity and set_mempolicy"


def bound_command(job: JobPlacement, command: Sequence[str]) -> tuple[list[str], str]:
    """The command line that runs ``command`` bound to the job's node, and what binds it
    (``numactl``, or this process before it execs: :data:`BY_PROXGPU`)."""
    numactl = shutil.which("numactl")
    if numactl is None:
        return list(command), BY_PROXGPU
    node = job.numa_node
    return [numactl, f"--cpunodebind={node}", f"--membind={node}", "--", *command], "numactl"


def run_job(job: JobPlacement, argv: list[str], binder: str) -> NoReturn:
    """Replace this process with ``argv`` (from :func:`bound_command`), in the job's
    environment: the variables it sets, without those it unsets.

    :raises ProxgpuError: when the binding is refused, or exiting 127 when the command is not
        found, 126 when it cannot run.
    """
    environment = {k: v for k, v in os.environ.items() if k not in job.unset}
    environment.update(job.environment)
    if binder == BY_PROXGPU:
        bind_to_node(job.numa_node, parse_cpulist(job.cpus))
    _exec(argv, environment)


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


def _exec(argv: list[str], environment: dict[str, str]) -> NoReturn:
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
