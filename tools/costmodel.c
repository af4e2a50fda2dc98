/*
 * tools/costmodel.c: how long one training step takes, predicted from three things a
 * reader can check: how fast this machine computes (a short benchmark of the project's
 * own kernels), how fast its links are (alpha, the latency of a message, and beta, the
 * bytes per second; tools/pingpong measures both), and what each program sends per step
 * (its formulas, printed in every report) and how long its pipeline idles (schedules.h).
 *
 *   tools/costmodel compute                           # this machine: ms per step of train.c's model, by rows
 *   tools/costmodel predict RUN.sum ALPHA BETA [COMPUTE [LOCAL_ALPHA LOCAL_BETA HOSTS]]  # one run of make cluster
 *   tools/costmodel project cluster/h100-16k.txt [--hidden H --layers L ... --tp 8 --pp 16]  # layouts ranked; where TP 8 x PP 16 stands
 *   tools/costmodel selftest                          # the arithmetic, on cases computed by hand
 *
 * The model, for one step (every term is per rank; ranks work in parallel):
 *
 *   time = compute x (1 / (1 - bubble)) x oversubscription  +  messages x alpha  +  bytes / beta
 *
 *   compute          the rank's share of train.c's work: rows B/N for data parallel and ZeRO
 *                    (measured at that row count, so small batches keep their overheads),
 *                    1/N of the whole for tensor parallel, 1/S for a pipeline stage
 *   bubble           the schedule's closed form: (S-1)/(M+S-1) for GPipe and 1F1B, ...
 *   oversubscription ranks / cores, when processes take turns on the cores (emulated hosts
 *                    share this machine's cores)
 *   messages, bytes  what the rank sends per step: the program's formula for bytes and its
 *                    count of messages (a ring all-reduce on N ranks: 2(N-1) messages of 1/N,
 *                    the reduce-scatter's cut in pieces of 64Ki elements)
 *
 * Communication is charged in full, never hidden behind compute: the programs' collectives
 * block (train_dp --overlap aside), so that is what they do.
 */
#include "../ckpt.h"
#include "../schedules.h"
#include "summary.h"
#include "costmodel_cluster.h"

#include <ctype.h>
#include <stdarg.h>

// ----------------------------------------------------------------------------
// the alpha-beta model of the collectives

// A ring all-reduce of `bytes` over n ranks: 2(n-1) steps, each a message of bytes/n.
static double t_allreduce(double bytes, int n, double alpha, double beta) {
    return n <= 1 ? 0 : 2.0 * (n - 1) * (alpha + bytes / n / beta);
}
// A ring all-gather or reduce-scatter whose whole buffer is `bytes`: n-1 steps.
static double t_half(double bytes, int n, double alpha, double beta) {
    return n <= 1 ? 0 : (n - 1.0) * (alpha + bytes / n / beta);
}
static double t_p2p(double bytes, double alpha, double beta) { return alpha + bytes / beta; }

// ----------------------------------------------------------------------------
// compute: ms of one training step of the default model on R rows, by the project's kernels

static Dataset names;
static double step_seconds(const Config* c, int R) {
    State s = state_alloc(n_params(c), 0);
    Options o = {.seed = 42};
    Holding all = holding_units(c, &s, 0, n_units(c), 0);
    holding_load(&all, &o, &names, c);
    Work w;
    work_init(&w, c, R, NULL);
    Optimizer opt = {.lr = 0.1f};
    enum { REPS = 41 };
    double t[REPS];
    for (int rep = -5; rep < REPS; rep++) {
        double t0 = now_seconds();
        Rows rows = training_rows(&names, 42, rep + 10, 0);
        model_forward_rows(c, s.params, &w, &rows, 0, R, R, NULL);
        fix_zero(s.grads, s.n);
        model_backward(c, s.params, s.grads, &w, R, R);
        optimizer_step(&opt, s.params, s.grads, s.m, s.v, s.n, grad_factor(R), 1.0f, 1);
        if (rep >= 0) t[rep] = now_seconds() - t0;
    }
    work_free(&w);
    state_free(&s);
    return median(t, REPS);
}

