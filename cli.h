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

#include <dirent.h>
#include <fcntl.h>
#include <float.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/syscall.h> // SYS_renameat2, for put_in_place
long syscall(long number, ...); // declared by unistd.h only beyond -std=c11's POSIX
#endif

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
                     "dense; train.c, train_ep.c, and the GPT's train_3d.c --ep)"},
    {"top-k", "K", "with --experts: experts per token, 1 to 8 (default 1)"},
    {"shared-experts", "S", "with --experts: S more experts, 0 to 8, that every token passes through beside its top-k "
                            "(default 0; DeepSeek-V3 has 1)"},
    {"expert-hidden", "F", "gpt, with --experts: each expert's MLP width (default 4C, the dense block's; narrower, "
                           "\"fine-grained\" experts let more of them cost what a few wide ones do)"},
    {"capacity", "CF", "with --experts: an expert takes at most ceil(CF K B / X) of a batch's B tokens (gpt: its "
                      "positions with a target) (default 1.25)"},
    {"aux-loss", "A", "with --experts: weight of the load-balancing loss (default 0.01; none with --balance bias)"},
    {"router", "HOW", "with --experts: softmax (default; Switch, Mixtral) or sigmoid (DeepSeek-V3: sigmoid affinities, "
                      "the gates the chosen ones normalised to sum 1; top-1: the affinity itself)"},
    {"balance", "HOW", "with --experts: aux (default: the load-balancing loss) or bias (DeepSeek-V3's auxiliary-loss-"
                       "free balancing: a per-expert bias added to the affinities for choosing only, moved after each "
                       "step toward the expert's share of the tokens)"},
    {"bias-rate", "R", "with --balance bias: how far a bias moves a step (default 0.001)"},
    {"microbatches", "M", "the global batch as M microbatches, their gradients summed before one optimizer step "
                          "(default 1; the pipelines' own default is 4)"},
    {"recompute", "HOW", "gpt: activation recomputation: none (default), selective (attention's probabilities "
                         "recomputed in backward) or full (each block's activations from its input)"},
    {"precision", "HOW", "fp32 (default) or bf16: every matrix product's operands (linear layers, experts, router, "
                         "attention) rounded to bf16, as autocast does, the weights kept in fp32 and every sum as in "
                         "fp32 (exact where a layout splits it)"},
    {"seed", "N", "seed of every random number (default 42)"},
    {"eval-every", "N", "report progress and validation loss every N steps (default 2500; 0: end only)"},
    {"samples", "N", "names to generate at the end (default 10)"},
    {"log", "FILE", "write a CSV line per step: step, train loss, val loss, ms, tokens/s (--load: continues its own log)"},
    {"log-overwrite", NULL, "with --log: replace the file even if it is not a log of this run"},
    {"save", "FILE", "write a checkpoint (parameters and optimizer state) at the end, or on SIGINT, SIGTERM or SIGHUP, "
                     "then stop with exit status 75 (resume with --load)"},
    {"save-every", "N", "with --save: also write it every N steps"},
    {"keep", "K", "with --save: keep the last K checkpoints, FILE, FILE.1, ... (default 2)"},
    {"load", "FILE", "start from a checkpoint written by --save (any program's)"},
    {"trace", "FILE", "write the last step's events of every rank as a Chrome trace (Perfetto)"},
    {"summary", "FILE", "write the run's measured figures as key=value lines (make run reads them)"},
    {"max-line", "N", "longest accepted line of --data, in bytes (default 1024)"},
    {"timeout", "SECONDS", "end the job when no training step finishes for that long, saying where it waits (default 300; 0: never)"},
    {"allow-changes", NULL, "with --load: resume even with another seed, batch, optimizer setting, data file, --precision, or experts' microbatches"},
    {"quiet", NULL, "print only the results: validation loss and names"},
    {"help", NULL, "print this help"},
};
#define CLI_N_COMMON ((int)(sizeof cli_common / sizeof cli_common[0]))

// --reduce, a flag of the programs that add gradient sums from pieces: train.c (its
// microbatches) and train_dp.c (its ranks and microbatches). optim.h says what each way does.
#define CLI_REDUCE_FLAG                                                                                           \
    {"reduce", "HOW", "how the pieces of a gradient sum (microbatches, ranks) are added: exact (default: as "     \
                      "64-bit integers, the same bits in every layout), fp32 or bf16 (each piece rounded to it and " \
                      "added in it, as Megatron-LM or llm.c do; the run says from which step it parts from "        \
                      "./train --reduce HOW)"}

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
    fprintf(f, "usage: %s [flags] (each flag once)\n", run_line);
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
// One of n names (--recompute none|selective|full, ...): its index into *out
#define NAMES(names) ((int)(sizeof(names) / sizeof((names)[0])))
static const char* cli_choice(const char* flag, const char* s, const char* const* names, int n, int* out) {
    for (int k = 0; k < n; k++)
        if (!strcmp(s, names[k])) return *out = k, NULL;
    int at = snprintf(cli_error, sizeof cli_error, "--%s must be ", flag);
    for (int k = 0; k < n; k++)
        at += snprintf(cli_error + at, sizeof cli_error - (size_t)at, "%s%s", names[k], k == n - 1 ? "" : k == n - 2 ? " or " : ", ");
    snprintf(cli_error + at, sizeof cli_error - (size_t)at, ", got '%s'", s);
    return cli_error;
}
static const char* cli_reduce(const char* value, int* how) { return cli_choice("reduce", value, reduce_names, NAMES(reduce_names), how); }
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

