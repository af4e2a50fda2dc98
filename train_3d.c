/*
 * train_3d.c: 3D, 4D and 5D parallel: the strategies of the other files at once, the way
 * the largest models are trained. The ranks form a grid T (tensor) x C (context) x P
 * (pipeline) x D (data): along the pipeline, microbatches follow a schedule through P
 * stages; inside a stage, every layer is split across T tensor-parallel ranks, and each
 * row's positions across C context-parallel ranks (the GPT); each tensor-parallel slice of
 * a stage is sharded with ZeRO across the D x C ranks that hold it for other rows and
 * positions. 3D is T x P x D; 4D adds C; 5D adds the expert axis (--experts, --ep E),
 * carved out of the data axis as Megatron-LM and DeepSeek-V3 do. It prints exactly what
 * train.c prints for the same flags, in every grid.
 *
 *   make run's 3D grid, --tp 2 --pp 2 --dp 2: world rank = ((replica x P + stage) x C + cp) x T + tp
 *
 *                  data replica 0                    data replica 1
 *                  (rows 0-3 of each microbatch)     (rows 4-7 of each)
 *                  a batch of 32 rows is 4 microbatches of 8 rows, each split between the replicas
 *   stage 0        rank 0 | rank 1   <-- ZeRO -->   rank 4 | rank 5
 *                  tp 0     tp 1                    tp 0     tp 1
 *                    |  activations / gradients       |
 *   stage 1        rank 2 | rank 3   <-- ZeRO -->   rank 6 | rank 7
 *
 *   make run's 4D grid, --model gpt --tp 2 --cp 2 --pp 2 (--dp 1: replica 0 only, all of
 *   each microbatch): each rank of replica 0 above becomes two, of context 0 and 1, holding
 *   positions {0-3, 12-15} and {4-11} of every row (zigzag)
 *   make run's 5D grid, --model gpt --experts 4 --tp 2 --cp 2 --pp 2 --dp 2 --ep 2 (16
 *   ranks): replicas 0 and 1 form an expert-parallel group, rank w of replica 0 and rank
 *   w + 8 of replica 1 exchanging each block's tokens by all-to-all (experts 0-1 on the
 *   first, 2-3 on the second, whole: tensor parallelism splits their attention only)
 *
 * The grid is a table of axes (below): each axis a row, its group the ranks that differ in
 * its coordinates only; one function makes any axis's group from its row. On each axis
 * travels its own strategy, each collective called from that strategy's file:
 *
 *   axis         group of ranks         what travels                             called in
 *   tensor       T: the same stage,     f and g (all-reduces; --sp: all-gathers  train_tp.c, from stage_forward
 *                replica and context    and reduce-scatters)                     and stage_backward
 *   context      C                      K and V round a ring, all-gathered or    train_cp.c, through the tensor
 *                                       all-to-all'd; dK, dV home                block's attention (grid_attend)
 *   pipeline     P                      activations, gradients between stages    train_pp.c's pp_step
 *   data (ZeRO)  D x C: the same slice  a unit's all-gather, its gradient's      train_fsdp.c's fsdp_*, from the
 *                for other rows and     reduce-scatter (ZeRO-1: all-reduce);     stage's work and train_step
 *                positions              the loss
 *   expert       E of the D replicas    dispatch and combine all-to-alls; the    train_ep.c, from grid_moe_*
 *                                       tokens' choices, on the data axis
 *   expert data  D/E x C                ZeRO on the experts                      train_fsdp.c's, as data
 *   (every rank)                        the clipping norm, the aux loss          train_step
 *
 *   make train_3d && mpirun -n 8 --oversubscribe ./train_3d --tp 2 --pp 2 --dp 2          # 3D (make run's)
 *   mpirun -n 6 --oversubscribe ./train_3d --tp 2 --pp 3 --layers 3 --zero 1 --schedule gpipe
 *   mpirun -n 8 --oversubscribe ./train_3d --model gpt --tp 2 --cp 2 --pp 2 --dp 1        # 4D (make run's)
 *   mpirun -n 16 --oversubscribe ./train_3d --model gpt --experts 4 --tp 2 --cp 2 --pp 2 --dp 2 --ep 2  # 5D
 *
 * Compare with ./train (--model gpt, --experts 4 --microbatches 4): the same losses, names
 * and final checkpoint, in every grid.
 *
 * Bytes sent, and memory, per rank: each axis by its own program's formula, printed axis by
 * axis beside what was measured. The first read: the grid; a stage's work (with the context
 * axis inside a tensor-parallel block, in one place); one step. Then, each on its own, the
 * expert axis, the gradient norm's spans and checkpoints, the formulas, the flags, the setup.
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

#define RUN_LINE "mpirun -n 8 ./train_3d --tp 2 --pp 2 --dp 2"

// ----------------------------------------------------------------------------
// the strategy: the grid, as a table of axes
//
// A rank's coordinates, the most significant first: its data replica, written as two
// coordinates, egroup and member (replica = egroup x E + member: the expert axis, E of the
// D replicas, is carved out of the data axis; with E = 1 every member is 0), then stage, cp
// and tp. World rank = ((replica x P + stage) x C + cp) x T + tp: tensor-parallel
// ranks are adjacent (they talk every layer, forward and backward), then context-parallel
// (K and V, every layer), then pipeline, then data (once a step): Llama 3's order. An
// axis's group is the ranks whose other coordinates are all this rank's; within it they are
// numbered by its own coordinates, in the same order (grid_group).

enum { TENSOR, CONTEXT, PIPELINE, DATA, EXPERT, EXPERT_DATA, N_AXES };
enum { EGROUP, MEMBER, STAGE, CP, TP }; // a coordinate's index, the most significant first
typedef struct {
    const char* name;
    int varies[5]; // 1: this coordinate varies within the axis's groups
} Axis;
static const Axis axes[N_AXES] = {
    //  name           egroup member stage cp  tp
    {"tensor",        {0,     0,     0,    0,  1}}, // T ranks: one stage's slices, of one replica and context
    {"context",       {0,     0,     0,    1,  0}}, // C ranks: a row's positions
    {"pipeline",      {0,     0,     1,    0,  0}}, // P ranks: the stages
    {"data",          {1,     1,     0,    1,  0}}, // D x C ranks: one slice of one stage, for other rows and positions
    {"expert",        {0,     1,     0,    0,  0}}, // E replicas: their experts, one group's
    {"expert data",   {1,     0,     0,    1,  0}}, // D/E x C ranks: the same experts, for other rows and positions
};

typedef struct {
    int T, C, P, D, E; // the axes' sizes: --tp, --cp, --pp, --dp and --ep (E divides D)
    int tp, cp, stage, replica; // this rank's coordinates
    Group axis[N_AXES];
    Group world;       // every rank: the clipping norm, the load-balancing loss
} Grid;

// World rank q's coordinates: egroup, member, stage, cp, tp.
static void grid_coords(const Grid* g, int q, int* x) {
    int replica = q / (g->T * g->C * g->P);
    int coord[5] = {replica / g->E, replica % g->E, q / (g->T * g->C) % g->P, q / g->T % g->C, q % g->T};
    memcpy(x, coord, sizeof coord);
}
// Axis a's group of this rank: MPI_Comm_split with a colour that numbers the other
// coordinates (those a group shares) and a key that numbers its own, each as a number in
// the world rank's order.
static void grid_group(Grid* g, int a, Group* out) {
    int c[5], size[5] = {g->D / g->E, g->E, g->P, g->C, g->T};
    grid_coords(g, world_rank, c);
    int color = 0, key = 0;
    for (int i = 0; i < 5; i++) {
        if (axes[a].varies[i]) key = key * size[i] + c[i];
        else color = color * size[i] + c[i];
    }
    MPI_Comm_split(MPI_COMM_WORLD, color, key, &out->comm);
    MPI_Comm_rank(out->comm, &out->rank);
    MPI_Comm_size(out->comm, &out->size);
    out->name = axes[a].name, out->sent = out->received = 0;
}
static void grid_init(Grid* g) {
    int c[5];
    grid_coords(g, world_rank, c);
    g->tp = c[TP], g->cp = c[CP], g->stage = c[STAGE], g->replica = c[EGROUP] * g->E + c[MEMBER];
    for (int a = 0; a < N_AXES; a++) grid_group(g, a, &g->axis[a]);
    g->world = group_world("world");
}

// ----------------------------------------------------------------------------
// the state of one run: what this rank holds on each axis, then the flags, then what serves

typedef struct Plan Plan; // the expert axis's plan of a training microbatch (its section)
typedef struct {
    Config cfg;
    Dataset ds;
    Grid grid;            // the axes and their groups
    Tp tensor;            // this rank's tensor-parallel slice of every unit (train_tp.c)
    Cp context;           // its positions, and attention across the context axis (train_cp.c)
    Pp pipe;              // this stage of the pipeline (train_pp.c)
    Fsdp fsdp;            // the slices of this stage's units, sharded across the data axis (train_fsdp.c)
    Ep experts;           // --experts: this rank's experts of every block, and their all-to-alls (train_ep.c)
    Fsdp expert_fsdp;     // those experts of this stage's blocks, sharded across the expert data axis
    GradSpan spans[2 * (MAX_LAYERS + 2)]; // the gradients this rank counts in the norm (grid_grad_spans)
    int n_spans;
    int training;         // the pass at hand is a training step's: capacity and the load-balancing loss apply
    int recomputing;      // --recompute selective, in a block's backward: attention again, not its all-to-alls

    int zero, prefetch;   // --zero, --prefetch
    int M, sched, V, timeline; // --microbatches, --schedule, chunks a rank (--virtual; zbv, dualpipev: 2), --timeline
    int sp;               // --sp: sequence parallelism on the tensor axis (the GPT)
    CpComm comm;          // --cp-comm
    int zigzag;           // --cp-split
    int ring_given, split_given;

    Plan* plan;
    int64_t aux;          // the step's load-balancing terms of this rank's tokens (exact)
    double routed[MAX_LAYERS + 2]; // tokens each block sent to and received from other ranks of its expert group
    int first[MAX_LAYERS + 3];     // chunk k holds units [first[k], first[k+1])
    UnitSizes sizes;      // what each unit holds a row on this rank (train_tp.c's tp_sizes)
    Workspace ws;
    Holding mine;         // what this rank holds of the model, for checkpoints
    TpHooks attend;       // --cp: the context axis's attention, in the tensor block (grid_attend)
} Run;

// The expert axis, in its section after the first read.
static void grid_moe_forward(Run* r, int u, const float* w, const float* we, Acts* a, Scratch* s, int R);
static void grid_moe_backward(Run* r, int u, const float* w, Acts* a, Scratch* s, int R, long batch, int next);
static int64_t grid_aux_loss(Run* r);

// ----------------------------------------------------------------------------
// the strategy: a stage's work
//
// The pipeline (train_pp.c) runs a chunk of units on a microbatch; here each unit is its
// tensor-parallel slice (train_tp.c), gathered by ZeRO just before use (train_fsdp.c's
// fsdp_unit_params: with --zero 3 an all-gather across the data axis) and its gradient
// reduce-scattered as soon as it is made (fsdp_reduce_unit_grads; ZeRO-1 all-reduces every
// gradient once the step's schedule is done, in train_step). A block with experts: the expert
// axis, further below.
//
// The context axis inside a tensor-parallel block (--cp), in one place. A rank holds its
// positions of every row (train_cp.c's cp_positions), so the tensor block's shapes are those
// of its positions (grid_model_init sets tensor.dims.Tq and .pos); attention, the one layer that needs
// other positions, is train_cp.c's across the context group, on this rank's heads, plugged
// into the tensor block's hook (grid_attend); the head's loss is over the targets at its
// positions (moved into place by stage_forward). Every other layer works token by token.

static void grid_attend(void* ctx, BlockActs* a) {
    Run* r = ctx;
    r->context.dims = r->tensor.dims; // its heads, at this pass's rows
    if (r->recomputing) cp_attention_again(&r->context, a);
    else cp_attention_forward(&r->context, a);
}
static void grid_attend_backward(void* ctx, const BlockActs* a, const float* datty, float* dqkv) {
    Run* r = ctx;
    r->context.dims = r->tensor.dims;
    cp_attention_backward(&r->context, a, datty, dqkv);
}

// Units [lo, hi) forward (the pipeline's StageWork). fsdp_unit_params's second argument is
// the unit ZeRO may gather while this one computes (--prefetch), or -1; moe_or_none gives
// the block whose experts to gather next.
static int moe_or_none(const Run* r, int u, int lo, int hi) { return u >= lo && u < hi && is_moe(&r->cfg, u) ? u : -1; }
static void stage_forward(void* ctx, int lo, int hi, Acts* a, Scratch* sc, int R, long rows_total) {
    Run* r = ctx;
    int positions = r->cfg.context, Tq = r->tensor.dims.Tq;
    a->training = r->training;
    tp_pass(&r->tensor, &r->cfg, R, rows_total, &r->ws); // this pass's rows, and the targets the mean is over
    for (int u = lo; u < hi; u++) {
        // --cp: the head's targets are those of this rank's positions, moved in place: pos[i] >= i,
        // so each is read before it is overwritten.
        if (r->grid.C > 1 && u == n_units(&r->cfg) - 1)
            for (int row = 0; row < R; row++)
                for (int i = 0; i < Tq; i++) a->targets[row * Tq + i] = a->targets[row * positions + r->tensor.dims.pos[i]];
        const float* w = fsdp_unit_params(&r->fsdp, u, u + 1 < hi ? u + 1 : -1);     // ZeRO: gathered
        if (is_moe(&r->cfg, u))
            grid_moe_forward(r, u, w, fsdp_unit_params(&r->expert_fsdp, u, moe_or_none(r, u + 1, lo, hi)), a, sc, R);
        else tp_unit_forward(&r->tensor, &r->cfg, u, w, a, sc); // tensor-parallel
    }
}
// A unit's weight half, and ZeRO's reduce-scatter of its gradient at once.
static void unit_weight(Run* r, int u, const Acts* a, const float* stash, int R, long batch) {
    tp_pass(&r->tensor, &r->cfg, R, batch, &r->ws);
    tp_unit_backward_weight(&r->tensor, &r->cfg, u, fsdp_unit_grads(&r->fsdp, u), a, stash);
    fsdp_reduce_unit_grads(&r->fsdp, u);
}
// Units hi - 1 down to lo backward. Without a stash, B: each unit's weight half at once; with
// one, I: the weight half's input kept in the stash for stage_backward_weight (W).
static void stage_backward(void* ctx, int lo, int hi, Acts* a, Scratch* sc, float* const* stash, int R, long batch) {
    Run* r = ctx;
    tp_pass(&r->tensor, &r->cfg, R, batch, &r->ws);
    for (int u = hi - 1; u >= lo; u--) {
        const float* w = fsdp_unit_params(&r->fsdp, u, u - 1 >= lo ? u - 1 : -1);    // ZeRO: gathered again
        r->recomputing = r->cfg.recompute == RECOMPUTE_SELECTIVE;
        tp_unit_recompute(&r->tensor, &r->cfg, u, w, a, sc);              // --recompute (full: not with experts, cli.h)
        r->recomputing = 0;
        if (is_moe(&r->cfg, u)) {
            grid_moe_backward(r, u, w, a, sc, R, batch, moe_or_none(r, u - 1, lo, hi));
        } else {
            tp_unit_backward_input(&r->tensor, &r->cfg, u, w, a, sc);
            long width = unit_stash_at(&r->cfg, &r->sizes, u); // floats a row
            if (stash) memcpy(stash[u], unit_stash(&r->cfg, u, sc), (size_t)R * width * sizeof(float)); // I: for W
            else unit_weight(r, u, a, unit_stash(&r->cfg, u, sc), R, batch);
        }
        scratch_step_down(sc); // the input's gradient becomes the unit below's output gradient
    }
}
static void stage_backward_weight(void* ctx, int lo, int hi, const Acts* a, float* const* stash, int R, long batch) {
    Run* r = ctx;
    for (int u = lo; u < hi; u++)
        if (!is_moe(&r->cfg, u)) unit_weight(r, u, a, stash[u], R, batch); // a block with experts ran whole at I
}

// ----------------------------------------------------------------------------
// the strategy: one step
//
// The schedule takes every microbatch through the pipeline, each stage's units as above; then
// the loss is summed over the data axis, the gradient norm taken over the whole grid, and each
// ZeRO shard takes its optimizer step. Returns the mean loss over the batch.
static double train_step(Run* r, const Options* o, Progress* pr, long step) {
    Grid* g = &r->grid;
    int moe = r->cfg.experts > 0;
    Rows batch = training_rows(&r->ds, o->seed, step, 0); // the pipeline takes its replica's share of each microbatch
    fsdp_zero_grads(&r->fsdp);
    if (moe) fsdp_zero_grads(&r->expert_fsdp);
    r->training = 1, r->aux = 0;
    int64_t loss = pp_step(&r->pipe, &batch);
    r->training = 0;
    fsdp_reduce_grads(&r->fsdp); // ZeRO-1 only: the whole slice's gradients, once the schedule is done
    if (moe) fsdp_reduce_grads(&r->expert_fsdp);
    if (g->axis[PIPELINE].rank == pp_last_rank(&r->pipe))
        group_allreduce(&g->axis[DATA], &loss, 1, MPI_INT64_T, MPI_SUM); // every replica's rows and positions
    // Every tensor-parallel rank of the last stage holds the loss; one pipeline (tp 0, data rank
    // 0) carries it from its last stage to world rank 0, which prints it.
    if (g->tp == 0 && g->axis[DATA].rank == 0) pp_loss_to_first(&r->pipe, &loss);
    long n = dataset_batch_targets(&r->ds, o->seed, step, o->batch); // the loss is the mean over n targets
    if (moe) pr->aux = fix_to(grid_aux_loss(r)) / n; // the load-balancing loss, reported apart

    // The gradient norm: the largest gradient on any rank sets the fixed-point scale 2^e, then
    // the squares add exactly, each element counted on one rank only.
    float scale = 1.0f;
    if (o->opt.clip > 0) {
        float maxabs = spans_maxabs(r->spans, r->n_spans, n);
        group_allreduce(&g->world, &maxabs, 1, MPI_FLOAT, MPI_MAX);
        int e;
        frexpf(maxabs, &e);
        int64_t sumsq = spans_sumsq(r->spans, r->n_spans, n, e);
        group_allreduce(&g->world, &sumsq, 1, MPI_INT64_T, MPI_SUM);
        scale = clip_from_sumsq(&o->opt, sumsq, e);
    }
    fsdp_step(&r->fsdp, &o->opt, grad_factor(n), scale, step);
    if (moe) fsdp_step(&r->expert_fsdp, &o->opt, grad_factor(n), scale, step);
    moe_bias_update(&r->cfg); // --balance bias: each expert's bias moves toward its share
    return fix_to(loss) / n;
}

// ---------------------------------------------------------------------------- first read ends here

// ----------------------------------------------------------------------------
// the strategy: the expert axis (--experts, the GPT's blocks)
//
// This section adds a fifth axis to the first read: E data-parallel replicas that share
// each block's experts and exchange its tokens. A block with experts runs its attention half as the dense block does (train_tp.c's, its
// heads split; the context axis's attention), then the layer of experts on ln2's output at
// its tokens (the positions it holds with a target, in training) within its expert group
// (train_ep.c's dispatch and combine all-to-alls), then the residual. Tensor parallelism
// does not split the experts (Megatron's expert tensor parallelism would): each
// tensor-parallel rank holds its group's share of the experts whole and routes the same
// tokens as the others (--sp, which would give them different tokens, is refused), so the
// experts' and router's gradients are the same on every tensor-parallel rank and counted
// once in the norm, like a whole tensor's. Shared experts (--shared-experts) are whole
// tensors of the block, next to the router, and run the same way.
//
// Capacity and the load-balancing loss are per microbatch, as Megatron-LM and DeepSpeed
// compute them, and train.c with --microbatches M does the same: a token's place among all
// the microbatch's tokens that chose its expert (first choices first, then by token: rows,
// then positions), and f_x counted over the microbatch. A replica takes a share of each
// microbatch (train_pp.c's pp_mb_rows: the microbatch cut by replicas in order), and a
// context-parallel rank some positions of it, so grid_plan gathers every token's choices
// from the D x C ranks of the data axis (k ints a token: they are all at the same point of
// the same schedule) and runs train.c's rule on the whole microbatch.

// The expert axis's plan of a training microbatch (grid_plan, below): every token's choices
// gathered from the D x C ranks that hold the microbatch's rows and positions.
struct Plan {
    int rows;                // the most rows a replica takes of a microbatch
    int *pos_rank, *pos_at;  // [T] the context-parallel rank holding each position, and its index there
    int* choices;            // [D C][rows][Tq][k]: each token's k choices, -1 where no token
    unsigned char* keep;     // [D C][rows][Tq][k]: whether the capacity keeps each choice
    int* counts;             // [k][X]: the microbatch's choices, by choice and expert
};

// A block with experts on this rank: its heads (train_tp.c's dims) and no MLP of its own,
// its attention split by heads as the dense block's, its LayerNorms, row-parallel bias and
// router whole, in transformer.h's moe_block_layout; its experts held apart, whole.
static BlockDims grid_moe_dims(Run* r, int R) {
    r->tensor.dims.R = R;
    BlockDims d = r->tensor.dims;
    d.F = 0;
    return d;
}
static MoeBlockLayout grid_moe_layout(const Run* r) {
    return moe_block_layout(r->cfg.emb, r->tensor.dims.A, expert_width(&r->cfg), r->cfg.experts, r->cfg.shared_experts);
}

// The plan of a training pass, in three parts. 1: every token's choices of the microbatch, on
// every rank of the data axis: this rank's n tokens (m->token[i]: row r, position index i
// of its Tq, as r Tq + i) into its block of the array, then an all-gather.
static void plan_gather(Run* r, const Config* c, const MoeLayer* m, int n) {
    int k = c->top_k;
    long share = (long)r->plan->rows * r->tensor.dims.Tq * k; // a rank's block: [rows][Tq][k]
    int* mine = r->plan->choices + r->grid.axis[DATA].rank * share;
    for (long i = 0; i < share; i++) mine[i] = -1;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++) mine[(long)m->token[i] * k + j] = m->choice[(long)i * k + j];
    group_allgather(&r->grid.axis[DATA], mine, r->plan->choices, share, MPI_INT); // every rank's block
}
// 2: train.c's rule on the whole microbatch: places by choice (first choices before
// second), then by token: replicas in order, their rows, each row's positions in order, each
// held by context-parallel rank pos_rank[t]. Keeps a choice whose place is under the
// capacity; returns the capacity, and the microbatch's tokens in *n_total.
static long plan_place(Run* r, const Config* c, long* n_total) {
    int k = c->top_k, X = c->experts, Tq = r->tensor.dims.Tq, C = r->grid.C, rows = r->plan->rows;
    long all = (long)r->grid.D * C * rows * Tq * k;
    *n_total = 0;
    for (long i = 0; i < all; i += k) *n_total += r->plan->choices[i] >= 0;
    long capacity = moe_capacity(c, *n_total, 1);
    int* place = r->plan->counts; // [X]: each expert's next place
    memset(place, 0, sizeof(int) * X);
    for (int j = 0; j < k; j++)
        for (int d = 0; d < r->grid.D; d++)
            for (int row = 0; row < rows; row++)
                for (int t = 0; t < c->context; t++) {
                    long e = ((((long)d * C + r->plan->pos_rank[t]) * rows + row) * Tq + r->plan->pos_at[t]) * k + j;
                    int x = r->plan->choices[e];
                    if (x >= 0) r->plan->keep[e] = place[x]++ < capacity;
                }
    return capacity;
}
// 3: what each member of this rank's expert group sends each expert, kept (m->kept), and
// which of this rank's own choices are kept (m->keep); then train_ep.c's dispatch order.
static void plan_counts(Run* r, const Config* c, MoeLayer* m, int n) {
    int k = c->top_k, X = c->experts, C = r->grid.C, E = r->grid.E;
    long share = (long)r->plan->rows * r->tensor.dims.Tq * k;
    moe_reserve(m, c, E, 0, 0);
    for (int q = 0; q < E; q++) { // member q of this rank's group: replica (its group) E + q, this rank's cp
        int replica = r->grid.replica / E * E + q;
        long first = ((long)replica * C + r->grid.cp) * share;
        int* kept = m->kept + (long)q * X;
        memset(kept, 0, sizeof(int) * X);
        for (long e = first; e < first + share; e++)
            if (r->plan->choices[e] >= 0 && r->plan->keep[e]) kept[r->plan->choices[e]]++;
    }
    long mine = (long)r->grid.axis[DATA].rank * share;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++) m->keep[(long)i * k + j] = r->plan->keep[mine + (long)m->token[i] * k + j];
    moe_dispatch(c, m, r->experts.ep->rank, r->experts.x_first, n);
}
// The plan (train_ep.c's Ep calls it, in place of its own): in training the three parts and
// the load-balancing loss over the microbatch (its counts, summed as one rank's);
// validation and sampling have no capacity and no loss: the expert group's own plan.
static void grid_plan(void* ctx, const Config* c, MoeLayer* m, int n, int training, int64_t* aux) {
    Run* r = ctx;
    if (!training) {
        ep_plan(&r->experts, c, m, n, training, aux);
        return;
    }
    long n_total;
    plan_gather(r, c, m, n);
    long capacity = plan_place(r, c, &n_total);
    plan_counts(r, c, m, n);
    int k = c->top_k, X = c->experts;
    long all = (long)r->grid.D * r->grid.C * r->plan->rows * r->tensor.dims.Tq * k;
    memset(r->plan->counts, 0, sizeof(int) * k * X);
    for (long i = 0; i < all; i++)
        if (r->plan->choices[i] >= 0) r->plan->counts[i % k * X + r->plan->choices[i]]++;
    moe_balance(c, m, r->plan->counts, 1, r->experts.ep->rank, n, n_total, capacity, aux);
}

// Forward of block u with experts: w its own tensors (this rank's heads, LayerNorms,
// router), we this rank's experts, both as ZeRO gathered them.
static void grid_moe_forward(Run* r, int u, const float* w, const float* we, Acts* a, Scratch* s, int R) {
    const Config* c = &r->cfg;
    double t0 = trace_clock();
    BlockDims d = grid_moe_dims(r, R);
    MoeBlockLayout l = grid_moe_layout(r);
    BlockParams p = moe_block_params(w, &l);
    BlockActs ba = acts_block(a, u, &d, d.Tq);
    Tokens tok = tp_tokens(&r->tensor, R);
    MoeLayer* m = &a->moe[u];
    tp_block_forward_attention(&r->tensor, &p, &ba, a->out[u - 1], s); // x1 and ln2's output
    m->n = gpt_moe_tokens(c, m, a, &d);
    gpt_moe_gather(m->in, m, ba.ln2, c->emb);
    EpLayer el = {.m = m, .router = w + l.router_w, .experts = we, .training = a->training, .aux = &r->aux, .ws = &r->ws};
    ep_moe_forward(&r->experts, c, &el, m->in, s->tmp, m->n);
    gpt_moe_residual(a->out[u], ba.x1, m, s->tmp, tok.all, c->emb);
    if (a->training) { // for the all-to-all's formula
        int me = r->experts.ep->rank;
        r->routed[u] += (double)(m->n_routed - m->routed_to[me]) + (double)(m->n_received - m->expert_from[me]);
    }
    trace_event("compute", t0, trace_clock(), 0, "forward %s", unit_name(c, u));
}
// Its backward, whole: the layer's backward makes the experts' and the router's weight
// gradients with its input gradient (moe.h), so even a schedule that runs I and W apart runs
// a block with experts whole at its I; then both parts' gradients are reduce-scattered.
static void grid_moe_backward(Run* r, int u, const float* w, Acts* a, Scratch* s, int R, long batch, int next) {
    const Config* c = &r->cfg;
    double t0 = trace_clock();
    const float* we = fsdp_unit_params(&r->expert_fsdp, u, next);
    int64_t *g = fsdp_unit_grads(&r->fsdp, u), *ge = fsdp_unit_grads(&r->expert_fsdp, u);
    BlockDims d = grid_moe_dims(r, R);
    MoeBlockLayout l = grid_moe_layout(r);
    BlockParams p = moe_block_params(w, &l);
    BlockGrads gg = moe_block_grads(g, &l);
    BlockActs ba = acts_block(a, u, &d, d.Tq);
    BlockStash st = block_stash(s->stash, &d, R);
    Tokens tok = tp_tokens(&r->tensor, R);
    MoeLayer* m = &a->moe[u];
    long terms = batch * c->context;
    gpt_moe_gather(s->tmp, m, s->dout, c->emb); // the tokens' output gradients
    EpLayer el = {.m = m, .router = w + l.router_w, .experts = we, .router_grad = g + l.router_w, .experts_grad = ge,
                  .terms = terms, .ws = &r->ws};
    ep_moe_backward(&r->experts, c, &el, m->in, s->tmp, s->din);
    gpt_moe_scatter(st.dln2, m, s->din, tok.all, c->emb); // ln2's output gradient: the tokens', 0 elsewhere
    tp_block_backward_input_attention(&r->tensor, &p, &ba, &st, a->out[u - 1], s);
    tp_block_backward_weight_attention(&r->tensor, &gg, &ba, &st, a->out[u - 1]);
    fsdp_reduce_unit_grads(&r->fsdp, u);
    fsdp_reduce_unit_grads(&r->expert_fsdp, u);
    trace_event("compute", t0, trace_clock(), 0, "backward %s", unit_name(c, u));
}

// --experts: this rank's experts of each block of its chunks (train_ep.c's split over its
// expert group), their ZeRO across the expert data axis, and what grid_plan needs.
static void grid_experts_init(Run* r, const Options* o, int mb_rows) {
    const Config* c = &r->cfg;
    int T = c->context, Tq = r->tensor.dims.Tq, C = r->grid.C;
    ep_init(&r->experts, &r->grid.axis[EXPERT], &r->grid.axis[EXPERT], c);
    r->experts.hook = (EpPlanHook){grid_plan, r};
    long size[MAX_LAYERS + 2] = {0};
    for (int u = 0; u < n_units(c); u++)
        if (r->fsdp.size[u] > 0 && is_moe(c, u)) size[u] = (long)(r->experts.x_hi - r->experts.x_lo) * expert_params(c, u);
    fsdp_init(&r->expert_fsdp, r->zero, r->prefetch, &r->grid.axis[EXPERT_DATA], size, n_units(c), o->opt.adamw);
    Plan* p = r->plan = callocCheck(1, sizeof(Plan));
    p->rows = mb_rows; // the most rows a replica takes of a microbatch
    p->pos_rank = callocCheck(T, sizeof(int)), p->pos_at = mallocCheck(sizeof(int) * T);
    for (int q = 0; q < C; q++)
        for (int i = 0; i < Tq; i++) {
            int t = C > 1 ? cp_pos_of(&r->context, q)[i] : i;
            p->pos_rank[t] = q, p->pos_at[t] = i;
        }
    long all = (long)r->grid.D * C * p->rows * Tq * c->top_k;
    p->choices = mallocCheck(sizeof(int) * all), p->keep = mallocCheck(all);
    p->counts = mallocCheck(sizeof(int) * c->top_k * c->experts);
}


// The step's load-balancing loss: every token's terms once (tensor-parallel rank 0's, as the
// others routed the same tokens), summed over the whole grid.
static int64_t grid_aux_loss(Run* r) {
    int64_t aux = r->grid.tp == 0 ? r->aux : 0;
    group_allreduce(&r->grid.world, &aux, 1, MPI_INT64_T, MPI_SUM);
    return aux;
}

// ----------------------------------------------------------------------------
// what only serves the strategy: the gradient norm, and checkpoints
//
// The gradients this rank counts in the global norm, every element of the model once across
// the whole grid: its ZeRO shard of its tensor-parallel slice of each of its stage's units
// (shards are disjoint, stages hold different units), of which the whole tensors (config.h's
// table: they come last in a slice) on tensor-parallel rank 0 alone (share_counted); and its
// ZeRO shard of its experts, which every tensor-parallel rank holds whole: on rank 0 alone.
static int grid_grad_spans(const Run* r, GradSpan* spans) {
    int n = 0;
    for (int u = 0; u < n_units(&r->cfg); u++) {
        if (r->fsdp.size[u] == 0) continue; // a unit of another stage's
        long lo, hi, counted = share_counted(&r->cfg, u, r->tensor.share); // [0, counted) of the slice
        fsdp_range(&r->fsdp, u, &lo, &hi);
        if (hi > counted) hi = counted > lo ? counted : lo; // this shard's part of them
        spans[n++] = (GradSpan){fsdp_shard_grads(&r->fsdp, u), hi - lo};
        if (!is_moe(&r->cfg, u)) continue;
        fsdp_range(&r->expert_fsdp, u, &lo, &hi);
        spans[n++] = (GradSpan){fsdp_shard_grads(&r->expert_fsdp, u), r->grid.tp == 0 ? hi - lo : 0};
    }
    return n;
}

// Element e of what this rank holds of unit u, in train.c's layout (ckpt.h's Holding, with
// the unit's table t): element lo + e of its tensor-parallel slice, for e in its ZeRO shard
// of it; after that shard, a block with experts has its ZeRO shard of its experts, which
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
// with its ZeRO: for checkpoints (with --experts) they are copied into one array a unit,
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
        for (int q = 0; q < r->grid.C && r->grid.C > 1; q++)
            for (int i = 0; i < r->context.Tq; i++)
                if (cp_pos_of(&r->context, q)[i] == rows->pos) owner = q, at = i;
        if (r->grid.axis[PIPELINE].rank == pp_last_rank(&r->pipe)) {
            if (r->grid.cp == owner)
                memcpy(probs, tp_probs(&r->tensor, &r->cfg, pp_last_acts(&r->pipe), R, at), (size_t)R * r->cfg.vocab * sizeof(float));
            MPI_Bcast(probs, R * r->cfg.vocab, MPI_FLOAT, owner, r->grid.axis[CONTEXT].comm);
        }
        MPI_Bcast(probs, R * r->cfg.vocab, MPI_FLOAT, pp_last_rank(&r->pipe), r->grid.axis[PIPELINE].comm);
    }
    return loss;
}

// Mean loss over the whole validation split: each data-parallel replica its share, each
// context-parallel rank its positions of it, added across the data axis on the last
// stage, which has the losses, then broadcast.
static double validation_loss(void* ctx) {
    Run* r = ctx;
    int64_t total = evaluate(forward, r, &r->ds, r->grid.D, r->grid.replica);
    if (r->grid.axis[PIPELINE].rank == pp_last_rank(&r->pipe)) group_allreduce(&r->grid.axis[DATA], &total, 1, MPI_INT64_T, MPI_SUM);
    MPI_Bcast(&total, 1, MPI_INT64_T, pp_last_rank(&r->pipe), r->grid.axis[PIPELINE].comm);
    return mean_loss(total, &r->ds);
}

// ----------------------------------------------------------------------------
// what only serves the strategy: the formulas, axis by axis

static const char sent_words[] = "the tensor, context, data, pipeline and expert formulas on their axes, see below";
static const char mem_words[] = "ZeRO's, on this stage's tensor-parallel slices (and experts), + at the peak of its list, each chunk's microbatches in flight x their activations";

// What this rank sent and holds, each beside its formula: each axis by its own strategy's
// formula (into axis[], report.h's order: tensor, data, pipeline, context, expert), and over
// the whole grid the clipping norm and the load-balancing loss:
//   tensor    train_tp.c's, for this replica's rows through this stage's units
//   context   train_cp.c's K and V of each block, at this rank's heads
//   data      ZeRO on this rank's slices, once a microbatch (train_fsdp.c), and on its
//             experts across the expert data axis; the loss; with experts, every token's k
//             choices all-gathered for each block and microbatch (grid_plan)
//   pipeline  train_pp.c's messages for this replica's rows, at a slice's width
//   expert    train_ep.c's, 4 B x (K + H) for each token sent to or received from another
//             rank of the expert group
static Figures figures(const Run* r, const Progress* pr, const Optimizer* opt, double* axis) {
    const Config* c = &r->cfg;
    const Grid* g = &r->grid;
    int last = g->axis[PIPELINE].rank == pp_last_rank(&r->pipe), mb_rows = r->pipe.mb_rows, rows = r->pipe.rows;
    const Fsdp* ef = &r->expert_fsdp;
    int moe = c->experts > 0;
    Figures f = {.sent_axis = {per_step(pr, g->axis[TENSOR].sent), per_step(pr, g->axis[DATA].sent + g->axis[EXPERT_DATA].sent),
                               per_step(pr, g->axis[PIPELINE].sent), per_step(pr, g->axis[CONTEXT].sent),
                               per_step(pr, g->axis[EXPERT].sent)},
                 .params = r->fsdp.bytes_params + (moe ? ef->bytes_params : 0), .grads = r->fsdp.bytes_grads + (moe ? ef->bytes_grads : 0),
                 .optim = r->fsdp.bytes_opt + (moe ? ef->bytes_opt : 0),
                 .acts = pp_acts_bytes(&r->pipe, c, &r->sizes, mb_rows), .bubble = g->P > 1 ? pp_bubble(&r->pipe) : -1};
    f.sent = per_step(pr, g->world.sent);
    for (int a = 0; a < 5; a++) f.sent += f.sent_axis[a];
    f.received = per_step(pr, g->world.received);
    for (int a = 0; a < N_AXES; a++) f.received += per_step(pr, g->axis[a].received);
    // the loss goes to world rank 0 from one pipeline's last stage only
    int loss_relayed = last && g->axis[PIPELINE].rank != 0 && !(g->tp == 0 && g->axis[DATA].rank == 0);
    for (int a = 0; a < 5; a++) axis[a] = 0;
    double slices = 0, biggest = 0, experts = 0, biggest_experts = 0; // what ZeRO shards here
    for (int u = 0; u < n_units(c); u++) {
        slices += r->fsdp.size[u], biggest = r->fsdp.size[u] > biggest ? r->fsdp.size[u] : biggest;
        if (moe) experts += ef->size[u], biggest_experts = ef->size[u] > biggest_experts ? ef->size[u] : biggest_experts;
    }
    int G = g->D * g->C, k = c->top_k;
    for (int v = 0; v < r->V; v++) {
        int lo = r->first[r->pipe.chunk[v]], hi = r->first[r->pipe.chunk[v] + 1];
        axis[0] += tp_sent_formula(&r->tensor, c, lo, hi, (double)rows);
        for (int u = lo; u < hi; u++) {
            if (u == 0 || u > c->layers) continue;
            if (g->C > 1) // attention across the context axis, each block: train_cp.c's formula, at this rank's heads
                axis[3] += cp_sent_per_block(&r->context, (double)rows * r->context.Tq * r->tensor.dims.A, c->recompute);
            if (!moe) continue;
            Expert e = moe_expert(c, u);
            axis[4] += per_step(pr, ep_a2a_bytes_of(&e, r->routed[u]));
            axis[1] += r->M * ring_half_bytes(4.0 * G * r->plan->rows * r->tensor.dims.Tq * k, G); // the choices
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
// from every rank's figures and formulas), in the grid's order.
static void grid_print_axes(const Run* r, const Figures* all, const double* axis) {
    static const char* name[5] = {"tp", "dp", "pp", "cp", "ep"}; // report.h's order
    static const int order[5] = {0, 3, 1, 2, 4};                 // the grid's: tensor, context, data, pipeline, expert
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

// Every rank's place in the grid, its units and its rows (printed by rank 0); with
// --experts, its place in its expert group and its experts.
static void grid_print(const Run* r, int batch) {
    const Grid* g = &r->grid;
    for (int q = 0; q < world_size; q++) {
        int c[5];
        grid_coords(g, q, c);
        int replica = c[EGROUP] * g->E + c[MEMBER];
        long first;
        int R = microbatch_rows(batch, r->M, 0, g->D, replica, &first);
        printf("  rank %-3d   tp %d, cp %d, stage %d, replica %d", q, c[TP], c[CP], c[STAGE], replica);
        if (r->cfg.experts) printf(" (expert group %d, member %d)", c[EGROUP], c[MEMBER]);
        printf(":");
        for (int v = 0; v < r->V; v++) pp_print_units(&r->cfg, r->first, chunk_global(r->sched, g->P, c[STAGE], v));
        printf(" (rows %ld-%ld of microbatch 0", first, first + R - 1);
        if (g->C > 1) {
            printf(", positions");
            for (int i = 0; i < r->context.Tq; i++) printf(" %d", cp_pos_of(&r->context, c[CP])[i]);
        }
        printf(", slice %d of %d, shard %d of %d", c[TP], g->T, replica * g->C + c[CP], g->D * g->C);
        if (r->cfg.experts) {
            long xlo, xhi;
            split_range(r->cfg.experts, g->E, c[MEMBER], &xlo, &xhi);
            printf("; experts %ld-%ld of each block, shard %d of %d", xlo, xhi - 1, c[EGROUP] * g->C + c[CP], g->D / g->E * g->C);
        }
        printf(")\n");
    }
}

// ----------------------------------------------------------------------------
// options of this program

static const CliFlag grid_flags[] = {
    {"tp", "T", "tensor-parallel ranks (default: 1, or what the others leave)"},
    {"dp", "D", "data-parallel ranks"},
    {"pp", "P", "pipeline stages"},
    {"cp", "C", "--model gpt: context-parallel ranks, each a share of every row's positions (default 1)"},
    {"cp-comm", "HOW", "with --cp: ring (default), allgather or alltoall (train_cp.c)"},
    {"cp-split", "HOW", "with --cp: zigzag (default) or contiguous"},
    {"ep", "E", "--model gpt --experts X: expert-parallel ranks, out of the data-parallel ones (E divides D; default 1)"},
    {"zero", "N", "ZeRO stage across the data-parallel ranks: 1, 2 or 3 (default 3)"},
    {"prefetch", NULL, "stage 3: gather the next unit while the current one computes"},
    PIPELINE_FLAGS,
    {"sp", NULL, "--model gpt: sequence parallelism on the tensor axis (train_tp.c)"},
};
static const char* grid_flag(void* ctx, int index, const char* value) {
    Run* r = ctx;
    Grid* g = &r->grid;
    switch (index) {
    case 0: return cli_int("tp", value, 1, 4096, &g->T);
    case 1: return cli_int("dp", value, 1, 4096, &g->D);
    case 2: return cli_int("pp", value, 1, MAX_LAYERS + 2, &g->P);
    case 3: return cli_int("cp", value, 1, 1024, &g->C);
    case 4:
        r->ring_given = 1;
        return cp_comm_parse(value, &r->comm);
    case 5:
        if (strcmp(value, "zigzag") && strcmp(value, "contiguous")) return "--cp-split must be zigzag or contiguous";
        r->zigzag = !strcmp(value, "zigzag"), r->split_given = 1;
        return NULL;
    case 6: return cli_int("ep", value, 1, 4096, &g->E);
    case 7: return cli_int("zero", value, 1, 3, &r->zero);
    case 8: r->prefetch = 1; return NULL;
    case 9: return cli_int("microbatches", value, 1, 65536, &r->M);
    case 10: return schedule_parse(value, &r->sched, cli_error, sizeof cli_error);
    case 11: return cli_int("virtual", value, 1, 4, &r->V);
    case 12: r->timeline = 1; return NULL;
    default: r->sp = 1; return NULL;
    }
}

// The expert axis, and what a mixture of experts allows of the grid.
static void grid_resolve_experts(Run* r, const Options* o, int ep_given) {
    const Config* mc = &o->model;
    Grid* g = &r->grid;
    int X = mc->experts;
    if (X > 0 && !is_gpt(mc))
        dist_exit(2, RUN_LINE, "--experts: train_3d.c's experts are the GPT's blocks' (--model gpt); the MLP's mixture "
                  "of experts trains in train.c and train_ep.c");
    if (ep_given && X == 0)
        dist_exit(2, RUN_LINE, "--ep splits each block's experts over ranks: it applies with --model gpt --experts X");
    if (X == 0) return;
    if (g->D % g->E != 0)
        dist_exit(2, RUN_LINE, "--ep %d does not divide --dp %d: the expert-parallel group is carved out of the "
                  "data-parallel ranks (Megatron's and DeepSeek's layout), E replicas to a group", g->E, g->D);
    if (g->E > X)
        dist_exit(2, RUN_LINE, "--ep %d but --experts %d: every expert-parallel rank needs at least one expert of each "
                  "block (--experts %d or more, or a smaller --ep)", g->E, X, g->E);
    if (r->sp)
        dist_exit(2, RUN_LINE, "--sp with --experts: sequence parallelism gives each tensor-parallel rank its own tokens, "
                  "so the experts' and router's gradients would be partial sums over the tensor axis and the "
                  "capacity's token order would interleave the ranks' shards; train_3d.c gives every tensor-parallel "
                  "rank the same tokens and its experts whole instead (drop --sp)");
}

// The grid T x C x P x D must be the world size; an axis not given is 1, or, if it is the only
// one missing, whatever the world size leaves for it. And the model must fit it.
static void grid_resolve(Run* r, const Options* o) {
    Grid* g = &r->grid;
    int ep_given = g->E > 0;
    g->C = g->C > 0 ? g->C : 1, g->E = g->E > 0 ? g->E : 1; // the context and expert axes are 1 unless given
    int given = (g->T > 0) + (g->D > 0) + (g->P > 0), prod = (g->T > 0 ? g->T : 1) * (g->D > 0 ? g->D : 1) * (g->P > 0 ? g->P : 1) * g->C;
    if (given == 2 && world_size % prod == 0) { // the one missing axis takes the rest
        if (g->T == 0) g->T = world_size / prod;
        if (g->D == 0) g->D = world_size / prod;
        if (g->P == 0) g->P = world_size / prod;
    }
    if (given < 2 && prod != world_size)
        dist_exit(2, RUN_LINE, "%d ranks: say how to arrange them, with at least two of --tp --dp --pp "
                  "(their product, times --cp, must be %d)", world_size, world_size);
    g->T = g->T > 0 ? g->T : 1, g->D = g->D > 0 ? g->D : 1, g->P = g->P > 0 ? g->P : 1;
    if (g->T * g->C * g->D * g->P != world_size)
        dist_exit(2, RUN_LINE, "--tp %d x --cp %d x --dp %d x --pp %d = %d, but mpirun started %d ranks", g->T, g->C,
                  g->D, g->P, g->T * g->C * g->D * g->P, world_size);
    if (g->C > 1 && !is_gpt(&o->model))
        dist_exit(2, RUN_LINE, "--cp splits a row's positions, which only the GPT has (--model gpt)");
    if (g->C == 1 && (r->ring_given || r->split_given))
        dist_exit(2, RUN_LINE, "--cp-comm and --cp-split apply with --cp 2 or more");
    const Config* mc = &o->model;
    if (!is_gpt(mc) && g->T > mc->hidden)
        dist_exit(2, RUN_LINE, "--tp %d but a hidden size of %d: every tensor-parallel rank needs at least one hidden "
                  "unit", g->T, mc->hidden);
    if (is_gpt(mc) && mc->heads % g->T != 0)
        dist_exit(2, RUN_LINE, "--tp %d but %d heads: tensor parallelism gives each rank whole heads, so --tp must "
                  "divide --heads", g->T, mc->heads);
    if (r->sp && !is_gpt(mc))
        dist_exit(2, RUN_LINE, "--sp applies to --model gpt (the MLP has no LayerNorm or residual to split by tokens)");
    grid_resolve_experts(r, o, ep_given);
    int chunks = schedule_chunks(r->sched, r->V > 0 ? r->V : 2);
    char err[300];
    if (r->V > 0 && r->sched != SCHEDULE_INTERLEAVED) dist_exit(2, RUN_LINE, "--virtual applies to --schedule interleaved only");
    if (g->P * chunks > mc->layers + 2 && chunks == 1)
        dist_exit(2, RUN_LINE, "--pp %d but the model has only %d units (%s): raise --layers", g->P, mc->layers + 2,
                  units_in_words(mc));
    if (g->P * chunks > mc->layers + 2)
        dist_exit(2, RUN_LINE, "--pp %d x %d chunks = %d chunks but the model has only %d units (%s): raise --layers",
                  g->P, chunks, g->P * chunks, mc->layers + 2, units_in_words(mc));
    if (o->batch < r->M * g->D)
        dist_exit(2, RUN_LINE, "a batch of %d rows cannot give each of %d microbatches a row for each of %d "
                  "data-parallel replicas (raise --batch, or lower --dp or --microbatches)", o->batch, r->M, g->D);
    if (schedule_rule(r->sched, g->P, chunks, r->M, err, sizeof err)) dist_exit(2, RUN_LINE, "%s", err);
    if (mc->recompute == RECOMPUTE_FULL && schedule_splits_iw(r->sched))
        dist_exit(2, RUN_LINE, "--recompute full with --schedule %s: full recomputation keeps one block's activations "
                  "at a time, and a schedule that runs a block's weight half later (zb1, zbv, dualpipev) needs them "
                  "then; use --recompute selective, or another schedule", schedule_names[r->sched]);
    if (r->prefetch && r->zero != 3) dist_exit(2, RUN_LINE, "--prefetch applies to --zero 3 only");
    r->V = chunks;
}

// ----------------------------------------------------------------------------
// what only serves the strategy: setting the run up

// What the data must allow of the grid.
static void grid_check_data(const Run* r) {
    const Grid* g = &r->grid;
    const Config* c = &r->cfg;
    int chunks = r->zigzag ? 2 * g->C : g->C;
    if (g->T > r->ds.vocab)
        dist_exit(2, RUN_LINE, "--tp %d but a vocabulary of %d tokens: every tensor-parallel rank needs at least one",
                  g->T, r->ds.vocab);
    if (g->C > 1 && c->context % chunks != 0)
        dist_exit(2, RUN_LINE, "--cp %d and %d positions: the %s split cuts T into %d equal chunks, so %d must divide T "
                  "(pass --context)", g->C, c->context, r->zigzag ? "zigzag" : "contiguous", chunks, chunks);
    if (g->C > 1 && r->comm == CP_ALLTOALL && c->heads / g->T % g->C != 0)
        dist_exit(2, RUN_LINE, "--cp %d with --cp-comm alltoall and %d heads a tensor-parallel rank (--heads %d / --tp %d): "
                  "Ulysses gives each context-parallel rank whole heads of those, so --cp must divide %d: %s (or use "
                  "--cp-comm ring)", g->C, c->heads / g->T, c->heads, g->T, c->heads / g->T,
                  ulysses_fits(c->heads / g->T, c->context, r->zigzag, "--cp"));
}

// This rank's stage, its tensor-parallel slices (at its positions, with --cp), their ZeRO
// shards, its experts, the weights (a checkpoint's with --load) and the pipeline. Returns
// the step the checkpoint ended at (0 without one).
static long grid_model_init(Run* r, const Options* o) {
    Config* cfg = &r->cfg;
    Grid* g = &r->grid;
    pp_split(cfg, g->P * r->V, r->first);
    long first;
    int mb_rows = microbatch_rows(o->batch, r->M, 0, g->D, 0, &first); // the most rows a rank takes at once
    int rows = pass_rows(o, mb_rows); // a microbatch, or a validation or sampling pass
    tp_init(&r->tensor, &g->axis[TENSOR], cfg, rows, r->sp);
    if (g->C > 1) { // the context axis inside the tensor block: its positions, and attention across them
        cp_init(&r->context, &g->axis[CONTEXT], cfg, rows, r->comm, r->zigzag, 0);
        r->tensor.dims.Tq = r->context.Tq, r->tensor.dims.pos = r->context.dims.pos;
        r->attend = (TpHooks){grid_attend, grid_attend_backward, r};
        r->tensor.hooks = &r->attend;
    }
    tp_sizes(&r->tensor, cfg, &r->sizes);
    long slice_size[MAX_LAYERS + 2] = {0}; // ZeRO shards the slices of this rank's chunks; other units are empty
    for (int v = 0; v < r->V; v++)
        for (int k = chunk_global(r->sched, g->P, g->stage, v), u = r->first[k]; u < r->first[k + 1]; u++)
            slice_size[u] = r->tensor.size[u];
    fsdp_init(&r->fsdp, r->zero, r->prefetch, &g->axis[DATA], slice_size, n_units(cfg), o->opt.adamw);
    if (cfg->experts) grid_experts_init(r, o, mb_rows);
    grid_holding(r, o->opt.adamw);
    long start = grid_load(r, o);
    fsdp_gather_params(&r->fsdp);
    if (cfg->experts) fsdp_gather_params(&r->expert_fsdp);
    PpPlan plan = {.sched = r->sched, .V = r->V, .M = r->M, .first = r->first, .batch = o->batch, .pass_capacity = rows};
    pp_init(&r->pipe, &g->axis[PIPELINE], cfg, plan,
            (PpPlug){g->D, g->replica, &r->sizes, {stage_forward, stage_backward, stage_backward_weight, r}});
    workspace_init(&r->ws, rows, max_width(cfg), max_linear_weight(cfg));
    r->n_spans = grid_grad_spans(r, r->spans);
    return start;
}

// The run's layout in words, for the first lines it prints.
static void grid_layout(const Run* r, char* layout, int size) {
    const Grid* g = &r->grid;
    const Config* cfg = &r->cfg;
    int at = snprintf(layout, size, "grid of %d tensor x ", g->T);
    if (g->C > 1) at += snprintf(layout + at, size - at, "%d context x ", g->C);
    at += snprintf(layout + at, size - at, "%d pipeline x %d data = %d ranks; ZeRO stage %d; %d microbatch%s, %s",
                   g->P, g->D, world_size, r->zero, r->M, r->M > 1 ? "es" : "", schedule_names[r->sched]);
    if (g->C > 1)
        at += snprintf(layout + at, size - at, "; attention by %s, %s split", cp_comm_names[r->comm],
                       r->zigzag ? "zigzag" : "contiguous");
    if (r->sp) at += snprintf(layout + at, size - at, "; sequence parallel");
    if (cfg->recompute) at += snprintf(layout + at, size - at, "; %s recomputation", recompute_names[cfg->recompute]);
    if (cfg->experts)
        snprintf(layout + at, size - at, "; expert parallel over %d of the data-parallel ranks (%d experts a "
                 "block, top-%d)", g->E, cfg->experts, cfg->top_k);
}

static void run_free(Run* r) {
    dataset_free(&r->ds), fsdp_free(&r->fsdp), tp_free(&r->tensor), pp_free(&r->pipe), workspace_free(&r->ws);
    if (r->context.pos) cp_free(&r->context);
    if (r->cfg.experts) fsdp_free(&r->expert_fsdp), ep_free(&r->experts);
    if (r->plan) free(r->plan->pos_rank), free(r->plan->pos_at), free(r->plan->choices), free(r->plan->keep), free(r->plan->counts);
    free(r->plan);
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);
    Options o;
    Run run = {.zero = 3, .M = 4, .sched = SCHEDULE_1F1B, .comm = CP_RING, .zigzag = 1};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, grid_flags, 14, grid_flag, &run);
    o.microbatches = run.M; // what a checkpoint records
    grid_resolve(&run, &o);
    Grid* g = &run.grid;
    grid_init(g); // the coordinates and the axes' groups
    load_data(&run.ds, &o, &run.cfg);
    grid_check_data(&run);
    long start = grid_model_init(&run, &o);
    char layout[320];
    grid_layout(&run, layout, sizeof layout);
    if (!o.quiet && world_rank == 0) {
        print_config(&o, &run.ds, layout);
        grid_print(&run, o.batch);
    }

    Progress progress = progress_start(&o, world_rank == 0, grid_save, &run, dist_any);
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        double loss = train_step(&run, &o, &progress, step);
        if (step_end(&progress, step, loss, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    double axis[5], *axes = world_rank == 0 ? mallocCheck(sizeof axis * world_size) : NULL;
    Figures fig = figures(&run, &progress, &o.opt, axis);
    MPI_Gather(axis, 5, MPI_DOUBLE, axes, 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    Report rep = {"train_3d.c", layout, sent_words, mem_words};
    Figures* all = dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run);
    if (world_rank == 0 && !o.quiet) grid_print_axes(&run, all, axes);
    free(all), free(axes);
    if (run.timeline && g->tp == 0 && g->axis[DATA].rank == 0) pp_timeline(&run.pipe); // world rank 0's pipeline
    run_free(&run);
    MPI_Finalize();
    return 0;
}