// ----------------------------------------------------------------------------
// predict: one run of make cluster, from its --summary

// What the model needs of a run: its program and layout, and what the rank that sends the
// most sends per step (the formula's bytes, of them on each axis of train_3d.c's grid, and
// its messages).
typedef struct {
    char program[64], layout[200];
    int ranks, batch;
    double sent, messages;
    double axis[3];
} Run;

static Run run_of(const Summary* m) {
    Run r = {.ranks = m->ranks, .batch = (int)m->batch};
    snprintf(r.program, sizeof r.program, "%s", m->program);
    snprintf(r.layout, sizeof r.layout, "%s", m->layout);
    for (int q = 0; q < m->ranks; q++) {
        if (m->sent_formula[q] > r.sent) {
            r.sent = m->sent_formula[q];
            memcpy(r.axis, m->axis[q], sizeof r.axis);
        }
        r.messages = m->messages[q] > r.messages ? m->messages[q] : r.messages;
    }
    return r;
}

// The pipeline of a layout, from its words ("2 stages x 1 chunks, 4 microbatches, 1f1b"; 3D:
// "2 pipeline ... 4 microbatches, gpipe"): stages, microbatches and the closed-form bubble.
static double layout_bubble(const char* layout, int* S, int* M) {
    const char* p;
    *S = 1, *M = 1;
    if ((p = strstr(layout, " stages"))) while (p > layout && isdigit((unsigned char)p[-1])) p--, *S = atoi(p);
    if ((p = strstr(layout, " pipeline ="))) while (p > layout && isdigit((unsigned char)p[-1])) p--, *S = atoi(p);
    if ((p = strstr(layout, " microbatches"))) while (p > layout && isdigit((unsigned char)p[-1])) p--, *M = atoi(p);
    int V = 1, sched = SCHEDULE_1F1B;
    if ((p = strstr(layout, " chunks"))) while (p > layout && isdigit((unsigned char)p[-1])) p--, V = atoi(p);
    for (int k = 0; k < N_SCHEDULES; k++)
        if (strstr(layout, schedule_names[k])) sched = k;
    if (*S <= 1) return 0;
    double b = schedule_bubble_formula(sched, *S, V, *M, (Durations){.f = 1, .i = 1, .w = 1});
    return b < 0 ? (*S - 1.0) / (*M + *S - 1.0) : b;
}

// The links a run's messages take: across hosts (alpha, beta) or, for an axis of the 3D grid
// whose groups fit inside a host, shared memory (local_alpha, local_beta).
typedef struct {
    double alpha, beta, local_alpha, local_beta;
    int hosts;
} Links;

// Seconds of one step of run r: compute from `t_rows` (train.c's step time by rows).
// Ranks fill the hosts in order, so in train_3d.c's grid (tensor fastest, then data, then
// pipeline) an axis stays inside a host when the product of it and the faster axes fits.
static double predict(const Run* r, double (*t_rows)(void* ctx, int rows), void* ctx, int cores, Links k,
                      double* compute_out) {
    double alpha = k.alpha, beta = k.beta;
    int N = r->ranks, S, M, T = 1, D = 1;
    double bubble = layout_bubble(r->layout, &S, &M), compute;
    const char* prog = r->program;
    if (!strcmp(prog, "train.c")) compute = t_rows(ctx, r->batch);
    else if (!strcmp(prog, "train_dp.c") || !strcmp(prog, "train_fsdp.c")) compute = t_rows(ctx, (r->batch + N - 1) / N);
    else if (!strcmp(prog, "train_tp.c")) compute = t_rows(ctx, r->batch) / N;
    else if (!strcmp(prog, "train_pp.c")) compute = t_rows(ctx, r->batch) / S / (1 - bubble);
    else if (!strcmp(prog, "train_3d.c")) {
        if (sscanf(r->layout, "grid of %d tensor x %d data", &T, &D) != 2) fatal("cannot read the grid of '%s'", r->layout);
        compute = t_rows(ctx, (r->batch + D - 1) / D) / T / S / (1 - bubble);
    } else fatal("no cost model for program '%s'", prog);
    if (N > cores) compute *= (double)N / cores;
    *compute_out = compute;
    if (!strcmp(prog, "train_3d.c") && r->sent > 0 && k.hosts > 1) {
        int per_host = (N + k.hosts - 1) / k.hosts, span[3] = {T, T * D, N};
        double comm = 0;
        for (int a = 0; a < 3; a++) { // messages shared out in proportion to the bytes
            int local = span[a] <= per_host;
            double share = r->axis[a] / r->sent;
            comm += share * r->messages * (local ? k.local_alpha : alpha) + r->axis[a] / (local ? k.local_beta : beta);
        }
        return compute + comm;
    }
    return compute + r->messages * alpha + r->sent / beta;
}

