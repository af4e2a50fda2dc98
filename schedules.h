/*
 * schedules.h: pipeline schedules as data, and a checker that runs them without MPI.
 *
 * A pipeline cuts the model's units into S x V chunks (V a rank, S ranks) and the batch
 * into M microbatches. A schedule is, for each rank, the ordered list of its actions, with
 * torch.distributed.pipelining's names:
 *
 *   F    forward of microbatch m through chunk k
 *   B    full backward of m through k (I, then W, at once)
 *   I    the input-gradient half of B: what chunk k-1 is waiting for, sent at once
 *   W    the weight-gradient half: needed by no one before the optimizer step, so a
 *        zero-bubble schedule runs it later, in time that would otherwise be idle
 *   F&B  (DualPipeV) an F and a B of two microbatches as one action, run overlapped
 *
 * train_pp.c runs any list with one executor. The checker (schedule_check) runs the lists
 * with durations in place of computation; train_pp.c runs it on its lists before training.
 *
 * Which rank holds chunk k (chunk_owner):
 *   naive, gpipe, 1f1b, zb1   one chunk a rank: rank r holds chunk r
 *   interleaved               V a rank, round-robin: r, r+S, r+2S, ...
 *   zbv, dualpipev            two a rank, in a V: r on the way down, 2S-1-r on the way back
 *                             up, so rank 0 holds the first and the last chunk
 *
 * Closed forms, each derived (or cited) where its list is built below. f, i, w: the time
 * of a chunk's F, I and W (b = i + w, a B), fb of an F&B; no latency. The bubble is the
 * fraction of S x the step that ranks idle; peak activations of rank r count microbatches
 * through a whole stage (a chunk holds 1/V of one), over all its chunks at once; in bytes,
 * where the chunks hold different amounts, schedule_peak_held walks the list instead.
 *
 *   schedule     bubble                               peak of rank r         rule
 *   naive        (S-1)/S                              1
 *   gpipe        (S-1)/(M+S-1)                        M
 *   1f1b         (S-1)/(M+S-1)                        min(S-r, M)
 *   interleaved  (S-1)/(V M+S-1)                      min(2(S-1-r)+(V-1)S+1, V M)/V  M a multiple of S
 *   zb1          (S-1)(f+i-w)/(M(f+b)+(S-1)(f+i-w))   min(S, M)              (bubble: M >= S)
 *   zbv          none: the checker measures it        min(S, M)
 *   dualpipev    (S-1)(fb+b-3w)/(2M(f+b)+(S-1)(fb+b-3w))  S + 1/2            M >= 2S
 *
 * Sections: names and places; the schedules, one function each; the checker; the closed
 * forms as functions.
 */
#ifndef SCHEDULES_H
#define SCHEDULES_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "util.h"

// ----------------------------------------------------------------------------
// names and places

typedef struct {
    char op;          // 'F', 'B', 'I', 'W', or '&' for an F&B
    int chunk, mb;    // the chunk of the model (0..S V-1) and the microbatch; of an F&B, its F's
    int b_chunk, b_mb; // an F&B's B
} Action;
static Action act(char op, int chunk, int mb) { return (Action){op, chunk, mb, 0, 0}; }

enum { SCHEDULE_NAIVE, SCHEDULE_GPIPE, SCHEDULE_1F1B, SCHEDULE_INTERLEAVED, SCHEDULE_ZB1, SCHEDULE_ZBV,
       SCHEDULE_DUALPIPEV, N_SCHEDULES };
static const char* const schedule_names[N_SCHEDULES] = {"naive", "gpipe", "1f1b", "interleaved", "zb1", "zbv", "dualpipev"};

// --schedule NAME: NULL, or the error message (written to err)
static const char* schedule_parse(const char* value, int* sched, char* err, size_t n) {
    for (int s = 0; s < N_SCHEDULES; s++)
        if (!strcmp(value, schedule_names[s])) {
            *sched = s;
            return NULL;
        }
    snprintf(err, n, "--schedule must be naive, gpipe, 1f1b, interleaved, zb1, zbv or dualpipev, got '%s'", value);
    return err;
}

