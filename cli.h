/*
 * cli.h: the flags every program shares, their validation, and the lines every program
 * prints (configuration table, progress, results, the CSV log), so that all of them
 * accept the same flags and print the same way.
 *
 * A program adds its own flags (train_pp.c: --microbatches, --schedule, ...) as a table
 * of CliFlag and a handler; an unknown flag or a bad value prints a message naming the
 * flag and its accepted range, then the usage, to stderr, and exits with status 2.
 */
#ifndef CLI_H
#define CLI_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include <getopt.h>
#include <limits.h>

#include "model.h"
#include "data.h"

typedef struct {
    const char* data; // --data
    int max_line;     // --max-line
    Config model;     // --context --emb --hidden --layers (vocab comes from the data)
    long steps;       // --steps
    int batch;        // --batch
    Optimizer opt;    // --optimizer --lr --weight-decay --clip
    uint64_t seed;    // --seed
    long eval_every;  // --eval-every
    int samples;      // --samples
    const char* log;  // --log
    const char* save; // --save
    const char* load; // --load
    const char* trace; // --trace
    const char* summary; // --summary
    int quiet;        // --quiet
} Options;

// A flag: long name, the name of its value (NULL for a switch), and its help line.
typedef struct {
    const char* name;
    const char* value;
    const char* help;
} CliFlag;
// Handles flag `index` of the program's table; returns NULL or an error message.
typedef const char* (*CliHandler)(void* ctx, int index, const char* value);

static const CliFlag cli_common[] = {
    {"data", "FILE", "training text, one item per line (default names.txt)"},
    {"steps", "N", "training steps (default 25000; 0 only evaluates and samples)"},
    {"batch", "N", "rows per step, the global batch (default 32)"},
    {"lr", "X", "learning rate (default 0.1 for sgd, 0.003 for adamw)"},
    {"optimizer", "NAME", "sgd or adamw (default sgd)"},
    {"weight-decay", "X", "decoupled weight decay (default 0 for sgd, 0.01 for adamw)"},
    {"clip", "X", "clip the global gradient norm to X (default 0: off)"},
    {"context", "N", "characters of context T (default 16)"},
    {"emb", "N", "embedding size E (default 16)"},
    {"hidden", "N", "hidden size H (default 64)"},
    {"layers", "N", "hidden layers L (default 1)"},
    {"seed", "N", "seed of every random number (default 42)"},
    {"eval-every", "N", "report progress and validation loss every N steps (default 2500; 0: end only)"},
    {"samples", "N", "names to generate at the end (default 10)"},
    {"log", "FILE", "write a CSV line per step: step, train loss, val loss, ms, tokens/s"},
    {"save", "FILE", "write a checkpoint (parameters and optimizer state) at the end"},
    {"load", "FILE", "start from a checkpoint written by --save (any program's)"},
    {"trace", "FILE", "write the last step's events of every rank as a Chrome trace (Perfetto)"},
    {"summary", "FILE", "write the run's measured figures as key=value lines (make run reads them)"},
    {"max-line", "N", "longest accepted line of --data, in bytes (default 1024)"},
    {"quiet", NULL, "print only the results: validation loss and names"},
    {"help", NULL, "print this help"},
};
#define CLI_N_COMMON ((int)(sizeof cli_common / sizeof cli_common[0]))

static void cli_usage_flag(FILE* f, const CliFlag* flag) {
    char left[64];
    snprintf(left, sizeof left, "--%s%s%s", flag->name, flag->value ? " " : "", flag->value ? flag->value : "");
    fprintf(f, "  %-22s %s\n", left, flag->help);
}
static void cli_usage(FILE* f, const char* run_line, const CliFlag* extra, int n_extra) {
    fprintf(f, "usage: %s [flags]\n", run_line);
    for (int i = 0; i < n_extra; i++) cli_usage_flag(f, &extra[i]);
    for (int i = 0; i < CLI_N_COMMON; i++) cli_usage_flag(f, &cli_common[i]);
}

