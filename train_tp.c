/*
 * train_tp.c: tensor parallel (Megatron-style). Every rank sees the whole batch and holds
 * a slice of every layer: linear layers alternate column-parallel (each rank computes some
 * of the outputs) and row-parallel (each rank holds some of the inputs and computes a
 * partial sum); the embedding and, when the last layer is column-parallel, the softmax
 * cross-entropy are split by vocabulary. It prints exactly what train.c prints for the
 * same flags.
 *
 *   make train_tp && mpirun -n 2 ./train_tp            # --oversubscribe for more ranks than cores
 *   mpirun -n 3 ./train_tp --layers 2                    # the logits split by vocabulary too
 *
 * Sections: the strategy; options; data; model; training loop; validation, sampling and report.
 */
#include "model.h"
#include "data.h"
#include "cli.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// the strategy: slices of every layer
//
//            linear 1 (column)    linear 2 (row)            linear 3 (column) ...
//   x ──┬──> [ W1[:, slice r] ] ─> [ W2[slice r, :] ] ─> all-reduce ─> + b2 ─> ...
//       │     each rank: some       each rank: a partial      sum over ranks
//       │     outputs, no comms     sum over its inputs
//
// Column-parallel layer l (l odd): rank r holds the columns (outputs) of its slice of W_l
// and b_l, and computes those outputs from the whole input: no communication. Its input
// gradient is a sum over all outputs, so each rank computes a partial sum over its own
// and an all-reduce adds them.
// Row-parallel layer l (l even): rank r holds the rows of W_l for the inputs it computed in
// layer l-1, so its output is a partial sum; an all-reduce adds them and then the bias,
// which every rank holds whole, is added once. Its input gradient needs no communication.
// Both split sums are exact (model.h), so the all-reduces give train.c's bits.
//
// Embedding: rank r holds the rows of its slice of the vocabulary, looks up the tokens it
// holds and writes zeros for the others; an all-reduce adds them (each position has one
// non-zero contribution, so the float sum is exact).
// Loss: when the last linear layer is column-parallel (L even), rank r holds the logits of
// its slice of the vocabulary and the cross-entropy never gathers them: an all-reduce of the
// row maxima, one of the target logits and one of the (exact) sums of exponentials.
// When it is row-parallel (L odd) every rank holds all the logits after the all-reduce.
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

static int tp_column(int l) { return !forward_sum_is_split(l); } // odd layers: column-parallel

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
// Whether element e of unit u is held whole by every rank (a row-parallel bias): the
// gradient norm counts it on one rank only.
static int tp_replicated(const Tp* t, int u, long e) {
    return u > 0 && !tp_column(u) && e >= (long)t->k[u] * t->j[u];
}

// Forward of unit u over R rows, with this rank's slice of its parameters at w.
static void tp_forward_(Tp* t, const Config* c, int u, const float* w, Acts* a, Scratch* s, int R, long rows_total,
                        Workspace* ws);
static void tp_backward_(Tp* t, const Config* c, int u, const float* w, int64_t* g, Acts* a, Scratch* s, int R,
                         long batch, Workspace* ws);
