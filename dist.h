/*
 * dist.h: what the MPI programs share. First, the communication every strategy uses:
 * groups of ranks (one communicator each), the ring collectives written out
 * (reduce-scatter, all-gather, all-reduce) and point-to-point messages, every byte counted.
 * Then, under "plumbing", what a reader of a strategy can skip: start-up and the errors
 * that end the whole job, flag parsing and layout checks, checkpoints of a model spread
 * over ranks, and the per-rank tables printed at the end.
 *
 * The collectives, spelled out. All-reduce, reduce-scatter and all-gather are written
 * below as rings of MPI_Sendrecv, the bandwidth-optimal algorithm MPI libraries use for
 * large messages: rank r sends to r+1 and receives from r-1, N-1 times. A reduce-scatter
 * leaves each rank the sum of its chunk, an all-gather hands every chunk round the ring,
 * and an all-reduce is one then the other: every rank sends 2(N-1)/N of the buffer.
 * Writing them out shows how they work, lets every byte be counted as it is sent, and
 * avoids a trap: OpenMPI 4.1's MPI_Reduce_scatter_block took 28 ms here for a buffer this
 * ring reduce-scatters in 0.5 ms. The non-blocking ones (train_dp.c --overlap,
 * train_fsdp.c --prefetch) are MPI's own, MPI_Iallreduce and MPI_Iallgather; for those
 * the counter adds what the ring would send. So is the all-to-all (train_cp.c's Ulysses),
 * counted piece by piece.
 *
 * Counting bytes: every send goes through a wrapper below that adds its bytes to its
 * group's counter, so what a program reports as sent is measured, not modelled.
 */
#ifndef DIST_H
#define DIST_H

#include <mpi.h>

#include "ckpt.h"
#include "report.h"

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

// ----------------------------------------------------------------------------
// groups of ranks, and counted communication

// This rank's place in the whole job (MPI_COMM_WORLD), set by dist_init (in the plumbing,
// below).
static int world_rank, world_size;

typedef struct {
    MPI_Comm comm;
    int rank, size;
    const char* name;   // "tp", "dp", "pp", "cp", "ep", "world"
    double sent;        // bytes this rank has sent in this group (see the top of this file)
    double received;    // and received: over all ranks of a group, the two totals are equal
} Group;

static Group group_world(const char* name) {
    Group g = {MPI_COMM_WORLD, world_rank, world_size, name, 0.0, 0.0};
    return g;
}

// Add to a group's counters, inside the measurement window of a training step (util.h).
// Every message this rank sends, in any group, also counts once in messages_sent: a cost
// model (tools/costmodel.c) charges each a latency.
static double messages_sent;
static void count_sent(Group* g, double bytes) {
    if (in_step) g->sent += bytes, messages_sent += 1;
}
static void count_received(Group* g, double bytes) {
    if (in_step) g->received += bytes;
}

// Message tags, one per kind of message, so that a receive can only match its own kind.
// A pipeline's activations and gradients are tagged with the stream they belong to, the
// receiving chunk and the direction (train_pp.c's messages), from TAG_MICROBATCH up: MPI
// promises tags up to 32767.
enum { TAG_RING = 1, TAG_LOSS, TAG_EVAL, TAG_SAMPLE, TAG_CHECKPOINT,
       TAG_KEYS, TAG_VALUES, TAG_KEY_GRADS, TAG_VALUE_GRADS, // ring attention's K, V, dK, dV (train_cp.c)
       TAG_MICROBATCH = 1024 };

