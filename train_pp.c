/*
 * train_pp.c: pipeline parallel. The model's units are split into S contiguous stages, one
 * per rank; each global batch is cut into M microbatches that stream through the stages,
 * activations flowing forward and gradients backward as point-to-point messages, in the
 * order of a schedule: naive, GPipe or 1F1B. It prints exactly what train.c prints for the
 * same flags, whatever S, M and schedule.
 *
 *   make train_pp && mpirun -n 3 ./train_pp --layers 2 --microbatches 4 --schedule 1f1b
 *   mpirun -n 4 --oversubscribe ./train_pp --layers 3 --microbatches 8 --schedule gpipe --timeline
 *
 * Sections: the strategy; options; data; model; training loop; validation, sampling and report.
 */
#include "model.h"
#include "data.h"
#include "cli.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// the strategy: stages, microbatches, schedules
//
// The global batch of B rows is cut into M microbatches of contiguous rows (32 rows into 3
// microbatches: 11, 11, 10; split_range), every stage drawing the rows of a microbatch
// itself (the counter-based sampler makes that free), so only activations and gradients
// travel. Each stage adds the gradients of all M microbatches into one exact sum, so the
// gradient is the mean over the whole batch, as in train.c, whatever M.
//
// A schedule is, for each stage, the order of its forward (F) and backward (B) passes of
// the microbatches. Time flows right; S = 4 stages, M = 8 microbatches; digits are
// microbatches, F forward and b backward (drawn as taking twice as long):
//
// naive: one microbatch at a time through the whole pipeline, forward then backward
//   stage 0  F0                  b0b0F1                  b1b1 ...
//   stage 1    F0              b0b0    F1              b1b1
//   stage 2      F0          b0b0        F1          b1b1
//   stage 3        F0b0b0b0b0              F1b1b1b1b1
//
// gpipe: all the forwards, then all the backwards (every stage holds M activations)
//   stage 0  F0F1F2F3F4F5F6F7                        b0b0b1b1b2b2b3b3b4b4b5b5b6b6b7b7
//   stage 1    F0F1F2F3F4F5F6F7                    b0b0b1b1b2b2b3b3b4b4b5b5b6b6b7b7
//   stage 2      F0F1F2F3F4F5F6F7                b0b0b1b1b2b2b3b3b4b4b5b5b6b6b7b7
//   stage 3        F0F1F2F3F4F5F6F7b0b0b1b1b2b2b3b3b4b4b5b5b6b6b7b7
//
// 1f1b: S-1-s forwards to fill the pipeline, then one forward, one backward, ..., then the
// remaining backwards (stage s holds at most S-s activations, not M)
//   stage 0  F0F1F2F3      b0b0F4  b1b1F5  b2b2F6  b3b3F7  b4b4    b5b5    b6b6    b7b7
//   stage 1    F0F1F2    b0b0F3b1b1F4  b2b2F5  b3b3F6  b4b4F7  b5b5    b6b6    b7b7
//   stage 2      F0F1  b0b0F2b1b1F3b2b2F4b3b3F5  b4b4F6  b5b5F7  b6b6    b7b7
//   stage 3        F0b0b0F1b1b1F2b2b2F3b3b3F4b4b4F5b5b5F6b6b6F7b7b7
//
// Deadlock: every send is non-blocking (MPI_Isend) and completes later, so a stage never
// waits on a send while its neighbour waits on it; receives block, in schedule order;
// each message is tagged with its microbatch, so a receive can only match its own
// microbatch's message. Every schedule above orders each stage's passes consistently with
// the passes they depend on, so the waits always end, for every S, M and schedule.
//
// The functions below run any work per stage through two callbacks, so train_3d.c runs
// tensor-parallel, FSDP-sharded units in the same schedules.

enum { SCHED_NAIVE, SCHED_GPIPE, SCHED_1F1B };
static const char* const sched_names[] = {"naive", "gpipe", "1f1b"};
// --schedule NAME: NULL, or the error message
static const char* pp_schedule_flag(const char* value, int* sched) {
    for (int k = 0; k < 3; k++)
        if (!strcmp(value, sched_names[k])) {
            *sched = k;
            return NULL;
        }
    snprintf(cli_error, sizeof cli_error, "--schedule must be naive, gpipe or 1f1b, got '%s'", value);
    return cli_error;
}

typedef struct {
    int forward; // 1: F, 0: B
    int mb;
} PpOp;

