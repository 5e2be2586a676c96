/*
 * The quality bound cuda_kv_paged declares for f8_e4m3 (its manifest's
 * max_mean_kl and max_ppl_ratio), measured on the CPU: the reference
 * assembly (f32 everywhere) against the same assembly with kv_fp8_sim, a CPU
 * simulation of the plugin's storage (each token's head rounded through E4M3
 * at scale amax / 448, read back as q * scale, as cuda_attention reads it).
 * Everything else equal, the difference is the KV quantisation alone.
 *
 * Over the pystd target (a trained Qwen3, head_dim 64; ../shared, skipped
 * when absent) on the first 512 tokens of its held-out prompts, stories260K
 * and the transformers fixtures (random weights): mean KL(reference ||
 * simulated) of the next-token distributions and the perplexity ratio
 * simulated / reference on each sequence's own next tokens, each within the
 * manifest's bound. Prints max |logit diff| and greedy agreement beside them.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "core/format/safetensors.h"
#include "core/runtime/runtime.h"

static char dir[256];
static double bound_kl, bound_ppl;

/* max_mean_kl and max_ppl_ratio from the source manifest. */
static void read_bound(void) {
    char path[4096], text[8192];
    snprintf(path, sizeof path, "%s/manifests/cuda_kv_paged.yaml", getenv("TESSERA_SOURCE_DIR"));
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    const char *a = strstr(text, "max_mean_kl:"), *b = strstr(text, "max_ppl_ratio:");
    if (!a || !b || sscanf(a, "max_mean_kl: %lf", &bound_kl) != 1 || sscanf(b, "max_ppl_ratio: %lf", &bound_ppl) != 1)
        fail_msg("%s: no quality bound", path);
}

/* Assemblies go to dir/asm: every .yaml of the catalog folder is read as a manifest. */
static void put(const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/asm/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state) {
    (void)state;
    const char *cat = getenv("TESSERA_CATALOG");
    if (!cat || !getenv("TESSERA_SOURCE_DIR")) {
        fprintf(stderr, "TESSERA_CATALOG or TESSERA_SOURCE_DIR not set: run through ctest\n");
        return -1;
    }
    snprintf(dir, sizeof dir, "/tmp/tsr_kv_fp8_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    /* the reference plugins beside the simulation, in a catalog of their own */
    const char *names[] = {"ref_gemv", "ref_attention", "ref_kv_cache", "drafter_none", "expert_resident",
                           "kv_fp8_sim"};
    char a[1024], b[1024];
    for (int i = 0; i < 6; i++) {
        const char *from = i < 5 ? cat : KV_SIM_CATALOG;
        snprintf(a, sizeof a, "%s/%s.yaml", from, names[i]);
        snprintf(b, sizeof b, "%s/%s.yaml", dir, names[i]);
        if (symlink(a, b)) return -1;
        snprintf(a, sizeof a, "%s/lib%s.so", from, names[i]);
        snprintf(b, sizeof b, "%s/lib%s.so", dir, names[i]);
        if (symlink(a, b)) return -1;
    }
    const char *common = "device: cpu\nslots:\n  gemv: ref_gemv\n  attention: ref_attention\n"
                         "  drafter: drafter_none\n  expert_cache: expert_resident\n";
    char text[1024];
    snprintf(a, sizeof a, "%s/asm", dir);
    if (mkdir(a, 0700)) return -1;
    snprintf(text, sizeof text, "name: ref\n%s  kv_cache: ref_kv_cache\n", common);
    put("ref.yaml", text);
    snprintf(text, sizeof text, "name: fp8_kv\n%s  kv_cache: kv_fp8_sim\n", common);
    put("fp8.yaml", text);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[512];
    if (!strncmp(dir, "/tmp/tsr_kv_fp8_", 16)) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    }
    return 0;
}

/* Logits [n, vocab] of ids through assembly name of the temporary catalog. */
static float *logits_of(const char *model, const char *name, const int32_t *ids, int n, int *vocab) {
    char asm_path[512];
    snprintf(asm_path, sizeof asm_path, "%s/asm/%s", dir, name);
    tsr_error err;
    tsr_error_clear(&err);
    tsr_model_opts o = {.model_path = model, .assembly_path = asm_path, .catalog_dir = dir, .n_threads = 2,
                        .no_tokenizer = 1, .max_ctx = n};
    tsr_model *m;
    if (tsr_model_load(&o, &m, &err) != TSR_OK) fail_msg("%s with %s: %s", model, name, err.msg);
    *vocab = tsr_model_get_config(m)->vocab;
    float *out = malloc((size_t)n * *vocab * sizeof *out);
    assert_non_null(out);
    tsr_seq *s;
    assert_int_equal(tsr_seq_new(m, n, &s, &err), TSR_OK);
    if (tsr_seq_forward(s, ids, n, out, 1, &err) != TSR_OK) fail_msg("forward: %s", err.msg);
    tsr_seq_free(s);
    tsr_model_free(m);
    return out;
}

