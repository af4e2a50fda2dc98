/*
 * tests/fuzz.c: the readers of outside input, driven by libFuzzer: the data loader
 * (data.h), the checkpoint reader (ckpt.h) and the flag parser (cli.h); and the tools'
 * parsers (tools/compare's logs and checkpoints, tools/costmodel's cluster files,
 * tools/schedules' command line and traces); and the recognisers that decide whether a run
 * may replace the file at an output's path (a checkpoint, a log, a summary or a trace of
 * this project: one that reads as one, whole). One file, one target per build, chosen with
 * -DTARGET_data, _ckpt, _cli, _compare, _cluster, _schedules, _ckpt_whole or _log_summary.
 *
 *   make fuzz                                     # each target, 1 million inputs or more
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -DTARGET_ckpt tests/fuzz.c -o fuzz_ckpt -lm
 *   ./fuzz_ckpt corpus/                           # libFuzzer's own flags apply
 *
 * Built without -fsanitize=fuzzer and with -DREPLAY, the same file is a program that runs
 * each file named on its command line once: make test replays every input the fuzzer ever
 * crashed on (tests/fuzz/<target>/) this way, so a fixed crash stays fixed.
 *
 * What counts as a finding: a crash, a sanitizer report, a hang, or memory growing from
 * input to input. A clear error is the right answer to bad input, so fatal() here returns
 * to the harness (longjmp) instead of ending the process, and the harness frees what the
 * reader had allocated and closes what it had opened before the error.
 */
#define _GNU_SOURCE // memfd_create
#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <limits.h>
#include <stddef.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

// ----------------------------------------------------------------------------
// What a reader holds when fatal() jumps out of it: every block and file it has open.

#define TRACKED 4096
static void* held[TRACKED];
static int n_held;
static FILE* files[16];
static int n_files;
static void hold(void* p) {
    if (!p) return;
    if (n_held == TRACKED) abort(); // a reader holding thousands of blocks is itself a finding
    held[n_held++] = p;
}
static void unhold(void* p) {
    for (int i = n_held - 1; i >= 0; i--)
        if (held[i] == p) {
            held[i] = held[--n_held];
            return;
        }
}
static void* fuzz_malloc(size_t n) {
    void* p = malloc(n);
    hold(p);
    return p;
}
static void* fuzz_calloc(size_t n, size_t size) {
    void* p = calloc(n, size);
    hold(p);
    return p;
}
static void* fuzz_realloc(void* old, size_t n) {
    void* p = realloc(old, n);
    if (p) unhold(old), hold(p);
    return p;
}
static void fuzz_free(void* p) {
    unhold(p);
    free(p);
}
static FILE* fuzz_fopen(const char* path, const char* mode) {
    FILE* f = fopen(path, mode);
    if (f && n_files < 16) files[n_files++] = f;
    return f;
}
static int fuzz_fclose(FILE* f) {
    for (int i = 0; i < n_files; i++)
        if (files[i] == f) files[i] = files[--n_files];
    return fclose(f);
}
static void release_all(void) {
    while (n_held) free(held[--n_held]);
    while (n_files) fclose(files[--n_files]);
}
#define malloc fuzz_malloc
#define calloc fuzz_calloc
#define realloc fuzz_realloc
#define free fuzz_free
#define fopen fuzz_fopen
#define fclose fuzz_fclose

#include "../ckpt.h"
#if defined(TARGET_compare) || defined(TARGET_ckpt_whole) || defined(TARGET_log_summary)
#define COMPARE_NO_MAIN
#include "../tools/compare.c"
#endif
#ifdef TARGET_log_summary
#include "../tools/summary.h"
#endif

#undef malloc
#undef calloc
#undef realloc
#undef free
#undef fopen
#undef fclose

static jmp_buf back;
static char last_error[1024];
static void fatal_returns(const char* message) {
    snprintf(last_error, sizeof last_error, "%s", message);
    longjmp(back, 1);
}

// The input as a file: readers take a path, as the programs' users give them.
static int input_fd = -1;
static char input_path[64];
static void input_set(const uint8_t* data, size_t size) {
    if (input_fd < 0) {
        input_fd = memfd_create("fuzz-input", 0);
        if (input_fd < 0) abort();
        snprintf(input_path, sizeof input_path, "/proc/self/fd/%d", input_fd);
    }
    if (ftruncate(input_fd, 0) != 0 || pwrite(input_fd, data, size, 0) != (ssize_t)size) abort();
}

