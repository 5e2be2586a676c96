/*
 * test_cpu_kv_cache - cpu_kv_cache (dtype f16 and int8) against
 * ref_kv_cache, both loaded from the catalog: scripted sequences of
 * seq_alloc / append / view / truncate / seq_free replayed on both, every
 * view compared element by element (f16: bits equal tsr_f32_to_f16 of the
 * appended value; int8: scale = max|x|/127 of the token-head and error <=
 * scale/2), usage, errors, failed allocations (no leaks), and the error of
 * cpu_kv_cache + cpu_attention against ref_kv_cache + ref_attention, the
 * measured bound the README quotes.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/dtype.h"
#include "plugins/cpu_attention/attn_test_host.h"
#include "slots/tsr_attention.h"
#include "slots/tsr_kv_cache.h"

#define SEED 0x6b7c0ffeu

static uint64_t rng_state = SEED;
static float frand(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 0x2545F4914F6CDD1DULL) >> 40) / (float)(1 << 23) - 1.0f;
}
static int irand(int n) { return (int)((frand() + 1.0f) * 0.5f * n) % n; }

static tsr_threadpool *pool;

static int setup(void **state) {
    (void)state;
    pool = tsr_threadpool_new(2);
    printf("seed 0x%x\n", SEED);
    return pool ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    tsr_threadpool_free(pool);
    return 0;
}

static int open_kv(th_inst *t, const char *name, const char *dtype, int64_t cap, const tsr_model_desc *m) {
    tsr_param p[3] = {{.name = "capacity_tokens", .type = TSR_PARAM_INT, .v.i = cap}};
    if (dtype) p[1] = (tsr_param){.name = "dtype", .type = TSR_PARAM_STRING, .v.s = dtype};
    int rc = th_open(t, name, m, p, pool);
    if (rc == -100) fail_msg("cannot open %s: %s", name, t->err);
    return rc;
}

static const tsr_kv_cache_i *I(th_inst *t) { return t->desc->iface; }

/* Compare every layer's view of seq in c (cpu) with r (ref). */
static void compare_views(th_inst *c, int cs, th_inst *r, int rs, int int8, double *worst_rel) {
    const tsr_model_desc *m = &c->model;
    for (int l = 0; l < m->n_layers; l++) {
        tsr_kv_view vc, vr;
        assert_int_equal(I(c)->view(c->inst, cs, l, &vc), TSR_OK);
        assert_int_equal(I(r)->view(r->inst, rs, l, &vr), TSR_OK);
        assert_int_equal(vc.n_tokens, vr.n_tokens);
        assert_int_equal(vc.n_kv_heads, m->n_kv_heads);
        assert_int_equal(vc.head_dim, m->head_dim);
        assert_int_equal(vc.layout, TSR_KV_CONTIGUOUS);
        assert_int_equal(vc.dtype, int8 ? TSR_DTYPE_I8 : TSR_DTYPE_F16);
        for (int which = 0; which < 2; which++) {
            const void *base = which ? vc.v : vc.k;
            const float *rb = which ? vr.v : vr.k;
            const float *sc = which ? vc.v_scale : vc.k_scale;
            for (int t = 0; t < vc.n_tokens; t++)
                for (int h = 0; h < m->n_kv_heads; h++) {
                    const float *x = rb + t * vr.token_stride + h * vr.head_stride;
                    int64_t o = t * vc.token_stride + h * vc.head_stride;
                    if (!int8) {
                        for (int d = 0; d < m->head_dim; d++) {
                            uint16_t got = ((const uint16_t *)base)[o + d];
                            if (got != tsr_f32_to_f16(x[d]))
                                fail_msg("layer %d token %d head %d dim %d: f16 %04x for %g", l, t, h, d, got, x[d]);
                            double rel = fabs(tsr_f16_to_f32(got) - x[d]) / fmax(fabs(x[d]), 6.2e-5);
                            if (rel > *worst_rel) *worst_rel = rel;
                        }
                    } else {
                        float amax = 0;
                        for (int d = 0; d < m->head_dim; d++) amax = fmaxf(amax, fabsf(x[d]));
                        float s = sc[t * m->n_kv_heads + h];
                        if (s != amax / 127.0f) fail_msg("layer %d token %d head %d: scale %g, want %g", l, t, h, s, amax / 127.0f);
                        for (int d = 0; d < m->head_dim; d++) {
                            double err = fabs(((const int8_t *)base)[o + d] * (double)s - x[d]);
                            if (err > s * 0.5 * (1 + 1e-5)) fail_msg("int8 error %g > scale/2 %g", err, s * 0.5);
                            if (amax > 0 && err / amax > *worst_rel) *worst_rel = err / amax;
                        }
                    }
                }
        }
    }
    uint64_t used, cap;
    I(c)->usage(c->inst, &used, &cap);
    uint64_t per = 2ull * m->n_layers * m->n_kv_heads * (m->head_dim * (int8 ? 1 : 2) + (int8 ? 4 : 0));
    tsr_kv_view v0;
    assert_int_equal(I(c)->view(c->inst, cs, 0, &v0), TSR_OK);
    assert_true(used >= (uint64_t)v0.n_tokens * per);
    assert_int_equal(cap % per, 0);
}