// bf16 on the wire (--reduce bf16): 2 bytes a value, added as NCCL and llm.c add bf16, in
// fp32 and each sum rounded back to bf16. dist_init makes the type, and the operation for
// MPI's own collectives; the rings below add it themselves.
static MPI_Datatype bf16_type = MPI_DATATYPE_NULL;
static MPI_Op bf16_sum_op = MPI_OP_NULL;
ALWAYS_INLINE uint16_t bf16_bits(float x) { // x is a bf16 already: its top 16 bits
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)(u >> 16);
}
ALWAYS_INLINE float bf16_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
static void bf16_add(uint16_t* d, const uint16_t* s, long n) {
    for (long i = 0; i < n; i++) d[i] = bf16_bits(bf16_round(bf16_float(d[i]) + bf16_float(s[i])));
}
static void bf16_sum(void* in, void* inout, int* n, MPI_Datatype* type) {
    (void)type;
    bf16_add(inout, in, *n);
}
static int bf16_free(MPI_Comm comm, int key, void* value, void* extra) {
    (void)comm, (void)key, (void)value, (void)extra;
    MPI_Type_free(&bf16_type);
    MPI_Op_free(&bf16_sum_op);
    return MPI_SUCCESS;
}

static int type_bytes(MPI_Datatype t) {
    int s;
    MPI_Type_size(t, &s);
    return s;
}

// A receive buffer for the rings, grown when a larger chunk comes (the first steps only).
static void* ring_scratch(long bytes) {
    static void* buf;
    static long cap;
    if (bytes > cap) {
        free(buf);
        buf = mallocCheck((size_t)bytes);
        cap = bytes;
    }
    return buf;
}

// dst[i] = dst[i] op src[i]: the reductions the programs use. Integer sums are exact in
// any order, a maximum is exact, and the float sums (the tensor-parallel embedding, and the
// vocabulary-parallel loss's target logit) add a single non-zero term per element: the
// ring's order never changes a bit. Only --reduce fp32 and bf16 add real float sums here,
// and their bits depend on the ring's order, as the option means to show.
static void ring_combine(void* dst, const void* src, long n, MPI_Datatype t, MPI_Op op) {
    if (t == MPI_INT64_T && op == MPI_SUM) {
        int64_t* d = dst;
        const int64_t* s = src;
        for (long i = 0; i < n; i++) d[i] += s[i];
    } else if (t == MPI_FLOAT && op == MPI_SUM) {
        float* d = dst;
        const float* s = src;
        for (long i = 0; i < n; i++) d[i] += s[i];
    } else if (t == bf16_type && op == MPI_SUM) {
        bf16_add(dst, src, n);
    } else if (t == MPI_FLOAT && op == MPI_MAX) {
        float* d = dst;
        const float* s = src;
        for (long i = 0; i < n; i++) d[i] = s[i] > d[i] ? s[i] : d[i];
    } else {
        fatal("internal: no ring reduction for this type and operation");
    }
}

// Sends n_out elements at `out` to the next rank while receiving n_in elements from the
// previous one into `in`, counting both.
static void ring_sendrecv(Group* g, const void* out, long n_out, void* in, long n_in, MPI_Datatype t) {
    int next = (g->rank + 1) % g->size, prev = (g->rank + g->size - 1) % g->size, b = type_bytes(t);
    static char what[64]; // for the watchdog's message
    snprintf(what, sizeof what, "a collective of the %s group", g->name);
    waiting_for = what;
    MPI_Sendrecv(out, (int)n_out, t, next, TAG_RING, in, (int)n_in, t, prev, TAG_RING, g->comm, MPI_STATUS_IGNORE);
    waiting_for = NULL;
    count_sent(g, (double)n_out * b);
    count_received(g, (double)n_in * b);
}

// ----------------------------------------------------------------------------
// the collectives: rings of messages between the ranks of a group

