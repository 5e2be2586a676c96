/*
 * test_cpu_attention - cpu_attention against ref_attention (both loaded from
 * the catalog): GQA ratios 1/2/4/7/8/16, rows 1, k+1 and a chunk, windows,
 * f32, f16 and int8 KV in token-major and head-major layouts, 1..3 threads
 * (KV splits), guard bytes, NaN/Inf parity and the error cases. f16/int8
 * cases compare with the reference run on the dequantised values, so the
 * tolerance is that of f32 reassociation alone.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/cpu/attn_kernels.h"
#include "kernels/dtype.h"
#include "plugins/cpu_attention/attn_test_host.h"
#include "slots/tsr_attention.h"

#define SEED 0x5eed1234u
#define GUARD 16
#define GUARD_VAL -7777.0f

static uint64_t rng_state;
static float frand(void) { /* xorshift64*, uniform in [-1, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 0x2545F4914F6CDD1DULL) >> 40) / (float)(1 << 23) - 1.0f;
}

typedef struct fixture {
    tsr_threadpool *pool1, *pool2, *pool3;
    th_inst cpu, port, ref;
    th_inst *cur; /* the cpu_attention instance compare_case runs */
} fixture;

static tsr_model_desc model_of(int h, int kvh, int hd) {
    tsr_model_desc m = {.arch = "llama", .n_layers = 1, .hidden = h * hd, .n_heads = h,
                        .n_kv_heads = kvh, .head_dim = hd, .max_ctx = 4096};
    return m;
}

static int setup(void **state) {
    static fixture f;
    char buf[1024];
    if (!th_lib_path("cpu_attention", buf, sizeof buf)) {
        fprintf(stderr, "TESSERA_CATALOG not set: skipping (run through ctest)\n");
        return -1;
    }
    f.pool1 = tsr_threadpool_new(1);
    f.pool2 = tsr_threadpool_new(2);
    f.pool3 = tsr_threadpool_new(3);
    tsr_model_desc m = model_of(8, 2, 64);
    tsr_param port[2] = {{.name = "isa", .type = TSR_PARAM_STRING, .v.s = "portable"}};
    f.cur = &f.cpu;
    if (th_open(&f.cpu, "cpu_attention", &m, NULL, f.pool2) != TSR_OK ||
        th_open(&f.port, "cpu_attention", &m, port, f.pool2) != TSR_OK ||
        th_open(&f.ref, "ref_attention", &m, NULL, f.pool1) != TSR_OK) {
        fprintf(stderr, "cannot open plugins: %s / %s\n", f.cpu.err, f.ref.err);
        return -1;
    }
    rng_state = SEED;
    printf("seed 0x%x\n", SEED);
    *state = &f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    th_close(&f->cpu);
    th_close(&f->port);
    th_close(&f->ref);
    tsr_threadpool_free(f->pool1);
    tsr_threadpool_free(f->pool2);
    tsr_threadpool_free(f->pool3);
    return 0;
}

/* Keys and values of T tokens stored as dtype, and their dequantised f32
 * copy in the same layout for the reference. */
typedef struct kvset {
    int T, kvh, hd, head_major;
    uint32_t dtype;
    void *k, *v;       /* stored */
    float *kd, *vd;    /* dequantised, same strides */
    float *ks, *vs;    /* int8 scales [T][kvh] */
    int64_t ts, hs;
} kvset;

static int64_t kv_index(const kvset *s, int t, int h, int d) { return t * s->ts + h * s->hs + d; }

