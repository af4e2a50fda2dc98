#!/usr/bin/env bash
# tools/schedule_table.sh OUT M FLAGS...: the pipeline schedules side by side. Runs
# train_pp.c with every schedule on 4 ranks (see below) and M microbatches, on a model of 8 units (6
# hidden layers, so that interleaved, zbv and dualpipev have 2 chunks per rank), each checked against
# train.c with the same flags, and prints a table: step time, the bubble measured (mean
# over ranks), the checker's for the same lists with the durations measured, the closed
# form, and the peak activations of each rank (in microbatches; in parentheses the
# schedule's formula). Then draws OUT/schedules.svg, every schedule measured and simulated.
# Runs and traces go to OUT/runs/sched-M-*; exits 1 if a run differs.
#
# Under MPICH the pipeline has no more ranks than the machine has cores (tools/mpirun
# --ranks: MPICH's waiting ranks spin, and 4 of them on 2 cores run 30 times slower).
#
#   bash tools/schedule_table.sh out 8 --steps 2500
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$1 M=$2
shift 2
FLAGS="$* --layers 6 --hidden 128"
MPIRUN=tools/mpirun
S=$(tools/mpirun --ranks 4)
[ "$S" -ge 2 ] || S=2
mkdir -p "$OUT/runs"
status=0
note=""
[ "$S" != 4 ] && note=" (one a core: MPICH, tools/mpirun --ranks)"
echo "pipeline schedules, $S ranks$note, $M microbatches ($FLAGS):"
echo
./train $FLAGS --log "$OUT/runs/sched-ref.csv" --save "$OUT/runs/sched-ref.ckpt" --quiet </dev/null >/dev/null
echo "| schedule | same as train.c | ms/step | bubble measured, mean over ranks | checker, same durations | closed form | peak activations per rank, in microbatches (formula) |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for sched in naive gpipe 1f1b interleaved zb1 zbv dualpipev; do
    base="$OUT/runs/sched-$M-$sched"
    $MPIRUN -n "$S" ./train_pp --microbatches "$M" --schedule $sched $FLAGS --log "$base.csv" --save "$base.ckpt" \
        --summary "$base.sum" --trace "$base.json" </dev/null >"$base.out" 2>&1 || status=1
    same=no
    tools/compare "$OUT/runs/sched-ref.csv" "$base.csv" "$OUT/runs/sched-ref.ckpt" "$base.ckpt" >"$base.cmp" && same=yes
    [ $same = yes ] || status=1
    awk -v sched=$sched -v same=$same '
        /^seconds=/ { split($0, kv, "="); sec = kv[2] } /^steps=/ { split($0, kv, "="); steps = kv[2] }
        /^rank=/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "bubble") { b += kv[2]; n++ } } }
        END { printf "| %s | %s | %.3f | %.3f |", sched, same, (steps > 0 ? 1e3 * sec / steps : 0), (n ? b / n : 0) }' "$base.sum"
    awk '/^  rank [0-9]*: bubble / { r = $0; sub(/.*peak /, "", r); peaks = peaks (peaks ? ", " : "") r }
         /^  all ranks: bubble / { checker = $4; closed = "-"; if ($0 ~ /closed form/) { closed = $(NF - 4) } }
         END { printf " %s | %s | %s |\n", checker, closed, peaks }' "$base.out"
done
tools/schedules --svg "$OUT/schedules.svg" "$S" "$M" "$OUT"/runs/sched-"$M"-{naive,gpipe,1f1b,interleaved,zb1,zbv,dualpipev}.json || status=1
exit $status
