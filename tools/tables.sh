#!/usr/bin/env bash
# tools/tables.sh: the measured tables of docs/ (dp.md, fsdp.md, ...), one section per strategy.
#
#   bash tools/tables.sh dp fsdp tp pp 3d nd ep schedules gpt_tp cp   # any of them; all without arguments
#
# dp, fsdp, tp, 3d: every run trains the default configuration (25,000 steps; 3d: fewer,
# see below) with --log, --save and --summary; tools/compare checks each against train.c
# and tools/report prints the table (measured bytes and memory, formulas beside them).
# pp: short runs of wider models, one per (stages, microbatches, schedule).
# ep: train_ep.c on 2 and 4 ranks, 4 and 8 experts, top-1 and top-2, each against train.c with
# the same --experts; the all-to-all, the dropped tokens and the aux loss apart.
# schedules: every pipeline schedule on 4 ranks, 8 and 16 microbatches (tools/schedule_table.sh).
# gpt_tp, cp: the GPT (--model gpt) split by heads (tp, with and without --sp) and by positions
# (cp, both splits, the three ways of attention across ranks), 200 steps each: bytes and memory per
# rank beside their formulas, and a block's activations beside Korthikanti et al.'s.
# nd: the GPT on 4D grids (tensor, context, pipeline, data) and the 5D one (with experts).
# This machine has 2 cores: runs with more ranks share them, which shows in their times
# (and in the pipeline's measured bubble), not in their bytes, memory or results.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make -s all tools/compare tools/report
OUT=${OUT:-out/tables}
MPIRUN=tools/mpirun

# one NAME FLAGS -- COMMAND...: a run into $OUT/runs/NAME.*, compared with train.c's (NAME train)
one() {
    local name=$1 flags=$2
    shift 3
    echo "  $name: $* $flags" >&2
    "$@" $flags --log "$OUT/runs/$name.csv" --save "$OUT/runs/$name.ckpt" --summary "$OUT/runs/$name.sum" \
        </dev/null >"$OUT/runs/$name.out" 2>&1
    if [ "$name" != train ]; then
        tools/compare "$OUT/runs/train.csv" "$OUT/runs/$name.csv" "$OUT/runs/train.ckpt" "$OUT/runs/$name.ckpt" \
            >"$OUT/runs/$name.cmp" || true
    fi
}
# A fresh $OUT/runs: emptied only if this script made it (its marker file is there), so
# that an OUT pointing at a folder of the user's loses nothing.
fresh() {
    if [ -e "$OUT/runs" ] && [ ! -e "$OUT/runs/.made-by-tables.sh" ]; then
        echo "tools/tables.sh: $OUT/runs exists and was not made by this script; set OUT to another folder" >&2
        exit 1
    fi
    rm -rf "$OUT/runs"
    mkdir -p "$OUT/runs"
    touch "$OUT/runs/.made-by-tables.sh"
}

table_dp() {
    fresh
    local f="--eval-every 0"
    one train "$f" -- ./train
    for n in 2 4; do one dp$n "$f" -- $MPIRUN -n $n ./train_dp; done
    one dp2o "$f" -- $MPIRUN -n 2 ./train_dp --overlap
    echo "### data parallel: \`bash tools/tables.sh dp\`"
    echo
    tools/report "$OUT" train dp2 dp4 dp2o
}

table_fsdp() {
    fresh
    local f="--eval-every 0 --optimizer adamw"
    one train "$f" -- ./train
    for z in 1 2 3; do for n in 2 4; do one z$z-$n "$f" -- $MPIRUN -n $n ./train_fsdp --zero $z; done; done
    echo "### ZeRO stages, AdamW: \`bash tools/tables.sh fsdp\`"
    echo
    tools/report "$OUT" train z1-2 z1-4 z2-2 z2-4 z3-2 z3-4
    # and a model whose units are of similar sizes: there the 1/N of ZeRO-3 shows
    fresh
    f="--eval-every 0 --optimizer adamw --hidden 256 --layers 4 --steps 2000"
    one train "$f" -- ./train
    for z in 1 2 3; do one z$z-4 "$f" -- $MPIRUN -n 4 ./train_fsdp --zero $z; done
    echo
    echo "### ZeRO stages on 4 ranks, a model of 5 similar layers (\`--hidden 256 --layers 4 --steps 2000\`, AdamW): \`bash tools/tables.sh fsdp\`"
    echo
    tools/report "$OUT" train z1-4 z2-4 z3-4
}

