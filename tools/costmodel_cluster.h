/*
 * tools/costmodel_cluster.h: the cluster files of tools/costmodel.c (cluster/NAME.txt), read
 * strictly: every line is a comment, blank, or `key value`; every key is known and given
 * once; every number is a whole finite decimal number inside its range. A bad file is
 * refused with its line and key named. Also the strict number parsing of costmodel's flags.
 *
 *   # a comment                                 name H100 SXM, 2048 nodes x 8
 *   nodes 2048                                  flops 989e12
 *   hbm_gbytes_per_s 3350                       sms 132
 *
 * cluster_parse works on text in memory and returns its error instead of ending the process,
 * so that tests/fuzz.c can drive it with any bytes; cluster_read is the programs' door.
 */
#ifndef COSTMODEL_CLUSTER_H
#define COSTMODEL_CLUSTER_H

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    char name[128];
    int nodes, per_node;
    double flops, efficiency;         // per device: peak dense BF16 FLOP/s, and the fraction large matrix products reach
    double attention_efficiency;      // the fraction attention's kernels reach (not given: efficiency)
    double fp8_flops, fp8_efficiency; // the same for FP8 (0: not given)
    double memory;                    // bytes per device
    double alpha_intra, beta_intra;   // inside a node: seconds per message, bytes per second each way
    double alpha_inter, beta_inter;   // between nodes
    double hbm;                       // bytes per second between a device and its memory (HBM)
    int sms;                          // streaming multiprocessors per device (0: not given)
    double attention_half_seq;        // the sequence at which attention reaches half its rate (0: one rate)
    double collective_latency;        // seconds a collective costs before its steps (NCCL's base latency)
    int nics;                         // network interfaces of a node, shared by its devices (beta_inter: one's)
    double sustained;                 // the fraction of the burst rates a device holds at its power limit (1: not given)
} Cluster;

// s as a number: the whole text a finite decimal number (digits, '.', an exponent: no
// hexadecimal, inf or nan) from lo to hi (above lo when lo_open), a whole one when asked
// (1e12 is one: the ranges print so). NULL, or the reason, in err, naming `what`.
static const char* cm_number(const char* what, const char* s, double lo, int lo_open, double hi, int integer,
                             double* out, char* err, size_t n) {
    char* end;
    errno = 0;
    double v = strtod(s, &end);
    int decimal = s[0] && s[strspn(s, "0123456789.eE+-")] == 0;
    if (!decimal || errno || end == s || *end || !isfinite(v) || v < lo || (lo_open && v == lo) || v > hi ||
        (integer && v != floor(v))) {
        snprintf(err, n, "%s must be %s %s %g and at most %g, got '%.40s'", what, integer ? "an integer" : "a decimal number",
                 lo_open ? "above" : "from", lo, hi, s);
        return err;
    }
    *out = v;
    return NULL;
}

// The keys of a cluster file, each with its range; `name` is the rest of its line. An efficiency
// below 0.1% is no device's (a file's 1e-30 gave a step of 1e22 s), so the ranges start there.
typedef struct {
    const char* key;
    double lo;
    int lo_open;
    double hi;
    int integer, required;
} ClusterKey;
static const ClusterKey cluster_keys[] = {
    {"name", 0, 0, 0, 0, 1},
    {"nodes", 1, 0, 1e6, 1, 1},
    {"devices_per_node", 1, 0, 1024, 1, 1},
    {"flops", 0, 1, 1e18, 0, 1},
    {"efficiency", 0.001, 0, 1, 0, 1},
    {"attention_efficiency", 0.001, 0, 1, 0, 0},
    {"fp8_flops", 0, 1, 1e18, 0, 0},
    {"fp8_efficiency", 0.001, 0, 1, 0, 0},
    {"memory_gb", 0, 1, 1e6, 0, 1},
    {"intra_latency_us", 0, 0, 1e6, 0, 1},
    {"intra_gbytes_per_s", 0, 1, 1e6, 0, 1},
    {"inter_latency_us", 0, 0, 1e6, 0, 1},
    {"inter_gbytes_per_s", 0, 1, 1e6, 0, 1},
    {"hbm_gbytes_per_s", 0, 1, 1e6, 0, 1},
    {"sms", 1, 0, 100000, 1, 0},
    {"attention_half_seq", 0, 0, 1e7, 0, 0},
    {"collective_latency_us", 0, 0, 1e6, 0, 0},
    {"nics_per_node", 1, 0, 1024, 1, 0},
    {"sustained_fraction", 0.001, 0, 1, 0, 0},
};
enum { CLUSTER_KEYS = sizeof cluster_keys / sizeof cluster_keys[0] };
#define CLUSTER_MAX_DEVICES 1048576

