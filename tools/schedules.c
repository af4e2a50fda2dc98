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
 */
#include "../schedules.h"

#include <stdlib.h>

static int usage(void) {
    fprintf(stderr, "usage: tools/schedules SCHEDULE S V M [--f X] [--i X] [--w X] [--latency X] | tools/schedules --grid\n");
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
// most 1f1b's), the peak too; zbv must hold at most S microbatches and idle no more than
// 1f1b.
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

int main(int argc, char** argv) {
    if (argc == 2 && !strcmp(argv[1], "--grid")) return grid();
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
