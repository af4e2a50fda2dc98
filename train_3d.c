/*
 * train_3d.c: 3D parallel: fully sharded data parallel, tensor parallel and pipeline
 * parallel at once, the way the largest models are trained. The ranks form a grid
 * T (tensor) x D (data) x P (pipeline): along the pipeline, microbatches follow a schedule
 * through P stages; inside a stage, every layer is split across T tensor-parallel ranks;
 * and each (tensor slice, stage) is sharded across D data-parallel ranks with ZeRO. It
 * prints exactly what train.c prints for the same flags, in every grid.
 *
 *   make train_3d && mpirun -n 8 --oversubscribe ./train_3d --tp 2 --dp 2 --pp 2
 *   mpirun -n 6 --oversubscribe ./train_3d --tp 2 --pp 3 --layers 3 --zero 1 --schedule gpipe
 *
 * It adds little logic of its own: the strategies come from train_fsdp.c, train_tp.c and
 * train_pp.c, included below without their programs. What is new: the grid of
 * communicators, a stage whose units are tensor-parallel and FSDP-sharded, and the global
 * gradient norm across all three axes.
 *
 * Sections: the strategy; options; data; model; training loop; validation, sampling and report.
 */
#define TRAIN_3D // take the strategies of these files, not their programs
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function" // their programs use a few functions this one does not
#include "train_fsdp.c"
#include "train_tp.c"
#include "train_pp.c"
#pragma GCC diagnostic pop

#define RUN_LINE "mpirun -n 8 ./train_3d --tp 2 --dp 2 --pp 2"
#define EVAL_ROWS 256 // validation rows per forward pass (the result does not depend on it)

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    int T, D, P;          // --tp, --dp, --pp
    int zero, prefetch;   // --zero, --prefetch
    int M, sched, timeline; // --microbatches, --schedule, --timeline
    Group tp, dp, pp, world;
    Tp t;                 // this rank's tensor-parallel slice of every unit
    Fsdp f;               // those slices of this stage's units, sharded across the data-parallel ranks
    Pp p;                 // this stage of the pipeline
    int first[MAX_LAYERS + 3]; // stage s holds units [first[s], first[s+1])
    int u_lo, u_hi;       // this stage's units
    int width[MAX_LAYERS + 2]; // each unit's activation width on this rank
    Workspace ws;
    PpRows rows;          // where each stage's rows come from
} Run;

// ----------------------------------------------------------------------------
// the strategy: a grid of groups
//
// World rank = (pp * D + dp) * T + tp: tensor-parallel ranks are adjacent (they talk the
// most: every layer, twice a step), then data-parallel, then pipeline. MPI_Comm_split
// gives each rank three groups: the T ranks with its (dp, pp), the D ranks with its
// (tp, pp) and the P ranks with its (tp, dp).
static void grid_split(Run* r) {
    int tp = world_rank % r->T, dp = world_rank / r->T % r->D, pp = world_rank / (r->T * r->D);
    Group* g[3] = {&r->tp, &r->dp, &r->pp};
    int color[3] = {pp * r->D + dp, pp * r->T + tp, dp * r->T + tp}, key[3] = {tp, dp, pp};
    const char* name[3] = {"tp", "dp", "pp"};
    for (int k = 0; k < 3; k++) {
        MPI_Comm_split(MPI_COMM_WORLD, color[k], key[k], &g[k]->comm);
        MPI_Comm_rank(g[k]->comm, &g[k]->rank);
        MPI_Comm_size(g[k]->comm, &g[k]->size);
        g[k]->name = name[k];
        g[k]->sent = g[k]->received = 0;
    }
    r->world = group_world("world");
}