// This stage's passes, in order: 2M of them.
static int pp_schedule(int sched, int S, int s, int M, PpOp* ops) {
    int n = 0;
    if (sched == SCHED_NAIVE)
        for (int m = 0; m < M; m++) ops[n++] = (PpOp){1, m}, ops[n++] = (PpOp){0, m};
    if (sched == SCHED_GPIPE) {
        for (int m = 0; m < M; m++) ops[n++] = (PpOp){1, m};
        for (int m = 0; m < M; m++) ops[n++] = (PpOp){0, m};
    }
    if (sched == SCHED_1F1B) {
        int warmup = S - 1 - s < M ? S - 1 - s : M, f = 0, b = 0;
        while (f < warmup) ops[n++] = (PpOp){1, f++};
        while (f < M) ops[n++] = (PpOp){1, f++}, ops[n++] = (PpOp){0, b++};
        while (b < M) ops[n++] = (PpOp){0, b++};
    }
    return n;
}

// The most microbatches whose activations a stage holds at once under this schedule.
static int pp_peak(const PpOp* ops, int n) {
    int live = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        live += ops[i].forward ? 1 : -1;
        peak = live > peak ? live : peak;
    }
    return peak;
}

// Splits the units into S contiguous, non-empty stages, balancing the work (a unit's cost:
// the multiply-adds per row of its linear layer, T*E for the embedding): the split whose
// most expensive stage is cheapest. first[s] is stage s's first unit; first[S] = n_units.
static void pp_split(const Config* c, int S, int* first) {
    int n = n_units(c);
    double cost[MAX_LAYERS + 3] = {0}, best[MAX_LAYERS + 3][MAX_LAYERS + 3];
    int cut[MAX_LAYERS + 3][MAX_LAYERS + 3];
    for (int u = 0; u < n; u++) cost[u + 1] = cost[u] + (u == 0 ? (double)c->context * c->emb : (double)linear_in(c, u) * linear_out(c, u));
    // best[k][i]: the cheapest most expensive stage when the first i units form k stages
    for (int i = 0; i <= n; i++)
        for (int k = 0; k <= S; k++) best[k][i] = INFINITY;
    best[0][0] = 0;
    for (int k = 1; k <= S; k++)
        for (int i = k; i <= n; i++)
            for (int j = k - 1; j < i; j++) {
                double worst = best[k - 1][j] > cost[i] - cost[j] ? best[k - 1][j] : cost[i] - cost[j];
                if (worst < best[k][i]) best[k][i] = worst, cut[k][i] = j;
            }
    first[S] = n;
    for (int k = S; k > 0; k--) first[k - 1] = cut[k][first[k]];
}

typedef struct {
    Group* pp;
    int S, s;          // stages, and this rank's stage
    int u_lo, u_hi;    // this stage's units [u_lo, u_hi)
    int M, sched;
    long row0;         // this pipeline's rows of the global batch: [row0, row0 + rows)
    int rows;          //   (all of them here; train_3d.c: its data-parallel share)
    int B;             // rows in the global batch
    int in_width, out_width; // activations received from the stage before, sent to the next
    PpOp* ops;         // [2M] this stage's passes
    int n_ops;
    Acts* slot;        // [n_slots] activations of the microbatches in flight
    int n_slots, peak, live;
    int* slot_of;      // [M] the slot holding each microbatch
    int* slot_free;    // [n_slots]
    MPI_Request* act_req;  // [n_slots] the send of a slot's activations
    MPI_Request* grad_req; // [n_slots] the send of a slot's input gradient
    float** grad_buf;      // [n_slots] that gradient
    Scratch scratch;
    int64_t loss;      // last stage: the exact loss sum of the step's microbatches
    double idle, busy; // seconds waiting for messages, and computing, over the whole run
    // the last step's passes, for --timeline: when each pass's computation started and
    // ended (seconds since the step began); waiting for a message comes before the start
    double* t0;
    double* t1;
    double step_start;
    int op; // the pass being run
    // the work of this stage (train_pp.c: its units; train_3d.c: their tensor-parallel slices)
    void (*forward)(void* ctx, Acts* a, Scratch* sc, int R, long rows_total);
    void (*backward)(void* ctx, Acts* a, Scratch* sc, int R, long batch);
    void* ctx;
} Pp;

