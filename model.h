/*
 * model.h: the character-level language models every program trains: the MLP (the default)
 * and, with --model gpt, makemore's GPT (its layers are transformer.h's).
 *
 *   MLP: embedding (V x E) -> flatten (T*E) -> [Linear -> ReLU] x L -> Linear (-> V) -> softmax cross-entropy
 *   GPT: token + position embedding (V x C, T x C) -> [block: attention, MLP] x L -> LayerNorm -> Linear (-> V)
 *        -> softmax cross-entropy at every position
 *
 * Read top to bottom: configuration; ops (each with a forward and a backward taking the
 * same arguments in the same order: outputs first, then inputs, then dims); the mixture of
 * experts; parameter layout and initialisation; activations; the GPT's units (its layers
 * are transformer.h's); a unit with a mixture of experts; the model as a list of units;
 * optimizers and the gradient norm; the program's forward pass, validation and sampling.
 * The arithmetic itself (matmul kernels, exact fixed-point sums) is in kernels.h.
 *
 * Dims legend: R rows (examples) in a batch, T context length, E embedding size,
 * V vocabulary size, H hidden size, L hidden layers, K a linear layer's inputs, J its outputs;
 * with --experts, X experts per hidden layer (the GPT: per block), each token (the GPT: a
 * position) routed to its top k.
 *
 * Units: the model is a list of L+2 units, the granularity at which a pipeline splits it
 * into stages and at which FSDP gathers it: unit 0 is the embedding, unit l (1 <= l <= L+1)
 * is linear layer l, followed by its ReLU (l <= L) or by the loss (l = L+1). The GPT's:
 * unit 0 the embeddings, units 1..L its blocks, unit L+1 the head (ln_f, lm_head, the loss).
 */
#ifndef MODEL_H
#define MODEL_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "util.h" // first: it sets the POSIX feature level
#include "kernels.h"
#include <limits.h>
#include "data.h"

#define MAX_LAYERS 32

// ----------------------------------------------------------------------------
// configuration

typedef enum { MODEL_MLP, MODEL_GPT } ModelKind;
static const char* const model_names[] = {"mlp", "gpt"};

typedef struct {
    int model;   // MODEL_MLP (the default) or MODEL_GPT (--model gpt)
    int heads;   // GPT: attention heads (--heads); a head's size is emb / heads
    int vocab;   // V
    int context; // T
    int emb;     // E
    int hidden;  // H
    int layers;  // L
    // mixture of experts (--experts, the section "mixture of experts" below); experts = 0:
    // the dense model
    int experts;     // X
    int top_k;       // k: experts per token (1 or 2)
    float capacity;  // F: an expert takes at most ceil(F k B / X) of a training batch's B tokens
    float aux_loss;  // alpha: weight of the load-balancing loss
} Config;

static inline int is_gpt(const Config* c) { return c->model == MODEL_GPT; }
// Units: the model as a list of L+2, the granularity at which a pipeline cuts it into
// stages and FSDP gathers it. The MLP: the embedding, linear layers 1..L (with ReLU), linear
// layer L+1 with the loss. The GPT: the embedding (tokens and positions), blocks 1..L, the
// head (LayerNorm, lm_head, loss).
static inline int n_units(const Config* c) { return c->layers + 2; }
static inline int linear_in(const Config* c, int l) { return l == 1 ? c->context * c->emb : c->hidden; }
static inline int linear_out(const Config* c, int l) { return l == c->layers + 1 ? c->vocab : c->hidden; }
// width of unit u's output row: the MLP's embedding's is T*E, linear l's is linear_out(l);
// the GPT's are T*C, and the head's T*V (the probabilities at every position)
static inline int unit_width(const Config* c, int u) {
    if (is_gpt(c)) return c->context * (u == c->layers + 1 ? c->vocab : c->emb);
    return u == 0 ? c->context * c->emb : linear_out(c, u);
}
// What a row's loss sums over: one target (the MLP: an example), or T (the GPT: a name,
// the padded positions among them carrying none)
static inline int targets_per_row(const Config* c) { return is_gpt(c) ? c->context : 1; }
static long gpt_unit_params(const Config* c, int u); // the GPT's section below
// Whether unit u is a mixture of experts: with --experts, every hidden layer of the MLP, and
// every block of the GPT (its MLP half).
static inline int is_moe(const Config* c, int u) { return c->experts > 0 && u >= 1 && u <= c->layers; }
// An MoE unit's parameters: first those every rank of expert parallelism holds (`shared`:
// the MLP's router's weight [K][X]; the GPT's block's attention, LayerNorms and router,
// transformer.h's moe_block_layout), then expert 0's block, expert 1's, ...: each expert
// one contiguous block (the MLP's: a weight [K][H] and a bias [H]; the GPT's: its MLP,
// transformer.h's mlp_layout), so that a rank holding experts [x_lo, x_hi) holds one range.
static inline long router_params(const Config* c, int u) {
    return (long)(is_gpt(c) ? c->emb : linear_in(c, u)) * c->experts;
}
static inline long expert_params(const Config* c, int u) {
    if (is_gpt(c)) return 8L * c->emb * c->emb + 5L * c->emb; // fc C x 4C and its bias, fc2 4C x C and its bias
    return (long)linear_in(c, u) * c->hidden + c->hidden;
}
static inline long moe_shared_params(const Config* c, int u) {
    if (is_gpt(c)) return 4L * c->emb * c->emb + 8L * c->emb + router_params(c, u); // qkv, proj, ln1, ln2, router
    return router_params(c, u);
}
// parameters of unit u: the embedding table, a weight [K][J] followed by a bias [J], or
// an MoE layer's router and experts
static inline long unit_params(const Config* c, int u) {
    if (is_gpt(c)) return gpt_unit_params(c, u);
    if (is_moe(c, u)) return router_params(c, u) + c->experts * expert_params(c, u);
    return u == 0 ? (long)c->vocab * c->emb : (long)linear_in(c, u) * linear_out(c, u) + linear_out(c, u);
}
static inline long unit_offset(const Config* c, int u) {
    long off = 0;
    for (int v = 0; v < u; v++) off += unit_params(c, v);
    return off;
}
static inline long n_params(const Config* c) { return unit_offset(c, n_units(c)); }
// The most tokens an MoE unit routes from one row: the MLP's row is one; the GPT's, T positions
static inline int moe_tokens_per_row(const Config* c) { return is_gpt(c) ? c->context : 1; }
static inline long max_unit_params(const Config* c) {
    long m = 0;
    for (int u = 0; u < n_units(c); u++) m = unit_params(c, u) > m ? unit_params(c, u) : m;
    return m;
}
// the largest weight matrix: a linear layer's (an expert's has the same shape) or a router's
static inline long max_linear_weight(const Config* c) {
    if (is_gpt(c)) { // fc's, lm_head's, or a router's
        long m = 4L * c->emb > c->vocab ? 4L * c->emb : c->vocab;
        return (long)c->emb * (c->experts > m ? c->experts : m);
    }
    long m = 0;
    for (int l = 1; l <= c->layers + 1; l++) {
        long w = (long)linear_in(c, l) * (is_moe(c, l) && c->experts > linear_out(c, l) ? c->experts : linear_out(c, l));
        m = w > m ? w : m;
    }
    return m;
}
// the widest row a pass works on: a unit's output or, in the GPT, fc's T*4C or lm_head's T*V
static inline int max_width(const Config* c) {
    if (is_gpt(c)) return c->context * (4 * c->emb > c->vocab ? 4 * c->emb : c->vocab);
    int m = c->context * c->emb;
    if (c->hidden > m) m = c->hidden;
    if (c->vocab > m) m = c->vocab;
    if (c->experts > m) m = c->experts;
    return m;
}

// Which sums of the MLP's linear layers are exact. Tensor parallelism (train_tp.c) pairs
// them the Megatron way, from the first: layer 1 column-parallel (each rank computes some
// outputs), layer 2 row-parallel (each rank holds some inputs), layer 3 column-parallel
// again, and so on; so with --layers 1 the output layer (layer 2) is row-parallel, and
// with --layers 2 it is column-parallel and the loss splits by vocabulary. A row-parallel
// layer's forward sum, and a column-parallel layer's input-gradient sum, are split across
// ranks, so train.c computes exactly those two sums exactly too (kernels.h); no layout
// splits the others, which stay plain float chains. (The GPT names its own: transformer.h.)
typedef enum { COLUMN_PARALLEL, ROW_PARALLEL } LinearKind;
static inline LinearKind linear_kind(int l) { return l % 2 ? COLUMN_PARALLEL : ROW_PARALLEL; }

// ----------------------------------------------------------------------------
// ops

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

// Linear, plain float sum: out[r][j] = (sum_k in[r][k] w[k][j]) + b[j]
static void linear_forward(float* out, const float* in, const float* w, const float* b, int R, int K, int J,
                           Workspace* ws) {
    matmul_float_packed(out, in, weight_packed(ws, w, PACK_FLOAT, K, J)->data, R, K, J);
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
    fix_zero(acc, (long)R * J);
    matmul_exact_packed(acc, ws->pa, pw->data, R, K, J);
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
    matmul_float_packed(din, dout, weight_packed(ws, w, PACK_FLOAT_T, K, J)->data, R, J, K);
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
    fix_zero(accT, (long)R * K);
    matmul_exact_packed(accT, pw->data, ws->pb, K, J, R);
}
//  2. din[r][k] = float(accT[k][r]), rounded once
static void linear_backward_input_finish(float* din, const int64_t* accT, int R, int K) { fix_transpose(din, accT, K, R); }
// Both steps, on a process that holds every output
static void linear_backward_input_exact(float* din, int64_t* accT, const float* dout, const float* w, int R, int K,
                                        int J, Workspace* ws) {
    linear_backward_input_partial(accT, dout, w, R, K, J, J, ws);
    linear_backward_input_finish(din, accT, R, K);
}

