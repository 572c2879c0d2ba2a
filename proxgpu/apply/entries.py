"""What proxgpu owns in the files it shares with Proxmox and the admin, entry by entry.

In guest configs, ``/etc/pve/mapping/pci.cfg`` and the kernel command line proxgpu changes some
entries (keys, raw ``lxc.*`` lines, ``map`` lines, kernel parameters) and everything else is
someone else's. :func:`entry_drift` tells which of an apply's entries changed since;
:func:`undo_entries` takes exactly those entries back out of a file and keeps everything added
since (a VM snapshot, a pending change, a new tag). Verify and rollback judge at this granularity.

>>> undo_entries("/etc/kernel/cmdline", "root=x quiet\\n", "root=x quiet iommu=pt\\n",
...              "root=y quiet iommu=pt\\n")
'root=y quiet\\n'
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from proxgpu.paths import GRUB_DEFAULT, GUEST_CONFIG, KERNEL_CMDLINE, PCI_MAPPING
from proxgpu.pve.config import GuestConfig, is_raw_key
from proxgpu.pve.mapping import PciMappingConfig
from proxgpu.rendering.cmdline import grub_with_parameters

#: One ``(key, value)`` line of a config.
Entry = tuple[str, str]


def partly_ours(path: str) -> bool:
    """Whether proxgpu edits only some entries of ``path``, the rest being Proxmox's or the
    admin's (the files it owns entirely are compared byte for byte).

    >>> partly_ours("/etc/pve/qemu-server/300.conf"), partly_ours("/etc/modules-load.d/x.conf")
    (True, False)
    """
    return bool(GUEST_CONFIG.match(path)) or path in (
        PCI_MAPPING,
        KERNEL_CMDLINE,
        GRUB_DEFAULT,
    )


def entry_drift(path: str, left: str, other: str, now: str, who: str) -> list[str]:
    """What of the change from ``other`` to ``left`` (the text the apply, or the rollback, left)
    is no longer in ``now``; everything else in the file may change freely.

    >>> entry_drift("/etc/kernel/cmdline", "root=x quiet iommu=pt\\n", "root=x quiet\\n",
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
        [f"{k}: {v}" for k, v in want if is_raw_key(k)],
        [f"{k}: {v}" for k, v in was if is_raw_key(k)],
        [f"{k}: {v}" for k, v in have if is_raw_key(k)],
        who,
        "",
    )
    # The last entry of a key wins, as in Proxmox.
    want_keys, was_keys, have_keys = (
        {k: v for k, v in entries if not is_raw_key(k)} for entries in (want, was, have)
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


def undo_entries(path: str, before: str, after: str, now: str) -> str:
    """``now`` with the change from ``before`` to ``after`` taken back, entry by entry: what the
    change added is removed, what it removed or replaced is put back, and everything else in
    ``now`` stays. Call it when :func:`entry_drift` found the change intact in ``now``.

    :raises ValueError: when ``now`` cannot be parsed or edited in its format.
    """
    if path in (KERNEL_CMDLINE, GRUB_DEFAULT):
        return _undo_parameters(path, before, after, now)
    if path == PCI_MAPPING:
        return _undo_mapping(before, after, now)
    return _undo_config(before, after, now)


def _undo_config(before: str, after: str, now: str) -> str:
    """A guest config's main section with the keys and raw lines of the change taken back.

    >>> _undo_config("cores: 2\\n", "cores: 4\\nnuma: 1\\n",
    ...              "cores: 4\\nnuma: 1\\nparent: s1\\n\\n[s1]\\ncores: 4\\n")
    'cores: 2\\nparent: s1\\n\\n[s1]\\ncores: 4\\n'
    """
    was, wrote = GuestConfig.parse(before).entries(), GuestConfig.parse(after).entries()
    config = GuestConfig.parse(now)
    _undo_raw(config, [e for e in was if is_raw_key(e[0])], [e for e in wrote if is_raw_key(e[0])])
    old = {k: v for k, v in was if not is_raw_key(k)}
    new = {k: v for k, v in wrote if not is_raw_key(k)}
    for key in dict.fromkeys([*new, *old]):
        if old.get(key) == new.get(key):
            continue
        previous = old.get(key)
        if previous is None:
            config.delete(key)
        else:
            config.set(key, previous)
    return config.render()


def _undo_raw(config: GuestConfig, was: list[Entry], wrote: list[Entry]) -> None:
    """Raw ``lxc.*`` lines back in their old order, then those added since by someone else (LXC
    reads them in order: a mount entry after another may depend on it)."""
    have = [e for e in config.entries() if is_raw_key(e[0])]
    wanted = [*was, *(e for e in have if e not in wrote and e not in was)]
    if wanted == have:
        return
    for key, value in dict.fromkeys(have):
        config.remove_raw(key, value)
    for key, value in wanted:
        config.add_raw(key, value)


def _undo_mapping(before: str, after: str, now: str) -> str:
    """``pci.cfg`` with the change's ``map`` lines taken back, every other line kept.

    >>> _undo_mapping("", "gpu\\n\\tmap node=a\\n", "gpu\\n\\tmap node=a\\n\\tmap node=b\\n")
    'gpu\\n\\tmap node=b\\n'
    """
    was, wrote = PciMappingConfig.parse(before), PciMappingConfig.parse(after)
    config = PciMappingConfig.parse(now)
    for mapping_id in dict.fromkeys([*wrote.ids(), *was.ids()]):
        old = was.entries(mapping_id) if mapping_id in was.ids() else []
        new = wrote.entries(mapping_id) if mapping_id in wrote.ids() else []
        have = config.entries(mapping_id) if mapping_id in config.ids() else []
        kept = [e for e in have if e not in new or e in old]
        kept += [e for e in old if e not in new and e not in kept]
        if kept == have:
            continue
        if any(k != "description" for k, _ in kept):
            config.set_entries(mapping_id, kept)
        else:
            config.remove(mapping_id)  # proxgpu made it, and only its lines are left
    return config.render()


def _undo_parameters(path: str, before: str, after: str, now: str) -> str:
    """The kernel command line without the parameters the change added, with those it removed.

    >>> _undo_parameters(GRUB_DEFAULT, 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\\n',
    ...                  'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"\\n',
    ...                  'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt splash"\\n')
    'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\\n'
    """
    old, new = _kernel_parameters(path, before), _kernel_parameters(path, after)
    added = [w for w in new if w not in old]
    removed = [w for w in old if w not in new]
    if path == GRUB_DEFAULT:
        return grub_with_parameters(now, removed, remove=added)
    words = [w for w in now.split() if w not in added]
    words += [w for w in removed if w not in words]
    return " ".join(words) + "\n"
