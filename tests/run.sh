#!/usr/bin/env bash
# tests/run.sh: every test of the project. `make test` builds everything and runs this;
# the last line is "N passed, N failed" and the exit status is 1 if anything failed.
#
#   bash tests/run.sh             # every section
#   bash tests/run.sh cli data    # only these sections (names below, in run_section calls)
#   bash tests/run.sh units cli quick  # the quick tier, make test QUICK=1 (quick runs only when named)
#
# Each check prints PASSED or FAILED and its name. Every command runs under a time limit,
# so a deadlock fails its test instead of hanging the run.
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PASSED=0
FAILED=0
LIMIT=${TEST_TIME_LIMIT:-300} # seconds per command

SKIPPED=0
pass() { PASSED=$((PASSED + 1)); echo "PASSED $*"; }
fail() {
    FAILED=$((FAILED + 1))
    echo "FAILED $*"
    if [ -n "${STOP_AT_FAILURE:-}" ]; then # make zoo: the first test that catches a bug is enough
        echo "$PASSED passed, $FAILED failed (stopped at the first failure)"
        exit 1
    fi
}
skip() { SKIPPED=$((SKIPPED + 1)); echo "SKIPPED $*"; }
# check NAME COMMAND...: passes when the command succeeds (its output is not shown)
check() {
    local name=$1
    shift
    if "$@" >/dev/null 2>&1; then pass "$name"; else fail "$name"; fi
}
# run OUT COMMAND...: runs a command under the time limit, stdout+stderr to OUT; returns its status
run() {
    local out=$1
    shift
    timeout "$LIMIT" "$@" >"$out" 2>&1
}
# expect_error STATUS PATTERN NAME -- COMMAND...: the command exits with STATUS and prints a
# line matching PATTERN (an extended regular expression)
expect_error() {
    local status=$1 pattern=$2 name=$3
    shift 4
    run "$TMP/err" "$@"
    local got=$?
    if [ "$got" = "$status" ] && grep -Eq -- "$pattern" "$TMP/err"; then
        pass "$name"
    else
        fail "$name (exit $got, expected $status; output: $(head -c 300 "$TMP/err" | tr '\n' '|'))"
    fi
}
MPIRUN=tools/mpirun
# reference TAG FLAGS...: train.c's log, checkpoint and output for these flags
reference() {
    local tag=$1
    shift
    fresh "$TMP/$tag.ckpt" # a tag may be used again, for another run
    run "$TMP/$tag.out" ./train "$@" --quiet --log "$TMP/$tag.csv" --save "$TMP/$tag.ckpt"
}
# same_as TAG NAME COMMAND...: the command (a program with the flags of reference TAG) logs
# the same loss at every step, saves the same parameters and optimizer state, and prints
# the same validation loss and names as train.c, bit for bit
same_as() {
    local tag=$1 name=$2
    shift 2
    rm -f "$TMP/x.csv" # a run refuses to replace another run's log or checkpoint
    fresh "$TMP/x.ckpt"
    run "$TMP/x.out" "$@" --quiet --log "$TMP/x.csv" --save "$TMP/x.ckpt"
    local status=$?
    if [ $status != 0 ]; then
        fail "$name (exit $status: $(grep -m2 -E '^error|internal' "$TMP/x.out" | tr '\n' '|')$(tail -c 200 "$TMP/x.out" | tr '\n' '|'))"
    elif ! tools/compare "$TMP/$tag.csv" "$TMP/x.csv" "$TMP/$tag.ckpt" "$TMP/x.ckpt" >"$TMP/cmp"; then
        fail "$name ($(cat "$TMP/cmp"))"
    elif ! cmp -s "$TMP/$tag.out" "$TMP/x.out"; then
        fail "$name (output differs: $(diff "$TMP/$tag.out" "$TMP/x.out" | head -4 | tr '\n' '|'))"
    else
        pass "$name"
    fi
}
# fresh FILE...: removes checkpoints (and their rotation's FILE.1) that a test is about to write
# for another run: a save refuses to replace another run's checkpoint
fresh() {
    local f
    for f in "$@"; do rm -f "$f" "$f.1"; done
}
# the validation loss a run printed
val_loss() { sed -n 's/^validation loss \([0-9.]*\).*/\1/p' "$1"; }
# results (validation loss and names) without the timing lines
results() { grep -v -E '^(training time|step |configuration|  )' "$1"; }

# ----------------------------------------------------------------------------
# relay NAME PREFIX COMMAND...: a C test program's own PASSED and FAILED lines, counted here
# (PREFIX before each name), and a failure if it did not end with "N passed, 0 failed"
relay() {
    local name=$1 prefix=$2 word rest
    shift 2
    "$@" >"$TMP/relay" 2>&1
    while read -r word rest; do
        case $word in
            PASSED) pass "$prefix$rest" ;;
            FAILED) fail "$prefix$rest" ;;
            SKIPPED) skip "$prefix$rest" ;;
        esac
    done <"$TMP/relay"
    grep -Eq ' passed, 0 failed(, [0-9]+ skipped)?$' "$TMP/relay" || fail "$name did not finish: $(tail -n 3 "$TMP/relay" | tr '\n' '|')"
}

