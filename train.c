/*
 * train.c: the single-process reference, and the definition of the right answer.
 *
 * Trains the MLP of model.h on names.txt, then prints the validation loss and generated
 * names. Every other program (train_dp.c, train_fsdp.c, train_tp.c, train_pp.c,
 * train_3d.c) prints exactly what this one prints for the same flags: the same loss at
 * every step, the same final parameters bit for bit, the same names.
 *
 *   make train && ./train              # 25,000 steps of SGD on names.txt, about a second
 *   ./train --help                     # every flag
 *
 * Sections: options; data; model; training loop; validation, sampling and report.
 */
#include "model.h"
#include "data.h"
#include "cli.h"

#define RUN_LINE "./train"
#define EVAL_ROWS 256 // validation rows per forward pass (the result does not depend on it)

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    float* params;  // [n_params] in model.h's layout
    int64_t* grads; // [n_params] exact sums
    float* m;       // [n_params] AdamW state (NULL for SGD)
    float* v;
    Acts acts;
    Scratch scratch;
    Workspace ws;
} Run;

// ----------------------------------------------------------------------------
// validation and sampling

// Mean loss over the whole validation split.
static double evaluate(Run* r, const Dataset* ds) {
    long lo = 0, hi = ds->n_val_examples;
    int64_t total = 0;
    for (long first = lo; first < hi; first += EVAL_ROWS) {
        int R = (int)(hi - first < EVAL_ROWS ? hi - first : EVAL_ROWS);
        dataset_val_rows(ds, first, R, r->cfg.context, r->acts.tokens, r->acts.targets);
        total += model_forward(&r->cfg, r->params, &r->acts, &r->scratch, R, ds->n_val_examples, &r->ws);
    }
    return fix_to(total) / (double)ds->n_val_examples;
}

// probs[R][V] for R contexts: the forward pass with dummy targets
static void probs_of(void* ctx, const int* tokens, int R, float* probs) {
    Run* r = ctx;
    memcpy(r->acts.tokens, tokens, (size_t)R * r->cfg.context * sizeof(int));
    memset(r->acts.targets, 0, (size_t)R * sizeof(int));
    model_forward(&r->cfg, r->params, &r->acts, &r->scratch, R, R, &r->ws);
    memcpy(probs, r->acts.out[r->cfg.layers + 1], (size_t)R * r->cfg.vocab * sizeof(float));
}

// ----------------------------------------------------------------------------
// main

int main(int argc, char** argv) {
    // options
    Options o;
    cli_parse_or_exit(&o, argc, argv, RUN_LINE, NULL, 0, NULL, NULL);

    // data
    Dataset ds;
    dataset_load(&ds, o.data, o.max_line, o.seed);
    o.model.vocab = ds.vocab;

    // model: parameters, exact gradient sums, optimizer state, activations
    Run run = {.cfg = o.model};
    Config* cfg = &run.cfg;
    long np = n_params(cfg);
    run.params = mallocCheck(np * sizeof(float));
    run.grads = mallocCheck(np * sizeof(int64_t));
    run.m = o.opt.adamw ? callocCheck(np, sizeof(float)) : NULL;
    run.v = o.opt.adamw ? callocCheck(np, sizeof(float)) : NULL;
    long start = 0;
    if (o.load) start = ckpt_restore(o.load, cfg, o.opt.adamw, ds.token_char, run.params, run.m, run.v);
    else params_init(run.params, cfg, o.seed);
    int rows = o.batch > EVAL_ROWS ? o.batch : EVAL_ROWS;
    rows = o.samples > rows ? o.samples : rows;
    acts_init(&run.acts, cfg, rows, 0, n_units(cfg), NULL);
    scratch_init(&run.scratch, cfg, rows);
    workspace_init(&run.ws, rows, max_width(cfg), max_linear_weight(cfg));
    if (!o.quiet) print_config(&o, &ds, "1 process");

    // training loop
    int B = o.batch;
    Progress progress = progress_start(&o, 1);
    for (long step = start + 1; step <= o.steps; step++) {
        step_window_open(o.trace && step == o.steps); // count this step's messages; --trace: the last one
        double t0 = now_seconds();
        dataset_batch(&ds, o.seed, step, 0, B, cfg->context, run.acts.tokens, run.acts.targets);
        int64_t loss = model_forward(cfg, run.params, &run.acts, &run.scratch, B, B, &run.ws);
        fix_zero(run.grads, np);
        model_backward(cfg, run.params, run.grads, &run.acts, &run.scratch, B, B, &run.ws);
        float scale = 1.0f;
        if (o.opt.clip > 0) {
            int e = norm_exponent(grads_maxabs(run.grads, np, B));
            scale = clip_scale(&o.opt, grad_norm_value(grads_sumsq(run.grads, np, B, e), e));
        }
        optimizer_step(&o.opt, run.params, run.grads, run.m, run.v, np, grad_factor(B), scale, step);
        double seconds = now_seconds() - t0;
        step_window_close();
        progress_step(&progress, step, fix_to(loss) / B, seconds, progress_due(&progress, step) ? evaluate(&run, &ds) : 0);
    }
    progress_end(&progress);

    // validation, sampling and report
    double val_loss = evaluate(&run, &ds);
    int max_len = ds.max_len;
    int* names = generate_names(o.samples, max_len, cfg, o.seed, probs_of, &run);
    // memory held for training: 4 bytes a parameter, 8 a gradient sum, 8 for AdamW's m and
    // v, and the activations of one batch
    Figures fig = {.params = 4.0 * np, .grads = 8.0 * np, .optim = o.opt.adamw ? 8.0 * np : 0, .bubble = -1,
                   .acts = (double)B * acts_bytes_per_row(cfg, 0, n_units(cfg), NULL)};
    fig.mem_formula = figures_memory(&fig);
    report_print(&o, "train.c", "1 process", val_loss, &progress, names, max_len, &ds, &fig, 1, "nothing to send",
                 "4 + 8 + 8 (AdamW) B per parameter + activations");
    if (o.trace) trace_write(o.trace, trace_events, NULL, trace_count);
    if (o.save)
        ckpt_save(o.save, cfg, o.opt.adamw, o.steps > start ? o.steps : start, ds.token_char, run.params, run.m, run.v);

    free(names);
    free(run.params);
    free(run.grads);
    free(run.m);
    free(run.v);
    acts_free(&run.acts);
    scratch_free(&run.scratch);
    workspace_free(&run.ws);
    dataset_free(&ds);
    return 0;
}
