"""Which NVIDIA user-space libraries each container holds, read from the host without entering
the container (``scripts/ctlibs.sh``).

A running container is read through its init's root, ``/proc/PID/root`` (the PID from
``lxc-info -n VMID -p``, asked again afterwards, as Proxmox asks); a stopped one through its
root file system where the host mounts it (a ZFS subvolume, a ``.subvol`` directory: see
:func:`proxgpu.pve.storage.rootfs_location`). Where neither can be read the answer is
"unknown", with the one command that would tell. Only names and link targets are read: the
version is the one ``libnvidia-ml.so.1`` links to, else the one its versioned files carry.

>>> entries = [("l", "libnvidia-ml.so.1", "libnvidia-ml.so.575.57.08"),
...            ("f", "libnvidia-ml.so.575.57.08", ""), ("f", "libcuda.so.575.57.08", "")]
>>> nvml_version(entries), found_versions(entries)
('575.57.08', ('575.57.08',))
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
from proxgpu.host.scripts import ScriptArgs, ScriptOutput, run_script
from proxgpu.inspection.inventory import Inventory
from proxgpu.model import FrozenModel
from proxgpu.paths import guest_config
from proxgpu.pve.config import GuestConfig, parse_property_string
from proxgpu.pve.storage import STORAGE_CFG, HostDir, StorageConfig, Unseen, rootfs_location

#: Each command the script runs (lxc-info, find) is killed this many seconds in.
CTLIBS_SECONDS = 5
#: The most bytes of names one directory's listing may bring back.
CTLIBS_LIMIT = 16384
#: The multiarch directory of each ``arch:`` Proxmox knows (its default: amd64).
TRIPLETS = {
    "amd64": "x86_64-linux-gnu",
    "i386": "i386-linux-gnu",
    "arm64": "aarch64-linux-gnu",
    "armhf": "arm-linux-gnueabihf",
    "riscv64": "riscv64-linux-gnu",
    "riscv32": "riscv32-linux-gnu",
}

_VERSION = r"(\d+\.\d+(?:\.\d+)?)"
_NVML_TARGET_RE = re.compile(rf"(?:.*/)?libnvidia-ml\.so\.{_VERSION}", re.ASCII)
_VERSIONED_RE = re.compile(rf"lib(?:nvidia-ml|cuda)\.so\.{_VERSION}", re.ASCII)
_NVML_FILE_RE = re.compile(rf"libnvidia-ml\.so\.{_VERSION}", re.ASCII)
_MOUNT_POINT_RE = re.compile(r"mp\d+", re.ASCII)
_DIR_WHY = {
    "missing": "is missing",
    "link": "is a link, which proxgpu does not follow in a container",
    "outside": "leads outside",
    "swapped": "changed while it was read",
}

State = Literal["running", "stopped", "unknown"]


class ContainerLibs(FrozenModel):
    """What one container holds of NVIDIA's user space: its ``state`` when read, ``seen``
    through its init's root or its storage, the ``nvml`` version libnvidia-ml.so.1 names (in
    directory ``where``), every version NVIDIA's library files there carry, and, where it could
    not be read, ``why`` and the one command (``ask``) that would tell.

    >>> ContainerLibs(vmid=200, state="stopped", seen="storage", nvml="575.57.08").known
    True
    """

    vmid: int
    state: State
    seen: Literal["init root", "storage"] | None = None
    nvml: str | None = None
    versions: tuple[str, ...] = ()
    where: str | None = None
    why: str | None = None
    ask: str | None = None
    #: Its config runs NVIDIA's LXC hook, which mounts the host's user space into it at each
    #: start (``lxc.hook.mount`` naming LXC's ``hooks/nvidia``, ``NVIDIA_VISIBLE_DEVICES`` set).
    hook: bool = False

    @property
    def known(self) -> bool:
        """Whether the container's libraries were read."""
        return self.why is None


@dataclass(frozen=True)
class _Container(ScriptArgs):
    vmid: int
    root: str | None
    triplet: str