// Strict number parsing: the whole value must be a number within [lo, hi].
static char cli_error[512];
static const char* cli_long(const char* flag, const char* s, long lo, long hi, long* out) {
    char* end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        snprintf(cli_error, sizeof cli_error, "--%s must be an integer from %ld to %ld, got '%s'", flag, lo, hi, s);
        return cli_error;
    }
    *out = v;
    return NULL;
}
static const char* cli_int(const char* flag, const char* s, int lo, int hi, int* out) {
    long v;
    const char* err = cli_long(flag, s, lo, hi, &v);
    if (!err) *out = (int)v;
    return err;
}
static const char* cli_float(const char* flag, const char* s, double lo, double hi, int lo_open, float* out) {
    char* end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || (lo_open && v == lo) || v > hi) {
        snprintf(cli_error, sizeof cli_error, "--%s must be a number %s %g and at most %g, got '%s'", flag,
                 lo_open ? "above" : "from", lo, hi, s);
        return cli_error;
    }
    *out = (float)v;
    return NULL;
}

// Parses argv into o. Returns 0 to run, 1 after --help (usage printed to stdout), 2 on a
// bad flag or value (the message is in *err; the caller prints it with the usage).
static int cli_parse(Options* o, int argc, char** argv, const CliFlag* extra, int n_extra, CliHandler handle,
                     void* ctx, const char** err) {
    *o = (Options){.data = "names.txt",
                   .max_line = DATA_DEFAULT_MAX_LINE,
                   .model = {.vocab = 0, .context = 16, .emb = 16, .hidden = 64, .layers = 1},
                   .steps = 25000,
                   .batch = 32,
                   .opt = {.adamw = 0, .lr = -1.0f, .weight_decay = -1.0f, .beta1 = 0.9f, .beta2 = 0.999f,
                           .eps = 1e-8f, .clip = 0.0f},
                   .seed = 42,
                   .eval_every = 2500,
                   .samples = 10};
    struct option longopts[CLI_N_COMMON + 32 + 1];
    if (n_extra > 32) n_extra = 32;
    int n = 0;
    for (int i = 0; i < CLI_N_COMMON; i++)
        longopts[n++] = (struct option){cli_common[i].name, cli_common[i].value ? required_argument : no_argument, 0,
                                        1000 + i};
    for (int i = 0; i < n_extra; i++)
        longopts[n++] = (struct option){extra[i].name, extra[i].value ? required_argument : no_argument, 0, 2000 + i};
    longopts[n] = (struct option){0, 0, 0, 0};
    opterr = 0; // we print our own messages
    optind = 1;
    *err = NULL;
    int c;
    while (!*err && (c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        if (c == '?' || c == ':') {
            const char* bad = argv[optind - 1];
            snprintf(cli_error, sizeof cli_error, "%s '%s'", c == ':' ? "missing value for" : "unknown flag", bad);
            *err = cli_error;
            break;
        }
        if (c >= 2000) {
            *err = handle(ctx, c - 2000, optarg);
            continue;
        }
        if (c < 1000 || c >= 1000 + CLI_N_COMMON) fatal("internal: getopt_long returned %d", c);
        const char* name = cli_common[c - 1000].name;
        long lv;
        if (!strcmp(name, "data")) o->data = optarg;
        else if (!strcmp(name, "steps")) *err = cli_long(name, optarg, 0, 1000000000L, &o->steps);
        else if (!strcmp(name, "batch")) *err = cli_int(name, optarg, 1, 65536, &o->batch);
        else if (!strcmp(name, "lr")) *err = cli_float(name, optarg, 0.0, 100.0, 1, &o->opt.lr);
        else if (!strcmp(name, "optimizer")) {
            if (!strcmp(optarg, "sgd")) o->opt.adamw = 0;
            else if (!strcmp(optarg, "adamw")) o->opt.adamw = 1;
            else {
                snprintf(cli_error, sizeof cli_error, "--optimizer must be sgd or adamw, got '%s'", optarg);
                *err = cli_error;
            }
        } else if (!strcmp(name, "weight-decay")) *err = cli_float(name, optarg, 0.0, 10.0, 0, &o->opt.weight_decay);
        else if (!strcmp(name, "clip")) *err = cli_float(name, optarg, 0.0, 1e6, 0, &o->opt.clip);
        else if (!strcmp(name, "context")) *err = cli_int(name, optarg, 1, 1024, &o->model.context);
        else if (!strcmp(name, "emb")) *err = cli_int(name, optarg, 1, 4096, &o->model.emb);
        else if (!strcmp(name, "hidden")) *err = cli_int(name, optarg, 1, 16384, &o->model.hidden);
        else if (!strcmp(name, "layers")) *err = cli_int(name, optarg, 1, MAX_LAYERS, &o->model.layers);
        else if (!strcmp(name, "seed")) {
            char* end;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end || optarg[0] == '-') {
                snprintf(cli_error, sizeof cli_error, "--seed must be an integer from 0 to %llu, got '%s'",
                         (unsigned long long)UINT64_MAX, optarg);
                *err = cli_error;
            } else o->seed = v;
        } else if (!strcmp(name, "eval-every")) *err = cli_long(name, optarg, 0, 1000000000L, &o->eval_every);
        else if (!strcmp(name, "samples")) *err = cli_long(name, optarg, 0, 1000, &lv), o->samples = (int)lv;
        else if (!strcmp(name, "log")) o->log = optarg;
        else if (!strcmp(name, "save")) o->save = optarg;
        else if (!strcmp(name, "load")) o->load = optarg;
        else if (!strcmp(name, "trace")) o->trace = optarg;
        else if (!strcmp(name, "summary")) o->summary = optarg;
        else if (!strcmp(name, "max-line")) *err = cli_int(name, optarg, 1, 1 << 24, &o->max_line);
        else if (!strcmp(name, "quiet")) o->quiet = 1;
        else if (!strcmp(name, "help")) return 1;
    }
    if (!*err && optind < argc) {
        snprintf(cli_error, sizeof cli_error, "unexpected argument '%s' (flags start with --)", argv[optind]);
        *err = cli_error;
    }
    if (*err) return 2;
    if (o->opt.lr < 0) o->opt.lr = o->opt.adamw ? 0.003f : 0.1f;
    if (o->opt.weight_decay < 0) o->opt.weight_decay = o->opt.adamw ? 0.01f : 0.0f;
    // the model must fit: parameters of the largest layer and all of them, in floats
    double t_e = (double)o->model.context * o->model.emb, h = o->model.hidden;
    double total = 256.0 * o->model.emb + t_e * h + (o->model.layers - 1) * h * h + h * 257 * o->model.layers;
    if (total > 512.0 * 1024 * 1024) {
        snprintf(cli_error, sizeof cli_error,
                 "the model would have about %.0f million parameters; this project caps it at 512 million "
                 "(lower --context, --emb, --hidden or --layers)", total / 1e6);
        *err = cli_error;
        return 2;
    }
    return 0;
}

