/*
 * layers.h: the layers both models are made of, each forward beside its backward with the
 * same arguments in the same order (outputs first, then inputs, then dims). Nothing here
 * knows a model, a configuration or a rank: the models (model.h) are lists of these, and
 * each strategy file puts its communication between them.
 *
 *   embedding         tokens -> rows of a table (the GPT's: + its position's row)
 *   linear            out = in W + b, its sum in float or exact, the exact one also in two
 *                     halves, so that a layout can complete a sum across ranks between them
 *   ReLU, GELU        elementwise
 *   LayerNorm         over the C features of each token
 *   causal attention  the softmax in two passes, its sums over keys and queries exact
 *   cross-entropy     softmax and loss in four steps, so that a layout can split the vocabulary
 *
 * Dims legend: R rows (examples, or names) of a pass, T positions of a row, E the MLP's
 * embedding width, K a linear layer's inputs, J its outputs, V the vocabulary; the GPT's
 * layers take their shapes in a BlockDims (below): Tq positions of a row held here, N = R Tq
 * tokens, C width, NH heads held here, HD a head's size, A = NH HD, F the MLP's width held here.
 *
 * Exact where some layout splits a sum (kernels.h's fixed point, rounded to float once):
 *  - a linear layer's forward sum when its inputs may be split (row-parallel), its input
 *    gradient when its outputs may be (column-parallel), and every weight and bias gradient
 *    (a sum over the rows of the batch);
 *  - attention's softmax over keys, in two passes: the row max first (a max is exact in any
 *    order), then the exact sums of exp(s - max) and of exp(s - max) v over keys. The one-pass
 *    "online" softmax (FlashAttention, ring attention as usually written) rescales running
 *    sums by exp(old max - new max) each time a block of keys raises the max, so its bits
 *    depend on how the keys were split into blocks: it cannot give the same bits in every
 *    layout. Two passes cost a second sweep over the keys (train_cp.c measures it). And dQ (a
 *    sum over keys), dK and dV (sums over queries);
 *  - LayerNorm's gain and bias gradients, both embeddings' gradients (sums over tokens), the
 *    loss and its sum of exponentials.
 * Float in a fixed order where no layout splits: one head's dot products over HD (q.k, dO.v,
 * dO.O), LayerNorm's mean and variance over C, the float linear sums.
 *
 * With --precision bf16 (kernels.h) the linear layers' operands are rounded by the kernels,
 * and attention rounds those of its matrix products: q and k for the scores, e and v for
 * e v, dO and v for dP, dS with k or q, P with dO. The sum S of e and the dot D = dO.y are
 * no matrix products and stay fp32, so the forward's y is the sum of round(e) v, divided by
 * S after the sum; dV takes round(P), and dS is computed from P unrounded, then rounded.
 */
#ifndef LAYERS_H
#define LAYERS_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "kernels.h"

// ----------------------------------------------------------------------------
// the shapes the GPT's layers work in

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

// ----------------------------------------------------------------------------
// embedding

// Embedding. This rank holds the table rows of tokens [v_lo, v_hi) (all of them: 0, V);
// rows of tokens it does not hold come out as zeros (train_tp.c sums them across ranks).
// out[r][t*E + e] = emb[tokens[r][t] - v_lo][e]
static void embedding_forward(float* out, const int* tokens, const float* emb, int v_lo, int v_hi, int R, int T,
                              int E) {
    for (long rt = 0; rt < (long)R * T; rt++) {
        int v = tokens[rt];
        float* o = out + rt * E;
        if (v >= v_lo && v < v_hi) memcpy(o, emb + (long)(v - v_lo) * E, E * sizeof(float));
        else memset(o, 0, E * sizeof(float));
    }
}
// demb[v - v_lo][e] += exact sum over the (r, t) with tokens[r][t] == v of dout[r][t*E + e]
static void embedding_backward(int64_t* demb, const int* tokens, const float* dout, int v_lo, int v_hi, int R,
                               int T, int E, long batch) {
    for (long rt = 0; rt < (long)R * T; rt++) {
        int v = tokens[rt];
        if (v >= v_lo && v < v_hi) fix_add(demb + (long)(v - v_lo) * E, dout + rt * E, E, batch * T, "embedding gradient");
    }
}

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

