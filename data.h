/*
 * data.h: a text file of one item per line -> vocabulary -> examples -> batches.
 *
 * Vocabulary: the file is UTF-8 text, and every Unicode code point in it is a token: token 0
 * is the boundary (shown as '.'), then every code point that occurs in the file, in
 * increasing order. names.txt gives 27 tokens: '.', 'a' ... 'z'; a list of names in Latin,
 * Greek, Chinese and Arabic script gives one token per distinct letter or character, and the
 * names generated print as UTF-8. A vocabulary is at most DATA_MAX_VOCAB tokens (below).
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
 * Input checks (each message names the file, and the line and column where there is one):
 * a missing or unreadable file, anything but a regular file (a folder, a named pipe, a
 * device such as /dev/zero: every rank reads the file, so it must read the same bytes, and
 * a pipe with no writer would wait forever), a file larger than DATA_MAX_BYTES, an empty
 * file, no usable lines, fewer lines than a split needs, invalid UTF-8 (a stray or missing
 * continuation byte, an overlong form, a UTF-16 surrogate, a code point above U+10FFFF), NUL
 * and other control characters, lines longer than the limit (--max-line, in bytes), more
 * distinct characters than the vocabulary's cap. CRLF line endings, blank lines and a
 * leading byte-order mark are accepted.
 */
#ifndef DATA_H
#define DATA_H

// A header of functions, each program using some: unused ones are not a warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "util.h"

#include <sys/stat.h>

#define DATA_DEFAULT_MAX_LINE 1024
#define DATA_MIN_LINES 10 // a 90/10 split of fewer lines leaves validation empty
// The file, and then its tokens (4 bytes a character), are held in memory: a list of names
// is a few megabytes at most, and this cap turns a wrong --data into a message, not a
// process that fills the memory.
#define DATA_MAX_BYTES (1L << 30)
// The vocabulary's cap: 65,536 tokens, the size of Unicode's Basic Multilingual Plane,
// which holds the letters of every script in use and the common Chinese, Japanese and
// Korean characters (a list of Chinese names uses a few thousand). A file with more
// distinct characters is not a list of names, and the model would not fit it anyway: the
// output layer's activations are rows x V floats, 64 MiB for one validation pass of 256
// rows at this cap, and its weights H x V.
#define DATA_MAX_VOCAB 65536
#define UNICODE_PAGES (0x110000 >> 12) // code points U+0000..U+10FFFF in pages of 4096

typedef struct {
    const char* path;
    int vocab;                      // number of tokens, boundary included
    uint64_t checksum;              // of the file's bytes (checkpoints record it)
    uint32_t* code_point;           // [vocab] the code point each token stands for (token 0: '.')
    int32_t* token_page[UNICODE_PAGES]; // code point cp -> token token_page[cp >> 12][cp & 4095], or -1;
                                    // pages without a character of the file are NULL (dataset_token)
    int n_lines, n_train, n_val;    // lines [0, n_train) train, [n_train, n_lines) validate
    int max_len;                    // longest line, in characters
    long max_len_line;              // its line number in the file (the first, if several)
    int32_t* tokens;                // every line's tokens, concatenated, in split order
    long* line_start;               // [n_lines] offset of each line in tokens
    int* line_len;                  // [n_lines], in characters
    long* example_end;              // [n_lines] examples in lines 0..i of its split (prefix sums)
    long n_train_examples, n_val_examples;
    // What a row is (dataset_use_rows): an example (the MLP; seq_len 0), or a whole line as a
    // sequence of seq_len positions (the GPT); and the validation split's rows and targets.
    int seq_len;
    long n_val_rows, n_val_targets;
} Dataset;

// ----------------------------------------------------------------------------
// files, and UTF-8


// Opens an input (the data, a checkpoint, a log) without ever waiting: opening a named pipe
// that no process writes blocks forever, so the path is looked at first, and anything but a
// regular file is refused, naming what it is (every rank of a job reads the same file, whole,
// so it must be one that gives the same bytes each time, and ends). `what` names the input.
static FILE* open_input(const char* path, const char* what) {
    struct stat st;
    if (stat(path, &st) != 0) fatal("cannot open %s '%s': %s", what, path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fatal("%s '%s' is %s, not a regular file: give a file", what, path, file_kind(st.st_mode));
    FILE* f = fopen(path, "rb");
    if (!f) fatal("cannot open %s '%s': %s", what, path, strerror(errno));
    return f;
}

// The UTF-8 bytes of code point cp (at most U+10FFFF) into out; returns how many (1 to 4).
static int utf8_encode(uint32_t cp, char* out) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | (cp >> 6 & 63)), out[2] = (char)(0x80 | (cp & 63)), 3;
    out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | (cp >> 12 & 63));
    out[2] = (char)(0x80 | (cp >> 6 & 63)), out[3] = (char)(0x80 | (cp & 63));
    return 4;
}

