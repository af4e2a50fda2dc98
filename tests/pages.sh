#!/usr/bin/env bash
# tests/pages.sh: every command of README.md and docs/*.md, run as a newcomer runs it, and
# what its comment says it prints, checked. The last line is "N passed, N failed, N skipped".
#
#   bash tests/pages.sh               # this tree's pages (make test runs it as its section pages)
#   bash tests/pages.sh --tables      # and each tools/tables.sh section, its tables against the page (make pages)
#   PAGES=DIR bash tests/pages.sh     # the pages under DIR (DIR/README.md, DIR/docs/*.md), run in this tree
#
# The commands are the lines of each page's sh blocks. A training run is shortened (its
# --steps, --eval-every and --samples made small) unless the plan below runs it as written, and
# a command that is not a training run must have a line in the plan: run it, or skip it, saying
# why and what runs it instead. A command the plan does not know fails, so that a new command on
# a page gets a decision. Its comment is checked where it makes a claim:
#   "prints what ./train FLAGS prints" (or "printed"; "the same bits as ./train" and "./train's
#   bits with the same flags" take ./train with the command's own flags, less the strategy's):
#   the same loss at every step, final parameters and optimizer state (tools/compare), the
#   same validation loss and names; "not the same bits" and "not bit for bit": they differ;
#   a quoted "N passed, N failed": printed. And the plan's figures (EXPECT: regular
#   expressions that must be printed; ONPAGE: every line printed is a line of the page).
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ROOT=$PWD
PAGES=$(cd "${PAGES:-.}" && pwd)
TABLES=0
[ "${1:-}" = --tables ] && TABLES=1
LIMIT=${TEST_TIME_LIMIT:-300}
STEPS=30 # a shortened training run: 30 steps, validation at 15, 3 names
PASSED=0 FAILED=0 SKIPPED=0
pass() { PASSED=$((PASSED + 1)); echo "PASSED $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAILED $*"; }
skip() { SKIPPED=$((SKIPPED + 1)); echo "SKIPPED $*"; }

# The commands run in a copy of this tree (its sources and built programs), so that a page's
# `cc train.c -o train` or --summary FILE writes nothing here.
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
tar -C "$ROOT" --exclude=./.git --exclude=./out -cf - . | tar -C "$W/" -xf -
mkdir -p "$W/.pages"

# plan COMMAND: sets ACT (short: a training run shortened; run: as written; skip), REASON,
# EXPECT (a regular expression per line), ONPAGE (1: every line printed is on the page),
# STATUS (the exit status the page implies). Patterns are bash globs on the command.
plan() {
    ACT="" REASON="" EXPECT="" ONPAGE=0 STATUS=0
    case $1 in
        "make run") ACT=skip REASON="the main job: the section run runs make run QUICK=1 and checks its table" ;;
        "make test" | "bash tests/run.sh "*) ACT=skip REASON="the tests themselves (these are their sections)" ;;
        "make check" | "make fuzz" | "make zoo" | "make cluster QUICK=1" | "make pages" | "make diverge")
            ACT=skip REASON="a target of its own, minutes long, that the README lists" ;;
        "REPS=3 make bench") ACT=skip REASON="make bench: 13 minutes on a quiet machine, and its figures are timings" ;;
        "make bench/bench") ACT=run ;;
        "bench/bench expf --all") ACT=run EXPECT="differ on 0 of the 2\^32 floats" ;;
        "bench/bench expf" | "bench/bench ops "* | "bench/bench kernels "*) ACT=run ;;
        "bench/before_after.sh COMMIT 5" | "tools/costmodel predict CLUSTER_FILE"* | "tools/costmodel rank CLUSTER_FILE"*)
            ACT=skip REASON="a synopsis: its arguments are placeholders" ;;
        "tools/costmodel published [--check]") ACT=skip REASON="a synopsis; tools/costmodel published runs on its own line" ;;
        "tools/costmodel published" | "tools/costmodel rank cluster/"*) ACT=run ONPAGE=1 ;;
        "tools/costmodel selftest") ACT=run ;;
        "tools/cluster.sh "*) ACT=skip REASON="network namespaces as root: the section cluster runs it" ;;
        "mpirun -n 4 --hostfile hosts "*) ACT=skip REASON="needs four hosts of the user's" ;;
        "bash tools/make_names.sh") ACT=skip REASON="downloads an npm package (the network)" ;;
        "bash tools/float_order.sh") ACT=run EXPECT="differ" ;;
        "tools/schedules "*) ACT=run ;;
        "bash tools/tables.sh "*)
            if [ $TABLES = 1 ]; then ACT=tables; else ACT=skip REASON="make pages runs it and checks its tables against the page"; fi ;;
        "/usr/bin/python3 bench/torch_step.py "*)
            if /usr/bin/python3 -c 'import torch' 2>/dev/null; then ACT=run; else ACT=skip REASON="PyTorch is not installed (make bench installs it)"; fi ;;
        "./train --help" | *" ./train_3d --help") ACT=run EXPECT="usage: " ;;
        "./train") ACT=short EXPECT="18635 parameters" ;;
        "./train --data tests/names_world.txt "*)
            ACT=run EXPECT="268 lines \(242 train, 26 validation\), 263 tokens, 1204 training examples
