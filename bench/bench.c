/*
 * bench/bench.c: the two yardsticks of the benchmark (bench/run.sh runs it; the programs
 * themselves never link OpenBLAS).
 *
 *   bench/bench naive --emb 64 --hidden 1024 --batch 256 --steps 20
 *       times a straightforward triple-loop version of one training step of the model
 *       (forward, backward, SGD; plain float loops, no tiling, no exact sums)
 *   bench/bench sgemm --emb 64 --hidden 1024 --batch 256 --steps 20
 *       times OpenBLAS sgemm on exactly the matrix shapes of one training step (the
 *       forward, weight-gradient and input-gradient product of every linear layer)
 *
 *   bench/bench kernels --emb 64 --hidden 1024 --batch 256 --steps 20
 *       times model.h's kernels, one at a time, on the products of linear 1: each exact
 *       product beside the float version of it, and sgemm, to show what exactness costs;
 *       then each kernel's tile alone, on operands that stay in cache
 *   bench/bench peak
 *       measures the peak float32 FLOP/s of one core: independent chains of vector fused
 *       multiply-adds, as wide as the compiler's -march allows, that never wait for each
 *       other (the best of 5 tries)
 *
 * naive and sgemm print "ms_per_step X" (the median over --steps repetitions after one
 * warm-up); kernels prints a table of medians.
 */
#include "../model.h"

#include <cblas.h>

typedef struct {
    int T, E, H, L, V, B;
} Shape;

static int in_of(const Shape* s, int l) { return l == 1 ? s->T * s->E : s->H; }
static int out_of(const Shape* s, int l) { return l == s->L + 1 ? s->V : s->H; }

// One training step written the obvious way: triple loops over rows, outputs and inputs.
typedef struct {
    Shape s;
    float *emb, *w[MAX_LAYERS + 2], *b[MAX_LAYERS + 2];
    float *gemb, *gw[MAX_LAYERS + 2], *gb[MAX_LAYERS + 2];
    float* x[MAX_LAYERS + 2]; // x[0] embedding output, x[l] output of linear l
    float *dx, *dy;
    int *tok, *tgt;
} Naive;

static void naive_init(Naive* n, Shape s) {
    n->s = s;
    n->emb = mallocCheck(sizeof(float) * s.V * s.E);
    n->gemb = mallocCheck(sizeof(float) * s.V * s.E);
    for (int i = 0; i < s.V * s.E; i++) n->emb[i] = (float)rng_normal(1, 1, i);
    int widest = s.T * s.E > s.H ? s.T * s.E : s.H;
    for (int l = 1; l <= s.L + 1; l++) {
        int K = in_of(&s, l), J = out_of(&s, l);
        n->w[l] = mallocCheck(sizeof(float) * K * J);
        n->gw[l] = mallocCheck(sizeof(float) * K * J);
        n->b[l] = callocCheck(J, sizeof(float));
        n->gb[l] = mallocCheck(sizeof(float) * J);
        for (long i = 0; i < (long)K * J; i++) n->w[l][i] = (float)((rng_uniform(2, l, i) * 2 - 1) / sqrt(K));
    }
    for (int l = 0; l <= s.L + 1; l++) n->x[l] = mallocCheck(sizeof(float) * s.B * (l == 0 ? s.T * s.E : out_of(&s, l)));
    n->dx = mallocCheck(sizeof(float) * s.B * (widest > s.V ? widest : s.V));
    n->dy = mallocCheck(sizeof(float) * s.B * (widest > s.V ? widest : s.V));
    n->tok = mallocCheck(sizeof(int) * s.B * s.T);
    n->tgt = mallocCheck(sizeof(int) * s.B);
    for (int i = 0; i < s.B * s.T; i++) n->tok[i] = (int)(rng_u64(3, 3, i) % s.V);
    for (int i = 0; i < s.B; i++) n->tgt[i] = (int)(rng_u64(4, 4, i) % s.V);
}

