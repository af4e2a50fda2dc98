/*
 * tests/test_units.c: unit tests of kernels.h, model.h and data.h. Every check prints PASSED or
 * FAILED and its name; the last line counts them and the exit status is 1 on any failure.
 *
 *   make tests/test_units && tests/test_units
 *
 * Sections: kernels against plain loops, bit for bit; the properties that make every
 * layout give the same bits (exact sums split any way); gradient checks of every op and of
 * the whole model against central finite differences in double precision; the data loader.
 */
#include "../model.h"
#include "../data.h"
#include "../report.h"

#include <fcntl.h>
#include <setjmp.h>
#include <sys/mman.h>
#include <unistd.h>

static int n_pass, n_fail;
__attribute__((format(printf, 2, 3))) static void check(int ok, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASSED" : "FAILED");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok) n_pass++;
    else n_fail++;
}

static float frand(uint64_t seed, uint64_t i, float scale) {
    return (float)((2.0 * rng_uniform(seed, 99, i) - 1.0) * scale);
}
static void fill(float* x, long n, uint64_t seed, float scale) {
    for (long i = 0; i < n; i++) x[i] = frand(seed, (uint64_t)i, scale);
}

// ----------------------------------------------------------------------------
// the tables of tensors (config.h): the mapper every layout's slices go through

// For t tensor-parallel ranks: every element of a unit's own tensors is held by exactly one
// rank's slice of each split tensor (padding maps to -1) and by every rank for a whole one,
// and counted in the norm exactly once over the ranks; each slice's size is what the table
// says; the GPT's blocks' slices sit where transformer.h's block_layout(C, C/t, 4C/t) puts
// them (the layout the layers read), and experts follow, each whole.
static void test_tables(const Config* c, int t, const char* what) {
    int ok = 1, counted_ok = 1, layout_ok = 1;
    for (int u = 0; u < n_units(c); u++) {
        UnitTable tab = unit_table(c, u);
        long own = 0;
        for (int i = 0; i < tab.own; i++) own += tab.t[i].rows * tab.t[i].cols;
        if (own + (long)tab.experts * table_expert(&tab) != unit_params(c, u)) ok = 0;
        int* seen = callocCheck((size_t)own, sizeof(int));
        int* count = callocCheck((size_t)own, sizeof(int));
        for (int r = 0; r < t; r++) {
            Share s = {r, t, 0, 0};
            long held = table_own(&tab, t), counted = share_counted(c, u, s);
            for (long e = 0; e < held; e++) {
                long k = table_canonical(&tab, s, e);
                if (k < -1 || k >= own) ok = 0;
                else if (k >= 0) seen[k]++, count[k] += e < counted;
            }
        }
        for (int i = 0, at = 0; i < tab.own; at += (int)(tab.t[i].rows * tab.t[i].cols), i++)
            for (long e = 0; e < tab.t[i].rows * tab.t[i].cols; e++) {
                if (seen[at + e] != (tab.t[i].split == WHOLE ? t : 1)) ok = 0;
                if (count[at + e] != 1) counted_ok = 0;
            }
        free(seen), free(count);
        if (is_gpt(c) && u >= 1 && u <= c->layers) { // the table's slice against the layout the block reads
            int C = c->emb, A = C / t, F = 4 * C / t;
            long l[MAX_TENSORS + 1] = {0};
            for (int i = 0; i < tab.own; i++) l[i + 1] = l[i] + tensor_held(&tab.t[i], t);
            if (is_moe(c, u)) {
                MoeBlockLayout m = moe_block_layout(C, A, expert_width(c), c->experts, c->shared_experts);
                long want[MAX_TENSORS + 1] = {m.qkv_w, m.qkv_b, m.proj_w, m.ln1_g, m.ln1_b, m.proj_b, m.ln2_g, m.ln2_b, m.router_w};
                MlpLayout e = mlp_layout(C, expert_width(c));
                long at[] = {e.fc_w, e.fc_b, e.fc2_w, e.fc2_b}; // each shared expert's tensors, in its block
                for (int s = 0; s < c->shared_experts; s++)
                    for (int i = 0; i < 4; i++) want[9 + 4 * s + i] = m.shared_w + s * m.expert + at[i];
                want[9 + 4 * c->shared_experts] = m.routed;
                for (int i = 0; i <= tab.own; i++) layout_ok &= l[i] == want[i];
                layout_ok &= table_expert(&tab) == m.expert;
            } else {
                BlockLayout b = block_layout(C, A, F);
                long want[] = {b.qkv_w, b.qkv_b, b.proj_w, b.fc_w, b.fc_b, b.fc2_w, b.ln1_g, b.ln1_b, b.proj_b, b.ln2_g,
                               b.ln2_b, b.fc2_b, b.n};
                for (int i = 0; i <= tab.own; i++) layout_ok &= l[i] == want[i];
            }
        }
    }
    check(ok, "tables: %s, %d tensor-parallel ranks: every element held by one rank (a whole tensor by all), "
          "padding unmapped", what, t);
    check(counted_ok, "tables: %s, %d ranks: every element counted in the norm once", what, t);
    if (is_gpt(c)) check(layout_ok, "tables: %s, %d ranks: a block's slices where transformer.h's layout reads them", what, t);
}

// ----------------------------------------------------------------------------
// kernels against their plain reference loops (kernels.h)

static void test_matmul_float(void) {
    const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {8, 16, 32}, {9, 31, 33}, {17, 64, 27}, {32, 256, 64}, {40, 7, 100}};
    Workspace ws;
    workspace_init(&ws, 64, 256, 256 * 128);
    for (int s = 0; s < 7; s++) {
        int M = shapes[s][0], red = shapes[s][1], N = shapes[s][2];
        float *a = mallocCheck(sizeof(float) * M * red), *b = mallocCheck(sizeof(float) * red * N);
        float *out = mallocCheck(sizeof(float) * M * N), *ref = mallocCheck(sizeof(float) * M * N);
        fill(a, (long)M * red, 1 + s, 1.0f);
        fill(b, (long)red * N, 100 + s, 1.0f);
        matmul_float(out, a, b, M, red, N, &ws);
        matmul_float_ref(ref, a, b, M, red, N);
        check(!memcmp(out, ref, sizeof(float) * M * N), "matmul_float %dx%dx%d equals a plain fmaf chain bit for bit",
              M, red, N);
        free(a), free(b), free(out), free(ref);
    }
    workspace_free(&ws);
}

// The blocked transposes against plain loops, on shapes with whole blocks, parts of
// blocks, and both; fix_transpose on sums of every magnitude up to 2^62 units, where the
// conversion to double rounds too, and on sums halfway between two floats (ties to even).
static void test_transpose(void) {
    const int shapes[][2] = {{1, 1}, {16, 16}, {17, 33}, {64, 48}, {100, 27}, {256, 1024}, {48, 80}};
    for (int s = 0; s < 7; s++) {
        int R = shapes[s][0], C = shapes[s][1];
        float *src = mallocCheck(sizeof(float) * R * C), *dst = mallocCheck(sizeof(float) * R * C),
              *ref = mallocCheck(sizeof(float) * R * C);
        int64_t* acc = mallocCheck(sizeof(int64_t) * R * C);
        fill(src, (long)R * C, 200 + s, 1.0f);
        for (long i = 0; i < (long)R * C; i++) {
            int64_t big = (int64_t)(rng_u64(300 + s, 1, i) >> (1 + rng_u64(300 + s, 2, i) % 63)); // 0 to 2^62
            acc[i] = i % 3 == 0 ? fix_from(src[i]) : i % 3 == 1 ? (i % 2 ? -big : big) : (int64_t)(3 + 2 * (i % 7)) << 38;
        }
        transpose(dst, src, R, C);
        transpose_ref(ref, src, R, C);
        int same = !memcmp(dst, ref, sizeof(float) * R * C);
        fix_transpose(dst, acc, R, C);
        fix_transpose_ref(ref, acc, R, C);
        same &= !memcmp(dst, ref, sizeof(float) * R * C);
        check(same, "transpose and fix_transpose of %d x %d equal plain loops", R, C);
        free(src), free(dst), free(ref), free(acc);
    }
}

// kernels.h's expf_array, on every 4099th float of the 2^32 (both signs, every exponent, NaNs
// and infinities) and at the ends of its quick range, in place and not: the same bits as
// its one-at-a-time definition (expf_quick, expf for the slow ones) in every instruction set
// (tests/run.sh runs this under each KERNEL_ISA); and, where the C library is glibc on a CPU
// with FMA (its expf is then __expf_fma, which expf_array computes), as the library's expf.
static void test_expf_array(void) {
    long n = (1L << 32) / 4099 + 16;
    float *x = mallocCheck(sizeof(float) * n), *y = mallocCheck(sizeof(float) * n), *z = mallocCheck(sizeof(float) * n);
    const float ends[16] = {88.0f, -88.0f, 87.99999f, -87.99999f, 88.72283f, 88.72284f, -103.9720f, -103.9721f,
                            0.0f, -0.0f, 1e-30f, -1e-30f, 1.0f, -1.0f, 80.0f, -80.0f};
    for (long i = 0; i < n - 16; i++) {
        uint32_t u = (uint32_t)(i * 4099L);
        memcpy(&x[i], &u, sizeof u);
    }
    memcpy(x + n - 16, ends, sizeof ends);
    expf_array(y, x, n);
    long own = 0, lib = 0;
    for (long i = 0; i < n; i++) {
        z[i] = expf_slow(x[i]) ? expf(x[i]) : expf_quick(x[i]);
        float e = expf(x[i]);
        own += memcmp(&y[i], &z[i], sizeof(float)) != 0;
        lib += memcmp(&y[i], &e, sizeof(float)) != 0;
    }
    memcpy(z, x, sizeof(float) * n);
    expf_array(z, z, n);
    check(own == 0 && !memcmp(y, z, sizeof(float) * n), "expf_array on %ld floats equals its definition one at a time, in place too (%ld differ)", n, own);
#if defined(__GLIBC__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (__builtin_cpu_supports("fma")) check(lib == 0, "expf_array on %ld floats equals glibc's expf (%ld differ)", n, lib);
#endif
    (void)lib;
    free(x), free(y), free(z);
}

// The exact kernel against llrint of every term, summed as integers. The shapes take every
// path of kernels.h: partial tiles and panels; reductions long enough that the panels
// outgrow EXACT_PANELS_BYTES and the tiles go in groups of blocks, the last group partial
// (70 x 600 x 130: groups of 13 blocks of 4 rows; 1000 x 300 x 600: of 27); and a read by
// rows, by columns (a weight gradient's x^T), and both from inside a wider matrix.
static void test_matmul_exact(void) {
    const int shapes[][3] = {{1, 1, 1},    {3, 5, 7},     {8, 16, 24},   {9, 31, 33},     {17, 64, 27},
                             {256, 32, 64}, {13, 100, 50}, {70, 600, 130}, {1000, 300, 600}, {5, 1100, 3}};
    const int n_shapes = sizeof shapes / sizeof shapes[0], pad = 3; // a inside a matrix `pad` wider
    Workspace ws;
    workspace_init(&ws, 1000, 1100, 1100L * 600);
    for (int s = 0; s < n_shapes; s++) {
        int M = shapes[s][0], red = shapes[s][1], N = shapes[s][2];
        float *a = mallocCheck(sizeof(float) * (M + pad) * (red + pad)), *b = mallocCheck(sizeof(float) * red * N);
        int64_t *acc = callocCheck((size_t)M * N, 8), *ref = callocCheck((size_t)M * N, 8);
        fill(a, (long)(M + pad) * (red + pad), 7 + s, 3.0f);
        fill(b, (long)red * N, 70 + s, 0.5f);
        for (int how = 0; how < 4; how++) {
            // a read as a[m][i] (a forward) or as a[i][m] (a weight gradient), each inside a
            // matrix as wide as it is or `pad` wider
            int transposed = how % 2, wider = how / 2;
            long a_sm = transposed ? 1 : red + wider * pad, a_si = transposed ? M + wider * pad : 1;
            for (long e = 0; e < (long)M * N; e++) acc[e] = ref[e] = (int64_t)(e * 0x9E3779B97F4A7C15ull >> 24); // it adds
            matmul_exact(acc, a, a_sm, a_si, b, M, red, N, red, "test", &ws);
            matmul_exact_ref(ref, a, a_sm, a_si, b, M, red, N);
            check(!memcmp(acc, ref, sizeof(int64_t) * M * N),
                  "matmul_exact %dx%dx%d%s%s adds per-term llrint sums bit for bit", M, red, N,
                  transposed ? " (transposed a)" : "", wider ? " (a in a wider matrix)" : "");
            // from the operands it packed, with add = 0: acc = the sums, whatever acc held
            matmul_exact_packed(acc, ws.pa, ws.pb, M, red, N, 0);
            memset(ref, 0, sizeof(int64_t) * M * N);
            matmul_exact_ref(ref, a, a_sm, a_si, b, M, red, N);
            check(!memcmp(acc, ref, sizeof(int64_t) * M * N), "matmul_exact_packed %dx%dx%d%s%s, add 0, sets the sums",
                  M, red, N, transposed ? " (transposed a)" : "", wider ? " (a in a wider matrix)" : "");
        }
        free(a), free(b), free(acc), free(ref);
    }
    check(exact_group(70, 600, 130) == 13 && exact_group(1000, 300, 600) == 27 && exact_group(256, 32, 64) == 1,
          "the shapes above take the tiles in groups of blocks, and block by block");
    workspace_free(&ws);
}

// --precision bf16 (kernels.h): the kernels round their operands as they pack them. Each
// kernel and linear layer with bf16 operands gives the bits of the same kernel in fp32 on
// operands rounded to bf16 beforehand, and the kernels still equal their reference loops.
static void test_bf16_operands(void) {
    const int shapes[][3] = {{1, 1, 1}, {9, 31, 33}, {17, 64, 27}, {70, 600, 130}};
    Workspace ws;
    workspace_init(&ws, 256, 1024, 1024L * 256);
    for (int s = 0; s < 4; s++) {
        int M = shapes[s][0], red = shapes[s][1], N = shapes[s][2];
        long na = (long)M * red, nb = (long)red * N, no = (long)M * N;
        float *a = mallocCheck(sizeof(float) * na), *b = mallocCheck(sizeof(float) * nb);
        float *ar = mallocCheck(sizeof(float) * na), *br = mallocCheck(sizeof(float) * nb);
        float *out = mallocCheck(sizeof(float) * no), *want = mallocCheck(sizeof(float) * no);
        float *dout = mallocCheck(sizeof(float) * no), *dr = mallocCheck(sizeof(float) * no);
        float *din = mallocCheck(sizeof(float) * na), *din_want = mallocCheck(sizeof(float) * na);
        int64_t *acc = callocCheck((size_t)no, 8), *ref = callocCheck((size_t)no, 8);
        int64_t *dw = callocCheck((size_t)nb, 8), *dw_want = callocCheck((size_t)nb, 8);
        int64_t* accT = callocCheck((size_t)na, 8);
        fill(a, na, 500 + s, 1.0f), fill(b, nb, 600 + s, 0.5f), fill(dout, no, 700 + s, 0.25f);
        for (long i = 0; i < na; i++) ar[i] = bf16_round(a[i]);
        for (long i = 0; i < nb; i++) br[i] = bf16_round(b[i]);
        for (long i = 0; i < no; i++) dr[i] = bf16_round(dout[i]);
        int rounded = 0;
        for (long i = 0; i < na; i++) rounded += ar[i] != a[i];
        int same = 1;
        // the fp32 kernels on rounded operands
        operands_bf16 = 0;
        matmul_float(want, ar, br, M, red, N, &ws);
        matmul_exact(ref, ar, red, 1, br, M, red, N, red, "test", &ws);
        linear_backward_weight(dw_want, NULL, ar, dr, M, red, N, M, &ws);
        linear_backward_input(din_want, dr, br, M, red, N, &ws);
        float *fw_want = mallocCheck(sizeof(float) * no), *fx_want = mallocCheck(sizeof(float) * no);
        linear_forward(fw_want, ar, br, NULL, M, red, N, &ws);
        int64_t* sums = callocCheck((size_t)no, 8); // linear_forward_exact's own, not acc (which the kernels add to)
        linear_forward_exact(fx_want, sums, ar, br, NULL, M, red, N, &ws);
        // the bf16 ones on the operands as they are
        operands_bf16 = 1;
        matmul_float(out, a, b, M, red, N, &ws);
        same &= !memcmp(out, want, sizeof(float) * no);
        matmul_float_ref(out, a, b, M, red, N);
        same &= !memcmp(out, want, sizeof(float) * no);
        matmul_exact(acc, a, red, 1, b, M, red, N, red, "test", &ws);
        same &= !memcmp(acc, ref, sizeof(int64_t) * no);
        memset(acc, 0, sizeof(int64_t) * no);
        matmul_exact_ref(acc, a, red, 1, b, M, red, N);
        same &= !memcmp(acc, ref, sizeof(int64_t) * no);
        linear_backward_weight(dw, NULL, a, dout, M, red, N, M, &ws);
        same &= !memcmp(dw, dw_want, sizeof(int64_t) * nb);
        linear_backward_input(din, dout, b, M, red, N, &ws);
        same &= !memcmp(din, din_want, sizeof(float) * na);
        linear_forward(out, a, b, NULL, M, red, N, &ws);
        same &= !memcmp(out, fw_want, sizeof(float) * no);
        linear_forward_exact(out, sums, a, b, NULL, M, red, N, &ws);
        same &= !memcmp(out, fx_want, sizeof(float) * no);
        free(fw_want), free(fx_want), free(sums);
        linear_backward_input_exact(din, accT, dout, b, M, red, N, &ws);
        operands_bf16 = 0;
        linear_backward_input_exact(din_want, accT, dr, br, M, red, N, &ws);
        same &= !memcmp(din, din_want, sizeof(float) * na);
        check(same && (na < 100 || rounded > na / 2),
              "bf16 operands, %dx%dx%d: the kernels, the linear layers' forwards, weight and input gradients equal fp32's on operands rounded first "
              "(%d of %ld rounded), and the reference loops", M, red, N, rounded, na);
        free(a), free(b), free(ar), free(br), free(out), free(want), free(dout), free(dr), free(din), free(din_want);
        free(acc), free(ref), free(dw), free(dw_want), free(accT);
    }
    operands_bf16 = 0;
    workspace_free(&ws);
}

