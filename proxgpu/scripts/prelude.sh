# shellcheck shell=sh
# proxgpu prelude: sent in front of every script in this directory (see proxgpu/host/scripts.py).
#
#   rec KIND FIELD...: print one record, "#KIND" and its fields separated by tabs, on one line.
#   put_tmp TMP MODE UMASK OWNER CMD...: write CMD's output into the new file TMP, created under
#     UMASK, then give it OWNER (uid:gid) and MODE, each unless "-" (pmxcfs takes no chmod or
#     chown: /etc/pve files pass "-" for both), and flush it to disk.
#   put_stdin TMP MODE UMASK OWNER SIZE: put_tmp with exactly the next SIZE bytes of stdin (GNU
#     head never reads past them, so the next file's bytes stay on stdin); fails on a short read.
#   durable_mv SRC DEST: rename SRC over DEST, then sync DEST's directory so that the rename
#     itself survives a power cut (as dpkg does): the file is then wholly old or wholly new.
#   under_lock LOCK CMD...: run CMD in a subshell holding LOCK, a Proxmox config lock file, as
#     `qm set` and `pct set` take it ("-": no lock); 75 when another holder keeps it for 10 s.
set -u
rec() {
    printf '#%s' "$1"
    shift
    for rec_field; do printf '\t%s' "$rec_field"; done
    printf '\n'
}
put_tmp() {
    pt_tmp=$1 pt_mode=$2 pt_mask=$3 pt_owner=$4
    shift 4
    (umask "$pt_mask" && "$@" > "$pt_tmp") || return 1
    if [ "$pt_owner" != - ] && [ "$(stat -c %u:%g "$pt_tmp")" != "$pt_owner" ]; then
        chown "$pt_owner" "$pt_tmp" || return 1
    fi
    if [ "$pt_mode" != - ]; then chmod "$pt_mode" "$pt_tmp" || return 1; fi
    sync "$pt_tmp"
}
put_stdin() {
    put_tmp "$1" "$2" "$3" "$4" head -c "$5" || return 1
    [ "$(wc -c < "$1")" -eq "$5" ]
}
durable_mv() {
    mv -f "$1" "$2" || return 1
    sync "${2%/*}" 2>/dev/null || :
}
under_lock() {
    if [ "$1" = - ]; then shift; ( "$@" ); return; fi
    mkdir -p "${1%/*}" || return 1
    ul_lock=$1
    shift
    ( flock -E 75 -w 10 9 || exit; "$@" ) 9>>"$ul_lock"
}
