/*
 * The CUDA assemblies against transformers (ctest label "gpu"; skipped
 * cleanly where no CUDA device is present). Bound, stated and tested: bf16
 * weights, activations and KV give logits within
 *     |logit - reference| <= TOL_ABS + TOL_REL * max|reference logit of the row|
 * and wherever the reference's top-2 margin exceeds twice that bound, the
 * argmax is the reference's. Each assembly runs the tokens as one prefill
 * pass, and again as a one-token prefill followed by passes of 1 and of 3
 * rows (decode and verification: with runtime.cuda_graphs these are
 * captured once and replayed, which the test checks happened).
 * Mixture-of-experts models (mixtral, qwen3_moe, and the trained pystd MoE
 * where ../shared is present) run through every assembly without graphs,
 * expert_lru among them with room for one token's experts only (every
 * layer's lookup evicts the layer before's on the device), and through
 * cuda-fast, whose graphs capture experts chosen on the device (with
 * expert_lru instead it refuses them, naming runtime.cuda_graphs); one-row
 * passes give the same logits, bit for bit, whether the experts are chosen
 * on the device (graphs or not) or looked up by the host. runtime.pdl
 * leaves passes of 1..9 rows bit for bit (test_pdl_passes_exact), and
 * greedy decoding with n-gram drafts gives one-row steps' tokens up to near
 * ties (test_drafting_greedy).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/gpu/gpu_env.h"

#include "core/format/safetensors.h"
#include "core/host/engine.h"
#include "core/host/slot_calls.h"
#include "core/runtime/runtime.h"
#include "tests/gpu/gpu_check.h"
#ifdef TESSERA_CUDA
#include "core/cuda/device.h"
#endif

#define TOL_ABS 0.02
#define TOL_REL 0.05

/* assembly: a name in assemblies/, or a path. Returns the expert cache's
 * evictions (0 for a dense model); *keep (unless NULL) receives the logits. */
static uint64_t check(const char *model, const char *ref_path, const char *ids_name,
                  const char *logits_name, const char *assembly, int step, float **keep) {
    char asm_path[4096];
    if (assembly[0] == '/') snprintf(asm_path, sizeof asm_path, "%s", assembly);
    else snprintf(asm_path, sizeof asm_path, "%s/assemblies/%s", gpu_src_dir(), assembly);
    gpu_ref ref;
    gpu_ref_open(&ref, ref_path, ids_name, logits_name);
    const int n = ref.n, vocab = ref.vocab;
    const int32_t *ids = ref.ids;
    const float *want = ref.want;
    float *got = malloc((size_t)n * vocab * sizeof *got);
    assert_non_null(got);
    tsr_error err;
    tsr_error_clear(&err);
    tsr_model_opts o = {.model_path = model, .assembly_path = asm_path, .no_tokenizer = 1};
    tsr_model *m;
    if (tsr_model_load(&o, &m, &err) != TSR_OK) fail_msg("%s with %s: %s", model, assembly, err.msg);
    tsr_seq *s;
    assert_int_equal(tsr_seq_new(m, n, &s, &err), TSR_OK);
    if (gpu_run_passes(s, ids, n, vocab, step, got, &err) != TSR_OK) fail_msg("forward: %s", err.msg);
    uint64_t captures, replays;
    tsr_model_graph_stats(m, &captures, &replays);
    if (step > 0 && !strstr(assembly, "eager") && (strstr(assembly, "fast") || strstr(assembly, "graphs")) &&
        n > 2 * step + 1 && replays == 0)
        fail_msg("%s: no pass was replayed as a graph (%llu captured)", assembly, (unsigned long long)captures);
    double worst = 0, worst_rel = 0;
    int argmax_checked = 0;
    for (int r = 0; r < n; r++) {
        const gpu_row c = gpu_check_row(want + (size_t)r * vocab, got + (size_t)r * vocab, vocab, TOL_ABS, TOL_REL);
        const float *w = want + (size_t)r * vocab;
        if (!(c.worst <= c.bound))
            fail_msg("%s/%s row %d: |logit diff| %g > bound %g", model, assembly, r, c.worst, c.bound);
        if (c.worst > worst) worst = c.worst;
        if (c.worst / c.bound > worst_rel) worst_rel = c.worst / c.bound;
        if (w[c.want_top] - w[c.want_second] > 2 * c.bound) {
            argmax_checked++;
            if (c.got_top != c.want_top)
                fail_msg("%s/%s row %d: argmax %d, transformers %d", model, assembly, r, c.got_top, c.want_top);
        }
    }
    printf("# %s via %s, passes of %d rows: max |diff| %.4g (%.0f%% of the bound), argmax equal on %d/%d rows "
           "with a clear margin; graphs captured %llu, replayed %llu\n",
           model, assembly, step ? step : n, worst, 100 * worst_rel, argmax_checked, n, (unsigned long long)captures,
           (unsigned long long)replays);
    tsr_expert_stats es = {0};
    if (tsr_model_get_config(m)->n_experts > 0) {
        tsr_expert_stats_get(tsr_engine_slot(tsr_model_get_engine(m), TSR_SLOT_EXPERT_CACHE), &es);
        printf("#   experts: %llu hits, %llu misses, %llu evictions\n", (unsigned long long)es.hits,
               (unsigned long long)es.misses, (unsigned long long)es.evictions);
    }
    tsr_seq_free(s);
    tsr_model_free(m);
    if (keep) *keep = got;
    else free(got);
    gpu_ref_close(&ref);
    return es.evictions;
}

