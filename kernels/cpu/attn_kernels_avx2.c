/*
 * attn_kernels_avx2.c - the AVX2 + FMA + F16C path of the attention kernels
 * (built with -mavx2 -mfma -mf16c; called only after the run-time check in
 * attn_kernels.c).
 *
 * Per block of TSR_ATTN_BLOCK tokens: (1) scores, token-major with one lane
 * per query: each key vector is loaded once (cvtph for f16, sign-extend and
 * convert for int8, in registers) and multiplied into the accumulators of
 * all queries (up to 4 queries: for 2 tokens at a time), then the
 * accumulators are reduced with one hadd tree; (2) the online softmax on
 * those vectors, all queries at once; (3) for each 8-wide slice of head_dim
 * (up to 4 queries: each pair of slices), the queries' output slices stay in
 * registers while the block's value vectors stream through once. The loop nests are FMA-bound (2 * n_queries * head_dim
 * multiply-adds per token), not load-bound.
 */
#include "attn_kernels_impl.h"

#ifdef TSR_ATTN_HAVE_AVX2_BUILD

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attn_avx_common.h"
#include "ops.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Lane i of the result is the sum of the 8 lanes of a[i]. */
ALWAYS_INLINE __m256 hsum8x8(const __m256 *a) {
    __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 h0123 = _mm256_hadd_ps(h01, h23), h4567 = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20),
                         _mm256_permute2f128_ps(h0123, h4567, 0x31));
}

ALWAYS_INLINE __m256 ld8(uint32_t dt, const void *base, int64_t off) {
    if (dt == TSR_DTYPE_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + off)));
    if (dt == TSR_DTYPE_I8)
        return _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)base + off))));
    return _mm256_loadu_ps((const float *)base + off);
}

/* Scores of queries [qp, qp + QB) for token j0 of the block, and with TWO
 * for token j0 + 1 too (then QB <= 4: each query slice is loaded once for
 * both tokens; lanes 0-3 of the reduced vector are token j0's, lanes 4-7
 * token j0 + 1's). Without TWO, QB <= 8 and qp = 0 when QB > 4. */
ALWAYS_INLINE void score_pass(const tsr_attn_tile *t, const tsr_attn_kv *kv, int hd, float scale,
                              int tb, int j0, float *S, const int QB, const int qp, const int TWO,
                              const uint32_t DT) {
    const int64_t b0 = (int64_t)(tb + j0) * kv->token_stride, b1 = b0 + kv->token_stride;
    __m256 a[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
    tsr_attn_prefetch_ahead(kv->k, b0, kv, hd, DT);
    if (TWO) tsr_attn_prefetch_ahead(kv->k, b1, kv, hd, DT);
    for (int d = 0; d < hd; d += 8) {
        __m256 k0 = ld8(DT, kv->k, b0 + d), k1 = TWO ? ld8(DT, kv->k, b1 + d) : k0;
#pragma GCC unroll 8
        for (int i = 0; i < QB; i++) {
            __m256 qv = _mm256_loadu_ps(t->q[qp + i] + d);
            a[i] = _mm256_fmadd_ps(qv, k0, a[i]);
            if (TWO) a[4 + i] = _mm256_fmadd_ps(qv, k1, a[4 + i]);
        }
    }
    float s0 = scale, s1 = scale;
    if (DT == TSR_DTYPE_I8) {
        s0 *= kv->k_scale[(int64_t)(tb + j0) * kv->scale_stride];
        if (TWO) s1 *= kv->k_scale[(int64_t)(tb + j0 + 1) * kv->scale_stride];
    }
    if (!TWO) s1 = s0;
    __m256 r = _mm256_mul_ps(hsum8x8(a), _mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1));
    /* lanes past QB hold zeros for queries that do not exist: S rows are 8 wide */
    if (!TWO && QB > 4) {
        _mm256_store_ps(S + 8 * j0, r);
        return;
    }
    _mm_storeu_ps(S + 8 * j0 + qp, _mm256_castps256_ps128(r));
    if (TWO) _mm_storeu_ps(S + 8 * (j0 + 1) + qp, _mm256_extractf128_ps(r, 1));
}

ALWAYS_INLINE void scores_all(const tsr_attn_tile *t, const tsr_attn_kv *kv, int hd, float scale,
                              int tb, int n, float *S, const int QB, const int qp, const uint32_t DT) {
    int j = 0;
    if (QB <= 4)
        for (; j + 2 <= n; j += 2) score_pass(t, kv, hd, scale, tb, j, S, QB, qp, 1, DT);
    for (; j < n; j++) score_pass(t, kv, hd, scale, tb, j, S, QB, qp, 0, DT);
}

/* acc[qp..qp+QB) = acc * alpha + sum_j P[j] v_j over the block, DB (1 or 2)
 * 8-wide slices of head_dim at a time from d (DB = 2 only for QB <= 4):
 * each broadcast weight serves DB slices, each value vector QB queries. */
