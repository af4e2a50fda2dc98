#!/usr/bin/env bash
# bench/side_by_side.sh PROGRAM FLAGS...: two copies of PROGRAM at once, each with half of
# --batch, sharing nothing. Its step time is what 2 ranks of data parallelism would take on
# this machine if their communication cost nothing: the 2 cores' ceiling for it, which
# includes what the two cores slow each other down by (shared caches, memory bandwidth).
# The first copy writes the --log; the second logs to a file of its own.
set -euo pipefail
prog=$1
shift
first=() second=() tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
while [ $# -gt 0 ]; do
    case $1 in
    --batch) first+=(--batch $(($2 / 2))) second+=(--batch $(($2 - $2 / 2))); shift 2 ;;
    --log) first+=(--log "$2") second+=(--log "$tmp/log.csv"); shift 2 ;;
    *) first+=("$1") second+=("$1"); shift ;;
    esac
done
"$prog" "${second[@]}" >/dev/null &
other=$!
"$prog" "${first[@]}"
wait "$other"
