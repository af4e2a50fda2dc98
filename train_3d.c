/*
 * train_3d.c: 3D, 4D and 5D parallel: fully sharded data parallel, tensor parallel, pipeline
 * parallel and (the GPT) context and expert parallel at once, the way the largest models
 * are trained. The ranks form a grid T (tensor) x C (context) x P (pipeline) x D (data),
 * Llama 3's order: along the pipeline, microbatches follow a schedule through P stages;
 * inside a stage, every layer is split across T tensor-parallel ranks, and each row's
 * positions across C context-parallel ranks; each (tensor slice, stage) is sharded with
 * ZeRO across the D x C ranks that hold it for other rows and positions. With --experts
 * (the GPT's blocks) and --ep E, the expert axis is carved out of the data axis, as in
 * Megatron-LM and DeepSeek-V3: see "the expert axis" below. It prints exactly what train.c
 * prints for the same flags, in every grid.
 *
 *   --tp 2 --dp 2 --pp 2, world rank = ((dp x P + pp) x C + cp) x T + tp  (here C = 1)
 *
 *                    data replica 0 (rows 0-15)      data replica 1 (rows 16-31)
 *   stage 0 (pp 0)   rank 0 | rank 1   <-- ZeRO -->   rank 4 | rank 5
 *                    tp 0     tp 1                    tp 0     tp 1
 *                      |  activations / gradients       |
 *   stage 1 (pp 1)   rank 2 | rank 3   <-- ZeRO -->   rank 6 | rank 7
 *
 *   with --cp 2 each box above is two: the ranks of context 0 and 1 take positions
 *   {0-3, 12-15} and {4-11} of every row (train_cp.c's zigzag), and pass K and V round
 *
 *   with --model gpt --experts 4 --ep 2, data replicas 0 and 1 form an expert-parallel
 *   group: ranks 0 and 1 hold experts 0-1 of each block of stage 0 (whole: tensor
 *   parallelism splits their attention, not their experts), ranks 4 and 5 experts 2-3;
 *   each block's tokens go to their experts' rank and back by all-to-all, between ranks 0
 *   and 4, 1 and 5, 2 and 6, 3 and 7
 *
 * Per rank and step, each axis by its own program's formula (train_tp.c for this replica's
 * rows through this stage's units; train_cp.c's K and V for them; train_fsdp.c for this
 * rank's slices of them, once per microbatch; train_pp.c for this replica's rows at a
 * slice's width; train_ep.c's all-to-alls for the tokens routed), plus the loss and the
 * clipping norm over the whole grid. Memory: ZeRO's, on this stage's tensor-parallel slices
 * and its experts, plus the pipeline's peak activations.
 *
 * A step's communication, axis by axis (the calls are the strategies' own, made from here):
 *   axis      group              what                                          called from
 *   tensor    tp_group (T)       f and g: all-reduces, with --sp all-gathers    the units' passes in
 *                                and reduce-scatters (train_tp.c tp_f_, tp_g_)  stage_forward/_backward
 *   context   cp_group (C)       K, V round the ring or all-gathered; dK, dV    the block's attention
 *                                home (train_cp.c cp_attention_*)               (the tensor block's hook)
 *   pipeline  pp_group (P)       activations and gradients between stages       pp_step (train_pp.c)
 *   data      dp_group (D x C)   ZeRO: a unit's all-gather before use, its      fsdp_unit_params,
 *                                gradient's reduce-scatter after (ZeRO-1: one   fsdp_reduce_unit_grads,
 *                                all-reduce), the updated shards' all-gather;   fsdp_reduce_grads, fsdp_step;
 *                                the loss's sum (last stage)                    main
 *   expert    ep_group (E)       the routing counts gathered; dispatch and      grid_plan, grid_moe_forward/
 *                                combine all-to-alls (train_ep.c)               _backward
 *             edp_group (D/E x C) ZeRO on the experts, as data above            the same fsdp_* calls
 *   all       world_group        the aux loss, the clipping norm                main
 *
 *   make train_3d && mpirun -n 8 --oversubscribe ./train_3d --tp 2 --dp 2 --pp 2
 *   mpirun -n 6 --oversubscribe ./train_3d --tp 2 --pp 3 --layers 3 --zero 1 --schedule gpipe
 *   mpirun -n 8 --oversubscribe ./train_3d --tp 2 --dp 2 --pp 2 --layers 4 --schedule zbv
 *   mpirun -n 16 --oversubscribe ./train_3d --model gpt --tp 2 --cp 2 --pp 2 --dp 2   # 4D
 *   mpirun -n 16 --oversubscribe ./train_3d --model gpt --experts 4 --tp 2 --cp 2 --pp 2 --dp 2 --ep 2 \
 *       --microbatches 1                                                               # 5D
 *
 * Compare with ./train: the same losses, names and final checkpoint, in every grid.
 *
 * It adds little logic of its own: the strategies come from train_fsdp.c, train_tp.c,
 * train_pp.c, train_cp.c and train_ep.c, included below without their programs, and
 * compose through their parameters: a group of ranks for each, the pipeline's StageWork,
 * FSDP's unit sizes, the attention a tensor-parallel block takes from the context axis, the
 * plan an expert-parallel layer takes from the grid. What is new: the grid of communicators,
 * a stage whose units are tensor-parallel and FSDP-sharded, a block whose experts are
 * sharded apart from it, train.c's capacity over the whole grid's tokens, and the global
 * gradient norm across every axis.
 *
 * Sections: the state of one run; the strategy (the grid; the expert axis; a stage's work;
 * the norm and what a rank holds); the forward pass and the figures; options; main.
 */
#define TRAIN_3D // take the strategies of these files, not their programs
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function" // their programs use a few functions this one does not
#include "train_fsdp.c"
#include "train_tp.c"
#include "train_pp.c"
#include "train_cp.c"
#include "train_ep.c"
#pragma GCC diagnostic pop

#define RUN_LINE "mpirun -n 8 ./train_3d --tp 2 --dp 2 --pp 2"

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    Dataset ds;     // the data
    int T, D, P, Cp;      // --tp, --dp, --pp, --cp
    int E, ep_given;      // --ep: expert-parallel ranks, out of the D data-parallel ones
    int ring, zigzag;     // --cp-comm, --cp-split
    int ring_given, split_given;
    int zero, prefetch;   // --zero, --prefetch
    int M, sched, V, timeline; // --microbatches, --schedule, chunks a rank (--virtual; zbv: 2), --timeline
    int M_given;
    int sp;               // --sp: sequence parallelism on the tensor axis (the GPT)
    Group tp_group;       // the T ranks with this rank's (dp, pp): one stage's tensor-parallel slices
    Group cp_group;       // the C ranks with its (tp, pp, dp): the positions of its rows
    Group dp_group;       // the D x C ranks with its (tp, pp): the other rows and positions of its slice
    Group pp_group;       // the P ranks with its (tp, dp): the stages of its pipeline
    Group ep_group;       // the E ranks with its (tp, cp, pp) and dp / E: the expert all-to-alls
    Group edp_group;      // the D / E x C ranks with its (tp, pp) and dp % E: its experts, for other rows and positions
    Group world_group;    // every rank: the clipping norm over the whole grid, the load-balancing loss
    Tp tensor;            // this rank's tensor-parallel slice of every unit
    Fsdp fsdp;            // those slices of this stage's units, sharded across the data-parallel ranks
    Pp pipe;              // this stage of the pipeline
    Cp context;           // its positions, and attention across the context axis
    // --experts: the expert axis
    Ep experts;           // this rank's experts of every block, and their all-to-alls (train_ep.c)
    Fsdp expert_fsdp;     // those experts of this stage's blocks, sharded across edp_group
    int training;         // the pass at hand is a training step's: capacity and the load-balancing loss apply
    int64_t aux;          // the step's load-balancing terms of this rank's tokens (exact)
    int rows_max;         // the most rows a data-parallel replica takes: ceil(B / D)
    int *pos_rank, *pos_at; // [T] the context-parallel rank holding each position, and its index there
    int* choices;         // [D C][rows_max][Tq][k] --microbatches 1: every token's choices of the batch
    unsigned char* keep;  // the same: whether the capacity keeps each choice
    int* batch_counts;    // [k][X] the batch's choices, by slot and expert
    double routed[MAX_LAYERS + 2]; // tokens each block sent to and received from other ranks of its EP group
    int first[MAX_LAYERS + 3]; // chunk k holds units [first[k], first[k+1])
    UnitSizes sizes;           // what each unit holds per row on this rank (train_tp.c's tp_sizes)
    Workspace ws;
    Holding mine;   // what this rank holds of the model, for checkpoints
} Run;

