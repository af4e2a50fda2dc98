/*
 * ckpt.h: checkpoints, one file format for every program, and the code that fills a
 * process's share of the model, from a checkpoint or from the initial values.
 *
 * A checkpoint is a header, then the vocabulary (the code point of each token), then the
 * parameters in train.c's layout, then AdamW's m and v (none for SGD), then with --balance
 * bias every MoE layer's expert biases, then a 64-bit FNV-1a checksum of all preceding bytes. Whatever its
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
// during a save leaves the previous checkpoint whole, and a checkpoint exists at the path
// at every moment (ckpt_close); only over this project's checkpoints (cli.h checks before
// step 1 what is at the path and at the --keep files, ckpt_close again). Read so that
// nothing is silent: the header says which byte order wrote it, and holds the model (its
// kind, sizes and vocabulary) and every flag that decides the result (seed, batch,
// optimizer and its settings, a checksum of the data file); resuming with any of them
// changed is refused, naming each difference, unless --allow-changes says the change is
// deliberate. The data are read once, checked as they are read (the checksum, and that
// every value is finite), before training starts.

#define CKPT_MAGIC "MLPCKPT8"
#define CKPT_MAGIC_V7 "MLPCKPT7" // format 7: format 8 without the shared experts (none; 156 bytes)
#define CKPT_MAGIC_V6 "MLPCKPT6" // format 6: format 7 without the precision (fp32; 152 bytes)
#define CKPT_MAGIC_V5 "MLPCKPT5" // format 5: format 6 without the router's fields (softmax, the loss; 136 bytes)
#define CKPT_MAGIC_V4 "MLPCKPT4" // format 4: format 5 without the microbatches (the header ends at 128 bytes)
#define CKPT_MAGIC_V3 "MLPCKPT3" // format 3: the vocabulary as 256 bytes, no model kind (an MLP), no losses
#define CKPT_MAGIC_V2 "MLPCKPT2" // format 2: format 3 without the mixture-of-experts fields (a dense model)
#define CKPT_BYTE_ORDER 0x01020304u // reads as 0x04030201 on a machine of the other byte order

// Format 8's header, as it starts its file: every byte a field (no padding), then the
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
    int32_t microbatches; // --microbatches of a mixture of experts, which decide its result (0: dense, or format 4 and before)
    int32_t expert_hidden; // the GPT's --expert-hidden (0: its experts are 4C wide, as in every file written before it)
    int32_t router, balance; // --router and --balance (0: softmax and the loss, as in every file before format 6)
    float bias_rate;         // --bias-rate (0 with --balance aux)
    int32_t bias_units;      // the MoE layers whose expert biases follow the floats: L with --balance bias, else 0
    int32_t precision;       // --precision (0: fp32, as in every file before format 7)
    int32_t shared_experts;  // --shared-experts (0: none, as in every file before format 8)
    // in memory only: the vocabulary that follows the header in the file (the code point of
    // each token, so that another dataset is caught), and, for a header read from a file,
    // its format and its bytes (vocabulary included) as they are there
    uint32_t* code_points;
    int format;
    long bytes;
} CkptHeader;
#define CKPT_FIXED_BYTES (offsetof(CkptHeader, shared_experts) + sizeof(int32_t))
_Static_assert(CKPT_FIXED_BYTES == 160, "format 8's header is 160 bytes, with no padding");
#define CKPT_V7_BYTES offsetof(CkptHeader, shared_experts)
#define CKPT_V6_BYTES offsetof(CkptHeader, precision)
#define CKPT_V5_BYTES offsetof(CkptHeader, router)
#define CKPT_V4_BYTES offsetof(CkptHeader, microbatches)

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
    h.microbatches = c->experts > 0 ? o->microbatches : 0; // a dense model's do not change its bits
    h.expert_hidden = c->expert_hidden;
    h.router = c->experts > 0 ? c->router : 0, h.balance = c->experts > 0 ? c->balance : 0;
    h.bias_rate = c->experts > 0 ? c->bias_rate : 0;
    h.bias_units = c->experts > 0 && c->balance == BALANCE_BIAS ? c->layers : 0;
    h.precision = c->precision;
    h.shared_experts = c->shared_experts;
    return h;
}
// The floats after the vocabulary: the parameters, AdamW's m and v, the expert biases.
static long ckpt_floats(const CkptHeader* h) {
    return (h->adamw ? 3 : 1) * (long)h->n_params + (long)h->bias_units * h->experts;
}
static void ckpt_header_free(CkptHeader* h) {
    free(h->code_points);
    h->code_points = NULL;
}

// The first field of a header that no run of this project writes, as "field value: the
// values it takes", or NULL: a checksum vouches for the bytes, not for the writer, and a
// header that passed it with heads 0 or a width of 0 would be answered with advice no one can
// follow ("pass --heads 0"). The ranges are cli.h's; the parameter count is the sizes'.
static const char* ckpt_header_inconsistent(const CkptHeader* h, char* buf, size_t n) {
    int gpt = h->model == MODEL_GPT, X = h->experts;
#define CKPT_FIELD(bad, ...) \
    if (bad) return snprintf(buf, n, __VA_ARGS__), buf
    CKPT_FIELD(h->context < 1 || h->context > 1024, "context %d: it is 1 to 1024", h->context);
    CKPT_FIELD(h->emb < 1 || h->emb > 4096, "%s %d: it is 1 to 4096", gpt ? "width" : "emb", h->emb);
    CKPT_FIELD(gpt && h->hidden != 0, "hidden %d: a GPT's is 0 (its MLP is 4 x its width)", h->hidden);
    CKPT_FIELD(!gpt && (h->hidden < 1 || h->hidden > 16384), "hidden %d: it is 1 to 16384", h->hidden);
    CKPT_FIELD(h->layers < 1 || h->layers > MAX_LAYERS, "layers %d: it is 1 to %d", h->layers, MAX_LAYERS);
    CKPT_FIELD(gpt && (h->heads < 1 || h->emb % h->heads != 0), "heads %d: a GPT has 1 or more, dividing its width %d",
               h->heads, h->emb);
    CKPT_FIELD(!gpt && h->heads != 0, "heads %d: an MLP has none", h->heads);
    CKPT_FIELD(X > 0 && (h->top_k < 1 || h->top_k > MAX_TOP_K || h->top_k > X), "top-k %d: it is 1 to 8, at most its %d experts",
               h->top_k, X);
    CKPT_FIELD(X > 0 && !(h->capacity > 0 && h->capacity <= 1e6f), "capacity %g: it is above 0, at most 1e6", h->capacity);
    CKPT_FIELD(X > 0 && !(h->aux_loss >= 0 && h->aux_loss <= 1), "aux loss %g: it is 0 to 1", h->aux_loss);
    CKPT_FIELD(h->balance == BALANCE_BIAS && (h->aux_loss != 0 || !(h->bias_rate > 0 && h->bias_rate <= 1)),
               "bias rate %g, aux loss %g: with --balance bias the rate is above 0, at most 1, and no loss",
               h->bias_rate, h->aux_loss);
    CKPT_FIELD(h->balance != BALANCE_BIAS && h->bias_rate != 0, "bias rate %g: without --balance bias it is 0", h->bias_rate);
    CKPT_FIELD(h->batch < 1 || h->batch > 65536, "batch %d: it is 1 to 65536", h->batch);
    CKPT_FIELD(!(h->lr > 0 && h->lr <= 100), "lr %g: it is above 0, at most 100", h->lr);
    CKPT_FIELD(!(h->weight_decay >= 0 && h->weight_decay <= 10), "weight decay %g: it is 0 to 10", h->weight_decay);
    CKPT_FIELD(!(h->clip >= 0 && h->clip <= 1e6f), "clip %g: it is 0 to 1e6", h->clip);
    CKPT_FIELD(!(h->beta1 >= 0 && h->beta1 < 1 && h->beta2 >= 0 && h->beta2 < 1 && h->eps > 0 && h->eps < 1),
               "AdamW's betas %g and %g, eps %g: each is 0 to 1", h->beta1, h->beta2, h->eps);
    Config c = {.model = h->model, .heads = h->heads, .vocab = h->vocab, .context = h->context, .emb = h->emb,
                .hidden = h->hidden, .layers = h->layers, .experts = X, .top_k = h->top_k,
                .expert_hidden = h->expert_hidden, .shared_experts = h->shared_experts};
    CKPT_FIELD(h->n_params != n_params(&c), "%lld parameters: its sizes make %ld", (long long)h->n_params, n_params(&c));
#undef CKPT_FIELD
    return NULL;
}

// A token of a checkpoint's vocabulary that no data file gives, as "token t is ...", or
// NULL. Every format: a Unicode character (not a UTF-16 surrogate, not past U+10FFFF), so
// that messages print it as UTF-8. Format 4, written from data.h's vocabulary: token 0 is
// '.', then code points of text (no control character) in increasing order.
static const char* ckpt_vocab_invalid(const CkptHeader* h, char* buf, size_t n) {
    for (int t = 0; t < h->vocab; t++) {
        uint32_t cp = h->code_points[t];
        const char* why = cp > 0x10FFFF ? "past U+10FFFF, the last code point of Unicode"
                        : cp >= 0xD800 && cp <= 0xDFFF ? "a UTF-16 surrogate, not a character"
                        : h->format < 4 ? NULL
                        : t == 0 ? (cp != '.' ? "not '.', the boundary every vocabulary begins with" : NULL)
                        : cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0) ? "a control character, which no data file holds"
                        : t > 1 && cp <= h->code_points[t - 1] ? "out of order (a vocabulary's code points increase)"
                                                               : NULL;
        if (why) return snprintf(buf, n, "token %d is U+%04X, %s", t, cp, why), buf;
    }
    return NULL;
}

// Reads and checks a header: this project's, this byte order, fields that a run of this
// project writes, sizes that fit the file; adds its bytes, as they are in the file, to the
// checksum *sum. A header of format 2 to 7 reads as format 8's: no shared experts; of format
// 2 to 6, its precision fp32; of format
// 2 to 5, its router the softmax with the loss; of format 2, 3 or 4, its microbatches 0
// (unknown); of format 2 or 3, an MLP, its vocabulary's bytes the code points (U+0000..U+00FF),
// the losses unknown; of format 2, a dense model (experts 0). Returns 0; or 1 if the file is
// not a checkpoint at all, 2 if it is one that cannot be used (another format or byte order,
// corrupt, cut short), and why, a phrase that follows the file's name. The caller frees the vocabulary (ckpt_header_free).
static int ckpt_parse_header(FILE* f, CkptHeader* h, uint64_t* sum, char* why, size_t n) {
    memset(h, 0, sizeof *h);
#define CKPT_BAD(code, ...) \
    do { snprintf(why, n, __VA_ARGS__); ckpt_header_free(h); return code; } while (0)
    char magic[8], detail[200];
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "MLPCKPT", 7) != 0)
        CKPT_BAD(1, "is not a checkpoint of this project (bad header)");
    int format = magic[7] - '0';
    if (format < 2 || format > 8)
        CKPT_BAD(2, "has format %.8s, this program reads %s, %s, %s, %s, %s, %s and %s: save it again with the "
                 "program that wrote it", magic, CKPT_MAGIC_V2, CKPT_MAGIC_V3, CKPT_MAGIC_V4, CKPT_MAGIC_V5,
                 CKPT_MAGIC_V6, CKPT_MAGIC_V7, CKPT_MAGIC);
    // format 7: the shared experts stay 0; format 6: the precision too (fp32); format 5: the
    // router's fields too (softmax, the loss);
    // format 4: the microbatches too, unknown
    size_t fixed = format == 8   ? CKPT_FIXED_BYTES
                   : format == 7 ? CKPT_V7_BYTES
                   : format == 6 ? CKPT_V6_BYTES
                   : format == 5 ? CKPT_V5_BYTES
                                 : CKPT_V4_BYTES;
    if (format >= 4) {
        memcpy(h->magic, magic, 8);
        if (fread((char*)h + 8, 1, fixed - 8, f) != fixed - 8)
            CKPT_BAD(1, "is not a checkpoint of this project (bad header)");
        h->code_points = NULL; // (the read stopped before it)
        *sum = fnv1a(*sum, h, fixed);
    } else {
        CkptHeaderV3 old;
        memset(&old, 0, sizeof old);
        memcpy(old.magic, magic, 8);
        size_t bytes = format == 2 ? CKPT_V2_BYTES : sizeof old;
        if (fread((char*)&old + 8, 1, bytes - 8, f) != bytes - 8) CKPT_BAD(1, "is not a checkpoint of this project (bad header)");
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
        CKPT_BAD(2, "was written on a machine of the other byte order; this program reads its own only");
    if (h->vocab < 1 || h->vocab > (format >= 4 ? DATA_MAX_VOCAB : 256))
        CKPT_BAD(2, "is corrupt (a vocabulary of %d tokens)", h->vocab);
    if (format >= 4) { // the vocabulary follows
        h->code_points = mallocCheck((size_t)h->vocab * sizeof(uint32_t));
        if (fread(h->code_points, sizeof(uint32_t), (size_t)h->vocab, f) != (size_t)h->vocab) CKPT_BAD(2, "is truncated");
        *sum = fnv1a(*sum, h->code_points, (size_t)h->vocab * sizeof(uint32_t));
        h->bytes = (long)fixed + h->vocab * (long)sizeof(uint32_t);
    }
    // Each field in its range before the size is computed from them; the message names the field.
#define CKPT_RANGE(bad, ...) \
    do { if (bad) { snprintf(detail, sizeof detail, __VA_ARGS__); \
         CKPT_BAD(2, "is corrupt: its header is inconsistent (%s), which no run writes", detail); } } while (0)
    CKPT_RANGE(h->n_params <= 0 || h->n_params > (1L << 31), "%lld parameters: it is 1 to 2^31", (long long)h->n_params);
    CKPT_RANGE(h->step < 0 || h->step > 1000000000L, "step %lld: it is 0 to 1e9", (long long)h->step);
    CKPT_RANGE(h->adamw != 0 && h->adamw != 1, "adamw %d: it is 0 (sgd) or 1 (adamw)", (int)h->adamw);
    CKPT_RANGE(h->model != MODEL_MLP && h->model != MODEL_GPT, "model %d: it is %d (mlp) or %d (gpt)", (int)h->model,
               MODEL_MLP, MODEL_GPT);
    CKPT_RANGE(h->heads < 0 || h->heads > 4096, "heads %d: it is 0 to 4096", h->heads);
    CKPT_RANGE(h->experts < 0 || h->experts > 1024, "experts %d: it is 0 (dense) to 1024", h->experts);
    CKPT_RANGE(h->experts > 0 && (h->top_k < 1 || h->top_k > MAX_TOP_K), "top_k %d: with experts it is 1 to 8", h->top_k);
    CKPT_RANGE(format >= 5 && h->experts > 0 && (h->microbatches < 1 || h->microbatches > 65536),
               "microbatches %d: with experts it is 1 to 65536", h->microbatches);
    CKPT_RANGE(format >= 5 && h->experts == 0 && h->microbatches != 0, "microbatches %d: a dense model's is 0", h->microbatches);
    CKPT_RANGE(h->router != ROUTER_SOFTMAX && h->router != ROUTER_SIGMOID, "router %d: it is %d (softmax) or %d (sigmoid)",
               (int)h->router, ROUTER_SOFTMAX, ROUTER_SIGMOID);
    CKPT_RANGE(h->balance != BALANCE_AUX && h->balance != BALANCE_BIAS, "balance %d: it is %d (aux) or %d (bias)",
               (int)h->balance, BALANCE_AUX, BALANCE_BIAS);
    CKPT_RANGE(h->experts == 0 && (h->router || h->balance), "router %d, balance %d: a dense model's are 0",
               (int)h->router, (int)h->balance);
    CKPT_RANGE(h->precision != PRECISION_FP32 && h->precision != PRECISION_BF16,
               "precision %d: it is %d (fp32) or %d (bf16)", (int)h->precision, PRECISION_FP32, PRECISION_BF16);
    CKPT_RANGE(h->shared_experts < 0 || h->shared_experts > MAX_SHARED_EXPERTS ||
               (h->experts == 0 && h->shared_experts != 0),
               "shared_experts %d: with experts it is 0 to %d, a dense model's 0", h->shared_experts, MAX_SHARED_EXPERTS);
    CKPT_RANGE(h->bias_units != (h->balance == BALANCE_BIAS ? h->layers : 0),
               "bias_units %d: with --balance bias the layers (%d), else 0", h->bias_units, h->layers);
    CKPT_RANGE(h->expert_hidden < 0 || h->expert_hidden > 65536 ||
               (h->expert_hidden > 0 && (h->model != MODEL_GPT || h->experts == 0)),
               "expert_hidden %d: a GPT's with experts is 0 (4C) to 65536, any other model's 0", h->expert_hidden);
#undef CKPT_RANGE
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size != h->bytes + ckpt_floats(h) * (long)sizeof(float) + (long)sizeof(uint64_t))
        CKPT_BAD(2, "is corrupt or truncated (its header does not match its size)");
    if (ckpt_header_inconsistent(h, detail, sizeof detail))
        CKPT_BAD(2, "is corrupt: its header is inconsistent (%s), which no run writes", detail);
    if (ckpt_vocab_invalid(h, detail, sizeof detail))
        CKPT_BAD(2, "is corrupt: its vocabulary's %s", detail);
#undef CKPT_BAD
    fseek(f, h->bytes, SEEK_SET);
    return 0;
}
static void ckpt_read_header(FILE* f, const char* path, CkptHeader* h, uint64_t* sum) {
    char why[512];
    int bad = ckpt_parse_header(f, h, sum, why, sizeof why);
    if (bad) fatal("%s'%s' %s", bad == 1 ? "" : "checkpoint ", path, why);
}

// Whether a file is a checkpoint of this project, whole (cli.h's recogniser): its header
// read and checked as above, its size the header's, and its checksum that of its bytes.
static const char* ckpt_recognise(FILE* f) {
    char magic[8], why[512];
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "MLPCKPT", 7) != 0) NOT_OURS("does not begin with a checkpoint's header");
    rewind(f);
    CkptHeader h;
    uint64_t sum = FNV_START, stored = 0;
    int bad = ckpt_parse_header(f, &h, &sum, why, sizeof why);
    if (bad == 1) NOT_OURS("is shorter than a checkpoint's header");
    if (bad) NOT_OURS("%s", why);
    ckpt_header_free(&h);
    unsigned char buf[1 << 16];
    for (long left = ckpt_floats(&h) * (long)sizeof(float); left > 0;) {
        size_t k = fread(buf, 1, left < (long)sizeof buf ? (size_t)left : sizeof buf, f);
        if (k == 0) NOT_OURS("is truncated");
        sum = fnv1a(sum, buf, k);
        left -= (long)k;
    }
    if (fread(&stored, 1, sizeof stored, f) != sizeof stored) NOT_OURS("is truncated");
    if (stored != sum) NOT_OURS("is corrupt (checksum mismatch)");
    return NULL;
}

// The vocabulary of a checkpoint against the data's, of the same size: the first token
// whose code point differs, or -1.
static int ckpt_vocab_differs(const CkptHeader* h, const Dataset* ds) {
    for (int t = 0; t < h->vocab; t++)
        if (h->code_points[t] != ds->code_point[t]) return t;
    return -1;
}

// The programs that train the model of a checkpoint, and so resume it: train.c every model;
// a dense model train_dp, train_fsdp, train_tp, train_pp and train_3d, and the GPT's also
// train_cp (positions split: the MLP's rows have none); a mixture of experts train_ep, and
// the GPT's also train_3d (--ep).
static const char* ckpt_programs(const CkptHeader* h) {
    if (h->experts > 0)
        return h->model == MODEL_GPT ? "train.c, train_ep or train_3d (--ep)" : "train.c or train_ep";
    return h->model == MODEL_GPT ? "train.c, train_dp, train_fsdp, train_tp, train_pp, train_cp or train_3d"
                                 : "train.c, train_dp, train_fsdp, train_tp, train_pp or train_3d";
}

// The settings a checkpoint was trained with that this run does not have, as ' --flag old
// (now new);' items in diff (empty if none): what a resume must keep to continue that run.
static size_t ckpt_settings_diff(const CkptHeader* h, const Config* c, const Options* o, const Dataset* ds, char* diff,
                                 size_t cap) {
    size_t n = 0;
    diff[0] = 0;
#define CKPT_DIFF(cond, ...) if (cond) n += (size_t)snprintf(diff + n, n < cap ? cap - n : 0, __VA_ARGS__)
    CKPT_DIFF(h->seed != o->seed, " --seed %llu (now %llu);", (unsigned long long)h->seed, (unsigned long long)o->seed);
    CKPT_DIFF(h->batch != o->batch, " --batch %d (now %d);", h->batch, o->batch);
    CKPT_DIFF(h->lr != o->opt.lr, " --lr %g (now %g);", h->lr, o->opt.lr);
    CKPT_DIFF(h->weight_decay != o->opt.weight_decay, " --weight-decay %g (now %g);", h->weight_decay, o->opt.weight_decay);
    CKPT_DIFF(h->clip != o->opt.clip, " --clip %g (now %g);", h->clip, o->opt.clip);
    CKPT_DIFF(h->beta1 != o->opt.beta1 || h->beta2 != o->opt.beta2 || h->eps != o->opt.eps, " AdamW's betas or eps;");
    CKPT_DIFF(h->data_sum != ds->checksum, " the data file's contents;");
    CKPT_DIFF(h->precision != c->precision, " --precision %s (now %s);", precision_names[h->precision],
              precision_names[c->precision]);
    CKPT_DIFF(c->experts > 0 && h->top_k != c->top_k, " --top-k %d (now %d);", h->top_k, c->top_k);
    CKPT_DIFF(c->experts > 0 && h->capacity != c->capacity, " --capacity %g (now %g);", h->capacity, c->capacity);
    CKPT_DIFF(c->experts > 0 && h->aux_loss != c->aux_loss, " --aux-loss %g (now %g);", h->aux_loss, c->aux_loss);
    CKPT_DIFF(c->experts > 0 && h->router != c->router, " --router %s (now %s);", router_names[h->router],
              router_names[c->router]);
    CKPT_DIFF(c->experts > 0 && h->balance != c->balance, " --balance %s (now %s);", balance_names[h->balance],
              balance_names[c->balance]);
    CKPT_DIFF(c->experts > 0 && h->bias_rate != c->bias_rate, " --bias-rate %g (now %g);", h->bias_rate, c->bias_rate);
    // a dense model's microbatches change nothing (exact sums); an expert's capacity and
    // balancing loss are a microbatch's, so the microbatches decide its result
    CKPT_DIFF(c->experts > 0 && h->microbatches && h->microbatches != o->microbatches, " --microbatches %d (now %d);",
              h->microbatches, o->microbatches);
#undef CKPT_DIFF
    return n;
}

// The settings --allow-changes let this run change (ckpt_settings_diff's items), which the
// configuration's "changed" line names (report.h); empty if none.
static char ckpt_changed[768];

// Refuses a checkpoint that does not fit this run, naming every difference.
static void ckpt_check_fit(const CkptHeader* h, const char* path, const Config* c, const Options* o, const Dataset* ds) {
    if (h->model != c->model)
        fatal("checkpoint '%s' is of the %s and this run trains the %s: %s", path, h->model == MODEL_GPT ? "GPT" : "MLP",
              is_gpt(c) ? "GPT" : "MLP", h->model == MODEL_GPT ? "pass --model gpt" : "leave out --model gpt");
    if (h->experts != c->experts) {
        if (h->experts == 0)
            fatal("checkpoint '%s' is of a dense model and this run has --experts %d: resume it without --experts, "
                  "with %s", path, c->experts, ckpt_programs(h));
        fatal("checkpoint '%s' is of a mixture of %d experts and this run's model has %d: resume it with --experts %d, "
              "with %s", path, h->experts, c->experts, h->experts, ckpt_programs(h));
    }
    if (h->shared_experts != c->shared_experts)
        fatal("checkpoint '%s' is of a mixture with %d shared experts and this run's has %d: pass --shared-experts %d",
              path, h->shared_experts, c->shared_experts, h->shared_experts);
    if (c->experts > 0 && is_gpt(c)) {
        Config hc = *c;
        hc.expert_hidden = h->expert_hidden;
        if (expert_width(&hc) != expert_width(c))
            fatal("checkpoint '%s' is of experts %d wide and this run's are %d: pass --expert-hidden %d", path,
                  expert_width(&hc), expert_width(c), expert_width(&hc));
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
    char diff[768];
    size_t n = ckpt_settings_diff(h, c, o, ds, diff, sizeof diff);
    if (n > 0 && !o->allow_changes)
        fatal("checkpoint '%s' was trained with other settings:%s resuming would not continue that run. Pass the "
              "same flags, or --allow-changes to change them deliberately", path, diff);
    snprintf(ckpt_changed, sizeof ckpt_changed, "%s", diff);
}

// A checkpoint at --save's path, or at a name its rotation renames (FILE.1 .. FILE.K-1), that
// --load would refuse for this run (another model, or other settings, its step aside) is
// another run's result, which this run's saves would destroy: refused before training.
// The --load file itself is this run's.
static void ckpt_check_save_target(const Options* o, const Config* c, const Dataset* ds) {
    for (int k = 0; o->save && k < o->keep; k++) {
        char file[4200], why[512], diff[768] = "";
        if (k == 0) snprintf(file, sizeof file, "%s", o->save);
        else snprintf(file, sizeof file, "%s.%d", o->save, k);
        // cli.h's check of the outputs read each of these whole; here its header is enough
        struct stat st;
        if ((o->load && same_file(file, o->load)) || lstat(file, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0)
            continue;
        FILE* f = fopen(file, "rb");
        CkptHeader h = {0};
        uint64_t sum = FNV_START;
        if (!f || ckpt_parse_header(f, &h, &sum, why, sizeof why)) {
            if (f) fclose(f);
            continue; // it changed since cli.h's check; the save's own checks see to it
        }
        fclose(f);
        const char* other = h.model != c->model ? (h.model == MODEL_GPT ? "of the GPT" : "of the MLP")
                            : h.experts != c->experts ? "of another number of experts"
                            : h.shared_experts != c->shared_experts ? "of another number of shared experts"
                            : (h.vocab != c->vocab || h.context != c->context || h.emb != c->emb || h.hidden != c->hidden ||
                               h.layers != c->layers || (is_gpt(c) && h.heads != c->heads) || h.n_params != n_params(c) ||
                               ckpt_vocab_differs(&h, ds) >= 0) ? "of another model"
                            : h.adamw != o->opt.adamw ? (h.adamw ? "with AdamW's state" : "with SGD's state")
                            : NULL;
        if (!other && ckpt_settings_diff(&h, c, o, ds, diff, sizeof diff) > 0 && !o->allow_changes)
            other = "trained with other settings:";
        if (diff[0]) diff[strlen(diff) - 1] = 0; // the last item's ';'
        ckpt_header_free(&h);
        if (other)
            fatal("--save '%s'%s%s holds another run's checkpoint (step %lld, %s%s), which this run's saves would "
                  "replace: save to another file, or remove it first", o->save, k ? ": its rotation's " : "", k ? file : "",
                  (long long)h.step, other, other[strlen(other) - 1] == ':' ? diff : "");
    }
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
static void ckpt_create(CkptWriter* w, const char* path, int keep, const CkptHeader* h) {
    *w = (CkptWriter){.sum = FNV_START, .path = path, .keep = keep};
    remove_stale_temporaries(path, "MLPCKPT");
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp-%ld", path, (long)getpid());
    w->f = create_new(w->tmp);
    if (!w->f) {
        int err = errno;
        w->tmp[0] = 0; // not this process's file to remove (EEXIST: something there, left alone)
        errno = err, ckpt_fail(w, "create");
    }
    ckpt_write(w, h, CKPT_FIXED_BYTES);
    ckpt_write(w, h->code_points, (size_t)h->vocab * sizeof(uint32_t));
}
// A file at `path` that the save or its rotation (--keep) would replace, and is not a
// checkpoint of this project's (the check before step 1 refused it; something put it there
// since): the save stops, naming what would have replaced it, the save itself at the path or
// the rotation at a path.N, and path_holds' reason (path_why).
static void ckpt_refuse(CkptWriter* w, const char* path) {
    const char* why = path_why;
    if (w->f) fclose(w->f);
    w->f = NULL;
    remove(w->tmp);
    if (!strcmp(path, w->path))
        fatal("cannot save checkpoint '%s': the file there now is not a checkpoint of this project (it %s; it "
              "appeared during the run), and the save would replace it; nothing was written", w->path, why);
    fatal("cannot save checkpoint '%s': '%s' is not a checkpoint of this project (it %s; it appeared during the "
          "run), and the rotation (--keep %d) would replace it; the checkpoint at '%s' is untouched", w->path, path,
          why, w->keep, w->path);
}
// A copy of `from` as `to` (where the file system has no hard links).
static int ckpt_copy(const char* from, const char* to) {
    char buf[1 << 16];
    FILE *in = fopen(from, "rb"), *out = in ? create_new(to) : NULL;
    int ok = in && out;
    for (size_t n; ok && (n = fread(buf, 1, sizeof buf, in)) > 0;) ok = fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in) && fflush(out) == 0 && fsync(fileno(out)) == 0;
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = 0;
    if (!ok && out) remove(to); // (out: this process created it)
    return ok ? 0 : -1;
}
// One step of the rotation: the checkpoint at `from` also becomes `to`, replacing the one
// there. Through a name of this process's own, to.tmp-PID: a second name of from's file (a hard
// link, or a copy), read there, so that what is checked is what moves, then put in place over
// `to` (put_in_place: a file that appeared at `to` is never replaced). `from` keeps its name
// until the next step replaces it.
static void ckpt_keep_previous(CkptWriter* w, const char* from, const char* to) {
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", to, (long)getpid());
    int held = path_holds(from, ckpt_recognise);
    if (path_not_ours(held)) ckpt_refuse(w, from);
    if (held != PATH_OURS) return; // nothing to keep
    if (link(from, tmp) != 0) {
        if (errno == ENOENT) return; // gone since
        if (errno == EEXIST || ckpt_copy(from, tmp) != 0) ckpt_fail(w, "keep the previous"); // (EEXIST: never reuse a name)
    }
    if ((held = path_holds(tmp, ckpt_recognise)) != PATH_OURS) { // from's file was replaced in between
        remove(tmp);
        if (path_not_ours(held)) ckpt_refuse(w, from);
        return;
    }
    if ((held = put_in_place(tmp, to, ckpt_recognise)) < 0) {
        int err = errno;
        remove(tmp), errno = err, ckpt_fail(w, "keep the previous");
    }
    if (path_not_ours(held)) ckpt_refuse(w, to);
}
// The checksum; the data on the disk (fsync); then the new file in the old one's place, and
// that renaming on the disk too (fsync of the folder). The checkpoint at `path` exists at
// every moment: with --keep K, path.K-2 becomes path.K-1 (replacing the oldest), ...,
// path.1 becomes path.2, path becomes path.1; then the new file replaces path in one step.
// A kill anywhere leaves path whole, old or new. Every replacement is put_in_place's: a file
// of the user's that appears at any of these names during the run stops the save, untouched.
static void ckpt_close(CkptWriter* w) {
    uint64_t sum = w->sum;
    ckpt_write(w, &sum, sizeof sum);
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0) ckpt_fail(w, "write");
    if (fclose(w->f) != 0) w->f = NULL, ckpt_fail(w, "write");
    w->f = NULL;
    char from[4200], to[4200];
    for (int i = w->keep - 1; i >= 1; i--) {
        if (i == 1) snprintf(from, sizeof from, "%s", w->path);
        else snprintf(from, sizeof from, "%s.%d", w->path, i - 1);
        snprintf(to, sizeof to, "%s.%d", w->path, i);
        ckpt_keep_previous(w, from, to);
    }
    int held = put_in_place(w->tmp, w->path, ckpt_recognise);
    if (held < 0) ckpt_fail(w, "replace");
    if (path_not_ours(held)) ckpt_refuse(w, w->path);
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
    for (int u = 1; u <= h.bias_units; u++) ckpt_write(&w, moe_bias_of(c, u), (size_t)c->experts * sizeof(float));
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
    ckpt_check_save_target(o, c, ds);
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
    if (path && hd.bias_units > 0) { // the expert biases of --balance bias: every process keeps every layer's
        float* bias = mallocCheck((size_t)hd.experts * sizeof(float));
        for (int u = 1; u <= hd.bias_units; u++) {
            if (fread(bias, sizeof(float), (size_t)hd.experts, f) != (size_t)hd.experts)
                fatal("checkpoint '%s' is truncated", path);
            sum = fnv1a(sum, bias, (size_t)hd.experts * sizeof(float));
            for (int x = 0; x < hd.experts; x++)
                if (!isfinite(bias[x])) fatal("checkpoint '%s' holds an expert bias that is not finite (layer %d)", path, u);
            if (c->balance == BALANCE_BIAS) memcpy(moe_bias_of(c, u), bias, (size_t)hd.experts * sizeof(float));
        }
        free(bias);
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
