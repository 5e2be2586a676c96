/*
 * gemm_cpu.c - dispatch and the portable path of gemm_cpu.h. The AVX2 path
 * lives in gemm_avx2.c (built with its own flags); both share the loop order:
 *
 *   for each KC slice of the columns          (the activations' slice: L2)
 *     for each NR-wide panel of weight rows   (widened, k-major: L1)
 *       for each group of MR input rows       (MR x NR sums in registers)
 *
 * (the AVX2 path runs this per block of 8 panels, prefetching the panel
 * slice it packs next).
 */
#include "gemm_cpu.h"

#include <string.h>

#include "../dtype.h"

void tsr_gemm_panels(tsr_gemv_isa isa, uint32_t dtype, const tsr_gemv_args *a, int64_t rows, int64_t p0,
                     int64_t p1, float *wbuf) {
#if defined(__x86_64__)
    if (isa == TSR_GEMV_ISA_AVX2) {
        tsr_gemm_panels_avx2(dtype, a, rows, p0, p1, wbuf);
        return;
    }
#endif
    (void)isa;
    tsr_gemm_panels_portable(dtype, a, rows, p0, p1, wbuf);
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
        float s = dtype == TSR_DTYPE_I8 && a->scale ? a->scale[r0 + j] : 1.0f;
        for (int64_t k = 0; k < kc; k++) wbuf[k * TSR_GEMM_NR + j] = row[k] * s;
    }
}

/* y[i0 + i, r0 + j] (+)= sum_k x[i0 + i, c0 + k] * wbuf[k, j], i < m, j < nv. */
static void tile_portable(const tsr_gemv_args *a, int64_t i0, int m, int64_t r0, int nv, int64_t c0, int64_t kc,
                          const float *wbuf, int add) {
    float acc[TSR_GEMM_MR][TSR_GEMM_NR];
    memset(acc, 0, sizeof acc);
    for (int i = 0; i < m; i++) {
        const float *x = a->x + (i0 + i) * a->ldx + c0;
        for (int64_t k = 0; k < kc; k++) {
            const float xv = x[k], *b = wbuf + k * TSR_GEMM_NR;
            for (int j = 0; j < TSR_GEMM_NR; j++) acc[i][j] += xv * b[j];
        }
    }
    for (int i = 0; i < m; i++) {
        float *y = a->y + (i0 + i) * a->ldy + r0;
        for (int j = 0; j < nv; j++) y[j] = add ? y[j] + acc[i][j] : acc[i][j];
    }
}

void tsr_gemm_panels_portable(uint32_t dtype, const tsr_gemv_args *a, int64_t rows, int64_t p0, int64_t p1,
                              float *wbuf) {
    for (int64_t c0 = 0; c0 < a->cols; c0 += TSR_GEMM_KC) {
        int64_t kc = a->cols - c0 < TSR_GEMM_KC ? a->cols - c0 : TSR_GEMM_KC;
        for (int64_t p = p0; p < p1; p++) {
            int64_t r0 = p * TSR_GEMM_NR;
            int nv = rows - r0 < TSR_GEMM_NR ? (int)(rows - r0) : TSR_GEMM_NR;
            pack_portable(dtype, a, r0, nv, c0, kc, wbuf);
            for (int64_t i0 = 0; i0 < a->nx; i0 += TSR_GEMM_MR) {
                int m = a->nx - i0 < TSR_GEMM_MR ? (int)(a->nx - i0) : TSR_GEMM_MR;
                tile_portable(a, i0, m, r0, nv, c0, kc, wbuf, c0 > 0);
            }
        }
    }
}
