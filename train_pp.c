/*
 * train_pp.c: pipeline parallel. The model's units are cut into chunks, one or more per
 * rank; each global batch is cut into M microbatches that stream through the chunks,
 * activations flowing forward and gradients backward as point-to-point messages, in the
 * order of a schedule (schedules.h): naive, GPipe, 1F1B, interleaved 1F1B, and the
 * zero-bubble ZB-H1 and ZB-V. It prints exactly what train.c prints for the same flags,
 * whatever S, M and schedule.
 *
 *   rank 0: embedding, linear 1 --activations--> rank 1: linear 2 + loss
 *                               <--gradients----
 *   (each microbatch's rows drawn by every rank itself; only activations and gradients travel)
 *
 * Per rank and step, batch B, through a chunk with output width w_out and input width w_in:
 *   sent    4 B x B x w_out (activations, to the next chunk's rank) + 4 B x B x w_in
 *           (gradients, to the previous chunk's rank), for each chunk whose neighbour is
 *           on another rank
 *   memory  (4 + 8, + 8 with AdamW) B x its parameters + peak x a microbatch's activations,
 *           peak by schedule (schedules.h: 1 naive, M GPipe, min(S-r, M) 1F1B, ...)
 *   bubble  (S-1)/(M+S-1) of each rank's time idle for GPipe and 1F1B with equal stages,
 *           (S-1)/(V M + S-1) interleaved, about a third of 1F1B's for ZB-H1
 *
 *   make train_pp && mpirun -n 3 ./train_pp --layers 2 --microbatches 4 --schedule 1f1b
 *   mpirun -n 4 --oversubscribe ./train_pp --layers 6 --microbatches 8 --schedule interleaved --virtual 2
 *   mpirun -n 4 --oversubscribe ./train_pp --layers 6 --microbatches 8 --schedule zbv --timeline
 *
 * Compare with ./train: the same losses, names and final checkpoint, for every S, M and schedule.
 *
 * Sections: the strategy (chunks of units; the executor's plumbing, skippable; the executor
 * that runs any schedule's list: receive, compute, send); the state of one run; the
 * forward pass and the figures; options; main.
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"
#include "dist.h"
#include "schedules.h"

// ----------------------------------------------------------------------------
// the strategy: chunks of units
//
// The global batch of B rows is cut into M microbatches of contiguous rows (32 rows into 3
// microbatches: 11, 11, 10; split_range), every rank drawing the rows of a microbatch
// itself (the counter-based sampler makes that free), so only activations and gradients
// travel. Each rank adds the gradients of all M microbatches into one exact sum, so the
// gradient is the mean over the whole batch, as in train.c, whatever M or schedule.

// Splits the units into n contiguous, non-empty chunks, balancing the work (model.h's
// unit_cost, multiply-adds a row: a linear layer's K J, a GPT block's, T*E for the MLP's
// embedding): the split whose most expensive chunk is cheapest. first[k] is chunk k's first
// unit; first[n] = n_units.
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

// What a rank computes on a microbatch through one of its chunks (train_pp.c: the chunk's
// units; train_3d.c: their tensor-parallel slices, FSDP-sharded). Backward reads the
// gradient of the chunk's output from s->dout and leaves the gradient of its input in
// s->dout; with stash NULL it adds the weight gradients at once (B), otherwise it keeps
// what each unit's weight half needs in stash[u] for backward_weight to use later (I, then W).
typedef struct {
    void (*forward)(void* ctx, int chunk, Acts* a, Scratch* s, int R, long rows_total);
    void (*backward)(void* ctx, int chunk, Acts* a, Scratch* s, float* const* stash, int R, long batch);
    void (*backward_weight)(void* ctx, int chunk, const Acts* a, float* const* stash, int R, long batch);
    void* ctx;
} StageWork;

// The activations of one microbatch through one of this rank's chunks, held from its F to
// its B or W; with an I/W schedule, also what its I leaves for its W.
typedef struct {
    Acts acts;
    float* stash[MAX_LAYERS + 2];
    int chunk, mb; // mb -1: this place holds nothing
} Held;

// A message this rank sent: its own copy of the data, so that the sender moves on at once;
// MPI's request while it travels to another rank, or, for a chunk of this same rank (ZB-V's
// turn), its key until that chunk takes it.
typedef struct {
    float* data;
    MPI_Request req;
    long key; // -1: not for this rank, or taken
} Message;

typedef struct {
    Group* pp;
    int S, s;          // ranks, and this one
    int V, K, M, sched; // chunks per rank, chunks in all (S V), microbatches, schedule
    int u_lo[4], u_hi[4]; // chunk v's units [u_lo, u_hi) on this rank
    int k[4];          // and its place in the model, 0..K-1
    int rows, B;       // rows this pipeline streams per step (of a global batch of B)
    int context;       // T, for drawing rows
    int in_width[4], out_width[4]; // activations received by chunk v, sent by it
    StageWork work;
    Action* actions;   // this rank's list, from its schedule
    int n_actions;
    Action** lists;    // rank 0 of the pipeline: every rank's list (counts[r] actions), for the report
    int* counts;
    int split;         // whether the list runs I and W apart (then W needs what I stashed)
    // the executor's buffers (the plumbing section below)
    const Config* c;
    const UnitSizes* sizes; // what each unit holds on this rank (train_3d.c's slices and shares), or NULL
    int mb_rows;       // the largest microbatch
    Held* held;        // [room] the activations in flight
    int room, n_held, most_held, held_at_most[4]; // the list's peak; held now, at most, and of each chunk then
    Message* outbox;   // [n_outbox] messages sent, a ring from the oldest at next_out; msg_floats each
    int n_outbox, next_out;
    long msg_floats;
    Acts pass[4];      // forward-only passes (validation, sampling), one per chunk
    Scratch scratch;
    int64_t loss;      // the rank with the last chunk: the exact loss sum of the step's microbatches
    double idle, busy; // seconds waiting for messages, and computing, over the whole run
    double* t0;        // the last step's actions, for --timeline: when each one's computation
    double* t1;        //   started and ended, seconds since the step began
    double step_start;
} Pp;

// The most chunk activations a list holds at once: one from each F to its B or W.
static int pp_list_peak(const Action* a, int n) {
    int live = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        live += a[i].op == 'F' ? 1 : a[i].op == 'I' ? 0 : -1;
        peak = live > peak ? live : peak;
    }
    return peak;
}

// This rank's part of a pipeline of S V chunks cut at `first`, streaming `rows` rows per
// step (of a global batch of B). `extra_rows`: forward-only passes (validation, sampling)
// of up to that many rows. `sizes`: what each unit holds per row on this rank (model.h's
// UnitSizes), or NULL.
static void pp_init(Pp* p, Group* pp, const Config* c, int M, int sched, int V, const int* first, int rows, int B,
                    int extra_rows, const UnitSizes* sizes, StageWork work) {
    *p = (Pp){.pp = pp, .S = pp->size, .s = pp->rank, .V = V, .K = pp->size * V, .M = M, .sched = sched,
              .rows = rows, .B = B, .context = c->context, .work = work, .c = c, .sizes = sizes,
              .mb_rows = (rows + M - 1) / M};
    int most = 0, pass_rows = extra_rows > p->mb_rows ? extra_rows : p->mb_rows;
    for (int v = 0; v < V; v++) {
        int k = p->k[v] = chunk_global(sched, p->S, p->s, v);
        p->u_lo[v] = first[k], p->u_hi[v] = first[k + 1];
        int lo = p->u_lo[v], hi = p->u_hi[v];
        p->in_width[v] = lo > 0 ? unit_out(c, sizes, lo - 1) : 0;
        p->out_width[v] = unit_out(c, sizes, hi - 1);
        most = p->in_width[v] > most ? p->in_width[v] : most;
        most = p->out_width[v] > most ? p->out_width[v] : most;
        acts_init(&p->pass[v], c, pass_rows, lo, hi, sizes);
    }
    // the schedule, built once: this rank's list, and on rank 0 every rank's, for the report
    p->lists = mallocCheck(sizeof(Action*) * p->S);
    p->counts = mallocCheck(sizeof(int) * p->S);
    for (int r = 0; r < p->S; r++) p->lists[r] = mallocCheck(sizeof(Action) * 3 * V * M);
    schedule_build(sched, p->S, V, M, p->lists, p->counts);
    p->actions = p->lists[p->s], p->n_actions = p->counts[p->s];
    if (p->s != 0) {
        for (int r = 0; r < p->S; r++)
            if (r != p->s) free(p->lists[r]);
        free(p->lists), free(p->counts), p->lists = NULL, p->counts = NULL;
    }
    for (int i = 0; i < p->n_actions; i++) p->split |= p->actions[i].op == 'W';
    p->room = pp_list_peak(p->actions, p->n_actions);
    p->held = callocCheck(p->room > 0 ? p->room : 1, sizeof(Held));
    for (int j = 0; j < p->room; j++) p->held[j].mb = -1;
    p->msg_floats = (long)p->mb_rows * (most > 0 ? most : 1);
    p->n_outbox = 2 * (p->room + 1);
    p->outbox = mallocCheck(sizeof(Message) * p->n_outbox);
    for (int j = 0; j < p->n_outbox; j++) p->outbox[j] = (Message){mallocCheck(sizeof(float) * p->msg_floats), MPI_REQUEST_NULL, -1};
    scratch_init(&p->scratch, c, pass_rows);
    p->t0 = callocCheck(p->n_actions, sizeof(double));
    p->t1 = callocCheck(p->n_actions, sizeof(double));
}

static void pp_free(Pp* p) {
    for (int v = 0; v < p->V; v++) acts_free(&p->pass[v]);
    for (int j = 0; j < p->n_outbox; j++) free(p->outbox[j].data);
    if (p->lists)
        for (int r = 0; r < p->S; r++) free(p->lists[r]);
    else
        free(p->actions);
    free(p->lists), free(p->counts), free(p->held), free(p->outbox), free(p->t0), free(p->t1);
    scratch_free(&p->scratch);
}

// ----------------------------------------------------------------------------
// the executor's plumbing: activations held, and messages
//
// Deadlock: every send is non-blocking (the data is copied into the outbox, and MPI_Isend
// completes later), so a rank never waits on a send while its neighbour waits on it;
// receives block, in list order; each message is tagged with the chunk it is for, its
// microbatch and its direction, so a receive can only match its own message. The checker
// (schedules.h) proves every list free of cycles of waits. A message to a chunk of this
// same rank (ZB-V's turn) stays in the outbox until that chunk takes it.

enum { ACTIVATIONS, GRADIENT };

// Waits for a message, counting the wait as idle time.
static void pp_wait(Pp* p, MPI_Request* req) {
    double t = now_seconds();
    waiting_for = "a pipeline message";
    MPI_Wait(req, MPI_STATUS_IGNORE);
    waiting_for = NULL;
    p->idle += now_seconds() - t;
}
// The message into model chunk k for microbatch m: its key, and its MPI tag (MPI promises
// tags up to 32767; messages between two ranks keep their order, so tags may repeat).
static long pp_key(const Pp* p, int k, int m, int what) { return ((long)m * p->K + k) * 2 + what; }
static int pp_tag(const Pp* p, int k, int m, int what) {
    return TAG_MICROBATCH + (int)(pp_key(p, k, m, what) % (32768 - TAG_MICROBATCH));
}
// The rank that sends chunk k its input (the activations of chunk k-1) or its output's
// gradient (from chunk k+1); -1 past either end of the model.
static int pp_sender(const Pp* p, int k, int what) {
    int v;
    return chunk_owner(p->sched, p->S, p->V, what == ACTIVATIONS ? k - 1 : k + 1, &v);
}
static int pp_receiver(const Pp* p, int k) {
    int v;
    return chunk_owner(p->sched, p->S, p->V, k, &v);
}

// Room in the outbox for a message: the buffer of the oldest message in the ring, once MPI
// says that message has left, or else a new buffer, placed before it. No send waits. The
// ring starts with 2 (room + 1) buffers, twice the activations the rank holds at most, so
// the oldest message has almost always arrived: asking MPI about one still on its way
// (MPI_Test) is rare, as it should be, since OpenMPI then yields the core when ranks
// outnumber cores.
static Message* pp_outbox_slot(Pp* p) {
    Message* msg = &p->outbox[p->next_out];
    int done = msg->key < 0; // a message to a chunk of this rank has left once that chunk takes it
    if (done) MPI_Test(&msg->req, &done, MPI_STATUS_IGNORE);
    if (!done) {
        p->outbox = reallocCheck(p->outbox, sizeof(Message) * (p->n_outbox + 1));
        msg = &p->outbox[p->next_out];
        memmove(msg + 1, msg, sizeof(Message) * (p->n_outbox - p->next_out));
        p->n_outbox++;
        *msg = (Message){mallocCheck(sizeof(float) * p->msg_floats), MPI_REQUEST_NULL, -1};
    }
    p->next_out = (p->next_out + 1) % p->n_outbox; // the oldest again
    return msg;
}

// Sends n floats to model chunk k for microbatch m: a copy, to its rank, or kept for it.
static void pp_send(Pp* p, int k, int m, int what, const float* data, long n) {
    Message* msg = pp_outbox_slot(p);
    memcpy(msg->data, data, n * sizeof(float));
    int to = pp_receiver(p, k);
    if (to == p->s) msg->key = pp_key(p, k, m, what);
    else group_isend(p->pp, msg->data, n, MPI_FLOAT, to, pp_tag(p, k, m, what), &msg->req);
}
// Receives into buf the n floats model chunk k gets for microbatch m, waiting for them.
static void pp_receive(Pp* p, int k, int m, int what, float* buf, long n) {
    int from = pp_sender(p, k, what);
    if (from != p->s) {
        MPI_Request req;
        group_irecv(p->pp, buf, n, MPI_FLOAT, from, pp_tag(p, k, m, what), &req);
        pp_wait(p, &req);
        return;
    }
    long key = pp_key(p, k, m, what);
    for (int j = 0; j < p->n_outbox; j++)
        if (p->outbox[j].key == key) {
            memcpy(buf, p->outbox[j].data, n * sizeof(float));
            p->outbox[j].key = -1;
            return;
        }
    fatal("internal: chunk %d runs before its message for microbatch %d from a chunk of its rank", k, m);
}
// The end of a step: every message has left, so that the next step may reuse their tags.
static void pp_outbox_empty(Pp* p) {
    for (int j = 0; j < p->n_outbox; j++) {
        if (p->outbox[j].key >= 0) fatal("internal: a message to a chunk of this rank was never taken");
        pp_wait(p, &p->outbox[j].req);
    }
}

// Room for the activations of microbatch m through chunk v, from its F to its B or W
// (pp_drop): allocated then, freed then, so that a rank holds what its list has in
// flight and no more, whichever chunk it is for.
static Held* pp_hold(Pp* p, int v, int m) {
    Held* h = p->held;
    while (h->mb >= 0) h++; // there is room: room is the list's peak
    acts_init(&h->acts, p->c, p->mb_rows, p->u_lo[v], p->u_hi[v], p->sizes);
    for (int u = p->u_lo[v]; u < p->u_hi[v] && p->split; u++)
        h->stash[u] = mallocCheck(sizeof(float) * p->mb_rows * unit_stash_at(p->c, p->sizes, u));
    h->chunk = v, h->mb = m;
    if (++p->n_held > p->most_held) {
        p->most_held = p->n_held;
        for (int w = 0; w < p->V; w++) p->held_at_most[w] = 0;
        for (int j = 0; j < p->room; j++) p->held_at_most[p->held[j].chunk] += p->held[j].mb >= 0;
    }
    return h;
}
static Held* pp_held(Pp* p, int v, int m) {
    for (int j = 0; j < p->room; j++)
        if (p->held[j].mb == m && p->held[j].chunk == v) return &p->held[j];
    fatal("internal: no activations of microbatch %d in chunk %d", m, p->k[v]);
}
static void pp_drop(Pp* p, Held* h) {
    acts_free(&h->acts);
    for (int u = 0; u < MAX_LAYERS + 2; u++) free(h->stash[u]), h->stash[u] = NULL;
    h->mb = -1;
    p->n_held--;
}

// Microbatch m: its first row, and (returned) how many.
static int pp_mb_rows(const Pp* p, int m, long* first) {
    long end;
    split_range(p->rows, p->M, m, first, &end);
    return (int)(end - *first);
}
// Action i computed from t to now: busy time, the timeline, the trace.
static void pp_computed(Pp* p, int i, double t) {
    double now = now_seconds();
    p->busy += now - t;
    p->t0[i] = t - p->step_start, p->t1[i] = now - p->step_start;
    const Action* a = &p->actions[i];
    trace_event("pipeline", t, now, 0, "%c%d chunk %d", a->op, a->mb, p->k[a->chunk]);
}

// ----------------------------------------------------------------------------
// the strategy: the executor, which runs any schedule's list of actions
//
// For each action of this rank's list, in order: receive what it needs, compute, send what
// it made. F of microbatch m through chunk k: the activations of chunk k-1 in (the first
// chunk draws the rows itself), forward, the activations out to chunk k+1 (the last chunk
// adds the loss instead). B, or its input half I: the gradient of chunk k's output in from
// chunk k+1 (the last chunk starts from the loss), backward, the gradient of its input out
// to chunk k-1. W: the weight gradients from what I stashed. The activations of m through
// k are held from its F to its B or W. Returns, on the rank of the last chunk, the exact
// loss sum over the pipeline's rows.
static int64_t pp_step(Pp* p, const Rows* rows) {
    p->loss = 0;
    p->step_start = now_seconds();
    for (int i = 0; i < p->n_actions; i++) {
        int v = p->actions[i].chunk, m = p->actions[i].mb, k = p->k[v], lo = p->u_lo[v], hi = p->u_hi[v];
        char op = p->actions[i].op;
        long first;
        int R = pp_mb_rows(p, m, &first);
        long n_in = (long)R * p->in_width[v], n_out = (long)R * p->out_width[v];
        Held* h = op == 'F' ? pp_hold(p, v, m) : pp_held(p, v, m);
        double t;
        if (op == 'F') {
            rows_load(rows, first, R, p->context, h->acts.tokens, h->acts.targets);
            if (k > 0) pp_receive(p, k, m, ACTIVATIONS, h->acts.out[lo - 1], n_in);
            t = now_seconds();
            p->work.forward(p->work.ctx, v, &h->acts, &p->scratch, R, p->B);
            pp_computed(p, i, t);
            if (k < p->K - 1) pp_send(p, k + 1, m, ACTIVATIONS, h->acts.out[hi - 1], n_out);
            else p->loss += h->acts.loss;
        } else if (op == 'B' || op == 'I') {
            if (k < p->K - 1) pp_receive(p, k, m, GRADIENT, p->scratch.dout, n_out);
            t = now_seconds();
            p->work.backward(p->work.ctx, v, &h->acts, &p->scratch, op == 'I' ? h->stash : NULL, R, p->B);
            pp_computed(p, i, t);
            if (k > 0) pp_send(p, k - 1, m, GRADIENT, p->scratch.dout, n_in);
            if (op == 'B') pp_drop(p, h);
        } else { // W
            t = now_seconds();
            p->work.backward_weight(p->work.ctx, v, &h->acts, h->stash, R, p->B);
            pp_computed(p, i, t);
            pp_drop(p, h);
        }
    }
    pp_outbox_empty(p);
    return p->loss;
}

// A forward-only pass of R rows through the whole pipeline (validation, sampling), chunk by
// chunk in model order: blocking messages suffice, they all flow one way. Each chunk has
// its own activations for these passes. Returns the loss sum on the rank of the last
// chunk (whose pass activations hold the probabilities).
static Acts* pp_last_acts(Pp* p) { return &p->pass[p->V - 1]; }
static int64_t pp_forward_rows(Pp* p, const Rows* rows, long first, int R, long rows_total, int tag) {
    int64_t loss = 0;
    for (int k = 0; k < p->K; k++) {
        int v, w;
        if (chunk_owner(p->sched, p->S, p->V, k, &v) != p->s) continue;
        Acts* a = &p->pass[v];
        rows_load(rows, first, R, p->context, a->tokens, a->targets);
        float* in = k > 0 ? a->out[p->u_lo[v] - 1] : NULL;
        int prev = pp_sender(p, k, ACTIVATIONS), next = pp_receiver(p, k + 1);
        if (k > 0 && prev == p->s) { // the chunk before is this rank's chunk w (ZB-V's turn)
            chunk_owner(p->sched, p->S, p->V, k - 1, &w);
            memcpy(in, p->pass[w].out[p->u_hi[w] - 1], (size_t)R * p->in_width[v] * sizeof(float));
        } else if (k > 0) {
            MPI_Recv(in, R * p->in_width[v], MPI_FLOAT, prev, tag, p->pp->comm, MPI_STATUS_IGNORE);
        }
        p->work.forward(p->work.ctx, v, a, &p->scratch, R, rows_total);
        if (next >= 0 && next != p->s) MPI_Send(a->out[p->u_hi[v] - 1], R * p->out_width[v], MPI_FLOAT, next, tag, p->pp->comm);
        if (k == p->K - 1) loss = a->loss;
    }
    return loss;
}
// The flags of a pipeline, in train_pp.c and in train_3d.c.
#define PIPELINE_FLAGS                                                                                          \
    {"microbatches", "M", "microbatches per global batch, or per data-parallel share of it (default 4)"},     \
    {"schedule", "NAME", "naive, gpipe, 1f1b, interleaved, zb1 or zbv (default 1f1b)"},                       \
    {"virtual", "V", "chunks per pipeline rank for --schedule interleaved, 1 to 4 (default 2)"},             \
    {"timeline", NULL, "draw the last step's timeline, one row per pipeline rank (train_3d.c: tensor rank 0, data replica 0)"}

// The rank that holds the last chunk: it has the loss and the probabilities.
static int pp_last_rank(const Pp* p) {
    int v;
    return chunk_owner(p->sched, p->S, p->V, p->K - 1, &v);
}

// --timeline: the last step's actions of every rank, gathered to rank 0 of the pipeline
// and drawn there: F of microbatch m with m's digit (0-9, then more digits from A), B or
// its input half I with m's letter (a-z), W with m's letter in capitals.
static void pp_timeline(const Pp* p) {
    int n = p->n_actions;
    char* mark = callocCheck((size_t)(n > 0 ? n : 1), 1);
    for (int i = 0; i < n; i++) {
        int m = p->actions[i].mb;
        char op = p->actions[i].op;
        mark[i] = op == 'F' ? (m < 10 ? (char)('0' + m) : (char)('A' + (m - 10) % 26))
                : op == 'W' ? (char)('A' + m % 26) : (char)('a' + m % 26);
    }
    dist_draw_timeline(p->pp->comm, n, p->t0, p->t1, mark, "stage", 100, "forward of microbatch 0, 1, 2 ... drawn as "
                       "0 1 2 ..., its backward (B, or the input half I) as a b c ..., the weight half W as A B C ...");
    free(mark);
}

// The step's loss lives on the rank of the last chunk: send it to rank 0, which prints.
static void pp_loss_to_first(Pp* p, int64_t* loss) {
    int last = pp_last_rank(p);
    if (last == 0) return;
    if (p->s == last) group_send(p->pp, loss, 1, MPI_INT64_T, 0, TAG_LOSS);
    if (p->s == 0) group_recv(p->pp, loss, 1, MPI_INT64_T, last, TAG_LOSS);
}

// The bubble this rank measured: the fraction of its time spent waiting for messages.
static double pp_bubble(const Pp* p) { return p->idle / (p->idle + p->busy > 0 ? p->idle + p->busy : 1); }

// What a rank sends per step, by the formula: for each of its chunks, the activations of
// every row of its pipeline to the next chunk and their gradients to the chunk before (4 B
// an element), when that chunk is on another rank; and the loss sum to rank 0 (8 B).
static double pp_sent_formula(const Pp* p) {
    double sent = 0;
    for (int v = 0; v < p->V; v++) {
        int next = pp_receiver(p, p->k[v] + 1), prev = pp_sender(p, p->k[v], ACTIVATIONS);
        if (next >= 0 && next != p->s) sent += 4.0 * p->rows * p->out_width[v];
        if (prev >= 0 && prev != p->s) sent += 4.0 * p->rows * p->in_width[v];
    }
    if (p->s == pp_last_rank(p) && p->s != 0) sent += 8;
    return sent;
}
// The activations a rank held at its peak, in bytes: what the executor held of each chunk
// when it held the most (with what W needs, for I/W schedules), rows of `mb_rows`.
static double pp_chunk_bytes(const Pp* p, const Config* c, const UnitSizes* sizes, int mb_rows, int v) {
    double row = acts_bytes_per_row(c, p->u_lo[v], p->u_hi[v], sizes);
    for (int u = p->u_lo[v]; u < p->u_hi[v] && p->split; u++) row += 4.0 * unit_stash_at(c, sizes, u);
    return (double)mb_rows * row;
}
static double pp_acts_bytes(const Pp* p, const Config* c, const UnitSizes* sizes, int mb_rows) {
    double bytes = 0;
    for (int v = 0; v < p->V; v++) bytes += p->held_at_most[v] * pp_chunk_bytes(p, c, sizes, mb_rows, v);
    return bytes;
}
// The same by the schedule's formula (schedules.h) with one chunk per rank; with more, whose
// sizes differ, as the executor held them.
static double pp_acts_formula(const Pp* p, const Config* c, const UnitSizes* sizes, int mb_rows) {
    if (p->V > 1) return pp_acts_bytes(p, c, sizes, mb_rows);
    return schedule_peak_formula(p->sched, p->S, p->V, p->M, p->s) * pp_chunk_bytes(p, c, sizes, mb_rows, 0);
}

// The end of the report (rank 0 of the pipeline): the bubble every rank measured beside
// what the checker predicts for this list with the durations measured here, and the
// papers' closed form; the activations every rank held at its peak beside the formula.
static void pp_print_theory(const Pp* p) {
    // this rank's mean time per F, per backward (B or I) and per W, over the run
    double f = 0, b = 0, w = 0;
    int nf = 0, nb = 0, nw = 0;
    for (int i = 0; i < p->n_actions; i++) {
        double d = p->t1[i] - p->t0[i];
        if (p->actions[i].op == 'F') f += d, nf++;
        else if (p->actions[i].op == 'W') w += d, nw++;
        else b += d, nb++;
    }
    double mine[4] = {pp_bubble(p), 0, 0, 0}, *all = p->pp->rank == 0 ? mallocCheck(sizeof mine * p->S) : NULL;
    mine[1] = (double)p->most_held / p->V; // in microbatches through a whole stage
    MPI_Gather(mine, 4, MPI_DOUBLE, all, 4, MPI_DOUBLE, 0, p->pp->comm);
    double sums[6] = {f, nf, b, nb, w, nw}, tot[6];
    MPI_Reduce(sums, tot, 6, MPI_DOUBLE, MPI_SUM, 0, p->pp->comm);
    if (p->pp->rank == 0) {
        int split = tot[5] > 0;
        Durations d = {tot[0] / (tot[1] > 0 ? tot[1] : 1), 0, 0, 0};
        double back = tot[2] / (tot[3] > 0 ? tot[3] : 1), wt = tot[4] / (tot[5] > 0 ? tot[5] : 1);
        d.i = split ? back : back / 2, d.w = split ? wt : back / 2; // B taken as half I, half W
        Check c = schedule_check(p->sched, p->S, p->V, p->M, p->lists, p->counts, d, NULL, NULL, 0);
        double closed = schedule_bubble_formula(p->sched, p->S, p->V, p->M, d);
        printf("pipeline, %s: F %.3f ms, %s %.3f ms, W %.3f ms on average; per rank: bubble measured (checker's, same "
               "durations), peak activations in microbatches (formula)\n", schedule_names[p->sched], d.f * 1e3,
               split ? "I" : "B", back * 1e3, d.w * 1e3);
        for (int r = 0; r < p->S; r++) {
            double pf = schedule_peak_formula(p->sched, p->S, p->V, p->M, r);
            printf("  rank %d: bubble %.3f (%.3f), peak %.2f", r, all[4 * r], c.ok ? c.bubble[r] : -1, all[4 * r + 1]);
            if (pf >= 0) printf(" (%.2f)", pf);
            printf("\n");
        }
        printf("  all ranks: bubble %.3f of S x the step by the checker", c.bubble_total);
        if (closed >= 0) printf(", %.3f by the closed form", closed);
        printf("\n");
    }
    free(all);
}

#ifndef TRAIN_3D // the rest of this file is the program; train_3d.c uses only the strategy above

#define RUN_LINE "mpirun -n 3 ./train_pp"

// ----------------------------------------------------------------------------
// the state of one run

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

static void run_free(Run* r) {
    dataset_free(&r->ds), state_free(&r->st), pp_free(&r->p), workspace_free(&r->ws);
}

// ----------------------------------------------------------------------------
// a chunk's work, and the forward pass through the whole pipeline

// Chunk v's units in order, and back (the pipeline's StageWork).
static void stage_forward(void* ctx, int v, Acts* a, Scratch* sc, int R, long rows_total) {
    Run* r = ctx;
    for (int u = r->p.u_lo[v]; u < r->p.u_hi[v]; u++)
        unit_forward(&r->cfg, u, r->st.params + r->off[u], a, sc, R, rows_total, &r->ws);
}
static void stage_backward(void* ctx, int v, Acts* a, Scratch* sc, float* const* stash, int R, long batch) {
    Run* r = ctx;
    for (int u = r->p.u_hi[v] - 1; u >= r->p.u_lo[v]; u--) {
        unit_backward_input(&r->cfg, u, r->st.params + r->off[u], a, sc, R, &r->ws);
        if (stash) memcpy(stash[u], unit_stash(&r->cfg, u, sc), (size_t)R * unit_stash_width(&r->cfg, u) * sizeof(float)); // for W
        else unit_backward_weight(&r->cfg, u, r->st.grads + r->off[u], a, unit_stash(&r->cfg, u, sc), R, batch, &r->ws);
        scratch_step_down(sc);
    }
}
static void stage_backward_weight(void* ctx, int v, const Acts* a, float* const* stash, int R, long batch) {
    Run* r = ctx;
    for (int u = r->p.u_lo[v]; u < r->p.u_hi[v]; u++)
        unit_backward_weight(&r->cfg, u, r->st.grads + r->off[u], a, stash[u], R, batch, &r->ws);
}

// Validation and sampling stream through the pipeline; the last chunk's probabilities are
// broadcast, so that every rank draws the same next tokens.
static int64_t forward(void* ctx, const Rows* rows, long first, int R, long rows_total, float* probs) {
    Run* r = ctx;
    int64_t loss = pp_forward_rows(&r->p, rows, first, R, rows_total, probs ? TAG_SAMPLE : TAG_EVAL);
    if (probs) {
        if (r->p.s == pp_last_rank(&r->p)) model_probs(&r->cfg, rows, pp_last_acts(&r->p)->out[r->cfg.layers + 1], R, probs);
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
static const char sent_words[] = "4 B x B x (activations out + gradients in, of each chunk whose neighbour is on another rank) + 8 B loss";
static const char mem_words[] = "(4 + 8 + 8 AdamW) B x its parameters + peak x microbatch activations";

// What this rank sent and holds, each beside its formula, and the bubble it measured.
static Figures figures(const Run* r, const Progress* pr, const Optimizer* opt, int B) {
    const Config* c = &r->cfg;
    long np = r->st.n;
    int mb_rows = (B + r->M - 1) / r->M;
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
static void pp_check_layout(const Options* o, int sched, int S, int V, int M, int virtual_given, const char* run_line) {
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
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    dist_init(&argc, &argv);

    // options
    Options o;
    Run run = {.pp = group_world("pp"), .M = 4, .sched = SCHEDULE_1F1B, .V = 0};
    dist_parse_or_exit(&o, argc, argv, RUN_LINE, pp_flags, 4, pp_flag, &run);
    dist_dense_only(&o, RUN_LINE);
    int S = world_size, V = schedule_chunks(run.sched, run.V > 0 ? run.V : 2);
    pp_check_layout(&o, run.sched, S, run.V > 0 ? run.V : 2, run.M, run.V > 0, RUN_LINE);

    // data
    load_data(&run.ds, &o, &run.cfg);

    // model: this rank's chunks of units, their exact gradient sums and optimizer state
    Config* cfg = &run.cfg;
    pp_split(cfg, S * V, run.first);
    int rows = pass_rows(&o, (o.batch + run.M - 1) / run.M); // a microbatch, or a validation or sampling pass
    pp_init(&run.p, &run.pp, cfg, run.M, run.sched, V, run.first, o.batch, o.batch, rows, NULL,
            (StageWork){stage_forward, stage_backward, stage_backward_weight, &run});
    long np = 0;
    for (int v = 0; v < V; v++)
        for (int u = run.p.u_lo[v]; u < run.p.u_hi[v]; u++) run.off[u] = np, np += unit_params(cfg, u);
    run.st = state_alloc(np, o.opt.adamw);
    run.mine = (Holding){0};
    for (int v = 0; v < V; v++)
        for (int u = run.p.u_lo[v]; u < run.p.u_hi[v]; u++) {
            Holding one = holding_units(cfg, &run.st, u, u + 1, unit_offset(cfg, u) - run.off[u]);
            run.mine.n[u] = one.n[u], run.mine.at[0][u] = one.at[0][u], run.mine.at[1][u] = one.at[1][u], run.mine.at[2][u] = one.at[2][u];
        }
    long start = holding_load(&run.mine, &o, &run.ds, cfg);
    workspace_init(&run.ws, rows, max_width(cfg), max_linear_weight(cfg));
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
        Rows batch = training_rows(&run.ds, o.seed, step, 0);
        fix_zero(run.st.grads, np);
        workspace_keep_weights(&run.ws, 1); // fixed until the optimizer step: each packed once (kernels.h)
        int64_t loss = pp_step(&run.p, &batch); // the schedule: every action of every microbatch
        workspace_keep_weights(&run.ws, 0);
        pp_loss_to_first(&run.p, &loss);
        long n = dataset_batch_targets(&run.ds, o.seed, step, B); // the loss is the mean over n targets
        float scale = clip_factor(&o.opt, &(GradSpan){run.st.grads, np}, 1, n, group_norm, &run.pp); // over every rank
        optimizer_step(&o.opt, run.st.params, run.st.grads, run.st.m, run.st.v, np, grad_factor(n), scale, step);
        if (step_end(&progress, step, fix_to(loss) / n, validation_loss, &run)) break; // a signal: stop, saved
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
