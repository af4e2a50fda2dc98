/*
 * schedules.h: pipeline schedules as data, and a checker that runs them without MPI.
 *
 * A schedule is, for each of the S ranks of a pipeline, the ordered list of its actions:
 *
 *   F  forward of microbatch m through chunk c
 *   B  full backward of microbatch m through chunk c (I then W at once)
 *   I  the input-gradient half of B: what the chunk before needs, sent at once
 *   W  the weight-gradient half of B: needed by no one until the optimizer step, so a
 *      zero-bubble schedule runs it later, in time that would otherwise be idle
 *
 * The model's units are cut into S x V chunks (V "virtual stages" per rank); a schedule
 * also says which rank holds which chunk. train_pp.c runs any list with one executor; the
 * checker below simulates one with given durations of F, I and W and a message latency.
 *
 *   schedule     chunks per rank   rank r holds         rule
 *   naive        1                 chunk r              -
 *   gpipe        1                 chunk r              -
 *   1f1b         1                 chunk r              -
 *   interleaved  V                 chunks r, r+S, ...   M a multiple of S (Megatron's)
 *   zb1          1                 chunk r              -
 *   zbv          2                 chunks r, 2S-1-r     -
 *
 * Bubble, the idle fraction of a step, with F, I and W taking f, i and w (B = i + w) and
 * no latency, by the papers' closed forms:
 *   naive (S-1)/S; gpipe and 1f1b (S-1)/(M+S-1); interleaved (S-1)/(V M + S-1);
 *   zb1 (S-1)(f+i-w) / (M(f+i+w) + (S-1)(f+i-w)), a third of 1f1b's when f = i = w;
 *   zb1's holds when M >= S; zbv has none: the checker measures it.
 * Peak activations held by rank r, in microbatches through a whole stage (a chunk holds
 * 1/V of one), counted at once over all its chunks: naive 1; gpipe M; 1f1b min(S-r, M);
 * zb1 min(S, M) on every rank (1F1B's largest, rank 0's); interleaved
 * min(V M, 2(S-1-r) + (V-1) S + 1) / V (Megatron's warm-up, and one more F); zbv min(S, M)
 * on every rank (its play's cap of 2S chunks, reached once M >= S).
 */
#ifndef SCHEDULES_H
#define SCHEDULES_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "util.h"

typedef struct {
    char op;   // 'F', 'B', 'I' or 'W'
    int chunk; // which of this rank's chunks, 0..V-1
    int mb;    // microbatch
} Action;

enum { SCHEDULE_NAIVE, SCHEDULE_GPIPE, SCHEDULE_1F1B, SCHEDULE_INTERLEAVED, SCHEDULE_ZB1, SCHEDULE_ZBV, N_SCHEDULES };
static const char* const schedule_names[N_SCHEDULES] = {"naive", "gpipe", "1f1b", "interleaved", "zb1", "zbv"};

// --schedule NAME: NULL, or the error message (written to err)
static const char* schedule_parse(const char* value, int* sched, char* err, size_t n) {
    for (int k = 0; k < N_SCHEDULES; k++)
        if (!strcmp(value, schedule_names[k])) {
            *sched = k;
            return NULL;
        }
    snprintf(err, n, "--schedule must be naive, gpipe, 1f1b, interleaved, zb1 or zbv, got '%s'", value);
    return err;
}

// Chunks per rank: --virtual for interleaved, 2 for zbv, else 1.
static int schedule_chunks(int sched, int virtual_stages) {
    return sched == SCHEDULE_INTERLEAVED ? virtual_stages : sched == SCHEDULE_ZBV ? 2 : 1;
}
// The chunk of the model (0..S*V-1, in model order) that rank r holds as its chunk v.
static int chunk_global(int sched, int S, int r, int v) {
    if (sched == SCHEDULE_ZBV) return v == 0 ? r : 2 * S - 1 - r; // down the ranks, then back up: a V
    return v * S + r;                                                // interleaved: round-robin
}
// Which rank holds model chunk k (of S V), and as which of its chunks; -1 for no chunk.
static int chunk_owner(int sched, int S, int V, int k, int* v) {
    if (k < 0 || k >= S * V) return *v = -1, -1;
    if (sched == SCHEDULE_ZBV) return k < S ? (*v = 0, k) : (*v = 1, 2 * S - 1 - k);
    return *v = k / S, k % S;
}

