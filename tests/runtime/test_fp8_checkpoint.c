/*
 * FP8 E4M3 checkpoints read as stored (docs/FORMATS.md): the transformers
 * fixtures converted by tools/mk_fp8_checkpoint (built next to this test)
 * into each scale style, in a temporary folder.
 *
 * - The reference assembly on an FP8 checkpoint gives bit for bit the logits
 *   it gives on the dequantised weights stored as f32 (ref_gemv multiplies
 *   each widened code by its scale in f32, the tool stored that same f32
 *   product), for every style: per tensor, per channel (bf16 scales),
 *   blocks of 16 x 24 (partial blocks at the edges) and of 128 x 128; on
 *   the llama, qwen2, qwen3 and qwen3_moe fixtures, the numpy qwen2_moe one
 *   (a shared expert), and on the trained pystd
 *   target (bf16, sharded, tied embeddings) when ../shared holds it.
 * - Those logits stay within a mean KL of 0.1 (the bound cuda_gemv_fp8
 *   declares for the same e4m3 rounding of the weights) of transformers'
 *   logits of the original fixture, and the mean KL is printed.
 * - Bad companions are refused naming the tensor: scale shapes and dtypes,
 *   a missing scale, negative scales, static activation scales, unknown
 *   tensors, an unknown quant_method; a plugin of gemv interface version 2
 *   is refused by the host.
 * - The fast CPU plugins on the same checkpoints: cpu_gemv (every style)
 *   within rounding of the reference's logits, cpu_gemv_int8
 *   (every style) bit for bit its logits on the dequantised checkpoint
 *   (check_fast).
 */
#include <math.h>
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
#include <limits.h>

#include "core/format/safetensors.h"
#include "core/runtime/runtime.h"
#include "tests/runtime/seq_logits.h"

#include "tests/runtime/fp8_fixture.h"
#include "tests/runtime/test_gemv_catalog.h"

#define KL_BOUND 0.1

static int try_load(const char *model, const char *assembly, tsr_model **m, tsr_error *err) {
    char asm_path[4096];
    snprintf(asm_path, sizeof asm_path, "%s/assemblies/%s", fp8_src_dir(), assembly);
    tsr_model_opts o = {.model_path = model, .assembly_path = asm_path, .n_threads = 2, .no_tokenizer = 1};
    tsr_error_clear(err);
    *m = NULL;
    return tsr_model_load(&o, m, err);
}

static tsr_model *load(const char *model, const char *assembly) {
    tsr_error err;
    tsr_model *m;
    if (try_load(model, assembly, &m, &err) != TSR_OK) fail_msg("loading %s: %s", model, err.msg);
    return m;
}

/* Mean over positions of KL(softmax(ref) || softmax(got)), in f64. */
static double mean_kl(const void *ref_raw, const float *got, int n, int vocab) {
    double sum = 0.0;
    for (int t = 0; t < n; t++) {
        const float *g = got + (size_t)t * vocab;
        double rmax = -INFINITY, gmax = -INFINITY, rz = 0.0, gz = 0.0, kl = 0.0;
        for (int v = 0; v < vocab; v++) {
            float r;
            memcpy(&r, (const char *)ref_raw + ((size_t)t * vocab + v) * 4, 4);
            rmax = fmax(rmax, r), gmax = fmax(gmax, g[v]);
        }
        for (int v = 0; v < vocab; v++) {
            float r;
            memcpy(&r, (const char *)ref_raw + ((size_t)t * vocab + v) * 4, 4);
            rz += exp(r - rmax), gz += exp(g[v] - gmax);
        }
        for (int v = 0; v < vocab; v++) {
            float r;
            memcpy(&r, (const char *)ref_raw + ((size_t)t * vocab + v) * 4, 4);
            const double lp = r - rmax - log(rz), lq = g[v] - gmax - log(gz);
            kl += exp(lp) * (lp - lq);
        }
        sum += kl;
    }
    return sum / n;
}

/* The fast CPU gemv plugins on the same FP8 checkpoint, against the
 * reference's logits ref: cpu_gemv (exact: each row's or each block's sum
 * of codes times activations, times its scale; the sequence in one pass,
 * then a token a pass for the decode kernels) within rounding, the same
 * argmax wherever the reference's top two are apart by more than that;
 * cpu_gemv_int8 (every style: each row widened, times its scales, then
 * quantised) bit for bit the logits it gives on the dequantised f32
 * checkpoint (the same f32 weights before quantising; its own loss against
 * the reference is the fixture's, printed: test_cpu_gemv_models bounds it
 * on the fixed text). */
