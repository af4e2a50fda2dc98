/*
 * optim.h: what training keeps beside the parameters (their exact gradient sums, AdamW's m
 * and v), the optimizers, and clipping by the global gradient norm, computed so that
 * pieces held by different ranks combine to the same bits.
 */
#ifndef OPTIM_H
#define OPTIM_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "kernels.h"

// ----------------------------------------------------------------------------
// the training state, and optimizers

// What training keeps for the n parameters a process holds: the parameters, their exact
// gradient sums, and AdamW's m and v (NULL for SGD), all in one layout.
typedef struct {
    long n;
    float* params;
    int64_t* grads;
    float* m;
    float* v;
} State;
static State state_alloc(long n, int adamw) {
    State s = {n, callocCheck(n, sizeof(float)), callocCheck(n, sizeof(int64_t)), NULL, NULL};
    if (adamw) s.m = callocCheck(n, sizeof(float)), s.v = callocCheck(n, sizeof(float));
    return s;
}
static void state_free(State* s) {
    free(s->params);
    free(s->grads);
    free(s->m);
    free(s->v);
}
//
// The exact gradient sums are divided by the global batch size once, here, and rounded to
// float. Every element is updated by the same float operations in every layout (built
// with -ffp-contract=off, so the compiler fuses nothing on its own).

typedef struct {
    int adamw;       // 0: SGD, 1: AdamW
    float lr;
    float weight_decay; // decoupled: p -= lr * wd * p
    float beta1, beta2, eps;
    float clip;      // max global gradient norm; 0 = off
} Optimizer;

// g = float(sum * (2^-40 / batch)): one multiply by a constant that every layout computes alike
ALWAYS_INLINE double grad_factor(long batch) { return (1.0 / FIX_ONE) / (double)batch; }
ALWAYS_INLINE float grad_value(int64_t g, double factor) { return (float)((double)g * factor); }

// One step on n parameters: the whole model, or any contiguous shard of it. Gradient i is
// float(g[i] * factor) * scale: factor is grad_factor(batch), scale the clipping factor.
// `t` is the 1-based step number (for AdamW's bias correction); m and v are unused by SGD.
ALWAYS_INLINE void sgd_update(float* p, const int64_t* g, long i, float lr, float wd, double f, float scale) {
    float gi = grad_value(g[i], f) * scale;
    p[i] -= lr * (gi + wd * p[i]);
}
ALWAYS_INLINE void adamw_update(float* p, const int64_t* g, float* m, float* v, long i, float lr, float wd, double f,
                                float scale, float b1, float b2, float c1, float c2, float eps) {
    float gi = grad_value(g[i], f) * scale;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    float mhat = m[i] / c1, vhat = v[i] / c2;
    p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
}
VECTOR_CLONES static void optimizer_step(const Optimizer* opt, float* p, const int64_t* g, float* m, float* v, long n,
                           double factor, float scale, long t) {
    float lr = opt->lr, wd = opt->weight_decay, b1 = opt->beta1, b2 = opt->beta2, eps = opt->eps;
    float c1 = 1.0f - powf(b1, (float)t), c2 = 1.0f - powf(b2, (float)t);
    if (!opt->adamw && THREADED(n)) {
OMP(omp parallel for)
        for (long i = 0; i < n; i++) sgd_update(p, g, i, lr, wd, factor, scale);
    } else if (!opt->adamw) {
        for (long i = 0; i < n; i++) sgd_update(p, g, i, lr, wd, factor, scale);
    } else if (THREADED(n)) {
OMP(omp parallel for)
        for (long i = 0; i < n; i++) adamw_update(p, g, m, v, i, lr, wd, factor, scale, b1, b2, c1, c2, eps);
    } else {
        for (long i = 0; i < n; i++) adamw_update(p, g, m, v, i, lr, wd, factor, scale, b1, b2, c1, c2, eps);
    }
}

// Clipping by the global gradient norm, computed in two exact steps so that pieces of the
// gradient held by different ranks combine to the same bits: the largest |g| (combined by
// MAX), then the sum of (g / 2^e)^2 with 2^e >= that max, so every term is at most 1,
// rounded to units of 2^-30 and summed as integers (combined by SUM). norm = 2^e sqrt(sum).
#define NORM_ONE 0x1p30
static float grads_maxabs(const int64_t* g, long n, long batch) {
    float m = 0.0f;
    double f = grad_factor(batch);
    for (long i = 0; i < n; i++) {
        float v = fabsf(grad_value(g[i], f));
        m = v > m ? v : m;
    }
    return m;
}
static int64_t grads_sumsq(const int64_t* g, long n, long batch, int e) {
    int64_t s = 0;
    double f = grad_factor(batch);
    for (long i = 0; i < n; i++) {
        double v = ldexp((double)grad_value(g[i], f), -e);
        s += llrint(v * v * NORM_ONE);
    }
    return s;
}

