"""Runtime driver changes: move a vfio group's functions to vfio-pci now, and back.

This follows what Proxmox VE itself does (formats.md section 1): for every function of the group,
bridges skipped, write ``vfio-pci`` to ``driver_override``, unbind the current driver, then write
the address to ``/sys/bus/pci/drivers_probe``; the reverse clears the override with an empty
write. Each phase is one command on the host, whatever the number of functions.

Unbinding a GPU that a process still holds never returns (the nvidia driver loops until its usage
count drops), so :func:`check_not_busy` must pass first, and every kernel write runs in the
background under ``timeout``: the script stops waiting after the limit even when the write sits
in the kernel beyond the reach of signals, so proxgpu itself never hangs.

>>> from proxgpu.planning import Plan, PlanGroup
>>> group = PlanGroup(role="vfio", numa_node=1, gpus=["0000:81:00.0"], cpus="32-63",
...                   functions=["0000:81:00.0", "0000:81:00.1"], memory_nodes=[1],
...                   driver="vfio-pci")
>>> vfio_functions(Plan(groups=[group], warnings=[], tensor_parallel=[]))
['0000:81:00.0', '0000:81:00.1']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from proxgpu.errors import DeviceBusyError, HostUnreachableError, LiveRebindError
from proxgpu.hosts import Host
from proxgpu.inventory import FrozenModel
from proxgpu.planning import VFIO_DRIVER, Plan, normalize_pci_address

#: Seconds one kernel write may take before proxgpu gives up on it.
WRITE_TIMEOUT = 10

# Usage: sh -c BUSY sh ROOT ADDRESS...   Records are tab-separated, one per line:
#   #fn ADDR DRIVER | #holder ADDR PID NODE COMM | #nominor ADDR | #nofuser ADDR NODE
#   #smi RC, then #smiline TEXT per line nvidia-smi printed
_BUSY = r"""
set -u
root=$1; shift
command -v fuser >/dev/null 2>&1 && have_fuser=1 || have_fuser=0
T=$(printf '\t')
holders() {  # ADDR NODE: who has the device node open
    [ -e "$2" ] || return 0
    if [ "$have_fuser" = 0 ]; then echo "#nofuser$T$1$T$2"; return 0; fi
    for pid in $(fuser "$2" 2>/dev/null | tr -cs '0-9' ' '); do
        comm=$(cat "/proc/$pid/comm" 2>/dev/null || echo '?')
        echo "#holder$T$1$T$pid$T$2$T$comm"
    done
}
nvidia=0
for F; do
    d=$root/sys/bus/pci/devices/$F
    link=$(readlink "$d/driver" 2>/dev/null) || link=
    drv=${link##*/}
    echo "#fn$T$F$T${drv:--}"
    case $drv in
    nvidia)
        nvidia=1
        info=$root/proc/driver/nvidia/gpus/$F/information
        minor=$(sed -n 's/^Device Minor:[[:space:]]*//p' "$info" 2>/dev/null)
        if [ -n "$minor" ]; then holders "$F" "$root/dev/nvidia$minor"
        else echo "#nominor$T$F"; fi ;;
    vfio-pci)
        group=$(readlink "$d/iommu_group" 2>/dev/null) || group=
        [ -n "$group" ] && holders "$F" "$root/dev/vfio/${group##*/}" ;;
    '') ;;
    *)
        holders "$F" "$root/dev/dri/by-path/pci-$F-card"
        holders "$F" "$root/dev/dri/by-path/pci-$F-render" ;;
    esac
done
if [ "$nvidia" = 1 ]; then
    out=$(timeout 30 nvidia-smi --query-gpu=pci.bus_id,persistence_mode --format=csv,noheader 2>&1)
    echo "#smi$T$?"
    printf '%s\n' "$out" | sed "s/^/#smiline$T/"