static void naive_step(Naive* n, float lr) {
    Shape* s = &n->s;
    int B = s->B, TE = s->T * s->E;
    for (int r = 0; r < B; r++) // embedding
        for (int t = 0; t < s->T; t++)
            for (int e = 0; e < s->E; e++) n->x[0][r * TE + t * s->E + e] = n->emb[n->tok[r * s->T + t] * s->E + e];
    for (int l = 1; l <= s->L + 1; l++) { // linear layers
        int K = in_of(s, l), J = out_of(s, l);
        for (int r = 0; r < B; r++)
            for (int j = 0; j < J; j++) {
                float acc = n->b[l][j];
                for (int k = 0; k < K; k++) acc += n->x[l - 1][r * K + k] * n->w[l][k * J + j];
                n->x[l][r * J + j] = l <= s->L && acc < 0 ? 0 : acc;
            }
    }
    float* logits = n->x[s->L + 1]; // softmax cross-entropy, gradient of the mean loss
    for (int r = 0; r < B; r++) {
        float m = -INFINITY, sum = 0;
        for (int v = 0; v < s->V; v++) m = logits[r * s->V + v] > m ? logits[r * s->V + v] : m;
        for (int v = 0; v < s->V; v++) sum += expf(logits[r * s->V + v] - m);
        for (int v = 0; v < s->V; v++)
            n->dy[r * s->V + v] = (expf(logits[r * s->V + v] - m) / sum - (v == n->tgt[r])) / B;
    }
    for (int l = s->L + 1; l >= 1; l--) { // backward
        int K = in_of(s, l), J = out_of(s, l);
        for (int k = 0; k < K; k++)
            for (int j = 0; j < J; j++) {
                float acc = 0;
                for (int r = 0; r < B; r++) acc += n->x[l - 1][r * K + k] * n->dy[r * J + j];
                n->gw[l][k * J + j] = acc;
            }
        for (int j = 0; j < J; j++) {
            float acc = 0;
            for (int r = 0; r < B; r++) acc += n->dy[r * J + j];
            n->gb[l][j] = acc;
        }
        for (int r = 0; r < B; r++)
            for (int k = 0; k < K; k++) {
                float acc = 0;
                for (int j = 0; j < J; j++) acc += n->dy[r * J + j] * n->w[l][k * J + j];
                n->dx[r * K + k] = l > 1 && n->x[l - 1][r * K + k] <= 0 ? 0 : acc; // through the ReLU below
            }
        float* t = n->dx;
        n->dx = n->dy;
        n->dy = t;
    }
    memset(n->gemb, 0, sizeof(float) * s->V * s->E);
    for (int r = 0; r < B; r++)
        for (int t = 0; t < s->T; t++)
            for (int e = 0; e < s->E; e++) n->gemb[n->tok[r * s->T + t] * s->E + e] += n->dy[r * TE + t * s->E + e];
    for (int i = 0; i < s->V * s->E; i++) n->emb[i] -= lr * n->gemb[i]; // SGD
    for (int l = 1; l <= s->L + 1; l++) {
        int K = in_of(s, l), J = out_of(s, l);
        for (long i = 0; i < (long)K * J; i++) n->w[l][i] -= lr * n->gw[l][i];
        for (int j = 0; j < J; j++) n->b[l][j] -= lr * n->gb[l][j];
    }
}

// The matrix products of one step, through OpenBLAS.
static void sgemm_step(const Shape* s, float* const* m) {
    for (int l = 1; l <= s->L + 1; l++) {
        int K = in_of(s, l), J = out_of(s, l), B = s->B;
        float *x = m[0], *w = m[1], *y = m[2], *dy = m[3], *dw = m[4], *dx = m[5];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, J, K, 1, x, K, w, J, 0, y, J);     // forward
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, J, B, 1, x, K, dy, J, 0, dw, J);     // weight gradient
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, K, J, 1, dy, J, w, J, 0, dx, K);     // input gradient
    }
}

// Median milliseconds of `steps` runs of STMT, after one warm-up.
#define MEDIAN_MS(result, steps, STMT)                             \
    do {                                                           \
        double* t_ = mallocCheck(sizeof(double) * (steps));        \
        STMT;                                                      \
        for (int i_ = 0; i_ < (steps); i_++) {                     \
            double t0_ = now_seconds();                            \
            STMT;                                                  \
            t_[i_] = 1e3 * (now_seconds() - t0_);                  \
        }                                                          \
        (result) = median(t_, (steps));                            \
        free(t_);                                                  \
    } while (0)