// ReLU, in place: x = max(x, 0); backward zeroes the gradient where the output is 0.
static void relu_forward(float* x, long n) {
    for (long i = 0; i < n; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
static void relu_backward(float* dx, const float* x, long n) {
    for (long i = 0; i < n; i++) dx[i] = x[i] > 0.0f ? dx[i] : 0.0f;
}

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

// The GPT's layers and its block (they use the ops above)
#include "transformer.h"

// ----------------------------------------------------------------------------
// mixture of experts
//
// With --experts X every hidden layer of the MLP, and the MLP half of every block of the
// GPT, is a mixture of X experts, each shaped like the dense layer it replaces, and a router
// (Linear K -> X, no bias):
//
//   in [n][K] --router--> p = softmax(in Wr) [n][X] --> each token's top k experts, gates g
//     --dispatch--> expert x: h = E_x(in) --combine--> out[t] = sum over t's k of g h
//
// The MLP's expert is Linear K -> H then ReLU; the GPT's is the block's MLP, fc C -> 4C,
// GELU, fc2 4C -> C (transformer.h's mlp_forward), with weights and biases of its own. A
// token is a row of K floats, whatever it stands for: the MLP's tokens are the rows of a
// pass (n = R); the GPT's are positions, ln2's output rows (the unit around the layer, in
// "a unit with a mixture of experts" below, says which positions). Nothing below depends
// on what an expert computes (Expert: rows of K floats to rows of H floats).
//
// Choices:
//  - Gates: with k = 1 the router's probability itself (Switch Transformer): renormalised
//    over one expert it would always be 1, and the loss would teach the router nothing;
//    with k = 2 renormalised over the two (Mixtral), so that a token's output keeps the
//    scale of one expert's however sure the router is. Ties go to the lower expert index.
//  - Capacity: in a training batch of B tokens, expert x takes at most C = ceil(F k B / X)
//    of them; past that a token is dropped by x (its term of the output is 0). Priority
//    goes by slot, then by token of the global batch (GShard): every token's first choice
//    before any second choice. Validation and sampling drop nothing: capacity bounds the
//    work of a training step, and a model judged with drops would be judged on a
//    batch-dependent part.
//  - Load balancing (Switch): aux = alpha X sum_x f_x P_x, with f_x the share of the batch's
//    k B choices that went to x (before drops) and P_x the mean probability the router gave
//    x. It is added to the objective and reported apart. f_x is a count (its gradient is 0),
//    so in the sum of the tokens' losses every token's p_x gets the gradient alpha X f_x.
//
// Why every layout gets the same bits: a token's routing, gates and combine are computed on
// the token's own rank; an expert's output for a token is one row of a matmul, the same bits
// whichever tokens share the call (kernels.h); the sums that gather tokens from many ranks
// (an expert's and the router's weight gradients, the aux loss) are exact. Capacity needs
// each token's place among all those that chose its expert: the ranks share their counts.
//
// How a layout spreads the experts: `ranks` ranks each hold a contiguous range of the X
// experts (split_range) and route their own tokens, contiguous ranges of the batch in rank
// order. The layer is written as steps, so that a layout puts its communication between
// them, in its own file (train_ep.c: the counts all-gathered, dispatch and combine
// all-to-alls); moe_forward and moe_backward, at the end of this section, are the same
// steps on one process (train.c), whose counts are all its own and whose all-to-alls are
// copies:
//   forward    moe_route           the router: probabilities, each token's top k and gates,
//                                  and the counts of this rank's choices
//              moe_plan            from every rank's counts: the capacity's cut, the
//                                  dispatch order, the rows to and from each rank
//              moe_balance         (training) the load-balancing loss, and the load figures
//              moe_permute         the kept tokens' input rows, in the dispatch order
//              | dispatch          each row to the rank holding its expert
//              expert_forward      each expert on the tokens it received
//              | combine           each output back to its token's rank
//              moe_unpermute       each token's gated sum of its experts' outputs
//   backward   moe_unpermute_backward, | dispatch, expert_backward, | combine,
//              moe_router_backward, moe_permute_backward
// (permute and unpermute: Megatron's names for the local halves of dispatch and combine.)

// An expert, as the layer sees it: a function from rows of K floats to rows of H floats,
// with `params` parameters of its own in one block, that keeps `saved` floats a token for
// its backward besides its input and output rows, and works in `tmp` floats and `acc`
// int64s a token of scratch. Two kinds:
//  - the MLP's: Linear K -> H then ReLU (a weight [K][H], then a bias [H]), keeping nothing
//    more (ReLU's backward reads its output), needing no scratch;
//  - the GPT's: the block's MLP, K = H = C, F = 4C (transformer.h's mlp_layout), keeping
//    fc's and GELU's outputs [2F]; scratch: fc2's input gradient [F], and the exact sums of
//    fc2's output and of fc's input gradient [C]. As in the dense block, those two are the
//    exact sums (a later axis may split an expert's F across tensor-parallel ranks).
typedef enum { EXPERT_LINEAR_RELU, EXPERT_GELU_MLP } ExpertKind;
typedef struct {
    ExpertKind kind;
    int K, H, F; // F: the GELU MLP's width (0 for the MLP's expert)
    long params, saved, tmp, acc;
} Expert;
static Expert moe_expert(const Config* c, int u) {
    if (is_gpt(c)) {
        int C = c->emb, F = 4 * c->emb;
        return (Expert){.kind = EXPERT_GELU_MLP, .K = C, .H = C, .F = F, .params = expert_params(c, u),
                        .saved = 2L * F, .tmp = F, .acc = C};
    }
    return (Expert){.kind = EXPERT_LINEAR_RELU, .K = linear_in(c, u), .H = c->hidden, .params = expert_params(c, u)};
}
// out [n][H] = the expert with parameters w on in [n][K]; its own activations to saved [n][saved]
static void expert_forward(const Expert* e, float* out, float* saved, const float* in, const float* w, int n,
                           float* tmp, int64_t* acc, Workspace* ws) {
    (void)tmp;
    if (e->kind == EXPERT_GELU_MLP) {
        MlpParams p = expert_mlp(w, e->K, e->F);
        float *fc = saved, *gelu = saved + (long)n * e->F; // saved [n][2F]: fc's output rows, then GELU's
        mlp_forward(out, fc, gelu, in, &p, n, e->K, e->F, acc, ws);
        return;
    }
    (void)saved, (void)acc; // the MLP's expert keeps none, and sums in float
    linear_forward(out, in, w, w + (long)e->K * e->H, n, e->K, e->H, ws);
    relu_forward(out, (long)n * e->H);
}
// Backward, from dout [n][H] (overwritten): din [n][K], and the exact gradients of its
// parameters added into g (laid out as w; `terms`: tokens in the whole batch)
static void expert_backward(const Expert* e, float* din, int64_t* g, float* dout, const float* in, const float* out,
                            const float* saved, const float* w, int n, long terms, float* tmp, int64_t* acc,
                            Workspace* ws) {
    if (e->kind == EXPERT_GELU_MLP) {
        MlpParams p = expert_mlp(w, e->K, e->F);
        MlpGrads gp = expert_mlp_grads(g, e->K, e->F);
        const float *fc = saved, *gelu = saved + (long)n * e->F;
        float* dfc = tmp; // fc2's input gradient, then in place fc's output gradient [n][F]
        mlp_backward_input(din, dfc, dfc, dout, fc, &p, n, e->K, e->F, acc, ws);
        mlp_backward_weight(&gp, in, gelu, dfc, dout, n, e->K, e->F, terms, ws);
        return;
    }
    (void)saved, (void)tmp, (void)acc;
    relu_backward(dout, out, (long)n * e->H);
    linear_backward_weight(g, g + (long)e->K * e->H, in, dout, n, e->K, e->H, terms, ws);
    linear_backward_input(din, dout, w, n, e->K, e->H, ws);
}

// The layer reads two pieces of its unit's parameters: the router's weight [K][X] (wr),
// and the experts' blocks one after another (we, after every shared parameter of the unit:
// moe_shared_params). Where expert x starts in we, on a rank whose first expert is x_lo:
static long moe_expert_at(const Expert* e, int x, int x_lo) { return (long)(x - x_lo) * e->params; }

// What one MoE layer keeps from its forward for its backward, and its load figures.
typedef struct {
    int layer;         // the unit it is, for traces
    Expert e;          // what each of its experts computes
    int rows;          // capacity of the per-token arrays, in tokens
    int n;             // tokens of the last pass (this rank's)
    float* probs;      // [rows][X] router probabilities
    float* dprobs;     // [rows][X] backward: their gradient, then the router's output gradient
    int* choice;       // [rows][k] chosen experts, most probable first
    float* gate;       // [rows][k] their weights in the output
    float* dgate;      // [rows][k] backward
    int* slot;         // [rows][k] the token's place in the dispatch order, or -1: dropped
    int* mine;         // [k][X] this rank's choices, by slot and expert
    double* coef;      // [X] alpha X f_x: the aux loss's gradient on each token's p_x
    // the plan (ranks = the layout's ranks): start[ranks][k][X] the place of each block's
    // first token, kept[ranks][X] tokens each rank sends to each expert, send_rows and
    // recv_rows [ranks] rows to and from each rank
    int ranks;
    int *kept, *send_rows, *recv_rows, *next;
    long* start;
    // tokens dispatched by this rank, in the dispatch order: by expert (and so by the rank
    // holding it), then slot, then token; and the tokens this rank's experts received, by
    // source rank, then expert. Rows of max(K, H) floats at most.
    long n_sent, n_recv, sent_cap, recv_cap;
    int* sent_row;     // [n_sent] the token each came from
    float* sent;       // [n_sent] inputs [K]; backward: output gradients [H]
    float* back;       // [n_sent] the experts' outputs [H]; backward: input gradients [K]
    float* recv_in;    // [n_recv][K] inputs, kept for the backward
    float* recv_h;     // [n_recv][H] outputs, kept for the backward
    float* recv_saved; // [n_recv][saved] what the experts keep besides
    float* recv_d;     // [n_recv][H] backward: output gradients
    float* recv_din;   // [n_recv][K] backward: input gradients
    float* tmp;        // [n_recv][tmp] the experts' scratch
    int64_t* acc;      // [n_recv][acc]
    // the GPT's unit around the layer (acts_init): which positions are its tokens, and their
    // rows of ln2's output, kept for the router's backward; NULL in the MLP's
    int* token;        // [rows] position r T + t of each token, ascending
    float* in;         // [rows][K]
    // load, over the training steps: tokens that chose each expert, and tokens dropped
    double* load_sum;  // [X]
    double dropped_sum;
    long dropped_last, capacity_last, steps;
    double tokens_out, tokens_in; // tokens sent to other ranks' experts, and received from other ranks
    double tokens_sum, mine_sum;  // tokens of the batches, and of this rank's share of them
} MoeLayer;

// A layer of experts `e` (unit `layer`), for passes of up to `rows` tokens
static void moe_layer_init(MoeLayer* m, const Config* c, int layer, Expert e, int rows) {
    int X = c->experts, k = c->top_k;
    memset(m, 0, sizeof *m);
    m->layer = layer, m->e = e, m->rows = rows;
    m->probs = mallocCheck((size_t)rows * X * sizeof(float));
    m->dprobs = mallocCheck((size_t)rows * X * sizeof(float));
    m->choice = mallocCheck((size_t)rows * k * sizeof(int));
    m->gate = mallocCheck((size_t)rows * k * sizeof(float));
    m->dgate = mallocCheck((size_t)rows * k * sizeof(float));
    m->slot = mallocCheck((size_t)rows * k * sizeof(int));
    m->mine = mallocCheck((size_t)k * X * sizeof(int));
    m->next = mallocCheck((size_t)k * X * sizeof(int));
    m->coef = callocCheck((size_t)X, sizeof(double));
    m->load_sum = callocCheck((size_t)X, sizeof(double));
}
static void moe_layer_free(MoeLayer* m) {
    free(m->probs), free(m->dprobs), free(m->choice), free(m->gate), free(m->dgate), free(m->slot), free(m->mine);
    free(m->coef), free(m->kept), free(m->send_rows), free(m->recv_rows), free(m->next), free(m->start);
    free(m->sent_row), free(m->sent), free(m->back), free(m->recv_in), free(m->recv_h), free(m->recv_saved);
    free(m->recv_d), free(m->recv_din), free(m->tmp), free(m->acc), free(m->load_sum), free(m->token), free(m->in);
}
// Buffers that depend on the layout and the routing: grown when a pass needs more (the
// first passes only).
static void moe_reserve(MoeLayer* m, const Config* c, int ranks, long n_sent, long n_recv) {
    int X = c->experts, k = c->top_k;
    long W = m->e.K > m->e.H ? m->e.K : m->e.H;
    if (m->ranks != ranks) {
        m->ranks = ranks;
        m->start = reallocCheck(m->start, (size_t)ranks * k * X * sizeof(long));
        m->kept = reallocCheck(m->kept, (size_t)ranks * X * sizeof(int));
        m->send_rows = reallocCheck(m->send_rows, (size_t)ranks * sizeof(int));
        m->recv_rows = reallocCheck(m->recv_rows, (size_t)ranks * sizeof(int));
    }
    if (n_sent > m->sent_cap) {
        m->sent_cap = n_sent;
        m->sent_row = reallocCheck(m->sent_row, (size_t)n_sent * sizeof(int));
        m->sent = reallocCheck(m->sent, (size_t)n_sent * W * sizeof(float));
        m->back = reallocCheck(m->back, (size_t)n_sent * W * sizeof(float));
    }
    if (n_recv > m->recv_cap) {
        m->recv_cap = n_recv;
        m->recv_in = reallocCheck(m->recv_in, (size_t)n_recv * W * sizeof(float));
        m->recv_h = reallocCheck(m->recv_h, (size_t)n_recv * W * sizeof(float));
        m->recv_saved = reallocCheck(m->recv_saved, (size_t)n_recv * m->e.saved * sizeof(float));
        m->recv_d = reallocCheck(m->recv_d, (size_t)n_recv * W * sizeof(float));
        m->recv_din = reallocCheck(m->recv_din, (size_t)n_recv * W * sizeof(float));
        m->tmp = reallocCheck(m->tmp, (size_t)n_recv * m->e.tmp * sizeof(float));
        m->acc = reallocCheck(m->acc, (size_t)n_recv * m->e.acc * sizeof(int64_t));
    }
}

// The router, on this rank's n tokens in [n][K]: p = softmax(in Wr) over the X experts,
// each token's top k (ties to the lower index) and their gates; and the counts of this
// rank's choices by slot and expert (m->mine), which the plan needs from every rank.
static void moe_route(const Config* c, MoeLayer* m, const float* in, const float* wr, int n, Workspace* ws) {
    int X = c->experts, k = c->top_k;
    double t = trace_clock();
    if (n > m->rows) fatal("internal: %d tokens for an MoE layer of %d", n, m->rows);
    m->n = n;
    matmul_float(m->probs, in, wr, n, m->e.K, X, ws);
    for (int r = 0; r < n; r++) {
        float *p = m->probs + (long)r * X, mx = p[0], sum = 0.0f;
        for (int x = 1; x < X; x++) mx = p[x] > mx ? p[x] : mx;
        for (int x = 0; x < X; x++) p[x] = expf(p[x] - mx), sum += p[x];
        for (int x = 0; x < X; x++) p[x] /= sum;
        int* ch = m->choice + (long)r * k;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int x = 0; x < X; x++)
                if ((j == 0 || x != ch[0]) && (best < 0 || p[x] > p[best])) best = x;
            ch[j] = best;
        }
        float* g = m->gate + (long)r * k;
        if (k == 1) g[0] = p[ch[0]];
        else {
            float s = p[ch[0]] + p[ch[1]];
            g[0] = p[ch[0]] / s, g[1] = p[ch[1]] / s;
        }
    }
    memset(m->mine, 0, (size_t)k * X * sizeof(int));
    for (int r = 0; r < n; r++)
        for (int j = 0; j < k; j++) m->mine[j * X + m->choice[(long)r * k + j]]++;
    trace_event("compute", t, trace_clock(), 0, "router %d", m->layer);
}