static void test_fix(void) {
    int ok = 1;
    for (int i = 0; i < 100000; i++) {
        double v = (rng_uniform(5, 5, i) * 2 - 1) * ldexp(1.0, (int)(rng_u64(6, 6, i) % 50) - 40);
        if (fix_fast(v) != fix_from(v)) ok = 0;
    }
    // ties go to even, in both
    if (fix_fast(0.5 / FIX_ONE) != 0 || fix_fast(1.5 / FIX_ONE) != 2 || fix_from(2.5 / FIX_ONE) != 2) ok = 0;
    check(ok, "fix_fast rounds exactly like llrint over 100000 values of every magnitude, ties to even");
    float x[] = {1.5f, -3.25f, 1e-3f, 0.0f, -0.0f};
    int64_t acc[5] = {0};
    fix_add(acc, x, 5, 100, "test");
    check(acc[0] == (int64_t)(1.5 * FIX_ONE) && acc[1] == (int64_t)(-3.25 * FIX_ONE) && acc[3] == 0 && acc[4] == 0,
          "fix_add converts exactly");
    check(fix_term_limit(32) == FIX_TERM_MAX && fix_term_limit(1L << 20) == 8.0,
          "the term limit is 2^11, or 2^23 / terms for long sums");
    uint32_t nan_bits = 0x7fc00000u;
    float nan;
    memcpy(&nan, &nan_bits, sizeof nan);
    float y[] = {1.0f, -7.0f, 3.0f}, z[] = {1.0f, nan, 3.0f}, w[] = {1.0f, -INFINITY};
    check(max_abs(y, 3) == 7.0 && isinf(max_abs(z, 3)) && isinf(max_abs(w, 2)),
          "max_abs finds the largest magnitude and reports NaN and infinity");
}

// --reduce (optim.h): bf16's rounding, and float sums of pieces against the whole sum
static void test_reduce(void) {
    float u = 0x1p-7f; // bf16's spacing at 1
    check(bf16_round(1 + u / 2) == 1 && bf16_round(1 + 3 * u / 2) == 1 + 2 * u && bf16_round(1 + u / 2 + 0x1p-20f) == 1 + u &&
              bf16_round(-(1 + 3 * u / 2)) == -(1 + 2 * u) && bf16_round(0x1p-130f) == 0x1p-130f && bf16_round(0.0f) == 0,
          "bf16_round: to the nearest bf16, ties to even, negatives alike, denormals kept");
    uint32_t nans[] = {0x7fffffffu, 0xffff8000u, 0x7f800001u, 0x7fc00000u};
    int nan_ok = 1;
    for (int i = 0; i < 4; i++) {
        float f;
        memcpy(&f, &nans[i], sizeof f);
        nan_ok &= isnan(bf16_round(f));
    }
    check(nan_ok && isinf(bf16_round(INFINITY)) && bf16_round(-INFINITY) < 0,
          "bf16_round: every NaN stays a NaN (payloads that carried into the sign or exponent too), infinities stay");
    int ok = 1;
    for (int i = 0; i < 100000 && ok; i++) {
        float x = (float)((rng_uniform(7, 7, i) * 2 - 1) * ldexp(1.0, (int)(rng_u64(8, 8, i) % 60) - 40));
        float r = bf16_round(x);
        uint32_t b;
        memcpy(&b, &r, sizeof b);
        float below, above; // the bf16 neighbours of x
        uint32_t lo = b, hi = b;
        if (fabsf(r) <= fabsf(x)) hi = b + 0x10000u; else lo = b - 0x10000u;
        memcpy(&below, &lo, sizeof below), memcpy(&above, &hi, sizeof above);
        double d = fabs((double)x - r), e = fabs((double)x - (fabsf(r) <= fabsf(x) ? above : below));
        if ((b & 0xffffu) || d > e || (d == e && (b & 0x10000u))) ok = 0;
    }
    check(ok, "bf16_round over 100000 values of every magnitude: a bf16, no farther than its neighbour, ties to even");
    // an exact sum rounded once, not through a float: 1 + 2^-8 + 2^-30 is above bf16's tie
    int64_t t = fix_from(1 + 0x1p-8 + 0x1p-30);
    ok = fix_round(REDUCE_BF16, t) == 1 + u && fix_round(REDUCE_BF16, -t) == -(1 + u) &&
         fix_round(REDUCE_FP32, fix_from(1 + 0x1p-24)) == 1 && fix_round(REDUCE_FP32, fix_from(1 + 0x1p-24 + 0x1p-40)) == 1 + 0x1p-23f &&
         fix_round(REDUCE_FP32, 3) == 0x3p-40f && fix_round(REDUCE_BF16, 0) == 0;
    for (int i = 0; i < 100000 && ok; i++) { // below 2^13 a double holds the sum exactly
        int64_t g = (int64_t)(rng_u64(9, 9, i) >> (11 + rng_u64(10, 10, i) % 50)) * (i % 2 ? 1 : -1);
        if (fix_round(REDUCE_FP32, g) != (float)fix_to(g)) ok = 0;
    }
    check(ok, "fix_round: an exact sum rounded once to fp32 or bf16, as a float of it would be where a double is exact");
    // three pieces of one sum: fp32 adds (a + b) + c as floats, so a piece below half a unit
    // of the running sum is lost, where the whole sum rounded once keeps it
    for (int how = REDUCE_FP32; how <= REDUCE_BF16; how++) {
        GradSums s;
        grad_sums_init(&s, how, 2);
        ok = 1;
        int64_t g[2];
        double tiny = how == REDUCE_FP32 ? 0x3p-26 : 0x3p-10; // 3/8 of a unit at 1: two of them are 3/4
        double pieces[3][2] = {{1, 0.5}, {tiny, 0.25}, {tiny, 0.125}};
        for (int p = 0; p < 3; p++) {
            g[0] = fix_from(pieces[p][0]), g[1] = fix_from(pieces[p][1]);
            grad_sums_add(&s, g, 0, 2);
            ok = ok && g[0] == 0 && g[1] == 0;
        }
        grad_sums_finish(&s, g, 7);
        check(ok && g[0] == fix_from(1.0) && g[1] == fix_from(0.875) && s.parted == 7 && s.differed == 1,
              "grad_sums, %s: pieces added in it lose what the whole sum rounded once keeps, and say at which step",
              reduce_names[how]);
        grad_sums_free(&s);
    }
}

// ----------------------------------------------------------------------------
// layout independence: an exact sum split any way gives the same bits

// A stand-in for an all-reduce over two ranks: adds the other rank's partial sums.
static void add_other(void* other, int64_t* acc, long n) {
    for (long i = 0; i < n; i++) acc[i] += ((const int64_t*)other)[i];
}

static void test_split_invariance(void) {
    int R = 29, K = 40, J = 30;
    Workspace ws;
    workspace_init(&ws, 64, 64, 64 * 64);
    float *x = mallocCheck(sizeof(float) * R * K), *dz = mallocCheck(sizeof(float) * R * J),
          *w = mallocCheck(sizeof(float) * K * J);
    fill(x, (long)R * K, 11, 2.0f);
    fill(dz, (long)R * J, 12, 0.3f);
    fill(w, (long)K * J, 13, 0.5f);
    int64_t *full = callocCheck((size_t)K * J, 8), *parts = callocCheck((size_t)K * J, 8);
    int64_t *dbf = callocCheck(J, 8), *dbp = callocCheck(J, 8);
    linear_backward_weight(full, dbf, x, dz, R, K, J, R, &ws);
    // rows 0..10, 11..21, 22..28 (data parallel on 3 ranks), added in reverse order
    linear_backward_weight(parts, dbp, x + 22 * K, dz + 22 * J, 7, K, J, R, &ws);
    linear_backward_weight(parts, dbp, x + 11 * K, dz + 11 * J, 11, K, J, R, &ws);
    linear_backward_weight(parts, dbp, x, dz, 11, K, J, R, &ws);
    check(!memcmp(full, parts, sizeof(int64_t) * K * J) && !memcmp(dbf, dbp, sizeof(int64_t) * J),
          "weight and bias gradients over rows split 11/11/7, added in any order, equal the whole batch's");
    // the forward of a row-parallel layer, its inputs split 13 / 27 across two ranks: the
    // second rank's partial sums, then the first's completed with them (add_other stands
    // in for the all-reduce), equal the whole sum, to the last bit of the float output
    float *b = mallocCheck(sizeof(float) * J), *outf = mallocCheck(sizeof(float) * R * J), *outp = mallocCheck(sizeof(float) * R * J);
    fill(b, J, 14, 0.5f);
    int64_t *accf = callocCheck((size_t)R * J, 8), *acc1 = callocCheck((size_t)R * J, 8), *acc2 = callocCheck((size_t)R * J, 8);
    linear_forward_exact(outf, accf, x, w, b, R, K, J, &ws);
    float *x1 = mallocCheck(sizeof(float) * R * 13), *x2 = mallocCheck(sizeof(float) * R * 27);
    for (int r = 0; r < R; r++) {
        memcpy(x1 + r * 13, x + r * K, 13 * sizeof(float));
        memcpy(x2 + r * 27, x + r * K + 13, 27 * sizeof(float));
    }
    linear_forward_partial(acc2, x2, w + 13 * J, R, 27, J, K, &ws);
    linear_forward_partial(acc1, x1, w, R, 13, J, K, &ws);
    add_other(acc2, acc1, (long)R * J); // what g's all-reduce does
    linear_forward_finish(outp, acc1, b, R, J);
    check(!memcmp(outf, outp, sizeof(float) * R * J), "a row-parallel forward split 13 + 27 equals the whole sum");
    // the input gradient of a column-parallel layer, its outputs split 17 / 13
    float *dinf = mallocCheck(sizeof(float) * R * K), *dinp = mallocCheck(sizeof(float) * R * K);
    int64_t *df = callocCheck((size_t)R * K, 8), *dp1 = callocCheck((size_t)R * K, 8), *dp2 = callocCheck((size_t)R * K, 8);
    linear_backward_input_exact(dinf, df, dz, w, R, K, J, &ws);
    float *dz1 = mallocCheck(sizeof(float) * R * 17), *dz2 = mallocCheck(sizeof(float) * R * 13),
          *w1 = mallocCheck(sizeof(float) * K * 17), *w2 = mallocCheck(sizeof(float) * K * 13);
    for (int r = 0; r < R; r++) {
        memcpy(dz1 + r * 17, dz + r * J, 17 * sizeof(float));
        memcpy(dz2 + r * 13, dz + r * J + 17, 13 * sizeof(float));
    }
    for (int k = 0; k < K; k++) {
        memcpy(w1 + k * 17, w + k * J, 17 * sizeof(float));
        memcpy(w2 + k * 13, w + k * J + 17, 13 * sizeof(float));
    }
    linear_backward_input_partial(dp2, dz2, w2, R, K, 13, J, &ws);
    linear_backward_input_partial(dp1, dz1, w1, R, K, 17, J, &ws);
    add_other(dp2, dp1, (long)R * K); // what f's all-reduce does
    linear_backward_input_finish(dinp, dp1, R, K);
    check(!memcmp(dinf, dinp, sizeof(float) * R * K), "a column-parallel input gradient split 17 + 13 equals the whole");
    // the float forward of a column slice equals those columns of the whole
    float *of = mallocCheck(sizeof(float) * R * J), *os = mallocCheck(sizeof(float) * R * 13);
    linear_forward(of, x, w, NULL, R, K, J, &ws);
    linear_forward(os, x, w2 - 0, NULL, R, K, 13, &ws); // w2 is columns 17..29 of w
    int same = 1;
    for (int r = 0; r < R; r++) same &= !memcmp(os + r * 13, of + r * J + 17, 13 * sizeof(float));
    check(same, "a column-parallel float forward of columns 17..29 equals those columns of the whole");
    free(x), free(dz), free(w), free(full), free(parts), free(dbf), free(dbp), free(accf), free(acc1), free(acc2),
        free(x1), free(x2), free(df), free(dp1), free(dp2), free(dz1), free(dz2), free(w1), free(w2), free(of), free(os),
        free(b), free(outf), free(outp), free(dinf), free(dinp);
    workspace_free(&ws);
}

// ----------------------------------------------------------------------------
// gradient checks: central finite differences of a double-precision reference

// d f / d theta_i for every i, central differences with step h
typedef double (*Objective)(const double* theta, void* ctx);
static void numeric_grad(double* g, double* theta, long n, Objective f, void* ctx) {
    for (long i = 0; i < n; i++) {
        double t = theta[i], h = 1e-6 * (fabs(t) > 1 ? fabs(t) : 1);
        theta[i] = t + h;
        double up = f(theta, ctx);
        theta[i] = t - h;
        double down = f(theta, ctx);
        theta[i] = t;
        g[i] = (up - down) / (2 * h);
    }
}
// analytic (float) against numeric (double): max |a - n| / (1e-3 + |n|)
static double grad_error(const double* analytic, const double* numeric, long n) {
    double worst = 0;
    for (long i = 0; i < n; i++) {
        double e = fabs(analytic[i] - numeric[i]) / (1e-3 + fabs(numeric[i]));
        worst = e > worst ? e : worst;
    }
    return worst;
}
#define GRAD_TOL 1e-4

