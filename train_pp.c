/*
 * train_pp.c: pipeline parallel. The model's units are split into S contiguous stages, one
 * per rank; each global batch is cut into M microbatches that stream through the stages,
 * activations flowing forward and gradients backward as point-to-point messages, in the
 * order of a schedule: naive, GPipe or 1F1B. It prints exactly what train.c prints for the
 * same flags, whatever S, M and schedule.
 *
 *   rank 0: embedding, linear 1 --activations--> rank 1: linear 2 + loss
 *                               <--gradients----
 *   (each microbatch's rows drawn by every stage itself; only activations and gradients travel)
 *
 * Per stage s and step, batch B, its last unit's output width w_out, its input width w_in:
 *   sent    4 B x B x w_out (activations, to s+1) + 4 B x B x w_in (gradients, to s-1)
 *   memory  (4 + 8, + 8 with AdamW) B x its parameters + peak x a microbatch's activations,
 *           peak = 1 (naive), M (GPipe), min(S - s, M) (1F1B)
 *   bubble  (S-1)/(M+S-1) of each stage's time idle, for GPipe and 1F1B with equal stages
 *
 *   make train_pp && mpirun -n 3 ./train_pp --layers 2 --microbatches 4 --schedule 1f1b
 *   mpirun -n 4 --oversubscribe ./train_pp --layers 3 --microbatches 8 --schedule gpipe --timeline
 *
 * Compare with ./train: the same losses, names and final checkpoint, for every S, M and schedule.
 *
 * Sections: the strategy (schedules as lists of actions; stages; the executor that runs a
 * list); the state of one run; the forward pass and the figures; options; main.
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"

// ----------------------------------------------------------------------------
// the strategy: schedules, a list of actions per stage
//
// The global batch of B rows is cut into M microbatches of contiguous rows (32 rows into 3
// microbatches: 11, 11, 10; split_range), every stage drawing the rows of a microbatch
// itself (the counter-based sampler makes that free), so only activations and gradients
// travel. Each stage adds the gradients of all M microbatches into one exact sum, so the
// gradient is the mean over the whole batch, as in train.c, whatever M.
//
// A schedule is data: for each stage, the ordered list of its actions, F (forward) or B
// (backward) of microbatch m. One executor (pp_step, below) runs any list. Time flows
// right; S = 4 stages, M = 8 microbatches; digits are microbatches, F forward and b
// backward (drawn as taking twice as long):
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

typedef struct {
    char op; // 'F' forward, 'B' backward
    int mb;  // of this microbatch
} Action;

// Each schedule: stage s's actions (2M of them) into `a`; returns their number.
static int schedule_naive(int S, int s, int M, Action* a) {
    (void)S, (void)s;
    int n = 0;
    for (int m = 0; m < M; m++) a[n++] = (Action){'F', m}, a[n++] = (Action){'B', m};
    return n;
}
static int schedule_gpipe(int S, int s, int M, Action* a) {
    (void)S, (void)s;
    int n = 0;
    for (int m = 0; m < M; m++) a[n++] = (Action){'F', m};
    for (int m = 0; m < M; m++) a[n++] = (Action){'B', m};
    return n;
}
static int schedule_1f1b(int S, int s, int M, Action* a) {
    int n = 0, f = 0, b = 0, warmup = S - 1 - s < M ? S - 1 - s : M;
    while (f < warmup) a[n++] = (Action){'F', f++};
    while (f < M) a[n++] = (Action){'F', f++}, a[n++] = (Action){'B', b++};
    while (b < M) a[n++] = (Action){'B', b++};
    return n;
}

typedef int (*ScheduleFn)(int S, int s, int M, Action* a);
enum { SCHEDULE_NAIVE, SCHEDULE_GPIPE, SCHEDULE_1F1B }; // their places in the table
static const struct {
    const char* name;
    ScheduleFn build;
    const char* peak; // the microbatches a stage holds at once, in words
} schedules[] = {
    {"naive", schedule_naive, "one at a time"},
    {"gpipe", schedule_gpipe, "GPipe holds all M"},
    {"1f1b", schedule_1f1b, "1F1B at most S - s"},
};
#define N_SCHEDULES ((int)(sizeof schedules / sizeof schedules[0]))
// --schedule NAME: NULL, or the error message
static const char* pp_schedule_flag(const char* value, int* sched) {
    for (int k = 0; k < N_SCHEDULES; k++)
        if (!strcmp(value, schedules[k].name)) {
            *sched = k;
            return NULL;
        }
    snprintf(cli_error, sizeof cli_error, "--schedule must be naive, gpipe or 1f1b, got '%s'", value);
    return cli_error;
}

// The most microbatches whose activations a stage holds at once under a list of actions,
// and the same by the schedule's definition: naive one, GPipe all M, 1F1B at most S - s.
static int pp_peak(const Action* a, int n) {
    int live = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        live += a[i].op == 'F' ? 1 : -1;
        peak = live > peak ? live : peak;
    }
    return peak;
}
static int pp_peak_formula(int sched, int S, int s, int M) {
    if (sched == SCHEDULE_NAIVE) return 1;
    if (sched == SCHEDULE_GPIPE) return M;
    return S - s < M ? S - s : M;
}

// ----------------------------------------------------------------------------
// the strategy: stages

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
// The units of stage s, as the configuration table prints them.
static void pp_print_units(const Config* c, const int* first, int s) {
    for (int u = first[s]; u < first[s + 1]; u++) printf(" %s", unit_name(c, u));
}

// What a stage computes on a microbatch (train_pp.c: its units; train_3d.c: their
// tensor-parallel slices, FSDP-sharded). Backward reads the gradient of the stage's output
// from s->dout and leaves the gradient of its input in s->dout.
typedef struct {
    void (*forward)(void* ctx, Acts* a, Scratch* s, int R, long rows_total);
    void (*backward)(void* ctx, Acts* a, Scratch* s, int R, long batch);
    void* ctx;
} StageWork;

typedef struct {
    Group* pp;
    int S, s;          // stages, and this rank's stage
    int u_lo, u_hi;    // this stage's units [u_lo, u_hi)
    int M, sched;
    int rows, B;       // rows this pipeline streams per step (of a global batch of B)
    int context;       // T, for drawing rows
    int in_width, out_width; // activations received from the stage before, sent to the next
    StageWork work;
    Action* actions;   // [2M] this stage's list, from its schedule
    int n_actions;
    Acts* slot;        // [peak] activations of the microbatches in flight
    int peak;
    int* slot_of;      // [M] the slot holding each microbatch
    int* slot_free;    // [peak]
    MPI_Request* act_req;  // [peak] the send of a slot's activations
    MPI_Request* grad_req; // [peak] the send of a slot's input gradient
    float** grad_buf;      // [peak] that gradient
    Scratch scratch;
    int64_t loss;      // last stage: the exact loss sum of the step's microbatches
    double idle, busy; // seconds waiting for messages, and computing, over the whole run
    double* t0;        // the last step's actions, for --timeline: when each one's computation
    double* t1;        //   started and ended, seconds since the step began
    double step_start;
} Pp;

// The pipeline streams `rows` rows per step, of a global batch of B. `extra_rows`: slot 0
// and the scratch also carry forward-only passes of that many rows (validation, sampling).
// `width`: the width of each unit's activations on this rank (acts_init), or NULL.
static void pp_init(Pp* p, Group* pp, const Config* c, int M, int sched, int rows, int B, int u_lo, int u_hi,
                    int extra_rows, const int* width, StageWork work) {
    *p = (Pp){.pp = pp, .S = pp->size, .s = pp->rank, .u_lo = u_lo, .u_hi = u_hi, .M = M, .sched = sched,
              .rows = rows, .B = B, .context = c->context, .work = work};
    p->in_width = u_lo > 0 ? (width ? width[u_lo - 1] : unit_width(c, u_lo - 1)) : 0;
    p->out_width = width ? width[u_hi - 1] : unit_width(c, u_hi - 1);
    p->actions = mallocCheck(sizeof(Action) * 2 * M);
    p->n_actions = schedules[sched].build(p->S, p->s, M, p->actions);
    p->peak = pp_peak(p->actions, p->n_actions);
    int mb_rows = (rows + M - 1) / M; // the largest microbatch
    p->slot = mallocCheck(sizeof(Acts) * p->peak);
    p->slot_of = mallocCheck(sizeof(int) * M);
    p->slot_free = mallocCheck(sizeof(int) * p->peak);
    p->act_req = mallocCheck(sizeof(MPI_Request) * p->peak);
    p->grad_req = mallocCheck(sizeof(MPI_Request) * p->peak);
    p->grad_buf = mallocCheck(sizeof(float*) * p->peak);
    for (int k = 0; k < p->peak; k++) {
        acts_init(&p->slot[k], c, k == 0 && extra_rows > mb_rows ? extra_rows : mb_rows, u_lo, u_hi, width);
        p->slot_free[k] = 1;
        p->act_req[k] = p->grad_req[k] = MPI_REQUEST_NULL;
        p->grad_buf[k] = mallocCheck((size_t)mb_rows * (p->in_width > 0 ? p->in_width : 1) * sizeof(float));
    }
    scratch_init(&p->scratch, c, extra_rows > mb_rows ? extra_rows : mb_rows);
    p->t0 = callocCheck(2 * M, sizeof(double));
    p->t1 = callocCheck(2 * M, sizeof(double));
}

static void pp_free(Pp* p) {
    for (int k = 0; k < p->peak; k++) {
        acts_free(&p->slot[k]);
        free(p->grad_buf[k]);
    }
    free(p->slot), free(p->slot_of), free(p->slot_free), free(p->act_req), free(p->grad_req), free(p->grad_buf);
    free(p->actions), free(p->t0), free(p->t1);
    scratch_free(&p->scratch);
}

// ----------------------------------------------------------------------------
// the strategy: the executor, which runs any stage's list of actions
//
// Deadlock: every send is non-blocking (MPI_Isend) and completes later, so a stage never
// waits on a send while its neighbour waits on it; receives block, in list order; each
// message is tagged with its microbatch, so a receive can only match its own microbatch's
// message. Every schedule orders each stage's actions consistently with the actions they
// depend on, so the waits always end, for every S, M and schedule.

static int pp_tag(int mb) { return TAG_MICROBATCH + mb % (32768 - TAG_MICROBATCH); }

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
// Action i computed from t to now: busy time, the timeline, the trace.
static void pp_computed(Pp* p, int i, double t) {
    double now = now_seconds();
    p->busy += now - t;
    p->t0[i] = t - p->step_start, p->t1[i] = now - p->step_start;
    trace_event("pipeline", t, now, 0, "%c%d", p->actions[i].op, p->actions[i].mb);
}
static int pp_mb_rows(const Pp* p, int m, long* lo) {
    long hi;
    split_range(p->rows, p->M, m, lo, &hi);
    return (int)(hi - *lo);
}

// F of microbatch m: a free slot for its activations, its rows, the activations from the
// stage before, this stage's work, the activations to the next stage.
static void pp_forward(Pp* p, int i, int m, const Rows* rows) {
    int k = 0;
    while (!p->slot_free[k]) k++; // a free slot exists: the list needs at most `peak`
    pp_wait(p, &p->act_req[k]);   // its last activations have left
    p->slot_free[k] = 0;
    p->slot_of[m] = k;
    Acts* a = &p->slot[k];
    long lo;
    int R = pp_mb_rows(p, m, &lo);
    rows_load(rows, lo, R, p->context, a->tokens, a->targets);
    if (p->s > 0) pp_recv(p, a->out[p->u_lo - 1], (long)R * p->in_width, p->s - 1, pp_tag(m));
    double t = now_seconds();
    p->work.forward(p->work.ctx, a, &p->scratch, R, p->B);
    pp_computed(p, i, t);
    if (p->s < p->S - 1)
        group_isend(p->pp, a->out[p->u_hi - 1], (long)R * p->out_width, MPI_FLOAT, p->s + 1, pp_tag(m), &p->act_req[k]);
    else p->loss += a->loss;
}

// B of microbatch m: the gradient from the next stage (the last stage starts from the
// loss), this stage's work (adding into the exact gradient sums), the gradient to the stage
// before. Then the microbatch's activations are dropped.
static void pp_backward(Pp* p, int i, int m) {
    int k = p->slot_of[m];
    long lo;
    int R = pp_mb_rows(p, m, &lo);
    if (p->s < p->S - 1) pp_recv(p, p->scratch.dout, (long)R * p->out_width, p->s + 1, pp_tag(m));
    double t = now_seconds();
    p->work.backward(p->work.ctx, &p->slot[k], &p->scratch, R, p->B);
    pp_computed(p, i, t);
    if (p->s > 0) {
        pp_wait(p, &p->grad_req[k]); // the buffer's previous gradient has left
        memcpy(p->grad_buf[k], p->scratch.dout, (size_t)R * p->in_width * sizeof(float));
        group_isend(p->pp, p->grad_buf[k], (long)R * p->in_width, MPI_FLOAT, p->s - 1, pp_tag(m), &p->grad_req[k]);
    }
    p->slot_free[k] = 1;
}

// One training step: this stage's actions in order, on the step's `rows`; returns (on the
// last stage) the exact loss sum over the pipeline's rows.
static int64_t pp_step(Pp* p, const Rows* rows) {
    p->loss = 0;
    p->step_start = now_seconds();
    for (int i = 0; i < p->n_actions; i++) {
        if (p->actions[i].op == 'F') pp_forward(p, i, p->actions[i].mb, rows);
        else pp_backward(p, i, p->actions[i].mb);
    }
    for (int k = 0; k < p->peak; k++) { // every message has left before the optimizer changes anything
        pp_wait(p, &p->act_req[k]);
        pp_wait(p, &p->grad_req[k]);
    }
    return p->loss;
}

// A forward-only pass of R rows through the whole pipeline (validation, sampling): blocking
// messages suffice, they all flow one way. Uses slot 0. Returns the loss sum on the last
// stage.
static int64_t pp_forward_rows(Pp* p, const Rows* rows, long first, int R, long rows_total, int tag) {
    Acts* a = &p->slot[0];
    pp_wait(p, &p->act_req[0]);
    rows_load(rows, first, R, p->context, a->tokens, a->targets);
    if (p->s > 0) MPI_Recv(a->out[p->u_lo - 1], R * p->in_width, MPI_FLOAT, p->s - 1, tag, p->pp->comm, MPI_STATUS_IGNORE);
    p->work.forward(p->work.ctx, a, &p->scratch, R, rows_total);
    if (p->s < p->S - 1) MPI_Send(a->out[p->u_hi - 1], R * p->out_width, MPI_FLOAT, p->s + 1, tag, p->pp->comm);
    return p->s == p->S - 1 ? a->loss : 0;
}

// --timeline: the last step's actions of every stage, gathered to rank 0 of the pipeline
// and drawn there: F of microbatch m with m's digit (0-9, then A-Z), B with m's letter.
static void pp_timeline(const Pp* p) {
    int n = p->n_actions, root = p->pp->rank == 0;
    char* mark = mallocCheck((size_t)n);
    for (int i = 0; i < n; i++) {
        int m = p->actions[i].mb;
        mark[i] = p->actions[i].op == 'B' ? (char)('a' + m % 26) : m < 10 ? (char)('0' + m) : (char)('A' + (m - 10) % 26);
    }
    double *t0 = root ? mallocCheck(sizeof(double) * p->S * n) : NULL, *t1 = root ? mallocCheck(sizeof(double) * p->S * n) : NULL;
    char* marks = root ? mallocCheck((size_t)p->S * n) : NULL;
    MPI_Gather(p->t0, n, MPI_DOUBLE, t0, n, MPI_DOUBLE, 0, p->pp->comm);
    MPI_Gather(p->t1, n, MPI_DOUBLE, t1, n, MPI_DOUBLE, 0, p->pp->comm);
    MPI_Gather(mark, n, MPI_CHAR, marks, n, MPI_CHAR, 0, p->pp->comm);
    if (root)
        draw_timeline(p->S, n, t0, t1, marks, 100, "forward of microbatch 0, 1, 2 ... drawn as 0 1 2 ..., its backward as a b c ...");
    free(mark), free(t0), free(t1), free(marks);
}

// The step's loss lives on the last stage: send it to the first, whose rank prints.
static void pp_loss_to_first(Pp* p, int64_t* loss) {
    if (p->S == 1) return;
    if (p->s == p->S - 1) group_send(p->pp, loss, 1, MPI_INT64_T, 0, TAG_LOSS);
    if (p->s == 0) group_recv(p->pp, loss, 1, MPI_INT64_T, p->S - 1, TAG_LOSS);
}

// The bubble this stage measured: the fraction of its time spent waiting for messages.
static double pp_bubble(const Pp* p) { return p->idle / (p->idle + p->busy > 0 ? p->idle + p->busy : 1); }

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

// The end of the report (rank 0 of the pipeline): the bubble in theory, and the peak
// activations every stage held.
static void pp_print_peaks(const Pp* p) {
    int *peaks = p->pp->rank == 0 ? mallocCheck(sizeof(int) * p->S) : NULL;
    MPI_Gather(&p->peak, 1, MPI_INT, peaks, 1, MPI_INT, 0, p->pp->comm);
    if (p->pp->rank == 0) {
        printf("pipeline: bubble (S-1)/(M+S-1) = %.3f in theory; microbatch activations held at the peak, "
               "stage by stage:", (p->S - 1.0) / (p->M + p->S - 1.0));
        for (int q = 0; q < p->S; q++) printf(" %d", peaks[q]);
        printf(" (%s)\n", schedules[p->sched].peak);
    }
    free(peaks);
}

#ifndef TRAIN_3D // the rest of this file is the program; train_3d.c uses only the strategy above

#define RUN_LINE "mpirun -n 3 ./train_pp"

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    Dataset ds;     // the data
    Pp p;
    long p_lo, p_hi; // this stage's parameters: [p_lo, p_hi) of train.c's layout
    State st;        // this stage's units: parameters, exact gradient sums, AdamW state
    Workspace ws;
    Group pp;        // every rank: rank s runs stage s
    int M, sched, timeline; // --microbatches, --schedule, --timeline
    int first[MAX_LAYERS + 3]; // stage s holds units [first[s], first[s+1])
} Run;

static void run_free(Run* r) {
    dataset_free(&r->ds), state_free(&r->st), pp_free(&r->p), workspace_free(&r->ws);
}

// ----------------------------------------------------------------------------
// the stage's work, and the forward pass through the whole pipeline

// This stage's units in order, and back (the pipeline's StageWork).
static void stage_forward(void* ctx, Acts* a, Scratch* sc, int R, long rows_total) {
    Run* r = ctx;
    for (int u = r->p.u_lo; u < r->p.u_hi; u++)
        unit_forward(&r->cfg, u, r->st.params + unit_offset(&r->cfg, u) - r->p_lo, a, sc, R, rows_total, &r->ws);
}
static void stage_backward(void* ctx, Acts* a, Scratch* sc, int R, long batch) {
    Run* r = ctx;
    for (int u = r->p.u_hi - 1; u >= r->p.u_lo; u--) {
        long off = unit_offset(&r->cfg, u) - r->p_lo;
        unit_backward(&r->cfg, u, r->st.params + off, r->st.grads + off, a, sc, R, batch, &r->ws);
        scratch_step_down(sc);
    }
}

// Validation and sampling stream through the pipeline; the last stage's probabilities are
// broadcast, so that every rank draws the same next tokens.
static int64_t forward(void* ctx, const Rows* rows, long first, int R, long rows_total, float* probs) {
    Run* r = ctx;
    int64_t loss = pp_forward_rows(&r->p, rows, first, R, rows_total, probs ? TAG_SAMPLE : TAG_EVAL);
    if (probs) {
        if (r->p.s == r->p.S - 1) memcpy(probs, r->p.slot[0].out[r->cfg.layers + 1], (size_t)R * r->cfg.vocab * sizeof(float));
        MPI_Bcast(probs, R * r->cfg.vocab, MPI_FLOAT, r->p.S - 1, r->pp.comm);
    }
    return loss;
}

// Mean loss over the whole validation split; the last stage has it.
static double validation_loss(void* ctx) {
    Run* r = ctx;
    int64_t total = evaluate(forward, r, &r->ds, 1, 0);
    MPI_Bcast(&total, 1, MPI_INT64_T, r->p.S - 1, r->pp.comm);
    return mean_loss(total, &r->ds);
}

// The formulas of figures(), in words, for the report.
static const char sent_words[] = "4 B x B x (the activations out + their gradients in) + 8 B loss";
static const char mem_words[] = "(4 + 8 + 8 AdamW) B x its parameters + peak x microbatch activations";

// What this stage sent and holds, each beside its formula, and the bubble it measured.
static Figures figures(const Run* r, const Progress* pr, const Optimizer* opt, int B) {
    const Config* c = &r->cfg;
    long np = r->st.n;
    int mb_rows = (B + r->M - 1) / r->M;
    double acts_row = acts_bytes_per_row(c, r->p.u_lo, r->p.u_hi, NULL), opt_bytes = opt->adamw ? 8.0 : 0.0;
    Figures f = {.sent = per_step(pr, r->pp.sent), .received = per_step(pr, r->pp.received), .params = 4.0 * np,
                 .grads = 8.0 * np, .optim = opt_bytes * np, .acts = r->p.peak * (double)mb_rows * acts_row,
                 .bubble = pp_bubble(&r->p)};
    f.sent_formula = pp_sent_formula(&r->p) + (opt->clip > 0 ? ring_allreduce_bytes(4 + 8, r->p.S) : 0);
    f.mem_formula = (4.0 + 8.0 + opt_bytes) * np + pp_peak_formula(r->sched, r->p.S, r->p.s, r->M) * (double)mb_rows * acts_row;
    return f;
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
    Run run = {.pp = group_world("pp"), .M = 4, .sched = SCHEDULE_1F1B};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, pp_flags, 3, pp_flag, &run);
    int S = world_size;
    if (S > o.model.layers + 2)
        dist_exit(2, RUN_LINE, "%d stages but the model has only %d units (the embedding and %d linear layers): "
                  "raise --layers or use fewer ranks", S, o.model.layers + 2, o.model.layers + 1);
    if (o.batch < run.M)
        dist_exit(2, RUN_LINE, "a batch of %d rows cannot be cut into %d microbatches (raise --batch or lower "
                  "--microbatches)", o.batch, run.M);

    // data
    load_data(&run.ds, &o, &run.cfg);

    // model: this stage's units, their exact gradient sums and optimizer state
    Config* cfg = &run.cfg;
    pp_split(cfg, S, run.first);
    int u_lo = run.first[run.pp.rank], u_hi = run.first[run.pp.rank + 1];
    run.p_lo = unit_offset(cfg, u_lo), run.p_hi = unit_offset(cfg, u_hi);
    long np = run.p_hi - run.p_lo;
    run.st = state_alloc(np, o.opt.adamw);
    Holding mine = holding_units(cfg, &run.st, u_lo, u_hi, run.p_lo);
    long start = holding_load(&mine, o.load, cfg, o.opt.adamw, o.seed, run.ds.token_char);
    int rows = pass_rows(&o, (o.batch + run.M - 1) / run.M); // a microbatch, or a validation or sampling pass
    pp_init(&run.p, &run.pp, cfg, run.M, run.sched, o.batch, o.batch, u_lo, u_hi, rows, NULL,
            (StageWork){stage_forward, stage_backward, &run});
    workspace_init(&run.ws, rows, max_width(cfg), max_linear_weight(cfg));
    char layout[200];
    snprintf(layout, sizeof layout, "pipeline of %d stages, %d microbatches, %s schedule", S, run.M,
             schedules[run.sched].name);
    if (!o.quiet && world_rank == 0) {
        print_config(&o, &run.ds, layout);
        for (int s = 0; s < S; s++) printf("  stage %d    rank %d:", s, s), pp_print_units(cfg, run.first, s), printf("\n");
    }

    // training loop
    int B = o.batch;
    Progress progress = progress_start(&o, world_rank == 0);
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        Rows batch = training_rows(&run.ds, o.seed, step, 0);
        fix_zero(run.st.grads, np);
        int64_t loss = pp_step(&run.p, &batch); // the schedule: forwards and backwards of every microbatch
        pp_loss_to_first(&run.p, &loss);
        float scale = clip_factor(&o.opt, &(GradSpan){run.st.grads, np}, 1, B, group_norm, &run.pp); // over every stage
        optimizer_step(&o.opt, run.st.params, run.st.grads, run.st.m, run.st.v, np, grad_factor(B), scale, step);
        step_end(&progress, step, fix_to(loss) / B, validation_loss, &run);
    }
    if (o.save) dist_ckpt_save(o.save, &mine, cfg, o.opt.adamw, start + progress.steps, run.ds.token_char);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, &o.opt, B);
    Report rep = {"train_pp.c", layout, sent_words, mem_words};
    free(dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run));
    if (!o.quiet) pp_print_peaks(&run.p);
    if (run.timeline) pp_timeline(&run.p);
    run_free(&run);
    MPI_Finalize();
    return 0;
}

#endif // TRAIN_3D