fi
"""

# Usage: sh -c REBIND sh ROOT LIMIT LOAD EXPAND ADDR OVERRIDE WANT [ADDR OVERRIDE WANT]...
# Moves each function to WANT by writing OVERRIDE to driver_override, unbinding and probing.
# EXPAND=1 adds every other member of each function's IOMMU group (same OVERRIDE and WANT).
# Records: #before ADDR DRIVER | #after ADDR DRIVER | #bridge ADDR | #missing ADDR
#          #blocked PATH | #writefail RC PATH ERROR | #wrong ADDR DRIVER
_REBIND = r"""
set -u
root=$1 limit=$2 load=$3 expand=$4; shift 4
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
ticks=$(( (limit + 3) * 50 ))
# drivers_probe binds before it returns; the wait only covers a slow driver's probe.
settle=$limit
[ "$settle" -gt 3 ] && settle=3
kwrite() {  # VALUE PATH
    # A write that blocks inside the kernel may ignore even SIGKILL; waiting for it would hang
    # this script, so the writer runs detached and the script stops waiting after the limit.
    rm -f "$work/rc"
    ( timeout -k 2 "$limit" sh -c 'printf "%s\n" "$1" > "$2"' sh "$1" "$2" 2>"$work/err"
      echo "$?" > "$work/rc" ) </dev/null >/dev/null 2>&1 &
    waited=0
    while [ ! -s "$work/rc" ]; do
        if [ "$waited" -ge "$ticks" ]; then echo "#blocked $2"; return 1; fi
        sleep 0.02; waited=$((waited + 1))
    done
    rc=$(cat "$work/rc")
    [ "$rc" = 0 ] && return 0
    echo "#writefail $rc $2 $(head -c 300 "$work/err" | tr '\n' ' ')"
    return 1
}
driver_of() { link=$(readlink "$1/driver" 2>/dev/null) && echo "${link##*/}"; }
move() {  # ADDR OVERRIDE WANT
    d=$root/sys/bus/pci/devices/$1
    [ -d "$d" ] || { echo "#missing $1"; return 1; }
    [ -e "$d/pci_bus" ] && { echo "#bridge $1"; return 0; }
    before=$(driver_of "$d")
    echo "#before $1 ${before:--}"
    kwrite "$2" "$d/driver_override" || return 1
    if [ -z "$3" ] || [ "$before" != "$3" ]; then
        if [ -e "$d/driver" ]; then kwrite "$1" "$d/driver/unbind" || return 1; fi
        kwrite "$1" "$root/sys/bus/pci/drivers_probe" || return 1
    fi
    n=0
    now=$(driver_of "$d")
    while [ -n "$3" ] && [ "$now" != "$3" ] && [ "$n" -lt "$((settle * 10))" ]; do
        sleep 0.1; n=$((n + 1)); now=$(driver_of "$d")
    done
    echo "#after $1 ${now:--}"
    [ -z "$3" ] || [ "$now" = "$3" ] || { echo "#wrong $1 ${now:--}"; return 1; }
}
if [ "$load" = 1 ]; then
    # driver_override does not load modules.
    timeout "$limit" modprobe vfio-pci || { echo "#writefail $? modprobe vfio-pci"; exit 1; }
fi
seen=' '
while [ $# -ge 3 ]; do
    for F in "$1" $(
        [ "$expand" = 1 ] && ls "$root/sys/bus/pci/devices/$1/iommu_group/devices" 2>/dev/null
    ); do
        case $seen in *" $F "*) continue ;; esac
        seen="$seen$F "
        move "$F" "$2" "$3" || exit 1
    done
    shift 3
