/*
 * train_tp.c: tensor parallel, Megatron's way. Every rank takes the whole batch and holds
 * a slice of every layer. A column-parallel linear layer (each rank computes some of its
 * outputs) feeds a row-parallel one (each rank holds the matching inputs and computes a
 * partial sum of every output), joined by two conjugate operators, f and g. t ranks, rank r:
 *
 *             f                 column-parallel               row-parallel                    g
 *   x --> [fwd: identity]  --> Y_r = x A_r --> ReLU --> Z_r = Y_r B_r  --> [fwd: all-reduce] --> Z + b
 *         [bwd: all-reduce]    A_r: slice r of A's         B_r: slice r of B's rows          [bwd: identity]
 *                              columns (and of its bias)   (the bias b whole)
 *
 *   f (Megatron's copy_to_tensor_model_parallel_region): the identity forward; backward, an
 *   all-reduce of the input gradient, which each rank computed as a partial sum over its own
 *   outputs. g (reduce_from_tensor_model_parallel_region): forward, an all-reduce of the
 *   output, a partial sum over each rank's own inputs; the identity backward. One all-reduce
 *   each way per pair of layers. The sums split across ranks are exact (kernels.h), so any t
 *   gives train.c's bits.
 *
 * What a rank holds, tensor by tensor, is a row of config.h's table; the program prints the
 * rows for its flags. In short, rank r of t:
 *   the MLP   the embedding's rows of its 1/t of the vocabulary; linear 1, 3, ...
 *             column-parallel: its columns of w and b; linear 2, 4, ... row-parallel: its rows
 *             of w, and b whole. With an even --layers the output layer is column-parallel:
 *             the logits are split by vocabulary and the loss never gathers them.
 *   the GPT   split by heads: of qkv_w [C][3C], the q, k and v columns of its NH/t heads (three
 *             column ranges, one in each third); of proj_w, the rows of those heads; of fc and
 *             fc2, 4C/t columns and rows; wte's rows and lm_head's columns by vocabulary; the
 *             LayerNorms, wpe and the two row-parallel biases whole. A block, two f and two g:
 *
 *   x  -> ln1 -> f -> qkv (its heads) -> attention (its heads) -> proj (partial) -> g -> + x  = x1
 *   x1 -> ln2 -> f -> fc (its 4C/t)   -> GELU                  -> fc2 (partial)  -> g -> + x1
 *
 * --sp, sequence parallelism (the GPT): what the above leaves whole on every rank (LayerNorms,
 * residuals) is split by tokens instead; f becomes an all-gather of the tokens, g a
 * reduce-scatter (the two halves of the all-reduce, on either side of the token-wise work).
 *
 * Sent per rank and step, in bytes (an all-reduce sends 2(t-1)/t of its buffer; finished
 * floats are 4 bytes, exact sums 8): the MLP, for a batch of R rows, 2(t-1)/t x R x (4 T E
 * for the embedding + 8 x the width of each f and g + 16 when the loss is split); the GPT,
 * N = R T tokens of width C, 2(t-1)/t x 8 N C for each of a block's four f and g. Memory:
 * 1/t of the split tensors, the whole ones, and the activations (a block's by Korthikanti
 * et al.'s form). Each term, named: "the formulas", near the end.
 *
 *   make train_tp && mpirun -n 2 ./train_tp          # the MLP: hidden and vocabulary split in 2
 *   mpirun -n 3 --oversubscribe ./train_tp --layers 2 # the logits split by vocabulary too
 *   mpirun -n 2 ./train_tp --model gpt               # the GPT, 2 of its 4 heads a rank
 *   mpirun -n 2 ./train_tp --model gpt --sp          # and sequence parallel
 *
 * Compare with ./train (--model gpt for the GPT): the same losses, names and final
 * checkpoint, whatever t. More, with the measured tables: docs/tp.md.
 *
 * Reading order: f and g and the two layers they join (the core, with the MLP's pair and the
 * GPT's block); then, each on its own: the vocabulary-parallel embedding and loss, sequence
 * parallelism (--sp), the units (with --recompute), this rank's slices and buffers, the
 * formulas, and the program. Every layer's backward is by hand (layers.h), in two halves as
 * train.c's units have it: the input gradient (I), then the weight gradients (W) from what I
 * left in a stash; the pipelines of train_3d.c run them apart, this program one after the
 * other. The sums split across ranks are exact (int64, kernels.h): the arguments named
 * K_all or J_all are the whole layer's widths, which set the exact sum's range alike in every
 * layout.
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// the strategy: f and g, and the two linear layers they join

typedef struct {
    Group* group;                   // the t ranks
    int sp;                         // --sp: sequence parallelism
    Share share;                    // this rank's slice of every unit: {rank, t} (config.h's table)
    int vs;                         // the vocabulary entries a rank holds, ceil(V / t) (padded)
    int K[MAX_LAYERS + 2];          // the MLP's linear layer l here: weight [K][J], bias [J]
    int J[MAX_LAYERS + 2];
    BlockDims dims;                 // the GPT's block here: NH/t heads, F = 4C/t of the MLP (R set by each pass)
    long size[MAX_LAYERS + 2];      // parameters of unit u here
    long off[MAX_LAYERS + 3];       // and where they start in this rank's parameters
    // buffers of a pass ("what only serves it", below)
    float* whole;                   // every token's activations: f's all-gather (--sp), the embedding's sum
    int64_t* sum;                   // exact partial sums over this rank's slice, before f or g completes them
    int64_t* by_token;              // --sp: an input gradient's partial sums, by token
    int64_t* mine_sum;              // --sp: the sums of this rank's tokens
    float* dres;                    // the GPT: the residual stream's gradient between a block's halves
    int64_t* ln_grad;               // [2][C] a LayerNorm's gradient of one pass
    float *probs, *gathered;        // sampling: the whole vocabulary's probabilities
    // train_3d.c's context axis plugs in here: attention over every context-parallel rank's
    // positions (train_3d.c's grid_attend). NULL in this program: attention over the positions held.
    void (*attend)(void* ctx, BlockActs* a);
    void (*attend_backward)(void* ctx, const BlockActs* a, const float* datty, float* dqkv);
    void* attend_ctx;
} Tp;

// The rows of a pass in the regions --sp splits: all = R (the MLP) or R Tq (the GPT's tokens);
// without --sp every rank holds all of them, with it rows [first, first + held) in shards of
// ceil(all / t) (the last one short, or empty: zeros travel in its place).
typedef struct {
    long all, shard, first, held;
} Tokens;

static const float* sp_all_gather(Tp* tp, float* mine, float* whole, int W, Tokens tok);
static void sp_reduce_scatter(Tp* tp, int64_t* sums, int64_t* mine, int W, Tokens tok);
static void sp_reduce_scatter_transposed(Tp* tp, int64_t* accT, float* dx, int W, Tokens tok);

// f (Megatron's copy_to_tensor_model_parallel_region), before a column-parallel layer.
// Forward: the identity (--sp: an all-gather of every rank's rows of `mine`, W wide, into
// `whole`). Returns the layer's whole input.
static const float* f_forward(Tp* tp, float* mine, float* whole, int W, Tokens tok) {
    if (tp->sp) return sp_all_gather(tp, mine, whole, W, tok);
    return mine;
}
// Backward: the layer's input gradient, partial sums accT [W][all] over this rank's outputs
// (transposed: linear_backward_input_partial's), completed by an all-reduce (--sp: a
// reduce-scatter, this rank's rows); dx = the float sums.
static void f_backward(Tp* tp, int64_t* accT, float* dx, int W, Tokens tok) {
    if (tp->sp) {
        sp_reduce_scatter_transposed(tp, accT, dx, W, tok);
        return;
    }
    group_allreduce(tp->group, accT, tok.all * W, MPI_INT64_T, MPI_SUM); // f backward: all-reduce
    linear_backward_input_finish(dx, accT, (int)tok.all, W);
}
// g (reduce_from_tensor_model_parallel_region), after a row-parallel layer. Forward: its
// output, partial sums `sum` [all][W] over this rank's inputs, completed by an all-reduce
// (--sp: a reduce-scatter); out = float(sum + b), rounded once.
static void g_forward(Tp* tp, int64_t* sum, const float* b, float* out, int W, Tokens tok) {
    if (tp->sp) {
        sp_reduce_scatter(tp, sum, tp->mine_sum, W, tok);
        linear_forward_finish(out, tp->mine_sum, b, (int)tok.held, W);
        return;
    }
    group_allreduce(tp->group, sum, tok.all * W, MPI_INT64_T, MPI_SUM); // g forward: all-reduce
    linear_forward_finish(out, sum, b, (int)tok.all, W);
}
// Backward: the identity (--sp: an all-gather of the output gradient's rows).
static const float* g_backward(Tp* tp, float* mine, float* whole, int W, Tokens tok) {
    if (tp->sp) return sp_all_gather(tp, mine, whole, W, tok);
    return mine;
}

// Column-parallel linear layer (Megatron's ColumnParallelLinear): y = f(x) W[:, r] + b[r],
// this rank's J of the layer's outputs, whole sums from the whole input. `x` [all][K] is
// this rank's rows of the input (every row without --sp).
static void column_parallel_forward(Tp* tp, float* y, float* x, const float* w, const float* b, int K, int J,
                                    Tokens tok, Workspace* ws) {
    const float* whole = f_forward(tp, x, tp->whole, K, tok);                 // f
    linear_forward(y, whole, w, b, (int)tok.all, K, J, ws);
}
// Its input gradient is a sum over every output of the layer (`J_all`): each rank sums over its
// own J, and f's backward completes the sums. dx: this rank's rows.
static void column_parallel_backward_input(Tp* tp, float* dx, const float* dy, const float* w, int K, int J,
                                           long J_all, Tokens tok, Workspace* ws) {
    linear_backward_input_partial(tp->sum, dy, w, (int)tok.all, K, J, J_all, ws); // over this rank's outputs
    f_backward(tp, tp->sum, dx, K, tok);                                         // f backward
}
// Its weight and bias gradients need the whole input again (--sp: gathered again: a rank
// keeps only its rows of it).
static void column_parallel_backward_weight(Tp* tp, int64_t* dw, int64_t* db, float* x, const float* dy, int K, int J,
                                            long batch, Tokens tok, Workspace* ws) {
    const float* whole = f_forward(tp, x, tp->whole, K, tok);                 // f again
    linear_backward_weight(dw, db, whole, dy, (int)tok.all, K, J, batch, ws);
}

// Row-parallel linear layer (RowParallelLinear): z = g(x[:, r] W[r, :]) + b, this rank's K
// of the layer's inputs (`K_all`) giving a partial sum of every output, completed by g; the
// bias, held whole, added once after. z: this rank's rows.
static void row_parallel_forward(Tp* tp, float* z, const float* x, const float* w, const float* b, int K, int J,
                                 long K_all, Tokens tok, Workspace* ws) {
    linear_forward_partial(tp->sum, x, w, (int)tok.all, K, J, K_all, ws);    // over this rank's inputs
    g_forward(tp, tp->sum, b, z, J, tok);                                     // g
}
// The gradient of this rank's inputs needs only its rows of W: dx = g_backward(dz) W[r, :]^T
// (g's backward: the identity; --sp: every rank's rows of dz gathered). The whole dz is kept
// in `dz_kept` for the weight gradient (the same buffer as dz will do, without --sp).
static void row_parallel_backward_input(Tp* tp, float* dx, float* dz_kept, float* dz, const float* w, int K, int J,
                                        Tokens tok, Workspace* ws) {
    const float* whole = g_backward(tp, dz, tp->whole, J, tok);              // g backward
    if (whole != dz_kept) memcpy(dz_kept, whole, (size_t)tok.all * J * sizeof(float));
    linear_backward_input(dx, dz_kept, w, (int)tok.all, K, J, ws);
}

// ----------------------------------------------------------------------------
// the strategy: the MLP, column- and row-parallel layers in pairs
//
// Linear layer l is column-parallel for odd l, row-parallel for even l (config.h's
// linear_kind): layer 1 column, layer 2 row, layer 3 column, ... and the output layer
// whichever comes next. The MLP has no --sp: its rows are whole on every rank.

static int is_column(int l) { return linear_kind(l) == COLUMN_PARALLEL; }
static int v_lo(const Tp* tp) { return tp->share.r * tp->vs; } // this rank's first vocabulary entry
static Tokens mlp_rows(int R) { return (Tokens){R, R, 0, R}; }

static void mlp_linear_forward(Tp* tp, const Config* c, int l, const float* w, float* in, float* out, int R,
                               Workspace* ws) {
    int K = tp->K[l], J = tp->J[l];
    if (is_column(l)) column_parallel_forward(tp, out, in, w, w + (long)K * J, K, J, mlp_rows(R), ws);
    else row_parallel_forward(tp, out, in, w, w + (long)K * J, K, J, linear_in(c, l), mlp_rows(R), ws);
}
// Backward, from s->dout (this rank's J outputs' gradient: its slice after a column-parallel
// layer, whole after a row-parallel one) to s->din (what the layer below holds: whole, or
// this rank's slice).
static void mlp_linear_backward_input(Tp* tp, const Config* c, int l, const float* w, Scratch* s, int R,
                                      Workspace* ws) {
    int K = tp->K[l], J = tp->J[l];
    if (is_column(l)) column_parallel_backward_input(tp, s->din, s->dout, w, K, J, linear_out(c, l), mlp_rows(R), ws);
    else row_parallel_backward_input(tp, s->din, s->dout, s->dout, w, K, J, mlp_rows(R), ws);
}

// Vocabulary-parallel embedding: rank r holds the table rows of its slice of the vocabulary,
// looks up the tokens it holds and writes zeros for the others; an all-reduce adds them
// (each position has one non-zero term, so the float sum is exact).
static void vocab_parallel_embedding_forward(Tp* tp, const Config* c, const float* w, Acts* a, int R) {
    embedding_forward(a->out[0], a->tokens, w, v_lo(tp), v_lo(tp) + tp->vs, R, c->context, c->emb);
    group_allreduce(tp->group, a->out[0], (long)R * c->context * c->emb, MPI_FLOAT, MPI_SUM);
}

// Vocabulary-parallel cross-entropy over logits split by vocabulary, this rank's J columns
// (the GPT's always; the MLP's when its last layer is column-parallel): the loss never
// gathers the logits, but all-reduces three numbers a row: the row maximum, the target's
// logit (one rank holds it, the others add zeros) and the exact sum of exponentials. When the
// last layer is row-parallel every rank holds all the logits and computes the loss alone.
// The logits become the probabilities, in place (layers.h's four steps).
static void vocab_parallel_cross_entropy(Tp* tp, const Config* c, int split, int J, Acts* a, float* logits,
                                         const int* targets, int R, long rows_total) {
    int lo = split ? v_lo(tp) : 0;
    xent_rowmax(a->rowmax, logits, R, J, lo, c->vocab);
    xent_target_logit(a->tlogit, logits, targets, R, J, lo);
    if (split) {
        group_allreduce(tp->group, a->rowmax, R, MPI_FLOAT, MPI_MAX);
        group_allreduce(tp->group, a->tlogit, R, MPI_FLOAT, MPI_SUM); // one rank holds each target
    }
    xent_expsum(a->expsum, logits, logits, a->rowmax, R, J, lo, c->vocab);
    if (split) group_allreduce(tp->group, a->expsum, R, MPI_INT64_T, MPI_SUM); // exact
    a->loss = xent_finish(logits, a->expsum, a->rowmax, a->tlogit, targets, R, J, rows_total);
}

// ----------------------------------------------------------------------------
// the strategy: the GPT, split by heads
//
// A block on this rank: its NH/t heads (qkv's columns of them, proj's rows) and 4C/t of the
// MLP (fc's columns, fc2's rows). The LayerNorms, residuals and row-parallel biases work on
// what g made whole on every rank, so every rank computes them alike and their gradients
// need no communication (with --sp they do: that section). In two halves, attention's and
// the MLP's, so that train_3d.c can put a layer of experts in place of the MLP half.

static BlockActs tp_block_acts(Tp* tp, const Acts* a, int u);
static void tp_attention_forward(Tp* tp, BlockActs* ba, Scratch* s);
static void tp_attention_backward(Tp* tp, const BlockActs* ba, const float* datty, float* dqkv, float* tmp, Scratch* s);
static void layernorm_grads(Tp* tp, int64_t* dg, int64_t* db, const float* dy, const float* x, const float* mean,
                            const float* rstd, long n, long terms);

// The attention half: from the block's input x to x1 and ln2's output.
static void tp_block_forward_attention(Tp* tp, const BlockParams* p, BlockActs* ba, const float* x, Scratch* s,
                                       Tokens tok, Workspace* ws) {
    const BlockDims* d = &tp->dims;
    int C = d->C, A = d->A;
    layernorm_forward(ba->ln1, ba->ln1_mean, ba->ln1_rstd, x, p->ln1_g, p->ln1_b, tok.held, C);
    column_parallel_forward(tp, ba->qkv, ba->ln1, p->qkv_w, p->qkv_b, C, 3 * A, tok, ws); // f; its heads' q, k, v
    tp_attention_forward(tp, ba, s);                                                     // its heads: no communication
    row_parallel_forward(tp, ba->x1, ba->atty, p->proj_w, p->proj_b, A, C, C, tok, ws);  // over its heads; g
    for (long i = 0; i < tok.held * C; i++) ba->x1[i] += x[i];                           // residual
    layernorm_forward(ba->ln2, ba->ln2_mean, ba->ln2_rstd, ba->x1, p->ln2_g, p->ln2_b, tok.held, C);
}
// The MLP half: from ln2's output to the block's output.
static void tp_block_forward_mlp(Tp* tp, const BlockParams* p, BlockActs* ba, float* out, Tokens tok,
                                 Workspace* ws) {
    int C = tp->dims.C, F = tp->dims.F;
    column_parallel_forward(tp, ba->fc, ba->ln2, p->fc_w, p->fc_b, C, F, tok, ws);       // f; its 4C/t
    gelu_forward(ba->gelu, ba->fc, tok.all * F);
    row_parallel_forward(tp, out, ba->gelu, p->fc2_w, p->fc2_b, F, C, 4L * C, tok, ws);  // over its 4C/t; g
    for (long i = 0; i < tok.held * C; i++) out[i] += ba->x1[i];                         // residual
}
static void tp_block_forward(Tp* tp, const float* w, Acts* a, int u, Scratch* s, Tokens tok, Workspace* ws) {
    BlockParams p = block_params(w, &tp->dims);
    BlockActs ba = tp_block_acts(tp, a, u);
    tp_block_forward_attention(tp, &p, &ba, a->out[u - 1], s, tok, ws);
    tp_block_forward_mlp(tp, &p, &ba, a->out[u], tok, ws);
}

// Backward, the input half, the MLP's half first: from the block's output gradient s->dout to
// ln2's output gradient st->dln2. It leaves in the stash what the weight half reads (st->dx2,
// fc2's output gradient; st->dfc, fc's; st->dln2).
static void tp_block_backward_input_mlp(Tp* tp, const BlockParams* p, const BlockActs* ba, const BlockStash* st,
                                        Scratch* s, Tokens tok, Workspace* ws) {
    int C = tp->dims.C, F = tp->dims.F;
    float* dgelu = s->tmp;
    row_parallel_backward_input(tp, dgelu, st->dx2, s->dout, p->fc2_w, F, C, tok, ws);   // g backward; its 4C/t
    gelu_backward(st->dfc, ba->fc, dgelu, tok.all * F);
    column_parallel_backward_input(tp, st->dln2, st->dfc, p->fc_w, C, F, 4L * C, tok, ws); // f backward
}
// Then attention's: from s->dout (the residual's share) and st->dln2 to the block's input
// gradient s->din, leaving st->dx1 (proj's output gradient), st->dqkv and st->dln1.
static void tp_block_backward_input_attention(Tp* tp, const BlockParams* p, const BlockActs* ba, const BlockStash* st,
                                              const float* x, Scratch* s, Tokens tok, Workspace* ws) {
    const BlockDims* d = &tp->dims;
    int C = d->C, A = d->A, F = d->F;
    float *datty = s->tmp, *small = s->tmp + tok.all * (F > A ? F : A); // attention's output gradient; its scratch
    // ln2's input gradient plus the residual's (layernorm_backward_input adds its 2nd argument)
    layernorm_backward_input(tp->dres, s->dout, st->dln2, ba->x1, ba->ln2_mean, ba->ln2_rstd, p->ln2_g, tok.held, C);
    row_parallel_backward_input(tp, datty, st->dx1, tp->dres, p->proj_w, A, C, tok, ws); // g backward; its heads
    tp_attention_backward(tp, ba, datty, st->dqkv, small, s);                               // its heads
    column_parallel_backward_input(tp, st->dln1, st->dqkv, p->qkv_w, C, 3 * A, 3L * C, tok, ws); // f backward
    layernorm_backward_input(s->din, tp->dres, st->dln1, x, ba->ln1_mean, ba->ln1_rstd, p->ln1_g, tok.held, C);
}
static void tp_block_backward_input(Tp* tp, const float* w, Acts* a, int u, Scratch* s, int R, Tokens tok,
                                    Workspace* ws) {
    BlockParams p = block_params(w, &tp->dims);
    BlockActs ba = tp_block_acts(tp, a, u);
    BlockStash st = block_stash(s->stash, &tp->dims, R);
    tp_block_backward_input_mlp(tp, &p, &ba, &st, s, tok, ws);
    tp_block_backward_input_attention(tp, &p, &ba, &st, a->out[u - 1], s, tok, ws);
}

// The weight half: this rank's slices' gradients, from the kept activations and the stash,
// and the whole tensors' (the LayerNorms'; with --sp summed over the ranks).
static void tp_block_backward_weight_mlp(Tp* tp, const BlockGrads* gg, BlockActs* ba, const BlockStash* st,
                                         Tokens tok, long terms, Workspace* ws) {
    int C = tp->dims.C, F = tp->dims.F;
    linear_backward_weight(gg->fc2_w, gg->fc2_b, ba->gelu, st->dx2, (int)tok.all, F, C, terms, ws); // row-parallel
    column_parallel_backward_weight(tp, gg->fc_w, gg->fc_b, ba->ln2, st->dfc, C, F, terms, tok, ws);
}
static void tp_block_backward_weight_attention(Tp* tp, const BlockGrads* gg, BlockActs* ba, const BlockStash* st,
                                               const float* x, Tokens tok, long terms, Workspace* ws) {
    int C = tp->dims.C, A = tp->dims.A;
    layernorm_grads(tp, gg->ln2_g, gg->ln2_b, st->dln2, ba->x1, ba->ln2_mean, ba->ln2_rstd, tok.held, terms);
    linear_backward_weight(gg->proj_w, gg->proj_b, ba->atty, st->dx1, (int)tok.all, A, C, terms, ws); // row-parallel
    column_parallel_backward_weight(tp, gg->qkv_w, gg->qkv_b, ba->ln1, st->dqkv, C, 3 * A, terms, tok, ws);
    layernorm_grads(tp, gg->ln1_g, gg->ln1_b, st->dln1, x, ba->ln1_mean, ba->ln1_rstd, tok.held, terms);
}
static void tp_block_backward_weight(Tp* tp, int64_t* g, const Acts* a, int u, const float* stash, int R, Tokens tok,
                                     long terms, Workspace* ws) {
    BlockGrads gg = block_grads(g, &tp->dims);
    BlockActs ba = tp_block_acts(tp, a, u);
    BlockStash st = block_stash((float*)stash, &tp->dims, R);
    tp_block_backward_weight_mlp(tp, &gg, &ba, &st, tok, terms, ws);
    tp_block_backward_weight_attention(tp, &gg, &ba, &st, a->out[u - 1], tok, terms, ws);
}

// The embedding: the vocabulary-parallel lookup, summed across ranks (an all-reduce; --sp: a
// reduce-scatter, leaving each rank its tokens); then each token's wpe, held whole.
static void tp_gpt_embedding_forward(Tp* tp, const Config* c, const float* w, Acts* a, int R, Tokens tok) {
    BlockDims all = tp->dims;
    all.R = R;
    int C = c->emb;
    const float* wpe = w + (long)tp->vs * C;
    gpt_embedding_forward(tp->whole, a->tokens, w, NULL, v_lo(tp), v_lo(tp) + tp->vs, 0, &all);
    if (!tp->sp) {
        group_allreduce(tp->group, tp->whole, tok.all * C, MPI_FLOAT, MPI_SUM); // vocabulary-parallel: all-reduce
        memcpy(a->out[0], tp->whole, (size_t)tok.all * C * sizeof(float));
    } else {
        memset(tp->whole + tok.all * C, 0, (size_t)(tok.shard * tp->group->size - tok.all) * C * sizeof(float));
        memset(a->out[0], 0, (size_t)tok.shard * C * sizeof(float)); // the reduce-scatter adds into it
        group_reduce_scatter(tp->group, tp->whole, tok.shard * C, MPI_FLOAT, MPI_SUM, a->out[0]); // --sp: reduce-scatter
    }
    for (long i = 0; i < tok.held; i++) // token first + i is at position (first + i) % Tq of its row
        for (int x = 0; x < C; x++)
            a->out[0][i * C + x] += wpe[(long)dims_pos(&all, (int)((tok.first + i) % all.Tq)) * C + x];
}
// Its gradients: this rank's rows of wte from every token's gradient (--sp: gathered first,
// the reduce-scatter's backward), and wpe's, the same on every rank.
static void tp_gpt_embedding_backward_weight(Tp* tp, const Config* c, int64_t* g, const Acts* a, const float* dx,
                                             int R, Tokens tok, long terms) {
    BlockDims all = tp->dims;
    all.R = R;
    const float* whole = g_backward(tp, (float*)dx, tp->whole, c->emb, tok); // --sp: all-gather
    gpt_embedding_backward(g, g + (long)tp->vs * c->emb, a->tokens, whole, v_lo(tp), v_lo(tp) + tp->vs, &all, terms);
}

// The head: ln_f (whole, or --sp this rank's tokens), lm_head column-parallel by vocabulary
// (lm_head [C][V] then ln_f's gain and bias: this rank's [C][vs], then [C], [C]), and the
// vocabulary-parallel cross-entropy over every token.
static void tp_gpt_head_forward(Tp* tp, const Config* c, const float* w, Acts* a, long rows_total, Tokens tok,
                                Workspace* ws) {
    int C = c->emb, u = c->layers + 1;
    const float *lm_head = w, *ln_f_g = w + (long)C * tp->vs, *ln_f_b = ln_f_g + C; // this rank's [C][vs]; whole
    float *ln = gpt_head_saved(c, a, 0), *mean = gpt_head_saved(c, a, 1), *rstd = gpt_head_saved(c, a, 2);
    layernorm_forward(ln, mean, rstd, a->out[u - 1], ln_f_g, ln_f_b, tok.held, C);
    column_parallel_forward(tp, a->out[u], ln, lm_head, NULL, C, tp->vs, tok, ws); // f; its vocabulary
    vocab_parallel_cross_entropy(tp, c, 1, tp->vs, a, a->out[u], a->targets, (int)tok.all, rows_total * c->context);
}
static void tp_gpt_head_backward_input(Tp* tp, const Config* c, const float* w, Acts* a, Scratch* s, Tokens tok,
                                       Workspace* ws) {
    int C = c->emb, u = c->layers + 1;
    const float *lm_head = w, *ln_f_g = w + (long)C * tp->vs;
    float *mean = gpt_head_saved(c, a, 1), *rstd = gpt_head_saved(c, a, 2);
    float *dlogits = s->stash, *dln = s->stash + tok.all * tp->vs; // the stash: both, for the weight half
    xent_backward(dlogits, a->out[u], a->targets, (int)tok.all, tp->vs, v_lo(tp));
    column_parallel_backward_input(tp, dln, dlogits, lm_head, C, tp->vs, c->vocab, tok, ws); // f backward
    layernorm_backward_input(s->din, NULL, dln, a->out[u - 1], mean, rstd, ln_f_g, tok.held, C);
}
static void tp_gpt_head_backward_weight(Tp* tp, const Config* c, int64_t* g, const Acts* a, const float* stash,
                                        Tokens tok, long terms, Workspace* ws) {
    int C = c->emb, u = c->layers + 1;
    float *ln = gpt_head_saved(c, a, 0), *mean = gpt_head_saved(c, a, 1), *rstd = gpt_head_saved(c, a, 2);
    const float *dlogits = stash, *dln = stash + tok.all * tp->vs;
    int64_t *g_lm_head = g, *g_ln_f_g = g + (long)C * tp->vs, *g_ln_f_b = g_ln_f_g + C;
    column_parallel_backward_weight(tp, g_lm_head, NULL, ln, dlogits, C, tp->vs, terms, tok, ws);
    layernorm_grads(tp, g_ln_f_g, g_ln_f_b, dln, a->out[u - 1], mean, rstd, tok.held, terms);
}

// ----------------------------------------------------------------------------
// the strategy: sequence parallelism (--sp)
//
// Korthikanti et al., 2022; Megatron's gather_from_sequence_parallel_region and
// reduce_scatter_to_sequence_parallel_region. The regions tensor parallelism leaves whole on
// every rank (LayerNorms, residuals, the block's input and output) are split by tokens: a
// rank holds tokens [first, first + held) of a pass's all = R Tq, in shards of ceil(all / t).
// f becomes an all-gather of the ranks' tokens before a column-parallel layer (backward: a
// reduce-scatter of its input gradient's partial sums), g a reduce-scatter of a row-parallel
// layer's partial sums (backward: an all-gather of the output gradient): the all-reduce's
// two halves, on either side of the token-wise work. A LayerNorm's gain and bias now see only
// a rank's tokens, so their gradients are summed over the ranks (forgetting it is the classic
// bug). As Megatron does, a rank keeps only its tokens' LayerNorm output and gathers it again
// for the weight gradient of the layer it feeds: memory 1/t, one all-gather more.

static Tokens tp_tokens(const Tp* tp, int R) {
    Tokens tok = {.all = (long)R * tp->dims.Tq};
    tok.shard = (tok.all + tp->group->size - 1) / tp->group->size;
    if (!tp->sp) return (Tokens){tok.all, tok.shard, 0, tok.all}; // every token
    tok.first = tp->share.r * tok.shard;
    long left = tok.all - tok.first; // the last shard may be short, or empty
    tok.held = left < 0 ? 0 : left < tok.shard ? left : tok.shard;
    return tok;
}
// Every rank's rows of `mine` (this rank's held, then zeros to a shard), W wide, into `whole`.
static const float* sp_all_gather(Tp* tp, float* mine, float* whole, int W, Tokens tok) {
    memset(mine + tok.held * W, 0, (size_t)(tok.shard - tok.held) * W * sizeof(float)); // a short last shard
    group_allgather(tp->group, mine, whole, tok.shard * W, MPI_FLOAT);                   // all-gather
    return whole;
}
// Partial sums of every row [all][W] (zeros to t shards) into the sums of this rank's, `mine`.
static void sp_reduce_scatter(Tp* tp, int64_t* sums, int64_t* mine, int W, Tokens tok) {
    fix_zero(sums + tok.all * W, (tok.shard * tp->group->size - tok.all) * W);
    fix_zero(mine, tok.shard * W); // dist.h's reduce-scatter adds into it
    group_reduce_scatter(tp->group, sums, tok.shard * W, MPI_INT64_T, MPI_SUM, mine); // reduce-scatter
}
// The same for a column-parallel layer's input gradient, whose partial sums come transposed
// (accT [W][all]): by token first, so that a rank's shard is contiguous; dx = the float sums
// of this rank's tokens.
static void sp_reduce_scatter_transposed(Tp* tp, int64_t* accT, float* dx, int W, Tokens tok) {
    for (long n = 0; n < tok.all; n++)
        for (int x = 0; x < W; x++) tp->by_token[n * W + x] = accT[(long)x * tok.all + n];
    sp_reduce_scatter(tp, tp->by_token, tp->mine_sum, W, tok);
    for (long i = 0; i < tok.held * W; i++) dx[i] = (float)fix_to(tp->mine_sum[i]);
}
// A LayerNorm's gain and bias gradients of this pass, exact sums over this rank's tokens (all
// of them without --sp), with --sp summed over the ranks; then added to g.
static void layernorm_grads(Tp* tp, int64_t* dg, int64_t* db, const float* dy, const float* x, const float* mean,
                            const float* rstd, long n, long terms) {
    int C = tp->dims.C;
    int64_t* mine = tp->ln_grad;
    fix_zero(mine, 2L * C);
    layernorm_backward_params(mine, mine + C, dy, x, mean, rstd, n, C, terms);
    if (tp->sp) group_allreduce(tp->group, mine, 2L * C, MPI_INT64_T, MPI_SUM); // --sp: the tokens were split
    for (int i = 0; i < C; i++) dg[i] += mine[i], db[i] += mine[C + i];
}
// A block's activations on this rank: the BlockActs of its heads and slice of F at every
// token, but with --sp its LayerNorms' outputs and statistics and x1 at its own tokens only.
static int tp_token_share(const Tp* tp);
static BlockActs tp_block_acts(Tp* tp, const Acts* a, int u) {
    return acts_block(a, u, &tp->dims, tp_token_share(tp));
}

// ----------------------------------------------------------------------------
// the strategy: the model's units on this rank's slices (train_3d.c runs these on its stages)

static void tp_unit_forward(Tp* tp, const Config* c, int u, const float* w, Acts* a, Scratch* s, int R,
                            long rows_total, Workspace* ws) {
    double t0 = trace_clock();
    tp->dims.R = R;
    if (is_gpt(c)) {
        Tokens tok = tp_tokens(tp, R);
        if (u == 0) tp_gpt_embedding_forward(tp, c, w, a, R, tok);
        else if (u <= c->layers) tp_block_forward(tp, w, a, u, s, tok, ws);
        else tp_gpt_head_forward(tp, c, w, a, rows_total, tok, ws);
    } else if (u == 0) {
        vocab_parallel_embedding_forward(tp, c, w, a, R);
    } else {
        mlp_linear_forward(tp, c, u, w, a->out[u - 1], a->out[u], R, ws);
        if (u <= c->layers) relu_forward(a->out[u], (long)R * tp->J[u]);
        else vocab_parallel_cross_entropy(tp, c, is_column(u), tp->J[u], a, a->out[u], a->targets, R, rows_total);
    }
    trace_event("compute", t0, trace_clock(), 0, "forward %s", unit_name(c, u));
}
// Backward in two halves, as model.h's unit_backward: the input half reads s->dout and writes
// the input gradient to s->din; the weight half adds this rank's parameter gradients into g.
static void tp_unit_backward_input(Tp* tp, const Config* c, int u, const float* w, Acts* a, Scratch* s, int R,
                                   Workspace* ws) {
    if (u == 0) return;
    double t0 = trace_clock();
    tp->dims.R = R;
    if (is_gpt(c) && u <= c->layers) tp_block_backward_input(tp, w, a, u, s, R, tp_tokens(tp, R), ws);
    else if (is_gpt(c)) tp_gpt_head_backward_input(tp, c, w, a, s, tp_tokens(tp, R), ws);
    else {
        if (u == c->layers + 1) xent_backward(s->dout, a->out[u], a->targets, R, tp->J[u], is_column(u) ? v_lo(tp) : 0);
        else relu_backward(s->dout, a->out[u], (long)R * tp->J[u]);
        mlp_linear_backward_input(tp, c, u, w, s, R, ws);
    }
    trace_event("compute", t0, trace_clock(), 0, "input gradient %s", unit_name(c, u));
}
static void tp_unit_backward_weight(Tp* tp, const Config* c, int u, int64_t* g, const Acts* a, const float* dout,
                                    int R, long batch, Workspace* ws) {
    double t0 = trace_clock();
    tp->dims.R = R;
    if (is_gpt(c)) {
        Tokens tok = tp_tokens(tp, R);
        long terms = batch * c->context;
        if (u == 0) tp_gpt_embedding_backward_weight(tp, c, g, a, dout, R, tok, terms);
        else if (u <= c->layers) tp_block_backward_weight(tp, g, a, u, dout, R, tok, terms, ws);
        else tp_gpt_head_backward_weight(tp, c, g, a, dout, tok, terms, ws);
    } else if (u == 0) {
        embedding_backward(g, a->tokens, dout, v_lo(tp), v_lo(tp) + tp->vs, R, c->context, c->emb, batch);
    } else { // either kind: from its own inputs and output gradient, no communication
        int K = tp->K[u], J = tp->J[u];
        linear_backward_weight(g, g + (long)K * J, a->out[u - 1], dout, R, K, J, batch, ws);
    }
    trace_event("compute", t0, trace_clock(), 0, "weight gradient %s", unit_name(c, u));
}
static void tp_unit_backward(Tp* tp, const Config* c, int u, const float* w, int64_t* g, Acts* a, Scratch* s, int R,
                             long batch, Workspace* ws) {
    tp_unit_backward_input(tp, c, u, w, a, s, R, ws);
    tp_unit_backward_weight(tp, c, u, g, a, unit_stash(c, u, s), R, batch, ws);
}

// --recompute, before unit u's backward (model.h's unit_recompute, on this rank's slices):
// selective, attention's probabilities again, from its heads' q, k and v; full, the whole
// block again from its input, f and g and their collectives included.
static void tp_unit_recompute(Tp* tp, const Config* c, int u, const float* w, Acts* a, Scratch* s, int R,
                              Workspace* ws) {
    if (c->recompute == RECOMPUTE_NONE || !is_block(c, u)) return;
    double t0 = trace_clock();
    tp->dims.R = R;
    BlockActs ba = tp_block_acts(tp, a, u);
    if (c->recompute == RECOMPUTE_FULL) tp_block_forward(tp, w, a, u, s, tp_tokens(tp, R), ws);
    else tp_attention_forward(tp, &ba, s);
    trace_event("compute", t0, trace_clock(), 0, "recompute %s", unit_name(c, u));
}

// Sampling: the whole vocabulary's probabilities of the last forward, on every rank, gathered
// from the ranks' slices (the GPT's at the position held at index `at`: the one sampled).
static const float* tp_probs(Tp* tp, const Config* c, const Acts* a, int R, int at) {
    int u = c->layers + 1;
    if (!is_gpt(c) && !is_column(u)) return a->out[u]; // a row-parallel last layer: every rank has them all
    const float* mine = a->out[u];
    if (is_gpt(c)) {
        for (int r = 0; r < R; r++)
            memcpy(tp->whole + (long)r * tp->vs, a->out[u] + ((long)r * tp->dims.Tq + at) * tp->vs, tp->vs * sizeof(float));
        mine = tp->whole;
    }
    group_allgather(tp->group, mine, tp->gathered, (long)R * tp->vs, MPI_FLOAT);
    for (int q = 0; q < tp->group->size; q++)
        for (int r = 0; r < R; r++)
            for (int v = 0; v < tp->vs && q * tp->vs + v < c->vocab; v++)
                tp->probs[(long)r * c->vocab + q * tp->vs + v] = tp->gathered[((long)q * R + r) * tp->vs + v];
    return tp->probs;
}

// Attention on this rank's heads, whole: layers.h's, on the positions held. (train_3d.c's
// context axis plugs in its own, over every context-parallel rank's positions: the hook.)
static void tp_attention_forward(Tp* tp, BlockActs* ba, Scratch* s) {
    if (tp->attend) tp->attend(tp->attend_ctx, ba);
    else attention_forward(ba->atty, ba->att, ba->qkv, &tp->dims, s->tmp, s->acc);
}
static void tp_attention_backward(Tp* tp, const BlockActs* ba, const float* datty, float* dqkv, float* tmp, Scratch* s) {
    if (tp->attend_backward) tp->attend_backward(tp->attend_ctx, ba, datty, dqkv);
    else attention_backward(dqkv, datty, ba->qkv, ba->att, ba->atty, &tp->dims, tmp, s->acc);
}

// ----------------------------------------------------------------------------
// what only serves the strategy: this rank's slices, its buffers, what it counts in the norm

// This rank's share of every unit (config.h's table gives each tensor's slice: the sizes
// here, and where each element sits in train.c's layout, for the initial values and
// checkpoints), and the buffers of a pass of up to `rows` rows.
static void tp_init(Tp* tp, Group* group, const Config* c, int rows, int sp) {
    memset(tp, 0, sizeof *tp);
    int t = group->size;
    tp->group = group, tp->sp = sp, tp->share = (Share){group->rank, t, 0, 0};
    tp->vs = (c->vocab + t - 1) / t;
    for (int u = 0; u < n_units(c); u++) {
        tp->size[u] = share_params(c, u, tp->share); // a block with experts: its own tensors (its experts: train_3d.c)
        tp->off[u + 1] = tp->off[u] + tp->size[u];
    }
    for (int l = 1; l <= c->layers + 1 && !is_gpt(c); l++) { // the MLP: linear l's weight, its table's first row
        UnitTable tab = unit_table(c, l);
        long K, J;
        tensor_held_shape(&tab.t[0], t, &K, &J);
        tp->K[l] = (int)K, tp->J[l] = (int)J;
    }
    if (!is_gpt(c)) tp->sum = mallocCheck((size_t)rows * max_width(c) * sizeof(int64_t)); // any layer's K or J
    if (is_gpt(c)) { // main, or train_3d.c's grid_resolve, checks that t divides the heads
        int C = c->emb, widest = C > tp->vs ? C : tp->vs;
        long tokens = (long)rows * c->context + t; // a pass's tokens, and a short shard's padding
        tp->dims = gpt_dims(c, rows);
        tp->dims.NH = c->heads / t, tp->dims.A = tp->dims.NH * tp->dims.HD, tp->dims.F = 4 * C / t;
        tp->whole = mallocCheck((size_t)tokens * widest * sizeof(float));
        tp->sum = mallocCheck((size_t)tokens * widest * sizeof(int64_t));
        tp->mine_sum = mallocCheck((size_t)(tokens / t + 1) * C * sizeof(int64_t));
        tp->by_token = sp ? mallocCheck((size_t)tokens * C * sizeof(int64_t)) : NULL;
        tp->dres = mallocCheck((size_t)tokens * C * sizeof(float));
        tp->ln_grad = mallocCheck(2L * C * sizeof(int64_t));
    }
    tp->probs = mallocCheck((size_t)rows * c->vocab * sizeof(float));
    tp->gathered = mallocCheck((size_t)t * rows * tp->vs * sizeof(float));
}
static void tp_free(Tp* tp) {
    free(tp->probs), free(tp->gathered);
    free(tp->whole), free(tp->sum), free(tp->by_token), free(tp->mine_sum), free(tp->dres), free(tp->ln_grad);
}
// Positions of a row this rank keeps of the per-token tensors (the residual stream, the
// LayerNorms): every one held, or with --sp its share, ceil(Tq / t) (R rows of them cover
// the ceil(R Tq / t) tokens of its shard of a pass).
static int tp_token_share(const Tp* tp) {
    return tp->sp ? (tp->dims.Tq + tp->group->size - 1) / tp->group->size : tp->dims.Tq;
}
// What each unit holds per row on this rank (model.h's UnitSizes, which size its
// activations, and a pipeline's messages and stash): a column-parallel layer's output is its
// slice; the GPT's blocks keep their heads' and slice of F's tensors, the per-token ones at
// tp_token_share positions, and the head the logits of its slice of the vocabulary.
static void tp_sizes(const Tp* tp, const Config* c, UnitSizes* sz) {
    if (is_gpt(c)) {
        gpt_unit_sizes(c, &tp->dims, tp->vs, tp_token_share(tp), sz);
        return;
    }
    for (int u = 0; u < n_units(c); u++) {
        sz->out[u] = u == 0 ? unit_width(c, 0) : (is_column(u) ? tp->J[u] : linear_out(c, u));
        sz->saved[u] = 0, sz->stash[u] = sz->out[u];
    }
}

// ----------------------------------------------------------------------------
// what only serves the strategy: the formulas, beside which the program prints what it measured
//
// Ring collectives: an all-reduce sends 2(t-1)/t of its buffer, a reduce-scatter or an
// all-gather (t-1)/t of it; finished floats travel as 4 B, exact sums as 8 B.

// The MLP's sends per step from each rank, R rows through units [u_lo, u_hi): an all-reduce
// of the embedding (floats), one of every row-parallel layer's output (g) and of every
// column-parallel layer's input gradient (f), exact sums; with the vocabulary split, the
// loss's three numbers a row (row max and target logit, floats; the sum of exponentials).
static double tp_mlp_sent_formula(const Tp* tp, const Config* c, int u_lo, int u_hi, double R) {
    double bytes = 0;
    for (int u = u_lo; u < u_hi; u++) {
        if (u == 0) bytes += 4.0 * R * c->context * c->emb;                  // the embedding
        else bytes += 8.0 * R * (is_column(u) ? linear_in(c, u) : linear_out(c, u)); // f or g
        if (u == c->layers + 1 && is_column(u)) bytes += (4 + 4 + 8) * R;   // the loss
    }
    return ring_allreduce_bytes(bytes, tp->group->size);
}
// The GPT's, N = R Tq tokens of width C: each block's four all-reduces (g twice forward, f
// twice backward; a block with experts, its attention half's two); the embedding's
// all-reduce of floats; the head's f and the loss's three all-reduces. With --sp each f and g
// becomes a reduce-scatter of exact sums and an all-gather of floats, a rank gathers its
// LayerNorms' outputs again for the weight gradients, and all-reduces their gain and bias
// gradients. With --recompute full, each block's forward runs again in backward: its two
// collectives again.
static double tp_gpt_sent_formula(const Tp* tp, const Config* c, int u_lo, int u_hi, double R) {
    double t = tp->group->size, N = R * tp->dims.Tq, C = c->emb, NC = N * C, bytes = 0;
    double all_reduce = 2 * (t - 1) / t, half = (t - 1) / t; // the share of its buffer each sends
    double f_or_g = all_reduce * 8 * NC;                       // an all-reduce of N C exact sums
    double sp_f_or_g = half * (8 + 4) * NC;                    // --sp: a reduce-scatter of them, an all-gather of floats
    double regather = half * 4 * NC;                           // --sp: a LayerNorm's output, gathered again
    double ln_grads = all_reduce * 8 * 2 * C;                  // --sp: a LayerNorm's gain and bias gradients
    double loss = all_reduce * (4 + 4 + 8) * N;                // row max, target logit, sum of exponentials
    for (int u = u_lo; u < u_hi; u++) {
        if (u == 0) bytes += tp->sp ? half * (4 + 4) * NC : all_reduce * 4 * NC; // --sp: reduce-scatter, all-gather back
        else if (u == c->layers + 1) bytes += tp->sp ? sp_f_or_g + regather + ln_grads + loss : f_or_g + loss;
        else if (tp->sp) bytes += 4 * sp_f_or_g + 2 * regather + 2 * ln_grads;
        else bytes += (is_moe(c, u) ? 2 : 4) * f_or_g;
        if (u >= 1 && u <= c->layers && c->recompute == RECOMPUTE_FULL) // the forward's f and g, again in backward
            bytes += 2 * (tp->sp ? sp_f_or_g : f_or_g);
    }
    return bytes;
}
static double tp_sent_formula(const Tp* tp, const Config* c, int u_lo, int u_hi, double R) {
    return is_gpt(c) ? tp_gpt_sent_formula(tp, c, u_lo, u_hi, R) : tp_mlp_sent_formula(tp, c, u_lo, u_hi, R);
}
// The parameters a rank holds by the textbook: 1/t of every split tensor, every whole one.
static double tp_params_formula(const Tp* tp, const Config* c, int u_lo, int u_hi) {
    double n = 0, t = tp->group->size, C = c->emb, V = c->vocab, T = c->context;
    for (int u = u_lo; u < u_hi; u++) {
        if (is_gpt(c) && u == 0) n += V * C / t + T * C;                               // wte; wpe
        else if (is_gpt(c) && u <= c->layers) n += (12 * C * C + 7 * C) / t + 6 * C;  // qkv, proj, fc, fc2 and
        else if (is_gpt(c)) n += C * V / t + 2 * C;                                    // qkv's, fc's biases; the rest
        else if (u == 0) n += (double)c->vocab * c->emb / t;
        else if (is_column(u)) n += ((double)linear_in(c, u) * linear_out(c, u) + linear_out(c, u)) / t;
        else n += (double)linear_in(c, u) * linear_out(c, u) / t + linear_out(c, u);   // the bias whole
    }
    return n;
}
// The activations the GPT's blocks hold on this rank for R rows, in bytes, as tp_sizes lays
// them out and model.h's acts_init keeps them: each block's output (the next one's input),
// what each keeps, and with --recompute the one block's room they share.
static double tp_gpt_blocks_held(const Config* c, const UnitSizes* sz, int R) {
    double outs = 0;
    for (int u = 1; u <= c->layers; u++) outs += sz->out[u];
    return 4.0 * R * (outs + acts_saved_per_row(c, 1, c->layers + 1, sz));
}
// The same by Korthikanti et al.'s closed forms, a block's and (*room) the room
// recomputation shares: s positions, b rows, h = C, a heads, t ranks. The paper counts
// 2-byte activations with dropout: sbh(34 + 5as/h) on one rank, sbh(10 + 24/t + 5as/(ht))
// with tensor parallelism, sbh/t (34 + 5as/h) with sequence parallelism too. Here
// activations are 4-byte floats and there is no dropout: drop the two dropout masks (sbh
// each, 1 B), the dropout's output on the scores (2as^2b) and its mask (as^2b), and double
// every 2-byte term: sbh(64 + 4as/h), sbh(16 + 48/t + 4as/(ht)), sbh/t (64 + 4as/h); and add
// what the paper leaves out, LayerNorm's mean and rstd (16 B a token: 16sb, or 16sb/t).
// docs/tp.md goes through them term by term. Recomputation, as the paper has it: selective
// keeps everything but attention's probabilities, the 4as/(ht) term (4as^2b/t bytes), which
// one block's room then holds; full keeps only the block's input, 4sbh (4sbh/t with --sp; the
// paper's 2sbh in 2 bytes), and one block's room holds the rest while it is recomputed.
static double tp_gpt_acts_formula(const Tp* tp, const Config* c, int R, double* room) {
    double s = c->context, b = R, h = c->emb, a = c->heads, t = tp->group->size;
    double block = tp->sp ? s * b * h / t * (64 + 4 * a * s / h) + 16 * s * b / t
                          : s * b * h * (16 + 48 / t + 4 * a * s / (h * t)) + 16 * s * b;
    double probs = 4 * a * s * s * b / t, input = 4 * s * b * h / (tp->sp ? t : 1);
    *room = c->recompute == RECOMPUTE_SELECTIVE ? probs : c->recompute == RECOMPUTE_FULL ? block - input : 0;
    return c->recompute == RECOMPUTE_SELECTIVE ? block - probs : c->recompute == RECOMPUTE_FULL ? input : block;
}

#ifndef TRAIN_3D // the rest of this file is the program; train_3d.c uses only what is above

#define RUN_LINE "mpirun -n 2 ./train_tp"

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    Dataset ds;      // the data
    Tp tp;
    State st;        // this rank's slices of every unit, their exact gradient sums and optimizer state
    UnitSizes sizes; // what each unit holds per row on this rank (tp_sizes)
    Work work;
    Group group;     // every rank
    Holding mine;    // what this rank holds of the model, for checkpoints
} Run;

static void run_free(Run* r) {
    dataset_free(&r->ds), state_free(&r->st), tp_free(&r->tp), work_free(&r->work);
}

// ----------------------------------------------------------------------------
// the forward and backward passes: every rank takes every row, through its slices

static int64_t forward(void* ctx, const Rows* rows, long first, int R, long rows_total, float* probs) {
    Run* r = ctx;
    const Config* c = &r->cfg;
    Acts* a = work_load(&r->work, rows, first, R, c->context);
    for (int u = 0; u < n_units(c); u++)
        tp_unit_forward(&r->tp, c, u, r->st.params + r->tp.off[u], a, &r->work.scratch, R, rows_total, &r->work.ws);
    if (probs) memcpy(probs, tp_probs(&r->tp, c, a, R, rows->pos), (size_t)R * c->vocab * sizeof(float));
    return a->loss; // every rank holds the whole loss
}
static void backward(Run* r, int R, long B) {
    for (int u = n_units(&r->cfg) - 1; u >= 0; u--) {
        const float* w = r->st.params + r->tp.off[u];
        tp_unit_recompute(&r->tp, &r->cfg, u, w, &r->work.acts, &r->work.scratch, R, &r->work.ws); // --recompute
        tp_unit_backward(&r->tp, &r->cfg, u, w, r->st.grads + r->tp.off[u], &r->work.acts, &r->work.scratch, R, B,
                         &r->work.ws);
        scratch_step_down(&r->work.scratch);
    }
}

// Mean loss over the whole validation split (every rank takes every row).
static double validation_loss(void* ctx) {
    Run* r = ctx;
    return mean_loss(evaluate(forward, r, &r->ds, 1, 0), &r->ds);
}

// The formulas of figures(), in words, for the report (t ranks).
static const char sent_words[] = "2(t-1)/t x (4 B x B x T x E + 8 B x B x (every split sum's width))";
static const char mem_words[] = "(4 + 8 + 8 AdamW) B x (P/t + the row-parallel biases) + activations";
static const char gpt_sent_words[] = "2(t-1)/t x (4 B x BTC + 4 x 8 B x BTC a block + 8 B x BTC + 16 B x BT), with "
                                     "--sp a reduce-scatter and an all-gather for each (train_tp.c)";
static const char gpt_mem_words[] = "(4 + 8 + 8 AdamW) B x (P split / t + P whole) + activations";

// What this rank sent and holds, each beside its formula: every rank takes every row, and a
// column-parallel layer's activations are its slice. The GPT's activations: the blocks' by
// Korthikanti et al.'s form (tp_gpt_acts_formula), the rest as held.
static Figures figures(const Run* r, const Progress* pr, const Optimizer* opt, int B) {
    const Config* c = &r->cfg;
    long np = r->st.n;
    double acts_row = acts_bytes_per_row(c, 0, n_units(c), &r->sizes), opt_bytes = opt->adamw ? 8.0 : 0.0;
    Figures f = {.sent = per_step(pr, r->group.sent), .received = per_step(pr, r->group.received), .params = 4.0 * np,
                 .grads = 8.0 * np, .optim = opt_bytes * np, .acts = B * acts_row, .bubble = -1};
    double acts_formula = B * acts_row, room;
    if (is_gpt(c)) // the blocks' by the paper's form, the rest as held
        acts_formula += c->layers * tp_gpt_acts_formula(&r->tp, c, B, &room) + room - tp_gpt_blocks_held(c, &r->sizes, B);
    double clip = opt->clip > 0 ? ring_allreduce_bytes(4 + 8, r->group.size) : 0; // the norm's max and sum of squares
    f.sent_formula = tp_sent_formula(&r->tp, c, 0, n_units(c), B) + clip;
    f.mem_formula = (4.0 + 8.0 + opt_bytes) * tp_params_formula(&r->tp, c, 0, n_units(c)) + acts_formula;
    return f;
}

// The GPT: the blocks' activations on this rank, held beside the paper's form, for the report.
static void print_block_activations(const Run* r, int B) {
    const Config* c = &r->cfg;
    double room, block = tp_gpt_acts_formula(&r->tp, c, B, &room);
    printf("activations of the %d blocks per rank (s %d positions, b %d rows, h %d, a %d heads, t %d%s%s%s): %.0f B "
           "held; Korthikanti et al.'s form for 4-byte floats without dropout, %s a block%s: %.0f B\n", c->layers,
           c->context, B, c->emb, c->heads, r->group.size, r->tp.sp ? ", --sp" : "", c->recompute ? ", --recompute " : "",
           c->recompute ? recompute_names[c->recompute] : "", tp_gpt_blocks_held(c, &r->sizes, B),
           c->recompute == RECOMPUTE_FULL ? (r->tp.sp ? "4sbh/t" : "4sbh")
           : c->recompute == RECOMPUTE_SELECTIVE ? (r->tp.sp ? "64sbh/t + 16sb/t" : "sbh(16 + 48/t) + 16sb")
           : r->tp.sp ? "sbh/t (64 + 4as/h) + 16sb/t" : "sbh(16 + 48/t + 4as/(ht)) + 16sb",
           c->recompute ? ", + one block's room" : "", c->layers * block + room);
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
static void tp_check_layout(const Options* o, int t, int sp, const char* run_line) {
    const Config* m = &o->model;
    if (sp && !is_gpt(m))
        dist_exit(2, run_line, "--sp splits by tokens the activations tensor parallelism leaves whole: the GPT's "
                  "LayerNorms and residuals; the MLP has neither (every layer's input is needed whole by its "
                  "column-parallel layer), so --sp applies to --model gpt");
    if (is_gpt(m) && m->heads % t != 0)
        dist_exit(2, run_line, "%d ranks but %d heads: tensor parallelism gives each rank whole heads (the columns of "
                  "its heads' q, k and v), so the ranks must divide --heads", t, m->heads);
    if (!is_gpt(m) && t > m->hidden)
        dist_exit(2, run_line, "%d ranks but a hidden size of %d: every rank needs at least one hidden unit "
                  "(raise --hidden or use fewer ranks)", t, m->hidden);
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    Run run = {.group = group_world("tp")};
    int sp = 0;
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, tp_flags, 1, tp_flag, &sp);
    dist_dense_only(&o, RUN_LINE);
    tp_check_layout(&o, world_size, sp, RUN_LINE);

    // data
    load_data(&run.ds, &o, &run.cfg);
    if (world_size > run.ds.vocab)
        dist_exit(2, RUN_LINE, "%d ranks but a vocabulary of %d tokens: every rank needs at least one", world_size,
                  run.ds.vocab);

    // model: this rank's slice of every unit (config.h's table), its exact gradient sums and
    // optimizer state, filled with train.c's initial values (or --load's) by the table's mapper
    Config* cfg = &run.cfg;
    int rows = pass_rows(&o, (o.batch + o.microbatches - 1) / o.microbatches); // a microbatch, or an eval pass
    tp_init(&run.tp, &run.group, cfg, rows, sp);
    long np = run.tp.off[n_units(cfg)];
    run.st = state_alloc(np, o.opt.adamw);
    GradSpan spans[MAX_LAYERS + 2]; // what this rank counts in the norm: whole tensors on rank 0 only
    for (int u = 0; u < n_units(cfg); u++) {
        long off = run.tp.off[u];
        run.mine.n[u] = run.tp.size[u], run.mine.share[u] = run.tp.share;
        run.mine.at[0][u] = run.st.params + off, run.mine.at[1][u] = run.st.m ? run.st.m + off : NULL;
        run.mine.at[2][u] = run.st.v ? run.st.v + off : NULL;
        spans[u] = (GradSpan){run.st.grads + off, share_counted(cfg, u, run.tp.share)};
    }
    long start = holding_load(&run.mine, &o, &run.ds, cfg);
    tp_sizes(&run.tp, cfg, &run.sizes);
    work_init(&run.work, cfg, rows, &run.sizes);
    char layout[160];
    snprintf(layout, sizeof layout, "tensor parallel over %d ranks: hidden slices of %d%s, vocabulary slices of %d",
             run.group.size, run.tp.J[1], run.tp.J[1] * run.group.size > cfg->hidden ? " (padded)" : "", run.tp.vs);
    if (is_gpt(cfg))
        snprintf(layout, sizeof layout, "tensor parallel over %d ranks: %d head%s and %d of the MLP's %d a rank, "
                 "vocabulary slices of %d%s", run.group.size, run.tp.dims.NH, run.tp.dims.NH > 1 ? "s" : "",
                 run.tp.dims.F, 4 * cfg->emb, run.tp.vs, sp ? "; sequence parallel" : "");
    if (!o.quiet && world_rank == 0) {
        print_config(&o, &run.ds, layout);
        table_print(cfg, run.group.size);
    }

    // training loop
    int B = o.batch, M = o.microbatches;
    Progress progress = progress_start(&o, world_rank == 0, dist_save, &(DistSave){&run.mine, &run.ds, &run.cfg}, dist_any);
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        Rows batch = training_rows(&run.ds, o.seed, step, 0);
        long n = dataset_batch_targets(&run.ds, o.seed, step, B);
        int64_t loss = 0;
        fix_zero(run.st.grads, np);
        workspace_keep_weights(&run.work.ws, M > 1);
        for (int m = 0; m < M; m++) { // --microbatches: every rank takes every row of each, in turn
            long first, end;
            split_range(B, M, m, &first, &end);
            loss += forward(&run, &batch, first, (int)(end - first), B, NULL);
            backward(&run, (int)(end - first), B);
        }
        workspace_keep_weights(&run.work.ws, 0);
        float scale = clip_factor(&o.opt, spans, n_units(cfg), n, group_norm, &run.group); // over every slice
        optimizer_step(&o.opt, run.st.params, run.st.grads, run.st.m, run.st.v, np, grad_factor(n), scale, step);
        if (step_end(&progress, step, fix_to(loss) / n, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, &o.opt, (B + M - 1) / M); // a microbatch's activations
    Report rep = {"train_tp.c", layout, is_gpt(cfg) ? gpt_sent_words : sent_words, is_gpt(cfg) ? gpt_mem_words : mem_words};
    free(dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run));
    if (is_gpt(cfg) && !o.quiet && world_rank == 0) print_block_activations(&run, (B + M - 1) / M);
    run_free(&run);
    MPI_Finalize();
    return 0;
}

#endif // TRAIN_3D
