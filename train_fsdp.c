/*
 * train_fsdp.c: fully sharded data parallel, ZeRO stages 1, 2 and 3. Data parallel (every
 * rank takes a share of each batch), but the model's state is split across the ranks:
 * stage 1 shards the optimizer state, stage 2 the gradients too, stage 3 the parameters
 * too, so that no rank ever holds the whole model except one unit at a time. It prints
 * exactly what train.c prints for the same flags.
 *
 *   ZeRO-3, 2 ranks; each unit (embedding, linear 1, ...) is cut into 2 shards
 *
 *               rank 0: rows 0-15                 rank 1: rows 16-31
 *   forward     all-gather unit u  <------------>  all-gather unit u   (then drop it)
 *   backward    all-gather unit u  <------------>  all-gather unit u
 *               reduce-scatter its gradient  --->  each keeps the sum of its shard
 *   step        update shard 0                     update shard 1
 *
 * Per rank and step, P parameters on N ranks (ring collectives, exact sums travel as 8 B):
 *   stage  sent                                         memory
 *   1      2(N-1)/N x 8 B x P + (N-1)/N x 4 B x P       (4 + 8) B x P + 8 B x P/N (AdamW)
 *   2      (N-1)/N x (8 + 4) B x P                      4 B x P + (8 + 8 AdamW) B x P/N + a unit's gradient
 *   3      (N-1)/N x (8 + 2 x 4) B x P                  (4 + 8 + 8 AdamW) B x P/N + one unit in transit
 *   plus the activations of B/N rows, as in data parallelism.
 *
 *   make train_fsdp && mpirun -n 2 ./train_fsdp          # --zero 3 (the default)
 *   mpirun -n 4 --oversubscribe ./train_fsdp --zero 1 --optimizer adamw
 *   mpirun -n 2 ./train_fsdp --prefetch                  # stage 3: gather the next unit while computing
 *
 * Compare with ./train: the same losses, names and final checkpoint, for every stage and N.
 *
 * Sections: the strategy; the state of one run; the forward and backward passes, and the
 * figures; options; main.
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// the strategy: shards of every unit
//
// Each unit (the embedding, each linear layer with its bias) is a flat block of parameters.
// Its block is cut into N equal shards, rank r owning elements [r*s, (r+1)*s) with
// s = ceil(size / N); the last shard is padded with zeros that never change (a zero
// gradient and a zero parameter stay zero under SGD, AdamW and weight decay), so they
// never touch the result. Each rank keeps, and does at each point of a step:
//
//   stage  holds params / grads / optimizer   before a unit is used   after its backward   after backward   optimizer step
//   1      whole / whole / its shards         -                       -                    all-reduce grads update its shards, all-gather params
//   2      whole / its shards / its shards    -                       reduce-scatter grad  -                update its shards, all-gather params
//   3      its shards (all three)             all-gather the unit     reduce-scatter grad  -                update its shards
//
// The five functions below are those columns. Gradients are exact sums (kernels.h), so a
// reduce-scatter of them is exact too. They see a unit only as a block of `size` floats,
// so train_3d.c uses them on the tensor-parallel slices of units too.

typedef struct {
    int stage;       // ZeRO stage: 1, 2 or 3
    int prefetch;    // stage 3: start gathering the next unit while this one computes
    Group* dp;       // the ranks that share the shards
    int n_units;
    long size[MAX_LAYERS + 2];      // parameters of each unit
    long shard[MAX_LAYERS + 2];     // each rank's share of it, ceil(size / N)
    long full_off[MAX_LAYERS + 3];  // unit u in the whole model, units padded to N * shard
    long shard_off[MAX_LAYERS + 3]; // unit u in this rank's shards
    float* params;      // stages 1, 2: [full_off[n]] the whole model; stage 3: [shard_off[n]] shards
    int64_t* grads;     // stage 1: [full_off[n]]; stages 2, 3: [shard_off[n]]
    float* m;           // [shard_off[n]] AdamW state (NULL for SGD)
    float* v;
    int64_t* unit_grad; // stages 2, 3: one unit's gradient over this rank's rows, reduce-scattered in place
    float* gathered[2]; // stage 3: a unit's parameters, gathered (the second for --prefetch)
    MPI_Request pending; // stage 3, --prefetch: the gather in flight
    int pending_unit, pending_buf;
    long bytes_params, bytes_grads, bytes_opt; // held by this rank, transient buffers included
} Fsdp;

static void fsdp_init(Fsdp* f, int stage, int prefetch, Group* dp, const long* unit_size, int n_units, int adamw) {
    memset(f, 0, sizeof *f);
    f->stage = stage;
    f->prefetch = prefetch && stage == 3;
    f->dp = dp;
    f->n_units = n_units;
    long max_padded = 0;
    for (int u = 0; u < n_units; u++) {
        f->size[u] = unit_size[u];
        f->shard[u] = (unit_size[u] + dp->size - 1) / dp->size;
        f->full_off[u + 1] = f->full_off[u] + f->shard[u] * dp->size;
        f->shard_off[u + 1] = f->shard_off[u] + f->shard[u];
        if (f->shard[u] * dp->size > max_padded) max_padded = f->shard[u] * dp->size;
    }
    long np = stage == 3 ? f->shard_off[n_units] : f->full_off[n_units];
    long ng = stage == 1 ? f->full_off[n_units] : f->shard_off[n_units];
    f->params = callocCheck(np, sizeof(float)); // zeros: the padding stays zero
    f->grads = callocCheck(ng, sizeof(int64_t));
    f->m = adamw ? callocCheck(f->shard_off[n_units], sizeof(float)) : NULL;
    f->v = adamw ? callocCheck(f->shard_off[n_units], sizeof(float)) : NULL;
    f->bytes_params = np * (long)sizeof(float);
    f->bytes_grads = ng * (long)sizeof(int64_t);
    f->bytes_opt = adamw ? 2 * f->shard_off[n_units] * (long)sizeof(float) : 0;
    if (stage >= 2) {
        f->unit_grad = callocCheck(max_padded, sizeof(int64_t));
        f->bytes_grads += max_padded * (long)sizeof(int64_t);
    }
    if (stage == 3)
        for (int b = 0; b < 1 + f->prefetch; b++) {
            f->gathered[b] = callocCheck(max_padded, sizeof(float));
            f->bytes_params += max_padded * (long)sizeof(float);
        }
    f->pending = MPI_REQUEST_NULL;
    f->pending_unit = -1;
}

static void fsdp_free(Fsdp* f) {
    free(f->params);
    free(f->grads);
    free(f->m);
    free(f->v);
    free(f->unit_grad);
    free(f->gathered[0]);
    free(f->gathered[1]);
}

// This rank's elements of unit u: [*lo, *hi), padding excluded.
static void fsdp_range(const Fsdp* f, int u, long* lo, long* hi) {
    *lo = f->dp->rank * f->shard[u];
    *hi = *lo + f->shard[u] < f->size[u] ? *lo + f->shard[u] : f->size[u];
    if (*hi < *lo) *hi = *lo;
}
// Where this rank's shard of unit u lives, in params and in grads.
static float* fsdp_shard_params(const Fsdp* f, int u) {
    return f->stage == 3 ? f->params + f->shard_off[u] : f->params + f->full_off[u] + f->dp->rank * f->shard[u];
}
static int64_t* fsdp_shard_grads(const Fsdp* f, int u) {
    return f->stage == 1 ? f->grads + f->full_off[u] + f->dp->rank * f->shard[u] : f->grads + f->shard_off[u];
}

// Stage 3: all-gather unit u's shards into buffer b (non-blocking if req is not NULL).
static void fsdp_gather(Fsdp* f, int u, int b, MPI_Request* req) {
    const float* mine = f->params + f->shard_off[u];
    if (req) group_iallgather(f->dp, mine, f->gathered[b], f->shard[u], MPI_FLOAT, req);
    else group_allgather(f->dp, mine, f->gathered[b], f->shard[u], MPI_FLOAT);
}

// Before unit u is used, in forward or backward: its whole parameters. Stages 1 and 2 hold
// them already; stage 3 gathers them now (or waits for the gather --prefetch started) and,
// with --prefetch, starts gathering unit `next` (-1: none) into the other buffer.
static const float* fsdp_unit_params(Fsdp* f, int u, int next) {
    if (f->stage < 3) return f->params + f->full_off[u];
    int b = 0;
    if (f->pending_unit == u) {
        MPI_Wait(&f->pending, MPI_STATUS_IGNORE);
        b = f->pending_buf;
    } else {
        if (f->pending_unit >= 0) MPI_Wait(&f->pending, MPI_STATUS_IGNORE); // a prefetch not used
        fsdp_gather(f, u, 0, NULL);
    }
    f->pending_unit = -1;
    if (f->prefetch && next >= 0 && next < f->n_units) {
        fsdp_gather(f, next, 1 - b, &f->pending);
        f->pending_unit = next;
        f->pending_buf = 1 - b;
    }
    return f->gathered[b];
}

// Where backward adds unit u's gradient over this rank's rows: stage 1 holds the whole
// gradient; stages 2 and 3 a buffer for one unit (zeroed here).
static int64_t* fsdp_unit_grads(Fsdp* f, int u) {
    if (f->stage == 1) return f->grads + f->full_off[u];
    fix_zero(f->unit_grad, f->shard[u] * f->dp->size);
    return f->unit_grad;
}
// After unit u's backward (stages 2, 3): reduce-scatter its gradient, so that each rank
// receives the exact sum over every rank's rows of its own shard, and adds it to its
// shard's gradient sum: added, as every backward adds into gradient sums, so that several
// passes in one step (train_3d.c's microbatches) accumulate.
static void fsdp_reduce_unit_grads(Fsdp* f, int u) {
    if (f->stage == 1) return;
    group_reduce_scatter(f->dp, f->unit_grad, f->shard[u], MPI_INT64_T, MPI_SUM, f->grads + f->shard_off[u]);
}
// After the whole backward (stage 1): all-reduce the gradient of the whole model.
static void fsdp_reduce_grads(Fsdp* f) {
    if (f->stage == 1) group_allreduce(f->dp, f->grads, f->full_off[f->n_units], MPI_INT64_T, MPI_SUM);
}
static void fsdp_zero_grads(Fsdp* f) {
    fix_zero(f->grads, f->stage == 1 ? f->full_off[f->n_units] : f->shard_off[f->n_units]);
}

// Stages 1 and 2 hold the whole parameters: all-gather every unit from its shards (after
// each optimizer step, and after loading).
static void fsdp_gather_params(Fsdp* f) {
    if (f->stage == 3) return;
    for (int u = 0; u < f->n_units; u++)
        group_allgather(f->dp, fsdp_shard_params(f, u), f->params + f->full_off[u], f->shard[u], MPI_FLOAT);
}

// The optimizer step: every rank updates only its shards, then stages 1 and 2 all-gather.
static void fsdp_step(Fsdp* f, const Optimizer* opt, double factor, float scale, long t) {
    for (int u = 0; u < f->n_units; u++) {
        long lo, hi;
        fsdp_range(f, u, &lo, &hi);
        float *m = f->m ? f->m + f->shard_off[u] : NULL, *v = f->v ? f->v + f->shard_off[u] : NULL;
        optimizer_step(opt, fsdp_shard_params(f, u), fsdp_shard_grads(f, u), m, v, hi - lo, factor, scale, t);
    }
    fsdp_gather_params(f);
}

// What this rank holds, for checkpoints and initialisation: its shard of every unit.
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

// What the ZeRO stage sends per step from each rank, by the textbook ring formulas, over
// units whose shards are `shard[u]` (padded: N * shard[u] elements): stage 1 all-reduces
// the gradients (8 B each) and all-gathers the updated parameters (4 B); stage 2
// reduce-scatters each unit's gradient instead; stage 3 also all-gathers each unit before
// its forward and again before its backward, and not after the update. `passes` is how
// many forward-and-backward passes a step makes (train_3d.c: one per microbatch).
static double fsdp_sent_formula(const Fsdp* f, int passes) {
    double sent = 0;
    int N = f->dp->size;
    for (int u = 0; u < f->n_units; u++) {
        double padded = (double)N * f->shard[u];
        if (f->stage == 1) sent += ring_allreduce_bytes(8 * padded, N) + ring_half_bytes(4 * padded, N);
        if (f->stage == 2) sent += passes * ring_half_bytes(8 * padded, N) + ring_half_bytes(4 * padded, N);
        if (f->stage == 3) sent += passes * (ring_half_bytes(8 * padded, N) + 2 * ring_half_bytes(4 * padded, N));
    }
    return sent;
}
// What the ZeRO paper's accounting predicts a rank holds, for P parameters in units of
// which the largest has U: stage 1 the whole parameters (4 B) and gradients (8 B), 1/N of
// the optimizer state (8 B with AdamW); stage 2 also 1/N of the gradients, plus one unit's
// gradient in transit (8 B); stage 3 also 1/N of the parameters, plus one unit gathered
// (4 B, twice with --prefetch).
static double fsdp_mem_formula(const Fsdp* f, double P, double U, int adamw) {
    int N = f->dp->size;
    double opt = adamw ? 8.0 * P / N : 0.0, transit_grad = 8.0 * U;
    if (f->stage == 1) return 4.0 * P + 8.0 * P + opt;
    if (f->stage == 2) return 4.0 * P + 8.0 * P / N + transit_grad + opt;
    return 4.0 * P / N + 4.0 * U * (1 + f->prefetch) + 8.0 * P / N + transit_grad + opt;
}

#ifndef TRAIN_3D // the rest of this file is the program; train_3d.c uses only the strategy above

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
// the forward and backward passes: train.c's, unit by unit through the stage's hooks

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
// it is done, stage 1 all-reduces them all at the end.
static void backward(Run* r, int R, long B) {
    const Config* c = &r->cfg;
    for (int u = n_units(c) - 1; u >= 0; u--) {
        const float* w = fsdp_unit_params(&r->f, u, u - 1);
        unit_backward(c, u, w, fsdp_unit_grads(&r->f, u), &r->work.acts, &r->work.scratch, R, B, &r->work.ws);
        fsdp_reduce_unit_grads(&r->f, u);
        scratch_step_down(&r->work.scratch);
    }
    fsdp_reduce_grads(&r->f);
}

// Mean loss over the whole validation split: each rank evaluates its share of it.
static double validation_loss(void* ctx) {
    Run* r = ctx;
    int64_t total = evaluate(forward, r, &r->ds, r->dp.size, r->dp.rank);
    group_allreduce(&r->dp, &total, 1, MPI_INT64_T, MPI_SUM);
    return mean_loss(total, &r->ds);
}

// What this rank sent and holds, each beside its formula (fsdp_sent_formula and
// fsdp_mem_formula, plus the loss sum's all-reduce, the two of the clipping norm, and the
// activations of its rows).
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
static const char* const sent_words[] = {"", "2(N-1)/N x 8 B x P gradients + (N-1)/N x 4 B x P parameters",
                                         "(N-1)/N x (8 B gradients + 4 B parameters) x P",
                                         "(N-1)/N x (8 B gradients + 2 x 4 B parameters) x P"};
static const char* const mem_words[] = {"", "(4 + 8) B x P + 8 B x P/N (AdamW) + activations",
                                        "4 B x P + (8 + 8 AdamW) B x P/N + one unit's gradient + activations",
                                        "(4 + 8 + 8 AdamW) B x P/N + one unit in transit + activations"};

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
    long lo, hi; // this rank's rows of every global batch
    split_range(o.batch, run.dp.size, run.dp.rank, &lo, &hi);
    work_init(&run.work, cfg, pass_rows(&o, hi - lo), NULL);
    char layout[128];
    snprintf(layout, sizeof layout, "ZeRO stage %d over %d ranks (%ld rows each at most)%s", run.stage, run.dp.size,
             hi - lo, run.prefetch ? ", prefetching the next unit" : "");
    if (!o.quiet && world_rank == 0) print_config(&o, &run.ds, layout);

    // training loop
    int B = o.batch, R = (int)(hi - lo);
    GradSpan spans[MAX_LAYERS + 2];
    int n_spans = fsdp_grad_spans(&run.f, spans);
    Progress progress = progress_start(&o, world_rank == 0, dist_save, &(DistSave){&run.mine, &run.ds, &run.cfg}, dist_any);
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        Rows batch = training_rows(&run.ds, o.seed, step, 0);
        long n = dataset_batch_targets(&run.ds, o.seed, step, B); // of the whole batch, on every rank
        int64_t loss = forward(&run, &batch, lo, R, B, NULL); // this rank's rows
        fsdp_zero_grads(&run.f);
        backward(&run, R, B);
        group_allreduce(&run.dp, &loss, 1, MPI_INT64_T, MPI_SUM);
        float scale = clip_factor(&o.opt, spans, n_spans, n, group_norm, &run.dp); // the norm over every shard
        fsdp_step(&run.f, &o.opt, grad_factor(n), scale, step);
        if (step_end(&progress, step, fix_to(loss) / n, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, &o.opt, R, B);
    Report rep = {"train_fsdp.c", layout, sent_words[run.stage], mem_words[run.stage]};
    free(dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run));
    run_free(&run);
    MPI_Finalize();
    return 0;
}

#endif // TRAIN_3D
