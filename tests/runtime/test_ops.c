/* Tests of kernels/cpu/ops.h where a SIMD path replaces the scalar one:
 * silu_mul against double precision over a sweep of inputs and tails, and
 * the special values (NaN, infinities, overflow of e^-g) as expf gives them;
 * rmsnorm and RoPE against double precision over lengths with SIMD tails;
 * argmax and absmax against the element-by-element scan; sum_exp (a
 * vocabulary's softmax normaliser) against exp in double, NaN and -inf
 * skipped in the vector body and the tail; first_above against the scan. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/ops.h"

static void test_silu_mul_accuracy(void **state) {
    (void)state;
    for (int n = 1; n <= 77; n += 19) { /* 8-wide bodies and scalar tails */
        float g[80], u[80], y[80];
        double worst = 0;
        for (int rep = 0; rep < 2000; rep++) {
            for (int i = 0; i < n; i++) {
                g[i] = -30.0f + 60.0f * (float)((rep * 131 + i * 7919) % 10007) / 10007.0f;
                u[i] = 0.5f + (float)(i % 5);
            }
            tsr_silu_mul(y, g, u, n);
            for (int i = 0; i < n; i++) {
                double ref = (double)g[i] / (1.0 + exp(-(double)g[i])) * (double)u[i];
                double err = fabs((double)y[i] - ref) / (fabs(ref) + 1e-30);
                if (err > worst) worst = err;
            }
        }
        assert_true(worst < 8 * 1.1920929e-7); /* a few ulp */
    }
}

static void test_silu_mul_specials(void **state) {
    (void)state;
    float g[16] = {NAN, INFINITY, -INFINITY, -100.0f, -88.0f, -89.0f, 100.0f, 0.0f,
                   -0.0f, 1.0f, -1.0f, 20.0f, -20.0f, 3.0f, -3.0f, 0.5f};
    float u[16], y[16];
    for (int i = 0; i < 16; i++) u[i] = 1.0f;
    tsr_silu_mul(y, g, u, 16);
    for (int i = 0; i < 16; i++) {
        float ref = g[i] / (1.0f + expf(-g[i])) * u[i];
        if (isnan(ref)) {
            assert_true(isnan(y[i]));
        } else if (isinf(ref) || ref == 0.0f) {
            assert_true(y[i] == ref);
        } else {
            assert_true(fabsf(y[i] - ref) <= 8 * 1.1920929e-7f * fabsf(ref));
        }
    }
    /* in place, as the runtime calls it */
    float a[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, b[9];
    for (int i = 0; i < 9; i++) b[i] = a[i] / (1.0f + expf(-a[i])) * 2.0f;
    float two[9] = {2, 2, 2, 2, 2, 2, 2, 2, 2};
    tsr_silu_mul(a, a, two, 9);
    for (int i = 0; i < 9; i++) assert_true(fabsf(a[i] - b[i]) <= 8 * 1.1920929e-7f * fabsf(b[i]));
}

static float frand(uint32_t *h) {
    *h = *h * 1664525u + 1013904223u;
    return (float)(int)(*h >> 8) * 0x1p-23f - 1.0f; /* [-1, 1) */
}

/* y = x / sqrt(mean(x^2) + eps) * w within a few ulp of the double result,
 * in place and not (prompt rows of the 0.5B/1B shapes and SIMD tails). */
static void test_rmsnorm(void **state) {
    (void)state;
    uint32_t h = 7;
    static float x[4099], w[4099], y[4099];
    for (int n = 1; n <= 4099; n += n < 70 ? 1 : 511) {
        for (int i = 0; i < n; i++) x[i] = 3.0f * frand(&h), w[i] = 1.0f + frand(&h);
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
        const double inv = 1.0 / sqrt(ss / n + 1e-6);
        tsr_rmsnorm(y, x, w, n, 1e-6f);
        for (int i = 0; i < n; i++) {
            const double want = x[i] * inv * w[i];
            /* the float sum of squares: a relative error growing like sqrt(n) ulp */
            assert_true(fabs(y[i] - want) <= (8 + 4 * sqrt(n)) * FLT_EPSILON * fabs(want) + 1e-30);
        }
        tsr_rmsnorm(x, x, w, n, 1e-6f); /* y may be x */
        for (int i = 0; i < n; i++) assert_true(x[i] == y[i]);
    }
}

/* Every pair rotated by pos * inv_freq[i] against double precision, both
 * pairings (halves and interleaved), head sizes with and without a tail
 * after the 8-wide steps, several heads (each rotated alike). */
static void test_rope(void **state) {
    (void)state;
    uint32_t h = 11;
    static float x[8 * 256], x0[8 * 256];
    const int dims[] = {2, 16, 20, 64, 128, 256};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int il = 0; il < 2; il++)
            for (int pos = 0; pos < 3000; pos += 997) {
                const int hd = dims[d], half = hd / 2, heads = 5;
                tsr_rope r;
                assert_int_equal(tsr_rope_init(&r, hd, 500000.0f, il, 0, 1, 1, 1, 1), 0);
                for (int i = 0; i < heads * hd; i++) x[i] = x0[i] = frand(&h);
                tsr_rope_apply(&r, x, heads, pos);
                for (int hh = 0; hh < heads; hh++)
                    for (int i = 0; i < half; i++) {
                        const int i0 = il ? 2 * i : i, i1 = il ? 2 * i + 1 : i + half;
                        const double a = (double)pos * r.inv_freq[i], c = cos(a), s = sin(a);
                        const double u = x0[hh * hd + i0], v = x0[hh * hd + i1];
                        /* the angle is rounded to float first: an error of pos * ulp(inv_freq) radians */
                        const double tol = 1e-6 + 2e-7 * pos;
                        assert_true(fabs(x[hh * hd + i0] - (u * c - v * s)) <= tol);
                        assert_true(fabs(x[hh * hd + i1] - (v * c + u * s)) <= tol);
                    }
            }
}

