"""The Proxmox VE API through proxmoxer, carried over the host's own connection.

proxmoxer's command backends turn an API call into one ``pvesh`` command. :class:`HostSession`
is such a backend whose only transport is :meth:`proxgpu.host.base.Host.run`: on a remote host the
call travels over the same verified SSH connection as every other command (no second connection,
no host-key shortcut), and pvesh runs there as root@pam, which the root-only options
(``hostpciN`` with a raw ``host=``, ``affinity``) need. :func:`proxmox_api` gives the usual
proxmoxer resource tree, so callers write ``api.nodes(node).qemu(vmid).status.current.get()``;
a failed call raises :class:`PveApiError`, one line naming the host and the API path.

Two things about proxmoxer's command backend (as of proxmoxer 2.3) are handled here: it takes
the status from the first ``NNN Text`` line of stderr and fails with 500 on any other stderr, so a
warning could turn a success into an exception; and it ignores the exit status, so a pvesh that
failed silently would count as a success. pvesh's exit status decides instead, and the warnings of
a successful call are kept in :attr:`HostSession.warnings` (:func:`pvesh_warnings`; an apply shows
them). Each data item becomes one ``-key str(value)`` pair, so only strings are passed (never
lists).

>>> config_update("cores: 2\\nnuma: 1\\n", "cores: 4\\nhostpci0: 0000:81:00,pcie=1\\n")
{'cores': '4', 'hostpci0': '0000:81:00,pcie=1', 'delete': 'numa'}
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from proxmoxer.backends.command_base import CommandBaseSession, JsonSimpleSerializer
from proxmoxer.core import ProxmoxResource, ResourceException

from proxgpu.errors import PveApiError
from proxgpu.host.base import CommandResult, Host
from proxgpu.pve.config import GuestConfig

#: Seconds one pvesh call may take (a config write or a status query takes well under one).
API_TIMEOUT = 60.0

_HEADER = re.compile(r"\[[^\]]*\]\s*")


class HostSession(CommandBaseSession):  # type: ignore[misc]  # proxmoxer ships no types
    """proxmoxer's command backend on top of a :class:`Host`: each request is one ``pvesh`` run.

    Needs proxmoxer >= 2.3, whose ``_exec`` returns ``(stdout, stderr, exit status)``.
    """

    def __init__(self, host: Host, timeout: float = API_TIMEOUT) -> None:
        super().__init__(service="PVE", timeout=timeout)
        self.host = host
        #: What pvesh printed on stderr in calls that succeeded.
        self.warnings: list[str] = []
        #: The last pvesh run, for error messages.
        self.last: CommandResult | None = None

    def _exec(self, cmd: Sequence[str]) -> tuple[str, str, int]:
        # Host.run takes the argument list as it is; SSH quotes it in proxgpu's one place.
        result = self.host.run(list(cmd), timeout=self.timeout)
        self.last = result
        stdout = result.stdout.decode("utf-8", "replace")
        stderr = result.stderr_text
        if result.ok:
            self.warnings += [line for line in stderr.splitlines() if line.strip()]
            return stdout, "", 0
        if not stderr.strip():
            # No stderr would read as success to proxmoxer: give it a status-less line (500).
            stderr = f"pvesh exited with {result.returncode}"
        return stdout, stderr, result.returncode


class PveResource(ProxmoxResource):  # type: ignore[misc]  # proxmoxer ships no types
    """A proxmoxer resource whose failures are :class:`PveApiError`."""

    def __getattr__(self, item: str) -> PveResource:
        if item.startswith("_"):
            raise AttributeError(item)
        return PveResource(**super().__getattr__(item)._store)

    def __call__(self, resource_id: Any = None) -> PveResource:
        return PveResource(**super().__call__(resource_id)._store)

    # proxmoxer's own verbs, declared so that type checkers see them as calls, not as the
    # sub-resources __getattr__ would make of them.
    def get(self, *args: Any, **params: Any) -> Any:
        """``GET`` this resource (proxmoxer's own method)."""
        return super().get(*args, **params)

    def put(self, *args: Any, **data: Any) -> Any:
        """``PUT`` this resource (proxmoxer's own method)."""
        return super().put(*args, **data)

    def _request(self, method: str, data: Any = None, params: Any = None) -> Any:
        session: HostSession = self._store["session"]
        path = self._store["base_url"]
        session.last = None
        try:
            return super()._request(method, data=data, params=params)
        except ResourceException as exc:
            raise PveApiError(
                session.host.name, method, path, exc.status_code, _detail(session.last, exc)
            ) from exc


def _detail(result: CommandResult | None, exc: ResourceException) -> str:
    if result is None:
        return str(exc)
    lines = [
        line.strip()
        for line in result.stderr_text.splitlines()
        # pvesh follows an error with its usage line; the error is what matters.
        if line.strip() and not line.startswith(("pvesh ", "USAGE:", "Usage:"))
    ]
    if not lines:
        return f"pvesh exited with {result.returncode}"
    first, rest = lines[0].rstrip("."), lines[1:]
    return f"{first}: {'; '.join(rest)}" if rest else first


def proxmox_api(host: Host, timeout: float = API_TIMEOUT) -> PveResource:
    """The root of ``host``'s Proxmox API, reached through pvesh over ``host``'s connection.

    >>> from proxgpu.host import LocalHost
    >>> proxmox_api(LocalHost()).nodes("pve1").qemu(300).config
    ProxmoxResource (/nodes/pve1/qemu/300/config)
    """
    return PveResource(
        base_url="", session=HostSession(host, timeout), serializer=JsonSimpleSerializer()
    )


def pvesh_warnings(api: PveResource) -> list[str]:
    """What pvesh printed on stderr in the calls through ``api`` that succeeded, each line once.

    >>> from proxgpu.host import LocalHost
    >>> pvesh_warnings(proxmox_api(LocalHost()))
    []
    """
    session: HostSession = api._store["session"]
    return list(dict.fromkeys(session.warnings))


def guest_status(api: PveResource, node: str, kind: str, vmid: int | str) -> str | None:
    """A guest's status (``running``, ``stopped``, ...) as ``status/current`` reports it.

    ``kind`` is ``qemu`` or ``lxc``.

    :raises PveApiError: when the API answers with an error.
    """
    answer = getattr(api.nodes(node), kind)(vmid).status.current.get()
    status = answer.get("status") if isinstance(answer, Mapping) else None
    return status if isinstance(status, str) else None


def config_digest(text: str) -> str:
    """The ``digest`` Proxmox gives a config: the SHA-1 of the file's bytes.

    >>> config_digest("")
    'da39a3ee5e6b4b0d3255bfef95601890afd80709'
    """
    return hashlib.sha1(text.encode()).hexdigest()


def _split(text: str) -> tuple[list[str], str]:
    """The main section's comment lines (the description) and everything from the first header."""
    lines = text.split("\n")
    end = next((i for i, line in enumerate(lines) if _HEADER.fullmatch(line)), len(lines))
    comments = [line.rstrip("\r") for line in lines[:end] if line.startswith("#")]
    return comments, "\n".join(lines[end:])


def config_update(before: str, after: str) -> dict[str, str] | None:
    """The ``PUT .../config`` parameters that turn VM config ``before`` into ``after``.

    Keys of the current (main) section that are new or changed are set; keys that disappeared go
    into ``delete``. ``None`` when the API cannot express the change: another section or the
    description differs, a key repeats, a value could not pass as one pvesh argument (empty,
    or starting with ``-``, which pvesh would read as an option), or the guest has pending
    changes (a write to a stopped VM applies all of them, not only these keys).

    >>> config_update("cores: 2\\n\\n[snap]\\ncores: 1\\n", "cores: 2\\n\\n[snap]\\ncores: 8\\n")
    """
    config = GuestConfig.parse(before)
    if any(name.lower() in ("pending", "pve:pending") for name in config.section_names()):
        return None
    old, new = config.entries(), GuestConfig.parse(after).entries()
    if len({k for k, _ in old}) != len(old) or len({k for k, _ in new}) != len(new):
        return None
    if _split(before) != _split(after):
        return None
    was, now = dict(old), dict(new)
    update = {key: value for key, value in now.items() if was.get(key) != value}
    if any(not value or value.startswith("-") for value in update.values()):
        return None
    if any(key in ("delete", "digest") or key.startswith("lxc.") for key in now):
        return None
    gone = [key for key in was if key not in now]
    if gone:
        update["delete"] = ",".join(gone)
    return update


def same_config(a: str, b: str) -> bool:
    """Whether two guest configs say the same thing, whatever the order of the main keys.

    Proxmox rewrites a config in its own order when it writes it; this tells its rewrite of a
    text from an edit by someone else.

    >>> same_config("#d\\nb: 2\\na: 1\\n\\n[s]\\nc: 3\\n", "#d\\na: 1\\nb: 2\\n\\n[s]\\nc: 3\\n")
    True
    >>> same_config("a: 1\\n", "a: 2\\n")
    False
    """
    if a == b:
        return True
    config_a, config_b = GuestConfig.parse(a), GuestConfig.parse(b)
    if sorted(config_a.entries()) != sorted(config_b.entries()):
        return False
    if _split(a)[0] != _split(b)[0]:
        return False
    names = config_a.section_names()
    return names == config_b.section_names() and all(
        sorted(config_a.section_entries(n)) == sorted(config_b.section_entries(n)) for n in names
    )


__all__: Sequence[str] = [
    "HostSession",
    "PveApiError",
    "PveResource",
    "config_digest",
    "config_update",
    "guest_status",
    "proxmox_api",
    "pvesh_warnings",
    "same_config",
]