// A stage's work: its units in order, each one's tensor-parallel slice gathered by FSDP
// (stage 3) just before use; backward reduce-scatters each unit's gradient (stages 2, 3).
static void stage_forward(void* ctx, Acts* a, Scratch* sc, int R, long rows_total) {
    Run* r = ctx;
    for (int u = r->u_lo; u < r->u_hi; u++) {
        const float* w = fsdp_unit_params(&r->f, u, u + 1 < r->u_hi ? u + 1 : -1);
        tp_forward(&r->t, &r->cfg, u, w, a, sc, R, rows_total, &r->ws);
    }
}
static void stage_backward(void* ctx, Acts* a, Scratch* sc, int R, long batch) {
    Run* r = ctx;
    for (int u = r->u_hi - 1; u >= r->u_lo; u--) {
        const float* w = fsdp_unit_params(&r->f, u, u - 1 >= r->u_lo ? u - 1 : -1);
        tp_backward(&r->t, &r->cfg, u, w, fsdp_unit_grads(&r->f, u), a, sc, R, batch, &r->ws);
        fsdp_reduce_grads(&r->f, u);
        float* t = sc->dout;
        sc->dout = sc->din;
        sc->din = t;
    }
    float* t = sc->dout; // leave this stage's input gradient in din
    sc->dout = sc->din;
    sc->din = t;
}

// The global gradient norm's sum of squares, over this rank's shards of its slices of its
// stage's units: every element of the model counted once across the whole grid. FSDP
// shards are disjoint and stages hold different units, but a row-parallel layer's bias is
// held whole by every tensor-parallel rank: only tensor-parallel rank 0 counts it.
static int64_t grid_grads_sumsq(const Run* r, long batch, int e) {
    int64_t s = 0;
    for (int u = r->u_lo; u < r->u_hi; u++) {
        long lo, hi, nw = (long)r->t.k[u] * r->t.j[u]; // a linear layer's bias starts at nw
        fsdp_range(&r->f, u, &lo, &hi);
        const int64_t* g = fsdp_shard_grads(&r->f, u);
        if (r->t.tp->rank != 0 && tp_replicated(&r->t, u, r->t.size[u] - 1)) hi = hi < nw ? hi : (nw > lo ? nw : lo);
        s += grads_sumsq(g, hi - lo, batch, e);
    }
    return s;
}

// This rank's shards of its slices of its stage's units, initialised directly with the
// values train.c uses, or read from a checkpoint one unit at a time. Returns the step.
static long grid_load(Run* r, const Options* o, const Dataset* ds) {
    const Config* c = &r->cfg;
    Fsdp* f = &r->f;
    long n = n_params(c), step = 0;
    float* unit = NULL;
    if (o->load) {
        step = (long)ckpt_check(o->load, c, o->opt.adamw, ds->token_char).step;
        unit = mallocCheck((size_t)max_unit_params(c) * sizeof(float));
    }
    for (int part = 0; part < (o->load && o->opt.adamw ? 3 : 1); part++)
        for (int u = r->u_lo; u < r->u_hi; u++) {
            long lo, hi;
            fsdp_range(f, u, &lo, &hi);
            float* dst = part == 1 ? f->m + f->shard_off[u] : part == 2 ? f->v + f->shard_off[u] : fsdp_shard_params(f, u);
            if (part == 0 && f->stage < 3) { // stages 1 and 2 hold the whole slice
                dst = f->params + f->full_off[u];
                lo = 0, hi = f->size[u];
            }
            if (o->load) ckpt_read(o->load, part * n + unit_offset(c, u), unit_params(c, u), unit);
            for (long e = lo; e < hi; e++) {
                long k = tp_canonical(&r->t, c, u, e);
                dst[e - lo] = k < 0 ? 0.0f : o->load ? unit[k] : unit_init_value(c, o->seed, u, k);
            }
        }
    free(unit);
    return step;
}

