/*
 * model.h: the character-level MLP language model that every program trains.
 *
 *   embedding (V x E) -> flatten (T*E) -> [Linear -> ReLU] x L -> Linear (-> V) -> softmax cross-entropy
 *
 * Contents, in order: configuration; exact sums; matmul kernels; ops (each with a forward
 * and a backward taking the same arguments in the same order: outputs first, then inputs,
 * then dims); parameter layout and initialisation; activations and the whole model as a
 * list of units; optimizers; sampling; checkpoints.
 *
 * Dims legend: R rows (examples) in a batch, T context length, E embedding size,
 * V vocabulary size, H hidden size, L hidden layers, K a linear layer's inputs, J its outputs.
 *
 * Units: the model is a list of L+2 units, the granularity at which a pipeline splits it
 * into stages and at which FSDP gathers it: unit 0 is the embedding, unit l (1 <= l <= L+1)
 * is linear layer l, followed by its ReLU (l <= L) or by the loss (l = L+1).
 */
#ifndef MODEL_H
#define MODEL_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "util.h"

#define MAX_LAYERS 32
// With `make OMP=1` the kernels and the longest loops split across threads; every element
// is still computed by one thread in the same way, and the sums that threads share are
// exact, so any number of threads gives the same bits. A loop enters an OpenMP region only
// when THREADED says it is long enough: entering one costs about a microsecond even when
// its `if` clause keeps it on one thread, about 40 microseconds a step for the small
// default model, which would double its time.
#ifdef _OPENMP
#define THREADED(n) ((n) > 100000L)
#else
#define THREADED(n) 0
#endif

// ----------------------------------------------------------------------------
// configuration

typedef struct {
    int vocab;   // V
    int context; // T
    int emb;     // E
    int hidden;  // H
    int layers;  // L
} Config;

static inline int n_units(const Config* c) { return c->layers + 2; }
static inline int linear_in(const Config* c, int l) { return l == 1 ? c->context * c->emb : c->hidden; }
static inline int linear_out(const Config* c, int l) { return l == c->layers + 1 ? c->vocab : c->hidden; }
// width of unit u's output row: the embedding's is T*E, linear l's is linear_out(l)
static inline int unit_width(const Config* c, int u) { return u == 0 ? c->context * c->emb : linear_out(c, u); }
// parameters of unit u: the embedding table, or a weight [K][J] followed by a bias [J]
static inline long unit_params(const Config* c, int u) {
    return u == 0 ? (long)c->vocab * c->emb : (long)linear_in(c, u) * linear_out(c, u) + linear_out(c, u);
}
static inline long unit_offset(const Config* c, int u) {
    long off = 0;
    for (int v = 0; v < u; v++) off += unit_params(c, v);
    return off;
}
static inline long n_params(const Config* c) { return unit_offset(c, n_units(c)); }
static inline long max_unit_params(const Config* c) {
    long m = 0;
    for (int u = 0; u < n_units(c); u++) m = unit_params(c, u) > m ? unit_params(c, u) : m;
    return m;
}
static inline long max_linear_weight(const Config* c) {
    long m = 0;
    for (int l = 1; l <= c->layers + 1; l++)
        if ((long)linear_in(c, l) * linear_out(c, l) > m) m = (long)linear_in(c, l) * linear_out(c, l);
    return m;
}
static inline int max_width(const Config* c) {
    int m = c->context * c->emb;
    if (c->hidden > m) m = c->hidden;
    if (c->vocab > m) m = c->vocab;
    return m;
}

// Tensor parallelism (train_tp.c) alternates Megatron's pattern: odd linear layers are
// column-parallel, even ones row-parallel. A row-parallel layer splits its forward sum
// over inputs across ranks; a column-parallel layer splits its input-gradient sum over
// outputs. Those two sums are exact (below); the others no layout splits.
static inline int forward_sum_is_split(int l) { return l % 2 == 0; }
static inline int input_grad_sum_is_split(int l) { return l % 2 == 1; }

// ----------------------------------------------------------------------------
// exact sums
//
// Float addition is not associative: a gradient summed over 32 rows differs in its last
// bits from the same gradient summed as 16 + 16 rows, and over thousands of steps the
// difference grows until the generated names differ. So every sum that some layout
// splits (over the batch, across ranks, across microbatches, over a tensor-parallel
// dimension) is accumulated exactly, in fixed point: each term is rounded once to the
// nearest multiple of 2^-40, a rounding that depends on that term alone, and the terms
// are added as 64-bit integers. Integer addition is associative, so the total has the
// same bits whichever rows, ranks, microbatches or threads held which terms, and MPI can
// all-reduce it with MPI_SUM on MPI_INT64_T in any order. It is rounded to float once.
//
// Exact sums: every sum over the batch (weight, bias and embedding gradients, the loss),
// the forward of even linear layers, the input gradient of odd linear layers, the softmax
// denominator and the gradient norm. All other sums are float chains in a fixed order.
//
// Range: a term must satisfy |term| < 2^11 (so the fast conversion below applies) and a
// whole sum must stay below 2^23 (int64 holds 2^63 units of 2^-40), so a sum of n terms
// accepts terms up to min(2^11, 2^23 / n). Values that large mean training has diverged;
// they are a fatal error, never a silent wrap-around.

#define FIX_ONE 0x1p40     // one unit is 2^-40
#define FIX_TERM_MAX 0x1p11
#define FIX_SUM_MAX 0x1p23
#define FIX_BIAS 0x1.8p52  // x + FIX_BIAS rounds x to an integer when |x| < 2^51

static inline int64_t fix_from(double v) { return (int64_t)llrint(v * FIX_ONE); } // needs |v| < 2^23
static inline double fix_to(int64_t a) { return (double)a * (1.0 / FIX_ONE); }
static inline double fix_term_limit(long terms) {
    double lim = FIX_SUM_MAX / (double)(terms > 0 ? terms : 1);
    return lim < FIX_TERM_MAX ? lim : FIX_TERM_MAX;
}
// one term of a sum of `terms` terms, range-checked
static inline int64_t fix_term(double v, long terms, const char* what) {
    if (!(fabs(v) < fix_term_limit(terms)))
        fatal("%s: value %g is %s for an exact sum of %ld terms (limit %g): training has diverged; "
              "lower --lr or use --clip", what, v, isfinite(v) ? "too large" : "not finite", terms,
              fix_term_limit(terms));
    return fix_from(v);
}
static void fix_zero(int64_t* a, long n) { memset(a, 0, (size_t)n * sizeof(int64_t)); }

// The same rounding as fix_from, vectorisable, for |v| < 2^11: v * 2^40 is exact, adding
// 1.5 * 2^52 rounds it to an integer (to nearest, ties to even, like llrint), and the bits
// of that double minus the bits of 1.5 * 2^52 are the integer.
static inline int64_t fix_fast(double v) {
    double t = v * FIX_ONE + FIX_BIAS, bias = FIX_BIAS;
    int64_t bits, bias_bits;
    memcpy(&bits, &t, sizeof bits);
    memcpy(&bias_bits, &bias, sizeof bias_bits);
    return bits - bias_bits;
}
// acc[i] += x[i] as exact terms of a sum of `terms` terms; a fatal error if any is out of range
static void fix_add(int64_t* acc, const float* x, long n, long terms, const char* what) {
    float limit = (float)fix_term_limit(terms);
    int bad = 0;
    for (long i = 0; i < n; i++) {
        bad |= !(fabsf(x[i]) < limit);
        acc[i] += fix_fast(x[i]);
    }
    if (bad)
        for (long i = 0; i < n; i++) fix_term(x[i], terms, what); // stops at the first bad one, with the message
}