// t_rows from a table of measured (rows, seconds), linear between its points
typedef struct {
    int n;
    int rows[32];
    double sec[32];
} Table;
static double table_rows(void* ctx, int rows) {
    const Table* t = ctx;
    if (rows <= t->rows[0]) return t->sec[0] * rows / t->rows[0];
    for (int i = 1; i < t->n; i++)
        if (rows <= t->rows[i])
            return t->sec[i - 1] + (t->sec[i] - t->sec[i - 1]) * (rows - t->rows[i - 1]) / (t->rows[i] - t->rows[i - 1]);
    return t->sec[t->n - 1] * rows / t->rows[t->n - 1];
}
static Table measure_table(void) {
    dataset_load(&names, "names.txt", DATA_DEFAULT_MAX_LINE, 42);
    Config c = {.vocab = names.vocab, .context = 16, .emb = 16, .hidden = 64, .layers = 1};
    Table t = {0};
    for (int rows = 1; rows <= 64; rows *= 2) t.rows[t.n] = rows, t.sec[t.n++] = step_seconds(&c, rows);
    return t;
}

// ----------------------------------------------------------------------------
// project: a described cluster, a large model of our family, every layout ranked

typedef struct {
    double V, T, E, H, L, B; // vocabulary, context, embedding, hidden, layers, batch (rows: tokens)
} Big;
typedef struct {
    int tp, pp, dp, zero, M;
    double time, compute, comm, bubble, memory;
    int fits;
} Layout;