static void run_free(Run* r) {
    dataset_free(&r->ds), fsdp_free(&r->fsdp), tp_free(&r->tensor), pp_free(&r->pipe), workspace_free(&r->ws);
    if (r->context.pos) cp_free(&r->context);
    if (r->cfg.experts) fsdp_free(&r->expert_fsdp), ep_free(&r->experts);
    free(r->pos_rank), free(r->pos_at), free(r->choices), free(r->keep), free(r->batch_counts);
}

// ----------------------------------------------------------------------------
// the strategy: a grid of groups
//
// World rank = ((dp * P + pp) * C + cp) * T + tp: tensor-parallel ranks are adjacent (they
// talk the most: every layer, forward and backward), then context-parallel (K and V, every layer),
// then pipeline, then data-parallel (once a step), Llama 3's order. MPI_Comm_split gives
// each rank its groups: the ranks that share every other coordinate (the T ranks with its
// (cp, pp, dp), the C with its (tp, pp, dp), the P with its (tp, cp, dp)), and for ZeRO,
// the loss and validation the D x C ranks with its (tp, pp): the same slice of the same
// stage for other rows (dp) and other positions (cp), whose gradients add up.
//
// The expert axis (--ep E) is carved out of the data axis, Megatron-LM's and DeepSeek-V3's
// layout, so the grid stays T x C x P x D: data replica dp is expert-parallel rank
// ep = dp % E of the group of replicas dp / E (E consecutive replicas, as Megatron orders
// the expert-parallel ranks inside the data-parallel ones). Within its EP group, the E ranks
// with its (tp, cp, pp) and dp / E, a rank holds the attention, LayerNorms and router of
// its blocks like every data-parallel rank, and a contiguous range of each block's X
// experts (train_ep.c's split): its tokens go to their experts' ranks by all-to-all and
// come back. Its experts' gradients then sum over the D / E x C ranks holding the same
// experts for other rows (dp / E) and positions (cp): the expert-data-parallel group,
// across which ZeRO shards them, as the D x C data-parallel group shards everything else.
static void grid_coords(const Run* r, int rank, int* tp, int* cp, int* pp, int* dp) {
    *tp = rank % r->T, *cp = rank / r->T % r->Cp, *pp = rank / (r->T * r->Cp) % r->P, *dp = rank / (r->T * r->Cp * r->P);
}
static void grid_split(Run* r) {
    int tp, cp, pp, dp, E = r->E;
    grid_coords(r, world_rank, &tp, &cp, &pp, &dp);
    Group* g[6] = {&r->tp_group, &r->cp_group, &r->pp_group, &r->dp_group, &r->ep_group, &r->edp_group};
    int color[6] = {(dp * r->P + pp) * r->Cp + cp, (dp * r->P + pp) * r->T + tp, (dp * r->Cp + cp) * r->T + tp,
                    pp * r->T + tp, ((dp / E * r->P + pp) * r->Cp + cp) * r->T + tp, (dp % E * r->P + pp) * r->T + tp};
    int key[6] = {tp, cp, pp, dp * r->Cp + cp, dp % E, dp / E * r->Cp + cp};
    const char* name[6] = {"tp", "cp", "pp", "dp", "ep", "edp"};
    for (int k = 0; k < 6; k++) {
        MPI_Comm_split(MPI_COMM_WORLD, color[k], key[k], &g[k]->comm);
        MPI_Comm_rank(g[k]->comm, &g[k]->rank);
        MPI_Comm_size(g[k]->comm, &g[k]->size);
        g[k]->name = name[k];
        g[k]->sent = g[k]->received = 0;
    }
    r->world_group = group_world("world");
}

// The attention of a tensor-parallel block (train_tp.c), with --cp: its heads, over every
// context-parallel rank's positions (train_cp.c), at the block's shape of this pass.
static void grid_attend(void* ctx, BlockActs* a) {
    Run* r = ctx;
    r->context.dims = r->tensor.dims;
    cp_attention_forward(&r->context, a);
}
static void grid_attend_backward(void* ctx, const BlockActs* a, const float* datty, float* dqkv) {
    Run* r = ctx;
    r->context.dims = r->tensor.dims;
    cp_attention_backward(&r->context, a, datty, dqkv);
}

// ----------------------------------------------------------------------------
// the strategy: the expert axis (--experts, the GPT's blocks)
//
// A block with experts runs its attention half as the dense block does (train_tp.c's, its
// heads split; train_cp.c's attention across the context axis), then the layer of experts
// on ln2's output at its tokens (the positions it holds with a target, in training) within
// its EP group (train_ep.c's all-to-alls), then the residual.
//
// Tensor parallelism does not split the experts (Megatron's expert tensor parallelism,
// which splits each expert's F across ranks of its own, is a later refinement): each
// tensor-parallel rank holds its EP share of the experts whole and, as --sp is refused,
// routes the same tokens as the others, with the same bits: redundant work, but no
// communication on the tensor axis around the layer, and the experts' and router's
// gradients are the same on every tensor-parallel rank, counted once in the norm like a
// replicated tensor's. (With --sp the tensor-parallel ranks would hold different tokens,
// and those gradients would have to be summed over them as the LayerNorms' are.)
//
// Capacity and the load-balancing loss are batch-wide in train.c: a token's place among
// all the batch's tokens that chose its expert, by slot, then by token (rows, then
// positions), and f_x counted over the whole batch. The tokens of an EP group are some of
// the batch's rows, and of them only some positions, so with one microbatch every rank
// gathers every token's choices from the D x C ranks that hold the batch's rows and
// positions (k ints a token) and runs train.c's rule on the whole batch (grid_plan). With
// several microbatches that cannot be exact: a replica routes its microbatch 0 before other
// replicas have routed the rows that come earlier in the batch, which their own microbatch
// 0 is waiting to exchange with it, and backward needs f_x of the whole batch before the
// forwards of the later microbatches have run. So grid_resolve allows several only when
// nothing depends on the whole batch: a capacity that drops nothing and no load-balancing
// loss (DeepSeek-V3 drops no tokens and uses no batch-wise auxiliary loss); the plan is
// then train_ep.c's, over the EP group's tokens of the microbatch.