static void check_fast(const char *dir, const char *deq, const char *name, const int32_t *ids, int n,
                       const float *ref, int vocab) {
    for (int steps = 0; steps < 2; steps++) {
        tsr_model *mf = load(dir, "cpu-fast-gemv.yaml");
        float *f = seq_logits_by(mf, ids, n, steps); /* one pass, then a token a pass (the decode kernels) */
        double worst = 0, scale = 0;
        for (size_t i = 0; i < (size_t)n * vocab; i++) {
            const double d = fabs((double)f[i] - ref[i]);
            if (!(d <= worst)) worst = d;
            if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
        }
        const double tol = 1e-3 * (1 + scale);
        printf("# %s: cpu_gemv (%s) max |logits - reference| %.3g (bound %.3g)\n", name,
               steps ? "a token a pass" : "one pass", worst, tol);
        if (!(worst <= tol)) fail_msg("%s: cpu_gemv's logits differ from the reference's by %g", name, worst);
        for (int t = 0; t < n; t++) {
            const float *r = ref + (size_t)t * vocab, *g = f + (size_t)t * vocab;
            int best = 0, second = -1;
            for (int v = 1; v < vocab; v++)
                if (r[v] > r[best]) second = best, best = v;
                else if (second < 0 || r[v] > r[second]) second = v;
            int got = 0;
            for (int v = 1; v < vocab; v++)
                if (g[v] > g[got]) got = v;
            if (r[best] - r[second] > 2 * tol && got != best)
                fail_msg("%s: position %d: cpu_gemv's argmax %d, the reference's %d", name, t, got, best);
        }
        free(f);
        tsr_model_free(mf);
    }
    tsr_model *mi = load(dir, "cpu-fast-gemv-int8.yaml"), *md = load(deq, "cpu-fast-gemv-int8.yaml");
    float *q = seq_logits(mi, ids, n), *qd = seq_logits(md, ids, n);
    size_t differ = 0;
    for (size_t i = 0; i < (size_t)n * vocab; i++) differ += memcmp(&q[i], &qd[i], 4) != 0;
    printf("# %s: cpu_gemv_int8 logits %s those on the dequantised checkpoint; mean KL(reference || int8) "
           "%.3g\n", name, differ ? "DIFFER from" : "bit-identical to", mean_kl(ref, q, n, vocab));
    if (differ) fail_msg("%s: %zu of cpu_gemv_int8's logits differ from its logits on the dequantised f32 "
                         "checkpoint", name, differ);
    free(q), free(qd);
    tsr_model_free(mi);
    tsr_model_free(md);
}

static void check_style(const char *family, const char *style, const char *args) {
    char dir[4096], deq[4096], fix[4096], ref_path[4200], name[128];
    snprintf(name, sizeof name, "%s-%s", family[0] == '/' ? strrchr(family, '/') + 1 : family, style);
    fp8_make_ckpt(family, name, args, dir, deq, sizeof dir);
    fp8_fixture_dir(family, fix, sizeof fix);
    snprintf(ref_path, sizeof ref_path, "%s/reference.safetensors", fix);
    tsr_safetensors *ref;
    tsr_error err;
    tsr_error_clear(&err);
    assert_int_equal(tsr_safetensors_open(ref_path, &ref, &err), TSR_OK);
    const tsr_tensor *ids_t = tsr_safetensors_find(ref, "input_ids");
    const tsr_tensor *logits_t = tsr_safetensors_find(ref, "logits");
    assert_non_null(ids_t);
    assert_non_null(logits_t);
    const int n = (int)ids_t->shape[0];
    int32_t *ids = malloc(ids_t->nbytes);
    memcpy(ids, ids_t->data, ids_t->nbytes);

    tsr_model *m8 = load(dir, "cpu-reference.yaml");
    tsr_model *md = load(deq, "cpu-reference.yaml");
    const int vocab = tsr_model_get_config(m8)->vocab;
    assert_int_equal(tsr_model_get_config(m8)->dtype, TSR_DTYPE_F8_E4M3);
    float *a = seq_logits(m8, ids, n), *b = seq_logits(md, ids, n);
    size_t differ = 0;
    for (size_t i = 0; i < (size_t)n * vocab; i++) differ += memcmp(&a[i], &b[i], 4) != 0;
    if (differ) fail_msg("%s: %zu of %d x %d logits differ from the dequantised f32 checkpoint's", name,
                         differ, n, vocab);
    const double kl = mean_kl(logits_t->data, a, n, vocab);
    printf("# %s: logits bit-identical to the dequantised f32 checkpoint; mean KL to the fixture's reference "
           "%.4g (bound %g)\n", name, kl, KL_BOUND);
    if (!(kl <= KL_BOUND)) fail_msg("%s: mean KL %g > %g", name, kl, KL_BOUND);
    check_fast(dir, deq, name, ids, n, a, vocab);
    free(a), free(b), free(ids);
    tsr_model_free(m8);
    tsr_model_free(md);
    tsr_safetensors_free(ref);
}

