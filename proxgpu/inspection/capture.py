"""A capture: the raw files, links and directories one inspection read from a host.

The gather script (``proxgpu/scripts/gather.sh``) reads everything in one command, so inspecting a
remote host costs one round trip however many GPUs and files it has. The same capture written out
as a tree (:func:`write_tree`) is a snapshot: ``--root DIR`` reads it back through the same script.

>>> cap = parse_gather_output(b"#proxgpu-gather\\t1\\n#uid\\t0\\n#section\\tlines\\n"
...                           b"proc/cmdline\\0quiet\\n#end\\n")
>>> cap.text("/proc/cmdline")
'quiet\\n'
"""

from __future__ import annotations

import base64
import logging
import os
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from proxgpu.errors import CommandError, SysfsError, UsageError
from proxgpu.host.base import Host
from proxgpu.host.local import LocalHost
from proxgpu.host.scripts import ScriptRecord, run_script
from proxgpu.inspection.archived import ARCHIVE_MARKER, Archived
from proxgpu.inspection.smi import has_compute_instances, read_smi
from proxgpu.kmod import MODULES_BUILTIN_MODINFO
from proxgpu.paths import LXC_CONFIG_DIR, MEMBERS, NODES_DIR, PCI_DEVICES, PVE_DIR, VM_CONFIG_DIR
from proxgpu.redact import redact_secrets

log = logging.getLogger(__name__)

KEEP = ".proxgpu-keep"
#: The first line of the gather script's list of a kernel's module aliases (``modules.alias``,
#: ``modules.builtin.modinfo``): only the entries that can name a driver for a GPU's function.
ALIAS_LIST = "#proxgpu: the lines that can find a module for a function of a GPU"
#: The mode of a snapshot's copy of a file whose own mode is unknown.
PRIVATE = 0o600

#: Why the gather script could not enter the root it was given, in its own words.
_NOT_ENTERED = ("no such directory", "not a directory", "cannot enter it")
#: Paths a capture must never hold, whatever a future gather script reads.
FORBIDDEN_PREFIXES = ("/etc/pve/priv", "/etc/ssh", "/root/.ssh", "/home", "/etc/shadow")
#: Guest config keys whose values are secrets (cloud-init's password hash).


@dataclass
class Capture:
    """Files by absolute path: text read line by line keeps its lines, raw files their bytes."""

    uid: int | None = None
    lines: dict[str, list[str]] = field(default_factory=dict)
    raw: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    files: set[str] = field(default_factory=set)
    unreadable: list[str] = field(default_factory=list)
    #: Names of files skipped because they hold a newline or a tab (no record can carry them).
    bad_names: list[str] = field(default_factory=list)
    #: Files of a tree dropped because they are reached through a link out of it, with where to.
    outside: dict[str, str] = field(default_factory=dict)
    #: Each file's permission bits on the host, when asked for (``gather(modes=True)``).
    modes: dict[str, int] = field(default_factory=dict)
    #: What could not be read beside the files, for the inventory's warnings.
    notes: list[str] = field(default_factory=list)

    def text(self, path: str) -> str | None:
        """The file's text, or ``None`` when the capture does not hold it."""
        if path in self.raw:
            return self.raw[path].decode("utf-8", "replace")
        if path in self.lines:
            return _joined(self.lines[path])
        return None

    def first_line(self, path: str) -> str | None:
        """The first line of a one-line file (a sysfs attribute), stripped."""
        lines = self.lines.get(path)
        return lines[0].strip() if lines else None