// Ring reduce-scatter, in place: afterwards chunk r of buf holds the sum over every rank
// of its chunk r (the other chunks hold partial sums). Step k passes on chunk r-k-1, to
// which the next rank adds its own, so chunk r arrives complete after N-1 steps. Chunks
// (split_range's N parts of count) travel in pieces of RING_PIECE elements, each added as
// soon as it arrives, while it is still in cache: received whole, a chunk of 4 MB went out
// to memory and came back to be added (2 ranks of data parallelism in the large
// configuration: 21.95 ms a step whole, 21.5 ms in pieces of 64Ki; Zen 4, OpenMPI 4.1).
// Every rank makes as many exchanges, sized by the largest chunk (an empty piece is a
// message of 0 bytes).
// With `into`, each piece of this rank's finished chunk is also added to `into` (a running
// sum of it) while in cache, instead of in a second pass over memory.
#define RING_PIECE (64L * 1024)
static void ring_reduce_scatter(Group* g, void* buf, long count, MPI_Datatype t, MPI_Op op, void* into) {
    int N = g->size, r = g->rank, b = type_bytes(t);
    long pieces = ((count + N - 1) / N + RING_PIECE - 1) / RING_PIECE;
    char* tmp = ring_scratch(RING_PIECE * b);
    for (int k = 0; k < N - 1; k++) {
        long olo, ohi, ilo, ihi;
        split_range(count, N, ((r - k - 1) % N + N) % N, &olo, &ohi);
        split_range(count, N, ((r - k - 2) % N + N) % N, &ilo, &ihi);
        for (long j = 0; j < pieces; j++) {
            long s = j * RING_PIECE, n_out = ohi - olo - s, n_in = ihi - ilo - s;
            n_out = n_out < 0 ? 0 : n_out < RING_PIECE ? n_out : RING_PIECE;
            n_in = n_in < 0 ? 0 : n_in < RING_PIECE ? n_in : RING_PIECE;
            ring_sendrecv(g, (char*)buf + (olo + s) * b, n_out, tmp, n_in, t);
            ring_combine((char*)buf + (ilo + s) * b, tmp, n_in, t, op);
            if (into && k == N - 2) ring_combine((char*)into + s * b, (char*)buf + (ilo + s) * b, n_in, t, op);
        }
    }
}
// Ring all-gather, in place: chunk r of buf (this rank's) goes round the ring; after N-1
// steps every rank holds every chunk. Nothing is added, so chunks travel whole.
static void ring_allgather(Group* g, void* buf, long count, MPI_Datatype t) {
    int N = g->size, r = g->rank, b = type_bytes(t);
    for (int k = 0; k < N - 1; k++) {
        long olo, ohi, ilo, ihi;
        split_range(count, N, ((r - k) % N + N) % N, &olo, &ohi);
        split_range(count, N, ((r - k - 1) % N + N) % N, &ilo, &ihi);
        ring_sendrecv(g, (char*)buf + olo * b, ohi - olo, (char*)buf + ilo * b, ihi - ilo, t);
    }
}

// in-place all-reduce: a ring reduce-scatter, then a ring all-gather
static void group_allreduce(Group* g, void* buf, long count, MPI_Datatype type, MPI_Op op) {
    if (g->size == 1) return;
    double t = now_seconds(), sent = g->sent;
    ring_reduce_scatter(g, buf, count, type, op, NULL);
    ring_allgather(g, buf, count, type);
    trace_event("comm", t, now_seconds(), g->sent - sent, "all-reduce %s", g->name);
}
static void group_iallreduce(Group* g, void* buf, long count, MPI_Datatype type, MPI_Op op, MPI_Request* req) {
    *req = MPI_REQUEST_NULL;
    if (g->size == 1) return;
    MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, type, type == bf16_type ? bf16_sum_op : op, g->comm, req);
    double b = 2.0 * (g->size - 1) / g->size * (double)count * type_bytes(type);
    count_sent(g, b);
    count_received(g, b);
    trace_event("comm", now_seconds(), now_seconds(), b, "start all-reduce %s", g->name);
}

