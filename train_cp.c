/*
 * train_cp.c: context parallel. Every rank takes the whole batch and a share of each
 * row's positions. Everything but attention works token by token (embedding, LayerNorm,
 * the MLP, the residuals, the loss), so each rank runs it on its own positions alone;
 * attention needs every earlier position's keys and values, which the ranks exchange:
 * all-gathered (Llama 3's choice), or passed round a ring (ring attention). The parameters
 * are replicated and their gradients summed across the ranks, as in data parallelism. It
 * prints exactly what `./train --model gpt` prints for the same flags: no public context
 * parallelism does (they compare with a tolerance), because the one-pass online softmax
 * they use rescales partial sums that depend on how the keys were split (transformer.h).
 *
 *   the load-balanced split ("zigzag", 2N chunks): T = 16 positions on N = 2 ranks
 *     positions  0  1  2  3 | 4  5  6  7 | 8  9 10 11 | 12 13 14 15
 *     rank       0            1            1             0
 *   rank i holds chunks i and 2N-1-i, so every rank has the same number of causal (query,
 *   key) pairs: 68 and 68 here, against 36 and 100 for the contiguous split (--cp-split).
 *
 *   the ring: rank r sends to r + 1 and receives from r - 1 (mod N), so after h hops it holds
 *   the block of rank r - h; after N - 1 hops it has seen every rank's.
 *
 *   attention on rank 0 (ring, N = 2): pass 1, the row max       K0 -> scores; K1 arrives -> scores
 *                                      pass 2, the exact sums     V0 -> sums;   V1 arrives -> sums
 *                                      backward                   K0 V0 -> dq, dK0 dV0; K1 V1 dK1 dV1 arrive -> ...
 *                                                                 dK0 dV0 come home after a round
 *
 * Per rank and step, N ranks, batch B rows of T positions, C width, L blocks, P parameters
 * (a K or V block: B x T/N x C floats; sizes in bytes):
 *   sent  forward, each block: 2(N-1) K and V blocks of 4-byte floats (the ring's hops; the
 *         all-gather's (N-1)/N of N blocks each)
 *         backward, each block: 2(N-1) K and V blocks again, and the ring: 2N dK and dV blocks
 *         of 8-byte exact sums; the all-gather: a reduce-scatter of dK and dV, 2(N-1) blocks of 8
 *         and the gradient all-reduce, 2(N-1)/N x 8 x (P + 1 loss), as in data parallelism
 *   memory (4 + 8, + 8 with AdamW) x P + the activations of T/N positions (attention's
 *         probabilities: T/N x T a head) + the K and V blocks in flight (ring) or the whole
 *         K and V of the block at hand (all-gather)
 *   (Both gather K and V again in backward rather than keep every block's: a pipeline
 *   (train_3d.c) has several microbatches in flight between a block's forward and its
 *   backward, and each rank's own K and V are in its q k v.)
 *
 *   make train_cp && mpirun -n 2 ./train_cp --model gpt                  # the ring, zigzag split
 *   mpirun -n 4 --oversubscribe ./train_cp --model gpt --cp-comm allgather
 *   mpirun -n 2 ./train_cp --model gpt --cp-split contiguous --timeline  # the imbalance, drawn
 *
 * Compare with ./train --model gpt: the same losses, names and final checkpoint, whatever N.
 *
 * What exactness costs here: the softmax takes two passes over the keys (transformer.h),
 * so the ring goes round twice, K in the first pass and V in the second, where a one-pass
 * online softmax sends K and V together once: the same bytes, but 2(N-1) hops to wait for
 * instead of N-1, and the scores of every key held until the second pass (T/N x T a head,
 * which backward keeps anyway). Measured on this program in docs/cp.md.
 *
 * Sections: the strategy (positions; attention across ranks; a block; the model); the
 * state of one run; the forward pass and the figures; options; main.
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// the strategy: a share of the positions

typedef struct {
    Group* cp;
    int ring;         // --cp-comm: ring (1) or allgather (0)
    int online;       // --cp-softmax online: the one-pass softmax, for comparison (not train.c's bits)
    int zigzag;       // --cp-split: zigzag (1) or contiguous (0)
    int Tq;           // positions a rank holds, T / N
    int* pos;         // [N][Tq] every rank's positions, ascending; this rank's at pos + rank Tq
    BlockDims dims;   // a block on this rank: every head, its positions (R set by each pass)
    // attention across ranks: K and V of one rank, [rows][Tq][C] ("a block")
    float *k[2], *v[2];        // ring: the block held and the one arriving
    int64_t *dk[2], *dv[2];    // ring, backward: the accumulators travelling with them
    float* kv_all;             // all-gather: [2][N][rows][Tq][C] every rank's K and V of the block at hand
    int64_t *dk_all, *dv_all;  // all-gather, backward: [N][rows][Tq][C]
    int64_t *dk_mine, *dv_mine; // [rows][Tq][C] this rank's keys' gradients, summed over every rank's queries
    float *rowmax, *D, *kT;    // [rows][NH][Tq], [rows][NH][Tq], [C][Tq]
    int64_t *expsum, *pv, *dq; // [rows][NH][Tq], [rows][Tq][C], [rows][Tq][C]
    float *run_sum, *run_out;  // --cp-softmax online: [rows][NH][Tq], [rows][Tq][C]
    int* targets;              // [rows][Tq] the targets at this rank's positions
} Cp;

// The positions of rank i: chunks i and 2N-1-i of 2N (zigzag), or chunk i of N.
static void cp_positions(int T, int N, int zigzag, int i, int* pos) {
    int chunk = zigzag ? T / (2 * N) : T / N, n = 0;
    for (int p = i * chunk; p < (i + 1) * chunk; p++) pos[n++] = p;
    for (int p = (2 * N - 1 - i) * chunk; zigzag && p < (2 * N - i) * chunk; p++) pos[n++] = p;
}
// The causal (query, key) pairs of a rank's positions: its share of attention's work.
static long cp_pairs(const int* pos, int Tq) {
    long n = 0;
    for (int i = 0; i < Tq; i++) n += pos[i] + 1;
    return n;
}

static void cp_init(Cp* p, Group* cp, const Config* c, int rows, int ring, int zigzag, int online) {
    int N = cp->size, T = c->context, C = c->emb;
    *p = (Cp){.cp = cp, .ring = ring, .zigzag = zigzag, .online = online, .Tq = T / N};
    p->pos = mallocCheck(sizeof(int) * T);
    for (int q = 0; q < N; q++) cp_positions(T, N, zigzag, q, p->pos + q * p->Tq);
    p->dims = gpt_dims(c, rows);
    p->dims.Tq = p->Tq, p->dims.pos = p->pos + cp->rank * p->Tq;
    long n = (long)rows * p->Tq * C, heads = (long)rows * c->heads * p->Tq;
    for (int b = 0; b < 2 && ring; b++) {
        p->k[b] = mallocCheck(sizeof(float) * n), p->v[b] = mallocCheck(sizeof(float) * n);
        p->dk[b] = mallocCheck(sizeof(int64_t) * n), p->dv[b] = mallocCheck(sizeof(int64_t) * n);
    }
    if (!ring) p->kv_all = mallocCheck(sizeof(float) * 2 * N * n);
    if (!ring) p->dk_all = mallocCheck(sizeof(int64_t) * N * n), p->dv_all = mallocCheck(sizeof(int64_t) * N * n);
    p->dk_mine = mallocCheck(sizeof(int64_t) * n), p->dv_mine = mallocCheck(sizeof(int64_t) * n);
    p->rowmax = mallocCheck(sizeof(float) * heads), p->D = mallocCheck(sizeof(float) * heads);
    p->kT = mallocCheck(sizeof(float) * (long)C * p->Tq);
    p->expsum = mallocCheck(sizeof(int64_t) * heads), p->pv = mallocCheck(sizeof(int64_t) * n);
    p->dq = mallocCheck(sizeof(int64_t) * n);
    if (online) p->run_sum = mallocCheck(sizeof(float) * heads), p->run_out = mallocCheck(sizeof(float) * n);
    p->targets = mallocCheck(sizeof(int) * (long)rows * p->Tq);
}
static void cp_free(Cp* p) {
    for (int b = 0; b < 2; b++) free(p->k[b]), free(p->v[b]), free(p->dk[b]), free(p->dv[b]);
    free(p->kv_all);
    free(p->pos), free(p->dk_all), free(p->dv_all), free(p->dk_mine), free(p->dv_mine), free(p->rowmax), free(p->D);
    free(p->kT), free(p->expsum), free(p->pv), free(p->dq), free(p->targets), free(p->run_sum), free(p->run_out);
}
static const int* cp_pos_of(const Cp* p, int q) { return p->pos + q * p->Tq; }

// ----------------------------------------------------------------------------
// the strategy: attention across ranks
//
// Two passes over every rank's keys (transformer.h): scores and the row max, then the exact
// sums of exp(s - max) and of exp(s - max) v; int64 accumulators wherever a partial sum
// crosses ranks (dK and dV, summed over every rank's queries). Each block of keys carries
// its positions, and the causal mask compares positions, whichever rank a block came from.

// This rank's K and V, from its q k v rows [R Tq][3A], into k and v [R Tq][A] (A: the width of
// the heads it holds, C here; a tensor-parallel rank's share in train_3d.c).
static void cp_pack_kv(const float* qkv, float* k, float* v, long n_tokens, int A) {
    for (long i = 0; i < n_tokens; i++) {
        memcpy(k + i * A, qkv + i * 3 * A + A, A * sizeof(float));
        memcpy(v + i * A, qkv + i * 3 * A + 2 * A, A * sizeof(float));
    }
}
// The ring's hop: send the block held to the next rank while the previous rank's arrives.
// K and V hops are posted before the compute on the block held and waited for after it, so
// that they overlap; a dK, dV hop cannot: its block's sums must be finished before it travels.
static void cp_hop_start(Cp* p, const void* held, void* arriving, long count, MPI_Datatype type, int tag,
                         MPI_Request* req) {
    int next = (p->cp->rank + 1) % p->cp->size, prev = (p->cp->rank + p->cp->size - 1) % p->cp->size;
    group_irecv(p->cp, arriving, count, type, prev, TAG_MICROBATCH + tag, &req[0]);
    group_isend(p->cp, held, count, type, next, TAG_MICROBATCH + tag, &req[1]);
}
static void cp_hop_wait(MPI_Request* req, int n) {
    double t = now_seconds();
    waiting_for = "a ring attention hop";
    MPI_Status status[8]; // n <= 8: a backward hop's K, V, dK, dV (not MPI_STATUSES_IGNORE: gcc warns on MPICH's)
    MPI_Waitall(n, req, status);
    waiting_for = NULL;
    trace_event("comm", t, now_seconds(), 0, "hop wait");
}

// Forward: atty and the probabilities att of this rank's queries, over every rank's keys.
static void cp_attention_forward(Cp* p, BlockActs* a) {
    const BlockDims* d = &p->dims;
    int N = p->cp->size, A = d->A, me = p->cp->rank; // A: the width of the heads held
    long tokens = (long)d->R * p->Tq, n = tokens * A, heads = (long)d->R * d->NH * p->Tq;
    for (long i = 0; i < heads; i++) p->rowmax[i] = -INFINITY;
    fix_zero(p->expsum, heads), fix_zero(p->pv, n);
    if (!p->ring) { // all-gather: every rank's K, then every rank's V, in rank order
        float *kall = p->kv_all, *vall = kall + N * n;
        cp_pack_kv(a->qkv, kall + me * n, vall + me * n, tokens, A);
        group_allgather(p->cp, kall + me * n, kall, n, MPI_FLOAT); // K of every rank
        group_allgather(p->cp, vall + me * n, vall, n, MPI_FLOAT); // V of every rank
        double t = trace_clock();
        for (int src = 0; src < N; src++) attention_scores(a->att, p->rowmax, a->qkv, 3 * A, kall + src * n, A, cp_pos_of(p, src), p->Tq, d, p->kT);
        for (int src = 0; src < N; src++) attention_exp_pv(a->att, p->expsum, p->pv, p->rowmax, vall + src * n, A, cp_pos_of(p, src), p->Tq, d, d->T);
        trace_event("compute", t, trace_clock(), 0, "attention");
    } else { // the ring: pass 1 with K going round, pass 2 with V
        cp_pack_kv(a->qkv, p->k[0], p->v[0], tokens, A);
        for (int pass = 0; pass < 2; pass++) {
            float** blk = pass == 0 ? p->k : p->v;
            for (int hop = 0, b = 0; hop < N; hop++, b ^= 1) { // block of rank me - hop, held in blk[b]
                MPI_Request req[2];
                int src = (me - hop + N) % N;
                if (hop < N - 1) cp_hop_start(p, blk[b], blk[b ^ 1], n, MPI_FLOAT, pass, req); // to the next rank
                double t = trace_clock();
                if (pass == 0) attention_scores(a->att, p->rowmax, a->qkv, 3 * A, blk[b], A, cp_pos_of(p, src), p->Tq, d, p->kT);
                else attention_exp_pv(a->att, p->expsum, p->pv, p->rowmax, blk[b], A, cp_pos_of(p, src), p->Tq, d, d->T);
                trace_event("compute", t, trace_clock(), 0, "%s block %d", pass == 0 ? "scores" : "sums", src);
                if (hop < N - 1) cp_hop_wait(req, 2);
            }
        }
    }
    attention_finish(a->att, a->atty, A, p->expsum, p->pv, d);
}

// --cp-softmax online: ring attention as usually written, for comparison. K and V go round
// together, once; for each block a query's running max m, sum S and output O are rescaled
// by exp(m_old - m_new) and the block's terms added, in float. The rescaling depends on the
// order in which the blocks raised the max, and the float sums on how the keys were
// split: the result is within a rounding of train.c's, not its bits, and the difference
// grows with the steps. Backward is the exact one, on P = exp(s - m) / S.
static void cp_attention_forward_online(Cp* p, BlockActs* a) {
    const BlockDims* d = &p->dims;
    int N = p->cp->size, A = d->A, HD = d->HD, me = p->cp->rank; // A: the width of the heads held
    long tokens = (long)d->R * p->Tq, n = tokens * A, heads = (long)d->R * d->NH * p->Tq;
    for (long i = 0; i < heads; i++) p->rowmax[i] = -INFINITY, p->run_sum[i] = 0.0f;
    memset(p->run_out, 0, n * sizeof(float));
    cp_pack_kv(a->qkv, p->k[0], p->v[0], tokens, A);
    for (int hop = 0, b = 0; hop < N; hop++, b ^= 1) {
        MPI_Request req[4];
        int src = (me - hop + N) % N;
        const int* kpos = cp_pos_of(p, src);
        if (hop < N - 1) cp_hop_start(p, p->k[b], p->k[b ^ 1], n, MPI_FLOAT, 0, req);     // K onward
        if (hop < N - 1) cp_hop_start(p, p->v[b], p->v[b ^ 1], n, MPI_FLOAT, 1, req + 2); // V onward, with it
        double t0 = trace_clock();
        float* bmax = p->D; // this block's row maxima (D is backward's buffer, free in forward)
        for (long i = 0; i < heads; i++) bmax[i] = -INFINITY;
        attention_scores(a->att, bmax, a->qkv, 3 * A, p->k[b], A, kpos, p->Tq, d, p->kT);
        for (int r = 0; r < d->R; r++)
            for (int hd = 0; hd < d->NH; hd++)
                for (int i = 0; i < p->Tq; i++) {
                    long rhi = ((long)r * d->NH + hd) * p->Tq + i;
                    if (bmax[rhi] == -INFINITY) continue; // the mask hides this whole block
                    float m = p->rowmax[rhi] > bmax[rhi] ? p->rowmax[rhi] : bmax[rhi];
                    float scale = expf(p->rowmax[rhi] - m), *o = p->run_out + ((long)r * p->Tq + i) * A + hd * HD;
                    p->run_sum[rhi] *= scale;
                    for (int x = 0; x < HD; x++) o[x] *= scale;
                    for (int j = 0; j < p->Tq && kpos[j] <= d->pos[i]; j++) {
                        float e = expf(a->att[rhi * d->T + kpos[j]] - m);
                        const float* vj = p->v[b] + ((long)r * p->Tq + j) * A + hd * HD;
                        p->run_sum[rhi] += e;
                        for (int x = 0; x < HD; x++) o[x] += e * vj[x];
                    }
                    p->rowmax[rhi] = m;
                }
        trace_event("compute", t0, trace_clock(), 0, "online block %d", src);
        if (hop < N - 1) cp_hop_wait(req, 4);
    }
    for (int r = 0; r < d->R; r++) // y = O / S; P = exp(s - m) / S for backward
        for (int hd = 0; hd < d->NH; hd++)
            for (int i = 0; i < p->Tq; i++) {
                long rhi = ((long)r * d->NH + hd) * p->Tq + i;
                float* prow = a->att + rhi * d->T;
                for (int t = 0; t < d->T; t++) prow[t] = t <= d->pos[i] ? expf(prow[t] - p->rowmax[rhi]) / p->run_sum[rhi] : 0.0f;
                for (int x = 0; x < HD; x++)
                    a->atty[((long)r * p->Tq + i) * A + hd * HD + x] = p->run_out[((long)r * p->Tq + i) * A + hd * HD + x] / p->run_sum[rhi];
            }
}

// Backward: dqkv of this rank's tokens from datty, dK and dV summed over every rank's
// queries (exact) and brought home.
static void cp_attention_backward(Cp* p, const BlockActs* a, const float* datty, float* dqkv) {
    const BlockDims* d = &p->dims;
    int N = p->cp->size, A = d->A, me = p->cp->rank; // A: the width of the heads held
    long tokens = (long)d->R * p->Tq, n = tokens * A;
    attention_backward_d(p->D, datty, a->atty, A, d);
    fix_zero(p->dq, n);
    if (!p->ring) { // every rank's K and V gathered again; dK and dV reduce-scattered home
        float *kall = p->kv_all, *vall = kall + N * n;
        cp_pack_kv(a->qkv, kall + me * n, vall + me * n, tokens, A);
        group_allgather(p->cp, kall + me * n, kall, n, MPI_FLOAT); // K of every rank, again
        group_allgather(p->cp, vall + me * n, vall, n, MPI_FLOAT); // V of every rank, again
        fix_zero(p->dk_all, N * n), fix_zero(p->dv_all, N * n);
        double t = trace_clock();
        for (int src = 0; src < N; src++)
            attention_backward_block(p->dq, p->dk_all + src * n, p->dv_all + src * n, a->att, p->D, a->qkv, 3 * A,
                                     kall + src * n, A, vall + src * n, A, datty, A, cp_pos_of(p, src), p->Tq, d, p->kT, d->T);
        trace_event("compute", t, trace_clock(), 0, "attention backward");
        fix_zero(p->dk_mine, n), fix_zero(p->dv_mine, n);
        group_reduce_scatter(p->cp, p->dk_all, n, MPI_INT64_T, MPI_SUM, p->dk_mine); // dK home, exact
        group_reduce_scatter(p->cp, p->dv_all, n, MPI_INT64_T, MPI_SUM, p->dv_mine); // dV home, exact
    } else { // K, V and their accumulators dK, dV go round; after the round, dK and dV one hop more, home
        cp_pack_kv(a->qkv, p->k[0], p->v[0], tokens, A);
        fix_zero(p->dk[0], n), fix_zero(p->dv[0], n);
        int b = 0;
        for (int hop = 0; hop < N; hop++, b ^= 1) {
            MPI_Request req[8];
            int src = (me - hop + N) % N, kv = hop < N - 1 ? 4 : 0; // K and V's requests: none after the last block
            if (kv) cp_hop_start(p, p->k[b], p->k[b ^ 1], n, MPI_FLOAT, 4, req);     // K onward, during the block
            if (kv) cp_hop_start(p, p->v[b], p->v[b ^ 1], n, MPI_FLOAT, 5, req + 2); // V onward
            double t = trace_clock();
            attention_backward_block(p->dq, p->dk[b], p->dv[b], a->att, p->D, a->qkv, 3 * A, p->k[b], A, p->v[b], A,
                                     datty, A, cp_pos_of(p, src), p->Tq, d, p->kT, d->T);
            trace_event("compute", t, trace_clock(), 0, "backward block %d", src);
            cp_hop_start(p, p->dk[b], p->dk[b ^ 1], n, MPI_INT64_T, 2, req + kv);     // dK onward, once added to
            cp_hop_start(p, p->dv[b], p->dv[b ^ 1], n, MPI_INT64_T, 3, req + kv + 2); // dV onward
            cp_hop_wait(req, kv + 4);
        }
        memcpy(p->dk_mine, p->dk[b], n * sizeof(int64_t)), memcpy(p->dv_mine, p->dv[b], n * sizeof(int64_t));
    }
    for (long i = 0; i < tokens; i++)
        for (int x = 0; x < A; x++) {
            dqkv[i * 3 * A + x] = (float)fix_to(p->dq[i * A + x]);
            dqkv[i * 3 * A + A + x] = (float)fix_to(p->dk_mine[i * A + x]);
            dqkv[i * 3 * A + 2 * A + x] = (float)fix_to(p->dv_mine[i * A + x]);
        }
}

// ----------------------------------------------------------------------------
// the strategy: a block, and the model, on this rank's positions
//
// transformer.h's block with the attention above in its middle; the embedding and the head
// are model.h's, on R rows of this rank's Tq positions.

static void cp_block_forward(Cp* p, const float* w, Acts* a, int u, Workspace* ws, int64_t* acc) {
    BlockParams prm = block_params(w, &p->dims);
    BlockActs ba = block_acts(a->saved[u], &p->dims, a->rows);
    block_forward_qkv(a->out[u - 1], &prm, &ba, &p->dims, ws);
    if (p->online) cp_attention_forward_online(p, &ba);
    else cp_attention_forward(p, &ba);
    block_forward_out(a->out[u], a->out[u - 1], &prm, &ba, &p->dims, acc, ws);
}
static void cp_block_backward(Cp* p, const float* w, int64_t* g, Acts* a, int u, Scratch* s, long terms,
                              Workspace* ws) {
    BlockParams prm = block_params(w, &p->dims);
    BlockGrads gg = block_grads(g, &p->dims);
    BlockActs ba = block_acts(a->saved[u], &p->dims, a->rows);
    BlockStash st = block_stash(s->stash, &p->dims, p->dims.R);
    block_backward_out(s->tmp, s->dout, &prm, &ba, &st, &p->dims, s->tmp, s->acc, ws);
    cp_attention_backward(p, &ba, s->tmp, st.dqkv);
    block_backward_qkv(s->din, a->out[u - 1], &prm, &ba, &st, &p->dims, s->acc, ws);
    block_backward_weight(&gg, a->out[u - 1], &ba, &st, &p->dims, terms, ws);
}

// The forward of R rows through the model on this rank's positions; returns the exact sum
// of the losses of its tokens' targets.
static int64_t cp_model_forward(Cp* p, const Config* c, const float* params, Work* w, int R, long rows_total) {
    Acts* a = &w->acts;
    p->dims.R = R;
    for (int r = 0; r < R; r++) // the targets at this rank's positions
        for (int i = 0; i < p->Tq; i++) p->targets[r * p->Tq + i] = a->targets[(long)r * c->context + p->dims.pos[i]];
    double t = trace_clock();
    gpt_embedding_forward(a->out[0], a->tokens, params, params + (long)c->vocab * c->emb, 0, c->vocab, 1, &p->dims);
    trace_event("compute", t, trace_clock(), 0, "forward embedding");
    for (int u = 1; u <= c->layers; u++) cp_block_forward(p, params + unit_offset(c, u), a, u, &w->ws, w->scratch.acc);
    t = trace_clock();
    a->loss = gpt_head_forward(c, params + unit_offset(c, c->layers + 1), a, p->targets, &p->dims, rows_total, &w->ws);
    trace_event("compute", t, trace_clock(), 0, "forward head");
    return a->loss;
}
// Backward: the parameter gradients of this rank's tokens added into grads (the caller
// sums them across the ranks).
static void cp_model_backward(Cp* p, const Config* c, const float* params, int64_t* grads, Work* w, long batch) {
    Acts* a = &w->acts;
    Scratch* s = &w->scratch;
    long terms = batch * c->context; // the whole rows' count: every layout has the same exactness bound (transformer.h)
    int u = c->layers + 1;
    double t = trace_clock();
    gpt_head_backward_input(c, params + unit_offset(c, u), a, p->targets, s, s->stash, &p->dims, &w->ws);
    gpt_head_backward_weight(c, grads + unit_offset(c, u), a, s->stash, &p->dims, terms, &w->ws);
    trace_event("compute", t, trace_clock(), 0, "backward head");
    scratch_step_down(s);
    for (u = c->layers; u >= 1; u--) {
        cp_block_backward(p, params + unit_offset(c, u), grads + unit_offset(c, u), a, u, s, terms, &w->ws);
        scratch_step_down(s);
    }
    gpt_embedding_backward(grads, grads + (long)c->vocab * c->emb, a->tokens, s->dout, 0, c->vocab, &p->dims, terms);
}

// What context parallelism sends per step from each rank, by the formulas above, for B rows
static double cp_sent_formula(const Cp* p, const Config* c, long B, long np) {
    double N = p->cp->size, block = (double)B * p->Tq * c->emb, L = c->layers;
    double fwd = 2 * (N - 1) * 4 * block, bwd = 2 * (N - 1) * 4 * block + (p->ring ? 2 * N * 8 * block : 2 * (N - 1) * 8 * block);
    return L * (fwd + bwd) + ring_allreduce_bytes(8.0 * np + 8.0, p->cp->size);
}
// The attention buffers a rank holds besides train.c's activations of its positions: the
// blocks in flight (ring: 2 K, 2 V, 2 dK, 2 dV), or every rank's K and V and the whole dK and
// dV of the block at hand (all-gather); the accumulators of its own (dK, dV, P.V, dq; the
// row max, D, the sums of exp), a block of K transposed, and --cp-softmax online's running
// sums and outputs. (Each is cp_init's allocation.)
static double cp_attention_bytes(const Cp* p, const Config* c, long rows) {
    double N = p->cp->size, block = (double)rows * p->Tq * c->emb, heads = (double)rows * c->heads * p->Tq;
    double kv = p->ring ? 2 * (4 + 4 + 8 + 8) * block : 2 * N * 4 * block + 2 * N * 8 * block;
    double online = p->online ? 4 * heads + 4 * block : 0;
    return kv + (8 + 8 + 8 + 8) * block + (4 + 4 + 8) * heads + 4.0 * c->emb * p->Tq + online;
}

#ifndef TRAIN_3D // the rest of this file is the program; train_3d.c uses only the strategy above

#define RUN_LINE "mpirun -n 2 ./train_cp --model gpt"

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    Dataset ds;     // the data
    State st;       // a whole replica, identical on every rank; its gradients are exact sums
    UnitSizes sizes; // what each unit holds per row: its tensors at this rank's positions
    Work work;      // activations of every row at this rank's positions
    Cp p;
    Group cp;       // every rank
    int ring, zigzag, timeline, online; // --cp-comm, --cp-split, --timeline, --cp-softmax
} Run;

static void run_free(Run* r) {
    dataset_free(&r->ds), state_free(&r->st), work_free(&r->work), cp_free(&r->p);
}

// --save: this run's checkpoint at `step` (every rank calls it)
static void save(void* ctx, const Options* o, long step) {
    Run* r = ctx;
    if (world_rank == 0) ckpt_save(o, &r->ds, &r->cfg, step, &r->st); // every rank holds the same replica
}

// ----------------------------------------------------------------------------
// the forward pass: every row, this rank's positions

// For sampling, the rank holding the position sampled broadcasts its probabilities.
static int64_t forward(void* ctx, const Rows* rows, long first, int R, long rows_total, float* probs) {
    Run* r = ctx;
    const Config* c = &r->cfg;
    work_load(&r->work, rows, first, R, c->context);
    int64_t loss = cp_model_forward(&r->p, c, r->st.params, &r->work, R, rows_total);
    if (probs) {
        int owner = 0, at = 0, V = c->vocab;
        for (int q = 0; q < r->cp.size; q++)
            for (int i = 0; i < r->p.Tq; i++)
                if (cp_pos_of(&r->p, q)[i] == rows->pos) owner = q, at = i;
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

// The formulas of figures(), in words, for the report.
static const char sent_words[] = "L x (2(N-1) K, V blocks of B T/N C floats forward, again backward, and dK, dV: "
                                 "ring 2N blocks of exact sums, all-gather 2(N-1)) + 2(N-1)/N x 8 B x (P + 1)";
static const char mem_words[] = "(4 + 8 + 8 AdamW) B x P + activations of T/N positions + K, V blocks in flight "
                                "(ring) or every rank's of the block at hand (all-gather)";

static Figures figures(const Run* r, const Progress* pr, int B) {
    const Config* c = &r->cfg;
    long np = r->st.n;
    double opt_bytes = r->st.m ? 8.0 : 0.0, attn = cp_attention_bytes(&r->p, c, B), T = c->context, Tq = r->p.Tq;
    // held, as allocated: every row's tokens and targets (loaded whole), and at this rank's
    // positions the embedding's output, each block's output and BlockActs, the head's
    // LayerNorm and probabilities (sizes); and the targets at those positions
    double held = B * (acts_bytes_per_row(c, 0, n_units(c), &r->sizes) + 4 * Tq);
    // the formula: train.c's activations of B rows, every per-token tensor (attention's
    // probabilities among them, T/N rows of T) over N; but the rows' tokens and targets, whole
    double formula = B * (acts_bytes_per_row(c, 0, n_units(c), NULL) / r->cp.size + (1 - 1.0 / r->cp.size) * 8 * T + 4 * Tq);
    Figures f = {.sent = per_step(pr, r->cp.sent), .received = per_step(pr, r->cp.received), .params = 4.0 * np,
                 .grads = 8.0 * np, .optim = opt_bytes * np, .acts = held + attn, .bubble = -1};
    f.sent_formula = cp_sent_formula(&r->p, c, B, np);
    f.mem_formula = (4.0 + 8.0 + opt_bytes) * np + formula + attn;
    return f;
}

// --timeline: the last step on every rank, from its trace events: the ring's scores (K) and
// sums (V) of each block, --cp-softmax online's blocks (O), the all-gather's attention (A),
// backward blocks (b), waits for a hop (|) and the other communication (>)
static char cp_mark(const TraceEvent* e) {
    if (!strncmp(e->name, "scores", 6)) return 'K';
    if (!strncmp(e->name, "sums", 4)) return 'V';
    if (!strncmp(e->name, "online", 6)) return 'O';
    if (!strncmp(e->name, "backward block", 14)) return 'b';
    if (!strncmp(e->name, "attention backward", 18)) return 'b';
    if (!strncmp(e->name, "attention", 9)) return 'A';
    if (!strcmp(e->name, "hop wait")) return '|';
    if (!strcmp(e->cat, "comm") && strncmp(e->name, "send", 4)) return '>'; // (a send is posted in no time)
    return 0;
}
static void cp_timeline(const Run* r, double step_t0) {
    dist_trace_timeline(r->cp.comm, step_t0, cp_mark, "K scores of a block of keys, V its exact sums, O "
                        "both in one pass (--cp-softmax online), b its backward, A attention over the gathered blocks, "
                        "| waiting for a hop, > a collective");
}

// ----------------------------------------------------------------------------
// options of this program

static const CliFlag cp_flags[] = {
    {"cp-comm", "HOW", "attention across ranks: ring (default; ring attention) or allgather (Llama 3's)"},
    {"cp-split", "HOW", "positions per rank: zigzag (default; chunks i and 2N-1-i of 2N) or contiguous"},
    {"timeline", NULL, "draw the last step of every rank: each block of keys, each hop"},
    {"cp-softmax", "HOW", "exact (default: two passes, train.c's bits) or online (one pass, for comparison: not its bits)"},
};
static const char* cp_flag(void* ctx, int index, const char* value) {
    Run* r = ctx;
    if (index == 0) {
        if (!strcmp(value, "ring")) r->ring = 1;
        else if (!strcmp(value, "allgather")) r->ring = 0;
        else return "--cp-comm must be ring or allgather";
    }
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

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    Run run = {.cp = group_world("cp"), .ring = 1, .zigzag = 1};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, cp_flags, 4, cp_flag, &run);
    dist_dense_only(&o, RUN_LINE);
    if (run.online && !run.ring)
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

    // model: a whole replica, its exact gradient sums and optimizer state; activations
    long np = n_params(cfg);
    run.st = state_alloc(np, o.opt.adamw);
    long start = state_load(&run.st, &o, &run.ds, cfg);
    int rows = pass_rows(&o, o.batch);
    cp_init(&run.p, &run.cp, cfg, rows, run.ring, run.zigzag, run.online);
    gpt_unit_sizes(cfg, &run.p.dims, cfg->vocab, run.p.Tq, &run.sizes);
    work_init(&run.work, cfg, rows, &run.sizes);
    char layout[160];
    snprintf(layout, sizeof layout, "context parallel over %d ranks: %d of %d positions each (%s), attention by %s%s", N,
             run.p.Tq, T, run.zigzag ? "zigzag" : "contiguous", run.ring ? "ring" : "all-gather",
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
    int B = o.batch;
    Progress progress = progress_start(&o, world_rank == 0, save, &run, dist_any);
    progress.record_last = run.timeline; // the timeline is drawn from the last step's trace events
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        Rows batch = training_rows(&run.ds, o.seed, step, 0);
        long n = dataset_batch_targets(&run.ds, o.seed, step, B); // every rank: the whole batch's count
        work_load(&run.work, &batch, 0, B, T);
        int64_t loss = cp_model_forward(&run.p, cfg, run.st.params, &run.work, B, B); // this rank's positions
        fix_zero(run.st.grads, np);
        cp_model_backward(&run.p, cfg, run.st.params, run.st.grads, &run.work, B);
        group_allreduce(&run.cp, run.st.grads, np, MPI_INT64_T, MPI_SUM); // every rank's positions' gradients, exact
        group_allreduce(&run.cp, &loss, 1, MPI_INT64_T, MPI_SUM);
        float scale = clip_factor(&o.opt, &(GradSpan){run.st.grads, np}, 1, n, NULL, NULL);
        optimizer_step(&o.opt, run.st.params, run.st.grads, run.st.m, run.st.v, np, grad_factor(n), scale, step);
        if (step_end(&progress, step, fix_to(loss) / n, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, B);
    Report rep = {"train_cp.c", layout, sent_words, mem_words};
    free(dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run));
    if (run.timeline && progress.steps > 0) cp_timeline(&run, progress.t0);
    run_free(&run);
    MPI_Finalize();
    return 0;
}

#endif // TRAIN_3D