/* Returns the fewest evictions of its runs. */
static uint64_t check_family(const char *family, const char *assembly) {
    char dir[4096], ref[4200];
    snprintf(dir, sizeof dir, "%s/tests/data/fixtures/%s", gpu_src_dir(), family);
    snprintf(ref, sizeof ref, "%s/reference.safetensors", dir);
    uint64_t fewest = UINT64_MAX;
    for (int step = 0; step <= 3; step += step ? 2 : 1) {
        const uint64_t e = check(dir, ref, "input_ids", "logits", assembly, step, NULL);
        if (e < fewest) fewest = e;
    }
    return fewest;
}

/* tests/data/fixtures/SOURCE/FAMILY */
static const char *const dense_families[] = {"transformers/llama", "transformers/qwen2", "transformers/qwen3"};
static const char *const moe_families[] = {"transformers/mixtral", "transformers/qwen3_moe", "numpy/qwen2_moe"};
#define N_OF(a) (sizeof(a) / sizeof(a)[0])

/* The trained mixture of experts in ../shared (TESSERA_SHARED_DIR), when there. */
static void check_pystd_moe(const char *assembly) {
    const char *shared = getenv("TESSERA_SHARED_DIR");
    char dir[4096], ref[4200];
    snprintf(dir, sizeof dir, "%s/data/models/pystd/moe", shared ? shared : "../shared");
    snprintf(ref, sizeof ref, "%s/reference.safetensors", dir);
    if (access(ref, R_OK) != 0) {
        printf("# %s absent: the pystd MoE check skipped (it needs the project's shared data)\n", dir);
        return;
    }
    for (int step = 0; step <= 1; step++) check(dir, ref, "input_ids", "logits", assembly, step, NULL);
}

/* stories260K's GGUF and its transformers reference into model and ref
 * (4,096 and 4,200 bytes). */
static void stories_paths(char *model, char *ref) {
    snprintf(model, 4096, "%s/models/stories260K/stories260K.gguf", gpu_src_dir());
    snprintf(ref, 4200, "%s/models/stories260K/hf/reference.safetensors", gpu_src_dir());
}

static void run_all(const char *assembly, int moe) {
    GPU_REQUIRE("%s checks", assembly);
    for (size_t i = 0; i < N_OF(dense_families); i++) check_family(dense_families[i], assembly);
    char dir[4096], ref[4200];
    stories_paths(dir, ref);
    for (int step = 0; step <= 3; step += step ? 2 : 1)
        check(dir, ref, "input_ids_1", "logits_1", assembly, step, NULL);
    if (!moe) return;
    for (size_t i = 0; i < N_OF(moe_families); i++) check_family(moe_families[i], assembly);
    check_pystd_moe(assembly);
}

static void test_cuda_baseline(void **state) { (void)state; run_all("cuda-baseline.yaml", 1); }
static void test_cuda_fast_eager(void **state) { (void)state; run_all("cuda-fast-eager.yaml", 1); }

/* assemblies/NAME (or the file NAME, a path) copied into a temporary
 * folder (*dir, to rmdir after unlinking path) under its own file name: the
 * one line holding find replaced by text, or (find NULL) text appended. */
static void asm_edit(const char *name, const char *find, const char *text, char *dir, char *path, size_t size) {
    char src[8400]; /* name may itself be a path of up to 4,200 bytes */
    strcpy(dir, "/tmp/tsr_cuda_asm_XXXXXX");
    assert_non_null(mkdtemp(dir));
    if (name[0] == '/') snprintf(src, sizeof src, "%s", name);
    else snprintf(src, sizeof src, "%s/assemblies/%s", gpu_src_dir(), name);
    const char *base = strrchr(src, '/') + 1;
    snprintf(path, size, "%s/%s", dir, base);
    FILE *in = fopen(src, "r"), *out = fopen(path, "w");
    assert_non_null(in);
    assert_non_null(out);
    char line[512];
    int replaced = 0;
    while (fgets(line, sizeof line, in)) {
        if (find && strstr(line, find)) {
            fputs(text, out);
            replaced++;
        } else
            fputs(line, out);
    }
    if (!find) fputs(text, out);
    fclose(in);
    fclose(out);
    assert_int_equal(replaced, find ? 1 : 0);
}