// Reduce-scatter, in place: buf holds size * shard elements on every rank; the sum over
// every rank of this rank's shard of buf is added to `into` (shard elements). The shards of
// buf are left holding partial sums.
static void group_reduce_scatter(Group* g, void* buf, long shard, MPI_Datatype type, MPI_Op op, void* into) {
    double t = now_seconds(), sent = g->sent;
    if (g->size == 1) ring_combine(into, buf, shard, type, op);
    else ring_reduce_scatter(g, buf, shard * g->size, type, op, into);
    trace_event("comm", t, now_seconds(), g->sent - sent, "reduce-scatter %s", g->name);
}
// The gradient all-reduce under --reduce (optim.h): the buffer and datatype it sends. exact
// sends the 64-bit sums themselves. fp32 and bf16 first move what g still holds (this rank's
// last piece; nothing if every piece was moved already) into the float sums, clearing g
// there, and send those as floats or as bf16.
typedef struct {
    void* buf;
    MPI_Datatype type;
} GradSend;
// The bytes a gradient sum takes on the wire.
static double wire_bytes(const GradSums* s) { return s->how == REDUCE_EXACT ? 8.0 : s->how == REDUCE_FP32 ? 4.0 : 2.0; }
static GradSend grads_to_send(GradSums* s, int64_t* g, long lo, long count) {
    grad_sums_add(s, g, lo, count);
    if (s->how == REDUCE_EXACT) return (GradSend){g + lo, MPI_INT64_T};
    if (s->how == REDUCE_FP32) return (GradSend){s->sum + lo, MPI_FLOAT};
    for (long i = lo; i < lo + count; i++) s->wire[i] = bf16_bits(s->sum[i]);
    return (GradSend){s->wire + lo, bf16_type};
}
// The exact sums kept beside --reduce's floats travel by the same rings, but are not counted
// in what the group sent: they are the measurement's traffic, not the method's.
static void uncounted_allreduce(Group* g, int64_t* buf, long count) {
    int was = in_step;
    in_step = 0;
    group_allreduce(g, buf, count, MPI_INT64_T, MPI_SUM);
    in_step = was;
}
static void uncounted_reduce_scatter(Group* g, int64_t* buf, long shard, int64_t* into) {
    int was = in_step;
    in_step = 0;
    group_reduce_scatter(g, buf, shard, MPI_INT64_T, MPI_SUM, into);
    in_step = was;
}
// After the all-reduces of every grads_to_send: the sums the optimizer reads. The exact sums
// beside are summed too, to say from which step the run parts from ./train --reduce HOW.
// bf16: the sums from their wire form, which is cleared for the next step's sums.
static void bf16_unwire(GradSums* s) {
    for (long i = 0; s->how == REDUCE_BF16 && i < s->n; i++) s->sum[i] = bf16_float(s->wire[i]), s->wire[i] = 0;
}
static void grads_received(GradSums* s, Group* dp, int64_t* g, long step) {
    if (s->how == REDUCE_EXACT) return;
    bf16_unwire(s);
    uncounted_allreduce(dp, s->exact, s->n);
    grad_sums_finish(s, g, step);
}
// recv[size * shard] = every rank's send[shard], in rank order (send may be recv's own
// slot, recv + rank * shard)
static void group_allgather(Group* g, const void* send, void* recv, long shard, MPI_Datatype type) {
    char* mine = (char*)recv + g->rank * shard * type_bytes(type);
    if (send != mine) memcpy(mine, send, (size_t)shard * type_bytes(type));
    double t = now_seconds(), sent = g->sent;
    ring_allgather(g, recv, shard * g->size, type);
    trace_event("comm", t, now_seconds(), g->sent - sent, "all-gather %s", g->name);
}
static void group_iallgather(Group* g, const void* send, void* recv, long shard, MPI_Datatype type,
                             MPI_Request* req) {
    *req = MPI_REQUEST_NULL;
    if (g->size == 1) {
        memcpy(recv, send, (size_t)shard * type_bytes(type));
        return;
    }
    MPI_Iallgather(send, (int)shard, type, recv, (int)shard, type, g->comm, req);
    double b = (double)(g->size - 1) * shard * type_bytes(type);
    count_sent(g, b);
    count_received(g, b);
    trace_event("comm", now_seconds(), now_seconds(), b, "start all-gather %s", g->name);
}

// All-to-all: every rank sends `count` elements to each rank (send holds N pieces, in rank
// order) and receives `count` from each (into recv, in rank order): MPI's own. The piece a
// rank addresses to itself is not sent: N - 1 messages, each counted.
static void group_alltoall(Group* g, const void* send, void* recv, long count, MPI_Datatype type) {
    if (count > INT_MAX) fatal("an all-to-all of %ld elements a rank, more than one MPI call sends; lower --batch", count);
    double t = now_seconds(), b = (double)count * type_bytes(type);
    static char what[64]; // for the watchdog's message
    snprintf(what, sizeof what, "an all-to-all of the %s group", g->name);
    waiting_for = what;
    MPI_Alltoall(send, (int)count, type, recv, (int)count, type, g->comm);
    waiting_for = NULL;
    for (int q = 0; q < g->size - 1; q++) count_sent(g, b), count_received(g, b);
    trace_event("comm", t, now_seconds(), (g->size - 1) * b, "all-to-all %s", g->name);
}