// A block with experts on this rank: its attention split by heads as the dense block's, its
// LayerNorms, row-parallel bias and router whole, in transformer.h's moe_block_layout; its
// experts held apart, whole, by the expert axis.
static MoeBlockLayout grid_moe_layout(const Tp* t, const Config* c) {
    return moe_block_layout(c->emb, t->dims.A, 4 * c->emb, c->experts);
}
// A block with experts on this rank: its heads (train_tp.c's dims) and no MLP of its own
static BlockDims grid_moe_dims(Run* r, int R) {
    r->tensor.dims.R = R;
    BlockDims d = r->tensor.dims;
    d.F = 0;
    return d;
}

// The plan of a training pass with one microbatch: every token's choices of the whole batch
// (k ints a token, gathered from the D x C ranks), train.c's rule on them on every rank,
// then this rank's share. Otherwise train_ep.c's, within the EP group.
static void grid_plan(void* ctx, const Config* c, MoeLayer* m, int n, int training, int64_t* aux) {
    Run* r = ctx;
    if (!training || r->M > 1) {
        ep_plan(&r->experts, c, m, n, training, aux); // the EP group's counts (nothing dropped: grid_resolve)
        return;
    }
    int k = c->top_k, X = c->experts, Tq = r->tensor.dims.Tq, Cp = r->Cp, me = r->dp_group.rank;
    int E = r->experts.ep->size, ep = r->experts.ep->rank; // its EP group: replicas me / Cp / E * E + q
    long share = (long)r->rows_max * Tq * k; // [rows_max][Tq][k] a rank: -1 where no token
    int* all = r->choices;
    int* mine = all + me * share;
    for (long i = 0; i < share; i++) mine[i] = -1;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++) mine[(long)m->token[i] * k + j] = m->choice[(long)i * k + j];
    group_allgather(&r->dp_group, mine, all, share, MPI_INT); // every token's choices, on every rank
    // train.c's rule: places by slot, then by token of the batch: replicas in order, their
    // rows, each row's positions, each held by the context-parallel rank pos_rank[t]
    long n_total = 0;
    for (long i = 0; i < (long)r->D * Cp * share; i += k) n_total += all[i] >= 0;
    long C = moe_capacity(c, n_total, 1);
    int* place = r->batch_counts; // [X] while placing, then the batch's counts by slot and expert
    memset(place, 0, sizeof(int) * X);
    for (int j = 0; j < k; j++)
        for (int dp = 0; dp < r->D; dp++)
            for (int row = 0; row < r->rows_max; row++)
                for (int t = 0; t < c->context; t++) {
                    long e = ((((long)dp * Cp + r->pos_rank[t]) * r->rows_max + row) * Tq + r->pos_at[t]) * k + j;
                    if (all[e] >= 0) r->keep[e] = place[all[e]]++ < C;
                }
    // what each rank of this EP group sends each expert, kept; which of this rank's are kept
    moe_reserve(m, c, E, 0, 0);
    for (int q = 0; q < E; q++) {
        long first = (long)((me / Cp / E * E + q) * Cp + me % Cp) * share; // its replica dp / E * E + q, this cp
        int* kept = m->kept + (long)q * X;
        memset(kept, 0, sizeof(int) * X);
        for (long e = first; e < first + share; e++)
            if (all[e] >= 0 && r->keep[e]) kept[all[e]]++;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++) m->keep[(long)i * k + j] = r->keep[me * share + (long)m->token[i] * k + j];
    moe_dispatch(c, m, ep, r->experts.x_first, n);
    // the load-balancing loss, f_x over the whole batch (its counts, summed as one rank's)
    memset(place, 0, sizeof(int) * k * X);
    for (long i = 0; i < (long)r->D * Cp * share; i++)
        if (all[i] >= 0) place[i % k * X + all[i]]++;
    moe_balance(c, m, place, 1, ep, n, n_total, C, aux);
}

// Forward of block u with experts: w its dense part (this rank's heads, LayerNorms, router:
// train_tp.c's tp_moe_layout), we this rank's experts, both as FSDP gathered them.
static void grid_moe_forward(Run* r, int u, const float* w, const float* we, Acts* a, Scratch* s, int R) {
    const Config* c = &r->cfg;
    Tp* t = &r->tensor;
    double t0 = trace_clock();
    BlockDims d = grid_moe_dims(r, R);
    MoeBlockLayout l = grid_moe_layout(t, c);
    BlockParams p = moe_block_params(w, &l);
    BlockActs ba = acts_block(a, u, &d, d.Tq);
    Tokens k = tp_tokens(t, R);
    MoeLayer* m = &a->moe[u];
    tp_block_forward_attention(t, &p, &ba, a->out[u - 1], s, k, &r->ws); // x1 and ln2's output, every token
    m->n = gpt_moe_tokens(c, m, a, &d);
    gpt_moe_gather(m->in, m, ba.ln2, c->emb);
    ep_moe_forward(&r->experts, c, w + l.router_w, we, m, m->in, s->tmp, m->n, a->training, &r->aux, &r->ws);
    gpt_moe_residual(a->out[u], ba.x1, m, s->tmp, k.all, c->emb);
    if (a->training) { // for the all-to-all's formula
        int me = r->experts.ep->rank;
        r->routed[u] += (double)(m->n_routed - m->routed_to[me]) + (double)(m->n_received - m->expert_from[me]);
    }
    trace_event("compute", t0, trace_clock(), 0, "forward %s", unit_name(c, u));
}
// Its backward, whole: the layer's backward gives the experts' and the router's weight
// gradients along with its input gradient (model.h), so even a schedule that runs I and W
// apart (the input and weight halves of backward, schedules.h) runs a block with experts
// whole at its I; then both parts' gradients are reduced.
static void grid_moe_backward(Run* r, int u, const float* w, Acts* a, Scratch* s, int R, long batch, int prev) {
    const Config* c = &r->cfg;
    Tp* t = &r->tensor;
    double t0 = trace_clock();
    const float* we = fsdp_unit_params(&r->expert_fsdp, u, prev);
    int64_t *g = fsdp_unit_grads(&r->fsdp, u), *ge = fsdp_unit_grads(&r->expert_fsdp, u);
    BlockDims d = grid_moe_dims(r, R);
    MoeBlockLayout l = grid_moe_layout(t, c);
    BlockParams p = moe_block_params(w, &l);
    BlockGrads gg = moe_block_grads(g, &l);
    BlockActs ba = acts_block(a, u, &d, d.Tq);
    BlockStash st = block_stash(s->stash, &d, R);
    Tokens k = tp_tokens(t, R);
    MoeLayer* m = &a->moe[u];
    long terms = batch * c->context;
    gpt_moe_gather(s->tmp, m, s->dout, c->emb); // the tokens' output gradients
    ep_moe_backward(&r->experts, c, w + l.router_w, we, g + l.router_w, ge, m, m->in, s->tmp, s->din, terms, &r->ws);
    gpt_moe_scatter(st.dln2, m, s->din, k.all, c->emb); // ln2's output gradient: the tokens', 0 elsewhere
    tp_block_backward_input_attention(t, &p, &ba, &st, a->out[u - 1], s, k, &r->ws);
    tp_block_backward_weight_attention(t, &gg, &ba, &st, a->out[u - 1], k, terms, &r->ws);
    fsdp_reduce_unit_grads(&r->fsdp, u);
    fsdp_reduce_unit_grads(&r->expert_fsdp, u);
    trace_event("compute", t0, trace_clock(), 0, "backward %s", unit_name(c, u));
}

