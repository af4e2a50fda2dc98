/*
 * train_ep.c: expert parallelism. The model is train.c's with --experts X: every hidden
 * layer of the MLP, or the MLP half of every block of the GPT (--model gpt), is a mixture of
 * X experts with a router (moe.h). The experts are spread over the N ranks, a contiguous
 * range each; everything else (the embedding, the routers and any shared experts, the output
 * layer; the GPT's attention and LayerNorms) is replicated, and the ranks split each batch's
 * rows as data parallelism does. It prints what `./train --experts X` prints for the same
 * flags, bit for bit: the loss at every step, the final parameters, the names.
 *
 *              rank 0: rows 0-15, experts 0 1           rank 1: rows 16-31, experts 2 3
 *   forward    embedding (the GPT: attention, ln2), router: each token's top-k experts
 *              --- all-gather: every rank's counts of choices, so that every rank plans alike
 *              --- dispatch (all-to-all): each kept choice's input row to its expert's rank -->
 *              <-----------------------------------------------------------------------------
 *              experts 0 1 on the rows they received     experts 2 3 on theirs
 *              --- combine (all-to-all): each output row back to its token's rank ---------->
 *              <-----------------------------------------------------------------------------
 *              out = sum of gate x output (+ shared experts; the GPT: + the residual); loss
 *   backward   the same two all-to-alls in reverse: combine's backward takes the output
 *              gradients to the experts, dispatch's backward brings the input gradients back.
 *              An expert's weight gradient sums, exactly, its tokens from every rank on the
 *              rank that holds it: it needs no all-reduce.
 *              --- all-reduce: the replicated weights' gradients, as in data parallelism
 *
 *   make train_ep && mpirun -n 2 ./train_ep --experts 4      # --oversubscribe for more ranks than cores
 *   mpirun -n 4 ./train_ep --experts 8 --top-k 2 --timeline  # the last step: dispatch, experts, combine
 *   mpirun -n 2 ./train_ep --model gpt --experts 4           # the GPT: 4 experts in every block
 *
 * First read: the plan, one MoE layer's forward and backward (top-1), one training step.
 * Then chapters: top-k, capacity and drops, the balancing loss, shared experts, the GPT's
 * experts, microbatches, the formulas, the timeline (train_3d.c's expert axis runs it too).
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// the strategy: what a rank holds

typedef struct {
    int* all_counts; // [N][k][X] every rank's counts of choices (MoeLayer's counts)
    int* a2a;        // [4][N] one all-to-all's counts and displacements, in floats
} EpScratch;
// train_3d.c's plug-in point: its plan, as its ranks hold parts of rows; NULL here: ep_plan
typedef struct {
    void (*plan)(void* ctx, const Config* c, MoeLayer* m, int n, int training, int64_t* aux);
    void* ctx;
} EpPlanHook;
typedef struct {
    Group* ep;        // the N ranks the experts are split over: the all-to-alls
    Group* counts_to; // the same ranks again, so that the counts' all-gather is counted apart from the all-to-alls
    int x_lo, x_hi;   // this rank's experts [x_lo, x_hi) of every MoE layer
    int* x_first;     // [N + 1] rank q holds experts [x_first[q], x_first[q + 1])
    EpScratch scratch;
    EpPlanHook hook;
} Ep;

// One MoE layer as this rank runs it: its weights, where their gradients add, the pass's kind.
typedef struct {
    MoeLayer* m;           // its routing, plan and buffers (moe.h)
    const float* router;   // the router's weight [K][X], then the shared experts' blocks
    const float* experts;  // this rank's experts [x_lo, x_hi), one block after another
    int64_t* router_grad;  // backward: the router's and shared experts' gradients, all-reduced
    int64_t* experts_grad; // backward: the experts', complete here
    int training;          // capacity and the balancing loss apply (their chapters)
    int64_t* aux;          // training: the balancing loss's terms are added here
    long terms;            // backward: the most terms an exact sum over tokens has (the batch's tokens)
    Workspace* ws;
} EpLayer;

// ----------------------------------------------------------------------------
// the plan: who sends which rows where
//
// The router has chosen each token's expert. Every rank all-gathers every rank's counts of
// choices, so that each rank computes the same plan with no further message. An example:
// 2 ranks, X = 4 experts (rank 0 holds 0 1, rank 1 holds 2 3: x_first = {0, 2, 4}), top-1,
// the batch's tokens t0 t1 t2 on rank 0 and t3 t4 t5 on rank 1. "t5>2" is t5's row for
// expert 2, and "|" parts the rows by the rank they go to or come from.
//
//                               rank 0                     rank 1
//   the router's choices        t0>2  t1>0  t2>1           t3>1  t4>3  t5>2
//   counts, by expert 0..3      1 1 1 0                    0 1 1 1          (all-gathered)
//   routed rows, by expert      t1>0 t2>1 | t0>2           t3>1 | t5>2 t4>3
//   routed_to[q]                {2, 1}                     {1, 2}
//   expert rows, by rank        t1>0 t2>1 | t3>1           t0>2 | t5>2 t4>3
//   expert_from[q]              {2, 1}                     {1, 2}
//
// A rank sorts its routed rows by expert, so the rows for rank q's experts are one block:
// routed_to[q] is its own counts of q's experts. From the gathered counts it also knows
// expert_from[q], rank q's counts of this rank's experts. kept[q][x] is rank q's rows for
// expert x (its counts, less what the capacity drops). Dispatch is one all-to-all, routed
// rows out and expert rows in; the expert rows come by rank, then expert, so an expert runs
// once per sending rank: rank 1's expert 2 on t0, then on t5. Combine sends each output row
// back the way it came, into the routed row it left (t0's output lands in rank 0's row 2).

static void ep_plan(Ep* p, const Config* c, MoeLayer* m, int n, int training, int64_t* aux) {
    int N = p->ep->size, me = p->ep->rank;
    group_allgather(p->counts_to, m->counts, p->scratch.all_counts, (long)c->top_k * c->experts, MPI_INT); // all-gather
    long n_total = moe_batch_tokens(c, p->scratch.all_counts, N), C = moe_capacity(c, n_total, training);
    moe_plan(c, m, p->scratch.all_counts, N, me, p->x_first, n, C); // kept, routed_to, expert_from, each row's place
    if (training) moe_balance(c, m, p->scratch.all_counts, N, me, n, n_total, C, aux); // the balancing loss's chapter
}

// send_rows[q] rows of `width` floats to rank q, recv_rows[q] from it, in rank order (plumbing)
static void ep_all_to_all(Ep* p, const float* send, const int* send_rows, float* recv, const int* recv_rows, int width,
                          const char* what);

// ----------------------------------------------------------------------------
// an MoE layer: route, dispatch, the experts, combine

// The layer on this rank's n tokens: in [n][K] -> out [n][H].
static void ep_moe_forward(Ep* p, const Config* c, const EpLayer* l, const float* in, float* out, int n) {
    MoeLayer* m = l->m;
    const Expert* e = &m->e;
    int N = p->ep->size, X = c->experts;
    moe_route(c, m, in, l->router, n, l->ws); // each token's expert, its gate, the counts
    if (p->hook.plan) p->hook.plan(p->hook.ctx, c, m, n, l->training, l->aux); // (train_3d.c's)
    else ep_plan(p, c, m, n, l->training, l->aux);
    moe_permute(m, in); // the routed rows' inputs, by expert
    ep_all_to_all(p, m->routed_in, m->routed_to, m->expert_in, m->expert_from, e->K, "dispatch");
    double t = trace_clock();
    for (int q = 0, at = 0; q < N; q++) // a block of expert rows from each rank q, for each expert
        for (int x = p->x_lo; x < p->x_hi; x++) {
            int rows = m->kept[(long)q * X + x];
            if (rows == 0) continue;
            expert_forward(e, m->expert_out + (long)at * e->H, m->expert_saved + (long)at * e->saved,
                           m->expert_in + (long)at * e->K, l->experts + moe_expert_at(e, x, p->x_lo), rows, m->tmp,
                           m->acc, l->ws);
            at += rows;
        }
    trace_event("compute", t, trace_clock(), 0, "experts %d", m->layer);
    ep_all_to_all(p, m->expert_out, m->expert_from, m->routed_out, m->routed_to, e->H, "combine");
    moe_unpermute(c, m, out, n); // each token's gate x its expert's output
    moe_shared_forward(c, m, l->router, in, out, n, l->ws); // + the shared experts' (their chapter)
}

// Its backward, from dout [n][H]: din [n][K], and the router's, the shared experts' and this
// rank's experts' exact gradients added; each all-to-all runs the other way from its forward.
static void ep_moe_backward(Ep* p, const Config* c, const EpLayer* l, const float* in, const float* dout,
                            float* din) {
    MoeLayer* m = l->m;
    const Expert* e = &m->e;
    int N = p->ep->size, X = c->experts, n = m->n;
    moe_unpermute_backward(c, m, dout, n); // the gates' gradients; each routed row's output gradient
    ep_all_to_all(p, m->routed_dout, m->routed_to, m->expert_dout, m->expert_from, e->H, "combine (backward)");
    double t = trace_clock();
    for (int q = 0, at = 0; q < N; q++) // the blocks as forward ran them
        for (int x = p->x_lo; x < p->x_hi; x++) {
            int rows = m->kept[(long)q * X + x];
            if (rows == 0) continue;
            long off = moe_expert_at(e, x, p->x_lo);
            expert_backward(e, m->expert_din + (long)at * e->K, l->experts_grad + off, m->expert_dout + (long)at * e->H,
                            m->expert_in + (long)at * e->K, m->expert_out + (long)at * e->H,
                            m->expert_saved + (long)at * e->saved, l->experts + off, rows, l->terms, m->tmp, m->acc,
                            l->ws);
            at += rows;
        }
    trace_event("compute", t, trace_clock(), 0, "experts backward %d", m->layer);
    ep_all_to_all(p, m->expert_din, m->expert_from, m->routed_din, m->routed_to, e->K, "dispatch (backward)");
    moe_router_backward(c, m, l->router, l->router_grad, in, din, n, l->terms, l->ws);
    moe_permute_backward(c, m, din, n); // plus each routed row's input gradient, back in its token's row
    moe_shared_backward(c, m, l->router, l->router_grad, in, dout, din, n, l->terms, l->ws);
}

#ifndef TRAIN_3D // from here to the end of the first read: the program; train_3d.c has its own
#define RUN_LINE "mpirun -n 2 ./train_ep --experts 4"

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    Dataset ds;
    State st;          // the replicated weights and this rank's experts, unit by unit (ep_layout)
    long off[MAX_LAYERS + 2], n[MAX_LAYERS + 2]; // where each unit starts in st, and its size here
    Ep experts;        // this rank's experts [x_lo, x_hi) of every MoE layer, and the all-to-alls
    Work work;         // activations of this rank's rows, and each MoE layer's MoeLayer (moe.h)
    Group ep;          // every rank: the all-to-alls
    Group dp;          // every rank too (main: the same communicator): the all-reduces, the all-gathers
    int M;             // --microbatches: the batch in M passes, each split over the ranks
    GradSpan spans[2 * (MAX_LAYERS + 2)]; // what the gradient norm counts here (ep_grad_spans)
    int n_spans;
    int timeline;      // --timeline
    // scratch
    int64_t* packed;   // the replicated gradients, packed for their one all-reduce
    int* gathered;     // [2][N]: the probabilities' counts and displacements, for sampling
} Run;

static void ep_gather_probs(Run* r, const Rows* rows, int R, const Acts* a, float* probs);
static double validation_loss(void* ctx);

// ----------------------------------------------------------------------------
// the forward and backward passes

// The rows [first, first + R) split over the ranks, each through the whole model. Returns
// the exact sum of all R rows' losses on every rank (with probs, all their probabilities).
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
        if (is_moe(c, u)) { // the unit's own ops around its layer (the GPT's chapter) are model.h's
            const float* in;
            float* out;
            double t = trace_clock();
            int n = moe_unit_before(c, u, w, a, s, (int)(hi - lo), &in, &out, &r->work.ws);
            trace_event("compute", t, trace_clock(), 0, "forward %s", unit_name(c, u));
            EpLayer l = {.m = &a->moe[u], .router = w + moe_router_at(c), .experts = w + moe_replicated_params(c, u),
                         .training = a->training, .aux = &a->aux, .ws = &r->work.ws};
            ep_moe_forward(&r->experts, c, &l, in, out, n);
            moe_unit_after(c, u, a, s, (int)(hi - lo));
        } else {
            unit_forward(c, u, w, a, s, (int)(hi - lo), rows_total, &r->work.ws);
        }
    }
    int64_t sums[2] = {a->loss, a->aux};
    group_allreduce(&r->dp, sums, 2, MPI_INT64_T, MPI_SUM); // the loss and the balancing loss
    a->aux = sums[1];
    if (probs) ep_gather_probs(r, rows, R, a, probs);
    return sums[0];
}

// Unit by unit, this rank's R rows of a batch of B; with --recompute, what a block did not keep first.
static void backward(Run* r, int R, long B) {
    const Config* c = &r->cfg;
    Acts* a = &r->work.acts;
    Scratch* s = &r->work.scratch;
    for (int u = n_units(c) - 1; u >= 0; u--) {
        const float* w = r->st.params + r->off[u];
        int64_t* g = r->st.grads + r->off[u];
        unit_recompute(c, u, w, a, s, R, &r->work.ws); // --recompute selective: attention's probabilities again
        if (is_moe(c, u)) {
            const float *in, *dout;
            float* din;
            long terms = B * moe_tokens_per_row(c);
            moe_unit_backward_before(c, u, a, s, &in, &dout, &din);
            EpLayer l = {.m = &a->moe[u], .router = w + moe_router_at(c), .experts = w + moe_replicated_params(c, u),
                         .router_grad = g + moe_router_at(c), .experts_grad = g + moe_replicated_params(c, u),
                         .terms = terms, .ws = &r->work.ws};
            ep_moe_backward(&r->experts, c, &l, in, dout, din);
            double t = trace_clock();
            moe_unit_backward_after(c, u, w, g, a, s, R, terms, &r->work.ws);
            trace_event("compute", t, trace_clock(), 0, "input gradient %s", unit_name(c, u));
        } else {
            unit_backward(c, u, w, g, a, s, R, B, &r->work.ws);
        }
        scratch_step_down(s);
    }
}

// Unit u's replicated part, its first ep_replicated(u) elements here: all but routed experts.
static long ep_replicated(const Run* r, int u) { return is_moe(&r->cfg, u) ? moe_replicated_params(&r->cfg, u) : r->n[u]; }

// The replicated weights' gradients summed over the ranks, packed into one all-reduce.
static void ep_allreduce_replicated(Run* r) {
    long n = 0;
    for (int u = 0; u < n_units(&r->cfg); u++)
        memcpy(r->packed + n, r->st.grads + r->off[u], ep_replicated(r, u) * sizeof(int64_t)), n += ep_replicated(r, u);
    group_allreduce(&r->dp, r->packed, n, MPI_INT64_T, MPI_SUM);
    n = 0;
    for (int u = 0; u < n_units(&r->cfg); u++)
        memcpy(r->st.grads + r->off[u], r->packed + n, ep_replicated(r, u) * sizeof(int64_t)), n += ep_replicated(r, u);
}

// ----------------------------------------------------------------------------
// one training step

// Returns step_end's answer: nonzero when a signal stops the run.
static int train_step(Run* r, Options* o, Progress* pr, long step) {
    int B = o->batch, M = r->M;
    long first, np = r->st.n;
    step_begin(pr, step);
    Rows batch = training_rows(&r->ds, o->seed, step, 0);
    long n = dataset_batch_targets(&r->ds, o->seed, step, B); // of the whole batch, on every rank
    int64_t loss = 0, aux = 0;
    fix_zero(r->st.grads, np);
    for (int m = 0; m < M; m++) { // M = 1 unless --microbatches (its chapter)
        long lo, hi;
        split_range(B, M, m, &lo, &hi);
        loss += forward(r, &batch, lo, (int)(hi - lo), B, NULL); // the sum of all the rows' losses
        aux += r->work.acts.aux;
        backward(r, microbatch_rows(B, M, m, r->ep.size, r->ep.rank, &first), B);
    }
    pr->aux = fix_to(aux) / n;
    ep_allreduce_replicated(r); // the experts' gradients are complete where they are held
    float scale = clip_factor(&o->opt, r->spans, r->n_spans, n, group_norm, &r->dp);
    optimizer_step(&o->opt, r->st.params, r->st.grads, r->st.m, r->st.v, np, grad_factor(n), scale, step);
    moe_bias_update(&r->cfg); // --balance bias: each expert's bias moves toward its share
    return step_end(pr, step, fix_to(loss) / n, validation_loss, r);
}

#endif // TRAIN_3D
// ---------------------------------------------------------------------------- first read ends here

// ----------------------------------------------------------------------------
// top-k
// With --top-k k (1 to 8) a token chooses its k most probable experts, each choice a routed
// row unless the capacity drops it. With k >= 2 the gates are renormalised over the k chosen
// (Mixtral's 2, DeepSeek-V3's 8); with k = 1 the gate is the probability itself. A token's
// outputs are summed in choice order.
// Nothing in this file changes: the counts are [k][X], and the all-to-alls carry what the
// plan says.

// ----------------------------------------------------------------------------
// capacity and dropped tokens
// In training an expert takes at most C = ceil(CF k n / X) of the batch's n tokens (CF is
// --capacity, 1.25 by default); a choice past that is dropped, its term of the output 0. An
// expert's queue holds every first choice before any second, each by token of the batch.
// So a choice's place needs every earlier rank's counts: that is why ep_plan all-gathers
// them. moe.h's worked example, before moe_plan, shows drops. Validation drops nothing.

// ----------------------------------------------------------------------------
// the balancing loss
// A term that pushes the router to spread the tokens: aux = alpha X sum_x f_x P_x (Switch),
// f_x the share of the batch's choices that went to x, P_x x's mean probability. ep_plan's
// moe_balance takes f_x from the gathered counts and adds this rank's tokens' exact terms;
// forward's all-reduce sums them beside the loss; moe_router_backward adds its gradient.

// ----------------------------------------------------------------------------
// shared experts
// With --shared-experts S (DeepSeek-V3 has one, V2 two), every token also passes through S
// experts of its own layer's shape, gate 1, beside its k routed ones. Their weights follow
// the router's and are replicated like it, so each rank runs them on its own tokens
// (moe_shared_forward, the last line of ep_moe_forward): they send nothing, and their
// gradients travel in ep_allreduce_replicated's one all-reduce with the router's.

// ----------------------------------------------------------------------------
// the GPT's experts
// With --model gpt the layer is a block's MLP half, and its tokens are positions: those
// with a target, in training. moe_unit_before runs the attention half and ln2 and gives the
// layer their rows; moe_unit_after adds the residual (model.h's "a unit with a mixture of
// experts"). An expert is an MLP C -> F -> C (F = 4C, or --expert-hidden), so dispatch and
// combine send rows of C whatever F is.

// ----------------------------------------------------------------------------
// microbatches
// --microbatches M runs the batch in M passes, each split over the ranks and with its own
// capacity and balancing loss: ./train --experts X --microbatches M's bits. The replicated
// gradients are all-reduced once, after the last pass.

// ----------------------------------------------------------------------------
// the formulas
// Per rank q and step: n_q of the batch's n tokens (a token is the MLP's row, or the GPT's
// position; in training, those with a target only; the MLP: R_q rows of B), X_q of the X
// experts, top-k routing, L MoE layers of inputs K_l and outputs H (the GPT: C and C), P_r
// replicated parameters:
//   sent  all-to-alls  4 B x (K_l + H) for each row this rank routes to another rank's expert
//                      and each its experts receive from another rank: the token's rank sends
//                      the row's input (K_l floats, dispatch) and output gradient (H, combine's
//                      backward), the expert's rank its output (H, combine) and input gradient
//                      (K_l, dispatch's backward). With even routing and no drops, per layer,
//                      k n_q (1 - X_q/X) rows out and k (n - n_q) X_q/X in
//        all-gather    the counts, (N-1) x 4 B x k X per layer
//        all-reduce    the replicated gradients and the loss, 2(N-1)/N x 8 B x (P_r + 2)
//   memory  (4 + 8, + 8 with AdamW) B x (P_r + the X_q experts' parameters) + activations of
//           R_q rows, each MoE layer's buffers among them: a token's k rows routed and (even
//           load) k received, 6 rows of max(K_l, H) floats a choice, and what experts keep

// The all-to-alls' bytes for `rows` rows sent or received (MoeLayer's tokens_out + tokens_in)
static double ep_a2a_bytes_of(const Expert* e, double rows) { return 4.0 * (e->K + e->H) * rows; }

#ifndef TRAIN_3D
static const char sent_words[] = "all-to-all 4 B x (K+H) x tokens sent to and received from other ranks; "
                                 "+ all-reduce 2(N-1)/N x 8 B x (replicated P + 2); + counts (N-1) x 4 B x k X a layer";
static const char mem_words[] = "(4 + 8 + 8 with AdamW) B x (replicated P + this rank's experts) + activations";

// The all-to-alls' formula on the rows the routing sent, over the layers (moe_balance's counts)
static double ep_a2a_bytes(const Run* r) {
    const Config* c = &r->cfg;
    double bytes = 0;
    for (int u = 1; u <= c->layers; u++) {
        const MoeLayer* m = &r->work.acts.moe[u];
        bytes += ep_a2a_bytes_of(&m->e, m->tokens_out + m->tokens_in);
    }
    return bytes;
}
// and with even routing and no drops, per step, from the means of n_q and n over the steps
static double ep_a2a_formula(const Run* r) {
    const Config* c = &r->cfg;
    double k = c->top_k, share = (double)(r->experts.x_hi - r->experts.x_lo) / c->experts, bytes = 0;
    for (int u = 1; u <= c->layers; u++) {
        const MoeLayer* m = &r->work.acts.moe[u];
        if (m->steps == 0) continue;
        double n_q = m->own_tokens_sum / m->steps, n = m->tokens_sum / m->steps;
        bytes += 4.0 * (m->e.K + m->e.H) * (k * n_q * (1 - share) + k * (n - n_q) * share);
    }
    return bytes * r->M; // the means above are a pass's: M passes a step
}
static Figures figures(const Run* r, const Progress* pr, int R) {
    const Config* c = &r->cfg;
    long np = r->st.n, rep = 0;
    for (int u = 0; u < n_units(c); u++) rep += ep_replicated(r, u);
    double acts_row = acts_bytes_per_row(c, 0, n_units(c), NULL), opt_bytes = r->st.m ? 8.0 : 0.0;
    int N = r->ep.size;
    Figures f = {.sent = per_step(pr, r->ep.sent + r->dp.sent), .received = per_step(pr, r->ep.received + r->dp.received),
                 .params = 4.0 * np, .grads = 8.0 * np, .optim = opt_bytes * np, .acts = R * acts_row, .bubble = -1};
    f.sent_formula = per_step(pr, ep_a2a_bytes(r)) + ring_allreduce_bytes(8.0 * rep, N) + // each microbatch: loss, counts
                     r->M * (ring_allreduce_bytes(16.0, N) + c->layers * (N - 1) * 4.0 * c->top_k * c->experts);
    f.mem_formula = (4.0 + 8.0 + opt_bytes) * np + R * acts_row; // acts_row counts the MoE buffers (model.h)
    return f;
}

// The all-to-alls per rank: measured, on the rows routed, and with even routing and no drops.
static void ep_print_exchange(const Run* r, const Progress* pr, int B) {
    double figs[3] = {per_step(pr, r->ep.sent), per_step(pr, ep_a2a_bytes(r)), ep_a2a_formula(r)}, *all = NULL;
    if (r->ep.rank == 0) all = mallocCheck(sizeof(double) * 3 * r->ep.size);
    MPI_Gather(figs, 3, MPI_DOUBLE, all, 3, MPI_DOUBLE, 0, r->dp.comm);
    if (r->ep.rank == 0) {
        printf("all-to-all (dispatch and combine, forward and backward) per rank and step:\n");
        for (int q = 0; q < r->ep.size; q++) {
            long xlo = r->experts.x_first[q], xhi = r->experts.x_first[q + 1], rows = 0, first;
            for (int m = 0; m < r->M; m++) rows += microbatch_rows(B, r->M, m, r->ep.size, q, &first);
            char experts[32];
            snprintf(experts, sizeof experts, xhi - xlo > 1 ? "experts %ld-%ld" : "expert %ld", xlo, xhi - 1);
            printf("  rank %-3d %s, %ld rows: sent ", q, experts, rows);
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

// ----------------------------------------------------------------------------
// the timeline
// --timeline draws the last step on every rank from its trace events, a letter for each
// kind: the all-to-alls, the experts and the rest, as its legend says.

static char ep_mark(const TraceEvent* e) {
    const char* n = e->name;
    if (!strncmp(n, "dispatch", 8)) return 'D';
    if (!strncmp(n, "combine", 7)) return 'C';
    if (!strncmp(n, "router", 6)) return 'r';
    if (!strncmp(n, "experts", 7)) return 'E';
    if (!strncmp(n, "shared", 6)) return 'S';
    if (!strncmp(n, "gates", 5)) return 'g';
    if (!strncmp(n, "all-", 4)) return 'A';
    if (!strncmp(n, "forward", 7)) return 'f';
    if (!strncmp(n, "input gradient", 14) || !strncmp(n, "weight gradient", 15)) return 'b';
    return 0;
}
static void ep_timeline(const Run* r, double step_t0) {
    dist_trace_timeline(r->ep.comm, step_t0, ep_mark, "r router, D dispatch, E experts, C combine, "
                        "S shared experts, g gates' gradients, f other forward, b other backward, A all-reduce and all-gather");
}
#endif // TRAIN_3D

// ----------------------------------------------------------------------------
// plumbing: the strategy's setup and its all-to-all

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
    p->scratch.all_counts = mallocCheck(sizeof(int) * ep->size * c->top_k * c->experts);
    p->scratch.a2a = mallocCheck(sizeof(int) * 4 * ep->size);
}
static void ep_free(Ep* p) { free(p->x_first), free(p->scratch.all_counts), free(p->scratch.a2a); }

static void ep_all_to_all(Ep* p, const float* send, const int* send_rows, float* recv, const int* recv_rows, int width,
                          const char* what) {
    int N = p->ep->size, me = p->ep->rank;
    int *sc = p->scratch.a2a, *sd = sc + N, *rc = sd + N, *rd = rc + N;
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

#ifndef TRAIN_3D
// ----------------------------------------------------------------------------
// plumbing: the program's state, its layout and the gradient norm

static void run_free(Run* r) {
    dataset_free(&r->ds), state_free(&r->st), work_free(&r->work), free(r->packed), free(r->gathered);
    ep_free(&r->experts);
}

// Unit u as this rank holds it (config.h's Share): an MoE unit's own tensors (the router; the
// GPT's attention and LayerNorms), then its experts [x_lo, x_hi); any other unit whole.
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

// Sampling: every rank receives all R rows' probabilities (the GPT's at the position
// sampled), this rank's own made in scratch that is free between passes.
static void ep_gather_probs(Run* r, const Rows* rows, int R, const Acts* a, float* probs) {
    const Config* c = &r->cfg;
    long lo, hi;
    split_range(R, r->ep.size, r->ep.rank, &lo, &hi);
    int N = r->ep.size, V = c->vocab, *counts = r->gathered, *displs = counts + N;
    for (int q = 0; q < N; q++) {
        long qlo, qhi;
        split_range(R, N, q, &qlo, &qhi);
        counts[q] = (int)((qhi - qlo) * V), displs[q] = (int)(qlo * V);
    }
    float* own = r->work.scratch.dout;
    model_probs(c, rows, a->out[c->layers + 1], (int)(hi - lo), own);
    MPI_Allgatherv(own, counts[r->ep.rank], MPI_FLOAT, probs, counts, displs, MPI_FLOAT, r->dp.comm);
}

// Mean loss over the whole validation split: every pass's rows are split over the ranks.
static double validation_loss(void* ctx) {
    Run* r = ctx;
    return mean_loss(evaluate(forward, r, &r->ds, 1, 0), &r->ds);
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
    int B = o.batch, M = run.M = o.microbatches;
    long first, R_max = microbatch_rows(B, M, 0, N, 0, &first); // the most rows a rank has in a pass: rank 0's of the first
    ep_init(&run.experts, &run.ep, &run.dp, cfg); // its experts; the counts' all-gather over dp
    ep_layout(&run);
    long np = run.off[n_units(cfg) - 1] + run.n[n_units(cfg) - 1];
    run.st = state_alloc(np, o.opt.adamw);
    Holding holding = ep_holding(&run);
    long start = holding_load(&holding, &o, &run.ds, cfg); // initial values: train.c's (config.h), or --load's
    run.packed = mallocCheck(sizeof(int64_t) * np);
    run.gathered = mallocCheck(sizeof(int) * 2 * N);
    // activations for the most rows a rank has in a pass: an expert's block from one rank is
    // at most that rank's tokens (the MoE layers' routed and expert rows grow as routed)
    work_init(&run.work, cfg, pass_rows(&o, R_max), NULL);
    char layout[192], per_rank[64];
    snprintf(per_rank, sizeof per_rank, X % N ? "%d or %d a rank (uneven: the first ranks take one more)" : "%d a rank",
             X / N, X / N + 1);
    snprintf(layout, sizeof layout, "expert parallel over %d ranks: %d experts a %s (top-%d), %s; %ld rows a rank at most",
             N, X, is_gpt(cfg) ? "block" : "layer", cfg->top_k, per_rank, R_max);
    if (M > 1) snprintf(layout + strlen(layout), sizeof layout - strlen(layout), " of each of %d microbatches", M);
    if (cfg->recompute) snprintf(layout + strlen(layout), sizeof layout - strlen(layout), ", %s recomputation",
                                 recompute_names[cfg->recompute]);
    if (!o.quiet && world_rank == 0) print_config(&o, &run.ds, layout);

    // training loop
    run.n_spans = ep_grad_spans(&run, run.spans);
    DistSave saver = {&holding, &run.ds, cfg};
    Progress progress = progress_start(&o, world_rank == 0, dist_save, &saver, dist_any);
    progress.record_last = run.timeline; // the timeline is drawn from the last step's trace events
    for (long step = start + 1; step <= o.steps; step++)
        if (train_step(&run, &o, &progress, step)) break; // a signal: stop, saved
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, (int)R_max);
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
