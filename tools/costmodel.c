/*
 * tools/costmodel.c: how long one training step takes, predicted from things a reader can
 * check. Two uses:
 *
 * Our programs on emulated hosts (make cluster): from how fast this machine computes (a
 * short benchmark of the project's own kernels), how fast its links are (alpha, the latency
 * of a message, and beta, the bytes per second; tools/pingpong measures both), what each
 * program sends per step (its formulas, in every --summary) and how long its pipeline
 * idles (schedules.h).
 *
 *   tools/costmodel compute [train.c's flags]      # ms per step of train.c's model, by rows
 *   tools/costmodel replay RUN.sum ALPHA BETA [COMPUTE_TABLE [LOCAL_ALPHA LOCAL_BETA HOSTS]]
 *
 * Real transformers on real clusters (cluster/NAME.txt), by tools/costmodel_llm.h's closed
 * forms, checked against published training runs:
 *
 *   tools/costmodel predict CLUSTER SHAPE LAYOUT   # one layout: step time, MFU, memory, each term
 *   tools/costmodel rank CLUSTER SHAPE [LAYOUT]    # every layout that fits, best first
 *   tools/costmodel published                      # seven published runs: rank, predicted vs published
 *   tools/costmodel selftest                       # every formula, on cases computed by hand
 *
 * replay's model, for one step (every term per rank; ranks work in parallel):
 *
 *   time = compute x oversubscription  +  messages x alpha  +  bytes / beta
 *   compute = sum over the M microbatches of (fixed + (fb(R_m) - fixed) / (T C)) / S / (1 - bubble)
 *             + once / (T S), and under ZeRO / (D C) as well
 *
 *   T, C, S, D       the tensor, context, pipeline (stages) and data degrees
 *   fb(R)            train.c's forward and backward at R rows, measured (`compute`: its step
 *                    at 1 to 64 rows, less what runs once), linear between the rows timed and
 *                    along the last segment past them; R_m, microbatch m's rows on the busiest
 *                    data rank (the programs' split of the batch B: M parts, each over D)
 *   fixed            the part of fb that does not grow with rows (the least-squares line
 *                    through the rows 1 to 8, at 0 rows): calls and loops, which every tensor
 *                    and context rank runs whole; the S stages split it
 *   once             what runs once a step, measured apart: the gradients zeroed and the
 *                    optimizer's step, on a rank's slice of the parameters (ZeRO: the D x C
 *                    ranks of a data group each update a slice of it)
 *   bubble           the schedule's closed form: (S-1)/(M+S-1) for GPipe and 1F1B, ...
 *   oversubscription ranks / cores, when processes take turns on the cores (emulated hosts
 *                    share this machine's cores)
 *   messages, bytes  what the busiest rank sends per step: the program's formula for bytes
 *                    and its count of messages; in a grid over hosts, each host's link carries
 *                    what its ranks send across on every axis (their groups all at once), and
 *                    the host that sends the most sets the pace
 *
 * Communication is charged in full, never hidden behind compute: the programs' collectives
 * block (train_dp --overlap aside), so that is what they do.
 */
#include "../ckpt.h"
#include "../report.h"
#include "../schedules.h"
#include "costmodel_cluster.h"
#include "costmodel_llm.h"
#include "summary.h"

#include <ctype.h>
#include <stdarg.h>

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

// ----------------------------------------------------------------------------
// compute: seconds of one training step of train.c's model on R rows, by the project's kernels

static Dataset names;
// (*once: of that, the gradients zeroed and the optimizer's step, which run once a step
// where forward and backward run once a microbatch)
static double step_seconds(const Options* o, const Config* c, int R, double* once) {
    State s = state_alloc(n_params(c), o->opt.adamw);
    Holding all = holding_units(c, &s, 0, n_units(c), 0);
    holding_load(&all, o, &names, c);
    Work w;
    work_init(&w, c, R, NULL);
    // the mean of 41 steps or more, over half a second at least, as a run's step time is a
    // mean (seconds / steps): on a machine shared with other jobs the steps that wait for a
    // core count too, and a measurement shorter than a few of a scheduler's slices misses them
    double total = 0, start = 0, opt = 0;
    int reps = 0;
    for (int rep = -5; rep < 41 || (now_seconds() - start < 0.5 && rep < 1000000); rep++) {
        if (rep == 0) start = now_seconds();
        double t0 = now_seconds();
        Rows rows = training_rows(&names, o->seed, rep + 10, 0);
        double t1 = now_seconds();
        fix_zero(s.grads, s.n);
        double t2 = now_seconds();
        model_forward_rows(c, s.params, &w, &rows, 0, R, R, NULL);
        model_backward(c, s.params, s.grads, &w, R, R);
        double t3 = now_seconds();
        optimizer_step(&o->opt, s.params, s.grads, s.m, s.v, s.n, grad_factor(R), 1.0f, rep + 10);
        if (rep >= 0) total += now_seconds() - t0, opt += (t2 - t1) + (now_seconds() - t3), reps++;
    }
    work_free(&w);
    state_free(&s);
    *once = opt / reps;
    return total / reps;
}

// ----------------------------------------------------------------------------
// replay: one run of make cluster, from its --summary

// What the model needs of a run: its program and layout, and what the rank that sends the
// most sends per step (the formula's bytes, of them on each axis of the grid, and its
// messages), and what every rank sends on each axis (a host's link carries what its own
// ranks send: a pipeline's stages can send ten times one another's bytes). Axes in the
// grid's order of ranks (train_3d.c), fastest first: tensor, context, pipeline, data; the
// expert axis is carved out of the data axis (--ep).
enum { AXIS_TP, AXIS_CP, AXIS_PP, AXIS_DP, AXIS_EP, AXES };
typedef struct {
    char program[64], layout[320];
    int ranks, batch;
    double sent, messages;
    double axis[AXES];
    double rank_axis[MAX_RANKS][AXES];
} Run;

static Run run_of(const Summary* m) {
    Run r = {.ranks = m->ranks, .batch = (int)m->batch};
    snprintf(r.program, sizeof r.program, "%s", m->program);
    snprintf(r.layout, sizeof r.layout, "%s", m->layout);
    for (int q = 0; q < m->ranks; q++) {
        // summary.h's axes: tensor, data, pipeline, context, experts
        static const int from[AXES] = {[AXIS_TP] = 0, [AXIS_DP] = 1, [AXIS_PP] = 2, [AXIS_CP] = 3, [AXIS_EP] = 4};
        for (int a = 0; a < AXES; a++) r.rank_axis[q][a] = m->axis[q][from[a]];
        if (m->sent_formula[q] > r.sent) {
            r.sent = m->sent_formula[q];
            for (int a = 0; a < AXES; a++) r.axis[a] = r.rank_axis[q][a];
        }
        r.messages = m->messages[q] > r.messages ? m->messages[q] : r.messages;
    }
    return r;
}

// The number before `word` in a layout's words ("2 tensor", "4 microbatches"), or 0.
static int layout_count(const char* layout, const char* word) {
    const char* p = strstr(layout, word);
    if (!p) return 0;
    const char* q = p;
    while (q > layout && isdigit((unsigned char)q[-1])) q--;
    return q < p ? atoi(q) : 0;
}

// The pipeline of a layout, from its words ("2 stages x 1 chunks, 4 microbatches, 1f1b"; 3D:
// "2 pipeline ... 4 microbatches, gpipe"): stages, microbatches and the closed-form bubble.
static double layout_bubble(const char* layout, int* S, int* M) {
    *S = layout_count(layout, " stages");
    if (!*S) *S = layout_count(layout, " pipeline");
    *M = layout_count(layout, " microbatch");
    int V = layout_count(layout, " chunks"), sched = SCHEDULE_1F1B;
    *S = *S > 0 ? *S : 1, *M = *M > 0 ? *M : 1, V = V > 0 ? V : 1;
    for (int k = 0; k < N_SCHEDULES; k++)
        if (strstr(layout, schedule_names[k])) sched = k;
    if (*S <= 1) return 0;
    double b = schedule_bubble_formula(sched, *S, V, *M, (Durations){.f = 1, .i = 1, .w = 1});
    return b < 0 ? (*S - 1.0) / (*M + *S - 1.0) : b;
}

// The degrees of a run's axes: a one-strategy program's ranks all on its axis; a grid's from
// its words ("grid of 2 tensor x 2 pipeline x 2 data = 8 ranks"; a 4D grid: "2 tensor x 2
// context x ...").
static void run_degrees(const Run* r, int S, int deg[AXES]) {
    const char* p = r->program;
    int N = r->ranks;
    for (int a = 0; a < AXES; a++) deg[a] = 1;
    if (!strcmp(p, "train.c")) return;
    if (!strcmp(p, "train_dp.c") || !strcmp(p, "train_fsdp.c")) deg[AXIS_DP] = N;
    else if (!strcmp(p, "train_tp.c")) deg[AXIS_TP] = N;
    else if (!strcmp(p, "train_cp.c")) deg[AXIS_CP] = N;
    else if (!strcmp(p, "train_pp.c")) deg[AXIS_PP] = S;
    else if (!strcmp(p, "train_3d.c")) {
        // the expert axis: "expert parallel over E of the data-parallel ranks"
        static const char* const words[AXES] = {" tensor", " context", " pipeline", " data", " of the data-parallel"};
        for (int a = 0; a < AXES; a++) deg[a] = layout_count(r->layout, words[a]) > 0 ? layout_count(r->layout, words[a]) : 1;
        if (deg[0] * deg[1] * deg[2] * deg[3] != N || deg[AXIS_DP] % deg[AXIS_EP])
            fatal("cannot read the grid of '%s' (%d ranks)", r->layout, N);
    } else {
        fatal("no cost model for program '%s'", p);
    }
}

// The links a run's messages take: across hosts (alpha, beta) or, for an axis of a grid
// whose groups fit inside a host, shared memory (local_alpha, local_beta).
typedef struct {
    double alpha, beta, local_alpha, local_beta;
    int hosts;
} Links;

// The bytes `host` sends across on axis a of a grid in a step (0: every group of the axis with
// a rank on the host lies inside it, on shared memory), and in *groups how many of its groups
// cross. Ranks fill the hosts in
// order, per_host a host, and train_3d numbers them tensor fastest, then context, pipeline,
// data (rank = tp + T (cp + C (pp + P dp))). A group is the ranks that share every coordinate
// but its axis's: the data axis's is the D x C ranks that share a rank's tensor and pipeline
// coordinates (ZeRO's gradients sum over other rows and other positions alike), so with D = 1
// and C = 2 it is the context pair, inside a host; the expert axis's is E consecutive data
// coordinates (dp / E the same). Every group of an axis runs its collectives at once, each
// crossing group a ring with one stream leaving the host, of what one member sends (the most
// of its members on the host): the host's link carries the sum of its crossing groups'
// streams, and the last of them ends when the link has sent them all.
static double crossing_bytes(const Run* r, const int deg[AXES], int a, int per_host, int host, int* groups) {
    int T = deg[AXIS_TP], C = deg[AXIS_CP], P = deg[AXIS_PP], E = deg[AXIS_EP], N = T * C * P * deg[AXIS_DP];
    int keys[MAX_RANKS], n = 0;
    double stream[MAX_RANKS], sum = 0;
    {
        for (int q = host * per_host; q < N && q < (host + 1) * per_host; q++) {
            int tp = q % T, cp = q / T % C, pp = q / (T * C) % P, dp = q / (T * C * P), crosses = 0;
            for (int m = 0; m < N && !crosses; m++) { // m in q's group: every coordinate but the group's own the same
                int mt = m % T, mc = m / T % C, mp = m / (T * C) % P, md = m / (T * C * P);
                int same = (a == AXIS_TP || mt == tp) && (a == AXIS_CP || a == AXIS_DP || mc == cp) &&
                           (a == AXIS_PP || mp == pp) && (a == AXIS_DP || (a == AXIS_EP ? md / E == dp / E : md == dp));
                crosses = same && m / per_host != host;
            }
            if (!crosses) continue;
            // the group's key: the coordinates its members share
            int key = a == AXIS_TP ? q / T : a == AXIS_CP ? tp + T * (pp + P * dp) : a == AXIS_PP ? tp + T * (cp + C * dp)
                    : a == AXIS_DP ? tp + T * pp : tp + T * (cp + C * (pp + P * (dp / E)));
            int i = 0;
            while (i < n && keys[i] != key) i++;
            if (i == n) keys[n] = key, stream[n++] = 0;
            stream[i] = fmax(stream[i], r->rank_axis[q][a]);
        }
    }
    for (int i = 0; i < n; i++) sum += stream[i];
    *groups = n;
    return sum;
}

// A compute table: train.c's step by rows, measured (rows, seconds, from 1 row), and of each
// step what runs once whatever the microbatches (the gradients zeroed, the optimizer's step).
typedef struct {
    int n;
    int rows[32];
    double sec[32], once;
    char model[256]; // the model it timed (report.h's model_words)
} Table;
// Forward and backward at `rows` (the step less what runs once): linear between the table's
// points, and past its last one along its last segment (one point: in proportion).
static double table_fb(const Table* t, double rows) {
    if (t->n == 1) return (t->sec[0] - t->once) * rows / t->rows[0];
    int i = 1;
    while (i < t->n - 1 && rows > t->rows[i]) i++;
    double x0 = t->rows[i - 1], x1 = t->rows[i], y0 = t->sec[i - 1] - t->once, y1 = t->sec[i] - t->once;
    return y0 + (y1 - y0) * (rows - x0) / (x1 - x0);
}
// Of forward and backward, the part that does not grow with rows: the least-squares line
// through the table's points up to 8 rows, at 0 rows (calls and loops; one pair of points
// alone swings with a measurement's noise), at least 0 and at most the step at 1 row.
static double table_fixed(const Table* t) {
    double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < t->n && t->rows[i] <= 8; i++) {
        double x = t->rows[i], y = t->sec[i] - t->once;
        n++, sx += x, sy += y, sxx += x * x, sxy += x * y;
    }
    if (n < 2) return 0;
    double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
    return fmin(fmax((sy - slope * sx) / n, 0), t->sec[0] - t->once);
}

// Seconds of one step of run r on compute table t (train.c's step by rows, of the run's own
// model). Each of the M microbatches runs forward and backward at its own rows (the
// programs' split, microbatch_rows: at small row counts a step is mostly what does not grow
// with rows, calls and loops, which every microbatch pays); of that, the part that does not
// grow with rows (table_fixed) is not split by tensor or context parallelism, whose ranks
// each run every layer's calls, on narrower matrices or fewer positions, while the S stages
// split it, each running its own layers. What runs once a step (the gradients zeroed, the
// optimizer), on a rank's slice of the parameters: 1 / (T S), and under ZeRO 1 / (D C) of
// that. In a grid, each axis's bytes go over the link its groups live on; a host's link
// carries what the host sends across on every axis (crossing_bytes), the host that sends the
// most setting the pace.
static double predict_run(const Run* r, const Table* t, int cores, Links k, double* compute_out) {
    int N = r->ranks, S, M, deg[AXES];
    double bubble = layout_bubble(r->layout, &S, &M);
    run_degrees(r, S, deg);
    int D = deg[AXIS_DP], T = deg[AXIS_TP], C = deg[AXIS_CP];
    S = deg[AXIS_PP];
    if (T * C * S * D != N) fatal("'%s': %d tensor x %d context x %d stages x %d data is not its %d ranks", r->layout, T, C, S, D, N);
    double fixed = table_fixed(t), fb = 0;
    for (int m = 0; m < M; m++) { // the busiest data rank's rows of each microbatch
        long first;
        int rows = microbatch_rows(r->batch, M, m, D, 0, &first);
        if (rows < 1) fatal("'%s': %d microbatches of a batch of %d over %d data ranks leave one empty", r->layout, M, r->batch, D);
        fb += fixed + (table_fb(t, rows) - fixed) / (T * C);
    }
    int sharded = !strcmp(r->program, "train_fsdp.c") || strstr(r->layout, "ZeRO") != NULL; // once-a-step work over D x C
    double compute = fb / S / (1 - bubble) + t->once / (T * S) / (sharded ? D * C : 1);
    if (N > cores) compute *= (double)N / cores;
    if (!(compute > 0 && isfinite(compute)))
        fatal("the compute table gives %g ms for this run's rows (a table of steps that do not grow with rows?)", 1e3 * compute);
    *compute_out = compute;
    int grid = T < N && C < N && D < N && S < N; // more than one axis
    if (grid && r->sent > 0 && k.hosts > 1) {
        int per_host = (N + k.hosts - 1) / k.hosts, crosses[AXES] = {0};
        double link = 0, comm = 0;
        for (int host = 0; host * per_host < N; host++) {
            double sent = 0;
            for (int a = 0; a < AXES; a++) {
                int groups;
                sent += crossing_bytes(r, deg, a, per_host, host, &groups);
                crosses[a] |= groups > 0;
            }
            link = fmax(link, sent);
        }
        for (int a = 0; a < AXES; a++) // messages shared out in proportion to the bytes
            comm += r->axis[a] / r->sent * r->messages * (crosses[a] ? k.alpha : k.local_alpha) + (crosses[a] ? 0 : r->axis[a] / k.local_beta);
        return compute + comm + link / k.beta;
    }
    if (k.hosts == 1) return compute + r->messages * k.local_alpha + r->sent / k.local_beta; // all on shared memory
    return compute + r->messages * k.alpha + r->sent / k.beta;
}