// Each kernel's tile alone, 1000 times over the same packed operands (a reduction of 256:
// the exact tile's 4-row block is 8 KB and its panel 64 KB, the float tile's 8 rows 8 KB and
// its panel 32 KB), so that they come from cache: the rate of the inner loop itself, with
// no packing and no memory traffic. The rows are added to the kernels table, in ms per
// 1000 tiles.
static void tiles(int steps) {
    enum { RED = 256, CALLS = 1000 };
    double *block = mallocCheck(sizeof(double) * RED * ME_ROWS), *panel = mallocCheck(sizeof(double) * RED * ME_COLS);
    float *rows = mallocCheck(sizeof(float) * MF_ROWS * RED), *fpanel = mallocCheck(sizeof(float) * RED * MF_COLS);
    int64_t acc[ME_ROWS * ME_COLS] = {0};
    float out[MF_ROWS * MF_COLS];
    const float* arow[MF_ROWS];
    for (long i = 0; i < RED * ME_ROWS; i++) block[i] = (double)(float)(rng_uniform(7, 0, i) - 0.5) * FIX_ONE;
    for (long i = 0; i < RED * ME_COLS; i++) panel[i] = (float)(rng_uniform(7, 1, i) - 0.5);
    for (long i = 0; i < MF_ROWS * RED; i++) rows[i] = (float)(rng_uniform(7, 2, i) - 0.5);
    for (long i = 0; i < RED * MF_COLS; i++) fpanel[i] = (float)(rng_uniform(7, 3, i) - 0.5);
    for (int r = 0; r < MF_ROWS; r++) arow[r] = rows + (long)r * RED;
    cpu_isa();
    double ms[2];
    MEDIAN_MS(ms[0], steps, for (int k = 0; k < CALLS; k++) matmul_exact_tile(acc, block, panel, RED, ME_COLS, ME_ROWS, ME_COLS));
    MEDIAN_MS(ms[1], steps, for (int k = 0; k < CALLS; k++) matmul_float_tile(out, arow, fpanel, RED, MF_COLS, MF_ROWS, MF_COLS));
    printf("| exact tile alone, %d x %d, operands in cache (%d tiles) | %.3f | %.1f |\n", ME_ROWS, ME_COLS, CALLS, ms[0],
           2e-6 * CALLS * ME_ROWS * ME_COLS * RED / ms[0]);
    printf("| float tile alone, %d x %d, operands in cache (%d tiles) | %.3f | %.1f |\n", MF_ROWS, MF_COLS, CALLS, ms[1],
           2e-6 * CALLS * MF_ROWS * MF_COLS * RED / ms[1]);
    if (acc[0] == 12345 && out[0] == 12345.0f) printf("\n"); // uses the results
    free(block), free(panel), free(rows), free(fpanel);
}

// The three products of linear 1 (rows B, inputs K = T*E, outputs J = H), each exact as
// train.c computes it and in plain float (kernels.h's float kernel, after a transpose where
// it needs one), and through sgemm.
static void kernels(const Shape* s, int steps) {
    int B = s->B, K = s->T * s->E, J = s->H;
    float *x = mallocCheck(sizeof(float) * B * K), *w = mallocCheck(sizeof(float) * K * J);
    float *dy = mallocCheck(sizeof(float) * B * J), *y = mallocCheck(sizeof(float) * B * J);
    float *dx = mallocCheck(sizeof(float) * B * K), *dwf = mallocCheck(sizeof(float) * K * J);
    float* xt = mallocCheck(sizeof(float) * B * K);
    int64_t *dw = callocCheck((size_t)K * J, sizeof(int64_t)), *dxt = callocCheck((size_t)B * K, sizeof(int64_t)),
            *dyx = callocCheck((size_t)B * J, sizeof(int64_t));
    for (long i = 0; i < (long)B * K; i++) x[i] = (float)rng_uniform(6, 0, i);
    for (long i = 0; i < (long)K * J; i++) w[i] = (float)((rng_uniform(6, 1, i) * 2 - 1) / sqrt(K));
    for (long i = 0; i < (long)B * J; i++) dy[i] = (float)((rng_uniform(6, 2, i) - 0.5) / B);
    Workspace ws;
    workspace_init(&ws, B, K > J ? K : J, (long)K * J);
    double gflop = 2e-6 * B * K * J, ms[9];
    MEDIAN_MS(ms[0], steps, linear_forward(y, x, w, NULL, B, K, J, &ws));
    MEDIAN_MS(ms[1], steps, linear_forward_exact(y, dyx, x, w, NULL, B, K, J, &ws));
    MEDIAN_MS(ms[2], steps, cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, J, K, 1, x, K, w, J, 0, y, J));
    MEDIAN_MS(ms[3], steps, (transpose(xt, x, B, K), matmul_float(dwf, xt, dy, K, B, J, &ws)));
    MEDIAN_MS(ms[4], steps, linear_backward_weight(dw, NULL, x, dy, B, K, J, B, &ws));
    MEDIAN_MS(ms[5], steps, cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, J, B, 1, x, K, dy, J, 0, dwf, J));
    MEDIAN_MS(ms[6], steps, linear_backward_input(dx, dy, w, B, K, J, &ws));
    MEDIAN_MS(ms[7], steps, linear_backward_input_exact(dx, dxt, dy, w, B, K, J, &ws));
    MEDIAN_MS(ms[8], steps, cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, K, J, 1, dy, J, w, J, 0, dx, K));
    const char* what[9] = {"forward, float (train.c)", "forward, exact (tensor parallel's row-parallel layers)",
                           "forward, sgemm", "weight gradient, float", "weight gradient, exact (train.c)",
                           "weight gradient, sgemm", "input gradient, float", "input gradient, exact (train.c)",
                           "input gradient, sgemm"};
    printf("| product of linear 1 (%d x %d x %d) | ms | GFLOP/s |\n| --- | --- | --- |\n", B, K, J);
    for (int i = 0; i < 9; i++) printf("| %s | %.3f | %.1f |\n", what[i], ms[i], gflop / ms[i]);
    tiles(steps);
    workspace_free(&ws);
    free(x), free(w), free(dy), free(y), free(dx), free(dwf), free(xt), free(dw), free(dxt), free(dyx);
}