static void asm_with_experts(const char *name, const char *expert_line, char *dir, char *path, size_t size) {
    char text[256];
    snprintf(text, sizeof text, "  expert_cache: %s\n", expert_line);
    asm_edit(name, "expert_cache:", text, dir, path, size);
}

/* cuda-fast captures graphs, MoE models' too (expert_resident and
 * cuda_gemv choose the experts on the device); with expert_lru it is
 * refused, naming runtime.cuda_graphs. */
static void test_cuda_fast(void **state) {
    (void)state;
    run_all("cuda-fast.yaml", 1);
    char dir[64], path[4200];
    asm_with_experts("cuda-fast.yaml", "expert_lru", dir, path, sizeof path);
    for (size_t i = 0; i < N_OF(moe_families); i++) {
        char model[4096];
        snprintf(model, sizeof model, "%s/tests/data/fixtures/%s", gpu_src_dir(), moe_families[i]);
        tsr_model_opts o = {.model_path = model, .assembly_path = path, .no_tokenizer = 1};
        tsr_model *m = NULL;
        tsr_error err;
        tsr_error_clear(&err);
        assert_int_not_equal(tsr_model_load(&o, &m, &err), TSR_OK);
        assert_null(m);
        if (!strstr(err.msg, "runtime.cuda_graphs")) fail_msg("%s: refusal without the reason: %s", model, err.msg);
        printf("# %s via cuda-fast with expert_lru refused: %s\n", moe_families[i], err.msg);
    }
    unlink(path);
    rmdir(dir);
}

/* One-row passes of the MoE fixtures: experts chosen on the device
 * (cuda-fast-eager; cuda-fast replaying graphs) give the logits of the host
 * looking them up (cuda-moe: the same plugins but expert_lru), bit for bit. */
static void test_moe_paths_agree(void **state) {
    (void)state;
    GPU_REQUIRE("MoE path checks");
    const char *const assemblies[] = {"cuda-moe.yaml", "cuda-fast-eager.yaml", "cuda-fast.yaml"};
    for (size_t i = 0; i < N_OF(moe_families); i++) {
        char dir[4096], ref[4200];
        snprintf(dir, sizeof dir, "%s/tests/data/fixtures/%s", gpu_src_dir(), moe_families[i]);
        snprintf(ref, sizeof ref, "%s/reference.safetensors", dir);
        gpu_ref r;
        gpu_ref_open(&r, ref, "input_ids", "logits");
        const size_t bytes = (size_t)r.n * r.vocab * sizeof(float);
        gpu_ref_close(&r);
        float *logits[3];
        for (size_t a = 0; a < 3; a++) check(dir, ref, "input_ids", "logits", assemblies[a], 1, &logits[a]);
        for (size_t a = 1; a < 3; a++)
            if (memcmp(logits[a], logits[0], bytes) != 0)
                fail_msg("%s: %s's logits differ from %s's", moe_families[i], assemblies[a], assemblies[0]);
        printf("# %s: one-row passes equal bit for bit via %s, %s and %s\n", moe_families[i], assemblies[0],
               assemblies[1], assemblies[2]);
        for (size_t a = 0; a < 3; a++) free(logits[a]);
    }
}

/* cuda-moe as shipped, then with expert_lru's budget at one token's experts. */
static void test_cuda_moe(void **state) {
    (void)state;
    GPU_REQUIRE("cuda-moe checks");
    for (size_t i = 0; i < N_OF(moe_families); i++) check_family(moe_families[i], "cuda-moe.yaml");
    check_pystd_moe("cuda-moe.yaml");
    char tmp[64], path[4200];
    asm_with_experts("cuda-moe.yaml", "{plugin: expert_lru, params: {budget: 2}}", tmp, path, sizeof path);
    for (size_t i = 0; i < N_OF(moe_families); i++)
        if (check_family(moe_families[i], path) == 0) fail_msg("%s: budget 2 evicted nothing", moe_families[i]);
    check_pystd_moe(path);
    unlink(path);
    rmdir(tmp);
}

/* The runtime switches declared exact (runtime.cuda_graphs,
 * runtime.pdl) leave the CUDA baselines' logits as they are, bit for bit:
 * the dense fixtures and stories260K in one-row passes (captured and
 * replayed with graphs) through cuda-baseline with each switch and both.
 * The ablation's exactness check compares those variants' greedy text
 * with the baseline's. */
