# shellcheck shell=sh
# proxgpu finish: record a journal entry's outcome, then release the host-wide lock.
# Usage: finish.sh JOURNAL LOCK ID RELEASE ENTRY_SIZE; stdin: the entry (ENTRY_SIZE bytes; 0 and
# JOURNAL "-": no entry to write). Only the owner's own lock is released, by renaming the whole
# lock directory away in one step, so that it never exists empty or without its owner. A failed
# release is reported, never an error: the entry is already recorded.
# Records: journal (written) | released | notreleased ERROR | end
umask 077
journal=$1 lock=$2 id=$3 release=$4 size=$5
if [ "$journal" != - ]; then
    put_stdin "$journal.tmp" - 077 - "$size" && durable_mv "$journal.tmp" "$journal" || exit 1
    rec journal
fi
if [ "$release" = 1 ] && [ "$(sed -n 's/^id=//p' "$lock/owner" 2>/dev/null)" = "$id" ]; then
    gone=$lock.released.$$
    if err=$(mv -T "$lock" "$gone" 2>&1); then
        rm -rf "$gone"
        rec released
    else
        rec notreleased "$err"
    fi
fi
rec end