// text[0..n) as a cluster file called `path` (for messages). NULL, or the error in err.
static const char* cluster_parse(Cluster* c, const char* text, size_t n, const char* path, char* err, size_t errn) {
    memset(c, 0, sizeof *c);
    int seen[CLUSTER_KEYS] = {0};
    double v[CLUSTER_KEYS] = {0};
    char line[512];
    int number = 0;
    size_t at = 0;
    if (n >= 3 && !memcmp(text, "\xef\xbb\xbf", 3)) at = 3; // a UTF-8 byte-order mark, as some editors save
    while (at < n) {
        size_t len = 0;
        number++;
        while (at + len < n && text[at + len] != '\n') len++;
        const char* start = text + at;
        at += len + 1;
        if (len > 0 && start[len - 1] == '\r') len--; // a file saved on Windows
        if (memchr(start, 0, len)) {
            snprintf(err, errn, "%s:%d: the line holds a NUL byte: not a text file", path, number);
            return err;
        }
        if (len >= sizeof line) {
            snprintf(err, errn, "%s:%d: the line is longer than %zu characters", path, number, sizeof line - 1);
            return err;
        }
        memcpy(line, start, len);
        line[len] = 0;
        char* p = line + strspn(line, " \t");
        if (*p == '#' || *p == 0) continue;
        char* key = p;
        p += strcspn(p, " \t");
        if (*p) *p++ = 0;
        p += strspn(p, " \t");
        char* value = p; // trailing blanks are not part of it
        for (char* e = value + strlen(value); e > value && (e[-1] == ' ' || e[-1] == '\t');) *--e = 0;
        int k = 0;
        while (k < CLUSTER_KEYS && strcmp(key, cluster_keys[k].key)) k++;
        if (k == CLUSTER_KEYS) {
            int w = snprintf(err, errn, "%s:%d: unknown key '%.40s' (the keys:", path, number, key);
            for (int j = 0; j < CLUSTER_KEYS && w > 0 && (size_t)w < errn; j++)
                w += snprintf(err + w, errn - w, " %s", cluster_keys[j].key);
            if (w > 0 && (size_t)w < errn) snprintf(err + w, errn - w, ")");
            return err;
        }
        if (seen[k]) {
            snprintf(err, errn, "%s:%d: %s is given twice (first on line %d)", path, number, key, seen[k]);
            return err;
        }
        seen[k] = number;
        if (!*value) {
            snprintf(err, errn, "%s:%d: %s has no value", path, number, key);
            return err;
        }
        if (k == 0) {
            if (strlen(value) >= sizeof c->name) {
                snprintf(err, errn, "%s:%d: name is longer than %zu characters", path, number, sizeof c->name - 1);
                return err;
            }
            snprintf(c->name, sizeof c->name, "%s", value);
            continue;
        }
        if (strpbrk(value, " \t")) {
            snprintf(err, errn, "%s:%d: %s takes one value, got '%.60s'", path, number, key, value);
            return err;
        }
        char what[96], why[256];
        snprintf(what, sizeof what, "%s", key);
        if (cm_number(what, value, cluster_keys[k].lo, cluster_keys[k].lo_open, cluster_keys[k].hi,
                      cluster_keys[k].integer, &v[k], why, sizeof why)) {
            snprintf(err, errn, "%s:%d: %s", path, number, why);
            return err;
        }
    }
    char missing[256] = "";
    for (int k = 0; k < CLUSTER_KEYS; k++)
        if (cluster_keys[k].required && !seen[k]) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %s", cluster_keys[k].key);
    if (missing[0]) {
        snprintf(err, errn, "%s: missing key(s):%s", path, missing);
        return err;
    }
    if (!seen[6] != !seen[7]) {
        snprintf(err, errn, "%s: fp8_flops and fp8_efficiency go together: give both or neither", path);
        return err;
    }
    c->nodes = (int)v[1], c->per_node = (int)v[2], c->flops = v[3], c->efficiency = v[4];
    c->attention_efficiency = seen[5] ? v[5] : v[4];
    c->fp8_flops = v[6], c->fp8_efficiency = v[7], c->memory = v[8] * 1e9;
    c->alpha_intra = v[9] * 1e-6, c->beta_intra = v[10] * 1e9, c->alpha_inter = v[11] * 1e-6, c->beta_inter = v[12] * 1e9;
    c->hbm = v[13] * 1e9, c->sms = (int)v[14];
    c->attention_half_seq = v[15], c->collective_latency = v[16] * 1e-6, c->nics = seen[17] ? (int)v[17] : c->per_node;
    c->sustained = seen[18] ? v[18] : 1;
    if ((double)c->nodes * c->per_node > CLUSTER_MAX_DEVICES) {
        snprintf(err, errn, "%s: %d nodes x %d devices is more than %d devices", path, c->nodes, c->per_node,
                 CLUSTER_MAX_DEVICES);
        return err;
    }
    return NULL;
}

// The cluster file at path, or the process ends with the reason (a regular file of at most
// 1 MB: a named pipe or a device would block or never end).
static Cluster cluster_read(const char* path) {
    static char text[1 << 20];
    struct stat st;
    if (stat(path, &st) != 0) fatal("cannot open cluster file '%s': %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fatal("cluster file '%s' is not a regular file", path);
    if (st.st_size >= (off_t)sizeof text) fatal("cluster file '%s' is larger than 1 MB: not a cluster file", path);
    FILE* f = fopen(path, "rb");
    if (!f) fatal("cannot open cluster file '%s': %s", path, strerror(errno));
    size_t n = fread(text, 1, sizeof text, f);
    int bad = ferror(f);
    fclose(f);
    if (bad) fatal("cannot read cluster file '%s'", path);
    if (n >= sizeof text) fatal("cluster file '%s' is larger than 1 MB: not a cluster file", path);
    Cluster c;
    char err[512];
    if (cluster_parse(&c, text, n, path, err, sizeof err)) fatal("%s", err);
    return c;
}

#endif // COSTMODEL_CLUSTER_H
