/*
 * util.h: what every other file needs: fatal errors that end the whole job, checked
 * allocation and file opening, the counter-based random generator, and a clock.
 *
 * A fatal error prints one line and ends the program: exit(1) in train.c; in an MPI
 * program dist_init (dist.h) swaps in fatal_end_job, which ends every rank, since a check
 * that fails on one rank must never leave the others waiting for it.
 */
#ifndef UTIL_H
#define UTIL_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L // clock_gettime
#endif
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

// ----------------------------------------------------------------------------
// however this file is compiled, the same bits
//
// The promise: any C11 compiler, any flags but fast-math, any MPI, any CPU: the same losses,
// parameters and names. Three things make it hold whatever the build line says.
//  - Fast-math (-ffast-math, -Ofast, or a flag they imply) lets the compiler reorder sums
//    and assume that NaN never occurs: the results change and the checks for a diverged
//    run vanish. Refused here, at compile time.
//  - Contraction: a compiler may fuse a * b + c into one FMA, rounded once instead of
//    twice, wherever it likes, and so differently in two programs. Turned off here for the
//    rest of the file (GCC: its optimize pragma; Clang: the standard pragma); the kernels
//    ask for FMA themselves (fmaf), where it is the definition of the result.
//  - Speed without flags: GCC also gets -O3 and -fno-math-errno here (define
//    KEEP_OPTIMIZATION_FLAGS to build exactly as the command line says, for a debugger),
//    and kernels.h compiles its kernels for AVX-512, for AVX2 and for any x86-64 CPU, and
//    picks at run time, so `mpicc train_dp.c -o train_dp -lm` runs fast too. (GCC 12's
//    pragma does not reach sqrtf: a loop calling it is still not vectorized, so the Makefile
//    also passes -fno-math-errno, which makes AdamW's loop 4 times faster. The results do
//    not change: sqrtf is correctly rounded either way.)
#if defined(__FAST_MATH__) || defined(__ASSOCIATIVE_MATH__) || defined(__RECIPROCAL_MATH__) || \
    (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__)
#error "built with -ffast-math or -Ofast (or a flag they imply): they let the compiler reorder sums and assume NaN never occurs, so the results would no longer match train.c's and a diverged run would go unnoticed. Build with -O3 or -O2 instead; any other flags give the same names."
#endif
#if defined(__clang__) && !defined(__OPTIMIZE__)
#warning "clang without -O2: the results are the same, but about 15 times slower (clang cannot raise its optimization level from the source, as GCC can); add -O2"
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__) && !defined(KEEP_OPTIMIZATION_FLAGS)
#pragma GCC optimize("O3", "fp-contract=off", "no-math-errno")
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
// Instruction sets, chosen at run time (x86-64): KERNEL_VARIANTS compiles a kernel's wide
// body (name_wide_body, for AVX-512's 32 registers of 64 bytes) for AVX-512, and its body
// (name_body) for AVX2 with FMA and for any CPU, and calls the best one this CPU runs
// (kernels.h says why the three give the same bits); elsewhere only the body is compiled.
// VECTOR_CLONES has the compiler do the same for a loop that needs no FMA.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ISA_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")))
#define ISA_AVX2 __attribute__((target("avx2,fma")))
// Loops that need no FMA: cloned by the compiler for these instruction sets.
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
// The environment variable KERNEL_ISA=avx2 or any holds a run to fewer instructions, so
// that this machine can test and time the variants other CPUs run (the results never change).
// The most it allows (2, 1 or 0), or -1 for a value it does not know. The programs check it
// with their flags (cli.h), so that a bad value stops a job before it starts, once.
static int kernel_isa_cap(void) {
    const char* cap = getenv("KERNEL_ISA");
    if (!cap || !*cap || !strcmp(cap, "avx512")) return 2;
    if (!strcmp(cap, "avx2")) return 1;
    return strcmp(cap, "any") ? -1 : 0;
}
static int cpu_isa(void) { // 2: AVX-512, 1: AVX2 and FMA, 0: neither
    static int isa = -1;
    if (isa < 0) {
        __builtin_cpu_init();
        int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                     __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
        int most = kernel_isa_cap();
        if (most < 0) { // a tool that reads no flags
            fprintf(stderr, "error: KERNEL_ISA must be avx512, avx2 or any, not '%s'\n", getenv("KERNEL_ISA"));
            exit(2);
        }
        isa = avx512 ? 2 : avx2;
        isa = isa < most ? isa : most;
    }
    return isa;
}
#define KERNEL_VARIANTS(attrs, name, params, args)                                                       \
    attrs ISA_AVX512 static void name##_avx512 params { name##_wide_body args; }                         \
    attrs ISA_AVX2 static void name##_avx2 params { name##_body args; }                                  \
    attrs static void name##_any params { name##_body args; }                                            \
    static void name params {                                                                            \
        if (cpu_isa() == 2) name##_avx512 args;                                                          \
        else if (cpu_isa() == 1) name##_avx2 args;                                                       \
        else name##_any args;                                                                            \
    }
