"""Read a PNG's pixels with the standard library alone (zlib, struct): enough to tell a browser's
screenshot from a blank page, without an imaging dependency.

>>> import zlib, struct
>>> def chunk(kind, data):
...     crc = zlib.crc32(kind + data)
...     return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)
>>> header = struct.pack(">IIBBBBB", 2, 1, 8, 2, 0, 0, 0)
>>> rows = zlib.compress(bytes([0, 255, 0, 0, 0, 0, 255]))
>>> png = SIGNATURE + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")
>>> decode_png(png).pixels
[[(255, 0, 0), (0, 0, 255)]]
"""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from dataclasses import dataclass

SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {2: 3, 6: 4}  # RGB, RGBA


@dataclass
class Image:
    """Decoded pixels, row by row, as RGB tuples (alpha dropped)."""

    width: int
    height: int
    pixels: list[list[tuple[int, int, int]]]

    def colours(self) -> Counter[tuple[int, int, int]]:
        """How many pixels have each colour."""
        return Counter(pixel for row in self.pixels for pixel in row)


def decode_png(data: bytes) -> Image:
    """Decode an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium's screenshots are)."""
    if not data.startswith(SIGNATURE):
        raise ValueError("not a PNG")
    offset, idat, header = len(SIGNATURE), b"", b""
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        offset += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    if depth != 8 or colour not in CHANNELS or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}")
    channels = CHANNELS[colour]
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytearray] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        row = _unfilter(
            raw[start], bytearray(raw[start + 1 : start + 1 + stride]), previous, channels
        )
        rows.append(row)
        previous = row
    pixels = [
        [(row[x], row[x + 1], row[x + 2]) for x in range(0, stride, channels)] for row in rows
    ]
    return Image(width, height, pixels)


def _unfilter(kind: int, row: bytearray, up: bytearray, bpp: int) -> bytearray:
    if kind == 1:
        for i in range(bpp, len(row)):
            row[i] = (row[i] + row[i - bpp]) & 0xFF
    elif kind == 2:
        for i in range(len(row)):
            row[i] = (row[i] + up[i]) & 0xFF
    elif kind == 3:
        for i in range(len(row)):
            left = row[i - bpp] if i >= bpp else 0
            row[i] = (row[i] + ((left + up[i]) >> 1)) & 0xFF
    elif kind == 4:
        for i in range(len(row)):
            left = row[i - bpp] if i >= bpp else 0
            corner = up[i - bpp] if i >= bpp else 0
            row[i] = (row[i] + _paeth(left, up[i], corner)) & 0xFF
    return row


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c
