/*
 * ckpt.h: checkpoints, one file format for every program, and the code that fills a
 * process's share of the model, from a checkpoint or from the initial values.
 *
 * A checkpoint is a header, then the parameters in train.c's layout, then AdamW's m and v
 * (none for SGD), then a 64-bit FNV-1a checksum of all preceding bytes. Whatever its
 * layout, a program reads and writes this one format, so any program resumes from any
 * other's checkpoint. A sharded program describes what it holds (a Holding: which
 * elements of each unit, and where) and the functions here and in dist.h do the rest.
 */
#ifndef CKPT_H
#define CKPT_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "model.h"

// ----------------------------------------------------------------------------
// the file

#define CKPT_MAGIC "MLPCKPT1"
typedef struct {
    char magic[8];
    int32_t vocab, context, emb, hidden, layers, adamw;
    int64_t step;     // completed training steps
    int64_t n_params;
    unsigned char chars[256]; // the vocabulary, so that another dataset is caught
} CkptHeader;

static uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
    const unsigned char* p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}
#define FNV_START 0xcbf29ce484222325ull

static CkptHeader ckpt_header(const Config* c, int adamw, long step, const unsigned char* chars) {
    CkptHeader h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.vocab = c->vocab;
    h.context = c->context;
    h.emb = c->emb;
    h.hidden = c->hidden;
    h.layers = c->layers;
    h.adamw = adamw;
    h.step = step;
    h.n_params = n_params(c);
    memcpy(h.chars, chars, (size_t)c->vocab);
    return h;
}
static long ckpt_floats(const CkptHeader* h) { return (h->adamw ? 3 : 1) * (long)h->n_params; }

// Writes the header, then `n` floats gathered by the caller, then the checksum.
typedef struct {
    FILE* f;
    uint64_t sum;
    const char* path;
} CkptWriter;
static void ckpt_write(CkptWriter* w, const void* data, size_t n) {
    if (fwrite(data, 1, n, w->f) != n) fatal("cannot write checkpoint '%s': %s", w->path, strerror(errno));
    w->sum = fnv1a(w->sum, data, n);
}
static CkptWriter ckpt_create(const char* path, const CkptHeader* h) {
    CkptWriter w = {fopen(path, "wb"), FNV_START, path};
    if (!w.f) fatal("cannot create checkpoint '%s': %s", path, strerror(errno));
    ckpt_write(&w, h, sizeof *h);
    return w;
}
static void ckpt_close(CkptWriter* w) {
    uint64_t sum = w->sum;
    ckpt_write(w, &sum, sizeof sum);
    if (fclose(w->f) != 0) fatal("cannot write checkpoint '%s': %s", w->path, strerror(errno));
}

// Writes a whole checkpoint from one process that holds every parameter (n of them).
static void ckpt_save(const char* path, const Config* c, int adamw, long step, const unsigned char* chars,
                      const float* params, const float* m, const float* v) {
    CkptHeader h = ckpt_header(c, adamw, step, chars);
    CkptWriter w = ckpt_create(path, &h);
    long n = n_params(c);
    ckpt_write(&w, params, (size_t)n * sizeof(float));
    if (adamw) {
        ckpt_write(&w, m, (size_t)n * sizeof(float));
        ckpt_write(&w, v, (size_t)n * sizeof(float));
    }
    ckpt_close(&w);
}

// Checks a checkpoint without loading it: header, size, checksum (read in pieces), and
// agreement with this run's model, optimizer and data. Returns the header.
static CkptHeader ckpt_check(const char* path, const Config* c, int adamw, const unsigned char* chars) {
    FILE* f = fopen(path, "rb");
    if (!f) fatal("cannot open checkpoint '%s': %s", path, strerror(errno));
    CkptHeader h;
    if (fread(&h, 1, sizeof h, f) != sizeof h || memcmp(h.magic, CKPT_MAGIC, 8) != 0)
        fatal("'%s' is not a checkpoint of this project (bad header)", path);
    if (h.vocab != c->vocab || h.context != c->context || h.emb != c->emb || h.hidden != c->hidden ||
        h.layers != c->layers)
        fatal("checkpoint '%s' is of a different model (vocabulary %d, context %d, emb %d, hidden %d, layers %d); "
              "pass the same --context --emb --hidden --layers and data", path, h.vocab, h.context, h.emb, h.hidden,
              h.layers);
    if (h.n_params != n_params(c) || h.step < 0) fatal("checkpoint '%s' is corrupt (bad sizes)", path);
    if (memcmp(h.chars, chars, (size_t)c->vocab) != 0)
        fatal("checkpoint '%s' was trained on data with a different vocabulary", path);
    if (h.adamw != adamw)
        fatal("checkpoint '%s' holds %s state; pass --optimizer %s", path, h.adamw ? "AdamW" : "SGD",
              h.adamw ? "adamw" : "sgd");
    uint64_t sum = fnv1a(FNV_START, &h, sizeof h), stored;
    unsigned char buf[1 << 16];
    for (long left = ckpt_floats(&h) * (long)sizeof(float); left > 0;) {
        size_t want = left < (long)sizeof buf ? (size_t)left : sizeof buf;
        if (fread(buf, 1, want, f) != want) fatal("checkpoint '%s' is truncated", path);
        sum = fnv1a(sum, buf, want);
        left -= (long)want;
    }
    if (fread(&stored, 1, sizeof stored, f) != sizeof stored) fatal("checkpoint '%s' is truncated", path);
    if (fgetc(f) != EOF) fatal("checkpoint '%s' is corrupt (trailing bytes)", path);
    if (sum != stored) fatal("checkpoint '%s' is corrupt (checksum mismatch)", path);
    fclose(f);
    return h;
}

