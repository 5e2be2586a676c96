/*
 * gemm_cpu.c - dispatch and the portable path of gemm_cpu.h. The AVX2 path
 * and the AVX-512 one (two panels a tile) live in gemm_avx2.c (built with its
 * own flags); all share the loop order:
 *
 *   for each block of GP panels
 *     for each KC slice of the columns          (the packed activations' slice: L2)
 *       for each NR-wide panel of weight rows   (widened, k-major: L1)
 *         for each group of MR input rows       (MR x NR sums in registers,
 *                                                added to the block's sums)
 *
 * (the AVX2 path also prefetches the panel slice it packs next).
 */
#include "gemm_cpu.h"

#include <string.h>

#include "../dtype.h"

void tsr_gemm_pack_x(const tsr_gemv_args *a, int64_t s0, int64_t s1, float *xs) {
    for (int64_t s = s0; s < s1; s++) {
        int64_t c0 = s * TSR_GEMM_KC, kc = a->cols - c0 < TSR_GEMM_KC ? a->cols - c0 : TSR_GEMM_KC;
        float *dst = xs + s * a->nx * TSR_GEMM_KC;
        for (int64_t i = 0; i < a->nx; i++)
            memcpy(dst + i * TSR_GEMM_KC, a->x + i * a->ldx + c0, (size_t)kc * sizeof(float));
    }
}

void tsr_gemm_panels(tsr_gemv_isa isa, uint32_t dtype, const tsr_gemv_args *a, const float *xs, int64_t rows,
                     int64_t p0, int64_t p1, float *scratch) {
#if defined(__x86_64__)
    if (isa == TSR_GEMV_ISA_AVX512) {
        tsr_gemm_panels_avx512(dtype, a, xs, rows, p0, p1, scratch);
        return;
    }
    if (isa == TSR_GEMV_ISA_AVX2) {
        tsr_gemm_panels_avx2(dtype, a, xs, rows, p0, p1, scratch);
        return;
    }
#endif
    (void)isa;
    tsr_gemm_panels_portable(dtype, a, xs, rows, p0, p1, scratch);
}

/* wbuf[k * NR + j] = W[r0 + j, c0 + k] (times the I8 row scale) for j < nv,
 * 0 for nv <= j < NR; k < kc. */
static void pack_portable(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int nv, int64_t c0, int64_t kc,
                          float *wbuf) {
    float row[TSR_GEMM_KC];
    int be = tsr_dtype_block_elems(dtype), bb = tsr_dtype_block_bytes(dtype);
    for (int j = 0; j < TSR_GEMM_NR; j++) {
        if (j >= nv) {
            for (int64_t k = 0; k < kc; k++) wbuf[k * TSR_GEMM_NR + j] = 0.0f;
            continue;
        }
        const uint8_t *src = a->w + (uint64_t)(r0 + j) * a->row_bytes + (uint64_t)(c0 / be) * (uint64_t)bb;
        tsr_dequant_row(dtype, src, row, kc);
        tsr_gemv_scale_widened(dtype, a, r0 + j, c0, kc, row);
        for (int64_t k = 0; k < kc; k++) wbuf[k * TSR_GEMM_NR + j] = row[k];
    }
}

/* out[i * ldo + j] = (in ? in[i * ldi + j] : 0) + sum_k xt[i * KC + k] *
 * wbuf[k, j], i < m, j < nv (xt: the tile's rows in the packed slice). */
static void tile_portable(const float *xt, int m, int nv, int64_t kc, const float *wbuf, const float *in,
                          int64_t ldi, float *out, int64_t ldo) {
    float acc[TSR_GEMM_MR][TSR_GEMM_NR];
    memset(acc, 0, sizeof acc);
    for (int i = 0; i < m; i++) {
        const float *x = xt + i * TSR_GEMM_KC;
        for (int64_t k = 0; k < kc; k++) {
            const float xv = x[k], *b = wbuf + k * TSR_GEMM_NR;
            for (int j = 0; j < TSR_GEMM_NR; j++) acc[i][j] += xv * b[j];
        }
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < nv; j++) out[i * ldo + j] = in ? in[i * ldi + j] + acc[i][j] : acc[i][j];
}

void tsr_gemm_panels_portable(uint32_t dtype, const tsr_gemv_args *a, const float *xs, int64_t rows, int64_t p0,
                              int64_t p1, float *scratch) {
    float *wbuf = scratch, *ysum = scratch + TSR_GEMM_NR * TSR_GEMM_KC;
    const int64_t lds = TSR_GEMM_GP * TSR_GEMM_NR;
    for (int64_t q0 = p0; q0 < p1; q0 += TSR_GEMM_GP) {
        int64_t q1 = q0 + TSR_GEMM_GP < p1 ? q0 + TSR_GEMM_GP : p1;
        for (int64_t c0 = 0; c0 < a->cols; c0 += TSR_GEMM_KC) {
            int64_t kc = a->cols - c0 < TSR_GEMM_KC ? a->cols - c0 : TSR_GEMM_KC;
            const float *xsl = xs + (c0 / TSR_GEMM_KC) * a->nx * TSR_GEMM_KC;
            int last = c0 + TSR_GEMM_KC >= a->cols;
            for (int64_t p = q0; p < q1; p++) {
                int64_t r0 = p * TSR_GEMM_NR;
                int nv = rows - r0 < TSR_GEMM_NR ? (int)(rows - r0) : TSR_GEMM_NR;
                float *ys = ysum + (p - q0) * TSR_GEMM_NR;
                /* sums of this slice: into the block's sums, or with them into y */
                float *out = last ? a->y + r0 : ys;
                const int64_t ldo = last ? a->ldy : lds;
                pack_portable(dtype, a, r0, nv, c0, kc, wbuf);
                for (int64_t i0 = 0; i0 < a->nx; i0 += TSR_GEMM_MR) {
                    int m = a->nx - i0 < TSR_GEMM_MR ? (int)(a->nx - i0) : TSR_GEMM_MR;
                    tile_portable(xsl + i0 * TSR_GEMM_KC, m, nv, kc, wbuf, c0 > 0 ? ys + i0 * lds : NULL, lds,
                                  out + i0 * ldo, ldo);
                }
            }
        }
    }
}
