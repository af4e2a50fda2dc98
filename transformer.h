/*
 * transformer.h: the GPT's layers (--model gpt): LayerNorm, causal self-attention, GELU,
 * and the block they make, each forward beside its backward. makemore's Transformer:
 *
 *   tokens [R][T] -> wte[token] + wpe[position] -> x [R][T][C]
 *   block (x L):  x = x + proj(attention(qkv(ln1(x))))   NH causal heads of HD = C / NH
 *                 x = x + fc2(gelu(fc(ln2(x))))           fc: C -> F = 4C, fc2: F -> C
 *                 (--experts X: x = x + the gated sum of the MLPs of the top k of X experts,
 *                 each with its own fc and fc2, a router on ln2(x) choosing; model.h)
 *   head:         logits = ln_f(x) lm_head                (C -> V, no bias, not tied to wte)
 *   loss:         cross-entropy, the mean over the batch's valid targets (padding has none)
 *
 * Dims legend: R rows (names) of a pass, T positions in a row, Tq positions of a row held
 * here (T, or a context-parallel rank's share), N = R Tq tokens, C width (--emb), NH heads
 * held here, HD head size, A = NH HD attention width held here, F MLP width held here,
 * V vocabulary. One process holds everything: Tq = T, NH = heads, A = C, F = 4C; a
 * tensor-parallel rank holds a share of the heads and of F (train_tp.c), a
 * context-parallel rank a share of the positions (train_cp.c).
 *
 * Exact where some layout splits a sum (kernels.h's fixed point):
 *  - the softmax over keys, in two passes: the row max first (a max is exact in any
 *    order), then the exact sums of exp(s - max) and of exp(s - max) v over keys. The
 *    one-pass "online" softmax (FlashAttention, ring attention as usually written) rescales
 *    running sums by exp(old max - new max) each time a block of keys raises the max, so
 *    its bits depend on how the keys were split into blocks: it cannot give the same bits
 *    in every layout. Two passes cost a second sweep over the keys (train_cp.c measures it).
 *  - dQ (a sum over keys), dK and dV (sums over queries);
 *  - the forward sum of a row-parallel layer (proj, fc2) and the input-gradient sum of a
 *    column-parallel one (qkv, fc, lm_head), which tensor parallelism splits by heads or by
 *    slices of F or V (train_tp.c);
 *  - every parameter gradient, a sum over tokens (linear weights and biases, LayerNorm
 *    gains and biases, both embeddings), the loss and its count of targets.
 * Float in a fixed order where no layout splits: one head's dot products over HD (q.k,
 * dO.v, dO.O), LayerNorm's mean and variance over C, the float linear sums above.
 */
#ifndef TRANSFORMER_H
#define TRANSFORMER_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "kernels.h"

// ----------------------------------------------------------------------------
// the shapes a block works in

typedef struct {
    int R;  // rows
    int Tq; // positions of a row held here (queries, and the tokens of the per-token layers)
    int T;  // positions of a whole row (keys)
    int C;  // width
    int NH; // heads held here
    int HD; // a head's size
    int A;  // NH x HD: the attention width held here
    int F;  // MLP width held here (0 in a block whose MLP is a mixture of experts: each expert
            // keeps its own activations, model.h)
    const int* pos; // [Tq] the position of each one held, ascending; NULL: 0 .. T-1 (Tq = T)
} BlockDims;

static inline int dims_pos(const BlockDims* d, int i) { return d->pos ? d->pos[i] : i; }

// A block's parameters, in this order: first the tensors tensor parallelism splits (by
// heads: the columns of qkv and rows of proj; by slices of F: the columns of fc and rows of
// fc2), then those it replicates (the LayerNorms, and the biases of the two row-parallel
// layers, added once after the sum): a rank's slice is then one block of split tensors and
// one of replicated ones, as for the MLP's layers (weight, then bias).
//   qkv_w [C][3A] (its columns: A of q, A of k, A of v, head h at h HD in each), qkv_b [3A],
//   proj_w [A][C], fc_w [C][F], fc_b [F], fc2_w [F][C], | ln1_g [C], ln1_b [C], proj_b [C],
//   ln2_g [C], ln2_b [C], fc2_b [C]
typedef struct {
    long qkv_w, qkv_b, proj_w, fc_w, fc_b, fc2_w; // split
    long ln1_g, ln1_b, proj_b, ln2_g, ln2_b, fc2_b; // replicated
    long split, n; // elements of the split tensors, and of all
} BlockLayout;
static BlockLayout block_layout(int C, int A, int F) {
    BlockLayout l;
    long at = 0;
    l.qkv_w = at, at += (long)C * 3 * A;
    l.qkv_b = at, at += 3L * A;
    l.proj_w = at, at += (long)A * C;
    l.fc_w = at, at += (long)C * F;
    l.fc_b = at, at += F;
    l.fc2_w = at, at += (long)F * C;
    l.split = at;
    l.ln1_g = at, at += C;
    l.ln1_b = at, at += C;
    l.proj_b = at, at += C;
    l.ln2_g = at, at += C;
    l.ln2_b = at, at += C;
    l.fc2_b = at, at += C;
    l.n = at;
    return l;
}
// The same offsets as pointers into a block's parameters (float) or gradients (int64).
#define BLOCK_TENSORS(T) T *qkv_w, *qkv_b, *proj_w, *fc_w, *fc_b, *fc2_w, *ln1_g, *ln1_b, *proj_b, *ln2_g, *ln2_b, *fc2_b
typedef struct { BLOCK_TENSORS(const float); } BlockParams;
typedef struct { BLOCK_TENSORS(int64_t); } BlockGrads;
#define BLOCK_POINTERS(base, l)                                                                               \
    {(base) + (l).qkv_w, (base) + (l).qkv_b, (base) + (l).proj_w, (base) + (l).fc_w, (base) + (l).fc_b,      \
     (base) + (l).fc2_w, (base) + (l).ln1_g, (base) + (l).ln1_b, (base) + (l).proj_b, (base) + (l).ln2_g,    \
     (base) + (l).ln2_b, (base) + (l).fc2_b}
