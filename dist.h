/*
 * dist.h: what the MPI programs share: start-up and errors that end the whole job,
 * groups of ranks (one communicator each) whose every message is counted, and the
 * per-rank tables printed at the end.
 *
 * Counting bytes. Every communication goes through a wrapper below that adds the bytes
 * this rank sends to its group's counter. For point-to-point messages that count is
 * exact. For collectives MPI does not say what its algorithm sends, so the wrapper counts
 * what the bandwidth-optimal ring algorithm sends, the one MPI libraries use for large
 * messages: an all-reduce of S bytes over N ranks sends 2(N-1)/N * S from every rank (a
 * reduce-scatter, then an all-gather), a reduce-scatter or an all-gather (N-1)/N * S. An
 * algorithm can only send more than that, never less.
 */
#ifndef DIST_H
#define DIST_H

#include <mpi.h>

#include "util.h"
#include "cli.h"

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

// ----------------------------------------------------------------------------
// start-up and errors

static int world_rank, world_size;

static void abort_job(int status) {
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
}

static void dist_init(int* argc, char*** argv) {
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    fatal_exit_hook = abort_job; // a failed check on any rank ends every rank
}

// An error every rank detects alike (a flag, a size that does not divide): rank 0 says
// it, and every rank leaves with the same status, without waiting for the others.
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

// ----------------------------------------------------------------------------
// groups of ranks, and counted communication

typedef struct {
    MPI_Comm comm;
    int rank, size;
    const char* name;   // "dp", "tp", "pp"
    double sent;        // bytes this rank has sent in this group (see the top of this file)
} Group;

static Group group_world(const char* name) {
    Group g = {MPI_COMM_WORLD, world_rank, world_size, name, 0.0};
    return g;
}

static int type_bytes(MPI_Datatype t) {
    int s;
    MPI_Type_size(t, &s);
    return s;
}

// in-place all-reduce
static void group_allreduce(Group* g, void* buf, long count, MPI_Datatype type, MPI_Op op) {
    if (g->size == 1) return;
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, type, op, g->comm);
    g->sent += 2.0 * (g->size - 1) / g->size * (double)count * type_bytes(type);
}
static void group_iallreduce(Group* g, void* buf, long count, MPI_Datatype type, MPI_Op op, MPI_Request* req) {
    *req = MPI_REQUEST_NULL;
    if (g->size == 1) return;
    MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, type, op, g->comm, req);
    g->sent += 2.0 * (g->size - 1) / g->size * (double)count * type_bytes(type);
}
// recv[shard] = the sum over ranks of send[rank's shard]; send holds size * shard elements
static void group_reduce_scatter(Group* g, const void* send, void* recv, long shard, MPI_Datatype type, MPI_Op op) {
    if (g->size == 1) {
        memcpy(recv, send, (size_t)shard * type_bytes(type));
        return;
    }
    MPI_Reduce_scatter_block(send, recv, (int)shard, type, op, g->comm);
    g->sent += (double)(g->size - 1) * shard * type_bytes(type);
}
// recv[size * shard] = every rank's send[shard], in rank order
static void group_allgather(Group* g, const void* send, void* recv, long shard, MPI_Datatype type) {
    if (g->size == 1) {
        memcpy(recv, send, (size_t)shard * type_bytes(type));
        return;
    }
    MPI_Allgather(send, (int)shard, type, recv, (int)shard, type, g->comm);
    g->sent += (double)(g->size - 1) * shard * type_bytes(type);
}
static void group_iallgather(Group* g, const void* send, void* recv, long shard, MPI_Datatype type,
                             MPI_Request* req) {
    *req = MPI_REQUEST_NULL;
    if (g->size == 1) {
        memcpy(recv, send, (size_t)shard * type_bytes(type));
        return;
    }
    MPI_Iallgather(send, (int)shard, type, recv, (int)shard, type, g->comm, req);
    g->sent += (double)(g->size - 1) * shard * type_bytes(type);
}
static void group_send(Group* g, const void* buf, long count, MPI_Datatype type, int to, int tag) {
    MPI_Send(buf, (int)count, type, to, tag, g->comm);
    g->sent += (double)count * type_bytes(type);
}
static void group_recv(Group* g, void* buf, long count, MPI_Datatype type, int from, int tag) {
    (void)g;
    MPI_Recv(buf, (int)count, type, from, tag, g->comm, MPI_STATUS_IGNORE);
}
static void group_isend(Group* g, const void* buf, long count, MPI_Datatype type, int to, int tag,
                        MPI_Request* req) {
    MPI_Isend(buf, (int)count, type, to, tag, g->comm, req);
    g->sent += (double)count * type_bytes(type);
}
static void group_irecv(Group* g, void* buf, long count, MPI_Datatype type, int from, int tag, MPI_Request* req) {
    MPI_Irecv(buf, (int)count, type, from, tag, g->comm, req);
}

// ----------------------------------------------------------------------------
// splitting work: the global batch, a tensor, a list of units

// Rows [*lo, *hi) of n items that part p of `parts` owns: the first n % parts parts take
// one item more (32 rows on 3 ranks: 11, 11, 10).
static void split_range(long n, int parts, int p, long* lo, long* hi) {
    long base = n / parts, extra = n % parts;
    *lo = p * base + (p < extra ? p : extra);
    *hi = *lo + base + (p < extra ? 1 : 0);
}

// ----------------------------------------------------------------------------
// per-rank tables

// Gathers one value per rank of `g` to its rank 0 (values[] needs g->size entries there).
static void group_gather_double(Group* g, double v, double* values) {
    MPI_Gather(&v, 1, MPI_DOUBLE, values, 1, MPI_DOUBLE, 0, g->comm);
}

static void print_bytes(double b) {
    if (b < 1e3) printf("%.0f B", b);
    else if (b < 1e6) printf("%.1f KB", b / 1e3);
    else if (b < 1e9) printf("%.2f MB", b / 1e6);
    else printf("%.2f GB", b / 1e9);
}

#pragma GCC diagnostic pop
#endif // DIST_H