static void append_all(th_inst *c, int cs, th_inst *r, int rs, int pos0, int rows, float mag) {
    const tsr_model_desc *m = &c->model;
    size_t n = (size_t)rows * m->n_kv_heads * m->head_dim;
    float *k = malloc(n * sizeof(float) + 4), *v = malloc(n * sizeof(float) + 4);
    tsr_exec ex = {.n_threads = 2};
    for (int l = 0; l < m->n_layers; l++) {
        for (size_t i = 0; i < n; i++) k[i] = mag * frand(), v[i] = mag * frand();
        assert_int_equal(I(c)->append(c->inst, cs, l, pos0, rows, k, v, &ex), TSR_OK);
        assert_int_equal(I(r)->append(r->inst, rs, l, pos0, rows, k, v, &ex), TSR_OK);
    }
    free(k), free(v);
}

static void scripted(const char *dtype) {
    int int8 = !strcmp(dtype, "int8");
    tsr_model_desc m = {.arch = "llama", .n_layers = 3, .n_heads = 4, .n_kv_heads = 2, .head_dim = 24};
    th_inst c, r;
    assert_int_equal(open_kv(&c, "cpu_kv_cache", dtype, 0, &m), TSR_OK);
    assert_int_equal(open_kv(&r, "ref_kv_cache", NULL, 0, &m), TSR_OK);
    double worst = 0;
    for (int round = 0; round < 3; round++) {
        int cs[2], rs[2];
        for (int s = 0; s < 2; s++) {
            assert_int_equal(I(&c)->seq_alloc(c.inst, 64, &cs[s]), TSR_OK);
            assert_int_equal(I(&r)->seq_alloc(r.inst, 64, &rs[s]), TSR_OK);
        }
        int len[2] = {0, 0};
        for (int step = 0; step < 40; step++) {
            int s = irand(2), op = irand(4);
            if (op < 3) { /* append 1..9 rows (decode, verification, chunks) */
                int rows = 1 + irand(9);
                if (len[s] + rows > 64) continue;
                append_all(&c, cs[s], &r, rs[s], len[s], rows, step % 7 == 0 ? 300.0f : 1.0f);
                len[s] += rows;
            } else { /* roll back some drafted tokens */
                int n = len[s] ? irand(len[s] + 1) : 0;
                assert_int_equal(I(&c)->truncate(c.inst, cs[s], n), TSR_OK);
                assert_int_equal(I(&r)->truncate(r.inst, rs[s], n), TSR_OK);
                len[s] = n;
            }
            compare_views(&c, cs[s], &r, rs[s], int8, &worst);
        }
        for (int s = 0; s < 2; s++) {
            I(&c)->seq_free(c.inst, cs[s]);
            I(&r)->seq_free(r.inst, rs[s]);
        }
        uint64_t used, cap;
        I(&c)->usage(c.inst, &used, &cap);
        assert_int_equal(used, 0);
        assert_int_equal(cap, 0);
    }
    printf("%s: worst stored error %.3g (%s)\n", dtype, worst, int8 ? "of max|x| per token-head" : "relative");
    assert_true(worst <= (int8 ? 0.5 / 127 * 1.0001 : 1.0 / 2048));
    th_close(&c);
    th_close(&r);
}

static void test_scripted_f16(void **state) { (void)state; scripted("f16"); }
static void test_scripted_int8(void **state) { (void)state; scripted("int8"); }

