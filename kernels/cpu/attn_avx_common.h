/*
 * attn_avx_common.h - what the AVX2 and AVX-512 attention tile paths share
 * (include only from files built with -mavx2 -mfma): the keys' and values'
 * software prefetch, step (2) of a block (the online softmax over its
 * scores, one lane per query), and the instances of a path's run_range for
 * each query count and KV dtype with the entry that picks one.
 */
#ifndef TSR_KERNELS_CPU_ATTN_AVX_COMMON_H
#define TSR_KERNELS_CPU_ATTN_AVX_COMMON_H

#include <immintrin.h>
#include <math.h>

#include "attn_kernels.h"
#include "exp_avx2.h"
#include "slots/tsr_plugin.h"

/* Keys and values are asked into L2 this many tokens ahead of the one being
 * read: in a decode pass the KV comes from memory (the weights' stream has
 * evicted it) and the hardware prefetchers alone left the kernels waiting
 * (BENCHMARKS.md, thirtieth session). */
#define TSR_ATTN_PF_TOKENS 32

/* Bytes of one stored element of KV dtype DT (F16, I8 or F32). */
static inline __attribute__((always_inline)) int64_t tsr_attn_elem_bytes(const uint32_t DT) {
    return DT == TSR_DTYPE_F16 ? 2 : DT == TSR_DTYPE_I8 ? 1 : 4;
}

/* Ask L2 for the row (hd elements of dtype DT: F16, I8 or F32) that lies
 * TSR_ATTN_PF_TOKENS tokens after the one at element offset off of base.
 * Prefetches never fault, so rows past the end of the cache cost nothing
 * but the request. */
static inline __attribute__((always_inline)) void tsr_attn_prefetch_ahead(const void *base, int64_t off,
                                                                         const tsr_attn_kv *kv, int hd,
                                                                         const uint32_t DT) {
    const int64_t eb = tsr_attn_elem_bytes(DT);
    const char *p = (const char *)base + (off + (int64_t)TSR_ATTN_PF_TOKENS * kv->token_stride) * eb;
    for (int64_t o = 0; o < hd * eb; o += 64) _mm_prefetch(p + o, _MM_HINT_T1);
}

/* The rows of tokens [t0, t0 + TSR_ATTN_PF_TOKENS) of K and V (those the
 * loops' prefetch ahead does not ask for), asked into L2 at a range's start:
 * at 160 keys a decode pass's attention ~5% shorter (~0.8 us a layer of the
 * Qwen2.5-0.5B shape, BENCHMARKS.md, thirtieth session). */
static inline __attribute__((always_inline)) void tsr_attn_prefetch_first(const tsr_attn_kv *kv, int hd, int t0,
                                                                         int t1, const uint32_t DT) {
    const int64_t eb = tsr_attn_elem_bytes(DT);
    const int end = t1 < t0 + TSR_ATTN_PF_TOKENS ? t1 : t0 + TSR_ATTN_PF_TOKENS;
    for (int j = t0; j < end; j++)
        for (int64_t o = 0; o < hd * eb; o += 64) {
            _mm_prefetch((const char *)kv->k + j * kv->token_stride * eb + o, _MM_HINT_T1);
            _mm_prefetch((const char *)kv->v + j * kv->token_stride * eb + o, _MM_HINT_T1);
        }
}

/* S holds n rows of 8 scores (lane i: query i; lanes past the tile's
 * queries finite). Updates the tile's running max m and sum l, overwrites S
 * with the weights exp(s - max) (times the token's value scale for I8) and
 * writes each query's factor for its old accumulator to al. A NaN score
 * leaves l NaN. */