// Whether S ranks, V chunks each and M microbatches fit the schedule; NULL, or why not.
static const char* schedule_rule(int sched, int S, int V, int M, char* err, size_t n) {
    if (sched == SCHEDULE_INTERLEAVED && V > 1 && M % S != 0) {
        snprintf(err, n, "--schedule interleaved sends microbatches round the ranks in groups of S: the "
                 "microbatches (%d) must be a multiple of the stages (%d)", M, S);
        return err;
    }
    (void)V;
    return NULL;
}

// ----------------------------------------------------------------------------
// the schedules: each fills rank r's list (room for 3 V M actions) and returns its length

static int schedule_naive(int S, int V, int M, int r, Action* a) {
    (void)S, (void)V, (void)r;
    int n = 0;
    for (int m = 0; m < M; m++) a[n++] = (Action){'F', 0, m}, a[n++] = (Action){'B', 0, m};
    return n;
}
static int schedule_gpipe(int S, int V, int M, int r, Action* a) {
    (void)S, (void)V, (void)r;
    int n = 0;
    for (int m = 0; m < M; m++) a[n++] = (Action){'F', 0, m};
    for (int m = 0; m < M; m++) a[n++] = (Action){'B', 0, m};
    return n;
}
// 1F1B: S-1-r forwards to fill the pipeline, then one forward, one backward, ..., then the
// remaining backwards; rank r holds at most S-r microbatches, not M.
static int schedule_1f1b(int S, int V, int M, int r, Action* a) {
    (void)V;
    int n = 0, f = 0, b = 0, warmup = S - 1 - r < M ? S - 1 - r : M;
    while (f < warmup) a[n++] = (Action){'F', 0, f++};
    while (f < M) a[n++] = (Action){'F', 0, f++}, a[n++] = (Action){'B', 0, b++};
    while (b < M) a[n++] = (Action){'B', 0, b++};
    return n;
}
// Interleaved 1F1B (Megatron): the same pattern over V M chunk-passes. The k-th forward of
// a rank is microbatch (k / (S V)) S + k % S through its chunk (k / S) % V: groups of S
// microbatches go through chunk 0, then chunk 1, ...; backwards run the chunks in reverse.
// The warm-up is longer: 2 (S-1-r) + (V-1) S forwards.
static void interleaved_pass(int S, int V, int k, int forward, int* chunk, int* mb) {
    int v = (k / S) % V;
    *chunk = forward ? v : V - 1 - v;
    *mb = (k / (S * V)) * S + k % S;
}
static int schedule_interleaved(int S, int V, int M, int r, Action* a) {
    int total = V * M, n = 0, f = 0, b = 0, c, m;
    int warmup = V == 1 ? S - 1 - r : 2 * (S - 1 - r) + (V - 1) * S;
    warmup = warmup < total ? warmup : total;
    while (f < warmup) interleaved_pass(S, V, f++, 1, &c, &m), a[n++] = (Action){'F', c, m};
    while (f < total) {
        interleaved_pass(S, V, f++, 1, &c, &m), a[n++] = (Action){'F', c, m};
        interleaved_pass(S, V, b++, 0, &c, &m), a[n++] = (Action){'B', c, m};
    }
    while (b < total) interleaved_pass(S, V, b++, 0, &c, &m), a[n++] = (Action){'B', c, m};
    return n;
}

// ZB-H1 (zero bubble, Qi et al. 2023): 1F1B's order of forwards and input gradients, with
// each W delayed: rank r runs W of microbatch j after the I of microbatch j + r, and its
// last r + 1 W's at the end, where 1F1B would idle in its cool-down. Rank r then holds at
// most S microbatches' activations (S - r before their I, r waiting for their W): the
// peak of 1F1B's rank 0, on every rank.
static int schedule_zb1(int S, int V, int M, int r, Action* a) {
    (void)V;
    int n = 0, f = 0, b = 0, w = 0, warmup = S - 1 - r < M ? S - 1 - r : M;
    while (f < warmup) a[n++] = (Action){'F', 0, f++};
    while (b < M) {
        if (f < M) a[n++] = (Action){'F', 0, f++};
        a[n++] = (Action){'I', 0, b++};
        if (b - 1 >= r && w < M) a[n++] = (Action){'W', 0, w++};
    }
    while (w < M) a[n++] = (Action){'W', 0, w++};
    return n;
}

