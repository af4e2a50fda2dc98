/*
 * train_fsdp.c: fully sharded data parallel, ZeRO stages 1, 2 and 3. Data parallel (every
 * rank takes a share of each batch), but the model's state is split across the ranks:
 * stage 1 shards the optimizer state, stage 2 the gradients too, stage 3 the parameters
 * too, so that no rank ever holds the whole model except one unit at a time. It prints
 * exactly what train.c prints for the same flags.
 *
 *   make train_fsdp && mpirun -n 2 ./train_fsdp          # --zero 3 (the default)
 *   mpirun -n 4 --oversubscribe ./train_fsdp --zero 1 --optimizer adamw
 *   mpirun -n 2 ./train_fsdp --prefetch                  # stage 3: gather the next unit while computing
 *
 * Sections: the strategy; options; data; model; training loop; validation, sampling and report.
 */
#include "model.h"
#include "data.h"
#include "cli.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// the strategy: shards of every unit
//
// Each unit (the embedding, each linear layer with its bias) is a flat block of parameters.
// Its block is cut into N equal shards, rank r owning elements [r*s, (r+1)*s) with
// s = ceil(size / N); the last shard is padded with zeros that never change (a zero
// gradient and a zero parameter stay zero under SGD, AdamW and weight decay), so they
// never touch the result. Each rank keeps:
//
//   stage  parameters          gradients                     optimizer state
//   1      whole model         whole model, all-reduced      its shards
//   2      whole model         its shards, reduce-scattered  its shards
//   3      its shards          its shards, reduce-scattered  its shards
//
// and updates only its shards. Stages 1 and 2 then all-gather the updated parameters;
// stage 3 instead all-gathers each unit just before using it, in forward and again in
// backward, and drops it after. Gradients are exact sums (model.h), so a reduce-scatter of
// them is exact too.
//
// The functions below see a unit only as a block of `size` floats, so train_3d.c uses them
// on the tensor-parallel slices of units too.

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
// Where this rank's shard of unit u lives, in params, in grads, in m and v.
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

// The whole parameters of unit u, for a forward or a backward. Stages 1 and 2 hold them
// already; stage 3 gathers them now (or waits for the gather --prefetch started) and, with
// --prefetch, starts gathering unit `next` (-1: none) into the other buffer.
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

// Where backward adds unit u's gradient over this rank's rows (zeroed here for stages 2, 3).
static int64_t* fsdp_unit_grads(Fsdp* f, int u) {
    if (f->stage == 1) return f->grads + f->full_off[u];
    fix_zero(f->unit_grad, f->shard[u] * f->dp->size);
    return f->unit_grad;
}
// After backward of unit u (stages 2, 3): reduce-scatter its gradient, so that each rank
// receives the exact sum over every rank's rows of its own shard, and adds it.
static void fsdp_reduce_grads(Fsdp* f, int u) {
    if (f->stage == 1) return;
    const int64_t* sum = group_reduce_scatter(f->dp, f->unit_grad, f->shard[u], MPI_INT64_T, MPI_SUM);
    int64_t* g = f->grads + f->shard_off[u]; // added, not copied: train_3d.c reduces once per microbatch
    for (long i = 0; i < f->shard[u]; i++) g[i] += sum[i];
}
static void fsdp_zero_grads(Fsdp* f) {
    fix_zero(f->grads, f->stage == 1 ? f->full_off[f->n_units] : f->shard_off[f->n_units]);
}
// Stage 1: the gradients of the whole model, all-reduced once backward is done.
static void fsdp_allreduce_grads(Fsdp* f) {
    if (f->stage == 1) group_allreduce(f->dp, f->grads, f->full_off[f->n_units], MPI_INT64_T, MPI_SUM);
}

// The gradient norm's two exact pieces over this rank's shards (to be combined across ranks:
// MAX of the first, SUM of the second, see model.h).
static float fsdp_grads_maxabs(const Fsdp* f, long batch) {
    float mx = 0.0f;
    for (int u = 0; u < f->n_units; u++) {
        long lo, hi;
        fsdp_range(f, u, &lo, &hi);
        float m = grads_maxabs(fsdp_shard_grads(f, u), hi - lo, batch);
        mx = m > mx ? m : mx;
    }
    return mx;
}
static int64_t fsdp_grads_sumsq(const Fsdp* f, long batch, int e) {
    int64_t s = 0;
    for (int u = 0; u < f->n_units; u++) {
        long lo, hi;
        fsdp_range(f, u, &lo, &hi);
        s += grads_sumsq(fsdp_shard_grads(f, u), hi - lo, batch, e);
    }
    return s;
}

