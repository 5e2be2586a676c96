/*
 * gemm_avx2.c - the AVX2 + FMA + F16C path of gemm_cpu.h, and its AVX-512
 * register tile (functions marked target("avx512f"), sharing the AVX2
 * packing). Built with the AVX2 flags for this file only; each path called
 * only after tsr_gemv_isa_runs() said yes for it.
 *
 * Packing reads 8 weight rows x 8 columns at a time, widens them in
 * registers (f16: vcvtph2ps, bf16: a 16-bit shift, f32: as is; other types
 * from a dequantised slice on the stack) and transposes the 8 x 8 block into
 * the k-major panel. The register tile is 6 input rows x 16 outputs: twelve
 * accumulators, per column two panel loads and six broadcasts of x for
 * twelve FMAs.
 */
#include "gemm_cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "../dtype.h"

#define INL static inline __attribute__((always_inline))
#define NR TSR_GEMM_NR
#define MR TSR_GEMM_MR
#define KC TSR_GEMM_KC

/* dst[j * NR] = column j of the 8 x 8 block r[0..7] (row i in r[i]). */
INL void store_t8x8(__m256 r0, __m256 r1, __m256 r2, __m256 r3, __m256 r4, __m256 r5, __m256 r6, __m256 r7,
                    float *dst) {
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    _mm256_store_ps(dst + 0 * NR, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_store_ps(dst + 1 * NR, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_store_ps(dst + 2 * NR, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_store_ps(dst + 3 * NR, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_store_ps(dst + 4 * NR, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_store_ps(dst + 5 * NR, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_store_ps(dst + 6 * NR, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_store_ps(dst + 7 * NR, _mm256_permute2f128_ps(u3, u7, 0x31));
}

INL __m256 w8_f32(const uint8_t *p) { return _mm256_loadu_ps((const float *)(const void *)p); }
INL __m256 w8_f16(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p)); }
INL __m256 w8_bf16(const uint8_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* Pack 8 rows (src[i] = row i at column c0, elements of esz bytes) x kc
 * columns into dst (k-major, NR apart); kc need not be a multiple of 8. */
#define PACK8(NAME, LOAD, ESZ)                                                                   \
    INL void NAME(const uint8_t *const src[8], int64_t kc, float *dst, uint32_t dtype) {        \
        int64_t k = 0;                                                                           \
        for (; k + 8 <= kc; k += 8)                                                              \
            store_t8x8(LOAD(src[0] + k * ESZ), LOAD(src[1] + k * ESZ), LOAD(src[2] + k * ESZ),  \
                       LOAD(src[3] + k * ESZ), LOAD(src[4] + k * ESZ), LOAD(src[5] + k * ESZ),  \
                       LOAD(src[6] + k * ESZ), LOAD(src[7] + k * ESZ), dst + k * NR);           \
        for (; k < kc; k++)                                                                      \
            for (int i = 0; i < 8; i++) tsr_dequant_row(dtype, src[i] + k * ESZ, dst + k * NR + i, 1); \
    }

PACK8(pack8_f32, w8_f32, 4)
PACK8(pack8_f16, w8_f16, 2)
PACK8(pack8_bf16, w8_bf16, 2)

/* wbuf[k * NR + j] = W[r0 + j, c0 + k] (times the I8 row scale), zero for
 * j >= nv; k < kc. */
static void pack_panel(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int nv, int64_t c0, int64_t kc,
                       float *wbuf) {
    int be = tsr_dtype_block_elems(dtype), bb = tsr_dtype_block_bytes(dtype);
    uint64_t off = (uint64_t)(c0 / be) * (uint64_t)bb;
    static const uint8_t zeros[KC * 4]; /* a row of zeros for the rows past nv (any dtype: 0 bytes read as 0) */
    for (int h = 0; h < NR; h += 8) {
        const uint8_t *src[8];
        for (int i = 0; i < 8; i++)
            src[i] = h + i < nv ? a->w + (uint64_t)(r0 + h + i) * a->row_bytes + off : zeros;
        float *dst = wbuf + h;
        switch (dtype) {
        case TSR_DTYPE_F32: pack8_f32(src, kc, dst, dtype); break;
        case TSR_DTYPE_F16: pack8_f16(src, kc, dst, dtype); break;
        case TSR_DTYPE_BF16: pack8_bf16(src, kc, dst, dtype); break;
        default: {
            /* dequantise the 8 slices, then transpose them as f32 */
            _Alignas(32) float tmp[8][KC];
            const uint8_t *fs[8];
            for (int i = 0; i < 8; i++) {
                if (h + i < nv) {
                    if (!tsr_gemv_widen_row_avx2(dtype, src[i], kc, tmp[i])) tsr_dequant_row(dtype, src[i], tmp[i], kc);
                    tsr_gemv_scale_widened(dtype, a, r0 + h + i, c0, kc, tmp[i]);
                } else {
                    memset(tmp[i], 0, (size_t)kc * sizeof(float));
                }
                fs[i] = (const uint8_t *)tmp[i];
            }
            pack8_f32(fs, kc, dst, TSR_DTYPE_F32);
        }
        }
    }
}

/* Store one tile row: out[j] = (in ? in[j] : 0) + (lo, hi)[j] for j < nv. */
INL void store_row(float *out, const float *in, __m256 lo, __m256 hi, int nv) {
    if (nv == NR) {
        if (in) {
            lo = _mm256_add_ps(_mm256_loadu_ps(in), lo);
            hi = _mm256_add_ps(_mm256_loadu_ps(in + 8), hi);
        }
        _mm256_storeu_ps(out, lo);
        _mm256_storeu_ps(out + 8, hi);
        return;
    }
    _Alignas(32) float t[NR];
    _mm256_store_ps(t, lo);
    _mm256_store_ps(t + 8, hi);
    for (int j = 0; j < nv; j++) out[j] = in ? in[j] + t[j] : t[j];
}

/* out[i * ldo + j] = (in ? in[i * ldi + j] : 0) + sum_k xt[i * KC + k] *
 * wbuf[k, j] for i < m (a constant after inlining) and j < NR; only j < nv
 * is stored. xt: the tile's first row in the packed slice (rows KC apart).
 * Named accumulators, not an array: the compiler keeps them in registers. */
INL void tile(int m, const float *xt, int nv, int64_t kc, const float *wbuf, const float *in, int64_t ldi,
              float *out, int64_t ldo) {
    __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0, a4 = a0,
           b4 = a0, a5 = a0, b5 = a0;
    /* rows past m are never read; their pointers stay on row 0 */
    const float *x0 = xt, *x1 = m > 1 ? x0 + KC : x0, *x2 = m > 2 ? x0 + 2 * KC : x0, *x3 = m > 3 ? x0 + 3 * KC : x0,
                *x4 = m > 4 ? x0 + 4 * KC : x0, *x5 = m > 5 ? x0 + 5 * KC : x0;
    const float *w = wbuf;
#define ROW(I)                                                                                     \
    if (m > I) {                                                                                   \
        __m256 xv = _mm256_broadcast_ss(x##I + k);                                                 \
        a##I = _mm256_fmadd_ps(xv, w0, a##I);                                                      \
        b##I = _mm256_fmadd_ps(xv, w1, b##I);                                                      \
    }
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++, w += NR) {
        __m256 w0 = _mm256_load_ps(w), w1 = _mm256_load_ps(w + 8);
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
    }
#undef ROW
#define OUT(I, A, B) \
    if (m > I) store_row(out + I * ldo, in ? in + I * ldi : NULL, A, B, nv);
    OUT(0, a0, b0) OUT(1, a1, b1) OUT(2, a2, b2) OUT(3, a3, b3) OUT(4, a4, b4) OUT(5, a5, b5)
#undef OUT
}

/* Software prefetch of the slice packed next, spread over the tiles of the
 * current one, so that packing finds it in cache: weights stream from DRAM
 * in 16 short runs per slice, too short for the hardware prefetcher. */
typedef struct prefetch {
    const uint8_t *row0; /* first row's slice */
    uint64_t row_bytes;
    int64_t lines, per_row, done, step;
} prefetch;

static void prefetch_plan(prefetch *pf, uint32_t dtype, const tsr_gemv_args *a, int64_t rows, int64_t r0, int64_t c0,
                          int64_t ntiles) {
    int be = tsr_dtype_block_elems(dtype), bb = tsr_dtype_block_bytes(dtype);
    int64_t kc = a->cols - c0 < KC ? a->cols - c0 : KC;
    int nv = rows - r0 < NR ? (int)(rows - r0) : NR;
    pf->row0 = a->w + (uint64_t)r0 * a->row_bytes + (uint64_t)(c0 / be) * (uint64_t)bb;
    pf->row_bytes = a->row_bytes;
    pf->per_row = ((kc / be) * bb + 63) / 64 + 1;
    pf->lines = nv * pf->per_row;
    pf->done = 0;
    pf->step = (pf->lines + ntiles - 1) / ntiles;
}

INL void prefetch_step(prefetch *pf) {
    int64_t end = pf->done + pf->step < pf->lines ? pf->done + pf->step : pf->lines;
    for (int64_t l = pf->done; l < end; l++)
        _mm_prefetch((const char *)(pf->row0 + (uint64_t)(l / pf->per_row) * pf->row_bytes) + 64 * (l % pf->per_row),
                     _MM_HINT_T0);
    pf->done = end;
}

/* Row tiles of nx input rows: `full` tiles of mr rows, then up to two of t1
 * and t2 rows: a remainder of 1..3 rows borrows a full tile and runs as two
 * of about (mr + rem) / 2 rows (enough accumulators to hide FMA latency;
 * 4-5 rows for the AVX2 tile, 6-8 for the AVX-512 one). */
INL void row_tiles(int64_t nx, int mr, int64_t *full, int *t1, int *t2) {
    *full = nx / mr;
    int rem = (int)(nx % mr);
    *t1 = *t2 = 0;
    if (rem >= 4 || (rem > 0 && *full == 0)) {
        *t1 = rem;
    } else if (rem > 0) {
        (*full)--;
        *t1 = (mr + rem + 1) / 2;
        *t2 = mr + rem - *t1;
    }
}

/* The AVX2 tile of a run-time m < MR rows. */
INL void tile_rem(int m, const float *xt, int nv, int64_t kc, const float *wbuf, const float *in, int64_t ldi,
                  float *out, int64_t ldo) {
    switch (m) {
    case 1: tile(1, xt, nv, kc, wbuf, in, ldi, out, ldo); break;
    case 2: tile(2, xt, nv, kc, wbuf, in, ldi, out, ldo); break;
    case 3: tile(3, xt, nv, kc, wbuf, in, ldi, out, ldo); break;
    case 4: tile(4, xt, nv, kc, wbuf, in, ldi, out, ldo); break;
    case 5: tile(5, xt, nv, kc, wbuf, in, ldi, out, ldo); break;
    default: break;
    }
}

#define PANELS_NAME tsr_gemm_panels_avx2
#define PANELS_ATTR
#define PANELS_STEP 1
#define PANELS_MR MR
#define PANELS_TILE tile
#define PANELS_TILE_REM tile_rem
#include "gemm_panels_impl.h"

/* --- AVX-512: 12 input rows x 32 outputs (two panels) --------------------
 * A zmm holds a panel's 16 outputs of one k, so a pair of panels packed side
 * by side (the AVX2 packing, twice) gives per k two panel loads and 12
 * broadcasts for 24 FMAs in 24 accumulators, against the AVX2 tile's 2 and 6
 * for 12: 12 x 32 read 190-200 GFLOP/s on one core of a Xeon against 6 x
 * 16's 120-125 (the same panel and activations in cache). Sums in the same
 * k order as the AVX2 tile: the results agree up to FMA contraction. */
#define MR5 12
#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

/* out/in as in tile(), for i < m rows (a constant after inlining) and the
 * 2 x NR outputs of the panel pair at wbuf (outputs 0-15, then at wbuf + NR
 * x KC outputs 16-31); only j < nv is stored. */
AVX512 static inline __attribute__((always_inline)) void tile512(int m, const float *xt, int nv, int64_t kc,
                                                                 const float *wbuf, const float *in, int64_t ldi,
                                                                 float *out, int64_t ldo) {
    const float *w0p = wbuf, *w1p = wbuf + NR * KC;
    __m512 acc[MR5][2];
#pragma GCC unroll 12
    for (int i = 0; i < MR5; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        const __m512 w0 = _mm512_loadu_ps(w0p + k * NR), w1 = _mm512_loadu_ps(w1p + k * NR);
#pragma GCC unroll 12
        for (int i = 0; i < MR5; i++)
            if (i < m) {
                const __m512 xv = _mm512_set1_ps(xt[i * KC + k]);
                acc[i][0] = _mm512_fmadd_ps(xv, w0, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(xv, w1, acc[i][1]);
            }
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR5; i++) {
        if (i >= m) break;
        float *o = out + i * ldo;
        const float *s = in ? in + i * ldi : NULL;
        if (nv == 2 * NR) {
            __m512 lo = acc[i][0], hi = acc[i][1];
            if (s) lo = _mm512_add_ps(_mm512_loadu_ps(s), lo), hi = _mm512_add_ps(_mm512_loadu_ps(s + NR), hi);
            _mm512_storeu_ps(o, lo);
            _mm512_storeu_ps(o + NR, hi);
        } else {
            _Alignas(64) float t[2 * NR];
            _mm512_store_ps(t, acc[i][0]);
            _mm512_store_ps(t + NR, acc[i][1]);
            for (int j = 0; j < nv; j++) o[j] = s ? s[j] + t[j] : t[j];
        }
    }
}

/* The AVX-512 tile of a run-time m < MR5 rows. */
AVX512 static inline __attribute__((always_inline)) void tile512_rem(int m, const float *xt, int nv, int64_t kc,
                                                                     const float *wbuf, const float *in, int64_t ldi,
                                                                     float *out, int64_t ldo) {
#define T5(M)                                                                                      \
    case M: tile512(M, xt, nv, kc, wbuf, in, ldi, out, ldo); break;
    switch (m) { T5(1) T5(2) T5(3) T5(4) T5(5) T5(6) T5(7) T5(8) T5(9) T5(10) T5(11) default: break; }
#undef T5
}

#define PANELS_NAME tsr_gemm_panels_avx512
#define PANELS_ATTR AVX512
#define PANELS_STEP 2
#define PANELS_MR MR5
#define PANELS_TILE tile512
#define PANELS_TILE_REM tile512_rem
#include "gemm_panels_impl.h"

#else
void tsr_gemm_panels_avx512(uint32_t dtype, const tsr_gemv_args *a, const float *xs, int64_t rows, int64_t p0,
                            int64_t p1, float *scratch) {
    tsr_gemm_panels_portable(dtype, a, xs, rows, p0, p1, scratch);
}
void tsr_gemm_panels_avx2(uint32_t dtype, const tsr_gemv_args *a, const float *xs, int64_t rows, int64_t p0,
                          int64_t p1, float *scratch) {
    tsr_gemm_panels_portable(dtype, a, xs, rows, p0, p1, scratch);
}
#endif
