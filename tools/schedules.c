/*
 * tools/schedules.c: the pipeline schedules of schedules.h, checked and measured without
 * MPI. For one schedule it prints every rank's list of actions, then runs them with the
 * given durations and latency and prints the bubble and the peak activations per rank,
 * beside the papers' closed forms; --grid checks every schedule over S = 1..8, V = 1..4,
 * M = 1..32 and fails (exit 1) on any list that is invalid or disagrees with its formula.
 *
 *   tools/schedules zb1 4 1 8                    # schedule, S, V, M
 *   tools/schedules zbv 4 2 8 --f 1 --i 1 --w 1 --latency 0.1
 *   tools/schedules --grid
 *   tools/schedules --svg out.svg 4 8 naive.json gpipe.json ...   # the picture of make run
 *
 * --svg draws every schedule for S ranks and M microbatches (2 chunks per rank for
 * interleaved and zbv), one lane group each, on one time axis: the steps measured by
 * train_pp.c --trace, one trace file per schedule in the order of schedules.h, beside the
 * checker's run of the same lists with F, I and W taking one unit each and no latency.
 */
#include "../schedules.h"

#include <stdlib.h>

static int usage(void) {
    fprintf(stderr, "usage: tools/schedules SCHEDULE S V M [--f X] [--i X] [--w X] [--latency X] | tools/schedules --grid\n"
                    "       tools/schedules --svg FILE S M [TRACE...]\n");
    return 2;
}

// Every rank's list, built; NULL after an error message.
static Action** build(int sched, int S, int V, int M, int* counts) {
    Action** lists = mallocCheck(sizeof(Action*) * S);
    for (int r = 0; r < S; r++) lists[r] = mallocCheck(sizeof(Action) * 3 * V * M);
    schedule_build(sched, S, V, M, lists, counts);
    return lists;
}
static void drop(Action** lists, int S) {
    for (int r = 0; r < S; r++) free(lists[r]);
    free(lists);
}

// The grid: every valid (schedule, S, V, M), with f = i = w = 1 and no latency. The bubble
// must equal its closed form where the papers give one (zb1's when M >= S; below that, at
// most 1f1b's), the peak too; zbv must hold at most S microbatches, idle no more than
// 1f1b, and less than 5% of the time once M >= 4S.
static int grid(void) {
    long lists_checked = 0, failures = 0;
    Durations d = {1, 1, 1, 0};
    for (int sched = 0; sched < N_SCHEDULES; sched++)
        for (int S = 1; S <= 8; S++)
            for (int V = 1; V <= 4; V++)
                for (int M = 1; M <= 32; M++) {
                    char err[256];
                    int chunks = schedule_chunks(sched, V);
                    if (chunks != V && V > 1) continue; // V matters for interleaved only
                    if (schedule_rule(sched, S, chunks, M, err, sizeof err)) continue;
                    int counts[64];
                    Action** lists = build(sched, S, chunks, M, counts);
                    Check c = schedule_check(sched, S, chunks, M, lists, counts, d, NULL, NULL, 0);
                    double want = schedule_bubble_formula(sched, S, chunks, M, d);
                    int bad = !c.ok;
                    double f1b1 = schedule_bubble_formula(SCHEDULE_1F1B, S, 1, M, d);
                    int exact = want >= 0 && !(sched == SCHEDULE_ZB1 && M < S);
                    if (c.ok && exact && fabs(c.bubble_total - want) > 1e-9) bad = 1;
                    if (c.ok && (sched == SCHEDULE_ZB1 || sched == SCHEDULE_ZBV) && c.bubble_total > f1b1 + 1e-9) bad = 1;
                    for (int r = 0; r < S && c.ok && sched == SCHEDULE_ZBV; r++)
                        if (c.peak[r] > S + 1e-9) bad = 1;
                    if (c.ok && sched == SCHEDULE_ZBV && M >= 4 * S && c.bubble_total >= 0.05) bad = 1; // the condition docs/schedules.md states
                    for (int r = 0; r < S && c.ok; r++) {
                        double peak = schedule_peak_formula(sched, S, chunks, M, r);
                        if (peak >= 0 && fabs(c.peak[r] - peak) > 1e-9) bad = 1;
                    }
                    if (bad) {
                        failures++;
                        printf("FAILED %s S=%d V=%d M=%d: %s (bubble %.4f, formula %.4f)\n", schedule_names[sched], S,
                               chunks, M, c.ok ? "disagrees with its formula" : c.why, c.bubble_total, want);
                    }
                    lists_checked++;
                    drop(lists, S);
                }
    // and the checker itself must catch a broken list: a cycle of waits (rank 1 runs F of
    // microbatch 1 first, which needs rank 0's F1, which comes after rank 0's B0, which needs
    // rank 1's B0), an action run twice, and a W without its I
    Action r0[] = {{'F', 0, 0}, {'B', 0, 0}, {'F', 0, 1}, {'B', 0, 1}}, r1[] = {{'F', 0, 1}, {'F', 0, 0}, {'B', 0, 0}, {'B', 0, 1}};
    Action twice[] = {{'F', 0, 0}, {'F', 0, 0}, {'B', 0, 0}}, lone_w[] = {{'F', 0, 0}, {'W', 0, 0}};
    Action* cycle[] = {r0, r1};
    Action* one[] = {twice};
    Action* w[] = {lone_w};
    int n_cycle[] = {4, 4}, n_twice[] = {3}, n_w[] = {2};
    Check c1 = schedule_check(SCHEDULE_1F1B, 2, 1, 2, cycle, n_cycle, d, NULL, NULL, 0);
    Check c2 = schedule_check(SCHEDULE_1F1B, 1, 1, 1, one, n_twice, d, NULL, NULL, 0);
    Check c3 = schedule_check(SCHEDULE_ZB1, 1, 1, 1, w, n_w, d, NULL, NULL, 0);
    int caught = !c1.ok && strstr(c1.why, "deadlock") && !c2.ok && !c3.ok;
    printf("%s the checker catches a cycle of waits (%s), an action run twice (%s), a W without its I (%s)\n",
           caught ? "PASSED" : "FAILED", c1.why, c2.why, c3.why);
    printf("%ld schedules checked (every rank's list of each), %ld failed\n", lists_checked, failures);
    return failures || !caught ? 1 : 0;
}