// The folder of a path, and the name in it.
static void split_path(const char* path, char* dir, size_t n, const char** name) {
    const char* slash = strrchr(path, '/');
    if (!slash) snprintf(dir, n, "."), *name = path;
    else if (slash == path) snprintf(dir, n, "/"), *name = slash + 1;
    else snprintf(dir, n, "%.*s", (int)(slash - path), path), *name = slash + 1;
}

// Two paths name the same file: one that exists (the same inode), or, where neither exists
// yet, the same name in the same folder however it is spelled (./F, dir/../F).
static int same_file(const char* a, const char* b) {
    struct stat sa, sb;
    if (!a || !b) return 0;
    if (!strcmp(a, b)) return 1;
    int has_a = stat(a, &sa) == 0, has_b = stat(b, &sb) == 0;
    if (has_a || has_b) return has_a && has_b && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    char da[4096], db[4096];
    const char *na, *nb;
    split_path(a, da, sizeof da, &na);
    split_path(b, db, sizeof db, &nb);
    return !strcmp(na, nb) && stat(da, &sa) == 0 && stat(db, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// ----------------------------------------------------------------------------
// the files a run writes, and how to tell them from any other
//
// A run replaces the file at an output's path only if this project wrote it: if it reads as
// one of that kind, whole (a checkpoint: its header, its size and its checksum; a --log: its
// header and every line; a --summary and a --trace: every line), not if it merely begins as
// one would. A recogniser reads a whole file from its start and returns NULL if it is one of
// its kind, or why not: a phrase that follows "it" ("is cut short at line 3"). tests/fuzz.c
// runs each on any bytes (make fuzz). The checkpoint's is ckpt.h's, since it reads the
// checkpoint's header: ckpt.h is included at the end of this file, so that either may be
// included first.
typedef const char* (*Recogniser)(FILE* f);
static const char* ckpt_recognise(FILE* f); // ckpt.h

#define LOG_HEADER "step,train_loss,val_loss,ms,tokens_per_s" // report.h's --log, its first line
#define LOG_LINE_MAX 256                                       // the longest line it writes
#define TRACE_FIRST_LINE "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [" // report.h's --trace

static char recognise_why[600];
#define NOT_OURS(...) return snprintf(recognise_why, sizeof recognise_why, __VA_ARGS__), recognise_why

// A line of f: its length in bytes, '\n' included, or -1 at the end of the file. Its first
// cap - 1 bytes are kept in buf, NUL-terminated (the rest read and dropped); *ended: it
// ends with '\n' (the last line of a file cut short does not).
static long recognise_line(FILE* f, char* buf, long cap, int* ended) {
    long n = 0;
    int c = EOF;
    while ((c = getc(f)) != EOF) {
        if (n < cap - 1) buf[n] = (char)c;
        n++;
        if (c == '\n') break;
    }
    buf[n < cap - 1 ? n : cap - 1] = 0;
    *ended = c == '\n';
    return n == 0 && c == EOF ? -1 : n;
}
// The line just read is whole in buf: it fits, and holds no NUL byte.
#define LINE_FITS(buf, n) ((n) < (long)sizeof(buf) && (long)strlen(buf) == (n))
// A number as report.h writes one (%.17g, %.4f, %.0f): decimal digits, a point, an exponent,
// a sign; or nan or inf. Not hexadecimal, not empty, nothing after it.
static int recognise_number(const char* s, size_t n) {
    static const char* const words[] = {"nan", "-nan", "inf", "-inf"};
    for (int i = 0; i < 4; i++)
        if (n == strlen(words[i]) && !memcmp(s, words[i], n)) return 1;
    char buf[64], *end;
    if (n == 0 || n >= sizeof buf) return 0;
    memcpy(buf, s, n);
    buf[n] = 0;
    if (strspn(buf, "0123456789.eE+-") != n) return 0;
    errno = 0;
    strtod(buf, &end);
    return *end == 0 && errno == 0; // (1e999 is written inf)
}
// A whole number of digits only, from lo to hi.
static int recognise_count(const char* s, size_t n, long lo, long hi) {
    if (n == 0 || n > 10 || strspn(s, "0123456789") < n || (n > 1 && s[0] == '0')) return 0;
    long v = 0;
    for (size_t i = 0; i < n; i++) v = 10 * v + (s[i] - '0');
    return v >= lo && v <= hi;
}

// report.h's --log: its header (with --experts, ",aux_loss" after it), then a line a step,
// "step,training loss,validation loss or nothing,ms,tokens/s" (and ",aux loss"), the steps
// in a row from any first (a run resumed with --log-overwrite starts after its checkpoint's).
// The last line may be cut short, where a run was killed while writing it (a resumed run
// continues that log): then what is there is the start of a line.
static const char* log_recognise(FILE* f) {
    char line[LOG_LINE_MAX + 2];
    int ended;
    long n = recognise_line(f, line, sizeof line, &ended), fields, step = 0;
    if (n == (long)strlen(LOG_HEADER) + 1 && !strcmp(line, LOG_HEADER "\n")) fields = 5;
    else if (n == (long)strlen(LOG_HEADER ",aux_loss") + 1 && !strcmp(line, LOG_HEADER ",aux_loss\n")) fields = 6;
    else NOT_OURS("does not begin with the header of a --log file ('%s')", LOG_HEADER);
    for (long no = 2; (n = recognise_line(f, line, sizeof line, &ended)) >= 0; no++) {
        if (!LINE_FITS(line, n)) NOT_OURS("has a line %ld that no run writes (too long, or a NUL byte)", no);
        if (!ended) { // the last line, cut short: the start of a line
            long commas = 0;
            for (long i = 0; i < n; i++) commas += line[i] == ',';
            if ((long)strspn(line, "0123456789.eE+-naif,") != n || commas >= fields)
                NOT_OURS("ends in a line %ld that no run writes", no);
            break;
        }
        line[--n] = 0;
        const char* at = line;
        for (long k = 0; k < fields; k++) { // field k ends at a comma (the last at the line's end)
            const char* comma = strchr(at, ',');
            size_t len = comma ? (size_t)(comma - at) : strlen(at);
            if ((comma != NULL) != (k < fields - 1))
                NOT_OURS("has a line %ld of another number of fields than a --log line's %ld", no, fields);
            int ok = k == 0 ? recognise_count(at, len, step ? step + 1 : 1, step ? step + 1 : 1000000000L)
                   : k == 2 ? len == 0 || recognise_number(at, len) : recognise_number(at, len);
            if (!ok && k == 0) NOT_OURS("has a line %ld whose step does not follow the line before's", no);
            if (!ok) NOT_OURS("has a line %ld that is not a --log line (its field %ld)", no, k + 1);
            if (k == 0) step = strtol(at, NULL, 10);
            at += len + 1;
        }
    }
    if (ferror(f)) NOT_OURS("cannot be read");
    return NULL;
}

// report.h's --summary: program, layout, model (since the cost model's replay: a summary
// written before has none), ranks, val_loss, seconds, steps and batch, a line each in that
// order; a name= line per name generated; then a rank= line per rank, in order, each of
// key=number pairs; nothing after. Every number by util.h's summary_value, the rule
// tools/summary.h reads them by.
static const char* summary_recognise(FILE* f) {
    static const char* const keys[] = {"program=", "layout=", "ranks=", "val_loss=", "seconds=", "steps=", "batch="};
    char line[1024];
    long n, no = 0, ranks = 0, rank = 0, model = 0;
    int ended;
    while ((n = recognise_line(f, line, sizeof line, &ended)) >= 0) {
        no++;
        if (!ended) NOT_OURS("is cut short in its line %ld", no);
        int fits = LINE_FITS(line, n);
        if (fits) line[--n] = 0; // without its '\n'
        if (no == 3 && fits && !strncmp(line, "model=", 6) && n > 6) { // the model's words: any text
            model = 1;
            continue;
        }
        long key = no - model; // which of keys[] this line should be
        if (key <= 7) {
            size_t k = strlen(keys[key - 1]);
            const char* v = line + k;
            int ok = fits && !strncmp(line, keys[key - 1], k);
            if (ok && key == 1) ok = (size_t)n > k;
            if (!ok) NOT_OURS("has no line '%s...' as its line %ld, as a --summary file does", keys[key - 1], no);
            double x;
            const char* why = key >= 3 ? summary_value(line, k - 1, v, (size_t)n - k, &x) : NULL;
            if (why) NOT_OURS("has a line %ld that is not a --summary file's: %s", no, why);
            if (key == 3) ranks = (long)x;
        } else if (rank == 0 && !strncmp(line, "name=", 5)) {
            // a name generated: any characters, any length
        } else {
            if (!fits || strncmp(line, "rank=", 5)) NOT_OURS("has a line %ld that is not a --summary file's", no);
            if (rank == ranks) NOT_OURS("has more rank lines than its %ld ranks", ranks);
            for (char* at = line; *at;) { // key=number, separated by spaces; the first rank=this rank
                char* end = at + strcspn(at, " ");
                char* eq = memchr(at, '=', (size_t)(end - at));
                double x = -1;
                const char* why = eq ? summary_value(at, (size_t)(eq - at), eq + 1, (size_t)(end - eq - 1), &x)
                                     : "a word that is not key=number";
                if (!why && at == line && x != rank) why = "its rank= is not the line's rank";
                if (why) NOT_OURS("has a line %ld that is not a --summary file's line of rank %ld: %s", no, rank, why);
                at = *end ? end + 1 : end;
            }
            rank++;
        }
    }
    if (ferror(f)) NOT_OURS("cannot be read");
    if (no - model < 7) NOT_OURS("ends at line %ld, before its line '%s...', as a --summary file has", no, keys[no - model]);
    if (rank != ranks) NOT_OURS("is cut short: it ends at line %ld, with %ld of its %ld rank lines", no, rank, ranks);
    return NULL;
}

// report.h's --trace: its first line, an event a line, "]}" last.
static const char* trace_recognise(FILE* f) {
    char line[1024];
    int ended, end = 0;
    long n = recognise_line(f, line, sizeof line, &ended), no = 1;
    if (n < 0 || strcmp(line, TRACE_FIRST_LINE "\n")) NOT_OURS("does not begin as a --trace file does");
    while ((n = recognise_line(f, line, sizeof line, &ended)) >= 0) {
        no++;
        if (end) NOT_OURS("goes on after its end (line %ld)", no);
        end = !strcmp(line, "]}\n");
        int event = LINE_FITS(line, n) && !strncmp(line, "{\"name\": \"", 10) &&
                    (!strcmp(line + n - 2, "}\n") || !strcmp(line + n - 3, "},\n"));
        if (!event && !end) NOT_OURS("has a line %ld that is not a trace event", no);
    }
    if (ferror(f)) NOT_OURS("cannot be read");
    if (!end) NOT_OURS("is cut short (it does not end with ']}')");
    return NULL;
}

// What is at an output's path: nothing; an empty file (nothing to lose); a file of this
// project, one the recogniser reads whole as its kind; a file of something else (why not
// ours is in path_why); or not a regular file at all (path_why says so: a folder, a device, a
// named pipe, a symbolic link: lstat, not open, so that a pipe never blocks; an output given
// as a link is followed first, output_follow below).
enum { PATH_ABSENT, PATH_EMPTY, PATH_OURS, PATH_FOREIGN, PATH_NOT_FILE };
static const char* path_why;
static int path_holds(const char* path, Recogniser ours) {
    struct stat st;
    path_why = "";
    if (lstat(path, &st) != 0) return errno == ENOENT ? PATH_ABSENT : (path_why = "is not a regular file", PATH_NOT_FILE);
    if (!S_ISREG(st.st_mode)) return path_why = "is not a regular file", PATH_NOT_FILE;
    if (st.st_size == 0) return PATH_EMPTY;
    FILE* f = fopen(path, "rb");
    if (!f) return path_why = "cannot be read", PATH_FOREIGN;
    path_why = ours(f);
    fclose(f);
    return path_why ? PATH_FOREIGN : PATH_OURS;
}
// What path_holds found is a user's (or not a file at all): never to be replaced.
static int path_not_ours(int held) { return held == PATH_FOREIGN || held == PATH_NOT_FILE; }

// rename(2) with Linux's flags: 1 fails if `to` exists (RENAME_NOREPLACE), 2 swaps the two
// names (RENAME_EXCHANGE). Elsewhere, or on a file system without them, fails with ENOSYS or
// EINVAL, and put_in_place checks, then renames.
static int rename_flags(const char* from, const char* to, unsigned flags) {
#if defined(__linux__) && defined(SYS_renameat2)
    return (int)syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, flags);
#else
    (void)from, (void)to, (void)flags;
    return errno = ENOSYS, -1;
#endif
}

// Puts the new file at `tmp` (a name of this process's own) at `path` in one step, unless what
// is at path now is not this project's (a file put there during the run): path holds the old
// file or the new one at every moment. A check of path and then a rename would leave a gap
// between the two, in which a user's file could arrive and be replaced; so the new file and
// path's file swap names, and the old one is read at tmp: if it is not ours, they swap back,
// and the user's file is at path again, untouched. Returns what path held: PATH_ABSENT,
// PATH_EMPTY or PATH_OURS (now replaced; tmp is gone), or PATH_FOREIGN or PATH_NOT_FILE
// (nothing replaced, path_why says why; tmp is gone too); -1 on an error (errno), the new
// file still at tmp.
static int put_in_place(const char* tmp, const char* path, Recogniser ours) {
    struct stat mine, st;
    if (lstat(tmp, &mine) != 0) return -1;
    for (int tries = 0; tries < 8; tries++) {
        if (rename_flags(tmp, path, 1) == 0) return PATH_ABSENT;
        if (errno != EEXIST) break; // no such flags here (or a real error: the plain rename below says)
        if (rename_flags(tmp, path, 2) != 0) {
            if (errno == ENOENT) continue; // path went away in between: try again
            break;
        }
        int held = path_holds(tmp, ours); // path's file, now at tmp
        if (!path_not_ours(held)) return unlink(tmp), held;
        if (rename_flags(tmp, path, 2) != 0)
            fatal("could not put back the file found at '%s' (%s); it is now at '%s'", path, strerror(errno), tmp);
        // what came back to tmp is the new file, unless yet another file was put at path meanwhile
        if (lstat(tmp, &st) == 0 && (st.st_dev != mine.st_dev || st.st_ino != mine.st_ino))
            fatal("two files were put at '%s' while this run wrote it: the first is there, the second is now at '%s'",
                  path, tmp);
        return unlink(tmp), held;
    }
    int held = path_holds(path, ours); // no swap here: check, then rename
    if (path_not_ours(held)) return unlink(tmp), held;
    if (rename(tmp, path) != 0) return -1;
    if (lstat(tmp, &st) == 0 && st.st_dev == mine.st_dev && st.st_ino == mine.st_ino)
        unlink(tmp); // tmp and path were two names of one file, which rename leaves as they are
    return held;
}

// A new file at `path` for writing, never an existing one: a name left by a killed process is
// removed first (remove_stale_temporaries), and where one appears anyway, this fails (EEXIST)
// rather than writing into a file that may have other names.
static FILE* create_new(const char* path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0666);
    FILE* f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (fd >= 0 && !f) close(fd);
    return f;
}