static void test_switches_exact(void **state) {
    (void)state;
    GPU_REQUIRE("runtime switch checks");
    static const char *const runtime[] = {"  cuda_graphs: true\n", "  pdl: true\n",
                                          "  cuda_graphs: true\n  pdl: true\n"};
    static const char *const names[] = {"cuda-baseline-graphs.yaml", "cuda-baseline-pdl.yaml",
                                        "cuda-baseline-graphs-pdl.yaml"};
    char dirs[3][64], paths[3][4200], text[128];
    for (int v = 0; v < 3; v++) {
        snprintf(text, sizeof text, "runtime:\n%s", runtime[v]);
        asm_edit("cuda-baseline.yaml", NULL, text, dirs[v], paths[v], sizeof paths[v]);
    }
    char model[N_OF(dense_families) + 1][4096], ref[N_OF(dense_families) + 1][4200];
    const char *ids_name[N_OF(dense_families) + 1], *logits_name[N_OF(dense_families) + 1];
    for (size_t i = 0; i < N_OF(dense_families); i++) {
        snprintf(model[i], sizeof model[i], "%s/tests/data/fixtures/%s", gpu_src_dir(), dense_families[i]);
        snprintf(ref[i], sizeof ref[i], "%s/reference.safetensors", model[i]);
        ids_name[i] = "input_ids", logits_name[i] = "logits";
    }
    const size_t st = N_OF(dense_families);
    stories_paths(model[st], ref[st]);
    ids_name[st] = "input_ids_1", logits_name[st] = "logits_1";
    for (size_t i = 0; i <= st; i++) {
        gpu_ref r;
        gpu_ref_open(&r, ref[i], ids_name[i], logits_name[i]);
        const size_t bytes = (size_t)r.n * r.vocab * sizeof(float);
        gpu_ref_close(&r);
        float *base, *got;
        check(model[i], ref[i], ids_name[i], logits_name[i], "cuda-baseline.yaml", 1, &base);
        for (int v = 0; v < 3; v++) {
            check(model[i], ref[i], ids_name[i], logits_name[i], paths[v], 1, &got);
            if (memcmp(got, base, bytes) != 0) fail_msg("%s: %s's logits differ from cuda-baseline's", model[i], names[v]);
            free(got);
        }
        printf("# %s: one-row passes equal bit for bit with graphs, PDL and both\n", model[i]);
        free(base);
    }
    for (int v = 0; v < 3; v++) {
        unlink(paths[v]);
        rmdir(dirs[v]);
    }
}

/* Greedy ids of a generation (ids [max_tokens]); the KV bytes in use when
 * it ended into *kv_used, its statistics into *stats (unless NULL).
 * Returns the number of ids. */
static int gen_ids_stats(tsr_model *m, const int32_t *prompt, int n, const tsr_gen_params *p, int32_t *ids,
                         uint64_t *kv_used, tsr_finish *finish, tsr_gen_stats *stats) {
    tsr_gen *g;
    tsr_error err;
    tsr_error_clear(&err);
    if (tsr_gen_start(m, prompt, n, p, &g, &err) != TSR_OK) fail_msg("gen_start: %s", err.msg);
    int k = 0;
    for (;;) {
        tsr_gen_event ev;
        if (tsr_gen_step(g, &ev, &err) != TSR_OK) fail_msg("step: %s", err.msg);
        for (int i = 0; i < ev.n_tokens; i++) ids[k++] = ev.tokens[i].id;
        if (ev.finish != TSR_FINISH_NONE) {
            *finish = ev.finish;
            break;
        }
    }
    uint64_t cap;
    tsr_model_kv_usage(m, kv_used, &cap);
    if (stats) tsr_gen_get_stats(g, stats);
    tsr_gen_free(g);
    return k;
}

static int gen_ids(tsr_model *m, const int32_t *prompt, int n, const tsr_gen_params *p, int32_t *ids,
                   uint64_t *kv_used, tsr_finish *finish) {
    return gen_ids_stats(m, prompt, n, p, ids, kv_used, finish, NULL);
}

/* Two models of stories260K (model) through the assemblies at paths[0]
 * and paths[1] (temporary copies), into m; fails naming the one refused. */
static void load_two(const char *model, const char *const paths[2], tsr_model *m[2]) {
    for (int v = 0; v < 2; v++) {
        tsr_model_opts o = {.model_path = model, .assembly_path = paths[v]};
        tsr_error err;
        tsr_error_clear(&err);
        if (tsr_model_load(&o, &m[v], &err) != TSR_OK) fail_msg("%s: %s", paths[v], err.msg);
    }
}

/* runtime.pipeline (each greedy pass queued before the token it follows is
 * read, its input id taken on the device) gives the tokens of plain steps,
 * through graphs (cuda-fast, cuda-fast-fp8) and eager passes
 * (cuda-fast-eager with it): stories260K's three reference prompts, 64
 * tokens each; generation stopped by a stop string with a pass queued
 * (its KV taken back: the same bytes in use as plain steps leave); a request
 * sampled on the device with penalties (pipelined too: the same draws); and
 * three generations stepped in turn on one model, the third sampled, each
 * giving its tokens as when alone; cuda-fast-paged too (its block table
 * grows as passes are queued). */
