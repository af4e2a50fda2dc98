/*
 * data.h: a text file of one item per line -> vocabulary -> examples -> batches.
 *
 * Vocabulary: token 0 is the boundary (shown as '.'), then every byte that occurs in the
 * file, in increasing byte order. names.txt gives 27 tokens: '.', 'a' ... 'z'.
 *
 * Examples: a line of n characters gives n+1 examples. Example p (0 <= p <= n) predicts
 * character p from the T characters before it, left-padded with the boundary token 0; the
 * last one (p = n) predicts the boundary: "emma" gives ...... -> e, .....e -> m, ...,
 * .emma -> '.' (for T = 5, padding shown as dots).
 *
 * Split: the lines are shuffled with the seed (names.txt is sorted by frequency, so an
 * unshuffled split would put only rare names in validation); the first 90% train, the
 * last 10% (n/10 lines, rounded down) validate.
 *
 * Batches: row b of step s is training example rng(seed, STREAM_BATCH, s*2^32 + b) modulo
 * the number of training examples. A rank that owns rows lo..hi-1 of the global batch
 * draws exactly those, never the rest.
 *
 * Input checks (each message names the file and line): unreadable file, empty file, no
 * usable lines, fewer lines than a split needs, NUL or other control bytes, bytes that are
 * not ASCII (UTF-8 names are refused with the line and column: a token is one ASCII
 * character), lines longer than the limit (--max-line). CRLF line endings, blank lines and
 * a leading UTF-8 byte-order mark are accepted.
 */
#ifndef DATA_H
#define DATA_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "util.h"

#define DATA_DEFAULT_MAX_LINE 1024
#define DATA_MIN_LINES 10 // a 90/10 split of fewer lines leaves validation empty

typedef struct {
    const char* path;
    int vocab;                      // number of tokens, boundary included
    uint64_t checksum;              // of the file's bytes (checkpoints record it)
    unsigned char token_char[256];  // token -> byte it stands for (token 0: '.')
    int char_token[256];            // byte -> token, or -1 if the byte never occurs
    int n_lines, n_train, n_val;    // lines [0, n_train) train, [n_train, n_lines) validate
    int max_len;                    // longest line, in characters
    unsigned char* tokens;          // every line's tokens, concatenated, in split order
    long* line_start;               // [n_lines] offset of each line in tokens
    int* line_len;                  // [n_lines]
    long* example_end;              // [n_lines] examples in lines 0..i of its split (prefix sums)
    long n_train_examples, n_val_examples;
    // What a row is (dataset_use_rows): an example (the MLP; seq_len 0), or a whole line as a
    // sequence of seq_len positions (the GPT); and the validation split's rows and targets.
    int seq_len;
    long n_val_rows, n_val_targets;
} Dataset;

