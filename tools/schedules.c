/*
 * tools/schedules.c: the pipeline schedules of schedules.h, checked and measured without
 * MPI. For one schedule it prints every rank's list of actions, then runs them with the
 * given durations and latency and prints the bubble and the peak activations per rank,
 * beside the closed forms; --grid checks every schedule over S = 1..8, V = 1..4,
 * M = 1..32 and fails (exit 1) on any list that is invalid or disagrees with its formula.
 *
 *   tools/schedules zb1 4 1 8                    # schedule, S, V, M
 *   tools/schedules zbv 4 2 8 --f 1 --i 1 --w 1 --latency 0.1
 *   tools/schedules dualpipev 4 2 8 --fb 2.5      # an F&B faster than its F and B in turn
 *   tools/schedules --grid
 *   tools/schedules --svg out.svg 4 8 naive.json gpipe.json ...   # the picture of make run
 *
 * --svg draws every schedule for S ranks and M microbatches (2 chunks per rank for
 * interleaved, zbv and dualpipev), one lane group each, on one time axis: the steps measured by
 * train_pp.c --trace, one trace file per schedule in the order of schedules.h, beside the
 * checker's run of the same lists with F, I and W taking one unit each and no latency.
 *
 * Bad input exits 2 with a message naming what is wrong: a number out of its range (cli.h's
 * checked parsing: nan, inf and negative durations are refused), a flag without its value or
 * given twice, a trace that is not one of train_pp.c's, an --svg FILE that is not a picture
 * of this tool (it replaces only its own, as the programs do their outputs: cli.h). The
 * picture is written whole, into FILE.tmp-PID renamed over FILE. tests/fuzz.c drives the
 * parsers (make fuzz).
 */
#include "../schedules.h"
#include "../cli.h"

#include <stdlib.h>

static int usage(void) {
    fprintf(stderr, "usage: tools/schedules SCHEDULE S V M [--f X] [--i X] [--w X] [--fb X] [--latency X] | tools/schedules --grid\n"
                    "       tools/schedules --svg FILE S M [TRACE...]\n");
    return 2;
}

// ----------------------------------------------------------------------------
// the parsers: each returns NULL, or what is wrong (in cli_error)

// S, V or M: an integer from lo to hi.
static const char* parse_count(const char* name, const char* s, int lo, int hi, int* out) {
    long v;
    if (cli_long(name, s, lo, hi, &v) == NULL) return *out = (int)v, NULL;
    snprintf(cli_error, sizeof cli_error, "%s must be an integer from %d to %d, got '%s'", name, lo, hi, s);
    return cli_error;
}

// tools/schedules SCHEDULE S V M [--f X] [--i X] [--w X] [--fb X] [--latency X] (argv[1] on)
typedef struct {
    int sched, S, V, M;
    Durations d;
} Run;
static const char* parse_run(int argc, char** argv, Run* run) {
    *run = (Run){.d = {1, 1, 1, 0, 0}};
    if (argc < 5) return snprintf(cli_error, sizeof cli_error, "a schedule, S, V and M are needed"), cli_error;
    const char* err;
    if ((err = schedule_parse(argv[1], &run->sched, cli_error, sizeof cli_error))) return err;
    if ((err = parse_count("S", argv[2], 1, 64, &run->S)) || (err = parse_count("V", argv[3], 1, 4, &run->V)) ||
        (err = parse_count("M", argv[4], 1, 65536, &run->M)))
        return err;
    for (int i = 5; i < argc; i += 2) {
        const char* flag = argv[i];
        float x;
        int latency = !strcmp(flag, "--latency");
        if (strcmp(flag, "--f") && strcmp(flag, "--i") && strcmp(flag, "--w") && strcmp(flag, "--fb") && !latency)
            return snprintf(cli_error, sizeof cli_error, "unknown flag '%s'", flag), cli_error;
        for (int j = 5; j < i; j += 2) // one rule for every program and tool: a flag given twice is refused
            if (!strcmp(argv[j], flag))
                return snprintf(cli_error, sizeof cli_error, "%s is given twice: give each flag once", flag), cli_error;
        if (i + 1 == argc) return snprintf(cli_error, sizeof cli_error, "%s needs a value", flag), cli_error;
        if ((err = cli_float(flag + 2, argv[i + 1], 0, 1e6, !latency, &x))) return err; // durations above 0
        double* to = latency ? &run->d.latency : !strcmp(flag, "--fb") ? &run->d.fb : flag[2] == 'f' ? &run->d.f
                   : flag[2] == 'i' ? &run->d.i : &run->d.w;
        *to = x;
    }
    int V = schedule_chunks(run->sched, run->V);
    if (V != run->V) // the V given is never silently replaced (audit 5: D5, D6)
        return snprintf(cli_error, sizeof cli_error, "V %d: %s runs %d chunk%s a rank; give V %d", run->V, argv[1], V,
                        V == 1 ? "" : "s", V), cli_error;
    return schedule_rule(run->sched, run->S, run->V, run->M, cli_error, sizeof cli_error);
}