// ----------------------------------------------------------------------------
// the strategy: a stage's work

// A chunk's work (the pipeline's StageWork): its units in order, each one's
// tensor-parallel slice gathered by FSDP just before use (a block with experts, its
// experts too); each unit's weight gradient, whenever the schedule runs it, is
// reduce-scattered at once (ZeRO-2 and 3; ZeRO-1 all-reduces every gradient after the
// schedule, in main). With --cp, the head's targets are those of this rank's
// positions.
// (Unit u if it is a block with experts of the chunk [lo, hi), else -1: the next unit whose
// experts FSDP may prefetch.)
static int next_moe(const Run* r, int u, int lo, int hi) { return u >= lo && u < hi && is_moe(&r->cfg, u) ? u : -1; }
static void stage_forward(void* ctx, int lo, int hi, Acts* a, Scratch* sc, int R, long rows_total) {
    Run* r = ctx;
    int T = r->cfg.context, Tq = r->context.Tq;
    a->training = r->training;
    for (int u = lo; u < hi; u++) {
        if (r->Cp > 1 && u == n_units(&r->cfg) - 1) // the head's, after the blocks (whose tokens are read from the
                                                     // rows' targets); in place: each lands at or before where it is read
            for (int row = 0; row < R; row++)
                for (int i = 0; i < Tq; i++) a->targets[row * Tq + i] = a->targets[row * T + r->tensor.dims.pos[i]];
        const float* w = fsdp_unit_params(&r->fsdp, u, u + 1 < hi ? u + 1 : -1);
        if (is_moe(&r->cfg, u))
            grid_moe_forward(r, u, w, fsdp_unit_params(&r->expert_fsdp, u, next_moe(r, u + 1, lo, hi)), a, sc, R);
        else tp_unit_forward(&r->tensor, &r->cfg, u, w, a, sc, R, rows_total, &r->ws);
    }
}
static void unit_weight(Run* r, int u, const Acts* a, const float* stash, int R, long batch) {
    tp_unit_backward_weight(&r->tensor, &r->cfg, u, fsdp_unit_grads(&r->fsdp, u), a, stash, R, batch, &r->ws);
    fsdp_reduce_unit_grads(&r->fsdp, u);
}
static void stage_backward(void* ctx, int lo, int hi, Acts* a, Scratch* sc, float* const* stash, int R, long batch) {
    Run* r = ctx;
    for (int u = hi - 1; u >= lo; u--) {
        const float* w = fsdp_unit_params(&r->fsdp, u, u - 1 >= lo ? u - 1 : -1);
        if (is_moe(&r->cfg, u)) {
            grid_moe_backward(r, u, w, a, sc, R, batch, next_moe(r, u - 1, lo, hi));
        } else {
            tp_unit_backward_input(&r->tensor, &r->cfg, u, w, a, sc, R, &r->ws);
            if (stash) memcpy(stash[u], unit_stash(&r->cfg, u, sc), (size_t)R * unit_stash_at(&r->cfg, &r->sizes, u) * sizeof(float)); // for W
            else unit_weight(r, u, a, unit_stash(&r->cfg, u, sc), R, batch);
        }
        scratch_step_down(sc);
    }
}
static void stage_backward_weight(void* ctx, int lo, int hi, const Acts* a, float* const* stash, int R, long batch) {
    Run* r = ctx;
    for (int u = lo; u < hi; u++)
        if (!is_moe(&r->cfg, u)) unit_weight(r, u, a, stash[u], R, batch); // a block with experts ran whole at I
}

// The gradients this rank counts in the global norm, every element of the model once
// across the whole grid: its FSDP shard of its tensor-parallel slice of each of its
// stage's units (shards are disjoint, stages hold different units), except that a
// row-parallel layer's bias, held whole by every tensor-parallel rank, is counted by
// tensor-parallel rank 0 alone (tp_counted); and its FSDP shard of its experts (EP ranks
// hold different experts), which every tensor-parallel rank holds whole: on rank 0 alone.
static int grid_grad_spans(const Run* r, GradSpan* spans) {
    int n = 0;
    for (int u = 0; u < n_units(&r->cfg); u++) {
        if (r->fsdp.size[u] == 0) continue; // a unit of another rank's chunks
        long lo, hi, counted = share_counted(&r->cfg, u, r->tensor.share);
        fsdp_range(&r->fsdp, u, &lo, &hi);
        if (hi > counted) hi = counted > lo ? counted : lo;
        spans[n++] = (GradSpan){fsdp_shard_grads(&r->fsdp, u), hi - lo};
        if (!is_moe(&r->cfg, u)) continue;
        fsdp_range(&r->expert_fsdp, u, &lo, &hi);
        spans[n++] = (GradSpan){fsdp_shard_grads(&r->expert_fsdp, u), r->tp_group.rank == 0 ? hi - lo : 0};
    }
    return n;
}

// Element e of what this rank holds of unit u, in train.c's layout (ckpt.h's Holding, with
// the unit's table t): element lo + e of its tensor-parallel slice, for e in its FSDP shard
// of it; after that shard, a block with experts has its FSDP shard of its experts, which
// follow the slice in its share of the unit (config.h's Share: slice, then experts x_lo ..).
static long canonical(const void* ctx, const UnitTable* t, int u, long e) {
    const Run* r = ctx;
    Share s = {r->tensor.share.r, r->tensor.share.t, r->experts.x_lo, r->experts.x_hi};
    long lo, hi;
    fsdp_range(&r->fsdp, u, &lo, &hi);
    if (e < hi - lo) return table_canonical(t, s, lo + e);
    long elo, ehi;
    fsdp_range(&r->expert_fsdp, u, &elo, &ehi);
    return table_canonical(t, s, table_own(t, s.t) + elo + (e - (hi - lo)));
}
// ckpt.h's Holding has one array a unit, and a block with experts is two shards here, each
// with its FSDP: for checkpoints (with --experts) they are copied into one array a unit,
// r->mine's, which exists only while a checkpoint is read or written: from the two shards
// into it, or (back) from it into them.
static void grid_holding_copy(Run* r, int back) {
    Holding dense = fsdp_holding(&r->fsdp), experts = fsdp_holding(&r->expert_fsdp);
    for (int part = 0; part < 3; part++)
        for (int u = 0; u < n_units(&r->cfg); u++) {
            float* at = r->mine.at[part][u];
            if (!at || r->mine.n[u] == 0) continue;
            long n = dense.n[u];
            if (back) memcpy(dense.at[part][u], at, n * sizeof(float)), memcpy(experts.at[part][u], at + n, experts.n[u] * sizeof(float));
            else memcpy(at, dense.at[part][u], n * sizeof(float)), memcpy(at + n, experts.at[part][u], experts.n[u] * sizeof(float));
        }
}
static void grid_holding_alloc(Run* r, int adamw) {
    Holding dense = fsdp_holding(&r->fsdp), experts = fsdp_holding(&r->expert_fsdp);
    for (int u = 0; u < n_units(&r->cfg); u++) {
        r->mine.n[u] = dense.n[u] + experts.n[u];
        for (int part = 0; part < (adamw ? 3 : 1); part++) r->mine.at[part][u] = callocCheck(r->mine.n[u] + 1, sizeof(float));
    }
}
static void grid_holding_free(Run* r) {
    for (int part = 0; part < 3; part++)
        for (int u = 0; u < n_units(&r->cfg); u++) free(r->mine.at[part][u]), r->mine.at[part][u] = NULL;
}
// What this rank holds (ckpt.h's Holding) for --load and --save
static void grid_holding(Run* r, int adamw) {
    r->mine = fsdp_holding(&r->fsdp);
    r->mine.canonical = canonical, r->mine.ctx = r;
    if (r->cfg.experts) grid_holding_alloc(r, adamw);
}
static long grid_load(Run* r, const Options* o) {
    long start = holding_load(&r->mine, o, &r->ds, &r->cfg);
    if (r->cfg.experts) grid_holding_copy(r, 1), grid_holding_free(r);
    return start;
}
static void grid_save(void* ctx, const Options* o, long step) {
    Run* r = ctx;
    if (r->cfg.experts) grid_holding_alloc(r, o->opt.adamw), grid_holding_copy(r, 0);
    dist_ckpt_save(&r->mine, o, &r->ds, &r->cfg, step);
    if (r->cfg.experts) grid_holding_free(r);
}