// Peak throughput of one core. CHAINS independent accumulators hide the FMA's latency; the
// empty asms keep the compiler from folding the loop or merging chains (it cannot see
// through them).
#define CHAINS 12
#if defined(__x86_64__)
#define OPAQUE(v) __asm__ volatile("" : "+v"(v))
#else
#define OPAQUE(v) __asm__ volatile("" : "+w"(v))
#endif
typedef float f32x16 __attribute__((vector_size(64)));
EXACT_KERNEL static double peak_once(void) { // EXACT_KERNEL: fused multiply-adds (kernels.h)
    EXACT_KERNEL_BODY
    const long iters = 20000000;
    f32x16 acc[CHAINS], x, y;
    for (int l = 0; l < 16; l++) x[l] = 1.0f - 1e-7f * l, y[l] = 1e-7f;
    for (int c = 0; c < CHAINS; c++) {
        acc[c] = x * (float)c; // each chain its own start, opaque: the compiler cannot merge them
        OPAQUE(acc[c]);
    }
    double t = now_seconds();
    for (long k = 0; k < iters; k++) {
        for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * x + y;
        OPAQUE(x);
    }
    double flops = 2.0 * 16 * CHAINS * iters / (now_seconds() - t);
    float sink = 0.0f;
    for (int c = 0; c < CHAINS; c++) sink += acc[c][0];
    if (sink == 12345.0f) printf("\n"); // uses every result: no chain is dead
    return flops;
}
static void peak(void) {
    double best = 0.0; // a peak: the best of 5 tries, each about a quarter of a second
    for (int k = 0; k < 5; k++) {
        double f = peak_once();
        best = f > best ? f : best;
    }
    printf("peak_gflops %.1f\n", best / 1e9);
}

int main(int argc, char** argv) {
    Shape s = {.T = 16, .E = 16, .H = 64, .L = 1, .V = 27, .B = 32};
    int steps = 20;
    if (argc == 2 && !strcmp(argv[1], "peak")) {
        peak();
        return 0;
    }
    if (argc < 2 || (strcmp(argv[1], "naive") && strcmp(argv[1], "sgemm") && strcmp(argv[1], "kernels"))) {
        fprintf(stderr, "usage: bench/bench peak, or bench/bench naive|sgemm|kernels [--context T] [--emb E] [--hidden H] [--layers L] "
                        "[--batch B] [--steps N]\n");
        return 2;
    }
    for (int i = 2; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--context")) s.T = v;
        else if (!strcmp(argv[i], "--emb")) s.E = v;
        else if (!strcmp(argv[i], "--hidden")) s.H = v;
        else if (!strcmp(argv[i], "--layers")) s.L = v;
        else if (!strcmp(argv[i], "--batch")) s.B = v;
        else if (!strcmp(argv[i], "--steps")) steps = v;
        else {
            fprintf(stderr, "bench: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    if (steps < 1) {
        fprintf(stderr, "bench: --steps must be at least 1\n");
        return 2;
    }
    if (!strcmp(argv[1], "kernels")) {
        kernels(&s, steps);
        return 0;
    }
    double* ms = mallocCheck(sizeof(double) * steps);
    if (!strcmp(argv[1], "naive")) {
        Naive n;
        naive_init(&n, s);
        naive_step(&n, 0.1f); // warm-up
        for (int i = 0; i < steps; i++) {
            double t = now_seconds();
            naive_step(&n, 0.1f);
            ms[i] = 1e3 * (now_seconds() - t);
        }
    } else {
        long most = 0;
        for (int l = 1; l <= s.L + 1; l++) {
            long k = in_of(&s, l), j = out_of(&s, l), b = s.B;
            long sizes[] = {b * k, k * j, b * j};
            for (int q = 0; q < 3; q++) most = sizes[q] > most ? sizes[q] : most;
        }
        float* m[6];
        for (int q = 0; q < 6; q++) {
            m[q] = mallocCheck(sizeof(float) * most);
            for (long i = 0; i < most; i++) m[q][i] = (float)rng_uniform(5, q, i) - 0.5f;
        }
        sgemm_step(&s, m); // warm-up
        for (int i = 0; i < steps; i++) {
            double t = now_seconds();
            sgemm_step(&s, m);
            ms[i] = 1e3 * (now_seconds() - t);
        }
    }
    printf("ms_per_step %.6f\n", median(ms, steps));
    return 0;
}
