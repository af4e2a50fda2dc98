/*
 * bench/bench.c: the yardsticks and probes of the benchmark (bench/run.sh runs it; the
 * programs themselves never link OpenBLAS).
 *
 *   bench/bench naive --emb 64 --hidden 1024 --batch 256 --steps 20
 *       times a straightforward triple-loop version of one training step of the model
 *       (forward, backward, SGD; plain float loops, no tiling, no exact sums)
 *   bench/bench sgemm --emb 64 --hidden 1024 --batch 256 --steps 20
 *       times OpenBLAS sgemm on exactly the matrix shapes of one training step (the
 *       forward, weight-gradient and input-gradient product of every linear layer)
 *   bench/bench kernels --emb 64 --hidden 1024 --batch 256 --steps 20
 *       times model.h's kernels, one at a time, on the products of linear 1: each exact
 *       product beside the float version of it, and sgemm, to show what exactness costs;
 *       then each kernel's tile alone, on operands that stay in cache
 *   bench/bench step [--model gpt] [--emb ...] --steps 20
 *       times train.c's step (model_forward, model_backward, the optimizer) in CPU time
 *   bench/bench ops --model gpt [--emb C] --steps 20
 *       the GPT's step op by op, in CPU time, in the categories bench/torch_step.py
 *       --profile uses for PyTorch's
 *   bench/bench exact --model gpt [--emb C] --steps 20
 *       each op of the GPT that sums exactly, beside a float twin with the same loops
 *   bench/bench expf [--all]
 *       kernels.h's expf_array timed beside the C library's expf (--all: compared on every float)
 *   bench/bench peak
 *       measures the peak float32 FLOP/s of one core: independent chains of vector fused
 *       multiply-adds, as wide as the compiler's -march allows, that never wait for each
 *       other (the best of 5 tries)
 *
 * naive and sgemm print "ms_per_step X" (the median over --steps repetitions after one
 * warm-up, wall clock); step prints "cpu_ms_per_step X"; kernels prints a table of medians.
 */
#include "../model.h"
#include "../optim.h"

#include <cblas.h>

// This thread's CPU time: on a shared machine, the time another process holds the core is not
// counted (the kernels table, the peak, and the GPT's ops use it; naive and sgemm, compared
// with the programs' own per-step times, keep the wall clock as they do).
static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

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

// Median milliseconds (CPU time) of `steps` runs of STMT (TIMED), after one warm-up (MEDIAN_MS).
#define TIMED(result, steps, STMT)                                  \
    do {                                                            \
        double* t_ = mallocCheck(sizeof(double) * (steps));        \
        for (int i_ = 0; i_ < (steps); i_++) {                      \
            double t0_ = cpu_seconds();                             \
            STMT;                                                   \
            t_[i_] = 1e3 * (cpu_seconds() - t0_);                   \
        }                                                           \
        (result) = median(t_, (steps));                             \
        free(t_);                                                   \
    } while (0)
#define MEDIAN_MS(result, steps, STMT) \
    do {                               \
        STMT;                          \
        TIMED(result, steps, STMT);    \
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
    MEDIAN_MS(ms[0], steps, for (int k = 0; k < CALLS; k++) matmul_exact_tile(acc, block, panel, RED, ME_COLS, ME_ROWS, ME_COLS, 1));
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

// ----------------------------------------------------------------------------
// the GPT's step, op by op (bench/bench gpt --emb C): train.c's forward, backward and AdamW
// step on makemore's configuration (4 blocks, 4 heads, T 16, 32 rows), written out as the
// list of transformer.h's and model.h's ops that model_forward and model_backward run, each
// call timed. Each op belongs to a category that bench/torch_step.py --profile uses too, so
// the two splits stand side by side (bench/run.sh, docs/performance.md). To show that the
// list is the step, the real step (model_forward, model_backward, optimizer_step) is timed
// in the same run, interleaved: both totals are printed.

#define GPT_OPS_MAX 64
typedef struct {
    const char *name[GPT_OPS_MAX], *cat[GPT_OPS_MAX];
    double* ms[GPT_OPS_MAX]; // [steps] this op's time in each step (summed over its calls)
    int n, steps, step;
    double clock; // ms of an empty window
} OpTimes;
static int op_index(OpTimes* o, const char* cat, const char* name) {
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->name[i], name)) return i;
    if (o->n == GPT_OPS_MAX) fatal("internal: more than %d ops", GPT_OPS_MAX);
    o->name[o->n] = name, o->cat[o->n] = cat, o->ms[o->n] = callocCheck((size_t)o->steps, sizeof(double));
    return o->n++;
}
// OP(category, name, statement): the statement timed, its time added to the op's in this step
// Times are this thread's CPU time (cpu_seconds, above). Reading that clock is a system call
// (about 2 us under KVM), part of which falls inside each op's window: the empty window's
// median (clock_ms) is taken off every op.
static double clock_ms(void) {
    double d[1001];
    for (int i = 0; i < 1001; i++) {
        double t = cpu_seconds();
        d[i] = 1e3 * (cpu_seconds() - t);
    }
    return median(d, 1001);
}
#define OP(cat, name, ...)                                                                         \
    do {                                                                                           \
        double t0_ = cpu_seconds();                                                                \
        __VA_ARGS__;                                                                               \
        double t1_ = cpu_seconds();                                                                \
        if (ops->step >= 0) ops->ms[op_index(ops, cat, name)][ops->step] += 1e3 * (t1_ - t0_) - ops->clock; \
    } while (0)