// Linear op: f = sum c[r][j] * out[r][j], theta = (in, w, b)
typedef struct {
    int R, K, J;
    const double* c;
} LinearCtx;
static double linear_objective(const double* theta, void* vctx) {
    LinearCtx* x = vctx;
    const double *in = theta, *w = in + x->R * x->K, *b = w + x->K * x->J;
    double f = 0;
    for (int r = 0; r < x->R; r++)
        for (int j = 0; j < x->J; j++) {
            double o = b[j];
            for (int k = 0; k < x->K; k++) o += in[r * x->K + k] * w[k * x->J + j];
            f += x->c[r * x->J + j] * o;
        }
    return f;
}
// Weights kept packed (kernels.h): the four linear products give the same bits kept or not,
// reuse the packing while kept, and pack again once keeping has ended.
typedef struct {
    float *out, *din;
} LinearOuts;
static void linear_products(LinearOuts* o, int64_t* acc, const float* x, const float* dz, const float* w, int R, int K,
                            int J, Workspace* ws) {
    linear_forward(o->out, x, w, NULL, R, K, J, ws);
    linear_forward_exact(o->out + R * J, acc, x, w, NULL, R, K, J, ws);
    linear_backward_input(o->din, dz, w, R, K, J, ws);
    linear_backward_input_exact(o->din + R * K, acc, dz, w, R, K, J, ws);
}
static void test_kept_weights(void) {
    int R = 13, K = 37, J = 45;
    Workspace ws;
    workspace_init(&ws, 64, 64, 64 * 64);
    float *x = mallocCheck(sizeof(float) * R * K), *dz = mallocCheck(sizeof(float) * R * J),
          *w = mallocCheck(sizeof(float) * K * J);
    int64_t* acc = mallocCheck(sizeof(int64_t) * R * (K > J ? K : J));
    LinearOuts plain[2], kept[3];
    for (int i = 0; i < 5; i++) {
        LinearOuts* o = i < 2 ? &plain[i] : &kept[i - 2];
        o->out = mallocCheck(sizeof(float) * 2 * R * J), o->din = mallocCheck(sizeof(float) * 2 * R * K);
    }
    fill(x, (long)R * K, 21, 1.0f), fill(dz, (long)R * J, 22, 0.5f), fill(w, (long)K * J, 23, 0.5f);
    linear_products(&plain[0], acc, x, dz, w, R, K, J, &ws);
    workspace_keep_weights(&ws, 1);
    linear_products(&kept[0], acc, x, dz, w, R, K, J, &ws); // packs and keeps
    linear_products(&kept[1], acc, x, dz, w, R, K, J, &ws); // reuses
    int n_kept = ws.n_kept;
    fill(w, (long)K * J, 24, 0.5f); // a change the caller should not make while keeping
    linear_products(&kept[2], acc, x, dz, w, R, K, J, &ws);
    int reused = 1;
    for (int i = 1; i < 3; i++)
        reused &= !memcmp(kept[i].out, plain[0].out, sizeof(float) * 2 * R * J) &&
                  !memcmp(kept[i].din, plain[0].din, sizeof(float) * 2 * R * K);
    check(!memcmp(kept[0].out, plain[0].out, sizeof(float) * 2 * R * J) &&
              !memcmp(kept[0].din, plain[0].din, sizeof(float) * 2 * R * K),
          "kept weights: the float and exact forward and input gradient give the same bits kept as packed each time");
    check(n_kept == 4 && reused, "kept weights: each of the 4 uses is packed once and reused while kept");
    workspace_keep_weights(&ws, 0);
    linear_products(&plain[1], acc, x, dz, w, R, K, J, &ws);
    workspace_keep_weights(&ws, 1);
    linear_products(&kept[2], acc, x, dz, w, R, K, J, &ws);
    workspace_keep_weights(&ws, 0);
    check(memcmp(plain[1].out, plain[0].out, sizeof(float) * 2 * R * J) != 0 &&
              !memcmp(kept[2].out, plain[1].out, sizeof(float) * 2 * R * J) &&
              !memcmp(kept[2].din, plain[1].din, sizeof(float) * 2 * R * K) && ws.n_kept == 4,
          "kept weights: after keeping ends, a changed weight is packed again, into the same buffers");
    for (int i = 0; i < 5; i++) {
        LinearOuts* o = i < 2 ? &plain[i] : &kept[i - 2];
        free(o->out), free(o->din);
    }
    free(x), free(dz), free(w), free(acc);
    workspace_free(&ws);
}

static void test_grad_linear(int exact_forward, int exact_input, int R, int K, int J) {
    long n = (long)R * K + (long)K * J + J;
    float* p = mallocCheck(sizeof(float) * n);
    fill(p, n, 21 + K, 1.0f);
    float *in = p, *w = in + R * K, *b = w + K * J, *c = mallocCheck(sizeof(float) * R * J);
    fill(c, (long)R * J, 22, 1.0f);
    Workspace ws;
    workspace_init(&ws, 64, 64, 64 * 64);
    // forward, checked against the reference value
    float* out = mallocCheck(sizeof(float) * R * J);
    int64_t* acc = callocCheck((size_t)(R > K ? R : K) * (J > K ? J : K), 8);
    if (exact_forward) {
        linear_forward_exact(out, acc, in, w, b, R, K, J, &ws);
    } else {
        linear_forward(out, in, w, b, R, K, J, &ws);
    }
    double* theta = mallocCheck(sizeof(double) * n);
    double *cd = mallocCheck(sizeof(double) * R * J), fo = 0;
    for (long i = 0; i < n; i++) theta[i] = p[i];
    for (long i = 0; i < (long)R * J; i++) cd[i] = c[i], fo += (double)c[i] * out[i];
    LinearCtx ctx = {R, K, J, cd};
    double fr = linear_objective(theta, &ctx);
    // backward with dout = c
    double* analytic = mallocCheck(sizeof(double) * n);
    float* din = mallocCheck(sizeof(float) * R * K);
    int64_t *dw = callocCheck((size_t)K * J, 8), *db = callocCheck(J, 8);
    linear_backward_weight(dw, db, in, c, R, K, J, R, &ws);
    if (exact_input) {
        linear_backward_input_exact(din, acc, c, w, R, K, J, &ws);
    } else {
        linear_backward_input(din, c, w, R, K, J, &ws);
    }
    for (long i = 0; i < (long)R * K; i++) analytic[i] = din[i];
    for (long i = 0; i < (long)K * J; i++) analytic[R * K + i] = fix_to(dw[i]);
    for (long i = 0; i < J; i++) analytic[R * K + K * J + i] = fix_to(db[i]);
    double* numeric = mallocCheck(sizeof(double) * n);
    numeric_grad(numeric, theta, n, linear_objective, &ctx);
    double err = grad_error(analytic, numeric, n);
    check(fabs(fo - fr) < 1e-4 * (1 + fabs(fr)) && err < GRAD_TOL,
          "gradient check: linear %dx%dx%d (%s forward, %s input gradient): max rel error %.1e", R, K, J,
          exact_forward ? "exact" : "float", exact_input ? "exact" : "float", err);
    free(p), free(c), free(out), free(acc), free(theta), free(cd), free(analytic), free(din), free(dw), free(db),
        free(numeric);
    workspace_free(&ws);
}

// ReLU: f = sum c * relu(x)
static const double* relu_c;
static int relu_n;
static double relu_objective(const double* x, void* ctx) {
    (void)ctx;
    double f = 0;
    for (int i = 0; i < relu_n; i++) f += relu_c[i] * (x[i] > 0 ? x[i] : 0);
    return f;
}
static void test_grad_relu(void) {
    enum { N = 50 };
    float x[N], out[N], d[N];
    double xd[N], cd[N], a[N], num[N];
    fill(x, N, 31, 1.0f);
    fill(d, N, 32, 1.0f);
    for (int i = 0; i < N; i++) {
        if (fabsf(x[i]) < 1e-3f) x[i] = 0.5f; // away from the kink
        xd[i] = x[i], cd[i] = d[i], out[i] = x[i];
    }
    relu_forward(out, N);
    relu_backward(d, out, N);
    for (int i = 0; i < N; i++) a[i] = d[i];
    relu_c = cd, relu_n = N;
    numeric_grad(num, xd, N, relu_objective, NULL);
    check(grad_error(a, num, N) < GRAD_TOL, "gradient check: relu");
}

// Embedding: f = sum c * out, theta = the table
typedef struct {
    const int* tokens;
    int R, T, E;
    const double* c;
} EmbCtx;
static double emb_objective(const double* table, void* vctx) {
    EmbCtx* x = vctx;
    double f = 0;
    for (int r = 0; r < x->R; r++)
        for (int t = 0; t < x->T; t++)
            for (int e = 0; e < x->E; e++)
                f += x->c[(r * x->T + t) * x->E + e] * table[x->tokens[r * x->T + t] * x->E + e];
    return f;
}
static void test_grad_embedding(void) {
    enum { V = 6, R = 5, T = 4, E = 3 };
    int tokens[R * T];
    for (int i = 0; i < R * T; i++) tokens[i] = (int)(rng_u64(41, 41, i) % V);
    float table[V * E], c[R * T * E], out[R * T * E];
    fill(table, V * E, 42, 1.0f);
    fill(c, R * T * E, 43, 1.0f);
    embedding_forward(out, tokens, table, 0, V, R, T, E);
    int64_t dt[V * E] = {0};
    embedding_backward(dt, tokens, c, 0, V, R, T, E, R);
    double td[V * E], cd[R * T * E], a[V * E], num[V * E];
    for (int i = 0; i < V * E; i++) td[i] = table[i], a[i] = fix_to(dt[i]);
    for (int i = 0; i < R * T * E; i++) cd[i] = c[i];
    EmbCtx ctx = {tokens, R, T, E, cd};
    numeric_grad(num, td, V * E, emb_objective, &ctx);
    // and a vocabulary slice [2, 5) looks up only its rows
    float part[R * T * E];
    embedding_forward(part, tokens, table + 2 * E, 2, 5, R, T, E);
    int slice_ok = 1;
    for (int i = 0; i < R * T; i++)
        for (int e = 0; e < E; e++)
            slice_ok &= part[i * E + e] == (tokens[i] >= 2 && tokens[i] < 5 ? out[i * E + e] : 0.0f);
    check(grad_error(a, num, V * E) < GRAD_TOL && slice_ok,
          "gradient check: embedding; a vocabulary slice looks up only its own rows");
}

// Softmax cross-entropy: f = sum over rows of the loss, theta = logits
typedef struct {
    const int* targets;
    int R, V;
} XentCtx;
static double xent_objective(const double* l, void* vctx) {
    XentCtx* x = vctx;
    double f = 0;
    for (int r = 0; r < x->R; r++) {
        double m = -INFINITY, s = 0;
        for (int v = 0; v < x->V; v++) m = l[r * x->V + v] > m ? l[r * x->V + v] : m;
        for (int v = 0; v < x->V; v++) s += exp(l[r * x->V + v] - m);
        f += log(s) + m - l[r * x->V + x->targets[r]];
    }
    return f;
}
static void test_grad_xent(void) {
    enum { R = 6, V = 9 };
    float logits[R * V], probs[R * V], dl[R * V], rowmax[R], tl[R];
    int targets[R];
    int64_t sum[R];
    fill(logits, R * V, 51, 3.0f);
    for (int r = 0; r < R; r++) targets[r] = (int)(rng_u64(52, 52, r) % V);
    memcpy(probs, logits, sizeof probs);
    int64_t loss = xent_forward(probs, sum, rowmax, tl, targets, R, V, R);
    xent_backward(dl, probs, targets, R, V, 0);
    double ld[R * V], a[R * V], num[R * V];
    for (int i = 0; i < R * V; i++) ld[i] = logits[i], a[i] = dl[i];
    XentCtx ctx = {targets, R, V};
    numeric_grad(num, ld, R * V, xent_objective, &ctx);
    double ref = xent_objective(ld, &ctx);
    check(fabs(fix_to(loss) - ref) < 1e-5 * ref && grad_error(a, num, R * V) < GRAD_TOL,
          "gradient check: softmax cross-entropy (loss %.6f, reference %.6f)", fix_to(loss), ref);
}

// The vocabulary-parallel cross-entropy (train_tp.c) against the gathered one: the logits
// cut into n padded slices, each slice's pieces combined the way the all-reduces combine
// them (max, sum, exact sum), must give the same loss and probabilities, bit for bit.
static void test_vocab_parallel_xent(void) {
    enum { R = 7, V = 27 };
    float logits[R * V], probs[R * V], rowmax[R], tl[R];
    int targets[R];
    int64_t sum[R];
    fill(logits, R * V, 71, 4.0f);
    for (int r = 0; r < R; r++) targets[r] = (int)(rng_u64(72, 72, r) % V);
    memcpy(probs, logits, sizeof probs);
    int64_t loss = xent_forward(probs, sum, rowmax, tl, targets, R, V, R);
    for (int n = 2; n <= 5; n++) {
        int vs = (V + n - 1) / n; // padded slices: 27 on 2 ranks is 14 + 14, the last one padded
        float* slice = mallocCheck(sizeof(float) * n * R * vs);
        float mx[R], tlog[R], part_max[R], part_tl[R];
        int64_t es[R], part_es[R];
        for (int r = 0; r < R; r++) mx[r] = -INFINITY, tlog[r] = 0, es[r] = 0;
        for (int q = 0; q < n; q++) { // each rank: its logits, padding set to garbage on purpose
            float* l = slice + (long)q * R * vs;
            for (int r = 0; r < R; r++)
                for (int c = 0; c < vs; c++) l[r * vs + c] = q * vs + c < V ? logits[r * V + q * vs + c] : 1e30f;
            xent_rowmax(part_max, l, R, vs, q * vs, V);
            xent_target_logit(part_tl, l, targets, R, vs, q * vs);
            for (int r = 0; r < R; r++) mx[r] = part_max[r] > mx[r] ? part_max[r] : mx[r], tlog[r] += part_tl[r];
        }
        for (int q = 0; q < n; q++) {
            float* l = slice + (long)q * R * vs;
            xent_expsum(part_es, l, l, mx, R, vs, q * vs, V);
            for (int r = 0; r < R; r++) es[r] += part_es[r];
        }
        int64_t part_loss = 0;
        int same = 1;
        for (int q = 0; q < n; q++) {
            float* l = slice + (long)q * R * vs;
            part_loss = xent_finish(l, es, mx, tlog, targets, R, vs, R);
            for (int r = 0; r < R; r++)
                for (int c = 0; c < vs; c++)
                    same &= q * vs + c < V ? l[r * vs + c] == probs[r * V + q * vs + c] : l[r * vs + c] == 0.0f;
        }
        check(part_loss == loss && same,
              "vocabulary-parallel cross-entropy over %d padded slices equals the gathered one bit for bit", n);
        free(slice);
    }
}

// The whole model: f = sum of the losses of R rows, theta = every parameter
typedef struct {
    const Config* c;
    const int *tokens, *targets;
    int R;
} ModelCtx;
static double model_objective(const double* theta, void* vctx) {
    ModelCtx* x = vctx;
    const Config* c = x->c;
    int T = c->context, E = c->emb, maxw = max_width(c);
    double *cur = mallocCheck(sizeof(double) * maxw), *nxt = mallocCheck(sizeof(double) * maxw), f = 0;
    for (int r = 0; r < x->R; r++) {
        for (int t = 0; t < T; t++)
            for (int e = 0; e < E; e++) cur[t * E + e] = theta[x->tokens[r * T + t] * E + e];
        for (int l = 1; l <= c->layers + 1; l++) {
            int K = linear_in(c, l), J = linear_out(c, l);
            const double *w = theta + unit_offset(c, l), *b = w + (long)K * J;
            for (int j = 0; j < J; j++) {
                double o = b[j];
                for (int k = 0; k < K; k++) o += cur[k] * w[(long)k * J + j];
                nxt[j] = l <= c->layers ? (o > 0 ? o : 0) : o;
            }
            double* t = cur;
            cur = nxt, nxt = t;
        }
        double m = -INFINITY, s = 0;
        for (int v = 0; v < c->vocab; v++) m = cur[v] > m ? cur[v] : m;
        for (int v = 0; v < c->vocab; v++) s += exp(cur[v] - m);
        f += log(s) + m - cur[x->targets[r]];
    }
    free(cur), free(nxt);
    return f;
}
static void test_grad_model(int layers, int hidden, int context, int emb) {
    Config c = {.vocab = 7, .context = context, .emb = emb, .hidden = hidden, .layers = layers};
    int R = 5;
    long np = n_params(&c);
    float* params = mallocCheck(sizeof(float) * np);
    for (int u = 0; u < n_units(&c); u++) unit_init(params + unit_offset(&c, u), &c, u, 1234 + layers);
    int tokens[5 * 8], targets[5];
    for (int i = 0; i < R * context; i++) tokens[i] = (int)(rng_u64(61, 61, i) % c.vocab);
    for (int r = 0; r < R; r++) targets[r] = (int)(rng_u64(62, 62, r) % c.vocab);
    Work w;
    work_init(&w, &c, R, NULL);
    memcpy(w.acts.tokens, tokens, sizeof(int) * R * context);
    memcpy(w.acts.targets, targets, sizeof(int) * R);
    int64_t loss = model_forward(&c, params, &w, R, R);
    int64_t* grads = callocCheck(np, sizeof(int64_t));
    model_backward(&c, params, grads, &w, R, R);
    double *theta = mallocCheck(sizeof(double) * np), *an = mallocCheck(sizeof(double) * np),
           *num = mallocCheck(sizeof(double) * np);
    for (long i = 0; i < np; i++) theta[i] = params[i], an[i] = fix_to(grads[i]);
    ModelCtx ctx = {&c, tokens, targets, R};
    double ref = model_objective(theta, &ctx);
    numeric_grad(num, theta, np, model_objective, &ctx);
    double err = grad_error(an, num, np);
    check(fabs(fix_to(loss) - ref) < 1e-5 * ref && err < GRAD_TOL,
          "gradient check: whole model, L=%d H=%d T=%d E=%d (%ld parameters): max rel error %.1e", layers, hidden,
          context, emb, np, err);
    free(params), free(grads), free(theta), free(an), free(num);
    work_free(&w);
}