// The pipeline streams rows [row0, row0 + rows) of each global batch of B rows.
// `extra_rows`: slot 0 and the scratch also carry forward-only passes of that many rows.
// `width`: the width of each unit's activations on this rank (acts_init), or NULL.
static void pp_init(Pp* p, Group* pp, const Config* c, int S, int M, int sched, long row0, int rows_n, int B,
                    int u_lo, int u_hi, int extra_rows, const int* width) {
    memset(p, 0, sizeof *p);
    p->pp = pp;
    p->S = S;
    p->s = pp->rank;
    p->M = M;
    p->sched = sched;
    p->row0 = row0;
    p->rows = rows_n;
    p->B = B;
    p->u_lo = u_lo;
    p->u_hi = u_hi;
    p->in_width = u_lo > 0 ? (width ? width[u_lo - 1] : unit_width(c, u_lo - 1)) : 0;
    p->out_width = width ? width[u_hi - 1] : unit_width(c, u_hi - 1);
    p->ops = mallocCheck(sizeof(PpOp) * 2 * M);
    p->n_ops = pp_schedule(sched, S, p->s, M, p->ops);
    p->peak = pp_peak(p->ops, p->n_ops);
    p->n_slots = p->peak;
    int rows = (rows_n + M - 1) / M; // the largest microbatch
    p->slot = mallocCheck(sizeof(Acts) * p->n_slots);
    p->slot_of = mallocCheck(sizeof(int) * M);
    p->slot_free = mallocCheck(sizeof(int) * p->n_slots);
    p->act_req = mallocCheck(sizeof(MPI_Request) * p->n_slots);
    p->grad_req = mallocCheck(sizeof(MPI_Request) * p->n_slots);
    p->grad_buf = mallocCheck(sizeof(float*) * p->n_slots);
    for (int k = 0; k < p->n_slots; k++) {
        acts_init(&p->slot[k], c, k == 0 && extra_rows > rows ? extra_rows : rows, u_lo, u_hi, width);
        p->slot_free[k] = 1;
        p->act_req[k] = p->grad_req[k] = MPI_REQUEST_NULL;
        p->grad_buf[k] = mallocCheck((size_t)rows * (p->in_width > 0 ? p->in_width : 1) * sizeof(float));
    }
    scratch_init(&p->scratch, c, extra_rows > rows ? extra_rows : rows);
    p->t0 = callocCheck(2 * M, sizeof(double));
    p->t1 = callocCheck(2 * M, sizeof(double));
}

static void pp_free(Pp* p) {
    for (int k = 0; k < p->n_slots; k++) {
        acts_free(&p->slot[k]);
        free(p->grad_buf[k]);
    }
    free(p->slot), free(p->slot_of), free(p->slot_free), free(p->act_req), free(p->grad_req), free(p->grad_buf);
    free(p->ops), free(p->t0), free(p->t1);
    scratch_free(&p->scratch);
}

// Waits for a message, counting the wait as idle time.
static void pp_wait(Pp* p, MPI_Request* req) {
    double t = now_seconds();
    MPI_Wait(req, MPI_STATUS_IGNORE);
    p->idle += now_seconds() - t;
}
static void pp_recv(Pp* p, float* buf, long count, int from, int tag) {
    MPI_Request req;
    group_irecv(p->pp, buf, count, MPI_FLOAT, from, tag, &req);
    pp_wait(p, &req);
}
static int pp_tag(int mb) { return mb % 32768; } // MPI promises tags up to 32767

// Forward of microbatch m on this stage: its rows, the activations from the stage before,
// this stage's units, the activations to the next stage. `load` fills the rows' tokens and
// targets (every stage draws them itself).
typedef void (*PpLoad)(void* ctx, Acts* a, long first_row, int R);
static void pp_forward_mb(Pp* p, int m, PpLoad load, void* load_ctx) {
    int k = 0;
    while (!p->slot_free[k]) k++; // a free slot exists: the schedule needs at most n_slots
    pp_wait(p, &p->act_req[k]);   // its last activations have left
    p->slot_free[k] = 0;
    p->slot_of[m] = k;
    p->live++;
    Acts* a = &p->slot[k];
    long lo, hi;
    split_range(p->rows, p->M, m, &lo, &hi);
    int R = (int)(hi - lo);
    load(load_ctx, a, p->row0 + lo, R);
    if (p->s > 0) pp_recv(p, a->out[p->u_lo - 1], (long)R * p->in_width, p->s - 1, pp_tag(m));
    double t = now_seconds();
    p->forward(p->ctx, a, &p->scratch, R, p->B);
    p->busy += now_seconds() - t;
    p->t0[p->op] = t - p->step_start, p->t1[p->op] = now_seconds() - p->step_start;
    trace_event("pipeline", t, now_seconds(), 0, "F%d", m);
    if (p->s < p->S - 1)
        group_isend(p->pp, a->out[p->u_hi - 1], (long)R * p->out_width, MPI_FLOAT, p->s + 1, pp_tag(m), &p->act_req[k]);
    else p->loss += a->loss;
}