// One layout: tp x pp x dp devices, ZeRO stage (0: plain DP), 1F1B with M microbatches.
// Mixed precision as large runs train: 2-byte parameters and gradients, 12 bytes of fp32
// master weights, m and v per parameter (ZeRO's K = 12); activations kept in 2 bytes.
static Layout cost(const Cluster* c, const Big* m, int tp, int pp, int dp, int zero, int M) {
    Layout l = {tp, pp, dp, zero, M, 0, 0, 0, 0, 0, 0};
    double P = m->V * m->E + m->T * m->E * m->H + (m->L - 1) * m->H * m->H + m->H * m->V; // weights
    double flops = 6.0 * m->B * (P - m->V * m->E);          // forward 2, backward 4 per weight and row
    double rate = c->flops * c->efficiency;
    double rows_mb = m->B / dp / M;                         // rows of one microbatch on one replica
    l.bubble = pp > 1 ? (pp - 1.0) / (M + pp - 1.0) : 0;
    l.compute = flops / (tp * pp * dp) / rate / (1 - l.bubble);
    // which links each axis uses: tp innermost, then pp, then dp (the usual rank order)
    int inner_tp = tp <= c->per_node, inner_pp = tp * pp <= c->per_node, inner_dp = tp * pp * dp <= c->per_node;
    double a_tp = inner_tp ? c->alpha_intra : c->alpha_inter, b_tp = inner_tp ? c->beta_intra : c->beta_inter;
    double a_pp = inner_pp ? c->alpha_intra : c->alpha_inter, b_pp = inner_pp ? c->beta_intra : c->beta_inter;
    double a_dp = inner_dp ? c->alpha_intra : c->alpha_inter, b_dp = inner_dp ? c->beta_intra : c->beta_inter;
    // TP: Megatron pairs (column then row): per pair one all-reduce of the activations in
    // forward (g) and one in backward (f), for every microbatch; 2 bytes a value
    double pairs = (m->L + 1) / 2.0 / pp;
    double t_tp = tp > 1 ? 2 * pairs * M * t_allreduce(2 * rows_mb * m->H, tp, a_tp, b_tp) : 0;
    // PP: each microbatch sends its activations forward and its gradient back, across a
    // boundary; the first and last stage's steady state overlaps the rest, the fill does not
    double t_pp = pp > 1 ? 2.0 * (M + pp - 2) * t_p2p(2 * rows_mb * m->H, a_pp, b_pp) : 0;
    // DP: the gradients of this rank's slice (P / (tp pp) values, 2 bytes): all-reduce
    // (plain and ZeRO 1, 2: reduce-scatter + all-gather, the same bytes), ZeRO-3 gathers the
    // parameters again for backward: 1.5 times
    double slice = P / tp / pp;
    double t_dp = t_allreduce(2 * slice, dp, a_dp, b_dp) * (zero == 3 ? 1.5 : 1.0);
    l.comm = t_tp + t_pp + t_dp;
    l.time = l.compute + l.comm;
    double bytes = slice * (2 + (zero >= 3 ? 2.0 / dp : 2) + (zero >= 2 ? 2.0 / dp : 2) + (zero >= 1 ? 12.0 / dp : 12));
    // 1F1B holds up to pp microbatches on the first stage: every layer's input and output
    double acts = (pp < M ? pp : M) * rows_mb * 2 * (m->T * m->E + 2 * m->H * (m->L / pp) / tp + m->V / pp);
    l.memory = bytes + acts;
    l.fits = l.memory <= c->memory;
    return l;
}

static int by_time(const void* a, const void* b) {
    const Layout *x = a, *y = b;
    if (x->fits != y->fits) return y->fits - x->fits;
    return (x->time > y->time) - (x->time < y->time);
}

