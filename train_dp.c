/*
 * train_dp.c: data parallel. Every rank holds a whole replica of the model and takes a
 * share of every global batch; after backward the gradients are summed across ranks with
 * one all-reduce and every rank takes the same optimizer step. It prints exactly what
 * train.c prints for the same flags: the same loss at every step, the same final
 * parameters bit for bit, the same names.
 *
 *                       global batch, B = 32 rows
 *               rows 0-15                      rows 16-31
 *   rank 0   [ whole model ]              [ whole model ]   rank 1
 *            forward, backward            forward, backward
 *            grads: exact sums  <-- all-reduce (sum) -->  grads: exact sums
 *            optimizer step               optimizer step    (the same on both)
 *
 * Per rank and step, P parameters on N ranks:
 *   sent    2(N-1)/N x 8 B x (P gradient sums + 1 loss sum)   (a ring all-reduce)
 *   memory  (4 + 8, + 8 with AdamW) B x P + the activations of B/N rows
 *
 *   make train_dp && mpirun -n 2 ./train_dp            # --oversubscribe for more ranks than cores
 *   mpirun -n 3 ./train_dp --overlap                   # all-reduce each bucket as backward produces it
 *   mpirun -n 2 ./train_dp --sync weights              # average the weights instead (SGD only)
 *
 * Compare with ./train: the same losses, names and final checkpoint, whatever N.
 *
 * Sections: the state of one run; the strategy; the forward pass and the figures; options; main.
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"

#define RUN_LINE "mpirun -n 2 ./train_dp"

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    Dataset ds;     // the data
    State st;       // a whole replica, identical on every rank; its gradients are exact sums
    Work work;      // over this rank's rows, then over every rank's
    Group dp;       // every rank
    int overlap;    // --overlap
    long bucket_bytes; // --bucket-kb
    int sync_weights;  // --sync weights
} Run;

static void run_free(Run* r) {
    dataset_free(&r->ds), state_free(&r->st), work_free(&r->work);
}

// --save: this run's checkpoint at `step` (every rank calls it)
static void save(void* ctx, const Options* o, long step) {
    Run* r = ctx;
    if (world_rank == 0) ckpt_save(o, &r->ds, &r->cfg, step, &r->st); // every rank holds the same replica: one writes it
}

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
static void dp_backward_overlap(Run* r, int R, long B) {
    const Config* c = &r->cfg;
    MPI_Request reqs[MAX_LAYERS + 2];
    MPI_Status statuses[MAX_LAYERS + 2];
    int n_req = 0, bucket_top = n_units(c); // the bucket being filled: units [u, bucket_top)
    for (int u = n_units(c) - 1; u >= 0; u--) {
        long off = unit_offset(c, u);
        unit_backward(c, u, r->st.params + off, r->st.grads + off, &r->work.acts, &r->work.scratch, R, B, &r->work.ws);
        scratch_step_down(&r->work.scratch);
        long bytes = (unit_offset(c, bucket_top) - off) * (long)sizeof(int64_t);
        if (bytes >= r->bucket_bytes || u == 0) {
            group_iallreduce(&r->dp, r->st.grads + off, unit_offset(c, bucket_top) - off, MPI_INT64_T, MPI_SUM,
                             &reqs[n_req++]);
            bucket_top = u;
        }
        // MPI advances a non-blocking collective only inside MPI calls: give it a chance
        if (n_req > 0) {
            int done;
            MPI_Testall(n_req, reqs, &done, statuses);
        }
    }
    MPI_Waitall(n_req, reqs, statuses);
}

// --sync weights: each rank steps on the gradient of its own rows, scaled by N / n (n: the
// batch's targets, B for the MLP) so that the mean of the N ranks' parameters is gradient
// averaging, then the parameters are
// averaged (an exact sum, divided by N and rounded once). With SGD that is the same update
// as train.c's in exact arithmetic, but not bit for bit: train.c rounds one step,
// p - lr * g, while here every rank rounds its own step before the average, so the last
// bits differ from step 2 on, and like any perturbation of training the difference grows
// with the steps (docs/exactness.md). With AdamW or clipping it is not even the same update: refused.
static void dp_step_sync_weights(Run* r, const Optimizer* opt, long np, long n, long step) {
    optimizer_step(opt, r->st.params, r->st.grads, r->st.m, r->st.v, np, grad_factor(n) * r->dp.size, 1.0f, step);
    int64_t* sum = r->st.grads; // the gradients are spent: reuse their buffer for the exact sum
    for (long i = 0; i < np; i++) sum[i] = fix_from(r->st.params[i]);
    group_allreduce(&r->dp, sum, np, MPI_INT64_T, MPI_SUM);
    for (long i = 0; i < np; i++) r->st.params[i] = (float)(fix_to(sum[i]) / r->dp.size);
}

// ----------------------------------------------------------------------------
// the forward pass: train.c's, on this rank's rows

static int64_t forward(void* ctx, const Rows* rows, long first, int R, long rows_total, float* probs) {
    Run* r = ctx;
    return model_forward_rows(&r->cfg, r->st.params, &r->work, rows, first, R, rows_total, probs);
}

// Mean loss over the whole validation split: each rank evaluates its share of it.
static double validation_loss(void* ctx) {
    Run* r = ctx;
    int64_t total = evaluate(forward, r, &r->ds, r->dp.size, r->dp.rank);
    group_allreduce(&r->dp, &total, 1, MPI_INT64_T, MPI_SUM);
    return mean_loss(total, &r->ds);
}

// The formulas of figures(), in words, for the report.
static const char sent_words[] = "2(N-1)/N x 8 B x (P gradients + 1 loss)";
static const char mem_words[] = "(4 + 8 + 8 with AdamW) B x P + activations of B/N rows";

// What this rank sent and holds, each beside its formula: every rank all-reduces the P
// gradient sums (8 bytes each: exact sums travel as integers) and the loss sum; every rank
// holds a whole replica, train.c's 4 + 8 + 8 bytes a parameter, and the activations of its
// R of the B rows.
static Figures figures(const Run* r, const Progress* pr, int R, int B) {
    long np = r->st.n;
    double acts_row = acts_bytes_per_row(&r->cfg, 0, n_units(&r->cfg), NULL), opt_bytes = r->st.m ? 8.0 : 0.0;
    Figures f = {.sent = per_step(pr, r->dp.sent), .received = per_step(pr, r->dp.received), .params = 4.0 * np,
                 .grads = 8.0 * np, .optim = opt_bytes * np, .acts = R * acts_row, .bubble = -1};
    f.sent_formula = ring_allreduce_bytes(8.0 * np + 8.0, r->dp.size);
    f.mem_formula = (4.0 + 8.0 + opt_bytes) * np + (double)B / r->dp.size * acts_row;
    return f;
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
    dist_dense_only(&o, RUN_LINE);
    dist_check_rows(&o, RUN_LINE);
    if (run.sync_weights && (o.opt.adamw || o.opt.clip > 0))
        dist_exit(2, RUN_LINE, "--sync weights works with sgd and no --clip only: AdamW's update and clipping are "
                  "not linear in the gradient, so averaging the weights of ranks that each stepped on their own "
                  "rows is not gradient averaging");
    if (run.sync_weights && run.overlap) dist_exit(2, RUN_LINE, "--overlap applies to --sync grads only");

    // data
    load_data(&run.ds, &o, &run.cfg);

    // model: a whole replica (parameters, exact gradient sums, optimizer state), activations
    Config* cfg = &run.cfg;
    long np = n_params(cfg);
    run.st = state_alloc(np, o.opt.adamw);
    long start = state_load(&run.st, &o, &run.ds, cfg);
    long lo, hi; // this rank's rows of every global batch
    split_range(o.batch, run.dp.size, run.dp.rank, &lo, &hi);
    work_init(&run.work, cfg, pass_rows(&o, hi - lo), NULL);
    char layout[128];
    snprintf(layout, sizeof layout, "data parallel over %d ranks (%ld rows each at most), %s%s", run.dp.size,
             hi - lo, run.sync_weights ? "weights averaged" : "gradients all-reduced",
             run.overlap ? " in buckets during backward" : "");
    if (!o.quiet && world_rank == 0) print_config(&o, &run.ds, layout);

    // training loop
    int B = o.batch, R = (int)(hi - lo);
    Progress progress = progress_start(&o, world_rank == 0, save, &run, dist_any);
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        Rows batch = training_rows(&run.ds, o.seed, step, 0);
        long n = dataset_batch_targets(&run.ds, o.seed, step, B); // of the whole batch, on every rank
        int64_t loss = forward(&run, &batch, lo, R, B, NULL); // this rank's rows
        fix_zero(run.st.grads, np);
        if (run.overlap) {
            dp_backward_overlap(&run, R, B);
        } else {
            model_backward(cfg, run.st.params, run.st.grads, &run.work, R, B);
            if (!run.sync_weights) group_allreduce(&run.dp, run.st.grads, np, MPI_INT64_T, MPI_SUM); // exact
        }
        group_allreduce(&run.dp, &loss, 1, MPI_INT64_T, MPI_SUM);
        if (run.sync_weights) {
            dp_step_sync_weights(&run, &o.opt, np, n, step);
        } else { // every rank holds the whole summed gradient: the norm needs no communication
            float scale = clip_factor(&o.opt, &(GradSpan){run.st.grads, np}, 1, n, NULL, NULL);
            optimizer_step(&o.opt, run.st.params, run.st.grads, run.st.m, run.st.v, np, grad_factor(n), scale, step);
        }
        if (step_end(&progress, step, fix_to(loss) / n, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, R, B);
    Report rep = {"train_dp.c", layout, sent_words, mem_words};
    free(dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run));
    run_free(&run);
    MPI_Finalize();
    return 0;
}
