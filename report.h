/*
 * report.h: what every program measures and prints, so that a strategy file calls it from
 * two or three places and shows its strategy: the configuration table; the progress of
 * training (a line every --eval-every steps, the CSV --log, the time of each step); the
 * results (validation loss, names); the figures each rank measured (bytes sent and
 * received, memory held, the pipeline's bubble) beside the formulas that predict them;
 * --summary files for make run; --timeline pictures; --trace files for Perfetto.
 */
#ifndef REPORT_H
#define REPORT_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "ckpt.h"
#include "cli.h"

#include <signal.h>

// ----------------------------------------------------------------------------
// the configuration, and the results

static void print_config(const Options* o, const Dataset* ds, const char* layout) {
    const Config* c = &o->model;
    printf("configuration\n");
    printf("  data       %s: %d lines (%d train, %d validation), %d tokens, %ld training examples\n", o->data,
           ds->n_lines, ds->n_train, ds->n_val, ds->vocab, ds->n_train_examples);
    if (is_gpt(c))
        printf("  model      gpt: context %d, width %d, %d heads of %d, %d blocks (MLP %d): %ld parameters\n", c->context,
               c->emb, c->heads, c->emb / c->heads, c->layers, 4 * c->emb, n_params(c));
    else
        printf("  model      context %d, emb %d, hidden %d, layers %d: %ld parameters\n", c->context, c->emb, c->hidden,
               c->layers, n_params(c));
    if (c->experts > 0 && is_gpt(c))
        printf("  experts    every block's MLP a mixture of %d experts of width %d: top-%d, capacity factor %g, ",
               c->experts, expert_width(c), c->top_k, c->capacity);
    else if (c->experts > 0)
        printf("  experts    every hidden layer a mixture of %d experts: top-%d, capacity factor %g, ", c->experts,
               c->top_k, c->capacity);
    if (c->shared_experts > 0) printf("%d shared, ", c->shared_experts);
    if (c->experts > 0 && c->router == ROUTER_SIGMOID) printf("sigmoid router, ");
    if (c->experts > 0 && c->balance == BALANCE_BIAS) printf("balanced by a bias moving %g a step\n", c->bias_rate);
    else if (c->experts > 0) printf("aux loss weight %g\n", c->aux_loss);
    if (c->precision == PRECISION_BF16)
        printf("  precision  bf16 operands in every matrix product, fp32 weights (the master copy), sums as in fp32\n");
    printf("  optimizer  %s, lr %g, weight decay %g, clip %s", o->opt.adamw ? "adamw" : "sgd", o->opt.lr,
           o->opt.weight_decay, o->opt.clip > 0 ? "" : "off");
    if (o->opt.clip > 0) printf("%g", o->opt.clip);
    printf("\n  training   %ld steps of %d rows, seed %llu%s%s\n", o->steps, o->batch, (unsigned long long)o->seed,
           o->load ? ", from " : "", o->load ? o->load : "");
    if (ckpt_changed[0]) printf("  changed    from the checkpoint's settings (--allow-changes):%s\n", ckpt_changed);
    printf("  layout     %s\n", layout);
    fflush(stdout);
}

// The validation loss is the mean over the validation split's targets (model.h's mean_loss),
// and the count printed is theirs: the MLP's examples, a target each; the GPT's characters
// and ends of its lines within --context (a line cut by it scores its first T characters).
static void print_results(double val_loss, double seconds, long steps, int batch, const int* names, int n_names,
                          int max_len, const Dataset* ds, int quiet) {
    if (ds->seq_len) printf("validation loss %.4f (%ld targets, in %d lines)\n", val_loss, ds->n_val_targets, ds->n_val);
    else printf("validation loss %.4f (%ld examples)\n", val_loss, ds->n_val_targets);
    if (!quiet && steps > 0)
        printf("training time %.2f s: %.4f ms/step, %.0f tokens/s\n", seconds, 1e3 * seconds / steps,
               seconds > 0 ? (double)steps * batch / seconds : 0.0);
    if (n_names > 0) printf("names:\n");
    for (int i = 0; i < n_names; i++) {
        dataset_write_name(ds, names + (long)i * (max_len + 1), max_len + 1, stdout);
        putchar('\n');
    }
    fflush(stdout);
}