// Backward of microbatch m: the gradient from the next stage (the last stage starts from
// the loss), this stage's units (adding into the exact gradient sums), the gradient to the
// stage before. Then the microbatch's activations are dropped.
static void pp_backward_mb(Pp* p, int m) {
    int k = p->slot_of[m];
    long lo, hi;
    split_range(p->rows, p->M, m, &lo, &hi);
    int R = (int)(hi - lo);
    if (p->s < p->S - 1) pp_recv(p, p->scratch.dout, (long)R * p->out_width, p->s + 1, pp_tag(m));
    double t = now_seconds();
    p->backward(p->ctx, &p->slot[k], &p->scratch, R, p->B);
    p->busy += now_seconds() - t;
    p->t0[p->op] = t - p->step_start, p->t1[p->op] = now_seconds() - p->step_start;
    trace_event("pipeline", t, now_seconds(), 0, "B%d", m);
    if (p->s > 0) {
        pp_wait(p, &p->grad_req[k]); // the buffer's previous gradient has left
        memcpy(p->grad_buf[k], p->scratch.din, (size_t)R * p->in_width * sizeof(float));
        group_isend(p->pp, p->grad_buf[k], (long)R * p->in_width, MPI_FLOAT, p->s - 1, pp_tag(m), &p->grad_req[k]);
    }
    p->slot_free[k] = 1;
    p->live--;
}

// One training step: this stage's passes in schedule order; returns (on the last stage)
// the exact loss sum over the whole batch.
static int64_t pp_step(Pp* p, PpLoad load, void* load_ctx) {
    p->loss = 0;
    p->step_start = now_seconds();
    for (p->op = 0; p->op < p->n_ops; p->op++) {
        if (p->ops[p->op].forward) pp_forward_mb(p, p->ops[p->op].mb, load, load_ctx);
        else pp_backward_mb(p, p->ops[p->op].mb);
    }
    for (int k = 0; k < p->n_slots; k++) { // every message has left before the optimizer changes anything
        pp_wait(p, &p->act_req[k]);
        pp_wait(p, &p->grad_req[k]);
    }
    return p->loss;
}

// A forward-only pass of R rows through the whole pipeline (validation, sampling): blocking
// messages suffice, they all flow one way. Uses slot 0. Returns the loss sum on the last stage.
static int64_t pp_forward_rows(Pp* p, PpLoad load, void* load_ctx, long first_row, int R, long rows_total, int tag) {
    Acts* a = &p->slot[0];
    pp_wait(p, &p->act_req[0]);
    load(load_ctx, a, first_row, R);
    if (p->s > 0) MPI_Recv(a->out[p->u_lo - 1], R * p->in_width, MPI_FLOAT, p->s - 1, tag, p->pp->comm, MPI_STATUS_IGNORE);
    p->forward(p->ctx, a, &p->scratch, R, rows_total);
    if (p->s < p->S - 1) MPI_Send(a->out[p->u_hi - 1], R * p->out_width, MPI_FLOAT, p->s + 1, tag, p->pp->comm);
    return p->s == p->S - 1 ? a->loss : 0;
}

