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

#include "model.h" // first: util.h sets the POSIX feature level
#include "cli.h"

#include <fcntl.h>
#include <stddef.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// the file
//
// Written so that nothing is lost: to a temporary file in the same folder, flushed to the
// disk, then renamed over the old checkpoint (a rename is atomic), so a kill or a full disk
// during a save leaves the previous checkpoint whole. Read so that nothing is silent: the
// header says which byte order wrote it, and holds every flag that decides the result
// (seed, batch, optimizer and its settings, a checksum of the data file); resuming with
// any of them changed is refused, naming each difference, unless --allow-changes says
// the change is deliberate. The data are read once, checked as they are read (the
// checksum, and that every value is finite), before training starts.

#define CKPT_MAGIC "MLPCKPT3"
#define CKPT_MAGIC_V2 "MLPCKPT2" // format 2: the same without the mixture-of-experts fields (a dense model)
#define CKPT_BYTE_ORDER 0x01020304u // reads as 0x04030201 on a machine of the other byte order
typedef struct {
    char magic[8];
    uint32_t byte_order;
    int32_t vocab, context, emb, hidden, layers, adamw;
    int64_t step;     // completed training steps
    int64_t n_params;
    unsigned char chars[256]; // the vocabulary, so that another dataset is caught
    uint64_t seed, data_sum;  // what else decides the result
    int32_t batch, pad;
    float lr, weight_decay, beta1, beta2, eps, clip;
    // format 3: the mixture of experts (experts 0: a dense model)
    int32_t experts, top_k;
    float capacity, aux_loss;
} CkptHeader;
#define CKPT_V2_BYTES offsetof(CkptHeader, experts)
// bytes of the header as it is in its file
static long ckpt_header_bytes(const CkptHeader* h) {
    return memcmp(h->magic, CKPT_MAGIC_V2, 8) == 0 ? (long)CKPT_V2_BYTES : (long)sizeof *h;
}

static CkptHeader ckpt_header(const Config* c, const Options* o, const Dataset* ds, long step) {
    CkptHeader h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.byte_order = CKPT_BYTE_ORDER;
    h.vocab = c->vocab, h.context = c->context, h.emb = c->emb, h.hidden = c->hidden, h.layers = c->layers;
    h.adamw = o->opt.adamw;
    h.step = step;
    h.n_params = n_params(c);
    memcpy(h.chars, ds->token_char, (size_t)c->vocab);
    h.seed = o->seed, h.data_sum = ds->checksum, h.batch = o->batch;
    h.lr = o->opt.lr, h.weight_decay = o->opt.weight_decay, h.beta1 = o->opt.beta1, h.beta2 = o->opt.beta2;
    h.eps = o->opt.eps, h.clip = o->opt.clip;
    h.experts = c->experts, h.top_k = c->top_k, h.capacity = c->capacity, h.aux_loss = c->aux_loss;
    return h;
}
static long ckpt_floats(const CkptHeader* h) { return (h->adamw ? 3 : 1) * (long)h->n_params; }

// Reads and checks a header: this project's, this byte order, sizes that fit the file. A
// header of format 2 is a dense model's (its fields read as experts 0).
static void ckpt_read_header(FILE* f, const char* path, CkptHeader* h) {
    memset(h, 0, sizeof *h);
    if (fread(h, 1, CKPT_V2_BYTES, f) != CKPT_V2_BYTES || memcmp(h->magic, "MLPCKPT", 7) != 0)
        fatal("'%s' is not a checkpoint of this project (bad header)", path);
    if (memcmp(h->magic, CKPT_MAGIC, 8) != 0 && memcmp(h->magic, CKPT_MAGIC_V2, 8) != 0)
        fatal("checkpoint '%s' has format %.8s, this program reads %s and %s: save it again with the program that "
              "wrote it", path, h->magic, CKPT_MAGIC_V2, CKPT_MAGIC);
    long rest = ckpt_header_bytes(h) - (long)CKPT_V2_BYTES;
    if (rest > 0 && fread((char*)h + CKPT_V2_BYTES, 1, (size_t)rest, f) != (size_t)rest)
        fatal("'%s' is not a checkpoint of this project (bad header)", path);
    if (h->byte_order != CKPT_BYTE_ORDER)
        fatal("checkpoint '%s' was written on a machine of the other byte order; this program reads its own only", path);
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (h->n_params <= 0 || h->n_params > (1L << 31) || h->step < 0 || h->step > 1000000000L || (h->adamw != 0 && h->adamw != 1) ||
        h->experts < 0 || h->experts > 1024 || (h->experts > 0 && (h->top_k < 1 || h->top_k > 2)) ||
        size != ckpt_header_bytes(h) + ckpt_floats(h) * (long)sizeof(float) + (long)sizeof(uint64_t))
        fatal("checkpoint '%s' is corrupt or truncated (its header does not match its size)", path);
    fseek(f, ckpt_header_bytes(h), SEEK_SET);
}

