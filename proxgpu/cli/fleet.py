"""Many hosts in one run: each inspected over its own connection, concurrently (``--forks``),
or, for ``apply`` and ``rollback``, one at a time (``--parallel N`` for more), stopping at the
first failure.

Each host runs the same command as a run for that host alone would, with its output captured;
the results are then printed in the order the hosts were given: one section per host, or with
``--json`` one document ``{"hosts": {TARGET: document}}`` holding each host's document (an error
document for a host that failed). A summary line per host goes to stderr, and the exit code is
the worst of the hosts' codes.

>>> expand_hosts(["pve1,pve2", "pve3"])
['pve1', 'pve2', 'pve3']
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

#: How many hosts are read at once by default, as Ansible's forks.
FORKS = 5


def expand_hosts(values: Sequence[str] | None) -> list[str]:
    """``--host`` values, each possibly a comma list, in order, without repeats."""
    hosts = [h.strip() for value in values or [] for h in value.split(",") if h.strip()]
    return list(dict.fromkeys(hosts))


@dataclass(frozen=True)
class Outcome:
    """One host's run: its exit code and what it printed."""

    target: str
    code: int
    out: str
    err: str


class _PerThread(io.TextIOBase):
    """sys.stdout or sys.stderr, written to a buffer of the running host's thread if it has one."""

    def __init__(self, real: TextIO) -> None:
        self.real = real
        self.local = threading.local()

    def write(self, text: str) -> int:
        buffer: io.StringIO | None = getattr(self.local, "buffer", None)
        return (buffer or self.real).write(text)

    def flush(self) -> None:
        if getattr(self.local, "buffer", None) is None:
            self.real.flush()

    def isatty(self) -> bool:
        return False  # output is captured, then printed: no colour, no prompts


@contextmanager
def _captured(stream: _PerThread) -> Iterator[io.StringIO]:
    buffer = io.StringIO()
    stream.local.buffer = buffer
    try:
        yield buffer
    finally:
        stream.local.buffer = None


Runner = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Cluster:
    """What a run over a cluster's nodes adds to a fleet's: each node's own options (its SSH
    target or tree), what is said once for the whole cluster (first in the text, ``"cluster"``
    in the JSON document), the members not run with why, an exit code of its own, and the node
    a rollout runs alone before any other (the one whose apply writes the cluster's mapping)."""

    options: dict[str, dict[str, Any]]
    text: str = ""
    document: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    code: int = 0
    lead: str | None = None


def run_fleet(
    args: argparse.Namespace, hosts: list[str], one: Runner, cluster: Cluster | None = None
) -> int:
    """Run ``one`` for each host (for a cluster, each node with its own options); print the
    results in order; return the worst exit code."""
    # Commands that change hosts roll out one host at a time unless --parallel says otherwise.
    rolling = args.fleet == "rolling"
    if rolling and not (getattr(args, "yes", False) or getattr(args, "dry_run", False)):
        print(
            "proxgpu: several hosts cannot be asked one by one: review them with "
            "`proxgpu plan --host ...`, then pass --yes",
            file=sys.stderr,
        )
        return 2
    fleet = _Fleet(args, one, cluster.options if cluster else {})
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = fleet.out, fleet.err
    workers = max(1, args.parallel if rolling else args.forks)
    try:
        outcomes = fleet.run(hosts, workers, rolling, cluster.lead if cluster else None)
    finally:
        sys.stdout, sys.stderr = saved
    _print(args, hosts, outcomes, cluster or Cluster({}))
    codes = [o.code for o in outcomes.values()]
    return max([*codes, cluster.code if cluster else 0], default=0)


class _Fleet:
    """One run over many hosts: the command, and the streams each host's output is caught in."""

    def __init__(
        self, args: argparse.Namespace, one: Runner, options: dict[str, dict[str, Any]]
    ) -> None:
        self.args = args
        self.one = one
        self.options = options
        self.out = _PerThread(sys.stdout)
        self.err = _PerThread(sys.stderr)

    def for_host(self, target: str) -> Outcome:
        with _captured(self.out) as stdout, _captured(self.err) as stderr:
            mine = {"host": target, **self.options.get(target, {}), "use_color": False}
            own = argparse.Namespace(**{**vars(self.args), **mine})
            code = self.one(own)
        return Outcome(target, code, stdout.getvalue(), stderr.getvalue())

    def run(
        self, hosts: list[str], workers: int, rolling: bool, lead: str | None = None
    ) -> dict[str, Outcome]:
        outcomes: dict[str, Outcome] = {}
        with ThreadPoolExecutor(max_workers=workers) as pool:
            if not rolling:
                return dict(zip(hosts, pool.map(self.for_host, hosts), strict=True))
            rest = [h for h in hosts if h != lead]
            batches = [[lead]] if lead in hosts else []
            batches += [rest[start : start + workers] for start in range(0, len(rest), workers)]
            # A rollout stops at the first failure: the hosts after it are not touched.
            for batch in batches:
                outcomes.update(zip(batch, pool.map(self.for_host, batch), strict=True))
                if any(outcomes[h].code != 0 for h in batch):
                    break
        return outcomes


def _print(
    args: argparse.Namespace, hosts: list[str], outcomes: dict[str, Outcome], cluster: Cluster
) -> None:
    if args.json:
        documents = {t: _document(o) for t, o in outcomes.items()}
        extra = {"cluster": cluster.document} if cluster.document else {}
        print(json.dumps({**extra, "hosts": documents}, indent=2))
    else:
        print(cluster.text, end="")
        for target in hosts:
            if target in outcomes:
                print(f"== {target} ==")
                print(outcomes[target].out, end="" if outcomes[target].out.endswith("\n") else "\n")
    for target in hosts:
        outcome = outcomes.get(target)
        sys.stderr.write("".join(f"{target}: {line}\n" for line in _lines(outcome)))
        print(f"{target}: {_summary(outcome)}", file=sys.stderr)
    for name, why in cluster.skipped.items():
        print(f"{name}: {why}", file=sys.stderr)


def _document(outcome: Outcome) -> object:
    try:
        return json.loads(outcome.out)
    except ValueError:
        return {"error": {"code": outcome.code, "message": outcome.err.strip()}}


def _lines(outcome: Outcome | None) -> list[str]:
    return [] if outcome is None else outcome.err.splitlines()


def _summary(outcome: Outcome | None) -> str:
    if outcome is None:
        return "not touched (an earlier host failed)"
    return "ok" if outcome.code == 0 else f"failed (exit {outcome.code})"