// ----------------------------------------------------------------------------
// matmul kernels
//
// Two kernels do all the arithmetic; both compute each output element in one place (one
// register tile), so threads and layouts that split the rows or columns of the output
// never change a bit of it.
//
//   matmul_float: out[m][n] = sum_i a[m][i] * b[i][n], a chain of fused multiply-adds in the
//   order i = 0, 1, ..., red-1 (fmaf is correctly rounded, so the vector and scalar paths
//   agree bit for bit).
//
//   matmul_exact: acc[m][n] += exact sum_i a(m,i) * b(i,n). Operands are first packed into
//   doubles, a scaled by 2^40: a float times a float is exact in double, so
//   fma(a * 2^40, b, 1.5 * 2^52) rounds the product to an integer once, and the bits of
//   that double, minus the bits of 1.5 * 2^52, are the integer. One FMA and one integer
//   add per term: about half the speed of the float kernel, and exact.

typedef struct {
    double* pa; // packed left operand, scaled by 2^40
    double* pb; // packed right operand
    float* tr;  // a transposed weight or output gradient, for the input gradient
    float* pf;  // packed right operand of matmul_float
    long pa_cap, pb_cap, tr_cap, pf_cap;
} Workspace;

// Sizes for any matmul of up to `rows` rows, `width` features and `weight` weight elements.
static void workspace_init(Workspace* ws, long rows, long width, long weight) {
    long most = weight > rows * width ? weight : rows * width; // a weight, or a batch of activations
    long pad = 32 * (rows > width ? rows : width);              // panels round the width up to 32
    ws->pa_cap = ws->tr_cap = most;
    ws->pb_cap = ws->pf_cap = most + pad;
    ws->pa = mallocCheck(ws->pa_cap * sizeof(double));
    ws->pb = mallocCheck(ws->pb_cap * sizeof(double));
    ws->tr = mallocCheck(ws->tr_cap * sizeof(float));
    ws->pf = mallocCheck(ws->pf_cap * sizeof(float));
}
static void workspace_free(Workspace* ws) {
    free(ws->pf);
    free(ws->pa);
    free(ws->pb);
    free(ws->tr);
}

// Vector types (GCC and Clang vector extensions: portable C, lowered to whatever SIMD the
// machine has) for the exact kernels, whose accumulators must stay in registers.
typedef double f64x8 __attribute__((vector_size(64)));
typedef uint64_t u64x8 __attribute__((vector_size(64)));
#define F64X8_SPLAT(x) ((f64x8){(x), (x), (x), (x), (x), (x), (x), (x)}) // a macro: no vector ABI
static inline uint64_t fix_bias_bits(void) {
    double bias = FIX_BIAS;
    uint64_t bits;
    memcpy(&bits, &bias, sizeof bits);
    return bits;
}
// In the exact kernels, a * b + FIX_BIAS has an exact product, so fusing it into one FMA
// gives the same bits as not fusing it: let the compiler fuse there, and only there.
#if defined(__clang__)
#define EXACT_KERNEL
#define EXACT_KERNEL_BODY _Pragma("clang fp contract(fast)")
#else
#define EXACT_KERNEL __attribute__((optimize("fp-contract=fast")))
#define EXACT_KERNEL_BODY
#endif

// Both kernels work on register tiles: a tile of 8 rows of the output, each a few vectors
// wide, is accumulated in registers over the whole reduction, then stored. The right
// operand is first packed into panels as wide as a tile, contiguous and zero-padded
// (rows of a matrix 4 KiB wide would otherwise all fall into the same cache set), and
// rows past the last one read the last row again and are not stored, so every tile is a
// full tile and the compiler generates one tight loop for all of them.

// matmul_float: tiles of 8 rows x 32 columns. The unroll pragmas make the compiler keep
// the 256 accumulators in registers (without them it may interchange the loops and keep
// them in memory, 10 times slower).
#define MF_ROWS 8
#define MF_COLS 32
__attribute__((noinline)) static void matmul_float_tile(float* out, const float* const* arow, const float* panel,
                                                        int red, int N, int mb, int nb) {
    float acc[MF_ROWS][MF_COLS];
    for (int r = 0; r < MF_ROWS; r++)
        for (int c = 0; c < MF_COLS; c++) acc[r][c] = 0.0f;
    for (int i = 0; i < red; i++) {
        const float* bi = panel + (long)i * MF_COLS;
#pragma GCC unroll 8
        for (int r = 0; r < MF_ROWS; r++) {
            float ar = arow[r][i];
#pragma GCC unroll 32
            for (int c = 0; c < MF_COLS; c++) acc[r][c] = fmaf(ar, bi[c], acc[r][c]);
        }
    }
    for (int r = 0; r < mb; r++) {
        if (nb == MF_COLS) memcpy(out + (long)r * N, acc[r], sizeof acc[r]);
        else memcpy(out + (long)r * N, acc[r], (size_t)nb * sizeof(float));
    }
}

// Panel p of b ([red][N]) into dst [red][32], zero-padded past column N.
static void pack_panel_float(float* dst, const float* b, int red, int N, int p) {
    for (long i = 0; i < red; i++)
        for (int c = 0; c < MF_COLS; c++) dst[i * MF_COLS + c] = p * MF_COLS + c < N ? b[i * N + p * MF_COLS + c] : 0.0f;
}
// Tile t of out: panel by panel, so that a panel stays in cache across its tiles.
static void matmul_float_at(int t, float* out, const float* a, const float* pf, int M, int red, int N) {
    int tm = (M + MF_ROWS - 1) / MF_ROWS, p = t / tm, m0 = (t % tm) * MF_ROWS, n0 = p * MF_COLS;
    int mb = M - m0 < MF_ROWS ? M - m0 : MF_ROWS, nb = N - n0 < MF_COLS ? N - n0 : MF_COLS;
    const float* arow[MF_ROWS];
    for (int r = 0; r < MF_ROWS; r++) arow[r] = a + (long)(m0 + (r < mb ? r : mb - 1)) * red;
    matmul_float_tile(out + (long)m0 * N + n0, arow, pf + (long)p * red * MF_COLS, red, N, mb, nb);
}