// ----------------------------------------------------------------------------
// the GPT (transformer.h): gradient checks of each new op and of the whole model, and the
// attention's two-pass softmax giving the same bits however the keys and queries are split

// double-precision references, written out from the definitions
static void ln_ref(double* y, const double* x, const double* g, const double* b, int C) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= C;
    for (int c = 0; c < C; c++) y[c] = (x[c] - m) / sqrt(v + 1e-5) * g[c] + b[c];
}
static double gelu_ref(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x))); }
// causal attention of one row: qkv [T][3C] -> y [T][C], NH heads; a key j is visible to
// query i when j <= i + shift (shift 0: the causal mask; 1: a deliberate off-by-one)
static void attention_ref(double* y, const double* qkv, int T, int C, int NH, int shift) {
    int HD = C / NH;
    double s[T];
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < T; i++) {
            double m = -INFINITY, sum = 0;
            int n = i + shift < T - 1 ? i + shift + 1 : T;
            for (int j = 0; j < n; j++) {
                double d = 0;
                for (int e = 0; e < HD; e++) d += qkv[i * 3 * C + h * HD + e] * qkv[j * 3 * C + C + h * HD + e];
                s[j] = d / sqrt((double)HD), m = s[j] > m ? s[j] : m;
            }
            for (int j = 0; j < n; j++) s[j] = exp(s[j] - m), sum += s[j];
            for (int e = 0; e < HD; e++) {
                double o = 0;
                for (int j = 0; j < n; j++) o += s[j] / sum * qkv[j * 3 * C + 2 * C + h * HD + e];
                y[i * C + h * HD + e] = o;
            }
        }
}

typedef struct {
    int N, C;
    const double* c; // the weights of f = sum c * out
} LnCtx;
static double ln_objective(const double* theta, void* vctx) {
    LnCtx* x = vctx;
    const double *in = theta, *g = in + x->N * x->C, *b = g + x->C;
    double y[x->C], f = 0;
    for (int n = 0; n < x->N; n++) {
        ln_ref(y, in + n * x->C, g, b, x->C);
        for (int k = 0; k < x->C; k++) f += x->c[n * x->C + k] * y[k];
    }
    return f;
}
static void test_grad_layernorm(void) {
    enum { N = 6, C = 10 };
    float x[N * C], g[C], b[C], y[N * C], mean[N], rstd[N], cw[N * C], dx[N * C];
    int64_t dg[C] = {0}, db[C] = {0};
    fill(x, N * C, 81, 2.0f), fill(g, C, 82, 1.5f), fill(b, C, 83, 0.5f), fill(cw, N * C, 84, 1.0f);
    layernorm_forward(y, mean, rstd, x, g, b, N, C);
    layernorm_backward_input(dx, NULL, cw, x, mean, rstd, g, N, C);
    layernorm_backward_params(dg, db, cw, x, mean, rstd, N, C, N);
    long n = N * C + 2 * C;
    double theta[N * C + 2 * C], an[N * C + 2 * C], num[N * C + 2 * C], cd[N * C];
    for (int i = 0; i < N * C; i++) theta[i] = x[i], an[i] = dx[i], cd[i] = cw[i];
    for (int i = 0; i < C; i++)
        theta[N * C + i] = g[i], theta[N * C + C + i] = b[i], an[N * C + i] = fix_to(dg[i]), an[N * C + C + i] = fix_to(db[i]);
    LnCtx ctx = {N, C, cd};
    numeric_grad(num, theta, n, ln_objective, &ctx);
    double err = grad_error(an, num, n);
    check(err < GRAD_TOL, "gradient check: LayerNorm (input, gain, bias): max rel error %.1e", err);
}
static const double* gelu_c;
static double gelu_objective(const double* x, void* ctx) {
    double f = 0;
    for (int i = 0; i < *(const int*)ctx; i++) f += gelu_c[i] * gelu_ref(x[i]);
    return f;
}
static void test_grad_gelu(void) {
    enum { N = 40 };
    float x[N], y[N], cw[N], dx[N];
    fill(x, N, 85, 4.0f), fill(cw, N, 86, 1.0f);
    gelu_forward(y, x, N);
    gelu_backward(dx, x, cw, N);
    double xd[N], a[N], num[N], cd[N], worst = 0;
    for (int i = 0; i < N; i++) xd[i] = x[i], a[i] = dx[i], cd[i] = cw[i];
    for (int i = 0; i < N; i++) worst = fmax(worst, fabs(y[i] - gelu_ref(x[i])) / (1e-3 + fabs(gelu_ref(x[i]))));
    int n = N;
    gelu_c = cd;
    numeric_grad(num, xd, N, gelu_objective, &n);
    double err = grad_error(a, num, N);
    check(err < GRAD_TOL && worst < 1e-5, "gradient check: GELU (tanh approximation; forward within %.1e of tanh's): max rel error %.1e", worst, err);
}

typedef struct {
    int R, T, C, NH, shift;
    const double* c;
} AttnCtx;
static double attention_objective(const double* theta, void* vctx) {
    AttnCtx* x = vctx;
    double y[x->T * x->C], f = 0;
    for (int r = 0; r < x->R; r++) {
        attention_ref(y, theta + (long)r * x->T * 3 * x->C, x->T, x->C, x->NH, x->shift);
        for (int i = 0; i < x->T * x->C; i++) f += x->c[(long)r * x->T * x->C + i] * y[i];
    }
    return f;
}
// The attention op, forward against the reference and backward against finite differences;
// and the same check with the reference's mask off by one, which must fail: a gradient check
// that can fail.
static void test_grad_attention(void) {
    enum { R = 2, T = 5, C = 6, NH = 2 };
    BlockDims d = {.R = R, .Tq = T, .T = T, .C = C, .NH = NH, .HD = C / NH, .A = C, .F = 4 * C, .pos = NULL};
    float qkv[R * T * 3 * C], y[R * T * C], att[R * NH * T * T], cw[R * T * C], dqkv[R * T * 3 * C];
    float* tmp = mallocCheck(sizeof(float) * block_scratch_floats(&d, R));
    int64_t* acc = mallocCheck(sizeof(int64_t) * block_scratch_int64s(&d, R));
    fill(qkv, R * T * 3 * C, 87, 1.5f), fill(cw, R * T * C, 88, 1.0f);
    attention_forward(y, att, qkv, &d, tmp, acc);
    attention_backward(dqkv, cw, qkv, att, y, &d, tmp, acc);
    long n = R * T * 3 * C;
    double theta[R * T * 3 * C], an[R * T * 3 * C], num[R * T * 3 * C], cd[R * T * C], yr[T * C], fwd = 0;
    for (int i = 0; i < n; i++) theta[i] = qkv[i], an[i] = dqkv[i];
    for (int i = 0; i < R * T * C; i++) cd[i] = cw[i];
    for (int r = 0; r < R; r++) {
        attention_ref(yr, theta + (long)r * T * 3 * C, T, C, NH, 0);
        for (int i = 0; i < T * C; i++) fwd = fmax(fwd, fabs(y[r * T * C + i] - yr[i]));
    }
    AttnCtx ctx = {R, T, C, NH, 0, cd};
    numeric_grad(num, theta, n, attention_objective, &ctx);
    double err = grad_error(an, num, n);
    check(err < GRAD_TOL && fwd < 1e-5, "gradient check: causal attention, 2 heads (forward within %.1e): max rel error %.1e", fwd, err);
    ctx.shift = 1; // the reference lets each query see the next key
    numeric_grad(num, theta, n, attention_objective, &ctx);
    double wrong = grad_error(an, num, n);
    check(wrong > 100 * GRAD_TOL, "gradient check that must fail: the reference's causal mask off by one gives max rel error %.1e", wrong);
    free(tmp), free(acc);
}

// The masked loss: rows with target -1 (the GPT's padding) add no loss and get no gradient.
static void test_grad_masked_xent(void) {
    enum { R = 6, V = 5 };
    float logits[R * V], probs[R * V], rowmax[R], tl[R], dl[R * V];
    int64_t sum[R];
    int targets[R] = {3, -1, 0, 4, -1, 1};
    fill(logits, R * V, 89, 3.0f);
    memcpy(probs, logits, sizeof probs);
    int64_t loss = xent_forward(probs, sum, rowmax, tl, targets, R, V, R);
    xent_backward(dl, probs, targets, R, V, 0);
    double ref = 0, worst = 0;
    for (int r = 0; r < R; r++) {
        double m = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) m = fmax(m, logits[r * V + v]);
        for (int v = 0; v < V; v++) s += exp(logits[r * V + v] - m);
        for (int v = 0; v < V; v++) {
            double want = targets[r] < 0 ? 0 : exp(logits[r * V + v] - m) / s - (v == targets[r]);
            worst = fmax(worst, fabs(dl[r * V + v] - want));
        }
        if (targets[r] >= 0) ref += log(s) + m - logits[r * V + targets[r]];
    }
    check(fabs(fix_to(loss) - ref) < 1e-5 * ref && worst < 1e-6,
          "masked cross-entropy: rows without a target add no loss (%.6f, reference %.6f) and get a zero gradient (max error %.1e)",
          fix_to(loss), ref, worst);
}

// The whole GPT in double precision: f = the sum of the losses over the valid targets
typedef struct {
    const Config* c;
    const int *tokens, *targets;
    int R, shift;
} GptCtx;
static double gpt_objective(const double* theta, void* vctx) {
    GptCtx* x = vctx;
    const Config* c = x->c;
    int T = c->context, C = c->emb, V = c->vocab, F = 4 * C, L = c->layers;
    BlockLayout bl = block_layout(C, C, F);
    double *h = mallocCheck(sizeof(double) * T * C), *y = mallocCheck(sizeof(double) * T * C);
    double *qkv = mallocCheck(sizeof(double) * T * 3 * C), *a = mallocCheck(sizeof(double) * T * C);
    double *m = mallocCheck(sizeof(double) * T * F), f = 0;
    for (int r = 0; r < x->R; r++) {
        const int *tok = x->tokens + r * T, *tgt = x->targets + r * T;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < C; k++) h[t * C + k] = theta[tok[t] * C + k] + theta[(long)V * C + t * C + k];
        for (int l = 1; l <= L; l++) {
            const double* w = theta + unit_offset(c, l);
            for (int t = 0; t < T; t++) {
                ln_ref(y + t * C, h + t * C, w + bl.ln1_g, w + bl.ln1_b, C);
                for (int j = 0; j < 3 * C; j++) {
                    double o = w[bl.qkv_b + j];
                    for (int k = 0; k < C; k++) o += y[t * C + k] * w[bl.qkv_w + (long)k * 3 * C + j];
                    qkv[t * 3 * C + j] = o;
                }
            }
            attention_ref(a, qkv, T, C, c->heads, x->shift);
            for (int t = 0; t < T; t++)
                for (int j = 0; j < C; j++) {
                    double o = w[bl.proj_b + j];
                    for (int k = 0; k < C; k++) o += a[t * C + k] * w[bl.proj_w + (long)k * C + j];
                    h[t * C + j] += o;
                }
            for (int t = 0; t < T; t++) {
                ln_ref(y + t * C, h + t * C, w + bl.ln2_g, w + bl.ln2_b, C);
                for (int j = 0; j < F; j++) {
                    double o = w[bl.fc_b + j];
                    for (int k = 0; k < C; k++) o += y[t * C + k] * w[bl.fc_w + (long)k * F + j];
                    m[t * F + j] = gelu_ref(o);
                }
                for (int j = 0; j < C; j++) {
                    double o = w[bl.fc2_b + j];
                    for (int k = 0; k < F; k++) o += m[t * F + k] * w[bl.fc2_w + (long)k * C + j];
                    h[t * C + j] += o;
                }
            }
        }
        const double* w = theta + unit_offset(c, L + 1); // lm_head [C][V], ln_f gain, bias
        for (int t = 0; t < T; t++) {
            if (tgt[t] < 0) continue;
            ln_ref(y, h + t * C, w + (long)C * V, w + (long)C * V + C, C);
            double logit[V], mx = -INFINITY, s = 0;
            for (int v = 0; v < V; v++) {
                logit[v] = 0;
                for (int k = 0; k < C; k++) logit[v] += y[k] * w[(long)k * V + v];
                mx = fmax(mx, logit[v]);
            }
            for (int v = 0; v < V; v++) s += exp(logit[v] - mx);
            f += log(s) + mx - logit[tgt[t]];
        }
    }
    free(h), free(y), free(qkv), free(a), free(m);
    return f;
}
// Row r of a GPT batch: a name of len[r] random characters (stream `salt`), then the stop
// token 0, then padding (target -1); the tokens are [0, the name, 0...]. Loaded into w.
static void gpt_test_batch(const Config* c, Work* w, int R, const int* len, uint64_t salt, int* tokens, int* targets) {
    int T = c->context;
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            int ch = 1 + (int)(rng_u64(salt, r, t) % (c->vocab - 1)), n = len[r];
            tokens[r * T + t] = t == 0 || t > n ? 0 : targets[r * T + t - 1];
            targets[r * T + t] = t < n ? ch : t == n ? 0 : -1;
        }
    work_init(w, c, R, NULL);
    memcpy(w->acts.tokens, tokens, sizeof(int) * R * T);
    memcpy(w->acts.targets, targets, sizeof(int) * R * T);
}
static void test_grad_gpt(int layers, int heads, int context, int emb) {
    Config c = {.model = MODEL_GPT, .heads = heads, .vocab = 7, .context = context, .emb = emb, .layers = layers};
    int R = 3, T = context;
    long np = n_params(&c);
    float* params = mallocCheck(sizeof(float) * np);
    for (int u = 0; u < n_units(&c); u++) unit_init(params + unit_offset(&c, u), &c, u, 77 + layers);
    int tokens[3 * 8], targets[3 * 8], len[3] = {2, T > 4 ? 4 : T - 1, T - 1}; // padding, and a full row
    Work w;
    gpt_test_batch(&c, &w, R, len, 63, tokens, targets);
    int64_t loss = model_forward(&c, params, &w, R, R);
    int64_t* grads = callocCheck(np, sizeof(int64_t));
    model_backward(&c, params, grads, &w, R, R);
    double *theta = mallocCheck(sizeof(double) * np), *an = mallocCheck(sizeof(double) * np),
           *num = mallocCheck(sizeof(double) * np);
    for (long i = 0; i < np; i++) theta[i] = params[i], an[i] = fix_to(grads[i]);
    GptCtx ctx = {&c, tokens, targets, R, 0};
    double ref = gpt_objective(theta, &ctx);
    numeric_grad(num, theta, np, gpt_objective, &ctx);
    double err = grad_error(an, num, np);
    check(fabs(fix_to(loss) - ref) < 1e-5 * ref && err < GRAD_TOL,
          "gradient check: whole GPT, %d blocks, %d heads, T=%d, C=%d, padded rows (%ld parameters; loss %.6f, "
          "reference %.6f): max rel error %.1e", layers, heads, context, emb, np, fix_to(loss), ref, err);
    free(params), free(grads), free(theta), free(an), free(num);
    work_free(&w);
}