// ZB-V (zero bubble, V-shaped): each rank holds two chunks, r and 2S-1-r, so that the
// first and last chunks of the model share rank 0 and the pipeline turns round on rank
// S-1. The list is built by playing the pipeline forward in unit time steps (F, I and W
// one step each, messages instant), every rank greedily taking, whenever it is free: an I
// that is ready (the chunk after has sent its gradient), else an F that is ready if it
// holds fewer than 2S chunk activations (S microbatches, 1F1B's rank 0), else a pending W,
// which fills what would be a bubble; within a kind, the oldest microbatch first, then the
// later chunk. Each rank's list is the order it took them in: a play that completes has
// no cycle of waits, so neither has any run of it.
//
// Each chunk runs each kind in microbatch order (the chunk before runs its F in that
// order, the chunk after its I), so the only candidate of a kind on a chunk is its oldest
// microbatch not yet run: a time step looks at V of them per kind and rank, and the whole
// play takes time linear in the actions.
static int play_done(const int* end, long x, int t) { return end[x] >= 0 && end[x] <= t; } // by time step t
static void schedule_play(int sched, int S, int V, int M, Action** lists, int* counts) {
    enum { I, F, W }; // the kinds, in the order a free rank prefers them
    int K = S * V;
    long total = (long)K * M, done = 0;
    // end[kind][k M + m]: when that action of chunk k on microbatch m ends (-1: not taken);
    // next[kind][k]: the oldest microbatch chunk k has not taken that kind for
    int *end[3], *next[3], *live = callocCheck(S, sizeof(int)), (*taken)[3] = mallocCheck(sizeof(int[3]) * S);
    for (int kind = I; kind <= W; kind++) {
        end[kind] = mallocCheck(sizeof(int) * total), next[kind] = callocCheck(K, sizeof(int));
        for (long x = 0; x < total; x++) end[kind][x] = -1;
    }
    for (int r = 0; r < S; r++) counts[r] = 0;
    for (int t = 0; done < 3 * total; t++) {
        if (t > 3 * total) fatal("internal: the %s schedule cannot be played for S=%d M=%d", schedule_names[sched], S, M);
        int n_taken = 0; // what ranks take at t ends at t + 1
        for (int r = 0; r < S; r++) {
            int best = -1, bk = 0, bm = 0, bv = 0;
            for (int kind = I; kind <= W && best < 0; kind++)
                for (int v = V - 1; v >= 0; v--) { // the oldest microbatch, then the later chunk
                    int k = chunk_global(sched, S, r, v), m = next[kind][k];
                    if (m >= M || (best >= 0 && m >= bm)) continue;
                    long x = (long)k * M + m;
                    int ready = kind == I ? play_done(end[F], x, t) && (k == K - 1 || play_done(end[I], x + M, t))
                              : kind == F ? live[r] < 2 * S && (k == 0 || play_done(end[F], x - M, t))
                              : play_done(end[I], x, t);
                    if (ready) best = kind, bk = k, bm = m, bv = v;
                }
            if (best < 0) continue;
            lists[r][counts[r]++] = (Action){"IFW"[best], bv, bm};
            live[r] += best == F ? 1 : best == W ? -1 : 0;
            next[best][bk]++;
            taken[n_taken][0] = best, taken[n_taken][1] = bk, taken[n_taken][2] = bm, n_taken++;
        }
        for (int j = 0; j < n_taken; j++, done++) end[taken[j][0]][(long)taken[j][1] * M + taken[j][2]] = t + 1;
    }
    for (int kind = I; kind <= W; kind++) free(end[kind]), free(next[kind]);
    free(live), free(taken);
}

// Every rank's list of a schedule: lists[r] needs room for 3 V M actions.
static void schedule_build(int sched, int S, int V, int M, Action** lists, int* counts) {
    if (sched == SCHEDULE_ZBV) {
        schedule_play(sched, S, V, M, lists, counts);
        return;
    }
    for (int r = 0; r < S; r++) {
        if (sched == SCHEDULE_NAIVE) counts[r] = schedule_naive(S, V, M, r, lists[r]);
        if (sched == SCHEDULE_GPIPE) counts[r] = schedule_gpipe(S, V, M, r, lists[r]);
        if (sched == SCHEDULE_1F1B) counts[r] = schedule_1f1b(S, V, M, r, lists[r]);
        if (sched == SCHEDULE_INTERLEAVED) counts[r] = schedule_interleaved(S, V, M, r, lists[r]);
        if (sched == SCHEDULE_ZB1) counts[r] = schedule_zb1(S, V, M, r, lists[r]);
    }
}

