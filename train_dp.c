/*
 * train_dp.c: data parallel. Every rank holds a whole replica of the model and takes a
 * share of every global batch; after backward the gradients are summed across ranks with
 * one all-reduce and every rank takes the same optimizer step. It prints exactly what
 * train.c prints for the same flags: the same loss at every step, the same final
 * parameters bit for bit, the same names.
 *
 *   make train_dp && mpirun -n 2 ./train_dp            # --oversubscribe for more ranks than cores
 *   mpirun -n 3 ./train_dp --overlap                   # all-reduce each bucket as backward produces it
 *   mpirun -n 2 ./train_dp --sync weights              # average the weights instead (SGD only)
 *
 * Sections: the strategy; options; data; model; training loop; validation, sampling and report.
 */
#include "model.h"
#include "data.h"
#include "cli.h"
#include "dist.h"

#define RUN_LINE "mpirun -n 2 ./train_dp"
#define EVAL_ROWS 256 // validation rows per forward pass (the result does not depend on it)

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    float* params;  // [n_params] a whole replica, identical on every rank
    int64_t* grads; // [n_params] exact sums over this rank's rows, then over every rank's
    float* m;       // [n_params] AdamW state (NULL for SGD)
    float* v;
    Acts acts;
    Scratch scratch;
    Workspace ws;
    Group dp;       // every rank
    int overlap;    // --overlap
    long bucket_bytes; // --bucket-kb
    int sync_weights;  // --sync weights
} Run;

// ----------------------------------------------------------------------------
// the strategy: gradients summed across ranks
//
// The global batch of B rows is split into contiguous shares (32 rows on 3 ranks: 11, 11,
// 10; see split_range). Each rank sums, exactly, the gradients of its own rows; the
// all-reduce adds those sums; the optimizer divides once by B. So every row counts the
// same, whichever rank holds it. Averaging each rank's mean gradient instead would give
// the 10 rows of the last rank more weight than the 11 of the others.

// Backward with --overlap: buckets of consecutive units, last unit first, each at least
// --bucket-kb; as soon as backward has produced a bucket's gradients, a non-blocking
// all-reduce of it starts, and runs while backward goes on with the units below.
// Returns the number of requests to wait for.
static int dp_backward_overlap(Run* r, int R, long B, MPI_Request* reqs) {
    const Config* c = &r->cfg;
    int n_req = 0, bucket_top = n_units(c); // the bucket being filled: units [u, bucket_top)
    for (int u = n_units(c) - 1; u >= 0; u--) {
        long off = unit_offset(c, u);
        unit_backward(c, u, r->params + off, r->grads + off, &r->acts, &r->scratch, R, B, &r->ws);
        float* t = r->scratch.dout;
        r->scratch.dout = r->scratch.din;
        r->scratch.din = t;
        long bytes = (unit_offset(c, bucket_top) - off) * (long)sizeof(int64_t);
        if (bytes >= r->bucket_bytes || u == 0) {
            group_iallreduce(&r->dp, r->grads + off, unit_offset(c, bucket_top) - off, MPI_INT64_T, MPI_SUM,
                             &reqs[n_req++]);
            bucket_top = u;
        }
        // MPI advances a non-blocking collective only inside MPI calls: give it a chance
        if (n_req > 0) {
            int done;
            MPI_Testall(n_req, reqs, &done, MPI_STATUSES_IGNORE);
        }
    }
    return n_req;
}

// --sync weights: each rank steps on the gradient of its own rows, scaled by N / B so that
// the mean of the N ranks' parameters is gradient averaging, then the parameters are
// averaged (an exact sum, divided by N and rounded once). With SGD that is the same update
// as train.c's in exact arithmetic, but not bit for bit: train.c rounds one step,
// p - lr * g, while here every rank rounds its own step before the average, so the last
// bits differ from step 2 on, and like any perturbation of training the difference grows
// with the steps (README). With AdamW it is not even the same update: refused in main.
static void dp_step_sync_weights(Run* r, const Optimizer* opt, long np, long B, long step) {
    optimizer_step(opt, r->params, r->grads, r->m, r->v, np, grad_factor(B) * r->dp.size, 1.0f, step);
    int64_t* sum = r->grads; // the gradients are spent: reuse their buffer for the exact sum
    for (long i = 0; i < np; i++) sum[i] = fix_from(r->params[i]);
    group_allreduce(&r->dp, sum, np, MPI_INT64_T, MPI_SUM);
    for (long i = 0; i < np; i++) r->params[i] = (float)(fix_to(sum[i]) / r->dp.size);
}