static void test_pipeline_exact(void **state) {
    (void)state;
    GPU_REQUIRE("runtime.pipeline checks");
    char model[4096], ref[4200];
    stories_paths(model, ref);
    static const char *const names[] = {"cuda-fast.yaml", "cuda-fast-fp8.yaml", "cuda-fast-eager.yaml",
                                        "cuda-fast-paged.yaml"};
    for (size_t a = 0; a < N_OF(names); a++) {
        char dir[2][64], path[2][4200], pdir[64] = "", ppath[4200];
        const int eager = strstr(names[a], "eager") != NULL;
        const char *src = names[a];
        if (strstr(names[a], "paged")) { /* a pool for three sequences at once (its default: the context) */
            asm_edit(names[a], "kv_cache:",
                     "  kv_cache: {plugin: cuda_kv_paged, params: {dtype: bf16, block_size: 16, capacity_tokens: 512}}\n",
                     pdir, ppath, sizeof ppath);
            src = ppath;
        }
        /* [0]: without the pipeline, [1]: with it */
        asm_edit(src, "pipeline:", "  pipeline: false\n", dir[0], path[0], sizeof path[0]);
        asm_edit(src, "pipeline:", "  pipeline: true\n", dir[1], path[1], sizeof path[1]);
        if (pdir[0]) {
            unlink(ppath);
            rmdir(pdir);
        }
        tsr_model *m[2];
        load_two(model, (const char *const[2]){path[0], path[1]}, m);
        tsr_gen_params p = {.sampling = tsr_sampling_greedy(), .max_tokens = 64, .ignore_eos = 1};
        int32_t want[3][64], got[64];
        int n_want[3];
        const int32_t *prompts[3];
        int n_prompt[3];
        gpu_ref r[3];
        for (int c = 0; c < 3; c++) {
            char in[32], lg[32];
            snprintf(in, sizeof in, "input_ids_%d", c);
            snprintf(lg, sizeof lg, "logits_%d", c);
            gpu_ref_open(&r[c], ref, in, lg);
            prompts[c] = r[c].ids;
            n_prompt[c] = r[c].n < 16 ? r[c].n : 16;
            uint64_t u0, u1;
            tsr_finish f;
            n_want[c] = gen_ids(m[0], prompts[c], n_prompt[c], &p, want[c], &u0, &f);
            const int n = gen_ids(m[1], prompts[c], n_prompt[c], &p, got, &u1, &f);
            assert_int_equal(n, n_want[c]);
            if (memcmp(got, want[c], (size_t)n * sizeof *got) != 0)
                fail_msg("%s prompt %d: pipelined tokens differ from plain steps", names[a], c);
            assert_true(u0 == u1);
        }
        /* sampled on the device with penalties (the history grows there): the
         * same draws, the uniform numbers taken in the same order */
        {
            tsr_gen_params q = p;
            q.sampling.temperature = 0.9f;
            q.sampling.top_p = 0.95f;
            q.sampling.repetition_penalty = 1.1f;
            q.sampling.presence_penalty = 0.3f;
            q.sampling.seed = 7;
            q.sampling.has_seed = 1;
            int32_t x0[64], x1[64];
            uint64_t k0, k1;
            tsr_finish f0, f1;
            const int n0 = gen_ids(m[0], prompts[1], n_prompt[1], &q, x0, &k0, &f0);
            const int n1 = gen_ids(m[1], prompts[1], n_prompt[1], &q, x1, &k1, &f1);
            assert_int_equal(n0, n1);
            if (memcmp(x0, x1, (size_t)n0 * sizeof *x0) != 0)
                fail_msg("%s: pipelined sampled tokens differ from plain steps'", names[a]);
            assert_true(k0 == k1);
        }
        /* a stop string that ends it early */
        tsr_gen_params ps = p;
        ps.max_tokens = 40;
        uint64_t u0, u1;
        int32_t x[64], y[64];
        const char *stop = " the";
        ps.stop[0] = stop;
        ps.n_stop = 1;
        tsr_finish fx, fy;
        const int nx = gen_ids(m[0], prompts[0], n_prompt[0], &ps, x, &u0, &fx);
        const int ny = gen_ids(m[1], prompts[0], n_prompt[0], &ps, y, &u1, &fy);
        assert_int_equal(fx, TSR_FINISH_STOP);
        assert_int_equal(fy, TSR_FINISH_STOP);
        assert_int_equal(nx, ny);
        assert_memory_equal(x, y, (size_t)nx * sizeof *x);
        assert_true(u0 == u1);
        /* three generations in turn, the third sampled on the device, each as
         * when alone */
        tsr_gen_params sampled = p;
        sampled.sampling.temperature = 0.8f;
        sampled.sampling.seed = 5;
        sampled.sampling.has_seed = 1;
        int32_t want_s[64];
        uint64_t us;
        tsr_finish fs;
        const int n_s = gen_ids(m[1], prompts[2], n_prompt[2], &sampled, want_s, &us, &fs);
        const int32_t *wants[3] = {want[0], want[1], want_s};
        const int n_wants[3] = {n_want[0], n_want[1], n_s};
        tsr_gen *g[3];
        tsr_error err;
        tsr_error_clear(&err);
        for (int k = 0; k < 3; k++)
            if (tsr_gen_start(m[1], prompts[k], n_prompt[k], k < 2 ? &p : &sampled, &g[k], &err) != TSR_OK)
                fail_msg("gen_start: %s", err.msg);
        int n[3] = {0, 0, 0}, fin[3] = {0, 0, 0};
        while (!fin[0] || !fin[1] || !fin[2])
            for (int k = 0; k < 3; k++) {
                if (fin[k]) continue;
                tsr_gen_event ev;
                if (tsr_gen_step(g[k], &ev, &err) != TSR_OK) fail_msg("step: %s", err.msg);
                for (int t = 0; t < ev.n_tokens; t++, n[k]++)
                    if (n[k] >= n_wants[k] || ev.tokens[t].id != wants[k][n[k]])
                        fail_msg("%s: generation %d in turn, token %d differs", names[a], k, n[k]);
                fin[k] = ev.finish != TSR_FINISH_NONE;
            }
        for (int k = 0; k < 3; k++) {
            assert_int_equal(n[k], n_wants[k]);
            tsr_gen_free(g[k]);
        }
        uint64_t captures, replays;
        tsr_model_graph_stats(m[1], &captures, &replays);
        if (!eager && replays == 0) fail_msg("%s: no pipelined pass was replayed", names[a]);
        printf("# %s: pipelined tokens equal plain steps' (3 greedy prompts, one sampled with penalties, a stop "
               "string: %d tokens, three generations in turn); graphs captured %llu, replayed %llu\n",
               names[a], nx, (unsigned long long)captures, (unsigned long long)replays);
        for (int c = 0; c < 3; c++) gpu_ref_close(&r[c]);
        for (int v = 0; v < 2; v++) {
            tsr_model_free(m[v]);
            unlink(path[v]);
            rmdir(dir[v]);
        }
    }
}

