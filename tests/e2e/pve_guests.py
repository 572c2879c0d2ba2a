"""Test-side models of what Proxmox VE does with a guest's config when it starts the guest.

Not Proxmox code: a translation, written for the e2e tests, of the parts of pve-container and
qemu-server that turn ``/etc/pve/lxc/VMID.conf`` into LXC's configuration and hooks, and
``/etc/pve/qemu-server/VMID.conf``'s ``hostpciN`` entries into QEMU's ``-device vfio-pci``
arguments. The test host has Debian's ``lxc`` and ``qemu-system-x86`` but no Proxmox (its Perl
libraries need a cluster file system), so the tests start the guests from these. Every line
below names the source it follows, in the Proxmox repositories pinned in
tests/proxmox/sources.toml (pve-container 94f5585, qemu-server e6352be):

* ``src/PVE/LXC.pm``: ``update_lxc_config`` (what ``/var/lib/lxc/VMID/config`` holds),
  ``create_passthrough_device_node``;
* ``src/lxc-pve-prestart-hook``, ``src/lxc-pve-autodev-hook``, ``src/PVE/LXC/Tools.pm``
  (``for_devices``): how a ``devN`` node reaches the container;
* ``src/lxc-pve.conf``: the hooks LXC runs for every container;
* qemu-server ``src/PVE/QemuServer/PCI.pm``: ``print_hostpci_devices``.

>>> config = lxc_config(200, "arch: amd64\\nostype: debian\\nrootfs: local:1\\n", {}, "/c.conf")
>>> [line for line in config.splitlines() if line.startswith("lxc.rootfs")]
['lxc.rootfs.path = /var/lib/lxc/200/rootfs']
"""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass

#: The stand-in for lxc.apparmor.profile = generated (LXC.pm make_apparmor_config): LXC
#: generates that profile with apparmor_parser, which the test host (no AppArmor userspace) lacks.
APPARMOR_PROFILE = "unconfined"


@dataclass(frozen=True)
class NodeStat:
    """A device node's ``stat`` on the host: type (``c`` or ``b``), major and minor."""

    kind: str
    major: int
    minor: int


@dataclass(frozen=True)
class Passthrough:
    """One ``devN:`` entry (pve-container's ``$dev_desc``, src/PVE/LXC/Config.pm)."""

    path: str
    mode: str | None = None
    uid: int = 0
    gid: int = 0
    deny_write: bool = False


def main_section(text: str) -> Iterator[tuple[str, str]]:
    """The ``key: value`` lines of a guest config before its first ``[section]``, in order."""
    for line in text.splitlines():
        if line.startswith("["):
            return
        if line.startswith("#") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        yield key.strip(), value.strip()


def passthrough_devices(text: str) -> list[Passthrough]:
    """The config's ``devN`` entries: ``path`` is the default key (``[path=]/dev/X,mode=...``)."""
    devices = []
    for key, value in main_section(text):
        if not re.fullmatch(r"dev\d+", key):
            continue
        props: dict[str, str] = {}
        for part in value.split(","):
            name, eq, setting = part.partition("=")
            props.update({name: setting} if eq else {"path": name})
        devices.append(
            Passthrough(
                path=props["path"],
                mode=props.get("mode"),
                uid=int(props.get("uid", "0")),
                gid=int(props.get("gid", "0")),
                deny_write=props.get("deny-write") in ("1", "true", "yes", "on"),
            )
        )
    return devices


def lxc_config(vmid: int, text: str, stats: dict[str, NodeStat], common_conf: str) -> str:
    """``/var/lib/lxc/VMID/config`` as ``update_lxc_config`` writes it for a privileged
    container without network, features or a console setting (the test's CT 200).

    ``stats`` holds the host's stat of every ``devN`` path (LXC.pm reads it while writing the
    config); ``common_conf`` is the include it picks: ``/usr/share/lxc/config/OSTYPE.common.conf``,
    or ``common.conf`` where that file is absent (Debian's lxc has no ``debian.common.conf``).
    The hooks are those of ``src/lxc-pve.conf``, here the test's shell translations.
    """
    options = dict(main_section(text))
    directory = f"/var/lib/lxc/{vmid}"
    lines = [
        # LXC.pm: lxc >= 4 keeps the container's cgroup at lxc/VMID, its payload in ns below.
        "lxc.cgroup.relative = 0",
        f"lxc.cgroup.dir.monitor = lxc.monitor/{vmid}",
        f"lxc.cgroup.dir.container = lxc/{vmid}",
        "lxc.cgroup.dir.container.inner = ns",
        f"lxc.arch = {options['arch']}",
        f"lxc.include = {common_conf}",
        # make_seccomp_config writes nothing for a privileged container; make_apparmor_config's
        # "generated" profile is replaced (APPARMOR_PROFILE).
        f"lxc.apparmor.profile = {APPARMOR_PROFILE}",
    ]
    for device in passthrough_devices(text):
        node = stats[device.path]
        rule = f"{node.kind} {node.major}:{node.minor}"
        lines.append(f"lxc.cgroup2.devices.allow = {rule} {'r' if device.deny_write else 'rw'}")
        if device.deny_write:
            lines.append(f"lxc.cgroup2.devices.deny = {rule} w")
    memory = int(options.get("memory", "512"))
    high = (memory - 128) * 1024 * 1024 if memory >= 16 * 1024 else memory * 1024 * 1016
    lines += [
        "lxc.monitor.unshare = 1",
        # has_dev_console: console defaults to 1, so no lxc.console.path = none.
        f"lxc.tty.max = {options.get('tty', '2')}",
        "lxc.environment = TERM=linux",
        f"lxc.uts.name = {options.get('hostname', f'CT{vmid}')}",
        # Config.pm calculate_memory_constraints; swap defaults to 0.
        f"lxc.cgroup2.memory.max = {memory * 1024 * 1024}",
        f"lxc.cgroup2.memory.high = {high}",
        f"lxc.cgroup2.memory.swap.max = {int(options.get('swap', '0')) * 1024 * 1024}",
        f"lxc.rootfs.path = {directory}/rootfs",
    ]
    # The raw lxc.* lines, verbatim and in their order ("$k = $v").
    lines += [f"{key} = {value}" for key, value in main_section(text) if key.startswith("lxc.")]
    # A cpuset of its own (lxc.cgroup2.cpuset.cpus) stops LXC.pm from picking `cores` CPUs.
    lines += [
        f"lxc.hook.pre-start = {directory}/pve-prestart-hook",
        f"lxc.hook.autodev = {directory}/pve-autodev-hook",
    ]
    return "\n".join(lines) + "\n"