^王伟α$
^杨芳$" ;;
        "for rc in "*) ACT=run STATUS=2 EXPECT="8 ranks and 4 heads: --cp-comm alltoall \(Ulysses\) gives each rank whole heads" ;; # its last run is refused, as its comment says
        "cc "* | "mpicc "* | "./train"* | "mpirun "*) ACT=short ;;
    esac
}

# commands FILE: "LINE<tab>COMMAND<tab>COMMENT" for each command of a page's sh blocks; a
# line ending in \ continues, and a for loop runs to its done (its lines joined by ;)
commands() {
    awk -v OFS='\t' '
        /^```/ { if (!fence && $0 == "```sh") { fence = 1; next } if (fence) { fence = 0; next } }
        fence {
            s = $0; c = ""
            if (match(s, /[ \t]+#( .*)?$/)) { c = substr(s, RSTART); sub(/^[ \t]+# */, "", c); s = substr(s, 1, RSTART - 1) }
            sub(/[ \t]+$/, "", s); sub(/^[ \t]+/, "", s)
            more = (s ~ /\\$/); if (more) { sub(/[ \t]*\\$/, "", s) }
            if (cmd == "") start = FNR
            cmd = cmd (cmd == "" || joined || cmd ~ / (do|then)$/ ? " " : "; ") s; joined = more; note = note (note == "" || c == "" ? "" : "; ") c
            n = split(cmd, w, /[ ;]+/); open = 0
            for (i = 1; i <= n; i++) { if (w[i] == "do") open++; if (w[i] == "done") open-- }
            if (!more && open <= 0) { gsub(/[ \t]+/, " ", cmd); sub(/^ /, "", cmd); print start, cmd, note; cmd = ""; note = ""; joined = 0 }
        }' "$1"
}

# shorten COMMAND EXTRA: each training program's flags with --steps, --eval-every and
# --samples made small (a smaller value given stays), and EXTRA after them
shorten() {
    local cmd=$1 extra=$2 w out="" in=0 args=()
    set -f
    for w in $cmd '<end>'; do
        case $w in
            '&&' | ';' | '|' | '||' | '<end>')
                [ $in = 1 ] && out="$out $(short_flags "${args[@]}") $extra"
                in=0 args=()
                [ "$w" != '<end>' ] && out="$out $w" ;;
            ./train | ./train_*) out="$out $w" in=1 args=() ;;
            *) if [ $in = 1 ]; then args+=("$w"); else out="$out $w"; fi ;;
        esac
    done
    set +f
    echo "${out# }"
}
short_flags() {
    local a=("$@") i s=0 e=0 n=0
    for i in "${a[@]}"; do [ "$i" = --help ] && { echo "${a[*]}"; return; }; done
    for ((i = 0; i < ${#a[@]}; i++)); do
        case ${a[i]} in
            --steps) s=1; [ "${a[i + 1]}" -gt $STEPS ] 2>/dev/null && a[i + 1]=$STEPS ;;
            --eval-every) e=1 a[i + 1]=$((STEPS / 2)) ;;
            --samples) n=1; [ "${a[i + 1]}" -gt 3 ] 2>/dev/null && a[i + 1]=3 ;;
        esac
    done
    [ $s = 0 ] && a+=(--steps $STEPS)
    [ $e = 0 ] && a+=(--eval-every $((STEPS / 2)))
    [ $n = 0 ] && a+=(--samples 3)
    echo "${a[*]}"
}
# train_flags COMMAND: the flags of its (last) training program, less the strategy's own flags
train_flags() {
    local w in=0 skipnext=0 out=()
    set -f
    for w in $1; do
        if [ $skipnext = 1 ]; then skipnext=0; continue; fi
        case $w in
            '&&' | ';' | '|' | '||') in=0 ;;
            ./train | ./train_*) in=1 out=() ;;
            --overlap | --prefetch | --sp | --timeline) ;;
            --bucket-kb | --sync | --zero | --schedule | --virtual | --tp | --cp | --pp | --dp | --ep | --cp-comm | --cp-split | --cp-softmax)
                [ $in = 1 ] && skipnext=1 ;;
            *) [ $in = 1 ] && out+=("$w") ;;
        esac
    done
    set +f
    echo "${out[*]}"
}
# results FILE: what a run prints that no machine changes: its validation loss and names
results() { sed -n '/^validation loss/p; /^names/,/^per rank/{/^per rank/!p}' "$1"; }
# same RUN REF: the two runs' logs and checkpoints agree bit for bit, and their results
same() { "$ROOT/tools/compare" "$W/.pages/$1.csv" "$W/.pages/$2.csv" "$W/.pages/$1.ckpt" "$W/.pages/$2.ckpt" >"$W/.pages/cmp" 2>&1 &&
    [ "$(results "$W/.pages/$1.out")" = "$(results "$W/.pages/$2.out")" ]; }