// The optimizer on this rank's shards only; stages 1 and 2 then all-gather every unit, so
// that every rank holds the whole updated model again.
static void fsdp_step(Fsdp* f, const Optimizer* opt, double factor, float scale, long t) {
    for (int u = 0; u < f->n_units; u++) {
        long lo, hi;
        fsdp_range(f, u, &lo, &hi);
        float *m = f->m ? f->m + f->shard_off[u] : NULL, *v = f->v ? f->v + f->shard_off[u] : NULL;
        optimizer_step(opt, fsdp_shard_params(f, u), fsdp_shard_grads(f, u), m, v, hi - lo, factor, scale, t);
        if (f->stage < 3) group_allgather(f->dp, fsdp_shard_params(f, u), f->params + f->full_off[u], f->shard[u], MPI_FLOAT);
    }
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
#define EVAL_ROWS 256 // validation rows per forward pass (the result does not depend on it)

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    Fsdp f;         // parameters, gradients and optimizer state, sharded
    Acts acts;
    Scratch scratch;
    Workspace ws;
    Group dp;       // every rank
    int stage, prefetch; // --zero, --prefetch
} Run;

// Forward of the whole model over R rows, unit by unit (stage 3 gathers each unit).
static int64_t fsdp_forward(Run* r, int R, long rows_total) {
    const Config* c = &r->cfg;
    for (int u = 0; u < n_units(c); u++)
        unit_forward(c, u, fsdp_unit_params(&r->f, u, u + 1), &r->acts, &r->scratch, R, rows_total, &r->ws);
    return r->acts.loss;
}

// Backward, last unit first; each unit's gradient is reduce-scattered as soon as it is done.
static void fsdp_backward(Run* r, int R, long B) {
    const Config* c = &r->cfg;
    fsdp_zero_grads(&r->f);
    for (int u = n_units(c) - 1; u >= 0; u--) {
        const float* w = fsdp_unit_params(&r->f, u, u - 1);
        unit_backward(c, u, w, fsdp_unit_grads(&r->f, u), &r->acts, &r->scratch, R, B, &r->ws);
        fsdp_reduce_grads(&r->f, u);
        float* t = r->scratch.dout;
        r->scratch.dout = r->scratch.din;
        r->scratch.din = t;
    }
    fsdp_allreduce_grads(&r->f);
}

// Every rank's shards initialised directly with the values train.c uses, or read from a
// checkpoint: no rank builds the whole model to cut it. Returns the step to resume after.
static long fsdp_load(Run* r, const Options* o, const Dataset* ds) {
    Fsdp* f = &r->f;
    const Config* c = &r->cfg;
    long n = n_params(c), step = 0;
    if (o->load) step = (long)ckpt_check(o->load, c, o->opt.adamw, ds->token_char).step;
    for (int u = 0; u < f->n_units; u++) {
        // stages 1 and 2 hold every unit whole; stage 3 only its own shard of each
        long lo, hi;
        fsdp_range(f, u, &lo, &hi);
        if (f->stage < 3) lo = 0, hi = f->size[u];
        float* p = f->stage < 3 ? f->params + f->full_off[u] + lo : fsdp_shard_params(f, u);
        if (o->load) ckpt_read(o->load, unit_offset(c, u) + lo, hi - lo, p);
        else
            for (long e = lo; e < hi; e++) p[e - lo] = unit_init_value(c, o->seed, u, e);
        fsdp_range(f, u, &lo, &hi);
        if (o->load && f->m) {
            ckpt_read(o->load, n + unit_offset(c, u) + lo, hi - lo, f->m + f->shard_off[u]);
            ckpt_read(o->load, 2 * n + unit_offset(c, u) + lo, hi - lo, f->v + f->shard_off[u]);
        }
    }
    return step;
}