// Handles the result of cli_parse for a single process: usage, then exit.
static void cli_parse_or_exit(Options* o, int argc, char** argv, const char* run_line, const CliFlag* extra,
                              int n_extra, CliHandler handle, void* ctx) {
    const char* err;
    int rc = cli_parse(o, argc, argv, extra, n_extra, handle, ctx, &err);
    if (rc == 1) {
        cli_usage(stdout, run_line, extra, n_extra);
        exit(0);
    }
    if (rc == 2) {
        fprintf(stderr, "error: %s\n", err);
        cli_usage(stderr, run_line, extra, n_extra);
        exit(2);
    }
}

// ----------------------------------------------------------------------------
// what every program prints

static void print_config(const Options* o, const Dataset* ds, const char* layout) {
    const Config* c = &o->model;
    printf("configuration\n");
    printf("  data       %s: %d lines (%d train, %d validation), %d tokens, %ld training examples\n", o->data,
           ds->n_lines, ds->n_train, ds->n_val, ds->vocab, ds->n_train_examples);
    printf("  model      context %d, emb %d, hidden %d, layers %d: %ld parameters\n", c->context, c->emb, c->hidden,
           c->layers, n_params(c));
    printf("  optimizer  %s, lr %g, weight decay %g, clip %s", o->opt.adamw ? "adamw" : "sgd", o->opt.lr,
           o->opt.weight_decay, o->opt.clip > 0 ? "" : "off");
    if (o->opt.clip > 0) printf("%g", o->opt.clip);
    printf("\n  training   %ld steps of %d rows, seed %llu%s%s\n", o->steps, o->batch, (unsigned long long)o->seed,
           o->load ? ", from " : "", o->load ? o->load : "");
    printf("  layout     %s\n", layout);
    fflush(stdout);
}