#if defined(TARGET_compare)
// ----------------------------------------------------------------------------
// compare: any bytes as tools/compare's two inputs, a --log file and a checkpoint. A log
// that reads has consecutive steps; a checkpoint that reads has the values its header says.
static int run_one(const uint8_t* data, size_t size) {
    input_set(data, size);
    long n = -1, first = 0;
    if (setjmp(back) == 0) {
        double* losses = read_losses(input_path, &n, &first);
        if (n < 0 || (n > 0 && first < 0)) abort();
        fuzz_free(losses);
    }
    release_all();
    CkptHeader h;
    if (setjmp(back) == 0) {
        float* x = read_ckpt(input_path, &h, &n);
        if (n != ckpt_floats(&h) || h.code_points) abort();
        fuzz_free(x);
    }
    release_all();
    return 0;
}
#elif defined(TARGET_ckpt_whole)
// ----------------------------------------------------------------------------
// ckpt_whole: any bytes as the file at a --save path, read by the recogniser that decides
// whether a run may replace it (ckpt.h's ckpt_recognise: a checkpoint of this project is
// one that reads as one, whole, not one that begins as one would). It says why not, or the
// file is a checkpoint: tools/compare's reader, which checks the header, the values and
// the checksum as a run's --load does, takes it whole.
static int run_one(const uint8_t* data, size_t size) {
    input_set(data, size);
    FILE* f = fuzz_fopen(input_path, "rb");
    if (!f) abort();
    if (setjmp(back) != 0) abort(); // a recogniser says why; it never ends the program
    const char* why = ckpt_recognise(f);
    fuzz_fclose(f);
    if (why && !why[0]) abort();
    release_all();
    if (!why) {
        CkptHeader h;
        long n = -1;
        if (setjmp(back) != 0) abort(); // a whole checkpoint reads
        float* x = read_ckpt(input_path, &h, &n);
        if (n != ckpt_floats(&h)) abort();
        fuzz_free(x);
    }
    release_all();
    return 0;
}
#elif defined(TARGET_log_summary)
// ----------------------------------------------------------------------------
// log_summary: any bytes as the file at a --log, --summary or --trace path (the first byte
// chooses which), read by cli.h's recogniser of that kind. It says why not, or the file
// reads as one: a log ending in a whole line, as tools/compare reads it (steps in a row); a
// summary, as tools/summary.h reads it (make run's table), with as many rank lines as ranks.
static int run_one(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    input_set(data + 1, size - 1);
    static const Recogniser kinds[3] = {log_recognise, summary_recognise, trace_recognise};
    int kind = data[0] % 3;
    FILE* f = fuzz_fopen(input_path, "rb");
    if (!f) abort();
    if (setjmp(back) != 0) abort();
    const char* why = kinds[kind](f);
    fuzz_fclose(f);
    if (why && !why[0]) abort();
    release_all();
    if (!why && kind == 0 && size > 1 && data[size - 1] == '\n') {
        long n = -1, first = 0;
        if (setjmp(back) != 0) abort();
        double* losses = read_losses(input_path, &n, &first);
        if (n < 0 || (n > 0 && first < 1)) abort();
        fuzz_free(losses);
    }
    long rank_lines = 0;
    for (size_t i = 1; i + 5 < size; i++) rank_lines += data[i] == '\n' && !memcmp(data + i + 1, "rank=", 5);
    if (!why && kind == 1 && rank_lines <= MAX_RANKS) {
        static Summary s;
        if (setjmp(back) != 0) abort();
        summary_read(&s, input_path); // (it reads at most MAX_RANKS ranks: make run's)
        if (s.ranks < 1 || !s.program[0]) abort();
    }
    release_all();
    return 0;
}
#elif defined(TARGET_data) || !defined(TARGET_ckpt) && !defined(TARGET_cli) && !defined(TARGET_cluster) && !defined(TARGET_schedules)
// ----------------------------------------------------------------------------
// data: any bytes as --data. A file that loads must give batches inside its examples.
static int run_one(const uint8_t* data, size_t size) {
    input_set(data, size);
    Dataset ds;
    if (setjmp(back) == 0) {
        dataset_load(&ds, input_path, 64, 42);
        int T = 4, R = 8, tokens[8 * 4], targets[8];
        if (ds.vocab < 2 || ds.n_train < 1 || ds.n_val < 1) abort();
        dataset_batch(&ds, 42, 3, 0, R, T, tokens, targets);
        dataset_val_rows(&ds, 0, ds.n_val_examples < R ? (int)ds.n_val_examples : R, T, tokens, targets);
        for (int i = 0; i < R * T; i++)
            if (tokens[i] < 0 || tokens[i] >= ds.vocab) abort();
        for (int i = 0; i < R; i++)
            if (targets[i] < 0 || targets[i] >= ds.vocab) abort();
        dataset_free(&ds);
    }
    release_all();
    return 0;
}
#elif defined(TARGET_ckpt)
// ----------------------------------------------------------------------------
// ckpt: any bytes as --load, for a small model on a fixed data file. A checkpoint that
// loads has only finite values. The optimizer (and --allow-changes) follow the bytes
// where a checkpoint keeps them, so both readings are reached.
static Dataset names;
static Config model;
static float* values;
static int run_one(const uint8_t* data, size_t size) {
    static int ready;
    if (!ready) {
        // the same small file the seed checkpoints were trained on (make fuzz writes them)
        static const char text[] = "emma\nolivia\nava\nisabella\nsophia\ncharlotte\nmia\namelia\nharper\nevelyn\n";
        input_set((const uint8_t*)text, sizeof text - 1);
        if (setjmp(back) != 0) abort();
        dataset_load(&names, input_path, 64, 42);
        n_held = 0; // the dataset stays for every input
        model = (Config){.vocab = names.vocab, .context = 3, .emb = 2, .hidden = 4, .layers = 2};
        values = (float*)malloc(3 * (size_t)n_params(&model) * sizeof(float));
        ready = 1;
    }
    input_set(data, size);
    Options o = {.data = "names", .model = model, .steps = 1000000000L, .batch = 8, .seed = 42, .load = input_path};
    o.opt = (Optimizer){.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    size_t at = offsetof(CkptHeader, adamw);
    if (size >= at + 4 && data[at] == 1) o.opt = (Optimizer){.adamw = 1, .lr = 0.003f, .weight_decay = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    o.allow_changes = size >= offsetof(CkptHeader, batch) + 1 && (data[offsetof(CkptHeader, batch)] & 1);
    long n = n_params(&model);
    State s = {.params = values, .m = o.opt.adamw ? values + n : NULL, .v = o.opt.adamw ? values + 2 * n : NULL};
    if (setjmp(back) == 0) {
        memset(values, 0xff, 3 * (size_t)n * sizeof(float)); // NaN: whatever is not filled shows
        long step = state_load(&s, &o, &names, &model);
        if (step < 0 || step > o.steps) abort();
        for (long i = 0; i < (o.opt.adamw ? 3 : 1) * n; i++)
            if (!isfinite(values[i])) abort();
    }
    release_all();
    return 0;
}
#elif defined(TARGET_cluster)
// ----------------------------------------------------------------------------
// cluster: any bytes as a cluster file of tools/costmodel (tools/costmodel_cluster.h). A
// refusal says why; a file that parses has every value finite and inside its key's range.
#include "../tools/costmodel_cluster.h"
static int run_one(const uint8_t* data, size_t size) {
    Cluster c;
    char err[512] = "";
    if (cluster_parse(&c, (const char*)data, size, "fuzz", err, sizeof err)) {
        if (!err[0]) abort();
        snprintf(last_error, sizeof last_error, "%s", err);
        return 0;
    }
    double all[] = {c.flops, c.efficiency, c.fp8_flops, c.fp8_efficiency, c.memory, c.alpha_intra, c.beta_intra,
                    c.alpha_inter, c.beta_inter, c.attention_efficiency, c.hbm, c.attention_half_seq, c.collective_latency,
                    c.sustained};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!isfinite(all[i]) || all[i] < 0) abort();
    if (c.nodes < 1 || c.per_node < 1 || (double)c.nodes * c.per_node > CLUSTER_MAX_DEVICES || !(c.flops > 0) ||
        !(c.efficiency > 0) || c.efficiency > 1 || c.fp8_efficiency > 1 || !(c.memory > 0) || !(c.beta_intra > 0) ||
        !(c.beta_inter > 0) || !c.name[0] || (c.fp8_flops > 0) != (c.fp8_efficiency > 0) ||
        !(c.attention_efficiency > 0) || c.attention_efficiency > 1 || !(c.hbm > 0) || c.sms < 0 || c.sms > 100000 ||
        c.nics < 1 || c.nics > 1024 || !(c.sustained > 0) || c.sustained > 1)
        abort();
    return 0;
}
#elif defined(TARGET_schedules)
// ----------------------------------------------------------------------------
// schedules: tools/schedules' parsers. The first byte chooses what the rest is: even, its
// command line (split at NUL bytes, as for cli); odd, a trace given to --svg. A command
// line that parses names a pipeline whose lists (built and checked when small) must be
// valid and hold what the formula says; a trace that is accepted has only actions of the
// pipeline it was read for.
#define malloc fuzz_malloc // what the tool allocates and frees goes through the harness too
#define calloc fuzz_calloc
#define realloc fuzz_realloc
#define free fuzz_free
#define SCHEDULES_NO_MAIN
#include "../tools/schedules.c"
#undef malloc
#undef calloc
#undef realloc
#undef free
static int run_one(const uint8_t* data, size_t size) {
    if (size < 1 || size > 4096) return 0;
    if (setjmp(back) != 0) abort(); // these parsers say what is wrong: they never end the program
    if (data[0] & 1) { // a trace, for 4 ranks and 8 microbatches
        static PipeEvent ev[64];
        int n;
        input_set(data + 1, size - 1);
        if (!read_trace(input_path, 4, 8, ev, 64, &n))
            for (int i = 0; i < n; i++)
                if (ev[i].rank < 0 || ev[i].rank >= 4 || ev[i].mb < 0 || ev[i].mb >= 8 || !(ev[i].dur >= 0)) abort();
        release_all();
        return 0;
    }
    char* copy = (char*)malloc(size);
    memcpy(copy, data + 1, size - 1);
    copy[size - 1] = 0;
    char* argv[34] = {"schedules"};
    int argc = 1;
    for (size_t i = 0; i < size - 1 && argc < 33; i += strlen(copy + i) + 1) argv[argc++] = copy + i;
    argv[argc] = NULL;
    Run run;
    if (argc >= 5 && !parse_run(argc, argv, &run)) {
        if (!(run.d.f > 0 && run.d.i > 0 && run.d.w > 0 && run.d.latency >= 0) || !isfinite(run.d.f + run.d.i + run.d.w + run.d.latency))
            abort();
        if ((long)run.S * run.V * run.M <= 2048) { // the lists of a small pipeline, checked
            int counts[64];
            Action** lists = build(run.sched, run.S, run.V, run.M, counts);
            Check c = schedule_check(run.sched, run.S, run.V, run.M, lists, counts, run.d, NULL, NULL, 0);
            if (!c.ok) abort();
            for (int r = 0; r < run.S; r++)
                if (fabs(c.peak[r] - schedule_peak_formula(run.sched, run.S, run.V, run.M, r)) > 1e-9) abort();
            drop(lists, run.S);
        }
    }
    release_all();
    free(copy);
    return 0;
}
#else
// ----------------------------------------------------------------------------
// cli: the bytes, split at NUL bytes, as the arguments after the program's name. A parse
// that succeeds gives values inside the ranges the flags state.
static int run_one(const uint8_t* data, size_t size) {
    if (size > 4096) return 0;
    char* copy = (char*)malloc(size + 1);
    memcpy(copy, data, size);
    copy[size] = 0;
    char* argv[34] = {"train"};
    int argc = 1;
    for (size_t i = 0; i < size && argc < 33; i += strlen(copy + i) + 1) argv[argc++] = copy + i;
    argv[argc] = NULL;
    Options o;
    const char* err = NULL;
    if (setjmp(back) == 0) {
        int rc = cli_parse(&o, argc, argv, NULL, 0, NULL, NULL, &err);
        if (rc == 2 && (!err || !*err)) abort(); // a refusal always says why
        if (rc == 0) {
            Config* c = &o.model;
            int gpt = c->model == MODEL_GPT; // the GPT's context may be 0 (the data's), it has no hidden size
            if (gpt ? c->context < 0 || c->hidden != 0 || c->heads < 1 || c->emb % c->heads != 0 : c->context < 1 || c->hidden < 1)
                abort();
            if (o.steps < 0 || o.batch < 1 || c->emb < 1 || c->layers < 1 ||
                c->layers > MAX_LAYERS || !(o.opt.lr > 0) || !isfinite(o.opt.lr) || o.opt.clip < 0 ||
                o.keep < 1 || o.timeout < 0 || o.samples < 0 || o.max_line < 1)
                abort();
        }
    }
    release_all();
    free(copy);
    return 0;
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fatal_end = fatal_returns;
    return run_one(data, size);
}

#ifdef REPLAY
// Each file named on the command line, once; prints what the reader said.
int main(int argc, char** argv) {
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        FILE* f = fopen(argv[i], "rb");
        if (!f) {
            fprintf(stderr, "cannot open %s\n", argv[i]);
            failed = 1;
            continue;
        }
        static uint8_t buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        last_error[0] = 0;
        LLVMFuzzerTestOneInput(buf, n);
        printf("%s: %s\n", argv[i], last_error[0] ? last_error : "accepted");
    }
    return failed;
}
#endif
