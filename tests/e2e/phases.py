"""Where the end-to-end tier's time goes, and the budget it is held to.

A *phase* is one costly step of a test: a test host's boot or cold reboot, the guest
image's build or reuse, each ``proxgpu`` command a test runs, an initramfs rebuild, a guest's
start. The harness and the tests time each one with :func:`phase`, and it is charged to the test
that runs it (a fixture's phases to the test whose setup or teardown ran the fixture). Phases do
not nest: a reboot inside a named step is that step's time.

The run's summary lists every e2e test with its phases (``tests/conftest.py``), and the tier
is held to a budget of wall seconds (``$PROXGPU_E2E_BUDGET_S``, default :data:`DEFAULT_BUDGET_S`):
once the tests run so far have spent it, each e2e test still to run fails at once, naming where
the time went, so that a slower tier shows in the run's output with its phases long before CI's
own limit ends the run without them.

>>> ledger = Ledger(budget=60.0)
>>> ledger.begin("test_a")
>>> ledger.charge("reboot", 31.0)
>>> ledger.charge("reboot", 29.0)
>>> ledger.charge("proxgpu apply", 12.5)
>>> print(ledger.end("test_a", 80.0).line())
   80 s  test_a: reboot 2x 60 s, proxgpu apply 12 s, other 8 s
>>> ledger.over_budget()
'the e2e tier has spent 80 s of its 60 s budget (PROXGPU_E2E_BUDGET_S)'

A block may rename its phase while it runs:

>>> ledger.begin("test_b")
>>> with ledger.phase("boot") as timed:
...     timed.name += ", power-cycled after a stall"
>>> list(ledger.end("test_b", 1.0).phases)
['boot, power-cycled after a stall']
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

BUDGET_ENV = "PROXGPU_E2E_BUDGET_S"
# The key under which an e2e test's (worker, seconds, phases line) travel in the report of its
# teardown: to the run's summary (``tests/conftest.py``), from pytest-xdist's workers too.
PHASES_KEY = "e2e-phases"
# The tier's wall time on a 2-core machine of CI's kind, two test hosts side by side: measured
# at 1443 to 1712 s with the fast tier sharing the cores (the same cases, run to run). 35 minutes
# leaves a margin for a slower run and keeps the whole of .ci/run under 40 minutes, under half of
# CI's 90: the tier is held to what CI can afford, not to its best run.
DEFAULT_BUDGET_S = 2100.0
# A test's own time that no named phase covers (SSH commands, assertions).
OTHER = "other"


@dataclass
class TestPhases:
    """One test's wall seconds and the phases it ran, each with the seconds of every run."""

    nodeid: str
    seconds: float = 0.0
    phases: dict[str, list[float]] = field(default_factory=dict)

    __test__ = False  # not a pytest test class despite the name

    def line(self) -> str:
        """The test's seconds, then its phases, costliest first; what none covers is "other"."""
        named = sorted(self.phases.items(), key=lambda item: -sum(item[1]))
        parts = [_phase_text(name, runs) for name, runs in named]
        other = self.seconds - sum(sum(runs) for runs in self.phases.values())
        if other >= 1:
            parts.append(f"{OTHER} {other:.0f} s")
        return f"{self.seconds:5.0f} s  {self.nodeid}: {', '.join(parts) or 'no phase'}"


def _phase_text(name: str, runs: list[float]) -> str:
    count = f" {len(runs)}x" if len(runs) > 1 else ""
    return f"{name}{count} {sum(runs):.0f} s"


@dataclass
class Timed:
    """The phase a block is being timed as."""

    name: str


class Ledger:
    """The phases of every e2e test run so far in this process, and the tier's budget."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.tests: list[TestPhases] = []
        self._current: TestPhases | None = None
        self._depth = 0

    def begin(self, nodeid: str) -> None:
        """Charge the phases from now on to the test ``nodeid``."""
        self._current = TestPhases(nodeid)

    def end(self, nodeid: str, seconds: float) -> TestPhases:
        """The test ``nodeid`` took ``seconds`` of wall time in all; return its record."""
        record = self._current if self._current is not None else TestPhases(nodeid)
        record.seconds = seconds
        self.tests.append(record)
        self._current = None
        return record

    def charge(self, name: str, seconds: float) -> None:
        """Add one run of the phase ``name`` to the running test (outside every test: none)."""
        if self._current is not None:
            self._current.phases.setdefault(name, []).append(seconds)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[Timed]:
        """Time the block as the phase ``name`` (inside another phase, as part of that one);
        the block may rename it while it runs (a boot that turned out to need a power cycle)."""
        self._depth += 1
        timed = Timed(name)
        started = time.monotonic()
        try:
            yield timed
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.charge(timed.name, time.monotonic() - started)

    def spent(self) -> float:
        """The wall seconds of every test recorded so far."""
        return sum(test.seconds for test in self.tests)

    def over_budget(self) -> str | None:
        """None while the tier is within its budget, else a line saying by how much it is not."""
        spent = self.spent()
        if spent <= self.budget:
            return None
        budget = f"{self.budget:.0f} s budget ({BUDGET_ENV})"
        return f"the e2e tier has spent {spent:.0f} s of its {budget}"


def budget_from_environment() -> float:
    """``$PROXGPU_E2E_BUDGET_S`` as seconds, or :data:`DEFAULT_BUDGET_S`."""
    configured = os.environ.get(BUDGET_ENV, "").strip()
    try:
        return float(configured) if configured else DEFAULT_BUDGET_S
    except ValueError:
        raise ValueError(f"{BUDGET_ENV}={configured!r} is not a number of seconds") from None


LEDGER = Ledger(budget_from_environment())


def phase(name: str) -> contextlib.AbstractContextManager[Timed]:
    """Time a block of the running e2e test as the phase ``name`` (see the module's text)."""
    return LEDGER.phase(name)