static void test_llama_tensor(void **s) { (void)s; check_style("llama", "tensor", "--style tensor"); }
static void test_llama_channel(void **s) {
    (void)s;
    check_style("llama", "channel", "--style channel --scale-dtype bf16");
}
static void test_llama_block16x24(void **s) { (void)s; check_style("llama", "block", "--style block --block 16,24"); }
static void test_llama_block128(void **s) { (void)s; check_style("llama", "block128", "--style block"); }
static void test_qwen3_channel(void **s) { (void)s; check_style("qwen3", "channel", "--style channel"); }
static void test_qwen3_block(void **s) { (void)s; check_style("qwen3", "block", "--style block --block 32,16"); }
static void test_qwen2_tensor(void **s) { (void)s; check_style("qwen2", "tensor", "--style tensor"); }
static void test_qwen3_lm_head(void **s) { (void)s; check_style("qwen3", "lm_head", "--style tensor --lm-head"); }
static void test_qwen3_moe_channel(void **s) { (void)s; check_style("qwen3_moe", "channel", "--style channel"); }
/* a shared expert's projections FP8 too, its gate and the router kept (as
 * FP8 checkpoints keep them); the numpy fixture's references */
static void test_qwen2_moe_block(void **s) {
    (void)s;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/data/fixtures/numpy/qwen2_moe", fp8_src_dir());
    check_style(dir, "block", "--style block --block 16,16");
}

/* The trained pystd target (bf16, sharded, tied embeddings) in ../shared,
 * when present. */
static void check_pystd(const char *style, const char *args) {
    const char *shared = getenv("TESSERA_SHARED_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/data/models/pystd/target", shared ? shared : "../shared");
    if (access(dir, R_OK) != 0) {
        printf("# %s absent: skipped (it needs the project's shared data)\n", dir);
        skip();
    }
    char abs[PATH_MAX]; /* check_style takes a folder by its absolute path */
    if (!realpath(dir, abs)) fail_msg("realpath %s", dir);
    check_style(abs, style, args);
}

static void test_pystd_channel(void **s) { (void)s; check_pystd("channel", "--style channel"); }
static void test_pystd_block128(void **s) { (void)s; check_pystd("block128", "--style block"); }

/* --- refusals ------------------------------------------------------------------------- */

typedef struct edit {
    const char *name;     /* the tensor to change (NULL: none) */
    int drop;             /* remove it */
    uint32_t dtype;       /* TSR_DTYPE_COUNT: keep */
    int n_dims;           /* 0 with shape0 < 0: keep */
    int64_t shape0, shape1;
    float fill;           /* with a new shape or dtype: every value (as f32, or i32) */
    const char *add;      /* a tensor to add: f32 [1] = 1 */
    const char *quant;    /* a quant_method to write into config.json */
    const char *drop_key; /* a key to remove from quantization_config */
} edit;