static void kv_make(kvset *s, int T, int kvh, int hd, uint32_t dtype, int head_major) {
    memset(s, 0, sizeof *s);
    s->T = T, s->kvh = kvh, s->hd = hd, s->dtype = dtype, s->head_major = head_major;
    s->ts = head_major ? hd : (int64_t)kvh * hd;
    s->hs = head_major ? (int64_t)T * hd : hd;
    size_t n = (size_t)T * kvh * hd;
    size_t esz = dtype == TSR_DTYPE_F32 ? 4 : dtype == TSR_DTYPE_F16 ? 2 : 1;
    s->k = calloc(n, esz), s->v = calloc(n, esz);
    s->kd = calloc(n, 4), s->vd = calloc(n, 4);
    s->ks = calloc((size_t)T * kvh, 4), s->vs = calloc((size_t)T * kvh, 4);
    assert_non_null(s->k);
    assert_non_null(s->v);
    assert_non_null(s->kd);
    assert_non_null(s->vd);
    assert_non_null(s->ks);
    assert_non_null(s->vs);
    float *src = malloc(hd * sizeof(float));
    for (int which = 0; which < 2; which++) {
        void *dst = which ? s->v : s->k;
        float *deq = which ? s->vd : s->kd, *sc = which ? s->vs : s->ks;
        for (int t = 0; t < T; t++)
            for (int h = 0; h < kvh; h++) {
                for (int d = 0; d < hd; d++) src[d] = (which ? 1.0f : 2.0f) * frand();
                int64_t base = kv_index(s, t, h, 0);
                if (dtype == TSR_DTYPE_F32) {
                    memcpy((float *)dst + base, src, hd * sizeof(float));
                    memcpy(deq + base, src, hd * sizeof(float));
                } else if (dtype == TSR_DTYPE_F16) {
                    for (int d = 0; d < hd; d++) {
                        uint16_t b = tsr_f32_to_f16(src[d]);
                        ((uint16_t *)dst)[base + d] = b;
                        deq[base + d] = tsr_f16_to_f32(b);
                    }
                } else { /* an independent int8 quantiser: scale = absmax/127 */
                    float amax = 0;
                    for (int d = 0; d < hd; d++) amax = fmaxf(amax, fabsf(src[d]));
                    float scale = amax / 127.0f;
                    sc[t * kvh + h] = scale;
                    for (int d = 0; d < hd; d++) {
                        int q = (int)roundf(src[d] / scale);
                        ((int8_t *)dst)[base + d] = (int8_t)q;
                        deq[base + d] = (float)q * scale;
                    }
                }
            }
    }
    free(src);
}

static void kv_free(kvset *s) {
    free(s->k), free(s->v), free(s->kd), free(s->vd), free(s->ks), free(s->vs);
}

static tsr_kv_view view_stored(const kvset *s) {
    tsr_kv_view v = {.dtype = s->dtype, .layout = TSR_KV_CONTIGUOUS, .n_tokens = s->T,
                     .n_kv_heads = s->kvh, .head_dim = s->hd, .k = s->k, .v = s->v,
                     .token_stride = s->ts, .head_stride = s->hs};
    if (s->dtype == TSR_DTYPE_I8) v.k_scale = s->ks, v.v_scale = s->vs;
    return v;
}

static tsr_kv_view view_deq(const kvset *s) {
    tsr_kv_view v = {.dtype = TSR_DTYPE_F32, .layout = TSR_KV_CONTIGUOUS, .n_tokens = s->T,
                     .n_kv_heads = s->kvh, .head_dim = s->hd, .k = s->kd, .v = s->vd,
                     .token_stride = s->ts, .head_stride = s->hs};
    return v;
}

static int run_attn(th_inst *t, tsr_attn_args *a, int threads) {
    const tsr_attention_i *it = t->desc->iface;
    tsr_exec ex = {.device = TSR_DEVICE_CPU, .n_threads = threads};
    return it->run(t->inst, a, &ex);
}

/* Output of both plugins for one case; returns the max abs difference and
 * checks guards and NaN parity. q may be NULL (random). */