// ----------------------------------------------------------------------------
// the checker: a list run without MPI, with durations and a latency

typedef struct {
    double f, i, w;   // durations of F, I, W (B takes i + w)
    double latency;   // of a message between two ranks (none within a rank)
} Durations;

typedef struct {
    int ok;                  // every check passed
    char why[256];           // else, the first that failed
    double makespan;         // when the last action of any rank ends
    double busy[64], end[64]; // per rank: time computing; when its last action ends
    double bubble[64];       // per rank: idle / (idle + busy) up to its last action, as train_pp.c measures
    double bubble_total;     // 1 - all busy / (S x makespan), as the papers count
    double peak[64];         // per rank: most activations held at once, in microbatches through a whole stage
    double* t0;              // [S][max count] when each action starts (NULL: not recorded)
    double* t1;
} Check;

// Runs every rank's list in order, each action starting when its rank is free and its
// inputs exist, and checks: every chunk of every microbatch gets one F and one B (or one I
// and one W), on the rank that holds the chunk, W after its I; no rank waits for an action
// that can never come (that would be a deadlock with train_pp.c's blocking receives).
static Check schedule_check(int sched, int S, int V, int M, Action* const* lists, const int* counts, Durations d,
                            double* t0, double* t1, int stride) {
    Check c = {.ok = 1, .t0 = t0, .t1 = t1};
    int K = S * V, total = K * M;
    double *f_end = mallocCheck(sizeof(double) * total), *i_end = mallocCheck(sizeof(double) * total),
           *w_end = mallocCheck(sizeof(double) * total), *free_at = callocCheck(S, sizeof(double)),
           *live = callocCheck(S, sizeof(double));
    int *f_rank = mallocCheck(sizeof(int) * total), *i_rank = mallocCheck(sizeof(int) * total),
        *next = callocCheck(S, sizeof(int));
    for (int x = 0; x < total; x++) f_end[x] = i_end[x] = w_end[x] = -1, f_rank[x] = i_rank[x] = -1;
    if (S > 64) {
        snprintf(c.why, sizeof c.why, "more than 64 ranks");
        c.ok = 0, S = 0; // nothing more to run or count
    }
    for (int r = 0; r < S && c.ok; r++) // each action once, on the chunk's rank
        for (int j = 0; j < counts[r]; j++) {
            const Action* a = &lists[r][j];
            if (a->chunk < 0 || a->chunk >= V || a->mb < 0 || a->mb >= M || !strchr("FBIW", a->op)) {
                snprintf(c.why, sizeof c.why, "rank %d action %d is not an action of this pipeline", r, j);
                c.ok = 0;
                break;
            }
        }
    int progress = 1;
    while (c.ok && progress) {
        progress = 0;
        for (int r = 0; r < S; r++) {
            while (next[r] < counts[r]) {
                const Action* a = &lists[r][next[r]];
                int k = chunk_global(sched, S, r, a->chunk), x = k * M + a->mb, v, owner;
                double ready = free_at[r], dur = a->op == 'F' ? d.f : a->op == 'I' ? d.i : a->op == 'W' ? d.w : d.i + d.w;
                if (a->op == 'F') {
                    if (f_end[x] >= 0) { snprintf(c.why, sizeof c.why, "F of chunk %d microbatch %d twice", k, a->mb); c.ok = 0; break; }
                    if (k > 0) {
                        if (f_end[x - M] < 0) break; // waits for the chunk before
                        owner = f_rank[x - M];
                        ready = fmax(ready, f_end[x - M] + (owner == r ? 0 : d.latency));
                    }
                } else if (a->op == 'B' || a->op == 'I') {
                    if (i_end[x] >= 0) { snprintf(c.why, sizeof c.why, "backward of chunk %d microbatch %d twice", k, a->mb); c.ok = 0; break; }
                    if (f_end[x] < 0 || f_rank[x] != r) { snprintf(c.why, sizeof c.why, "rank %d runs %c of chunk %d microbatch %d before its F", r, a->op, k, a->mb); c.ok = 0; break; }
                    ready = fmax(ready, f_end[x]);
                    if (k < K - 1) {
                        if (i_end[x + M] < 0) break; // waits for the chunk after
                        owner = i_rank[x + M];
                        ready = fmax(ready, i_end[x + M] + (owner == r ? 0 : d.latency));
                    }
                } else { // W
                    if (w_end[x] >= 0 || i_end[x] < 0 || i_rank[x] != r) { snprintf(c.why, sizeof c.why, "rank %d runs W of chunk %d microbatch %d twice or before its I", r, k, a->mb); c.ok = 0; break; }
                    ready = fmax(ready, i_end[x]);
                }
                if (chunk_owner(sched, S, V, k, &v) != r) { snprintf(c.why, sizeof c.why, "rank %d runs chunk %d, which it does not hold", r, k); c.ok = 0; break; }
                double end = ready + dur;
                if (t0) t0[r * stride + next[r]] = ready, t1[r * stride + next[r]] = end;
                if (a->op == 'F') f_end[x] = end, f_rank[x] = r, live[r] += 1.0 / V;
                if (a->op == 'B' || a->op == 'I') i_end[x] = end, i_rank[x] = r;
                if (a->op == 'B') w_end[x] = end;
                if (a->op == 'W') w_end[x] = end;
                if (a->op == 'B' || a->op == 'W') live[r] -= 1.0 / V;
                c.peak[r] = fmax(c.peak[r], live[r]);
                c.busy[r] += dur;
                free_at[r] = c.end[r] = end;
                next[r]++;
                progress = 1;
            }
            if (!c.ok) break;
        }
    }
    for (int r = 0; r < S && c.ok; r++)
        if (next[r] < counts[r]) {
            const Action* a = &lists[r][next[r]];
            snprintf(c.why, sizeof c.why, "deadlock: rank %d waits forever at its action %d (%c of its chunk %d, microbatch %d)",
                     r, next[r], a->op, a->chunk, a->mb);
            c.ok = 0;
        }
    for (int x = 0; x < total && c.ok; x++)
        if (f_end[x] < 0 || i_end[x] < 0 || w_end[x] < 0) {
            snprintf(c.why, sizeof c.why, "chunk %d of microbatch %d misses its F, its backward or its W", x / M, x % M);
            c.ok = 0;
        }
    double busy = 0;
    for (int r = 0; r < S; r++) {
        c.makespan = fmax(c.makespan, c.end[r]);
        c.bubble[r] = c.end[r] > 0 ? 1 - c.busy[r] / c.end[r] : 0;
        busy += c.busy[r];
    }
    c.bubble_total = c.makespan > 0 ? 1 - busy / (S * c.makespan) : 0;
    free(f_end), free(i_end), free(w_end), free(free_at), free(live), free(f_rank), free(i_rank), free(next);
    return c;
}

