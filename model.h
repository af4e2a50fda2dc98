/*
 * model.h: the two models every program trains, each a list of units made of layers.h's
 * layers: the MLP (the default) and, with --model gpt, makemore's GPT (its block:
 * transformer.h); with --experts, their mixtures of experts (moe.h). Their configuration,
 * units and parameters: config.h.
 *
 * Read top to bottom: activations, and what a pass works in; the GPT's units; a unit with a
 * mixture of experts; the model as a list of units (each unit's forward, and its backward in
 * two halves); the program's forward pass, validation and sampling.
 *
 * The headers below it, each including only those under it:
 *   util.h -> kernels.h -> layers.h -> transformer.h -> config.h -> moe.h -> model.h
 * and beside them data.h (the names), optim.h (optimizers), ckpt.h, cli.h, report.h, dist.h.
 */
#ifndef MODEL_H
#define MODEL_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "config.h"
#include "moe.h"
#include "data.h"

// ----------------------------------------------------------------------------
// activations, and what a pass works in

typedef struct {
    int rows;                   // capacity
    int* tokens;                // [rows][T]
    int* targets;               // [rows][targets_per_row]: a token, or -1 for none (the GPT's padding)
    float* out[MAX_LAYERS + 2]; // out[u]: unit u's output [rows][unit_width(u)]; out[L+1] holds the probs
    float* saved[MAX_LAYERS + 2]; // the GPT: what unit u keeps for its backward besides its output
    float* att;                 // --recompute selective: the blocks' attention probabilities, one block's room
    float* recomputed;          // --recompute full: what the blocks keep, one block's room, every block's saved[u]
    int room_lent;              // att or recomputed is another's (a pipeline's slots share one room): not freed here
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
    long att[MAX_LAYERS + 2]; // of saved, a block's attention probabilities
} UnitSizes;
static int unit_out(const Config* c, const UnitSizes* sz, int u) { return sz ? sz->out[u] : unit_width(c, u); }
static long unit_saved(const Config* c, const UnitSizes* sz, int u) { return sz ? sz->saved[u] : gpt_saved_per_row(c, u); }
static int is_block(const Config* c, int u) { return is_gpt(c) && u >= 1 && u <= c->layers; }
static long unit_att(const Config* c, const UnitSizes* sz, int u) {
    if (!is_block(c, u)) return 0;
    BlockDims d = gpt_block_dims(c, u, 1);
    return sz ? sz->att[u] : block_att_per_row(&d);
}

