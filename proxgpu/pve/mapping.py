"""The cluster PCI mapping file, ``/etc/pve/mapping/pci.cfg``, read and edited line by line.

>>> cfg = PciMappingConfig.parse("gpu-a\\n\\tmap node=pve1,path=0000:81:00.0\\n")
>>> cfg.ids(), cfg.entries("gpu-a")
(['gpu-a'], [('map', 'node=pve1,path=0000:81:00.0')])
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from proxgpu.pve.config import KEY_RE, Line, LineFile, check_value, parse_property_string

_MAPPING_ID_RE = re.compile(r"[A-Za-z][A-Za-z0-9_\-]+")
_MAPPING_PROP_RE = re.compile(r"\s+(?P<key>\S+)(?:\s+(?P<value>.*?))?\s*")


@dataclass(frozen=True)
class _Block:
    mapping_id: str
    start: int
    end: int


class PciMappingConfig(LineFile):
    """``/etc/pve/mapping/pci.cfg``: an ``<id>`` line, then ``\\t<key> <value>`` lines.

    A blank line ends an id's block, as in PVE's SectionConfig, and ``map`` may repeat. Editing
    one id leaves every other id's lines exactly as they were.

    >>> cfg = PciMappingConfig.parse("gpu0\\n\\tmap id=10de:2330,node=pve1,path=0000:c1:00.0\\n")
    >>> cfg.set_entries("gpu1", [("map", "id=10de:2330,node=pve1,path=0000:d1:00.0")])
    >>> cfg.ids()
    ['gpu0', 'gpu1']
    >>> cfg.render().endswith("00.0\\n\\ngpu1\\n\\tmap id=10de:2330,node=pve1,path=0000:d1:00.0\\n")
    True
    """

    def _blocks(self) -> list[_Block]:
        blocks: list[_Block] = []
        start: int | None = None
        for i, line in enumerate([*self._lines, Line("", "")]):
            blank = not line.text.strip()
            if start is not None and blank:
                header = self._lines[start].text.rstrip()
                # PVE skips a block whose header is not an id; so do we, keeping its lines.
                if _MAPPING_ID_RE.fullmatch(header):
                    blocks.append(_Block(header, start, i))
                start = None
            elif start is None and not blank and not line.text.lstrip().startswith("#"):
                start = i
        return blocks

    def unreadable(self) -> list[tuple[int, str]]:
        """The lines Proxmox would drop when it reads the file, as ``(line number, text)``: a
        block whose header is no mapping id, a line in a block that is no ``key value``
        property. Editing such a file would pass a damaged file on as if it were whole.

        >>> PciMappingConfig.parse("gpu-a\\n\\tmap node=a\\ngarbage here\\n\\n2bad\\n").unreadable()
        [(3, 'garbage here'), (5, '2bad')]
        """
        bad = []
        starts = {b.start: b for b in self._blocks()}
        in_block: _Block | None = None
        for i, line in enumerate(self._lines):
            text = line.text.rstrip("\r\n")
            if not text.strip() or text.lstrip().startswith("#"):
                in_block = None if not text.strip() else in_block
                continue
            if in_block is None:
                in_block = starts.get(i)
                if in_block is None:
                    bad.append((i + 1, text))
                    in_block = _Block("", i, i)  # the rest of this block is skipped with it
                continue
            if in_block.mapping_id and not _MAPPING_PROP_RE.fullmatch(text):
                bad.append((i + 1, text))
        return bad

    def _block(self, mapping_id: str) -> _Block | None:
        return next((b for b in self._blocks() if b.mapping_id == mapping_id), None)

    def ids(self) -> list[str]:
        """The mapping ids in file order.

        >>> PciMappingConfig.parse("a1\\n\\tmap path=0000:01:00.0\\n\\nb1\\n").ids()
        ['a1', 'b1']
        """
        return [block.mapping_id for block in self._blocks()]

    def entries(self, mapping_id: str) -> list[tuple[str, str]]:
        """The ``(key, value)`` lines of ``mapping_id`` in order; ``map`` may appear many times.

        :raises KeyError: when there is no such id.

        >>> PciMappingConfig.parse("a1\\n\\tdescription GPUs\\n\\tmap path=0000:01:00.0\\n"
        ...                        ).entries("a1")
        [('description', 'GPUs'), ('map', 'path=0000:01:00.0')]
        """
        block = self._block(mapping_id)
        if block is None:
            raise KeyError(mapping_id)
        lines = self._lines[block.start + 1 : block.end]
        found = (_MAPPING_PROP_RE.fullmatch(line.text) for line in lines)
        return [(m["key"], m["value"] or "") for m in found if m and not m["key"].startswith("#")]

    def set_entries(self, mapping_id: str, entries: Sequence[tuple[str, str]]) -> None:
        """Replace ``mapping_id``'s lines with ``entries``, or append the id if it is new.

        :raises ValueError: when the id, a key or a value cannot be written in this format.

        >>> cfg = PciMappingConfig.parse("a1\\n\\tmap path=0000:01:00.0\\n")
        >>> cfg.set_entries("a1", [("map", "path=0000:02:00.0")])
        >>> cfg.render()
        'a1\\n\\tmap path=0000:02:00.0\\n'
        """
        _check_mapping(mapping_id, entries)
        texts = [mapping_id, *(f"\t{key} {value}" for key, value in entries)]
        block = self._block(mapping_id)
        if block is not None:
            self._replace(block.start, block.end, texts)
            return
        if self._lines and self._lines[-1].text.strip():
            texts.insert(0, "")
        self._insert(len(self._lines), texts)

    def remove(self, mapping_id: str) -> bool:
        """Remove ``mapping_id`` and one blank line that separated it; say whether it existed.

        >>> cfg = PciMappingConfig.parse("a1\\n\\tmap path=0000:01:00.0\\n\\nb1\\n")
        >>> cfg.remove("a1"), cfg.render()
        (True, 'b1\\n')
        """
        block = self._block(mapping_id)
        if block is None:
            return False
        doomed = list(range(block.start, block.end))
        if block.end < len(self._lines):
            doomed.append(block.end)
        elif block.start and not self._lines[block.start - 1].text.strip():
            doomed.append(block.start - 1)
        self._delete(doomed)
        return True


def is_mapping_id(name: str) -> bool:
    """Whether Proxmox takes ``name`` as a mapping ID (``pve-configid``: a letter, then at least
    one letter, digit, ``-`` or ``_``).

    >>> is_mapping_id("gpu-node1"), is_mapping_id("g"), is_mapping_id("1gpu")
    (True, False, False)
    """
    return _MAPPING_ID_RE.fullmatch(name) is not None


def _check_mapping(mapping_id: str, entries: Sequence[tuple[str, str]]) -> None:
    if not is_mapping_id(mapping_id):
        raise ValueError(f"{mapping_id!r} is not a valid mapping id")
    for key, value in entries:
        if not KEY_RE.fullmatch(key):
            raise ValueError(f"{key!r} is not a valid mapping key")
        check_value(value)


def with_node_maps(
    existing: Sequence[tuple[str, str]], ours: Sequence[tuple[str, str]], node: str
) -> list[tuple[str, str]]:
    """A mapping's lines with ``node``'s ``map`` lines replaced by ``ours``.

    A mapping is cluster-wide: its description and the other nodes' ``map`` lines stay as they
    are, and ours take the place of this node's first one (or go last).

    >>> with_node_maps([("map", "node=a,path=0000:01:00"), ("map", "node=b,path=0000:02:00")],
    ...                [("map", "node=a,path=0000:03:00")], "a")
    [('map', 'node=a,path=0000:03:00'), ('map', 'node=b,path=0000:02:00')]
    """

    def this_node(key: str, value: str) -> bool:
        return key == "map" and map_node(value) == node

    at = next((i for i, (k, v) in enumerate(existing) if this_node(k, v)), len(existing))
    others = [(k, v) for k, v in existing if not this_node(k, v)]
    kept_before = sum(1 for k, v in existing[:at] if not this_node(k, v))
    return [*others[:kept_before], *ours, *others[kept_before:]]


def map_node(value: str) -> str | None:
    """The ``node`` a ``map`` line is for (``None`` when the line cannot be read).

    >>> map_node("id=10de:2330,node=pve2,path=0000:81:00"), map_node("=")
    ('pve2', None)
    """
    try:
        return parse_property_string(value).get("node")
    except ValueError:
        return None


def mapping_lines(text: str) -> dict[str, list[tuple[str, str]]]:
    """Each mapping id's ``(key, value)`` lines in a ``pci.cfg`` text as Proxmox reads them: a
    value per key, ``map``'s lines in order. Proxmox writes the file in its own order (``map``
    first, then the other keys sorted), so this is what a text proxgpu wrote and the one
    Proxmox wrote from it share.

    >>> mapping_lines("a1\\n\\tdescription x\\n\\tmap node=a\\n\\tmap node=b\\n\\nb1\\n")
    {'a1': [('description', 'x'), ('map', 'node=a'), ('map', 'node=b')], 'b1': []}
    """
    config = PciMappingConfig.parse(text)
    # A stable sort: the keys in order, each key's lines (map's) as they were.
    return {i: sorted(config.entries(i), key=lambda entry: entry[0]) for i in config.ids()}


def changed_ids(before: str, after: str) -> list[str]:
    """The mapping ids whose lines differ between two ``pci.cfg`` texts, in order.

    >>> changed_ids("a1\\n\\tmap node=a\\n", "a1\\n\\tmap node=a\\n\\nb1\\n\\tmap node=b\\n")
    ['b1']
    """
    old, new = mapping_lines(before), mapping_lines(after)
    return [i for i in dict.fromkeys([*old, *new]) if old.get(i) != new.get(i)]


def same_mapping(a: str, b: str) -> bool:
    """Whether two ``pci.cfg`` texts say the same thing, as Proxmox reads them (it rewrites the
    file in its own order when it writes it through the API).

    >>> ours = "g\\n\\tdescription x\\n\\tmap node=a\\n"
    >>> same_mapping(ours, "g\\n\\tmap node=a\\n\\tdescription x\\n\\n")
    True
    """
    return mapping_lines(a) == mapping_lines(b)