static double compare_case(fixture *f, int H, int KVH, int hd, int rows, int pos0, int window,
                           const kvset *kv, const float *qin, int threads) {
    int64_t qn = (int64_t)rows * H * hd;
    float *q = malloc(qn * sizeof(float));
    float *out = malloc((qn + 2 * GUARD) * sizeof(float)), *ref = malloc(qn * sizeof(float));
    assert_non_null(q);
    assert_non_null(out);
    assert_non_null(ref);
    for (int64_t i = 0; i < qn; i++) q[i] = qin ? qin[i] : frand();
    for (int64_t i = 0; i < qn + 2 * GUARD; i++) out[i] = GUARD_VAL;
    tsr_kv_view vs = view_stored(kv), vd = view_deq(kv);
    float scale = 1.0f / sqrtf((float)hd);
    tsr_attn_args a = {rows, pos0, H, KVH, hd, scale, window, q, &vs, out + GUARD};
    tsr_attn_args r = {rows, pos0, H, KVH, hd, scale, window, q, &vd, ref};
    f->cur->pool = threads == 1 ? f->pool1 : threads == 2 ? f->pool2 : f->pool3;
    assert_int_equal(run_attn(f->cur, &a, threads), TSR_OK);
    assert_int_equal(run_attn(&f->ref, &r, 1), TSR_OK);
    for (int i = 0; i < GUARD; i++) {
        assert_true(out[i] == GUARD_VAL);
        assert_true(out[GUARD + qn + i] == GUARD_VAL);
    }
    double maxd = 0;
    for (int64_t i = 0; i < qn; i++) {
        float x = out[GUARD + i], y = ref[i];
        if (isnan(x) || isnan(y)) {
            if (isnan(x) != isnan(y))
                fail_msg("NaN parity at %lld: cpu %g ref %g (H %d KVH %d hd %d rows %d pos0 %d win %d)",
                         (long long)i, x, y, H, KVH, hd, rows, pos0, window);
            continue;
        }
        double d = fabs((double)x - y);
        if (d > maxd) maxd = d;
    }
    free(q), free(out), free(ref);
    return maxd;
}

static void test_matches_reference(void **state) {
    fixture *f = *state;
    static const int gqa[][2] = {{4, 4}, {4, 2}, {8, 2}, {8, 1}, {14, 2}, {16, 1}, {32, 2}};
    static const int hds[] = {64, 8, 12, 128};
    static const int rowsv[] = {1, 5, 33};
    static const uint32_t dts[] = {TSR_DTYPE_F32, TSR_DTYPE_F16, TSR_DTYPE_I8};
    int n = 0;
    double worst = 0;
    for (size_t g = 0; g < sizeof gqa / sizeof gqa[0]; g++)
        for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++)
            for (size_t di = 0; di < 3; di++) {
                int H = gqa[g][0], KVH = gqa[g][1], hd = hds[hi];
                kvset kv;
                kv_make(&kv, 140, KVH, hd, dts[di], (int)((g + hi) % 2));
                for (size_t ri = 0; ri < 3; ri++)
                    for (int pi = 0; pi < 3; pi++)
                        for (int wi = 0; wi < 3; wi++) {
                            int rows = rowsv[ri];
                            int pos0 = pi == 0 ? 0 : pi == 1 ? 7 : 140 - rows;
                            int window = wi == 0 ? 0 : wi == 1 ? 5 : 40;
                            int threads = 1 + (n % 3);
                            double d = compare_case(f, H, KVH, hd, rows, pos0, window, &kv, NULL, threads);
                            if (d > 2e-5)
                                fail_msg("H %d KVH %d hd %d dtype %u rows %d pos0 %d window %d threads %d: "
                                         "max |diff| %g",
                                         H, KVH, hd, dts[di], rows, pos0, window, threads, d);
                            if (d > worst) worst = d;
                            n++;
                        }
                kv_free(&kv);
            }
    printf("%d cases, max |cpu - ref| = %.3g\n", n, worst);
}

/* The portable kernels through the plugin (param isa = portable). */
static void test_portable_matches_reference(void **state) {
    fixture *f = *state;
    static const int gqa[][2] = {{4, 4}, {14, 2}, {8, 1}, {16, 1}};
    f->cur = &f->port;
    for (size_t g = 0; g < 4; g++)
        for (int di = 0; di < 3; di++) {
            uint32_t dt = di == 0 ? TSR_DTYPE_F32 : di == 1 ? TSR_DTYPE_F16 : TSR_DTYPE_I8;
            kvset kv;
            kv_make(&kv, 600, gqa[g][1], 16, dt, di % 2);
            static const int rowsv[] = {1, 5, 33};
            for (int ri = 0; ri < 3; ri++)
                for (int w = 0; w < 2; w++) {
                    double d = compare_case(f, gqa[g][0], gqa[g][1], 16, rowsv[ri], 600 - rowsv[ri], w ? 40 : 0,
                                            &kv, NULL, 2);
                    if (d > 2e-5) fail_msg("portable: H %d KVH %d dt %u rows %d: %g", gqa[g][0], gqa[g][1], dt, rowsv[ri], d);
                }
            kv_free(&kv);
        }
    f->cur = &f->cpu;
}

