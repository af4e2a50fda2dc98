/*
 * train_ep.c: expert parallelism. The model is train.c's with --experts X: every hidden
 * layer of the MLP, or the MLP half of every block of the GPT (--model gpt), a mixture of X
 * experts with a router (moe.h: the router, the plan of who sends what, an expert, and
 * moe_forward, the layer on one process). The experts are spread over the N ranks, a
 * contiguous range each; everything else (the embedding, the routers, the output layer;
 * the GPT's attention and LayerNorms) is replicated. Ranks split every batch's rows as
 * data parallelism does. It prints exactly what `./train --experts X` prints for the same
 * flags: the same loss at every step, the same final parameters bit for bit, the same names.
 *
 *              rank 0: rows 0-15, experts 0 1           rank 1: rows 16-31, experts 2 3
 *   forward    embedding (the GPT: attention, ln2), router: each token's top-k experts
 *              --- all-gather: every rank's counts of choices, so that every rank plans alike
 *              --- dispatch (all-to-all): each kept choice's input row to its expert's rank -->
 *              <-----------------------------------------------------------------------------
 *              experts 0 1 on the rows they received     experts 2 3 on theirs
 *              --- combine (all-to-all): each output row back to its token's rank ---------->
 *              <-----------------------------------------------------------------------------
 *              out = sum of gate x output (the GPT: + the residual); output layer, loss
 *   backward   the same two all-to-alls in reverse, as backward runs: combine's backward
 *              takes the output gradients to the experts, dispatch's backward brings the
 *              input gradients back. An expert's weight gradient sums, exactly, its tokens
 *              from every rank on the rank that holds it: it needs no all-reduce.
 *              --- all-reduce: the replicated weights' gradients, as in data parallelism
 *
 * Per rank q and step: n_q of the batch's n tokens (a token is the MLP's row, or the GPT's
 * position; in training, those with a target only: model.h's "a unit with a mixture of
 * experts"; the MLP: R_q rows of B), X_q of the X experts, top-k routing, L MoE layers of
 * inputs K_l and outputs H (the GPT: C and C), P_r replicated parameters:
 *   sent  all-to-alls  4 B x (K_l + H) for each row this rank routes to another rank's expert
 *                      and each its experts receive from another rank: the token's rank sends
 *                      the row's input (K_l floats, dispatch) and output gradient (H, combine's
 *                      backward), the expert's rank its output (H, combine) and input gradient
 *                      (K_l, dispatch's backward). With even routing and no drops, per layer,
 *                      k n_q (1 - X_q/X) rows out and k (n - n_q) X_q/X in
 *        all-gather    the counts, (N-1) x 4 B x k X per layer
 *        all-reduce    the replicated gradients and the loss, 2(N-1)/N x 8 B x (P_r + 2)
 *   memory  (4 + 8, + 8 with AdamW) B x (P_r + the X_q experts' parameters) + activations of
 *           R_q rows, each MoE layer's buffers among them: a token's k rows routed and (even
 *           load) k received, 6 rows of max(K_l, H) floats a choice, and what experts keep
 *
 *   make train_ep && mpirun -n 2 ./train_ep --experts 4      # --oversubscribe for more ranks than cores
 *   mpirun -n 4 ./train_ep --experts 8 --top-k 2 --timeline  # the last step: dispatch, experts, combine
 *   mpirun -n 2 ./train_ep --model gpt --experts 4           # the GPT: 4 experts in every block
 *
 * Compare with ./train --experts 4 (--model gpt): the same losses, names and final
 * checkpoint, whatever N. Initial values: train.c's, each element by its index in train.c's
 * layout (ckpt.h's holding_load, in main, through ep_share and config.h's table), or the checkpoint's.
 *
 * Sections: the strategy, an MoE layer's communication (train_3d.c's expert axis runs it
 * too); the state of one run; the forward and backward passes, and the replicated
 * gradients' all-reduce; what only serves the report (figures, the all-to-all table, the
 * timeline); options; main.
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// the strategy: tokens to their experts and back
//
// An MoE layer is moe.h's steps, with the communication between them here: read
// ep_moe_forward beside moe.h's moe_forward (one process), and ep_moe_backward beside
// moe_backward. Where moe_forward copies, these make an all-to-all; before planning, every
// rank's counts of choices are all-gathered. The functions take the router's and the
// experts' parameters as two pointers, so that train_3d.c runs them on its expert-parallel
// group, with parameters FSDP has just gathered.

typedef struct {
    Group* ep;        // the N ranks the experts are split over: the all-to-alls
    Group* counts_to; // the same N ranks, for the counts' all-gather: train_ep.c's Group dp
                      // (the same communicator; apart only to count the bytes), train_3d.c's ep
    int x_lo, x_hi;   // this rank's experts [x_lo, x_hi) of every MoE layer
    int* x_first;     // [N + 1] rank q holds experts [x_first[q], x_first[q + 1])
    int* all_counts;  // [N][k][X] every rank's counts of choices (MoeLayer's counts)
    int* a2a;         // [4][N] one all-to-all's counts and displacements, in floats
    // train_3d.c's plan, where the ranks of the group do not hold the whole batch (moe.h's
    // capacity and load-balancing loss are batch-wide); NULL here: ep_plan
    void (*plan)(void* ctx, const Config* c, MoeLayer* m, int n, int training, int64_t* aux);
    void* plan_ctx;
} Ep;

// X experts of every layer over the ranks of `ep`, a contiguous range each (split_range)
static void ep_init(Ep* p, Group* ep, Group* counts_to, const Config* c) {
    *p = (Ep){.ep = ep, .counts_to = counts_to};
    p->x_first = mallocCheck(sizeof(int) * (ep->size + 1));
    for (int q = 0; q < ep->size; q++) {
        long lo, hi;
        split_range(c->experts, ep->size, q, &lo, &hi);
        p->x_first[q] = (int)lo;
    }
    p->x_first[ep->size] = c->experts;
    p->x_lo = p->x_first[ep->rank], p->x_hi = p->x_first[ep->rank + 1];
    p->all_counts = mallocCheck(sizeof(int) * ep->size * c->top_k * c->experts);
    p->a2a = mallocCheck(sizeof(int) * 4 * ep->size);
}
static void ep_free(Ep* p) { free(p->x_first), free(p->all_counts), free(p->a2a); }

// The plan of a pass, once the router has chosen (ep_moe_forward's first step after it):
// every rank's counts of choices all-gathered, so that every rank knows how many tokens
// the batch has, which choices the capacity keeps and how many rows each rank sends each
// other (moe.h's moe_plan); in training, the load-balancing loss (its exact terms of this
// rank's tokens added to *aux). The ranks' tokens are the whole batch, contiguous ranges
// of it in rank order.
static void ep_plan(Ep* p, const Config* c, MoeLayer* m, int n, int training, int64_t* aux) {
    int N = p->ep->size, me = p->ep->rank;
    group_allgather(p->counts_to, m->counts, p->all_counts, (long)c->top_k * c->experts, MPI_INT); // all-gather
    long n_total = moe_batch_tokens(c, p->all_counts, N), C = moe_capacity(c, n_total, training);
    moe_plan(c, m, p->all_counts, N, me, p->x_first, n, C);
    if (training) moe_balance(c, m, p->all_counts, N, me, n, n_total, C, aux);
}

// (below: dispatch and combine's MPI_Alltoallv, with its counts and displacements)
static void ep_all_to_all(Ep* p, const float* send, const int* send_rows, float* recv, const int* recv_rows, int width,
                          const char* what);

// The layer of experts on this rank's n tokens, in [n][K] -> out [n][H] (the unit around it
// gives them: model.h's moe_unit_before); `wr` is the router's weight, `we` this rank's
// experts [x_lo, x_hi), one after another. `training`: capacity and the load-balancing
// loss apply (its terms added to *aux).
static void ep_moe_forward(Ep* p, const Config* c, const float* wr, const float* we, MoeLayer* m, const float* in,
                           float* out, int n, int training, int64_t* aux, Workspace* ws) {
    const Expert* e = &m->e;
    int N = p->ep->size, X = c->experts;
    moe_route(c, m, in, wr, n, ws); // the router on this rank's tokens
    if (p->plan) p->plan(p->plan_ctx, c, m, n, training, aux); // (train_3d.c's)
    else ep_plan(p, c, m, n, training, aux);                   // the counts all-gathered, then moe.h's plan
    moe_permute(m, in);             // the routed rows' inputs, in the dispatch order
    // dispatch: each routed row to the rank holding its expert
    ep_all_to_all(p, m->routed_in, m->routed_to, m->expert_in, m->expert_from, e->K, "dispatch");
    // this rank's experts on their rows, which came by rank, then expert: from each rank q a
    // block for each expert, kept[q][x] rows (moe.h's worked example, before moe_plan)
    double t = trace_clock();
    for (int q = 0, at = 0; q < N; q++)
        for (int x = p->x_lo; x < p->x_hi; x++) {
            int rows = m->kept[(long)q * X + x];
            if (rows == 0) continue;
            expert_forward(e, m->expert_out + (long)at * e->H, m->expert_saved + (long)at * e->saved,
                           m->expert_in + (long)at * e->K, we + moe_expert_at(e, x, p->x_lo), rows, m->tmp, m->acc, ws);
            at += rows;
        }
    trace_event("compute", t, trace_clock(), 0, "experts %d", m->layer);
    // combine: each output row back to the rank it came from
    ep_all_to_all(p, m->expert_out, m->expert_from, m->routed_out, m->routed_to, e->H, "combine");
    moe_unpermute(c, m, out, n);    // each token's gated sum of its experts' outputs
}

// Its backward: from its tokens' output gradients dout [n][H], their input gradients din
// [n][K] (in: their input rows), and the exact gradients of the router (into gr) and of
// this rank's experts (into ge) added. `terms`: how many terms those exact sums over tokens
// may have (kernels.h's fix_term checks each term's range against it): the batch's tokens,
// alike in every layout. The router's gradient, replicated, is all-reduced after backward.
static void ep_moe_backward(Ep* p, const Config* c, const float* wr, const float* we, int64_t* gr, int64_t* ge,
                            MoeLayer* m, const float* in, const float* dout, float* din, long terms, Workspace* ws) {
    const Expert* e = &m->e;
    int N = p->ep->size, X = c->experts, n = m->n;
    moe_unpermute_backward(c, m, dout, n); // the gates' gradients; each routed row's output gradient
    // combine's backward: each routed row's output gradient to its expert's rank (the way dispatch went)
    ep_all_to_all(p, m->routed_dout, m->routed_to, m->expert_dout, m->expert_from, e->H, "combine (backward)");
    double t = trace_clock();
    for (int q = 0, at = 0; q < N; q++) // the blocks as forward ran them
        for (int x = p->x_lo; x < p->x_hi; x++) {
            int rows = m->kept[(long)q * X + x];
            if (rows == 0) continue;
            long off = moe_expert_at(e, x, p->x_lo);
            expert_backward(e, m->expert_din + (long)at * e->K, ge + off, m->expert_dout + (long)at * e->H,
                            m->expert_in + (long)at * e->K, m->expert_out + (long)at * e->H,
                            m->expert_saved + (long)at * e->saved, we + off, rows, terms, m->tmp, m->acc, ws);
            at += rows;
        }
    trace_event("compute", t, trace_clock(), 0, "experts backward %d", m->layer);
    // dispatch's backward: each expert row's input gradient back to its token's rank (the way combine went)
    ep_all_to_all(p, m->expert_din, m->expert_from, m->routed_din, m->routed_to, e->K, "dispatch (backward)");
    moe_router_backward(c, m, wr, gr, in, din, n, terms, ws);
    moe_permute_backward(c, m, din, n); // plus each kept choice's input gradient from its expert
}

// An all-to-all of rows of `width` floats: send_rows[q] of them to rank q (the rows are in
// rank order), recv_rows[q] of them from rank q, into recv in rank order. `what` names it
// in traces and the timeline.
static void ep_all_to_all(Ep* p, const float* send, const int* send_rows, float* recv, const int* recv_rows, int width,
                          const char* what) {
    int N = p->ep->size, me = p->ep->rank;
    int *sc = p->a2a, *sd = sc + N, *rc = sd + N, *rd = rc + N;
    long s = 0, t = 0; // MPI counts are ints: the totals must fit one
    for (int q = 0; q < N; q++) s += (long)send_rows[q] * width, t += (long)recv_rows[q] * width;
    if (s > INT_MAX || t > INT_MAX)
        fatal("%s: %ld floats, more than one MPI all-to-all sends; lower --batch", what, s > t ? s : t);
    for (int q = 0, so = 0, ro = 0; q < N; q++) {
        sc[q] = send_rows[q] * width, sd[q] = so, so += sc[q];
        rc[q] = recv_rows[q] * width, rd[q] = ro, ro += rc[q];
    }
    double t0 = now_seconds(), sent = p->ep->sent;
    waiting_for = what;
    MPI_Alltoallv(send, sc, sd, MPI_FLOAT, recv, rc, rd, MPI_FLOAT, p->ep->comm);
    waiting_for = NULL;
    for (int q = 0; q < N; q++) // what stays on this rank is not sent
        if (q != me) {
            if (sc[q]) count_sent(p->ep, 4.0 * sc[q]);
            if (rc[q]) count_received(p->ep, 4.0 * rc[q]);
        }
    trace_event("comm", t0, now_seconds(), p->ep->sent - sent, "%s", what);
}

// The all-to-alls' formula (the top of this file), on the rows the routing sent: 4 B x
// (K + H) for each row sent to or received from another rank, `rows` of them (MoeLayer's
// tokens_out + tokens_in).
static double ep_a2a_bytes_of(const Expert* e, double rows) { return 4.0 * (e->K + e->H) * rows; }

#ifndef TRAIN_3D // the rest of this file is the program; train_3d.c uses only the strategy above

#define RUN_LINE "mpirun -n 2 ./train_ep --experts 4"

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    Dataset ds;        // the data
    State st;          // the replicated weights and this rank's experts, unit by unit (ep_layout)
    long off[MAX_LAYERS + 2], n[MAX_LAYERS + 2]; // where each unit starts in st, and its size here
    Ep experts;        // this rank's experts [x_lo, x_hi) of every MoE layer, and the all-to-alls
    Work work;         // activations of this rank's rows, and each MoE layer's MoeLayer (moe.h)
    Group ep;          // every rank: the all-to-alls
    Group dp;          // every rank too (main: the same communicator): the all-reduces, the all-gathers
    int64_t* packed;   // the replicated gradients, packed for their one all-reduce
    int* gathered;     // [2][N]: the probabilities' counts and displacements, for sampling
    int timeline;      // --timeline
} Run;

static void run_free(Run* r) {
    dataset_free(&r->ds), state_free(&r->st), work_free(&r->work), free(r->packed), free(r->gathered);
    ep_free(&r->experts);
}

// Unit u as this rank holds it (config.h's Share): an MoE unit's own tensors (the MLP's
// router; the GPT's block's attention, LayerNorms and router), then its experts [x_lo, x_hi);
// any other unit whole.
static Share ep_share(const Run* r, int u) {
    return is_moe(&r->cfg, u) ? (Share){0, 1, r->experts.x_lo, r->experts.x_hi} : share_whole(&r->cfg);
}
static void ep_layout(Run* r) {
    long at = 0;
    for (int u = 0; u < n_units(&r->cfg); u++) {
        r->n[u] = share_params(&r->cfg, u, ep_share(r, u));
        r->off[u] = at, at += r->n[u];
    }
}
// The replicated part of unit u (the embedding, every router, the output layer; the GPT's
// attention and LayerNorms too): its first ep_replicated(u) elements here
static long ep_replicated(const Run* r, int u) { return is_moe(&r->cfg, u) ? moe_shared_params(&r->cfg, u) : r->n[u]; }
static Holding ep_holding(Run* r) {
    Holding h = {0};
    for (int u = 0; u < n_units(&r->cfg); u++) {
        h.n[u] = r->n[u], h.share[u] = ep_share(r, u);
        h.at[0][u] = r->st.params + r->off[u];
        h.at[1][u] = r->st.m ? r->st.m + r->off[u] : NULL;
        h.at[2][u] = r->st.v ? r->st.v + r->off[u] : NULL;
    }
    return h;
}

// ----------------------------------------------------------------------------
// the forward pass: the rows [first, first + R) split over the ranks, each through the
// whole model, the MoE layers exchanging tokens. Returns the exact sum of all R rows'
// losses on every rank (and adds their load-balancing terms to acts.aux); with probs, every
// rank receives all R rows' probabilities.

static int64_t forward(void* ctx, const Rows* rows, long first, int R, long rows_total, float* probs) {
    Run* r = ctx;
    const Config* c = &r->cfg;
    long lo, hi;
    split_range(R, r->ep.size, r->ep.rank, &lo, &hi);
    Acts* a = work_load(&r->work, rows, first + lo, (int)(hi - lo), c->context);
    a->training = rows->kind == ROWS_TRAIN, a->aux = 0;
    for (int u = 0; u < n_units(c); u++) {
        const float* w = r->st.params + r->off[u];
        Scratch* s = &r->work.scratch;
        if (is_moe(c, u)) { // the unit's ops around its layer of experts (the GPT's attention half) are model.h's
            const float* in;
            float* out;
            double t = trace_clock();
            int n = moe_unit_before(c, u, w, a, s, (int)(hi - lo), &in, &out, &r->work.ws);
            trace_event("compute", t, trace_clock(), 0, "forward %s", unit_name(c, u));
            // the unit here (ep_layout): its shared parameters, the router's weight among them
            // (moe_router_at: the MLP's first, the GPT's after attention and LayerNorms), then its experts
            ep_moe_forward(&r->experts, c, w + moe_router_at(c), w + moe_shared_params(c, u), &a->moe[u], in, out, n,
                           a->training, &a->aux, &r->work.ws);
            moe_unit_after(c, u, a, s, (int)(hi - lo));
        } else {
            unit_forward(c, u, w, a, s, (int)(hi - lo), rows_total, &r->work.ws);
        }
    }
    int64_t sums[2] = {a->loss, a->aux};
    group_allreduce(&r->dp, sums, 2, MPI_INT64_T, MPI_SUM); // the loss and the load-balancing loss
    a->aux = sums[1];
    if (probs) {
        int N = r->ep.size, V = c->vocab, *counts = r->gathered, *displs = counts + N;
        for (int q = 0; q < N; q++) {
            long qlo, qhi;
            split_range(R, N, q, &qlo, &qhi);
            counts[q] = (int)((qhi - qlo) * V), displs[q] = (int)(qlo * V);
        }
        // this rank's rows' probabilities (the GPT's at the position sampled), in scratch free between passes
        float* own = r->work.scratch.dout;
        model_probs(c, rows, a->out[c->layers + 1], (int)(hi - lo), own);
        MPI_Allgatherv(own, counts[r->ep.rank], MPI_FLOAT, probs, counts, displs, MPI_FLOAT, r->dp.comm);
    }
    return sums[0];
}
// Backward, unit by unit: an MoE unit's layer through ep_moe_backward (`terms`: the batch's
// tokens), the rest as train.c's.
static void backward(Run* r, int R, long B) {
    const Config* c = &r->cfg;
    Acts* a = &r->work.acts;
    Scratch* s = &r->work.scratch;
    for (int u = n_units(c) - 1; u >= 0; u--) {
        const float* w = r->st.params + r->off[u];
        int64_t* g = r->st.grads + r->off[u];
        if (is_moe(c, u)) {
            const float *in, *dout;
            float* din;
            long terms = B * moe_tokens_per_row(c);
            moe_unit_backward_before(c, u, a, s, &in, &dout, &din);
            ep_moe_backward(&r->experts, c, w + moe_router_at(c), w + moe_shared_params(c, u), g + moe_router_at(c),
                            g + moe_shared_params(c, u), &a->moe[u], in, dout, din, terms, &r->work.ws);
            double t = trace_clock();
            moe_unit_backward_after(c, u, w, g, a, s, R, terms, &r->work.ws);
            trace_event("compute", t, trace_clock(), 0, "input gradient %s", unit_name(c, u));
        } else {
            unit_backward(c, u, w, g, a, s, R, B, &r->work.ws);
        }
        scratch_step_down(s);
    }
}

// After backward: the replicated weights' gradients summed over the ranks, packed into one
// all-reduce. The experts' are complete where they are held.
static void ep_allreduce_replicated(Run* r) {
    long n = 0;
    for (int u = 0; u < n_units(&r->cfg); u++)
        memcpy(r->packed + n, r->st.grads + r->off[u], ep_replicated(r, u) * sizeof(int64_t)), n += ep_replicated(r, u);
    group_allreduce(&r->dp, r->packed, n, MPI_INT64_T, MPI_SUM);
    n = 0;
    for (int u = 0; u < n_units(&r->cfg); u++)
        memcpy(r->st.grads + r->off[u], r->packed + n, ep_replicated(r, u) * sizeof(int64_t)), n += ep_replicated(r, u);
}

// The gradient norm counts every element once: the replicated ones on rank 0, each expert
// on its rank.
static int ep_grad_spans(const Run* r, GradSpan* spans) {
    int n = 0;
    for (int u = 0; u < n_units(&r->cfg); u++) {
        long rep = ep_replicated(r, u);
        if (r->ep.rank == 0) spans[n++] = (GradSpan){r->st.grads + r->off[u], rep};
        if (r->n[u] > rep) spans[n++] = (GradSpan){r->st.grads + r->off[u] + rep, r->n[u] - rep};
    }
    return n;
}

// Mean loss over the whole validation split: every pass's rows are split over the ranks.
static double validation_loss(void* ctx) {
    Run* r = ctx;
    return mean_loss(evaluate(forward, r, &r->ds, 1, 0), &r->ds);
}

// ----------------------------------------------------------------------------
// what only serves the report: the figures beside their formulas (the top of this file),
// the all-to-all table, the timeline

// The formulas of figures(), in words, for the report.
static const char sent_words[] = "all-to-all 4 B x (K+H) x tokens sent to and received from other ranks; "
                                 "+ all-reduce 2(N-1)/N x 8 B x (replicated P + 2); + counts (N-1) x 4 B x k X a layer";
static const char mem_words[] = "(4 + 8 + 8 with AdamW) B x (replicated P + this rank's experts) + activations";

// The all-to-alls' formula on the rows the routing sent (ep_a2a_bytes_of), over the layers
// (moe_balance counts the rows).
static double ep_a2a_bytes(const Run* r) {
    const Config* c = &r->cfg;
    double bytes = 0;
    for (int u = 1; u <= c->layers; u++) {
        const MoeLayer* m = &r->work.acts.moe[u];
        bytes += ep_a2a_bytes_of(&m->e, m->tokens_out + m->tokens_in);
    }
    return bytes;
}
// and with even routing and no drops, per step: k n_q (1 - X_q/X) rows out, k (n - n_q)
// X_q/X in, with n_q this rank's tokens of the batch's n (the MLP's: R_q rows of B; the
// GPT's: positions with a target, their means over the steps)
static double ep_a2a_formula(const Run* r) {
    const Config* c = &r->cfg;
    double k = c->top_k, share = (double)(r->experts.x_hi - r->experts.x_lo) / c->experts, bytes = 0;
    for (int u = 1; u <= c->layers; u++) {
        const MoeLayer* m = &r->work.acts.moe[u];
        if (m->steps == 0) continue;
        double n_q = m->own_tokens_sum / m->steps, n = m->tokens_sum / m->steps;
        bytes += 4.0 * (m->e.K + m->e.H) * (k * n_q * (1 - share) + k * (n - n_q) * share);
    }
    return bytes;
}
static Figures figures(const Run* r, const Progress* pr, int R) {
    const Config* c = &r->cfg;
    long np = r->st.n, rep = 0;
    for (int u = 0; u < n_units(c); u++) rep += ep_replicated(r, u);
    double acts_row = acts_bytes_per_row(c, 0, n_units(c), NULL), opt_bytes = r->st.m ? 8.0 : 0.0;
    int N = r->ep.size;
    Figures f = {.sent = per_step(pr, r->ep.sent + r->dp.sent), .received = per_step(pr, r->ep.received + r->dp.received),
                 .params = 4.0 * np, .grads = 8.0 * np, .optim = opt_bytes * np, .acts = R * acts_row, .bubble = -1};
    f.sent_formula = per_step(pr, ep_a2a_bytes(r)) + ring_allreduce_bytes(8.0 * rep, N) + ring_allreduce_bytes(16.0, N) +
                     c->layers * (N - 1) * 4.0 * c->top_k * c->experts;
    f.mem_formula = (4.0 + 8.0 + opt_bytes) * np + R * acts_row; // acts_row counts the MoE buffers (model.h)
    return f;
}

// The all-to-alls apart, per rank: measured, beside the formula on the rows routed and the
// formula with even routing and no drops (real routing sends fewer or more).
static void ep_print_exchange(const Run* r, const Progress* pr, int B) {
    double figs[3] = {per_step(pr, r->ep.sent), per_step(pr, ep_a2a_bytes(r)), ep_a2a_formula(r)}, *all = NULL;
    if (r->ep.rank == 0) all = mallocCheck(sizeof(double) * 3 * r->ep.size);
    MPI_Gather(figs, 3, MPI_DOUBLE, all, 3, MPI_DOUBLE, 0, r->dp.comm);
    if (r->ep.rank == 0) {
        printf("all-to-all (dispatch and combine, forward and backward) per rank and step:\n");
        for (int q = 0; q < r->ep.size; q++) {
            long xlo = r->experts.x_first[q], xhi = r->experts.x_first[q + 1], lo, hi;
            split_range(B, r->ep.size, q, &lo, &hi);
            char experts[32];
            snprintf(experts, sizeof experts, xhi - xlo > 1 ? "experts %ld-%ld" : "expert %ld", xlo, xhi - 1);
            printf("  rank %-3d %s, %ld rows: sent ", q, experts, hi - lo);
            print_size(all[3 * q]);
            printf(" (formula on the tokens routed: ");
            print_size(all[3 * q + 1]);
            printf("; with even routing and no drops: ");
            print_size(all[3 * q + 2]);
            printf(")\n");
        }
        fflush(stdout);
    }
    free(all);
}

// --timeline: the last step on every rank, from its trace events: the router (r), the
// all-to-alls (D dispatch and its backward, C combine and its backward), the experts (E),
// the gates' gradients (g), the rest of forward (f) and backward (b), the all-reduces and
// all-gathers (A).
static char ep_mark(const TraceEvent* e) {
    const char* n = e->name;
    if (!strncmp(n, "dispatch", 8)) return 'D';
    if (!strncmp(n, "combine", 7)) return 'C';
    if (!strncmp(n, "router", 6)) return 'r';
    if (!strncmp(n, "experts", 7)) return 'E';
    if (!strncmp(n, "gates", 5)) return 'g';
    if (!strncmp(n, "all-", 4)) return 'A';
    if (!strncmp(n, "forward", 7)) return 'f';
    if (!strncmp(n, "input gradient", 14) || !strncmp(n, "weight gradient", 15)) return 'b';
    return 0;
}
static void ep_timeline(const Run* r, double step_t0) {
    dist_trace_timeline(r->ep.comm, step_t0, ep_mark, "r router, D dispatch, E experts, C combine, "
                        "g gates' gradients, f other forward, b other backward, A all-reduce and all-gather");
}

// ----------------------------------------------------------------------------
// options of this program

static const CliFlag ep_flags[] = {
    {"timeline", NULL, "draw the last step of every rank: router, dispatch, experts, combine"},
};
static const char* ep_flag(void* ctx, int index, const char* value) {
    (void)value;
    Run* r = ctx;
    if (index == 0) r->timeline = 1;
    return NULL;
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    // ep and dp: both every rank, the same communicator (MPI_COMM_WORLD), no split: two
    // Groups only so that the report counts the all-to-alls' bytes apart from the rest
    Run run = {.ep = group_world("ep"), .dp = group_world("dp")};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, ep_flags, 1, ep_flag, &run);
    dist_check_rows(&o, RUN_LINE);
    int N = run.ep.size, X = o.model.experts;
    if (X == 0) dist_exit(2, RUN_LINE, "train_ep.c spreads experts over ranks: pass --experts X (X >= %d ranks)", N);
    if (X < N)
        dist_exit(2, RUN_LINE, "--experts %d on %d ranks: every rank needs at least one expert (--experts %d or more, "
                  "or fewer ranks)", X, N, N);

    // data
    load_data(&run.ds, &o, &run.cfg);

    // model: the replicated weights and this rank's experts, exact gradient sums, optimizer state
    Config* cfg = &run.cfg;
    long lo, hi; // this rank's rows of every global batch
    split_range(o.batch, N, run.ep.rank, &lo, &hi);
    ep_init(&run.experts, &run.ep, &run.dp, cfg); // its experts; the counts' all-gather over dp
    ep_layout(&run);
    long np = run.off[n_units(cfg) - 1] + run.n[n_units(cfg) - 1];
    run.st = state_alloc(np, o.opt.adamw);
    Holding holding = ep_holding(&run);
    long start = holding_load(&holding, &o, &run.ds, cfg); // initial values: train.c's (config.h), or --load's
    run.packed = mallocCheck(sizeof(int64_t) * np);
    run.gathered = mallocCheck(sizeof(int) * 2 * N);
    // activations for the most rows a rank has, rank 0's: an expert's block from one rank is
    // at most that rank's tokens (the MoE layers' routed and expert rows grow as routed)
    work_init(&run.work, cfg, pass_rows(&o, (o.batch + N - 1) / N), NULL);
    char layout[192], per_rank[64];
    snprintf(per_rank, sizeof per_rank, X % N ? "%d or %d a rank (uneven: the first ranks take one more)" : "%d a rank",
             X / N, X / N + 1);
    snprintf(layout, sizeof layout, "expert parallel over %d ranks: %d experts a %s (top-%d), %s; %ld rows a rank at most",
             N, X, is_gpt(cfg) ? "block" : "layer", cfg->top_k, per_rank, hi - lo);
    if (!o.quiet && world_rank == 0) print_config(&o, &run.ds, layout);

    // training loop
    int B = o.batch, R = (int)(hi - lo);
    GradSpan spans[2 * (MAX_LAYERS + 2)];
    int n_spans = ep_grad_spans(&run, spans);
    DistSave saver = {&holding, &run.ds, cfg};
    Progress progress = progress_start(&o, world_rank == 0, dist_save, &saver, dist_any);
    progress.record_last = run.timeline; // the timeline is drawn from the last step's trace events
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        Rows batch = training_rows(&run.ds, o.seed, step, 0);
        long n = dataset_batch_targets(&run.ds, o.seed, step, B); // of the whole batch, on every rank
        int64_t loss = forward(&run, &batch, 0, B, B, NULL); // this rank's rows of the B; the sum of all B losses
        progress.aux = fix_to(run.work.acts.aux) / n;
        fix_zero(run.st.grads, np);
        backward(&run, R, B);
        ep_allreduce_replicated(&run);
        float scale = clip_factor(&o.opt, spans, n_spans, n, group_norm, &run.dp);
        optimizer_step(&o.opt, run.st.params, run.st.grads, run.st.m, run.st.v, np, grad_factor(n), scale, step);
        if (step_end(&progress, step, fix_to(loss) / n, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, R);
    Report rep = {"train_ep.c", layout, sent_words, mem_words};
    free(dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run));
    if (!o.quiet) {
        ep_print_exchange(&run, &progress, B);
        if (world_rank == 0) moe_print_load(cfg, &run.work.acts, &progress);
    }
    if (run.timeline && progress.steps > 0) ep_timeline(&run, progress.t0); // t0: when the last step began
    run_free(&run);
    MPI_Finalize();
    return 0;
}

#endif // TRAIN_3D