def gather(host: Host, timeout: float = 120.0, *, modes: bool = False) -> Capture:
    """Read everything inspection needs from ``host`` in one command (two where /proc shows MIG
    compute instances: their UUIDs are nvidia-smi's, see :mod:`~proxgpu.inspection.smi`). From a
    tree (a root other than ``/``), or with ``modes`` (for a snapshot), the same command also
    says where each file is, and a file read through a link out of the tree is dropped (see
    :func:`check_files`).

    :raises HostUnreachableError: when the host cannot run the gather script.
    """
    checked = bool(modes or host.root.rstrip("/"))
    # This machine's tree is looked at directly; any other host's in the gather's own run.
    remote_check = checked and not isinstance(host, LocalHost)
    args = [host.root, "modes" if modes else "check"] if remote_check else [host.root]
    output = run_script(host, "gather", *args, timeout=timeout, check=False, bulk=True)
    if not output.has("proxgpu-gather"):
        refused = output.first("error")
        if refused is not None:
            # Host data: only the script's own words are repeated.
            said = refused[0] if refused.fields else ""
            why = said if said in _NOT_ENTERED else "cannot enter it"
            raise UsageError(f"{host.name}: {host.root}: {why} (--root names a host's tree)")
        raise CommandError(host.name, ["the gather step"], output.returncode, output.stderr)
    failed = output.first("failed")
    if failed is not None:
        # A batch that could not run read nothing: its files are unknown, not empty.
        step = f"the gather step ({failed[0]})"
        raise CommandError(host.name, [step], _status(failed), output.stderr)
    if remote_check and not output.has("checked"):
        step = "the gather step (looking where each file is)"
        raise CommandError(host.name, [step], output.returncode, output.stderr)
    capture = parse_gather_output(output.stdout, host.name)
    if remote_check:
        _apply_checks(capture, output.stdout)
    elif checked and isinstance(host, LocalHost):
        check_files(host, capture)
    if has_compute_instances(capture.lines):
        # Their UUIDs: a second round trip, only on a host with MIG devices.
        outputs, notes = read_smi(host)
        capture.raw.update(outputs)
        capture.notes.extend(notes)
    if log.isEnabledFor(logging.DEBUG):  # -vv: each file read, as the gather step read it
        for path in sorted({*capture.lines, *capture.raw}):
            log.debug("%s: read %s (%d bytes)", host.name, path, len(capture.text(path) or ""))
    return capture


def check_files(host: LocalHost, capture: Capture) -> None:
    """Drop from ``capture`` every file of a tree on this machine that was read through a link
    out of it (its directory or itself a symlink resolving outside the root), so that nothing
    outside the tree is copied into a snapshot or printed, and note each other file's mode.
    (Another host's tree is checked by the gather script itself, in the same run.)

    >>> cap = Capture(lines={"/etc/modules": ["vfio"]})
    >>> from proxgpu.host import DirectoryHost
    >>> check_files(DirectoryHost("examples/hosts/ct200"), cap)
    >>> sorted(cap.modes), cap.outside
    (['/etc/modules'], {})
    """
    real_root = os.path.realpath(host.root).rstrip("/")
    resolve = _Resolver(real_root)
    for path in _read_or_refused(capture):
        real = resolve(path)
        if not (real + "/").startswith(real_root + "/"):
            _drop_outside(capture, path, real)
            continue
        try:
            capture.modes[path] = os.stat(real).st_mode & 0o777
        except OSError:
            continue  # gone since it was read: the copy gets the private mode