// A run of gradients this process counts in the norm. Across all processes every element
// of the model must be counted exactly once: a layout that holds an element on several
// ranks (a replicated bias) counts it on one of them.
typedef struct {
    const int64_t* g;
    long n;
} GradSpan;
// How a layout combines the norm's pieces across ranks: called with the local maximum
// (combine by MAX, sumsq NULL), then with the local sum of squares (combine by SUM,
// maxabs NULL). NULL when one process holds every gradient.
typedef void (*NormFn)(void* ctx, float* maxabs, int64_t* sumsq);

// The global norm in three pieces, so that a strategy file can show its two all-reduces
// between them (train_3d.c does): the largest gradient, which sets the fixed-point scale
// 2^e; the exact sum of squares at that scale; and the factor from that sum.
static float spans_maxabs(const GradSpan* spans, int n, long batch) {
    float mx = 0.0f;
    for (int i = 0; i < n; i++) {
        float m = grads_maxabs(spans[i].g, spans[i].n, batch);
        mx = m > mx ? m : mx;
    }
    return mx;
}
static int64_t spans_sumsq(const GradSpan* spans, int n, long batch, int e) {
    int64_t sumsq = 0;
    for (int i = 0; i < n; i++) sumsq += grads_sumsq(spans[i].g, spans[i].n, batch, e);
    return sumsq;
}
static float clip_from_sumsq(const Optimizer* opt, int64_t sumsq, int e) {
    float norm = (float)ldexp(sqrt((double)sumsq / NORM_ONE), e);
    return norm > opt->clip ? opt->clip / norm : 1.0f;
}

// The factor every gradient is multiplied by: clip / norm when --clip is set and the
// global norm exceeds it, else 1.
static float clip_factor(const Optimizer* opt, const GradSpan* spans, int n, long batch, NormFn combine, void* ctx) {
    if (opt->clip <= 0.0f) return 1.0f;
    float mx = spans_maxabs(spans, n, batch);
    if (combine) combine(ctx, &mx, NULL);
    int e;
    frexpf(mx, &e); // mx = f * 2^e with 0.5 <= f < 1
    int64_t sumsq = spans_sumsq(spans, n, batch, e);
    if (combine) combine(ctx, NULL, &sumsq);
    return clip_from_sumsq(opt, sumsq, e);
}

// ----------------------------------------------------------------------------
// --reduce: how the pieces of a gradient sum are added
//
// A step's gradient sums arrive in pieces: a microbatch's, a rank's. exact, the default,
// adds the pieces as 64-bit integers, so any split gives train.c's bits. fp32 and bf16 add
// them the way other codebases do, to show what that costs: each piece is rounded to the
// type, and the pieces are added in it, in the order they come (Megatron-LM and FSDP2 add
// in fp32, llm.c in bf16). Within a piece the sums stay exact, so every difference comes
// from how the pieces were added. With one piece (train.c, one microbatch) the whole sum is
// rounded once; that is the run every layout is compared with, and the exact sums kept
// beside the float ones say at which step this run first differs from it.

enum { REDUCE_EXACT, REDUCE_FP32, REDUCE_BF16 };
static const char* const reduce_names[] = {"exact", "fp32", "bf16"};

typedef struct {
    int how;         // --reduce
    long n;
    float* sum;      // fp32, bf16: this step's pieces so far, added in that type
    int64_t* exact;  // the same pieces' exact sum
    uint16_t* wire;  // bf16: the sums as sent, 2 bytes each
    long parted;     // the first step whose sums differed from the whole sum rounded once (0: none)
    long differed;   // how many of that step's n sums differed
} GradSums;

ALWAYS_INLINE float reduce_round(int how, float x) { return how == REDUCE_BF16 ? bf16_round(x) : x; }
// An exact sum g rounded once to fp32 or bf16 (24 or 8 significant bits, ties to even).
// Rounding to a double first, or to a float and then to bf16, could round twice.
static float fix_round(int how, int64_t g) {
    int bits = how == REDUCE_BF16 ? 8 : 24;
    uint64_t a = g < 0 ? -(uint64_t)g : (uint64_t)g;
    int width = a ? 64 - __builtin_clzll(a) : 0;
    if (width > bits) {
        int drop = width - bits;
        uint64_t rest = a & ((1ull << drop) - 1), half = 1ull << (drop - 1);
        a >>= drop;
        a += rest > half || (rest == half && (a & 1));
        a <<= drop;
    }
    float x = (float)((double)a / FIX_ONE); // a has at most bits + 1 significant bits: exact
    return g < 0 ? -x : x;
}

