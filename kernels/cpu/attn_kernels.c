/*
 * attn_kernels.c - portable paths of the attention kernels and the run-time
 * choice of the AVX-512 and AVX2 paths (attn_kernels_avx512.c,
 * attn_kernels_avx2.c).
 */
#include <math.h>
#include <string.h>

#include "attn_kernels_impl.h"
#include "cpu_features.h"
#include "kernels/dtype.h"

static int isa_cap; /* TSR_ATTN_ISA_BEST: none */

void tsr_attn_cap_isa(int level) { isa_cap = level; }

/* The best path under cap (TSR_ATTN_ISA_BEST: none) and the global cap. */
static int level_under(int cap) {
    if (isa_cap != TSR_ATTN_ISA_BEST && (cap == TSR_ATTN_ISA_BEST || isa_cap < cap)) cap = isa_cap;
#ifdef TSR_ATTN_HAVE_AVX2_BUILD
    if ((cap == TSR_ATTN_ISA_BEST || cap >= TSR_ATTN_ISA_AVX512) && tsr_cpu_has_avx512f())
        return TSR_ATTN_ISA_AVX512;
    if ((cap == TSR_ATTN_ISA_BEST || cap >= TSR_ATTN_ISA_AVX2) && tsr_cpu_has_avx2_fma_f16c())
        return TSR_ATTN_ISA_AVX2;
#endif
    return TSR_ATTN_ISA_PORTABLE;
}

int tsr_attn_isa_level(void) { return level_under(TSR_ATTN_ISA_BEST); }

const char *tsr_attn_isa(void) {
    const int l = tsr_attn_isa_level();
    return l == TSR_ATTN_ISA_AVX512 ? "avx512" : l == TSR_ATTN_ISA_AVX2 ? "avx2" : "portable";
}

static int use_avx2(void) { return level_under(TSR_ATTN_ISA_BEST) >= TSR_ATTN_ISA_AVX2; }

void tsr_attn_tile_reset(tsr_attn_tile *t, int head_dim) {
    for (int i = 0; i < t->nq; i++) {
        t->m[i] = -INFINITY;
        t->l[i] = 0.0f;
        memset(t->acc[i], 0, (size_t)head_dim * sizeof(float));
    }
}

static inline float kv_elem(uint32_t dtype, const void *base, int64_t off) {
    switch (dtype) {
    case TSR_DTYPE_F16: return tsr_f16_to_f32(((const uint16_t *)base)[off]);
    case TSR_DTYPE_I8: return (float)((const int8_t *)base)[off];
    default: return ((const float *)base)[off];
    }
}

/* One query, one token at a time: the online softmax in its plainest form. */
static void tile_run_portable(tsr_attn_tile *t, const tsr_attn_kv *kv, int hd, float scale, int t0,
                              int t1) {
    const int i8 = kv->dtype == TSR_DTYPE_I8;
    for (int i = 0; i < t->nq; i++) {
        const float *q = t->q[i];
        float *acc = t->acc[i];
        float m = t->m[i], l = t->l[i];
        int nan = 0;
        for (int tok = t0; tok < t1; tok++) {
            int64_t base = (int64_t)tok * kv->token_stride;
            float s = 0.0f;
            for (int d = 0; d < hd; d++) s += q[d] * kv_elem(kv->dtype, kv->k, base + d);
            s *= scale;
            if (i8) s *= kv->k_scale[(int64_t)tok * kv->scale_stride];
            if (s != s) nan = 1;
            float mn = s > m ? s : m;
            if (mn == -INFINITY) continue; /* only -Inf (or NaN) so far: weight 0 */
            if (mn != m) {
                float alpha = expf(m - mn);
                for (int d = 0; d < hd; d++) acc[d] *= alpha;
                l *= alpha;
                m = mn;
            }
            float p = expf(s - m);
            l += p;
            if (i8) p *= kv->v_scale[(int64_t)tok * kv->scale_stride];
            for (int d = 0; d < hd; d++) acc[d] += p * kv_elem(kv->dtype, kv->v, base + d);
        }
        t->m[i] = m;
        t->l[i] = nan ? NAN : l;
    }
}

void tsr_attn_tile_run(tsr_attn_tile *t, const tsr_attn_kv *kv, int head_dim, float scale, int t0,
                       int t1) {
    if (t1 <= t0) return;
#ifdef TSR_ATTN_HAVE_AVX2_BUILD
    const int level = level_under(t->isa);
    if (level >= TSR_ATTN_ISA_AVX512 && tsr_attn_tile_run_avx512(t, kv, head_dim, scale, t0, t1)) return;
    if (level >= TSR_ATTN_ISA_AVX2 && head_dim % 8 == 0) {
        tsr_attn_tile_run_avx2(t, kv, head_dim, scale, t0, t1);
        return;
    }
#endif
    tile_run_portable(t, kv, head_dim, scale, t0, t1);
}

void tsr_attn_tile_finish(const tsr_attn_tile *t, float *const *out, int head_dim) {
    for (int i = 0; i < t->nq; i++) {
        float l = t->l[i];
        /* All scores -Inf: the reference computes exp(-Inf - -Inf) = NaN. */
        float inv = t->m[i] == -INFINITY ? NAN : 1.0f / l;
        for (int d = 0; d < head_dim; d++) out[i][d] = t->acc[i][d] * inv;
    }
}

void tsr_attn_state_merge(float *m, float *l, float *acc, float m2, float l2, const float *acc2,
                          int head_dim) {
    if (l2 != l2) { /* NaN poisons the union */
        *l = NAN;
        return;
    }
    if (m2 == -INFINITY) return; /* the other range had no weight */
    if (*m == -INFINITY) {
        *m = m2;
        *l = l2;
        memcpy(acc, acc2, (size_t)head_dim * sizeof(float));
        return;
    }
    float mn = m2 > *m ? m2 : *m;
    float a = expf(*m - mn), b = expf(m2 - mn);
    for (int d = 0; d < head_dim; d++) acc[d] = acc[d] * a + acc2[d] * b;
    *l = *l * a + l2 * b;
    *m = mn;
}

void tsr_attn_store_f16(uint16_t *dst, const float *src, int64_t n) {
#ifdef TSR_ATTN_HAVE_AVX2_BUILD
    if (use_avx2()) {
        tsr_attn_store_f16_avx2(dst, src, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) dst[i] = tsr_f32_to_f16(src[i]);
}

void tsr_attn_quant_i8(int8_t *dst, float *scale, const float *src, int64_t n) {
#ifdef TSR_ATTN_HAVE_AVX2_BUILD
    if (use_avx2()) {
        tsr_attn_quant_i8_avx2(dst, scale, src, n);
        return;
    }
#endif
    if (n <= 0) {
        *scale = 0.0f;
        return;
    }
    float amax = 0.0f;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(src[i]);
        if (!(a <= 3.40282347e+38f)) bad = 1;
        else if (a > amax) amax = a;
    }
    if (bad || amax == 0.0f) {
        memset(dst, 0, (size_t)n);
        *scale = bad ? NAN : 0.0f;
        return;
    }
    float inv = 127.0f / amax;
    for (int64_t i = 0; i < n; i++) dst[i] = (int8_t)lrintf(src[i] * inv);
    *scale = amax / 127.0f;
}