// An output given as a symbolic link is the file the link leads to (through any chain of
// links; a link to nothing yet, the file it names): the run writes there and the link stays,
// where a save, which renames a new file into place, would have replaced the link itself.
// The path to write into out; NULL, or why the link cannot be followed.
static const char* output_follow(const char* path, char* out, size_t n) {
    char at[4096], target[4096];
    if (snprintf(at, sizeof at, "%s", path) >= (int)sizeof at) return "is too long a path";
    for (int hops = 0; hops < 40; hops++) {
        struct stat st;
        if (lstat(at, &st) != 0 || !S_ISLNK(st.st_mode)) {
            if (snprintf(out, n, "%s", at) >= (int)n) return "is too long a path";
            return NULL;
        }
        ssize_t k = readlink(at, target, sizeof target - 1);
        if (k < 0) return "is a symbolic link that cannot be read";
        target[k] = 0;
        const char* slash = strrchr(at, '/');
        if (target[0] != '/' && slash) { // relative to the link's folder
            char dir[4096];
            snprintf(dir, sizeof dir, "%.*s", (int)(slash - at), at);
            if (snprintf(at, sizeof at, "%s/%s", dir, target) >= (int)sizeof at) return "leads to too long a path";
        } else {
            snprintf(at, sizeof at, "%s", target);
        }
    }
    return "is a symbolic link in a chain of more than 40 (a loop?)";
}