// The checkpoint in train.c's layout, one unit at a time: the unit's stage gathers each
// tensor-parallel slice from its data-parallel shards, then the slices from the
// tensor-parallel ranks, and sends the unit to world rank 0, which writes it.
static void grid_save(Run* r, const char* path, int adamw, long step, const Dataset* ds) {
    const Config* c = &r->cfg;
    Fsdp* f = &r->f;
    CkptWriter w = {0};
    CkptHeader h = ckpt_header(c, adamw, step, ds->token_char);
    if (world_rank == 0) w = ckpt_create(path, &h);
    long most = 0;
    for (int u = 0; u < n_units(c); u++) most = f->shard[u] * r->D > most ? f->shard[u] * r->D : most;
    float *slice = mallocCheck((size_t)(most > 0 ? most : 1) * sizeof(float)),
          *unit = mallocCheck((size_t)max_unit_params(c) * sizeof(float));
    for (int part = 0; part < (adamw ? 3 : 1); part++)
        for (int u = 0; u < n_units(c); u++) {
            int owner = 0; // the stage holding unit u
            while (u >= r->first[owner + 1]) owner++;
            if (r->pp.rank == owner) {
                const float* mine = part == 0 ? fsdp_shard_params(f, u) : (part == 1 ? f->m : f->v) + f->shard_off[u];
                MPI_Gather(mine, (int)f->shard[u], MPI_FLOAT, slice, (int)f->shard[u], MPI_FLOAT, 0, r->dp.comm);
                if (r->dp.rank == 0) tp_gather_unit(&r->t, c, u, slice, unit);
            }
            int holder = r->tp.rank == 0 && r->dp.rank == 0; // the pipeline of world rank 0
            if (holder && owner != 0 && r->pp.rank == owner)
                MPI_Send(unit, (int)unit_params(c, u), MPI_FLOAT, 0, 32763, r->pp.comm);
            if (world_rank == 0) {
                if (owner != 0) MPI_Recv(unit, (int)unit_params(c, u), MPI_FLOAT, owner, 32763, r->pp.comm, MPI_STATUS_IGNORE);
                ckpt_write(&w, unit, (size_t)unit_params(c, u) * sizeof(float));
            }
        }
    if (world_rank == 0) ckpt_close(&w);
    free(slice);
    free(unit);
}

// ----------------------------------------------------------------------------
// validation and sampling

// Mean loss over the whole validation split: each data-parallel replica streams its share
// through its pipeline (every replica makes the same number of passes: FSDP gathers in each).
static double evaluate(Run* r, const Dataset* ds) {
    long lo, hi, per = (ds->n_val_examples + r->D - 1) / r->D;
    split_range(ds->n_val_examples, r->D, r->dp.rank, &lo, &hi);
    int64_t total = 0;
    for (long first = lo, pass = 0; pass * EVAL_ROWS < per; first += EVAL_ROWS, pass++) {
        int R = (int)(hi - first < EVAL_ROWS ? (hi - first > 0 ? hi - first : 0) : EVAL_ROWS);
        total += pp_forward_rows(&r->p, pp_rows_val, &r->rows, first, R, ds->n_val_examples, 32767);
    }
    if (r->pp.rank == r->P - 1) group_allreduce(&r->dp, &total, 1, MPI_INT64_T, MPI_SUM);
    MPI_Bcast(&total, 1, MPI_INT64_T, r->P - 1, r->pp.comm); // from the last stage
    return fix_to(total) / (double)ds->n_val_examples;
}

// probs[R][V] for R contexts: through the pipeline, the vocabulary gathered from the
// tensor-parallel ranks of the last stage, then broadcast to every stage.
static void probs_of(void* ctx, const int* tokens, int R, float* probs) {
    Run* r = ctx;
    r->rows.tokens = tokens;
    pp_forward_rows(&r->p, pp_rows_sample, &r->rows, 0, R, R, 32766);
    if (r->pp.rank == r->P - 1) memcpy(probs, tp_probs(&r->t, &r->cfg, &r->p.slot[0], R), (size_t)R * r->cfg.vocab * sizeof(float));
    MPI_Bcast(probs, R * r->cfg.vocab, MPI_FLOAT, r->P - 1, r->pp.comm);
}

// ----------------------------------------------------------------------------
// options of this program