// Attention with bf16 operands (layers.h): y, P, dq, dk and dv come out as their definitions
// with q, k, v, e, P, dS and dO rounded, here written out from the same primitives, bit for
// bit; fp32 operands give other bits.
static void test_attention_bf16(void) {
    enum { T = 5, HD = 4 };
    BlockDims d = {.R = 1, .Tq = T, .T = T, .C = HD, .NH = 1, .HD = HD, .A = HD, .F = 4 * HD, .pos = NULL};
    float qkv[T * 3 * HD], y[T * HD], att[T * T], dy[T * HD], dqkv[T * 3 * HD], yf[T * HD], dqkvf[T * 3 * HD];
    float* tmp = mallocCheck(sizeof(float) * block_scratch_floats(&d, 1));
    int64_t* acc = mallocCheck(sizeof(int64_t) * block_scratch_int64s(&d, 1));
    fill(qkv, T * 3 * HD, 131, 2.0f), fill(dy, T * HD, 132, 1.0f);
    attention_forward(yf, att, qkv, &d, tmp, acc);
    attention_backward(dqkvf, dy, qkv, att, yf, &d, tmp, acc);
    operands_bf16 = 1;
    attention_forward(y, att, qkv, &d, tmp, acc);
    attention_backward(dqkv, dy, qkv, att, y, &d, tmp, acc);
    operands_bf16 = 0;
#define Q(i, e) bf16_round(qkv[(i) * 3 * HD + (e)])
#define K(j, e) bf16_round(qkv[(j) * 3 * HD + HD + (e)])
#define V(j, e) bf16_round(qkv[(j) * 3 * HD + 2 * HD + (e)])
    float scale = 1.0f / sqrtf((float)HD), s[T][T], e[T][T], D[T];
    int same = 1, differs = 0;
    for (int i = 0; i < T; i++) {
        float m = -INFINITY;
        for (int j = 0; j <= i; j++) {
            float dot = 0.0f;
            for (int x = 0; x < HD; x++) dot = fmaf(Q(i, x), K(j, x), dot);
            s[i][j] = dot * scale, m = fmaxf(m, s[i][j]);
        }
        int64_t S = 0, num[HD] = {0};
        for (int j = 0; j <= i; j++) {
            e[i][j] = expf(s[i][j] - m), S += fix_fast(e[i][j]);
            for (int x = 0; x < HD; x++) num[x] += fix_fast((double)bf16_round(e[i][j]) * V(j, x));
        }
        for (int x = 0; x < HD; x++) same &= y[i * HD + x] == (float)(fix_to(num[x]) / fix_to(S));
        for (int j = 0; j <= i; j++) same &= att[i * T + j] == (float)(e[i][j] / fix_to(S));
        D[i] = 0.0f;
        for (int x = 0; x < HD; x++) D[i] = fmaf(dy[i * HD + x], y[i * HD + x], D[i]);
    }
    for (int t = 0; t < T; t++)
        for (int x = 0; x < HD; x++) {
            int64_t dv = 0, dq = 0, dk = 0;
            for (int i = t; i < T; i++) {
                dv += fix_fast((double)bf16_round(att[i * T + t]) * bf16_round(dy[i * HD + x]));
                float dp = 0.0f;
                for (int z = 0; z < HD; z++) dp = fmaf(bf16_round(dy[i * HD + z]), V(t, z), dp);
                dk += fix_fast((double)bf16_round(att[i * T + t] * (dp - D[i]) * scale) * Q(i, x));
            }
            for (int j = 0; j <= t; j++) {
                float dp = 0.0f;
                for (int z = 0; z < HD; z++) dp = fmaf(bf16_round(dy[t * HD + z]), V(j, z), dp);
                dq += fix_fast((double)bf16_round(att[t * T + j] * (dp - D[t]) * scale) * K(j, x));
            }
            same &= dqkv[t * 3 * HD + 2 * HD + x] == (float)fix_to(dv) && dqkv[t * 3 * HD + x] == (float)fix_to(dq) &&
                    dqkv[t * 3 * HD + HD + x] == (float)fix_to(dk);
            differs += dqkv[t * 3 * HD + 2 * HD + x] != dqkvf[t * 3 * HD + 2 * HD + x] || y[t * HD + x] != yf[t * HD + x];
        }
#undef Q
#undef K
#undef V
    check(same && differs > 0, "attention with bf16 operands: y, P, dq, dk and dv are their definitions with q, k, v, e, P, "
          "dS and dO rounded, bit for bit (%d of %d values differ from fp32 operands')", differs, T * HD);
    free(tmp), free(acc);
}

// The two-pass softmax gives the same bits however the keys come in blocks and whichever
// queries a rank holds (context parallelism: train_cp.c), forward and backward.
static void test_attention_split(void) {
    enum { R = 2, T = 8, C = 8, NH = 2, HD = 4 };
    BlockDims d = {.R = R, .Tq = T, .T = T, .C = C, .NH = NH, .HD = HD, .A = C, .F = 4 * C, .pos = NULL};
    float qkv[R * T * 3 * C], y[R * T * C], att[R * NH * T * T], dy[R * T * C], dqkv[R * T * 3 * C];
    float* tmp = mallocCheck(sizeof(float) * block_scratch_floats(&d, R));
    int64_t* acc = mallocCheck(sizeof(int64_t) * block_scratch_int64s(&d, R));
    fill(qkv, R * T * 3 * C, 91, 2.0f), fill(dy, R * T * C, 92, 1.0f);
    attention_forward(y, att, qkv, &d, tmp, acc);
    attention_backward(dqkv, dy, qkv, att, y, &d, tmp, acc);
    // queries of one "rank": positions {1, 2, 5, 6} (zigzag chunks 1 and 2 of 4); keys in two
    // blocks {0, 1, 6, 7} and {2, 3, 4, 5}, passed in the order a ring would bring them
    int qpos[4] = {1, 2, 5, 6}, k1[4] = {0, 1, 6, 7}, k2[4] = {2, 3, 4, 5}, Tq = 4;
    BlockDims q = d;
    q.Tq = Tq, q.pos = qpos;
    float qs[R * Tq * 3 * C], kv1[R * 4 * 3 * C], kv2[R * 4 * 3 * C], ys[R * Tq * C], atts[R * NH * Tq * T],
        rowmax[R * NH * Tq], dys[R * Tq * C], D[R * NH * Tq], vT[HD * 4];
    int64_t expsum[R * NH * Tq], pv[R * Tq * C], dq[R * Tq * C], dk1[R * 4 * C], dv1[R * 4 * C], dk2[R * 4 * C], dv2[R * 4 * C];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 4; i++) {
            memcpy(qs + (r * Tq + i) * 3 * C, qkv + (r * T + qpos[i]) * 3 * C, sizeof(float) * 3 * C);
            memcpy(kv1 + (r * 4 + i) * 3 * C, qkv + (r * T + k1[i]) * 3 * C, sizeof(float) * 3 * C);
            memcpy(kv2 + (r * 4 + i) * 3 * C, qkv + (r * T + k2[i]) * 3 * C, sizeof(float) * 3 * C);
            memcpy(dys + (r * Tq + i) * C, dy + (r * T + qpos[i]) * C, sizeof(float) * C);
        }
    for (int i = 0; i < R * NH * Tq; i++) rowmax[i] = -INFINITY;
    memset(expsum, 0, sizeof expsum), memset(pv, 0, sizeof pv);
    attention_scores(atts, rowmax, qs, 3 * C, kv2 + C, 3 * C, k2, 4, &q, vT);
    attention_scores(atts, rowmax, qs, 3 * C, kv1 + C, 3 * C, k1, 4, &q, vT);
    attention_exp_pv(atts, expsum, pv, rowmax, kv1 + 2 * C, 3 * C, k1, 4, &q, T);
    attention_exp_pv(atts, expsum, pv, rowmax, kv2 + 2 * C, 3 * C, k2, 4, &q, T);
    attention_finish(atts, ys, C, expsum, pv, &q);
    int same = 1;
    for (int r = 0; r < R; r++)
        for (int i = 0; i < Tq; i++) {
            same &= !memcmp(ys + (r * Tq + i) * C, y + (r * T + qpos[i]) * C, sizeof(float) * C);
            for (int h = 0; h < NH; h++)
                same &= !memcmp(atts + ((r * NH + h) * Tq + i) * T, att + ((r * NH + h) * T + qpos[i]) * T, sizeof(float) * T);
        }
    check(same, "attention: a rank's queries {1,2,5,6} against two blocks of keys, in either order, give the whole's bits");
    memset(dq, 0, sizeof dq), memset(dk1, 0, sizeof dk1), memset(dv1, 0, sizeof dv1), memset(dk2, 0, sizeof dk2), memset(dv2, 0, sizeof dv2);
    attention_backward_d(D, dys, ys, C, &q);
    attention_backward_block(dq, dk2, dv2, atts, D, qs, 3 * C, kv2 + C, 3 * C, kv2 + 2 * C, 3 * C, dys, C, k2, 4, &q, vT, T);
    attention_backward_block(dq, dk1, dv1, atts, D, qs, 3 * C, kv1 + C, 3 * C, kv1 + 2 * C, 3 * C, dys, C, k1, 4, &q, vT, T);
    for (int r = 0; r < R; r++)
        for (int i = 0; i < Tq; i++)
            for (int x = 0; x < C; x++) same &= (float)fix_to(dq[(r * Tq + i) * C + x]) == dqkv[(r * T + qpos[i]) * 3 * C + x];
    check(same, "attention backward: those queries' dq, summed over the two blocks of keys, are the whole's bits");
    free(tmp), free(acc);
}

// dot_keys (16 keys at a time where the block has 16 more, the rest one by one) against the
// fmaf chain it stands for, for blocks shorter than, as long as and longer than 16 keys and
// every count of keys a query sees.
static void test_dot_keys(void) {
    const int sizes[][2] = {{4, 3}, {16, 16}, {20, 5}, {33, 8}, {48, 64}}; // Tk, HD
    int same = 1, cases = 0;
    for (int s = 0; s < 5; s++) {
        int Tk = sizes[s][0], HD = sizes[s][1];
        float a[64], bT[64 * 48], got[48], want[48];
        fill(a, HD, 300 + s, 1.0f), fill(bT, (long)HD * Tk, 310 + s, 1.0f);
        for (int n = 0; n <= Tk; n++, cases++) {
            dot_keys(got, a, bT, HD, n, Tk);
            for (int j = 0; j < n; j++) {
                want[j] = 0.0f;
                for (int e = 0; e < HD; e++) want[j] = fmaf(a[e], bT[e * Tk + j], want[j]);
            }
            same &= !memcmp(got, want, sizeof(float) * n);
        }
    }
    check(same, "attention: dot_keys equals the fmaf chain over the head for each of %d (keys, visible) cases", cases);
}

// Attention's exact sums check a bound once a key and the terms one by one only where it
// fails: a run stops if and only if a term it adds is out of range. A value of v (or k) far
// out of range on a key no query sees stops nothing; on a key a query sees, it stops the run.
static jmp_buf fatal_back;
static void fatal_catch(const char* message) {
    (void)message;
    longjmp(fatal_back, 1);
}
typedef struct {
    int backward; // 0: pass 2, 1: the backward's block
    float *att, *v, *k, *qkv, *dy, *D, *vT, *rowmax;
    int64_t *expsum, *acc, *dk, *dv;
    int *kpos;
    BlockDims* d;
} AttentionCall;
static int attention_stops(AttentionCall* c) {
    fatal_end = fatal_catch;
    int stopped = 1;
    if (setjmp(fatal_back) == 0) {
        if (c->backward)
            attention_backward_block(c->acc, c->dk, c->dv, c->att, c->D, c->qkv, 4, c->k, 4, c->v, 4, c->dy, 4,
                                     c->kpos, 2, c->d, c->vT, 8);
        else
            attention_exp_pv(c->att, c->expsum, c->acc, c->rowmax, c->v, 4, c->kpos, 2, c->d, 8);
        stopped = 0;
    }
    fatal_end = fatal_end_process;
    return stopped;
}
static void test_attention_range(void) {
    // one row, one head of 4; queries at positions 0 and 1; a block of 2 keys at positions 0
    // and 5 (the second visible to neither query); limit 2^11 for sums of 8 terms
    int qpos[2] = {0, 1}, kpos[2] = {0, 5};
    BlockDims d = {.R = 1, .Tq = 2, .T = 8, .C = 4, .NH = 1, .HD = 4, .A = 4, .F = 16, .pos = qpos};
    float att[2 * 8] = {0}, rowmax[2] = {0}, v[2 * 4], k[2 * 4], qkv[2 * 4], dy[2 * 4], D[2] = {0}, vT[4 * 2];
    int64_t expsum[2], acc[2 * 4], dk[2 * 4], dv[2 * 4];
    for (int i = 0; i < 8; i++) v[i] = k[i] = qkv[i] = dy[i] = 1.0f;
    AttentionCall c = {0, att, v, k, qkv, dy, D, vT, rowmax, expsum, acc, dk, dv, kpos, &d};
    int ok = 1;
    for (int backward = 0; backward < 2; backward++) {
        float* big = backward ? k : v; // the factor each checks by a bound
        c.backward = backward;
        for (int seen = 0; seen < 2; seen++) {
            // pass 2 reads att as scores (0: e = 1), the backward as probabilities (1 where key 0 is seen)
            memset(att, 0, sizeof att), att[0] = att[8] = backward ? 1.0f : 0.0f;
            memset(expsum, 0, sizeof expsum), memset(acc, 0, sizeof acc), memset(dk, 0, sizeof dk), memset(dv, 0, sizeof dv);
            big[seen ? 2 : 4 + 2] = 1e5f; // on key 0 (a term of each query's sum), or on key 5 (never a term)
            ok &= attention_stops(&c) == seen;
            big[seen ? 2 : 4 + 2] = 1.0f;
        }
    }
    check(ok, "attention: a value far out of range stops the run where it is a term (pass 2's v, the backward's k), "
              "and not on a key no query sees");
}

// The reference router's choices and gates: the k most probable experts, ties to the lower
// index; the gate the probability for k = 1, else renormalised over the k chosen.
// (bias: --balance bias's, added to the affinities for choosing only; NULL: none)
static void ref_top_k(const double* p, const float* bias, int X, int k, int* ch) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int x = 0; x < X; x++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= ch[i] == x;
            double px = p[x] + (bias ? bias[x] : 0), pb = best < 0 ? 0 : p[best] + (bias ? bias[best] : 0);
            if (!taken && (best < 0 || px > pb)) best = x;
        }
        ch[j] = best;
    }
}
// The router's affinities from its scores z [X], in place: the softmax; with --router sigmoid
// each score's sigmoid. Returns what the load-balancing term divides them by: 1, or with
// sigmoid their sum (DeepSeek-V3's normalised affinities).
static double ref_affinities(const Config* c, double* z) {
    int X = c->experts;
    double mx = -INFINITY, s = 0;
    if (c->router == ROUTER_SIGMOID) {
        for (int x = 0; x < X; x++) z[x] = 1 / (1 + exp(-z[x])), s += z[x];
        return s;
    }
    for (int x = 0; x < X; x++) mx = z[x] > mx ? z[x] : mx;
    for (int x = 0; x < X; x++) z[x] = exp(z[x] - mx), s += z[x];
    for (int x = 0; x < X; x++) z[x] /= s;
    return 1;
}
static double ref_gate(const double* p, const int* ch, int k, int j) {
    double s = 0;
    for (int i = 0; i < k; i++) s += p[ch[i]];
    return k == 1 ? p[ch[0]] : p[ch[j]] / s;
}
// An expert's queue holds every first choice before any second, and so on: choice j of
// expert x comes after all earlier slots' choices of x.
static long ref_place(int total[][64], int seen[][64], int j, int x) {
    long place = seen[j][x]++;
    for (int i = 0; i < j; i++) place += total[i][x];
    return place;
}