// Whether the schedule's chunks form a V (rank 0 then holds the first and the last chunk).
static int schedule_v_shaped(int sched) { return sched == SCHEDULE_ZBV || sched == SCHEDULE_DUALPIPEV; }
// The schedules that run a backward's input half (I) and weight half (W) apart
static int schedule_splits_iw(int sched) { return sched == SCHEDULE_ZB1 || schedule_v_shaped(sched); }
// Chunks per rank: --virtual for interleaved, 2 for the V-shaped, else 1.
static int schedule_chunks(int sched, int virtual_stages) {
    return sched == SCHEDULE_INTERLEAVED ? virtual_stages : schedule_v_shaped(sched) ? 2 : 1;
}
// The chunk of the model (0..S V-1, in model order) that rank r holds as its v-th.
static int chunk_global(int sched, int S, int r, int v) {
    if (schedule_v_shaped(sched)) return v == 0 ? r : 2 * S - 1 - r; // down the ranks, then back up
    return v * S + r;                                                 // round-robin
}
// The rank that holds chunk k, and (*v) as which of its chunks; -1 past either end.
static int chunk_owner(int sched, int S, int V, int k, int* v) {
    if (k < 0 || k >= S * V) return *v = -1, -1;
    if (schedule_v_shaped(sched)) return k < S ? (*v = 0, k) : (*v = 1, 2 * S - 1 - k);
    return *v = k / S, k % S;
}

// Whether S ranks, V chunks each and M microbatches fit the schedule; NULL, or why not.
static const char* schedule_rule(int sched, int S, int V, int M, char* err, size_t n) {
    if (S > 64)
        snprintf(err, n, "%d pipeline stages: the schedules' checker (schedules.h) simulates up to 64", S);
    else if (sched == SCHEDULE_INTERLEAVED && V > 1 && M % S != 0)
        snprintf(err, n, "--schedule interleaved sends microbatches round the ranks in groups of S: the "
                 "microbatches (%d) must be a multiple of the stages (%d)", M, S);
    else if (sched == SCHEDULE_DUALPIPEV && M < 2 * S)
        snprintf(err, n, "--schedule dualpipev fills both arms of its V before its steady state: it needs at least "
                 "2 x %d stages = %d microbatches, got %d (raise --microbatches to %d or more)", S, 2 * S, M, 2 * S);
    else
        return NULL;
    return err;
}

// ----------------------------------------------------------------------------
// the schedules: each fills rank r's list (room for 3 V M actions) and returns its length

