/*
 * moe.h: a mixture of experts, the layer that --experts puts in place of every hidden layer
 * of the MLP and of the MLP half of every block of the GPT: a router sends each token to
 * its top k of X experts, and the token's output is their gated sum. Written as steps, so
 * that expert parallelism (train_ep.c) puts its all-to-alls between them; moe_forward and
 * moe_backward, at the end, are the same steps on one process.
 */
#ifndef MOE_H
#define MOE_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "config.h"

// ----------------------------------------------------------------------------
// mixture of experts
//
// With --experts X every hidden layer of the MLP, and the MLP half of every block of the
// GPT, is a mixture of X experts, each shaped like the dense layer it replaces (the GPT's
// as wide as --expert-hidden says, 4C by default), and a router
// (Linear K -> X, no bias):
//
//   in [n][K] --router--> p = softmax(in Wr) [n][X] --> each token's top k experts, gates g
//   (--router sigmoid: p = sigmoid(in Wr), each affinity on its own)
//     --dispatch--> expert x: h = E_x(in) --combine--> out[t] = sum over t's k of g h
//   (--shared-experts S: + the S shared experts' outputs, every token's, no routing)
//
// The MLP's expert is Linear K -> H then ReLU; the GPT's is the block's MLP, fc C -> F,
// GELU, fc2 F -> C (transformer.h's mlp_forward), with weights and biases of its own. A
// token is a row of K floats, whatever it stands for: the MLP's tokens are the rows of a
// pass (n = R); the GPT's are positions, ln2's output rows (the unit around the layer,
// model.h's "a unit with a mixture of experts", says which positions). Nothing below
// depends on what an expert computes (Expert: rows of K floats to rows of H floats).
//
// Choices:
//  - Gates: with k = 1 the router's probability itself (Switch Transformer): renormalised
//    over one expert it would always be 1, and the loss would teach the router nothing;
//    with k >= 2 renormalised over the k chosen (Mixtral's 2, DeepSeek-V3's 8), so that a
//    token's output keeps the scale of one expert's however sure the router is. Ties go to
//    the lower expert index.
//  - Capacity: in a training batch of B tokens, expert x takes at most C = ceil(CF k B / X)
//    of them; past that a token is dropped by x (its term of the output is 0). Priority
//    goes by choice, then by token of the global batch (GShard): every token's first
//    choice before any second choice (moe_plan's worked example). Validation and sampling
//    drop nothing: capacity bounds the work of a training step, and a model judged with
//    drops would be judged on a batch-dependent part.
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
//              | all-gather        every rank's counts
//              moe_plan            from them: which choices the capacity keeps, the
//                                  dispatch order, the rows to and from each rank
//              moe_balance         (training) the load-balancing loss, and the load figures
//              moe_permute         the kept choices' input rows, in the dispatch order
//              | dispatch          each row to the rank holding its expert
//              expert_forward      each expert on the rows it received
//              | combine           each output row back to its token's rank
//              moe_unpermute       each token's gated sum of its experts' outputs
//              moe_shared_forward  plus the shared experts' (none unless --shared-experts)
//   backward   moe_unpermute_backward, | combine's backward, expert_backward,
//              | dispatch's backward, moe_router_backward, moe_permute_backward,
//              moe_shared_backward
// (permute and unpermute: Megatron's names for the local halves of dispatch and combine.
// The backward's all-to-alls are the backward of forward's, in reverse order: combine's
// sends the output gradients the way dispatch went, dispatch's the input gradients back.)

// An expert, as the layer sees it: a function from rows of K floats to rows of H floats,
// with `params` parameters of its own in one block, that keeps `saved` floats a token for
// its backward besides its input and output rows, and works in `tmp` floats and `acc`
// int64s a token of scratch. Two kinds:
//  - the MLP's: Linear K -> H then ReLU (a weight [K][H], then a bias [H]), keeping nothing
//    more (ReLU's backward reads its output), needing no scratch;
//  - the GPT's: the block's MLP, K = H = C, F = 4C or --expert-hidden (transformer.h's mlp_layout), keeping
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
        int C = c->emb, F = expert_width(c);
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

// The layer reads its unit's parameters in two pieces: the router's weight [K][X] (wr), with
// the shared experts' blocks after it, and the routed experts' blocks one after another (we,
// after every parameter every rank holds: moe_replicated_params). Where expert x starts in
// we, on a rank whose first expert is x_lo:
static long moe_expert_at(const Expert* e, int x, int x_lo) { return (long)(x - x_lo) * e->params; }