// The --timeline picture of the last step: one row per stage, time flowing right, each
// column a slice of time. The forward pass of microbatch m is drawn with m's digit (0-9,
// then A-Z), its backward pass with m's letter (a-z), idle time as blanks; a pass shorter
// than a column still gets one (the passes after it shift right to make room). `t0`, `t1` and `ops` of every stage are gathered on rank 0.
static char pp_mark(const PpOp* op) {
    int m = op->mb;
    if (!op->forward) return (char)('a' + m % 26);
    return m < 10 ? (char)('0' + m) : (char)('A' + (m - 10) % 26);
}
static void pp_draw_timeline(int S, int n_ops, const double* t0, const double* t1, const PpOp* ops, int width) {
    double end = 0;
    for (int i = 0; i < S * n_ops; i++) end = t1[i] > end ? t1[i] : end;
    char* row = mallocCheck((size_t)width + 1);
    printf("timeline of the last step, %.3f ms, %.1f us per column: forward of microbatch 0, 1, 2 ... drawn as "
           "0 1 2 ..., its backward as a b c ..., idle time blank\n", end * 1e3, end / width * 1e6);
    for (int s = 0; s < S; s++) {
        memset(row, ' ', (size_t)width);
        row[width] = 0;
        for (int i = 0, next = 0; i < n_ops; i++) { // next: the first column not drawn yet
            int a = (int)(t0[s * n_ops + i] / end * width), b = (int)(t1[s * n_ops + i] / end * width);
            a = a > next ? a : next;
            a = a < width ? a : width - 1;
            for (int x = a; x < b && x < width; x++) row[x] = pp_mark(&ops[s * n_ops + i]);
            row[a] = pp_mark(&ops[s * n_ops + i]);
            next = (b > a + 1 ? b : a + 1);
        }
        printf("  stage %d |%s|\n", s, row);
    }
    free(row);
}

// What a stage sends per step, by the formula: the activations of every row of its
// pipeline to the next stage, their gradients to the stage before (4 B an element), and
// the loss sum from the last stage to the first (8 B).
static double pp_sent_formula(const Pp* p) {
    double sent = 0;
    if (p->s < p->S - 1) sent += 4.0 * p->rows * p->out_width;
    if (p->s > 0) sent += 4.0 * p->rows * p->in_width;
    if (p->s == p->S - 1 && p->S > 1) sent += 8;
    return sent;
}
// The microbatches a stage holds at once, by the schedule's definition: the naive schedule
// one, GPipe all M, 1F1B at most S - s (the warm-up forwards and one more).
static int pp_peak_formula(const Pp* p) {
    if (p->sched == SCHED_NAIVE) return 1;
    if (p->sched == SCHED_GPIPE) return p->M;
    return p->S - p->s < p->M ? p->S - p->s : p->M;
}

// Gathers the last step's passes of every stage to rank 0 of the pipeline, which draws them.
static void pp_timeline(const Pp* p) {
    int n = p->n_ops, root = p->pp->rank == 0;
    double *t0 = root ? mallocCheck(sizeof(double) * p->S * n) : NULL, *t1 = root ? mallocCheck(sizeof(double) * p->S * n) : NULL;
    PpOp* ops = root ? mallocCheck(sizeof(PpOp) * p->S * n) : NULL;
    MPI_Gather(p->t0, n, MPI_DOUBLE, t0, n, MPI_DOUBLE, 0, p->pp->comm);
    MPI_Gather(p->t1, n, MPI_DOUBLE, t1, n, MPI_DOUBLE, 0, p->pp->comm);
    MPI_Gather(p->ops, 2 * n, MPI_INT, ops, 2 * n, MPI_INT, 0, p->pp->comm); // a PpOp is two ints
    if (root) pp_draw_timeline(p->S, n, t0, t1, ops, 100);
    free(t0), free(t1), free(ops);
}

// Where a stage's rows come from: the step's global batch, the validation split, or the
// contexts being sampled. Each stage draws them itself (the first needs the tokens, the last
// the targets), so they never travel between stages.
typedef struct {
    const Dataset* ds;
    uint64_t seed;
    long step;         // training: whose batch
    const int* tokens; // sampling: the contexts [R][T]
    int context;
} PpRows;
static void pp_rows_train(void* ctx, Acts* a, long first_row, int R) {
    PpRows* x = ctx;
    dataset_batch(x->ds, x->seed, x->step, (int)first_row, (int)first_row + R, x->context, a->tokens, a->targets);
}
static void pp_rows_val(void* ctx, Acts* a, long first_row, int R) {
    PpRows* x = ctx;
    dataset_val_rows(x->ds, first_row, R, x->context, a->tokens, a->targets);
}
static void pp_rows_sample(void* ctx, Acts* a, long first_row, int R) {
    PpRows* x = ctx;
    (void)first_row;
    memcpy(a->tokens, x->tokens, (size_t)R * x->context * sizeof(int));
    memset(a->targets, 0, (size_t)R * sizeof(int));
}

#ifndef TRAIN_3D // the rest of this file is the program; train_3d.c uses only the strategy above