// The tokens of the whole batch, from every rank's counts of choices (counts[ranks][k][X]):
// each token makes one first choice. (The MLP's: its B rows; the GPT's: the positions its
// units route, a number that changes from batch to batch.)
static long moe_batch_tokens(const Config* c, const int* counts, int ranks) {
    long n = 0;
    for (int s = 0; s < ranks; s++)
        for (int x = 0; x < c->experts; x++) n += counts[(long)s * c->top_k * c->experts + x];
    return n;
}
// Each expert's capacity in a pass over a batch of n_total tokens: ceil(F k B / X) in
// training, no limit otherwise.
static long moe_capacity(const Config* c, long n_total, int training) {
    return training ? (long)ceil((double)c->capacity * c->top_k * n_total / c->experts) : LONG_MAX;
}

// The plan of a pass, from every rank's counts of choices (counts[ranks][k][X], all of them
// gathered): each token's place among all those that chose its expert, and so which are
// kept (place < C); how many tokens each rank sends each expert, and so the rows this rank
// sends to and receives from each rank; this rank's dispatch order.
static void moe_dispatch(const Config* c, MoeLayer* m, int rank, int n);
static void moe_plan(const Config* c, MoeLayer* m, const int* counts, int ranks, int rank, int n, long C) {
    int X = c->experts, k = c->top_k;
    moe_reserve(m, c, ranks, 0, 0);
    for (int x = 0; x < X; x++) { // places: by slot, then rank (that is, by token of the batch)
        long place = 0;
        for (int j = 0; j < k; j++)
            for (int s = 0; s < ranks; s++) {
                long i = ((long)s * k + j) * X + x;
                m->start[i] = place, place += counts[i];
            }
    }
    for (int s = 0; s < ranks; s++)
        for (int x = 0; x < X; x++) {
            long kept = 0;
            for (int j = 0; j < k; j++) {
                long i = ((long)s * k + j) * X + x, room = C - m->start[i];
                kept += room <= 0 ? 0 : room < counts[i] ? room : counts[i];
            }
            m->kept[(long)s * X + x] = (int)kept;
        }
    // this rank's tokens: kept or dropped
    int* seen = m->next; // [k][X] tokens of this rank met so far in each block
    memset(seen, 0, (size_t)k * X * sizeof(int));
    for (int j = 0; j < k; j++)
        for (int r = 0; r < n; r++) {
            int x = m->choice[(long)r * k + j];
            long place = m->start[((long)rank * k + j) * X + x] + seen[j * X + x]++;
            m->slot[(long)r * k + j] = place < C ? 0 : -1;
        }
    moe_dispatch(c, m, rank, n);
}
// The rest of a plan, once it says which of this rank's tokens' choices are kept (m->slot:
// 0 kept, -1 dropped) and how many tokens each of the m->ranks ranks sends each expert
// (m->kept, moe_reserve's): the rows this rank sends to and receives from each rank (the
// experts each holds: split_range), and its places in the dispatch order, by expert, then
// slot, then token. (moe_plan's places assume the ranks' tokens are contiguous ranges of
// the batch; train_3d.c's grid, whose ranks hold parts of rows, finds them itself.)
static void moe_dispatch(const Config* c, MoeLayer* m, int rank, int n) {
    int X = c->experts, k = c->top_k, ranks = m->ranks;
    long x_lo, x_hi;
    split_range(X, ranks, rank, &x_lo, &x_hi);
    m->n_sent = m->n_recv = 0;
    for (int q = 0; q < ranks; q++) {
        long lo, hi, to = 0, from = 0;
        split_range(X, ranks, q, &lo, &hi);
        for (long x = lo; x < hi; x++) to += m->kept[(long)rank * X + x];
        for (long x = x_lo; x < x_hi; x++) from += m->kept[(long)q * X + x];
        m->send_rows[q] = (int)to, m->recv_rows[q] = (int)from;
        m->n_sent += to, m->n_recv += from;
    }
    moe_reserve(m, c, ranks, m->n_sent, m->n_recv);
    int* at = m->next; // [X] each expert's next place in the dispatch order
    for (int x = 0, i = 0; x < X; x++) at[x] = i, i += m->kept[(long)rank * X + x];
    for (int j = 0; j < k; j++)
        for (int r = 0; r < n; r++) {
            int* slot = m->slot + (long)r * k + j;
            if (*slot < 0) continue;
            *slot = at[m->choice[(long)r * k + j]]++;
            m->sent_row[*slot] = r;
        }
}

// A training pass's load-balancing loss: each expert's coefficient alpha X f_x (from every
// rank's counts: counts[ranks][k][X] holds the batch's choices split by ranks in any way,
// or summed into one), the exact sum of this rank's tokens' terms added to *aux, and the
// load figures (`rank`: this rank's place in the plan).
static void moe_balance(const Config* c, MoeLayer* m, const int* counts, int ranks, int rank, int n, long n_total,
                        long C, int64_t* aux) {
    int X = c->experts, k = c->top_k;
    long dropped = 0;
    for (int x = 0; x < X; x++) {
        long chose = 0;
        for (int s = 0; s < ranks; s++)
            for (int j = 0; j < k; j++) chose += counts[((long)s * k + j) * X + x];
        m->coef[x] = (double)c->aux_loss * X * (double)chose / ((double)k * n_total);
        m->load_sum[x] += (double)chose;
        dropped += chose > C ? chose - C : 0;
    }
    m->dropped_sum += (double)dropped, m->dropped_last = dropped, m->capacity_last = C, m->steps++;
    m->tokens_sum += (double)n_total, m->mine_sum += (double)n;
    m->tokens_out += (double)(m->n_sent - m->send_rows[rank]), m->tokens_in += (double)(m->n_recv - m->recv_rows[rank]);
    for (int r = 0; r < n; r++) {
        double a = 0;
        for (int x = 0; x < X; x++) a += m->coef[x] * m->probs[(long)r * X + x];
        *aux += fix_term(a, n_total, "load-balancing loss");
    }
}

// The kept tokens' input rows, in the dispatch order: the rows to send
static void moe_permute(MoeLayer* m, const float* in) {
    int K = m->e.K;
    for (long i = 0; i < m->n_sent; i++) memcpy(m->sent + i * K, in + (long)m->sent_row[i] * K, K * sizeof(float));
}
// out [n][H]: each token's sum over its kept slots, in slot order, of gate x the expert's
// output (the rows come back in the dispatch order)
static void moe_unpermute(const Config* c, const MoeLayer* m, float* out, int n) {
    int k = c->top_k, H = m->e.H;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < H; i++) {
            float o = 0.0f;
            for (int j = 0; j < k; j++) {
                int slot = m->slot[(long)r * k + j];
                if (slot >= 0) o += m->gate[(long)r * k + j] * m->back[(long)slot * H + i];
            }
            out[(long)r * H + i] = o;
        }
}

