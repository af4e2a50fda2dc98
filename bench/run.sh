#!/usr/bin/env bash
# bench/run.sh: the benchmark behind docs/performance.md's tables. `make bench` builds
# what it needs and runs this; REPS=3 make bench for a quicker, noisier table.
#
# For the default and the large configuration it runs train.c, train.c built with OpenMP
# on 2 threads, and every strategy on 2 ranks (this machine has 2 cores), plus yardsticks
# (and, with 2 hidden layers, whose units split evenly into 2 pipeline stages, the
# pipeline schedules): from bench/bench.c a straightforward triple-loop version of the
# same step and OpenBLAS sgemm on the same matrix shapes; from bench/torch_step.py the
# same model in PyTorch, one process and DistributedDataParallel on 2 (when Debian's
# python3-torch is installed), and, as the ceiling of data parallelism on these cores, two
# copies of train.c side by side at half the batch each (bench/side_by_side.sh). Each run's time per step is the median of
# its logged per-step times after a warm-up; each row is the median over REPS repetitions,
# taken round-robin across the rows so that a slow moment of the machine hits them all
# alike. Speed-ups are ratios against train.c measured in the same run.
#
# It names the CPU and measures one core's peak float32 FLOP/s (bench/bench peak), which
# each row's GFLOP/s is set against (the cores it used: 2 for 2 ranks or 2 threads). Then
# the GPT at widths 64, 128 and 256 beside PyTorch; two scaling tables, the step time
# against the hidden size and against the batch size (train.c, PyTorch, and the speed-ups of
# three strategies on 2 ranks; SCALE_REPS=3 repetitions); the GPT's step op by op, train.c
# beside PyTorch, in CPU time (which a shared machine's other work does not inflate);
# speed-up against ranks (1, 2, and more ranks than cores) for five strategies; and last
# the goals of the performance work, each with its ratio measured in this run (a median of
# per-repetition ratios). Data for the pictures go to out/bench/*.tsv; bench/plot.py draws
# them (out/bench/*.svg), and they are copied to docs/bench_*.svg.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OPENBLAS_CORETYPE # some environments hold OpenBLAS to its AVX2 kernels; compare with its best
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
REPS=${REPS:-5}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# per-step times do not depend on the data; a small file keeps the final validation short
head -n 300 names.txt >"$TMP/names.txt"
MPIRUN=tools/mpirun
TORCH=""
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    TORCH="PyTorch $(dpkg-query -W -f='${Version}' python3-torch 2>/dev/null | cut -d+ -f1)"
    # OpenBLAS's kernels for this CPU may not be its default ones: time each, keep the fastest correct
    /usr/bin/python3 bench/openblas_core.py >"$TMP/coretype"
    CORETYPE=$(awk '/^best/ { print $2 }' "$TMP/coretype")
    [ "$CORETYPE" = default ] || export OPENBLAS_CORETYPE=$CORETYPE
    echo "PyTorch's OpenBLAS: $(grep -c '^coretype' "$TMP/coretype") core types timed (bench/openblas_core.py), the fastest correct one $CORETYPE" >&2
    TORCH_KERNEL=$(/usr/bin/python3 bench/torch_step.py --kernel | sed 's/^kernel //')
    echo "PyTorch's bf16 product runs on: $TORCH_KERNEL" >&2
else
    echo "PyTorch rows left out: Debian's python3-torch is not installed" >&2
fi

