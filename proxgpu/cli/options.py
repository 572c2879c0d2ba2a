"""The options the commands share. Defining them imports nothing but argparse, so that
``proxgpu --help`` starts as fast as Python does; what they turn into is
:mod:`~proxgpu.cli.commandline`'s."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


class Once(argparse.Action):
    """An option that takes one value: given twice, it is refused (argparse would keep the last
    one silently). :class:`~proxgpu.cli.parser.Parser` makes it every option's default action;
    ``hint`` adds what to do instead.

    >>> parser = argparse.ArgumentParser(exit_on_error=False)
    >>> _ = parser.add_argument("--split", action=Once, default="numa")
    >>> parser.parse_args(["--split", "numa"]).split
    'numa'
    """

    def __init__(self, option_strings: list[str], dest: str, hint: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.hint = hint

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        # Which options this command line gave: a default (--split numa) is not a first value.
        given: set[str] = namespace.__dict__.setdefault(GIVEN, set())
        if option_string is not None and self.dest in given:
            what = self.metavar or "value"
            parser.error(f"{option_string} takes one {what}, given twice{self.hint}")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


#: The namespace attribute in which :class:`Once` notes the options given.
GIVEN = "_given_once"


def host_options(
    parser: argparse.ArgumentParser, *, rolling: bool, gpus: bool
) -> list[argparse.Action]:
    """Where the command runs, and how it gets there. ``--parallel`` only where hosts change
    one at a time (``rolling``); the GPU filters only where the command reads the GPUs. The
    options as added, but ``--forks`` and ``--parallel`` (how many at once, not which hosts)."""
    where = parser.add_argument_group("host (default: this machine)")
    where.add_argument(
        "--host",
        action="append",
        metavar="[USER@]HOST[:PORT]",
        help="a remote host, reached over SSH; repeat it (or give a comma list) for several",
    )
    where.add_argument(
        "--cluster",
        action="store_true",
        help="every online node of the Proxmox VE cluster that --host (or --root, a cluster "
        "snapshot) belongs to, from /etc/pve/.members; each node reached at its member address",
    )
    where.add_argument(
        "--forks",
        type=int,
        default=5,
        metavar="N",
        help="how many hosts to read at once (default 5, as Ansible)",
    )
    if rolling:
        where.add_argument(
            "--parallel",
            type=int,
            default=1,
            metavar="N",
            help="apply or roll back N hosts at a time (default 1: a rolling change)",
        )
    where.add_argument(
        "--root",
        metavar="DIR",
        hint=" (a cluster snapshot of several nodes: --cluster --root DIR)",
        help="a directory laid out like a host (a snapshot, an image): files only, no actions; "
        "with --host, such a directory on the remote host",
    )
    ssh = parser.add_argument_group("SSH (settings in ~/.ssh/config apply too)")
    ssh.add_argument("--port", type=int, help="SSH port")
    ssh.add_argument("--user", help="SSH user (default from ~/.ssh/config, else your name)")
    ssh.add_argument("-i", "--identity", metavar="KEY", help="private key file")
    ssh.add_argument("--known-hosts", metavar="FILE", help="known_hosts file to verify against")
    ssh.add_argument(
        "--accept-new-host-key",
        action="store_true",
        help="trust and record a host key seen for the first time (never a changed one)",
    )
    ssh.add_argument("--ssh-config", metavar="FILE", help="SSH config file (default ~/.ssh/config)")
    ssh.add_argument(
        "--connect-timeout", type=float, metavar="SECONDS", help="default ConnectTimeout, else 10"
    )
    ssh.add_argument(
        "--ssh-client",
        choices=("openssh", "paramiko", "auto"),
        help="SSH transport (default $PROXGPU_SSH_CLIENT, else auto: paramiko unless the host "
        "needs OpenSSH's ssh)",
    )
    filters = gpu_options(parser) if gpus else []
    # Not offered, but the fleet and cluster code reads every command's namespace alike.
    parser.set_defaults(parallel=1, gpu_class=None, gpu_vendor=None)
    chosen = [*where._group_actions, *ssh._group_actions, *filters]
    return [action for action in chosen if action.dest not in ("forks", "parallel")]


def gpu_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    gpus = parser.add_argument_group("what counts as a GPU")
    gpus.add_argument(
        "--gpu-class",
        action="append",
        metavar="PREFIX",
        help="PCI class prefix in hex (default 03 and 12: every display controller, and the "
        "processing accelerators that are GPUs)",
    )
    gpus.add_argument(
        "--gpu-vendor",
        action="append",
        metavar="VENDOR",
        help="only this PCI vendor ID (e.g. 10de), its accelerators that are not GPUs too; "
        "repeatable",
    )
    return gpus._group_actions


#: An option forwarded to another command as it was given: its destination, its flag, its
#: default, and whether it is a flag alone (``store_true``). A plain tuple: the parser makes
#: these for every run, ``--help`` too, which a dataclass would make import ``dataclasses``
#: (and ``inspect`` with it), some 5 ms.
Forwarded = tuple[str, str, object, bool]


def forwarded(actions: list[argparse.Action]) -> tuple[Forwarded, ...]:
    """The options ``actions`` added, compared by value (a parser's own actions are not)."""
    return tuple((a.dest, a.option_strings[-1], a.default, a.nargs == 0) for a in actions)


def given(args: argparse.Namespace, options: Sequence[Forwarded]) -> list[str]:
    """The command-line words that give ``options`` the values ``args`` has, where those are
    not the defaults: what another command needs to act on the same host or split.

    >>> parser = argparse.ArgumentParser()
    >>> options = forwarded([parser.add_argument("--lxc", action="append", default=[]),
    ...                      parser.add_argument("--live", action="store_true")])
    >>> given(parser.parse_args(["--lxc", "200", "--lxc", "201:2", "--live"]), options)
    ['--lxc', '200', '--lxc', '201:2', '--live']
    """
    words: list[str] = []
    for dest, flag, default, alone in options:
        value = getattr(args, dest, default)
        if value == default or value is None:
            continue
        if alone:
            words.append(flag)
            continue
        for one in value if isinstance(value, list) else [value]:
            words += [flag, str(one)]
    return words


def plan_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options that make a split (what it is, how its files are written), as added."""
    split = parser.add_argument_group("the split")
    split.add_argument(
        "--split",
        choices=["numa"],
        default="numa",
        help="one group per NUMA node; the lowest node with GPUs stays on the host",
    )
    split.add_argument(
        "--host-node",
        type=int,
        action="append",
        default=[],
        metavar="N",
        help="keep this NUMA node's GPUs on the host driver (repeatable)",
    )
    split.add_argument(
        "--vfio-node",
        type=int,
        action="append",
        default=[],
        metavar="N",
        help="bind this NUMA node's GPUs to vfio-pci (repeatable)",
    )
    split.add_argument("--host-gpus", metavar="ADDR,...", help="keep these GPUs on the host driver")
    split.add_argument("--vfio-gpus", metavar="ADDR,...", help="bind these GPUs to vfio-pci")
    split.add_argument(
        "--lxc",
        action="append",
        default=[],
        metavar="VMID[:N][@NODE]|VMID:mig=GPU/GI[/CI]",
        help="container that gets the host group, or N GPUs of it on one NUMA node, @NODE: of "
        "that node, pinned to it, or one MIG instance of GPU (CUDA index or address; GI/CI as "
        "nvidia-smi mig -lgi/-lci print them) (repeatable: the containers without N share what "
        "is left)",
    )
    split.add_argument(
        "--vm",
        action="append",
        default=[],
        metavar="VMID[:N|:vgpu=TYPE]",
        help="VM that gets vfio GPUs (N of them), or a vGPU of an mdev TYPE (repeatable)",
    )
    split.add_argument(
        "--enable-iommu",
        action="store_true",
        help="turn the IOMMU on in the kernel command line if it is off",
    )
    files = parser.add_argument_group("how the files are written")
    files.add_argument(
        "--bind-method",
        choices=["modprobe", "driverctl"],
        default="modprobe",
        help="boot-time binding: modprobe.d hook (default) or driverctl overrides",
    )
    files.add_argument(
        "--mapping", metavar="NAME", help="give VMs their GPUs through this cluster PCI mapping"
    )
    return [*split._group_actions, *files._group_actions]


def common_options(parser: argparse.ArgumentParser, *, json_help: str) -> None:
    """The options every command takes: ``--json``, colour and how much to say."""
    parser.add_argument(
        "--json",
        action="store_true",
        help=f'print {json_help} as one JSON document (a failure as {{"error": ...}})',
    )
    output = parser.add_argument_group("output")
    output.add_argument(
        "--color",
        choices=["auto", "always", "never"],
        default="auto",
        help="colour the diff: auto (a terminal, unless NO_COLOR or TERM=dumb), always, never",
    )
    output.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="say what runs on the host and how long it takes (-vv: more)",
    )
    output.add_argument("-q", "--quiet", action="store_true", help="say only what went wrong")


class VersionAction(argparse.Action):
    """``--version``: the installed version, looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        from proxgpu.version import version  # noqa: PLC0415 - looked up only when asked for

        print(f"proxgpu {version()}")  # on stdout, as `--version` does everywhere
        parser.exit()