// ----------------------------------------------------------------------------
// validation and sampling

// Mean loss over the whole validation split: each rank evaluates its share of it.
static double evaluate(Run* r, const Dataset* ds) {
    long lo, hi;
    split_range(ds->n_val_examples, r->dp.size, r->dp.rank, &lo, &hi);
    int64_t total = 0;
    for (long first = lo; first < hi; first += EVAL_ROWS) {
        int R = (int)(hi - first < EVAL_ROWS ? hi - first : EVAL_ROWS);
        dataset_val_rows(ds, first, R, r->cfg.context, r->acts.tokens, r->acts.targets);
        total += model_forward(&r->cfg, r->params, &r->acts, &r->scratch, R, ds->n_val_examples, &r->ws);
    }
    group_allreduce(&r->dp, &total, 1, MPI_INT64_T, MPI_SUM);
    return fix_to(total) / (double)ds->n_val_examples;
}

// probs[R][V] for R contexts: the forward pass with dummy targets (every rank holds the
// whole model, so every rank samples the same names without communicating)
static void probs_of(void* ctx, const int* tokens, int R, float* probs) {
    Run* r = ctx;
    memcpy(r->acts.tokens, tokens, (size_t)R * r->cfg.context * sizeof(int));
    memset(r->acts.targets, 0, (size_t)R * sizeof(int));
    model_forward(&r->cfg, r->params, &r->acts, &r->scratch, R, R, &r->ws);
    memcpy(probs, r->acts.out[r->cfg.layers + 1], (size_t)R * r->cfg.vocab * sizeof(float));
}

// ----------------------------------------------------------------------------
// options of this program

