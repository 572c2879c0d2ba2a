"""Bind this process to one NUMA node, CPUs and memory, without numactl: what
``numactl --cpunodebind=K --membind=K`` does, for ``proxgpu run``.

The CPUs go through :func:`os.sched_setaffinity`; the memory through ``set_mempolicy(MPOL_BIND)``,
which Python does not wrap and glibc does not either (libnuma does), so it is called through
libc's ``syscall``. Both bind the calling thread, and both survive ``execve``: the command
``run`` execs next inherits them (set_mempolicy(2), sched_setaffinity(2)). The kernel reads the
node mask as ``maxnode - 1`` bits (``get_nodes`` in mm/mempolicy.c decrements it first), so
``maxnode`` is one more than the mask's bits, as libnuma passes it.
"""

from __future__ import annotations

import ctypes
import os
import platform

from proxgpu.errors import ProxgpuError

#: ``MPOL_BIND`` in linux/mempolicy.h: allocate only from the given nodes.
MPOL_BIND = 2
#: ``__NR_set_mempolicy`` by machine: x86_64's table, the generic one (arm64, RISC-V,
#: LoongArch: asm-generic/unistd.h), powerpc's and s390's syscall.tbl.
SET_MEMPOLICY = {
    "x86_64": 238,
    "aarch64": 237,
    "arm64": 237,
    "riscv64": 237,
    "loongarch64": 237,
    "ppc64le": 261,
    "ppc64": 261,
    "s390x": 270,
}
_WORD_BITS = 8 * ctypes.sizeof(ctypes.c_ulong)


def bind_to_node(node: int, cpus: list[int]) -> None:
    """Run this thread, and what it execs, on ``cpus`` with memory from ``node`` only.

    :raises ProxgpuError: when the kernel refuses either (a node or CPUs outside this container's
        cpuset), or on a machine whose syscall number is not known here.
    """
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        raise ProxgpuError(
            f"cannot run on NUMA node {node}'s CPUs: sched_setaffinity: {exc.strerror} "
            "(are they outside this container's cpuset?)"
        ) from None
    number = SET_MEMPOLICY.get(platform.machine())
    if number is None:
        raise ProxgpuError(
            f"cannot bind memory to NUMA node {node} on {platform.machine()}: install numactl"
        )
    words = node // _WORD_BITS + 1
    mask = (ctypes.c_ulong * words)()
    mask[node // _WORD_BITS] = 1 << (node % _WORD_BITS)
    libc = ctypes.CDLL(None, use_errno=True)
    # syscall(2) reads each argument as a long: pass them so, not as C ints.
    maxnode = ctypes.c_ulong(words * _WORD_BITS + 1)
    if libc.syscall(ctypes.c_long(number), ctypes.c_long(MPOL_BIND), mask, maxnode) != 0:
        error = ctypes.get_errno()
        raise ProxgpuError(
            f"cannot bind memory to NUMA node {node}: set_mempolicy: {os.strerror(error)} "
            "(is the node outside this container's cpuset.mems?)"
        )