def prestart_hook(vmid: int, text: str) -> str:
    """The ``devN`` part of ``lxc-pve-prestart-hook``, as a shell script run by LXC.

    A tmpfs at ``/var/lib/lxc/VMID/passthrough``; for each entry ``create_passthrough_device_node``
    (LXC.pm): mknod with the host node's type and number, chmod to the entry's mode (0660
    unless given), chown to its uid:gid; then the ``devices`` list, ``TYPE:MAJOR:MINOR:PATH``
    per line, that the autodev hook reads.
    """
    directory = f"/var/lib/lxc/{vmid}/passthrough"
    script = [
        "#!/bin/sh",
        "set -eu",
        f"mkdir -p {directory}",
        f"mount -t tmpfs -o size=8k none {directory}",
        f": > {directory}/devices",
    ]
    for device in passthrough_devices(text):
        node = shlex.quote(directory + device.path)
        script += [
            # Major and minor in hex, then the type's words ("character special file").
            f"set -- $(stat -c '%t %T %F' {shlex.quote(device.path)})",
            'kind=c && [ "$3" = block ] && kind=b',
            'set -- "$kind" $((0x$1)) $((0x$2))',
            f'mkdir -p "$(dirname {node})" && mknod {node} "$1" "$2" "$3"',
            f"chmod {device.mode or '0660'} {node}",
            f"chown {device.uid}:{device.gid} {node}",
            f'echo "$1:$2:$3:{device.path}" >> {directory}/devices',
        ]
    return "\n".join(script) + "\n"


def autodev_hook(vmid: int) -> str:
    """``lxc-pve-autodev-hook``'s passthrough devices, as a shell script run by LXC.

    For each line of the devices list (``for_devices``' pattern: ``/dev/`` paths only): an empty
    regular file at the container's ``/dev/X`` with the prepared node bind-mounted onto it.
    """
    directory = f"/var/lib/lxc/{vmid}/passthrough"
    return f"""#!/bin/sh
set -eu
root=$LXC_ROOTFS_MOUNT
while IFS=: read -r kind major minor path; do
    dev=${{path#/dev/}}
    mkdir -p "$root/dev/$(dirname "$dev")"
    : > "$root/dev/$dev"
    mount --bind "{directory}/dev/$dev" "$root/dev/$dev"
done < {directory}/devices
"""


def vfio_devices(print_cmd: list[str], functions: dict[str, list[str]]) -> list[str]:
    """QEMU's ``-device vfio-pci`` arguments (and the root ports they sit on) for a VM.

    ``print_cmd`` is qemu-server's command line for the config (the harness's ``qemu-start
    --print-cmd``: ``vm_commandline``). The harness's host stand-in gives every ``hostpciN``
    address one function, so each entry there has function 0 only; ``functions``
    maps that function to all of its slot's on the host, and each gets the -device
    ``print_hostpci_devices`` (PCI.pm) gives it: ``id=hostpciN.J``, ``addr=0xS.J``, and
    ``multifunction=on`` on the first.

    >>> vfio_devices(["-device", "vfio-pci,host=0000:81:00.0,id=hostpci0,bus=p1,addr=0x0"],
    ...     {"0000:81:00.0": ["0000:81:00.0", "0000:81:00.1"]})  # doctest: +NORMALIZE_WHITESPACE
    ['-device', 'vfio-pci,host=0000:81:00.0,id=hostpci0.0,bus=p1,addr=0x0.0,multifunction=on',
     '-device', 'vfio-pci,host=0000:81:00.1,id=hostpci0.1,bus=p1,addr=0x0.1']
    """
    args: list[str] = []
    for flag, value in itertools.pairwise(print_cmd):
        if flag != "-device":
            continue
        if value.startswith("pcie-root-port,"):
            args += ["-device", value]
        match = re.fullmatch(
            r"vfio-pci,host=(\S+?),id=(hostpci\d+)(,bus=[^,]+,addr=[^,]+)(.*)", value
        )
        if match is None:
            continue
        host, ident, where, rest = match.groups()
        slot = functions[host]
        if len(slot) == 1:
            args += ["-device", value]
            continue
        if rest:
            # PCI.pm orders rombar, x-vga, multifunction, romfile, bootindex: not modelled.
            raise ValueError(f"{value}: options after addr= are not modelled")
        for j, function in enumerate(slot):
            first = ",multifunction=on" if j == 0 else ""
            args += ["-device", f"vfio-pci,host={function},id={ident}.{j}{where}.{j}{first}"]
    return args
