/*
 * tools/compare.c: are two runs the same? Compares the per-step losses of two --log files
 * and the parameters (and optimizer state) of two --save checkpoints.
 *
 *   make tools/compare
 *   tools/compare a.csv b.csv a.ckpt b.ckpt          # exit 0: identical, bit for bit
 *   tools/compare --tolerance 1e-6 a.csv b.csv a.ckpt b.ckpt
 *
 * Prints "identical", or the first step whose loss differs and the largest relative
 * difference of the losses and of the parameters. With --tolerance X, differences whose
 * relative size stays below X pass (exit 0) and are reported. Exit 1 if the runs differ
 * beyond that, 2 if a file cannot be read.
 */
#include "../model.h"

static double* read_losses(const char* path, long* n) {
    FILE* f = fopen(path, "r");
    if (!f) fatal("cannot open log '%s': %s", path, strerror(errno));
    long cap = 1024;
    double* loss = mallocCheck(cap * sizeof(double));
    char line[512];
    *n = 0;
    if (!fgets(line, sizeof line, f) || strncmp(line, "step,train_loss", 15) != 0)
        fatal("'%s' is not a --log file (no header)", path);
    while (fgets(line, sizeof line, f)) {
        long step;
        double l;
        if (sscanf(line, "%ld,%lf", &step, &l) != 2) fatal("'%s': bad line '%s'", path, line);
        if (*n == cap) {
            cap *= 2;
            loss = realloc(loss, cap * sizeof(double));
            if (!loss) fatal("out of memory");
        }
        loss[(*n)++] = l;
    }
    fclose(f);
    return loss;
}

static float* read_ckpt(const char* path, CkptHeader* h, long* n) {
    FILE* f = fopen(path, "rb");
    if (!f) fatal("cannot open checkpoint '%s': %s", path, strerror(errno));
    if (fread(h, 1, sizeof *h, f) != sizeof *h || memcmp(h->magic, CKPT_MAGIC, 8) != 0)
        fatal("'%s' is not a checkpoint", path);
    *n = ckpt_floats(h);
    float* x = mallocCheck((size_t)*n * sizeof(float));
    if (fread(x, sizeof(float), (size_t)*n, f) != (size_t)*n) fatal("checkpoint '%s' is truncated", path);
    fclose(f);
    return x;
}

static double rel(double a, double b) {
    double d = fabs(a - b), s = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
    return d == 0 ? 0 : d / (s > 1e-30 ? s : 1e-30);
}

int main(int argc, char** argv) {
    double tol = 0;
    int a = 1;
    if (argc > 2 && !strcmp(argv[1], "--tolerance")) {
        tol = atof(argv[2]);
        a = 3;
    }
    if (argc - a != 4) {
        fprintf(stderr, "usage: tools/compare [--tolerance X] a.csv b.csv a.ckpt b.ckpt\n");
        return 2;
    }
    fatal_exit_hook = exit;
    long na, nb;
    double *la = read_losses(argv[a], &na), *lb = read_losses(argv[a + 1], &nb);
    long first = -1;
    double loss_rel = 0;
    for (long i = 0; i < (na < nb ? na : nb); i++) {
        if (la[i] != lb[i] && first < 0) first = i + 1;
        double r = rel(la[i], lb[i]);
        loss_rel = r > loss_rel ? r : loss_rel;
    }
    CkptHeader ha, hb;
    long pa, pb;
    float *xa = read_ckpt(argv[a + 2], &ha, &pa), *xb = read_ckpt(argv[a + 3], &hb, &pb);
    int same_shape = pa == pb && na == nb && ha.n_params == hb.n_params;
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
        printf("identical: %ld steps, %ld parameters and optimizer values, bit for bit\n", na, pa);
        return 0;
    }
    if (!same_shape) {
        printf("different runs: %ld vs %ld steps, %ld vs %ld values\n", na, nb, pa, pb);
        return 1;
    }
    printf("differ: first at step %ld; losses up to %.2e relative; %ld of %ld values differ, by up to %.2e of "
           "the largest\n", first, loss_rel, differ, pa, param_rel);
    return (loss_rel < tol && param_rel < tol) ? 0 : 1;
}