static void log_softmax(const float *x, int n, double *out) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    for (int i = 0; i < n; i++) sum += exp(x[i] - mx);
    for (int i = 0; i < n; i++) out[i] = x[i] - mx - log(sum);
}

static void measure(const char *label, const char *model, const int32_t *ids, int n) {
    int vocab, vocab2;
    float *ref = logits_of(model, "ref.yaml", ids, n, &vocab), *sim = logits_of(model, "fp8.yaml", ids, n, &vocab2);
    assert_int_equal(vocab, vocab2);
    double *lr = malloc((size_t)vocab * sizeof *lr), *ls = malloc((size_t)vocab * sizeof *ls);
    assert_true(lr && ls);
    double kl = 0, kl_max = 0, nll_ref = 0, nll_sim = 0, worst = 0, max_logit = 0;
    int agree = 0;
    for (int r = 0; r < n; r++) {
        const float *a = ref + (size_t)r * vocab, *b = sim + (size_t)r * vocab;
        int ta = 0, tb = 0;
        for (int i = 0; i < vocab; i++) {
            const double d = fabs((double)a[i] - b[i]);
            if (!(d <= worst)) worst = d;
            if (fabs(a[i]) > max_logit) max_logit = fabs(a[i]);
            if (a[i] > a[ta]) ta = i;
            if (b[i] > b[tb]) tb = i;
        }
        agree += ta == tb;
        log_softmax(a, vocab, lr);
        log_softmax(b, vocab, ls);
        double k = 0;
        for (int i = 0; i < vocab; i++) k += exp(lr[i]) * (lr[i] - ls[i]);
        kl += k;
        if (k > kl_max) kl_max = k;
        if (r + 1 < n) {
            nll_ref -= lr[ids[r + 1]];
            nll_sim -= ls[ids[r + 1]];
        }
    }
    kl /= n;
    const double ratio = exp((nll_sim - nll_ref) / (n - 1));
    printf("# %s, %d tokens: fp8 KV (simulated) against f32 KV: mean KL %.3g (max %.3g), ppl ratio %.6f, "
           "greedy agreement %d/%d, max |logit diff| %.3g of max |logit| %.3g\n",
           label, n, kl, kl_max, ratio, agree, n, worst, max_logit);
    if (!(kl <= bound_kl)) fail_msg("%s: mean KL %g > the manifest's %g", label, kl, bound_kl);
    if (!(ratio <= bound_ppl)) fail_msg("%s: perplexity ratio %g > the manifest's %g", label, ratio, bound_ppl);
    free(lr), free(ls), free(ref), free(sim);
}

/* ids of a reference file (read in place while it is open) */
static void measure_ref(const char *label, const char *model, const char *ref_path, const char *ids_name) {
    tsr_error err;
    tsr_error_clear(&err);
    tsr_safetensors *st;
    if (tsr_safetensors_open(ref_path, &st, &err) != TSR_OK) fail_msg("%s: %s", ref_path, err.msg);
    const tsr_tensor *t = tsr_safetensors_find(st, ids_name);
    assert_non_null(t);
    assert_int_equal(t->dtype, TSR_DTYPE_I32);
    measure(label, model, t->data, (int)(t->nbytes / 4));
    tsr_safetensors_free(st);
}

static void test_fp8_kv_quality(void **state) {
    (void)state;
    read_bound();
    const char *src = getenv("TESSERA_SOURCE_DIR");
    char model[4096], ref[4200];
    const char *families[] = {"llama", "qwen2", "qwen3"};
    for (int i = 0; i < 3; i++) {
        snprintf(model, sizeof model, "%s/tests/data/fixtures/transformers/%s", src, families[i]);
        snprintf(ref, sizeof ref, "%s/reference.safetensors", model);
        measure_ref(families[i], model, ref, "input_ids");
    }
    snprintf(model, sizeof model, "%s/models/stories260K/stories260K.gguf", src);
    snprintf(ref, sizeof ref, "%s/models/stories260K/hf/reference.safetensors", src);
    measure_ref("stories260K", model, ref, "input_ids_1");

    const char *shared = getenv("TESSERA_SHARED_DIR");
    char eval[4096];
    snprintf(model, sizeof model, "%s/data/models/pystd/target", shared ? shared : "../shared");
    snprintf(eval, sizeof eval, "%s/data/models/pystd/eval.json", shared ? shared : "../shared");
    json_error_t je;
    json_t *root = access(model, R_OK) == 0 ? json_load_file(eval, 0, &je) : NULL;
    if (!root) {
        printf("# pystd target or its eval.json absent (%s): not measured\n", model);
        return;
    }
    enum { N = 512 };
    int32_t ids[N];
    int n = 0;
    json_t *prompts = json_object_get(root, "prompts"), *p, *id;
    size_t i, j;
    json_array_foreach(prompts, i, p) json_array_foreach(p, j, id) if (n < N) ids[n++] = (int32_t)json_integer_value(id);
    json_decref(root);
    assert_true(n > 1);
    measure("pystd target", model, ids, n);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_kv_quality),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
