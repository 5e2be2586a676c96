/*
 * exp_avx2.h - e^x on 8 floats for files built with -mavx2 -mfma (the
 * attention kernels' softmax, the FFN's SiLU). Include only from such files.
 */
#ifndef TSR_KERNELS_EXP_AVX2_H
#define TSR_KERNELS_EXP_AVX2_H

#include <immintrin.h>

/* e^x, about 2 ulp, NaN in -> NaN out, x < -87 -> 0 (no subnormals),
 * x > 88 -> e^88 (callers that need overflow to inf test x themselves). */
static inline __attribute__((always_inline)) __m256 tsr_exp256(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.0f);
    /* operand order keeps NaN: max/min return the second operand on NaN */
    __m256 xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    /* Taylor series of e^r to r^6 on |r| <= ln2/2 */
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), res);
}

#endif /* TSR_KERNELS_EXP_AVX2_H */