static void test_errors(void **state) {
    (void)state;
    tsr_model_desc m = {.arch = "llama", .n_layers = 2, .n_heads = 2, .n_kv_heads = 1, .head_dim = 8};
    th_inst c;
    assert_int_equal(open_kv(&c, "cpu_kv_cache", "int8", 100, &m), TSR_OK);
    int s, s2;
    float k[16] = {0}, v[16] = {0};
    tsr_exec ex = {.n_threads = 1};
    assert_int_equal(I(&c)->seq_alloc(c.inst, 0, &s), TSR_ERR_INVALID);
    assert_int_equal(I(&c)->seq_alloc(c.inst, 60, &s), TSR_OK);
    assert_int_equal(I(&c)->seq_alloc(c.inst, 41, &s2), TSR_ERR_RANGE);
    assert_non_null(strstr(c.err, "do not fit"));
    assert_int_equal(I(&c)->append(c.inst, s, 0, 1, 1, k, v, &ex), TSR_ERR_INVALID); /* not at the end */
    assert_int_equal(I(&c)->append(c.inst, s, 2, 0, 1, k, v, &ex), TSR_ERR_INVALID); /* layer */
    assert_int_equal(I(&c)->append(c.inst, s + 5, 0, 0, 1, k, v, &ex), TSR_ERR_INVALID);
    assert_non_null(strstr(c.err, "unknown sequence"));
    assert_int_equal(I(&c)->append(c.inst, s, 0, 0, 2, k, v, &ex), TSR_OK);
    assert_int_equal(I(&c)->append(c.inst, s, 1, 0, 1, k, v, &ex), TSR_OK);
    assert_int_equal(I(&c)->truncate(c.inst, s, 3), TSR_ERR_INVALID); /* the longest holds 2 */
    assert_int_equal(I(&c)->truncate(c.inst, s, -1), TSR_ERR_INVALID);
    tsr_kv_view vw;
    assert_int_equal(I(&c)->truncate(c.inst, s, 2), TSR_OK); /* layer 1 keeps its 1 token */
    assert_int_equal(I(&c)->view(c.inst, s, 0, &vw), TSR_OK);
    assert_int_equal(vw.n_tokens, 2);
    assert_int_equal(I(&c)->view(c.inst, s, 1, &vw), TSR_OK);
    assert_int_equal(vw.n_tokens, 1);
    assert_int_equal(I(&c)->truncate(c.inst, s, 1), TSR_OK);
    assert_int_equal(I(&c)->view(c.inst, s, 0, &vw), TSR_OK);
    assert_int_equal(vw.n_tokens, 1);
    assert_int_equal(vw.dtype, TSR_DTYPE_I8);
    assert_non_null(vw.k_scale);
    assert_true(vw.k_scale[0] == 0.0f); /* all-zero row */
    assert_int_equal(I(&c)->view(c.inst, s, 2, &vw), TSR_ERR_INVALID);
    float big[8 * 60] = {0};
    assert_int_equal(I(&c)->append(c.inst, s, 0, 1, 60, big, big, &ex), TSR_ERR_RANGE);
    I(&c)->seq_free(c.inst, s);
    I(&c)->seq_free(c.inst, s); /* unknown ids are ignored */
    I(&c)->seq_free(c.inst, -3);
    assert_int_equal(c.live_allocs, 1); /* the sequence table */
    th_close(&c);

    /* bad dtype param */
    assert_int_equal(open_kv(&c, "cpu_kv_cache", "bf16", 0, &m), TSR_ERR_INVALID);
    assert_non_null(strstr(c.err, "dtype"));
    th_close(&c);
}

/* Fail each allocation of seq_alloc in turn: NOMEM, nothing leaked. */
static void test_alloc_failures(void **state) {
    (void)state;
    tsr_model_desc m = {.arch = "llama", .n_layers = 2, .n_heads = 2, .n_kv_heads = 1, .head_dim = 8};
    for (int d = 0; d < 2; d++) {
        th_inst c;
        assert_int_equal(open_kv(&c, "cpu_kv_cache", d ? "int8" : "f16", 0, &m), TSR_OK);
        int s0;
        c.n_allocs = 0;
        c.fail_at = 1; /* the sequence table itself */
        assert_int_equal(I(&c)->seq_alloc(c.inst, 16, &s0), TSR_ERR_NOMEM);
        assert_int_equal(c.live_allocs, 0);
        c.fail_at = 0;
        assert_int_equal(I(&c)->seq_alloc(c.inst, 16, &s0), TSR_OK); /* the table now exists */
        I(&c)->seq_free(c.inst, s0);
        int failures = 0;
        for (uint64_t n = 1; n < 20; n++) {
            int64_t live = c.live_allocs;
            c.n_allocs = 0;
            c.fail_at = n;
            int s;
            int rc = I(&c)->seq_alloc(c.inst, 16, &s);
            c.fail_at = 0;
            if (rc == TSR_OK) {
                I(&c)->seq_free(c.inst, s);
                if (c.n_allocs < n) break; /* every allocation has been failed once */
                continue;
            }
            failures++;
            assert_int_equal(rc, TSR_ERR_NOMEM);
            assert_int_equal(c.live_allocs, live);
            uint64_t used, cap;
            I(&c)->usage(c.inst, &used, &cap);
            assert_int_equal(cap, 0);
        }
        assert_true(failures >= (d ? 5 : 3));
        th_close(&c);
    }
}

