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
    int64_t total = 0;
    for (long first = 0; first < ds->n_val_examples; first += EVAL_ROWS) {
        int R = (int)(ds->n_val_examples - first < EVAL_ROWS ? ds->n_val_examples - first : EVAL_ROWS);
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
    if (o.load) {
        float* saved;
        CkptHeader h = ckpt_load(o.load, cfg, o.opt.adamw, ds.token_char, &saved);
        memcpy(run.params, saved, np * sizeof(float));
        if (o.opt.adamw) {
            memcpy(run.m, saved + np, np * sizeof(float));
            memcpy(run.v, saved + 2 * np, np * sizeof(float));
        }
        free(saved);
        start = h.step;
    } else {
        params_init(run.params, cfg, o.seed);
    }
    int rows = o.batch > EVAL_ROWS ? o.batch : EVAL_ROWS;
    rows = o.samples > rows ? o.samples : rows;
    acts_init(&run.acts, cfg, rows, 0, n_units(cfg));
    scratch_init(&run.scratch, cfg, rows);
    workspace_init(&run.ws, rows, max_width(cfg), max_linear_weight(cfg));
    if (!o.quiet) print_config(&o, &ds, "1 process");
    FILE* log = log_open(o.log);

    // training loop
    int B = o.batch;
    double train_seconds = 0.0, interval_loss = 0.0, interval_seconds = 0.0;
    long interval_steps = 0;
    for (long step = start + 1; step <= o.steps; step++) {
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
        optimizer_step(&o.opt, run.params, run.grads, run.m, run.v, np, B, scale, step);
        double seconds = now_seconds() - t0;
        train_seconds += seconds;

        double train_loss = fix_to(loss) / B;
        interval_loss += train_loss;
        interval_seconds += seconds;
        interval_steps++;
        int report = o.eval_every > 0 && (step % o.eval_every == 0 || step == o.steps);
        double val_loss = report ? evaluate(&run, &ds) : 0.0;
        log_step(log, step, train_loss, report, val_loss, 1e3 * seconds, B);
        if (report && !o.quiet) {
            print_progress(step, o.steps, interval_loss / interval_steps, val_loss,
                           1e3 * interval_seconds / interval_steps, interval_steps * B / interval_seconds);
            interval_loss = interval_seconds = 0.0;
            interval_steps = 0;
        }
    }
    if (log) fclose(log);

    // validation, sampling and report
    double val_loss = evaluate(&run, &ds);
    int max_len = ds.max_len;
    int* names = mallocCheck((size_t)(o.samples > 0 ? o.samples : 1) * (max_len + 1) * sizeof(int));
    generate(names, o.samples, max_len, cfg, o.seed, probs_of, &run);
    long trained = o.steps > start ? o.steps - start : 0;
    print_results(val_loss, ds.n_val_examples, train_seconds, trained, B, names, o.samples, max_len, &ds, o.quiet);
    if (o.save) {
        CkptHeader h = ckpt_header(cfg, o.opt.adamw, o.steps > start ? o.steps : start, ds.token_char);
        CkptWriter w = ckpt_create(o.save, &h);
        ckpt_write(&w, run.params, np * sizeof(float));
        if (o.opt.adamw) {
            ckpt_write(&w, run.m, np * sizeof(float));
            ckpt_write(&w, run.v, np * sizeof(float));
        }
        ckpt_close(&w);
    }

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