#define MM_FLOAT "products, float"
#define MM_EXACT "products, exact"

// One training step through the ops, as train.c runs it (model.h's gpt_unit_* and
// transformer.h's block_* functions, spelled out).
static void gpt_step_ops(OpTimes* ops, const Config* c, State* st, Work* w, const Optimizer* opt, long step) {
    int R = w->acts.rows, L = c->layers, C = c->emb, V = c->vocab;
    BlockDims d = gpt_dims(c, R);
    long N = (long)R * d.Tq, terms = N, A = d.A, F = d.F, np = n_params(c);
    Acts* a = &w->acts;
    Scratch* s = &w->scratch;
    Workspace* ws = &w->ws;
    const float* P = st->params;
    int64_t* G = st->grads;
    // forward
    OP("embedding", "embedding forward",
       gpt_embedding_forward(a->out[0], a->tokens, P, P + (long)V * C, 0, V, 1, &d));
    for (int u = 1; u <= L; u++) {
        BlockParams p = block_params(P + unit_offset(c, u), &d);
        BlockActs b = block_acts(a->saved[u], &d, R);
        const float* x = a->out[u - 1];
        float* out = a->out[u];
        OP("LayerNorm", "ln1 forward", layernorm_forward(b.ln1, b.ln1_mean, b.ln1_rstd, x, p.ln1_g, p.ln1_b, N, C));
        OP(MM_FLOAT, "qkv forward", linear_forward(b.qkv, b.ln1, p.qkv_w, p.qkv_b, (int)N, C, 3 * (int)A, ws));
        { // attention_forward, pass by pass
            long rh = (long)R * d.NH * d.Tq, ld = 3 * A;
            float *rowmax = s->tmp, *kT = s->tmp + rh;
            int64_t *expsum = s->acc, *pv = s->acc + rh;
            int kpos[d.T];
            for (int t = 0; t < d.T; t++) kpos[t] = t;
            OP("attention", "attention forward: scores and row max (pass 1)",
               for (long i = 0; i < rh; i++) rowmax[i] = -INFINITY;
               attention_scores(b.att, rowmax, b.qkv, ld, b.qkv + A, ld, kpos, d.T, &d, kT));
            OP("attention", "attention forward: exp, exact sums of e and e v (pass 2)",
               fix_zero(expsum, rh), fix_zero(pv, N * A);
               attention_exp_pv(b.att, expsum, pv, rowmax, b.qkv + 2 * A, ld, kpos, d.T, &d, d.T));
            OP("attention", "attention forward: P = e / S, y = sum / S", attention_finish(b.att, b.atty, A, expsum, pv, &d));
        }
        OP(MM_EXACT, "proj forward", linear_forward_exact(b.x1, s->acc, b.atty, p.proj_w, p.proj_b, (int)N, (int)A, C, ws));
        OP("residuals and copies", "residual 1", for (long i = 0; i < N * C; i++) b.x1[i] += x[i]);
        OP("LayerNorm", "ln2 forward", layernorm_forward(b.ln2, b.ln2_mean, b.ln2_rstd, b.x1, p.ln2_g, p.ln2_b, N, C));
        OP(MM_FLOAT, "fc forward", linear_forward(b.fc, b.ln2, p.fc_w, p.fc_b, (int)N, C, (int)F, ws));
        OP("GELU", "gelu forward", gelu_forward(b.gelu, b.fc, N * F));
        OP(MM_EXACT, "fc2 forward", linear_forward_exact(out, s->acc, b.gelu, p.fc2_w, p.fc2_b, (int)N, (int)F, C, ws));
        OP("residuals and copies", "residual 2", for (long i = 0; i < N * C; i++) out[i] += b.x1[i]);
    }
    const float* hw = P + unit_offset(c, L + 1);
    float *ln = gpt_head_saved(c, a, 0), *lmean = gpt_head_saved(c, a, 1), *lrstd = gpt_head_saved(c, a, 2);
    OP("LayerNorm", "ln_f forward", layernorm_forward(ln, lmean, lrstd, a->out[L], hw + (long)C * V, hw + (long)C * V + C, N, C));
    OP(MM_FLOAT, "lm_head forward", linear_forward(a->out[L + 1], ln, hw, NULL, (int)N, C, V, ws));
    OP("loss", "cross-entropy forward",
       a->loss = xent_forward(a->out[L + 1], a->expsum, a->rowmax, a->tlogit, a->targets, (int)N, V, N));
    // backward
    OP("optimizer", "zero the gradient sums", fix_zero(G, np));
    { // the head
        int64_t* hg = G + unit_offset(c, L + 1);
        float *dlogits = s->stash, *dln = s->stash + N * V;
        OP("loss", "cross-entropy backward", xent_backward(dlogits, a->out[L + 1], a->targets, (int)N, V, 0));
        OP(MM_EXACT, "lm_head input gradient", linear_backward_input_exact(dln, s->acc, dlogits, hw, (int)N, C, V, ws));
        OP("LayerNorm", "ln_f backward", layernorm_backward_input(s->din, NULL, dln, a->out[L], lmean, lrstd, hw + (long)C * V, N, C));
        OP(MM_EXACT, "lm_head weight gradient", linear_backward_weight(hg, NULL, ln, dlogits, (int)N, C, V, terms, ws));
        OP("LayerNorm", "ln_f parameter gradients",
           layernorm_backward_params(hg + (long)C * V, hg + (long)C * V + C, dln, a->out[L], lmean, lrstd, N, C, terms));
        scratch_step_down(s);
    }
    for (int u = L; u >= 1; u--) {
        BlockParams p = block_params(P + unit_offset(c, u), &d);
        BlockGrads g = block_grads(G + unit_offset(c, u), &d);
        BlockActs b = block_acts(a->saved[u], &d, R);
        BlockStash sh = block_stash(s->stash, &d, R);
        const float *x = a->out[u - 1], *dout = s->dout;
        float *dx = s->din, *dh = s->tmp, *small = s->tmp + N * (F > A ? F : A);
        OP("residuals and copies", "copy of the block's output gradient", memcpy(sh.dx2, dout, (size_t)N * C * sizeof(float)));
        OP(MM_FLOAT, "fc2 input gradient", linear_backward_input(dh, dout, p.fc2_w, (int)N, (int)F, C, ws));
        OP("GELU", "gelu backward", gelu_backward(sh.dfc, b.fc, dh, N * F));
        OP(MM_EXACT, "fc input gradient", linear_backward_input_exact(sh.dln2, s->acc, sh.dfc, p.fc_w, (int)N, C, (int)F, ws));
        OP("LayerNorm", "ln2 backward", layernorm_backward_input(sh.dx1, dout, sh.dln2, b.x1, b.ln2_mean, b.ln2_rstd, p.ln2_g, N, C));
        OP(MM_FLOAT, "proj input gradient", linear_backward_input(dh, sh.dx1, p.proj_w, (int)N, (int)A, C, ws));
        { // attention_backward, step by step
            long ld = 3 * A;
            float *D = small, *vT = small + (long)R * d.NH * d.Tq;
            int64_t *dq = s->acc, *dk = s->acc + N * A, *dv = s->acc + 2 * N * A;
            int kpos[d.T];
            for (int t = 0; t < d.T; t++) kpos[t] = t;
            OP("attention", "attention backward: D = dO . O", fix_zero(s->acc, 3 * N * A); attention_backward_d(D, dh, b.atty, A, &d));
            OP("attention", "attention backward: exact dq, dk, dv",
               attention_backward_block(dq, dk, dv, b.att, D, b.qkv, ld, b.qkv + A, ld, b.qkv + 2 * A, ld, dh, A, kpos, d.T, &d, vT, d.T));
            OP("attention", "attention backward: dq, dk, dv to floats",
               for (long t = 0; t < N; t++) for (int e = 0; e < A; e++) {
                   sh.dqkv[t * ld + e] = (float)fix_to(dq[t * A + e]);
                   sh.dqkv[t * ld + A + e] = (float)fix_to(dk[t * A + e]);
                   sh.dqkv[t * ld + 2 * A + e] = (float)fix_to(dv[t * A + e]);
               });
        }
        OP(MM_EXACT, "qkv input gradient", linear_backward_input_exact(sh.dln1, s->acc, sh.dqkv, p.qkv_w, (int)N, C, 3 * (int)A, ws));
        OP("LayerNorm", "ln1 backward", layernorm_backward_input(dx, sh.dx1, sh.dln1, x, b.ln1_mean, b.ln1_rstd, p.ln1_g, N, C));
        OP(MM_EXACT, "fc2 weight gradient", linear_backward_weight(g.fc2_w, g.fc2_b, b.gelu, sh.dx2, (int)N, (int)F, C, terms, ws));
        OP(MM_EXACT, "fc weight gradient", linear_backward_weight(g.fc_w, g.fc_b, b.ln2, sh.dfc, (int)N, C, (int)F, terms, ws));
        OP("LayerNorm", "ln2 parameter gradients",
           layernorm_backward_params(g.ln2_g, g.ln2_b, sh.dln2, b.x1, b.ln2_mean, b.ln2_rstd, N, C, terms));
        OP(MM_EXACT, "proj weight gradient", linear_backward_weight(g.proj_w, g.proj_b, b.atty, sh.dx1, (int)N, (int)A, C, terms, ws));
        OP(MM_EXACT, "qkv weight gradient", linear_backward_weight(g.qkv_w, g.qkv_b, b.ln1, sh.dqkv, (int)N, C, 3 * (int)A, terms, ws));
        OP("LayerNorm", "ln1 parameter gradients",
           layernorm_backward_params(g.ln1_g, g.ln1_b, sh.dln1, x, b.ln1_mean, b.ln1_rstd, N, C, terms));
        scratch_step_down(s);
    }
    OP("embedding", "embedding backward",
       gpt_embedding_backward(G, G + (long)V * C, a->tokens, s->dout, 0, V, &d, terms));
    scratch_step_down(s); // as model_backward leaves it
    OP("optimizer", "AdamW", optimizer_step(opt, st->params, G, st->m, st->v, np, grad_factor(N), 1.0f, step));
}