// out[m][n] = sum over i of a[m][i] * b[i][n], a fused multiply-add chain in the order
// i = 0, 1, ..., red-1 for every element, whatever tile or thread it falls in.
static void matmul_float(float* out, const float* a, const float* b, int M, int red, int N, Workspace* ws) {
    int tm = (M + MF_ROWS - 1) / MF_ROWS, tn = (N + MF_COLS - 1) / MF_COLS;
    if ((long)tn * MF_COLS * red > ws->pf_cap) fatal("internal: workspace too small for a %d x %d matmul", red, N);
    if (THREADED((long)M * N * red / 8)) {
#pragma omp parallel for
        for (int p = 0; p < tn; p++) pack_panel_float(ws->pf + (long)p * red * MF_COLS, b, red, N, p);
#pragma omp parallel for
        for (int t = 0; t < tm * tn; t++) matmul_float_at(t, out, a, ws->pf, M, red, N);
    } else {
        for (int p = 0; p < tn; p++) pack_panel_float(ws->pf + (long)p * red * MF_COLS, b, red, N, p);
        for (int t = 0; t < tm * tn; t++) matmul_float_at(t, out, a, ws->pf, M, red, N);
    }
}

// matmul_exact: tiles of 8 rows x 3 vectors of 8 columns, 24 vector accumulators.
#define ME_ROWS 8
#define ME_VECS 3
#define ME_COLS (8 * ME_VECS)
EXACT_KERNEL __attribute__((noinline)) static void matmul_exact_tile(int64_t* acc, const double* const* arow,
                                                                     long a_si, const double* panel, int red,
                                                                     int N, int mb, int nb) {
    EXACT_KERNEL_BODY
    u64x8 sum[ME_ROWS][ME_VECS];
    memset(sum, 0, sizeof sum);
    const f64x8 bias = F64X8_SPLAT(FIX_BIAS);
    for (int i = 0; i < red; i++) {
        f64x8 bv[ME_VECS];
        for (int v = 0; v < ME_VECS; v++) memcpy(&bv[v], panel + (long)i * ME_COLS + 8 * v, sizeof bv[v]);
        for (int r = 0; r < ME_ROWS; r++) {
            f64x8 ar = F64X8_SPLAT(arow[r][i * a_si]);
            for (int v = 0; v < ME_VECS; v++) sum[r][v] += (u64x8)(ar * bv[v] + bias); // the bits: see above
        }
    }
    uint64_t total_bias = (uint64_t)red * fix_bias_bits(); // unsigned: the biased sums wrap, by design
    for (int r = 0; r < mb; r++) {
        uint64_t* o = (uint64_t*)acc + (long)r * N;
        int v = 0;
        for (; 8 * v + 8 <= nb; v++) { // whole vectors
            u64x8 cur;
            memcpy(&cur, o + 8 * v, sizeof cur);
            cur += sum[r][v] - total_bias;
            memcpy(o + 8 * v, &cur, sizeof cur);
        }
        for (int c = 8 * v; c < nb; c++) o[c] += sum[r][v][c - 8 * v] - total_bias;
    }
}
// Panel p of b ([red][N]) into dst [red][24] as doubles, zero-padded past column N.
static void pack_panel_double(double* dst, const float* b, int red, int N, int p) {
    for (long i = 0; i < red; i++)
        for (int c = 0; c < ME_COLS; c++) dst[i * ME_COLS + c] = p * ME_COLS + c < N ? (double)b[i * N + p * ME_COLS + c] : 0.0;
}
// Tile t of acc, panel by panel.
static void matmul_exact_at(int t, int64_t* acc, const double* pa, long a_sm, long a_si, const double* pb, int M,
                            int red, int N) {
    int tm = (M + ME_ROWS - 1) / ME_ROWS, p = t / tm, m0 = (t % tm) * ME_ROWS, n0 = p * ME_COLS;
    int mb = M - m0 < ME_ROWS ? M - m0 : ME_ROWS, nb = N - n0 < ME_COLS ? N - n0 : ME_COLS;
    const double* arow[ME_ROWS];
    for (int r = 0; r < ME_ROWS; r++) arow[r] = pa + (m0 + (r < mb ? r : mb - 1)) * a_sm;
    matmul_exact_tile(acc + (long)m0 * N + n0, arow, a_si, pb + (long)p * red * ME_COLS, red, N, mb, nb);
}

// Exact-sum range check for a matmul: every term a(m,i)*b(i,n) must be below the limit.
// The bound max|a| * max|b| is cheap but loose; only if it fails are the actual terms
// examined, so that whether a run stops depends on the terms alone and not on how a
// layout split them. A(m, i) and B(i, n) are accessor macros.
#define MATMUL_EXACT_CHECK(M, red, N, A, B, amax, bmax, terms, what)                                    \
    do {                                                                                               \
        double lim_ = fix_term_limit(terms);                                                           \
        if (!((amax) * (bmax) < lim_))                                                                 \
            for (int i_ = 0; i_ < (red); i_++)                                                         \
                for (int m_ = 0; m_ < (M); m_++)                                                       \
                    for (int n_ = 0; n_ < (N); n_++) {                                                 \
                        double t_ = (double)(A(m_, i_)) * (B(i_, n_));                                 \
                        if (!(fabs(t_) < lim_)) fix_term(t_, terms, what);                             \
                    }                                                                                  \
    } while (0)

// max |x[i]|, or infinity if any x[i] is not finite. It takes the maximum of the bit
// patterns of |x|: for non-negative floats their order as integers is their order as
// numbers, infinity and NaN have the largest patterns, and an integer maximum vectorises.
static inline uint32_t abs_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u & 0x7fffffffu;
}
static double max_abs(const float* x, long n) {
    uint32_t mx = 0;
    if (THREADED(n)) {
#pragma omp parallel for reduction(max : mx)
        for (long i = 0; i < n; i++) mx = abs_bits(x[i]) > mx ? abs_bits(x[i]) : mx;
    } else {
        for (long i = 0; i < n; i++) mx = abs_bits(x[i]) > mx ? abs_bits(x[i]) : mx;
    }
    if (mx >= 0x7f800000u) return INFINITY;
    float f;
    memcpy(&f, &mx, sizeof f);
    return f;
}
// dst[i] = src[i] * scale as doubles; returns max |src| (infinity if any is not finite)
static double pack_double(double* dst, const float* src, long n, double scale) {
    if (THREADED(n)) {
#pragma omp parallel for
        for (long i = 0; i < n; i++) dst[i] = (double)src[i] * scale;
    } else {
        for (long i = 0; i < n; i++) dst[i] = (double)src[i] * scale;
    }
    return max_abs(src, n);
}