static BlockParams block_params(const float* w, const BlockDims* d) {
    BlockLayout l = block_layout(d->C, d->A, d->F);
    return (BlockParams)BLOCK_POINTERS(w, l);
}
static BlockGrads block_grads(int64_t* g, const BlockDims* d) {
    BlockLayout l = block_layout(d->C, d->A, d->F);
    return (BlockGrads)BLOCK_POINTERS(g, l);
}

// The MLP half's four tensors on their own: the dense block's (above), or one expert's.
typedef struct { const float *fc_w, *fc_b, *fc2_w, *fc2_b; } MlpParams;
typedef struct { int64_t *fc_w, *fc_b, *fc2_w, *fc2_b; } MlpGrads;
static MlpParams block_mlp(const BlockParams* p) { return (MlpParams){p->fc_w, p->fc_b, p->fc2_w, p->fc2_b}; }
static MlpGrads block_mlp_grads(const BlockGrads* g) { return (MlpGrads){g->fc_w, g->fc_b, g->fc2_w, g->fc2_b}; }

// A block whose MLP is a mixture of X experts (--experts; the layer itself is model.h's
// "mixture of experts"): the dense block's attention and LayerNorms, in the dense order
// (split by heads, then replicated), the router's weight [C][X] (replicated: every rank
// routes its own tokens), then the X experts, each the dense block's MLP with weights of its
// own, in the dense order too (fc_w [C][F], fc_b [F], fc2_w [F][C] split by slices of F, then
// fc2_b [C]):
//   qkv_w, qkv_b, proj_w, | ln1_g, ln1_b, proj_b, ln2_g, ln2_b, router_w, | expert 0, ..., expert X-1
// so that what every rank of expert parallelism holds is one range (`shared`), and a rank
// holding experts [x_lo, x_hi) holds another.
typedef struct {
    long qkv_w, qkv_b, proj_w;                          // split by heads
    long ln1_g, ln1_b, proj_b, ln2_g, ln2_b, router_w;  // replicated
    long split, shared; // elements of the split tensors, and of everything before the experts
    long expert, n;     // elements of one expert, and of the whole block
} MoeBlockLayout;
typedef struct {
    long fc_w, fc_b, fc2_w, fc2_b;
    long split, n; // elements of the split tensors (all but fc2_b), and of all
} MlpLayout;
static MlpLayout mlp_layout(int C, int F) {
    MlpLayout l;
    long at = 0;
    l.fc_w = at, at += (long)C * F;
    l.fc_b = at, at += F;
    l.fc2_w = at, at += (long)F * C;
    l.split = at;
    l.fc2_b = at, at += C;
    l.n = at;
    return l;
}
static MoeBlockLayout moe_block_layout(int C, int A, int F, int X) {
    MoeBlockLayout l;
    long at = 0;
    l.qkv_w = at, at += (long)C * 3 * A;
    l.qkv_b = at, at += 3L * A;
    l.proj_w = at, at += (long)A * C;
    l.split = at;
    l.ln1_g = at, at += C;
    l.ln1_b = at, at += C;
    l.proj_b = at, at += C;
    l.ln2_g = at, at += C;
    l.ln2_b = at, at += C;
    l.router_w = at, at += (long)C * X;
    l.shared = at;
    l.expert = mlp_layout(C, F).n;
    l.n = l.shared + X * l.expert;
    return l;
}
// An MoE block's attention and LayerNorms as a BlockParams (the MLP's tensors NULL: the
// experts have their own), and an expert's MLP from the start of its parameters.
#define MOE_BLOCK_POINTERS(base, l)                                                                           \
    {(base) + (l).qkv_w, (base) + (l).qkv_b, (base) + (l).proj_w, NULL, NULL, NULL, (base) + (l).ln1_g,      \
     (base) + (l).ln1_b, (base) + (l).proj_b, (base) + (l).ln2_g, (base) + (l).ln2_b, NULL}
static BlockParams moe_block_params(const float* w, const MoeBlockLayout* l) {
    return (BlockParams)MOE_BLOCK_POINTERS(w, *l);
}
static BlockGrads moe_block_grads(int64_t* g, const MoeBlockLayout* l) {
    return (BlockGrads)MOE_BLOCK_POINTERS(g, *l);
}
static MlpParams expert_mlp(const float* w, int C, int F) {
    MlpLayout l = mlp_layout(C, F);
    return (MlpParams){w + l.fc_w, w + l.fc_b, w + l.fc2_w, w + l.fc2_b};
}
static MlpGrads expert_mlp_grads(int64_t* g, int C, int F) {
    MlpLayout l = mlp_layout(C, F);
    return (MlpGrads){g + l.fc_w, g + l.fc_b, g + l.fc2_w, g + l.fc2_b};
}

