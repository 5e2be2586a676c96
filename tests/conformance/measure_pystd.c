/*
 * measure_pystd - the drafter's and the expert cache's figures on real
 * weights: greedy generation over the prompts of a pystd eval.json through
 * an assembly, printing the mean accepted tokens per verify pass and the
 * expert cache's counters (read through core/host's slot calls).
 *
 *   measure_pystd --model DIR --assembly FILE [--eval eval.json] [-n TOKENS]
 *                 [--prompts N] [--threads N] [--compare FILE]
 *
 * --compare runs every prompt through a second assembly as well and checks
 * that both produce the same greedy tokens (an exact drafter or expert cache
 * must not change them); a difference is reported and exits 1.
 *
 * Not a test: it needs ../shared data; CONTRIBUTING.md and the plugins'
 * READMEs say how its numbers were taken.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/host/slot_calls.h"
#include "core/runtime/runtime.h"

int main(int argc, char **argv) {
    const char *model = NULL, *assembly = NULL, *eval = NULL, *compare = NULL;
    int n_gen = 64, max_prompts = 1 << 30, threads = 2;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) goto usage;
        if (!strcmp(argv[i], "--model")) model = argv[++i];
        else if (!strcmp(argv[i], "--assembly")) assembly = argv[++i];
        else if (!strcmp(argv[i], "--eval")) eval = argv[++i];
        else if (!strcmp(argv[i], "-n")) n_gen = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompts")) max_prompts = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--compare")) compare = argv[++i];
        else goto usage;
    }
    if (!model || !assembly || n_gen < 1) goto usage;
    char evbuf[1024];
    if (!eval) {
        snprintf(evbuf, sizeof evbuf, "%s/../eval.json", model);
        eval = evbuf;
    }
    json_error_t jerr;
    json_t *root = json_load_file(eval, 0, &jerr);
    json_t *prompts = root ? json_object_get(root, "prompts") : NULL;
    if (!json_is_array(prompts)) {
        fprintf(stderr, "measure_pystd: %s:%d:%d: no 'prompts' list (%s)\n", eval, jerr.line, jerr.column, jerr.text);
        json_decref(root);
        return 2;
    }
    tsr_model_opts o = {.model_path = model, .assembly_path = assembly, .n_threads = threads, .no_tokenizer = 1};
    tsr_model *m = NULL;
    tsr_error err;
    tsr_error_clear(&err);
    if (tsr_model_load(&o, &m, &err) != TSR_OK) {
        char msg[1600];
        fprintf(stderr, "measure_pystd: %s\n", tsr_error_format(&err, msg, sizeof msg));
        json_decref(root);
        return 1;
    }
    tsr_model *m2 = NULL;
    if (compare) {
        tsr_model_opts o2 = o;
        o2.assembly_path = compare;
        if (tsr_model_load(&o2, &m2, &err) != TSR_OK) {
            char msg[1600];
            fprintf(stderr, "measure_pystd: %s\n", tsr_error_format(&err, msg, sizeof msg));
            tsr_model_free(m);
            json_decref(root);
            return 1;
        }
    }
    int n_differ = 0;
    const tsr_slot_ref *ec = tsr_engine_slot(tsr_model_get_engine(m), TSR_SLOT_EXPERT_CACHE);
    int64_t proposed = 0, accepted = 0, passes = 0, generated = 0;
    double seconds = 0.0;
    int np = 0, rc = 0;
    for (size_t pi = 0; pi < json_array_size(prompts) && np < max_prompts; pi++, np++) {
        json_t *pr = json_array_get(prompts, pi);
        size_t n = json_array_size(pr);
        int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
        for (size_t j = 0; j < n; j++) ids[j] = (int32_t)json_integer_value(json_array_get(pr, j));
        tsr_gen_params gp = {.sampling = tsr_sampling_greedy(), .max_tokens = n_gen, .ignore_eos = 1};
        int32_t *out[2] = {calloc((size_t)n_gen, sizeof(int32_t)), calloc((size_t)n_gen, sizeof(int32_t))};
        int n_out[2] = {0, 0};
        if (m2) { /* the comparison first, so g's stats below are the measured assembly's */
            tsr_gen *g2 = NULL;
            rc = tsr_gen_start(m2, ids, (int)n, &gp, &g2, &err);
            tsr_gen_event ev2 = {0};
            while (rc == TSR_OK && ev2.finish == TSR_FINISH_NONE) {
                rc = tsr_gen_step(g2, &ev2, &err);
                for (int t = 0; rc == TSR_OK && t < ev2.n_tokens && n_out[1] < n_gen; t++)
                    out[1][n_out[1]++] = ev2.tokens[t].id;
            }
            tsr_gen_free(g2);
        }
        tsr_gen *g = NULL;
        if (rc == TSR_OK) rc = tsr_gen_start(m, ids, (int)n, &gp, &g, &err);
        tsr_gen_event ev = {0};
        while (rc == TSR_OK && ev.finish == TSR_FINISH_NONE) {
            rc = tsr_gen_step(g, &ev, &err);
            for (int t = 0; rc == TSR_OK && t < ev.n_tokens && n_out[0] < n_gen; t++) out[0][n_out[0]++] = ev.tokens[t].id;
        }
        if (m2 && rc == TSR_OK && (n_out[0] != n_out[1] || memcmp(out[0], out[1], (size_t)n_out[0] * sizeof(int32_t)))) {
            int at = 0;
            while (at < n_out[0] && at < n_out[1] && out[0][at] == out[1][at]) at++;
            fprintf(stderr, "measure_pystd: prompt %zu: tokens differ from %s at %d\n", pi, compare, at);
            n_differ++;
        }
        free(out[0]);
        free(out[1]);
        if (g) {
            tsr_gen_stats st;
            tsr_gen_get_stats(g, &st);
            proposed += st.draft_proposed;
            accepted += st.draft_accepted;
            passes += st.verify_passes;
            generated += st.n_generated;
            seconds += st.decode_seconds;
        }
        tsr_gen_free(g);
        free(ids);
        if (rc != TSR_OK) {
            char msg[1600];
            fprintf(stderr, "measure_pystd: prompt %zu: %s\n", pi, tsr_error_format(&err, msg, sizeof msg));
            break;
        }
    }
    printf("assembly %s, model %s: %d prompts, %lld tokens generated, decode %.1f tok/s\n", assembly, model, np,
           (long long)generated, seconds > 0 ? (double)generated / seconds : 0.0);
    if (passes)
        printf("drafts: %lld proposed, %lld accepted (%.3f), %lld verify passes, %.3f tokens per pass "
               "(accepted + 1), %.3f accepted per pass\n",
               (long long)proposed, (long long)accepted, proposed ? (double)accepted / (double)proposed : 0.0,
               (long long)passes, (double)(accepted + passes) / (double)passes, (double)accepted / (double)passes);
    if (ec && tsr_model_get_config(m)->n_experts > 0) {
        tsr_expert_stats es;
        tsr_expert_stats_get(ec, &es);
        uint64_t look = es.hits + es.misses;
        printf("experts (%s): %llu hits, %llu misses, hit rate %.4f, %llu evictions, %llu resident, %.2f MB\n",
               ec->plugin, (unsigned long long)es.hits, (unsigned long long)es.misses,
               look ? (double)es.hits / (double)look : 0.0, (unsigned long long)es.evictions,
               (unsigned long long)es.resident, es.resident_bytes / 1e6);
    }
    if (m2) printf("compared with %s: %d of %d prompts differ\n", compare, n_differ, np);
    tsr_model_free(m2);
    tsr_model_free(m);
    json_decref(root);
    return rc == TSR_OK && n_differ == 0 ? 0 : 1;
usage:
    fprintf(stderr, "usage: measure_pystd --model DIR --assembly FILE [--eval eval.json] [-n TOKENS] [--prompts N] "
                    "[--threads N] [--compare FILE]\n");
    return 2;
}