def read_container_libs(
    host: Host, inventory: Inventory, vmids: Iterable[int]
) -> list[ContainerLibs]:
    """What each container of ``vmids`` holds, in one script run on ``host``.

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> tree = DirectoryHost("examples/hosts/ct200")
    >>> [found] = read_container_libs(tree, inspect(tree), [200])
    >>> found.why
    "storage 'local-zfs' is not in /etc/pve/storage.cfg"
    """
    storages = StorageConfig.parse(inventory.host_files.get(STORAGE_CFG, ""))
    containers = [_container(inventory, storages, vmid) for vmid in vmids]
    if not containers:
        return []
    hooked = {vmid for vmid in vmids if _hooked(_config(inventory, vmid))}
    args = [arg for container, _ in containers for arg in container.argv()]
    seconds = len(containers) * 6 * (CTLIBS_SECONDS + 2) + 15
    try:
        output = run_script(
            host,
            "ctlibs",
            "live" if host.is_live else "tree",
            str(CTLIBS_SECONDS),
            str(CTLIBS_LIMIT),
            *args,
            timeout=seconds,
            check=False,
        )
    except CommandTimeoutError:
        # Each command has its own deadline, but a directory on a hung NFS or CIFS storage
        # blocks even `cd` in the kernel: that must not refuse the plan, only leave this unknown.
        why = f"reading the containers took longer than {seconds} s (a hung storage?)"
        found = [_unknown(container, "unknown", why) for container, _ in containers]
    else:
        found = [_result(container, unseen, output) for container, unseen in containers]
    return [libs.model_copy(update={"hook": libs.vmid in hooked}) for libs in found]


def _config(inventory: Inventory, vmid: int) -> GuestConfig:
    return GuestConfig.parse(inventory.guest_configs.get(guest_config("lxc", vmid), ""))


def _hooked(config: GuestConfig) -> bool:
    """Whether LXC runs NVIDIA's hook for the container (LXC's ``hooks/nvidia``): configured
    as a mount hook, and enabled by ``NVIDIA_VISIBLE_DEVICES`` set to neither "" nor "void".

    >>> _hooked(GuestConfig.parse("lxc.hook.mount: /usr/share/lxc/hooks/nvidia\\n"
    ...                           "lxc.environment: NVIDIA_VISIBLE_DEVICES=all\\n"))
    True
    >>> _hooked(GuestConfig.parse("lxc.hook.mount: /usr/share/lxc/hooks/nvidia\\n"))
    False
    """
    hook = any(v.strip().endswith("/hooks/nvidia") for v in config.get_all("lxc.hook.mount"))
    visible = [
        value.partition("=")[2].strip()
        for value in config.get_all("lxc.environment")
        if value.strip().startswith("NVIDIA_VISIBLE_DEVICES=")
    ]
    return hook and bool(visible) and visible[-1] not in ("", "void")


def _container(
    inventory: Inventory, storages: StorageConfig, vmid: int
) -> tuple[_Container, str | None]:
    config = _config(inventory, vmid)
    triplet = TRIPLETS.get(config.get("arch") or "amd64", "x86_64-linux-gnu")
    rootfs = config.get("rootfs")
    where = (
        Unseen(f"CT {vmid} has no rootfs")
        if rootfs is None
        else rootfs_location(storages, rootfs, inventory.node_name)
    )
    if isinstance(where, HostDir):
        covering = _covering_usr(config)
        if covering is None:
            return _Container(vmid, where.path, triplet), None
        where = Unseen(f"{covering} mounts over /usr, which its rootfs cannot show")
    return _Container(vmid, None, triplet), where.reason


def _covering_usr(config: GuestConfig) -> str | None:
    """The mount point (``mpN``) mounted where NVIDIA's libraries lie (/usr, or a directory
    looked in, or above): a stopped container's rootfs does not show what it holds there.

    >>> _covering_usr(GuestConfig.parse("mp0: /tank/m,mp=/models\\nmp1: a:9/x.subvol,mp=/usr\\n"))
    'mp1'
    """
    for key, value in config.entries():
        if not _MOUNT_POINT_RE.fullmatch(key):
            continue
        try:
            path = parse_property_string(value, default_key="volume").get("mp", "")
        except ValueError:
            continue
        cover = path.rstrip("/")
        if path and (
            cover in ("", "/usr", "/usr/lib", "/usr/lib64") or cover.startswith("/usr/lib/")
        ):
            return key
    return None


def _result(container: _Container, unseen: str | None, output: ScriptOutput) -> ContainerLibs:
    vmid = str(container.vmid)
    if output.returncode != 0:
        return _unknown(container, "unknown", f"reading it failed (exit {output.returncode})")
    states = [r.fields for r in output.of("ct") if r.fields and r[0] == vmid]
    if not states or states[-1][1:2] not in (("running",), ("stopped",), ("unknown",)):
        return _unknown(container, "unknown", "the host's answer names it nowhere")
    state: State = "running" if states[-1][1] == "running" else "stopped"
    if states[-1][1] == "unknown":
        return _unknown(container, "unknown", _lxc_why(container.vmid, states[-1]))
    unread = next((r.fields for r in output.of("unread") if r.fields and r[0] == vmid), None)
    if unread is not None:
        return _unknown(container, state, _unread_why(container, state, unread, unseen))
    seen: Literal["init root", "storage"] = "init root" if state == "running" else "storage"
    listings = {r[1]: r[2] for r in output.of("libs") if len(r.fields) == 3 and r[0] == vmid}
    return _found(container, state, seen, listings)