// Whether this process met the file `st` describes before (it remembers up to 64): a foreign
// temporary is warned about once a run, not at every save of --save-every 1.
static int seen_before(const struct stat* st) {
    static struct {
        dev_t dev;
        ino_t ino;
    } seen[64];
    static int n;
    for (int i = 0; i < n; i++)
        if (seen[i].dev == st->st_dev && seen[i].ino == st->st_ino) return 1;
    if (n < 64) seen[n].dev = st->st_dev, seen[n].ino = st->st_ino, n++;
    return 0;
}
// Removes the temporaries of output `path` (path.tmp-PID, and the checkpoint rotation's
// path.K.tmp-PID) left by processes that no longer run on this machine (killed while writing),
// or by an earlier process with this one's PID (a job requeued in a fresh container): this
// process has none of its own when it starts a file. Only what reads as one of the output's
// kind is removed: empty, or beginning with `start` (a file cut short included). Anything else
// may be a user's file that a save, killed while checking it, had moved aside (put_in_place):
// it stays, with a warning, and where its name is this process's, the save stops.
static void remove_stale_temporaries(const char* path, const char* start) {
    char dir[4096], full[8400], head[256];
    const char* base;
    split_path(path, dir, sizeof dir, &base);
    DIR* d = opendir(dir);
    if (!d) return;
    size_t nb = strlen(base), ns = strlen(start) < sizeof head ? strlen(start) : sizeof head;
    for (struct dirent* e; (e = readdir(d));) {
        const char* rest = e->d_name + nb;
        if (strncmp(e->d_name, base, nb) != 0 || *rest != '.') continue;
        if (rest[1] >= '0' && rest[1] <= '9') // path.K.tmp-PID
            for (rest++; *rest >= '0' && *rest <= '9'; rest++) {}
        if (strncmp(rest, ".tmp-", 5) != 0 || rest[5] < '1' || rest[5] > '9' || strlen(rest + 5) > 9 ||
            strspn(rest + 5, "0123456789") != strlen(rest + 5))
            continue;
        long pid = atol(rest + 5);
        int own = pid == (long)getpid();
        if (!own && (kill((pid_t)pid, 0) == 0 || errno != ESRCH)) continue; // it runs (or may)
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(full, &st) != 0) continue; // gone since the listing
        FILE* f = S_ISREG(st.st_mode) ? fopen(full, "rb") : NULL;
        int ours = f && (st.st_size == 0 || (fread(head, 1, ns, f) == ns && !memcmp(head, start, ns)));
        if (f) fclose(f);
        if (ours) {
            unlink(full);
            continue;
        }
        if (own)
            fatal("'%s' is in the way of this run's temporary file, and is not one of this project's files: a run "
                  "killed while it checked a file that had appeared at '%s' may have left it there; move it, then "
                  "run again", full, path);
        if (!seen_before(&st))
            fprintf(stderr, "warning: '%s' is not one of this project's files: a run killed while it checked a file "
                            "that had appeared at '%s' may have left it there; it is left alone\n", full, path);
    }
    closedir(d);
}

