/*
 * tools/pingpong.c: a link's latency (alpha) and bandwidth (beta), measured between the
 * first and the last rank of a job, the two numbers of the alpha-beta model that
 * tools/costmodel.c uses: sending n bytes takes alpha + n / beta.
 *
 *   mpirun -n 2 tools/pingpong                               # shared memory
 *   tools/cluster.sh --hosts 2 --link 1gbit -- -n 2 tools/pingpong   # across emulated hosts
 *
 * alpha: half the round trip of an 8-byte message, the mean of 200 or more, over a second at
 * least (many of a scheduler's slices): a program's step time
 * is a mean over its steps, waits for the cores included, and on a machine shared with
 * other jobs a message's wait for its receiver to be scheduled is most of its cost, which
 * a median leaves out. beta: the link's rate, from the medians of round trips of 1 MiB
 * (9) and of 8 bytes, the one less the other (a mean's waits would swamp the difference).
 * Prints "alpha=SECONDS beta=BYTES_PER_SECOND" on one line.
 */
#include "../dist.h"

// Seconds of round trips of n bytes between ranks 0 and `peer`, at least `reps` of them and
// for at least `span` seconds (a scheduler's time slices are milliseconds: a measurement
// shorter than a few of them misses the waits of a loaded machine): their mean, and in
// *med their median.
static double round_trip(char* buf, int n, int reps, double span, int peer, double* med) {
    int cap = reps, count = 0, more = 1;
    double* t = mallocCheck(sizeof(double) * cap);
    double start = MPI_Wtime();
    for (int i = -3; more; i++) { // 3 to warm up
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (world_rank == 0) {
            MPI_Send(buf, n, MPI_CHAR, peer, 1, MPI_COMM_WORLD);
            MPI_Recv(buf, n, MPI_CHAR, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (world_rank == peer) {
            MPI_Recv(buf, n, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, n, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
        }
        if (i >= 0) {
            if (count == cap) t = reallocCheck(t, sizeof(double) * (cap *= 2));
            t[count++] = MPI_Wtime() - t0;
        }
        more = count < reps || (MPI_Wtime() - start < span && count < 1000000); // rank 0 decides for all
        MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
    double m = 0;
    for (int i = 0; i < count; i++) m += t[i] / count;
    *med = median(t, count);
    free(t);
    return m;
}

int main(int argc, char** argv) {
    dist_init(&argc, &argv);
    if (world_size < 2) fatal("tools/pingpong needs 2 ranks or more (it measures between the first and the last)");
    int big = 1024 * 1024, peer = world_size - 1;
    char* buf = callocCheck(big, 1);
    double small, large;
    double alpha = round_trip(buf, 8, 200, 1.0, peer, &small) / 2;
    round_trip(buf, big, 9, 0, peer, &large);
    double wire = (large - small) / 2; // a one-way 1 MiB message, less a small one's
    double beta = big / (wire > 1e-9 ? wire : 1e-9);
    if (world_rank == 0) printf("alpha=%.3e beta=%.4e\n", alpha, beta);
    free(buf);
    MPI_Finalize();
    return 0;
}