static int schedule_naive(int S, int V, int M, int r, Action* a) { // one microbatch in the pipeline at a time
    (void)S, (void)V;
    int n = 0;
    for (int m = 0; m < M; m++) a[n++] = act('F', r, m), a[n++] = act('B', r, m);
    return n;
}
// GPipe (Huang et al. 2019): every forward, then every backward. The pipeline fills in S-1
// forwards and drains in S-1 backwards, so each rank idles (S-1)(f+b) of a step of
// (M+S-1)(f+b); it holds all M microbatches before the first backward.
static int schedule_gpipe(int S, int V, int M, int r, Action* a) {
    (void)S, (void)V;
    int n = 0;
    for (int m = 0; m < M; m++) a[n++] = act('F', r, m);
    for (int m = 0; m < M; m++) a[n++] = act('B', r, m);
    return n;
}
// 1F1B (PipeDream-Flush, Narayanan et al. 2021): S-1-r forwards to fill the pipeline, then
// one forward and one backward in turn, then the backwards left. The same fill and drain
// as GPipe, so the same bubble; but rank r holds at most S-r microbatches (its warm-up and
// one more), not M.
static int schedule_1f1b(int S, int V, int M, int r, Action* a) {
    (void)V;
    int n = 0, f = 0, b = 0, warmup = S - 1 - r < M ? S - 1 - r : M;
    while (f < warmup) a[n++] = act('F', r, f++);
    while (f < M) a[n++] = act('F', r, f++), a[n++] = act('B', r, b++);
    while (b < M) a[n++] = act('B', r, b++);
    return n;
}
// Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021): rank r holds chunks r, r+S, ...
// (its "rounds" 0..V-1) and runs 1F1B over V M chunk-passes. Its j-th forward is microbatch
// (j / (S V)) S + j % S in round (j / S) % V: groups of S microbatches go through round 0,
// then round 1, ... (S = 2, V = 2: rounds and microbatches (0,0) (0,1) (1,0) (1,1) (0,2)
// (0,3) ...); backwards the same with the rounds reversed. A chunk is 1/V of a stage, so
// the fill and drain take (S-1)(f+b)/V: the bubble (S-1)/(V M+S-1). The warm-up is longer,
// Megatron's 2(S-1-r) + (V-1)S forwards (before rank r's first backward, microbatch 0 runs
// V-1 rounds on every rank, and goes down to the last rank and back), so the peak is one
// more chunk-pass than that, in microbatches /V.
static void interleaved_pass(int S, int V, int r, int j, int forward, int* chunk, int* mb) {
    int round = (j / S) % V;
    *chunk = (forward ? round : V - 1 - round) * S + r;
    *mb = (j / (S * V)) * S + j % S;
}
static int schedule_interleaved(int S, int V, int M, int r, Action* a) {
    int total = V * M, n = 0, f = 0, b = 0, k, m;
    int warmup = V == 1 ? S - 1 - r : 2 * (S - 1 - r) + (V - 1) * S;
    warmup = warmup < total ? warmup : total;
    while (f < warmup) interleaved_pass(S, V, r, f++, 1, &k, &m), a[n++] = act('F', k, m);
    while (f < total) {
        interleaved_pass(S, V, r, f++, 1, &k, &m), a[n++] = act('F', k, m);
        interleaved_pass(S, V, r, b++, 0, &k, &m), a[n++] = act('B', k, m);
    }
    while (b < total) interleaved_pass(S, V, r, b++, 0, &k, &m), a[n++] = act('B', k, m);
    return n;
}
// ZB-H1 (zero bubble, Qi et al. 2023, section 3): 1F1B's order of forwards and input
// gradients, with each W delayed: rank r runs the W of microbatch j after the I of j + r,
// and its last r W's at the end, where 1F1B idles in its drain. The paper's bubble:
// (S-1)(f+i-w) a rank (1F1B's is (S-1)(f+i+w)), a third of 1F1B's when f = i = w, once
// M >= S. Rank r holds at most S microbatches (S-r before their I, r waiting for their W):
// the peak of 1F1B's rank 0, on every rank.
static int schedule_zb1(int S, int V, int M, int r, Action* a) {
    (void)V;
    int n = 0, f = 0, b = 0, w = 0, warmup = S - 1 - r < M ? S - 1 - r : M;
    while (f < warmup) a[n++] = act('F', r, f++);
    while (b < M) {
        if (f < M) a[n++] = act('F', r, f++);
        a[n++] = act('I', r, b++);
        if (b - 1 >= r && w < M) a[n++] = act('W', r, w++);
    }
    while (w < M) a[n++] = act('W', r, w++);
    return n;
}