#define RUN_LINE "mpirun -n 3 ./train_pp"
#define EVAL_ROWS 256 // validation rows per forward pass (the result does not depend on it)

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    Pp p;
    float* params;  // [n_params] every unit, but only this stage's are used
    int64_t* grads; // [n_params] exact sums, this stage's units
    float* m;       // AdamW state (NULL for SGD)
    float* v;
    Workspace ws;
    Group pp;       // every rank: rank s runs stage s
    int M, sched, timeline; // --microbatches, --schedule, --timeline
    int first[MAX_LAYERS + 3]; // stage s holds units [first[s], first[s+1])
    PpRows rows;    // where each stage's rows come from
} Run;

// This stage's work: its units in order, and back (pp_init's callbacks).
static void stage_forward(void* ctx, Acts* a, Scratch* sc, int R, long rows_total) {
    Run* r = ctx;
    for (int u = r->p.u_lo; u < r->p.u_hi; u++)
        unit_forward(&r->cfg, u, r->params + unit_offset(&r->cfg, u), a, sc, R, rows_total, &r->ws);
}
static void stage_backward(void* ctx, Acts* a, Scratch* sc, int R, long batch) {
    Run* r = ctx;
    for (int u = r->p.u_hi - 1; u >= r->p.u_lo; u--) {
        long off = unit_offset(&r->cfg, u);
        unit_backward(&r->cfg, u, r->params + off, r->grads + off, a, sc, R, batch, &r->ws);
        float* t = sc->dout;
        sc->dout = sc->din;
        sc->din = t;
    }
    float* t = sc->dout; // leave this stage's input gradient in din, as unit_backward does
    sc->dout = sc->din;
    sc->din = t;
}

// ----------------------------------------------------------------------------
// validation and sampling

// Mean loss over the whole validation split, streamed through the pipeline.
static double evaluate(Run* r, const Dataset* ds) {
    long lo = 0, hi = ds->n_val_examples;
    int64_t total = 0;
    for (long first = lo; first < hi; first += EVAL_ROWS) {
        int R = (int)(hi - first < EVAL_ROWS ? hi - first : EVAL_ROWS);
        total += pp_forward_rows(&r->p, pp_rows_val, &r->rows, first, R, ds->n_val_examples, 32767);
    }
    MPI_Bcast(&total, 1, MPI_INT64_T, r->pp.size - 1, r->pp.comm); // the last stage has the loss
    return fix_to(total) / (double)ds->n_val_examples;
}

// probs[R][V] for R contexts: the first stage takes the contexts, the last one's
// probabilities are broadcast so that every rank draws the same next tokens.
static void probs_of(void* ctx, const int* tokens, int R, float* probs) {
    Run* r = ctx;
    r->rows.tokens = tokens;
    pp_forward_rows(&r->p, pp_rows_sample, &r->rows, 0, R, R, 32766);
    if (r->p.s == r->p.S - 1) memcpy(probs, r->p.slot[0].out[r->cfg.layers + 1], (size_t)R * r->cfg.vocab * sizeof(float));
    MPI_Bcast(probs, R * r->cfg.vocab, MPI_FLOAT, r->pp.size - 1, r->pp.comm);
}

// ----------------------------------------------------------------------------
// options of this program