// Backward of moe_unpermute, from dout [n][H]: the gates' gradients, dot(dout, h), and each
// kept token's output gradient, gate x dout, in the dispatch order (the rows to send).
static void moe_unpermute_backward(const Config* c, MoeLayer* m, const float* dout, int n) {
    int k = c->top_k, H = m->e.H;
    double t = trace_clock();
    for (int r = 0; r < n; r++)
        for (int j = 0; j < k; j++) {
            int slot = m->slot[(long)r * k + j];
            float d = 0.0f;
            if (slot >= 0)
                for (int i = 0; i < H; i++) d += dout[(long)r * H + i] * m->back[(long)slot * H + i];
            m->dgate[(long)r * k + j] = d;
        }
    for (long i = 0; i < m->n_sent; i++) {
        int r = m->sent_row[i], j = 0;
        while (m->slot[(long)r * k + j] != i) j++;
        for (int e = 0; e < H; e++) m->sent[i * H + e] = m->gate[(long)r * k + j] * dout[(long)r * H + e];
    }
    trace_event("compute", t, trace_clock(), 0, "gates %d", m->layer);
}
// Backward of the router, from the gates' gradients: gates -> probabilities (+ the aux
// loss's alpha X f_x) -> softmax -> scores; the router's exact weight gradient added into
// g, and its input gradient to din [n][K].
static void moe_router_backward(const Config* c, MoeLayer* m, const float* wr, int64_t* g, const float* in,
                                float* din, int n, long terms, Workspace* ws) {
    int X = c->experts, k = c->top_k;
    double t = trace_clock();
    for (int r = 0; r < n; r++) {
        const float *p = m->probs + (long)r * X, *gate = m->gate + (long)r * k, *dg = m->dgate + (long)r * k;
        const int* ch = m->choice + (long)r * k;
        float* dp = m->dprobs + (long)r * X;
        for (int x = 0; x < X; x++) dp[x] = (float)m->coef[x];
        if (k == 1) dp[ch[0]] += dg[0];
        else { // g_j = p_j / S over the two: dp_j = (dg_j - sum_i dg_i g_i) / S
            float s = p[ch[0]] + p[ch[1]], dot = dg[0] * gate[0] + dg[1] * gate[1];
            for (int j = 0; j < 2; j++) dp[ch[j]] += (dg[j] - dot) / s;
        }
        float dot = 0.0f; // softmax: ds_x = p_x (dp_x - sum_y p_y dp_y), in place
        for (int x = 0; x < X; x++) dot += p[x] * dp[x];
        for (int x = 0; x < X; x++) dp[x] = p[x] * (dp[x] - dot);
    }
    linear_backward_weight(g, NULL, in, m->dprobs, n, m->e.K, X, terms, ws);
    linear_backward_input(din, m->dprobs, wr, n, m->e.K, X, ws);
    trace_event("compute", t, trace_clock(), 0, "router backward %d", m->layer);
}
// Backward of moe_permute: each kept token's input gradient (back in the dispatch order)
// added to its row of din [n][K], in slot order
static void moe_permute_backward(const Config* c, const MoeLayer* m, float* din, int n) {
    int k = c->top_k, K = m->e.K;
    for (int r = 0; r < n; r++)
        for (int j = 0; j < k; j++) {
            int slot = m->slot[(long)r * k + j];
            if (slot >= 0)
                for (int i = 0; i < K; i++) din[(long)r * K + i] += m->back[(long)slot * K + i];
        }
}

// The layer on one process (train.c), in [n][K] -> out [n][H]: every expert is here, so the
// counts are all its own and dispatch and combine are copies (train_ep.c: all-to-alls). `wr`
// is the router's weight, `we` the experts' blocks; these n tokens are the whole batch;
// `training` applies the capacity and adds the tokens' load-balancing terms to *aux (an
// exact sum).
static void moe_forward(const Config* c, const float* wr, const float* we, MoeLayer* m, const float* in, float* out,
                        int n, int training, int64_t* aux, Workspace* ws) {
    const Expert* e = &m->e;
    moe_route(c, m, in, wr, n, ws);
    long n_total = moe_batch_tokens(c, m->mine, 1), C = moe_capacity(c, n_total, training);
    moe_plan(c, m, m->mine, 1, 0, n, C);
    if (training) moe_balance(c, m, m->mine, 1, 0, n, n_total, C, aux);
    moe_permute(m, in);
    memcpy(m->recv_in, m->sent, (size_t)m->n_sent * e->K * sizeof(float)); // dispatch
    double t = trace_clock();
    for (int x = 0, at = 0; x < c->experts; at += m->kept[x], x++)
        if (m->kept[x] > 0)
            expert_forward(e, m->recv_h + (long)at * e->H, m->recv_saved + (long)at * e->saved,
                           m->recv_in + (long)at * e->K, we + moe_expert_at(e, x, 0), m->kept[x], m->tmp, m->acc, ws);
    trace_event("compute", t, trace_clock(), 0, "experts %d", m->layer);
    memcpy(m->back, m->recv_h, (size_t)m->n_sent * e->H * sizeof(float)); // combine
    moe_unpermute(c, m, out, n);
}
// Its backward: from dout [n][H], the input gradient din [n][K], and the exact weight
// gradients of the router and of every expert added into gr and ge (laid out as wr and we);
// `terms`: tokens in the whole batch, or a bound on them alike in every layout.
static void moe_backward(const Config* c, const float* wr, const float* we, int64_t* gr, int64_t* ge, MoeLayer* m,
                         const float* in, const float* dout, float* din, int n, long terms, Workspace* ws) {
    const Expert* e = &m->e;
    moe_unpermute_backward(c, m, dout, n);
    memcpy(m->recv_d, m->sent, (size_t)m->n_sent * e->H * sizeof(float)); // dispatch (backward)
    double t = trace_clock();
    for (int x = 0, at = 0; x < c->experts; at += m->kept[x], x++)
        if (m->kept[x] > 0) {
            long off = moe_expert_at(e, x, 0);
            expert_backward(e, m->recv_din + (long)at * e->K, ge + off, m->recv_d + (long)at * e->H,
                            m->recv_in + (long)at * e->K, m->recv_h + (long)at * e->H,
                            m->recv_saved + (long)at * e->saved, we + off, m->kept[x], terms, m->tmp, m->acc, ws);
        }
    trace_event("compute", t, trace_clock(), 0, "experts backward %d", m->layer);
    memcpy(m->back, m->recv_din, (size_t)m->n_sent * e->K * sizeof(float)); // combine (backward)
    moe_router_backward(c, m, wr, gr, in, din, n, terms, ws);
    moe_permute_backward(c, m, din, n);
}

// ----------------------------------------------------------------------------
// parameters: layout and initialisation
//
// All parameters live in one float allocation, unit after unit: the embedding [V][E], then
// for each linear layer its weight [K][J] followed by its bias [J]; unit u starts at
// unit_offset(u). Gradients (exact sums, int64) and optimizer state use the same layout,
// so the optimizer, an all-reduce and an FSDP shard are each one loop over one flat range,
// and a unit, the piece that pipeline stages and FSDP move around, is one contiguous block.

// Tensors are numbered 0 (embedding), 2l-1 (weight of linear l), 2l (its bias).
// Initial value of element `index` (row-major, in the unpadded shape) of tensor `tensor`:
// a pure function of (seed, tensor, index), so a rank holding any slice or shard computes
// exactly the values train.c uses without building the rest.
//
// The choice: the embedding from N(0, 1), every linear weight and bias uniform in
// +-1/sqrt(K), PyTorch's defaults for nn.Embedding and nn.Linear. Measured (validation
// loss; seeds 42 and 7 unless noted), with init_value patched for each alternative:
//   default model, 25,000 steps:         this 2.156 / 2.151;  +-1/K 2.162 / 2.152;
//                                         He normal, zero bias 2.166 / 2.153
//   --hidden 512 --layers 3, 5,000 steps: this 2.214 / 2.195;  +-1/K 2.585 / 2.569;
//                                         He normal, zero bias 2.165 / 2.138
//   --hidden 128 --layers 2, 25,000:      this 2.109;  He normal, zero bias 2.125
// Bounds of +-1/K shrink the activations layer after layer and fail on deeper models;
// He initialisation and PyTorch's are within noise of each other, and PyTorch's is what
// users compare against.
static float init_value(const Config* c, uint64_t seed, int tensor, long index) {
    uint64_t stream = ((uint64_t)STREAM_INIT << 32) | (uint64_t)tensor;
    if (tensor == 0) return (float)rng_normal(seed, stream, (uint64_t)index);
    double bound = 1.0 / sqrt((double)linear_in(c, (tensor + 1) / 2));
    return (float)((2.0 * rng_uniform(seed, stream, (uint64_t)index) - 1.0) * bound);
}

// An MoE layer: its router has tensor number 2l-1 (its dense weight's), expert x's weight
// and bias 2l-1 and 2l plus (x+1) * 2^16; all uniform in +-1/sqrt(K), like nn.Linear's.
static float moe_init_value(const Config* c, uint64_t seed, int u, long e) {
    long nr = router_params(c, u), ne = expert_params(c, u), nw = (long)linear_in(c, u) * c->hidden;
    int tensor = 2 * u - 1;
    if (e >= nr) {
        long x = (e - nr) / ne, i = (e - nr) % ne;
        tensor += (int)((x + 1) << 16) + (i >= nw);
        e = i >= nw ? i - nw : i;
    }
    uint64_t stream = ((uint64_t)STREAM_INIT << 32) | (uint64_t)tensor;
    return (float)((2.0 * rng_uniform(seed, stream, (uint64_t)e) - 1.0) / sqrt((double)linear_in(c, u)));
}

// The GPT's parameters, unit by unit: the embedding wte [V][C] then wpe [T][C]; each block
// as transformer.h's block_layout says; the head lm_head [C][V] then ln_f's gain and bias [C].
static BlockDims gpt_dims(const Config* c, int R) {
    return (BlockDims){.R = R, .Tq = c->context, .T = c->context, .C = c->emb, .NH = c->heads,
                       .HD = c->emb / c->heads, .A = c->emb, .F = 4 * c->emb, .pos = NULL};
}
// Block u's: a block with experts has no MLP of its own (F = 0): its experts are the MLP
static BlockDims gpt_block_dims(const Config* c, int u, int R) {
    BlockDims d = gpt_dims(c, R);
    if (is_moe(c, u)) d.F = 0;
    return d;
}
// With --experts a block is transformer.h's moe_block_layout instead.
static MoeBlockLayout gpt_moe_layout(const Config* c) {
    return moe_block_layout(c->emb, c->emb, 4 * c->emb, c->experts);
}
static long gpt_unit_params(const Config* c, int u) {
    long C = c->emb;
    if (u == 0) return (c->vocab + (long)c->context) * C;
    if (u <= c->layers) return is_moe(c, u) ? gpt_moe_layout(c).n : block_layout(c->emb, c->emb, 4 * c->emb).n;
    return C * c->vocab + 2 * C;
}
// Initial values, PyTorch's defaults as makemore uses them: both embeddings N(0, 1), every
// linear weight and bias uniform in +-1/sqrt(fan in), LayerNorm gains 1 and biases 0.
// Tensor k of unit u (in its layout's order) has tensor number 2^30 + 256 u + k. A block
// with experts numbers its tensors as the dense block does (its attention and LayerNorms
// start as the dense GPT's), its router k = 12, and expert x's fc_w, fc_b, fc2_w and fc2_b
// the dense k of those, plus (x + 1) 2^16 (above 256 u + 12 for 32 blocks, and below 2^30
// for 1024 experts: every number distinct).
static float gpt_init_value(const Config* c, uint64_t seed, int u, long e) {
    long C = c->emb, F = 4 * C;
    int k = 0;          // which tensor of the unit
    long fan_in = 0;    // 0: N(0, 1); -1: 1; -2: 0; else uniform in +-1/sqrt(fan_in)
    if (u == 0) {
        k = e >= c->vocab * C;
        e -= k ? c->vocab * C : 0;
    } else if (is_moe(c, u)) {
        MoeBlockLayout l = gpt_moe_layout(c);
        MlpLayout m = mlp_layout(c->emb, 4 * c->emb);
        const long start[] = {l.qkv_w, l.qkv_b, l.proj_w, l.ln1_g, l.ln1_b, l.proj_b, l.ln2_g, l.ln2_b, l.router_w,
                              l.shared}, expert[] = {m.fc_w, m.fc_b, m.fc2_w, m.fc2_b, m.n};
        const int ks[] = {0, 1, 2, 6, 7, 8, 9, 10, 12}, expert_ks[] = {3, 4, 5, 11};
        const long fans[] = {C, C, C, -1, -2, C, -1, -2, C}, expert_fans[] = {C, C, F, F};
        int i = 0;
        if (e < l.shared) {
            while (e >= start[i + 1]) i++;
            e -= start[i], k = ks[i], fan_in = fans[i];
        } else {
            long x = (e - l.shared) / l.expert;
            e = (e - l.shared) % l.expert;
            while (e >= expert[i + 1]) i++;
            e -= expert[i], k = expert_ks[i] + (int)((x + 1) << 16), fan_in = expert_fans[i];
        }
    } else if (u <= c->layers) {
        BlockLayout l = block_layout(c->emb, c->emb, 4 * c->emb);
        const long start[] = {l.qkv_w, l.qkv_b, l.proj_w, l.fc_w, l.fc_b, l.fc2_w, l.ln1_g, l.ln1_b, l.proj_b,
                              l.ln2_g, l.ln2_b, l.fc2_b, l.n};
        const long fans[] = {C, C, C, C, C, F, -1, -2, C, -1, -2, F};
        while (e >= start[k + 1]) k++;
        e -= start[k], fan_in = fans[k];
    } else {
        k = e < C * c->vocab ? 0 : e < C * c->vocab + C ? 1 : 2;
        fan_in = k == 0 ? C : k == 1 ? -1 : -2;
    }
    if (fan_in == -1) return 1.0f;
    if (fan_in == -2) return 0.0f;
    uint64_t stream = ((uint64_t)STREAM_INIT << 32) | (uint64_t)((1u << 30) + 256u * (unsigned)u + (unsigned)k);
    if (fan_in == 0) return (float)rng_normal(seed, stream, (uint64_t)e);
    return (float)((2.0 * rng_uniform(seed, stream, (uint64_t)e) - 1.0) / sqrt((double)fan_in));
}