// What a block's forward keeps for its backward, in `rows` rows (each tensor [rows][...]):
// the LayerNorms' outputs and statistics, q k v, the attention probabilities, the
// attention's output, the residual between the two halves, the MLP's hidden layer before
// and after GELU. (The block's input is the unit before's output, kept there.)
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd; // [Tq][C], [Tq], [Tq]
    float* qkv;                       // [Tq][3A]
    float* att;                       // [NH][Tq][T]: probabilities, 0 where the mask hides a key
    float* atty;                      // [Tq][A]: attention's output, proj's input
    float* x1;                        // [Tq][C]: x + proj(...)
    float *ln2, *ln2_mean, *ln2_rstd; // [Tq][C], [Tq], [Tq]
    float* fc;                        // [Tq][F]: before GELU
    float* gelu;                      // [Tq][F]: after, fc2's input
} BlockActs;
// Floats a row: with sequence parallelism (train_tp.c --sp) the per-token tensors (ln1, x1,
// ln2 and the statistics) hold h of a row's positions, the rest every position held, Tq.
static long block_acts_held(const BlockDims* d, int h) {
    long Tq = d->Tq;
    return h * (3L * d->C + 4) + Tq * (3L * d->A + d->A + 2L * d->F) + (long)d->NH * Tq * d->T;
}
static long block_acts_per_row(const BlockDims* d) { return block_acts_held(d, d->Tq); }
static BlockActs block_acts_tokens(float* base, const BlockDims* d, int rows, int h) {
    BlockActs a;
    long n = (long)rows * d->Tq, m = (long)rows * h;
    float* at = base;
#define TAKE(field, count) (a.field = at, at += (count))
    TAKE(ln1, m * d->C), TAKE(ln1_mean, m), TAKE(ln1_rstd, m), TAKE(qkv, n * 3 * d->A);
    TAKE(att, n * d->NH * d->T), TAKE(atty, n * d->A), TAKE(x1, m * d->C);
    TAKE(ln2, m * d->C), TAKE(ln2_mean, m), TAKE(ln2_rstd, m), TAKE(fc, n * d->F), TAKE(gelu, n * d->F);
#undef TAKE
    return a;
}
static BlockActs block_acts(float* base, const BlockDims* d, int rows) { return block_acts_tokens(base, d, rows, d->Tq); }
// What a block's backward hands from its input half to its weight half (zero-bubble
// schedules run them apart), each [rows][Tq][...]: the gradients the weight gradients need.
typedef struct {
    float* dx2;  // [C] the block's output gradient: fc2's output gradient
    float* dfc;  // [F] fc's output gradient (after GELU's backward)
    float* dln2; // [C] ln2's output gradient
    float* dx1;  // [C] the residual's gradient between the halves: proj's output gradient
    float* dqkv; // [3A] qkv's output gradient
    float* dln1; // [C] ln1's output gradient
} BlockStash;
static long block_stash_per_row(const BlockDims* d) { return (long)d->Tq * (4L * d->C + d->F + 3L * d->A); }
static BlockStash block_stash(float* base, const BlockDims* d, int rows) {
    BlockStash s;
    long n = (long)rows * d->Tq;
    s.dx2 = base, s.dfc = s.dx2 + n * d->C, s.dln2 = s.dfc + n * d->F, s.dx1 = s.dln2 + n * d->C;
    s.dqkv = s.dx1 + n * d->C, s.dln1 = s.dqkv + n * 3 * d->A;
    return s;
}

// Scratch a block's passes need beyond the stash, in floats and int64s, for `rows` rows.
static long block_scratch_floats(const BlockDims* d, int rows) {
    long n = (long)rows * d->Tq, most = d->F > d->A ? d->F : d->A;
    return n * most + (long)rows * d->NH * d->Tq + 2L * d->HD * d->T + d->T;
}
static long block_scratch_int64s(const BlockDims* d, int rows) {
    long n = (long)rows * d->Tq, most = 3L * d->A > d->C ? 3L * d->A : d->C;
    return n * (most > d->F ? most : d->F) + (long)rows * d->NH * d->Tq;
}

// ----------------------------------------------------------------------------
// LayerNorm over C, of each of N tokens (PyTorch's eps). The statistics are float sums in a
// fixed order: a token is never split across ranks (sequence parallelism splits tokens).

