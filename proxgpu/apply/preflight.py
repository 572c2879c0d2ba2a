"""The checks an apply makes before it writes anything: guest locks, running guests, and which
files to write, refusing any that is no longer what the plan was made from (compare-and-swap).

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.rendering.changes import FileChange
>>> change = FileChange(path="/etc/pve/lxc/200.conf", before="lock: backup\\n", after="", why="")
>>> refuse_locked_guests(DirectoryHost("examples/hosts/ct200"), [change])
Traceback (most recent call last):
...
proxgpu.errors.PreflightError: dir:examples/hosts/ct200: /etc/pve/lxc/200.conf: the guest is \
locked (backup): Proxmox is busy with it; wait for that to finish (or `qm unlock`/`pct unlock` a \
stale lock), then plan again
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from proxgpu.apply.remote import FileState, sha
from proxgpu.errors import (
    NOT_UTF8_FIX,
    NOT_UTF8_WHY,
    FileChangedError,
    PreflightError,
    PveApiError,
    not_utf8,
)
from proxgpu.host.base import Host
from proxgpu.host.scripts import read_files
from proxgpu.inspection.capture import key_number
from proxgpu.paths import guest_of, is_vm_config
from proxgpu.planning.model import Plan
from proxgpu.pve.api import PveResource, guest_status, same_config
from proxgpu.pve.config import GuestConfig
from proxgpu.rendering.changes import FileChange


def refuse_locked_guests(host: Host, changes: Sequence[FileChange]) -> None:
    """Refuse when a guest config that changes carries Proxmox's ``lock:`` key.

    :raises PreflightError: naming the config and the lock.
    """
    # The compare-and-swap check guarantees the file is still `before`, so reading it is enough.
    for change in changes:
        if guest_of(change.path) and change.before is not None:
            lock = GuestConfig.parse(change.before).get("lock")
            if lock:
                raise PreflightError(
                    host.name,
                    f"{change.path}: the guest is locked ({lock}): Proxmox is busy with it; "
                    "wait for that to finish (or `qm unlock`/`pct unlock` a stale lock), then "
                    "plan again",
                )


def refuse_unfinished(host: Host, in_progress: Sequence[str]) -> None:
    """Refuse an apply while a journal entry is still in progress (``in_progress``, as the
    probe found them): an earlier apply did not finish, and its rollback comes first.

    >>> from proxgpu.host import DirectoryHost
    >>> refuse_unfinished(DirectoryHost("examples/hosts/ct200"), ["20261206T101500Z-1a2b"])
    Traceback (most recent call last):
    ...
    proxgpu.errors.PreflightError: dir:examples/hosts/ct200: journal entry \
