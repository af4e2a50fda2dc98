#!/usr/bin/env bash
# bench/before_after.sh COMMIT [REPS]: train.c's step before (the headers of COMMIT) and
# after (the working tree), in CPU time, alternating: the median ms of each and the median of
# the per-pair ratios, for the GPT at widths 64, 128 and 256 and the default and large MLPs.
# Both builds take this tree's bench/bench.c (its `step` mode: model_forward, model_backward
# and the optimizer, as train.c runs them), so only the headers differ; where it does not build
# against COMMIT's headers (it uses something they lack), the before takes COMMIT's own, whose
# step mode is the same.
#
#   bench/before_after.sh 1d64399 7
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${1:?usage: bench/before_after.sh COMMIT [REPS]}
reps=${2:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive "$commit" | tar -x -C "$tmp"
cp "$tmp/bench/bench.c" "$tmp/bench/own.c"
# each side with its own Makefile's one flag beyond these (-fno-math-errno, since AdamW's loop)
makefile_flags() { if grep -q -- '-fno-math-errno' "$1"; then echo "-O3 -march=native -fno-math-errno -std=c11"; else echo "-O3 -march=native -std=c11"; fi; }
bflags=$(makefile_flags "$tmp/Makefile") aflags=$(makefile_flags Makefile)
cp bench/bench.c "$tmp/bench/bench.c"
if ! cc $bflags -o "$tmp/before" "$tmp/bench/bench.c" -lopenblas -lm 2>/dev/null; then
    echo "(the before: $commit's own bench/bench.c; this tree's does not build against its headers)"
    cp "$tmp/bench/own.c" "$tmp/bench/bench.c"
    cc $bflags -o "$tmp/before" "$tmp/bench/bench.c" -lopenblas -lm
fi
cc $aflags -o "$tmp/after" bench/bench.c -lopenblas -lm
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
step() { "$1" step $2 | awk '/cpu_ms_per_step/ { print $2 }'; }
echo "train.c's step in CPU time (bench/bench step), $commit ($bflags) against the working tree ($aflags), $reps alternating pairs,"
echo "on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') (cpu family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')), $(date -u +%Y-%m-%d):"
echo
echo "| configuration | before, ms | after, ms | before / after (median of pairs) |"
echo "| --- | --- | --- | --- |"
while IFS='|' read -r name flags; do
    : >"$tmp/b" && : >"$tmp/a" && : >"$tmp/r"
    for _ in $(seq 1 "$reps"); do
        b=$(step "$tmp/before" "$flags") a=$(step "$tmp/after" "$flags")
        echo "$b" >>"$tmp/b" && echo "$a" >>"$tmp/a" && awk -v b="$b" -v a="$a" 'BEGIN { print b / a }' >>"$tmp/r"
    done
    printf '| %s | %.3f | %.3f | %.2fx |\n' "$name" "$(median <"$tmp/b")" "$(median <"$tmp/a")" "$(median <"$tmp/r")"
done <<EOF
GPT, C 64 (makemore's default)|--model gpt --steps 20
GPT, C 128|--model gpt --emb 128 --steps 10
GPT, C 256|--model gpt --emb 256 --steps 5
MLP default (E16 H64 B32)|--steps 2000
MLP large (E64 H1024 B256)|--emb 64 --hidden 1024 --batch 256 --steps 10
EOF