// Progress of the training loop: the CSV log (one line per step, the losses in full
// precision so that logs of different programs can be compared for identity), a progress
// line every --eval-every steps, and the training time. In MPI programs only rank 0 prints.
// --save: how a program writes its checkpoint at a step (every rank calls it), and how its
// ranks agree on a flag (dist.h's dist_any; NULL for one process).
typedef void (*SaveFn)(void* ctx, const Options* o, long step);
typedef int (*AgreeFn)(int flag);

typedef struct {
    const Options* o;
    SaveFn save;
    void* save_ctx;
    AgreeFn agree;
    long saved;      // the step of the last checkpoint written, or -1
    int printing;    // this process prints and logs
    FILE* log;
    double seconds;  // time spent in training steps
    long steps;      // steps trained
    double interval_loss, interval_seconds;
    long interval_steps;
    int record_last;     // record the last step's trace events even without --trace (train_ep.c --timeline)
    double aux;          // --experts: the load-balancing loss of the step ending (the program sets it)
    double aux_sum, interval_aux, aux_last;
    double t0;       // when the current step began
    int stopped;     // a signal stopped training (step_end): save_at ends the run, EXIT_STOPPED
} Progress;

// SIGINT, SIGTERM or SIGHUP (a closed terminal or ssh session) with --save: the first asks training to stop after the current step,
// with a checkpoint, and the run then ends with status EXIT_STOPPED (util.h); a second, a
// second or more later, ends the process at once. Signals within a second of the first are
// the same request, come by
// several ways: a scheduler signals every process of a job, and mpirun forwards what it got
// to the ranks too, so a rank may get two at once and must still save.
static volatile sig_atomic_t stop_signals;
static struct timespec stop_first; // when the first came (CLOCK_MONOTONIC)
static void on_stop_signal(int sig) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now); // async-signal-safe
    long ms = (now.tv_sec - stop_first.tv_sec) * 1000L + (now.tv_nsec - stop_first.tv_nsec) / 1000000L;
    if (stop_signals && ms >= 1000) signal(sig, SIG_DFL), raise(sig);
    if (!stop_signals++) stop_first = now;
}

// --timeout: when no training step has begun for that long, a rank is stuck (a stopped or
// hung process, a lost message): say where this rank waits, and end the whole job.
static int watchdog_seconds;
static void on_watchdog(int sig) {
    (void)sig;
    const char* w = waiting_for;
    fatal("watchdog: no training step finished in %d s (--timeout) after step %ld; this process is %s%s%s",
          watchdog_seconds, current_step, w ? "waiting for " : "computing", w ? w : "", w ? " (another process is stuck or stopped)" : "");
}

// Winds the watchdog up again for work after training that is progress too: a checkpoint
// written, a program's own report (train_pp.c's checker).
static void watchdog_wind(const Options* o) {
    if (o->timeout > 0) alarm((unsigned)o->timeout);
}