// ZB-V (zero bubble, V-shaped, Qi et al.): chunks r and 2S-1-r on rank r, so that the
// pipeline turns round on rank S-1 and ends on rank 0. No closed form: the lists come from
// playing the pipeline in unit time steps (F, I and W one step each, messages instant),
// every free rank taking, of its two chunks' oldest actions not yet run: a ready I (the
// chunk after has sent its gradient), else a ready F while it holds fewer than 2S chunk
// activations (S microbatches, 1F1B's rank 0: the peak min(S, M)), else a pending W, in
// what would be a bubble; the older microbatch first (of one microbatch, the later chunk). Each rank's
// list is the order it took them in; a play that finishes has no cycle of waits.
//
// Each chunk takes each kind in microbatch order (the chunk before sends its F's in that
// order, the chunk after its I's), so its only candidate of a kind is the oldest it has
// not taken, next[kind][k]: a time step looks at 2 candidates per kind and rank, and the
// play takes time linear in the actions.
enum { PLAY_I, PLAY_F, PLAY_W }; // the kinds, in the order a free rank prefers them
typedef struct {
    int S, M;
    int* end[3];  // end[kind][k M + m]: the time step that action of chunk k on microbatch m ends (-1: not taken)
    int* next[3]; // next[kind][k]: the oldest microbatch chunk k has not taken that kind for
} Play;
// Whether an action has ended by time step t; none is needed past either end of the model.
static int play_ended(const Play* p, int kind, int k, int m, int t) {
    if (k < 0 || k >= 2 * p->S) return 1;
    int end = p->end[kind][(long)k * p->M + m];
    return end >= 0 && end <= t;
}
static int play_ready(const Play* p, int kind, int k, int m, int t, int live) {
    if (kind == PLAY_I) return play_ended(p, PLAY_F, k, m, t) && play_ended(p, PLAY_I, k + 1, m, t);
    if (kind == PLAY_F) return live < 2 * p->S && play_ended(p, PLAY_F, k - 1, m, t);
    return play_ended(p, PLAY_I, k, m, t);
}
static void schedule_zbv(int S, int M, Action** lists, int* counts) {
    Play p = {S, M, {0}, {0}};
    long actions = 3L * 2 * S * M;
    for (int kind = PLAY_I; kind <= PLAY_W; kind++) {
        p.end[kind] = mallocCheck(sizeof(int) * 2 * S * M), p.next[kind] = callocCheck(2 * S, sizeof(int));
        for (long x = 0; x < 2L * S * M; x++) p.end[kind][x] = -1;
    }
    int* live = callocCheck(S, sizeof(int)); // chunk activations rank r holds
    for (int r = 0; r < S; r++) counts[r] = 0;
    for (int t = 0; actions > 0; t++) {
        if (t > 6L * S * M) fatal("internal: the zbv schedule cannot be played for S=%d M=%d", S, M);
        for (int r = 0; r < S; r++) {
            int kind = -1, k = 0, m = 0;
            for (int want = PLAY_I; want <= PLAY_W && kind < 0; want++)
                for (int v = 1; v >= 0; v--) { // the older microbatch wins; a tie, the later chunk (v = 1, seen first)
                    int kv = chunk_global(SCHEDULE_ZBV, S, r, v), mv = p.next[want][kv];
                    if (mv >= M || (kind >= 0 && mv >= m) || !play_ready(&p, want, kv, mv, t, live[r])) continue;
                    kind = want, k = kv, m = mv;
                }
            if (kind < 0) continue; // idle at t
            lists[r][counts[r]++] = act("IFW"[kind], k, m);
            p.end[kind][(long)k * M + m] = t + 1, p.next[kind][k]++, actions--;
            live[r] += kind == PLAY_F ? 1 : kind == PLAY_W ? -1 : 0;
        }
    }
    for (int kind = PLAY_I; kind <= PLAY_W; kind++) free(p.end[kind]), free(p.next[kind]);
    free(live);
}

