# shellcheck shell=sh
# proxgpu stage: write the journal entry, back up every file an apply touches and stage the new
# contents in temp files beside their targets; nothing is replaced yet.
# Usage: stage.sh JOURNAL BACKUPS ENTRY_SIZE META_SIZE
#                 [PATH BACKUP SHA TMP MODE UMASK OWNER PARENT_EXISTS SIZE]...
# stdin: the journal entry (ENTRY_SIZE bytes), meta.json (META_SIZE), then the new content of
# each file with a TMP (SIZE bytes each), back to back: read at pipe speed, never byte by byte.
# The backup is hashed after copying, so the bytes kept are the bytes compared. Journal,
# backups and temp files are synced to disk before anything is renamed into place.
# Records: changed I | end
umask 077  # the journal and backups hold guest configs: root only
journal=$1 backups=$2 entry_size=$3 meta_size=$4
shift 4
mkdir -p "${journal%/*}" || exit 1
put_stdin "$journal.tmp" - 077 - "$entry_size" && durable_mv "$journal.tmp" "$journal" || exit 1
mkdir -p "${backups%/*}" && mkdir "$backups" || exit 1
put_stdin "$backups/meta.json" - 077 - "$meta_size" || exit 1
i=0
while [ $# -ge 9 ]; do
    p=$1 backup=$2 sum=$3 tmp=$4 mode=$5 mask=$6 owner=$7 parent=$8 size=$9
    shift 9
    if [ "$backup" != - ]; then
        cp -p "$p" "$backups/$backup" && sync "$backups/$backup" || exit 1
        got=$(sha256sum < "$backups/$backup") || exit 1
        [ "${got%% *}" = "$sum" ] || { rec changed "$i"; exit 0; }
    elif [ -e "$p" ] || [ -L "$p" ]; then
        rec changed "$i"; exit 0
    fi
    if [ "$tmp" != - ]; then
        [ "$parent" = 1 ] || (umask 022 && mkdir -p "${p%/*}") || exit 1
        put_stdin "$tmp" "$mode" "$mask" "$owner" "$size" || exit 1
    fi
    i=$((i + 1))
done
sync "$backups" || exit 1
rec end