table_tp() {
    fresh
    local f="--eval-every 0"
    one train "$f" -- ./train
    for n in 2 4; do one tp$n "$f" -- $MPIRUN -n $n ./train_tp; done
    echo "### tensor parallel: \`bash tools/tables.sh tp\`"
    echo
    tools/report "$OUT" train tp2 tp4
    echo
    for n in 2 4; do
        echo "- $n ranks, parameters per rank: $(grep -o '| memory [0-9.]* [KMG]*B' "$OUT/runs/tp$n.out" | head -1 | cut -d' ' -f3-)" \
            "(train.c: $(grep -o '| memory [0-9.]* [KMG]*B' "$OUT/runs/train.out" | head -1 | cut -d' ' -f3-))"
    done
}

# pp_row NAME S M SCHED: a table row from a pipeline run's summary and output
pp_row() {
    local name=$1 s=$2 m=$3 sched=$4
    awk -v s=$s -v m=$m -v sched=$sched '
        /^seconds=/ { split($0, a, "="); secs = a[2] } /^steps=/ { split($0, a, "="); steps = a[2] }
        /^rank=/ { for (i = 1; i <= NF; i++) if ($i ~ /^bubble=/) { split($i, a, "="); b = b sprintf("%s%.2f", b == "" ? "" : " ", a[2]) } }
        END { printf "| %d | %d | %s | %.3f | %s | %.2f | ", s, m, sched, 1e3 * secs / steps, b, (s - 1) / (m + s - 1) }' \
        "$OUT/runs/$name.sum"
    echo "$(sed -n 's/^  rank [0-9]*: bubble .* peak \([0-9]*\).*/\1/p' "$OUT/runs/$name.out" | tr '\n' ' ' | sed 's/ $//') | $([ "$(cut -c1-9 "$OUT/runs/$name.cmp")" = identical ] && echo yes || echo no) |"
}
pp_header() {
    echo "| stages | microbatches | schedule | ms/step | bubble measured (per stage) | bubble in theory | activations held at the peak (per stage) | same as train.c |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
}

table_pp() {
    fresh
    # 2 stages, one core each, a model whose two halves cost the same
    local f="--layers 2 --hidden 256 --steps 300 --eval-every 0 --samples 0"
    one train "$f" -- ./train
    echo "### pipeline, 2 stages on 2 cores, \`--layers 2 --hidden 256 --steps 300\`: \`bash tools/tables.sh pp\`"
    echo
    pp_header
    for m in 1 2 4 8 16; do
        for sched in naive gpipe 1f1b; do
            one pp2-$m-$sched "$f" -- $MPIRUN -n 2 ./train_pp --microbatches $m --schedule $sched
            pp_row pp2-$m-$sched 2 $m $sched
        done
    done
    # 3 and 4 stages: more ranks than this machine has cores
    fresh
    f="--layers 3 --hidden 256 --steps 200 --eval-every 0 --samples 0"
    one train "$f" -- ./train
    echo
    echo "### pipeline, 3 and 4 stages sharing 2 cores, \`--layers 3 --hidden 256 --steps 200\`: \`bash tools/tables.sh pp\`"
    echo
    pp_header
    for s in 3 4; do
        for m in 1 4 8; do
            for sched in naive gpipe 1f1b; do
                one pp$s-$m-$sched "$f" -- $MPIRUN -n $s ./train_pp --microbatches $m --schedule $sched
                pp_row pp$s-$m-$sched $s $m $sched
            done
        done
    done
    echo
    echo "#### one gpipe step and one 1f1b step, 2 stages, 8 microbatches (\`--timeline\`)"
    echo
    for sched in gpipe 1f1b; do
        echo '```'
        echo "\$ mpirun -n 2 ./train_pp --layers 2 --hidden 256 --microbatches 8 --schedule $sched --steps 300 --eval-every 0 --samples 0 --timeline"
        $MPIRUN -n 2 ./train_pp --layers 2 --hidden 256 --microbatches 8 --schedule $sched --steps 300 --eval-every 0 \
            --samples 0 --timeline </dev/null | sed -n '/^timeline/,$p'
        echo '```'
    done
}

table_3d() {
    fresh
    local f="--layers 3 --steps 2500 --eval-every 0"
    one train "$f" -- ./train
    one g222 "$f" -- $MPIRUN -n 8 ./train_3d --tp 2 --dp 2 --pp 2
    one g123 "$f" -- $MPIRUN -n 6 ./train_3d --tp 1 --dp 2 --pp 3 --zero 1
    one g213 "$f" -- $MPIRUN -n 6 ./train_3d --tp 2 --dp 1 --pp 3 --schedule gpipe
    one g411 "$f" -- $MPIRUN -n 4 ./train_3d --tp 4 --dp 1 --pp 1
    one g141 "$f" -- $MPIRUN -n 4 ./train_3d --tp 1 --dp 4 --pp 1 --zero 2
    echo "### 3D grids, \`--layers 3 --steps 2500\`: \`bash tools/tables.sh 3d\`"
    echo
    tools/report "$OUT" train g222 g123 g213 g411 g141
}

