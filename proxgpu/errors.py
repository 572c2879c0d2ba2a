"""The exceptions proxgpu raises.

Every error derives from :class:`ProxgpuError`, carries the facts that explain it as attributes
and renders a one-line message naming the host and, where there is one, the path. Each class has
an ``exit_code`` so that the command line can tell the kind of failure without parsing text.

>>> err = SysfsError("pve1", "/etc/pve/.members", "missing", "plan it without --cluster")
>>> str(err)
'pve1: /etc/pve/.members: missing; plan it without --cluster'
>>> err.exit_code
8
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from proxgpu.redact import redact_secrets


class ProxgpuError(Exception):
    """Root of every error proxgpu raises on purpose. Its message never holds a guest config's
    secret (see :mod:`proxgpu.redact`), whatever text from the host it quotes.

    >>> str(ProxgpuError("line 3: cipassword: $5$abc: unknown"))
    'line 3: cipassword: <redacted by proxgpu>'
    """

    exit_code = 1

    def __init__(self, message: str) -> None:
        message = redact_secrets(message)
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    @property
    def fix(self) -> str | None:
        """What to do about it, where the error knows (``None`` otherwise)."""
        return None

    def document(self) -> dict[str, object]:
        """The error as every front end reports it (``--json``'s ``error``, Ansible's
        ``error``): its exit ``code``, ``kind`` (the class), ``message``, ``host``, ``path``
        (``None`` where the error has none) and ``fix``.

        >>> SysfsError("pve1", "/x", "missing").document()
        {'code': 8, 'kind': 'SysfsError', 'message': 'pve1: /x: missing', 'host': 'pve1', \
'path': '/x', 'fix': None}
        """
        return {
            "code": self.exit_code,
            "kind": type(self).__name__,
            "message": str(self),
            "host": getattr(self, "host", None),
            "path": getattr(self, "path", None),
            "fix": self.fix,
        }


class UsageError(ProxgpuError):
    """The options given cannot work together."""

    exit_code = 2


class HostError(ProxgpuError):
    """Something went wrong reaching or using a host."""

    def __init__(self, host: str, detail: str) -> None:
        super().__init__(f"{host}: {detail}")
        self.host = host
        self.detail = detail


class HostUnreachableError(HostError):
    """The host cannot be reached (DNS, refused, timeout, dropped connection)."""

    exit_code = 3


class StepNotFinishedError(HostUnreachableError):
    """The host answered a step without proof that the step ran to its end (the end record
    every script writes last, with the run's token and its exit status): a lost connection,
    a script killed, or a host or wrapper that answers without running it. Nothing of such an
    answer is believed; the step is handled as one whose connection was lost.

    >>> str(StepNotFinishedError("pve1", "commit", "it answered exit 0 with no output"))
    'pve1: the host did not finish the commit step (it answered exit 0 with no output)'
    """

    def __init__(self, host: str, step: str, why: str) -> None:
        super().__init__(host, f"the host did not finish the {step} step ({why})")
        self.step = step


class AuthenticationError(HostError):
    """The host refused every credential offered."""

    exit_code = 4


class HostKeyError(HostError):
    """The host's key is not the one known_hosts expects."""

    exit_code = 5

    def __init__(self, host: str, detail: str, fingerprint: str, known_hosts: str) -> None:
        super().__init__(host, detail)
        self.fingerprint = fingerprint
        self.known_hosts = known_hosts


class HostKeyUnknownError(HostKeyError):
    """The host is not in known_hosts; proxgpu never trusts a new key silently."""


class HostKeyChangedError(HostKeyError):
    """The host offered a key that differs from the one in known_hosts."""


class HostKeyRevokedError(HostKeyError):
    """The host offered a key that a known_hosts ``@revoked`` line refuses."""


class KnownHostsDamagedError(HostKeyError):
    """A known_hosts line cannot be read: the host's key cannot be checked against it."""


class NotRootError(HostError):
    """The operation needs root on the host."""

    exit_code = 6


class CommandError(HostError):
    """A command on the host ran but failed."""

    exit_code = 7

    def __init__(self, host: str, argv: list[str], returncode: int, stderr: str) -> None:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else "no error output"
        super().__init__(host, f"{argv[0]} exited with {returncode}: {last}")
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr


class PveApiError(HostError):
    """A Proxmox API call failed; ``status`` is the HTTP-like code pvesh printed (500 if none).

    >>> str(PveApiError("pve1", "PUT", "/nodes/pve1/qemu/300/config", 400, "digest: changed"))
    'pve1: PUT /nodes/pve1/qemu/300/config: digest: changed'
    """

    exit_code = 7  # a command on the host failed

    def __init__(self, host: str, method: str, path: str, status: int, detail: str) -> None:
        super().__init__(host, f"{method} {path}: {detail}")
        self.method = method
        self.path = path
        self.status = status


class MappingChangedError(PveApiError):
    """Proxmox refused a cluster PCI mapping write: the file changed since it was read (the
    digest), or the mapping to create was made meanwhile."""


class CommandTimeoutError(HostError):
    """A command on the host did not finish in time (the host itself still answers)."""

    exit_code = 7

    def __init__(self, host: str, argv: list[str], seconds: float) -> None:
        super().__init__(host, f"{argv[0]} did not finish within {seconds:g} s")
        self.argv = argv
        self.seconds = seconds


class CommandOutputTooLargeError(HostError):
    """A command on the host answered more than proxgpu reads from one command: it was stopped.

    >>> str(CommandOutputTooLargeError("pve1", ["sh"], 64 << 20))
    'pve1: sh answered more than 64 MiB, stopped reading; a host file that large is not one \
proxgpu reads: check what the host holds there'
    """

    exit_code = 7

    def __init__(self, host: str, argv: list[str], limit: int) -> None:
        super().__init__(
            host,
            f"{argv[0]} answered more than {limit >> 20} MiB, stopped reading; a host file that "
            "large is not one proxgpu reads: check what the host holds there",
        )
        self.argv = argv
        self.limit = limit


#: Who writes the files inspection refuses, by where they are (the first match wins): proxgpu
#: never edits them, so what to do is to look at their writer, or, for a snapshot tree, to take
#: a new one.
_WRITERS = (
    (
        "/etc/pve/.members",
        "pmxcfs writes this file: check the cluster with `pvecm status` and pmxcfs with "
        "`systemctl status pve-cluster`",
        "proxgpu snapshot --cluster",
    ),
    ("/lib/modules/", "depmod writes this file: run `depmod` for that kernel", "proxgpu snapshot"),
    (
        "/var/lib/proxgpu/captured/nvidia-smi",
        "nvidia-smi printed this: check the NVIDIA driver with `nvidia-smi -L`",
        "proxgpu snapshot",
    ),
    (
        "/proc/",
        "the kernel writes this file: look for the kernel's or a driver's fault (`dmesg`)",
        "proxgpu snapshot",
    ),
    (
        "/sys/",
        "the kernel writes this file: look for the kernel's or a driver's fault (`dmesg`)",
        "proxgpu snapshot",
    ),
)


def file_fix(path: str) -> str | None:
    """What to do about a host file inspection refused, from where it is; ``None`` for a file
    of no known writer.

    >>> print(file_fix("/sys/bus/pci/devices/0000:01:00.0/numa_node"))
    the kernel writes this file: look for the kernel's or a driver's fault (`dmesg`); in a \
snapshot tree (--root) it is damaged: take a new `proxgpu snapshot`
    >>> file_fix("/etc/hostname") is None
    True
    """
    for prefix, writer, snapshot in _WRITERS:
        if path.startswith(prefix):
            return f"{writer}; in a snapshot tree (--root) it is damaged: take a new `{snapshot}`"
    return None


def not_utf8(data: bytes) -> str | None:
    """Where ``data`` stops being UTF-8, in the words every refusal of such a file uses; ``None``
    for UTF-8 text. proxgpu edits only UTF-8 text (as Proxmox writes its configs), so a file
    that is not is refused before a plan shows a change to it, and again at apply.

    >>> not_utf8(b"arch: amd64\\n# \\xff\\n"), not_utf8("# café\\n".encode())
    ('is not UTF-8 (byte 0xff at offset 14)', None)
    """
    try:
        data.decode()
    except UnicodeDecodeError as exc:
        return f"is not UTF-8 (byte {data[exc.start]:#04x} at offset {exc.start})"
    return None


#: Why a file that is not UTF-8 is not changed, and what to do, after :func:`not_utf8`'s words.
NOT_UTF8_WHY = "proxgpu edits only UTF-8 text, as Proxmox writes it"
NOT_UTF8_FIX = "fix that byte, then plan again"


class SysfsError(HostError):
    """A file inspection needs is missing or cannot be parsed: one line naming the host, the
    file, what is wrong and, as ``fix``, what to do (by default from who writes the file, see
    :func:`file_fix`).

    >>> err = SysfsError("pve1", "/sys/bus/pci/devices/0000:01:00.0/numa_node", "not a number")
    >>> err.reason, err.fix == file_fix(err.path)
    ('not a number', True)
    >>> print(SysfsError("pve1", "/etc/pve/.members", "lists no cluster", "plan it alone"))
    pve1: /etc/pve/.members: lists no cluster; plan it alone
    """

    exit_code = 8

    def __init__(self, host: str, path: str, reason: str, fix: str | None = None) -> None:
        fix = file_fix(path) if fix is None else fix
        super().__init__(host, f"{path}: {reason}" + (f"; {fix}" if fix else ""))
        self.path = path
        self.reason = reason
        self._fix = fix

    @property
    def fix(self) -> str | None:
        """What to do about it."""
        return self._fix


class Refusal(Protocol):
    """One reason a plan is refused, with what to do about it (the planner's ``Problem``)."""

    @property
    def code(self) -> str: ...

    @property
    def what(self) -> str: ...

    @property
    def fix(self) -> str: ...


class PlanRefusedError(ProxgpuError):
    """The planner refused: ``problems`` lists each reason with what to do about it.

    >>> from types import SimpleNamespace
    >>> problem = SimpleNamespace(code="iommu-off", what="IOMMU is off",
    ...                           fix="plan the kernel command line change")
    >>> print(PlanRefusedError("pve1", [problem]))
    pve1: plan refused (1 problem)
      - IOMMU is off
        fix: plan the kernel command line change
    """

    exit_code = 9

    def __init__(self, host: str, problems: Sequence[Refusal]) -> None:
        count = f"{len(problems)} problem" + ("" if len(problems) == 1 else "s")
        lines = [f"{host}: plan refused ({count})"]
        for problem in problems:
            lines += [f"  - {problem.what}", f"    fix: {problem.fix}"]
        super().__init__("\n".join(lines))
        self.host = host
        self.problems = list(problems)

    @property
    def fix(self) -> str | None:
        """Every problem's fix, one per line."""
        return "\n".join(problem.fix for problem in self.problems) or None


class ClusterNotPlannedError(ProxgpuError):
    """A cluster apply refused before any node changed: ``nodes`` could not be planned (each
    node's own error says why).

    >>> print(ClusterNotPlannedError(["pve2"]))
    nothing was applied: pve2 could not be planned
    """

    exit_code = 9

    def __init__(self, nodes: Sequence[str]) -> None:
        super().__init__(f"nothing was applied: {', '.join(nodes)} could not be planned")
        self.nodes = list(nodes)

    @property
    def fix(self) -> str | None:
        """What to do about it."""
        return "fix what each node's error names, then plan the cluster again"


class PreflightError(HostError):
    """apply or rollback refused before writing anything (running guest, ``lock:``, ...)."""

    exit_code = 10


class FileChangedError(PreflightError):
    """A file is no longer what the plan was made from (the compare-and-swap check failed)."""

    def __init__(self, host: str, path: str, detail: str) -> None:
        super().__init__(host, f"{path}: {detail}")
        self.path = path


class DeviceBusyError(PreflightError):
    """A GPU that would change driver is in use: unbinding it could block the kernel forever."""

    def __init__(self, host: str, addresses: list[str], detail: str) -> None:
        super().__init__(host, detail)
        self.addresses = addresses


class ConcurrentApplyError(PreflightError):
    """Another apply or rollback holds the host-wide lock."""

    exit_code = 11

    def __init__(self, host: str, detail: str, owner: dict[str, str]) -> None:
        super().__init__(host, detail)
        self.owner = owner

    @property
    def fix(self) -> str | None:
        """Wait, or take over a lock an interrupted apply or rollback left."""
        return "wait for it to finish, or run `proxgpu rollback --break-lock` if it was interrupted"


class ApplyError(HostError):
    """An apply failed after writing; ``restored`` says whether every file was put back."""

    exit_code = 12

    def __init__(self, host: str, detail: str, journal_id: str, restored: bool) -> None:
        super().__init__(host, detail)
        self.journal_id = journal_id
        self.restored = restored


class RollbackError(HostError):
    """A rollback cannot start or did not finish."""

    exit_code = 13


class LiveRebindError(HostError):
    """A runtime driver rebind failed, timed out or left a function on the wrong driver."""

    exit_code = 14

    def __init__(self, host: str, address: str, detail: str) -> None:
        super().__init__(host, f"{address}: {detail}")
        self.address = address


class JournalError(HostError):
    """A journal entry is missing or cannot be read."""

    exit_code = 15

    def __init__(self, host: str, path: str, detail: str) -> None:
        super().__init__(host, f"{path}: {detail}")
        self.path = path


class RenderError(ProxgpuError):
    """The plan cannot be turned into files (a target's config is missing, a minor unknown...):
    ``path`` is the file at fault where there is one, ``fix`` what to do (also in the message).

    >>> err = RenderError("pve1", "/etc/pve/qemu-server/301.conf", "no such VM config",
    ...                   "create the VM first (`qm create`)")
    >>> str(err), err.fix
    ('pve1: /etc/pve/qemu-server/301.conf: no such VM config; create the VM first (`qm create`)', \
'create the VM first (`qm create`)')
    """

    exit_code = 16

    def __init__(self, host: str, path: str | None, detail: str, fix: str | None = None) -> None:
        where = f"{host}: {path}" if path else host
        super().__init__(f"{where}: {detail}" + (f"; {fix}" if fix else ""))
        self.host = host
        self.path = path
        self.detail = detail
        self._fix = fix

    @property
    def fix(self) -> str | None:
        """What to do about it, where the renderer knows."""
        return self._fix


class DriftError(HostError):
    """``verify`` found the host different from the apply it compared with; ``drift`` has a line
    per difference."""

    exit_code = 17

    def __init__(self, host: str, drift: Sequence[str]) -> None:
        super().__init__(host, f"drift: {'; '.join(drift)}")
        self.drift = list(drift)