// --log: a new log (its header, then a line per step), or, when a resumed run (--load) finds
// a log at its path, that log continued if it is this run's, so that the log of a run
// stopped and resumed is whole. It is this run's when the training losses of its lines of
// steps 1 to S, the checkpoint's step, are the ones the checkpoint records (ckpt_losses);
// its lines after S (steps trained after the last checkpoint, before a kill) are cut, and
// training appends from S + 1. Another log is refused unless --log-overwrite says to
// replace it (cli.h has refused, before this, any file that is not a log of this project).
// NULL if the log at `path` is this run's up to step S (and *end is the offset after its line
// of step S), or why it is not.
static const char* log_is_this_run(const char* path, int moe, long S, uint64_t losses, long* end) {
    static char why[160];
    if (losses == 0) return "the checkpoint does not record the run's losses (it has format 2 or 3), so the log cannot be checked";
    FILE* f = fopen(path, "rb");
    if (!f) return snprintf(why, sizeof why, "it cannot be read (%s)", strerror(errno)), why;
    char line[LOG_LINE_MAX + 2], header[64];
    snprintf(header, sizeof header, "%s%s\n", LOG_HEADER, moe ? ",aux_loss" : "");
    const char* bad = NULL;
    if (!fgets(line, sizeof line, f) || strcmp(line, header) != 0) bad = "its header is another model's (--experts)";
    uint64_t sum = FNV_START;
    for (long step = 1; !bad && step <= S; step++) {
        char* comma = NULL; // the end of "step,training loss"
        if (fgets(line, sizeof line, f) && strchr(line, '\n') && strtol(line, NULL, 10) == step && strchr(line, ','))
            comma = strchr(strchr(line, ',') + 1, ',');
        if (!comma) {
            snprintf(why, sizeof why, "it has no line of step %ld, and the checkpoint is at step %ld", step, S);
            bad = why;
            break;
        }
        sum = fnv1a(fnv1a(sum, line, (size_t)(comma - line)), "\n", 1);
    }
    if (!bad && sum != losses) {
        snprintf(why, sizeof why, "its training losses of steps 1 to %ld are not the ones the checkpoint records", S);
        bad = why;
    }
    *end = ftell(f);
    fclose(f);
    return bad;
}
static FILE* log_open(const Options* o) {
    int moe = o->model.experts > 0;
    if (o->load && !o->log_overwrite && path_holds(o->log, log_recognise) == PATH_OURS) {
        long end = 0;
        const char* why = log_is_this_run(o->log, moe, ckpt_losses.step, ckpt_losses.sum, &end);
        if (why)
            fatal("--log '%s' is not the log of the run that checkpoint '%s' continues: %s. Give another --log, or pass "
                  "--log-overwrite to replace it", o->log, o->load, why);
        if (truncate(o->log, end) != 0) fatal("cannot continue log '%s': %s", o->log, strerror(errno));
        FILE* f = fopen(o->log, "a");
        if (!f) fatal("cannot continue log '%s': %s", o->log, strerror(errno));
        return f;
    }
    FILE* f = fopen(o->log, "w");
    if (!f) fatal("cannot create log '%s': %s", o->log, strerror(errno));
    fprintf(f, "%s%s\n", LOG_HEADER, moe ? ",aux_loss" : "");
    return f;
}

