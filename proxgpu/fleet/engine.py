"""Work over many hosts: concurrent reads bounded by ``forks``, rolling changes that stop at the
first failure, a typed outcome per host, and each host's steps as events while they happen.

The work is a function of one opened host and a :class:`Say` for its steps (the
``progress`` that :func:`proxgpu.apply.apply_changes` takes; ``say.name`` is the host's name
in the run); hosts are
opened with ``connect`` (by default :func:`proxgpu.host.connect`), so tests and Ansible pass
their own.

>>> from proxgpu.inspection import inspect
>>> outcomes = each_host({"ct200": Target(root="examples/hosts/ct200")},
...                      lambda host, say: len(inspect(host).gpus))
>>> outcomes["ct200"].unwrap()
8
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from proxgpu.callback import require_callable
from proxgpu.errors import ProxgpuError
from proxgpu.host import Host, connect

T = TypeVar("T")

#: How many hosts are read at once by default, as Ansible's forks.
FORKS = 5
#: A step quiet for this long is said to be still running, then again at each such interval.
HEARTBEAT = 10.0


@dataclass(frozen=True)
class Target:
    """How one host is reached: an SSH target, a tree (on the remote host with both), or, with
    neither, this machine (see :func:`proxgpu.host.connect`).

    >>> str(Target("root@pve1")), str(Target(root="snap/pve2"))
    ('root@pve1', 'snap/pve2')
    """

    host: str | None = None
    root: str | None = None

    def __str__(self) -> str:
        return self.host or self.root or "this machine"


#: Opens the host a target names.
Connect = Callable[[Target], Host]


class Say(Protocol):
    """A host's steps, as apply's ``progress`` takes them (``say(step, message)``), and the
    name the host was given (``say.name``)."""

    name: str

    def __call__(self, step: str, message: str) -> None:
        """Report one step."""


@dataclass(frozen=True)
class Event:
    """One thing a host did, as it happened: a step (``write``, ``action``, ...), ``still``
    running (the heartbeat of a long step), a line of a running action's ``output`` (with
    :class:`~proxgpu.apply.ApplyOptions`' ``action_output``), or its ``end`` with the exit
    code."""

    host: str
    elapsed: float
    step: str
    message: str
    code: int | None = None

    def __str__(self) -> str:
        """The event as the command line prints it on stderr.

        >>> str(Event("pve2", 3.14, "write", "replacing 5 files"))
        'pve2: [   3.1s] write: replacing 5 files'
        >>> str(Event("pve2", 9.0, "end", "ok", 0))
        'pve2: ok'
        >>> str(Event("pve2", 61.0, "output", "update-initramfs: Generating /boot/initrd.img"))
        'pve2:   | update-initramfs: Generating /boot/initrd.img'
        """
        if self.step == "end":
            return f"{self.host}: {self.message}"
        if self.step == "output":
            return f"{self.host}:   | {self.message}"
        what = self.message if self.step == "still" else f"{self.step}: {self.message}"
        return f"{self.host}: [{self.elapsed:6.1f}s] {what}"


Listener = Callable[[Event], None]


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """One host's result, or the error that stopped it.

    >>> from proxgpu.errors import UsageError
    >>> Outcome("pve1", error=UsageError("no")).code
    2
    """

    host: str
    result: T | None = None
    error: ProxgpuError | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the work finished without an error."""
        return self.error is None

    @property
    def code(self) -> int:
        """The exit code the host's run alone would have had: its error's, else the one its
        result carries (an integer ``code``, as a verify that found drift carries 17), else 0.

        >>> from types import SimpleNamespace
        >>> Outcome("pve1", result=SimpleNamespace(code=17)).code
        17
        """
        if self.error is not None:
            return self.error.exit_code
        carried = getattr(self.result, "code", 0)
        return carried if isinstance(carried, int) else 0

    def or_error(self) -> T | ProxgpuError:
        """The result, or the error in its place."""
        return self.result if self.error is None else self.error  # type: ignore[return-value]

    def unwrap(self) -> T:
        """The result; the error raised again when there is none."""
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


