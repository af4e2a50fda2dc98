/*
 * tools/report.c: the table and pictures of the main job (make run; tools/run_all.sh
 * makes the runs, then calls this).
 *
 *   tools/report OUT RUN...      # RUN: a name under OUT/runs/, the first one train.c's;
 *                                # NAME@REF: compared with run REF instead (train.c with
 *                                # another model: --experts X, --model gpt)
 *
 * For every run it reads OUT/runs/RUN.sum (--summary), RUN.csv (--log) and RUN.cmp (what
 * tools/compare said of it against the first run), and prints one table row: program,
 * layout, ranks, validation loss, whether it is the same as train.c, time, tokens/s,
 * bytes sent per step per rank and memory per rank (each measured, with the formula's
 * prediction beside it), pipeline bubble. Then train.c's names, and a note for any run
 * whose names differ. It writes OUT/loss.svg (every run's training loss, overlaid, a panel a
 * model) and,
 * from the first run with a trace (RUN.json, --trace), OUT/pipeline.svg (one step of the
 * pipeline, measured).
 */
#include "summary.h"

#define MAX_RUNS 16

typedef struct {
    char name[64];
    int ref;      // the run it is compared with (0: train.c's)
    int is_ref;   // a later run is compared with this one (train.c --experts X): a reference itself
    Summary s;    // its --summary
    char cmp[512];
    double* loss; // per-step training loss
    long n_loss;
} Run;

static void read_log(Run* r, const char* path) {
    FILE* f = open_tool_file(path, "log", 256L << 20);
    char line[512];
    long cap = 1024;
    r->loss = mallocCheck(sizeof(double) * cap);
    if (!fgets(line, sizeof line, f)) fatal("'%s' is empty", path);
    while (fgets(line, sizeof line, f)) {
        long step;
        double l;
        if (sscanf(line, "%ld,%lf", &step, &l) != 2) continue;
        if (r->n_loss == cap) r->loss = reallocCheck(r->loss, sizeof(double) * (cap *= 2));
        r->loss[r->n_loss++] = l;
    }
    fclose(f);
}

static void size_text(char* out, size_t n, double b) {
    if (b < 1e3) snprintf(out, n, "%.0f B", b);
    else if (b < 1e6) snprintf(out, n, "%.1f KB", b / 1e3);
    else snprintf(out, n, "%.2f MB", b / 1e6);
}

// "yes", or where and by how much the run differs from train.c's
static void same_text(char* out, size_t n, const Run* r, const Run* ref) {
    int names_same = r->s.n_names == ref->s.n_names;
    for (int i = 0; names_same && i < r->s.n_names; i++) names_same = !strcmp(r->s.names[i], ref->s.names[i]);
    if (!strncmp(r->cmp, "identical", 9) && names_same && r->s.val_loss == ref->s.val_loss) {
        snprintf(out, n, "yes");
        return;
    }
    const char* first = strstr(r->cmp, "first at step");
    if (first) snprintf(out, n, "no: %.*s", (int)strcspn(first, ";"), first);
    else snprintf(out, n, "no: %s", names_same ? r->cmp : "different names");
}

// ----------------------------------------------------------------------------
// loss.svg: every run's training loss (means over windows of steps), overlaid

