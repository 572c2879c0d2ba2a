"""The kernel's cpulist notation (``0-31,64-95``), both ways.

>>> parse_cpulist("0-3,8,10-11")
[0, 1, 2, 3, 8, 10, 11]
>>> format_cpulist([11, 0, 1, 2, 3, 8, 10])
'0-3,8,10-11'
"""

from __future__ import annotations

from collections.abc import Iterable

#: One more than the highest CPU number believed: Linux's NR_CPUS tops out at 8192 today, so
#: a list beyond this is garbage, and expanding it would take memory without bound.
MAX_CPUS = 1 << 16


def parse_cpulist(text: str) -> list[int]:
    """Expand a cpulist into sorted, unique CPU numbers.

    >>> parse_cpulist("0-99999999999")
    Traceback (most recent call last):
    ...
    ValueError: CPU 99999999999 in '0-99999999999' is beyond any real machine (65536 CPUs)

    :raises ValueError: when ``text`` is not a cpulist.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, sep, last = part.partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise ValueError(f"bad cpulist range {part!r}")
        low = int(first)
        high = int(last) if sep else low
        if high < low:
            raise ValueError(f"bad cpulist range {part!r}")
        if high >= MAX_CPUS:
            raise ValueError(f"CPU {high} in {part!r} is beyond any real machine ({MAX_CPUS} CPUs)")
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
