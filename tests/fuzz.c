/*
 * tests/fuzz.c: the readers of outside input, driven by libFuzzer: the data loader
 * (data.h), the checkpoint reader (ckpt.h), the flag parser (cli.h), and tools/compare's
 * readers of logs and checkpoints. One file, one target per build, chosen with
 * -DTARGET_data, _ckpt, _cli or _compare.
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
#ifdef TARGET_compare
#define COMPARE_NO_MAIN
#include "../tools/compare.c"
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
#elif defined(TARGET_data) || !defined(TARGET_ckpt) && !defined(TARGET_cli)
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
            if (o.steps < 0 || o.batch < 1 || c->context < 1 || c->emb < 1 || c->hidden < 1 || c->layers < 1 ||
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
