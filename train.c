/*
 * train.c: the single-process reference, and the definition of the right answer.
 *
 * Trains a model of model.h on names.txt, then prints the validation loss and generated
 * names. Every other program (train_dp.c, train_fsdp.c, train_tp.c, train_pp.c,
 * train_3d.c, ...) prints exactly what this one prints for the same flags: the same loss
 * at every step, the same final parameters bit for bit, the same names.
 *
 *   the MLP (default):  tokens -> embedding -> [linear -> ReLU] x L -> linear -> softmax -> loss
 *   --model gpt:        tokens -> wte + wpe -> [block] x L -> LayerNorm -> lm_head -> softmax -> loss
 *                       (makemore's Transformer; transformer.h)
 *              (the batch: 32 rows; one process does everything, sends nothing)
 *
 *   make train && ./train              # 25,000 steps of SGD on names.txt, a couple of seconds
 *   ./train --model gpt --steps 5000   # the GPT, AdamW, a few minutes
 *   ./train --help                     # every flag
 *
 * Why the other programs can match it bit for bit. Float addition is not associative:
 * (a + b) + c and a + (b + c) can differ in the last bit. A layout that splits a sum
 * (over the batch's rows across ranks, over microbatches, over a tensor-parallel slice)
 * adds the same terms in another order, and a last-bit difference in one gradient grows,
 * step after step, until the model and its names differ. Measured (tools/float_order.sh,
 * on AMD EPYC): with the weight gradients summed in float, once over all 32 rows and once
 * as two halves of 16 then added, as two data-parallel ranks would, the training losses
 * differ from step 2 on, the validation losses end at 2.1560 and 2.1554, and 5 of the 10
 * names differ. So every sum that some layout splits is exact here: each term is rounded
 * once to a multiple of 2^-40 and the terms are added as 64-bit integers, whose addition
 * is associative (kernels.h). Any split, any order, any number of ranks or threads then
 * gives the same bits, and so the same names.
 *
 * Sections: the state of one run; the forward pass and what the run holds; main (options,
 * data, model, training loop, validation, sampling and report).
 */
#include "model.h"
#include "ckpt.h"
#include "cli.h"
#include "report.h"

#define RUN_LINE "./train"

// ----------------------------------------------------------------------------
// the state of one run

typedef struct {
    Config cfg;
    Dataset ds;     // the data
    State st;  // parameters, exact gradient sums, AdamW's m and v: the whole model
    Work work; // activations, scratch, kernel workspace
    GradSums sums; // --reduce: how the microbatches' gradient sums are added (optim.h)
} Run;

static void run_free(Run* r) {
    dataset_free(&r->ds), state_free(&r->st), work_free(&r->work), grad_sums_free(&r->sums);
}

// --save: this run's checkpoint at `step` (every rank calls it)
static void save(void* ctx, const Options* o, long step) {
    Run* r = ctx;
    ckpt_save(o, &r->ds, &r->cfg, step, &r->st);
}

// ----------------------------------------------------------------------------
// the forward pass (model.h's ForwardFn: training, validation and sampling all use it)

static int64_t forward(void* ctx, const Rows* rows, long first, int R, long rows_total, float* probs) {
    Run* r = ctx;
    return model_forward_rows(&r->cfg, r->st.params, &r->work, rows, first, R, rows_total, probs);
}

// Mean loss over the whole validation split.
static double validation_loss(void* ctx) {
    Run* r = ctx;
    return mean_loss(evaluate(forward, r, &r->ds, 1, 0), &r->ds);
}

// What this run holds: 4 bytes a parameter, 8 a gradient sum, 8 for AdamW's m and v, and
// the activations of one batch (--reduce fp32 or bf16: 12 or 14 more a parameter). It sends nothing.
static Figures figures(const Run* r, int batch) {
    long np = r->st.n;
    Figures f = {.params = 4.0 * np, .grads = 8.0 * np + grad_sums_bytes(&r->sums), .optim = r->st.m ? 8.0 * np : 0, .bubble = -1,
                 .acts = (double)batch * acts_bytes_per_row(&r->cfg, 0, n_units(&r->cfg), NULL)};
    f.mem_formula = figures_memory(&f);
    return f;
}

// ----------------------------------------------------------------------------
// main

static const CliFlag flags[] = {CLI_REDUCE_FLAG};
static const char* flag(void* ctx, int index, const char* value) {
    (void)index;
    return cli_reduce(value, &((Run*)ctx)->sums.how);
}