// train.c's step by rows 1, 2, 4, ..., 64, for the model of train.c's flags (argv[0]: "compute")
static Table measure_table(int argc, char** argv) {
    // compute only times steps: a flag that names an output or a checkpoint would be ignored
    static const char* unused[] = {"--save", "--log", "--summary", "--trace", "--load", "--save-every", "--keep",
                                   "--log-overwrite", "--allow-changes"};
    for (int i = 1; i < argc; i++)
        for (size_t k = 0; k < sizeof unused / sizeof *unused; k++) {
            size_t n = strlen(unused[k]);
            if (!strncmp(argv[i], unused[k], n) && (argv[i][n] == 0 || argv[i][n] == '='))
                usage_error("compute times train.c's step for the model its flags give, and writes nothing but the "
                            "table to stdout: %s does not apply", unused[k]);
        }
    Options o;
    cli_parse_or_exit(&o, argc, argv, "tools/costmodel compute", NULL, 0, NULL, NULL);
    Config c;
    load_data(&names, &o, &c);
    Table t = {0};
    model_words(&c, t.model, sizeof t.model);
    double once[7];
    for (int rows = 1; rows <= 64; rows *= 2) t.rows[t.n] = rows, t.sec[t.n] = step_seconds(&o, &c, rows, &once[t.n]), t.n++;
    t.once = median(once, t.n); // the same work at every row count: the median of the seven
    return t;
}
// A table measured earlier: its "model=..." line, its "once_ms=X" line (the part of each
// step that runs once a step), then "rows=R ms=X" lines, rows rising from 1
static Table read_table(const char* path) {
    Table t = {.once = -1};
    FILE* f = open_tool_file(path, "compute table", 1L << 20);
    char line[256];
    int number = 0;
    while (fgets(line, sizeof line, f)) {
        number++;
        char rows[64], ms[64], err[256];
        double r, x;
        if (line[strspn(line, " \t\r\n")] == 0) continue;
        if (!strncmp(line, "model=", 6) && t.n == 0 && !t.model[0]) {
            line[strcspn(line, "\r\n")] = 0;
            snprintf(t.model, sizeof t.model, "%.255s", line + 6);
            continue;
        }
        if (sscanf(line, " once_ms=%63s", ms) == 1 && t.n == 0 && t.once < 0) {
            if (cm_number("once_ms", ms, 0, 0, 1e9, 0, &x, err, sizeof err)) fatal("%s:%d: %s", path, number, err);
            t.once = x / 1e3;
            continue;
        }
        if (sscanf(line, " rows=%63[^ ] ms=%63s", rows, ms) != 2 || t.n == 32)
            fatal("%s:%d: expected 'rows=R ms=X' (at most 32 lines), got '%.60s'", path, number, line);
        if (cm_number("rows", rows, 1, 0, 1 << 20, 1, &r, err, sizeof err) || cm_number("ms", ms, 0, 1, 1e9, 0, &x, err, sizeof err))
            fatal("%s:%d: %s", path, number, err);
        if (t.n > 0 && r <= t.rows[t.n - 1]) fatal("%s:%d: rows must rise from line to line", path, number);
        t.rows[t.n] = (int)r, t.sec[t.n++] = x / 1e3;
    }
    fclose(f);
    if (t.n == 0) fatal("'%s' holds no rows=R ms=X lines", path);
    if (!t.model[0]) fatal("'%s' does not say which model it timed (no model= line): measure it again with tools/costmodel compute", path);
    if (t.once < 0)
        fatal("'%s' does not give the part of a step that runs once (no once_ms= line): measure it again with tools/costmodel compute", path);
    if (t.rows[0] != 1) fatal("'%s' starts at rows=%d: a table starts at rows=1 (tools/costmodel compute's)", path, t.rows[0]);
    for (int i = 0; i < t.n; i++)
        if (t.once >= t.sec[i])
            fatal("'%s': once_ms=%g is not less than the whole step at rows=%d (%g ms)", path, 1e3 * t.once, t.rows[i], 1e3 * t.sec[i]);
    return t;
}

// ----------------------------------------------------------------------------
// rank: every layout of a transformer on a cluster

// zbv's bubble and peak activations (in microbatches through a stage) for S stages and M
// microbatches: schedules.h has no closed form, so its checker plays the schedule (once per
// S, M and durations). Its build takes time quadratic in M: zbv is considered up to M 512,
// where its bubble is already under 1% (16 stages).
enum { ZBV_MAX_M = 512, ZBV_MAX_S = 64 };
static void zbv_figures(int S, int M, int recompute, double* bubble, double* peak) {
    typedef struct {
        int S, M, full;
        double bubble, peak;
    } Played;
    static Played cache[4096];
    static int n;
    int full = recompute == RECOMPUTE_FULL;
    for (int i = 0; i < n; i++)
        if (cache[i].S == S && cache[i].M == M && cache[i].full == full) {
            *bubble = cache[i].bubble, *peak = cache[i].peak;
            return;
        }
    Action* lists[ZBV_MAX_S];
    int counts[ZBV_MAX_S];
    for (int r = 0; r < S; r++) lists[r] = mallocCheck(sizeof(Action) * 3 * 2 * M);
    schedule_build(SCHEDULE_ZBV, S, 2, M, lists, counts);
    Check c = schedule_check(SCHEDULE_ZBV, S, 2, M, lists, counts, pipeline_durations(recompute), NULL, NULL, 0);
    if (!c.ok) fatal("internal: zbv with %d stages and %d microbatches: %s", S, M, c.why);
    *bubble = c.bubble_total, *peak = 0;
    for (int r = 0; r < S; r++) *peak = fmax(*peak, c.peak[r]), free(lists[r]);
    if (n < 4096) cache[n++] = (Played){S, M, full, *bubble, *peak};
}

static Cost cost_of(const Cluster* c, const Shape* m, const Practice* pr, const Layout* l, int devices) {
    double zb = 0, zp = 0;
    if (l->pp > 1 && l->sched == SCHEDULE_ZBV) zbv_figures(l->pp, l->M, l->recompute, &zb, &zp);
    return layout_cost(c, m, pr, l, devices, zb, zp);
}

// Whether a layout is one the model considers (and rank enumerates), for these devices and
// this model: NULL, or why not. Any degrees that divide what they split: TP the heads (and
// the K and V heads, or a multiple of them), CP the sequence in 2 CP chunks, PP up to the
// layers (split as evenly as the work allows), DP the rest of the devices, EP the experts and DP.
enum { MAX_TP = 128, MAX_CP = 128 };
static const char* s_(long k) { return k == 1 ? "" : "s"; }
static const char* es_(long k) { return k == 1 ? "" : "es"; }
static const char* layout_rule(const Shape* m, const Layout* l, int devices, char* err, size_t n) {
    double seqs = m->tokens / m->seq;
    int stage_layers = l->pp > 0 ? (m->layers + l->pp - 1) / l->pp : 0; // the largest stage's
    int kv = m->kv_lora > 0 ? m->heads : m->kv_heads;
    if (l->tp < 1 || l->tp > MAX_TP || m->heads % l->tp || (kv >= l->tp ? kv % l->tp : l->tp % kv))
        snprintf(err, n, "TP %d: the model takes TP up to %d dividing the %d heads and the %d K and V heads (or a multiple of them)",
                 l->tp, MAX_TP, m->heads, kv);
    else if (l->cp < 1 || l->cp > MAX_CP || m->seq % (2 * l->cp))
        snprintf(err, n, "CP %d: the model takes CP up to %d whose double divides the sequence (%d): each "
                 "device takes two chunks, one early and one late, to share the causal mask's work", l->cp, MAX_CP, m->seq);
    else if (l->pp < 1 || l->pp > MAX_STAGES || l->pp > m->layers)
        snprintf(err, n, "PP %d: the model takes PP up to %d and at most the %d layers", l->pp, MAX_STAGES, m->layers);
    else if ((long)l->tp * l->cp * l->pp * l->dp != devices)
        snprintf(err, n, "TP %d x CP %d x PP %d does not divide the %d devices", l->tp, l->cp, l->pp, devices);
    else if (fmod(seqs, (double)l->dp * l->M) != 0)
        snprintf(err, n, "DP %d x %d microbatch%s does not divide the %.0f sequences of a step", l->dp, l->M, es_(l->M), seqs);
    else if (m->experts == 0 && l->ep != 1)
        snprintf(err, n, "EP %d: a dense model has no experts to spread", l->ep);
    else if (m->experts > 0 && (l->ep < 1 || l->dp % l->ep || m->experts % l->ep))
        snprintf(err, n, "EP %d: the model takes EP dividing DP (%d) and the experts (%d)", l->ep, l->dp, m->experts);
    else if (l->sp && l->tp == 1)
        snprintf(err, n, "sequence parallelism splits across TP: it needs TP above 1");
    // the schedules' own conditions, each refusal naming the one that failed
    else if (l->pp > 1 && l->sched == SCHEDULE_INTERLEAVED && l->V < 2)
        snprintf(err, n, "interleaved with V %d: it takes V of 2 or more chunks a stage", l->V);
    else if (l->pp > 1 && l->sched == SCHEDULE_INTERLEAVED && stage_layers < l->V)
        snprintf(err, n, "interleaved with V %d on PP %d: %d layer%s a stage (at most), fewer than V: each chunk takes a layer",
                 l->V, l->pp, stage_layers, s_(stage_layers));
    else if (l->pp > 1 && l->sched == SCHEDULE_INTERLEAVED && l->M % l->pp)
        snprintf(err, n, "interleaved with %d microbatch%s on PP %d: it takes a multiple of PP microbatches", l->M, es_(l->M), l->pp);
    else if (l->pp > 1 && l->sched == SCHEDULE_ZB1 && l->M < l->pp)
        snprintf(err, n, "zb1 with %d microbatch%s on %d stages: its closed form holds for at least as many microbatches as stages",
                 l->M, es_(l->M), l->pp);
    else if (l->pp > 1 && l->sched == SCHEDULE_ZBV && l->pp > ZBV_MAX_S)
        snprintf(err, n, "zbv with PP %d: the model plays it up to %d stages", l->pp, ZBV_MAX_S);
    else if (l->pp > 1 && l->sched == SCHEDULE_ZBV && stage_layers < 2)
        snprintf(err, n, "zbv with PP %d: 1 layer a stage, and it takes 2 or more (a stage's two chunks)", l->pp);
    else if (l->pp > 1 && l->sched == SCHEDULE_ZBV && l->M > ZBV_MAX_M)
        snprintf(err, n, "zbv with %d microbatches: the model plays it up to %d", l->M, ZBV_MAX_M);
    else if (l->pp > 1 && l->sched == SCHEDULE_DUALPIPEV && l->M < 2 * l->pp)
        snprintf(err, n, "dualpipev with %d microbatch%s on PP %d: it takes at least 2 x PP (%d)", l->M, es_(l->M), l->pp, 2 * l->pp);
    else if (l->pp > 1 && l->sched == SCHEDULE_DUALPIPEV && stage_layers < 2)
        snprintf(err, n, "dualpipev with PP %d: 1 layer a stage, and it takes 2 or more (a stage's two chunks)", l->pp);
    else if (l->pp > 1 && l->sched == SCHEDULE_DUALPIPE && l->pp % 2)
        snprintf(err, n, "dualpipe with PP %d: it takes an even PP, ranks r and PP-1-r holding the same two stages", l->pp);
    else if (l->pp > 1 && l->sched == SCHEDULE_DUALPIPE && (l->M % 2 || l->M < 2 * l->pp))
        snprintf(err, n, "dualpipe with %d microbatch%s on PP %d: it takes an even number of microbatches, at least 2 x PP (%d; "
                 "DualPipe's own check), half fed in at each end", l->M, es_(l->M), l->pp, 2 * l->pp);
    else if (l->pp > 1 && l->sched == SCHEDULE_NAIVE)
        snprintf(err, n, "naive runs one microbatch at a time: the model does not consider it");
    else
        return NULL;
    return err;
}

typedef struct {
    Layout l;
    Cost k;
} Candidate;

// What the user fixed (-1: free) for every candidate.
typedef struct {
    int zero, sp, recompute, sched, V, M;
} Fixed;

// The pipeline layouts a fixed schedule does not admit (rank says which and why), by PP:
// how many, the first of them and its refusal; and the first that the other fixed flags
// (ZeRO, SP, recomputation, microbatches) refuse on any schedule, and why (flags_pp 0: none).
enum { MAX_LEFT_OUT = 64 };
typedef struct {
    int n, total, flags_pp;
    char flags_why[320];
    struct {
        int pp, count;
        Layout first;
        char why[320];
    } by_pp[MAX_LEFT_OUT];
} LeftOut;
// The V rank tries first for a schedule: interleaved's least, 2, unless --virtual fixes it.
static int first_virtual(int sched, const Fixed* fx) { return sched != SCHEDULE_INTERLEAVED ? 1 : fx->V > 0 ? fx->V : 2; }

static int same_degrees(const Layout* a, const Layout* b) {
    return a->tp == b->tp && a->cp == b->cp && a->pp == b->pp && a->dp == b->dp && a->ep == b->ep;
}

// The microbatches a layout takes unless told: one sequence each, the replica's sequences
// (or, past MAX_MICROBATCHES, the most that divide them evenly); 1 when DP does not divide
// the step's sequences (layout_rule then says so).
enum { MAX_MICROBATCHES = 1 << 24 };
static int default_microbatches(double seqs, int dp) {
    if (dp < 1 || fmod(seqs, dp) != 0) return 1;
    double each = seqs / dp;
    if (each <= MAX_MICROBATCHES) return (int)each;
    for (int M = MAX_MICROBATCHES; M > 1; M--)
        if (fmod(each, M) == 0) return M;
    return 1;
}

// Those that fit first, fastest first; then the others, smallest memory first.
static int by_time(const void* a, const void* b) {
    const Candidate *x = a, *y = b;
    if (x->k.fits != y->k.fits) return y->k.fits - x->k.fits;
    double p = x->k.fits ? x->k.step : x->k.memory, q = y->k.fits ? y->k.step : y->k.memory;
    return (p > q) - (p < q);
}

// A pipeline layout (its degrees and the fixed flags, on 1F1B) of which no setting was
// possible: if the fixed schedule is why, it is counted in `left`, with the schedule's own
// refusal; if the other fixed flags are, the first such refusal is kept apart.
static void note_left_out(LeftOut* left, const Shape* m, const Fixed* fx, const Layout* base, int devices) {
    char why[320];
    Layout l = *base;
    l.sched = fx->sched, l.V = first_virtual(fx->sched, fx);
    if (layout_rule(m, base, devices, why, sizeof why)) {
        if (!left->flags_pp) left->flags_pp = base->pp, snprintf(left->flags_why, sizeof left->flags_why, "%s", why);
        return;
    }
    if (!layout_rule(m, &l, devices, why, sizeof why)) return;
    left->total++;
    int i = 0;
    while (i < left->n && left->by_pp[i].pp != l.pp) i++;
    if (i == MAX_LEFT_OUT) return; // counted in the total only
    if (i == left->n) {
        left->n++;
        left->by_pp[i].pp = l.pp, left->by_pp[i].count = 0, left->by_pp[i].first = l;
        snprintf(left->by_pp[i].why, sizeof left->by_pp[i].why, "%s", why);
    }
    left->by_pp[i].count++;
}

// Every layout of the devices, each at its fastest ZeRO stage, SP, recomputation and
// schedule that fits (or, if none fits, its smallest memory). Returns the count; *out holds
// them, those that fit first, fastest first; `left` (unless NULL), the pipeline layouts a
// fixed schedule left out.
static int enumerate(const Cluster* c, const Shape* m, const Practice* pr, const Fixed* fx, int devices, Candidate** out,
                     LeftOut* left) {
    int cap = 1024, n = 0;
    Candidate* all = mallocCheck(sizeof(Candidate) * cap);
    double seqs = m->tokens / m->seq;
    for (int tp = 1; tp <= MAX_TP && tp <= m->heads; tp++)
        for (int cp = 1; cp <= MAX_CP && 2 * cp <= m->seq; cp++)
            for (int pp = 1; pp <= MAX_STAGES && pp <= m->layers; pp++) {
                if (devices % ((long)tp * cp * pp) || m->heads % tp || m->seq % (2 * cp)) continue;
                int dp = devices / (tp * cp * pp);
                for (int ep = 1; ep <= (m->experts > 0 ? dp : 1); ep++) {
                    if (m->experts > 0 && (dp % ep || m->experts % ep)) continue;
                    Candidate best = {.k.step = -1};
                    int M = fx->M > 0 ? fx->M : default_microbatches(seqs, dp);
                    for (int zero = 0; zero <= 3; zero++)
                        for (int sp = 0; sp <= 1; sp++)
                            for (int rec = 0; rec < N_RECOMPUTE; rec++)
                                for (int sched = 0; sched < N_COST_SCHEDULES; sched++)
                                    for (int vi = 0; vi < 4; vi++) { // V 1, 2, 4, 8; or 1 and --virtual's
                                        int V = fx->V > 0 && vi > 0 ? fx->V : 1 << vi;
                                        if (fx->V > 0 && vi > 1) continue;
                                        if ((fx->zero >= 0 && zero != fx->zero) || (fx->sp >= 0 && sp != fx->sp) ||
                                            (fx->recompute >= 0 && rec != fx->recompute))
                                            continue;
                                        if (pp == 1 && (sched != SCHEDULE_1F1B || V > 1)) continue; // no pipeline
                                        if (pp > 1 && fx->sched >= 0 && sched != fx->sched) continue;
                                        if ((sched == SCHEDULE_INTERLEAVED) != (V > 1) && pp > 1) continue;
                                        if (fx->V > 0 && pp > 1 && sched == SCHEDULE_INTERLEAVED && V != fx->V) continue;
                                        Layout l = {tp, cp, pp, dp, ep, zero, sp, rec, sched, V, M};
                                        char why[256];
                                        if (layout_rule(m, &l, devices, why, sizeof why)) continue;
                                        Cost k = cost_of(c, m, pr, &l, devices);
                                        int better = best.k.step < 0 || (k.fits && !best.k.fits) ||
                                                     (k.fits == best.k.fits && (k.fits ? k.step < best.k.step : k.memory < best.k.memory));
                                        if (better) best = (Candidate){l, k};
                                    }
                    if (best.k.step < 0) {
                        Layout degrees = {tp, cp, pp, dp, ep, fx->zero >= 0 ? fx->zero : 0, fx->sp > 0, fx->recompute >= 0 ? fx->recompute : 0, SCHEDULE_1F1B, 1, M};
                        if (left && pp > 1 && fx->sched >= 0) note_left_out(left, m, fx, &degrees, devices);
                        continue;
                    }
                    if (n == cap) all = reallocCheck(all, sizeof(Candidate) * (cap *= 2));
                    all[n++] = best;
                }
            }
    qsort(all, n, sizeof(Candidate), by_time);
    *out = all;
    return n;
}

