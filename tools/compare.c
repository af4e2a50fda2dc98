/*
 * tools/compare.c: are two runs the same? Compares the per-step losses of two --log files
 * and the parameters (and optimizer state) of two --save checkpoints.
 *
 *   make tools/compare
 *   tools/compare a.csv b.csv a.ckpt b.ckpt          # exit 0: identical, bit for bit
 *   tools/compare --tolerance 1e-6 a.csv b.csv a.ckpt b.ckpt
 *
 * Prints "identical", or the first step whose loss differs and the largest relative
 * difference of the losses and of the parameters. Logs are compared over the steps they
 * share (a run resumed with a new log logs only the steps it trained); both must end at
 * the same step. With --tolerance X (a decimal number from 0 to 1), differences whose
 * relative size stays below X pass (exit 0) and are reported. Exit 1 if the runs differ
 * beyond that; 2 for bad usage or a file that cannot be read, is not what it should be,
 * or is cut short (a log whose last line has no end, a checkpoint shorter than its header
 * says).
 */
#include "../ckpt.h"

// The log's lines: losses[step - first] for its steps; *first is its first step. Every line
// is checked: "step,train loss,..." with the step one more than the line before, and a
// finished line (a log cut short ends in the middle of one).
static double* read_losses(const char* path, long* n, long* first) {
    FILE* f = open_input(path, "log");
    long cap = 1024;
    double* loss = mallocCheck(cap * sizeof(double));
    char line[512];
    *n = 0;
    if (!fgets(line, sizeof line, f) || strncmp(line, LOG_HEADER, strlen(LOG_HEADER)) != 0)
        fatal("'%s' is not a --log file (no header)", path);
    for (long line_no = 2; fgets(line, sizeof line, f); line_no++) {
        char *end, *after = NULL;
        errno = 0;
        long step = strtol(line, &end, 10);
        double l = end > line && *end == ',' ? strtod(end + 1, &after) : 0;
        if (!strchr(line, '\n'))
            fatal("'%s':%ld: the line %s", path, line_no, feof(f) ? "has no end: the log is cut short" : "is too long");
        if (end == line || *end != ',' || after == end + 1 || *after != ',' || errno || step < 0)
            fatal("'%s':%ld: not a line of a --log file: '%.*s'", path, line_no, (int)strcspn(line, "\n"), line);
        if (*n == 0) *first = step;
        if (step != *first + *n) fatal("'%s':%ld: step %ld out of order", path, line_no, step);
        if (*n == cap) {
            cap *= 2;
            loss = reallocCheck(loss, cap * sizeof(double));
        }
        loss[(*n)++] = l;
    }
    if (ferror(f)) fatal("cannot read log '%s': %s", path, strerror(errno));
    fclose(f);
    return loss;
}

// The checkpoint's values, read as a run reads them: its header checked (it refuses a header
// that claims more than the file holds), and the checksum of every byte, so that a flipped
// byte is "corrupt", never compared as a value.
static float* read_ckpt(const char* path, CkptHeader* h, long* n) {
    FILE* f = open_input(path, "checkpoint");
    uint64_t sum = FNV_START, stored;
    ckpt_read_header(f, path, h, &sum);
    ckpt_header_free(h);
    *n = ckpt_floats(h);
    float* x = mallocCheck((size_t)*n * sizeof(float));
    if (fread(x, sizeof(float), (size_t)*n, f) != (size_t)*n) fatal("checkpoint '%s' is truncated", path);
    sum = fnv1a(sum, x, (size_t)*n * sizeof(float));
    if (fread(&stored, 1, sizeof stored, f) != sizeof stored) fatal("checkpoint '%s' is truncated", path);
    if (stored != sum) fatal("checkpoint '%s' is corrupt (checksum mismatch)", path);
    fclose(f);
    return x;
}