// What the textbook ring algorithm sends from each rank: an all-reduce of `bytes` over n
// ranks, and a reduce-scatter or an all-gather whose whole buffer is `bytes`.
static double ring_allreduce_bytes(double bytes, int n) { return 2.0 * (n - 1) / n * bytes; }
static double ring_half_bytes(double bytes, int n) { return (double)(n - 1) / n * bytes; }

// The callback through which optim.h's clip_factor communicates: the gradient norm's two
// pieces combined over a group (MAX, then SUM).
static void group_norm(void* group, float* maxabs, int64_t* sumsq) {
    if (maxabs) group_allreduce(group, maxabs, 1, MPI_FLOAT, MPI_MAX);
    if (sumsq) group_allreduce(group, sumsq, 1, MPI_INT64_T, MPI_SUM);
}

// ----------------------------------------------------------------------------
// point to point: one rank to another (the pipeline's activations and gradients)

static void group_send(Group* g, const void* buf, long count, MPI_Datatype type, int to, int tag) {
    double t = now_seconds();
    MPI_Send(buf, (int)count, type, to, tag, g->comm);
    count_sent(g, (double)count * type_bytes(type));
    trace_event("comm", t, now_seconds(), (double)count * type_bytes(type), "send %s %d", g->name, to);
}
static void group_recv(Group* g, void* buf, long count, MPI_Datatype type, int from, int tag) {
    MPI_Recv(buf, (int)count, type, from, tag, g->comm, MPI_STATUS_IGNORE);
    count_received(g, (double)count * type_bytes(type));
}
static void group_isend(Group* g, const void* buf, long count, MPI_Datatype type, int to, int tag,
                        MPI_Request* req) {
    MPI_Isend(buf, (int)count, type, to, tag, g->comm, req);
    count_sent(g, (double)count * type_bytes(type));
    trace_event("comm", now_seconds(), now_seconds(), (double)count * type_bytes(type), "send %s %d", g->name, to);
}
// counted when posted: every message of these programs has exactly the size its receive expects
static void group_irecv(Group* g, void* buf, long count, MPI_Datatype type, int from, int tag, MPI_Request* req) {
    MPI_Irecv(buf, (int)count, type, from, tag, g->comm, req);
    count_received(g, (double)count * type_bytes(type));
}
// Waits for n posted messages of a group; `what` names them for the watchdog and --trace.
static void group_waitall(Group* g, MPI_Request* req, int n, const char* what) {
    double t = now_seconds();
    waiting_for = what;
    MPI_Status status[16]; // (not MPI_STATUSES_IGNORE: gcc warns on MPICH's)
    if (n > 16) fatal("internal: group_waitall of %d requests, at most 16", n);
    MPI_Waitall(n, req, status);
    waiting_for = NULL;
    trace_event("comm", t, now_seconds(), 0, "%s %s", what, g->name);
}

// ============================================================================
// plumbing: start-up and errors, flags and layout checks, checkpoints, the report.
// Every program needs them; none of them is part of a strategy.

// ----------------------------------------------------------------------------
// start-up, errors, and stopping together