/* Where greedy text with drafting (got) first leaves that of one-row steps
 * (want) at token i: the one-row logits there (prompt and want's first i
 * tokens through m in passes of one row) must hold the two choices within
 * twice the suite's bound of each other (TOL_ABS + TOL_REL * max|logit|,
 * which each pass's logits keep from transformers': run_all) -- a near tie
 * that verification rows, summed in another order, may break the other
 * way. Anything farther apart fails, naming the token. */
static int near_tie(tsr_model *m, const int32_t *prompt, int n_prompt, const int32_t *want, const int32_t *got, int i,
                     int vocab, const char *what, int c) {
    const int n = n_prompt + i;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    float *lg = malloc((size_t)n * vocab * sizeof *lg);
    assert_non_null(ids);
    assert_non_null(lg);
    memcpy(ids, prompt, (size_t)n_prompt * sizeof *ids);
    memcpy(ids + n_prompt, want, (size_t)i * sizeof *ids);
    tsr_error err;
    tsr_error_clear(&err);
    tsr_seq *s;
    assert_int_equal(tsr_seq_new(m, n, &s, &err), TSR_OK);
    if (gpu_run_passes(s, ids, n, vocab, 1, lg, &err) != TSR_OK) fail_msg("forward: %s", err.msg);
    const float *row = lg + (size_t)(n - 1) * vocab;
    const gpu_row r = gpu_check_row(row, row, vocab, TOL_ABS, TOL_REL);
    const double margin = (double)row[want[i]] - row[got[i]];
    const int tie = fabs(margin) <= 2 * r.bound;
    if (tie)
        printf("# %s prompt %d: from token %d on, drafting and one-row steps part at a near tie (%d or %d, %.4g apart "
               "in the one-row logits; twice the bound %.4g)\n",
               what, c, i, got[i], want[i], margin, 2 * r.bound);
    else
        print_error("%s prompt %d: token %d is %d with n-gram drafting, %d in one-row steps, %.4g apart in the "
                    "one-row logits (twice the bound: %.4g)\n",
                    what, c, i, got[i], want[i], margin, 2 * r.bound);
    tsr_seq_free(s);
    free(lg);
    free(ids);
    return tie;
}

/* Speculative decoding on the device: n-gram drafts verified in passes of
 * up to 9 rows (the verification GEMVs and attention, the KV cache taken
 * back past rejected drafts) give the tokens of one-row greedy steps
 * through the same assembly up to a near tie (near_tie), drafts accepted:
 * stories260K's three reference prompts (16 tokens), 108 tokens each (its
 * context is 128), through cuda-fast, cuda-fast-eager, cuda-baseline,
 * cuda-fast-fp8 (rows and, with tile_all, tiles), cuda-fast-paged, and
 * cuda-fast-eager with cuda_gemv's fold, fuse and glu off in turn.
 * runtime.pipeline is off in each (it refuses a drafter that proposes);
 * every case runs before the test fails.
 *
 * Found by it (2026-12-02; located and mended 2026-12-03, BENCHMARKS.md
 * thirty-fifth and thirty-sixth sessions): through cuda_gemv prompt 1's
 * token 100, the first of its only 8-row pass, came out another token each
 * run, 2-9 logits below one-row steps' choice; with runtime.pdl off, or
 * decode_rows 7 (8 rows to cuBLASLt), all 324 tokens agreed. gemv_mma's
 * 8-row instances read their activations through the read-only path
 * (__ldg), which may run ahead of the programmatic-dependent wait
 * (tsr_pdl::load; test_pdl_passes_exact). The E4M3 assemblies part at
 * genuine near ties (0.001-0.002 apart). */
