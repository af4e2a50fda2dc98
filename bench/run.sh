#!/usr/bin/env bash
# bench/run.sh: the benchmark behind the README's performance table. `make bench` builds
# what it needs and runs this; REPS=3 make bench for a quicker, noisier table.
#
# For the default and the large configuration it runs train.c, train.c built with OpenMP
# on 2 threads, and every strategy on 2 ranks (this machine has 2 cores), plus yardsticks
# (and, with 2 hidden layers, whose units split evenly into 2 pipeline stages, the
# pipeline schedules): from bench/bench.c a straightforward triple-loop version of the
# same step and OpenBLAS sgemm on the same matrix shapes; from bench/torch_step.py the
# same model in PyTorch, one process and DistributedDataParallel on 2 (when Debian's
# python3-torch is installed). Each run's time per step is the median of
# its logged per-step times after a warm-up; each row is the median over REPS repetitions,
# taken round-robin across the rows so that a slow moment of the machine hits them all
# alike. Speed-ups are ratios against train.c measured in the same run.
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

# name | ranks | command (the configuration's flags are appended); $1: which configuration
runs() {
    if [ "$1" = deep ]; then # two hidden layers: the units split evenly into 2 pipeline stages
        cat <<EOF
train.c|1|./train
data parallel|2|$MPIRUN -n 2 ./train_dp
tensor parallel|2|$MPIRUN -n 2 ./train_tp
pipeline 1f1b, 8 microbatches|2|$MPIRUN -n 2 ./train_pp --schedule 1f1b --microbatches 8
pipeline gpipe, 8 microbatches|2|$MPIRUN -n 2 ./train_pp --schedule gpipe --microbatches 8
pipeline 1f1b, 2 microbatches|2|$MPIRUN -n 2 ./train_pp --schedule 1f1b --microbatches 2
EOF
        torch_runs
        return
    fi
    cat <<EOF
train.c|1|./train
train.c built plain: cc train.c -o train -lm|1|bench/train_plain
train.c, OpenMP 2 threads|1|env OMP_NUM_THREADS=2 bench/train_omp
data parallel|2|$MPIRUN -n 2 ./train_dp
data parallel --overlap|2|$MPIRUN -n 2 ./train_dp --overlap
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

bench_config() {
    local title=$1 flags=$2 steps=$3 warmup=$4 emb hidden batch
    emb=$(echo "$flags" | sed -n 's/.*--emb \([0-9]*\).*/\1/p')
    hidden=$(echo "$flags" | sed -n 's/.*--hidden \([0-9]*\).*/\1/p')
    batch=$(echo "$flags" | sed -n 's/.*--batch \([0-9]*\).*/\1/p')
    # floating-point operations of a step: 2 per multiply-add, 3 products per linear layer
    # (forward, weight gradient, input gradient): 6 x (weights of the linear layers) x rows
    # (context 16 and a vocabulary of 27, as for names.txt)
    local layers
    layers=$(echo "$flags" | sed -n 's/.*--layers \([0-9]*\).*/\1/p')
    layers=${layers:-1}
    local flops=$((6 * batch * (16 * emb * hidden + (layers - 1) * hidden * hidden + hidden * 27)))
    local n
    n=$(runs "$title" | wc -l)
    for rep in $(seq 1 "$REPS"); do
        local i=0
        while IFS='|' read -r name ranks cmd; do
            i=$((i + 1))
            printf '\r  %s: repetition %d of %d, run %d of %d   ' "$title" "$rep" "$REPS" "$i" "$n" >&2
            one_run "$cmd" "$flags" "$steps" "$warmup" >>"$TMP/$title.$i" </dev/null # mpirun reads stdin
        done < <(runs "$title")
    done
    printf '\r%*s\r' 70 '' >&2
    local base
    base=$(median <"$TMP/$title.1")
    echo
    echo "$title configuration ($flags; $(awk -v f=$flops 'BEGIN { printf "%.2f", f / 1e6 }') MFLOP per step), median of $REPS repetitions:"
    echo
    echo "| run | ranks | ms/step | tokens/s | GFLOP/s | speed-up vs train.c |"
    echo "| --- | --- | --- | --- | --- | --- |"
    i=0
    while IFS='|' read -r name ranks cmd; do
        i=$((i + 1))
        local ms
        ms=$(median <"$TMP/$title.$i")
        awk -v name="$name" -v r="$ranks" -v ms="$ms" -v b="$batch" -v f="$flops" -v base="$base" 'BEGIN {
            printf "| %s | %s | %.4f | %.0f | %.1f | %.2fx |\n", name, r, ms, b / (ms / 1e3), f / (ms / 1e3) / 1e9, base / ms }'
    done < <(runs "$title")
}

echo "bench/run.sh on $(nproc --all) cores of $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%Y-%m-%d)"
bench_config default "--emb 16 --hidden 64 --batch 32" 2000 200
bench_config large "--emb 64 --hidden 1024 --batch 256" 30 5
bench_config deep "--emb 64 --hidden 1024 --batch 256 --layers 2" 20 5
echo
echo "the products of linear 1 in the large configuration, one at a time (bench/bench kernels, median of 20):"
echo
bench/bench kernels --emb 64 --hidden 1024 --batch 256 --steps 20
