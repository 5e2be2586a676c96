/*
 * tessera passes: the time of one forward pass by row count, at a given
 * context: a decode pass is 1 row, verifying k drafts is k + 1 rows. What
 * drafting can win depends on the ratio (a pass of k + 1 rows accepted a
 * tokens per pass pays off when it costs less than a decode passes).
 * Each pass runs greedy outputs (as generation does: graphs replayed where
 * the assembly asks for them), then the sequence is cut back, so every
 * sample sees the same context. With --prompt N it times instead a prompt
 * of N tokens into an empty sequence (prefill as `tessera run` does it:
 * chunks, the last row's output only), repeated on one loaded model.
 * With --floor (CPU) each one-row pass is paired with a read of the same
 * bytes by the probe's fastest read loop just before it, and the share of
 * the bandwidth floor is taken pair by pair (issue #4's measure, with the
 * probe at the same moment as the pass it judges).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "model_opts.h"
#include "../../ablation/bench.h"
#include "../../ablation/probe.h"
#include "../host/engine.h"
#include "../host/manifest.h"
#include "../util/clock.h"

static void passes_usage(FILE *f) {
    fprintf(f,
            "usage: tessera passes [ASSEMBLY] [--model PATH] [--context N] [--rows LIST | --prompt N]\n"
            "                      [--reps N] [--profile] [--floor]\n\n"
            "Times forward passes of each row count after a context of N tokens (pseudo-random\n"
            "ids): median and min over the repetitions, and the ratio to one row.\n\n"
            "%s"
            "  --context N        tokens before the timed passes (default 512)\n"
            "  --rows LIST        comma-separated row counts (default 1,2,4,8,9)\n"
            "  --prompt N         instead, time a prompt of N tokens into an empty sequence\n"
            "                     (prefill, the last row's output only): ms and tokens/s\n"
            "  --reps N           timed repetitions of each (default 50, after 5 warm-up)\n"
            "  --profile          after each row count, the time per kind of op of its passes,\n"
            "                     waiting for the device after each op (no CUDA graphs)\n"
            "  --floor            (CPU) one-row passes, each paired with a read of the bytes it\n"
            "                     reads (weights and KV) by the probe's fastest read loop on as\n"
            "                     many threads, just before it: the pass against that floor, pair\n"
            "                     by pair (median, min, max of the shares)\n",
            TSR_MODEL_OPTS_HELP);
}

/* --floor: reps one-row passes of token *id after context tokens of s
 * (five more first, untimed), each just after a read of the bytes it reads
 * (the model's weights a token, the sequence's KV) by the probe's fastest
 * loop on n_threads (0: every core); prints the medians and the shares of
 * the floor pair by pair. 0, or -1 with err set. */
