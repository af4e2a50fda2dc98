/*
 * kernels.h: the arithmetic every program's time goes into, and the exact sums that make
 * every layout give the same bits. Each tuned kernel stands beside the plain loop it must
 * equal bit for bit (the *_ref functions); tests/test_units.c compares them.
 *
 *   fixed point      fix_from / fix_to / fix_fast / fix_add: exact, associative sums
 *   matmul_float     out = a b, one float FMA chain per element       (ref: matmul_float_ref)
 *   matmul_exact     acc += a b, every product rounded once, int64 sum (ref: matmul_exact_ref)
 *   transpose        by 16 x 16 blocks                                 (ref: transpose_ref)
 *   fix_transpose    int64 sums to floats, transposed                  (ref: fix_transpose_ref)
 *   weight_packed    a weight packed for the kernels once a step, not once a microbatch
 *   bf16 operands    --precision bf16: every product's operands rounded as they are packed
 *
 * Why the tuned ones are fast: register tiles that keep every accumulator of a block of
 * the output in registers for the whole reduction, operands packed so that a tile reads
 * them contiguously, a tile body for each register file (AVX-512's 32 wide registers,
 * AVX2's 16 narrower ones), and (for matmul_exact) the rounding to fixed point done by one
 * FMA per product. KERNEL_ISA=avx2 or any (util.h) runs the other bodies on this machine.
 */
#ifndef KERNELS_H
#define KERNELS_H

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
// for (int i = 0; i < n; i++) STATEMENT (the last argument), split across threads when
// THREADED(work) says the loop is long enough
#define PARALLEL_FOR(work, i, n, ...)                  \
    do {                                               \
        if (THREADED(work)) {                          \
            OMP(omp parallel for)                      \
            for (int i = 0; i < (n); i++) __VA_ARGS__; \
        } else {                                       \
            for (int i = 0; i < (n); i++) __VA_ARGS__; \
        }                                              \
    } while (0)


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
// the forward of row-parallel linear layers (the MLP's even ones, the GPT's proj and fc2),
// the input gradient of column-parallel ones (the MLP's odd ones, the GPT's qkv, fc and
// lm_head), the softmax denominator, attention's sums over keys (layers.h) and the
// gradient norm. All other sums are float chains in a fixed order.
//
// Range: a term must satisfy |term| < 2^11 (so the fast conversion below applies) and a
// whole sum must stay below 2^23 (int64 holds 2^63 units of 2^-40), so a sum of n terms
// accepts terms up to min(2^11, 2^23 / n). Values that large mean training has diverged;
// they are a fatal error, never a silent wrap-around.

#define FIX_ONE 0x1p40     // one unit is 2^-40
#define FIX_TERM_MAX 0x1p11
#define FIX_SUM_MAX 0x1p23
#define FIX_BIAS 0x1.8p52  // x + FIX_BIAS rounds x to an integer when |x| < 2^51

ALWAYS_INLINE int64_t fix_from(double v) { return (int64_t)llrint(v * FIX_ONE); } // needs |v| < 2^23
ALWAYS_INLINE double fix_to(int64_t a) { return (double)a * (1.0 / FIX_ONE); }
ALWAYS_INLINE double fix_term_limit(long terms) {
    double lim = FIX_SUM_MAX / (double)(terms > 0 ? terms : 1);
    return lim < FIX_TERM_MAX ? lim : FIX_TERM_MAX;
}
// one term of a sum of `terms` terms, range-checked
static inline int64_t fix_term(double v, long terms, const char* what) {
    if (!(fabs(v) < fix_term_limit(terms)))
        fatal("%s: value %g is %s for an exact sum of %ld terms (limit %g)%s%ld: training has diverged; "
              "lower --lr or use --clip", what, v, isfinite(v) ? "too large" : "not finite", terms,
              fix_term_limit(terms), current_step > 0 ? " at step " : ", before step ", current_step > 0 ? current_step : 1L);
    return fix_from(v);
}
static void fix_zero(int64_t* a, long n) { memset(a, 0, (size_t)n * sizeof(int64_t)); }

// The same rounding as fix_from, vectorisable, for |v| < 2^11: v * 2^40 is exact, adding
// 1.5 * 2^52 rounds it to an integer (to nearest, ties to even, like llrint), and the bits
// of that double minus the bits of 1.5 * 2^52 are the integer.
ALWAYS_INLINE int64_t fix_fast(double v) {
    double t = v * FIX_ONE + FIX_BIAS, bias = FIX_BIAS;
    int64_t bits, bias_bits;
    memcpy(&bits, &t, sizeof bits);
    memcpy(&bias_bits, &bias, sizeof bias_bits);
    return bits - bias_bits;
}
// acc[i] += x[i] as exact terms of a sum of `terms` terms; a fatal error if any is out of range
VECTOR_CLONES static void fix_add(int64_t* acc, const float* x, long n, long terms, const char* what) {
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
// bf16 operands (--precision bf16)
//
// With --precision bf16 every matrix product takes its operands (weights, activations and
// their gradients) rounded to bf16, as autocast does, and keeps its sum as it is: exact where
// a layout may split it, an fp32 chain otherwise. Rounding is a function of one value, so
// every layout rounds the same values to the same bits; a bf16 x bf16 product is exact in a
// double, so the exact sums stay exact. The weights stay fp32 (the master copy the optimizer
// updates); the kernels round them as they pack them, which is the bf16 compute copy. cli.h
// sets this before any product.
static int operands_bf16;

// x rounded to the nearest bf16 (ties to even), kept in a float; a NaN stays a NaN (plain
// rounding would turn a payload held in the low 16 bits into infinity, or carry an all-ones
// payload into the sign).
ALWAYS_INLINE float bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    u = (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) & 0xffff0000u : r;
    memcpy(&x, &u, sizeof x);
    return x;
}
// x as a product's operand: rounded when `round` (the bodies below are compiled once with
// round 1 and once with 0, so that fp32 runs pay nothing for it)
ALWAYS_INLINE float operand_round(float x, int round) { return round ? bf16_round(x) : x; }
ALWAYS_INLINE float operand(float x) { return operand_round(x, operands_bf16); }
// body(args..., round) with round a constant, 1 with bf16 operands and 0 without
#define OPERANDS_DISPATCH(body, ...)                   \
    do {                                               \
        if (operands_bf16) body(__VA_ARGS__, 1);       \
        else body(__VA_ARGS__, 0);                     \
    } while (0)

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
//   add per term, on doubles (8 to a 512-bit vector where floats are 16): about 0.4 of the
//   float kernel's speed, and exact.