static const CliFlag grid_flags[] = {
    {"tp", "T", "tensor-parallel ranks (default: 1, or what the others leave)"},
    {"dp", "D", "data-parallel ranks"},
    {"pp", "P", "pipeline stages"},
    {"zero", "N", "ZeRO stage across the data-parallel ranks: 1, 2 or 3 (default 3)"},
    {"prefetch", NULL, "stage 3: gather the next unit while the current one computes"},
    {"microbatches", "M", "microbatches per data-parallel share of the batch (default 4)"},
    {"schedule", "NAME", "naive, gpipe or 1f1b (default 1f1b)"},
    {"timeline", NULL, "draw the last step's pipeline timeline (data-parallel replica 0, tensor rank 0)"},
};
static const char* grid_flag(void* ctx, int index, const char* value) {
    Run* r = ctx;
    switch (index) {
    case 0: return cli_int("tp", value, 1, 4096, &r->T);
    case 1: return cli_int("dp", value, 1, 4096, &r->D);
    case 2: return cli_int("pp", value, 1, MAX_LAYERS + 2, &r->P);
    case 3: return cli_int("zero", value, 1, 3, &r->zero);
    case 4: r->prefetch = 1; return NULL;
    case 5: return cli_int("microbatches", value, 1, 65536, &r->M);
    case 6: return pp_schedule_flag(value, &r->sched);
    default: r->timeline = 1; return NULL;
    }
}