// What one MoE layer keeps from its forward for its backward, its plan, and its load
// figures. Its words, each with one meaning:
//   token r      one of this rank's n tokens (a row of in [n][K]); choice j: its j-th most
//                probable expert (j < k)
//   place        a choice's position in its expert's queue, which the capacity C cuts
//   routed row   one kept (token, choice), a row of this rank's routed_* buffers, where
//                they are in the dispatch order: by expert (so by the rank holding it), then
//                choice, then token
//   expert row   one row this rank's experts received, a row of the expert_* buffers: by
//                the rank it came from, then expert (then choice, then token)
typedef struct {
    int layer;          // the unit it is, for traces
    Expert e;           // what each of its experts computes
    int rows;           // capacity of the per-token arrays, in tokens
    int n;              // tokens of the last pass (this rank's)
    // the router (moe_route)
    float* probs;       // [rows][X] router probabilities
    float* dprobs;      // [rows][X] backward: their gradient, then the router's output gradient
    int* choice;        // [rows][k] chosen experts, most probable first
    float* gate;        // [rows][k] their weights in the output
    float* dgate;       // [rows][k] backward
    int* counts;        // [k][X] this rank's choices: counts[j][x] tokens whose choice j is x
    double* coef;       // [X] alpha X f_x: the aux loss's gradient on each token's p_x
    // the plan (moe_plan, moe_dispatch), over the `ranks` ranks of the layout
    int ranks;
    int* kept;          // [ranks][X] tokens of rank q that expert x keeps
    long* next_place;   // [k][X] moe_plan: the place this rank's next choice j of x takes in x's queue
    char* keep;         // [rows][k] whether the capacity keeps token r's choice j
    int* routed_at;     // [rows][k] the routed row of token r's choice j, or -1: dropped
    int* next_row;      // [X] moe_dispatch: expert x's next routed row
    int* routed_to;     // [ranks] routed rows for rank q's experts: dispatch sends, combine brings back
    int* expert_from;   // [ranks] expert rows from rank q's tokens: dispatch brings, combine sends back
    long n_routed, n_received; // their sums: this rank's routed rows, and its expert rows
    long routed_cap, received_cap; // the buffers' sizes, in rows
    // this rank's tokens' side: n_routed rows in two buffers, each used forward then, with
    // another width, backward (moe_reserve gives them max(K, H) floats a row)
    int* routed_token;  // [n_routed] the token each routed row is of
    float* routed_in;   // [n_routed][K] forward: the kept choices' input rows, which dispatch sends
    float* routed_dout; // [n_routed][H] backward, in routed_in's memory: their output gradients,
                        // which combine's backward sends
    float* routed_out;  // [n_routed][H] forward: their experts' outputs, which combine brings back
    float* routed_din;  // [n_routed][K] backward, in routed_out's memory: their input gradients,
                        // which dispatch's backward brings
    // this rank's experts' side: n_received rows, each kept for the backward
    float* expert_in;   // [n_received][K] inputs, from dispatch
    float* expert_out;  // [n_received][H] outputs, which combine sends back
    float* expert_saved; // [n_received][saved] what the experts keep besides
    float* expert_dout; // [n_received][H] backward: output gradients, from combine's backward
    float* expert_din;  // [n_received][K] backward: input gradients, which dispatch's backward sends back
    float* tmp;         // [n_received][tmp] the experts' scratch
    int64_t* acc;       // [n_received][acc]
    // the GPT's unit around the layer (acts_init): which positions are its tokens, and their
    // rows of ln2's output, kept for the router's backward; NULL in the MLP's
    int* token;         // [rows] position r T + t of each token, ascending
    float* in;          // [rows][K]
    // --shared-experts S: what each keeps for its backward, and their scratch (moe_shared_forward)
    float* shared_out;   // [S][rows][H] each shared expert's output rows
    float* shared_saved; // [S][rows][saved]
    float* shared_dout;  // [rows][H] backward: a copy of the layer's output gradient, which an expert overwrites
    float* shared_din;   // [rows][K] backward: one shared expert's input gradient
    float* shared_tmp;   // [rows][tmp]
    int64_t* shared_acc; // [rows][acc]
    // load, over the training steps: tokens that chose each expert, and tokens dropped
    double* load_sum;   // [X]
    double dropped_sum;
    long dropped_last, capacity_last, steps;
    double tokens_out, tokens_in;    // routed rows sent to other ranks, and expert rows received from other ranks
    double tokens_sum, own_tokens_sum; // tokens of the batches, and of this rank's share of them
} MoeLayer;