#define LN_EPS 1e-5f
// out = (x - mean) rstd g + b, with mean and rstd = 1 / sqrt(var + eps) kept for backward
static void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* g, const float* b,
                              long N, int C) {
    for (long n = 0; n < N; n++) {
        const float* xn = x + n * C;
        float m = 0.0f, v = 0.0f;
        for (int c = 0; c < C; c++) m += xn[c];
        m /= (float)C;
        for (int c = 0; c < C; c++) v += (xn[c] - m) * (xn[c] - m);
        v /= (float)C;
        float s = 1.0f / sqrtf(v + LN_EPS);
        for (int c = 0; c < C; c++) out[n * C + c] = (xn[c] - m) * s * g[c] + b[c];
        mean[n] = m, rstd[n] = s;
    }
}
// The input gradient, added to a residual's: dx = dres + rstd (dy g - mean(dy g) - xhat mean(dy g xhat))
// (dres NULL: none), xhat = (x - mean) rstd
static void layernorm_backward_input(float* dx, const float* dres, const float* dy, const float* x, const float* mean,
                                     const float* rstd, const float* g, long N, int C) {
    for (long n = 0; n < N; n++) {
        const float *dyn = dy + n * C, *xn = x + n * C;
        float m = mean[n], s = rstd[n], a = 0.0f, b = 0.0f;
        for (int c = 0; c < C; c++) {
            float dyg = dyn[c] * g[c], xhat = (xn[c] - m) * s;
            a += dyg, b += dyg * xhat;
        }
        a /= (float)C, b /= (float)C;
        for (int c = 0; c < C; c++) {
            float xhat = (xn[c] - m) * s, d = (dyn[c] * g[c] - a - xhat * b) * s;
            dx[n * C + c] = dres ? dres[n * C + c] + d : d;
        }
    }
}
// The gain's and bias's gradients, exact sums over the tokens: dg += dy xhat, db += dy.
// `terms`: tokens in the whole batch.
static void layernorm_backward_params(int64_t* dg, int64_t* db, const float* dy, const float* x, const float* mean,
                                      const float* rstd, long N, int C, long terms) {
    float lim = (float)fix_term_limit(terms);
    int bad = 0;
    for (long n = 0; n < N; n++) {
        const float *dyn = dy + n * C, *xn = x + n * C;
        for (int c = 0; c < C; c++) {
            float xhat = (xn[c] - mean[n]) * rstd[n], t = dyn[c] * xhat;
            bad |= !(fabsf(t) < lim) | !(fabsf(dyn[c]) < lim);
            dg[c] += fix_fast(t), db[c] += fix_fast(dyn[c]);
        }
    }
    if (bad)
        for (long n = 0; n < N; n++)
            for (int c = 0; c < C; c++) {
                fix_term((x[n * C + c] - mean[n]) * rstd[n] * dy[n * C + c], terms, "LayerNorm gain gradient");
                fix_term(dy[n * C + c], terms, "LayerNorm bias gradient");
            }
}

// ----------------------------------------------------------------------------
// GELU, the tanh approximation (GPT-2's, makemore's NewGELU):
//   gelu(x) = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
// computed as x s with s = 1 / (1 + exp(-2u)), since 1 + tanh(u) = 2 s: the same function,
// with expf, the one transcendental function the project already relies on to give the same
// bits on every machine it is tested on (the softmax's), where a libm's tanhf would be
// another to trust; and accurate in the tails, where 1 + tanh(u) computed from a tanh near
// -1 cancels (gelu(-3.5) lost 3 of float's 7 digits that way).

#define GELU_K 0.7978845608028654f // sqrt(2 / pi)
#define GELU_C 0.044715f
ALWAYS_INLINE float gelu_gate(float x) { // s = (1 + tanh(u)) / 2
    float u = GELU_K * (x + GELU_C * x * x * x);
    return 1.0f / (1.0f + expf(-2.0f * u));
}
static void gelu_forward(float* out, const float* x, long n) {
    for (long i = 0; i < n; i++) out[i] = x[i] * gelu_gate(x[i]);
}
// dx = dout gelu'(x), gelu'(x) = s + 2 x s (1 - s) du/dx, du/dx = sqrt(2/pi) (1 + 3 0.044715 x^2)
static void gelu_backward(float* dx, const float* x, const float* dout, long n) {
    for (long i = 0; i < n; i++) {
        float xi = x[i], s = gelu_gate(xi), du = GELU_K * (1.0f + 3.0f * GELU_C * xi * xi);
        dx[i] = dout[i] * (s + 2.0f * xi * s * (1.0f - s) * du);
    }
}

// ----------------------------------------------------------------------------
// causal self-attention
//
// q, k and v of token n sit in its row of qkv [3A]: q at 0, k at A, v at 2A, head h at h HD
// in each. For each row r, head h and query i at position p, over the keys j at positions
// <= p (the causal mask; padding needs no mask of its own: a padded position's query attends
// to real keys before it, and its target is ignored by the loss):
//   s_ij = (q_i . k_j) / sqrt(HD)               float, a fixed order over HD
//   m_i = max_j s_ij                             pass 1 (exact in any order)
//   e_ij = exp(s_ij - m_i), S_i = sum_j e_ij     pass 2, exact sums, and with them
//   y_i = (sum_j e_ij v_j) / S_i                 (so y needs no P before its sum: two passes, not three)
//   P_ij = e_ij / S_i                            kept for backward
// The functions below take the keys as a block, with their positions, so that a
// context-parallel rank runs the same passes block by block as K and V come round the ring
// (train_cp.c); this process passes one block holding every key. Scores and probabilities
// are kept by the key's position, att[r][h][i][p_j], whatever block brought them.