static Progress progress_start(const Options* o, int printing, SaveFn save, void* save_ctx, AgreeFn agree) {
    Progress p = {.o = o, .printing = printing, .save = save, .save_ctx = save_ctx, .agree = agree, .saved = -1};
    if (o->timeout > 0) {
        watchdog_seconds = o->timeout;
        struct sigaction sa = {.sa_handler = on_watchdog};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGALRM, &sa, NULL);
        alarm((unsigned)o->timeout);
    }
    if (o->save) {
        struct sigaction sa = {.sa_handler = on_stop_signal};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGHUP, &sa, NULL);
    }
    if (printing && o->log) p.log = log_open(o);
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
    p->aux_sum += p->aux, p->interval_aux += p->aux, p->aux_last = p->aux;
    int moe = p->o->model.experts > 0;
    if (!p->printing) return;
    if (p->log || p->o->save) { // the losses a checkpoint records (on the process that writes it), as the log's line begins
        char text[LOSSES_TEXT];
        int n = ckpt_losses_add(text, step, train_loss);
        if (p->log) fwrite(text, 1, (size_t)n, p->log);
    }
    if (p->log) {
        fputc(',', p->log);
        if (due) fprintf(p->log, "%.17g", val_loss);
        fprintf(p->log, ",%.4f,%.0f", 1e3 * seconds, seconds > 0 ? B / seconds : 0.0);
        if (moe) fprintf(p->log, ",%.17g", p->aux);
        fprintf(p->log, "\n");
    }
    if (due && !p->o->quiet) {
        int w = snprintf(NULL, 0, "%ld", p->o->steps);
        double s = p->interval_seconds;
        printf("step %*ld/%ld | train loss %.4f | val loss %.4f | %.3f ms/step | %.0f tokens/s", w, step,
               p->o->steps, p->interval_loss / p->interval_steps, val_loss, 1e3 * s / p->interval_steps,
               s > 0 ? p->interval_steps * B / s : 0.0);
        if (moe) printf(" | aux loss %.4f", p->interval_aux / p->interval_steps);
        printf("\n");
        fflush(stdout);
        p->interval_loss = p->interval_seconds = p->interval_aux = 0.0;
        p->interval_steps = 0;
    }
}
// A training step begins: time it, and count its messages (dist.h) while it runs; with
// --trace, record the events of the last one.
static void step_begin(Progress* p, long step) {
    current_step = step;
    if (p->o->timeout > 0) alarm((unsigned)p->o->timeout); // the watchdog, wound up again
    step_window_open((p->o->trace || p->record_last) && step == p->o->steps);
    p->t0 = now_seconds();
}
static void progress_end(Progress* p) {
    if (p->o->timeout > 0) alarm((unsigned)p->o->timeout); // validation and sampling: one more span
    if (p->log && fclose(p->log) != 0) fatal("cannot write log '%s': %s", p->o->log, strerror(errno));
    p->log = NULL;
}
// The checkpoint of --save at `step`, unless it is written already. After training a signal
// stopped (step_end), the run ends here, its checkpoint written and its log closed, with
// status EXIT_STOPPED (util.h: 75, "stopped: resume it"), not 0, which says it finished; in
// an MPI program every rank ends so, together (dist.h's dist_init).
static void save_at(Progress* p, long step) {
    if (p->o->save && p->saved != step) {
        watchdog_wind(p->o); // a finished run is not stopped before its checkpoint is written
        if (p->log && fflush(p->log) != 0) fatal("cannot write log '%s': %s", p->o->log, strerror(errno)); // the log holds what the checkpoint records
        p->save(p->save_ctx, p->o, step);
        p->saved = step;
    }
    if (p->stopped) {
        progress_end(p);
        if (fflush(stdout) != 0 || ferror(stdout)) fatal("cannot write to the standard output: %s", strerror(errno));
        exit_program(EXIT_STOPPED);
    }
}

// A training step ends, with its mean training loss; `validate` runs when a progress line
// is due (it returns the validation loss). With --save, the checkpoint is written every
// --save-every steps, and, if a SIGINT, SIGTERM or SIGHUP reached any rank, now: then it returns 1,
// training stops, and every rank stops after the same step.
typedef double (*ValidateFn)(void* ctx);
static int step_end(Progress* p, long step, double train_loss, ValidateFn validate, void* ctx) {
    double seconds = now_seconds() - p->t0;
    step_window_close();
    progress_step(p, step, train_loss, seconds, progress_due(p, step) ? validate(ctx) : 0);
    if (!p->o->save) return 0;
    int stop = p->agree ? p->agree(stop_signals > 0) : stop_signals > 0;
    if (stop || (p->o->save_every > 0 && step % p->o->save_every == 0)) save_at(p, step);
    if (stop && p->printing)
        fprintf(stderr, "stopped by a signal after step %ld: checkpoint '%s' written; resume with --load %s (exit status "
                "%d: stopped, not finished)\n", step, p->o->save, p->o->save, EXIT_STOPPED);
    p->stopped = stop; // the caller breaks out of its loop, and save_at ends the run
    return stop;
}

// ----------------------------------------------------------------------------
// figures: what a run measured, per rank, each beside the formula's prediction

typedef struct {
    double sent;          // bytes this rank sent per training step
    double sent_axis[5];  // of which on the tensor, data, pipeline, context and expert axes (train_3d.c)
    double sent_formula;  // what the strategy's formula predicts for `sent`
    double received;      // bytes this rank received per training step
    double params, grads, optim, acts; // bytes held: parameters, gradient sums, optimizer state, activations
    double mem_formula;   // what the formula predicts for their sum
    double bubble;        // the pipeline's idle fraction, or -1 without a pipeline
    double messages;      // messages this rank sent per training step (dist.h counts them)
} Figures;
#define FIGURES_DOUBLES ((int)(sizeof(Figures) / sizeof(double)))

