# shellcheck shell=sh
# proxgpu finish: record a journal entry's outcome, then release the host-wide lock.
# Usage: finish.sh JOURNAL LOCK ID RELEASE ENTRY_SIZE KEEP BACKUPS; stdin: the entry
# (ENTRY_SIZE bytes; 0 and JOURNAL "-": no entry to write). Only the owner's own lock is
# released, by renaming the whole lock directory away in one step, so that it never exists
# empty or without its owner. A failed release is reported, never an error: the entry is
# already recorded. With an entry written, the journal is pruned (KEEP "-": not): every entry
# but the newest KEEP goes with its backups (BACKUPS/ID) if it was rolled back or failed; an
# applied or unfinished one (a rollback may still need it) stays. Each id pruned is added to
# the journal's "pruned" file before its entry goes, so that the entry after it is known to
# follow an entry the retention removed, not one deleted by hand.
# Records: journal (written) | pruned ID | released | notreleased ERROR | end
umask 077
journal=$1 lock=$2 id=$3 release=$4 size=$5 keep=$6 backups=$7
if [ "$journal" != - ]; then
    (
        enter "${journal%/*}" make || exit 1
        put_stdin "./${journal##*/}.tmp" - 077 - "$size" &&
            durable_mv "./${journal##*/}.tmp" "./${journal##*/}"
    ) || exit 1
    rec journal
fi
prune() {  # in the journal's directory
    enter "${journal%/*}" || exit 1
    set -- ./*.json
    older=$(($# - keep))
    for j; do
        [ "$older" -gt 0 ] || break
        older=$((older - 1))
        if [ ! -f "$j" ] || [ -L "$j" ]; then continue; fi
        nofollow_cat "$j" | head -c 4096 |
            grep -q '^  "status": "\(rolled-back\|failed\)",$' || continue
        old=${j##*/}
        old=${old%.json}
        { nofollow_cat ./pruned 2>/dev/null; printf '%s\n' "$old"; } > ./pruned.tmp &&
            durable_mv ./pruned.tmp ./pruned || exit 1
        (enter "$backups" 2>/dev/null && rm -rf -- "./$old") || :
        rm -f -- "$j" || exit 1
        rec pruned "$old"
    done
}
if [ "$journal" != - ] && [ "$keep" != - ]; then
    (prune) || echo "pruning the journal stopped: it keeps its older entries" >&2
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
true  # done: the EXIT trap writes the end record with status 0