// Two ways an MPI program stops on an error:
//  - fatal(...) (util.h), for an error one rank may meet alone (a failed allocation, a
//    diverged value, a file it cannot read). fatal formats its message and calls util.h's
//    fatal_end pointer, which dist_init points at fatal_end_job, just below: it prints the
//    message with its rank and calls MPI_Abort, which ends every rank of the job at once,
//    so no rank is left waiting in a collective for the one that stopped. When every rank
//    meets the same error (a missing data file), the message is printed once: rank 0 says
//    it at once, the others wait 3 seconds, and the abort ends them before that (half a
//    second was not always enough on a loaded machine: CI saw a second rank's message).
//  - dist_exit, for an error every rank detects alike, before any communication (a bad
//    flag, a layout that does not fit): rank 0 says it and every rank exits with the same
//    status (2 for bad usage), without an abort.
static void fatal_end_job(const char* message) {
    if (world_rank != 0) nanosleep(&(struct timespec){3, 0}, NULL);
    fprintf(stderr, "error: %s (rank %d of %d)\n", message, world_rank, world_size);
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

// A deliberate end before the program's own (util.h's exit_program): every rank calls it.
static void dist_exit_program(int status) {
    MPI_Finalize();
    exit(status);
}

static void dist_init(int* argc, char*** argv) {
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    fatal_end = fatal_end_job; // from now on, fatal() ends every rank (util.h, "fatal errors")
    MPI_Type_contiguous(1, MPI_UINT16_T, &bf16_type);
    MPI_Type_commit(&bf16_type);
    MPI_Op_create(bf16_sum, 1, &bf16_sum_op);
    // MPI_Finalize deletes MPI_COMM_SELF's attributes first, wherever a program calls it:
    // the place to free the two, or MPICH reports them as leaked
    int key;
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, bf16_free, &key, NULL);
    MPI_Comm_set_attr(MPI_COMM_SELF, key, NULL);
    MPI_Comm_free_keyval(&key);
    exit_program = dist_exit_program;
    prints_for_job = world_rank == 0;
}

__attribute__((format(printf, 3, 4), noreturn)) static void dist_exit(int status, const char* run_line,
                                                                     const char* fmt, ...) {
    if (world_rank == 0) {
        va_list ap;
        va_start(ap, fmt);
        fputs("error: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
        if (run_line) fprintf(stderr, "run %s --help for the flags\n", run_line);
    }
    MPI_Finalize();
    exit(status);
}

// Whether any rank's flag is set (every rank calls it): how ranks agree to stop at the same
// step when a signal reached some of them (report.h's step_end).
static int dist_any(int flag) {
    MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return flag;
}

// ----------------------------------------------------------------------------
// flags and layout checks

// cli_parse for MPI programs: every rank parses the same argv; rank 0 prints.
static void dist_parse_or_exit(Options* o, int argc, char** argv, const char* run_line, const CliFlag* extra,
                               int n_extra, CliHandler handle, void* ctx) {
    const char* err;
    int rc = cli_parse(o, argc, argv, extra, n_extra, handle, ctx, &err);
    if (rc == 0) return;
    if (world_rank == 0) {
        if (rc == 2) fprintf(stderr, "error: %s\n", err);
        cli_usage(rc == 1 ? stdout : stderr, run_line, extra, n_extra);
    }
    MPI_Finalize();
    exit(rc == 1 ? 0 : 2);
}

// The programs that train the dense model only: --experts belongs to train.c, train_ep.c,
// and for the GPT train_3d.c (--ep).
static void dist_dense_only(const Options* o, const char* run_line) {
    if (o->model.experts > 0)
        dist_exit(2, run_line, "--experts: this program trains the dense model; the mixture of experts trains in "
                  "train.c (one process) and train_ep.c (experts spread over ranks), the GPT's also in train_3d.c (--ep)");
}

// Data parallelism (train_dp.c, train_fsdp.c) gives every rank a share of each batch's rows.
static void dist_check_rows(const Options* o, const char* run_line) {
    if (world_size > o->batch)
        dist_exit(2, run_line, "%d ranks but a batch of %d rows: every rank needs at least one row (raise --batch)",
                  world_size, o->batch);
}

// ----------------------------------------------------------------------------
// checkpoints of a model spread over ranks

// Writes checkpoint `path` from what every rank holds (ckpt.h), one unit at a time: each
// rank sends its elements of the unit and where they go, world rank 0 puts them in place
// and writes the unit. An element held by several ranks (a replicated bias) arrives from
// each, with the same value. Every rank calls it.
static void dist_ckpt_save(const Holding* h, const Options* o, const Dataset* ds, const Config* c, long step) {
    int root = world_rank == 0, *counts = NULL, *displs = NULL;
    int adamw = o->opt.adamw;
    CkptWriter w;
    CkptHeader header = ckpt_header(c, o, ds, step);
    if (root) ckpt_create(&w, o->save, o->keep, &header);
    long most = 0;
    for (int u = 0; u < n_units(c); u++) most = h->n[u] > most ? h->n[u] : most;
    long* index = mallocCheck((size_t)(most > 0 ? most : 1) * sizeof(long));
    float *unit = NULL, *values = NULL;
    long* where = NULL;
    if (root) {
        counts = mallocCheck(sizeof(int) * world_size), displs = mallocCheck(sizeof(int) * world_size);
        unit = mallocCheck((size_t)max_unit_params(c) * sizeof(float));
    }
    for (int part = 0; part < (adamw ? 3 : 1); part++)
        for (int u = 0; u < n_units(c); u++) {
            int n = (int)h->n[u], total = 0;
            UnitTable table = unit_table(c, u);
            for (long e = 0; e < n; e++) index[e] = holding_index(h, c, &table, u, e);
            MPI_Gather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD);
            if (root) {
                for (int q = 0; q < world_size; q++) displs[q] = total, total += counts[q];
                values = reallocCheck(values, sizeof(float) * (total > 0 ? total : 1));
                where = reallocCheck(where, sizeof(long) * (total > 0 ? total : 1));
            }
            MPI_Gatherv(n ? h->at[part][u] : NULL, n, MPI_FLOAT, values, counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD);
            MPI_Gatherv(index, n, MPI_LONG, where, counts, displs, MPI_LONG, 0, MPI_COMM_WORLD);
            if (!root) continue;
            for (int i = 0; i < total; i++)
                if (where[i] >= 0) unit[where[i]] = values[i];
            ckpt_write(&w, unit, (size_t)unit_params(c, u) * sizeof(float));
        }
    for (int u = 1; u <= header.bias_units; u++) { // --balance bias: from the first rank that computes the layer
        float* bias = moe_bias_of(c, u);
        int mine = moe_bias.held[u] ? world_rank : world_size, first;
        MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (first < world_size) MPI_Bcast(bias, c->experts, MPI_FLOAT, first, MPI_COMM_WORLD);
        if (root) ckpt_write(&w, bias, (size_t)c->experts * sizeof(float));
    }
    if (root) ckpt_close(&w);
    free(index), free(unit), free(values), free(where), free(counts), free(displs);
}