static const char* colours[] = {"#222222", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"};

// One panel per model (a reference run and the runs compared with it), stacked: each its own
// step axis and range, its runs overlaid, the first widest, underneath, so that identical
// curves show as one striped line and a run that drifted would separate at once.
static void loss_panel(FILE* f, Run* runs, int n, int group, double y0, double pw, double ph, double x0) {
    long steps = runs[group].n_loss;
    int points = steps < 100 ? (int)steps : 100, members[MAX_RUNS], m = 0;
    long window = steps > 0 ? (steps + points - 1) / points : 1;
    for (int k = 0; k < n; k++)
        if (k == group || (!runs[k].is_ref && runs[k].ref == group)) members[m++] = k;
    double lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < m; j++)
        for (long i = 0; i + window <= runs[members[j]].n_loss; i += window) {
            double s = 0;
            for (long t = i; t < i + window; t++) s += runs[members[j]].loss[t];
            lo = s / window < lo ? s / window : lo, hi = s / window > hi ? s / window : hi;
        }
    if (!(hi > lo)) hi = lo + 1;
    const char* model = runs[group].s.model; // "gpt vocab=27 ... experts=4 ...": the panel says which model it is
    const char* experts = strstr(model, " experts=");
    int n_experts = experts ? atoi(experts + 9) : 0;
    char which[64] = "";
    if (model[0])
        snprintf(which, sizeof which, ", the %s%s", !strncmp(model, "gpt", 3) ? "GPT" : "MLP",
                 n_experts > 0 ? " with experts" : "");
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"13\">%s (%s)%s: mean over %ld steps</text>\n", x0, y0 - 8,
            runs[group].s.program, runs[group].s.layout, which, window);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#999\"/>\n", x0, y0, pw, ph);
    for (int t = 0; t <= 4; t++) { // axes: 5 ticks each
        double v = lo + (hi - lo) * t / 4, y = y0 + ph - ph * t / 4, st = (double)steps * t / 4, x = x0 + pw * t / 4;
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", x0 - 6, y + 4, v);
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.0f</text>\n", x, y0 + ph + 16, st);
    }
    for (int j = 0; j < m; j++) {
        const Run* r = &runs[members[j]];
        fprintf(f, "<polyline class=\"curve\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" points=\"",
                colours[j % 8], 1.0 + 1.6 * (m - 1 - j));
        for (long i = 0; i + window <= r->n_loss && steps > 0; i += window) {
            double s = 0;
            for (long t = i; t < i + window; t++) s += r->loss[t];
            fprintf(f, "%.1f,%.1f ", x0 + pw * (i + window / 2.0) / steps, y0 + ph - ph * (s / window - lo) / (hi - lo));
        }
        fprintf(f, "\"/>\n");
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"3\"/>\n",
                x0 + pw + 20, y0 + 10 + 20.0 * j, x0 + pw + 40, y0 + 10 + 20.0 * j, colours[j % 8]);
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">%s, %d rank%s</text>\n", x0 + pw + 46, y0 + 14 + 20.0 * j,
                r->s.program, r->s.ranks, r->s.ranks > 1 ? "s" : "");
    }
}
static void write_loss_svg(const char* path, Run* runs, int n) {
    FILE* f = fopen(path, "w");
    if (!f) fatal("cannot create '%s': %s", path, strerror(errno));
    int groups[MAX_RUNS], g = 0;
    for (int k = 0; k < n; k++)
        if (k == 0 || runs[k].is_ref) groups[g++] = k;
    double x0 = 60, pw = 560, ph = 220, gap = 70, W = 860, H = 40 + g * (ph + gap);
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"15\">Training loss of every run against its steps, one panel a "
               "model: the curves lie on top of each other</text>\n", x0);
    for (int i = 0; i < g; i++) loss_panel(f, runs, n, groups[i], 60 + i * (ph + gap), pw, ph, x0);
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0) fatal("cannot write '%s'", path);
}

// ----------------------------------------------------------------------------
// pipeline.svg: one measured training step of the pipeline run, one row per stage