#else
#define VECTOR_CLONES
static int kernel_isa_cap(void) { return 2; } // one variant only: nothing to choose
static int cpu_isa(void) { return 0; }
#define KERNEL_VARIANTS(attrs, name, params, args) \
    attrs static void name params { name##_body args; }
#endif

// An OpenMP directive, only in a build with -fopenmp (so that other builds, -Wall
// included, see no pragma they do not know).
#ifdef _OPENMP
#define OMP(directive) _Pragma(#directive)
#else
#define OMP(directive)
#endif

// For the tiny functions of inner loops: inlined even where GCC's optimize pragma meets a
// command line without -O (GCC then inlines nothing else).
#define ALWAYS_INLINE static inline __attribute__((always_inline))

// ----------------------------------------------------------------------------
// fatal errors
//
// fatal(...) formats its message and hands it to fatal_end, which never returns:
//  - in train.c and the tools, fatal_end_process below: "error: message", then exit(1);
//  - in an MPI program, dist_init (dist.h, "start-up, errors, and stopping together")
//    points fatal_end at fatal_end_job: the message, with the rank, then MPI_Abort, which
//    ends every rank of the job at once, so that no rank waits for one that stopped;
//  - in tests/fuzz.c, a function that jumps back to the fuzzer, which tries the next input.
// A pointer set at start-up, not an #ifdef, so that this file needs no MPI and may be
// included before dist.h.
static void fatal_end_process(const char* message) {
    fprintf(stderr, "error: %s\n", message);
    exit(1);
}
static void (*fatal_end)(const char* message) = fatal_end_process;

__attribute__((format(printf, 1, 2), noreturn)) static void fatal(const char* fmt, ...) {
    char message[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    fatal_end(message);
    exit(1); // fatal_end does not return; if it did, still stop here
}

// Exit statuses: 0 done; 1 an error in the inputs or while running (fatal); 2 bad usage,
// refused before anything was read or written; EXIT_STOPPED, stopped by SIGTERM, SIGHUP or SIGINT
// with its checkpoint written (report.h), to be resumed with --load. 75 is sysexits.h's
// EX_TEMPFAIL ("a temporary failure: try again later"): distinct from the others, so that a
// scheduler's requeue rule (Slurm's RequeueExit=75, LSF's bsub -Q 75) or a job script can
// tell a run to resume from a finished or a failed one.
#define EXIT_STOPPED 75
// How a program ends on purpose before its end (a stop): exit in train.c and the tools; in an
// MPI program dist_init points it at MPI_Finalize, then exit, every rank stopping together.
static void (*exit_program)(int status) __attribute__((unused)) = exit;
// Whether this process says what is said once per job (a warning): in an MPI program only
// world rank 0 (dist_init).
static int prints_for_job __attribute__((unused)) = 1;

static void* malloc_check(size_t size, const char* file, int line) {
    void* p = malloc(size ? size : 1);
    if (!p) fatal("%s:%d: out of memory allocating %zu bytes", file, line, size);
    return p;
}
static void* calloc_check(size_t n, size_t size, const char* file, int line) {
    void* p = calloc(n ? n : 1, size ? size : 1);
    if (!p) fatal("%s:%d: out of memory allocating %zu x %zu bytes", file, line, n, size);
    return p;
}
// realloc that stops with a message instead of returning NULL (and losing the old block)
static void* realloc_check(void* old, size_t size, const char* file, int line) {
    void* p = realloc(old, size ? size : 1);
    if (!p) fatal("%s:%d: out of memory growing a buffer to %zu bytes", file, line, size);
    return p;
}
static FILE* fopen_check(const char* path, const char* mode, const char* file, int line) {
    FILE* f = fopen(path, mode);
    if (!f) fatal("%s:%d: cannot open '%s' (mode %s): %s", file, line, path, mode, strerror(errno));
    return f;
}
#define mallocCheck(size) malloc_check((size), __FILE__, __LINE__)
#define callocCheck(n, size) calloc_check((n), (size), __FILE__, __LINE__)
#define reallocCheck(p, size) realloc_check((p), (size), __FILE__, __LINE__)
#define fopenCheck(path, mode) fopen_check((path), (mode), __FILE__, __LINE__)

// ----------------------------------------------------------------------------
// counter-based random numbers
//
// Every random number in the project is a pure function of (seed, stream, index): initial
// weight i of tensor t, training row b of step s, the draw for sample n at position p.
// Nothing is drawn "in order", so a rank that owns a shard of a tensor, or a few rows of
// a batch, computes exactly its own numbers and they equal the ones train.c uses.

enum {
    STREAM_INIT = 1,   // index: element of a tensor; the stream also carries the tensor id
    STREAM_SPLIT = 2,  // the train/validation shuffle of lines
    STREAM_BATCH = 3,  // training rows: index = step * 2^32 + row
    STREAM_SAMPLE = 4, // generation: index = sample * 2^32 + position
};

ALWAYS_INLINE uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

ALWAYS_INLINE uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t index) {
    return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index);
}