// --balance bias (DeepSeek-V3's auxiliary-loss-free balancing): each MoE layer has a bias per
// expert, added to the affinities to choose a token's experts and never to its gates. After
// each step it moves by --bias-rate against the expert's load: down if the expert got more
// than 1/X of the step's choices, up if fewer. Those counts are the whole batch's, integers
// that every rank computing the layer has alike (the plan needs them), so every layout
// moves the biases alike. Every process stores all layers' biases; it updates only the
// layers it computes, and the rest keep the values --load gave them. Checkpoints carry them.
static struct {
    float* bias;   // [L+2][X]
    long* chose;   // [L+2][X] the step's choices of each expert so far
    long* choices; // [L+2] the step's choices
    char* held;    // [L+2] whether this process computes the layer
    int X;         // experts (a program has one model; tests/test_units.c many)
} moe_bias;
static float* moe_bias_of(const Config* c, int u) {
    if (moe_bias.X != c->experts) {
        free(moe_bias.bias), free(moe_bias.chose), free(moe_bias.choices), free(moe_bias.held);
        moe_bias.X = c->experts;
        moe_bias.bias = callocCheck((size_t)(MAX_LAYERS + 2) * c->experts, sizeof(float));
        moe_bias.chose = callocCheck((size_t)(MAX_LAYERS + 2) * c->experts, sizeof(long));
        moe_bias.choices = callocCheck(MAX_LAYERS + 2, sizeof(long));
        moe_bias.held = callocCheck(MAX_LAYERS + 2, 1);
    }
    return moe_bias.bias + (long)u * c->experts;
}
// The end of a training step: each bias of a layer this process computed moves toward its
// expert's share (every rank calls it after its optimizer step).
static void moe_bias_update(const Config* c) {
    if (c->experts == 0 || c->balance != BALANCE_BIAS) return;
    for (int u = 1; u <= c->layers; u++) {
        float* b = moe_bias_of(c, u);
        long* chose = moe_bias.chose + (long)u * c->experts;
        for (int x = 0; moe_bias.choices[u] > 0 && x < c->experts; x++) {
            long over = chose[x] * c->experts - moe_bias.choices[u]; // X times its choices, against all of them
            b[x] += over > 0 ? -c->bias_rate : over < 0 ? c->bias_rate : 0.0f;
            chose[x] = 0;
        }
        moe_bias.choices[u] = 0;
    }
}

// A layer of experts `e` (unit `layer`), for passes of up to `rows` tokens
static void moe_layer_init(MoeLayer* m, const Config* c, int layer, Expert e, int rows) {
    int X = c->experts, k = c->top_k;
    memset(m, 0, sizeof *m);
    moe_bias_of(c, layer), moe_bias.held[layer] = 1;
    m->layer = layer, m->e = e, m->rows = rows;
    m->probs = mallocCheck((size_t)rows * X * sizeof(float));
    m->dprobs = mallocCheck((size_t)rows * X * sizeof(float));
    m->choice = mallocCheck((size_t)rows * k * sizeof(int));
    m->gate = mallocCheck((size_t)rows * k * sizeof(float));
    m->dgate = mallocCheck((size_t)rows * k * sizeof(float));
    m->counts = mallocCheck((size_t)k * X * sizeof(int));
    m->coef = callocCheck((size_t)X, sizeof(double));
    m->next_place = mallocCheck((size_t)k * X * sizeof(long));
    m->keep = mallocCheck((size_t)rows * k);
    m->routed_at = mallocCheck((size_t)rows * k * sizeof(int));
    m->next_row = mallocCheck((size_t)X * sizeof(int));
    m->load_sum = callocCheck((size_t)X, sizeof(double));
    if (c->shared_experts > 0) {
        long S = c->shared_experts;
        m->shared_out = mallocCheck((size_t)S * rows * e.H * sizeof(float));
        m->shared_saved = mallocCheck((size_t)S * rows * e.saved * sizeof(float));
        m->shared_dout = mallocCheck((size_t)rows * e.H * sizeof(float));
        m->shared_din = mallocCheck((size_t)rows * e.K * sizeof(float));
        m->shared_tmp = mallocCheck((size_t)rows * e.tmp * sizeof(float));
        m->shared_acc = mallocCheck((size_t)rows * e.acc * sizeof(int64_t));
    }
}
static void moe_layer_free(MoeLayer* m) {
    free(m->probs), free(m->dprobs), free(m->choice), free(m->gate), free(m->dgate), free(m->counts), free(m->coef);
    free(m->kept), free(m->next_place), free(m->keep), free(m->routed_at), free(m->next_row), free(m->routed_to);
    free(m->expert_from), free(m->routed_token), free(m->routed_in), free(m->routed_out), free(m->expert_in);
    free(m->expert_out), free(m->expert_saved), free(m->expert_dout), free(m->expert_din), free(m->tmp), free(m->acc);
    free(m->load_sum), free(m->token), free(m->in);
    free(m->shared_out), free(m->shared_saved), free(m->shared_dout), free(m->shared_din), free(m->shared_tmp);
    free(m->shared_acc);
}
// Buffers that depend on the layout and the routing: grown when a pass needs more (the
// first passes only).
static void moe_reserve(MoeLayer* m, const Config* c, int ranks, long n_routed, long n_received) {
    int X = c->experts;
    long K = m->e.K, H = m->e.H, W = K > H ? K : H; // W: routed_in then routed_dout, routed_out then routed_din
    if (m->ranks != ranks) {
        m->ranks = ranks;
        m->kept = reallocCheck(m->kept, (size_t)ranks * X * sizeof(int));
        m->routed_to = reallocCheck(m->routed_to, (size_t)ranks * sizeof(int));
        m->expert_from = reallocCheck(m->expert_from, (size_t)ranks * sizeof(int));
    }
    if (n_routed > m->routed_cap) {
        m->routed_cap = n_routed;
        m->routed_token = reallocCheck(m->routed_token, (size_t)n_routed * sizeof(int));
        m->routed_in = reallocCheck(m->routed_in, (size_t)n_routed * W * sizeof(float));
        m->routed_out = reallocCheck(m->routed_out, (size_t)n_routed * W * sizeof(float));
    }
    m->routed_dout = m->routed_in, m->routed_din = m->routed_out;
    if (n_received > m->received_cap) {
        m->received_cap = n_received;
        m->expert_in = reallocCheck(m->expert_in, (size_t)n_received * W * sizeof(float));
        m->expert_out = reallocCheck(m->expert_out, (size_t)n_received * W * sizeof(float));
        m->expert_saved = reallocCheck(m->expert_saved, (size_t)n_received * m->e.saved * sizeof(float));
        m->expert_dout = reallocCheck(m->expert_dout, (size_t)n_received * W * sizeof(float));
        m->expert_din = reallocCheck(m->expert_din, (size_t)n_received * W * sizeof(float));
        m->tmp = reallocCheck(m->tmp, (size_t)n_received * m->e.tmp * sizeof(float));
        m->acc = reallocCheck(m->acc, (size_t)n_received * m->e.acc * sizeof(int64_t));
    }
}

