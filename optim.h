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

#pragma GCC diagnostic pop
#endif // OPTIM_H
