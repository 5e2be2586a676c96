/*
 * cuda_attention's tensor-core prefill kernel (plugins/cuda_attention/
 * prefill.cu; ctest label "gpu", skipped cleanly where no CUDA device is
 * present).
 *
 * 1. Random q (f32) and K/V (bf16) over a table of shapes (rows 33..600,
 *    pos0 0 and > 0, no window and windows, GQA groups 1..64, head_dim 16,
 *    32, 64, 128, a head-major KV layout, stored tokens past pos0 + rows
 *    holding NaN that must never be read), the kernel called directly
 *    against a plain f64 CPU reference over the same bf16 keys and values.
 *    Bound, from the plugin's exactness claim (q and the softmax weights
 *    enter the tensor cores as two bf16 halves, 16 significant bits):
 *        |out - ref| <= 1e-3 * max|ref| + 1e-5 for every element, and
 *        NMSE = sum (out - ref)^2 / sum ref^2 <= 1e-7 (the conformance
 *        harness's bound for exact attention plugins);
 *    nothing written past out (guard values).
 * 2. The same cases through the cuda_attention plugin from the catalog:
 *    its output must be bit for bit the direct kernel's for passes of more
 *    than 32 rows; fewer rows (verification of drafts) have their keys cut
 *    into tile_splits blocks: held to the bound of 1.
 *    Then the kernel with the keys cut into 3 and 8 splits merged by a
 *    second kernel (cuda_attn_prefill_split), held to the bound of 1.
 * 3. The transformers fixtures (head_dim 16) on cuda-fast, 100 random tokens
 *    as one pass and as passes of 40 + 60 rows, against the cpu-reference
 *    assembly's logits: |diff| <= 0.02 + 5% of the row's max |logit| (the
 *    bound of test_cuda.c for bf16 weights, activations and KV).
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "tests/gpu/gpu_env.h"

#include "core/runtime/runtime.h"
#include "kernels/dtype.h"
#include "slots/tsr_attention.h"
#ifdef TESSERA_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda/device.h"
#include "plugins/cuda_attention/prefill.h"
#endif

#define TOL_REL 1e-3
#define TOL_ABS 1e-5
#define TOL_NMSE 1e-7
#define GUARD 64          /* floats after out that must keep GUARD_VALUE */
#define GUARD_VALUE 12345.0f

typedef struct pcase {
    int rows, pos0, n_heads, n_kv_heads, head_dim, window;
    int head_major; /* KV [n_kv_heads][tokens][head_dim] instead of [tokens][n_kv_heads][head_dim] */
    int extra;      /* tokens stored past pos0 + rows, all NaN */
} pcase;

static const pcase cases[] = {
    {33, 0, 8, 8, 64, 0, 0, 0},        /* group 1, the fewest rows the plugin sends here */
    {64, 0, 32, 8, 128, 0, 0, 0},      /* group 4, one full block of keys */
    {512, 0, 32, 8, 128, 0, 0, 5},     /* the Llama-3-8B prefill shape */
    {100, 37, 32, 4, 128, 0, 0, 0},    /* group 8, a continued sequence */
    {257, 300, 16, 4, 64, 0, 1, 3},    /* head-major KV */
    {600, 0, 8, 1, 64, 0, 0, 0},       /* group 8, head_dim 64 */
    {200, 50, 8, 2, 128, 64, 0, 7},    /* a window */
    {77, 500, 4, 4, 64, 100, 0, 0},    /* a window, group 1 */
    {345, 0, 14, 2, 64, 31, 0, 0},     /* group 7, a window not a multiple of the key tile */
    {50, 7, 8, 2, 64, 1, 0, 0},        /* window 1: every row sees only itself */
    {65, 3, 8, 8, 128, 1000, 0, 0},    /* a window longer than the sequence */
    {40, 10, 4, 2, 16, 0, 0, 0},       /* head_dim 16 */
    {90, 20, 6, 2, 32, 17, 0, 0},      /* head_dim 32, group 3, a window */
    {35, 0, 64, 1, 64, 0, 0, 2},       /* group 64: one query row per block */
    {8, 700, 32, 8, 128, 0, 0, 3},     /* verification of 7 drafts at Llama-3-8B's shape */
    {3, 40, 8, 2, 64, 16, 0, 0},       /* few rows, a window */
};

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