// x, counted over the whole run, per training step
static double per_step(const Progress* pr, double x) { return x / (pr->steps > 0 ? (double)pr->steps : 1.0); }

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
        const double sizes[] = {f[q].sent, f[q].sent_formula, f[q].received, f[q].params, f[q].grads, f[q].optim,
                                f[q].acts, figures_memory(&f[q]), f[q].mem_formula};
        const char* after[] = {" (formula ", "), received ", " | memory ", " + ", " + ", " + ", " = ", " (formula ", ")"};
        for (int i = 0; i < 9; i++) print_size(sizes[i]), fputs(after[i], stdout);
        if (f[q].bubble >= 0) printf(" | bubble %.3f", f[q].bubble);
        printf("\n");
    }
    if (operands_bf16) // the field's tables count a bf16 copy of the weights and bf16 gradients; this design has neither
        printf("  bf16 holds what fp32 holds: 4 B a parameter (the fp32 master weight; each product rounds its operands "
               "as it packs them, so no bf16 copy is kept), 8 its exact gradient sum, and with AdamW 8 its m and v; against "
               "2 + 2 + 12 = 16 in ZeRO's mixed-precision table and 18 in Megatron-LM's (its gradients fp32)\n");
}

// The model a run trained, as its --summary's model= line gives it: tools/costmodel compute
// prints the same line above its table, and replay refuses a run whose model is not its table's.
// An expert's width and the shared experts are named only when set, so older summaries still match.
static void model_words(const Config* c, char* s, size_t n) {
    int at = snprintf(s, n, "%s vocab=%d context=%d emb=%d hidden=%d layers=%d heads=%d experts=%d top_k=%d",
                      model_names[c->model], c->vocab, c->context, c->emb, c->hidden, c->layers, c->heads, c->experts,
                      c->top_k);
    if (c->expert_hidden > 0 && at >= 0 && (size_t)at < n) at += snprintf(s + at, n - at, " expert_hidden=%d", c->expert_hidden);
    if (c->shared_experts > 0 && at >= 0 && (size_t)at < n) snprintf(s + at, n - at, " shared_experts=%d", c->shared_experts);
}

// --summary: the run's figures as key=value lines (every rank's in order), and its names.
static void summary_write(const char* path, const char* program, const char* layout, double val_loss,
                          const Progress* pr, const Figures* f, int n, const int* names, int max_len,
                          const Dataset* ds) {
    WholeFile whole;
    FILE* out = whole_open(&whole, path, "summary", summary_recognise, "program=");
    char model[256];
    model_words(&pr->o->model, model, sizeof model);
    fprintf(out, "program=%s\nlayout=%s\nmodel=%s\nranks=%d\nval_loss=%.17g\nseconds=%.6f\nsteps=%ld\nbatch=%d\n", program,
            layout, model, n, val_loss, pr->seconds, pr->steps, pr->o->batch);
    for (int i = 0; i < pr->o->samples; i++) {
        fputs("name=", out);
        dataset_write_name(ds, names + (long)i * (max_len + 1), max_len + 1, out);
        fputc('\n', out);
    }
    for (int q = 0; q < n; q++)
        fprintf(out, "rank=%d sent=%.0f sent_tp=%.0f sent_dp=%.0f sent_pp=%.0f sent_cp=%.0f sent_ep=%.0f sent_formula=%.0f "
                     "received=%.0f params=%.0f grads=%.0f optim=%.0f acts=%.0f mem_formula=%.0f bubble=%.4f messages=%.1f\n",
                q, f[q].sent, f[q].sent_axis[0], f[q].sent_axis[1], f[q].sent_axis[2], f[q].sent_axis[3], f[q].sent_axis[4],
                f[q].sent_formula, f[q].received,
                f[q].params, f[q].grads, f[q].optim, f[q].acts, f[q].mem_formula, f[q].bubble, f[q].messages);
    whole_close(&whole);
}