// The router, on this rank's n tokens in [n][K]: p = softmax(in Wr) (or sigmoid) over the X experts,
// each token's top k (ties to the lower index) and their gates; and the counts of this
// rank's choices (m->counts), which the plan needs from every rank.
static void moe_route(const Config* c, MoeLayer* m, const float* in, const float* wr, int n, Workspace* ws) {
    int X = c->experts, k = c->top_k;
    double t = trace_clock();
    if (n > m->rows) fatal("internal: %d tokens for an MoE layer of %d", n, m->rows);
    m->n = n;
    matmul_float(m->probs, in, wr, n, m->e.K, X, ws);
    const float* bias = c->balance == BALANCE_BIAS ? moe_bias_of(c, m->layer) : NULL; // for choosing only
    for (int r = 0; r < n; r++) {
        float *p = m->probs + (long)r * X, mx = p[0], sum = 0.0f;
        if (c->router == ROUTER_SIGMOID) // --router sigmoid: each affinity on its own
            for (int x = 0; x < X; x++) p[x] = 1.0f / (1.0f + expf(-p[x]));
        else {
            for (int x = 1; x < X; x++) mx = p[x] > mx ? p[x] : mx;
            for (int x = 0; x < X; x++) p[x] = expf(p[x] - mx), sum += p[x];
            for (int x = 0; x < X; x++) p[x] /= sum;
        }
        int* ch = m->choice + (long)r * k;
        for (int j = 0; j < k; j++) { // the j-th most probable expert not chosen yet
            int best = -1;
            for (int x = 0; x < X; x++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= ch[i] == x;
                if (!taken && (best < 0 || (bias ? p[x] + bias[x] > p[best] + bias[best] : p[x] > p[best]))) best = x;
            }
            ch[j] = best;
        }
        // Top-1 keeps its probability as the gate (Switch); top-k renormalises over the
        // chosen (Mixtral, and DeepSeek's routers): g_j = p_j / S, S the sum in choice order.
        float* g = m->gate + (long)r * k;
        if (k == 1) g[0] = p[ch[0]];
        else {
            float s = p[ch[0]];
            for (int j = 1; j < k; j++) s += p[ch[j]];
            if (!(s > 0.0f)) // sigmoids of logits below -88 are 0, and 0 / 0 is no gate
                fatal("the router: a token's %d chosen affinities sum to %g at step %ld (its logits are out of "
                      "range): training has diverged; lower --lr or use --clip", k, s, current_step);
            for (int j = 0; j < k; j++) g[j] = p[ch[j]] / s;
        }
    }
    memset(m->counts, 0, (size_t)k * X * sizeof(int));
    for (int r = 0; r < n; r++)
        for (int j = 0; j < k; j++) m->counts[j * X + m->choice[(long)r * k + j]]++;
    trace_event("compute", t, trace_clock(), 0, "router %d", m->layer);
}