/* Uniform in [-1, 1). */
static float rng_f(uint64_t *s) { return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

/* Element offset of K/V (t, h, 0) in a case's layout. */
static int64_t kv_off(const pcase *c, int T, int t, int h) {
    return c->head_major ? ((int64_t)h * T + t) * c->head_dim : ((int64_t)t * c->n_kv_heads + h) * c->head_dim;
}

/* Plain f64 attention over the widened bf16 K/V. */
static void reference(const pcase *c, int T, const float *q, const uint16_t *k, const uint16_t *v, float scale,
                      double *out) {
    const int hd = c->head_dim, group = c->n_heads / c->n_kv_heads, keys = c->pos0 + c->rows;
    double *s = malloc((size_t)keys * sizeof *s), *o = malloc((size_t)hd * sizeof *o);
    assert_non_null(s);
    assert_non_null(o);
    for (int i = 0; i < c->rows; i++)
        for (int h = 0; h < c->n_heads; h++) {
            const float *qr = q + ((int64_t)i * c->n_heads + h) * hd;
            const int kvh = h / group, last = c->pos0 + i;
            const int first = c->window > 0 && last - c->window + 1 > 0 ? last - c->window + 1 : 0;
            double mx = -INFINITY, sum = 0;
            for (int t = first; t <= last; t++) {
                const uint16_t *kr = k + kv_off(c, T, t, kvh);
                double acc = 0;
                for (int d = 0; d < hd; d++) acc += (double)qr[d] * tsr_bf16_to_f32(kr[d]);
                s[t] = acc * scale;
                if (s[t] > mx) mx = s[t];
            }
            for (int d = 0; d < hd; d++) o[d] = 0;
            for (int t = first; t <= last; t++) {
                const double w = exp(s[t] - mx);
                const uint16_t *vr = v + kv_off(c, T, t, kvh);
                sum += w;
                for (int d = 0; d < hd; d++) o[d] += w * tsr_bf16_to_f32(vr[d]);
            }
            double *dst = out + ((int64_t)i * c->n_heads + h) * hd;
            for (int d = 0; d < hd; d++) dst[d] = o[d] / sum;
        }
    free(s);
    free(o);
}

#ifdef TESSERA_CUDA

/* --- a minimal host for one cuda_attention instance ------------------------ */

#include "tests/gpu/gpu_host.h"

/* A cuda_attention or cuda_attention_ref instance for c's model shape. */
static gpu_instance *attn_new(const char *name, const pcase *c) {
    const tsr_model_desc md = {.arch = "llama", .n_layers = 1, .hidden = c->n_heads * c->head_dim,
                               .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                               .ffn = 64, .vocab = 256, .max_ctx = c->pos0 + c->rows + c->extra,
                               .weight_dtype = TSR_DTYPE_BF16};
    return gpu_instance_new(name, TSR_SLOT_ATTENTION, &md, NULL, 0);
}

static int instance_run(gpu_instance *in, const tsr_attn_args *a) {
    const tsr_attention_i *it = in->desc->iface;
    tsr_exec ex = {.device = TSR_DEVICE_CUDA, .device_id = 0, .stream = tsr_cuda_stream(), .n_threads = 1};
    plugin_err[0] = 0;
    return it->run(in->inst, a, &ex);
}

/* --- the cases --------------------------------------------------------------- */



static void *dev(size_t bytes) {
    tsr_error err;
    tsr_error_clear(&err);
    void *p = tsr_cuda_malloc(bytes, &err);
    if (!p) fail_msg("device allocation of %zu bytes: %s", bytes, err.msg);
    return p;
}

/* got (qn values and GUARD guards) against the f64 reference: every element
 * within the bound, NMSE within TOL_NMSE, the guards untouched. */
static void check_out(const pcase *c, const char *what, const float *got, const double *want, int64_t qn,
                      double *max_diff, double *bound, double *nmse) {
    double max_ref = 0, num = 0, den = 0;
    for (int64_t i = 0; i < qn; i++)
        if (fabs(want[i]) > max_ref) max_ref = fabs(want[i]);
    *bound = TOL_REL * max_ref + TOL_ABS;
    *max_diff = 0;
    for (int64_t i = 0; i < qn; i++) {
        const double d = fabs((double)got[i] - want[i]);
        if (!(d <= *bound))
            fail_msg("%s, rows %d pos0 %d heads %d/%d d %d window %d: out[%lld] = %.9g, reference %.9g "
                     "(|diff| > %.3g)", what, c->rows, c->pos0, c->n_heads, c->n_kv_heads, c->head_dim, c->window,
                     (long long)i, got[i], want[i], *bound);
        if (d > *max_diff) *max_diff = d;
        num += d * d;
        den += want[i] * want[i];
    }
    for (int i = 0; i < GUARD; i++)
        if (got[qn + i] != GUARD_VALUE) fail_msg("%s wrote past out (guard %d changed)", what, i);
    *nmse = num / den;
    if (!(*nmse <= TOL_NMSE)) fail_msg("%s: nmse %.3g > %.0e", what, *nmse, TOL_NMSE);
}

static void run_case(const pcase *c, uint64_t *rng) {
    const int hd = c->head_dim, T = c->pos0 + c->rows + c->extra;
    const int64_t qn = (int64_t)c->rows * c->n_heads * hd, kvn = (int64_t)T * c->n_kv_heads * hd;
    float *q = malloc((size_t)qn * sizeof *q), *got = malloc((size_t)(qn + GUARD) * sizeof *got);
    float *got_plugin = malloc((size_t)(qn + GUARD) * sizeof *got);
    double *want = malloc((size_t)qn * sizeof *want);
    uint16_t *k = malloc((size_t)kvn * sizeof *k), *v = malloc((size_t)kvn * sizeof *v);
    assert_true(q && got && got_plugin && want && k && v);
    for (int64_t i = 0; i < qn; i++) q[i] = 2.0f * rng_f(rng);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < c->n_kv_heads; h++)
            for (int d = 0; d < hd; d++) {
                const int64_t o = kv_off(c, T, t, h) + d;
                const int tail = t >= c->pos0 + c->rows; /* never to be read */
                k[o] = tail ? 0x7fc0 : tsr_f32_to_bf16(2.0f * rng_f(rng));
                v[o] = tail ? 0x7fc0 : tsr_f32_to_bf16(rng_f(rng));
            }
    const float scale = 1.0f / sqrtf((float)hd);
    reference(c, T, q, k, v, scale, want);

    float *q_d = dev((size_t)qn * sizeof *q), *out_d = dev((size_t)(qn + GUARD) * sizeof *got);
    uint16_t *k_d = dev((size_t)kvn * 2), *v_d = dev((size_t)kvn * 2);
    gpu_upload(q_d, q, (size_t)qn * sizeof *q);
    gpu_upload(k_d, k, (size_t)kvn * 2);
    gpu_upload(v_d, v, (size_t)kvn * 2);
    for (int64_t i = 0; i < qn + GUARD; i++) got[i] = i < qn ? NAN : GUARD_VALUE;
    tsr_kv_view view = {.dtype = TSR_DTYPE_BF16, .layout = TSR_KV_CONTIGUOUS, .n_tokens = T,
                        .n_kv_heads = c->n_kv_heads, .head_dim = hd, .k = k_d, .v = v_d,
                        .token_stride = c->head_major ? hd : (int64_t)c->n_kv_heads * hd,
                        .head_stride = c->head_major ? (int64_t)T * hd : hd};
    tsr_attn_args a = {c->rows, c->pos0, c->n_heads, c->n_kv_heads, hd, scale, c->window, q_d, &view, out_d};

    /* 1. the kernel itself */
    gpu_upload(out_d, got, (size_t)(qn + GUARD) * sizeof *got);
    assert_int_equal(cuda_attn_prefill_supported(&a), 1);
    int rc = cuda_attn_prefill(&a, tsr_cuda_stream());
    if (rc != 0) fail_msg("cuda_attn_prefill: CUDA error %d", rc);
    gpu_download(got, out_d, (size_t)(qn + GUARD) * sizeof *got);
    double max_diff, bound, nmse;
    check_out(c, "the kernel", got, want, qn, &max_diff, &bound, &nmse);

    /* 2. through the plugin: the same kernel, the same bits */
    for (int64_t i = 0; i < qn + GUARD; i++) got_plugin[i] = i < qn ? NAN : GUARD_VALUE;
    gpu_upload(out_d, got_plugin, (size_t)(qn + GUARD) * sizeof *got);
    gpu_instance *in = attn_new("cuda_attention", c);
    rc = instance_run(in, &a);
    if (rc != TSR_OK) fail_msg("cuda_attention run: status %d: %s", rc, plugin_err);
    gpu_download(got_plugin, out_d, (size_t)(qn + GUARD) * sizeof *got);
    gpu_instance_free(in);
    if (c->rows > TSR_GRAPH_MAX_ROWS) { /* unsplit in the plugin too */
        if (memcmp(got, got_plugin, (size_t)(qn + GUARD) * sizeof *got))
            fail_msg("rows %d heads %d/%d d %d: the plugin's output is not the prefill kernel's", c->rows,
                     c->n_heads, c->n_kv_heads, hd);
    } else { /* passes of few rows: the plugin cuts the keys (tile_splits) */
        double d2, b2, n2;
        check_out(c, "the plugin", got_plugin, want, qn, &d2, &b2, &n2);
    }

    /* 3. the keys cut into splits merged by a second kernel (any row count) */
    for (int splits = 3; splits <= 8; splits += 5) {
        float *part_d = dev((size_t)c->rows * c->n_heads * splits * (2 + hd) * sizeof(float));
        for (int64_t i = 0; i < qn + GUARD; i++) got_plugin[i] = i < qn ? NAN : GUARD_VALUE;
        gpu_upload(out_d, got_plugin, (size_t)(qn + GUARD) * sizeof *got);
        rc = cuda_attn_prefill_split(&a, NULL, part_d, splits, 0, tsr_cuda_stream());
        if (rc != 0) fail_msg("cuda_attn_prefill_split (%d splits): CUDA error %d", splits, rc);
        gpu_download(got_plugin, out_d, (size_t)(qn + GUARD) * sizeof *got);
        double d2, b2, n2;
        check_out(c, splits == 3 ? "3 key splits" : "8 key splits", got_plugin, want, qn, &d2, &b2, &n2);
        tsr_cuda_free(part_d);
    }

    printf("# rows %3d pos0 %3d heads %2d/%d d %3d window %4d%s%s: max |diff| %.3g (bound %.3g), nmse %.3g\n",
           c->rows, c->pos0, c->n_heads, c->n_kv_heads, hd, c->window, c->head_major ? " head-major" : "",
           c->extra ? " NaN tail" : "", max_diff, bound, nmse);
    tsr_cuda_free(q_d);
    tsr_cuda_free(out_d);
    tsr_cuda_free(k_d);
    tsr_cuda_free(v_d);
    free(q), free(got), free(got_plugin), free(want), free(k), free(v);
}