// What a program says of itself in its report: its name, its layout, and the formulas
// for bytes sent and memory held, in words.
typedef struct {
    const char* program;
    const char* layout;
    const char* sent_words;
    const char* mem_words;
} Report;

// The end of every program, on the process that prints: the --log closed; the validation
// loss, the training time and the names; unless --quiet, the figures of n ranks with the
// formulas in words; and the --summary file.
static void report_print(const Options* o, const Report* rep, Progress* pr, double val_loss, const int* names,
                         const Dataset* ds, const Figures* all, int n) {
    progress_end(pr);
    print_results(val_loss, pr->seconds, pr->steps, o->batch, names, o->samples, ds->max_len, ds,
                  o->quiet);
    if (!o->quiet) figures_print(all, n, rep->sent_words, rep->mem_words);
    if (o->summary) summary_write(o->summary, rep->program, rep->layout, val_loss, pr, all, n, names, ds->max_len, ds);
    if (fflush(stdout) != 0 || ferror(stdout)) fatal("cannot write the results to the standard output: %s", strerror(errno));
}

// --experts: each MoE layer's load over the training steps (every rank counts the whole
// batch's choices, so any rank can print it): tokens that chose each expert per step, as a
// bar against the capacity C, tokens dropped, and the load-balancing loss. The MLP's tokens
// are the batch's B rows; the GPT's, its positions with a target (model.h's gpt_moe_tokens),
// so their number, and with it the capacity, changes from step to step (the last step's is
// drawn). A bar's character is one token, or more where a bar would pass 96.
static void moe_print_load(const Config* c, const Acts* a, const Progress* pr) {
    if (c->experts == 0 || !a->moe || pr->steps == 0) return;
    int k = c->top_k, per = 1; // tokens per character
    for (int u = 1; u <= c->layers; u++) {
        const MoeLayer* m = &a->moe[u];
        for (int x = 0; m->rows && m->steps && x < c->experts; x++)
            while ((m->load_sum[x] / m->steps + 0.5) / per > 96 || (double)m->capacity_last / per > 96) per *= 2;
    }
    char one[32] = "one token", past[32] = "one";
    if (per > 1) snprintf(one, sizeof one, "%d tokens", per), snprintf(past, sizeof past, "%d tokens", per);
    printf("experts: tokens per training step that chose each (mean over %ld steps; # = %s, x = %s past the "
           "capacity, dropped, | = the capacity); load-balancing loss %.4f (mean), %.4f (last step)\n", pr->steps, one,
           past, pr->aux_sum / pr->steps, pr->aux_last);
    for (int u = 1; u <= c->layers; u++) {
        const MoeLayer* m = &a->moe[u];
        if (!m->rows || m->steps == 0) continue;
        long C = m->capacity_last;
        double tokens = m->tokens_sum / m->steps;
        if (is_gpt(c))
            printf("  block %d: %.1f tokens (positions with a target, mean) x top-%d = %.1f choices for %d experts, "
                   "capacity %ld each (last step)\n", u, tokens, k, tokens * k, c->experts, C);
        else
            printf("  layer %d: %.0f tokens x top-%d = %.0f choices for %d experts, capacity %ld each\n", u, tokens, k,
                   tokens * k, c->experts, C);
        for (int x = 0; x < c->experts; x++) {
            double mean = m->load_sum[x] / m->steps;
            int bars = (int)((mean + 0.5) / per), cap = (int)((C + per - 1) / per), width = bars > cap ? bars : cap;
            printf("    expert %-3d %6.1f |", x, mean);
            for (int i = 0; i < width; i++) putchar(i < bars ? (i < cap ? '#' : 'x') : i == cap - 1 ? '|' : ' ');
            if (c->balance == BALANCE_BIAS) printf("  bias %+.4f", moe_bias_of(c, u)[x]);
            printf("\n");
        }
        printf("    dropped %.2f tokens per step (%.1f%% of the choices); last step %ld\n", m->dropped_sum / m->steps,
               100.0 * m->dropped_sum / (m->tokens_sum * k), m->dropped_last);
    }
    fflush(stdout);
}

