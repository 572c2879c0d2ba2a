"""Verify at the guests: what each planned container holds of NVIDIA's user space, read from the
host, and, from inside each running guest, what it holds of its GPUs.

A container given NVIDIA GPUs must hold the user space of the host's nvidia module: one that
holds another version (after a host driver upgrade, typically) is drift, wherever the host can
read it (:mod:`proxgpu.inspection.containerlibs`). Inside a running container, NVIDIA's own tool
must list exactly the GPUs the plan gives it, by UUID; a running VM's QEMU must hold open the
IOMMU group of every function the plan gives it (:mod:`proxgpu.inspection.inside`). A guest that
could not be checked (stopped, locked, without nvidia-smi, silent) is said so, with what to do:
never as a pass, and not as drift either (a stopped guest is no difference from the apply).

>>> GuestCheck(guest="CT 200", verdict="unchecked", line="CT 200 is stopped").verdict
'unchecked'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from proxgpu.apply.remote import describe
from proxgpu.errors import ProxgpuError
from proxgpu.host.base import Host
from proxgpu.inspection.containerlibs import read_container_libs
from proxgpu.inspection.inside import ContainerSight, VmSight, look_inside
from proxgpu.inspection.inventory import Inventory
from proxgpu.paths import guest_config
from proxgpu.pci import NVIDIA_DRIVER
from proxgpu.planning.advice import userspace_needs
from proxgpu.planning.model import Plan
from proxgpu.planning.userspace import UserSpace, holding
from proxgpu.pve.config import GuestConfig

Verdict = Literal["ok", "drift", "unchecked"]


@dataclass(frozen=True, kw_only=True)
class GuestCheck:
    """One finding of verify at a guest: ``verdict`` ``ok``, ``drift`` or ``unchecked`` (it
    could not be looked at: ``line`` says why and what to do), and the ``line`` saying it."""

    guest: str
    verdict: Verdict
    line: str


def guest_checks(host: Host, inventory: Inventory, plan: Plan) -> list[GuestCheck]:
    """What verify finds at the guests ``plan`` gives GPUs: the user space each container holds
    and, on a live host, what each running guest holds of its GPUs.

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> from proxgpu.planning import SplitPolicy, plan_split
    >>> tree = DirectoryHost("examples/hosts/ct200")
    >>> inventory = inspect(tree)
    >>> plan = plan_split(inventory, SplitPolicy(lxc=200))
    >>> [check.verdict for check in guest_checks(tree, inventory, plan)]
    ['unchecked']
    """
    needs = userspace_needs(inventory, plan.groups)
    try:
        checks = _userspace_checks(host, inventory, needs)
        inside = _inside_checks(host, inventory, plan, needs) if host.is_live else []
    except ProxgpuError as exc:
        # The host's own drift stands on its own: guests that could not be asked are said.
        containers, vms = planned_guests(inventory, plan)
        guests = [f"CT {vmid}" for vmid in containers] + [f"VM {vmid}" for vmid in vms]
        line = f"not looked at: asking the host failed ({describe(exc)}); verify again"
        return [GuestCheck(guest=g, verdict="unchecked", line=f"{g}: {line}") for g in guests]
    # A container whose NVIDIA tool listed its GPUs inside it holds a working user space,
    # whatever libraries the host read in it; NVML failing on a version mismatch the host read
    # already is said once, with the fix.
    passed = {check.guest for check in inside if check.verdict == "ok"}
    drifted = {check.guest for check in checks if check.verdict == "drift"}
    checks = [check for check in checks if check.guest not in passed]
    return checks + [c for c in inside if not (c.guest in drifted and "mismatch" in c.line)]


def _userspace_checks(host: Host, inventory: Inventory, needs: list[UserSpace]) -> list[GuestCheck]:
    """A container found to hold another user space than the host's module is drift; one whose
    libraries could not be read, or that holds none, is said with what to do."""
    if not needs or inventory.nvidia_driver_version is None:
        return []
    held = holding(needs, read_container_libs(host, inventory, [need.vmid for need in needs]))
    checks = []
    for need in held:
        found = need.holds
        if found is None or need.met:
            continue
        mismatch = found.known and found.nvml is not None
        verdict: Verdict = "drift" if mismatch else "unchecked"
        checks.append(GuestCheck(guest=f"CT {need.vmid}", verdict=verdict, line=need.step()))
    return checks


def _inside_checks(
    host: Host, inventory: Inventory, plan: Plan, needs: list[UserSpace]
) -> list[GuestCheck]:
    containers, vms = planned_guests(inventory, plan)
    # A backup, migration or snapshot holds a guest's lock: it is not looked into meanwhile.
    locks = {f"CT {v}": lock for v in containers if (lock := _lock(inventory, "lxc", v))}
    locks |= {f"VM {v}": lock for v in vms if (lock := _lock(inventory, "vm", v))}
    ask_ct = [vmid for vmid in containers if f"CT {vmid}" not in locks]
    ask_vm = [vmid for vmid in vms if f"VM {vmid}" not in locks]
    cts, machines = look_inside(host, ask_ct, ask_vm)
    fixes = {need.vmid: need for need in needs}
    checks = [_locked(guest, lock) for guest, lock in locks.items()]
    instances: dict[int, list[str]] = {}
    for use in (use for group in plan.groups for use in group.mig):
        instances.setdefault(use.vmid, []).append(f"GI {use.gi} CI {use.ci}")
    checks += [
        _container(inventory, c, containers[c.vmid], fixes.get(c.vmid), instances.get(c.vmid))
        for c in cts
    ]
    checks += [_vm(inventory, v, vms[v.vmid]) for v in machines]
    return checks


def planned_guests(
    inventory: Inventory, plan: Plan
) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """The containers ``plan`` gives GPUs kept on NVIDIA's module (each with those GPUs'
    addresses), and the VMs it gives functions on vfio-pci (each with those functions).

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> from proxgpu.planning import SplitPolicy, plan_split
    >>> inventory = inspect(DirectoryHost("examples/hosts/ct200"))
    >>> plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))
    >>> cts, vms = planned_guests(inventory, plan)
    >>> {vmid: len(gpus) for vmid, gpus in cts.items()}, {vmid: len(f) for vmid, f in vms.items()}
    ({200: 4}, {300: 8})
    """
    containers: dict[int, list[str]] = {}
    vms: dict[int, list[str]] = {}
    # A GPU gone from the host since the apply is still expected inside (and missed there).
    drivers = {gpu.address: gpu.host_driver for gpu in inventory.gpus}
    for group in plan.groups:
        for guest in group.guests:
            if group.role.moves_to_vfio and guest.type == "vm":
                vms.setdefault(guest.vmid, []).extend(group.functions)
            elif not group.role.moves_to_vfio and group.role.serves == "lxc":
                nvidia = [a for a in group.gpus if drivers.get(a, NVIDIA_DRIVER) == NVIDIA_DRIVER]
                if nvidia:
                    containers.setdefault(guest.vmid, []).extend(nvidia)
    # A GPU shared by several groups of one guest (MIG instances of it) is expected once.
    unique = {vmid: list(dict.fromkeys(found)) for vmid, found in containers.items()}
    return unique, {vmid: list(dict.fromkeys(found)) for vmid, found in vms.items()}


def _lock(inventory: Inventory, kind: Literal["lxc", "vm"], vmid: int) -> str | None:
    return GuestConfig.parse(inventory.guest_configs.get(guest_config(kind, vmid), "")).get("lock")


def _locked(guest: str, lock: str) -> GuestCheck:
    line = f"{guest} is locked ({lock}): not looked at from inside; verify again once it is not"
    return GuestCheck(guest=guest, verdict="unchecked", line=line)


def _container(
    inventory: Inventory,
    sight: ContainerSight,
    gpus: list[str],
    need: UserSpace | None,
    instances: list[str] | None = None,
) -> GuestCheck:
    vmid = sight.vmid
    guest = f"CT {vmid}"
    skip = "or verify without the guests (--no-guests)"
    unchecked = {
        "stopped": f"{guest} is stopped: not looked at from inside; start it (pct start {vmid}) "
        f"and verify again, {skip}",
        "other": f"{guest} is {sight.detail}: not looked at from inside; verify again once it runs",
        "unasked": f"{guest}: not looked at from inside: {sight.detail}; pct status {vmid} on "
        "its node tells whether it runs there",
        "no tool": f"{guest} has no nvidia-smi: not looked at from inside; install nvidia-smi "
        f"in it (NVIDIA's user space of the host's version has it), {skip}",
        "silent": f"{guest}: nvidia-smi inside it gave {sight.detail}; see why with pct exec "
        f"{vmid} -- nvidia-smi",
    }
    if sight.outcome in unchecked:
        return GuestCheck(guest=guest, verdict="unchecked", line=unchecked[sight.outcome])
    if sight.outcome == "failed":
        fix = f": {need.step()}" if need is not None and "mismatch" in sight.detail else ""
        line = f"{guest}: nvidia-smi inside it fails ({sight.detail}){fix}"
        return GuestCheck(guest=guest, verdict="drift", line=line)
    return _compare(inventory, guest, sight.gpus, gpus, instances)


def _compare(
    inventory: Inventory,
    guest: str,
    listed: tuple[tuple[str, str], ...],
    gpus: list[str],
    instances: list[str] | None = None,
) -> GuestCheck:
    """The GPUs listed inside against those planned: by UUID where the host knows it. A
    container of MIG ``instances`` is checked for their GPUs: nvidia-smi's GPU list does not
    name MIG devices, and the line says so rather than claim them."""
    uuids = {gpu.nvidia_uuid: gpu.address for gpu in inventory.gpus if gpu.nvidia_uuid}
    seen = {uuids.get(uuid, address): uuid for uuid, address in listed}
    named = {gpu.address: gpu.nvidia_uuid for gpu in inventory.gpus}
    extra = [f"{a} ({seen[a]})" for a in seen if a not in gpus]
    missing = [f"{a} ({named.get(a) or 'UUID unknown'})" for a in gpus if a not in seen]
    said = []
    if extra:
        said.append(f"lists {', '.join(extra)}, which the plan does not give it")
    if missing:
        said.append(f"does not list {', '.join(missing)}, which the plan gives it")
    if said:
        line = f"{guest}: nvidia-smi inside it {'; it '.join(said)}"
        return GuestCheck(guest=guest, verdict="drift", line=line)
    if not instances:
        line = f"{guest}: nvidia-smi inside it lists exactly its GPUs, {', '.join(gpus)}"
        return GuestCheck(guest=guest, verdict="ok", line=line)
    line = (
        f"{guest}: nvidia-smi inside it lists exactly the GPUs of its MIG instances "
        f"({', '.join(instances)}), {', '.join(gpus)}; which MIG devices it sees is not checked"
    )
    return GuestCheck(guest=guest, verdict="ok", line=line)


def _vm(inventory: Inventory, sight: VmSight, functions: list[str]) -> GuestCheck:
    guest = f"VM {sight.vmid}"
    if sight.why:
        line = f"{guest}: not looked at from inside: {sight.why}"
        return GuestCheck(guest=guest, verdict="unchecked", line=line)
    if not sight.running:
        line = (
            f"{guest} is not running: not looked at; start it (qm start {sight.vmid}) and "
            "verify again, or verify without the guests (--no-guests)"
        )
        return GuestCheck(guest=guest, verdict="unchecked", line=line)
    known = inventory.gpu_functions
    groups = {a: known[a].iommu_group if a in known else None for a in functions}
    gone = [address for address in functions if groups[address] is None]
    if gone:
        line = f"{guest}: {', '.join(gone)} not found on the host (or in no IOMMU group)"
        return GuestCheck(guest=guest, verdict="drift", line=line)
    loose = [
        f"{address} (/dev/vfio/{groups[address]})"
        for address in functions
        if groups[address] not in sight.groups
    ]
    if loose:
        line = (
            f"{guest}: its QEMU (PID {sight.pid}) does not hold {', '.join(loose)}: the VM "
            "runs without them; restart it (qm stop, qm start) to take them"
        )
        return GuestCheck(guest=guest, verdict="drift", line=line)
    line = f"{guest}: its QEMU (PID {sight.pid}) holds every planned function's IOMMU group"
    return GuestCheck(guest=guest, verdict="ok", line=line)
