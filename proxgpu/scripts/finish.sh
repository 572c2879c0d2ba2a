# shellcheck shell=sh
# proxgpu finish: record a journal entry's outcome and release the host-wide lock.
# Usage: finish.sh JOURNAL LOCK ID RELEASE; stdin: the entry in base64, or nothing.
# Only the owner's own lock is released. Records: end
umask 077
journal=$1 lock=$2 id=$3 release=$4
IFS= read -r entry || entry=
if [ -n "$entry" ]; then
    printf '%s' "$entry" | base64 -d > "$journal.tmp" && mv -f "$journal.tmp" "$journal" || exit 1
fi
if [ "$release" = 1 ] && [ "$(sed -n 's/^id=//p' "$lock/owner" 2>/dev/null)" = "$id" ]; then
    rm -f "$lock/owner" && rmdir "$lock" || exit 1
fi
rec end
