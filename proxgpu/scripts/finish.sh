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
    (
        enter "${journal%/*}" make || exit 1
        put_stdin "./${journal##*/}.tmp" - 077 - "$size" &&
            durable_mv "./${journal##*/}.tmp" "./${journal##*/}"
    ) || exit 1
    rec journal
fi
release() {  # in the lock's directory: 0 released, 3 not ours, else the error on stdout
    enter "${lock%/*}" || exit 3
    l=./${lock##*/}
    [ -d "$l" ] && [ ! -L "$l" ] || exit 3
    [ "$(nofollow_cat "$l/owner" 2>/dev/null | sed -n 's/^id=//p')" = "$id" ] || exit 3
    gone=$l.released.$$
    mv -T "$l" "$gone" 2>&1 || exit 1
    rm -rf -- "$gone"
}
if [ "$release" = 1 ]; then
    if err=$(release); then
        rec released
    elif [ $? != 3 ]; then
        rec notreleased "$err"
    fi
fi
rec end
