# shellcheck shell=sh
# proxgpu stage: write the journal entry, back up every file an apply touches and stage the new
# contents in temp files beside their targets; nothing is replaced yet.
# Usage: stage.sh JOURNAL BACKUPS [PATH BACKUP SHA TMP MODE UMASK OWNER PARENT_EXISTS]...
# stdin: base64 lines: the journal entry, meta.json, then the new text of each file with a TMP.
# The backup is hashed after copying, so the bytes kept are the bytes compared. A temp file is
# written by put_tmp (MODE, UMASK and OWNER as it takes them). Records: changed I | end
umask 077  # the journal and backups hold guest configs: root only
journal=$1 backups=$2
shift 2
IFS= read -r entry || exit 1
IFS= read -r meta || exit 1
mkdir -p "${journal%/*}" && printf '%s' "$entry" | base64 -d > "$journal.tmp" || exit 1
mv -f "$journal.tmp" "$journal" || exit 1
mkdir -p "${backups%/*}" && mkdir "$backups" || exit 1
printf '%s' "$meta" | base64 -d > "$backups/meta.json" || exit 1
decode() { printf '%s' "$1" | base64 -d; }
i=0
while [ $# -ge 8 ]; do
    p=$1 backup=$2 sum=$3 tmp=$4 mode=$5 mask=$6 owner=$7 parent=$8
    shift 8
    if [ "$backup" != - ]; then
        cp -p "$p" "$backups/$backup" || exit 1
        got=$(sha256sum < "$backups/$backup") || exit 1
        [ "${got%% *}" = "$sum" ] || { rec changed "$i"; exit 0; }
    elif [ -e "$p" ] || [ -L "$p" ]; then
        rec changed "$i"; exit 0
    fi
    if [ "$tmp" != - ]; then
        IFS= read -r data || exit 1
        [ "$parent" = 1 ] || (umask 022 && mkdir -p "${p%/*}") || exit 1
        put_tmp "$tmp" "$mode" "$mask" "$owner" decode "$data" || exit 1
    fi
    i=$((i + 1))
done
rec end