static void print_results(double val_loss, long n_val, double seconds, long steps, int batch, const int* names,
                          int n_names, int max_len, const Dataset* ds, int quiet) {
    printf("validation loss %.4f (%ld examples)\n", val_loss, n_val);
    if (!quiet && steps > 0)
        printf("training time %.2f s: %.4f ms/step, %.0f tokens/s\n", seconds, 1e3 * seconds / steps,
               seconds > 0 ? (double)steps * batch / seconds : 0.0);
    if (n_names > 0) printf("names:\n");
    for (int i = 0; i < n_names; i++) {
        const int* s = names + (long)i * (max_len + 1);
        for (int p = 0; s[p] != 0; p++) putchar(ds->token_char[s[p]]);
        putchar('\n');
    }
    fflush(stdout);
}

// Progress of the training loop: the CSV log (one line per step, the losses in full
// precision so that logs of different programs can be compared for identity), a progress
// line every --eval-every steps, and the training time. In MPI programs only rank 0 prints.
typedef struct {
    const Options* o;
    int printing;    // this process prints and logs
    FILE* log;
    double seconds;  // time spent in training steps
    long steps;      // steps trained
    double interval_loss, interval_seconds;
    long interval_steps;
} Progress;

static Progress progress_start(const Options* o, int printing) {
    Progress p = {.o = o, .printing = printing};
    if (printing && o->log) {
        p.log = fopen(o->log, "w");
        if (!p.log) fatal("cannot create log '%s': %s", o->log, strerror(errno));
        fprintf(p.log, "step,train_loss,val_loss,ms,tokens_per_s\n");
    }
    return p;
}
// whether this step ends with a progress line, and so with a validation pass
static int progress_due(const Progress* p, long step) {
    return p->o->eval_every > 0 && (step % p->o->eval_every == 0 || step == p->o->steps);
}
static void progress_step(Progress* p, long step, double train_loss, double seconds, double val_loss) {
    int due = progress_due(p, step), B = p->o->batch;
    p->seconds += seconds;
    p->steps++;
    p->interval_loss += train_loss;
    p->interval_seconds += seconds;
    p->interval_steps++;
    if (!p->printing) return;
    if (p->log) {
        fprintf(p->log, "%ld,%.17g,", step, train_loss);
        if (due) fprintf(p->log, "%.17g", val_loss);
        fprintf(p->log, ",%.4f,%.0f\n", 1e3 * seconds, seconds > 0 ? B / seconds : 0.0);
    }
    if (due && !p->o->quiet) {
        int w = snprintf(NULL, 0, "%ld", p->o->steps);
        double s = p->interval_seconds;
        printf("step %*ld/%ld | train loss %.4f | val loss %.4f | %.3f ms/step | %.0f tokens/s\n", w, step,
               p->o->steps, p->interval_loss / p->interval_steps, val_loss, 1e3 * s / p->interval_steps,
               s > 0 ? p->interval_steps * B / s : 0.0);
        fflush(stdout);
        p->interval_loss = p->interval_seconds = 0.0;
        p->interval_steps = 0;
    }
}
static void progress_end(Progress* p) {
    if (p->log && fclose(p->log) != 0) fatal("cannot write log '%s': %s", p->o->log, strerror(errno));
    p->log = NULL;
}

// ----------------------------------------------------------------------------
// figures: what a run measured, per rank, each beside the formula's prediction

typedef struct {
    double sent;          // bytes this rank sent per training step
    double sent_axis[3];  // of which on the tensor, data and pipeline axes (train_3d.c)
    double sent_formula;  // what the strategy's formula predicts for `sent`
    double received;      // bytes this rank received per training step
    double params, grads, optim, acts; // bytes held: parameters, gradient sums, optimizer state, activations
    double mem_formula;   // what the formula predicts for their sum
    double bubble;        // the pipeline's idle fraction, or -1 without a pipeline
} Figures;
#define FIGURES_DOUBLES ((int)(sizeof(Figures) / sizeof(double)))