// A weight packed for the kernels, kept while workspace_keep_weights says so (below).
typedef struct {
    const float* w;    // the weight [K][J]
    int use, K, J;     // packed for which use (PackUse, below)
    int fresh;         // packed since the weights were last kept
    double maxabs;     // max |w|: matmul_exact's range check
    void* data;        // the packing
} PackedWeight;

typedef struct {
    double* pa; // packed left operand, scaled by 2^40
    double* pb; // packed right operand
    float* tr;  // a transposed weight or output gradient, for the input gradient
    float* pf;  // packed right operand of matmul_float
    float* ra;  // matmul_float's left operand rounded to bf16 (--precision bf16), allocated when first needed
    long pa_cap, pb_cap, tr_cap, pf_cap, ra_cap;
    PackedWeight now;             // a weight packed into the buffers above
    PackedWeight* kept;           // weights packed into buffers of their own (two uses a linear layer)
    int n_kept, cap_kept, keeping;
} Workspace;

// Sizes for any matmul of up to `rows` rows, `width` features and `weight` weight elements.
static void workspace_init(Workspace* ws, long rows, long width, long weight) {
    long most = weight > rows * width ? weight : rows * width; // a weight, or a batch of activations
    long pad = 32 * (rows > width ? rows : width);              // panels round the width up to 32
    ws->tr_cap = most;
    ws->pa_cap = ws->pb_cap = ws->pf_cap = most + pad; // blocks round the rows up to 4
    ws->pa = mallocCheck(ws->pa_cap * sizeof(double));
    ws->pb = mallocCheck(ws->pb_cap * sizeof(double));
    ws->tr = mallocCheck(ws->tr_cap * sizeof(float));
    ws->pf = mallocCheck(ws->pf_cap * sizeof(float));
    ws->ra = NULL, ws->ra_cap = 0;
    ws->now = (PackedWeight){0};
    ws->kept = NULL, ws->n_kept = ws->cap_kept = ws->keeping = 0;
}
static void workspace_free(Workspace* ws) {
    for (int i = 0; i < ws->n_kept; i++) free(ws->kept[i].data);
    free(ws->kept);
    free(ws->pf);
    free(ws->ra);
    free(ws->pa);
    free(ws->pb);
    free(ws->tr);
}

