/*
 * train_dp.c: data parallel. Every rank holds a whole replica of the model and takes a
 * share of every global batch; after backward one all-reduce sums the gradients across
 * ranks, and every rank takes the same optimizer step. It prints exactly what train.c
 * prints for the same flags: the same loss at every step, the same final parameters bit
 * for bit, the same names.
 *
 *                       global batch, B = 32 rows
 *               rows 0-15                      rows 16-31
 *   rank 0   [ whole model ]              [ whole model ]   rank 1
 *            forward, backward            forward, backward
 *            grads: exact sums  <-- all-reduce (sum) -->  grads: exact sums
 *            optimizer step               optimizer step    (the same on both)
 *
 * One step (train_step), in the order it communicates:
 *   1. forward and backward on this rank's rows      nothing sent
 *   2. all-reduce (sum) the P gradient sums          after backward, or during it (--overlap)
 *   3. all-reduce (sum) the loss sum                 one number
 *   4. the optimizer step, the same on every rank    nothing sent
 *
 *   make train_dp && mpirun -n 2 ./train_dp           # --oversubscribe: more ranks than cores
 *   mpirun -n 3 --oversubscribe ./train_dp --overlap  # all-reduce buckets during backward
 *   mpirun -n 2 ./train_dp --sync weights             # average the weights instead (SGD only)
 *
 * Compare with ./train: the same losses, names and final checkpoint, whatever N.
 *
 * The first read, down to its end marker: the gradients all-reduced after backward, then in
 * buckets during it, then one training step. After it, a section each for --sync weights,
 * --microbatches and the formulas; then the plumbing (validation, options, main).
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"

#define RUN_LINE "mpirun -n 2 ./train_dp"

// ----------------------------------------------------------------------------
// the state of one run

typedef struct Run Run;
struct Run {
    Config cfg;
    Dataset ds;
    State st;       // a whole replica, identical on every rank: parameters, gradient sums, m, v
    Work work;      // activations (of this rank's rows), scratch, kernel workspace
    Group dp;       // every rank
    void (*backward)(Run* r, int R, long B); // how the gradients are summed: main chooses it once
    int overlap;       // --overlap
    long bucket_bytes; // --bucket-kb
    int sync_weights;  // --sync weights
    int M;             // --microbatches
    GradSums sums;     // --reduce: how the ranks' and microbatches' gradient sums are added (optim.h)
};

// ----------------------------------------------------------------------------
// the gradients all-reduced after backward
//
// The global batch of B rows is cut into contiguous shares (32 rows on 3 ranks: 11, 11, 10).
// Each rank sums its own rows' gradients exactly, and the all-reduce adds those sums. The
// optimizer then divides once by n, the whole batch's targets, so every row weighs the same.
// (Averaging the ranks' mean gradients instead would weigh the 10 rows more than the 11.)
// The sums are 64-bit integers (kernels.h), so any order of addition gives the same bits.
// --reduce fp32 or bf16 sends floats instead, to show what that costs (its chapter in optim.h).

static void backward_allreduce(Run* r, int R, long B) {
    model_backward(&r->cfg, r->st.params, r->st.grads, &r->work, R, B); // sums over this rank's R rows
    GradSend w = grads_to_send(&r->sums, r->st.grads, 0, r->st.n); // the int64 sums (--reduce: floats)
    group_allreduce(&r->dp, w.buf, r->st.n, w.type, MPI_SUM);   // + every other rank's: all B rows
}

// ----------------------------------------------------------------------------
// --overlap: the same all-reduce, in buckets, while backward runs
//
// Backward finishes the gradients one unit at a time, from the last unit down. A bucket is
// the whole units finished since the last bucket, so it is one contiguous range of the
// gradient array. Once it holds --bucket-kb, or backward is done, a non-blocking all-reduce
// sends it while backward goes on below. The exact sums are backward_allreduce's, only sent
// sooner (on 2 cores that is slower: docs/dp.md). --reduce's floats on 3 or more ranks are
// not: MPI's own all-reduce adds them, in an order the buckets change.
//
// The loop is model.h's model_backward with a bucket test added after each unit: per unit,
// unit_recompute rebuilds what --recompute dropped, unit_backward adds the unit's gradients,
// and scratch_step_down makes its input gradient the next unit's output gradient.

static void backward_overlap(Run* r, int R, long B) {
    const Config* c = &r->cfg;
    MPI_Request requests[MAX_LAYERS + 2]; // one a bucket, at most one a unit: n_units = layers + 2
    int n_buckets = 0;
    long top = r->st.n; // the bucket being filled: gradients [unit_offset(c, u), top)
    for (int u = n_units(c) - 1; u >= 0; u--) {
        long lo = unit_offset(c, u);
        unit_recompute(c, u, r->st.params + lo, &r->work.acts, &r->work.scratch, R, &r->work.ws); // --recompute
        unit_backward(c, u, r->st.params + lo, r->st.grads + lo, &r->work.acts, &r->work.scratch, R, B, &r->work.ws);
        scratch_step_down(&r->work.scratch);
        if ((top - lo) * (long)sizeof(int64_t) >= r->bucket_bytes || u == 0) { // the bucket is full, or the last
            GradSend w = grads_to_send(&r->sums, r->st.grads, lo, top - lo);
            group_iallreduce(&r->dp, w.buf, top - lo, w.type, MPI_SUM, &requests[n_buckets++]);
            top = lo;
        }
        // MPI advances a non-blocking collective only inside an MPI call, so each bucket gets one;
        // a finished request has become MPI_REQUEST_NULL, and testing it again just returns.
        int done;
        for (int b = 0; b < n_buckets; b++) MPI_Test(&requests[b], &done, MPI_STATUS_IGNORE);
    }
    for (int b = 0; b < n_buckets; b++) MPI_Wait(&requests[b], MPI_STATUS_IGNORE); // the optimizer reads every sum
}

// ----------------------------------------------------------------------------
// one training step

static int64_t microbatches(Run* r, const Rows* batch, long B);                // section "--microbatches", below
static void step_sync_weights(Run* r, const Optimizer* opt, long n, long step); // section "--sync weights", below

// main calls it once a step and prints the mean loss it returns. r->backward is
// backward_allreduce, or backward_overlap with --overlap.
static double train_step(Run* r, const Options* o, long step) {
    long B = o->batch, P = r->st.n;
    Rows batch = training_rows(&r->ds, o->seed, step, 0);
    long n = dataset_batch_targets(&r->ds, o->seed, step, B); // of the whole batch, on every rank
    fix_zero(r->st.grads, P);
    int64_t loss;
    if (r->M > 1) {
        loss = microbatches(r, &batch, B);
    } else {
        long first, end;
        split_range(B, r->dp.size, r->dp.rank, &first, &end); // this rank's rows
        int R = (int)(end - first);
        // Forward and backward take the global B beside R because each exact term is
        // range-checked against the sum of all B rows that the all-reduce will make.
        loss = model_forward_rows(&r->cfg, r->st.params, &r->work, &batch, first, R, B, NULL);
        r->backward(r, R, B);
    }
    grads_received(&r->sums, &r->dp, r->st.grads, step); // --reduce fp32, bf16: the floats back to int64
    group_allreduce(&r->dp, &loss, 1, MPI_INT64_T, MPI_SUM); // the loss sum over all B rows
    if (r->sync_weights) {
        step_sync_weights(r, &o->opt, n, step);
    } else { // every rank holds the whole summed gradient: the norm needs no communication
        float scale = clip_factor(&o->opt, &(GradSpan){r->st.grads, P}, 1, n, NULL, NULL);
        optimizer_step(&o->opt, r->st.params, r->st.grads, r->st.m, r->st.v, P, grad_factor(n), scale, step);
    }
    return fix_to(loss) / n;
}

// ---- first read ends here: the rest adds --sync weights, --microbatches and the formulas,
// then the plumbing: validation and checkpoints, options, main.

// ----------------------------------------------------------------------------
// --sync weights: average the weights after the step, instead of the gradients before it
//
// This chapter replaces the gradient all-reduce by one of the parameters after the step.
// Each rank steps on its own rows' gradient sums alone, scaled by N / n instead of 1 / n, so
// the mean of the N ranks' new parameters is train.c's update. The parameters are then
// averaged: an exact sum, divided by N, rounded once. With SGD that equals train.c's update
// in exact arithmetic, but not bit for bit: each rank rounds its own step before the average,
// so the last bits differ from step 2 on (docs/exactness.md). With AdamW or clipping it is
// not even the same update, so main refuses them.

static void backward_own_rows(Run* r, int R, long B) { // r->backward under --sync weights
    model_backward(&r->cfg, r->st.params, r->st.grads, &r->work, R, B);
}

static void step_sync_weights(Run* r, const Optimizer* opt, long n, long step) {
    long P = r->st.n;
    int N = r->dp.size;
    optimizer_step(opt, r->st.params, r->st.grads, r->st.m, r->st.v, P, grad_factor(n) * N, 1.0f, step);
    int64_t* sum = r->st.grads; // the gradients are spent: their buffer takes the exact sum
    for (long i = 0; i < P; i++) sum[i] = fix_from(r->st.params[i]);
    group_allreduce(&r->dp, sum, P, MPI_INT64_T, MPI_SUM);
    for (long i = 0; i < P; i++) r->st.params[i] = (float)(fix_to(sum[i]) / N);
}

// ----------------------------------------------------------------------------
// --microbatches: the batch in M pieces, one after another, and still one all-reduce a step
//
// This chapter splits the step's forward and backward into M passes over smaller pieces.
// Each microbatch adds its rows' gradients to the same exact sums, so after the last one they
// are the whole batch's, as in train.c. Only the last one's backward sums them across ranks.

static int64_t microbatches(Run* r, const Rows* batch, long B) {
    int64_t loss = 0;
    for (int m = 0; m < r->M; m++) {
        long first;
        int R = microbatch_rows(B, r->M, m, r->dp.size, r->dp.rank, &first); // this rank's rows of microbatch m
        loss += model_forward_rows(&r->cfg, r->st.params, &r->work, batch, first, R, B, NULL);
        if (m < r->M - 1) {
            model_backward(&r->cfg, r->st.params, r->st.grads, &r->work, R, B);
            grad_sums_add(&r->sums, r->st.grads, 0, r->st.n); // --reduce fp32, bf16: a piece added in that type
        } else {
            r->backward(r, R, B);
        }
    }
    return loss;
}

// ----------------------------------------------------------------------------
// the formulas: what a rank sends and holds, beside what it measured (the report's figures)
//
// This chapter predicts what the report measures, per rank and step, on N ranks, for P
// parameters (18,635 in the default model: docs/model.md). The gradients' all-reduce sends
// 8 B a sum (4 or 2 with --reduce fp32 or bf16), the loss's 8 B more; a ring all-reduce sends
// 2(N-1)/N of its buffer.
//   sent   = ring x 8 B x P + ring x 8 B     ring = 2(N-1)/N
//          = 1 x 8 B x 18,636 = 149.1 KB     (the default, N = 2)
//   memory = (4 + 8 + adam) B x P + acts     4 B a parameter, 8 a gradient sum, adam = 8 for
//                                            AdamW's m and v (else 0); acts: the activations
//                                            of this rank's rows of a microbatch

static Figures figures(const Run* r, const Progress* pr, int R, int B) {
    long P = r->st.n;
    int N = r->dp.size;
    double acts_row = acts_bytes_per_row(&r->cfg, 0, n_units(&r->cfg), NULL), adam = r->st.m ? 8.0 : 0.0;
    Figures f = {.sent = per_step(pr, r->dp.sent), .received = per_step(pr, r->dp.received), .params = 4.0 * P,
                 .grads = 8.0 * P + grad_sums_bytes(&r->sums), .optim = adam * P, .acts = R * acts_row, .bubble = -1};
    f.sent_formula = ring_allreduce_bytes(wire_bytes(&r->sums) * P + 8.0, N);
    long mb = (B + r->M - 1) / r->M; // the largest microbatch, its rows shared by the N ranks
    f.mem_formula = (4.0 + 8.0 + adam) * P + grad_sums_bytes(&r->sums) + (double)((mb + N - 1) / N) * acts_row;
    return f;
}

static void formula_words(const Run* r, char* sent, char* mem, int size) {
    snprintf(sent, size, "2(N-1)/N x (%.0f B x P gradients + 8 B loss), P = %ld", wire_bytes(&r->sums), r->st.n);
    snprintf(mem, size, "(4 + 8 + 8 with AdamW%s) B x P + activations of ceil(ceil(B/M)/N) rows, a microbatch's share",
             r->sums.how == REDUCE_FP32 ? " + 12 with --reduce fp32" : r->sums.how == REDUCE_BF16 ? " + 14 with --reduce bf16" : "");
}

// ----------------------------------------------------------------------------
// plumbing: validation, sampling and checkpoints

// model.h's ForwardFn: train.c's forward pass, on this rank's rows.
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

// --save: this run's checkpoint at `step` (every rank calls it)
static void save(void* ctx, const Options* o, long step) {
    Run* r = ctx;
    if (world_rank == 0) ckpt_save(o, &r->ds, &r->cfg, step, &r->st); // every rank holds the same replica: one writes it
}

static void run_free(Run* r) {
    dataset_free(&r->ds), state_free(&r->st), work_free(&r->work), grad_sums_free(&r->sums);
}

// ----------------------------------------------------------------------------
// plumbing: options of this program

static const CliFlag dp_flags[] = {
    {"overlap", NULL, "all-reduce gradients in buckets while backward runs"},
    {"bucket-kb", "N", "bucket size for --overlap, in KiB of gradients (default 64)"},
    {"sync", "WHAT", "grads (default): all-reduce the gradients; weights: average the weights (sgd)"},
    CLI_REDUCE_FLAG,
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
    if (index == 3) return cli_reduce(value, &r->sums.how);
    return NULL;
}

// ----------------------------------------------------------------------------
// plumbing: main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    Run run = {.bucket_bytes = 64 * 1024, .dp = group_world("dp")};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, dp_flags, 4, dp_flag, &run);
    dist_dense_only(&o, RUN_LINE);
    dist_check_rows(&o, RUN_LINE);
    if (run.sync_weights && (o.opt.adamw || o.opt.clip > 0))
        dist_exit(2, RUN_LINE, "--sync weights works with sgd and no --clip only: AdamW's update and clipping are "
                  "not linear in the gradient, so averaging the weights of ranks that each stepped on their own "
                  "rows is not gradient averaging");
    if (run.sync_weights && run.overlap) dist_exit(2, RUN_LINE, "--overlap applies to --sync grads only");
    if (run.sync_weights && run.sums.how) dist_exit(2, RUN_LINE, "--reduce applies to --sync grads only");
    run.backward = run.sync_weights ? backward_own_rows : run.overlap ? backward_overlap : backward_allreduce;

    // data
    load_data(&run.ds, &o, &run.cfg);

    // model: a whole replica (parameters, exact gradient sums, optimizer state), activations
    Config* cfg = &run.cfg;
    run.st = state_alloc(n_params(cfg), o.opt.adamw);
    grad_sums_init(&run.sums, run.sums.how, run.st.n);
    long start = state_load(&run.st, &o, &run.ds, cfg);
    int B = o.batch, M = run.M = o.microbatches;
    long first;
    int R = microbatch_rows(B, M, 0, run.dp.size, 0, &first); // the most rows a rank takes at once
    work_init(&run.work, cfg, pass_rows(&o, R), NULL);
    char layout[160];
    snprintf(layout, sizeof layout, "data parallel over %d ranks (%d rows each at most), %s%s", run.dp.size,
             R, run.sync_weights ? "weights averaged" : "gradients all-reduced",
             run.overlap ? " in buckets during backward" : "");
    if (M > 1) snprintf(layout + strlen(layout), sizeof layout - strlen(layout), "; %d microbatches", M);
    if (run.sums.how) snprintf(layout + strlen(layout), sizeof layout - strlen(layout), ", added in %s",
                               reduce_names[run.sums.how]);
    if (!o.quiet && world_rank == 0) print_config(&o, &run.ds, layout);

    // training loop
    Progress progress = progress_start(&o, world_rank == 0, save, &run, dist_any);
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        double loss = train_step(&run, &o, step);
        if (step_end(&progress, step, loss, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, R, B);
    char sent_words[128], mem_words[128];
    formula_words(&run, sent_words, mem_words, sizeof sent_words);
    Report rep = {"train_dp.c", layout, sent_words, mem_words};
    free(dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run));
    if (!o.quiet && world_rank == 0) grad_sums_print(&run.sums, run.dp.size, M, run.st.n);
    run_free(&run);
    MPI_Finalize();
    return 0;
}
