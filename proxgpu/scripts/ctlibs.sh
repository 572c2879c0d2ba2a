# shellcheck shell=sh
# proxgpu ctlibs: which NVIDIA user-space libraries each container holds, read from the host
# without entering it. Only names and link targets are read, never a file's contents.
# Usage: ctlibs.sh live|tree SECONDS LIMIT (VMID ROOT TRIPLET)...
#   live: ask `lxc-info -n VMID -p` for the container's init (as Proxmox's find_lxc_pid does,
#         each under its own deadline: timeout kills it SECONDS in); a running container is read
#         through its init's root, /proc/PID/root, and lxc-info is asked again afterwards, as
#         Proxmox's open_lxc_pid does: another answer means it restarted meanwhile
#   tree: a snapshot's tree, where no container runs: lxc-info, which would ask this machine's
#         LXC, is never run
#   ROOT: the host directory of the container's stopped rootfs ("-": the host sees none), under
#         the host's root; TRIPLET: its multiarch directory (x86_64-linux-gnu).
# A container's files are hostile: below its root, every directory is entered one component at
# a time, never through a link, and its device:inode is compared before and after each cd, so a
# directory swapped for a link meanwhile is refused, not followed. $PWD is never trusted: dash
# leaves it empty after /proc/PID/root, bash makes one up.
# Output, per container: "#ct VMID running PID", "#ct VMID stopped" or "#ct VMID unknown WHY
# DETAIL" (WHY: lxc-info STATUS, answer -, restarted -; the last one counts); "#unread VMID WHY
# DETAIL" where its files could not be read (WHY: unseen -, root STATUS, usr STATUS); then per
# directory looked in that could be entered, "#libs VMID DIR BASE64" (find's "%y\0%f\0%l\0" of
# each libnvidia-ml.so* and libcuda.so* there, cut at LIMIT bytes); one that could not holds
# nothing the container's NVML would load. STATUS: missing (1), link (3), outside (4),
# swapped (5). Then "#end".
LC_ALL=C
export LC_ALL
mode=$1 seconds=$2 limit=$3
shift 3

# init_pid VMID: the init's PID ("" when stopped); 2 when lxc-info failed (its status in
# $ip_status), 3 when its answer names no PID but is not empty.
init_pid() {
    ip_out=$({ timeout -k 2 "$seconds" lxc-info -n "$1" -p </dev/null 2>/dev/null
        echo "#status $?"; } | head -c 4096)
    ip_status=${ip_out##*#status }
    # An answer cut short lost its status line: that is no status to pass on in a record.
    case $ip_status in "" | *[!0-9]*) ip_status="cut" ;; esac
    [ "$ip_status" = 0 ] || return 2
    ip_out=${ip_out%#status *}
    # find_lxc_pid's /^PID:\s+(\d+)$/; the last such line counts, as there.
    pid=$(printf '%s' "$ip_out" | sed -n 's/^PID:[[:space:]]\{1,\}\([0-9]\{1,\}\)$/\1/p' | tail -n 1)
    [ -n "$pid" ] || [ -z "$(printf '%s' "$ip_out" | tr -d '[:space:]')" ] || return 3
}

# walk DIR: cd into DIR, relative to the working directory, one component at a time; never
# through a link, and each directory entered must be the one looked at (device:inode).
walk() {
    wk_rest=$1
    while [ -n "$wk_rest" ]; do
        wk_part=${wk_rest%%/*}
        case $wk_rest in */*) wk_rest=${wk_rest#*/} ;; *) wk_rest= ;; esac
        case $wk_part in "" | . | ..) return 4 ;; esac
        [ -L "./$wk_part" ] && return 3
        [ -d "./$wk_part" ] || return 1
        wk_id=$(stat -c %d:%i -- "./$wk_part") || return 1
        cd -P -- "./$wk_part" 2>/dev/null || return 1
        [ "$(stat -c %d:%i .)" = "$wk_id" ] || return 5
    done
}
why() {
    case $1 in 1) echo missing ;; 3) echo link ;; 4) echo outside ;; *) echo swapped ;; esac
}

# look VMID DIR: the NVIDIA libraries' names and link targets in DIR, below the working
# directory (the container's root).
look() {
    (
        walk "$2" || exit 0
        printf '#libs\t%s\t%s\t' "$1" "$2"
        timeout -k 2 "$seconds" find . -mindepth 1 -maxdepth 1 \
            \( -name 'libnvidia-ml.so*' -o -name 'libcuda.so*' \) -printf '%y\0%f\0%l\0' \
            2>/dev/null | head -c "$limit" | base64 -w0
        echo
    )
}

# read_root VMID BASE TRIPLET: enter BASE (a host path: the prelude's enter keeps it under the
# host's root) and look in each directory NVIDIA's libraries are installed to.
read_root() {
    (
        # shellcheck disable=SC2154 # proxgpu_prefix: the prelude's
        enter "$proxgpu_prefix$2" 2>/dev/null || { rec unread "$1" root "$(why $?)"; exit 0; }
        # An empty directory is a volume not mounted (a ZFS pool imported without mounting),
        # not a container without libraries.
        (walk usr) || { rec unread "$1" usr "$(why $?)"; exit 0; }
        for dir in "usr/lib/$3" "usr/lib/$3/nvidia/current" usr/lib64 usr/lib; do
            look "$1" "$dir"
        done
    )
}

while [ "$#" -ge 3 ]; do
    vmid=$1 root=$2 triplet=$3
    shift 3
    pid=
    if [ "$mode" = live ]; then
        init_pid "$vmid"
        case $? in
        2) rec ct "$vmid" unknown lxc-info "$ip_status"; continue ;;
        3) rec ct "$vmid" unknown answer -; continue ;;
        esac
    fi
    if [ -n "$pid" ]; then
        rec ct "$vmid" running "$pid"
        read_root "$vmid" "/proc/$pid/root" "$triplet"
        first=$pid
        init_pid "$vmid"
        [ "$pid" = "$first" ] || rec ct "$vmid" unknown restarted -
    elif [ "$root" = - ]; then
        rec ct "$vmid" stopped
        rec unread "$vmid" unseen -
    else
        rec ct "$vmid" stopped
        read_root "$vmid" "$root" "$triplet"
    fi
done
true  # done: the EXIT trap writes the end record with status 0