// Where a layout loses time against its compute alone: the largest of the bubble, each
// axis's exposed traffic and recomputation's extra work.
static const char* largest_loss(const Shape* m, const Practice* pr, const Candidate* x) {
    const Cost* k = &x->k;
    double f8, plain = hardware_flops(m, RECOMPUTE_NONE, &f8, pr->fp8), f8r, again = hardware_flops(m, x->l.recompute, &f8r, pr->fp8);
    double losses[] = {(k->compute + k->tp + k->cp + k->ep) * k->bubble / (1 - k->bubble), k->tp, k->cp, k->ep, k->pp, k->dp,
                       (k->compute - k->membound) * (1 - plain / again), k->membound, k->optimizer};
    static const char* const names_[] = {"bubble", "TP", "CP", "EP", "PP sends", "DP", "recompute", "memory-bound", "optimizer"};
    int best = 0;
    for (int i = 1; i < 9; i++)
        if (losses[i] > losses[best]) best = i;
    return losses[best] > 0 ? names_[best] : "-";
}

static void layout_words(const Layout* l, char* s, size_t n) {
    if (l->pp > 1 && l->sched == SCHEDULE_INTERLEAVED) snprintf(s, n, "interleaved V %d", l->V);
    else snprintf(s, n, "%s", l->pp > 1 ? cost_schedule_name(l->sched) : "-");
}

static void print_model(const Cluster* c, const Shape* m, const Practice* pr, int devices) {
    printf("%s: %d of its %d devices, %.0f TFLOP/s BF16 each at %.1f%%", c->name, devices, c->nodes * c->per_node,
           c->flops / 1e12, 100 * c->efficiency);
    if (pr->fp8) printf(", FP8 %.0f at %.1f%%", c->fp8_flops / 1e12, 100 * c->fp8_efficiency);
    printf(", %.0f GB\n", c->memory / 1e9);
    printf("model: %.1f billion parameters (%.1f billion active), %.0f GFLOP per token (6 x active + attention), "
           "%d layers of %d, sequence %d, %.0f tokens a step\n", params_total(m) / 1e9, params_active(m) / 1e9,
           model_flops(m) / 1e9, m->layers, m->width, m->seq, m->tokens);
}

static void print_table_head(void) {
    printf("| rank | TP | CP | PP | DP | EP | ZeRO | SP | recompute | schedule | M | step (s) | MFU | memory (GB) | compute "
           "| of it memory-bound | bubble | TP (s) | CP (s) | EP (s) | PP (s) | DP (s) | optimizer (s) | largest loss |\n");
    printf("| ---: | --: | --: | --: | --: | --: | --: | --: | --- | --- | --: | --: | --: | --: | --: | --: | --: | --: | --: "
           "| --: | --: | --: | --: | --- |\n");
}
static void print_row(int rank, const Shape* m, const Practice* pr, const Candidate* x) {
    const Layout* l = &x->l;
    const Cost* k = &x->k;
    char sched[32];
    layout_words(l, sched, sizeof sched);
    printf("| %d | %d | %d | %d | %d | %d | %d | %s | %s | %s | %d | %.2f | %.1f%% | %.1f%s | %.2f | %.2f | %.3f | %.2f | %.2f | "
           "%.2f | %.2f | %.2f | %.2f | %s |\n", rank, l->tp, l->cp, l->pp, l->dp, l->ep, l->zero, l->sp ? "yes" : "no",
           cost_recompute_names[l->recompute], sched, l->M, k->step, 100 * k->mfu, k->memory / 1e9, k->fits ? "" : " (no fit)",
           k->compute, k->membound, k->bubble, k->tp, k->cp, k->ep, k->pp, k->dp, k->optimizer, k->fits ? largest_loss(m, pr, x) : "memory");
}

// The rank of the layout with the marked degrees among those that fit (0: it does not fit).
static int rank_of(const Candidate* all, int n, const Layout* mark) {
    for (int i = 0; i < n; i++)
        if (same_degrees(&all[i].l, mark)) return all[i].k.fits ? i + 1 : 0;
    return -1;
}
static int count_fits(const Candidate* all, int n) {
    int fit = 0;
    for (int i = 0; i < n; i++) fit += all[i].k.fits;
    return fit;
}

// ----------------------------------------------------------------------------
// the published runs: each layout, its rank, and the figure the model predicts for it

// The figure a paper publishes, in its own count: MFU (PaLM's count of the model's FLOPs),
// hardware FLOPs per second per device (recomputation counted: Megatron-LM's "TFLOP/s per
// GPU"), or GPU-hours per trillion tokens.
enum { COUNT_MFU, COUNT_TFLOPS, COUNT_GPU_HOURS };

typedef struct {
    const char* name;
    const char* cluster;
    int devices;
    Shape m;
    Practice pr;
    Layout l;    // the published degrees (and ZeRO stage, SP, recomputation, schedule, microbatches where published: else -1)
    int count;   // the figure compared, in the paper's count
    double published, tolerance; // its published value; the goal's relative tolerance
    const char* source;
    double recorded;   // what the model predicted when the record was last made (docs/cluster.md)
    int recorded_rank, recorded_rank_same; // its rank; its rank with every layout on the published schedule
} Published;

static const Shape llama3_405b = {.layers = 126, .width = 16384, .heads = 128, .kv_heads = 8, .ffn = 53248,
                                  .vocab = 128256, .seq = 8192, .swiglu = 1, .tokens = 2048.0 * 8192};
// GPT-3 175B's shape (Brown et al. 2020, Table 2.1: 96 layers of 12,288, 96 heads, sequence
// 2,048), which MegaScale and OPT-175B train
static const Shape gpt3_175b = {.layers = 96, .width = 12288, .heads = 96, .kv_heads = 96, .ffn = 4 * 12288,
                                .vocab = 50257, .seq = 2048, .swiglu = 0};
static Published published_runs(int i) {
    Shape deepseek = {.layers = 61, .width = 7168, .heads = 128, .kv_heads = 128, .head_dim = 128, .ffn = 18432,
                      .vocab = 129280, .seq = 4096, .swiglu = 1, .experts = 256, .top_k = 8, .expert_ffn = 2048,
                      .shared = 1, .dense = 3, .q_lora = 1536, .kv_lora = 512, .rope = 64, .mtp = 1, .tokens = 15360.0 * 4096};
    Shape long_context = llama3_405b;
    long_context.seq = 131072, long_context.tokens = 128.0 * 131072;
    // BLOOM (BigScience, 2022: its paper's section 3.4 and model card): 70 layers of 14,336, 112
    // heads, GELU MLP of 4 x 14,336, 250,880 rows of embedding, sequence 2,048, 2,048 sequences a step
    Shape bloom = {.layers = 70, .width = 14336, .heads = 112, .kv_heads = 112, .ffn = 4 * 14336, .vocab = 250880,
                   .seq = 2048, .swiglu = 0, .tokens = 2048.0 * 2048};
    Shape megascale = gpt3_175b, opt = gpt3_175b;
    megascale.tokens = 6144.0 * 2048;
    opt.vocab = 50272, opt.dropout = 1, opt.tokens = 992.0 * 2048; // OPT's 2M tokens: 8 sequences on each of 124 replicas
    const char* llama = "The Llama 3 Herd of Models (2024), Table 4";
    Published runs[] = {
        {"Llama 3 405B, 8,192 H100s", "cluster/h100-16k.txt", 8192, llama3_405b, {0},
         {8, 1, 16, 64, 1, -1, -1, -1, SCHEDULE_INTERLEAVED, -1, 32}, COUNT_MFU, 0.43, 0.20, llama, 0.4929, 13, 8},
        {"Llama 3 405B, 16,384 H100s", "cluster/h100-16k.txt", 16384, llama3_405b, {0},
         {8, 1, 16, 128, 1, -1, -1, -1, SCHEDULE_INTERLEAVED, -1, 16}, COUNT_MFU, 0.41, 0.20, llama, 0.4585, 12, 5},
        {"Llama 3 405B, 16,384 H100s, sequence 131,072", "cluster/h100-16k.txt", 16384, long_context, {0},
         {8, 16, 16, 8, 1, -1, -1, -1, SCHEDULE_INTERLEAVED, -1, 16}, COUNT_MFU, 0.38, 0.20, llama, 0.3742, 1, 1},
        // DeepSeek-V3 (its report): PP 16, EP 64 over 8 nodes, ZeRO-1, no TP (section 3.2), FP8
        // products (3.3), the all-to-alls run on 20 of the 132 SMs (3.2.2) beside compute, tokens
        // routed to at most 4 nodes, the norms and MLA's up-projections recomputed and FP8
        // products' inputs kept in FP8 (3.2.3, 3.3.3: recomputation "norms"), one MTP module (2.2);
        // DualPipe (3.2.1), whose F&B pairs are what hides the all-to-alls: no --ep-overlap beside
        // it; Adam's moments in BF16, master weights and gradients in FP32 (3.3.3)
        {"DeepSeek-V3, 2,048 H800s", "cluster/h800-2k.txt", 2048, deepseek,
         {.fp8 = 1, .route_nodes = 4, .comm_sms = 20, .bf16_moments = 1},
         {1, 1, 16, 128, 64, 1, -1, RECOMPUTE_NORMS, SCHEDULE_DUALPIPE, -1, 120}, COUNT_GPU_HOURS, 180e3, 0.20,
         "DeepSeek-V3 Technical Report (2024), sections 2.2 and 3.1-3.3", 1.658e5, 30, 7},
        // BLOOM's paper (section 3.4, "Engineering") and training chronicles: TP 4, PP 12, DP 8,
        // ZeRO-1, micro-batches of 2 sequences, activations checkpointed, Megatron-DeepSpeed's
        // 1F1B schedule and its fused (not flash) attention, BF16 with DeepSpeed's BF16
        // optimizer (its gradients summed in FP32 by a pass after each microbatch:
        // --grad-accum-pass); "about 150 TFLOPs" a GPU in Megatron's count (recomputation counted)
        {"BLOOM 176B, 384 A100s", "cluster/a100-jean-zay.txt", 384, bloom, {.unfused = 1, .grad_accum_pass = 1},
         {4, 1, 12, 8, 1, 1, 0, RECOMPUTE_FULL, SCHEDULE_1F1B, 1, 128}, COUNT_TFLOPS, 150e12, 0.20,
         "BLOOM (Le Scao et al. 2022), section 3.4; BigScience's model card", 1.733e14, 30, 1},
        // MegaScale (Jiang et al., NSDI 2024), section 6.1 and Table 2: GPT-3 175B on 12,288
        // Ampere GPUs, 6,144 sequences a step, TP 8 (with SP), PP 8 interleaved, DP 192;
        // TP's and DP's traffic overlapped with the products (section 3.2), FlashAttention-2
        // (section 3.3); 55.2% MFU
        {"MegaScale 175B, 12,288 A100s", "cluster/a100-megascale.txt", 12288, megascale, {.tp_overlap = 1, .dp_overlap = 1},
         {8, 1, 8, 192, 1, -1, 1, -1, SCHEDULE_INTERLEAVED, -1, 32}, COUNT_MFU, 0.552, 0.20,
         "MegaScale (Jiang et al., NSDI 2024), sections 3 and 6.1", 0.6339, 2, 1},
        // OPT's paper (Zhang et al. 2022, section 2.4): 992 A100s (80 GB), Fully Sharded Data
        // Parallel (ZeRO-3) with Megatron-LM's TP 8, no pipeline, "up to 147 TFLOP/s per GPU";
        // FSDP overlaps its gathers and reduce-scatters with compute (Zhao et al., "PyTorch
        // FSDP", 2023, section 3.3); fused (not flash) attention
        {"OPT-175B, 992 A100s", "cluster/a100-opt.txt", 992, opt, {.unfused = 1, .dp_overlap = 1},
         {8, 1, 1, 124, 1, 3, 0, -1, SCHEDULE_1F1B, 1, -1}, COUNT_TFLOPS, 147e12, 0.20,
         "OPT (Zhang et al. 2022), section 2.4", 1.375e14, 39, 7},
    };
    return runs[i];
}
enum { N_PUBLISHED = 7 };

// The published run's layout as the model best runs it (its published settings fixed, the
// rest free), and its rank among the best of every layout of the same run (0: no fit).
typedef struct {
    Candidate x;
    int rank, fit, rank_same, fit_same; // among every layout at its best; among them on the published schedule
    double got;                         // the figure compared
} Projection;
// The rank of candidate x among the layouts of `all` that fit (0: x does not fit).
static int rank_among(const Candidate* x, const Candidate* all, int n) {
    if (!x->k.fits) return 0;
    int rank = 1;
    for (int j = 0; j < n; j++) rank += all[j].k.fits && all[j].k.step < x->k.step && !same_degrees(&all[j].l, &x->l);
    return rank;
}
static Projection project_published(const Published* p) {
    Cluster c = cluster_read(p->cluster);
    Fixed free_ = {-1, -1, -1, -1, -1, -1}, mine = {p->l.zero, p->l.sp, p->l.recompute, p->l.sched, p->l.V, p->l.M};
    Candidate *all, *own;
    int n = enumerate(&c, &p->m, &p->pr, &free_, p->devices, &all, NULL);
    int n_own = enumerate(&c, &p->m, &p->pr, &mine, p->devices, &own, NULL);
    Projection r = {.fit = count_fits(all, n), .rank = -1};
    for (int j = 0; j < n_own && r.rank < 0; j++)
        if (same_degrees(&own[j].l, &p->l)) r.x = own[j], r.rank = 0;
    if (r.rank < 0) fatal("internal: the published layout of %s is not among the layouts", p->name);
    r.rank = rank_among(&r.x, all, n);
    // every layout run as the published one was: on its schedule, with the ZeRO stage, SP and
    // recomputation it published (the same software), its V, microbatches and the rest free
    Fixed same = {p->l.zero, p->l.sp, p->l.recompute, p->l.sched, -1, -1};
    Candidate* sched_all;
    int n_same = enumerate(&c, &p->m, &p->pr, &same, p->devices, &sched_all, NULL);
    r.fit_same = count_fits(sched_all, n_same), r.rank_same = rank_among(&r.x, sched_all, n_same);
    r.got = p->count == COUNT_MFU ? r.x.k.mfu : p->count == COUNT_TFLOPS ? r.x.k.hfu * c.flops : r.x.k.gpu_hours_per_t;
    free(all), free(own), free(sched_all);
    return r;
}

// published: a table of the runs; --check: exit 1 if a projection drifted from what was
// recorded (its rank, or its figure by more than 1%), so that a change of the model that
// moves them updates the record, and the notes that quote it, on purpose.
static int published(int check) {
    printf("| run | layout | rank of every layout | rank, every layout run as it was (goal: 10 or better) | predicted | published | off (goal) | as the model runs it |\n");
    printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |\n");
    int drifted = 0;
    for (int i = 0; i < N_PUBLISHED; i++) {
        Published p = published_runs(i);
        Projection r = project_published(&p);
        const Layout* l = &r.x.l;
        char sched[32], got[32], pub[32];
        layout_words(l, sched, sizeof sched);
        if (p.count == COUNT_MFU) snprintf(got, sizeof got, "MFU %.1f%%", 100 * r.got), snprintf(pub, sizeof pub, "MFU %.1f%%", 100 * p.published);
        else if (p.count == COUNT_TFLOPS)
            snprintf(got, sizeof got, "%.0f TFLOP/s a GPU", r.got / 1e12), snprintf(pub, sizeof pub, "%.0f TFLOP/s", p.published / 1e12);
        else snprintf(got, sizeof got, "%.0fK GPU-hours", r.got / 1e3), snprintf(pub, sizeof pub, "%.0fK", p.published / 1e3);
        double off = r.got / p.published - 1;
        printf("| %s | TP %d, CP %d, PP %d, DP %d, EP %d | %d of %d | %d of %d | %s | %s | %+.0f%% (%.0f%%) %s | ZeRO %d, SP %s, "
               "recompute %s, %s, M %d, %.1f GB |\n", p.name, l->tp, l->cp, l->pp, l->dp, l->ep, r.rank, r.fit, r.rank_same, r.fit_same,
               got, pub, 100 * off,
               100 * p.tolerance, fabs(off) <= p.tolerance ? "met" : "missed", l->zero, l->sp ? "yes" : "no",
               cost_recompute_names[l->recompute], sched, l->M, r.x.k.memory / 1e9);
        if (check && (r.rank != p.recorded_rank || r.rank_same != p.recorded_rank_same || fabs(r.got / p.recorded - 1) > 0.01)) {
            fprintf(stderr, "published: %s drifted: rank %d (recorded %d), rank on its schedule %d (recorded %d), %.4g (recorded %.4g)\n",
                    p.name, r.rank, p.recorded_rank, r.rank_same, p.recorded_rank_same, r.got, p.recorded);
            drifted = 1;
        }
    }
    printf("\n(MFU: the model's FLOPs, PaLM's count; TFLOP/s a GPU: hardware FLOPs, recomputation counted, as Megatron-LM "
           "prints them; sources:");
    for (int i = 0; i < N_PUBLISHED; i++)
        if (i == 0 || strcmp(published_runs(i).source, published_runs(i - 1).source)) printf(" %s;", published_runs(i).source);
    printf(" each layout as published, the rest at the model's best)\n");
    return drifted;
}

// ----------------------------------------------------------------------------
// the flags of predict and rank

