/*
 * End-to-end checks of the model runtime with the reference assembly against
 * transformers: every fixture family's logits and greedy ids, and
 * stories260K's logits and greedy text read from each of its formats; and
 * against tools/fixtures/numpy_ref.py (a numpy forward pass that matches
 * transformers on those fixtures) for qwen2_moe, which has no transformers
 * fixture.
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "core/format/safetensors.h"
#include "core/runtime/runtime.h"
#include "tests/runtime/seq_logits.h"
#include "tests/runtime/test_gemv_catalog.h"

static const char *src_dir(void) {
    const char *s = getenv("TESSERA_SOURCE_DIR");
    return s ? s : ".";
}

static char asm_path[4096];

static tsr_model *load_threads(const char *model, const char *tokenizer, int no_tokenizer, int threads) {
    tsr_model_opts o = {.model_path = model, .assembly_path = asm_path, .tokenizer_path = tokenizer,
                        .n_threads = threads, .no_tokenizer = no_tokenizer};
    tsr_error err;
    tsr_error_clear(&err);
    tsr_model *m = NULL;
    int rc = tsr_model_load(&o, &m, &err);
    if (rc != TSR_OK) fail_msg("loading %s: %s: %s", model, err.file, err.msg);
    return m;
}

static tsr_model *load(const char *model, const char *tokenizer, int no_tokenizer) {
    return load_threads(model, tokenizer, no_tokenizer, 2);
}

static const tsr_tensor *ref_tensor(const tsr_safetensors *st, const char *name, uint32_t dtype) {
    const tsr_tensor *t = tsr_safetensors_find(st, name);
    if (!t || t->dtype != dtype) fail_msg("reference tensor %s missing or of the wrong dtype", name);
    return t;
}

/* Largest |a - b| over n floats (data may be unaligned: memcpy). */
static double max_abs_diff(const float *a, const void *b_raw, size_t n) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        float b;
        memcpy(&b, (const char *)b_raw + i * 4, 4);
        double d = a[i] > b ? a[i] - b : b - a[i];
        if (d != d) return 1e30; /* NaN */
        if (d > worst) worst = d;
    }
    return worst;
}

static int32_t *read_i32(const tsr_tensor *t, int *n) {
    *n = (int)(t->nbytes / 4);
    int32_t *v = malloc(t->nbytes);
    assert_non_null(v);
    memcpy(v, t->data, t->nbytes);
    return v;
}

/* logits of every position of ids, compared with ref within tol. */
static void check_logits(tsr_model *m, const int32_t *ids, int n, const tsr_tensor *ref, double tol,
                         const char *what) {
    const int vocab = tsr_model_get_config(m)->vocab;
    assert_int_equal(ref->shape[0], n);
    assert_int_equal(ref->shape[1], vocab);
    float *logits = seq_logits(m, ids, n);
    double d = max_abs_diff(logits, ref->data, (size_t)n * vocab);
    printf("# %s: max |logits - reference| = %.3g over %d x %d\n", what, d, n, vocab);
    if (d > tol) fail_msg("%s: logits differ from the reference by %g > %g", what, d, tol);
    free(logits);
}