// ----------------------------------------------------------------------------
// the forward pass (validation and sampling): through this replica's pipeline, the
// vocabulary gathered from the tensor-parallel ranks of the last stage (of the
// context-parallel rank holding the position sampled), then broadcast to every stage

static int64_t forward(void* ctx, const Rows* rows, long first, int R, long rows_total, float* probs) {
    Run* r = ctx;
    int64_t loss = pp_forward_rows(&r->pipe, rows, first, R, rows_total, probs ? TAG_SAMPLE : TAG_EVAL);
    if (probs) {
        int owner = 0, at = rows->pos; // the context-parallel rank holding the position, and its index there
        for (int q = 0; q < r->Cp && r->Cp > 1; q++)
            for (int i = 0; i < r->context.Tq; i++)
                if (cp_pos_of(&r->context, q)[i] == rows->pos) owner = q, at = i;
        if (r->pp_group.rank == pp_last_rank(&r->pipe)) {
            if (r->cp_group.rank == owner)
                memcpy(probs, tp_probs(&r->tensor, &r->cfg, pp_last_acts(&r->pipe), R, at), (size_t)R * r->cfg.vocab * sizeof(float));
            MPI_Bcast(probs, R * r->cfg.vocab, MPI_FLOAT, owner, r->cp_group.comm);
        }
        MPI_Bcast(probs, R * r->cfg.vocab, MPI_FLOAT, pp_last_rank(&r->pipe), r->pp_group.comm);
    }
    return loss;
}

// Mean loss over the whole validation split: each data-parallel replica its share, each
// context-parallel rank its positions of it, added across them on the last stage, which
// has the losses, then broadcast.
static double validation_loss(void* ctx) {
    Run* r = ctx;
    int64_t total = evaluate(forward, r, &r->ds, r->D, r->dp_group.rank / r->Cp);
    if (r->pp_group.rank == pp_last_rank(&r->pipe)) group_allreduce(&r->dp_group, &total, 1, MPI_INT64_T, MPI_SUM);
    MPI_Bcast(&total, 1, MPI_INT64_T, pp_last_rank(&r->pipe), r->pp_group.comm);
    return mean_loss(total, &r->ds);
}

// ----------------------------------------------------------------------------
// options of this program

static const CliFlag grid_flags[] = {
    {"tp", "T", "tensor-parallel ranks (default: 1, or what the others leave)"},
    {"dp", "D", "data-parallel ranks"},
    {"pp", "P", "pipeline stages"},
    {"cp", "C", "--model gpt: context-parallel ranks, each a share of every row's positions (default 1)"},
    {"cp-comm", "HOW", "with --cp: ring (default) or allgather (train_cp.c)"},
    {"cp-split", "HOW", "with --cp: zigzag (default) or contiguous"},
    {"ep", "E", "--model gpt --experts X: expert-parallel ranks, out of the data-parallel ones (E divides D; default 1)"},
    {"zero", "N", "ZeRO stage across the data-parallel ranks: 1, 2 or 3 (default 3)"},
    {"prefetch", NULL, "stage 3: gather the next unit while the current one computes"},
    PIPELINE_FLAGS,
    {"sp", NULL, "--model gpt: sequence parallelism on the tensor axis (train_tp.c)"},
};
static const char* grid_flag(void* ctx, int index, const char* value) {
    Run* r = ctx;
    switch (index) {
    case 0: return cli_int("tp", value, 1, 4096, &r->T);
    case 1: return cli_int("dp", value, 1, 4096, &r->D);
    case 2: return cli_int("pp", value, 1, MAX_LAYERS + 2, &r->P);
    case 3: return cli_int("cp", value, 1, 1024, &r->Cp);
    case 4:
        if (strcmp(value, "ring") && strcmp(value, "allgather")) return "--cp-comm must be ring or allgather";
        r->ring = !strcmp(value, "ring"), r->ring_given = 1;
        return NULL;
    case 5:
        if (strcmp(value, "zigzag") && strcmp(value, "contiguous")) return "--cp-split must be zigzag or contiguous";
        r->zigzag = !strcmp(value, "zigzag"), r->split_given = 1;
        return NULL;
    case 6: r->ep_given = 1; return cli_int("ep", value, 1, 4096, &r->E);
    case 7: return cli_int("zero", value, 1, 3, &r->zero);
    case 8: r->prefetch = 1; return NULL;
    case 9: r->M_given = 1; return cli_int("microbatches", value, 1, 65536, &r->M);
    case 10: return schedule_parse(value, &r->sched, cli_error, sizeof cli_error);
    case 11: return cli_int("virtual", value, 1, 4, &r->V);
    case 12: r->timeline = 1; return NULL;
    default: r->sp = 1; return NULL;
    }
}

// The expert axis, and what a mixture of experts allows of the grid (see "the expert axis").
static void grid_resolve_experts(Run* r, const Options* o) {
    const Config* mc = &o->model;
    int X = mc->experts;
    r->E = r->E > 0 ? r->E : 1;
    if (X > 0 && !is_gpt(mc))
        dist_exit(2, RUN_LINE, "--experts: train_3d.c's experts are the GPT's blocks' (--model gpt); the MLP's mixture "
                  "of experts trains in train.c and train_ep.c");
    if (r->ep_given && X == 0)
        dist_exit(2, RUN_LINE, "--ep splits each block's experts over ranks: it applies with --model gpt --experts X");
    if (X == 0) return;
    if (r->D % r->E != 0)
        dist_exit(2, RUN_LINE, "--ep %d does not divide --dp %d: the expert-parallel group is carved out of the "
                  "data-parallel ranks (Megatron's and DeepSeek's layout), E replicas to a group", r->E, r->D);
    if (r->E > X)
        dist_exit(2, RUN_LINE, "--ep %d but --experts %d: every expert-parallel rank needs at least one expert of each "
                  "block (--experts %d or more, or a smaller --ep)", r->E, X, r->E);
    if (r->sp)
        dist_exit(2, RUN_LINE, "--sp with --experts: sequence parallelism gives each tensor-parallel rank its own tokens, "
                  "so the experts' and router's gradients would be partial sums over the tensor axis and the "
                  "capacity's token order would interleave the ranks' shards; train_3d.c gives every tensor-parallel "
                  "rank the same tokens and its experts whole instead (drop --sp)");
    int drops = (double)mc->capacity * mc->top_k < X; // else ceil(F k n / X) >= n: no expert can overflow
    if (r->M > 1 && (drops || mc->aux_loss > 0))
        dist_exit(2, RUN_LINE, "--experts with %d microbatches%s: a capacity that drops tokens and the load-balancing "
                  "loss are batch-wide (train.c), and a pipeline's microbatches are routed one at a time, so they "
                  "cannot be computed exactly; pass --microbatches 1, or a capacity that drops nothing (--capacity "
                  "%g or more at --top-k %d) and --aux-loss 0 (DeepSeek-V3 drops no tokens and has no batch-wise "
                  "auxiliary loss)", r->M, r->M_given ? "" : " (--microbatches, default 4)", (double)X / mc->top_k,
                  mc->top_k);
}

