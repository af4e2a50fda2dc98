#!/usr/bin/env bash
# tools/cluster_run.sh: `make cluster`. The comparison of `make run`, with the ranks spread
# over emulated hosts (tools/cluster.sh), at each link speed; every row checked against
# train.c. Then one table: each program's step time in shared memory and at each link
# speed, measured beside what tools/costmodel.c predicts from this machine's compute rate,
# each link's alpha and beta (tools/pingpong across the hosts, with 2 ranks and with 8: the
# grids' rows use the latter) and the program's bytes and messages per step.
#
#   make cluster                               # 2 hosts; links 1gbit and 100mbit; QUICK=1: fewer steps
#   make cluster HOSTS=4 LINK="10gbit 1gbit"   # LINK: rates for tc, or "none" (unshaped)
#
# Writes out/cluster/: the runs of each link under out/cluster/LINK/, the final table in
# out/cluster/table.md. Needs root (network namespaces) and OpenMPI; says so otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
HOSTS=${HOSTS:-2}
LINKS=${LINK:-1gbit 100mbit}
OUT=out/cluster
mkdir -p "$OUT"
tools/cluster.sh --hosts "$HOSTS" -- -n 1 true || exit 2 # refuses clearly (not root, no namespaces, not OpenMPI)

echo "== this machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
# The compute tables (train.c's step by rows) are measured again before each setting's runs,
# as the links are: on a machine shared with other jobs the cores' load drifts over the hour
# make cluster takes, and a table measured an hour before its runs predicts them badly.
# The GPT's rows (a run named gpt*, of train.c --model gpt's family) are predicted from the
# GPT's own step by rows, measured the same way: tools/costmodel compute --model gpt times
# train.c's GPT (forward, backward and AdamW at 1, 2, 4, ... 64 names), so a GPT run's compute
# is the GPT's, never the MLP's table scaled.
measure_compute() { # SETTING: this machine's compute now, the MLP's and the GPT's tables
    echo "== compute before $1: train.c's model, one step, by rows (tools/costmodel compute; load average $(cut -d' ' -f1 /proc/loadavg))"
    tools/costmodel compute | tee "$OUT/compute.$1.txt"
    tools/costmodel compute --model gpt >"$OUT/compute_gpt.$1.txt"
}
compute_of() { # RUN SETTING: the compute table its prediction uses
    case $1 in
        gpt*) echo "$OUT/compute_gpt.$2.txt" ;;
        *) echo "$OUT/compute.$2.txt" ;;
    esac
}

measure_link() { # NAME RANKS LAUNCHER...: alpha and beta of the link between the first and the last of RANKS ranks,
    # by tools/pingpong: with 8 ranks the other 6 wait in MPI_Barrier (polling) meanwhile, as
    # the grids' ranks that are not sending do, so the latency measured is the one an 8-rank
    # run sees on this machine's cores (NAME.link for 2 ranks, NAME.8.link for 8)
    local name=$1 ranks=$2 file
    shift 2
    file="$OUT/$name.link"
    [ "$ranks" = 2 ] || file="$OUT/$name.$ranks.link"
    "$@" -n "$ranks" tools/pingpong >"$file" 2>&1 || { cat "$file"; exit 1; }
    echo "== link $name, $ranks ranks: $(cat "$file") (alpha in seconds, beta in bytes/s)"
}
link_of() { # SETTING RANKS: the file of the link's alpha and beta measured with that many ranks (else 2)
    if [ -f "$OUT/$1.$2.link" ]; then echo "$OUT/$1.$2.link"; else echo "$OUT/$1.link"; fi
}
status=0
columns="shm"
measure_compute shm
measure_link shm 2 tools/mpirun
measure_link shm 8 tools/mpirun
echo "== shared memory: every program on this machine's cores"
OUT="$OUT/shm" SCHEDULES=0 CLUSTER=1 QUICK=${QUICK:-0} bash tools/run_all.sh >"$OUT/shm.log" 2>&1 || status=1
cat "$OUT/shm/table.md" 2>/dev/null || tail -5 "$OUT/shm.log"
for link in $LINKS; do
    launcher="tools/cluster.sh --hosts $HOSTS --link $link --"
    measure_compute "$link"
    measure_link "$link" 2 $launcher
    measure_link "$link" 8 $launcher
    echo "== $HOSTS hosts, links of $link: every program, ranks spread over the hosts"
    MPIRUN="$launcher" OUT="$OUT/$link" SCHEDULES=0 CLUSTER=1 QUICK=${QUICK:-0} bash tools/run_all.sh >"$OUT/$link.log" 2>&1 || status=1
    cat "$OUT/$link/table.md" 2>/dev/null || tail -20 "$OUT/$link.log"
    columns="$columns $link"
done

# the second table: step time, measured and predicted, in every setting
{
    echo
    echo "step time in ms, measured / predicted by tools/costmodel.c ($HOSTS emulated hosts; shm: every rank on this machine, shared memory)"
    echo
    printf '| program |'
    for c in $columns; do printf ' %s |' "$c"; done
    echo
    printf '| --- |'
    for c in $columns; do printf ' --- |'; done
    echo
    for run in train dp fsdp tp pp 3d gpt gpt_tp_nosp gpt_tp gpt_cp gpt_4d; do
        case $run in
            gpt) what=" --model gpt" ;;
            gpt_tp) what=" --model gpt --sp" ;;
            gpt_*) what=" --model gpt" ;;
            *) what="" ;;
        esac
        printf '| %s |' "$(sed -n 's/^program=//p' "$OUT/shm/runs/$run.sum" 2>/dev/null)$what ($(sed -n 's/^ranks=//p' "$OUT/shm/runs/$run.sum" 2>/dev/null) ranks)"
        for c in $columns; do
            sum="$OUT/$c/runs/$run.sum"
            if [ ! -f "$sum" ]; then printf ' - |'; continue; fi
            measured=$(awk -F= '/^seconds=/ { s = $2 } /^steps=/ { n = $2 } END { printf "%.3f", 1000 * s / n }' "$sum")
            ranks=$(sed -n 's/^ranks=//p' "$sum")
            read -r alpha beta < <(sed 's/alpha=//; s/beta=//' "$(link_of "$c" "$ranks")")
            read -r salpha sbeta < <(sed 's/alpha=//; s/beta=//' "$(link_of shm "$ranks")")
            hosts=$HOSTS
            [ "$c" = shm ] && hosts=1
            # a link whose alpha and beta tools/pingpong could not measure: the cell says so
            if ! out=$(tools/costmodel replay "$sum" "$alpha" "$beta" "$(compute_of $run $c)" "$salpha" "$sbeta" "$hosts" 2>&1); then
                printf ' %s / - (%s) |' "$measured" "$(printf '%s' "$out" | sed 's/^error: //' | head -c 120)"
                continue
            fi
            predicted=$(printf '%s' "$out" | sed 's/predicted_ms=\([0-9.]*\).*/\1/')
            ratio=$(awk -v m="$measured" -v p="$predicted" 'BEGIN { printf "%+.0f%%", 100 * (p - m) / m }')
            printf ' %s / %s (%s) |' "$measured" "$predicted" "$ratio"
        done
        echo
    done
} | tee "$OUT/table.md"
if grep -h 'compared with train.c' "$OUT"/*.log | grep -v identical; then
    echo "make cluster: a run differs from train.c (above)"
    status=1
fi
exit $status
