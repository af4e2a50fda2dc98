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
# two scaling tables, the step time against the hidden size and against the batch size
# (train.c, PyTorch, and the speed-ups of three strategies on 2 ranks; SCALE_REPS=3
# repetitions), and last the goals of the performance work, each with its measured ratio.
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
    if [ "$1" = gpt ]; then # makemore's Transformer, its default configuration
        cat <<EOF
train.c|1|./train
train.c built plain: cc train.c -o train -lm|1|bench/train_plain
data parallel|2|$MPIRUN -n 2 ./train_dp
ZeRO-3|2|$MPIRUN -n 2 ./train_fsdp --zero 3
tensor parallel|2|$MPIRUN -n 2 ./train_tp
tensor parallel --sp|2|$MPIRUN -n 2 ./train_tp --sp
context parallel, ring|2|$MPIRUN -n 2 ./train_cp
context parallel, all-gather|2|$MPIRUN -n 2 ./train_cp --cp-comm allgather
EOF
        [ -z "$TORCH" ] || echo "$TORCH, 1 thread (torch_step.py)|1|/usr/bin/python3 bench/torch_step.py"
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

# one_run COMMAND FLAGS STEPS WARMUP: prints the median ms per step after the warm-up
one_run() {
    local cmd=$1 flags=$2 steps=$3 warmup=$4
    if [[ $cmd == "bench/bench naive" ]]; then # slow: a few steps are enough
        $cmd $flags --steps $((steps < 5 ? steps : 5)) | awk '/ms_per_step/ { print $2 }'
    elif [[ $cmd == bench/bench* || $cmd == *torch_step.py* ]]; then
        $cmd $flags --steps "$steps" | awk '/ms_per_step/ { print $2 }'
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
# the GPT (--model gpt, makemore's defaults: C 64, 4 blocks, T 16, batch 32): 6 x the
# parameters of its matrix products (12 C^2 a block, and lm_head's C x 27) per token, plus
# attention's q.k and P.v, 12 x blocks x T x C per token (the usual count, causal or not)
step_flops() {
    if [[ $1 == *"--model gpt"* ]]; then
        echo $((32 * 16 * (6 * (4 * 12 * 64 * 64 + 64 * 27) + 12 * 4 * 16 * 64)))
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

# goals: the performance targets, each measured in this run
goals() {
    local t_def naive torch_def t_large torch_large torch_ddp pp_best="" pp_name="" name cores cmd i=0 m beside
    t_def=$(ms default train.c) naive=$(ms default "triple loops (bench.c)") t_large=$(ms large train.c)
    torch_def=$(ms default "$TORCH, 1 thread (torch_step.py)") torch_large=$(ms large "$TORCH, 1 thread (torch_step.py)")
    torch_ddp=$(ms large "$TORCH DistributedDataParallel, gloo (torch_step.py)")
    while IFS='|' read -r name cores cmd; do # the best pipeline schedule with 8 microbatches
        i=$((i + 1))
        [[ $name == pipeline*", 8 microbatches" ]] || continue
        m=$(median <"$TMP/deep.$i")
        if [ -z "$pp_best" ] || awk -v a="$m" -v b="$pp_best" 'BEGIN { exit !(a < b) }'; then pp_best=$m pp_name=${name%%,*}; fi
    done < <(runs deep)
    echo
    echo "the goals, measured in this run (ratios of times: above 1, faster than what it is compared with):"
    echo
    echo "| goal | measured | beside it | |"
    echo "| --- | --- | --- | --- |"
    beside="-"
    [ -z "$TORCH" ] || beside="PyTorch: $(ratio "$naive" "$torch_def" | awk '{ printf "%.2fx", $1 }') the triple loops"
    goal_row "default configuration: train.c at least 10x the triple loops" "$(ratio "$naive" "$t_def")" 10 "$beside"
    if [ -n "$TORCH" ]; then
        goal_row "default configuration: train.c faster than PyTorch (PyTorch's time / train.c's)" \
            "$(ratio "$torch_def" "$t_def")" 1 "$(printf 'PyTorch %.3f ms, train.c %.3f ms' "$torch_def" "$t_def")"
        goal_row "large configuration: train.c within 1.2x of PyTorch (train.c's time / PyTorch's)" \
            "$(ratio "$t_large" "$torch_large")" 1.2 "$(printf 'PyTorch %.2f ms, train.c %.2f ms' "$torch_large" "$t_large")" lower
    fi
    beside="-"
    beside="two train.c side by side at half the batch (the cores' ceiling): $(ratio "$t_large" "$(ms large "two train.c side by side, half the batch each: data parallelism without communication")" | awk '{ printf "%.2fx", $1 }')"
    [ -z "$TORCH" ] || beside="$beside; PyTorch's DistributedDataParallel: $(ratio "$torch_large" "$torch_ddp" | awk '{ printf "%.2fx", $1 }') its one process"
    goal_row "large, 2 ranks: data parallel at least 1.8x train.c" "$(ratio "$t_large" "$(ms large "data parallel")")" 1.8 "$beside"
    goal_row "large, 2 ranks: ZeRO-3 at least 1.6x" "$(ratio "$t_large" "$(ms large ZeRO-3)")" 1.6 "-"
    goal_row "large, 2 ranks: tensor parallel at least 1.6x" "$(ratio "$t_large" "$(ms large "tensor parallel")")" 1.6 "-"
    goal_row "2 ranks, pipeline, 8 microbatches, best schedule ($pp_name), in the deep configuration (with one hidden layer the stages cannot balance): at least 1.4x" \
        "$(ratio "$(ms deep train.c)" "$pp_best")" 1.4 "-"
    if [ -n "$TORCH" ]; then
        local t_gpt torch_gpt
        t_gpt=$(ms gpt train.c) torch_gpt=$(ms gpt "$TORCH, 1 thread (torch_step.py)")
        goal_row "the GPT, makemore's default configuration: train.c at most 1.5x PyTorch's time (train.c's time / PyTorch's)" \
            "$(ratio "$t_gpt" "$torch_gpt")" 1.5 "$(printf 'PyTorch %.2f ms, train.c %.2f ms' "$torch_gpt" "$t_gpt")" lower
    fi
}

CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
ISA=$(grep -o -m1 -w avx512f /proc/cpuinfo || grep -o -m1 -w avx2 /proc/cpuinfo || echo "neither AVX-512 nor AVX2")
PEAK=$(bench/bench peak | awk '/peak_gflops/ { print $2 }')
SCALE_REPS=${SCALE_REPS:-3}
echo "bench/run.sh on $(nproc --all) cores of $CPU (cpu family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), $ISA), $(date -u +%Y-%m-%d)"
echo "peak of one core, float32 fused multiply-adds (bench/bench peak): $PEAK GFLOP/s"
bench_config default "--emb 16 --hidden 64 --batch 32" 2000 200
bench_config large "--emb 64 --hidden 1024 --batch 256" 30 5
bench_config deep "--emb 64 --hidden 1024 --batch 256 --layers 2" 20 5
bench_config gpt "--model gpt --context 16" 30 5
echo
echo "the products of linear 1 in the large configuration, one at a time (bench/bench kernels, median of 20):"
echo
bench/bench kernels --emb 64 --hidden 1024 --batch 256 --steps 20
scaling hidden 64 128 256 512 1024 2048
scaling batch 32 64 128 256 512
goals
