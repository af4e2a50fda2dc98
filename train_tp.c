/*
 * train_tp.c: tensor parallel (Megatron-style). Every rank sees the whole batch and holds
 * a slice of every layer. Linear layers come in pairs: a column-parallel layer (each rank
 * computes some of the outputs) feeds a row-parallel one (each rank holds the matching
 * inputs and computes a partial sum of every output). The embedding and, when the last
 * layer is column-parallel, the softmax cross-entropy are split by vocabulary. It prints
 * exactly what train.c prints for the same flags.
 *
 *             f                column-parallel             row-parallel                g
 *   x ---> [fwd: identity] ---> Y_r = x A[:, r] -> ReLU -> Z_r = Y_r B[r, :] ---> [fwd: all-reduce] ---> Z + b
 *          [bwd: all-reduce]    (rank r: columns r of A)  (rank r: rows r of B)    [bwd: identity]
 *
 *   f and g are conjugate: f is the identity forward and an all-reduce backward (the
 *   input gradient of a column-parallel layer is a partial sum on each rank), g the
 *   reverse (the output of a row-parallel layer is). One all-reduce each way per pair.
 *
 * The GPT (--model gpt) is split by heads: in each block, attention's q k v projection is
 * column-parallel (rank r computes the q, k and v of its heads), attention runs on those
 * heads alone, the output projection is row-parallel; the MLP is split the same way by
 * slices of its 4C hidden units. Two f and two g a block:
 *
 *   x -> ln1 -> f -> qkv (its heads) -> attention (its heads) -> proj (partial) -> g -> + x = x1
 *   x1 -> ln2 -> f -> fc (its slice of 4C) -> GELU -> fc2 (partial) -> g -> + x1
 *
 * --sp, sequence parallelism: what the above leaves replicated (LayerNorms, residuals) is
 * split by tokens; f becomes an all-gather of the tokens, g a reduce-scatter:
 *
 *   x[its tokens] -> ln1 -> f: all-gather -> qkv ... proj -> g: reduce-scatter -> + x -> x1[its tokens]
 *
 * Per rank and step, t ranks, batch B rows of T positions, E the MLP model's embedding width
 * (every rank takes every row; sizes in bytes: finished floats travel as 4, exact sums as 8):
 *   sent    2(t-1)/t x (4 x B x T x E for the embedding
 *                       + 8 x B x (each row-parallel layer's outputs + each column-parallel layer's inputs)
 *                       + 16 x B when the loss is split by vocabulary)
 *           the GPT, N = B T tokens of width C: 2(t-1)/t x 8 x N C for each of a block's 4
 *           all-reduces; with --sp each becomes a reduce-scatter (8) and an all-gather (4)
 *           of (t-1)/t of it (tp_gpt_sent_formula has every term)
 *   memory  (4 + 8, + 8 with AdamW) x (P/t + the row-parallel biases, held whole) + activations;
 *           the GPT's activations a block, Korthikanti et al.'s forms for 4-byte floats and no
 *           dropout, plus LayerNorm's statistics (16 bytes a token):
 *           sbh(16 + 48/t + 4as/(ht)) + 16sb, with --sp sbh/t (64 + 4as/h) + 16sb/t
 *           (tp_gpt_acts_formula; docs/tp.md derives them from the paper's)
 *
 *   make train_tp && mpirun -n 2 ./train_tp              # --oversubscribe for more ranks than cores
 *   mpirun -n 3 ./train_tp --layers 2                    # the logits split by vocabulary too
 *   mpirun -n 2 ./train_tp --model gpt                   # the GPT, 2 of its 4 heads a rank
 *   mpirun -n 2 ./train_tp --model gpt --sp              # and sequence parallel
 *
 * Compare with ./train (--model gpt for the GPT): the same losses, names and final
 * checkpoint, whatever t. More, with the measured tables: docs/tp.md.
 *
 * Sections: the strategy (slices; f and g; column- and row-parallel linear layers;
 * vocabulary-parallel embedding and loss); the strategy, the GPT (f and g with and without
 * --sp; a block, the embedding and the head); the model's units; the figures; then the
 * program: the state of one run, the passes, options, main.
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// the strategy: slices of every layer
//
// Column-parallel layer (odd l, model.h's linear_kind): rank r holds the columns (outputs)
// of its slice of W_l and b_l, and computes those outputs from the whole input.
// Row-parallel layer (even l): rank r holds the rows of W_l for the inputs it computed in
// the layer before, so its output is a partial sum, completed by g; the bias, held whole
// by every rank, is added once after.
// Both split sums are exact (kernels.h), so the all-reduces give train.c's bits.
//
// Sizes t does not divide are padded: the hidden size 64 on 3 ranks becomes 3 slices of 22,
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
    // the GPT (the section "the strategy, the GPT" below)
    int sp;                         // --sp: sequence parallelism
    BlockDims dims;                 // a block on this rank: its heads, its slice of F (R set by each pass)
    float* whole;                   // [rows T + t][max(C, vs)] every token's activations (f, with --sp), the embedding's
    int64_t* sum;                   // [rows T + t][max(C, vs)] exact partial sums over this rank's heads or slice
    int64_t* by_token;              // [rows T + t][C] --sp: an input gradient's partial sums, by token
    int64_t* mine_sum;              // [rows T / t + 1][C] --sp: the sums of this rank's tokens
    float* dx1_mine;                // [rows T][C] the gradient between a block's two halves, this rank's tokens
    int64_t* ln_grad;               // [2][C] a LayerNorm's gradient of one pass
    // train_3d.c's context-parallel axis: attention over every rank's positions (train_cp.c),
    // NULL here: attention over the positions held
    void (*attend)(void* ctx, BlockActs* a);
    void (*attend_backward)(void* ctx, const BlockActs* a, const float* datty, float* dqkv);
    void* attend_ctx;
} Tp;

static int tp_column(int l) { return linear_kind(l) == COLUMN_PARALLEL; }

// A block with experts (--experts, train_3d.c) on this rank: its attention split by heads
// as the dense block's, then its LayerNorms, row-parallel bias and router replicated, in
// transformer.h's moe_block_layout; its experts are not split (each is held whole by the
// ranks of the expert axis that hold it: train_3d.c), and tensor parallelism holds the rest,
// up to `shared`.
static MoeBlockLayout tp_moe_layout(const Tp* t, const Config* c) {
    return moe_block_layout(c->emb, t->dims.A, 4 * c->emb, c->experts);
}

static void tp_init(Tp* t, Group* tp, const Config* c, int rows, int sp) {
    memset(t, 0, sizeof *t);
    t->tp = tp;
    t->sp = sp;
    t->hs = (c->hidden + tp->size - 1) / tp->size;
    t->vs = (c->vocab + tp->size - 1) / tp->size;
    t->size[0] = (long)t->vs * c->emb;
    for (int l = 1; l <= c->layers + 1 && !is_gpt(c); l++) {
        int out_slice = l == c->layers + 1 ? t->vs : t->hs;
        t->k[l] = tp_column(l) ? linear_in(c, l) : t->hs;
        t->j[l] = tp_column(l) ? out_slice : linear_out(c, l);
        t->size[l] = (long)t->k[l] * t->j[l] + t->j[l];
    }
    if (is_gpt(c)) { // a block: heads / t of the heads, F / t of the MLP (main, or train_3d.c's grid_resolve, checks t divides them)
        int C = c->emb, T = c->context, n = tp->size;
        long tokens = (long)rows * T + n, widest = C > t->vs ? C : t->vs;
        t->dims = gpt_dims(c, rows);
        t->dims.NH = c->heads / n, t->dims.A = t->dims.NH * t->dims.HD, t->dims.F = 4 * C / n;
        t->size[0] = (long)t->vs * C + (long)T * C;
        for (int u = 1; u <= c->layers; u++) t->size[u] = block_layout(C, t->dims.A, t->dims.F).n;
        for (int u = 1; u <= c->layers && c->experts; u++) // a block with experts: its dense part (tp_moe_layout)
            t->size[u] = tp_moe_layout(t, c).shared;
        t->size[c->layers + 1] = (long)C * t->vs + 2L * C;
        t->whole = mallocCheck((size_t)tokens * widest * sizeof(float));
        t->sum = mallocCheck((size_t)tokens * widest * sizeof(int64_t));
        t->mine_sum = mallocCheck((size_t)(tokens / n + 1) * C * sizeof(int64_t));
        t->by_token = sp ? mallocCheck((size_t)tokens * C * sizeof(int64_t)) : NULL;
        t->dx1_mine = mallocCheck((size_t)tokens * C * sizeof(float));
        t->ln_grad = mallocCheck(2L * C * sizeof(int64_t));
    }
    for (int u = 0; u < n_units(c); u++) t->off[u + 1] = t->off[u] + t->size[u];
    t->probs = mallocCheck((size_t)rows * c->vocab * sizeof(float));
    t->gathered = mallocCheck((size_t)tp->size * rows * t->vs * sizeof(float));
}
// Positions of a row this rank keeps of the per-token tensors (the residual stream, the
// LayerNorms): every one held, or with --sp its share, ceil(Tq / t) (R rows of them cover
// the ceil(R Tq / t) tokens of its shard of a pass).
static int tp_token_share(const Tp* t) { return t->sp ? (t->dims.Tq + t->tp->size - 1) / t->tp->size : t->dims.Tq; }
// What each unit holds per row on this rank (model.h's UnitSizes, which size its
// activations and a pipeline's sends and stash): a column-parallel layer's output is its
// slice; the GPT's blocks keep their heads' and slice of F's tensors, the per-token ones
// at tp_token_share positions, and the head the logits of its slice of the vocabulary.
static void tp_sizes(const Tp* t, const Config* c, UnitSizes* sz) {
    if (is_gpt(c)) {
        gpt_unit_sizes(c, &t->dims, t->vs, tp_token_share(t), sz);
        return;
    }
    for (int u = 0; u < n_units(c); u++) {
        sz->out[u] = u == 0 ? unit_width(c, 0) : (tp_column(u) ? t->j[u] : linear_out(c, u));
        sz->saved[u] = 0, sz->stash[u] = sz->out[u];
    }
}
static void tp_free(Tp* t) {
    free(t->probs);
    free(t->gathered);
    free(t->whole), free(t->sum), free(t->by_token), free(t->mine_sum), free(t->dx1_mine), free(t->ln_grad);
}

// First vocabulary entry of this rank's slice.
static int tp_v_lo(const Tp* t) { return t->tp->rank * t->vs; }

// Element e of unit u on this rank, as an element of unit u in train.c's layout, or -1 for
// padding. Initialisation, checkpoints and the gradient norm all go through it.
static long tp_gpt_canonical(const Tp* t, const Config* c, int u, long e);
static long tp_canonical(const Tp* t, const Config* c, int u, long e) {
    int r = t->tp->rank;
    if (is_gpt(c)) return tp_gpt_canonical(t, c, u, e);
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
// The GPT: a block's split tensors are three column ranges of qkv (this rank's heads in q,
// in k, in v), rows of proj, columns of fc and rows of fc2; its replicated ones follow whole
// (transformer.h's block_layout). The embedding: this rank's rows of wte, then wpe whole;
// the head: its columns of lm_head, then ln_f whole.
static long tp_gpt_canonical(const Tp* t, const Config* c, int u, long e) {
    int r = t->tp->rank, C = c->emb, V = c->vocab;
    if (u == 0) {
        long v = r * t->vs + e / C;
        if (e >= (long)t->vs * C) return (long)V * C + (e - (long)t->vs * C); // wpe
        return v < V ? v * C + e % C : -1;
    }
    if (u == c->layers + 1) {
        if (e >= (long)C * t->vs) return (long)C * V + (e - (long)C * t->vs); // ln_f
        long col = r * (long)t->vs + e % t->vs;
        return col < V ? (e / t->vs) * V + col : -1;
    }
    int A = t->dims.A, F = t->dims.F;
    BlockLayout l = block_layout(C, A, F), g = block_layout(C, C, 4 * C);
    if (is_moe(c, u)) { // a block with experts: qkv and proj as the dense block's, then the replicated tensors
        MoeBlockLayout lm = tp_moe_layout(t, c), gm = moe_block_layout(C, C, 4 * C, c->experts);
        if (e >= lm.split) return gm.split + (e - lm.split);
    } else if (e >= l.split) {
        return g.split + (e - l.split); // the replicated tensors, in the same order
    }
    if (e < l.qkv_b) return g.qkv_w + (e / (3 * A)) * 3L * C + (e % (3 * A)) / A * C + (long)r * A + e % A;
    if (e < l.proj_w) return g.qkv_b + (e - l.qkv_b) / A * C + (long)r * A + (e - l.qkv_b) % A;
    if (e < l.fc_w) return g.proj_w + ((long)r * A + (e - l.proj_w) / C) * C + (e - l.proj_w) % C;
    if (e < l.fc_b) return g.fc_w + (e - l.fc_w) / F * 4L * C + (long)r * F + (e - l.fc_w) % F;
    if (e < l.fc2_w) return g.fc_b + (long)r * F + (e - l.fc_b);
    return g.fc2_w + ((long)r * F + (e - l.fc2_w) / C) * C + (e - l.fc2_w) % C;
}
// Elements of unit u this rank counts in the gradient norm: all, except that a tensor held
// whole by every rank (a row-parallel layer's bias; the GPT's LayerNorms, wpe, and its
// row-parallel biases) is counted by rank 0 alone: the replicated tensors come last.
static long tp_counted(const Tp* t, const Config* c, int u) {
    if (t->tp->rank == 0) return t->size[u];
    if (is_gpt(c))
        return u == 0 ? (long)t->vs * c->emb : u == c->layers + 1 ? (long)c->emb * t->vs
             : is_moe(c, u) ? tp_moe_layout(t, c).split : block_layout(c->emb, t->dims.A, t->dims.F).split;
    return u > 0 && !tp_column(u) ? (long)t->k[u] * t->j[u] : t->size[u];
}

// f and g, the conjugate operators around a pair of layers (Megatron's
// copy_to_tensor_model_parallel_region and reduce_from_tensor_model_parallel_region):
//   f: identity in forward; in backward an all-reduce of the input gradient, which each
//      rank computed as a partial sum over its own slice of outputs
//   g: in forward an all-reduce of the output, which each rank computed as a partial sum
//      over its own slice of inputs; identity in backward
// Both all-reduce exact partial sums (int64, kernels.h), so the sum has the same bits in
// any order. For the MLP they are the group_allreduce lines in column_parallel_backward_input
// (f) and row_parallel_forward (g); for the GPT, tp_f_forward ... tp_f_backward below.

// Column-parallel linear layer u: this rank's outputs Y[:, slice] = X W[:, slice] + b[slice],
// whole sums from the whole input (f's forward is the identity). Backward: the input
// gradient sums over every output, so each rank's partial sum over its own is completed by
// f's all-reduce; its weight and bias gradients are its own.
static void column_parallel_forward(Tp* t, int u, const float* w, const float* in, float* out, int R, Workspace* ws) {
    int K = t->k[u], J = t->j[u];
    linear_forward(out, in, w, w + (long)K * J, R, K, J, ws);
}
static void column_parallel_backward_input(Tp* t, const Config* c, int u, const float* w, Scratch* s, int R,
                                           Workspace* ws) {
    int K = t->k[u], J = t->j[u];
    linear_backward_input_partial(s->acc, s->dout, w, R, K, J, linear_out(c, u), ws); // over this rank's outputs
    group_allreduce(t->tp, s->acc, (long)R * K, MPI_INT64_T, MPI_SUM);                 // f (backward)
    linear_backward_input_finish(s->din, s->acc, R, K);
}
// Row-parallel linear layer u: Z = g(X[:, slice] W[slice, :]) + b, the partial sums over
// this rank's inputs completed by g's all-reduce, the bias added once after. Backward: the
// gradient of this rank's inputs needs only its rows of W (g's backward is the identity).
static void row_parallel_forward(Tp* t, const Config* c, int u, const float* w, const float* in, float* out,
                                 Scratch* s, int R, Workspace* ws) {
    int K = t->k[u], J = t->j[u];
    linear_forward_partial(s->acc, in, w, R, K, J, linear_in(c, u), ws); // over this rank's inputs
    group_allreduce(t->tp, s->acc, (long)R * J, MPI_INT64_T, MPI_SUM);    // g (forward)
    linear_forward_finish(out, s->acc, w + (long)K * J, R, J);
}
static void row_parallel_backward_input(Tp* t, int u, const float* w, Scratch* s, int R, Workspace* ws) {
    linear_backward_input(s->din, s->dout, w, R, t->k[u], t->j[u], ws);
}
// Either kind's weight and bias gradients: from its own inputs and outputs, no communication.
static void parallel_linear_backward_weight(Tp* t, int u, int64_t* g, const float* in, const float* dout, int R,
                                            long batch, Workspace* ws) {
    int K = t->k[u], J = t->j[u];
    linear_backward_weight(g, g + (long)K * J, in, dout, R, K, J, batch, ws);
}

// Vocabulary-parallel embedding: rank r holds the table rows of its slice of the vocabulary,
// looks up the tokens it holds and writes zeros for the others; an all-reduce adds them
// (each position has one non-zero contribution, so the float sum is exact).
static void vocab_parallel_embedding_forward(Tp* t, const Config* c, const float* w, Acts* a, int R) {
    embedding_forward(a->out[0], a->tokens, w, tp_v_lo(t), tp_v_lo(t) + t->vs, R, c->context, c->emb);
    group_allreduce(t->tp, a->out[0], (long)R * c->context * c->emb, MPI_FLOAT, MPI_SUM);
}

// Softmax cross-entropy over logits [R][J]: when the last layer is column-parallel, rank r
// holds the logits of its slice of the vocabulary, and the loss never gathers them: an
// all-reduce of the row maxima, one of the target logits and one of the (exact) sums of
// exponentials. When it is row-parallel every rank holds all the logits already.
static void vocab_parallel_cross_entropy(Tp* t, const Config* c, int u, Acts* a, const int* targets, int R,
                                         long rows_total) {
    int split = is_gpt(c) || tp_column(u), J = is_gpt(c) ? t->vs : t->j[u], v_lo = split ? tp_v_lo(t) : 0;
    float* logits = a->out[u];
    xent_rowmax(a->rowmax, logits, R, J, v_lo, c->vocab);
    xent_target_logit(a->tlogit, logits, targets, R, J, v_lo);
    if (split) {
        group_allreduce(t->tp, a->rowmax, R, MPI_FLOAT, MPI_MAX);
        group_allreduce(t->tp, a->tlogit, R, MPI_FLOAT, MPI_SUM); // one rank holds each target
    }
    xent_expsum(a->expsum, logits, logits, a->rowmax, R, J, v_lo, c->vocab);
    if (split) group_allreduce(t->tp, a->expsum, R, MPI_INT64_T, MPI_SUM); // exact
    a->loss = xent_finish(logits, a->expsum, a->rowmax, a->tlogit, targets, R, J, rows_total);
}

// ----------------------------------------------------------------------------
// the strategy, the GPT (--model gpt): a block split by heads, Megatron's way
//
//   x -> ln1 -> f -> qkv (column-parallel: the q, k and v columns of this rank's heads)
//     -> attention (this rank's heads: no communication) -> proj (row-parallel: a partial
//     sum over its heads) -> g -> + bias, + x = x1
//   x1 -> ln2 -> f -> fc (column-parallel: its slice of F) -> GELU -> fc2 (row-parallel) -> g
//     -> + bias, + x1
//   the embedding and the loss split by vocabulary, as for the MLP
//
// Two f and two g a block. LayerNorms, residuals, position embeddings and the two
// row-parallel biases are replicated: every rank computes them from the same inputs (the
// whole x, completed by g's all-reduce), so their gradients are the same on every rank and
// need no communication.
//
// --sp, sequence parallelism (Korthikanti et al., 2022; Megatron's
// gather_from_sequence_parallel_region and reduce_scatter_to_sequence_parallel_region):
// the regions tensor parallelism replicates (LayerNorms, residuals, the block's input and
// output) are split by tokens instead: a rank holds `n` of the N = R T tokens of a pass,
// tokens [lo, lo + n) in shards of ceil(N / t). f becomes an all-gather of the ranks'
// tokens before a column-parallel layer (backward: a reduce-scatter of its input
// gradient's partial sums), g a reduce-scatter of a row-parallel layer's partial sums
// (backward: an all-gather of the output gradient): the all-reduce's two halves, on either
// side of the token-wise work. A LayerNorm's gain and bias now see only a rank's tokens:
// their gradients are summed over the ranks (forgetting it is the classic SP bug). Like
// Megatron, a rank keeps only its tokens' LayerNorm output, and gathers it again for the
// weight gradient of the layer it feeds: memory 1/t, one all-gather more.

// This rank's tokens of a pass of R rows in the sequence-parallel regions
typedef struct {
    long N;     // tokens of the pass, R T
    long shard; // tokens per rank, padded: ceil(N / t)
    long lo, n; // this rank's: [lo, lo + n); without --sp every token
} TpTokens;
static TpTokens tp_tokens(const Tp* t, int R) {
    TpTokens k = {.N = (long)R * t->dims.Tq};
    k.shard = (k.N + t->tp->size - 1) / t->tp->size;
    k.lo = t->sp ? t->tp->rank * k.shard : 0;
    k.n = !t->sp ? k.N : k.N - k.lo < 0 ? 0 : k.N - k.lo < k.shard ? k.N - k.lo : k.shard;
    return k;
}

// f, forward: the identity, or with --sp an all-gather of every rank's tokens of `mine`
// (this rank's n, padded to a shard) into `whole`. Returns the whole [N][C].
static const float* tp_f_forward(Tp* t, float* mine, float* whole, TpTokens k) {
    if (!t->sp) return mine;
    int C = t->dims.C;
    memset(mine + k.n * C, 0, (size_t)(k.shard - k.n) * C * sizeof(float)); // a short last shard's padding
    group_allgather(t->tp, mine, whole, k.shard * C, MPI_FLOAT); // f (--sp): all-gather
    return whole;
}
// g, forward: completes a row-parallel layer's exact partial sums `sum` [N][C] across the
// ranks: an all-reduce, or with --sp a reduce-scatter that leaves each rank the sums of its
// own tokens. Then out = float(sum + b), each rank's tokens.
static void tp_g_forward(Tp* t, int64_t* sum, const float* b, float* out, TpTokens k) {
    int C = t->dims.C;
    if (!t->sp) {
        group_allreduce(t->tp, sum, k.N * C, MPI_INT64_T, MPI_SUM); // g: all-reduce
        linear_forward_finish(out, sum, b, (int)k.N, C);
        return;
    }
    fix_zero(sum + k.N * C, (k.shard * t->tp->size - k.N) * C);
    fix_zero(t->mine_sum, k.shard * C);
    group_reduce_scatter(t->tp, sum, k.shard * C, MPI_INT64_T, MPI_SUM, t->mine_sum); // g (--sp): reduce-scatter
    linear_forward_finish(out, t->mine_sum, b, (int)k.n, C);
}
// g, backward: the identity, or with --sp an all-gather of the output gradient's tokens.
static const float* tp_g_backward(Tp* t, float* mine, float* whole, TpTokens k) {
    if (!t->sp) return mine;
    int C = t->dims.C;
    memset(mine + k.n * C, 0, (size_t)(k.shard - k.n) * C * sizeof(float));
    group_allgather(t->tp, mine, whole, k.shard * C, MPI_FLOAT); // g backward (--sp): all-gather
    return whole;
}
// f, backward: completes a column-parallel layer's input gradient, exact partial sums
// accT [C][N] over this rank's columns: an all-reduce, or with --sp a reduce-scatter over
// tokens; din = the float sums, each rank's tokens.
static void tp_f_backward(Tp* t, int64_t* accT, float* din, TpTokens k) {
    int C = t->dims.C;
    if (!t->sp) {
        group_allreduce(t->tp, accT, k.N * C, MPI_INT64_T, MPI_SUM); // f backward: all-reduce
        linear_backward_input_finish(din, accT, (int)k.N, C);
        return;
    }
    int64_t* rows = t->by_token; // by tokens, so that a rank's shard is contiguous
    for (long n = 0; n < k.N; n++)
        for (int x = 0; x < C; x++) rows[n * C + x] = accT[(long)x * k.N + n];
    fix_zero(rows + k.N * C, (k.shard * t->tp->size - k.N) * C);
    fix_zero(t->mine_sum, k.shard * C);
    group_reduce_scatter(t->tp, rows, k.shard * C, MPI_INT64_T, MPI_SUM, t->mine_sum); // f backward (--sp): reduce-scatter
    for (long i = 0; i < k.n * C; i++) din[i] = (float)fix_to(t->mine_sum[i]);
}
// --sp: a LayerNorm's gain and bias gradients of this pass, [2][C] exact sums over this
// rank's tokens, summed over the ranks (every rank's tokens took part), then added to g.
static void tp_sp_layernorm_grads(Tp* t, int64_t* dg, int64_t* db, const float* dy, const float* x, const float* mean,
                                  const float* rstd, long n, long terms) {
    int C = t->dims.C;
    int64_t* mine = t->ln_grad;
    fix_zero(mine, 2L * C);
    layernorm_backward_params(mine, mine + C, dy, x, mean, rstd, n, C, terms);
    if (t->sp) group_allreduce(t->tp, mine, 2L * C, MPI_INT64_T, MPI_SUM); // --sp: the tokens were split
    for (int x = 0; x < C; x++) dg[x] += mine[x], db[x] += mine[C + x];
}

// A block's activations on this rank: the BlockActs of its heads and slice of F over every
// token, but with --sp its LayerNorm outputs and statistics and x1 over its own tokens only.
static BlockActs tp_block_acts(Tp* t, const Acts* a, int u) {
    return block_acts_tokens(a->saved[u], &t->dims, a->rows, tp_token_share(t));
}

// The block in two halves, so that a block whose MLP is a mixture of experts (train_3d.c)
// runs the attention half here and its experts apart: the attention half from the block's
// input x to x1 and ln2's output, the MLP half from ln2's output to the block's output.
static void tp_block_forward_attention(Tp* t, const BlockParams* p, BlockActs* ba, const float* x, Scratch* s,
                                       TpTokens k, Workspace* ws) {
    const BlockDims* d = &t->dims;
    int C = d->C, A = d->A, N = (int)k.N;
    layernorm_forward(ba->ln1, ba->ln1_mean, ba->ln1_rstd, x, p->ln1_g, p->ln1_b, k.n, C);
    const float* y1 = tp_f_forward(t, ba->ln1, t->whole, k);                  // f
    linear_forward(ba->qkv, y1, p->qkv_w, p->qkv_b, N, C, 3 * A, ws);          // column-parallel: this rank's heads
    if (t->attend) t->attend(t->attend_ctx, ba);                           // its heads, every rank's positions
    else attention_forward(ba->atty, ba->att, ba->qkv, d, s->tmp, s->acc);    // its heads
    linear_forward_partial(t->sum, ba->atty, p->proj_w, N, A, C, C, ws);      // row-parallel: over its heads
    tp_g_forward(t, t->sum, p->proj_b, ba->x1, k);                            // g
    for (long i = 0; i < k.n * C; i++) ba->x1[i] += x[i];                     // residual
    layernorm_forward(ba->ln2, ba->ln2_mean, ba->ln2_rstd, ba->x1, p->ln2_g, p->ln2_b, k.n, C);
}
static void tp_block_forward_mlp(Tp* t, const BlockParams* p, const BlockActs* ba, float* out, TpTokens k,
                                 Workspace* ws) {
    const BlockDims* d = &t->dims;
    int C = d->C, F = d->F, N = (int)k.N;
    const float* y2 = tp_f_forward(t, ba->ln2, t->whole, k);                  // f
    linear_forward(ba->fc, y2, p->fc_w, p->fc_b, N, C, F, ws);                // column-parallel: its slice of F
    gelu_forward(ba->gelu, ba->fc, (long)N * F);
    linear_forward_partial(t->sum, ba->gelu, p->fc2_w, N, F, C, 4L * C, ws);  // row-parallel: over its slice
    tp_g_forward(t, t->sum, p->fc2_b, out, k);                                // g
    for (long i = 0; i < k.n * C; i++) out[i] += ba->x1[i];                   // residual
}
static void tp_block_forward(Tp* t, const float* w, Acts* a, int u, Scratch* s, TpTokens k, Workspace* ws) {
    BlockParams p = block_params(w, &t->dims);
    BlockActs ba = tp_block_acts(t, a, u);
    tp_block_forward_attention(t, &p, &ba, a->out[u - 1], s, k, ws);
    tp_block_forward_mlp(t, &p, &ba, a->out[u], k, ws);
}
// The input half of backward, in the same two halves: the MLP's from s->dout (this rank's
// tokens with --sp) to ln2's output gradient st->dln2; the attention half's from s->dout
// (the residual's share) and st->dln2 to s->din. Each leaves in the stash what the weight
// half needs (the LayerNorms' for this rank's tokens only).
static void tp_block_backward_input_mlp(Tp* t, const BlockParams* p, const BlockActs* ba, const BlockStash* st,
                                        Scratch* s, TpTokens k, Workspace* ws) {
    const BlockDims* d = &t->dims;
    int C = d->C, F = d->F, N = (int)k.N;
    float* dh = s->tmp;
    memcpy(st->dx2, tp_g_backward(t, s->dout, t->whole, k), (size_t)N * C * sizeof(float)); // g backward
    linear_backward_input(dh, st->dx2, p->fc2_w, N, F, C, ws);                               // row-parallel: float
    gelu_backward(st->dfc, ba->fc, dh, (long)N * F);
    linear_backward_input_partial(t->sum, st->dfc, p->fc_w, N, C, F, 4L * C, ws);            // column-parallel: partial
    tp_f_backward(t, t->sum, st->dln2, k);                                                   // f backward
}
static void tp_block_backward_input_attention(Tp* t, const BlockParams* p, const BlockActs* ba, const BlockStash* st,
                                              const float* x, Scratch* s, TpTokens k, Workspace* ws) {
    const BlockDims* d = &t->dims;
    int C = d->C, A = d->A, F = d->F, N = (int)k.N;
    long most = F > A ? F : A;
    float *dh = s->tmp, *small = s->tmp + (long)N * most;
    layernorm_backward_input(t->dx1_mine, s->dout, st->dln2, ba->x1, ba->ln2_mean, ba->ln2_rstd, p->ln2_g, k.n, C);
    memcpy(st->dx1, tp_g_backward(t, t->dx1_mine, t->whole, k), (size_t)N * C * sizeof(float)); // g backward
    linear_backward_input(dh, st->dx1, p->proj_w, N, A, C, ws);                               // row-parallel: float
    if (t->attend_backward) t->attend_backward(t->attend_ctx, ba, dh, st->dqkv);       // its heads, every rank's positions
    else attention_backward(st->dqkv, dh, ba->qkv, ba->att, ba->atty, d, small, s->acc); // its heads
    linear_backward_input_partial(t->sum, st->dqkv, p->qkv_w, N, C, 3 * A, 3L * C, ws);       // column-parallel: partial
    tp_f_backward(t, t->sum, st->dln1, k);                                                    // f backward
    layernorm_backward_input(s->din, t->dx1_mine, st->dln1, x, ba->ln1_mean, ba->ln1_rstd, p->ln1_g, k.n, C);
}
static void tp_block_backward_input(Tp* t, const float* w, Acts* a, int u, Scratch* s, int R, TpTokens k,
                                    Workspace* ws) {
    BlockParams p = block_params(w, &t->dims);
    BlockActs ba = tp_block_acts(t, a, u);
    BlockStash st = block_stash(s->stash, &t->dims, R);
    tp_block_backward_input_mlp(t, &p, &ba, &st, s, k, ws);
    tp_block_backward_input_attention(t, &p, &ba, &st, a->out[u - 1], s, k, ws);
}
// The weight half: this rank's slices' gradients, and the replicated tensors' (with --sp
// the LayerNorms' summed over the ranks, and the LayerNorm outputs gathered again); the
// MLP's, then the LayerNorms' and attention's.
static void tp_block_backward_weight_mlp(Tp* t, const BlockGrads* gg, const BlockActs* ba, const BlockStash* st,
                                         TpTokens k, long terms, Workspace* ws) {
    const BlockDims* d = &t->dims;
    int C = d->C, F = d->F, N = (int)k.N;
    linear_backward_weight(gg->fc2_w, gg->fc2_b, ba->gelu, st->dx2, N, F, C, terms, ws);
    const float* y2 = tp_f_forward(t, ba->ln2, t->whole, k); // --sp: gathered again
    linear_backward_weight(gg->fc_w, gg->fc_b, y2, st->dfc, N, C, F, terms, ws);
}
static void tp_block_backward_weight_attention(Tp* t, const BlockGrads* gg, const BlockActs* ba, const BlockStash* st,
                                               const float* x, TpTokens k, long terms, Workspace* ws) {
    const BlockDims* d = &t->dims;
    int C = d->C, A = d->A, N = (int)k.N;
    tp_sp_layernorm_grads(t, gg->ln2_g, gg->ln2_b, st->dln2, ba->x1, ba->ln2_mean, ba->ln2_rstd, k.n, terms);
    linear_backward_weight(gg->proj_w, gg->proj_b, ba->atty, st->dx1, N, A, C, terms, ws);
    const float* y1 = tp_f_forward(t, ba->ln1, t->whole, k); // --sp: gathered again
    linear_backward_weight(gg->qkv_w, gg->qkv_b, y1, st->dqkv, N, C, 3 * A, terms, ws);
    tp_sp_layernorm_grads(t, gg->ln1_g, gg->ln1_b, st->dln1, x, ba->ln1_mean, ba->ln1_rstd, k.n, terms);
}
static void tp_block_backward_weight(Tp* t, int64_t* g, const Acts* a, int u, const float* stash, int R, TpTokens k,
                                     long terms, Workspace* ws) {
    BlockGrads gg = block_grads(g, &t->dims);
    BlockActs ba = tp_block_acts(t, a, u);
    BlockStash st = block_stash((float*)stash, &t->dims, R);
    tp_block_backward_weight_mlp(t, &gg, &ba, &st, k, terms, ws);
    tp_block_backward_weight_attention(t, &gg, &ba, &st, a->out[u - 1], k, terms, ws);
}

// The embedding: the vocabulary-parallel lookup (zeros for tokens of other ranks), summed
// across ranks (one non-zero term each, so the float sum is exact): an all-reduce, or with
// --sp a reduce-scatter leaving each rank its tokens; then their positions' wpe.
static void tp_gpt_embedding_forward(Tp* t, const Config* c, const float* w, Acts* a, int R, TpTokens k) {
    BlockDims all = t->dims;
    all.R = R;
    int C = c->emb;
    const float* wpe = w + (long)t->vs * C;
    gpt_embedding_forward(t->whole, a->tokens, w, NULL, tp_v_lo(t), tp_v_lo(t) + t->vs, 0, &all);
    if (!t->sp) {
        group_allreduce(t->tp, t->whole, k.N * C, MPI_FLOAT, MPI_SUM); // vocabulary-parallel: all-reduce
        memcpy(a->out[0], t->whole, (size_t)k.N * C * sizeof(float));
    } else {
        memset(t->whole + k.N * C, 0, (size_t)(k.shard * t->tp->size - k.N) * C * sizeof(float));
        memset(a->out[0], 0, (size_t)k.shard * C * sizeof(float));
        group_reduce_scatter(t->tp, t->whole, k.shard * C, MPI_FLOAT, MPI_SUM, a->out[0]); // (--sp) reduce-scatter
    }
    for (long i = 0; i < k.n; i++)
        for (int x = 0; x < C; x++) a->out[0][i * C + x] += wpe[(long)dims_pos(&all, (int)((k.lo + i) % all.Tq)) * C + x];
}
// Its gradients: this rank's rows of wte from every token's gradient (with --sp gathered
// first: the reduce-scatter's backward), and wpe's, the same on every rank.
static void tp_gpt_embedding_backward_weight(Tp* t, const Config* c, int64_t* g, const Acts* a, const float* dx, int R,
                                             TpTokens k, long terms) {
    BlockDims all = t->dims;
    all.R = R;
    const float* whole = tp_g_backward(t, (float*)dx, t->whole, k); // (--sp) all-gather
    gpt_embedding_backward(g, g + (long)t->vs * c->emb, a->tokens, whole, tp_v_lo(t), tp_v_lo(t) + t->vs, &all, terms);
}

// The head: ln_f (replicated, or --sp this rank's tokens), f, lm_head column-parallel by
// vocabulary, and the vocabulary-parallel cross-entropy over every token.
static void tp_gpt_head_forward(Tp* t, const Config* c, const float* w, Acts* a, long rows_total, TpTokens k,
                                Workspace* ws) {
    int C = c->emb, u = c->layers + 1, N = (int)k.N;
    float *ln = gpt_head_saved(c, a, 0), *mean = gpt_head_saved(c, a, 1), *rstd = gpt_head_saved(c, a, 2);
    layernorm_forward(ln, mean, rstd, a->out[u - 1], w + (long)C * t->vs, w + (long)C * t->vs + C, k.n, C);
    const float* y = tp_f_forward(t, ln, t->whole, k);                      // f
    linear_forward(a->out[u], y, w, NULL, N, C, t->vs, ws);                  // column-parallel: its slice of V
    vocab_parallel_cross_entropy(t, c, u, a, a->targets, N, rows_total * c->context);
}
static void tp_gpt_head_backward_input(Tp* t, const Config* c, const float* w, Acts* a, Scratch* s, TpTokens k,
                                       Workspace* ws) {
    int C = c->emb, u = c->layers + 1, N = (int)k.N;
    float *mean = gpt_head_saved(c, a, 1), *rstd = gpt_head_saved(c, a, 2);
    float *dlogits = s->stash, *dln = s->stash + (long)N * t->vs;
    xent_backward(dlogits, a->out[u], a->targets, N, t->vs, tp_v_lo(t));
    linear_backward_input_partial(t->sum, dlogits, w, N, C, t->vs, c->vocab, ws); // column-parallel: partial
    tp_f_backward(t, t->sum, dln, k);                                             // f backward
    layernorm_backward_input(s->din, NULL, dln, a->out[u - 1], mean, rstd, w + (long)C * t->vs, k.n, C);
}
static void tp_gpt_head_backward_weight(Tp* t, const Config* c, int64_t* g, const Acts* a, const float* stash,
                                        TpTokens k, long terms, Workspace* ws) {
    int C = c->emb, u = c->layers + 1, N = (int)k.N;
    float *ln = gpt_head_saved(c, a, 0), *mean = gpt_head_saved(c, a, 1), *rstd = gpt_head_saved(c, a, 2);
    const float *dlogits = stash, *dln = stash + (long)N * t->vs;
    const float* y = tp_f_forward(t, ln, t->whole, k); // --sp: gathered again
    linear_backward_weight(g, NULL, y, dlogits, N, C, t->vs, terms, ws);
    tp_sp_layernorm_grads(t, g + (long)C * t->vs, g + (long)C * t->vs + C, dln, a->out[u - 1], mean, rstd, k.n, terms);
}

// ----------------------------------------------------------------------------
// the model's units on this rank's slices: the MLP's layers or the GPT's embedding, blocks
// and head (train_3d.c runs these on its pipeline stages)

// Forward of unit u over R rows, with this rank's slice of its parameters at w.
static void tp_unit_forward(Tp* t, const Config* c, int u, const float* w, Acts* a, Scratch* s, int R,
                            long rows_total, Workspace* ws) {
    double t0 = trace_clock();
    t->dims.R = R;
    if (is_gpt(c)) {
        TpTokens k = tp_tokens(t, R);
        if (u == 0) tp_gpt_embedding_forward(t, c, w, a, R, k);
        else if (u <= c->layers) tp_block_forward(t, w, a, u, s, k, ws);
        else tp_gpt_head_forward(t, c, w, a, rows_total, k, ws);
    } else if (u == 0) {
        vocab_parallel_embedding_forward(t, c, w, a, R);
    } else {
        if (tp_column(u)) column_parallel_forward(t, u, w, a->out[u - 1], a->out[u], R, ws);
        else row_parallel_forward(t, c, u, w, a->out[u - 1], a->out[u], s, R, ws);
        if (u <= c->layers) relu_forward(a->out[u], (long)R * t->j[u]);
        else vocab_parallel_cross_entropy(t, c, u, a, a->targets, R, rows_total);
    }
    trace_event("compute", t0, trace_clock(), 0, "forward %s", unit_name(c, u));
}

// Backward of unit u, in two halves as model.h's unit_backward: the input half reads
// s->dout and writes the input gradient (whole after a column-parallel layer, this rank's
// slice after a row-parallel one, which is what the layer below holds) to s->din; the
// weight half adds this rank's parameter gradients into g.
static void tp_unit_backward_input(Tp* t, const Config* c, int u, const float* w, Acts* a, Scratch* s, int R,
                                   Workspace* ws) {
    if (u == 0) return;
    double t0 = trace_clock();
    t->dims.R = R;
    if (is_gpt(c)) {
        if (u <= c->layers) tp_block_backward_input(t, w, a, u, s, R, tp_tokens(t, R), ws);
        else tp_gpt_head_backward_input(t, c, w, a, s, tp_tokens(t, R), ws);
        trace_event("compute", t0, trace_clock(), 0, "input gradient %s", unit_name(c, u));
        return;
    }
    if (u == c->layers + 1) xent_backward(s->dout, a->out[u], a->targets, R, t->j[u], tp_column(u) ? tp_v_lo(t) : 0);
    else relu_backward(s->dout, a->out[u], (long)R * t->j[u]);
    if (tp_column(u)) column_parallel_backward_input(t, c, u, w, s, R, ws);
    else row_parallel_backward_input(t, u, w, s, R, ws);
    trace_event("compute", t0, trace_clock(), 0, "input gradient %s", unit_name(c, u));
}
static void tp_unit_backward_weight(Tp* t, const Config* c, int u, int64_t* g, const Acts* a, const float* dout, int R,
                                    long batch, Workspace* ws) {
    double t0 = trace_clock();
    t->dims.R = R;
    if (is_gpt(c)) {
        TpTokens k = tp_tokens(t, R);
        long terms = batch * c->context;
        if (u == 0) tp_gpt_embedding_backward_weight(t, c, g, a, dout, R, k, terms);
        else if (u <= c->layers) tp_block_backward_weight(t, g, a, u, dout, R, k, terms, ws);
        else tp_gpt_head_backward_weight(t, c, g, a, dout, k, terms, ws);
    } else if (u == 0) {
        embedding_backward(g, a->tokens, dout, tp_v_lo(t), tp_v_lo(t) + t->vs, R, c->context, c->emb, batch);
    } else {
        parallel_linear_backward_weight(t, u, g, a->out[u - 1], dout, R, batch, ws);
    }
    trace_event("compute", t0, trace_clock(), 0, "weight gradient %s", unit_name(c, u));
}
static void tp_unit_backward(Tp* t, const Config* c, int u, const float* w, int64_t* g, Acts* a, Scratch* s, int R,
                             long batch, Workspace* ws) {
    tp_unit_backward_input(t, c, u, w, a, s, R, ws);
    tp_unit_backward_weight(t, c, u, g, a, unit_stash(c, u, s), R, batch, ws);
}

// The whole vocabulary's probabilities of the last forward, on every rank (for sampling; the
// GPT's at the position held at index `at`: the position sampled).
static const float* tp_probs(Tp* t, const Config* c, const Acts* a, int R, int at) {
    int u = c->layers + 1;
    if (!is_gpt(c) && !tp_column(u)) return a->out[u];
    const float* mine = a->out[u];
    if (is_gpt(c)) {
        for (int r = 0; r < R; r++)
            memcpy(t->whole + (long)r * t->vs, a->out[u] + ((long)r * t->dims.Tq + at) * t->vs, t->vs * sizeof(float));
        mine = t->whole;
    }
    group_allgather(t->tp, mine, t->gathered, (long)R * t->vs, MPI_FLOAT);
    for (int q = 0; q < t->tp->size; q++)
        for (int r = 0; r < R; r++)
            for (int c0 = 0; c0 < t->vs && q * t->vs + c0 < c->vocab; c0++)
                t->probs[(long)r * c->vocab + q * t->vs + c0] = t->gathered[((long)q * R + r) * t->vs + c0];
    return t->probs;
}

// ----------------------------------------------------------------------------
// the figures: what a rank sends and holds, by the textbook

// What tensor parallelism sends per step from each rank, by the textbook ring formula, for
// R rows through units [u_lo, u_hi): an all-reduce of the embedding (4 B per element), of
// every row-parallel layer's output and every column-parallel layer's input gradient
// (8 B: exact sums), and, with the vocabulary split, of the loss's three pieces per row.
static double tp_gpt_sent_formula(const Tp* t, const Config* c, int u_lo, int u_hi, double R);
static double tp_sent_formula(const Tp* t, const Config* c, int u_lo, int u_hi, double R) {
    if (is_gpt(c)) return tp_gpt_sent_formula(t, c, u_lo, u_hi, R);
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
    for (int u = u_lo; u < u_hi && is_gpt(c); u++) { // the GPT's: split tensors / N, replicated ones whole
        double C = c->emb, V = c->vocab, T = c->context, N = t->tp->size;
        if (u == 0) n += V * C / N + T * C;
        else if (u <= c->layers) n += (12 * C * C + 7 * C) / N + 6 * C; // qkv, proj, fc, fc2, qkv's and fc's biases
        else n += C * V / N + 2 * C;
    }
    if (is_gpt(c)) return n;
    for (int u = u_lo; u < u_hi; u++) {
        double weights = u == 0 ? (double)c->vocab * c->emb : (double)linear_in(c, u) * linear_out(c, u);
        double bias = u == 0 ? 0 : linear_out(c, u);
        n += (weights + (u > 0 && tp_column(u) ? bias : 0)) / t->tp->size + (u > 0 && !tp_column(u) ? bias : 0);
    }
    return n;
}

// The GPT's sends per step from each rank, R rows (N = R T tokens) through units [u_lo,
// u_hi), by the textbook ring formulas (an all-reduce sends 2(t-1)/t of its buffer, a
// reduce-scatter or an all-gather (t-1)/t; floats 4 B, exact sums 8 B):
//   without --sp: each block 4 all-reduces of N C exact sums (g twice forward, f twice
//     backward), a block with experts 2 (its attention half's: its experts are not split);
//     the embedding's all-reduce of N C floats; the head's f (N C exact sums) and the
//     loss's three all-reduces of N (max, target logit, exact sum of exponentials)
//   --sp: each all-reduce becomes a reduce-scatter (8 B) and an all-gather of finished
//     floats (4 B), and each block gathers its two LayerNorm outputs again for the weight
//     gradients (4 B each) and all-reduces the LayerNorms' gradients (2 x 2C exact sums);
//     the embedding reduce-scatters floats forward and gathers its gradient backward; the
//     head gathers ln_f's output (forward and again for lm_head's gradient), reduce-scatters
//     its input gradient and all-reduces ln_f's gradient.
static double tp_gpt_sent_formula(const Tp* t, const Config* c, int u_lo, int u_hi, double R) {
    double n = t->tp->size, NC = R * t->dims.Tq * c->emb, N = R * t->dims.Tq, C = c->emb, bytes = 0; // the positions held
    double all = 2 * (n - 1) / n, half = (n - 1) / n;
    for (int u = u_lo; u < u_hi; u++) {
        int head = u == c->layers + 1;
        if (!t->sp) bytes += u == 0 ? all * 4 * NC : head ? all * (8 * NC + 16 * N) : all * (is_moe(c, u) ? 2 : 4) * 8 * NC;
        else if (u == 0) bytes += half * (4 + 4) * NC;
        else if (head) bytes += half * (4 + 8 + 4) * NC + all * (16 * N + 16 * C);
        else bytes += half * (2 * (4 + 8) + 2 * (4 + 8) + 2 * 4) * NC + all * 2 * 16 * C;
    }
    return bytes;
}
// The activations a rank holds for R rows of the GPT, in bytes, as tp_sizes lays them out
// (acts_init allocates them so): the tokens and targets; the embedding's output; each
// block's BlockActs at this rank's widths (with --sp the per-token tensors at its share of
// the tokens) and its output; the head's LayerNorm and its slice of the logits. *per_block:
// one block's, with its output.
static double tp_gpt_acts_held(const Config* c, const UnitSizes* sz, int R, double* per_block) {
    *per_block = 4.0 * R * (sz->saved[1] + sz->out[1]);
    return (double)R * acts_bytes_per_row(c, 0, n_units(c), sz);
}
// The same per block by Korthikanti et al.'s closed forms (s positions, b rows, h = C, a
// heads, t ranks), which count 2-byte activations with dropout: sbh(34 + 5as/h) on one
// rank, sbh(10 + 24/t + 5as/(ht)) with tensor parallelism, sbh/t (34 + 5as/h) with sequence
// parallelism too. Here activations are 4-byte floats and there is no dropout: drop the
// two dropout masks (sbh each, 1 B), the dropout's output on the scores (2as^2b) and its
// mask (as^2b), and double every 2-byte term: sbh(64 + 4as/h), sbh(16 + 48/t + 4as/(ht)),
// sbh/t (64 + 4as/h); plus what the paper leaves out, LayerNorm's mean and rstd (16 B a
// token: 16sb, or 16sb/t).
static double tp_gpt_acts_formula(const Tp* t, const Config* c, int R) {
    double s = c->context, b = R, h = c->emb, a = c->heads, n = t->tp->size;
    if (t->sp) return s * b * h / n * (64 + 4 * a * s / h) + 16 * s * b / n;
    return s * b * h * (16 + 48 / n + 4 * a * s / (h * n)) + 16 * s * b;
}

#ifndef TRAIN_3D // the rest of this file is the program; train_3d.c uses only the strategy above

#define RUN_LINE "mpirun -n 2 ./train_tp"

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    Dataset ds;     // the data
    Tp t;
    State st;       // this rank's slices of every unit (tp_canonical maps them), their state
    UnitSizes sizes; // what each unit holds per row on this rank (tp_sizes)
    Work work;
    Group tp;       // every rank
    Holding mine;   // what this rank holds of the model, for checkpoints
} Run;

static void run_free(Run* r) {
    dataset_free(&r->ds), state_free(&r->st), tp_free(&r->t), work_free(&r->work);
}

// Element e of unit u here, in train.c's layout (ckpt.h's Holding).
static long canonical(const void* ctx, int u, long e) {
    const Run* r = ctx;
    return tp_canonical(&r->t, &r->cfg, u, e);
}

// ----------------------------------------------------------------------------
// the forward and backward passes: every rank takes every row, through its slices

static int64_t forward(void* ctx, const Rows* rows, long first, int R, long rows_total, float* probs) {
    Run* r = ctx;
    const Config* c = &r->cfg;
    Acts* a = work_load(&r->work, rows, first, R, c->context);
    for (int u = 0; u < n_units(c); u++)
        tp_unit_forward(&r->t, c, u, r->st.params + r->t.off[u], a, &r->work.scratch, R, rows_total, &r->work.ws);
    if (probs) memcpy(probs, tp_probs(&r->t, c, a, R, rows->pos), (size_t)R * c->vocab * sizeof(float));
    return a->loss; // every rank holds the whole loss
}
static void backward(Run* r, int R, long B) {
    for (int u = n_units(&r->cfg) - 1; u >= 0; u--) {
        tp_unit_backward(&r->t, &r->cfg, u, r->st.params + r->t.off[u], r->st.grads + r->t.off[u], &r->work.acts,
                         &r->work.scratch, R, B, &r->work.ws);
        scratch_step_down(&r->work.scratch);
    }
}

// Mean loss over the whole validation split (every rank takes every row).
static double validation_loss(void* ctx) {
    Run* r = ctx;
    return mean_loss(evaluate(forward, r, &r->ds, 1, 0), &r->ds);
}

// The formulas of figures(), in words, for the report.
static const char sent_words[] = "2(N-1)/N x (4 B x B x T x E + 8 B x B x (every split sum's width))";
static const char mem_words[] = "(4 + 8 + 8 AdamW) B x (P/N + the row-parallel biases) + activations";
static const char gpt_sent_words[] = "2(N-1)/N x (4 B x BTC + 4 x 8 B x BTC a block + 8 B x BTC + 16 B x BT), with "
                                     "--sp a reduce-scatter and an all-gather for each (train_tp.c)";
static const char gpt_mem_words[] = "(4 + 8 + 8 AdamW) B x (P split / N + P replicated) + activations";

// What this rank sent and holds, each beside its formula: every rank takes every row,
// and a column-parallel layer's activations are its slice. The GPT's activations: the
// blocks' by Korthikanti et al.'s form (tp_gpt_acts_formula), the rest as held.
static Figures figures(const Run* r, const Progress* pr, const Optimizer* opt, int B) {
    const Config* c = &r->cfg;
    long np = r->st.n;
    double acts_row = acts_bytes_per_row(c, 0, n_units(c), &r->sizes), opt_bytes = opt->adamw ? 8.0 : 0.0;
    Figures f = {.sent = per_step(pr, r->tp.sent), .received = per_step(pr, r->tp.received), .params = 4.0 * np,
                 .grads = 8.0 * np, .optim = opt_bytes * np, .acts = B * acts_row, .bubble = -1};
    double acts_formula = B * acts_row;
    if (is_gpt(c)) {
        double block;
        tp_gpt_acts_held(c, &r->sizes, B, &block);
        acts_formula = f.acts - c->layers * block + c->layers * tp_gpt_acts_formula(&r->t, c, B);
    }
    f.sent_formula = tp_sent_formula(&r->t, c, 0, n_units(c), B) + (opt->clip > 0 ? ring_allreduce_bytes(4 + 8, r->tp.size) : 0);
    f.mem_formula = (4.0 + 8.0 + opt_bytes) * tp_params_formula(&r->t, c, 0, n_units(c)) + acts_formula;
    return f;
}

// The GPT: a block's activations on this rank, held beside the paper's form (see
// tp_gpt_acts_formula), for the report.
static void print_block_activations(const Run* r, int B) {
    const Config* c = &r->cfg;
    double block;
    tp_gpt_acts_held(c, &r->sizes, B, &block);
    printf("activations of one block per rank (s %d positions, b %d rows, h %d, a %d heads, t %d%s): %.0f B held; "
           "Korthikanti et al.'s form for 4-byte floats without dropout, %s: %.0f B\n", c->context, B, c->emb,
           c->heads, r->tp.size, r->t.sp ? ", --sp" : "", block,
           r->t.sp ? "sbh/t (64 + 4as/h) + 16sb/t" : "sbh(16 + 48/t + 4as/(ht)) + 16sb", tp_gpt_acts_formula(&r->t, c, B));
}

// ----------------------------------------------------------------------------
// options of this program

static const CliFlag tp_flags[] = {
    {"sp", NULL, "--model gpt: sequence parallelism, the LayerNorms and residuals split by tokens"},
};
static const char* tp_flag(void* ctx, int index, const char* value) {
    (void)index, (void)value;
    *(int*)ctx = 1;
    return NULL;
}

// Refuses a layout the model cannot take, saying why (every rank alike).
static void tp_check_layout(const Options* o, int n, int sp, const char* run_line) {
    const Config* m = &o->model;
    if (sp && !is_gpt(m))
        dist_exit(2, run_line, "--sp splits by tokens the activations tensor parallelism leaves whole: the GPT's "
                  "LayerNorms and residuals; the MLP has neither (every layer's input is needed whole by its "
                  "column-parallel layer), so --sp applies to --model gpt");
    if (is_gpt(m) && m->heads % n != 0)
        dist_exit(2, run_line, "%d ranks but %d heads: tensor parallelism gives each rank whole heads (the columns of "
                  "its heads' q, k and v), so the ranks must divide --heads", n, m->heads);
    if (!is_gpt(m) && n > m->hidden)
        dist_exit(2, run_line, "%d ranks but a hidden size of %d: every rank needs at least one hidden unit "
                  "(raise --hidden or use fewer ranks)", n, m->hidden);
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    Run run = {.tp = group_world("tp")};
    int sp = 0;
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, tp_flags, 1, tp_flag, &sp);
    dist_dense_only(&o, RUN_LINE);
    tp_check_layout(&o, world_size, sp, RUN_LINE);

    // data
    load_data(&run.ds, &o, &run.cfg);
    if (world_size > run.ds.vocab)
        dist_exit(2, RUN_LINE, "%d ranks but a vocabulary of %d tokens: every rank needs at least one", world_size,
                  run.ds.vocab);

    // model: this rank's slice of every unit, its exact gradient sums and optimizer state
    Config* cfg = &run.cfg;
    int rows = pass_rows(&o, o.batch);
    tp_init(&run.t, &run.tp, cfg, rows, sp);
    long np = run.t.off[n_units(cfg)];
    run.st = state_alloc(np, o.opt.adamw);
    run.mine = (Holding){.canonical = canonical, .ctx = &run};
    GradSpan spans[MAX_LAYERS + 2];
    for (int u = 0; u < n_units(cfg); u++) {
        long off = run.t.off[u];
        run.mine.n[u] = run.t.size[u];
        run.mine.at[0][u] = run.st.params + off, run.mine.at[1][u] = run.st.m ? run.st.m + off : NULL;
        run.mine.at[2][u] = run.st.v ? run.st.v + off : NULL;
        spans[u] = (GradSpan){run.st.grads + off, tp_counted(&run.t, cfg, u)};
    }
    long start = holding_load(&run.mine, &o, &run.ds, cfg);
    tp_sizes(&run.t, cfg, &run.sizes);
    work_init(&run.work, cfg, rows, &run.sizes);
    char layout[160];
    snprintf(layout, sizeof layout, "tensor parallel over %d ranks: hidden slices of %d%s, vocabulary slices of %d",
             run.tp.size, run.t.hs, run.t.hs * run.tp.size > cfg->hidden ? " (padded)" : "", run.t.vs);
    if (is_gpt(cfg))
        snprintf(layout, sizeof layout, "tensor parallel over %d ranks: %d head%s and %d of the MLP's %d a rank, "
                 "vocabulary slices of %d%s", run.tp.size, run.t.dims.NH, run.t.dims.NH > 1 ? "s" : "", run.t.dims.F, 4 * cfg->emb, run.t.vs,
                 sp ? "; sequence parallel" : "");
    if (!o.quiet && world_rank == 0) print_config(&o, &run.ds, layout);

    // training loop
    int B = o.batch;
    Progress progress = progress_start(&o, world_rank == 0, dist_save, &(DistSave){&run.mine, &run.ds, &run.cfg}, dist_any);
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        Rows batch = training_rows(&run.ds, o.seed, step, 0);
        long n = dataset_batch_targets(&run.ds, o.seed, step, B);
        int64_t loss = forward(&run, &batch, 0, B, B, NULL); // every rank takes every row
        fix_zero(run.st.grads, np);
        backward(&run, B, B);
        float scale = clip_factor(&o.opt, spans, n_units(cfg), n, group_norm, &run.tp); // over every slice
        optimizer_step(&o.opt, run.st.params, run.st.grads, run.st.m, run.st.v, np, grad_factor(n), scale, step);
        if (step_end(&progress, step, fix_to(loss) / n, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, &o.opt, B);
    Report rep = {"train_tp.c", layout, is_gpt(cfg) ? gpt_sent_words : sent_words, is_gpt(cfg) ? gpt_mem_words : mem_words};
    free(dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run));
    if (is_gpt(cfg) && !o.quiet && world_rank == 0) print_block_activations(&run, B);
    run_free(&run);
    MPI_Finalize();
    return 0;
}

#endif // TRAIN_3D
