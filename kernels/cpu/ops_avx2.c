/*
 * ops_avx2.c - AVX2 + FMA paths of ops.h (built with those flags; called only
 * after ops.c's run-time check).
 */
#include "ops.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

#include "exp_avx2.h"

/* silu(g) * u = g / (1 + e^-g) * u, e^-g from tsr_exp256 (about 2 ulp; inf
 * past expf's overflow point, as expf gives, so that g = -inf is NaN too). */
void tsr_silu_mul_avx2(float *y, const float *g, const float *u, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256 big = _mm256_set1_ps(88.72283935546875f), inf = _mm256_set1_ps(INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(g + i), x = _mm256_xor_ps(a, sign);
        __m256 e = _mm256_blendv_ps(tsr_exp256(x), inf, _mm256_cmp_ps(x, big, _CMP_GT_OQ));
        __m256 s = _mm256_div_ps(a, _mm256_add_ps(one, e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) {
        float a = g[i];
        y[i] = a / (1.0f + expf(-a)) * u[i];
    }
}

/* tsr_sum_exp over the whole vectors of x: the terms in f32 (x - mx, then
 * tsr_exp256; NaN and -inf lanes masked to 0), summed in four chains of
 * double lanes. Returns the elements done; *sum their sum. */
int64_t tsr_sum_exp_avx2(const float *x, int64_t n, float mx, double *sum) {
    const __m256 m = _mm256_set1_ps(mx), ninf = _mm256_set1_ps(-INFINITY);
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        __m256 e0 = _mm256_and_ps(tsr_exp256(_mm256_sub_ps(v0, m)), _mm256_cmp_ps(v0, ninf, _CMP_GT_OQ));
        __m256 e1 = _mm256_and_ps(tsr_exp256(_mm256_sub_ps(v1, m)), _mm256_cmp_ps(v1, ninf, _CMP_GT_OQ));
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(e0)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(e0, 1)));
        a2 = _mm256_add_pd(a2, _mm256_cvtps_pd(_mm256_castps256_ps128(e1)));
        a3 = _mm256_add_pd(a3, _mm256_cvtps_pd(_mm256_extractf128_ps(e1, 1)));
    }
    __m256d a = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
    double lanes[4];
    _mm256_storeu_pd(lanes, a);
    *sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    return i;
}

/* sum of x[i]^2 in four chains of 8 lanes (the scalar loop is one chain of
 * add latency: 0.5 ms a call for the 1B shape's 128-row prompt). */
float tsr_sumsq_avx2(const float *x, int n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        __m256 v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
        a0 = _mm256_fmadd_ps(v0, v0, a0), a1 = _mm256_fmadd_ps(v1, v1, a1);
        a2 = _mm256_fmadd_ps(v2, v2, a2), a3 = _mm256_fmadd_ps(v3, v3, a3);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(v, v, a0);
    }
    __m256 a = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float ss = _mm_cvtss_f32(h);
    for (; i < n; i++) ss += x[i] * x[i];
    return ss;
}

/* y[i] = (x[i] * s) * w[i], rounded as the scalar expression is (y may be x). */
void tsr_scale_mul_avx2(float *y, const float *x, float s, const float *w, int n) {
    const __m256 sv = _mm256_set1_ps(s);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv), _mm256_loadu_ps(w + i)));
    for (; i < n; i++) y[i] = (x[i] * s) * w[i];
}

/* RoPE on halves (pairs i, i + hd/2) of n_heads heads of hd: the rotation by
 * angle i (cosine c[i], sine s[i]), eight pairs at a time. */
void tsr_rotate_halves_avx2(float *x, const float *c, const float *s, int n_heads, int hd) {
    const int half = hd / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v0 = x + (int64_t)h * hd, *v1 = v0 + half;
        int i = 0;
        for (; i + 8 <= half; i += 8) {
            __m256 a = _mm256_loadu_ps(v0 + i), b = _mm256_loadu_ps(v1 + i);
            __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
            _mm256_storeu_ps(v0 + i, _mm256_sub_ps(_mm256_mul_ps(a, cv), _mm256_mul_ps(b, sv)));
            _mm256_storeu_ps(v1 + i, _mm256_add_ps(_mm256_mul_ps(b, cv), _mm256_mul_ps(a, sv)));
        }
        for (; i < half; i++) {
            float a = v0[i], b = v1[i];
            v0[i] = a * c[i] - b * s[i];
            v1[i] = b * c[i] + a * s[i];
        }
    }
}

