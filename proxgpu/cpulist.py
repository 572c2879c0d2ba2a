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


def parse_cpulist(text: str, limit: int = MAX_CPUS) -> list[int]:
    """Expand a cpulist into sorted, unique CPU numbers, naming fewer than ``limit`` CPUs.

    The work is bounded by ``limit``, not by the text: the kernel writes each CPU once, so a list
    whose ranges name more CPUs than that in all (a million ``0-65535``, or a million commas) is
    refused before it is expanded.

    >>> parse_cpulist("0-99999999999")
    Traceback (most recent call last):
    ...
    ValueError: CPU 99999999999 in '0-99999999999' is beyond any real machine (65536 CPUs)
    >>> parse_cpulist(",".join(["0-65535"] * 1000))
    Traceback (most recent call last):
    ...
    ValueError: the list names more than 65536 CPUs (some more than once)

    :raises ValueError: when ``text`` is not a cpulist.
    """
    if text.count(",") >= limit:
        raise ValueError(f"the list has more than {limit} ranges")
    cpus: set[int] = set()
    named = 0
    for part in text.strip().split(","):
        if not part:
            continue
        first, sep, last = part.partition("-")
        if len(part) > _LONGEST_RANGE or not first.isdigit() or (sep and not last.isdigit()):
            raise ValueError(f"bad cpulist range {part[:_LONGEST_RANGE]!r}")
        low = int(first)
        high = int(last) if sep else low
        if high < low:
            raise ValueError(f"bad cpulist range {part!r}")
        if high >= limit:
            raise ValueError(f"CPU {high} in {part!r} is beyond any real machine ({limit} CPUs)")
        named += high - low + 1
        if named > limit:
            raise ValueError(f"the list names more than {limit} CPUs (some more than once)")
        cpus.update(range(low, high + 1))
    return sorted(cpus)


#: The longest range text worth reading: two 20-digit numbers and a dash.
_LONGEST_RANGE = 41


def format_cpulist(cpus: Iterable[int]) -> str:
    """Compress CPU numbers into the shortest cpulist."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