// ----------------------------------------------------------------------------
// linear

// Linear, plain float sum: out[r][j] = (sum_k in[r][k] w[k][j]) + b[j]
static void linear_forward(float* out, const float* in, const float* w, const float* b, int R, int K, int J,
                           Workspace* ws) {
    matmul_float_packed(out, in, weight_packed(ws, w, PACK_FLOAT, K, J)->data, R, K, J, ws);
    if (b)
        for (int r = 0; r < R; r++)
            for (int j = 0; j < J; j++) out[(long)r * J + j] += b[j];
}
// Linear, exact sum, in two steps, so that a layout whose ranks each hold some of the
// inputs can complete the sums between them (train_tp.c's g: an all-reduce of acc):
//  1. acc[r][j] = exact sum over this rank's k of in[r][k] w[k][j] (`terms` = the layer's
//     full input width, which sets the range limit alike in every layout)
static void linear_forward_partial(int64_t* acc, const float* in, const float* w, int R, int K, int J, long terms,
                                   Workspace* ws) {
    const PackedWeight* pw = weight_packed(ws, w, PACK_EXACT_B, K, J);
    exact_workspace_check(ws, R, K, J, "linear forward");
    matmul_exact_check(in, K, 1, w, R, K, J, max_abs(in, (long)R * K), pw->maxabs, terms, "linear forward");
    pack_exact_blocks(ws->pa, in, K, 1, R, K);
    matmul_exact_packed(acc, ws->pa, pw->data, R, K, J, 0); // acc = the sums
}
//  2. out[r][j] = float(acc[r][j] + b[j]): the whole sum, rounded to float once with the bias
static void linear_forward_finish(float* out, const int64_t* acc, const float* b, int R, int J) {
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) out[(long)r * J + j] = (float)(fix_to(acc[(long)r * J + j]) + (b ? b[j] : 0.0f));
}
// Both steps, on a process that holds every input
static void linear_forward_exact(float* out, int64_t* acc, const float* in, const float* w, const float* b, int R,
                                 int K, int J, Workspace* ws) {
    linear_forward_partial(acc, in, w, R, K, J, K, ws);
    linear_forward_finish(out, acc, b, R, J);
}
// Weight and bias gradients, exact over the rows (`batch` = rows in the whole batch):
// dw[k][j] += sum_r in[r][k] dout[r][j], db[j] += sum_r dout[r][j]
static void linear_backward_weight(int64_t* dw, int64_t* db, const float* in, const float* dout, int R, int K, int J,
                                   long batch, Workspace* ws) {
    matmul_exact(dw, in, 1, K, dout, K, R, J, batch, "weight gradient", ws);
    if (db)
        for (int r = 0; r < R; r++) fix_add(db, dout + (long)r * J, J, batch, "bias gradient");
}
// Input gradient, plain float sum: din[r][k] = sum_j dout[r][j] w[k][j]
static void linear_backward_input(float* din, const float* dout, const float* w, int R, int K, int J,
                                  Workspace* ws) {
    matmul_float_packed(din, dout, weight_packed(ws, w, PACK_FLOAT_T, K, J)->data, R, J, K, ws);
}
// Input gradient, exact sum, in two steps for the same reason (train_tp.c's f: an
// all-reduce of accT between them):
//  1. accT[k][r] = exact sum over this rank's j of w[k][j] dout[r][j] (`terms` = the layer's
//     full output width), transposed: the kernel is fastest with the long dimension K as rows
static void linear_backward_input_partial(int64_t* accT, const float* dout, const float* w, int R, int K, int J,
                                          long terms, Workspace* ws) {
    if ((long)R * J > ws->tr_cap) fatal("internal: workspace too small for a %d x %d transpose", R, J);
    const PackedWeight* pw = weight_packed(ws, w, PACK_EXACT_A, K, J);
    exact_workspace_check(ws, K, J, R, "input gradient");
    transpose(ws->tr, dout, R, J);
    matmul_exact_check(w, J, 1, ws->tr, K, J, R, pw->maxabs, max_abs(ws->tr, (long)J * R), terms, "input gradient");
    pack_exact_panels(ws->pb, ws->tr, J, R);
    matmul_exact_packed(accT, pw->data, ws->pb, K, J, R, 0); // accT = the sums
}
//  2. din[r][k] = float(accT[k][r]), rounded once
static void linear_backward_input_finish(float* din, const int64_t* accT, int R, int K) { fix_transpose(din, accT, K, R); }
// Both steps, on a process that holds every output
static void linear_backward_input_exact(float* din, int64_t* accT, const float* dout, const float* w, int R, int K,
                                        int J, Workspace* ws) {
    linear_backward_input_partial(accT, dout, w, R, K, J, J, ws);
    linear_backward_input_finish(din, accT, R, K);
}