// The checkpoint in train.c's layout: rank 0 gathers one unit at a time and writes it.
static void fsdp_save(Run* r, const char* path, int adamw, long step, const Dataset* ds) {
    Fsdp* f = &r->f;
    const Config* c = &r->cfg;
    CkptHeader h = ckpt_header(c, adamw, step, ds->token_char);
    CkptWriter w = {0};
    if (r->dp.rank == 0) w = ckpt_create(path, &h);
    long most = 0; // the largest unit, padded
    for (int u = 0; u < f->n_units; u++) most = f->full_off[u + 1] - f->full_off[u] > most ? f->full_off[u + 1] - f->full_off[u] : most;
    float* unit = r->dp.rank == 0 ? mallocCheck((size_t)most * sizeof(float)) : NULL;
    for (int part = 0; part < (adamw ? 3 : 1); part++)
        for (int u = 0; u < f->n_units; u++) {
            const float* mine = part == 0 ? fsdp_shard_params(f, u) : (part == 1 ? f->m : f->v) + f->shard_off[u];
            MPI_Gather(mine, (int)f->shard[u], MPI_FLOAT, unit, (int)f->shard[u], MPI_FLOAT, 0, r->dp.comm);
            if (r->dp.rank == 0) ckpt_write(&w, unit, (size_t)f->size[u] * sizeof(float));
        }
    if (r->dp.rank == 0) ckpt_close(&w);
    free(unit);
}

// ----------------------------------------------------------------------------
// validation and sampling

// Mean loss over the whole validation split: each rank evaluates its share of it.
static double evaluate(Run* r, const Dataset* ds) {
    long lo, hi, rows = (ds->n_val_examples + r->dp.size - 1) / r->dp.size;
    split_range(ds->n_val_examples, r->dp.size, r->dp.rank, &lo, &hi);
    int64_t total = 0;
    // every rank makes the same number of passes (stage 3 gathers in each): the last ones may be empty
    for (long first = lo, pass = 0; pass * EVAL_ROWS < rows; first += EVAL_ROWS, pass++) {
        int R = (int)(hi - first < EVAL_ROWS ? (hi - first > 0 ? hi - first : 0) : EVAL_ROWS);
        dataset_val_rows(ds, first, R, r->cfg.context, r->acts.tokens, r->acts.targets);
        total += fsdp_forward(r, R, ds->n_val_examples);
    }
    group_allreduce(&r->dp, &total, 1, MPI_INT64_T, MPI_SUM);
    return fix_to(total) / (double)ds->n_val_examples;
}

