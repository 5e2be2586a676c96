/*
 * attn_kernels_avx512.c - the AVX-512F path of the attention tiles (built
 * with -mavx512f -mavx2 -mfma -mf16c; called only after the run-time check
 * in attn_kernels.c, for head_dim a multiple of 16).
 *
 * The AVX2 path's blocks (attn_kernels_avx2.c) in 512-bit vectors:
 * (1) scores two tokens at a time: an 8-dim slice of both tokens' keys is
 *     one vector (token j in the low half, j + 1 in the high), multiplied
 *     into one accumulator a query against that query's slice held twice
 *     (qq, built once a call); the 8 accumulators are then summed across by
 *     one transposition tree (21 operations for 16 scores) that lands them
 *     as S's rows j and j + 1, one store;
 * (2) the online softmax as the AVX2 path's (attn_avx_common.h);
 * (3) values 32 dims at a time: two 16-wide value vectors a token, each
 *     query's weight broadcast into both, the queries' output slices in
 *     registers while the block's values stream through once.
 * Per token and query at head_dim 64 that is 8 FMAs and ~1.3 reduction
 * operations in 512-bit vectors, against 16 FMAs and ~1.5 in 256-bit ones.
 */
#include "attn_kernels_impl.h"

#ifdef TSR_ATTN_HAVE_AVX512_BUILD

#include <immintrin.h>
#include <math.h>

#include "attn_avx_common.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Largest head_dim this path takes (qq lives on the stack). */
#define MAX_HD 256

/* Dims [d, d + 8) of the tokens at element offsets b0 (low half) and b1
 * (high half), as floats. */
ALWAYS_INLINE __m512 ld8x2(uint32_t dt, const void *base, int64_t b0, int64_t b1) {
    if (dt == TSR_DTYPE_F16) {
        const uint16_t *p = base;
        __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p + b0))),
                                            _mm_loadu_si128((const __m128i *)(p + b1)), 1);
        return _mm512_cvtph_ps(h);
    }
    if (dt == TSR_DTYPE_I8) {
        const int8_t *p = base;
        __m128i q = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(p + b0)),
                                       _mm_loadl_epi64((const __m128i *)(p + b1)));
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
    }
    const float *p = base;
    __m512d lo = _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(p + b0)));
    return _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_loadu_ps(p + b1)), 1));
}

/* Dims [off, off + 16) of a token, as floats. */
ALWAYS_INLINE __m512 ld16(uint32_t dt, const void *base, int64_t off) {
    if (dt == TSR_DTYPE_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + off)));
    if (dt == TSR_DTYPE_I8)
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)base + off))));
    return _mm512_loadu_ps((const float *)base + off);
}

/* a[0..8) each hold two tokens' 8 partial sums (low half token j, high
 * half token j + 1) for query i: lanes 0-7 of the result are token j's 8
 * sums (query i in lane i), lanes 8-15 token j + 1's. */
ALWAYS_INLINE __m512 sum8x2(const __m512 *a) {
    /* per 128-bit lane: [a0 0+2, a1 0+2, a0 1+3, a1 1+3] */
    __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
    __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
    __m512 s45 = _mm512_add_ps(_mm512_unpacklo_ps(a[4], a[5]), _mm512_unpackhi_ps(a[4], a[5]));
    __m512 s67 = _mm512_add_ps(_mm512_unpacklo_ps(a[6], a[7]), _mm512_unpackhi_ps(a[6], a[7]));
    /* per 128-bit lane: the lane's sums of a0..a3 (t0) and a4..a7 (t1) */
    __m512 t0 = _mm512_add_ps(_mm512_shuffle_ps(s01, s23, 0x44), _mm512_shuffle_ps(s01, s23, 0xEE));
    __m512 t1 = _mm512_add_ps(_mm512_shuffle_ps(s45, s67, 0x44), _mm512_shuffle_ps(s45, s67, 0xEE));
    /* 128-bit lanes 0, 1 are token j's halves, 2, 3 token j + 1's */
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    const __m512i hi = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    return _mm512_add_ps(_mm512_permutex2var_ps(t0, lo, t1), _mm512_permutex2var_ps(t0, hi, t1));
}

/* Scores of the NQ queries for token j of the block and, with TWO, token
 * j + 1 (S rows j, j + 1; lanes past NQ zero). qq: the queries' 8-dim
 * slices held twice, [NQ][hd / 8][16]. */
