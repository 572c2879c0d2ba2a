"""Wall-clock timing shared by the benchmarks: the median of repeated runs after warm-ups."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(action: Callable[[], object], runs: int, warmups: int = 3) -> float:
    """Median wall time of ``action`` over ``runs`` runs, after ``warmups`` untimed runs."""
    for _ in range(warmups):
        action()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
