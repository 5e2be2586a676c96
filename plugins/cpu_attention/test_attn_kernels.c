/*
 * test_attn_kernels - kernels/cpu/attn_kernels against independent scalar
 * references, on every path this CPU runs (AVX-512, AVX2, and the portable
 * one, each taken by capping the others): f16 storage bit-identical to
 * tsr_f32_to_f16, int8 quantisation identical across paths and within
 * scale/2, tiles of 1..8 queries against a double-precision softmax, and
 * split ranges merged.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/cpu/attn_kernels.h"
#include "kernels/dtype.h"

#define SEED 0xa77e2024u

static uint64_t rng_state = SEED;
static uint32_t urand(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}
static float frand(void) { return (float)(urand() >> 8) / (float)(1 << 23) - 1.0f; }

/* The paths this CPU runs, best first: the caps that select each. */
static int paths(int cap[3]) {
    tsr_attn_cap_isa(TSR_ATTN_ISA_BEST);
    const int best = tsr_attn_isa_level();
    int n = 0;
    for (int l = best; l >= TSR_ATTN_ISA_PORTABLE; l--) cap[n++] = l;
    return n;
}

static void test_store_f16(void **state) {
    (void)state;
    enum { N = 4099 };
    float *x = malloc(N * sizeof(float));
    uint16_t *h = malloc(N * sizeof(uint16_t));
    for (int i = 0; i < N; i++) {
        uint32_t u = urand();
        float f;
        if (i % 3 == 0) {
            memcpy(&f, &u, 4); /* any bit pattern: NaN, Inf, subnormals, huge */
        } else {
            f = frand() * ldexpf(1.0f, (int)(urand() % 40) - 26);
        }
        x[i] = f;
    }
    x[0] = 65519.0f, x[1] = 65520.0f, x[2] = -0.0f, x[3] = 5.9604645e-08f, x[4] = 2.9802322e-08f;
    int cap[3];
    const int np = paths(cap);
    for (int path = 0; path < np; path++) {
        tsr_attn_cap_isa(cap[path]);
        for (int n = N; n >= N - 9; n -= 3) { /* tails of every length mod 8 */
            memset(h, 0xAB, N * sizeof(uint16_t));
            tsr_attn_store_f16(h, x, n);
            for (int i = 0; i < n; i++) {
                uint16_t want = tsr_f32_to_f16(x[i]);
                int both_nan = (want & 0x7c00) == 0x7c00 && (want & 0x3ff) && (h[i] & 0x7c00) == 0x7c00 &&
                               (h[i] & 0x3ff);
                if (h[i] != want && !both_nan)
                    fail_msg("path %d: f16 of %a is %04x, want %04x", path, (double)x[i], h[i], want);
            }
            if (n < N) assert_int_equal(h[n], 0xABAB);
        }
    }
    tsr_attn_cap_isa(TSR_ATTN_ISA_BEST);
    free(x), free(h);
}

static void test_quant_i8(void **state) {
    (void)state;
    enum { N = 203 };
    float x[N], s[3];
    int8_t q[3][N + 1];
    int cap[3];
    const int np = paths(cap);
    for (int trial = 0; trial < 400; trial++) {
        int n = 1 + (int)(urand() % N);
        float mag = ldexpf(1.0f, (int)(urand() % 30) - 15);
        for (int i = 0; i < n; i++) x[i] = frand() * mag;
        if (trial % 50 == 1) memset(x, 0, sizeof x);
        if (trial % 50 == 2) x[urand() % n] = NAN;
        if (trial % 50 == 3) x[urand() % n] = -INFINITY;
        for (int path = 0; path < np; path++) {
            tsr_attn_cap_isa(cap[path]);
            q[path][n] = 99;
            tsr_attn_quant_i8(q[path], &s[path], x, n);
            assert_int_equal(q[path][n], 99);
        }
        tsr_attn_cap_isa(TSR_ATTN_ISA_BEST);
        for (int path = 1; path < np; path++) {
            assert_memory_equal(q[0], q[path], n);
            assert_true(memcmp(&s[0], &s[path], 4) == 0);
        }
        float amax = 0;
        int bad = 0;
        for (int i = 0; i < n; i++) {
            if (!isfinite(x[i])) bad = 1;
            else amax = fmaxf(amax, fabsf(x[i]));
        }
        if (bad) {
            assert_true(isnan(s[0]));
            continue;
        }
        assert_true(s[0] == amax / 127.0f);
        for (int i = 0; i < n; i++) {
            double err = fabs((double)x[i] - (double)q[0][i] * s[0]);
            if (err > s[0] * 0.5 * (1 + 1e-5) + 1e-30)
                fail_msg("x %g q %d scale %g: error %g > scale/2", x[i], q[0][i], s[0], err);
        }
    }
}

/* Double-precision softmax attention of one query over [t0, t1). */
static void naive(const float *q, const float *K, const float *V, int64_t ts, int hd, float scale, int t0,
                  int t1, double *out) {
    double mx = -INFINITY, sum = 0;
    double *s = malloc((size_t)(t1 - t0) * sizeof(double));
    for (int t = t0; t < t1; t++) {
        double d = 0;
        for (int i = 0; i < hd; i++) d += (double)q[i] * K[t * ts + i];
        s[t - t0] = d * scale;
        mx = fmax(mx, s[t - t0]);
    }
    for (int i = 0; i < hd; i++) out[i] = 0;
    for (int t = t0; t < t1; t++) {
        double p = exp(s[t - t0] - mx);
        sum += p;
        for (int i = 0; i < hd; i++) out[i] += p * V[t * ts + i];
    }
    for (int i = 0; i < hd; i++) out[i] /= sum;
    free(s);
}

