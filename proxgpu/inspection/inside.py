"""What each running guest holds of its GPUs, asked from the host (``scripts/inside.sh``).

A container is asked the way ``pct exec --keep-env 0`` runs a command in it (``lxc-attach``
with the environment cleared): NVIDIA's own tool, ``nvidia-smi --query-gpu=uuid,pci.bus_id
--format=csv,noheader``, lists the GPUs NVML opens there, each as its UUID and its PCI address
(with an eight-digit domain, ``00000000:01:00.0``). The tool is the container's, so what it
prints is hostile: bounded in bytes and time, and believed only line by line in that form.
A VM's QEMU is found the way qemu-server finds it (``vm_running_locally``: the PID in
``/var/run/qemu-server/VMID.pid``, whose command line names that file); the IOMMU groups it
holds are the ``/dev/vfio/N`` among its open files.

>>> answer = "GPU-00002100-0000-0000-0000-000000000000, 00000001:21:00.0\\n"
>>> smi_listing(answer)
(('GPU-00002100-0000-0000-0000-000000000000', '0001:21:00.0'),)
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from proxgpu.errors import CommandTimeoutError
from proxgpu.host.base import Host
from proxgpu.host.scripts import ScriptOutput, run_script
from proxgpu.inspection.containerlibs import exit_word
from proxgpu.inspection.smi import GPU_UUID
from proxgpu.pci import normalize_pci_address

#: Seconds the container's nvidia-smi (and each lxc-info) may take: NVML can wait on a GPU
#: being reset.
INSIDE_SECONDS = 20
#: The most bytes of a container's answer read: a line per GPU.
INSIDE_LIMIT = 65536

_GROUP = re.compile(r"/dev/vfio/([0-9]{1,6})", re.ASCII)

#: How a container's question ended: ``listed`` (``gpus`` holds what the tool listed),
#: ``stopped``, ``other`` (another state: ``detail``), ``unasked`` (lxc-info failed: ``detail``),
#: ``no tool`` (no nvidia-smi in it), ``silent`` (no answer in time), ``failed`` (the tool
#: failed: ``detail`` holds its exit and first line).
Outcome = Literal["listed", "stopped", "other", "unasked", "no tool", "silent", "failed"]


@dataclass(frozen=True)
class ContainerSight:
    """What NVIDIA's tool lists inside container ``vmid``, or why it listed nothing.

    >>> ContainerSight(200, "stopped").gpus
    ()
    """

    vmid: int
    outcome: Outcome
    detail: str = ""
    #: (UUID, PCI address) of each GPU listed, in the tool's order.
    gpus: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class VmSight:
    """The IOMMU groups VM ``vmid``'s QEMU (``pid``; ``None``: not running, or, with ``why``,
    not asked) holds open.

    >>> VmSight(300, None).running
    False
    """

    vmid: int
    pid: int | None
    groups: frozenset[int] = frozenset()
    why: str = ""

    @property
    def running(self) -> bool:
        """Whether the VM's QEMU was found running."""
        return self.pid is not None


def look_inside(
    host: Host, containers: Iterable[int], vms: Iterable[int]
) -> tuple[list[ContainerSight], list[VmSight]]:
    """Ask each container what its GPUs are and find the IOMMU groups each VM's QEMU holds, in
    one script run on ``host`` (a live one: a directory of host files runs no guests).

    Each question has its own deadline; a host whose answer takes longer than all of them
    together (a process stuck in the kernel outlives even a kill) leaves every guest unasked.
    """
    cts, machines = list(containers), list(vms)
    args = [arg for vmid in cts for arg in ("ct", str(vmid))]
    args += [arg for vmid in machines for arg in ("vm", str(vmid))]
    if not args:
        return [], []
    seconds = len(cts) * 2 * (INSIDE_SECONDS + 5) + len(machines) * 5 + 15
    try:
        output = run_script(
            host, "inside", str(INSIDE_SECONDS), str(INSIDE_LIMIT), *args, timeout=seconds
        )
    except CommandTimeoutError:
        why = f"the host did not answer within {seconds} s"
        return [ContainerSight(v, "unasked", why) for v in cts], [
            VmSight(v, None) for v in machines
        ]
    return [_container(output, vmid) for vmid in cts], [_vm(output, vmid) for vmid in machines]


