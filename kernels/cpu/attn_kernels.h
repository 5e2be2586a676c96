/*
 * attn_kernels.h - CPU kernels for fused attention with an online softmax and
 * for storing keys and values in f16 or int8. Know nothing of plugins.
 *
 * The unit of work is a tile: up to TSR_ATTN_TILE query vectors that read the
 * same KV head (the query heads of one GQA group, possibly of several rows).
 * tsr_attn_tile_run streams a range of KV tokens once for the whole tile: each
 * key and value vector is loaded (and converted from f16 or dequantised from
 * int8 in registers) once and used by every query of the tile. The running
 * state per query is the online softmax's max m, sum l and the unnormalised
 * output acc; ranges may be fed in any order and states merged afterwards.
 *
 * NaN/Inf follow the reference (max-subtracted softmax in one pass): a NaN
 * score anywhere in a query's range, a +Inf score, or a range whose scores
 * are all -Inf gives NaN outputs; a -Inf score alone gets weight 0.
 *
 * Dispatch, at run time (cpu_features.h): an AVX-512F path (head_dim a
 * multiple of 16, at most 256), else an AVX2+FMA+F16C path (head_dim a
 * multiple of 8), else portable C. Storing keys and values takes the AVX2
 * path where it runs.
 */
#ifndef TSR_KERNELS_CPU_ATTN_KERNELS_H
#define TSR_KERNELS_CPU_ATTN_KERNELS_H

#include <stdint.h>

#define TSR_ATTN_TILE 8 /* most queries per tile */

/* Kernel paths: a cap on those a tile (or, in tests, every call) may take. */
enum {
    TSR_ATTN_ISA_BEST = 0, /* no cap: the best the CPU runs */
    TSR_ATTN_ISA_PORTABLE,
    TSR_ATTN_ISA_AVX2,
    TSR_ATTN_ISA_AVX512
};

/* One KV head of one layer, read in place. */
typedef struct tsr_attn_kv {
    uint32_t dtype;           /* TSR_DTYPE_F32, TSR_DTYPE_F16 or TSR_DTYPE_I8 */
    const void *k, *v;        /* element 0 of this head's token 0 */
    int64_t token_stride;     /* elements from token t to token t + 1 */
    /* I8 only: the scale of token t is k_scale[t * scale_stride]. */
    const float *k_scale, *v_scale;
    int64_t scale_stride;
} tsr_attn_kv;

/* Queries sharing one KV head and their running online-softmax state. */
typedef struct tsr_attn_tile {
    int nq;                          /* 1..TSR_ATTN_TILE */
    const float *q[TSR_ATTN_TILE];   /* [head_dim] each */
    float *acc[TSR_ATTN_TILE];       /* [head_dim] each: sum of p * v, unnormalised */
    float m[TSR_ATTN_TILE];          /* running max score (-Inf: none seen) */
    float l[TSR_ATTN_TILE];          /* running sum of exp(score - m) */
    int isa;                         /* TSR_ATTN_ISA_*: the most this tile may take */
} tsr_attn_tile;

/* Zero acc, m = -Inf, l = 0 for the tile's nq queries. */
void tsr_attn_tile_reset(tsr_attn_tile *t, int head_dim);

/* Fold KV tokens [t0, t1) into every query of the tile: score =
 * scale * dot(q, k_t) (times k_scale for I8), online max/sum update, acc +=
 * p * v_t. Every query of the tile must see every token of the range. */
void tsr_attn_tile_run(tsr_attn_tile *t, const tsr_attn_kv *kv, int head_dim, float scale,
                       int t0, int t1);

/* out_i = acc_i / l_i for each query (NaN where the state says so, see
 * above). out_i may equal acc_i. */
void tsr_attn_tile_finish(const tsr_attn_tile *t, float *const *out, int head_dim);

/* Merge state (m2, l2, acc2) into (m, l, acc): the state of the union of
 * the two ranges. */
void tsr_attn_state_merge(float *m, float *l, float *acc, float m2, float l2, const float *acc2,
                          int head_dim);

/* KV storage. f16: round to nearest even (F16C when present, bit-identical
 * to tsr_f32_to_f16). */
void tsr_attn_store_f16(uint16_t *dst, const float *src, int64_t n);
/* int8 with one scale for the n values: scale = max|x| / 127, q = x / scale
 * rounded to nearest even (computed as x * (127 / max|x|)), so |x - q*scale|
 * <= scale / 2 up to one f32 rounding. All zeros: scale 0. A non-finite value:
 * scale NaN (the reader then gets NaN, like the reference would). */
void tsr_attn_quant_i8(int8_t *dst, float *scale, const float *src, int64_t n);

/* The best path this CPU runs under the cap: TSR_ATTN_ISA_AVX512, _AVX2 or
 * _PORTABLE, and its name ("avx512", "avx2", "portable"). */
int tsr_attn_isa_level(void);
const char *tsr_attn_isa(void);
/* Tests: take no path above level in any call (TSR_ATTN_ISA_BEST: no cap). */
void tsr_attn_cap_isa(int level);

#endif /* TSR_KERNELS_CPU_ATTN_KERNELS_H */