# name | cores | command (the configuration's flags are appended); $1: which configuration
runs() {
    if [[ $1 == scale* ]]; then # the scaling tables: train.c, 2 ranks of three strategies, PyTorch
        cat <<EOF
train.c|1|./train
data parallel|2|$MPIRUN -n 2 ./train_dp
ZeRO-3|2|$MPIRUN -n 2 ./train_fsdp --zero 3
tensor parallel|2|$MPIRUN -n 2 ./train_tp
EOF
        [ -z "$TORCH" ] || echo "$TORCH, 1 thread (torch_step.py)|1|/usr/bin/python3 bench/torch_step.py"
        return 0
    fi
    if [[ $1 == gpt?* ]]; then # the GPT at other widths: train.c (fp32, then bf16 operands) beside PyTorch
        echo "train.c|1|./train"
        echo "train.c --precision bf16|1|./train --precision bf16"
        [ -z "$TORCH" ] || echo "$TORCH, 1 thread (torch_step.py)|1|/usr/bin/python3 bench/torch_step.py"
        [ -z "$TORCH" ] || echo "$TORCH bf16 autocast, 1 thread|1|/usr/bin/python3 bench/torch_step.py --autocast bf16"
        return 0
    fi
    if [[ $1 == ranks_* ]]; then # speed-up against ranks: 1, 2 and more ranks than cores
        local r what=${1#ranks_}
        echo "train.c|1|./train"
        for r in 1 2 "$MANY"; do
            case $what in
            large) echo "data parallel (MLP large)|$r|$MPIRUN -n $r ./train_dp"
                echo "ZeRO-3 (MLP large)|$r|$MPIRUN -n $r ./train_fsdp --zero 3"
                echo "tensor parallel (MLP large)|$r|$MPIRUN -n $r ./train_tp" ;;
            deep) echo "pipeline 1f1b, 8 microbatches (MLP deep)|$r|$MPIRUN -n $r ./train_pp --schedule 1f1b --microbatches 8" ;;
            gpt) echo "context parallel, ring (GPT)|$r|$MPIRUN -n $r ./train_cp" ;;
            esac
        done
        return 0
    fi
    if [ "$1" = gpt ]; then # makemore's Transformer, its default configuration
        cat <<EOF
train.c|1|./train
train.c --precision bf16|1|./train --precision bf16
train.c built plain: cc train.c -o train -lm|1|bench/train_plain
data parallel|2|$MPIRUN -n 2 ./train_dp
ZeRO-3|2|$MPIRUN -n 2 ./train_fsdp --zero 3
tensor parallel|2|$MPIRUN -n 2 ./train_tp
tensor parallel --sp|2|$MPIRUN -n 2 ./train_tp --sp
context parallel, ring|2|$MPIRUN -n 2 ./train_cp
context parallel, all-gather|2|$MPIRUN -n 2 ./train_cp --cp-comm allgather
EOF
        [ -z "$TORCH" ] || echo "$TORCH, 1 thread (torch_step.py)|1|/usr/bin/python3 bench/torch_step.py"
        [ -z "$TORCH" ] || echo "$TORCH bf16 autocast, 1 thread|1|/usr/bin/python3 bench/torch_step.py --autocast bf16"
        return 0
    fi
    if [ "$1" = deep ]; then # two hidden layers: the units split evenly into 2 pipeline stages
        cat <<EOF
train.c|1|./train
data parallel|2|$MPIRUN -n 2 ./train_dp
tensor parallel|2|$MPIRUN -n 2 ./train_tp
pipeline 1f1b, 8 microbatches|2|$MPIRUN -n 2 ./train_pp --schedule 1f1b --microbatches 8
pipeline gpipe, 8 microbatches|2|$MPIRUN -n 2 ./train_pp --schedule gpipe --microbatches 8
pipeline zb1, 8 microbatches|2|$MPIRUN -n 2 ./train_pp --schedule zb1 --microbatches 8
pipeline 1f1b, 2 microbatches|2|$MPIRUN -n 2 ./train_pp --schedule 1f1b --microbatches 2
EOF
        torch_runs
        return
    fi
    cat <<EOF
train.c|1|./train
train.c built plain: cc train.c -o train -lm|1|bench/train_plain
train.c, OpenMP 2 threads|2|env OMP_NUM_THREADS=2 bench/train_omp
data parallel|2|$MPIRUN -n 2 ./train_dp
data parallel --overlap|2|$MPIRUN -n 2 ./train_dp --overlap
two train.c side by side, half the batch each: data parallelism without communication|2|bench/side_by_side.sh ./train
ZeRO-1|2|$MPIRUN -n 2 ./train_fsdp --zero 1
ZeRO-3|2|$MPIRUN -n 2 ./train_fsdp --zero 3
tensor parallel|2|$MPIRUN -n 2 ./train_tp
pipeline 1f1b, 8 microbatches|2|$MPIRUN -n 2 ./train_pp --schedule 1f1b --microbatches 8
3D tp 2 (dp 1, pp 1, 1 microbatch)|2|$MPIRUN -n 2 ./train_3d --tp 2 --dp 1 --pp 1 --microbatches 1
triple loops (bench.c)|1|bench/bench naive
OpenBLAS sgemm, same shapes (bench.c)|1|bench/bench sgemm
EOF
    torch_runs
}
torch_runs() {
    [ -n "$TORCH" ] || return 0
    echo "$TORCH, 1 thread (torch_step.py)|1|/usr/bin/python3 bench/torch_step.py"
    echo "$TORCH DistributedDataParallel, gloo (torch_step.py)|2|/usr/bin/python3 bench/torch_step.py --ddp 2"
}