static void test_drafting_greedy(void **state) {
    (void)state;
    GPU_REQUIRE("speculative decoding checks");
    char model[4096], ref[4200];
    stories_paths(model, ref);
    static const struct {
        const char *name, *key, *line; /* line: a replacement for the line with key, or NULL */
        int pipelined;                 /* the assembly names runtime.pipeline (turned off here) */
    } cases[] = {
        {"cuda-fast.yaml", NULL, NULL, 1},
        {"cuda-fast-eager.yaml", NULL, NULL, 1},
        {"cuda-baseline.yaml", NULL, NULL, 0},
        {"cuda-fast-eager.yaml", "gemv:", "  gemv: {plugin: cuda_gemv, params: {fold: false}}\n", 1},
        {"cuda-fast-eager.yaml", "gemv:", "  gemv: {plugin: cuda_gemv, params: {fuse: false}}\n", 1},
        {"cuda-fast-eager.yaml", "gemv:", "  gemv: {plugin: cuda_gemv, params: {glu: false}}\n", 1},
        {"cuda-fast-fp8.yaml", NULL, NULL, 1},
        {"cuda-fast-fp8.yaml", "gemv:", "  gemv: {plugin: cuda_gemv_fp8, params: {tile_all: true}}\n", 1},
        {"cuda-fast-paged.yaml", NULL, NULL, 1},
    };
    enum { kTokens = 108 };
    int bad = 0; /* prompts whose drafting parted from one-row steps at no near tie (each printed) */
    for (size_t a = 0; a < N_OF(cases); a++) {
        char d0[64], p0[4200], d1[64], p1[4200], d2[64], p2[4200];
        if (cases[a].pipelined) asm_edit(cases[a].name, "pipeline:", "  pipeline: false\n", d0, p0, sizeof p0);
        else asm_edit(cases[a].name, NULL, "", d0, p0, sizeof p0); /* a copy */
        if (cases[a].line) { /* a line of the pipeline-free copy, edited in place */
            asm_edit(p0, cases[a].key, cases[a].line, d2, p2, sizeof p2);
            unlink(p0);
            rmdir(d0);
            strcpy(d0, d2), strcpy(p0, p2);
        }
        asm_edit(p0, "drafter:", "  drafter: drafter_ngram\n", d1, p1, sizeof p1);
        tsr_model *m[2];
        load_two(model, (const char *const[2]){p0, p1}, m);
        char what[512]; /* the assembly and its edited line */
        snprintf(what, sizeof what, "%s%s%.*s", cases[a].name, cases[a].line ? " with" : "",
                 cases[a].line ? (int)strlen(cases[a].line) - 1 : 0, cases[a].line ? cases[a].line : "");
        tsr_gen_params p = {.sampling = tsr_sampling_greedy(), .max_tokens = kTokens, .ignore_eos = 1};
        int64_t proposed = 0, accepted = 0, passes = 0, tokens = 0, compared = 0;
        for (int c = 0; c < 3; c++) {
            char in[32], lg[32];
            snprintf(in, sizeof in, "input_ids_%d", c);
            snprintf(lg, sizeof lg, "logits_%d", c);
            gpu_ref r;
            gpu_ref_open(&r, ref, in, lg);
            const int n_prompt = r.n < 16 ? r.n : 16;
            int32_t want[kTokens], got[kTokens];
            uint64_t u0, u1;
            tsr_finish f0, f1;
            tsr_gen_stats st;
            const int n0 = gen_ids(m[0], r.ids, n_prompt, &p, want, &u0, &f0);
            const int n1 = gen_ids_stats(m[1], r.ids, n_prompt, &p, got, &u1, &f1, &st);
            assert_int_equal(n0, kTokens);
            assert_int_equal(n1, kTokens);
            assert_true(u0 == u1); /* the rejected drafts' KV given back */
            int same = 0;
            while (same < kTokens && got[same] == want[same]) same++;
            if (same < kTokens) bad += !near_tie(m[0], r.ids, n_prompt, want, got, same, r.vocab, what, c);
            compared += same;
            proposed += st.draft_proposed, accepted += st.draft_accepted, passes += st.decode_passes;
            tokens += n1;
            gpu_ref_close(&r);
        }
        if (accepted == 0) fail_msg("%s: no draft was accepted (the verification path not exercised)", cases[a].name);
        printf("# %s: greedy with n-gram drafting equals one-row steps on %lld of %lld tokens (3 prompts; %lld "
               "drafts proposed, %lld accepted, %lld decode passes)\n",
               what, (long long)compared, (long long)tokens, (long long)proposed, (long long)accepted,
               (long long)passes);
        for (int v = 0; v < 2; v++) tsr_model_free(m[v]);
        unlink(p0), rmdir(d0), unlink(p1), rmdir(d1);
    }
    if (bad) fail_msg("%d prompt(s) parted at no near tie (above)", bad);
}