@dataclass(frozen=True)
class Rollout(Generic[T]):
    """A change rolled out host by host: who is done, who failed (their apply put back what it
    had written), who was never touched because an earlier host failed.

    >>> from proxgpu.errors import UsageError
    >>> failed = Outcome("b", error=UsageError("x"))
    >>> r = Rollout(["a", "b", "c"], {"a": Outcome("a", 1), "b": failed})
    >>> r.done, r.failed, r.not_touched, r.code
    (['a'], ['b'], ['c'], 2)
    """

    hosts: list[str]
    outcomes: dict[str, Outcome[T]] = field(default_factory=dict)

    @property
    def done(self) -> list[str]:
        """The hosts whose change finished, in order."""
        return [h for h in self.hosts if h in self.outcomes and self.outcomes[h].ok]

    @property
    def failed(self) -> list[str]:
        """The hosts whose change failed, in order."""
        return [h for h in self.hosts if h in self.outcomes and not self.outcomes[h].ok]

    @property
    def not_touched(self) -> list[str]:
        """The hosts after the first failure, never connected to."""
        return [h for h in self.hosts if h not in self.outcomes]

    @property
    def code(self) -> int:
        """The worst host's exit code."""
        return max((o.code for o in self.outcomes.values()), default=0)


def expand_hosts(values: Sequence[str] | None) -> list[str]:
    """``--host`` values (or Ansible's list), each possibly a comma list, in order, no repeats.

    >>> expand_hosts(["pve1,pve2", "pve3", "pve1"])
    ['pve1', 'pve2', 'pve3']
    """
    hosts = [h.strip() for value in values or [] for h in value.split(",") if h.strip()]
    return list(dict.fromkeys(hosts))


#: What a fleet function takes for its hosts.
Hosts = Sequence[str | Target] | Mapping[str, Target]


def targets_of(hosts: Hosts) -> dict[str, Target]:
    """Host names with their targets: SSH targets as given (a name, or a :class:`Target`, named
    as it prints), or a mapping kept as it is.

    >>> targets_of(["pve1", Target(root="snap/pve2")])
    {'pve1': Target(host='pve1', root=None), 'snap/pve2': Target(host=None, root='snap/pve2')}

    :raises TypeError: for anything else, saying what is wanted.
    """
    if isinstance(hosts, Mapping):
        return dict(hosts)
    if isinstance(hosts, str | Target) or not isinstance(hosts, Sequence):
        raise TypeError(
            "hosts must be a list of host names or Targets, or a mapping of names to Targets; "
            f"got {type(hosts).__name__}"
        )
    targets: dict[str, Target] = {}
    for one in hosts:
        if not isinstance(one, str | Target):
            raise TypeError(
                f"hosts must be host names or Targets (Target(host=...) or Target(root=...)); "
                f"got {one!r}"
            )
        target = one if isinstance(one, Target) else Target(host=one)
        targets[str(target)] = target
    return targets


def each_host(
    hosts: Hosts,
    work: Callable[[Host, Say], T],
    *,
    connect: Connect | None = None,
    forks: int = FORKS,
    on_event: Listener | None = None,
    heartbeat: float = HEARTBEAT,
) -> dict[str, Outcome[T]]:
    """Run ``work`` on every host, ``forks`` at a time; the outcomes in the order given.
    ``on_event`` hears each step as it happens, a ``still`` event when one has been running
    for ``heartbeat`` seconds (and each such interval after), and each host's ``end``.

    :raises Exception: only a bug (anything not a ProxgpuError) stops the run.
    """
    runner = _Runner(targets_of(hosts), work, connect, on_event, heartbeat)
    names = list(runner.targets)
    with ThreadPoolExecutor(max_workers=max(1, forks)) as pool:
        return dict(zip(names, pool.map(runner.one, names), strict=True))