class _Resolver:
    """``os.path.realpath`` of paths under one root, each directory resolved once: a tree's
    files share a few dozen directories, and resolving each file's whole path would look at
    every component of it again (thousands of ``lstat`` calls for one host).

    >>> resolve = _Resolver(os.path.realpath("examples/hosts/ct200"))
    >>> path = "/sys/bus/pci/devices/0000:01:00.0/vendor"
    >>> resolve(path) == os.path.realpath("examples/hosts/ct200" + path)
    True
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.folders: dict[str, str] = {}

    def __call__(self, path: str) -> str:
        parent, _, name = path.rpartition("/")
        if name in ("", ".", ".."):
            return os.path.realpath(self.root + path)
        folder = self.folders.get(parent)
        if folder is None:
            folder = self.folders[parent] = os.path.realpath(self.root + parent)
        # The folder holds no link any more: only the last component can still be one.
        joined = f"{folder.rstrip('/')}/{name}"
        return os.path.realpath(joined) if os.path.islink(joined) else joined


def _apply_checks(capture: Capture, stdout: bytes) -> None:
    """The gather script's own check (``#outside`` and ``#mode`` records) applied to
    ``capture``. Only files the capture holds are touched: the script looks at every file its
    lists name. A file whose name holds a tab, which no record can carry, was not looked at, so
    it is dropped as a name proxgpu cannot read."""
    read = set(_read_or_refused(capture))
    for name in [p for p in read if "\t" in p]:
        capture.raw.pop(name, None)
        capture.lines.pop(name, None)
        if name in capture.unreadable:
            capture.unreadable.remove(name)
        capture.bad_names.append(name)
    for line in stdout.split(b"\n"):
        if line.startswith(b"#outside\t"):
            path, _, target = line[len(b"#outside\t") :].partition(b"\t")
            if (name := _abs(path)) in read:
                _drop_outside(capture, name, target.decode("utf-8", "replace"))
        elif line.startswith(b"#mode\t"):
            mode, _, path = line[len(b"#mode\t") :].partition(b"\t")
            if (name := _abs(path)) in read and name not in capture.outside and mode.isdigit():
                capture.modes[name] = int(mode, 8) & 0o777


def _status(record: ScriptRecord) -> int:
    return int(record[1]) if len(record.fields) > 1 and record[1].isdigit() else 1


def parse_gather_output(output: bytes, source: str = "") -> Capture:
    """Parse the gather script's output (see the script for the format).

    Every data line holds a path and a NUL: one without is the rest of a name or link target
    that held a newline, which the kernel never makes, so the capture is refused.

    >>> parse_gather_output(b"#section\\tlinks\\nl\\0sys/x/driver\\0../a\\nb\\n", "pve1")
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    proxgpu.errors.SysfsError: pve1: /sys/x/driver: a name or link target with \
a newline, which the kernel never makes: refusing what the host gave; the kernel writes this \
file: ...
    """
    capture = Capture()
    section = ""
    last = b""
    archived = Archived()
    for record in output.split(b"\n"):
        if record.startswith(ARCHIVE_MARKER):
            archived.unpack(record[len(ARCHIVE_MARKER) :])
        elif record.startswith(b"#"):
            section = _marker(capture, record.decode("utf-8", "replace"), section)
        elif record:
            if b"\0" not in record or (section == "links" and record.count(b"\0") < 2):
                raise SysfsError(source, _abs(_broken_name(section, record, last)), _NEWLINE)
            _record(capture, section, record, archived)
            last = record.split(b"\0", 2)[1 if section == "links" else 0]
    for path, data in archived.files():
        if data is None:
            capture.unreadable.append(path)
        else:
            capture.raw[path] = data
    return capture


def _broken_name(section: str, record: bytes, last: bytes) -> bytes:
    """The start of the name a newline broke: the line's own path, or, for a line that is only
    the rest of a link target, the path of the link before it."""
    if section != "links":
        return record
    parts = record.split(b"\0")
    return parts[1] if len(parts) > 1 else last


_NEWLINE = (
    "a name or link target with a newline, which the kernel never makes: "
    "refusing what the host gave"
)


def _marker(capture: Capture, line: str, section: str) -> str:
    word, _, arg = line[1:].partition("\t")
    if word == "uid":
        capture.uid = int(arg)
    elif word == "badname":
        capture.bad_names.append(_abs(base64.b64decode(arg)))
    return arg if word == "section" else section


def _record(capture: Capture, section: str, record: bytes, archived: Archived) -> None:
    if section == "lines":
        path, _, data = record.partition(b"\0")
        capture.lines.setdefault(_abs(path), []).append(data.decode("utf-8", "replace"))
    elif section == "links":
        kind, path, target = record.split(b"\0", 2)
        if kind == b"l":
            capture.links[_abs(path)] = target.decode("utf-8", "replace")
        elif kind == b"f":
            capture.files.add(_abs(path))
        else:
            capture.dirs.add(_abs(path))
    elif section == "raw":
        path, _, data = record.partition(b"\0")
        if data == b"!unreadable":
            capture.unreadable.append(_abs(path))
        elif data.startswith(b"@"):
            archived.want(_abs(path), data[1:])
        else:
            capture.raw[_abs(path)] = base64.b64decode(data)


def _abs(path: bytes) -> str:
    return "/" + path.decode("utf-8", "replace").lstrip("/")


def write_tree(capture: Capture, directory: str) -> int:
    """Write ``capture`` under ``directory`` as a snapshot tree; return the number of entries.

    Symlinks keep their targets (``driver``, ``iommu_group`` carry meaning in their last part).
    Each file gets its mode on the host (``capture.modes``; 0600 when unknown), never a wider one.
    A device whose ``/sys/bus/pci/devices`` entry was a link into ``/sys/devices`` is written
    there, behind the same link, as sysfs lays it out: the tree keeps each device's parent chain.

    :raises UsageError: when ``directory`` exists and is not empty.
    """
    out = Path(directory)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out}: exists and is not empty; choose a new directory")
    entries = 0
    place = _Placement(capture)
    for path, content in _file_contents(capture):
        target = _inside(out, place(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_new(target, content, capture.modes.get(path, PRIVATE))
        entries += 1
    for path in sorted(capture.dirs):
        marker = _inside(out, place(path))
        marker.mkdir(parents=True, exist_ok=True)
        # Only the directory's existence was read; the file keeps it alive in git, which drops
        # empty directories.
        (marker / KEEP).touch()
        entries += 1
    for path in sorted(capture.files):
        target = _inside(out, place(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()  # only its existence was read: a command the host has
        entries += 1
    for path, link in sorted(capture.links.items()):
        target = _inside(out, place(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(link, target)
        entries += 1
    return entries


def as_cluster_node(
    capture: Capture, node: str, guests: dict[str, dict[str, bytes]], members: bytes
) -> Capture:
    """``capture`` of cluster node ``node`` laid out as the node sees the cluster's ``/etc/pve``:
    every node's guest configs (``guests``: by node, as :func:`guest_files` gives them) under
    ``/etc/pve/nodes/NODE/``, ``/etc/pve/lxc`` and ``qemu-server`` links to the node's own
    folder, and pmxcfs' member list ``members`` in ``/etc/pve/.members``.

    >>> cap = Capture(raw={"/etc/pve/lxc/200.conf": b"arch: amd64\\n"})
    >>> node = as_cluster_node(cap, "pve1", {"pve1": guest_files(cap)}, b"{}")
    >>> sorted(node.raw), node.links["/etc/pve/lxc"]
    (['/etc/pve/.members', '/etc/pve/nodes/pve1/lxc/200.conf'], 'nodes/pve1/lxc')
    """
    raw = {p: data for p, data in capture.raw.items() if not p.startswith(_GUEST_DIRS)}
    for name, files in guests.items():
        for path, data in files.items():
            raw[f"{NODES_DIR}{name}/{path.removeprefix(PVE_DIR)}"] = data
    raw[MEMBERS] = members
    kinds = [d.removeprefix(PVE_DIR).rstrip("/") for d in _GUEST_DIRS]
    links = {**capture.links, **{f"{PVE_DIR}{k}": f"nodes/{node}/{k}" for k in kinds}}
    dirs = capture.dirs | {f"{NODES_DIR}{name}/{k}" for name in guests for k in kinds}
    return replace(capture, raw=raw, links=links, dirs=dirs)


def guest_files(capture: Capture) -> dict[str, bytes]:
    """The guest configs a node's capture holds (its own: ``/etc/pve/lxc`` is its folder)."""
    return {p: data for p, data in capture.raw.items() if p.startswith(_GUEST_DIRS)}