static void project(const Cluster* c, const Big* m, int top, int mark_tp, int mark_pp) {
    int n = c->nodes * c->per_node, count = 0;
    Layout* all = mallocCheck(sizeof(Layout) * 4096);
    for (int tp = 1; tp <= n && tp <= 64; tp *= 2)
        for (int pp = 1; tp * pp <= n && pp <= 128; pp *= 2) {
            if (n % (tp * pp) || pp > m->L) continue;
            int dp = n / (tp * pp);
            for (int zero = 0; zero <= 3; zero++) {
                int M = pp > 1 ? 4 * pp : 1;
                if (m->B / dp / M < 1) continue;
                if (count < 4096) all[count++] = cost(c, m, tp, pp, dp, zero, M);
            }
        }
    qsort(all, count, sizeof(Layout), by_time);
    double P = m->V * m->E + m->T * m->E * m->H + (m->L - 1) * m->H * m->H + m->H * m->V;
    printf("%s: %d devices (%d nodes x %d), %.0f TFLOP/s each at %.0f%%, %.0f GB\n", c->name, n, c->nodes, c->per_node,
           c->flops / 1e12, 100 * c->efficiency, c->memory / 1e9);
    printf("model: %.0f billion parameters (hidden %.0f, %.0f layers, context %.0f x emb %.0f), batch %.0f rows\n\n",
           P / 1e9, m->H, m->L, m->T, m->E, m->B);
    printf("| rank | TP | PP | DP | ZeRO | M | step (s) | compute | communication | bubble | memory/device (GB) |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    int shown = 0;
    for (int i = 0; i < count && shown < top; i++, shown++) {
        const Layout* l = &all[i];
        printf("| %d | %d | %d | %d | %d | %d | %s%.2f | %.2f | %.2f | %.2f | %.1f%s |\n", i + 1, l->tp, l->pp, l->dp,
               l->zero, l->M, l->fits ? "" : "(no fit) ", l->time, l->compute, l->comm, l->bubble, l->memory / 1e9,
               l->fits ? "" : " > memory");
    }
    int fit = 0;
    for (int i = 0; i < count; i++) fit += all[i].fits;
    printf("\n%d layouts considered, %d fit in memory\n", count, fit);
    for (int i = 0; i < count; i++) // the first (fastest) of the marked layout's ZeRO stages
        if (all[i].tp == mark_tp && all[i].pp == mark_pp) {
            const Layout* l = &all[i];
            printf("the layout TP %d, PP %d, DP %d (ZeRO %d, M %d): rank %d of %d, %.2f s a step (%.2f compute, %.2f "
                   "communication), %.1f GB a device%s\n", l->tp, l->pp, l->dp, l->zero, l->M, i + 1, count, l->time,
                   l->compute, l->comm, l->memory / 1e9, l->fits ? "" : ": does not fit");
            break;
        }
    free(all);
}

// ----------------------------------------------------------------------------
// selftest: the arithmetic against cases computed by hand

static int failures, checks;
static void near(const char* what, double got, double want) {
    int ok = fabs(got - want) <= 1e-9 * fmax(1, fabs(want));
    checks++;
    printf("%s %s: %.9g (by hand %.9g)\n", ok ? "PASSED" : "FAILED", what, got, want);
    failures += !ok;
}
static double flat(void* ctx, int rows) { return *(double*)ctx * rows; }

static int selftest(void) {
    // a ring all-reduce of 8 MB over 4 ranks, alpha 10 us, beta 1 GB/s: 6 x (10 us + 2 ms)
    near("ring all-reduce, 8 MB over 4 ranks", t_allreduce(8e6, 4, 1e-5, 1e9), 6 * (1e-5 + 2e-3));
    near("ring all-gather, 8 MB over 4 ranks", t_half(8e6, 4, 1e-5, 1e9), 3 * (1e-5 + 2e-3));
    near("one rank all-reduces nothing", t_allreduce(8e6, 1, 1e-5, 1e9), 0);
    int S, M;
    near("bubble of '2 stages x 1 chunks, 4 microbatches, 1f1b' = 1/5",
         layout_bubble("pipeline of 2 stages x 1 chunks, 4 microbatches, 1f1b schedule", &S, &M), 0.2);
    near("bubble of naive with 4 stages = 3/4", layout_bubble("pipeline of 4 stages x 1 chunks, 8 microbatches, naive schedule", &S, &M), 0.75);
    near("bubble of the 3D grid 2 x 2 x 2, gpipe, M 4 = 1/5",
         layout_bubble("grid of 2 tensor x 2 data x 2 pipeline = 8 ranks; ZeRO stage 1; 4 microbatches, gpipe", &S, &M), 0.2);
    // 1 ms per row; data parallel on 2 ranks, 32 rows: 16 ms + 4 messages x 10 us + 150 KB / 100 MB/s
    double ms = 1e-3, compute;
    Run dp = {"train_dp.c", "data parallel over 2 ranks", 2, 32, 149088, 4, {0}};
    Links k = {1e-5, 1e8, 1e-6, 1e9, 2};
    near("dp on 2 ranks", predict(&dp, flat, &ms, 2, k, &compute), 0.016 + 4e-5 + 149088 / 1e8);
    // a pipeline of 2 stages, 1F1B, M = 4: 32 ms / 2 / (1 - 1/5) = 20 ms, plus 8 messages of 1 KB
    Run pp = {"train_pp.c", "pipeline of 2 stages x 1 chunks, 4 microbatches, 1f1b schedule", 2, 32, 8192, 8, {0}};
    near("pp 2 stages, 1f1b, M 4", predict(&pp, flat, &ms, 2, k, &compute), 0.020 + 8e-5 + 8192 / 1e8);
    // 8 ranks on 2 cores: compute takes 4 times as long
    Run g = {"train_3d.c", "grid of 2 tensor x 2 data x 2 pipeline = 8 ranks; ZeRO stage 1; 4 microbatches, gpipe", 8, 32, 0, 0, {0}};
    near("3d 2x2x2 on 2 cores", predict(&g, flat, &ms, 2, (Links){0, 1, 0, 1, 2}, &compute), 16e-3 / 2 / 2 / 0.8 * 4);
    // on 2 hosts of 4 ranks: tensor and data axes inside a host, the pipeline across; 10
    // messages shared out as the bytes: 1000 tp, 3000 dp, 1000 pp
    g.sent = 5000, g.messages = 10, g.axis[0] = 1000, g.axis[1] = 3000, g.axis[2] = 1000;
    near("3d 2x2x2 on 2 hosts: only the pipeline axis crosses",
         predict(&g, flat, &ms, 2, k, &compute) - compute, 8 * 1e-6 + 4000 / 1e9 + 2 * 1e-5 + 1000 / 1e8);
    // the projection: a 2-node cluster and a model whose numbers are easy
    Cluster c = {.name = "test", .nodes = 2, .per_node = 2, .flops = 1e12, .efficiency = 0.5, .memory = 1e12,
                 .alpha_intra = 1e-6, .beta_intra = 1e11, .alpha_inter = 1e-5, .beta_inter = 1e10};
    Big m = {1, 1, 1, 1000, 3, 1000}; // P = 1 + 1000 + 2e6 + 1000, flops = 6 x 1000 x (P - 1)
    double P = 1 + 1000 + 2e6 + 1000;
    Layout l = cost(&c, &m, 1, 1, 4, 0, 1);
    near("projection: DP 4 compute", l.compute, 6.0 * 1000 * (P - 1) / 4 / 5e11);
    near("projection: DP 4 all-reduce across nodes", l.comm, 6 * (1e-5 + 2 * P / 4 / 1e10));
    l = cost(&c, &m, 2, 1, 2, 0, 1); // TP inside a node: 2 pairs x 2 all-reduces of 2 x 500 rows x 1000 x 2 B
    near("projection: TP 2 x DP 2, communication",
         l.comm, 2 * 2 * t_allreduce(2 * 500.0 * 1000, 2, 1e-6, 1e11) + t_allreduce(2 * P / 2, 2, 1e-5, 1e10));
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures > 0;
}

// A bad argument: the message, and exit 2 (as the programs' bad flags).
__attribute__((format(printf, 1, 2), noreturn)) static void usage_error(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}
// An argument as a number in [lo, hi] (above lo when lo_open), or exit 2 naming it.
static double arg_number(const char* what, const char* s, double lo, int lo_open, double hi, int integer) {
    char err[256];
    double v;
    if (cm_number(what, s, lo, lo_open, hi, integer, &v, err, sizeof err)) usage_error("%s", err);
    return v;
}

int main(int argc, char** argv) {
    if (argc >= 2 && !strcmp(argv[1], "selftest")) return selftest();
    if (argc == 2 && !strcmp(argv[1], "compute")) {
        Table t = measure_table();
        for (int i = 0; i < t.n; i++) printf("rows=%d ms=%.4f\n", t.rows[i], 1e3 * t.sec[i]);
        return 0;
    }
    if ((argc == 5 || argc == 6 || argc == 9) && !strcmp(argv[1], "predict")) {
        Summary m;
        summary_read(&m, argv[2]);
        Run r = run_of(&m);
        double alpha = arg_number("ALPHA (seconds)", argv[3], 0, 0, 10, 0), beta = arg_number("BETA (bytes/s)", argv[4], 0, 1, 1e15, 0);
        Links k = {alpha, beta, alpha, beta, 1};
        if (argc == 9) {
            k.local_alpha = arg_number("LOCAL_ALPHA (seconds)", argv[6], 0, 0, 10, 0);
            k.local_beta = arg_number("LOCAL_BETA (bytes/s)", argv[7], 0, 1, 1e15, 0);
            k.hosts = (int)arg_number("HOSTS", argv[8], 1, 0, 1024, 1);
        }
        double compute;
        int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
        Table t = {0};
        if (argc >= 6) { // a table measured earlier: "rows=R ms=X" lines
            FILE* f = fopen(argv[5], "r");
            if (!f) fatal("cannot open '%s'", argv[5]);
            double ms;
            while (t.n < 32 && fscanf(f, " rows=%d ms=%lf", &t.rows[t.n], &ms) == 2) t.sec[t.n++] = ms / 1e3;
            fclose(f);
            if (t.n == 0) fatal("'%s' holds no rows=R ms=X lines", argv[5]);
        } else {
            t = measure_table();
        }
        double s = predict(&r, table_rows, &t, cores, k, &compute);
        printf("predicted_ms=%.4f compute_ms=%.4f comm_ms=%.4f\n", 1e3 * s, 1e3 * compute, 1e3 * (s - compute));
        return 0;
    }
    if (argc >= 3 && !strcmp(argv[1], "project")) {
        Cluster c = cluster_read(argv[2]);
        Big m = {27, 16, 16, 64, 1, 32};
        int top = 12, mark_tp = 0, mark_pp = 0;
        static const char* const flags[] = {"--hidden", "--layers", "--emb", "--context", "--vocab", "--batch", "--top", "--tp", "--pp"};
        int seen[9] = {0};
        for (int i = 3; i < argc; i += 2) {
            int f = 0;
            while (f < 9 && strcmp(argv[i], flags[f])) f++;
            if (f == 9) usage_error("unknown flag '%s' (flags: --hidden --layers --emb --context --vocab --batch --top --tp --pp)", argv[i]);
            if (seen[f]++) usage_error("%s is given twice", argv[i]);
            if (i + 1 >= argc) usage_error("%s needs a value", argv[i]);
            double v = arg_number(argv[i], argv[i + 1], 1, 0, f == 5 ? 1e12 : 1e9, 1);
            if (f == 0) m.H = v;
            else if (f == 1) m.L = v;
            else if (f == 2) m.E = v;
            else if (f == 3) m.T = v;
            else if (f == 4) m.V = v;
            else if (f == 5) m.B = v;
            else if (f == 6) top = (int)fmin(v, 4096);
            else if (f == 7) mark_tp = (int)fmin(v, 1 << 30);
            else mark_pp = (int)fmin(v, 1 << 30);
        }
        int n = c.nodes * c.per_node;
        if (mark_tp || mark_pp) { // only the layouts project() considers
            if (!mark_tp || !mark_pp) usage_error("give both --tp and --pp to mark a layout");
            if (mark_tp & (mark_tp - 1) || mark_tp > 64 || mark_pp & (mark_pp - 1) || mark_pp > 128)
                usage_error("--tp %d --pp %d is not a layout the projection considers: TP is a power of 2 up to 64, "
                            "PP a power of 2 up to 128", mark_tp, mark_pp);
            if (n % (mark_tp * mark_pp) || mark_pp > m.L || m.B / (n / (mark_tp * mark_pp)) / (mark_pp > 1 ? 4 * mark_pp : 1) < 1)
                usage_error("--tp %d --pp %d does not fit %d devices, %g layers and a batch of %g rows: TP x PP must divide "
                            "the devices, PP at most the layers, and each of 4 x PP microbatches hold a row", mark_tp,
                            mark_pp, n, m.L, m.B);
        }
        project(&c, &m, top, mark_tp, mark_pp);
        return 0;
    }
    fprintf(stderr, "usage: tools/costmodel compute | predict RUN.sum ALPHA BETA [COMPUTE_TABLE [LOCAL_ALPHA LOCAL_BETA HOSTS]] | project CLUSTER "
                    "[--hidden H --layers L --emb E --context T --vocab V --batch B --top N --tp T --pp P] | selftest\n");
    return 2;
}
