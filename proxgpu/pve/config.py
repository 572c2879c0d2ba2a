"""Read and edit Proxmox guest configs and the PCI mapping file without disturbing them.

A :class:`GuestConfig` holds every line of ``/etc/pve/lxc/<vmid>.conf`` or
``/etc/pve/qemu-server/<vmid>.conf`` as it was read, so rendering an unedited config gives back
the same text. Edits touch only the current (main) section and only the lines they are about;
``[PENDING]``/``[pve:pending]``, ``[special:*]`` and snapshot sections are never changed.
:class:`~proxgpu.pve.mapping.PciMappingConfig` does the same for ``/etc/pve/mapping/pci.cfg``,
on the same line-keeping base (:class:`LineFile`). Nothing here does I/O:
callers read the file, decode it as UTF-8 and write back what :meth:`render` returns.

>>> cfg = GuestConfig.parse("cores: 4\\nlxc.mount.entry = /dev/nvidia0 dev/nvidia0 none bind\\n")
>>> cfg.set("memory", "8192")
>>> cfg.add_raw("lxc.cgroup2.devices.allow", "c 195:0 rwm")
True
>>> print(cfg.render(), end="")
cores: 4
memory: 8192
lxc.mount.entry = /dev/nvidia0 dev/nvidia0 none bind
lxc.cgroup2.devices.allow: c 195:0 rwm
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Self

#: How many indices PVE 8.1+ allows for the indexed keys proxgpu allocates.
INDEX_LIMITS: Mapping[str, int] = {
    "dev": 256,
    "hostpci": 16,
    "mp": 256,
    "net": 32,
    "numa": 8,
    "unused": 256,
}


_KEY = r"[a-z][a-z0-9_\-]*"
_RAW_KEY = r"lxc\.[a-z0-9_.\-]+"
KEY_RE = re.compile(_KEY)
_RAW_KEY_RE = re.compile(_RAW_KEY)
#: A VM config's PCI passthrough keys: ``hostpci0`` to ``hostpciN`` (matched whole).
HOSTPCI_KEY = re.compile(r"hostpci\d+")
_HEADER_RE = re.compile(r"\[(?P<name>[^\]]*)\]\s*")
_RAW_RE = re.compile(rf"(?P<key>{_RAW_KEY})(?P<sep>:\s*|\s*=\s*)(?P<value>.*?)\s*")
_ENTRY_RE = re.compile(rf"(?P<key>{_KEY})(?P<sep>:\s*)(?P<value>.*?)\s*")
_PENDING_NAMES = frozenset({"pending", "pve:pending"})


@dataclass(frozen=True)
class Line:
    text: str
    eol: str


@dataclass(frozen=True)
class _Entry:
    key: str
    sep: str
    value: str


def _split_lines(text: str) -> list[Line]:
    # Only "\n" ends a line: str.splitlines() would also split on \f, \x1c, U+2028 and so on,
    # which PVE keeps inside a value.
    pieces = text.split("\n")
    lines = [
        Line(piece[:-1], "\r\n") if piece.endswith("\r") else Line(piece, "\n")
        for piece in pieces[:-1]
    ]
    if pieces[-1]:
        lines.append(Line(pieces[-1], ""))
    return lines


def _header_name(text: str) -> str | None:
    # Any bracketed line ends the main section, even one PVE rejects such as "[:3]", so that an
    # edit can never land below it.
    match = _HEADER_RE.fullmatch(text)
    return match["name"] if match else None


def _parse_entry(text: str) -> _Entry | None:
    if text.startswith("#"):
        return None
    match = _RAW_RE.fullmatch(text) or _ENTRY_RE.fullmatch(text)
    return _Entry(match["key"], match["sep"], match["value"]) if match else None


def is_raw_key(key: str) -> bool:
    """Whether ``key`` is a raw LXC key (``lxc.*``), which Proxmox keeps below its own.

    >>> is_raw_key("lxc.mount.entry"), is_raw_key("dev0")
    (True, False)
    """
    return key.startswith("lxc.")


def _check_key(key: str) -> None:
    if not (_RAW_KEY_RE.fullmatch(key) or KEY_RE.fullmatch(key)):
        raise ValueError(f"{key!r} is not a valid config key")


def check_value(value: str) -> None:
    # PVE strips surrounding blanks when it reads a value and refuses newlines when it writes one.
    if "\n" in value or "\r" in value or value != value.strip():
        raise ValueError(f"{value!r} cannot be stored as a config value")


class LineFile:
    """Lines kept with their own line endings, so that rendering is exact."""

    def __init__(self, lines: list[Line]) -> None:
        self._lines = lines

    @classmethod
    def parse(cls, text: str) -> Self:
        """Read ``text``; rendering it unedited gives ``text`` back.

        >>> GuestConfig.parse("memory: 512").render()
        'memory: 512'
        """
        return cls(_split_lines(text))

    def render(self) -> str:
        """The file's text, edits included.

        >>> str(GuestConfig.parse("#note\\r\\nmemory: 512\\r\\n")) == "#note\\r\\nmemory: 512\\r\\n"
        True
        """
        return "".join(line.text + line.eol for line in self._lines)

    def __str__(self) -> str:
        return self.render()

    def _eol(self) -> str:
        return next((line.eol for line in self._lines if line.eol), "\n")

    def _insert(self, pos: int, texts: Sequence[str]) -> None:
        eol = self._eol()
        new = [Line(text, eol) for text in texts]
        at_unterminated_end = pos == len(self._lines) and self._lines and not self._lines[-1].eol
        if at_unterminated_end and new:
            # Keep the file unterminated: the old last line gets the ending, the new one loses it.
            self._lines[-1] = Line(self._lines[-1].text, eol)
            new[-1] = Line(new[-1].text, "")
        self._lines[pos:pos] = new

    def _replace(self, start: int, end: int, texts: Sequence[str]) -> None:
        # The last new line takes over the old last line's ending, terminated or not.
        eol = self._eol()
        new = [Line(text, eol) for text in texts]
        new[-1] = Line(texts[-1], self._lines[end - 1].eol)
        self._lines[start:end] = new

    def _delete(self, indices: Iterable[int]) -> None:
        for index in sorted(set(indices), reverse=True):
            removed = self._lines.pop(index)
            # Keep an unterminated file unterminated, but never by erasing a blank line, which
            # is nothing but its line ending.
            if (
                not removed.eol
                and index == len(self._lines)
                and self._lines[-1:] != []
                and (self._lines[-1].text)
            ):
                self._lines[-1] = Line(self._lines[-1].text, "")


class GuestConfig(LineFile):
    """A VM or container config whose current section can be edited in place.

    Lines starting with ``#`` are the guest's description and are only ever kept. Raw ``lxc.*``
    keys may repeat and may use ``key = value``; PVE writes them after the normal keys, so new
    ones go there too.

    >>> cfg = GuestConfig.parse("memory: 512\\n\\n[snap]\\nmemory: 256\\n")
    >>> cfg.set("memory", "1024")
    >>> cfg.get("memory"), cfg.section_entries("snap")
    ('1024', [('memory', '256')])
    """

    def _main_end(self) -> int:
        return next(
            (i for i, line in enumerate(self._lines) if _header_name(line.text) is not None),
            len(self._lines),
        )

    def _main_entries(self) -> list[tuple[int, _Entry]]:
        found = ((i, _parse_entry(self._lines[i].text)) for i in range(self._main_end()))
        return [(i, entry) for i, entry in found if entry is not None]

    def entries(self) -> list[tuple[str, str]]:
        """The current section's ``(key, value)`` pairs in file order, raw ``lxc.*`` ones included.

        >>> GuestConfig.parse("#desc\\ncores: 2\\nlxc.cap.drop =\\n").entries()
        [('cores', '2'), ('lxc.cap.drop', '')]
        """
        return [(entry.key, entry.value) for _, entry in self._main_entries()]

    def get_all(self, key: str) -> list[str]:
        """Every value ``key`` has in the current section, in file order.

        >>> cfg = GuestConfig.parse("lxc.mount.entry: a\\nlxc.mount.entry = b\\n")
        >>> cfg.get_all("lxc.mount.entry")
        ['a', 'b']
        """
        return [value for k, value in self.entries() if k == key]

    def get(self, key: str) -> str | None:
        """The value of ``key`` in the current section, or None; the last one wins, as in PVE.

        >>> GuestConfig.parse("cores: 2\\n[snap]\\nnuma: 1\\n").get("numa") is None
        True
        """
        values = self.get_all(key)
        return values[-1] if values else None

    def set(self, key: str, value: str) -> None:
        """Give ``key`` exactly one entry, ``value``, in the current section.

        An existing entry is rewritten where it stands, keeping its separator (``: `` or
        `` = ``), and any repeats of it are dropped. A new normal key goes after the last normal
        key; a new ``lxc.*`` key goes at the end of the ``lxc.*`` block.

        :raises ValueError: when ``key`` or ``value`` could not be written as one config line.

        >>> cfg = GuestConfig.parse("lxc.cgroup2.cpuset.cpus = 0-3\\n")
        >>> cfg.set("lxc.cgroup2.cpuset.cpus", "0-27,56-83")
        >>> cfg.render()
        'lxc.cgroup2.cpuset.cpus = 0-27,56-83\\n'
        """
        _check_key(key)
        check_value(value)
        matches = [(i, entry) for i, entry in self._main_entries() if entry.key == key]
        if not matches:
            self._insert(self._new_entry_pos(is_raw_key(key)), [f"{key}: {value}"])
            return
        first, entry = matches[0]
        self._replace(first, first + 1, [f"{key}{entry.sep}{value}"])
        self._delete(i for i, _ in matches[1:])

    def delete(self, key: str) -> bool:
        """Remove every entry of ``key`` from the current section; say whether there was one.

        >>> cfg = GuestConfig.parse("hostpci0: 0000:81:00,pcie=1\\nmemory: 512\\n")
        >>> cfg.delete("hostpci0"), cfg.render()
        (True, 'memory: 512\\n')
        """
        doomed = [i for i, entry in self._main_entries() if entry.key == key]
        self._delete(doomed)
        return bool(doomed)

    def add_raw(self, key: str, value: str) -> bool:
        """Append a raw ``lxc.*`` entry unless the same one is already there; say if it was added.

        :raises ValueError: when ``key`` is not an ``lxc.*`` key or the line would be invalid.

        >>> cfg = GuestConfig.parse("lxc.mount.entry: a\\n")
        >>> cfg.add_raw("lxc.mount.entry", "b"), cfg.add_raw("lxc.mount.entry", "a")
        (True, False)
        """
        self._check_raw(key, value)
        if value in self.get_all(key):
            return False
        self._insert(self._new_entry_pos(raw=True), [f"{key}: {value}"])
        return True

    def remove_raw(self, key: str, value: str) -> int:
        """Remove the raw ``lxc.*`` entries equal to ``key``/``value``; return how many went.

        :raises ValueError: when ``key`` is not an ``lxc.*`` key.

        >>> cfg = GuestConfig.parse("lxc.cgroup2.devices.allow: c 195:* rwm\\n"
        ...                         "lxc.cgroup2.devices.allow: c 511:* rwm\\n")
        >>> cfg.remove_raw("lxc.cgroup2.devices.allow", "c 195:* rwm"), cfg.render()
        (1, 'lxc.cgroup2.devices.allow: c 511:* rwm\\n')
        """
        self._check_raw(key, value)
        doomed = [
            i for i, entry in self._main_entries() if (entry.key, entry.value) == (key, value)
        ]
        self._delete(doomed)
        return len(doomed)

    def free_indices(self, prefix: str, count: int = 1, limit: int | None = None) -> list[int]:
        """The ``count`` lowest indices ``N`` for which ``<prefix>N`` is unused.

        An index counts as used when the current or a pending section has it, so a pending
        change cannot later collide with the one being made. ``limit`` defaults to
        :data:`INDEX_LIMITS`.

        :raises ValueError: when there are fewer than ``count`` free indices, or ``prefix`` has
            no known limit and none is given.

        >>> GuestConfig.parse("hostpci0: 81:00\\n[PENDING]\\nhostpci1: c1:00\\n").free_indices(
        ...     "hostpci", 2)
        [2, 3]
        """
        if limit is None:
            if prefix not in INDEX_LIMITS:
                raise ValueError(f"no known index limit for {prefix!r}; pass limit")
            limit = INDEX_LIMITS[prefix]
        pattern = re.compile(re.escape(prefix) + r"(\d+)")
        keys = [key for key, _ in self.entries() + self.pending_entries()]
        taken = {int(m[1]) for m in map(pattern.fullmatch, keys) if m}
        free = [n for n in range(limit) if n not in taken][:count]
        if len(free) < count:
            raise ValueError(f"only {len(free)} of {limit} {prefix}N indices are free")
        return free

    def section_names(self) -> list[str]:
        """The names of the sections after the current one, as written, in file order.

        >>> GuestConfig.parse("a: 1\\n[PENDING]\\nb: 2\\n[special:cloudinit]\\n[snap1]\\n"
        ...                   ).section_names()
        ['PENDING', 'special:cloudinit', 'snap1']
        """
        names = (_header_name(line.text) for line in self._lines)
        return [name for name in names if name is not None]

    def section_entries(self, name: str) -> list[tuple[str, str]]:
        """The ``(key, value)`` pairs of every section called ``name`` (read-only).

        >>> GuestConfig.parse("a: 1\\n[snap]\\nlxc.idmap = u 0 100000 65536\\n"
        ...                   ).section_entries("snap")
        [('lxc.idmap', 'u 0 100000 65536')]
        """
        return self._entries_where(lambda section: section == name)

    def pending_entries(self) -> list[tuple[str, str]]:
        """The entries of ``[PENDING]`` (VM) or ``[pve:pending]`` (CT), ``delete`` included.

        >>> GuestConfig.parse("a: 1\\n[pve:pending]\\ndelete: a\\n").pending_entries()
        [('delete', 'a')]
        """
        return self._entries_where(lambda section: section.lower() in _PENDING_NAMES)

    def _entries_where(self, wanted: Callable[[str], bool]) -> list[tuple[str, str]]:
        pairs: list[tuple[str, str]] = []
        inside = False
        for line in self._lines:
            header = _header_name(line.text)
            if header is not None:
                inside = wanted(header)
            elif inside and (entry := _parse_entry(line.text)) is not None:
                pairs.append((entry.key, entry.value))
        return pairs

    def _new_entry_pos(self, raw: bool) -> int:
        entries = self._main_entries()
        normal = [i for i, entry in entries if not is_raw_key(entry.key)]
        raws = [i for i, entry in entries if is_raw_key(entry.key)]
        if raw and raws:
            return raws[-1] + 1
        if normal:
            return normal[-1] + 1
        if raws:
            return raws[0]
        return self._main_content_end()

    def _main_content_end(self) -> int:
        # Blank lines before a section header separate it from the main section; stay above them.
        end = self._main_end()
        while end and not self._lines[end - 1].text.strip():
            end -= 1
        return end

    @staticmethod
    def _check_raw(key: str, value: str) -> None:
        if not is_raw_key(key):
            raise ValueError(f"{key!r} is not a raw lxc.* key")
        _check_key(key)
        check_value(value)


def parse_property_string(text: str, default_key: str | None = None) -> dict[str, str]:
    """Split a PVE property string into an ordered ``{key: value}`` mapping.

    An item without ``=`` is the value of ``default_key`` (``host`` for ``hostpciN``, ``path``
    for ``devN``, ``volume`` for ``mpN``), as PVE's ``parse_property_string`` reads it.

    :raises ValueError: on a repeated key, an empty key or value, or a keyless item when there
        is no ``default_key``.

    >>> parse_property_string("0000:81:00.0,pcie=1,x-vga=1", default_key="host")
    {'host': '0000:81:00.0', 'pcie': '1', 'x-vga': '1'}
    """
    props: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep:
            if default_key is None:
                raise ValueError(f"{item!r} in {text!r} has no key")
            key, value = default_key, item
        if not key or not value:
            raise ValueError(f"{item!r} in {text!r} lacks a key or a value")
        if key in props:
            raise ValueError(f"{key!r} appears twice in {text!r}")
        props[key] = value
    return props


def format_property_string(props: Mapping[str, str], default_key: str | None = None) -> str:
    """Join ``props`` into a property string, keys in the mapping's order.

    The value of ``default_key``, when given and present, comes first without its key, the way
    PVE writes it, unless it holds ``=`` and would then be misread.

    :raises ValueError: when a key or value would not survive :func:`parse_property_string`.

    >>> format_property_string({"host": "0000:81:00", "pcie": "1"}, default_key="host")
    '0000:81:00,pcie=1'
    >>> format_property_string({"host": "0000:81:00", "pcie": "1"})
    'host=0000:81:00,pcie=1'
    """
    for key, value in props.items():
        if not key or not value.strip() or "=" in key or "," in key + value:
            raise ValueError(f"{key!r}={value!r} cannot go into a property string")
    implicit = None
    if default_key is not None and "=" not in props.get(default_key, "="):
        implicit = default_key
    items = [props[implicit]] if implicit is not None else []
    items += [f"{key}={value}" for key, value in props.items() if key != implicit]
    return ",".join(items)


def hostpci_devices(value: str) -> tuple[list[str], str | None]:
    """A ``hostpciN`` value's device addresses as written (``host=``, ``;``-separated) and its
    ``mapping=`` name.

    >>> hostpci_devices("0000:81:00;0000:82:00,pcie=1"), hostpci_devices("mapping=gpus,pcie=1")
    ((['0000:81:00', '0000:82:00'], None), ([], 'gpus'))

    :raises ValueError: when the value is not a property string.
    """
    props = parse_property_string(value, "host")
    return [a for a in props.get("host", "").split(";") if a], props.get("mapping")