// The actions of a train_pp.c --trace of S ranks and M microbatches, at most max of them;
// NULL, or why the file is not such a trace.
static const char* read_trace(const char* path, int S, int M, PipeEvent* ev, int max, int* n) {
    *n = trace_read_pipeline(path, ev, max);
    if (*n == 0)
        return snprintf(cli_error, sizeof cli_error, "trace '%s' has no pipeline actions: write it with train_pp "
                        "--trace", path), cli_error;
    if (*n == max)
        return snprintf(cli_error, sizeof cli_error, "trace '%s' has %d pipeline actions or more, more than a picture "
                        "takes", path, max), cli_error;
    for (int i = 0; i < *n; i++) {
        const PipeEvent* e = &ev[i];
        if (e->rank < 0 || e->rank >= S || e->mb < 0 || e->mb >= M || !strchr("FBIW", e->op) || e->op == 0 ||
            !isfinite(e->t0) || !isfinite(e->dur) || e->t0 < 0 || e->dur < 0)
            return snprintf(cli_error, sizeof cli_error, "trace '%s': its action %d (%c%d of rank %d) is not one of a "
                            "pipeline of %d ranks and %d microbatches", path, i + 1, e->op ? e->op : '?', e->mb,
                            e->rank, S, M), cli_error;
    }
    // the picture's S and M are the trace's: every rank and every microbatch in it (audit 5: TR6, TR7)
    char* seen = callocCheck((size_t)S + (size_t)M, 1); // ranks first, then microbatches
    for (int i = 0; i < *n; i++) seen[ev[i].rank] = seen[S + ev[i].mb] = 1;
    const char* why = NULL;
    for (int k = 0; k < S + M && !why; k++)
        if (!seen[k])
            why = (snprintf(cli_error, sizeof cli_error, "trace '%s' has no action of %s %d: it is not a run of %d "
                            "ranks and %d microbatches", path, k < S ? "rank" : "microbatch", k < S ? k : k - S, S, M),
                   cli_error);
    free(seen);
    return why;
}

// ----------------------------------------------------------------------------
// the three uses

// Every rank's list, built.
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