// The same step through model.h's own functions, as train.c calls them (SGD for the MLP,
// AdamW for the GPT).
static void model_step(const Config* c, State* st, Work* w, const Optimizer* opt, long step) {
    long R = w->acts.rows, N = R * targets_per_row(c), np = n_params(c);
    model_forward(c, st->params, w, (int)R, R);
    fix_zero(st->grads, np);
    model_backward(c, st->params, st->grads, w, (int)R, R);
    optimizer_step(opt, st->params, st->grads, st->m, st->v, np, grad_factor(N), 1.0f, step);
}

// A model's parameters and activations for `rows` rows, with tokens and targets as
// torch_step.py draws them (the GPT's: names of 11 letters and a stop, then padding).
static void model_setup(const Config* c, int R, State* st, Work* w, Optimizer* opt) {
    long np = n_params(c);
    *st = state_alloc(np, is_gpt(c));
    for (int u = 0; u < n_units(c); u++) unit_init(st->params + unit_offset(c, u), c, u, 42);
    work_init(w, c, R, NULL);
    int T = c->context;
    for (int i = 0; i < R * T; i++) {
        int t = i % T;
        w->acts.tokens[i] = is_gpt(c) && (t == 0 || t > 12) ? 0 : 1 + (int)(rng_u64(8, 0, i) % 26);
        if (is_gpt(c)) w->acts.targets[i] = t < 11 ? 1 + (int)(rng_u64(8, 0, i + 1) % 26) : t == 11 ? 0 : -1;
    }
    for (int r = 0; !is_gpt(c) && r < R; r++) w->acts.targets[r] = (int)(rng_u64(9, 0, r) % 27);
    w->acts.training = 1;
    *opt = is_gpt(c) ? (Optimizer){.adamw = 1, .lr = 5e-4f, .weight_decay = 0.01f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f}
                     : (Optimizer){.lr = 0.1f};
}