// uniform in [0, 1) with 53 random bits
ALWAYS_INLINE double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return (double)(rng_u64(seed, stream, index) >> 11) * 0x1p-53;
}

// standard normal (Box-Muller on two draws of this index)
static inline double rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    double u1 = 1.0 - rng_uniform(seed, stream, 2 * index); // in (0, 1]: log is finite
    double u2 = rng_uniform(seed, stream, 2 * index + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// ----------------------------------------------------------------------------
// checksums: 64-bit FNV-1a, of checkpoints and of the data file

#define FNV_START 0xcbf29ce484222325ull
static uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
    const unsigned char* p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

// ----------------------------------------------------------------------------
// splitting work

// Items [*lo, *hi) of n that part p of `parts` owns: the first n % parts parts take one
// item more (32 rows on 3 ranks: 11, 11, 10).
static void split_range(long n, int parts, int p, long* lo, long* hi) {
    long base = n / parts, extra = n % parts;
    *lo = p * base + (p < extra ? p : extra);
    *hi = *lo + base + (p < extra ? 1 : 0);
}

// ----------------------------------------------------------------------------
// time

static inline double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// The median of n timings (sorts them): what the benchmarks report, being robust to the
// odd slow repetition on a shared machine.
static int compare_doubles(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}
static double median(double* x, int n) {
    qsort(x, (size_t)n, sizeof(double), compare_doubles);
    return x[n / 2];
}

// ----------------------------------------------------------------------------
// trace events (--trace)
//
// While trace_on is set (during one chosen step), the ops, pipeline passes and messages of
// this process record an event each: a name, a category, when it started and ended, and
// the bytes it sent. dist.h gathers every rank's events into one Chrome trace-event file.

static int trace_on; // record trace events now

// What the program is doing, for the messages of a hang or a divergence: the training step
// it is in (0 before the first), and what it waits for (NULL: it computes).
static long current_step __attribute__((unused));
static const char* volatile waiting_for __attribute__((unused));

// The measurement window: open during each training step (from drawing its rows to its
// optimizer step), closed for validation and sampling. Communication counters count and
// trace events record only inside it; trace_on additionally marks the step --trace records.
static int in_step;
static void trace_reserve(long n);
static void step_window_open(int trace) {
    if (trace) trace_reserve(4096); // before the step's passes, so that no pass pays for it
    in_step = 1, trace_on = trace;
}
static void step_window_close(void) { in_step = 0, trace_on = 0; }
// The clock for a trace event: read only while tracing.
static double trace_clock(void) { return trace_on ? now_seconds() : 0; }

typedef struct {
    char name[32];
    char cat[12];
    double t0, t1;  // seconds, CLOCK_MONOTONIC (one clock for every process of a machine)
    double bytes;
} TraceEvent;

static TraceEvent* trace_events;
static long trace_count, trace_cap;

// Room for n events, allocated and touched now.
static void trace_reserve(long n) {
    if (trace_cap >= n) return;
    trace_events = reallocCheck(trace_events, (size_t)n * sizeof(TraceEvent));
    memset(trace_events + trace_cap, 0, (size_t)(n - trace_cap) * sizeof(TraceEvent));
    trace_cap = n;
}

__attribute__((format(printf, 5, 6))) static void trace_event(const char* cat, double t0, double t1, double bytes,
                                                              const char* fmt, ...) {
    if (!trace_on) return;
    if (trace_count == trace_cap) {
        trace_cap = trace_cap ? 2 * trace_cap : 1024;
        trace_events = reallocCheck(trace_events, (size_t)trace_cap * sizeof(TraceEvent));
    }
    TraceEvent* e = &trace_events[trace_count++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->name, sizeof e->name, fmt, ap);
    va_end(ap);
    snprintf(e->cat, sizeof e->cat, "%s", cat);
    e->t0 = t0, e->t1 = t1, e->bytes = bytes;
}

// What a path that is not a regular file is, for messages.
static const char* file_kind(mode_t mode) {
    return S_ISDIR(mode) ? "a folder" : S_ISFIFO(mode) ? "a named pipe" : S_ISCHR(mode) || S_ISBLK(mode) ? "a device"
         : S_ISSOCK(mode) ? "a socket" : S_ISLNK(mode) ? "a symbolic link" : "not a regular file";
}

// Opens a file a tool reads (a summary, a log, a compute table, a trace), or the process ends
// saying why: only a regular file of at most max_bytes, since a named pipe would block the
// open forever and a device such as /dev/zero would never end.
static FILE* open_tool_file(const char* path, const char* what, long max_bytes) {
    struct stat st;
    if (stat(path, &st) != 0) fatal("cannot open %s '%s': %s", what, path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fatal("%s '%s' is %s, not a regular file", what, path, file_kind(st.st_mode));
    if (st.st_size > max_bytes)
        fatal("%s '%s' is %.0f MB, more than the %ld MB such a file can be", what, path, st.st_size / 1e6, max_bytes >> 20);
    FILE* f = fopen(path, "r");
    if (!f) fatal("cannot open %s '%s': %s", what, path, strerror(errno));
    return f;
}

// The pipeline actions of a trace written by trace_write (train_pp.c names them "F3 chunk 1":
// the action, its microbatch, its chunk): at most `max` of them into ev; returns how many.
typedef struct {
    int rank, mb;
    char op;
    double t0, dur; // microseconds
} PipeEvent;
static int trace_read_pipeline(const char* path, PipeEvent* ev, int max) {
    FILE* in = open_tool_file(path, "trace", 256L << 20);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, in) && n < max) { // one event per line, as trace_write writes them
        char name[64], cat[32];
        PipeEvent e;
        if (sscanf(line, "{\"name\": \"%63[^\"]\", \"cat\": \"%31[^\"]\", \"ph\": \"X\", \"pid\": %d, \"tid\": 0, "
                         "\"ts\": %lf, \"dur\": %lf", name, cat, &e.rank, &e.t0, &e.dur) != 5 || strcmp(cat, "pipeline"))
            continue;
        e.op = name[0], e.mb = atoi(name + 1);
        ev[n++] = e;
    }
    fclose(in);
    return n;
}