// ----------------------------------------------------------------------------
// ReLU

// ReLU, in place: x = max(x, 0); backward zeroes the gradient where the output is 0.
static void relu_forward(float* x, long n) {
    for (long i = 0; i < n; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
static void relu_backward(float* dx, const float* x, long n) {
    for (long i = 0; i < n; i++) dx[i] = x[i] > 0.0f ? dx[i] : 0.0f;
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
// The gate s = (1 + tanh(u)) / 2 of x[0..n), n <= GELU_PIECE: -2u for each, their exps at
// once (kernels.h's expf_array: the C library's expf, many at a time), then s.
#define GELU_PIECE 512
static void gelu_gates(float* s, const float* x, long n) {
    for (long i = 0; i < n; i++) {
        float u = GELU_K * (x[i] + GELU_C * x[i] * x[i] * x[i]);
        s[i] = -2.0f * u;
    }
    expf_array(s, s, n);
    for (long i = 0; i < n; i++) s[i] = 1.0f / (1.0f + s[i]);
}
static void gelu_forward(float* out, const float* x, long n) {
    float s[GELU_PIECE];
    for (long i0 = 0; i0 < n; i0 += GELU_PIECE) {
        long m = n - i0 < GELU_PIECE ? n - i0 : GELU_PIECE;
        gelu_gates(s, x + i0, m);
        for (long i = 0; i < m; i++) out[i0 + i] = x[i0 + i] * s[i];
    }
}
// dx = dout gelu'(x), gelu'(x) = s + 2 x s (1 - s) du/dx, du/dx = sqrt(2/pi) (1 + 3 0.044715 x^2)
static void gelu_backward(float* dx, const float* x, const float* dout, long n) {
    float s[GELU_PIECE];
    for (long i0 = 0; i0 < n; i0 += GELU_PIECE) {
        long m = n - i0 < GELU_PIECE ? n - i0 : GELU_PIECE;
        gelu_gates(s, x + i0, m);
        for (long i = 0; i < m; i++) {
            float xi = x[i0 + i], si = s[i], du = GELU_K * (1.0f + 3.0f * GELU_C * xi * xi);
            dx[i0 + i] = dout[i0 + i] * (si + 2.0f * xi * si * (1.0f - si) * du);
        }
    }
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
// causal self-attention
//
// q, k and v of token n sit in its row of qkv [3A]: q at 0, k at A, v at 2A, head h at h HD
// in each. For each row r, head h and query i at position p, over the keys j at positions
// <= p (the causal mask; padding needs no mask of its own: a padded position's query attends
// to real keys before it, and its target is ignored by the loss):
//   s_ij = (q_i . k_j) x (1/sqrt(HD))           float, a fixed order over HD
//   m_i = max_j s_ij                             pass 1 (exact in any order)
//   e_ij = exp(s_ij - m_i), S_i = sum_j e_ij     pass 2, exact sums, and with them
//   y_i = (sum_j e_ij v_j) / S_i                 (so y needs no P before its sum: two passes, not three)
//   P_ij = e_ij / S_i                            kept for backward
// The functions below take the keys as a block, with their positions, so that a
// context-parallel rank runs the same passes block by block as K and V come round the ring
// (train_cp.c); this process passes one block holding every key. Scores and probabilities
// are kept by the key's position, att[r][h][i][p_j], whatever block brought them.

// s[j] = sum over e < HD of a[e] bT[e][j] (bT: [HD][Tk]) for the first n of the block's Tk keys,
// each an fmaf chain in the order e = 0, 1, ...: by 16 keys at a time where the block has 16
// more (loops of a fixed length vectorise; with makemore's 16 positions a query sees fewer,
// and a loop over just those ran scalar), the sums past n computed and dropped. Either path
// is the same chain from 0, so which one a key takes changes none of its bits. a is rounded
// here as a product's operand; bT was, when it was transposed.
static void dot_keys(float* s, const float* a, const float* bT, int HD, int n, int Tk) {
    enum { W = 16 };
    int j0 = 0;
    for (; j0 < n && j0 + W <= Tk; j0 += W) {
        float t[W] = {0};
        for (int e = 0; e < HD; e++) {
            float ae = operand(a[e]);
            for (int j = 0; j < W; j++) t[j] = fmaf(ae, bT[(long)e * Tk + j0 + j], t[j]);
        }
        for (int j = 0; j < W && j0 + j < n; j++) s[j0 + j] = t[j];
    }
    for (int j = j0; j < n; j++) s[j] = 0.0f;
    for (int e = 0; e < HD; e++) {
        float ae = operand(a[e]);
        for (int j = j0; j < n; j++) s[j] = fmaf(ae, bT[(long)e * Tk + j], s[j]);
    }
}
// Pass 1 over a block of Tk keys (k [R][Tk], rows `ldk` floats apart, at head 0): scores into
// att and the row maxima into rowmax [R][NH][Tq] (start at -infinity). kT: [HD][Tk] floats.
static void attention_scores(float* att, float* rowmax, const float* qkv, long ldq, const float* k, long ldk,
                             const int* kpos, int Tk, const BlockDims* d, float* kT) {
    float scale = 1.0f / sqrtf((float)d->HD);
    for (int r = 0; r < d->R; r++)
        for (int h = 0; h < d->NH; h++) {
            for (int j = 0; j < Tk; j++) // this head's keys, transposed: the scores vectorise over keys
                for (int e = 0; e < d->HD; e++) kT[(long)e * Tk + j] = operand(k[((long)r * Tk + j) * ldk + h * d->HD + e]);
            for (int i = 0; i < d->Tq; i++) {
                const float* q = qkv + ((long)r * d->Tq + i) * ldq + h * d->HD;
                float* srow = att + (((long)r * d->NH + h) * d->Tq + i) * d->T;
                float* m = rowmax + ((long)r * d->NH + h) * d->Tq + i;
                int p = dims_pos(d, i), n = 0;
                while (n < Tk && kpos[n] <= p) n++; // kpos ascends: keys [0, n) are visible
                float s[n > 0 ? n : 1];
                dot_keys(s, q, kT, d->HD, n, Tk); // q . k_j
                for (int j = 0; j < n; j++) {
                    float v = s[j] * scale;
                    srow[kpos[j]] = v;
                    *m = v > *m ? v : *m;
                }
            }
        }
}
// max |x| over `rows` rows of `cols` floats, `ld` apart; infinity if one is not finite. The
// exact sums below add, for each (query, key) pair, HD terms factor x vector (e v_j, dS k_j,
// dS q_i, P dO_i); they check one bound a pair, |factor| x max |vector| (the max taken once a
// block of keys, or once a query), not every term, and check a pair's terms one by one only
// where it fails (NaN and infinity fail it), so whether a run stops still depends on the terms
// alone, and the inner loops are products and integer adds.
static double rows_max_abs(const float* x, long ld, int rows, int cols) {
    double mx = 0.0;
    for (int r = 0; r < rows; r++) mx = fmax(mx, max_abs(x + r * ld, cols));
    return mx;
}
// acc[x] += the exact term a b[x], for x < n, with a40 = a 2^40: a40 b[x] is exact in double,
// so adding FIX_BIAS rounds it once, as fix_fast(a b[x]) does (fused into one multiply-add or
// not, the same bits). Returns whether some term is at or above lim (checked only if `check`:
// the caller's bound failed). The sum wraps as unsigned: an out-of-range term, about to stop
// the run, is no signed overflow.
ALWAYS_INLINE int fix_add_scaled_body(int64_t* restrict acc, double a40, const float* restrict b, int n, int check,
                                      double lim, int round) {
    uint64_t bias = fix_bias_bits();
    int bad = 0;
    for (int x = 0; x < n; x++) {
        double t = a40 * operand_round(b[x], round) + FIX_BIAS;
        uint64_t bits;
        memcpy(&bits, &t, sizeof bits);
        acc[x] = (int64_t)((uint64_t)acc[x] + (bits - bias));
    }
    if (check)
        for (int x = 0; x < n; x++) bad |= !(fabs(a40 * (1.0 / FIX_ONE) * operand_round(b[x], round)) < lim);
    return bad;
}
// The same with b as a product's operand (a, the caller's, already is one)
ALWAYS_INLINE int fix_add_scaled(int64_t* restrict acc, double a40, const float* restrict b, int n, int check,
                                 double lim) {
    return operands_bf16 ? fix_add_scaled_body(acc, a40, b, n, check, lim, 1)
                         : fix_add_scaled_body(acc, a40, b, n, check, lim, 0);
}
// Pass 2 over a block of values (v [R][Tk], rows `ldv` apart, at head 0): e = exp(s - max)
// in place of the scores; expsum [R][NH][Tq] += exact e; acc [R][Tq][A] += exact e v.
// `terms`: the terms of a whole sum, T (sets the range limit alike in every layout).
static void attention_exp_pv(float* att, int64_t* expsum, int64_t* acc, const float* rowmax, const float* v,
                             long ldv, const int* kpos, int Tk, const BlockDims* d, long terms) {
    double lim = fix_term_limit(terms);
    int bad = 0;
    for (int r = 0; r < d->R; r++)
        for (int h = 0; h < d->NH; h++) {
            double vmax = operand(rows_max_abs(v + (long)r * Tk * ldv + h * d->HD, ldv, Tk, d->HD)); // |e v| <= e max|v|
            for (int i = 0; i < d->Tq; i++) {
                long rhi = ((long)r * d->NH + h) * d->Tq + i;
                float* srow = att + rhi * d->T;
                int64_t* a = acc + ((long)r * d->Tq + i) * d->A + h * d->HD;
                int p = dims_pos(d, i);
                for (int j = 0; j < Tk && kpos[j] <= p; j++) {
                    float e = expf(srow[kpos[j]] - rowmax[rhi]); // 0 <= e <= 1
                    const float* vj = v + ((long)r * Tk + j) * ldv + h * d->HD;
                    srow[kpos[j]] = e;
                    expsum[rhi] += fix_fast(e); // e itself: only the product e v_j takes e as a bf16 operand
                    float eo = operand(e);
                    bad |= fix_add_scaled(a, (double)eo * FIX_ONE, vj, d->HD, !(eo * vmax < lim), lim);
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
//   layout splits it), dP_ij = dO_i . v_j, dS_ij = P_ij (dP_ij - D_i) x (1/sqrt(HD)), and
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
                for (int e = 0; e < d->HD; e++) vT[(long)e * Tk + j] = operand(v[((long)r * Tk + j) * ldv + h * d->HD + e]);
            double kmax = operand(rows_max_abs(k + (long)r * Tk * ldk + h * d->HD, ldk, Tk, d->HD));
            for (int i = 0; i < d->Tq; i++) {
                long rhi = ((long)r * d->NH + h) * d->Tq + i;
                const float* prow = att + rhi * d->T;
                const float *qi = qkv + ((long)r * d->Tq + i) * ldq + h * d->HD, *dyi = dy + ((long)r * d->Tq + i) * ldy + h * d->HD;
                int64_t* dqi = dq + ((long)r * d->Tq + i) * d->A + h * d->HD;
                int p = dims_pos(d, i), n = 0;
                while (n < Tk && kpos[n] <= p) n++;
                float dp[n > 0 ? n : 1];
                dot_keys(dp, dyi, vT, d->HD, n, Tk); // dP_ij = dO_i . v_j
                double qmax = operand(max_abs(qi, d->HD)), dymax = operand(max_abs(dyi, d->HD));
                for (int j = 0; j < n; j++) {
                    float pij = prow[kpos[j]], P = operand(pij), ds = operand(pij * (dp[j] - D[rhi]) * scale);
                    const float* kj = k + ((long)r * Tk + j) * ldk + h * d->HD;
                    int64_t *dkj = dk + ((long)r * Tk + j) * d->A + h * d->HD, *dvj = dv + ((long)r * Tk + j) * d->A + h * d->HD;
                    double ds40 = (double)ds * FIX_ONE, P40 = (double)P * FIX_ONE, s = fabs((double)ds);
                    bad |= fix_add_scaled(dqi, ds40, kj, d->HD, !(s * kmax < lim), lim); // dq_i += ds k_j
                    bad |= fix_add_scaled(dkj, ds40, qi, d->HD, !(s * qmax < lim), lim); // dk_j += ds q_i
                    bad |= fix_add_scaled(dvj, P40, dyi, d->HD, !(fabsf(P) * dymax < lim), lim); // dv_j += P dO_i
                }
            }
        }
    if (bad) fatal("attention backward: a gradient is too large for an exact sum of %ld terms (limit %g)%s%ld: "
                   "training has diverged; lower --lr or use --clip", terms, lim,
                   current_step > 0 ? " at step " : ", before step ", current_step > 0 ? current_step : 1L);
}
// The backward on one process, every key in one block, given D (train_cp.c's Ulysses
// computes D where y is, and sends it): dqkv [R][Tq][3A] from dy = d atty. vT: [HD][T] floats.
static void attention_backward_from_d(float* dqkv, const float* dy, const float* qkv, const float* att, const float* D,
                                      const BlockDims* d, float* vT, int64_t* acc) {
    long n = (long)d->R * d->Tq, ld = 3L * d->A;
    int64_t *dq = acc, *dk = acc + n * d->A, *dv = acc + 2 * n * d->A;
    int kpos[d->T];
    for (int t = 0; t < d->T; t++) kpos[t] = t;
    fix_zero(acc, 3 * n * d->A);
    attention_backward_block(dq, dk, dv, att, D, qkv, ld, qkv + d->A, ld, qkv + 2 * d->A, ld, dy, d->A, kpos, d->T, d,
                             vT, d->T);
    for (long t = 0; t < n; t++)
        for (int x = 0; x < d->A; x++) {
            dqkv[t * ld + x] = (float)fix_to(dq[t * d->A + x]);
            dqkv[t * ld + d->A + x] = (float)fix_to(dk[t * d->A + x]);
            dqkv[t * ld + 2 * d->A + x] = (float)fix_to(dv[t * d->A + x]);
        }
}
// The backward on one process: D from dy and y, then the above.
static void attention_backward(float* dqkv, const float* dy, const float* qkv, const float* att, const float* atty,
                               const BlockDims* d, float* tmp, int64_t* acc) {
    float *D = tmp, *vT = tmp + (long)d->R * d->NH * d->Tq;
    attention_backward_d(D, dy, atty, d->A, d);
    attention_backward_from_d(dqkv, dy, qkv, att, D, d, vT, acc);
}

// ----------------------------------------------------------------------------
// softmax cross-entropy

// Softmax cross-entropy, in four steps so that train_tp.c can split the vocabulary
// across ranks and insert one all-reduce after each of the first three. This rank holds
// logit columns c = 0..Vl-1 for tokens v_lo + c; columns with v_lo + c >= V are padding
// and never take part. In train.c, v_lo = 0 and Vl = V.
//  1. rowmax[r] = max over this rank's real columns (all-reduce MAX: exact)
static void xent_rowmax(float* rowmax, const float* logits, int R, int Vl, int v_lo, int V) {
    for (int r = 0; r < R; r++) {
        float m = -INFINITY;
        for (int c = 0; c < Vl && v_lo + c < V; c++) m = logits[(long)r * Vl + c] > m ? logits[(long)r * Vl + c] : m;
        rowmax[r] = m;
    }
}
//  2. tlogit[r] = the target's logit if this rank holds it, else 0 (all-reduce SUM: one
//     rank contributes, the others add zeros, so the sum is exact)
static void xent_target_logit(float* tlogit, const float* logits, const int* targets, int R, int Vl, int v_lo) {
    for (int r = 0; r < R; r++) {
        int c = targets[r] - v_lo;
        tlogit[r] = c >= 0 && c < Vl ? logits[(long)r * Vl + c] : 0.0f;
    }
}
//  3. probs[r][c] = exp(logit - rowmax), in place over the logits; expsum[r] = exact sum
//     of them (all-reduce SUM)
static void xent_expsum(int64_t* expsum, float* probs, const float* logits, const float* rowmax, int R, int Vl,
                        int v_lo, int V) {
    for (int r = 0; r < R; r++) {
        int64_t s = 0;
        for (int c = 0; c < Vl; c++) {
            float e = v_lo + c < V ? expf(logits[(long)r * Vl + c] - rowmax[r]) : 0.0f;
            probs[(long)r * Vl + c] = e;
            s += fix_fast(e); // 0 <= e <= 1
        }
        expsum[r] = s;
    }
}
//  4. probs /= the sum; returns the exact sum of the rows' losses, loss = log(sum) + max - tlogit,
//     over the rows whose target is a token (the GPT's padding has target -1, and no loss).
//     `rows_total` is the number of rows whose losses will be added together.
static int64_t xent_finish(float* probs, const int64_t* expsum, const float* rowmax, const float* tlogit,
                           const int* targets, int R, int Vl, long rows_total) {
    int64_t loss = 0;
    for (int r = 0; r < R; r++) {
        double s = fix_to(expsum[r]);
        for (int c = 0; c < Vl; c++) probs[(long)r * Vl + c] = (float)(probs[(long)r * Vl + c] / s);
        if (targets[r] >= 0) loss += fix_term(log(s) + rowmax[r] - tlogit[r], rows_total, "loss");
    }
    return loss;
}
// the four steps on one rank holding the whole vocabulary (train.c's case): the logits
// become the probabilities in place; returns the exact sum of the rows' losses
static int64_t xent_forward(float* logits, int64_t* expsum, float* rowmax, float* tlogit, const int* targets, int R,
                            int V, long rows_total) {
    xent_rowmax(rowmax, logits, R, V, 0, V);
    xent_target_logit(tlogit, logits, targets, R, V, 0);
    xent_expsum(expsum, logits, logits, rowmax, R, V, 0, V);
    return xent_finish(logits, expsum, rowmax, tlogit, targets, R, V, rows_total);
}
// backward of the loss summed over rows: dlogits = probs - onehot(target), 0 where no target
static void xent_backward(float* dlogits, const float* probs, const int* targets, int R, int Vl, int v_lo) {
    memcpy(dlogits, probs, (size_t)R * Vl * sizeof(float));
    for (int r = 0; r < R; r++) {
        int c = targets[r] - v_lo;
        if (targets[r] < 0) memset(dlogits + (long)r * Vl, 0, (size_t)Vl * sizeof(float));
        else if (c >= 0 && c < Vl) dlogits[(long)r * Vl + c] -= 1.0f;
    }
}

#pragma GCC diagnostic pop
#endif // LAYERS_H