// acc[m][n] += exact sum over i of a(m,i) * b[i][n], with a(m,i) = a[m*a_sm + i*a_si]
// (a is x[R][K] for a forward, m = r; or x[R][K] read as x^T for a weight gradient,
// m = k) and b a row-major [red][N] matrix (the weight, or the output gradient).
// `terms` is the number of terms in the whole sum, across every rank and microbatch that
// contributes to it: it sets the range limit, so every layout applies the same one.
static void matmul_exact(int64_t* acc, const float* a, long a_sm, long a_si, const float* b, int M, int red, int N,
                         long terms, const char* what, Workspace* ws) {
    // a as doubles scaled by 2^40, in its own layout; b as doubles in panels [tn][red][24]
    int tm = (M + ME_ROWS - 1) / ME_ROWS, tn = (N + ME_COLS - 1) / ME_COLS;
    if ((long)M * red > ws->pa_cap || (long)tn * ME_COLS * red > ws->pb_cap)
        fatal("internal: workspace too small for %s (%d x %d x %d)", what, M, red, N);
    double amax = pack_double(ws->pa, a, (long)M * red, FIX_ONE), bmax = max_abs(b, (long)red * N);
#define A_(m, i) a[(m) * a_sm + (i) * a_si]
#define B_(i, n) b[(long)(i) * N + (n)]
    MATMUL_EXACT_CHECK(M, red, N, A_, B_, amax, bmax, terms, what);
#undef A_
#undef B_
    if (THREADED((long)M * N * red / 8)) {
#pragma omp parallel for
        for (int p = 0; p < tn; p++) pack_panel_double(ws->pb + (long)p * red * ME_COLS, b, red, N, p);
#pragma omp parallel for
        for (int t = 0; t < tm * tn; t++) matmul_exact_at(t, acc, ws->pa, a_sm, a_si, ws->pb, M, red, N);
    } else {
        for (int p = 0; p < tn; p++) pack_panel_double(ws->pb + (long)p * red * ME_COLS, b, red, N, p);
        for (int t = 0; t < tm * tn; t++) matmul_exact_at(t, acc, ws->pa, a_sm, a_si, ws->pb, M, red, N);
    }
}

// dst[c][r] = src[r][c], by blocks of 16 x 16 through two small buffers. Rows of these
// matrices are often a power of two bytes apart (4 KiB for 1024 floats): their cache
// lines then all fall into the same few sets of the cache and evict each other, and an
// element-by-element transpose misses the cache at every step (7 ms for 1024 x 1024 here).
// Copying whole rows of a block into a buffer, transposing there, and copying whole rows
// out touches each line once (0.75 ms).
#define TRANSPOSE_BLOCK 16
static void transpose(float* dst, const float* src, int rows, int cols) {
    enum { TB = TRANSPOSE_BLOCK };
    for (int r0 = 0; r0 < rows; r0 += TB)
        for (int c0 = 0; c0 < cols; c0 += TB) {
            if (r0 + TB <= rows && c0 + TB <= cols) {
                float in[TB][TB], out[TB][TB];
                for (int r = 0; r < TB; r++) memcpy(in[r], src + (long)(r0 + r) * cols + c0, sizeof in[r]);
                for (int c = 0; c < TB; c++)
                    for (int r = 0; r < TB; r++) out[c][r] = in[r][c];
                for (int c = 0; c < TB; c++) memcpy(dst + (long)(c0 + c) * rows + r0, out[c], sizeof out[c]);
            } else { // a block at the edge, in part
                for (int r = r0; r < rows && r < r0 + TB; r++)
                    for (int c = c0; c < cols && c < c0 + TB; c++) dst[(long)c * rows + r] = src[(long)r * cols + c];
            }
        }
}

// ----------------------------------------------------------------------------
// ops

// Embedding. This rank holds the table rows of tokens [v_lo, v_hi) (all of them: 0, V);
// rows of tokens it does not hold come out as zeros (train_tp.c sums them across ranks).
// out[r][t*E + e] = emb[tokens[r][t] - v_lo][e]
static void embedding_forward(float* out, const int* tokens, const float* emb, int v_lo, int v_hi, int R, int T,
                              int E) {
    for (long rt = 0; rt < (long)R * T; rt++) {
        int v = tokens[rt];
        float* o = out + rt * E;
        if (v >= v_lo && v < v_hi) memcpy(o, emb + (long)(v - v_lo) * E, E * sizeof(float));
        else memset(o, 0, E * sizeof(float));
    }
}
// demb[v - v_lo][e] += exact sum over the (r, t) with tokens[r][t] == v of dout[r][t*E + e]
static void embedding_backward(int64_t* demb, const int* tokens, const float* dout, int v_lo, int v_hi, int R,
                               int T, int E, long batch) {
    for (long rt = 0; rt < (long)R * T; rt++) {
        int v = tokens[rt];
        if (v >= v_lo && v < v_hi) fix_add(demb + (long)(v - v_lo) * E, dout + rt * E, E, batch * T, "embedding gradient");
    }
}

// Linear, plain float sum (no layout splits it): out[r][j] = (sum_k in[r][k] w[k][j]) + b[j]
static void linear_forward(float* out, const float* in, const float* w, const float* b, int R, int K, int J,
                           Workspace* ws) {
    matmul_float(out, in, w, R, K, J, ws);
    if (b)
        for (int r = 0; r < R; r++)
            for (int j = 0; j < J; j++) out[(long)r * J + j] += b[j];
}
// Linear, exact partial sums: acc[r][j] += sum over this rank's k of in[r][k] w[k][j]
// (`terms` = the layer's full input width). Then linear_forward_finish adds the bias once.
static void linear_forward_exact(int64_t* acc, const float* in, const float* w, int R, int K, int J, long terms,
                                 Workspace* ws) {
    matmul_exact(acc, in, K, 1, w, R, K, J, terms, "linear forward", ws);
}
// out[r][j] = acc[r][j] + b[j], rounded to float once
static void linear_forward_finish(float* out, const int64_t* acc, const float* b, int R, int J) {
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) out[(long)r * J + j] = (float)(fix_to(acc[(long)r * J + j]) + (b ? b[j] : 0.0f));
}
// Weight and bias gradients, exact over the rows (`batch` = rows in the whole batch):
// dw[k][j] += sum_r in[r][k] dout[r][j], db[j] += sum_r dout[r][j]
static void linear_backward_weight(int64_t* dw, int64_t* db, const float* in, const float* dout, int R, int K, int J,
                                   long batch, Workspace* ws) {
    matmul_exact(dw, in, 1, K, dout, K, R, J, batch, "weight gradient", ws);
    if (db)
        for (int r = 0; r < R; r++) fix_add(db, dout + (long)r * J, J, batch, "bias gradient");
}
// Input gradient, plain float sum: din[r][k] = sum_j dout[r][j] w[k][j]
static void linear_backward_input(float* din, const float* dout, const float* w, int R, int K, int J,
                                  Workspace* ws) {
    if ((long)K * J > ws->tr_cap) fatal("internal: workspace too small for a %d x %d transpose", K, J);
    transpose(ws->tr, w, K, J);
    matmul_float(din, dout, ws->tr, R, J, K, ws);
}
// Input gradient, exact partial sums over this rank's j (`terms` = the layer's full width),
// computed transposed, daccT[k][r] += sum_j w[k][j] dout[r][j], because the kernel is
// fastest with the long dimension K as its rows; linear_backward_input_finish transposes.
static void linear_backward_input_exact(int64_t* daccT, const float* dout, const float* w, int R, int K, int J,
                                        long terms, Workspace* ws) {
    if ((long)R * J > ws->tr_cap) fatal("internal: workspace too small for a %d x %d transpose", R, J);
    transpose(ws->tr, dout, R, J);
    matmul_exact(daccT, w, J, 1, ws->tr, K, J, R, terms, "input gradient", ws);
}
// din[r][k] = daccT[k][r], rounded to float once
static void linear_backward_input_finish(float* din, const int64_t* daccT, int R, int K) {
    enum { TB = TRANSPOSE_BLOCK }; // as transpose does, for the same reason
    for (int k0 = 0; k0 < K; k0 += TB)
        for (int r0 = 0; r0 < R; r0 += TB) {
            if (k0 + TB <= K && r0 + TB <= R) {
                int64_t in[TB][TB];
                float out[TB][TB];
                for (int k = 0; k < TB; k++) memcpy(in[k], daccT + (long)(k0 + k) * R + r0, sizeof in[k]);
                for (int r = 0; r < TB; r++)
                    for (int k = 0; k < TB; k++) out[r][k] = (float)fix_to(in[k][r]);
                for (int r = 0; r < TB; r++) memcpy(din + (long)(r0 + r) * K + k0, out[r], sizeof out[r]);
            } else {
                for (int r = r0; r < R && r < r0 + TB; r++)
                    for (int k = k0; k < K && k < k0 + TB; k++) din[(long)r * K + k] = (float)fix_to(daccT[(long)k * R + r]);
            }
        }
}