static void test_tiles(void **state) {
    (void)state;
    enum { T = 300, MAXHD = 128 };
    const int ts = 2 * MAXHD; /* tokens interleaved with another head's */
    float *K = malloc(sizeof(float) * T * ts), *V = malloc(sizeof(float) * T * ts);
    float *Kd = malloc(sizeof(float) * T * ts), *Vd = malloc(sizeof(float) * T * ts);
    uint16_t *K16 = malloc(2 * T * ts), *V16 = malloc(2 * T * ts);
    int8_t *K8 = malloc(T * ts), *V8 = malloc(T * ts);
    float ks[T], vs[T];
    float q[8][MAXHD], acc[8][MAXHD], acc2[8][MAXHD];
    double ref[MAXHD];
    int cap[3];
    const int np = paths(cap);
    if (np < 3) printf("%d of the 3 paths run here (best: %s)\n", np, tsr_attn_isa());
    for (int i = 0; i < T * ts; i++) K[i] = 2 * frand(), V[i] = frand();
    for (int dt = 0; dt < 3; dt++) {
        uint32_t dtype = dt == 0 ? TSR_DTYPE_F32 : dt == 1 ? TSR_DTYPE_F16 : TSR_DTYPE_I8;
        /* stored copies and their exact f32 values for the reference */
        for (int t = 0; t < T; t++) {
            tsr_attn_quant_i8(K8 + t * ts, &ks[t], K + t * ts, MAXHD);
            tsr_attn_quant_i8(V8 + t * ts, &vs[t], V + t * ts, MAXHD);
            for (int i = 0; i < MAXHD; i++) {
                int64_t j = t * ts + i;
                K16[j] = tsr_f32_to_f16(K[j]), V16[j] = tsr_f32_to_f16(V[j]);
                Kd[j] = dt == 0 ? K[j] : dt == 1 ? tsr_f16_to_f32(K16[j]) : K8[j] * ks[t];
                Vd[j] = dt == 0 ? V[j] : dt == 1 ? tsr_f16_to_f32(V16[j]) : V8[j] * vs[t];
            }
        }
        tsr_attn_kv kv = {.dtype = dtype, .token_stride = ts, .k_scale = ks, .v_scale = vs, .scale_stride = 1};
        kv.k = dt == 0 ? (const void *)K : dt == 1 ? (const void *)K16 : (const void *)K8;
        kv.v = dt == 0 ? (const void *)V : dt == 1 ? (const void *)V16 : (const void *)V8;
        for (int path = 0; path < np; path++) {
            tsr_attn_cap_isa(cap[path]);
            for (int nq = 1; nq <= 8; nq++)
                for (int hdi = 0; hdi < 6; hdi++) {
                    /* 8: AVX2 at most; 20: portable; 16, 48, 64, 128: every path
                     * (48: a 16-dim value pass after the 32-dim ones) */
                    static const int hds[6] = {8, 64, 20, 16, 48, 128};
                    int hd = hds[hdi];
                    int t0 = (int)(urand() % 50), t1 = t0 + 1 + (int)(urand() % (T - t0 - 1));
                    tsr_attn_tile tile = {.nq = nq}, half = {.nq = nq};
                    for (int i = 0; i < nq; i++) {
                        for (int d = 0; d < hd; d++) q[i][d] = frand();
                        tile.q[i] = half.q[i] = q[i];
                        tile.acc[i] = acc[i];
                        half.acc[i] = acc2[i];
                    }
                    float scale = 1.0f / sqrtf((float)hd);
                    tsr_attn_tile_reset(&tile, hd);
                    tsr_attn_tile_reset(&half, hd);
                    int mid = (t0 + t1) / 2;
                    tsr_attn_tile_run(&tile, &kv, hd, scale, t0, mid);
                    tsr_attn_tile_run(&half, &kv, hd, scale, mid, t1);
                    for (int i = 0; i < nq; i++)
                        tsr_attn_state_merge(&tile.m[i], &tile.l[i], acc[i], half.m[i], half.l[i], acc2[i], hd);
                    float *outs[8];
                    for (int i = 0; i < nq; i++) outs[i] = acc[i];
                    tsr_attn_tile_finish(&tile, outs, hd);
                    for (int i = 0; i < nq; i++) {
                        naive(q[i], Kd, Vd, ts, hd, scale, t0, t1, ref);
                        for (int d = 0; d < hd; d++)
                            if (fabs(acc[i][d] - ref[d]) > 3e-6)
                                fail_msg("cap %d dtype %u nq %d hd %d [%d,%d) q %d d %d: %g vs %g", cap[path],
                                         dtype, nq, hd, t0, t1, i, d, acc[i][d], ref[d]);
                    }
                }
        }
        tsr_attn_cap_isa(TSR_ATTN_ISA_BEST);
    }
    free(K), free(V), free(Kd), free(Vd), free(K16), free(V16), free(K8), free(V8);
}

int main(void) {
    printf("seed 0x%x, isa %s\n", SEED, tsr_attn_isa());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_f16),
        cmocka_unit_test(test_quant_i8),
        cmocka_unit_test(test_tiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