// One lane group: S lanes of actions from t0 to t1 (any unit), scaled so that `end` spans
// the width, at height y; returns the height used.
static const char* op_colour(char op) { return op == 'F' ? "#6fa8dc" : op == 'W' ? "#93c47d" : "#f6b26b"; }
static double svg_lanes(FILE* f, double y, int S, int n, const int* rank, const char* op, const int* mb,
                        const double* t0, const double* t1, double end, const char* title) {
    double x0 = 150, pw = 820, lane = 11;
    fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", x0 - 8, y + S * lane / 2 + 4, title);
    for (int r = 0; r < S; r++)
        fprintf(f, "<rect x=\"%.0f\" y=\"%.1f\" width=\"%.0f\" height=\"%.0f\" fill=\"white\" stroke=\"#ddd\"/>\n", x0,
                y + r * lane, pw, lane);
    for (int i = 0; i < n; i++) {
        double x = x0 + pw * t0[i] / end, w = pw * (t1[i] - t0[i]) / end;
        fprintf(f, "<rect class=\"action\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\" "
                   "stroke=\"white\" stroke-width=\"0.3\"><title>%c%d</title></rect>\n",
                x, y + rank[i] * lane, w > 0.4 ? w : 0.4, lane, op_colour(op[i]), op[i], mb[i]);
    }
    return S * lane;
}