// The mixture-of-experts model (model.h), in double precision and written out from its
// definition: router softmax, top k (ties to the lower index), gates (k = 1: the probability;
// k >= 2: renormalised), capacity C = ceil(CF k R / X) by slot then row, experts Linear + ReLU,
// the gated sum, plus each shared expert's output on every row; f = the rows' losses + the
// load-balancing terms, alpha X sum_x f_x sum_r p_x.
static long moe_dropped; // tokens the last call dropped
// out [H] += g x the MLP's expert with weights we (w [K][H], then b [H]) on in [K]: ReLU(in w + b)
static void ref_relu_expert(double* out, double g, const double* in, const double* we, int K, int H) {
    for (int i = 0; i < H; i++) {
        double o = we[(long)K * H + i];
        for (int q = 0; q < K; q++) o += in[q] * we[(long)q * H + i];
        out[i] += g * (o > 0 ? o : 0);
    }
}
static double moe_model_objective(const double* theta, void* vctx) {
    ModelCtx* m = vctx;
    const Config* c = m->c;
    int R = m->R, T = c->context, E = c->emb, X = c->experts, k = c->top_k, H = c->hidden, maxw = max_width(c);
    double *cur = mallocCheck(sizeof(double) * R * maxw), *nxt = mallocCheck(sizeof(double) * R * maxw), f = 0;
    double* p = mallocCheck(sizeof(double) * R * X);
    int* ch = mallocCheck(sizeof(int) * R * k);
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            for (int e = 0; e < E; e++) cur[r * maxw + t * E + e] = theta[m->tokens[r * T + t] * E + e];
    moe_dropped = 0;
    for (int l = 1; l <= c->layers + 1; l++) {
        int K = linear_in(c, l), J = linear_out(c, l);
        const double* w = theta + unit_offset(c, l);
        if (!is_moe(c, l)) {
            for (int r = 0; r < R; r++)
                for (int j = 0; j < J; j++) {
                    double o = w[(long)K * J + j];
                    for (int i = 0; i < K; i++) o += cur[r * maxw + i] * w[(long)i * J + j];
                    nxt[r * maxw + j] = l <= c->layers ? (o > 0 ? o : 0) : o;
                }
        } else {
            int total[MAX_TOP_K][64] = {{0}};
            double norm[16];
            for (int r = 0; r < R; r++) {
                for (int x = 0; x < X; x++) {
                    double z = 0;
                    for (int i = 0; i < K; i++) z += cur[r * maxw + i] * w[(long)i * X + x];
                    p[r * X + x] = z;
                }
                norm[r] = ref_affinities(c, p + r * X);
                ref_top_k(p + r * X, c->balance == BALANCE_BIAS ? moe_bias_of(c, l) : NULL, X, k, ch + r * k);
                for (int j = 0; j < k; j++) total[j][ch[r * k + j]]++;
            }
            long C = (long)ceil((double)c->capacity * k * R / X);
            for (int x = 0; x < X; x++) { // the load-balancing terms
                double psum = 0;
                for (int r = 0; r < R; r++) psum += p[r * X + x] / norm[r];
                long chose = 0;
                for (int j = 0; j < k; j++) chose += total[j][x];
                f += (double)c->aux_loss * X * (double)chose / (k * R) * psum;
            }
            int seen[MAX_TOP_K][64] = {{0}};
            for (int r = 0; r < R; r++)
                for (int i = 0; i < H; i++) nxt[r * maxw + i] = 0;
            for (int j = 0; j < k; j++)
                for (int r = 0; r < R; r++) {
                    int x = ch[r * k + j];
                    long place = ref_place(total, seen, j, x);
                    if (place >= C) {
                        moe_dropped++;
                        continue;
                    }
                    ref_relu_expert(nxt + r * maxw, ref_gate(p + r * X, ch + r * k, k, j), cur + r * maxw,
                                    w + moe_replicated_params(c, l) + x * expert_params(c, l), K, H);
                }
            for (int s = 0; s < c->shared_experts; s++) // every row through each shared expert, gate 1
                for (int r = 0; r < R; r++)
                    ref_relu_expert(nxt + r * maxw, 1.0, cur + r * maxw, w + router_params(c, l) + s * expert_params(c, l), K, H);
        }
        double* t = cur;
        cur = nxt, nxt = t;
    }
    for (int r = 0; r < R; r++) {
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < c->vocab; v++) mx = cur[r * maxw + v] > mx ? cur[r * maxw + v] : mx;
        for (int v = 0; v < c->vocab; v++) s += exp(cur[r * maxw + v] - mx);
        f += log(s) + mx - cur[r * maxw + m->targets[r]];
    }
    free(cur), free(nxt), free(p), free(ch);
    return f;
}
// The router a gradient check takes: 0 softmax with the loss, 1 sigmoid with the loss, 2
// sigmoid with --balance bias, its biases set to move some choices (and no loss).
static const char* test_route(Config* c, int route) {
    c->router = route ? ROUTER_SIGMOID : ROUTER_SOFTMAX, c->balance = route == 2 ? BALANCE_BIAS : BALANCE_AUX;
    if (route == 2) {
        c->aux_loss = 0, c->bias_rate = 0.001f;
        for (int u = 1; u <= c->layers; u++)
            for (int x = 0; x < c->experts; x++) moe_bias_of(c, u)[x] = 0.25f * (float)((x + u) % 3) - 0.25f;
    }
    return route == 0 ? "softmax" : route == 1 ? "sigmoid" : "sigmoid, biases";
}
// The mixture of experts on one process (train.c's), against the reference above: the loss
// plus the aux loss, and every gradient (router, experts, and the layers around them).
static void test_grad_moe(int layers, int experts, int top_k, float capacity, int R, int want_drops, int route, int S) {
    Config c = {.vocab = 7, .context = 3, .emb = 2, .hidden = 5, .layers = layers, .experts = experts,
                .top_k = top_k, .shared_experts = S, .capacity = capacity, .aux_loss = 0.05f};
    const char* router = test_route(&c, route);
    long np = n_params(&c);
    float* params = mallocCheck(sizeof(float) * np);
    for (int u = 0; u < n_units(&c); u++) unit_init(params + unit_offset(&c, u), &c, u, 99 + layers + experts);
    for (long e = 0; e < unit_params(&c, 1); e++) params[unit_offset(&c, 1) + e] *= 3.0f;
    int tokens[16 * 3], targets[16];
    for (int i = 0; i < R * c.context; i++) tokens[i] = (int)(rng_u64(71, 71, i) % c.vocab);
    for (int r = 0; r < R; r++) targets[r] = (int)(rng_u64(72, 72, r) % c.vocab);
    Work w;
    work_init(&w, &c, R, NULL);
    memcpy(w.acts.tokens, tokens, sizeof(int) * R * c.context);
    memcpy(w.acts.targets, targets, sizeof(int) * R);
    w.acts.training = 1;
    int64_t loss = model_forward(&c, params, &w, R, R);
    long dropped = 0;
    for (int u = 1; u <= layers; u++) dropped += w.acts.moe[u].dropped_last;
    int64_t* grads = callocCheck(np, sizeof(int64_t));
    model_backward(&c, params, grads, &w, R, R);
    double *theta = mallocCheck(sizeof(double) * np), *an = mallocCheck(sizeof(double) * np),
           *num = mallocCheck(sizeof(double) * np);
    for (long i = 0; i < np; i++) theta[i] = params[i], an[i] = fix_to(grads[i]);
    ModelCtx ctx = {&c, tokens, targets, R};
    double ref = moe_model_objective(theta, &ctx), got = fix_to(loss) + fix_to(w.acts.aux);
    long ref_dropped = moe_dropped;
    numeric_grad(num, theta, np, moe_model_objective, &ctx);
    double err = grad_error(an, num, np);
    check(fabs(got - ref) < 1e-5 * ref && err < GRAD_TOL && dropped == ref_dropped && (dropped > 0) == want_drops,
          "gradient check: mixture of %d experts, top-%d (%s), %d shared, L=%d, capacity %g, %d rows, %ld tokens "
          "dropped (reference %ld), aux loss %.2e: max rel error %.1e", experts, top_k, router, S, layers, capacity, R,
          dropped, ref_dropped, fix_to(w.acts.aux) / R, err);
    free(params), free(grads), free(theta), free(an), free(num);
    work_free(&w);
}

// --router sigmoid, top-2: logits of -300 make every affinity 0, whose normalised gates would
// be 0 / 0; the run stops, saying why. Logits of -50 (affinities of 2e-22) still route.
// 2: stopped by fatal; 1: gates other than 1/2; 0: routed.
static int route_stops(float logit) {
    Config c = {.vocab = 7, .context = 3, .emb = 2, .hidden = 5, .layers = 1, .experts = 4, .top_k = 2,
                .capacity = 1.0f, .router = ROUTER_SIGMOID};
    Work w;
    work_init(&w, &c, 4, NULL);
    MoeLayer* m = &w.acts.moe[1];
    long K = m->e.K;
    float* in = mallocCheck(sizeof(float) * 4 * K);
    float* wr = mallocCheck(sizeof(float) * K * c.experts);
    for (long i = 0; i < 4 * K; i++) in[i] = 1.0f;
    for (long i = 0; i < K * c.experts; i++) wr[i] = logit / (float)K;
    fatal_end = fatal_catch;
    int stopped = 2;
    if (setjmp(fatal_back) == 0) {
        moe_route(&c, m, in, wr, 4, &w.ws);
        stopped = 0;
        for (int j = 0; j < 4 * 2; j++) stopped |= !(m->gate[j] == 0.5f);
    }
    fatal_end = fatal_end_process;
    free(in), free(wr);
    work_free(&w);
    return stopped;
}
static void test_route_underflow(void) {
    check(route_stops(-300.0f) == 2 && route_stops(-50.0f) == 0,
          "--router sigmoid: affinities that all underflow to 0 stop the run (0 / 0 gates), tiny ones still route");
}

// out [C] += g x the expert with weights we (laid out as el) on z [C]; m: [F] of scratch
static void ref_gelu_mlp(double* out, double g, const double* z, const double* we, const MlpLayout* el, int C, int F,
                         double* m) {
    for (int q = 0; q < F; q++) {
        double o = we[el->fc_b + q];
        for (int v = 0; v < C; v++) o += z[v] * we[el->fc_w + (long)v * F + q];
        m[q] = gelu_ref(o);
    }
    for (int q = 0; q < C; q++) {
        double o = we[el->fc2_b + q];
        for (int v = 0; v < F; v++) o += m[v] * we[el->fc2_w + (long)v * C + q];
        out[q] += g * o;
    }
}
// The GPT with experts (model.h's "a unit with a mixture of experts") in double precision,
// written out from its definition: each block's attention half as the dense GPT's; then its
// tokens, over the whole batch, the positions with a target only (padding is not routed in
// training), routed as moe_model_objective routes rows: the router on ln2's output, top k,
// capacity C = ceil(CF k n / X) by slot then token, each expert the GELU MLP fc, GELU, fc2
// with biases of its own, the gated sum and each shared expert's output added to the
// residual; f = the losses over the targets + the load-balancing terms.
static double gpt_moe_objective(const double* theta, void* vctx) {
    GptCtx* x = vctx;
    const Config* c = x->c;
    int R = x->R, T = c->context, C = c->emb, V = c->vocab, F = expert_width(c), L = c->layers, X = c->experts, k = c->top_k;
    MoeBlockLayout bl = moe_block_layout(C, C, F, X, c->shared_experts);
    MlpLayout el = mlp_layout(C, F);
    double *h = mallocCheck(sizeof(double) * R * T * C), *y = mallocCheck(sizeof(double) * T * C);
    double *qkv = mallocCheck(sizeof(double) * T * 3 * C), *a = mallocCheck(sizeof(double) * T * C);
    double *z = mallocCheck(sizeof(double) * R * T * C), *m = mallocCheck(sizeof(double) * F);
    double *p = mallocCheck(sizeof(double) * R * T * X), f = 0;
    int *tok = mallocCheck(sizeof(int) * R * T), *ch = mallocCheck(sizeof(int) * R * T * k);
    for (int i = 0; i < R * T; i++)
        for (int q = 0; q < C; q++) h[i * C + q] = theta[x->tokens[i] * C + q] + theta[(long)V * C + (i % T) * C + q];
    moe_dropped = 0;
    for (int l = 1; l <= L; l++) {
        const double* w = theta + unit_offset(c, l);
        for (int r = 0; r < R; r++) { // attention, each row alone
            double* hr = h + (long)r * T * C;
            for (int t = 0; t < T; t++) {
                ln_ref(y + t * C, hr + t * C, w + bl.ln1_g, w + bl.ln1_b, C);
                for (int j = 0; j < 3 * C; j++) {
                    double o = w[bl.qkv_b + j];
                    for (int q = 0; q < C; q++) o += y[t * C + q] * w[bl.qkv_w + (long)q * 3 * C + j];
                    qkv[t * 3 * C + j] = o;
                }
            }
            attention_ref(a, qkv, T, C, c->heads, 0);
            for (int t = 0; t < T; t++) {
                for (int j = 0; j < C; j++) {
                    double o = w[bl.proj_b + j];
                    for (int q = 0; q < C; q++) o += a[t * C + q] * w[bl.proj_w + (long)q * C + j];
                    hr[t * C + j] += o;
                }
                ln_ref(z + ((long)r * T + t) * C, hr + t * C, w + bl.ln2_g, w + bl.ln2_b, C);
            }
        }
        int n = 0, total[MAX_TOP_K][64] = {{0}}, seen[MAX_TOP_K][64] = {{0}};
        for (int i = 0; i < R * T; i++)
            if (x->targets[i] >= 0) tok[n++] = i;
        double norm[3 * 5];
        for (int i = 0; i < n; i++) { // the router
            double* pi = p + (long)i * X;
            for (int e = 0; e < X; e++) {
                double o = 0;
                for (int q = 0; q < C; q++) o += z[(long)tok[i] * C + q] * w[bl.router_w + (long)q * X + e];
                pi[e] = o;
            }
            norm[i] = ref_affinities(c, pi);
            ref_top_k(pi, c->balance == BALANCE_BIAS ? moe_bias_of(c, l) : NULL, X, k, ch + i * k);
            for (int j = 0; j < k; j++) total[j][ch[i * k + j]]++;
        }
        long cap = (long)ceil((double)c->capacity * k * n / X);
        for (int e = 0; e < X; e++) { // the load-balancing terms
            double psum = 0;
            for (int i = 0; i < n; i++) psum += p[(long)i * X + e] / norm[i];
            long chose = 0;
            for (int j = 0; j < k; j++) chose += total[j][e];
            f += (double)c->aux_loss * X * (double)chose / (k * n) * psum;
        }
        for (int j = 0; j < k; j++)
            for (int i = 0; i < n; i++) {
                int e = ch[i * k + j];
                long place = ref_place(total, seen, j, e);
                if (place >= cap) {
                    moe_dropped++;
                    continue;
                }
                const double *pi = p + (long)i * X, *we = w + bl.routed + e * bl.expert, *zi = z + (long)tok[i] * C;
                ref_gelu_mlp(h + (long)tok[i] * C, ref_gate(pi, ch + i * k, k, j), zi, we, &el, C, F, m);
            }
        for (int s = 0; s < c->shared_experts; s++) // every token through each shared expert, gate 1
            for (int i = 0; i < n; i++)
                ref_gelu_mlp(h + (long)tok[i] * C, 1.0, z + (long)tok[i] * C, w + bl.shared_w + s * bl.expert, &el, C, F, m);
    }
    const double* w = theta + unit_offset(c, L + 1); // lm_head [C][V], ln_f gain, bias
    for (int i = 0; i < R * T; i++) {
        if (x->targets[i] < 0) continue;
        ln_ref(y, h + (long)i * C, w + (long)C * V, w + (long)C * V + C, C);
        double logit[V], mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) {
            logit[v] = 0;
            for (int q = 0; q < C; q++) logit[v] += y[q] * w[(long)q * V + v];
            mx = fmax(mx, logit[v]);
        }
        for (int v = 0; v < V; v++) s += exp(logit[v] - mx);
        f += log(s) + mx - logit[x->targets[i]];
    }
    free(h), free(y), free(qkv), free(a), free(z), free(m), free(p), free(tok), free(ch);
    return f;
}
// train.c's GPT with experts against the reference above, rows with padding: the loss plus
// the aux loss, and every gradient (attention, LayerNorms, routers, experts, embeddings, head).
// F: each expert's width (--expert-hidden; 0: 4C)
static void test_grad_gpt_moe(int layers, int experts, int top_k, float capacity, int want_drops, int F, int route, int S) {
    Config c = {.model = MODEL_GPT, .heads = 2, .vocab = 7, .context = 5, .emb = 4, .layers = layers,
                .experts = experts, .top_k = top_k, .shared_experts = S, .expert_hidden = F, .capacity = capacity,
                .aux_loss = 0.05f};
    const char* router = test_route(&c, route);
    int R = 3, T = c.context;
    long np = n_params(&c);
    MoeBlockLayout bl = gpt_moe_layout(&c);
    float* params = mallocCheck(sizeof(float) * np);
    for (int u = 0; u < n_units(&c); u++) {
        unit_init(params + unit_offset(&c, u), &c, u, 81 + layers + experts);
        for (long e = bl.router_w; e < bl.shared_w && is_moe(&c, u); e++) params[unit_offset(&c, u) + e] *= 3.0f; // a sure router: uneven loads
    }
    int tokens[3 * 5], targets[3 * 5], len[3] = {1, 3, T - 1}; // padding, and a full row
    Work w;
    gpt_test_batch(&c, &w, R, len, 64, tokens, targets);
    w.acts.training = 1;
    int64_t loss = model_forward(&c, params, &w, R, R);
    long dropped = 0;
    for (int u = 1; u <= layers; u++) dropped += w.acts.moe[u].dropped_last;
    int64_t* grads = callocCheck(np, sizeof(int64_t));
    model_backward(&c, params, grads, &w, R, R);
    double *theta = mallocCheck(sizeof(double) * np), *an = mallocCheck(sizeof(double) * np),
           *num = mallocCheck(sizeof(double) * np);
    for (long i = 0; i < np; i++) theta[i] = params[i], an[i] = fix_to(grads[i]);
    GptCtx ctx = {&c, tokens, targets, R, 0};
    double ref = gpt_moe_objective(theta, &ctx), got = fix_to(loss) + fix_to(w.acts.aux);
    long ref_dropped = moe_dropped;
    numeric_grad(num, theta, np, gpt_moe_objective, &ctx);
    double err = grad_error(an, num, np);
    int with_target = 0;
    for (int i = 0; i < R * T; i++) with_target += targets[i] >= 0;
    check(fabs(got - ref) < 1e-5 * ref && err < GRAD_TOL && dropped == ref_dropped && (dropped > 0) == want_drops &&
              w.acts.moe[1].n == with_target,
          "gradient check: GPT with %d experts of width %d a block, top-%d (%s), %d shared, %d blocks, capacity %g, %d of %d "
          "positions routed (those with a target: %d), %ld tokens dropped (reference %ld), %ld parameters (loss + aux "
          "%.6f, reference %.6f): max rel error %.1e", experts, expert_width(&c), top_k, router, S, layers, capacity,
          w.acts.moe[1].n, R * T, with_target, dropped,
          ref_dropped, np, got, ref, err);
    free(params), free(grads), free(theta), free(an), free(num);
    work_free(&w);
}