# median of the numbers on stdin
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# key_medians: lines "key<TAB>number" on stdin -> "key<TAB>median of its numbers", keys in
# the order they first came
key_medians() {
    awk -F'\t' '!($1 in first) { first[$1] = NR } { print first[$1] "\t" $0 }' | sort -t$'\t' -k1,1n -k3,3g |
        awk -F'\t' 'function out() { if (n) printf "%s\t%s\n", key, n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
            $2 != key { out(); key = $2; n = 0 } { v[++n] = $3 } END { out() }'
}

# one_run COMMAND FLAGS STEPS WARMUP: prints the median ms per step after the warm-up
one_run() {
    local cmd=$1 flags=$2 steps=$3 warmup=$4
    if [[ $cmd == "bench/bench naive" ]]; then # slow: a few steps are enough
        $cmd $flags --steps $((steps < 5 ? steps : 5)) | awk '$1 == "ms_per_step" { print $2 }'
    elif [[ $cmd == bench/bench* || $cmd == *torch_step.py* ]]; then
        $cmd $flags --steps "$steps" | awk '$1 == "ms_per_step" { print $2 }' # the wall clock (not cpu_ms_per_step)
    else
        $cmd $flags --data "$TMP/names.txt" --steps $((steps + warmup)) --eval-every 0 --samples 0 --quiet \
            --log "$TMP/log.csv" >/dev/null
        awk -F, -v w="$warmup" 'NR > w + 1 { print $4 }' "$TMP/log.csv" | median
    fi
}

# step_flops FLAGS: floating-point operations of a step: 2 per multiply-add, 3 products per
# linear layer (forward, weight gradient, input gradient): 6 x (weights of the linear layers)
# x rows (context 16 and a vocabulary of 27, as for names.txt)
flag() { echo "$2" | sed -n "s/.*--$1 \([0-9]*\).*/\1/p"; }
# the GPT (--model gpt, makemore's defaults: C 64 (--emb), 4 blocks, T 16, batch 32): 6 x
# the parameters of its matrix products (12 C^2 a block, and lm_head's C x 27) per token, plus
# attention's q.k and P.v, 12 x blocks x T x C per token (the usual count, causal or not)
step_flops() {
    if [[ $1 == *"--model gpt"* ]]; then
        local c
        c=$(flag emb "$1")
        c=${c:-64}
        echo $((32 * 16 * (6 * (4 * 12 * c * c + c * 27) + 12 * 4 * 16 * c)))
        return
    fi
    local emb hidden batch layers
    emb=$(flag emb "$1") hidden=$(flag hidden "$1") batch=$(flag batch "$1") layers=$(flag layers "$1")
    layers=${layers:-1}
    echo $((6 * batch * (16 * emb * hidden + (layers - 1) * hidden * hidden + hidden * 27)))
}

# collect TITLE FLAGS STEPS WARMUP [REPS]: every run of TITLE, REPS times round-robin; the
# times go to $TMP/TITLE.i (i: the run's line in `runs TITLE`)
collect() {
    local title=$1 flags=$2 steps=$3 warmup=$4 reps=${5:-$REPS} n i rep name cores cmd
    n=$(runs "$title" | wc -l)
    for rep in $(seq 1 "$reps"); do
        i=0
        while IFS='|' read -r name cores cmd; do
            i=$((i + 1))
            printf '\r  %s: repetition %d of %d, run %d of %d   ' "$title" "$rep" "$reps" "$i" "$n" >&2
            one_run "$cmd" "$flags" "$steps" "$warmup" >>"$TMP/$title.$i" </dev/null # mpirun reads stdin
        done < <(runs "$title")
    done
    printf '\r%*s\r' 70 '' >&2
}
# ms TITLE NAME: the median ms/step of the run NAME of TITLE ("nan" if there is no such run)
ms() {
    local i=0 name cores cmd
    while IFS='|' read -r name cores cmd; do
        i=$((i + 1))
        if [ "$name" = "$2" ]; then
            median <"$TMP/$1.$i"
            return
        fi
    done < <(runs "$1")
    echo nan
}