/* Greedy generation of n_expect tokens after ids; returns the text. */
static char *greedy(tsr_model *m, const int32_t *ids, int n, const int32_t *expect, int n_expect,
                    const char *what) {
    tsr_gen_params p = {.sampling = tsr_sampling_greedy(), .max_tokens = n_expect, .ignore_eos = 1};
    tsr_gen *g;
    tsr_error err;
    tsr_error_clear(&err);
    if (tsr_gen_start(m, ids, n, &p, &g, &err) != TSR_OK) fail_msg("%s: gen_start: %s", what, err.msg);
    int32_t *got = calloc((size_t)n_expect, sizeof *got);
    char *text = calloc(1, 1);
    size_t tl = 0;
    int k = 0;
    for (;;) {
        tsr_gen_event ev;
        if (tsr_gen_step(g, &ev, &err) != TSR_OK) fail_msg("%s: step: %s", what, err.msg);
        for (int i = 0; i < ev.n_tokens && k < n_expect; i++) got[k++] = ev.tokens[i].id;
        text = realloc(text, tl + ev.text_len + 1);
        memcpy(text + tl, ev.text, ev.text_len);
        tl += ev.text_len;
        text[tl] = '\0';
        if (ev.finish != TSR_FINISH_NONE) {
            assert_int_equal(ev.finish, TSR_FINISH_LENGTH);
            break;
        }
    }
    assert_int_equal(k, n_expect);
    for (int i = 0; i < n_expect; i++)
        if (got[i] != expect[i])
            fail_msg("%s: greedy token %d is %d, the reference chose %d", what, i, got[i], expect[i]);
    tsr_gen_free(g);
    free(got);
    return text;
}

static void check_dir(const char *dir, const char *family, double tol) {
    char ref_path[4200];
    snprintf(ref_path, sizeof ref_path, "%s/reference.safetensors", dir);
    tsr_safetensors *ref;
    tsr_error err;
    tsr_error_clear(&err);
    assert_int_equal(tsr_safetensors_open(ref_path, &ref, &err), TSR_OK);
    int n_ids, n_greedy;
    int32_t *ids = read_i32(ref_tensor(ref, "input_ids", TSR_DTYPE_I32), &n_ids);
    int32_t *expect = read_i32(ref_tensor(ref, "greedy_ids", TSR_DTYPE_I32), &n_greedy);
    tsr_model *m = load(dir, NULL, 1); /* fixtures ship no tokenizer */
    check_logits(m, ids, n_ids, ref_tensor(ref, "logits", TSR_DTYPE_F32), tol, family);
    free(greedy(m, ids, n_ids, expect, n_greedy, family));
    tsr_model_free(m);
    free(ids);
    free(expect);
    tsr_safetensors_free(ref);
}

/* source: "transformers" or "numpy" (tests/data/fixtures/SOURCE/FAMILY) */
static void check_fixture_from(const char *source, const char *family) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/data/fixtures/%s/%s", src_dir(), source, family);
    check_dir(dir, family, 1e-3);
}

static void check_fixture(const char *family) { check_fixture_from("transformers", family); }

/* The pystd models (bf16, sharded, a trained MoE) in ../shared, when present. */
static void check_pystd(const char *name) {
    const char *shared = getenv("TESSERA_SHARED_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/data/models/pystd/%s", shared ? shared : "../shared", name);
    if (access(dir, R_OK) != 0) {
        printf("# %s absent: pystd checks skipped (they need the project's shared data)\n", dir);
        skip();
    }
    check_dir(dir, name, 1e-3);
}

static void test_pystd_target(void **state) { (void)state; check_pystd("target"); }
static void test_pystd_draft(void **state) { (void)state; check_pystd("draft"); }
static void test_pystd_moe(void **state) { (void)state; check_pystd("moe"); }

static void test_llama(void **state) { (void)state; check_fixture("llama"); }
static void test_qwen2(void **state) { (void)state; check_fixture("qwen2"); }
static void test_qwen3(void **state) { (void)state; check_fixture("qwen3"); }
static void test_mixtral(void **state) { (void)state; check_fixture("mixtral"); }
static void test_qwen3_moe(void **state) { (void)state; check_fixture("qwen3_moe"); }
/* a shared expert behind its sigmoid gate, a dense layer before the MoE one,
 * transformers-4 key spelling */
static void test_qwen2_moe(void **state) { (void)state; check_fixture_from("numpy", "qwen2_moe"); }

/* Fixture kind/name (tests/data/fixtures) through the assembly asm_path,
 * its plugins from catalog. */