// The tokens of the whole batch, from every rank's counts of choices (counts[ranks][k][X]):
// each token makes one first choice. (The MLP's: its B rows; the GPT's: the positions its
// units route, a number that changes from batch to batch.)
static long moe_batch_tokens(const Config* c, const int* counts, int ranks) {
    long n = 0;
    for (int q = 0; q < ranks; q++)
        for (int x = 0; x < c->experts; x++) n += counts[(long)q * c->top_k * c->experts + x];
    return n;
}
// Each expert's capacity in a pass over a batch of n_total tokens: ceil(CF k B / X) in
// training, no limit otherwise.
static long moe_capacity(const Config* c, long n_total, int training) {
    return training ? (long)ceil((double)c->capacity * c->top_k * n_total / c->experts) : LONG_MAX;
}

// The plan of a pass, in two steps. moe_plan: from every rank's counts of choices
// (counts[ranks][k][X], all of them gathered), each choice's place in its expert's queue:
// every first choice before any second choice, and among the same choice by rank, then
// token (that is, by token of the batch: the ranks hold contiguous ranges of it in rank
// order). A choice is kept if its place is below the capacity C; kept[q][x] counts rank q's
// kept choices of x. moe_dispatch: from them, the routed rows this rank sends each rank,
// the expert rows it receives from each, and where each kept choice goes in the dispatch
// order. A worked example: 2 ranks, X = 4 experts (rank 0 holds 0-1, rank 1 holds 2-3:
// x_first = {0, 2, 4}), k = 2, the batch's tokens t0 t1 on rank 0 and t2 t3 on rank 1,
// C = ceil(1.0 x 2 x 4 / 4) = 2 (--capacity 1):
//   choices (first, second)     t0 (1, 2)   t1 (1, 0)   t2 (1, 3)   t3 (2, 1)
//   expert 1's queue            t0 t1 | t2 t3's second: places 0 1 kept; 2 3 dropped (>= C)
//   expert 2's queue            t3 (first), t0 (second): both kept; expert 0: t1; expert 3: t2
//   kept[q][x]                  rank 0: 1 2 1 0        rank 1: 0 0 1 1
//   routed rows, by expert      rank 0: t1>0 t0>1 t1>1 | t0>2      rank 1: | t3>2 t2>3
//   routed_to                   rank 0: {3, 1}          rank 1: {0, 2}
//   expert rows, by rank        rank 0: t1>0 t0>1 t1>1 |           rank 1: t0>2 | t3>2 t2>3
//   expert_from                 rank 0: {3, 0}          rank 1: {1, 2}
// (t0>2: t0's row for expert 2; | parts the rows by rank.) Rank 1's expert 2 runs on two
// blocks, its rows 0 and 1, one from each rank; expert 3 on its row 2: the expert rows come
// by rank, then expert.
static void moe_dispatch(const Config* c, MoeLayer* m, int rank, const int* x_first, int n);
static void moe_plan(const Config* c, MoeLayer* m, const int* counts, int ranks, int rank, const int* x_first, int n,
                     long C) {
    int X = c->experts, k = c->top_k;
    moe_reserve(m, c, ranks, 0, 0);
    memset(m->kept, 0, (size_t)ranks * X * sizeof(int));
    for (int x = 0; x < X; x++) {
        long place = 0; // along expert x's queue: choice j = 0 of rank 0, of rank 1, ..., then j = 1
        for (int j = 0; j < k; j++)
            for (int q = 0; q < ranks; q++) {
                long chose = counts[((long)q * k + j) * X + x], room = C - place; // places [place, place + chose)
                if (q == rank) m->next_place[j * X + x] = place;
                m->kept[(long)q * X + x] += (int)(room <= 0 ? 0 : room < chose ? room : chose);
                place += chose;
            }
    }
    for (int j = 0; j < k; j++) // this rank's choices, in its tokens' order: kept or dropped
        for (int r = 0; r < n; r++) {
            int x = m->choice[(long)r * k + j];
            m->keep[(long)r * k + j] = m->next_place[j * X + x]++ < C;
        }
    moe_dispatch(c, m, rank, x_first, n);
}
// The rest of the plan, once m->keep says which of this rank's choices are kept and
// m->kept (sized by moe_reserve for m->ranks ranks) how many each rank sends each expert;
// rank q holds experts [x_first[q], x_first[q + 1]). (train_3d.c's grid, whose ranks hold
// parts of rows, finds keep and kept itself, then calls this.)
static void moe_dispatch(const Config* c, MoeLayer* m, int rank, const int* x_first, int n) {
    int X = c->experts, k = c->top_k, ranks = m->ranks;
    const int* my_kept = m->kept + (long)rank * X; // this rank's kept choices of each expert
    m->n_routed = m->n_received = 0;
    for (int q = 0; q < ranks; q++) {
        int to = 0, from = 0;
        for (int x = x_first[q]; x < x_first[q + 1]; x++) to += my_kept[x];                   // rank q's experts
        for (int x = x_first[rank]; x < x_first[rank + 1]; x++) from += m->kept[(long)q * X + x]; // this rank's
        m->routed_to[q] = to, m->expert_from[q] = from;
        m->n_routed += to, m->n_received += from;
    }
    moe_reserve(m, c, ranks, m->n_routed, m->n_received);
    for (int x = 0, row = 0; x < X; x++) m->next_row[x] = row, row += my_kept[x]; // expert x's block of routed rows
    for (int j = 0; j < k; j++)
        for (int r = 0; r < n; r++) {
            int* at = m->routed_at + (long)r * k + j;
            *at = m->keep[(long)r * k + j] ? m->next_row[m->choice[(long)r * k + j]]++ : -1;
            if (*at >= 0) m->routed_token[*at] = r;
        }
}