/* Microseconds per call of fn over c's shape (random data), for the log:
 * a figure, not a check. */
typedef int (*attn_fn)(const void *ctx, const pcase *c, const tsr_attn_args *a);

static int call_kernel(const void *ctx, const pcase *c, const tsr_attn_args *a) {
    (void)ctx, (void)c;
    return cuda_attn_prefill(a, tsr_cuda_stream());
}

static int call_plugin(const void *ctx, const pcase *c, const tsr_attn_args *a) {
    (void)c;
    return instance_run((gpu_instance *)ctx, a);
}

static double time_shape(const pcase *c, attn_fn fn, const void *ctx) {
    const int hd = c->head_dim, T = c->pos0 + c->rows;
    const int64_t qn = (int64_t)c->rows * c->n_heads * hd, kvn = (int64_t)T * c->n_kv_heads * hd;
    float *q_d = dev((size_t)qn * 4), *out_d = dev((size_t)qn * 4);
    uint16_t *k_d = dev((size_t)kvn * 2), *v_d = dev((size_t)kvn * 2);
    float *q = malloc((size_t)qn * 4);
    uint16_t *kv = malloc((size_t)kvn * 2);
    assert_true(q && kv);
    uint64_t rng = 7;
    for (int64_t i = 0; i < qn; i++) q[i] = rng_f(&rng);
    for (int64_t i = 0; i < kvn; i++) kv[i] = tsr_f32_to_bf16(rng_f(&rng));
    gpu_upload(q_d, q, (size_t)qn * 4);
    gpu_upload(k_d, kv, (size_t)kvn * 2);
    gpu_upload(v_d, kv, (size_t)kvn * 2);
    tsr_kv_view view = {.dtype = TSR_DTYPE_BF16, .layout = TSR_KV_CONTIGUOUS, .n_tokens = T,
                        .n_kv_heads = c->n_kv_heads, .head_dim = hd, .k = k_d, .v = v_d,
                        .token_stride = (int64_t)c->n_kv_heads * hd, .head_stride = hd};
    tsr_attn_args a = {c->rows, c->pos0, c->n_heads, c->n_kv_heads, hd, 1.0f / sqrtf((float)hd), c->window,
                       q_d, &view, out_d};
    cudaStream_t st = (cudaStream_t)tsr_cuda_stream();
    cudaEvent_t e0, e1;
    assert_int_equal(cudaEventCreate(&e0), cudaSuccess);
    assert_int_equal(cudaEventCreate(&e1), cudaSuccess);
    enum { REPS = 20 };
    assert_int_equal(fn(ctx, c, &a), 0); /* warm up */
    assert_int_equal(cudaEventRecord(e0, st), cudaSuccess);
    for (int r = 0; r < REPS; r++) assert_int_equal(fn(ctx, c, &a), 0);
    assert_int_equal(cudaEventRecord(e1, st), cudaSuccess);
    assert_int_equal(cudaEventSynchronize(e1), cudaSuccess);
    float ms = 0;
    assert_int_equal(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    tsr_cuda_free(q_d), tsr_cuda_free(out_d), tsr_cuda_free(k_d), tsr_cuda_free(v_d);
    free(q), free(kv);
    return 1000.0 * ms / REPS;
}

static void test_prefill_kernel(void **state) {
    (void)state;
    GPU_REQUIRE("prefill kernel checks");
    tsr_error err;
    tsr_error_clear(&err);
    if (tsr_cuda_init(0, &err) != TSR_OK) fail_msg("CUDA init: %s", err.msg);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    printf("# seed 0x9e3779b97f4a7c15\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], &rng);
    /* figures for the log: the Llama-3-8B shape, one layer of a 512-token prefill */
    const pcase llama = {512, 0, 32, 8, 128, 0, 0, 0};
    gpu_instance *in = attn_new("cuda_attention", &llama), *in_base = attn_new("cuda_attention_ref", &llama);
    const double t_kernel = time_shape(&llama, call_kernel, NULL);
    const double t_plugin = time_shape(&llama, call_plugin, in);
    const double t_base = time_shape(&llama, call_plugin, in_base);
    printf("# 512 rows, 32/8 heads, head_dim 128: prefill kernel %.1f us, through cuda_attention %.1f us, "
           "cuda_attention_ref %.1f us\n", t_kernel, t_plugin, t_base);
    gpu_instance_free(in);
    gpu_instance_free(in_base);
}

/* Shapes the kernel must decline (the plugin keeps its other paths); host
 * code only, so it runs without a device too. */
static void test_prefill_declines(void **state) {
    (void)state;
    float f = 0;
    _Alignas(16) uint16_t kv[64] = {0};
    tsr_kv_view view = {.dtype = TSR_DTYPE_BF16, .layout = TSR_KV_CONTIGUOUS, .n_tokens = 64, .n_kv_heads = 2,
                        .head_dim = 64, .k = kv, .v = kv, .token_stride = 128, .head_stride = 64};
    tsr_attn_args a = {40, 0, 8, 2, 64, 0.125f, 0, &f, &view, &f};
    assert_int_equal(cuda_attn_prefill_supported(&a), 1);
    a.head_dim = view.head_dim = 96;
    assert_int_equal(cuda_attn_prefill_supported(&a), 0); /* head_dim */
    a.head_dim = view.head_dim = 64;
    view.dtype = TSR_DTYPE_F16;
    assert_int_equal(cuda_attn_prefill_supported(&a), 0); /* dtype */
    view.dtype = TSR_DTYPE_BF16;
    view.token_stride = 132;
    assert_int_equal(cuda_attn_prefill_supported(&a), 0); /* stride */
    view.token_stride = 128;
    a.rows = 65;
    assert_int_equal(cuda_attn_prefill_supported(&a), 0); /* more rows than stored tokens */
    a.rows = 40;
    a.n_heads = 7;
    assert_int_equal(cuda_attn_prefill_supported(&a), 0); /* not a multiple of n_kv_heads */
    a.n_heads = 8;
    view.k = (const uint16_t *)kv + 1;
    assert_int_equal(cuda_attn_prefill_supported(&a), 0); /* unaligned */
    view.k = kv;
    a.head_dim = view.head_dim = 96;
    assert_int_not_equal(cuda_attn_prefill(&a, NULL), 0); /* refused before any launch */
}

/* --- 3. the transformers fixtures end to end ---------------------------------- */

static float *logits_of(const char *model, const char *assembly, const int32_t *ids, int n, int first_pass,
                        int *vocab) {
    char asm_path[4096];
    snprintf(asm_path, sizeof asm_path, "%s/assemblies/%s", gpu_src_dir(), assembly);
    tsr_error err;
    tsr_error_clear(&err);
    tsr_model_opts o = {.model_path = model, .assembly_path = asm_path, .no_tokenizer = 1};
    tsr_model *m;
    if (tsr_model_load(&o, &m, &err) != TSR_OK) fail_msg("%s with %s: %s", model, assembly, err.msg);
    *vocab = tsr_model_get_config(m)->vocab;
    float *lg = malloc((size_t)n * *vocab * sizeof *lg);
    assert_non_null(lg);
    tsr_seq *s;
    assert_int_equal(tsr_seq_new(m, n, &s, &err), TSR_OK);
    for (int at = 0; at < n;) {
        const int rows = at == 0 && first_pass ? first_pass : n - at;
        if (tsr_seq_forward(s, ids + at, rows, lg + (size_t)at * *vocab, 1, &err) != TSR_OK)
            fail_msg("%s: forward of %d rows at %d: %s", assembly, rows, at, err.msg);
        at += rows;
    }
    tsr_seq_free(s);
    tsr_model_free(m);
    return lg;
}

static void test_prefill_fixtures(void **state) {
    (void)state;
    GPU_REQUIRE("fixture checks");
    const char *families[] = {"llama", "qwen2", "qwen3"};
    enum { N = 100 };
    for (size_t f = 0; f < 3; f++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/tests/data/fixtures/transformers/%s", gpu_src_dir(), families[f]);
        int vocab = 0, vocab_gpu = 0;
        int32_t ids[N];
        uint64_t rng = 0x5eed0000ull + f;
        /* the vocabulary is known only once loaded: draw ids after a first load */
        float *want = NULL;
        {
            int32_t probe[1] = {0};
            free(logits_of(dir, "cpu-reference.yaml", probe, 1, 0, &vocab));
        }
        for (int i = 0; i < N; i++) ids[i] = (int32_t)(rng_next(&rng) % (uint64_t)vocab);
        want = logits_of(dir, "cpu-reference.yaml", ids, N, 0, &vocab);
        for (int split = 0; split <= 40; split += 40) {
            float *got = logits_of(dir, "cuda-fast.yaml", ids, N, split, &vocab_gpu);
            assert_int_equal(vocab_gpu, vocab);
            double worst = 0;
            for (int r = 0; r < N; r++) {
                const float *w = want + (size_t)r * vocab, *g = got + (size_t)r * vocab;
                double mx = 0, row_worst = 0;
                for (int i = 0; i < vocab; i++)
                    if (fabs(w[i]) > mx) mx = fabs(w[i]);
                const double bound = 0.02 + 0.05 * mx;
                for (int i = 0; i < vocab; i++) {
                    const double d = fabs((double)g[i] - w[i]);
                    if (!(d <= row_worst)) row_worst = d;
                }
                if (!(row_worst <= bound))
                    fail_msg("%s, passes %s: row %d |logit diff| %g > %g", families[f], split ? "40 + 60" : "100",
                             r, row_worst, bound);
                if (row_worst > worst) worst = row_worst;
            }
            printf("# %s via cuda-fast, %s rows: max |logit diff| %.4g against cpu-reference\n", families[f],
                   split ? "passes of 40 + 60" : "one pass of 100", worst);
            free(got);
        }
        free(want);
    }
}

#else /* no CUDA in this build */

static void test_prefill_kernel(void **state) {
    (void)state;
    printf("# built without CUDA: skipped\n");
    skip();
}
static void test_prefill_declines(void **state) { test_prefill_kernel(state); }
static void test_prefill_fixtures(void **state) { test_prefill_kernel(state); }

#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_declines),
        cmocka_unit_test(test_prefill_kernel),
        cmocka_unit_test(test_prefill_fixtures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
