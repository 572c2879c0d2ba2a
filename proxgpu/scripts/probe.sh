# shellcheck shell=sh
# proxgpu probe: read every file's state in one pass, taking the host-wide lock when asked.
# Usage: probe.sh MODE LOCK OWNER TAKEOVER NEED_ROOT JOURNAL_DIR PATH...
# MODE "lock" takes the lock (a directory made complete, owner file inside, then renamed into
# place, so it never exists without its owner); "read" only reads. Records:
#   uid N | node NAME | pvesh | notroot | lock | locked B64(owner) | held B64(owner)
#   inprogress ID | file I other | file I file SHA256 MODE UID GID
#   file I absent MISSING_DIRS (how many of its ancestors do not exist) | end
mode=$1 lock=$2 owner=$3 takeover=$4 need_root=$5 journal=$6
shift 6
uid=$(id -u)
rec uid "$uid"
rec node "$(uname -n)"
if command -v pvesh >/dev/null 2>&1; then rec pvesh; fi
if [ "$need_root" = 1 ] && [ "$uid" != 0 ]; then rec notroot; exit 0; fi
if [ "$mode" = lock ]; then
    mkdir -p "${lock%/*}" || exit 1
    held=$(sed -n 's/^id=//p' "$lock/owner" 2>/dev/null)
    if [ -n "$takeover" ] && [ "$held" = "$takeover" ]; then
        printf '%s\n' "$owner" > "$lock/owner.$$" && mv -f "$lock/owner.$$" "$lock/owner" || exit 1
    else
        new=$lock.$$
        mkdir "$new" && printf '%s\n' "$owner" > "$new/owner" || exit 1
        if ! mv -T "$new" "$lock" 2>/dev/null; then
            rm -rf "$new"
            rec locked "$(base64 -w0 < "$lock/owner" 2>/dev/null)"
            exit 0
        fi
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