done
"""


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


class BusyDevice(FrozenModel):
    """A function that is in use, and why: who holds its device nodes, persistence mode.

    >>> BusyDevice(address="0000:81:00.0", driver="nvidia", reasons=["persistence is on"]).reasons
    ['persistence is on']
    """

    address: str
    driver: str | None
    reasons: list[str]


def vfio_functions(plan: Plan) -> list[str]:
    """Every function the plan moves to vfio-pci, in plan order (see the module example)."""
    return [f for group in plan.groups if group.role == "vfio" for f in group.functions]


def find_busy(host: Host, addresses: Sequence[str], timeout: float = 60.0) -> list[BusyDevice]:
    """The functions among ``addresses`` that are in use, in one command.

    A function is busy when a process holds its device node (``/dev/nvidia<minor>`` for nvidia,
    ``/dev/vfio/<group>`` for vfio-pci, ``/dev/dri/by-path/pci-<addr>-{card,render}`` otherwise;
    all under ``host.root``), or, for nvidia, when persistence mode is on or cannot be read.

    :raises HostUnreachableError: when the host cannot run the check.
    """
    result = host.run(
        ["sh", "-c", _BUSY, "sh", host.root.rstrip("/"), *addresses],
        timeout=timeout,
    )
    if b"#fn\t" not in result.stdout and addresses:
        raise HostUnreachableError(host.name, f"busy check failed: {result.stderr_text.strip()}")
    return _busy_from(result.stdout.decode("utf-8", "replace"), addresses)


def _busy_from(output: str, addresses: Sequence[str]) -> list[BusyDevice]:
    drivers: dict[str, str | None] = {}
    reasons: dict[str, list[str]] = {a: [] for a in addresses}
    smi_rc, smi_lines = None, []
    for line in output.splitlines():
        word, *fields = line.split("\t")
        if word == "#fn":
            drivers[fields[0]] = None if fields[1] == "-" else fields[1]
        elif word == "#holder":
            address, pid, node, comm = fields
            reasons[address].append(f"{node} is held by pid {pid} ({comm})")
        elif word == "#nominor":
            reasons[fields[0]].append("its /dev/nvidia minor is unknown (no procfs information)")
        elif word == "#nofuser":
            reasons[fields[0]].append(f"fuser is missing, so who holds {fields[1]} is unknown")
        elif word == "#smi":
            smi_rc = int(fields[0])
        elif word == "#smiline":
            smi_lines.append(fields[0])
    persistence = _persistence(smi_lines) if smi_rc == 0 else {}
    for address, driver in drivers.items():
        if driver == "nvidia":
            mode = persistence.get(address)
            if mode != "Disabled":
                reasons[address].append(_persistence_reason(mode, smi_rc, smi_lines))
    return [
        BusyDevice(address=a, driver=drivers.get(a), reasons=r) for a, r in reasons.items() if r
    ]


def _persistence(lines: list[str]) -> dict[str, str]:
    modes = {}
    for line in lines:
        bus_id, _, mode = line.partition(",")
        try:
            modes[normalize_pci_address(bus_id)] = mode.strip()
        except ValueError:
            continue  # a warning nvidia-smi printed among the rows
    return modes


def _persistence_reason(mode: str | None, rc: int | None, lines: list[str]) -> str:
    if mode == "Enabled":
        return "persistence mode is on (nvidia-persistenced keeps it open)"
    if rc != 0:
        detail = lines[-1] if lines else f"exit status {rc}"
        return f"persistence mode cannot be read (nvidia-smi: {detail}), so it counts as in use"
    return f"persistence mode is {mode or 'not reported'}, so it counts as in use"


def check_not_busy(host: Host, addresses: Sequence[str]) -> None:
    """Refuse when any function among ``addresses`` is in use (see :func:`find_busy`).

    :raises DeviceBusyError: naming each busy function, why, and what to do.
    """
    busy = find_busy(host, addresses)
    if busy:
        described = "; ".join(f"{b.address} ({b.driver}): {', '.join(b.reasons)}" for b in busy)
        raise DeviceBusyError(
            host.name,
            [b.address for b in busy],
            f"in use, so unbinding could block the kernel: {described}; stop the processes "
            "(and the containers) using these GPUs and turn persistence off "
            "(nvidia-smi -i <address> -pm 0, or stop nvidia-persistenced), then retry",
        )


def bind_to_vfio(
    host: Host, addresses: Sequence[str], write_timeout: int = WRITE_TIMEOUT
) -> list[Binding]:
    """Bind ``addresses`` and the rest of their IOMMU groups to vfio-pci now; bridges are skipped.

    Call :func:`check_not_busy` first. When a step fails, the functions already moved are returned
    to their drivers before the error is raised.

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
    result = host.run(
        ["sh", "-c", _REBIND, "sh", host.root.rstrip("/"), str(limit), load, expand, *args],
        timeout=budget,
    )
    bindings, failure = _parse_rebind(result.stdout.decode("utf-8", "replace"))
    if failure is None and not result.ok:
        failure = ("-", f"rebind script failed: {result.stderr_text.strip() or result.returncode}")
    return bindings, failure


def _parse_rebind(output: str) -> tuple[list[Binding], tuple[str, str] | None]:
    before: dict[str, str | None] = {}
    bindings: list[Binding] = []
    failure: tuple[str, str] | None = None
    current = "-"
    for line in output.splitlines():
        word, _, rest = line.partition(" ")
        if word == "#before":
            current, driver = rest.split(" ", 1)
            before[current] = None if driver == "-" else driver
        elif word == "#after":
            address, driver = rest.split(" ", 1)
            after = None if driver == "-" else driver
            bindings.append(
                Binding(address=address, driver_before=before[address], driver_after=after)
            )
        elif word in _FAILURES:
            failure = (
                rest.split(" ", 1)[0] if word in ("#missing", "#wrong") else current,
                _FAILURES[word](rest),
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


def _blocked(rest: str) -> str:
    return f"the kernel write to {rest} did not return within the time limit (still blocked)"


def _write_failed(rest: str) -> str:
    rc, path, *error = rest.split(" ", 2)
    reason = "timed out" if rc in ("124", "137") else f"failed ({' '.join(error).strip() or rc})"
    return f"writing {path} {reason}"


def _wrong(rest: str) -> str:
    _, driver = rest.split(" ", 1)
    return f"is bound to {driver} after the rebind, not the driver asked for"


def _missing(rest: str) -> str:
    return "no such PCI device"


_FAILURES: dict[str, Callable[[str], str]] = {
    "#blocked": _blocked,
    "#writefail": _write_failed,
    "#wrong": _wrong,
    "#missing": _missing,
}
