/*
 * train_cp.c: context parallel. Every rank takes the whole batch and a share of each row's
 * positions. Everything but attention works token by token (embedding, LayerNorm, the MLP,
 * the residuals, the loss), so each rank runs train.c's layers on its own positions alone.
 * Attention needs every earlier position's keys and values: the ranks exchange them. The
 * parameters are replicated and their gradients summed across the ranks, as in data
 * parallelism. It prints exactly what `./train --model gpt` prints for the same flags.
 *
 *   the zigzag split: T = 16 positions on N = 2 ranks, in 2N chunks
 *     positions  0  1  2  3 | 4  5  6  7 | 8  9 10 11 | 12 13 14 15
 *     rank       0            1            1             0
 *   Rank i holds chunks i and 2N-1-i, so every rank has as many causal (query, key) pairs. A
 *   query at p sees p + 1 keys: 1+2+3+4 + 13+14+15+16 = 68 on rank 0, 5+...+12 = 68 on rank 1
 *   (the contiguous split, rank i chunk i of N: 1+...+8 = 36 and 9+...+16 = 100).
 *
 * One step, in order, for each of the L blocks (ring attention; rank r sends to r + 1):
 *   forward   K goes round the ring for pass 1 of the softmax, the scores and their row max;
 *             then V goes round for pass 2, the exact sums
 *   backward  K and V go round again, and with them their gradients dK and dV, to which
 *             every rank adds its queries' terms; the N-th hop brings each dK and dV home
 * then the parameter gradients are all-reduced (exact sums) and the loss summed, as in train_dp.c.
 * K and V go round again because keeping every rank's until the block's backward would hold,
 * for each of the L blocks, N times this rank's own.
 *
 * Same bits as train.c: the softmax takes two passes (layers.h), the row max, which is exact
 * in any order, then exact fixed-point sums, so it does not matter which rank's keys come first.
 *
 * After the first read, one section each: --cp-comm allgather (Llama 3's), --cp-comm alltoall
 * (Ulysses), --cp-softmax online (ring attention as usually written, not the same bits),
 * --cp-split contiguous, --recompute, --microbatches, the formulas, --timeline; then plumbing.
 *
 *   make train_cp && mpirun -n 2 ./train_cp --model gpt                  # the ring, zigzag split
 *   mpirun -n 2 ./train_cp --model gpt --cp-split contiguous --timeline  # the imbalance, drawn
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// what a rank holds

typedef enum { CP_RING, CP_ALLGATHER, CP_ALLTOALL } CpComm; // --cp-comm

// A tensor that travels round the ring: the copy this rank holds now, and the one arriving.
typedef struct { void *held, *arriving; } Travelling;
typedef struct {
    Group* cp;          // the N ranks that share each row's positions
    CpComm comm;        // --cp-comm
    int zigzag, online; // --cp-split zigzag (1) or contiguous (0); --cp-softmax online (1)
    int Tq;             // T / N: the positions of each row a rank holds (layers.h's BlockDims.Tq)
    int* pos;           // [N][Tq] every rank's positions, ascending; rank q's at cp_pos_of(q)
    BlockDims dims;     // NH heads of HD, A = NH HD wide, R rows; dims.pos: this rank's, cp_pos_of(rank)
    float* rowmax;      // [R][NH][Tq] pass 1's max score of each query and head
    int64_t* expsum;    // [R][NH][Tq] pass 2's exact sum of e = exp(s - rowmax)
    int64_t* pv;        // [R][Tq][A]  pass 2's exact sum of e v
    float* D;           // [R][NH][Tq] backward's dO . y
    int64_t* dq;        // [R][Tq][A]  backward's exact dq
    float* kvT;         // [HD][Tq] layers.h's scratch: one head of K (backward: V), transposed
    Travelling k, v, dk, dv; // the ring's K and V [R][Tq][A], and their gradients dK and dV
    // the chapters' buffers (cp_init allocates those that --cp-comm and --cp-softmax use)
    float *k_all, *v_all, *send, *recv, *heads_y, *heads_dy, *heads_dqkv, *heads_tmp, *run_sum, *run_out, *rank_max;
    int64_t *dk_all, *dv_all, *dk_mine, *dv_mine, *heads_acc;
    int* targets; // [R][Tq] the targets at this rank's positions
} Cp;

// ----------------------------------------------------------------------------
// the zigzag split

static void contiguous_positions(int T, int N, int i, int* pos); // its section, after the first read
static void cp_positions(int T, int N, int zigzag, int i, int* pos) {
    if (!zigzag) return contiguous_positions(T, N, i, pos); // --cp-split contiguous
    int chunk = T / (2 * N), n = 0;
    for (int p = i * chunk; p < (i + 1) * chunk; p++) pos[n++] = p;
    for (int p = (2 * N - 1 - i) * chunk; p < (2 * N - i) * chunk; p++) pos[n++] = p;
}
static const int* cp_pos_of(const Cp* p, int q) { return p->pos + q * p->Tq; }

// ----------------------------------------------------------------------------
// the exact softmax, one rank's keys at a time
//
// layers.h's passes, for query i (row r, head h, position p_i) and one rank's keys j at a
// time, those at positions p_j <= p_i (the causal mask), with exact fixed-point sums (+=):
//   pass 1    s_ij = q_i . k_j / sqrt(HD), into att[r][h][i][p_j]; rowmax_i = max_j s_ij
//   pass 2    e_ij = exp(s_ij - rowmax_i), in place of s_ij; expsum_i += e_ij, pv_i += e_ij v_j
//   the end   P_ij = e_ij / expsum_i, in place; y_i = pv_i / expsum_i
//   backward  D_i = dO_i . y_i, dS_ij = P_ij (dO_i . v_j - D_i) / sqrt(HD);
//             dq_i += dS_ij k_j, dk_j += dS_ij q_i, dv_j += P_ij dO_i
// So att [R][NH][Tq][T] holds this rank's queries against all T keys, whoever holds them; q in
// a->qkv, rows of 3A floats (q, k, v). A term past a sum's range limit stops the run; the more
// terms, the lower the limit (fix_term_limit): d->T, a whole row's count, sets it in every layout.

// pass 1: the scores into a->att, and their row max
static void scores_against(Cp* p, BlockActs* a, const float* k, int src) {
    const BlockDims* d = &p->dims;
    attention_scores(a->att, p->rowmax, a->qkv, 3L * d->A, k, d->A, cp_pos_of(p, src), p->Tq, d, p->kvT);
}
// pass 2: e in place of the scores, and the exact sums of e and of e v
static void sums_against(Cp* p, BlockActs* a, const float* v, int src) {
    const BlockDims* d = &p->dims;
    attention_exp_pv(a->att, p->expsum, p->pv, p->rowmax, v, d->A, cp_pos_of(p, src), p->Tq, d, d->T);
}
// backward: dq gets this rank's queries' terms over src's keys k, v, and so do src's dk and dv
static void gradients_against(Cp* p, const BlockActs* a, const float* datty, const float* k, const float* v,
                              int64_t* dk, int64_t* dv, int src) {
    const BlockDims* d = &p->dims;
    attention_backward_block(p->dq, dk, dv, a->att, p->D, a->qkv, 3L * d->A, k, d->A, v, d->A, datty, d->A,
                             cp_pos_of(p, src), p->Tq, d, p->kvT, d->T);
}

// The exact softmax's bookkeeping (plumbing, at the end): buffers packed, zeroed, unpacked.
static void cp_pack_kv(const float* qkv, float* k, float* v, const BlockDims* d), exact_forward_start(Cp* p);
static void exact_backward_start(Cp* p, const BlockActs* a, const float* datty);
static void exact_backward_end(Cp* p, float* dqkv, const int64_t* dk, const int64_t* dv);

// ----------------------------------------------------------------------------
// ring attention (--cp-comm ring, the default)
//
// A hop posts the tensor held on to rank r + 1 and the next one in from r - 1, computes on the
// one held while they travel, then waits. At hop h rank r holds rank r - h's, so N hops see
// every rank's once and the last posts nothing. Backward's dK and dV leave after the compute,
// since they carry its terms, and on every hop: the last brings each home.
//
//   rank 0 of N = 3  holds, computes on   sends to 1          receives from 2     requests
//   pass 1, hop 0    K0                   K0                  K2                  2
//           hop 1    K2                   K2                  K1                  2
//           hop 2    K1                   -                   -                   0
//   pass 2           the same, with V
//   backward hop 0   K0 V0, dK0 dV0 = 0   K0 V0, dK0 dV0      K2 V2, dK2 dV2      4 + 4
//            hop 1   K2 V2, dK2 dV2       K2 V2, dK2 dV2      K1 V1, dK1 dV1      4 + 4
//            hop 2   K1 V1, dK1 dV1       dK1 dV1 (home)      dK0 dV0 (home)      0 + 4
//   dK0 goes 0 -> 1 -> 2 -> 0, gathering each rank's terms; dK1 goes 1 -> 2 -> 0 -> 1.

// Two requests: req[0] receives what arrives from r - 1, req[1] sends what is held to r + 1.
static void ring_post(Cp* p, Travelling* t, MPI_Datatype type, int tag, MPI_Request* req) {
    int N = p->cp->size, next = (p->cp->rank + 1) % N, prev = (p->cp->rank + N - 1) % N;
    long n = (long)p->dims.R * p->Tq * p->dims.A;
    group_irecv(p->cp, t->arriving, n, type, prev, tag, &req[0]);
    group_isend(p->cp, t->held, n, type, next, tag, &req[1]);
}
static void arrived(Travelling* t) { void* was = t->held; t->held = t->arriving, t->arriving = was; }
static void ring_forward(Cp* p, BlockActs* a) {
    int N = p->cp->size, me = p->cp->rank;
    MPI_Request req[2];
    exact_forward_start(p);                             // rowmax = -infinity, expsum = pv = 0
    cp_pack_kv(a->qkv, p->k.held, p->v.held, &p->dims); // this rank's K and V set out
    for (int hop = 0; hop < N; hop++) {                 // pass 1: K goes round
        int src = (me - hop + N) % N, last = hop == N - 1;
        if (!last) ring_post(p, &p->k, MPI_FLOAT, TAG_KEYS, req);
        double t = trace_clock();
        scores_against(p, a, p->k.held, src);
        trace_event("compute", t, trace_clock(), 0, "scores of rank %d", src);
        group_waitall(p->cp, req, last ? 0 : 2, "ring hop");
        if (!last) arrived(&p->k);
    }
    for (int hop = 0; hop < N; hop++) { // pass 2: V goes round
        int src = (me - hop + N) % N, last = hop == N - 1;
        if (!last) ring_post(p, &p->v, MPI_FLOAT, TAG_VALUES, req);
        double t = trace_clock();
        sums_against(p, a, p->v.held, src);
        trace_event("compute", t, trace_clock(), 0, "sums of rank %d", src);
        group_waitall(p->cp, req, last ? 0 : 2, "ring hop");
        if (!last) arrived(&p->v);
    }
    attention_finish(a->att, a->atty, p->dims.A, p->expsum, p->pv, &p->dims);
}
static void ring_backward(Cp* p, const BlockActs* a, const float* datty, float* dqkv) {
    int N = p->cp->size, me = p->cp->rank;
    long n = (long)p->dims.R * p->Tq * p->dims.A;
    MPI_Request req[8]; // K's and V's two each while they travel, then dK's and dV's
    exact_backward_start(p, a, datty);                  // D = dO . y, dq = 0
    cp_pack_kv(a->qkv, p->k.held, p->v.held, &p->dims); // K and V set out again,
    fix_zero(p->dk.held, n), fix_zero(p->dv.held, n);   // with their gradients, empty
    for (int hop = 0; hop < N; hop++) {
        int src = (me - hop + N) % N, last = hop == N - 1, n_kv_reqs = last ? 0 : 4;
        if (!last) ring_post(p, &p->k, MPI_FLOAT, TAG_KEYS, req), ring_post(p, &p->v, MPI_FLOAT, TAG_VALUES, req + 2);
        double t = trace_clock();
        gradients_against(p, a, datty, p->k.held, p->v.held, p->dk.held, p->dv.held, src);
        trace_event("compute", t, trace_clock(), 0, "gradients of rank %d", src);
        ring_post(p, &p->dk, MPI_INT64_T, TAG_KEY_GRADS, req + n_kv_reqs);
        ring_post(p, &p->dv, MPI_INT64_T, TAG_VALUE_GRADS, req + n_kv_reqs + 2);
        group_waitall(p->cp, req, n_kv_reqs + 4, "ring hop");
        if (!last) arrived(&p->k), arrived(&p->v);
        arrived(&p->dk), arrived(&p->dv);
    }
    exact_backward_end(p, dqkv, p->dk.held, p->dv.held); // after N hops, this rank's own dK and dV
}

// ----------------------------------------------------------------------------
// a block and the model, on this rank's positions
//
// transformer.h's block with attention across ranks in its middle: y = a->atty and the
// probabilities a->att forward, dqkv from dy backward. train_3d.c calls these two as well.
// The attention is the ring's unless --cp-comm or --cp-softmax picks a chapter's; that choice
// and --recompute's are after the first read.
static void cp_attention_forward(Cp* p, BlockActs* a);
static void cp_attention_backward(Cp* p, const BlockActs* a, const float* datty, float* dqkv);
static void cp_unit_recompute(Cp* p, const Config* c, int u, const float* w, Work* work);

static void cp_block_forward(Cp* p, const float* w, Work* work, int u) {
    Acts* a = &work->acts;
    BlockParams prm = block_params(w, &p->dims);
    BlockActs ba = acts_block(a, u, &p->dims, p->Tq); // its per-token tensors: Tq positions a row
    block_forward_qkv(a->out[u - 1], &prm, &ba, &p->dims, &work->ws);
    cp_attention_forward(p, &ba);
    block_forward_out(a->out[u], a->out[u - 1], &prm, &ba, &p->dims, work->scratch.acc, &work->ws);
}
static void cp_block_backward(Cp* p, const float* w, int64_t* g, Work* work, int u, long terms) {
    Acts* a = &work->acts;
    Scratch* s = &work->scratch;
    BlockParams prm = block_params(w, &p->dims);
    BlockGrads gg = block_grads(g, &p->dims);
    BlockActs ba = acts_block(a, u, &p->dims, p->Tq);
    BlockStash st = block_stash(s->stash, &p->dims, p->dims.R);
    block_backward_out(s->tmp, s->dout, &prm, &ba, &st, &p->dims, s->tmp, s->acc, &work->ws);
    cp_attention_backward(p, &ba, s->tmp, st.dqkv);
    block_backward_qkv(s->din, a->out[u - 1], &prm, &ba, &st, &p->dims, s->acc, &work->ws);
    block_backward_weight(&gg, a->out[u - 1], &ba, &st, &p->dims, terms, &work->ws);
}

// The forward of R rows on this rank's positions; returns the exact sum of their tokens' losses.
// a->tokens and a->targets hold whole rows [R][T]: the layers read this rank's positions of them.
static int64_t cp_model_forward(Cp* p, const Config* c, const float* params, Work* w, int R, long rows_total) {
    Acts* a = &w->acts;
    p->dims.R = R;
    for (int r = 0; r < R; r++)
        for (int i = 0; i < p->Tq; i++) p->targets[r * p->Tq + i] = a->targets[(long)r * c->context + p->dims.pos[i]];
    double t = trace_clock();
    // x = wte[token] + wpe[position]: tokens of the whole vocabulary [0, V), with wpe added (1)
    gpt_embedding_forward(a->out[0], a->tokens, params, params + (long)c->vocab * c->emb, 0, c->vocab, 1, &p->dims);
    trace_event("compute", t, trace_clock(), 0, "forward embedding");
    for (int u = 1; u <= c->layers; u++) cp_block_forward(p, params + unit_offset(c, u), w, u);
    t = trace_clock();
    a->loss = gpt_head_forward(c, params + unit_offset(c, c->layers + 1), a, p->targets, &p->dims, rows_total, &w->ws);
    trace_event("compute", t, trace_clock(), 0, "forward head");
    return a->loss;
}
// Backward: this rank's tokens' parameter gradients added into grads (the caller sums them).
static void cp_model_backward(Cp* p, const Config* c, const float* params, int64_t* grads, Work* w, long batch) {
    Acts* a = &w->acts;
    Scratch* s = &w->scratch;
    long terms = batch * c->context; // the whole rows' count: every layout has the same exactness bound (layers.h)
    int u = c->layers + 1;
    double t = trace_clock();
    gpt_head_backward_input(c, params + unit_offset(c, u), a, p->targets, s, s->stash, &p->dims, &w->ws);
    gpt_head_backward_weight(c, grads + unit_offset(c, u), a, s->stash, &p->dims, terms, &w->ws);
    trace_event("compute", t, trace_clock(), 0, "backward head");
    scratch_step_down(s);
    for (u = c->layers; u >= 1; u--) {
        cp_unit_recompute(p, c, u, params + unit_offset(c, u), w); // --recompute: what it did not keep
        cp_block_backward(p, params + unit_offset(c, u), grads + unit_offset(c, u), w, u, terms);
        scratch_step_down(s);
    }
    gpt_embedding_backward(grads, grads + (long)c->vocab * c->emb, a->tokens, s->dout, 0, c->vocab, &p->dims, terms);
}

#ifndef TRAIN_3D // the program's own: train_3d.c uses the strategy above and below, not these
// ----------------------------------------------------------------------------
// one training step

typedef struct {
    Config cfg;
    Dataset ds;      // the data
    State st;        // a whole replica, identical on every rank; its gradients are exact sums
    UnitSizes sizes; // what each unit holds per row: its tensors at this rank's positions
    Work work;       // activations of every row at this rank's positions
    Cp p;
    Group cp;        // every rank
    CpComm comm;     // --cp-comm
    int zigzag, timeline, online; // --cp-split, --timeline, --cp-softmax
} Run;

static int load_microbatch(Run* r, const Rows* batch, int B, int m, int M); // --microbatches: its section
// Returns the step's mean loss.
static double train_step(Run* r, const Options* o, long step) {
    State* st = &r->st;
    int B = o->batch, M = o->microbatches;
    Rows batch = training_rows(&r->ds, o->seed, step, 0);
    long n = dataset_batch_targets(&r->ds, o->seed, step, B); // every rank: the whole batch's count
    int64_t loss = 0;
    fix_zero(st->grads, st->n);
    workspace_keep_weights(&r->work.ws, M > 1);
    for (int m = 0; m < M; m++) { // every rank takes every row, at its positions
        int R = load_microbatch(r, &batch, B, m, M);
        loss += cp_model_forward(&r->p, &r->cfg, st->params, &r->work, R, B);
        cp_model_backward(&r->p, &r->cfg, st->params, st->grads, &r->work, B);
    }
    workspace_keep_weights(&r->work.ws, 0);
    group_allreduce(&r->cp, st->grads, st->n, MPI_INT64_T, MPI_SUM); // every rank's positions' gradients, exact
    group_allreduce(&r->cp, &loss, 1, MPI_INT64_T, MPI_SUM);
    float scale = clip_factor(&o->opt, &(GradSpan){st->grads, st->n}, 1, n, NULL, NULL);
    optimizer_step(&o->opt, st->params, st->grads, st->m, st->v, st->n, grad_factor(n), scale, step);
    return fix_to(loss) / n;
}
#endif // TRAIN_3D

// ============================================================================
// The first read ends here. Each section below adds one thing to it.

// ----------------------------------------------------------------------------
// the all-gather (Llama 3's, --cp-comm allgather)
//
// In place of the ring's hops, one collective brings every rank's K and V at once; the two
// passes then run over them in rank order. Backward gathers them again, and a reduce-scatter
// sums each rank's dK and dV over every rank's queries and brings them home.

static void allgather_forward(Cp* p, BlockActs* a) {
    int N = p->cp->size, me = p->cp->rank;
    long n = (long)p->dims.R * p->Tq * p->dims.A; // a rank's K
    exact_forward_start(p);
    cp_pack_kv(a->qkv, p->k_all + me * n, p->v_all + me * n, &p->dims);
    group_allgather(p->cp, p->k_all + me * n, p->k_all, n, MPI_FLOAT); // K of every rank
    group_allgather(p->cp, p->v_all + me * n, p->v_all, n, MPI_FLOAT); // V of every rank
    double t = trace_clock();
    for (int src = 0; src < N; src++) scores_against(p, a, p->k_all + src * n, src); // pass 1
    for (int src = 0; src < N; src++) sums_against(p, a, p->v_all + src * n, src);   // pass 2
    trace_event("compute", t, trace_clock(), 0, "attention");
    attention_finish(a->att, a->atty, p->dims.A, p->expsum, p->pv, &p->dims);
}
static void allgather_backward(Cp* p, const BlockActs* a, const float* datty, float* dqkv) {
    int N = p->cp->size, me = p->cp->rank;
    long n = (long)p->dims.R * p->Tq * p->dims.A;
    exact_backward_start(p, a, datty);
    cp_pack_kv(a->qkv, p->k_all + me * n, p->v_all + me * n, &p->dims);
    group_allgather(p->cp, p->k_all + me * n, p->k_all, n, MPI_FLOAT); // K of every rank, again
    group_allgather(p->cp, p->v_all + me * n, p->v_all, n, MPI_FLOAT); // V of every rank, again
    fix_zero(p->dk_all, N * n), fix_zero(p->dv_all, N * n);
    double t = trace_clock();
    for (int src = 0; src < N; src++)
        gradients_against(p, a, datty, p->k_all + src * n, p->v_all + src * n, p->dk_all + src * n, p->dv_all + src * n,
                          src);
    trace_event("compute", t, trace_clock(), 0, "attention backward");
    // each rank's slot of dk_all summed over every rank and added into its dk_mine: dK home, exact
    fix_zero(p->dk_mine, n), fix_zero(p->dv_mine, n);
    group_reduce_scatter(p->cp, p->dk_all, n, MPI_INT64_T, MPI_SUM, p->dk_mine); // dK home
    group_reduce_scatter(p->cp, p->dv_all, n, MPI_INT64_T, MPI_SUM, p->dv_mine); // dV home
    exact_backward_end(p, dqkv, p->dk_mine, p->dv_mine);
}

// ----------------------------------------------------------------------------
// Ulysses, by heads (--cp-comm alltoall)
//
// Ulysses (DeepSpeed's) needs no attention across ranks: it turns the split around, for
// attention alone. An all-to-all gives each rank all T positions of q, k and v for NH/N of the
// heads, attention runs on them whole (layers.h's, as in train.c: heads do not meet, so nothing
// of the softmax crosses ranks), and an all-to-all gives the output back by positions. Backward mirrors it: dO to the heads,
// attention's backward, then dq, dk, dv back by positions. Attention's backward also needs
// D = dO . y, a dot within a head: it is computed here, where y is (kept by positions as proj's
// input), and sent by heads, 1/HD of y's bytes. Rank j takes heads [j NH/N, (j+1) NH/N): N must
// divide NH, and each rank needs a head, so N stops at NH.
//
//   mpirun -n 4 --oversubscribe ./train_cp --model gpt --cp-comm alltoall  # a head a rank
//
//   by positions  x [R][Tq][parts][NH heads]   (qkv: parts q, k, v; y, dO: one part)
//   by heads      x [R][T][parts][NH/N heads]  (all-to-all: rank j gets this rank's positions
//                                               at its heads, and puts them at their positions)

// This rank's positions at every rank's heads -> every rank's positions at this rank's heads.
// Ah: the width of a rank's heads; W: a position's row of them, in each part; x may be xh.
static void ulysses_to_heads(Cp* p, const float* x, int parts, float* xh) {
    const BlockDims* d = &p->dims;
    int N = p->cp->size, Ah = d->A / N, W = parts * Ah;
    long tokens = (long)d->R * p->Tq, piece = tokens * W; // piece: what goes to each rank
    for (int j = 0; j < N; j++) // to rank j: this rank's positions, at rank j's heads
        for (long t = 0; t < tokens; t++)
            for (int part = 0; part < parts; part++)
                memcpy(p->send + j * piece + t * W + part * Ah, x + (t * parts + part) * d->A + j * Ah, Ah * 4);
    group_alltoall(p->cp, p->send, p->recv, piece, MPI_FLOAT);
    for (int src = 0; src < N; src++) // from rank src: its positions, each put at its place in the row
        for (int r = 0; r < d->R; r++)
            for (int i = 0; i < p->Tq; i++) {
                long at = (long)r * d->T + cp_pos_of(p, src)[i];
                memcpy(xh + at * W, p->recv + src * piece + ((long)r * p->Tq + i) * W, W * 4);
            }
}
// The reverse: every rank's positions at this rank's heads -> this rank's positions at every
// rank's heads.
static void ulysses_to_positions(Cp* p, const float* xh, int parts, float* x) {
    const BlockDims* d = &p->dims;
    int N = p->cp->size, Ah = d->A / N, W = parts * Ah;
    long tokens = (long)d->R * p->Tq, piece = tokens * W;
    for (int j = 0; j < N; j++) // to rank j: its positions, at this rank's heads
        for (int r = 0; r < d->R; r++)
            for (int i = 0; i < p->Tq; i++) {
                long at = (long)r * d->T + cp_pos_of(p, j)[i];
                memcpy(p->send + j * piece + ((long)r * p->Tq + i) * W, xh + at * W, W * 4);
            }
    group_alltoall(p->cp, p->send, p->recv, piece, MPI_FLOAT);
    for (int src = 0; src < N; src++) // from rank src: this rank's positions, at rank src's heads
        for (long t = 0; t < tokens; t++)
            for (int part = 0; part < parts; part++)
                memcpy(x + (t * parts + part) * d->A + src * Ah, p->recv + src * piece + t * W + part * Ah, Ah * 4);
}
// D [R][NH][Tq] by positions -> [R][NH/N][T] by heads, as the above.
static void ulysses_d_to_heads(Cp* p, const float* D, float* Dh) {
    const BlockDims* d = &p->dims;
    int N = p->cp->size, nh = d->NH / N;
    long piece = (long)d->R * nh * p->Tq;
    for (int j = 0; j < N; j++) // to rank j: this rank's queries' D at rank j's heads
        for (int r = 0; r < d->R; r++)
            for (int h = 0; h < nh; h++)
                memcpy(p->send + j * piece + ((long)r * nh + h) * p->Tq, D + ((long)r * d->NH + j * nh + h) * p->Tq, p->Tq * 4);
    group_alltoall(p->cp, p->send, p->recv, piece, MPI_FLOAT);
    for (int src = 0; src < N; src++) // from rank src: its queries' D, each at its position
        for (int r = 0; r < d->R; r++)
            for (int h = 0; h < nh; h++)
                for (int i = 0; i < p->Tq; i++)
                    Dh[((long)r * nh + h) * d->T + cp_pos_of(p, src)[i]] = p->recv[src * piece + ((long)r * nh + h) * p->Tq + i];
}
// attention's shapes by heads: NH/N heads, A/N wide, every position
static BlockDims ulysses_dims(const Cp* p) {
    BlockDims h = p->dims;
    h.NH /= p->cp->size, h.A /= p->cp->size, h.Tq = h.T, h.pos = NULL;
    return h;
}

// train.c's attention on this rank's NH/N heads, every position (--recompute selective runs it again)
static void ulysses_attention(Cp* p, BlockActs* a) {
    BlockDims h = ulysses_dims(p);
    double t = trace_clock();
    attention_forward(p->heads_y, a->att, a->qkv, &h, p->heads_tmp, p->heads_acc);
    trace_event("compute", t, trace_clock(), 0, "attention");
}
static void ulysses_forward(Cp* p, BlockActs* a) {
    ulysses_to_heads(p, a->qkv, 3, a->qkv); // q, k, v by heads, kept so for backward (attention alone reads them)
    ulysses_attention(p, a);
    ulysses_to_positions(p, p->heads_y, 1, a->atty); // y back by positions
}
static void ulysses_backward(Cp* p, const BlockActs* a, const float* datty, float* dqkv) {
    BlockDims h = ulysses_dims(p);
    float *D = p->heads_tmp, *vT = p->heads_tmp + (long)h.R * h.NH * h.T; // D by heads; a head's V, transposed
    attention_backward_d(p->D, datty, a->atty, p->dims.A, &p->dims); // D = dO . y, here, by positions
    ulysses_to_heads(p, datty, 1, p->heads_dy);                       // dO by heads
    ulysses_d_to_heads(p, p->D, D);                                   // D by heads
    double t = trace_clock();
    attention_backward_from_d(p->heads_dqkv, p->heads_dy, a->qkv, a->att, D, &h, vT, p->heads_acc);
    trace_event("compute", t, trace_clock(), 0, "attention backward");
    ulysses_to_positions(p, p->heads_dqkv, 3, dqkv); // dq, dk, dv back by positions
}

// ----------------------------------------------------------------------------
// --cp-softmax online: ring attention as usually written, for comparison
//
// This is ring attention as usually written: one pass, in float, not train.c's bits. K and V
// go round together, once; for each rank's keys a query's running max m, sum S and output O
// are rescaled by exp(m_old - m_new) and the new terms added, in float. The rescaling depends on the order in which the ranks' keys raised the
// max, and the float sums on how the keys were split: the result is within a rounding of
// train.c's, not its bits, and the difference grows with the steps. Backward is the exact
// one, on P = exp(s - m) / S.

static void online_against(Cp* p, BlockActs* a, int src) {
    const BlockDims* d = &p->dims;
    const int* kpos = cp_pos_of(p, src);
    int A = d->A, HD = d->HD;
    long heads = (long)d->R * d->NH * p->Tq;
    for (long i = 0; i < heads; i++) p->rank_max[i] = -INFINITY;
    attention_scores(a->att, p->rank_max, a->qkv, 3 * A, p->k.held, A, kpos, p->Tq, d, p->kvT);
    for (int r = 0; r < d->R; r++)
        for (int hd = 0; hd < d->NH; hd++)
            for (int i = 0; i < p->Tq; i++) {
                long rhi = ((long)r * d->NH + hd) * p->Tq + i;
                if (p->rank_max[rhi] == -INFINITY) continue; // the mask hides all of src's keys
                float m = p->rowmax[rhi] > p->rank_max[rhi] ? p->rowmax[rhi] : p->rank_max[rhi];
                float scale = expf(p->rowmax[rhi] - m), *o = p->run_out + ((long)r * p->Tq + i) * A + hd * HD;
                p->run_sum[rhi] *= scale;
                for (int x = 0; x < HD; x++) o[x] *= scale;
                for (int j = 0; j < p->Tq && kpos[j] <= d->pos[i]; j++) {
                    float e = expf(a->att[rhi * d->T + kpos[j]] - m);
                    const float* vj = (const float*)p->v.held + ((long)r * p->Tq + j) * A + hd * HD;
                    p->run_sum[rhi] += e;
                    for (int x = 0; x < HD; x++) o[x] += e * vj[x];
                }
                p->rowmax[rhi] = m;
            }
}
static void online_forward(Cp* p, BlockActs* a) {
    const BlockDims* d = &p->dims;
    int N = p->cp->size, A = d->A, HD = d->HD;
    long heads = (long)d->R * d->NH * p->Tq;
    for (long i = 0; i < heads; i++) p->rowmax[i] = -INFINITY, p->run_sum[i] = 0.0f;
    memset(p->run_out, 0, (long)d->R * p->Tq * A * sizeof(float));
    cp_pack_kv(a->qkv, p->k.held, p->v.held, d);
    for (int hop = 0; hop < N; hop++) { // K and V go round together
        int src = (p->cp->rank - hop + N) % N, m = hop < N - 1 ? 4 : 0;
        MPI_Request req[4];
        if (m) ring_post(p, &p->k, MPI_FLOAT, TAG_KEYS, req), ring_post(p, &p->v, MPI_FLOAT, TAG_VALUES, req + 2);
        double t = trace_clock();
        online_against(p, a, src);
        trace_event("compute", t, trace_clock(), 0, "online of rank %d", src);
        group_waitall(p->cp, req, m, "ring hop");
        if (m) arrived(&p->k), arrived(&p->v);
    }
    for (int r = 0; r < d->R; r++) // y = O / S; P = exp(s - m) / S for backward
        for (int hd = 0; hd < d->NH; hd++)
            for (int i = 0; i < p->Tq; i++) {
                long rhi = ((long)r * d->NH + hd) * p->Tq + i, at = ((long)r * p->Tq + i) * A + hd * HD;
                float* prow = a->att + rhi * d->T;
                for (int t = 0; t < d->T; t++) prow[t] = t <= d->pos[i] ? expf(prow[t] - p->rowmax[rhi]) / p->run_sum[rhi] : 0.0f;
                for (int x = 0; x < HD; x++) a->atty[at + x] = p->run_out[at + x] / p->run_sum[rhi];
            }
}

// ----------------------------------------------------------------------------
// which attention a block runs

static void cp_attention_forward(Cp* p, BlockActs* a) {
    if (p->comm == CP_ALLTOALL) ulysses_forward(p, a);
    else if (p->comm == CP_ALLGATHER) allgather_forward(p, a);
    else if (p->online) online_forward(p, a);
    else ring_forward(p, a);
}
static void cp_attention_backward(Cp* p, const BlockActs* a, const float* datty, float* dqkv) {
    if (p->comm == CP_ALLTOALL) ulysses_backward(p, a, datty, dqkv);
    else if (p->comm == CP_ALLGATHER) allgather_backward(p, a, datty, dqkv);
    else ring_backward(p, a, datty, dqkv); // --cp-softmax online's backward is the ring's exact one
}

// ----------------------------------------------------------------------------
// --cp-split contiguous
//
// The plain split, rank i chunk i of N, leaves the causal mask's work unbalanced: the first
// rank's queries see few keys, the last rank's all (36 and 100 pairs for T = 16, N = 2);
// --timeline draws it. The zigzag split above pairs an early chunk with a late one.

static void contiguous_positions(int T, int N, int i, int* pos) {
    int chunk = T / N, n = 0;
    for (int p = i * chunk; p < (i + 1) * chunk; p++) pos[n++] = p;
}

// ----------------------------------------------------------------------------
// --recompute
//
// Recomputation keeps less between a block's forward and its backward, and makes it again
// just before the backward, its attention's exchanges with it.

// --recompute selective: the probabilities again, before the block's backward (the ring and
// the all-gather bring every rank's K and V again; Ulysses kept its heads' q, k, v: no all-to-all)
static void cp_attention_again(Cp* p, BlockActs* a) {
    if (p->comm == CP_ALLTOALL) ulysses_attention(p, a);
    else cp_attention_forward(p, a);
}
// Before block u's backward (model.h's unit_recompute, across ranks): selective, attention's
// probabilities again; full, the whole block again from its input.
static void cp_unit_recompute(Cp* p, const Config* c, int u, const float* w, Work* work) {
    if (c->recompute == RECOMPUTE_NONE || !is_block(c, u)) return;
    double t = trace_clock();
    BlockActs ba = acts_block(&work->acts, u, &p->dims, p->Tq);
    if (c->recompute == RECOMPUTE_FULL) cp_block_forward(p, w, work, u);
    else cp_attention_again(p, &ba);
    trace_event("compute", t, trace_clock(), 0, "recompute %s", unit_name(c, u));
}

// ----------------------------------------------------------------------------
// --microbatches M
//
// Microbatches hold the activations of fewer rows at a time: every rank takes every row of
// each microbatch, at its positions, and the gradients of all add into the same exact sums,
// all-reduced once a step, so M changes the memory, not the bits. (The kernels keep their
// packed weights across a step's microbatches: workspace_keep_weights, in the step.)

#ifndef TRAIN_3D
static int load_microbatch(Run* r, const Rows* batch, int B, int m, int M) {
    long first, end;
    split_range(B, M, m, &first, &end);
    work_load(&r->work, batch, first, (int)(end - first), r->cfg.context);
    return (int)(end - first);
}
#endif

// ----------------------------------------------------------------------------
// the formulas: bytes and memory
//
// The formulas say what each exchange costs, and the report sets them beside what was measured.
//
// Per rank and step, for N ranks, L blocks, P parameters and B rows; a rank's K (or V, dK,
// dV) holds kv = B x Tq x C elements (Tq = T / N), floats of 4 B, exact sums of 8 B:
//   ring        forward: K round, then V: N - 1 hops each                    2 (N-1) x 4 kv
//               backward: K and V round again                                2 (N-1) x 4 kv
//                         and dK and dV, N hops each (the N-th: home)        2 N x 8 kv
//   all-gather  forward: K and V all-gathered, N - 1 ranks' shares each       2 (N-1) x 4 kv
//               backward: again                                              2 (N-1) x 4 kv
//                         and dK and dV reduce-scattered: N - 1 shares each   2 (N-1) x 8 kv
//   all-to-all  forward: q, k, v to the heads, y back: 4 all-to-alls of a    4 (N-1)/N x 4 kv
//               rank's width, each sending the N - 1 others their (N-1)/N
//               backward: dO to the heads, dq, dk, dv back; D, 1/HD of a     (4 + 1/HD) (N-1)/N x 4 kv
//               width, to the heads
//   --recompute selective: the ring's and the all-gather's forward again     + the forward's (Ulysses: 0)
//   --recompute full: the forward again, for every --cp-comm                 + the forward's
//   each of L blocks; then the gradients' all-reduce, and the loss's (1 more) 2 (N-1)/N x 8 B x (P + 1)
// (--microbatches M: the same; the blocks' bytes are per row, the all-reduce once a step)
// Memory: train.c's replica, (4 + 8, + 8 with AdamW) B x P; train.c's activations of this
// rank's Tq positions (attention's probabilities among them: Tq rows of T a head); and the
// buffers of attention across ranks below, as cp_init allocates them.

// The bytes a rank sends for one block's attention across ranks, forward and backward and
// with --recompute, when a rank's K holds kv elements (train_3d.c calls it too, at its tensor
// rank's heads).
static double cp_sent_per_block(const Cp* p, double kv, int recompute) {
    double N = p->cp->size, fwd = 2 * (N - 1) * 4 * kv, back = fwd; // the ring's and the all-gather's K and V again
    if (p->comm == CP_RING) back += 2 * N * 8 * kv;
    if (p->comm == CP_ALLGATHER) back += 2 * (N - 1) * 8 * kv;
    if (p->comm == CP_ALLTOALL) fwd = 4 * (N - 1) / N * 4 * kv, back = (4 + 1.0 / p->dims.HD) * (N - 1) / N * 4 * kv;
    int again = recompute == RECOMPUTE_FULL || (recompute == RECOMPUTE_SELECTIVE && p->comm != CP_ALLTOALL);
    return fwd + back + again * fwd;
}
static double cp_sent_formula(const Cp* p, const Config* c, long B, long np) {
    double kv = (double)B * p->Tq * c->emb;
    return c->layers * cp_sent_per_block(p, kv, c->recompute) + ring_allreduce_bytes(8.0 * np + 8.0, p->cp->size);
}

// The bytes of cp_init's buffers for `rows` rows (kv: a rank's K; heads: one a query and head)
static double cp_attention_bytes(const Cp* p, const Config* c, long rows) {
    double N = p->cp->size, kv = (double)rows * p->Tq * c->emb, heads = (double)rows * c->heads * p->Tq;
    double HD = c->emb / c->heads, bytes = 4 * heads; // D
    if (p->comm != CP_ALLTOALL) bytes += (4 + 8) * heads // rowmax, expsum
                                         + (8 + 8) * kv      // pv, dq
                                         + 4 * HD * p->Tq;   // kvT
    if (p->comm == CP_RING) bytes += 2 * (4 + 4) * kv  // K and V, held and arriving
                                     + 2 * (8 + 8) * kv; // dK and dV, held and arriving
    if (p->comm == CP_ALLGATHER) bytes += (4 + 4) * N * kv // every rank's K and V
                                          + (8 + 8) * N * kv // dK and dV of every rank's keys
                                          + (8 + 8) * kv;    // this rank's dK and dV
    if (p->comm == CP_ALLTOALL) bytes += (4 + 4) * 3 * kv          // send, recv
                                         + (4 + 4 + 4 * 3) * kv    // heads_y, heads_dy, heads_dqkv
                                         + 4 * (heads + HD * c->context) + 8 * 3 * kv; // heads_tmp, heads_acc
    if (p->online) bytes += (4 + 4) * heads + 4 * kv; // run_sum, rank_max; run_out
    return bytes;
}

#ifndef TRAIN_3D
// The formulas of figures(), in words, for the report, by --cp-comm (kv = B T/N C, a rank's K).
static const char* sent_words[] = {
    "L x (K and V 2(N-1) x 4 B x kv forward, again backward; dK and dV 2N x 8 B x kv) + 2(N-1)/N x 8 B x (P + 1)",
    "L x (K and V 2(N-1) x 4 B x kv forward, again backward; dK and dV 2(N-1) x 8 B x kv) + 2(N-1)/N x 8 B x (P + 1)",
    "L x (4 forward + 4 + 1/HD backward all-to-alls of (N-1)/N x 4 B x kv) + 2(N-1)/N x 8 B x (P + 1)"};
static const char* mem_words[] = {
    "(4 + 8 + 8 AdamW) B x P + activations of T/N positions + K, V, dK, dV held and arriving",
    "(4 + 8 + 8 AdamW) B x P + activations of T/N positions + every rank's K, V, dK, dV",
    "(4 + 8 + 8 AdamW) B x P + activations of T/N positions + all-to-all buffers and attention's, by heads"};

static Figures figures(const Run* r, const Progress* pr, int B, int R) {
    const Config* c = &r->cfg;
    long np = r->st.n;
    double N = r->cp.size, T = c->context, Tq = r->p.Tq;
    double opt_bytes = r->st.m ? 8.0 : 0.0, attn = cp_attention_bytes(&r->p, c, R);
    // held for the R rows of a microbatch (model.h's acts_bytes_per_row; --recompute: its acts_saved_per_row): every row's tokens and targets (loaded whole), and at this rank's
    // positions the embedding's output, each block's output and BlockActs, the head's
    // LayerNorm and probabilities (sizes); and the targets at those positions (4 B x Tq a row)
    double held = R * (acts_bytes_per_row(c, 0, n_units(c), &r->sizes) + 4 * Tq);
    // the formula: train.c's activations of a row over N (every tensor is per position, attention's
    // probabilities Tq rows of T), but the row's tokens and targets, 4 B each a position, loaded
    // whole on every rank: (1 - 1/N) x 8 B x T more; and the targets at its positions, 4 B x Tq
    double formula = R * (acts_bytes_per_row(c, 0, n_units(c), NULL) / N + (1 - 1 / N) * 8 * T + 4 * Tq);
    Figures f = {.sent = per_step(pr, r->cp.sent), .received = per_step(pr, r->cp.received), .params = 4.0 * np,
                 .grads = 8.0 * np, .optim = opt_bytes * np, .acts = held + attn, .bubble = -1};
    f.sent_formula = cp_sent_formula(&r->p, c, B, np);
    f.mem_formula = (4.0 + 8.0 + opt_bytes) * np + formula + attn;
    return f;
}
#endif

// ----------------------------------------------------------------------------
// --timeline
//
// The timeline shows the last step on every rank, from its trace events: the ring's scores (K)
// and sums (V) on each rank's keys, --cp-softmax online's (O), the gradients (b), the
// all-gather's and Ulysses' attention (A, and b backward), waits for a hop (|) and the other
// communication (>: the all-gathers, the all-to-alls).

#ifndef TRAIN_3D
static char cp_mark(const TraceEvent* e) {
    if (!strncmp(e->name, "scores", 6)) return 'K';
    if (!strncmp(e->name, "sums", 4)) return 'V';
    if (!strncmp(e->name, "online", 6)) return 'O';
    if (!strncmp(e->name, "gradients", 9)) return 'b';
    if (!strncmp(e->name, "attention backward", 18)) return 'b';
    if (!strncmp(e->name, "attention", 9)) return 'A';
    if (!strncmp(e->name, "ring hop", 8)) return '|';
    if (!strcmp(e->cat, "comm") && strncmp(e->name, "send", 4)) return '>'; // (a send is posted in no time)
    return 0;
}
static void cp_timeline(const Run* r, double step_t0) {
    dist_trace_timeline(r->cp.comm, step_t0, cp_mark, "K scores on a rank's keys, V its exact sums, O both in "
                        "one pass (--cp-softmax online), b its gradients (or attention's backward), A attention over the "
                        "gathered keys or (alltoall) on its heads, | waiting for a hop, > a collective");
}
#endif

// ============================================================================
// What only serves the strategy: buffers, options, the run's plumbing, main.

// ----------------------------------------------------------------------------
// the exact softmax's bookkeeping, and the buffers

// This rank's K and V, from its q k v rows [R Tq][3A], into k and v [R Tq][A].
static void cp_pack_kv(const float* qkv, float* k, float* v, const BlockDims* d) {
    long tokens = (long)d->R * d->Tq;
    for (long i = 0; i < tokens; i++) {
        memcpy(k + i * d->A, qkv + i * 3 * d->A + d->A, d->A * sizeof(float));
        memcpy(v + i * d->A, qkv + i * 3 * d->A + 2 * d->A, d->A * sizeof(float));
    }
}
static void exact_forward_start(Cp* p) {
    const BlockDims* d = &p->dims;
    long heads = (long)d->R * d->NH * d->Tq, n = (long)d->R * d->Tq * d->A;
    for (long i = 0; i < heads; i++) p->rowmax[i] = -INFINITY;
    fix_zero(p->expsum, heads), fix_zero(p->pv, n);
}
static void exact_backward_start(Cp* p, const BlockActs* a, const float* datty) {
    const BlockDims* d = &p->dims;
    attention_backward_d(p->D, datty, a->atty, d->A, d); // D = dO . y, per query and head
    fix_zero(p->dq, (long)d->R * d->Tq * d->A);
}
// dqkv [R Tq][3A] from the exact dq and this rank's dK and dV.
static void exact_backward_end(Cp* p, float* dqkv, const int64_t* dk, const int64_t* dv) {
    long tokens = (long)p->dims.R * p->Tq;
    int A = p->dims.A;
    for (long i = 0; i < tokens; i++)
        for (int x = 0; x < A; x++) {
            dqkv[i * 3 * A + x] = (float)fix_to(p->dq[i * A + x]);
            dqkv[i * 3 * A + A + x] = (float)fix_to(dk[i * A + x]);
            dqkv[i * 3 * A + 2 * A + x] = (float)fix_to(dv[i * A + x]);
        }
}

// Allocates each buffer of the Cp struct that --cp-comm and --cp-softmax use, for up to
// `rows` rows; cp_attention_bytes, in the formulas, counts each.
static void cp_init(Cp* p, Group* cp, const Config* c, int rows, CpComm comm, int zigzag, int online) {
    int N = cp->size, T = c->context, C = c->emb, HD = c->emb / c->heads;
    *p = (Cp){.cp = cp, .comm = comm, .zigzag = zigzag, .online = online, .Tq = T / N};
    p->pos = mallocCheck(sizeof(int) * T);
    for (int q = 0; q < N; q++) cp_positions(T, N, zigzag, q, p->pos + q * p->Tq);
    p->dims = gpt_dims(c, rows);
    p->dims.Tq = p->Tq, p->dims.pos = p->pos + cp->rank * p->Tq;
    long kv = (long)rows * p->Tq * C, heads = (long)rows * c->heads * p->Tq;
    p->D = mallocCheck(sizeof(float) * heads);
    if (comm != CP_ALLTOALL) {
        p->rowmax = mallocCheck(sizeof(float) * heads);
        p->expsum = mallocCheck(sizeof(int64_t) * heads);
        p->pv = mallocCheck(sizeof(int64_t) * kv), p->dq = mallocCheck(sizeof(int64_t) * kv);
        p->kvT = mallocCheck(sizeof(float) * HD * p->Tq);
    }
    if (comm == CP_RING) {
        Travelling* f[2] = {&p->k, &p->v};
        Travelling* x[2] = {&p->dk, &p->dv};
        for (int i = 0; i < 2; i++) {
            f[i]->held = mallocCheck(sizeof(float) * kv), f[i]->arriving = mallocCheck(sizeof(float) * kv);
            x[i]->held = mallocCheck(sizeof(int64_t) * kv), x[i]->arriving = mallocCheck(sizeof(int64_t) * kv);
        }
    }
    if (comm == CP_ALLGATHER) {
        p->k_all = mallocCheck(sizeof(float) * N * kv), p->v_all = mallocCheck(sizeof(float) * N * kv);
        p->dk_all = mallocCheck(sizeof(int64_t) * N * kv), p->dv_all = mallocCheck(sizeof(int64_t) * N * kv);
        p->dk_mine = mallocCheck(sizeof(int64_t) * kv), p->dv_mine = mallocCheck(sizeof(int64_t) * kv);
    }
    if (comm == CP_ALLTOALL) { // by heads: R T A/N = R Tq A = kv elements a part
        p->send = mallocCheck(sizeof(float) * 3 * kv), p->recv = mallocCheck(sizeof(float) * 3 * kv);
        p->heads_y = mallocCheck(sizeof(float) * kv), p->heads_dy = mallocCheck(sizeof(float) * kv);
        p->heads_dqkv = mallocCheck(sizeof(float) * 3 * kv);
        p->heads_tmp = mallocCheck(sizeof(float) * (heads + (long)HD * T)); // row max or D by heads; k or v transposed
        p->heads_acc = mallocCheck(sizeof(int64_t) * 3 * kv);              // sums of e, e v; or dq, dk, dv
    }
    if (online) {
        p->run_sum = mallocCheck(sizeof(float) * heads), p->rank_max = mallocCheck(sizeof(float) * heads);
        p->run_out = mallocCheck(sizeof(float) * kv);
    }
    p->targets = mallocCheck(sizeof(int) * (long)rows * p->Tq);
}
static void cp_free(Cp* p) {
    Travelling* t[4] = {&p->k, &p->v, &p->dk, &p->dv};
    for (int i = 0; i < 4; i++) free(t[i]->held), free(t[i]->arriving);
    free(p->pos), free(p->rowmax), free(p->D), free(p->expsum), free(p->pv), free(p->dq), free(p->kvT);
    free(p->k_all), free(p->v_all), free(p->dk_all), free(p->dv_all), free(p->dk_mine), free(p->dv_mine);
    free(p->send), free(p->recv), free(p->heads_y), free(p->heads_dy), free(p->heads_dqkv), free(p->heads_tmp);
    free(p->heads_acc), free(p->run_sum), free(p->rank_max), free(p->run_out), free(p->targets);
}

static const char* cp_comm_names[] = {"ring", "all-gather", "all-to-all (Ulysses)"};
static const char* cp_comm_flags[] = {"ring", "allgather", "alltoall"}; // --cp-comm's values

// --cp-comm's value (train_cp.c's flags, and train_3d.c's): NULL, or the error.
static const char* cp_comm_parse(const char* value, CpComm* comm) {
    for (int c = CP_RING; c <= CP_ALLTOALL; c++)
        if (!strcmp(value, cp_comm_flags[c])) return *comm = (CpComm)c, NULL;
    return "--cp-comm must be ring, allgather or alltoall";
}

// --cp-comm alltoall, for a refusal's message: which N > 1 would split `heads` heads (whole
// ones a rank) and T positions (in 2N chunks, or N): "N = 2 or 4 would do", N named `n`
// ("N", or a flag: "--cp 2 or 4 would do").
static const char* ulysses_fits(int heads, int T, int zigzag, const char* n) {
    static char fits[160];
    int count = 0, at = 0;
    for (int N = 2; N <= heads; N++) count += heads % N == 0 && T % (zigzag ? 2 * N : N) == 0;
    if (count == 0) snprintf(fits, sizeof fits, "no %s above 1 would do", n);
    else at = snprintf(fits, sizeof fits, "%s%s", n, n[0] == '-' ? " " : " = ");
    for (int N = 2, k = 0; N <= heads && count > 0 && at < 120; N++)
        if (heads % N == 0 && T % (zigzag ? 2 * N : N) == 0)
            k++, at += snprintf(fits + at, sizeof fits - at, "%s%d%s", k == 1 ? "" : k == count ? " or " : ", ", N,
                                k == count ? " would do" : "");
    return fits;
}

#ifndef TRAIN_3D // the rest of this file is the program; train_3d.c uses only the strategy above

#define RUN_LINE "mpirun -n 2 ./train_cp --model gpt"

// ----------------------------------------------------------------------------
// the run's plumbing

static void run_free(Run* r) {
    dataset_free(&r->ds), state_free(&r->st), work_free(&r->work), cp_free(&r->p);
}

// --save: this run's checkpoint at `step` (every rank calls it)
static void save(void* ctx, const Options* o, long step) {
    Run* r = ctx;
    if (world_rank == 0) ckpt_save(o, &r->ds, &r->cfg, step, &r->st); // every rank holds the same replica
}

// ----------------------------------------------------------------------------
// the forward pass: every row, this rank's positions; sampling

// The rank that holds position t, and t's index among its positions.
static int cp_owner(const Cp* p, int t, int* at) {
    for (int q = 0; q < p->cp->size; q++)
        for (int i = 0; i < p->Tq; i++)
            if (cp_pos_of(p, q)[i] == t) return *at = i, q;
    return *at = 0, 0;
}

// For sampling (probs not NULL), the probabilities of the next token after position rows->pos
// (data.h): its rank broadcasts them.
static int64_t forward(void* ctx, const Rows* rows, long first, int R, long rows_total, float* probs) {
    Run* r = ctx;
    const Config* c = &r->cfg;
    work_load(&r->work, rows, first, R, c->context);
    int64_t loss = cp_model_forward(&r->p, c, r->st.params, &r->work, R, rows_total);
    if (probs) {
        int at, owner = cp_owner(&r->p, rows->pos, &at), V = c->vocab;
        const float* out = r->work.acts.out[c->layers + 1];
        for (int row = 0; row < R && owner == r->cp.rank; row++)
            memcpy(probs + (long)row * V, out + ((long)row * r->p.Tq + at) * V, V * sizeof(float));
        MPI_Bcast(probs, R * V, MPI_FLOAT, owner, r->cp.comm); // from the rank holding the position
    }
    return loss;
}

// Mean loss over the whole validation split: every rank its positions of every row.
static double validation_loss(void* ctx) {
    Run* r = ctx;
    int64_t total = evaluate(forward, r, &r->ds, 1, 0);
    group_allreduce(&r->cp, &total, 1, MPI_INT64_T, MPI_SUM);
    return mean_loss(total, &r->ds);
}

// ----------------------------------------------------------------------------
// options of this program

static const CliFlag cp_flags[] = {
    {"cp-comm", "HOW", "attention across ranks: ring (default; ring attention), allgather (Llama 3's) or alltoall "
                       "(Ulysses: by heads; N must divide --heads)"},
    {"cp-split", "HOW", "positions per rank: zigzag (default; chunks i and 2N-1-i of 2N) or contiguous"},
    {"timeline", NULL, "draw the last step of every rank: each rank's keys, each hop"},
    {"cp-softmax", "HOW", "exact (default: two passes, train.c's bits) or online (one pass, for comparison: not its bits)"},
};
static const char* cp_flag(void* ctx, int index, const char* value) {
    Run* r = ctx;
    if (index == 0) return cp_comm_parse(value, &r->comm);
    if (index == 1) {
        if (!strcmp(value, "zigzag")) r->zigzag = 1;
        else if (!strcmp(value, "contiguous")) r->zigzag = 0;
        else return "--cp-split must be zigzag or contiguous";
    }
    if (index == 2) r->timeline = 1;
    if (index == 3) {
        if (!strcmp(value, "exact")) r->online = 0;
        else if (!strcmp(value, "online")) r->online = 1;
        else return "--cp-softmax must be exact or online";
    }
    return NULL;
}

// The causal (query, key) pairs of a rank's positions: its share of attention's work.
static long cp_pairs(const int* pos, int Tq) {
    long n = 0;
    for (int i = 0; i < Tq; i++) n += pos[i] + 1;
    return n;
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    Run run = {.cp = group_world("cp"), .comm = CP_RING, .zigzag = 1};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, cp_flags, 4, cp_flag, &run);
    dist_dense_only(&o, RUN_LINE);
    if (run.online && run.comm != CP_RING)
        dist_exit(2, RUN_LINE, "--cp-softmax online is ring attention's one-pass softmax: it applies to --cp-comm ring");
    if (!is_gpt(&o.model))
        dist_exit(2, RUN_LINE, "context parallelism splits a row's positions, which only the GPT has (--model gpt): "
                  "the MLP's rows are single examples");

    // data
    load_data(&run.ds, &o, &run.cfg);
    Config* cfg = &run.cfg;
    int N = run.cp.size, T = cfg->context;
    if (run.zigzag && T % (2 * N) != 0)
        dist_exit(2, RUN_LINE, "%d ranks and %d positions: the zigzag split cuts T into 2N = %d equal chunks (rank i "
                  "takes chunks i and 2N-1-i), so 2N must divide T (pass --context, or use --cp-split contiguous)", N,
                  T, 2 * N);
    if (!run.zigzag && T % N != 0)
        dist_exit(2, RUN_LINE, "%d ranks and %d positions: the contiguous split cuts T into N equal chunks, so N must "
                  "divide T (pass --context)", N, T);
    if (run.comm == CP_ALLTOALL && cfg->heads % N != 0)
        dist_exit(2, RUN_LINE, "%d ranks and %d heads: --cp-comm alltoall (Ulysses) gives each rank whole heads, %d/N "
                  "of them, so N must divide the heads: %s here (%d positions, %s split); or change --heads, or "
                  "use --cp-comm ring", N, cfg->heads, cfg->heads, ulysses_fits(cfg->heads, T, run.zigzag, "N"),
                  T, run.zigzag ? "zigzag" : "contiguous");

    // model: a whole replica, its exact gradient sums and optimizer state; activations
    long np = n_params(cfg);
    run.st = state_alloc(np, o.opt.adamw);
    long start = state_load(&run.st, &o, &run.ds, cfg);
    int B = o.batch, M = o.microbatches, rows = pass_rows(&o, (B + M - 1) / M); // a microbatch, or an eval pass
    cp_init(&run.p, &run.cp, cfg, rows, run.comm, run.zigzag, run.online);
    gpt_unit_sizes(cfg, &run.p.dims, cfg->vocab, run.p.Tq, &run.sizes);
    work_init(&run.work, cfg, rows, &run.sizes);
    char layout[160];
    snprintf(layout, sizeof layout, "context parallel over %d ranks: %d of %d positions each (%s), attention by %s%s", N,
             run.p.Tq, T, run.zigzag ? "zigzag" : "contiguous", cp_comm_names[run.comm],
             run.online ? " with the one-pass online softmax (not exact)" : "");
    if (!o.quiet && world_rank == 0) {
        print_config(&o, &run.ds, layout);
        for (int q = 0; q < N; q++) {
            printf("  rank %-3d   positions", q);
            for (int i = 0; i < run.p.Tq; i++) printf(" %d", cp_pos_of(&run.p, q)[i]);
            printf(": %ld causal pairs (whole row: %ld)\n", cp_pairs(cp_pos_of(&run.p, q), run.p.Tq), (long)T * (T + 1) / 2);
        }
    }

    // training loop
    Progress progress = progress_start(&o, world_rank == 0, save, &run, dist_any);
    progress.record_last = run.timeline; // the timeline is drawn from the last step's trace events
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        double loss = train_step(&run, &o, step);
        if (step_end(&progress, step, loss, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, B, (B + M - 1) / M); // a microbatch's activations
    char sent[300]; // --recompute: the forward's collectives again, but Ulysses' selective
    int again = cfg->recompute == RECOMPUTE_FULL || (cfg->recompute == RECOMPUTE_SELECTIVE && run.comm != CP_ALLTOALL);
    snprintf(sent, sizeof sent, "%s%s", sent_words[run.comm], again ? " + L x the forward's again (--recompute)" : "");
    Report rep = {"train_cp.c", layout, sent, mem_words[run.comm]};
    free(dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run));
    if (run.timeline && progress.steps > 0) cp_timeline(&run, progress.t0);
    run_free(&run);
    MPI_Finalize();
    return 0;
}

#endif // TRAIN_3D