// The grid T x C x P x D must be the world size; an axis not given is 1, or, if it is the only
// one missing, whatever the world size leaves for it. And the model must fit it.
static void grid_resolve(Run* r, const Options* o) {
    r->Cp = r->Cp > 0 ? r->Cp : 1; // the context axis is 1 unless given
    int given = (r->T > 0) + (r->D > 0) + (r->P > 0), prod = (r->T > 0 ? r->T : 1) * (r->D > 0 ? r->D : 1) * (r->P > 0 ? r->P : 1) * r->Cp;
    if (given == 2 && world_size % prod == 0) { // the one missing axis takes the rest
        if (r->T == 0) r->T = world_size / prod;
        if (r->D == 0) r->D = world_size / prod;
        if (r->P == 0) r->P = world_size / prod;
    }
    if (given < 2 && prod != world_size)
        dist_exit(2, RUN_LINE, "%d ranks: say how to arrange them, with at least two of --tp --dp --pp "
                  "(their product, times --cp, must be %d)", world_size, world_size);
    r->T = r->T > 0 ? r->T : 1, r->D = r->D > 0 ? r->D : 1, r->P = r->P > 0 ? r->P : 1;
    if (r->T * r->Cp * r->D * r->P != world_size)
        dist_exit(2, RUN_LINE, "--tp %d x --cp %d x --dp %d x --pp %d = %d, but mpirun started %d ranks", r->T, r->Cp,
                  r->D, r->P, r->T * r->Cp * r->D * r->P, world_size);
    if (r->Cp > 1 && !is_gpt(&o->model))
        dist_exit(2, RUN_LINE, "--cp splits a row's positions, which only the GPT has (--model gpt)");
    if (r->Cp == 1 && (r->ring_given || r->split_given))
        dist_exit(2, RUN_LINE, "--cp-comm and --cp-split apply with --cp 2 or more");
    const Config* mc = &o->model;
    if (!is_gpt(mc) && r->T > mc->hidden)
        dist_exit(2, RUN_LINE, "--tp %d but a hidden size of %d: every tensor-parallel rank needs at least one hidden "
                  "unit", r->T, mc->hidden);
    if (is_gpt(mc) && mc->heads % r->T != 0)
        dist_exit(2, RUN_LINE, "--tp %d but %d heads: tensor parallelism gives each rank whole heads, so --tp must "
                  "divide --heads", r->T, mc->heads);
    if (r->sp && !is_gpt(mc))
        dist_exit(2, RUN_LINE, "--sp applies to --model gpt (the MLP has no LayerNorm or residual to split by tokens)");
    grid_resolve_experts(r, o);
    int chunks = schedule_chunks(r->sched, r->V > 0 ? r->V : 2);
    char err[300];
    if (r->V > 0 && r->sched != SCHEDULE_INTERLEAVED) dist_exit(2, RUN_LINE, "--virtual applies to --schedule interleaved only");
    if (r->P * chunks > mc->layers + 2 && chunks == 1)
        dist_exit(2, RUN_LINE, "--pp %d but the model has only %d units (%s): raise --layers", r->P, mc->layers + 2,
                  units_in_words(mc));
    if (r->P * chunks > mc->layers + 2)
        dist_exit(2, RUN_LINE, "--pp %d x %d chunks = %d chunks but the model has only %d units (%s): raise --layers",
                  r->P, chunks, r->P * chunks, mc->layers + 2, units_in_words(mc));
    if (o->batch / r->D < r->M)
        dist_exit(2, RUN_LINE, "a batch of %d rows on %d data-parallel ranks leaves %d rows for %d microbatches "
                  "(raise --batch, or lower --dp or --microbatches)", o->batch, r->D, o->batch / r->D, r->M);
    if (schedule_rule(r->sched, r->P, chunks, r->M, err, sizeof err)) dist_exit(2, RUN_LINE, "%s", err);
    if (r->prefetch && r->zero != 3) dist_exit(2, RUN_LINE, "--prefetch applies to --zero 3 only");
    r->V = chunks;
}

// Every rank's place in the grid, its units and its rows (printed by rank 0); with
// --experts, its place in its EP group and its experts.
static void grid_print(const Run* r, int batch) {
    for (int q = 0; q < world_size; q++) {
        int tp, cp, pp, dp;
        grid_coords(r, q, &tp, &cp, &pp, &dp);
        long lo, hi;
        split_range(batch, r->D, dp, &lo, &hi);
        printf("  rank %-3d   tp %d, cp %d, pp %d, dp %d", q, tp, cp, pp, dp);
        if (r->cfg.experts) printf(", ep %d", dp % r->E);
        printf(":");
        for (int v = 0; v < r->V; v++) pp_print_units(&r->cfg, r->first, chunk_global(r->sched, r->P, pp, v));
        printf(" (rows %ld-%ld", lo, hi - 1);
        if (r->Cp > 1) {
            printf(", positions");
            for (int i = 0; i < r->context.Tq; i++) printf(" %d", cp_pos_of(&r->context, cp)[i]);
        }
        printf(", slice %d of %d, shard %d of %d", tp, r->T, dp * r->Cp + cp, r->D * r->Cp);
        if (r->cfg.experts) {
            long xlo, xhi;
            split_range(r->cfg.experts, r->E, dp % r->E, &xlo, &xhi);
            printf("; experts %ld-%ld of each block, shard %d of %d", xlo, xhi - 1, dp / r->E * r->Cp + cp, r->D / r->E * r->Cp);
        }
        printf(")\n");
    }
}

// The formulas of figures(), in words, for the report.
static const char sent_words[] = "the tensor, context, data, pipeline and expert formulas on their axes, see below";
static const char mem_words[] = "ZeRO's, on this stage's tensor-parallel slices (and experts), + peak activations";

