"""Whether the GPUs that would change driver are in use: unbinding a GPU that a process holds
never returns (the nvidia driver waits for its usage count to drop), so the live rebind checks
first, with ``scripts/busy.sh`` (one command, whatever the number of functions).

>>> _persistence_reason("Enabled", 0, [])
'persistence mode is on (nvidia-persistenced keeps it open)'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from proxgpu.errors import DeviceBusyError, HostUnreachableError
from proxgpu.host.base import Host
from proxgpu.host.scripts import ScriptRecord, run_script
from proxgpu.pci import normalize_pci_address


@dataclass(frozen=True, kw_only=True)
class BusyDevice:
    """A function that is in use, and why: who holds its device nodes, persistence mode;
    ``in_kernel`` when something inside the kernel holds it (only a reboot frees it for sure);
    ``removals`` the commands that remove the vGPUs that exist on it or its VFs (its driver
    holds it for them).

    >>> BusyDevice(address="0000:81:00.0", driver="nvidia", reasons=["persistence is on"]).reasons
    ['persistence is on']
    """

    address: str
    driver: str | None
    reasons: list[str]
    in_kernel: bool = False
    removals: list[str] = field(default_factory=list)


def find_busy(host: Host, addresses: Sequence[str], timeout: float = 60.0) -> list[BusyDevice]:
    """The functions among ``addresses`` that are in use, in one command.

    A function is busy when a process holds its device node (``/dev/nvidia<minor>`` for nvidia,
    ``/dev/vfio/<group>`` for vfio-pci, ``/dev/dri/by-path/pci-<addr>-{card,render}`` otherwise;
    all under ``host.root``), or, for nvidia, when persistence mode is on or cannot be read; and
    whatever its driver, while a vGPU exists on it or on one of its SR-IOV virtual functions (a
    mediated device, a VF's NVIDIA vGPU type): the driver that made it holds the GPU.

    :raises HostUnreachableError: when the host cannot run the check.
    """
    output = run_script(
        host, "busy", host.root.rstrip("/"), *addresses, timeout=timeout, check=False
    )
    if not output.has("fn") and addresses:
        raise HostUnreachableError(host.name, f"busy check failed: {output.stderr.strip()}")
    return _busy_from(output.records, addresses)


def _busy_from(records: Sequence[ScriptRecord], addresses: Sequence[str]) -> list[BusyDevice]:
    drivers: dict[str, str | None] = {}
    reasons: dict[str, list[str]] = {a: [] for a in addresses}
    removals: dict[str, list[str]] = {a: [] for a in addresses}
    smi_rc, smi_lines = None, []
    kernel = _KernelClients.of(records)
    in_kernel: set[str] = set()
    for record in records:
        word, fields = record.kind, record.fields
        if word == "fn":
            drivers[fields[0]] = None if fields[1] == "-" else fields[1]
        elif word == "holder":
            address, pid, node, comm = fields
            reasons[address].append(f"{node} is held by pid {pid} ({comm})")
        elif word == "nominor":
            reasons[fields[0]].append("its /dev/nvidia minor is unknown (no procfs information)")
        elif word == "nofuser":
            reasons[fields[0]].append(f"fuser is missing, so who holds {fields[1]} is unknown")
        elif word == "mdev":
            address, holder, uuid, kind = fields
            where = "" if holder == address else f" on its VF {holder}"
            reasons[address].append(f"mediated device {uuid} ({kind}) exists{where}")
            removals[address].append(f"echo 1 > /sys/bus/mdev/devices/{uuid}/remove")
        elif word == "vfvgpu":
            address, vf, kind = fields
            reasons[address].append(f"its VF {vf} holds a vGPU (type nvidia-{kind})")
            removals[address].append(f"echo 0 > /sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type")
        elif word == "smi":
            smi_rc = int(fields[0])
        elif word == "smiline":
            smi_lines.append(fields[0])
    persistence = _persistence(smi_lines) if smi_rc == 0 else {}
    for address, driver in drivers.items():
        if driver == "nvidia":
            held_inside = kernel.reasons(address)
            if held_inside:
                in_kernel.add(address)
            reasons[address] += held_inside
            mode = persistence.get(address)
            if mode != "Disabled":
                reasons[address].append(_persistence_reason(mode, smi_rc, smi_lines))
    return [
        BusyDevice(
            address=a,
            driver=drivers.get(a),
            reasons=r,
            in_kernel=a in in_kernel,
            removals=removals[a],
        )
        for a, r in reasons.items()
        if r
    ]


@dataclass(frozen=True)
class _KernelClients:
    """What holds nvidia GPUs inside the kernel, where fuser cannot see it: a framebuffer on the
    GPU (nvidia_drm's fbdev, which the console may be bound to), or nvidia_drm loaded with
    ``modeset=Y fbdev=Y``, which gives every GPU one. nvidia's unbind waits for them forever."""

    framebuffers: dict[str, list[str]]
    console: bool
    nvidia_drm: tuple[str, str] | None

    @classmethod
    def of(cls, records: Sequence[ScriptRecord]) -> _KernelClients:
        framebuffers: dict[str, list[str]] = {}
        for record in records:
            if record.kind == "fb":
                framebuffers.setdefault(record.fields[0], []).append(record.fields[1])
        return cls(
            framebuffers=framebuffers,
            console=any(record.kind == "fbcon" for record in records),
            nvidia_drm=next(((r[0], r[1]) for r in records if r.kind == "nvdrm"), None),
        )

    def reasons(self, address: str) -> list[str]:
        found = [
            f"{name} sits on it{' with the console bound to it (fbcon)' if self.console else ''}"
            ", an in-kernel client fuser cannot see"
            for name in self.framebuffers.get(address, [])
        ]
        if not found and self.nvidia_drm == ("Y", "Y"):
            found.append("nvidia_drm runs with modeset=Y fbdev=Y, whose framebuffer holds it")
        return found


def _persistence(lines: list[str]) -> dict[str, str]:
    modes = {}
    for line in lines:
        bus_id, _, mode = line.partition(",")
        try:
            modes[normalize_pci_address(bus_id)] = mode.strip()
        except ValueError:
            continue  # a warning nvidia-smi printed among the rows
    return modes


def _persistence_reason(mode: str | None, rc: int | None, lines: list[str]) -> str:
    if mode == "Enabled":
        return "persistence mode is on (nvidia-persistenced keeps it open)"
    if rc != 0:
        detail = lines[-1] if lines else f"exit status {rc}"
        return f"persistence mode cannot be read (nvidia-smi: {detail}), so it counts as in use"
    return f"persistence mode is {mode or 'not reported'}, so it counts as in use"


def check_not_busy(host: Host, addresses: Sequence[str]) -> None:
    """Refuse when any function among ``addresses`` is in use (see :func:`find_busy`).

    :raises DeviceBusyError: naming each busy function, why, and what to do.
    """
    busy = find_busy(host, addresses)
    if busy:
        described = "; ".join(f"{b.address} ({b.driver}): {', '.join(b.reasons)}" for b in busy)
        raise DeviceBusyError(
            host.name,
            [b.address for b in busy],
            f"in use, so unbinding could block the kernel: {described}; {_what_to_do(busy)}",
        )


def _what_to_do(busy: list[BusyDevice]) -> str:
    """What frees the busy functions, for the refusal."""
    if any(b.in_kernel for b in busy):
        return (
            "apply without --live and reboot (or load nvidia_drm with modeset=0 and unbind "
            "the console: echo 0 > /sys/class/vtconsole/vtcon1/bind)"
        )
    removals = [command for b in busy for command in b.removals]
    if removals:
        return (
            "stop the VMs using those vGPUs; if nothing uses one, remove it "
            f"({'; '.join(removals)}); then plan again, since a GPU serving vGPUs stays on its "
            "host driver"
        )
    return (
        "stop the processes (and the containers) using these GPUs and turn persistence off "
        "(nvidia-smi -i <address> -pm 0, or stop nvidia-persistenced), then retry"
    )