/* The whole KV path: cpu_kv_cache + cpu_attention vs ref_kv_cache +
 * ref_attention at the 0.5B attention shape, prefill then decode. */
static void test_attention_error(void **state) {
    (void)state;
    tsr_model_desc m = {.arch = "qwen2", .n_layers = 1, .n_heads = 14, .n_kv_heads = 2, .head_dim = 64};
    const int H = 14, KVH = 2, hd = 64, T = 300;
    for (int d = 0; d < 2; d++) {
        th_inst c, r, ca, ra;
        assert_int_equal(open_kv(&c, "cpu_kv_cache", d ? "int8" : "f16", 0, &m), TSR_OK);
        assert_int_equal(open_kv(&r, "ref_kv_cache", NULL, 0, &m), TSR_OK);
        assert_int_equal(th_open(&ca, "cpu_attention", &m, NULL, pool), TSR_OK);
        assert_int_equal(th_open(&ra, "ref_attention", &m, NULL, pool), TSR_OK);
        int cs, rs;
        assert_int_equal(I(&c)->seq_alloc(c.inst, T, &cs), TSR_OK);
        assert_int_equal(I(&r)->seq_alloc(r.inst, T, &rs), TSR_OK);
        /* keys with a few large channels, as trained models have */
        float *k = malloc(sizeof(float) * T * KVH * hd), *v = malloc(sizeof(float) * T * KVH * hd);
        for (int i = 0; i < T * KVH * hd; i++) {
            k[i] = frand() * (i % hd < 4 ? 8.0f : 1.0f);
            v[i] = frand();
        }
        tsr_exec ex = {.n_threads = 2};
        assert_int_equal(I(&c)->append(c.inst, cs, 0, 0, T, k, v, &ex), TSR_OK);
        assert_int_equal(I(&r)->append(r.inst, rs, 0, 0, T, k, v, &ex), TSR_OK);
        tsr_kv_view vc, vr;
        assert_int_equal(I(&c)->view(c.inst, cs, 0, &vc), TSR_OK);
        assert_int_equal(I(&r)->view(r.inst, rs, 0, &vr), TSR_OK);
        const int rows = 16;
        float *q = malloc(sizeof(float) * rows * H * hd), *oc = malloc(sizeof(float) * rows * H * hd),
              *orf = malloc(sizeof(float) * rows * H * hd);
        double maxe = 0, sume = 0;
        int64_t cnt = 0;
        for (int pass = 0; pass < 2; pass++) {
            int n = pass ? 1 : rows, pos0 = pass ? T - 1 : T - rows - 50;
            for (int i = 0; i < n * H * hd; i++) q[i] = frand() * 2.0f;
            tsr_attn_args a = {n, pos0, H, KVH, hd, 0.125f, 0, q, &vc, oc};
            tsr_attn_args b = {n, pos0, H, KVH, hd, 0.125f, 0, q, &vr, orf};
            assert_int_equal(((const tsr_attention_i *)ca.desc->iface)->run(ca.inst, &a, &ex), TSR_OK);
            assert_int_equal(((const tsr_attention_i *)ra.desc->iface)->run(ra.inst, &b, &ex), TSR_OK);
            for (int i = 0; i < n * H * hd; i++) {
                double e = fabs((double)oc[i] - orf[i]);
                maxe = fmax(maxe, e);
                sume += e;
                cnt++;
            }
        }
        printf("%s KV + cpu_attention vs f32 reference (outputs ~0.1): max |err| %.3g, mean %.3g\n",
               d ? "int8" : "f16", maxe, sume / cnt);
        /* bounds declared in the README: f16 1e-3, int8 1.5e-2 (absolute, values in [-1, 1]) */
        assert_true(maxe < (d ? 1.5e-2 : 1e-3));
        assert_true(maxe > 0); /* lossy: a zero error would mean the test compares nothing */
        free(k), free(v), free(q), free(oc), free(orf);
        th_close(&c), th_close(&r), th_close(&ca), th_close(&ra);
    }
}

int main(void) {
    if (!getenv("TESSERA_CATALOG")) {
        printf("SKIP: TESSERA_CATALOG not set (run through ctest)\n");
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scripted_f16),
        cmocka_unit_test(test_scripted_int8),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_attention_error),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