// An output written whole at once (--summary, --trace, tools/schedules' picture): into
// PATH.tmp-PID, then renamed over PATH, so that PATH is the old file or the new one, whole,
// at every moment, never one cut short by a kill or a full disk (which a later run would
// refuse to replace, as it would not read as one of this project's files).
typedef struct {
    FILE* f;
    const char *path, *what;
    Recogniser ours; // what may be replaced (put_in_place)
    char tmp[4200];
} WholeFile;
static FILE* whole_open(WholeFile* w, const char* path, const char* what, Recogniser ours, const char* start) {
    remove_stale_temporaries(path, start);
    w->path = path, w->what = what, w->ours = ours;
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp-%ld", path, (long)getpid());
    w->f = create_new(w->tmp);
    if (!w->f) fatal("cannot create %s '%s': %s", what, path, strerror(errno));
    return w->f;
}
static void whole_close(WholeFile* w) {
    int failed = ferror(w->f) || fflush(w->f) != 0, err = errno, held = PATH_ABSENT;
    if (fclose(w->f) != 0 && !failed) failed = 1, err = errno;
    w->f = NULL;
    if (!failed && (held = put_in_place(w->tmp, w->path, w->ours)) < 0) failed = 1, err = errno;
    if (failed) {
        remove(w->tmp);
        fatal("cannot write %s '%s': %s; the file there before, if any, is untouched", w->what, w->path, strerror(err));
    }
    if (path_not_ours(held))
        fatal("cannot write %s '%s': the file there now is not one of this project's (it %s; it appeared during the "
              "run), and writing would replace it; nothing was written", w->what, w->path, path_why);
}