// The closed forms (-1 where there is none): the bubble as a fraction of S x makespan, by
// the papers (none for zbv), and rank r's peak activations in microbatches through a stage
// (every schedule; tools/schedules --grid checks each against the lists).
static double schedule_bubble_formula(int sched, int S, int V, int M, Durations d) {
    double b = d.i + d.w;
    if (sched == SCHEDULE_NAIVE) return (S - 1.0) / S;
    if (sched == SCHEDULE_GPIPE || sched == SCHEDULE_1F1B) return (S - 1.0) / (M + S - 1.0);
    if (sched == SCHEDULE_INTERLEAVED) return (S - 1.0) / ((double)V * M + S - 1.0);
    if (sched == SCHEDULE_ZB1) {
        double idle = (S - 1.0) * (d.f + d.i - d.w);
        return idle / (M * (d.f + b) + idle);
    }
    return -1;
}
static double schedule_peak_formula(int sched, int S, int V, int M, int r) {
    if (sched == SCHEDULE_NAIVE) return 1;
    if (sched == SCHEDULE_GPIPE) return M;
    if (sched == SCHEDULE_1F1B || (sched == SCHEDULE_INTERLEAVED && V == 1)) return S - r < M ? S - r : M;
    if (sched == SCHEDULE_ZB1 || sched == SCHEDULE_ZBV) return S < M ? S : M;
    if (sched == SCHEDULE_INTERLEAVED) { // Megatron's warm-up, and one more: in chunk activations
        int chunks = 2 * (S - 1 - r) + (V - 1) * S + 1;
        return (chunks < V * M ? chunks : V * M) / (double)V;
    }
    return -1;
}

#pragma GCC diagnostic pop
#endif // SCHEDULES_H