def _found(
    container: _Container,
    state: State,
    seen: Literal["init root", "storage"],
    listings: dict[str, str],
) -> ContainerLibs:
    for where, encoded in listings.items():
        entries = _entries(encoded)
        if entries is None:
            return _unknown(container, state, f"its listing of {where} is no base64")
        if any(name.startswith("libnvidia-ml.so") for _, name, _ in entries):
            return ContainerLibs(
                vmid=container.vmid,
                state=state,
                seen=seen,
                nvml=nvml_version(entries),
                versions=found_versions(entries),
                where=f"/{where}",
            )
    return ContainerLibs(vmid=container.vmid, state=state, seen=seen)


def _entries(encoded: str) -> list[tuple[str, str, str]] | None:
    """find's ``%y\\0%f\\0%l\\0`` triples; a triple the size limit cut short is left out."""
    try:
        fields = base64.b64decode(encoded, validate=True).decode("utf-8", "replace").split("\0")
    except (binascii.Error, ValueError):
        return None
    whole = len(fields) - 1 - (len(fields) - 1) % 3
    return [(fields[i], fields[i + 1], fields[i + 2]) for i in range(0, whole, 3)]


def nvml_version(entries: list[tuple[str, str, str]]) -> str | None:
    """The version libnvidia-ml.so.1 names: its link's target, else the one versioned
    libnvidia-ml file (several: none, the installer left old ones).

    >>> nvml_version([("f", "libnvidia-ml.so.550.100", ""), ("f", "libnvidia-ml.so.575.57.08", "")])
    >>> nvml_version([("f", "libnvidia-ml.so.550.100", ""), ("p", "libnvidia-ml.so.1", "")])
    '550.100'
    """
    for kind, name, target in entries:
        match = _NVML_TARGET_RE.fullmatch(target)
        if kind == "l" and name == "libnvidia-ml.so.1" and match:
            return match[1]
    files = {
        m[1] for kind, name, _ in entries if kind == "f" and (m := _NVML_FILE_RE.fullmatch(name))
    }
    return files.pop() if len(files) == 1 else None


def found_versions(entries: list[tuple[str, str, str]]) -> tuple[str, ...]:
    """Every version the regular libnvidia-ml and libcuda files carry in their names, sorted.

    >>> found_versions([("f", "libcuda.so.550.100", ""), ("f", "libcuda.so.1\\n575.1.1", "")])
    ('550.100',)
    """
    found = {
        m[1] for kind, name, _ in entries if kind == "f" and (m := _VERSIONED_RE.fullmatch(name))
    }
    return tuple(sorted(found))


def _lxc_why(vmid: int, state: tuple[str, ...]) -> str:
    reason, detail = (state[2], state[3]) if len(state) >= 4 else ("", "")
    if reason == "lxc-info":
        return f"lxc-info -n {vmid} -p failed ({exit_word(detail)})"
    if reason == "answer":
        return f"lxc-info -n {vmid} -p answered no PID"
    if reason == "restarted":
        return "it restarted while it was read"
    return "the host's answer is not the script's"


def _unread_why(
    container: _Container, state: State, unread: tuple[str, ...], unseen: str | None
) -> str:
    reason, detail = (unread[1], unread[2]) if len(unread) >= 3 else ("", "")
    place = "its init's root" if state == "running" else f"its rootfs {container.root}"
    if reason == "unseen":
        return unseen or "the host sees no files of it"
    if reason == "root":
        return f"{place} {_DIR_WHY.get(detail, 'could not be read')}"
    if reason == "usr" and detail == "missing":
        return f"{place} holds no usr: it is not mounted"
    if reason == "usr":
        return f"usr in {place} {_DIR_WHY.get(detail, 'could not be read')}"
    return "the host's answer is not the script's"


def exit_word(status: str) -> str:
    """What a tool's exit status says, as a host script reports it ("cut": its answer was).

    >>> exit_word("127"), exit_word("3")
    ('not found', 'exit 3')
    """
    named = {
        "127": "not found",
        "124": "timed out",
        "137": "timed out",
        "cut": "its answer was cut",
    }
    return named.get(status, f"exit {status}")


def _unknown(container: _Container, state: State, why: str) -> ContainerLibs:
    """What cannot be read, and the one command that reads it: in a stopped container, through
    ``pct mount`` (which holds the container's lock until ``pct unmount``); else inside it."""
    lib = f"/usr/lib/{container.triplet}/libnvidia-ml.so.1"
    vmid = container.vmid
    if state == "stopped":
        ask = f"pct mount {vmid} && ls -l /var/lib/lxc/{vmid}/rootfs{lib}; pct unmount {vmid}"
    else:
        ask = f"pct exec {vmid} -- ls -l {lib}"
    return ContainerLibs(vmid=vmid, state=state, why=why, ask=ask)