static int svg(int argc, char** argv) {
    if (argc < 5) return usage();
    const char* path = argv[2];
    int S = atoi(argv[3]), M = atoi(argv[4]), n_traces = argc - 5;
    if (S < 1 || S > 64 || M < 1) return usage();
    FILE* f = fopen(path, "w");
    if (!f) fatal("cannot create '%s': %s", path, strerror(errno));
    double H = 80 + N_SCHEDULES * ((n_traces ? 2 : 1) * S * 11 + 46), W = 1000;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", W, H, W, H);
    fprintf(f, "<text x=\"20\" y=\"22\" font-size=\"15\">Pipeline schedules, %d ranks, %d microbatches: one training step "
               "each, measured (train_pp.c --trace) and simulated (F = I = W)</text>\n", S, M);
    fprintf(f, "<text x=\"20\" y=\"40\">F blue, B or I orange, W green; white: the rank waits. Measured with more ranks "
               "than cores, waits include</text>\n<text x=\"20\" y=\"55\">other ranks' turns on a core; the simulation "
               "shows the schedule itself. Each row group: rank 0 at the top.</text>\n");
    double y = 70;
    enum { MAX_EV = 8192 };
    static PipeEvent ev[MAX_EV];
    static int rank[MAX_EV], mb[MAX_EV];
    static char op[MAX_EV];
    static double t0[MAX_EV], t1[MAX_EV];
    for (int sched = 0; sched < N_SCHEDULES; sched++) {
        int V = schedule_chunks(sched, 2), counts[64], n = 0;
        char err[256], title[96];
        if (schedule_rule(sched, S, V, M, err, sizeof err)) continue;
        fprintf(f, "<text x=\"20\" y=\"%.0f\" font-weight=\"bold\">%s</text>\n", y + 10, schedule_names[sched]);
        if (sched < n_traces) { // measured: the trace's actions, each rank from its first
            int got = trace_read_pipeline(argv[5 + sched], ev, MAX_EV);
            double start = got ? ev[0].t0 : 0, end = 0, busy = 0;
            for (int i = 0; i < got; i++) start = ev[i].t0 < start ? ev[i].t0 : start;
            for (int i = 0; i < got; i++) {
                rank[i] = ev[i].rank, op[i] = ev[i].op, mb[i] = ev[i].mb;
                t0[i] = ev[i].t0 - start, t1[i] = t0[i] + ev[i].dur, busy += ev[i].dur;
                end = t1[i] > end ? t1[i] : end;
            }
            snprintf(title, sizeof title, "measured, bubble %.2f", end > 0 ? 1 - busy / (S * end) : 0);
            y += svg_lanes(f, y + 14, S, got, rank, op, mb, t0, t1, end, title) + 4;
        }
        Action** lists = build(sched, S, V, M, counts);
        int stride = 3 * V * M;
        double* s0 = mallocCheck(sizeof(double) * S * stride), *s1 = mallocCheck(sizeof(double) * S * stride);
        Check c = schedule_check(sched, S, V, M, lists, counts, (Durations){1, 1, 1, 0}, s0, s1, stride);
        for (int r = 0; r < S; r++)
            for (int j = 0; j < counts[r] && n < MAX_EV; j++, n++)
                rank[n] = r, op[n] = lists[r][j].op, mb[n] = lists[r][j].mb, t0[n] = s0[r * stride + j], t1[n] = s1[r * stride + j];
        snprintf(title, sizeof title, "simulated, bubble %.2f", c.bubble_total);
        y += svg_lanes(f, y + 14, S, n, rank, op, mb, t0, t1, c.makespan, title) + 28;
        free(s0), free(s1);
        drop(lists, S);
    }
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0) fatal("cannot write '%s'", path);
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 2 && !strcmp(argv[1], "--grid")) return grid();
    if (argc >= 2 && !strcmp(argv[1], "--svg")) return svg(argc, argv);
    if (argc < 5) return usage();
    int sched, S = atoi(argv[2]), V = atoi(argv[3]), M = atoi(argv[4]);
    char err[256];
    if (schedule_parse(argv[1], &sched, err, sizeof err)) return fprintf(stderr, "%s\n", err), 2;
    if (S < 1 || S > 64 || V < 1 || M < 1) return usage();
    Durations d = {1, 1, 1, 0};
    for (int i = 5; i + 1 < argc; i += 2) {
        double x = atof(argv[i + 1]);
        if (!strcmp(argv[i], "--f")) d.f = x;
        else if (!strcmp(argv[i], "--i")) d.i = x;
        else if (!strcmp(argv[i], "--w")) d.w = x;
        else if (!strcmp(argv[i], "--latency")) d.latency = x;
        else return usage();
    }
    V = schedule_chunks(sched, V);
    if (schedule_rule(sched, S, V, M, err, sizeof err)) return fprintf(stderr, "%s\n", err), 2;
    int counts[64];
    Action** lists = build(sched, S, V, M, counts);
    printf("%s, S=%d, V=%d, M=%d; F %g, I %g, W %g (B = I + W), latency %g\n", schedule_names[sched], S, V, M, d.f, d.i,
           d.w, d.latency);
    for (int r = 0; r < S; r++) {
        printf("  rank %d:", r);
        for (int j = 0; j < counts[r]; j++) printf(" %c%d.%d", lists[r][j].op, chunk_global(sched, S, r, lists[r][j].chunk), lists[r][j].mb);
        printf("\n");
    }
    Check c = schedule_check(sched, S, V, M, lists, counts, d, NULL, NULL, 0);
    if (!c.ok) return printf("invalid: %s\n", c.why), 1;
    double want = schedule_bubble_formula(sched, S, V, M, d);
    printf("makespan %.3f; bubble %.4f of S x makespan (closed form ", c.makespan, c.bubble_total);
    if (want >= 0) printf("%.4f)\n", want);
    else printf("none)\n");
    for (int r = 0; r < S; r++) {
        double peak = schedule_peak_formula(sched, S, V, M, r);
        printf("  rank %d: busy %.3f, ends at %.3f, bubble %.4f; peak activations %.2f microbatches", r, c.busy[r], c.end[r],
               c.bubble[r], c.peak[r]);
        if (peak >= 0) printf(" (closed form %.0f)", peak);
        printf("\n");
    }
    drop(lists, S);
    return 0;
}
