/*
 * config.h: what a model is: its configuration, its units (the pieces a pipeline cuts into
 * stages and FSDP gathers), the parameters of each unit in one flat layout, and their
 * initial values.
 *
 *   MLP: embedding (V x E) -> flatten (T*E) -> [Linear -> ReLU] x L -> Linear (-> V) -> softmax cross-entropy
 *   GPT: token + position embedding (V x C, T x C) -> [block: attention, MLP] x L -> LayerNorm -> Linear (-> V)
 *        -> softmax cross-entropy at every position (transformer.h)
 *
 * Units: the model is a list of L+2 units: unit 0 is the embedding, unit l (1 <= l <= L+1)
 * is linear layer l, followed by its ReLU (l <= L) or by the loss (l = L+1). The GPT's:
 * unit 0 the embeddings, units 1..L its blocks, unit L+1 the head (ln_f, lm_head, the loss).
 * With --experts X every hidden layer of the MLP, and every block of the GPT, is a mixture
 * of X experts (moe.h).
 */
#ifndef CONFIG_H
#define CONFIG_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "transformer.h"
#include <limits.h>

#define MAX_LAYERS 32
#define MAX_TOP_K 8 // --top-k: experts a token chooses (DeepSeek-V3 chooses 8)
#define MAX_SHARED_EXPERTS 8 // --shared-experts: experts every token passes through (DeepSeek-V3 has 1)

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
    int top_k;       // k: experts per token (1 to MAX_TOP_K)
    int shared_experts; // S: experts every token passes through beside its k (--shared-experts)
    int expert_hidden; // the GPT's: each expert's width F (--expert-hidden; 0: 4C, the dense block's)
    float capacity;  // CF, the capacity factor: an expert takes at most ceil(CF k B / X) of a training batch's B tokens
    float aux_loss;  // alpha: weight of the load-balancing loss (0 with --balance bias)
    int router;      // ROUTER_SOFTMAX (Switch, Mixtral) or ROUTER_SIGMOID (DeepSeek-V3): --router
    int balance;     // BALANCE_AUX (the loss above) or BALANCE_BIAS (DeepSeek-V3's bias): --balance
    float bias_rate; // --balance bias: how far an expert's bias moves a step
    // not the model, but how its activations are kept (--recompute): none, or the GPT's
    // blocks' recomputed in backward, attention's probabilities (selective) or everything
    // but their input (full)
    int recompute;
    // the operands of every matrix product: fp32, or rounded to bf16 (--precision; kernels.h)
    int precision;
} Config;
enum { ROUTER_SOFTMAX, ROUTER_SIGMOID };
static const char* const router_names[] = {"softmax", "sigmoid"};
enum { BALANCE_AUX, BALANCE_BIAS };
static const char* const balance_names[] = {"aux", "bias"};
enum { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL };
static const char* const recompute_names[] = {"none", "selective", "full"};
enum { PRECISION_FP32, PRECISION_BF16 };
static const char* const precision_names[] = {"fp32", "bf16"};

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
// An MoE unit's parameters: first those every rank of expert parallelism holds (replicated:
// the MLP's router's weight [K][X]; the GPT's block's attention, LayerNorms and router,
// transformer.h's moe_block_layout; then the S shared experts' blocks), then routed expert
// 0's block, expert 1's, ...: each expert one contiguous block (the MLP's: a weight [K][H]
// and a bias [H]; the GPT's: its MLP, transformer.h's mlp_layout), so that a rank holding
// experts [x_lo, x_hi) holds one range.
static inline long router_params(const Config* c, int u) {
    return (long)(is_gpt(c) ? c->emb : linear_in(c, u)) * c->experts;
}
// The GPT's expert: an MLP of width F, 4C unless --expert-hidden says otherwise (a
// fine-grained expert is narrower, so that more of them cost what a few wide ones do).
static inline int expert_width(const Config* c) { return c->expert_hidden > 0 ? c->expert_hidden : 4 * c->emb; }
static inline long expert_params(const Config* c, int u) {
    if (is_gpt(c)) return (2L * c->emb + 1) * expert_width(c) + c->emb; // fc C x F and its bias, fc2 F x C and its bias
    return (long)linear_in(c, u) * c->hidden + c->hidden;
}
// An expert unit's parameters before its routed experts, which every expert-parallel rank
// holds whole: the router and the shared experts, and the GPT's attention half and LayerNorms.
static inline long moe_replicated_params(const Config* c, int u) {
    long router_shared = router_params(c, u) + c->shared_experts * expert_params(c, u);
    if (is_gpt(c)) return 4L * c->emb * c->emb + 8L * c->emb + router_shared; // qkv, proj, ln1, ln2, router, shared
    return router_shared;
}
// parameters of unit u: the embedding table, a weight [K][J] followed by a bias [J], or
// an MoE layer's router and experts
static inline long unit_params(const Config* c, int u) {
    if (is_gpt(c)) return gpt_unit_params(c, u);
    if (is_moe(c, u)) return moe_replicated_params(c, u) + c->experts * expert_params(c, u);
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
// the largest weight matrix: a linear layer's, an expert's or a router's
static inline long max_linear_weight(const Config* c) {
    if (is_gpt(c)) { // fc's, an expert's fc, lm_head's, or a router's
        long m = 4L * c->emb > c->vocab ? 4L * c->emb : c->vocab;
        if (c->experts > 0 && expert_width(c) > m) m = expert_width(c);
        return (long)c->emb * (c->experts > m ? c->experts : m);
    }
    long m = 0;
    for (int l = 1; l <= c->layers + 1; l++) {
        long w = (long)linear_in(c, l) * (is_moe(c, l) && c->experts > linear_out(c, l) ? c->experts : linear_out(c, l));
        m = w > m ? w : m;
    }
    return m;
}
// the widest row a pass works on: a unit's output or, in the GPT, fc's T*4C, an expert's
// T*F or lm_head's T*V
static inline int max_width(const Config* c) {
    if (is_gpt(c)) {
        int m = 4 * c->emb > c->vocab ? 4 * c->emb : c->vocab;
        if (c->experts > 0 && expert_width(c) > m) m = expert_width(c);
        return c->context * m;
    }
    int m = c->context * c->emb;
    if (c->hidden > m) m = c->hidden;
    if (c->vocab > m) m = c->vocab;
    if (c->experts > m) m = c->experts;
    return m;
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
// parameters: every unit's tensors as a table
//
// All parameters live in one float allocation, unit after unit, each unit's tensors one
// after another, row-major: unit u starts at unit_offset(u). Gradients (exact sums, int64)
// and optimizer state use the same layout, so the optimizer, an all-reduce and an FSDP shard
// are each one loop over one flat range, and a unit, the piece that pipeline stages and FSDP
// move around, is one contiguous block.
//
// Each tensor is a row of its unit's table: its name, its shape, how a tensor-parallel rank
// holds it, and its initial values. The MLP's (linear l column-parallel for odd l, row-parallel
// for even l: linear_kind above) and the GPT's (--model gpt), for t tensor-parallel ranks:
//
//   unit        tensor   shape       a tensor-parallel rank r holds                  initial values
//   embedding   emb      [V][E]      rows (vocabulary) r V/t ..                      N(0, 1)
//   linear l    w        [K][J]      odd l: columns r J/t ..; even l: rows r K/t ..   U(+-1/sqrt K)
//               b        [J]         odd l: its columns; even l: whole               U(+-1/sqrt K)
//   GPT
//   embedding   wte      [V][C]      rows (vocabulary) r V/t ..                      N(0, 1)
//               wpe      [T][C]      whole                                           N(0, 1)
//   block       qkv_w    [C][3C]     columns of its heads in q, in k and in v:       U(+-1/sqrt C)
//                                    3 groups of C, each split by heads, r C/t ..
//               qkv_b    [3C]        the same columns                                U(+-1/sqrt C)
//               proj_w   [C][C]      rows of its heads, r C/t ..                     U(+-1/sqrt C)
//               fc_w     [C][4C]     columns r 4C/t ..                               U(+-1/sqrt C)
//               fc_b     [4C]        the same columns                                U(+-1/sqrt C)
//               fc2_w    [4C][C]     rows r 4C/t ..                                  U(+-1/sqrt 4C)
//               ln1_g, ln1_b, proj_b, ln2_g, ln2_b, fc2_b [C]   whole                gains 1, biases 0,
//                                                                                    proj_b, fc2_b as their weights
//   head        lm_head  [C][V]      columns (vocabulary) r V/t ..                   U(+-1/sqrt C)
//               ln_f_g, ln_f_b [C]   whole                                           1, 0
//
// (DTensor's placements: "rows" is Shard(0), "columns" Shard(1), "whole" Replicate();
// Megatron's partition_dim 0 and 1, and for the fused qkv, a partition_stride of 3.) A split
// that t does not divide is padded: V = 27 on 2 ranks is 2 slices of 14, the last one
// padding, which is never initialised, never updated and never counted. Every tensor a rank
// holds whole comes after every split one in its unit, so a rank's slice of a unit is one
// block of split tensors, then one of whole ones.
//
// With --experts X a mixture-of-experts unit (moe.h) has, after its own rows (the MLP's:
// the router w_router [K][X]; the GPT's: the block's attention and LayerNorms and the router;
// then the S shared experts' tensors, whole), the rows of one expert (the MLP's: w [K][H],
// b [H]; the GPT's: fc_w, fc_b, fc2_w, fc2_b) X times, expert 0 first: an expert-parallel
// rank holds a contiguous range of experts whole.
//
// One function maps an element a rank holds to train.c's index (unit_canonical, below):
// initial values, checkpoints, the gradient norm, FSDP's shards (ranges of it) and train_3d.c's
// grid all go through it, so no strategy file does index arithmetic of its own.

typedef enum { WHOLE, SPLIT_ROWS, SPLIT_COLUMNS } SplitDim;
typedef enum { INIT_NORMAL, INIT_UNIFORM, INIT_ONES, INIT_ZEROS } InitKind;
typedef struct {
    const char* name;
    long rows, cols;  // the shape in train.c (a vector: 1 x cols)
    SplitDim split;   // how a tensor-parallel rank holds it
    int groups;       // SPLIT_COLUMNS: the columns are this many equal groups, each split alike (qkv: 3)
    const char* by;   // what the split dimension is: "vocabulary", "heads", ...
    InitKind init;
    long fan_in;      // INIT_UNIFORM: in +-1/sqrt(fan_in)
    int scaled;       // INIT_UNIFORM: u x (1/sqrt(fan_in)) (the MLP's dense layers) or u / sqrt(fan_in): the
                      // two round apart in the last bit, and each is what the checkpoints of its model hold
    uint32_t stream;  // its random numbers' stream (with STREAM_INIT): a number of its own
} Tensor;

// A unit's table: rows [0, own) are the unit's own tensors; with experts, rows [own, n) are
// one expert's, repeated `experts` times after them.
#define MAX_TENSORS (13 + 4 * MAX_SHARED_EXPERTS) // a GPT block with experts: 9 of its own, 4 a shared expert, 4 an expert
typedef struct {
    Tensor t[MAX_TENSORS];
    int n, own, experts;
} UnitTable;

static void table_add(UnitTable* u, const char* name, long rows, long cols, SplitDim split, int groups, const char* by,
                      InitKind init, long fan_in, uint32_t stream) {
    u->t[u->n++] = (Tensor){name, rows, cols, split, groups, by, init, fan_in, 0, stream};
}

// Unit u's table. Stream numbers: the MLP's tensors 0 (the embedding), 2l-1 (linear l's
// weight, or with experts its router) and 2l (its bias); the GPT's tensor k of unit u (in the
// dense block's order) 2^30 + 256 u + k, a block with experts its router k = 12; an expert x's
// tensors the dense ones' plus (x + 1) 2^16 (expert_stream: every number distinct for up to
// 32 blocks and 1024 experts), shared expert s's those of an expert X + s.
#define EXPERT_STREAM(x) ((uint32_t)(((x) + 1) << 16))
static UnitTable unit_table(const Config* c, int u) {
    UnitTable t = {.n = 0};
    long V = c->vocab, L = c->layers;
    if (!is_gpt(c)) {
        long K = linear_in(c, u), J = linear_out(c, u);
        SplitDim w = linear_kind(u) == COLUMN_PARALLEL ? SPLIT_COLUMNS : SPLIT_ROWS;
        SplitDim b = linear_kind(u) == COLUMN_PARALLEL ? SPLIT_COLUMNS : WHOLE;
        const char* by = u == c->layers + 1 && w == SPLIT_COLUMNS ? "vocabulary" : "hidden units";
        if (u == 0) {
            table_add(&t, "emb", V, c->emb, SPLIT_ROWS, 1, "vocabulary", INIT_NORMAL, 0, 0);
        } else if (is_moe(c, u)) { // not split: tensor parallelism refuses the MLP's experts
            table_add(&t, "w_router", K, c->experts, WHOLE, 1, NULL, INIT_UNIFORM, K, 2 * (uint32_t)u - 1);
            for (int s = 0, x = c->experts; s < c->shared_experts; s++, x++) {
                table_add(&t, "shared_w", K, c->hidden, WHOLE, 1, NULL, INIT_UNIFORM, K, 2 * (uint32_t)u - 1 + EXPERT_STREAM(x));
                table_add(&t, "shared_b", 1, c->hidden, WHOLE, 1, NULL, INIT_UNIFORM, K, 2 * (uint32_t)u + EXPERT_STREAM(x));
            }
            t.own = t.n;
            table_add(&t, "w", K, c->hidden, WHOLE, 1, NULL, INIT_UNIFORM, K, 2 * (uint32_t)u - 1);
            table_add(&t, "b", 1, c->hidden, WHOLE, 1, NULL, INIT_UNIFORM, K, 2 * (uint32_t)u);
            t.experts = c->experts;
            return t;
        } else {
            table_add(&t, "w", K, J, w, 1, by, INIT_UNIFORM, K, 2 * (uint32_t)u - 1);
            table_add(&t, "b", 1, J, b, 1, by, INIT_UNIFORM, K, 2 * (uint32_t)u);
            t.t[0].scaled = t.t[1].scaled = 1;
        }
        t.own = t.n;
        return t;
    }
    long C = c->emb, F = 4 * C;
    uint32_t k0 = (1u << 30) + 256u * (uint32_t)u; // + k: tensor k of the unit
    if (u == 0) {
        table_add(&t, "wte", V, C, SPLIT_ROWS, 1, "vocabulary", INIT_NORMAL, 0, k0);
        table_add(&t, "wpe", c->context, C, WHOLE, 1, NULL, INIT_NORMAL, 0, k0 + 1);
    } else if (u == L + 1) {
        table_add(&t, "lm_head", C, V, SPLIT_COLUMNS, 1, "vocabulary", INIT_UNIFORM, C, k0);
        table_add(&t, "ln_f_g", 1, C, WHOLE, 1, NULL, INIT_ONES, 0, k0 + 1);
        table_add(&t, "ln_f_b", 1, C, WHOLE, 1, NULL, INIT_ZEROS, 0, k0 + 2);
    } else {
        table_add(&t, "qkv_w", C, 3 * C, SPLIT_COLUMNS, 3, "heads", INIT_UNIFORM, C, k0);
        table_add(&t, "qkv_b", 1, 3 * C, SPLIT_COLUMNS, 3, "heads", INIT_UNIFORM, C, k0 + 1);
        table_add(&t, "proj_w", C, C, SPLIT_ROWS, 1, "heads", INIT_UNIFORM, C, k0 + 2);
        if (!is_moe(c, u)) {
            table_add(&t, "fc_w", C, F, SPLIT_COLUMNS, 1, "4C", INIT_UNIFORM, C, k0 + 3);
            table_add(&t, "fc_b", 1, F, SPLIT_COLUMNS, 1, "4C", INIT_UNIFORM, C, k0 + 4);
            table_add(&t, "fc2_w", F, C, SPLIT_ROWS, 1, "4C", INIT_UNIFORM, F, k0 + 5);
        }
        table_add(&t, "ln1_g", 1, C, WHOLE, 1, NULL, INIT_ONES, 0, k0 + 6);
        table_add(&t, "ln1_b", 1, C, WHOLE, 1, NULL, INIT_ZEROS, 0, k0 + 7);
        table_add(&t, "proj_b", 1, C, WHOLE, 1, NULL, INIT_UNIFORM, C, k0 + 8);
        table_add(&t, "ln2_g", 1, C, WHOLE, 1, NULL, INIT_ONES, 0, k0 + 9);
        table_add(&t, "ln2_b", 1, C, WHOLE, 1, NULL, INIT_ZEROS, 0, k0 + 10);
        if (!is_moe(c, u)) {
            table_add(&t, "fc2_b", 1, C, WHOLE, 1, NULL, INIT_UNIFORM, F, k0 + 11);
        } else { // the router, then one expert's MLP: held whole (the expert axis splits experts, not their tensors)
            table_add(&t, "w_router", C, c->experts, WHOLE, 1, NULL, INIT_UNIFORM, C, k0 + 12);
            long Fx = expert_width(c);
            for (int s = 0, x = c->experts; s < c->shared_experts; s++, x++) {
                table_add(&t, "shared_fc_w", C, Fx, WHOLE, 1, NULL, INIT_UNIFORM, C, k0 + 3 + EXPERT_STREAM(x));
                table_add(&t, "shared_fc_b", 1, Fx, WHOLE, 1, NULL, INIT_UNIFORM, C, k0 + 4 + EXPERT_STREAM(x));
                table_add(&t, "shared_fc2_w", Fx, C, WHOLE, 1, NULL, INIT_UNIFORM, Fx, k0 + 5 + EXPERT_STREAM(x));
                table_add(&t, "shared_fc2_b", 1, C, WHOLE, 1, NULL, INIT_UNIFORM, Fx, k0 + 11 + EXPERT_STREAM(x));
            }
            t.own = t.n;
            table_add(&t, "fc_w", C, Fx, WHOLE, 1, NULL, INIT_UNIFORM, C, k0 + 3);
            table_add(&t, "fc_b", 1, Fx, WHOLE, 1, NULL, INIT_UNIFORM, C, k0 + 4);
            table_add(&t, "fc2_w", Fx, C, WHOLE, 1, NULL, INIT_UNIFORM, Fx, k0 + 5);
            table_add(&t, "fc2_b", 1, C, WHOLE, 1, NULL, INIT_UNIFORM, Fx, k0 + 11);
            t.experts = c->experts;
            return t;
        }
    }
    t.own = t.n;
    return t;
}
static uint32_t expert_stream(const Tensor* x, long expert) { return x->stream + EXPERT_STREAM(expert); }

// What one rank holds of a unit: tensor-parallel slice r of t of its own tensors (0 of 1:
// all of them), and experts [x_lo, x_hi) whole.
typedef struct {
    int r, t;
    int x_lo, x_hi;
} Share;
static Share share_whole(const Config* c) { return (Share){0, 1, 0, c->experts}; }

// Tensor x on tensor-parallel rank r of t: its split dimension's length in each group, and
// the slice of it a rank holds (padded); and the rank's elements of the tensor.
static long split_length(const Tensor* x) { return (x->split == SPLIT_ROWS ? x->rows : x->cols) / x->groups; }
static long split_slice(const Tensor* x, int t) { return (split_length(x) + t - 1) / t; }
static long tensor_held(const Tensor* x, int t) {
    if (x->split == WHOLE || t == 1) return x->rows * x->cols;
    long slice = split_slice(x, t) * x->groups;
    return x->split == SPLIT_ROWS ? slice * x->cols : x->rows * slice;
}
// Element e of rank r's slice of tensor x, as an element of x in train.c (row-major), or -1:
// padding. Rows: row i of the slice is row r slice + i. Columns: column j of the slice is
// column j % slice of group j / slice, that is column g (length / groups) + r slice + j % slice.
static long tensor_canonical(const Tensor* x, int r, int t, long e) {
    if (x->split == WHOLE || t == 1) return e;
    long slice = split_slice(x, t), len = split_length(x);
    if (x->split == SPLIT_ROWS) {
        long row = r * slice + e / x->cols;
        return row < x->rows ? row * x->cols + e % x->cols : -1;
    }
    long width = slice * x->groups, row = e / width, j = e % width, at = r * slice + j % slice;
    return at < len ? row * x->cols + j / slice * len + at : -1;
}

// The parameters of unit u rank `s` holds: its slices of the unit's own tensors, then its experts.
static long table_own(const UnitTable* t, int tp) {
    long n = 0;
    for (int i = 0; i < t->own; i++) n += tensor_held(&t->t[i], tp);
    return n;
}
static long table_expert(const UnitTable* t) {
    long n = 0;
    for (int i = t->own; i < t->n; i++) n += t->t[i].rows * t->t[i].cols;
    return n;
}
static long share_params(const Config* c, int u, Share s) {
    UnitTable t = unit_table(c, u);
    return table_own(&t, s.t) + (long)(s.x_hi - s.x_lo) * table_expert(&t);
}
// The shape of tensor x a tensor-parallel rank holds, of t: its slice of the split
// dimension (padded), the other whole.
static void tensor_held_shape(const Tensor* x, int t, long* rows, long* cols) {
    *rows = x->split == SPLIT_ROWS ? split_slice(x, t) : x->rows;
    *cols = x->split == SPLIT_COLUMNS ? split_slice(x, t) * x->groups : x->cols;
}
// The table for these flags, as a learner reads it: each tensor, its shape in train.c, how
// t tensor-parallel ranks split it, and what one of them holds (the GPT's blocks are alike:
// the first stands for all).
static void table_print(const Config* c, int t) {
    static const char* how[] = {"whole", "rows", "columns"};
    printf("  what each of %d tensor-parallel ranks holds (config.h's table):\n", t);
    printf("    %-16s %-9s %-13s %-24s %s\n", "unit", "tensor", "shape", "split by", "a rank holds");
    for (int u = 0; u < n_units(c); u++) {
        if (is_gpt(c) && u > 1 && u <= c->layers) continue;
        UnitTable tab = unit_table(c, u);
        char unit[32], shape[32], split[64], held[64];
        if (is_gpt(c) && u == 1 && c->layers > 1) snprintf(unit, sizeof unit, "blocks 1-%d", c->layers);
        else snprintf(unit, sizeof unit, "%s", unit_name(c, u));
        for (int i = 0; i < tab.n; i++) {
            const Tensor* x = &tab.t[i];
            long r, k;
            tensor_held_shape(x, i < tab.own ? t : 1, &r, &k);
            if (x->rows == 1) snprintf(shape, sizeof shape, "[%ld]", x->cols), snprintf(held, sizeof held, "[%ld]", k);
            else snprintf(shape, sizeof shape, "[%ld][%ld]", x->rows, x->cols), snprintf(held, sizeof held, "[%ld][%ld]", r, k);
            if (i >= tab.own) snprintf(split, sizeof split, "each of %d experts: whole", tab.experts);
            else if (x->split == WHOLE) snprintf(split, sizeof split, "whole");
            else snprintf(split, sizeof split, "%s (%s)", how[x->split], x->by);
            if (x->groups > 1) snprintf(split, sizeof split, "columns (%s), in %d groups", x->by, x->groups);
            if (x->split != WHOLE && i < tab.own && split_length(x) % t) strcat(held, ", padded");
            printf("    %-16s %-9s %-13s %-24s %s\n", i == 0 ? unit : "", x->name, shape, split, held);
        }
    }
}
// Of those, the ones this rank counts in the global gradient norm (every element once over
// all ranks): its slices of split tensors, and the whole tensors on tensor-parallel rank 0
// alone; they come first, so they are the first unit_counted elements. (Its experts: as
// another share of the unit, by the caller.)
static long share_counted(const Config* c, int u, Share s) {
    UnitTable t = unit_table(c, u);
    if (s.r == 0) return table_own(&t, s.t);
    long n = 0;
    for (int i = 0; i < t.own && t.t[i].split != WHOLE; i++) n += tensor_held(&t.t[i], s.t);
    return n;
}

// Element e of what rank `s` holds of a unit (its table t), as an element of the unit in
// train.c's layout, or -1 for padding: the mapper that every layout's initialisation,
// checkpoints and gradient norm go through.
static long table_canonical(const UnitTable* t, Share s, long e) {
    long at = 0; // where tensor i starts in train.c's layout
    for (int i = 0; i < t->own; i++) {
        const Tensor* x = &t->t[i];
        long held = tensor_held(x, s.t);
        if (e < held) {
            long k = tensor_canonical(x, s.r, s.t, e);
            return k < 0 ? -1 : at + k;
        }
        e -= held, at += x->rows * x->cols;
    }
    return at + (long)s.x_lo * table_expert(t) + e; // its experts, whole, after the unit's own tensors
}
static long unit_canonical(const Config* c, int u, Share s, long e) {
    UnitTable t = unit_table(c, u);
    return table_canonical(&t, s, e);
}

// Initial values of unit u in train.c's layout, into out[unit_params]: each element a pure
// function of (seed, its tensor's stream, its index in the tensor), so a rank holding any
// slice or shard computes exactly the values train.c uses without building the rest.
// PyTorch's defaults, as makemore uses them: nn.Embedding's N(0, 1), nn.Linear's weights and
// biases uniform in +-1/sqrt(fan in), LayerNorm's gains 1 and biases 0. Measured against
// alternatives for the MLP (validation loss; seeds 42 and 7 unless noted):
//   default model, 25,000 steps:         this 2.156 / 2.151;  +-1/K 2.162 / 2.152;
//                                         He normal, zero bias 2.166 / 2.153
//   --hidden 512 --layers 3, 5,000 steps: this 2.214 / 2.195;  +-1/K 2.585 / 2.569;
//                                         He normal, zero bias 2.165 / 2.138
//   --hidden 128 --layers 2, 25,000:      this 2.109;  He normal, zero bias 2.125
// Bounds of +-1/K shrink the activations layer after layer and fail on deeper models;
// He initialisation and PyTorch's are within noise of each other, and PyTorch's is what
// users compare against.
static void tensor_init(float* out, const Tensor* x, uint32_t stream, uint64_t seed) {
    uint64_t s = ((uint64_t)STREAM_INIT << 32) | stream;
    for (long e = 0; e < x->rows * x->cols; e++) {
        if (x->init == INIT_ONES) out[e] = 1.0f;
        else if (x->init == INIT_ZEROS) out[e] = 0.0f;
        else if (x->init == INIT_NORMAL) out[e] = (float)rng_normal(seed, s, (uint64_t)e);
        else {
            double u = 2.0 * rng_uniform(seed, s, (uint64_t)e) - 1.0;
            out[e] = (float)(x->scaled ? u * (1.0 / sqrt((double)x->fan_in)) : u / sqrt((double)x->fan_in));
        }
    }
}
static void unit_init(float* out, const Config* c, int u, uint64_t seed) {
    UnitTable t = unit_table(c, u);
    for (int i = 0; i < t.own; i++) tensor_init(out, &t.t[i], t.t[i].stream, seed), out += t.t[i].rows * t.t[i].cols;
    for (long x = 0; x < t.experts; x++)
        for (int i = t.own; i < t.n; i++) tensor_init(out, &t.t[i], expert_stream(&t.t[i], x), seed), out += t.t[i].rows * t.t[i].cols;
}

// The GPT's shapes: a block's (transformer.h's BlockDims), its layout (block_layout, or with
// --experts moe_block_layout), and each unit's parameters.
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
    return moe_block_layout(c->emb, c->emb, expert_width(c), c->experts, c->shared_experts);
}
static long gpt_unit_params(const Config* c, int u) {
    long C = c->emb;
    if (u == 0) return (c->vocab + (long)c->context) * C;
    if (u <= c->layers) return is_moe(c, u) ? gpt_moe_layout(c).n : block_layout(c->emb, c->emb, 4 * c->emb).n;
    return C * c->vocab + 2 * C;
}

#pragma GCC diagnostic pop
#endif // CONFIG_H