// DualPipeV (DeepSeek's DualPipe cut in half, Sea AI Lab; deepseek-ai/DualPipe): ZB-V's
// chunks, r going down and 2S-1-r coming back up, and a steady state of F&B's: the
// forward of one microbatch overlapped with the backward of another, each hiding the
// other's communication. Rank r runs eight phases, "d" being its chunk on the down arm and
// "u" its chunk on the up arm (every count holds for M >= 2S):
//   1. 2(S-1-r) F(d)              fill the down arm
//   2. r+1 x  F(d) F(u)           the turn: rank r's first microbatch comes back up
//   3. S-1-r x  I(u) W(u) F(u)    a backward split so that its gradient leaves first
//   4. M-2S+1+r x  F(d)&B(u), F(u)&B(d)   the steady state (on the last rank, the first
//                                 F(d)&B(u) is an F then a B: the F needs no gradient)
//   5. S-1-r x  B(u), F(u)&B(d)   the forwards run out
//   6. r+1 x  B(u) B(d)           the drain; its last r+1 backwards are I's
//   7. S-1-r x  W, I(d)           ... whose W's fill the drain's idle time, oldest first
//   8. r+1 x  W
// The lists for S = 2 and M = 4, phase by phase ("|" ends a phase, "-" is an empty one),
// each action written chunk.microbatch. Rank 0 holds chunks 0 (d) and 3 (u), rank 1 holds
// chunks 1 (d) and 2 (u). tools/schedules dualpipev 2 2 4 prints them, and tests/run.sh
// (section schedules) checks that this function still makes them.
//   rank 0: F0.0 F0.1 | F0.2 F3.0 | I3.0 W3.0 F3.1 | F0.3&B3.1 F3.2&B0.0 | B3.2 F3.3&B0.1 | B3.3 I0.2 | W0.2 I0.3 | W0.3
//   rank 1: - | F1.0 F2.0 F1.1 F2.1 | - | F1.2 B2.0 F2.2&B1.0 F1.3&B2.1 F2.3&B1.1 | - | B2.2 B1.2 I2.3 I1.3 | - | W2.3 W1.3
// The peak: phases 1-2 leave 2S chunk activations; each F&B's F adds one before its B
// frees one: 2S+1 chunks, S + 1/2 microbatches, on every rank (DualPipe's "PP+1" with PP =
// 2S stages). The bubble, by DualPipe's README: (PP/2-1)(F&B+B-3W) = (S-1)(fb+b-3w) a rank.
typedef struct {
    Action* a;
    int n, k[2], f[2], b[2]; // the list so far; the two arms' chunks, and their next F and B
    int w_first, w_last;     // the I's whose W is pending: a[w_at[w_first..w_last-1]]
    int* w_at;
} Dual;
enum { DOWN, UP };
static void dual_f(Dual* d, int arm) { d->a[d->n++] = act('F', d->k[arm], d->f[arm]++); }
static void dual_b(Dual* d, int arm, char op) { // 'B', or 'I' with its W pending
    if (op == 'I') d->w_at[d->w_last++] = d->n;
    d->a[d->n++] = act(op, d->k[arm], d->b[arm]++);
}
static void dual_w(Dual* d) {
    const Action* i = &d->a[d->w_at[d->w_first++]];
    d->a[d->n++] = act('W', i->chunk, i->mb);
}
static void dual_fb(Dual* d, int f_arm, int b_arm) {
    d->a[d->n++] = (Action){'&', d->k[f_arm], d->f[f_arm]++, d->k[b_arm], d->b[b_arm]++};
}
static int schedule_dualpipev(int S, int V, int M, int r, Action* a) {
    (void)V;
    Dual d = {a, 0, {r, 2 * S - 1 - r}, {0, 0}, {0, 0}, 0, 0, mallocCheck(sizeof(int) * 2 * M)};
    int last = r == S - 1;
    for (int j = 0; j < 2 * (S - 1 - r); j++) dual_f(&d, DOWN);          // 1
    for (int j = 0; j < r + 1; j++) dual_f(&d, DOWN), dual_f(&d, UP);     // 2
    for (int j = 0; j < S - 1 - r; j++) dual_b(&d, UP, 'I'), dual_w(&d), dual_f(&d, UP); // 3
    for (int j = 0; j < M - 2 * S + 1 + r; j++) {                        // 4
        if (j == 0 && last) dual_f(&d, DOWN), dual_b(&d, UP, 'B');
        else dual_fb(&d, DOWN, UP);
        dual_fb(&d, UP, DOWN);
    }
    for (int j = 0; j < S - 1 - r; j++) dual_b(&d, UP, 'B'), dual_fb(&d, UP, DOWN); // 5
    for (int j = 0; j < 2 * (r + 1); j++) dual_b(&d, j % 2 ? DOWN : UP, j < r + 1 ? 'B' : 'I'); // 6
    for (int j = 0; j < S - 1 - r; j++) dual_w(&d), dual_b(&d, DOWN, 'I'); // 7
    while (d.w_first < d.w_last) dual_w(&d);                              // 8
    free(d.w_at);
    return d.n;
}

