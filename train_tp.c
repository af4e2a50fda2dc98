/*
 * train_tp.c: tensor parallel, Megatron's way. Every rank takes the whole batch and holds
 * a slice of every layer. A column-parallel linear layer (each rank computes some of its
 * outputs) feeds a row-parallel one (each rank holds the matching inputs and computes a
 * partial sum of every output). Two conjugate operators join them, f and g. t ranks, rank r:
 *
 *             f                 column-parallel               row-parallel                    g
 *   x --> [fwd: identity]  --> Y_r = x A_r --> ReLU --> Z_r = Y_r B_r  --> [fwd: all-reduce] --> Z + b
 *         [bwd: all-reduce]    A_r: slice r of A's         B_r: slice r of B's rows          [bwd: identity]
 *                              columns (and of its bias)   (the bias b whole)
 *
 * f is Megatron's copy_to_tensor_model_parallel_region, g its
 * reduce_from_tensor_model_parallel_region: one all-reduce each way per pair of layers. The sums
 * split across ranks are exact (kernels.h), so any t gives train.c's bits.
 *
 * The MLP's linear layers alternate column, row, column, ... and the output layer takes
 * whichever comes next. The embedding and, when the output layer is column-parallel, the
 * logits are split by vocabulary, so the loss never gathers the logits. The GPT splits each
 * block by heads, two f and two g a block (config.h's table lists every tensor's slice):
 *
 *   x  -> ln1 -> f -> qkv (its heads) -> attention (its heads) -> proj (partial) -> g -> + x  = x1
 *   x1 -> ln2 -> f -> fc (its 4C/t)   -> GELU                  -> fc2 (partial)  -> g -> + x1
 *
 *   make train_tp && mpirun -n 2 ./train_tp          # the MLP: hidden and vocabulary split in 2
 *   mpirun -n 2 ./train_tp --model gpt               # the GPT, 2 of its 4 heads a rank
 *   mpirun -n 2 ./train_tp --model gpt --sp          # and sequence parallel
 *
 * Compare with ./train (--model gpt for the GPT): the same losses, names and final
 * checkpoint, whatever t. The measured tables are in docs/tp.md. After the first read come
 * --sp, recomputation, microbatches and the formulas of what is sent and held.
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// what a rank holds

// A pass's rows in the regions --sp splits: `all` rows (the MLP's R, or the GPT's R Tq tokens),
// of which this rank holds [first, first + held) in shards of `shard`. Without --sp it holds all.
typedef struct { long all, shard, first, held; } Tokens;

// A tensor-parallel linear layer on this rank: y = x w + b with w [in][out].
// The whole widths set the range of an exact sum alike in every layout.
typedef struct {
    const float *w, *b;       // this rank's slice (b may be NULL)
    int in, out;              // the widths held
    long in_whole, out_whole; // the whole layer's widths
} TpLinear;

typedef struct Tp Tp;
// The collectives of a pass, chosen once by tp_init: tensor parallelism's below, or --sp's.
typedef struct {
    const float* (*f_forward)(Tp* tp, float* x, int W);
    void (*f_backward)(Tp* tp, int64_t* accT, float* dx, int W);
    void (*g_forward)(Tp* tp, int64_t* sum, const float* b, float* z, int W);
    const float* (*g_backward)(Tp* tp, float* dz, int W);
    void (*embedding_sum)(Tp* tp, float* out, int W);
    void (*layernorm_sum)(Tp* tp, int64_t* grads, int C);
} TpOps;

// Scratch buffers of a pass (tp_init sizes them).
typedef struct {
    float* whole;      // every token's activations: f's all-gather (--sp), the embedding's sum
    int64_t* sum;      // exact partial sums over this rank's slice, before f or g completes them
    int64_t* by_token; // --sp: an input gradient's partial sums, by token
    int64_t* mine_sum; // --sp: the sums of this rank's tokens
    float* dres;       // the GPT: the residual stream's gradient between a block's halves
    int64_t* ln_grad;  // [2][C]: a LayerNorm's gradient of one pass
    float *probs, *gathered; // sampling: the whole vocabulary's probabilities
} TpBuffers;

typedef struct TpHooks TpHooks; // train_3d.c's context axis's attention, in place of this rank's (below)
struct Tp {
    Group* group;              // the t ranks
    int sp;                    // --sp: sequence parallelism
    Share share;               // this rank's slice of every unit: {rank, t} (config.h's table)
    int vs;                    // the vocabulary entries a rank holds, ceil(V / t)
    int K[MAX_LAYERS + 2], J[MAX_LAYERS + 2]; // the MLP's linear layer l here: weight [K][J], bias [J]
    BlockDims dims;            // the GPT's block here: NH/t heads, F = 4C/t of the MLP
    long size[MAX_LAYERS + 2]; // the parameters of unit u here
    long off[MAX_LAYERS + 3];  // and where they start in this rank's parameters
    TpOps op;
    // the pass at hand (tp_pass): its tokens, its workspace, and `terms`, the batch's rows (the
    // MLP) or tokens (the GPT) that every mean is over
    struct { Tokens tok; long terms; Workspace* ws; } pass;
    TpBuffers buf;
    const TpHooks* hooks; // NULL: attention on the positions held, here
};

// ----------------------------------------------------------------------------
// f and g

// f comes before a column-parallel layer and g after a row-parallel one. f's forward and g's
// backward are the identity, because every rank holds the whole tensor.
static const float* identity(Tp* tp, float* x, int W) {
    (void)tp, (void)W;
    return x;
}
// Each rank's input gradient is a partial sum over its own outputs, so f's backward adds them.
static void f_backward(Tp* tp, int64_t* accT, float* dx, int W) {
    Tokens tok = tp->pass.tok;
    group_allreduce(tp->group, accT, tok.all * W, MPI_INT64_T, MPI_SUM); // f backward: all-reduce
    linear_backward_input_finish(dx, accT, (int)tok.all, W);
}
// Each rank's output of a row-parallel layer is a partial sum over its own inputs, so g's
// forward adds them. The bias is added once the sum is whole, and rounded to float once.
static void g_forward(Tp* tp, int64_t* sum, const float* b, float* z, int W) {
    Tokens tok = tp->pass.tok;
    group_allreduce(tp->group, sum, tok.all * W, MPI_INT64_T, MPI_SUM); // g forward: all-reduce
    linear_forward_finish(z, sum, b, (int)tok.all, W);
}

// ----------------------------------------------------------------------------
// column- and row-parallel layers

// Megatron's ColumnParallelLinear: this rank's L->out outputs, from the whole input.
static void column_parallel_forward(Tp* tp, const TpLinear* L, float* y, float* x) {
    const float* whole = tp->op.f_forward(tp, x, L->in);
    linear_forward(y, whole, L->w, L->b, (int)tp->pass.tok.all, L->in, L->out, tp->pass.ws);
}
static void column_parallel_backward_input(Tp* tp, const TpLinear* L, float* dx, const float* dy) {
    linear_backward_input_partial(tp->buf.sum, dy, L->w, (int)tp->pass.tok.all, L->in, L->out, L->out_whole,
                                  tp->pass.ws);
    tp->op.f_backward(tp, tp->buf.sum, dx, L->in);
}
// The weight gradient needs the whole input again (with --sp it is gathered again).
static void column_parallel_backward_weight(Tp* tp, const TpLinear* L, int64_t* dw, int64_t* db, float* x,
                                            const float* dy) {
    const float* whole = tp->op.f_forward(tp, x, L->in);
    linear_backward_weight(dw, db, whole, dy, (int)tp->pass.tok.all, L->in, L->out, tp->pass.terms, tp->pass.ws);
}

// RowParallelLinear: a partial sum of every output over this rank's inputs, completed by g.
static void row_parallel_forward(Tp* tp, const TpLinear* L, float* z, const float* x) {
    linear_forward_partial(tp->buf.sum, x, L->w, (int)tp->pass.tok.all, L->in, L->out, L->in_whole, tp->pass.ws);
    tp->op.g_forward(tp, tp->buf.sum, L->b, z, L->out);
}
// This rank's inputs' gradient needs only its rows of w. The whole dz is kept in dz_kept for
// the weight gradient (without --sp, dz itself).
static void row_parallel_backward_input(Tp* tp, const TpLinear* L, float* dx, float* dz_kept, float* dz) {
    const float* whole = tp->op.g_backward(tp, dz, L->out);
    if (whole != dz_kept) memcpy(dz_kept, whole, (size_t)tp->pass.tok.all * L->out * sizeof(float));
    linear_backward_input(dx, dz_kept, L->w, (int)tp->pass.tok.all, L->in, L->out, tp->pass.ws);
}
// Its own inputs and output gradient are all a row-parallel layer's weights need.
static void row_parallel_backward_weight(Tp* tp, const TpLinear* L, int64_t* dw, int64_t* db, const float* x,
                                         const float* dy) {
    linear_backward_weight(dw, db, x, dy, (int)tp->pass.tok.all, L->in, L->out, tp->pass.terms, tp->pass.ws);
}

// ----------------------------------------------------------------------------
// the MLP: column- and row-parallel layers in pairs

static int is_column(int l) { return linear_kind(l) == COLUMN_PARALLEL; } // odd l (config.h)
static int v_lo(const Tp* tp) { return tp->share.r * tp->vs; }           // this rank's first vocabulary entry

static TpLinear mlp_linear(const Tp* tp, const Config* c, int l, const float* w) {
    int K = tp->K[l], J = tp->J[l];
    return (TpLinear){.w = w, .b = w + (long)K * J, .in = K, .out = J,
                      .in_whole = linear_in(c, l), .out_whole = linear_out(c, l)};
}
static void mlp_linear_forward(Tp* tp, const Config* c, int l, const float* w, float* in, float* out) {
    TpLinear L = mlp_linear(tp, c, l, w);
    if (is_column(l)) column_parallel_forward(tp, &L, out, in);
    else row_parallel_forward(tp, &L, out, in);
}
// From s->dout (this rank's slice after a column-parallel layer, whole after a row-parallel
// one) to s->din, in the form the layer below holds.
static void mlp_linear_backward_input(Tp* tp, const Config* c, int l, const float* w, Scratch* s) {
    TpLinear L = mlp_linear(tp, c, l, w);
    if (is_column(l)) column_parallel_backward_input(tp, &L, s->din, s->dout);
    else row_parallel_backward_input(tp, &L, s->din, s->dout, s->dout);
}

// ----------------------------------------------------------------------------
// the vocabulary-parallel embedding and loss

// A rank looks up the tokens of its slice of the vocabulary and writes zeros for the others.
// Each position then has one non-zero term, so the all-reduce's float sum is exact.
static void vocab_parallel_embedding_forward(Tp* tp, const Config* c, const float* w, Acts* a, int R) {
    embedding_forward(a->out[0], a->tokens, w, v_lo(tp), v_lo(tp) + tp->vs, R, c->context, c->emb);
    group_allreduce(tp->group, a->out[0], (long)R * c->context * c->emb, MPI_FLOAT, MPI_SUM);
}

// The loss over logits split by vocabulary never gathers them: it all-reduces three numbers a
// row, the maximum, the target's logit (held by one rank) and the exact sum of exponentials.
// When the last layer is row-parallel (split = 0) every rank holds all the logits.
static void vocab_parallel_cross_entropy(Tp* tp, const Config* c, Acts* a, int split, int J, int R) {
    float* logits = a->out[c->layers + 1];
    int lo = split ? v_lo(tp) : 0;
    xent_rowmax(a->rowmax, logits, R, J, lo, c->vocab);
    xent_target_logit(a->tlogit, logits, a->targets, R, J, lo);
    if (split) group_allreduce(tp->group, a->rowmax, R, MPI_FLOAT, MPI_MAX);
    if (split) group_allreduce(tp->group, a->tlogit, R, MPI_FLOAT, MPI_SUM);
    xent_expsum(a->expsum, logits, logits, a->rowmax, R, J, lo, c->vocab);
    if (split) group_allreduce(tp->group, a->expsum, R, MPI_INT64_T, MPI_SUM);
    a->loss = xent_finish(logits, a->expsum, a->rowmax, a->tlogit, a->targets, R, J, tp->pass.terms);
}

// ----------------------------------------------------------------------------
// the GPT's block, split by heads
//
// A rank holds NH/t heads (qkv's columns of them, proj's rows) and 4C/t of the MLP (fc's
// columns, fc2's rows). The LayerNorms and residuals work on what g made whole, so every rank
// computes them alike. The block comes in two halves so that train_3d.c can put a layer of
// experts in place of the MLP half.

static BlockActs tp_block_acts(Tp* tp, const Acts* a, int u);
static void tp_attention_forward(Tp* tp, BlockActs* ba, Scratch* s);
static void tp_attention_backward(Tp* tp, const BlockActs* ba, const float* datty, float* dqkv, float* tmp, Scratch* s);
static void layernorm_grads(Tp* tp, int64_t* dg, int64_t* db, const float* dy, const float* x, const float* mean,
                            const float* rstd);

// The block's four linear layers on this rank. The weight half passes `none`: it needs only widths.
typedef struct { TpLinear qkv, proj, fc, fc2; } TpLayers;
static TpLayers block_layers(const BlockDims* d, const BlockParams* p) {
    return (TpLayers){
        .qkv = {.w = p->qkv_w, .b = p->qkv_b, .in = d->C, .out = 3 * d->A, .in_whole = d->C, .out_whole = 3L * d->C},
        .proj = {.w = p->proj_w, .b = p->proj_b, .in = d->A, .out = d->C, .in_whole = d->C, .out_whole = d->C},
        .fc = {.w = p->fc_w, .b = p->fc_b, .in = d->C, .out = d->F, .in_whole = d->C, .out_whole = 4L * d->C},
        .fc2 = {.w = p->fc2_w, .b = p->fc2_b, .in = d->F, .out = d->C, .in_whole = 4L * d->C, .out_whole = d->C}};
}

// The attention half: from the block's input x to x1 and ln2's output.
static void tp_block_forward_attention(Tp* tp, const BlockParams* p, BlockActs* ba, const float* x, Scratch* s) {
    int C = tp->dims.C;
    long held = tp->pass.tok.held;
    TpLayers L = block_layers(&tp->dims, p);
    layernorm_forward(ba->ln1, ba->ln1_mean, ba->ln1_rstd, x, p->ln1_g, p->ln1_b, held, C);
    column_parallel_forward(tp, &L.qkv, ba->qkv, ba->ln1); // f: its heads' q, k and v
    tp_attention_forward(tp, ba, s);                    // its heads: no communication
    row_parallel_forward(tp, &L.proj, ba->x1, ba->atty);  // over its heads; g
    for (long i = 0; i < held * C; i++) ba->x1[i] += x[i];
    layernorm_forward(ba->ln2, ba->ln2_mean, ba->ln2_rstd, ba->x1, p->ln2_g, p->ln2_b, held, C);
}
// Then the MLP half, from ln2's output to the block's output.
static void tp_block_forward(Tp* tp, const float* w, Acts* a, int u, Scratch* s) {
    BlockParams p = block_params(w, &tp->dims);
    BlockActs ba = tp_block_acts(tp, a, u);
    TpLayers L = block_layers(&tp->dims, &p);
    float* out = a->out[u];
    tp_block_forward_attention(tp, &p, &ba, a->out[u - 1], s);
    column_parallel_forward(tp, &L.fc, ba.fc, ba.ln2); // f: its 4C/t
    gelu_forward(ba.gelu, ba.fc, tp->pass.tok.all * L.fc.out);
    row_parallel_forward(tp, &L.fc2, out, ba.gelu);    // over its 4C/t; g
    for (long i = 0; i < tp->pass.tok.held * tp->dims.C; i++) out[i] += ba.x1[i];
}

// Backward comes in two halves, as train.c's units have it: the input gradient first, which
// leaves in the stash (st) what the weight gradients then read. Attention's input half, from
// ln2's output gradient to the block's input gradient s->din:
static void tp_block_backward_input_attention(Tp* tp, const BlockParams* p, const BlockActs* ba,
                                              const BlockStash* st, const float* x, Scratch* s) {
    const BlockDims* d = &tp->dims;
    int C = d->C, A = d->A, F = d->F;
    long held = tp->pass.tok.held;
    TpLayers L = block_layers(&tp->dims, p);
    float *datty = s->tmp, *small = s->tmp + tp->pass.tok.all * (F > A ? F : A); // attention's scratch after datty
    // layernorm_backward_input adds its second argument: here, the residual's gradient.
    layernorm_backward_input(tp->buf.dres, s->dout, st->dln2, ba->x1, ba->ln2_mean, ba->ln2_rstd, p->ln2_g, held, C);
    row_parallel_backward_input(tp, &L.proj, datty, st->dx1, tp->buf.dres); // g backward
    tp_attention_backward(tp, ba, datty, st->dqkv, small, s);
    column_parallel_backward_input(tp, &L.qkv, st->dln1, st->dqkv);         // f backward
    layernorm_backward_input(s->din, tp->buf.dres, st->dln1, x, ba->ln1_mean, ba->ln1_rstd, p->ln1_g, held, C);
}
// The MLP's half runs first.
static void tp_block_backward_input(Tp* tp, const float* w, Acts* a, int u, Scratch* s) {
    BlockParams p = block_params(w, &tp->dims);
    BlockActs ba = tp_block_acts(tp, a, u);
    BlockStash st = block_stash(s->stash, &tp->dims, tp->dims.R);
    TpLayers L = block_layers(&tp->dims, &p);
    float* dgelu = s->tmp;
    row_parallel_backward_input(tp, &L.fc2, dgelu, st.dx2, s->dout); // g backward
    gelu_backward(st.dfc, ba.fc, dgelu, tp->pass.tok.all * L.fc.out);
    column_parallel_backward_input(tp, &L.fc, st.dln2, st.dfc);     // f backward
    tp_block_backward_input_attention(tp, &p, &ba, &st, a->out[u - 1], s);
}

// The weight half, after the first read: each slice's gradients, with no communication but --sp's.
static void tp_block_backward_weight(Tp* tp, int64_t* g, const Acts* a, int u, const float* stash);

static void tp_unit_forward(Tp* tp, const Config* c, int u, const float* w, Acts* a, Scratch* s);
static void tp_unit_recompute(Tp* tp, const Config* c, int u, const float* w, Acts* a, Scratch* s);
static void tp_unit_backward_input(Tp* tp, const Config* c, int u, const float* w, Acts* a, Scratch* s);
static void tp_unit_backward_weight(Tp* tp, const Config* c, int u, int64_t* g, const Acts* a, const float* dout);
static Tokens tp_pass(Tp* tp, const Config* c, int R, long batch, Workspace* ws);
static const float* tp_probs(Tp* tp, const Config* c, const Acts* a, int R, int at);

#ifndef TRAIN_3D
// ----------------------------------------------------------------------------
// one training step: every rank takes every row, through its slices

typedef struct {
    Config cfg;
    Dataset ds;
    Tp tp;
    State st;        // this rank's slices of every unit, their exact gradient sums and optimizer state
    UnitSizes sizes; // what each unit holds per row on this rank (tp_sizes)
    Work work;
    Group group;     // every rank
    Holding mine;    // what this rank holds of the model, for checkpoints
    GradSpan spans[MAX_LAYERS + 2]; // what this rank counts in the gradient norm
} Run;

static int64_t forward(void* ctx, const Rows* rows, long first, int R, long batch, float* probs) {
    Run* r = ctx;
    const Config* c = &r->cfg;
    Acts* a = work_load(&r->work, rows, first, R, c->context);
    tp_pass(&r->tp, c, R, batch, &r->work.ws);
    for (int u = 0; u < n_units(c); u++) tp_unit_forward(&r->tp, c, u, r->st.params + r->tp.off[u], a, &r->work.scratch);
    if (probs) memcpy(probs, tp_probs(&r->tp, c, a, R, rows->pos), (size_t)R * c->vocab * sizeof(float));
    return a->loss; // every rank holds the whole loss
}
static void backward(Run* r, int R, long batch) {
    Scratch* s = &r->work.scratch;
    tp_pass(&r->tp, &r->cfg, R, batch, &r->work.ws);
    for (int u = n_units(&r->cfg) - 1; u >= 0; u--) {
        const float* w = r->st.params + r->tp.off[u];
        tp_unit_recompute(&r->tp, &r->cfg, u, w, &r->work.acts, s); // --recompute
        tp_unit_backward_input(&r->tp, &r->cfg, u, w, &r->work.acts, s);
        tp_unit_backward_weight(&r->tp, &r->cfg, u, r->st.grads + r->tp.off[u], &r->work.acts, unit_stash(&r->cfg, u, s));
        scratch_step_down(s);
    }
}
// Returns the step's exact loss sum, and in *n the targets it is a mean over. With
// --microbatches M passes add into the same exact gradient sums, so any M gives the same bits.
static int64_t train_step(Run* r, const Options* o, long step, long* n) {
    int B = o->batch, M = o->microbatches, units = n_units(&r->cfg);
    Rows rows = training_rows(&r->ds, o->seed, step, 0);
    *n = dataset_batch_targets(&r->ds, o->seed, step, B);
    int64_t loss = 0;
    fix_zero(r->st.grads, r->st.n);
    workspace_keep_weights(&r->work.ws, M > 1);
    for (int m = 0; m < M; m++) {
        long first, end;
        split_range(B, M, m, &first, &end);
        loss += forward(r, &rows, first, (int)(end - first), B, NULL);
        backward(r, (int)(end - first), B);
    }
    workspace_keep_weights(&r->work.ws, 0);
    float scale = clip_factor(&o->opt, r->spans, units, *n, group_norm, &r->group); // over every rank's slices
    optimizer_step(&o->opt, r->st.params, r->st.grads, r->st.m, r->st.v, r->st.n, grad_factor(*n), scale, step);
    return loss;
}
#endif

// ---------------------------------------------------------------- first read ends here

// ----------------------------------------------------------------------------
// the GPT's block's weight half

// The weight half: this rank's slices' gradients, from the kept activations and the stash.
static const BlockParams none;
static void tp_block_backward_weight_attention(Tp* tp, const BlockGrads* gg, BlockActs* ba, const BlockStash* st,
                                               const float* x) {
    TpLayers L = block_layers(&tp->dims, &none);
    layernorm_grads(tp, gg->ln2_g, gg->ln2_b, st->dln2, ba->x1, ba->ln2_mean, ba->ln2_rstd);
    row_parallel_backward_weight(tp, &L.proj, gg->proj_w, gg->proj_b, ba->atty, st->dx1);
    column_parallel_backward_weight(tp, &L.qkv, gg->qkv_w, gg->qkv_b, ba->ln1, st->dqkv);
    layernorm_grads(tp, gg->ln1_g, gg->ln1_b, st->dln1, x, ba->ln1_mean, ba->ln1_rstd);
}
static void tp_block_backward_weight(Tp* tp, int64_t* g, const Acts* a, int u, const float* stash) {
    BlockGrads gg = block_grads(g, &tp->dims);
    BlockActs ba = tp_block_acts(tp, a, u);
    BlockStash st = block_stash((float*)stash, &tp->dims, tp->dims.R);
    TpLayers L = block_layers(&tp->dims, &none);
    row_parallel_backward_weight(tp, &L.fc2, gg.fc2_w, gg.fc2_b, ba.gelu, st.dx2);
    column_parallel_backward_weight(tp, &L.fc, gg.fc_w, gg.fc_b, ba.ln2, st.dfc);
    tp_block_backward_weight_attention(tp, &gg, &ba, &st, a->out[u - 1]);
}

// ----------------------------------------------------------------------------
// --sp: sequence parallelism
//
// This chapter splits by tokens what tensor parallelism leaves whole on every rank: the
// LayerNorms, the residuals, the block's input and output (Korthikanti et al., 2022).
// A rank holds tokens [first, first + held) of a pass's R Tq, in shards of ceil(R Tq / t).
// f becomes an all-gather of the tokens before a column-parallel layer, and g a reduce-scatter
// of a row-parallel layer's partial sums: the all-reduce's two halves, on either side of the
// token-wise work (Megatron's gather_from_sequence_parallel_region and
// reduce_scatter_to_sequence_parallel_region). A LayerNorm's gain and bias now see only a
// rank's tokens, so their gradients are summed over the ranks. As Megatron does, a rank keeps
// only its tokens' LayerNorm output and gathers it again for the weight gradient.

static Tokens tp_tokens(const Tp* tp, int R) {
    Tokens tok = {.all = (long)R * tp->dims.Tq};
    tok.shard = (tok.all + tp->group->size - 1) / tp->group->size;
    if (!tp->sp) return (Tokens){tok.all, tok.shard, 0, tok.all}; // every token
    tok.first = tp->share.r * tok.shard;
    long left = tok.all - tok.first; // the last shard may be short, or empty
    tok.held = left < 0 ? 0 : left < tok.shard ? left : tok.shard;
    return tok;
}
// Every rank's rows of `mine` into buf.whole. A short last shard sends zeros in its place.
static const float* sp_all_gather(Tp* tp, float* mine, int W) {
    Tokens tok = tp->pass.tok;
    memset(mine + tok.held * W, 0, (size_t)(tok.shard - tok.held) * W * sizeof(float));
    group_allgather(tp->group, mine, tp->buf.whole, tok.shard * W, MPI_FLOAT); // all-gather
    return tp->buf.whole;
}
// Partial sums of every row [all][W] into the sums of this rank's rows, `mine`.
static void sp_reduce_scatter(Tp* tp, int64_t* sums, int64_t* mine, int W) {
    Tokens tok = tp->pass.tok;
    fix_zero(sums + tok.all * W, (tok.shard * tp->group->size - tok.all) * W);
    fix_zero(mine, tok.shard * W); // dist.h's reduce-scatter adds into it
    group_reduce_scatter(tp->group, sums, tok.shard * W, MPI_INT64_T, MPI_SUM, mine); // reduce-scatter
}
static const float* sp_f_forward(Tp* tp, float* x, int W) { return sp_all_gather(tp, x, W); }
// A column-parallel layer's input gradient comes transposed (accT [W][all]). It is put in
// token order first, so that a rank's shard is contiguous.
static void sp_f_backward(Tp* tp, int64_t* accT, float* dx, int W) {
    Tokens tok = tp->pass.tok;
    for (long n = 0; n < tok.all; n++)
        for (int x = 0; x < W; x++) tp->buf.by_token[n * W + x] = accT[(long)x * tok.all + n];
    sp_reduce_scatter(tp, tp->buf.by_token, tp->buf.mine_sum, W);
    for (long i = 0; i < tok.held * W; i++) dx[i] = (float)fix_to(tp->buf.mine_sum[i]);
}
static void sp_g_forward(Tp* tp, int64_t* sum, const float* b, float* z, int W) {
    sp_reduce_scatter(tp, sum, tp->buf.mine_sum, W);
    linear_forward_finish(z, tp->buf.mine_sum, b, (int)tp->pass.tok.held, W);
}
static const float* sp_g_backward(Tp* tp, float* dz, int W) { return sp_all_gather(tp, dz, W); }
// The embedding's lookups are summed by a reduce-scatter, which leaves each rank its tokens.
static void sp_embedding_sum(Tp* tp, float* out, int C) {
    Tokens tok = tp->pass.tok;
    memset(tp->buf.whole + tok.all * C, 0, (size_t)(tok.shard * tp->group->size - tok.all) * C * sizeof(float));
    memset(out, 0, (size_t)tok.shard * C * sizeof(float)); // the reduce-scatter adds into it
    group_reduce_scatter(tp->group, tp->buf.whole, tok.shard * C, MPI_FLOAT, MPI_SUM, out); // reduce-scatter
}
static void sp_layernorm_sum(Tp* tp, int64_t* grads, int C) {
    group_allreduce(tp->group, grads, 2L * C, MPI_INT64_T, MPI_SUM); // the tokens were split
}
static const TpOps sp_ops = {sp_f_forward, sp_f_backward, sp_g_forward, sp_g_backward, sp_embedding_sum,
                             sp_layernorm_sum};

// ----------------------------------------------------------------------------
// the GPT's embedding and head
//
// This chapter adds wpe and ln_f around the vocabulary-parallel embedding and loss above.

// Without --sp the lookups' sum is an all-reduce, as the MLP's.
static void tp_embedding_sum(Tp* tp, float* out, int C) {
    Tokens tok = tp->pass.tok;
    group_allreduce(tp->group, tp->buf.whole, tok.all * C, MPI_FLOAT, MPI_SUM); // vocabulary-parallel: all-reduce
    memcpy(out, tp->buf.whole, (size_t)tok.all * C * sizeof(float));
}
static void tp_gpt_embedding_forward(Tp* tp, const Config* c, const float* w, Acts* a) {
    Tokens tok = tp->pass.tok;
    BlockDims all = tp->dims;
    int C = c->emb;
    const float* wpe = w + (long)tp->vs * C;
    gpt_embedding_forward(tp->buf.whole, a->tokens, w, NULL, v_lo(tp), v_lo(tp) + tp->vs, 0, &all);
    tp->op.embedding_sum(tp, a->out[0], C);
    for (long i = 0; i < tok.held; i++) // token first + i is at position (first + i) % Tq of its row
        for (int x = 0; x < C; x++)
            a->out[0][i * C + x] += wpe[(long)dims_pos(&all, (int)((tok.first + i) % all.Tq)) * C + x];
}
// wte's gradient needs every token's (with --sp gathered first: the reduce-scatter's backward).
static void tp_gpt_embedding_backward_weight(Tp* tp, const Config* c, int64_t* g, const Acts* a, const float* dx) {
    const float* whole = tp->op.g_backward(tp, (float*)dx, c->emb);
    gpt_embedding_backward(g, g + (long)tp->vs * c->emb, a->tokens, whole, v_lo(tp), v_lo(tp) + tp->vs, &tp->dims,
                           tp->pass.terms);
}

// The head: ln_f (whole), then lm_head, column-parallel by vocabulary ([C][vs] here), and the
// vocabulary-parallel loss over every token. Its parameters: lm_head, then ln_f's gain and bias.
static TpLinear lm_head_layer(const Tp* tp, const Config* c, const float* w) {
    return (TpLinear){w, NULL, c->emb, tp->vs, c->emb, c->vocab};
}
static void tp_gpt_head_forward(Tp* tp, const Config* c, const float* w, Acts* a) {
    int C = c->emb, u = c->layers + 1;
    TpLinear lm_head = lm_head_layer(tp, c, w);
    const float *ln_f_g = w + (long)C * tp->vs, *ln_f_b = ln_f_g + C;
    float *ln = gpt_head_saved(c, a, 0), *mean = gpt_head_saved(c, a, 1), *rstd = gpt_head_saved(c, a, 2);
    layernorm_forward(ln, mean, rstd, a->out[u - 1], ln_f_g, ln_f_b, tp->pass.tok.held, C);
    column_parallel_forward(tp, &lm_head, a->out[u], ln); // f: its vocabulary
    vocab_parallel_cross_entropy(tp, c, a, 1, tp->vs, (int)tp->pass.tok.all);
}
static void tp_gpt_head_backward_input(Tp* tp, const Config* c, const float* w, Acts* a, Scratch* s) {
    int C = c->emb, u = c->layers + 1;
    Tokens tok = tp->pass.tok;
    TpLinear lm_head = lm_head_layer(tp, c, w);
    const float* ln_f_g = w + (long)C * tp->vs;
    float *mean = gpt_head_saved(c, a, 1), *rstd = gpt_head_saved(c, a, 2);
    float *dlogits = s->stash, *dln = s->stash + tok.all * tp->vs; // the stash keeps both for the weight half
    xent_backward(dlogits, a->out[u], a->targets, (int)tok.all, tp->vs, v_lo(tp));
    column_parallel_backward_input(tp, &lm_head, dln, dlogits); // f backward
    layernorm_backward_input(s->din, NULL, dln, a->out[u - 1], mean, rstd, ln_f_g, tok.held, C);
}
static void tp_gpt_head_backward_weight(Tp* tp, const Config* c, int64_t* g, const Acts* a, const float* stash) {
    int C = c->emb, u = c->layers + 1;
    TpLinear lm_head = lm_head_layer(tp, c, NULL);
    float *ln = gpt_head_saved(c, a, 0), *mean = gpt_head_saved(c, a, 1), *rstd = gpt_head_saved(c, a, 2);
    const float *dlogits = stash, *dln = stash + tp->pass.tok.all * tp->vs;
    int64_t *g_lm_head = g, *g_ln_f_g = g + (long)C * tp->vs, *g_ln_f_b = g_ln_f_g + C;
    column_parallel_backward_weight(tp, &lm_head, g_lm_head, NULL, ln, dlogits);
    layernorm_grads(tp, g_ln_f_g, g_ln_f_b, dln, a->out[u - 1], mean, rstd);
}

// ----------------------------------------------------------------------------
// recomputation (--recompute)
//
// This chapter trades compute for memory before a block's backward, on this rank's slices.
// Selective recomputes attention's probabilities from its heads' q, k and v. Full recomputes
// the whole block from its input, f and g and their collectives included.
static void tp_unit_recompute(Tp* tp, const Config* c, int u, const float* w, Acts* a, Scratch* s) {
    if (c->recompute == RECOMPUTE_NONE || !is_block(c, u)) return;
    double t0 = trace_clock();
    BlockActs ba = tp_block_acts(tp, a, u);
    if (c->recompute == RECOMPUTE_FULL) tp_block_forward(tp, w, a, u, s);
    else tp_attention_forward(tp, &ba, s);
    trace_event("compute", t0, trace_clock(), 0, "recompute %s", unit_name(c, u));
}

// ----------------------------------------------------------------------------
// the model's units on this rank's slices
//
// Unit 0 is the embedding, units 1 .. layers the MLP's linear layers or the GPT's blocks, the
// last one the output layer and loss; train_3d.c runs these on its pipeline's stages.

static void tp_unit_forward(Tp* tp, const Config* c, int u, const float* w, Acts* a, Scratch* s) {
    double t0 = trace_clock();
    int R = tp->dims.R;
    if (is_gpt(c)) {
        if (u == 0) tp_gpt_embedding_forward(tp, c, w, a);
        else if (u <= c->layers) tp_block_forward(tp, w, a, u, s);
        else tp_gpt_head_forward(tp, c, w, a);
    } else if (u == 0) {
        vocab_parallel_embedding_forward(tp, c, w, a, R);
    } else {
        mlp_linear_forward(tp, c, u, w, a->out[u - 1], a->out[u]);
        if (u <= c->layers) relu_forward(a->out[u], (long)R * tp->J[u]);
        else vocab_parallel_cross_entropy(tp, c, a, is_column(u), tp->J[u], R);
    }
    trace_event("compute", t0, trace_clock(), 0, "forward %s", unit_name(c, u));
}
// The input half reads s->dout and writes the input gradient to s->din.
static void tp_unit_backward_input(Tp* tp, const Config* c, int u, const float* w, Acts* a, Scratch* s) {
    if (u == 0) return;
    double t0 = trace_clock();
    int R = tp->dims.R;
    if (is_gpt(c) && u <= c->layers) tp_block_backward_input(tp, w, a, u, s);
    else if (is_gpt(c)) tp_gpt_head_backward_input(tp, c, w, a, s);
    else {
        if (u == c->layers + 1) xent_backward(s->dout, a->out[u], a->targets, R, tp->J[u], is_column(u) ? v_lo(tp) : 0);
        else relu_backward(s->dout, a->out[u], (long)R * tp->J[u]);
        mlp_linear_backward_input(tp, c, u, w, s);
    }
    trace_event("compute", t0, trace_clock(), 0, "input gradient %s", unit_name(c, u));
}
// The weight half adds this rank's parameter gradients into g.
static void tp_unit_backward_weight(Tp* tp, const Config* c, int u, int64_t* g, const Acts* a, const float* dout) {
    double t0 = trace_clock();
    int R = tp->dims.R;
    if (is_gpt(c)) {
        if (u == 0) tp_gpt_embedding_backward_weight(tp, c, g, a, dout);
        else if (u <= c->layers) tp_block_backward_weight(tp, g, a, u, dout);
        else tp_gpt_head_backward_weight(tp, c, g, a, dout);
    } else if (u == 0) {
        embedding_backward(g, a->tokens, dout, v_lo(tp), v_lo(tp) + tp->vs, R, c->context, c->emb, tp->pass.terms);
    } else { // the MLP's rows are whole on every rank, so neither kind of layer communicates here
        int K = tp->K[u], J = tp->J[u];
        linear_backward_weight(g, g + (long)K * J, a->out[u - 1], dout, R, K, J, tp->pass.terms, tp->pass.ws);
    }
    trace_event("compute", t0, trace_clock(), 0, "weight gradient %s", unit_name(c, u));
}

// ----------------------------------------------------------------------------
// what only serves the strategy: the pass, sampling, attention's hook, slices and buffers

static void tp_layernorm_sum(Tp* tp, int64_t* grads, int C) { (void)tp, (void)grads, (void)C; }
static const TpOps tp_ops = {identity, f_backward, g_forward, identity, tp_embedding_sum, tp_layernorm_sum};

// Sets the pass's rows R (of a batch of `batch` rows) and workspace for the units that follow.
static Tokens tp_pass(Tp* tp, const Config* c, int R, long batch, Workspace* ws) {
    tp->dims.R = R;
    tp->pass.tok = is_gpt(c) ? tp_tokens(tp, R) : (Tokens){R, R, 0, R};
    tp->pass.terms = is_gpt(c) ? batch * c->context : batch;
    tp->pass.ws = ws;
    return tp->pass.tok;
}

// A LayerNorm's gain and bias gradients of this pass: exact sums over this rank's tokens,
// with --sp summed over the ranks, then added to dg and db.
static void layernorm_grads(Tp* tp, int64_t* dg, int64_t* db, const float* dy, const float* x, const float* mean,
                            const float* rstd) {
    int C = tp->dims.C;
    int64_t* mine = tp->buf.ln_grad;
    fix_zero(mine, 2L * C);
    layernorm_backward_params(mine, mine + C, dy, x, mean, rstd, tp->pass.tok.held, C, tp->pass.terms);
    tp->op.layernorm_sum(tp, mine, C);
    for (int i = 0; i < C; i++) dg[i] += mine[i], db[i] += mine[C + i];
}
// A block's activations on this rank: the BlockActs of its heads and slice of F at every
// token, but with --sp its LayerNorms' outputs and statistics and x1 at its own tokens only.
static int tp_token_share(const Tp* tp);
static BlockActs tp_block_acts(Tp* tp, const Acts* a, int u) {
    return acts_block(a, u, &tp->dims, tp_token_share(tp));
}


// Sampling: the whole vocabulary's probabilities of the last forward, on every rank, gathered
// from the ranks' slices (the GPT's at the position held at index `at`: the one sampled).
static const float* tp_probs(Tp* tp, const Config* c, const Acts* a, int R, int at) {
    int u = c->layers + 1;
    if (!is_gpt(c) && !is_column(u)) return a->out[u]; // a row-parallel last layer: every rank has them all
    const float* mine = a->out[u];
    if (is_gpt(c)) {
        for (int r = 0; r < R; r++)
            memcpy(tp->buf.whole + (long)r * tp->vs, a->out[u] + ((long)r * tp->dims.Tq + at) * tp->vs, tp->vs * sizeof(float));
        mine = tp->buf.whole;
    }
    group_allgather(tp->group, mine, tp->buf.gathered, (long)R * tp->vs, MPI_FLOAT);
    for (int q = 0; q < tp->group->size; q++)
        for (int r = 0; r < R; r++)
            for (int v = 0; v < tp->vs && q * tp->vs + v < c->vocab; v++)
                tp->buf.probs[(long)r * c->vocab + q * tp->vs + v] = tp->buf.gathered[((long)q * R + r) * tp->vs + v];
    return tp->buf.probs;
}

// Attention on this rank's heads, whole: layers.h's, on the positions held. train_3d.c's
// context axis plugs in its own, over every context-parallel rank's positions: the hooks.
struct TpHooks {
    void (*attend)(void* ctx, BlockActs* a);
    void (*attend_backward)(void* ctx, const BlockActs* a, const float* datty, float* dqkv);
    void* attend_ctx;
};
static void tp_attention_forward(Tp* tp, BlockActs* ba, Scratch* s) {
    if (tp->hooks) tp->hooks->attend(tp->hooks->attend_ctx, ba);
    else attention_forward(ba->atty, ba->att, ba->qkv, &tp->dims, s->tmp, s->acc);
}
static void tp_attention_backward(Tp* tp, const BlockActs* ba, const float* datty, float* dqkv, float* tmp, Scratch* s) {
    if (tp->hooks) tp->hooks->attend_backward(tp->hooks->attend_ctx, ba, datty, dqkv);
    else attention_backward(dqkv, datty, ba->qkv, ba->att, ba->atty, &tp->dims, tmp, s->acc);
}

// This rank's share of every unit (config.h's table gives each tensor's slice: the sizes
// here, and where each element sits in train.c's layout, for the initial values and
// checkpoints), and the buffers of a pass of up to `rows` rows.
static void tp_init(Tp* tp, Group* group, const Config* c, int rows, int sp) {
    memset(tp, 0, sizeof *tp);
    int t = group->size;
    tp->group = group, tp->sp = sp, tp->share = (Share){group->rank, t, 0, 0};
    tp->op = sp ? sp_ops : tp_ops;
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
    if (!is_gpt(c)) tp->buf.sum = mallocCheck((size_t)rows * max_width(c) * sizeof(int64_t)); // any layer's K or J
    if (is_gpt(c)) { // main, or train_3d.c's grid_resolve, checks that t divides the heads
        int C = c->emb, widest = C > tp->vs ? C : tp->vs;
        long tokens = (long)rows * c->context + t; // a pass's tokens, and a short shard's padding
        tp->dims = gpt_dims(c, rows);
        tp->dims.NH = c->heads / t, tp->dims.A = tp->dims.NH * tp->dims.HD, tp->dims.F = 4 * C / t;
        tp->buf.whole = mallocCheck((size_t)tokens * widest * sizeof(float));
        tp->buf.sum = mallocCheck((size_t)tokens * widest * sizeof(int64_t));
        tp->buf.mine_sum = mallocCheck((size_t)(tokens / t + 1) * C * sizeof(int64_t));
        tp->buf.by_token = sp ? mallocCheck((size_t)tokens * C * sizeof(int64_t)) : NULL;
        tp->buf.dres = mallocCheck((size_t)tokens * C * sizeof(float));
        tp->buf.ln_grad = mallocCheck(2L * C * sizeof(int64_t));
    }
    tp->buf.probs = mallocCheck((size_t)rows * c->vocab * sizeof(float));
    tp->buf.gathered = mallocCheck((size_t)t * rows * tp->vs * sizeof(float));
}
static void tp_free(Tp* tp) {
    TpBuffers* b = &tp->buf;
    free(b->probs), free(b->gathered), free(b->whole), free(b->sum), free(b->by_token), free(b->mine_sum);
    free(b->dres), free(b->ln_grad);
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

static void run_free(Run* r) {
    dataset_free(&r->ds), state_free(&r->st), tp_free(&r->tp), work_free(&r->work);
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
// Korthikanti et al.'s form (tp_gpt_acts_formula), the rest as held. R: a microbatch's rows
// (the activations held); the bytes sent, each of the M microbatches of the B rows in turn.
static Figures figures(const Run* r, const Progress* pr, const Optimizer* opt, int R, int B, int M) {
    const Config* c = &r->cfg;
    long np = r->st.n;
    double acts_row = acts_bytes_per_row(c, 0, n_units(c), &r->sizes), opt_bytes = opt->adamw ? 8.0 : 0.0;
    Figures f = {.sent = per_step(pr, r->group.sent), .received = per_step(pr, r->group.received), .params = 4.0 * np,
                 .grads = 8.0 * np, .optim = opt_bytes * np, .acts = R * acts_row, .bubble = -1};
    double acts_formula = R * acts_row, room;
    if (is_gpt(c)) // the blocks' by the paper's form, the rest as held
        acts_formula += c->layers * tp_gpt_acts_formula(&r->tp, c, R, &room) + room - tp_gpt_blocks_held(c, &r->sizes, R);
    double clip = opt->clip > 0 ? ring_allreduce_bytes(4 + 8, r->group.size) : 0; // the norm's max and sum of squares
    f.sent_formula = clip;
    for (int m = 0; m < M; m++) {
        long lo, hi;
        split_range(B, M, m, &lo, &hi);
        f.sent_formula += tp_sent_formula(&r->tp, c, 0, n_units(c), (double)(hi - lo));
    }
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
    for (int u = 0; u < n_units(cfg); u++) {
        long off = run.tp.off[u];
        run.mine.n[u] = run.tp.size[u], run.mine.share[u] = run.tp.share;
        run.mine.at[0][u] = run.st.params + off, run.mine.at[1][u] = run.st.m ? run.st.m + off : NULL;
        run.mine.at[2][u] = run.st.v ? run.st.v + off : NULL;
        run.spans[u] = (GradSpan){run.st.grads + off, share_counted(cfg, u, run.tp.share)}; // whole tensors: rank 0's
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
        long n;
        int64_t loss = train_step(&run, &o, step, &n);
        if (step_end(&progress, step, fix_to(loss) / n, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, &o.opt, (B + M - 1) / M, B, M); // a microbatch's activations
    Report rep = {"train_tp.c", layout, is_gpt(cfg) ? gpt_sent_words : sent_words, is_gpt(cfg) ? gpt_mem_words : mem_words};
    free(dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run));
    if (is_gpt(cfg) && !o.quiet && world_rank == 0) print_block_activations(&run, (B + M - 1) / M);
    run_free(&run);
    MPI_Finalize();
    return 0;
}

#endif // TRAIN_3D