#ifndef COMPARE_NO_MAIN // tests/fuzz.c takes the readers above, not what follows
// Two logged losses are the same when their text is: the same number, or both nan (a run that
// diverged logs nan, and two runs that diverged alike are the same run).
static int same_loss(double a, double b) { return a == b || (isnan(a) && isnan(b)); }
static double rel(double a, double b) {
    if (same_loss(a, b)) return 0;
    double d = fabs(a - b), s = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
    return isnan(d) ? INFINITY : d / (s > 1e-30 ? s : 1e-30);
}

// A file that cannot be read is not "the runs differ": exit 2.
static void fatal_exit_2(const char* message) {
    fprintf(stderr, "tools/compare: %s\n", message);
    exit(2);
}

int main(int argc, char** argv) {
    fatal_end = fatal_exit_2;
    float tol = 0;
    int a = 1;
    for (int i = 3; i < argc; i++) // one rule for every program and tool: a flag given twice is refused
        if (!strcmp(argv[i], "--tolerance") && argc > 1 && !strcmp(argv[1], "--tolerance"))
            fatal("--tolerance is given twice: give each flag once");
    if (argc > 1 && !strcmp(argv[1], "--tolerance")) {
        const char* err = argc > 2 ? cli_float("tolerance", argv[2], 0.0, 1.0, 0, &tol) : "--tolerance needs a value";
        if (err) fatal("%s", err);
        a = 3;
    }
    if (argc - a != 4) {
        fprintf(stderr, "usage: tools/compare [--tolerance X] a.csv b.csv a.ckpt b.ckpt\n");
        return 2;
    }
    // the logs are compared over the steps they share (a resumed run logs only its own)
    long na, nb, fa = 1, fb = 1;
    double *la = read_losses(argv[a], &na, &fa), *lb = read_losses(argv[a + 1], &nb, &fb);
    long first = -1, lo = fa > fb ? fa : fb, hi = fa + na < fb + nb ? fa + na : fb + nb;
    double loss_rel = 0;
    for (long step = lo; step < hi; step++) {
        double x = la[step - fa], y = lb[step - fb];
        if (!same_loss(x, y) && first < 0) first = step;
        double r = rel(x, y);
        loss_rel = r > loss_rel ? r : loss_rel;
    }
    CkptHeader ha, hb;
    long pa, pb;
    float *xa = read_ckpt(argv[a + 2], &ha, &pa), *xb = read_ckpt(argv[a + 3], &hb, &pb);
    int same_shape = pa == pb && ha.n_params == hb.n_params && fa + na == fb + nb && hi > lo;
    long differ = 0;
    double param_rel = 0, scale = 0;
    for (long i = 0; i < (pa < pb ? pa : pb); i++) scale = fabs(xa[i]) > scale ? fabs(xa[i]) : scale;
    for (long i = 0; i < (pa < pb ? pa : pb); i++) {
        if (memcmp(&xa[i], &xb[i], sizeof(float))) differ++;
        // relative to the largest parameter: an element near zero is not a large difference
        double r = fabs((double)xa[i] - xb[i]) / (scale > 0 ? scale : 1);
        param_rel = r > param_rel ? r : param_rel;
    }
    if (same_shape && first < 0 && differ == 0) {
        printf("identical: %ld steps, %ld parameters and optimizer values, bit for bit\n", hi - lo, pa);
        return 0;
    }
    if (!same_shape) {
        printf("different runs: steps %ld-%ld vs %ld-%ld, %ld vs %ld values\n", fa, fa + na - 1, fb, fb + nb - 1, pa, pb);
        return 1;
    }
    if (first < 0) // the same losses at every step, other values (a run saved at another moment, a corrupt save)
        printf("differ: the losses are the same at every step (%ld); %ld of %ld values differ, by up to %.2e of the "
               "largest\n", hi - lo, differ, pa, param_rel);
    else
        printf("differ: first at step %ld; losses up to %.2e relative; %ld of %ld values differ, by up to %.2e of "
               "the largest\n", first, loss_rel, differ, pa, param_rel);
    return (loss_rel < tol && param_rel < tol) ? 0 : 1;
}
#endif
