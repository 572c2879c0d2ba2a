# shellcheck shell=sh
# proxgpu busy: who holds each function's device nodes, and nvidia persistence mode.
# Usage: busy.sh ROOT ADDRESS...   Records:
#   fn ADDR DRIVER | holder ADDR PID NODE COMM | nominor ADDR | nofuser ADDR NODE
#   smi RC, then smiline TEXT per line nvidia-smi printed
root=$1; shift
command -v fuser >/dev/null 2>&1 && have_fuser=1 || have_fuser=0
holders() {  # ADDR NODE: who has the device node open
    [ -e "$2" ] || return 0
    if [ "$have_fuser" = 0 ]; then rec nofuser "$1" "$2"; return 0; fi
    for pid in $(fuser "$2" 2>/dev/null | tr -cs '0-9' ' '); do
        comm=$(cat "/proc/$pid/comm" 2>/dev/null || echo '?')
        rec holder "$1" "$pid" "$2" "$comm"
    done
}
nvidia=0
for F; do
    d=$root/sys/bus/pci/devices/$F
    link=$(readlink "$d/driver" 2>/dev/null) || link=
    drv=${link##*/}
    rec fn "$F" "${drv:--}"
    case $drv in
    nvidia)
        nvidia=1
        info=$root/proc/driver/nvidia/gpus/$F/information
        minor=$(sed -n 's/^Device Minor:[[:space:]]*//p' "$info" 2>/dev/null)
        if [ -n "$minor" ]; then holders "$F" "$root/dev/nvidia$minor"
        else rec nominor "$F"; fi ;;
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
    rec smi "$?"
    printf '%s\n' "$out" | while IFS= read -r line; do rec smiline "$line"; done
fi
rec end