static tsr_model *fixture_through(const char *kind, const char *name, const char *asm_path, const char *catalog) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/data/fixtures/%s/%s", src_dir(), kind, name);
    tsr_model_opts o = {.model_path = dir, .assembly_path = asm_path, .catalog_dir = catalog, .n_threads = 2,
                        .no_tokenizer = 1};
    tsr_error err;
    tsr_error_clear(&err);
    tsr_model *m = NULL;
    if (tsr_model_load(&o, &m, &err) != TSR_OK) fail_msg("%s through %s: %s", name, asm_path, err.msg);
    return m;
}

/* m's logits of fixture kind/name's input ids against its reference's, within 1e-3. */
static void fixture_logits(tsr_model *m, const char *kind, const char *name) {
    char ref_path[4200];
    snprintf(ref_path, sizeof ref_path, "%s/tests/data/fixtures/%s/%s/reference.safetensors", src_dir(), kind, name);
    tsr_error err;
    tsr_error_clear(&err);
    tsr_safetensors *ref;
    assert_int_equal(tsr_safetensors_open(ref_path, &ref, &err), TSR_OK);
    int n_ids;
    int32_t *ids = read_i32(ref_tensor(ref, "input_ids", TSR_DTYPE_I32), &n_ids);
    check_logits(m, ids, n_ids, ref_tensor(ref, "logits", TSR_DTYPE_F32), 1e-3, name);
    free(ids);
    tsr_safetensors_free(ref);
}

/* Each weight's role (tsr_weight.role: expert, router, dense) as the host
 * loads it: the mixtures of experts through tests/plugins' test_gemv_roles, which
 * refuses a weight whose role is not the one its canonical name says
 * (experts prepared on demand included), linked into a temporary catalog
 * beside the engine's plugins; the logits still the references'. */
static void test_weight_roles(void **state) {
    (void)state;
    char tmp[] = "/tmp/tsr_roles_XXXXXX", catalog[4096], asm_roles[4096], cmd[4200];
    assert_non_null(mkdtemp(tmp));
    test_gemv_catalog(tmp, "test_gemv_roles", catalog, asm_roles);
    const char *const fams[][2] = {{"transformers", "mixtral"}, {"transformers", "qwen3_moe"}, {"numpy", "qwen2_moe"}};
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        tsr_model *m = fixture_through(fams[i][0], fams[i][1], asm_roles, catalog);
        fixture_logits(m, fams[i][0], fams[i][1]);
        tsr_model_free(m);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    assert_int_equal(system(cmd), 0);
}

/* The host's fused forward pass (tsr_gemv_i.run_fused: the input norms
 * taken into q/k/v, gate/up and the LM head, the residual adds into o and
 * down) on the CPU, through tests/plugins' test_gemv_fused, which fuses
 * every one at every row count in f64, and folds the norm after o and down
 * into them and the product after: each family's logits still the
 * references', and the plugin's count of fused calls of each kind grew
 * (so the pass took them; the mixtures' layers fold nothing), and every
 * fold made was used. */
static void test_fused_pass(void **state) {
    (void)state;
    char tmp[] = "/tmp/tsr_fused_XXXXXX", catalog[4096], asm_fused[4096], lib[4200], cmd[4200];
    assert_non_null(mkdtemp(tmp));
    test_gemv_catalog(tmp, "test_gemv_fused", catalog, asm_fused);
    const char *const fams[][2] = {{"transformers", "llama"},   {"transformers", "qwen2"},
                                   {"transformers", "qwen3"},   {"transformers", "mixtral"},
                                   {"transformers", "qwen3_moe"}, {"numpy", "qwen2_moe"}};
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        tsr_model *m = fixture_through(fams[i][0], fams[i][1], asm_fused, catalog);
        /* the library the model loaded, found again by its path */
        snprintf(lib, sizeof lib, "%s/libtest_gemv_fused.so", catalog);
        void *dl = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
        assert_non_null(dl);
        int64_t (*calls)(int32_t) = NULL;
        *(void **)&calls = dlsym(dl, "test_gemv_fused_calls");
        assert_non_null(calls);
        int64_t before[5];
        for (int k = 0; k < 5; k++) before[k] = calls(k);
        fixture_logits(m, fams[i][0], fams[i][1]);
        const int dense = i < 3; /* the mixtures' layers have no dense MLP, so no fused gate/up, no fold */
        for (int k = 0; k < 5; k++) {
            const int64_t now = calls(k);
            printf("# %s: %lld fused calls of kind %d\n", fams[i][1], (long long)(now - before[k]), k);
            if (now <= before[k] && ((k != 1 && k < 3) || dense))
                fail_msg("%s: no fused call of kind %d (0 norm, 1 gate/up, 2 add, 3 fold, 4 folded)", fams[i][1], k);
        }
        if (calls(3) - before[3] != calls(4) - before[4])
            fail_msg("%s: %lld folds made, %lld used", fams[i][1], (long long)(calls(3) - before[3]),
                     (long long)(calls(4) - before[4]));
        dlclose(dl); /* the model's own handle keeps it loaded until tsr_model_free */
        tsr_model_free(m);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    assert_int_equal(system(cmd), 0);
}

