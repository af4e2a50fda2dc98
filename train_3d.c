/*
 * train_3d.c: 3D, and 4D, parallel: fully sharded data parallel, tensor parallel, pipeline
 * parallel and (the GPT) context parallel at once, the way the largest models are trained.
 * The ranks form a grid T (tensor) x C (context) x P (pipeline) x D (data), Llama 3's
 * order: along the pipeline, microbatches follow a schedule through P stages; inside a
 * stage, every layer is split across T tensor-parallel ranks, and each row's positions
 * across C context-parallel ranks; each (tensor slice, stage) is sharded with ZeRO across
 * the D x C ranks that hold it for other rows and positions. It prints exactly what
 * train.c prints for the same flags, in every grid.
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
 * Per rank and step, each axis by its own program's formula (train_tp.c for this replica's
 * rows through this stage's units; train_cp.c's K and V for them; train_fsdp.c for this
 * rank's slices of them, once per microbatch; train_pp.c for this replica's rows at a
 * slice's width), plus the loss and the clipping norm over the whole grid. Memory: ZeRO's,
 * on this stage's tensor-parallel slices, plus the pipeline's peak activations.
 *
 *   make train_3d && mpirun -n 8 --oversubscribe ./train_3d --tp 2 --dp 2 --pp 2
 *   mpirun -n 6 --oversubscribe ./train_3d --tp 2 --pp 3 --layers 3 --zero 1 --schedule gpipe
 *   mpirun -n 8 --oversubscribe ./train_3d --tp 2 --dp 2 --pp 2 --layers 4 --schedule zbv
 *   mpirun -n 16 --oversubscribe ./train_3d --model gpt --tp 2 --cp 2 --pp 2 --dp 2   # 4D
 *
 * Compare with ./train: the same losses, names and final checkpoint, in every grid.
 *
 * It adds little logic of its own: the strategies come from train_fsdp.c, train_tp.c,
 * train_pp.c and train_cp.c, included below without their programs, and compose through
 * their parameters: a group of ranks for each, the pipeline's StageWork, FSDP's unit sizes,
 * the attention a tensor-parallel block takes from the context axis. What is new: the grid
 * of communicators, a stage whose units are tensor-parallel and FSDP-sharded, and the
 * global gradient norm across every axis.
 *
 * Sections: the state of one run; the strategy (the grid; a stage's work; the norm and
 * what a rank holds); the forward pass and the figures; options; main.
 */
#define TRAIN_3D // take the strategies of these files, not their programs
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function" // their programs use a few functions this one does not
#include "train_fsdp.c"
#include "train_tp.c"
#include "train_pp.c"
#include "train_cp.c"
#pragma GCC diagnostic pop

#define RUN_LINE "mpirun -n 8 ./train_3d --tp 2 --dp 2 --pp 2"

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    Dataset ds;     // the data
    int T, D, P, Cp;      // --tp, --dp, --pp, --cp
    int ring, zigzag;     // --cp-comm, --cp-split
    int ring_given, split_given;
    int zero, prefetch;   // --zero, --prefetch
    int M, sched, V, timeline; // --microbatches, --schedule, --virtual, --timeline
    int sp;               // --sp: sequence parallelism on the tensor axis (the GPT)
    Group tp_group;       // the T ranks with this rank's (dp, pp): one stage's tensor-parallel slices
    Group cp_group;       // the C ranks with its (tp, pp, dp): the positions of its rows
    Group dp_group;       // the D x C ranks with its (tp, pp): the other rows and positions of its slice
    Group pp_group;       // the P ranks with its (tp, dp): the stages of its pipeline
    Group world_group;    // every rank: the clipping norm over the whole grid
    Tp tensor;            // this rank's tensor-parallel slice of every unit
    Fsdp fsdp;            // those slices of this stage's units, sharded across the data-parallel ranks
    Pp pipe;              // this stage of the pipeline
    Cp context;           // its positions, and attention across the context axis
    int first[MAX_LAYERS + 3]; // chunk k holds units [first[k], first[k+1])
    UnitSizes sizes;           // what each unit holds per row on this rank (train_tp.c's tp_sizes)
    Workspace ws;
    Holding mine;   // what this rank holds of the model, for checkpoints
} Run;