# idx TITLE NAME: the line of run NAME in `runs TITLE` (0 if none)
idx() {
    local i=0 name cores cmd
    while IFS='|' read -r name cores cmd; do
        i=$((i + 1))
        [ "$name|$cores" = "$2" ] || [ "$name" = "$2" ] && { echo $i; return; }
    done < <(runs "$1")
    echo 0
}
# ratio_med TITLE A B: the median over repetitions of A's time / B's, each pair from the same
# repetition (round robin: a slow moment of the machine hits both); A and B are run names
# or name|cores
ratio_med() {
    local a b
    a=$(idx "$1" "$2") b=$(idx "$1" "$3")
    if [ "$a" = 0 ] || [ "$b" = 0 ]; then echo nan; return; fi
    paste "$TMP/$1.$a" "$TMP/$1.$b" | awk '{ print $1 / $2 }' | median
}

bench_config() {
    local title=$1 flags=$2 flops batch base i name cores cmd
    collect "$@"
    flops=$(step_flops "$flags") batch=$(flag batch "$flags") base=$(median <"$TMP/$title.1")
    [[ $flags == *"--model gpt"* ]] && batch=$((32 * 16)) # tokens a step: makemore's 32 names of 16 positions
    echo
    echo "$title configuration ($flags; $(awk -v f="$flops" 'BEGIN { printf "%.2f", f / 1e6 }') MFLOP per step), median of $REPS repetitions:"
    echo
    echo "| run | cores | ms/step | tokens/s | GFLOP/s | of the cores' peak | speed-up vs train.c |"
    echo "| --- | --- | --- | --- | --- | --- | --- |"
    i=0
    while IFS='|' read -r name cores cmd; do
        i=$((i + 1))
        awk -v name="$name" -v c="$cores" -v ms="$(median <"$TMP/$title.$i")" -v b="$batch" -v f="$flops" -v base="$base" \
            -v peak="$PEAK" 'BEGIN { g = f / (ms / 1e3) / 1e9
            printf "| %s | %s | %.4f | %.0f | %.1f | %.0f%% | %.2fx |\n", name, c, ms, b / (ms / 1e3), g, 100 * g / (peak * c), base / ms }'
    done < <(runs "$title")
}

# scaling AXIS VALUES...: step time against the hidden size or the batch size, train.c beside
# PyTorch, and the speed-up over train.c of three strategies on 2 ranks
scaling() {
    local axis=$1 v flags title
    shift
    echo
    if [ "$axis" = hidden ]; then echo "step time against the hidden size (--emb 64 --batch 256), median of $SCALE_REPS repetitions:"
    else echo "step time against the batch size (--emb 64 --hidden 1024), median of $SCALE_REPS repetitions:"; fi
    echo
    echo "| $axis | MFLOP/step | train.c ms | PyTorch ms | train.c / PyTorch | data parallel, 2 ranks | ZeRO-3, 2 ranks | tensor parallel, 2 ranks |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
    for v in "$@"; do
        if [ "$axis" = hidden ]; then flags="--emb 64 --hidden $v --batch 256"; else flags="--emb 64 --hidden 1024 --batch $v"; fi
        title=scale_${axis}_$v
        collect "$title" "$flags" 20 5 "$SCALE_REPS"
        awk -v v="$v" -v f="$(step_flops "$flags")" -v t="$(ms "$title" train.c)" -v p="$(ms "$title" "$TORCH, 1 thread (torch_step.py)")" \
            -v dp="$(ms "$title" "data parallel")" -v z3="$(ms "$title" ZeRO-3)" -v tp="$(ms "$title" "tensor parallel")" 'BEGIN {
            printf "| %s | %.1f | %.3f | %s | %s | %.2fx | %.2fx | %.2fx |\n", v, f / 1e6, t, p == "nan" ? "-" : sprintf("%.3f", p),
                p == "nan" ? "-" : sprintf("%.2fx", t / p), t / dp, t / z3, t / tp }'
    done
}

# goal_row GOAL RATIO TARGET BESIDE [lower]: one row of the goals' table; a ratio must reach
# the target (or, with "lower", stay at or below it)
goal_row() {
    awk -v g="$1" -v r="$2" -v t="$3" -v p="$4" -v dir="${5:-higher}" 'BEGIN {
        met = dir == "higher" ? r >= t : r <= t
        printf "| %s | %.2fx | %s | %s |\n", g, r, p, met ? "met" : sprintf("missed by %.2fx", dir == "higher" ? t / r : r / t) }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { print a / b }'; }