static void tp_forward(Tp* t, const Config* c, int u, const float* w, Acts* a, Scratch* s, int R, long rows_total,
                       Workspace* ws) {
    double t0 = trace_on ? now_seconds() : 0;
    tp_forward_(t, c, u, w, a, s, R, rows_total, ws);
    trace_event("compute", t0, trace_on ? now_seconds() : 0, 0, "forward %s", unit_name(c, u));
}
static void tp_backward(Tp* t, const Config* c, int u, const float* w, int64_t* g, Acts* a, Scratch* s, int R,
                        long batch, Workspace* ws) {
    double t0 = trace_on ? now_seconds() : 0;
    tp_backward_(t, c, u, w, g, a, s, R, batch, ws);
    trace_event("compute", t0, trace_on ? now_seconds() : 0, 0, "backward %s", unit_name(c, u));
}
static void tp_forward_(Tp* t, const Config* c, int u, const float* w, Acts* a, Scratch* s, int R, long rows_total,
                        Workspace* ws) {
    int T = c->context, E = c->emb;
    if (u == 0) {
        embedding_forward(a->out[0], a->tokens, w, tp_v_lo(t), tp_v_lo(t) + t->vs, R, T, E);
        // each position was looked up by the one rank holding its token: add them up
        group_allreduce(t->tp, a->out[0], (long)R * T * E, MPI_FLOAT, MPI_SUM);
        return;
    }
    int K = t->k[u], J = t->j[u];
    const float *in = a->out[u - 1], *bias = w + (long)K * J;
    float* out = a->out[u];
    if (tp_column(u)) {
        linear_forward(out, in, w, bias, R, K, J, ws); // this rank's outputs, whole sums
    } else {
        fix_zero(s->acc, (long)R * J);
        linear_forward_exact(s->acc, in, w, R, K, J, linear_in(c, u), ws);
        // partial sums over this rank's inputs: add them across ranks (exact), then the bias once
        group_allreduce(t->tp, s->acc, (long)R * J, MPI_INT64_T, MPI_SUM);
        linear_forward_finish(out, s->acc, bias, R, J);
    }
    if (u <= c->layers) {
        relu_forward(out, (long)R * J);
        return;
    }
    int v_lo = tp_column(u) ? tp_v_lo(t) : 0; // the logits this rank holds: a slice, or all
    xent_rowmax(a->rowmax, out, R, J, v_lo, c->vocab);
    xent_target_logit(a->tlogit, out, a->targets, R, J, v_lo);
    if (tp_column(u)) { // vocabulary-parallel: the maximum and the target logit over every slice
        group_allreduce(t->tp, a->rowmax, R, MPI_FLOAT, MPI_MAX);
        group_allreduce(t->tp, a->tlogit, R, MPI_FLOAT, MPI_SUM); // one rank holds each target
    }
    xent_expsum(a->expsum, out, out, a->rowmax, R, J, v_lo, c->vocab);
    if (tp_column(u)) group_allreduce(t->tp, a->expsum, R, MPI_INT64_T, MPI_SUM); // exact
    a->loss = xent_finish(out, a->expsum, a->rowmax, a->tlogit, R, J, rows_total);
}

