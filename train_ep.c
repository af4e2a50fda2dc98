/*
 * train_ep.c: expert parallelism. The model is train.c's with --experts X: every hidden
 * layer of the MLP, or the MLP half of every block of the GPT (--model gpt), a mixture of X
 * experts with a router (its pieces, the router, the capacity plan and an expert, are
 * model.h's "mixture of experts"; how tokens move between them is here, in ep_moe_forward
 * and ep_moe_backward). The experts are spread over the N ranks, a contiguous range each;
 * everything else (the embedding, the routers, the output layer; the GPT's attention and
 * LayerNorms) is replicated. Ranks split every batch's rows as data parallelism does. It
 * prints exactly what `./train --experts X` prints for the same flags: the same loss at
 * every step, the same final parameters bit for bit, the same names.
 *
 *              rank 0: rows 0-15, experts 0 1          rank 1: rows 16-31, experts 2 3
 *   forward    embedding, router (replicated)          embedding, router
 *              (the GPT: attention, ln2, then router)
 *              each token -> its top-k experts          each token -> its top-k experts
 *              ---- dispatch: all-to-all, each token's input row to its expert's rank ---->
 *              <---------------------------------------------------------------------------
 *              experts 0 1 on the tokens that chose     experts 2 3 on theirs
 *              ---- combine: all-to-all, each output back to its token's rank ------------>
 *              <---------------------------------------------------------------------------
 *              out = sum of gate x output (the GPT: + the residual); output layer, loss
 *              (replicated)
 *   backward   the same two all-to-alls, the other way: output gradients to the experts,
 *              input gradients back. An expert's weight gradient sums, exactly, its tokens
 *              from every rank on the rank that holds it: it needs no all-reduce. The
 *              replicated weights' gradients do: one all-reduce, as in data parallelism.
 *
 * A token is the MLP's row, or the GPT's position (in training, those with a target only:
 * model.h's "a unit with a mixture of experts"). Per rank q and step, with n_q of the
 * batch's n tokens (the MLP: R_q rows of B), X_q of the X experts, L MoE layers of inputs
 * K_l and outputs H (the GPT: C and C), routing even and nothing dropped (each token sends
 * its k choices; a share X_q / X of the batch's choices come to rank q's experts), P_r
 * replicated parameters:
 *   sent    all-to-all  sum over l of 4 B x (K_l + H) x [k n_q (1 - X_q/X) + k (n - n_q) X_q/X]
 *                       (forward dispatch K_l, combine H; backward dispatch H, combine K_l)
 *           all-reduce  2(N-1)/N x 8 B x P_r, and the loss; counts  (N-1) x 4 B x k X per layer
 *   memory  (4 + 8, + 8 with AdamW) B x (P_r + X_q experts) + activations of R_q rows
 *
 *   make train_ep && mpirun -n 2 ./train_ep --experts 4      # --oversubscribe for more ranks than cores
 *   mpirun -n 4 ./train_ep --experts 8 --top-k 2 --timeline  # the last step: dispatch, experts, combine
 *   mpirun -n 2 ./train_ep --model gpt --experts 4           # the GPT: 4 experts in every block
 *
 * Compare with ./train --experts 4 (--model gpt): the same losses, names and final
 * checkpoint, whatever N.
 *
 * Sections: the strategy (an MoE layer's all-to-alls, which train_3d.c's expert axis runs
 * too); the state of one run (and the replicated gradients' all-reduce); the forward pass
 * and the figures; options; main.
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// the strategy: tokens to their experts and back
//
// An MoE layer is model.h's steps (its moe_forward runs them on one process) with the
// communication between them here: every rank's counts of choices all-gathered, then two
// all-to-alls, dispatch (each token's row to the rank holding its expert) and combine (each
// expert's output back to its token's rank); backward, two more: the output gradients the
// way dispatch went, the input gradients back the way combine came.
//
// The functions below take the router's and the experts' parameters as two pointers, so
// train_3d.c runs them on its expert-parallel group, with parameters FSDP has just gathered
// (the router with the block's attention, the experts apart).

typedef struct {
    Group* ep;        // the N ranks the experts are split over: the all-to-alls
    Group* counts_to; // the same ranks, where the plan's counts are all-gathered (train_ep.c:
                      // its group of the all-reduce, whose bytes count them; train_3d.c: ep)
    int x_lo, x_hi;   // this rank's experts [x_lo, x_hi) of every MoE layer
    int* counts;      // [N][k][X]: every rank's choices in an MoE layer, by slot and expert
    int* a2a;         // [4][N]: an all-to-all's counts and displacements
    // train_3d.c's plan, where the ranks of the group do not hold the whole batch (model.h's
    // capacity and load-balancing loss are batch-wide); NULL here: ep_plan
    void (*plan)(void* ctx, const Config* c, MoeLayer* m, int n, int training, int64_t* aux);
    void* plan_ctx;
} Ep;

// X experts of every layer over the ranks of `ep`, a contiguous range each (split_range)
static void ep_init(Ep* p, Group* ep, Group* counts_to, const Config* c) {
    long lo, hi;
    split_range(c->experts, ep->size, ep->rank, &lo, &hi);
    *p = (Ep){.ep = ep, .counts_to = counts_to, .x_lo = (int)lo, .x_hi = (int)hi};
    p->counts = mallocCheck(sizeof(int) * ep->size * c->top_k * c->experts);
    p->a2a = mallocCheck(sizeof(int) * 4 * ep->size);
}
static void ep_free(Ep* p) { free(p->counts), free(p->a2a); }

// An all-to-all of rows of `width` floats: send_rows[q] of them to rank q (the rows are in
// rank order), recv_rows[q] of them from rank q, into recv in rank order.
static void ep_all_to_all(Ep* p, const float* send, const int* send_rows, float* recv, const int* recv_rows, int width,
                          const char* what) {
    int N = p->ep->size, me = p->ep->rank;
    int *sc = p->a2a, *sd = sc + N, *rc = sd + N, *rd = rc + N;
    long s = 0, t = 0; // MPI counts are ints: the totals must fit one
    for (int q = 0; q < N; q++) s += (long)send_rows[q] * width, t += (long)recv_rows[q] * width;
    if (s > INT_MAX || t > INT_MAX) fatal("%s: %ld floats, more than one MPI all-to-all sends; lower --batch", what, s > t ? s : t);
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

// The plan of a pass, once the router has chosen: every rank's counts of choices, so that
// every rank knows the batch's tokens, which of them the capacity keeps, and how many rows
// each rank sends each other; in training, the load-balancing loss (its exact terms of this
// rank's tokens added to *aux). The ranks' tokens are the whole batch, contiguous ranges of
// it in rank order.
static void ep_plan(Ep* p, const Config* c, MoeLayer* m, int n, int training, int64_t* aux) {
    int N = p->ep->size;
    group_allgather(p->counts_to, m->mine, p->counts, (long)c->top_k * c->experts, MPI_INT);
    long n_total = moe_batch_tokens(c, p->counts, N), C = moe_capacity(c, n_total, training);
    moe_plan(c, m, p->counts, N, p->ep->rank, n, C);
    if (training) moe_balance(c, m, p->counts, N, p->ep->rank, n, n_total, C, aux);
}

// The layer of experts of MoE unit u on this rank's n tokens, in [n][K] -> out [n][H] (the
// unit around it gives them: model.h's moe_unit_before); `wr` is the router's weight, `we`
// this rank's experts [x_lo, x_hi), one after another. `training`: capacity and the
// load-balancing loss apply (its terms added to *aux).
static void ep_moe_forward(Ep* p, const Config* c, const float* wr, const float* we, MoeLayer* m, const float* in,
                           float* out, int n, int training, int64_t* aux, Workspace* ws) {
    const Expert* e = &m->e;
    int N = p->ep->size, X = c->experts;
    moe_route(c, m, in, wr, n, ws); // the router on this rank's tokens, then the plan
    if (p->plan) p->plan(p->plan_ctx, c, m, n, training, aux);
    else ep_plan(p, c, m, n, training, aux);
    moe_permute(m, in);
    // dispatch: each kept token's input row to the rank holding its expert
    ep_all_to_all(p, m->sent, m->send_rows, m->recv_in, m->recv_rows, e->K, "dispatch");
    // this rank's experts on the tokens they received: from rank 0 a block for each of its
    // experts in order, then from rank 1, ... (the plan's kept[rank][expert] rows each)
    double t = trace_clock();
    for (int q = 0, at = 0; q < N; q++)
        for (int x = p->x_lo; x < p->x_hi; x++) {
            int rows = m->kept[(long)q * X + x];
            if (rows == 0) continue;
            expert_forward(e, m->recv_h + (long)at * e->H, m->recv_saved + (long)at * e->saved,
                           m->recv_in + (long)at * e->K, we + moe_expert_at(e, x, p->x_lo), rows, m->tmp, m->acc, ws);
            at += rows;
        }
    trace_event("compute", t, trace_clock(), 0, "experts %d", m->layer);
    // combine: each expert's output row back to its token's rank, then each token's gated sum
    ep_all_to_all(p, m->recv_h, m->recv_rows, m->back, m->send_rows, e->H, "combine");
    moe_unpermute(c, m, out, n);
}

// Its backward: from its tokens' output gradients dout [n][H], their input gradients din
// [n][K] (in: their input rows), and the exact gradients of the router (into gr) and of
// this rank's experts (into ge) added (`terms`: tokens in the batch, or a bound alike in
// every layout). An expert's weight gradient sums, exactly, its tokens from every rank on
// the rank that holds it: it needs no all-reduce. The router's, replicated, does.
static void ep_moe_backward(Ep* p, const Config* c, const float* wr, const float* we, int64_t* gr, int64_t* ge,
                            MoeLayer* m, const float* in, const float* dout, float* din, long terms, Workspace* ws) {
    const Expert* e = &m->e;
    int N = p->ep->size, X = c->experts, n = m->n;
    moe_unpermute_backward(c, m, dout, n); // the gates' gradients; each kept token's output gradient
    // the output gradients to the experts' ranks (the backward of combine, the way dispatch goes)
    ep_all_to_all(p, m->sent, m->send_rows, m->recv_d, m->recv_rows, e->H, "dispatch (backward)");
    double t = trace_clock();
    for (int q = 0, at = 0; q < N; q++)
        for (int x = p->x_lo; x < p->x_hi; x++) {
            int rows = m->kept[(long)q * X + x];
            if (rows == 0) continue;
            long off = moe_expert_at(e, x, p->x_lo);
            expert_backward(e, m->recv_din + (long)at * e->K, ge + off, m->recv_d + (long)at * e->H,
                            m->recv_in + (long)at * e->K, m->recv_h + (long)at * e->H,
                            m->recv_saved + (long)at * e->saved, we + off, rows, terms, m->tmp, m->acc, ws);
            at += rows;
        }
    trace_event("compute", t, trace_clock(), 0, "experts backward %d", m->layer);
    // the input gradients back to the tokens' ranks (the backward of dispatch, the way combine goes)
    ep_all_to_all(p, m->recv_din, m->recv_rows, m->back, m->send_rows, e->K, "combine (backward)");
    moe_router_backward(c, m, wr, gr, in, din, n, terms, ws);
    moe_permute_backward(c, m, din, n); // plus each kept token's input gradient from its experts
}

// The all-to-all's formula, on the tokens the routing sent: 4 B x (K + H) for each token
// sent to or received from another rank (forward dispatch K and combine H; backward
// dispatch H and combine K), for `tokens` of them (model.h's MoeLayer counts them).
static double ep_a2a_bytes_of(const Expert* e, double tokens) { return 4.0 * (e->K + e->H) * tokens; }

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
    Work work;         // activations of this rank's rows, and each MoE layer's plan (model.h's MoeLayer)
    Group ep;          // every rank: the all-to-alls (their bytes counted apart)
    Group dp;          // every rank: the all-reduce of the replicated gradients and the loss, the counts
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

// After backward: the replicated weights' gradients (the embedding, every router, the output
// layer; the GPT's attention and LayerNorms too) summed over the ranks, packed into one
// all-reduce. The experts' are complete where they are held.
static long ep_replicated(const Run* r, int u) { return is_moe(&r->cfg, u) ? moe_shared_params(&r->cfg, u) : r->n[u]; }
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
            ep_moe_forward(&r->experts, c, w + moe_router_at(c), w + moe_shared_params(c, u), &a->moe[u], in, out, n,
                           a->training, &a->aux, &r->work.ws);
            moe_unit_after(c, u, a, s, (int)(hi - lo));
        } else {
            unit_forward(c, u, w, a, s, (int)(hi - lo), rows_total, &r->work.ws);
        }
    }
    int64_t sums[2] = {a->loss, a->aux};
    group_allreduce(&r->dp, sums, 2, MPI_INT64_T, MPI_SUM);
    a->aux = sums[1];
    if (probs) {
        int N = r->ep.size, V = c->vocab, *counts = r->gathered, *displs = counts + N;
        for (int q = 0; q < N; q++) {
            long qlo, qhi;
            split_range(R, N, q, &qlo, &qhi);
            counts[q] = (int)((qhi - qlo) * V), displs[q] = (int)(qlo * V);
        }
        // this rank's rows' probabilities (the GPT's at the position sampled), in scratch free between passes
        float* mine = r->work.scratch.dout;
        model_probs(c, rows, a->out[c->layers + 1], (int)(hi - lo), mine);
        MPI_Allgatherv(mine, counts[r->ep.rank], MPI_FLOAT, probs, counts, displs, MPI_FLOAT, r->ep.comm);
    }
    return sums[0];
}
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

// Mean loss over the whole validation split: every pass's rows are split over the ranks.
static double validation_loss(void* ctx) {
    Run* r = ctx;
    return mean_loss(evaluate(forward, r, &r->ds, 1, 0), &r->ds);
}

// The formulas of figures(), in words, for the report.
static const char sent_words[] = "all-to-all 4 B x (K+H) x tokens sent to and received from other ranks; "
                                 "+ all-reduce 2(N-1)/N x 8 B x (replicated P + 2); + counts (N-1) x 4 B x k X a layer";
static const char mem_words[] = "(4 + 8 + 8 with AdamW) B x (replicated P + this rank's experts) + activations";

// What this rank sent and holds, each beside its formula (the top of this file). The
// all-to-all's formula on the tokens the routing sent (ep_a2a_bytes_of), over the layers
// (model.h counts the tokens).
static double ep_a2a_bytes(const Run* r) {
    const Config* c = &r->cfg;
    double bytes = 0;
    for (int u = 1; u <= c->layers; u++) {
        const MoeLayer* m = &r->work.acts.moe[u];
        bytes += ep_a2a_bytes_of(&m->e, m->tokens_out + m->tokens_in);
    }
    return bytes;
}
// and with even routing and no drops, per step: k n_q (1 - X_q/X) tokens out, k (n - n_q)
// X_q/X in, with n_q this rank's tokens of the batch's n (the MLP's: R_q rows of B; the
// GPT's: positions with a target, their means over the steps)
static double ep_a2a_formula(const Run* r) {
    const Config* c = &r->cfg;
    double k = c->top_k, share = (double)(r->experts.x_hi - r->experts.x_lo) / c->experts, bytes = 0;
    for (int u = 1; u <= c->layers; u++) {
        const MoeLayer* m = &r->work.acts.moe[u];
        if (m->steps == 0) continue;
        double mine = m->mine_sum / m->steps, n = m->tokens_sum / m->steps;
        bytes += 4.0 * (m->e.K + m->e.H) * (k * mine * (1 - share) + k * (n - mine) * share);
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
    f.mem_formula = (4.0 + 8.0 + opt_bytes) * np + R * acts_row;
    return f;
}

// The all-to-all apart, per rank: measured, beside the formula on the tokens routed and
// the formula with even routing and no drops (real routing sends fewer or more).
static void ep_print_exchange(const Run* r, const Progress* pr, int B) {
    double mine[3] = {per_step(pr, r->ep.sent), per_step(pr, ep_a2a_bytes(r)), ep_a2a_formula(r)}, *all = NULL;
    if (r->ep.rank == 0) all = mallocCheck(sizeof(double) * 3 * r->ep.size);
    MPI_Gather(mine, 3, MPI_DOUBLE, all, 3, MPI_DOUBLE, 0, r->ep.comm);
    if (r->ep.rank == 0) {
        printf("all-to-all (dispatch and combine, forward and backward) per rank and step:\n");
        for (int q = 0; q < r->ep.size; q++) {
            long xlo, xhi, lo, hi;
            split_range(r->cfg.experts, r->ep.size, q, &xlo, &xhi);
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
// all-to-alls (D dispatch, C combine), the experts (E), the gates' gradients (g), the rest
// of forward (f) and backward (b), the all-reduces and all-gathers (A).
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
    long lo, hi; // this rank's rows of every global batch, and its experts
    split_range(o.batch, N, run.ep.rank, &lo, &hi);
    ep_init(&run.experts, &run.ep, &run.dp, cfg);
    ep_layout(&run);
    long np = run.off[n_units(cfg) - 1] + run.n[n_units(cfg) - 1];
    run.st = state_alloc(np, o.opt.adamw);
    Holding holding = ep_holding(&run);
    long start = holding_load(&holding, &o, &run.ds, cfg);
    run.packed = mallocCheck(sizeof(int64_t) * np);
    run.gathered = mallocCheck(sizeof(int) * 2 * N);
    work_init(&run.work, cfg, pass_rows(&o, o.batch), NULL); // an expert's block of tokens: up to a batch
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
