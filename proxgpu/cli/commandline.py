"""The command line, read once: every option as the library's own types (the host's
:class:`~proxgpu.host.sshcommon.SSHOptions`, the :class:`~proxgpu.inspection.GpuFilter`, the
:class:`~proxgpu.apply.ApplyOptions`, the split's policy and render options), built from
argparse's namespace by :func:`read` and handed to the commands; no namespace goes past it.

A run over several hosts hands each host's work the command line of that host alone
(:meth:`CommandLine.at`): a single host is a fleet of one, and what a host's result tells the
admin to run next names that host.

>>> from proxgpu.cli.parser import build_parser
>>> args = build_parser().parse_args(["plan", "--root", "examples/hosts/ct200", "--vm", "300"])
>>> line = read(args)
>>> line.policy.vms, line.hosts, next_command(line, "verify")
([(300, None)], (), 'proxgpu verify --root examples/hosts/ct200')
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import threading
from dataclasses import dataclass, field, replace
from importlib import import_module
from typing import TYPE_CHECKING, Any

from proxgpu.cli.console import wants_color
from proxgpu.cli.options import given
from proxgpu.errors import UsageError
from proxgpu.host.base import Host
from proxgpu.host.sshcommon import SSHOptions
from proxgpu.inspection.recognition import GpuFilter

if TYPE_CHECKING:
    # Built only for the commands that plan or apply: the planner brings pydantic along, the
    # write path its journal and transaction.
    from proxgpu.apply.options import ApplyOptions
    from proxgpu.fleet import Target
    from proxgpu.planning import SplitPolicy
    from proxgpu.rendering import RenderOptions

#: With ``-v``, how many of a running follow-up action's last output lines each read shows.
ACTION_OUTPUT = 5


class Early:
    """A host opened ahead of the command (see :mod:`~proxgpu.cli.hosts`), handed out once."""

    def __init__(self) -> None:
        self._key: tuple[str | None, str | None] | None = None
        self._host: Host | None = None
        self._lock = threading.Lock()

    def keep(self, key: tuple[str | None, str | None], host: Host) -> None:
        """Hold ``host``, opened for ``key`` (the host and root it reaches)."""
        with self._lock:
            self._key, self._host = key, host

    def take(self, key: tuple[str | None, str | None] | None = None) -> Host | None:
        """The host opened for ``key`` (any, without one), once; ``None`` after that."""
        with self._lock:
            if self._host is None or key not in (None, self._key):
                return None
            host, self._host = self._host, None
        return host


@dataclass(frozen=True, kw_only=True)
class CommandLine:
    """A command line, read. Where the command runs: ``hosts`` (SSH targets, as given, commas
    expanded), ``root``, ``cluster``, ``ssh``, ``forks`` and ``parallel``; what counts as a GPU
    (``gpus``); how it shows its result (``json``, ``color``, ``verbose``, ``quiet``,
    ``detailed``: ``--detailed-exitcode``); the split (``policy``, ``render``: ``None`` for a
    command that plans nothing); how an apply or rollback runs (``apply``, ``None`` for the
    other commands); ``dry_run`` and ``trust_unsigned``, a command's ``--dry-run`` (``run``'s
    too) and ``--trust-unsigned`` (``verify``'s too); and each command's own options
    (``guests``: ``verify`` looks at the guests, unless ``--no-guests``). ``reach``
    and ``request`` are the words that give the same SSH settings and the same split to the
    command a result says to run next. ``one_of``: the name of this host among several, which
    a run over several hosts gives each host's command line."""

    command: str
    hosts: tuple[str, ...] = ()
    root: str | None = None
    cluster: bool = False
    ssh: SSHOptions = field(default_factory=SSHOptions)
    forks: int = 5
    parallel: int = 1
    gpus: GpuFilter = field(default_factory=GpuFilter)
    json: bool = False
    color: bool = False
    verbose: int = 0
    quiet: bool = False
    detailed: bool = False
    policy: SplitPolicy | None = None
    render: RenderOptions | None = None
    apply: ApplyOptions | None = None
    dry_run: bool = False
    trust_unsigned: bool = False
    yes: bool = False
    output: str | None = None
    out: str | None = None
    plan: str | None = None
    to: str | None = None
    guests: bool = True
    format: str = "text"
    tree: bool = False
    gpu_set: tuple[str, ...] = ()
    tp: int = 0
    node: int | None = None
    job: tuple[str, ...] = ()
    shell: str = ""
    reach: tuple[str, ...] = ()
    request: tuple[str, ...] = ()
    one_of: str | None = None
    early: Early = field(default_factory=Early, compare=False, repr=False)

    @property
    def host(self) -> str | None:
        """The SSH target of a command run on one host (the first of several)."""
        return self.hosts[0] if self.hosts else None

    def split(self) -> tuple[SplitPolicy, RenderOptions]:
        """The split this command line asks for, and how its files are written.

        :raises UsageError: for a command that takes no split options.
        """
        if self.policy is None or self.render is None:
            raise UsageError(f"proxgpu {self.command} takes no split options")
        return self.policy, self.render

    def at(self, target: Target, name: str) -> CommandLine:
        """This command line for ``target`` alone, known as ``name`` among the hosts run."""
        hosts = (target.host,) if target.host else ()
        return replace(
            self, hosts=hosts, root=target.root, cluster=False, one_of=name, early=Early()
        )


def read(args: argparse.Namespace, detailed: bool = False) -> CommandLine:
    """What the options in ``args`` say, as :class:`CommandLine`.

    :raises UsageError: for a split option the policy cannot take (``--lxc 20x``), a host list
        that is not one, or ``inspect --json`` with a picture (``--tree``, ``--format svg``).
    """
    values = vars(args)
    if values.get("json") and (values.get("tree") or values.get("format", "text") != "text"):
        raise UsageError("--json prints the inventory: leave out --tree and --format svg")
    reached = [o for o in values.get("host_options", ()) if o[0] not in ("host", "root", "cluster")]
    policy, render = _split(args) if "split_options" in values else (None, None)
    return CommandLine(
        command=args.command,
        hosts=_expand(values.get("host")),
        root=values.get("root"),
        cluster=values.get("cluster", False),
        ssh=_ssh(args) if "host_options" in values else SSHOptions(),
        forks=values.get("forks", 5),
        parallel=values.get("parallel", 1),
        gpus=GpuFilter.of(values.get("gpu_class"), values.get("gpu_vendor")),
        json=values.get("json", False),
        color=wants_color(
            values.get("color", "never"), tty=sys.stdout.isatty(), environ=os.environ
        ),
        verbose=values.get("verbose", 0),
        quiet=values.get("quiet", False),
        detailed=detailed,
        policy=policy,
        render=render,
        # Apply and rollback, the commands that take a lock, are the ones with --break-lock.
        apply=_apply_options(values) if "break_lock" in values else None,
        dry_run=values.get("dry_run", False),
        trust_unsigned=values.get("trust_unsigned", False),
        yes=values.get("yes", False),
        output=values.get("output"),
        out=values.get("out"),
        plan=values.get("plan"),
        to=values.get("to"),
        guests=values.get("guests", True),
        format=values.get("format", "text"),
        tree=values.get("tree", False),
        gpu_set=tuple(s.strip() for s in values.get("gpus", "").split(",") if s.strip()),
        tp=values.get("tp", 0),
        node=values.get("node"),
        job=_job(values.get("job") or []),
        shell=values.get("shell", ""),
        reach=tuple(given(args, reached)),
        request=tuple(given(args, values.get("split_options", ()))),
    )


def _expand(values: list[str] | None) -> tuple[str, ...]:
    # The fleet engine is imported only for several hosts: it brings the planner along.
    if not values or (len(values) == 1 and "," not in values[0]):
        return tuple(v.strip() for v in values or [] if v.strip())
    return tuple(import_module("proxgpu.fleet.engine").expand_hosts(values))


def _ssh(args: argparse.Namespace) -> SSHOptions:
    return SSHOptions(
        user=args.user,
        port=args.port,
        identity_file=args.identity,
        known_hosts=args.known_hosts,
        accept_new_host_key=args.accept_new_host_key,
        connect_timeout=args.connect_timeout,
        ssh_config=args.ssh_config,
        client=args.ssh_client,
    )


def _split(args: argparse.Namespace) -> tuple[SplitPolicy, RenderOptions]:
    """The split the options ask for, and how its files are written."""
    from proxgpu.planning import SplitPolicy  # noqa: PLC0415 - the planning commands' only
    from proxgpu.rendering import RenderOptions  # noqa: PLC0415 - the planning commands' only

    def addresses(text: str | None) -> list[str]:
        return [a.strip() for a in (text or "").split(",") if a.strip()]

    policy = SplitPolicy(
        split=args.split,
        host_nodes=args.host_node,
        vfio_nodes=args.vfio_node,
        host_gpus=addresses(args.host_gpus),
        vfio_gpus=addresses(args.vfio_gpus),
        lxc=args.lxc,
        vms=args.vm,
        enable_iommu=args.enable_iommu,
    )
    return policy, RenderOptions(bind_method=args.bind_method, mapping=args.mapping)


def _apply_options(values: dict[str, Any]) -> ApplyOptions:
    """``--dry-run``, ``--live``, ``--skip-guest-check``, ``--break-lock``, ``--force``,
    ``--trust-unsigned`` (each off where the command has none), and with ``-v`` a running
    action's last output lines."""
    from proxgpu.apply.options import ApplyOptions  # noqa: PLC0415 - apply's and rollback's only

    return ApplyOptions(
        dry_run=bool(values.get("dry_run", False)),
        live=bool(values.get("live", False)),
        skip_guest_check=bool(values.get("skip_guest_check", False)),
        break_lock=bool(values.get("break_lock", False)),
        force=bool(values.get("force", False)),
        trust_unsigned=bool(values.get("trust_unsigned", False)),
        action_output=ACTION_OUTPUT if values.get("verbose") else 0,
    )


def _job(words: list[str]) -> tuple[str, ...]:
    """``run``'s command, without the ``--`` that ends proxgpu's options."""
    return tuple(words[1:] if words[:1] == ["--"] else words)


def same_host(line: CommandLine) -> list[str]:
    """The options that reach the host (or hosts) ``line`` runs on, as words.

    >>> same_host(CommandLine(command="plan", hosts=("pve1", "pve2"), reach=("--port", "2222")))
    ['--host', 'pve1', '--host', 'pve2', '--port', '2222']
    """
    words = [word for host in line.hosts for word in ("--host", host)]
    words += ["--cluster"] if line.cluster else []
    words += ["--root", line.root] if line.root else []
    return [*words, *line.reach]


def next_command(line: CommandLine, verb: str, *words: str) -> str:
    """The command line of ``proxgpu VERB`` on the host ``line`` runs on, with ``words`` after
    the host options: what a plan or a report tells the admin to run next.

    >>> next_command(CommandLine(command="plan", root="/srv/snap"), "verify")
    'proxgpu verify --root /srv/snap'
    """
    return shlex.join(["proxgpu", verb, *same_host(line), *words])
