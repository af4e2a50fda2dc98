/*
 * ckpt.h: checkpoints, one file format for every program, and the code that fills a
 * process's share of the model, from a checkpoint or from the initial values.
 *
 * A checkpoint is a header, then the vocabulary (the code point of each token), then the
 * parameters in train.c's layout, then AdamW's m and v (none for SGD), then a 64-bit
 * FNV-1a checksum of all preceding bytes. Whatever its
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

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// the file
//
// Written so that nothing is lost: to a temporary file in the same folder, flushed to the
// disk, then renamed over the old checkpoint (a rename is atomic), so a kill or a full disk
// during a save leaves the previous checkpoint whole, and a checkpoint exists at the path
// at every moment (ckpt_close); only over this project's checkpoints (cli.h checks before
// step 1 what is at the path and at the --keep files, ckpt_close again). Read so that
// nothing is silent: the header says which byte order wrote it, and holds the model (its
// kind, sizes and vocabulary) and every flag that decides the result (seed, batch,
// optimizer and its settings, a checksum of the data file); resuming with any of them
// changed is refused, naming each difference, unless --allow-changes says the change is
// deliberate. The data are read once, checked as they are read (the checksum, and that
// every value is finite), before training starts.

#define CKPT_MAGIC "MLPCKPT4"
#define CKPT_MAGIC_V3 "MLPCKPT3" // format 3: the vocabulary as 256 bytes, no model kind (an MLP), no losses
#define CKPT_MAGIC_V2 "MLPCKPT2" // format 2: format 3 without the mixture-of-experts fields (a dense model)
#define CKPT_BYTE_ORDER 0x01020304u // reads as 0x04030201 on a machine of the other byte order

// Format 4's header, as it starts its file: every byte a field (no padding), then the
// vocabulary (`vocab` code points, uint32), then the floats, then the checksum.
typedef struct {
    char magic[8];
    uint32_t byte_order;
    int32_t vocab, context, emb, hidden, layers, adamw;
    int32_t model;      // MODEL_MLP or MODEL_GPT
    int64_t step;       // completed training steps
    int64_t n_params;
    uint64_t seed, data_sum; // what else decides the result
    uint64_t losses;    // the run's losses so far (ckpt_losses below), 0: unknown
    int32_t batch, heads;
    int32_t experts, top_k; // the mixture of experts (experts 0: a dense model)
    float lr, weight_decay, beta1, beta2, eps, clip;
    float capacity, aux_loss;
    // in memory only: the vocabulary that follows the header in the file (the code point of
    // each token, so that another dataset is caught), and, for a header read from a file,
    // its format and its bytes (vocabulary included) as they are there
    uint32_t* code_points;
    int format;
    long bytes;
} CkptHeader;
#define CKPT_FIXED_BYTES offsetof(CkptHeader, code_points)
_Static_assert(offsetof(CkptHeader, code_points) == 128, "format 4's header is 128 bytes, with no padding");

// Formats 2 and 3, as in their files (format 2 ends before `experts`), read to convert.
typedef struct {
    char magic[8];
    uint32_t byte_order;
    int32_t vocab, context, emb, hidden, layers, adamw;
    int64_t step;
    int64_t n_params;
    unsigned char chars[256]; // the vocabulary: the byte each token stands for
    uint64_t seed, data_sum;
    int32_t batch, pad;
    float lr, weight_decay, beta1, beta2, eps, clip;
    int32_t experts, top_k;
    float capacity, aux_loss;
} CkptHeaderV3;
#define CKPT_V2_BYTES offsetof(CkptHeaderV3, experts)

// The losses of the run so far, which a checkpoint records so that a resumed run can tell
// its own --log from another run's (report.h): a checksum of "step,training loss\n", as the
// --log's lines begin, of every step from 1 to `step`; 0 if unknown (a run resumed from a
// checkpoint of format 2 or 3). The same in every layout, and with or without a --log; not
// the validation losses, which a run takes at its last step too, and so depend on --steps.
// holding_load sets it from --load, report.h's progress_step adds each step, ckpt_header
// records it.
static struct {
    long step;
    uint64_t sum;
} ckpt_losses = {0, FNV_START};
// Adds step `step` to it, as the text "step,training loss" (into text, LOSSES_TEXT bytes;
// returns its length), which the --log's line of the step begins with.
#define LOSSES_TEXT 64
static int ckpt_losses_add(char* text, long step, double train_loss) {
    int n = snprintf(text, LOSSES_TEXT, "%ld,%.17g", step, train_loss);
    if (ckpt_losses.sum) ckpt_losses.sum = fnv1a(fnv1a(ckpt_losses.sum, text, (size_t)n), "\n", 1);
    ckpt_losses.step = step;
    return n;
}

static CkptHeader ckpt_header(const Config* c, const Options* o, const Dataset* ds, long step) {
    CkptHeader h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.byte_order = CKPT_BYTE_ORDER;
    h.vocab = c->vocab, h.context = c->context, h.emb = c->emb, h.hidden = c->hidden, h.layers = c->layers;
    h.adamw = o->opt.adamw;
    h.model = c->model, h.heads = c->heads;
    h.step = step;
    h.n_params = n_params(c);
    h.code_points = ds->code_point;
    h.seed = o->seed, h.data_sum = ds->checksum, h.batch = o->batch;
    h.losses = ckpt_losses.step == step ? ckpt_losses.sum : 0;
    h.lr = o->opt.lr, h.weight_decay = o->opt.weight_decay, h.beta1 = o->opt.beta1, h.beta2 = o->opt.beta2;
    h.eps = o->opt.eps, h.clip = o->opt.clip;
    h.experts = c->experts, h.top_k = c->top_k, h.capacity = c->capacity, h.aux_loss = c->aux_loss;
    return h;
}
static long ckpt_floats(const CkptHeader* h) { return (h->adamw ? 3 : 1) * (long)h->n_params; }
static void ckpt_header_free(CkptHeader* h) {
    free(h->code_points);
    h->code_points = NULL;
}

// Reads and checks a header: this project's, this byte order, sizes that fit the file; adds
// its bytes, as they are in the file, to the checksum *sum. A header of format 2 or 3 reads
// as format 4's: an MLP, its vocabulary's bytes the code points (U+0000..U+00FF), the
// losses unknown; format 2's model is dense (experts 0). The caller frees the vocabulary
// (ckpt_header_free).
static void ckpt_read_header(FILE* f, const char* path, CkptHeader* h, uint64_t* sum) {
    memset(h, 0, sizeof *h);
    char magic[8];
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "MLPCKPT", 7) != 0)
        fatal("'%s' is not a checkpoint of this project (bad header)", path);
    int format = magic[7] - '0';
    if (format < 2 || format > 4)
        fatal("checkpoint '%s' has format %.8s, this program reads %s, %s and %s: save it again with the program "
              "that wrote it", path, magic, CKPT_MAGIC_V2, CKPT_MAGIC_V3, CKPT_MAGIC);
    if (format == 4) {
        memcpy(h->magic, magic, 8);
        if (fread((char*)h + 8, 1, CKPT_FIXED_BYTES - 8, f) != CKPT_FIXED_BYTES - 8)
            fatal("'%s' is not a checkpoint of this project (bad header)", path);
        *sum = fnv1a(*sum, h, CKPT_FIXED_BYTES);
    } else {
        CkptHeaderV3 old;
        memset(&old, 0, sizeof old);
        memcpy(old.magic, magic, 8);
        size_t bytes = format == 2 ? CKPT_V2_BYTES : sizeof old;
        if (fread((char*)&old + 8, 1, bytes - 8, f) != bytes - 8)
            fatal("'%s' is not a checkpoint of this project (bad header)", path);
        *sum = fnv1a(*sum, &old, bytes);
        memcpy(h->magic, old.magic, 8);
        h->byte_order = old.byte_order;
        h->vocab = old.vocab, h->context = old.context, h->emb = old.emb, h->hidden = old.hidden;
        h->layers = old.layers, h->adamw = old.adamw, h->model = MODEL_MLP, h->step = old.step;
        h->n_params = old.n_params, h->seed = old.seed, h->data_sum = old.data_sum, h->batch = old.batch;
        h->lr = old.lr, h->weight_decay = old.weight_decay, h->beta1 = old.beta1, h->beta2 = old.beta2;
        h->eps = old.eps, h->clip = old.clip;
        h->experts = old.experts, h->top_k = old.top_k, h->capacity = old.capacity, h->aux_loss = old.aux_loss;
        if (h->vocab >= 1 && h->vocab <= 256) {
            h->code_points = mallocCheck((size_t)h->vocab * sizeof(uint32_t));
            for (int t = 0; t < h->vocab; t++) h->code_points[t] = old.chars[t];
        }
        h->bytes = (long)bytes;
    }
    h->format = format;
    if (h->byte_order != CKPT_BYTE_ORDER)
        fatal("checkpoint '%s' was written on a machine of the other byte order; this program reads its own only", path);
    if (h->vocab < 1 || h->vocab > (format == 4 ? DATA_MAX_VOCAB : 256))
        fatal("checkpoint '%s' is corrupt (a vocabulary of %d tokens)", path, h->vocab);
    if (format == 4) { // the vocabulary follows
        h->code_points = mallocCheck((size_t)h->vocab * sizeof(uint32_t));
        if (fread(h->code_points, sizeof(uint32_t), (size_t)h->vocab, f) != (size_t)h->vocab)
            fatal("checkpoint '%s' is truncated", path);
        *sum = fnv1a(*sum, h->code_points, (size_t)h->vocab * sizeof(uint32_t));
        h->bytes = (long)CKPT_FIXED_BYTES + h->vocab * (long)sizeof(uint32_t);
    }
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (h->n_params <= 0 || h->n_params > (1L << 31) || h->step < 0 || h->step > 1000000000L || (h->adamw != 0 && h->adamw != 1) ||
        (h->model != MODEL_MLP && h->model != MODEL_GPT) || h->heads < 0 || h->heads > 4096 ||
        h->experts < 0 || h->experts > 1024 || (h->experts > 0 && (h->top_k < 1 || h->top_k > 2)) ||
        size != h->bytes + ckpt_floats(h) * (long)sizeof(float) + (long)sizeof(uint64_t))
        fatal("checkpoint '%s' is corrupt or truncated (its header does not match its size)", path);
    fseek(f, h->bytes, SEEK_SET);
}

// The vocabulary of a checkpoint against the data's, of the same size: the first token
// whose code point differs, or -1.
static int ckpt_vocab_differs(const CkptHeader* h, const Dataset* ds) {
    for (int t = 0; t < h->vocab; t++)
        if (h->code_points[t] != ds->code_point[t]) return t;
    return -1;
}

// Refuses a checkpoint that does not fit this run, naming every difference.
static void ckpt_check_fit(const CkptHeader* h, const char* path, const Config* c, const Options* o, const Dataset* ds) {
    if (h->model != c->model)
        fatal("checkpoint '%s' is of the %s and this run trains the %s: %s", path, h->model == MODEL_GPT ? "GPT" : "MLP",
              is_gpt(c) ? "GPT" : "MLP", h->model == MODEL_GPT ? "pass --model gpt" : "leave out --model gpt");
    if (h->experts != c->experts) { // which programs train which: train.c both, train_ep mixtures only, the others dense only
        if (h->experts == 0)
            fatal("checkpoint '%s' is of a dense model and this run has --experts %d: resume it without --experts, "
                  "with train.c, train_dp, train_fsdp, train_tp, train_pp or train_3d", path, c->experts);
        fatal("checkpoint '%s' is of a mixture of %d experts and this run's model has %d: resume it with --experts %d, "
              "with train.c or train_ep", path, h->experts, c->experts, h->experts);
    }
    if (is_gpt(c) && h->heads != c->heads)
        fatal("checkpoint '%s' is of a GPT with %d attention heads and this run's has %d: pass --heads %d", path,
              h->heads, c->heads, h->heads);
    if (is_gpt(c) && (h->vocab != c->vocab || h->context != c->context || h->emb != c->emb || h->layers != c->layers ||
                      h->n_params != n_params(c)))
        fatal("checkpoint '%s' is of a different model (vocabulary %d, context %d, width %d, blocks %d); pass the same "
              "--context --emb --layers and data", path, h->vocab, h->context, h->emb, h->layers);
    if (h->vocab != c->vocab || h->context != c->context || h->emb != c->emb || h->hidden != c->hidden ||
        h->layers != c->layers || h->n_params != n_params(c))
        fatal("checkpoint '%s' is of a different model (vocabulary %d, context %d, emb %d, hidden %d, layers %d); "
              "pass the same --context --emb --hidden --layers and data", path, h->vocab, h->context, h->emb,
              h->hidden, h->layers);
    int t = ckpt_vocab_differs(h, ds);
    if (t >= 0) {
        char a[5] = "", b[5] = "";
        a[utf8_encode(h->code_points[t] <= 0x10FFFF ? h->code_points[t] : 0xFFFD, a)] = 0;
        b[utf8_encode(ds->code_point[t], b)] = 0;
        fatal("checkpoint '%s' was trained on data with a different vocabulary (token %d is '%s' there, '%s' in '%s')",
              path, t, a, b, ds->path);
    }
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
// temporary file that ckpt_close renames over `path`. A temporary of checkpoint file F is
// F.tmp-PID, PID the process writing it: one left by a process that no longer runs (killed
// during a save) is removed at the next save.
typedef struct {
    FILE* f;
    uint64_t sum;
    const char* path;
    int keep;        // --keep: the last `keep` checkpoints stay, as path, path.1, ...
    char tmp[4200];
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
// The folder of a path, and the name in it.
static void split_path(const char* path, char* dir, size_t n, const char** name) {
    const char* slash = strrchr(path, '/');
    if (!slash) snprintf(dir, n, "."), *name = path;
    else if (slash == path) snprintf(dir, n, "/"), *name = slash + 1;
    else snprintf(dir, n, "%.*s", (int)(slash - path), path), *name = slash + 1;
}
// Removes the temporaries of checkpoint `path` (path.tmp-PID, path.K.tmp-PID) whose process
// no longer runs on this machine.
static void ckpt_remove_stale(const char* path) {
    char dir[4096], full[8400];
    const char* base;
    split_path(path, dir, sizeof dir, &base);
    DIR* d = opendir(dir);
    if (!d) return;
    size_t nb = strlen(base);
    for (struct dirent* e; (e = readdir(d));) {
        const char* rest = e->d_name + nb;
        if (strncmp(e->d_name, base, nb) != 0 || *rest != '.') continue;
        if (rest[1] >= '0' && rest[1] <= '9') // path.K.tmp-PID
            for (rest++; *rest >= '0' && *rest <= '9'; rest++) {}
        if (strncmp(rest, ".tmp-", 5) != 0 || rest[5] < '1' || rest[5] > '9' || strlen(rest + 5) > 9 ||
            strspn(rest + 5, "0123456789") != strlen(rest + 5))
            continue;
        long pid = atol(rest + 5);
        if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; // it runs (or may)
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        unlink(full);
    }
    closedir(d);
}
static void ckpt_create(CkptWriter* w, const char* path, int keep, const CkptHeader* h) {
    *w = (CkptWriter){.sum = FNV_START, .path = path, .keep = keep};
    ckpt_remove_stale(path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp-%ld", path, (long)getpid());
    w->f = fopen(w->tmp, "wb");
    if (!w->f) ckpt_fail(w, "create");
    ckpt_write(w, h, CKPT_FIXED_BYTES);
    ckpt_write(w, h->code_points, (size_t)h->vocab * sizeof(uint32_t));
}
// A file of this project's that the rotation may rename or replace: a checkpoint (or
// nothing, or an empty file). Anything else stops the save (the check before step 1 refused
// it; something put it there since).
static void ckpt_may_replace(CkptWriter* w, const char* path) {
    int held = path_holds(path, CKPT_SIGNATURE);
    if (held == PATH_FOREIGN || held == PATH_NOT_FILE) {
        errno = EEXIST;
        if (w->f) fclose(w->f);
        w->f = NULL;
        remove(w->tmp);
        fatal("cannot save checkpoint '%s': '%s' is not a checkpoint of this project (it appeared during the run), and "
              "the rotation (--keep) would replace it; the previous checkpoint is untouched", w->path, path);
    }
}
// A copy of `from` as `to`, through to's temporary (where the file system has no hard links).
static int ckpt_copy(const char* from, const char* to) {
    char tmp[4300], buf[1 << 16];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", to, (long)getpid());
    FILE *in = fopen(from, "rb"), *out = in ? fopen(tmp, "wb") : NULL;
    int ok = in && out;
    for (size_t n; ok && (n = fread(buf, 1, sizeof buf, in)) > 0;) ok = fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in) && fflush(out) == 0 && fsync(fileno(out)) == 0;
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = 0;
    ok = ok && rename(tmp, to) == 0;
    if (!ok) remove(tmp);
    return ok ? 0 : -1;
}
// The checksum; the data on the disk (fsync); then the new file in the old one's place, and
// that renaming on the disk too (fsync of the folder). The checkpoint at `path` exists at
// every moment: with --keep K, path.K-2 becomes path.K-1 (replacing the oldest), ...,
// path.1 becomes path.2; then path.1 is made a second name of path (a hard link; a copy
// where the file system has none); then the new file is renamed over path, which replaces
// it in one step. A kill anywhere leaves path whole, old or new.
static void ckpt_close(CkptWriter* w) {
    uint64_t sum = w->sum;
    ckpt_write(w, &sum, sizeof sum);
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0) ckpt_fail(w, "write");
    if (fclose(w->f) != 0) w->f = NULL, ckpt_fail(w, "write");
    w->f = NULL;
    char from[4200], to[4200];
    for (int i = w->keep - 1; i >= 2; i--) {
        snprintf(from, sizeof from, "%s.%d", w->path, i - 1);
        snprintf(to, sizeof to, "%s.%d", w->path, i);
        ckpt_may_replace(w, from), ckpt_may_replace(w, to);
        if (path_holds(from, CKPT_SIGNATURE) == PATH_OURS && rename(from, to) != 0) ckpt_fail(w, "keep the previous");
    }
    ckpt_may_replace(w, w->path);
    if (w->keep >= 2 && path_holds(w->path, CKPT_SIGNATURE) == PATH_OURS) {
        snprintf(to, sizeof to, "%s.1", w->path);
        ckpt_may_replace(w, to);
        if ((unlink(to) != 0 && errno != ENOENT) || (link(w->path, to) != 0 && ckpt_copy(w->path, to) != 0))
            ckpt_fail(w, "keep the previous");
    }
    if (rename(w->tmp, w->path) != 0) ckpt_fail(w, "replace");
    char dir[4096];
    const char* name;
    split_path(w->path, dir, sizeof dir, &name);
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
// parameters at at[0][u] and AdamW's m and v at at[1][u] and at[2][u]. Element e of them is
// element first[u] + e of share[u] (config.h's Share: a tensor-parallel slice, experts; all
// zeros: the whole unit), mapped to train.c's layout by config.h's table_canonical; or, with a
// canonical function, element canonical(ctx, table, u, e). Padding (-1, or past the unit's
// end) stays 0.
typedef struct {
    long n[MAX_LAYERS + 2];
    float* at[3][MAX_LAYERS + 2];
    Share share[MAX_LAYERS + 2];
    long first[MAX_LAYERS + 2];
    long (*canonical)(const void* ctx, const UnitTable* t, int u, long e);
    const void* ctx;
} Holding;

static long holding_index(const Holding* h, const Config* c, const UnitTable* t, int u, long e) {
    if (h->canonical) return h->canonical(h->ctx, t, u, e);
    Share s = h->share[u].t > 0 ? h->share[u] : share_whole(c);
    long k = table_canonical(t, s, h->first[u] + e);
    return k < unit_params(c, u) ? k : -1;
}

// Fills what this process holds: from the checkpoint of --load (its parameters, and its m
// and v with AdamW), or without one, the parameters with the initial values train.c uses
// (m and v stay 0). One unit at a time: no process builds the whole model. The checkpoint
// is read once, front to back, every byte into the checksum and every value checked
// finite, and refused before training if anything is wrong. Returns its step, or 0, and
// sets ckpt_losses to the losses the checkpoint records (or to none, at step 0).
static long holding_load(const Holding* h, const Options* o, const Dataset* ds, const Config* c) {
    const char* path = o->load;
    float* unit = mallocCheck((size_t)max_unit_params(c) * sizeof(float));
    CkptHeader hd = {0};
    FILE* f = NULL;
    uint64_t sum = FNV_START, stored;
    if (path) {
        f = open_input(path, "checkpoint");
        ckpt_read_header(f, path, &hd, &sum);
        ckpt_check_fit(&hd, path, c, o, ds);
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
                unit_init(unit, c, u, o->seed);
            }
            UnitTable table = unit_table(c, u);
            for (long e = 0; e < h->n[u]; e++) {
                long k = holding_index(h, c, &table, u, e);
                h->at[part][u][e] = k < 0 ? 0.0f : unit[k];
            }
        }
    if (path) {
        if (fread(&stored, 1, sizeof stored, f) != sizeof stored) fatal("checkpoint '%s' is truncated", path);
        if (sum != stored) fatal("checkpoint '%s' is corrupt (checksum mismatch)", path);
        fclose(f);
        ckpt_header_free(&hd);
    }
    free(unit);
    ckpt_losses.step = (long)hd.step, ckpt_losses.sum = path ? hd.losses : FNV_START;
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