// Refuses a checkpoint that does not fit this run, naming every difference.
static void ckpt_check_fit(const CkptHeader* h, const char* path, const Config* c, const Options* o, const Dataset* ds) {
    if (h->experts != c->experts) {
        if (h->experts == 0)
            fatal("checkpoint '%s' is of a dense model and this run has --experts %d: leave out --experts", path, c->experts);
        fatal("checkpoint '%s' is of a mixture of %d experts and this run's model has %d: pass --experts %d", path,
              h->experts, c->experts, h->experts);
    }
    if (h->vocab != c->vocab || h->context != c->context || h->emb != c->emb || h->hidden != c->hidden ||
        h->layers != c->layers || h->n_params != n_params(c))
        fatal("checkpoint '%s' is of a different model (vocabulary %d, context %d, emb %d, hidden %d, layers %d); "
              "pass the same --context --emb --hidden --layers and data", path, h->vocab, h->context, h->emb,
              h->hidden, h->layers);
    if (memcmp(h->chars, ds->token_char, (size_t)c->vocab) != 0)
        fatal("checkpoint '%s' was trained on data with a different vocabulary", path);
    if (h->adamw != o->opt.adamw)
        fatal("checkpoint '%s' holds %s state; pass --optimizer %s", path, h->adamw ? "AdamW" : "SGD",
              h->adamw ? "adamw" : "sgd");
    if (o->steps < h->step)
        fatal("checkpoint '%s' is at step %lld, past --steps %ld: this run would train nothing; pass --steps %lld or "
              "more (%lld only evaluates)", path, (long long)h->step, o->steps, (long long)h->step, (long long)h->step);
    char diff[768] = "";
    size_t n = 0;
#define CKPT_DIFF(cond, ...) if (cond) n += (size_t)snprintf(diff + n, n < sizeof diff ? sizeof diff - n : 0, __VA_ARGS__)
    CKPT_DIFF(h->seed != o->seed, " --seed %llu (now %llu);", (unsigned long long)h->seed, (unsigned long long)o->seed);
    CKPT_DIFF(h->batch != o->batch, " --batch %d (now %d);", h->batch, o->batch);
    CKPT_DIFF(h->lr != o->opt.lr, " --lr %g (now %g);", h->lr, o->opt.lr);
    CKPT_DIFF(h->weight_decay != o->opt.weight_decay, " --weight-decay %g (now %g);", h->weight_decay, o->opt.weight_decay);
    CKPT_DIFF(h->clip != o->opt.clip, " --clip %g (now %g);", h->clip, o->opt.clip);
    CKPT_DIFF(h->beta1 != o->opt.beta1 || h->beta2 != o->opt.beta2 || h->eps != o->opt.eps, " AdamW's betas or eps;");
    CKPT_DIFF(h->data_sum != ds->checksum, " the data file's contents;");
    CKPT_DIFF(c->experts > 0 && h->top_k != c->top_k, " --top-k %d (now %d);", h->top_k, c->top_k);
    CKPT_DIFF(c->experts > 0 && h->capacity != c->capacity, " --capacity %g (now %g);", h->capacity, c->capacity);
    CKPT_DIFF(c->experts > 0 && h->aux_loss != c->aux_loss, " --aux-loss %g (now %g);", h->aux_loss, c->aux_loss);
#undef CKPT_DIFF
    if (n > 0 && !o->allow_changes)
        fatal("checkpoint '%s' was trained with other settings:%s resuming would not continue that run. Pass the "
              "same flags, or --allow-changes to change them deliberately", path, diff);
}