// bench/bench step: train.c's step (model_step) in CPU time, the median over `steps` after
// one warm-up; prints cpu_ms_per_step.
static void step_cpu(const Config* c, int R, int steps) {
    State st;
    Work w;
    Optimizer opt;
    model_setup(c, R, &st, &w, &opt);
    double* ms = mallocCheck(sizeof(double) * steps);
    model_step(c, &st, &w, &opt, 1);
    for (int i = 0; i < steps; i++) {
        double t = cpu_seconds();
        model_step(c, &st, &w, &opt, 2 + i);
        ms[i] = 1e3 * (cpu_seconds() - t);
    }
    printf("cpu_ms_per_step %.6f\n", median(ms, steps));
    free(ms);
    work_free(&w);
    state_free(&st);
}

static void gpt_ops(int C, int steps) {
    Config c = {.model = MODEL_GPT, .heads = 4, .vocab = 27, .context = 16, .emb = C, .layers = 4, .hidden = 4 * C};
    State st;
    Work w;
    Optimizer opt;
    model_setup(&c, 32, &st, &w, &opt);
    OpTimes ops = {.steps = steps, .step = -1, .clock = clock_ms()};
    double* whole = mallocCheck(sizeof(double) * steps);
    gpt_step_ops(&ops, &c, &st, &w, &opt, 1); // warm-up, untimed
    model_step(&c, &st, &w, &opt, 2);
    for (int i = 0; i < steps; i++) {
        ops.step = i;
        gpt_step_ops(&ops, &c, &st, &w, &opt, 3 + 2 * i);
        double t = cpu_seconds();
        model_step(&c, &st, &w, &opt, 4 + 2 * i);
        whole[i] = 1e3 * (cpu_seconds() - t);
    }
    double sum = 0.0;
    for (int i = 0; i < ops.n; i++) {
        double m = median(ops.ms[i], steps);
        sum += m;
        printf("op|%s|%s|%.4f\n", ops.cat[i], ops.name[i], m);
        free(ops.ms[i]);
    }
    printf("ops_sum_ms %.4f\ncpu_ms_per_step %.6f\n", sum, median(whole, steps));
    free(whole);
    work_free(&w);
    state_free(&st);
}