/* stories260K from one of its files: logits (when tol > 0) and greedy text of
 * every reference.json case. */
static void check_stories(const char *file, const char *tokenizer, double tol) {
    char model[4096], tok[4096], ref_path[4096], json_path[4096];
    const char *base = src_dir();
    snprintf(model, sizeof model, "%s/models/stories260K/%s", base, file);
    if (tokenizer) snprintf(tok, sizeof tok, "%s/models/stories260K/%s", base, tokenizer);
    snprintf(ref_path, sizeof ref_path, "%s/models/stories260K/hf/reference.safetensors", base);
    snprintf(json_path, sizeof json_path, "%s/models/stories260K/hf/reference.json", base);
    tsr_safetensors *ref;
    tsr_error err;
    tsr_error_clear(&err);
    assert_int_equal(tsr_safetensors_open(ref_path, &ref, &err), TSR_OK);
    json_error_t jerr;
    json_t *root = json_load_file(json_path, 0, &jerr);
    assert_non_null(root);
    json_t *cases = json_object_get(root, "cases");
    assert_true(json_is_array(cases));
    tsr_model *m = load(model, tokenizer ? tok : NULL, 0);
    for (size_t c = 0; c < json_array_size(cases); c++) {
        char name[64], what[256];
        int n_ids, n_greedy;
        snprintf(name, sizeof name, "input_ids_%zu", c);
        int32_t *ids = read_i32(ref_tensor(ref, name, TSR_DTYPE_I32), &n_ids);
        snprintf(name, sizeof name, "greedy_ids_%zu", c);
        int32_t *expect = read_i32(ref_tensor(ref, name, TSR_DTYPE_I32), &n_greedy);
        snprintf(what, sizeof what, "%s case %zu", file, c);
        if (tol > 0) {
            snprintf(name, sizeof name, "logits_%zu", c);
            check_logits(m, ids, n_ids, ref_tensor(ref, name, TSR_DTYPE_F32), tol, what);
        }
        char *text = greedy(m, ids, n_ids, expect, n_greedy, what);
        const char *want = json_string_value(json_object_get(json_array_get(cases, c), "greedy_text"));
        assert_non_null(want);
        if (strcmp(text, want)) fail_msg("%s: text\n  got  '%s'\n  want '%s'", what, text, want);
        free(text);
        free(ids);
        free(expect);
    }
    tsr_model_free(m);
    json_decref(root);
    tsr_safetensors_free(ref);
}

static void test_stories_hf(void **state) { (void)state; check_stories("hf", "tok512.bin", 1e-3); }
static void test_stories_gguf(void **state) { (void)state; check_stories("stories260K.gguf", NULL, 1e-3); }
static void test_stories_llama2c(void **state) {
    (void)state;
    check_stories("stories260K.bin", "tok512.bin", 1e-3);
}

/* Logits of every row of one forward pass of n fixed pseudo-random ids,
 * with n_threads threads. */
