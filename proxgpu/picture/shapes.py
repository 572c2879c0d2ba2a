"""The drawing primitives a picture is made of, the picture that holds them, and the text
measure they are laid out with.

No font is fetched or embedded, so the width of text is an estimate from the number of characters,
on the generous side: a label is wrapped or cut before it could overflow its box.

>>> wrap("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 150, SANS_PX)
['NVIDIA RTX PRO 6000', 'Blackwell Workstation…']
>>> Rect(0, 0, 10, 10, "a").overlaps(Rect(10, 0, 10, 10, "b"))
False
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Estimated width of one character at the picture's 12px in sans-serif (generous). The
#: monospace text (an address, with a short word after it) is never measured: it fits any box.
SANS_PX = 6.8


@dataclass(frozen=True)
class Rect:
    """A rectangle; ``css`` names its style class, ``id`` identifies GPU and node boxes."""

    x: float
    y: float
    w: float
    h: float
    css: str
    id: str | None = None
    title: str | None = None

    @property
    def right(self) -> float:
        """The x of the right edge."""
        return self.x + self.w

    @property
    def bottom(self) -> float:
        """The y of the bottom edge."""
        return self.y + self.h

    def overlaps(self, other: Rect) -> bool:
        """Whether the two rectangles share any area (touching edges do not count).

        >>> Rect(0, 0, 10, 10, "a").overlaps(Rect(5, 5, 10, 10, "b"))
        True
        """
        return (
            self.x < other.right
            and other.x < self.right
            and self.y < other.bottom
            and other.y < self.bottom
        )

    def contains(self, other: Rect) -> bool:
        """Whether ``other`` lies wholly inside this rectangle.

        >>> Rect(0, 0, 10, 10, "a").contains(Rect(1, 1, 5, 5, "b"))
        True
        """
        return (
            self.x <= other.x
            and self.y <= other.y
            and other.right <= self.right
            and other.bottom <= self.bottom
        )


@dataclass(frozen=True)
class Text:
    """One line of text; ``y`` is its baseline, ``anchor`` SVG's text-anchor."""

    x: float
    y: float
    text: str
    css: str
    anchor: str = "start"


@dataclass(frozen=True)
class Wire:
    """A connector: an SVG path (``M x y V y H x``)."""

    d: str
    css: str


@dataclass
class Picture:
    """A laid-out picture: its size and shapes; GPU and node boxes by their SVG ids."""

    width: float
    height: float
    title: str
    rects: list[Rect] = field(default_factory=list)
    texts: list[Text] = field(default_factory=list)
    lines: list[Wire] = field(default_factory=list)
    gpu_boxes: dict[str, Rect] = field(default_factory=dict)
    node_boxes: dict[str, Rect] = field(default_factory=dict)


def text_width(text: str, char_px: float) -> float:
    """The estimated width of ``text`` in pixels.

    >>> text_width("NVIDIA H200", SANS_PX)
    74.8
    """
    return round(len(text) * char_px, 1)


def wrap_parts(parts: list[str], width: float, char_px: float) -> list[str]:
    """``parts`` joined with `` · `` into lines that fit ``width``, never breaking inside a part
    (``IOMMU 60`` stays on one line).

    >>> wrap_parts(["nvidia → vfio-pci", "nvidia4", "IOMMU 60"], 190, SANS_PX)
    ['nvidia → vfio-pci · nvidia4', 'IOMMU 60']
    """
    fit = max(4, int(width // char_px))
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + 3 + len(part) <= fit:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return [line if len(line) <= fit else line[: fit - 1] + "…" for line in lines]


def wrap(text: str, width: float, char_px: float, lines: int = 2) -> list[str]:
    """``text`` broken at spaces into at most ``lines`` lines that fit ``width``; the last is cut
    with an ellipsis when the text does not fit.

    >>> wrap("short", 100, SANS_PX)
    ['short']
    """
    fit = max(4, int(width // char_px))
    out: list[str] = []
    words = text.split()
    while words and len(out) < lines:
        line = words.pop(0)
        while words and len(line) + 1 + len(words[0]) <= fit:
            line += " " + words.pop(0)
        out.append(line)
    if words:
        out[-1] = (out[-1] + " " + " ".join(words))[: fit - 1].rstrip() + "…"
    return [line if len(line) <= fit else line[: fit - 1] + "…" for line in out]