/* src (an FP8 checkpoint) with one edit, into dst. */
static void rewrite(const char *src, const char *dst, const edit *e) {
    char p[4200], q[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", src);
    tsr_safetensors *st;
    tsr_error err;
    tsr_error_clear(&err);
    assert_int_equal(tsr_safetensors_open(p, &st, &err), TSR_OK);
    const int n = tsr_safetensors_n_tensors(st);
    tsr_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    float *buf = NULL;
    int k = 0;
    for (int i = 0; i < n; i++) {
        tsr_tensor t = *tsr_safetensors_tensor_at(st, i);
        if (e->name && !strcmp(t.name, e->name)) {
            if (e->drop) continue;
            if (e->dtype != TSR_DTYPE_COUNT) t.dtype = e->dtype;
            if (e->shape0 >= 0) {
                t.n_dims = e->n_dims;
                t.shape[0] = e->shape0;
                t.shape[1] = e->shape1;
            }
            uint64_t cnt = 1;
            for (int d = 0; d < t.n_dims; d++) cnt *= (uint64_t)t.shape[d];
            buf = calloc(cnt, 4);
            for (uint64_t j = 0; j < cnt; j++) {
                if (t.dtype == TSR_DTYPE_I32) {
                    int32_t v = (int32_t)e->fill;
                    memcpy(&buf[j], &v, 4);
                } else {
                    buf[j] = e->fill;
                }
            }
            assert_true(t.dtype == TSR_DTYPE_F32 || t.dtype == TSR_DTYPE_I32);
            t.data = buf;
            t.nbytes = cnt * 4;
        }
        ts[k++] = t;
    }
    static const float one = 1.0f;
    if (e->add) ts[k++] = (tsr_tensor){.name = e->add, .dtype = TSR_DTYPE_F32, .n_dims = 1, .shape = {1},
                                       .data = &one, .nbytes = 4};
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dst);
    assert_int_equal(system(cmd), 0);
    snprintf(q, sizeof q, "%s/model.safetensors", dst);
    assert_int_equal(tsr_safetensors_write(q, ts, k, NULL, &err), TSR_OK);
    snprintf(p, sizeof p, "%s/config.json", src);
    json_error_t je;
    json_t *cfg = json_load_file(p, 0, &je);
    assert_non_null(cfg);
    if (e->quant)
        json_object_set_new(json_object_get(cfg, "quantization_config"), "quant_method", json_string(e->quant));
    if (e->drop_key) json_object_del(json_object_get(cfg, "quantization_config"), e->drop_key);
    snprintf(q, sizeof q, "%s/config.json", dst);
    assert_int_equal(json_dump_file(cfg, q, 0), 0);
    json_decref(cfg);
    free(buf);
    free(ts);
    tsr_safetensors_free(st);
}

/* Loading dir is refused with rc, the message naming what. */
static void expect_refused(const char *dir, const char *assembly, int rc, const char *what) {
    tsr_model *m;
    tsr_error err;
    int got = try_load(dir, assembly, &m, &err);
    printf("# %s: %s\n", dir, err.msg);
    if (got != rc) fail_msg("%s: status %d, expected %d (%s)", dir, got, rc, err.msg);
    if (!strstr(err.msg, what)) fail_msg("%s: the error does not name %s: %s", dir, what, err.msg);
    assert_null(m);
}

#define WQ "model.layers.1.self_attn.q_proj.weight"
#define SQ "model.layers.1.self_attn.q_proj.weight_scale"

static void refused(const char *base, const char *name, const edit *e, int rc, const char *what) {
    char dst[4096];
    snprintf(dst, sizeof dst, "%s/%s", fp8_tmp_root, name);
    rewrite(base, dst, e);
    expect_refused(dst, "cpu-reference.yaml", rc, what);
}

static void test_refusals(void **s) {
    (void)s;
    char ch[4096], blk[4096], st[4096];
    fp8_make_ckpt("llama", "r-channel", "--style channel", ch, NULL, sizeof ch);
    fp8_make_ckpt("llama", "r-block", "--style block --block 16,16", blk, NULL, sizeof blk);
    const int K = TSR_DTYPE_COUNT;
    /* per-group [rows, 2]: neither per tensor nor per channel */
    refused(ch, "shape-group", &(edit){SQ, 0, K, 2, 64, 2, 0.5f, NULL, NULL, NULL}, TSR_ERR_UNSUPPORTED, SQ);
    /* per channel of the wrong length */
    refused(ch, "shape-rows", &(edit){SQ, 0, K, 2, 32, 1, 0.5f, NULL, NULL, NULL}, TSR_ERR_UNSUPPORTED, SQ);
    /* an integer scale */
    refused(ch, "dtype", &(edit){SQ, 0, TSR_DTYPE_I32, 2, 64, 1, 1, NULL, NULL, NULL}, TSR_ERR_UNSUPPORTED, SQ);
    /* negative and NaN scales */
    refused(ch, "negative", &(edit){SQ, 0, K, 2, 64, 1, -0.5f, NULL, NULL, NULL}, TSR_ERR_FORMAT, SQ);
    refused(ch, "nan", &(edit){SQ, 0, K, 2, 64, 1, NAN, NULL, NULL, NULL}, TSR_ERR_FORMAT, SQ);
    /* no scale at all */
    refused(ch, "missing", &(edit){SQ, 1, K, 0, -1, 0, 0, NULL, NULL, NULL}, TSR_ERR_UNSUPPORTED, WQ);
    /* a scale of a weight that is not F8 (the layer norm) */
    refused(ch, "stray", &(edit){NULL, 0, K, 0, -1, 0, 0, "model.layers.0.input_layernorm.weight_scale", NULL, NULL},
            TSR_ERR_FORMAT, "model.layers.0.input_layernorm.weight_scale");
    /* a tensor nobody knows (a KV-cache scale) */
    refused(ch, "unknown", &(edit){NULL, 0, K, 0, -1, 0, 0, "model.layers.0.self_attn.k_scale", NULL, NULL},
            TSR_ERR_UNSUPPORTED, "model.layers.0.self_attn.k_scale");
    /* a method that is not FP8 */
    refused(ch, "gptq", &(edit){NULL, 0, K, 0, -1, 0, 0, NULL, "gptq", NULL}, TSR_ERR_UNSUPPORTED, "gptq");
    /* blocks: a grid of the wrong size ([4, 4] for 64 x 64 in 16 x 16 blocks) */
    refused(blk, "grid", &(edit){SQ "_inv", 0, K, 2, 4, 3, 0.5f, NULL, NULL, NULL}, TSR_ERR_FORMAT, SQ "_inv");
    /* blocks without the config's weight_block_size */
    refused(blk, "no-block-size", &(edit){NULL, 0, K, 0, -1, 0, 0, NULL, NULL, "weight_block_size"},
            TSR_ERR_UNSUPPORTED, "weight_scale_inv");
    /* static activation scales */
    fp8_make_ckpt("llama", "r-static", "--style tensor --static-input-scales", st, NULL, sizeof st);
    expect_refused(st, "cpu-reference.yaml", TSR_ERR_UNSUPPORTED, ".input_scale");
}