/* runtime.pdl changes no bit of a pass of any row count: the kernels are
 * the same whether launched as programmatic dependents or not (pdl.cuh), so
 * an assembly's logits with it and without it must be equal bit for bit.
 * Prompt 1 (16 tokens) and 108 tokens of one-row greedy steps fed in passes
 * of 1..9 rows (each pass size at every position it reaches), three times
 * each, through cuda-fast-eager, cuda-fast-fp8 (graphs) and
 * cuda-fast-paged. Found (2026-12-03): gemv_mma's 8-row instances read
 * their activations through the read-only path, which may run ahead of
 * the wait (tsr_pdl::load), and cuda-fast-eager's 8-row passes differed. */
static void test_pdl_passes_exact(void **state) {
    (void)state;
    GPU_REQUIRE("runtime.pdl pass checks");
    char model[4096], ref[4200];
    stories_paths(model, ref);
    static const char *const names[] = {"cuda-fast-eager.yaml", "cuda-fast-fp8.yaml", "cuda-fast-paged.yaml"};
    enum { kPrompt = 16, kTokens = 108, kN = kPrompt + kTokens };
    gpu_ref r;
    gpu_ref_open(&r, ref, "input_ids_1", "logits_1");
    assert_true(r.n >= kPrompt);
    const int vocab = r.vocab;
    float *lg[2];
    for (int v = 0; v < 2; v++) assert_non_null(lg[v] = malloc((size_t)kN * vocab * sizeof(float)));
    int bad = 0;
    for (size_t a = 0; a < N_OF(names); a++) {
        char d0[64], p0[4200], d1[64], p1[4200];
        asm_edit(names[a], "pipeline:", "  pipeline: false\n", d0, p0, sizeof p0);
        asm_edit(p0, "pdl:", "  pdl: false\n", d1, p1, sizeof p1);
        tsr_model *m[2];
        load_two(model, (const char *const[2]){p0, p1}, m);
        int32_t ids[kN];
        memcpy(ids, r.ids, kPrompt * sizeof *ids);
        tsr_gen_params gp = {.sampling = tsr_sampling_greedy(), .max_tokens = kTokens, .ignore_eos = 1};
        uint64_t used;
        tsr_finish fin;
        assert_int_equal(gen_ids(m[1], r.ids, kPrompt, &gp, ids + kPrompt, &used, &fin), kTokens);
        int differ = 0;
        for (int rows = 1; rows <= 9; rows++)
            for (int rep = 0; rep < 3; rep++) {
                for (int v = 0; v < 2; v++) {
                    tsr_error err;
                    tsr_error_clear(&err);
                    tsr_seq *s;
                    assert_int_equal(tsr_seq_new(m[v], kN, &s, &err), TSR_OK);
                    if (gpu_run_passes(s, ids, kN, vocab, rows, lg[v], &err) != TSR_OK)
                        fail_msg("%s: forward: %s", names[a], err.msg);
                    tsr_seq_free(s);
                }
                for (int i = 0; i < kN; i++) {
                    const float *x = lg[0] + (size_t)i * vocab, *y = lg[1] + (size_t)i * vocab;
                    if (memcmp(x, y, (size_t)vocab * sizeof *x) == 0) continue;
                    double worst = 0;
                    for (int j = 0; j < vocab; j++) worst = fmax(worst, fabs((double)x[j] - y[j]));
                    print_error("%s: passes of %d rows (run %d): position %d's logits differ with runtime.pdl on "
                                "and off (by up to %.4g)\n",
                                names[a], rows, rep, i, worst);
                    differ++;
                    break;
                }
            }
        printf("# %s: passes of 1..9 rows, runtime.pdl on and off, %s\n", names[a],
               differ ? "differ (above)" : "equal bit for bit");
        bad += differ;
        for (int v = 0; v < 2; v++) tsr_model_free(m[v]);
        unlink(p0), rmdir(d0), unlink(p1), rmdir(d1);
    }
    for (int v = 0; v < 2; v++) free(lg[v]);
    gpu_ref_close(&r);
    if (bad) fail_msg("%d pass size(s) and run(s) differ with runtime.pdl", bad);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_baseline),
        cmocka_unit_test(test_cuda_fast),
        cmocka_unit_test(test_cuda_fast_eager),
        cmocka_unit_test(test_cuda_moe),
        cmocka_unit_test(test_moe_paths_agree),
        cmocka_unit_test(test_switches_exact),
        cmocka_unit_test(test_pipeline_exact),
        cmocka_unit_test(test_pdl_passes_exact),
        cmocka_unit_test(test_drafting_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