// Writes the header, then the floats the caller hands it, then the checksum, to a
// temporary file that ckpt_close renames over `path`.
typedef struct {
    FILE* f;
    uint64_t sum;
    const char* path;
    int keep;        // --keep: the last `keep` checkpoints stay, as path, path.1, ...
    char tmp[4096];
} CkptWriter;
static void ckpt_fail(CkptWriter* w, const char* what) {
    int err = errno;
    if (w->f) fclose(w->f);
    remove(w->tmp);
    fatal("cannot %s checkpoint '%s': %s; the previous one, if any, is untouched", what, w->path, strerror(err));
}
static void ckpt_write(CkptWriter* w, const void* data, size_t n) {
    if (fwrite(data, 1, n, w->f) != n) ckpt_fail(w, "write");
    w->sum = fnv1a(w->sum, data, n);
}
static void ckpt_create(CkptWriter* w, const char* path, int keep, const CkptHeader* h) {
    *w = (CkptWriter){.sum = FNV_START, .path = path, .keep = keep};
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp-%ld", path, (long)getpid());
    w->f = fopen(w->tmp, "wb");
    if (!w->f) ckpt_fail(w, "create");
    ckpt_write(w, h, sizeof *h);
}
// The checksum; the data on the disk (fsync); then the new file in the old one's place, and
// that renaming on the disk too (fsync of the folder).
static void ckpt_close(CkptWriter* w) {
    uint64_t sum = w->sum;
    ckpt_write(w, &sum, sizeof sum);
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0) ckpt_fail(w, "write");
    if (fclose(w->f) != 0) w->f = NULL, ckpt_fail(w, "write");
    w->f = NULL;
    for (int i = w->keep - 1; i >= 1; i--) { // path.(i-1) becomes path.i, the oldest is dropped
        char from[4200], to[4200];
        snprintf(from, sizeof from, i == 1 ? "%s" : "%s.%d", w->path, i - 1);
        snprintf(to, sizeof to, "%s.%d", w->path, i);
        if (rename(from, to) != 0 && errno != ENOENT) ckpt_fail(w, "keep the previous");
    }
    if (rename(w->tmp, w->path) != 0) ckpt_fail(w, "replace");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", w->path);
    char* slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) fsync(fd), close(fd);
}

// Writes a whole checkpoint at `step` from one process that holds every parameter.
static void ckpt_save(const Options* o, const Dataset* ds, const Config* c, long step, const State* s) {
    CkptHeader h = ckpt_header(c, o, ds, step);
    CkptWriter w;
    ckpt_create(&w, o->save, o->keep, &h);
    long n = n_params(c);
    ckpt_write(&w, s->params, (size_t)n * sizeof(float));
    if (o->opt.adamw) {
        ckpt_write(&w, s->m, (size_t)n * sizeof(float));
        ckpt_write(&w, s->v, (size_t)n * sizeof(float));
    }
    ckpt_close(&w);
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

// Fills what this process holds: from the checkpoint of --load (its parameters, and its m
// and v with AdamW), or without one, the parameters with the initial values train.c uses
// (m and v stay 0). One unit at a time: no process builds the whole model. The checkpoint
// is read once, front to back, every byte into the checksum and every value checked
// finite, and refused before training if anything is wrong. Returns its step, or 0.
static long holding_load(const Holding* h, const Options* o, const Dataset* ds, const Config* c) {
    const char* path = o->load;
    float* unit = mallocCheck((size_t)max_unit_params(c) * sizeof(float));
    CkptHeader hd = {0};
    FILE* f = NULL;
    uint64_t sum = FNV_START, stored;
    if (path) {
        f = fopen(path, "rb");
        if (!f) fatal("cannot open checkpoint '%s': %s", path, strerror(errno));
        ckpt_read_header(f, path, &hd);
        ckpt_check_fit(&hd, path, c, o, ds);
        sum = fnv1a(sum, &hd, (size_t)ckpt_header_bytes(&hd));
    }
    for (int part = 0; part < (path && o->opt.adamw ? 3 : 1); part++)
        for (int u = 0; u < n_units(c); u++) {
            long count = unit_params(c, u);
            if (path) {
                if (fread(unit, sizeof(float), (size_t)count, f) != (size_t)count) fatal("checkpoint '%s' is truncated", path);
                sum = fnv1a(sum, unit, (size_t)count * sizeof(float));
                for (long e = 0; e < count; e++)
                    if (!isfinite(unit[e]))
                        fatal("checkpoint '%s' holds a value that is not finite (%s of %s, element %ld): the run it "
                              "saved had diverged", path, part == 0 ? "a parameter" : "optimizer state", unit_name(c, u), e);
            } else {
                for (long e = 0; e < count; e++) unit[e] = unit_init_value(c, o->seed, u, e);
            }
            for (long e = 0; e < h->n[u]; e++) {
                long k = holding_index(h, c, u, e);
                h->at[part][u][e] = k < 0 ? 0.0f : unit[k];
            }
        }
    if (path) {
        if (fread(&stored, 1, sizeof stored, f) != sizeof stored) fatal("checkpoint '%s' is truncated", path);
        if (sum != stored) fatal("checkpoint '%s' is corrupt (checksum mismatch)", path);
        fclose(f);
    }
    free(unit);
    return (long)hd.step;
}

// The whole model in one process's State, filled as holding_load does.
static Holding holding_units(const Config* c, const State* s, int u_lo, int u_hi, long base);
static long state_load(State* s, const Options* o, const Dataset* ds, const Config* c) {
    Holding all = holding_units(c, s, 0, n_units(c), 0);
    return holding_load(&all, o, ds, c);
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