// Pass 1 over a block of Tk keys (k [R][Tk], rows `ldk` floats apart, at head 0): scores into
// att and the row maxima into rowmax [R][NH][Tq] (start at -infinity). kT: [HD][Tk] floats.
static void attention_scores(float* att, float* rowmax, const float* qkv, long ldq, const float* k, long ldk,
                             const int* kpos, int Tk, const BlockDims* d, float* kT) {
    float scale = 1.0f / sqrtf((float)d->HD);
    for (int r = 0; r < d->R; r++)
        for (int h = 0; h < d->NH; h++) {
            for (int j = 0; j < Tk; j++) // this head's keys, transposed: the scores vectorise over keys
                for (int e = 0; e < d->HD; e++) kT[(long)e * Tk + j] = k[((long)r * Tk + j) * ldk + h * d->HD + e];
            for (int i = 0; i < d->Tq; i++) {
                const float* q = qkv + ((long)r * d->Tq + i) * ldq + h * d->HD;
                float* srow = att + (((long)r * d->NH + h) * d->Tq + i) * d->T;
                float* m = rowmax + ((long)r * d->NH + h) * d->Tq + i;
                int p = dims_pos(d, i), n = 0;
                while (n < Tk && kpos[n] <= p) n++; // kpos ascends: keys [0, n) are visible
                float s[n > 0 ? n : 1];
                for (int j = 0; j < n; j++) s[j] = 0.0f;
                for (int e = 0; e < d->HD; e++)
                    for (int j = 0; j < n; j++) s[j] = fmaf(q[e], kT[(long)e * Tk + j], s[j]);
                for (int j = 0; j < n; j++) {
                    float v = s[j] * scale;
                    srow[kpos[j]] = v;
                    *m = v > *m ? v : *m;
                }
            }
        }
}
// Pass 2 over a block of values (v [R][Tk], rows `ldv` apart, at head 0): e = exp(s - max)
// in place of the scores; expsum [R][NH][Tq] += exact e; acc [R][Tq][A] += exact e v.
// `terms`: the terms of a whole sum, T (sets the range limit alike in every layout).
static void attention_exp_pv(float* att, int64_t* expsum, int64_t* acc, const float* rowmax, const float* v,
                             long ldv, const int* kpos, int Tk, const BlockDims* d, long terms) {
    double lim = fix_term_limit(terms);
    int bad = 0;
    for (int r = 0; r < d->R; r++)
        for (int h = 0; h < d->NH; h++)
            for (int i = 0; i < d->Tq; i++) {
                long rhi = ((long)r * d->NH + h) * d->Tq + i;
                float* srow = att + rhi * d->T;
                int64_t* a = acc + ((long)r * d->Tq + i) * d->A + h * d->HD;
                int p = dims_pos(d, i);
                for (int j = 0; j < Tk && kpos[j] <= p; j++) {
                    float e = expf(srow[kpos[j]] - rowmax[rhi]); // 0 <= e <= 1
                    const float* vj = v + ((long)r * Tk + j) * ldv + h * d->HD;
                    srow[kpos[j]] = e;
                    expsum[rhi] += fix_fast(e);
                    for (int x = 0; x < d->HD; x++) {
                        double t = (double)e * vj[x];
                        bad |= !(fabs(t) < lim);
                        a[x] += fix_fast(t);
                    }
                }
            }
    if (bad) fatal("attention: a value of v is too large for an exact sum of %ld terms (limit %g)%s%ld: training has "
                   "diverged; lower --lr or use --clip", terms, lim, current_step > 0 ? " at step " : ", before step ",
                   current_step > 0 ? current_step : 1L);
}
// The end: P = e / S in place (0 where the mask hides a key), y [R][Tq] (rows `ldy` apart, at
// head 0) = float(sum e v / S), each rounded once.
static void attention_finish(float* att, float* y, long ldy, const int64_t* expsum, const int64_t* acc,
                             const BlockDims* d) {
    for (int r = 0; r < d->R; r++)
        for (int h = 0; h < d->NH; h++)
            for (int i = 0; i < d->Tq; i++) {
                long rhi = ((long)r * d->NH + h) * d->Tq + i;
                double S = fix_to(expsum[rhi]);
                float* prow = att + rhi * d->T;
                int p = dims_pos(d, i);
                for (int t = 0; t < d->T; t++) prow[t] = t <= p ? (float)(prow[t] / S) : 0.0f;
                const int64_t* a = acc + ((long)r * d->Tq + i) * d->A + h * d->HD;
                float* yi = y + ((long)r * d->Tq + i) * ldy + h * d->HD;
                for (int x = 0; x < d->HD; x++) yi[x] = (float)(fix_to(a[x]) / S);
            }
}
// The forward on one process, every key in one block: atty = attention(qkv), a->att kept.
// tmp: block_scratch_floats, acc: block_scratch_int64s.
static void attention_forward(float* atty, float* att, const float* qkv, const BlockDims* d, float* tmp, int64_t* acc) {
    long n = (long)d->R * d->Tq, rows_heads = (long)d->R * d->NH * d->Tq, ld = 3L * d->A;
    float *rowmax = tmp, *kT = tmp + rows_heads;
    int64_t *expsum = acc, *pv = acc + rows_heads;
    int kpos[d->T];
    for (int t = 0; t < d->T; t++) kpos[t] = t;
    for (long i = 0; i < rows_heads; i++) rowmax[i] = -INFINITY;
    fix_zero(expsum, rows_heads), fix_zero(pv, n * d->A);
    attention_scores(att, rowmax, qkv, ld, qkv + d->A, ld, kpos, d->T, d, kT);
    attention_exp_pv(att, expsum, pv, rowmax, qkv + 2 * d->A, ld, kpos, d->T, d, d->T);
    attention_finish(att, atty, d->A, expsum, pv, d);
}