static void run_free(Run* r) {
    dataset_free(&r->ds), fsdp_free(&r->fsdp), tp_free(&r->tensor), pp_free(&r->pipe), workspace_free(&r->ws);
    if (r->context.pos) cp_free(&r->context);
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
static void grid_coords(const Run* r, int rank, int* tp, int* cp, int* pp, int* dp) {
    *tp = rank % r->T, *cp = rank / r->T % r->Cp, *pp = rank / (r->T * r->Cp) % r->P, *dp = rank / (r->T * r->Cp * r->P);
}
static void grid_split(Run* r) {
    int tp, cp, pp, dp;
    grid_coords(r, world_rank, &tp, &cp, &pp, &dp);
    Group* g[4] = {&r->tp_group, &r->cp_group, &r->pp_group, &r->dp_group};
    int color[4] = {(dp * r->P + pp) * r->Cp + cp, (dp * r->P + pp) * r->T + tp, (dp * r->Cp + cp) * r->T + tp, pp * r->T + tp};
    int key[4] = {tp, cp, pp, dp * r->Cp + cp};
    const char* name[4] = {"tp", "cp", "pp", "dp"};
    for (int k = 0; k < 4; k++) {
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

// A chunk's work (the pipeline's StageWork): its units in order, each one's
// tensor-parallel slice gathered by FSDP just before use; each unit's weight gradient,
// whenever the schedule runs it, is reduce-scattered at once. With --cp, the head's
// targets are those of this rank's positions.
static void stage_forward(void* ctx, int v, Acts* a, Scratch* sc, int R, long rows_total) {
    Run* r = ctx;
    int lo = r->pipe.u_lo[v], hi = r->pipe.u_hi[v], T = r->cfg.context, Tq = r->context.Tq;
    if (r->Cp > 1 && hi == n_units(&r->cfg)) // in place: each lands at or before where it is read
        for (int row = 0; row < R; row++)
            for (int i = 0; i < Tq; i++) a->targets[row * Tq + i] = a->targets[row * T + r->tensor.dims.pos[i]];
    for (int u = lo; u < hi; u++)
        tp_unit_forward(&r->tensor, &r->cfg, u, fsdp_unit_params(&r->fsdp, u, u + 1 < hi ? u + 1 : -1), a, sc, R,
                        rows_total, &r->ws);
}
static void unit_weight(Run* r, int u, const Acts* a, const float* stash, int R, long batch) {
    tp_unit_backward_weight(&r->tensor, &r->cfg, u, fsdp_unit_grads(&r->fsdp, u), a, stash, R, batch, &r->ws);
    fsdp_reduce_unit_grads(&r->fsdp, u);
}
static void stage_backward(void* ctx, int v, Acts* a, Scratch* sc, float* const* stash, int R, long batch) {
    Run* r = ctx;
    int lo = r->pipe.u_lo[v], hi = r->pipe.u_hi[v];
    for (int u = hi - 1; u >= lo; u--) {
        tp_unit_backward_input(&r->tensor, &r->cfg, u, fsdp_unit_params(&r->fsdp, u, u - 1 >= lo ? u - 1 : -1), a, sc,
                               R, &r->ws);
        if (stash) memcpy(stash[u], unit_stash(&r->cfg, u, sc), (size_t)R * unit_stash_at(&r->cfg, &r->sizes, u) * sizeof(float)); // for W
        else unit_weight(r, u, a, unit_stash(&r->cfg, u, sc), R, batch);
        scratch_step_down(sc);
    }
}
static void stage_backward_weight(void* ctx, int v, const Acts* a, float* const* stash, int R, long batch) {
    Run* r = ctx;
    for (int u = r->pipe.u_lo[v]; u < r->pipe.u_hi[v]; u++) unit_weight(r, u, a, stash[u], R, batch);
}

// The gradients this rank counts in the global norm, every element of the model once
// across the whole grid: its FSDP shard of its tensor-parallel slice of each of its
// stage's units (shards are disjoint, stages hold different units), except that a
// row-parallel layer's bias, held whole by every tensor-parallel rank, is counted by
// tensor-parallel rank 0 alone (tp_counted).
static int grid_grad_spans(const Run* r, GradSpan* spans) {
    int n = 0;
    for (int u = 0; u < n_units(&r->cfg); u++) {
        if (r->fsdp.size[u] == 0) continue; // a unit of another rank's chunks
        long lo, hi, counted = tp_counted(&r->tensor, &r->cfg, u);
        fsdp_range(&r->fsdp, u, &lo, &hi);
        if (hi > counted) hi = counted > lo ? counted : lo;
        spans[n++] = (GradSpan){fsdp_shard_grads(&r->fsdp, u), hi - lo};
    }
    return n;
}

// Element e of this rank's FSDP shard of unit u, in train.c's layout: element lo + e of
// its tensor-parallel slice (ckpt.h's Holding).
static long canonical(const void* ctx, int u, long e) {
    const Run* r = ctx;
    long lo, hi;
    fsdp_range(&r->fsdp, u, &lo, &hi);
    return tp_canonical(&r->tensor, &r->cfg, u, lo + e);
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
    case 6: return cli_int("zero", value, 1, 3, &r->zero);
    case 7: r->prefetch = 1; return NULL;
    case 8: return cli_int("microbatches", value, 1, 65536, &r->M);
    case 9: return schedule_parse(value, &r->sched, cli_error, sizeof cli_error);
    case 10: return cli_int("virtual", value, 1, 4, &r->V);
    case 11: r->timeline = 1; return NULL;
    default: r->sp = 1; return NULL;
    }
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

// Every rank's place in the grid, its units and its rows (printed by rank 0).
static void grid_print(const Run* r, int batch) {
    for (int q = 0; q < world_size; q++) {
        int tp, cp, pp, dp;
        grid_coords(r, q, &tp, &cp, &pp, &dp);
        long lo, hi;
        split_range(batch, r->D, dp, &lo, &hi);
        printf("  rank %-3d   tp %d, cp %d, pp %d, dp %d:", q, tp, cp, pp, dp);
        for (int v = 0; v < r->V; v++) pp_print_units(&r->cfg, r->first, chunk_global(r->sched, r->P, pp, v));
        printf(" (rows %ld-%ld", lo, hi - 1);
        if (r->Cp > 1) {
            printf(", positions");
            for (int i = 0; i < r->context.Tq; i++) printf(" %d", cp_pos_of(&r->context, cp)[i]);
        }
        printf(", slice %d of %d, shard %d of %d)\n", tp, r->T, dp * r->Cp + cp, r->D * r->Cp);
    }
}

// The formulas of figures(), in words, for the report.
static const char sent_words[] = "the tensor, context, data and pipeline formulas on their axes, see below";
static const char mem_words[] = "ZeRO's, on this stage's tensor-parallel slices, + peak activations";

// What this rank sent and holds, each beside its formula: each axis by its own strategy's
// formula (tensor parallelism for the rows of this replica through this stage's units;
// ZeRO on this rank's slices of them, once per microbatch; the pipeline's messages for
// this replica's rows, at a slice's width), and over the whole grid the loss and the
// clipping norm. Memory: ZeRO's on this stage's slices, and the pipeline's peak activations.
static Figures figures(const Run* r, const Progress* pr, const Optimizer* opt, long rows) {
    const Config* c = &r->cfg;
    int last = r->pp_group.rank == pp_last_rank(&r->pipe), mb_rows = (int)(rows + r->M - 1) / r->M;
    Figures f = {.sent_axis = {per_step(pr, r->tp_group.sent), per_step(pr, r->dp_group.sent),
                               per_step(pr, r->pp_group.sent), per_step(pr, r->cp_group.sent)},
                 .params = r->fsdp.bytes_params, .grads = r->fsdp.bytes_grads, .optim = r->fsdp.bytes_opt,
                 .acts = pp_acts_bytes(&r->pipe, c, &r->sizes, mb_rows), .bubble = r->P > 1 ? pp_bubble(&r->pipe) : -1};
    f.sent = f.sent_axis[0] + f.sent_axis[1] + f.sent_axis[2] + f.sent_axis[3] + per_step(pr, r->world_group.sent);
    f.received = per_step(pr, r->tp_group.received + r->dp_group.received + r->pp_group.received +
                                  r->cp_group.received + r->world_group.received);
    // only one pipeline sends it
    int loss_relayed = last && r->pp_group.rank != 0 && !(r->tp_group.rank == 0 && r->dp_group.rank == 0);
    double tp_sent = 0, slices = 0, biggest = 0; // over this rank's chunks, of its tensor-parallel slices
    for (int v = 0; v < r->V; v++)
        tp_sent += tp_sent_formula(&r->tensor, c, r->pipe.u_lo[v], r->pipe.u_hi[v], (double)rows);
    for (int u = 0; u < n_units(c); u++)
        slices += r->fsdp.size[u], biggest = r->fsdp.size[u] > biggest ? r->fsdp.size[u] : biggest;
    if (r->Cp > 1) // K and V of each block of this rank's chunks: train_cp.c's formula, at this rank's heads
        for (int v = 0; v < r->V; v++)
            for (int u = r->pipe.u_lo[v]; u < r->pipe.u_hi[v]; u++) {
                if (u == 0 || u > c->layers) continue;
                double N = r->Cp, blk = (double)rows * r->context.Tq * r->tensor.dims.A;
                tp_sent += 2 * (2 * (N - 1) * 4 * blk) + (r->ring ? 2 * N * 8 * blk : 2 * (N - 1) * 8 * blk);
            }
    f.sent_formula = tp_sent + fsdp_sent_formula(&r->fsdp, r->M) + (last ? ring_allreduce_bytes(8, r->D * r->Cp) : 0) +
                     pp_sent_formula(&r->pipe) - (loss_relayed ? 8 : 0) +
                     (opt->clip > 0 ? ring_allreduce_bytes(4 + 8, world_size) : 0);
    f.mem_formula =
        fsdp_mem_formula(&r->fsdp, slices, biggest, opt->adamw) + pp_acts_formula(&r->pipe, c, &r->sizes, mb_rows);
    return f;
}
// The bytes every rank sent per step on each axis (rank 0, from every rank's figures).
static void grid_print_axes(const Figures* all) {
    printf("bytes sent per step on each axis (tensor, context, data, pipeline):\n");
    for (int q = 0; q < world_size; q++) {
        printf("  rank %-3d tp ", q);
        print_size(all[q].sent_axis[0]);
        printf(", cp ");
        print_size(all[q].sent_axis[3]);
        printf(", dp ");
        print_size(all[q].sent_axis[1]);
        printf(", pp ");
        print_size(all[q].sent_axis[2]);
        printf("\n");
    }
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    Run run = {.zero = 3, .M = 4, .sched = SCHEDULE_1F1B, .ring = 1, .zigzag = 1};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, grid_flags, 13, grid_flag, &run);
    dist_dense_only(&o, RUN_LINE);
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
    run.mine = fsdp_holding(&run.fsdp);
    run.mine.canonical = canonical, run.mine.ctx = &run;
    long start = holding_load(&run.mine, &o, &run.ds, cfg);
    fsdp_gather_params(&run.fsdp);
    pp_init(&run.pipe, &run.pp_group, cfg, run.M, run.sched, run.V, run.first, (int)(hi - lo), o.batch, rows, &run.sizes,
            (StageWork){stage_forward, stage_backward, stage_backward_weight, &run});
    workspace_init(&run.ws, rows, max_width(cfg), max_linear_weight(cfg));
    char layout[200];
    snprintf(layout, sizeof layout, "grid of %d tensor x %d pipeline x %d data = %d ranks; ZeRO stage %d; %d "
             "microbatches, %s%s", run.T, run.P, run.D, world_size, run.zero, run.M, schedule_names[run.sched],
             run.sp ? "; sequence parallel" : "");
    if (run.Cp > 1)
        snprintf(layout, sizeof layout, "grid of %d tensor x %d context x %d pipeline x %d data = %d ranks; ZeRO stage "
                 "%d; %d microbatches, %s; attention by %s, %s split%s", run.T, run.Cp, run.P, run.D, world_size, run.zero,
                 run.M, schedule_names[run.sched], run.ring ? "ring" : "all-gather", run.zigzag ? "zigzag" : "contiguous",
                 run.sp ? "; sequence parallel" : "");
    if (!o.quiet && world_rank == 0) {
        print_config(&o, &run.ds, layout);
        grid_print(&run, o.batch);
    }

    // training loop
    int B = o.batch, last = run.pp_group.rank == pp_last_rank(&run.pipe);
    GradSpan spans[MAX_LAYERS + 2];
    int n_spans = grid_grad_spans(&run, spans);
    Progress progress = progress_start(&o, world_rank == 0, dist_save, &(DistSave){&run.mine, &run.ds, &run.cfg}, dist_any);
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        Rows batch = training_rows(&run.ds, o.seed, step, lo); // this replica's rows
        fsdp_zero_grads(&run.fsdp);
        int64_t loss = pp_step(&run.pipe, &batch); // the schedule, each stage's units tensor-parallel and sharded
        fsdp_reduce_grads(&run.fsdp);              // ZeRO-1: the whole slice's gradients, once the schedule is done
        if (last) group_allreduce(&run.dp_group, &loss, 1, MPI_INT64_T, MPI_SUM); // every replica's rows
        if (run.tp_group.rank == 0 && run.dp_group.rank == 0)
            pp_loss_to_first(&run.pipe, &loss); // to world rank 0, which prints
        long n = dataset_batch_targets(&run.ds, o.seed, step, B); // the loss is the mean over n targets
        float scale = clip_factor(&o.opt, spans, n_spans, n, group_norm, &run.world_group); // over the whole grid
        fsdp_step(&run.fsdp, &o.opt, grad_factor(n), scale, step);
        if (step_end(&progress, step, fix_to(loss) / n, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, &o.opt, hi - lo);
    Report rep = {"train_3d.c", layout, sent_words, mem_words};
    Figures* all = dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run);
    if (world_rank == 0 && !o.quiet) grid_print_axes(all);
    free(all);
    if (run.timeline && run.tp_group.rank == 0 && run.dp_group.rank == 0)
        pp_timeline(&run.pipe); // world rank 0's pipeline
    run_free(&run);
    MPI_Finalize();
    return 0;
}