ALWAYS_INLINE void v_pass(tsr_attn_tile *t, const tsr_attn_kv *kv, int hd, int tb, int n, const float *P,
                          const float *al, int d, const int QB, const int qp, const int DB,
                          const uint32_t DT) {
    __m256 o[2][8];
#pragma GCC unroll 8
    for (int i = 0; i < QB; i++) {
        __m256 a = _mm256_set1_ps(al[qp + i]);
        o[0][i] = _mm256_mul_ps(_mm256_loadu_ps(t->acc[qp + i] + d), a);
        if (DB == 2) o[1][i] = _mm256_mul_ps(_mm256_loadu_ps(t->acc[qp + i] + d + 8), a);
    }
    const int64_t ts = kv->token_stride;
    for (int j = 0; j < n; j++) {
        const int64_t b = (int64_t)(tb + j) * ts + d;
        if (d == 0) tsr_attn_prefetch_ahead(kv->v, b, kv, hd, DT);
        __m256 v0 = ld8(DT, kv->v, b), v1 = DB == 2 ? ld8(DT, kv->v, b + 8) : v0;
#pragma GCC unroll 8
        for (int i = 0; i < QB; i++) {
            __m256 p = _mm256_broadcast_ss(P + 8 * j + qp + i);
            o[0][i] = _mm256_fmadd_ps(p, v0, o[0][i]);
            if (DB == 2) o[1][i] = _mm256_fmadd_ps(p, v1, o[1][i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < QB; i++) {
        _mm256_storeu_ps(t->acc[qp + i] + d, o[0][i]);
        if (DB == 2) _mm256_storeu_ps(t->acc[qp + i] + d + 8, o[1][i]);
    }
}

ALWAYS_INLINE void v_all(tsr_attn_tile *t, const tsr_attn_kv *kv, int hd, int tb, int n, const float *P,
                         const float *al, const int QB, const int qp, const uint32_t DT) {
    int d = 0;
    if (QB <= 4)
        for (; d + 16 <= hd; d += 16) v_pass(t, kv, hd, tb, n, P, al, d, QB, qp, 2, DT);
    for (; d < hd; d += 8) v_pass(t, kv, hd, tb, n, P, al, d, QB, qp, 1, DT);
}

/* One block of n <= TSR_ATTN_BLOCK tokens from tb, for NQ queries and KV type
 * DT (both constants after inlining). */
ALWAYS_INLINE void run_block(tsr_attn_tile *t, const tsr_attn_kv *kv, int hd, float scale, int tb,
                             int n, const int NQ, const uint32_t DT) {
    float S[TSR_ATTN_BLOCK * 8] __attribute__((aligned(32)));
    /* lanes of queries past NQ must hold finite zeros (with NQ <= 4 the
     * score passes write lanes 0-3 only) */
    if (NQ <= 4) memset(S, 0, sizeof S);

    /* (1) scores */
    /* up to 4 queries: 2 tokens (scores) or 2 slices (values) per pass, so the
     * accumulators of both fit the 16 registers; 5 to 8 queries: one each */
    scores_all(t, kv, hd, scale, tb, n, S, NQ, 0, DT);

    /* (2) online softmax over the block, one lane per query */
    float al[8] __attribute__((aligned(32)));
    tsr_attn_softmax_block(t, kv, tb, n, S, al, DT);

    /* (3) acc = acc * alpha + sum_j p_j v_j */
    v_all(t, kv, hd, tb, n, S, al, NQ, 0, DT);
}

ALWAYS_INLINE void run_range(tsr_attn_tile *t, const tsr_attn_kv *kv, int hd, float scale, int t0,
                             int t1, const int NQ, const uint32_t DT) {
    tsr_attn_prefetch_first(kv, hd, t0, t1, DT);
    for (int tb = t0; tb < t1; tb += TSR_ATTN_BLOCK) {
        int n = t1 - tb < TSR_ATTN_BLOCK ? t1 - tb : TSR_ATTN_BLOCK;
        run_block(t, kv, hd, scale, tb, n, NQ, DT);
    }
}

TSR_ATTN_RANGE_TABLE

void tsr_attn_tile_run_avx2(tsr_attn_tile *t, const tsr_attn_kv *kv, int hd, float scale, int t0,
                            int t1) {
    tsr_attn_run_tile(run_ranges, t, kv, hd, scale, t0, t1);
}

void tsr_attn_store_f16_avx2(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        float tail[8] = {0};
        uint16_t out[8];
        memcpy(tail, src + i, (size_t)(n - i) * sizeof(float));
        _mm_storeu_si128((__m128i *)out, _mm256_cvtps_ph(_mm256_loadu_ps(tail), _MM_FROUND_TO_NEAREST_INT));
        memcpy(dst + i, out, (size_t)(n - i) * sizeof(uint16_t));
    }
}

void tsr_attn_quant_i8_avx2(int8_t *dst, float *scale, const float *src, int64_t n) {
    if (n <= 0) {
        *scale = 0.0f;
        return;
    }
    int nan;
    float m = tsr_absmax(src, n, &nan);
    int isbad = nan || !(m <= 3.40282347e+38f); /* NaN or Inf */
    if (isbad || m == 0.0f) {
        memset(dst, 0, (size_t)n);
        *scale = isbad ? NAN : 0.0f;
        return;
    }
    float invs = 127.0f / m;
    const __m256 inv = _mm256_set1_ps(invs);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i), inv));
        __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        __m128i q8 = _mm_packs_epi16(q16, q16);
        _mm_storel_epi64((__m128i *)(dst + i), q8);
    }
    for (; i < n; i++) dst[i] = (int8_t)lrintf(src[i] * invs);
    *scale = m / 127.0f;
}

#endif /* TSR_ATTN_HAVE_AVX2_BUILD */