// Backward. With dO the gradient of y and P the probabilities:
//   D_i = dO_i . y_i (= sum_j P_ij dO_i . v_j: a dot over HD, not a sum over keys, so no
//   layout splits it), dP_ij = dO_i . v_j, dS_ij = P_ij (dP_ij - D_i) / sqrt(HD), and
//   dq_i = sum_j dS_ij k_j, dk_j = sum_i dS_ij q_i, dv_j = sum_i P_ij dO_i, all exact.
// D [R][NH][Tq] from dO and y (each [R][Tq], rows `ld` apart, at head 0)
static void attention_backward_d(float* D, const float* dy, const float* y, long ld, const BlockDims* d) {
    for (int r = 0; r < d->R; r++)
        for (int h = 0; h < d->NH; h++)
            for (int i = 0; i < d->Tq; i++) {
                const float *a = dy + ((long)r * d->Tq + i) * ld + h * d->HD, *b = y + ((long)r * d->Tq + i) * ld + h * d->HD;
                float s = 0.0f;
                for (int x = 0; x < d->HD; x++) s = fmaf(a[x], b[x], s);
                D[((long)r * d->NH + h) * d->Tq + i] = s;
            }
}
// One block of Tk keys and values: dq [R][Tq][A] += exact, and the block's dk, dv
// [R][Tk][A] += exact (q, dy at their strides; k, v at theirs). vT: [HD][Tk] floats.
static void attention_backward_block(int64_t* dq, int64_t* dk, int64_t* dv, const float* att, const float* D,
                                     const float* qkv, long ldq, const float* k, long ldk, const float* v, long ldv,
                                     const float* dy, long ldy, const int* kpos, int Tk, const BlockDims* d,
                                     float* vT, long terms) {
    float scale = 1.0f / sqrtf((float)d->HD);
    double lim = fix_term_limit(terms);
    int bad = 0;
    for (int r = 0; r < d->R; r++)
        for (int h = 0; h < d->NH; h++) {
            for (int j = 0; j < Tk; j++)
                for (int e = 0; e < d->HD; e++) vT[(long)e * Tk + j] = v[((long)r * Tk + j) * ldv + h * d->HD + e];
            for (int i = 0; i < d->Tq; i++) {
                long rhi = ((long)r * d->NH + h) * d->Tq + i;
                const float* prow = att + rhi * d->T;
                const float *qi = qkv + ((long)r * d->Tq + i) * ldq + h * d->HD, *dyi = dy + ((long)r * d->Tq + i) * ldy + h * d->HD;
                int64_t* dqi = dq + ((long)r * d->Tq + i) * d->A + h * d->HD;
                int p = dims_pos(d, i), n = 0;
                while (n < Tk && kpos[n] <= p) n++;
                float dp[n > 0 ? n : 1];
                for (int j = 0; j < n; j++) dp[j] = 0.0f;
                for (int e = 0; e < d->HD; e++)
                    for (int j = 0; j < n; j++) dp[j] = fmaf(dyi[e], vT[(long)e * Tk + j], dp[j]);
                for (int j = 0; j < n; j++) {
                    float P = prow[kpos[j]], ds = P * (dp[j] - D[rhi]) * scale;
                    const float* kj = k + ((long)r * Tk + j) * ldk + h * d->HD;
                    int64_t *dkj = dk + ((long)r * Tk + j) * d->A + h * d->HD, *dvj = dv + ((long)r * Tk + j) * d->A + h * d->HD;
                    for (int x = 0; x < d->HD; x++) {
                        double a = (double)ds * kj[x], b = (double)ds * qi[x], c = (double)P * dyi[x];
                        bad |= !(fabs(a) < lim) | !(fabs(b) < lim) | !(fabs(c) < lim);
                        dqi[x] += fix_fast(a), dkj[x] += fix_fast(b), dvj[x] += fix_fast(c);
                    }
                }
            }
        }
    if (bad) fatal("attention backward: a gradient is too large for an exact sum of %ld terms (limit %g)%s%ld: "
                   "training has diverged; lower --lr or use --clip", terms, lim,
                   current_step > 0 ? " at step " : ", before step ", current_step > 0 ? current_step : 1L);
}
// The backward on one process: dqkv [R][Tq][3A] from dy = d atty.
static void attention_backward(float* dqkv, const float* dy, const float* qkv, const float* att, const float* atty,
                               const BlockDims* d, float* tmp, int64_t* acc) {
    long n = (long)d->R * d->Tq, ld = 3L * d->A;
    float *D = tmp, *vT = tmp + (long)d->R * d->NH * d->Tq;
    int64_t *dq = acc, *dk = acc + n * d->A, *dv = acc + 2 * n * d->A;
    int kpos[d->T];
    for (int t = 0; t < d->T; t++) kpos[t] = t;
    fix_zero(acc, 3 * n * d->A);
    attention_backward_d(D, dy, atty, d->A, d);
    attention_backward_block(dq, dk, dv, att, D, qkv, ld, qkv + d->A, ld, qkv + 2 * d->A, ld, dy, d->A, kpos, d->T, d,
                             vT, d->T);
    for (long t = 0; t < n; t++)
        for (int x = 0; x < d->A; x++) {
            dqkv[t * ld + x] = (float)fix_to(dq[t * d->A + x]);
            dqkv[t * ld + d->A + x] = (float)fix_to(dk[t * d->A + x]);
            dqkv[t * ld + 2 * d->A + x] = (float)fix_to(dv[t * d->A + x]);
        }
}

// ----------------------------------------------------------------------------
// the block, as a list of ops
//
// Each op is train.c's; a layout that splits the block (train_tp.c by heads and slices of
// F, train_cp.c by positions) writes the same list with its collectives between the ops.
// Which sums are exact follows from where tensor parallelism splits the block: qkv and fc
// are column-parallel (their input gradient is a sum over the columns a rank holds), proj
// and fc2 row-parallel (their output is a sum over the rows a rank holds).