// ----------------------------------------------------------------------------
// what exactness costs, op by op (bench/bench exact --model gpt --emb C): each op of the GPT's
// step that sums exactly, timed beside a float twin written here with the same loops, whose
// sums are float chains (the bits a layout would change, which is why train.c does not use
// them). CPU time, the median of `steps` runs each, on the activations of a real step.

// attention_exp_pv's twin: e = exp(s - max), S and e v summed in float
static void exp_pv_float(float* att, float* expsum, float* acc, const float* rowmax, const float* v, long ldv,
                         const BlockDims* d) {
    for (int r = 0; r < d->R; r++)
        for (int h = 0; h < d->NH; h++)
            for (int i = 0; i < d->Tq; i++) {
                long rhi = ((long)r * d->NH + h) * d->Tq + i;
                float* srow = att + rhi * d->T;
                float* a = acc + ((long)r * d->Tq + i) * d->A + h * d->HD;
                for (int j = 0; j <= i; j++) {
                    float e = expf(srow[j] - rowmax[rhi]);
                    const float* vj = v + ((long)r * d->T + j) * ldv + h * d->HD;
                    srow[j] = e;
                    expsum[rhi] += e;
                    for (int x = 0; x < d->HD; x++) a[x] = fmaf(e, vj[x], a[x]);
                }
            }
}
// attention_backward_block's twin: dq, dk, dv summed in float
static void attention_backward_float(float* dq, float* dk, float* dv, const float* att, const float* D, const float* qkv,
                                     long ld, const float* dy, const BlockDims* d, float* vT) {
    float scale = 1.0f / sqrtf((float)d->HD);
    const float *k = qkv + d->A, *v = qkv + 2 * d->A;
    for (int r = 0; r < d->R; r++)
        for (int h = 0; h < d->NH; h++) {
            for (int j = 0; j < d->T; j++)
                for (int e = 0; e < d->HD; e++) vT[(long)e * d->T + j] = v[((long)r * d->T + j) * ld + h * d->HD + e];
            for (int i = 0; i < d->Tq; i++) {
                long rhi = ((long)r * d->NH + h) * d->Tq + i;
                const float *prow = att + rhi * d->T, *qi = qkv + ((long)r * d->Tq + i) * ld + h * d->HD;
                const float* dyi = dy + ((long)r * d->Tq + i) * d->A + h * d->HD;
                float* dqi = dq + ((long)r * d->Tq + i) * d->A + h * d->HD;
                int n = i + 1;
                float dp[n];
                for (int j = 0; j < n; j++) dp[j] = 0.0f;
                for (int e = 0; e < d->HD; e++)
                    for (int j = 0; j < n; j++) dp[j] = fmaf(dyi[e], vT[(long)e * d->T + j], dp[j]);
                for (int j = 0; j < n; j++) {
                    float P = prow[j], ds = P * (dp[j] - D[rhi]) * scale;
                    const float* kj = k + ((long)r * d->T + j) * ld + h * d->HD;
                    float *dkj = dk + ((long)r * d->T + j) * d->A + h * d->HD, *dvj = dv + ((long)r * d->T + j) * d->A + h * d->HD;
                    for (int x = 0; x < d->HD; x++) {
                        dqi[x] = fmaf(ds, kj[x], dqi[x]);
                        dkj[x] = fmaf(ds, qi[x], dkj[x]);
                        dvj[x] = fmaf(P, dyi[x], dvj[x]);
                    }
                }
            }
        }
}
// layernorm_backward_params's twin
static void layernorm_params_float(float* dg, float* db, const float* dy, const float* x, const float* mean,
                                   const float* rstd, long N, int C) {
    for (long n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            float xhat = (x[n * C + c] - mean[n]) * rstd[n];
            dg[c] = fmaf(dy[n * C + c], xhat, dg[c]);
            db[c] += dy[n * C + c];
        }
}