// probs[R][V] for R contexts: the forward pass with dummy targets (every rank calls it alike)
static void probs_of(void* ctx, const int* tokens, int R, float* probs) {
    Run* r = ctx;
    memcpy(r->acts.tokens, tokens, (size_t)R * r->cfg.context * sizeof(int));
    memset(r->acts.targets, 0, (size_t)R * sizeof(int));
    fsdp_forward(r, R, R);
    memcpy(probs, r->acts.out[r->cfg.layers + 1], (size_t)R * r->cfg.vocab * sizeof(float));
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
    if (world_size > o.batch)
        dist_exit(2, RUN_LINE, "%d ranks but a batch of %d rows: every rank needs at least one row (raise --batch)",
                  world_size, o.batch);
    if (run.prefetch && run.stage != 3) dist_exit(2, RUN_LINE, "--prefetch applies to --zero 3 only");

    // data
    Dataset ds;
    dataset_load(&ds, o.data, o.max_line, o.seed);
    o.model.vocab = ds.vocab;

    // model: parameters, exact gradient sums and optimizer state, sharded; activations
    run.cfg = o.model;
    Config* cfg = &run.cfg;
    long unit_size[MAX_LAYERS + 2];
    for (int u = 0; u < n_units(cfg); u++) unit_size[u] = unit_params(cfg, u);
    fsdp_init(&run.f, run.stage, run.prefetch, &run.dp, unit_size, n_units(cfg), o.opt.adamw);
    long start = fsdp_load(&run, &o, &ds);
    long lo, hi; // this rank's rows of every global batch
    split_range(o.batch, run.dp.size, run.dp.rank, &lo, &hi);
    int rows = (int)(hi - lo) > EVAL_ROWS ? (int)(hi - lo) : EVAL_ROWS;
    rows = o.samples > rows ? o.samples : rows;
    acts_init(&run.acts, cfg, rows, 0, n_units(cfg), NULL);
    scratch_init(&run.scratch, cfg, rows);
    workspace_init(&run.ws, rows, max_width(cfg), max_linear_weight(cfg));
    char layout[128];
    snprintf(layout, sizeof layout, "ZeRO stage %d over %d ranks (%ld rows each at most)%s", run.stage, run.dp.size,
             hi - lo, run.prefetch ? ", prefetching the next unit" : "");
    if (!o.quiet && world_rank == 0) print_config(&o, &ds, layout);

    // training loop
    int B = o.batch, R = (int)(hi - lo);
    Progress progress = progress_start(&o, world_rank == 0);
    for (long step = start + 1; step <= o.steps; step++) {
        step_window_open(o.trace && step == o.steps); // count this step's messages; --trace: the last one
        double t0 = now_seconds();
        dataset_batch(&ds, o.seed, step, (int)lo, (int)hi, cfg->context, run.acts.tokens, run.acts.targets);
        int64_t loss = fsdp_forward(&run, R, B);
        fsdp_backward(&run, R, B);
        group_allreduce(&run.dp, &loss, 1, MPI_INT64_T, MPI_SUM);
        float scale = 1.0f;
        if (o.opt.clip > 0) { // the norm over every shard: two exact all-reduces
            float mx = fsdp_grads_maxabs(&run.f, B);
            group_allreduce(&run.dp, &mx, 1, MPI_FLOAT, MPI_MAX);
            int e = norm_exponent(mx);
            int64_t sumsq = fsdp_grads_sumsq(&run.f, B, e);
            group_allreduce(&run.dp, &sumsq, 1, MPI_INT64_T, MPI_SUM);
            scale = clip_scale(&o.opt, grad_norm_value(sumsq, e));
        }
        fsdp_step(&run.f, &o.opt, grad_factor(B), scale, step);
        double seconds = now_seconds() - t0;
        step_window_close();
        progress_step(&progress, step, fix_to(loss) / B, seconds, progress_due(&progress, step) ? evaluate(&run, &ds) : 0);
    }
    progress_end(&progress);
    double steps_done = progress.steps ? progress.steps : 1;

    // validation, sampling and report
    double val_loss = evaluate(&run, &ds);
    int max_len = ds.max_len;
    int* names = generate_names(o.samples, max_len, cfg, o.seed, probs_of, &run);
    double P = n_params(cfg);
    Figures fig = {.sent = run.dp.sent / steps_done, .received = run.dp.received / steps_done,
                   .params = run.f.bytes_params, .grads = run.f.bytes_grads, .optim = run.f.bytes_opt,
                   .acts = (double)R * acts_bytes_per_row(cfg, 0, n_units(cfg), NULL), .bubble = -1};
    // the loss sum's all-reduce, and the two of the clipping norm, come on top of the stage's traffic
    fig.sent_formula = fsdp_sent_formula(&run.f, 1) + ring_allreduce_bytes(8, run.dp.size) +
                       (o.opt.clip > 0 ? ring_allreduce_bytes(4 + 8, run.dp.size) : 0);
    fig.mem_formula = fsdp_mem_formula(&run.f, P, (double)max_unit_params(cfg), o.opt.adamw) +
                      (double)B / run.dp.size * acts_bytes_per_row(cfg, 0, n_units(cfg), NULL);
    Figures* all = callocCheck(world_size, sizeof(Figures));
    figures_gather(&fig, all);
    const char* sent_words[] = {"", "2(N-1)/N x 8 B x P gradients + (N-1)/N x 4 B x P parameters",
                                "(N-1)/N x (8 B gradients + 4 B parameters) x P",
                                "(N-1)/N x (8 B gradients + 2 x 4 B parameters) x P"};
    const char* mem_words[] = {"", "(4 + 8) B x P + 8 B x P/N (AdamW) + activations",
                               "4 B x P + (8 + 8 AdamW) B x P/N + one unit's gradient + activations",
                               "(4 + 8 + 8 AdamW) B x P/N + one unit in transit + activations"};
    if (world_rank == 0)
        report_print(&o, "train_fsdp.c", layout, val_loss, &progress, names, max_len, &ds, all, world_size,
                     sent_words[run.stage], mem_words[run.stage]);
    free(all);
    if (o.save) fsdp_save(&run, o.save, o.opt.adamw, o.steps > start ? o.steps : start, &ds);

    free(names);
    fsdp_free(&run.f);
    acts_free(&run.acts);
    scratch_free(&run.scratch);
    workspace_free(&run.ws);
    dataset_free(&ds);
    if (o.trace) dist_trace_write(o.trace);
    MPI_Finalize();
    return 0;
}

#endif // TRAIN_3D