// Token r's term of the load-balancing loss, sum over x of alpha X f_x P_x: P_x its
// probability, or with --router sigmoid its affinity over the sum of its affinities
// (DeepSeek-V3's balance loss), so that the terms sum to 1 over x either way.
static double moe_aux_sum(const Config* c, const float* p) {
    double s = 0;
    for (int x = 0; c->router == ROUTER_SIGMOID && x < c->experts; x++) s += p[x];
    return c->router == ROUTER_SIGMOID ? s : 1.0;
}
static double moe_aux_term(const Config* c, const MoeLayer* m, int r) {
    const float* p = m->probs + (long)r * c->experts;
    double a = 0;
    for (int x = 0; x < c->experts; x++) a += m->coef[x] * p[x];
    return a / moe_aux_sum(c, p);
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
        for (int q = 0; q < ranks; q++)
            for (int j = 0; j < k; j++) chose += counts[((long)q * k + j) * X + x];
        m->coef[x] = (double)c->aux_loss * X * (double)chose / ((double)k * n_total);
        m->load_sum[x] += (double)chose;
        dropped += chose > C ? chose - C : 0;
        moe_bias.chose[(long)m->layer * X + x] += chose; // --balance bias: the step's counts
    }
    moe_bias.choices[m->layer] += (long)k * n_total;
    m->dropped_sum += (double)dropped, m->dropped_last = dropped, m->capacity_last = C, m->steps++;
    m->tokens_sum += (double)n_total, m->own_tokens_sum += (double)n;
    m->tokens_out += (double)(m->n_routed - m->routed_to[rank]);
    m->tokens_in += (double)(m->n_received - m->expert_from[rank]);
    for (int r = 0; r < n; r++) *aux += fix_term(moe_aux_term(c, m, r), n_total, "load-balancing loss");
}

// The kept choices' input rows, in the dispatch order: routed_in, which dispatch sends
static void moe_permute(MoeLayer* m, const float* in) {
    int K = m->e.K;
    for (long i = 0; i < m->n_routed; i++)
        memcpy(m->routed_in + i * K, in + (long)m->routed_token[i] * K, K * sizeof(float));
}
// out [n][H]: each token's sum over its kept choices, in choice order, of gate x the
// expert's output (routed_out, which combine brought back)
static void moe_unpermute(const Config* c, const MoeLayer* m, float* out, int n) {
    int k = c->top_k, H = m->e.H;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < H; i++) {
            float o = 0.0f;
            for (int j = 0; j < k; j++) {
                int at = m->routed_at[(long)r * k + j];
                if (at >= 0) o += m->gate[(long)r * k + j] * m->routed_out[(long)at * H + i];
            }
            out[(long)r * H + i] = o;
        }
}