static void exact_cost(int C, int steps) {
    Config c = {.model = MODEL_GPT, .heads = 4, .vocab = 27, .context = 16, .emb = C, .layers = 4, .hidden = 4 * C};
    State st;
    Work w;
    Optimizer opt;
    model_setup(&c, 32, &st, &w, &opt);
    model_step(&c, &st, &w, &opt, 1); // the activations and gradients of a real step
    int R = 32;
    BlockDims d = gpt_dims(&c, R);
    long N = (long)R * d.Tq, A = d.A, F = d.F, ld = 3 * A, rh = (long)R * d.NH * d.Tq;
    BlockActs b = block_acts(w.acts.saved[1], &d, R);
    BlockParams p = block_params(st.params + unit_offset(&c, 1), &d);
    Workspace* ws = &w.ws;
    float *f1 = callocCheck((size_t)N * F * 4 + rh * 2 + 1024, sizeof(float)), *rowmax = w.scratch.tmp, *kT = w.scratch.tmp + rh;
    int64_t* acc = w.scratch.acc;
    int kpos[16];
    for (int t = 0; t < 16; t++) kpos[t] = t;
    float *dy = mallocCheck(sizeof(float) * N * F), *out = mallocCheck(sizeof(float) * N * F);
    for (long i = 0; i < N * F; i++) dy[i] = (float)((rng_uniform(11, 0, i) - 0.5) * 1e-3);
    int64_t* g = callocCheck((size_t)F * C + F, sizeof(int64_t));
    float* gf = callocCheck((size_t)F * C + F, sizeof(float));
    double e[16], f[16];
    const char* what[16];
    int n = 0;
    // products, at each of the block's shapes: exact as train.c computes them, and float
    const struct { const char* name; int K, J; const float* in; const float* w; } L[] = {
        {"qkv", C, 3 * (int)A, b.ln1, p.qkv_w}, {"proj", (int)A, C, b.atty, p.proj_w},
        {"fc", C, (int)F, b.ln2, p.fc_w}, {"fc2", (int)F, C, b.gelu, p.fc2_w}};
    for (int l = 0; l < 4; l++) {
        int K = L[l].K, J = L[l].J;
        double fe, ff, we, wf, ie, iF;
        TIMED(fe, steps, linear_forward_exact(out, acc, L[l].in, L[l].w, NULL, (int)N, K, J, ws));
        TIMED(ff, steps, linear_forward(out, L[l].in, L[l].w, NULL, (int)N, K, J, ws));
        TIMED(we, steps, linear_backward_weight(g, g + (long)K * J, L[l].in, dy, (int)N, K, J, N, ws));
        TIMED(wf, steps, (transpose(ws->tr, L[l].in, (int)N, K), matmul_float(gf, ws->tr, dy, K, (int)N, J, ws)));
        TIMED(ie, steps, linear_backward_input_exact(out, acc, dy, L[l].w, (int)N, K, J, ws));
        TIMED(iF, steps, linear_backward_input(out, dy, L[l].w, (int)N, K, J, ws));
        printf("product|%s forward (%ldx%dx%d)|%.4f|%.4f\n", L[l].name, N, K, J, fe, ff);
        printf("product|%s weight gradient|%.4f|%.4f\n", L[l].name, we, wf);
        printf("product|%s input gradient|%.4f|%.4f\n", L[l].name, ie, iF);
    }
    // attention's exact sums
    for (long i = 0; i < rh; i++) rowmax[i] = -INFINITY;
    attention_scores(b.att, rowmax, b.qkv, ld, b.qkv + A, ld, kpos, d.T, &d, kT);
    float* scores = mallocCheck(sizeof(float) * rh * d.T);
    memcpy(scores, b.att, sizeof(float) * rh * d.T);
    what[n] = "attention forward: exp, sums of e and e v (pass 2)";
    TIMED(e[n], steps, (memcpy(b.att, scores, sizeof(float) * rh * d.T), fix_zero(acc, rh + N * A),
                        attention_exp_pv(b.att, acc, acc + rh, rowmax, b.qkv + 2 * A, ld, kpos, d.T, &d, d.T)));
    TIMED(f[n], steps, (memcpy(b.att, scores, sizeof(float) * rh * d.T), memset(f1, 0, sizeof(float) * (rh + N * A)),
                        exp_pv_float(b.att, f1, f1 + rh, rowmax, b.qkv + 2 * A, ld, &d)));
    n++;
    attention_finish(b.att, b.atty, A, acc, acc + rh, &d);
    float* D = mallocCheck(sizeof(float) * rh);
    attention_backward_d(D, dy, b.atty, A, &d);
    what[n] = "attention backward: dq, dk, dv";
    TIMED(e[n], steps, (fix_zero(acc, 3 * N * A), attention_backward_block(acc, acc + N * A, acc + 2 * N * A, b.att, D, b.qkv, ld,
                        b.qkv + A, ld, b.qkv + 2 * A, ld, dy, A, kpos, d.T, &d, kT, d.T)));
    TIMED(f[n], steps, (memset(f1, 0, sizeof(float) * 3 * N * A),
                        attention_backward_float(f1, f1 + N * A, f1 + 2 * N * A, b.att, D, b.qkv, ld, dy, &d, kT)));
    n++;
    what[n] = "LayerNorm gain and bias gradients";
    TIMED(e[n], steps, layernorm_backward_params(g, g + C, dy, b.x1, b.ln2_mean, b.ln2_rstd, N, C, N));
    TIMED(f[n], steps, layernorm_params_float(gf, gf + C, dy, b.x1, b.ln2_mean, b.ln2_rstd, N, C));
    n++;
    what[n] = "a bias gradient (fc's, F wide)";
    TIMED(e[n], steps, for (long r = 0; r < N; r++) fix_add(g, dy + r * F, F, N, "bias"));
    TIMED(f[n], steps, for (long r = 0; r < N; r++) for (int j = 0; j < F; j++) gf[j] += dy[r * F + j]);
    n++;
    for (int i = 0; i < n; i++) printf("op|%s|%.4f|%.4f\n", what[i], e[i], f[i]);
    free(f1), free(dy), free(out), free(g), free(gf), free(scores), free(D);
    work_free(&w);
    state_free(&st);
}