// Before any training: every output can be written where it is asked for, and writing it
// loses nothing the user had. An output's path is not empty; a symbolic link there is
// followed (output_follow: the output is the file it leads to, and o's path becomes that
// file's); its folder exists and can be written; it is not an input (--save may be --load:
// resuming overwrites the checkpoint it started from, safely, ckpt.h) nor another output; and
// whatever is there already is a file of this project of the same kind, whole, or nothing: a
// run never replaces a file it did not write, nor anything but a regular file. --save also
// checks the files its rotation renames (FILE.1 .. FILE.K-1 with --keep K). --log may
// replace another file with --log-overwrite; whether an existing log is this run's (to
// continue it) is report.h's check, once the checkpoint is read.
static const char* cli_check_outputs(Options* o) {
    const char* names[] = {"log", "save", "trace", "summary"};
    const char** paths[] = {&o->log, &o->save, &o->trace, &o->summary};
    const char* kinds[] = {"--log file", "checkpoint", "--trace file", "--summary file"};
    Recogniser ours[] = {log_recognise, ckpt_recognise, trace_recognise, summary_recognise};
    static char followed[4][4096];
    for (int i = 0; i < 4; i++) {
        const char* given = *paths[i];
        if (!given) continue;
        char dir[4096], what[5000] = "", file[4200], link[4200] = "";
        const char* why = !given[0] ? "is empty: give a file name" : output_follow(given, followed[i], sizeof followed[i]);
        const char* path = why ? given : (*paths[i] = followed[i]);
        if (strcmp(path, given)) snprintf(link, sizeof link, "(a symbolic link to '%s') ", path);
        snprintf(dir, sizeof dir, "%s", path);
        char* slash = strrchr(dir, '/');
        if (slash) slash == dir ? (void)(dir[1] = 0) : (void)(*slash = 0);
        else snprintf(dir, sizeof dir, ".");
        if (!why)
            why = same_file(path, o->data) ? "is the --data file"
                  : (i != 1 && same_file(path, o->load)) ? "is the --load checkpoint"
                  : access(dir, W_OK) != 0 ? "is in a folder that does not exist or cannot be written"
                  : (access(path, F_OK) == 0 && access(path, W_OK) != 0) ? "exists and cannot be written"
                                                                          : NULL;
        for (int j = 0; j < i && !why; j++)
            if (*paths[j] && same_file(path, *paths[j]))
                snprintf(what, sizeof what, "is also the --%s file", names[j]), why = what;
        for (int k = 1; i != 1 && o->save && k < o->keep && !why; k++) {
            snprintf(file, sizeof file, "%s.%d", o->save, k);
            if (same_file(path, file))
                snprintf(what, sizeof what, "is '%s', a name the --save rotation writes (--keep %d keeps %s, %s.1, ...)",
                         file, o->keep, o->save, o->save), why = what;
        }
        // what is there: the path itself, and for --save the files its rotation renames
        for (int k = 0; !why && k < (i == 1 ? o->keep : 1); k++) {
            if (k == 0) snprintf(file, sizeof file, "%s", path);
            else snprintf(file, sizeof file, "%s.%d", path, k);
            int held = path_holds(file, ours[i]);
            struct stat st;
            if (held == PATH_NOT_FILE && lstat(file, &st) == 0)
                snprintf(what, sizeof what, "%s%s%sis %s, not a regular file", k ? "with --keep, '" : "",
                         k ? file : "", k ? "' " : "", file_kind(st.st_mode));
            else if (held == PATH_NOT_FILE)
                snprintf(what, sizeof what, "cannot be looked at (%s)", strerror(errno));
            else if (held == PATH_FOREIGN && !(i == 0 && o->log_overwrite))
                snprintf(what, sizeof what, "%s%s%sexists and is not a %s of this project (a run replaces only its own "
                         "files%s): it %s", k ? "with --keep, '" : "", k ? file : "", k ? "' (which the rotation would rename) " : "",
                         kinds[i], i == 0 ? "; pass --log-overwrite to replace it anyway" : "", path_why);
            if (what[0]) why = what;
        }
        if (why) {
            snprintf(cli_error, sizeof cli_error, "--%s '%s' %s%s: refusing to start (nothing was written)", names[i],
                     given, link, why);
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
                             .layers = -1, .experts = 0, .top_k = -1, .shared_experts = -1, .expert_hidden = -1, .capacity = -1.0f, .aux_loss = -1.0f,
                             .router = -1, .balance = -1, .bias_rate = -1.0f},
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
    const char* first[CLI_N_COMMON + 32]; // each flag's value where it was given (or "" for a switch), or NULL
    for (int i = 0; i < n; i++) first[i] = NULL;
    while (!*err && (c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        if (c == '?' || c == ':') {
            const char* bad = argv[optind - 1];
            // A single dash ("-steps") is read as short options, and getopt stops inside the word
            // before moving optind past it, so the word is the next one.
            int short_word = c == '?' && optopt > 0 && !(bad[0] == '-' && bad[1] == optopt);
            if (short_word && optind < argc) bad = argv[optind];
            if (c == '?' && bad[0] == '-' && bad[1] != '-' && bad[1])
                snprintf(cli_error, sizeof cli_error, "unknown flag '%s' (flags start with --)", bad);
            else
                snprintf(cli_error, sizeof cli_error, "%s '%s'", c == ':' ? "missing value for" : "unknown flag", bad);
            *err = cli_error;
            break;
        }
        // a flag given twice is refused, as every tool of the project does: the last one does
        // not silently win (a run line built from pieces, one of them stale, says so)
        int index = c >= 2000 ? CLI_N_COMMON + c - 2000 : c - 1000;
        if (index >= 0 && index < n && first[index]) {
            const char* flag = c >= 2000 ? extra[c - 2000].name : cli_common[c - 1000].name;
            if (optarg)
                snprintf(cli_error, sizeof cli_error, "--%s is given twice ('%s', then '%s'): give each flag once", flag,
                         first[index], optarg);
            else
                snprintf(cli_error, sizeof cli_error, "--%s is given twice: give each flag once", flag);
            *err = cli_error;
            break;
        }
        if (index >= 0 && index < n) first[index] = optarg ? optarg : "";
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
        else if (!strcmp(name, "top-k")) *err = cli_int(name, optarg, 1, MAX_TOP_K, &o->model.top_k);
        else if (!strcmp(name, "shared-experts")) *err = cli_int(name, optarg, 0, MAX_SHARED_EXPERTS, &o->model.shared_experts);
        else if (!strcmp(name, "expert-hidden")) *err = cli_int(name, optarg, 1, 65536, &o->model.expert_hidden);
        else if (!strcmp(name, "capacity")) *err = cli_float(name, optarg, 0.0, 1e6, 1, &o->model.capacity);
        else if (!strcmp(name, "microbatches")) *err = cli_int(name, optarg, 1, 65536, &o->microbatches);
        else if (!strcmp(name, "recompute")) *err = cli_choice(name, optarg, recompute_names, NAMES(recompute_names), &o->model.recompute);
        else if (!strcmp(name, "precision")) *err = cli_choice(name, optarg, precision_names, NAMES(precision_names), &o->model.precision);
        else if (!strcmp(name, "aux-loss")) *err = cli_float(name, optarg, 0.0, 1.0, 0, &o->model.aux_loss); // Switch: 0.01
        else if (!strcmp(name, "router")) *err = cli_choice(name, optarg, router_names, NAMES(router_names), &o->model.router);
        else if (!strcmp(name, "balance")) *err = cli_choice(name, optarg, balance_names, NAMES(balance_names), &o->model.balance);
        else if (!strcmp(name, "bias-rate")) *err = cli_float(name, optarg, 0.0, 1.0, 1, &o->model.bias_rate);
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
    if (!*err && o->allow_changes && !o->load) {
        snprintf(cli_error, sizeof cli_error, "--allow-changes applies to --load FILE only");
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
    if (!*err && m->experts == 0 && (m->top_k >= 0 || m->capacity >= 0 || m->aux_loss >= 0 || m->router >= 0 ||
                                     m->balance >= 0 || m->bias_rate >= 0 || m->shared_experts >= 0)) {
        snprintf(cli_error, sizeof cli_error, "--top-k, --shared-experts, --capacity, --aux-loss, --router, --balance "
                 "and --bias-rate apply with --experts X only");
        *err = cli_error;
    }
    if (m->shared_experts < 0) m->shared_experts = 0;
    if (!*err && m->balance != BALANCE_BIAS && m->bias_rate >= 0) {
        snprintf(cli_error, sizeof cli_error, "--bias-rate applies with --balance bias: the loss balances the "
                 "experts otherwise, and no bias moves");
        *err = cli_error;
    }
    if (!*err && m->balance == BALANCE_BIAS && m->aux_loss >= 0) {
        snprintf(cli_error, sizeof cli_error, "--aux-loss with --balance bias: the bias balances the experts in "
                 "place of the loss; pass one of them");
        *err = cli_error;
    }
    if (!*err && m->expert_hidden >= 0 && (!gpt || m->experts == 0)) {
        snprintf(cli_error, sizeof cli_error, "--expert-hidden applies to --model gpt with --experts X%s",
                 gpt ? "" : ": the MLP's expert is one linear layer, --hidden wide like the layer it replaces");
        *err = cli_error;
    }
    if (m->expert_hidden < 0) m->expert_hidden = 0; // 0: 4C, the dense block's width
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
    if (m->router < 0) m->router = ROUTER_SOFTMAX;
    operands_bf16 = m->precision == PRECISION_BF16; // the kernels' rounding, before any product
    if (m->balance < 0) m->balance = BALANCE_AUX;
    if (m->aux_loss < 0) m->aux_loss = m->balance == BALANCE_BIAS ? 0.0f : 0.01f;
    if (m->bias_rate < 0) m->bias_rate = m->balance == BALANCE_BIAS ? 0.001f : 0.0f;
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
    double t_e = (double)o->model.context * o->model.emb, h = o->model.hidden, C = m->emb, F = expert_width(m);
    double x = m->experts > 0 ? m->experts : 1, xs = x + m->shared_experts; // experts, and with the shared ones
    double hidden = (t_e * h + (m->layers - 1) * h * h + h * m->layers) * xs;
    double total = 256.0 * o->model.emb + hidden + (m->experts > 0 ? (t_e + (m->layers - 1) * h) * x : 0) + h * 257;
    if (gpt) // vocabulary and T at most 256, 1024; a block's attention, LayerNorms and router, and its MLP or experts
        total = 2.0 * 256 * C + 1024 * C +
                m->layers * (4 * C * C + 8 * C + (m->experts > 0 ? C * x : 0) + xs * ((2 * C + 1) * F + C));
    if (total > 512.0 * 1024 * 1024) {
        snprintf(cli_error, sizeof cli_error,
                 "the model would have about %.0f million parameters; this project caps it at 512 million "
                 "(lower --context, --emb, --hidden, --layers, --experts or --expert-hidden)", total / 1e6);
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

// The GPT's context is by default the longest line + 1, so one long line makes every row
// long: said before step 1, once, when the longest line more than doubles the positions that
// 99 lines in 100 need (and at least every line but the longest): which line, how long,
// what it costs, and --context. The result is the same; the warning says what it costs.
// (names.txt's longest name, 15 characters, sets a context of 16 for names of up to 11 in
// 99 cases in 100: no word.)
static void gpt_context_warning(const Dataset* ds, const char* path) {
    long* count = callocCheck((size_t)ds->max_len + 1, sizeof(long)); // lines of each length
    for (int i = 0; i < ds->n_lines; i++) count[ds->line_len[i]]++;
    long most = ds->n_lines / 100 > 1 ? ds->n_lines / 100 : 1, longer = 0; // lines that may be longer than `need`
    int need = ds->max_len;
    while (need > 0 && longer + count[need] <= most) longer += count[need--];
    free(count);
    int T = ds->max_len + 1;
    double r = (double)T / (need + 1);
    if (T <= 2 * (need + 1) || !prints_for_job) return;
    fprintf(stderr, "warning: line %ld of '%s' has %d characters, so the GPT's context (by default the longest line + 1) "
            "is %d positions in every row, where %ld of its %d lines have at most %d characters: a step takes about %.0f "
            "times the time and memory of --context %d (its attention %.0f times). Pass --context N to cut the lines "
            "longer than N - 1 characters (each then trains on its first N), or shorten that line\n",
            ds->max_len_line, path, ds->max_len, T, ds->n_lines - longer, ds->n_lines, need, r, need + 1, r * r);
    fflush(stderr);
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
        gpt_context_warning(ds, o->data);
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

// ckpt.h's checkpoint reader (ckpt_recognise, above), which needs this file's Options: either
// header may be included first, and each then has the other whole.
#include "ckpt.h"
#endif // CLI_H