// Backward of moe_unpermute, from dout [n][H]: the gates' gradients, dot(dout, h), and each
// kept choice's output gradient, gate x dout, into routed_dout (which combine's backward sends).
static void moe_unpermute_backward(const Config* c, MoeLayer* m, const float* dout, int n) {
    int k = c->top_k, H = m->e.H;
    double t = trace_clock();
    for (int r = 0; r < n; r++)
        for (int j = 0; j < k; j++) {
            int at = m->routed_at[(long)r * k + j];
            float d = 0.0f;
            if (at >= 0)
                for (int i = 0; i < H; i++) d += dout[(long)r * H + i] * m->routed_out[(long)at * H + i];
            m->dgate[(long)r * k + j] = d;
        }
    for (long i = 0; i < m->n_routed; i++) {
        int r = m->routed_token[i], j = 0;
        while (m->routed_at[(long)r * k + j] != i) j++;
        for (int e = 0; e < H; e++) m->routed_dout[i * H + e] = m->gate[(long)r * k + j] * dout[(long)r * H + e];
    }
    trace_event("compute", t, trace_clock(), 0, "gates %d", m->layer);
}
// Backward of the router, from the gates' gradients: gates -> probabilities (+ the aux
// loss's alpha X f_x) -> softmax (or sigmoid) -> scores; the router's exact weight gradient added into
// g, and its input gradient to din [n][K].
static void moe_router_backward(const Config* c, MoeLayer* m, const float* wr, int64_t* g, const float* in,
                                float* din, int n, long terms, Workspace* ws) {
    int X = c->experts, k = c->top_k;
    double t = trace_clock();
    for (int r = 0; r < n; r++) {
        const float *p = m->probs + (long)r * X, *gate = m->gate + (long)r * k, *dg = m->dgate + (long)r * k;
        const int* ch = m->choice + (long)r * k;
        float* dp = m->dprobs + (long)r * X;
        // sigmoid: P_x = p_x / A, A the sum of all X affinities
        double a = moe_aux_term(c, m, r), A = moe_aux_sum(c, p);
        for (int x = 0; x < X; x++) dp[x] = (float)(c->router == ROUTER_SIGMOID ? (m->coef[x] - a) / A : m->coef[x]);
        if (k == 1) dp[ch[0]] += dg[0];
        else { // g_j = p_j / s, s the sum of the k chosen: dp_j += (dg_j - sum_i dg_i g_i) / s
            float s = p[ch[0]], dot = dg[0] * gate[0];
            for (int j = 1; j < k; j++) s += p[ch[j]], dot += dg[j] * gate[j];
            for (int j = 0; j < k; j++) dp[ch[j]] += (dg[j] - dot) / s;
        }
        if (c->router == ROUTER_SIGMOID) { // ds_x = dp_x p_x (1 - p_x), in place
            for (int x = 0; x < X; x++) dp[x] = dp[x] * p[x] * (1.0f - p[x]);
            continue;
        }
        float dot = 0.0f; // softmax: ds_x = p_x (dp_x - sum_y p_y dp_y), in place
        for (int x = 0; x < X; x++) dot += p[x] * dp[x];
        for (int x = 0; x < X; x++) dp[x] = p[x] * (dp[x] - dot);
    }
    linear_backward_weight(g, NULL, in, m->dprobs, n, m->e.K, X, terms, ws);
    linear_backward_input(din, m->dprobs, wr, n, m->e.K, X, ws);
    trace_event("compute", t, trace_clock(), 0, "router backward %d", m->layer);
}
// Backward of moe_permute: each kept choice's input gradient (routed_din, which dispatch's
// backward brought) added to its token's row of din [n][K], in choice order
static void moe_permute_backward(const Config* c, const MoeLayer* m, float* din, int n) {
    int k = c->top_k, K = m->e.K;
    for (int r = 0; r < n; r++)
        for (int j = 0; j < k; j++) {
            int at = m->routed_at[(long)r * k + j];
            if (at >= 0)
                for (int i = 0; i < K; i++) din[(long)r * K + i] += m->routed_din[(long)at * K + i];
        }
}

// --shared-experts S (DeepSeek's shared experts): S more experts, each shaped like a routed
// one, that every token passes through with a gate of 1, so that what all tokens need is
// learnt once and the routed experts can specialise. Their blocks follow the router's weight
// wr [K][X]; every rank of expert parallelism holds them, as it holds the router, and runs
// them on its own tokens: no all-to-all, and their gradients are all-reduced with the
// router's. A token's output is its routed sum, then each shared expert's output added in
// order, the same float additions in every layout.
// Where the shared experts start after wr (and their gradients after the router's)
static long moe_shared_at(const Config* c, const MoeLayer* m) { return (long)m->e.K * c->experts; }
// out [n][H] += each shared expert's output on in [n][K]; it keeps its output rows for
// backward (shared_out), and backward takes in again from the caller
static void moe_shared_forward(const Config* c, MoeLayer* m, const float* wr, const float* in, float* out, int n,
                               Workspace* ws) {
    const Expert* e = &m->e;
    const float* w = wr + moe_shared_at(c, m);
    double t = trace_clock();
    for (int s = 0; s < c->shared_experts; s++) {
        float* h = m->shared_out + (long)s * m->rows * e->H;
        expert_forward(e, h, m->shared_saved + (long)s * m->rows * e->saved, in, w + s * e->params, n, m->shared_tmp,
                       m->shared_acc, ws);
        for (long i = 0; i < (long)n * e->H; i++) out[i] += h[i];
    }
    if (c->shared_experts > 0) trace_event("compute", t, trace_clock(), 0, "shared experts %d", m->layer);
}
// Its backward, from dout [n][H]: each shared expert's input gradient added to din [n][K], in
// order, and its exact weight gradient added into its block of g (laid out as wr's)
static void moe_shared_backward(const Config* c, MoeLayer* m, const float* wr, int64_t* gr, const float* in,
                                const float* dout, float* din, int n, long terms, Workspace* ws) {
    const Expert* e = &m->e;
    const float* w = wr + moe_shared_at(c, m);
    int64_t* g = gr + moe_shared_at(c, m);
    double t = trace_clock();
    for (int s = 0; s < c->shared_experts; s++) {
        memcpy(m->shared_dout, dout, (size_t)n * e->H * sizeof(float));
        expert_backward(e, m->shared_din, g + s * e->params, m->shared_dout, in, m->shared_out + (long)s * m->rows * e->H,
                        m->shared_saved + (long)s * m->rows * e->saved, w + s * e->params, n, terms, m->shared_tmp,
                        m->shared_acc, ws);
        for (long i = 0; i < (long)n * e->K; i++) din[i] += m->shared_din[i];
    }
    if (c->shared_experts > 0) trace_event("compute", t, trace_clock(), 0, "shared experts backward %d", m->layer);
}