// ----------------------------------------------------------------------------
// kernels.h's expf_array against the C library's expf (bench/bench expf [--all]): plain, both
// timed on N(0, 9) inputs; --all compares them on all 2^32 floats (0 differ on glibc 2.36,
// Debian 12, whose expf is __expf_fma on a CPU with FMA).
static void expf_bench(int all) {
    enum { B = 1 << 16 };
    static float x[B], a[B], b[B];
    if (all) {
        unsigned long long differ = 0;
        for (uint64_t base = 0; base < (1ull << 32); base += B) {
            for (int i = 0; i < B; i++) {
                uint32_t u = (uint32_t)(base + (uint64_t)i);
                memcpy(&x[i], &u, sizeof u);
            }
            expf_array(b, x, B);
            for (int i = 0; i < B; i++) {
                a[i] = expf(x[i]);
                differ += memcmp(&a[i], &b[i], sizeof a[i]) != 0;
            }
        }
        printf("expf_array and expf differ on %llu of the 2^32 floats\n", differ);
        return;
    }
    for (int i = 0; i < B; i++) x[i] = (float)(3.0 * rng_normal(12, 0, i));
    double ta[21], tb[21];
    for (int k = 0; k < 21; k++) {
        double t = cpu_seconds();
        for (int i = 0; i < B; i++) a[i] = expf(x[i]);
        ta[k] = cpu_seconds() - t;
        t = cpu_seconds();
        expf_array(b, x, B);
        tb[k] = cpu_seconds() - t;
    }
    printf("expf %.3f ns an element, expf_array %.3f (CPU time, medians of 21 x 65536 N(0, 9) inputs), %s\n",
           1e9 * median(ta, 21) / B, 1e9 * median(tb, 21) / B, memcmp(a, b, sizeof a) ? "DIFFERENT" : "the same bits");
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
// One register's floats: 16 with AVX-512, 8 with AVX, 4 otherwise (a wider vector would not
// fit the register OPAQUE names, and the asm could not be built).
#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float fvec __attribute__((vector_size(4 * LANES)));
EXACT_KERNEL static double peak_once(void) { // EXACT_KERNEL: fused multiply-adds (kernels.h)
    EXACT_KERNEL_BODY
    const long iters = 20000000;
    fvec acc[CHAINS], x, y;
    for (int l = 0; l < LANES; l++) x[l] = 1.0f - 1e-7f * l, y[l] = 1e-7f;
    for (int c = 0; c < CHAINS; c++) {
        acc[c] = x * (float)c; // each chain its own start, opaque: the compiler cannot merge them
        OPAQUE(acc[c]);
    }
    double t = cpu_seconds();
    for (long k = 0; k < iters; k++) {
        for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * x + y;
        OPAQUE(x);
    }
    double flops = 2.0 * LANES * CHAINS * iters / (cpu_seconds() - t);
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
    if (argc >= 2 && !strcmp(argv[1], "expf")) {
        expf_bench(argc == 3 && !strcmp(argv[2], "--all"));
        return 0;
    }
    int gpt = 0;
    if (argc < 2 || (strcmp(argv[1], "naive") && strcmp(argv[1], "sgemm") && strcmp(argv[1], "kernels") &&
                     strcmp(argv[1], "ops") && strcmp(argv[1], "step") && strcmp(argv[1], "exact"))) {
        fprintf(stderr, "usage: bench/bench peak, or bench/bench naive|sgemm|kernels|step [--context T] [--emb E] [--hidden H] [--layers L] "
                        "[--batch B] [--steps N], or bench/bench step|ops|exact --model gpt [--emb C] [--layers L] [--steps N]\n");
        return 2;
    }
    for (int i = 2; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--model") && (!strcmp(argv[i + 1], "gpt") || !strcmp(argv[i + 1], "mlp"))) gpt = !strcmp(argv[i + 1], "gpt");
        else if (!strcmp(argv[i], "--context")) s.T = v;
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
    if (gpt || !strcmp(argv[1], "ops")) { // the GPT: --emb is its width C (default 64), --layers its blocks
        Config c = {.model = MODEL_GPT, .heads = 4, .vocab = 27, .context = 16, .emb = s.E == 16 ? 64 : s.E,
                    .layers = s.L == 1 ? 4 : s.L};
        c.hidden = 4 * c.emb;
        if (!strcmp(argv[1], "ops")) gpt_ops(c.emb, steps);
        else if (!strcmp(argv[1], "exact")) exact_cost(c.emb, steps);
        else if (!strcmp(argv[1], "step")) step_cpu(&c, s.B, steps);
        else fatal("bench/bench %s has no --model gpt", argv[1]);
        return 0;
    }
    if (!strcmp(argv[1], "step")) {
        Config c = {.model = MODEL_MLP, .vocab = s.V, .context = s.T, .emb = s.E, .hidden = s.H, .layers = s.L};
        step_cpu(&c, s.B, steps);
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