// --save for a program whose ranks each hold part of the model (report.h's SaveFn, with a
// DistSave as its context): what this rank holds, the data, the model.
typedef struct {
    const Holding* holding;
    const Dataset* ds;
    const Config* cfg;
} DistSave;
static void dist_save(void* ctx, const Options* o, long step) {
    const DistSave* s = ctx;
    dist_ckpt_save(s->holding, o, s->ds, s->cfg, step);
}

// ----------------------------------------------------------------------------
// the report

// --trace: every rank's events, gathered to world rank 0 and written as one file.
static void dist_trace_write(const char* path) {
    int n = (int)trace_count, *counts = NULL, *displs = NULL, *proc = NULL;
    TraceEvent* all = NULL;
    if (world_rank == 0) counts = mallocCheck(sizeof(int) * world_size), displs = mallocCheck(sizeof(int) * world_size);
    MPI_Gather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD);
    long total = 0;
    if (world_rank == 0) {
        for (int q = 0; q < world_size; q++) displs[q] = (int)(total * sizeof(TraceEvent)), total += counts[q];
        all = mallocCheck(sizeof(TraceEvent) * (total > 0 ? total : 1));
        proc = mallocCheck(sizeof(int) * (total > 0 ? total : 1));
        for (int q = 0, k = 0; q < world_size; q++)
            for (int i = 0; i < counts[q]; i++) proc[k++] = q;
        for (int q = 0; q < world_size; q++) counts[q] *= (int)sizeof(TraceEvent);
    }
    MPI_Gatherv(trace_events, n * (int)sizeof(TraceEvent), MPI_BYTE, all, counts, displs, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (world_rank == 0) trace_write(path, all, proc, total);
    free(counts), free(displs), free(proc), free(all);
}