# tools/costmodel's inputs: a cluster file with one line changed (sed EXPRESSION) is refused
# naming that line and key; bad flags exit 2 naming the flag; then the published runs
costmodel_inputs() {
    local good=cluster/h100-16k.txt bad="$TMP/cluster.txt"
    local shape="--layers 4 --width 256 --heads 8 --vocab 1000 --seq 256 --tokens 65536"
    local C="tools/costmodel rank" C_PREDICT="tools/costmodel predict cluster/h100-16k.txt"
    line() { grep -n "^$1 " "$good" | cut -d: -f1; } # the line of a key in the good file
    cluster_bad() { # PATTERN NAME SED-EXPRESSION
        sed "$3" "$good" >"$bad"
        expect_error 1 "$1" "costmodel: $2" -- $C "$bad" $shape
    }
    cluster_bad "cluster.txt:$(line efficiency): efficiency must be a decimal number from 0.001 and at most 1, got 'nan'" \
        "a cluster file's 'efficiency nan' is refused, naming the line" 's/^efficiency .*/efficiency nan/'
    cluster_bad "attention_efficiency must be a decimal number from 0.001 and at most 1, got '1e-30'" \
        "a cluster file's absurd 'attention_efficiency 1e-30' is refused (it gave step_s=3.75e22; audit 5: G37)" 's/^attention_efficiency .*/attention_efficiency 1e-30/'
    expect_error 2 "BETA \(bytes/s\) must be a decimal number from 1000" "costmodel: replay refuses an absurd BETA of 1e-300 bytes/s (audit 5: F142)" \
        -- tools/costmodel replay /dev/null 1e-5 1e-300
    cluster_bad "cluster.txt:$(line nodes): nodes must be an integer from 1 and at most 1e\+06, got '0'" \
        "a cluster file's 'nodes 0' is refused, naming the line" 's/^nodes .*/nodes 0/'
    cluster_bad "cluster.txt:$(line flops): flops must be a decimal number above 0 .*, got '-5'" \
        "a cluster file's 'flops -5' is refused, naming the line" 's/^flops .*/flops -5/'
    cluster_bad "cluster.txt:$(line memory_gb): memory_gb must be a decimal number .*, got '80GB'" \
        "a cluster file's unreadable number is refused, naming the line" 's/^memory_gb .*/memory_gb 80GB/'
    cluster_bad "cluster.txt:$(line flops): flops must be a decimal number .*, got 'inf'" \
        "a cluster file's 'flops inf' is refused" 's/^flops .*/flops inf/'
    cluster_bad "cluster.txt:$(line intra_gbytes_per_s): nodes is given twice \(first on line $(line nodes)\)" \
        "a key given twice in a cluster file is refused, naming both lines" 's/^intra_gbytes_per_s .*/nodes 4/'
    cluster_bad "cluster.txt:$(line flops): unknown key 'flop' \(the keys: name nodes" \
        "an unknown key in a cluster file is refused, listing the keys" 's/^flops /flop /'
    cluster_bad "cluster.txt: missing key\(s\): memory_gb$" "a missing key is named" '/^memory_gb/d'
    cluster_bad "cluster.txt:$(line flops): flops takes one value, got '989e12 1'" \
        "a line with two values is refused" 's/^flops .*/flops 989e12 1/'
    cluster_bad "fp8_flops and fp8_efficiency go together" "FP8's peak without its efficiency is refused" '/^fp8_efficiency/d'
    mkfifo "$TMP/fifo"
    expect_error 1 "cluster file '.*fifo' is not a regular file" "costmodel: a named pipe as the cluster file is refused, not waited on" \
        -- $C "$TMP/fifo" $shape
    # flags: each number whole and in range, each flag once and with its value, and only
    # layouts that rank considers
    expect_error 2 "--width must be an integer from 1 .*, got '256abc'" "costmodel: --width 256abc is refused" \
        -- $C $good ${shape/256 /256abc }
    expect_error 2 "--pp needs a value" "costmodel: a flag without its value is refused" -- $C $good $shape --tp 8 --pp
    expect_error 2 "--layers is given twice" "costmodel: a flag given twice is refused" -- $C $good $shape --layers 3
    expect_error 2 "unknown flag '--hidden'" "costmodel: an unknown flag is refused" -- $C $good $shape --hidden 64
    expect_error 2 "--dp-overlap must be a decimal number from 0 and at most 1, got 'nan'" "costmodel: --dp-overlap nan is refused" \
        -- $C $good $shape --dp-overlap nan
    expect_error 2 "TP 3: the model takes TP up to 128 dividing the 8 heads .*\(not among the layouts rank considers\)" \
        "costmodel: a layout rank does not consider (--tp 3 of 8 heads) is refused, not dropped" -- $C $good $shape --tp 3 --pp 16
    expect_error 2 "TP 8 x CP 1 x PP 4 does not divide the 24 devices" "costmodel: predict refuses a layout that does not cover the devices" \
        -- tools/costmodel predict $good $shape --tp 8 --pp 4 --devices 24
    expect_error 2 "--cp-exchange applies to a layout with CP: give --cp above 1" \
        "costmodel: predict refuses --cp-exchange without CP, as the programs refuse --cp-comm without --cp (audit 5: F129)" \
        -- tools/costmodel predict $good $shape --tp 8 --pp 4 --devices 32 --cp-exchange ring
    expect_error 2 "compute times train.c's step .*--save does not apply" \
        "costmodel: compute refuses an output flag it would never write (audit 5: F98)" -- tools/costmodel compute --save "$TMP/c.ckpt" --steps 5
    expect_error 2 "--summary does not apply" "costmodel: ... also given as --summary=FILE" -- tools/costmodel compute --summary="$TMP/c.sum"
    expect_error 2 "--tokens 1000 is not a whole number of sequences of --seq 256" "costmodel: a step of part of a sequence is refused" \
        -- $C $good ${shape/65536/1000}
    expect_error 2 "the model needs --heads" "costmodel: a shape without its heads is refused" -- $C $good ${shape/--heads 8/}
    sed '/^sms /d' "$good" >"$bad"
    expect_error 2 "--comm-sms: the cluster file gives no sms" "costmodel: --comm-sms on a cluster without its SMs is refused" \
        -- $C "$bad" $shape --comm-sms 20
    expect_error 2 "--comm-sms 132: a device has 132 SMs" "costmodel: --comm-sms as many as a device's SMs is refused" \
        -- $C $good $shape --comm-sms 132
    expect_error 2 "--fp8: the cluster file gives no fp8_flops" "costmodel: --fp8 on a cluster without FP8 figures is refused" \
        -- $C cluster/nvlink-node.txt $shape --fp8
    # make cluster's predictions (replay): a run's summary, the links' alpha and beta as numbers,
    # the compute table line by line
    run "$TMP/cm.out" ./train --steps 2 --samples 0 --quiet --summary "$TMP/cm.sum"
    local mlp_model
    mlp_model=$(grep '^model=' "$TMP/cm.sum")
    printf '%s\nonce_ms=0\nrows=1 ms=0.01\nrows=64 ms=0.5\n' "$mlp_model" >"$TMP/cm.compute"
    expect_error 2 "BETA \(bytes/s\) must be a decimal number from 1000 .*, got '1e8x'" "costmodel: an unreadable link speed is refused" \
        -- tools/costmodel replay "$TMP/cm.sum" 1e-5 1e8x "$TMP/cm.compute"
    expect_error 2 "ALPHA \(seconds\) must be a decimal number from 0 .*, got 'nan'" "costmodel: a link latency of nan is refused" \
        -- tools/costmodel replay "$TMP/cm.sum" nan 1e8 "$TMP/cm.compute"
    expect_error 2 "BETA \(bytes/s\) must be a decimal number from 1000 and at most 1e\+14, got '1.0486e\+15'" \
        "costmodel: a link speed tools/pingpong could not measure (2^20 B / 1 ns) is refused" \
        -- tools/costmodel replay "$TMP/cm.sum" 3.998e-03 1.0486e+15 "$TMP/cm.compute"
    printf '%s\nonce_ms=0\nrows=1 ms=0.01\nrows=64 ms=abc\n' "$mlp_model" >"$TMP/cm.compute"
    expect_error 1 "cm.compute:4: ms must be a decimal number" "costmodel: a compute table's bad line is refused, not the rest ignored" \
        -- tools/costmodel replay "$TMP/cm.sum" 1e-5 1e8 "$TMP/cm.compute"
    printf '%s\nonce_ms=0\nrows=1 ms=0.01\nrows=64 ms=0.5\n' "$mlp_model" >"$TMP/cm.compute"
    check "costmodel: replay of train.c's summary predicts its compute from the table (32 rows: 0.01 + 31/63 x 0.49 ms)" \
        bash -c "tools/costmodel replay '$TMP/cm.sum' 1e-5 1e8 '$TMP/cm.compute' | grep -q '^predicted_ms=0.2511 '"
    # a summary records its model, and replay predicts it only from a table of that model's step
    # (a GPT's run from the MLP's table was a 31 ms step predicted at 0.10 ms, without a word)
    check "costmodel: a --summary records the model it trained (model=mlp ...)" grep -q '^model=mlp vocab=' "$TMP/cm.sum"
    check "costmodel: tools/costmodel compute's table names its model first (model=gpt ...)" \
        bash -c "tools/costmodel compute --model gpt --layers 1 --emb 8 --heads 1 | head -1 | grep -q '^model=gpt '"
    printf 'model=gpt vocab=27 context=16 emb=64 hidden=-1 layers=4 heads=4 experts=0 top_k=-1\nonce_ms=0\nrows=1 ms=0.01\nrows=64 ms=0.5\n' >"$TMP/cm.gpt"
    expect_error 1 "trained mlp .*, but the compute table timed gpt" "costmodel: replay refuses to predict an MLP's run from a GPT's compute table" \
        -- tools/costmodel replay "$TMP/cm.sum" 1e-5 1e8 "$TMP/cm.gpt"
    # a GPT's summary without a table is refused at once, saying so (it timed the MLP for 3.5 s,
    # then blamed a table the user never gave); HOSTS 1 is one host, shared memory's link;
    # more hosts than ranks is refused (audit 5: F140, F87, F110)
    sed 's/^model=mlp .*/model=gpt vocab=27 context=16 emb=64 hidden=-1 layers=4 heads=4 experts=0 top_k=-1/' "$TMP/cm.sum" >"$TMP/cm.gpt.sum"
    expect_error 1 "trained gpt .*: replay times train.c's default MLP unless it is given a compute table" \
        "costmodel: replay of a GPT's summary without a compute table says a table is needed" -- tools/costmodel replay "$TMP/cm.gpt.sum" 1e-5 1e8
    run "$TMP/cm.dp.out" $MPIRUN -n 2 ./train_dp --steps 2 --samples 0 --quiet --summary "$TMP/cm.dp.sum"
    check "costmodel: replay of train_dp with HOSTS 1 charges shared memory's link (1 us a message), not the hosts' (1 s)" \
        bash -c "tools/costmodel replay '$TMP/cm.dp.sum' 1 1e8 '$TMP/cm.compute' 1e-6 1e14 1 | grep -Eq '^predicted_ms=0\.[0-9]+ '"
    check "costmodel: ... and with HOSTS 2 the hosts' link (4 messages of 1 s)" \
        bash -c "tools/costmodel replay '$TMP/cm.dp.sum' 1 1e8 '$TMP/cm.compute' 1e-6 1e14 2 | grep -Eq '^predicted_ms=4[0-9]{3}\.'"
    expect_error 2 "HOSTS 3 is more hosts than the run's 2 ranks" "costmodel: replay refuses more hosts than the run's ranks" \
        -- tools/costmodel replay "$TMP/cm.dp.sum" 1e-5 1e8 "$TMP/cm.compute" 1e-6 1e9 3
    grep -v '^model=' "$TMP/cm.sum" >"$TMP/cm.old.sum"
    expect_error 1 "does not say which model it trained" "costmodel: replay refuses a summary that does not record its model" \
        -- tools/costmodel replay "$TMP/cm.old.sum" 1e-5 1e8 "$TMP/cm.compute"
    grep -v '^model=' "$TMP/cm.compute" >"$TMP/cm.old.compute"
    expect_error 1 "does not say which model it timed" "costmodel: replay refuses a compute table that does not name its model" \
        -- tools/costmodel replay "$TMP/cm.sum" 1e-5 1e8 "$TMP/cm.old.compute"
    # what runs once a step (the gradients zeroed, the optimizer), measured apart: forward and
    # backward run once a microbatch. A table without it, with it not below a step, or not
    # starting at 1 row (its line at 0 rows comes from its first points) is refused
    table_bad() { # SED-EXPRESSION PATTERN NAME: replay refuses the compute table so edited
        sed "$1" "$TMP/cm.compute" >"$TMP/cm.old.compute"
        expect_error 1 "$2" "costmodel: $3" -- tools/costmodel replay "$TMP/cm.sum" 1e-5 1e8 "$TMP/cm.old.compute"
    }
    # the tools' readers take regular files only, of bounded size: a named pipe blocked the open
    # forever, /dev/zero grew to 24 GB (audit 5: F71, F78, F80, F82, D39-D41)
    [ -p "$TMP/fifo" ] || mkfifo "$TMP/fifo"
    expect_error 1 "summary '/dev/zero' is a device, not a regular file" "costmodel: replay of /dev/zero as the summary is refused at once" \
        -- tools/costmodel replay /dev/zero 1e-5 1e8
    expect_error 1 "summary '.*fifo' is a named pipe, not a regular file" "costmodel: replay of a named pipe as the summary is refused, not waited on" \
        -- tools/costmodel replay "$TMP/fifo" 1e-5 1e8
    expect_error 1 "compute table '/dev/zero' is a device, not a regular file" "costmodel: a compute table of /dev/zero is refused at once" \
        -- tools/costmodel replay "$TMP/cm.sum" 1e-5 1e8 /dev/zero
    expect_error 1 "compute table '.*fifo' is a named pipe, not a regular file" "costmodel: a named pipe as the compute table is refused, not waited on" \
        -- tools/costmodel replay "$TMP/cm.sum" 1e-5 1e8 "$TMP/fifo"
    head -c 2000000 /dev/zero | tr '\0' '#' >"$TMP/cm.big"
    expect_error 1 "compute table '.*cm.big' is 2 MB, more than the 1 MB" "costmodel: a compute table larger than any is refused, not read" \
        -- tools/costmodel replay "$TMP/cm.sum" 1e-5 1e8 "$TMP/cm.big"
    expect_error 1 "trace '/dev/zero' is a device, not a regular file" "schedules: --svg of /dev/zero as a trace is refused at once" \
        -- tools/schedules --svg "$TMP/never.svg" 2 4 /dev/zero
    expect_error 1 "trace '.*fifo' is a named pipe, not a regular file" "schedules: --svg of a named pipe as a trace is refused, not waited on" \
        -- tools/schedules --svg "$TMP/never.svg" 2 4 "$TMP/fifo"
    expect_error 1 "trace '$TMP' is a folder, not a regular file" "schedules: --svg of a folder as a trace says it is a folder" \
        -- tools/schedules --svg "$TMP/never.svg" 2 4 "$TMP"
    table_bad '/^once_ms=/d' "does not give the part of a step that runs once" "replay refuses a compute table without its once-a-step time"
    table_bad 's/^once_ms=.*/once_ms=0.01/' "once_ms=0.01 is not less than the whole step at rows=1" \
        "a compute table's once-a-step time as long as a step is refused"
    table_bad 's/^rows=1 /rows=2 /' "starts at rows=2: a table starts at rows=1" "a compute table that does not start at 1 row is refused"
    check "costmodel: tools/costmodel compute's table gives the once-a-step part second (once_ms=)" \
        bash -c "tools/costmodel compute --model gpt --layers 1 --emb 8 --heads 1 | sed -n 2p | grep -Eq '^once_ms=[0-9.]+$'"
    # a summary's values are checked, not read as they come (batch=-3 gave predicted_ms=-90)
    sed 's/^batch=.*/batch=-3/' "$TMP/cm.sum" >"$TMP/cm.bad.sum"
    expect_error 1 "batch=-3 is not a whole number from 1" "costmodel: a summary's batch=-3 is refused" \
        -- tools/costmodel replay "$TMP/cm.bad.sum" 1e-5 1e8 "$TMP/cm.compute"
    sed 's/ sent_formula=[0-9]*/ sent_formula=-5/' "$TMP/cm.sum" >"$TMP/cm.bad.sum"
    expect_error 1 "sent_formula=-5 is not a number from 0" "costmodel: a summary's negative bytes are refused" \
        -- tools/costmodel replay "$TMP/cm.bad.sum" 1e-5 1e8 "$TMP/cm.compute"
    sed 's/^ranks=.*/ranks=abc/' "$TMP/cm.sum" >"$TMP/cm.bad.sum"
    expect_error 1 "ranks=abc is not a whole number" "costmodel: a summary's unreadable rank count is refused" \
        -- tools/costmodel replay "$TMP/cm.bad.sum" 1e-5 1e8 "$TMP/cm.compute"
    # a train_3d --ep run's expert bytes are charged on the link the expert groups live on (they
    # were dropped): 2 tensor x 2 data, experts over the 2 data ranks, on 2 hosts of 2 ranks:
    # each host's 2 expert pairs cross at once, 2 x 1 MB at 1e8 B/s and 2 messages of 10 us
    { echo "program=train_3d.c"
      echo "layout=grid of 2 tensor x 1 pipeline x 2 data = 4 ranks; ZeRO stage 1; 1 microbatch, gpipe; expert parallel over 2 of the data-parallel ranks (4 experts a block, top-1)"
      echo "$mlp_model"; echo "ranks=4"; echo "val_loss=2"; echo "seconds=1"; echo "steps=1"; echo "batch=32"
      for q in 0 1 2 3; do
          echo "rank=$q sent=1000000 sent_tp=0 sent_dp=0 sent_pp=0 sent_cp=0 sent_ep=1000000 sent_formula=1000000 received=1000000 params=1 grads=1 optim=1 acts=1 mem_formula=4 bubble=-1 messages=2"
      done; } >"$TMP/cm.ep.sum"
    check "costmodel: replay charges a train_3d --ep run's expert bytes (2 groups a host sharing the link: 20.02 ms)" \
        bash -c "tools/costmodel replay '$TMP/cm.ep.sum' 1e-5 1e8 '$TMP/cm.compute' 1e-6 1e9 2 | grep -q ' comm_ms=20.0200$'"
    # the rest of a hostile read: a byte-order mark, a verb or argument count that is wrong, a
    # device count no layout divides, 1e12 in the form its range prints, a predict without a
    # layout, zbv with one stage, and int products that overflowed under UBSan
    { printf '\xef\xbb\xbf'; cat cluster/nvlink-node.txt; } >"$TMP/bom.txt"
    check "costmodel: a cluster file saved with a UTF-8 byte-order mark is read" \
        bash -c "tools/costmodel predict '$TMP/bom.txt' $shape --devices 8 | grep -q '^step_s='"
    expect_error 2 "unknown verb 'frobnicate'" "costmodel: an unknown verb is named, not just the usage printed" -- tools/costmodel frobnicate
    expect_error 2 "replay takes .* got 1" "costmodel: replay with a wrong argument count says so" -- tools/costmodel replay "$TMP/cm.sum"
    expect_error 2 "selftest takes no arguments, got 1" "costmodel: selftest with an argument says so" -- tools/costmodel selftest x
    run "$TMP/r3" tools/costmodel rank cluster/nvlink-node.txt $shape --devices 3
    check "costmodel: rank --devices 3 ranks the layouts of 3 devices (PP 3), not an empty table" \
        bash -c "test $? = 0 && grep -q '^| 1 | 1 | 1 | 3 | 1 | 1 |' '$TMP/r3'"
    expect_error 2 "no layout of 7 devices is possible" "costmodel: rank with no possible layout says why, not an empty table" \
        -- tools/costmodel rank cluster/nvlink-node.txt $shape --devices 7
    check "costmodel: --tokens 1e12 is taken, as its range prints it (at most 1e+12)" \
        bash -c "tools/costmodel predict cluster/nvlink-node.txt ${shape/--tokens 65536/--tokens 1e12} --devices 8 | grep -q '^step_s='"
    expect_error 2 "--width must be an integer from 1 .*, got '256.5'" "costmodel: --width 256.5 is still refused" -- $C $good ${shape/256 /256.5 }
    expect_error 2 "no layout given .*: predict takes every one of the 16384 devices as data parallel" \
        "costmodel: predict without layout flags says which layout it took, not a DP the user never chose" -- tools/costmodel predict $good $shape
    expect_error 2 "--schedule and --virtual apply to a pipeline" "costmodel: predict --schedule zbv with one stage is refused, not ignored" \
        -- tools/costmodel predict $good $shape --devices 8 --schedule zbv
    # a schedule rank is given: it ranks the pipeline layouts the schedule admits and says which
    # it left out and why; none admitted (only PP 1 left, where no schedule runs) is refused, as
    # predict refuses --schedule without --pp; a marked layout is refused in the schedule's words
    local s48="--layers 4 --width 256 --heads 8 --vocab 1000 --seq 256 --tokens 12288" N=cluster/nvlink-node.txt
    expect_error 2 "^error: --schedule dualpipe: no pipeline layout of 3 devices admits it \(PP 3: dualpipe with PP 3: it takes an even PP.*give another --schedule, or none$" \
        "costmodel: rank --schedule dualpipe with no even PP possible is refused, not PP 1 ranked as if it ran dualpipe" \
        -- tools/costmodel rank $N $s48 --devices 3 --schedule dualpipe
    check "costmodel: that refusal is one line, no table" test "$(wc -l <"$TMP/err")" = 1
    expect_error 2 "^error: --schedule zbv applies to a pipeline, and no layout of 1 device has one" \
        "costmodel: rank --schedule zbv on one device (no pipeline at all) is refused, as predict's --schedule without --pp" \
        -- tools/costmodel rank $N $s48 --devices 1 --schedule zbv
    run "$TMP/r6" tools/costmodel rank $N $s48 --devices 6 --schedule dualpipe
    check "costmodel: rank --schedule dualpipe on 6 devices ranks PP 2 (and PP 1), and says it left out the 3 layouts of PP 3 and why" \
        bash -c "test $? = 0 && grep -q '^| [0-9]* | [0-9]* | [0-9]* | 2 | .* | dualpipe |' '$TMP/r6' && ! grep -q '^| [0-9]* | [0-9]* | [0-9]* | 3 |' '$TMP/r6' &&
                 grep -q '^left out by --schedule dualpipe: 3 layouts with PP 3 (the first, TP 1, CP 1, PP 3, DP 2, EP 1: dualpipe with PP 3: it takes an even PP' '$TMP/r6'"
    expect_error 2 "^error: dualpipe with PP 3: it takes an even PP.* \(not among the layouts rank considers\)$" \
        "costmodel: rank refuses a marked PP 3 under --schedule dualpipe in DualPipe's words (was: 'no setting of it is possible')" \
        -- tools/costmodel rank $N $s48 --devices 6 --pp 3 --schedule dualpipe
    run "$TMP/rv3" tools/costmodel rank $N ${s48/--layers 4/--layers 12} --devices 8 --pp 2 --schedule interleaved --virtual 3
    check "costmodel: rank --virtual 3 ranks interleaved with V 3, as predict takes it (rank tried V 2, 4 and 8 only, and left none)" \
        bash -c "test $? = 0 && grep -q '^the layout TP 1, CP 1, PP 2, DP 4, EP 1: rank [0-9]* of .* schedule=interleaved virtual=3 ' '$TMP/rv3'"
    # dualpipe's own refusals (predict): an odd PP; microbatches odd, or fewer than 2 x PP
    local s60=${s48/12288/15360} # 60 sequences: 5 microbatches divide them
    expect_error 2 "^error: dualpipe with PP 3: it takes an even PP, ranks r and PP-1-r holding the same two stages$" \
        "costmodel: predict refuses dualpipe on PP 3 (odd), saying what it takes" \
        -- tools/costmodel predict $N $s48 --devices 3 --pp 3 --schedule dualpipe
    expect_error 2 "^error: dualpipe with 5 microbatches on PP 2: it takes an even number of microbatches, at least 2 x PP \(4; " \
        "costmodel: predict refuses dualpipe with 5 microbatches on PP 2 (odd, though over 2 x PP)" \
        -- tools/costmodel predict $N $s60 --devices 2 --pp 2 --schedule dualpipe --microbatches 5
    expect_error 2 "^error: dualpipe with 6 microbatches on PP 4: it takes an even number of microbatches, at least 2 x PP \(8; " \
        "costmodel: predict refuses dualpipe with 6 microbatches on PP 4 (even, under 2 x PP)" \
        -- tools/costmodel predict $N $s48 --devices 4 --pp 4 --schedule dualpipe --microbatches 6
    # each schedule's refusal names the condition that failed, in the number's own word
    expect_error 2 "^error: interleaved with V 2 on PP 6: 1 layer a stage \(at most\), fewer than V: each chunk takes a layer$" \
        "costmodel: interleaved on 6 layers over PP 6 is refused for its 1 layer a stage (its 48 microbatches a multiple of PP)" \
        -- tools/costmodel predict $N ${s48/--layers 4/--layers 6} --devices 6 --pp 6 --schedule interleaved --virtual 2 --microbatches 48
    expect_error 2 "^error: zb1 with 1 microbatch on 2 stages: " "costmodel: zb1's refusal of 1 microbatch says 'microbatch'" \
        -- tools/costmodel predict $N $s48 --devices 2 --pp 2 --schedule zb1 --microbatches 1
    expect_error 2 "^error: zbv with PP 4: 1 layer a stage, and it takes 2 or more" "costmodel: zbv on 4 layers over PP 4 is refused for its 1 layer a stage" \
        -- tools/costmodel predict $N $s48 --devices 4 --pp 4 --schedule zbv --microbatches 8
    # rank with a fixed schedule blames the schedule only for layouts the other fixed flags
    # admit: on 2 devices the one pipeline layout has TP 1, which --sp refuses on any schedule
    expect_error 2 "^error: --schedule dualpipe applies to a pipeline, and the other flags given leave no pipeline layout of 2 devices \(PP 2: sequence parallelism splits across TP: it needs TP above 1\)$" \
        "costmodel: rank --sp --schedule dualpipe on 2 devices names --sp's refusal of TP 1, not dualpipe's" \
        -- tools/costmodel rank $N $s48 --devices 2 --sp --schedule dualpipe --microbatches 2
    run "$TMP/dual8" tools/costmodel predict $N $s48 --devices 4 --pp 4 --schedule dualpipe --microbatches 8
    check "costmodel: predict takes dualpipe with 8 microbatches on PP 4, the fewest it admits" \
        bash -c "test $? = 0 && grep -q ' schedule=dualpipe virtual=2 microbatches=8$' '$TMP/dual8'"
    # --bf16-moments (DeepSeek-V3's optimizer state): 2 + 4 + 8 bytes a parameter for 2 + 2 +
    # 12, so ZeRO-0's state is 14/16 of what it was and ZeRO-1's over DP 8 7/5.5 (FP32
    # gradients); the activations and every time but the optimizer's pass (22 bytes a
    # parameter for 28) the same, and the step shorter by that pass only, to the printed
    # digits (half a unit in the last of each of the four figures). One sequence of 512 a
    # replica: the step short, so ZeRO-1's 0.003 s shows in its digits (0.0001 s)
    local s7b="--layers 32 --width 4096 --heads 32 --vocab 32000 --seq 512 --tokens 4096" z ratio
    kv() { tr ' ' '\n' <"$1" | sed -n "s/^$2=//p"; } # a figure of predict's line
    others() { local f; for f in compute_s membound_s attention_s bubble tp_s cp_s ep_s pp_s dp_s overlap_s activations_gb; do printf '%s ' "$(kv "$1" $f)"; done; }
    for z in 0 1; do
        run "$TMP/m16" tools/costmodel predict $N $s7b --dp 8 --zero $z
        run "$TMP/m14" tools/costmodel predict $N $s7b --dp 8 --zero $z --bf16-moments
        ratio=$([ $z = 0 ] && echo "14 / 16" || echo "7 / 5.5")
        check "costmodel: --bf16-moments, ZeRO-$z over DP 8: the state ${ratio// \/ / bytes a parameter for } ($(kv "$TMP/m16" weights_gb) GB -> $(kv "$TMP/m14" weights_gb)), the memory figure by as much" \
            awk -v a="$(kv "$TMP/m16" weights_gb)" -v b="$(kv "$TMP/m14" weights_gb)" -v ma="$(kv "$TMP/m16" memory_gb)" -v mb="$(kv "$TMP/m14" memory_gb)" \
                "BEGIN { d = b - a * $ratio; e = (mb - ma) - (b - a); exit !(a > 10 && d * d < 4e-4 && e * e < 4e-4) }"
        check "costmodel: --bf16-moments, ZeRO-$z: no time but the optimizer's pass changes (22 bytes a parameter for 28), the step by that pass" \
            awk -v x="$(others "$TMP/m16")" -v y="$(others "$TMP/m14")" -v o16="$(kv "$TMP/m16" optimizer_s)" -v o14="$(kv "$TMP/m14" optimizer_s)" \
                -v s16="$(kv "$TMP/m16" step_s)" -v s14="$(kv "$TMP/m14" step_s)" \
                'function ulp(v) { return 10 ^ (int(log(v) / log(10) + 100) - 100 - 3) / 2 } # %.4g: half its last digit
                 BEGIN { d = o14 - o16 * 22 / 28; e = (s16 - s14) - (o16 - o14)
                         exit !(length(x) > 30 && x == y && o16 > 0 && s16 > s14 && d * d < (1e-3 * o16)^2 &&
                                e * e <= (ulp(s16) + ulp(s14) + ulp(o16) + ulp(o14) + 1e-12)^2) }'
    done
    # --schedule's names come from schedules.h's list (and the cost model's dualpipe), not a copy
    local names
    names=$(grep -o 'schedule_names\[N_SCHEDULES\] = {[^}]*}' schedules.h | grep -o '"[a-z0-9]*"' | tr -d '"' | paste -sd, | sed 's/,/, /g')
    expect_error 2 "^error: --schedule must be $names or dualpipe, got 'foo'$" \
        "costmodel: an unknown --schedule is refused, listing schedules.h's names and dualpipe" -- $C $good $shape --schedule foo
    if cc -g -O1 -fsanitize=undefined -fno-sanitize-recover=all -std=c11 tools/costmodel.c -o "$TMP/cm_ubsan" -lm 2>"$TMP/ubsan.err"; then
        run "$TMP/ub" "$TMP/cm_ubsan" predict cluster/nvlink-node.txt --layers 128 --width 1024 --heads 8 --vocab 1000 --seq 2 \
            --tokens 33554432 --tp 2 --dp 1 --devices 2 --microbatches 16777216
        check "costmodel: 2^24 microbatches x 128 layers overflow no int under UBSan (the step and MFU positive)" \
            bash -c "test $? = 0 && grep -q '^step_s=[0-9.]*e*[+0-9]* mfu=0\.[0-9]*[1-9]' '$TMP/ub' && ! grep -q 'runtime error' '$TMP/ub'"
    else
        skip "costmodel under UBSan: this compiler cannot build with -fsanitize=undefined ($(head -c 200 "$TMP/ubsan.err"))"
    fi
    # DeepSpeed's BF16 optimizer (BLOOM's): a pass over the gradients after each microbatch,
    # memory-bound (its size by hand: tools/costmodel selftest)
    check "costmodel: predict --grad-accum-pass charges a pass over the gradients a microbatch (memory-bound time and the step grow)" \
        bash -c "a=\$($C_PREDICT $shape --devices 8 --dp 8 --microbatches 4); b=\$($C_PREDICT $shape --devices 8 --dp 8 --microbatches 4 --grad-accum-pass);
                 awk -v a=\"\$a\" -v b=\"\$b\" 'function f(s, k) { match(s, k \"=[^ ]*\"); return substr(s, RSTART + length(k) + 1, RLENGTH - length(k) - 1) + 0 }
                     BEGIN { exit !(f(b, \"membound_s\") > f(a, \"membound_s\") && f(b, \"step_s\") > f(a, \"step_s\") && f(b, \"attention_s\") == f(a, \"attention_s\")) }'"
    # the published runs: each projection (its layout's rank and its figure) as recorded in
    # tools/costmodel.c and docs/cluster.md; a change of the model that moves one fails here
    run "$TMP/published" tools/costmodel published --check
    if [ $? = 0 ] && [ "$(grep -c '^| \(Llama\|DeepSeek\|BLOOM\|MegaScale\|OPT\)' "$TMP/published")" = 7 ]; then
        pass "costmodel: the published runs (Llama 3 405B x 3, DeepSeek-V3, BLOOM, MegaScale, OPT-175B) project as recorded: $(grep -o '[0-9]* of [0-9]* | [0-9]* of [0-9]* | [^|]* |' "$TMP/published" | tr '\n' ' ')"
    else
        fail "costmodel: the published runs drifted from their record: $(head -c 400 "$TMP/published" | tr '\n' '|')"
    fi
}

section_units() {
    relay "unit tests" "" tests/test_units
    # The kernels' AVX2 and plain x86-64 variants, which this machine runs only when told to:
    # built without -march=native (which would let every variant use AVX-512), held back by
    # KERNEL_ISA, they equal the plain loops too
    if [ "$(uname -m)" = x86_64 ]; then
        local isa
        cc -O2 -std=c11 tests/test_units.c -o "$TMP/units_plain" -lm
        for isa in avx2 any; do
            relay "unit tests, KERNEL_ISA=$isa" "KERNEL_ISA=$isa: " env KERNEL_ISA=$isa "$TMP/units_plain"
        done
        expect_error 2 "KERNEL_ISA must be avx512, avx2 or any, not 'sse9'" "KERNEL_ISA=sse9 is refused, saying what it may be" \
            -- env KERNEL_ISA=sse9 ./train --steps 1
        # in an MPI job: refused with the flags, before training, by one message
        run "$TMP/isa" env KERNEL_ISA=sse9 tools/mpirun -n 2 ./train_dp --steps 1
        local got=$?
        if [ $got = 2 ] && [ "$(grep -c "KERNEL_ISA must be" "$TMP/isa")" = 1 ] && ! grep -q '^configuration' "$TMP/isa"; then
            pass "KERNEL_ISA=sse9 stops train_dp on 2 ranks before it starts, with one message"
        else
            fail "KERNEL_ISA=sse9 with train_dp on 2 ranks (exit $got: $(head -c 300 "$TMP/isa" | tr '\n' '|'))"
        fi
    else
        skip "kernel variants: KERNEL_ISA selects among x86-64 variants; this is $(uname -m)"
    fi
    # the cost model's arithmetic (tools/costmodel.c), on cases computed by hand
    relay "costmodel selftest" "costmodel: " tools/costmodel selftest
    costmodel_inputs
    # every input make fuzz ever crashed on (tests/fuzz/<target>/), replayed under the sanitizers
    local t
    for t in data ckpt cli compare cluster schedules ckpt_whole log_summary; do
        ls tests/fuzz/$t/* >/dev/null 2>&1 || continue
        if ! cc -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -DREPLAY -DTARGET_$t \
            tests/fuzz.c -o "$TMP/replay_$t" -lm 2>"$TMP/replay.err"; then
            skip "fuzz regressions of $t: this compiler cannot build with -fsanitize ($(head -c 200 "$TMP/replay.err"))"
            continue
        fi
        if run "$TMP/replay" env ASAN_OPTIONS=detect_leaks=1 "$TMP/replay_$t" tests/fuzz/$t/* &&
            ! grep -qE 'runtime error|Sanitizer|internal:' "$TMP/replay"; then
            pass "fuzz regressions of $t: $(ls tests/fuzz/$t | wc -l) inputs that once crashed, handled"
        else
            fail "fuzz regressions of $t: $(grep -m2 -E 'ERROR|runtime error|internal' "$TMP/replay" | tr '\n' '|')"
        fi
    done
}

# ----------------------------------------------------------------------------
section_cli() {
    local p=./train
    expect_error 2 "unknown flag '--bogus'" "cli: an unknown flag exits 2 with its name" -- $p --bogus
    # a single dash is a common slip; the message named the program or the previous value (audit 5: Q55, Q65, Q70)
    expect_error 2 "unknown flag '-steps' \(flags start with --\)" "cli: a single-dash flag is named, and how flags start" -- $p -steps 5
    expect_error 2 "--allow-changes applies to --load FILE only" "cli: --allow-changes without --load is refused, as --log-overwrite without --log (audit 5: Q52)" -- $p --allow-changes --steps 5
    expect_error 2 "unknown flag '-steps' \(flags start with --\)" "cli: a single-dash flag after a value is named, not the value" -- $p --samples 3 -steps 5
    expect_error 2 "unknown flag '-st' \(flags start with --\)" "cli: a short single-dash flag is named" -- $p --steps 5 -st 5
    expect_error 2 "usage: " "cli: a bad flag prints the usage" -- $p --bogus
    expect_error 2 "--batch must be an integer from 1 to 65536, got '0'" "cli: --batch 0 is refused with its range" -- $p --batch 0
    expect_error 2 "--batch must be an integer from 1 to 65536, got '12x'" "cli: --batch 12x is refused" -- $p --batch 12x
    expect_error 2 "--lr must be a decimal number above 0" "cli: --lr -1 is refused" -- $p --lr -1
    expect_error 2 "--lr must be a decimal number above 0" "cli: --lr nan is refused" -- $p --lr nan
    expect_error 2 "--lr must be a decimal number" "cli: --lr 0x1p-3 (hexadecimal) is refused" -- $p --lr 0x1p-3
    expect_error 2 "--lr must be above 0 and is too small to act as a float" "cli: --lr 1e-50, 0 as a float, is refused" -- $p --lr 1e-50
    expect_error 2 "--clip is 0 to turn it off, else is too small" "cli: --clip 1e-50 does not silently turn clipping off" -- $p --clip 1e-50
    expect_error 2 "--optimizer must be sgd or adamw, got 'adam'" "cli: an unknown optimizer is refused" -- $p --optimizer adam
    expect_error 2 "--layers must be an integer from 1 to 32" "cli: --layers 40 is refused" -- $p --layers 40
    expect_error 2 "--seed must be an integer" "cli: a negative seed is refused" -- $p --seed -3
    expect_error 2 "missing value for '--steps'" "cli: a flag without its value is refused" -- $p --steps
    expect_error 2 "unexpected argument 'extra'" "cli: a stray argument is refused" -- $p extra
    expect_error 2 "about [0-9]+ million parameters" "cli: a model too large to allocate is refused" -- $p --hidden 16384 --emb 4096 --context 1024
    expect_error 0 "--microbatches|--eval-every N" "cli: --help prints the flags and exits 0" -- $p --help
    # messages that say what to do (issue 31: 12)
    expect_error 2 "unexpected argument '--eval-every' after '--': nothing after '--' is read as a flag" "cli: a flag after '--' is refused, saying why" -- $p -- --eval-every 0
    expect_error 2 "--top-k must be an integer from 1 to 8, got '0'" "cli: --top-k 0 is refused naming the values it may take" -- $p --experts 4 --top-k 0
    # tools/compare (issue 31: 8): exit 2, not 1 ("the runs differ"), for a file it cannot read or
    # a bad --tolerance; two runs of other seeds are never "equal"
    run "$TMP/cmp_a" $p --steps 30 --log "$TMP/cmp_a.csv" --save "$TMP/cmp_a.ckpt" --quiet --samples 0
    run "$TMP/cmp_b" $p --steps 30 --seed 7 --log "$TMP/cmp_b.csv" --save "$TMP/cmp_b.ckpt" --quiet --samples 0
    local C="$TMP/cmp_a.csv $TMP/cmp_b.csv $TMP/cmp_a.ckpt $TMP/cmp_b.ckpt" t
    expect_error 1 "differ: first at step 1" "cli: tools/compare: two runs of other seeds differ, exit 1" -- tools/compare $C
    for t in abc nan -1 inf 1e400 2; do
        expect_error 2 "--tolerance must be a decimal number from 0 and at most 1, got '$t'" "cli: tools/compare --tolerance $t is refused, exit 2" -- tools/compare --tolerance $t $C
    done
    expect_error 2 "--tolerance needs a value" "cli: tools/compare --tolerance without a value is refused" -- tools/compare --tolerance
    expect_error 2 "cannot open log '$TMP/none.csv'" "cli: tools/compare: a missing log is exit 2" -- tools/compare "$TMP/none.csv" $TMP/cmp_b.csv $TMP/cmp_a.ckpt $TMP/cmp_b.ckpt
    expect_error 2 "cannot open checkpoint '$TMP/none.ckpt'" "cli: tools/compare: a missing checkpoint is exit 2" -- tools/compare $TMP/cmp_a.csv $TMP/cmp_b.csv $TMP/cmp_a.ckpt "$TMP/none.ckpt"
    head -c -7 "$TMP/cmp_b.csv" >"$TMP/cmp_cut.csv"
    expect_error 2 "cmp_cut.csv':31: the line has no end: the log is cut short" "cli: tools/compare: a log cut in the middle of a line is exit 2" -- tools/compare $TMP/cmp_a.csv "$TMP/cmp_cut.csv" $TMP/cmp_a.ckpt $TMP/cmp_b.ckpt
    head -c 2000 "$TMP/cmp_b.ckpt" >"$TMP/cmp_cut.ckpt"
    expect_error 2 "corrupt or truncated" "cli: tools/compare: a truncated checkpoint is exit 2" -- tools/compare $TMP/cmp_a.csv $TMP/cmp_b.csv $TMP/cmp_a.ckpt "$TMP/cmp_cut.ckpt"
    { head -3 "$TMP/cmp_b.csv"; echo "4,abc,,1,1"; } >"$TMP/cmp_bad.csv"
    expect_error 2 "cmp_bad.csv':4: not a line of a --log file: '4,abc,,1,1'" "cli: tools/compare: a line that is not a log's is exit 2, naming it" -- tools/compare $TMP/cmp_a.csv "$TMP/cmp_bad.csv" $TMP/cmp_a.ckpt $TMP/cmp_b.ckpt
    # one rule for a flag given twice, in every program and tool: refused, naming it (issue 36: 14)
    expect_error 2 "--model is given twice \('gpt', then 'mlp'\): give each flag once" "cli: a flag given twice is refused, naming both values, not the last silently taken (issue 36: 14)" -- $p --model gpt --model mlp --steps 1
    expect_error 2 "--quiet is given twice: give each flag once" "cli: a switch given twice too (issue 36: 14)" -- $p --quiet --steps 1 --quiet
    expect_error 2 "--f is given twice: give each flag once" "cli: tools/schedules refuses a flag given twice (issue 36: 14)" -- tools/schedules zbv 4 2 8 --f 1 --f 2
    expect_error 2 "--tolerance is given twice" "cli: tools/compare refuses a flag given twice (issue 36: 14)" -- tools/compare --tolerance 0.1 --tolerance 0.2 $C
    expect_error 2 "--hosts is given twice" "cli: tools/cluster.sh refuses a flag given twice (issue 36: 14)" -- bash tools/cluster.sh --hosts 2 --hosts 9 -- -n 2 ./train_dp # (9: were the last taken, refused anyway, nothing made)
    expect_error 2 "--layers is given twice" "cli: tools/costmodel refuses a flag given twice (issue 36: 14)" -- tools/costmodel rank cluster/h100-16k.txt --layers 4 --width 256 --heads 8 --vocab 1000 --seq 256 --tokens 65536 --layers 3
    # tools/compare reads a checkpoint as a run does, its checksum too; a run whose losses are nan
    # at the same steps is the same run; same losses, other values, say so (issue 36: 6)
    cp "$TMP/cmp_a.ckpt" "$TMP/cmp_flip.ckpt"
    printf '\x01' | dd of="$TMP/cmp_flip.ckpt" bs=1 seek=1000 conv=notrunc 2>/dev/null
    expect_error 2 "checkpoint '$TMP/cmp_flip.ckpt' is corrupt \(checksum mismatch\)" "cli: tools/compare: a checkpoint with a flipped byte, compared with itself, is corrupt, exit 2, not identical (issue 36: 6)" \
        -- tools/compare $TMP/cmp_a.csv $TMP/cmp_a.csv "$TMP/cmp_flip.ckpt" "$TMP/cmp_flip.ckpt"
    sed 's/^5,[^,]*,/5,nan,/' "$TMP/cmp_a.csv" >"$TMP/cmp_nan.csv"
    expect_error 0 "^identical: 30 steps" "cli: tools/compare: two logs with the same nan loss are identical (issue 36: 6)" \
        -- tools/compare "$TMP/cmp_nan.csv" "$TMP/cmp_nan.csv" $TMP/cmp_a.ckpt $TMP/cmp_a.ckpt
    expect_error 1 "^differ: the losses are the same at every step \(30\); [0-9]+ of [0-9]+ values differ" "cli: tools/compare: the same losses and other values say so, not 'first at step -1' (issue 36: 6)" \
        -- tools/compare $TMP/cmp_a.csv $TMP/cmp_a.csv $TMP/cmp_a.ckpt $TMP/cmp_b.ckpt
    # tools/cluster.sh's flags (issue 31: 11), read before it needs root: one message each, exit 2
    for t in "--hosts" "--link" "--timeout" "--hosts 99999999999999999999 -- -n 2 ./train_dp" "--timeout 99999999999999999999 -- -n 2 ./train_dp"; do
        run "$TMP/cl" bash tools/cluster.sh $t
        local got=$?
        check "cli: tools/cluster.sh $t: one line, its own, exit 2 (exit $got: $(head -c 120 "$TMP/cl" | tr '\n' '|'))" \
            bash -c "test $got = 2 && test \$(wc -l <'$TMP/cl') = 1 && grep -Eq '^tools/cluster.sh: --(hosts|link|timeout) (needs a value|must be)' '$TMP/cl'"
    done
}

# ----------------------------------------------------------------------------
section_data() {
    local p=./train
    printf 'ann\nbob\r\n' >"$TMP/short.txt"
    printf '' >"$TMP/empty.txt"
    printf '\n\n\r\n\n' >"$TMP/blank.txt"
    { for i in $(seq 1 20); do echo "name$i"; done; printf 'bad\0name\n'; } >"$TMP/nul.txt"
    { for i in $(seq 1 20); do echo "name$i"; done; printf 'tab\there\n'; } >"$TMP/ctrl.txt"
    { for i in $(seq 1 20); do echo "name$i"; done; head -c 2000 /dev/zero | tr '\0' 'x'; echo; } >"$TMP/long.txt"
    { for i in $(seq 1 30); do printf 'line%d\r\n\r\n' "$i"; done; } >"$TMP/crlf.txt"
    expect_error 1 "cannot open data file '$TMP/none.txt': No such file" "data: a missing file is named" -- $p --data "$TMP/none.txt"
    expect_error 1 "data file '$TMP' is a folder, not a regular file" "data: a directory is refused" -- $p --data "$TMP"
    expect_error 1 "'$TMP/empty.txt' is empty" "data: an empty file is refused" -- $p --data "$TMP/empty.txt"
    expect_error 1 "has no usable lines" "data: a file of blank lines is refused" -- $p --data "$TMP/blank.txt"
    expect_error 1 "has 2 usable lines; the 90/10 train/validation split needs at least 10" "data: too few lines are refused" -- $p --data "$TMP/short.txt"
    expect_error 1 "nul.txt:21: NUL byte at column 4" "data: a NUL byte is reported with its line and column" -- $p --data "$TMP/nul.txt"
    expect_error 1 "ctrl.txt:21: control byte 0x09 at column 4" "data: a control byte is reported with its line and column" -- $p --data "$TMP/ctrl.txt"
    expect_error 1 "long.txt:21: line is 2000 bytes long, more than the limit of 1024 \(raise it with --max-line\)" "data: a long line names the limit and the flag" -- $p --data "$TMP/long.txt"
    expect_error 0 "validation loss" "data: --max-line raises the limit" -- $p --data "$TMP/long.txt" --max-line 4000 --steps 5 --samples 0 --quiet
    expect_error 0 "validation loss" "data: CRLF endings and blank lines are accepted" -- $p --data "$TMP/crlf.txt" --steps 5 --quiet
    { printf '\xef\xbb\xbf'; for i in $(seq 1 20); do echo "name$i"; done; } >"$TMP/bom.txt"
    run "$TMP/bom" $p --data "$TMP/bom.txt" --steps 5
    check "data: a leading UTF-8 byte-order mark is skipped, not made tokens (vocabulary 15)" grep -q ', 15 tokens,' "$TMP/bom"
    # UTF-8: every character a token; invalid UTF-8 refused with its line, column and bytes
    { printf '\xef\xbb\xbf'; for i in $(seq 1 20); do printf 'Zo\xc3\xab%d\r\n' "$i"; done; printf 'Jos\xc3\xa9\r\n'; } >"$TMP/utf8.txt"
    run "$TMP/utf8" $p --data "$TMP/utf8.txt" --steps 5 --samples 3
    check "data: UTF-8 names (with a byte-order mark and CRLF) are read, one token per character: Z o e-diaeresis, 10 digits, J s e-acute (17)" \
        grep -q ', 17 tokens,' "$TMP/utf8"
    local bad
    while IFS='|' read -r bad pattern; do
        { for i in $(seq 1 20); do echo "name$i"; done; printf "Ren\xc3\xa9e $bad\n"; } >"$TMP/bad8.txt"
        expect_error 1 "bad8.txt:21: invalid UTF-8 at column 7 \(bytes [0-9a-f ]+\): $pattern" "data: invalid UTF-8 ($pattern) is refused with its line and column" -- $p --data "$TMP/bad8.txt"
    done <<'EOT'
\xa9x|a continuation byte with no leading byte
\xe6\x9dx|a sequence cut short
\xe6\x9d|a sequence cut short
\xc0\xaf|an overlong encoding
\xe0\x80\xaf|an overlong encoding
\xed\xa0\x80|a UTF-16 surrogate
\xf4\x90\x80\x80|a code point above U\+10FFFF
\xff|a byte that never occurs in UTF-8
EOT
    { for i in $(seq 1 20); do echo "name$i"; done; printf 'x\xc2\x85y\n'; } >"$TMP/c1.txt"
    expect_error 1 "c1.txt:21: control character U\+0085 at column 2" "data: a C1 control character (U+0085) is refused" -- $p --data "$TMP/c1.txt"
    # more distinct characters than the vocabulary's cap (65,536 tokens): 70,000 CJK characters
    python3 -c 'import sys; cps = list(range(0x4E00, 0x9FFF)) + list(range(0x20000, 0x2A6DF)) + list(range(0xAC00, 0xD7A3)); sys.stdout.write("\n".join("".join(map(chr, cps[i:i + 100])) for i in range(0, 70000, 100)) + "\n")' >"$TMP/vocab.txt"
    expect_error 1 "vocab.txt:656: the file has more than 65535 distinct characters; a vocabulary is at most 65536 tokens" \
        "data: more distinct characters than the vocabulary's cap (65,536 tokens) are refused, naming the line" -- $p --data "$TMP/vocab.txt" --max-line 400
    # inputs that never end: not a regular file, or larger than the loader reads (issue 31: 5, 6)
    expect_error 1 "data file '/dev/zero' is a device, not a regular file" "data: --data /dev/zero is refused at once (it grew memory without end)" -- $p --data /dev/zero
    mkfifo "$TMP/fifo"
    expect_error 1 "data file '$TMP/fifo' is a named pipe, not a regular file" "data: a named pipe with no writer is refused, not waited on forever" -- $p --data "$TMP/fifo"
    expect_error 1 "checkpoint '$TMP/fifo' is a named pipe, not a regular file" "data: a named pipe as --load is refused, not waited on forever" -- $p --load "$TMP/fifo"
    truncate -s 2G "$TMP/huge.txt" # sparse: no disk used
    expect_error 1 "is 2147483648 bytes, more than the 1073741824 this project reads" "data: a file larger than 1 GiB is refused before it is read" -- $p --data "$TMP/huge.txt"
    rm -f "$TMP/huge.txt"
    # names in seven scripts (tests/names_world.txt: Latin with diacritics, Greek, Cyrillic, Chinese,
    # Japanese, Arabic, Hebrew; 263 tokens) in every program: valid UTF-8, the same in every layout
    local w="--data tests/names_world.txt --steps 300 --eval-every 150 --samples 20"
    reference world $w
    run "$TMP/world.names" sed -n '/^names:/,$p' "$TMP/world.out"
    check "data: train.c on names in seven scripts prints 20 names, valid UTF-8, not all ASCII ($(sed -n 2,4p "$TMP/world.names" | tr '\n' ' '))" \
        bash -c "test \$(wc -l <'$TMP/world.names') = 21 && iconv -f UTF-8 -t UTF-8 '$TMP/world.names' >/dev/null && LC_ALL=C grep -q '[^ -~]' '$TMP/world.names'"
    same_as world "data: train_dp on 2 ranks, seven scripts, same as train.c" $MPIRUN -n 2 ./train_dp $w
    same_as world "data: train_fsdp ZeRO-3 on 3 ranks, seven scripts, same as train.c" $MPIRUN -n 3 ./train_fsdp --zero 3 $w
    same_as world "data: train_tp on 2 ranks, seven scripts, same as train.c" $MPIRUN -n 2 ./train_tp $w
    reference world2 $w --layers 2
    same_as world2 "data: train_tp on 3 ranks, L=2 (the loss split by a vocabulary of 263), seven scripts, same as train.c" $MPIRUN -n 3 ./train_tp $w --layers 2
    same_as world "data: train_pp, 2 stages, 1f1b, seven scripts, same as train.c" $MPIRUN -n 2 ./train_pp --microbatches 4 $w
    same_as world "data: train_3d 2 x 1 x 2, seven scripts, same as train.c" $MPIRUN -n 4 ./train_3d --tp 2 --dp 1 --pp 2 --microbatches 2 $w
    reference world_moe $w --experts 4
    same_as world_moe "data: train_ep, 4 experts on 2 ranks, seven scripts, same as train.c --experts 4" $MPIRUN -n 2 ./train_ep --experts 4 $w
    reference world_gpt $w --model gpt --emb 32 --layers 2
    same_as world_gpt "data: the GPT in train_dp on 2 ranks, seven scripts, same as train.c" $MPIRUN -n 2 ./train_dp --model gpt --emb 32 --layers 2 $w
    check "data: train.c --experts 4 and --model gpt print valid UTF-8 names too" \
        bash -c "sed -n '/^names:/,\$p' '$TMP/world_moe.out' '$TMP/world_gpt.out' | iconv -f UTF-8 -t UTF-8 >/dev/null && test \$(sed -n '/^names:/,\$p' '$TMP/world_gpt.out' | wc -l) = 21"
    # the --summary file and tools/report (make run's table) carry the names as written
    run "$TMP/ws" ./train $w --summary "$TMP/w.sum" --log "$TMP/w.csv" --quiet
    mkdir -p "$TMP/wrep/runs" && cp "$TMP/w.sum" "$TMP/wrep/runs/a.sum" && cp "$TMP/w.csv" "$TMP/wrep/runs/a.csv"
    run "$TMP/wrep.out" tools/report "$TMP/wrep" a
    sed -n '/^names:/,$p' "$TMP/ws" | tail -n +2 >"$TMP/ws.names"
    check "data: the --summary file and tools/report's table give the same 20 UTF-8 names as the run printed" \
        bash -c "test \$(wc -l <'$TMP/ws.names') = 20 && cmp -s '$TMP/ws.names' <(sed -n 's/^name=//p' '$TMP/w.sum') &&
                 grep -qxF \"names generated by train.c: \$(tr '\n' ' ' <'$TMP/ws.names' | sed 's/ \$//')\" '$TMP/wrep.out'"
    expect_error 1 "cannot write the results to the standard output" "data: a full disk under the standard output is an error, not exit 0" -- sh -c "$p --steps 5 >/dev/full"
    # the validation line counts what its mean is over: the GPT's targets (issue 36: 7). With
    # --context 1 a line scores its first character only, so the targets are the validation
    # lines; with the default context every character and end, as the MLP's examples
    local g1="--model gpt --emb 16 --heads 2 --layers 1 --steps 0 --samples 0" lines examples
    run "$TMP/v_mlp" $p --steps 0 --samples 0
    run "$TMP/v_gpt1" $p $g1 --context 1
    run "$TMP/v_gpt" $p $g1
    run "$TMP/v_gpt8" $p $g1 --context 8
    lines=$(sed -n 's/.* lines ([0-9]* train, \([0-9]*\) validation).*/\1/p' "$TMP/v_gpt1")
    examples=$(sed -n 's/^validation loss [0-9.]* (\([0-9]*\) examples)$/\1/p' "$TMP/v_mlp")
    local t8
    t8=$(sed -n 's/^validation loss [0-9.]* (\([0-9]*\) targets, in [0-9]* lines)$/\1/p' "$TMP/v_gpt8")
    check "data: the GPT's validation line counts its targets: --context 1, one a line ($lines); the default, every character and end ($examples, the MLP's examples); --context 8, fewer (${t8:-none}) (issue 36: 7)" \
        bash -c "test -n '$lines' && test -n '$examples' && grep -qx 'validation loss [0-9.]* ($lines targets, in $lines lines)' '$TMP/v_gpt1' &&
                 grep -qx 'validation loss [0-9.]* ($examples targets, in $lines lines)' '$TMP/v_gpt' && test -n '$t8' && test '$t8' -lt '$examples' && test '$t8' -gt '$lines'"
    # one long line makes every row of the GPT long (its context is the longest line + 1 by
    # default): said before step 1, naming the line, its length, the cost and --context (issue 36: 8)
    { head -40 names.txt; head -c 900 /dev/zero | tr '\0' 'x'; echo; } >"$TMP/outlier.txt"
    expect_error 0 "warning: line 41 of '$TMP/outlier.txt' has 900 characters, so the GPT's context \(by default the longest line \+ 1\) is 901 positions in every row, where 40 of its 41 lines have at most [0-9]+ characters: a step takes about [0-9]+ times the time and memory of --context [0-9]+ .*Pass --context N" \
        "data: the GPT on a file with one line of 900 characters says so before step 1, with the cost and --context (issue 36: 8)" -- $p $g1 --data "$TMP/outlier.txt"
    check "data: ... once, before the configuration; and names.txt (the default context, 16) gets no word" \
        bash -c "test \$(grep -c warning '$TMP/err') = 1 && grep -B100 '^configuration' '$TMP/err' | grep -q warning && ! grep -q warning '$TMP/v_gpt'"
}

# ----------------------------------------------------------------------------
section_train() {
    local p=./train
    run "$TMP/a1" $p --steps 300 --eval-every 100
    run "$TMP/a2" $p --steps 300 --eval-every 100
    check "train: two runs with the same seed print the same losses and names" \
        cmp -s <(results "$TMP/a1") <(results "$TMP/a2")
    check "train: progress lines every --eval-every steps, not every step" \
        test "$(grep -c '^step ' "$TMP/a1")" = 3
    run "$TMP/a3" $p --steps 300 --eval-every 100 --seed 7
    check "train: another seed gives other names" \
        bash -c "! cmp -s <(grep -A20 '^names:' '$TMP/a1') <(grep -A20 '^names:' '$TMP/a3')"
    check "train: --samples 10 prints 10 names of lower-case letters" \
        test "$(grep -A100 '^names:' "$TMP/a1" | tail -n +2 | grep -cE '^[a-z]+$')" = 10
    run "$TMP/l1" $p --steps 2000 --quiet --samples 0
    # measured: 2.289, 2.332, 2.354, 2.299 for seeds 42, 1, 2, 3; the untrained model gives 3.375
    check "train: 2000 steps of SGD reach a validation loss below 2.40 ($(val_loss "$TMP/l1"))" \
        awk -v l="$(val_loss "$TMP/l1")" 'BEGIN { exit !(l != "" && l < 2.40) }'
    run "$TMP/l2" $p --steps 2000 --optimizer adamw --quiet --samples 0
    # measured: 2.269, 2.285, 2.291 for seeds 42, 1, 2
    check "train: 2000 steps of AdamW reach a validation loss below 2.35 ($(val_loss "$TMP/l2"))" \
        awk -v l="$(val_loss "$TMP/l2")" 'BEGIN { exit !(l != "" && l < 2.35) }'
    run "$TMP/order" bash tools/float_order.sh --steps 300 --samples 3
    check "train: the same float sum over two halves of the batch changes the training loss at step 2 (tools/float_order.sh, train.c's header)" \
        grep -q '^training losses first differ at step 2:' "$TMP/order"
    expect_error 1 "at step 2: training has diverged; lower --lr or use --clip" "train: a diverged run stops with a message naming the step" -- $p --lr 100 --steps 50
    run "$TMP/log" $p --steps 50 --eval-every 25 --log "$TMP/log.csv" --quiet
    check "train: --log writes a header and one CSV line per step, with the validation loss where evaluated" \
        bash -c "head -1 '$TMP/log.csv' | grep -qx 'step,train_loss,val_loss,ms,tokens_per_s' &&
                 test \$(wc -l < '$TMP/log.csv') = 51 && awk -F, 'NR>1 && \$3 != \"\"' '$TMP/log.csv' | wc -l | grep -qx 2"
}

# ----------------------------------------------------------------------------
section_checkpoint() {
    local p=./train
    for opt in sgd adamw; do
        fresh "$TMP/full.ckpt" "$TMP/half.ckpt" "$TMP/resumed.ckpt" # the other optimizer's run's
        run "$TMP/c1" $p --steps 200 --optimizer $opt --save "$TMP/full.ckpt" --quiet
        run "$TMP/c2" $p --steps 120 --optimizer $opt --save "$TMP/half.ckpt" --quiet
        run "$TMP/c3" $p --steps 200 --optimizer $opt --load "$TMP/half.ckpt" --save "$TMP/resumed.ckpt" --quiet
        check "checkpoint ($opt): 120 steps, save, load, 80 more steps equals 200 steps, bit for bit" \
            cmp -s "$TMP/full.ckpt" "$TMP/resumed.ckpt"
        check "checkpoint ($opt): the resumed run prints the same loss and names" cmp -s "$TMP/c1" "$TMP/c3"
    done
    cp "$TMP/full.ckpt" "$TMP/flip.ckpt"
    printf '\x01' | dd of="$TMP/flip.ckpt" bs=1 seek=1000 conv=notrunc 2>/dev/null
    head -c 5000 "$TMP/full.ckpt" >"$TMP/trunc.ckpt"
    head -c 100 names.txt >"$TMP/text.ckpt"
    expect_error 1 "checksum mismatch" "checkpoint: a flipped byte is caught by the checksum" -- $p --load "$TMP/flip.ckpt" --optimizer adamw --steps 200
    expect_error 1 "truncated" "checkpoint: a truncated file is refused" -- $p --load "$TMP/trunc.ckpt" --optimizer adamw --steps 200
    expect_error 1 "not a checkpoint of this project" "checkpoint: another kind of file is refused" -- $p --load "$TMP/text.ckpt" --steps 0
    expect_error 1 "is of a different model .*hidden 64" "checkpoint: another model size is refused, naming it" -- $p --load "$TMP/full.ckpt" --optimizer adamw --hidden 32 --steps 200
    expect_error 1 "holds AdamW state; pass --optimizer adamw" "checkpoint: another optimizer is refused" -- $p --load "$TMP/full.ckpt" --steps 200
    expect_error 1 "cannot open checkpoint" "checkpoint: a missing file is named" -- $p --load "$TMP/none.ckpt"
    # what a resume must not do silently
    run "$TMP/c4" $p --steps 120 --save "$TMP/s120.ckpt" --log "$TMP/s120.csv" --quiet
    expect_error 1 "other settings: --seed 42 \(now 7\); --lr 0.1 \(now 0.05\);.*--allow-changes" \
        "checkpoint: resuming with another seed and learning rate is refused, naming both" -- $p --load "$TMP/s120.ckpt" --steps 150 --seed 7 --lr 0.05
    expect_error 0 "validation loss" "checkpoint: --allow-changes resumes with them deliberately" -- $p --load "$TMP/s120.ckpt" --steps 150 --seed 7 --allow-changes --quiet
    expect_error 1 "is at step 120, past --steps 50: this run would train nothing" "checkpoint: --steps below the checkpoint's step is an error" -- $p --load "$TMP/s120.ckpt" --steps 50
    head -n 2000 names.txt >"$TMP/other.txt"
    expect_error 1 "the data file's contents" "checkpoint: another data file with the same vocabulary is refused" -- $p --load "$TMP/s120.ckpt" --steps 150 --data "$TMP/other.txt"
    if command -v python3 >/dev/null 2>&1; then
        # a checkpoint whose values or header were edited, with its checksum made right again
        poke() { python3 - "$@" <<'PY'
import struct, sys
src, dst, what = sys.argv[1], sys.argv[2], sys.argv[3]
b = bytearray(open(src, "rb").read())
if what == "nan": at = 160 + 4 * struct.unpack("<i", b[12:16])[0]; b[at + 40:at + 44] = struct.pack("<f", float("nan"))  # format 8: the header, the vocabulary's code points, the floats
if what == "nanbias": b[-12:-8] = struct.pack("<f", float("nan"))  # --balance bias: the last expert's bias, before the checksum
if what == "order": b[8:12] = bytes(reversed(b[8:12]))
if what == "v1": b[0:8] = b"MLPCKPT1"
if what == "v2": b[0:8] = b"MLPCKPT2"; del b[360:376]  # from format 3: format 2 is its header without the experts' fields
if what == "heads": b[84:88] = struct.pack("<i", 2)
if what == "big": b[48:56] = struct.pack("<q", struct.unpack("<q", b[48:56])[0] + 1000)
if what.startswith("i32:"): at, v = map(int, what[4:].split(":")); b[at:at + 4] = struct.pack("<i", v)  # i32:OFFSET:VALUE
if what.startswith("i64:"): at, v = map(int, what[4:].split(":")); b[at:at + 8] = struct.pack("<q", v)
if what.startswith("u32:"): at, v = map(int, what[4:].split(":")); b[at:at + 4] = struct.pack("<I", v)
h = 0xcbf29ce484222325
for x in b[:-8]: h = ((h ^ x) * 0x100000001b3) & 0xffffffffffffffff
b[-8:] = struct.pack("<Q", h)
open(dst, "wb").write(b)
PY
        }
        poke "$TMP/s120.ckpt" "$TMP/nan.ckpt" nan
        expect_error 1 "holds a value that is not finite \(a parameter of embedding, element 10\)" "checkpoint: a NaN parameter is refused on load, naming where" -- $p --load "$TMP/nan.ckpt" --steps 150
        poke "$TMP/s120.ckpt" "$TMP/order.ckpt" order
        expect_error 1 "other byte order" "checkpoint: a foreign byte order is refused" -- $p --load "$TMP/order.ckpt" --steps 150
        poke "$TMP/s120.ckpt" "$TMP/v1.ckpt" v1
        expect_error 1 "has format MLPCKPT1" "checkpoint: an older format is refused, saying so" -- $p --load "$TMP/v1.ckpt" --steps 150
        # formats 2 and 3 still read: tests/old/ holds checkpoints the project wrote in format 3
        # (commit 43b1919's train: --steps 20 --context 3 --emb 2 --hidden 4 and --optimizer adamw,
        # or --experts 2), each resumed to step 40 here, as a run never stopped
        local old="--context 3 --emb 2 --hidden 4 --samples 3 --quiet" opt
        for opt in "--optimizer adamw" "--experts 2"; do
            local file=tests/old/format3_$([ "$opt" = "--experts 2" ] && echo experts || echo adamw).ckpt
            fresh "$TMP/o40.ckpt" "$TMP/o3.ckpt" "$TMP/o2r.ckpt"
            run "$TMP/o40.out" $p $old $opt --steps 40 --save "$TMP/o40.ckpt" --log "$TMP/o40.csv"
            run "$TMP/o3.out" $p $old $opt --steps 40 --load $file --save "$TMP/o3.ckpt"
            poke $file "$TMP/o2.ckpt" v2
            if [ "$opt" = "--experts 2" ]; then
                expect_error 1 "checkpoint '$TMP/o2.ckpt' is corrupt: its header is inconsistent \(257 parameters: its sizes make 217\)" \
                "checkpoint: format 2 reads as a dense model (it predates the experts' fields): a mixture's values under its header are refused, the dense sizes named" \
                    -- $p $old $opt --steps 40 --load "$TMP/o2.ckpt"
            else
                run "$TMP/o2.out" $p $old $opt --steps 40 --load "$TMP/o2.ckpt" --save "$TMP/o2r.ckpt"
                check "checkpoint: a format 2 checkpoint (before the experts' fields) resumes as a run never stopped" \
                    bash -c "cmp -s '$TMP/o40.out' '$TMP/o2.out' && tools/compare '$TMP/o40.csv' '$TMP/o40.csv' '$TMP/o40.ckpt' '$TMP/o2r.ckpt'"
            fi
            check "checkpoint: a format 3 checkpoint ($opt, the vocabulary as bytes) resumes as a run never stopped" \
                bash -c "cmp -s '$TMP/o40.out' '$TMP/o3.out' && tools/compare '$TMP/o40.csv' '$TMP/o40.csv' '$TMP/o40.ckpt' '$TMP/o3.ckpt'"
        done
        # format 4 still reads, its microbatches unknown: tests/old/format4_experts.ckpt is commit
        # c8074e0's train --context 3 --emb 2 --hidden 4 --experts 2 --steps 20
        fresh "$TMP/o40.ckpt"
        run "$TMP/o40.out" $p $old --experts 2 --steps 40 --save "$TMP/o40.ckpt" --log "$TMP/o40.csv"
        run "$TMP/o4.out" $p $old --experts 2 --steps 40 --load tests/old/format4_experts.ckpt --save "$TMP/o4.ckpt"
        check "checkpoint: a format 4 checkpoint (before the microbatches) resumes as a run never stopped, and is saved again in format 8" \
            bash -c "cmp -s '$TMP/o40.out' '$TMP/o4.out' && tools/compare '$TMP/o40.csv' '$TMP/o40.csv' '$TMP/o40.ckpt' '$TMP/o4.ckpt' && head -c 8 '$TMP/o4.ckpt' | grep -q MLPCKPT8"
        # format 5 too, its router the softmax with the loss: tests/old/format5_experts.ckpt is
        # commit 331f217's train --context 3 --emb 2 --hidden 4 --experts 2 --steps 20
        run "$TMP/o5.out" $p $old --experts 2 --steps 40 --load tests/old/format5_experts.ckpt --save "$TMP/o5.ckpt"
        check "checkpoint: a format 5 checkpoint (before the router's fields) resumes as a run never stopped, and is saved again in format 8" \
            bash -c "cmp -s '$TMP/o40.out' '$TMP/o5.out' && tools/compare '$TMP/o40.csv' '$TMP/o40.csv' '$TMP/o40.ckpt' '$TMP/o5.ckpt' && head -c 8 '$TMP/o5.ckpt' | grep -q MLPCKPT8"
        # format 6 too, its precision fp32: tests/old/format6_experts.ckpt is commit b6999a6's
        # train --context 3 --emb 2 --hidden 4 --experts 2 --steps 20
        run "$TMP/o6.out" $p $old --experts 2 --steps 40 --load tests/old/format6_experts.ckpt --save "$TMP/o6.ckpt"
        check "checkpoint: a format 6 checkpoint (before the precision) resumes as a run never stopped, and is saved again in format 8" \
            bash -c "cmp -s '$TMP/o40.out' '$TMP/o6.out' && tools/compare '$TMP/o40.csv' '$TMP/o40.csv' '$TMP/o40.ckpt' '$TMP/o6.ckpt' && head -c 8 '$TMP/o6.ckpt' | grep -q MLPCKPT8"
        # format 7 too, no shared experts: tests/old/format7_experts.ckpt is commit c301536's
        # train --context 3 --emb 2 --hidden 4 --experts 2 --steps 20
        run "$TMP/o7.out" $p $old --experts 2 --steps 40 --load tests/old/format7_experts.ckpt --save "$TMP/o7.ckpt"
        check "checkpoint: a format 7 checkpoint (before the shared experts) resumes as a run never stopped, and is saved again in format 8" \
            bash -c "cmp -s '$TMP/o40.out' '$TMP/o7.out' && tools/compare '$TMP/o40.csv' '$TMP/o40.csv' '$TMP/o40.ckpt' '$TMP/o7.ckpt' && head -c 8 '$TMP/o7.ckpt' | grep -q MLPCKPT8"
        expect_error 1 "checkpoint '.*format7_experts.ckpt' is of a mixture with 0 shared experts and this run's has 1: pass --shared-experts 0" \
            "checkpoint: a format 7 checkpoint reads as no shared experts: resumed with one it is refused, naming the flag" \
            -- $p $old --experts 2 --steps 40 --load tests/old/format7_experts.ckpt --shared-experts 1
        expect_error 1 "other settings: --precision fp32 \(now bf16\);" "checkpoint: a format 6 checkpoint reads as fp32: resumed in bf16 it is refused, naming --precision" \
            -- $p $old --experts 2 --steps 40 --load tests/old/format6_experts.ckpt --precision bf16
        # with experts the microbatches decide the result (capacity and the balancing loss are a
        # microbatch's): a resume under others is refused, as another --capacity (audit 5: E1, E2)
        expect_error 1 "other settings: --microbatches 1 \(now 4\);" "checkpoint: an experts checkpoint resumed under another --microbatches is refused, naming it" \
            -- $p $old --experts 2 --steps 60 --load "$TMP/o40.ckpt" --microbatches 4
        expect_error 0 "validation loss" "checkpoint: ... unless --allow-changes" -- $p $old --experts 2 --steps 60 --load "$TMP/o40.ckpt" --microbatches 4 --allow-changes
        poke "$TMP/s120.ckpt" "$TMP/big.ckpt" big
        expect_error 1 "does not match its size" "checkpoint: a header claiming more parameters than the file holds is refused" -- $p --load "$TMP/big.ckpt" --steps 150
        expect_error 2 "does not match its size" "checkpoint: tools/compare refuses it too, with exit 2 (it overflowed its buffer before)" -- tools/compare "$TMP/s120.csv" "$TMP/s120.csv" "$TMP/s120.ckpt" "$TMP/big.ckpt"
        # the model kind and the heads (format 4): a GPT's checkpoint
        local gpt="--model gpt --emb 16 --heads 4 --layers 1 --samples 0 --quiet"
        run "$TMP/g5" $p $gpt --steps 5 --save "$TMP/gpt.ckpt"
        expect_error 1 "is of the GPT and this run trains the MLP: pass --model gpt" "checkpoint: a GPT's checkpoint resumed without --model gpt is refused, naming the flag" -- $p --load "$TMP/gpt.ckpt" --steps 10
        expect_error 1 "is of the MLP and this run trains the GPT: leave out --model gpt" "checkpoint: an MLP's checkpoint resumed with --model gpt is refused" -- $p --load "$TMP/s120.ckpt" --model gpt --steps 150
        expect_error 1 "is of a GPT with 4 attention heads and this run's has 2: pass --heads 4" "checkpoint: another --heads is refused, naming the flag" -- $p ${gpt/--heads 4/--heads 2} --load "$TMP/gpt.ckpt" --steps 10
        poke "$TMP/gpt.ckpt" "$TMP/gpt2.ckpt" heads
        expect_error 1 "is of a GPT with 2 attention heads and this run's has 4: pass --heads 2" "checkpoint: the heads are read from the header" -- $p $gpt --load "$TMP/gpt2.ckpt" --steps 10
        expect_error 0 "validation loss" "checkpoint: the GPT's checkpoint resumes with the same flags" -- $p $gpt --load "$TMP/gpt.ckpt" --steps 10
        # another run's checkpoint at --save's path is a user's result: refused before step 1, the file
        # untouched (audit 5: item 8); this run's own (the same model and settings) is replaced
        cp "$TMP/gpt.ckpt" "$TMP/precious.ckpt"
        expect_error 1 "save '$TMP/precious.ckpt' holds another run's checkpoint \(step 5, of the GPT\)" \
            "checkpoint: --save over another model's checkpoint is refused before step 1 (audit 5: K49)" -- $p --steps 3 --save "$TMP/precious.ckpt" --save-every 1
        check "checkpoint: ... and the checkpoint is untouched" cmp "$TMP/gpt.ckpt" "$TMP/precious.ckpt"
        expect_error 1 "holds another run's checkpoint \(step 5, trained with other settings: --seed 42 \(now 7\)\)" \
            "checkpoint: --save over a checkpoint of other settings is refused, naming them (audit 5: K50)" -- $p $gpt --seed 7 --steps 3 --save "$TMP/precious.ckpt"
        fresh "$TMP/mine.ckpt"
        cp "$TMP/s120.ckpt" "$TMP/mine.ckpt.1"
        expect_error 1 "save '$TMP/mine.ckpt': its rotation's $TMP/mine.ckpt.1 holds another run's checkpoint \(step 120, of the MLP\)" \
            "checkpoint: --save refuses when its rotation would replace another run's checkpoint (FILE.1)" -- $p $gpt --steps 3 --save "$TMP/mine.ckpt"
        expect_error 0 "validation loss" "checkpoint: ... but not with --keep 1, which leaves FILE.1 alone" -- $p $gpt --steps 3 --save "$TMP/mine.ckpt" --keep 1
        expect_error 0 "validation loss" "checkpoint: --save replaces a checkpoint of the same run at another step" -- $p $gpt --steps 4 --save "$TMP/precious.ckpt"
        expect_error 1 "holds another run's checkpoint" "checkpoint: every rank refuses it once (train_dp)" -- $MPIRUN -n 2 ./train_dp --steps 2 --save "$TMP/precious.ckpt"
        # a header whose checksum is right but whose fields no run writes is corrupt, naming the
        # field, not advice no one can follow ("pass --heads 0") (issue 36: 9)
        local field
        while IFS='|' read -r field pattern; do
            poke "$TMP/gpt.ckpt" "$TMP/field.ckpt" "$field"
            expect_error 1 "checkpoint '$TMP/field.ckpt' is corrupt: its header is inconsistent \($pattern" \
                "checkpoint: a checksummed header with $pattern is refused as inconsistent, naming the field (issue 36: 9)" -- $p $gpt --load "$TMP/field.ckpt" --steps 10
            check "checkpoint: ... and gives no advice to pass it ($pattern)" bash -c "! grep -q 'pass --' '$TMP/err'"
        done <<'EOT'
i32:84:0|heads 0: a GPT has 1 or more, dividing its width 16
i32:20:0|width 0: it is 1 to 4096
i32:16:100000|context 100000: it is 1 to 1024
i32:28:-1|layers -1: it is 1 to 32
i32:84:-4|heads -4: it is 0 to 4096
i64:40:-5|step -5: it is 0 to 1e9
i64:40:9223372036854775807|step 9223372036854775807: it is 0 to 1e9
i32:36:7|model 7: it is 0 \(mlp\) or 1 \(gpt\)
i32:32:2|adamw 2: it is 0 \(sgd\) or 1 \(adamw\)
i32:88:-1|experts -1: it is 0 \(dense\) to 1024
EOT
        # fields out of range named too, not blamed on the file's size (audit 5: J3-J5, J14, J15, J19, J41)
        run "$TMP/moe5" $p $gpt --experts 2 --steps 2 --save "$TMP/moe.ckpt"
        poke "$TMP/moe.ckpt" "$TMP/field.ckpt" i32:92:9
        expect_error 1 "checkpoint '$TMP/field.ckpt' is corrupt: its header is inconsistent \(top_k 9: with experts it is 1 to 8\)" \
            "checkpoint: a checksummed experts header with top_k 9 is refused, naming the field" -- $p $gpt --experts 2 --load "$TMP/field.ckpt" --steps 10
        # format 6's router fields, and the expert biases of --balance bias after the floats
        local bias="--experts 2 --router sigmoid --balance bias"
        run "$TMP/bias5" $p $gpt $bias --steps 2 --save "$TMP/bias.ckpt"
        while IFS='|' read -r field pattern; do
            poke "$TMP/bias.ckpt" "$TMP/field.ckpt" "$field"
            expect_error 1 "checkpoint '$TMP/field.ckpt' is corrupt: its header is inconsistent \($pattern" \
                "checkpoint: a checksummed header with $pattern is refused, naming the field" -- $p $gpt $bias --load "$TMP/field.ckpt" --steps 10
        done <<'EOT'
i32:136:7|router 7: it is 0 \(softmax\) or 1 \(sigmoid\)
i32:140:5|balance 5: it is 0 \(aux\) or 1 \(bias\)
i32:148:3|bias_units 3: with --balance bias the layers \(1\), else 0
i32:148:0|bias_units 0: with --balance bias the layers \(1\), else 0
i32:152:2|precision 2: it is 0 \(fp32\) or 1 \(bf16\)
i32:156:9|shared_experts 9: with experts it is 0 to 8, a dense model's 0
EOT
        poke "$TMP/bias.ckpt" "$TMP/nanbias.ckpt" nanbias
        expect_error 1 "holds an expert bias that is not finite \(layer 1\)" "checkpoint: a NaN expert bias is refused on load, naming its layer" \
            -- $p $gpt $bias --load "$TMP/nanbias.ckpt" --steps 10
        expect_error 1 "--balance bias \(now aux\); --bias-rate 0.001 \(now 0\); .*--allow-changes" \
            "checkpoint: a --balance bias checkpoint resumed with the loss is refused, naming the flags" \
            -- $p $gpt --experts 2 --router sigmoid --load "$TMP/bias.ckpt" --steps 10
        expect_error 1 "other settings: --microbatches 1 \(now 4\);" "checkpoint: ... also through train_3d's own default of 4 microbatches" \
            -- $MPIRUN -n 2 ./train_3d --model gpt --emb 16 --heads 4 --layers 1 --experts 2 --samples 0 --quiet --dp 2 --ep 2 --steps 10 --load "$TMP/moe.ckpt"
        expect_error 0 "validation loss" "checkpoint: a dense checkpoint resumes under other microbatches (exact sums: the same bits)" \
            -- $p $gpt --steps 10 --load "$TMP/gpt.ckpt" --microbatches 2
        # a vocabulary holding a UTF-16 surrogate (not a character) is corrupt, not printed as
        # invalid UTF-8 (issue 36: 10): names.txt's token 26, 'z', made U+D800
        poke "$TMP/s120.ckpt" "$TMP/surrogate.ckpt" u32:$((160 + 4 * 26)):55296
        expect_error 1 "checkpoint '$TMP/surrogate.ckpt' is corrupt: its vocabulary's token 26 is U\+D800, a UTF-16 surrogate, not a character" \
            "checkpoint: a vocabulary holding U+D800 is refused as corrupt (issue 36: 10)" -- $p --load "$TMP/surrogate.ckpt" --steps 150
        check "checkpoint: ... its message is valid UTF-8" iconv -f UTF-8 -t UTF-8 "$TMP/err"
        expect_error 2 "checkpoint '$TMP/surrogate.ckpt' is corrupt: its vocabulary's token 26 is U\+D800" \
            "checkpoint: tools/compare refuses it too (issue 36: 10)" -- tools/compare "$TMP/s120.csv" "$TMP/s120.csv" "$TMP/surrogate.ckpt" "$TMP/surrogate.ckpt"
        # another vocabulary of the same size: the first token that differs, as characters
        sed 's/z/é/g' names.txt >"$TMP/accents.txt"
        expect_error 1 "different vocabulary \(token 26 is 'z' there, 'é' in '$TMP/accents.txt'\)" "checkpoint: another vocabulary is refused, naming the first character that differs" -- $p --load "$TMP/s120.ckpt" --steps 150 --data "$TMP/accents.txt"
    else
        skip "checkpoint: edited checkpoints (NaN, byte order, format, sizes) need python3 to make"
    fi
    # a kill during a save leaves the previous checkpoint whole: a model of 25 MB with AdamW,
    # killed at 8 moments of its save; after each, the checkpoint still loads
    head -n 300 names.txt >"$TMP/small.txt"
    local big="--data $TMP/small.txt --hidden 2048 --emb 64 --optimizer adamw --samples 0 --eval-every 0"
    run "$TMP/k0" $p $big --steps 1 --save "$TMP/kill.ckpt" --quiet
    cp "$TMP/kill.ckpt" "$TMP/kill.orig"
    local intact=0 tries=0
    for d in 0.02 0.05 0.08 0.11 0.14 0.17 0.20 0.25; do
        $p $big --steps 2 --load "$TMP/kill.orig" --save "$TMP/kill.ckpt" --quiet >/dev/null 2>&1 &
        local pid=$!
        sleep $d
        kill -9 $pid 2>/dev/null
        wait $pid 2>/dev/null
        tries=$((tries + 1))
        $p $big --steps 2 --load "$TMP/kill.ckpt" --quiet --allow-changes >/dev/null 2>&1 && intact=$((intact + 1))
        cp "$TMP/kill.orig" "$TMP/kill.ckpt"
    done
    check "checkpoint: killed at $tries moments of a save, the checkpoint loads every time ($intact of $tries)" test $intact = $tries
    # the checkpoint exists at its path at every moment (issue 31: 0): killed at the entry of each
    # rename, link and unlink of five saves in a row (strace), the run leaves FILE, and it loads,
    # and so does FILE.1 where there is one; the next save removes what the kill left. strace
    # counts each system call apart (when=N is the Nth call of that one), so the calls of one run
    # are listed first, and the Kth is killed as the Nth of its kind
    local tiny="--context 3 --emb 2 --hidden 4 --samples 0 --eval-every 0 --quiet" calls="rename,renameat,renameat2,link,linkat,unlink,unlinkat"
    local step
    if strace -f -o /dev/null -e trace=none true 2>/dev/null; then
        local k missing="" left="" names=()
        rm -f "$TMP"/at.ckpt*
        timeout "$LIMIT" strace -f -o "$TMP/calls" -e trace=$calls $p $tiny --steps 5 --save-every 1 --save "$TMP/at.ckpt" >/dev/null 2>&1
        mapfile -t names < <(grep -oE '^[0-9]+ +[a-z0-9]+\(' "$TMP/calls" | sed -E 's/^[0-9]+ +//; s/\($//')
        for k in $(seq 2 ${#names[@]}); do # (the first puts the first checkpoint in place: before it, there is none)
            local name=${names[k - 1]} nth
            nth=$(printf '%s\n' "${names[@]:0:k}" | grep -cx "$name")
            rm -f "$TMP"/at.ckpt*
            (timeout "$LIMIT" strace -f -o /dev/null -e trace=$name -e inject=$name:signal=KILL:when=$nth $p $tiny --steps 5 --save-every 1 \
                --save "$TMP/at.ckpt"; true) >/dev/null 2>&1 # (a subshell, which says "Killed" to /dev/null)
            step=$(od -An -t d8 -j 40 -N 8 "$TMP/at.ckpt" 2>/dev/null | tr -d ' ')
            [ -n "$step" ] && $p $tiny --load "$TMP/at.ckpt" --steps "$step" >/dev/null 2>&1 || missing="$missing $k"
            if [ -e "$TMP/at.ckpt.1" ]; then
                step=$(od -An -t d8 -j 40 -N 8 "$TMP/at.ckpt.1" 2>/dev/null | tr -d ' ')
                [ -n "$step" ] && $p $tiny --load "$TMP/at.ckpt.1" --steps "$step" >/dev/null 2>&1 || missing="$missing $k(FILE.1)"
            fi
            step=$(od -An -t d8 -j 40 -N 8 "$TMP/at.ckpt" 2>/dev/null | tr -d ' ')
            run "$TMP/next" $p $tiny --load "$TMP/at.ckpt" --steps $((${step:-0} + 1)) --save "$TMP/at.ckpt" &&
                [ -z "$(ls "$TMP" | grep '^at\.ckpt.*tmp-')" ] || left="$left $k"
        done
        check "checkpoint: killed at each of the file calls 2 to ${#names[@]} of saves every step (${names[*]:0:7} ...), FILE is there and loads, and FILE.1${missing:+ (not after call$missing)}" \
            test ${#names[@]} -ge 20 -a -z "$missing"
        check "checkpoint: ... and the next save removes what the kill left${left:+ (not after call$left)}" test -z "$left"
        rm -f "$TMP"/at.ckpt*
    else
        skip "checkpoint: kills at each file call of a save need strace (apt-get install strace) and ptrace"
    fi
    # and with frequent saves and kills at random moments
    rm -f "$TMP"/rk.ckpt*
    run "$TMP/rk" $p $tiny --steps 1 --save "$TMP/rk.ckpt"
    local lost=0 kills
    for kills in $(seq 1 20); do
        $p $tiny --steps 100000000 --save-every 1 --save "$TMP/rk.ckpt" >/dev/null 2>&1 &
        local pid=$!
        sleep 0.$((RANDOM % 3))$((RANDOM % 10))
        kill -9 $pid 2>/dev/null
        wait $pid 2>/dev/null
        step=$(od -An -t d8 -j 40 -N 8 "$TMP/rk.ckpt" 2>/dev/null | tr -d ' ')
        [ -n "$step" ] && $p $tiny --load "$TMP/rk.ckpt" --steps "$step" >/dev/null 2>&1 || lost=$((lost + 1))
    done
    check "checkpoint: --save-every 1 killed at 20 random moments: FILE is there and loads every time ($lost lost)" test $lost = 0
    # stale temporaries (issue 31: 4): those of killed processes go at the next save, a running one's stays
    sh -c 'exit 0' &
    local dead=$!
    wait $dead
    touch "$TMP/rk.ckpt.tmp-$dead" "$TMP/rk.ckpt.tmp-$$" "$TMP/rk.ckpt.1.tmp-$dead"
    local stale_before
    stale_before=$(ls "$TMP"/rk.ckpt*tmp-* "$TMP"/kill.ckpt.tmp-* 2>/dev/null | wc -l)
    run "$TMP/rk" $p $tiny --steps 2 --save "$TMP/rk.ckpt"
    run "$TMP/kl" $p $big --steps 1 --save "$TMP/kill.ckpt" --quiet
    check "checkpoint: the next save removes the $((stale_before - 1)) temporaries left by killed processes and keeps a running process's ($(ls "$TMP" | grep -c 'tmp-') left)" \
        bash -c "test \"\$(cd '$TMP' && ls | grep 'tmp-')\" = 'rk.ckpt.tmp-$$'"
    rm -f "$TMP/rk.ckpt.tmp-$$"
    # a temporary that is not the project's (a user's file that a save, killed between its two
    # swaps, had moved aside) is never removed: a killed process's stays, with a warning; one with
    # this process's PID (a job requeued in a fresh container; exec keeps the shell's PID) stops the
    # save before it writes. And a leftover of this PID that is a second name of FILE (the rotation's,
    # killed) is removed, never written into
    run "$TMP/rk" $p $tiny --steps 1 --save "$TMP/rk.ckpt"
    echo "my notes" >"$TMP/rk.ckpt.tmp-$dead"
    run "$TMP/rkw" $p $tiny --load "$TMP/rk.ckpt" --steps 4 --save-every 1 --save "$TMP/rk.ckpt"
    check "checkpoint: a killed process's temporary that is not a checkpoint stays, with one warning in 3 saves, and the saves go on" \
        bash -c "test \"\$(cat '$TMP/rk.ckpt.tmp-$dead')\" = 'my notes' && test \$(grep -c \"warning: '$TMP/rk.ckpt.tmp-$dead' is not one of this project's files\" '$TMP/rkw') = 1 && test \$(od -An -t d8 -j 40 -N 8 '$TMP/rk.ckpt' | tr -d ' ') = 4"
    rm -f "$TMP/rk.ckpt.tmp-$dead"
    run "$TMP/rk" $p $tiny --steps 2 --save "$TMP/rk.ckpt" # back to step 2, which the checks below start from
    expect_error 1 "is in the way of this run's temporary file, and is not one of this project's files" \
        "checkpoint: ... one with this process's PID stops the save" -- bash -c "echo 'my notes' >'$TMP/rk.ckpt.tmp-'\$\$ && exec $p $tiny --load '$TMP/rk.ckpt' --steps 3 --save '$TMP/rk.ckpt'"
    check "checkpoint: ... and stays" bash -c "test \"\$(cat '$TMP'/rk.ckpt.tmp-*)\" = 'my notes' && test \$(od -An -t d8 -j 40 -N 8 '$TMP/rk.ckpt' | tr -d ' ') = 2"
    rm -f "$TMP"/rk.ckpt.tmp-*
    cp "$TMP/rk.ckpt" "$TMP/rk.orig"
    run "$TMP/rkl" bash -c "ln '$TMP/rk.ckpt' '$TMP/rk.ckpt.1.tmp-'\$\$ && exec $p $tiny --load '$TMP/rk.ckpt' --steps 3 --save '$TMP/rk.ckpt'"
    check "checkpoint: a leftover of this PID that is a second name of FILE is removed, not written into: FILE.1 is the old FILE, whole, and FILE the new" \
        bash -c "cmp -s '$TMP/rk.ckpt.1' '$TMP/rk.orig' && test \$(od -An -t d8 -j 40 -N 8 '$TMP/rk.ckpt' | tr -d ' ') = 3 && test -z \"\$(ls '$TMP' | grep '^rk.ckpt.*tmp-')\""
    # nothing the user had is replaced (issue 31: 1, 2, 3): --save only over a checkpoint of this
    # project, --log only over a log of this project, each output only over a regular file
    echo "my thesis draft" >"$TMP/thesis.txt"
    cp "$TMP/thesis.txt" "$TMP/thesis.orig"
    expect_error 2 "--save '$TMP/thesis.txt' exists and is not a checkpoint of this project \(a run replaces only its own files\)" \
        "checkpoint: --save onto a file that is not a checkpoint is refused before step 1" -- $p --steps 50 --save "$TMP/thesis.txt"
    run "$TMP/k2" $p --steps 50 --save "$TMP/keep.ckpt" --quiet
    cp "$TMP/thesis.txt" "$TMP/keep.ckpt.2"
    expect_error 2 "--save '$TMP/keep.ckpt' with --keep, '$TMP/keep.ckpt.2' \(which the rotation would rename\) exists and is not a checkpoint" \
        "checkpoint: --keep 3 refuses to rotate a file that is not a checkpoint (FILE.2)" -- $p --steps 50 --save "$TMP/keep.ckpt" --keep 3 --save-every 10
    mkfifo "$TMP/save.fifo"
    expect_error 2 "--save '$TMP/save.fifo' is a named pipe, not a regular file" "checkpoint: --save onto a named pipe is refused (it was renamed away)" -- $p --steps 50 --save "$TMP/save.fifo"
    mkdir -p "$TMP/adir"
    expect_error 2 "--save '$TMP/adir' is a folder, not a regular file" "checkpoint: --save onto a folder is refused before training, not after" -- $p --steps 50 --save "$TMP/adir"
    local out
    for out in save log trace summary; do
        expect_error 2 "--$out '' is empty: give a file name" "checkpoint: --$out '' is refused before step 1" -- $p --steps 50 --$out ''
    done
    echo "step,notes" >"$TMP/notes.csv"
    cp "$TMP/notes.csv" "$TMP/notes.orig"
    expect_error 2 "--log '$TMP/notes.csv' exists and is not a --log file of this project \(a run replaces only its own files; pass --log-overwrite" \
        "checkpoint: --log onto a user's file is refused, naming --log-overwrite" -- $p --steps 50 --log "$TMP/notes.csv"
    cp "$TMP/keep.ckpt" "$TMP/keep.orig"
    expect_error 2 "--log '$TMP/keep.ckpt' exists and is not a --log file" "checkpoint: --log onto a checkpoint is refused" -- $p --steps 50 --log "$TMP/keep.ckpt"
    expect_error 2 "--summary '$TMP/notes.csv' exists and is not a --summary file" "checkpoint: --summary onto a user's file is refused" -- $p --steps 5 --summary "$TMP/notes.csv"
    expect_error 2 "--trace '$TMP/notes.csv' exists and is not a --trace file" "checkpoint: --trace onto a user's file is refused" -- $p --steps 5 --trace "$TMP/notes.csv"
    expect_error 2 "--log '$TMP/save.fifo' is a named pipe, not a regular file" "checkpoint: --log onto a named pipe is refused, not waited on forever" -- $p --steps 5 --log "$TMP/save.fifo"
    expect_error 2 "--log-overwrite applies to --log FILE only" "checkpoint: --log-overwrite without --log is refused" -- $p --steps 5 --log-overwrite
    check "checkpoint: and the user's files, the checkpoint and the named pipe are untouched" \
        bash -c "cmp -s '$TMP/thesis.txt' '$TMP/thesis.orig' && cmp -s '$TMP/keep.ckpt.2' '$TMP/thesis.orig' && cmp -s '$TMP/notes.csv' '$TMP/notes.orig' &&
                 cmp -s '$TMP/keep.ckpt' '$TMP/keep.orig' && test -p '$TMP/save.fifo' && ! ls '$TMP'/thesis.txt.* '$TMP'/save.fifo.* >/dev/null 2>&1"
    expect_error 0 "validation loss" "checkpoint: --log-overwrite replaces it when the user says so" -- $p --steps 5 --log "$TMP/notes.csv" --log-overwrite --quiet
    check "checkpoint: ... with a log" bash -c "head -1 '$TMP/notes.csv' | grep -q '^step,train_loss,' && test \$(wc -l <'$TMP/notes.csv') = 6"
    # a file is this project's when it reads as one, whole, not when it begins as one would
    # (issue 36: 2, 3): a checkpoint's header, size and checksum; a log's every line; a summary's
    echo "MLPCKPT4 my notes" >"$TMP/mlp_notes.txt"
    cp "$TMP/mlp_notes.txt" "$TMP/mlp_notes.orig"
    expect_error 2 "--save '$TMP/mlp_notes.txt' exists and is not a checkpoint of this project \(a run replaces only its own files\): it is shorter than a checkpoint's header" \
        "checkpoint: --save onto notes that begin 'MLPCKPT4' is refused: a checkpoint is what reads as one (issue 36: 2)" \
        -- $p --model gpt --emb 16 --heads 2 --layers 2 --steps 2 --quiet --save "$TMP/mlp_notes.txt"
    cp "$TMP/keep.orig" "$TMP/flipped.ckpt"
    printf '\x01' | dd of="$TMP/flipped.ckpt" bs=1 seek=1000 conv=notrunc 2>/dev/null
    cp "$TMP/flipped.ckpt" "$TMP/flipped.orig"
    expect_error 2 "--save '$TMP/flipped.ckpt' exists and is not a checkpoint of this project .*: it is corrupt \(checksum mismatch\)" \
        "checkpoint: --save onto a checkpoint with a flipped byte is refused: its checksum is read (issue 36: 2)" -- $p --steps 5 --save "$TMP/flipped.ckpt"
    { echo "step,train_loss,val_loss,ms,tokens_per_s"; echo "1,my,own,notes,here"; } >"$TMP/own.csv"
    cp "$TMP/own.csv" "$TMP/own.csv.orig"
    expect_error 2 "--log '$TMP/own.csv' exists and is not a --log file of this project .*: it has a line 2 that is not a --log line" \
        "checkpoint: --log onto a CSV whose first line is a log's header is refused: every line is read (issue 36: 3)" -- $p --steps 5 --log "$TMP/own.csv"
    echo "program=my notes" >"$TMP/own.sum"
    cp "$TMP/own.sum" "$TMP/own.sum.orig"
    expect_error 2 "--summary '$TMP/own.sum' exists and is not a --summary file of this project .*: it ends at line 1, before its line 'layout=...'" \
        "checkpoint: --summary onto a file that begins 'program=' is refused (issue 36: 3)" -- $p --steps 5 --summary "$TMP/own.sum"
    check "checkpoint: ... and those files are untouched (issue 36: 2, 3)" \
        bash -c "cmp -s '$TMP/mlp_notes.txt' '$TMP/mlp_notes.orig' && cmp -s '$TMP/flipped.ckpt' '$TMP/flipped.orig' &&
                 cmp -s '$TMP/own.csv' '$TMP/own.csv.orig' && cmp -s '$TMP/own.sum' '$TMP/own.sum.orig'"
    run "$TMP/ours1" $p --steps 5 --quiet --samples 2 --save "$TMP/ours.ckpt" --log "$TMP/ours.csv" --summary "$TMP/ours.sum" --trace "$TMP/ours.json"
    expect_error 0 "validation loss" "checkpoint: a run's own checkpoint, log, summary and trace, whole, are replaced by the next run (issue 36: 2, 3)" \
        -- $p --steps 6 --quiet --samples 2 --save "$TMP/ours.ckpt" --log "$TMP/ours.csv" --summary "$TMP/ours.sum" --trace "$TMP/ours.json"
    # a summary that tools/summary.h refuses is not ours either (make fuzz found cli.h's
    # recogniser taking bubble=-2 and batch=0): both apply util.h's summary_value
    sed 's/bubble=[-0-9.]*/bubble=-2.0000/' "$TMP/ours.sum" >"$TMP/bub.sum"
    expect_error 2 "--summary '$TMP/bub.sum' exists and is not a --summary file of this project .*bubble=-2.0000 is not a number from -1 to 1" \
        "checkpoint: --summary onto a summary with bubble=-2, which tools/report refuses, is refused too" -- $p --steps 5 --summary "$TMP/bub.sum"
    sed 's/^batch=.*/batch=0/' "$TMP/ours.sum" >"$TMP/bub.sum"
    expect_error 2 "--summary '$TMP/bub.sum' exists and is not a --summary file of this project .*batch=0 is not a whole number from 1" \
        "checkpoint: --summary onto a summary with batch=0, which tools/report refuses, is refused too" -- $p --steps 5 --summary "$TMP/bub.sum"
    # a symbolic link given as an output is followed: the run writes the file it leads to, and
    # the link stays (issue 36: 4); before, a dangling one became a regular file
    rm -f "$TMP/lnk.ckpt" "$TMP/lnk_target.ckpt"*
    ln -s lnk_target.ckpt "$TMP/lnk.ckpt"
    run "$TMP/lnk1" $p --steps 5 --quiet --samples 0 --save "$TMP/lnk.ckpt"
    run "$TMP/lnk2" $p --steps 10 --quiet --samples 0 --load "$TMP/lnk.ckpt" --save "$TMP/lnk.ckpt"
    check "checkpoint: --save through a dangling symbolic link writes where it leads, and the link stays a link, through a resume and its rotation (issue 36: 4)" \
        bash -c "test -L '$TMP/lnk.ckpt' && test \"\$(readlink '$TMP/lnk.ckpt')\" = lnk_target.ckpt && test -f '$TMP/lnk_target.ckpt' &&
                 test -f '$TMP/lnk_target.ckpt.1' && ! test -e '$TMP/lnk.ckpt.1' && $p --load '$TMP/lnk.ckpt' --steps 10 --quiet --samples 0 >/dev/null"
    # tools/schedules --svg replaces only its own picture (issue 36: 1)
    echo precious >"$TMP/u.txt"
    expect_error 2 "tools/schedules --svg: '$TMP/u.txt' exists and is not a picture of tools/schedules \(a run replaces only its own files\)" \
        "checkpoint: tools/schedules --svg onto a user's file is refused (issue 36: 1)" -- tools/schedules --svg "$TMP/u.txt" 2 4
    run "$TMP/svg1" tools/schedules --svg "$TMP/own.svg" 2 4
    run "$TMP/svg2" tools/schedules --svg "$TMP/own.svg" 2 4
    local svg_status=$?
    check "checkpoint: ... the file untouched, and its own picture, whole, replaced (issue 36: 1)" \
        bash -c "test \"\$(cat '$TMP/u.txt')\" = precious && test $svg_status = 0 && tail -1 '$TMP/own.svg' | grep -qx '</svg>'"
    # a resumed run continues its own log (issue 31: 2): resumed from step 1000 with the log of a
    # run that went on to 1500 (a kill after the checkpoint), the log is cut at 1000 and continued,
    # and equals the log of a run never stopped, but for its timings
    run "$TMP/l2000" $p --steps 2000 --eval-every 500 --log "$TMP/l2000.csv" --quiet
    run "$TMP/l1000" $p --steps 1000 --eval-every 500 --log "$TMP/lr.csv" --save "$TMP/l1000.ckpt" --quiet
    run "$TMP/l1500" $p --steps 1500 --eval-every 500 --log "$TMP/lr.csv" --load "$TMP/l1000.ckpt" --save "$TMP/l1500.ckpt" --quiet
    local lines1500
    lines1500=$(wc -l <"$TMP/lr.csv")
    run "$TMP/lr" $p --steps 2000 --eval-every 500 --log "$TMP/lr.csv" --load "$TMP/l1000.ckpt" --quiet
    check "checkpoint: resumed with its own log, a run continues it: whole, steps 1 to 2000 ($lines1500 lines before, cut at step 1000), the same losses as a run never stopped" \
        bash -c "test $lines1500 = 1501 && cmp -s <(cut -d, -f1-3 '$TMP/lr.csv') <(cut -d, -f1-3 '$TMP/l2000.csv')"
    cp "$TMP/lr.csv" "$TMP/lr.orig"
    run "$TMP/l7" $p --steps 1000 --seed 7 --log "$TMP/l7.csv" --quiet --samples 0
    cp "$TMP/l7.csv" "$TMP/l7.orig"
    expect_error 1 "--log '$TMP/l7.csv' is not the log of the run that checkpoint '$TMP/l1000.ckpt' continues: its training losses of steps 1 to 1000 are not the ones the checkpoint records" \
        "checkpoint: resumed with another run's log, a run refuses to append to it" -- $p --steps 2000 --log "$TMP/l7.csv" --load "$TMP/l1000.ckpt"
    head -n 500 "$TMP/lr.orig" >"$TMP/short.csv"
    expect_error 1 "it has no line of step 500, and the checkpoint is at step 1000" "checkpoint: ... or a log that ends before the checkpoint's step" -- $p --steps 2000 --log "$TMP/short.csv" --load "$TMP/l1000.ckpt"
    expect_error 1 "does not record the run's losses \(it has format 2 or 3\)" "checkpoint: ... or a log a checkpoint of format 3 cannot vouch for" -- $p $old --optimizer adamw --steps 40 --load tests/old/format3_adamw.ckpt --log "$TMP/l7.csv"
    check "checkpoint: and those logs are untouched" cmp -s "$TMP/l7.csv" "$TMP/l7.orig"
    expect_error 0 "validation loss" "checkpoint: --log-overwrite starts another run's log anew" -- $p --steps 1200 --log "$TMP/l7.csv" --load "$TMP/l1000.ckpt" --log-overwrite --quiet
    check "checkpoint: ... from the steps it trains" bash -c "test \$(wc -l <'$TMP/l7.csv') = 201 && sed -n 2p '$TMP/l7.csv' | grep -q '^1001,'"
    # --save-every and --keep: checkpoints at 100, 200, 300 and the end, the last 3 kept
    run "$TMP/every" $p --steps 350 --save "$TMP/ev.ckpt" --save-every 100 --keep 3 --quiet
    run "$TMP/at300" $p --steps 300 --save "$TMP/at300.ckpt" --quiet
    check "checkpoint: --save-every 100 --keep 3 keeps FILE (step 350), FILE.1 (300, the same as a run to 300) and FILE.2, no more" \
        bash -c "cmp -s '$TMP/at300.ckpt' '$TMP/ev.ckpt.1' && test -e '$TMP/ev.ckpt.2' && ! test -e '$TMP/ev.ckpt.3' && cmp -s '$TMP/c1' '$TMP/c1'"
    cp names.txt "$TMP/data.txt"
    expect_error 2 "--log '$TMP/data.txt' is the --data file: refusing to start" "checkpoint: --log onto the data file is refused before step 1" -- $p --data "$TMP/data.txt" --log "$TMP/data.txt"
    expect_error 2 "--save '$TMP/data.txt' is the --data file" "checkpoint: --save onto the data file is refused" -- $p --data "$TMP/data.txt" --save "$TMP/data.txt"
    check "checkpoint: and the data file is untouched" cmp -s names.txt "$TMP/data.txt"
    # two spellings of one output, or an output at a name the rotation writes, before the file exists (audit 5: item 4)
    mkdir -p "$TMP/alias"
    expect_error 2 "--save '$TMP/al.ckpt' is also the --log file: refusing to start" "checkpoint: --save F --log dir/../F, F not there yet, is refused before step 1" -- $p --steps 5 --save "$TMP/al.ckpt" --log "$TMP/alias/../al.ckpt"
    expect_error 2 "--log '$TMP/al.ckpt.1' is '$TMP/al.ckpt.1', a name the --save rotation writes" "checkpoint: --log at FILE.1 of --save FILE (--keep 2) is refused before step 1" -- $p --steps 5 --save "$TMP/al.ckpt" --log "$TMP/al.ckpt.1"
    expect_error 2 "--summary '$TMP/./al.ckpt.2' is '$TMP/al.ckpt.2', a name the --save rotation writes" "checkpoint: --summary at FILE.2 with --keep 3, spelled otherwise, is refused" -- $p --steps 5 --save "$TMP/al.ckpt" --keep 3 --summary "$TMP/./al.ckpt.2"
    expect_error 0 "validation loss" "checkpoint: ... and FILE.1 is free with --keep 1" -- $p --steps 5 --save "$TMP/al.ckpt" --keep 1 --log "$TMP/al.ckpt.1" --quiet
    check "checkpoint: none of the refused runs wrote anything" bash -c "! test -e '$TMP/alias/al.ckpt' && test -e '$TMP/al.ckpt' && ! test -e '$TMP/al.ckpt.2'"
    expect_error 2 "--summary '$TMP/s120.ckpt' is the --load checkpoint" "checkpoint: --summary onto the --load checkpoint is refused" -- $p --load "$TMP/s120.ckpt" --steps 150 --summary "$TMP/s120.ckpt"
    expect_error 2 "--save '/nonexistent/x.ckpt' is in a folder that does not exist" "checkpoint: --save into a missing folder is refused before training, not after" -- $p --save /nonexistent/x.ckpt
    expect_error 2 "--save-every and --keep apply to --save FILE only" "checkpoint: --save-every without --save is refused" -- $p --save-every 10
    # --keep 1 and a file put at FILE during the run: the save stops, saying that the save (not
    # a rotation, which --keep 1 has none of) would replace it (issue 36: 13)
    rm -f "$TMP/k1.ckpt"*
    # (a time limit by timeout, not a subshell that kills it: a subshell killed as it starts runs
    # this script's EXIT trap, which removes $TMP)
    timeout 20 $p --steps 100000000 --save-every 200 --keep 1 --save "$TMP/k1.ckpt" --quiet --samples 0 >"$TMP/k1.out" 2>&1 &
    local k1=$!
    for _ in $(seq 1 50); do [ -s "$TMP/k1.ckpt" ] && break; sleep 0.1; done
    echo "my notes" >"$TMP/k1.notes" && mv "$TMP/k1.notes" "$TMP/k1.ckpt"
    wait $k1
    local k1_status=$?
    check "checkpoint: --keep 1, a file put at FILE during the run stops the save, exit 1, naming the save, not a rotation, the file untouched (issue 36: 13): $(grep -m1 error "$TMP/k1.out" | cut -c1-160)" \
        bash -c "test $k1_status = 1 && grep -q \"cannot save checkpoint '$TMP/k1.ckpt': the file there now is not a checkpoint of this project .*and the save would replace it; nothing was written\" '$TMP/k1.out' &&
                 ! grep -q rotation '$TMP/k1.out' && test \"\$(cat '$TMP/k1.ckpt')\" = 'my notes'"
    # the same, made likely to fall between a check and a rename: a save every step, the file
    # put at FILE (or, with --keep 3, at FILE.1) at a random moment, 20 runs. Checking the path and
    # then renaming over it lost the file in 3 runs of 20 each way; put_in_place swaps the two
    # names in one step and checks the old file where no one else writes (cli.h)
    race_save() { # KEEP SUFFIX: the file put at FILE SUFFIX
        local keep=$1 at=$2 lost=0 pid status
        for _ in $(seq 1 20); do
            rm -f "$TMP/race.ckpt"*
            timeout 20 $p --steps 100000000 --save-every 1 --keep "$keep" --save "$TMP/race.ckpt" --quiet --samples 0 >"$TMP/race.out" 2>&1 &
            pid=$!
            for _ in $(seq 1 500); do [ -s "$TMP/race.ckpt$at" ] && break; sleep 0.02; done
            [ -s "$TMP/race.ckpt$at" ] || { kill $pid; wait $pid; lost=$((lost + 1)); continue; } # (not saving after 10 s)
            sleep "0.0$((RANDOM % 9))"
            echo "my notes" >"$TMP/race.notes" && mv "$TMP/race.notes" "$TMP/race.ckpt$at"
            wait $pid
            status=$?
            { [ $status = 1 ] && [ "$(cat "$TMP/race.ckpt$at")" = "my notes" ]; } || lost=$((lost + 1))
        done
        check "checkpoint: --save-every 1 --keep $keep, a file put at FILE$at during a save, 20 runs: the save stops and the file is never replaced (lost, or never saving, in $lost)" test $lost = 0
    }
    race_save 1 ""
    race_save 3 .1
    # a --summary or --trace file put at its path during the run (once it has printed its
    # configuration, after the checks before step 1): the run ends without writing it
    local pid status
    for out in summary trace; do
        rm -f "$TMP/late.$out"
        timeout 60 $p --steps 30000 --$out "$TMP/late.$out" --samples 0 >"$TMP/late.out" 2>&1 &
        pid=$!
        for _ in $(seq 1 500); do grep -q '^  training' "$TMP/late.out" && break; sleep 0.02; done
        echo "my notes" >"$TMP/late.notes" && mv "$TMP/late.notes" "$TMP/late.$out"
        wait $pid
        status=$?
        check "checkpoint: a file put at the --$out path during the run is not replaced: exit 1, saying so ($(grep -m1 error "$TMP/late.out" | cut -c1-120))" \
            bash -c "test $status = 1 && grep -q \"cannot write $out '$TMP/late.$out': the file there now is not one of this project's .*appeared during the run\" '$TMP/late.out' && test \"\$(cat '$TMP/late.$out')\" = 'my notes'"
    done
    # SIGTERM: the step finishes, the checkpoint is written, the run exits 75 (stopped, to be resumed:
    # a scheduler requeues it; issue 36: 12), and resuming gives the same bits as never stopping. Under
    # tools/mpirun, which passes the signal to the ranks, the job's status is theirs, 75 too
    sigterm_resume() { # NAME COMMAND...: the command, stopped by SIGTERM after a second, then resumed to 40000 steps
        local name=$1
        shift
        rm -f "$TMP/sig.ckpt"* "$TMP/sig.csv"
        "$@" --steps 40000 --save "$TMP/sig.ckpt" --log "$TMP/sig.csv" --quiet --samples 0 >"$TMP/sig.out" 2>&1 &
        local pid=$!
        # training began: on a loaded machine a job of 2 ranks can take far more than 10 s to
        # start, and a signal before that stops no step (audit 5: item 9, seen with both cores busy)
        for _ in $(seq 1 1200); do [ "$(wc -l 2>/dev/null <"$TMP/sig.csv")" -gt 1 ] 2>/dev/null && break; sleep 0.1; done
        sleep 1
        kill -"${SIG:-TERM}" $pid
        wait $pid
        local status=$?
        run "$TMP/sig2.out" "$@" --steps 40000 --load "$TMP/sig.ckpt" --save "$TMP/sig.ckpt" --log "$TMP/sig.csv" --quiet --samples 0
        check "checkpoint: $name stopped by SIG${SIG:-TERM} (exit $status, $(grep -o 'after step [0-9]*' "$TMP/sig.out")) exits 75 (issue 36: 12), saves, and resumes to the same bits as a run never stopped" \
            bash -c "test $status = 75 && grep -q 'stopped by a signal after step [0-9]*: .*(exit status 75' '$TMP/sig.out' && cmp -s '$TMP/sig.ckpt' '$TMP/nonstop.ckpt'"
        check "checkpoint: ... and its --log, continued by the resumed run, is whole: the losses of steps 1 to 40000 of a run never stopped" \
            cmp -s <(cut -d, -f1-3 "$TMP/sig.csv") <(cut -d, -f1-3 "$TMP/nonstop.csv")
    }
    run "$TMP/nonstop" $p --steps 40000 --save "$TMP/nonstop.ckpt" --log "$TMP/nonstop.csv" --quiet --samples 0
    sigterm_resume "train.c" $p
    sigterm_resume "train_dp.c on 2 ranks" $MPIRUN -n 2 ./train_dp
    SIG=HUP sigterm_resume "train.c (SIGHUP: a closed terminal)" $p
    SIG=HUP sigterm_resume "train_dp.c on 2 ranks under tools/mpirun (SIGHUP)" $MPIRUN -n 2 ./train_dp
    # a scheduler signals every process of a job and mpirun forwards what it got: two signals a
    # moment apart are one request, and the run still saves (before, the second ended it at once)
    rm -f "$TMP/sig2.ckpt"*
    $p --steps 100000000 --save "$TMP/sig2.ckpt" --quiet --samples 0 >"$TMP/sig2.out" 2>&1 &
    local twice=$!
    sleep 1
    kill -TERM $twice
    sleep 0.05
    kill -TERM $twice 2>/dev/null
    wait $twice
    local twice_status=$?
    step=$(od -An -t d8 -j 40 -N 8 "$TMP/sig2.ckpt" 2>/dev/null | tr -d ' ')
    check "checkpoint: two SIGTERMs 50 ms apart are one stop: saved (step ${step:-none}), exit $twice_status (issue 36: 12)" \
        bash -c "test $twice_status = 75 && test -n '$step' && $p --load '$TMP/sig2.ckpt' --steps '$step' --quiet --samples 0 >/dev/null"
    # a stopped rank (SIGSTOP: a stuck node) is caught by the watchdog, which says where the others wait
    (timeout 60 $MPIRUN -n 2 ./train_dp --steps 100000000 --timeout 2 --quiet >"$TMP/wd.out" 2>&1) &
    local job=$! victim="" t0
    for _ in $(seq 1 50); do victim=$(pgrep -f "^./train_dp --steps 100000000" | tail -1); [ -n "$victim" ] && break; sleep 0.1; done
    sleep 1
    kill -STOP $victim 2>/dev/null
    t0=$(date +%s)
    wait $job
    local took=$(($(date +%s) - t0))
    pkill -KILL -f "train_dp --steps 100000000" 2>/dev/null
    check "checkpoint: a rank stopped with SIGSTOP ends the job in ${took} s with the watchdog's message (--timeout 2)" \
        bash -c "test $took -le 10 && grep -q 'watchdog: no training step finished in 2 s.*waiting for a collective of the dp group' '$TMP/wd.out'"
}

# ----------------------------------------------------------------------------
# Every bad input, to every MPI program: one message (printed once, not once per rank), a
# non-zero exit, and the outputs the run was told to write untouched
section_faults() {
    { for i in $(seq 1 20); do echo "name$i"; done; printf 'bad\0name\n'; } >"$TMP/f_nul.txt"
    { for i in $(seq 1 20); do echo "name$i"; done; printf 'Jos\xc3\xa9 \xc0\xaf\n'; } >"$TMP/f_utf8.txt"
    run "$TMP/f0" ./train --steps 20 --save "$TMP/f_good.ckpt" --log "$TMP/f_good.csv" --quiet --samples 0
    cp "$TMP/f_good.ckpt" "$TMP/f_flip.ckpt"
    printf '\x01' | dd of="$TMP/f_flip.ckpt" bs=1 seek=1000 conv=notrunc 2>/dev/null
    head -c 3000 "$TMP/f_good.ckpt" >"$TMP/f_trunc.ckpt"
    cp names.txt "$TMP/f_data.txt"
    echo "my notes" >"$TMP/f_notes.txt"
    mkfifo "$TMP/f_fifo"
    run "$TMP/f7" ./train --steps 20 --seed 7 --log "$TMP/f_l7.orig" --quiet --samples 0
    local prog name input pattern status
    for prog in "train_dp" "train_fsdp --zero 3" "train_tp" "train_pp --schedule 1f1b" "train_3d --dp 1 --tp 1 --pp 2"; do
        name=${prog%% *}
        while IFS='|' read -r input status pattern; do
            # the outputs hold a checkpoint and a log of this project, which a failed run leaves as they were
            cp "$TMP/f_good.ckpt" "$TMP/f_out.ckpt"
            cp "$TMP/f_good.csv" "$TMP/f_out.csv"
            run "$TMP/f_err" $MPIRUN -n 2 ./$prog $input --steps 30 --save "$TMP/f_out.ckpt" --log "$TMP/f_out.csv" </dev/null
            local got=$? said
            said=$(grep -c '^error: ' "$TMP/f_err")
            if [ $got = "$status" ] && [ "$said" = 1 ] && grep -Eq -- "$pattern" "$TMP/f_err" &&
                cmp -s "$TMP/f_out.ckpt" "$TMP/f_good.ckpt" && cmp -s "$TMP/f_out.csv" "$TMP/f_good.csv"; then
                pass "faults: $name $input: '$pattern' once, exit $got, its outputs untouched"
            else
                fail "faults: $name $input (exit $got, expected $status; $said error lines; $(grep -m2 error "$TMP/f_err" | tr '\n' '|'); outputs: $(cmp "$TMP/f_out.ckpt" "$TMP/f_good.ckpt" 2>&1; cmp "$TMP/f_out.csv" "$TMP/f_good.csv" 2>&1))"
            fi
        done <<EOT
--data $TMP/none.txt|1|cannot open data file
--data $TMP/f_nul.txt|1|f_nul.txt:21: NUL byte at column 4
--data $TMP/f_utf8.txt|1|f_utf8.txt:21: invalid UTF-8 at column 6 \(bytes c0 af\): an overlong encoding
--data /dev/zero|1|data file '/dev/zero' is a device, not a regular file
--data $TMP/f_fifo|1|data file '$TMP/f_fifo' is a named pipe
--load $TMP/f_fifo|1|checkpoint '$TMP/f_fifo' is a named pipe
--load $TMP/f_flip.ckpt|1|checksum mismatch
--load $TMP/f_trunc.ckpt|1|corrupt or truncated
--load $TMP/f_good.ckpt --hidden 32|1|is of a different model
--load $TMP/f_good.ckpt --seed 7|1|other settings: --seed 42 \(now 7\)
--lr 1e-50|2|--lr must be above 0 and is too small
--data $TMP/f_data.txt --summary $TMP/f_data.txt|2|is the --data file: refusing to start
--summary $TMP/f_notes.txt|2|--summary '$TMP/f_notes.txt' exists and is not a --summary file of this project
--trace $TMP/f_fifo|2|--trace '$TMP/f_fifo' is a named pipe, not a regular file
EOT
        # and the outputs themselves: a user's file, as --save or --log, refused before step 1 on every rank
        while IFS='|' read -r input pattern; do
            run "$TMP/f_err" $MPIRUN -n 2 ./$prog --steps 30 $input </dev/null
            local got=$? said
            said=$(grep -c '^error: ' "$TMP/f_err")
            if [ $got = 2 ] && [ "$said" = 1 ] && grep -Eq -- "$pattern" "$TMP/f_err" && [ "$(cat "$TMP/f_notes.txt")" = "my notes" ] &&
                ! grep -q '^configuration' "$TMP/f_err"; then
                pass "faults: $name $input: refused before step 1, once, exit 2, the file untouched"
            else
                fail "faults: $name $input (exit $got; $said error lines; $(grep -m2 error "$TMP/f_err" | tr '\n' '|'); $(cat "$TMP/f_notes.txt"))"
            fi
        done <<EOT
--save $TMP/f_notes.txt|--save '$TMP/f_notes.txt' exists and is not a checkpoint of this project
--log $TMP/f_notes.txt|--log '$TMP/f_notes.txt' exists and is not a --log file of this project .*--log-overwrite
--save $TMP/f_fifo|--save '$TMP/f_fifo' is a named pipe, not a regular file
EOT
        expect_error 2 "--save '' is empty: give a file name" "faults: $name --save '': refused before step 1" -- $MPIRUN -n 2 ./$prog --steps 30 --save ''
        # a resume continues its own run's log, and refuses another run's (once, exit 1, the log untouched)
        cp "$TMP/f_good.csv" "$TMP/f_own.csv"
        run "$TMP/f_err" $MPIRUN -n 2 ./$prog --steps 30 --load "$TMP/f_good.ckpt" --log "$TMP/f_own.csv" --quiet </dev/null
        check "faults: $name resumed from step 20 with its run's log continues it (steps 1 to 30)" \
            bash -c "test \$(wc -l <'$TMP/f_own.csv') = 31 && cmp -s <(head -21 '$TMP/f_own.csv') '$TMP/f_good.csv' && sed -n 31p '$TMP/f_own.csv' | grep -q '^30,'"
        cp "$TMP/f_l7.orig" "$TMP/f_l7.csv"
        expect_error 1 "is not the log of the run that checkpoint .* continues" "faults: $name resumed with another run's log refuses it" \
            -- $MPIRUN -n 2 ./$prog --steps 30 --load "$TMP/f_good.ckpt" --log "$TMP/f_l7.csv"
        check "faults: ... once, and the log untouched" bash -c "test \$(grep -c '^error: ' '$TMP/err') = 1 && cmp -s '$TMP/f_l7.csv' '$TMP/f_l7.orig'"
    done
    check "faults: and the data file given as an output is untouched" cmp -s names.txt "$TMP/f_data.txt"
    for prog in train_dp "train_fsdp --zero 2"; do # the programs that train the GPT too
        expect_error 1 "is of the MLP and this run trains the GPT: leave out --model gpt" "faults: ${prog%% *} resuming an MLP's checkpoint with --model gpt is refused, naming the flag" \
            -- $MPIRUN -n 2 ./$prog --load "$TMP/f_good.ckpt" --model gpt
    done
    # which program resumes which checkpoint (issue 31: 12): train_ep trains mixtures only, train_dp dense models only
    run "$TMP/f_moe" ./train --experts 4 --steps 10 --save "$TMP/f_moe.ckpt" --quiet --samples 0
    expect_error 1 "is of a dense model and this run has --experts 2: resume it without --experts, with train.c, train_dp, train_fsdp, train_tp, train_pp or train_3d" \
        "faults: train_ep given a dense checkpoint names the programs that resume it (not 'leave out --experts')" -- $MPIRUN -n 2 ./train_ep --experts 2 --load "$TMP/f_good.ckpt"
    expect_error 1 "is of a mixture of 4 experts and this run's model has 0: resume it with --experts 4, with train.c or train_ep" \
        "faults: train_dp given a checkpoint of experts names the programs that resume it" -- $MPIRUN -n 2 ./train_dp --load "$TMP/f_moe.ckpt"
    # which program resumes which: a dense GPT also train_cp and train_3d, a GPT's experts also train_3d (issue 36: 11)
    run "$TMP/f_gpt" ./train --model gpt --emb 16 --heads 2 --layers 1 --steps 3 --save "$TMP/f_gpt.ckpt" --quiet --samples 0
    run "$TMP/f_gptmoe" ./train --model gpt --emb 16 --heads 2 --layers 1 --experts 2 --steps 3 --save "$TMP/f_gptmoe.ckpt" --quiet --samples 0
    expect_error 1 "is of a dense model and this run has --experts 2: resume it without --experts, with train.c, train_dp, train_fsdp, train_tp, train_pp, train_cp or train_3d \\(rank" \
        "faults: train_ep given a dense GPT's checkpoint names every program that resumes it, train_cp and train_3d too (issue 36: 11)" \
        -- $MPIRUN -n 2 ./train_ep --model gpt --emb 16 --heads 2 --layers 1 --experts 2 --load "$TMP/f_gpt.ckpt"
    expect_error 1 "is of a mixture of 2 experts and this run's model has 0: resume it with --experts 2, with train.c, train_ep or train_3d \(--ep\)" \
        "faults: train_dp given a GPT's checkpoint of experts names train_3d too (issue 36: 11)" \
        -- $MPIRUN -n 2 ./train_dp --model gpt --emb 16 --heads 2 --layers 1 --load "$TMP/f_gptmoe.ckpt"
    # a flag given twice, refused by every rank alike: one message, exit 2 (issue 36: 14)
    expect_error 2 "--schedule is given twice \('1f1b', then 'gpipe'\)" "faults: train_pp --schedule 1f1b --schedule gpipe is refused (issue 36: 14)" \
        -- $MPIRUN -n 2 ./train_pp --schedule 1f1b --schedule gpipe --steps 1
    check "faults: ... once" test "$(grep -c '^error: ' "$TMP/err")" = 1
    # a full disk under the job's standard output: mpirun drops what it cannot write and exits 0;
    # tools/mpirun says so once and exits 1, as ./train does (issue 36: 5)
    expect_error 1 "^error: cannot write the standard output of the job \(No space left on device\)" \
        "faults: train_cp on 2 ranks with its standard output on a full disk exits 1 (issue 36: 5)" \
        -- bash -c "$MPIRUN -n 2 ./train_cp --model gpt --steps 2 --emb 16 --heads 2 --layers 1 >/dev/full"
    check "faults: ... with one message" test "$(grep -c '^error: ' "$TMP/err")" = 1
    expect_error 2 "--top-k must be an integer from 1 to 8, got '0'" "faults: train_ep --top-k 0 says 1 to 8" -- $MPIRUN -n 2 ./train_ep --experts 2 --top-k 0
    expect_error 2 "unexpected argument '--eval-every' after '--'" "faults: train_ep -- --eval-every 0 says why" -- $MPIRUN -n 2 ./train_ep --experts 2 -- --eval-every 0
}

# ----------------------------------------------------------------------------
section_dp() {
    local flags="--steps 200 --eval-every 100"
    for opt in sgd adamw; do
        reference dp_$opt $flags --optimizer $opt
        for n in 2 3 4; do
            same_as dp_$opt "dp: $n ranks, $opt, same as train.c" $MPIRUN -n $n ./train_dp $flags --optimizer $opt
            same_as dp_$opt "dp: $n ranks, $opt, --overlap, same as train.c" \
                $MPIRUN -n $n ./train_dp $flags --optimizer $opt --overlap --bucket-kb 4
        done
    done
    # a resume: train.c's checkpoint at step 120, continued on 2 ranks, is train.c's run of 200 steps
    run "$TMP/r120" ./train ${flags/--steps 200/--steps 120} --optimizer adamw --save "$TMP/dp_r120.ckpt" --quiet
    same_as dp_adamw "dp: 2 ranks resume train.c's AdamW checkpoint of step 120, same as train.c's 200 steps" \
        $MPIRUN -n 2 ./train_dp $flags --optimizer adamw --load "$TMP/dp_r120.ckpt"
    # 27 rows on 4 ranks (7, 7, 7, 6), three layers, clipping
    flags="--steps 150 --eval-every 0 --batch 27 --layers 3 --clip 0.5 --optimizer adamw"
    reference dp_odd $flags
    same_as dp_odd "dp: 27 rows on 4 ranks, L=3, clipping, same as train.c" $MPIRUN -n 4 ./train_dp $flags
    # a ring's pieces (dist.h): 393217 gradient sums cut into chunks of 3 x 64Ki + 1 and
    # 3 x 64Ki elements on 2 ranks and on 3, so the shorter chunks' last piece is empty
    flags="--steps 6 --eval-every 0 --emb 10 --hidden 2090 --clip 0.5"
    reference dp_pieces $flags
    for n in 2 3; do
        same_as dp_pieces "dp: $n ranks, 393217 sums in ring pieces of 64Ki, one piece empty, same as train.c" \
            $MPIRUN -n $n ./train_dp $flags
    done
    # weight averaging: the same update in exact arithmetic, not bit for bit (docs/exactness.md)
    reference dp_w --steps 50 --eval-every 0
    for n in 2 3 4; do
        run "$TMP/w.out" $MPIRUN -n $n ./train_dp --sync weights --steps 50 --eval-every 0 --quiet \
            --log "$TMP/w.csv" --save "$TMP/w.ckpt"
        check "dp: --sync weights on $n ranks stays within 1e-6 of train.c over 50 steps ($(tools/compare \
            "$TMP/dp_w.csv" "$TMP/w.csv" "$TMP/dp_w.ckpt" "$TMP/w.ckpt"))" \
            tools/compare --tolerance 1e-6 "$TMP/dp_w.csv" "$TMP/w.csv" "$TMP/dp_w.ckpt" "$TMP/w.ckpt"
    done
    expect_error 2 "4 ranks but a batch of 3 rows" "dp: more ranks than rows is refused on every rank" -- $MPIRUN -n 4 ./train_dp --batch 3
    expect_error 2 "--sync weights works with sgd and no --clip only" "dp: --sync weights with adamw is refused, saying why" -- $MPIRUN -n 2 ./train_dp --sync weights --optimizer adamw
    expect_error 2 "--sync weights works with sgd and no --clip only" "dp: --sync weights with --clip is refused, not ignored" -- $MPIRUN -n 2 ./train_dp --sync weights --clip 1
    expect_error 2 "--sync must be grads or weights" "dp: a bad --sync is refused" -- $MPIRUN -n 2 ./train_dp --sync both
    expect_error 2 "--bucket-kb must be an integer from 1" "dp: --bucket-kb 0 is refused" -- $MPIRUN -n 2 ./train_dp --overlap --bucket-kb 0
    expect_error 2 "unknown flag '--zero'" "dp: a flag of another program is refused" -- $MPIRUN -n 2 ./train_dp --zero 2
    expect_error 1 "cannot open data file" "dp: a missing data file ends every rank" -- $MPIRUN -n 3 ./train_dp --data /nonexistent
}

# ----------------------------------------------------------------------------
# --reduce fp32 and bf16 (optim.h): the pieces of a gradient sum added as floats, in order
section_precision() {
    # --precision bf16: every layout gives train.c --precision bf16's bits, the MLP's and the GPT's
    local flags="--steps 30 --eval-every 10 --samples 3 --precision bf16" m g="--model gpt --emb 16 --heads 4 --layers 2"
    reference bf_mlp $flags
    reference fp_mlp ${flags/--precision bf16/--precision fp32}
    check "precision: train.c --precision bf16 trains otherwise than fp32 (the losses differ by step 2)" \
        awk -F, 'NR == FNR { a[$1] = $2; next } $1 == 2 && $2 == a[2] { bad = 1 } END { exit bad }' "$TMP/fp_mlp.csv" "$TMP/bf_mlp.csv"
    same_as bf_mlp "precision: train_dp, bf16, 2 ranks x 2 microbatches, same as train.c --precision bf16" $MPIRUN -n 2 ./train_dp $flags --microbatches 2
    same_as bf_mlp "precision: train_fsdp --zero 3 --prefetch, bf16, 3 ranks, same as train.c" $MPIRUN -n 3 ./train_fsdp $flags --zero 3 --prefetch
    same_as bf_mlp "precision: train_tp, bf16, 3 ranks, same as train.c" $MPIRUN -n 3 ./train_tp $flags
    same_as bf_mlp "precision: train_pp, bf16, 2 stages, zb1, 4 microbatches, same as train.c" $MPIRUN -n 2 ./train_pp $flags --schedule zb1 --microbatches 4
    reference bf_mlp3 $flags --layers 3
    same_as bf_mlp3 "precision: train_3d 2 x 2 x 2, bf16, interleaved, 3 layers, same as train.c" \
        $MPIRUN -n 8 ./train_3d --tp 2 --dp 2 --pp 2 --schedule interleaved $flags --layers 3
    reference bf_moe $flags --experts 4 --top-k 2
    same_as bf_moe "precision: train_ep, bf16, 4 experts on 2 ranks, top-2, same as train.c" $MPIRUN -n 2 ./train_ep $flags --experts 4 --top-k 2
    flags="$g --steps 20 --eval-every 10 --samples 3 --precision bf16"
    reference bf_gpt $flags
    reference fp_gpt ${flags/--precision bf16/--precision fp32}
    check "precision: the GPT's --precision bf16 trains otherwise than fp32" \
        sh -c "! tools/compare '$TMP/fp_gpt.csv' '$TMP/bf_gpt.csv' '$TMP/fp_gpt.ckpt' '$TMP/bf_gpt.ckpt'" 2>/dev/null
    same_as bf_gpt "precision: gpt, train_tp --sp, bf16, 2 ranks, same as train.c" $MPIRUN -n 2 ./train_tp --sp $flags
    same_as bf_gpt "precision: gpt, train_cp, bf16, ring, 2 ranks, same as train.c" $MPIRUN -n 2 ./train_cp $flags
    same_as bf_gpt "precision: gpt, train_cp, bf16, alltoall (Ulysses), 2 ranks, same as train.c" $MPIRUN -n 2 ./train_cp --cp-comm alltoall $flags
    same_as bf_gpt "precision: gpt, train_pp, bf16, dualpipev, 2 stages, same as train.c" $MPIRUN -n 2 ./train_pp --schedule dualpipev --microbatches 4 $flags
    same_as bf_gpt "precision: gpt, 4d --tp 2 --cp 2 --pp 2 --dp 1, bf16, same as train.c" $MPIRUN -n 8 ./train_3d --tp 2 --cp 2 --pp 2 --dp 1 $flags
    reference bf_gpt_rc $flags --recompute selective --experts 4 --top-k 2 --router sigmoid --balance bias --microbatches 2
    same_as bf_gpt_rc "precision: gpt, 4 experts, sigmoid and bias, selective recomputation, bf16, train_3d --ep 2 --dp 2 --cp 2, same as train.c" \
        $MPIRUN -n 4 ./train_3d --tp 1 --cp 2 --pp 1 --dp 2 --ep 2 $flags --recompute selective --experts 4 --top-k 2 --router sigmoid --balance bias --microbatches 2
    same_as bf_gpt_rc "precision: gpt, 4 experts, sigmoid and bias, selective recomputation, bf16, train_ep on 2 ranks, same as train.c" \
        $MPIRUN -n 2 ./train_ep $flags --recompute selective --experts 4 --top-k 2 --router sigmoid --balance bias --microbatches 2
    # the checkpoint records the precision: a resume in the other one is refused, naming it
    expect_error 1 "trained with other settings: --precision bf16 \(now fp32\);" \
        "precision: a bf16 checkpoint resumed in fp32 is refused, naming --precision" -- ./train --load "$TMP/bf_mlp.ckpt" --steps 40 --samples 0
    run "$TMP/pr.out" ./train --load "$TMP/fp_mlp.ckpt" --steps 40 --samples 0 --eval-every 0 --precision bf16 --allow-changes
    check "precision: with --allow-changes an fp32 checkpoint goes on in bf16 (the master weights are fp32 in both)" \
        grep -q "^  changed    from the checkpoint.s settings (--allow-changes): --precision fp32 (now bf16);" "$TMP/pr.out"
    # memory: bf16 holds the same bytes a parameter as fp32 (no bf16 copy), measured = formula
    # under ZeRO-3, and says so beside the field's 16 and 18 (issue 46: item 5)
    local z="--zero 3 --optimizer adamw --steps 5 --samples 0 --eval-every 0"
    run "$TMP/mem32.out" $MPIRUN -n 2 ./train_fsdp $z
    run "$TMP/mem16.out" $MPIRUN -n 2 ./train_fsdp $z --precision bf16
    check "precision: ZeRO-3 in bf16 holds what fp32 holds, memory = formula on each rank, and says why beside ZeRO's 16 and Megatron-LM's 18 B a parameter" \
        bash -c "diff <(grep '^  rank' '$TMP/mem32.out' | sed 's/.*| memory//') <(grep '^  rank' '$TMP/mem16.out' | sed 's/.*| memory//') && \
                 grep '^  rank' '$TMP/mem16.out' | sed 's/.*= \(.*\) (formula \(.*\))/\1 \2/' | awk '\$1 != \$3 || \$2 != \$4 { exit 1 }' && \
                 grep -q '^  bf16 holds what fp32 holds: 4 B a parameter .* 16 in ZeRO.s mixed-precision table and 18 in Megatron-LM.s' '$TMP/mem16.out' && \
                 ! grep -q 'bf16 holds' '$TMP/mem32.out'"
    reference bf_half --steps 15 --eval-every 10 --samples 3 --precision bf16
    same_as bf_mlp "precision: train_tp resumes train.c's bf16 checkpoint of step 15, same as its own 30 steps" \
        $MPIRUN -n 2 ./train_tp --steps 30 --eval-every 10 --samples 3 --precision bf16 --load "$TMP/bf_half.ckpt"
    check "precision: a checkpoint is written in format 8" bash -c "head -c 8 '$TMP/bf_mlp.ckpt' | grep -q MLPCKPT8"
    expect_error 2 "--precision must be fp32 or bf16, got 'fp16'" "precision: --precision fp16 is refused (not built)" -- ./train --precision fp16
    expect_error 2 "--precision must be fp32 or bf16" "precision: a bad --precision is refused on every rank" -- $MPIRUN -n 2 ./train_3d --precision half
}
section_reduce() {
    local flags="--steps 30 --eval-every 0" how n
    reference red_exact $flags --microbatches 2
    for how in fp32 bf16; do
        # two ranks' pieces are train.c's two microbatches, added in the same order
        reference red_$how $flags --reduce $how --microbatches 2
        same_as red_$how "reduce: --reduce $how on 2 ranks, same as train.c --reduce $how --microbatches 2" \
            $MPIRUN -n 2 ./train_dp $flags --reduce $how
        same_as red_$how "reduce: --reduce $how on 2 ranks, --overlap, same as train.c --reduce $how --microbatches 2" \
            $MPIRUN -n 2 ./train_dp $flags --reduce $how --overlap --bucket-kb 4
        same_as red_$how "reduce: --reduce $how on 1 rank, 2 microbatches, same as train.c" \
            $MPIRUN -n 1 ./train_dp $flags --reduce $how --microbatches 2
        # FSDP2's reduce_dtype: on 2 ranks every ZeRO stage adds the same two pieces
        for n in 1 2 3; do
            same_as red_$how "reduce: train_fsdp --zero $n --reduce $how on 2 ranks, same as train.c --reduce $how --microbatches 2" \
                $MPIRUN -n 2 ./train_fsdp $flags --zero $n --reduce $how
        done
        # one piece is the reference itself
        reference red1_$how $flags --reduce $how
        same_as red1_$how "reduce: --reduce $how on 1 rank, same as train.c --reduce $how" \
            $MPIRUN -n 1 ./train_dp $flags --reduce $how
        run "$TMP/red.out" ./train $flags --reduce $how --samples 0
        check "reduce: train.c --reduce $how with one piece says it has its own bits" \
            grep -q "^--reduce $how: 1 microbatch a step, added in $how: every step's sums equal the whole batch's sum rounded once to $how, so this run has the bits of ./train --reduce $how (one microbatch)" "$TMP/red.out"
        # two pieces part from it at step 1: the losses agree at step 1 and differ from step 2
        run "$TMP/red.out" ./train $flags --reduce $how --microbatches 2 --samples 0
        check "reduce: train.c --reduce $how --microbatches 2 says it parts at step 1, from step 2 on" \
            grep -Eq "^--reduce $how: 2 microbatches a step, added in $how: at step 1, [0-9]+ of 18635 sums first differed .*, the sums of ./train --reduce $how \\(one microbatch\\), so from step 2 on this run's losses may differ" "$TMP/red.out"
        check "reduce: --reduce $how, 2 pieces: step 1's loss is the one piece's, step 2's is not" \
            awk -F, 'NR == FNR { a[$1] = $2; next } $1 == 1 && $2 != a[1] { bad = 1 } $1 == 2 && $2 == a[2] { bad = 1 }
                     END { exit bad }' "$TMP/red1_$how.csv" "$TMP/red_$how.csv"
        check "reduce: --reduce $how's checkpoint differs from --reduce exact's after 30 steps" \
            sh -c "! tools/compare '$TMP/red_$how.csv' '$TMP/red_exact.csv' '$TMP/red_$how.ckpt' '$TMP/red_exact.ckpt'" 2>/dev/null
    done
    # --reduce exact is the default: any layout, train.c's bits
    reference red_x $flags
    same_as red_x "reduce: --reduce exact on 3 ranks x 2 microbatches, same as train.c" \
        $MPIRUN -n 3 ./train_dp $flags --reduce exact --microbatches 2
    # three ranks add in the ring's order, which is no microbatch order of train.c's, but
    # always the same: two runs agree, and each says it parts from the one piece
    for n in 1 2; do
        rm -f "$TMP/red3_$n".*
        run "$TMP/red3_$n.out" $MPIRUN -n 3 ./train_dp $flags --reduce fp32 --samples 0 --log "$TMP/red3_$n.csv" --save "$TMP/red3_$n.ckpt"
    done
    check "reduce: --reduce fp32 on 3 ranks gives the same bits twice" \
        tools/compare "$TMP/red3_1.csv" "$TMP/red3_2.csv" "$TMP/red3_1.ckpt" "$TMP/red3_2.ckpt"
    check "reduce: --reduce fp32 on 3 ranks says from which step it parts from ./train --reduce fp32" \
        grep -Eq "^--reduce fp32: 3 ranks x 1 microbatch a step, added in fp32: at step 1, [0-9]+ of 18635 sums first differed" "$TMP/red3_1.out"
    # with 2 microbatches on 2 ranks, ZeRO-1 adds each rank's passes first, as train_dp does;
    # ZeRO-2 and -3 reduce-scatter each pass, adding the ranks first: (a + b) + (c + d)
    local m2="$flags --reduce fp32 --microbatches 2" t
    for t in dp z1 z2 z3; do rm -f "$TMP/red_$t".*; done
    run "$TMP/red_dp.out" $MPIRUN -n 2 ./train_dp $m2 --quiet --log "$TMP/red_dp.csv" --save "$TMP/red_dp.ckpt"
    for n in 1 2 3; do
        run "$TMP/red_z$n.out" $MPIRUN -n 2 ./train_fsdp $m2 --zero $n $([ $n = 3 ] && echo --prefetch) --quiet \
            --log "$TMP/red_z$n.csv" --save "$TMP/red_z$n.ckpt"
    done
    check "reduce: train_fsdp --zero 1 --reduce fp32, 2 ranks x 2 microbatches, same as train_dp's" \
        tools/compare "$TMP/red_dp.csv" "$TMP/red_z1.csv" "$TMP/red_dp.ckpt" "$TMP/red_z1.ckpt"
    check "reduce: train_fsdp --zero 2 and --zero 3 --prefetch, --reduce fp32, 2 ranks x 2 microbatches, the same bits" \
        tools/compare "$TMP/red_z2.csv" "$TMP/red_z3.csv" "$TMP/red_z2.ckpt" "$TMP/red_z3.ckpt"
    check "reduce: train_fsdp --zero 3 --reduce fp32, 2 ranks x 2 microbatches, parts from train_dp's at step 2" \
        bash -c "tools/compare '$TMP/red_dp.csv' '$TMP/red_z3.csv' '$TMP/red_dp.ckpt' '$TMP/red_z3.ckpt' | grep -q '^differ: first at step 2;'"
    run "$TMP/red.out" $MPIRUN -n 3 ./train_fsdp $flags --zero 3 --reduce bf16 --samples 0
    check "reduce: train_fsdp --reduce bf16 on 3 ranks counts the sums that differed over every shard, of all 18635" \
        grep -Eq "^--reduce bf16: 3 ranks x 1 microbatch a step, added in bf16: at step 1, [0-9]{4,} of 18635 sums first differed" "$TMP/red.out"
    # what travels: the gradients as 4 or 2 bytes, measured equal to the formula
    for how in fp32 bf16; do
        run "$TMP/red.out" $MPIRUN -n 2 ./train_dp --steps 5 --eval-every 0 --samples 0 --reduce $how
        check "reduce: --reduce $how on 2 ranks sends what its formula says, and holds it" \
            awk '/^  rank/ { n++; if (!match($0, /sent [0-9.]+ [KM]?B \(formula [0-9.]+ [KM]?B\)/)) bad = 1
                                     split(substr($0, RSTART, RLENGTH), a, /[ ()]+/); if (a[2] a[3] != a[5] a[6]) bad = 1
                                     if (!match($0, /= [0-9.]+ [KM]?B \(formula [0-9.]+ [KM]?B\)/)) bad = 1
                                     split(substr($0, RSTART, RLENGTH), a, /[ ()]+/); if (a[2] a[3] != a[5] a[6]) bad = 1 }
                 END { exit bad || n != 2 }' "$TMP/red.out"
        for n in 1 2 3; do
            accounting "reduce: train_fsdp --zero $n --reduce $how on 2 ranks" 0 $MPIRUN -n 2 ./train_fsdp --zero $n --reduce $how
        done
    done
    # make diverge's picture and table, at 60 steps
    if command -v python3 >/dev/null; then
        run "$TMP/dv.out" env OUT="$TMP/dv" STEPS=60 python3 tools/diverge.py
        check "reduce: make diverge draws 15 curves in well-formed XML, a panel per --reduce" \
            bash -c "xmllint --noout '$TMP/dv/diverge.svg' && test \$(grep -c '<polyline' '$TMP/dv/diverge.svg') = 15"
        check "reduce: make diverge's table: exact's layouts never differ, fp32's and bf16's from step 2" \
            awk -F' [|] ' '$3 == "(the reference)" { next } $1 == "| exact" { e++; if ($3 != "never") bad = 1 }
                           $1 == "| fp32" || $1 == "| bf16" { f++; if ($3 != 2) bad = 1 } END { exit bad || e < 4 || f != 2 * e }' "$TMP/dv/diverge.md"
    else
        skip "reduce: make diverge (python3 is not installed)"
    fi
    expect_error 2 "--reduce must be exact, fp32 or bf16" "reduce: a bad --reduce is refused" -- ./train --reduce fp16
    expect_error 2 "--reduce must be exact, fp32 or bf16" "reduce: a bad --reduce is refused on every rank" -- $MPIRUN -n 2 ./train_dp --reduce float
    expect_error 2 "--reduce applies to --sync grads only" "reduce: --reduce with --sync weights is refused" -- $MPIRUN -n 2 ./train_dp --sync weights --reduce fp32
    expect_error 2 "--reduce must be exact, fp32 or bf16" "reduce: a bad --reduce is refused by train_fsdp" -- $MPIRUN -n 2 ./train_fsdp --reduce int8
    expect_error 2 "unknown flag '--reduce'" "reduce: train_3d does not take --reduce yet, and says so" -- $MPIRUN -n 2 ./train_3d --reduce fp32
}

# ----------------------------------------------------------------------------
section_fsdp() {
    local flags="--steps 200 --eval-every 100"
    for opt in sgd adamw; do
        reference fsdp_$opt $flags --optimizer $opt
        for z in 1 2 3; do
            for n in 2 3 4; do
                same_as fsdp_$opt "fsdp: ZeRO-$z, $n ranks, $opt, same as train.c" \
                    $MPIRUN -n $n ./train_fsdp --zero $z $flags --optimizer $opt
            done
        done
    done
    flags="--steps 150 --eval-every 0 --batch 27 --layers 3 --clip 0.5 --optimizer adamw"
    reference fsdp_odd $flags
    same_as fsdp_odd "fsdp: ZeRO-3 --prefetch, 27 rows on 4 ranks, L=3, clipping, same as train.c" \
        $MPIRUN -n 4 ./train_fsdp --prefetch $flags
    same_as fsdp_odd "fsdp: ZeRO-2 resumed from a train.c checkpoint, same as train.c" \
        bash -c "rm -f $TMP/half.ckpt $TMP/half.ckpt.1 && ./train ${flags/--steps 150/--steps 90} --quiet --save $TMP/half.ckpt >/dev/null &&
                 $MPIRUN -n 3 ./train_fsdp --zero 2 $flags --load $TMP/half.ckpt \"\$@\"" _
    # shards of several ring pieces (dist.h), each added into the shard's sums as it arrives
    flags="--steps 6 --eval-every 0 --emb 10 --hidden 2090 --optimizer adamw"
    reference fsdp_pieces $flags
    for z in 2 3; do
        same_as fsdp_pieces "fsdp: ZeRO-$z, 2 ranks, shards of 168245 sums in ring pieces of 64Ki, same as train.c" \
            $MPIRUN -n 2 ./train_fsdp --zero $z $flags
    done
    # memory: ZeRO-3 with AdamW holds 1/N of train.c's 20 bytes per parameter, plus one unit in
    # transit (its gathered parameters, 4 bytes each, and its gradient, 8)
    run "$TMP/mem" $MPIRUN -n 4 ./train_fsdp --optimizer adamw --steps 10 --hidden 256 --summary "$TMP/mem.sum"
    check "fsdp: ZeRO-3 memory per rank is 1/4 of train.c's plus one unit in transit ($(grep -m1 'rank=3' "$TMP/mem.sum"))" \
        awk -v P=$((432 + 256*256 + 256 + 256*27 + 27)) -v U=$((256*256 + 256)) '
            /^rank=/ { n++; for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                       held = v["params"] + v["grads"] + v["optim"]; want = 20 * P / 4 + (4 + 8) * U;
                       if (held < 0.99 * want || held > 1.01 * want) bad = 1 }
            END { exit !(n == 4 && !bad) }' "$TMP/mem.sum"
    expect_error 2 "--zero must be an integer from 1 to 3, got '4'" "fsdp: --zero 4 is refused" -- $MPIRUN -n 2 ./train_fsdp --zero 4
    expect_error 2 "--prefetch applies to --zero 3 only" "fsdp: --prefetch with stage 1 is refused" -- $MPIRUN -n 2 ./train_fsdp --zero 1 --prefetch
    expect_error 2 "3 ranks but a batch of 2 rows" "fsdp: more ranks than rows is refused" -- $MPIRUN -n 3 ./train_fsdp --batch 2
    expect_error 2 "unknown flag '--overlap'" "fsdp: a flag of another program is refused" -- $MPIRUN -n 2 ./train_fsdp --overlap
}

# ----------------------------------------------------------------------------
section_tp() {
    for layers in 1 2 3; do
        for opt in sgd adamw; do
            local flags="--steps 150 --eval-every 75 --layers $layers --optimizer $opt"
            reference tp_$layers$opt $flags
            for n in 2 3 4; do
                same_as tp_$layers$opt "tp: $n ranks, L=$layers, $opt, same as train.c" $MPIRUN -n $n ./train_tp $flags
            done
        done
    done
    # a hidden size 3 ranks do not divide, clipping (replicated biases counted once), a resume
    flags="--steps 120 --eval-every 0 --hidden 50 --batch 20 --clip 0.3 --optimizer adamw"
    reference tp_odd $flags
    same_as tp_odd "tp: 3 ranks, hidden 50 (padded to 51), clipping, same as train.c" $MPIRUN -n 3 ./train_tp $flags
    same_as tp_odd "tp: 4 ranks resumed from a train.c checkpoint, same as train.c" \
        bash -c "rm -f $TMP/half.ckpt $TMP/half.ckpt.1 && ./train ${flags/--steps 120/--steps 70} --quiet --save $TMP/half.ckpt >/dev/null &&
                 $MPIRUN -n 4 ./train_tp $flags --load $TMP/half.ckpt \"\$@\"" _
    expect_error 2 "5 ranks but a hidden size of 4" "tp: more ranks than hidden units is refused" -- $MPIRUN -n 5 ./train_tp --hidden 4
    expect_error 2 "unknown flag '--schedule'" "tp: a flag of another program is refused" -- $MPIRUN -n 2 ./train_tp --schedule 1f1b
    expect_error 1 "is of a different model" "tp: a checkpoint of another model is refused on every rank" -- $MPIRUN -n 2 ./train_tp --load "$TMP/tp_odd.ckpt"
}

# ----------------------------------------------------------------------------
# memory_exact NAME COMMAND...: every rank's memory (parameters, gradients, optimizer state
# and the activations at its list's peak) equals its formula, to the byte (the summary's
# figures are whole bytes each, so their sum may round 2 B off)
memory_exact() {
    local name=$1
    shift
    rm -f "$TMP/mem.sum" # a run that fails must not leave the one before's figures to check
    run "$TMP/mem.out" "$@" --steps 2 --eval-every 0 --samples 0 --summary "$TMP/mem.sum"
    check "$name: every rank's memory = its formula ($(awk '/^rank=/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            printf "%.0f (%.0f) ", v["params"] + v["grads"] + v["optim"] + v["acts"], v["mem_formula"] }' "$TMP/mem.sum" 2>/dev/null)B)" \
        awk '/^rank=/ { n++; for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            d = v["params"] + v["grads"] + v["optim"] + v["acts"] - v["mem_formula"]; if (d < -2 || d > 2) bad = 1 }
            END { exit !(n > 0 && !bad) }' "$TMP/mem.sum"
}
section_pp() {
    local flags
    for layers in 1 3; do
        for opt in sgd adamw; do
            flags="--steps 40 --eval-every 20 --layers $layers --optimizer $opt"
            reference pp_$layers$opt $flags
            for stages in $(seq 2 $((layers + 2))); do
                for m in 1 3 4 8; do
                    for sched in naive gpipe 1f1b; do
                        same_as pp_$layers$opt "pp: L=$layers, $stages stages, $m microbatches, $sched, $opt, same as train.c" \
                            $MPIRUN -n $stages ./train_pp $flags --microbatches $m --schedule $sched
                    done
                done
            done
        done
    done
    # activations held: GPipe all M microbatches on every stage, 1F1B at most S - s on stage s
    peaks() { sed -n 's/^  rank [0-9]*: bubble .* peak \([0-9.]*\).*/\1/p' "$1" | cut -d. -f1 | tr '\n' ' '; }
    run "$TMP/peak" $MPIRUN -n 5 ./train_pp --layers 3 --microbatches 8 --schedule gpipe --steps 5 --samples 0
    check "pp: GPipe holds all 8 microbatch activations on every stage ($(peaks "$TMP/peak"))" test "$(peaks "$TMP/peak")" = "8 8 8 8 8 "
    run "$TMP/peak" $MPIRUN -n 5 ./train_pp --layers 3 --microbatches 8 --schedule 1f1b --steps 5 --samples 0
    check "pp: 1F1B holds at most S - s = 5, 4, 3, 2, 1 microbatch activations ($(peaks "$TMP/peak"))" test "$(peaks "$TMP/peak")" = "5 4 3 2 1 "
    run "$TMP/peak" $MPIRUN -n 4 ./train_pp --layers 3 --microbatches 2 --schedule 1f1b --steps 5 --samples 0
    check "pp: 1F1B with M < S holds at most M = 2 microbatches ($(peaks "$TMP/peak"))" test "$(peaks "$TMP/peak")" = "2 2 2 1 "
    run "$TMP/peak" $MPIRUN -n 4 ./train_pp --layers 3 --microbatches 8 --schedule zb1 --steps 5 --samples 0
    check "pp: ZB-H1 holds at most S = 4 microbatches on every stage, 1F1B's peak ($(peaks "$TMP/peak"))" test "$(peaks "$TMP/peak")" = "4 4 4 4 "
    # in bytes, the multi-chunk schedules: a rank's chunks hold different amounts (embedding,
    # blocks, head; the two arms of a V), and the formula counts each chunk's in flight at
    # the peak of its list (it took the peak count times a mean over the chunks: every run
    # below missed, by 1.6 to 55 KB)
    local g="--model gpt --emb 16 --heads 4 --layers 4"
    memory_exact "pp: interleaved, 2 stages, L=7, 8 microbatches" $MPIRUN -n 2 ./train_pp --layers 7 --hidden 32 --schedule interleaved --microbatches 8
    memory_exact "pp: interleaved, 2 stages, L=4, 4 microbatches" $MPIRUN -n 2 ./train_pp --layers 4 --hidden 32 --schedule interleaved --microbatches 4
    memory_exact "pp: zbv, 2 stages, L=4, 4 microbatches" $MPIRUN -n 2 ./train_pp --layers 4 --hidden 32 --schedule zbv --microbatches 4
    memory_exact "pp: zbv, 4 stages, L=6, 8 microbatches" $MPIRUN -n 4 ./train_pp --layers 6 --hidden 128 --schedule zbv --microbatches 8
    memory_exact "pp: dualpipev, 2 stages, L=4, 4 microbatches" $MPIRUN -n 2 ./train_pp --layers 4 --hidden 32 --schedule dualpipev --microbatches 4
    memory_exact "pp: dualpipev, 2 stages, L=4, 6 microbatches" $MPIRUN -n 2 ./train_pp --layers 4 --hidden 32 --schedule dualpipev --microbatches 6
    memory_exact "pp: gpt, interleaved, 4 microbatches" $MPIRUN -n 2 ./train_pp $g --schedule interleaved --microbatches 4
    memory_exact "pp: gpt, interleaved, 8 microbatches, --recompute selective" $MPIRUN -n 2 ./train_pp $g --schedule interleaved --microbatches 8 --recompute selective
    memory_exact "pp: gpt, zbv, 3 microbatches" $MPIRUN -n 2 ./train_pp $g --schedule zbv --microbatches 3
    memory_exact "pp: gpt, zbv, 8 microbatches, --recompute selective" $MPIRUN -n 2 ./train_pp $g --schedule zbv --microbatches 8 --recompute selective
    memory_exact "pp: gpt, dualpipev, 4 microbatches" $MPIRUN -n 2 ./train_pp $g --schedule dualpipev --microbatches 4
    memory_exact "pp: gpt, dualpipev, 6 microbatches, --recompute selective" $MPIRUN -n 2 ./train_pp $g --schedule dualpipev --microbatches 6 --recompute selective
    # messages larger than MPI's eager limit (64 KiB activations): blocking sends would deadlock 1F1B
    flags="--steps 20 --eval-every 0 --hidden 512 --batch 64 --layers 2"
    reference pp_big $flags
    same_as pp_big "pp: 1F1B with 64 KiB messages finishes (no deadlock), same as train.c" \
        $MPIRUN -n 4 ./train_pp $flags --microbatches 2 --schedule 1f1b
    flags="--steps 60 --eval-every 0 --layers 3 --batch 29 --clip 0.5 --optimizer adamw"
    reference pp_odd $flags
    same_as pp_odd "pp: 29 rows in 8 microbatches, clipping across stages, same as train.c" \
        $MPIRUN -n 4 ./train_pp $flags --microbatches 8
    same_as pp_odd "pp: resumed from a train.c checkpoint, same as train.c" \
        bash -c "rm -f $TMP/half.ckpt $TMP/half.ckpt.1 && ./train ${flags/--steps 60/--steps 25} --quiet --save $TMP/half.ckpt >/dev/null &&
                 $MPIRUN -n 3 ./train_pp $flags --microbatches 3 --schedule gpipe --load $TMP/half.ckpt \"\$@\"" _
    run "$TMP/tl" $MPIRUN -n 3 ./train_pp --layers 2 --microbatches 4 --steps 5 --samples 0 --timeline
    check "pp: --timeline draws one row per stage, with every microbatch's forward and backward" \
        awk '/^  stage [0-9] \|/ { n++; for (m = 0; m < 4; m++) if (!index($0, m "") || !index($0, substr("abcd", m + 1, 1))) bad = 1 }
             END { exit !(n == 3 && !bad) }' "$TMP/tl"
    expect_error 2 "4 stages but the model has only 3 units" "pp: more stages than units is refused" -- $MPIRUN -n 4 ./train_pp
    expect_error 2 "3 stages x 2 chunks = 6 chunks but the model has only 5 units" "pp: more chunks than units is refused" -- $MPIRUN -n 3 ./train_pp --layers 3 --schedule zbv
    expect_error 2 "microbatches \(3\) must be a multiple of the stages \(2\)" "pp: interleaved with M not a multiple of S is refused, stating the rule" -- $MPIRUN -n 2 ./train_pp --layers 4 --schedule interleaved --microbatches 3
    expect_error 2 "--virtual applies to --schedule interleaved only" "pp: --virtual with another schedule is refused" -- $MPIRUN -n 2 ./train_pp --layers 4 --virtual 2
    expect_error 2 "--virtual must be an integer from 1 to 4, got '5'" "pp: --virtual 5 is refused" -- $MPIRUN -n 2 ./train_pp --layers 4 --schedule interleaved --virtual 5
    expect_error 2 "--microbatches must be an integer from 1 to 65536, got '0'" "pp: --microbatches 0 is refused" -- $MPIRUN -n 2 ./train_pp --microbatches 0
    expect_error 2 "--schedule must be naive, gpipe, 1f1b, interleaved, zb1, zbv or dualpipev, got 'zigzag'" "pp: an unknown schedule is refused" -- $MPIRUN -n 2 ./train_pp --schedule zigzag
    expect_error 2 "a batch of 4 rows cannot be cut into 8 microbatches" "pp: a batch smaller than M is refused" -- $MPIRUN -n 2 ./train_pp --batch 4 --microbatches 8
}

# ----------------------------------------------------------------------------
# Today's pipeline schedules (schedules.h): the checker over every schedule and size, then
# every schedule against train.c, bit for bit, including M < S where a schedule allows it
section_schedules() {
    run "$TMP/grid" tools/schedules --grid
    check "schedules: the checker finds every list of every schedule valid for S = 1..8, V = 1..4, M = 1..32, with the closed forms' bubble and peak ($(tail -1 "$TMP/grid"))" \
        bash -c "grep -q '^PASSED the checker catches' '$TMP/grid' && grep -q ' schedules checked .*, 0 failed$' '$TMP/grid'"
    local flags
    for layers in 2 4; do
        for opt in sgd adamw; do
            flags="--steps 20 --eval-every 10 --layers $layers --optimizer $opt --batch 26"
            reference sch_$layers$opt $flags
            for S in 2 3 4; do
                for M in 1 2 4 6; do
                    for sched in zb1 zbv interleaved dualpipev; do
                        local chunks=1
                        [ $sched != zb1 ] && chunks=2
                        [ $((S * chunks)) -gt $((layers + 2)) ] && continue
                        [ $sched = interleaved ] && [ $((M % S)) != 0 ] && continue
                        [ $sched = dualpipev ] && [ $M -lt $((2 * S)) ] && continue
                        same_as sch_$layers$opt "schedules: $sched, L=$layers, $S stages, $M microbatches, $opt, same as train.c" \
                            $MPIRUN -n $S ./train_pp $flags --microbatches $M --schedule $sched
                    done
                done
            done
        done
    done
    flags="--steps 30 --eval-every 15 --layers 6 --optimizer adamw --clip 0.5 --batch 24"
    reference sch_v3 $flags
    same_as sch_v3 "schedules: interleaved with 3 chunks per rank on 2 stages, clipping, same as train.c" \
        $MPIRUN -n 2 ./train_pp $flags --microbatches 4 --schedule interleaved --virtual 3
    flags="--steps 20 --eval-every 10 --layers 4 --optimizer adamw --clip 0.3 --hidden 50 --batch 30"
    reference sch_3d $flags
    for sched in zb1 zbv interleaved; do
        same_as sch_3d "schedules: train_3d 2 x 2 x 2, $sched, same as train.c" \
            $MPIRUN -n 8 ./train_3d --tp 2 --dp 2 --pp 2 --microbatches 2 --schedule $sched $flags
    done
    # DualPipeV (F&B actions: a forward and a backward of two microbatches as one action):
    # the same bits as train.c on 2 and 4 ranks, the MLP and the GPT, and in train_3d
    flags="--steps 20 --eval-every 10 --layers 6 --optimizer adamw --clip 0.5 --batch 24"
    reference dpv $flags
    for run_ in "2 4" "4 8" "4 11"; do
        set -- $run_
        same_as dpv "schedules: dualpipev, MLP, $1 ranks, $2 microbatches, same as train.c" \
            $MPIRUN -n $1 ./train_pp --schedule dualpipev --microbatches $2 $flags
    done
    same_as dpv "schedules: dualpipev in train_3d --tp 2 --pp 2, same as train.c" \
        $MPIRUN -n 4 ./train_3d --tp 2 --dp 1 --pp 2 --schedule dualpipev --microbatches 4 $flags
    same_as dpv "schedules: dualpipev in train_3d --dp 2 --pp 2 --zero 3, same as train.c" \
        $MPIRUN -n 4 ./train_3d --tp 1 --dp 2 --pp 2 --zero 3 --schedule dualpipev --microbatches 4 $flags
    flags="--model gpt --emb 16 --heads 4 --layers 6 --samples 3 --steps 10 --eval-every 5 --clip 1"
    reference dpv_gpt $flags
    same_as dpv_gpt "schedules: dualpipev, GPT, 2 ranks, 4 microbatches, same as train.c" \
        $MPIRUN -n 2 ./train_pp --schedule dualpipev --microbatches 4 $flags
    same_as dpv_gpt "schedules: dualpipev, GPT, 4 ranks, 8 microbatches, same as train.c" \
        $MPIRUN -n 4 ./train_pp --schedule dualpipev --microbatches 8 $flags
    same_as dpv_gpt "schedules: dualpipev, GPT, train_3d --tp 2 --pp 2 --sp, same as train.c" \
        $MPIRUN -n 4 ./train_3d --tp 2 --dp 1 --pp 2 --sp --schedule dualpipev --microbatches 4 $flags
    expect_error 2 "dualpipev .* needs at least 2 x 2 stages = 4 microbatches, got 3" \
        "schedules: dualpipev with fewer than 2S microbatches is refused, saying how many it needs" \
        -- $MPIRUN -n 2 ./train_pp --layers 2 --schedule dualpipev --microbatches 3
    expect_error 2 "dualpipev .* needs at least 2 x 2 stages = 4 microbatches, got 2" \
        "schedules: train_3d --schedule dualpipev with fewer than 2P microbatches is refused" \
        -- $MPIRUN -n 2 ./train_3d --tp 1 --dp 1 --pp 2 --layers 2 --schedule dualpipev --microbatches 2
    expect_error 2 "3 stages x 2 chunks = 6 chunks but the model has only 5 units" \
        "schedules: dualpipev with more chunks (2 a rank) than units is refused" -- $MPIRUN -n 3 ./train_pp --layers 3 --schedule dualpipev
    expect_error 2 "--virtual applies to --schedule interleaved only" "schedules: --virtual with dualpipev is refused" \
        -- $MPIRUN -n 2 ./train_pp --layers 2 --schedule dualpipev --virtual 2
    # schedules.h writes DualPipeV's lists for S = 2, M = 4 in its comment, phase by phase:
    # the comment, without its phase marks, is what the generator makes
    run "$TMP/dpv24" tools/schedules dualpipev 2 2 4
    sed -n '/^\/\/ DualPipeV (DeepSeek/,/^static int schedule_dualpipev/p' schedules.h | grep '^//   rank [0-9]:' |
        sed -e 's|^//   |  |' -e 's/ - |//g' -e 's/ |//g' -e 's/ -$//' >"$TMP/dpv24.comment"
    grep '^  rank [0-9]*: [FBIW][0-9]' "$TMP/dpv24" >"$TMP/dpv24.lists"
    check "schedules: DualPipeV's comment in schedules.h shows the lists its generator makes for S = 2, M = 4" \
        bash -c "test -s '$TMP/dpv24.comment' && cmp -s '$TMP/dpv24.comment' '$TMP/dpv24.lists'"
    # train_pp.c shows the 1F1B lists for S = 2, M = 4 beside its executor: they are schedules.h's
    run "$TMP/1f1b24" tools/schedules 1f1b 2 1 4
    grep '^//   rank [0-9]: F' train_pp.c | sed 's|^//   |  |' >"$TMP/1f1b24.comment"
    grep '^  rank [0-9]*: [FBIW][0-9]' "$TMP/1f1b24" >"$TMP/1f1b24.lists"
    check "schedules: train_pp.c's comment beside its executor shows the 1F1B lists schedules.h makes for S = 2, M = 4" \
        bash -c "test -s '$TMP/1f1b24.comment' && cmp -s '$TMP/1f1b24.comment' '$TMP/1f1b24.lists'"
    run "$TMP/dpv" tools/schedules dualpipev 4 2 8
    check "schedules: the checker passes dualpipev's lists for 4 ranks and 8 microbatches, F&B actions on every rank, its bubble DualPipe's (S-1)(F&B+B-3W) ($(grep makespan "$TMP/dpv"))" \
        bash -c "test \$(grep -c '^  rank [0-9]:.*F[0-9]*\.[0-9]*&B' '$TMP/dpv') = 4 && grep -q 'bubble 0.1111 of S x makespan (closed form 0.1111)' '$TMP/dpv'"
    run "$TMP/tl" $MPIRUN -n 2 ./train_pp --layers 2 --microbatches 4 --schedule dualpipev --steps 5 --samples 0 --timeline
    check "schedules: --timeline draws dualpipev's F&B's forward and backward, every microbatch on both stages" \
        awk '/^  stage [0-9] \|/ { n++; for (m = 0; m < 4; m++) if (!index($0, m "") || !index($0, substr("abcd", m + 1, 1))) bad = 1 }
             END { exit !(n == 2 && !bad) }' "$TMP/tl"
    # the activations every rank holds at its peak (the executor's slots: its list's peak,
    # over all its chunks at once) are what the schedule's formula says, for every schedule
    local runs=0 bad="" S M sched v
    for S in 2 3 4; do
        for M in 1 $((2 * S + 1)) $((3 * S)); do
            for sched in naive gpipe 1f1b interleaved:2 interleaved:3 zb1 zbv dualpipev; do
                v=""
                [ "${sched%:*}" != "$sched" ] && v="--virtual ${sched#*:}"
                [ "${sched%:*}" = interleaved ] && [ $((M % S)) != 0 ] && continue
                [ $sched = dualpipev ] && [ $M -lt $((2 * S)) ] && continue
                run "$TMP/peak" $MPIRUN -n $S ./train_pp --layers 10 --hidden 16 --microbatches $M --schedule "${sched%:*}" $v \
                    --steps 2 --eval-every 0 --samples 0
                runs=$((runs + 1))
                sed -n 's/^  rank [0-9]*: bubble .* peak \([0-9.]*\) (\([0-9.]*\))$/\1 \2/p' "$TMP/peak" >"$TMP/peaks"
                [ "$(wc -l <"$TMP/peaks")" = $S ] && awk '$1 != $2 { exit 1 }' "$TMP/peaks" ||
                    bad="$bad $sched S=$S M=$M: $(tr '\n' ',' <"$TMP/peaks");"
            done
        done
    done
    check "schedules: every rank's peak activations equal the formula, every schedule, S = 2..4, 3 M each (2 for dualpipev), V = 2, 3 ($runs runs)${bad:+; differ:$bad}" \
        test -z "$bad"
    # schedules built in time linear in their actions, once per run: 16,384 microbatches
    # under a 5 s watchdog (the report used to build the schedule again, quadratic in M)
    check "schedules: tools/schedules builds and checks zbv for 2 ranks and 65,536 microbatches in under 10 s" \
        timeout 10 tools/schedules zbv 2 2 65536
    run "$TMP/zbv_big" $MPIRUN -n 2 ./train_pp --layers 2 --hidden 16 --schedule zbv --microbatches 16384 --batch 16384 \
        --steps 2 --eval-every 0 --samples 2 --timeout 60 --save "$TMP/zbv_big.ckpt"
    local status=$?
    # (a step of 16,384 microbatches takes about a second on an idle core, 5 s and more on a
    # loaded machine: the watchdog's limit is generous, the point is that the step ends)
    check "schedules: zbv with 16,384 microbatches under --timeout 60 finishes, saved, with its report (exit $status)" \
        bash -c "test $status = 0 && grep -q '^  all ranks: bubble' '$TMP/zbv_big' && test -s '$TMP/zbv_big.ckpt'"
    # tools/schedules refuses nonsense, naming it
    expect_error 2 "--f must be a decimal number above 0 .* got 'nan'" "schedules: tools/schedules --f nan is refused, naming the flag" \
        -- tools/schedules zbv 4 2 8 --f nan
    expect_error 2 "--latency must be a decimal number from 0 .* got 'inf'" "schedules: tools/schedules --latency inf is refused, naming the flag" \
        -- tools/schedules zbv 4 2 8 --latency inf
    expect_error 2 "--f must be a decimal number above 0 .* got '-1'" "schedules: tools/schedules --f -1 is refused as a duration, not blamed on the schedule" \
        -- tools/schedules zbv 4 2 8 --f -1
    expect_error 2 "--w needs a value" "schedules: tools/schedules --w without a value is refused" -- tools/schedules zb1 4 1 8 --w
    expect_error 2 "M must be an integer from 1 to 65536, got '99999999'" "schedules: tools/schedules with M out of range is refused" \
        -- tools/schedules zbv 4 2 99999999
    rm -f "$TMP/new.svg"
    echo '{"traceEvents": [' >"$TMP/garbage.json"
    expect_error 2 "trace '.*garbage.json' has no pipeline actions" "schedules: a garbage trace given to --svg is refused with a message" \
        -- tools/schedules --svg "$TMP/new.svg" 4 8 "$TMP/garbage.json"
    check "schedules: ... and no picture is written" test ! -e "$TMP/new.svg"
    printf '{"name": "F3 chunk 1", "cat": "pipeline", "ph": "X", "pid": 7, "tid": 0, "ts": 1.0, "dur": 2.0}\n' >"$TMP/rank7.json"
    expect_error 2 "is not one of a pipeline of 4 ranks and 8 microbatches" "schedules: a trace of another pipeline (rank 7 of 4) is refused" \
        -- tools/schedules --svg "$TMP/new.svg" 4 8 "$TMP/rank7.json"
    # the S, V and M given are the picture's and the lists': never silently replaced (audit 5: D5, D6, TR6, TR7, D45)
    expect_error 2 "V 1: dualpipev runs 2 chunks a rank; give V 2" "schedules: tools/schedules dualpipev with V 1 is refused, not run with V 2" \
        -- tools/schedules dualpipev 3 1 6
    expect_error 2 "V 4: 1f1b runs 1 chunk a rank; give V 1" "schedules: tools/schedules 1f1b with V 4 is refused, not run with V 1" \
        -- tools/schedules 1f1b 3 4 6
    run "$TMP/tr2" $MPIRUN -n 2 ./train_pp --layers 2 --microbatches 4 --steps 2 --samples 0 --quiet --trace "$TMP/pp2.json"
    expect_error 2 "has no action of rank 2: it is not a run of 4 ranks and 4 microbatches" \
        "schedules: --svg of 4 ranks from a 2-rank trace is refused" -- tools/schedules --svg "$TMP/new.svg" 4 4 "$TMP/pp2.json"
    expect_error 2 "has no action of microbatch 4: it is not a run of 2 ranks and 8 microbatches" \
        "schedules: --svg of 8 microbatches from a 4-microbatch trace is refused" -- tools/schedules --svg "$TMP/new.svg" 2 8 "$TMP/pp2.json"
    check "schedules: ... and of its own 2 ranks and 4 microbatches drawn" \
        bash -c "tools/schedules --svg '$TMP/new.svg' 2 4 '$TMP/pp2.json' && grep -q '</svg>' '$TMP/new.svg'"
    expect_error 2 "--svg is given twice" "schedules: --svg given twice is named, not read as a trace" \
        -- tools/schedules --svg "$TMP/new.svg" 2 4 --svg "$TMP/b.svg"
    rm -f "$TMP/new.svg"
    run "$TMP/tl" $MPIRUN -n 2 ./train_pp --layers 2 --microbatches 4 --schedule zb1 --steps 5 --samples 0 --timeline
    check "schedules: --timeline draws F, I and W apart (digits, letters, capitals) for zb1" \
        awk '/^  stage [0-9] \|/ { n++; if ($0 !~ /[0-9]/ || $0 !~ /[a-d]/ || $0 !~ /[A-D]/) bad = 1 } END { exit !(n == 2 && !bad) }' "$TMP/tl"
    check "schedules: the report prints each rank's measured bubble beside the checker's and the closed form" \
        grep -q '^  all ranks: bubble [0-9.]* of S x the step by the checker, [0-9.]* by the closed form' "$TMP/tl"
}

# ----------------------------------------------------------------------------
section_3d() {
    local flags grid
    # the grids of the issue, each ZeRO stage and schedule, both optimizers, clipping on and off
    for layers in 1 3; do
        for opt in sgd adamw; do
            for clip in 0 0.3; do
                flags="--steps 40 --eval-every 20 --layers $layers --optimizer $opt --clip $clip --hidden 50 --batch 30"
                reference 3d_$layers$opt$clip $flags
                local i=0
                for grid in "2 2 2" "1 2 3" "2 1 3" "3 1 1" "1 3 1" "2 2 1" "1 1 4"; do
                    set -- $grid
                    [ "$3" -gt $((layers + 2)) ] && continue
                    local zero=$((i % 3 + 1)) sched=$(echo naive gpipe 1f1b | cut -d' ' -f$(((i + layers) % 3 + 1)))
                    i=$((i + 1))
                    same_as 3d_$layers$opt$clip "3d: tp $1 x dp $2 x pp $3, L=$layers, $opt, clip $clip, ZeRO-$zero, $sched, same as train.c" \
                        $MPIRUN -n $(($1 * $2 * $3)) ./train_3d --tp $1 --dp $2 --pp $3 --zero $zero --schedule $sched \
                        --microbatches 3 $flags
                done
            done
        done
    done
    flags="--steps 40 --eval-every 0 --layers 3 --optimizer adamw --clip 0.3 --hidden 50 --batch 30"
    same_as 3d_3adamw0.3 "3d: 2 x 2 x 2 with --prefetch, same as train.c" \
        $MPIRUN -n 8 ./train_3d --tp 2 --dp 2 --pp 2 --prefetch ${flags/--eval-every 0/--eval-every 20}
    reference 3d_odd $flags
    same_as 3d_odd "3d: 2 x 2 x 2 resumed from a train.c checkpoint, same as train.c" \
        bash -c "rm -f $TMP/half.ckpt $TMP/half.ckpt.1 && ./train ${flags/--steps 40/--steps 15} --quiet --save $TMP/half.ckpt >/dev/null &&
                 $MPIRUN -n 8 ./train_3d --tp 2 --dp 2 --pp 2 $flags --load $TMP/half.ckpt \"\$@\"" _
    same_as 3d_odd "3d: --tp 2 --pp 2 on 8 ranks leaves --dp 2, same as train.c" \
        $MPIRUN -n 8 ./train_3d --tp 2 --pp 2 $flags
    run "$TMP/grid" $MPIRUN -n 8 ./train_3d --tp 2 --dp 2 --pp 2 --steps 2 --samples 0
    check "3d: rank 0 prints the grid, every rank's (tp, cp, stage, replica) and its units, tensor fastest, data slowest" \
        bash -c "grep -q 'rank 3 *tp 1, cp 0, stage 1, replica 0: linear 2 + loss (rows 0-3 of microbatch 0' '$TMP/grid' && grep -q 'rank 4 *tp 0, cp 0, stage 0, replica 1: embedding linear 1 (rows 4-7 of microbatch 0' '$TMP/grid' && test \$(grep -c '^  rank [0-9]* *tp [0-9], cp 0, stage [0-9], replica [0-9]:' '$TMP/grid') = 8"
    # the pipeline's activations in bytes, chunk by chunk, at the tensor-parallel slices' sizes
    local g="--model gpt --emb 16 --heads 4 --layers 4"
    memory_exact "3d: gpt, --tp 2 --pp 2, dualpipev, --recompute selective" $MPIRUN -n 4 ./train_3d $g --tp 2 --pp 2 --schedule dualpipev --recompute selective
    memory_exact "3d: gpt, --tp 2 --pp 2, zbv, --sp" $MPIRUN -n 4 ./train_3d $g --tp 2 --pp 2 --schedule zbv --sp
    memory_exact "3d: gpt, --tp 2 --pp 2, interleaved" $MPIRUN -n 4 ./train_3d $g --tp 2 --pp 2 --schedule interleaved
    expect_error 2 "--tp 2 x --cp 1 x --dp 2 x --pp 2 = 8, but mpirun started 4 ranks" "3d: a grid that is not the world size is refused on every rank" -- $MPIRUN -n 4 ./train_3d --tp 2 --dp 2 --pp 2
    expect_error 2 "say how to arrange them" "3d: an ambiguous grid is refused" -- $MPIRUN -n 4 ./train_3d --tp 2
    expect_error 2 "--pp 4 but the model has only 3 units" "3d: more stages than units is refused" -- $MPIRUN -n 4 ./train_3d --pp 4 --dp 1
    expect_error 2 "cannot give each of 8 microbatches a row for each of 4 data-parallel replicas" "3d: too few rows per replica for the microbatches is refused" -- $MPIRUN -n 4 ./train_3d --dp 4 --pp 1 --batch 16 --microbatches 8
    expect_error 2 "--schedule must be naive, gpipe, 1f1b, interleaved, zb1, zbv or dualpipev" "3d: an unknown schedule is refused" -- $MPIRUN -n 2 ./train_3d --dp 2 --pp 1 --schedule nope
    expect_error 2 "--prefetch applies to --zero 3 only" "3d: --prefetch with ZeRO-2 is refused" -- $MPIRUN -n 2 ./train_3d --dp 2 --pp 1 --zero 2 --prefetch
}

# ----------------------------------------------------------------------------
# Communication and memory accounting: every program counts the bytes it sends as it sends
# them (dist.h: the collectives are rings of point-to-point messages) and prints each
# strategy's textbook formula beside the count. On 2 ranks every buffer divides evenly and
# the two must agree to the byte; otherwise a ring's chunks differ by one element, so each
# collective may differ from the formula by less than 2 elements (the bound below allows
# 128 bytes a step, far less than any one message of these layouts). Memory agrees within
# the padding of sizes the ranks do not divide (5%). And what leaves one rank arrives at
# another: over all ranks, bytes sent and bytes received (counted separately, by the
# receiving calls) agree, within the rounding of the per-step figures to whole bytes.
# ----------------------------------------------------------------------------
# expert parallelism (train_ep.c) against train.c --experts X, and the MoE model's checks
section_ep() {
    local flags="--steps 40 --eval-every 20" x n k
    # the grid: X experts over N ranks (X >= N), top-1 with SGD, top-2 with AdamW and clipping
    for x in 2 4 8; do
        reference ep_${x}_1 $flags --experts $x
        reference ep_${x}_2 $flags --experts $x --top-k 2 --optimizer adamw --clip 0.5
        for n in 1 2 3 4; do
            [ $n -gt $x ] && continue
            same_as ep_${x}_1 "ep: $x experts on $n ranks, top-1, sgd, same as train.c" \
                $MPIRUN -n $n ./train_ep $flags --experts $x
            same_as ep_${x}_2 "ep: $x experts on $n ranks, top-2, adamw, clipping, same as train.c" \
                $MPIRUN -n $n ./train_ep $flags --experts $x --top-k 2 --optimizer adamw --clip 0.5
        done
    done
    # fine-grained routing: top-4 of 8 and top-8 of 16 experts, on 2 and 4 ranks, the MLP with
    # AdamW and the GPT with 2 microbatches and selective recomputation; the GPT's 16 experts a
    # quarter of the dense block's 4C = 64 wide
    local gk="--model gpt --emb 16 --heads 4 --layers 2 --samples 3 --microbatches 2 --recompute selective" w
    for k in 4 8; do
        x=$((2 * k)) w=""
        [ $k = 8 ] && w="--expert-hidden 16"
        reference ep_k$k $flags --experts $x --top-k $k --optimizer adamw
        reference ep_gk$k $flags $gk --experts $x --top-k $k $w
        for n in 2 4; do
            same_as ep_k$k "ep: $x experts on $n ranks, top-$k, adamw, same as train.c" \
                $MPIRUN -n $n ./train_ep $flags --experts $x --top-k $k --optimizer adamw
            same_as ep_gk$k "ep: the GPT, $x experts${w:+ 16 wide} on $n ranks, top-$k, 2 microbatches, selective recomputation, same as train.c" \
                $MPIRUN -n $n ./train_ep $flags $gk --experts $x --top-k $k $w
        done
    done
    # DeepSeek-V3's router: sigmoid affinities, the gates normalised over the chosen, with the
    # loss or balanced by a bias per expert (moved after each step by integer counts: the same
    # in every layout); on 2 and 4 ranks, the MLP with AdamW and the GPT with 2 microbatches and
    # selective recomputation; resumed across programs, the biases in the checkpoint
    local ds="--experts 8 --top-k 4 --router sigmoid" bs="--balance bias --bias-rate 0.01"
    reference ep_sig $flags $ds
    same_as ep_sig "ep: --router sigmoid, top-4 of 8 on 2 ranks, with the loss, same as train.c" \
        $MPIRUN -n 2 ./train_ep $flags $ds
    reference ep_bias $flags $ds $bs --optimizer adamw
    reference ep_gbias $flags $gk $ds $bs --expert-hidden 16
    for n in 2 4; do
        same_as ep_bias "ep: --router sigmoid --balance bias, top-4 of 8 on $n ranks, adamw, same as train.c" \
            $MPIRUN -n $n ./train_ep $flags $ds $bs --optimizer adamw
        same_as ep_gbias "ep: the GPT, sigmoid and bias, top-4 of 8 experts 16 wide on $n ranks, 2 microbatches, selective recomputation, same as train.c" \
            $MPIRUN -n $n ./train_ep $flags $gk $ds $bs --expert-hidden 16
    done
    run "$TMP/rb20" ./train ${flags/--steps 40/--steps 20} $ds $bs --optimizer adamw --save "$TMP/ep_rb20.ckpt" --quiet
    same_as ep_bias "ep: 4 ranks resume train.c's --balance bias checkpoint of step 20 (its biases), same as train.c's 40 steps" \
        $MPIRUN -n 4 ./train_ep $flags $ds $bs --optimizer adamw --load "$TMP/ep_rb20.ckpt"
    run "$TMP/rb20b" $MPIRUN -n 2 ./train_ep ${flags/--steps 40/--steps 20} $ds $bs --optimizer adamw --save "$TMP/ep_rb20b.ckpt" --quiet
    same_as ep_bias "ep: train.c resumes train_ep's --balance bias checkpoint of step 20 (2 ranks), same as its own 40 steps" \
        ./train $flags $ds $bs --optimizer adamw --load "$TMP/ep_rb20b.ckpt"
    # shared experts (--shared-experts S): every token through S more experts beside its top-k,
    # replicated like the router; the MLP with 2 of them over 2 and 3 ranks, and DeepSeek-V3's
    # recipe on the GPT (fine-grained top-4 of 8, sigmoid with a bias, one shared expert) over
    # 2 and 4 ranks and in 4D grids, with 2 microbatches and selective recomputation
    local sh="--experts 4 --top-k 2 --shared-experts 2 --optimizer adamw" dsv3="$gk $ds $bs --expert-hidden 16 --shared-experts 1"
    reference ep_sh $flags $sh
    reference ep_dsv3 $flags $dsv3
    for n in 2 3; do
        same_as ep_sh "ep: 4 experts and 2 shared on $n ranks, top-2, adamw, same as train.c" $MPIRUN -n $n ./train_ep $flags $sh
    done
    for n in 2 4; do
        same_as ep_dsv3 "ep: the GPT, DeepSeek-V3's recipe (top-4 of 8 experts 16 wide, sigmoid and bias, 1 shared) on $n ranks, 2 microbatches, selective recomputation, same as train.c" \
            $MPIRUN -n $n ./train_ep $flags $dsv3
    done
    same_as ep_dsv3 "ep: the same in train_3d's 4D grid --tp 2 --pp 2 --dp 2 --ep 2, same as train.c" \
        $MPIRUN -n 8 ./train_3d --tp 2 --cp 1 --pp 2 --dp 2 --ep 2 $flags $dsv3
    same_as ep_dsv3 "ep: the same in train_3d --cp 2 --dp 2 --ep 2 (ring attention), same as train.c" \
        $MPIRUN -n 4 ./train_3d --tp 1 --cp 2 --pp 1 --dp 2 --ep 2 $flags $dsv3
    run "$TMP/sh20" ./train ${flags/--steps 40/--steps 20} $sh --save "$TMP/ep_sh20.ckpt" --quiet
    same_as ep_sh "ep: 3 ranks resume train.c's checkpoint of step 20 with 2 shared experts, same as train.c's 40 steps" \
        $MPIRUN -n 3 ./train_ep $flags $sh --load "$TMP/ep_sh20.ckpt"
    expect_error 1 "is of a mixture with 2 shared experts and this run's has 1: pass --shared-experts 2" \
        "ep: a checkpoint resumed with another --shared-experts is refused, naming the flag" \
        -- $MPIRUN -n 2 ./train_ep ${sh/--shared-experts 2/--shared-experts 1} --load "$TMP/ep_sh20.ckpt" --steps 30
    expect_error 2 "--top-k, --shared-experts, --capacity, .* apply with --experts X only" \
        "ep: --shared-experts without --experts is refused" -- ./train --shared-experts 1
    expect_error 2 "--shared-experts must be an integer from 0 to 8, got '9'" "ep: --shared-experts 9 is refused" \
        -- $MPIRUN -n 2 ./train_ep --experts 4 --shared-experts 9
    run "$TMP/sh0.out" ./train --experts 4 --steps 0 --samples 0
    run "$TMP/sh1.out" ./train --experts 4 --shared-experts 1 --steps 0 --samples 0
    local q0 q1
    q0=$(sed -n 's/.*: \([0-9]*\) parameters$/\1/p' "$TMP/sh0.out")
    q1=$(sed -n 's/.*: \([0-9]*\) parameters$/\1/p' "$TMP/sh1.out")
    check "ep: --shared-experts 1 is said, and adds one expert's 256 x 64 + 64 parameters ($q1 - $q0)" \
        bash -c "grep -q 'a mixture of 4 experts: top-1, capacity factor 1.25, 1 shared, aux loss' '$TMP/sh1.out' && [ '$q0' -gt 0 ] && [ \$((${q1:-0} - $q0)) = 16448 ]"
    run "$TMP/bias.out" ./train --steps 200 --eval-every 0 --samples 0 --experts 4 --router sigmoid --balance bias
    run "$TMP/nobal.out" ./train --steps 200 --eval-every 0 --samples 0 --experts 4 --router sigmoid --aux-loss 0
    local most_bias most_none
    most_bias=$(awk '/^    expert/ { if ($3 > m) m = $3 } END { print m }' "$TMP/bias.out")
    most_none=$(awk '/^    expert/ { if ($3 > m) m = $3 } END { print m }' "$TMP/nobal.out")
    check "ep: --balance bias moves the biases (the table prints them) and lowers the busiest expert's load against no balancing ($most_bias against $most_none tokens a step)" \
        bash -c "grep -qE 'bias [+-]0\.[0-9]*[1-9]' '$TMP/bias.out' && awk 'BEGIN { exit !($most_bias < $most_none) }'"
    check "ep: --router sigmoid --balance bias is said in the summary" \
        grep -q "top-1, capacity factor 1.25, sigmoid router, balanced by a bias moving 0.001 a step" "$TMP/bias.out"
    expect_error 2 "--bias-rate applies with --balance bias" "ep: --bias-rate without --balance bias is refused" -- ./train --experts 4 --bias-rate 0.01
    expect_error 2 "--aux-loss with --balance bias: the bias balances the experts in place of the loss" \
        "ep: --aux-loss with --balance bias is refused" -- $MPIRUN -n 2 ./train_ep --experts 4 --balance bias --aux-loss 0.01
    expect_error 2 "--router must be softmax or sigmoid, got 'tanh'" "ep: an unknown --router is refused" -- ./train --experts 4 --router tanh
    expect_error 2 "--balance must be aux or bias, got 'none'" "ep: an unknown --balance is refused" -- ./train --experts 4 --balance none
    expect_error 2 "--router, --balance and --bias-rate apply with --experts X only" "ep: --router without --experts is refused" -- ./train --router sigmoid
    expect_error 2 "--bias-rate must be a decimal number above 0" "ep: --bias-rate 0 is refused" -- ./train --experts 4 --balance bias --bias-rate 0
    # two MoE layers, an odd batch, and a capacity that drops many tokens / none at all
    local deep="--steps 30 --eval-every 0 --experts 5 --top-k 2 --layers 2 --batch 27 --hidden 24"
    reference ep_drop $deep --capacity 0.5
    same_as ep_drop "ep: 5 experts over 3 ranks (2, 2, 1), L=2, 27 rows, capacity 0.5, same as train.c" \
        $MPIRUN -n 3 ./train_ep $deep --capacity 0.5
    reference ep_nodrop $deep --capacity 3
    same_as ep_nodrop "ep: the same with capacity 3, same as train.c" $MPIRUN -n 3 ./train_ep $deep --capacity 3
    run "$TMP/drop.out" $MPIRUN -n 3 ./train_ep $deep --capacity 0.5
    check "ep: capacity 0.5 drops tokens in every layer ($(grep -m1 'dropped [0-9]' "$TMP/drop.out"))" \
        bash -c "[ \$(grep -cE 'dropped [1-9][0-9.]* tokens per step' '$TMP/drop.out') = 2 ]"
    run "$TMP/nodrop.out" $MPIRUN -n 3 ./train_ep $deep --capacity 3
    check "ep: capacity 3 (no expert can overflow) drops none ($(grep -m1 'dropped [0-9]' "$TMP/nodrop.out"))" \
        bash -c "[ \$(grep -cE 'dropped 0.00 tokens per step .*last step 0' '$TMP/nodrop.out') = 2 ]"
    # the aux loss is part of the objective: its weight changes the trajectory
    run "$TMP/aux0.out" ./train --steps 40 --eval-every 0 --experts 4 --aux-loss 0 --quiet
    check "ep: --aux-loss 0 trains another model than the default 0.01" bash -c "! cmp -s '$TMP/aux0.out' '$TMP/ep_4_1.out'"
    # resuming: train.c's checkpoint continued by train_ep, and train_ep's by train.c
    run "$TMP/r20" ./train ${flags/--steps 40/--steps 20} --experts 4 --save "$TMP/ep_r20.ckpt" --quiet
    same_as ep_4_1 "ep: 3 ranks resume train.c's checkpoint of step 20, same as train.c's 40 steps" \
        $MPIRUN -n 3 ./train_ep $flags --experts 4 --load "$TMP/ep_r20.ckpt"
    run "$TMP/r20b" $MPIRUN -n 2 ./train_ep ${flags/--steps 40/--steps 20} --experts 4 --top-k 2 --optimizer adamw --clip 0.5 \
        --save "$TMP/ep_r20b.ckpt" --quiet
    same_as ep_4_2 "ep: train.c resumes train_ep's AdamW checkpoint of step 20 (2 ranks), same as its own 40 steps" \
        ./train $flags --experts 4 --top-k 2 --optimizer adamw --clip 0.5 --load "$TMP/ep_r20b.ckpt"
    # bytes and memory against the formulas (accounting below), the timeline, the trace
    accounting "ep, 2 ranks, 4 experts" 128 $MPIRUN -n 2 ./train_ep --experts 4
    accounting "ep, 3 ranks, 8 experts, top-2, 2 layers, adamw" 128 $MPIRUN -n 3 ./train_ep --experts 8 --top-k 2 --layers 2 --optimizer adamw
    accounting "ep, 1 rank sends no all-to-all" 128 $MPIRUN -n 1 ./train_ep --experts 4
    run "$TMP/tl.out" $MPIRUN -n 2 ./train_ep --experts 4 --top-k 2 --capacity 4 --steps 5 --eval-every 0 --timeline --trace "$TMP/ep.json"
    # (both ranks' rows; the marks in order on at least one: on a loaded machine a rank's short
    # dispatch can share its column with the wait before it, and the later event is drawn)
    check "ep: --timeline draws dispatch, experts and combine, a row for each rank" \
        bash -c "[ \$(grep -cE '^  rank [01] \|' '$TMP/tl.out') = 2 ] && grep -qE '^  rank [01] \|.*D.*E.*C' '$TMP/tl.out'"
    check "ep: --trace records dispatch and combine with their bytes" \
        bash -c "grep -q '\"name\": \"dispatch\".*\"bytes\": [1-9]' '$TMP/ep.json' && grep -q '\"name\": \"combine (backward)\"' '$TMP/ep.json'"
    # bad input: a clear error on every rank, non-zero exit
    expect_error 2 "--experts 2 on 3 ranks: every rank needs at least one expert" "ep: fewer experts than ranks is refused" -- $MPIRUN -n 3 ./train_ep --experts 2
    expect_error 2 "pass --experts X" "ep: train_ep without --experts is refused" -- $MPIRUN -n 2 ./train_ep
    expect_error 2 "--top-k 2 is more than --experts 1" "ep: top-k above the expert count is refused" -- ./train --experts 1 --top-k 2
    expect_error 2 "--top-k 5 is more than --experts 4" "ep: --top-k 5 of 4 experts is refused" -- $MPIRUN -n 2 ./train_ep --experts 4 --top-k 5
    expect_error 2 "--top-k must be an integer from 1 to 8, got '9'" "ep: --top-k 9 is refused" -- $MPIRUN -n 2 ./train_ep --experts 16 --top-k 9
    expect_error 2 "--top-k must be an integer from 1 to 8" "ep: --top-k 0 is refused" -- ./train --experts 4 --top-k 0
    expect_error 2 "--expert-hidden applies to --model gpt with --experts X: the MLP's expert is one linear layer" \
        "ep: --expert-hidden with the MLP is refused" -- ./train --experts 4 --expert-hidden 16
    expect_error 2 "--expert-hidden applies to --model gpt with --experts X" "ep: --expert-hidden without --experts is refused" \
        -- ./train --model gpt --expert-hidden 16
    expect_error 2 "--expert-hidden must be an integer from 1 to 65536, got '0'" "ep: --expert-hidden 0 is refused" \
        -- $MPIRUN -n 2 ./train_ep --model gpt --experts 4 --expert-hidden 0
    local fine="--model gpt --emb 16 --heads 4 --layers 1 --experts 4 --eval-every 0 --samples 0"
    run "$TMP/fine.out" ./train $fine --expert-hidden 16 --steps 2 --save "$TMP/fine.ckpt"
    run "$TMP/fine64.out" ./train $fine --expert-hidden 64 --steps 0
    local p16 p64
    p16=$(sed -n 's/.*: \([0-9]*\) parameters$/\1/p' "$TMP/fine.out")
    p64=$(sed -n 's/.*: \([0-9]*\) parameters$/\1/p' "$TMP/fine64.out")
    check "ep: --expert-hidden 16 is said, and counts 4 experts x (2 x 16 + 1) x 48 fewer parameters than 64 ($p64 - $p16)" \
        bash -c "grep -q 'a mixture of 4 experts of width 16: top-1' '$TMP/fine.out' && [ '$p64' -gt 0 ] && [ \$(($p64 - ${p16:-0})) = 6336 ]"
    expect_error 1 "is of experts 16 wide and this run's are 64: pass --expert-hidden 16" \
        "ep: a fine-grained checkpoint resumed at the dense width is refused, naming the flag" \
        -- $MPIRUN -n 2 ./train_ep $fine --load "$TMP/fine.ckpt" --steps 4
    expect_error 2 "--capacity must be a decimal number above 0" "ep: --capacity 0 is refused" -- $MPIRUN -n 2 ./train_ep --experts 4 --capacity 0
    expect_error 2 "--capacity must be a decimal number above 0" "ep: a negative capacity is refused" -- ./train --experts 4 --capacity -1
    expect_error 2 "apply with --experts X only" "ep: --top-k without --experts is refused, not ignored" -- ./train --top-k 2
    expect_error 2 "this program trains the dense model" "ep: train_dp refuses --experts, naming where it trains" -- $MPIRUN -n 2 ./train_dp --experts 4
    run "$TMP/dense" ./train --steps 10 --eval-every 0 --save "$TMP/dense.ckpt" --quiet
    expect_error 1 "is of a dense model and this run has --experts 4: resume it without --experts, with train.c, train_dp" "ep: a dense checkpoint with --experts is refused, naming the programs that resume it" -- $MPIRUN -n 2 ./train_ep --experts 4 --load "$TMP/dense.ckpt" --steps 20
    expect_error 1 "is of a mixture of 4 experts and this run's model has 0: resume it with --experts 4, with train.c or train_ep" "ep: an MoE checkpoint without --experts is refused" -- ./train --load "$TMP/ep_r20.ckpt" --steps 30
    expect_error 1 "is of a mixture of 4 experts and this run's model has 8" "ep: a checkpoint of another expert count is refused" -- $MPIRUN -n 2 ./train_ep --experts 8 --load "$TMP/ep_r20.ckpt" --steps 30
    expect_error 1 "other settings: --top-k 1 \(now 2\)" "ep: resuming with another --top-k is refused, naming it" -- $MPIRUN -n 2 ./train_ep --experts 4 --top-k 2 --load "$TMP/ep_r20.ckpt" --steps 30
    expect_error 1 "cannot open data file" "ep: a missing data file ends every rank" -- $MPIRUN -n 3 ./train_ep --experts 4 --data /nonexistent
    section_ep_gpt
}

# The GPT with experts (every block's MLP; model.h's "a unit with a mixture of experts"):
# train_ep.c against train.c, bit for bit, on a small GPT
section_ep_gpt() {
    local m="--model gpt --emb 16 --heads 4 --layers 2" g flags x n p
    g="$m --samples 3"
    flags="$g --steps 30 --eval-every 0"
    for x in 2 4 8; do
        reference gep_${x}_1 $flags --experts $x --optimizer sgd --lr 0.05
        reference gep_${x}_2 $flags --experts $x --top-k 2 --clip 0.5
        for n in 1 2 3 4; do
            [ $n -gt $x ] && continue
            same_as gep_${x}_1 "ep: gpt, $x experts a block on $n ranks, top-1, sgd, same as train.c" \
                $MPIRUN -n $n ./train_ep $flags --experts $x --optimizer sgd --lr 0.05
            same_as gep_${x}_2 "ep: gpt, $x experts a block on $n ranks, top-2, adamw, clipping, same as train.c" \
                $MPIRUN -n $n ./train_ep $flags --experts $x --top-k 2 --clip 0.5
        done
    done
    # 27 rows on 4 ranks (7, 7, 7, 6), 5 experts (2, 1, 1, 1), validation every 10 steps; a
    # capacity that drops many tokens in both blocks, and one that drops none
    flags="$g --steps 20 --eval-every 10 --batch 27 --experts 5 --top-k 2"
    reference gep_drop $flags --capacity 0.5
    same_as gep_drop "ep: gpt, 5 experts over 4 ranks, 27 rows, capacity 0.5, validation on the way, same as train.c" \
        $MPIRUN -n 4 ./train_ep $flags --capacity 0.5
    reference gep_nodrop $flags --capacity 5
    same_as gep_nodrop "ep: gpt, the same with capacity 5, same as train.c" $MPIRUN -n 4 ./train_ep $flags --capacity 5
    run "$TMP/gdrop.out" $MPIRUN -n 4 ./train_ep $flags --capacity 0.5
    check "ep: gpt, capacity 0.5 drops tokens in both blocks ($(grep -m1 'dropped [0-9]' "$TMP/gdrop.out"))" \
        bash -c "[ \$(grep -cE 'dropped [1-9][0-9.]* tokens per step' '$TMP/gdrop.out') = 2 ]"
    run "$TMP/gnodrop.out" $MPIRUN -n 4 ./train_ep $flags --capacity 5
    check "ep: gpt, capacity 5 (no expert can overflow) drops none ($(grep -m1 'dropped [0-9]' "$TMP/gnodrop.out"))" \
        bash -c "[ \$(grep -cE 'dropped 0.00 tokens per step .*last step 0' '$TMP/gnodrop.out') = 2 ]"
    # the tokens are the positions with a target: the table counts them, not the 27 x 16 positions
    check "ep: gpt, the load table counts the positions with a target ($(grep -m1 'block 1:' "$TMP/gdrop.out" | cut -c1-60))" \
        grep -Eq "^  block 1: 1[0-9][0-9]\.[0-9] tokens \(positions with a target" "$TMP/gdrop.out"
    # resuming across programs
    flags="$g --steps 30 --eval-every 0 --experts 4"
    run "$TMP/gep_half" ./train ${flags/--steps 30/--steps 15} --top-k 2 --clip 0.5 --save "$TMP/gep_half.ckpt" --quiet
    same_as gep_4_2 "ep: gpt, 3 ranks resume train.c's checkpoint of step 15, same as train.c's 30 steps" \
        $MPIRUN -n 3 ./train_ep $flags --top-k 2 --clip 0.5 --load "$TMP/gep_half.ckpt"
    run "$TMP/gep_half2" $MPIRUN -n 2 ./train_ep ${flags/--steps 30/--steps 15} --optimizer sgd --lr 0.05 --save "$TMP/gep_half2.ckpt" --quiet
    same_as gep_4_1 "ep: gpt, train.c resumes train_ep's checkpoint of step 15 (2 ranks), same as its own 30 steps" \
        ./train $flags --optimizer sgd --lr 0.05 --load "$TMP/gep_half2.ckpt"
    # bytes and memory against the formulas
    accounting "ep: gpt, 3 ranks, 8 experts, top-2" 128 $MPIRUN -n 3 ./train_ep $m --experts 8 --top-k 2
    accounting "ep: gpt, 2 ranks, 4 experts, sgd" 128 $MPIRUN -n 2 ./train_ep $m --experts 4 --optimizer sgd
    # bad input: the programs that do not split experts refuse the GPT's, once, naming train_ep
    # (train_3d trains them: section 5d)
    for p in "2 ./train_dp" "2 ./train_fsdp" "2 ./train_tp" "2 ./train_pp" "2 ./train_cp"; do
        run "$TMP/gep_bad" $MPIRUN -n ${p%% *} ${p#* } --model gpt --experts 4 --steps 2
        local status=$?
        check "ep: ${p#* } refuses --model gpt --experts with one message naming train_ep (exit $status)" \
            bash -c "[ $status = 2 ] && [ \$(grep -c '^error:' '$TMP/gep_bad') = 1 ] && grep -q 'train_ep.c (experts spread over ranks)' '$TMP/gep_bad'"
    done
    run "$TMP/gep_dense" ./train $g --steps 5 --eval-every 0 --save "$TMP/gep_dense.ckpt" --quiet
    expect_error 1 "is of a dense model and this run has --experts 4" "ep: gpt, a dense GPT's checkpoint with --experts is refused" \
        -- $MPIRUN -n 2 ./train_ep $g --experts 4 --steps 10 --load "$TMP/gep_dense.ckpt"
    expect_error 1 "is of a mixture of 4 experts and this run's model has 0" "ep: gpt, an MoE GPT's checkpoint without --experts is refused" \
        -- ./train $g --steps 30 --load "$TMP/gep_half.ckpt"
    expect_error 2 "--experts 4 on 5 ranks: every rank needs at least one expert" "ep: gpt, fewer experts than ranks is refused" \
        -- $MPIRUN -n 5 ./train_ep $g --experts 4
}

accounting() { # NAME BOUND COMMAND...: every rank's |sent - formula| <= BOUND, memory within 5%, sent = received
    local name=$1 bound=$2
    shift 2
    rm -f "$TMP/acc.sum" # a run that fails must not leave the one before's figures to check
    run "$TMP/acc.out" "$@" --steps 6 --samples 0 --summary "$TMP/acc.sum"
    local status=$?
    if [ $status != 0 ]; then
        fail "accounting: $name (exit $status: $(grep -m1 -E '^error' "$TMP/acc.out" | cut -c1-200))"
        return
    fi
    check "accounting: $name ($(awk '/^rank=0/ { for (i = 2; i <= NF; i++) printf "%s ", $i }' "$TMP/acc.sum" | cut -c1-80))" \
        awk -v bound="$bound" '/^rank=/ { n++; for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            d = v["sent"] - v["sent_formula"]; if (d < 0) d = -d; if (d > bound) bad = 1; sent += v["sent"]; got += v["received"];
            m = v["params"] + v["grads"] + v["optim"] + v["acts"]; if (m < 0.95 * v["mem_formula"] || m > 1.05 * v["mem_formula"]) bad = 1 }
            END { d = sent - got; if (d < 0) d = -d; exit !(n > 0 && !bad && d <= n) }' "$TMP/acc.sum"
}
section_accounting() {
    accounting "train.c sends nothing" 0 ./train
    accounting "train.c replaces its own --summary of the run before (its model= line read as one)" 0 ./train
    accounting "dp, 2 ranks, exact" 0 $MPIRUN -n 2 ./train_dp
    accounting "dp --overlap, 2 ranks, exact" 0 $MPIRUN -n 2 ./train_dp --overlap --bucket-kb 8
    accounting "dp, 3 ranks, hidden 100" 128 $MPIRUN -n 3 ./train_dp --hidden 100
    for z in 1 2 3; do
        accounting "ZeRO-$z, 2 ranks, adamw, clipping, exact" 0 $MPIRUN -n 2 ./train_fsdp --zero $z --optimizer adamw --clip 1
        accounting "ZeRO-$z, 4 ranks, 3 layers" 128 $MPIRUN -n 4 ./train_fsdp --zero $z --layers 3
    done
    accounting "tp, 2 ranks, L=1, exact" 0 $MPIRUN -n 2 ./train_tp
    accounting "tp, 2 ranks, L=2 (vocabulary-parallel loss), clipping, exact" 0 $MPIRUN -n 2 ./train_tp --layers 2 --clip 1
    accounting "tp, 3 ranks, L=3, hidden 50" 128 $MPIRUN -n 3 ./train_tp --layers 3 --hidden 50
    accounting "pp, 2 stages, gpipe, exact" 0 $MPIRUN -n 2 ./train_pp --schedule gpipe --microbatches 4
    accounting "pp, 4 stages, 1f1b, 29 rows, 3 microbatches" 128 $MPIRUN -n 4 ./train_pp --layers 3 --batch 29 --microbatches 3
    accounting "3d 2 x 2 x 2, ZeRO-3, exact" 0 $MPIRUN -n 8 ./train_3d --tp 2 --dp 2 --pp 2 --zero 3
    accounting "3d 2 x 1 x 3, ZeRO-2, clipping" 128 $MPIRUN -n 6 ./train_3d --tp 2 --dp 1 --pp 3 --zero 2 --layers 3 --clip 1
    accounting "3d 1 x 3 x 1, ZeRO-1" 128 $MPIRUN -n 3 ./train_3d --tp 1 --dp 3 --pp 1 --zero 1
}

# ----------------------------------------------------------------------------
# the GPT (--model gpt; transformer.h): train.c against every layout that splits it, bit
# for bit: rows (dp, fsdp), heads (tp), heads and tokens (tp --sp), positions (cp)
section_gpt() {
    local small="--model gpt --emb 16 --heads 4 --layers 2 --samples 3" flags n
    for opt in "--optimizer sgd --lr 0.05" "--clip 0.5"; do # sgd; adamw (the GPT's default) with clipping
        local tag=gpt_${opt:2:4}
        flags="$small --steps 40 --eval-every 20 $opt"
        reference $tag $flags
        for n in 2 3; do
            same_as $tag "gpt: dp on $n ranks, ${opt%% *} ${opt#* }, same as train.c" $MPIRUN -n $n ./train_dp $flags
        done
        for z in 1 2 3; do
            same_as $tag "gpt: ZeRO-$z on 3 ranks, $opt, same as train.c" $MPIRUN -n 3 ./train_fsdp --zero $z $flags
        done
        for n in 1 2 4; do
            same_as $tag "gpt: tp on $n ranks (heads split), $opt, same as train.c" $MPIRUN -n $n ./train_tp $flags
            same_as $tag "gpt: tp --sp on $n ranks (heads and tokens split), $opt, same as train.c" $MPIRUN -n $n ./train_tp --sp $flags
        done
        for n in 1 2 4 8; do
            for comm in ring allgather alltoall; do
                [ $comm = alltoall ] && [ $n = 8 ] && continue # Ulysses: 4 heads, at most 4 ranks (refused below)
                same_as $tag "gpt: cp on $n ranks, $comm, zigzag, $opt, same as train.c" $MPIRUN -n $n ./train_cp --cp-comm $comm $flags
            done
        done
        for n in 2 4; do
            same_as $tag "gpt: cp on $n ranks, ring, contiguous, $opt, same as train.c" $MPIRUN -n $n ./train_cp --cp-split contiguous $flags
        done
        same_as $tag "gpt: cp on 4 ranks, alltoall (Ulysses: a head a rank), contiguous, $opt, same as train.c" \
            $MPIRUN -n 4 ./train_cp --cp-comm alltoall --cp-split contiguous $flags
    done
    # 27 rows on 4 ranks (7, 7, 7, 6); a vocabulary of 27 in slices of 14 (one padded); T = 8, cutting longer names
    flags="$small --steps 30 --eval-every 0 --batch 27 --context 8 --clip 1"
    reference gpt_odd $flags
    same_as gpt_odd "gpt: dp, 27 rows on 4 ranks, T=8 (names cut), same as train.c" $MPIRUN -n 4 ./train_dp $flags
    same_as gpt_odd "gpt: tp --sp on 2 ranks, 27 rows x 8 tokens, vocabulary slices of 14, same as train.c" $MPIRUN -n 2 ./train_tp --sp $flags
    same_as gpt_odd "gpt: cp on 4 ranks, T=8 (chunks of 1), same as train.c" $MPIRUN -n 4 ./train_cp $flags
    same_as gpt_odd "gpt: cp alltoall on 2 ranks, 27 rows, T=8 (chunks of 2), same as train.c" $MPIRUN -n 2 ./train_cp --cp-comm alltoall $flags
    # train_cp with cli.h's --recompute and --microbatches: train.c's bits for the same flags
    flags="$small --steps 20 --eval-every 10 --clip 0.5"
    for x in "--recompute selective" "--recompute full" "--microbatches 2" "--microbatches 3" "--microbatches 3 --recompute full"; do
        local tagx=gpt_x${x//[^a-z0-9]/}
        reference $tagx $flags $x
        for comm in ring alltoall; do
            same_as $tagx "gpt: cp on 2 ranks, $comm, $x, same as train.c $x" $MPIRUN -n 2 ./train_cp --cp-comm $comm $flags $x
        done
    done
    same_as gpt_xmicrobatches3recomputefull "gpt: cp on 4 ranks, allgather, --microbatches 3 --recompute full, same as train.c" \
        $MPIRUN -n 4 ./train_cp --cp-comm allgather $flags --microbatches 3 --recompute full
    # what --recompute keeps and sends again: each rank's bytes and memory equal to their formulas,
    # exactly; activations fall none > selective > full; selective sends the ring's K and V again
    # but nothing more for Ulysses (its heads' q, k, v are kept); full sends every forward again
    for comm in ring alltoall; do
        for x in none selective full; do
            run "$TMP/rc.out" $MPIRUN -n 2 ./train_cp --model gpt --cp-comm $comm --recompute $x --steps 2 --samples 0 --summary "$TMP/rc_$x.sum"
        done
        check "gpt: cp $comm --recompute none, selective, full: bytes and memory = formulas; activations fall; bytes again as the formula says" \
            awk -v comm=$comm '/^rank=/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                x = FILENAME; sub(/.*rc_/, "", x); sub(/[.]sum$/, "", x); n[x]++
                if (v["sent"] != v["sent_formula"] || v["params"] + v["grads"] + v["optim"] + v["acts"] != v["mem_formula"]) bad = 1
                acts[x] = v["acts"]; sent[x] = v["sent"] }
                END { again = comm == "alltoall" ? sent["selective"] == sent["none"] : sent["selective"] > sent["none"]
                      exit !(n["none"] == 2 && n["selective"] == 2 && n["full"] == 2 && !bad && again && sent["full"] > sent["none"] &&
                             acts["none"] > acts["selective"] && acts["selective"] > acts["full"]) }' "$TMP/rc_none.sum" "$TMP/rc_selective.sum" "$TMP/rc_full.sum"
        rm -f "$TMP"/rc_*.sum
    done
    # pipelines of blocks (every schedule), and 3D grids with the heads split, with and without --sp
    flags="${small/--layers 2/--layers 6} --steps 20 --eval-every 10 --clip 1"
    reference gpt_deep $flags
    for sched in naive gpipe 1f1b interleaved zb1 zbv; do
        same_as gpt_deep "gpt: pp on 4 stages, $sched, 8 microbatches, same as train.c" $MPIRUN -n 4 ./train_pp --schedule $sched --microbatches 8 $flags
    done
    reference gpt_deep27 $flags --batch 27
    same_as gpt_deep27 "gpt: pp on 3 stages, 1f1b, 27 rows in 5 microbatches, same as train.c" \
        $MPIRUN -n 3 ./train_pp --microbatches 5 $flags --batch 27
    for g in "--tp 2 --dp 2 --pp 2" "--tp 2 --dp 2 --pp 2 --sp" "--tp 4 --dp 1 --pp 2 --sp --zero 1" "--tp 2 --dp 1 --pp 2 --schedule zbv --sp"; do
        n=$(echo $g | awk '{ print $2 * $4 * $6 }')
        same_as gpt_deep "gpt: 3d $g, same as train.c" $MPIRUN -n $n ./train_3d $g $flags
    done
    # 4D: the context axis in the grid (Llama 3's order: tensor, context, pipeline, data)
    flags="$small --steps 20 --eval-every 10"
    for opt in "--optimizer sgd --lr 0.05" "--clip 0.5"; do
        local tag4=gpt4d_${opt:2:4}
        reference $tag4 $flags $opt
        for g in "--tp 2 --cp 2 --pp 2 --dp 2" "--tp 1 --cp 4 --pp 2 --dp 1 --schedule zbv" "--tp 2 --cp 2 --pp 1 --dp 2 --sp --cp-comm allgather" \
                 "--tp 1 --cp 2 --pp 2 --dp 2 --cp-split contiguous --zero 1" "--tp 2 --cp 2 --pp 1 --dp 1 --cp-comm alltoall"; do
            n=$(echo $g | awk '{ print $2 * $4 * $6 * $8 }')
            same_as $tag4 "gpt: 4d $g, ${opt%% *} ${opt#* }, same as train.c" $MPIRUN -n $n ./train_3d $g $flags $opt
        done
    done
    accounting "gpt: 4d 2 x 2 x 2 x 2 (the loss, 1 sum over 4 ranks in uneven chunks)" 128 $MPIRUN -n 16 ./train_3d --model gpt --tp 2 --cp 2 --pp 2 --dp 2
    same_as gpt4d_opti "gpt: 4d --tp 1 --cp 2 --pp 2 --dp 1 --cp-comm alltoall --cp-split contiguous, same as train.c" \
        $MPIRUN -n 4 ./train_3d --tp 1 --cp 2 --pp 2 --dp 1 --cp-comm alltoall --cp-split contiguous $flags --optimizer sgd --lr 0.05
    accounting "gpt: 4d 2 x 2 x 1 x 1, alltoall (Ulysses at a tensor rank's heads)" 128 $MPIRUN -n 4 ./train_3d --model gpt --tp 2 --cp 2 --pp 1 --dp 1 --cp-comm alltoall
    expect_error 2 "so --cp must divide 2: --cp 2 would do" "gpt: 3d --cp 4 --cp-comm alltoall with 2 heads a tensor rank is refused, saying which --cp would do" \
        -- $MPIRUN -n 8 ./train_3d --model gpt --tp 2 --cp 4 --pp 1 --dp 1 --cp-comm alltoall
    expect_error 2 "only the GPT has" "gpt: 3d --cp with the MLP is refused" -- $MPIRUN -n 2 ./train_3d --cp 2 --tp 1 --dp 1 --pp 1
    expect_error 2 "so 6 must divide T" "gpt: 3d --cp 3 (2C = 6 does not divide T = 16) is refused" -- $MPIRUN -n 3 ./train_3d --model gpt --cp 3 --tp 1 --dp 1 --pp 1
    expect_error 2 "apply with --cp 2 or more" "gpt: 3d --cp-comm without --cp is refused" -- $MPIRUN -n 2 ./train_3d --model gpt --tp 2 --dp 1 --pp 1 --cp-comm allgather
    expect_error 2 "x --cp 2 x --dp 2 x --pp 2 = 16, but mpirun started 8" "gpt: 3d a grid that is not the world is refused" -- $MPIRUN -n 8 ./train_3d --model gpt --tp 2 --cp 2 --dp 2 --pp 2
    # resuming across programs: train.c's checkpoint in train_cp and train_tp --sp, train_cp's in train.c
    flags="$small --steps 30 --eval-every 0 --clip 1"
    reference gpt_r $flags
    run "$TMP/gpt_half.out" ./train ${flags/--steps 30/--steps 15} --quiet --save "$TMP/gpt_half.ckpt"
    same_as gpt_r "gpt: train_cp resumes train.c's checkpoint, same as train.c" $MPIRUN -n 2 ./train_cp $flags --load "$TMP/gpt_half.ckpt"
    same_as gpt_r "gpt: train_tp --sp resumes train.c's checkpoint, same as train.c" $MPIRUN -n 2 ./train_tp --sp $flags --load "$TMP/gpt_half.ckpt"
    run "$TMP/gpt_half2.out" $MPIRUN -n 4 ./train_cp ${flags/--steps 30/--steps 15} --quiet --save "$TMP/gpt_half2.ckpt"
    same_as gpt_r "gpt: train.c resumes train_cp's checkpoint, same as train.c" ./train $flags --load "$TMP/gpt_half2.ckpt"
    # the one-pass online softmax of ring attention as usually written: within a rounding of
    # train.c, but not its bits, and not the same on 2 and on 4 ranks (why two passes)
    flags="$small --steps 20 --eval-every 0"
    reference gpt_on $flags
    for n in 2 4; do
        run "$TMP/on$n.out" $MPIRUN -n $n ./train_cp --cp-softmax online $flags --quiet --log "$TMP/on$n.csv" --save "$TMP/on$n.ckpt"
    done
    tools/compare "$TMP/gpt_on.csv" "$TMP/on2.csv" "$TMP/gpt_on.ckpt" "$TMP/on2.ckpt" >"$TMP/on.cmp"
    check "gpt: cp --cp-softmax online differs from train.c from step 1, by a rounding ($(cat "$TMP/on.cmp"))" \
        grep -Eq "^differ: first at step 1; losses up to [0-9.]+e-(0[7-9]|[1-9][0-9]) relative" "$TMP/on.cmp"
    check "gpt: cp --cp-softmax online on 2 ranks and on 4 differ from each other: the online softmax depends on the split" \
        bash -c "! tools/compare $TMP/on2.csv $TMP/on4.csv $TMP/on2.ckpt $TMP/on4.ckpt"
    expect_error 2 "applies to --cp-comm ring" "gpt: --cp-softmax online with the all-gather is refused" -- $MPIRUN -n 2 ./train_cp --model gpt --cp-comm allgather --cp-softmax online
    # what each run prints of itself: the causal pairs of each split, the bytes beside their formulas
    run "$TMP/cp.out" $MPIRUN -n 2 ./train_cp --model gpt --cp-split contiguous --steps 2 --samples 0
    check "gpt: cp prints each rank's positions and causal pairs, contiguous: 36 and 100" \
        grep -q "positions 8 9 10 11 12 13 14 15: 100 causal pairs" "$TMP/cp.out"
    run "$TMP/cp.out" $MPIRUN -n 2 ./train_cp --model gpt --steps 2 --samples 0
    check "gpt: cp prints each rank's positions and causal pairs, zigzag: 68 and 68" \
        grep -q "positions 4 5 6 7 8 9 10 11: 68 causal pairs" "$TMP/cp.out"
    accounting "gpt: tp, 2 ranks, exact" 0 $MPIRUN -n 2 ./train_tp --model gpt
    accounting "gpt: tp --sp, 4 ranks, clipping (a norm of 1 element in chunks of 1, 0, 0, 0)" 128 $MPIRUN -n 4 ./train_tp --model gpt --sp --clip 1
    accounting "gpt: cp ring, 4 ranks (P + 1 sums in uneven chunks)" 128 $MPIRUN -n 4 ./train_cp --model gpt
    accounting "gpt: cp all-gather, 2 ranks, exact" 0 $MPIRUN -n 2 ./train_cp --model gpt --cp-comm allgather
    accounting "gpt: cp all-to-all (Ulysses), 2 ranks, exact" 0 $MPIRUN -n 2 ./train_cp --model gpt --cp-comm alltoall
    accounting "gpt: cp all-to-all (Ulysses), 4 ranks, contiguous" 128 $MPIRUN -n 4 ./train_cp --model gpt --cp-comm alltoall --cp-split contiguous
    accounting "gpt: ZeRO-3, 2 ranks, exact" 0 $MPIRUN -n 2 ./train_fsdp --model gpt --zero 3
    run "$TMP/tp.out" $MPIRUN -n 2 ./train_tp --model gpt --sp --steps 2 --samples 0
    check "gpt: tp --sp prints the blocks' activations held beside Korthikanti et al.'s form, equal" \
        awk '/activations of the [0-9]+ blocks per rank/ { n++; held = $0; sub(/ B held.*/, "", held); sub(/.*: /, "", held); f = $NF == "B" ? $(NF-1) : $NF; if (held + 0 == f + 0 && held > 0) ok++ } END { exit !(n == 1 && ok == 1) }' "$TMP/tp.out"
    # bad inputs, refused on every rank with one message
    expect_error 2 "--hidden applies to --model mlp" "gpt: --hidden is refused, saying why" -- ./train --model gpt --hidden 64
    expect_error 2 "--heads applies to --model gpt" "gpt: --heads without --model gpt is refused" -- ./train --heads 4
    expect_error 2 "--emb 60 is not a multiple of --heads 8" "gpt: heads that do not divide the width are refused" -- ./train --model gpt --emb 60 --heads 8
    expect_error 2 "--model must be mlp or gpt" "gpt: an unknown model is refused" -- ./train --model rnn
    expect_error 2 "3 ranks but 4 heads" "gpt: tp on ranks that do not divide the heads is refused" -- $MPIRUN -n 3 ./train_tp --model gpt
    expect_error 2 "--tp must divide --heads" "gpt: 3d with --tp not dividing the heads is refused" -- $MPIRUN -n 3 ./train_3d --model gpt --tp 3 --dp 1 --pp 1
    expect_error 2 "--sp applies to --model gpt" "gpt: 3d --sp with the MLP is refused" -- $MPIRUN -n 2 ./train_3d --tp 2 --dp 1 --pp 1 --sp
    expect_error 2 "--sp applies to --model gpt" "gpt: --sp with the MLP is refused, saying why" -- $MPIRUN -n 2 ./train_tp --sp
    expect_error 2 "so 2N must divide T" "gpt: cp on 3 ranks (2N = 6 does not divide T = 16) is refused" -- $MPIRUN -n 3 ./train_cp --model gpt
    expect_error 2 "which only the GPT has" "gpt: cp with the MLP is refused, saying why" -- $MPIRUN -n 2 ./train_cp
    expect_error 2 "--cp-comm must be ring, allgather or alltoall" "gpt: a bad --cp-comm is refused" -- $MPIRUN -n 2 ./train_cp --model gpt --cp-comm tree
    expect_error 2 "so N must divide the heads: N = 2 or 4 would do" "gpt: cp alltoall on 8 ranks and 4 heads is refused, saying which N would do" \
        -- $MPIRUN -n 8 ./train_cp --model gpt --cp-comm alltoall
    expect_error 2 "no N above 1 would do" "gpt: cp alltoall with 3 heads and T = 16 is refused: no N fits both" \
        -- $MPIRUN -n 2 ./train_cp --model gpt --cp-comm alltoall --emb 12 --heads 3
    expect_error 1 "cannot open data file" "gpt: a missing data file ends every rank of train_cp" -- $MPIRUN -n 2 ./train_cp --model gpt --data /nonexistent
}

# ----------------------------------------------------------------------------
# 5D: the expert axis in train_3d.c (--ep E, carved out of the data axis), the GPT with
# experts in every block, against train.c bit for bit
section_5d() {
    local m="--model gpt --emb 16 --heads 4 --layers 2" flags grid n opt tag
    flags="$m --experts 4 --samples 3 --steps 20 --eval-every 10"
    # one microbatch: train.c's capacity and load-balancing loss over the whole batch. Grids
    # with every axis above 1 (16 ranks), E below D (the EP group a part of the data axis),
    # E = D with the context axis, 4 experts over 3 ranks (2, 1, 1), and no expert axis
    for opt in "--optimizer sgd --lr 0.05" "--top-k 2 --clip 0.5"; do # top-1 sgd; top-2 adamw (the GPT's default) with clipping
        tag=5d_${opt:2:4}
        reference $tag $flags $opt
        for grid in "--tp 2 --cp 2 --pp 2 --dp 2 --ep 2" "--tp 2 --cp 1 --pp 1 --dp 4 --ep 2 --zero 2" \
                    "--tp 1 --cp 2 --pp 1 --dp 4 --ep 4 --zero 1" "--tp 2 --cp 1 --pp 1 --dp 3 --ep 3 --prefetch" \
                    "--tp 2 --cp 1 --pp 2 --dp 2 --ep 2 --schedule zbv" "--tp 2 --cp 2 --pp 2 --dp 1"; do
            n=$(echo $grid | awk '{ print $2 * $4 * $6 * $8 }')
            same_as $tag "5d: $grid, ${opt%% *} ${opt#* }, same as train.c" \
                $MPIRUN -n $n ./train_3d $grid --microbatches 1 $flags $opt
        done
    done
    # a capacity that drops tokens in both blocks: 27 rows on 4 replicas (7, 7, 7, 6), 5 experts over 2 (3, 2)
    local drop="$m --experts 5 --top-k 2 --capacity 0.5 --batch 27 --steps 20"
    run "$TMP/5d_drops.out" ./train $drop --eval-every 0 --samples 0
    check "5d: train.c drops tokens in both blocks at capacity 0.5 ($(grep -m1 'dropped [0-9]' "$TMP/5d_drops.out"))" \
        bash -c "[ \$(grep -cE 'dropped [1-9][0-9.]* tokens per step' '$TMP/5d_drops.out') = 2 ]"
    reference 5d_drop $drop --eval-every 10 --samples 3
    for grid in "--tp 2 --cp 2 --pp 2 --dp 2 --ep 2" "--tp 1 --cp 2 --pp 1 --dp 4 --ep 2"; do
        n=$(echo $grid | awk '{ print $2 * $4 * $6 * $8 }')
        same_as 5d_drop "5d: $grid, 27 rows, capacity 0.5, top-2, same as train.c" \
            $MPIRUN -n $n ./train_3d $grid --microbatches 1 $drop --eval-every 10 --samples 3
    done
    # several microbatches: the capacity and the load-balancing loss per microbatch, as train.c
    # --microbatches M computes them (the grid's default is 4; each replica a share of each)
    flags="$m --experts 4 --samples 3 --steps 20 --eval-every 10 --clip 0.5"
    reference 5d_m4 $flags --microbatches 4
    same_as 5d_m4 "5d: --tp 2 --cp 2 --pp 2 --dp 2 --ep 2 at its default 4 microbatches, 1f1b, same as train.c --microbatches 4" \
        $MPIRUN -n 16 ./train_3d --tp 2 --cp 2 --pp 2 --dp 2 --ep 2 $flags
    reference 5d_m3 $flags --microbatches 3 --top-k 2
    same_as 5d_m3 "5d: --pp 2 --dp 4 --ep 2, 3 microbatches, top-2, zbv, same as train.c --microbatches 3" \
        $MPIRUN -n 8 ./train_3d --tp 1 --pp 2 --dp 4 --ep 2 --microbatches 3 --schedule zbv $flags --top-k 2
    reference 5d_m2drop $drop --eval-every 10 --samples 3 --microbatches 2
    same_as 5d_m2drop "5d: --cp 2 --dp 4 --ep 2, 27 rows in 2 microbatches, capacity 0.5 (drops per microbatch), same as train.c" \
        $MPIRUN -n 8 ./train_3d --tp 1 --cp 2 --pp 1 --dp 4 --ep 2 --microbatches 2 $drop --eval-every 10 --samples 3
    # fine-grained experts in a 4D grid: top-4 of 8 experts a quarter of 4C wide, 2 microbatches,
    # selective recomputation
    flags="$m --experts 8 --top-k 4 --expert-hidden 16 --samples 3 --steps 20 --eval-every 10"
    reference 5d_k4 $flags --microbatches 2 --recompute selective
    same_as 5d_k4 "5d: --tp 2 --pp 2 --dp 2 --ep 2, top-4 of 8 experts 16 wide, 2 microbatches, selective recomputation, same as train.c" \
        $MPIRUN -n 8 ./train_3d --tp 2 --cp 1 --pp 2 --dp 2 --ep 2 --microbatches 2 --recompute selective $flags
    # DeepSeek-V3's router in the grid: sigmoid, balanced by a bias moved by the whole batch's
    # counts; and the biases of a pipeline's later stage saved, then resumed by train.c
    flags="$m --experts 8 --top-k 4 --expert-hidden 16 --router sigmoid --balance bias --bias-rate 0.01 --samples 3 --eval-every 10 --microbatches 2"
    reference 5d_bias $flags --steps 20 --recompute selective
    same_as 5d_bias "5d: --tp 2 --pp 2 --dp 2 --ep 2, sigmoid router and bias balancing, top-4 of 8, 2 microbatches, selective recomputation, same as train.c" \
        $MPIRUN -n 8 ./train_3d --tp 2 --cp 1 --pp 2 --dp 2 --ep 2 $flags --steps 20 --recompute selective
    run "$TMP/5d_bias10.out" $MPIRUN -n 4 ./train_3d --tp 1 --cp 1 --pp 2 --dp 2 --ep 2 $flags --steps 10 --recompute selective \
        --quiet --save "$TMP/5d_bias10.ckpt"
    same_as 5d_bias "5d: train.c resumes the grid's --balance bias checkpoint of step 10 (--pp 2: the second block's biases from its stage), same as train.c" \
        ./train $flags --steps 20 --recompute selective --load "$TMP/5d_bias10.ckpt"
    # resuming across programs: train.c's checkpoint in the 5D grid, and the grid's in train.c
    flags="$m --experts 4 --samples 3 --steps 20 --eval-every 0 --top-k 2 --clip 0.5"
    reference 5d_r $flags
    run "$TMP/5d_half.out" ./train ${flags/--steps 20/--steps 10} --quiet --save "$TMP/5d_half.ckpt"
    same_as 5d_r "5d: the 16-rank grid resumes train.c's checkpoint of step 10, same as train.c" \
        $MPIRUN -n 16 ./train_3d --tp 2 --cp 2 --pp 2 --dp 2 --ep 2 --microbatches 1 $flags --load "$TMP/5d_half.ckpt"
    run "$TMP/5d_half2.out" $MPIRUN -n 8 ./train_3d --tp 1 --cp 2 --pp 1 --dp 4 --ep 2 --zero 3 --microbatches 1 \
        ${flags/--steps 20/--steps 10} --quiet --save "$TMP/5d_half2.ckpt"
    same_as 5d_r "5d: train.c resumes the grid's checkpoint of step 10 (ZeRO-3, experts sharded apart), same as train.c" \
        ./train $flags --load "$TMP/5d_half2.ckpt"
    # what the grid prints of itself, bytes and memory beside their formulas
    run "$TMP/5d.out" $MPIRUN -n 16 ./train_3d $m --experts 4 --tp 2 --cp 2 --pp 2 --dp 2 --ep 2 --microbatches 1 --steps 2 --samples 0
    check "5d: rank 0 prints each rank's place on the expert axis and its experts" \
        grep -qF "rank 13    tp 1, cp 0, stage 1, replica 1 (expert group 0, member 1): block 2 head + loss (rows 16-31 of microbatch 0, positions 0 1 2 3 12 13 14 15, slice 1 of 2, shard 2 of 4; experts 2-3 of each block, shard 0 of 2)" "$TMP/5d.out"
    check "5d: every rank's bytes on each of the five axes, beside each axis's formula" \
        bash -c "[ \$(grep -cE '^  rank [0-9]+ +tp .* \(.*\), cp .* \(.*\), dp .* \(.*\), pp .* \(.*\), ep [1-9].* \(.*\)$' '$TMP/5d.out') = 16 ]"
    accounting "5d 2 x 2 x 2 x 2, EP 2, one microbatch (the choices all-gathered)" 128 \
        $MPIRUN -n 16 ./train_3d $m --experts 4 --tp 2 --cp 2 --pp 2 --dp 2 --ep 2 --microbatches 1
    accounting "5d 1 x 1 x 2 x 4, EP 4, top-2, ZeRO-1" 128 \
        $MPIRUN -n 8 ./train_3d $m --experts 4 --tp 1 --pp 2 --dp 4 --ep 4 --microbatches 1 --top-k 2 --zero 1
    accounting "5d 2 x 2 x 2 x 2, EP 2, 4 microbatches (the counts in the EP group, each microbatch)" 128 \
        $MPIRUN -n 16 ./train_3d $m --experts 4 --tp 2 --cp 2 --pp 2 --dp 2 --ep 2
    # bad grids: refused on every rank with one message, exit 2
    local x="$m --experts 4"
    refused_5d "--ep 2 does not divide --dp 3" "an --ep that does not divide --dp" 3 $x --tp 1 --pp 1 --dp 3 --ep 2 --microbatches 1
    refused_5d "it applies with --model gpt --experts X" "--ep without --experts" 2 $m --tp 1 --pp 1 --dp 2 --ep 2
    refused_5d "--ep 4 but --experts 2: every expert-parallel rank needs at least one expert" \
        "more expert-parallel ranks than experts" 4 $m --experts 2 --tp 1 --pp 1 --dp 4 --ep 4 --microbatches 1
    refused_5d "the MLP's mixture of experts trains in train.c and train_ep.c" "the MLP's experts" 2 --experts 4 --tp 1 --pp 1 --dp 2
    refused_5d "--sp with --experts" "--sp with --experts" 2 $x --tp 2 --pp 1 --dp 1 --sp --microbatches 1
}
# refused_5d TEXT NAME RANKS FLAGS...: train_3d refuses these flags with one message holding TEXT, exit 2
refused_5d() {
    local text=$1 name=$2 ranks=$3 ok=0
    shift 3
    run "$TMP/5d_bad" $MPIRUN -n $ranks ./train_3d "$@" --steps 2
    local status=$?
    [ $status = 2 ] && [ "$(grep -c '^error:' "$TMP/5d_bad")" = 1 ] && grep -qF -- "$text" "$TMP/5d_bad" && ok=1
    check "5d: $name, refused once, exit 2 (exit $status: $(grep -m1 '^error' "$TMP/5d_bad" | cut -c1-100))" test $ok = 1
}

# ----------------------------------------------------------------------------
# --recompute (activation recomputation): the same bits as without it in every program that
# holds activations, since a forward is a pure function of its input and parameters here;
# the activations held follow the forms; the layouts that cannot run it are refused
section_recompute() {
    local m="--model gpt --emb 16 --heads 4 --layers 2" how
    local g="$m --samples 3 --steps 20 --eval-every 10"
    reference rc $g
    for how in selective full; do
        same_as rc "recompute: train.c --recompute $how, same as without" ./train $g --recompute $how
        same_as rc "recompute: train_dp, 2 ranks, --recompute $how, same as train.c" $MPIRUN -n 2 ./train_dp $g --recompute $how
        same_as rc "recompute: train_tp --sp, 2 ranks, --recompute $how, same as train.c" \
            $MPIRUN -n 2 ./train_tp --sp $g --recompute $how
        same_as rc "recompute: train_pp, 2 stages, 1f1b, 4 microbatches, --recompute $how, same as train.c" \
            $MPIRUN -n 2 ./train_pp --schedule 1f1b --microbatches 4 $g --recompute $how
        same_as rc "recompute: train_cp, 2 ranks, alltoall (Ulysses), --recompute $how, same as train.c" \
            $MPIRUN -n 2 ./train_cp --cp-comm alltoall $g --recompute $how
    done
    same_as rc "recompute: train_dp --overlap, 2 ranks, --recompute full, same as train.c" \
        $MPIRUN -n 2 ./train_dp --overlap $g --recompute full
    same_as rc "recompute: train_fsdp ZeRO-3 --prefetch, 2 ranks, --recompute full, same as train.c" \
        $MPIRUN -n 2 ./train_fsdp --zero 3 --prefetch $g --recompute full
    same_as rc "recompute: train_fsdp ZeRO-1, 2 ranks, --recompute selective, same as train.c" \
        $MPIRUN -n 2 ./train_fsdp --zero 1 $g --recompute selective
    same_as rc "recompute: train_pp, 2 stages, zbv, --recompute selective, same as train.c" \
        $MPIRUN -n 2 ./train_pp --schedule zbv --microbatches 4 $g --recompute selective
    same_as rc "recompute: train_3d --tp 2 --pp 2 --dp 1, --recompute full, same as train.c" \
        $MPIRUN -n 4 ./train_3d --tp 2 --pp 2 --dp 1 $g --recompute full
    same_as rc "recompute: train_3d --tp 2 --cp 2 --pp 2 --dp 1 --sp, --recompute selective, same as train.c" \
        $MPIRUN -n 8 ./train_3d --tp 2 --cp 2 --pp 2 --dp 1 --sp $g --recompute selective
    same_as rc "recompute: train_3d --tp 2 --cp 2 --pp 1 --dp 1 --cp-comm alltoall, --recompute selective (Ulysses' heads' attention again), same as train.c" \
        $MPIRUN -n 4 ./train_3d --tp 2 --cp 2 --pp 1 --dp 1 --cp-comm alltoall $g --recompute selective
    reference rc_x $g --experts 4
    same_as rc_x "recompute: train_ep, 4 experts over 2 ranks, --recompute selective, same as train.c" \
        $MPIRUN -n 2 ./train_ep --experts 4 $g --recompute selective
    # what is held: less with each, and train_tp's blocks equal to Korthikanti et al.'s forms
    local acts=""
    for how in none selective full; do
        run "$TMP/rc_$how.out" ./train ${g/--steps 20/--steps 1} --recompute $how
        acts="$acts $(grep -m1 '^  rank 0 ' "$TMP/rc_$how.out" | sed 's/.* + \([0-9.]* [KM]*B\) = .*/\1/')"
    done
    check "recompute: train.c holds fewer activations with selective, fewer again with full (${acts# })" \
        awk -v a="$acts" 'BEGIN { n = split(a, w, " "); for (i = 1; i <= n; i += 2) v[(i + 1) / 2] = w[i] * (w[i + 1] == "MB" ? 1e6 : w[i + 1] == "KB" ? 1e3 : 1)
            exit !(n == 6 && v[1] > v[2] && v[2] > v[3] && v[3] > 0) }'
    for how in selective full; do
        run "$TMP/tp.out" $MPIRUN -n 2 ./train_tp --sp $m --recompute $how --steps 2
        check "recompute: train_tp --sp --recompute $how holds the blocks' activations of its form, equal" \
            awk '/activations of the [0-9]+ blocks per rank/ { n++; held = $0; sub(/ B held.*/, "", held); sub(/.*: /, "", held); f = $NF == "B" ? $(NF-1) : $NF; if (held + 0 == f + 0 && held > 0) ok++ } END { exit !(n == 1 && ok == 1) }' "$TMP/tp.out"
        accounting "recompute: tp --sp, 2 ranks, --recompute $how (the second forward's f and g counted)" 0 \
            $MPIRUN -n 2 ./train_tp --sp $m --recompute $how
    done
    accounting "recompute: 3d --tp 2 --cp 2 --pp 2, selective (attention's K and V round the ring again)" 128 \
        $MPIRUN -n 8 ./train_3d $m --tp 2 --cp 2 --pp 2 --dp 1 --recompute selective
    accounting "recompute: 3d --tp 2 --cp 2, alltoall, selective (Ulysses sends nothing again)" 128 \
        $MPIRUN -n 4 ./train_3d $m --tp 2 --cp 2 --pp 1 --dp 1 --cp-comm alltoall --recompute selective
    # a pipeline's microbatches in flight keep what each block keeps, and share one block's room
    local p4="--model gpt --emb 16 --heads 4 --layers 4" held=""
    for how in none selective full; do
        accounting "recompute: pp, 2 stages, 1f1b, --recompute $how (memory = the peak's formula)" 0 \
            $MPIRUN -n 2 ./train_pp $p4 --recompute $how
        held="$held $(sed -n 's/^rank=0 .*acts=\([0-9.e+]*\).*/\1/p' "$TMP/acc.sum")"
    done
    check "recompute: train_pp's stage 0 holds fewer activations with selective, fewer again with full (${held# } B)" \
        awk -v h="$held" 'BEGIN { n = split(h, v, " "); exit !(n == 3 && v[1] + 0 > v[2] + 0 && v[2] + 0 > v[3] + 0 && v[3] + 0 > 0) }'
    # refused, saying why
    expect_error 2 "--recompute applies to --model gpt" "recompute: the MLP is refused (nothing to recompute)" -- ./train --recompute full
    expect_error 2 "--recompute full with --experts" "recompute: full with experts is refused" -- ./train $g --experts 4 --recompute full
    expect_error 2 "--recompute must be none, selective or full, got 'some'" "recompute: an unknown value is refused" -- ./train $g --recompute some
    expect_error 2 "--recompute full with --schedule zb1" "recompute: full with a schedule that runs W apart is refused" \
        -- $MPIRUN -n 2 ./train_pp $g --schedule zb1 --microbatches 4 --recompute full
}

# ----------------------------------------------------------------------------
# --microbatches (gradient accumulation): the batch in M passes, one optimizer step; the same
# bits as M = 1 for the dense models (every sum exact); with experts, capacity and the
# load-balancing loss per microbatch, as train.c --microbatches M computes them
section_accumulation() {
    local f="--steps 30 --eval-every 15 --samples 3" g="--model gpt --emb 16 --heads 4 --layers 2 --samples 3 --steps 20 --eval-every 10"
    reference ac $f
    same_as ac "accumulation: train.c --microbatches 3 (32 rows as 11, 11, 10), same as 1" ./train $f --microbatches 3
    same_as ac "accumulation: train.c --microbatches 32 (a row at a time), same as 1" ./train $f --microbatches 32
    same_as ac "accumulation: train_dp, 2 ranks, 3 microbatches, same as train.c" $MPIRUN -n 2 ./train_dp $f --microbatches 3
    same_as ac "accumulation: train_fsdp ZeRO-1, 2 ranks, 2 microbatches, same as train.c" \
        $MPIRUN -n 2 ./train_fsdp --zero 1 $f --microbatches 2
    same_as ac "accumulation: train_tp, 2 ranks, 4 microbatches, same as train.c" $MPIRUN -n 2 ./train_tp $f --microbatches 4
    reference acg $g
    same_as acg "accumulation: train.c --model gpt --microbatches 4, same as 1" ./train $g --microbatches 4
    same_as acg "accumulation: train_dp --overlap, GPT, 2 ranks, 2 microbatches, same as train.c" \
        $MPIRUN -n 2 ./train_dp --overlap $g --microbatches 2
    same_as acg "accumulation: train_fsdp ZeRO-3, GPT, 2 ranks, 3 microbatches, --recompute full, same as train.c" \
        $MPIRUN -n 2 ./train_fsdp --zero 3 $g --microbatches 3 --recompute full
    same_as acg "accumulation: train_tp --sp, GPT, 2 ranks, 2 microbatches, same as train.c" \
        $MPIRUN -n 2 ./train_tp --sp $g --microbatches 2
    # experts: the capacity is a microbatch's, so with drops M changes the result (as in Megatron-LM)
    local x="--experts 4 --capacity 0.5 $f"
    reference ac_x1 $x
    reference ac_x2 $x --microbatches 2
    check "accumulation: with experts dropping tokens, 2 microbatches train otherwise than 1 (capacity per microbatch)" \
        bash -c "! cmp -s '$TMP/ac_x1.ckpt' '$TMP/ac_x2.ckpt'"
    same_as ac_x2 "accumulation: train_ep, 4 experts over 2 ranks, capacity 0.5, 2 microbatches, same as train.c --microbatches 2" \
        $MPIRUN -n 2 ./train_ep $x --microbatches 2
    reference ac_x3 $x --top-k 2 --microbatches 3
    same_as ac_x3 "accumulation: train_ep, 3 ranks, top-2, 3 microbatches, same as train.c --microbatches 3" \
        $MPIRUN -n 3 ./train_ep $x --top-k 2 --microbatches 3
    reference ac_gx $g --experts 4 --microbatches 2
    same_as ac_gx "accumulation: train_ep, GPT, 2 ranks, 2 microbatches, --recompute selective, same as train.c --microbatches 2" \
        $MPIRUN -n 2 ./train_ep $g --experts 4 --microbatches 2 --recompute selective
    accounting "accumulation: ep, 2 ranks, 4 microbatches (the counts and loss each microbatch)" 128 \
        $MPIRUN -n 2 ./train_ep --experts 4 --microbatches 4
    accounting "accumulation: dp, 2 ranks, 3 microbatches (one all-reduce a step)" 0 $MPIRUN -n 2 ./train_dp --microbatches 3
    accounting "accumulation: fsdp ZeRO-3, 2 ranks, 3 microbatches (each microbatch's gathers and reduce-scatters)" 0 \
        $MPIRUN -n 2 ./train_fsdp --zero 3 --microbatches 3
    accounting "accumulation: fsdp ZeRO-1, 2 ranks, 3 microbatches (one all-reduce a step)" 0 $MPIRUN -n 2 ./train_fsdp --zero 1 --microbatches 3
    accounting "accumulation: tp --sp, GPT, 2 ranks, 3 microbatches (the LayerNorms' all-reduce each microbatch)" 0 \
        $MPIRUN -n 2 ./train_tp --model gpt --emb 16 --heads 4 --layers 2 --sp --microbatches 3
    accounting "accumulation: cp, GPT, 2 ranks, 3 microbatches" 128 $MPIRUN -n 2 ./train_cp --model gpt --emb 16 --heads 4 --layers 2 --microbatches 3
    expect_error 2 "cannot be cut into 8 microbatches" "accumulation: a batch smaller than M is refused" -- ./train --batch 4 --microbatches 8
    expect_error 2 "--microbatches must be an integer from 1 to 65536, got '0'" "accumulation: --microbatches 0 is refused" \
        -- ./train --microbatches 0
}

# ----------------------------------------------------------------------------
section_run() {
    # the whole of make run QUICK=1 is one command: about 3 minutes on an idle 2-core machine,
    # more than 20 with two other processes busy beside it (issue 48: item 9). Its programs'
    # own watchdogs (--timeout, 300 s without a step) still end a hang.
    local LIMIT=$((LIMIT * 12)) status
    run "$TMP/run.out" env QUICK=1 OUT="$TMP/out" bash tools/run_all.sh
    status=$?
    [ $status = 124 ] && fail "run: make run QUICK=1 ran past $LIMIT s (TEST_TIME_LIMIT x 12), so the checks below fail"
    local rows
    rows=$(grep -c '^| train' "$TMP/run.out")
    check "run: make run QUICK=1 prints 16 rows, each the same as train.c, or as its reference train.c --experts 4, --model gpt, --model gpt --experts 4 or DeepSeek-V3's mixture ($(grep '^| train' "$TMP/run.out" | cut -d'|' -f2,6 | tr '\n' ';'))" \
        bash -c "test $rows = 16 && test \$(grep '^| train' '$TMP/run.out' | cut -d'|' -f6 | grep -c '^ yes $') = 12 && grep -q '^| train.c | 1 process, 4 experts a layer, top-1 | 1 | .* | reference of the rows below |' '$TMP/run.out' && grep -q '^| train.c | 1 process | 1 | .* | reference of the rows below |' '$TMP/run.out'"
    check "run: the GPT's rows (train_tp.c --sp, train_cp.c, the 4D grid) are the same as train.c --model gpt" \
        bash -c "test \$(grep -E '^\| train_(tp|cp|3d).c .*(sequence parallel|context parallel|context x)' '$TMP/run.out' | grep -v expert | grep -c '| yes |') = 3 && grep -q '^identical' '$TMP/out/runs/gpt_cp.cmp'"
    check "run: the 5D row (train_3d.c, experts over 2 of the data-parallel ranks) is the same as train.c --model gpt --experts 4" \
        bash -c "grep '^| train_3d.c .*expert parallel over 2' '$TMP/run.out' | grep -q '| yes |' && grep -q '^identical' '$TMP/out/runs/gpt_5d.cmp' && grep -q 'experts' '$TMP/out/runs/gptmoe.sum'"
    check "run: DeepSeek-V3's mixture (16 experts of width 64, top-4, 1 shared, sigmoid and bias) over 2 ranks in train_ep.c is the same as train.c" \
        bash -c "grep -q '^identical' '$TMP/out/runs/dsv3_ep.cmp' && grep -q 'experts=16 top_k=4 expert_hidden=64 shared_experts=1' '$TMP/out/runs/dsv3.sum'"
    check "run: train_ep.c's row, compared with train.c --experts 4, is the same" \
        bash -c "grep '^| train_ep.c' '$TMP/run.out' | grep -q '| yes |' && grep -q '^identical' '$TMP/out/runs/ep.cmp' && grep -q 'experts' '$TMP/out/runs/moe.sum'"
    check "run: the table shows measured and formula bytes and memory, and the bubble of the pipelines" \
        bash -c "grep '^| train_pp.c' '$TMP/run.out' | grep -Eq '\| [0-9.]+ (B|KB|MB) \([0-9.]+ (B|KB|MB)\) \| .* \| [0-9.]+ \(' "
    check "run: loss.svg is well-formed XML with one curve per run" \
        bash -c "xmllint --noout '$TMP/out/loss.svg' && test \$(grep -c 'class=\"curve\"' '$TMP/out/loss.svg') = 16"
    check "run: loss.svg's panels say their model (the GPT's was titled as the MLP's: audit 5)" \
        bash -c "grep -q 'train.c (1 process), the MLP:' '$TMP/out/loss.svg' && grep -q 'train.c (1 process), the GPT:' '$TMP/out/loss.svg'"
    check "run: pipeline.svg is well-formed XML with a forward and a backward pass of every microbatch on every stage" \
        bash -c "xmllint --noout '$TMP/out/pipeline.svg' && test \$(grep -c 'class=\"pass\"' '$TMP/out/pipeline.svg') = 16"
    check "run: the schedules table has a row for each of the 6 schedules, each the same as train.c" \
        bash -c "test \$(grep -cE '^\| (naive|gpipe|1f1b|interleaved|zb1|zbv) \| yes \|' '$TMP/run.out') = 6"
    check "run: schedules.svg is well-formed XML with every schedule's measured and simulated actions" \
        bash -c "xmllint --noout '$TMP/out/schedules.svg' && test \$(grep -c 'class=\"action\"' '$TMP/out/schedules.svg') -gt 1000"
    check "run: the pipeline run's --trace is valid JSON for Perfetto" \
        bash -c "head -c 40 '$TMP/out/runs/pp.json' | grep -q traceEvents && tail -1 '$TMP/out/runs/pp.json' | grep -qx ']}'"
}

# ----------------------------------------------------------------------------
# Builds: no compiler, flag, CPU or MPI changes a result (util.h). Every program is built
# by hand, as a user would (`mpicc train_dp.c -o train_dp -lm` and variations), and each
# build is compared with make's train.c over a short run: the loss at every step, the
# final parameters and optimizer state, the validation loss and the names.
BUILD_FLAGS="--steps 30 --eval-every 15 --layers 2 --hidden 48 --batch 24 --optimizer adamw --clip 0.5 --samples 3"
MOE_FLAGS="--experts 4 --top-k 2 --capacity 1"
GPT_FLAGS="--model gpt --emb 16 --heads 4 --layers 2 --steps 10 --eval-every 5 --batch 8 --samples 3 --clip 0.5"
PROGRAMS="train train_dp train_fsdp train_tp train_pp train_3d train_ep train_cp"
# build_all DIR CC FLAGS...: the six programs into DIR, two compilers at a time; the MPI ones
# through $BUILD_MPICC (default mpicc), told to use CC
build_all() {
    local dir=$1 cc=$2
    shift 2
    mkdir -p "$dir"
    for p in $PROGRAMS; do
        if [ "$p" = train ]; then echo "$cc $* train.c -o $dir/train -lm"
        else echo "OMPI_CC=$cc MPICH_CC=$cc ${BUILD_MPICC:-mpicc} $* $p.c -o $dir/$p -lm"; fi
    done | xargs -P 2 -I{} sh -c '{} 2>>'"$dir/build.log"
}
# same_builds DIR LABEL [LAUNCHER]: every program of DIR against train.c, in a small layout each
same_builds() {
    local dir=$1 label=$2 mpirun=${3:-$MPIRUN}
    same_as builds "builds: $label: train.c" "$dir/train" $BUILD_FLAGS
    same_as builds "builds: $label: train_dp.c, 2 ranks" $mpirun -n 2 "$dir/train_dp" $BUILD_FLAGS
    same_as builds "builds: $label: train_fsdp.c, ZeRO-3 on 2 ranks" $mpirun -n 2 "$dir/train_fsdp" $BUILD_FLAGS
    same_as builds "builds: $label: train_tp.c, 2 ranks" $mpirun -n 2 "$dir/train_tp" $BUILD_FLAGS
    same_as builds "builds: $label: train_pp.c, 2 stages, 3 microbatches" $mpirun -n 2 "$dir/train_pp" $BUILD_FLAGS --microbatches 3
    same_as builds "builds: $label: train_3d.c, 2 x 1 x 2" $mpirun -n 4 "$dir/train_3d" $BUILD_FLAGS --tp 2 --dp 1 --pp 2 --microbatches 2
    same_as builds_moe "builds: $label: train.c --experts 4 --top-k 2" "$dir/train" $BUILD_FLAGS $MOE_FLAGS
    same_as builds_moe "builds: $label: train_ep.c, 4 experts on 2 ranks" $mpirun -n 2 "$dir/train_ep" $BUILD_FLAGS $MOE_FLAGS
    same_as builds_gpt "builds: $label: train.c --model gpt" "$dir/train" $GPT_FLAGS
    same_as builds_gpt "builds: $label: train_cp.c --model gpt, 2 ranks" $mpirun -n 2 "$dir/train_cp" $GPT_FLAGS
}
section_builds() {
    # make bench's OpenBLAS check looks for the library, not cblas.h (which the reference
    # BLAS, libblas-dev, installs too): with a compiler that finds no libopenblas it checks
    # (and would install) the library's own path
    printf '#!/bin/sh\nfor a in "$@"; do case $a in -print-file-name=*) echo "${a#-print-file-name=}"; exit 0 ;;\n -print-multiarch) echo no-such-arch; exit 0 ;; esac; done\nexec cc "$@"\n' >"$TMP/noblas_cc"
    chmod +x "$TMP/noblas_cc"
    check "builds: make openblas checks for libopenblas.so itself, not cblas.h" \
        sh -c "make -s -n openblas CC=$TMP/noblas_cc | grep -q 'need.sh /usr/lib/no-such-arch/libopenblas.so libopenblas-dev'"
    reference builds $BUILD_FLAGS
    reference builds_moe $BUILD_FLAGS $MOE_FLAGS
    reference builds_gpt $GPT_FLAGS
    local big="--steps 4 --eval-every 0 --hidden 512 --batch 256 --samples 2"
    reference omp_big $big
    local compilers=gcc i=0 o2
    if command -v clang >/dev/null 2>&1; then compilers="gcc clang"; else skip "builds: clang is not installed (apt-get install clang), only gcc builds ran"; fi
    for cc in $compilers; do
        for set in "" "-O0" "-O2" "-O3" "-O3 -march=native" "-fopenmp" "-O2 -fopenmp"; do
            i=$((i + 1))
            build_all "$TMP/b$i" $cc $set
            same_builds "$TMP/b$i" "$cc ${set:-(no flags)}"
            [ "$set" = -O2 ] && o2=$TMP/b$i
        done
        # the kernels' AVX2 and plain x86-64 variants (KERNEL_ISA) in a build without -march=native
        if [ "$(uname -m)" = x86_64 ]; then
            same_as builds "builds: $cc -O2 with KERNEL_ISA=avx2: train.c" env KERNEL_ISA=avx2 "$o2/train" $BUILD_FLAGS
            same_as builds "builds: $cc -O2 with KERNEL_ISA=any: train.c" env KERNEL_ISA=any "$o2/train" $BUILD_FLAGS
            same_as builds_moe "builds: $cc -O2 with KERNEL_ISA=avx2: train.c --experts 4 --top-k 2" env KERNEL_ISA=avx2 "$o2/train" $BUILD_FLAGS $MOE_FLAGS
            same_as builds_gpt "builds: $cc -O2 with KERNEL_ISA=avx2: train.c --model gpt" env KERNEL_ISA=avx2 "$o2/train" $GPT_FLAGS
            same_as builds_gpt "builds: $cc -O2 with KERNEL_ISA=any: train.c --model gpt" env KERNEL_ISA=any "$o2/train" $GPT_FLAGS
        fi
        # OpenMP threads splitting the kernels of a model large enough to enter them
        same_as omp_big "builds: $cc -O2 -fopenmp: train.c on 2 threads, hidden 512, batch 256" env OMP_NUM_THREADS=2 "$TMP/b$i/train" $big
        for fast in "-Ofast" "-O2 -ffast-math" "-O2 -ffinite-math-only"; do
            expect_error 1 "built with -ffast-math or -Ofast.*Build with -O3 or -O2 instead" \
                "builds: $cc $fast is refused at compile time, saying why" -- sh -c "$cc $fast train.c -o $TMP/fast -lm || exit 1"
        done
    done
    expect_error 1 "built with -ffast-math or -Ofast" "builds: mpicc -Ofast train_dp.c is refused at compile time" \
        -- sh -c "${BUILD_MPICC:-mpicc} -Ofast train_dp.c -o $TMP/fast -lm || exit 1"
    if command -v mpicc.mpich >/dev/null 2>&1 && command -v mpirun.mpich >/dev/null 2>&1; then
        BUILD_MPICC=mpicc.mpich build_all "$TMP/mpich" gcc -O2
        check "builds: MPICH's mpicc -Wall -Wextra builds every program without a warning" \
            bash -c "for p in train_dp train_fsdp train_tp train_pp train_3d train_ep train_cp; do mpicc.mpich -O2 -Wall -Wextra \$p.c -o $TMP/w -lm 2>&1; done | grep -q . && exit 1 || exit 0"
        same_builds "$TMP/mpich" "MPICH, mpicc.mpich -O2" "env MPIEXEC=mpirun.mpich tools/mpirun"
        # MPICH's waiting ranks spin, so make run sizes its 3D row and schedules table with
        # tools/mpirun --ranks (no more ranks than cores under MPICH): such a job must run at
        # least half as fast as OpenMPI's 8 ranks, which yield (1.5 more for a noisy machine)
        local n ms_mpich ms_ompi
        n=$(MPIEXEC=mpirun.mpich tools/mpirun --ranks 8)
        check "builds: MPICH jobs start no more ranks than the $(nproc) cores (tools/mpirun --ranks 8: '$n')" \
            test "$n" -ge 1 -a "$n" -le "$(nproc)"
        local fast="--steps 300 --eval-every 0 --samples 0 --quiet"
        run "$TMP/x.out" env MPIEXEC=mpirun.mpich tools/mpirun -n "$n" "$TMP/mpich/train_3d" --tp "$n" --dp 1 --pp 1 $fast --summary "$TMP/mpich.sum"
        run "$TMP/x.out" tools/mpirun -n 8 "$o2/train_3d" --tp 2 --dp 2 --pp 2 $fast --summary "$TMP/ompi.sum"
        ms_mpich=$(awk -F= '/^seconds=/ { s = $2 } /^steps=/ { n = $2 } END { printf "%.3f", n ? 1e3 * s / n : 1e9 }' "$TMP/mpich.sum" 2>/dev/null)
        ms_ompi=$(awk -F= '/^seconds=/ { s = $2 } /^steps=/ { n = $2 } END { printf "%.3f", n ? 1e3 * s / n : 0 }' "$TMP/ompi.sum" 2>/dev/null)
        check "builds: train_3d under MPICH on those $n ranks takes at most twice OpenMPI's 8 ranks' time a step, x 1.5 ($ms_mpich ms, $ms_ompi ms)" \
            awk -v a="${ms_mpich:-1e9}" -v b="${ms_ompi:-0}" 'BEGIN { exit !(a <= 3 * b) }'
    else
        skip "builds: MPICH is not installed (apt-get install mpich libmpich-dev), only $(mpirun --version 2>&1 | head -1) ran"
    fi
    if command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 && command -v qemu-aarch64 >/dev/null 2>&1; then
        aarch64-linux-gnu-gcc -O2 -static train.c -o "$TMP/train_arm" -lm 2>"$TMP/arm.log"
        same_as builds "builds: aarch64 (gcc cross compiler, run under qemu-aarch64): train.c" qemu-aarch64 "$TMP/train_arm" $BUILD_FLAGS
        same_as builds_moe "builds: aarch64 under qemu: train.c --experts 4 --top-k 2" qemu-aarch64 "$TMP/train_arm" $BUILD_FLAGS $MOE_FLAGS
        same_as builds_gpt "builds: aarch64 under qemu: train.c --model gpt" qemu-aarch64 "$TMP/train_arm" $GPT_FLAGS
    else
        skip "builds: no aarch64 cross compiler and qemu-aarch64 (apt-get install gcc-aarch64-linux-gnu qemu-user)"
    fi
}

# ----------------------------------------------------------------------------
# Emulated hosts (tools/cluster.sh): network namespaces joined by a bridge, TCP between them
section_cluster() {
    local why=""
    if [ "$(id -u)" != 0 ]; then why="not root: network namespaces need root"
    elif ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then why="no iproute2 or unshare"
    elif ! ip netns add mlpc_probe$$ 2>/dev/null; then why="network namespaces are not available here"
    elif ! "${MPIEXEC:-mpirun}" --version 2>&1 | grep -q 'Open MPI'; then ip netns del mlpc_probe$$; why="the emulated cluster needs OpenMPI's mpirun"
    else ip netns del mlpc_probe$$; fi
    if [ -n "$why" ]; then
        skip "cluster: every test of the emulated hosts ($why)"
        return
    fi
    local C=tools/cluster.sh flags="--steps 150 --eval-every 75"
    reference cl $flags
    same_as cl "cluster: train_dp, 2 ranks on 2 hosts (TCP), same as train.c" $C --hosts 2 -- -n 2 ./train_dp $flags
    same_as cl "cluster: train_fsdp ZeRO-3, 2 ranks on 2 hosts, same as train.c" $C --hosts 2 -- -n 2 ./train_fsdp --zero 3 $flags
    same_as cl "cluster: train_tp, 2 ranks on 2 hosts, same as train.c" $C --hosts 2 -- -n 2 ./train_tp $flags
    same_as cl "cluster: train_pp 1f1b, 2 stages on 2 hosts, same as train.c" $C --hosts 2 -- -n 2 ./train_pp --schedule 1f1b $flags
    same_as cl "cluster: train_dp, 4 ranks on 2 hosts over a 100mbit link, same as train.c" $C --hosts 2 --link 100mbit -- -n 4 ./train_dp $flags
    same_as cl "cluster: train_3d 2x2x2 across 4 hosts, same as train.c" $C --hosts 4 -- -n 8 ./train_3d --tp 2 --dp 2 --pp 2 $flags
    run "$TMP/hosts" $C --hosts 4 -- -n 4 sh -c 'echo $(hostname) $(readlink /proc/self/ns/net)'
    check "cluster: 4 ranks on 4 hosts see 4 hostnames and 4 network namespaces" \
        bash -c "test \$(cut -d' ' -f1 '$TMP/hosts' | sort -u | grep -c '^host[0-3]\$') = 4 && test \$(cut -d' ' -f2 '$TMP/hosts' | sort -u | wc -l) = 4"
    # a rank killed on one host: the job ends within 5 seconds, saying so
    $C --hosts 2 -- -n 2 ./train_dp --steps 100000000 --quiet >"$TMP/kill.out" 2>&1 </dev/null &
    local job=$! victim="" t0 ns
    for _ in $(seq 1 100); do
        ns=$(ip netns list | grep -o 'mlpc[0-9]*_host1' | head -1)
        [ -n "$ns" ] && victim=$(ip netns pids "$ns" 2>/dev/null | while read -r pid; do
            grep -q '^./train_dp' "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"; done | head -1)
        [ -n "$victim" ] && break
        sleep 0.1
    done
    sleep 1
    t0=$(date +%s.%N)
    kill -9 "$victim" 2>/dev/null
    wait $job
    local status=$? took
    took=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { print a - b }')
    check "cluster: a rank killed on host1 ends the job in $(printf %.1f "$took") s (exit $status) with mpirun's message" \
        bash -c "test -n '$victim' && test $status != 0 && awk -v t=$took 'BEGIN { exit !(t < 5) }' && grep -qi 'signal 9\\|killed' '$TMP/kill.out'"
    run "$TMP/to" $C --hosts 2 --timeout 3 -- -n 2 ./train_dp --steps 100000000 --quiet
    check "cluster: --timeout 3 ends a job that runs longer, saying so" grep -q 'ran past --timeout 3 s' "$TMP/to"
    # as in a terminal: a job started with & ignores SIGINT unless told otherwise
    perl -e '$SIG{INT} = "DEFAULT"; exec @ARGV' $C --hosts 2 -- -n 2 ./train_dp --steps 100000000 --quiet >"$TMP/int.out" 2>&1 </dev/null &
    job=$!
    sleep 3
    kill -INT $job
    wait $job
    check "cluster: Ctrl-C (SIGINT) to tools/cluster.sh removes the hosts" grep -q 'interrupted; removing the hosts' "$TMP/int.out"
    sleep 0.5
    local left
    left=$(ip netns list | grep mlpc; ip link | grep -E 'v[hb][0-9]+@'; pgrep -af 'train_dp --steps 100000000')
    check "cluster: afterwards no namespace, no link and no process of the emulated hosts remain${left:+ (left: $left)}" test -z "$left"
    # (the script on standard input: the user nobody may not be allowed to read this folder)
    expect_error 2 "need root" "cluster: without root it refuses before making anything" -- \
        setpriv --reuid=65534 --regid=65534 --clear-groups bash -s -- --hosts 2 -- -n 2 ./train_dp <$C
    expect_error 2 "--hosts must be 2 to 8" "cluster: a bad --hosts is refused" -- $C --hosts 1 -- -n 2 ./train_dp
    expect_error 2 "--link must be none or a rate" "cluster: a bad --link is refused" -- $C --link fast -- -n 2 ./train_dp
    if command -v mpirun.mpich >/dev/null; then
        expect_error 2 "launches with OpenMPI's mpirun, and 'mpirun.mpich' is another MPI" "cluster: MPICH's launcher is refused, saying why" -- env MPIEXEC=mpirun.mpich $C -- -n 2 ./train_dp
    else
        skip "cluster: MPICH's launcher refused (mpirun.mpich is not installed)"
    fi
}

# ----------------------------------------------------------------------------
# The docs: a short README that opens with its two commands and links every page of docs/;
# each page opens with its commands; every relative link reaches its file, and every
# #anchor a heading of that file (GitHub's anchors: lower case, punctuation dropped,
# spaces as hyphens, -1, -2 ... for repeats).
md_anchors() {
    awk '/^```/ { fence = !fence; next }
         !fence && /^#+ / { s = $0; sub(/^#+ +/, "", s); s = tolower(s); gsub(/[^a-z0-9 _-]/, "", s)
                            gsub(/ /, "-", s); n = seen[s]++; print (n ? s "-" n : s) }' "$1"
}
md_links() { # the relative link targets of a page, outside code
    awk '/^```/ { fence = !fence; next }
         !fence { s = $0; gsub(/`[^`]*`/, "", s)
                  while (match(s, /\]\([^)]*\)/)) {
                      t = substr(s, RSTART + 2, RLENGTH - 3); s = substr(s, RSTART + RLENGTH)
                      if (t !~ /^[a-z]+:/) print t } }' "$1"
}
section_docs() {
    local lines
    lines=$(wc -l <README.md)
    check "docs: README.md is short ($lines lines, at most 300)" test "$lines" -le 300
    check "docs: README.md opens with its two commands, make run then make test" \
        bash -c "sed -n 4p README.md | grep -q '^make run ' && sed -n 5p README.md | grep -q '^make test '"
    # each strategy file's first read (issue 45): header and core, then a marker, within its limit
    local fl at
    for fl in train_dp.c:300 train_fsdp.c:300 train_cp.c:300 train_ep.c:300 train_tp.c:350 train_pp.c:350 train_3d.c:350; do
        at=$(grep -n -m1 'first read ends here' "${fl%:*}" | cut -d: -f1)
        check "docs: ${fl%:*}'s first read ends by line ${fl#*:} (at ${at:-no marker})" test "${at:-99999}" -le "${fl#*:}"
    done
    local f t path anchor broken="" unlinked="" commandless=""
    for f in README.md docs/*.md; do
        [ -e "$f" ] || continue # no page yet
        while read -r t; do
            path=${t%%#*} anchor=""
            [ "$path" != "$t" ] && anchor=${t#*#}
            if [ -z "$path" ]; then path=$f; else path=$(dirname "$f")/$path; fi
            if [ ! -e "$path" ] || { [ -n "$anchor" ] && ! md_anchors "$path" | grep -qxF -- "$anchor"; }; then
                broken="$broken $f:$t"
            fi
        done < <(md_links "$f")
    done
    for f in docs/*.md; do
        [ -e "$f" ] || continue
        md_links README.md | grep -qxF "$f" || unlinked="$unlinked $f"
        [ "$(sed -n 3p "$f")" = '```sh' ] || commandless="$commandless $f"
    done
    check "docs: every link of README.md and docs/*.md reaches its file and heading${broken:+ (broken:$broken)}" test -z "$broken"
    check "docs: the README links every page of docs/${unlinked:+ (not linked:$unlinked)}" test -z "$unlinked"
    check "docs: every page of docs/ opens with its commands (a sh block under its title)${commandless:+ (not:$commandless)}" \
        test -z "$commandless"
}

# ----------------------------------------------------------------------------
# The pages' commands (tests/pages.sh: each run, shortened where long, and what its comment
# says it prints checked); then pages made wrong, each of which it must refuse.
section_pages() {
    relay "tests/pages.sh" "" bash tests/pages.sh
    local d="$TMP/pages"
    rm -rf "$d" && mkdir -p "$d/docs"
    printf '# a page\n\n```sh\n%s\n```\n' \
        "mpirun -n 2 ./train_dp --sync weights   # prints what ./train prints" \
        >"$d/README.md"
    run "$TMP/pages.out" env PAGES="$d" bash tests/pages.sh
    check "pages: a comment that says a run prints what ./train prints, where it does not, fails" \
        grep -q "^FAILED pages: README.md:4 .*it does not print what ./train prints" "$TMP/pages.out"
    printf '# a page\n\n```sh\n%s\n%s\n%s\n```\n' "mpirun -n 2 ./train_dp --overlap   # not bit for bit" \
        "tools/costmodel selftest   # prints \"9 passed, 0 failed\"" "tools/frobnicate --all" >"$d/docs/x.md"
    sed 's/^| 1 | 4 | 2 | 32 | 32 |/| 1 | 4 | 2 | 32 | 33 |/' docs/cluster.md >"$d/docs/cluster.md"
    run "$TMP/pages.out" env PAGES="$d" bash tests/pages.sh
    check "pages: a run that prints what ./train prints, where the page says it does not, fails" \
        grep -q "^FAILED pages: docs/x.md:4 .*where the page says it does not" "$TMP/pages.out"
    check "pages: a figure quoted in a comment (\"9 passed, 0 failed\") that is not printed fails" \
        grep -q "^FAILED pages: docs/x.md:5 .*it does not print /9 passed, 0 failed/" "$TMP/pages.out"
    check "pages: a command the plan does not know fails" \
        grep -q "^FAILED pages: docs/x.md:6 .*the plan of tests/pages.sh does not know it" "$TMP/pages.out"
    check "pages: a line that tools/costmodel prints and its page does not show fails" \
        grep -q "^FAILED pages: docs/cluster.md:8 .*prints a line that is not on the page: '| 1 | 4 | 2 | 32 | 32 |" "$TMP/pages.out"
    check "pages: it ends with the count, and exits 1" bash -c "tail -1 '$TMP/pages.out' | grep -Eq '^[0-9]+ passed, [1-9][0-9]* failed'"
    printf '| a | time | b |\n| --- | --- | --- |\n| 1 | 2.0 s | 3 |\n' >"$TMP/table.out"
    printf 'text\n\n| a | time | b |\n| --- | --- | --- |\n| 1 | 9.9 s | 3 |\n' >"$d/ok.md"
    sed 's/| 3 |$/| 4 |/' "$d/ok.md" >"$d/bad.md"
    check "pages: a table printed as on its page, times apart, agrees" \
        bash -c "test -z \"\$(awk -f tests/pages_tables.awk '$d/ok.md' '$TMP/table.out')\""
    check "pages: a table whose cell differs from its page's names the row and column" \
        bash -c "awk -f tests/pages_tables.awk '$d/bad.md' '$TMP/table.out' | grep -q \"row 1, column 'b': the page says '4', the output '3'\""
}

# ----------------------------------------------------------------------------
# the quick tier (make test QUICK=1, with the units and the flags): every program once against
# train.c, each model, a few minutes; make test runs the same layouts among many more
section_quick() {
    local m="--steps 200 --eval-every 100" g="--model gpt --emb 32 --layers 2 --steps 12 --eval-every 6"
    reference q_mlp $m
    same_as q_mlp "quick: train_dp on 2 ranks, --overlap, same as train.c" $MPIRUN -n 2 ./train_dp $m --overlap --bucket-kb 4
    same_as q_mlp "quick: train_fsdp ZeRO-3 on 2 ranks, same as train.c" $MPIRUN -n 2 ./train_fsdp $m --zero 3
    same_as q_mlp "quick: train_tp on 2 ranks, same as train.c" $MPIRUN -n 2 ./train_tp $m
    same_as q_mlp "quick: train_pp, 2 stages, 1f1b, same as train.c" $MPIRUN -n 2 ./train_pp $m --schedule 1f1b
    same_as q_mlp "quick: train_3d 2 x 1 x 2, same as train.c" $MPIRUN -n 4 ./train_3d $m --tp 2 --pp 2
    reference q_gpt $g
    same_as q_gpt "quick: the GPT in train_tp on 2 ranks, --sp, same as train.c" $MPIRUN -n 2 ./train_tp $g --sp
    same_as q_gpt "quick: the GPT in train_cp on 2 ranks, ring attention, same as train.c" $MPIRUN -n 2 ./train_cp $g
    same_as q_gpt "quick: the GPT in train_pp, 2 stages, dualpipev, same as train.c" $MPIRUN -n 2 ./train_pp $g --schedule dualpipev
    reference q_moe $m --experts 4
    same_as q_moe "quick: train_ep, 4 experts on 2 ranks, same as train.c --experts 4" $MPIRUN -n 2 ./train_ep $m --experts 4
}

# ----------------------------------------------------------------------------
run_section() {
    local name=$1
    if { [ -z "$SECTIONS" ] && [ "$name" != quick ]; } || [[ " $SECTIONS " == *" $name "* ]]; then
        echo "== $name"
        "section_$name"
    fi
}
SECTIONS="$*"
run_section units
run_section quick
run_section cli
run_section data
run_section train
run_section checkpoint
run_section faults
run_section dp
run_section reduce
run_section precision
run_section fsdp
run_section tp
run_section pp
run_section schedules
run_section 3d
run_section ep
run_section accounting
run_section gpt
run_section 5d
run_section recompute
run_section accumulation
run_section run
run_section docs
run_section pages
run_section builds
run_section cluster
if [ "$SKIPPED" -gt 0 ]; then echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"; else echo "$PASSED passed, $FAILED failed"; fi
[ "$FAILED" = 0 ]
