"""Runtime driver changes: move a vfio group's functions to vfio-pci now, and back.

This follows what Proxmox VE itself does when it starts a VM with a passed-through GPU: for every
function of the group, bridges skipped, write ``vfio-pci`` to ``driver_override``, unbind the
current driver, then write the address to ``/sys/bus/pci/drivers_probe``; the reverse clears the
override with an empty write. Each phase is one command on the host (``scripts/rebind.sh``),
whatever the number of functions.

Unbinding a GPU that a process still holds never returns (the nvidia driver loops until its usage
count drops), so :func:`~proxgpu.apply.busy.check_not_busy` must pass first, and every kernel
write runs in the background under ``timeout``: the script stops waiting after the limit even
when the write sits in the kernel beyond the reach of signals, so proxgpu itself never hangs.

>>> from proxgpu.planning import Plan, PlanGroup
>>> group = PlanGroup(role="vfio", numa_node=1, gpus=["0000:81:00.0"], cpus="32-63",
...                   functions=["0000:81:00.0", "0000:81:00.1"], memory_nodes=[1],
...                   driver="vfio-pci")
>>> vfio_functions(Plan(groups=[group], warnings=[], tensor_parallel=[]))
['0000:81:00.0', '0000:81:00.1']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from proxgpu.errors import LiveRebindError
from proxgpu.host.base import Host
from proxgpu.host.scripts import ScriptRecord, run_script
from proxgpu.model import FrozenModel
from proxgpu.pci import VFIO_DRIVER
from proxgpu.planning import Plan

#: Seconds one kernel write may take before proxgpu gives up on it.
WRITE_TIMEOUT = 10


class Binding(FrozenModel):
    """One function's driver before and after a rebind (``None``: no driver bound).

    >>> Binding(address="0000:81:00.0", driver_before="nvidia", driver_after="vfio-pci").moved
    True
    """

    address: str
    driver_before: str | None
    driver_after: str | None

    @property
    def moved(self) -> bool:
        """Whether the function changed driver."""
        return self.driver_before != self.driver_after


def vfio_functions(plan: Plan) -> list[str]:
    """Every function the plan moves to vfio-pci, in plan order (see the module example)."""
    return [f for group in plan.groups if group.role.moves_to_vfio for f in group.functions]


def bind_to_vfio(
    host: Host, addresses: Sequence[str], write_timeout: int = WRITE_TIMEOUT
) -> list[Binding]:
    """Bind ``addresses`` and the rest of their IOMMU groups to vfio-pci now; bridges are skipped.

    Call :func:`~proxgpu.apply.busy.check_not_busy` first. When a step fails, the functions
    already moved are returned to their drivers before the error is raised.

    :raises LiveRebindError: naming the function and the write that failed or timed out.
    """
    load = "1" if host.root == "/" else "0"  # a prefixed root is a tree, not the running kernel
    args = [arg for address in addresses for arg in (address, VFIO_DRIVER, VFIO_DRIVER)]
    bindings, failure = _rebind(
        host, args, load=load, expand="1", limit=write_timeout, functions=len(addresses) * 2
    )
    if failure is None:
        return bindings
    address, detail = failure
    undo = [b for b in bindings if b.driver_before != VFIO_DRIVER]
    try:
        restore_drivers(host, undo, write_timeout)
    except LiveRebindError as exc:
        raise LiveRebindError(
            host.name, address, f"{detail}; returning the others failed too: {exc.detail}"
        ) from exc
    back = ", ".join(b.address for b in undo) or "none"
    raise LiveRebindError(
        host.name, address, f"{detail}; functions returned to their drivers: {back}"
    )


def restore_drivers(
    host: Host, bindings: Sequence[Binding], write_timeout: int = WRITE_TIMEOUT
) -> list[Binding]:
    """Return each function to ``driver_before``: clear the override, unbind, probe, check.

    :raises LiveRebindError: naming the function and the write that failed or timed out.
    """
    args = [arg for b in bindings for arg in (b.address, "", b.driver_before or "")]
    restored, failure = _rebind(
        host, args, load="0", expand="0", limit=write_timeout, functions=len(bindings)
    )
    if failure is not None:
        raise LiveRebindError(host.name, *failure)
    return restored


def _rebind(
    host: Host, args: list[str], *, load: str, expand: str, limit: int, functions: int
) -> tuple[list[Binding], tuple[str, str] | None]:
    if not args:
        return [], None
    # Three bounded writes and a short driver wait per function, plus modprobe.
    budget = (functions + 1) * (3 * (limit + 3) + 6) + limit
    root = host.root.rstrip("/")
    output = run_script(
        host, "rebind", root, str(limit), load, expand, *args, timeout=budget, check=False
    )
    bindings, failure = _parse_rebind(output.records)
    if failure is None and output.returncode != 0:
        failure = ("-", f"rebind script failed: {output.stderr.strip() or output.returncode}")
    return bindings, failure


def _parse_rebind(records: Sequence[ScriptRecord]) -> tuple[list[Binding], tuple[str, str] | None]:
    before: dict[str, str | None] = {}
    bindings: list[Binding] = []
    failure: tuple[str, str] | None = None
    current = "-"
    for record in records:
        if record.kind == "before":
            current, driver = record.fields
            before[current] = None if driver == "-" else driver
        elif record.kind == "after":
            address, driver = record.fields
            after = None if driver == "-" else driver
            bindings.append(
                Binding(address=address, driver_before=before[address], driver_after=after)
            )
        elif record.kind in _FAILURES:
            failure = (
                record[0] if record.kind in ("missing", "wrong") else current,
                _FAILURES[record.kind](record.fields),
            )
    if (
        failure is not None
        and failure[0] in before
        and all(b.address != failure[0] for b in bindings)
    ):
        # The function failed half-way: its override may be written, so it needs restoring too.
        bindings.append(
            Binding(address=failure[0], driver_before=before[failure[0]], driver_after=None)
        )
    return bindings, failure


def _blocked(fields: Sequence[str]) -> str:
    return f"the kernel write to {fields[0]} did not return within the time limit (still blocked)"


def _write_failed(fields: Sequence[str]) -> str:
    rc, path, error = fields
    reason = "timed out" if rc in ("124", "137") else f"failed ({error.strip() or rc})"
    if path.startswith("modprobe"):
        return f"{path} {reason}"
    return f"writing {path} {reason}"


def _wrong(fields: Sequence[str]) -> str:
    return f"is bound to {fields[1]} after the rebind, not the driver asked for"


def _missing(fields: Sequence[str]) -> str:
    return "no such PCI device"


_FAILURES: dict[str, Callable[[Sequence[str]], str]] = {
    "blocked": _blocked,
    "writefail": _write_failed,
    "wrong": _wrong,
    "missing": _missing,
}