# gpt_ops: the GPT's step split by op, train.c (bench/bench ops, CPU time) beside PyTorch
# (bench/torch_step.py --profile), at widths 64, 128 and 256, REPS times round robin; each
# category's median. Both steps run under their timers, and PyTorch's profiler adds more to
# its step (C 128: 38 ms against 31 without it) than bench/bench ops' timers add to train.c's:
# the goals time both steps without them (cpu_ratio). Writes $OUT/gpt_ops.tsv, and train.c's op by op at C 64 to $OUT/gpt_ops_c64.tsv.
gpt_ops() {
    local c rep steps f
    echo
    echo "the GPT's step by op, in CPU time (ms a step: bench/bench ops, bench/torch_step.py --profile), median of $REPS repetitions (each under its timers, PyTorch's profiler the costlier; the goals below time both without):"
    : >"$OUT/gpt_ops.tsv"
    for c in 64 128 256; do
        steps=$((c == 256 ? 6 : c == 128 ? 12 : 20))
        for rep in $(seq 1 "$REPS"); do
            printf '\r  gpt ops C %d: repetition %d of %d   ' "$c" "$rep" "$REPS" >&2
            bench/bench ops --model gpt --emb "$c" --steps "$steps" >"$TMP/ops.$c.train.$rep"
            [ -z "$TORCH" ] || /usr/bin/python3 bench/torch_step.py --model gpt --emb "$c" --profile --steps "$steps" >"$TMP/ops.$c.torch.$rep"
        done
        printf '\r%*s\r' 70 '' >&2
        echo
        echo "C $c:"
        echo
        echo "| category | train.c ms | PyTorch ms |"
        echo "| --- | --- | --- |"
        for f in train torch; do
            [ -e "$TMP/ops.$c.$f.1" ] || continue
            # each repetition's total by category, then the median over repetitions
            for rep in $(seq 1 "$REPS"); do
                awk -F'|' '/^op\|/ { if (!($2 in t)) k[++n] = $2; t[$2] += $4 } END { for (i = 1; i <= n; i++) print k[i] "\t" t[k[i]] }' \
                    "$TMP/ops.$c.$f.$rep"
            done | key_medians | awk -F'\t' -v c="$c" -v who="$([ $f = train ] && echo train.c || echo PyTorch)" \
                '{ printf "%s\t%s\t%s\t%.4f\n", c, who, $1, $2 }' >>"$OUT/gpt_ops.tsv"
            for rep in $(seq 1 "$REPS"); do awk '/^cpu_ms_per_step/ { print $2 }' "$TMP/ops.$c.$f.$rep"; done >"$TMP/ops.$c.$f.cpu"
        done
        awk -F'\t' -v c="$c" '$1 == c { if (!($3 in ms)) k[++n] = $3; ms[$3] = 1; v[$3, $2] = $4 }
            END { for (i = 1; i <= n; i++) printf "| %s | %s | %s |\n", k[i], ((k[i], "train.c") in v) ? sprintf("%.2f", v[k[i], "train.c"]) : "-",
                                         ((k[i], "PyTorch") in v) ? sprintf("%.2f", v[k[i], "PyTorch"]) : "-" }' "$OUT/gpt_ops.tsv"
        if [ -e "$TMP/ops.$c.torch.cpu" ]; then
            printf '| whole step, CPU time | %.2f | %.2f |\n' "$(median <"$TMP/ops.$c.train.cpu")" "$(median <"$TMP/ops.$c.torch.cpu")"
        fi
    done
    # train.c op by op at C 64: the median of each op over the repetitions
    for rep in $(seq 1 "$REPS"); do grep '^op|' "$TMP/ops.64.train.$rep"; done | awk -F'|' '{ print $2 "|" $3 "\t" $4 }' |
        key_medians | awk -F'\t' '{ split($1, k, "|"); printf "%s\t%s\t%.4f\n", k[1], k[2], $2 }' >"$OUT/gpt_ops_c64.tsv"
    echo
    echo "train.c's GPT step at C 64, op by op (ms, CPU time; the same $REPS repetitions):"
    echo
    echo "| op | category | ms |"
    echo "| --- | --- | --- |"
    awk -F'\t' '{ printf "| %s | %s | %.3f |\n", $2, $1, $3 }' "$OUT/gpt_ops_c64.tsv"
}

