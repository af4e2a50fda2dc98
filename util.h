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
#include <time.h>

// ----------------------------------------------------------------------------
// fatal errors

// How a fatal error ends the program: its message on stderr, then exit(1). dist_init
// replaces this with dist.h's fatal_end_job.
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

static inline uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t index) {
    return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index);
}

// uniform in [0, 1) with 53 random bits
static inline double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return (double)(rng_u64(seed, stream, index) >> 11) * 0x1p-53;
}

// standard normal (Box-Muller on two draws of this index)
static inline double rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    double u1 = 1.0 - rng_uniform(seed, stream, 2 * index); // in (0, 1]: log is finite
    double u2 = rng_uniform(seed, stream, 2 * index + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
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

// ----------------------------------------------------------------------------
// trace events (--trace)
//
// While trace_on is set (during one chosen step), the ops, pipeline passes and messages of
// this process record an event each: a name, a category, when it started and ended, and
// the bytes it sent. dist.h gathers every rank's events into one Chrome trace-event file.

static int trace_on; // record trace events now

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

#pragma GCC diagnostic pop
#endif // UTIL_H