// --recompute (Korthikanti et al., 2022): the GPT's blocks keep less and recompute the rest
// in backward. Selective: each block keeps everything but attention's scores and
// probabilities (the 5as/h term of the paper's forms, the largest), which share one block's
// room. Full: each block keeps only its input (the unit before's output, kept anyway); what
// it keeps otherwise shares one block's room. Per row, what units [u_lo, u_hi) keep of
// their own (saved) under each choice:
static long acts_room_per_row(const Config* c, int u_lo, int u_hi, const UnitSizes* sz) {
    long room = 0; // the one block's room: the most any block recomputes
    for (int u = u_lo; u < u_hi && c->recompute != RECOMPUTE_NONE; u++) {
        long r = !is_block(c, u) ? 0 : c->recompute == RECOMPUTE_SELECTIVE ? unit_att(c, sz, u) : unit_saved(c, sz, u);
        room = r > room ? r : room;
    }
    return room;
}
static long acts_saved_per_row(const Config* c, int u_lo, int u_hi, const UnitSizes* sz) {
    long kept = 0;
    for (int u = u_lo; u < u_hi; u++) {
        long saved = unit_saved(c, sz, u), att = unit_att(c, sz, u);
        if (!is_block(c, u) || c->recompute == RECOMPUTE_NONE) kept += saved;
        else if (c->recompute == RECOMPUTE_SELECTIVE) kept += saved - att;
    }
    return kept + acts_room_per_row(c, u_lo, u_hi, sz);
}
// Activations of units [u_lo, u_hi) and of the input to u_lo (a pipeline stage keeps only
// its own); pass 0, n_units for the whole model, and sz as above. `lent`: one block's room
// for --recompute, rows x acts_room_per_row floats, that this Acts shares with others (a
// pipeline's microbatches in flight: one backward runs at a time), or NULL for its own.
static void acts_init_lent(Acts* a, const Config* c, int rows, int u_lo, int u_hi, const UnitSizes* sz, float* lent) {
    memset(a, 0, sizeof(*a));
    a->rows = rows;
    int per_row = targets_per_row(c);
    a->tokens = mallocCheck((size_t)rows * c->context * sizeof(int));
    a->targets = mallocCheck((size_t)rows * per_row * sizeof(int));
    for (int u = (u_lo > 0 ? u_lo - 1 : 0); u < u_hi; u++) a->out[u] = mallocCheck((size_t)rows * unit_out(c, sz, u) * sizeof(float));
    long room = 0; // --recompute: one block's room, shared
    for (int u = u_lo; u < u_hi; u++) {
        long saved = unit_saved(c, sz, u), att = unit_att(c, sz, u);
        if (is_block(c, u) && c->recompute == RECOMPUTE_FULL) room = saved > room ? saved : room;
        else if (is_block(c, u) && c->recompute == RECOMPUTE_SELECTIVE) {
            room = att > room ? att : room;
            a->saved[u] = mallocCheck((size_t)rows * (saved - att) * sizeof(float) + 1);
        } else if (saved > 0) a->saved[u] = mallocCheck((size_t)rows * saved * sizeof(float));
    }
    a->room_lent = room > 0 && lent;
    if (room > 0 && c->recompute == RECOMPUTE_FULL) {
        a->recomputed = lent ? lent : mallocCheck((size_t)rows * room * sizeof(float));
        for (int u = u_lo; u < u_hi; u++) a->saved[u] = is_block(c, u) ? a->recomputed : a->saved[u];
    }
    if (room > 0 && c->recompute == RECOMPUTE_SELECTIVE) a->att = lent ? lent : mallocCheck((size_t)rows * room * sizeof(float));
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
static void acts_init(Acts* a, const Config* c, int rows, int u_lo, int u_hi, const UnitSizes* sz) {
    acts_init_lent(a, c, rows, u_lo, u_hi, sz, NULL);
}
static void acts_free(Acts* a) {
    free(a->tokens);
    free(a->targets);
    for (int u = 0; u < MAX_LAYERS + 2; u++) free(a->out[u]), free(a->saved[u] != a->recomputed ? a->saved[u] : NULL);
    if (!a->room_lent) free(a->recomputed), free(a->att);
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
    b += acts_saved_per_row(c, u_lo, u_hi, sz) * (long)sizeof(float);
    for (int u = u_lo; u < u_hi; u++) // an MoE unit's router state, and its k tokens' rows both
        if (is_moe(c, u)) {           // sent and (with an even load) received, with their gradients
            Expert e = moe_expert(c, u);   // and what the experts keep; the GPT's gather besides
            long W = e.K > e.H ? e.K : e.H, k = c->top_k;
            long token = 2L * c->experts + 4 * k + k * (6 * W + e.saved) + (is_gpt(c) ? 1 + e.K : 0);
            if (c->shared_experts > 0) // each shared expert's output and keep, and their scratch
                token += c->shared_experts * (e.H + e.saved) + e.H + e.K + e.tmp + 2 * e.acc;
            b += moe_tokens_per_row(c) * token * 4;
        }
    return b;
}

// Block u's BlockActs in a (h of a row's positions for the per-token tensors: every one held,
// or a sequence-parallel rank's share), its probabilities where --recompute selective keeps them.
static BlockActs acts_block(const Acts* a, int u, const BlockDims* d, int h) {
    BlockActs ba = block_acts_tokens(a->saved[u], d, a->rows, h);
    if (a->att) ba.att = a->att;
    return ba;
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
        BlockActs ba = acts_block(a, u, &d, d.Tq);
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
        BlockActs ba = acts_block(a, u, &d, d.Tq);
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
        BlockActs ba = acts_block(a, u, &d, d.Tq);
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
// (after every parameter every rank holds: moe_replicated_params)
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
    BlockActs ba = acts_block(a, u, &d, d.Tq);
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
    BlockActs ba = acts_block(a, u, &d, d.Tq);
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
    BlockActs ba = acts_block(a, u, &d, d.Tq);
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
        sz->att[u] = u == 0 ? 0 : block_att_per_row(&b);
    }
    sz->att[head] = 0;
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
        moe_forward(c, w + moe_router_at(c), w + moe_replicated_params(c, u), &a->moe[u], in, out, n, a->training, &a->aux,
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
// --recompute, before unit u's backward: what its forward did not keep, computed again from
// what it did (selective: attention's probabilities from q, k and v; full: the whole block
// from its input). The same bits as the first time: a forward is a pure function of its
// input and parameters here (no dropout, no state, every split sum exact).
static void unit_recompute(const Config* c, int u, const float* w, Acts* a, Scratch* s, int R, Workspace* ws) {
    if (c->recompute == RECOMPUTE_NONE || !is_block(c, u)) return;
    double t = trace_clock();
    BlockDims d = gpt_block_dims(c, u, R);
    BlockActs ba = acts_block(a, u, &d, d.Tq);
    BlockParams p = block_params(w, &d);
    if (c->recompute == RECOMPUTE_FULL) block_forward(a->out[u], a->out[u - 1], &p, &ba, &d, s->tmp, s->acc, ws);
    else attention_forward(ba.atty, ba.att, ba.qkv, &d, s->tmp, s->acc);
    trace_event("compute", t, trace_clock(), 0, "recompute %s", unit_name(c, u));
}
static void unit_backward(const Config* c, int u, const float* w, int64_t* g, Acts* a, Scratch* s, int R, long batch,
                          Workspace* ws) {
    if (is_moe(c, u)) { // not in halves: the layer's backward adds its weight gradients as it goes
        const float *in, *dout;
        float* din;
        long router = moe_router_at(c), experts = moe_replicated_params(c, u), terms = batch * moe_tokens_per_row(c);
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
        unit_recompute(c, u, params + off, &w->acts, &w->scratch, R, &w->ws); // --recompute: what it did not keep
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

// --microbatches: rows [*first, *first + R) of a batch of B rows that rank q of N takes in
// microbatch m of M: the batch cut into M microbatches of contiguous rows (32 into 3: 11, 11,
// 10), each shared by the N ranks the same way. Returns R. (N = 1: the microbatch itself.)
static int microbatch_rows(long B, int M, int m, int N, int q, long* first) {
    long lo, hi, a, b;
    split_range(B, M, m, &lo, &hi);
    split_range(hi - lo, N, q, &a, &b);
    *first = lo + a;
    return (int)(b - a);
}

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