static const CliFlag dp_flags[] = {
    {"overlap", NULL, "all-reduce gradients in buckets while backward runs"},
    {"bucket-kb", "N", "bucket size for --overlap, in KiB of gradients (default 64)"},
    {"sync", "WHAT", "grads (default): all-reduce the gradients; weights: average the weights (sgd)"},
};
static const char* dp_flag(void* ctx, int index, const char* value) {
    Run* r = ctx;
    long kb;
    if (index == 0) r->overlap = 1;
    if (index == 1) {
        const char* err = cli_long("bucket-kb", value, 1, 1L << 20, &kb);
        if (err) return err;
        r->bucket_bytes = kb * 1024;
    }
    if (index == 2) {
        if (!strcmp(value, "grads")) r->sync_weights = 0;
        else if (!strcmp(value, "weights")) r->sync_weights = 1;
        else return "--sync must be grads or weights";
    }
    return NULL;
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    Run run = {.bucket_bytes = 64 * 1024, .dp = group_world("dp")};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, dp_flags, 3, dp_flag, &run);
    if (world_size > o.batch)
        dist_exit(2, RUN_LINE, "%d ranks but a batch of %d rows: every rank needs at least one row (raise --batch)",
                  world_size, o.batch);
    if (run.sync_weights && o.opt.adamw)
        dist_exit(2, RUN_LINE,
                  "--sync weights works with sgd only: AdamW's update is not linear in the gradient, so averaging "
                  "the weights of ranks that each stepped on their own rows is not gradient averaging");
    if (run.sync_weights && run.overlap) dist_exit(2, RUN_LINE, "--overlap applies to --sync grads only");

    // data
    Dataset ds;
    dataset_load(&ds, o.data, o.max_line, o.seed);
    o.model.vocab = ds.vocab;

    // model: parameters, exact gradient sums, optimizer state, activations
    run.cfg = o.model;
    Config* cfg = &run.cfg;
    long np = n_params(cfg);
    run.params = mallocCheck(np * sizeof(float));
    run.grads = mallocCheck(np * sizeof(int64_t));
    run.m = o.opt.adamw ? callocCheck(np, sizeof(float)) : NULL;
    run.v = o.opt.adamw ? callocCheck(np, sizeof(float)) : NULL;
    long start = 0;
    if (o.load) start = ckpt_restore(o.load, cfg, o.opt.adamw, ds.token_char, run.params, run.m, run.v);
    else params_init(run.params, cfg, o.seed);
    long lo, hi; // this rank's rows of every global batch
    split_range(o.batch, run.dp.size, run.dp.rank, &lo, &hi);
    int rows = (int)(hi - lo) > EVAL_ROWS ? (int)(hi - lo) : EVAL_ROWS;
    rows = o.samples > rows ? o.samples : rows;
    acts_init(&run.acts, cfg, rows, 0, n_units(cfg), NULL);
    scratch_init(&run.scratch, cfg, rows);
    workspace_init(&run.ws, rows, max_width(cfg), max_linear_weight(cfg));
    char layout[128];
    snprintf(layout, sizeof layout, "data parallel over %d ranks (%ld rows each at most), %s%s", run.dp.size,
             hi - lo, run.sync_weights ? "weights averaged" : "gradients all-reduced",
             run.overlap ? " in buckets during backward" : "");
    if (!o.quiet && world_rank == 0) print_config(&o, &ds, layout);

    // training loop
    int B = o.batch, R = (int)(hi - lo);
    MPI_Request reqs[MAX_LAYERS + 2];
    Progress progress = progress_start(&o, world_rank == 0);
    for (long step = start + 1; step <= o.steps; step++) {
        step_window_open(o.trace && step == o.steps); // count this step's messages; --trace: the last one
        double t0 = now_seconds();
        dataset_batch(&ds, o.seed, step, (int)lo, (int)hi, cfg->context, run.acts.tokens, run.acts.targets);
        int64_t loss = model_forward(cfg, run.params, &run.acts, &run.scratch, R, B, &run.ws);
        fix_zero(run.grads, np);
        if (run.overlap) {
            int n_req = dp_backward_overlap(&run, R, B, reqs);
            MPI_Waitall(n_req, reqs, MPI_STATUSES_IGNORE);
        } else {
            model_backward(cfg, run.params, run.grads, &run.acts, &run.scratch, R, B, &run.ws);
            if (!run.sync_weights) group_allreduce(&run.dp, run.grads, np, MPI_INT64_T, MPI_SUM); // exact
        }
        group_allreduce(&run.dp, &loss, 1, MPI_INT64_T, MPI_SUM);
        if (run.sync_weights) {
            dp_step_sync_weights(&run, &o.opt, np, B, step);
        } else {
            float scale = 1.0f; // every rank holds the whole summed gradient: no communication
            if (o.opt.clip > 0) {
                int e = norm_exponent(grads_maxabs(run.grads, np, B));
                scale = clip_scale(&o.opt, grad_norm_value(grads_sumsq(run.grads, np, B, e), e));
            }
            optimizer_step(&o.opt, run.params, run.grads, run.m, run.v, np, grad_factor(B), scale, step);
        }
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
    // Every rank all-reduces the P gradient sums (8 bytes each: exact sums travel as integers)
    // and the loss sum: a ring all-reduce sends 2(N-1)/N of the buffer. Every rank holds a
    // whole replica: train.c's 4 + 8 + 8 bytes a parameter, and the activations of its rows.
    Figures fig = {.sent = run.dp.sent / steps_done, .received = run.dp.received / steps_done,
                   .params = 4.0 * np, .grads = 8.0 * np, .optim = o.opt.adamw ? 8.0 * np : 0,
                   .acts = (double)R * acts_bytes_per_row(cfg, 0, n_units(cfg), NULL), .bubble = -1};
    fig.sent_formula = ring_allreduce_bytes(8.0 * np + 8.0, run.dp.size);
    fig.mem_formula = (4.0 + 8.0 + (o.opt.adamw ? 8.0 : 0)) * np +
                      (double)B / run.dp.size * acts_bytes_per_row(cfg, 0, n_units(cfg), NULL);
    Figures* all = callocCheck(world_size, sizeof(Figures));
    figures_gather(&fig, all);
    if (world_rank == 0) {
        report_print(&o, "train_dp.c", layout, val_loss, &progress, names, max_len, &ds, all, world_size,
                     "2(N-1)/N x 8 B x (P gradients + 1 loss)", "(4 + 8 + 8 with AdamW) B x P + activations of B/N rows");
        if (o.save)
            ckpt_save(o.save, cfg, o.opt.adamw, o.steps > start ? o.steps : start, ds.token_char, run.params, run.m,
                      run.v);
    }
    free(all);
    free(names);
    free(run.params);
    free(run.grads);
    free(run.m);
    free(run.v);
    acts_free(&run.acts);
    scratch_free(&run.scratch);
    workspace_free(&run.ws);
    dataset_free(&ds);
    if (o.trace) dist_trace_write(o.trace);
    MPI_Finalize();
    return 0;
}
