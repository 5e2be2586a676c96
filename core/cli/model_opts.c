#include "model_opts.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tsr_cli_parse_int(const char *cmd, const char *opt, const char *s, long min, long max, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max) {
        fprintf(stderr, "tessera %s: %s expects an integer in [%ld, %ld], got '%s'\n", cmd, opt, min,
                max, s);
        return -1;
    }
    *out = v;
    return 0;
}

int tsr_cli_parse_float(const char *cmd, const char *opt, const char *s, double min, double max,
                        double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < min || v > max) {
        fprintf(stderr, "tessera %s: %s expects a number in [%g, %g], got '%s'\n", cmd, opt, min, max, s);
        return -1;
    }
    *out = v;
    return 0;
}

int tsr_cli_model_opt(int argc, char **argv, int *i, tsr_model_opts *o, const char *cmd) {
    const char *a = argv[*i];
    const char *names[] = {"--model", "--tokenizer", "--threads", "--catalog", "--ctx"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        if (strcmp(a, names[k])) continue;
        if (*i + 1 >= argc) {
            fprintf(stderr, "tessera %s: %s needs a value\n", cmd, a);
            return -1;
        }
        const char *v = argv[++*i];
        long n;
        switch (k) {
        case 0: o->model_path = v; break;
        case 1: o->tokenizer_path = v; break;
        case 2:
            if (tsr_cli_parse_int(cmd, a, v, 1, 1024, &n)) return -1;
            o->n_threads = (int)n;
            break;
        case 3: o->catalog_dir = v; break;
        case 4:
            if (tsr_cli_parse_int(cmd, a, v, 1, 1 << 24, &n)) return -1;
            o->max_ctx = (int)n;
            break;
        }
        return 1;
    }
    if (a[0] != '-') {
        if (o->assembly_path) {
            fprintf(stderr, "tessera %s: unexpected argument '%s'\n", cmd, a);
            return -1;
        }
        o->assembly_path = a;
        return 1;
    }
    return 0;
}