static const CliFlag pp_flags[] = {
    {"microbatches", "M", "microbatches per global batch (default 4)"},
    {"schedule", "NAME", "naive, gpipe or 1f1b (default 1f1b)"},
    {"timeline", NULL, "draw the last step's timeline, one row per stage"},
};
static const char* pp_flag(void* ctx, int index, const char* value) {
    Run* r = ctx;
    if (index == 0) return cli_int("microbatches", value, 1, 65536, &r->M);
    if (index == 1) return pp_schedule_flag(value, &r->sched);
    r->timeline = 1;
    return NULL;
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    Run run = {.pp = group_world("pp"), .M = 4, .sched = SCHED_1F1B};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, pp_flags, 3, pp_flag, &run);
    int S = world_size;
    if (S > o.model.layers + 2)
        dist_exit(2, RUN_LINE, "%d stages but the model has only %d units (the embedding and %d linear layers): "
                  "raise --layers or use fewer ranks", S, o.model.layers + 2, o.model.layers + 1);
    if (o.batch < run.M)
        dist_exit(2, RUN_LINE, "a batch of %d rows cannot be cut into %d microbatches (raise --batch or lower "
                  "--microbatches)", o.batch, run.M);

    // data
    Dataset ds;
    dataset_load(&ds, o.data, o.max_line, o.seed);
    o.model.vocab = ds.vocab;

    // model: this stage's units (the others stay unused), exact gradient sums, optimizer state
    run.cfg = o.model;
    Config* cfg = &run.cfg;
    pp_split(cfg, S, run.first);
    long np = n_params(cfg);
    run.params = callocCheck(np, sizeof(float));
    run.grads = callocCheck(np, sizeof(int64_t));
    run.m = o.opt.adamw ? callocCheck(np, sizeof(float)) : NULL;
    run.v = o.opt.adamw ? callocCheck(np, sizeof(float)) : NULL;
    int u_lo = run.first[run.pp.rank], u_hi = run.first[run.pp.rank + 1];
    long p_lo = unit_offset(cfg, u_lo), p_hi = unit_offset(cfg, u_hi); // this stage's parameters
    long start = 0;
    if (o.load) {
        start = (long)ckpt_check(o.load, cfg, o.opt.adamw, ds.token_char).step;
        ckpt_read(o.load, p_lo, p_hi - p_lo, run.params + p_lo);
        if (o.opt.adamw) {
            ckpt_read(o.load, np + p_lo, p_hi - p_lo, run.m + p_lo);
            ckpt_read(o.load, 2 * np + p_lo, p_hi - p_lo, run.v + p_lo);
        }
    } else {
        for (int u = u_lo; u < u_hi; u++)
            for (long e = 0; e < unit_params(cfg, u); e++) run.params[unit_offset(cfg, u) + e] = unit_init_value(cfg, o.seed, u, e);
    }
    int rows = (o.batch + run.M - 1) / run.M; // the largest microbatch, or a validation or sampling pass
    rows = rows > EVAL_ROWS ? rows : EVAL_ROWS;
    rows = o.samples > rows ? o.samples : rows;
    pp_init(&run.p, &run.pp, cfg, S, run.M, run.sched, 0, o.batch, o.batch, u_lo, u_hi, rows, NULL);
    run.p.forward = stage_forward;
    run.p.backward = stage_backward;
    run.p.ctx = &run;
    run.rows = (PpRows){.ds = &ds, .seed = o.seed, .context = cfg->context};
    workspace_init(&run.ws, rows, max_width(cfg), max_linear_weight(cfg));
    char layout[200];
    snprintf(layout, sizeof layout, "pipeline of %d stages, %d microbatches, %s schedule", S, run.M,
             sched_names[run.sched]);
    if (!o.quiet && world_rank == 0) {
        print_config(&o, &ds, layout);
        for (int s = 0; s < S; s++) {
            printf("  stage %d    rank %d:", s, s);
            for (int u = run.first[s]; u < run.first[s + 1]; u++)
                printf(u == 0 ? " embedding" : (u == cfg->layers + 1 ? " linear %d + loss" : " linear %d"), u);
            printf("\n");
        }
    }

    // training loop
    int B = o.batch;
    Progress progress = progress_start(&o, world_rank == 0);
    for (long step = start + 1; step <= o.steps; step++) {
        step_window_open(o.trace && step == o.steps); // count this step's messages; --trace: the last one
        double t0 = now_seconds();
        run.rows.step = step;
        fix_zero(run.grads + p_lo, p_hi - p_lo);
        int64_t loss = pp_step(&run.p, pp_rows_train, &run.rows);
        if (S > 1) { // the loss lives on the last stage; rank 0 prints it
            if (run.p.s == S - 1) group_send(&run.pp, &loss, 1, MPI_INT64_T, 0, 32765);
            if (run.p.s == 0) group_recv(&run.pp, &loss, 1, MPI_INT64_T, S - 1, 32765);
        }
        float scale = 1.0f;
        if (o.opt.clip > 0) { // the norm over every stage's units
            float mx = grads_maxabs(run.grads + p_lo, p_hi - p_lo, B);
            group_allreduce(&run.pp, &mx, 1, MPI_FLOAT, MPI_MAX);
            int e = norm_exponent(mx);
            int64_t sumsq = grads_sumsq(run.grads + p_lo, p_hi - p_lo, B, e);
            group_allreduce(&run.pp, &sumsq, 1, MPI_INT64_T, MPI_SUM);
            scale = clip_scale(&o.opt, grad_norm_value(sumsq, e));
        }
        optimizer_step(&o.opt, run.params + p_lo, run.grads + p_lo, run.m ? run.m + p_lo : NULL,
                       run.v ? run.v + p_lo : NULL, p_hi - p_lo, grad_factor(B), scale, step);
        double seconds = now_seconds() - t0;
        step_window_close();
        progress_step(&progress, step, fix_to(loss) / B, seconds, progress_due(&progress, step) ? evaluate(&run, &ds) : 0);
    }
    progress_end(&progress);
    double steps_done = progress.steps ? progress.steps : 1;

    // validation, sampling and report
    double val_loss = evaluate(&run, &ds);
    int max_len = ds.max_len;
    int* names = generate_names(o.samples, max_len, cfg, o.seed, probs_of, &run);
    // per stage: bytes sent, memory with the peak activations, bubble (idle / (idle + busy))
    int mb_rows = (o.batch + run.M - 1) / run.M;
    double bpr = acts_bytes_per_row(cfg, u_lo, u_hi, NULL), opt_bytes = o.opt.adamw ? 8.0 : 0.0, P_s = p_hi - p_lo;
    Figures fig = {.sent = run.pp.sent / steps_done, .received = run.pp.received / steps_done,
                   .params = 4.0 * P_s, .grads = 8.0 * P_s, .optim = opt_bytes * P_s,
                   .acts = run.p.peak * (double)mb_rows * bpr,
                   .bubble = run.p.idle / (run.p.idle + run.p.busy > 0 ? run.p.idle + run.p.busy : 1)};
    fig.sent_formula = pp_sent_formula(&run.p) + (o.opt.clip > 0 ? ring_allreduce_bytes(4 + 8, S) : 0);
    fig.mem_formula = (4.0 + 8.0 + opt_bytes) * P_s + pp_peak_formula(&run.p) * (double)mb_rows * bpr;
    Figures* all = callocCheck(world_size, sizeof(Figures));
    figures_gather(&fig, all);
    int peak = run.p.peak, *peaks = world_rank == 0 ? mallocCheck(sizeof(int) * S) : NULL;
    MPI_Gather(&peak, 1, MPI_INT, peaks, 1, MPI_INT, 0, run.pp.comm);
    if (world_rank == 0) {
        report_print(&o, "train_pp.c", layout, val_loss, &progress, names, max_len, &ds, all, world_size,
                     "4 B x B x (the activations out + their gradients in) + 8 B loss",
                     "(4 + 8 + 8 AdamW) B x its parameters + peak x microbatch activations");
        if (!o.quiet) {
            printf("pipeline: bubble (S-1)/(M+S-1) = %.3f in theory; microbatch activations held at the peak, "
                   "stage by stage:", (S - 1.0) / (run.M + S - 1.0));
            for (int q = 0; q < S; q++) printf(" %d", peaks[q]);
            printf(" (%s)\n", run.sched == SCHED_GPIPE  ? "GPipe holds all M"
                              : run.sched == SCHED_1F1B ? "1F1B at most S - s"
                                                        : "one at a time");
        }
    }
    free(all);
    free(peaks);
    if (run.timeline) pp_timeline(&run.p);
    if (o.save) { // each stage sends its units' part of the checkpoint to rank 0, in order
        long lo[64], hi[64];
        for (int s = 0; s < S; s++) lo[s] = unit_offset(cfg, run.first[s]), hi[s] = unit_offset(cfg, run.first[s + 1]);
        for (int part = 0; part < (o.opt.adamw ? 3 : 1); part++) {
            float* x = part == 0 ? run.params : part == 1 ? run.m : run.v;
            if (world_rank == 0)
                for (int s = 1; s < S; s++) MPI_Recv(x + lo[s], (int)(hi[s] - lo[s]), MPI_FLOAT, s, 32764, run.pp.comm, MPI_STATUS_IGNORE);
            else MPI_Send(x + p_lo, (int)(p_hi - p_lo), MPI_FLOAT, 0, 32764, run.pp.comm);
        }
        if (world_rank == 0)
            ckpt_save(o.save, cfg, o.opt.adamw, o.steps > start ? o.steps : start, ds.token_char, run.params, run.m, run.v);
    }

    free(names);
    free(run.params);
    free(run.grads);
    free(run.m);
    free(run.v);
    pp_free(&run.p);
    workspace_free(&run.ws);
    dataset_free(&ds);
    if (o.trace) dist_trace_write(o.trace);
    MPI_Finalize();
    return 0;
}

#endif // TRAIN_3D