// Initial value of element e of unit u's parameters (its weight, then its bias)
static float unit_init_value(const Config* c, uint64_t seed, int u, long e) {
    if (is_gpt(c)) return gpt_init_value(c, seed, u, e);
    if (u == 0) return init_value(c, seed, 0, e);
    if (is_moe(c, u)) return moe_init_value(c, seed, u, e);
    long nw = (long)linear_in(c, u) * linear_out(c, u);
    return e < nw ? init_value(c, seed, 2 * u - 1, e) : init_value(c, seed, 2 * u, e - nw);
}

// ----------------------------------------------------------------------------
// activations, and what a pass works in

typedef struct {
    int rows;                   // capacity
    int* tokens;                // [rows][T]
    int* targets;               // [rows][targets_per_row]: a token, or -1 for none (the GPT's padding)
    float* out[MAX_LAYERS + 2]; // out[u]: unit u's output [rows][unit_width(u)]; out[L+1] holds the probs
    float* saved[MAX_LAYERS + 2]; // the GPT: what unit u keeps for its backward besides its output
    int head_tokens;            // the GPT: positions a row of the head's LayerNorm keeps in saved
    float* rowmax;              // [rows][targets_per_row] softmax workspace
    float* tlogit;              // [rows][targets_per_row]
    int64_t* expsum;            // [rows][targets_per_row]
    int64_t loss;               // exact sum of the row losses of the last forward
    // with --experts
    MoeLayer* moe;              // [L+2]: the state of each MoE unit held here, else NULL
    int training;               // this pass is a training batch: capacity and the aux loss apply
    int64_t aux;                // exact sum of the rows' load-balancing terms of the last forward
} Acts;

// What unit u of the GPT keeps per row besides its output: a block's BlockActs, the head's
// LayerNorm output and statistics; the embedding nothing.
// (A block with experts keeps its attention half's: its experts keep their own, in its MoeLayer.)
static long gpt_saved_per_row(const Config* c, int u) {
    if (u == 0 || !is_gpt(c)) return 0;
    BlockDims d = gpt_block_dims(c, u, 1);
    return u <= c->layers ? block_acts_per_row(&d) : (long)c->context * (c->emb + 2);
}
// What a rank's units hold per row when it holds less than the whole model does (a
// tensor-parallel slice of the heads or of F, a context-parallel share of the positions,
// sequence parallelism's share of the tokens): each unit's output, what it keeps for its
// backward, and what its input half leaves for its weight half (a pipeline's stash), in
// floats. NULL where a program takes these: the whole model's.
typedef struct {
    int out[MAX_LAYERS + 2];
    long saved[MAX_LAYERS + 2];
    long stash[MAX_LAYERS + 2];
} UnitSizes;
static int unit_out(const Config* c, const UnitSizes* sz, int u) { return sz ? sz->out[u] : unit_width(c, u); }
static long unit_saved(const Config* c, const UnitSizes* sz, int u) { return sz ? sz->saved[u] : gpt_saved_per_row(c, u); }
// Activations of units [u_lo, u_hi) and of the input to u_lo (a pipeline stage keeps only
// its own); pass 0, n_units for the whole model, and sz as above.
static void acts_init(Acts* a, const Config* c, int rows, int u_lo, int u_hi, const UnitSizes* sz) {
    memset(a, 0, sizeof(*a));
    a->rows = rows;
    int per_row = targets_per_row(c);
    a->tokens = mallocCheck((size_t)rows * c->context * sizeof(int));
    a->targets = mallocCheck((size_t)rows * per_row * sizeof(int));
    for (int u = (u_lo > 0 ? u_lo - 1 : 0); u < u_hi; u++) a->out[u] = mallocCheck((size_t)rows * unit_out(c, sz, u) * sizeof(float));
    for (int u = u_lo; u < u_hi; u++)
        if (unit_saved(c, sz, u) > 0) a->saved[u] = mallocCheck((size_t)rows * unit_saved(c, sz, u) * sizeof(float));
    if (is_gpt(c)) a->head_tokens = (int)(unit_saved(c, sz, c->layers + 1) / (c->emb + 2));
    a->rowmax = mallocCheck((size_t)rows * per_row * sizeof(float));
    a->tlogit = mallocCheck((size_t)rows * per_row * sizeof(float));
    a->expsum = mallocCheck((size_t)rows * per_row * sizeof(int64_t));
    if (c->experts > 0) {
        a->moe = callocCheck(MAX_LAYERS + 2, sizeof(MoeLayer));
        for (int u = u_lo; u < u_hi; u++)
            if (is_moe(c, u)) {
                MoeLayer* m = &a->moe[u];
                moe_layer_init(m, c, u, moe_expert(c, u), rows * moe_tokens_per_row(c));
                if (is_gpt(c)) { // the unit's gather of its tokens (gpt_moe_tokens)
                    m->token = mallocCheck((size_t)m->rows * sizeof(int));
                    m->in = mallocCheck((size_t)m->rows * c->emb * sizeof(float));
                }
            }
    }
}
static void acts_free(Acts* a) {
    free(a->tokens);
    free(a->targets);
    for (int u = 0; u < MAX_LAYERS + 2; u++) free(a->out[u]), free(a->saved[u]);
    free(a->rowmax);
    free(a->tlogit);
    free(a->expsum);
    for (int u = 0; a->moe && u < MAX_LAYERS + 2; u++)
        if (a->moe[u].rows) moe_layer_free(&a->moe[u]);
    free(a->moe);
}
// bytes of activations held per row for units [u_lo, u_hi) (sz: as for acts_init)
static long acts_bytes_per_row(const Config* c, int u_lo, int u_hi, const UnitSizes* sz) {
    long b = (long)c->context * sizeof(int) + (long)targets_per_row(c) * sizeof(int);
    for (int u = (u_lo > 0 ? u_lo - 1 : 0); u < u_hi; u++) b += (long)unit_out(c, sz, u) * sizeof(float);
    for (int u = u_lo; u < u_hi; u++) b += unit_saved(c, sz, u) * (long)sizeof(float);
    for (int u = u_lo; u < u_hi; u++) // an MoE unit's router state, and its k tokens' rows both
        if (is_moe(c, u)) {           // sent and (with an even load) received, with their gradients
            Expert e = moe_expert(c, u);   // and what the experts keep; the GPT's gather besides
            long W = e.K > e.H ? e.K : e.H, k = c->top_k;
            long token = 2L * c->experts + 4 * k + k * (6 * W + e.saved) + (is_gpt(c) ? 1 + e.K : 0);
            b += moe_tokens_per_row(c) * token * 4;
        }
    return b;
}

// Scratch for a pass: the gradients flowing between units, exact partial sums, and (the
// GPT) what a unit's input half of backward leaves for its weight half, and a block's
// temporaries.
typedef struct {
    float* dout;  // [rows][max_width] gradient with respect to the current unit's output
    float* din;   // [rows][max_width] gradient with respect to its input
    int64_t* acc; // exact partial sums
    float* stash; // the GPT: [rows][gpt_stash_per_row] (unit_stash)
    float* tmp;   // the GPT: a block's temporaries
} Scratch;
// The GPT: what the weight half of unit u's backward reads, per row: a block's BlockStash,
// the head's gradients of its logits and of its LayerNorm's output.
static long gpt_stash_per_row(const Config* c, int u) {
    if (u == 0 || !is_gpt(c)) return 0;
    BlockDims d = gpt_block_dims(c, u, 1);
    return u <= c->layers ? block_stash_per_row(&d) : (long)c->context * (c->vocab + c->emb);
}
static void scratch_init(Scratch* s, const Config* c, int rows) {
    long acc = (long)rows * max_width(c), stash = 1, tmp = 1;
    if (is_gpt(c)) {
        BlockDims d = gpt_dims(c, rows);
        acc = block_scratch_int64s(&d, rows) > acc ? block_scratch_int64s(&d, rows) : acc;
        tmp = block_scratch_floats(&d, rows);
        for (int u = 1; u < n_units(c); u++) stash = rows * gpt_stash_per_row(c, u) > stash ? rows * gpt_stash_per_row(c, u) : stash;
    }
    s->dout = mallocCheck((size_t)rows * max_width(c) * sizeof(float));
    s->din = mallocCheck((size_t)rows * max_width(c) * sizeof(float));
    s->acc = mallocCheck((size_t)acc * sizeof(int64_t));
    s->stash = mallocCheck((size_t)stash * sizeof(float));
    s->tmp = mallocCheck((size_t)tmp * sizeof(float));
}
static void scratch_free(Scratch* s) {
    free(s->dout);
    free(s->din);
    free(s->acc);
    free(s->stash);
    free(s->tmp);
}
// After a unit's backward: its input gradient is the output gradient of the unit below.
static void scratch_step_down(Scratch* s) {
    float* t = s->dout;
    s->dout = s->din;
    s->din = t;
}

// What a forward and backward pass of up to `rows` rows works in.
typedef struct {
    Acts acts;
    Scratch scratch;
    Workspace ws;
} Work;
static void work_init(Work* w, const Config* c, int rows, const UnitSizes* sz) {
    acts_init(&w->acts, c, rows, 0, n_units(c), sz);
    scratch_init(&w->scratch, c, rows);
    workspace_init(&w->ws, rows, max_width(c), max_linear_weight(c));
}
// Loads rows [first, first + R) of a source into the activations' tokens and targets.
static Acts* work_load(Work* w, const Rows* rows, long first, int R, int T) {
    rows_load(rows, first, R, T, w->acts.tokens, w->acts.targets);
    return &w->acts;
}
static void work_free(Work* w) {
    acts_free(&w->acts);
    scratch_free(&w->scratch);
    workspace_free(&w->ws);
}