20261206T101500Z-1a2b is still in progress: an earlier apply did not finish; run \
`proxgpu rollback --to 20261206T101500Z-1a2b` first
    """
    if in_progress:
        raise PreflightError(
            host.name,
            f"journal entry {in_progress[0]} is still in progress: an earlier apply did not "
            f"finish; run `proxgpu rollback --to {in_progress[0]}` first",
        )


def check_guests(
    host: Host,
    changes: Sequence[FileChange],
    has_pvesh: bool,
    api: Callable[[], PveResource],
    node: str,
) -> None:
    """Refuse unless every guest whose config changes is stopped, asking the Proxmox API.

    :raises PreflightError: naming the guest that runs, or why its state is unknown.
    """
    guests = sorted(
        {guest for c in changes if c.before is not None and (guest := guest_of(c.path))}
    )
    if not guests:
        return
    if not has_pvesh:
        names = ", ".join(f"{'qemu' if kind == 'vm' else 'lxc'} {vmid}" for kind, vmid in guests)
        raise PreflightError(
            host.name,
            f"pvesh is not on this host, so whether {names} are running cannot be checked; "
            "stop them and pass skip_guest_check (--skip-guest-check) to apply anyway",
        )
    for kind, vmid in guests:
        label = f"{'VM' if kind == 'vm' else 'container'} {vmid}"
        api_kind = "qemu" if kind == "vm" else "lxc"
        try:
            status = guest_status(api(), node, api_kind, str(vmid))
        except PveApiError as exc:
            raise PreflightError(
                host.name, f"cannot read the status of {label} ({exc.detail})"
            ) from exc
        if status != "stopped":
            tool = "qm" if kind == "vm" else "pct"
            raise PreflightError(
                host.name,
                f"{label} is {status or 'in an unknown state'}: its config may only change while "
                f"it is stopped (a running guest keeps its devices); run `{tool} shutdown {vmid}` "
                "first",
            )


def files_to_write(
    host: Host, changes: Sequence[FileChange], states: Sequence[FileState]
) -> list[int]:
    """Positions of the files to write; refuse any that is neither ``before`` nor ``after``.

    A VM config that Proxmox rewrote in its own order from ``after`` (an earlier apply through
    the API) counts as ``after``: its text is read (one more command, only then) and compared.

    :raises FileChangedError: naming the first file that changed since it was read.
    """
    todo, unsure = [], []
    for index, (change, state) in enumerate(zip(changes, states, strict=True)):
        if state.kind == "other":
            raise FileChangedError(
                host.name, change.path, "is not a regular file; proxgpu only replaces files"
            )
        if state.sha256 == sha(change.after):
            continue  # already as planned: a second apply writes nothing
        if state.sha256 != sha(change.before):
            if state.kind != "file" or not change.before:
                raise cas_failed(host, change.path)
            unsure.append(index)  # maybe Proxmox's own order of `after`, maybe not UTF-8
            continue
        todo.append(index)
    if unsure:
        found = read_files(host, [changes[i].path for i in unsure])
        for index, data in zip(unsure, found, strict=True):
            _check_unsure(host, changes[index], data)
    return todo


def _check_unsure(host: Host, change: FileChange, data: bytes | None) -> None:
    """Accept a VM config Proxmox rewrote from ``after``; refuse anything else, saying why."""
    if data is None:
        raise cas_failed(host, change.path)
    fault = not_utf8(data)
    if fault is not None:
        raise FileChangedError(host.name, change.path, f"{fault}: {NOT_UTF8_WHY}; {NOT_UTF8_FIX}")
    after = change.after
    if not (is_vm_config(change.path) and after and same_config(data.decode(), after)):
        raise cas_failed(host, change.path)


def cas_failed(host: Host, path: str, *, applying: bool = False) -> FileChangedError:
    """The refusal when ``path`` is no longer what the plan was made from (``applying``: as
    found by the apply's own writes, past its preflight)."""
    when, fix = ("while being applied", "") if applying else ("since it was read", "inspect and ")
    return FileChangedError(
        host.name, path, f"changed {when} (compare-and-swap failed); {fix}plan again"
    )


def check_mig_instances(host: Host, plan: Plan) -> None:
    """Refuse when a MIG instance the plan gives a container is gone from the host, or was made
    again with other capability minors (the container's ``devN`` entries would then name
    another instance's nodes or none): each instance's /proc ``access`` files, read now, must
    say the minors the plan recorded. A plan without MIG instances reads nothing.

    :raises PreflightError: naming the instance and what to do.
    """
    uses = [use for group in plan.groups for use in group.mig]
    if not uses:
        return
    found = read_files(host, [path for use in uses for path in use.proc_files])
    for i, use in enumerate(uses):
        texts = found[2 * i : 2 * i + 2]
        minors = [_cap_minor(text) for text in texts]
        if minors == [use.gi_minor, use.ci_minor]:
            continue
        where = f"MIG GI {use.gi} CI {use.ci} of GPU {use.gpu_minor} (CT {use.vmid})"
        if None in minors:
            what = f"is gone ({use.proc_files[minors.index(None)]} is missing)"
        else:
            now, planned = ",".join(map(str, minors)), f"{use.gi_minor},{use.ci_minor}"
            what = f"has capability minors {now}, the plan {planned}"
        raise PreflightError(
            host.name,
            f"{where} {what}: the MIG layout changed since the plan; make the instance again "
            "(nvidia-smi mig -cgi ... -C) or plan again",
        )


def _cap_minor(data: bytes | None) -> int | None:
    """``DeviceFileMinor`` of an NVIDIA capability's /proc file."""
    return key_number((data or b"").decode(errors="replace").splitlines(), "DeviceFileMinor")
