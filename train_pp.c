/*
 * train_pp.c: pipeline parallel. The model's units are cut into chunks, one or more a rank,
 * and each global batch into M microbatches that stream through them: activations flow
 * forward and gradients backward as point-to-point messages, in the order of a schedule,
 * which is for each rank a list of actions (schedules.h: naive, GPipe, 1F1B, interleaved
 * 1F1B, the zero-bubble ZB-H1 and ZB-V, DualPipeV). It prints exactly what train.c prints
 * for the same flags, whatever the ranks, M and schedule.
 *
 *   rank 0: embedding, linear 1 --activations--> rank 1: linear 2 + loss
 *                               <--gradients----
 *   1F1B, 4 microbatches:  rank 0  F0 F1 B0 F2 B1 F3 B2 B3     (F: forward, B: backward,
 *                          rank 1  F0 B0 F1 B1 F2 B2 F3 B3      of the microbatch numbered)
 *   (every rank draws each microbatch's rows itself: only activations and gradients travel)
 *
 * Per rank and step, for each of its chunks whose neighbour chunk is on another rank:
 *   sent    4 bytes x the batch's rows x (its output width: activations forward, + its input
 *           width: gradients backward, which chunk 0 has none of), + 8: the loss to rank 0
 *   memory  4 + 8 (+ 8 with AdamW) bytes a parameter of its chunks, and the activations of
 *           its microbatches in flight at the peak of its list, each chunk's count times what
 *           a microbatch holds there (1F1B: min(S-r, M) microbatches on rank r)
 *   bubble  the fraction of the step a rank waits, averaged over the ranks: (S-1)/(M+S-1)
 *           for GPipe and 1F1B on S ranks; every schedule's in schedules.h
 *
 *   make train_pp && mpirun -n 2 ./train_pp --microbatches 4 --schedule 1f1b      # the picture above
 *   mpirun -n 4 --oversubscribe ./train_pp --layers 6 --microbatches 8 --schedule interleaved --virtual 2
 *   mpirun -n 4 --oversubscribe ./train_pp --layers 6 --microbatches 8 --schedule dualpipev --timeline
 *
 * Sections: the first read (what a rank holds; messages; a chunk's work; the executor, which
 * runs a list of actions: receive, compute, send; one training step). After its end, the
 * chapters: the zero-bubble actions W and F&B; building and checking every schedule's lists;
 * forward-only passes; the report (timeline, bubble, formulas). Then what only serves: the
 * split into chunks, flags, and the program's plumbing and main.
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"
#include "schedules.h"

// ----------------------------------------------------------------------------
// the strategy: what a rank holds
//
// The global batch is cut into M microbatches of contiguous rows (32 rows into 3: 11, 11,
// 10; split_range), every rank drawing a microbatch's rows itself (the counter-based
// sampler makes that free). Each rank adds the gradients of all M microbatches into one
// exact sum, so the gradient is the mean over the whole batch, as in train.c.

// A chunk's work, units [lo, hi) on a microbatch of R rows: this program's stage_forward and
// stage_backward (just before the executor), or train_3d.c's tensor-parallel ones. forward
// finds the chunk's input in a->out[lo-1] (chunk 0: the tokens, in a->tokens). backward finds the gradient of the chunk's output
// in s->dout and leaves the gradient of its input there. The stash and backward_weight serve
// the zero-bubble schedules, in their chapter.
typedef struct {
    void (*forward)(void* ctx, int lo, int hi, Acts* a, Scratch* s, int R, long rows_total);
    void (*backward)(void* ctx, int lo, int hi, Acts* a, Scratch* s, float* const* stash, int R, long batch);
    void (*backward_weight)(void* ctx, int lo, int hi, const Acts* a, float* const* stash, int R, long batch);
    void* ctx;
} StageWork;

// What train_3d.c plugs into a pipeline; train_pp.c plugs in {1, 0, NULL, its own work}.
typedef struct {
    int replicas, replica;  // the data-parallel replicas, each streaming a share of every microbatch
    const UnitSizes* sizes; // what each unit holds a row on this rank (train_3d.c's slices), or NULL
    StageWork work;
} PpPlug;

// The activations of microbatch mb through chunk `chunk`, held from its F to its B.
typedef struct {
    int chunk, mb; // mb -1: a free slot
    Acts acts;
    float* stash[MAX_LAYERS + 2]; // the zero-bubble chapter's: what a unit's I keeps for its W
} Held;

// This rank's part of the pipeline: the first read's fields, then (after `loss`) the chapters'.
typedef struct {
    Group* group;     // the pipeline's ranks
    int S, rank;      // how many, and this one
    int sched, V, M;  // the schedule, chunks a rank, microbatches
    int n_chunks;     // S V: the model's chunks
    int first[MAX_LAYERS + 3]; // chunk k holds units [first[k], first[k+1])
    long batch;       // rows of the global batch: losses and gradients are means over it
    int mb_rows;      // the largest microbatch (train_3d.c: the largest share of one)
    const Config* c;
    PpPlug plug;
    Action* actions;  // this rank's list of actions, in the order it runs them
    int n_actions;
    Held* held;       // [room] the activations in flight; room: the most the list holds at once
    int room;
    float* outbox;    // [V][M][2] entries of msg_floats: a copy of each message this step sends
    MPI_Request* sent; // [V][M][2]: each entry's request
    long msg_floats;
    Scratch scratch;  // a pass's gradients between units, and its exact partial sums (model.h)
    int64_t loss;     // the rank of the last chunk: the exact loss sum of the step's microbatches
    // the chapters after the first read
    int chunk[4];     // this rank's chunks, its v-th being chunk[v]
    int rows;         // rows this pipeline streams a step (train_3d.c: its replica's shares)
    Action** lists;   // every rank's list, counts[r] actions long: the checker's input
    int* counts;
    int split;        // a zero-bubble list, which runs I and W apart: I stashes what W needs
    float* recompute_room; // --recompute: one block's room that every slot shares (one backward at a time)
    Acts pass[4];     // forward-only passes (validation, sampling), one per chunk
    double idle, busy, step_start; // the report: seconds waiting and computing over the run; the step's start
    struct Timed* timed; // the last step's computations (the report's chapter)
    int n_timed;
} Pp;

// Floats a row of unit u's output (of the embedding's, for u = 0), on this rank.
static int pp_width(const Pp* p, int u) { return unit_out(p->c, p->plug.sizes, u); }
// The rank that holds chunk k (schedules.h), -1 past either end of the model.
static int pp_rank_of(const Pp* p, int k) {
    int v;
    return chunk_owner(p->sched, p->S, p->V, k, &v);
}
// Microbatch m: its first row of the batch, and (returned) how many. With one replica these
// are train.c's split_range(B, M, m); train_3d.c's replicas share each microbatch out the
// same way (model.h's microbatch_rows).
static int pp_mb_rows(const Pp* p, int m, long* row) {
    return microbatch_rows(p->batch, p->M, m, p->plug.replicas, p->plug.replica, row);
}

// A slot for the activations of microbatch m through chunk k, taken at its F and given back
// at its B (pp_drop), so that a rank holds only what its list has in flight. There are room
// slots, the most the list holds at once (pp_init counts them), so one is always free.
static Held* pp_hold(Pp* p, int k, int m) {
    Held* h = p->held;
    while (h < p->held + p->room && h->mb >= 0) h++;
    if (h == p->held + p->room) fatal("internal: more activations in flight than the list's peak");
    int lo = p->first[k], hi = p->first[k + 1];
    // Room for the chunk's input, its units' outputs and what they keep for backward. With --recompute,
    // a block recomputes into the rank's one recompute_room, lent to every slot: one backward at a time.
    acts_init_lent(&h->acts, p->c, p->mb_rows, lo, hi, p->plug.sizes, p->recompute_room);
    for (int u = lo; u < hi && p->split; u++) // a zero-bubble list: room for what I keeps for W
        h->stash[u] = mallocCheck(sizeof(float) * p->mb_rows * unit_stash_at(p->c, p->plug.sizes, u));
    h->chunk = k, h->mb = m;
    return h;
}
static Held* pp_held(Pp* p, int k, int m) {
    for (int j = 0; j < p->room; j++)
        if (p->held[j].chunk == k && p->held[j].mb == m) return &p->held[j];
    fatal("internal: no activations of microbatch %d in chunk %d", m, k);
}
static void pp_drop(Held* h) {
    acts_free(&h->acts);
    for (int u = 0; u < MAX_LAYERS + 2; u++) free(h->stash[u]), h->stash[u] = NULL;
    h->mb = -1;
}

// ----------------------------------------------------------------------------
// the strategy: messages
//
// Every send is non-blocking and every receive blocks, both in the list's order. So a rank
// never waits on a send while its neighbour waits on it, and the checker has shown that no
// receive waits for a message that cannot come. Each message is copied into its own entry of
// the outbox, which nothing writes again until the step ends by waiting for every send.
// Between two chunks of the same rank (where zbv and dualpipev turn round, or interleaved on
// one rank) nothing is sent: the receiving chunk copies the message from the outbox.
//
// A message's tag is the receiving chunk's stream; its outbox entry is the sending chunk's (its
// v, the microbatch, what it sends: with M = 4, a rank's second chunk sends microbatch 2's
// activations from entry (1 * 4 + 2) * 2 + 0 = 12). An entry never sent holds MPI_REQUEST_NULL
// (pp_init sets each; MPI_Wait sets a sent one back), so waiting for it returns at once.

enum { ACTIVATIONS, GRADIENT };

// Chunk k's stream of inputs (ACTIVATIONS) or of its output's gradients (GRADIENT). A tag needs
// no microbatch: each chunk runs its forwards, and its backwards, in microbatch order (the checker
// checks it), and MPI keeps the messages of one tag between two ranks in order. Two tags a chunk,
// of at most 64 ranks x 4: from TAG_MICROBATCH (1024) below 1536, under every MPI's 32767.
static int pp_tag(int k, int what) { return TAG_MICROBATCH + 2 * k + what; }

// The outbox entry of what chunk k (this rank's v-th) sends for microbatch m: its output
// (ACTIVATIONS) or its input's gradient (GRADIENT).
static long pp_outbox_entry(const Pp* p, int k, int m, int what) {
    int v;
    chunk_owner(p->sched, p->S, p->V, k, &v);
    return ((long)v * p->M + m) * 2 + what;
}
// Waits for n requests, counting the wait as idle time.
static void pp_wait(Pp* p, int n, MPI_Request* req) {
    double t = now_seconds();
    waiting_for = "a pipeline message";
    for (int i = 0; i < n; i++) MPI_Wait(&req[i], MPI_STATUS_IGNORE); // (gcc warns on MPICH's MPI_STATUSES_IGNORE)
    waiting_for = NULL;
    p->idle += now_seconds() - t;
}

// Sends n floats from chunk k (this rank's) for microbatch m: its output to chunk k+1
// (ACTIVATIONS), or its input's gradient to chunk k-1 (GRADIENT).
static void pp_send(Pp* p, int what, int k, int m, const float* data, long n) {
    long entry = pp_outbox_entry(p, k, m, what);
    float* copy = p->outbox + entry * p->msg_floats;
    memcpy(copy, data, n * sizeof(float));
    int to_chunk = what == ACTIVATIONS ? k + 1 : k - 1, to = pp_rank_of(p, to_chunk);
    if (to != p->rank) group_isend(p->group, copy, n, MPI_FLOAT, to, pp_tag(to_chunk, what), &p->sent[entry]);
}
// Receives into buf the n floats chunk k gets for microbatch m: its input from chunk k-1
// (ACTIVATIONS), or its output's gradient from chunk k+1 (GRADIENT).
static void pp_receive(Pp* p, int what, int k, int m, float* buf, long n) {
    int from_chunk = what == ACTIVATIONS ? k - 1 : k + 1, from = pp_rank_of(p, from_chunk);
    if (from == p->rank) { // a chunk of this rank sent it: its copy in the outbox
        memcpy(buf, p->outbox + pp_outbox_entry(p, from_chunk, m, what) * p->msg_floats, n * sizeof(float));
        return;
    }
    MPI_Request req;
    group_irecv(p->group, buf, n, MPI_FLOAT, from, pp_tag(k, what), &req);
    pp_wait(p, 1, &req);
}

#ifndef TRAIN_3D // the program train_pp; train_3d.c has its own Run and chunk's work

#define RUN_LINE "mpirun -n 2 ./train_pp"

// ----------------------------------------------------------------------------
// the strategy: a chunk's work, in this program

// This program's state: the parameters of its chunks' units (st, unit u's at off[u]), the pipeline, the flags.
typedef struct {
    Config cfg;
    Dataset ds;     // the data
    Pp p;
    long off[MAX_LAYERS + 2]; // unit u's parameters in this rank's state (its chunks' units, in model order)
    State st;       // this rank's units: parameters, exact gradient sums, AdamW state
    Workspace ws;
    Group pp;       // every rank
    int M, sched, V, timeline; // --microbatches, --schedule, --virtual, --timeline
    int first[MAX_LAYERS + 3]; // chunk k holds units [first[k], first[k+1])
    Holding mine;   // what this rank holds of the model, for checkpoints
} Run;

// Units [lo, hi) forward, as model.h's model_forward runs them all.
static void stage_forward(void* ctx, int lo, int hi, Acts* a, Scratch* sc, int R, long rows_total) {
    Run* r = ctx;
    for (int u = lo; u < hi; u++) unit_forward(&r->cfg, u, r->st.params + r->off[u], a, sc, R, rows_total, &r->ws);
}
// I, the zero-bubble chapter's: unit u's input half alone, keeping in stash what its W needs.
static void stage_backward_input(Run* r, int u, Acts* a, Scratch* sc, float* stash, int R);
// Units hi - 1 down to lo backward, as model.h's model_backward runs them all. s->dout starts
// as the gradient of the chunk's output, received (the last chunk's head makes its own from
// the loss). Each unit leaves its input's gradient in s->din, and scratch_step_down makes it
// the next unit's s->dout, so the chunk's input gradient ends in s->dout.
static void stage_backward(void* ctx, int lo, int hi, Acts* a, Scratch* sc, float* const* stash, int R, long batch) {
    Run* r = ctx;
    for (int u = hi - 1; u >= lo; u--) {
        const float* w = r->st.params + r->off[u];
        unit_recompute(&r->cfg, u, w, a, sc, R, &r->ws); // --recompute: what the forward did not keep
        if (stash) stage_backward_input(r, u, a, sc, stash[u], R);
        else unit_backward(&r->cfg, u, w, r->st.grads + r->off[u], a, sc, R, batch, &r->ws); // B: both halves
        scratch_step_down(sc);
    }
}

#endif // TRAIN_3D

// ----------------------------------------------------------------------------
// the strategy: the executor, which runs any schedule's list of actions

// The report's clock: a computation ran from t to now (its chapter).
static void pp_timed(Pp* p, char op, int k, int m, double t);

// F of microbatch m through chunk k: its input from chunk k-1, forward (stage_forward, above),
// its output to chunk k+1 (the last chunk adds its loss instead). Every chunk loads the rows
// itself, so none travel: the first embeds their tokens, the last scores their targets.
static void pp_forward(Pp* p, const Rows* rows, int k, int m) {
    int lo = p->first[k], hi = p->first[k + 1];
    long row;
    int R = pp_mb_rows(p, m, &row);
    Held* h = pp_hold(p, k, m);
    rows_load(rows, row, R, p->c->context, h->acts.tokens, h->acts.targets);
    if (k > 0) pp_receive(p, ACTIVATIONS, k, m, h->acts.out[lo - 1], (long)R * pp_width(p, lo - 1));
    double t = now_seconds();
    p->plug.work.forward(p->plug.work.ctx, lo, hi, &h->acts, &p->scratch, R, p->batch);
    pp_timed(p, 'F', k, m, t);
    if (k < p->n_chunks - 1) pp_send(p, ACTIVATIONS, k, m, h->acts.out[hi - 1], (long)R * pp_width(p, hi - 1));
    else p->loss += h->acts.loss;
}
// B of microbatch m through chunk k: the gradient of its output from chunk k+1, backward
// (stage_backward, above), the gradient of its input to chunk k-1; then its activations go.
// A zero-bubble list's I (its chapter) runs here too, and keeps them for its W.
static void pp_backward(Pp* p, char op, int k, int m) {
    int lo = p->first[k], hi = p->first[k + 1];
    long row;
    int R = pp_mb_rows(p, m, &row);
    Held* h = pp_held(p, k, m);
    if (k < p->n_chunks - 1) pp_receive(p, GRADIENT, k, m, p->scratch.dout, (long)R * pp_width(p, hi - 1));
    double t = now_seconds();
    p->plug.work.backward(p->plug.work.ctx, lo, hi, &h->acts, &p->scratch, op == 'I' ? h->stash : NULL, R, p->batch);
    pp_timed(p, op, k, m, t);
    if (k > 0) pp_send(p, GRADIENT, k, m, p->scratch.dout, (long)R * pp_width(p, lo - 1));
    if (op == 'B') pp_drop(h);
}
// W and F&B: the zero-bubble schedules' actions (the chapter after the first read).
static void pp_zero_bubble(Pp* p, const Rows* rows, const Action* a);

// One training step: this rank's actions, in its list's order. Returns, on the rank of the
// last chunk, the exact loss sum over the pipeline's rows. For 1F1B on S = 2 ranks and M = 4
// microbatches (schedules.h's schedule_1f1b: rank r runs min(S-1-r, M) forwards to fill the
// pipeline, then a forward and a backward in turn, then the backwards left), the lists
// are these, each action written chunk.microbatch (tools/schedules 1f1b 2 1 4; pp_init,
// after the first read, builds every schedule's lists and checks them):
//   rank 0: F0.0 F0.1 B0.0 F0.2 B0.1 F0.3 B0.2 B0.3
//   rank 1: F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F1.3 B1.3
static int64_t pp_step(Pp* p, const Rows* rows) {
    p->loss = 0, p->n_timed = 0, p->step_start = now_seconds();
    for (int i = 0; i < p->n_actions; i++) {
        const Action* a = &p->actions[i];
        if (a->op == 'F') pp_forward(p, rows, a->chunk, a->mb);
        if (a->op == 'B' || a->op == 'I') pp_backward(p, a->op, a->chunk, a->mb);
        if (a->op == 'W' || a->op == '&') pp_zero_bubble(p, rows, a);
    }
    pp_wait(p, 2 * p->V * p->M, p->sent); // every outbox entry, sent or not: the next step writes them again
    return p->loss;
}

// The rank that holds the last chunk: it has the loss and the probabilities.
static int pp_last_rank(const Pp* p) { return pp_rank_of(p, p->n_chunks - 1); }
// The step's loss lives on the rank of the last chunk: send it to rank 0, which prints.
static void pp_loss_to_first(Pp* p, int64_t* loss) {
    int last = pp_last_rank(p);
    if (last == 0) return;
    if (p->rank == last) group_send(p->group, loss, 1, MPI_INT64_T, 0, TAG_LOSS);
    if (p->rank == 0) group_recv(p->group, loss, 1, MPI_INT64_T, last, TAG_LOSS);
}

#ifndef TRAIN_3D

// ----------------------------------------------------------------------------
// one training step of this program

// One step: the gradients of every microbatch summed by the schedule, the loss sent to rank
// 0, and the optimizer step on this rank's chunks. Returns, on rank 0, the batch's mean loss.
static double train_step(Run* r, const Options* o, long step) {
    long np = r->st.n;
    Rows batch = training_rows(&r->ds, o->seed, step, 0);
    fix_zero(r->st.grads, np);
    workspace_keep_weights(&r->ws, 1); // fixed until the optimizer step: each packed once (kernels.h)
    int64_t loss = pp_step(&r->p, &batch); // the schedule: every action of every microbatch
    workspace_keep_weights(&r->ws, 0);
    pp_loss_to_first(&r->p, &loss);
    long n = dataset_batch_targets(&r->ds, o->seed, step, o->batch); // the loss is the mean over n targets
    // --clip: the norm over every rank's gradients, as two all-reduces (dist.h's group_norm):
    // the largest, then the exact sum of squares, so the norm is train.c's to the bit.
    float scale = clip_factor(&o->opt, &(GradSpan){r->st.grads, np}, 1, n, group_norm, &r->pp);
    optimizer_step(&o->opt, r->st.params, r->st.grads, r->st.m, r->st.v, np, grad_factor(n), scale, step);
    return fix_to(loss) / n;
}

#endif // TRAIN_3D

// ---------------------------------------------------------------------------- first read ends here

// ----------------------------------------------------------------------------
// the zero-bubble actions: W, and DualPipeV's F&B
//
// A zero-bubble schedule (zb1, zbv, dualpipev) splits a backward into I and W, so that the
// gradient the chunk before waits for leaves before the weight gradients are computed; W
// then runs where 1F1B would idle. I is pp_backward given the slot's stash (pp_hold makes
// room for it in such lists), where the chunk's work keeps what each unit's W reads.

// W of microbatch m through chunk k: the weight gradients, from what its I stashed.
static void pp_weight(Pp* p, int k, int m) {
    long row;
    int R = pp_mb_rows(p, m, &row);
    Held* h = pp_held(p, k, m);
    double t = now_seconds();
    p->plug.work.backward_weight(p->plug.work.ctx, p->first[k], p->first[k + 1], &h->acts, h->stash, R, p->batch);
    pp_timed(p, 'W', k, m, t);
    pp_drop(h);
}
// W, or an F&B (DualPipeV): here its F, then its B. Overlapped, as DualPipe runs them, a rank
// would post both receives, run the two at once (two streams, or their layers interleaved)
// so that each one's communication (DeepSeek-V3's experts' all-to-alls) travels while the
// other computes, then send both: the same bits.
static void pp_zero_bubble(Pp* p, const Rows* rows, const Action* a) {
    if (a->op == 'W') {
        pp_weight(p, a->chunk, a->mb);
        return;
    }
    pp_forward(p, rows, a->chunk, a->mb);
    pp_backward(p, 'B', a->b_chunk, a->b_mb);
}

#ifndef TRAIN_3D
// This program's I and W of a unit (stage_backward runs I where B would be): the input half,
// its weight half's input kept in the stash; later the weight half, from the stash.
static void stage_backward_input(Run* r, int u, Acts* a, Scratch* sc, float* stash, int R) {
    unit_backward_input(&r->cfg, u, r->st.params + r->off[u], a, sc, R, &r->ws);
    memcpy(stash, unit_stash(&r->cfg, u, sc), (size_t)R * unit_stash_width(&r->cfg, u) * sizeof(float));
}
static void stage_backward_weight(void* ctx, int lo, int hi, const Acts* a, float* const* stash, int R, long batch) {
    Run* r = ctx;
    for (int u = lo; u < hi; u++) unit_backward_weight(&r->cfg, u, r->st.grads + r->off[u], a, stash[u], R, batch, &r->ws);
}
#endif

// ----------------------------------------------------------------------------
// every schedule's lists, checked, and the buffers they need
//
// pp_init builds every rank's list for any schedule of schedules.h and runs the checker on
// them: lists it passes cannot deadlock, and each chunk's messages come in microbatch order
// (pp_tag). Then it sizes this rank's buffers to its list.

// One computation of the last step, for the report (--timeline, the bubble), and the clock
// that records it: busy time, the timeline's entry and the trace's event.
struct Timed {
    char op;
    int mb;
    double t0, t1; // seconds since the step began
};
typedef struct Timed Timed;
static void pp_timed(Pp* p, char op, int k, int m, double t) {
    double now = now_seconds();
    p->busy += now - t;
    p->timed[p->n_timed++] = (Timed){op, m, t - p->step_start, now - p->step_start};
    trace_event("pipeline", t, now, 0, "%c%d chunk %d", op, m, k);
}

// The most (chunk, microbatch) activations a list holds at once: each from its F to its B
// or W (an F&B's F holds its own before its B lets one go).
static int pp_list_peak(const Action* a, int n) {
    int live = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        live += a[i].op == 'F' || a[i].op == '&';
        peak = live > peak ? live : peak;
        live -= a[i].op == 'B' || a[i].op == 'W' || a[i].op == '&';
    }
    return peak;
}

// The pipeline a program asks for: the schedule, chunks a rank, microbatches, the cut into
// chunks, the global batch's rows, and the rows of a forward-only pass (validation, sampling).
typedef struct {
    int sched, V, M;
    const int* first;
    long batch;
    int pass_capacity;
} PpPlan;

// This rank's part of the pipeline of `plan` over the ranks of `group`.
static void pp_init(Pp* p, Group* group, const Config* c, PpPlan plan, PpPlug plug) {
    int sched = plan.sched, V = plan.V, M = plan.M, pass_capacity = plan.pass_capacity;
    const int* first = plan.first;
    const UnitSizes* sizes = plug.sizes;
    *p = (Pp){.group = group, .S = group->size, .rank = group->rank, .sched = sched, .V = V, .M = M,
              .n_chunks = group->size * V, .batch = plan.batch, .c = c, .plug = plug};
    long row;
    for (int m = 0; m < M; m++) {
        int R = pp_mb_rows(p, m, &row);
        p->rows += R, p->mb_rows = R > p->mb_rows ? R : p->mb_rows;
    }
    memcpy(p->first, first, sizeof(int) * (p->n_chunks + 1));
    // the schedule, built once: every rank's list, checked
    p->lists = mallocCheck(sizeof(Action*) * p->S), p->counts = mallocCheck(sizeof(int) * p->S);
    for (int r = 0; r < p->S; r++) p->lists[r] = mallocCheck(sizeof(Action) * 3 * V * M);
    schedule_build(sched, p->S, V, M, p->lists, p->counts);
    Check check = schedule_check(sched, p->S, V, M, p->lists, p->counts, (Durations){1, 1, 1, 0, 0}, NULL, NULL, 0);
    if (!check.ok) fatal("internal: the %s schedule's lists fail the checker: %s", schedule_names[sched], check.why);
    p->actions = p->lists[p->rank], p->n_actions = p->counts[p->rank];
    for (int i = 0; i < p->n_actions; i++) p->split |= p->actions[i].op == 'W';
    // a slot for each activations in flight, as many as the list holds at once
    p->room = pp_list_peak(p->actions, p->n_actions);
    p->held = callocCheck(p->room > 0 ? p->room : 1, sizeof(Held));
    for (int j = 0; j < p->room; j++) p->held[j].mb = -1;
    long recompute_floats = 0;
    for (int v = 0; v < V; v++) {
        int k = chunk_global(sched, p->S, p->rank, v);
        long f = acts_room_per_row(c, first[k], first[k + 1], sizes);
        recompute_floats = f > recompute_floats ? f : recompute_floats;
    }
    p->recompute_room = recompute_floats ? mallocCheck(sizeof(float) * p->mb_rows * recompute_floats) : NULL;
    // an outbox entry for each message of a step, as wide as the widest a chunk of this rank sends
    int widest = 1;
    for (int v = 0; v < V; v++) {
        int k = p->chunk[v] = chunk_global(sched, p->S, p->rank, v), lo = first[k], hi = first[k + 1];
        widest = pp_width(p, hi - 1) > widest ? pp_width(p, hi - 1) : widest;
        if (lo > 0) widest = pp_width(p, lo - 1) > widest ? pp_width(p, lo - 1) : widest;
        acts_init(&p->pass[v], c, pass_capacity > p->mb_rows ? pass_capacity : p->mb_rows, lo, hi, sizes);
    }
    p->msg_floats = (long)p->mb_rows * widest;
    p->outbox = mallocCheck(sizeof(float) * 2 * V * M * p->msg_floats);
    p->sent = mallocCheck(sizeof(MPI_Request) * 2 * V * M);
    for (int j = 0; j < 2 * V * M; j++) p->sent[j] = MPI_REQUEST_NULL;
    scratch_init(&p->scratch, c, pass_capacity > p->mb_rows ? pass_capacity : p->mb_rows);
    p->timed = mallocCheck(sizeof(Timed) * 2 * (p->n_actions > 0 ? p->n_actions : 1));
}

static void pp_free(Pp* p) {
    for (int v = 0; v < p->V; v++) acts_free(&p->pass[v]);
    for (int r = 0; r < p->S; r++) free(p->lists[r]);
    free(p->lists), free(p->counts), free(p->held), free(p->outbox), free(p->sent), free(p->timed);
    free(p->recompute_room);
    scratch_free(&p->scratch);
}

// ----------------------------------------------------------------------------
// forward-only passes: validation and sampling
//
// A pass that only goes forward needs no schedule: it streams through the chunks in model order.

// A forward-only pass of R rows through the whole pipeline (validation, sampling), chunk by
// chunk in model order: blocking messages suffice, they all flow one way. Each chunk has
// its own activations for these passes. Returns the loss sum on the rank of the last
// chunk, whose pass activations hold the probabilities (pp_last_acts).
static int64_t pp_forward_rows(Pp* p, const Rows* rows, long first_row, int R, long rows_total, int tag) {
    int64_t loss = 0;
    for (int k = 0; k < p->n_chunks; k++) {
        int v, w, lo = p->first[k], hi = p->first[k + 1];
        if (chunk_owner(p->sched, p->S, p->V, k, &v) != p->rank) continue;
        Acts* a = &p->pass[v];
        rows_load(rows, first_row, R, p->c->context, a->tokens, a->targets);
        int prev = chunk_owner(p->sched, p->S, p->V, k - 1, &w), next = pp_rank_of(p, k + 1);
        if (k > 0 && prev == p->rank) // chunk k-1 is this rank's too, its w-th
            memcpy(a->out[lo - 1], p->pass[w].out[lo - 1], (size_t)R * pp_width(p, lo - 1) * sizeof(float));
        else if (k > 0)
            MPI_Recv(a->out[lo - 1], R * pp_width(p, lo - 1), MPI_FLOAT, prev, tag, p->group->comm, MPI_STATUS_IGNORE);
        p->plug.work.forward(p->plug.work.ctx, lo, hi, a, &p->scratch, R, rows_total);
        if (next >= 0 && next != p->rank) MPI_Send(a->out[hi - 1], R * pp_width(p, hi - 1), MPI_FLOAT, next, tag, p->group->comm);
        if (k == p->n_chunks - 1) loss = a->loss;
    }
    return loss;
}
// The last chunk is the last of its rank's, in every schedule.
static Acts* pp_last_acts(Pp* p) { return &p->pass[p->V - 1]; }

// ----------------------------------------------------------------------------
// the report: the timeline, the bubble, the formulas beside what was measured
//
// The report shows what the schedule cost: each rank's idle time, and the memory and
// traffic that the formulas predict beside what was measured.

// --timeline: the last step's computations on every rank, gathered to rank 0 of the
// pipeline and drawn there: F of microbatch m with m's digit (0-9, then more digits from
// A), B or its input half I with m's letter (a-z), W with m's letter in capitals.
static void pp_timeline(const Pp* p) {
    int n = p->n_timed;
    char* mark = callocCheck((size_t)(n > 0 ? n : 1), 1);
    double *t0 = callocCheck((size_t)(n > 0 ? n : 1), sizeof(double)), *t1 = callocCheck((size_t)(n > 0 ? n : 1), sizeof(double));
    for (int i = 0; i < n; i++) {
        int m = p->timed[i].mb;
        char op = p->timed[i].op;
        mark[i] = op == 'F' ? (char)('0' + m % 10) : op == 'W' ? (char)('A' + m % 26) : (char)('a' + m % 26);
        t0[i] = p->timed[i].t0, t1[i] = p->timed[i].t1;
    }
    dist_draw_timeline(p->group->comm, n, t0, t1, mark, "stage", 100, "forward of microbatch 0, 1, 2 ... drawn as "
                       "0 1 2 ... (its last digit), its backward (B, or the input half I) as a b c ..., the weight half W as A B C ...");
    free(mark), free(t0), free(t1);
}

// The bubble this rank measured: the fraction of its time spent waiting for messages.
static double pp_bubble(const Pp* p) { return p->idle / (p->idle + p->busy > 0 ? p->idle + p->busy : 1); }

// What a rank sends per step, by the formula: for each of its chunks, the activations of
// every row of its pipeline to the next chunk and their gradients to the chunk before (4
// bytes an element), where that chunk is on another rank; and the loss sum to rank 0 (8).
static double pp_sent_formula(const Pp* p) {
    double sent = 0;
    for (int v = 0; v < p->V; v++) {
        int k = p->chunk[v], next = pp_rank_of(p, k + 1), prev = pp_rank_of(p, k - 1);
        if (next >= 0 && next != p->rank) sent += 4.0 * p->rows * pp_width(p, p->first[k + 1] - 1);
        if (prev >= 0 && prev != p->rank) sent += 4.0 * p->rows * pp_width(p, p->first[k] - 1);
    }
    if (p->rank == pp_last_rank(p) && p->rank != 0) sent += 8;
    return sent;
}
// The bytes of one microbatch of mb_rows through chunk k (with what W needs, for I/W lists),
// but the one block's room of --recompute, which all share (pp_room_bytes).
static double pp_chunk_bytes(const Pp* p, const Config* c, const UnitSizes* sizes, int mb_rows, int k) {
    double row = acts_bytes_per_row(c, p->first[k], p->first[k + 1], sizes) -
                 4.0 * acts_room_per_row(c, p->first[k], p->first[k + 1], sizes);
    for (int u = p->first[k]; u < p->first[k + 1] && p->split; u++) row += 4.0 * unit_stash_at(c, sizes, u);
    return (double)mb_rows * row;
}
static double pp_room_bytes(const Pp* p, const Config* c, const UnitSizes* sizes, int mb_rows) {
    long most = 0;
    for (int v = 0; v < p->V; v++) {
        long f = acts_room_per_row(c, p->first[p->chunk[v]], p->first[p->chunk[v] + 1], sizes);
        most = f > most ? f : most;
    }
    return 4.0 * mb_rows * most;
}
// The activations this rank holds at its peak, in bytes: its list walked as the executor
// runs it (each chunk's microbatch held from its F to its B or W), the most at any time.
static double pp_acts_bytes(const Pp* p, const Config* c, const UnitSizes* sizes, int mb_rows) {
    double held = pp_room_bytes(p, c, sizes, mb_rows), most = held;
    for (int i = 0; i < p->n_actions; i++) {
        const Action* a = &p->actions[i];
        if (a->op == 'F' || a->op == '&') held += pp_chunk_bytes(p, c, sizes, mb_rows, a->chunk);
        most = held > most ? held : most;
        if (a->op == 'B' || a->op == 'W') held -= pp_chunk_bytes(p, c, sizes, mb_rows, a->chunk);
        if (a->op == '&') held -= pp_chunk_bytes(p, c, sizes, mb_rows, a->b_chunk);
    }
    return most;
}
// The same predicted from the schedule: schedules.h's list for this rank, built anew, with
// what a microbatch holds in each of its chunks, by its units' sizes. Not the closed form's
// count times a microbatch through the stage: the chunks hold different amounts, and their
// sum peaks where the heavier ones have the most in flight.
static double pp_acts_formula(const Pp* p, const Config* c, const UnitSizes* sizes, int mb_rows) {
    double held[4];
    for (int v = 0; v < p->V; v++) held[v] = pp_chunk_bytes(p, c, sizes, mb_rows, p->chunk[v]);
    return schedule_peak_held(p->sched, p->S, p->V, p->M, p->rank, held) + pp_room_bytes(p, c, sizes, mb_rows);
}

// The end of the report (rank 0 of the pipeline): the bubble every rank measured beside the
// checker's for the same lists with the durations measured here, and the closed form's;
// the activations every rank's list holds at its peak beside the formula.
static void pp_print_theory(const Pp* p) {
    // the time of each kind of computation in the last step, summed over the ranks
    double sum[8] = {0}, tot[8]; // F, B, I, W: seconds, then how many
    for (int j = 0; j < p->n_timed; j++) {
        static const char ops[] = "FBIW";
        int kind = (int)(strchr(ops, p->timed[j].op) - ops);
        sum[kind] += p->timed[j].t1 - p->timed[j].t0, sum[4 + kind] += 1;
    }
    MPI_Reduce(sum, tot, 8, MPI_DOUBLE, MPI_SUM, 0, p->group->comm);
    double mine[2] = {pp_bubble(p), (double)p->room / p->V}, *all = p->rank == 0 ? mallocCheck(sizeof mine * p->S) : NULL;
    MPI_Gather(mine, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, 0, p->group->comm);
    if (p->rank == 0) {
        double mean[4];
        for (int q = 0; q < 4; q++) mean[q] = tot[4 + q] > 0 ? tot[q] / tot[4 + q] : 0;
        Durations d = {mean[0], tot[6] > 0 ? mean[2] : mean[1] / 2, tot[7] > 0 ? mean[3] : mean[1] / 2, 0, 0}; // B: half I, half W
        Check c = schedule_check(p->sched, p->S, p->V, p->M, p->lists, p->counts, d, NULL, NULL, 0);
        double closed = schedule_bubble_formula(p->sched, p->S, p->V, p->M, d);
        printf("pipeline, %s: on average", schedule_names[p->sched]);
        for (int q = 0; q < 4; q++)
            if (tot[4 + q] > 0) printf(" %c %.3f ms", "FBIW"[q], mean[q] * 1e3);
        printf("; per rank: bubble measured (checker's, same durations), peak activations in microbatches (formula)\n");
        for (int r = 0; r < p->S; r++) {
            double pf = schedule_peak_formula(p->sched, p->S, p->V, p->M, r);
            printf("  rank %d: bubble %.3f (%.3f), peak %.2f", r, all[2 * r], c.ok ? c.bubble[r] : -1, all[2 * r + 1]);
            if (pf >= 0) printf(" (%.2f)", pf);
            printf("\n");
        }
        printf("  all ranks: bubble %.3f of S x the step by the checker", c.bubble_total);
        if (closed >= 0) printf(", %.3f by the closed form", closed);
        printf("\n");
    }
    free(all);
}

// ----------------------------------------------------------------------------
// what only serves: the cut into chunks, the flags

// Splits the units into n contiguous, non-empty chunks, balancing the work (model.h's
// unit_cost, multiply-adds a row): the split whose most expensive chunk is cheapest.
// first[k] is chunk k's first unit; first[n] = n_units.
static void pp_split(const Config* c, int n_chunks, int* first) {
    int n = n_units(c);
    double cost[MAX_LAYERS + 3] = {0}, best[MAX_LAYERS + 3][MAX_LAYERS + 3];
    int cut[MAX_LAYERS + 3][MAX_LAYERS + 3];
    for (int u = 0; u < n; u++) cost[u + 1] = cost[u] + unit_cost(c, u);
    // best[k][i]: the cheapest most expensive chunk when the first i units form k chunks
    for (int i = 0; i <= n; i++)
        for (int k = 0; k <= n_chunks; k++) best[k][i] = INFINITY;
    best[0][0] = 0;
    for (int k = 1; k <= n_chunks; k++)
        for (int i = k; i <= n; i++)
            for (int j = k - 1; j < i; j++) {
                double worst = best[k - 1][j] > cost[i] - cost[j] ? best[k - 1][j] : cost[i] - cost[j];
                if (worst < best[k][i]) best[k][i] = worst, cut[k][i] = j;
            }
    first[n_chunks] = n;
    for (int k = n_chunks; k > 0; k--) first[k - 1] = cut[k][first[k]];
}
// The units of chunk k, as the configuration table prints them.
static void pp_print_units(const Config* c, const int* first, int k) {
    for (int u = first[k]; u < first[k + 1]; u++) printf(" %s", unit_name(c, u));
}

// The flags of a pipeline, in train_pp.c and in train_3d.c.
#define PIPELINE_FLAGS                                                                                          \
    {"microbatches", "M", "microbatches per global batch, each shared by the data-parallel replicas in train_3d (default 4)"},     \
    {"schedule", "NAME", "naive, gpipe, 1f1b, interleaved, zb1, zbv or dualpipev (default 1f1b)"},            \
    {"virtual", "V", "chunks per pipeline rank for --schedule interleaved, 1 to 4 (default 2)"},             \
    {"timeline", NULL, "draw the last step's timeline, one row per pipeline rank (train_3d.c: tensor rank 0, data replica 0)"}

#ifndef TRAIN_3D // the rest of this file is the program train_pp

static void run_free(Run* r) {
    dataset_free(&r->ds), state_free(&r->st), pp_free(&r->p), workspace_free(&r->ws);
}

// ----------------------------------------------------------------------------
// validation, sampling and the report's figures

// Validation and sampling stream through the pipeline; the last chunk's probabilities are
// broadcast, so that every rank draws the same next tokens.
static int64_t forward(void* ctx, const Rows* rows, long first, int R, long rows_total, float* probs) {
    Run* r = ctx;
    int64_t loss = pp_forward_rows(&r->p, rows, first, R, rows_total, probs ? TAG_SAMPLE : TAG_EVAL);
    if (probs) {
        if (r->p.rank == pp_last_rank(&r->p)) model_probs(&r->cfg, rows, pp_last_acts(&r->p)->out[r->cfg.layers + 1], R, probs);
        MPI_Bcast(probs, R * r->cfg.vocab, MPI_FLOAT, pp_last_rank(&r->p), r->pp.comm);
    }
    return loss;
}

// Mean loss over the whole validation split; the rank of the last chunk has it.
static double validation_loss(void* ctx) {
    Run* r = ctx;
    workspace_keep_weights(&r->ws, 1); // the validation split streams through in many passes
    int64_t total = evaluate(forward, r, &r->ds, 1, 0);
    workspace_keep_weights(&r->ws, 0);
    MPI_Bcast(&total, 1, MPI_INT64_T, pp_last_rank(&r->p), r->pp.comm);
    return mean_loss(total, &r->ds);
}

// The formulas of figures(), in words, for the report.
static const char sent_words[] = "4 bytes x rows x (activations out + gradients in, of each chunk whose neighbour is on another rank) + 8 loss";
static const char mem_words[] = "(4 + 8 + 8 AdamW) bytes x its parameters + at the peak of its list, each chunk's microbatches in flight x their activations (+ one block's room with --recompute)";

// What this rank sent and holds, each beside its formula, and the bubble it measured.
static Figures figures(const Run* r, const Progress* pr, const Optimizer* opt, int batch) {
    const Config* c = &r->cfg;
    long np = r->st.n;
    int mb_rows = (batch + r->M - 1) / r->M;
    double opt_bytes = opt->adamw ? 8.0 : 0.0, acts = pp_acts_bytes(&r->p, c, NULL, mb_rows);
    Figures f = {.sent = per_step(pr, r->pp.sent), .received = per_step(pr, r->pp.received), .params = 4.0 * np,
                 .grads = 8.0 * np, .optim = opt_bytes * np, .acts = acts, .bubble = pp_bubble(&r->p)};
    f.sent_formula = pp_sent_formula(&r->p) + (opt->clip > 0 ? ring_allreduce_bytes(4 + 8, r->p.S) : 0);
    f.mem_formula = (4.0 + 8.0 + opt_bytes) * np + pp_acts_formula(&r->p, c, NULL, mb_rows);
    return f;
}

// ----------------------------------------------------------------------------
// options of this program

static const CliFlag pp_flags[] = {PIPELINE_FLAGS};
static const char* pp_flag(void* ctx, int index, const char* value) {
    Run* r = ctx;
    if (index == 0) return cli_int("microbatches", value, 1, 65536, &r->M);
    if (index == 1) return schedule_parse(value, &r->sched, cli_error, sizeof cli_error);
    if (index == 2) return cli_int("virtual", value, 1, 4, &r->V);
    r->timeline = 1;
    return NULL;
}

// Refuses a pipeline the model or the schedule cannot take, saying why (every rank alike).
// Refuses a pipeline the model or the schedule cannot take, saying why (every rank alike).
static void check_layout(const Options* o, const Run* r, int S) {
    int sched = r->sched, V = r->V > 0 ? r->V : 2, M = r->M, virtual_given = r->V > 0;
    const char* run_line = RUN_LINE;
    int chunks = S * schedule_chunks(sched, V), units = o->model.layers + 2;
    char err[300];
    if (virtual_given && sched != SCHEDULE_INTERLEAVED) dist_exit(2, run_line, "--virtual applies to --schedule interleaved only");
    if (chunks > units && chunks == S)
        dist_exit(2, run_line, "%d stages but the model has only %d units (%s): raise --layers or use fewer ranks", S,
                  units, units_in_words(&o->model));
    if (chunks > units)
        dist_exit(2, run_line, "%d stages x %d chunks = %d chunks but the model has only %d units (%s): raise --layers "
                  "or use fewer ranks or chunks", S, chunks / S, chunks, units, units_in_words(&o->model));
    if (o->batch < M)
        dist_exit(2, run_line, "a batch of %d rows cannot be cut into %d microbatches (raise --batch or lower "
                  "--microbatches)", o->batch, M);
    if (schedule_rule(sched, S, schedule_chunks(sched, V), M, err, sizeof err)) dist_exit(2, run_line, "%s", err);
    if (o->model.recompute == RECOMPUTE_FULL && schedule_splits_iw(sched))
        dist_exit(2, run_line, "--recompute full with --schedule %s: full recomputation keeps one block's activations "
                  "at a time, and a schedule that runs a block's weight half later (zb1, zbv, dualpipev) needs them "
                  "then; use --recompute selective, or another schedule", schedule_names[sched]);
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    Run run = {.pp = group_world("pp"), .M = 4, .sched = SCHEDULE_1F1B, .V = 0};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, pp_flags, 4, pp_flag, &run);
    o.microbatches = run.M; // what a checkpoint records
    dist_dense_only(&o, RUN_LINE);
    int S = world_size, V = schedule_chunks(run.sched, run.V > 0 ? run.V : 2);
    check_layout(&o, &run, S);

    // data
    load_data(&run.ds, &o, &run.cfg);

    // model: this rank's chunks of units, their exact gradient sums and optimizer state
    Config* cfg = &run.cfg;
    pp_split(cfg, S * V, run.first);
    int capacity = pass_rows(&o, (o.batch + run.M - 1) / run.M); // a microbatch, or a validation or sampling pass
    PpPlan plan = {.sched = run.sched, .V = V, .M = run.M, .first = run.first, .batch = o.batch, .pass_capacity = capacity};
    pp_init(&run.p, &run.pp, cfg, plan, (PpPlug){1, 0, NULL, {stage_forward, stage_backward, stage_backward_weight, &run}});
    long np = 0;
    for (int v = 0; v < V; v++)
        for (int u = run.first[run.p.chunk[v]]; u < run.first[run.p.chunk[v] + 1]; u++) run.off[u] = np, np += unit_params(cfg, u);
    run.st = state_alloc(np, o.opt.adamw);
    run.mine = (Holding){0}; // for checkpoints (ckpt.h): each of this rank's units, whole, at off[u]
    for (int v = 0; v < V; v++)
        for (int u = run.first[run.p.chunk[v]]; u < run.first[run.p.chunk[v] + 1]; u++) {
            run.mine.n[u] = unit_params(cfg, u), run.mine.at[0][u] = run.st.params + run.off[u];
            run.mine.at[1][u] = run.st.m ? run.st.m + run.off[u] : NULL, run.mine.at[2][u] = run.st.v ? run.st.v + run.off[u] : NULL;
        }
    long start = holding_load(&run.mine, &o, &run.ds, cfg);
    workspace_init(&run.ws, capacity, max_width(cfg), max_linear_weight(cfg));
    char layout[200];
    snprintf(layout, sizeof layout, "pipeline of %d stages x %d chunks, %d microbatches, %s schedule", S, V, run.M,
             schedule_names[run.sched]);
    if (!o.quiet && world_rank == 0) {
        print_config(&o, &run.ds, layout);
        for (int r = 0; r < S; r++) {
            printf("  rank %d    ", r);
            for (int v = 0; v < V; v++) printf(" %schunk %d:", v ? "; " : "", chunk_global(run.sched, S, r, v)),
                                        pp_print_units(cfg, run.first, chunk_global(run.sched, S, r, v));
            printf("\n");
        }
    }

    // training loop
    int B = o.batch;
    Progress progress = progress_start(&o, world_rank == 0, dist_save, &(DistSave){&run.mine, &run.ds, &run.cfg}, dist_any);
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        double loss = train_step(&run, &o, step);
        if (step_end(&progress, step, loss, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, &progress, &o.opt, B);
    Report rep = {"train_pp.c", layout, sent_words, mem_words};
    free(dist_report(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run));
    if (!o.quiet) {
        watchdog_wind(&o); // the report's checker is progress too
        pp_print_theory(&run.p);
    }
    if (run.timeline) pp_timeline(&run.p);

    run_free(&run);
    MPI_Finalize();
    return 0;
}

#endif // TRAIN_3D