// The forward in three parts, so that a layout can put its own attention between them
// (train_cp.c): before attention, x [N][C] -> a->qkv; attention; after it, a->atty -> out.
static void block_forward_qkv(const float* x, const BlockParams* p, const BlockActs* a, const BlockDims* d,
                              Workspace* ws) {
    long N = (long)d->R * d->Tq;
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1_g, p->ln1_b, N, d->C);
    linear_forward(a->qkv, a->ln1, p->qkv_w, p->qkv_b, (int)N, d->C, 3 * d->A, ws);          // column-parallel
}
// After attention, in two parts, so that a block whose MLP is a mixture of experts puts its
// experts between them (model.h): proj and the residual, ln2 (a->atty -> a->x1, a->ln2);
// then the MLP and its residual (-> out).
static void block_forward_proj(const float* x, const BlockParams* p, const BlockActs* a, const BlockDims* d,
                               int64_t* acc, Workspace* ws) {
    long N = (long)d->R * d->Tq;
    int C = d->C, A = d->A;
    linear_forward_exact(a->x1, acc, a->atty, p->proj_w, p->proj_b, (int)N, A, C, ws);     // row-parallel: exact
    for (long i = 0; i < N * C; i++) a->x1[i] += x[i];                                     // residual
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->x1, p->ln2_g, p->ln2_b, N, C);
}
// The MLP on N tokens (the block's, or an expert's on the tokens routed to it): in [N][C] ->
// out [N][C], keeping fc's output and GELU's [N][F]. acc: [N][C] int64s.
static void mlp_forward(float* out, float* fc, float* gelu, const float* in, const MlpParams* p, long N, int C, int F,
                        int64_t* acc, Workspace* ws) {
    linear_forward(fc, in, p->fc_w, p->fc_b, (int)N, C, F, ws);                            // column-parallel
    gelu_forward(gelu, fc, N * F);
    linear_forward_exact(out, acc, gelu, p->fc2_w, p->fc2_b, (int)N, F, C, ws);            // row-parallel: exact
}
static void block_forward_out(float* out, const float* x, const BlockParams* p, const BlockActs* a,
                              const BlockDims* d, int64_t* acc, Workspace* ws) {
    long N = (long)d->R * d->Tq;
    MlpParams mlp = block_mlp(p);
    block_forward_proj(x, p, a, d, acc, ws);
    mlp_forward(out, a->fc, a->gelu, a->ln2, &mlp, N, d->C, d->F, acc, ws);
    for (long i = 0; i < N * d->C; i++) out[i] += a->x1[i];                                // residual
}
// x [N][C] -> out [N][C], keeping `a`. tmp and acc: block_scratch_floats / _int64s.
static void block_forward(float* out, const float* x, const BlockParams* p, const BlockActs* a, const BlockDims* d,
                          float* tmp, int64_t* acc, Workspace* ws) {
    block_forward_qkv(x, p, a, d, ws);
    attention_forward(a->atty, a->att, a->qkv, d, tmp, acc);                               // causal, exact over keys
    block_forward_out(out, x, p, a, d, acc, ws);
}