ALWAYS_INLINE void score_pair(const float *qq, const tsr_attn_kv *kv, int hd, float scale, int tb, int j,
                              int two, float *S, const int NQ, const uint32_t DT) {
    const int64_t b0 = (int64_t)(tb + j) * kv->token_stride, b1 = two ? b0 + kv->token_stride : b0;
    __m512 a[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) a[i] = _mm512_setzero_ps();
    tsr_attn_prefetch_ahead(kv->k, b0, kv, hd, DT);
    if (two) tsr_attn_prefetch_ahead(kv->k, b1, kv, hd, DT);
    for (int d = 0; d < hd; d += 8) {
        const __m512 k = ld8x2(DT, kv->k, b0 + d, b1 + d);
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) a[i] = _mm512_fmadd_ps(_mm512_load_ps(qq + ((int64_t)i * hd + d) * 2), k, a[i]);
    }
    float s0 = scale, s1 = scale;
    if (DT == TSR_DTYPE_I8) {
        s0 *= kv->k_scale[(int64_t)(tb + j) * kv->scale_stride];
        if (two) s1 *= kv->k_scale[(int64_t)(tb + j + 1) * kv->scale_stride];
    }
    const __m512 r = _mm512_mul_ps(sum8x2(a), _mm512_castpd_ps(_mm512_insertf64x4(
                                                  _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(s0))),
                                                  _mm256_castps_pd(_mm256_set1_ps(s1)), 1)));
    if (two)
        _mm512_store_ps(S + 8 * j, r);
    else
        _mm256_store_ps(S + 8 * j, _mm512_castps512_ps256(r));
}

/* acc[i] = acc[i] * al[i] + sum_j P[j][i] v_j over the block for dims
 * [d, d + 16 * DB) (DB 1 or 2): each broadcast weight serves DB vectors,
 * each value vector NQ queries. */
ALWAYS_INLINE void v_pass(tsr_attn_tile *t, const tsr_attn_kv *kv, int hd, int tb, int n, const float *P,
                          const float *al, int d, const int NQ, const int DB, const uint32_t DT) {
    __m512 o[2][8];
#pragma GCC unroll 8
    for (int i = 0; i < NQ; i++) {
        const __m512 a = _mm512_set1_ps(al[i]);
        o[0][i] = _mm512_mul_ps(_mm512_loadu_ps(t->acc[i] + d), a);
        if (DB == 2) o[1][i] = _mm512_mul_ps(_mm512_loadu_ps(t->acc[i] + d + 16), a);
    }
    const int64_t ts = kv->token_stride;
    for (int j = 0; j < n; j++) {
        const int64_t b = (int64_t)(tb + j) * ts + d;
        if (d == 0) tsr_attn_prefetch_ahead(kv->v, b, kv, hd, DT);
        const __m512 v0 = ld16(DT, kv->v, b), v1 = DB == 2 ? ld16(DT, kv->v, b + 16) : v0;
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) {
            const __m512 p = _mm512_set1_ps(P[8 * j + i]);
            o[0][i] = _mm512_fmadd_ps(p, v0, o[0][i]);
            if (DB == 2) o[1][i] = _mm512_fmadd_ps(p, v1, o[1][i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < NQ; i++) {
        _mm512_storeu_ps(t->acc[i] + d, o[0][i]);
        if (DB == 2) _mm512_storeu_ps(t->acc[i] + d + 16, o[1][i]);
    }
}

/* One block of n <= TSR_ATTN_BLOCK tokens from tb. */
ALWAYS_INLINE void run_block(tsr_attn_tile *t, const float *qq, const tsr_attn_kv *kv, int hd, float scale,
                             int tb, int n, const int NQ, const uint32_t DT) {
    float S[TSR_ATTN_BLOCK * 8] __attribute__((aligned(64)));
    int j = 0;
    for (; j + 2 <= n; j += 2) score_pair(qq, kv, hd, scale, tb, j, 1, S, NQ, DT);
    if (j < n) score_pair(qq, kv, hd, scale, tb, j, 0, S, NQ, DT);

    float al[8] __attribute__((aligned(32)));
    tsr_attn_softmax_block(t, kv, tb, n, S, al, DT);

    int d = 0;
    for (; d + 32 <= hd; d += 32) v_pass(t, kv, hd, tb, n, S, al, d, NQ, 2, DT);
    if (d < hd) v_pass(t, kv, hd, tb, n, S, al, d, NQ, 1, DT);
}

ALWAYS_INLINE void run_range(tsr_attn_tile *t, const tsr_attn_kv *kv, int hd, float scale, int t0, int t1,
                             const int NQ, const uint32_t DT) {
    tsr_attn_prefetch_first(kv, hd, t0, t1, DT);
    /* each query's 8-dim slices twice over, for the two-token key vectors */
    float qq[8 * MAX_HD * 2] __attribute__((aligned(64)));
    for (int i = 0; i < NQ; i++)
        for (int d = 0; d < hd; d += 8) {
            const __m256 q = _mm256_loadu_ps(t->q[i] + d);
            _mm256_store_ps(qq + ((int64_t)i * hd + d) * 2, q);
            _mm256_store_ps(qq + ((int64_t)i * hd + d) * 2 + 8, q);
        }
    for (int tb = t0; tb < t1; tb += TSR_ATTN_BLOCK) {
        const int n = t1 - tb < TSR_ATTN_BLOCK ? t1 - tb : TSR_ATTN_BLOCK;
        run_block(t, qq, kv, hd, scale, tb, n, NQ, DT);
    }
}

TSR_ATTN_RANGE_TABLE

int tsr_attn_tile_run_avx512(tsr_attn_tile *t, const tsr_attn_kv *kv, int hd, float scale, int t0, int t1) {
    if (hd % 16 || hd > MAX_HD) return 0;
    tsr_attn_run_tile(run_ranges, t, kv, hd, scale, t0, t1);
    return 1;
}

#endif /* TSR_ATTN_HAVE_AVX512_BUILD */