# The GPT on the 4D and 5D grids (the 16-rank ones share 2 cores: slow, but the bytes, memory
# and results are what matter), each beside train.c on the same model.
table_nd() {
    fresh
    local f="--model gpt --steps 100 --eval-every 0" x="--experts 4 --microbatches 1"
    one train "$f" -- ./train
    one g2221 "$f" -- $MPIRUN -n 8 ./train_3d --tp 2 --cp 2 --pp 2 --dp 1
    one g2222 "$f" -- $MPIRUN -n 16 ./train_3d --tp 2 --cp 2 --pp 2 --dp 2
    one sp4 "$f --sp" -- $MPIRUN -n 4 ./train_3d --tp 2 --pp 2 --dp 1 --schedule zbv
    one moe "$f --experts 4" -- ./train
    one g5d "$f $x" -- $MPIRUN -n 16 ./train_3d --tp 2 --cp 2 --pp 2 --dp 2 --ep 2
    tools/compare "$OUT/runs/moe.csv" "$OUT/runs/g5d.csv" "$OUT/runs/moe.ckpt" "$OUT/runs/g5d.ckpt" >"$OUT/runs/g5d.cmp" || true
    echo "### the GPT on 4D and 5D grids, \`--model gpt --steps 100\`: \`bash tools/tables.sh nd\`"
    echo
    tools/report "$OUT" train g2221 g2222 sp4 moe g5d@moe
}

table_schedules() {
    fresh
    make -s tools/schedules
    for m in 8 16; do
        echo "### \`bash tools/tables.sh schedules\`: 4 ranks (on 2 cores), $m microbatches"
        echo
        bash tools/schedule_table.sh "$OUT" $m --steps 300 --eval-every 0 --samples 0 | tail -n +3
        echo
    done
    tools/schedules --svg "$OUT/schedules.svg" 4 8 "$OUT"/runs/sched-8-{naive,gpipe,1f1b,interleaved,zb1,zbv,dualpipev}.json
    echo "picture: $OUT/schedules.svg"
}

table_ep() {
    fresh
    local f="--eval-every 0" x k n names="train"
    one train "$f" -- ./train
    for x in 4 8; do
        for k in 1 2; do
            one moe$x-$k "$f" -- ./train --experts $x --top-k $k
            names="$names moe$x-$k"
            for n in 2 4; do
                one ep$x-$k-$n "$f" -- $MPIRUN -n $n ./train_ep --experts $x --top-k $k
                tools/compare "$OUT/runs/moe$x-$k.csv" "$OUT/runs/ep$x-$k-$n.csv" "$OUT/runs/moe$x-$k.ckpt" \
                    "$OUT/runs/ep$x-$k-$n.ckpt" >"$OUT/runs/ep$x-$k-$n.cmp" || true
                names="$names ep$x-$k-$n@moe$x-$k"
            done
        done
    done
    echo "### expert parallel, the default configuration with --experts X --top-k K: \`bash tools/tables.sh ep\`"
    echo
    tools/report "$OUT" $names
    echo
    echo "| run (ranks) | val loss | ms/step | all-to-all sent/step, rank 0: measured (formula on the tokens routed; even routing, no drops) | dropped/step | load-balancing loss |"
    echo "| --- | --- | --- | --- | --- | --- |"
    for r in $names; do
        r=${r%@*}
        [ "$r" = train ] && continue
        local o="$OUT/runs/$r.out" a2a="-"
        grep -q '^  rank 0 .*rows: sent' "$o" && a2a=$(sed -n 's/^  rank 0 .*rows: sent \(.*\) (formula on the tokens routed: \(.*\); with even routing and no drops: \(.*\))$/\1 (\2; \3)/p' "$o")
        x=$(echo "$r" | sed 's/^[a-z]*\([0-9]*\)-\([0-9]*\).*/\1/') k=$(echo "$r" | sed 's/^[a-z]*\([0-9]*\)-\([0-9]*\).*/\2/')
        echo "| $(sed -n 's/^program=//p' "$OUT/runs/$r.sum") --experts $x --top-k $k on $(sed -n 's/^ranks=//p' "$OUT/runs/$r.sum")" \
            "| $(val_of "$o") | $(sed -n 's/^training time .*: \([0-9.]*\) ms\/step.*/\1/p' "$o")" \
            "| $a2a | $(sed -n 's/^    dropped \([0-9.]*\) tokens per step (\([0-9.]*%\).*/\1 (\2)/p' "$o")" \
            "| $(sed -n 's/.*load-balancing loss \([0-9.]*\) (mean).*/\1/p' "$o") |"
    done
    echo
    echo "dense model (train.c): validation loss $(val_of "$OUT/runs/train.out"), names: $(sed -n 's/^name=//p' "$OUT/runs/train.sum" | tr '\n' ' ')"
    for r in moe4-1 moe4-2 moe8-1 moe8-2; do
        echo "train.c --experts ${r:3:1} --top-k ${r:5:1}: validation loss $(val_of "$OUT/runs/$r.out"), names: $(sed -n 's/^name=//p' "$OUT/runs/$r.sum" | tr '\n' ' ')"
    done
}
val_of() { sed -n 's/^validation loss \([0-9.]*\).*/\1/p' "$1"; }