static void grad_sums_init(GradSums* s, int how, long n) {
    *s = (GradSums){.how = how, .n = n};
    if (how == REDUCE_EXACT) return;
    s->sum = callocCheck(n, sizeof(float));
    s->exact = callocCheck(n, sizeof(int64_t));
    if (how == REDUCE_BF16) s->wire = callocCheck(n, sizeof(uint16_t));
}
static void grad_sums_free(GradSums* s) { free(s->sum), free(s->exact), free(s->wire); }
// The bytes held a sum beside the exact gradient sums: 4 a float sum, 8 an exact one, 2 on bf16's wire.
static double reduce_bytes_held(int how) { return how == REDUCE_EXACT ? 0.0 : how == REDUCE_FP32 ? 12.0 : 14.0; }
static double grad_sums_bytes(const GradSums* s) { return reduce_bytes_held(s->how) * (double)s->n; }

// After a piece's backward has added its gradients to g[lo, lo + count): fp32 and bf16 move
// them into the float sums (and the exact ones) and clear them; exact leaves them to grow.
static void grad_sums_add(GradSums* s, int64_t* g, long lo, long count) {
    if (s->how == REDUCE_EXACT) return;
    for (long i = lo; i < lo + count; i++) {
        float piece = fix_round(s->how, g[i]);
        s->sum[i] = reduce_round(s->how, s->sum[i] + piece);
        s->exact[i] += g[i];
        g[i] = 0;
    }
}

// Once every piece is in: the float sums become the gradient sums the optimizer reads. Each
// float here is a multiple of 2^-40, the fixed point's unit, so fix_from converts it exactly.
// grad_sums_convert returns how many differed from the exact sums rounded once, and
// grad_sums_record keeps the first step where any did (train_fsdp.c adds its shards' counts
// between the two).
static long grad_sums_convert(GradSums* s, int64_t* g, long step) {
    long differed = 0;
    for (long i = 0; i < s->n; i++) {
        if (!(fabsf(s->sum[i]) < FIX_SUM_MAX))
            fatal("--reduce %s: gradient sum %g is %s at step %ld: training has diverged; lower --lr or use --clip",
                  reduce_names[s->how], s->sum[i], isfinite(s->sum[i]) ? "too large" : "not finite", step);
        g[i] = fix_from(s->sum[i]);
        differed += g[i] != fix_from(fix_round(s->how, s->exact[i]));
        s->sum[i] = 0.0f, s->exact[i] = 0;
    }
    return differed;
}
static void grad_sums_record(GradSums* s, long step, long differed) {
    if (differed && !s->parted) s->parted = step, s->differed = differed;
}
static void grad_sums_finish(GradSums* s, int64_t* g, long step) {
    if (s->how != REDUCE_EXACT) grad_sums_record(s, step, grad_sums_convert(s, g, step));
}

// The run's last line about its sums, for M microbatches a step on `ranks` ranks (0: train.c)
// and P parameters.
static void grad_sums_print(const GradSums* s, int ranks, int M, long P) {
    if (s->how == REDUCE_EXACT) return;
    const char* how = reduce_names[s->how];
    char pieces[64];
    int at = ranks ? snprintf(pieces, sizeof pieces, "%d ranks x ", ranks) : 0;
    snprintf(pieces + at, sizeof pieces - at, "%d microbatch%s", M, M > 1 ? "es" : "");
    if (!s->parted)
        printf("--reduce %s: %s a step, added in %s: every step's sums equal the whole batch's sum rounded once "
               "to %s, so this run has the bits of ./train --reduce %s (one microbatch)\n", how, pieces, how, how, how);
    else
        printf("--reduce %s: %s a step, added in %s: at step %ld, %ld of %ld sums first differed from the whole "
               "batch's sum rounded once to %s, the sums of ./train --reduce %s (one microbatch), so from step %ld "
               "on this run's losses may differ from that run's\n", how, pieces, how, s->parted, s->differed, P,
               how, how, s->parted + 1);
}

#pragma GCC diagnostic pop
#endif // OPTIM_H