// What this rank sent and holds, each beside its formula: each axis by its own strategy's
// formula (into axis[]: tensor, data, pipeline, context, expert, report.h's order), and over
// the whole grid the clipping norm and the load-balancing loss:
//   tensor    train_tp.c's, for the rows of this replica through this stage's units (a
//             block with experts: its attention half's two all-reduces)
//   context   train_cp.c's K and V of each block, at this rank's heads
//   data      ZeRO on this rank's slices of them, once per microbatch (train_fsdp.c), and on
//             its experts over the expert-data-parallel group; the loss over the D x C ranks;
//             with experts and one microbatch, every token's k choices all-gathered over
//             the D x C ranks for each block (grid_plan)
//   pipeline  train_pp.c's messages for this replica's rows, at a slice's width
//   expert    train_ep.c's all-to-all formula on the tokens routed, 4 B x (K + H) for each
//             token sent to or received from another rank of the EP group; with several
//             microbatches, the counts of choices all-gathered in the group, each block and
//             microbatch
// Memory: ZeRO's on this stage's slices and experts, and the pipeline's peak activations.
static Figures figures(const Run* r, const Progress* pr, const Optimizer* opt, long rows, double* axis) {
    const Config* c = &r->cfg;
    int last = r->pp_group.rank == pp_last_rank(&r->pipe), mb_rows = (int)(rows + r->M - 1) / r->M;
    const Fsdp* ef = &r->expert_fsdp;
    int moe = c->experts > 0;
    Figures f = {.sent_axis = {per_step(pr, r->tp_group.sent), per_step(pr, r->dp_group.sent + r->edp_group.sent),
                               per_step(pr, r->pp_group.sent), per_step(pr, r->cp_group.sent), per_step(pr, r->ep_group.sent)},
                 .params = r->fsdp.bytes_params + (moe ? ef->bytes_params : 0), .grads = r->fsdp.bytes_grads + (moe ? ef->bytes_grads : 0),
                 .optim = r->fsdp.bytes_opt + (moe ? ef->bytes_opt : 0),
                 .acts = pp_acts_bytes(&r->pipe, c, &r->sizes, mb_rows), .bubble = r->P > 1 ? pp_bubble(&r->pipe) : -1};
    f.sent = per_step(pr, r->world_group.sent);
    for (int a = 0; a < 5; a++) f.sent += f.sent_axis[a];
    f.received = per_step(pr, r->tp_group.received + r->dp_group.received + r->edp_group.received + r->pp_group.received +
                                  r->cp_group.received + r->ep_group.received + r->world_group.received);
    // only one pipeline sends it
    int loss_relayed = last && r->pp_group.rank != 0 && !(r->tp_group.rank == 0 && r->dp_group.rank == 0);
    for (int a = 0; a < 5; a++) axis[a] = 0;
    double slices = 0, biggest = 0, experts = 0, biggest_experts = 0; // what ZeRO shards here
    for (int u = 0; u < n_units(c); u++) {
        slices += r->fsdp.size[u], biggest = r->fsdp.size[u] > biggest ? r->fsdp.size[u] : biggest;
        if (moe) experts += ef->size[u], biggest_experts = ef->size[u] > biggest_experts ? ef->size[u] : biggest_experts;
    }
    int G = r->D * r->Cp, k = c->top_k, X = c->experts;
    for (int v = 0; v < r->V; v++) {
        int lo = r->first[r->pipe.chunk[v]], hi = r->first[r->pipe.chunk[v] + 1];
        axis[0] += tp_sent_formula(&r->tensor, c, lo, hi, (double)rows);
        for (int u = lo; u < hi; u++) {
            if (u == 0 || u > c->layers) continue;
            if (r->Cp > 1) { // K and V of each block: train_cp.c's formula, at this rank's heads
                double N = r->Cp, blk = (double)rows * r->context.Tq * r->tensor.dims.A;
                axis[3] += 2 * (2 * (N - 1) * 4 * blk) + (r->ring ? 2 * N * 8 * blk : 2 * (N - 1) * 8 * blk);
            }
            if (!moe) continue;
            Expert e = moe_expert(c, u);
            axis[4] += per_step(pr, ep_a2a_bytes_of(&e, r->routed[u]));
            if (r->M > 1) axis[4] += r->M * ring_half_bytes(4.0 * r->E * k * X, r->E);
            else axis[1] += ring_half_bytes(4.0 * G * r->rows_max * r->tensor.dims.Tq * k, G);
        }
    }
    axis[1] += fsdp_sent_formula(&r->fsdp, r->M) + (moe ? fsdp_sent_formula(ef, r->M) : 0) +
               (last ? ring_allreduce_bytes(8, G) : 0);
    axis[2] = pp_sent_formula(&r->pipe) - (loss_relayed ? 8 : 0);
    f.sent_formula = (opt->clip > 0 ? ring_allreduce_bytes(4 + 8, world_size) : 0) + (moe ? ring_allreduce_bytes(8, world_size) : 0);
    for (int a = 0; a < 5; a++) f.sent_formula += axis[a];
    f.mem_formula = fsdp_mem_formula(&r->fsdp, slices, biggest, opt->adamw) + pp_acts_formula(&r->pipe, c, &r->sizes, mb_rows) +
                    (moe ? fsdp_mem_formula(ef, experts, biggest_experts, opt->adamw) : 0);
    return f;
}
// The bytes every rank sent per step on each axis, beside each axis's formula (rank 0,
// from every rank's figures and formulas).
static void grid_print_axes(const Run* r, const Figures* all, const double* axis) {
    static const char* name[5] = {"tp", "dp", "pp", "cp", "ep"};
    static const int order[5] = {0, 3, 1, 2, 4}; // Llama 3's order, then the expert axis
    int n = r->cfg.experts ? 5 : 4;
    printf("bytes sent per step on each axis (tensor, context, data, pipeline%s), and each axis's formula:\n",
           n == 5 ? ", expert" : "");
    for (int q = 0; q < world_size; q++) {
        printf("  rank %-3d", q);
        for (int i = 0; i < n; i++) {
            int a = order[i];
            printf("%s %s ", i ? "," : "", name[a]);
            print_size(all[q].sent_axis[a]);
            printf(" (");
            print_size(axis[5 * q + a]);
            printf(")");
        }
        printf("\n");
    }
}