/* tsr_absmax over the first n / 8 * 8 elements: eight lanes of maxima and of
 * NaN flags (the maximum is exact in any order); returns how many it read,
 * the caller's scan does the rest. */
int64_t tsr_absmax_avx2(const float *x, int64_t n, float *amax, int *nan) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps(), un = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 v = _mm256_and_ps(_mm256_loadu_ps(x + c), abs_mask);
        un = _mm256_or_ps(un, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m = _mm256_max_ps(m, v);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    *amax = _mm_cvtss_f32(h);
    *nan = _mm256_movemask_ps(un) != 0;
    return c;
}

/* tsr_argmax_above's two scans over the first n / 32 * 32 elements (the
 * caller does the rest): the maximum above floor in four chains of eight
 * lanes (max(v, m) keeps m when v is NaN, as "v > m ? v : m" does; a
 * maximum does not depend on the order), and the first index holding v
 * (-1 if none). */
int64_t tsr_max_above_avx2(const float *x, int64_t n, float floor, float *best) {
    __m256 m0 = _mm256_set1_ps(floor), m1 = m0, m2 = m0, m3 = m0;
    int64_t c = 0;
    for (; c + 32 <= n; c += 32) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + c), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(x + c + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(x + c + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(x + c + 24), m3);
    }
    __m256 m = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    *best = _mm_cvtss_f32(h);
    return c;
}

/* The first x[c] == v (above: > v) in the whole vectors (NaN never), -1 if none. */
static int64_t first_where(const float *x, int64_t n, float v, int above) {
    const __m256 vv = _mm256_set1_ps(v);
    for (int64_t c = 0; c + 8 <= n; c += 8) {
        const __m256 xs = _mm256_loadu_ps(x + c);
        const __m256 m = above ? _mm256_cmp_ps(xs, vv, _CMP_GT_OQ) : _mm256_cmp_ps(xs, vv, _CMP_EQ_OQ);
        const int hit = _mm256_movemask_ps(m);
        if (hit) return c + __builtin_ctz((unsigned)hit);
    }
    return -1;
}

int64_t tsr_find_avx2(const float *x, int64_t n, float v) { return first_where(x, n, v, 0); }

int64_t tsr_first_above_avx2(const float *x, int64_t n, float floor) { return first_where(x, n, floor, 1); }

/* tsr_div_max over whole vectors: the finite lanes divided by t (t != 1),
 * the maximum taken with NaN lanes skipped (max_ps returns its second
 * operand where either is NaN). *mx and *finite as the scalar loop leaves
 * them. Returns the elements done. */
int64_t tsr_div_max_avx2(float *x, int64_t n, float t, float *mx, int *finite) {
    const __m256 tv = _mm256_set1_ps(t), inf = _mm256_set1_ps(INFINITY), sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_set1_ps(-INFINITY);
    int fin = 0xff;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 f = _mm256_cmp_ps(_mm256_andnot_ps(sign, v), inf, _CMP_LT_OQ); /* finite: |v| < inf */
        if (t != 1.0f) {
            v = _mm256_blendv_ps(v, _mm256_div_ps(v, tv), f);
            _mm256_storeu_ps(x + i, v);
            f = _mm256_cmp_ps(_mm256_andnot_ps(sign, v), inf, _CMP_LT_OQ); /* the division may overflow */
        }
        fin &= _mm256_movemask_ps(f);
        m = _mm256_max_ps(v, m);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    for (int k = 0; k < 8; k++)
        if (lanes[k] > *mx) *mx = lanes[k];
    if (fin != 0xff) *finite = 0;
    return i;
}

/* e^d on 4 doubles for d <= 0: e^r on |r| <= ln2 / 2 by Taylor's series to
 * r^13 (truncation below 5e-18), 2^n from the exponent bits; d below -104
 * (where a float rounds to 0) gives 0. */
static inline __attribute__((always_inline)) __m256d exp_pd(__m256d d) {
    const __m256d lo = _mm256_set1_pd(-104.0);
    const __m256d zero = _mm256_cmp_pd(d, lo, _CMP_LT_OQ);
    const __m256d dc = _mm256_max_pd(d, lo);
    const __m256d k = _mm256_round_pd(_mm256_mul_pd(dc, _mm256_set1_pd(1.4426950408889634)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d r = _mm256_fnmadd_pd(k, _mm256_set1_pd(0.6931471803691238), dc); /* ln 2, high bits: exact */
    r = _mm256_fnmadd_pd(k, _mm256_set1_pd(1.9082149292705877e-10), r);      /* and the rest */
    __m256d p = _mm256_set1_pd(1.6059043836821613e-10);
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(2.08767569878681e-09));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(2.505210838544172e-08));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(2.755731922398589e-07));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(2.7557319223985893e-06));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(2.48015873015873e-05));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(0.0001984126984126984));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(0.001388888888888889));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(0.008333333333333333));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(0.041666666666666664));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(0.16666666666666666));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(0.5));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
    const __m256i e = _mm256_slli_epi64(
        _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(k)), _mm256_set1_epi64x(1023)), 52);
    return _mm256_andnot_pd(zero, _mm256_mul_pd(p, _mm256_castsi256_pd(e)));
}