// The MoE layer's steps as a layout runs them (train_ep.c), on N ranks simulated in one
// process: each rank routes its own tokens and holds a range of the experts, the counts
// are concatenated, and the all-to-alls are copies between the ranks' buffers. The output,
// the aux loss, the input gradient and every weight gradient must have moe_forward's and
// moe_backward's bits (one process holding every expert).
// sim_all_to_all: rank q's rows for rank p (send_rows[q][p] of them, after those for the
// ranks before p) land in rank p's buffer after those from the ranks before q. Returns 0
// if the two sides disagree on a count.
static int sim_all_to_all(int N, float* const* send, int* const* send_rows, float* const* recv, int* const* recv_rows,
                          int width) {
    int ok = 1;
    for (int p = 0; p < N; p++)
        for (int q = 0, at = 0; q < N; at += recv_rows[p][q], q++) {
            long from = 0;
            for (int i = 0; i < p; i++) from += send_rows[q][i];
            ok &= send_rows[q][p] == recv_rows[p][q];
            memcpy(recv[p] + (long)at * width, send[q] + from * width, sizeof(float) * recv_rows[p][q] * width);
        }
    return ok;
}
static void test_moe_split(int model, int experts, int top_k, float capacity, int n_total, int N, int want_drops,
                           int F) {
    Config c = {.model = model, .heads = 2, .vocab = 7, .context = 3, .emb = 4, .hidden = 10, .layers = 1,
                .experts = experts, .top_k = top_k, .expert_hidden = F, .capacity = capacity, .aux_loss = 0.05f};
    Expert e = moe_expert(&c, 1);
    int K = e.K, H = e.H, X = experts, k = top_k;
    long nr = router_params(&c, 1), np = nr + X * e.params; // the layer's: the router, then the experts
    float *w = mallocCheck(sizeof(float) * np), *in = mallocCheck(sizeof(float) * n_total * K);
    float *dout = mallocCheck(sizeof(float) * n_total * H);
    float* unit = mallocCheck(sizeof(float) * unit_params(&c, 1));
    unit_init(unit, &c, 1, 5);
    for (long i = 0; i < np; i++) // from the unit's initial values; a sure router: uneven loads
        w[i] = i < nr ? 4.0f * unit[moe_router_at(&c) + i] : unit[moe_replicated_params(&c, 1) + i - nr];
    free(unit);
    fill(in, (long)n_total * K, 11, 1.0f);
    fill(dout, (long)n_total * H, 12, 1.0f);
    Workspace ws;
    workspace_init(&ws, n_total, max_width(&c), max_linear_weight(&c));
    // one process
    MoeLayer one;
    moe_layer_init(&one, &c, 1, e, n_total);
    float *out1 = mallocCheck(sizeof(float) * n_total * H), *din1 = mallocCheck(sizeof(float) * n_total * K);
    int64_t aux1 = 0, *g1 = callocCheck(np, sizeof(int64_t));
    moe_forward(&c, w, w + nr, &one, in, out1, n_total, 1, &aux1, &ws);
    moe_backward(&c, w, w + nr, g1, g1 + nr, &one, in, dout, din1, n_total, n_total, &ws);
    // N ranks
    MoeLayer m[4];
    long lo[4], hi[4], x_lo[4], x_hi[4];
    int x_first[5] = {0};
    float *wq[4], *send[4], *recv[4];
    int64_t* gq[4];
    int *send_rows[4], *recv_rows[4], *counts = mallocCheck(sizeof(int) * N * k * X), ok = 1;
    float *out = mallocCheck(sizeof(float) * n_total * H), *din = mallocCheck(sizeof(float) * n_total * K);
    int64_t aux = 0;
    for (int q = 0; q < N; q++) {
        split_range(n_total, N, q, &lo[q], &hi[q]);
        split_range(X, N, q, &x_lo[q], &x_hi[q]);
        x_first[q + 1] = (int)x_hi[q];
        long n = nr + (x_hi[q] - x_lo[q]) * e.params;
        wq[q] = mallocCheck(sizeof(float) * n), gq[q] = callocCheck(n, sizeof(int64_t));
        memcpy(wq[q], w, sizeof(float) * nr); // the router, replicated
        memcpy(wq[q] + nr, w + nr + moe_expert_at(&e, (int)x_lo[q], 0), sizeof(float) * (n - nr)); // its experts
        moe_layer_init(&m[q], &c, 1, e, n_total);
    }
    for (int q = 0; q < N; q++) {
        moe_route(&c, &m[q], in + lo[q] * K, wq[q], (int)(hi[q] - lo[q]), &ws);
        memcpy(counts + (long)q * k * X, m[q].counts, sizeof(int) * k * X); // the all-gather
    }
    long C = moe_capacity(&c, moe_batch_tokens(&c, counts, N), 1);
    for (int q = 0; q < N; q++) {
        moe_plan(&c, &m[q], counts, N, q, x_first, (int)(hi[q] - lo[q]), C);
        moe_balance(&c, &m[q], counts, N, q, (int)(hi[q] - lo[q]), n_total, C, &aux);
        moe_permute(&m[q], in + lo[q] * K);
        send_rows[q] = m[q].routed_to, recv_rows[q] = m[q].expert_from;
    }
    for (int q = 0; q < N; q++) send[q] = m[q].routed_in, recv[q] = m[q].expert_in;
    ok &= sim_all_to_all(N, send, send_rows, recv, recv_rows, K); // dispatch
    for (int q = 0; q < N; q++) { // each rank's experts on what it received: by source rank, then expert
        MoeLayer* p = &m[q];
        for (int s = 0, at = 0; s < N; s++)
            for (int x = (int)x_lo[q]; x < x_hi[q]; at += p->kept[s * X + x], x++)
                if (p->kept[s * X + x] > 0)
                    expert_forward(&e, p->expert_out + (long)at * H, p->expert_saved + (long)at * e.saved,
                                   p->expert_in + (long)at * K, wq[q] + nr + moe_expert_at(&e, x, (int)x_lo[q]),
                                   p->kept[s * X + x], p->tmp, p->acc, &ws);
    }
    for (int q = 0; q < N; q++) send[q] = m[q].expert_out, recv[q] = m[q].routed_out;
    ok &= sim_all_to_all(N, send, recv_rows, recv, send_rows, H); // combine
    for (int q = 0; q < N; q++) moe_unpermute(&c, &m[q], out + lo[q] * H, (int)(hi[q] - lo[q]));
    // backward
    for (int q = 0; q < N; q++) moe_unpermute_backward(&c, &m[q], dout + lo[q] * H, (int)(hi[q] - lo[q]));
    for (int q = 0; q < N; q++) send[q] = m[q].routed_dout, recv[q] = m[q].expert_dout;
    ok &= sim_all_to_all(N, send, send_rows, recv, recv_rows, H); // the output gradients to the experts
    for (int q = 0; q < N; q++) {
        MoeLayer* p = &m[q];
        for (int s = 0, at = 0; s < N; s++)
            for (int x = (int)x_lo[q]; x < x_hi[q]; at += p->kept[s * X + x], x++)
                if (p->kept[s * X + x] > 0) {
                    long off = nr + moe_expert_at(&e, x, (int)x_lo[q]);
                    expert_backward(&e, p->expert_din + (long)at * K, gq[q] + off, p->expert_dout + (long)at * H,
                                    p->expert_in + (long)at * K, p->expert_out + (long)at * H,
                                    p->expert_saved + (long)at * e.saved, wq[q] + off, p->kept[s * X + x], n_total,
                                    p->tmp, p->acc, &ws);
                }
    }
    for (int q = 0; q < N; q++) send[q] = m[q].expert_din, recv[q] = m[q].routed_din;
    ok &= sim_all_to_all(N, send, recv_rows, recv, send_rows, K); // the input gradients back
    for (int q = 0; q < N; q++) {
        int n = (int)(hi[q] - lo[q]);
        moe_router_backward(&c, &m[q], wq[q], gq[q], in + lo[q] * K, din + lo[q] * K, n, n_total, &ws);
        moe_permute_backward(&c, &m[q], din + lo[q] * K, n);
    }
    // the same bits: the router's gradient summed over the ranks, each expert's where it is
    int same_grads = 1;
    for (long i = 0; i < nr; i++) {
        int64_t sum = 0;
        for (int q = 0; q < N; q++) sum += gq[q][i];
        same_grads &= sum == g1[i];
    }
    for (int q = 0; q < N; q++)
        same_grads &= !memcmp(gq[q] + nr, g1 + nr + moe_expert_at(&e, (int)x_lo[q], 0),
                              sizeof(int64_t) * (x_hi[q] - x_lo[q]) * e.params);
    int same = ok && !memcmp(out, out1, sizeof(float) * n_total * H) && aux == aux1 &&
               !memcmp(din, din1, sizeof(float) * n_total * K) && same_grads;
    check(same && (one.dropped_last > 0) == want_drops && m[0].dropped_last == one.dropped_last,
          "mixture of %d %s experts (width %d), top-%d, capacity %g, %d tokens over %d simulated ranks (%ld dropped): "
          "the output, aux loss, input and weight gradients have one process's bits", X,
          model == MODEL_GPT ? "GELU MLP" : "ReLU", model == MODEL_GPT ? e.F : H, k, capacity, n_total, N, one.dropped_last);
    for (int q = 0; q < N; q++) free(wq[q]), free(gq[q]), moe_layer_free(&m[q]);
    moe_layer_free(&one);
    free(w), free(in), free(dout), free(out1), free(din1), free(g1), free(counts), free(out), free(din);
    workspace_free(&ws);
}

// ----------------------------------------------------------------------------
// data loader

static const char* write_file(const char* name, const char* text, size_t n) {
    static char path[256];
    snprintf(path, sizeof path, "/tmp/test_units_%d_%s", (int)getpid(), name);
    FILE* f = fopenCheck(path, "wb");
    fwrite(text, 1, n, f);
    fclose(f);
    return path;
}

static void test_data(void) {
    const char* lines = "emma\nava\nbob\nabba\nmia\nemma\nanna\nbea\nmaeb\nam\n";
    Dataset ds;
    dataset_load(&ds, write_file("a.txt", lines, strlen(lines)), 100, 42);
    int letters_ok = ds.vocab == 9 && ds.code_point[0] == '.';
    for (int t = 1; t < 9; t++) letters_ok &= ds.code_point[t] == (uint32_t)"abeimnov"[t - 1];
    check(letters_ok && dataset_token(&ds, 'a') == 1 && dataset_token(&ds, 'z') == -1 && dataset_token(&ds, 0x4E00) == -1 &&
              dataset_token(&ds, 0x10FFFF) == -1 && dataset_token(&ds, 0x110000) == -1,
          "vocabulary: the boundary, then the characters that occur, sorted");
    check(ds.n_lines == 10 && ds.n_val == 1 && ds.n_train == 9, "split: 10 lines give 9 train and 1 validation");
    long ex = 0;
    for (int i = 0; i < ds.n_lines; i++) ex += ds.line_len[i] + 1;
    check(ds.n_train_examples + ds.n_val_examples == ex, "a line of n characters gives n+1 examples");
    // every example of "emma", wherever it landed, with T = 3
    int line = -1;
    for (int i = 0; i < ds.n_lines && line < 0; i++)
        if (ds.line_len[i] == 4 && ds.tokens[ds.line_start[i]] == dataset_token(&ds, 'e')) line = i;
    int ctx[3], target, ok = line >= 0;
    const int want[5][4] = {{0, 0, 0, 'e'}, {0, 0, 'e', 'm'}, {0, 'e', 'm', 'm'}, {'e', 'm', 'm', 'a'}, {'m', 'm', 'a', 0}};
    for (int p = 0; ok && p <= 4; p++) {
        dataset_line_example(&ds, line, p, 3, ctx, &target);
        for (int t = 0; t < 3; t++) ok &= ctx[t] == (want[p][t] ? dataset_token(&ds, (uint32_t)want[p][t]) : 0);
        ok &= target == (want[p][3] ? dataset_token(&ds, (uint32_t)want[p][3]) : 0);
    }
    check(ok, "examples: left-padded context predicts the next character, the end predicts the boundary");
    // CRLF and blank lines give the same dataset
    const char* crlf = "emma\r\n\r\nava\r\nbob\r\n\nabba\r\nmia\r\nemma\r\nanna\r\nbea\r\nmaeb\r\nam";
    Dataset d2;
    dataset_load(&d2, write_file("b.txt", crlf, strlen(crlf)), 100, 42);
    check(d2.n_lines == ds.n_lines && d2.vocab == ds.vocab && d2.n_train_examples == ds.n_train_examples &&
              !memcmp(d2.tokens, ds.tokens, (ds.n_train_examples - ds.n_train) * sizeof(int32_t)),
          "CRLF line endings, blank lines and a missing final newline give the same dataset");
    dataset_free(&d2);
    dataset_free(&ds);

    // the split: deterministic for a seed, different for another
    char big[4000];
    int n = 0;
    for (int i = 0; i < 300; i++) n += snprintf(big + n, sizeof big - n, "%c%c%c\n", 'a' + i % 26, 'a' + i / 26 % 26, 'a' + i % 7);
    const char* path = write_file("c.txt", big, n);
    Dataset s1, s2, s3;
    dataset_load(&s1, path, 100, 1);
    dataset_load(&s2, path, 100, 1);
    dataset_load(&s3, path, 100, 2);
    check(s1.n_val == 30 && !memcmp(s1.tokens, s2.tokens, 900 * sizeof(int32_t)) && memcmp(s1.tokens, s3.tokens, 900 * sizeof(int32_t)),
          "split: 10%% validation, the same for a seed, different for another");
    // the rows [lo, hi) of a batch are exactly those rows of the whole batch
    int T = 4, B = 32, tok[32 * 4], tgt[32], part_tok[11 * 4], part_tgt[11];
    dataset_batch(&s1, 7, 5, 0, B, T, tok, tgt);
    dataset_batch(&s1, 7, 5, 11, 22, T, part_tok, part_tgt);
    check(!memcmp(part_tok, tok + 11 * T, sizeof part_tok) && !memcmp(part_tgt, tgt + 11, sizeof part_tgt),
          "batch: rows 11..21 drawn alone equal rows 11..21 of the whole batch");
    // every example of both splits, located by the searches that advance together (in
    // groups of 13, so groups end mid-line), equals the one a walk over the lines finds
    int located = 1;
    for (int split = 0; split < 2; split++) {
        long n_ex = split ? s1.n_val_examples : s1.n_train_examples, idx[13], e = 0;
        int got_tok[13 * 4], got_tgt[13], want_tok[4], want_tgt;
        for (int l = split ? s1.n_train : 0; l < (split ? s1.n_lines : s1.n_train); l++)
            for (int p = 0; p <= s1.line_len[l]; p++, e++) {
                idx[e % 13] = e;
                if (e % 13 == 12 || e == n_ex - 1) {
                    int k = (int)(e % 13) + 1;
                    dataset_examples(&s1, split, idx, k, T, got_tok, got_tgt);
                    for (int j = 0; j < k; j++) { // example idx[j] is at line l', found again by walking
                        long want = idx[j], w = 0;
                        for (int l2 = split ? s1.n_train : 0;; l2++, w += s1.line_len[l2 - 1] + 1)
                            if (want - w <= s1.line_len[l2]) {
                                dataset_line_example(&s1, l2, (int)(want - w), T, want_tok, &want_tgt);
                                break;
                            }
                        located &= !memcmp(want_tok, got_tok + j * T, sizeof want_tok) && want_tgt == got_tgt[j];
                    }
                }
            }
        located &= e == n_ex;
    }
    check(located, "examples: the batched searches find every example of both splits where a walk does");
    int tok2[32 * 4], tgt2[32];
    dataset_batch(&s1, 7, 6, 0, B, T, tok2, tgt2);
    check(memcmp(tok, tok2, sizeof tok) != 0, "batch: another step draws other rows");
    dataset_free(&s1), dataset_free(&s2), dataset_free(&s3);
}