typedef struct {
    const char* name;
    char kind; // 'n' a number from lo to hi (an integer when asked), 'w' a word, 's' a switch
    double lo, hi;
    int integer;
} Flag;
static const Flag llm_flags[] = {
    {"layers", 'n', 1, 100000, 1}, {"width", 'n', 1, 1 << 20, 1}, {"heads", 'n', 1, 65536, 1},
    {"kv-heads", 'n', 1, 65536, 1}, {"head-dim", 'n', 1, 65536, 1}, {"ffn", 'n', 1, 1 << 24, 1},
    {"vocab", 'n', 1, 1 << 24, 1}, {"seq", 'n', 2, 1 << 24, 1}, {"tokens", 'n', 1, 1e12, 1}, {"mlp", 'w', 0, 0, 0},
    {"experts", 'n', 0, 65536, 1}, {"top-k", 'n', 1, 65536, 1}, {"expert-ffn", 'n', 1, 1 << 24, 1},
    {"shared-experts", 'n', 0, 64, 1}, {"dense-layers", 'n', 0, 100000, 1}, {"q-lora", 'n', 1, 1 << 20, 1},
    {"kv-lora", 'n', 1, 1 << 20, 1}, {"rope-dim", 'n', 1, 65536, 1}, {"dropout", 's', 0, 0, 0}, {"mtp", 'n', 1, 16, 1}, {"fp8", 's', 0, 0, 0}, {"route-nodes", 'n', 1, 4096, 1}, {"comm-sms", 'n', 1, 100000, 1},
    {"bf16-moments", 's', 0, 0, 0}, {"grad-accum-pass", 's', 0, 0, 0},
    {"dp-overlap", 'n', 0, 1, 0}, {"ep-overlap", 'n', 0, 1, 0}, {"tp-overlap", 'n', 0, 1, 0}, {"cp-exchange", 'w', 0, 0, 0},
    {"attention", 'w', 0, 0, 0},
    {"devices", 'n', 1, CLUSTER_MAX_DEVICES, 1}, {"tp", 'n', 1, 1 << 20, 1}, {"cp", 'n', 1, 1 << 20, 1},
    {"pp", 'n', 1, 1 << 20, 1}, {"dp", 'n', 1, CLUSTER_MAX_DEVICES, 1}, {"ep", 'n', 1, 65536, 1}, {"zero", 'n', 0, 3, 1},
    {"schedule", 'w', 0, 0, 0}, {"virtual", 'n', 1, 64, 1}, {"microbatches", 'n', 1, MAX_MICROBATCHES, 1}, {"sp", 's', 0, 0, 0},
    {"recompute", 'w', 0, 0, 0}, {"top", 'n', 1, 100000, 1},
};
enum { N_LLM_FLAGS = sizeof llm_flags / sizeof llm_flags[0] };

typedef struct {
    Shape m;
    Practice pr;
    Layout l;
    Fixed fx;
    int devices, top, marked, given[N_LLM_FLAGS];
} Request;

static int flag_index(const char* name) {
    for (int f = 0; f < N_LLM_FLAGS; f++)
        if (!strcmp(name, llm_flags[f].name)) return f;
    return -1;
}
#define GIVEN(r, name) ((r)->given[flag_index(name)])

static Request parse_request(int argc, char** argv, const Cluster* c, int rank) {
    Request q = {.m = {.swiglu = 1}, .fx = {-1, -1, -1, -1, -1, -1}, .top = 12};
    double v[N_LLM_FLAGS] = {0};
    const char* word[N_LLM_FLAGS] = {0};
    for (int i = 0; i < argc; i++) {
        const char* a = argv[i];
        int f = strncmp(a, "--", 2) ? -1 : flag_index(a + 2);
        if (f < 0) usage_error("unknown flag '%s' (see tools/costmodel's usage)", a);
        if (q.given[f]++) usage_error("%s is given twice", a);
        if (llm_flags[f].kind == 's') continue;
        if (i + 1 >= argc) usage_error("%s needs a value", a);
        const char* value = argv[++i];
        if (llm_flags[f].kind == 'n') v[f] = arg_number(a, value, llm_flags[f].lo, 0, llm_flags[f].hi, llm_flags[f].integer);
        else word[f] = value;
    }
    Shape* m = &q.m;
    const char* need[] = {"layers", "width", "heads", "vocab", "seq", "tokens"};
    for (int i = 0; i < 6; i++)
        if (!GIVEN(&q, need[i])) usage_error("the model needs --%s (the shape: --layers --width --heads --vocab --seq --tokens)", need[i]);
#define VAL(name) v[flag_index(name)]
    m->layers = (int)VAL("layers"), m->width = (int)VAL("width"), m->heads = (int)VAL("heads"), m->vocab = (int)VAL("vocab");
    m->seq = (int)VAL("seq"), m->tokens = VAL("tokens");
    m->kv_heads = GIVEN(&q, "kv-heads") ? (int)VAL("kv-heads") : m->heads;
    m->head_dim = GIVEN(&q, "head-dim") ? (int)VAL("head-dim") : 0;
    m->ffn = GIVEN(&q, "ffn") ? (int)VAL("ffn") : 4 * m->width;
    if (word[flag_index("mlp")]) {
        const char* s = word[flag_index("mlp")];
        if (strcmp(s, "swiglu") && strcmp(s, "gelu")) usage_error("--mlp must be swiglu or gelu, got '%s'", s);
        m->swiglu = !strcmp(s, "swiglu");
    }
    m->experts = (int)VAL("experts");
    m->top_k = GIVEN(&q, "top-k") ? (int)VAL("top-k") : 1;
    m->expert_ffn = GIVEN(&q, "expert-ffn") ? (int)VAL("expert-ffn") : m->ffn;
    m->shared = (int)VAL("shared-experts"), m->dense = (int)VAL("dense-layers");
    m->q_lora = (int)VAL("q-lora"), m->kv_lora = (int)VAL("kv-lora");
    m->rope = GIVEN(&q, "rope-dim") ? (int)VAL("rope-dim") : m->kv_lora > 0 ? 64 : 0;
    m->dropout = GIVEN(&q, "dropout");
    m->mtp = (int)VAL("mtp");
    if (m->width % m->heads && !m->head_dim) usage_error("--width %d is not a multiple of --heads %d (or give --head-dim)", m->width, m->heads);
    if (m->heads % m->kv_heads) usage_error("--kv-heads %d must divide --heads %d", m->kv_heads, m->heads);
    if (m->experts == 0 && (GIVEN(&q, "top-k") || GIVEN(&q, "expert-ffn") || GIVEN(&q, "shared-experts") || GIVEN(&q, "dense-layers")))
        usage_error("--top-k, --expert-ffn, --shared-experts and --dense-layers apply with --experts only");
    if (m->experts > 0 && m->top_k > m->experts) usage_error("--top-k %d is more than --experts %d", m->top_k, m->experts);
    if (m->dense >= m->layers && m->experts > 0) usage_error("--dense-layers %d leaves no MoE layer of %d", m->dense, m->layers);
    if ((GIVEN(&q, "q-lora") || GIVEN(&q, "rope-dim")) && !m->kv_lora) usage_error("--q-lora and --rope-dim are MLA's: they need --kv-lora");
    if (m->kv_lora && GIVEN(&q, "kv-heads")) usage_error("--kv-heads is grouped-query attention's; MLA (--kv-lora) has none");
    if (fmod(m->tokens, m->seq)) usage_error("--tokens %.0f is not a whole number of sequences of --seq %d", m->tokens, m->seq);
    q.pr.fp8 = GIVEN(&q, "fp8");
    if (q.pr.fp8 && !(c->fp8_flops > 0)) usage_error("--fp8: the cluster file gives no fp8_flops and fp8_efficiency");
    q.pr.dp_overlap = VAL("dp-overlap"), q.pr.ep_overlap = VAL("ep-overlap"), q.pr.route_nodes = (int)VAL("route-nodes");
    if ((GIVEN(&q, "ep-overlap") || GIVEN(&q, "route-nodes")) && !m->experts) usage_error("--ep-overlap and --route-nodes apply with --experts only");
    q.pr.comm_sms = (int)VAL("comm-sms");
    if (q.pr.comm_sms && !c->sms) usage_error("--comm-sms: the cluster file gives no sms (the SMs of a device)");
    if (q.pr.comm_sms >= c->sms && c->sms) usage_error("--comm-sms %d: a device has %d SMs, and compute needs some", q.pr.comm_sms, c->sms);
    q.pr.tp_overlap = VAL("tp-overlap");
    q.pr.bf16_moments = GIVEN(&q, "bf16-moments");
    q.pr.grad_accum_pass = GIVEN(&q, "grad-accum-pass");
    if (word[flag_index("attention")]) {
        const char* s = word[flag_index("attention")];
        if (strcmp(s, "flash") && strcmp(s, "unfused")) usage_error("--attention must be flash or unfused, got '%s'", s);
        q.pr.unfused = !strcmp(s, "unfused");
    }
    if (word[flag_index("cp-exchange")]) {
        const char* s = word[flag_index("cp-exchange")];
        if (strcmp(s, "ring") && strcmp(s, "allgather")) usage_error("--cp-exchange must be ring or allgather, got '%s'", s);
        q.pr.cp_ring = !strcmp(s, "ring");
    }
    q.devices = GIVEN(&q, "devices") ? (int)VAL("devices") : c->nodes * c->per_node;
    if (q.devices > c->nodes * c->per_node) usage_error("--devices %d: the cluster has %d", q.devices, c->nodes * c->per_node);
    q.top = GIVEN(&q, "top") ? (int)VAL("top") : 12;
    if (GIVEN(&q, "top") && !rank) usage_error("--top applies to rank");
    // the layout: the knobs (fixed for every layout rank considers), and the degrees
    Fixed* fx = &q.fx;
    if (GIVEN(&q, "zero")) fx->zero = (int)VAL("zero");
    if (GIVEN(&q, "sp")) fx->sp = 1;
    if (word[flag_index("recompute")]) {
        const char* s = word[flag_index("recompute")];
        for (int k = 0; k < N_RECOMPUTE; k++)
            if (!strcmp(s, cost_recompute_names[k])) fx->recompute = k;
        if (fx->recompute < 0) usage_error("--recompute must be none, selective, full or norms, got '%s'", s);
    }
    if (word[flag_index("schedule")]) { // schedules.h's, and the cost model's own dualpipe
        if ((fx->sched = cost_schedule_parse(word[flag_index("schedule")])) < 0) {
            char names_[256];
            cost_schedule_list(0, ", ", " or ", names_, sizeof names_);
            usage_error("--schedule must be %s, got '%s'", names_, word[flag_index("schedule")]);
        }
    }
    if (GIVEN(&q, "virtual")) {
        if (fx->sched != SCHEDULE_INTERLEAVED) usage_error("--virtual applies to --schedule interleaved");
        fx->V = (int)VAL("virtual");
    }
    if (fx->sched == SCHEDULE_INTERLEAVED && fx->V < 0 && !rank) usage_error("--schedule interleaved needs --virtual V (chunks per device)");
    if (GIVEN(&q, "microbatches")) fx->M = (int)VAL("microbatches");
    Layout* l = &q.l;
    q.marked = GIVEN(&q, "tp") || GIVEN(&q, "cp") || GIVEN(&q, "pp") || GIVEN(&q, "dp") || GIVEN(&q, "ep");
    l->tp = GIVEN(&q, "tp") ? (int)VAL("tp") : 1, l->cp = GIVEN(&q, "cp") ? (int)VAL("cp") : 1;
    l->pp = GIVEN(&q, "pp") ? (int)VAL("pp") : 1, l->ep = GIVEN(&q, "ep") ? (int)VAL("ep") : 1;
    long inner = (long)l->tp * l->cp * l->pp;
    l->dp = q.devices % inner ? 0 : (int)(q.devices / inner); // 0: layout_rule says why below
    if (GIVEN(&q, "dp") && l->dp && (int)VAL("dp") != l->dp)
        usage_error("--dp %d: TP %d x CP %d x PP %d on %d devices leaves DP %d", (int)VAL("dp"), l->tp, l->cp, l->pp, q.devices, l->dp);
    if (!rank && l->tp == 1 && GIVEN(&q, "tp-overlap")) usage_error("--tp-overlap applies to a layout with TP: give --tp above 1");
    if (!rank && l->cp == 1 && word[flag_index("cp-exchange")])
        usage_error("--cp-exchange applies to a layout with CP: give --cp above 1");
    if (!rank && l->pp == 1 && (fx->sched >= 0 || GIVEN(&q, "virtual")))
        usage_error("--schedule and --virtual apply to a pipeline: give --pp above 1 (predict's layout has one stage)");
    l->zero = fx->zero >= 0 ? fx->zero : 0, l->sp = fx->sp > 0, l->recompute = fx->recompute >= 0 ? fx->recompute : 0;
    l->sched = fx->sched >= 0 ? fx->sched : SCHEDULE_1F1B, l->V = fx->V > 0 ? fx->V : 1;
    if (l->pp == 1) l->sched = SCHEDULE_1F1B, l->V = 1;
    l->M = fx->M > 0 ? fx->M : default_microbatches(m->tokens / m->seq, l->dp);
    if (q.marked || !rank) { // a layout rank does not consider is refused, saying why
        char why[320];
        // rank: the degrees (and microbatches) under what is fixed for every layout (a fixed
        // schedule refuses in its own words); the rest is chosen per layout
        Layout degrees = *l;
        if (rank) degrees.V = first_virtual(degrees.sched, fx);
        if (layout_rule(m, rank ? &degrees : l, q.devices, why, sizeof why)) {
            if (!q.marked) // predict without --tp --cp --pp --dp --ep: say which layout it took
                usage_error("no layout given (--tp --cp --pp --dp --ep): predict takes every one of the %d devices as data "
                            "parallel, and that layout is refused: %s", q.devices, why);
            usage_error("%s%s", why, rank ? " (not among the layouts rank considers)" : "");
        }
    }
    return q;
#undef VAL
}

