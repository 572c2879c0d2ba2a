# shellcheck shell=sh
# proxgpu journal: every journal entry, each as base64 of its JSON.
# Usage: journal.sh DIR. Records: entry ID B64(json) | end
for j in "$1"/*.json; do
    [ -f "$j" ] || continue
    n=${j##*/}
    rec entry "${n%.json}" "$(base64 -w0 < "$j")"
done
rec end