// The layer on one process (train.c), in [n][K] -> out [n][H]: every expert is here, so the
// counts are all its own and dispatch and combine are copies (train_ep.c: all-to-alls). `wr`
// is the router's weight, `we` the experts' blocks; these n tokens are the whole batch;
// `training` applies the capacity and adds the tokens' load-balancing terms to *aux (an
// exact sum).
static void moe_forward(const Config* c, const float* wr, const float* we, MoeLayer* m, const float* in, float* out,
                        int n, int training, int64_t* aux, Workspace* ws) {
    const Expert* e = &m->e;
    int x_first[2] = {0, c->experts}; // one rank, every expert
    moe_route(c, m, in, wr, n, ws);
    long n_total = moe_batch_tokens(c, m->counts, 1), C = moe_capacity(c, n_total, training);
    moe_plan(c, m, m->counts, 1, 0, x_first, n, C);
    if (training) moe_balance(c, m, m->counts, 1, 0, n, n_total, C, aux);
    moe_permute(m, in);
    memcpy(m->expert_in, m->routed_in, (size_t)m->n_routed * e->K * sizeof(float)); // dispatch
    double t = trace_clock();
    for (int x = 0, at = 0; x < c->experts; at += m->kept[x], x++)
        if (m->kept[x] > 0)
            expert_forward(e, m->expert_out + (long)at * e->H, m->expert_saved + (long)at * e->saved,
                           m->expert_in + (long)at * e->K, we + moe_expert_at(e, x, 0), m->kept[x], m->tmp, m->acc, ws);
    trace_event("compute", t, trace_clock(), 0, "experts %d", m->layer);
    memcpy(m->routed_out, m->expert_out, (size_t)m->n_routed * e->H * sizeof(float)); // combine
    moe_unpermute(c, m, out, n);
    moe_shared_forward(c, m, wr, in, out, n, ws);
}
// Its backward: from dout [n][H], the input gradient din [n][K], and the exact weight
// gradients of the router and of every expert added into gr and ge (laid out as wr and we);
// `terms`: tokens in the whole batch, or a bound on them alike in every layout.
static void moe_backward(const Config* c, const float* wr, const float* we, int64_t* gr, int64_t* ge, MoeLayer* m,
                         const float* in, const float* dout, float* din, int n, long terms, Workspace* ws) {
    const Expert* e = &m->e;
    moe_unpermute_backward(c, m, dout, n);
    memcpy(m->expert_dout, m->routed_dout, (size_t)m->n_routed * e->H * sizeof(float)); // combine's backward
    double t = trace_clock();
    for (int x = 0, at = 0; x < c->experts; at += m->kept[x], x++)
        if (m->kept[x] > 0) {
            long off = moe_expert_at(e, x, 0);
            expert_backward(e, m->expert_din + (long)at * e->K, ge + off, m->expert_dout + (long)at * e->H,
                            m->expert_in + (long)at * e->K, m->expert_out + (long)at * e->H,
                            m->expert_saved + (long)at * e->saved, we + off, m->kept[x], terms, m->tmp, m->acc, ws);
        }
    trace_event("compute", t, trace_clock(), 0, "experts backward %d", m->layer);
    memcpy(m->routed_din, m->expert_din, (size_t)m->n_routed * e->K * sizeof(float)); // dispatch's backward
    moe_router_backward(c, m, wr, gr, in, din, n, terms, ws);
    moe_permute_backward(c, m, din, n);
    moe_shared_backward(c, m, wr, gr, in, dout, din, n, terms, ws);
}

#pragma GCC diagnostic pop
#endif // MOE_H
