# shellcheck shell=sh
# proxgpu probe: read every file's state in one pass, taking the host-wide lock when asked.
# Usage: probe.sh MODE LOCK OWNER TAKEOVER NEED_ROOT JOURNAL_DIR ROOT PATH...
# MODE "lock" takes the lock (a directory made complete, owner file inside, then renamed into
# place, so it never exists without its owner); "read" only reads. TAKEOVER "-", or the owner id
# of a lock to break (empty: a lock directory without an owner file): that lock is renamed out
# of the way first, so of two that break it one wins. Records:
#   uid N | node NAME | boot ID (this boot's id, "-" in a tree) | pvesh | notroot | lock
#   locked B64(owner) | held B64(owner)
#   inprogress ID | file I other | file I file SHA256 MODE UID GID
#   file I absent MISSING_DIRS (how many of its ancestors do not exist)
#   file I escapes DIR (its directory resolves outside ROOT through a symlink) | end
mode=$1 lock=$2 owner=$3 takeover=$4 need_root=$5 journal=$6
root=$(realpath -m -- "$7") || exit 1
shift 7
uid=$(id -u)
rec uid "$uid"
rec node "$(uname -n)"
boot=$(cat "${root%/}/proc/sys/kernel/random/boot_id" 2>/dev/null) || boot=-
rec boot "$boot"
if command -v pvesh >/dev/null 2>&1; then rec pvesh; fi
if [ "$need_root" = 1 ] && [ "$uid" != 0 ]; then rec notroot; exit 0; fi
if [ "$mode" = lock ]; then
    mkdir -p "${lock%/*}" || exit 1
    if [ "$takeover" != - ] && [ -d "$lock" ] &&
        [ "$(sed -n 's/^id=//p' "$lock/owner" 2>/dev/null)" = "$takeover" ]; then
        mv -T "$lock" "$lock.broken.$$" 2>/dev/null && rm -rf "$lock.broken.$$"
    fi
    new=$lock.$$
    # A full disk must not leave a half-made lock behind.
    if ! { mkdir "$new" && printf '%s\n' "$owner" > "$new/owner"; }; then rm -rf "$new"; exit 1; fi
    if ! mv -T "$new" "$lock" 2>/dev/null; then
        rm -rf "$new"
        rec locked "$(base64 -w0 < "$lock/owner" 2>/dev/null)"
        exit 0
    fi
    rec lock
elif [ -f "$lock/owner" ]; then
    rec held "$(base64 -w0 < "$lock/owner")"
fi
for j in "$journal"/*.json; do
    if [ -f "$j" ] && grep -q '^  "status": "in-progress"' "$j"; then
        n=${j##*/}
        rec inprogress "${n%.json}"
    fi
done
i=0
for p; do
    dir=$(realpath -m -- "${p%/*}") || exit 1
    case $dir/ in
    "${root%/}"/*) ;;
    *) rec file "$i" escapes "$dir"; i=$((i + 1)); continue ;;
    esac
    if [ -L "$p" ] || { [ -e "$p" ] && [ ! -f "$p" ]; }; then
        rec file "$i" other
    elif [ -f "$p" ]; then
        sum=$(sha256sum < "$p") || exit 1
        # shellcheck disable=SC2046 # mode, uid and gid: three fields
        rec file "$i" file "${sum%% *}" $(stat -c '%a %u %g' "$p")
    else
        d=${p%/*} n=0
        while [ -n "$d" ] && [ ! -d "$d" ]; do n=$((n + 1)); d=${d%/*}; done
        rec file "$i" absent "$n"
    fi
    i=$((i + 1))
done
rec end