// Reads floats [first, first+count) of a checked checkpoint's data (parameters, then m, then v).
static void ckpt_read(const char* path, long first, long count, float* dst) {
    FILE* f = fopen(path, "rb");
    if (!f || fseek(f, (long)sizeof(CkptHeader) + first * (long)sizeof(float), SEEK_SET) != 0 ||
        fread(dst, sizeof(float), (size_t)count, f) != (size_t)count)
        fatal("cannot read checkpoint '%s'", path);
    fclose(f);
}

// Restores every parameter (and AdamW's state) of a checkpoint; returns its step.
static long ckpt_restore(const char* path, const Config* c, int adamw, const unsigned char* chars, float* params,
                         float* m, float* v) {
    CkptHeader h = ckpt_check(path, c, adamw, chars);
    long n = n_params(c);
    ckpt_read(path, 0, n, params);
    if (adamw) {
        ckpt_read(path, n, n, m);
        ckpt_read(path, 2 * n, n, v);
    }
    return (long)h.step;
}

// ----------------------------------------------------------------------------
// a process's share of the model

// What one process holds of the model's state, unit by unit: n[u] elements of unit u, the
// parameters at at[0][u] and AdamW's m and v at at[1][u] and at[2][u]. Element e of them
// is element canonical(ctx, u, e) of unit u in train.c's layout, or padding if that is -1
// (padding stays 0). Without a canonical function, element e is element first[u] + e, or
// padding past the unit's end.
typedef struct {
    long n[MAX_LAYERS + 2];
    float* at[3][MAX_LAYERS + 2];
    long first[MAX_LAYERS + 2];
    long (*canonical)(const void* ctx, int u, long e);
    const void* ctx;
} Holding;

static long holding_index(const Holding* h, const Config* c, int u, long e) {
    if (h->canonical) return h->canonical(h->ctx, u, e);
    long k = h->first[u] + e;
    return k < unit_params(c, u) ? k : -1;
}

// Fills what this process holds: from checkpoint `path` (its parameters, and its m and v
// with AdamW), or, without a path, the parameters with the initial values train.c uses
// (m and v stay 0). One unit at a time: no process builds the whole model. Returns the
// checkpoint's step, or 0.
static long holding_load(const Holding* h, const char* path, const Config* c, int adamw, uint64_t seed,
                         const unsigned char* chars) {
    long n = n_params(c), step = path ? (long)ckpt_check(path, c, adamw, chars).step : 0;
    float* unit = mallocCheck((size_t)max_unit_params(c) * sizeof(float));
    for (int part = 0; part < (path && adamw ? 3 : 1); part++)
        for (int u = 0; u < n_units(c); u++) {
            if (h->n[u] == 0) continue;
            if (path) ckpt_read(path, part * n + unit_offset(c, u), unit_params(c, u), unit);
            else
                for (long e = 0; e < unit_params(c, u); e++) unit[e] = unit_init_value(c, seed, u, e);
            for (long e = 0; e < h->n[u]; e++) {
                long k = holding_index(h, c, u, e);
                h->at[part][u][e] = k < 0 ? 0.0f : unit[k];
            }
        }
    free(unit);
    return step;
}

// The whole model in one process's State: filled from checkpoint `path`, or with the
// initial values (path NULL). Returns the checkpoint's step, or 0.
static Holding holding_units(const Config* c, const State* s, int u_lo, int u_hi, long base);
static long state_load(State* s, const char* path, const Config* c, int adamw, uint64_t seed,
                       const unsigned char* chars) {
    Holding all = holding_units(c, s, 0, n_units(c), 0);
    return holding_load(&all, path, c, adamw, seed, chars);
}

// Units [u_lo, u_hi) whole, in train.c's layout, in a State whose first element is element
// `base` of the model (0 for the whole model; a pipeline stage's first parameter).
static Holding holding_units(const Config* c, const State* s, int u_lo, int u_hi, long base) {
    Holding h = {0};
    for (int u = u_lo; u < u_hi; u++) {
        long off = unit_offset(c, u) - base;
        h.n[u] = unit_params(c, u);
        h.at[0][u] = s->params + off;
        h.at[1][u] = s->m ? s->m + off : NULL;
        h.at[2][u] = s->v ? s->v + off : NULL;
    }
    return h;
}

#pragma GCC diagnostic pop
#endif // CKPT_H
