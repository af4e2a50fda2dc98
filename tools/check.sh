#!/usr/bin/env bash
# tools/check.sh: `make check`. Every program, the unit tests and the tools, built with
# AddressSanitizer and UndefinedBehaviorSanitizer (any error ends the run), in a copy of
# the committed tree, then a fast subset of the tests run on those builds: the units, bad
# flags and data, training, checkpoints (with the kill and signal tests), and data, fully
# sharded, tensor and pipeline parallel, expert parallel, the GPT in every program that
# splits it (context parallel included). The last line says "N passed, N failed".
#
#   make check                 # about 16 minutes
#   bash tools/check.sh dp     # other sections of tests/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
git ls-files -z | xargs -0 -I{} cp --parents {} "$dir"/ 2>/dev/null || cp -r . "$dir"/
cd "$dir"
make -s -j2 OPT="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
    all tests/test_units tools/compare tools/report tools/schedules tools/costmodel
# MPI libraries keep memory to the end on purpose: leaks are not reported; everything else is
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1
bash tests/run.sh ${*:-units cli data train checkpoint dp fsdp tp schedules ep gpt} 2>&1 | tee check.log
! grep -qE "runtime error|AddressSanitizer" check.log
