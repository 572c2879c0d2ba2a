# shellcheck shell=sh
# proxgpu stage: write the journal entry, back up every file an apply touches and stage the new
# contents in temp files beside their targets; nothing is replaced yet.
# Usage: stage.sh JOURNAL BACKUPS ENTRY_SIZE META_SIZE
#                 [PATH BACKUP SHA TMP MODE UMASK OWNER SIZE]...
# stdin: the journal entry (ENTRY_SIZE bytes), meta.json (META_SIZE), then the new content of
# each file with a TMP (SIZE bytes each), back to back: read at pipe speed, never byte by byte.
# Every path is opened inside the root (the prelude's enter) and no file is read through a link.
# The backup is hashed after copying, so the bytes kept are the bytes compared. Journal,
# backups and temp files are synced to disk before anything is renamed into place.
# Records: changed I | end
umask 077  # the journal and backups hold guest configs: root only
journal=$1 backups=$2 entry_size=$3 meta_size=$4
shift 4
(
    enter "${journal%/*}" make || exit 1
    put_stdin "./${journal##*/}.tmp" - 077 - "$entry_size" &&
        durable_mv "./${journal##*/}.tmp" "./${journal##*/}"
) || exit 1
(enter "${backups%/*}" make && mkdir -- "./${backups##*/}") || exit 1
(enter "$backups" && put_stdin ./meta.json - 077 - "$meta_size") || exit 1
present() {  # PATH: 0 when something (even a link) is there; 1 not; 4 outside the root
    (
        enter "${1%/*}" || exit
        [ -e "./${1##*/}" ] || [ -L "./${1##*/}" ]
    )
}
i=0
while [ $# -ge 8 ]; do
    p=$1 backup=$2 sum=$3 tmp=$4 mode=$5 mask=$6 owner=$7 size=$8
    shift 8
    if [ "$backup" != - ]; then
        (
            enter "${p%/*}" || exit 1
            [ -f "./${p##*/}" ] && [ ! -L "./${p##*/}" ] && nofollow_cat "./${p##*/}"
        ) | (enter "$backups" && put_tmp "./$backup" - 077 - cat) || exit 1
        got=$(enter "$backups" && sync "./$backup" && sha256sum < "./$backup") || exit 1
        [ "${got%% *}" = "$sum" ] || { rec changed "$i"; exit 0; }
    else
        present "$p"
        case $? in 0) rec changed "$i"; exit 0 ;; 4) exit 1 ;; esac
    fi
    if [ "$tmp" != - ]; then
        # Missing directories are made here, inside the root; they get the usual 0755.
        (umask 022 && enter "${tmp%/*}" make && put_stdin "./${tmp##*/}" "$mode" "$mask" "$owner" "$size") || exit 1
    fi
    i=$((i + 1))
done
(enter "$backups" && sync .) || exit 1
true  # done: the EXIT trap writes the end record with status 0