static float *all_logits(const char *model, int no_tokenizer, int threads, int n, int *vocab) {
    tsr_model *m = load_threads(model, NULL, no_tokenizer, threads);
    *vocab = tsr_model_get_config(m)->vocab;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    assert_non_null(ids);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 7919u + 13u) % (unsigned)*vocab);
    float *logits = seq_logits(m, ids, n);
    tsr_model_free(m);
    free(ids);
    return logits;
}

/* However a pass of many rows is split over threads (the plugins' shares of
 * rows, panels and attention tiles), the logits of every row must be bit for
 * bit those of one thread. */
static void check_threads_identical(const char *model, int no_tokenizer, int n) {
    int vocab, vocab2;
    float *one = all_logits(model, no_tokenizer, 1, n, &vocab);
    float *two = all_logits(model, no_tokenizer, 2, n, &vocab2);
    assert_int_equal(vocab, vocab2);
    size_t bad = 0, total = (size_t)n * (size_t)vocab;
    for (size_t i = 0; i < total; i++) bad += memcmp(&one[i], &two[i], sizeof one[i]) != 0;
    printf("# %s: %d rows, %zu of %zu logits differ between 1 and 2 threads\n", model, n, bad, total);
    assert_int_equal(bad, 0);
    free(one);
    free(two);
}

static void test_threads_identical_stories(void **state) {
    (void)state;
    char model[4096];
    snprintf(model, sizeof model, "%s/models/stories260K/hf", src_dir());
    check_threads_identical(model, 1, 300); /* chunks of 128 rows and a tail */
}

static void test_threads_identical_pystd(void **state) {
    (void)state;
    const char *shared = getenv("TESSERA_SHARED_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/data/models/pystd/target", shared ? shared : "../shared");
    if (access(dir, R_OK) != 0) skip();
    check_threads_identical(dir, 1, 96);
}

/* The CLI prints exactly the greedy text. */
static void test_cli_run_prints_greedy_text(void **state) {
    (void)state;
    const char *bin = getenv("TESSERA_BIN");
    if (!bin) skip();
    char json_path[4096], cmd[8192];
    snprintf(json_path, sizeof json_path, "%s/models/stories260K/hf/reference.json", src_dir());
    json_error_t jerr;
    json_t *root = json_load_file(json_path, 0, &jerr);
    assert_non_null(root);
    json_t *c0 = json_array_get(json_object_get(root, "cases"), 0);
    const char *prompt = json_string_value(json_object_get(c0, "prompt"));
    const char *want = json_string_value(json_object_get(c0, "greedy_text"));
    size_t n_greedy = json_array_size(json_object_get(c0, "greedy_ids"));
    snprintf(cmd, sizeof cmd, "'%s' run -p '%s' -n %zu --ignore-eos --threads 1 2>/dev/null", bin, prompt,
             n_greedy);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    assert_int_equal(pclose(p), 0);
    if (strcmp(out, want)) fail_msg("tessera run printed\n  '%s'\nwant\n  '%s'", out, want);
    json_decref(root);
}

int main(void) {
    snprintf(asm_path, sizeof asm_path, "%s/assemblies/cpu-reference.yaml", src_dir());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_mixtral),
        cmocka_unit_test(test_qwen3_moe),
        cmocka_unit_test(test_qwen2_moe),
        cmocka_unit_test(test_weight_roles),
        cmocka_unit_test(test_fused_pass),
        cmocka_unit_test(test_pystd_target),
        cmocka_unit_test(test_pystd_draft),
        cmocka_unit_test(test_pystd_moe),
        cmocka_unit_test(test_stories_hf),
        cmocka_unit_test(test_stories_gguf),
        cmocka_unit_test(test_stories_llama2c),
        cmocka_unit_test(test_cli_run_prints_greedy_text),
        cmocka_unit_test(test_threads_identical_stories),
        cmocka_unit_test(test_threads_identical_pystd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
