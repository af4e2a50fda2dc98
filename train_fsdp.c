/*
 * train_fsdp.c: fully sharded data parallel, ZeRO stages 1, 2 and 3. Data parallel (every
 * rank takes a share of each batch, as in train_dp.c), but the model's state is cut across
 * the ranks: stage 1 shards the optimizer state, stage 2 the gradients too, stage 3 the
 * parameters too, so that in stage 3 no rank holds more of the model than its shards and
 * one unit at a time. It prints exactly what train.c prints for the same flags.
 *
 *   ZeRO-3, 2 ranks; each unit (embedding, linear 1, ...) is cut into 2 shards
 *
 *               rank 0: rows 0-15                 rank 1: rows 16-31
 *   forward     all-gather unit u  <------------>  all-gather unit u   (then drop it)
 *   backward    all-gather unit u  <------------>  all-gather unit u
 *               reduce-scatter its gradient  --->  each keeps the sum of its shard
 *   step        update shard 0                     update shard 1
 *
 * One step, in the order it communicates (main's training loop, through the functions of
 * the section "the strategy", in this order):
 *   forward, unit by unit        stage 3: all-gather unit u            fsdp_unit_params
 *   backward, last unit first    stage 3: all-gather unit u again      fsdp_unit_params
 *                                stages 2, 3: reduce-scatter u's grad  fsdp_reduce_unit_grads
 *   after backward               stage 1: all-reduce every gradient    fsdp_reduce_grads
 *                                all-reduce the loss sum               main
 *   optimizer step               each rank updates its shards, then    fsdp_step
 *                                stages 1, 2 all-gather every unit
 * Then, each a section of its own, read apart: --prefetch (stage 3: the next unit's
 * all-gather runs while this one computes); checkpoints and the clipping norm; the formulas.
 *
 * Per rank and step, on N ranks, for P parameters (the default model has P = 18,635 in
 * units of 432, 16,448 and 1,755; docs/model.md), U the largest unit's. half = (N-1)/N: the
 * share of its buffer a ring reduce-scatter or all-gather sends (an all-reduce sends 2 half).
 * 8 B a gradient sum (int64), 4 B a parameter, adam = 8 B for AdamW's m and v (else 0):
 *
 *   stage  sent                       memory (+ the activations of B/N rows)
 *   1      2 half x 8P + half x 4P    4P + 8P + adam P/N
 *   2      half x 8P + half x 4P      4P + 8P/N + 8U + adam P/N
 *   3      half x 8P + 2 half x 4P    4P/N + 4U + 8P/N + 8U + adam P/N
 *
 * 8U: one unit's gradient before its reduce-scatter; 4U: one unit's parameters gathered (8U
 * with --prefetch: two units). P counts each unit padded to a multiple of N. Every stage also
 * all-reduces the loss sum (2 half x 8 B), and --clip the norm's two pieces. The default,
 * stage 3, N = 2: (1/2 x 8 + 2 x 1/2 x 4) B x 18,636 + 8 B = 149.1 KB sent (linear 2's 1,755
 * padded to 1,756).
 *
 *   make train_fsdp && mpirun -n 2 ./train_fsdp          # --zero 3 (the default)
 *   mpirun -n 4 --oversubscribe ./train_fsdp --zero 1 --optimizer adamw
 *   mpirun -n 2 ./train_fsdp --prefetch                  # stage 3: gather the next unit early
 *
 * Compare with ./train: the same losses, names and final checkpoint, for every stage and N.
 *
 * Sections: the strategy; --prefetch; checkpoints and the clipping norm; the formulas (these
 * four are what train_3d.c uses); then the program: the state of one run; the forward and
 * backward passes; the figures; options; main.
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// the strategy: shards of every unit
//
// Each unit (the embedding, each linear layer with its bias) is a flat block of `size`
// parameters, cut into N equal shards of shard = ceil(size / N): this rank's shard is
// elements [rank * shard, (rank + 1) * shard). The last shard is padded with zeros that never
// change (a zero gradient and a zero parameter stay zero under SGD, AdamW and weight decay).
//
//   what each rank holds              parameters            gradient sums         m, v
//   stage 1                           whole                 whole                 its shard
//   stage 2                           whole                 its shard + one unit  its shard
//   stage 3                           its shard + one unit  its shard + one unit  its shard
//
//   what it sends, and where          stage 1          stage 2              stage 3
//   before unit u runs                -                -                    all-gather u
//   after unit u's backward           -                reduce-scatter u's   reduce-scatter u's
//   after the whole backward          all-reduce all   -                    -
//   optimizer step: update its shard  all-gather all   all-gather all       -
//
// "Whole" is every unit, each padded to N shards ("whole_" below); "its shard" is this
// rank's share of every unit ("shard_" below); "one unit" is a buffer for the unit in use.
// Gradients are exact sums (kernels.h), so a reduce-scatter of them is exact too. The
// functions see a unit only as a block of `size` floats, so train_3d.c uses them on the
// tensor-parallel slices of units too.

typedef struct {
    int stage;    // ZeRO stage: 1, 2 or 3
    int prefetch; // stage 3, --prefetch: gather the next unit while this one computes
    Group* dp;    // the N ranks that share the shards
    int n_units;
    long size[MAX_LAYERS + 2];      // unit u's parameters
    long shard[MAX_LAYERS + 2];     // one rank's share of unit u: ceil(size[u] / N)
    long whole_off[MAX_LAYERS + 3]; // where unit u starts in a whole_ buffer (units padded: N * shard)
    long shard_off[MAX_LAYERS + 3]; // where this rank's shard of unit u starts in a shard_ buffer
    // What this rank stores; NULL where its stage stores none:
    float* whole_params;    // stages 1, 2: every unit [whole_off[n_units]]; this rank's shard inside
    float* shard_params;    // stage 3: this rank's shard of every unit [shard_off[n_units]]
    int64_t* whole_grads;   // stage 1: every unit's gradient sums [whole_off[n_units]]
    int64_t* shard_grads;   // stages 2, 3: this rank's shards' sums over every rank's rows [shard_off[n_units]]
    float *m, *v;           // AdamW's state of this rank's shards [shard_off[n_units]] (NULL with SGD)
    int64_t* unit_grad;     // stages 2, 3: one unit's gradient over this rank's rows, then reduce-scattered
    float* gathered[2];     // stage 3: one unit's parameters, all-gathered (the second for --prefetch)
    MPI_Request pending;           // --prefetch: the all-gather in flight,
    int pending_unit, pending_buf; // of unit pending_unit (-1: none) into gathered[pending_buf]
    long bytes_params, bytes_grads, bytes_opt; // what this rank holds, the "one unit" buffers included
} Fsdp;

static void fsdp_init(Fsdp* f, int stage, int prefetch, Group* dp, const long* unit_size, int n_units, int adamw) {
    memset(f, 0, sizeof *f);
    f->stage = stage;
    f->prefetch = prefetch && stage == 3;
    f->dp = dp;
    f->n_units = n_units;
    int N = dp->size;
    long biggest = 0; // the largest padded unit: the "one unit" buffers' size
    for (int u = 0; u < n_units; u++) {
        f->size[u] = unit_size[u];
        f->shard[u] = (unit_size[u] + N - 1) / N;
        f->whole_off[u + 1] = f->whole_off[u] + N * f->shard[u];
        f->shard_off[u + 1] = f->shard_off[u] + f->shard[u];
        if (N * f->shard[u] > biggest) biggest = N * f->shard[u];
    }
    long n_whole = f->whole_off[n_units], n_shard = f->shard_off[n_units]; // elements of a whole_, a shard_ buffer
    // zeros: the padding stays zero
    if (stage < 3) f->whole_params = callocCheck(n_whole, sizeof(float));
    if (stage == 3) f->shard_params = callocCheck(n_shard, sizeof(float));
    if (stage == 1) f->whole_grads = callocCheck(n_whole, sizeof(int64_t));
    if (stage >= 2) f->shard_grads = callocCheck(n_shard, sizeof(int64_t));
    if (stage >= 2) f->unit_grad = callocCheck(biggest, sizeof(int64_t));
    if (adamw) f->m = callocCheck(n_shard, sizeof(float)), f->v = callocCheck(n_shard, sizeof(float));
    for (int b = 0; stage == 3 && b < 1 + f->prefetch; b++) f->gathered[b] = callocCheck(biggest, sizeof(float));
    f->pending = MPI_REQUEST_NULL;
    f->pending_unit = -1;
    // for the figures
    f->bytes_params = (stage < 3 ? n_whole : n_shard + (1 + f->prefetch) * biggest) * (long)sizeof(float);
    f->bytes_grads = (stage == 1 ? n_whole : n_shard + biggest) * (long)sizeof(int64_t);
    f->bytes_opt = adamw ? 2 * n_shard * (long)sizeof(float) : 0;
}

static void fsdp_free(Fsdp* f) {
    free(f->whole_params), free(f->shard_params), free(f->whole_grads), free(f->shard_grads);
    free(f->m), free(f->v), free(f->unit_grad), free(f->gathered[0]), free(f->gathered[1]);
}

// This rank's elements of unit u: [*lo, *hi), padding excluded.
static void fsdp_range(const Fsdp* f, int u, long* lo, long* hi) {
    *lo = f->dp->rank * f->shard[u];
    *hi = *lo + f->shard[u] < f->size[u] ? *lo + f->shard[u] : f->size[u];
    if (*hi < *lo) *hi = *lo;
}
// This rank's shard of unit u, of the parameters and of the gradient sums: stored apart, or
// inside the whole.
static float* fsdp_shard_params(const Fsdp* f, int u) {
    if (f->shard_params) return f->shard_params + f->shard_off[u];
    return f->whole_params + f->whole_off[u] + f->dp->rank * f->shard[u];
}
static int64_t* fsdp_shard_grads(const Fsdp* f, int u) {
    if (f->shard_grads) return f->shard_grads + f->shard_off[u];
    return f->whole_grads + f->whole_off[u] + f->dp->rank * f->shard[u];
}

static const float* fsdp_prefetched_params(Fsdp* f, int u, int next); // --prefetch, the next section

// Before unit u runs, in forward or backward: its whole parameters. Stages 1 and 2 hold
// them; stage 3 all-gathers them into the "one unit" buffer, which the next unit's gather
// overwrites: so backward gathers each unit again. `next`: the unit after u (-1: none), for
// --prefetch.
static const float* fsdp_unit_params(Fsdp* f, int u, int next) {
    if (f->stage < 3) return f->whole_params + f->whole_off[u];
    if (f->prefetch) return fsdp_prefetched_params(f, u, next);
    group_allgather(f->dp, f->shard_params + f->shard_off[u], f->gathered[0], f->shard[u], MPI_FLOAT);
    return f->gathered[0];
}

// Before backward: every gradient sum this rank stores, zero.
static void fsdp_zero_grads(Fsdp* f) {
    if (f->stage == 1) fix_zero(f->whole_grads, f->whole_off[f->n_units]);
    else fix_zero(f->shard_grads, f->shard_off[f->n_units]);
}
// Where backward adds unit u's gradient over this rank's rows: stage 1 into the whole
// gradient; stages 2 and 3 into the "one unit" buffer (zeroed here).
static int64_t* fsdp_unit_grads(Fsdp* f, int u) {
    if (f->stage == 1) return f->whole_grads + f->whole_off[u];
    fix_zero(f->unit_grad, f->dp->size * f->shard[u]);
    return f->unit_grad;
}
// After unit u's backward, stages 2 and 3: reduce-scatter its gradient, so that each rank
// receives the exact sum over every rank's rows of its own shard, and adds it to its shard's
// sums: added, as every backward adds, so that several passes in one step (train_3d.c's
// microbatches) accumulate.
static void fsdp_reduce_unit_grads(Fsdp* f, int u) {
    if (f->stage == 1) return;
    group_reduce_scatter(f->dp, f->unit_grad, f->shard[u], MPI_INT64_T, MPI_SUM, f->shard_grads + f->shard_off[u]);
}
// After the whole backward, stage 1: all-reduce the whole gradient.
static void fsdp_reduce_grads(Fsdp* f) {
    if (f->stage == 1) group_allreduce(f->dp, f->whole_grads, f->whole_off[f->n_units], MPI_INT64_T, MPI_SUM);
}

// Stages 1 and 2 hold every unit whole: all-gather each from its shards (after each
// optimizer step, and after loading).
static void fsdp_gather_params(Fsdp* f) {
    if (f->stage == 3) return;
    for (int u = 0; u < f->n_units; u++)
        group_allgather(f->dp, fsdp_shard_params(f, u), f->whole_params + f->whole_off[u], f->shard[u], MPI_FLOAT);
}
// The optimizer step: every rank updates only its shards (their sums are complete: every
// rank's rows), then stages 1 and 2 all-gather.
static void fsdp_step(Fsdp* f, const Optimizer* opt, double factor, float scale, long t) {
    for (int u = 0; u < f->n_units; u++) {
        long lo, hi;
        fsdp_range(f, u, &lo, &hi);
        float *m = f->m ? f->m + f->shard_off[u] : NULL, *v = f->v ? f->v + f->shard_off[u] : NULL;
        optimizer_step(opt, fsdp_shard_params(f, u), fsdp_shard_grads(f, u), m, v, hi - lo, factor, scale, t);
    }
    fsdp_gather_params(f);
}

// ----------------------------------------------------------------------------
// --prefetch (stage 3): the next unit's all-gather runs while this one computes
//
// Two "one unit" buffers: while unit u computes from one, the next unit's non-blocking
// all-gather fills the other; the next call waits for it instead of gathering.

static const float* fsdp_prefetched_params(Fsdp* f, int u, int next) {
    int b = 0; // the buffer unit u is in
    if (f->pending_unit == u) { // started by the call before: wait for it to arrive
        MPI_Wait(&f->pending, MPI_STATUS_IGNORE);
        b = f->pending_buf;
    } else { // none started, or of another unit (train_3d.c's schedules): finish it, gather u now
        if (f->pending_unit >= 0) MPI_Wait(&f->pending, MPI_STATUS_IGNORE);
        group_allgather(f->dp, f->shard_params + f->shard_off[u], f->gathered[0], f->shard[u], MPI_FLOAT);
    }
    f->pending_unit = -1;
    if (next >= 0 && next < f->n_units) { // the next unit, into the other buffer
        group_iallgather(f->dp, f->shard_params + f->shard_off[next], f->gathered[1 - b], f->shard[next], MPI_FLOAT,
                         &f->pending);
        f->pending_unit = next, f->pending_buf = 1 - b;
    }
    return f->gathered[b];
}

// ----------------------------------------------------------------------------
// checkpoints and the clipping norm (plumbing: what this rank holds, as ckpt.h and optim.h
// take it)

// For checkpoints and initialisation: this rank's shard of every unit.
static Holding fsdp_holding(const Fsdp* f) {
    Holding h = {0};
    for (int u = 0; u < f->n_units; u++) {
        long lo, hi;
        fsdp_range(f, u, &lo, &hi);
        h.n[u] = hi - lo;
        h.first[u] = lo;
        h.at[0][u] = fsdp_shard_params(f, u);
        h.at[1][u] = f->m ? f->m + f->shard_off[u] : NULL;
        h.at[2][u] = f->v ? f->v + f->shard_off[u] : NULL;
    }
    return h;
}
// The gradients this rank counts in the global norm: its shards (disjoint across ranks).
static int fsdp_grad_spans(const Fsdp* f, GradSpan* spans) {
    for (int u = 0; u < f->n_units; u++) {
        long lo, hi;
        fsdp_range(f, u, &lo, &hi);
        spans[u] = (GradSpan){fsdp_shard_grads(f, u), hi - lo};
    }
    return f->n_units;
}

// ----------------------------------------------------------------------------
// the formulas (they only serve the report): the header's, for units of N * shard[u]
// elements (padded)

// What the stage sends per step from each rank: see the header. `passes` is how many
// forward-and-backward passes a step makes (train_3d.c: one a microbatch); stage 1's
// all-reduce and the all-gather after the step happen once a step.
static double fsdp_sent_formula(const Fsdp* f, int passes) {
    double sent = 0;
    int N = f->dp->size;
    for (int u = 0; u < f->n_units; u++) {
        double whole = (double)N * f->shard[u];
        double grads_all_reduce = ring_allreduce_bytes(8 * whole, N), grads_reduce_scatter = ring_half_bytes(8 * whole, N);
        double params_all_gather = ring_half_bytes(4 * whole, N);
        if (f->stage == 1) sent += grads_all_reduce + params_all_gather;
        if (f->stage == 2) sent += passes * grads_reduce_scatter + params_all_gather;
        if (f->stage == 3) sent += passes * (grads_reduce_scatter + 2 * params_all_gather);
    }
    return sent;
}
// What the ZeRO paper's accounting predicts a rank holds (the header's memory column), for
// P parameters in units of which the largest has U.
static double fsdp_mem_formula(const Fsdp* f, double P, double U, int adamw) {
    int N = f->dp->size;
    double adam = adamw ? 8.0 : 0.0, one_unit_grad = 8.0 * U, one_unit_params = 4.0 * U * (1 + f->prefetch);
    if (f->stage == 1) return 4.0 * P + 8.0 * P + adam * P / N;
    if (f->stage == 2) return 4.0 * P + 8.0 * P / N + one_unit_grad + adam * P / N;
    return 4.0 * P / N + one_unit_params + 8.0 * P / N + one_unit_grad + adam * P / N;
}

#ifndef TRAIN_3D // the rest of this file is the program; train_3d.c uses only the sections above

#define RUN_LINE "mpirun -n 2 ./train_fsdp"

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    Dataset ds;     // the data
    Fsdp f;         // parameters, gradients and optimizer state, sharded
    Work work;
    Group dp;       // every rank
    int stage, prefetch; // --zero, --prefetch
    Holding mine;   // what this rank holds of the model, for checkpoints
} Run;

static void run_free(Run* r) {
    dataset_free(&r->ds), fsdp_free(&r->f), work_free(&r->work);
}

// ----------------------------------------------------------------------------
// the forward and backward passes: train.c's (model.h's model_forward_rows and model_backward),
// unit by unit, each unit's parameters and gradient through the strategy's functions

static int64_t forward(void* ctx, const Rows* rows, long first, int R, long rows_total, float* probs) {
    Run* r = ctx;
    const Config* c = &r->cfg;
    Acts* a = work_load(&r->work, rows, first, R, c->context);
    for (int u = 0; u < n_units(c); u++)
        unit_forward(c, u, fsdp_unit_params(&r->f, u, u + 1), a, &r->work.scratch, R, rows_total, &r->work.ws);
    if (probs) model_probs(c, rows, a->out[c->layers + 1], R, probs);
    return a->loss;
}

// Backward, last unit first; stages 2 and 3 reduce-scatter each unit's gradient as soon as
// it is done (stage 1 all-reduces them all once the step's microbatches are done: main).
static void backward(Run* r, int R, long B) {
    const Config* c = &r->cfg;
    for (int u = n_units(c) - 1; u >= 0; u--) {
        const float* w = fsdp_unit_params(&r->f, u, u - 1);
        unit_recompute(c, u, w, &r->work.acts, &r->work.scratch, R, &r->work.ws); // --recompute
        unit_backward(c, u, w, fsdp_unit_grads(&r->f, u), &r->work.acts, &r->work.scratch, R, B, &r->work.ws);
        fsdp_reduce_unit_grads(&r->f, u);
        scratch_step_down(&r->work.scratch);
    }
}

// Mean loss over the whole validation split: each rank evaluates its share of it.
static double validation_loss(void* ctx) {
    Run* r = ctx;
    int64_t total = evaluate(forward, r, &r->ds, r->dp.size, r->dp.rank);
    group_allreduce(&r->dp, &total, 1, MPI_INT64_T, MPI_SUM);
    return mean_loss(total, &r->ds);
}

// ----------------------------------------------------------------------------
// the figures (they only serve the report): what this rank sent and holds, each beside the
// formulas (fsdp_sent_formula, fsdp_mem_formula, the loss sum's all-reduce, the two of the
// clipping norm, and the activations of its rows)

static Figures figures(const Run* r, const Progress* pr, const Optimizer* opt, int R, int B) {
    const Config* c = &r->cfg;
    double acts_row = acts_bytes_per_row(c, 0, n_units(c), NULL);
    Figures f = {.sent = per_step(pr, r->dp.sent), .received = per_step(pr, r->dp.received),
                 .params = r->f.bytes_params, .grads = r->f.bytes_grads, .optim = r->f.bytes_opt,
                 .acts = R * acts_row, .bubble = -1};
    f.sent_formula = fsdp_sent_formula(&r->f, 1) + ring_allreduce_bytes(8, r->dp.size) +
                     (opt->clip > 0 ? ring_allreduce_bytes(4 + 8, r->dp.size) : 0);
    f.mem_formula = fsdp_mem_formula(&r->f, n_params(c), max_unit_params(c), opt->adamw) +
                    (double)B / r->dp.size * acts_row;
    return f;
}
// The formulas in words, for the report, with P's and U's values.
static void formula_words(const Run* r, char* sent, char* mem, int size) {
    static const char* const sent_words[] = {"", "2(N-1)/N x 8 B x P gradients + (N-1)/N x 4 B x P parameters",
                                             "(N-1)/N x (8 B gradients + 4 B parameters) x P",
                                             "(N-1)/N x (8 B gradients + 2 x 4 B parameters) x P"};
    static const char* const mem_words[] = {"", "(4 + 8) B x P + 8 B x P/N (AdamW) + activations",
                                            "4 B x P + (8 + 8 AdamW) B x P/N + 8 B x U (one unit's gradient) + "
                                            "activations",
                                            "(4 + 8 + 8 AdamW) B x P/N + (4 + 8) B x U (one unit in transit; 4 more "
                                            "with --prefetch) + activations"};
    long P = n_params(&r->cfg), U = max_unit_params(&r->cfg);
    snprintf(sent, size, "%s, P = %ld", sent_words[r->stage], P);
    snprintf(mem, size, r->stage == 1 ? "%s, P = %ld" : "%s, P = %ld, U = %ld", mem_words[r->stage], P, U);
}

// ----------------------------------------------------------------------------
// options of this program

static const CliFlag fsdp_flags[] = {
    {"zero", "N", "ZeRO stage: 1 optimizer state, 2 and gradients, 3 and parameters sharded (default 3)"},
    {"prefetch", NULL, "stage 3: gather the next unit while the current one computes"},
};
static const char* fsdp_flag(void* ctx, int index, const char* value) {
    Run* r = ctx;
    if (index == 0) return cli_int("zero", value, 1, 3, &r->stage);
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
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, fsdp_flags, 2, fsdp_flag, &run);
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
    run.mine = fsdp_holding(&run.f); // no rank builds the whole model to cut it
    long start = holding_load(&run.mine, &o, &run.ds, cfg);
    fsdp_gather_params(&run.f);
    long first;
    int R = microbatch_rows(o.batch, o.microbatches, 0, run.dp.size, 0, &first); // the most rows a rank takes at once
    work_init(&run.work, cfg, pass_rows(&o, R), NULL);
    char layout[160];
    snprintf(layout, sizeof layout, "ZeRO stage %d over %d ranks (%d rows each at most)%s", run.stage, run.dp.size,
             R, run.prefetch ? ", prefetching the next unit" : "");
    if (o.microbatches > 1)
        snprintf(layout + strlen(layout), sizeof layout - strlen(layout), "; %d microbatches", o.microbatches);
    if (!o.quiet && world_rank == 0) print_config(&o, &run.ds, layout);

    // training loop
    int B = o.batch, M = o.microbatches;
    GradSpan spans[MAX_LAYERS + 2];
    int n_spans = fsdp_grad_spans(&run.f, spans);
    Progress progress = progress_start(&o, world_rank == 0, dist_save, &(DistSave){&run.mine, &run.ds, &run.cfg}, dist_any);
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        Rows batch = training_rows(&run.ds, o.seed, step, 0);
        long n = dataset_batch_targets(&run.ds, o.seed, step, B); // of the whole batch, on every rank
        int64_t loss = 0;
        fsdp_zero_grads(&run.f);
        for (int m = 0; m < M; m++) { // --microbatches: each microbatch's gradients added (reduce-scattered each time)
            long first;
            int Rm = microbatch_rows(B, M, m, run.dp.size, run.dp.rank, &first); // this rank's rows of it
            loss += forward(&run, &batch, first, Rm, B, NULL);
            backward(&run, Rm, B);
        }
        fsdp_reduce_grads(&run.f); // stage 1: all-reduce every gradient
        group_allreduce(&run.dp, &loss, 1, MPI_INT64_T, MPI_SUM); // the loss sum over all B rows
        float scale = clip_factor(&o.opt, spans, n_spans, n, group_norm, &run.dp); // the norm over every shard
        fsdp_step(&run.f, &o.opt, grad_factor(n), scale, step);
        if (step_end(&progress, step, fix_to(loss) / n, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, &o.opt, R, B);
    char sent_words[256], mem_words[256];
    formula_words(&run, sent_words, mem_words, sizeof sent_words);
    Report rep = {"train_fsdp.c", layout, sent_words, mem_words};
    free(dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run));
    run_free(&run);
    MPI_Finalize();
    return 0;
}

#endif // TRAIN_3D