// ----------------------------------------------------------------------------
// the GPT's units: the embedding, a block, the head (their layers: transformer.h)

// The head over the tokens of d (R rows of its Tq positions): ln_f, lm_head (column-parallel:
// by vocabulary), the loss, the exact sum over the tokens' valid targets [R][Tq]. Its
// LayerNorm's output and statistics are kept in a->saved (`rows` rows of head_tokens positions).
static float* gpt_head_saved(const Config* c, const Acts* a, int which) { // 0 ln_f's output, 1 mean, 2 rstd
    long n = (long)a->rows * a->head_tokens;
    return a->saved[c->layers + 1] + (which == 0 ? 0 : n * c->emb + (which - 1) * n);
}
static int64_t gpt_head_forward(const Config* c, const float* w, Acts* a, const int* targets, const BlockDims* d,
                                long rows_total, Workspace* ws) {
    int C = c->emb, V = c->vocab, u = c->layers + 1;
    long N = (long)d->R * d->Tq;
    float *ln = gpt_head_saved(c, a, 0), *mean = gpt_head_saved(c, a, 1), *rstd = gpt_head_saved(c, a, 2);
    layernorm_forward(ln, mean, rstd, a->out[u - 1], w + (long)C * V, w + (long)C * V + C, N, C);
    linear_forward(a->out[u], ln, w, NULL, (int)N, C, V, ws); // lm_head: column-parallel (by vocabulary)
    return xent_forward(a->out[u], a->expsum, a->rowmax, a->tlogit, targets, (int)N, V, rows_total * c->context);
}
// The input half: from the loss to s->din, leaving in `stash` the logits' and ln_f's output
// gradients for the weight half.
static void gpt_head_backward_input(const Config* c, const float* w, Acts* a, const int* targets, Scratch* s,
                                    float* stash, const BlockDims* d, Workspace* ws) {
    int C = c->emb, V = c->vocab, u = c->layers + 1;
    long N = (long)d->R * d->Tq;
    float *dlogits = stash, *dln = stash + N * V;
    xent_backward(dlogits, a->out[u], targets, (int)N, V, 0);
    linear_backward_input_exact(dln, s->acc, dlogits, w, (int)N, C, V, ws); // column-parallel: exact
    layernorm_backward_input(s->din, NULL, dln, a->out[u - 1], gpt_head_saved(c, a, 1), gpt_head_saved(c, a, 2),
                             w + (long)C * V, N, C);
}
static void gpt_head_backward_weight(const Config* c, int64_t* g, const Acts* a, const float* stash,
                                     const BlockDims* d, long terms, Workspace* ws) {
    int C = c->emb, V = c->vocab, u = c->layers + 1;
    long N = (long)d->R * d->Tq;
    const float *dlogits = stash, *dln = stash + N * V;
    linear_backward_weight(g, NULL, gpt_head_saved(c, a, 0), dlogits, (int)N, C, V, terms, ws);
    layernorm_backward_params(g + (long)C * V, g + (long)C * V + C, dln, a->out[u - 1], gpt_head_saved(c, a, 1),
                              gpt_head_saved(c, a, 2), N, C, terms);
}

// Forward of unit u over R rows: x = wte + wpe; a block; or the head and the loss.
static void gpt_unit_forward(const Config* c, int u, const float* w, Acts* a, Scratch* s, int R, long rows_total,
                             Workspace* ws) {
    BlockDims d = gpt_dims(c, R);
    if (u == 0) {
        gpt_embedding_forward(a->out[0], a->tokens, w, w + (long)c->vocab * c->emb, 0, c->vocab, 1, &d);
    } else if (u <= c->layers) {
        BlockParams p = block_params(w, &d);
        BlockActs ba = block_acts(a->saved[u], &d, a->rows);
        block_forward(a->out[u], a->out[u - 1], &p, &ba, &d, s->tmp, s->acc, ws);
    } else {
        a->loss = gpt_head_forward(c, w, a, a->targets, &d, rows_total, ws);
    }
}
// Backward, the input half: from s->dout (the head: from the loss) to s->din, leaving in
// s->stash what the weight half needs (the embedding has no input half).
static void gpt_unit_backward_input(const Config* c, int u, const float* w, Acts* a, Scratch* s, int R,
                                    Workspace* ws) {
    BlockDims d = gpt_dims(c, R);
    if (u == 0) return;
    if (u <= c->layers) {
        BlockParams p = block_params(w, &d);
        BlockActs ba = block_acts(a->saved[u], &d, a->rows);
        BlockStash st = block_stash(s->stash, &d, R);
        block_backward_input(s->din, s->dout, a->out[u - 1], &p, &ba, &st, &d, s->tmp, s->acc, ws);
    } else {
        gpt_head_backward_input(c, w, a, a->targets, s, s->stash, &d, ws);
    }
}
// The weight half: unit u's parameter gradients added into g, exact sums over the tokens of
// the whole batch (`batch` rows of T), from its activations and what the input half left
// (`stash`: the embedding's is the gradient of its output).
static void gpt_unit_backward_weight(const Config* c, int u, int64_t* g, const Acts* a, const float* stash, int R,
                                     long batch, Workspace* ws) {
    BlockDims d = gpt_dims(c, R);
    long terms = batch * c->context;
    if (u == 0) {
        gpt_embedding_backward(g, g + (long)c->vocab * c->emb, a->tokens, stash, 0, c->vocab, &d, terms);
    } else if (u <= c->layers) {
        BlockGrads gg = block_grads(g, &d);
        BlockActs ba = block_acts(a->saved[u], &d, a->rows);
        BlockStash st = block_stash((float*)stash, &d, R);
        block_backward_weight(&gg, a->out[u - 1], &ba, &st, &d, terms, ws);
    } else {
        gpt_head_backward_weight(c, g, a, stash, &d, terms, ws);
    }
}

// ----------------------------------------------------------------------------
// a unit with a mixture of experts
//
// The layer ("mixture of experts" above: moe_forward on one process, train_ep.c's steps with
// their all-to-alls) maps its tokens' rows of K floats to rows of H floats. The unit around
// it says which tokens, and does the rest:
//  - the MLP's hidden layer l: the tokens are the pass's rows, in = out[l-1], out = out[l];
//    nothing before or after.
//  - the GPT's block: before the layer, the attention half and ln2 (the dense block's ops:
//    x1 = x + proj(attention(ln1(x))), ln2(x1)); the tokens are positions, their rows of
//    ln2's output gathered; after it, out = the layer's output + x1 at each token, x1 alone
//    at any other position. Backward the other way round.
// The GPT's tokens (gpt_moe_tokens): in a training pass, the positions with a target only.
// Padding (the positions after a name's stop token) changes no loss: attention looks back
// only, and padding comes after a row's last target. Routed, it would take a share of each
// expert's capacity from the names, and of the load-balancing loss; unrouted, the batch's
// tokens are the n targets the loss is the mean over, so the load-balancing loss's P_x is
// a mean over the same tokens and the training step divides both alike. Validation and
// sampling have no capacity and no load-balancing loss, and route every position
// (sampling's rows carry no targets): a token's output is its own row's (an expert's output
// is one row of a matmul, the same bits whichever tokens share the call), so a position
// with a target gets the same bits either way. Every layout decides from the targets
// alone, and numbers the tokens alike (rows in order, then positions): the same tokens in
// the same order, so the capacity keeps the same ones.

// Where the router's weight starts among the unit's parameters, and the first expert's
// (after every shared parameter: moe_shared_params)
static long moe_router_at(const Config* c) { return is_gpt(c) ? gpt_moe_layout(c).router_w : 0; }

// The GPT's tokens in a pass of d->R rows of the d->Tq positions held here (all T; a
// context-parallel rank's share in train_3d.c): rows r Tq + i of the block's tensors, in
// order, into m->token; their count
static int gpt_moe_tokens(const Config* c, MoeLayer* m, const Acts* a, const BlockDims* d) {
    int n = 0;
    for (int r = 0; r < d->R; r++)
        for (int i = 0; i < d->Tq; i++)
            if (!a->training || a->targets[(long)r * c->context + dims_pos(d, i)] >= 0) m->token[n++] = r * d->Tq + i;
    return n;
}
// The tokens' rows of x [R Tq][C] into rows [n][C]; the reverse, zeros at other positions
static void gpt_moe_gather(float* rows, const MoeLayer* m, const float* x, int C) {
    for (int i = 0; i < m->n; i++) memcpy(rows + (long)i * C, x + (long)m->token[i] * C, C * sizeof(float));
}
static void gpt_moe_scatter(float* x, const MoeLayer* m, const float* rows, long N, int C) {
    memset(x, 0, (size_t)N * C * sizeof(float));
    for (int i = 0; i < m->n; i++) memcpy(x + (long)m->token[i] * C, rows + (long)i * C, C * sizeof(float));
}
// The residual after the layer: out [N][C] = the layer's output h [n][C] + x1 at each token,
// x1 alone at any other position
static void gpt_moe_residual(float* out, const float* x1, const MoeLayer* m, const float* h, long N, int C) {
    memcpy(out, x1, (size_t)N * C * sizeof(float));
    for (int i = 0; i < m->n; i++) {
        float *o = out + (long)m->token[i] * C;
        const float* hi = h + (long)i * C;
        for (int j = 0; j < C; j++) o[j] = hi[j] + o[j];
    }
}

// Forward, before the layer: the unit's own ops, then the layer's tokens: returns their
// count, their input rows [n][K] in *in, and where the layer writes their outputs [n][H]
// in *out (the GPT's: s->tmp, which the ops after attention leave free).
static int moe_unit_before(const Config* c, int u, const float* w, Acts* a, Scratch* s, int R, const float** in,
                           float** out, Workspace* ws) {
    if (!is_gpt(c)) {
        *in = a->out[u - 1], *out = a->out[u];
        return R;
    }
    MoeLayer* m = &a->moe[u];
    MoeBlockLayout l = gpt_moe_layout(c);
    BlockDims d = gpt_block_dims(c, u, R);
    BlockParams p = moe_block_params(w, &l);
    BlockActs ba = block_acts(a->saved[u], &d, a->rows);
    block_forward_qkv(a->out[u - 1], &p, &ba, &d, ws);
    attention_forward(ba.atty, ba.att, ba.qkv, &d, s->tmp, s->acc);                       // causal, exact over keys
    block_forward_proj(a->out[u - 1], &p, &ba, &d, s->acc, ws);                           // x1, and ln2
    m->n = gpt_moe_tokens(c, m, a, &d);
    gpt_moe_gather(m->in, m, ba.ln2, c->emb);
    *in = m->in, *out = s->tmp;
    return m->n;
}
// After the layer: the GPT's residual, the layer's output at each token added to x1
static void moe_unit_after(const Config* c, int u, Acts* a, Scratch* s, int R) {
    if (!is_gpt(c)) return;
    BlockDims d = gpt_block_dims(c, u, R);
    BlockActs ba = block_acts(a->saved[u], &d, a->rows);
    gpt_moe_residual(a->out[u], ba.x1, &a->moe[u], s->tmp, (long)R * c->context, c->emb);
}
// Backward, before the layer: its tokens' input rows [n][K] (*in), their output gradients
// [n][H] (*dout: the GPT's gathered into s->tmp), and where the layer writes their input
// gradients [n][K] (*din: s->din, which the unit's input gradient overwrites only at the end)
static void moe_unit_backward_before(const Config* c, int u, Acts* a, Scratch* s, const float** in,
                                     const float** dout, float** din) {
    MoeLayer* m = &a->moe[u];
    *din = s->din;
    if (!is_gpt(c)) {
        *in = a->out[u - 1], *dout = s->dout;
        return;
    }
    gpt_moe_gather(s->tmp, m, s->dout, c->emb);
    *in = m->in, *dout = s->tmp;
}
// After it: the GPT's ops before the layer, backward, from the tokens' input gradients in
// s->din to the unit's input gradient in s->din, their parameters' gradients added into g
// (the layer's own are added by its backward). `terms`: tokens in the whole batch.
static void moe_unit_backward_after(const Config* c, int u, const float* w, int64_t* g, Acts* a, Scratch* s, int R,
                                    long terms, Workspace* ws) {
    if (!is_gpt(c)) return;
    const MoeLayer* m = &a->moe[u];
    MoeBlockLayout l = gpt_moe_layout(c);
    BlockDims d = gpt_block_dims(c, u, R);
    BlockParams p = moe_block_params(w, &l);
    BlockGrads gg = moe_block_grads(g, &l);
    BlockActs ba = block_acts(a->saved[u], &d, a->rows);
    BlockStash st = block_stash(s->stash, &d, R);
    long N = (long)R * c->context;
    gpt_moe_scatter(st.dln2, m, s->din, N, c->emb); // ln2's output gradient: the tokens' from the layer, 0 elsewhere
    float *datty = s->tmp, *small = s->tmp + N * d.A;
    block_backward_proj(datty, s->dout, &p, &ba, &st, &d, ws);                            // ln2 (+ the residual), proj
    attention_backward(st.dqkv, datty, ba.qkv, ba.att, ba.atty, &d, small, s->acc);       // exact over keys, queries
    block_backward_qkv(s->din, a->out[u - 1], &p, &ba, &st, &d, s->acc, ws);
    block_backward_weight_attention(&gg, a->out[u - 1], &ba, &st, &d, terms, ws);
}

