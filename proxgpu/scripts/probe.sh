# shellcheck shell=sh
# proxgpu probe: read every file's state in one pass, taking the host-wide lock when asked.
# Usage: probe.sh MODE LOCK OWNER TAKEOVER NEED_ROOT JOURNAL_DIR ROOT PATH...
# MODE "lock" takes the lock (a directory made complete, owner file inside, then renamed into
# place, so it never exists without its owner); "read" only reads. TAKEOVER "-", or the owner id
# of a lock to break (empty: a lock directory without an owner file): that lock is renamed out
# of the way first, so of two that break it one wins. Records:
#   uid N | node NAME | boot ID (this boot's id, "-" in a tree) | machine ID NAME (the prelude's
#   rec_machine) | pvesh | notroot | lock
#   locked B64(owner) | held B64(owner)
#   inprogress ID | last ID B64(json) (the newest entry) | file I other | file I file SHA256 MODE UID GID
#   file I absent MISSING_DIRS (how many of its ancestors do not exist)
#   file I escapes DIR (its directory resolves outside ROOT through a symlink)
#   outside DIR WHERE (the journal's or the backups' directory does) | end
mode=$1 lock=$2 owner=$3 takeover=$4 need_root=$5 journal=$6
root=${7%/}
shift 7
uid=$(id -u)
rec uid "$uid"
rec node "$(uname -n)"
boot=$(enter "$root/proc/sys/kernel/random" 2>/dev/null && nofollow_cat ./boot_id) ||
    boot=-
rec boot "$boot"
rec_machine
if command -v pvesh >/dev/null 2>&1; then rec pvesh; fi
if [ "$need_root" = 1 ] && [ "$uid" != 0 ]; then rec notroot; exit 0; fi
# The lock's steps, in its directory (entered inside the root): 0 taken, 5 held by another.
take_lock() (
    enter "${lock%/*}" make || exit 1
    l=./${lock##*/}
    if [ "$takeover" != - ] && [ -d "$l" ] && [ ! -L "$l" ] &&
        [ "$(nofollow_cat "$l/owner" 2>/dev/null | sed -n 's/^id=//p')" = "$takeover" ]; then
        mv -T "$l" "$l.broken.$$" 2>/dev/null && rm -rf -- "$l.broken.$$"
    fi
    new=$l.$$
    # A full disk must not leave a half-made lock behind.
    if ! { mkdir -- "$new" && printf '%s\n' "$owner" > "$new/owner"; }; then
        rm -rf -- "$new"
        exit 1
    fi
    if ! mv -T "$new" "$l" 2>/dev/null; then
        rm -rf -- "$new"
        rec locked "$(nofollow_cat "$l/owner" 2>/dev/null | base64 -w0)"
        exit 5
    fi
)
held_by() {
    enter "${lock%/*}" 2>/dev/null || exit
    [ -f "./${lock##*/}/owner" ] || exit 1
    rec held "$(nofollow_cat "./${lock##*/}/owner" | base64 -w0)"
}
if [ "$mode" = lock ]; then
    take_lock
    case $? in 0) rec lock ;; 5) exit 0 ;; *) exit 1 ;; esac
else
    (held_by) || :
fi
# The journal and the backups beside it: refused at once when either leads out of the root.
for own in "$journal" "${journal%/*}/backups"; do
    (
        enter "$own" 2>/dev/null
        # shellcheck disable=SC2154 # en_now: the prelude's
        [ $? != 4 ] || rec outside "$own" "$en_now"
    )
done
(
    enter "$journal" 2>/dev/null || exit 0
    last=
    for j in ./*.json; do
        if [ ! -f "$j" ] || [ -L "$j" ]; then continue; fi
        last=$j
        if nofollow_cat "$j" | grep -q '^  "status": "in-progress"'; then
            n=${j##*/}
            rec inprogress "${n%.json}"
        fi
    done
    # The newest entry (ids sort by time), which the next one is chained to: streamed, as an
    # entry holds whole configs.
    [ -n "$last" ] || exit 0
    n=${last##*/}
    printf '#last\t%s\t' "${n%.json}"
    nofollow_cat "$last" | base64 -w0
    echo
)
state() {  # PATH I: its file record, found in its directory entered inside the root
    en_missing=0 en_now=$1
    enter "${1%/*}" 2>/dev/null
    case $? in
    0) ;;
    1) rec file "$2" absent "$en_missing"; return ;;
    *) rec file "$2" escapes "$en_now"; return ;;
    esac
    l=./${1##*/}
    if [ -L "$l" ] || { [ -e "$l" ] && [ ! -f "$l" ]; }; then
        rec file "$2" other
    elif [ -f "$l" ]; then
        sum=$(nofollow_cat "$l" | sha256sum) || exit 1
        # shellcheck disable=SC2046 # mode, uid and gid: three fields
        rec file "$2" file "${sum%% *}" $(stat -c '%a %u %g' "$l")
    else
        rec file "$2" absent 0
    fi
}
i=0
for p; do
    (state "$p" "$i") || exit 1
    i=$((i + 1))
done
true  # done: the EXIT trap writes the end record with status 0