// Decodes the character at s[0..n) (n >= 1): returns its length in bytes and sets *cp, or
// returns 0 for invalid UTF-8 and sets *why. UTF-8 (RFC 3629) allows exactly one form per
// code point: the shortest, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF.
static int utf8_decode(const unsigned char* s, size_t n, uint32_t* cp, const char** why) {
    unsigned char c = s[0];
    if (c < 0x80) return *cp = c, 1;
    int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (len == 0) return *why = "a continuation byte with no leading byte before it", 0;
    if (c >= 0xF8) return *why = "a byte that never occurs in UTF-8", 0;
    uint32_t v = c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n || (s[i] & 0xC0) != 0x80) return *why = "a sequence cut short (too few continuation bytes)", 0;
        v = v << 6 | (s[i] & 63);
    }
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < least[len]) return *why = "an overlong encoding (a longer form than the character needs)", 0;
    if (v >= 0xD800 && v <= 0xDFFF) return *why = "a UTF-16 surrogate, which UTF-8 never encodes", 0;
    if (v > 0x10FFFF) return *why = "a code point above U+10FFFF, the last of Unicode", 0;
    return *cp = v, len;
}

// The token of code point cp, or -1 if the file has no such character: two lookups, whatever
// the vocabulary's size.
static int dataset_token(const Dataset* ds, uint32_t cp) {
    const int32_t* page = cp < 0x110000 ? ds->token_page[cp >> 12] : NULL;
    return page ? page[cp & 4095] : -1;
}

// A name as token ids s[0], s[1], ... up to a 0 (at most n), written to f as UTF-8.
static void dataset_write_name(const Dataset* ds, const int* s, int n, FILE* f) {
    char bytes[4];
    for (int p = 0; p < n && s[p] != 0; p++) fwrite(bytes, 1, (size_t)utf8_encode(ds->code_point[s[p]], bytes), f);
}

// ----------------------------------------------------------------------------
// loading