/* Bad values of the isa param. */
static void test_isa_param(void **state) {
    (void)state;
    tsr_model_desc m = model_of(8, 2, 64);
    tsr_param bad[2] = {{.name = "isa", .type = TSR_PARAM_STRING, .v.s = "sse9"}};
    th_inst t;
    assert_int_equal(th_open(&t, "cpu_attention", &m, bad, NULL), TSR_ERR_INVALID);
    assert_non_null(strstr(t.err, "sse9"));
    th_close(&t);
    static const char *const want[2] = {"avx2", "avx512"};
    for (int i = 0; i < 2; i++) { /* refused where this CPU lacks the path, saying so */
        tsr_param avx[2] = {{.name = "isa", .type = TSR_PARAM_STRING, .v.s = want[i]}};
        int rc = th_open(&t, "cpu_attention", &m, avx, NULL);
        assert_int_equal(rc, tsr_attn_isa_level() >= TSR_ATTN_ISA_AVX2 + i ? TSR_OK : TSR_ERR_UNSUPPORTED);
        if (rc != TSR_OK) assert_non_null(strstr(t.err, "lacks"));
        th_close(&t);
    }
}

/* Long single rows: the KV split path (1 KV head or 3 heads on 2 threads). */
static void test_decode_splits(void **state) {
    fixture *f = *state;
    static const int gqa[][2] = {{8, 1}, {14, 2}, {6, 3}, {7, 7}};
    for (size_t g = 0; g < 4; g++)
        for (int di = 0; di < 3; di++) {
            uint32_t dt = di == 0 ? TSR_DTYPE_F32 : di == 1 ? TSR_DTYPE_F16 : TSR_DTYPE_I8;
            kvset kv;
            kv_make(&kv, 2100, gqa[g][1], 64, dt, 1);
            for (int threads = 1; threads <= 3; threads++)
                for (int w = 0; w < 2; w++) {
                    double d = compare_case(f, gqa[g][0], gqa[g][1], 64, 1, 2099 - 37 * threads,
                                            w ? 700 : 0, &kv, NULL, threads);
                    if (d > 2e-5) fail_msg("split case H %d KVH %d dt %u threads %d: %g", gqa[g][0], gqa[g][1], dt, threads, d);
                }
            if (dt == TSR_DTYPE_F32) { /* NaN in the second half: the merge must keep it */
                ((float *)kv.k)[kv_index(&kv, 1500, 0, 3)] = kv.kd[kv_index(&kv, 1500, 0, 3)] = NAN;
                for (int threads = 2; threads <= 3; threads++)
                    compare_case(f, gqa[g][0], gqa[g][1], 64, 1, 2099, 0, &kv, NULL, threads);
            }
            kv_free(&kv);
        }
}

