/*
 * cli.h: the flags every program shares and their validation, so that all of them accept
 * the same flags and refuse bad values the same way.
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

#include <float.h>
#include <getopt.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "optim.h"

typedef struct {
    const char* data; // --data
    int max_line;     // --max-line
    Config model;     // --model --context --emb --hidden --layers --heads (vocab comes from the data)
    long steps;       // --steps
    int batch;        // --batch
    Optimizer opt;    // --optimizer --lr --weight-decay --clip
    uint64_t seed;    // --seed
    long eval_every;  // --eval-every
    int samples;      // --samples
    const char* log;  // --log
    int log_overwrite; // --log-overwrite
    const char* save; // --save
    const char* load; // --load
    const char* trace; // --trace
    const char* summary; // --summary
    int quiet;        // --quiet
    int allow_changes; // --allow-changes
    long save_every;  // --save-every
    int keep;         // --keep
    int microbatches; // --microbatches (gradient accumulation; train_pp and train_3d take their own)
    int timeout;      // --timeout
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
    {"model", "NAME", "mlp (default): the MLP on T characters; gpt: makemore's Transformer, whole names"},
    {"steps", "N", "training steps (default 25000; 0 only evaluates and samples)"},
    {"batch", "N", "rows per step, the global batch: examples (mlp) or names (gpt) (default 32)"},
    {"lr", "X", "learning rate (default 0.1 for sgd, 0.003 for adamw; gpt 0.0005)"},
    {"optimizer", "NAME", "sgd or adamw (default sgd; gpt adamw, betas 0.9 0.99)"},
    {"weight-decay", "X", "decoupled weight decay (default 0 for sgd, 0.01 for adamw)"},
    {"clip", "X", "clip the global gradient norm to X (default 0: off)"},
    {"context", "N", "positions T: mlp characters of context (default 16); gpt 0: the longest line + 1 (default)"},
    {"emb", "N", "mlp: embedding size E (default 16); gpt: width C (default 64)"},
    {"hidden", "N", "mlp: hidden size H (default 64); the GPT's MLP is 4C"},
    {"layers", "N", "mlp: hidden layers L (default 1); gpt: blocks (default 4)"},
    {"heads", "N", "gpt: attention heads, dividing --emb (default 4)"},
    {"experts", "X", "make every hidden layer (mlp) or every block's MLP (gpt) a mixture of X experts (default 0: "
                     "dense; train.c and train_ep.c)"},
    {"top-k", "K", "with --experts: experts per token, 1 or 2 (default 1)"},
    {"capacity", "F", "with --experts: an expert takes at most ceil(F K B / X) of a batch's B tokens (gpt: its "
                      "positions with a target) (default 1.25)"},
    {"aux-loss", "A", "with --experts: weight of the load-balancing loss (default 0.01)"},
    {"microbatches", "M", "the global batch as M microbatches, their gradients summed before one optimizer step "
                          "(default 1; the pipelines' own default is 4)"},
    {"recompute", "HOW", "gpt: activation recomputation: none (default), selective (attention's probabilities "
                         "recomputed in backward) or full (each block's activations from its input)"},
    {"seed", "N", "seed of every random number (default 42)"},
    {"eval-every", "N", "report progress and validation loss every N steps (default 2500; 0: end only)"},
    {"samples", "N", "names to generate at the end (default 10)"},
    {"log", "FILE", "write a CSV line per step: step, train loss, val loss, ms, tokens/s (--load: continues its own log)"},
    {"log-overwrite", NULL, "with --log: replace the file even if it is not a log of this run"},
    {"save", "FILE", "write a checkpoint (parameters and optimizer state) at the end, or on SIGINT or SIGTERM"},
    {"save-every", "N", "with --save: also write it every N steps"},
    {"keep", "K", "with --save: keep the last K checkpoints, FILE, FILE.1, ... (default 2)"},
    {"load", "FILE", "start from a checkpoint written by --save (any program's)"},
    {"trace", "FILE", "write the last step's events of every rank as a Chrome trace (Perfetto)"},
    {"summary", "FILE", "write the run's measured figures as key=value lines (make run reads them)"},
    {"max-line", "N", "longest accepted line of --data, in bytes (default 1024)"},
    {"timeout", "SECONDS", "end the job when no training step finishes for that long, saying where it waits (default 300; 0: never)"},
    {"allow-changes", NULL, "--load: resume even with another seed, batch, optimizer setting or data file"},
    {"quiet", NULL, "print only the results: validation loss and names"},
    {"help", NULL, "print this help"},
};
#define CLI_N_COMMON ((int)(sizeof cli_common / sizeof cli_common[0]))

static void cli_usage_flag(FILE* f, const CliFlag* flag) {
    char left[64];
    snprintf(left, sizeof left, "--%s%s%s", flag->name, flag->value ? " " : "", flag->value ? flag->value : "");
    fprintf(f, "  %-22s %s\n", left, flag->help);
}
// A program's own flag of a common flag's name replaces it (train_pp's --microbatches, whose
// default is 4).
static int cli_overridden(const CliFlag* common, const CliFlag* extra, int n_extra) {
    for (int i = 0; i < n_extra; i++)
        if (!strcmp(extra[i].name, common->name)) return 1;
    return 0;
}
static void cli_usage(FILE* f, const char* run_line, const CliFlag* extra, int n_extra) {
    fprintf(f, "usage: %s [flags]\n", run_line);
    for (int i = 0; i < n_extra; i++) cli_usage_flag(f, &extra[i]);
    for (int i = 0; i < CLI_N_COMMON; i++)
        if (!cli_overridden(&cli_common[i], extra, n_extra)) cli_usage_flag(f, &cli_common[i]);
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
    // decimal numbers only: strtod also takes hexadecimal, infinity and NaN
    int decimal = s[strspn(s, "0123456789.eE+-")] == 0;
    if (!decimal || errno || end == s || *end || !isfinite(v) || v < lo || (lo_open && v == lo) || v > hi) {
        snprintf(cli_error, sizeof cli_error, "--%s must be a decimal number %s %g and at most %g, got '%s'", flag,
                 lo_open ? "above" : "from", lo, hi, s);
        return cli_error;
    }
    if (v != 0 && !isnormal((float)v)) { // it would be 0, or lose its precision, as a float
        snprintf(cli_error, sizeof cli_error, "--%s %s is too small to act as a float (at least %g), got '%s'", flag,
                 lo_open ? "must be above 0 and" : "is 0 to turn it off, else", (double)FLT_MIN, s);
        return cli_error;
    }
    *out = (float)v;
    return NULL;
}

// Two paths name the same file (that exists), or the same string.
static int same_file(const char* a, const char* b) {
    struct stat sa, sb;
    if (!a || !b) return 0;
    if (!strcmp(a, b)) return 1;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// How each output of this project begins: what tells a file it wrote (which a run may
// replace) from any other (which no run replaces).
#define CKPT_SIGNATURE "MLPCKPT"                               // ckpt.h, any format
#define LOG_HEADER "step,train_loss,val_loss,ms,tokens_per_s" // report.h's --log
#define SUMMARY_SIGNATURE "program="                         // report.h's --summary
#define TRACE_SIGNATURE "{\"displayTimeUnit\""               // report.h's --trace

// What is at an output's path: nothing; an empty file (nothing to lose); a file of this
// project, one that starts with `signature`; a file of something else; or not a regular
// file at all (a folder, a device, a named pipe: stat, not open, so that a pipe never blocks).
enum { PATH_ABSENT, PATH_EMPTY, PATH_OURS, PATH_FOREIGN, PATH_NOT_FILE };
static int path_holds(const char* path, const char* signature) {
    struct stat st;
    if (stat(path, &st) != 0) return errno == ENOENT ? PATH_ABSENT : PATH_NOT_FILE;
    if (!S_ISREG(st.st_mode)) return PATH_NOT_FILE;
    if (st.st_size == 0) return PATH_EMPTY;
    char head[64] = "";
    size_t n = strlen(signature);
    FILE* f = fopen(path, "rb");
    int ours = f && fread(head, 1, n, f) == n && !memcmp(head, signature, n);
    if (f) fclose(f);
    return ours ? PATH_OURS : PATH_FOREIGN;
}

// Before any training: every output can be written where it is asked for, and writing it
// loses nothing the user had. An output's path is not empty; its folder exists and can be
// written; it is not an input (--save may be --load: resuming overwrites the checkpoint it
// started from, safely, ckpt.h) nor another output; and whatever is there already is a file
// of this project of the same kind, or nothing: a run never replaces a file it did not
// write, nor anything but a regular file. --save also checks the files its rotation renames
// (FILE.1 .. FILE.K-1 with --keep K). --log may replace another file with --log-overwrite;
// whether an existing log is this run's (to continue it) is report.h's check, once the
// checkpoint is read.
static const char* cli_check_outputs(const Options* o) {
    const char* names[] = {"log", "save", "trace", "summary"};
    const char* paths[] = {o->log, o->save, o->trace, o->summary};
    const char* kinds[] = {"--log file", "checkpoint", "--trace file", "--summary file"};
    const char* signatures[] = {LOG_HEADER, CKPT_SIGNATURE, TRACE_SIGNATURE, SUMMARY_SIGNATURE};
    for (int i = 0; i < 4; i++) {
        if (!paths[i]) continue;
        char dir[4096], what[5000] = "", file[4200];
        snprintf(dir, sizeof dir, "%s", paths[i]);
        char* slash = strrchr(dir, '/');
        if (slash) slash == dir ? (void)(dir[1] = 0) : (void)(*slash = 0);
        else snprintf(dir, sizeof dir, ".");
        const char* why = !paths[i][0] ? "is empty: give a file name"
                          : same_file(paths[i], o->data) ? "is the --data file"
                          : (i != 1 && same_file(paths[i], o->load)) ? "is the --load checkpoint"
                          : access(dir, W_OK) != 0 ? "is in a folder that does not exist or cannot be written"
                          : (access(paths[i], F_OK) == 0 && access(paths[i], W_OK) != 0) ? "exists and cannot be written"
                                                                                            : NULL;
        for (int j = 0; j < i && !why; j++)
            if (paths[j] && same_file(paths[i], paths[j])) why = "is also another output";
        // what is there: the path itself, and for --save the files its rotation renames
        for (int k = 0; !why && k < (i == 1 ? o->keep : 1); k++) {
            if (k == 0) snprintf(file, sizeof file, "%s", paths[i]);
            else snprintf(file, sizeof file, "%s.%d", paths[i], k);
            int held = path_holds(file, signatures[i]);
            struct stat st;
            if (held == PATH_NOT_FILE && stat(file, &st) == 0)
                snprintf(what, sizeof what, "%s%s%sis %s, not a regular file", k ? "with --keep, '" : "",
                         k ? file : "", k ? "' " : "", file_kind(st.st_mode));
            else if (held == PATH_NOT_FILE)
                snprintf(what, sizeof what, "cannot be looked at (%s)", strerror(errno));
            else if (held == PATH_FOREIGN && !(i == 0 && o->log_overwrite))
                snprintf(what, sizeof what, "%s%s%sexists and is not a %s of this project (a run replaces only its "
                         "own files%s)", k ? "with --keep, '" : "", k ? file : "", k ? "' (which the rotation would rename) " : "",
                         kinds[i], i == 0 ? "; pass --log-overwrite to replace it anyway" : "");
            if (what[0]) why = what;
        }
        if (why) {
            snprintf(cli_error, sizeof cli_error, "--%s '%s' %s: refusing to start (nothing was written)", names[i],
                     paths[i], why);
            return cli_error;
        }
    }
    return NULL;
}

// Parses argv into o. Returns 0 to run, 1 after --help (usage printed to stdout), 2 on a
// bad flag or value (the message is in *err; the caller prints it with the usage).
static int cli_parse(Options* o, int argc, char** argv, const CliFlag* extra, int n_extra, CliHandler handle,
                     void* ctx, const char** err) {
    *o = (Options){.data = "names.txt",
                   .max_line = DATA_DEFAULT_MAX_LINE,
                   .model = {.model = MODEL_MLP, .heads = -1, .vocab = 0, .context = -1, .emb = -1, .hidden = -1,
                             .layers = -1, .experts = 0, .top_k = -1, .capacity = -1.0f, .aux_loss = -1.0f},
                   .steps = 25000,
                   .batch = 32,
                   .opt = {.adamw = -1, .lr = -1.0f, .weight_decay = -1.0f, .beta1 = 0.9f, .beta2 = 0.999f,
                           .eps = 1e-8f, .clip = 0.0f},
                   .seed = 42,
                   .eval_every = 2500,
                   .samples = 10,
                   .keep = 2,
                   .microbatches = 1,
                   .timeout = 300};
    struct option longopts[CLI_N_COMMON + 32 + 1];
    if (n_extra > 32) n_extra = 32;
    int n = 0;
    for (int i = 0; i < CLI_N_COMMON; i++)
        if (!cli_overridden(&cli_common[i], extra, n_extra))
            longopts[n++] = (struct option){cli_common[i].name, cli_common[i].value ? required_argument : no_argument,
                                            0, 1000 + i};
    for (int i = 0; i < n_extra; i++)
        longopts[n++] = (struct option){extra[i].name, extra[i].value ? required_argument : no_argument, 0, 2000 + i};
    longopts[n] = (struct option){0, 0, 0, 0};
    opterr = 0; // we print our own messages
#ifdef __GLIBC__
    optind = 0; // glibc: a full restart, forgetting a half-read "-abc" of an earlier parse
#else
    optind = 1;
#endif
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
        else if (!strcmp(name, "model")) {
            if (!strcmp(optarg, "mlp")) o->model.model = MODEL_MLP;
            else if (!strcmp(optarg, "gpt")) o->model.model = MODEL_GPT;
            else {
                snprintf(cli_error, sizeof cli_error, "--model must be mlp or gpt, got '%s'", optarg);
                *err = cli_error;
            }
        }
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
        else if (!strcmp(name, "context")) *err = cli_int(name, optarg, 0, 1024, &o->model.context);
        else if (!strcmp(name, "heads")) *err = cli_int(name, optarg, 1, 4096, &o->model.heads);
        else if (!strcmp(name, "emb")) *err = cli_int(name, optarg, 1, 4096, &o->model.emb);
        else if (!strcmp(name, "hidden")) *err = cli_int(name, optarg, 1, 16384, &o->model.hidden);
        else if (!strcmp(name, "layers")) *err = cli_int(name, optarg, 1, MAX_LAYERS, &o->model.layers);
        else if (!strcmp(name, "experts")) *err = cli_int(name, optarg, 0, 1024, &o->model.experts);
        else if (!strcmp(name, "top-k")) {
            if (strcmp(optarg, "1") && strcmp(optarg, "2")) {
                snprintf(cli_error, sizeof cli_error, "--top-k must be 1 or 2 (experts per token), got '%s'", optarg);
                *err = cli_error;
            } else o->model.top_k = optarg[0] - '0';
        } else if (!strcmp(name, "capacity")) *err = cli_float(name, optarg, 0.0, 1e6, 1, &o->model.capacity);
        else if (!strcmp(name, "microbatches")) *err = cli_int(name, optarg, 1, 65536, &o->microbatches);
        else if (!strcmp(name, "recompute")) {
            int k = 0;
            while (k < 3 && strcmp(optarg, recompute_names[k])) k++;
            if (k < 3) o->model.recompute = k;
            else {
                snprintf(cli_error, sizeof cli_error, "--recompute must be none, selective or full, got '%s'", optarg);
                *err = cli_error;
            }
        }
        else if (!strcmp(name, "aux-loss")) *err = cli_float(name, optarg, 0.0, 1.0, 0, &o->model.aux_loss); // Switch: 0.01
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
        else if (!strcmp(name, "log-overwrite")) o->log_overwrite = 1;
        else if (!strcmp(name, "save")) o->save = optarg;
        else if (!strcmp(name, "load")) o->load = optarg;
        else if (!strcmp(name, "trace")) o->trace = optarg;
        else if (!strcmp(name, "summary")) o->summary = optarg;
        else if (!strcmp(name, "max-line")) *err = cli_int(name, optarg, 1, 1 << 24, &o->max_line);
        else if (!strcmp(name, "quiet")) o->quiet = 1;
        else if (!strcmp(name, "allow-changes")) o->allow_changes = 1;
        else if (!strcmp(name, "save-every")) *err = cli_long(name, optarg, 1, 1000000000L, &o->save_every);
        else if (!strcmp(name, "keep")) *err = cli_int(name, optarg, 1, 100, &o->keep);
        else if (!strcmp(name, "timeout")) *err = cli_int(name, optarg, 0, 1000000, &o->timeout);
        else if (!strcmp(name, "help")) return 1;
    }
    if (!*err && optind < argc) {
        if (!strcmp(argv[optind - 1], "--")) // getopt stops at "--": what follows is not read as flags
            snprintf(cli_error, sizeof cli_error, "unexpected argument '%s' after '--': nothing after '--' is read as a "
                     "flag; leave the '--' out", argv[optind]);
        else
            snprintf(cli_error, sizeof cli_error, "unexpected argument '%s' (flags start with --)", argv[optind]);
        *err = cli_error;
    }
    if (!*err && (o->save_every || o->keep != 2) && !o->save) {
        snprintf(cli_error, sizeof cli_error, "--save-every and --keep apply to --save FILE only");
        *err = cli_error;
    }
    if (!*err && o->log_overwrite && !o->log) {
        snprintf(cli_error, sizeof cli_error, "--log-overwrite applies to --log FILE only");
        *err = cli_error;
    }
    if (!*err) *err = cli_check_outputs(o);
    Config* m = &o->model;
    int gpt = m->model == MODEL_GPT;
    if (!*err && gpt && m->hidden >= 0) {
        snprintf(cli_error, sizeof cli_error, "--hidden applies to --model mlp; the GPT's MLP is 4 x --emb wide");
        *err = cli_error;
    }
    if (!*err && !gpt && m->heads >= 0) {
        snprintf(cli_error, sizeof cli_error, "--heads applies to --model gpt");
        *err = cli_error;
    }
    if (!*err && !gpt && m->context == 0) {
        snprintf(cli_error, sizeof cli_error, "--context must be an integer from 1 to 1024 for --model mlp, got '0'");
        *err = cli_error;
    }
    // defaults: the MLP's, or makemore's for the GPT
    if (m->context < 0) m->context = gpt ? 0 : 16; // the GPT's 0: the longest line + 1 (load_data)
    if (m->emb < 0) m->emb = gpt ? 64 : 16;
    if (m->hidden < 0) m->hidden = gpt ? 0 : 64;
    if (m->layers < 0) m->layers = gpt ? 4 : 1;
    if (m->heads < 0) m->heads = gpt ? 4 : 0;
    if (o->opt.adamw < 0) o->opt.adamw = gpt;
    if (gpt) o->opt.beta2 = 0.99f;
    if (!*err && gpt && m->emb % m->heads != 0) {
        snprintf(cli_error, sizeof cli_error, "--emb %d is not a multiple of --heads %d: each head takes emb / heads "
                 "of the width", m->emb, m->heads);
        *err = cli_error;
    }
    if (!*err && m->experts == 0 && (m->top_k >= 0 || m->capacity >= 0 || m->aux_loss >= 0)) {
        snprintf(cli_error, sizeof cli_error, "--top-k, --capacity and --aux-loss apply with --experts X only");
        *err = cli_error;
    }
    if (!*err && o->batch < o->microbatches) {
        snprintf(cli_error, sizeof cli_error, "a batch of %d rows cannot be cut into %d microbatches (raise --batch "
                 "or lower --microbatches)", o->batch, o->microbatches);
        *err = cli_error;
    }
    if (!*err && m->recompute && !gpt) {
        snprintf(cli_error, sizeof cli_error, "--recompute applies to --model gpt: the MLP's units keep only their "
                 "outputs, which the next units need as inputs anyway, so there is nothing to recompute");
        *err = cli_error;
    }
    if (!*err && m->recompute == RECOMPUTE_FULL && m->experts > 0) {
        snprintf(cli_error, sizeof cli_error, "--recompute full with --experts: recomputing a block would route its "
                 "tokens again, and the experts' plan and load figures would count them twice; use --recompute "
                 "selective (attention's probabilities only)");
        *err = cli_error;
    }
    if (m->top_k < 0) m->top_k = 1;
    if (m->capacity < 0) m->capacity = 1.25f;
    if (m->aux_loss < 0) m->aux_loss = 0.01f;
    if (!*err && m->experts > 0 && m->top_k > m->experts) {
        snprintf(cli_error, sizeof cli_error, "--top-k %d is more than --experts %d: a token cannot pick more experts "
                 "than there are", m->top_k, m->experts);
        *err = cli_error;
    }
    if (!*err && kernel_isa_cap() < 0) {
        snprintf(cli_error, sizeof cli_error, "KERNEL_ISA must be avx512, avx2 or any, not '%s'", getenv("KERNEL_ISA"));
        *err = cli_error;
    }
    if (*err) return 2;
    if (o->opt.lr < 0) o->opt.lr = gpt ? 0.0005f : o->opt.adamw ? 0.003f : 0.1f;
    if (o->opt.weight_decay < 0) o->opt.weight_decay = o->opt.adamw ? 0.01f : 0.0f;
    // the model must fit: parameters of the largest layer and all of them, in floats, with a
    // vocabulary of 256 (load_data checks again with the data's, which may be larger)
    double t_e = (double)o->model.context * o->model.emb, h = o->model.hidden, C = m->emb;
    double x = m->experts > 0 ? m->experts : 1, hidden = (t_e * h + (m->layers - 1) * h * h + h * m->layers) * x;
    double total = 256.0 * o->model.emb + hidden + (m->experts > 0 ? (t_e + (m->layers - 1) * h) * x : 0) + h * 257;
    if (gpt) // vocabulary and T at most 256, 1024; a block's attention, LayerNorms and router, and its MLP or experts
        total = 2.0 * 256 * C + 1024 * C +
                m->layers * (4 * C * C + 8 * C + (m->experts > 0 ? C * x : 0) + x * (8 * C * C + 5 * C));
    if (total > 512.0 * 1024 * 1024) {
        snprintf(cli_error, sizeof cli_error,
                 "the model would have about %.0f million parameters; this project caps it at 512 million "
                 "(lower --context, --emb, --hidden, --layers or --experts)", total / 1e6);
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

// The data of --data, read and checked; its vocabulary completes the model's configuration.
static void load_data(Dataset* ds, Options* o, Config* cfg) {
    dataset_load(ds, o->data, o->max_line, o->seed);
    o->model.vocab = ds->vocab;
    if (o->model.model == MODEL_GPT && o->model.context == 0) { // the GPT: a whole name and its end fit
        if (ds->max_len + 1 > 1024)
            fatal("the longest line of '%s' has %d characters: the GPT would need %d positions, more than 1024; pass "
                  "--context N to cut longer lines", o->data, ds->max_len, ds->max_len + 1);
        o->model.context = ds->max_len + 1;
    }
    dataset_use_rows(ds, o->model.model == MODEL_GPT ? o->model.context : 0);
    if (n_params(&o->model) > 512L * 1024 * 1024) // cli_parse's estimate took a vocabulary of 256
        fatal("the model would have %.0f million parameters with the %d tokens of '%s'; this project caps it at 512 "
              "million (lower --emb, --hidden or --layers)", n_params(&o->model) / 1e6, ds->vocab, o->data);
    *cfg = o->model;
}

// Rows a process's buffers must hold: its share of a training batch, a validation pass,
// and the contexts of every name sampled at once.
static int pass_rows(const Options* o, long share) {
    long eval = o->model.model == MODEL_GPT ? 32 : 256; // model.h's eval_rows
    long rows = share > eval ? share : eval;
    return (int)(o->samples > rows ? o->samples : rows);
}

#pragma GCC diagnostic pop
#endif // CLI_H