# rank_scaling: speed-up over train.c against ranks (1, 2, and $MANY: more than the cores),
# each a median of per-repetition ratios; writes $OUT/scaling.tsv
rank_scaling() {
    local what name cores cmd r
    echo
    echo "speed-up over train.c against ranks (median of $REPS per-repetition ratios; $MANY ranks share $CORES cores):"
    echo
    echo "| strategy | 1 rank | 2 ranks | $MANY ranks (on $CORES cores) |"
    echo "| --- | --- | --- | --- |"
    : >"$OUT/scaling.tsv"
    for what in "large|--emb 64 --hidden 1024 --batch 256" "deep|--emb 64 --hidden 1024 --batch 256 --layers 2" "gpt|--model gpt --context 16"; do
        collect "ranks_${what%%|*}" "${what#*|}" 20 5
        while IFS='|' read -r name cores cmd; do
            [ "$name" = train.c ] && continue
            printf '%s\t%s\t%s\n' "$name" "$cores" "$(ratio_med "ranks_${what%%|*}" train.c "$name|$cores")" >>"$OUT/scaling.tsv"
        done < <(runs "ranks_${what%%|*}")
    done
    awk -F'\t' '{ if (!($1 in row)) order[++n] = $1; row[$1] = row[$1] sprintf(" %.2fx |", $3) }
        END { for (i = 1; i <= n; i++) printf "| %s |%s\n", order[i], row[order[i]] }' "$OUT/scaling.tsv"
}

# cpu_ratio FLAGS STEPS: train.c's step (bench/bench step) over PyTorch's, in CPU time, REPS
# alternating pairs (at least 5), the median of the pairs' ratios (the goals against PyTorch: on a shared
# machine the wall clock also counts the time other processes hold the core)
cpu_ratio() {
    local rep t p
    for rep in $(seq 1 $((REPS > 5 ? REPS : 5))); do
        t=$(bench/bench step $1 --steps "$2" | awk '/cpu_ms_per_step/ { print $2 }')
        p=$(/usr/bin/python3 bench/torch_step.py $1 --steps "$2" | awk '/cpu_ms_per_step/ { print $2 }')
        awk -v t="$t" -v p="$p" 'BEGIN { print t / p }'
    done | median
}