/* tsr_argmax and tsr_argmax_above against the element-by-element scan:
 * ties (first wins), signed zeros, NaN (never chosen), -inf, lengths that
 * leave a tail after the chains of eight. */
static int32_t scan_above(const float *x, int n, float floor) {
    int32_t best = -1;
    float bv = floor;
    for (int i = 0; i < n; i++)
        if (x[i] > bv) bv = x[i], best = i;
    return best;
}

static void test_sum_exp(void **state) {
    (void)state;
    enum { N = 1003 }; /* 16-wide bodies and a tail of 11 */
    static float x[N];
    for (int n = 1; n <= N; n += 77) {
        float mx = -INFINITY;
        for (int i = 0; i < n; i++) {
            x[i] = -100.0f + 100.0f * (float)((i * 7919 + n) % 10007) / 10007.0f; /* terms to e^-100 */
            if (i % 13 == 5) x[i] = NAN;
            if (i % 17 == 3) x[i] = -INFINITY;
            if (x[i] > mx) mx = x[i];
        }
        if (n >= 2) x[n - 1] = NAN, x[n - 2] = -INFINITY; /* in the tail where there is one */
        double ref = 0;
        for (int i = 0; i < n; i++)
            if (x[i] > -INFINITY) ref += exp((double)x[i] - (double)mx);
        const double z = tsr_sum_exp(x, n, mx);
        if (!(fabs(z - ref) <= 4e-7 * ref)) fail_msg("n %d: %.17g, want %.17g", n, z, ref);
    }
    float none[20]; /* nothing counts: 0 */
    for (int i = 0; i < 20; i++) none[i] = i % 2 ? NAN : -INFINITY;
    assert_true(tsr_sum_exp(none, 20, 0.0f) == 0.0);
}

static uint32_t lcg(uint32_t *h) { return *h = *h * 1664525u + 1013904223u; }
static float unit(uint32_t *h) { return (float)(lcg(h) >> 8) / 16777216.0f; }

/* The sampler's softmax passes (tsr_div_max, tsr_exp_weights, tsr_div_by)
 * against the arithmetic they replace, element by element: the division
 * and the maximum bit for bit over rows with NaN and infinities (every
 * tail length); each weight within one float ulp of (float)exp in double
 * from the C library, equal but for a rare few (a double polynomial against
 * the library's rounding), over differences from 0 down past float's
 * smallest subnormal; their sum within 1e-12; the renormalisation bit for
 * bit. */