static void write_pipeline_svg(const char* path, const char* trace, const Run* r) {
    enum { MAX_EV = 4096 };
    static PipeEvent ev[MAX_EV];
    static int pid[MAX_EV], mb[MAX_EV], fwd[MAX_EV];
    static double ts[MAX_EV], dur[MAX_EV];
    int n = trace_read_pipeline(trace, ev, MAX_EV), stages = 0;
    for (int i = 0; i < n; i++) {
        pid[i] = ev[i].rank, ts[i] = ev[i].t0, dur[i] = ev[i].dur, fwd[i] = ev[i].op == 'F', mb[i] = ev[i].mb;
        stages = pid[i] + 1 > stages ? pid[i] + 1 : stages;
    }
    if (n == 0) fatal("'%s' has no pipeline events", trace);
    double start = ts[0], end = 0;
    for (int i = 0; i < n; i++) start = ts[i] < start ? ts[i] : start;
    for (int i = 0; i < n; i++) end = ts[i] + dur[i] - start > end ? ts[i] + dur[i] - start : end;
    double x0 = 80, pw = 760, rowh = 34, y0 = 50, H = y0 + stages * (rowh + 10) + 70, W = x0 + pw + 30;
    FILE* f = fopen(path, "w");
    if (!f) fatal("cannot create '%s': %s", path, strerror(errno));
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", W, H, W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"15\">%s: one training step, measured (%s)</text>\n", x0,
            r->s.program, r->s.layout);
    fprintf(f, "<text x=\"%.0f\" y=\"38\">forward passes blue, backward passes orange, numbered by microbatch; "
               "white: the stage waits</text>\n", x0);
    for (int s = 0; s < stages; s++) {
        double y = y0 + s * (rowh + 10);
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">stage %d</text>\n", x0 - 8, y + rowh / 2 + 4, s);
        fprintf(f, "<rect x=\"%.0f\" y=\"%.1f\" width=\"%.0f\" height=\"%.0f\" fill=\"white\" stroke=\"#bbb\"/>\n", x0,
                y, pw, rowh);
    }
    for (int i = 0; i < n; i++) {
        double x = x0 + pw * (ts[i] - start) / end, w = pw * dur[i] / end, y = y0 + pid[i] * (rowh + 10);
        fprintf(f, "<rect class=\"pass\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\" "
                   "stroke=\"white\" stroke-width=\"0.5\"/>\n", x, y, w > 0.5 ? w : 0.5, rowh,
                fwd[i] ? "#6fa8dc" : "#f6b26b");
        if (w > 12)
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>\n", x + w / 2, y + rowh / 2 + 4,
                    mb[i]);
    }
    double yaxis = y0 + stages * (rowh + 10) + 8;
    for (int t = 0; t <= 4; t++)
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.2f ms</text>\n", x0 + pw * t / 4, yaxis + 12,
                end / 1e3 * t / 4);
    double bub = 0;
    for (int q = 0; q < r->s.ranks; q++) bub += r->s.bubble[q] / r->s.ranks;
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">bubble, measured over the whole run: %.2f of the time, mean over "
               "stages</text>\n</svg>\n", x0, yaxis + 36, bub);
    if (fclose(f) != 0) fatal("cannot write '%s'", path);
}

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tools/report OUT RUN... (the first run is train.c's)\n");
        return 2;
    }
    const char* out = argv[1];
    int n = argc - 2 < MAX_RUNS ? argc - 2 : MAX_RUNS;
    Run* runs = callocCheck(n, sizeof(Run));
    char path[512];
    for (int k = 0; k < n; k++) {
        Run* r = &runs[k];
        snprintf(r->name, sizeof r->name, "%s", argv[k + 2]);
        char* at = strchr(r->name, '@');
        if (at) {
            *at = 0;
            for (int j = 0; j < k; j++)
                if (!strcmp(runs[j].name, at + 1)) r->ref = j, runs[j].is_ref = 1;
        }
        snprintf(path, sizeof path, "%s/runs/%s.sum", out, r->name);
        summary_read(&r->s, path);
        snprintf(path, sizeof path, "%s/runs/%s.csv", out, r->name);
        read_log(r, path);
        snprintf(path, sizeof path, "%s/runs/%s.cmp", out, r->name);
        struct stat st;
        FILE* f = stat(path, &st) == 0 ? open_tool_file(path, "comparison", 1L << 20) : NULL;
        if (f) {
            if (!fgets(r->cmp, sizeof r->cmp, f)) r->cmp[0] = 0;
            r->cmp[strcspn(r->cmp, "\n")] = 0;
            fclose(f);
        } else if (k == 0) {
            snprintf(r->cmp, sizeof r->cmp, "identical (the reference)");
        }
    }
    printf("| program | layout | ranks | val loss | same as train.c | time | tokens/s | sent/step/rank (formula) | "
           "memory/rank (formula) | bubble |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    int all_same = 1;
    for (int k = 0; k < n; k++) {
        Run* r = &runs[k];
        int q = 0; // the rank that sends the most, and the one that holds the most
        for (int i = 1; i < r->s.ranks; i++) q = r->s.sent[i] > r->s.sent[q] ? i : q;
        int m = 0;
        for (int i = 1; i < r->s.ranks; i++) m = r->s.mem[i] > r->s.mem[m] ? i : m;
        char same[300], s1[128], s2[32], m1[32], m2[32], bubble[64] = "-";
        same_text(same, sizeof same, r, &runs[r->ref]);
        if (k > 0 && r->is_ref) snprintf(same, sizeof same, "reference of the rows below"); // another model
        else all_same &= !strcmp(same, "yes");
        size_text(s1, sizeof s1, r->s.sent[q]);
        if (!strcmp(r->s.program, "train_3d.c")) { // and by axis, in the grid's order (tp fastest)
            static const char* const name[5] = {"tp", "dp", "pp", "cp", "ep"};
            static const int order[5] = {0, 3, 2, 1, 4};
            for (int j = 0, any = 0; j < 5; j++) {
                int x = order[j];
                if (x >= 3 && r->s.axis[q][x] == 0) continue; // no context or expert axis
                char a[32];
                size_text(a, sizeof a, r->s.axis[q][x]);
                size_t used = strlen(s1);
                snprintf(s1 + used, sizeof s1 - used, "%s%s %s", any++ ? ", " : ": ", name[x], a);
            }
        }
        size_text(s2, sizeof s2, r->s.sent_formula[q]);
        size_text(m1, sizeof m1, r->s.mem[m]);
        size_text(m2, sizeof m2, r->s.mem_formula[m]);
        double bmin = 1, bmax = 0, bsum = 0;
        int nb = 0;
        for (int i = 0; i < r->s.ranks; i++)
            if (r->s.bubble[i] >= 0) bmin = r->s.bubble[i] < bmin ? r->s.bubble[i] : bmin, bmax = r->s.bubble[i] > bmax ? r->s.bubble[i] : bmax, bsum += r->s.bubble[i], nb++;
        if (nb) snprintf(bubble, sizeof bubble, "%.2f (%.2f-%.2f)", bsum / nb, bmin, bmax);
        printf("| %s | %s | %d | %.4f | %s | %.1f s | %.0f | %s (%s) | %s (%s) | %s |\n", r->s.program, r->s.layout,
               r->s.ranks, r->s.val_loss, same, r->s.seconds, r->s.seconds > 0 ? r->s.steps * r->s.batch / r->s.seconds : 0.0, s1,
               s2, m1, m2, bubble);
    }
    printf("\nsent and memory: the rank that sends, or holds, the most; bubble: mean over stages (least-most).\n");
    for (int k = 0; k < n; k++) { // the names of each reference
        if (k > 0 && !runs[k].is_ref) continue;
        printf(k == 0 ? "\nnames generated by %s:" : "names generated by %s (%s):", runs[k].s.program, runs[k].s.layout);
        for (int i = 0; i < runs[k].s.n_names; i++) printf(" %s", runs[k].s.names[i]);
        printf("\n");
    }
    for (int k = 1; k < n; k++) {
        if (runs[k].is_ref) continue;
        const Run* ref = &runs[runs[k].ref];
        int same = runs[k].s.n_names == ref->s.n_names;
        for (int i = 0; same && i < runs[k].s.n_names; i++) same = !strcmp(runs[k].s.names[i], ref->s.names[i]);
        if (!same) {
            printf("NOTE: %s (%s) generated other names:", runs[k].s.program, runs[k].s.layout);
            for (int i = 0; i < runs[k].s.n_names; i++) printf(" %s", runs[k].s.names[i]);
            printf("\n");
        }
    }
    if (all_same) printf("every run generated the same names, and is the same as train.c bit for bit (each run as "
                         "train.c's run of the same model: the MLP, its mixture of experts, the GPT).\n");
    snprintf(path, sizeof path, "%s/loss.svg", out);
    write_loss_svg(path, runs, n);
    for (int k = 0; k < n; k++) {
        snprintf(path, sizeof path, "%s/runs/%s.json", out, runs[k].name);
        FILE* t = fopen(path, "r");
        if (!t) continue;
        fclose(t);
        char svg[512];
        snprintf(svg, sizeof svg, "%s/pipeline.svg", out);
        write_pipeline_svg(svg, path, &runs[k]);
        break;
    }
    return all_same ? 0 : 1;
}