// Every rank's list of a schedule: lists[r] needs room for 3 V M actions.
static void schedule_build(int sched, int S, int V, int M, Action** lists, int* counts) {
    if (sched == SCHEDULE_ZBV) {
        schedule_zbv(S, M, lists, counts);
        return;
    }
    for (int r = 0; r < S; r++) {
        if (sched == SCHEDULE_NAIVE) counts[r] = schedule_naive(S, V, M, r, lists[r]);
        if (sched == SCHEDULE_GPIPE) counts[r] = schedule_gpipe(S, V, M, r, lists[r]);
        if (sched == SCHEDULE_1F1B) counts[r] = schedule_1f1b(S, V, M, r, lists[r]);
        if (sched == SCHEDULE_INTERLEAVED) counts[r] = schedule_interleaved(S, V, M, r, lists[r]);
        if (sched == SCHEDULE_ZB1) counts[r] = schedule_zb1(S, V, M, r, lists[r]);
        if (sched == SCHEDULE_DUALPIPEV) counts[r] = schedule_dualpipev(S, V, M, r, lists[r]);
    }
}

// The computations of an action: itself, or an F&B's F and then its B. Returns how many.
static int action_parts(const Action* a, Action part[2]) {
    if (a->op != '&') return part[0] = *a, 1;
    part[0] = act('F', a->chunk, a->mb), part[1] = act('B', a->b_chunk, a->b_mb);
    return 2;
}

// ----------------------------------------------------------------------------
// the checker: every rank's list run without MPI, with durations and a latency

