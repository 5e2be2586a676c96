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
#endif