/* A gemv plugin of interface version 2 (tests/plugins: test_gemv_v2, which
 * would take f8_e4m3 as stored) is never handed a scaled weight: the host
 * refuses the model naming the plugin. It is linked into a temporary catalog
 * beside the engine's plugins. */
static void test_old_plugin_refused(void **s) {
    (void)s;
    char catalog[4096], asm_path[4096], ch[4096];
    test_gemv_catalog(fp8_tmp_root, "test_gemv_v2", catalog, asm_path);
    fp8_make_ckpt("llama", "v2-channel", "--style channel", ch, NULL, sizeof ch);
    tsr_model_opts o = {.model_path = ch, .assembly_path = asm_path, .catalog_dir = catalog, .n_threads = 2,
                        .no_tokenizer = 1};
    tsr_error err;
    tsr_error_clear(&err);
    tsr_model *m = NULL;
    int rc = tsr_model_load(&o, &m, &err);
    printf("# %s\n", err.msg);
    assert_int_equal(rc, TSR_ERR_UNSUPPORTED);
    assert_null(m);
    if (!strstr(err.msg, "test_gemv_v2") || !strstr(err.msg, "version 2") || !strstr(err.msg, "_proj.weight"))
        fail_msg("the refusal names neither the plugin, its version nor the weight: %s", err.msg);
}

/* Dynamic activation scales are ignored where the config says so, and
 * FBGEMM's bounds on them. */
static void test_dynamic_input_scale_ignored(void **s) {
    (void)s;
    char ch[4096], dst[4096];
    fp8_make_ckpt("llama", "f-channel", "--style channel", ch, NULL, sizeof ch);
    snprintf(dst, sizeof dst, "%s/f-fbgemm", fp8_tmp_root);
    rewrite(ch, dst, &(edit){NULL, 0, TSR_DTYPE_COUNT, 0, -1, 0, 0, "model.layers.0.mlp.up_proj.input_scale_ub",
                             "fbgemm_fp8", NULL});
    tsr_model_free(load(dst, "cpu-reference.yaml"));
    fp8_make_ckpt("llama", "d-channel", "--style channel", ch, NULL, sizeof ch);
    snprintf(dst, sizeof dst, "%s/d-with-input-scale", fp8_tmp_root);
    rewrite(ch, dst,
            &(edit){NULL, 0, TSR_DTYPE_COUNT, 0, -1, 0, 0, "model.layers.0.mlp.up_proj.input_scale", NULL, NULL});
    tsr_model_free(load(dst, "cpu-reference.yaml"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_tensor),
        cmocka_unit_test(test_llama_channel),
        cmocka_unit_test(test_llama_block16x24),
        cmocka_unit_test(test_llama_block128),
        cmocka_unit_test(test_qwen3_channel),
        cmocka_unit_test(test_qwen3_block),
        cmocka_unit_test(test_qwen2_tensor),
        cmocka_unit_test(test_qwen3_lm_head),
        cmocka_unit_test(test_qwen3_moe_channel),
        cmocka_unit_test(test_qwen2_moe_block),
        cmocka_unit_test(test_pystd_channel),
        cmocka_unit_test(test_pystd_block128),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_dynamic_input_scale_ignored),
        cmocka_unit_test(test_old_plugin_refused),
    };
    return cmocka_run_group_tests(tests, fp8_setup, fp8_teardown);
}