typedef struct {
    double f, i, w;  // durations of a chunk's F, I and W (B takes i + w)
    double latency;  // of a message between two ranks (none within a rank)
    double fb;       // of an F&B: 0 for f + i + w, the two in turn (as on one core)
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

__attribute__((format(printf, 2, 3))) static void check_fails(Check* c, const char* fmt, ...) {
    if (!c->ok) return; // the first failure is the one reported
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    c->ok = 0;
}

// Runs every rank's list in order, each action starting when its rank is free and its
// inputs exist: an F the activations of chunk k-1, a B or I the gradient from chunk k+1
// (a message: + latency, unless the chunk is on the same rank), a W its I. Checks:
//  - each action names a chunk its rank holds and a microbatch of the step;
//  - each chunk runs its F's in microbatch order, and its backwards (B or I) too, each
//    once: train_pp.c's messages need no microbatch in their tags;
//  - a B, I or W comes after what it needs on its own rank (its F, its I);
//  - no rank waits for an action that never comes (with train_pp.c's blocking receives,
//    a deadlock), and every chunk of every microbatch gets its F, its backward and its W.
static Check schedule_check(int sched, int S, int V, int M, Action* const* lists, const int* counts, Durations d,
                            double* t0, double* t1, int stride) {
    Check c = {.ok = 1, .t0 = t0, .t1 = t1};
    int n_chunks = S * V, v;
    long total = (long)n_chunks * M;
    if (S > 64) {
        check_fails(&c, "more than 64 ranks");
        return c;
    }
    // each action of the pipeline, each chunk's F's and backwards in microbatch order
    int *f_next = callocCheck(n_chunks, sizeof(int)), *b_next = callocCheck(n_chunks, sizeof(int));
    for (int r = 0; r < S && c.ok; r++)
        for (int j = 0; j < counts[r] && c.ok; j++) {
            Action part[2];
            int n = action_parts(&lists[r][j], part);
            if (!strchr("FBIW&", lists[r][j].op) || lists[r][j].op == 0) n = 0, check_fails(&c, "rank %d action %d is not an action", r, j);
            for (int q = 0; q < n && c.ok; q++) {
                int k = part[q].chunk, m = part[q].mb, op = part[q].op;
                if (k < 0 || k >= n_chunks || m < 0 || m >= M)
                    check_fails(&c, "rank %d action %d is not an action of this pipeline", r, j);
                else if (chunk_owner(sched, S, V, k, &v) != r)
                    check_fails(&c, "rank %d runs chunk %d, which it does not hold", r, k);
                else if (op == 'F' && f_next[k]++ != m)
                    check_fails(&c, "chunk %d runs F of microbatch %d twice or out of microbatch order", k, m);
                else if ((op == 'B' || op == 'I') && b_next[k]++ != m)
                    check_fails(&c, "chunk %d runs the backward of microbatch %d twice or out of microbatch order", k, m);
            }
        }
    // the lists run, a rank at a time as far as its inputs allow, until none can move
    double *f_end = mallocCheck(sizeof(double) * total), *b_end = mallocCheck(sizeof(double) * total),
           *w_end = mallocCheck(sizeof(double) * total), *free_at = callocCheck(S, sizeof(double)),
           *live = callocCheck(S, sizeof(double));
    int* next = callocCheck(S, sizeof(int));
    for (long x = 0; x < total; x++) f_end[x] = b_end[x] = w_end[x] = -1;
    for (int moved = 1; moved && c.ok;) {
        moved = 0;
        for (int r = 0; r < S && c.ok; r++)
            for (; next[r] < counts[r]; next[r]++) {
                const Action* a = &lists[r][next[r]];
                Action part[2];
                int n = action_parts(a, part), waits = 0;
                double start = free_at[r];
                for (int q = 0; q < n && !waits; q++) {
                    int k = part[q].chunk, op = part[q].op;
                    long x = (long)k * M + part[q].mb;
                    if (op == 'F' && k > 0) { // the activations of chunk k-1
                        if (f_end[x - M] < 0) waits = 1;
                        else start = fmax(start, f_end[x - M] + (chunk_owner(sched, S, V, k - 1, &v) == r ? 0 : d.latency));
                    } else if (op == 'B' || op == 'I') { // its F, on this rank; the gradient of chunk k+1
                        if (f_end[x] < 0) check_fails(&c, "rank %d runs %c of chunk %d microbatch %d before its F", r, op, k, part[q].mb);
                        start = fmax(start, f_end[x]);
                        if (k == n_chunks - 1) continue;
                        if (b_end[x + M] < 0) waits = 1;
                        else start = fmax(start, b_end[x + M] + (chunk_owner(sched, S, V, k + 1, &v) == r ? 0 : d.latency));
                    } else if (op == 'W') { // its I, on this rank
                        if (b_end[x] < 0 || w_end[x] >= 0) check_fails(&c, "rank %d runs W of chunk %d microbatch %d twice or before its I", r, k, part[q].mb);
                        start = fmax(start, b_end[x]);
                    }
                }
                if (waits || !c.ok) break;
                double dur = a->op == 'F' ? d.f : a->op == 'I' ? d.i : a->op == 'W' ? d.w : a->op == 'B' ? d.i + d.w
                           : d.fb > 0 ? d.fb : d.f + d.i + d.w, end = start + dur;
                for (int q = 0; q < n; q++) { // an F&B's F holds its activations before its B frees others
                    long x = (long)part[q].chunk * M + part[q].mb;
                    if (part[q].op == 'F') f_end[x] = end, live[r] += 1.0 / V;
                    if (part[q].op == 'B' || part[q].op == 'I') b_end[x] = end;
                    if (part[q].op == 'B' || part[q].op == 'W') w_end[x] = end, live[r] -= 1.0 / V;
                    c.peak[r] = fmax(c.peak[r], live[r]);
                }
                if (t0) t0[r * stride + next[r]] = start, t1[r * stride + next[r]] = end;
                c.busy[r] += dur;
                free_at[r] = c.end[r] = end;
                moved = 1;
            }
    }
    for (int r = 0; r < S && c.ok; r++)
        if (next[r] < counts[r]) {
            const Action* a = &lists[r][next[r]];
            check_fails(&c, "deadlock: rank %d waits forever at its action %d (%c of chunk %d, microbatch %d)", r, next[r],
                        a->op, a->chunk, a->mb);
        }
    for (long x = 0; x < total && c.ok; x++)
        if (f_end[x] < 0 || b_end[x] < 0 || w_end[x] < 0)
            check_fails(&c, "chunk %ld of microbatch %ld misses its F, its backward or its W", x / M, x % M);
    double busy = 0;
    for (int r = 0; r < S; r++) {
        c.makespan = fmax(c.makespan, c.end[r]);
        c.bubble[r] = c.end[r] > 0 ? 1 - c.busy[r] / c.end[r] : 0;
        busy += c.busy[r];
    }
    c.bubble_total = c.makespan > 0 ? 1 - busy / (S * c.makespan) : 0;
    free(f_next), free(b_next), free(f_end), free(b_end), free(w_end), free(free_at), free(live), free(next);
    return c;
}

// ----------------------------------------------------------------------------
// the closed forms of the table above (-1 where there is none; tools/schedules --grid
// checks each against the checker's run of the lists)

static double schedule_bubble_formula(int sched, int S, int V, int M, Durations d) {
    double b = d.i + d.w, fb = d.fb > 0 ? d.fb : d.f + b;
    if (sched == SCHEDULE_NAIVE) return (S - 1.0) / S;
    if (sched == SCHEDULE_GPIPE || sched == SCHEDULE_1F1B) return (S - 1.0) / (M + S - 1.0);
    if (sched == SCHEDULE_INTERLEAVED) return (S - 1.0) / ((double)V * M + S - 1.0);
    if (sched == SCHEDULE_ZB1) {
        double idle = (S - 1.0) * (d.f + d.i - d.w);
        return idle / (M * (d.f + b) + idle);
    }
    if (sched == SCHEDULE_DUALPIPEV) {
        double idle = (S - 1.0) * (fb + b - 3 * d.w);
        return idle / (2.0 * M * (d.f + b) + idle);
    }
    return -1;
}
static double schedule_peak_formula(int sched, int S, int V, int M, int r) {
    if (sched == SCHEDULE_NAIVE) return 1;
    if (sched == SCHEDULE_GPIPE) return M;
    if (sched == SCHEDULE_1F1B || (sched == SCHEDULE_INTERLEAVED && V == 1)) return S - r < M ? S - r : M;
    if (sched == SCHEDULE_ZB1 || sched == SCHEDULE_ZBV) return S < M ? S : M;
    if (sched == SCHEDULE_DUALPIPEV) return S + 0.5;
    if (sched == SCHEDULE_INTERLEAVED) {
        int chunks = 2 * (S - 1 - r) + (V - 1) * S + 1;
        return (chunks < V * M ? chunks : V * M) / (double)V;
    }
    return -1;
}
// The peak of rank r when a microbatch through its v-th chunk holds held[v] (bytes, say):
// the schedule's list for r walked, each chunk's microbatch held from its F to its B, or to
// its W where the list runs I and W apart (an F&B's F before its B lets one go), and the
// most at once. With held[v] = 1/V it is the table's peak; but a rank's chunks hold different
// amounts (the embedding, the head, the two arms of a V), and what they hold together peaks
// when the heavier chunks have the most in flight, not always when the count does.
static double schedule_peak_held(int sched, int S, int V, int M, int r, const double* held) {
    Action** lists = mallocCheck(sizeof(Action*) * S);
    int* counts = mallocCheck(sizeof(int) * S);
    for (int q = 0; q < S; q++) lists[q] = mallocCheck(sizeof(Action) * 3 * V * M);
    schedule_build(sched, S, V, M, lists, counts);
    double live = 0, peak = 0;
    for (int j = 0; j < counts[r]; j++) {
        Action part[2];
        int n = action_parts(&lists[r][j], part), v;
        for (int q = 0; q < n; q++) {
            chunk_owner(sched, S, V, part[q].chunk, &v);
            if (part[q].op == 'F') live += held[v], peak = fmax(peak, live);
            if (part[q].op == 'B' || part[q].op == 'W') live -= held[v];
        }
    }
    for (int q = 0; q < S; q++) free(lists[q]);
    free(lists), free(counts);
    return peak;
}

#pragma GCC diagnostic pop
#endif // SCHEDULES_H