// ----------------------------------------------------------------------------
// timelines (--timeline)

// One row per lane (a pipeline stage, a rank), time flowing right, each column a slice of time:
// action i of lane s ran from t0[s*n + i] to t1[s*n + i] (seconds since the step began)
// and is drawn with mark[s*n + i]; idle time is blank. An action shorter than a column
// still gets one (the actions after it shift right to make room, and those at the end of the
// step shift left, so that a slow machine's timing never hides one). Mark 0 is padding, for a
// lane with fewer actions than n: drawn nowhere.
static void draw_timeline(int lanes, const char* lane_name, int n, const double* t0, const double* t1,
                          const char* mark, int width, const char* legend) {
    double end = 0;
    for (int i = 0; i < lanes * n; i++) end = t1[i] > end ? t1[i] : end;
    char* row = mallocCheck((size_t)width + 1);
    printf("timeline of the last step, %.3f ms, %.1f us per column: %s, idle time blank\n", end * 1e3,
           end / width * 1e6, legend);
    for (int s = 0; s < lanes; s++) {
        memset(row, ' ', (size_t)width);
        row[width] = 0;
        int left = 0; // the actions still to draw, each of which needs a column of its own
        for (int i = 0; i < n; i++) left += mark[s * n + i] != 0;
        for (int i = 0, next = 0; i < n; i++) { // next: the first column not drawn yet
            if (!mark[s * n + i]) continue;
            int a = (int)(t0[s * n + i] / end * width), b = (int)(t1[s * n + i] / end * width);
            a = a > next ? a : next;
            a = a < width - left ? a : width - left;
            a = a > 0 ? a : 0;
            left--;
            for (int x = a; x < b && x < width; x++) row[x] = mark[s * n + i];
            row[a] = mark[s * n + i];
            next = (b > a + 1 ? b : a + 1);
        }
        printf("  %s %d |%s|\n", lane_name, s, row);
    }
    free(row);
}

// ----------------------------------------------------------------------------
// traces (--trace)

// Writes events as a Chrome trace-event JSON file (events[i] belongs to process proc[i],
// or to process 0 if proc is NULL): open it in https://ui.perfetto.dev or
// chrome://tracing. One event per line, times in microseconds since the first event.
static void trace_write(const char* path, const TraceEvent* events, const int* proc, long n) {
    WholeFile whole;
    FILE* f = whole_open(&whole, path, "trace", trace_recognise, TRACE_FIRST_LINE);
    double start = n ? events[0].t0 : 0;
    for (long i = 0; i < n; i++) start = events[i].t0 < start ? events[i].t0 : start;
    fprintf(f, "%s\n", TRACE_FIRST_LINE);
    for (long i = 0; i < n; i++)
        fprintf(f, "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": 0, \"ts\": %.3f, "
                   "\"dur\": %.3f, \"args\": {\"bytes\": %.0f}}%s\n",
                events[i].name, events[i].cat, proc ? proc[i] : 0, 1e6 * (events[i].t0 - start), 1e6 * (events[i].t1 - events[i].t0),
                events[i].bytes, i + 1 < n ? "," : "");
    fprintf(f, "]}\n");
    whole_close(&whole);
}

// The end of train.c: the names sampled with its forward pass, the report, the --trace.
static void report_end(const Options* o, const Report* rep, Progress* pr, double val_loss, const Dataset* ds,
                       const Figures* fig, ForwardFn forward, void* ctx) {
    int* names = generate_names(o->samples, ds->max_len, &o->model, ds, o->seed, forward, ctx);
    report_print(o, rep, pr, val_loss, names, ds, fig, 1);
    if (o->trace) trace_write(o->trace, trace_events, NULL, trace_count);
    free(names);
}

#pragma GCC diagnostic pop
#endif // REPORT_H
