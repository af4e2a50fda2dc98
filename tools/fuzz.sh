#!/usr/bin/env bash
# tools/fuzz.sh: `make fuzz`. The readers of outside input (tests/fuzz.c: the data loader,
# the checkpoint reader, the flag parser), the tools' parsers (tools/compare's logs and
# checkpoints, tools/costmodel's cluster files, tools/schedules' command line and traces),
# and the recognisers of what is at an output's path (a checkpoint, log, summary or trace
# of this project, whole: ckpt_whole, log_summary)
# under libFuzzer with AddressSanitizer and UBSan, each for RUNS inputs (default 1 million)
# or at most FUZZ_SECONDS seconds each (default 900).
# Prints executions, time and findings per target; an input that crashes is copied to
# tests/fuzz/<target>/, where make test replays it from then on, and the run fails.
#
#   make fuzz                      # about 2 minutes on 2 cores
#   RUNS=10000000 make fuzz        # longer
#   TARGETS=cluster make fuzz      # some of the targets
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-1000000}
SECONDS_MAX=${FUZZ_SECONDS:-900} # (not SECONDS: bash's own counter)
tools/need.sh clang clang || exit 1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# seed inputs: real files the fuzzer mutates from (libFuzzer also keeps what it finds)
mkdir -p "$dir/data" "$dir/ckpt" "$dir/cli" "$dir/cluster"
head -40 names.txt >"$dir/data/names"
printf 'emma\r\nolivia\r\n\r\nava\r\nmia\r\nzoe\r\nli\r\nbo\r\nal\r\ncy\r\ned\r\n' >"$dir/data/crlf"
printf '\xef\xbb\xbfemma\nolivia\nava\nmia\nzoe\nli\nbo\nal\ncy\ned\n' >"$dir/data/bom"
cp tests/fuzz/data/* "$dir/data/" 2>/dev/null
# the checkpoint target's data file (the text tests/fuzz.c holds) and model, trained a few steps
printf '%b' "$(sed -n 's/^ *static const char text\[\] = "\(.*\)";$/\1/p' tests/fuzz.c)" >"$dir/ten.txt"
[ "$(wc -l <"$dir/ten.txt")" = 10 ] || { echo "cannot find the checkpoint target's data in tests/fuzz.c"; exit 1; }
for opt in sgd adamw; do
    ./train --data "$dir/ten.txt" --context 3 --emb 2 --hidden 4 --layers 2 --batch 8 --steps 5 --samples 0 \
        --quiet --optimizer $opt --save "$dir/ckpt/$opt" >/dev/null || { echo "cannot make the seed checkpoints"; exit 1; }
done
cp tests/fuzz/ckpt/* "$dir/ckpt/" 2>/dev/null
printf -- '--steps\0100\0--lr\0000.5\0--optimizer\0adamw\0--clip\0001.0' >"$dir/cli/a"
printf -- '--batch\08\0--hidden\0128\0--save\0/tmp/x\0--save-every\0010\0--keep\03' >"$dir/cli/b"
printf -- '--seed\018446744073709551615\0--timeout\00\0--quiet\0--allow-changes' >"$dir/cli/c"
cp tests/fuzz/cli/* "$dir/cli/" 2>/dev/null
cp cluster/*.txt "$dir/cluster/" # tools/costmodel's cluster files
cp tests/fuzz/cluster/* "$dir/cluster/" 2>/dev/null
# tools/schedules: a command line (first byte even) or a trace for --svg (first byte odd)
mkdir -p "$dir/schedules"
printf '\0zbv\0%s\0%s\0%s\0--f\0%s\0--latency\0%s' 4 2 8 1.5 0.1 >"$dir/schedules/a"
printf '\0interleaved\0%s\0%s\0%s\0--i\0%s\0--w\0%s' 2 3 6 2 0.5 >"$dir/schedules/b"
{ printf '\1'; for i in 0 1 2 3; do
    printf '{"name": "F%d chunk %d", "cat": "pipeline", "ph": "X", "pid": %d, "tid": 0, "ts": %d.5, "dur": 2.25}\n' $i $i $i $((10 * i))
done; } >"$dir/schedules/trace"
cp tests/fuzz/schedules/* "$dir/schedules/" 2>/dev/null

# tools/compare: logs (whole, cut short, of a mixture of experts) and checkpoints of both formats
mkdir -p "$dir/compare"
printf 'Jos\xc3\xa9\nZo\xc3\xab\n\xce\x95\xce\xbb\xce\xad\xce\xbd\xce\xb7\n\xe6\x9d\x8e\n\xd9\x85\xd8\xad\n' >"$dir/data/utf8"
./train --data "$dir/ten.txt" --context 3 --emb 2 --hidden 4 --batch 8 --steps 12 --eval-every 5 --samples 0 --quiet \
    --log "$dir/compare/log" --experts 2 >/dev/null || { echo "cannot make the seed logs"; exit 1; }
head -c -5 "$dir/compare/log" >"$dir/compare/cut"
cp "$dir/ckpt/adamw" "$dir/compare/ckpt"
cp tests/old/format3_adamw.ckpt "$dir/compare/ckpt3"
cp tests/old/format3_experts.ckpt "$dir/ckpt/format3"
cp tests/fuzz/compare/* "$dir/compare/" 2>/dev/null
# the recognisers of the files at outputs' paths: checkpoints (of each format, a GPT's too),
# and a log, a summary and a trace (first byte 0, 1, 2), whole and cut short
mkdir -p "$dir/ckpt_whole" "$dir/log_summary"
cp "$dir"/ckpt/* "$dir/ckpt_whole/"
./train --data "$dir/ten.txt" --model gpt --emb 4 --heads 2 --layers 1 --batch 4 --steps 3 --samples 2 --quiet \
    --save "$dir/ckpt_whole/gpt" --log "$dir/ten.csv" --summary "$dir/ten.sum" --trace "$dir/ten.json" >/dev/null ||
    { echo "cannot make the seed outputs"; exit 1; }
{ printf '\0'; cat "$dir/compare/log"; } >"$dir/log_summary/log"
{ printf '\0'; cat "$dir/ten.csv"; } >"$dir/log_summary/log_gpt"
{ printf '\0'; head -c -3 "$dir/ten.csv"; } >"$dir/log_summary/log_cut"
{ printf '\1'; cat "$dir/ten.sum"; } >"$dir/log_summary/summary"
{ printf '\2'; cat "$dir/ten.json"; } >"$dir/log_summary/trace"
cp tests/fuzz/ckpt_whole/* "$dir/ckpt_whole/" 2>/dev/null
cp tests/fuzz/log_summary/* "$dir/log_summary/" 2>/dev/null

failed=0
printf '%-11s %12s %8s %10s  %s\n' target executions seconds per-second findings
for t in ${TARGETS:-data ckpt cli compare cluster schedules ckpt_whole log_summary}; do
    clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -DTARGET_$t \
        tests/fuzz.c -o "$dir/fuzz_$t" -lm || exit 1
    mkdir -p "$dir/found_$t"
    # the flag parser looks for output folders: run where it can find nothing of ours
    (cd "$dir/found_$t" && "$dir/fuzz_$t" -runs="$RUNS" -max_total_time="$SECONDS_MAX" -timeout=10 \
        -rss_limit_mb=2048 -artifact_prefix="$dir/found_$t/" -print_final_stats=1 "$dir/$t" >"$dir/$t.log" 2>&1)
    status=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/$t.log")
    secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$dir/$t.log")
    found=$(ls "$dir/found_$t" | grep -E '^(crash|leak|timeout|oom|slow-unit)-' || true)
    if [ $status != 0 ] || [ -n "$found" ]; then
        failed=1
        mkdir -p tests/fuzz/$t
        for f in $found; do cp "$dir/found_$t/$f" tests/fuzz/$t/; done
        printf '%-11s %12s %8s %10s  %s\n' $t "${runs:-?}" "${secs:-?}" - "FOUND (exit $status): ${found:-see log}"
        grep -m3 -E 'ERROR|runtime error|SUMMARY' "$dir/$t.log"
    else
        printf '%-11s %12s %8s %10s  none\n' $t "$runs" "$secs" $((runs / (secs > 0 ? secs : 1)))
    fi
done
if [ $failed = 1 ]; then
    echo "make fuzz: findings copied to tests/fuzz/; fix them, and make test replays them from now on"
    exit 1
fi
echo "make fuzz: no findings"