static int floor_pairs(tsr_model *m, tsr_seq *s, const int32_t *id, int context, long reps, int n_threads,
                       tsr_error *err) {
    uint64_t kv_used = 0, kv_cap = 0;
    tsr_model_kv_usage(m, &kv_used, &kv_cap);
    const double wbytes = (double)tsr_model_weight_bytes_per_token(m), bytes = wbytes + (double)kv_used;
    if (n_threads <= 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    tsr_probe_reader *rd = NULL;
    if (tsr_probe_reader_new(n_threads, (size_t)bytes, 0, &rd, err)) return -1;
    double *v = malloc(3 * (size_t)reps * sizeof *v), *pass = NULL, *gbs = NULL;
    int32_t choice;
    int rc = v ? 0 : tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    if (v) pass = v + reps, gbs = v + 2 * reps;
    for (long r = -5; r < reps && !rc; r++) {
        const double g = tsr_probe_reader_pass(rd);
        const double t0 = tsr_now_seconds();
        if (g <= 0) rc = tsr_error_set(err, TSR_ERR_IO, "--floor: the read pass could not start its threads");
        else if (!tsr_seq_forward_greedy(s, id, 1, &choice, 1, err) && !tsr_seq_truncate(s, context, err)) {
            const double t = tsr_now_seconds() - t0;
            if (r >= 0) pass[r] = t, gbs[r] = g, v[r] = bytes / (g * 1e9) / t;
        } else
            rc = -1;
    }
    if (!rc) {
        printf("# %s, context %d, %ld one-row passes, each after a read of its %.3f GB (weights %.3f, KV %.3f) by "
               "the probe's loop (%s) on %d threads\n",
               tsr_engine_name(tsr_model_get_engine(m)), context, reps, bytes / 1e9, wbytes / 1e9,
               (double)kv_used / 1e9, tsr_probe_reader_loop(rd), n_threads);
        const tsr_stat3 sp = tsr_stat3_of(pass, (int)reps), sg = tsr_stat3_of(gbs, (int)reps),
                        sv = tsr_stat3_of(v, (int)reps);
        printf("pass %.3f ms (min %.3f); read %.1f GB/s (min %.1f, max %.1f): floor %.3f ms\n", sp.med * 1e3,
               sp.min * 1e3, sg.med, sg.min, sg.max, bytes / (sg.med * 1e9) * 1e3);
        printf("floor share, pair by pair: median %.1f%% (min %.1f%%, max %.1f%%)\n", sv.med * 100, sv.min * 100,
               sv.max * 100);
    }
    free(v);
    tsr_probe_reader_free(rd);
    return rc ? -1 : 0;
}

int tsr_cmd_passes(int argc, char **argv) {
    if (tsr_cli_wants_help(argc, argv)) {
        passes_usage(stdout);
        return 0;
    }
    tsr_model_opts o = {.progress = 1, .no_tokenizer = 1};
    long context = 512, reps = 50, prompt = 0;
    int rows[32], n_rows = 0, floor = 0;
    const char *rows_arg = "1,2,4,8,9";
    for (int i = 1; i < argc; i++) {
        int r = tsr_cli_model_opt(argc, argv, &i, &o, "passes");
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(argv[i], "--profile")) {
            o.profile = 1;
            continue;
        }
        if (!strcmp(argv[i], "--floor")) {
            floor = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tessera passes: unknown option or missing value: %s\n", argv[i]);
            return 2;
        }
        const char *a = argv[i], *v = argv[++i];
        if (!strcmp(a, "--context")) {
            if (tsr_cli_parse_int("passes", a, v, 1, 1 << 24, &context)) return 2;
        } else if (!strcmp(a, "--prompt")) {
            if (tsr_cli_parse_int("passes", a, v, 1, 1 << 24, &prompt)) return 2;
        } else if (!strcmp(a, "--reps")) {
            if (tsr_cli_parse_int("passes", a, v, 1, 100000, &reps)) return 2;
        } else if (!strcmp(a, "--rows")) {
            rows_arg = v;
        } else {
            fprintf(stderr, "tessera passes: unknown option: %s\n", a);
            return 2;
        }
    }
    if (floor && !strcmp(rows_arg, "1,2,4,8,9")) rows_arg = "1"; /* not given: --floor's one row */
    for (const char *p = rows_arg; *p;) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || n < 1 || n > TSR_GRAPH_MAX_ROWS || n_rows == (int)(sizeof rows / sizeof *rows) ||
            (*end && *end != ',')) {
            fprintf(stderr, "tessera passes: --rows: '%s' is not a list of row counts in 1..%d\n", rows_arg,
                    TSR_GRAPH_MAX_ROWS);
            return 2;
        }
        rows[n_rows++] = (int)n;
        p = *end ? end + 1 : end;
    }
    if (floor && (prompt > 0 || o.profile || n_rows != 1 || rows[0] != 1)) {
        fprintf(stderr, "tessera passes: --floor times one-row passes alone (no --prompt, --profile or --rows "
                        "other than 1)\n");
        return 2;
    }
    tsr_error err;
    tsr_error_clear(&err);
    tsr_model *m = NULL;
    if (tsr_model_load(&o, &m, &err) != TSR_OK) {
        fprintf(stderr, "tessera passes: %s\n", err.msg);
        return 1;
    }
    const int device = tsr_engine_device(tsr_model_get_engine(m));
    if (floor && device != TSR_DEVICE_CPU) {
        fprintf(stderr, "tessera passes: --floor reads with the CPU's loops; this assembly runs on %s "
                        "(tools/device_cuda.sh measures the GPU)\n",
                tsr_device_name(device));
        tsr_model_free(m);
        return 2;
    }
    const int vocab = tsr_model_get_config(m)->vocab;
    const int total = prompt > 0 ? (int)prompt : (int)context + TSR_GRAPH_MAX_ROWS;
    int status = 1;
    tsr_seq *s = NULL;
    int32_t *ids = malloc((size_t)total * sizeof *ids), choices[TSR_GRAPH_MAX_ROWS];
    double *t = malloc((size_t)reps * sizeof *t);
    if (!ids || !t) {
        fprintf(stderr, "tessera passes: out of memory\n");
        goto done;
    }
    uint32_t x = 12345;
    for (int i = 0; i < total; i++) ids[i] = (int32_t)((x = x * 1664525u + 1013904223u) >> 8) % vocab;
    if (total > tsr_model_ctx(m)) {
        fprintf(stderr, "tessera passes: %d tokens (context and rows, or the prompt) exceed the model's %d\n",
                total, tsr_model_ctx(m));
        goto done;
    }
    if (prompt > 0) {
        if (tsr_seq_new(m, total, &s, &err)) goto fail;
        tsr_model_profile_reset(m);
        for (long r = -2; r < reps; r++) {
            double t0 = tsr_now_seconds();
            if (tsr_seq_forward_greedy(s, ids, (int)prompt, choices, 0, &err) || tsr_seq_truncate(s, 0, &err))
                goto fail;
            if (r >= 0) t[r] = tsr_now_seconds() - t0;
        }
        const tsr_stat3 st = tsr_stat3_of(t, (int)reps);
        printf("# %s, prompt of %ld tokens, %ld repetitions (median, min)\n",
               tsr_engine_name(tsr_model_get_engine(m)), prompt, reps);
        printf("prompt %ld: %8.3f ms (min %8.3f), %.1f tok/s (best %.1f)\n", prompt, st.med * 1e3, st.min * 1e3,
               (double)prompt / st.med, (double)prompt / st.min);
        if (o.profile) tsr_model_profile_print(m, stdout);
        status = 0;
        goto done;
    }
    if (tsr_seq_new(m, total, &s, &err) || tsr_seq_forward_greedy(s, ids, (int)context, choices, 0, &err))
        goto fail;
    if (floor) {
        status = floor_pairs(m, s, ids + context, (int)context, reps, o.n_threads, &err);
        if (status < 0) goto fail;
        goto done;
    }
    printf("# %s, context %ld, %ld repetitions (median, min), ratio of medians to 1 row\n",
           tsr_engine_name(tsr_model_get_engine(m)), context, reps);
    double one = 0;
    for (int k = 0; k < n_rows; k++) {
        tsr_model_profile_reset(m);
        for (long r = -5; r < reps; r++) {
            double t0 = tsr_now_seconds();
            if (tsr_seq_forward_greedy(s, ids + context, rows[k], choices, 1, &err) ||
                tsr_seq_truncate(s, (int)context, &err))
                goto fail;
            if (r >= 0) t[r] = tsr_now_seconds() - t0;
        }
        const tsr_stat3 st = tsr_stat3_of(t, (int)reps);
        const double med = st.med;
        if (rows[k] == 1) one = med;
        printf("rows %2d: %8.3f ms (min %8.3f)", rows[k], med * 1e3, st.min * 1e3);
        if (one > 0) printf("  x%.2f", med / one);
        printf("\n");
        if (o.profile) tsr_model_profile_print(m, stdout);
    }
    status = 0;
    goto done;
fail:
    fprintf(stderr, "tessera passes: %s\n", err.msg);
done:
    free(ids);
    free(t);
    tsr_seq_free(s);
    tsr_model_free(m);
    return status;
}