static double figures_memory(const Figures* f) { return f->params + f->grads + f->optim + f->acts; }

static void print_size(double b) {
    if (b < 1e3) printf("%.0f B", b);
    else if (b < 1e6) printf("%.1f KB", b / 1e3);
    else if (b < 1e9) printf("%.2f MB", b / 1e6);
    else printf("%.2f GB", b / 1e9);
}

// The per-rank table (figures of n ranks), and the formulas in words.
static void figures_print(const Figures* f, int n, const char* sent_words, const char* mem_words) {
    printf("per rank, per training step: bytes sent (formula: %s), and received; memory held (formula: %s)\n",
           sent_words, mem_words);
    for (int q = 0; q < n; q++) {
        printf("  rank %-3d sent ", q);
        print_size(f[q].sent);
        printf(" (formula ");
        print_size(f[q].sent_formula);
        printf("), received ");
        print_size(f[q].received);
        printf(" | memory ");
        print_size(f[q].params);
        printf(" + ");
        print_size(f[q].grads);
        printf(" + ");
        print_size(f[q].optim);
        printf(" + ");
        print_size(f[q].acts);
        printf(" = ");
        print_size(figures_memory(&f[q]));
        printf(" (formula ");
        print_size(f[q].mem_formula);
        printf(")");
        if (f[q].bubble >= 0) printf(" | bubble %.3f", f[q].bubble);
        printf("\n");
    }
}

// --summary: the run's figures as key=value lines (every rank's in order), and its names.
static void summary_write(const char* path, const char* program, const char* layout, double val_loss,
                          const Progress* pr, const Figures* f, int n, const int* names, int max_len,
                          const Dataset* ds) {
    FILE* out = fopen(path, "w");
    if (!out) fatal("cannot create summary '%s': %s", path, strerror(errno));
    fprintf(out, "program=%s\nlayout=%s\nranks=%d\nval_loss=%.17g\nseconds=%.6f\nsteps=%ld\nbatch=%d\n", program,
            layout, n, val_loss, pr->seconds, pr->steps, pr->o->batch);
    for (int i = 0; i < pr->o->samples; i++) {
        fputs("name=", out);
        for (const int* t = names + (long)i * (max_len + 1); *t; t++) fputc(ds->token_char[*t], out);
        fputc('\n', out);
    }
    for (int q = 0; q < n; q++)
        fprintf(out, "rank=%d sent=%.0f sent_tp=%.0f sent_dp=%.0f sent_pp=%.0f sent_formula=%.0f received=%.0f "
                     "params=%.0f grads=%.0f optim=%.0f acts=%.0f mem_formula=%.0f bubble=%.4f\n", q, f[q].sent,
                f[q].sent_axis[0], f[q].sent_axis[1], f[q].sent_axis[2], f[q].sent_formula, f[q].received,
                f[q].params, f[q].grads, f[q].optim, f[q].acts, f[q].mem_formula, f[q].bubble);
    if (fclose(out) != 0) fatal("cannot write summary '%s': %s", path, strerror(errno));
}

// The end of every program, on the process that prints: the validation loss, the training
// time and the names; unless --quiet, the figures of n ranks with the formulas in words;
// and the --summary file.
static void report_print(const Options* o, const char* program, const char* layout, double val_loss,
                         const Progress* pr, const int* names, int max_len, const Dataset* ds, const Figures* all,
                         int n, const char* sent_words, const char* mem_words) {
    print_results(val_loss, ds->n_val_examples, pr->seconds, pr->steps, o->batch, names, o->samples, max_len, ds,
                  o->quiet);
    if (!o->quiet) figures_print(all, n, sent_words, mem_words);
    if (o->summary) summary_write(o->summary, program, layout, val_loss, pr, all, n, names, max_len, ds);
}

#pragma GCC diagnostic pop
#endif // CLI_H
