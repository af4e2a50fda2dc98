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

#pragma GCC diagnostic pop
#endif // CONFIG_H
