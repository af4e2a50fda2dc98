/*
 * transformer.h: the GPT's block (--model gpt), makemore's Transformer block, as a list of
 * layers.h's layers; and the shapes of its parameters, of what its forward keeps, and of its
 * scratch.
 *
 *   tokens [R][T] -> wte[token] + wpe[position] -> x [R][T][C]
 *   block (x L):  x = x + proj(attention(qkv(ln1(x))))   NH causal heads of HD = C / NH
 *                 x = x + fc2(gelu(fc(ln2(x))))           fc: C -> F = 4C, fc2: F -> C
 *                 (--experts X: x = x + the gated sum of the MLPs of the top k of X experts,
 *                 each with its own fc and fc2, a router on ln2(x) choosing; moe.h)
 *   head:         logits = ln_f(x) lm_head                (C -> V, no bias, not tied to wte)
 *   loss:         cross-entropy, the mean over the batch's valid targets (padding has none)
 *
 * One process holds everything: Tq = T, NH = heads, A = C, F = 4C (layers.h's dims legend);
 * a tensor-parallel rank holds a share of the heads and of F (train_tp.c), a
 * context-parallel rank a share of the positions (train_cp.c).
 */
#ifndef TRANSFORMER_H
#define TRANSFORMER_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "layers.h"

// ----------------------------------------------------------------------------
// a block's parameters, what its forward keeps, and its scratch

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
// routes its own tokens), the S shared experts (--shared-experts, replicated too), then the
// X routed experts; each expert is the dense block's MLP with weights of its own, in the
// dense order (fc_w [C][F], fc_b [F], fc2_w [F][C], fc2_b [C]):
//   qkv_w, qkv_b, proj_w, | ln1_g, ln1_b, proj_b, ln2_g, ln2_b, router_w, shared 0 .. S-1, | expert 0 .. X-1
// so that what every rank of expert parallelism holds is one range (up to `routed`), and a
// rank holding experts [x_lo, x_hi) holds another.
typedef struct {
    long qkv_w, qkv_b, proj_w;                          // split by heads
    long ln1_g, ln1_b, proj_b, ln2_g, ln2_b, router_w, shared_w; // replicated
    long split, routed; // elements of the split tensors, and of everything before the routed experts
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
static MoeBlockLayout moe_block_layout(int C, int A, int F, int X, int S) {
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
    l.expert = mlp_layout(C, F).n;
    l.shared_w = at, at += S * l.expert;
    l.routed = at;
    l.n = l.routed + X * l.expert;
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
// Of them, attention's probabilities (the last of the layout), floats a row.
static long block_att_per_row(const BlockDims* d) { return (long)d->NH * d->Tq * d->T; }
static BlockActs block_acts_tokens(float* base, const BlockDims* d, int rows, int h) {
    BlockActs a;
    long n = (long)rows * d->Tq, m = (long)rows * h;
    float* at = base;
#define TAKE(field, count) (a.field = at, at += (count))
    TAKE(ln1, m * d->C), TAKE(ln1_mean, m), TAKE(ln1_rstd, m), TAKE(qkv, n * 3 * d->A);
    TAKE(atty, n * d->A), TAKE(x1, m * d->C);
    TAKE(ln2, m * d->C), TAKE(ln2_mean, m), TAKE(ln2_rstd, m), TAKE(fc, n * d->F), TAKE(gelu, n * d->F);
    TAKE(att, n * d->NH * d->T); // last: --recompute selective keeps it apart (model.h's acts_init)
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

#pragma GCC diagnostic pop
#endif // TRANSFORMER_H
