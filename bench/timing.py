"""Timing shared by the benchmarks: the median wall time of repeated runs after warm-ups, and
where the CPU went (this process and its children, and a server's). :func:`interleaved` times
several actions in turns, so that a drift of the machine's speed during the run (a shared host's
neighbours, frequency changes) weighs on each of them alike, not on whichever ran last."""

from __future__ import annotations

import compileall
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def byte_compiled(package: Path) -> None:
    """Byte-compile ``package`` as ``pip install`` does, before its commands are timed.

    A command then loads proxgpu as an installed copy does: from ``__pycache__``. Where it is
    missing and cannot be written (``PYTHONDONTWRITEBYTECODE`` set, as in some CI and container
    environments), every run would compile each module from source again, tens of milliseconds
    that no user's installed copy pays.
    """
    compileall.compile_dir(package, quiet=1)


def median_seconds(action: Callable[[], object], runs: int, warmups: int = 3) -> float:
    """Median wall time of ``action`` over ``runs`` runs, after ``warmups`` untimed runs."""
    return sample(action, runs, warmups).wall


@dataclass(frozen=True)
class Sample:
    """One action's cost: its median wall time, and the CPU seconds each run took on average
    on the client (this process and the children it waited for) and on the server (``None``
    when none was watched)."""

    wall: float
    client_cpu: float
    server_cpu: float | None

    def cpu_line(self, per: int = 1) -> str:
        """The CPU per run divided by ``per`` (hosts), client and server, in milliseconds.

        >>> Sample(wall=1.0, client_cpu=0.5, server_cpu=0.25).cpu_line(per=5)
        'CPU client 100.0 ms, server 50.0 ms'
        """
        server = "?" if self.server_cpu is None else f"{self.server_cpu / per * 1000:.1f} ms"
        return f"CPU client {self.client_cpu / per * 1000:.1f} ms, server {server}"


def client_cpu_seconds() -> float:
    """CPU seconds (user and system) of this process and of the children it has waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def sample(
    action: Callable[[], object],
    runs: int,
    warmups: int = 3,
    server: Callable[[], float] | None = None,
) -> Sample:
    """``action`` run ``warmups`` times untimed, then ``runs`` times: the median wall time and
    the mean CPU per run, here and (``server``: its CPU seconds so far) on the server."""
    return interleaved({"": action}, runs, warmups, server)[""]


def interleaved(
    actions: dict[str, Callable[[], object]],
    runs: int,
    warmups: int = 1,
    server: Callable[[], float] | None = None,
) -> dict[str, Sample]:
    """Each of ``actions`` run ``warmups`` times untimed, then ``runs`` rounds in which each
    runs once, in the order given: each one's median wall time and mean CPU per run, here and
    (``server``) on the server, as :func:`sample` gives them.

    >>> sorted(interleaved({"a": lambda: None, "b": lambda: None}, runs=3))
    ['a', 'b']
    """
    for _ in range(warmups):
        for action in actions.values():
            action()
    times: dict[str, list[float]] = {name: [] for name in actions}
    client = dict.fromkeys(actions, 0.0)
    served = dict.fromkeys(actions, 0.0)
    for _ in range(runs):
        for name, action in actions.items():
            before, served_before = client_cpu_seconds(), server() if server else 0.0
            start = time.perf_counter()
            action()
            times[name].append(time.perf_counter() - start)
            client[name] += client_cpu_seconds() - before
            served[name] += (server() if server else 0.0) - served_before
    return {
        name: Sample(
            statistics.median(times[name]),
            client[name] / runs,
            served[name] / runs if server else None,
        )
        for name in actions
    }