table_gpt_tp() {
    fresh
    local f="--model gpt --steps 200 --eval-every 0" n sp names="train"
    one train "$f" -- ./train
    for n in 1 2 4; do
        for sp in "" "--sp"; do
            one tp$n${sp:2} "$f" -- $MPIRUN -n $n ./train_tp $sp
            names="$names tp$n${sp:2}"
        done
    done
    echo "### the GPT split by heads, with and without sequence parallelism, \`--model gpt --steps 200\`: \`bash tools/tables.sh gpt_tp\`"
    echo
    tools/report "$OUT" $names
    echo
    echo "| ranks | --sp | sent/step/rank (formula) | the 4 blocks' activations per rank, held | Korthikanti et al.'s form a block, 4-byte floats, no dropout, times 4 |"
    echo "| --- | --- | --- | --- | --- |"
    for r in ${names#train }; do
        local o="$OUT/runs/$r.out"
        echo "| ${r:2:1} | $([ "${r:3}" = sp ] && echo yes || echo no) | $(sed -n 's/^  rank 0 *sent \([^(]*\) (formula \([^)]*\)).*/\1 (\2)/p' "$o")" \
            "| $(sed -n 's/.*: \([0-9]*\) B held.*/\1 B/p' "$o") | $(sed -n 's/.*without dropout, \(.*\): \([0-9]*\) B$/\2 B: \1/p' "$o") |"
    done
}

table_cp() {
    fresh
    local f="--model gpt --steps 200 --eval-every 0" n comm split names="train"
    one train "$f" -- ./train
    for n in 2 4 8; do
        for comm in ring allgather alltoall; do
            [ $comm = alltoall ] && [ $n = 8 ] && continue # Ulysses: N must divide the 4 heads
            one cp$n-$comm "$f" -- $MPIRUN -n $n ./train_cp --cp-comm $comm
            names="$names cp$n-$comm"
        done
    done
    one cp2-ring-contiguous "$f" -- $MPIRUN -n 2 ./train_cp --cp-split contiguous
    names="$names cp2-ring-contiguous"
    echo "### the GPT split by positions, \`--model gpt --steps 200\`: \`bash tools/tables.sh cp\`"
    echo
    tools/report "$OUT" $names
    echo
    for r in cp2-ring cp2-ring-contiguous; do
        echo "- $r: $(grep '^  rank [0-9]* *positions' "$OUT/runs/$r.out" | sed 's/^ *//' | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
    done
    # What each exchange costs, and what exactness costs (the ring's two-pass softmax against the
    # one-pass online softmax, --cp-softmax online, not train.c's bits): the same runs otherwise,
    # alternated so that the machine's load falls on all; ms a step from each run's --summary,
    # the median of 3 runs of 300 steps.
    local how rep ms
    median_ms() { # the median of the 3 runs sm-$1-*.sum, in ms a step
        for rep in 1 2 3; do sed -n 's/^seconds=//p' "$OUT/runs/sm-$1-$rep.sum"; done | sort -g | sed -n 2p |
            awk '{printf "%.2f", $1 * 1000 / 300}'
    }
    echo
    echo "ms a step, median of 3 alternating runs of 300 steps: the three exchanges (exact), and the ring's one-pass online softmax:"
    for n in 2 4; do
        for rep in 1 2 3; do
            for how in ring allgather alltoall online; do
                local arg="--cp-comm $how"
                [ $how = online ] && arg="--cp-softmax online"
                $MPIRUN -n $n ./train_cp --model gpt --steps 300 --eval-every 0 --samples 0 --quiet $arg \
                    --summary "$OUT/runs/sm-$n-$how-$rep.sum" </dev/null >/dev/null 2>&1
            done
        done
        echo "- $n ranks: ring $(median_ms $n-ring) ms, all-gather $(median_ms $n-allgather) ms, all-to-all (Ulysses)" \
            "$(median_ms $n-alltoall) ms; the ring with the online softmax $(median_ms $n-online) ms: the two passes cost" \
            "$(awk -v a="$(median_ms $n-ring)" -v b="$(median_ms $n-online)" 'BEGIN { printf "%+.0f%%", (a / b - 1) * 100 }')"
    done
}

for t in ${*:-dp fsdp tp pp 3d nd ep schedules gpt_tp cp}; do
    "table_$t"
    echo
done