// Reads and checks the file; any problem is a fatal error naming the file and line.
static void dataset_load(Dataset* ds, const char* path, int max_line, uint64_t seed) {
    memset(ds, 0, sizeof(*ds));
    ds->path = path;
    FILE* f = open_input(path, "data file");
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) fatal("cannot read data file '%s': not a regular file", path);
    if (st.st_size > DATA_MAX_BYTES)
        fatal("data file '%s' is %lld bytes, more than the %ld this project reads (it holds the file and its tokens "
              "in memory): is it the right file?", path, (long long)st.st_size, DATA_MAX_BYTES);
    // read to the end, but never past the cap (a file that grows while it is read)
    size_t cap = (size_t)st.st_size + 1, size = 0;
    unsigned char* text = mallocCheck(cap);
    for (;;) {
        if (size == cap) {
            if (cap > (size_t)DATA_MAX_BYTES) fatal("data file '%s' grew past %ld bytes while it was read", path, DATA_MAX_BYTES);
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

    // Pass 1: find the lines, decode and check their characters and lengths, mark the
    // characters present (a bit per code point).
    uint64_t* present = callocCheck(0x110000 / 64, sizeof(uint64_t));
    long n_alloc = 1024, n = 0, distinct = 0;
    long* start = mallocCheck(n_alloc * sizeof(long));
    int* len = mallocCheck(n_alloc * sizeof(int));
    long line_no = 0, total = 0; // total: characters in all lines
    for (size_t pos = bom; pos < size;) {
        line_no++;
        const unsigned char* nl = memchr(text + pos, '\n', size - pos);
        size_t end = nl ? (size_t)(nl - text) : size, stop = end;
        if (stop > pos && text[stop - 1] == '\r') stop--; // CRLF
        if ((long)(stop - pos) > max_line)
            fatal("%s:%ld: line is %ld bytes long, more than the limit of %d (raise it with --max-line)", path, line_no,
                  (long)(stop - pos), max_line);
        long column = 0;
        for (size_t i = pos; i < stop;) {
            uint32_t cp;
            const char* why = NULL;
            int k = utf8_decode(text + i, stop - i, &cp, &why);
            column++;
            if (k == 0) {
                char bytes[16] = "";
                for (size_t j = i; j < stop && j < i + 4; j++)
                    snprintf(bytes + strlen(bytes), sizeof bytes - strlen(bytes), "%s%02x", j > i ? " " : "", text[j]);
                fatal("%s:%ld: invalid UTF-8 at column %ld (bytes %s): %s; the file must be UTF-8 text (convert it "
                      "with iconv -f ENCODING -t UTF-8)", path, line_no, column, bytes, why);
            }
            if (cp == 0) fatal("%s:%ld: NUL byte at column %ld (is this a binary file?)", path, line_no, column);
            if (cp < 0x20 || cp == 0x7f)
                fatal("%s:%ld: control byte 0x%02x at column %ld; lines must be plain text", path, line_no, cp, column);
            if (cp >= 0x80 && cp < 0xA0)
                fatal("%s:%ld: control character U+%04X at column %ld; lines must be plain text", path, line_no, cp, column);
            if (!(present[cp >> 6] >> (cp & 63) & 1)) {
                present[cp >> 6] |= 1ull << (cp & 63);
                if (++distinct > DATA_MAX_VOCAB - 1)
                    fatal("%s:%ld: the file has more than %d distinct characters; a vocabulary is at most %d tokens "
                          "(data.h says why): is it a list of names?", path, line_no, DATA_MAX_VOCAB - 1, DATA_MAX_VOCAB);
            }
            i += (size_t)k;
        }
        if (column > 0) { // blank lines are skipped
            if (n == n_alloc) {
                n_alloc *= 2;
                start = reallocCheck(start, n_alloc * sizeof(long));
                len = reallocCheck(len, n_alloc * sizeof(int));
            }
            start[n] = (long)pos;
            len[n] = (int)column;
            if (column > ds->max_len) ds->max_len = (int)column, ds->max_len_line = line_no;
            total += column;
            n++;
        }
        pos = end + 1;
    }
    if (n == 0) fatal("data file '%s' has no usable lines (only blank lines)", path);
    if (n < DATA_MIN_LINES)
        fatal("data file '%s' has %ld usable lines; the 90/10 train/validation split needs at least %d",
              path, n, DATA_MIN_LINES);
    if (n > 2147483647L / 2) fatal("data file '%s' has too many lines (%ld)", path, n);

    // The vocabulary: the boundary, then the code points present in increasing order, and
    // the lookup from code point to token, a page of 4096 entries wherever the file has one.
    ds->code_point = mallocCheck((size_t)(distinct + 1) * sizeof(uint32_t));
    ds->vocab = 1;
    ds->code_point[0] = '.';
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (!present[cp >> 6]) {
            cp |= 63; // a word without a character: skip it
            continue;
        }
        if (!(present[cp >> 6] >> (cp & 63) & 1)) continue;
        int32_t** page = &ds->token_page[cp >> 12];
        if (!*page) {
            *page = mallocCheck(4096 * sizeof(int32_t));
            for (int i = 0; i < 4096; i++) (*page)[i] = -1;
        }
        (*page)[cp & 4095] = ds->vocab;
        ds->code_point[ds->vocab++] = cp;
    }
    free(present);

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

    // Pass 3: store the tokens in split order with each split's example counts (the lines
    // were checked in pass 1: each character decodes, and has a token).
    ds->tokens = mallocCheck((size_t)total * sizeof(int32_t));
    ds->line_start = mallocCheck(n * sizeof(long));
    ds->line_len = mallocCheck(n * sizeof(int));
    ds->example_end = mallocCheck(n * sizeof(long));
    long off = 0, examples = 0;
    for (long i = 0; i < n; i++) {
        if (i == ds->n_train) {
            ds->n_train_examples = examples;
            examples = 0;
        }
        size_t src = (size_t)start[order[i]];
        int L = len[order[i]];
        ds->line_start[i] = off;
        ds->line_len[i] = L;
        for (int k = 0; k < L; k++) {
            uint32_t cp = 0;
            const char* why;
            src += (size_t)utf8_decode(text + src, size - src, &cp, &why);
            ds->tokens[off + k] = dataset_token(ds, cp);
        }
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
    free(ds->code_point);
    for (int p = 0; p < UNICODE_PAGES; p++) free(ds->token_page[p]);
    free(ds->tokens);
    free(ds->line_start);
    free(ds->line_len);
    free(ds->example_end);
}

// Example p of line `line`: T context tokens and the target. Only the line's own tokens are
// read, in loops whose bounds say so: a loop of `k >= 0 ? s[k] : 0` was vectorized by GCC
// (-O3 -march=native) into whole-vector loads from s[p - T] on, which for the first line of
// the array reached the page below it (since tokens are 4 bytes, not 1) and crashed.
static void dataset_line_example(const Dataset* ds, int line, int p, int T, int* context, int* target) {
    const int32_t* s = ds->tokens + ds->line_start[line];
    int pad = T > p ? T - p : 0; // context positions before the line's start: the boundary token
    for (int t = 0; t < pad; t++) context[t] = 0;
    for (int t = pad; t < T; t++) context[t] = s[p - T + t];
    *target = 0;
    if (p < ds->line_len[line]) *target = s[p];
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
    const int32_t* s = ds->tokens + ds->line_start[line];
    int in = n < T - 1 ? n : T - 1, out = n < T ? n : T; // the line's characters as inputs, as targets
    tokens[0] = 0;
    for (int t = 1; t <= in; t++) tokens[t] = s[t - 1]; // (only the line's tokens are read: see above)
    for (int t = in + 1; t < T; t++) tokens[t] = 0;
    for (int t = 0; t < out; t++) targets[t] = s[t];
    for (int t = out; t < T; t++) targets[t] = t == n ? 0 : -1;
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
