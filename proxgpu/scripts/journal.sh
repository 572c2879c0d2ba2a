# shellcheck shell=sh
# proxgpu journal: every journal entry, each as base64 of its JSON.
# Usage: journal.sh DIR. Records: entry ID B64(json) | end
for j in "$1"/*.json; do
    [ -f "$j" ] || continue
    n=${j##*/}
    # Streamed, not passed as an argument: an entry holds whole configs (megabytes).
    printf '#entry\t%s\t' "${n%.json}"
    base64 -w0 < "$j"
    echo
done
rec end
