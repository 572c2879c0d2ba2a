"""Where everything goes: the picture's geometry, computed from the topology before any SVG.

Columns are NUMA nodes, at most :data:`MAX_COLUMNS` side by side (an 8-node host wraps into two
rows, so the text stays at its size instead of shrinking to fit). Under each node's header the
PCIe tree reads top down like ``lstopo``: root bus, root port, switch, then one card per GPU;
a dashed frame encloses the devices of an IOMMU group that must move together. Every size is
fixed, so the geometry can be checked without a browser (no two GPU cards overlap).

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.inspection import inspect
>>> picture = lay_out(inspect(DirectoryHost("examples/hosts/ct200")))
>>> len(picture.gpu_boxes), sorted(picture.node_boxes)
(8, ['numa-0', 'numa-1'])
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxgpu.inspection.inventory import Gpu, Inventory, PciFunction
from proxgpu.picture.legend import header_shapes, legend_items
from proxgpu.picture.shapes import (
    SANS_PX,
    Picture,
    Rect,
    Text,
    Wire,
    text_width,
    wrap,
    wrap_parts,
)
from proxgpu.picture.topology import Assignment, Column, TreeNode, build_topology, shared_groups

MARGIN = 16
COLUMN_WIDTH = 330
COLUMN_GAP = 20
ROW_GAP = 24
MAX_COLUMNS = 4
NODE_HEADER = 44
INDENT = 18
PAD = 10
LINE = 15
SMALL_ROW = 18
GAP = 6
FRAME_LABEL = 16
MIN_WIDTH = 720
#: Room around a column drawn alone, for its border.
EDGE = 2


def svg_id(prefix: str, value: object) -> str:
    """An SVG id (an XML name: no colons) for a GPU or a node.

    >>> svg_id("gpu", "0000:81:00.0")
    'gpu-0000-81-00.0'
    """
    return f"{prefix}-{str(value).replace(':', '-')}"


def lay_out(inventory: Inventory, roles: dict[str, Assignment] | None = None) -> Picture:
    """The whole picture of ``inventory``; with ``roles`` (a plan's), GPUs show their role and
    guest, and a GPU the plan leaves out is muted."""
    columns = build_topology(inventory)
    per_row = min(MAX_COLUMNS, max(1, len(columns)))
    width = max(MIN_WIDTH, 2 * MARGIN + per_row * COLUMN_WIDTH + (per_row - 1) * COLUMN_GAP)
    picture = Picture(width=width, height=0, title=inventory.summary)
    top = header_shapes(picture, legend_items(columns, roles), MARGIN)
    for start in range(0, len(columns), per_row):
        heights = [
            _column(picture, column, MARGIN + i * (COLUMN_WIDTH + COLUMN_GAP), top, roles)
            for i, column in enumerate(columns[start : start + per_row])
        ]
        top += max(heights) + ROW_GAP
    picture.height = top - ROW_GAP + MARGIN
    return picture


def lay_out_parts(
    inventory: Inventory, roles: dict[str, Assignment] | None = None
) -> tuple[Picture, list[Picture]]:
    """The picture of ``inventory`` in pieces for a page to flow: the title with the legend (as
    wide as two columns: an A4 or Letter page's width), then one picture per NUMA node, so a
    printed page breaks between nodes, never through one.

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> head, columns = lay_out_parts(inspect(DirectoryHost("examples/hosts/ct200")))
    >>> head.width, [(c.width, sorted(c.node_boxes), len(c.gpu_boxes)) for c in columns]
    (680, [(334, ['numa-0'], 4), (334, ['numa-1'], 4)])
    """
    columns = build_topology(inventory)
    head = Picture(width=2 * COLUMN_WIDTH + COLUMN_GAP, height=0, title=inventory.summary)
    head.height = header_shapes(head, legend_items(columns, roles), EDGE) - PAD - 2
    parts = []
    for column in columns:
        part = Picture(width=COLUMN_WIDTH + 2 * EDGE, height=0, title=column.title)
        part.height = _column(part, column, EDGE, EDGE, roles) + 2 * EDGE
        parts.append(part)
    return head, parts


def _gib(kib: int | None) -> str:
    return f"{kib / 1048576:.0f} GiB" if kib else "memory ?"


@dataclass
class _Cursor:
    """Where the next row of a column goes, and where each drawn node went."""

    x: float
    y: float
    placed: dict[int, Rect] = field(default_factory=dict)


@dataclass(frozen=True)
class _Drawing:
    """What every row of a column is drawn with: the picture, the plan's roles, and the first
    and last node of each framed IOMMU group (each gets room for the frame)."""

    picture: Picture
    roles: dict[str, Assignment] | None
    firsts: set[int]
    lasts: set[int]


@dataclass(frozen=True)
class _Place:
    """Where one row goes: its top-left corner and width."""

    x: float
    y: float
    width: float


def _column(
    picture: Picture, column: Column, x: float, top: float, roles: dict[str, Assignment] | None
) -> float:
    """Lay out one column at ``x``, ``top``; return its height."""
    node_id = svg_id("numa", "unknown" if column.node_id is None else column.node_id)
    gpus = len(column.gpus())
    head = Rect(x, top, COLUMN_WIDTH, NODE_HEADER, "pg-node", id=node_id, title=column.title)
    picture.texts.append(Text(x + PAD, top + 18, column.title, "pg-node-title"))
    detail = f"CPUs {column.cpus} · {_gib(column.memory_kib)} · {gpus} GPU{'s' * (gpus != 1)}"
    cpus = wrap(detail, COLUMN_WIDTH - 2 * PAD, SANS_PX, lines=1)[0]
    picture.texts.append(Text(x + PAD, top + 36, cpus, "pg-node-detail"))
    cursor = _Cursor(x, top + NODE_HEADER + GAP + 4)
    frames = shared_groups(column)
    firsts = {id(nodes[0]) for nodes in frames.values()}
    lasts = {id(nodes[-1]) for nodes in frames.values()}
    drawing = _Drawing(picture, roles, firsts, lasts)
    for root in column.roots:
        _node(drawing, cursor, root, 0)
    if not column.roots:
        picture.texts.append(Text(x + PAD, cursor.y + 14, "no PCIe devices shown", "pg-muted"))
        cursor.y += SMALL_ROW + GAP
    _frames(picture, cursor, frames, x)
    height = cursor.y - top + 4
    background = Rect(x, top, COLUMN_WIDTH, height, "pg-column")
    picture.rects[0:0] = [background]
    picture.rects.append(head)
    picture.node_boxes[node_id] = background
    return height


def _node(drawing: _Drawing, cursor: _Cursor, node: TreeNode, depth: int) -> None:
    """Draw ``node`` and, below it, its subtree, each child wired to it."""
    if id(node) in drawing.firsts:
        cursor.y += FRAME_LABEL  # the frame's label goes above its first device
    x = cursor.x + PAD + depth * INDENT
    box = _draw(drawing, node, _Place(x, cursor.y, cursor.x + COLUMN_WIDTH - PAD - x))
    cursor.placed[id(node)] = box
    cursor.y = box.bottom + GAP + (4 if id(node) in drawing.lasts else 0)
    for child in node.children:
        child_y = cursor.y + (FRAME_LABEL if id(child) in drawing.firsts else 0)
        wire = f"M {x + 6} {box.bottom} V {child_y + 9} H {x + INDENT}"
        drawing.picture.lines.append(Wire(wire, "pg-wire"))
        _node(drawing, cursor, child, depth + 1)


def _draw(drawing: _Drawing, node: TreeNode, place: _Place) -> Rect:
    if node.gpu is not None:
        return _gpu_card(drawing, node.gpu, node.muted, place)
    if node.function is not None:
        return _device_box(drawing.picture, node.function, node.kind, place)
    css = "pg-root" if node.kind == "root" else "pg-bridge"
    drawing.picture.texts.append(Text(place.x + 2, place.y + 13, node.label, css))
    return Rect(place.x, place.y, place.width, SMALL_ROW, "pg-none")


def _gpu_card(drawing: _Drawing, gpu: Gpu, muted: bool, place: _Place) -> Rect:
    picture, roles = drawing.picture, drawing.roles
    x, y, width = place.x, place.y, place.width
    role = roles.get(gpu.address) if roles is not None else None
    # In a report, a GPU the plan does not place (a BMC's display) stays as it is: muted.
    muted = muted or (roles is not None and role is None)
    lines = _card_lines(gpu, role, muted, width - 2 * PAD)
    height = 8 + LINE * len(lines)
    css = "pg-gpu-muted" if muted else f"pg-gpu-{role.role if role else 'plain'}"
    box = Rect(x, y, width, height, css, id=svg_id("gpu", gpu.address), title=_tooltip(gpu))
    picture.rects.append(box)
    picture.gpu_boxes[str(box.id)] = box
    for i, (text, style) in enumerate(lines):
        picture.texts.append(Text(x + PAD, y + 4 + LINE * (i + 1) - 3, text, style))
    badge = _badge(gpu, role)
    if badge and not muted:
        badge_w = text_width(badge, SANS_PX) + 10
        css_badge = f"pg-badge-{role.role}" if role else "pg-badge"
        picture.rects.append(Rect(box.right - badge_w - 4, y + 3, badge_w, 16, css_badge))
        text_css = "pg-badge-text pg-on-dark" if role else "pg-badge-text"
        picture.texts.append(Text(box.right - 9, y + 15, badge, text_css, "end"))
    return box


def _badge(gpu: Gpu, role: Assignment | None) -> str | None:
    if role is not None:
        return role.guest or role.role.badge_without_guest
    return None if gpu.nvidia_minor is None else f"nvidia{gpu.nvidia_minor}"


def _card_lines(
    gpu: Gpu, role: Assignment | None, muted: bool, width: float
) -> list[tuple[str, str]]:
    mono = "pg-muted-mono" if muted else "pg-mono"
    body = "pg-muted" if muted else "pg-text"
    lines = [(gpu.address, mono + " pg-bold")]
    lines += [(line, body) for line in wrap(gpu.label, width, SANS_PX)]
    facts = [_driver_fact(gpu, role)]
    if role is not None and gpu.nvidia_minor is not None:
        facts.append(f"nvidia{gpu.nvidia_minor}")
    facts.append("no IOMMU group" if gpu.iommu_group is None else f"IOMMU {gpu.iommu_group}")
    lines += [(line, body) for line in wrap_parts(facts, width, SANS_PX)]
    for function in gpu.function_info[1:4]:
        lines.append((_function_text(function, width), "pg-small"))
    if len(gpu.function_info) > 4:
        lines.append((f"+{len(gpu.function_info) - 4} more functions", "pg-small"))
    if muted and role is None:
        lines.append(("left as it is (not split)", "pg-small"))
    return lines


def _driver_fact(gpu: Gpu, role: Assignment | None) -> str:
    now = gpu.driver or "no driver"
    if role is None or role.driver == gpu.driver:
        return f"driver {now}" if role is None else f"{now} (stays)"
    return f"{now} → {role.driver}"


def _function_text(function: PciFunction, width: float) -> str:
    kind = "audio" if function.class_code.startswith("0x0403") else function.class_code
    number = function.address.rsplit(".", 1)[1]
    return wrap(f".{number} {kind} · {function.driver or 'no driver'}", width, SANS_PX, 1)[0]


def _tooltip(gpu: Gpu) -> str:
    parts = [gpu.address, gpu.model or "", gpu.nvidia_uuid or "", f"local CPUs {gpu.local_cpus}"]
    return " | ".join(part for part in parts if part)


def _device_box(picture: Picture, function: PciFunction, kind: str, place: _Place) -> Rect:
    """A NIC on a GPU's switch, or a device in a GPU's IOMMU group: small and muted."""
    x, y, width = place.x, place.y, place.width
    height = 8 + LINE * 2
    picture.rects.append(Rect(x, y, width, height, f"pg-{kind}", title=function.name))
    label = "NIC" if kind == "nic" else "in the GPU's IOMMU group"
    head = f"{function.address} {label}"
    picture.texts.append(Text(x + PAD, y + 16, head, "pg-muted-mono"))
    name = f"{function.name or function.class_code} · {function.driver or 'no driver'}"
    detail = wrap(name, width - 2 * PAD, SANS_PX, 1)[0]
    picture.texts.append(Text(x + PAD, y + 31, detail, "pg-small"))
    return Rect(x, y, width, height, "pg-none")


def _frames(
    picture: Picture, cursor: _Cursor, frames: dict[int, list[TreeNode]], column_x: float
) -> None:
    right = column_x + COLUMN_WIDTH - PAD + 5
    for group, nodes in frames.items():
        boxes = [cursor.placed[id(node)] for node in nodes]
        left = min(box.x for box in boxes) - 5
        top = boxes[0].y - FRAME_LABEL
        bottom = max(box.bottom for box in boxes) + 4
        picture.rects.append(Rect(left, top, right - left, bottom - top, "pg-frame"))
        label = f"IOMMU group {group}: these move together"
        picture.texts.append(Text(right - 5, top + 12, label, "pg-frame-label", "end"))
