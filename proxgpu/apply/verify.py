"""Verify: compare the host with an applied journal entry (its files and plan) or with a plan.

The files proxgpu owns are compared byte for byte; in the files it only edits (guest configs,
the PCI mapping file, the kernel command line) only what it changed counts, so that an edit of
anything else (a VM snapshot, a new tag) is no drift. Past the host's edge, the guests are
looked at too (:mod:`proxgpu.apply.guests`): the user space each container holds, and what each
running guest holds of its GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxgpu.apply.entries import entry_drift, partly_ours
from proxgpu.apply.guests import GuestCheck, guest_checks
from proxgpu.apply.journal import JournalEntry, read_journal, select_entry
from proxgpu.apply.layout import Layout
from proxgpu.apply.remote import probe
from proxgpu.apply.trust import check_trusted
from proxgpu.apply.why import why_not_vfio
from proxgpu.errors import UsageError
from proxgpu.host.base import Host
from proxgpu.host.scripts import read_files
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Inventory
from proxgpu.paths import MODPROBE_CONF, with_guest
from proxgpu.pci import VFIO_DRIVER
from proxgpu.planning.mig import mig_drift
from proxgpu.planning.model import Plan
from proxgpu.rendering.binding import softdep_drift
from proxgpu.rendering.conflicts import binding_conflicts


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """Whether the host still matches an apply: ``drift`` holds one line per difference.

    >>> VerifyReport(host="pve1", drifted=False).drift
    []
    """

    host: str
    drifted: bool
    drift: list[str] = field(default_factory=list)
    #: Functions not yet on their planned driver because the host has not rebooted since the
    #: apply that needs it: expected, not drift.
    pending_reboot: list[str] = field(default_factory=list)
    #: The driver each function the plan moves to vfio-pci is bound to now (``None``: none), when
    #: the drivers were read.
    moved: dict[str, str | None] = field(default_factory=dict)
    #: What was found at each guest the plan gives GPUs; a ``drift`` one's line is in ``drift``
    #: too, an ``unchecked`` one is no pass (it says why and what to do).
    guests: list[GuestCheck] = field(default_factory=list)


def applied_entry(
    host: Host, to: str | None = None, *, trust_unsigned: bool = False
) -> JournalEntry:
    """The journal entry ``to``, or the last applied one (what ``verify`` compares with), made
    for ``host`` and, unless ``trust_unsigned``, signed and in its place in the chain
    (:mod:`proxgpu.apply.trust`): an entry edited by hand says nothing about the host.

    :raises UsageError: when there is none (or none named ``to``).
    :raises JournalError: when the entry is not to be trusted.
    """
    journal = read_journal(host, to=to, latest=("applied",))
    entry = select_entry(host, journal, to, latest=("applied",))
    if entry is None:
        raise UsageError(f"{host.name}: no applied entry in the journal (see proxgpu history)")
    check_trusted(host, journal, entry, trust_unsigned=trust_unsigned)
    return entry


def verify(
    host: Host,
    target: JournalEntry | Plan | None = None,
    *,
    inventory: Inventory | None = None,
    guests: bool = True,
) -> VerifyReport:
    """Compare the host with an applied journal entry (its files and plan; by default the last
    applied, as ``proxgpu verify`` does) or with a plan alone.

    >>> from proxgpu.host import DirectoryHost
    >>> verify(DirectoryHost("examples/hosts/ct200"))
    Traceback (most recent call last):
    ...
    proxgpu.errors.UsageError: dir:examples/hosts/ct200: no applied entry in the journal (see \
proxgpu history)

    Drivers come from a fresh inspection (``inventory`` replaces it when given): each function of
    a vfio group must be on vfio-pci, each GPU of the host group on the group's driver. An entry's
    files must hold what the apply wrote (or, rolled back, what was there before): the files
    proxgpu owns byte for byte; in the files it only edits (guest configs, the PCI mapping file,
    the kernel command line) only what it changed, so that an edit of anything else is no drift.
    A setting anywhere that would take the kept GPUs from their driver at the next boot (vfio-pci
    ``ids=`` naming their IDs, a blacklist of their module) is drift too, and so is a softdep
    line of proxgpu's that no longer keeps what its module declares (after an upgrade), or one
    missing for a module that could take a moved function (a kernel installed since names it).
    With ``guests`` (the default), the guests are looked at too
    (:func:`~proxgpu.apply.guests.guest_checks`): a container given NVIDIA GPUs found holding
    another user space than the host's module is drift (a host driver upgrade leaves it
    behind); on a live host, a running container must list exactly its GPUs from inside, a
    running VM's QEMU hold every function the plan gives it.

    :raises HostUnreachableError: when the host cannot be read.
    """
    target = applied_entry(host) if target is None else target
    plan = target if isinstance(target, Plan) else target.plan
    drift: list[str] = []
    pending: list[str] = []
    # Drivers an apply changes only at the next boot are pending, not drift, until the host
    # has booted again (its boot id changes).
    awaiting_reboot = False
    if isinstance(target, JournalEntry):
        files, boot_id = _file_drift(host, target)
        drift += files
        awaiting_reboot = (
            target.changeset.reboot_required and not target.live and boot_id == target.boot_id
        )
    moved: dict[str, str | None] = {}
    checks: list[GuestCheck] = []
    if plan is not None and (isinstance(target, Plan) or target.status == "applied"):
        inventory = inventory or inspect(host)
        moved = moved_drivers(inventory, plan)
        # A setting made since the apply (an ``options vfio-pci ids=`` left by hand) takes the
        # kept GPUs at the next boot although their drivers are right today.
        drift += [
            f"{line} (remove it: proxgpu binds to vfio-pci by PCI address)"
            for line in binding_conflicts(inventory, plan)
        ]
        stale, missing = softdep_drift(inventory, plan)
        drift += [
            f"{MODPROBE_CONF}: `{old}` no longer keeps the modules' own softdeps (a kernel or "
            f"driver upgrade changed them), so kmod loads {old.split()[1]} without them: "
            f"proxgpu would write `{new}` now; run `proxgpu plan` and apply again"
            for old, new in stale
        ]
        drift += [
            f"{MODPROBE_CONF}: no softdep line for {line.split()[1]}, which could take a moved "
            "function at boot (a kernel or modprobe.d alias names it since the apply), so it may "
            f"load before vfio-pci: proxgpu would write `{line}` now; run `proxgpu plan` and "
            "apply again"
            for line in missing
        ]
        drift += mig_drift(inventory, plan)
        drivers = driver_drift(inventory, plan, explain=not awaiting_reboot)
        if awaiting_reboot:
            pending = [f"{line} (at the next boot)" for line in drivers]
        else:
            drift += drivers
            # Before the boot that binds them, the guests cannot hold what the plan gives.
            checks = guest_checks(host, inventory, plan) if guests else []
            drift += [check.line for check in checks if check.verdict == "drift"]
    return VerifyReport(
        host=host.name,
        drifted=bool(drift),
        drift=drift,
        pending_reboot=pending,
        moved=moved,
        guests=checks,
    )


def _file_drift(host: Host, entry: JournalEntry) -> tuple[list[str], str | None]:
    """One line per file that is not as ``entry`` left it, in the entry's order, and the id of
    the host's boot now.

    One command reads every file's hash; one more reads the text of the partly-owned files whose
    hash differs, to compare only what the apply changed in them.
    """
    layout = Layout.of(host)
    paths = [layout.on_host(f.path) for f in entry.files]
    found = probe(host, layout, paths, lock_id=None)
    if entry.status == "in-progress":
        unfinished = f"journal entry {entry.id} is still in progress: run `proxgpu rollback`"
        return [unfinished], found.boot_id
    states = found.files
    wrote = entry.status == "applied"
    who = {
        "applied": f"apply {entry.id}",
        "rolled-back": f"the rollback of {entry.id}",
    }.get(entry.status, f"the restore of failed apply {entry.id}")
    planned = {c.path: c for c in entry.changeset.files}
    lines: list[list[str]] = []
    compare: dict[int, tuple[str, str]] = {}  # position -> (the text left, the other one)
    for n, (f, state) in enumerate(zip(entry.files, states, strict=True)):
        want = f.sha256_after if wrote else f.sha256_before
        # A guest config's lines name the guest: with several containers, which one drifted.
        name = with_guest(f.path)
        change = planned.get(f.path)
        lines.append([])
        if state.sha256 == want and state.kind != "other":
            continue
        if want is None:
            lines[n].append(f"{name}: exists, but {who} left it absent")
        elif state.kind == "absent":
            lines[n].append(f"{name}: missing, but {who} left it in place")
        elif state.kind == "file" and change is not None and partly_ours(f.path):
            left, other = (change.after, change.before) if wrote else (change.before, change.after)
            if left is not None:
                compare[n] = (left, other or "")
                continue
            lines[n].append(f"{name}: differs from what {who} left there")
        else:
            lines[n].append(f"{name}: differs from what {who} left there")
    if compare:
        texts = read_files(host, [entry.files[n].path for n in compare])
        for (n, (left, other)), data in zip(compare.items(), texts, strict=True):
            path = with_guest(entry.files[n].path)
            if data is None:  # replaced by something else than a file since the probe
                lines[n].append(f"{path}: differs from what {who} left there")
                continue
            now = data.decode("utf-8", "replace")
            drifted = entry_drift(entry.files[n].path, left, other, now, who)
            lines[n] += [f"{path}: {line}" for line in drifted]
    return [line for per_file in lines for line in per_file], found.boot_id


def moved_drivers(inventory: Inventory, plan: Plan) -> dict[str, str | None]:
    """The driver each function ``plan`` moves to vfio-pci holds now, by address.

    >>> from proxgpu.inspection import Inventory
    >>> from proxgpu.planning import Plan
    >>> moved_drivers(Inventory(source="t", hostname="t"), Plan(groups=[], warnings=[],
    ...                                                          tensor_parallel=[]))
    {}
    """
    functions = inventory.gpu_functions
    return {
        address: functions[address].driver if address in functions else None
        for group in plan.groups
        if group.role.moves_to_vfio
        for address in group.functions
    }


def driver_drift(inventory: Inventory, plan: Plan, *, explain: bool = True) -> list[str]:
    """One line per function whose driver is not the one ``plan`` gives it; with ``explain``,
    for a function that should be on vfio-pci, why it is not (which file or module beat the
    binding): not before the boot that should have bound it.

    >>> from proxgpu.inspection import Inventory
    >>> from proxgpu.planning import Plan
    >>> driver_drift(Inventory(source="t", hostname="t"), Plan(groups=[], warnings=[],
    ...                                                         tensor_parallel=[]))
    []
    """
    functions = inventory.gpu_functions
    lines = []
    for group in plan.groups:
        for address in group.functions:
            function = functions.get(address)
            if function is None:
                lines.append(f"{address}: not found on the host")
                continue
            have = function.driver or "no driver"
            if group.role.moves_to_vfio:
                if have != VFIO_DRIVER:
                    why = f": {why_not_vfio(inventory, function)}" if explain else ""
                    lines.append(f"{address}: bound to {have}, the plan says {VFIO_DRIVER}{why}")
            elif address in group.gpus and have != group.driver:
                lines.append(f"{address}: bound to {have}, the plan says {group.driver}")
            elif address not in group.gpus and have == VFIO_DRIVER:
                lines.append(f"{address}: bound to vfio-pci, the plan keeps it on the host")
    return lines
