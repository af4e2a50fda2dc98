#!/usr/bin/env bash
# tools/zoo.sh: `make zoo`, the bug zoo. Each tests/zoo/NN-name.patch is one classic bug of
# distributed training, a change of a line or two to a copy of the sources (its first line
# says what goes wrong). For each: apply it to a fresh copy of the committed tree, build,
# run the test suite until the first test fails (the sections the patch names first, then
# every other), and print which test caught the bug and after how long. The run fails if
# any bug goes uncaught: then the suite has a hole.
#
#   make zoo                          # every bug, about 40 minutes on 2 cores (most of it building)
#   bash tools/zoo.sh tests/zoo/06-*  # some of them
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
patches=("$@")
[ ${#patches[@]} = 0 ] && patches=(tests/zoo/*.patch)
# every section of tests/run.sh, in its order, but docs (it reads the markdown, no program) and
# cluster (emulated hosts: root, and minutes a bug)
all_sections=$(sed -n 's/^run_section //p' tests/run.sh | grep -vxE 'docs|cluster' | tr '\n' ' ')
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
caught=0 missed=0
printf '%-48s %-8s %s\n' bug seconds "caught by"
for p in "${patches[@]}"; do
    name=$(basename "$p" .patch)
    sections=$(sed -n 's/^sections: //p' "$p")
    rm -rf "$dir/tree"
    mkdir "$dir/tree"
    git ls-files -z | (cd "$root" && xargs -0 cp --parents -t "$dir/tree")
    if ! (cd "$dir/tree" && patch -s -p1 <"$root/$p" && make -s all tools/compare tools/report tools/schedules tools/costmodel tools/pingpong tests/test_units \
        >"$dir/build.log" 2>&1); then
        printf '%-48s %-8s %s\n' "$name" - "DOES NOT APPLY OR BUILD: $(tail -c 200 "$dir/build.log" | tr '\n' ' ')"
        missed=$((missed + 1))
        continue
    fi
    rest=$(for s in $all_sections; do [[ " $sections " == *" $s "* ]] || echo -n "$s "; done)
    t0=$(date +%s.%N)
    by=""
    for group in "$sections" "$rest"; do
        (cd "$dir/tree" && STOP_AT_FAILURE=1 TEST_TIME_LIMIT=60 bash tests/run.sh $group >"$dir/log" 2>&1)
        by=$(grep -m1 '^FAILED ' "$dir/log" | cut -c8- | cut -c1-150)
        [ -n "$by" ] && break
    done
    took=$(echo "$(date +%s.%N) - $t0" | bc)
    if [ -n "$by" ]; then
        caught=$((caught + 1))
        printf '%-48s %-8.1f %s\n' "$name" "$took" "$by"
    else
        missed=$((missed + 1))
        printf '%-48s %-8.1f %s\n' "$name" "$took" "NOT CAUGHT: every test passed"
    fi
done
echo "$caught caught, $missed not caught"
[ $missed = 0 ]
