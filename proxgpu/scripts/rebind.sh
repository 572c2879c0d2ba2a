# shellcheck shell=sh
# proxgpu rebind: move PCI functions to another driver now, every kernel write bounded in time.
# Usage: rebind.sh ROOT LIMIT LOAD EXPAND [ADDR OVERRIDE WANT]...
# Moves each function to WANT by writing OVERRIDE to driver_override, unbinding and probing.
# EXPAND=1 adds every other member of each function's IOMMU group (same OVERRIDE and WANT).
# LOAD=1 loads vfio-pci first (driver_override does not load modules). Records:
#   before ADDR DRIVER | after ADDR DRIVER | bridge ADDR | missing ADDR
#   blocked PATH | writefail RC PATH ERROR | wrong ADDR DRIVER
root=$1 limit=$2 load=$3 expand=$4; shift 4
work=$(mktemp -d) || exit 1
rb_remove() { rm -rf "$work"; }
at_exit rb_remove
on_signal  # a kill still runs what at_exit names
ticks=$(( (limit + 3) * 50 ))
# drivers_probe binds before it returns; the wait only covers a slow driver's probe.
settle=$limit
[ "$settle" -gt 3 ] && settle=3
kwrite() {  # VALUE PATH
    # A write that blocks inside the kernel may ignore even SIGKILL; waiting for it would hang
    # this script, so the writer runs detached and the script stops waiting after the limit.
    rm -f "$work/rc"
    # shellcheck disable=SC2016 # $1 and $2 belong to the inner sh
    ( timeout -k 2 "$limit" sh -c 'printf "%s\n" "$1" > "$2"' sh "$1" "$2" 2>"$work/err"
      echo "$?" > "$work/rc" ) </dev/null >/dev/null 2>&1 &
    waited=0
    while [ ! -s "$work/rc" ]; do
        if [ "$waited" -ge "$ticks" ]; then rec blocked "$2"; return 1; fi
        sleep 0.02; waited=$((waited + 1))
    done
    rc=$(cat "$work/rc")
    [ "$rc" = 0 ] && return 0
    rec writefail "$rc" "$2" "$(head -c 300 "$work/err" | tr '\n\t' '  ')"
    return 1
}
driver_of() { link=$(readlink "$1/driver" 2>/dev/null) && echo "${link##*/}"; }
move() {  # ADDR OVERRIDE WANT
    d=$root/sys/bus/pci/devices/$1
    [ -d "$d" ] || { rec missing "$1"; return 1; }
    [ -e "$d/pci_bus" ] && { rec bridge "$1"; return 0; }
    before=$(driver_of "$d")
    rec before "$1" "${before:--}"
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
    rec after "$1" "${now:--}"
    [ -z "$3" ] || [ "$now" = "$3" ] || { rec wrong "$1" "${now:--}"; return 1; }
}
if [ "$load" = 1 ]; then
    timeout "$limit" modprobe vfio-pci || { rec writefail "$?" "modprobe vfio-pci" ""; exit 1; }
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
true  # done: the EXIT trap writes the end record with status 0
