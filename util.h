/*
 * util.h: what every other file needs: fatal errors that end the whole job, checked
 * allocation and file opening, the counter-based random generator, and a clock.
 *
 * Fatal errors go through one hook, so that the same check ends a single process with
 * exit(1) and an MPI job with MPI_Abort (dist.h installs that hook): a check that fails
 * on one rank must never leave the other ranks waiting for it.
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

// How a fatal error ends the program; MPI programs replace it with MPI_Abort.
static void (*fatal_exit_hook)(int status) = exit;

__attribute__((format(printf, 1, 2), noreturn)) static void fatal(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    fatal_exit_hook(1);
    exit(1); // the hook must not return; if it does, still stop here
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
static FILE* fopen_check(const char* path, const char* mode, const char* file, int line) {
    FILE* f = fopen(path, mode);
    if (!f) fatal("%s:%d: cannot open '%s' (mode %s): %s", file, line, path, mode, strerror(errno));
    return f;
}
#define mallocCheck(size) malloc_check((size), __FILE__, __LINE__)
#define callocCheck(n, size) calloc_check((n), (size), __FILE__, __LINE__)
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
// time

static inline double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#pragma GCC diagnostic pop
#endif // UTIL_H