// UTF-8: every code point round-trips; each kind of invalid sequence is refused; a file of
// names in four scripts gives one token per character, sorted by code point; a vocabulary
// of thousands of characters is looked up through its pages.
static void test_utf8(void) {
    int round = 1;
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        if (cp == 0xD800) cp = 0xE000; // surrogates are not characters
        char b[4];
        uint32_t back = 0;
        const char* why = NULL;
        int n = utf8_encode(cp, b);
        round &= utf8_decode((const unsigned char*)b, (size_t)n, &back, &why) == n && back == cp &&
                 n == (cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);
    }
    check(round, "utf8: every code point from U+0000 to U+10FFFF (no surrogates) encodes in its shortest form and decodes back");
    const struct {
        const char* bytes;
        const char* why;
    } bad[] = {{"\x80", "continuation"}, {"\xbf", "continuation"}, {"\xc3", "cut short"}, {"\xe4\xb8", "cut short"},
               {"\xc3\x28", "cut short"}, {"\xf0\x9f\x98", "cut short"}, {"\xc0\xaf", "overlong"},
               {"\xc1\xbf", "overlong"}, {"\xe0\x80\xaf", "overlong"}, {"\xf0\x80\x80\xaf", "overlong"},
               {"\xed\xa0\x80", "surrogate"}, {"\xed\xbf\xbf", "surrogate"}, {"\xf4\x90\x80\x80", "above U+10FFFF"},
               {"\xf7\xbf\xbf\xbf", "above U+10FFFF"}, {"\xf8\x88\x80\x80", "never occurs"}, {"\xff", "never occurs"}};
    int refused = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint32_t cp;
        const char* why = "";
        refused &= utf8_decode((const unsigned char*)bad[i].bytes, strlen(bad[i].bytes), &cp, &why) == 0 &&
                   strstr(why, bad[i].why) != NULL;
    }
    check(refused, "utf8: stray and missing continuation bytes, overlong forms, surrogates, code points above U+10FFFF "
                   "and bytes never in UTF-8 are each refused, saying which");
    // José, Zoë, Ελένη, 李娜, محمد, and five more lines
    const char* lines = "Jos\xc3\xa9\nZo\xc3\xab\n\xce\x95\xce\xbb\xce\xad\xce\xbd\xce\xb7\n\xe6\x9d\x8e\xe5\xa8\x9c\n"
                        "\xd9\x85\xd8\xad\xd9\x85\xd8\xaf\nAnna\nBo\nEve\nIda\nJo\n";
    Dataset ds;
    dataset_load(&ds, write_file("u.txt", lines, strlen(lines)), 100, 42);
    int sorted = 1;
    for (int t = 2; t < ds.vocab; t++) sorted &= ds.code_point[t - 1] < ds.code_point[t];
    int kinds = ds.vocab == 1 + 13 + 2 + 5 + 2 + 3; // '.'; A B E I J Z a d e n o s v; é ë; Ε έ η λ ν; 李 娜; ح د م
    long chars = 0;
    for (int i = 0; i < ds.n_lines; i++) chars += ds.line_len[i];
    char name[64] = "";
    FILE* mem = fmemopen(name, sizeof name, "w");
    int word[4] = {dataset_token(&ds, 0x674E), dataset_token(&ds, 0x5A1C), 0, 0};
    dataset_write_name(&ds, word, 4, mem);
    fclose(mem);
    check(kinds && sorted && ds.code_point[ds.vocab - 1] == 0x674E && chars == 4 + 3 + 5 + 2 + 4 + 4 + 2 + 3 + 3 + 2 &&
              ds.max_len == 5 && !strcmp(name, "\xe6\x9d\x8e\xe5\xa8\x9c"),
          "utf8: names in Latin, Greek, Chinese and Arabic give a token per character (%d), sorted by code point, lines "
          "counted in characters, and print back as UTF-8", ds.vocab);
    dataset_free(&ds);
    // 3000 CJK characters, one per line in reverse: tokens 1..3000 in code point order
    char* big = malloc(3000 * 4 + 1);
    int n = 0;
    for (int i = 2999; i >= 0; i--) n += utf8_encode(0x4E00 + (uint32_t)i * 5, big + n), big[n++] = '\n';
    dataset_load(&ds, write_file("cjk.txt", big, (size_t)n), 100, 42);
    int found = ds.vocab == 3001;
    for (int i = 0; i < 3000; i++) found &= dataset_token(&ds, 0x4E00 + (uint32_t)i * 5) == i + 1 && dataset_token(&ds, 0x4E01 + (uint32_t)i * 5) == -1;
    check(found, "utf8: a vocabulary of 3001 tokens over %d pages of code points is looked up exactly", ((0x4E00 + 2999 * 5) >> 12) - (0x4E00 >> 12) + 1);
    dataset_free(&ds);
    free(big);
}

// Only a line's own tokens are read: the token array placed between two pages that are not
// mapped (its first token at the start of a page, then its last at the end of one), every
// example (T = 3 and 16) and every sequence (whole lines, and cut at 4 positions) of every
// line reads inside it. A vectorized loop that loaded whole vectors from before a line's
// start crashed here, as it did in train_tp once tokens were 4 bytes.
static void test_data_bounds(void) {
    char text[4000];
    int n = 0;
    for (int i = 0; i < 300; i++) n += snprintf(text + n, sizeof text - n, "%.*s\n", 1 + i % 9, "abcdefghijk" + i % 3);
    Dataset ds;
    dataset_load(&ds, write_file("bounds.txt", text, (size_t)n), 100, 3);
    long total = ds.line_start[ds.n_lines - 1] + ds.line_len[ds.n_lines - 1];
    size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = (size_t)total * sizeof(int32_t);
    size_t span = (bytes + page - 1) / page * page;
    int32_t* own = ds.tokens;
    int ok = 1;
    for (int at_end = 0; at_end < 2; at_end++) {
        int zero = open("/dev/zero", O_RDONLY); // (MAP_ANONYMOUS is not POSIX)
        char* map = mmap(NULL, span + 2 * page, PROT_NONE, MAP_PRIVATE, zero, 0);
        if (map == MAP_FAILED || mprotect(map + page, span, PROT_READ | PROT_WRITE) != 0) abort();
        close(zero);
        ds.tokens = (int32_t*)(map + page + (at_end ? span - bytes : 0));
        memcpy(ds.tokens, own, bytes);
        for (int T = 3; T <= 16; T += 13)
            for (int l = 0; l < ds.n_lines; l++)
                for (int p = 0; p <= ds.line_len[l]; p++) {
                    int ctx[16], tgt;
                    dataset_line_example(&ds, l, p, T, ctx, &tgt);
                    ok &= tgt == (p < ds.line_len[l] ? own[ds.line_start[l] + p] : 0);
                }
        for (int T = 4; T <= ds.max_len + 1; T += ds.max_len - 3) {
            dataset_use_rows(&ds, T);
            for (int l = 0; l < ds.n_lines; l++) {
                int tok[16], tgt[16];
                dataset_line_sequence(&ds, l, tok, tgt);
                ok &= tok[0] == 0 && (ds.line_len[l] >= T || tgt[ds.line_len[l]] == 0);
            }
        }
        dataset_use_rows(&ds, 0);
        munmap(map, span + 2 * page);
    }
    ds.tokens = own;
    check(ok, "data: examples and sequences read only their line's tokens (the array between two unmapped pages)");
    dataset_free(&ds);
}

static void test_rng(void) {
    double sum = 0, sq = 0;
    int in_range = 1;
    for (int i = 0; i < 100000; i++) {
        double u = rng_uniform(3, 1, i), z = rng_normal(3, 2, i);
        in_range &= u >= 0 && u < 1;
        sum += z, sq += z * z;
    }
    double mean = sum / 100000, var = sq / 100000 - mean * mean;
    check(in_range && fabs(mean) < 0.02 && fabs(var - 1) < 0.02 && rng_u64(1, 2, 3) == rng_u64(1, 2, 3) &&
              rng_u64(1, 2, 3) != rng_u64(1, 2, 4) && rng_u64(1, 2, 3) != rng_u64(2, 2, 3),
          "rng: uniform in [0,1), normal with mean %.3f and variance %.3f, a pure function of its inputs", mean, var);
}

// ----------------------------------------------------------------------------
// --timeline's drawing: every action gets a column of its own, however short, also when
// several crowd the end of the step (a loaded machine's timing hid one: audit 5, item 9)
static void test_timeline(void) {
    double t0[] = {0, 0.990, 0.995, 0.9990, 0.0, 0.5, 0, 0}, t1[] = {0.9, 0.992, 0.996, 1.0, 0.0001, 0.50001, 0, 0};
    char mark[] = {'0', '1', 'a', 'b', 'x', 'y', 0, 0}; // lane 1: two actions, then padding
    fflush(stdout);
    int saved = dup(1);
    FILE* f = tmpfile();
    if (saved < 0 || !f) { check(0, "timeline: a temporary file for its output"); return; }
    dup2(fileno(f), 1);
    draw_timeline(2, "lane", 4, t0, t1, mark, 10, "legend");
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    char out[4096] = "";
    rewind(f);
    size_t got = fread(out, 1, sizeof out - 1, f);
    out[got] = 0;
    fclose(f);
    char* lane0 = strstr(out, "lane 0 |");
    int ok = lane0 != NULL;
    for (const char* m = "01ab"; *m && lane0; m++) ok &= memchr(lane0 + 8, *m, 10) != NULL;
    check(ok, "timeline: four actions, three of them in the last 1%% of a 10-column step, each drawn (%s)",
          lane0 ? "lane 0 found" : "no lane 0");
}

int main(void) {
    test_matmul_float();
    test_matmul_exact();
    test_bf16_operands();
    test_attention_bf16();
    test_kept_weights();
    test_transpose();
    test_expf_array();
    test_fix();
    test_reduce();
    test_split_invariance();
    test_timeline();
    {
        Config mlp = {.vocab = 27, .context = 3, .emb = 5, .hidden = 7, .layers = 3};
        Config mlp2 = {.vocab = 27, .context = 4, .emb = 3, .hidden = 64, .layers = 2};
        Config moe = {.vocab = 11, .context = 3, .emb = 4, .hidden = 6, .layers = 2, .experts = 5, .top_k = 2};
        Config gpt = {.model = MODEL_GPT, .vocab = 27, .context = 6, .emb = 24, .heads = 6, .layers = 2};
        Config gmoe = {.model = MODEL_GPT, .vocab = 29, .context = 5, .emb = 12, .heads = 6, .layers = 2, .experts = 3, .top_k = 1};
        Config gfine = gmoe;
        gfine.experts = 8, gfine.top_k = 4, gfine.expert_hidden = 12;
        for (int t = 1; t <= 4; t++) test_tables(&mlp, t, "the MLP, hidden 7 (padded)"), test_tables(&mlp2, t, "the MLP, even layers");
        test_tables(&moe, 1, "the MLP's experts");
        for (int t = 1; t <= 6; t += t == 3 ? 3 : 1) test_tables(&gpt, t, "the GPT"), test_tables(&gmoe, t, "the GPT's experts");
        test_tables(&gfine, 1, "the GPT's fine-grained experts (--expert-hidden 12)");
        test_tables(&gfine, 2, "the GPT's fine-grained experts (--expert-hidden 12)");
        Config mshared = moe, gshared = gfine;
        mshared.shared_experts = 2, gshared.shared_experts = MAX_SHARED_EXPERTS;
        test_tables(&mshared, 1, "the MLP's experts, 2 shared");
        for (int t = 1; t <= 2; t++) test_tables(&gshared, t, "the GPT's fine-grained experts, 8 shared");
    }
    test_grad_linear(0, 0, 5, 7, 6);
    test_grad_linear(1, 1, 4, 9, 5);
    test_grad_linear(1, 0, 3, 16, 24);
    test_grad_relu();
    test_grad_embedding();
    test_grad_xent();
    test_vocab_parallel_xent();
    test_grad_model(1, 8, 3, 2);
    test_grad_model(2, 6, 2, 3);
    test_grad_model(3, 5, 4, 2);
    test_grad_model(1, 33, 5, 3);
    test_grad_layernorm();
    test_grad_gelu();
    test_grad_attention();
    test_grad_masked_xent();
    test_attention_split();
    test_dot_keys();
    test_attention_range();
    test_grad_gpt(1, 2, 4, 4);
    test_grad_gpt(2, 2, 5, 6);
    test_grad_gpt(1, 1, 3, 3);
    test_grad_moe(1, 4, 1, 4.0f, 12, 0, 0, 0);
    test_grad_moe(1, 4, 1, 1.0f, 12, 1, 0, 0);
    test_grad_moe(2, 4, 2, 1.25f, 12, 1, 0, 0);
    test_grad_moe(1, 3, 2, 2.0f, 10, 0, 0, 0);
    test_grad_moe(2, 8, 2, 0.5f, 16, 1, 0, 0);
    test_grad_moe(1, 8, 4, 1.0f, 12, 1, 0, 0);
    test_grad_moe(1, 16, 8, 4.0f, 10, 0, 0, 0);
    test_grad_moe(1, 4, 1, 1.0f, 12, 1, 1, 0); // --router sigmoid, with the loss
    test_grad_moe(2, 8, 4, 1.0f, 12, 1, 1, 0);
    test_grad_moe(2, 8, 4, 1.0f, 12, 1, 2, 0); // sigmoid, --balance bias
    test_grad_moe(1, 4, 1, 1.0f, 12, 1, 0, 1); // --shared-experts
    test_grad_moe(2, 8, 4, 1.0f, 12, 1, 2, 2);
    test_route_underflow();
    test_grad_gpt_moe(1, 4, 1, 4.0f, 0, 0, 0, 0);
    test_grad_gpt_moe(1, 4, 1, 1.0f, 1, 0, 0, 0);
    test_grad_gpt_moe(2, 4, 2, 1.0f, 1, 0, 0, 0);
    test_grad_gpt_moe(1, 3, 2, 2.0f, 0, 0, 0, 0);
    test_grad_gpt_moe(1, 8, 4, 1.0f, 1, 0, 0, 0);
    test_grad_gpt_moe(1, 8, 4, 1.0f, 1, 4, 0, 0); // fine-grained: experts a quarter of 4C wide
    test_grad_gpt_moe(2, 4, 2, 2.0f, 0, 24, 0, 0); // wider than 4C
    test_grad_gpt_moe(1, 8, 4, 1.0f, 1, 4, 1, 0); // --router sigmoid
    test_grad_gpt_moe(2, 8, 4, 1.0f, 1, 4, 2, 0); // sigmoid, --balance bias
    test_grad_gpt_moe(1, 8, 4, 1.0f, 1, 4, 2, 1); // DeepSeek's: fine-grained, sigmoid with biases, one shared
    test_grad_gpt_moe(2, 4, 2, 1.0f, 1, 0, 0, 2);
    test_moe_split(MODEL_MLP, 4, 1, 0.75f, 30, 2, 1, 0);
    test_moe_split(MODEL_MLP, 5, 2, 0.5f, 31, 3, 1, 0);
    test_moe_split(MODEL_MLP, 8, 2, 4.0f, 30, 4, 0, 0);
    test_moe_split(MODEL_MLP, 3, 2, 1.0f, 29, 3, 1, 0);
    test_moe_split(MODEL_GPT, 4, 1, 0.75f, 30, 2, 1, 0);
    test_moe_split(MODEL_GPT, 5, 2, 0.5f, 31, 3, 1, 0);
    test_moe_split(MODEL_GPT, 8, 2, 4.0f, 30, 4, 0, 0);
    test_moe_split(MODEL_MLP, 8, 4, 0.75f, 30, 3, 1, 0);
    test_moe_split(MODEL_GPT, 16, 8, 1.0f, 29, 4, 1, 0);
    test_moe_split(MODEL_GPT, 16, 4, 1.0f, 29, 4, 1, 4);
    test_data();
    test_utf8();
    test_data_bounds();
    test_rng();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