// A --summary file's numbers (report.h's summary_write), and the one rule both of its readers
// apply: cli.h's summary_recognise, which decides whether a run may replace the file, and
// tools/summary.h's summary_read (make run's table, the cost model). A file one takes, the
// other takes too. A value is written as report.h writes it (%.17g, %.4f, %.0f: digits, a
// point, an exponent, a sign; val_loss also nan or inf, a run that diverged), within its range.
typedef struct {
    const char* key;
    char kind; // 'n': a number from lo to hi, 'w': a whole one, 'a': any number, nan too
    double lo, hi;
} SummaryKey;
static const SummaryKey summary_keys[] = {
    {"ranks", 'w', 1, 1 << 20}, {"val_loss", 'a', 0, 0}, {"seconds", 'n', 0, 1e12}, {"steps", 'w', 0, 1e15},
    {"batch", 'w', 1, 1 << 30},
    // a rank= line's: the rank, then counts and sizes, never negative; bubble is the pipeline's
    // idle fraction, -1 in a run without a pipeline
    {"rank", 'w', 0, 1 << 20}, {"sent", 'n', 0, 1e18}, {"sent_tp", 'n', 0, 1e18}, {"sent_dp", 'n', 0, 1e18},
    {"sent_pp", 'n', 0, 1e18}, {"sent_cp", 'n', 0, 1e18}, {"sent_ep", 'n', 0, 1e18}, {"sent_formula", 'n', 0, 1e18},
    {"received", 'n', 0, 1e18}, {"params", 'n', 0, 1e18}, {"grads", 'n', 0, 1e18}, {"optim", 'n', 0, 1e18},
    {"acts", 'n', 0, 1e18}, {"mem_formula", 'n', 0, 1e18}, {"bubble", 'n', -1, 1}, {"messages", 'n', 0, 1e18},
};
// The value of the key of klen bytes, from text of n bytes, into *v: NULL, or why not.
static const char* summary_value(const char* key, size_t klen, const char* text, size_t n, double* v) {
    static char why[160];
    const SummaryKey* k = NULL;
    for (size_t i = 0; i < sizeof summary_keys / sizeof *summary_keys; i++)
        if (strlen(summary_keys[i].key) == klen && !memcmp(summary_keys[i].key, key, klen)) k = &summary_keys[i];
    if (!k) return snprintf(why, sizeof why, "'%.*s' is not a key of a --summary file", (int)(klen < 40 ? klen : 40), key), why;
    char buf[64], *end;
    int ok = n > 0 && n < sizeof buf;
    if (ok) memcpy(buf, text, n), buf[n] = 0;
    int word = ok && k->kind == 'a' && (!strcmp(buf, "nan") || !strcmp(buf, "-nan") || !strcmp(buf, "inf") || !strcmp(buf, "-inf"));
    if (ok) ok = word || strspn(buf, "0123456789.eE+-") == n;
    if (ok) {
        errno = 0;
        *v = strtod(buf, &end);
        ok = *end == 0 && (errno == 0 || word); // (1e999 is written inf)
    }
    if (ok && k->kind != 'a') ok = *v >= k->lo && *v <= k->hi && (k->kind != 'w' || *v == floor(*v));
    if (ok) return NULL;
    if (k->kind == 'a') return snprintf(why, sizeof why, "%s=%.*s is not a number", k->key, (int)(n < 40 ? n : 40), text), why;
    return snprintf(why, sizeof why, "%s=%.*s is not %s from %g to %g", k->key, (int)(n < 40 ? n : 40), text,
                    k->kind == 'w' ? "a whole number" : "a number", k->lo, k->hi), why;
}

#pragma GCC diagnostic pop
#endif // UTIL_H
