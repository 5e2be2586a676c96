/*
 * tok_test_util.h - helpers shared by the tokenizer tests: file reading,
 * the test-data folders and llama.cpp's vector files.
 */
#ifndef TOK_TEST_UTIL_H
#define TOK_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static inline char *tt_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[n] = '\0';
        if (len) *len = (size_t)n;
    }
    return b;
}

static inline int tt_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* TESSERA_SOURCE_DIR (or "."): path of a file in the source tree. */
static inline const char *tt_src(const char *rel, char *buf, size_t size) {
    const char *d = getenv("TESSERA_SOURCE_DIR");
    snprintf(buf, size, "%s/%s", d && d[0] ? d : ".", rel);
    return buf;
}

/* TESSERA_SHARED_DIR/rel, or NULL (with a message) when it is absent. */
static inline const char *tt_shared(const char *rel, char *buf, size_t size) {
    const char *d = getenv("TESSERA_SHARED_DIR");
    if (!d || !d[0]) {
        printf("# skip: TESSERA_SHARED_DIR is not set, %s is not available\n", rel);
        return NULL;
    }
    snprintf(buf, size, "%s/%s", d, rel);
    if (!tt_exists(buf)) {
        printf("# skip: %s is absent\n", buf);
        return NULL;
    }
    return buf;
}

/* llama.cpp's vectors: X.inp holds strings each followed by
 * "\n__ggml_vocab_test__\n"; X.out one line of ids per string. */
typedef struct tt_vectors {
    int n;
    char *inp, *out;
    const char *str[128];
    size_t len[128];
    int32_t *ids[128];
    int n_ids[128];
} tt_vectors;

static inline void tt_vectors_free(tt_vectors *v) {
    for (int i = 0; i < v->n; i++) free(v->ids[i]);
    free(v->inp);
    free(v->out);
}

static inline int tt_vectors_load(tt_vectors *v, const char *inp_path, const char *out_path) {
    memset(v, 0, sizeof *v);
    size_t n;
    v->inp = tt_read_file(inp_path, &n);
    v->out = tt_read_file(out_path, NULL);
    if (!v->inp || !v->out) return -1;
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t sl = strlen(sep);
    char *p = v->inp, *end = v->inp + n;
    while (p < end && v->n < 128) {
        char *q = strstr(p, sep);
        if (!q) break;
        *q = '\0';
        v->str[v->n] = p;
        v->len[v->n] = (size_t)(q - p);
        v->n++;
        p = q + sl;
    }
    char *line = v->out;
    for (int i = 0; i < v->n; i++) {
        if (!line) return -1;
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        int cap = 16;
        v->ids[i] = malloc(cap * sizeof(int32_t));
        char *s = line, *e;
        for (;;) {
            long x = strtol(s, &e, 10);
            if (e == s) break;
            if (v->n_ids[i] == cap) v->ids[i] = realloc(v->ids[i], (cap *= 2) * sizeof(int32_t));
            v->ids[i][v->n_ids[i]++] = (int32_t)x;
            s = e;
        }
        line = nl ? nl + 1 : NULL;
    }
    return 0;
}

#endif
