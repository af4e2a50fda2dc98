/*
 * train_fsdp.c: fully sharded data parallel (ZeRO-3). Data parallel as in train_dp.c: every
 * rank takes a share of each batch's rows. But no rank holds the whole model: each unit (the
 * embedding, each linear layer with its bias) is cut into N shards, one a rank. A rank
 * all-gathers a unit's parameters just before the unit computes and drops them after; after
 * the unit's backward it reduce-scatters the unit's gradient, so that it receives the sum
 * over every rank's rows for its own shard; the optimizer then updates that shard alone.
 * It prints exactly what train.c prints for the same flags.
 *
 *   ZeRO-3 on 2 ranks, one unit u of 32 parameters
 *
 *               rank 0 holds u[0..15]             rank 1 holds u[16..31]
 *   forward     all-gather u  <---------------->  all-gather u         compute, drop u
 *   backward    all-gather u  <---------------->  all-gather u         compute u's gradient
 *               reduce-scatter u's gradient <-->  each keeps its shard's sum
 *   step        update u[0..15]                   update u[16..31]
 *
 *   make train_fsdp && mpirun -n 2 ./train_fsdp          # --zero 3 (the default)
 *   mpirun -n 4 --oversubscribe ./train_fsdp --zero 1 --optimizer adamw
 *   mpirun -n 2 ./train_fsdp --prefetch                  # gather the next unit early
 *
 * Compare with ./train: the same losses, names and final checkpoint, for every stage and N.
 *
 * The first read: what a rank holds; ZeRO-3's gather, reduce-scatter and step; one training
 * step. Then one chapter each: ZeRO-1 and -2 (--zero 1, 2); --prefetch; microbatches;
 * --reduce fp32 and bf16; the formulas. Then what only serves: sizes and buffers, checkpoints,
 * train_3d.c's plug-in points, the report, options and main.
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// what a rank holds: its shard of every unit
//
// Unit u is a flat block of size[u] parameters, cut into N shards of shard[u] =
// ceil(size[u] / N) elements: rank r's shard is elements [r * shard[u], (r + 1) * shard[u]).
// The last shard ends in padding: zeros from calloc that no unit computes with, which fsdp_range
// leaves out of the optimizer step, the checkpoints and the clipping norm. Gradients are
// exact integer sums (kernels.h), so their reduce-scatter is exact too.

typedef struct Fsdp Fsdp;

// What the ZeRO stage does at each point of a step; the step calls f->fn.name(f, ...).
// fsdp_init chooses them once: ZeRO-3's are in the next section, ZeRO-1's, ZeRO-2's and --prefetch's in their chapters.
typedef struct {
    void (*zero_grads)(Fsdp* f);                           // before backward
    const float* (*unit_params)(Fsdp* f, int u, int next); // before unit u computes
    int64_t* (*unit_grads)(Fsdp* f, int u);                // where unit u's backward adds
    void (*reduce_unit_grads)(Fsdp* f, int u);             // after unit u's backward
    void (*reduce_grads)(Fsdp* f);                         // after the whole backward
    void (*gather_params)(Fsdp* f);                        // after the optimizer step
} FsdpStage;

// Scratch for the one unit in use: not part of the model.
typedef struct {
    float* gathered[2];            // its parameters, all-gathered (the second: --prefetch's)
    int64_t* grad;                 // its gradient over this rank's rows, before the reduce-scatter
    MPI_Request pending;           // --prefetch: the all-gather in flight,
    int pending_unit, pending_buf; // of unit pending_unit (-1: none) into gathered[pending_buf]
} FsdpUnit;

struct Fsdp {
    int stage;                  // ZeRO stage: 1, 2 or 3
    int prefetch;               // --prefetch (stage 3)
    Group* dp;                  // the N ranks that share the shards
    int n_units;
    long size[MAX_LAYERS + 2];  // unit u's parameters
    long shard[MAX_LAYERS + 2]; // one shard of unit u: ceil(size[u] / N) elements
    // What this rank holds of unit u: its shard of the parameters, of the gradient sums over
    // every rank's rows, and of AdamW's m and v (NULL with SGD).
    float* params[MAX_LAYERS + 2];
    int64_t* grads[MAX_LAYERS + 2];
    float *m[MAX_LAYERS + 2], *v[MAX_LAYERS + 2];
    FsdpUnit unit;              // scratch
    FsdpStage fn;               // the stage's functions
    // ZeRO-1 and -2 only (their chapter): the whole model, unit u at whole_off[u], padded to
    // N shards. There params[u], and at ZeRO-1 grads[u], point to this rank's shard inside.
    float* whole_params;
    int64_t* whole_grads;
    long whole_off[MAX_LAYERS + 3];
    void* alloc[4];                            // for fsdp_free
    long bytes_params, bytes_grads, bytes_opt; // for the report: what this rank holds, scratch included
    // --reduce fp32, bf16 only (their chapter): the float sums of this rank's gradient sums
    // (its shards; ZeRO-1: the whole), and one unit's gradient rounded, as it is sent
    GradSums sums;
    void* rounded;
};

// ----------------------------------------------------------------------------
// ZeRO-3: gather a unit, compute, drop it; reduce-scatter its gradient; update the shard

static void zero3_zero_grads(Fsdp* f) {
    for (int u = 0; u < f->n_units; u++) fix_zero(f->grads[u], f->shard[u]);
}
// Before unit u computes, in forward and again in backward: its whole parameters,
// all-gathered from every rank's shard into one scratch buffer. A rank holds one unit whole
// at a time to save memory, so backward gathers each unit again instead of keeping
// forward's. `next` is the unit --prefetch gathers early; -1 or n_units means none.
static const float* zero3_unit_params(Fsdp* f, int u, int next) {
    (void)next;
    group_allgather(f->dp, f->params[u], f->unit.gathered[0], f->shard[u], MPI_FLOAT);
    return f->unit.gathered[0];
}
// Unit u's backward adds its gradient over this rank's rows into the scratch, zeroed here.
static int64_t* zero3_unit_grads(Fsdp* f, int u) {
    fix_zero(f->unit.grad, f->dp->size * f->shard[u]);
    return f->unit.grad;
}
// After unit u's backward. group_reduce_scatter(group, buf, shard, type, op, into): buf holds
// N shards of this rank's gradient; the sum over the ranks of this rank's shard is added to
// `into`, grads[u], so that several passes in one step (microbatches) accumulate; buf is left
// with partial sums. The destination comes last, unlike group_allgather(group, send, recv, ...).
static void zero3_reduce_unit_grads(Fsdp* f, int u) {
    group_reduce_scatter(f->dp, f->unit.grad, f->shard[u], MPI_INT64_T, MPI_SUM, f->grads[u]);
}
static void nothing(Fsdp* f) { (void)f; }

static const FsdpStage zero3 = {
    .zero_grads = zero3_zero_grads,
    .unit_params = zero3_unit_params,
    .unit_grads = zero3_unit_grads,
    .reduce_unit_grads = zero3_reduce_unit_grads,
    .reduce_grads = nothing,
    .gather_params = nothing,
};

// This rank's elements of unit u, [*lo, *hi): its shard without the padding (maybe empty).
static void fsdp_range(const Fsdp* f, int u, long* lo, long* hi) {
    *lo = f->dp->rank * f->shard[u];
    long end = *lo + f->shard[u];
    if (end > f->size[u]) end = f->size[u];
    if (end < *lo) end = *lo;
    *hi = end;
}
// The optimizer step: each rank updates its shards alone, since their sums are over every
// rank's rows. At ZeRO-3 nothing follows; ZeRO-1 and -2 gather every unit whole again.
static void fsdp_step(Fsdp* f, const Optimizer* opt, double factor, float scale, long t) {
    for (int u = 0; u < f->n_units; u++) {
        long lo, hi;
        fsdp_range(f, u, &lo, &hi);
        optimizer_step(opt, f->params[u], f->grads[u], f->m[u], f->v[u], hi - lo, factor, scale, t);
    }
    f->fn.gather_params(f);
}

#ifndef TRAIN_3D // the program's step; train_3d.c has its own

// ----------------------------------------------------------------------------
// one training step: train.c's, unit by unit through the stage's functions

typedef struct {
    Config cfg;
    Dataset ds;          // the data
    Fsdp f;              // parameters, gradients and optimizer state, sharded
    Work work;           // activations and scratch of the passes
    Group dp;            // every rank
    int stage, prefetch; // --zero, --prefetch
    int reduce;          // --reduce (optim.h)
    int M;               // --microbatches
    Holding mine;        // what this rank holds of the model, for checkpoints
    GradSpan spans[MAX_LAYERS + 2]; // the gradients this rank counts in the clipping norm
    int n_spans;
} Run;

// The forward pass over this rank's R rows of `rows` from `first`, unit by unit, each unit's
// parameters gathered first; the loss sum over the rows' targets, and probs if asked.
static int64_t forward(void* ctx, const Rows* rows, long first, int R, long rows_total, float* probs) {
    Run* r = ctx;
    const Config* c = &r->cfg;
    Acts* a = work_load(&r->work, rows, first, R, c->context);
    for (int u = 0; u < n_units(c); u++)
        unit_forward(c, u, r->f.fn.unit_params(&r->f, u, u + 1), a, &r->work.scratch, R, rows_total, &r->work.ws);
    if (probs) model_probs(c, rows, a->out[c->layers + 1], R, probs);
    return a->loss;
}
// train.c's model_backward: each unit gathered again (the next: u - 1, -1 after the first),
// its gradient reduce-scattered at once.
static void backward(Run* r, int R, long B) {
    const Config* c = &r->cfg;
    for (int u = n_units(c) - 1; u >= 0; u--) {
        const float* w = r->f.fn.unit_params(&r->f, u, u - 1);
        unit_recompute(c, u, w, &r->work.acts, &r->work.scratch, R, &r->work.ws); // --recompute
        unit_backward(c, u, w, r->f.fn.unit_grads(&r->f, u), &r->work.acts, &r->work.scratch, R, B, &r->work.ws);
        r->f.fn.reduce_unit_grads(&r->f, u);
        scratch_step_down(&r->work.scratch);
    }
}

// The gradients this rank counts in the clipping norm, set once in main: its shards, the
// padding left out.
static int fsdp_grad_spans(const Fsdp* f, GradSpan* spans) {
    for (int u = 0; u < f->n_units; u++) {
        long lo, hi;
        fsdp_range(f, u, &lo, &hi);
        spans[u] = (GradSpan){f->grads[u], hi - lo};
    }
    return f->n_units;
}

// One step on the whole batch of B rows, of which this rank takes its share; the mean loss.
static double train_step(Run* r, const Options* o, long step) {
    int B = o->batch, M = r->M;
    Rows batch = training_rows(&r->ds, o->seed, step, 0);
    long n = dataset_batch_targets(&r->ds, o->seed, step, B); // of the whole batch, on every rank
    int64_t loss = 0;
    r->f.fn.zero_grads(&r->f);
    for (int m = 0; m < M; m++) { // M = 1 unless --microbatches (their chapter)
        long first;
        int Rm = microbatch_rows(B, M, m, r->dp.size, r->dp.rank, &first); // this rank's rows of it
        loss += forward(r, &batch, first, Rm, B, NULL);
        backward(r, Rm, B);
    }
    r->f.fn.reduce_grads(&r->f);                             // ZeRO-1's all-reduce; nothing at ZeRO-3
    group_allreduce(&r->dp, &loss, 1, MPI_INT64_T, MPI_SUM); // the loss sum over all B rows
    // --clip (optim.h's clip_factor): the largest |gradient| over this rank's spans, combined
    // over the ranks by MAX; then the squares as exact integers, combined by SUM (group_norm).
    // The spans are the ranks' disjoint shards, each element counted once: train.c's norm.
    float scale = clip_factor(&o->opt, r->spans, r->n_spans, n, group_norm, &r->dp);
    fsdp_step(&r->f, &o->opt, grad_factor(n), scale, step);
    return fix_to(loss) / n;
}

#endif // TRAIN_3D

// ============================================================================
// The first read ends here. Then the chapters, and last what only serves.

// ----------------------------------------------------------------------------
// ZeRO-1 and -2: every rank holds every unit's parameters whole
//
// The two lighter stages gather nothing before a unit computes. ZeRO-2 shards the gradient
// sums and AdamW's state, reduce-scattering as ZeRO-3 does; ZeRO-1 shards AdamW's state
// alone, and all-reduces the whole gradient after backward. Both all-gather every unit whole
// after the optimizer step.
//
//   what each rank holds    parameters            gradient sums         m, v
//   stage 1                 whole                 whole                 its shard
//   stage 2                 whole                 its shard + one unit  its shard
//   stage 3                 its shard + one unit  its shard + one unit  its shard
//
//   what it sends, when        stage 1          stage 2              stage 3
//   before unit u computes     -                -                    all-gather u
//   after unit u's backward    -                reduce-scatter u's   reduce-scatter u's
//   after the whole backward   all-reduce all   -                    -
//   after the optimizer step   all-gather all   all-gather all       -

static const float* whole_unit_params(Fsdp* f, int u, int next) {
    (void)next;
    return f->whole_params + f->whole_off[u];
}
// Every unit from its shards, after each optimizer step and after loading.
static void allgather_whole_params(Fsdp* f) {
    for (int u = 0; u < f->n_units; u++)
        group_allgather(f->dp, f->params[u], f->whole_params + f->whole_off[u], f->shard[u], MPI_FLOAT);
}
static void zero1_zero_grads(Fsdp* f) { fix_zero(f->whole_grads, f->whole_off[f->n_units]); }
static int64_t* zero1_unit_grads(Fsdp* f, int u) { return f->whole_grads + f->whole_off[u]; }
static void zero1_reduce_unit_grads(Fsdp* f, int u) { (void)f, (void)u; }
static void zero1_reduce_grads(Fsdp* f) {
    group_allreduce(f->dp, f->whole_grads, f->whole_off[f->n_units], MPI_INT64_T, MPI_SUM);
}

static const FsdpStage zero1 = {
    .zero_grads = zero1_zero_grads,
    .unit_params = whole_unit_params,
    .unit_grads = zero1_unit_grads,
    .reduce_unit_grads = zero1_reduce_unit_grads,
    .reduce_grads = zero1_reduce_grads,
    .gather_params = allgather_whole_params,
};
static const FsdpStage zero2 = {
    .zero_grads = zero3_zero_grads,
    .unit_params = whole_unit_params,
    .unit_grads = zero3_unit_grads,
    .reduce_unit_grads = zero3_reduce_unit_grads,
    .reduce_grads = nothing,
    .gather_params = allgather_whole_params,
};

// ----------------------------------------------------------------------------
// --prefetch (stage 3): the next unit's all-gather runs while this one computes
//
// While unit u computes from one scratch buffer, the next unit's non-blocking all-gather
// fills the other; the next call waits for it instead of gathering. fsdp_init puts this
// function in ZeRO-3's place.

static const float* prefetched_unit_params(Fsdp* f, int u, int next) {
    FsdpUnit* s = &f->unit;
    int b = 0; // the buffer unit u is in
    if (s->pending_unit == u) { // started by the call before: wait for it to arrive
        MPI_Wait(&s->pending, MPI_STATUS_IGNORE);
        b = s->pending_buf;
    } else { // nothing started for u: wait for any other unit's (train_3d.c's schedules), gather u here
        if (s->pending_unit >= 0) MPI_Wait(&s->pending, MPI_STATUS_IGNORE);
        group_allgather(f->dp, f->params[u], s->gathered[0], f->shard[u], MPI_FLOAT);
    }
    s->pending_unit = -1;
    if (next >= 0 && next < f->n_units) { // the next unit, into the other buffer
        group_iallgather(f->dp, f->params[next], s->gathered[1 - b], f->shard[next], MPI_FLOAT, &s->pending);
        s->pending_unit = next, s->pending_buf = 1 - b;
    }
    return s->gathered[b];
}

// ----------------------------------------------------------------------------
// microbatches: a step's rows in M passes, their gradients added
//
// train_step's loop runs forward and backward once a microbatch, so that a pass holds the
// activations of fewer rows. Every backward adds into the gradient sums, zeroed once a step,
// so the step is that of one pass over all the rows. Each pass, ZeRO-2 and -3 reduce-scatter
// every unit's gradient, and ZeRO-3 gathers every unit twice. Once a step, ZeRO-1 all-reduces
// the gradients, and ZeRO-1 and -2 all-gather the parameters. train_3d.c's pipeline schedules use these same functions.

// ----------------------------------------------------------------------------
// --reduce fp32, bf16: the gradients reduced as floats, as FSDP2's reduce_dtype
//
// ZeRO-2 and -3 round each pass's unit gradient to fp32 or bf16 and reduce-scatter it in that
// type; each rank adds the passes' sums of its shard in it. ZeRO-1 adds its passes in the float
// type on each rank and all-reduces once a step, as train_dp.c does. The exact sums go beside,
// not counted as sent: they only say from which step the run parts from ./train --reduce HOW
// (optim.h). fsdp_reduce_init puts these functions in the stage's place.

// ZeRO-2 and -3, after unit u's backward
static void float_reduce_unit_grads(Fsdp* f, int u) {
    GradSums* s = &f->sums;
    long n = f->dp->size * f->shard[u];
    long at = f->grads[u] - f->grads[0]; // unit u's shard in the sums: the shards are one array here
    for (long i = 0; i < n; i++) {
        float x = fix_round(s->how, f->unit.grad[i]);
        if (s->how == REDUCE_BF16) ((uint16_t*)f->rounded)[i] = bf16_bits(x);
        else ((float*)f->rounded)[i] = x;
    }
    if (s->how == REDUCE_BF16) group_reduce_scatter(f->dp, f->rounded, f->shard[u], bf16_type, MPI_SUM, s->wire + at);
    else group_reduce_scatter(f->dp, f->rounded, f->shard[u], MPI_FLOAT, MPI_SUM, s->sum + at);
    uncounted_reduce_scatter(f->dp, f->unit.grad, f->shard[u], s->exact + at);
}
// ZeRO-2 and -3, after the whole backward: the float sums of the shards become the gradient
// sums; the count of those that differ is the whole model's, over every rank's shard.
static void float_reduce_grads(Fsdp* f) {
    GradSums* s = &f->sums;
    bf16_unwire(s);
    long differed = grad_sums_convert(s, f->grads[0], current_step);
    MPI_Allreduce(MPI_IN_PLACE, &differed, 1, MPI_LONG, MPI_SUM, f->dp->comm);
    grad_sums_record(s, current_step, differed);
}
// ZeRO-1: each pass's unit gradient into the float sums, then one all-reduce a step
static void float_fold_unit_grads(Fsdp* f, int u) {
    grad_sums_add(&f->sums, f->whole_grads, f->whole_off[u], f->whole_off[u + 1] - f->whole_off[u]);
}
static void float_allreduce_grads(Fsdp* f) {
    GradSend w = grads_to_send(&f->sums, f->whole_grads, 0, f->sums.n);
    group_allreduce(f->dp, w.buf, f->sums.n, w.type, MPI_SUM);
    grads_received(&f->sums, f->dp, f->whole_grads, current_step);
}

static void fsdp_reduce_init(Fsdp* f, int how) {
    long n_whole = f->whole_off[f->n_units], n_shard = 0, biggest = 0;
    for (int u = 0; u < f->n_units; u++) {
        n_shard += f->shard[u];
        if (f->whole_off[u + 1] - f->whole_off[u] > biggest) biggest = f->whole_off[u + 1] - f->whole_off[u];
    }
    grad_sums_init(&f->sums, how, f->stage == 1 ? n_whole : n_shard);
    f->bytes_grads += (long)grad_sums_bytes(&f->sums);
    if (f->stage == 1) {
        f->fn.reduce_unit_grads = float_fold_unit_grads;
        f->fn.reduce_grads = float_allreduce_grads;
        return;
    }
    long bytes = how == REDUCE_BF16 ? 2 : 4;
    f->rounded = mallocCheck((size_t)(biggest * bytes));
    f->bytes_grads += biggest * bytes;
    f->fn.reduce_unit_grads = float_reduce_unit_grads;
    f->fn.reduce_grads = float_reduce_grads;
}

// ----------------------------------------------------------------------------
// the formulas: what a rank sends and holds per step, predicted (for the report)
//
// Two counts of parameters, for N ranks: P, the model's (18,635 by default, docs/model.md);
// and P_N, each unit padded to N equal shards (18,636 for N = 2: 1,755 becomes 1,756).
// U is the largest unit's parameters, unpadded. half = (N-1)/N: the share of its buffer a
// ring reduce-scatter or all-gather sends (an all-reduce sends 2 half). 8 B a gradient sum
// (int64), 4 B a parameter, adam = 8 B for AdamW's m and v (else 0):
//
//   stage  sent, for M passes a step            memory (+ a microbatch's activations)
//   1      2 half x 8 P_N + half x 4 P_N        4P + 8P + adam P/N
//   2      M half x 8 P_N + half x 4 P_N        4P + 8P/N + 8U + adam P/N
//   3      M (half x 8 P_N + 2 half x 4 P_N)    4P/N + 4U + 8P/N + 8U + adam P/N
//
// 8U: one unit's gradient before its reduce-scatter; 4U: one unit's parameters gathered (8U
// with --prefetch). Every stage also all-reduces the loss sum (2 half x 8 B), and --clip the
// norm's two pieces. The default, ZeRO-3, N = 2, M = 1: (1/2 x 8 + 2 x 1/2 x 4) B x 18,636
// + 8 B = 149.1 KB sent. The report's words write P for both counts.

// `passes`: the forward-and-backward passes of a step (M; train_3d.c: its microbatches).
static double fsdp_sent_formula(const Fsdp* f, int passes) {
    double sent = 0;
    int N = f->dp->size;
    for (int u = 0; u < f->n_units; u++) {
        double whole = (double)N * f->shard[u];
        double wire = wire_bytes(&f->sums); // 8 B a gradient sum; --reduce fp32, bf16: 4, 2
        double grads_all_reduce = ring_allreduce_bytes(wire * whole, N), grads_reduce_scatter = ring_half_bytes(wire * whole, N);
        double params_all_gather = ring_half_bytes(4 * whole, N);
        if (f->stage == 1) sent += grads_all_reduce + params_all_gather;
        if (f->stage == 2) sent += passes * grads_reduce_scatter + params_all_gather;
        if (f->stage == 3) sent += passes * (grads_reduce_scatter + 2 * params_all_gather);
    }
    return sent;
}
// The table's memory column, the ZeRO paper's accounting, for P and U as above.
static double fsdp_mem_formula(const Fsdp* f, double P, double U, int adamw) {
    int N = f->dp->size;
    double adam = adamw ? 8.0 : 0.0, one_unit_grad = 8.0 * U, one_unit_params = 4.0 * U * (1 + f->prefetch);
    // --reduce fp32, bf16: 12 or 14 B a sum held (optim.h), and at ZeRO-2 and -3 one unit's
    // gradient rounded to 4 or 2 B
    double sums = reduce_bytes_held(f->sums.how) * (f->stage == 1 ? P : P / N);
    if (f->sums.how != REDUCE_EXACT && f->stage > 1) sums += wire_bytes(&f->sums) * U;
    if (f->stage == 1) return 4.0 * P + 8.0 * P + adam * P / N + sums;
    if (f->stage == 2) return 4.0 * P + 8.0 * P / N + one_unit_grad + adam * P / N + sums;
    return 4.0 * P / N + one_unit_params + 8.0 * P / N + one_unit_grad + adam * P / N + sums;
}

// ----------------------------------------------------------------------------
// what only serves: sizes and buffers

static void fsdp_init(Fsdp* f, int stage, int prefetch, Group* dp, const long* unit_size, int n_units, int adamw) {
    memset(f, 0, sizeof *f);
    f->stage = stage;
    f->prefetch = prefetch && stage == 3;
    f->dp = dp;
    f->n_units = n_units;
    int N = dp->size;
    long biggest = 0; // the largest padded unit: the scratch's size
    long shard_off[MAX_LAYERS + 3] = {0}; // where this rank's shard of unit u starts in a buffer of shards
    for (int u = 0; u < n_units; u++) {
        f->size[u] = unit_size[u];
        f->shard[u] = (unit_size[u] + N - 1) / N;
        f->whole_off[u + 1] = f->whole_off[u] + N * f->shard[u];
        shard_off[u + 1] = shard_off[u] + f->shard[u];
        if (N * f->shard[u] > biggest) biggest = N * f->shard[u];
    }
    long n_whole = f->whole_off[n_units], n_shard = shard_off[n_units];
    // calloc: the padding is zero
    float* shard_params = stage == 3 ? callocCheck(n_shard, sizeof(float)) : NULL;
    int64_t* shard_grads = stage >= 2 ? callocCheck(n_shard, sizeof(int64_t)) : NULL;
    if (stage < 3) f->whole_params = callocCheck(n_whole, sizeof(float));
    if (stage == 1) f->whole_grads = callocCheck(n_whole, sizeof(int64_t));
    float *m = NULL, *v = NULL;
    if (stage >= 2) f->unit.grad = callocCheck(biggest, sizeof(int64_t));
    if (adamw) m = callocCheck(n_shard, sizeof(float)), v = callocCheck(n_shard, sizeof(float));
    for (int b = 0; stage == 3 && b < 1 + f->prefetch; b++) f->unit.gathered[b] = callocCheck(biggest, sizeof(float));
    for (int u = 0; u < n_units; u++) {
        long mine = f->whole_off[u] + dp->rank * f->shard[u]; // this rank's shard inside the whole
        f->params[u] = shard_params ? shard_params + shard_off[u] : f->whole_params + mine;
        f->grads[u] = shard_grads ? shard_grads + shard_off[u] : f->whole_grads + mine;
        f->m[u] = m ? m + shard_off[u] : NULL;
        f->v[u] = v ? v + shard_off[u] : NULL;
    }
    f->alloc[0] = shard_params, f->alloc[1] = shard_grads, f->alloc[2] = m, f->alloc[3] = v;
    f->unit.pending = MPI_REQUEST_NULL;
    f->unit.pending_unit = -1;
    f->fn = stage == 1 ? zero1 : stage == 2 ? zero2 : zero3;
    if (f->prefetch) f->fn.unit_params = prefetched_unit_params;
    f->bytes_params = (stage < 3 ? n_whole : n_shard + (1 + f->prefetch) * biggest) * (long)sizeof(float);
    f->bytes_grads = (stage == 1 ? n_whole : n_shard + biggest) * (long)sizeof(int64_t);
    f->bytes_opt = adamw ? 2 * n_shard * (long)sizeof(float) : 0;
}

static void fsdp_free(Fsdp* f) {
    for (int i = 0; i < 4; i++) free(f->alloc[i]);
    free(f->whole_params), free(f->whole_grads), free(f->unit.grad), free(f->unit.gathered[0]), free(f->unit.gathered[1]);
    grad_sums_free(&f->sums), free(f->rounded);
}

// ----------------------------------------------------------------------------
// what only serves: checkpoints, as ckpt.h takes them

// For checkpoints and initialisation: this rank's shard of every unit.
static Holding fsdp_holding(const Fsdp* f) {
    Holding h = {0};
    for (int u = 0; u < f->n_units; u++) {
        long lo, hi;
        fsdp_range(f, u, &lo, &hi);
        h.n[u] = hi - lo;
        h.first[u] = lo;
        h.at[0][u] = f->params[u];
        h.at[1][u] = f->m[u];
        h.at[2][u] = f->v[u];
    }
    return h;
}
#ifdef TRAIN_3D // train_3d.c's plug-in points: the stage's functions by name, and this rank's shard of unit u's gradient sums
static void fsdp_zero_grads(Fsdp* f) { f->fn.zero_grads(f); }
static const float* fsdp_unit_params(Fsdp* f, int u, int next) { return f->fn.unit_params(f, u, next); }
static int64_t* fsdp_unit_grads(Fsdp* f, int u) { return f->fn.unit_grads(f, u); }
static void fsdp_reduce_unit_grads(Fsdp* f, int u) { f->fn.reduce_unit_grads(f, u); }
static void fsdp_reduce_grads(Fsdp* f) { f->fn.reduce_grads(f); }
static void fsdp_gather_params(Fsdp* f) { f->fn.gather_params(f); }
static int64_t* fsdp_shard_grads(const Fsdp* f, int u) { return f->grads[u]; }
#endif

#ifndef TRAIN_3D // the rest of this file is the program

#define RUN_LINE "mpirun -n 2 ./train_fsdp"

static void run_free(Run* r) {
    dataset_free(&r->ds), fsdp_free(&r->f), work_free(&r->work);
}

// Mean loss over the whole validation split: each rank evaluates its share of it.
static double validation_loss(void* ctx) {
    Run* r = ctx;
    int64_t total = evaluate(forward, r, &r->ds, r->dp.size, r->dp.rank);
    group_allreduce(&r->dp, &total, 1, MPI_INT64_T, MPI_SUM);
    return mean_loss(total, &r->ds);
}

// ----------------------------------------------------------------------------
// the figures: what this rank sent and holds, each beside its formula

static Figures figures(const Run* r, const Progress* pr, const Optimizer* opt, int R, int B) {
    const Config* c = &r->cfg;
    double acts_row = acts_bytes_per_row(c, 0, n_units(c), NULL);
    Figures f = {.sent = per_step(pr, r->dp.sent), .received = per_step(pr, r->dp.received),
                 .params = r->f.bytes_params, .grads = r->f.bytes_grads, .optim = r->f.bytes_opt,
                 .acts = R * acts_row, .bubble = -1};
    // the stage's collectives over M passes, the loss sum's all-reduce, --clip's two
    f.sent_formula = fsdp_sent_formula(&r->f, r->M) + ring_allreduce_bytes(8, r->dp.size) +
                     (opt->clip > 0 ? ring_allreduce_bytes(4 + 8, r->dp.size) : 0);
    long mb = (B + r->M - 1) / r->M, N = r->dp.size; // the largest microbatch, shared by the N ranks
    f.mem_formula = fsdp_mem_formula(&r->f, n_params(c), max_unit_params(c), opt->adamw) + (double)((mb + N - 1) / N) * acts_row;
    return f;
}
// The formulas in words, for the report, with P's and U's values.
static void formula_words(const Run* r, char* sent, char* mem, int size) {
    static const char* const sent_words[] = {"", "2(N-1)/N x %.0f B x P gradients + (N-1)/N x 4 B x P parameters",
                                             "(N-1)/N x (%.0f B gradients + 4 B parameters) x P",
                                             "(N-1)/N x (%.0f B gradients + 2 x 4 B parameters) x P"};
    static const char* const mem_words[] = {"", "(4 + 8) B x P + 8 B x P/N (AdamW) + activations",
                                            "4 B x P + (8 + 8 AdamW) B x P/N + 8 B x U (one unit's gradient) + "
                                            "activations",
                                            "(4 + 8 + 8 AdamW) B x P/N + (4 + 8) B x U (one unit in transit; 4 more "
                                            "with --prefetch) + activations"};
    long P = n_params(&r->cfg), U = max_unit_params(&r->cfg);
    char words[160];
    snprintf(words, sizeof words, sent_words[r->stage], wire_bytes(&r->f.sums));
    snprintf(sent, size, "%s, P = %ld", words, P);
    static const char* const sums_words[3][2] = {{"", ""},
                                                 {" + 12 B x P (--reduce fp32)", " + 12 B x P/N + 4 B x U (--reduce fp32)"},
                                                 {" + 14 B x P (--reduce bf16)", " + 14 B x P/N + 2 B x U (--reduce bf16)"}};
    const char* sums = sums_words[r->f.sums.how][r->stage > 1];
    if (r->stage == 1) snprintf(mem, size, "%s, P = %ld%s", mem_words[1], P, sums);
    else snprintf(mem, size, "%s, P = %ld, U = %ld%s", mem_words[r->stage], P, U, sums);
}

// ----------------------------------------------------------------------------
// options of this program

static const CliFlag fsdp_flags[] = {
    {"zero", "N", "ZeRO stage: 1 optimizer state, 2 and gradients, 3 and parameters sharded (default 3)"},
    {"prefetch", NULL, "stage 3: gather the next unit while the current one computes"},
    CLI_REDUCE_FLAG,
};
static const char* fsdp_flag(void* ctx, int index, const char* value) {
    Run* r = ctx;
    if (index == 0) return cli_int("zero", value, 1, 3, &r->stage);
    if (index == 2) return cli_reduce(value, &r->reduce);
    r->prefetch = 1;
    return NULL;
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    Run run = {.stage = 3, .dp = group_world("dp")};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, fsdp_flags, 3, fsdp_flag, &run);
    dist_dense_only(&o, RUN_LINE);
    dist_check_rows(&o, RUN_LINE);
    if (run.prefetch && run.stage != 3) dist_exit(2, RUN_LINE, "--prefetch applies to --zero 3 only");

    // data
    load_data(&run.ds, &o, &run.cfg);

    // model: parameters, exact gradient sums and optimizer state, sharded; activations
    Config* cfg = &run.cfg;
    long unit_size[MAX_LAYERS + 2];
    for (int u = 0; u < n_units(cfg); u++) unit_size[u] = unit_params(cfg, u);
    fsdp_init(&run.f, run.stage, run.prefetch, &run.dp, unit_size, n_units(cfg), o.opt.adamw);
    if (run.reduce) fsdp_reduce_init(&run.f, run.reduce); // --reduce fp32, bf16: its chapter
    run.mine = fsdp_holding(&run.f); // no rank builds the whole model to cut it
    long start = holding_load(&run.mine, &o, &run.ds, cfg);
    run.f.fn.gather_params(&run.f);
    long first;
    int R = microbatch_rows(o.batch, o.microbatches, 0, run.dp.size, 0, &first); // the most rows a rank takes at once
    work_init(&run.work, cfg, pass_rows(&o, R), NULL);
    char layout[160];
    snprintf(layout, sizeof layout, "ZeRO stage %d over %d ranks (%d rows each at most)%s", run.stage, run.dp.size,
             R, run.prefetch ? ", prefetching the next unit" : "");
    if (o.microbatches > 1)
        snprintf(layout + strlen(layout), sizeof layout - strlen(layout), "; %d microbatches", o.microbatches);
    if (run.reduce) snprintf(layout + strlen(layout), sizeof layout - strlen(layout), ", added in %s", reduce_names[run.reduce]);
    if (!o.quiet && world_rank == 0) print_config(&o, &run.ds, layout);

    // training loop
    int B = o.batch;
    run.M = o.microbatches;
    run.n_spans = fsdp_grad_spans(&run.f, run.spans);
    Progress progress = progress_start(&o, world_rank == 0, dist_save, &(DistSave){&run.mine, &run.ds, &run.cfg}, dist_any);
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        if (step_end(&progress, step, train_step(&run, &o, step), validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, &o.opt, R, B);
    char sent_words[256], mem_words[256];
    formula_words(&run, sent_words, mem_words, sizeof sent_words);
    Report rep = {"train_fsdp.c", layout, sent_words, mem_words};
    free(dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run));
    if (!o.quiet && world_rank == 0) grad_sums_print(&run.f.sums, run.dp.size, run.M, n_params(cfg));
    run_free(&run);
    MPI_Finalize();
    return 0;
}

#endif // TRAIN_3D