// Backward of unit u: reads s->dout, adds this rank's parameter gradients into g, writes
// the input gradient (whole for a column-parallel layer, this rank's slice for a
// row-parallel one, which is what the layer below holds) to s->din.
static void tp_backward_(Tp* t, const Config* c, int u, const float* w, int64_t* g, Acts* a, Scratch* s, int R,
                         long batch, Workspace* ws) {
    if (u == 0) {
        embedding_backward(g, a->tokens, s->dout, tp_v_lo(t), tp_v_lo(t) + t->vs, R, c->context, c->emb, batch);
        return;
    }
    int K = t->k[u], J = t->j[u];
    if (u == c->layers + 1) xent_backward(s->dout, a->out[u], a->targets, R, J, tp_column(u) ? tp_v_lo(t) : 0);
    else relu_backward(s->dout, a->out[u], (long)R * J);
    linear_backward_weight(g, g + (long)K * J, a->out[u - 1], s->dout, R, K, J, batch, ws);
    if (tp_column(u)) {
        fix_zero(s->acc, (long)R * K);
        linear_backward_input_exact(s->acc, s->dout, w, R, K, J, linear_out(c, u), ws);
        // partial sums over this rank's outputs: add them across ranks (exact)
        group_allreduce(t->tp, s->acc, (long)R * K, MPI_INT64_T, MPI_SUM);
        linear_backward_input_finish(s->din, s->acc, R, K);
    } else {
        linear_backward_input(s->din, s->dout, w, R, K, J, ws); // whole sums over the outputs
    }
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

// The gradient norm's exact pieces over this rank's parameters (padding adds zeros;
// replicated biases are counted on rank 0 of the group only).
static float tp_grads_maxabs(const Tp* t, const Config* c, const int64_t* g, long batch) {
    return grads_maxabs(g, t->off[n_units(c)], batch); // replicas are equal: they do not change a max
}
static int64_t tp_grads_sumsq(const Tp* t, const Config* c, const int64_t* g, long batch, int e) {
    int64_t s = 0;
    for (int u = 0; u < n_units(c); u++) {
        long mine = t->size[u]; // a row-parallel layer's bias is held whole by every rank: count it once
        if (tp_replicated(t, u, mine - 1) && t->tp->rank != 0) mine = (long)t->k[u] * t->j[u];
        s += grads_sumsq(g + t->off[u], mine, batch, e);
    }
    return s;
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

// Unit u whole, in train.c's layout, on rank 0 of the group: every rank's slice (`mine`)
// gathered, each element put where tp_canonical says (for checkpoints).
static void tp_gather_unit(const Tp* t, const Config* c, int u, const float* mine, float* unit) {
    int me = t->tp->rank, n_ranks = t->tp->size;
    long n = t->size[u]; // every rank's slice of a unit has the same size (padded)
    float* slices = mallocCheck((size_t)n_ranks * n * sizeof(float));
    long* index = mallocCheck((size_t)n_ranks * n * sizeof(long));
    for (long e = 0; e < n; e++) index[me * n + e] = tp_canonical(t, c, u, e); // where my elements go
    MPI_Gather(mine, (int)n, MPI_FLOAT, slices, (int)n, MPI_FLOAT, 0, t->tp->comm);
    MPI_Gather(me == 0 ? MPI_IN_PLACE : index + me * n, (int)n, MPI_LONG, index, (int)n, MPI_LONG, 0, t->tp->comm);
    if (me == 0)
        for (long q = 0; q < n_ranks; q++)
            for (long e = 0; e < n; e++)
                if (index[q * n + e] >= 0) unit[index[q * n + e]] = slices[q * n + e];
    free(slices);
    free(index);
}

#ifndef TRAIN_3D // the rest of this file is the program; train_3d.c uses only the strategy above

#define RUN_LINE "mpirun -n 2 ./train_tp"
#define EVAL_ROWS 256 // validation rows per forward pass (the result does not depend on it)

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    Tp t;
    float* params;  // this rank's slices of every unit (tp_canonical maps them)
    int64_t* grads; // their exact gradient sums
    float* m;       // AdamW state (NULL for SGD)
    float* v;
    Acts acts;
    Scratch scratch;
    Workspace ws;
    Group tp;       // every rank
} Run;

static int64_t tp_model_forward(Run* r, int R, long rows_total) {
    for (int u = 0; u < n_units(&r->cfg); u++)
        tp_forward(&r->t, &r->cfg, u, r->params + r->t.off[u], &r->acts, &r->scratch, R, rows_total, &r->ws);
    return r->acts.loss;
}
static void tp_model_backward(Run* r, int R, long B) {
    for (int u = n_units(&r->cfg) - 1; u >= 0; u--) {
        tp_backward(&r->t, &r->cfg, u, r->params + r->t.off[u], r->grads + r->t.off[u], &r->acts, &r->scratch, R, B,
                    &r->ws);
        float* tmp = r->scratch.dout;
        r->scratch.dout = r->scratch.din;
        r->scratch.din = tmp;
    }
}

// This rank's slices, initialised directly with the values train.c uses (padding: zero),
// or read from a checkpoint one unit at a time. Returns the step to resume after.
static long tp_load(Run* r, const Options* o, const Dataset* ds) {
    const Config* c = &r->cfg;
    long n = n_params(c), step = 0;
    float* unit = NULL;
    if (o->load) {
        step = (long)ckpt_check(o->load, c, o->opt.adamw, ds->token_char).step;
        unit = mallocCheck((size_t)max_unit_params(c) * sizeof(float));
    }
    for (int part = 0; part < (o->load && o->opt.adamw ? 3 : 1); part++) {
        float* dst = part == 0 ? r->params : part == 1 ? r->m : r->v;
        for (int u = 0; u < n_units(c); u++) {
            if (o->load) ckpt_read(o->load, part * n + unit_offset(c, u), unit_params(c, u), unit);
            for (long e = 0; e < r->t.size[u]; e++) {
                long k = tp_canonical(&r->t, c, u, e);
                dst[r->t.off[u] + e] = k < 0 ? 0.0f : o->load ? unit[k] : unit_init_value(c, o->seed, u, k);
            }
        }
    }
    free(unit);
    return step;
}

// The checkpoint in train.c's layout: rank 0 assembles one unit at a time and writes it.
static void tp_save(Run* r, const char* path, int adamw, long step, const Dataset* ds) {
    const Config* c = &r->cfg;
    CkptWriter w = {0};
    CkptHeader h = ckpt_header(c, adamw, step, ds->token_char);
    if (r->tp.rank == 0) w = ckpt_create(path, &h);
    float* unit = mallocCheck((size_t)max_unit_params(c) * sizeof(float));
    for (int part = 0; part < (adamw ? 3 : 1); part++) {
        const float* src = part == 0 ? r->params : part == 1 ? r->m : r->v;
        for (int u = 0; u < n_units(c); u++) {
            tp_gather_unit(&r->t, c, u, src + r->t.off[u], unit);
            if (r->tp.rank == 0) ckpt_write(&w, unit, (size_t)unit_params(c, u) * sizeof(float));
        }
    }
    if (r->tp.rank == 0) ckpt_close(&w);
    free(unit);
}

// ----------------------------------------------------------------------------
// validation and sampling

// Mean loss over the whole validation split (every rank takes every row).
static double evaluate(Run* r, const Dataset* ds) {
    long lo = 0, hi = ds->n_val_examples;
    int64_t total = 0;
    for (long first = lo; first < hi; first += EVAL_ROWS) {
        int R = (int)(hi - first < EVAL_ROWS ? hi - first : EVAL_ROWS);
        dataset_val_rows(ds, first, R, r->cfg.context, r->acts.tokens, r->acts.targets);
        total += tp_model_forward(r, R, ds->n_val_examples);
    }
    return fix_to(total) / (double)ds->n_val_examples;
}

// probs[R][V] for R contexts: the forward pass with dummy targets, the vocabulary gathered
static void probs_of(void* ctx, const int* tokens, int R, float* probs) {
    Run* r = ctx;
    memcpy(r->acts.tokens, tokens, (size_t)R * r->cfg.context * sizeof(int));
    memset(r->acts.targets, 0, (size_t)R * sizeof(int));
    tp_model_forward(r, R, R);
    memcpy(probs, tp_probs(&r->t, &r->cfg, &r->acts, R), (size_t)R * r->cfg.vocab * sizeof(float));
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    Run run = {.tp = group_world("tp")};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, NULL, 0, NULL, NULL);
    if (world_size > o.model.hidden)
        dist_exit(2, RUN_LINE, "%d ranks but a hidden size of %d: every rank needs at least one hidden unit "
                  "(raise --hidden or use fewer ranks)", world_size, o.model.hidden);

    // data
    Dataset ds;
    dataset_load(&ds, o.data, o.max_line, o.seed);
    o.model.vocab = ds.vocab;
    if (world_size > ds.vocab)
        dist_exit(2, RUN_LINE, "%d ranks but a vocabulary of %d tokens: every rank needs at least one", world_size,
                  ds.vocab);

    // model: this rank's slice of every unit, its exact gradient sums and optimizer state
    run.cfg = o.model;
    Config* cfg = &run.cfg;
    int rows = o.batch > EVAL_ROWS ? o.batch : EVAL_ROWS;
    rows = o.samples > rows ? o.samples : rows;
    tp_init(&run.t, &run.tp, cfg, rows);
    long np = run.t.off[n_units(cfg)];
    run.params = mallocCheck(np * sizeof(float));
    run.grads = mallocCheck(np * sizeof(int64_t));
    run.m = o.opt.adamw ? callocCheck(np, sizeof(float)) : NULL;
    run.v = o.opt.adamw ? callocCheck(np, sizeof(float)) : NULL;
    long start = tp_load(&run, &o, &ds);
    int width[MAX_LAYERS + 2];
    tp_widths(&run.t, cfg, width);
    acts_init(&run.acts, cfg, rows, 0, n_units(cfg), width);
    scratch_init(&run.scratch, cfg, rows);
    workspace_init(&run.ws, rows, max_width(cfg), max_linear_weight(cfg));
    char layout[160];
    snprintf(layout, sizeof layout, "tensor parallel over %d ranks: hidden slices of %d%s, vocabulary slices of %d",
             run.tp.size, run.t.hs, run.t.hs * run.tp.size > cfg->hidden ? " (padded)" : "", run.t.vs);
    if (!o.quiet && world_rank == 0) print_config(&o, &ds, layout);

    // training loop
    int B = o.batch;
    Progress progress = progress_start(&o, world_rank == 0);
    for (long step = start + 1; step <= o.steps; step++) {
        step_window_open(o.trace && step == o.steps); // count this step's messages; --trace: the last one
        double t0 = now_seconds();
        dataset_batch(&ds, o.seed, step, 0, B, cfg->context, run.acts.tokens, run.acts.targets);
        int64_t loss = tp_model_forward(&run, B, B); // every rank holds the whole loss
        fix_zero(run.grads, np);
        tp_model_backward(&run, B, B);
        float scale = 1.0f;
        if (o.opt.clip > 0) { // the norm over every slice, replicated biases counted once
            float mx = tp_grads_maxabs(&run.t, cfg, run.grads, B);
            group_allreduce(&run.tp, &mx, 1, MPI_FLOAT, MPI_MAX);
            int e = norm_exponent(mx);
            int64_t sumsq = tp_grads_sumsq(&run.t, cfg, run.grads, B, e);
            group_allreduce(&run.tp, &sumsq, 1, MPI_INT64_T, MPI_SUM);
            scale = clip_scale(&o.opt, grad_norm_value(sumsq, e));
        }
        optimizer_step(&o.opt, run.params, run.grads, run.m, run.v, np, grad_factor(B), scale, step);
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
    // every rank takes every row; activations of a column-parallel layer are its slice
    double bpr = acts_bytes_per_row(cfg, 0, n_units(cfg), width), opt_bytes = o.opt.adamw ? 8.0 : 0.0;
    Figures fig = {.sent = run.tp.sent / steps_done, .received = run.tp.received / steps_done,
                   .params = 4.0 * np, .grads = 8.0 * np, .optim = opt_bytes * np,
                   .acts = B * bpr, .bubble = -1};
    fig.sent_formula = tp_sent_formula(&run.t, cfg, 0, n_units(cfg), B) +
                       (o.opt.clip > 0 ? ring_allreduce_bytes(4 + 8, run.tp.size) : 0);
    fig.mem_formula = (4.0 + 8.0 + opt_bytes) * tp_params_formula(&run.t, cfg, 0, n_units(cfg)) + B * bpr;
    Figures* all = callocCheck(world_size, sizeof(Figures));
    figures_gather(&fig, all);
    if (world_rank == 0)
        report_print(&o, "train_tp.c", layout, val_loss, &progress, names, max_len, &ds, all, world_size,
                     "2(N-1)/N x (4 B x B x T x E + 8 B x B x (every split sum's width))",
                     "(4 + 8 + 8 AdamW) B x (P/N + the row-parallel biases) + activations");
    free(all);
    if (o.save) tp_save(&run, o.save, o.opt.adamw, o.steps > start ? o.steps : start, &ds);

    free(names);
    free(run.params);
    free(run.grads);
    free(run.m);
    free(run.v);
    tp_free(&run.t);
    acts_free(&run.acts);
    scratch_free(&run.scratch);
    workspace_free(&run.ws);
    dataset_free(&ds);
    if (o.trace) dist_trace_write(o.trace);
    MPI_Finalize();
    return 0;
}

#endif // TRAIN_3D