runit() { # TAG COMMAND: runs it in the copy, output into .pages/TAG.out; returns its status
    (cd "$W" && timeout "$LIMIT" bash -c "$2" </dev/null >".pages/$1.out" 2>&1)
}

one_command() { # PAGE LINE COMMAND COMMENT
    local page=$1 line=$2 cmd=$3 note=$4 name="pages: $1:$2 \`$3\`" tag
    plan "$cmd"
    if [ -z "$ACT" ]; then
        fail "$name: the plan of tests/pages.sh does not know it (run it, or skip it saying why)"
        return
    fi
    if [ "$ACT" = skip ]; then skip "$name: $REASON"; return; fi
    if [ "$ACT" = tables ]; then tables "$page" "$line" "$cmd"; return; fi
    tag=$(basename "$page" .md)_$line
    # what the comment promises: the same as ./train REF (claim same), or not (claim differ)
    local claim="" ref=""
    if [[ $note =~ prints\ what\ \./train(\ [^#]*)?\ print(s|ed) ]]; then claim=same ref="${BASH_REMATCH[1]# }"
    elif [[ $note =~ (the\ same\ bits\ as\ \./train|\./train\'s\ bits\ with\ the\ same\ flags) ]]; then claim=same ref=$(train_flags "$cmd")
    elif [[ $note =~ (not\ the\ same\ bits|not\ bit\ for\ bit) ]]; then claim=differ ref=$(train_flags "$cmd")
    fi
    [[ $note =~ \"([0-9]+\ passed,\ [0-9]+\ failed)\" ]] && EXPECT="$EXPECT${EXPECT:+$'\n'}${BASH_REMATCH[1]}"
    local run_cmd=$cmd
    if [ -n "$claim" ]; then
        run_cmd=$(shorten "$cmd" "--log .pages/$tag.csv --save .pages/$tag.ckpt")
        runit r$tag "$(shorten "./train $ref" "--log .pages/r$tag.csv --save .pages/r$tag.ckpt")"
    elif [ "$ACT" = short ]; then
        run_cmd=$(shorten "$cmd" "")
    fi
    runit $tag "$run_cmd"
    local status=$? why="" e
    [ "$status" != "$STATUS" ] && why="exit $status, the page implies $STATUS: $( { grep -m2 -E '^error|internal' "$W/.pages/$tag.out"; tail -n 2 "$W/.pages/$tag.out"; } | tr '\n' '|' | cut -c1-300)"
    if [ -z "$why" ]; then
        while IFS= read -r e; do
            [ -n "$e" ] && ! grep -Eq -- "$e" "$W/.pages/$tag.out" && why="${why}it does not print /$e/; "
        done <<<"$EXPECT"
    fi
    if [ -z "$why" ] && [ $ONPAGE = 1 ]; then
        while IFS= read -r e; do
            [ -n "$e" ] && ! grep -qxF -- "$e" "$page" && why="${why}it prints a line that is not on the page: '${e:0:120}'; "
        done <"$W/.pages/$tag.out"
    fi
    if [ -z "$why" ] && [ "$claim" = same ] && ! same $tag r$tag; then
        why="it does not print what ./train${ref:+ $ref} prints: $(head -c 200 "$W/.pages/cmp" | tr '\n' '|')"
    elif [ -z "$why" ] && [ "$claim" = differ ] && same $tag r$tag; then
        why="it prints what ./train $ref prints, bit for bit, where the page says it does not"
    fi
    local shown=""
    [ "$run_cmd" != "$cmd" ] && shown=" (run as \`${run_cmd//.pages\/*/...}\`)"
    [ "$claim" = same ] && shown="$shown prints what ./train${ref:+ $ref} prints"
    [ "$claim" = differ ] && shown="$shown does not print what ./train $ref prints"
    if [ -z "$why" ]; then pass "$name$shown"; else fail "$name$shown: $why"; fi
}

# tables PAGE LINE COMMAND: each table tools/tables.sh prints is on the page, row for row,
# in every column that no machine changes (times, rates and measured bubbles apart)
tables() {
    local page=$1 line=$2 cmd=$3 tag
    tag=$(basename "$page" .md)_t$line
    if ! (cd "$W" && OUT="$W/.pages/$tag" timeout 3600 bash -c "$cmd" </dev/null >".pages/$tag.out" 2>".pages/$tag.err"); then
        fail "pages: $page:$line \`$cmd\`: exit $?: $(tail -n 3 "$W/.pages/$tag.err" | tr '\n' '|')"
        return
    fi
    local why
    why=$(awk -f "$ROOT/tests/pages_tables.awk" "$page" "$W/.pages/$tag.out" | tr "\n" " ")
    if [ -z "$why" ]; then pass "pages: $page:$line \`$cmd\`: every table it prints is on the page, in every column no machine changes"
    else fail "pages: $page:$line \`$cmd\`: $why"; fi
}

for page in "$PAGES/README.md" "$PAGES"/docs/*.md; do
    [ -e "$page" ] || continue
    rel=${page#"$PAGES"/}
    while IFS=$'\t' read -r line cmd note; do
        one_command "$page" "$line" "$cmd" "$note"
    done < <(commands "$page") | sed "s|$page|$rel|g"
done | tee "$W/.pages/log"
PASSED=$(grep -c '^PASSED' "$W/.pages/log") FAILED=$(grep -c '^FAILED' "$W/.pages/log") SKIPPED=$(grep -c '^SKIPPED' "$W/.pages/log")
echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
[ "$FAILED" = 0 ]