# goals: the performance targets, each measured in this run
goals() {
    local pp_best="" pp_name="" name cores cmd m beside pt c r tile wgrad ingrad
    echo
    echo "the goals, each measured in this run (ratios: medians of per-repetition ratios, round robin; against PyTorch in CPU time):"
    echo
    echo "| goal | measured | beside it | |"
    echo "| --- | --- | --- | --- |"
    pt="$TORCH, 1 thread (torch_step.py)"
    beside="-"
    [ -z "$TORCH" ] || beside="PyTorch: $(ratio_med default "triple loops (bench.c)" "$pt" | awk '{ printf "%.2fx", $1 }') the triple loops"
    goal_row "default MLP: train.c at least 10x the triple loops (wall clock)" "$(ratio_med default "triple loops (bench.c)" train.c)" 10 "$beside"
    if [ -n "$TORCH" ]; then
        goal_row "default MLP: train.c faster than PyTorch (PyTorch's time / train.c's)" \
            "$(cpu_ratio "--emb 16 --hidden 64 --batch 32" 2000 | awk '{ print 1 / $1 }')" 1 \
            "$(printf 'wall clock %.2fx (PyTorch %.3f ms, train.c %.3f ms)' "$(ratio_med default "$pt" train.c)" "$(ms default "$pt")" "$(ms default train.c)")"
        goal_row "large MLP: train.c within 2x PyTorch's time (train.c's time / PyTorch's)" \
            "$(cpu_ratio "--emb 64 --hidden 1024 --batch 256" 20)" 2 \
            "$(printf 'wall clock %.2fx (PyTorch %.2f ms, train.c %.2f ms)' "$(ratio_med large train.c "$pt")" "$(ms large "$pt")" "$(ms large train.c)")" lower
    fi
    # the exact products of the large MLP, in the product, against the exact tile alone (bench/bench kernels)
    tile=$(awk -F'|' '/exact tile alone/ { print $4 + 0 }' "$TMP/kernels")
    wgrad=$(awk -F'|' '/weight gradient, exact/ { print $4 + 0 }' "$TMP/kernels")
    ingrad=$(awk -F'|' '/input gradient, exact/ { print $4 + 0 }' "$TMP/kernels")
    goal_row "large MLP: the exact weight gradient at 80% or more of the exact tile's rate, in the whole product" \
        "$(ratio "$wgrad" "$tile")" 0.8 "$(printf '%.1f GFLOP/s in the product, %.1f the tile alone' "$wgrad" "$tile")"
    goal_row "large MLP: the same, the exact input gradient" "$(ratio "$ingrad" "$tile")" 0.8 \
        "$(printf '%.1f GFLOP/s in the product, %.1f the tile alone' "$ingrad" "$tile")"
    beside="two train.c side by side at half the batch (the cores' ceiling): $(ratio_med large train.c "two train.c side by side, half the batch each: data parallelism without communication" | awk '{ printf "%.2fx", $1 }')"
    [ -z "$TORCH" ] || beside="$beside; PyTorch's DistributedDataParallel: $(ratio_med large "$pt" "$TORCH DistributedDataParallel, gloo (torch_step.py)" | awk '{ printf "%.2fx", $1 }') its one process"
    goal_row "large MLP, 2 ranks: data parallel at least 1.8x train.c" "$(ratio_med large train.c "data parallel")" 1.8 "$beside"
    goal_row "large MLP, 2 ranks: ZeRO-3 at least 1.6x" "$(ratio_med large train.c ZeRO-3)" 1.6 "-"
    goal_row "large MLP, 2 ranks: tensor parallel at least 1.6x" "$(ratio_med large train.c "tensor parallel")" 1.6 "-"
    while IFS='|' read -r name cores cmd; do # the best pipeline schedule with 8 microbatches
        [[ $name == pipeline*", 8 microbatches" ]] || continue
        m=$(ratio_med deep train.c "$name")
        if [ -z "$pp_best" ] || awk -v a="$m" -v b="$pp_best" 'BEGIN { exit !(a > b) }'; then pp_best=$m pp_name=${name%%,*}; fi
    done < <(runs deep)
    goal_row "2 ranks, pipeline, 8 microbatches, best schedule ($pp_name), deep MLP (with one hidden layer the stages cannot balance): at least 1.4x" \
        "$pp_best" 1.4 "-"
    if [ -n "$TORCH" ]; then
        for c in 64 128 256; do
            name=gpt$([ $c = 64 ] || echo $c)
            r=$(cpu_ratio "--model gpt --emb $c" $((c == 256 ? 6 : c == 128 ? 12 : 20)))
            goal_row "the GPT at C $c$([ $c = 64 ] && echo ", makemore's default"): train.c at PyTorch's speed or better (train.c's time / PyTorch's)" \
                "$r" 1 "$(printf 'wall clock %.2fx (PyTorch %.2f ms, train.c %.2f ms)' "$(ratio_med "$name" train.c "$pt")" "$(ms "$name" "$pt")" "$(ms "$name" train.c)")" lower
        done
    fi
    # mixed precision: train.c's step with bf16 operands against its fp32 step, PyTorch's autocast beside it
    for c in 64 128 256; do
        name=gpt$([ $c = 64 ] || echo $c)
        beside="-"
        [ -z "$TORCH" ] || beside="PyTorch's bf16 autocast: $(ratio_med "$name" "$TORCH bf16 autocast, 1 thread" "$pt" | awk '{ printf "%.2fx", $1 }') its fp32 step, on ${TORCH_KERNEL:-?}"
        goal_row "the GPT at C $c: train.c --precision bf16 at most 0.6x its fp32 step (the exact kernels round bf16 operands, then run as in fp32)" \
            "$(ratio_med "$name" "train.c --precision bf16" train.c)" 0.6 "$beside" lower
    done
}