// ReLU, in place: x = max(x, 0); backward zeroes the gradient where the output is 0.
static void relu_forward(float* x, long n) {
    for (long i = 0; i < n; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
static void relu_backward(float* dx, const float* x, long n) {
    for (long i = 0; i < n; i++) dx[i] = x[i] > 0.0f ? dx[i] : 0.0f;
}

// Softmax cross-entropy, in four steps so that train_tp.c can split the vocabulary
// across ranks and insert one all-reduce after each of the first three. This rank holds
// logit columns c = 0..Vl-1 for tokens v_lo + c; columns with v_lo + c >= V are padding
// and never take part. In train.c, v_lo = 0 and Vl = V.
//  1. rowmax[r] = max over this rank's real columns (all-reduce MAX: exact)
static void xent_rowmax(float* rowmax, const float* logits, int R, int Vl, int v_lo, int V) {
    for (int r = 0; r < R; r++) {
        float m = -INFINITY;
        for (int c = 0; c < Vl && v_lo + c < V; c++) m = logits[(long)r * Vl + c] > m ? logits[(long)r * Vl + c] : m;
        rowmax[r] = m;
    }
}
//  2. tlogit[r] = the target's logit if this rank holds it, else 0 (all-reduce SUM: one
//     rank contributes, the others add zeros, so the sum is exact)
static void xent_target_logit(float* tlogit, const float* logits, const int* targets, int R, int Vl, int v_lo) {
    for (int r = 0; r < R; r++) {
        int c = targets[r] - v_lo;
        tlogit[r] = c >= 0 && c < Vl ? logits[(long)r * Vl + c] : 0.0f;
    }
}
//  3. probs[r][c] = exp(logit - rowmax), in place over the logits; expsum[r] = exact sum
//     of them (all-reduce SUM)
static void xent_expsum(int64_t* expsum, float* probs, const float* logits, const float* rowmax, int R, int Vl,
                        int v_lo, int V) {
    for (int r = 0; r < R; r++) {
        int64_t s = 0;
        for (int c = 0; c < Vl; c++) {
            float e = v_lo + c < V ? expf(logits[(long)r * Vl + c] - rowmax[r]) : 0.0f;
            probs[(long)r * Vl + c] = e;
            s += fix_fast(e); // 0 <= e <= 1
        }
        expsum[r] = s;
    }
}
//  4. probs /= the sum; returns the exact sum of the rows' losses, loss = log(sum) + max - tlogit.
//     `rows_total` is the number of rows whose losses will be added together.
static int64_t xent_finish(float* probs, const int64_t* expsum, const float* rowmax, const float* tlogit, int R,
                           int Vl, long rows_total) {
    int64_t loss = 0;
    for (int r = 0; r < R; r++) {
        double s = fix_to(expsum[r]);
        for (int c = 0; c < Vl; c++) probs[(long)r * Vl + c] = (float)(probs[(long)r * Vl + c] / s);
        loss += fix_term(log(s) + rowmax[r] - tlogit[r], rows_total, "loss");
    }
    return loss;
}
// the four steps on one rank holding the whole vocabulary (train.c's case): the logits
// become the probabilities in place; returns the exact sum of the rows' losses
static int64_t xent_forward(float* logits, int64_t* expsum, float* rowmax, float* tlogit, const int* targets, int R,
                            int V, long rows_total) {
    xent_rowmax(rowmax, logits, R, V, 0, V);
    xent_target_logit(tlogit, logits, targets, R, V, 0);
    xent_expsum(expsum, logits, logits, rowmax, R, V, 0, V);
    return xent_finish(logits, expsum, rowmax, tlogit, R, V, rows_total);
}
// backward of the loss summed over rows: dlogits = probs - onehot(target)
static void xent_backward(float* dlogits, const float* probs, const int* targets, int R, int Vl, int v_lo) {
    memcpy(dlogits, probs, (size_t)R * Vl * sizeof(float));
    for (int r = 0; r < R; r++) {
        int c = targets[r] - v_lo;
        if (c >= 0 && c < Vl) dlogits[(long)r * Vl + c] -= 1.0f;
    }
}

// ----------------------------------------------------------------------------
// parameters: layout and initialisation
//
// All parameters live in one float allocation, unit after unit: the embedding [V][E], then
// for each linear layer its weight [K][J] followed by its bias [J]; unit u starts at
// unit_offset(u). Gradients (exact sums, int64) and optimizer state use the same layout,
// so the optimizer, an all-reduce and an FSDP shard are each one loop over one flat range,
// and a unit, the piece that pipeline stages and FSDP move around, is one contiguous block.

// Tensors are numbered 0 (embedding), 2l-1 (weight of linear l), 2l (its bias).
// Initial value of element `index` (row-major, in the unpadded shape) of tensor `tensor`:
// a pure function of (seed, tensor, index), so a rank holding any slice or shard computes
// exactly the values train.c uses without building the rest.
//
// The choice: the embedding from N(0, 1), every linear weight and bias uniform in
// +-1/sqrt(K), PyTorch's defaults for nn.Embedding and nn.Linear. Measured (validation
// loss; seeds 42 and 7 unless noted), with init_value patched for each alternative:
//   default model, 25,000 steps:         this 2.156 / 2.151;  +-1/K 2.162 / 2.152;
//                                         He normal, zero bias 2.166 / 2.153
//   --hidden 512 --layers 3, 5,000 steps: this 2.214 / 2.195;  +-1/K 2.585 / 2.569;
//                                         He normal, zero bias 2.165 / 2.138
//   --hidden 128 --layers 2, 25,000:      this 2.109;  He normal, zero bias 2.125
// Bounds of +-1/K shrink the activations layer after layer and fail on deeper models;
// He initialisation and PyTorch's are within noise of each other, and PyTorch's is what
// users compare against.
static float init_value(const Config* c, uint64_t seed, int tensor, long index) {
    uint64_t stream = ((uint64_t)STREAM_INIT << 32) | (uint64_t)tensor;
    if (tensor == 0) return (float)rng_normal(seed, stream, (uint64_t)index);
    double bound = 1.0 / sqrt((double)linear_in(c, (tensor + 1) / 2));
    return (float)((2.0 * rng_uniform(seed, stream, (uint64_t)index) - 1.0) * bound);
}

// Initial value of element e of unit u's parameters (its weight, then its bias)
static float unit_init_value(const Config* c, uint64_t seed, int u, long e) {
    if (u == 0) return init_value(c, seed, 0, e);
    long nw = (long)linear_in(c, u) * linear_out(c, u);
    return e < nw ? init_value(c, seed, 2 * u - 1, e) : init_value(c, seed, 2 * u, e - nw);
}

static void params_init(float* params, const Config* c, uint64_t seed) {
    for (int u = 0; u < n_units(c); u++)
        for (long e = 0; e < unit_params(c, u); e++) params[unit_offset(c, u) + e] = unit_init_value(c, seed, u, e);
}

// ----------------------------------------------------------------------------
// activations, and the model as a list of units

typedef struct {
    int rows;                   // capacity
    int* tokens;                // [rows][T]
    int* targets;               // [rows]
    float* out[MAX_LAYERS + 2]; // out[u]: unit u's output [rows][unit_width(u)]; out[L+1] holds the probs
    float* rowmax;              // [rows] softmax workspace
    float* tlogit;              // [rows]
    int64_t* expsum;            // [rows]
    int64_t loss;               // exact sum of the row losses of the last forward
} Acts;

// Activations of units [u_lo, u_hi) and of the input to u_lo (a pipeline stage keeps only
// its own); pass 0, n_units for the whole model. `width` gives each unit's output width on
// this rank (a tensor-parallel slice is narrower), NULL for the whole unit_width.
static void acts_init(Acts* a, const Config* c, int rows, int u_lo, int u_hi, const int* width) {
    memset(a, 0, sizeof(*a));
    a->rows = rows;
    a->tokens = mallocCheck((size_t)rows * c->context * sizeof(int));
    a->targets = mallocCheck((size_t)rows * sizeof(int));
    for (int u = (u_lo > 0 ? u_lo - 1 : 0); u < u_hi; u++)
        a->out[u] = mallocCheck((size_t)rows * (width ? width[u] : unit_width(c, u)) * sizeof(float));
    a->rowmax = mallocCheck((size_t)rows * sizeof(float));
    a->tlogit = mallocCheck((size_t)rows * sizeof(float));
    a->expsum = mallocCheck((size_t)rows * sizeof(int64_t));
}
static void acts_free(Acts* a) {
    free(a->tokens);
    free(a->targets);
    for (int u = 0; u < MAX_LAYERS + 2; u++) free(a->out[u]);
    free(a->rowmax);
    free(a->tlogit);
    free(a->expsum);
}
// bytes of activations held per row for units [u_lo, u_hi) (width: as for acts_init)
static long acts_bytes_per_row(const Config* c, int u_lo, int u_hi, const int* width) {
    long b = (long)c->context * sizeof(int) + sizeof(int);
    for (int u = (u_lo > 0 ? u_lo - 1 : 0); u < u_hi; u++) b += (long)(width ? width[u] : unit_width(c, u)) * sizeof(float);
    return b;
}

// Scratch for one backward pass and for exact partial sums: [rows][max_width] each.
typedef struct {
    float* dout;  // gradient with respect to the current unit's output
    float* din;   // gradient with respect to its input
    int64_t* acc; // exact partial sums
} Scratch;
static void scratch_init(Scratch* s, const Config* c, int rows) {
    s->dout = mallocCheck((size_t)rows * max_width(c) * sizeof(float));
    s->din = mallocCheck((size_t)rows * max_width(c) * sizeof(float));
    s->acc = mallocCheck((size_t)rows * max_width(c) * sizeof(int64_t));
}
static void scratch_free(Scratch* s) {
    free(s->dout);
    free(s->din);
    free(s->acc);
}

// Forward of unit u over R rows; `w` points at the unit's parameters (unit_offset layout),
// `rows_total` is the number of rows whose losses are summed (the global batch).
static void unit_forward_(const Config* c, int u, const float* w, Acts* a, Scratch* s, int R, long rows_total,
                          Workspace* ws);
static void unit_backward_(const Config* c, int u, const float* w, int64_t* g, Acts* a, Scratch* s, int R, long batch,
                           Workspace* ws);
// The name of unit u, for traces and tables.
static const char* unit_name(const Config* c, int u) {
    static char name[32];
    if (u == 0) return "embedding";
    snprintf(name, sizeof name, u == c->layers + 1 ? "linear %d + loss" : "linear %d", u);
    return name;
}
static void unit_forward(const Config* c, int u, const float* w, Acts* a, Scratch* s, int R, long rows_total,
                         Workspace* ws) {
    double t = trace_on ? now_seconds() : 0;
    unit_forward_(c, u, w, a, s, R, rows_total, ws);
    trace_event("compute", t, trace_on ? now_seconds() : 0, 0, "forward %s", unit_name(c, u));
}
static void unit_backward(const Config* c, int u, const float* w, int64_t* g, Acts* a, Scratch* s, int R, long batch,
                          Workspace* ws) {
    double t = trace_on ? now_seconds() : 0;
    unit_backward_(c, u, w, g, a, s, R, batch, ws);
    trace_event("compute", t, trace_on ? now_seconds() : 0, 0, "backward %s", unit_name(c, u));
}

// Forward of unit u over R rows (unit_forward, traced).
static void unit_forward_(const Config* c, int u, const float* w, Acts* a, Scratch* s, int R, long rows_total,
                          Workspace* ws) {
    if (u == 0) {
        embedding_forward(a->out[0], a->tokens, w, 0, c->vocab, R, c->context, c->emb);
        return;
    }
    int K = linear_in(c, u), J = linear_out(c, u);
    const float* in = a->out[u - 1];
    float* out = a->out[u];
    const float* bias = w + (long)K * J;
    if (forward_sum_is_split(u)) {
        fix_zero(s->acc, (long)R * J);
        linear_forward_exact(s->acc, in, w, R, K, J, K, ws);
        linear_forward_finish(out, s->acc, bias, R, J);
    } else {
        linear_forward(out, in, w, bias, R, K, J, ws);
    }
    if (u <= c->layers) {
        relu_forward(out, (long)R * J);
    } else { // the loss: out becomes the softmax probabilities
        a->loss = xent_forward(out, a->expsum, a->rowmax, a->tlogit, a->targets, R, J, rows_total);
    }
}

// Backward of unit u: reads s->dout (gradient of the unit's output; ignored for the last
// unit, which starts from the loss), adds the parameter gradients into g (exact sums),
// writes the gradient of the unit's input to s->din (not for the embedding).
static void unit_backward_(const Config* c, int u, const float* w, int64_t* g, Acts* a, Scratch* s, int R,
                           long batch, Workspace* ws) {
    if (u == 0) {
        embedding_backward(g, a->tokens, s->dout, 0, c->vocab, R, c->context, c->emb, batch);
        return;
    }
    int K = linear_in(c, u), J = linear_out(c, u);
    if (u == c->layers + 1) xent_backward(s->dout, a->out[u], a->targets, R, J, 0);
    else relu_backward(s->dout, a->out[u], (long)R * J);
    linear_backward_weight(g, g + (long)K * J, a->out[u - 1], s->dout, R, K, J, batch, ws);
    if (input_grad_sum_is_split(u)) {
        fix_zero(s->acc, (long)R * K);
        linear_backward_input_exact(s->acc, s->dout, w, R, K, J, J, ws);
        linear_backward_input_finish(s->din, s->acc, R, K);
    } else {
        linear_backward_input(s->din, s->dout, w, R, K, J, ws);
    }
}

// The whole model: units 0..L+1 in order, then back. Returns the exact loss sum.
static int64_t model_forward(const Config* c, const float* params, Acts* a, Scratch* s, int R, long rows_total,
                             Workspace* ws) {
    for (int u = 0; u < n_units(c); u++) unit_forward(c, u, params + unit_offset(c, u), a, s, R, rows_total, ws);
    return a->loss;
}
static void model_backward(const Config* c, const float* params, int64_t* grads, Acts* a, Scratch* s, int R,
                           long batch, Workspace* ws) {
    for (int u = n_units(c) - 1; u >= 0; u--) {
        long off = unit_offset(c, u);
        unit_backward(c, u, params + off, grads + off, a, s, R, batch, ws);
        float* t = s->dout; // this unit's input gradient is the next unit's output gradient
        s->dout = s->din;
        s->din = t;
    }
}

// ----------------------------------------------------------------------------
// optimizers
//
// The exact gradient sums are divided by the global batch size once, here, and rounded to
// float. Every element is updated by the same float operations in
// every layout (built with -ffp-contract=off, so the compiler fuses nothing on its own).

typedef struct {
    int adamw;       // 0: SGD, 1: AdamW
    float lr;
    float weight_decay; // decoupled: p -= lr * wd * p
    float beta1, beta2, eps;
    float clip;      // max global gradient norm; 0 = off
} Optimizer;

// g = float(sum * (2^-40 / batch)): one multiply by a constant that every layout computes alike
static inline double grad_factor(long batch) { return (1.0 / FIX_ONE) / (double)batch; }
static inline float grad_value(int64_t g, double factor) { return (float)((double)g * factor); }

// Global norm of the gradient, in two exact steps so that shards can be combined:
// the largest |g| (all-reduce MAX), then the sum of (g / 2^e)^2 with 2^e >= that max, so
// every term is at most 1 (all-reduce SUM). norm = 2^e * sqrt(sum).
#define NORM_ONE 0x1p30
static float grads_maxabs(const int64_t* g, long n, long batch) {
    float m = 0.0f;
    double f = grad_factor(batch);
    for (long i = 0; i < n; i++) {
        float v = fabsf(grad_value(g[i], f));
        m = v > m ? v : m;
    }
    return m;
}
static int norm_exponent(float maxabs) {
    int e;
    frexpf(maxabs, &e); // maxabs = f * 2^e with 0.5 <= f < 1
    return e;
}
static int64_t grads_sumsq(const int64_t* g, long n, long batch, int e) {
    int64_t s = 0;
    double f = grad_factor(batch);
    for (long i = 0; i < n; i++) {
        double v = ldexp((double)grad_value(g[i], f), -e);
        s += llrint(v * v * NORM_ONE);
    }
    return s;
}
static float grad_norm_value(int64_t sumsq, int e) { return (float)ldexp(sqrt((double)sumsq / NORM_ONE), e); }
// the factor every gradient is multiplied by: clip / norm when the norm exceeds clip
static float clip_scale(const Optimizer* opt, float norm) {
    return (opt->clip > 0.0f && norm > opt->clip) ? opt->clip / norm : 1.0f;
}

// One step on n parameters: the whole model, or any contiguous shard of it. Gradient i is
// float(g[i] * factor) * scale: factor is grad_factor(batch), scale the clipping factor.
// `t` is the 1-based step number (for AdamW's bias correction); m and v are unused by SGD.
static inline void sgd_update(float* p, const int64_t* g, long i, float lr, float wd, double f, float scale) {
    float gi = grad_value(g[i], f) * scale;
    p[i] -= lr * (gi + wd * p[i]);
}
static inline void adamw_update(float* p, const int64_t* g, float* m, float* v, long i, float lr, float wd, double f,
                                float scale, float b1, float b2, float c1, float c2, float eps) {
    float gi = grad_value(g[i], f) * scale;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    float mhat = m[i] / c1, vhat = v[i] / c2;
    p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
}
static void optimizer_step(const Optimizer* opt, float* p, const int64_t* g, float* m, float* v, long n,
                           double factor, float scale, long t) {
    float lr = opt->lr, wd = opt->weight_decay, b1 = opt->beta1, b2 = opt->beta2, eps = opt->eps;
    float c1 = 1.0f - powf(b1, (float)t), c2 = 1.0f - powf(b2, (float)t);
    if (!opt->adamw && THREADED(n)) {
#pragma omp parallel for
        for (long i = 0; i < n; i++) sgd_update(p, g, i, lr, wd, factor, scale);
    } else if (!opt->adamw) {
        for (long i = 0; i < n; i++) sgd_update(p, g, i, lr, wd, factor, scale);
    } else if (THREADED(n)) {
#pragma omp parallel for
        for (long i = 0; i < n; i++) adamw_update(p, g, m, v, i, lr, wd, factor, scale, b1, b2, c1, c2, eps);
    } else {
        for (long i = 0; i < n; i++) adamw_update(p, g, m, v, i, lr, wd, factor, scale, b1, b2, c1, c2, eps);
    }
}

// ----------------------------------------------------------------------------
// sampling

// Next token for sample n at position p, drawn from probs[V] with a counter-based draw:
// the first token whose cumulative probability exceeds u.
static int sample_token(const float* probs, int V, uint64_t seed, int n, int p) {
    double u = rng_uniform(seed, STREAM_SAMPLE, ((uint64_t)n << 32) + (uint64_t)p), cdf = 0.0;
    int last = 0;
    for (int v = 0; v < V; v++) {
        if (probs[v] <= 0.0f) continue;
        cdf += probs[v];
        last = v;
        if (u < cdf) return v;
    }
    return last; // u fell in the rounding gap at the very top of the cdf
}

// Generates n_samples names of at most max_len characters. `probs_of` computes
// probs[R][V] for R contexts (every program supplies its own, parallel, forward);
// names[i] receives the token ids of sample i followed by 0.
typedef void (*ProbsFn)(void* ctx, const int* tokens, int R, float* probs);
static void generate(int* names, int n_samples, int max_len, const Config* c, uint64_t seed, ProbsFn probs_of,
                     void* ctx) {
    int T = c->context, V = c->vocab;
    int* tokens = callocCheck((size_t)n_samples * T, sizeof(int));
    float* probs = mallocCheck((size_t)n_samples * V * sizeof(float));
    int* done = callocCheck((size_t)n_samples, sizeof(int));
    for (int i = 0; i < n_samples * (max_len + 1); i++) names[i] = 0;
    for (int p = 0; p < max_len; p++) {
        probs_of(ctx, tokens, n_samples, probs);
        for (int i = 0; i < n_samples; i++) {
            if (done[i]) continue;
            int next = sample_token(probs + (long)i * V, V, seed, i, p);
            if (next == 0) {
                done[i] = 1;
                continue;
            }
            names[(long)i * (max_len + 1) + p] = next;
            memmove(tokens + (long)i * T, tokens + (long)i * T + 1, (T - 1) * sizeof(int));
            tokens[(long)i * T + T - 1] = next;
        }
    }
    free(tokens);
    free(probs);
    free(done);
}

// The names every program prints: n_samples of them, each max_len + 1 token ids (a name
// longer than any line of the data is cut there). The caller frees the array.
static int* generate_names(int n_samples, int max_len, const Config* c, uint64_t seed, ProbsFn probs_of, void* ctx) {
    int* names = mallocCheck((size_t)(n_samples > 0 ? n_samples : 1) * (max_len + 1) * sizeof(int));
    generate(names, n_samples, max_len, c, seed, probs_of, ctx);
    return names;
}

// ----------------------------------------------------------------------------
// checkpoints
//
// One file format for every program: a header, then the parameters in train.c's layout,
// then AdamW's m and v (none for SGD), then a 64-bit FNV-1a checksum of all preceding
// bytes. Sharded programs write and read their pieces at the right offsets.

#define CKPT_MAGIC "MLPCKPT1"
typedef struct {
    char magic[8];
    int32_t vocab, context, emb, hidden, layers, adamw;
    int64_t step;     // completed training steps
    int64_t n_params;
    unsigned char chars[256]; // the vocabulary, so that another dataset is caught
} CkptHeader;

static uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
    const unsigned char* p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}
#define FNV_START 0xcbf29ce484222325ull

static CkptHeader ckpt_header(const Config* c, int adamw, long step, const unsigned char* chars) {
    CkptHeader h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.vocab = c->vocab;
    h.context = c->context;
    h.emb = c->emb;
    h.hidden = c->hidden;
    h.layers = c->layers;
    h.adamw = adamw;
    h.step = step;
    h.n_params = n_params(c);
    memcpy(h.chars, chars, (size_t)c->vocab);
    return h;
}
static long ckpt_floats(const CkptHeader* h) { return (h->adamw ? 3 : 1) * (long)h->n_params; }

// Writes the header, then `n` floats gathered by the caller, then the checksum.
typedef struct {
    FILE* f;
    uint64_t sum;
    const char* path;
} CkptWriter;
static void ckpt_write(CkptWriter* w, const void* data, size_t n) {
    if (fwrite(data, 1, n, w->f) != n) fatal("cannot write checkpoint '%s': %s", w->path, strerror(errno));
    w->sum = fnv1a(w->sum, data, n);
}
static CkptWriter ckpt_create(const char* path, const CkptHeader* h) {
    CkptWriter w = {fopen(path, "wb"), FNV_START, path};
    if (!w.f) fatal("cannot create checkpoint '%s': %s", path, strerror(errno));
    ckpt_write(&w, h, sizeof *h);
    return w;
}
static void ckpt_close(CkptWriter* w) {
    uint64_t sum = w->sum;
    ckpt_write(w, &sum, sizeof sum);
    if (fclose(w->f) != 0) fatal("cannot write checkpoint '%s': %s", w->path, strerror(errno));
}

// Writes a whole checkpoint from one process that holds every parameter (n of them).
static void ckpt_save(const char* path, const Config* c, int adamw, long step, const unsigned char* chars,
                      const float* params, const float* m, const float* v) {
    CkptHeader h = ckpt_header(c, adamw, step, chars);
    CkptWriter w = ckpt_create(path, &h);
    long n = n_params(c);
    ckpt_write(&w, params, (size_t)n * sizeof(float));
    if (adamw) {
        ckpt_write(&w, m, (size_t)n * sizeof(float));
        ckpt_write(&w, v, (size_t)n * sizeof(float));
    }
    ckpt_close(&w);
}

// Checks a checkpoint without loading it: header, size, checksum (read in pieces), and
// agreement with this run's model, optimizer and data. Returns the header.
static CkptHeader ckpt_check(const char* path, const Config* c, int adamw, const unsigned char* chars) {
    FILE* f = fopen(path, "rb");
    if (!f) fatal("cannot open checkpoint '%s': %s", path, strerror(errno));
    CkptHeader h;
    if (fread(&h, 1, sizeof h, f) != sizeof h || memcmp(h.magic, CKPT_MAGIC, 8) != 0)
        fatal("'%s' is not a checkpoint of this project (bad header)", path);
    if (h.vocab != c->vocab || h.context != c->context || h.emb != c->emb || h.hidden != c->hidden ||
        h.layers != c->layers)
        fatal("checkpoint '%s' is of a different model (vocabulary %d, context %d, emb %d, hidden %d, layers %d); "
              "pass the same --context --emb --hidden --layers and data", path, h.vocab, h.context, h.emb, h.hidden,
              h.layers);
    if (h.n_params != n_params(c) || h.step < 0) fatal("checkpoint '%s' is corrupt (bad sizes)", path);
    if (memcmp(h.chars, chars, (size_t)c->vocab) != 0)
        fatal("checkpoint '%s' was trained on data with a different vocabulary", path);
    if (h.adamw != adamw)
        fatal("checkpoint '%s' holds %s state; pass --optimizer %s", path, h.adamw ? "AdamW" : "SGD",
              h.adamw ? "adamw" : "sgd");
    uint64_t sum = fnv1a(FNV_START, &h, sizeof h), stored;
    unsigned char buf[1 << 16];
    for (long left = ckpt_floats(&h) * (long)sizeof(float); left > 0;) {
        size_t want = left < (long)sizeof buf ? (size_t)left : sizeof buf;
        if (fread(buf, 1, want, f) != want) fatal("checkpoint '%s' is truncated", path);
        sum = fnv1a(sum, buf, want);
        left -= (long)want;
    }
    if (fread(&stored, 1, sizeof stored, f) != sizeof stored) fatal("checkpoint '%s' is truncated", path);
    if (fgetc(f) != EOF) fatal("checkpoint '%s' is corrupt (trailing bytes)", path);
    if (sum != stored) fatal("checkpoint '%s' is corrupt (checksum mismatch)", path);
    fclose(f);
    return h;
}

// Reads floats [first, first+count) of a checked checkpoint's data (parameters, then m, then v).
static void ckpt_read(const char* path, long first, long count, float* dst) {
    FILE* f = fopen(path, "rb");
    if (!f || fseek(f, (long)sizeof(CkptHeader) + first * (long)sizeof(float), SEEK_SET) != 0 ||
        fread(dst, sizeof(float), (size_t)count, f) != (size_t)count)
        fatal("cannot read checkpoint '%s'", path);
    fclose(f);
}

// Restores every parameter (and AdamW's state) of a checkpoint; returns its step.
static long ckpt_restore(const char* path, const Config* c, int adamw, const unsigned char* chars, float* params,
                         float* m, float* v) {
    CkptHeader h = ckpt_check(path, c, adamw, chars);
    long n = n_params(c);
    ckpt_read(path, 0, n, params);
    if (adamw) {
        ckpt_read(path, n, n, m);
        ckpt_read(path, 2 * n, n, v);
    }
    return (long)h.step;
}

#pragma GCC diagnostic pop
#endif // MODEL_H
