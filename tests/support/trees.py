"""The example host trees, private copies of them, and what the tests read back from a copy.

A test that changes a host copies one of ``examples/hosts`` into its tmp directory
(:func:`copy_example`), writes into the copy, then compares :func:`snapshot` or :func:`text` with
what it expects. :func:`changeset` is the change set the apply, rollback and verify tests share:
it edits, removes and creates files of the ct200 example.

Inspecting a tree (:func:`inspect_example`, :func:`ct200_plan`) runs the gather script with
``sh``, so only the tests under ``tests/local`` and above use those two.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Inventory
from proxgpu.inspection.recognition import GpuFilter
from proxgpu.planning import plan_split
from proxgpu.planning.model import Plan, SplitPolicy
from proxgpu.rendering.changes import Action, ChangeSet, FileChange

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "hosts"
#: The single hosts (a cluster snapshot such as cluster-3 holds a tree per node instead).
EXAMPLE_HOSTS = sorted(p.name for p in EXAMPLES.iterdir() if (p / "proc").is_dir())
GOLDEN = REPO / "tests" / "golden"

# Files of the ct200 example that :func:`changeset` edits, removes or creates.
LXC = "/etc/pve/lxc/200.conf"
VM = "/etc/pve/qemu-server/300.conf"
MODULES = "/etc/modules"
BLACKLIST = "/etc/modprobe.d/pve-blacklist.conf"
DRIVERCTL = "/etc/driverctl.d/pci-0000:81:00.0"  # its directory does not exist yet
VFIO_CONF = "/etc/modprobe.d/00-proxgpu-vfio.conf"
# proxgpu's own state, and the lock files Proxmox's editors share with it.
OWN_STATE = ("var/lib/proxgpu", "run/lock", "var/lock")


def copy_example(tmp_path: Path, name: str = "ct200", dest: str | None = None) -> Path:
    """A private copy of an example host, symlinks kept, that a test may change."""
    root = tmp_path / (dest or name)
    shutil.copytree(EXAMPLES / name, root, symlinks=True)
    return root


def sriov_tree(root: Path, count: int) -> Path:
    """A host with ``count`` SR-IOV virtual functions (Mellanox ConnectX VFs) on node 0: nine
    attribute files each, more file names than one argument list can hold."""
    tree = copy_example(root, dest="host")
    devices = tree / "sys/bus/pci/devices"
    attributes = {
        "class": "0x020000",
        "vendor": "0x15b3",
        "device": "0x101e",
        "subsystem_vendor": "0x15b3",
        "subsystem_device": "0x0001",
        "numa_node": "0",
        "local_cpulist": "0-31",
        "driver_override": "(null)",
        "boot_vga": "0",
    }
    for n in range(count):
        bus, slot, function = 1 + n // 256, n // 8 % 32, n % 8
        folder = tree / f"sys/devices/pci0001:00/0001:{bus:02x}:{slot:02x}.{function}"
        folder.mkdir(parents=True)
        for name, value in attributes.items():
            (folder / name).write_text(value + "\n")
        os.symlink(os.path.relpath(folder, devices), devices / folder.name)
    return tree


def inspect_example(name: str, gpu_filter: GpuFilter | None = None) -> Inventory:
    """The inventory of an example host, as ``proxgpu inspect --root`` reads it."""
    return inspect(DirectoryHost(str(EXAMPLES / name)), gpu_filter)


def ct200_plan(root: Path) -> Plan:
    """The default split of a ct200 tree: container 200 on node 0, VM 300 on node 1."""
    return plan_split(inspect(DirectoryHost(str(root))), SplitPolicy(lxc=200, vms=[(300, None)]))


def snapshot(root: Path, ignore: tuple[str, ...] = ()) -> dict[str, tuple[str, object, int]]:
    """Every entry under ``root`` but proxgpu's own state and ``ignore``: type, content or
    target, mode."""
    entries: dict[str, tuple[str, object, int]] = {}
    skip = OWN_STATE + ignore
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(skip) or any(own.startswith(rel + "/") for own in skip):
            continue
        info = path.lstat()
        if path.is_symlink():
            entries[rel] = ("link", os.readlink(path), 0)
        elif path.is_dir():
            entries[rel] = ("dir", None, stat.S_IMODE(info.st_mode))
        elif stat.S_ISFIFO(info.st_mode):
            entries[rel] = ("fifo", None, stat.S_IMODE(info.st_mode))
        else:
            entries[rel] = ("file", path.read_bytes(), stat.S_IMODE(info.st_mode))
    return entries


def tree_bytes(root: Path) -> dict[str, bytes]:
    """The bytes of every regular file under ``root``, by relative path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


def text(root: Path, path: str) -> str | None:
    """The file's text under ``root``, or None when absent."""
    target = root / path.lstrip("/")
    return target.read_text() if target.exists() else None


def edit(root: Path, path: str, old: str, new: str) -> None:
    """Replace ``old`` (which must be there) with ``new`` in a file of the tree."""
    target = root / path.lstrip("/")
    content = target.read_text()
    assert old in content
    target.write_text(content.replace(old, new, 1))


def sha256(root: Path, path: str) -> str:
    """The hash of a file in the tree."""
    return hashlib.sha256((root / path.lstrip("/")).read_bytes()).hexdigest()


def changeset(root: Path, actions: Sequence[list[str]] = ()) -> ChangeSet:
    """Edits two guest configs and a host file, removes one file, creates two (one in a new
    directory), all from the tree's current content."""
    lxc, vm, modules = text(root, LXC), text(root, VM), text(root, MODULES)
    assert lxc is not None and vm is not None and modules is not None
    return ChangeSet(
        host="ct200",
        files=[
            FileChange(path=LXC, before=lxc, after=lxc + "lxc.cgroup2.cpuset.cpus: 0-31\n"),
            FileChange(path=VM, before=vm, after=vm + "hostpci0: 0000:81:00,pcie=1\n"),
            FileChange(path=MODULES, before=modules, after=modules + "vfio\nvfio_pci\n"),
            FileChange(path=BLACKLIST, before=text(root, BLACKLIST), after=None),
            FileChange(path=DRIVERCTL, before=None, after="vfio-pci\n"),
            FileChange(
                path=VFIO_CONF,
                before=None,
                # As proxgpu writes it for ct200: a line for each module that could take a moved
                # function, NVIDIA's own softdeps kept (verify checks both).
                after="softdep nouveau pre: vfio-pci\n"
                "softdep nvidia pre: vfio-pci ecdh_generic,ecdsa_generic\n"
                "softdep snd_hda_intel pre: vfio-pci\n",
                mode=0o600,
            ),
        ],
        actions=[Action(argv=list(argv)) for argv in actions],
        reboot_required=True,
    )


def contents(root: Path, cs: ChangeSet) -> list[tuple[str | None, str | None, str | None]]:
    """(now, before, after) for each file of the change set."""
    return [(text(root, f.path), f.before, f.after) for f in cs.files]