// ----------------------------------------------------------------------------
// the model as a list of units

// What the weight half of unit u's backward reads (see unit_backward_weight), and its width
// per row: for the MLP and the GPT's embedding the gradient of the unit's output as the
// input half left it; for the GPT's blocks and head the stash.
static float* unit_stash(const Config* c, int u, Scratch* s) { return is_gpt(c) && u > 0 ? s->stash : s->dout; }
static long unit_stash_width(const Config* c, int u) {
    return is_gpt(c) && u > 0 ? gpt_stash_per_row(c, u) : unit_width(c, u);
}
static long unit_stash_at(const Config* c, const UnitSizes* sz, int u) { return sz ? sz->stash[u] : unit_stash_width(c, u); }
// The GPT's UnitSizes on a rank whose blocks are d (its heads and slice of F at Tq of each
// row's positions), whose head holds vs of the vocabulary's logits, and whose per-token
// tensors (the residual stream, the LayerNorms) hold h positions a row: Tq, or with
// sequence parallelism its share.
static void gpt_unit_sizes(const Config* c, const BlockDims* d, int vs, int h, UnitSizes* sz) {
    int C = c->emb, head = c->layers + 1;
    for (int u = 0; u < head; u++) {
        BlockDims b = *d;
        if (is_moe(c, u)) b.F = 0; // its experts keep their own activations, in its MoeLayer
        sz->out[u] = h * C;
        sz->saved[u] = u == 0 ? 0 : block_acts_held(&b, h);
        sz->stash[u] = u == 0 ? sz->out[0] : block_stash_per_row(&b);
    }
    sz->out[head] = d->Tq * vs, sz->saved[head] = (long)h * (C + 2), sz->stash[head] = (long)d->Tq * vs + (long)h * C;
}

// The work of unit u per row, in multiply-adds (a pipeline balances its stages by it): the
// MLP's embedding T E (copies), a linear layer K J; the GPT's embedding T C, a block T (12 C^2
// + 2 T C) (its four matrix products and attention's two), the head T C V.
static double unit_cost(const Config* c, int u) {
    double T = c->context, C = c->emb;
    if (is_gpt(c)) return u == 0 ? T * C : u <= c->layers ? T * (12 * C * C + 2 * T * C) : T * C * c->vocab;
    return u == 0 ? (double)c->context * c->emb : (double)linear_in(c, u) * linear_out(c, u);
}

// The model's units in words, for messages: "the embedding and 3 linear layers", or the
// GPT's "the embedding, 4 blocks and the head".
static const char* units_in_words(const Config* c) {
    static char words[64];
    if (is_gpt(c)) snprintf(words, sizeof words, "the embedding, %d blocks and the head", c->layers);
    else snprintf(words, sizeof words, "the embedding and %d linear layers", c->layers + 1);
    return words;
}
// The name of unit u, for traces and tables.
static const char* unit_name(const Config* c, int u) {
    static char name[32];
    if (u == 0) return "embedding";
    if (is_gpt(c)) {
        snprintf(name, sizeof name, u == c->layers + 1 ? "head + loss" : "block %d", u);
        return name;
    }
    snprintf(name, sizeof name, u == c->layers + 1 ? "linear %d + loss" : is_moe(c, u) ? "experts %d" : "linear %d", u);
    return name;
}

// Forward of unit u over R rows: reads a->out[u-1] (a->tokens for the embedding), writes
// a->out[u] (for the last unit the probabilities, and a->loss). `w` points at the unit's
// parameters; `rows_total` is the number of rows whose losses are summed (the global batch).
static void unit_forward(const Config* c, int u, const float* w, Acts* a, Scratch* s, int R, long rows_total,
                         Workspace* ws) {
    double t = trace_clock();
    if (is_moe(c, u)) { // the unit's ops before its layer of experts, the layer, the ops after
        const float* in;
        float* out;
        int n = moe_unit_before(c, u, w, a, s, R, &in, &out, ws);
        moe_forward(c, w + moe_router_at(c), w + moe_shared_params(c, u), &a->moe[u], in, out, n, a->training, &a->aux,
                    ws);
        moe_unit_after(c, u, a, s, R);
    } else if (is_gpt(c)) {
        gpt_unit_forward(c, u, w, a, s, R, rows_total, ws);
    } else if (u == 0) {
        embedding_forward(a->out[0], a->tokens, w, 0, c->vocab, R, c->context, c->emb);
    } else {
        int K = linear_in(c, u), J = linear_out(c, u);
        const float *in = a->out[u - 1], *bias = w + (long)K * J;
        float* out = a->out[u];
        if (linear_kind(u) == ROW_PARALLEL) linear_forward_exact(out, s->acc, in, w, bias, R, K, J, ws);
        else linear_forward(out, in, w, bias, R, K, J, ws);
        if (u <= c->layers) relu_forward(out, (long)R * J);
        else a->loss = xent_forward(out, a->expsum, a->rowmax, a->tlogit, a->targets, R, J, rows_total);
    }
    trace_event("compute", t, trace_clock(), 0, "forward %s", unit_name(c, u));
}

// Backward of unit u, in two halves that zero-bubble pipeline schedules run apart (the
// result is the same either way: gradients are exact sums).
// The input half: reads s->dout (the gradient of the unit's output; the last unit starts
// from the loss instead) and turns it into the gradient before the ReLU or the softmax, in
// place (the GPT: leaves what the weight half needs in s->stash); writes the gradient of
// the unit's input to s->din (not for the embedding).
static void unit_backward_input(const Config* c, int u, const float* w, Acts* a, Scratch* s, int R, Workspace* ws) {
    if (u == 0) return; // the embedding's input is tokens
    if (is_moe(c, u)) fatal("internal: an MoE unit's backward is not split in halves");
    double t = trace_clock();
    if (is_gpt(c)) {
        gpt_unit_backward_input(c, u, w, a, s, R, ws);
        trace_event("compute", t, trace_clock(), 0, "input gradient %s", unit_name(c, u));
        return;
    }
    int K = linear_in(c, u), J = linear_out(c, u);
    if (u == c->layers + 1) xent_backward(s->dout, a->out[u], a->targets, R, J, 0);
    else relu_backward(s->dout, a->out[u], (long)R * J);
    if (linear_kind(u) == COLUMN_PARALLEL) linear_backward_input_exact(s->din, s->acc, s->dout, w, R, K, J, ws);
    else linear_backward_input(s->din, s->dout, w, R, K, J, ws);
    trace_event("compute", t, trace_clock(), 0, "input gradient %s", unit_name(c, u));
}
// The weight half: adds the parameter gradients into g (exact sums), from the unit's input
// activations and `dout`, what the input half left (unit_stash).
static void unit_backward_weight(const Config* c, int u, int64_t* g, const Acts* a, const float* dout, int R,
                                 long batch, Workspace* ws) {
    double t = trace_clock();
    if (is_gpt(c)) {
        gpt_unit_backward_weight(c, u, g, a, dout, R, batch, ws);
    } else if (u == 0) {
        embedding_backward(g, a->tokens, dout, 0, c->vocab, R, c->context, c->emb, batch);
    } else {
        int K = linear_in(c, u), J = linear_out(c, u);
        linear_backward_weight(g, g + (long)K * J, a->out[u - 1], dout, R, K, J, batch, ws);
    }
    trace_event("compute", t, trace_clock(), 0, "weight gradient %s", unit_name(c, u));
}
static void unit_backward(const Config* c, int u, const float* w, int64_t* g, Acts* a, Scratch* s, int R, long batch,
                          Workspace* ws) {
    if (is_moe(c, u)) { // not in halves: the layer's backward adds its weight gradients as it goes
        const float *in, *dout;
        float* din;
        long router = moe_router_at(c), experts = moe_shared_params(c, u), terms = batch * moe_tokens_per_row(c);
        moe_unit_backward_before(c, u, a, s, &in, &dout, &din);
        moe_backward(c, w + router, w + experts, g + router, g + experts, &a->moe[u], in, dout, din, a->moe[u].n, terms,
                     ws);
        moe_unit_backward_after(c, u, w, g, a, s, R, terms, ws);
        return;
    }
    unit_backward_input(c, u, w, a, s, R, ws);
    unit_backward_weight(c, u, g, a, unit_stash(c, u, s), R, batch, ws);
}

// The whole model: units 0..L+1 in order, then back. Returns the exact loss sum.
static int64_t model_forward(const Config* c, const float* params, Work* w, int R, long rows_total) {
    w->acts.aux = 0;
    for (int u = 0; u < n_units(c); u++) unit_forward(c, u, params + unit_offset(c, u), &w->acts, &w->scratch, R, rows_total, &w->ws);
    return w->acts.loss;
}
static void model_backward(const Config* c, const float* params, int64_t* grads, Work* w, int R, long batch) {
    for (int u = n_units(c) - 1; u >= 0; u--) {
        long off = unit_offset(c, u);
        unit_backward(c, u, params + off, grads + off, &w->acts, &w->scratch, R, batch, &w->ws);
        scratch_step_down(&w->scratch);
    }
}

// The probabilities [R][V] a sampling pass returns, from the last unit's output `out`: the
// MLP's rows, or the GPT's at the position being sampled (rows->pos).
static void model_probs(const Config* c, const Rows* rows, const float* out, int R, float* probs) {
    int V = c->vocab, T = c->context;
    for (int r = 0; r < R; r++)
        memcpy(probs + (long)r * V, is_gpt(c) ? out + ((long)r * T + rows->pos) * V : out + (long)r * V, V * sizeof(float));
}

