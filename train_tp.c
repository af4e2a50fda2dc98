/*
 * train_tp.c: tensor parallel (Megatron-style). Every rank sees the whole batch and holds
 * a slice of every layer. Linear layers come in pairs: a column-parallel layer (each rank
 * computes some of the outputs) feeds a row-parallel one (each rank holds the matching
 * inputs and computes a partial sum of every output). The embedding and, when the last
 * layer is column-parallel, the softmax cross-entropy are split by vocabulary. It prints
 * exactly what train.c prints for the same flags.
 *
 *             f                column-parallel             row-parallel                g
 *   x ---> [fwd: identity] ---> Y_r = x A[:, r] -> ReLU -> Z_r = Y_r B[r, :] ---> [fwd: all-reduce] ---> Z + b
 *          [bwd: all-reduce]    (rank r: columns r of A)  (rank r: rows r of B)    [bwd: identity]
 *
 *   f and g are conjugate: f is the identity forward and an all-reduce backward (the
 *   input gradient of a column-parallel layer is a partial sum on each rank), g the
 *   reverse (the output of a row-parallel layer is). One all-reduce each way per pair.
 *
 * Per rank and step, N ranks, batch B (every rank takes every row; exact sums travel as 8 B):
 *   sent    2(N-1)/N x (4 B x B x T x E for the embedding
 *                       + 8 B x B x (each row-parallel layer's outputs + each column-parallel layer's inputs)
 *                       + 16 B x B when the loss is split by vocabulary)
 *   memory  (4 + 8, + 8 with AdamW) B x (P/N + the row-parallel biases, held whole) + activations
 *
 *   make train_tp && mpirun -n 2 ./train_tp              # --oversubscribe for more ranks than cores
 *   mpirun -n 3 ./train_tp --layers 2                    # the logits split by vocabulary too
 *
 * Compare with ./train: the same losses, names and final checkpoint, whatever N.
 *
 * Sections: the strategy (slices; f and g; column- and row-parallel linear layers;
 * vocabulary-parallel embedding and loss; the model's units); the state of one run; the
 * forward and backward passes, and the figures; main.
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// the strategy: slices of every layer
//
// Column-parallel layer (odd l, model.h's linear_kind): rank r holds the columns (outputs)
// of its slice of W_l and b_l, and computes those outputs from the whole input.
// Row-parallel layer (even l): rank r holds the rows of W_l for the inputs it computed in
// the layer before, so its output is a partial sum, completed by g; the bias, held whole
// by every rank, is added once after.
// Both split sums are exact (kernels.h), so the all-reduces give train.c's bits.
//
// Sizes N does not divide are padded: the hidden size 64 on 3 ranks becomes 3 slices of 22,
// the vocabulary of 27 on 2 ranks 2 slices of 14. Padded units have zero weights and zero
// gradients for ever; padded logits never take part in the softmax.
//
// The functions below take a unit's parameters as a pointer, so train_3d.c runs them on
// parameters that FSDP has just gathered.

typedef struct {
    Group* tp;
    int hs, vs;                     // slice of the hidden units and of the vocabulary per rank (padded)
    int k[MAX_LAYERS + 2];          // linear layer l on this rank: weight [k][j], bias [j]
    int j[MAX_LAYERS + 2];
    long size[MAX_LAYERS + 2];      // parameters of unit u on this rank
    long off[MAX_LAYERS + 3];       // unit u in this rank's parameters
    float* probs;                   // [rows][V] the whole vocabulary's probabilities, for sampling
    float* gathered;                // [tp size][rows][vs] the slices, gathered
} Tp;

static int tp_column(int l) { return linear_kind(l) == COLUMN_PARALLEL; }

static void tp_init(Tp* t, Group* tp, const Config* c, int rows) {
    memset(t, 0, sizeof *t);
    t->tp = tp;
    t->hs = (c->hidden + tp->size - 1) / tp->size;
    t->vs = (c->vocab + tp->size - 1) / tp->size;
    t->size[0] = (long)t->vs * c->emb;
    for (int l = 1; l <= c->layers + 1; l++) {
        int out_slice = l == c->layers + 1 ? t->vs : t->hs;
        t->k[l] = tp_column(l) ? linear_in(c, l) : t->hs;
        t->j[l] = tp_column(l) ? out_slice : linear_out(c, l);
        t->size[l] = (long)t->k[l] * t->j[l] + t->j[l];
    }
    for (int u = 0; u < n_units(c); u++) t->off[u + 1] = t->off[u] + t->size[u];
    t->probs = mallocCheck((size_t)rows * c->vocab * sizeof(float));
    t->gathered = mallocCheck((size_t)tp->size * rows * t->vs * sizeof(float));
}
// Width of unit u's output on this rank: a column-parallel layer's is its slice.
static void tp_widths(const Tp* t, const Config* c, int* width) {
    for (int u = 0; u < n_units(c); u++) width[u] = u == 0 ? unit_width(c, 0) : (tp_column(u) ? t->j[u] : linear_out(c, u));
}
static void tp_free(Tp* t) {
    free(t->probs);
    free(t->gathered);
}

// First vocabulary entry of this rank's slice.
static int tp_v_lo(const Tp* t) { return t->tp->rank * t->vs; }

// Element e of unit u on this rank, as an element of unit u in train.c's layout, or -1 for
// padding. Initialisation, checkpoints and the gradient norm all go through it.
static long tp_canonical(const Tp* t, const Config* c, int u, long e) {
    int r = t->tp->rank;
    if (u == 0) {
        long v = r * t->vs + e / c->emb;
        return v < c->vocab ? v * c->emb + e % c->emb : -1;
    }
    int K = linear_in(c, u), J = linear_out(c, u), kl = t->k[u], jl = t->j[u];
    long nw = (long)kl * jl;
    if (tp_column(u)) { // columns [r*jl, (r+1)*jl) of W and of b
        long col = r * (long)jl + (e < nw ? e % jl : e - nw);
        if (col >= J) return -1;
        return e < nw ? (e / jl) * J + col : (long)K * J + col;
    }
    if (e >= nw) return (long)K * J + (e - nw); // the bias, held whole
    long row = r * (long)kl + e / jl;           // rows [r*kl, (r+1)*kl) of W
    return row < K ? row * J + e % jl : -1;
}
// Elements of unit u this rank counts in the gradient norm: all, except that a
// row-parallel layer's bias, held whole by every rank, is counted by rank 0 alone.
static long tp_counted(const Tp* t, int u) {
    return u > 0 && !tp_column(u) && t->tp->rank != 0 ? (long)t->k[u] * t->j[u] : t->size[u];
}

// f and g, the conjugate operators around a pair of layers (Megatron's
// copy_to_tensor_model_parallel_region and reduce_from_tensor_model_parallel_region):
//   f: identity in forward; in backward an all-reduce of the input gradient, which each
//      rank computed as a partial sum over its own slice of outputs
//   g: in forward an all-reduce of the output, which each rank computed as a partial sum
//      over its own slice of inputs; identity in backward
// Both all-reduce exact partial sums (int64, kernels.h), so the sum has the same bits in
// any order: they are the two group_allreduce lines below.

// Column-parallel linear layer u: this rank's outputs Y[:, slice] = X W[:, slice] + b[slice],
// whole sums from the whole input (f's forward is the identity). Backward: the input
// gradient sums over every output, so each rank's partial sum over its own is completed by
// f's all-reduce; its weight and bias gradients are its own.
static void column_parallel_forward(Tp* t, int u, const float* w, const float* in, float* out, int R, Workspace* ws) {
    int K = t->k[u], J = t->j[u];
    linear_forward(out, in, w, w + (long)K * J, R, K, J, ws);
}
static void column_parallel_backward_input(Tp* t, const Config* c, int u, const float* w, Scratch* s, int R,
                                           Workspace* ws) {
    int K = t->k[u], J = t->j[u];
    linear_backward_input_partial(s->acc, s->dout, w, R, K, J, linear_out(c, u), ws); // over this rank's outputs
    group_allreduce(t->tp, s->acc, (long)R * K, MPI_INT64_T, MPI_SUM);                 // f (backward)
    linear_backward_input_finish(s->din, s->acc, R, K);
}
// Row-parallel linear layer u: Z = g(X[:, slice] W[slice, :]) + b, the partial sums over
// this rank's inputs completed by g's all-reduce, the bias added once after. Backward: the
// gradient of this rank's inputs needs only its rows of W (g's backward is the identity).
static void row_parallel_forward(Tp* t, const Config* c, int u, const float* w, const float* in, float* out,
                                 Scratch* s, int R, Workspace* ws) {
    int K = t->k[u], J = t->j[u];
    linear_forward_partial(s->acc, in, w, R, K, J, linear_in(c, u), ws); // over this rank's inputs
    group_allreduce(t->tp, s->acc, (long)R * J, MPI_INT64_T, MPI_SUM);    // g (forward)
    linear_forward_finish(out, s->acc, w + (long)K * J, R, J);
}
static void row_parallel_backward_input(Tp* t, int u, const float* w, Scratch* s, int R, Workspace* ws) {
    linear_backward_input(s->din, s->dout, w, R, t->k[u], t->j[u], ws);
}
// Either kind's weight and bias gradients: from its own inputs and outputs, no communication.
static void parallel_linear_backward_weight(Tp* t, int u, int64_t* g, const float* in, const float* dout, int R,
                                            long batch, Workspace* ws) {
    int K = t->k[u], J = t->j[u];
    linear_backward_weight(g, g + (long)K * J, in, dout, R, K, J, batch, ws);
}

// Vocabulary-parallel embedding: rank r holds the table rows of its slice of the vocabulary,
// looks up the tokens it holds and writes zeros for the others; an all-reduce adds them
// (each position has one non-zero contribution, so the float sum is exact).
static void vocab_parallel_embedding_forward(Tp* t, const Config* c, const float* w, Acts* a, int R) {
    embedding_forward(a->out[0], a->tokens, w, tp_v_lo(t), tp_v_lo(t) + t->vs, R, c->context, c->emb);
    group_allreduce(t->tp, a->out[0], (long)R * c->context * c->emb, MPI_FLOAT, MPI_SUM);
}

// Softmax cross-entropy over logits [R][J]: when the last layer is column-parallel, rank r
// holds the logits of its slice of the vocabulary, and the loss never gathers them: an
// all-reduce of the row maxima, one of the target logits and one of the (exact) sums of
// exponentials. When it is row-parallel every rank holds all the logits already.
static void vocab_parallel_cross_entropy(Tp* t, const Config* c, int u, Acts* a, int R, long rows_total) {
    int split = tp_column(u), J = t->j[u], v_lo = split ? tp_v_lo(t) : 0;
    float* logits = a->out[u];
    xent_rowmax(a->rowmax, logits, R, J, v_lo, c->vocab);
    xent_target_logit(a->tlogit, logits, a->targets, R, J, v_lo);
    if (split) {
        group_allreduce(t->tp, a->rowmax, R, MPI_FLOAT, MPI_MAX);
        group_allreduce(t->tp, a->tlogit, R, MPI_FLOAT, MPI_SUM); // one rank holds each target
    }
    xent_expsum(a->expsum, logits, logits, a->rowmax, R, J, v_lo, c->vocab);
    if (split) group_allreduce(t->tp, a->expsum, R, MPI_INT64_T, MPI_SUM); // exact
    a->loss = xent_finish(logits, a->expsum, a->rowmax, a->tlogit, a->targets, R, J, rows_total);
}

// Forward of unit u over R rows, with this rank's slice of its parameters at w.
static void tp_unit_forward(Tp* t, const Config* c, int u, const float* w, Acts* a, Scratch* s, int R,
                            long rows_total, Workspace* ws) {
    double t0 = trace_clock();
    if (u == 0) {
        vocab_parallel_embedding_forward(t, c, w, a, R);
    } else {
        if (tp_column(u)) column_parallel_forward(t, u, w, a->out[u - 1], a->out[u], R, ws);
        else row_parallel_forward(t, c, u, w, a->out[u - 1], a->out[u], s, R, ws);
        if (u <= c->layers) relu_forward(a->out[u], (long)R * t->j[u]);
        else vocab_parallel_cross_entropy(t, c, u, a, R, rows_total);
    }
    trace_event("compute", t0, trace_clock(), 0, "forward %s", unit_name(c, u));
}

// Backward of unit u, in two halves as model.h's unit_backward: the input half reads
// s->dout and writes the input gradient (whole after a column-parallel layer, this rank's
// slice after a row-parallel one, which is what the layer below holds) to s->din; the
// weight half adds this rank's parameter gradients into g.
static void tp_unit_backward_input(Tp* t, const Config* c, int u, const float* w, Acts* a, Scratch* s, int R,
                                   Workspace* ws) {
    if (u == 0) return;
    double t0 = trace_clock();
    if (u == c->layers + 1) xent_backward(s->dout, a->out[u], a->targets, R, t->j[u], tp_column(u) ? tp_v_lo(t) : 0);
    else relu_backward(s->dout, a->out[u], (long)R * t->j[u]);
    if (tp_column(u)) column_parallel_backward_input(t, c, u, w, s, R, ws);
    else row_parallel_backward_input(t, u, w, s, R, ws);
    trace_event("compute", t0, trace_clock(), 0, "input gradient %s", unit_name(c, u));
}
static void tp_unit_backward_weight(Tp* t, const Config* c, int u, int64_t* g, const Acts* a, const float* dout, int R,
                                    long batch, Workspace* ws) {
    double t0 = trace_clock();
    if (u == 0) embedding_backward(g, a->tokens, dout, tp_v_lo(t), tp_v_lo(t) + t->vs, R, c->context, c->emb, batch);
    else parallel_linear_backward_weight(t, u, g, a->out[u - 1], dout, R, batch, ws);
    trace_event("compute", t0, trace_clock(), 0, "weight gradient %s", unit_name(c, u));
}
static void tp_unit_backward(Tp* t, const Config* c, int u, const float* w, int64_t* g, Acts* a, Scratch* s, int R,
                             long batch, Workspace* ws) {
    tp_unit_backward_input(t, c, u, w, a, s, R, ws);
    tp_unit_backward_weight(t, c, u, g, a, s->dout, R, batch, ws);
}

// The whole vocabulary's probabilities of the last forward, on every rank (for sampling).
static const float* tp_probs(Tp* t, const Config* c, const Acts* a, int R) {
    int u = c->layers + 1;
    if (!tp_column(u)) return a->out[u];
    group_allgather(t->tp, a->out[u], t->gathered, (long)R * t->vs, MPI_FLOAT);
    for (int q = 0; q < t->tp->size; q++)
        for (int r = 0; r < R; r++)
            for (int c0 = 0; c0 < t->vs && q * t->vs + c0 < c->vocab; c0++)
                t->probs[(long)r * c->vocab + q * t->vs + c0] = t->gathered[((long)q * R + r) * t->vs + c0];
    return t->probs;
}

// What tensor parallelism sends per step from each rank, by the textbook ring formula, for
// R rows through units [u_lo, u_hi): an all-reduce of the embedding (4 B per element), of
// every row-parallel layer's output and every column-parallel layer's input gradient
// (8 B: exact sums), and, with the vocabulary split, of the loss's three pieces per row.
static double tp_sent_formula(const Tp* t, const Config* c, int u_lo, int u_hi, double R) {
    double bytes = 0;
    for (int u = u_lo; u < u_hi; u++) {
        if (u == 0) bytes += 4.0 * R * c->context * c->emb;
        else bytes += 8.0 * R * (tp_column(u) ? linear_in(c, u) : linear_out(c, u));
        if (u == c->layers + 1 && tp_column(u)) bytes += (4 + 4 + 8) * R;
    }
    return ring_allreduce_bytes(bytes, t->tp->size);
}
// The parameters a rank holds by the textbook: 1/N of every split tensor, and every
// row-parallel bias whole.
static double tp_params_formula(const Tp* t, const Config* c, int u_lo, int u_hi) {
    double n = 0;
    for (int u = u_lo; u < u_hi; u++) {
        double weights = u == 0 ? (double)c->vocab * c->emb : (double)linear_in(c, u) * linear_out(c, u);
        double bias = u == 0 ? 0 : linear_out(c, u);
        n += (weights + (u > 0 && tp_column(u) ? bias : 0)) / t->tp->size + (u > 0 && !tp_column(u) ? bias : 0);
    }
    return n;
}

#ifndef TRAIN_3D // the rest of this file is the program; train_3d.c uses only the strategy above

#define RUN_LINE "mpirun -n 2 ./train_tp"

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    Dataset ds;     // the data
    Tp t;
    State st;       // this rank's slices of every unit (tp_canonical maps them), their state
    Work work;
    Group tp;       // every rank
    Holding mine;   // what this rank holds of the model, for checkpoints
} Run;

static void run_free(Run* r) {
    dataset_free(&r->ds), state_free(&r->st), tp_free(&r->t), work_free(&r->work);
}

// Element e of unit u here, in train.c's layout (ckpt.h's Holding).
static long canonical(const void* ctx, int u, long e) {
    const Run* r = ctx;
    return tp_canonical(&r->t, &r->cfg, u, e);
}

// ----------------------------------------------------------------------------
// the forward and backward passes: every rank takes every row, through its slices

static int64_t forward(void* ctx, const Rows* rows, long first, int R, long rows_total, float* probs) {
    Run* r = ctx;
    const Config* c = &r->cfg;
    Acts* a = work_load(&r->work, rows, first, R, c->context);
    for (int u = 0; u < n_units(c); u++)
        tp_unit_forward(&r->t, c, u, r->st.params + r->t.off[u], a, &r->work.scratch, R, rows_total, &r->work.ws);
    if (probs) memcpy(probs, tp_probs(&r->t, c, a, R), (size_t)R * c->vocab * sizeof(float));
    return a->loss; // every rank holds the whole loss
}
static void backward(Run* r, int R, long B) {
    for (int u = n_units(&r->cfg) - 1; u >= 0; u--) {
        tp_unit_backward(&r->t, &r->cfg, u, r->st.params + r->t.off[u], r->st.grads + r->t.off[u], &r->work.acts,
                         &r->work.scratch, R, B, &r->work.ws);
        scratch_step_down(&r->work.scratch);
    }
}

// Mean loss over the whole validation split (every rank takes every row).
static double validation_loss(void* ctx) {
    Run* r = ctx;
    return mean_loss(evaluate(forward, r, &r->ds, 1, 0), &r->ds);
}

// The formulas of figures(), in words, for the report.
static const char sent_words[] = "2(N-1)/N x (4 B x B x T x E + 8 B x B x (every split sum's width))";
static const char mem_words[] = "(4 + 8 + 8 AdamW) B x (P/N + the row-parallel biases) + activations";

// What this rank sent and holds, each beside its formula: every rank takes every row,
// and a column-parallel layer's activations are its slice.
static Figures figures(const Run* r, const Progress* pr, const Optimizer* opt, const int* width, int B) {
    const Config* c = &r->cfg;
    long np = r->st.n;
    double acts_row = acts_bytes_per_row(c, 0, n_units(c), width), opt_bytes = opt->adamw ? 8.0 : 0.0;
    Figures f = {.sent = per_step(pr, r->tp.sent), .received = per_step(pr, r->tp.received), .params = 4.0 * np,
                 .grads = 8.0 * np, .optim = opt_bytes * np, .acts = B * acts_row, .bubble = -1};
    f.sent_formula = tp_sent_formula(&r->t, c, 0, n_units(c), B) + (opt->clip > 0 ? ring_allreduce_bytes(4 + 8, r->tp.size) : 0);
    f.mem_formula = (4.0 + 8.0 + opt_bytes) * tp_params_formula(&r->t, c, 0, n_units(c)) + B * acts_row;
    return f;
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    Run run = {.tp = group_world("tp")};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, NULL, 0, NULL, NULL);
    dist_dense_only(&o, RUN_LINE);
    if (world_size > o.model.hidden)
        dist_exit(2, RUN_LINE, "%d ranks but a hidden size of %d: every rank needs at least one hidden unit "
                  "(raise --hidden or use fewer ranks)", world_size, o.model.hidden);

    // data
    load_data(&run.ds, &o, &run.cfg);
    if (world_size > run.ds.vocab)
        dist_exit(2, RUN_LINE, "%d ranks but a vocabulary of %d tokens: every rank needs at least one", world_size,
                  run.ds.vocab);

    // model: this rank's slice of every unit, its exact gradient sums and optimizer state
    Config* cfg = &run.cfg;
    int rows = pass_rows(&o, o.batch);
    tp_init(&run.t, &run.tp, cfg, rows);
    long np = run.t.off[n_units(cfg)];
    run.st = state_alloc(np, o.opt.adamw);
    run.mine = (Holding){.canonical = canonical, .ctx = &run};
    GradSpan spans[MAX_LAYERS + 2];
    for (int u = 0; u < n_units(cfg); u++) {
        long off = run.t.off[u];
        run.mine.n[u] = run.t.size[u];
        run.mine.at[0][u] = run.st.params + off, run.mine.at[1][u] = run.st.m ? run.st.m + off : NULL;
        run.mine.at[2][u] = run.st.v ? run.st.v + off : NULL;
        spans[u] = (GradSpan){run.st.grads + off, tp_counted(&run.t, u)};
    }
    long start = holding_load(&run.mine, &o, &run.ds, cfg);
    int width[MAX_LAYERS + 2];
    tp_widths(&run.t, cfg, width);
    work_init(&run.work, cfg, rows, width);
    char layout[160];
    snprintf(layout, sizeof layout, "tensor parallel over %d ranks: hidden slices of %d%s, vocabulary slices of %d",
             run.tp.size, run.t.hs, run.t.hs * run.tp.size > cfg->hidden ? " (padded)" : "", run.t.vs);
    if (!o.quiet && world_rank == 0) print_config(&o, &run.ds, layout);

    // training loop
    int B = o.batch;
    Progress progress = progress_start(&o, world_rank == 0, dist_save, &(DistSave){&run.mine, &run.ds, &run.cfg}, dist_any);
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        Rows batch = training_rows(&run.ds, o.seed, step, 0);
        int64_t loss = forward(&run, &batch, 0, B, B, NULL); // every rank takes every row
        fix_zero(run.st.grads, np);
        backward(&run, B, B);
        float scale = clip_factor(&o.opt, spans, n_units(cfg), B, group_norm, &run.tp); // over every slice
        optimizer_step(&o.opt, run.st.params, run.st.grads, run.st.m, run.st.v, np, grad_factor(B), scale, step);
        if (step_end(&progress, step, fix_to(loss) / B, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, &o.opt, width, B);
    Report rep = {"train_tp.c", layout, sent_words, mem_words};
    free(dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run));
    run_free(&run);
    MPI_Finalize();
    return 0;
}

#endif // TRAIN_3D