// Backward, the input half, in three parts as the forward: from dout (the gradient of the
// block's output) back through fc2, GELU, fc, ln2 and proj to datty (the gradient of
// attention's output); attention; from st->dqkv back through qkv and ln1 to dx (of the
// block's input). Each leaves in `st` what the weight half needs. The first part is itself
// two, as the forward's: the MLP's (from dout to st->dln2), then ln2's and proj's.
// The MLP's: dout [N][C] -> din [N][C] through fc2 (dh [N][F]), GELU (dfc [N][F], kept for
// fc's weight gradient; dh and dfc may be one buffer) and fc. acc: [C][N] int64s.
static void mlp_backward_input(float* din, float* dfc, float* dh, const float* dout, const float* fc,
                               const MlpParams* p, long N, int C, int F, int64_t* acc, Workspace* ws) {
    linear_backward_input(dh, dout, p->fc2_w, (int)N, F, C, ws);                            // row-parallel: float
    gelu_backward(dfc, fc, dh, N * F);
    linear_backward_input_exact(din, acc, dfc, p->fc_w, (int)N, C, F, ws);                 // column-parallel: exact
}
// ln2's and proj's: from dout (the residual's share) and st->dln2 (the MLP's) to datty
static void block_backward_proj(float* datty, const float* dout, const BlockParams* p, const BlockActs* a,
                                const BlockStash* st, const BlockDims* d, Workspace* ws) {
    long N = (long)d->R * d->Tq;
    int C = d->C, A = d->A;
    layernorm_backward_input(st->dx1, dout, st->dln2, a->x1, a->ln2_mean, a->ln2_rstd, p->ln2_g, N, C);
    linear_backward_input(datty, st->dx1, p->proj_w, (int)N, A, C, ws);                    // row-parallel: float
}
static void block_backward_out(float* datty, const float* dout, const BlockParams* p, const BlockActs* a,
                               const BlockStash* st, const BlockDims* d, float* dh, int64_t* acc, Workspace* ws) {
    long N = (long)d->R * d->Tq;
    MlpParams mlp = block_mlp(p);
    memcpy(st->dx2, dout, (size_t)N * d->C * sizeof(float));
    mlp_backward_input(st->dln2, st->dfc, dh, dout, a->fc, &mlp, N, d->C, d->F, acc, ws);
    block_backward_proj(datty, dout, p, a, st, d, ws);
}
static void block_backward_qkv(float* dx, const float* x, const BlockParams* p, const BlockActs* a,
                               const BlockStash* st, const BlockDims* d, int64_t* acc, Workspace* ws) {
    long N = (long)d->R * d->Tq;
    linear_backward_input_exact(st->dln1, acc, st->dqkv, p->qkv_w, (int)N, d->C, 3 * d->A, ws); // column-parallel: exact
    layernorm_backward_input(dx, st->dx1, st->dln1, x, a->ln1_mean, a->ln1_rstd, p->ln1_g, N, d->C);
}
static void block_backward_input(float* dx, const float* dout, const float* x, const BlockParams* p,
                                 const BlockActs* a, const BlockStash* st, const BlockDims* d, float* tmp,
                                 int64_t* acc, Workspace* ws) {
    long most = d->F > d->A ? d->F : d->A;
    float *dh = tmp, *small = tmp + (long)d->R * d->Tq * most; // dh: fc2's input gradient, then attention's output's
    block_backward_out(dh, dout, p, a, st, d, dh, acc, ws);
    attention_backward(st->dqkv, dh, a->qkv, a->att, a->atty, d, small, acc);             // exact over keys, queries
    block_backward_qkv(dx, x, p, a, st, d, acc, ws);
}
// The weight half: every parameter gradient, exact sums over the tokens (`terms`: tokens in
// the whole batch), from the kept activations and the stash. In two parts too: the MLP's
// (on its input, GELU's output, and the gradients of fc's and fc2's outputs), then the
// LayerNorms' and attention's.
static void mlp_backward_weight(const MlpGrads* g, const float* in, const float* gelu, const float* dfc,
                                const float* dout, long N, int C, int F, long terms, Workspace* ws) {
    linear_backward_weight(g->fc2_w, g->fc2_b, gelu, dout, (int)N, F, C, terms, ws);
    linear_backward_weight(g->fc_w, g->fc_b, in, dfc, (int)N, C, F, terms, ws);
}
static void block_backward_weight_attention(const BlockGrads* g, const float* x, const BlockActs* a,
                                            const BlockStash* st, const BlockDims* d, long terms, Workspace* ws) {
    long N = (long)d->R * d->Tq;
    int C = d->C, A = d->A;
    layernorm_backward_params(g->ln2_g, g->ln2_b, st->dln2, a->x1, a->ln2_mean, a->ln2_rstd, N, C, terms);
    linear_backward_weight(g->proj_w, g->proj_b, a->atty, st->dx1, (int)N, A, C, terms, ws);
    linear_backward_weight(g->qkv_w, g->qkv_b, a->ln1, st->dqkv, (int)N, C, 3 * A, terms, ws);
    layernorm_backward_params(g->ln1_g, g->ln1_b, st->dln1, x, a->ln1_mean, a->ln1_rstd, N, C, terms);
}
static void block_backward_weight(const BlockGrads* g, const float* x, const BlockActs* a, const BlockStash* st,
                                  const BlockDims* d, long terms, Workspace* ws) {
    MlpGrads mlp = block_mlp_grads(g);
    mlp_backward_weight(&mlp, a->ln2, a->gelu, st->dfc, st->dx2, (long)d->R * d->Tq, d->C, d->F, terms, ws);
    block_backward_weight_attention(g, x, a, st, d, terms, ws);
}

// ----------------------------------------------------------------------------
// the embedding and the head

// x[r][i] = wte[tokens[r][pos_i]] + wpe[pos_i]: token rows of this rank's vocabulary slice
// [v_lo, v_hi) (all: 0, V); rows of tokens it does not hold are zeros (train_tp.c sums them
// across ranks before adding wpe: with_pos 0 there, 1 here).
static void gpt_embedding_forward(float* x, const int* tokens, const float* wte, const float* wpe, int v_lo, int v_hi,
                                  int with_pos, const BlockDims* d) {
    int C = d->C;
    for (int r = 0; r < d->R; r++)
        for (int i = 0; i < d->Tq; i++) {
            int t = dims_pos(d, i), v = tokens[(long)r * d->T + t];
            float* o = x + ((long)r * d->Tq + i) * C;
            if (v >= v_lo && v < v_hi) memcpy(o, wte + (long)(v - v_lo) * C, C * sizeof(float));
            else memset(o, 0, C * sizeof(float));
            if (with_pos)
                for (int c = 0; c < C; c++) o[c] += wpe[(long)t * C + c];
        }
}
// dwte[v - v_lo] += exact sum of dx over the tokens v; dwpe[t] += exact sum over rows of
// dx at position t (dwpe NULL: not here). `terms`: tokens in the whole batch.
static void gpt_embedding_backward(int64_t* dwte, int64_t* dwpe, const int* tokens, const float* dx, int v_lo,
                                   int v_hi, const BlockDims* d, long terms) {
    int C = d->C;
    for (int r = 0; r < d->R; r++)
        for (int i = 0; i < d->Tq; i++) {
            int t = dims_pos(d, i), v = tokens[(long)r * d->T + t];
            const float* g = dx + ((long)r * d->Tq + i) * C;
            if (v >= v_lo && v < v_hi) fix_add(dwte + (long)(v - v_lo) * C, g, C, terms, "token embedding gradient");
            if (dwpe) fix_add(dwpe + (long)t * C, g, C, terms, "position embedding gradient");
        }
}

#pragma GCC diagnostic pop
#endif // TRANSFORMER_H