static void test_sampler_softmax(void **state) {
    (void)state;
    uint32_t h = 99;
    static float x[4096], ref[4096], w[4096];
    const float temps[] = {1.0f, 0.7f, 1.3f, 0.05f, 1e-38f}; /* the last overflows most logits to inf */
    for (int trial = 0; trial < 400; trial++) {
        const int n = trial % 67 + (trial % 4 == 0 ? 1000 : 0);
        const float t = temps[trial % 5];
        for (int i = 0; i < n; i++) {
            const uint32_t k = lcg(&h) >> 24;
            x[i] = (unit(&h) - 0.5f) * 40.0f;
            if (trial % 3 == 0) x[i] = k < 4 ? NAN : k < 8 ? -INFINITY : k < 10 ? INFINITY : x[i];
            ref[i] = x[i];
        }
        float want = -INFINITY;
        int want_fin = 1;
        for (int i = 0; i < n; i++) {
            if (isfinite(ref[i]) && t != 1.0f) ref[i] /= t;
            if (!isfinite(ref[i])) want_fin = 0;
            if (ref[i] > want) want = ref[i];
        }
        int fin = -1;
        const float got = tsr_div_max(x, n, t, &fin);
        assert_memory_equal(x, ref, (size_t)n * sizeof *x);
        if (!(got == want || (isnan(got) && isnan(want)))) fail_msg("n %d t %g: max %g, want %g", n, t, got, want);
        assert_int_equal(fin, want_fin);
    }
    long differ = 0, total = 0;
    for (int trial = 0; trial < 200; trial++) {
        const int n = trial % 37 + 4000;
        const float mx = (unit(&h) - 0.5f) * 20.0f;
        for (int i = 0; i < n; i++) /* differences 0 .. -112, the float subnormals among them */
            x[i] = i == 0 ? mx : mx - unit(&h) * (trial % 2 ? 112.0f : 30.0f);
        double zref = 0;
        for (int i = 0; i < n; i++) {
            ref[i] = (float)exp((double)x[i] - (double)mx);
            zref += (double)ref[i];
        }
        const double z = tsr_exp_weights(x, n, mx, w);
        if (!(fabs(z - zref) <= 1e-12 * zref)) fail_msg("sum %.17g, want %.17g", z, zref);
        for (int i = 0; i < n; i++) {
            int32_t a, b;
            memcpy(&a, &w[i], 4);
            memcpy(&b, &ref[i], 4);
            if (a != b) differ++;
            if (a - b > 1 || b - a > 1)
                fail_msg("e^(%.9g - %.9g): %.9g, want %.9g", (double)x[i], (double)mx, (double)w[i], (double)ref[i]);
        }
        total += n;
        for (int i = 0; i < n; i++) ref[i] = (float)((double)w[i] / z);
        tsr_div_by(w, n, z);
        assert_memory_equal(w, ref, (size_t)n * sizeof *w);
    }
    printf("# %ld of %ld weights one float ulp from the C library's\n", differ, total);
    assert_true(differ * 10000 <= total);
}

/* tsr_topp_buckets against the formula, pair by pair (every tail length):
 * logits at, next to and far below the maximum. */
static void test_topp_buckets(void **state) {
    (void)state;
    uint32_t h = 3;
    static float pairs[2 * 300];
    static uint16_t b[300];
    for (int trial = 0; trial < 300; trial++) {
        const int n = trial;
        const float mx = (unit(&h) - 0.5f) * 10.0f;
        for (int i = 0; i < n; i++) {
            const uint32_t k = lcg(&h) >> 28;
            pairs[2 * i] = k == 0 ? mx : k == 1 ? nextafterf(mx, -INFINITY) : mx - unit(&h) * (k < 8 ? 40.0f : 4.0f);
            pairs[2 * i + 1] = (float)i; /* the id's slot */
        }
        tsr_topp_buckets(pairs, n, mx, 32.0f, 1024, b);
        for (int i = 0; i < n; i++) {
            const double t = ((double)mx - (double)pairs[2 * i]) * 32.0;
            const int want = t < 1024.0 ? (int)((mx - pairs[2 * i]) * 32.0f) : 1024;
            if (b[i] != want) fail_msg("n %d, pair %d: bucket %d, want %d", n, i, b[i], want);
        }
    }
}

/* tsr_draw_weights against one sequential pass (the first cumulative sum
 * above u * total, only weights in (0, FLT_MAX] counting): lengths across
 * its blocks of 1,024, rows of zeros, negatives, NaN and infinities, and u
 * at 0 and next to 1 (the last counted weight). The sums round differently
 * in the two orders, so a draw may differ where its target lies within
 * rounding of a boundary (u next to 1 before tiny last weights): there the
 * index drawn must still hold the target within 1e-12 of the total. */
