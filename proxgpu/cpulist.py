"""The kernel's cpulist notation (``0-31,64-95``), both ways.

>>> parse_cpulist("0-3,8,10-11")
[0, 1, 2, 3, 8, 10, 11]
>>> format_cpulist([11, 0, 1, 2, 3, 8, 10])
'0-3,8,10-11'
"""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpulist(text: str) -> list[int]:
    """Expand a cpulist into sorted, unique CPU numbers.

    :raises ValueError: when ``text`` is not a cpulist.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, sep, last = part.partition("-")
        low = int(first)
        high = int(last) if sep else low
        if high < low or low < 0:
            raise ValueError(f"bad cpulist range {part!r}")
        cpus.update(range(low, high + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Compress CPU numbers into the shortest cpulist."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