// Reads and checks the file; any problem is a fatal error naming the file and line.
static void dataset_load(Dataset* ds, const char* path, int max_line, uint64_t seed) {
    memset(ds, 0, sizeof(*ds));
    ds->path = path;
    FILE* f = fopen(path, "rb");
    if (!f) fatal("cannot open data file '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, size = 0;
    unsigned char* text = mallocCheck(cap);
    for (;;) {
        if (size == cap) {
            cap *= 2;
            text = reallocCheck(text, cap);
        }
        size_t got = fread(text + size, 1, cap - size, f);
        size += got;
        if (got == 0) break;
    }
    if (ferror(f)) fatal("cannot read data file '%s': %s", path, strerror(errno));
    fclose(f);
    if (size == 0) fatal("data file '%s' is empty", path);
    ds->checksum = fnv1a(FNV_START, text, size);
    size_t bom = size >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3) ? 3 : 0; // a UTF-8 byte-order mark: not text

    // Pass 1: find the lines, check their bytes and lengths, collect the vocabulary.
    int present[256] = {0};
    long n_alloc = 1024, n = 0;
    long* start = mallocCheck(n_alloc * sizeof(long));
    int* len = mallocCheck(n_alloc * sizeof(int));
    long line_no = 0;
    for (size_t pos = bom; pos < size;) {
        line_no++;
        size_t end = pos;
        while (end < size && text[end] != '\n') end++;
        size_t stop = end;
        if (stop > pos && text[stop - 1] == '\r') stop--; // CRLF
        for (size_t i = pos; i < stop; i++) {
            unsigned char c = text[i];
            if (c == 0)
                fatal("%s:%ld: NUL byte at column %zu (is this a binary file?)", path, line_no, i - pos + 1);
            if (c < 0x20 || c == 0x7f)
                fatal("%s:%ld: control byte 0x%02x at column %zu; lines must be plain text", path,
                      line_no, c, i - pos + 1);
            if (c >= 0x80)
                fatal("%s:%ld: byte 0x%02x at column %zu is not ASCII; tokens are single ASCII characters, so "
                      "transliterate the file first (iconv -t ASCII//TRANSLIT)", path, line_no, c, i - pos + 1);
            present[c] = 1;
        }
        long L = (long)(stop - pos);
        if (L > max_line)
            fatal("%s:%ld: line is %ld bytes long, more than the limit of %d (raise it with --max-line)",
                  path, line_no, L, max_line);
        if (L > 0) { // blank lines are skipped
            if (n == n_alloc) {
                n_alloc *= 2;
                start = reallocCheck(start, n_alloc * sizeof(long));
                len = reallocCheck(len, n_alloc * sizeof(int));
            }
            start[n] = (long)pos;
            len[n] = (int)L;
            n++;
        }
        pos = end + 1;
    }
    if (n == 0) fatal("data file '%s' has no usable lines (only blank lines)", path);
    if (n < DATA_MIN_LINES)
        fatal("data file '%s' has %ld usable lines; the 90/10 train/validation split needs at least %d",
              path, n, DATA_MIN_LINES);
    if (n > 2147483647L / 2) fatal("data file '%s' has too many lines (%ld)", path, n);

    ds->vocab = 1;
    ds->token_char[0] = '.';
    for (int c = 0; c < 256; c++) {
        ds->char_token[c] = -1;
        if (present[c]) {
            ds->char_token[c] = ds->vocab;
            ds->token_char[ds->vocab++] = (unsigned char)c;
        }
    }

    // Pass 2: shuffle the lines with the seed (Fisher-Yates, counter-based draws), split.
    int* order = mallocCheck(n * sizeof(int));
    for (long i = 0; i < n; i++) order[i] = (int)i;
    for (long i = n - 1; i > 0; i--) {
        long j = (long)(rng_u64(seed, STREAM_SPLIT, (uint64_t)i) % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    ds->n_lines = (int)n;
    ds->n_val = (int)(n / 10);
    ds->n_train = ds->n_lines - ds->n_val;

    // Pass 3: store the tokens in split order with each split's example counts.
    long total = 0;
    for (long i = 0; i < n; i++) total += len[i];
    ds->tokens = mallocCheck(total);
    ds->line_start = mallocCheck(n * sizeof(long));
    ds->line_len = mallocCheck(n * sizeof(int));
    ds->example_end = mallocCheck(n * sizeof(long));
    long off = 0, examples = 0;
    for (long i = 0; i < n; i++) {
        if (i == ds->n_train) {
            ds->n_train_examples = examples;
            examples = 0;
        }
        long src = start[order[i]];
        int L = len[order[i]];
        ds->line_start[i] = off;
        ds->line_len[i] = L;
        for (int k = 0; k < L; k++) ds->tokens[off + k] = (unsigned char)ds->char_token[text[src + k]];
        off += L;
        examples += L + 1;
        ds->example_end[i] = examples;
        if (L > ds->max_len) ds->max_len = L;
    }
    ds->n_val_examples = examples;
    free(order);
    free(start);
    free(len);
    free(text);
}

static void dataset_free(Dataset* ds) {
    free(ds->tokens);
    free(ds->line_start);
    free(ds->line_len);
    free(ds->example_end);
}

// Example e of line `line`: T context tokens and the target.
static void dataset_line_example(const Dataset* ds, int line, int p, int T, int* context, int* target) {
    const unsigned char* s = ds->tokens + ds->line_start[line];
    for (int t = 0; t < T; t++) {
        int k = p - T + t;
        context[t] = k >= 0 ? s[k] : 0;
    }
    *target = p < ds->line_len[line] ? s[p] : 0;
}

// Examples index[0..n) of a split (0: train, 1: validation): T context tokens and the
// target of each, into context[n][T] and target[n]. Each is located by a binary search for
// the first line whose example_end exceeds it. A batch's examples are random, so every
// level of a search loads from a part of example_end not in the nearest caches, and each
// load waits on the one before: one search at a time, that made loading a batch 5% of the
// default model's step. So the n searches advance together, a level at a time (every
// search of a split has the same number of levels), and their loads overlap; each level
// is a select, not a branch that random data would mispredict half the time.
#define EXAMPLES_AT_ONCE 16 // n at most this: the callers go through their rows in groups
static void dataset_examples(const Dataset* ds, int split, const long* index, int n, int T, int* context,
                             int* target) {
    int first = split ? ds->n_train : 0, end = split ? ds->n_lines : ds->n_train, line[EXAMPLES_AT_ONCE];
    long examples = split ? ds->n_val_examples : ds->n_train_examples;
    if (n > EXAMPLES_AT_ONCE) fatal("internal: %d examples at once, at most %d", n, EXAMPLES_AT_ONCE);
    for (int j = 0; j < n; j++) {
        if (index[j] < 0 || index[j] >= examples) fatal("internal: example %ld of a split of %ld", index[j], examples);
        line[j] = first; // the search's lines: [line[j], line[j] + w)
    }
    for (int w = end - first; w > 1; w -= w / 2)
        for (int j = 0; j < n; j++) line[j] = ds->example_end[line[j] + w / 2 - 1] > index[j] ? line[j] : line[j] + w / 2;
    for (int j = 0; j < n; j++) {
        long before = line[j] == first ? 0 : ds->example_end[line[j] - 1];
        dataset_line_example(ds, line[j], (int)(index[j] - before), T, context + (long)j * T, target + j);
    }
}

// Rows [lo, hi) of the global training batch of `step`: tokens [hi-lo][T], targets [hi-lo].
static void dataset_batch(const Dataset* ds, uint64_t seed, long step, int lo, int hi, int T, int* tokens,
                          int* targets) {
    for (int b0 = lo; b0 < hi; b0 += EXAMPLES_AT_ONCE) {
        long index[EXAMPLES_AT_ONCE];
        int n = hi - b0 < EXAMPLES_AT_ONCE ? hi - b0 : EXAMPLES_AT_ONCE;
        for (int j = 0; j < n; j++)
            index[j] = (long)(rng_u64(seed, STREAM_BATCH, ((uint64_t)step << 32) + (uint64_t)(b0 + j)) %
                              (uint64_t)ds->n_train_examples);
        dataset_examples(ds, 0, index, n, T, tokens + (long)(b0 - lo) * T, targets + (b0 - lo));
    }
}

// Validation examples [first, first+count) in order: tokens [count][T], targets [count].
static void dataset_val_rows(const Dataset* ds, long first, int count, int T, int* tokens, int* targets) {
    for (int i0 = 0; i0 < count; i0 += EXAMPLES_AT_ONCE) {
        long index[EXAMPLES_AT_ONCE];
        int n = count - i0 < EXAMPLES_AT_ONCE ? count - i0 : EXAMPLES_AT_ONCE;
        for (int j = 0; j < n; j++) index[j] = first + i0 + j;
        dataset_examples(ds, 1, index, n, T, tokens + (long)i0 * T, targets + i0);
    }
}

// ----------------------------------------------------------------------------
// rows as sequences (the GPT)
//
// A row is a whole line: input [0, c1 .. cn, 0, 0 ...] (token 0 starts the name, and pads),
// targets [c1 .. cn, 0, -1 ...] (0 ends the name; -1: no target, the loss ignores it), T
// positions; a line longer than T - 1 characters is cut (its first T characters are its
// targets, without the end). Row b of step s is training line rng(seed, STREAM_BATCH,
// s*2^32 + b) modulo the training lines; the validation rows are its lines in order.

// Rows of sequences of length seq_len (0: rows are examples), with the validation split's
// counts of rows and of targets.
static long dataset_line_targets(const Dataset* ds, int line) {
    return ds->line_len[line] + 1 < ds->seq_len ? ds->line_len[line] + 1 : ds->seq_len;
}
static void dataset_use_rows(Dataset* ds, int seq_len) {
    ds->seq_len = seq_len;
    ds->n_val_rows = seq_len ? ds->n_val : ds->n_val_examples;
    ds->n_val_targets = seq_len ? 0 : ds->n_val_examples;
    for (int i = ds->n_train; seq_len && i < ds->n_lines; i++) ds->n_val_targets += dataset_line_targets(ds, i);
}
static void dataset_line_sequence(const Dataset* ds, int line, int* tokens, int* targets) {
    int T = ds->seq_len, n = ds->line_len[line];
    for (int t = 0; t < T; t++) {
        tokens[t] = t == 0 || t > n ? 0 : ds->tokens[ds->line_start[line] + t - 1];
        targets[t] = t < n ? ds->tokens[ds->line_start[line] + t] : t == n ? 0 : -1;
    }
}
static int dataset_batch_line(const Dataset* ds, uint64_t seed, long step, long b) {
    return (int)(rng_u64(seed, STREAM_BATCH, ((uint64_t)step << 32) + (uint64_t)b) % (uint64_t)ds->n_train);
}
// The number of targets the mean loss of the training batch of `step` (B rows) divides by:
// B examples, or the valid targets of its B lines. Every rank computes it for the whole
// batch from the data alone, whatever share of the rows it holds.
static long dataset_batch_targets(const Dataset* ds, uint64_t seed, long step, int B) {
    if (!ds->seq_len) return B;
    long n = 0;
    for (int b = 0; b < B; b++) n += dataset_line_targets(ds, dataset_batch_line(ds, seed, step, b));
    return n;
}

// Where a pass's rows come from: the training batch of a step, the validation split, or
// contexts the caller gives (sampling; the targets are dummies). Row i of a source is
// example offset + i of it: a data-parallel replica whose rows of the global batch start
// at row lo sets offset = lo, and every pass below it counts rows from 0.
typedef struct {
    const Dataset* ds;
    enum { ROWS_TRAIN, ROWS_VAL, ROWS_GIVEN } kind;
    uint64_t seed;     // ROWS_TRAIN: the batch of step `step`
    long step;
    long offset;
    const int* tokens; // ROWS_GIVEN: the contexts [rows][T]
    int pos;           // ROWS_GIVEN, sequences: the position whose next token is being drawn
} Rows;

// The rows of the global training batch of `step`, from row `offset` on.
static Rows training_rows(const Dataset* ds, uint64_t seed, long step, long offset) {
    return (Rows){.ds = ds, .kind = ROWS_TRAIN, .seed = seed, .step = step, .offset = offset};
}

// Rows [first, first + R) of a source: tokens [R][T], targets [R] (sequences: [R][T]).
static void rows_load(const Rows* src, long first, int R, int T, int* tokens, int* targets) {
    long lo = src->offset + first;
    const Dataset* ds = src->ds;
    if (ds->seq_len) {
        if (T != ds->seq_len) fatal("internal: rows of %d positions, sequences of %d", T, ds->seq_len);
        for (int r = 0; r < R; r++) {
            int* tok = tokens + (long)r * T;
            int* tgt = targets + (long)r * T;
            if (src->kind == ROWS_GIVEN) {
                memcpy(tok, src->tokens + (lo + r) * T, (size_t)T * sizeof(int));
                for (int t = 0; t < T; t++) tgt[t] = -1;
            } else {
                int line = src->kind == ROWS_TRAIN ? dataset_batch_line(ds, src->seed, src->step, lo + r)
                                                   : ds->n_train + (int)(lo + r);
                dataset_line_sequence(ds, line, tok, tgt);
            }
        }
        return;
    }
    if (src->kind == ROWS_TRAIN) dataset_batch(src->ds, src->seed, src->step, (int)lo, (int)lo + R, T, tokens, targets);
    if (src->kind == ROWS_VAL) dataset_val_rows(src->ds, lo, R, T, tokens, targets);
    if (src->kind == ROWS_GIVEN) {
        memcpy(tokens, src->tokens + lo * T, (size_t)R * T * sizeof(int));
        memset(targets, 0, (size_t)R * sizeof(int));
    }
}

#pragma GCC diagnostic pop
#endif // DATA_H