static void test_draw_weights(void **state) {
    (void)state;
    uint32_t h = 7;
    static float p[5000];
    for (int trial = 0; trial < 600; trial++) {
        const int n = (int)(lcg(&h) % 5000);
        for (int i = 0; i < n; i++) {
            const uint32_t k = lcg(&h) >> 24;
            /* odd trials: weights over 2^-58..1, whose double sums round (the blocks' order differs) */
            p[i] = trial % 2 ? expf(-40.0f * unit(&h)) : unit(&h);
            p[i] = trial % 5 == 0 ? 0.0f : k < 40 ? 0.0f : k < 44 ? -p[i] : k < 46 ? NAN : k < 48 ? INFINITY : p[i];
        }
        for (int j = 0; j < 8; j++) {
            const double u = j == 0 ? 0.0 : j == 1 ? 1.0 - 0x1p-53 : (double)unit(&h);
            double tot = 0;
            for (int i = 0; i < n; i++)
                if (p[i] > 0 && p[i] <= FLT_MAX) tot += (double)p[i];
            int64_t want = -1;
            if (tot > 0) {
                double cum = 0, target = u * tot;
                for (int i = 0; i < n; i++) {
                    if (!(p[i] > 0 && p[i] <= FLT_MAX)) continue;
                    cum += (double)p[i];
                    want = i;
                    if (target < cum) break;
                }
            }
            const int64_t got = tsr_draw_weights(p, n, u);
            if (got == want) continue;
            /* otherwise only where the target lies within rounding of got's boundaries */
            double before = 0, upto = 0;
            for (int i = 0; i <= got && got >= 0; i++)
                if (p[i] > 0 && p[i] <= FLT_MAX) before = upto, upto += (double)p[i];
            const double target = u * tot, tol = 1e-12 * tot;
            if (got < 0 || !(p[got] > 0 && p[got] <= FLT_MAX) || !(before <= target + tol && target - tol < upto))
                fail_msg("n %d u %.17g: %lld, want %lld", n, u, (long long)got, (long long)want);
        }
    }
}

/* tsr_first_above against the element-by-element scan: every start and
 * floor over values with NaN and -inf, the answer in the body or the tail. */
static void test_first_above(void **state) {
    (void)state;
    float x[45];
    for (int i = 0; i < 45; i++) x[i] = (float)((i * 37) % 11) - 5.0f;
    x[3] = NAN, x[20] = -INFINITY, x[44] = NAN;
    for (int n = 0; n <= 45; n++)
        for (float floor = -6.0f; floor <= 6.0f; floor += 0.5f) {
            int64_t want = 0;
            while (want < n && !(x[want] > floor)) want++;
            if (tsr_first_above(x, n, floor) != want) fail_msg("n %d, floor %g: want %lld", n, floor, (long long)want);
        }
}

static void test_argmax(void **state) {
    (void)state;
    uint32_t h = 12345;
    float x[300];
    for (int trial = 0; trial < 4000; trial++) {
        const int n = 1 + trial % 97 + (trial % 3 == 0 ? 200 : 0);
        for (int i = 0; i < n; i++) {
            h = h * 1664525u + 1013904223u;
            const uint32_t k = h >> 24;
            x[i] = k < 8 ? NAN : k < 16 ? -INFINITY : k < 24 ? 0.0f : k < 32 ? -0.0f : (float)(int)(h >> 27) - 8.0f;
            if (trial % 5 == 0) x[i] = k < 128 ? NAN : -INFINITY; /* rows with nothing above -inf */
        }
        const int32_t want = scan_above(x, n, -INFINITY);
        assert_int_equal(tsr_argmax_above(x, n, -INFINITY), want);
        assert_int_equal(tsr_argmax_above(x, n, 1.0f), scan_above(x, n, 1.0f));
        int32_t first = 0; /* tsr_argmax: -inf counts, the first non-NaN when nothing is above */
        while (first < n && isnan(x[first])) first++;
        assert_int_equal(tsr_argmax(x, n), want >= 0 ? want : first < n ? first : 0);
    }
}

/* tsr_absmax: the largest |x| and whether a NaN was seen, as a plain scan
 * gives them, over lengths with SIMD tails and NaN, Inf and signed zeros
 * anywhere (the maximum is only compared when no NaN was seen). */
static void test_absmax(void **state) {
    (void)state;
    uint32_t h = 777;
    float x[300];
    for (int trial = 0; trial < 4000; trial++) {
        const int n = trial % 61 + (trial % 4 == 0 ? 230 : 0);
        for (int i = 0; i < n; i++) {
            h = h * 1664525u + 1013904223u;
            const uint32_t k = h >> 24;
            x[i] = k < 2 ? NAN : k < 4 ? (k & 1 ? INFINITY : -INFINITY) : k < 12 ? -0.0f
                                                                         : ((float)(h >> 8) * 0x1p-24f - 0.5f) * 6.0f;
        }
        int want_nan = 0;
        float want = 0.0f;
        for (int i = 0; i < n; i++) {
            if (isnan(x[i])) want_nan = 1;
            else if (fabsf(x[i]) > want) want = fabsf(x[i]);
        }
        int nan = -1;
        float got = tsr_absmax(x, n, &nan);
        assert_int_equal(nan, want_nan);
        if (!want_nan && got != want)
            fail_msg("n %d: absmax %g, want %g", n, (double)got, (double)want);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_silu_mul_accuracy),
        cmocka_unit_test(test_silu_mul_specials),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_sum_exp),
        cmocka_unit_test(test_first_above),
        cmocka_unit_test(test_sampler_softmax),
        cmocka_unit_test(test_draw_weights),
        cmocka_unit_test(test_topp_buckets),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_absmax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