// Vector types (GCC and Clang vector extensions: portable C, lowered to whatever SIMD the
// machine has) for the exact kernels, whose accumulators must stay in registers.
typedef double f64x8 __attribute__((vector_size(64)));
typedef uint64_t u64x8 __attribute__((vector_size(64)));
// Keeps a loaded vector in a register: without it GCC reloads it from memory for each of its
// uses (as an FMA's memory operand), and loads, not FMAs, then bound the kernel's speed.
// A wide body is compiled for AVX-512 only (where its 64-byte vectors fit one register).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define IN_REGISTER(v) __asm__("" : "+v"(v))
#define WIDE_BODY ISA_AVX512
#else
#define IN_REGISTER(v) ((void)0)
#define WIDE_BODY
#endif
typedef double f64x4 __attribute__((vector_size(32)));
typedef uint64_t u64x4 __attribute__((vector_size(32)));
// The same, at any address a double may have: a load or store through these is one vector
// instruction. (A memcpy into a vector is the portable spelling, but GCC expands it by the
// tuning's preferred width: -march=native on an Intel CPU that prefers 256-bit vectors, a
// Rocket Lake here, copied each 64-byte operand as two 32-byte halves through the stack and
// read it back whole, a store-forwarding stall per operand that made the exact kernel 6
// times slower than the same source built without -march=native.)
typedef double f64x8_unaligned __attribute__((vector_size(64), aligned(8)));
typedef uint64_t u64x8_unaligned __attribute__((vector_size(64), aligned(8)));
typedef double f64x4_unaligned __attribute__((vector_size(32), aligned(8)));
#define F64X8_SPLAT(x) ((f64x8){(x), (x), (x), (x), (x), (x), (x), (x)}) // macros: no vector ABI
#define F64X4_SPLAT(x) ((f64x4){(x), (x), (x), (x)})
ALWAYS_INLINE uint64_t fix_bias_bits(void) {
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

// One kernel, three instruction sets. Each tile kernel below is written once (its _body)
// and compiled three times on x86-64: for AVX-512, for AVX2 with FMA, and for any x86-64
// CPU; the first call asks the CPU which it runs. The three give the same bits: fmaf is
// correctly rounded whether an FMA instruction or the C library computes it, and the exact
// kernel's fused product is exact either way (see matmul_exact below). So a build without
// -march=native is as fast as one with it, on any CPU of the last ten years.
// (The macros are in util.h.)

// Both kernels work on register tiles: a tile of 8 rows of the output, each a few vectors
// wide, is accumulated in registers over the whole reduction, then stored. The right
// operand is first packed into panels as wide as a tile, contiguous and zero-padded
// (rows of a matrix 4 KiB wide would otherwise all fall into the same cache set), and
// rows past the last one read the last row again and are not stored, so every tile is a
// full tile and the compiler generates one tight loop for all of them.

// matmul_float: tiles of 8 rows x 32 columns. The unroll pragmas make the compiler keep
// the 256 accumulators in registers (without them it may interchange the loops and keep
// them in memory, 10 times slower). That fills AVX-512's 32 registers of 16 floats; AVX2
// has 16 registers of 8 floats, so its body does the tile as 4 parts of 4 rows x 16
// columns (8 accumulators each), each over the whole reduction.
#define MF_ROWS 8
#define MF_COLS 32
ALWAYS_INLINE void float_tile_store(float* out, const float acc[MF_ROWS][MF_COLS], int N, int mb, int nb) {
    for (int r = 0; r < mb; r++) memcpy(out + (long)r * N, acc[r], (size_t)nb * sizeof(float));
}
ALWAYS_INLINE void matmul_float_tile_wide_body(float* out, const float* const* arow, const float* panel, int red,
                                               int N, int mb, int nb) {
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
    float_tile_store(out, acc, N, mb, nb);
}
ALWAYS_INLINE void matmul_float_tile_body(float* out, const float* const* arow, const float* panel, int red, int N,
                                          int mb, int nb) {
    enum { RS = 4, CS = 16 }; // a part: RS rows x CS columns
    float acc[MF_ROWS][MF_COLS];
    for (int r0 = 0; r0 < MF_ROWS; r0 += RS)
        for (int c0 = 0; c0 < MF_COLS; c0 += CS) {
            float part[RS][CS];
            for (int r = 0; r < RS; r++)
                for (int c = 0; c < CS; c++) part[r][c] = 0.0f;
            for (int i = 0; i < red; i++) {
                const float* bi = panel + (long)i * MF_COLS + c0;
#pragma GCC unroll 4
                for (int r = 0; r < RS; r++) {
                    float ar = arow[r0 + r][i];
#pragma GCC unroll 16
                    for (int c = 0; c < CS; c++) part[r][c] = fmaf(ar, bi[c], part[r][c]);
                }
            }
            for (int r = 0; r < RS; r++) memcpy(&acc[r0 + r][c0], part[r], sizeof part[r]);
        }
    float_tile_store(out, acc, N, mb, nb);
}
KERNEL_VARIANTS(, matmul_float_tile,
                (float* out, const float* const* arow, const float* panel, int red, int N, int mb, int nb),
                (out, arow, panel, red, N, mb, nb))

// Panel p of b ([red][N]) into dst [red][32], zero-padded past column N.
ALWAYS_INLINE void pack_panel_float_body(float* dst, const float* b, int red, int N, int p, int round) {
    for (long i = 0; i < red; i++)
        for (int c = 0; c < MF_COLS; c++)
            dst[i * MF_COLS + c] = p * MF_COLS + c < N ? operand_round(b[i * N + p * MF_COLS + c], round) : 0.0f;
}
VECTOR_CLONES static void pack_panel_float(float* dst, const float* b, int red, int N, int p) {
    OPERANDS_DISPATCH(pack_panel_float_body, dst, b, red, N, p);
}
// Tile t of out: panel by panel, so that a panel stays in cache across its tiles.
static void matmul_float_at(int t, float* out, const float* a, const float* pf, int M, int red, int N) {
    int tm = (M + MF_ROWS - 1) / MF_ROWS, p = t / tm, m0 = (t % tm) * MF_ROWS, n0 = p * MF_COLS;
    int mb = M - m0 < MF_ROWS ? M - m0 : MF_ROWS, nb = N - n0 < MF_COLS ? N - n0 : MF_COLS;
    const float* arow[MF_ROWS];
    for (int r = 0; r < MF_ROWS; r++) arow[r] = a + (long)(m0 + (r < mb ? r : mb - 1)) * red;
    matmul_float_tile(out + (long)m0 * N + n0, arow, pf + (long)p * red * MF_COLS, red, N, mb, nb);
}

// Every panel of b ([red][N]) into dst [tn][red][32].
static void pack_float_panels(float* dst, const float* b, int red, int N) {
    int tn = (N + MF_COLS - 1) / MF_COLS;
    PARALLEL_FOR((long)red * N, p, tn, pack_panel_float(dst + (long)p * red * MF_COLS, b, red, N, p));
}
// out = a b, from b's panels pf (packed with bf16 operands rounded). The tiles read a
// unpacked, so with bf16 operands a is first copied, rounded, into ws->ra.
static void matmul_float_packed(float* out, const float* a, const float* pf, int M, int red, int N, Workspace* ws) {
    if (operands_bf16) {
        if ((long)M * red > ws->ra_cap) {
            free(ws->ra);
            ws->ra_cap = (long)M * red;
            ws->ra = mallocCheck((size_t)ws->ra_cap * sizeof(float));
        }
        for (long i = 0; i < (long)M * red; i++) ws->ra[i] = bf16_round(a[i]);
        a = ws->ra;
    }
    int tm = (M + MF_ROWS - 1) / MF_ROWS, tn = (N + MF_COLS - 1) / MF_COLS;
    cpu_isa(); // asked once, before any thread reads it
    PARALLEL_FOR((long)M * N * red / 8, t, tm * tn, matmul_float_at(t, out, a, pf, M, red, N));
}
// out[m][n] = sum over i of a[m][i] * b[i][n], a fused multiply-add chain in the order
// i = 0, 1, ..., red-1 for every element, whatever tile or thread it falls in.
static void matmul_float(float* out, const float* a, const float* b, int M, int red, int N, Workspace* ws) {
    if ((long)(N + MF_COLS - 1) / MF_COLS * MF_COLS * red > ws->pf_cap)
        fatal("internal: workspace too small for a %d x %d matmul", red, N);
    pack_float_panels(ws->pf, b, red, N);
    matmul_float_packed(out, a, ws->pf, M, red, N, ws);
}

// matmul_exact: tiles of 4 rows x 32 columns. Both operands are packed: the right one
// into panels 32 columns wide, as for matmul_float, and the left one (scaled by 2^40) into
// blocks of 4 rows stored column by column, so that the 4 values a tile broadcasts at step
// i are adjacent whatever a's layout (a forward reads a by rows, a weight gradient by
// columns). 32 columns are a whole panel of the narrow matrices of small models (27
// logits, 32 rows), where tiles 24 wide left a third of the work to padding.
//
// The tile has two bodies, for the two register files. AVX-512 has 32 registers of 8
// doubles: the whole 4 x 32 tile (16 accumulators) stays in registers over the reduction.
// AVX2 has 16 registers of 4 doubles: the tile is done as 4 strips of 4 x 8 (8
// accumulators), each over the whole reduction. Both end in the same store.
#define ME_ROWS 4
#define ME_COLS 32
// add: acc += the tile's sums; otherwise acc = them (a caller that would zero acc first
// saves that pass, and the stores do not read acc: 2% of the large MLP's input gradient).
ALWAYS_INLINE void exact_tile_store(int64_t* acc, const uint64_t sum[ME_ROWS][ME_COLS], int red, int N, int mb, int nb,
                                    int add) {
    uint64_t total_bias = (uint64_t)red * fix_bias_bits(); // unsigned: the biased sums wrap, by design
    for (int r = 0; r < mb; r++)
        for (int c = 0; c < nb; c++)
            acc[(long)r * N + c] = (add ? acc[(long)r * N + c] : 0) + (int64_t)(sum[r][c] - total_bias);
}
EXACT_KERNEL WIDE_BODY ALWAYS_INLINE void matmul_exact_tile_wide_body(int64_t* acc, const double* block, const double* panel,
                                                           int red, int N, int mb, int nb, int add) {
    EXACT_KERNEL_BODY
    enum { V = ME_COLS / 8 };
    u64x8 sum[ME_ROWS][V] = {{{0}}};
    const f64x8 bias = F64X8_SPLAT(FIX_BIAS);
    for (int i = 0; i < red; i++) {
        f64x8 bv[V];
        for (int v = 0; v < V; v++) {
            bv[v] = *(const f64x8_unaligned*)(panel + (long)i * ME_COLS + 8 * v);
            IN_REGISTER(bv[v]);
        }
        for (int r = 0; r < ME_ROWS; r++) {
            f64x8 ar = F64X8_SPLAT(block[(long)i * ME_ROWS + r]);
            for (int v = 0; v < V; v++) sum[r][v] += (u64x8)(ar * bv[v] + bias); // the bits: see above
        }
    }
    uint64_t total_bias = (uint64_t)red * fix_bias_bits();
    for (int r = 0; r < mb; r++) { // as exact_tile_store, by whole vectors where it can
        uint64_t* o = (uint64_t*)acc + (long)r * N;
        int v = 0;
        for (; 8 * v + 8 <= nb; v++) {
            u64x8 cur = sum[r][v] - total_bias;
            if (add) cur += *(u64x8_unaligned*)(o + 8 * v);
            *(u64x8_unaligned*)(o + 8 * v) = cur;
        }
        for (int c = 8 * v; c < nb; c++) o[c] = (add ? o[c] : 0) + sum[r][v][c - 8 * v] - total_bias;
    }
}
EXACT_KERNEL ALWAYS_INLINE void matmul_exact_tile_body(int64_t* acc, const double* block, const double* panel, int red,
                                                      int N, int mb, int nb, int add) {
    EXACT_KERNEL_BODY
    enum { S = 8 }; // strip width
    uint64_t out[ME_ROWS][ME_COLS];
    const f64x4 bias = F64X4_SPLAT(FIX_BIAS);
    for (int c0 = 0; c0 < ME_COLS; c0 += S) {
        u64x4 sum[ME_ROWS][S / 4] = {{{0}}};
        for (int i = 0; i < red; i++) {
            f64x4 bv[S / 4];
            for (int v = 0; v < S / 4; v++) bv[v] = *(const f64x4_unaligned*)(panel + (long)i * ME_COLS + c0 + 4 * v);
            for (int r = 0; r < ME_ROWS; r++) {
                f64x4 ar = F64X4_SPLAT(block[(long)i * ME_ROWS + r]);
                for (int v = 0; v < S / 4; v++) sum[r][v] += (u64x4)(ar * bv[v] + bias);
            }
        }
        for (int r = 0; r < ME_ROWS; r++) memcpy(&out[r][c0], sum[r], sizeof sum[r]);
    }
    exact_tile_store(acc, out, red, N, mb, nb, add);
}
KERNEL_VARIANTS(EXACT_KERNEL, matmul_exact_tile,
                (int64_t* acc, const double* block, const double* panel, int red, int N, int mb, int nb, int add),
                (acc, block, panel, red, N, mb, nb, add))
// Rows [i0, i1) of every panel of b ([red][N]) into dst [tn][red][32] as doubles,
// zero-padded past column N. Row by row of b, so that b is read once and in order, and
// whole panels with no test per element, which the compiler converts 16 floats at a time:
// 0.09 ns an element against 0.5 for the panel-by-panel loop with a test per element that
// this replaced (512 x 192, the GPT's qkv output gradient; Zen 5).
ALWAYS_INLINE void pack_panels_double_rows_body(double* dst, const float* b, int red, int N, int i0, int i1, int round) {
    int full = N / ME_COLS, rest = N % ME_COLS;
    for (int p = 0; p < full; p++)
        for (long i = i0; i < i1; i++) {
            double* d = dst + ((long)p * red + i) * ME_COLS;
            for (int c = 0; c < ME_COLS; c++) d[c] = operand_round(b[i * N + p * ME_COLS + c], round);
        }
    if (rest)
        for (long i = i0; i < i1; i++) {
            double* d = dst + ((long)full * red + i) * ME_COLS;
            for (int c = 0; c < ME_COLS; c++) d[c] = c < rest ? (double)operand_round(b[i * N + full * ME_COLS + c], round) : 0.0;
        }
}
VECTOR_CLONES static void pack_panels_double_rows(double* dst, const float* b, int red, int N, int i0, int i1) {
    OPERANDS_DISPATCH(pack_panels_double_rows_body, dst, b, red, N, i0, i1);
}
// Block q of a, rows m0 = 4q.. of a(m,i) = a[m*a_sm + i*a_si], into dst [red][4] as doubles
// scaled by 2^40; rows past the last repeat the last (the tile computes them, never stores them).
ALWAYS_INLINE void pack_block_double_body(double* dst, const float* a, long a_sm, long a_si, int M, int red, int q,
                                          int round) {
    const float* row[ME_ROWS];
    for (int r = 0; r < ME_ROWS; r++) row[r] = a + (q * ME_ROWS + r < M ? q * ME_ROWS + r : M - 1) * a_sm;
    if (a_si == 1) { // rows contiguous (a forward's input, a weight read along its rows): no stride to multiply
        for (long i = 0; i < red; i++)
            for (int r = 0; r < ME_ROWS; r++) dst[i * ME_ROWS + r] = (double)operand_round(row[r][i], round) * FIX_ONE;
        return;
    }
    for (long i = 0; i < red; i++)
        for (int r = 0; r < ME_ROWS; r++) dst[i * ME_ROWS + r] = (double)operand_round(row[r][i * a_si], round) * FIX_ONE;
}
VECTOR_CLONES static void pack_block_double(double* dst, const float* a, long a_sm, long a_si, int M, int red, int q) {
    OPERANDS_DISPATCH(pack_block_double_body, dst, a, a_sm, a_si, M, red, q);
}
// Rows [i0, i1) of every block of a whose columns are contiguous (a_sm = 1: a weight
// gradient's x^T, a(m,i) = x[i][m]): each block takes 4 adjacent floats of a row of x, so x
// is read once and in order, where block by block it was read by columns, a cache line
// for every 4 floats (0.1 against 0.4 ns an element, 512 x 1024, Zen 5).
ALWAYS_INLINE void pack_blocks_double_rows_body(double* dst, const float* a, long a_si, int M, int red, int i0, int i1,
                                                int round) {
    int full = M / ME_ROWS, rest = M % ME_ROWS;
    for (int q = 0; q < full; q++)
        for (long i = i0; i < i1; i++) {
            double* d = dst + ((long)q * red + i) * ME_ROWS;
            for (int r = 0; r < ME_ROWS; r++) d[r] = (double)operand_round(a[i * a_si + q * ME_ROWS + r], round) * FIX_ONE;
        }
    if (rest)
        for (long i = i0; i < i1; i++) {
            double* d = dst + ((long)full * red + i) * ME_ROWS;
            for (int r = 0; r < ME_ROWS; r++)
                d[r] = (double)operand_round(a[i * a_si + (r < rest ? full * ME_ROWS + r : M - 1)], round) * FIX_ONE;
        }
}
VECTOR_CLONES static void pack_blocks_double_rows(double* dst, const float* a, long a_si, int M, int red, int i0, int i1) {
    OPERANDS_DISPATCH(pack_blocks_double_rows_body, dst, a, a_si, M, red, i0, i1);
}
// The order of the tiles. Each tile reads its block (red x 32 bytes) and its panel (red x
// 256 bytes) from start to end, so what matters is which of them the cache still holds
// when the next tile needs it:
//  - when every panel fits in the core's L2 cache together (EXACT_PANELS_BYTES), block by
//    block: a block's tiles update its 4 rows of acc from left to right, so acc, the largest
//    operand (8 bytes an element: a 1024 x 1024 weight gradient is 8 MB), is read and
//    written as 4 sequential streams; panel by panel, a tile of a weight gradient of 32 rows
//    (a pipeline's microbatch) was 1.1x slower, 1.35x with the other core busy (Zen 4);
//  - otherwise in groups of blocks that fit in L2 beside a panel (EXACT_GROUP_BYTES): panel
//    by panel within a group, so that a panel comes from L2 for every block of the group,
//    and the group's blocks for every panel. Block by block, every tile read its panel from
//    L3 or memory: the tiles of the GPT's qkv weight gradient ran at 67-73 GFLOP/s, in
//    groups at 88-92; the large MLP's input gradient (1024 x 1024 x 256) 55-65 and 72-80,
//    against 92-94 for a tile whose operands are in L1 (the tile's own bound; Zen 5).
#define EXACT_PANELS_BYTES (512 << 10)
#define EXACT_GROUP_BYTES (256 << 10)
static int exact_group(int M, int red, int N) { // blocks to a group
    int tm = (M + ME_ROWS - 1) / ME_ROWS, tn = (N + ME_COLS - 1) / ME_COLS;
    long block = (long)red * ME_ROWS * sizeof(double), panels = (long)tn * red * ME_COLS * sizeof(double);
    long g = panels <= EXACT_PANELS_BYTES ? 1 : EXACT_GROUP_BYTES / block;
    return g < 1 ? 1 : g > tm ? tm : (int)g;
}
// Tile t of acc: groups of g blocks, in each group panel by panel, in each panel block by
// block. Every tile is computed whole by whichever thread runs it.
static void matmul_exact_at(int t, int64_t* acc, const double* pa, const double* pb, int M, int red, int N, int g,
                            int add) {
    int tm = (M + ME_ROWS - 1) / ME_ROWS, tn = (N + ME_COLS - 1) / ME_COLS;
    int q0 = t / (g * tn) * g, size = tm - q0 < g ? tm - q0 : g, local = t - q0 * tn;
    int p = local / size, q = q0 + local % size, m0 = q * ME_ROWS, n0 = p * ME_COLS;
    int mb = M - m0 < ME_ROWS ? M - m0 : ME_ROWS, nb = N - n0 < ME_COLS ? N - n0 : ME_COLS;
    matmul_exact_tile(acc + (long)m0 * N + n0, pa + (long)q * red * ME_ROWS, pb + (long)p * red * ME_COLS, red, N, mb,
                      nb, add);
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
ALWAYS_INLINE uint32_t abs_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u & 0x7fffffffu;
}
VECTOR_CLONES static double max_abs(const float* x, long n) {
    uint32_t mx = 0;
    if (THREADED(n)) {
OMP(omp parallel for reduction(max : mx))
        for (long i = 0; i < n; i++) mx = abs_bits(x[i]) > mx ? abs_bits(x[i]) : mx;
    } else {
        for (long i = 0; i < n; i++) mx = abs_bits(x[i]) > mx ? abs_bits(x[i]) : mx;
    }
    if (mx >= 0x7f800000u) return INFINITY;
    float f;
    memcpy(&f, &mx, sizeof f);
    return f;
}
// matmul_exact in its steps, for callers that pack an operand once and use it many times
// (the weights kept below). a(m,i) = a[m*a_sm + i*a_si], b a row-major [red][N] matrix.
//
// The range check: amax and bmax are max |a| and max |b|.
static void matmul_exact_check(const float* a, long a_sm, long a_si, const float* b, int M, int red, int N,
                               double amax, double bmax, long terms, const char* what) {
#define A_(m, i) operand(a[(m) * a_sm + (i) * a_si])
#define B_(i, n) operand(b[(long)(i) * N + (n)])
    // rounding is monotonic: the largest rounded operand is the largest one rounded
    MATMUL_EXACT_CHECK(M, red, N, A_, B_, operand((float)amax), operand((float)bmax), terms, what);
#undef A_
#undef B_
}
// a as doubles scaled by 2^40 into blocks dst [tm][red][4]
#define PACK_ROWS 16 // rows of a or b packed at a time: 16 rows of a 1024-float matrix fill 64 KB
static void pack_exact_blocks(double* dst, const float* a, long a_sm, long a_si, int M, int red) {
    int tm = (M + ME_ROWS - 1) / ME_ROWS, chunks = (red + PACK_ROWS - 1) / PACK_ROWS;
    if (a_sm == 1 && a_si >= M) // x^T of an x [red][a_si]
        PARALLEL_FOR((long)M * red, k, chunks,
                     pack_blocks_double_rows(dst, a, a_si, M, red, k * PACK_ROWS,
                                             red < (k + 1) * PACK_ROWS ? red : (k + 1) * PACK_ROWS));
    else
        PARALLEL_FOR((long)M * red, q, tm, pack_block_double(dst + (long)q * red * ME_ROWS, a, a_sm, a_si, M, red, q));
}
// b as doubles into panels dst [tn][red][32]
static void pack_exact_panels(double* dst, const float* b, int red, int N) {
    int chunks = (red + PACK_ROWS - 1) / PACK_ROWS;
    PARALLEL_FOR((long)red * N, k, chunks,
                 pack_panels_double_rows(dst, b, red, N, k * PACK_ROWS, red < (k + 1) * PACK_ROWS ? red : (k + 1) * PACK_ROWS));
}
// acc += a b (add), or acc = a b, from a's blocks pa and b's panels pb
static void matmul_exact_packed(int64_t* acc, const double* pa, const double* pb, int M, int red, int N, int add) {
    int tm = (M + ME_ROWS - 1) / ME_ROWS, tn = (N + ME_COLS - 1) / ME_COLS, g = exact_group(M, red, N);
    cpu_isa(); // asked once, before any thread reads it
    PARALLEL_FOR((long)M * N * red / 8, t, tm * tn, matmul_exact_at(t, acc, pa, pb, M, red, N, g, add));
}
static void exact_workspace_check(const Workspace* ws, int M, int red, int N, const char* what) {
    if ((long)(M + ME_ROWS - 1) / ME_ROWS * ME_ROWS * red > ws->pa_cap ||
        (long)(N + ME_COLS - 1) / ME_COLS * ME_COLS * red > ws->pb_cap)
        fatal("internal: workspace too small for %s (%d x %d x %d)", what, M, red, N);
}

// acc[m][n] += exact sum over i of a(m,i) * b[i][n], with a(m,i) = a[m*a_sm + i*a_si]
// (a is x[R][K] for a forward, m = r; or x[R][K] read as x^T for a weight gradient,
// m = k) and b a row-major [red][N] matrix (the weight, or the output gradient).
// `terms` is the number of terms in the whole sum, across every rank and microbatch that
// contributes to it: it sets the range limit, so every layout applies the same one.
static void matmul_exact(int64_t* acc, const float* a, long a_sm, long a_si, const float* b, int M, int red, int N,
                         long terms, const char* what, Workspace* ws) {
    exact_workspace_check(ws, M, red, N, what);
    // a: M x red floats, either way
    matmul_exact_check(a, a_sm, a_si, b, M, red, N, max_abs(a, (long)M * red), max_abs(b, (long)red * N), terms, what);
    pack_exact_blocks(ws->pa, a, a_sm, a_si, M, red);
    pack_exact_panels(ws->pb, b, red, N);
    matmul_exact_packed(acc, ws->pa, ws->pb, M, red, N, 1);
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


// dst[c][r] = float(src[r][c]) for src [rows][cols]: exact sums rounded to float once, and
// transposed, by blocks through buffers for the reason transpose gives.
VECTOR_CLONES static void fix_transpose(float* dst, const int64_t* src, int rows, int cols) {
    enum { TB = TRANSPOSE_BLOCK };
    for (int r0 = 0; r0 < rows; r0 += TB)
        for (int c0 = 0; c0 < cols; c0 += TB) {
            if (r0 + TB <= rows && c0 + TB <= cols) {
                int64_t in[TB][TB];
                float out[TB][TB];
                for (int r = 0; r < TB; r++) memcpy(in[r], src + (long)(r0 + r) * cols + c0, sizeof in[r]);
                for (int c = 0; c < TB; c++)
                    for (int r = 0; r < TB; r++) out[c][r] = (float)fix_to(in[r][c]);
                for (int c = 0; c < TB; c++) memcpy(dst + (long)(c0 + c) * rows + r0, out[c], sizeof out[c]);
            } else { // a block at the edge, in part
                for (int r = r0; r < rows && r < r0 + TB; r++)
                    for (int c = c0; c < cols && c < c0 + TB; c++) dst[(long)c * rows + r] = (float)fix_to(src[(long)r * cols + c]);
            }
        }
}

// ----------------------------------------------------------------------------
// weights packed once per step
//
// Each matmul packs its operands, and a weight is an operand twice a step: of the forward
// and of the input gradient. A pipeline stage runs both once per microbatch with the same
// weights, so with 8 microbatches it packed each weight 8 times: for a 1024 x 1024 weight
// that is 4 MB read and up to 8 MB written (doubles), plus a pass for max |w|, per 32-row
// product of 67 MFLOP. Between workspace_keep_weights(ws, 1) and (ws, 0), model.h's
// linear layers pack each weight once per use and keep it (about 3 times the weights'
// bytes more memory); the caller promises that no weight changes in between (train_pp.c:
// one step's schedule, before the optimizer). Kept or not, the packed values are the same.
typedef enum {
    PACK_FLOAT,     // panels of w [K][J], for matmul_float (a forward)
    PACK_FLOAT_T,   // panels of w^T [J][K], for matmul_float (an input gradient)
    PACK_EXACT_B,   // w as matmul_exact's right operand (a forward)
    PACK_EXACT_A,   // w as matmul_exact's left operand (an input gradient), scaled
} PackUse;
static long packed_elements(PackUse use, int K, int J) {
    switch (use) {
    case PACK_FLOAT: return (long)(J + MF_COLS - 1) / MF_COLS * MF_COLS * K;
    case PACK_FLOAT_T: return (long)(K + MF_COLS - 1) / MF_COLS * MF_COLS * J;
    case PACK_EXACT_B: return (long)(J + ME_COLS - 1) / ME_COLS * ME_COLS * K;
    default: return (long)(K + ME_ROWS - 1) / ME_ROWS * ME_ROWS * J;
    }
}
// Weight w [K][J] packed for `use` (with max |w| for the exact uses): the kept packing if
// it is kept and already packed this step, otherwise packed now, into a kept buffer or
// into the workspace's own.
static const PackedWeight* weight_packed(Workspace* ws, const float* w, PackUse use, int K, int J) {
    PackedWeight* p = &ws->now;
    long n = packed_elements(use, K, J), bytes = n * (use == PACK_FLOAT || use == PACK_FLOAT_T ? 4 : 8);
    if (ws->keeping) {
        p = NULL;
        for (int i = 0; i < ws->n_kept && !p; i++)
            if (ws->kept[i].w == w && ws->kept[i].use == (int)use && ws->kept[i].K == K && ws->kept[i].J == J) p = &ws->kept[i];
        if (p && p->fresh) return p;
        if (!p) {
            if (ws->n_kept == ws->cap_kept) { // a GPT with experts keeps 2 x (4 + 2 X) a block
                ws->cap_kept = ws->cap_kept ? 2 * ws->cap_kept : 64;
                ws->kept = reallocCheck(ws->kept, (size_t)ws->cap_kept * sizeof(PackedWeight));
            }
            p = &ws->kept[ws->n_kept++];
            *p = (PackedWeight){.w = w, .use = use, .K = K, .J = J, .data = mallocCheck((size_t)bytes)};
        }
    } else {
        void* own[] = {ws->pf, ws->pf, ws->pb, ws->pa};
        long cap[] = {ws->pf_cap, ws->pf_cap, ws->pb_cap, ws->pa_cap};
        if (n > cap[use]) fatal("internal: workspace too small for a %d x %d weight", K, J);
        p->data = own[use];
    }
    if (use == PACK_FLOAT) pack_float_panels(p->data, w, K, J);
    if (use == PACK_FLOAT_T) {
        if ((long)K * J > ws->tr_cap) fatal("internal: workspace too small for a %d x %d transpose", K, J);
        transpose(ws->tr, w, K, J);
        pack_float_panels(p->data, ws->tr, J, K);
    }
    if (use == PACK_EXACT_B) pack_exact_panels(p->data, w, K, J);
    if (use == PACK_EXACT_A) pack_exact_blocks(p->data, w, J, 1, K, J);
    p->maxabs = use == PACK_EXACT_A || use == PACK_EXACT_B ? max_abs(w, (long)K * J) : 0.0;
    p->fresh = ws->keeping;
    return p;
}
// Keep packed weights from now on (1), or forget them (0): a weight may change after this.
static void workspace_keep_weights(Workspace* ws, int keep) {
    for (int i = 0; i < ws->n_kept; i++) ws->kept[i].fresh = 0;
    ws->keeping = keep;
}

// ----------------------------------------------------------------------------
// expf, many at a time
//
// GELU calls expf once an element, twice a step (forward and backward): through the C
// library, one call at a time, that was 28% of the GPT's step at C 64 (docs/performance.md).
// expf_array computes what glibc's expf computes (its __expf_fma, the variant it picks on a
// CPU with FMA; glibc 2.36 and later): x 32/ln2 rounded by adding 1.5 x 2^52, 2^(k/32) from a
// table, a cubic in the remainder, all in double with fused multiply-adds where glibc has
// them; fma is correctly rounded on any CPU, so every instruction set gives the same bits,
// which are glibc's (`bench/bench expf --all` compares them with expf on all 2^32 floats,
// and tests/test_units on a sample). The pass over every element has no branch, so the
// compiler vectorizes it (gathers for the table); the few arguments outside the quick range
// (|x| >= 88, infinities, NaN), which glibc sends to its own slow path, are then recomputed
// by the C library's expf.
static const uint64_t EXP2F_TABLE[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540};
ALWAYS_INLINE double bits_double(uint64_t u) {
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}
ALWAYS_INLINE uint64_t double_bits(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}
ALWAYS_INLINE uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
ALWAYS_INLINE int expf_slow(float x) { return (float_bits(x) >> 20 & 0x7ff) > 0x42a; } // |x| >= 88, inf, NaN
ALWAYS_INLINE float expf_quick(float x) {
    const double inv = bits_double(0x40471547652b82fe), shift = 0x1.8p52, c0 = bits_double(0x3ebc6af84b912394),
                 c1 = bits_double(0x3f2ebfce50fac4f3), c2 = bits_double(0x3f962e42ff0c52d6);
    uint32_t keep = (uint32_t)expf_slow(x) - 1u, u = float_bits(x) & keep; // the slow ones as 0 (recomputed)
    float xq;
    memcpy(&xq, &u, sizeof xq);
    double xd = (double)xq;
    double kd = fma(inv, xd, shift);                 // k + 1.5 x 2^52, k = round(x 32/ln2)
    uint64_t ki = double_bits(kd);
    kd -= shift;
    double r = fma(inv, xd, -kd); // x 32/ln2 - k
    double s = bits_double(EXP2F_TABLE[ki & 31] + (ki << 47)); // 2^(k/32)
    double z = fma(c0, r, c1), r2 = r * r, p = fma(r, c2, 1.0);
    return (float)(fma(z, r2, p) * s);
}
ALWAYS_INLINE void expf_array_quick_body(float* y, const float* x, long n) {
    for (long i = 0; i < n; i++) y[i] = expf_quick(x[i]);
}
#define expf_array_quick_wide_body expf_array_quick_body
KERNEL_VARIANTS(, expf_array_quick, (float* y, const float* x, long n), (y, x, n))
// y[i] = expf(x[i]); y may be x
static void expf_array(float* y, const float* x, long n) {
    for (long i0 = 0; i0 < n; i0 += 1024) { // a piece at a time, so that the second pass finds x in cache
        long m = n - i0 < 1024 ? n - i0 : 1024;
        int slow = 0;
        for (long i = i0; i < i0 + m; i++) slow |= expf_slow(x[i]);
        if (!slow) {
            expf_array_quick(y + i0, x + i0, m);
            continue;
        }
        for (long i = i0; i < i0 + m; i++) y[i] = expf_slow(x[i]) ? expf(x[i]) : expf_quick(x[i]);
    }
}

// ----------------------------------------------------------------------------
// the plain loops the kernels above must equal, bit for bit

// out[m][n] = fmaf chain over i = 0, 1, ..., red-1 (of the operands, bf16 ones rounded)
static void matmul_float_ref(float* out, const float* a, const float* b, int M, int red, int N) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int i = 0; i < red; i++) acc = fmaf(operand(a[(long)m * red + i]), operand(b[(long)i * N + n]), acc);
            out[(long)m * N + n] = acc;
        }
}
// acc[m][n] += sum over i of llrint(a(m,i) * b[i][n] * 2^40), a(m,i) = a[m*a_sm + i*a_si]
static void matmul_exact_ref(int64_t* acc, const float* a, long a_sm, long a_si, const float* b, int M, int red,
                             int N) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++)
            for (int i = 0; i < red; i++)
                acc[(long)m * N + n] += llrint((double)operand(a[m * a_sm + i * a_si]) * operand(b[(long)i * N + n]) * FIX_ONE);
}
static void transpose_ref(float* dst, const float* src, int rows, int cols) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[(long)c * rows + r] = src[(long)r * cols + c];
}
static void fix_transpose_ref(float* dst, const int64_t* src, int rows, int cols) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[(long)c * rows + r] = (float)fix_to(src[(long)r * cols + c]);
}

#pragma GCC diagnostic pop
#endif // KERNELS_H