/* NaN and Inf in q, K and V: NaN exactly where the reference has NaN. */
static void test_nan_parity(void **state) {
    fixture *f = *state;
    const int H = 8, KVH = 2, hd = 16, T = 300, rows = 6;
    for (int di = 0; di < 2; di++)
        for (int c = 0; c < 9; c++)
            for (int w = 0; w < 2; w++) {
                kvset kv;
                kv_make(&kv, T, KVH, hd, di ? TSR_DTYPE_F16 : TSR_DTYPE_F32, c % 2);
                int64_t qn = (int64_t)rows * H * hd;
                float *q = malloc(qn * sizeof(float));
                for (int64_t i = 0; i < qn; i++) q[i] = frand();
                int pos0 = T - rows - 2;
                float nanv = NAN, inf = INFINITY;
                uint16_t nan16 = 0x7e00, inf16 = 0x7c00, ninf16 = 0xfc00;
                /* poke K or V (stored and dequantised copies) */
#define POKE(arr, deq, t, h, d, f32v, f16v)                                                         \
    do {                                                                                          \
        int64_t ix_ = kv_index(&kv, t, h, d);                                                    \
        if (di) ((uint16_t *)kv.arr)[ix_] = f16v;                                                \
        else ((float *)kv.arr)[ix_] = f32v;                                                      \
        kv.deq[ix_] = f32v;                                                                      \
    } while (0)
                switch (c) {
                case 0: q[2 * hd + 3] = nanv; break;                      /* row 0, head 2 */
                case 1: POKE(k, kd, 100, 1, 5, nanv, nan16); break;        /* seen by all rows (no window) */
                case 2: POKE(v, vd, 50, 0, 7, nanv, nan16); break;         /* one output dim */
                case 3: POKE(k, kd, pos0 + 3, 0, 0, nanv, nan16); break;   /* future for rows 0..2 */
                case 4: POKE(v, vd, pos0 + rows - 1, 1, 2, nanv, nan16); break; /* last row only */
                case 5: POKE(k, kd, 10, 1, 1, inf, inf16); break;          /* +/-Inf score */
                case 6: POKE(k, kd, 10, 0, 1, -inf, ninf16); break;
                case 7: q[hd] = inf; break;
                case 8: POKE(v, vd, pos0 + 1, 0, 0, inf, inf16); break;
                }
#undef POKE
                compare_case(f, H, KVH, hd, rows, pos0, w ? 64 : 0, &kv, q, 2);
                free(q);
                kv_free(&kv);
            }
    /* all scores -Inf: every weight NaN in the reference */
    kvset kv;
    kv_make(&kv, 20, 1, 8, TSR_DTYPE_F32, 0);
    float q[8];
    for (int d = 0; d < 8; d++) q[d] = d == 0 ? -INFINITY : 0.0f;
    for (int t = 0; t < 20; t++) {
        ((float *)kv.k)[t * 8] = kv.kd[t * 8] = 1.0f;
    }
    compare_case(f, 1, 1, 8, 1, 19, 0, &kv, q, 1);
    kv_free(&kv);
}

static void test_errors(void **state) {
    fixture *f = *state;
    kvset kv;
    kv_make(&kv, 10, 2, 8, TSR_DTYPE_F32, 0);
    float q[4 * 8], out[4 * 8];
    for (int i = 0; i < 32; i++) q[i] = frand();
    tsr_kv_view v = view_stored(&kv);
    tsr_attn_args a = {1, 9, 4, 2, 8, 0.3f, 0, q, &v, out};
    assert_int_equal(run_attn(&f->cpu, &a, 2), TSR_OK);
    a.pos0 = 10; /* needs 11 tokens */
    assert_int_equal(run_attn(&f->cpu, &a, 2), TSR_ERR_INVALID);
    assert_non_null(strstr(f->cpu.err, "KV tokens"));
    a.pos0 = 0;
    a.n_heads = 3;
    assert_int_equal(run_attn(&f->cpu, &a, 2), TSR_ERR_INVALID);
    a.n_heads = 4;
    a.head_dim = 16;
    assert_int_equal(run_attn(&f->cpu, &a, 2), TSR_ERR_INVALID);
    a.head_dim = 8;
    v.layout = TSR_KV_PAGED;
    assert_int_equal(run_attn(&f->cpu, &a, 2), TSR_ERR_UNSUPPORTED);
    v.layout = TSR_KV_CONTIGUOUS;
    v.dtype = TSR_DTYPE_BF16;
    assert_int_equal(run_attn(&f->cpu, &a, 2), TSR_ERR_UNSUPPORTED);
    assert_non_null(strstr(f->cpu.err, "dtype"));
    v.dtype = TSR_DTYPE_I8; /* no scales */
    assert_int_equal(run_attn(&f->cpu, &a, 2), TSR_ERR_INVALID);
    v.dtype = TSR_DTYPE_F32;
    a.rows = 0;
    assert_int_equal(run_attn(&f->cpu, &a, 2), TSR_OK);
    kv_free(&kv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_reference),
        cmocka_unit_test(test_portable_matches_reference),
        cmocka_unit_test(test_isa_param),
        cmocka_unit_test(test_decode_splits),
        cmocka_unit_test(test_nan_parity),
        cmocka_unit_test(test_errors),
    };
    if (!getenv("TESSERA_CATALOG")) {
        printf("SKIP: TESSERA_CATALOG not set (run through ctest)\n");
        return 0;
    }
    return cmocka_run_group_tests(tests, setup, teardown);
}