def _container(output: ScriptOutput, vmid: int) -> ContainerSight:
    key = str(vmid)
    state = next((r.fields[1:] for r in output.of("ct") if r.fields[:1] == (key,)), None)
    if state is None:
        return ContainerSight(vmid, "unasked", "the host's answer names it nowhere")
    if state[:1] == ("failed",):
        status = state[1] if len(state) > 1 else ""
        return ContainerSight(
            vmid, "unasked", f"lxc-info -n {vmid} -s failed ({exit_word(status)})"
        )
    word = state[0] if state else "-"
    if word != "RUNNING":
        return (
            ContainerSight(vmid, "stopped")
            if word == "STOPPED"
            else ContainerSight(
                vmid, "other", "in no state lxc-info names" if word == "-" else word
            )
        )
    answer = next((r.fields[1:] for r in output.of("smi") if r.fields[:1] == (key,)), None)
    if answer is None or len(answer) != 2:
        return ContainerSight(vmid, "unasked", "the host's answer names it nowhere")
    return _answered(vmid, *answer)


def _answered(vmid: int, status: str, encoded: str) -> ContainerSight:
    """The tool's answer: ``status`` is lxc-attach's exit status, as the host saw it (``-``:
    it did not end in time), never read from the tool's own text."""
    try:
        text = (
            ""
            if encoded == "-"
            else base64.b64decode(encoded, validate=True).decode("utf-8", "replace")
        )
    except (binascii.Error, ValueError):
        return ContainerSight(vmid, "failed", "its answer is no base64")
    if len(text.encode()) >= INSIDE_LIMIT:
        return ContainerSight(vmid, "failed", f"more than {INSIDE_LIMIT} bytes, cut short")
    if status in ("-", "124", "137"):
        return ContainerSight(vmid, "silent", f"no answer within {INSIDE_SECONDS} s")
    if status == "127":
        return ContainerSight(vmid, "no tool")
    first = _printable(next((ln for ln in text.splitlines() if ln.strip()), ""))
    if status != "0":
        return ContainerSight(
            vmid, "failed", f"exit {status}: {first}" if first else f"exit {status}"
        )
    try:
        return ContainerSight(vmid, "listed", gpus=smi_listing(text))
    except ValueError as error:
        return ContainerSight(vmid, "failed", str(error))


def smi_listing(text: str) -> tuple[tuple[str, str], ...]:
    """``(UUID, PCI address)`` of each line of ``nvidia-smi --query-gpu=uuid,pci.bus_id
    --format=csv,noheader``, the address in sysfs's form.

    >>> smi_listing("GPU-1, 0000:01:00.0\\n")
    Traceback (most recent call last):
    ...
    ValueError: not a GPU's UUID and PCI address: GPU-1, 0000:01:00.0
    """
    found = []
    for line in text.splitlines():
        if not line.strip():
            continue
        uuid, _, bus = (part.strip() for part in line.partition(","))
        try:
            address = normalize_pci_address(bus)
        except ValueError:
            address = ""
        if not GPU_UUID.fullmatch(uuid) or address.count(".") != 1:
            raise ValueError(f"not a GPU's UUID and PCI address: {_printable(line)}")
        found.append((uuid, address))
    return tuple(found)


def _vm(output: ScriptOutput, vmid: int) -> VmSight:
    key = str(vmid)
    state = next((r.fields[1:] for r in output.of("vm") if r.fields[:1] == (key,)), None)
    if state is None:
        return VmSight(vmid, None, why="the host's answer names it nowhere")
    if state[:1] != ("running",) or len(state) < 2 or not state[1].isdigit():
        return VmSight(vmid, None)
    links = next((r.fields[1] for r in output.of("vfio") if r.fields[:1] == (key,)), "")
    try:
        targets = base64.b64decode(links, validate=True).decode("utf-8", "replace").split("\0")
    except (binascii.Error, ValueError):
        targets = []
    groups = {int(m[1]) for target in targets if (m := _GROUP.fullmatch(target))}
    return VmSight(vmid, int(state[1]), frozenset(groups))


def _printable(text: str) -> str:
    """A line of a guest's answer fit to quote: printable characters only, at most 200."""
    return "".join(c if c.isprintable() else "?" for c in text.strip())[:200]