// The end of every MPI program: the names sampled with its forward pass (every rank takes
// part); every rank's figures gathered to world rank 0, which prints them with the
// results (report.h); every rank's --trace events in one file. Every rank calls it.
// Returns the figures of every rank on rank 0 (the caller frees them), NULL on the others.
static Figures* dist_report(const Options* o, const Report* rep, Progress* pr, double val_loss, const Dataset* ds,
                            const Figures* mine, ForwardFn forward, void* ctx) {
    int* names = generate_names(o->samples, ds->max_len, &o->model, ds, o->seed, forward, ctx);
    Figures* all = world_rank == 0 ? callocCheck(world_size, sizeof(Figures)) : NULL;
    Figures with = *mine;
    with.messages = per_step(pr, messages_sent);
    MPI_Gather(&with, FIGURES_DOUBLES, MPI_DOUBLE, all, FIGURES_DOUBLES, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (world_rank == 0) report_print(o, rep, pr, val_loss, names, ds, all, world_size);
    if (o->trace) dist_trace_write(o->trace);
    free(names);
    return all;
}

// --timeline: every rank's n actions (from t0[i] to t1[i] seconds into the step, drawn
// with mark[i]) gathered to rank 0 of `comm` and drawn there, one lane a rank; ranks with
// fewer actions than the most are padded with mark 0, drawn nowhere. Every rank calls it.
static void dist_draw_timeline(MPI_Comm comm, int n, const double* t0, const double* t1, const char* mark,
                               const char* lane_name, int width, const char* legend) {
    int rank, size, most = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    MPI_Allreduce(&n, &most, 1, MPI_INT, MPI_MAX, comm); // ranks' lists may differ in length
    double *a0 = callocCheck((size_t)most, sizeof(double)), *a1 = callocCheck((size_t)most, sizeof(double));
    char* am = callocCheck((size_t)most, 1);
    memcpy(a0, t0, (size_t)n * sizeof(double)), memcpy(a1, t1, (size_t)n * sizeof(double)), memcpy(am, mark, (size_t)n);
    int root = rank == 0;
    double *all0 = root ? mallocCheck(sizeof(double) * size * most) : NULL, *all1 = root ? mallocCheck(sizeof(double) * size * most) : NULL;
    char* marks = root ? mallocCheck((size_t)size * most) : NULL;
    MPI_Gather(a0, most, MPI_DOUBLE, all0, most, MPI_DOUBLE, 0, comm);
    MPI_Gather(a1, most, MPI_DOUBLE, all1, most, MPI_DOUBLE, 0, comm);
    MPI_Gather(am, most, MPI_CHAR, marks, most, MPI_CHAR, 0, comm);
    if (root && most > 0) draw_timeline(size, lane_name, most, all0, all1, marks, width, legend);
    free(a0), free(a1), free(am), free(all0), free(all1), free(marks);
}
// --timeline from this rank's trace events (report.h): each event that mark() gives a letter
// (0: not drawn), in seconds from step_t0, drawn by dist_draw_timeline above.
static void dist_trace_timeline(MPI_Comm comm, double step_t0, char (*mark_of)(const TraceEvent*),
                                const char* legend) {
    long cap = trace_count > 0 ? trace_count : 1;
    double *t0 = mallocCheck(sizeof(double) * cap), *t1 = mallocCheck(sizeof(double) * cap);
    char* mark = mallocCheck((size_t)cap);
    int n = 0;
    for (long i = 0; i < trace_count; i++)
        if ((mark[n] = mark_of(&trace_events[i])))
            t0[n] = trace_events[i].t0 - step_t0, t1[n] = trace_events[i].t1 - step_t0, n++;
    dist_draw_timeline(comm, n, t0, t1, mark, "rank", 96, legend);
    free(t0), free(t1), free(mark);
}

#pragma GCC diagnostic pop
#endif // DIST_H
