/* tessera score: float32 logits of every position of a token sequence. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../format/safetensors.h"
#include "commands.h"
#include "model_opts.h"

static void score_usage(FILE *f) {
    fprintf(f,
            "usage: tessera score [ASSEMBLY] [--model PATH] --tokens 1,2,3|@FILE --out FILE.safetensors\n\n"
            "Runs the token ids through the engine and writes tensor \"logits\", float32\n"
            "[T, vocab], one row per position (and \"input_ids\", int32 [T]).\n\n%s"
            "  --tokens LIST      comma- or space-separated ids, or @FILE holding them\n"
            "  --out FILE         the .safetensors file to write\n",
            TSR_MODEL_OPTS_HELP);
}

/* Parse ids from text: integers separated by commas or white space. */
static int parse_ids(const char *s, int32_t **out, int *n) {
    int cap = 64, k = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) return -1;
    while (*s) {
        while (*s == ',' || isspace((unsigned char)*s)) s++;
        if (!*s) break;
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > 0x7fffffff) {
            fprintf(stderr, "tessera score: --tokens: '%.20s' is not a token id\n", s);
            free(ids);
            return -1;
        }
        if (k == cap) {
            int32_t *g = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!g) {
                free(ids);
                return -1;
            }
            ids = g;
        }
        ids[k++] = (int32_t)v;
        s = end;
    }
    *out = ids;
    *n = k;
    return 0;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (n + 1 == cap) {
            char *g = realloc(buf, cap *= 2);
            if (!g) {
                free(buf);
                buf = NULL;
            }
            buf = g;
        }
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    return buf;
}

int tsr_cmd_score(int argc, char **argv) {
    if (tsr_cli_wants_help(argc, argv)) {
        score_usage(stdout);
        return 0;
    }
    tsr_model_opts o = {.progress = 1, .no_tokenizer = 1};
    const char *tokens = NULL, *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        int r = tsr_cli_model_opt(argc, argv, &i, &o, "score");
        if (r < 0) return 2;
        if (r > 0) continue;
        if (i + 1 < argc && !strcmp(argv[i], "--tokens")) tokens = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--out")) out_path = argv[++i];
        else {
            fprintf(stderr, "tessera score: unknown option or missing value: %s\n", argv[i]);
            return 2;
        }
    }
    if (!tokens || !out_path) {
        score_usage(stderr);
        return 2;
    }
    char *text = NULL;
    if (tokens[0] == '@') {
        text = read_file(tokens + 1);
        if (!text) {
            fprintf(stderr, "tessera score: cannot read %s: %s\n", tokens + 1, strerror(errno));
            return 2;
        }
    }
    int32_t *ids = NULL;
    int n = 0;
    int bad = parse_ids(text ? text : tokens, &ids, &n);
    free(text);
    if (bad) return 2;
    if (n == 0) {
        fprintf(stderr, "tessera score: --tokens holds no ids\n");
        free(ids);
        return 2;
    }
    tsr_error err;
    tsr_error_clear(&err);
    char msg[2048];
    tsr_model *m = NULL;
    tsr_seq *s = NULL;
    float *logits = NULL;
    int status = 2;
    if (tsr_model_load(&o, &m, &err) != TSR_OK) goto fail;
    const int vocab = tsr_model_get_config(m)->vocab;
    logits = malloc((size_t)n * vocab * sizeof *logits);
    if (!logits) {
        tsr_error_set(&err, TSR_ERR_NOMEM, "out of memory for %d x %d logits", n, vocab);
        goto fail;
    }
    if (tsr_seq_new(m, n, &s, &err) != TSR_OK || tsr_seq_forward(s, ids, n, logits, 1, &err) != TSR_OK)
        goto fail;
    tsr_tensor t[2] = {
        {.name = "input_ids", .dtype = TSR_DTYPE_I32, .n_dims = 1, .shape = {n}, .data = ids,
         .nbytes = (uint64_t)n * sizeof *ids},
        {.name = "logits", .dtype = TSR_DTYPE_F32, .n_dims = 2, .shape = {n, vocab}, .data = logits,
         .nbytes = (uint64_t)n * vocab * sizeof *logits},
    };
    const char *meta[] = {"producer", "tessera score", NULL};
    if (tsr_safetensors_write(out_path, t, 2, meta, &err) != TSR_OK) goto fail;
    status = 0;
    goto done;
fail:
    fprintf(stderr, "tessera score: %s\n", tsr_error_format(&err, msg, sizeof msg));
    status = err.code == TSR_ERR_NOMEM || err.code == TSR_ERR_IO ? 1 : 2;
done:
    tsr_seq_free(s);
    tsr_model_free(m);
    free(logits);
    free(ids);
    return status;
}