int main(int argc, char** argv) {
    // options
    Options o;
    Run run = {0};
    cli_parse_or_exit(&o, argc, argv, RUN_LINE, flags, 1, flag, &run);

    // data
    load_data(&run.ds, &o, &run.cfg);

    // model: parameters, exact gradient sums, optimizer state, activations
    Config* cfg = &run.cfg;
    long np = n_params(cfg);
    run.st = state_alloc(np, o.opt.adamw);
    grad_sums_init(&run.sums, run.sums.how, np);
    long start = state_load(&run.st, &o, &run.ds, cfg);
    work_init(&run.work, cfg, pass_rows(&o, (o.batch + o.microbatches - 1) / o.microbatches), NULL);
    if (!o.quiet) print_config(&o, &run.ds, "1 process");

    // training loop
    int B = o.batch, M = o.microbatches;
    Progress progress = progress_start(&o, 1, save, &run, NULL);
    for (long step = start + 1; step <= o.steps; step++) {
        step_begin(&progress, step);
        Rows batch = training_rows(&run.ds, o.seed, step, 0);
        long n = dataset_batch_targets(&run.ds, o.seed, step, B); // the loss is the mean over n targets
        int64_t loss = 0, aux = 0;
        fix_zero(run.st.grads, np);
        workspace_keep_weights(&run.work.ws, M > 1); // unchanged until the step: packed once (kernels.h)
        for (int m = 0; m < M; m++) { // --microbatches: rows [first, first + R) at a time, every sum exact: the same bits
            long first, end;
            split_range(B, M, m, &first, &end);
            int R = (int)(end - first);
            loss += forward(&run, &batch, first, R, B, NULL);
            aux += run.work.acts.aux; // --experts: the load-balancing loss (its capacity and balance per microbatch)
            model_backward(cfg, run.st.params, run.st.grads, &run.work, R, B);
            grad_sums_add(&run.sums, run.st.grads, 0, np); // --reduce fp32, bf16: a piece added in that type
        }
        grad_sums_finish(&run.sums, run.st.grads, step);
        workspace_keep_weights(&run.work.ws, 0);
        progress.aux = fix_to(aux) / n; // reported apart
        float scale = clip_factor(&o.opt, &(GradSpan){run.st.grads, np}, 1, n, NULL, NULL);
        optimizer_step(&o.opt, run.st.params, run.st.grads, run.st.m, run.st.v, np, grad_factor(n), scale, step);
        moe_bias_update(cfg); // --balance bias: each expert's bias moves toward its share
        if (step_end(&progress, step, fix_to(loss) / n, validation_loss, &run)) break; // a signal: stop, saved
    }
    save_at(&progress, start + progress.steps);

    // validation, sampling and report
    double val_loss = validation_loss(&run);
    Figures fig = figures(&run, (B + M - 1) / M); // a microbatch's activations
    char layout[128] = "1 process";
    if (cfg->experts) snprintf(layout, sizeof layout, "1 process, %d experts a %s, top-%d", cfg->experts,
                                  cfg->model == MODEL_GPT ? "block" : "layer", cfg->top_k);
    if (M > 1) snprintf(layout + strlen(layout), sizeof layout - strlen(layout), ", %d microbatches", M);
    if (run.sums.how) snprintf(layout + strlen(layout), sizeof layout - strlen(layout), ", gradients added in %s",
                               reduce_names[run.sums.how]);
    if (cfg->recompute) snprintf(layout + strlen(layout), sizeof layout - strlen(layout), ", %s recomputation",
                                 recompute_names[cfg->recompute]);
    Report rep = {"train.c", layout, "nothing to send",
                  run.sums.how == REDUCE_FP32 ? "4 + 8 + 8 (AdamW) + 12 (--reduce fp32) B per parameter + activations"
                  : run.sums.how == REDUCE_BF16 ? "4 + 8 + 8 (AdamW) + 14 (--reduce bf16) B per parameter + activations"
                                                : "4 + 8 + 8 (AdamW) B per parameter + activations"};
    report_end(&o, &rep, &progress, val_loss, &run.ds, &fig, forward, &run);
    if (!o.quiet) moe_print_load(cfg, &run.work.acts, &progress);
    if (!o.quiet) grad_sums_print(&run.sums, 0, M, np);
    run_free(&run);
    return 0;
}