static void print_cost_line(const Layout* l, const Cost* k) {
    printf("step_s=%.4g mfu=%.4f hfu=%.4f memory_gb=%.2f fits=%s compute_s=%.4g membound_s=%.4g attention_s=%.4g bubble=%.4f bubble_s=%.4g tp_s=%.4g cp_s=%.4g "
           "ep_s=%.4g pp_s=%.4g dp_s=%.4g optimizer_s=%.4g overlap_s=%.4g weights_gb=%.2f activations_gb=%.2f gpu_hours_per_trillion_tokens=%.4g "
           "layout=tp%d.cp%d.pp%d.dp%d.ep%d zero=%d sp=%s recompute=%s schedule=%s virtual=%d microbatches=%d\n",
           k->step, k->mfu, k->hfu, k->memory / 1e9, k->fits ? "yes" : "no", k->compute, k->membound, k->attention, k->bubble,
           (k->compute + k->tp + k->cp + k->ep) * k->bubble / (1 - k->bubble), k->tp, k->cp, k->ep, k->pp, k->dp,
           k->optimizer, k->overlap, k->weights / 1e9, k->acts / 1e9, k->gpu_hours_per_t, l->tp, l->cp, l->pp, l->dp, l->ep, l->zero,
           l->sp ? "yes" : "no", cost_recompute_names[l->recompute], l->pp > 1 ? cost_schedule_name(l->sched) : "none",
           l->pp > 1 ? cost_schedule_chunks(l->sched, l->V) : 1, l->M);
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
// replay on a table of 1 ms a row (nothing fixed, no optimizer), every rank of the run
// sending what its busiest rank sends on each axis
static double replay_case(Run* r, int cores, Links k, double* compute) {
    Table flat = {.n = 2, .rows = {1, 64}, .sec = {1e-3, 64e-3}};
    for (int q = 0; q < r->ranks; q++) memcpy(r->rank_axis[q], r->axis, sizeof r->axis);
    return predict_run(r, &flat, cores, k, compute);
}

static int selftest(void) {
    // a ring all-reduce of 8 MB over 4 ranks, alpha 10 us, beta 1 GB/s: 6 x (10 us + 2 ms)
    Link l10 = {1e-5, 1e9, 0};
    near("ring all-reduce, 8 MB over 4 ranks", t_allreduce(8e6, 4, l10), 6 * (1e-5 + 2e-3));
    near("ring all-gather, 8 MB over 4 ranks", t_half(8e6, 4, l10), 3 * (1e-5 + 2e-3));
    near("one rank all-reduces nothing", t_allreduce(8e6, 1, l10), 0);
    int S, M;
    near("bubble of '2 stages x 1 chunks, 4 microbatches, 1f1b' = 1/5",
         layout_bubble("pipeline of 2 stages x 1 chunks, 4 microbatches, 1f1b schedule", &S, &M), 0.2);
    near("bubble of naive with 4 stages = 3/4", layout_bubble("pipeline of 4 stages x 1 chunks, 8 microbatches, naive schedule", &S, &M), 0.75);
    near("bubble of the 3D grid 2 x 2 x 2, gpipe, M 4 = 1/5",
         layout_bubble("grid of 2 tensor x 2 data x 2 pipeline = 8 ranks; ZeRO stage 1; 4 microbatches, gpipe", &S, &M), 0.2);

    // replay: 1 ms per row; data parallel on 2 ranks, 32 rows: 16 ms + 4 messages x 10 us + 150 KB / 100 MB/s
    double compute;
    Run dp = {"train_dp.c", "data parallel over 2 ranks", 2, 32, 149088, 4, {0}, {{0}}};
    Links k = {1e-5, 1e8, 1e-6, 1e9, 2};
    near("replay: dp on 2 ranks", replay_case(&dp, 2, k, &compute), 0.016 + 4e-5 + 149088 / 1e8);
    near("replay: dp on 2 ranks of one host: shared memory's link",
         replay_case(&dp, 2, (Links){1e-5, 1e8, 1e-6, 1e9, 1}, &compute), 0.016 + 4e-6 + 149088 / 1e9);
    // a pipeline of 2 stages, 1F1B, M = 4: 32 ms / 2 / (1 - 1/5) = 20 ms, plus 8 messages of 1 KB
    Run pp = {"train_pp.c", "pipeline of 2 stages x 1 chunks, 4 microbatches, 1f1b schedule", 2, 32, 8192, 8, {0}, {{0}}};
    near("replay: pp 2 stages, 1f1b, M 4", replay_case(&pp, 2, k, &compute), 0.020 + 8e-5 + 8192 / 1e8);
    // tensor and context parallel on 4 ranks: 32 ms / 4, and 10 messages of 10 KB
    Run tp = {"train_tp.c", "tensor parallel over 4 ranks", 4, 32, 1e5, 10, {0}, {{0}}};
    near("replay: tp on 4 ranks", replay_case(&tp, 4, k, &compute), 0.008 + 1e-4 + 1e5 / 1e8);
    Run cpr = {"train_cp.c", "context parallel over 4 ranks", 4, 32, 1e5, 10, {0}, {{0}}};
    near("replay: cp on 4 ranks", replay_case(&cpr, 4, k, &compute), 0.008 + 1e-4 + 1e5 / 1e8);
    // 8 ranks on 2 cores: compute takes 4 times as long
    Run g = {"train_3d.c", "grid of 2 tensor x 2 pipeline x 2 data = 8 ranks; ZeRO stage 1; 4 microbatches, gpipe", 8, 32, 0, 0, {0}, {{0}}};
    near("replay: 3d 2x2x2 on 2 cores", replay_case(&g, 2, (Links){0, 1, 0, 1, 2}, &compute), 16e-3 / 2 / 2 / 0.8 * 4);
    // on 2 hosts of 4 ranks: tensor and pipeline axes inside a host (ranks tp fastest, then
    // pp), the data axis across; 10 messages shared out as the bytes: 1000 tp, 3000 dp, 1000 pp;
    // the 4 ranks of a host are 4 data-axis pairs crossing at once: the link's rate shared 4 ways
    g.sent = 5000, g.messages = 10, g.axis[AXIS_TP] = 1000, g.axis[AXIS_DP] = 3000, g.axis[AXIS_PP] = 1000;
    near("replay: 3d 2x2x2 on 2 hosts: only the data axis crosses, 4 pairs sharing the link",
         replay_case(&g, 2, k, &compute) - compute, 4 * 1e-6 + 2000 / 1e9 + 6 * 1e-5 + 4 * 3000 / 1e8);
    // a 4D grid 2 x 2 x 1 x 2 on 2 hosts: tensor and context inside (4 ranks), pipeline across
    Run g4 = {"train_3d.c", "grid of 2 tensor x 2 context x 2 pipeline x 1 data = 8 ranks; 4 microbatches, 1f1b", 8, 32,
              4000, 8, {1000, 2000, 1000, 0}, {{0}}};
    near("replay: 4D grid 2x2x1x2: compute 32 ms / 2 / 2 / 2 / (1 - 1/5), context axis inside a host, 4 stage pairs crossing",
         replay_case(&g4, 8, k, &compute), 32e-3 / 8 / 0.8 + 6 * 1e-6 + 3000 / 1e9 + 2 * 1e-5 + 4 * 1000 / 1e8);
    // the same grid's data axis, its D x C group (D = 1): the context pairs, inside a host
    g4.sent = 6000, g4.axis[AXIS_DP] = 2000;
    near("replay: 4D grid with D = 1: its data axis's bytes (summed over the context pair) stay inside a host",
         replay_case(&g4, 8, k, &compute), 32e-3 / 8 / 0.8 + 8 * 5000 / 6000.0 * 1e-6 + 5000 / 1e9 + 8 * 1000 / 6000.0 * 1e-5 + 4 * 1000 / 1e8);
    // with D = 2 (2 x 1 x 2 x 2 on 2 hosts): the data axis crosses, the pipeline stays inside
    Run g5 = {"train_3d.c", "grid of 2 tensor x 1 context x 2 pipeline x 2 data = 8 ranks; 4 microbatches, 1f1b", 8, 32,
              4000, 8, {1000, 0, 1000, 2000}, {{0}}};
    near("replay: 3D grid 2x1x2x2: the data axis crosses (4 pairs at once), the pipeline stays",
         replay_case(&g5, 8, k, &compute) - compute, 4 * 1e-6 + 2000 / 1e9 + 4 * 1e-5 + 4 * 2000 / 1e8);
    // the expert axis (--ep 2, carved out of D 4): 2 tensor x 1 x 1 pipeline x 4 data on 2
    // hosts: an expert group is 2 consecutive data coordinates, ranks {0, 2} and {1, 3} inside
    // host 0: its bytes on shared memory; the data axis crosses, 2 groups from each host
    Run g6 = {"train_3d.c", "grid of 2 tensor x 1 pipeline x 4 data = 8 ranks; ZeRO stage 1; 1 microbatch, gpipe; expert "
              "parallel over 2 of the data-parallel ranks (4 experts a block, top-1)", 8, 32, 4000, 8, {1000, 0, 0, 1000, 2000}, {{0}}};
    near("replay: the expert axis's bytes inside a host, on shared memory",
         replay_case(&g6, 8, k, &compute) - compute, 6 * 1e-6 + 3000 / 1e9 + 2 * 1e-5 + 2 * 1000 / 1e8);
    // with E 4 the expert groups are the whole data axis: they cross
    snprintf(g6.layout, sizeof g6.layout, "grid of 2 tensor x 1 pipeline x 4 data = 8 ranks; ZeRO stage 1; 1 microbatch, gpipe; "
             "expert parallel over 4 of the data-parallel ranks (4 experts a block, top-1)");
    near("replay: EP 4 over 2 hosts: the expert axis's bytes cross, 2 groups a host",
         replay_case(&g6, 8, k, &compute) - compute, 2 * 1e-6 + 1000 / 1e9 + 6 * 1e-5 + 2 * 1000 / 1e8 + 2 * 2000 / 1e8);

    // a host's link carries its own ranks' bytes: the same grid with the second stage's ranks
    // (pp 1: ranks 2, 3, 6, 7) sending a tenth of the first's on the data axis; host 0's 4
    // crossing pairs send 3000 + 3000 + 300 + 300 bytes
    for (int q = 0; q < g.ranks; q++) g.rank_axis[q][AXIS_DP] = q / 2 % 2 ? 300 : 3000;
    near("replay: 3d 2x2x2 on 2 hosts, stages sending unequal bytes: the host's sum crosses",
         predict_run(&g, &(Table){.n = 2, .rows = {1, 64}, .sec = {1e-3, 64e-3}}, 2, k, &compute) - compute,
         4 * 1e-6 + 2000 / 1e9 + 6 * 1e-5 + 6600 / 1e8);
    // a table with a part that does not grow with rows and one that runs once: a step at R rows
    // is 0.2 ms (once a step) + 1 ms + 0.5 ms x R
    Table fixed = {.n = 5, .rows = {1, 2, 4, 8, 64}, .sec = {1.7e-3, 2.2e-3, 3.2e-3, 5.2e-3, 33.2e-3}, .once = 0.2e-3};
    near("the part that does not grow with rows: the table's line at 0 rows", table_fixed(&fixed), 1e-3);
    near("forward and backward past the table's last row, along its last segment", table_fb(&fixed, 128), 1e-3 + 64e-3);
    // a noisy table (forward and backward 1.6, 1.9, 3.0, 5.0 ms at 1, 2, 4, 8 rows): the least-
    // squares line through the four, slope 14.275 / 28.75, at 0 rows 2.875 - 3.75 slope, not
    // the 1.3 of the first two points' line
    Table noisy = {.n = 4, .rows = {1, 2, 4, 8}, .sec = {1.7e-3, 2.0e-3, 3.1e-3, 5.1e-3}, .once = 0.1e-3};
    near("the part that does not grow with rows, from a noisy table: least squares over 1 to 8 rows", table_fixed(&noisy),
         (2.875 - 3.75 * 14.275 / 28.75) * 1e-3);
    for (int q = 0; q < 4; q++) memset(pp.rank_axis[q], 0, sizeof pp.rank_axis[q]), memset(tp.rank_axis[q], 0, sizeof tp.rank_axis[q]);
    // 4 microbatches of 8 rows, each 1 + 4 ms, on 2 stages: 4 x 5 / 2 / (1 - 1/5), and half the optimizer
    near("replay: pp, microbatches at their own rows", predict_run(&pp, &fixed, 2, k, &compute) - (8e-5 + 8192 / 1e8), 4 * 5e-3 / 2 / 0.8 + 0.1e-3);
    // tensor parallel on 4 ranks, 32 rows: the 1 ms on every rank, 16 ms split 4 ways, the optimizer too
    near("replay: tp, the part that does not grow with rows on every rank", predict_run(&tp, &fixed, 4, k, &compute) - (1e-4 + 1e5 / 1e8),
         1e-3 + 16e-3 / 4 + 0.2e-3 / 4);
    // ZeRO-3 on 2 ranks, 16 rows each: 1 + 8 ms, and the optimizer on half the parameters
    Run fsdp = {"train_fsdp.c", "ZeRO stage 3 over 2 ranks", 2, 32, 0, 0, {0}, {{0}}};
    near("replay: fsdp, the optimizer sharded", predict_run(&fsdp, &fixed, 2, k, &compute), 9e-3 + 0.1e-3);
    // context parallel on 4 ranks, 32 rows: the 1 ms on every rank, 16 ms split 4 ways; no
    // ZeRO, so every rank runs the whole optimizer
    for (int q = 0; q < 4; q++) memset(cpr.rank_axis[q], 0, sizeof cpr.rank_axis[q]);
    near("replay: cp, the part that does not grow with rows on every rank", predict_run(&cpr, &fixed, 4, k, &compute) - (1e-4 + 1e5 / 1e8),
         1e-3 + 16e-3 / 4 + 0.2e-3);
    // a ZeRO grid with context parallelism: 2 context x 2 data, 16 rows a data rank, 1 + 8 / 2
    // ms; what runs once over the D x C = 4 ranks of the data group
    Run zc = {"train_3d.c", "grid of 1 tensor x 2 context x 1 pipeline x 2 data = 4 ranks; ZeRO stage 1; 1 microbatch, gpipe", 4, 32,
              0, 0, {0}, {{0}}};
    near("replay: a ZeRO grid with context parallelism, what runs once over D x C", predict_run(&zc, &fixed, 4, k, &compute),
         1e-3 + 8e-3 / 2 + 0.2e-3 / 4);
    // a batch of 9 in 4 microbatches (3, 2, 2, 2 rows, the programs' split): 4 x 1 + 0.5 x 9 ms,
    // on 2 stages
    Run pp9 = pp;
    pp9.batch = 9;
    near("replay: pp, microbatches of unequal rows", predict_run(&pp9, &fixed, 2, k, &compute) - (8e-5 + 8192 / 1e8), (4e-3 + 4.5e-3) / 2 / 0.8 + 0.1e-3);
    // the host that sends the most sets the pace: host 1's first-stage ranks (4 and 5) send
    // 5000 bytes on the data axis, host 0's 3000
    for (int q = 0; q < g.ranks; q++) g.rank_axis[q][AXIS_DP] = q / 2 % 2 ? 300 : q >= 4 ? 5000 : 3000;
    near("replay: the host that sends the most across sets the pace",
         predict_run(&g, &(Table){.n = 2, .rows = {1, 64}, .sec = {1e-3, 64e-3}}, 2, k, &compute) - compute,
         4 * 1e-6 + 2000 / 1e9 + 6 * 1e-5 + 10600 / 1e8);
    // one rank a host (8 hosts): each link carries its rank's bytes on every axis; rank 0 sends
    // 1000 + 3000 + 1000, rank 1 2000 + 300 + 1000: the busiest link 5000 (not the axes' own
    // busiest, 2000 + 3000 + 1000)
    Run g8 = g;
    for (int q = 0; q < g8.ranks; q++) {
        double tp_b = q == 1 ? 2000 : 1000, dp_b = q == 0 ? 3000 : 300;
        g8.rank_axis[q][AXIS_TP] = tp_b, g8.rank_axis[q][AXIS_DP] = dp_b, g8.rank_axis[q][AXIS_PP] = 1000;
    }
    near("replay: a host's link carries its ranks' bytes on every axis together",
         predict_run(&g8, &(Table){.n = 2, .rows = {1, 64}, .sec = {1e-3, 64e-3}}, 2, (Links){1e-5, 1e8, 1e-6, 1e9, 8}, &compute) - compute,
         10 * 1e-5 + 5000 / 1e8);

    // ---- the transformer (tools/costmodel_llm.h) ----
    // parameters, GPT-2 small by hand: 12 layers of 768, MHA, GELU 3072, vocabulary 50257:
    // a layer 4 x 768^2 + 2 x 768 x 3072 + 2 x 768 (norms); embedding and head 50257 x 768 each
    Shape gpt2 = {.layers = 12, .width = 768, .heads = 12, .kv_heads = 12, .ffn = 3072, .vocab = 50257, .seq = 1024, .tokens = 1024};
    double layer = 4.0 * 768 * 768 + 2.0 * 768 * 3072;
    near("params of GPT-2 small (untied head)", params_total(&gpt2), 12 * (layer + 2 * 768) + 768 + 2.0 * 50257 * 768);
    near("active params: the blocks and the head, not the embedding", params_active(&gpt2), 12 * layer + 50257.0 * 768);
    // GQA and SwiGLU: 8 heads of 16 (width 128), 2 KV heads: Q, O 128 x 128, K, V 128 x 32; SwiGLU 3 x 128 x 352
    Shape gqa = {.layers = 2, .width = 128, .heads = 8, .kv_heads = 2, .ffn = 352, .vocab = 100, .seq = 64, .swiglu = 1, .tokens = 64};
    near("GQA attention: Q, O 128 x 128, K, V 128 x 32", attention_params(&gqa), 2 * 128.0 * 128 + 2 * 128.0 * 32);
    near("SwiGLU MLP: 3 matrices of 128 x 352", mlp_params(&gqa, gqa.ffn), 3 * 128.0 * 352);
    // MoE: 4 layers, the first dense; 8 experts of 64 (SwiGLU), top-2, 1 shared; router 128 x 8
    Shape moe = gqa;
    moe.layers = 4, moe.experts = 8, moe.top_k = 2, moe.expert_ffn = 64, moe.shared = 1, moe.dense = 1;
    double att = attention_params(&gqa), ex = 3 * 128.0 * 64;
    near("MoE total params", params_total(&moe), 4 * (att + 256) + 352 * 384.0 + 3 * (128 * 8 + 9 * ex) + 128 + 2 * 100 * 128.0);
    near("MoE active params: top-2 and the shared expert", params_active(&moe), 4 * att + 352 * 384.0 + 3 * (128 * 8 + 3 * ex) + 100 * 128.0);
    near("MoE routed expert params", params_experts(&moe), 3 * 8 * ex);
    // MLA, DeepSeek-V3's attention: Q 7168 x 1536 + 1536 x 128 x 192; KV down 7168 x 576; K, V up 512 x 128 x 128 each; O 16384 x 7168
    Shape mla = {.layers = 1, .width = 7168, .heads = 128, .head_dim = 128, .ffn = 1, .vocab = 1, .seq = 4096,
                 .q_lora = 1536, .kv_lora = 512, .rope = 64, .tokens = 4096};
    near("MLA attention params", attention_params(&mla), 7168.0 * 1536 + 1536.0 * 128 * 192 + 7168.0 * 576 + 2 * 512.0 * 128 * 128 + 16384.0 * 7168);
    // FLOPs per token: 6 x active + 12 x layers x sequence x width (PaLM's count)
    near("model FLOPs of GPT-2 small: 6 N + 12 L s d", model_flops(&gpt2), 6 * (12 * layer + 50257.0 * 768) + 12.0 * 12 * 1024 * 768);
    double f8;
    near("hardware FLOPs: the causal half of attention", hardware_flops(&gpt2, RECOMPUTE_NONE, &f8, 0),
         6 * (12 * layer + 50257.0 * 768) + 6.0 * 12 * 1024 * 768);
    near("hardware FLOPs, selective: attention's forward again", hardware_flops(&gpt2, RECOMPUTE_SELECTIVE, &f8, 0),
         6 * (12 * layer + 50257.0 * 768) + 8.0 * 12 * 1024 * 768);
    near("hardware FLOPs, full: the blocks' forward again", hardware_flops(&gpt2, RECOMPUTE_FULL, &f8, 0),
         8 * 12 * layer + 6 * 50257.0 * 768 + 8.0 * 12 * 1024 * 768);
    hardware_flops(&gpt2, RECOMPUTE_NONE, &f8, 1);
    near("FP8 FLOPs: the blocks' products, not the head or attention", f8, 6 * 12 * layer);
    // activations: Korthikanti's GPT (dropout, MHA, GELU 4h): 34h + 5as per token; TP 8 without
    // SP: 10h + 24h/8 + 5as/8; with SP: (34h + 5as)/8; selective: 34h/8
    Shape kor = gpt2;
    kor.dropout = 1;
    double h = 768, as = 12.0 * 1024;
    near("activations, no parallelism: 34h + 5as", layer_acts_per_token(&kor, 0, 1, 0, RECOMPUTE_NONE, 1024, 0), 34 * h + 5 * as);
    near("activations, TP 8: 10h + 24h/t + 5as/t", layer_acts_per_token(&kor, 0, 8, 0, RECOMPUTE_NONE, 1024, 0), 10 * h + 24 * h / 8 + 5 * as / 8);
    near("activations, TP 8 + SP: (34h + 5as)/t", layer_acts_per_token(&kor, 0, 8, 1, RECOMPUTE_NONE, 1024, 0), (34 * h + 5 * as) / 8);
    near("activations, TP 8 + SP, selective: 34h/t", layer_acts_per_token(&kor, 0, 8, 1, RECOMPUTE_SELECTIVE, 1024, 0), 34 * h / 8);
    // without dropout, GQA (K, V 2 heads of 16) and SwiGLU 352: 8h + Q 2h, K, V 2 x 2 x 32,
    // O-input 2h, gate, up and product 6 x 352, softmax 2as
    near("activations, GQA + SwiGLU, no dropout", layer_acts_per_token(&gqa, 0, 1, 0, RECOMPUTE_NONE, 64, 0),
         8 * 128 + 4 * 128 + 4 * 32 + 6 * 352 + 2 * 8 * 64);
    // an MoE layer: the top-2 and shared experts' SwiGLU (3 x 64 wide) and the token's 2 dispatched copies
    near("activations, MoE layer: experts' SwiGLU and the dispatched copies", layer_acts_per_token(&moe, 1, 1, 0, RECOMPUTE_NONE, 64, 0),
         8 * 128 + 4 * 128 + 4 * 32 + 6 * 3 * 64 + 2 * 128 * 2 + 2 * 8 * 64);
    // a whole device: 1F1B on 4 stages holds 4 microbatches on rank 0; CP 2 halves the
    // tokens; full recomputation keeps 2h per token and layer (SP: / t) and one layer's set
    Layout l = {.tp = 2, .cp = 2, .pp = 4, .dp = 2, .ep = 1, .zero = 0, .sp = 1, .recompute = RECOMPUTE_SELECTIVE,
                .sched = SCHEDULE_1F1B, .V = 1, .M = 8};
    Shape big = {.layers = 8, .width = 1024, .heads = 16, .kv_heads = 16, .ffn = 4096, .vocab = 1000, .seq = 2048, .tokens = 2048.0 * 16};
    double tok = 2048 / 2.0; // a microbatch: one sequence, half of it on this device
    int two[4] = {2, 2, 2, 2}; // layers of each stage
    near("activations of a device: 1F1B rank 0, 4 microbatches x 2 layers, CP 2, TP 2 + SP",
         stage_activation_bytes(&big, &l, two, 0, 0, 0), 4 * 2 * tok * layer_acts_per_token(&big, 0, 2, 1, RECOMPUTE_SELECTIVE, 2048, 0));
    l.recompute = RECOMPUTE_FULL;
    near("activations, full recomputation, rank 0: 4 microbatches of the layers' inputs, one layer's set",
         stage_activation_bytes(&big, &l, two, 0, 0, 0), 4 * 2 * tok * 2 * 1024 / 2 + tok * layer_acts_per_token(&big, 0, 2, 1, RECOMPUTE_SELECTIVE, 2048, 0));
    near("activations, full recomputation, the last stage: 1 microbatch's inputs, one layer's set, the FP32 logits",
         stage_activation_bytes(&big, &l, two, 3, 0, 0), 1 * 2 * tok * 1024 + 4 * tok * 1000 / 2 +
                                                      tok * layer_acts_per_token(&big, 0, 2, 1, RECOMPUTE_SELECTIVE, 2048, 0));
    l.recompute = RECOMPUTE_SELECTIVE, l.sched = SCHEDULE_INTERLEAVED, l.V = 2;
    near("activations, interleaved V 2 on 4 stages: (2 x 3 + 4 + 1) / 2 = 5.5 microbatches of a stage",
         stage_activation_bytes(&big, &l, two, 0, 0, 0), 5.5 * 2 * tok * layer_acts_per_token(&big, 0, 2, 1, RECOMPUTE_SELECTIVE, 2048, 0));
    // recomputation "norms" (DeepSeek-V3's) on an MLA + MoE layer under FP8 (h 7168, latents 1536
    // + 512 + 64, 128 heads of 128, top-8 and 1 shared expert of 2048, SwiGLU): the norms' inputs
    // 2 x 2h bytes; the output projection's input, the latents, SwiGLU's 2 x 9 x 2048 inputs and
    // the 8 dispatched copies, 1 byte each; Q, K, V and SwiGLU's output recomputed
    Shape dsv3 = {.layers = 4, .width = 7168, .heads = 128, .kv_heads = 128, .head_dim = 128, .ffn = 18432, .vocab = 100, .seq = 4096,
                  .swiglu = 1, .experts = 256, .top_k = 8, .expert_ffn = 2048, .shared = 1, .dense = 1, .q_lora = 1536, .kv_lora = 512,
                  .rope = 64, .tokens = 4096};
    near("activations, recomputation \"norms\" under FP8: norm inputs, the latents and product inputs in FP8",
         layer_acts_per_token(&dsv3, 1, 1, 0, RECOMPUTE_NORMS, 4096, 1),
         4 * 7168.0 + 16384 + (512 + 64 + 1536) + 2 * 9 * 2048.0 + 8 * 7168.0);
    near("hardware FLOPs, recomputation \"norms\": MLA's up-projections forward again",
         hardware_flops(&dsv3, RECOMPUTE_NORMS, &f8, 0) - hardware_flops(&dsv3, RECOMPUTE_SELECTIVE, &f8, 0),
         4 * 2 * (1536.0 * 128 * 192 + 2 * 512.0 * 128 * 128));
    // memory-bound bytes of a layer per token (2 bytes a value): GQA + SwiGLU (h 128, Q 8 and
    // K 2 heads of 16, f 352): norms 4h + 6h back, residuals 6h + 6h, RoPE 2 x (128 + 32) each
    // way, SwiGLU 3f + 5f
    near("memory-bound bytes of a layer: norms, residuals, RoPE, SwiGLU", layer_membound_bytes(&gqa, 0, 1, 0, RECOMPUTE_NONE, 0),
         2 * (10 * 128 + 12 * 128 + 4 * (128 + 32) + 8 * 352));
    near("memory-bound bytes, TP 2 without SP: the h-wide work whole on each device",
         layer_membound_bytes(&gqa, 0, 2, 0, RECOMPUTE_NONE, 0), 2 * (22 * 128) + 2 * (4 * (128 + 32) + 8 * 352) / 2);
    near("memory-bound bytes, TP 2 with SP: all of it split", layer_membound_bytes(&gqa, 0, 2, 1, RECOMPUTE_NONE, 0),
         2 * (10 * 128 + 12 * 128 + 4 * (128 + 32) + 8 * 352) / 2);
    Shape drop = gqa;
    drop.dropout = 1;
    near("memory-bound bytes of dropout (--dropout): two, 5h bytes forward and 5h backward each",
         layer_membound_bytes(&drop, 0, 1, 0, RECOMPUTE_NONE, 0) - layer_membound_bytes(&gqa, 0, 1, 0, RECOMPUTE_NONE, 0), 2 * (5 + 5) * 128.0);
    near("memory-bound bytes, full recomputation: the forward's again", layer_membound_bytes(&gqa, 0, 1, 0, RECOMPUTE_FULL, 0),
         2 * (20 * 128 + 12 * 128 + 6 * (128 + 32) + 11 * 352));
    // an MoE layer (8 experts, top-2 and a shared one of 64): the router 2E each way, the
    // gather 2kh and combine (k + 1)h forward, (2k + 1)h and (k + 1)h backward, SwiGLU on 3 x 64
    near("memory-bound bytes of an MoE layer: the router, the copies gathered and combined",
         layer_membound_bytes(&moe, 1, 1, 0, RECOMPUTE_NONE, 0),
         2 * (10 * 128 + 12 * 128 + 4 * 8 + (4 + 3) * 128 + (5 + 3) * 128 + 4 * (128 + 32) + 8 * 192));
    // FP8: the products' inputs (norm output, attention output, norm output, SwiGLU output:
    // 3 x 128 + 352) quantized forward and for the weight gradient, their outputs' gradients
    // (QKV 192, O 128, gate and up 704, down 128) for the input gradient, 3 bytes each
    near("memory-bound bytes under FP8: each product's input quantized twice, its output gradient once",
         layer_membound_bytes(&gqa, 0, 1, 0, RECOMPUTE_NONE, 1) - layer_membound_bytes(&gqa, 0, 1, 0, RECOMPUTE_NONE, 0),
         3 * (2 * (3 * 128 + 352) + (192 + 128 + 704 + 128)));
    // MLA (h 7168, 128 heads, latents 1536 and 512, RoPE 64; a GELU MLP of width 1): the
    // latents' norms, RoPE on 128 x 64 of Q and 64 of K; under FP8 the inputs h, 1536, 512,
    // 16384 (O), h, 1 and the outputs 1536 + 24576 (Q), 512 + 64 (KV down), 2 x 16384 (K, V
    // up), h (O), 1 and h (MLP)
    near("memory-bound bytes of an MLA layer", layer_membound_bytes(&mla, 0, 1, 0, RECOMPUTE_NONE, 0),
         2 * (22 * 7168.0 + 5 * 2048 + 4 * (128 * 64 + 64) + 5 * 1));
    near("memory-bound bytes of an MLA layer under FP8: its products' inputs and outputs",
         layer_membound_bytes(&mla, 0, 1, 0, RECOMPUTE_NONE, 1) - layer_membound_bytes(&mla, 0, 1, 0, RECOMPUTE_NONE, 0),
         3 * (2 * (7168 + 1536 + 512 + 16384 + 7168 + 1) + (1536 + 24576 + 512 + 64 + 2 * 16384 + 7168 + 1 + 7168)));
    // the ends: the embedding's row gathered and its gradient added (5h values, whole on each
    // TP device); the final norm (5h, split under SP) and the loss (20 bytes a logit, split)
    near("memory-bound bytes of the embedding: 5h values", embedding_membound_bytes(&big), 2 * 5 * 1024);
    near("memory-bound bytes of the head, TP 2 with SP: the norm's 5h and the loss's 20V, halved",
         head_membound_bytes(&big, 2, 1), (2 * 5 * 1024 + 20 * 1000) / 2.0);
    near("memory-bound bytes of the head, TP 2 without SP: the norm whole", head_membound_bytes(&big, 2, 0), 2 * 5 * 1024 + 20 * 1000 / 2.0);
    // the stages: Llama 3 405B's 126 layers on 16, the embedding worth 0.01 of a layer, the
    // head and loss 0.7: a layer off the first and the last stage (7, 8 x 14, 7), pace 8
    int st[16];
    near("stages, Llama 3 405B on 16: pace 8 layers", stage_layers(126, 16, 0.01, 0.7, 0, st), 8);
    near("stages, Llama 3 405B on 16: 7 layers first and last, 8 between", st[0] * 1000 + st[1] * 100 + st[14] * 10 + st[15], 7887);
    // the head worth 1.15 layers (DeepSeek-V3's: a 129,280 vocabulary on a narrow width): 61
    // layers on 16 take 3, 4 x 14, 2
    near("stages, a head worth 1.15 layers: pace 4", stage_layers(61, 16, 0.003, 1.15, 0, st), 4);
    near("stages, a head worth 1.15 layers: 3, 4 x 14, 2", st[0] * 1000 + st[1] * 100 + st[14] * 10 + st[15], 3442);
    // zbv: device 0 holds both ends (0.71): P 8 covers 7 + 15 x 8 = 127, one too many, taken
    // from the earliest full device
    near("stages under zbv: both ends on device 0, pace 8", stage_layers(126, 16, 0.01, 0.7, 1, st), 8);
    near("stages under zbv: 7, 7, 8 ...", st[0] * 100 + st[1] * 10 + st[2], 778);
    near("one stage: every layer and both ends", stage_layers(8, 1, 0.01, 0.7, 1, st), 8.71);
    near("8 layers on 4 stages, no slack: pace 2 + the head's 0.08", stage_layers(8, 4, 0.01, 0.08, 0, st), 2.08);
    // parameters of a stage: its layers' share of all but the ends, the embedding on the
    // first, the head and final norm on the last; split by TP
    Layout t2 = {.tp = 2, .cp = 1, .pp = 4, .dp = 1, .ep = 1, .sched = SCHEDULE_1F1B, .V = 1, .M = 4};
    double per_layer = (params_total(&big) - 1024 - 2 * 1000.0 * 1024) / 8, dpar, epar;
    stage_params(&big, &t2, 2, 1, 0, &dpar, &epar);
    near("parameters of the first stage: 2 layers and the embedding, over TP 2", dpar, (2 * per_layer + 1000.0 * 1024) / 2);
    stage_params(&big, &t2, 2, 0, 1, &dpar, &epar);
    near("parameters of the last stage: 2 layers, the head and the final norm, over TP 2", dpar, (2 * per_layer + 1000.0 * 1024 + 1024) / 2);
    // ZeRO: 16 bytes per parameter; stage 1 shards the 12 of the optimizer, 2 the gradients, 3 the weights
    near("ZeRO-0, 1e9 params", state_bytes(1e9, 0, 8), 16e9);
    near("ZeRO-1 over 8", state_bytes(1e9, 1, 8), 4e9 + 1.5e9);
    near("ZeRO-2 over 8", state_bytes(1e9, 2, 8), 2e9 + 2e9 / 8 + 1.5e9);
    near("ZeRO-3 over 8", state_bytes(1e9, 3, 8), 16e9 / 8);
    // DeepSeek-V3's state (--bf16-moments): 2-byte weights, 4-byte gradients, 8 bytes of FP32
    // master weight and BF16 m and v
    near("BF16 moments, FP32 gradients, ZeRO-1 over 8", state_bytes_as(1e9, 1, 8, 1), 2e9 + 4e9 + 8e9 / 8);
    near("BF16 moments, FP32 gradients, ZeRO-2 over 8", state_bytes_as(1e9, 2, 8, 1), 2e9 + 4e9 / 8 + 8e9 / 8);

    // the new terms one at a time, by hand. Waves: on 100 SMs a 2048 x 1280 product is 80
    // tiles (8 x 10 of 256 x 128, or 16 x 5 of 128 x 256), one wave of 100 SM-tiles: 80%
    Cluster w = {.sms = 100, .flops = 1e14, .efficiency = 0.5, .hbm = 1e12, .sustained = 1};
    near("waves: 2048 x 1280 on 100 SMs is 80 tiles in one wave of 100", wave_fraction(&w, 1, 2048, 1280, 4096), 0.8);
    near("waves: 4096 x 4096 is 512 tiles, 6 waves", wave_fraction(&w, 1, 4096, 4096, 4096), 4096.0 * 4096 / (6 * 100 * 32768.0));
    // 300 x 128 as 128 x 128 tiles (the 256-wide one cut to 128): 3 tiles, K 4096 split in 16
    // chunks of 256, 48 units in one wave of 100; 300 of the tiles' 384 rows are C's
    near("tiles and split-K: 300 x 128 (K 4096) as 3 tiles x 16 chunks of K", wave_fraction(&w, 1, 300, 128, 4096),
         300.0 / 384 * 48 / 100);
    near("waves: 8 products of 1024 x 256 are 64 tiles, one wave", wave_fraction(&w, 8, 1024, 256, 4096), 8 * 1024 * 256 / (100 * 32768.0));
    near("a product at its wave fraction: 2 M N K / (peak x efficiency x 0.8)", gemm_seconds(&w, 1, 2048, 1280, 4096, 0),
         2 * 2048.0 * 1280 * 4096 / (1e14 * 0.5 * 0.8));
    // the roofline: 16 tokens against a 4096 x 4096 weight read 33.8 MB for 0.5 GFLOP (16 x 128
    // tiles, 32 of them x 3 chunks of K: 96% of the SMs, 11 us; the bytes take 34 us)
    near("a skinny product is memory-bound: its bytes through HBM", gemm_seconds(&w, 1, 16, 4096, 4096, 0),
         (2 * (16 * 4096.0 + 4096.0 * 4096) + 2 * 16 * 4096.0) / 1e12);
    w.sustained = 0.8;
    near("sustained at the power limit: 0.8 of the burst rate", gemm_seconds(&w, 1, 2048, 1280, 4096, 0),
         2 * 2048.0 * 1280 * 4096 / (1e14 * 0.5 * 0.8 * 0.8));
    near("... and the memory-bound product keeps HBM's rate", gemm_seconds(&w, 1, 16, 4096, 4096, 0),
         (2 * (16 * 4096.0 + 4096.0 * 4096) + 2 * 16 * 4096.0) / 1e12);
    w.sustained = 1, w.attention_efficiency = 0.3, w.attention_half_seq = 2048;
    near("attention at its half length runs at half its rate", attention_rate(&w, 2048), 1e14 * 0.3 / 2);
    near("attention at 3 x its half length: 3/4 of the rate", attention_rate(&w, 6144), 1e14 * 0.3 * 0.75);
    // links: a collective's base latency, then its steps; a node's NICs shared by the rings
    // leaving it: 2 nodes of 4, 2 NICs a node
    near("all-reduce with NCCL's base latency: base + 2(n-1) steps", t_allreduce(8e6, 4, (Link){1e-5, 1e9, 8.4e-6}),
         8.4e-6 + 6 * (1e-5 + 2e-3));
    Cluster nic = {.per_node = 4, .nodes = 2, .alpha_intra = 1e-6, .beta_intra = 1e11, .alpha_inter = 1e-5, .beta_inter = 1e10, .nics = 2};
    near("a group inside a node (4 of stride 1): NVLink", ring_link(&nic, 4, 1).beta, 1e11);
    near("a group of 2 at stride 2 (block 4) inside a node", ring_link(&nic, 2, 2).beta, 1e11);
    near("a group of 8 at stride 1: one ring leaves each node, a NIC to itself", ring_link(&nic, 8, 1).beta, 1e10);
    near("4 groups of 2 at stride 4: 4 rings leave a node through its 2 NICs, half a NIC each", ring_link(&nic, 2, 4).beta, 1e10 / 2);
    near("... and the latency between nodes", ring_link(&nic, 2, 4).alpha, 1e-5);
    near("2 groups of 4 at stride 2: 2 rings, a NIC each", ring_link(&nic, 4, 2).beta, 1e10);
    near("a group of 3 at stride 1 straddles a node of 4: between nodes", ring_link(&nic, 3, 1).beta, 1e10);
    // the papers' count of hardware FLOPs: Megatron-LM's 96 B s l h^2 (1 + s/6h + V/16lh) a step
    // with full recomputation, per token; without any, the model's count
    near("hardware FLOPs in Megatron-LM's count, full recomputation (GPT-2 small's shape)", hardware_count_flops(&gpt2, RECOMPUTE_FULL),
         96 * 12 * 768.0 * 768 * (1 + 1024 / (6 * 768.0) + 50257 / (16 * 12 * 768.0)));
    near("hardware FLOPs without recomputation: the model's", hardware_count_flops(&gpt2, RECOMPUTE_NONE), model_flops(&gpt2));
    near("hardware FLOPs, selective: attention's core forward again (4 s h a layer)", hardware_count_flops(&gpt2, RECOMPUTE_SELECTIVE),
         model_flops(&gpt2) + 4.0 * 12 * 1024 * 768);
    // any number of stages: BLOOM's 70 layers on 12, the embedding worth 0.2 of a layer, the
    // head 1.1: pace 6.1 covers 5 + 10 x 6 + 5 = 70
    int st12[40];
    near("stages, 70 layers on 12: pace 6.1", stage_layers(70, 12, 0.2, 1.1, 0, st12), 6.1);
    near("stages, 70 layers on 12: 5, 6 x 10, 5", st12[0] * 100 + st12[1] * 10 + st12[11], 565);
    near("stages, 35 on 35: one a stage, the head's stage at 1.1", stage_layers(35, 35, 0.01, 0.1, 0, st12), 1.1);

    // the time terms, on a cluster whose numbers are easy: 2 nodes of 4, 1e14 FLOP/s at 50%
    // (attention at 25%, FP8 2e14 at 50%), HBM 1e12 B/s (every product here is compute-bound:
    // above 50 FLOP a byte), links 1e-6 s, 1e11 B/s inside a node; 1e-5 s, 1e10 B/s between
    // (a NIC a device); no SMs given: no waves
    Cluster c = {.name = "test", .nodes = 2, .per_node = 4, .flops = 1e14, .efficiency = 0.5, .attention_efficiency = 0.25, .fp8_flops = 2e14,
                 .fp8_efficiency = 0.5, .memory = 1e12, .alpha_intra = 1e-6, .beta_intra = 1e11, .alpha_inter = 1e-5, .beta_inter = 1e10,
                 .hbm = 1e12, .nics = 4, .sustained = 1};
    Link in_node = {1e-6, 1e11, 0}, between = {1e-5, 1e10, 0};
    Practice pr = {0};
    Layout dp8 = {.tp = 1, .cp = 1, .pp = 1, .dp = 8, .ep = 1, .sched = SCHEDULE_1F1B, .V = 1, .M = 2};
    Cost kk = layout_cost(&c, &big, &pr, &dp8, 8, 0, 0);
    double F = hardware_flops(&big, RECOMPUTE_NONE, &f8, 0), A = 3 * attention_core(&big);
    double mb = big.tokens / 8 * 8 * layer_membound_bytes(&big, 0, 1, 0, RECOMPUTE_NONE, 0) / 1e12;
    near("memory-bound time: a replica's tokens x 8 layers x their bytes / HBM's rate", kk.membound, mb);
    near("attention's time: a replica's tokens x its causal FLOPs at 25%", kk.attention, big.tokens / 8 * A / 2.5e13);
    // one stage: the 8 layers, the head's product (in F) and the loss, the embedding's lookup
    // (10h + 10h + 20V bytes a token)
    near("compute: tokens / devices x hardware FLOPs / (peak x efficiency), attention at its own, and the memory-bound work",
         kk.compute, big.tokens / 8 * ((F - A) / 5e13 + A / 2.5e13) + mb + big.tokens / 8 * (20 * 1024 + 20 * 1000.0) / 1e12);
    double P = params_total(&big);
    near("DP 8 across 2 nodes: an all-reduce of 2-byte gradients between nodes", kk.dp, t_allreduce(2 * P, 8, between));
    near("the optimizer's step, ZeRO-0: 28 bytes of every parameter through HBM", kk.optimizer, 28 * P / 1e12);
    near("step = compute + DP + the optimizer's step", kk.step, kk.compute + kk.dp + kk.optimizer);
    near("MFU = tokens x model FLOPs / (step x devices x peak)", kk.mfu, big.tokens * model_flops(&big) / (kk.step * 8 * 1e14));
    near("HFU without recomputation = MFU", kk.hfu, kk.mfu);
    near("GPU-hours per trillion tokens", kk.gpu_hours_per_t, kk.step * 8 / 3600 * 1e12 / big.tokens);
    pr.dp_overlap = 0.1;
    double t_dp = t_allreduce(2 * P, 8, between);
    kk = layout_cost(&c, &big, &pr, &dp8, 8, 0, 0);
    near("DP, a tenth hidden behind compute", kk.dp, 0.9 * t_dp);
    pr.dp_overlap = 1;
    kk = layout_cost(&c, &big, &pr, &dp8, 8, 0, 0);
    near("DP, all hidden but what outlasts a microbatch's compute (M 2: half of it)", kk.dp, fmax(0, t_dp - kk.compute / 2));
    dp8.zero = 0;
    pr.dp_overlap = 0;
    dp8.zero = 3;
    near("ZeRO-3: 1.5 times the traffic", layout_cost(&c, &big, &pr, &dp8, 8, 0, 0).dp, 1.5 * t_allreduce(2 * P, 8, between));
    near("the optimizer's step under ZeRO: the device's shard, 1/8", layout_cost(&c, &big, &pr, &dp8, 8, 0, 0).optimizer, 28 * P / 8 / 1e12);
    pr.bf16_moments = 1;
    near("... with BF16 moments and FP32 gradients: 22 bytes a parameter", layout_cost(&c, &big, &pr, &dp8, 8, 0, 0).optimizer, 22 * P / 8 / 1e12);
    pr.bf16_moments = 0;
    // DeepSpeed's BF16 optimizer: each of the M 2 microbatches' gradients added into FP32 by a
    // pass of 18 bytes a parameter (the device holds all P), memory-bound, part of compute
    Cost fused = layout_cost(&c, &big, &pr, &dp8, 8, 0, 0);
    pr.grad_accum_pass = 1;
    kk = layout_cost(&c, &big, &pr, &dp8, 8, 0, 0);
    pr.grad_accum_pass = 0;
    near("FP32 gradient sums by a pass of their own: M x 18 bytes a parameter", kk.compute - fused.compute, 2 * 18 * P / 1e12);
    near("... in the memory-bound part", kk.membound - fused.membound, 2 * 18 * P / 1e12);
    near("... and the FP32 gradients held beside the BF16 ones, 4 bytes a parameter (ZeRO-3 here: over 8)", kk.weights - fused.weights, 4 * P / 8);
    dp8.zero = 0, dp8.recompute = RECOMPUTE_FULL;
    kk = layout_cost(&c, &big, &pr, &dp8, 8, 0, 0);
    near("HFU under full recomputation: the papers' count over the same step", kk.hfu,
         big.tokens * hardware_count_flops(&big, RECOMPUTE_FULL) / (kk.step * 8 * 1e14));
    dp8.recompute = RECOMPUTE_NONE;
    // TP 4 inside a node, DP 2 across: per layer and microbatch 4 all-reduces of the
    // microbatch's activations (one sequence: 2048 x 1024 x 2 bytes) over TP's links
    Layout t4 = {.tp = 4, .cp = 1, .pp = 1, .dp = 2, .ep = 1, .sp = 1, .sched = SCHEDULE_1F1B, .V = 1, .M = 8};
    kk = layout_cost(&c, &big, &pr, &t4, 8, 0, 0);
    double t_tp = 8 * 8 * 4 * t_allreduce(2 * 2048.0 * 1024, 4, in_node);
    near("TP 4 in a node: 8 layers x 8 microbatches x 4 all-reduces", kk.tp, t_tp);
    pr.tp_overlap = 0.5;
    near("TP, half hidden behind the products (--tp-overlap 0.5)", layout_cost(&c, &big, &pr, &t4, 8, 0, 0).tp, t_tp / 2);
    pr.tp_overlap = 0;
    t4.recompute = RECOMPUTE_FULL;
    near("TP under full recomputation: 6 all-reduces", layout_cost(&c, &big, &pr, &t4, 8, 0, 0).tp,
         8 * 8 * 6 * t_allreduce(2 * 2048.0 * 1024, 4, in_node));
    // CP 2 inside a node (TP 2 x CP 2 = 4), all-gather: K and V of the sequence (2 x 2048 x
    // 1024 / TP 2 values, 2 bytes) gathered, again, and reduce-scattered per layer and microbatch
    Layout c2 = {.tp = 2, .cp = 2, .pp = 1, .dp = 2, .ep = 1, .sp = 1, .sched = SCHEDULE_1F1B, .V = 1, .M = 8};
    double kvb = 2 * 2048.0 * 2 * 1024 / 2;
    kk = layout_cost(&c, &big, &pr, &c2, 8, 0, 0);
    near("CP 2, all-gather: 3 collectives per layer and microbatch", kk.cp, 8 * 8 * 3 * t_half(kvb, 2, in_node));
    pr.cp_ring = 1;
    double core = big.tokens / 8 * 3 * attention_core(&big) / 2.5e13;
    near("CP 2 as a ring: what attention's time does not hide", layout_cost(&c, &big, &pr, &c2, 8, 0, 0).cp,
         fmax(0, 8 * 8 * 3 * t_half(kvb, 2, in_node) - core));
    pr.cp_ring = 0;
    // PP 4 across the 2 nodes (DP 2 x PP 4), 1F1B, M 8: bubble 3/11; 2 x (8 + 2) sends of a
    // microbatch's activations (2048 x 1024 x 2 bytes) between nodes
    Layout p4 = {.tp = 1, .cp = 1, .pp = 4, .dp = 2, .ep = 1, .sched = SCHEDULE_1F1B, .V = 1, .M = 8};
    kk = layout_cost(&c, &big, &pr, &p4, 8, 0, 0);
    near("PP 4, 1F1B, M 8: bubble 3/11", kk.bubble, 3.0 / 11);
    // 2 layers on each stage: the last, with the head's product and the loss, sets the pace
    double layer_t = ((F - A - 6 * 1024.0 * 1000) / 5e13 + A / 2.5e13) / 8 + layer_membound_bytes(&big, 0, 1, 0, RECOMPUTE_NONE, 0) / 1e12;
    near("PP 4: compute at the last stage's pace, 2 layers, the head and the loss, for a replica's tokens", kk.compute,
         big.tokens / 2 * (2 * layer_t + 6 * 1024.0 * 1000 / 5e13 + (10 * 1024 + 20 * 1000.0) / 1e12));
    near("PP sends: 2 (V M + S - 2) of a microbatch's activations", kk.pp, 2 * (8 + 2) * t_p2p(2 * 2048.0 * 1024, between));
    near("step with a pipeline: (compute + ...) / (1 - bubble) + sends + DP", kk.step,
         kk.compute / (1 - 3.0 / 11) + kk.pp + kk.dp + kk.optimizer);
    c.nics = 1; // one NIC a node: the 2 devices of a stage in each node send over it at once
    near("PP sends through a node's one NIC, 2 devices sending: half its rate", layout_cost(&c, &big, &pr, &p4, 8, 0, 0).pp,
         2 * (8 + 2) * t_p2p(2 * 2048.0 * 1024, (Link){1e-5, 1e10 / 2, 0}));
    c.nics = 4;
    p4.sched = SCHEDULE_ZB1;
    near("zb1's bubble on 4 stages, M 8: 3 / (3 x 8 + 3)", layout_cost(&c, &big, &pr, &p4, 8, 0, 0).bubble, 3.0 / 27);
    double zb, zp;
    zbv_figures(4, 8, RECOMPUTE_NONE, &zb, &zp);
    near("zbv's peak on 4 stages, M 8: S microbatches of a stage (the checker)", zp, 4);
    // attention without FlashAttention (--attention unfused), a layer and microbatch at TP 1
    // (16 heads of 64, one sequence of 2048): Q K^T and P V forward, 4 products backward, each
    // 2 x 2048 x 2048 x 64 FLOPs a head at 5e13; the scores through HBM, 2 values forward, 3 back
    Practice un = {.unfused = 1};
    double core_s, mb_s, per = 16 * 2 * 2048.0 * 2048 * 64 / 5e13, scores = 16 * 2048.0 * 2048 * 2 / 1e12;
    layer_seconds(&c, &big, &un, &dp8, 0, 1, &core_s, &mb_s);
    near("unfused attention: 6 batched products over the whole square and the scores 5 times", core_s, 6 * per + 5 * scores);
    // EP 4 on the 2 nodes of 4 (DP 8): each all-to-all sends 3/4 of the copies, 3 in the node,
    // none between: 4 all-to-alls per MoE layer and microbatch; under FP8 the dispatch halves
    Shape mbig = big;
    mbig.experts = 8, mbig.top_k = 2, mbig.expert_ffn = 1024;
    Layout e4 = {.tp = 1, .cp = 1, .pp = 1, .dp = 8, .ep = 4, .sched = SCHEDULE_1F1B, .V = 1, .M = 2};
    double copies = 2048.0 * 2 * 1024 * 2; // one sequence x top-2 x width x 2 bytes
    near("all-to-all inside a node", t_alltoall(&c, copies, 4, 1, 1), 3 * 1e-6 + copies * 3 / 4 / 1e11);
    near("all-to-all over 8 devices of 2 nodes: the 4 of the other node over the slow links",
         t_alltoall(&c, copies, 8, 1, 1), 7 * 1e-5 + fmax(copies * 3 / 8 / 1e11, copies * 4 / 8 / 1e10));
    near("node-limited routing to 2 nodes of the group's 2, top-2: every copy may cross", route_scale(&c, &mbig, 8, 1, 2), 1);
    near("node-limited routing to 1 node of a token's top-2: half the copies cross", route_scale(&c, &mbig, 8, 1, 1), 0.5);
    near("all-to-all over 2 nodes, routed to 1 node: half the far bytes",
         t_alltoall(&c, copies, 8, 1, 0.5), 7 * 1e-5 + fmax(copies * 3 / 8 / 1e11, copies * 4 / 8 / 1e10 / 2));
    c.nics = 2;
    near("all-to-all over 2 nodes of 2 NICs: every device's far bytes at half a NIC",
         t_alltoall(&c, copies, 8, 1, 1), 7 * 1e-5 + fmax(copies * 3 / 8 / 1e11, copies * 4 / 8 / (1e10 / 2)));
    c.nics = 4;
    near("EP 4: 8 MoE layers x 2 microbatches x 4 all-to-alls", layout_cost(&c, &mbig, &pr, &e4, 8, 0, 0).ep,
         8 * 2 * 4 * t_alltoall(&c, copies, 4, 1, 1));
    pr.fp8 = 1, pr.ep_overlap = 1;
    kk = layout_cost(&c, &mbig, &pr, &e4, 8, 0, 0);
    near("EP under --ep-overlap 1: hidden while compute lasts", kk.ep,
         fmax(0, 8 * 2 * (t_alltoall(&c, copies / 2, 4, 1, 1) + 3 * t_alltoall(&c, copies, 4, 1, 1)) - kk.compute));
    double a2a_all = 8 * 2 * (t_alltoall(&c, copies / 2, 4, 1, 1) + 3 * t_alltoall(&c, copies, 4, 1, 1));
    Cluster c_sm = c;
    c_sm.sms = 100;
    Cost plain = layout_cost(&c_sm, &mbig, &pr, &e4, 8, 0, 0);
    pr.comm_sms = 20;
    Cost taxed = layout_cost(&c_sm, &mbig, &pr, &e4, 8, 0, 0);
    near("hidden all-to-alls on 20 of 100 SMs: compute loses a fifth of their time", taxed.overlap, 0.2 * fmin(a2a_all, plain.compute));
    near("... and is that much longer", taxed.compute, plain.compute + taxed.overlap);
    pr.comm_sms = 0;
    // under FP8 the blocks' products run at 1e14 (the router's 1024 x 8 in BF16, memory-bound:
    // its three products' bytes through HBM), the head at 5e13, attention at 2.5e13
    double F8, F16 = hardware_flops(&mbig, RECOMPUTE_NONE, &F8, 1) - F8;
    double A8 = 3 * attention_core(&mbig);
    double router = (2 * (2048 * 1024.0 + 1024 * 8) + 2 * 2048 * 8.0) + (2 * (2048 * 8.0 + 8 * 1024) + 2 * 2048 * 1024.0) +
                    (2 * (1024 * 2048.0 + 2048 * 8) + 2 * 1024 * 8.0); // bytes of its forward, input- and weight-gradient products
    near("compute under FP8: the blocks at the FP8 rate", kk.compute,
         mbig.tokens / 8 * ((F16 - A8) / 5e13 + A8 / 2.5e13 + (F8 - 6 * 1024.0 * 8 * 8) / 1e14) + mbig.tokens / 8 / 2048 * 8 * router / 1e12 +
         mbig.tokens / 8 * (8 * layer_membound_bytes(&mbig, 1, 1, 0, RECOMPUTE_NONE, 1) + 20 * 1024 + 20 * 1000.0) / 1e12);
    double dense_p, expert_p;
    stage_params(&mbig, &e4, 8, 1, 1, &dense_p, &expert_p);
    near("expert weights per device: routed experts / EP", state_bytes(expert_p, 0, 2), 16 * params_experts(&mbig) / 4);
    near("dense weights per device: all but the routed experts", dense_p, params_total(&mbig) - params_experts(&mbig));
    // multi-token prediction (--mtp 1): the device with the head also runs a block like the
    // last layer, a 2h x h projection and the head and loss again, for every token
    Shape mt = big;
    mt.mtp = 1;
    double head_t = 6 * 1024.0 * 1000 / 5e13 + (10 * 1024 + 20 * 1000.0) / 1e12, proj_t = 6 * 2048.0 * 1024 / 5e13;
    Practice bf16 = {0};
    near("MTP 1: a layer, a projection and the head again on the head's device, for a replica's tokens",
         layout_cost(&c, &mt, &bf16, &dp8, 8, 0, 0).compute - layout_cost(&c, &big, &bf16, &dp8, 8, 0, 0).compute,
         big.tokens / 8 * (layer_t + proj_t + head_t));
    stage_params(&mt, &t2, 2, 0, 1, &dpar, &epar);
    near("MTP 1's parameters with the head: a layer's, the 2h x h projection and two norms", dpar,
         (2 * per_layer + 1000.0 * 1024 + 1024 + per_layer + 2 * 1024.0 * 1024 + 2 * 1024) / 2);
    // DualPipe (the cost model's own schedule): the report's bubble, (PP/2 - 1)(F&B + B - 3W)
    // beside M (F + B); PP 4, M 8, F = I = W = 1: 1 x (3 + 2 - 3) = 2 idle beside 24
    Layout d4 = {.tp = 1, .cp = 1, .pp = 4, .dp = 2, .ep = 1, .sched = SCHEDULE_DUALPIPE, .V = 1, .M = 8};
    near("DualPipe's bubble on 4 ranks, M 8: (4/2 - 1)(F&B + B - 3W) / (M (F + B) + that) = 2 / 26", pipeline_bubble(&d4, 0), 2.0 / 26);
    near("DualPipe's F&B pairs on its end ranks, PP 4, M 8: M - 3PP/2 + 1 = 3 of 8 forwards", paired_fraction(&d4), 3.0 / 8);
    d4.sched = SCHEDULE_DUALPIPEV;
    near("dualpipev's on rank 0 of 4, M 8: 2M - 3S + 1 = 5 of 16", paired_fraction(&d4), 5.0 / 16);
    d4.sched = SCHEDULE_1F1B;
    near("1F1B pairs nothing", paired_fraction(&d4), 0);
    d4.sched = SCHEDULE_DUALPIPE;
    // 8 layers on 4 ranks: ranks 0 and 3 hold stages 0 and 3, each running the one for half the
    // microbatches, the other for the rest: per microbatch 2 layers and half of the embedding's
    // and the head's work (1F1B's last stage: 2 layers and all the head's)
    double emb_t = 10 * 1024.0 / 1e12;
    kk = layout_cost(&c, &big, &bf16, &d4, 8, 0, 0);
    near("DualPipe, PP 4: compute at 2 layers and half of both ends, for a replica's tokens", kk.compute,
         big.tokens / 2 * (2 * layer_t + (head_t + emb_t) / 2));
    near("DualPipe, PP 4: weights of two stages (4 layers) and both ends on an end rank, 16 bytes each", kk.weights,
         16 * (4 * per_layer + 2 * 1000.0 * 1024 + 1024));
    int twos[4] = {2, 2, 2, 2};
    near("DualPipe's activations: PP + 1 microbatches of a stage (rank 1: no logits)", stage_activation_bytes(&big, &d4, twos, 1, 0, 0),
         5 * 2 * 2048.0 * layer_acts_per_token(&big, 0, 1, 0, RECOMPUTE_NONE, 2048, 0));
    near("DualPipe's DP: the all-reduce of two stages' gradients, and the shard sent to the other copy's rank", kk.dp,
         t_allreduce(2 * (4 * per_layer + 2 * 1000.0 * 1024 + 1024), 2, in_node) + t_p2p(2 * (4 * per_layer + 2 * 1000.0 * 1024 + 1024) / 2, between));
    // an F&B hides its all-to-alls and sends behind its compute: EP 4 in a node, PP 2 across
    // the nodes, M 4 (sequences of 2048): at PP 2, M - 3 = 1 of 4 forwards paired (dualpipe.py's
    // middle ranks), so 3/4 of 4 MoE layers x 4 microbatches x 4 all-to-alls stays exposed, and
    // 3/4 of the 2 x 4 sends
    Layout d2 = {.tp = 1, .cp = 1, .pp = 2, .dp = 4, .ep = 4, .sched = SCHEDULE_DUALPIPE, .V = 1, .M = 4};
    double ep_all = 4 * 4 * 4 * t_alltoall(&c, copies, 4, 1, 1), send = t_p2p(2 * 2048.0 * 1024, between);
    kk = layout_cost(&c, &mbig, &bf16, &d2, 8, 0, 0);
    near("DualPipe, EP 4: the paired quarter of the all-to-alls hidden, the rest exposed", kk.ep, ep_all * 3 / 4);
    near("... and the paired quarter of the pipeline's sends", kk.pp, 2 * 4 * send - 2 * send);
    Cluster slow = c; // all-to-alls 1000 times slower: a pair's traffic outlasts its compute
    slow.beta_intra = 1e8;
    double ep_slow = 4 * 4 * 4 * t_alltoall(&slow, copies, 4, 1, 1);
    kk = layout_cost(&slow, &mbig, &bf16, &d2, 8, 0, 0);
    near("DualPipe, a pair's traffic longer than its compute: the pair takes the traffic's time (max, not sum)", kk.ep + kk.pp,
         ep_slow + 2 * 4 * send - kk.compute / 4);
    // DP (--dp-overlap 1) under DualPipe hides behind the unpaired microbatches' compute: the
    // pairs' hidden traffic (here their whole stretch) leaves it untouched; 3/4 of the compute
    // over 3/4 of the 4 microbatches: a quarter of it
    double dp_d2 = kk.dp;
    Practice dpo = {.dp_overlap = 1};
    near("DualPipe, DP hidden behind an unpaired microbatch's compute, not the pairs' (PP 2, M 4: compute / 4)",
         layout_cost(&slow, &mbig, &dpo, &d2, 8, 0, 0).dp, fmax(0, dp_d2 - (0.75 * kk.compute) / (0.75 * 4)));
    // the same slow all-to-alls on 4 stages: the bubble stays Table 2's 2 / 26 (the pairs'
    // excess traffic is charged once, in EP and PP, not again as a longer F&B)
    Layout d4s = {.tp = 1, .cp = 1, .pp = 4, .dp = 2, .ep = 2, .sched = SCHEDULE_DUALPIPE, .V = 1, .M = 8};
    kk = layout_cost(&slow, &mbig, &bf16, &d4s, 8, 0, 0);
    near("DualPipe, slow all-to-alls on 4 stages: the bubble as with fast ones", kk.bubble, 2.0 / 26);
    // hidden traffic shares the compute it hides behind: 4, 3 and 9 s behind 10 s hide 10 in
    // all, each 10/16 of its own
    double want[4] = {4, 3, 9, 0};
    share_stretch(10, want, 4);
    near("4 + 3 + 9 s of traffic behind 10 s of compute: 2.5 + 1.875 + 5.625 hidden", want[0] * 1e6 + want[1] * 1e3 + want[2],
         2.5e6 + 1.875e3 + 5.625);
    // TP 2 in a node (--tp-overlap 1: all of its 8 layers x 4 microbatches x 4 all-reduces of a
    // sequence fit behind the products) and EP 4 over 2 nodes at 10 MB/s (--ep-overlap 1: far
    // longer than the compute) behind the same compute: together they hide the compute's time,
    // not the compute's and TP's, the compute shared in proportion (TP's tp of tp + compute)
    Cluster slowx = c;
    slowx.beta_inter = 1e7;
    Layout te = {.tp = 2, .cp = 1, .pp = 1, .dp = 4, .ep = 4, .sched = SCHEDULE_1F1B, .V = 1, .M = 4};
    double tp_te = 8 * 4 * 4 * t_allreduce(2 * 2048.0 * 1024, 2, in_node), half = 2048.0 / 2 * 2 * 1024; // a device's copies of a sequence
    double ep_te = 8 * 4 * 4 * t_alltoall(&slowx, half * 2, 4, 2, 1);
    Practice both = {.tp_overlap = 1, .ep_overlap = 1};
    kk = layout_cost(&slowx, &mbig, &both, &te, 8, 0, 0);
    near("TP and EP hidden behind the same compute: together no more than it (what exceeds shows)", kk.tp + kk.ep, tp_te + ep_te - kk.compute);
    near("... TP's share of the compute in proportion: tp^2 / (tp + compute) shows", kk.tp, tp_te * tp_te / (tp_te + kk.compute));
    // DP (--dp-overlap 1) beside TP (--tp-overlap 1): a microbatch's compute hides its share of
    // TP's traffic, and DP behind what is left: TP 4 x DP 2 (across the nodes at 10 MB/s), M 8
    Practice tpdp = {.tp_overlap = 1};
    t4.recompute = RECOMPUTE_NONE;
    double dp_t4 = layout_cost(&slowx, &big, &tpdp, &t4, 8, 0, 0).dp;
    tpdp.dp_overlap = 1;
    kk = layout_cost(&slowx, &big, &tpdp, &t4, 8, 0, 0);
    near("DP beside TP: hidden behind a microbatch's compute less its share of TP's hidden traffic", kk.dp,
         fmax(0, dp_t4 - (kk.compute - t_tp) / 8));
    // any degrees: 3 devices take PP 3 (DP 3 leaves 16 sequences undivided); 48 sequences take DP 3 too
    Candidate* all;
    Fixed any = {-1, -1, -1, -1, -1, -1};
    int n_lay = enumerate(&c, &big, &pr, &any, 3, &all, NULL);
    near("3 devices, 16 sequences: one layout, PP 3", n_lay * 10 + all[0].l.pp, 13);
    free(all);
    Shape b48 = big;
    b48.tokens = 2048.0 * 48;
    n_lay = enumerate(&c, &b48, &pr, &any, 3, &all, NULL);
    near("3 devices, 48 sequences: DP 3 and PP 3", n_lay, 2);
    free(all);
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures > 0;
}

// ----------------------------------------------------------------------------

static void usage(void) {
    char scheds[256]; // those the model considers: naive is not (layout_rule)
    cost_schedule_list(SCHEDULE_GPIPE, "|", "|", scheds, sizeof scheds);
    fprintf(stderr,
            "usage: tools/costmodel compute [train.c's flags]\n"
            "       tools/costmodel replay RUN.sum ALPHA BETA [COMPUTE_TABLE [LOCAL_ALPHA LOCAL_BETA HOSTS]]\n"
            "       tools/costmodel predict CLUSTER_FILE SHAPE [LAYOUT] [PRACTICE]\n"
            "       tools/costmodel rank CLUSTER_FILE SHAPE [LAYOUT] [PRACTICE] [--top N]\n"
            "       tools/costmodel published [--check] | selftest\n"
            "SHAPE:    --layers L --width W --heads A --vocab V --seq S --tokens T (a step) [--kv-heads K] [--head-dim D]\n"
            "          [--ffn F (4W)] [--mlp swiglu|gelu] [--experts E --top-k K --expert-ffn F --shared-experts S\n"
            "          --dense-layers D] [--kv-lora R --q-lora R --rope-dim R (MLA)] [--dropout] [--mtp D]\n"
            "LAYOUT:   --tp --cp --pp --dp --ep (rank: marks that layout) --zero 0-3 --sp --recompute none|selective|full|norms\n"
            "          --schedule %s --virtual V --microbatches M (rank: fixed for all)\n"
            "PRACTICE: --fp8 --dp-overlap F --ep-overlap F --tp-overlap F --route-nodes R --cp-exchange allgather|ring --comm-sms N\n"
            "          --attention flash|unfused --bf16-moments --grad-accum-pass --devices N\n", scheds);
}

int main(int argc, char** argv) {
    const char* verb = argc >= 2 ? argv[1] : "";
    if (!strcmp(verb, "selftest") && argc == 2) return selftest();
    if (!strcmp(verb, "compute")) {
        Table t = measure_table(argc - 1, argv + 1);
        printf("model=%s\nonce_ms=%.4f\n", t.model, 1e3 * t.once);
        for (int i = 0; i < t.n; i++) printf("rows=%d ms=%.4f\n", t.rows[i], 1e3 * t.sec[i]);
        return 0;
    }
    if (!strcmp(verb, "replay")) {
        if (argc != 5 && argc != 6 && argc != 9)
            usage(), usage_error("replay takes RUN.sum ALPHA BETA, then COMPUTE_TABLE, then LOCAL_ALPHA LOCAL_BETA HOSTS (3, 4 or "
                                 "7 arguments), got %d", argc - 2);
        // beta under 1 KB/s or above 100 TB/s is no measurement (tools/pingpong's 1 MiB message took no longer
        // than its 8 bytes: it prints 2^20 / 1 ns)
        double alpha = arg_number("ALPHA (seconds)", argv[3], 0, 0, 10, 0), beta = arg_number("BETA (bytes/s)", argv[4], 1e3, 0, 1e14, 0);
        Links k = {alpha, beta, alpha, beta, 1};
        if (argc == 9) {
            k.local_alpha = arg_number("LOCAL_ALPHA (seconds)", argv[6], 0, 0, 10, 0);
            k.local_beta = arg_number("LOCAL_BETA (bytes/s)", argv[7], 1e3, 0, 1e14, 0);
            k.hosts = (int)arg_number("HOSTS", argv[8], 1, 0, 1024, 1);
        }
        Summary m;
        summary_read(&m, argv[2]);
        Run r = run_of(&m);
        if (k.hosts > r.ranks)
            usage_error("HOSTS %d is more hosts than the run's %d ranks", k.hosts, r.ranks);
        // the run's compute comes from a table of its own model's step, never another's
        if (!m.model[0])
            fatal("'%s' does not say which model it trained (no model= line: a summary older than that): run it again", argv[2]);
        const char* no_table = "replay times train.c's default MLP unless it is given a compute table of the run's model "
                               "(tools/costmodel compute with the run's model flags > TABLE, then replay RUN.sum ALPHA BETA TABLE)";
        if (argc < 6 && strncmp(m.model, "mlp ", 4))
            fatal("'%s' trained %s: %s", argv[2], m.model, no_table);
        Table t = argc >= 6 ? read_table(argv[5]) : measure_table(1, (char*[]){"compute", NULL});
        if (argc < 6 && strcmp(m.model, t.model))
            fatal("'%s' trained %s, not train.c's default model (%s): %s", argv[2], m.model, t.model, no_table);
        if (strcmp(m.model, t.model))
            fatal("'%s' trained %s, but the compute table timed %s: measure the table with the run's model flags "
                  "(tools/costmodel compute --model ...)", argv[2], m.model, t.model);
        double compute, s = predict_run(&r, &t, (int)sysconf(_SC_NPROCESSORS_ONLN), k, &compute);
        printf("predicted_ms=%.4f compute_ms=%.4f comm_ms=%.4f\n", 1e3 * s, 1e3 * compute, 1e3 * (s - compute));
        return 0;
    }
    if ((!strcmp(verb, "predict") || !strcmp(verb, "rank")) && argc >= 3) {
        int rank = !strcmp(verb, "rank");
        Cluster c = cluster_read(argv[2]);
        Request q = parse_request(argc - 3, argv + 3, &c, rank);
        if (!rank) {
            Cost k = cost_of(&c, &q.m, &q.pr, &q.l, q.devices);
            print_cost_line(&q.l, &k);
            return 0;
        }
        Candidate* all;
        LeftOut left = {0};
        int n = enumerate(&c, &q.m, &q.pr, &q.fx, q.devices, &all, &left), fit = count_fits(all, n), pipelines = 0;
        for (int i = 0; i < n; i++) pipelines += all[i].l.pp > 1;
        // a fixed schedule that no pipeline layout runs would leave only PP 1, where no schedule
        // runs: refused, as predict refuses --schedule without --pp (the first refusal says why)
        const char* sched = q.fx.sched >= 0 ? cost_schedule_name(q.fx.sched) : NULL;
        if (sched && !pipelines && left.n) {
            char why[4096] = "";
            for (int i = 0, used = 0; i < left.n && used < (int)sizeof why; i++)
                used += snprintf(why + used, sizeof why - used, "%sPP %d: %s", i ? "; " : "", left.by_pp[i].first.pp, left.by_pp[i].why);
            usage_error("--schedule %s: no pipeline layout of %d device%s admits it (%s); without a pipeline no schedule runs: "
                        "give another --schedule, or none", sched, q.devices, q.devices > 1 ? "s" : "", why);
        }
        if (sched && !pipelines && n && left.flags_pp)
            usage_error("--schedule %s applies to a pipeline, and the other flags given leave no pipeline layout of %d device%s "
                        "(PP %d: %s)", sched, q.devices, q.devices > 1 ? "s" : "", left.flags_pp, left.flags_why);
        if (sched && !pipelines && n)
            usage_error("--schedule %s applies to a pipeline, and no layout of %d device%s has one (PP above 1) with the flags "
                        "given: give no --schedule", sched, q.devices, q.devices > 1 ? "s" : "");
        if (n == 0) // no layout at all: say so, not an empty table
            usage_error("no layout of %d devices is possible for this model with the flags given (TP dividing the %d heads, "
                        "CP whose double divides the sequence %d, PP up to the %d layers, DP times the microbatches dividing the "
                        "%.0f sequences of a step)", q.devices, q.m.heads, q.m.seq, q.m.layers, q.m.tokens / q.m.seq);
        print_model(&c, &q.m, &q.pr, q.devices);
        printf("\n");
        print_table_head();
        for (int i = 0; i < n && i < q.top; i++) print_row(i + 1, &q.m, &q.pr, &all[i]);
        printf("\n%d layouts (TP x CP x PP x DP x EP), each at its best ZeRO stage, SP, recomputation and schedule; %d fit in %.0f GB\n",
               n, fit, c.memory / 1e9);
        for (int i = 0; i < left.n; i++) { // what the fixed schedule left out, and why
            const Layout* f = &left.by_pp[i].first;
            int more = left.by_pp[i].count > 1;
            printf("left out by --schedule %s: %d layout%s with PP %d (%sTP %d, CP %d, PP %d, DP %d, EP %d: %s)\n", sched,
                   left.by_pp[i].count, more ? "s" : "", f->pp, more ? "the first, " : "", f->tp, f->cp, f->pp, f->dp, f->ep,
                   left.by_pp[i].why);
        }
        int listed = 0;
        for (int i = 0; i < left.n; i++) listed += left.by_pp[i].count;
        if (left.total > listed) printf("left out by --schedule %s: %d more layouts\n", sched, left.total - listed);
        if (q.marked) {
            int r = rank_of(all, n, &q.l);
            for (int i = 0; i < n; i++)
                if (same_degrees(&all[i].l, &q.l)) {
                    printf("the layout TP %d, CP %d, PP %d, DP %d, EP %d: ", q.l.tp, q.l.cp, q.l.pp, q.l.dp, q.l.ep);
                    if (r > 0) printf("rank %d of %d; ", r, fit);
                    else printf("does not fit (%.1f GB at least); ", all[i].k.memory / 1e9);
                    print_cost_line(&all[i].l, &all[i].k);
                }
            if (r < 0) printf("the layout TP %d, CP %d, PP %d, DP %d, EP %d: no setting of it is possible with the flags given\n",
                              q.l.tp, q.l.cp, q.l.pp, q.l.dp, q.l.ep);
        }
        free(all);
        return 0;
    }
    if (!strcmp(verb, "published") && argc <= 3) {
        int check = argc == 3 && !strcmp(argv[2], "--check");
        if (argc == 3 && !check) usage_error("published takes --check only, got '%s'", argv[2]);
        return published(check);
    }
    usage();
    if (!verb[0]) usage_error("no verb given: compute, replay, predict, rank, published or selftest");
    if (!strcmp(verb, "selftest")) usage_error("selftest takes no arguments, got %d", argc - 2);
    if (!strcmp(verb, "published")) usage_error("published takes at most one argument (--check), got %d", argc - 2);
    if (!strcmp(verb, "predict") || !strcmp(verb, "rank")) usage_error("%s needs a CLUSTER_FILE and the model's SHAPE", verb);
    usage_error("unknown verb '%.60s': compute, replay, predict, rank, published or selftest", verb);
}
