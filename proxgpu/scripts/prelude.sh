# shellcheck shell=sh
# proxgpu prelude: sent in front of every script in this directory (see proxgpu/host/scripts.py).
#
#   rec KIND FIELD...: print one record, "#KIND" and its fields separated by tabs, on one line.
#   put_tmp TMP MODE UMASK OWNER CMD...: write CMD's output into the new file TMP, created under
#     UMASK, then give it OWNER (uid:gid) and MODE, each unless "-" (pmxcfs takes no chmod or
#     chown: /etc/pve files pass "-" for both), and flush it to disk; fails when TMP no longer
#     names the file it wrote.
#   put_stdin TMP MODE UMASK OWNER SIZE: put_tmp with exactly the next SIZE bytes of stdin (GNU
#     head never reads past them, so the next file's bytes stay on stdin); fails on a short read.
#   durable_mv SRC DEST: rename SRC over DEST, then sync DEST's directory so that the rename
#     itself survives a power cut (as dpkg does): the file is then wholly old or wholly new.
#   under_lock LOCK CMD...: run CMD in a subshell holding LOCK, a Proxmox config lock file, as
#     `qm set` and `pct set` take it ("-": no lock); 75 when another holder keeps it for 10 s.
#   enter DIR [make]: cd into DIR, a directory under the host's root, one component at a time,
#     each checked once entered to resolve inside the root ("make": missing ones are created,
#     never through a link). The working directory then stands for a directory descriptor: a
#     directory swapped for a symlink later changes nothing for what is done relative to it.
#     1: a component is missing; 4: DIR is outside the root (said on stderr).
#   nofollow_cat FILE: FILE's bytes, refusing a symlink (O_NOFOLLOW) and never blocking on a FIFO.
#   on_signal: exit on HUP, INT and TERM, so that the EXIT trap removes what the script made.
#   at_exit FUNCTION: call FUNCTION when the script exits, however it exits, before the end
#     record; a script sets no EXIT trap of its own (it would replace the end record's).
#   rec_machine: the record "machine ID NAME", the root's /etc/machine-id and /etc/hostname ("-"
#     where one is missing), which tell one host from another, a clone of one image included.
#
# The end record: whatever way the script's shell exits by itself, its last line is
# "#end<TAB>TOKEN<TAB>STATUS", TOKEN being this run's (run_script puts it in front) and STATUS
# the shell's exit status. run_script believes an answer only with it, and only where STATUS is
# what the transport reported: a host (or a wrapper on it) that answers without running the
# script, or a script killed before its end, is told from one that ran.
set -u
# run_script puts proxgpu_prefix (the root without its trailing slash, "" for /) and
# proxgpu_token in front.
proxgpu_prefix=${proxgpu_prefix-}
proxgpu_token=${proxgpu_token-}
proxgpu_at_exit=:
proxgpu_end() {
    proxgpu_status=$?  # on entry, from the EXIT trap: the status the shell exits with
    "$proxgpu_at_exit"
    rec end "$proxgpu_token" "$proxgpu_status"
}
trap proxgpu_end EXIT
at_exit() {
    proxgpu_at_exit=$1
}
rec_machine() {
    rm_id=$( (enter "$proxgpu_prefix/etc" 2>/dev/null && nofollow_cat ./machine-id) |
        head -c 64 | tr -cd '0-9a-f')
    rm_name=$( (enter "$proxgpu_prefix/etc" 2>/dev/null && nofollow_cat ./hostname) |
        head -n 1 | head -c 64 | tr -d '\t')
    rec machine "${rm_id:--}" "${rm_name:--}"
}
# The root as the kernel names it (every link resolved), from the shell's own cd -P and back, not
# a command substitution: that would fork a process in front of every script.
if cd -P -- "${proxgpu_prefix:-/}" 2>/dev/null; then
    proxgpu_real=${PWD%/}
    cd -- "$OLDPWD" 2>/dev/null || cd /
else
    proxgpu_real=//missing