// The grid T x D x P must be the world size; an axis not given is 1, or, if it is the only
// one missing, whatever the world size leaves for it.
static void grid_resolve(Run* r) {
    int given = (r->T > 0) + (r->D > 0) + (r->P > 0), prod = (r->T > 0 ? r->T : 1) * (r->D > 0 ? r->D : 1) * (r->P > 0 ? r->P : 1);
    if (given == 2 && world_size % prod == 0) { // the one missing axis takes the rest
        if (r->T == 0) r->T = world_size / prod;
        if (r->D == 0) r->D = world_size / prod;
        if (r->P == 0) r->P = world_size / prod;
    }
    if (given < 2 && prod != world_size)
        dist_exit(2, RUN_LINE, "%d ranks: say how to arrange them, with at least two of --tp --dp --pp "
                  "(their product must be %d)", world_size, world_size);
    r->T = r->T > 0 ? r->T : 1, r->D = r->D > 0 ? r->D : 1, r->P = r->P > 0 ? r->P : 1;
    if (r->T * r->D * r->P != world_size)
        dist_exit(2, RUN_LINE, "--tp %d x --dp %d x --pp %d = %d, but mpirun started %d ranks", r->T, r->D, r->P,
                  r->T * r->D * r->P, world_size);
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    Run run = {.zero = 3, .M = 4, .sched = SCHED_1F1B};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, grid_flags, 8, grid_flag, &run);
    grid_resolve(&run);
    const Config* mc = &o.model;
    if (run.T > mc->hidden)
        dist_exit(2, RUN_LINE, "--tp %d but a hidden size of %d: every tensor-parallel rank needs at least one hidden "
                  "unit", run.T, mc->hidden);
    if (run.P > mc->layers + 2)
        dist_exit(2, RUN_LINE, "--pp %d but the model has only %d units (the embedding and %d linear layers): raise "
                  "--layers", run.P, mc->layers + 2, mc->layers + 1);
    if (o.batch / run.D < run.M)
        dist_exit(2, RUN_LINE, "a batch of %d rows on %d data-parallel ranks leaves %d rows for %d microbatches "
                  "(raise --batch, or lower --dp or --microbatches)", o.batch, run.D, o.batch / run.D, run.M);
    if (run.prefetch && run.zero != 3) dist_exit(2, RUN_LINE, "--prefetch applies to --zero 3 only");
    grid_split(&run);

    // data
    Dataset ds;
    dataset_load(&ds, o.data, o.max_line, o.seed);
    o.model.vocab = ds.vocab;
    if (run.T > ds.vocab)
        dist_exit(2, RUN_LINE, "--tp %d but a vocabulary of %d tokens: every tensor-parallel rank needs at least one",
                  run.T, ds.vocab);

    // model: this rank's stage, its tensor-parallel slices, their data-parallel shards
    run.cfg = o.model;
    Config* cfg = &run.cfg;
    pp_split(cfg, run.P, run.first);
    run.u_lo = run.first[run.pp.rank];
    run.u_hi = run.first[run.pp.rank + 1];
    long lo, hi; // this data-parallel replica's rows of every global batch
    split_range(o.batch, run.D, run.dp.rank, &lo, &hi);
    int rows = (int)(hi - lo + run.M - 1) / run.M; // the largest microbatch, or a validation or sampling pass
    rows = rows > EVAL_ROWS ? rows : EVAL_ROWS;
    rows = o.samples > rows ? o.samples : rows;
    tp_init(&run.t, &run.tp, cfg, rows);
    tp_widths(&run.t, cfg, run.width);
    long slice_size[MAX_LAYERS + 2] = {0}; // FSDP shards this stage's slices; other units are empty
    for (int u = run.u_lo; u < run.u_hi; u++) slice_size[u] = run.t.size[u];
    fsdp_init(&run.f, run.zero, run.prefetch, &run.dp, slice_size, n_units(cfg), o.opt.adamw);
    long start = grid_load(&run, &o, &ds);
    pp_init(&run.p, &run.pp, cfg, run.P, run.M, run.sched, lo, (int)(hi - lo), o.batch, run.u_lo, run.u_hi, rows,
            run.width);
    run.p.forward = stage_forward;
    run.p.backward = stage_backward;
    run.p.ctx = &run;
    run.rows = (PpRows){.ds = &ds, .seed = o.seed, .context = cfg->context};
    workspace_init(&run.ws, rows, max_width(cfg), max_linear_weight(cfg));
    char layout[200];
    snprintf(layout, sizeof layout, "grid of %d tensor x %d data x %d pipeline = %d ranks; ZeRO stage %d; %d "
             "microbatches, %s", run.T, run.D, run.P, world_size, run.zero, run.M, sched_names[run.sched]);
    if (!o.quiet && world_rank == 0) {
        print_config(&o, &ds, layout);
        for (int q = 0; q < world_size; q++) {
            int tp = q % run.T, dp = q / run.T % run.D, pp = q / (run.T * run.D);
            printf("  rank %-3d   tp %d, dp %d, pp %d:", q, tp, dp, pp);
            for (int u = run.first[pp]; u < run.first[pp + 1]; u++)
                printf(u == 0 ? " embedding" : (u == cfg->layers + 1 ? " linear %d + loss" : " linear %d"), u);
            long l2, h2;
            split_range(o.batch, run.D, dp, &l2, &h2);
            printf(" (rows %ld-%ld, slice %d of %d, shard %d of %d)\n", l2, h2 - 1, tp, run.T, dp, run.D);
        }
    }

    // training loop
    int B = o.batch;
    int last = run.pp.rank == run.P - 1;
    Progress progress = progress_start(&o, world_rank == 0);
    for (long step = start + 1; step <= o.steps; step++) {
        step_window_open(o.trace && step == o.steps); // count this step's messages; --trace: the last one
        double t0 = now_seconds();
        run.rows.step = step;
        fsdp_zero_grads(&run.f);
        int64_t loss = pp_step(&run.p, pp_rows_train, &run.rows);
        fsdp_allreduce_grads(&run.f); // ZeRO-1: the whole slice's gradients, once the schedule is done
        if (last) group_allreduce(&run.dp, &loss, 1, MPI_INT64_T, MPI_SUM); // every replica's rows
        if (run.P > 1 && run.tp.rank == 0 && run.dp.rank == 0) { // to world rank 0, which prints
            if (last) group_send(&run.pp, &loss, 1, MPI_INT64_T, 0, 32765);
            if (run.pp.rank == 0) group_recv(&run.pp, &loss, 1, MPI_INT64_T, run.P - 1, 32765);
        }
        float scale = 1.0f;
        if (o.opt.clip > 0) { // the norm over the whole grid, every element counted once
            float mx = fsdp_grads_maxabs(&run.f, B);
            group_allreduce(&run.world, &mx, 1, MPI_FLOAT, MPI_MAX);
            int e = norm_exponent(mx);
            int64_t sumsq = grid_grads_sumsq(&run, B, e);
            group_allreduce(&run.world, &sumsq, 1, MPI_INT64_T, MPI_SUM);
            scale = clip_scale(&o.opt, grad_norm_value(sumsq, e));
        }
        fsdp_step(&run.f, &o.opt, grad_factor(B), scale, step);
        double seconds = now_seconds() - t0;
        step_window_close();
        progress_step(&progress, step, fix_to(loss) / B, seconds, progress_due(&progress, step) ? evaluate(&run, &ds) : 0);
    }
    progress_end(&progress);

    // validation, sampling and report
    double val_loss = evaluate(&run, &ds);
    int max_len = ds.max_len;
    int* names = generate_names(o.samples, max_len, cfg, o.seed, probs_of, &run);
    // Each axis by its own strategy's formula: tensor parallelism for the rows of this
    // replica through this stage's units; ZeRO on this rank's slices of them, once per
    // microbatch; the pipeline's messages for this replica's rows, at a slice's width; and
    // over the whole grid, the loss and the clipping norm.
    int mb_rows = (int)(hi - lo + run.M - 1) / run.M;
    double bpr = acts_bytes_per_row(cfg, run.u_lo, run.u_hi, run.width), steps_done = progress.steps ? progress.steps : 1;
    Figures fig = {.sent_axis = {run.tp.sent / steps_done, run.dp.sent / steps_done, run.pp.sent / steps_done},
                   .params = run.f.bytes_params, .grads = run.f.bytes_grads, .optim = run.f.bytes_opt,
                   .acts = run.p.peak * (double)mb_rows * bpr,
                   .bubble = run.P > 1 ? run.p.idle / (run.p.idle + run.p.busy > 0 ? run.p.idle + run.p.busy : 1) : -1};
    fig.sent = fig.sent_axis[0] + fig.sent_axis[1] + fig.sent_axis[2] + run.world.sent / steps_done;
    fig.received = (run.tp.received + run.dp.received + run.pp.received + run.world.received) / steps_done;
    fig.sent_formula = tp_sent_formula(&run.t, cfg, run.u_lo, run.u_hi, (double)(hi - lo)) +
                       fsdp_sent_formula(&run.f, run.M) + (last ? ring_allreduce_bytes(8, run.D) : 0) +
                       pp_sent_formula(&run.p) - (last && !(run.tp.rank == 0 && run.dp.rank == 0) && run.P > 1 ? 8 : 0) +
                       (o.opt.clip > 0 ? ring_allreduce_bytes(4 + 8, world_size) : 0);
    double slices = 0, biggest = 0; // this stage's tensor-parallel slices
    for (int u = run.u_lo; u < run.u_hi; u++) slices += run.t.size[u], biggest = run.t.size[u] > biggest ? run.t.size[u] : biggest;
    fig.mem_formula = fsdp_mem_formula(&run.f, slices, biggest, o.opt.adamw) + pp_peak_formula(&run.p) * (double)mb_rows * bpr;
    Figures* all = callocCheck(world_size, sizeof(Figures));
    figures_gather(&fig, all);
    if (world_rank == 0) {
        report_print(&o, "train_3d.c", layout, val_loss, &progress, names, max_len, &ds, all, world_size,
                     "the tensor, data and pipeline formulas on their axes, see below",
                     "ZeRO's, on this stage's tensor-parallel slices, + peak activations");
        if (!o.quiet) {
            printf("bytes sent per step on each axis (tensor, data, pipeline):\n");
            for (int q = 0; q < world_size; q++) {
                printf("  rank %-3d tp ", q);
                print_size(all[q].sent_axis[0]);
                printf(", dp ");
                print_size(all[q].sent_axis[1]);
                printf(", pp ");
                print_size(all[q].sent_axis[2]);
                printf("\n");
            }
        }
    }
    free(all);
    if (run.timeline && run.tp.rank == 0 && run.dp.rank == 0) pp_timeline(&run.p); // world rank 0's pipeline
    if (o.save) grid_save(&run, o.save, o.opt.adamw, o.steps > start ? o.steps : start, &ds);

    free(names);
    fsdp_free(&run.f);
    tp_free(&run.t);
    pp_free(&run.p);
    workspace_free(&run.ws);
    dataset_free(&ds);
    if (o.trace) dist_trace_write(o.trace);
    MPI_Finalize();
    return 0;
}