// --experts: this rank's experts of each block of its chunks (train_ep.c's split over its
// EP group), their FSDP over the expert-data-parallel group, and what grid_plan needs.
static void grid_experts_init(Run* r, const Options* o) {
    const Config* c = &r->cfg;
    int T = c->context, Tq = r->tensor.dims.Tq;
    ep_init(&r->experts, &r->ep_group, &r->ep_group, c);
    r->experts.plan = grid_plan, r->experts.plan_ctx = r;
    long size[MAX_LAYERS + 2] = {0};
    for (int u = 0; u < n_units(c); u++)
        if (r->fsdp.size[u] > 0 && is_moe(c, u)) size[u] = (long)(r->experts.x_hi - r->experts.x_lo) * expert_params(c, u);
    fsdp_init(&r->expert_fsdp, r->zero, r->prefetch, &r->edp_group, size, n_units(c), o->opt.adamw);
    r->rows_max = (o->batch + r->D - 1) / r->D;
    r->pos_rank = callocCheck(T, sizeof(int)), r->pos_at = mallocCheck(sizeof(int) * T);
    for (int q = 0; q < r->Cp; q++)
        for (int i = 0; i < Tq; i++) {
            int t = r->Cp > 1 ? cp_pos_of(&r->context, q)[i] : i;
            r->pos_rank[t] = q, r->pos_at[t] = i;
        }
    long all = (long)r->D * r->Cp * r->rows_max * Tq * c->top_k;
    if (r->M == 1) r->choices = mallocCheck(sizeof(int) * all), r->keep = mallocCheck(all);
    r->batch_counts = mallocCheck(sizeof(int) * c->top_k * c->experts);
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    Run run = {.zero = 3, .M = 4, .sched = SCHEDULE_1F1B, .ring = 1, .zigzag = 1};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, grid_flags, 14, grid_flag, &run);
    grid_resolve(&run, &o);
    grid_split(&run);

    // data
    load_data(&run.ds, &o, &run.cfg);
    if (run.T > run.ds.vocab)
        dist_exit(2, RUN_LINE, "--tp %d but a vocabulary of %d tokens: every tensor-parallel rank needs at least one",
                  run.T, run.ds.vocab);
    if (run.Cp > 1 && run.cfg.context % (run.zigzag ? 2 * run.Cp : run.Cp) != 0)
        dist_exit(2, RUN_LINE, "--cp %d and %d positions: the %s split cuts T into %d equal chunks, so %d must divide T "
                  "(pass --context)", run.Cp, run.cfg.context, run.zigzag ? "zigzag" : "contiguous",
                  run.zigzag ? 2 * run.Cp : run.Cp, run.zigzag ? 2 * run.Cp : run.Cp);

    // model: this rank's stage, its tensor-parallel slices, their data-parallel shards
    Config* cfg = &run.cfg;
    pp_split(cfg, run.P * run.V, run.first);
    long lo, hi; // this data-parallel replica's rows of every global batch
    split_range(o.batch, run.D, run.dp_group.rank / run.Cp, &lo, &hi); // (the data group also spans the context axis)
    int rows = pass_rows(&o, (hi - lo + run.M - 1) / run.M); // a microbatch, or a validation or sampling pass
    tp_init(&run.tensor, &run.tp_group, cfg, rows, run.sp);
    if (run.Cp > 1) { // the positions of this context-parallel rank, and attention across them
        cp_init(&run.context, &run.cp_group, cfg, rows, run.ring, run.zigzag, 0);
        run.tensor.dims.Tq = run.context.Tq, run.tensor.dims.pos = run.context.dims.pos;
        run.tensor.attend = grid_attend, run.tensor.attend_backward = grid_attend_backward, run.tensor.attend_ctx = &run;
    }
    tp_sizes(&run.tensor, cfg, &run.sizes);
    long slice_size[MAX_LAYERS + 2] = {0}; // FSDP shards the slices of this rank's chunks; other units are empty
    for (int v = 0; v < run.V; v++)
        for (int k = chunk_global(run.sched, run.P, run.pp_group.rank, v), u = run.first[k]; u < run.first[k + 1]; u++)
            slice_size[u] = run.tensor.size[u];
    fsdp_init(&run.fsdp, run.zero, run.prefetch, &run.dp_group, slice_size, n_units(cfg), o.opt.adamw);
    if (cfg->experts) grid_experts_init(&run, &o);
    grid_holding(&run, o.opt.adamw);
    long start = grid_load(&run, &o);
    fsdp_gather_params(&run.fsdp);
    if (cfg->experts) fsdp_gather_params(&run.expert_fsdp);
    pp_init(&run.pipe, &run.pp_group, cfg, run.M, run.sched, run.V, run.first, (int)(hi - lo), o.batch, rows, &run.sizes,
            (StageWork){stage_forward, stage_backward, stage_backward_weight, &run});
    workspace_init(&run.ws, rows, max_width(cfg), max_linear_weight(cfg));
    char layout[320];
    snprintf(layout, sizeof layout, "grid of %d tensor x %d pipeline x %d data = %d ranks; ZeRO stage %d; %d "
             "microbatch%s, %s%s", run.T, run.P, run.D, world_size, run.zero, run.M, run.M > 1 ? "es" : "", schedule_names[run.sched],
             run.sp ? "; sequence parallel" : "");
    if (run.Cp > 1)
        snprintf(layout, sizeof layout, "grid of %d tensor x %d context x %d pipeline x %d data = %d ranks; ZeRO stage "
                 "%d; %d microbatch%s, %s; attention by %s, %s split%s", run.T, run.Cp, run.P, run.D, world_size, run.zero,
                 run.M, run.M > 1 ? "es" : "", schedule_names[run.sched], run.ring ? "ring" : "all-gather", run.zigzag ? "zigzag" : "contiguous",
                 run.sp ? "; sequence parallel" : "");
    if (cfg->experts) {
        size_t at = strlen(layout);
        snprintf(layout + at, sizeof layout - at, "; expert parallel over %d of the data-parallel ranks (%d experts a "
                 "block, top-%d)", run.E, cfg->experts, cfg->top_k);
    }
    if (!o.quiet && world_rank == 0) {
        print_config(&o, &run.ds, layout);
        grid_print(&run, o.batch);
    }

    // training loop
    int B = o.batch, last = run.pp_group.rank == pp_last_rank(&run.pipe);
    GradSpan spans[2 * (MAX_LAYERS + 2)];
    int n_spans = grid_grad_spans(&run, spans), moe = cfg->experts > 0;
    Progress progress = progress_start(&o, world_rank == 0, grid_save, &run, dist_any);
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        Rows batch = training_rows(&run.ds, o.seed, step, lo); // this replica's rows
        fsdp_zero_grads(&run.fsdp);
        if (moe) fsdp_zero_grads(&run.expert_fsdp);
        run.training = 1, run.aux = 0;
        int64_t loss = pp_step(&run.pipe, &batch); // the schedule, each stage's units tensor-parallel and sharded
        run.training = 0;
        fsdp_reduce_grads(&run.fsdp);              // ZeRO-1 only: the whole slice's gradients, once the schedule is done
        if (moe) fsdp_reduce_grads(&run.expert_fsdp);
        if (last) group_allreduce(&run.dp_group, &loss, 1, MPI_INT64_T, MPI_SUM); // every replica's rows and positions
        if (run.tp_group.rank == 0 && run.dp_group.rank == 0)
            pp_loss_to_first(&run.pipe, &loss); // to world rank 0, which prints
        long n = dataset_batch_targets(&run.ds, o.seed, step, B); // the loss is the mean over n targets
        if (moe) { // the load-balancing loss: every token's terms, once (tensor-parallel rank 0's), reported apart
            int64_t aux = run.tp_group.rank == 0 ? run.aux : 0;
            group_allreduce(&run.world_group, &aux, 1, MPI_INT64_T, MPI_SUM);
            progress.aux = fix_to(aux) / n;
        }
        float scale = clip_factor(&o.opt, spans, n_spans, n, group_norm, &run.world_group); // over the whole grid
        fsdp_step(&run.fsdp, &o.opt, grad_factor(n), scale, step);
        if (moe) fsdp_step(&run.expert_fsdp, &o.opt, grad_factor(n), scale, step);
        if (step_end(&progress, step, fix_to(loss) / n, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    double axis[5], *axes = world_rank == 0 ? mallocCheck(sizeof axis * world_size) : NULL;
    Figures fig = figures(&run, &progress, &o.opt, hi - lo, axis);
    MPI_Gather(axis, 5, MPI_DOUBLE, axes, 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    Report rep = {"train_3d.c", layout, sent_words, mem_words};
    Figures* all = dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run);
    if (world_rank == 0 && !o.quiet) grid_print_axes(&run, all, axes);
    free(all), free(axes);
    if (run.timeline && run.tp_group.rank == 0 && run.dp_group.rank == 0)
        pp_timeline(&run.pipe); // world rank 0's pipeline
    run_free(&run);
    MPI_Finalize();
    return 0;
}