fi
enter() {
    case $1 in "$proxgpu_prefix" | "$proxgpu_prefix"/*) ;; *) en_out "$1"; return 4 ;; esac
    en_rest=${1#"$proxgpu_prefix"} en_missing=0
    en_rest=${en_rest#/}
    cd -P -- "$proxgpu_real/" || return 4
    while [ -n "$en_rest" ]; do
        en_part=${en_rest%%/*}
        case $en_rest in */*) en_rest=${en_rest#*/} ;; *) en_rest= ;; esac
        case $en_part in "" | . | ..) en_out "$1"; return 4 ;; esac
        if [ "${2-}" = make ] && [ ! -e "./$en_part" ] && [ ! -L "./$en_part" ]; then
            # Another run may make it between the look and the mkdir: that is no failure, and
            # what it made is checked below as anything found is.
            mkdir -- "./$en_part" 2>/dev/null || [ -e "./$en_part" ] || [ -L "./$en_part" ] ||
                return 1
        fi
        if ! cd -P -- "./$en_part" 2>/dev/null; then
            if [ -L "./$en_part" ]; then en_out "$1"; return 4; fi
            en_missing=1
            while [ -n "$en_rest" ]; do
                en_missing=$((en_missing + 1))
                case $en_rest in */*) en_rest=${en_rest#*/} ;; *) en_rest= ;; esac
            done
            return 1
        fi
        en_now=$PWD  # cd -P set it from the kernel's own path: every link resolved
        case $en_now/ in "$proxgpu_real"/*) ;; *) en_out "$1" "$en_now"; return 4 ;; esac
    done
}
en_out() {
    en_now=${2-$1}
    printf '%s: resolves to %s, outside the host root %s; proxgpu writes only inside the root: fix the link\n' \
        "$1" "$en_now" "${proxgpu_prefix:-/}" >&2
}
nofollow_cat() {
    dd if="$1" iflag=nofollow,nonblock bs=64k status=none
}
on_signal() {
    trap 'exit 129' HUP
    trap 'exit 130' INT
    trap 'exit 143' TERM
}
rec() {
    printf '#%s' "$1"
    shift
    for rec_field; do printf '\t%s' "$rec_field"; done
    printf '\n'
}
put_tmp() {
    pt_tmp=$1 pt_mode=$2 pt_mask=$3 pt_owner=$4
    shift 4
    # A name left there (a symlink planted to redirect the write) is removed, not followed, and
    # noclobber creates the file with O_EXCL, which refuses a link made since. From then on the
    # file is reached only through the descriptor that made it (fd 7; chown, chmod and sync
    # through /proc/self/fd/7): a name swapped meanwhile for a link or a hard link to another
    # file is never followed, and is refused at the end.
    rm -f -- "$pt_tmp" || return 1
    (
        umask "$pt_mask" && set -C && exec 7>"$pt_tmp" || exit 1
        set +C
        "$@" >&7 7>&- || exit 1
        pt_fd=/proc/self/fd/7
        if [ "$pt_owner" != - ] && [ "$(stat -L -c %u:%g "$pt_fd")" != "$pt_owner" ]; then
            chown "$pt_owner" "$pt_fd" || exit 1
        fi
        if [ "$pt_mode" != - ]; then chmod "$pt_mode" "$pt_fd" || exit 1; fi
        sync "$pt_fd" || exit 1
        [ -f "$pt_tmp" ] && [ ! -L "$pt_tmp" ] &&
            [ "$(stat -L -c %d:%i "$pt_fd")" = "$(stat -c %d:%i -- "$pt_tmp")" ]
    )
}
put_stdin() {
    put_tmp "$1" "$2" "$3" "$4" head -c "$5" || return 1
    [ "$(wc -c < "$1")" -eq "$5" ]
}
durable_mv() {
    mv -fT -- "$1" "$2" || return 1  # -T: a link to a directory is replaced, not entered
    sync "${2%/*}" 2>/dev/null || :
}
under_lock() {
    if [ "$1" = - ]; then shift; ( "$@" ); return; fi
    ul_lock=$1
    shift
    (
        enter "${ul_lock%/*}" make || exit 1
        [ ! -L "./${ul_lock##*/}" ] && exec 9>>"./${ul_lock##*/}" || exit 1
        flock -E 75 -w 10 9 || exit
        "$@"
    )
}
