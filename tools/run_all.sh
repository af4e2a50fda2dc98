#!/usr/bin/env bash
# tools/run_all.sh: the main job, `make run`. Trains with train.c and with every strategy
# in a small layout, compares each run with train.c's run of the same model (losses at
# every step, final parameters, validation loss, names: the MLP, its mixture of experts
# with train.c --experts 4, the GPT with train.c --model gpt, the GPT with experts with
# train.c --model gpt --experts 4 and with DeepSeek-V3's mixture), and prints one table with the
# measured time, bytes sent and memory of each, the formulas' predictions beside them, and
# the pipeline bubble. Writes out/loss.svg, out/pipeline.svg and out/table.md; the runs'
# logs, checkpoints, summaries and the pipeline's trace stay in out/runs.
#
#   make run            # 25,000 steps each of the MLP, 1,000 of the GPT: a few minutes
#   make run QUICK=1    # 2,500 and 200
#
# The layouts fit a 2-core machine where it matters: the pipeline runs 2 stages, so that
# its timeline shows the schedule, not processes taking turns on a core; the 3D run needs
# 8 ranks and the 5D one 16, sharing the cores (their times say so, their bytes and results
# do not change).
# Under MPICH, whose waiting ranks spin instead of yielding their core, the 3D run and the
# schedules table start no more ranks than cores (tools/mpirun --ranks).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-out}
FLAGS="--eval-every 2500"
[ "${QUICK:-0}" = 1 ] && FLAGS="--steps 2500 --eval-every 500"
# the GPT's rows (--model gpt, makemore's Transformer): fewer steps, each about 30 times the MLP's
GPT="--model gpt --steps 1000 --eval-every 250"
[ "${QUICK:-0}" = 1 ] && GPT="--model gpt --steps 200 --eval-every 100"
MPIRUN=${MPIRUN:-tools/mpirun} # make cluster: tools/cluster.sh --hosts N --link RATE --
mkdir -p "$OUT/runs"
rm -f "$OUT"/runs/*

# The 3D grid, 2 x 2 x 2: under MPICH, whose waiting ranks spin, no more ranks than cores
# (tools/mpirun --ranks; 8 ranks on 2 cores would take 0.5 s a step)
R3D=$(tools/mpirun --ranks 8)
if [ "$R3D" -ge 8 ]; then GRID3D="-n 8 ./train_3d --tp 2 --dp 2 --pp 2" WHAT3D="tensor 2 x pipeline 2 x data 2 = 8 ranks"
elif [ "$R3D" -ge 4 ]; then GRID3D="-n 4 ./train_3d --tp 2 --dp 1 --pp 2" WHAT3D="tensor 2 x pipeline 2 = 4 ranks (one a core: MPICH)"
else GRID3D="-n 2 ./train_3d --tp 2 --dp 1 --pp 1" WHAT3D="tensor 2 = 2 ranks (one a core: MPICH)"; fi
# and the GPT's 4D grid, 2 x 2 x 2 (tensor, context, pipeline), likewise
if [ "$R3D" -ge 8 ]; then GRID4D="-n 8 ./train_3d --tp 2 --cp 2 --pp 2 --dp 1" WHAT4D="tensor 2 x context 2 x pipeline 2 = 8 ranks"
elif [ "$R3D" -ge 4 ]; then GRID4D="-n 4 ./train_3d --tp 1 --cp 2 --pp 2 --dp 1" WHAT4D="context 2 x pipeline 2 = 4 ranks (one a core: MPICH)"
else GRID4D="-n 2 ./train_3d --tp 1 --cp 2 --pp 1 --dp 1" WHAT4D="context 2 = 2 ranks (one a core: MPICH)"; fi
# and the 5D grid with experts, every axis 2 (16 ranks), likewise: the expert axis needs a
# data axis at least its size
R5D=$(tools/mpirun --ranks 16)
if [ "$R5D" -ge 16 ]; then GRID5D="-n 16 ./train_3d --tp 2 --cp 2 --pp 2 --dp 2 --ep 2" WHAT5D="tensor 2 x context 2 x pipeline 2 x data 2, experts over 2 = 16 ranks"
elif [ "$R5D" -ge 8 ]; then GRID5D="-n 8 ./train_3d --tp 2 --pp 2 --dp 2 --ep 2" WHAT5D="tensor 2 x pipeline 2 x data 2, experts over 2 = 8 ranks (MPICH)"
elif [ "$R5D" -ge 4 ]; then GRID5D="-n 4 ./train_3d --tp 2 --dp 2 --ep 2" WHAT5D="tensor 2 x data 2, experts over 2 = 4 ranks (one a core: MPICH)"
else GRID5D="-n 2 ./train_3d --dp 2 --ep 2" WHAT5D="data 2, experts over 2 = 2 ranks (one a core: MPICH)"; fi
# a train_3d run with experts routes the whole batch at once (docs/3d.md): one microbatch
GPTMOE="$GPT --experts 4"
# DeepSeek-V3's mixture (without its routing limited to M groups, not built): 16 experts a
# quarter of 4C wide, top-4, one shared expert, sigmoid affinities balanced by a bias
GPTDS="$GPT --experts 16 --top-k 4 --expert-hidden 64 --shared-experts 1 --router sigmoid --balance bias"

# name | what | the run it must equal (train.c with the same model and flags; - : it is one) | command
RUNS="train|train.c, the reference, 1 process|-|./train $FLAGS
dp|train_dp.c, data parallel on 2 ranks|train|$MPIRUN -n 2 ./train_dp $FLAGS
fsdp|train_fsdp.c, ZeRO-3 on 2 ranks|train|$MPIRUN -n 2 ./train_fsdp --zero 3 $FLAGS
tp|train_tp.c, tensor parallel on 2 ranks|train|$MPIRUN -n 2 ./train_tp $FLAGS
pp|train_pp.c, 2 pipeline stages, 1f1b, 4 microbatches|train|$MPIRUN -n 2 ./train_pp --schedule 1f1b --microbatches 4 $FLAGS
3d|train_3d.c, $WHAT3D|train|$MPIRUN $GRID3D $FLAGS
moe|train.c --experts 4, the mixture of experts on 1 process|-|./train --experts 4 $FLAGS
ep|train_ep.c, its 4 experts over 2 ranks, tokens exchanged all-to-all|moe|$MPIRUN -n 2 ./train_ep --experts 4 $FLAGS
gpt|train.c --model gpt, makemore's Transformer on 1 process|-|./train $GPT
gpt_tp|train_tp.c --model gpt --sp, heads and tokens split over 2 ranks|gpt|$MPIRUN -n 2 ./train_tp --sp $GPT
gpt_cp|train_cp.c --model gpt, positions split over 2 ranks, ring attention|gpt|$MPIRUN -n 2 ./train_cp $GPT
gpt_4d|train_3d.c --model gpt, $WHAT4D|gpt|$MPIRUN $GRID4D $GPT
gptmoe|train.c --model gpt --experts 4 --microbatches 4, the GPT with 4 experts a block on 1 process, the batch in 4|-|./train --microbatches 4 $GPTMOE
gpt_5d|train_3d.c --model gpt --experts 4, $WHAT5D, 4 microbatches|gptmoe|$MPIRUN $GRID5D --microbatches 4 $GPTMOE
dsv3|train.c --model gpt, DeepSeek-V3's mixture: 16 experts of width 64, top-4, 1 shared, sigmoid and bias|-|./train $GPTDS
dsv3_ep|train_ep.c, the same over 2 ranks|dsv3|$MPIRUN -n 2 ./train_ep $GPTDS"
# make cluster (CLUSTER=1) runs the GPT's tensor parallelism without --sp too (over a link,
# what --sp's reduce-scatters and all-gathers change against the all-reduces), and leaves
# out the GPT with experts: its 5D grid's 16 ranks would take turns on the cores of every
# emulated host, and tools/costmodel replay does not model the expert axis
if [ "${CLUSTER:-0}" = 1 ]; then
    RUNS="$(echo "$RUNS" | grep -v '^gptmoe|' | grep -v '^gpt_5d|' | grep -v '^dsv3')
gpt_tp_nosp|train_tp.c --model gpt, heads split over 2 ranks (no --sp)|gpt|$MPIRUN -n 2 ./train_tp $GPT"
fi
N=$(echo "$RUNS" | wc -l)
i=0
names=""
while IFS='|' read -r name what ref cmd; do
    i=$((i + 1))
    echo "[$i/$N] $what"
    extra=""
    [ "$name" = pp ] && extra="--trace $OUT/runs/$name.json"
    # show the progress lines as they come; keep the whole output
    $cmd --log "$OUT/runs/$name.csv" --save "$OUT/runs/$name.ckpt" --summary "$OUT/runs/$name.sum" $extra \
        </dev/null 2>&1 | tee "$OUT/runs/$name.out" | sed -u -n 's/^step /      step /p'
    if [ "$ref" != - ]; then
        tools/compare "$OUT/runs/$ref.csv" "$OUT/runs/$name.csv" "$OUT/runs/$ref.ckpt" "$OUT/runs/$name.ckpt" \
            >"$OUT/runs/$name.cmp" || true
        echo "      compared with $(sed -n 's/^program=//p' "$OUT/runs/$ref.sum")'s run of the same model: $(cat "$OUT/runs/$name.cmp")"
    fi
    if [ "$ref" = - ] || [ "$ref" = train ]; then names="$names $name"; else names="$names $name@$ref"; fi
done <<<"$RUNS"
echo
status=0
tools/report "$OUT" $names | tee "$OUT/table.md" || status=$?

[ "${SCHEDULES:-1}" = 0 ] && exit $status # make cluster: the table only
# The pipeline schedules side by side, and one picture of them all
echo
bash tools/schedule_table.sh "$OUT" 8 $FLAGS || status=1
echo
echo "pictures: $OUT/loss.svg (the loss curves), $OUT/pipeline.svg (one pipeline step) and $OUT/schedules.svg"
echo "(every schedule, measured and simulated); the traces for https://ui.perfetto.dev: $OUT/runs/pp.json and"
echo "$OUT/runs/sched-*.json (any program writes one with --trace FILE)"
exit $status