# gflops_data: GFLOP/s against the work of a step, train.c and PyTorch, the MLP's hidden
# sizes and the GPT's widths, for $OUT/gflops.tsv
gflops_data() {
    local v f t p c name flags
    : >"$OUT/gflops.tsv"
    for v in 64 128 256 512 1024 2048; do
        f=$(step_flops "--emb 64 --hidden $v --batch 256") t=$(ms "scale_hidden_$v" train.c) p=$(ms "scale_hidden_$v" "$TORCH, 1 thread (torch_step.py)")
        awk -v f="$f" -v t="$t" -v v="$v" 'BEGIN { printf "train.c, MLP\t%.2f\t%.2f\tH%s\n", f / 1e6, f / t / 1e6, v }' >>"$OUT/gflops.tsv"
        [ "$p" = nan ] || awk -v f="$f" -v t="$p" -v v="$v" 'BEGIN { printf "PyTorch, MLP\t%.2f\t%.2f\tH%s\n", f / 1e6, f / t / 1e6, v }' >>"$OUT/gflops.tsv"
    done
    for c in 64 128 256; do
        name=gpt$([ $c = 64 ] || echo $c) flags="--model gpt --emb $c"
        f=$(step_flops "$flags") t=$(ms "$name" train.c) p=$(ms "$name" "$TORCH, 1 thread (torch_step.py)")
        awk -v f="$f" -v t="$t" -v c="$c" 'BEGIN { printf "train.c, GPT\t%.2f\t%.2f\tC%s\n", f / 1e6, f / t / 1e6, c }' >>"$OUT/gflops.tsv"
        [ "$p" = nan ] || awk -v f="$f" -v t="$p" -v c="$c" 'BEGIN { printf "PyTorch, GPT\t%.2f\t%.2f\tC%s\n", f / 1e6, f / t / 1e6, c }' >>"$OUT/gflops.tsv"
    done
}

CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
FAMILY=$(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ') MODEL=$(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
ISA=$(grep -o -m1 -w avx512f /proc/cpuinfo || grep -o -m1 -w avx2 /proc/cpuinfo || echo "neither AVX-512 nor AVX2")
PEAK=$(bench/bench peak | awk '/peak_gflops/ { print $2 }')
SCALE_REPS=${SCALE_REPS:-3}
# the cores (nproc alone would say 1: it obeys OMP_NUM_THREADS, set to 1 above), and more ranks
# than cores (under MPICH, which cannot run them, as many as the cores)
CORES=$(nproc --all)
MANY=$(env -u OMP_NUM_THREADS tools/mpirun --ranks $((2 * CORES)))
OUT=out/bench
LOAD_START=$(cut -d' ' -f1 /proc/loadavg) # other work on the machine: it slows the wall clock, not CPU time
mkdir -p "$OUT"
echo "bench/run.sh on $(nproc --all) cores of $CPU (cpu family $FAMILY, model $MODEL, $ISA), $(date -u +%Y-%m-%d), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "peak of one core, float32 fused multiply-adds (bench/bench peak): $PEAK GFLOP/s"
bench_config default "--emb 16 --hidden 64 --batch 32" 2000 200
bench_config large "--emb 64 --hidden 1024 --batch 256" 30 5
bench_config deep "--emb 64 --hidden 1024 --batch 256 --layers 2" 20 5
bench_config gpt "--model gpt --context 16" 30 5
bench_config gpt128 "--model gpt --context 16 --emb 128" 20 5
bench_config gpt256 "--model gpt --context 16 --emb 256" 10 3
echo
echo "the products of linear 1 in the large configuration, one at a time (bench/bench kernels, median of 20):"
echo
bench/bench kernels --emb 64 --hidden 1024 --batch 256 --steps 20 | tee "$TMP/kernels"
scaling hidden 64 128 256 512 1024 2048
scaling batch 32 64 128 256 512
gpt_ops
rank_scaling
goals
# the pictures: out/bench/*.svg, copied into docs/ (docs/performance.md shows them)
printf 'cpu\t%s (cpu family %s, model %s)\ndate\t%s\ncores\t%s\npeak\t%s\nexact_bound\t%s\nload\t%s at the start, %s at the end\n' \
    "$CPU" "$FAMILY" "$MODEL" "$(date -u +%Y-%m-%d)" "$CORES" "$PEAK" "$(awk -F'|' '/exact tile alone/ { print $4 + 0 }' "$TMP/kernels")" \
    "$LOAD_START" "$(cut -d' ' -f1 /proc/loadavg)" >"$OUT/meta.tsv"
gflops_data
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 bench/plot.py "$OUT"
for f in scaling gflops gpt_ops; do [ -e "$OUT/$f.svg" ] && cp "$OUT/$f.svg" "docs/bench_$f.svg"; done
echo "and copied them into docs/ (docs/performance.md shows them)"
