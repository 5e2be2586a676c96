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
 * on the device (graphs or not) or looked up by the host.
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

static void run_all(const char *assembly, int moe) {
    GPU_REQUIRE("%s checks", assembly);
    for (size_t i = 0; i < N_OF(dense_families); i++) check_family(dense_families[i], assembly);
    char dir[4096], ref[4200];
    snprintf(dir, sizeof dir, "%s/models/stories260K/stories260K.gguf", gpu_src_dir());
    snprintf(ref, sizeof ref, "%s/models/stories260K/hf/reference.safetensors", gpu_src_dir());
    for (int step = 0; step <= 3; step += step ? 2 : 1)
        check(dir, ref, "input_ids_1", "logits_1", assembly, step, NULL);
    if (!moe) return;
    for (size_t i = 0; i < N_OF(moe_families); i++) check_family(moe_families[i], assembly);
    check_pystd_moe(assembly);
}

static void test_cuda_baseline(void **state) { (void)state; run_all("cuda-baseline.yaml", 1); }
static void test_cuda_fast_eager(void **state) { (void)state; run_all("cuda-fast-eager.yaml", 1); }

/* An assembly's file with its expert_cache line replaced (a temporary
 * folder: *dir, to rmdir after unlinking path). */
static void asm_with_experts(const char *name, const char *expert_line, char *dir, char *path, size_t size) {
    char src[4200];
    strcpy(dir, "/tmp/tsr_cuda_asm_XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(src, sizeof src, "%s/assemblies/%s", gpu_src_dir(), name);
    snprintf(path, size, "%s/%s", dir, name);
    FILE *in = fopen(src, "r"), *out = fopen(path, "w");
    assert_non_null(in);
    assert_non_null(out);
    char line[512];
    int replaced = 0;
    while (fgets(line, sizeof line, in)) {
        if (strstr(line, "expert_cache:")) {
            fprintf(out, "  expert_cache: %s\n", expert_line);
            replaced++;
        } else
            fputs(line, out);
    }
    fclose(in);
    fclose(out);
    assert_int_equal(replaced, 1);
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
    char dir[64] = "/tmp/tsr_cuda_sw_XXXXXX", paths[3][4200], src[4200];
    assert_non_null(mkdtemp(dir));
    snprintf(src, sizeof src, "%s/assemblies/cuda-baseline.yaml", gpu_src_dir());
    for (int v = 0; v < 3; v++) {
        snprintf(paths[v], sizeof paths[v], "%s/%s", dir, names[v]);
        FILE *in = fopen(src, "r"), *out = fopen(paths[v], "w");
        assert_true(in && out);
        char line[512];
        while (fgets(line, sizeof line, in)) fputs(line, out);
        fprintf(out, "runtime:\n%s", runtime[v]);
        fclose(in);
        fclose(out);
    }
    char model[N_OF(dense_families) + 1][4096], ref[N_OF(dense_families) + 1][4200];
    const char *ids_name[N_OF(dense_families) + 1], *logits_name[N_OF(dense_families) + 1];
    for (size_t i = 0; i < N_OF(dense_families); i++) {
        snprintf(model[i], sizeof model[i], "%s/tests/data/fixtures/%s", gpu_src_dir(), dense_families[i]);
        snprintf(ref[i], sizeof ref[i], "%s/reference.safetensors", model[i]);
        ids_name[i] = "input_ids", logits_name[i] = "logits";
    }
    const size_t st = N_OF(dense_families);
    snprintf(model[st], sizeof model[st], "%s/models/stories260K/stories260K.gguf", gpu_src_dir());
    snprintf(ref[st], sizeof ref[st], "%s/models/stories260K/hf/reference.safetensors", gpu_src_dir());
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
    for (int v = 0; v < 3; v++) unlink(paths[v]);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_baseline),
        cmocka_unit_test(test_cuda_fast),
        cmocka_unit_test(test_cuda_fast_eager),
        cmocka_unit_test(test_cuda_moe),
        cmocka_unit_test(test_moe_paths_agree),
        cmocka_unit_test(test_switches_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
