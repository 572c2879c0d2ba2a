# shellcheck shell=sh
# proxgpu inside: what each running guest holds of its GPUs, asked from the host.
# Usage: inside.sh SECONDS LIMIT (ct VMID | vm VMID)...
#   ct: the container's state from `lxc-info -n VMID -s`; a running one runs NVIDIA's own tool
#       inside it the way `pct exec --keep-env 0` runs a command there (lxc-attach with the
#       environment cleared): nvidia-smi --query-gpu=uuid,pci.bus_id --format=csv,noheader. The
#       tool is the container's, so its answer is hostile: read at most LIMIT bytes, by a reader
#       killed SECONDS+3 s in (what the tool started in the container may outlive lxc-attach,
#       holding the pipe: it then meets a closed pipe), and its exit status is lxc-attach's,
#       kept outside the answer so that no text of the tool's can stand for it.
#   vm: the VM's QEMU as qemu-server finds it (vm_running_locally): the PID in
#       /var/run/qemu-server/VMID.pid, running, a QEMU (its argv[0] ends in kvm or names
#       qemu-...), whose command line's last -pidfile is that file; then the targets of its
#       open files that lie under /dev/vfio.
# Output: "#ct VMID STATE" (STATE: lxc-info's word, RUNNING or STOPPED among them, or "-" when
# it named none) or "#ct VMID failed STATUS" (lxc-info's exit status: 127 without lxc-info,
# 124/137 past its deadline); for a running one "#smi VMID STATUS BASE64": lxc-attach's exit
# status (the tool's: 127 without nvidia-smi; "-" when the answer did not end in time) and the
# tool's output and errors, cut at LIMIT bytes. "#vm VMID running PID" and "#vfio VMID BASE64"
# (the NUL-terminated link targets), or "#vm VMID stopped -". Then "#end".
LC_ALL=C
export LC_ALL
seconds=$1 limit=$2
shift 2
work=$(mktemp -d) || exit 1
in_remove() { rm -rf "$work"; }
at_exit in_remove
on_signal  # a kill still runs what at_exit names
# What pct exec's lxc-attach gives a command with --clear-env, said explicitly.
path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

ct_state() {
    cs_out=$({ timeout -k 2 "$seconds" lxc-info -n "$1" -s </dev/null 2>/dev/null
        echo "#status $?"; } | head -c 4096)
    cs_status=${cs_out##*#status }
    case $cs_status in "" | *[!0-9]*) cs_status="cut" ;; esac
    if [ "$cs_status" != 0 ]; then rec ct "$1" failed "$cs_status"; return; fi
    cs_state=$(printf '%s' "${cs_out%#status *}" |
        sed -n 's/^State:[[:space:]]*\([A-Z]\{1,16\}\)$/\1/p' | tail -n 1)
    rec ct "$1" "${cs_state:--}"
}

smi() {
    sm_at=$work/$1  # a container's own files: a job left by one cannot answer for the next
    ( { timeout -k 2 "$seconds" lxc-attach -n "$1" --clear-env --set-var "PATH=$path" -- \
            nvidia-smi --query-gpu=uuid,pci.bus_id --format=csv,noheader 2>&1
        echo "$?" >"$sm_at.status"; } </dev/null |
        timeout -s KILL $((seconds + 3)) head -c "$limit" >"$sm_at.out"
      echo "$?" >"$sm_at.read" ) >/dev/null 2>&1 &
    sm_ticks=0
    while [ ! -s "$sm_at.read" ]; do
        if [ "$sm_ticks" -ge $(( (seconds + 5) * 10 )) ]; then rec smi "$1" - -; return; fi
        sleep 0.1; sm_ticks=$((sm_ticks + 1))
    done
    sm_status=$(cat "$sm_at.status" 2>/dev/null)
    case $sm_status in "" | *[!0-9]*) sm_status=- ;; esac
    # A reader killed at its deadline: the tool never ended, whatever it wrote.
    [ "$(cat "$sm_at.read")" = 0 ] || sm_status=-
    rec smi "$1" "$sm_status" "$(base64 -w0 <"$sm_at.out")"
}

# qemu_pid VMID: the PID of the VM's QEMU, as vm_running_locally finds it ("" when none).
qemu_pid() {
    qp_file=/var/run/qemu-server/$1.pid
    # shellcheck disable=SC2154 # proxgpu_prefix: the prelude's
    qp_pid=$( (enter "$proxgpu_prefix/var/run/qemu-server" 2>/dev/null &&
        nofollow_cat "./$1.pid") | head -c 32 | head -n 1)
    case $qp_pid in "" | *[!0-9]*) return ;; esac
    # A zombie has exited; the command line tells a reused PID from the VM's QEMU.
    qp_state=$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$qp_pid/status" 2>/dev/null)
    case $qp_state in "" | Z | X) return ;; esac
    qp_named=$(tr '\0' '\n' <"/proc/$qp_pid/cmdline" 2>/dev/null | head -c 65536 |
        awk 'NR == 1 { cmd = $0 } $0 != "" { if (prev == "-pidfile" || prev == "--pidfile") f = $0
             prev = $0 } END { print ((cmd ~ /kvm$/ || cmd ~ /qemu-[^\/]+$/) ? f : "") }')
    [ "$qp_named" = "$qp_file" ] && echo "$qp_pid"
}

vm_vfio() {
    pid=$(qemu_pid "$1")
    if [ -z "$pid" ]; then rec vm "$1" stopped -; return; fi
    rec vm "$1" running "$pid"
    printf '#vfio\t%s\t' "$1"
    for fd in "/proc/$pid/fd/"*; do
        target=$(readlink "$fd" 2>/dev/null) || continue
        case $target in /dev/vfio/*) printf '%s\0' "$target" ;; esac
    done | head -c "$limit" | base64 -w0
    echo
}

while [ "$#" -ge 2 ]; do
    kind=$1 vmid=$2
    shift 2
    case $vmid in "" | *[!0-9]*) continue ;; esac
    if [ "$kind" = ct ]; then
        ct_state "$vmid"
        [ "$cs_status" = 0 ] && [ "$cs_state" = RUNNING ] && smi "$vmid"
    else
        vm_vfio "$vmid"
    fi
done
true  # done: the EXIT trap writes the end record with status 0