_GUEST_DIRS = (LXC_CONFIG_DIR, VM_CONFIG_DIR)


class _Placement:
    """Where a captured path is written: under a device's ``/sys/devices`` directory when its
    ``/sys/bus/pci/devices`` entry is a link there, else where it was read."""

    def __init__(self, capture: Capture) -> None:
        self.devices: dict[str, str] = {}
        for path, link in capture.links.items():
            parent, _, name = path.rpartition("/")
            resolved = posixpath.normpath(posixpath.join(parent, link))
            # Only a link that stays in /sys/devices moves files: never one that points elsewhere.
            if parent + "/" == PCI_DEVICES and resolved.startswith("/sys/devices/pci"):
                self.devices[name] = resolved

    def __call__(self, path: str) -> str:
        if not path.startswith(PCI_DEVICES):
            return path
        name, slash, rest = path[len(PCI_DEVICES) :].partition("/")
        device = self.devices.get(name)
        return f"{device}/{rest}" if device and slash else path


def _file_contents(capture: Capture) -> list[tuple[str, bytes]]:
    contents = {
        path: _redacted(data) if path.startswith("/etc/pve/") else data
        for path, data in capture.raw.items()
    }
    for path, lines in capture.lines.items():
        # The kernel ends each modinfo string with a NUL, not a newline: so does the copy.
        ending = "\0" if path.endswith("/" + MODULES_BUILTIN_MODINFO) else "\n"
        contents[path] = _joined(lines, ending).encode()
    return sorted(contents.items())