// train.c's forward pass over rows [first, first + R) of a source, through the whole model
// held by this process; with probs != NULL, the probabilities are copied there. Returns
// the exact sum of the rows' losses. (What every ForwardFn below does, on one process.)
static int64_t model_forward_rows(const Config* c, const float* params, Work* w, const Rows* rows, long first, int R,
                                  long rows_total, float* probs) {
    rows_load(rows, first, R, c->context, w->acts.tokens, w->acts.targets);
    w->acts.training = rows->kind == ROWS_TRAIN;
    int64_t loss = model_forward(c, params, w, R, rows_total);
    if (probs) model_probs(c, rows, w->acts.out[c->layers + 1], R, probs);
    return loss;
}

// ----------------------------------------------------------------------------
// the training state, and optimizers

// What training keeps for the n parameters a process holds: the parameters, their exact
// gradient sums, and AdamW's m and v (NULL for SGD), all in one layout.
typedef struct {
    long n;
    float* params;
    int64_t* grads;
    float* m;
    float* v;
} State;
static State state_alloc(long n, int adamw) {
    State s = {n, callocCheck(n, sizeof(float)), callocCheck(n, sizeof(int64_t)), NULL, NULL};
    if (adamw) s.m = callocCheck(n, sizeof(float)), s.v = callocCheck(n, sizeof(float));
    return s;
}
static void state_free(State* s) {
    free(s->params);
    free(s->grads);
    free(s->m);
    free(s->v);
}
//
// The exact gradient sums are divided by the global batch size once, here, and rounded to
// float. Every element is updated by the same float operations in every layout (built
// with -ffp-contract=off, so the compiler fuses nothing on its own).

typedef struct {
    int adamw;       // 0: SGD, 1: AdamW
    float lr;
    float weight_decay; // decoupled: p -= lr * wd * p
    float beta1, beta2, eps;
    float clip;      // max global gradient norm; 0 = off
} Optimizer;

// g = float(sum * (2^-40 / batch)): one multiply by a constant that every layout computes alike
ALWAYS_INLINE double grad_factor(long batch) { return (1.0 / FIX_ONE) / (double)batch; }
ALWAYS_INLINE float grad_value(int64_t g, double factor) { return (float)((double)g * factor); }

// One step on n parameters: the whole model, or any contiguous shard of it. Gradient i is
// float(g[i] * factor) * scale: factor is grad_factor(batch), scale the clipping factor.
// `t` is the 1-based step number (for AdamW's bias correction); m and v are unused by SGD.
ALWAYS_INLINE void sgd_update(float* p, const int64_t* g, long i, float lr, float wd, double f, float scale) {
    float gi = grad_value(g[i], f) * scale;
    p[i] -= lr * (gi + wd * p[i]);
}
ALWAYS_INLINE void adamw_update(float* p, const int64_t* g, float* m, float* v, long i, float lr, float wd, double f,
                                float scale, float b1, float b2, float c1, float c2, float eps) {
    float gi = grad_value(g[i], f) * scale;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    float mhat = m[i] / c1, vhat = v[i] / c2;
    p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
}
VECTOR_CLONES static void optimizer_step(const Optimizer* opt, float* p, const int64_t* g, float* m, float* v, long n,
                           double factor, float scale, long t) {
    float lr = opt->lr, wd = opt->weight_decay, b1 = opt->beta1, b2 = opt->beta2, eps = opt->eps;
    float c1 = 1.0f - powf(b1, (float)t), c2 = 1.0f - powf(b2, (float)t);
    if (!opt->adamw && THREADED(n)) {
OMP(omp parallel for)
        for (long i = 0; i < n; i++) sgd_update(p, g, i, lr, wd, factor, scale);
    } else if (!opt->adamw) {
        for (long i = 0; i < n; i++) sgd_update(p, g, i, lr, wd, factor, scale);
    } else if (THREADED(n)) {
OMP(omp parallel for)
        for (long i = 0; i < n; i++) adamw_update(p, g, m, v, i, lr, wd, factor, scale, b1, b2, c1, c2, eps);
    } else {
        for (long i = 0; i < n; i++) adamw_update(p, g, m, v, i, lr, wd, factor, scale, b1, b2, c1, c2, eps);
    }
}

// Clipping by the global gradient norm, computed in two exact steps so that pieces of the
// gradient held by different ranks combine to the same bits: the largest |g| (combined by
// MAX), then the sum of (g / 2^e)^2 with 2^e >= that max, so every term is at most 1,
// rounded to units of 2^-30 and summed as integers (combined by SUM). norm = 2^e sqrt(sum).
#define NORM_ONE 0x1p30
static float grads_maxabs(const int64_t* g, long n, long batch) {
    float m = 0.0f;
    double f = grad_factor(batch);
    for (long i = 0; i < n; i++) {
        float v = fabsf(grad_value(g[i], f));
        m = v > m ? v : m;
    }
    return m;
}
static int64_t grads_sumsq(const int64_t* g, long n, long batch, int e) {
    int64_t s = 0;
    double f = grad_factor(batch);
    for (long i = 0; i < n; i++) {
        double v = ldexp((double)grad_value(g[i], f), -e);
        s += llrint(v * v * NORM_ONE);
    }
    return s;
}

// A run of gradients this process counts in the norm. Across all processes every element
// of the model must be counted exactly once: a layout that holds an element on several
// ranks (a replicated bias) counts it on one of them.
typedef struct {
    const int64_t* g;
    long n;
} GradSpan;
// How a layout combines the norm's pieces across ranks: called with the local maximum
// (combine by MAX, sumsq NULL), then with the local sum of squares (combine by SUM,
// maxabs NULL). NULL when one process holds every gradient.
typedef void (*NormFn)(void* ctx, float* maxabs, int64_t* sumsq);

// The factor every gradient is multiplied by: clip / norm when --clip is set and the
// global norm exceeds it, else 1.
static float clip_factor(const Optimizer* opt, const GradSpan* spans, int n, long batch, NormFn combine, void* ctx) {
    if (opt->clip <= 0.0f) return 1.0f;
    float mx = 0.0f;
    for (int i = 0; i < n; i++) {
        float m = grads_maxabs(spans[i].g, spans[i].n, batch);
        mx = m > mx ? m : mx;
    }
    if (combine) combine(ctx, &mx, NULL);
    int e;
    frexpf(mx, &e); // mx = f * 2^e with 0.5 <= f < 1
    int64_t sumsq = 0;
    for (int i = 0; i < n; i++) sumsq += grads_sumsq(spans[i].g, spans[i].n, batch, e);
    if (combine) combine(ctx, NULL, &sumsq);
    float norm = (float)ldexp(sqrt((double)sumsq / NORM_ONE), e);
    return norm > opt->clip ? opt->clip / norm : 1.0f;
}

// ----------------------------------------------------------------------------
// the program's forward pass, validation and sampling
//
// Every program supplies one function, its forward pass over R rows drawn from a source
// (data.h's Rows): train.c runs model_forward, train_tp.c its slices with their
// all-reduces, train_pp.c the pipeline. Validation and sampling below run on any of them.

// The forward pass of rows [first, first + R) of `rows`, whose losses count among
// `rows_total`. Returns the exact sum of their losses where the loss is known (0 on a
// pipeline stage that is not the last); with probs != NULL, every rank also receives the
// probabilities [R][V] over the whole vocabulary (for sampling; model_probs).
typedef int64_t (*ForwardFn)(void* ctx, const Rows* rows, long first, int R, long rows_total, float* probs);

// Validation rows per forward pass (the result does not depend on it): the MLP's examples
// are small; a GPT row is a whole name, T positions with their attention, so fewer.
static int eval_rows(const Dataset* ds) { return ds->seq_len ? 32 : 256; }

// The exact sum of the losses of part `part` of `parts` of the validation split (all of it:
// 1, 0), in passes of eval_rows rows. Every part makes the same number of passes (the last
// ones may be empty), so that every rank joins the collectives a forward pass may hold.
static int64_t evaluate(ForwardFn forward, void* ctx, const Dataset* ds, int parts, int part) {
    long lo, hi, most = (ds->n_val_rows + parts - 1) / parts, E = eval_rows(ds);
    split_range(ds->n_val_rows, parts, part, &lo, &hi);
    Rows val = {.ds = ds, .kind = ROWS_VAL};
    int64_t total = 0;
    for (long first = lo, pass = 0; pass * E < most; first += E, pass++) {
        int R = (int)(hi - first < E ? (hi - first > 0 ? hi - first : 0) : E);
        total += forward(ctx, &val, first, R, ds->n_val_rows, NULL);
    }
    return total;
}
// The mean over the validation split's targets (the MLP: its examples)
static double mean_loss(int64_t total, const Dataset* ds) { return fix_to(total) / (double)ds->n_val_targets; }

// Next token for sample n at position p, drawn from probs[V] with a counter-based draw:
// the first token whose cumulative probability exceeds u.
static int sample_token(const float* probs, int V, uint64_t seed, int n, int p) {
    double u = rng_uniform(seed, STREAM_SAMPLE, ((uint64_t)n << 32) + (uint64_t)p), cdf = 0.0;
    int last = 0;
    for (int v = 0; v < V; v++) {
        if (probs[v] <= 0.0f) continue;
        cdf += probs[v];
        last = v;
        if (u < cdf) return v;
    }
    return last; // u fell in the rounding gap at the very top of the cdf
}

// The names every program prints: n_samples of them, generated together, each max_len + 1
// token ids (a name longer than any line of the data is cut there, the rest is 0). Every
// rank draws the same tokens from the same probabilities. The caller frees the array.
// The MLP's context is the last T tokens, shifted along; the GPT's the name so far from
// the start token 0, the next token drawn from the probabilities at its last position.
static int* generate_names(int n_samples, int max_len, const Config* c, const Dataset* ds, uint64_t seed,
                           ForwardFn forward, void* ctx) {
    int T = c->context, V = c->vocab, gpt = is_gpt(c), steps = gpt && T < max_len ? T : max_len;
    int* names = callocCheck((size_t)(n_samples > 0 ? n_samples : 1) * ((size_t)max_len + 1), sizeof(int));
    int* tokens = callocCheck((size_t)n_samples * T, sizeof(int));
    float* probs = mallocCheck((size_t)n_samples * V * sizeof(float));
    int* done = callocCheck((size_t)n_samples, sizeof(int));
    Rows contexts = {.ds = ds, .kind = ROWS_GIVEN, .tokens = tokens};
    for (int p = 0, left = n_samples; p < steps && left > 0; p++) { // until every name has ended
        contexts.pos = p;
        forward(ctx, &contexts, 0, n_samples, n_samples, probs);
        for (int i = 0; i < n_samples; i++) {
            if (done[i]) continue;
            int next = sample_token(probs + (long)i * V, V, seed, i, p);
            if (next == 0) {
                done[i] = 1, left--;
                continue;
            }
            names[(long)i * (max_len + 1) + p] = next;
            if (gpt && p + 1 < T) {
                tokens[(long)i * T + p + 1] = next;
            } else if (!gpt) {
                memmove(tokens + (long)i * T, tokens + (long)i * T + 1, (T - 1) * sizeof(int));
                tokens[(long)i * T + T - 1] = next;
            }
        }
    }
    free(tokens);
    free(probs);
    free(done);
    return names;
}

#pragma GCC diagnostic pop
#endif // MODEL_H
