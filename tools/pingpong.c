/*
 * tools/pingpong.c: a link's latency (alpha) and bandwidth (beta), measured between the
 * first and the last rank of a job, the two numbers of the alpha-beta model that
 * tools/costmodel.c uses: sending n bytes takes alpha + n / beta.
 *
 *   mpirun -n 2 tools/pingpong                               # shared memory
 *   tools/cluster.sh --hosts 2 --link 1gbit -- -n 2 tools/pingpong   # across emulated hosts
 *
 * alpha: half the round trip of an 8-byte message (median of 200). beta: from round trips
 * of 1 MiB messages, after taking alpha off (median of 9). Prints "alpha=SECONDS
 * beta=BYTES_PER_SECOND" on one line.
 */
#include "../dist.h"

// Median seconds of `reps` round trips of n bytes between ranks 0 and `peer`.
static double round_trip(char* buf, int n, int reps, int peer) {
    double* t = mallocCheck(sizeof(double) * reps);
    for (int i = -3; i < reps; i++) { // 3 to warm up
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (world_rank == 0) {
            MPI_Send(buf, n, MPI_CHAR, peer, 1, MPI_COMM_WORLD);
            MPI_Recv(buf, n, MPI_CHAR, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (world_rank == peer) {
            MPI_Recv(buf, n, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, n, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
        }
        if (i >= 0) t[i] = MPI_Wtime() - t0;
    }
    double m = median(t, reps);
    free(t);
    return m;
}

int main(int argc, char** argv) {
    dist_init(&argc, &argv);
    if (world_size < 2) fatal("tools/pingpong needs 2 ranks or more (it measures between the first and the last)");
    int big = 1024 * 1024, peer = world_size - 1;
    char* buf = callocCheck(big, 1);
    double alpha = round_trip(buf, 8, 200, peer) / 2;
    double one_way = round_trip(buf, big, 9, peer) / 2;
    double beta = big / (one_way - alpha > 1e-9 ? one_way - alpha : 1e-9);
    if (world_rank == 0) printf("alpha=%.3e beta=%.4e\n", alpha, beta);
    free(buf);
    MPI_Finalize();
    return 0;
}