def _redacted(data: bytes) -> bytes:
    # surrogateescape keeps any byte that is not UTF-8 exactly as it was.
    return redact_secrets(data.decode("utf-8", "surrogateescape")).encode(
        "utf-8", "surrogateescape"
    )


def _read_or_refused(capture: Capture) -> list[str]:
    """Every file the gather read, and those it refused to read (the gather reads no file
    through a link out of the root: those are among the refused, and are told apart here)."""
    return [*capture.raw, *capture.lines, *capture.unreadable]


def _drop_outside(capture: Capture, path: str, target: str) -> None:
    capture.raw.pop(path, None)
    capture.lines.pop(path, None)
    if path in capture.unreadable:
        capture.unreadable.remove(path)
    capture.outside[path] = target


def _write_new(target: Path, content: bytes, mode: int) -> None:
    """Write a new file (never through a link planted there) with ``mode``: the source's, so
    the copy is never readable by more people than the file it copies."""
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(content)
        os.fchmod(out.fileno(), mode)


def _joined(lines: list[str], ending: str = "\n") -> str:
    return "".join(line + ending for line in lines)


def _inside(out: Path, path: str) -> Path:
    clean = PurePosixPath(path)
    if ".." in clean.parts or any(path.startswith(p) for p in FORBIDDEN_PREFIXES):
        raise SysfsError(str(out), path, "refusing to write this path into a snapshot")
    return out.joinpath(*clean.parts[1:])


def key_value(line: str) -> tuple[str, str]:
    """``Key: value`` as its two stripped halves.

    >>> key_value("Device Minor: \t 3")
    ('Device Minor', '3')
    """
    key, _, value = line.partition(":")
    return key.strip(), value.strip()


def key_number(lines: Iterable[str], key: str) -> int | None:
    """The decimal number ``key`` has in NVIDIA's procfs ``Key: value`` lines (its ``params``,
    a capability's ``access`` file, as nv-procfs.c prints them); ``None`` without one.

    >>> key_number(["DeviceFileUID: 0", "DeviceFileMinor: 13"], "DeviceFileMinor")
    13
    """
    for line in lines:
        name, value = key_value(line)
        if name == key and value.isdigit():
            return int(value)
    return None