static inline __attribute__((always_inline)) void tsr_attn_softmax_block(tsr_attn_tile *t, const tsr_attn_kv *kv,
                                                                        int tb, int n, float *S, float *al,
                                                                        const uint32_t DT) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 mo = _mm256_loadu_ps(t->m), mb = ninf, nanm = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        __m256 s = _mm256_load_ps(S + 8 * j);
        nanm = _mm256_or_ps(nanm, _mm256_cmp_ps(s, s, _CMP_UNORD_Q));
        mb = _mm256_max_ps(s, mb); /* NaN scores skipped here, caught by nanm */
    }
    __m256 mn = _mm256_max_ps(mb, mo);
    /* lanes with nothing but -Inf so far: subtract 0 so -Inf scores give 0 */
    __m256 mu = _mm256_blendv_ps(mn, _mm256_setzero_ps(), _mm256_cmp_ps(mn, ninf, _CMP_EQ_OQ));
    __m256 alpha = tsr_exp256(_mm256_sub_ps(mo, mu));
    __m256 lsum = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        __m256 p = tsr_exp256(_mm256_sub_ps(_mm256_load_ps(S + 8 * j), mu));
        lsum = _mm256_add_ps(lsum, p);
        if (DT == TSR_DTYPE_I8)
            p = _mm256_mul_ps(p, _mm256_set1_ps(kv->v_scale[(int64_t)(tb + j) * kv->scale_stride]));
        _mm256_store_ps(S + 8 * j, p);
    }
    __m256 l = _mm256_fmadd_ps(_mm256_loadu_ps(t->l), alpha, lsum);
    _mm256_storeu_ps(t->l, _mm256_or_ps(l, nanm));
    _mm256_storeu_ps(t->m, mn);
    _mm256_storeu_ps(al, alpha);
}

/* A tile path's kernels for one query count and any KV dtype. */
typedef void (*tsr_attn_range_fn)(tsr_attn_tile *t, const tsr_attn_kv *kv, int hd, float scale, int t0, int t1);

/* Instances of the including file's always-inline
 * run_range(t, kv, hd, scale, t0, t1, NQ, DT) for NQ (a constant) and each
 * KV dtype. */
#define TSR_ATTN_RANGE_FN(NQ)                                                                              \
    static void run_range_##NQ(tsr_attn_tile *t, const tsr_attn_kv *kv, int hd, float scale, int t0, int t1) { \
        switch (kv->dtype) {                                                                               \
        case TSR_DTYPE_F16: run_range(t, kv, hd, scale, t0, t1, NQ, TSR_DTYPE_F16); break;                \
        case TSR_DTYPE_I8: run_range(t, kv, hd, scale, t0, t1, NQ, TSR_DTYPE_I8); break;                  \
        default: run_range(t, kv, hd, scale, t0, t1, NQ, TSR_DTYPE_F32); break;                           \
        }                                                                                                  \
    }

/* run_ranges[nq - 1]: the instances for 1..TSR_ATTN_TILE queries. */
#define TSR_ATTN_RANGE_TABLE                                                                               \
    TSR_ATTN_RANGE_FN(1)                                                                                   \
    TSR_ATTN_RANGE_FN(2)                                                                                   \
    TSR_ATTN_RANGE_FN(3)                                                                                   \
    TSR_ATTN_RANGE_FN(4)                                                                                   \
    TSR_ATTN_RANGE_FN(5)                                                                                   \
    TSR_ATTN_RANGE_FN(6)                                                                                   \
    TSR_ATTN_RANGE_FN(7)                                                                                   \
    TSR_ATTN_RANGE_FN(8)                                                                                   \
    static const tsr_attn_range_fn run_ranges[TSR_ATTN_TILE] = {run_range_1, run_range_2, run_range_3,   \
                                                                run_range_4, run_range_5, run_range_6,   \
                                                                run_range_7, run_range_8};

/* The lanes past the tile's queries set to harmless state (the arrays are
 * 8 wide), then the instance for its query count (1..8). */
static inline void tsr_attn_run_tile(const tsr_attn_range_fn *fns, tsr_attn_tile *t, const tsr_attn_kv *kv, int hd,
                                     float scale, int t0, int t1) {
    for (int i = t->nq; i < TSR_ATTN_TILE; i++) {
        t->m[i] = -INFINITY;
        t->l[i] = 0.0f;
    }
    fns[(t->nq < 1 ? 1 : t->nq > TSR_ATTN_TILE ? TSR_ATTN_TILE : t->nq) - 1](t, kv, hd, scale, t0, t1);
}

#endif /* TSR_KERNELS_CPU_ATTN_AVX_COMMON_H */
