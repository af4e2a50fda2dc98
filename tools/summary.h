/*
 * tools/summary.h: reads a --summary file (report.h's summary_write), for the tools that
 * work from finished runs: tools/report.c (make run's table) and tools/costmodel.c
 * (make cluster's predictions).
 */
#ifndef SUMMARY_H
#define SUMMARY_H

#include "../util.h"

#include <math.h>

#define MAX_RANKS 256
#define MAX_NAMES 1000 // --samples' most

typedef struct {
    char program[64], layout[320], model[256]; // model: report.h's model_words ("" in a summary older than it)
    int ranks, n_names;
    double val_loss, seconds, steps, batch;
    // per rank, per training step: bytes sent (measured, and the formula's), memory held
    // (measured, and the formula's), the pipeline's idle fraction, messages sent
    double sent[MAX_RANKS], sent_formula[MAX_RANKS], mem[MAX_RANKS], mem_formula[MAX_RANKS], bubble[MAX_RANKS];
    double messages[MAX_RANKS];
    double axis[MAX_RANKS][5]; // train_3d.c: sent on the tensor, data, pipeline, context, expert axes
    char* names[MAX_NAMES]; // as the run wrote them: UTF-8, any length
} Summary;

// A summary's number, by util.h's summary_value (the rule cli.h's summary_recognise applies
// too), or the process ends naming the file, the key and the value: a summary edited by hand
// or cut short is refused, not read as zero or a negative batch.
static double summary_number(const char* path, const char* key, const char* text) {
    double v;
    const char* why = summary_value(key, strlen(key), text, strlen(text), &v);
    if (why) fatal("'%s': %s", path, why);
    return v;
}

static void summary_read(Summary* r, const char* path) {
    memset(r, 0, sizeof *r);
    struct stat st;
    if (stat(path, &st) != 0) fatal("cannot open '%s': %s (did the run finish?)", path, strerror(errno));
    FILE* f = open_tool_file(path, "summary", 64L << 20);
    char* line = NULL; // any length: a name may be long
    size_t cap = 0;
    int q = 0;
    while (getline(&line, &cap, f) >= 0) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "program=", 8)) snprintf(r->program, sizeof r->program, "%.63s", line + 8);
        else if (!strncmp(line, "layout=", 7)) snprintf(r->layout, sizeof r->layout, "%.319s", line + 7);
        else if (!strncmp(line, "model=", 6)) snprintf(r->model, sizeof r->model, "%.255s", line + 6);
        else if (!strncmp(line, "ranks=", 6)) {
            double n = summary_number(path, "ranks", line + 6);
            if (n > MAX_RANKS) fatal("'%s': ranks=%.0f, more than the %d this tool reads", path, n, MAX_RANKS);
            r->ranks = (int)n;
        }
        else if (!strncmp(line, "val_loss=", 9)) r->val_loss = summary_number(path, "val_loss", line + 9); // nan too
        else if (!strncmp(line, "seconds=", 8)) r->seconds = summary_number(path, "seconds", line + 8);
        else if (!strncmp(line, "steps=", 6)) r->steps = summary_number(path, "steps", line + 6);
        else if (!strncmp(line, "batch=", 6)) r->batch = summary_number(path, "batch", line + 6);
        else if (!strncmp(line, "name=", 5) && r->n_names < MAX_NAMES) {
            r->names[r->n_names] = mallocCheck(strlen(line + 5) + 1);
            strcpy(r->names[r->n_names++], line + 5);
        }
        else if (!strncmp(line, "rank=", 5) && q < MAX_RANKS) {
            double params = 0, grads = 0, optim = 0, acts = 0;
            for (char* tok = strtok(line, " "); tok; tok = strtok(NULL, " ")) {
                char* eq = strchr(tok, '=');
                if (!eq) continue;
                *eq = 0;
                double v = summary_number(path, tok, eq + 1); // a key a summary has, in its range
                if (!strcmp(tok, "sent")) r->sent[q] = v;
                if (!strcmp(tok, "sent_tp")) r->axis[q][0] = v;
                if (!strcmp(tok, "sent_dp")) r->axis[q][1] = v;
                if (!strcmp(tok, "sent_pp")) r->axis[q][2] = v;
                if (!strcmp(tok, "sent_cp")) r->axis[q][3] = v;
                if (!strcmp(tok, "sent_ep")) r->axis[q][4] = v;
                if (!strcmp(tok, "sent_formula")) r->sent_formula[q] = v;
                if (!strcmp(tok, "params")) params = v;
                if (!strcmp(tok, "grads")) grads = v;
                if (!strcmp(tok, "optim")) optim = v;
                if (!strcmp(tok, "acts")) acts = v;
                if (!strcmp(tok, "mem_formula")) r->mem_formula[q] = v;
                if (!strcmp(tok, "bubble")) r->bubble[q] = v;
                if (!strcmp(tok, "messages")) r->messages[q] = v;
            }
            r->mem[q++] = params + grads + optim + acts;
        }
    }
    free(line);
    fclose(f);
    if (!r->program[0] || r->ranks < 1) fatal("'%s' is not a --summary file", path);
    if (!(r->batch >= 1)) fatal("'%s' gives no batch= line: not a whole --summary file", path);
    if (q != r->ranks) fatal("'%s': %d ranks listed, %d expected", path, q, r->ranks);
}

#endif // SUMMARY_H