/* tsr_exp_weights over whole vectors; the rounded weights summed in double
 * in four chains. Returns the elements done; *sum their sum. */
int64_t tsr_exp_weights_avx2(const float *x, int64_t n, float mx, float *w, double *sum) {
    const __m256d m = _mm256_set1_pd((double)mx);
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128 f[4];
        for (int h = 0; h < 4; h++)
            f[h] = _mm256_cvtpd_ps(exp_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i + 4 * h)), m)));
        for (int h = 0; h < 4; h++) _mm_storeu_ps(w + i + 4 * h, f[h]);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(f[0]));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(f[1]));
        a2 = _mm256_add_pd(a2, _mm256_cvtps_pd(f[2]));
        a3 = _mm256_add_pd(a3, _mm256_cvtps_pd(f[3]));
    }
    __m256d a = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
    double lanes[4];
    _mm256_storeu_pd(lanes, a);
    *sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    return i;
}

/* tsr_div_by over whole vectors (the same double division per weight). */
int64_t tsr_div_by_avx2(float *w, int64_t n, double z) {
    const __m256d zv = _mm256_set1_pd(z);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128 lo = _mm256_cvtpd_ps(_mm256_div_pd(_mm256_cvtps_pd(_mm_loadu_ps(w + i)), zv));
        __m128 hi = _mm256_cvtpd_ps(_mm256_div_pd(_mm256_cvtps_pd(_mm_loadu_ps(w + i + 4)), zv));
        _mm_storeu_ps(w + i, lo);
        _mm_storeu_ps(w + i + 4, hi);
    }
    return i;
}

/* Each whole block's sum of the weights in (0, FLT_MAX] (ordered compares:
 * NaN counts nothing), in double, two chains; block_len a multiple of 8.
 * Returns the blocks done. */
int64_t tsr_weight_sums_avx2(const float *p, int64_t n, double *block, int64_t block_len) {
    const __m256 zero = _mm256_setzero_ps(), big = _mm256_set1_ps(3.40282346638528859812e+38f);
    int64_t b = 0;
    for (; (b + 1) * block_len <= n; b++) {
        __m256d a0 = _mm256_setzero_pd(), a1 = a0;
        for (int64_t i = b * block_len; i < (b + 1) * block_len; i += 8) {
            __m256 v = _mm256_loadu_ps(p + i);
            __m256 ok = _mm256_and_ps(_mm256_cmp_ps(v, zero, _CMP_GT_OQ), _mm256_cmp_ps(v, big, _CMP_LE_OQ));
            v = _mm256_and_ps(v, ok);
            a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
            a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
        }
        double lanes[4];
        _mm256_storeu_pd(lanes, _mm256_add_pd(a0, a1));
        block[b] = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    }
    return b;
}

/* tsr_topp_buckets over whole groups of 8 pairs: the logits picked out of
 * two vectors of pairs (shuffle, then the 64-bit quarters back in order),
 * the buckets packed to 16 bits. Returns the pairs done. */
int64_t tsr_topp_buckets_avx2(const float *x, int64_t n, float mx, float per_unit, int last, uint16_t *b) {
    const __m256 m = _mm256_set1_ps(mx), pu = _mm256_set1_ps(per_unit), top = _mm256_set1_ps((float)last);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 a = _mm256_loadu_ps(x + 2 * i), c = _mm256_loadu_ps(x + 2 * i + 8);
        /* [l0 l1 l4 l5 | l2 l3 l6 l7] -> [l0 l1 l2 l3 | l4 l5 l6 l7] */
        const __m256 l = _mm256_castpd_ps(
            _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, c, _MM_SHUFFLE(2, 0, 2, 0))), 0xd8));
        const __m256 t = _mm256_min_ps(_mm256_mul_ps(_mm256_sub_ps(m, l), pu), top);
        const __m256i q = _mm256_cvttps_epi32(t);
        _mm_storeu_si128((__m128i *)(b + i),
                         _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
    }
    return i;
}

#endif