def roll_out(
    hosts: Hosts,
    work: Callable[[Host, Say], T],
    *,
    connect: Connect | None = None,
    parallel: int = 1,
    lead: str | None = None,
    on_event: Listener | None = None,
    heartbeat: float = HEARTBEAT,
) -> Rollout[T]:
    """Run a change on the hosts ``parallel`` at a time (``lead`` first and alone: the node
    whose apply writes a cluster's mapping), stopping after the first batch where one failed.

    >>> from proxgpu.inspection import inspect
    >>> trees = {n: Target(root=f"examples/hosts/cluster-3/{n}") for n in ("pve1", "pve2")}
    >>> roll_out(trees, lambda host, say: inspect(host).node_name, lead="pve2").done
    ['pve1', 'pve2']
    """
    runner = _Runner(targets_of(hosts), work, connect, on_event, heartbeat)
    names = list(runner.targets)
    rest = [h for h in names if h != lead]
    width = max(1, parallel)
    batches = [[lead]] if lead in names else []
    batches += [rest[start : start + width] for start in range(0, len(rest), width)]
    rollout: Rollout[T] = Rollout(names)
    with ThreadPoolExecutor(max_workers=width) as pool:
        for batch in batches:
            rollout.outcomes.update(zip(batch, pool.map(runner.one, batch), strict=True))
            if any(not rollout.outcomes[h].ok for h in batch):
                break
    return rollout


class _Runner(Generic[T]):
    """One run's work, the way it opens hosts and where their events go."""

    def __init__(
        self,
        targets: dict[str, Target],
        work: Callable[[Host, Say], T],
        connector: Connect | None,
        on_event: Listener | None,
        heartbeat: float = HEARTBEAT,
    ) -> None:
        require_callable(work, "work", "work(host, say)", 2)
        if on_event is not None:
            require_callable(on_event, "on_event", "on_event(event)", 1)
        self.heartbeat = heartbeat
        self.targets = targets
        self.work = work
        self.connect = connector or open_target
        self.on_event = on_event

    def one(self, name: str) -> Outcome[T]:
        steps = _Steps(name, self.on_event, self.heartbeat)
        try:
            with steps, self.connect(self.targets[name]) as host:
                outcome = Outcome(name, result=self.work(host, steps))
        except ProxgpuError as exc:
            outcome = Outcome(name, error=exc)
        outcome = Outcome(name, outcome.result, outcome.error, steps.elapsed())
        steps.end(outcome.code)
        return outcome


def open_target(target: Target) -> Host:
    """The host ``target`` names, opened with :func:`proxgpu.host.connect` (the default
    ``connect=`` of every function here)."""
    return connect(target.host, target.root)


class _Steps:
    """A host's ``say``: each step an event, and while one step runs long, a heartbeat."""

    def __init__(self, name: str, listener: Listener | None, beat: float = HEARTBEAT) -> None:
        self.name = name
        self.listener = listener
        self.beat = beat
        self.start = time.monotonic()
        self.step = ("", "", self.start)
        self.next_beat = self.start + beat
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def __call__(self, step: str, message: str) -> None:
        if step == "output":  # a line of the running step's output: that step still runs
            self._emit(step, message)
            return
        now = time.monotonic()
        with self.lock:
            self.step, self.next_beat = (step, message, now), now + self.beat
        self._emit(step, message)

    def end(self, code: int) -> None:
        self._emit("end", "ok" if code == 0 else f"failed (exit {code})", code)

    def __enter__(self) -> _Steps:
        if self.listener is not None:
            threading.Thread(target=self._heartbeat, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()

    def _heartbeat(self) -> None:
        while not self.stop.wait(min(1.0, self.beat / 4)):
            now = time.monotonic()
            with self.lock:
                (step, message, since), due = self.step, self.next_beat <= now
                if due:
                    self.next_beat += self.beat
            if step and due:
                # An action's message is its command line: its program names it.
                what = message.split(" ", 1)[0] if step == "action" else message or step
                self._emit("still", f"still running {what}, {_duration(now - since)}")

    def _emit(self, step: str, message: str, code: int | None = None) -> None:
        if self.listener is not None:
            self.listener(Event(self.name, self.elapsed(), step, message, code))


def _duration(seconds: float) -> str:
    """``1m30s``, ``45s``.

    >>> _duration(90.4), _duration(45)
    ('1m30s', '45s')
    """
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"