// The grid: every valid (schedule, S, V, M), with f = i = w = 1, an F&B their sum, and no
// latency. The bubble must equal its closed form where there is one (zb1's when M >= S;
// below that, at most 1f1b's), the peak its formula and schedule_peak_held's walk; zbv must idle no more than 1f1b, and
// less than 5% of the time once M >= 4S.
static int grid(void) {
    long lists_checked = 0, failures = 0;
    Durations d = {1, 1, 1, 0, 0};
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
                    double stage[4] = {1.0 / chunks, 1.0 / chunks, 1.0 / chunks, 1.0 / chunks};
                    for (int r = 0; r < S && c.ok; r++) {
                        double peak = schedule_peak_formula(sched, S, chunks, M, r);
                        if (peak >= 0 && fabs(c.peak[r] - peak) > 1e-9) bad = 1;
                        if (fabs(c.peak[r] - schedule_peak_held(sched, S, chunks, M, r, stage)) > 1e-9) bad = 1;
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
    // microbatch 1 before B of 0; F1 comes from rank 0 after its B0, which needs rank 1's
    // B0), an action run twice, a W without its I, F's out of microbatch order, and an
    // F&B whose B comes before its F
    Action r0[] = {act('F', 0, 0), act('B', 0, 0), act('F', 0, 1), act('B', 0, 1)};
    Action r1[] = {act('F', 1, 0), act('F', 1, 1), act('B', 1, 0), act('B', 1, 1)};
    Action twice[] = {act('F', 0, 0), act('F', 0, 0), act('B', 0, 0)}, lone_w[] = {act('F', 0, 0), act('W', 0, 0)};
    Action order[] = {act('F', 0, 1), act('F', 0, 0), act('B', 0, 0), act('B', 0, 1)};
    Action early[] = {act('F', 0, 0), {'&', 1, 0, 1, 0}, act('B', 0, 0)};
    Check c1 = schedule_check(SCHEDULE_1F1B, 2, 1, 2, (Action*[]){r0, r1}, (int[]){4, 4}, d, NULL, NULL, 0);
    Check c2 = schedule_check(SCHEDULE_1F1B, 1, 1, 1, (Action*[]){twice}, (int[]){3}, d, NULL, NULL, 0);
    Check c3 = schedule_check(SCHEDULE_ZB1, 1, 1, 1, (Action*[]){lone_w}, (int[]){2}, d, NULL, NULL, 0);
    Check c4 = schedule_check(SCHEDULE_1F1B, 1, 1, 2, (Action*[]){order}, (int[]){4}, d, NULL, NULL, 0);
    Check c5 = schedule_check(SCHEDULE_DUALPIPEV, 1, 2, 1, (Action*[]){early}, (int[]){3}, d, NULL, NULL, 0);
    int caught = !c1.ok && strstr(c1.why, "deadlock") && !c2.ok && !c3.ok && !c4.ok && strstr(c4.why, "order") &&
                 !c5.ok && strstr(c5.why, "before its F");
    printf("%s the checker catches a cycle of waits (%s), an action run twice (%s), a W without its I (%s), F's out "
           "of microbatch order (%s), an F&B's B before its F (%s)\n",
           caught ? "PASSED" : "FAILED", c1.why, c2.why, c3.why, c4.why, c5.why);
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

// The picture's file, as svg() writes it: its first three lines, then one element a line, and
// "</svg>" last (cli.h's recognisers: --svg replaces only a picture of this tool, whole).
#define SVG_FIRST "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\""
#define SVG_TITLE "<text x=\"20\" y=\"22\" font-size=\"15\">Pipeline schedules, "
static const char* svg_recognise(FILE* f) {
    char line[1024];
    int ended = 1, end = 0;
    long n, no = 0;
    while ((n = recognise_line(f, line, sizeof line, &ended)) >= 0) {
        no++;
        if (end) NOT_OURS("goes on after its end (line %ld)", no);
        if ((no == 1 && strncmp(line, SVG_FIRST, strlen(SVG_FIRST))) || (no == 2 && strncmp(line, "<rect width=", 12)) ||
            (no == 3 && strncmp(line, SVG_TITLE, strlen(SVG_TITLE))))
            NOT_OURS("does not begin as tools/schedules' picture does (line %ld)", no);
        if (!ended || !LINE_FITS(line, n) || line[0] != '<') NOT_OURS("has a line %ld that tools/schedules does not write", no);
        end = !strcmp(line, "</svg>\n");
    }
    if (ferror(f)) NOT_OURS("cannot be read");
    if (!end) NOT_OURS("is cut short (it does not end with '</svg>')");
    return NULL;
}
// Where --svg may write: NULL, or why not (in cli_error). As for the programs' outputs: a
// symbolic link is followed; nothing, an empty file or a picture of this tool is replaced,
// anything else refused, before anything is read or written.
static const char* svg_output(const char* given, char* path, size_t n) {
    const char* why = !given[0] ? "is empty: give a file name" : output_follow(given, path, n);
    char dir[4096];
    const char* name;
    struct stat st;
    if (!why) split_path(path, dir, sizeof dir, &name);
    if (!why && access(dir, W_OK) != 0) why = "is in a folder that does not exist or cannot be written";
    if (why) return snprintf(cli_error, sizeof cli_error, "'%s' %s; nothing was written", given, why), cli_error;
    int held = path_holds(path, svg_recognise);
    if (held == PATH_NOT_FILE)
        return snprintf(cli_error, sizeof cli_error, "'%s' is %s, not a regular file; nothing was written", given,
                        lstat(path, &st) == 0 ? file_kind(st.st_mode) : "something that cannot be looked at"), cli_error;
    if (held == PATH_FOREIGN)
        return snprintf(cli_error, sizeof cli_error, "'%s' exists and is not a picture of tools/schedules (a run replaces "
                        "only its own files): it %s; nothing was written", given, path_why), cli_error;
    return NULL;
}

static int svg(int argc, char** argv) {
    if (argc < 5) return usage();
    char path[4096];
    int S, M, n_traces = argc - 5;
    const char* err;
    if ((err = parse_count("S", argv[3], 1, 64, &S)) || (err = parse_count("M", argv[4], 1, 65536, &M)))
        return fprintf(stderr, "tools/schedules --svg: %s\n", err), 2;
    for (int k = 5; k < argc; k++)
        if (!strcmp(argv[k], "--svg"))
            return fprintf(stderr, "tools/schedules --svg: --svg is given twice: give each flag once\n"), 2;
    if (n_traces > N_SCHEDULES)
        return fprintf(stderr, "tools/schedules --svg: %d traces, but one per schedule at most (%d)\n", n_traces,
                       N_SCHEDULES), 2;
    enum { MAX_EV = 8192 };
    static PipeEvent ev[N_SCHEDULES][MAX_EV];
    int got[N_SCHEDULES] = {0};
    if ((err = svg_output(argv[2], path, sizeof path))) return fprintf(stderr, "tools/schedules --svg: %s\n", err), 2;
    for (int k = 0; k < n_traces; k++) // every trace read before the picture replaces anything
        if ((err = read_trace(argv[5 + k], S, M, ev[k], MAX_EV, &got[k])))
            return fprintf(stderr, "tools/schedules --svg: %s\n", err), 2;
    WholeFile whole;
    FILE* f = whole_open(&whole, path, "picture", svg_recognise, SVG_FIRST);
    double H = 80 + N_SCHEDULES * ((n_traces ? 2 : 1) * S * 11 + 46), W = 1000;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", W, H, W, H);
    fprintf(f, "<text x=\"20\" y=\"22\" font-size=\"15\">Pipeline schedules, %d ranks, %d microbatches: one training step "
               "each, %s (F = I = W)</text>\n", S, M, n_traces ? "measured (train_pp.c --trace) and simulated" : "simulated");
    fprintf(f, "<text x=\"20\" y=\"40\">F blue, B or I orange, W green (an F&amp;B: its F, then its B); white: the rank waits. Measured with more ranks "
               "than cores, waits include</text>\n<text x=\"20\" y=\"55\">other ranks' turns on a core; the simulation "
               "shows the schedule itself. Each row group: rank 0 at the top.</text>\n");
    double y = 70;
    static int rank[MAX_EV], mb[MAX_EV];
    static char op[MAX_EV];
    static double t0[MAX_EV], t1[MAX_EV];
    for (int sched = 0; sched < N_SCHEDULES; sched++) {
        int V = schedule_chunks(sched, 2), counts[64], n = 0;
        char rule[256], title[96];
        if (schedule_rule(sched, S, V, M, rule, sizeof rule)) continue;
        fprintf(f, "<text x=\"20\" y=\"%.0f\" font-weight=\"bold\">%s</text>\n", y + 10, schedule_names[sched]);
        if (sched < n_traces) { // measured: the trace's actions, each rank from its first
            const PipeEvent* e = ev[sched];
            double start = e[0].t0, end = 0, busy = 0;
            for (int i = 0; i < got[sched]; i++) start = e[i].t0 < start ? e[i].t0 : start;
            for (int i = 0; i < got[sched]; i++) {
                rank[i] = e[i].rank, op[i] = e[i].op, mb[i] = e[i].mb;
                t0[i] = e[i].t0 - start, t1[i] = t0[i] + e[i].dur, busy += e[i].dur;
                end = t1[i] > end ? t1[i] : end;
            }
            snprintf(title, sizeof title, "measured, bubble %.2f", end > 0 ? 1 - busy / (S * end) : 0);
            y += svg_lanes(f, y + 14, S, got[sched], rank, op, mb, t0, t1, end > 0 ? end : 1, title) + 4;
        }
        Action** lists = build(sched, S, V, M, counts);
        int stride = 3 * V * M;
        double* s0 = mallocCheck(sizeof(double) * S * stride), *s1 = mallocCheck(sizeof(double) * S * stride);
        Check c = schedule_check(sched, S, V, M, lists, counts, (Durations){1, 1, 1, 0, 0}, s0, s1, stride);
        for (int r = 0; r < S; r++)
            for (int j = 0; j < counts[r]; j++) { // an F&B drawn as its F (1 unit), then its B (2)
                Action part[2];
                int parts = action_parts(&lists[r][j], part);
                double at = s0[r * stride + j], unit = (s1[r * stride + j] - at) / (parts == 2 ? 3 : 1);
                for (int q = 0; q < parts && n < MAX_EV; q++, n++) {
                    rank[n] = r, op[n] = part[q].op, mb[n] = part[q].mb;
                    t0[n] = at + (q == 1 ? unit : 0), t1[n] = q == 0 && parts == 2 ? at + unit : s1[r * stride + j];
                }
            }
        snprintf(title, sizeof title, "simulated, bubble %.2f", c.bubble_total);
        y += svg_lanes(f, y + 14, S, n, rank, op, mb, t0, t1, c.makespan, title) + 28;
        free(s0), free(s1);
        drop(lists, S);
    }
    fprintf(f, "</svg>\n");
    whole_close(&whole);
    return 0;
}

// One schedule: every rank's list, then the checker's run of it.
static int one(const Run* run) {
    int sched = run->sched, S = run->S, V = run->V, M = run->M, counts[64];
    Durations d = run->d;
    Action** lists = build(sched, S, V, M, counts);
    printf("%s, S=%d, V=%d, M=%d; F %g, I %g, W %g (B = I + W), F&B %g, latency %g\n", schedule_names[sched], S, V, M,
           d.f, d.i, d.w, d.fb > 0 ? d.fb : d.f + d.i + d.w, d.latency);
    printf("  (each action: what, chunk.microbatch)\n");
    for (int r = 0; r < S; r++) {
        printf("  rank %d:", r);
        for (int j = 0; j < counts[r]; j++) {
            const Action* a = &lists[r][j];
            if (a->op == '&') printf(" F%d.%d&B%d.%d", a->chunk, a->mb, a->b_chunk, a->b_mb);
            else printf(" %c%d.%d", a->op, a->chunk, a->mb);
        }
        printf("\n");
    }
    Check c = schedule_check(sched, S, V, M, lists, counts, d, NULL, NULL, 0);
    drop(lists, S);
    if (!c.ok) return printf("invalid: %s\n", c.why), 1;
    double want = schedule_bubble_formula(sched, S, V, M, d);
    printf("makespan %.3f; bubble %.4f of S x makespan (closed form ", c.makespan, c.bubble_total);
    if (want >= 0) printf("%.4f)\n", want);
    else printf("none)\n");
    for (int r = 0; r < S; r++)
        printf("  rank %d: busy %.3f, ends at %.3f, bubble %.4f; peak activations %.2f microbatches (closed form %.2f)\n",
               r, c.busy[r], c.end[r], c.bubble[r], c.peak[r], schedule_peak_formula(sched, S, V, M, r));
    return 0;
}

#ifndef SCHEDULES_NO_MAIN // tests/fuzz.c takes the parsers above without this program
int main(int argc, char** argv) {
    if (argc == 2 && !strcmp(argv[1], "--grid")) return grid();
    if (argc >= 2 && !strcmp(argv[1], "--svg")) return svg(argc, argv);
    if (argc < 5) return usage();
    Run run;
    const char* err = parse_run(argc, argv, &run);
    if (err) return fprintf(stderr, "tools/schedules: %s\n", err), 2;
    return one(&run);
}
#endif
