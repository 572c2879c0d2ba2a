"""Verify: compare the host with an applied journal entry (its files and plan) or with a plan.

The files proxgpu owns are compared byte for byte; in the files it only edits (guest configs,
the PCI mapping file, the kernel command line) only what it changed counts, so that an edit of
anything else (a VM snapshot, a new tag) is no drift.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import Field

from proxgpu.apply.journal import JournalEntry
from proxgpu.apply.layout import Layout
from proxgpu.apply.remote import probe, read_files
from proxgpu.host.base import Host
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Inventory
from proxgpu.model import FrozenModel
from proxgpu.paths import GRUB_DEFAULT, GUEST_CONFIG, KERNEL_CMDLINE, PCI_MAPPING
from proxgpu.pci import VFIO_DRIVER
from proxgpu.planning.model import Plan
from proxgpu.pve.config import GuestConfig
from proxgpu.pve.mapping import PciMappingConfig


class VerifyReport(FrozenModel):
    """Whether the host still matches an apply: ``drift`` holds one line per difference.

    >>> VerifyReport(host="pve1", drifted=False).drift
    []
    """

    host: str
    drifted: bool
    drift: list[str] = Field(default_factory=list)


def verify(
    host: Host, target: JournalEntry | Plan, *, inventory: Inventory | None = None
) -> VerifyReport:
    """Compare the host with an applied journal entry (its files and plan) or with a plan alone.

    Drivers come from a fresh inspection (``inventory`` replaces it when given): each function of
    a vfio group must be on vfio-pci, each GPU of the host group on the group's driver. An entry's
    files must hold what the apply wrote (or, rolled back, what was there before): the files
    proxgpu owns byte for byte; in the files it only edits (guest configs, the PCI mapping file,
    the kernel command line) only what it changed, so that an edit of anything else is no drift.

    :raises HostUnreachableError: when the host cannot be read.
    """
    plan = target if isinstance(target, Plan) else target.plan
    drift: list[str] = []
    if isinstance(target, JournalEntry):
        drift += _file_drift(host, target)
    if plan is not None and (isinstance(target, Plan) or target.status == "applied"):
        note = ""
        if (
            isinstance(target, JournalEntry)
            and target.changeset.reboot_required
            and not target.live
        ):
            note = f" (apply {target.id} takes effect after a reboot)"
        current = inventory or inspect(host)
        drift += [line + note for line in _driver_drift(current, plan)]
    return VerifyReport(host=host.name, drifted=bool(drift), drift=drift)


def _file_drift(host: Host, entry: JournalEntry) -> list[str]:
    """One line per file that is not as ``entry`` left it, in the entry's order.

    One command reads every file's hash; one more reads the text of the partly-owned files whose
    hash differs, to compare only what the apply changed in them.
    """
    if entry.status == "in-progress":
        return [f"journal entry {entry.id} is still in progress: run `proxgpu rollback`"]
    layout = Layout.of(host)
    paths = [layout.on_host(f.path) for f in entry.files]
    states = probe(host, layout, paths, lock_id=None).files
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
        change = planned.get(f.path)
        lines.append([])
        if state.sha256 == want and state.kind != "other":
            continue
        if want is None:
            lines[n].append(f"{f.path}: exists, but {who} left it absent")
        elif state.kind == "absent":
            lines[n].append(f"{f.path}: missing, but {who} left it in place")
        elif state.kind == "file" and change is not None and _partly_ours(f.path):
            left, other = (change.after, change.before) if wrote else (change.before, change.after)
            if left is not None:
                compare[n] = (left, other or "")
                continue
            lines[n].append(f"{f.path}: differs from what {who} left there")
        else:
            lines[n].append(f"{f.path}: differs from what {who} left there")
    if compare:
        texts = read_files(host, [paths[n] for n in compare])
        for (n, (left, other)), data in zip(compare.items(), texts, strict=True):
            path = entry.files[n].path
            if data is None:  # replaced by something else than a file since the probe
                lines[n].append(f"{path}: differs from what {who} left there")
                continue
            now = data.decode("utf-8", "replace")
            lines[n] += [f"{path}: {line}" for line in _entry_drift(path, left, other, now, who)]
    return [line for per_file in lines for line in per_file]


def _is_raw(key: str) -> bool:
    return key.startswith("lxc.")


def _partly_ours(path: str) -> bool:
    """Whether proxgpu edits only some entries of ``path``, the rest being Proxmox's or the
    admin's (the files it owns entirely are compared byte for byte).

    >>> _partly_ours("/etc/pve/qemu-server/300.conf"), _partly_ours("/etc/modules-load.d/x.conf")
    (True, False)
    """
    return bool(GUEST_CONFIG.match(path)) or path in (
        PCI_MAPPING,
        KERNEL_CMDLINE,
        GRUB_DEFAULT,
    )


def _entry_drift(path: str, left: str, other: str, now: str, who: str) -> list[str]:
    """What of the change from ``other`` to ``left`` (the text the apply, or the rollback, left)
    is no longer in ``now``; everything else in the file may change freely.

    >>> _entry_drift("/etc/kernel/cmdline", "root=x quiet iommu=pt\\n", "root=x quiet\\n",
    ...              "root=y iommu=pt\\n", "apply 1")
    []
    """
    if path in (KERNEL_CMDLINE, GRUB_DEFAULT):
        return _word_drift(
            _kernel_parameters(path, left),
            _kernel_parameters(path, other),
            _kernel_parameters(path, now),
            who,
            "kernel parameter ",
        )
    if path == PCI_MAPPING:
        return _mapping_drift(left, other, now, who)
    return _config_drift(left, other, now, who)


def _config_drift(left: str, other: str, now: str, who: str) -> list[str]:
    """Drift in the main section of a guest config: each key the change added, changed or
    removed must still have the value it was left with; raw ``lxc.*`` keys, which repeat, line by
    line. Other sections (snapshots, pending changes) and the description are not compared.

    >>> _config_drift("cores: 4\\nnuma: 1\\n", "cores: 2\\n", "numa: 1\\ntags: x\\ncores: 8\\n",
    ...               "apply 1")
    ['cores is now "8", but apply 1 set "4"']
    """
    want, was, have = (GuestConfig.parse(t).entries() for t in (left, other, now))
    lines = _word_drift(
        [f"{k}: {v}" for k, v in want if _is_raw(k)],
        [f"{k}: {v}" for k, v in was if _is_raw(k)],
        [f"{k}: {v}" for k, v in have if _is_raw(k)],
        who,
        "",
    )
    # The last entry of a key wins, as in Proxmox.
    want_keys, was_keys, have_keys = (
        {k: v for k, v in entries if not _is_raw(k)} for entries in (want, was, have)
    )
    for key in dict.fromkeys([*want_keys, *was_keys]):
        wanted, found = want_keys.get(key), have_keys.get(key)
        if wanted == was_keys.get(key) or wanted == found:
            continue
        if wanted is None:
            lines.append(f'"{key}: {found}" is back, but {who} removed it')
        elif found is None:
            lines.append(f'"{key}: {wanted}" is gone, but {who} put it there')
        else:
            lines.append(f'{key} is now "{found}", but {who} set "{wanted}"')
    return lines


def _mapping_drift(left: str, other: str, now: str, who: str) -> list[str]:
    """Drift in ``/etc/pve/mapping/pci.cfg``, line by line within each mapping id, so that
    another node's ``map`` lines or a description added later are no drift.

    >>> mapping = "gpu\\n\\tmap node=a\\n"
    >>> _mapping_drift(mapping, "", mapping + "\\tmap node=b\\n", "apply 1")
    []
    """
    want, was, have = (PciMappingConfig.parse(t) for t in (left, other, now))
    lines = []
    for mapping_id in dict.fromkeys([*want.ids(), *was.ids()]):
        wanted, before, found = (
            [f"{k} {v}" for k, v in c.entries(mapping_id)] if mapping_id in c.ids() else []
            for c in (want, was, have)
        )
        gone = [line for line in wanted if line not in before and line not in found]
        if gone and mapping_id not in have.ids():
            lines.append(f"mapping {mapping_id} is gone, but {who} put it there")
            continue
        lines += _word_drift(wanted, before, found, who, f"mapping {mapping_id}: ")
    return lines


def _word_drift(
    left: Sequence[str], other: Sequence[str], now: Sequence[str], who: str, what: str
) -> list[str]:
    """Each item ``left`` has and ``other`` lacks must be in ``now``; each the other way round
    must not be.

    >>> _word_drift(["a", "b"], ["b", "c"], ["c"], "apply 1", "word ")
    ['word "a" is gone, but apply 1 put it there', 'word "c" is back, but apply 1 removed it']
    """
    gone = [
        f'{what}"{w}" is gone, but {who} put it there'
        for w in left
        if w not in other and w not in now
    ]
    back = [
        f'{what}"{w}" is back, but {who} removed it' for w in other if w not in left and w in now
    ]
    return gone + back


_GRUB_CMDLINE = re.compile(
    r"^\s*(?:export\s+)?GRUB_CMDLINE_LINUX(?:_DEFAULT)?=([\"']?)(.*?)\1\s*$", re.MULTILINE
)


def _kernel_parameters(path: str, text: str) -> list[str]:
    """The kernel parameters a boot loader file gives: all of ``/etc/kernel/cmdline``, the
    ``GRUB_CMDLINE_LINUX`` and ``GRUB_CMDLINE_LINUX_DEFAULT`` values of ``/etc/default/grub``.

    >>> _kernel_parameters(GRUB_DEFAULT, 'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"\\n')
    ['quiet', 'iommu=pt']
    """
    if path == KERNEL_CMDLINE:
        return text.split()
    return [word for match in _GRUB_CMDLINE.finditer(text) for word in match[2].split()]


def _driver_drift(inventory: Inventory, plan: Plan) -> list[str]:
    drivers = {
        f.address: f.driver
        for gpu in inventory.gpus
        for f in (*gpu.function_info, *gpu.iommu_group_peers)
    }
    lines = []
    for group in plan.groups:
        for function in group.functions:
            if function not in drivers:
                lines.append(f"{function}: not found on the host")
                continue
            have = drivers[function] or "no driver"
            if group.role == "vfio" or function in group.gpus:
                want = VFIO_DRIVER if group.role == "vfio" else group.driver
                if have != want:
                    lines.append(f"{function}: bound to {have}, the plan says {want}")
            elif have == VFIO_DRIVER:
                lines.append(f"{function}: bound to vfio-pci, the plan keeps it on the host")
    return lines
