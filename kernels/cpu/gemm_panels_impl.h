/*
 * gemm_panels_impl.h - the loops of a tsr_gemm_panels_* path (gemm_cpu.h),
 * included by gemm_avx2.c once per register tile (no include guard), with:
 *
 *   PANELS_NAME      the function defined
 *   PANELS_ATTR      its attributes (the ISA it is built for), or nothing
 *   PANELS_STEP      panels a tile takes: 1, or 2 packed one after the
 *                    other (NR x KC floats apart)
 *   PANELS_MR        input rows of a full tile
 *   PANELS_TILE      tile(m, xt, nv, kc, wbuf, in, ldi, out, ldo) for a
 *                    constant m <= PANELS_MR, over PANELS_STEP x NR outputs
 *   PANELS_TILE_REM  the same for a run-time m < PANELS_MR
 *
 * and the file's pack_panel, prefetch_plan / prefetch_step and row_tiles.
 * Per block of GP panels the column slices run outermost, so that one
 * packed slice of the activations (nx x KC floats) stays in L2 while the
 * block's panels take it in turn; the block's partial sums (nx x GP x NR
 * floats) wait in the scratch until the last slice stores them into y.
 * With two panels a tile, a block's odd last panel runs against a panel of
 * zeros whose outputs are not stored.
 */

PANELS_ATTR void PANELS_NAME(uint32_t dtype, const tsr_gemv_args *a, const float *xs, int64_t rows, int64_t p0,
                             int64_t p1, float *scratch) {
    float *wbuf = scratch, *ysum = scratch + PANELS_STEP * NR * KC;
    const int64_t lds = TSR_GEMM_GP * NR;
    int64_t full;
    int t1, t2;
    row_tiles(a->nx, PANELS_MR, &full, &t1, &t2);
    const int64_t ntiles = full + (t1 > 0) + (t2 > 0);
    for (int64_t q0 = p0; q0 < p1; q0 += TSR_GEMM_GP) {
        int64_t q1 = q0 + TSR_GEMM_GP < p1 ? q0 + TSR_GEMM_GP : p1;
        for (int64_t c0 = 0; c0 < a->cols; c0 += KC) {
            int64_t kc = a->cols - c0 < KC ? a->cols - c0 : KC;
            const float *xsl = xs + (c0 / KC) * a->nx * KC;
            const int first = c0 == 0, last = c0 + KC >= a->cols;
            for (int64_t p = q0; p < q1; p += PANELS_STEP) {
                int64_t r0 = p * NR;
                int nv = rows - r0 < PANELS_STEP * NR ? (int)(rows - r0) : PANELS_STEP * NR;
                if (p + 1 == q1 && nv > NR) nv = NR; /* the block's odd last panel */
                float *ys = ysum + (p - q0) * NR;
                pack_panel(dtype, a, r0, nv < NR ? nv : NR, c0, kc, wbuf);
                if (PANELS_STEP == 2) pack_panel(dtype, a, r0 + NR, nv > NR ? nv - NR : 0, c0, kc, wbuf + NR * KC);
                prefetch pf = {0}; /* the panel slice packed next */
                if (p + PANELS_STEP < q1) prefetch_plan(&pf, dtype, a, rows, r0 + PANELS_STEP * NR, c0, ntiles);
                else if (!last) prefetch_plan(&pf, dtype, a, rows, q0 * NR, c0 + KC, ntiles);
                else if (q1 < p1) prefetch_plan(&pf, dtype, a, rows, q1 * NR, 0, ntiles);
                /* sums of this slice: into the block's sums, or with them into y */
                float *out = last ? a->y + r0 : ys;
                const int64_t ldo = last ? a->ldy : lds;
                const float *in = first ? NULL : ys;
                int64_t i0 = 0;
                for (int64_t t = 0; t < full; t++, i0 += PANELS_MR) {
                    prefetch_step(&pf);
                    PANELS_TILE(PANELS_MR, xsl + i0 * KC, nv, kc, wbuf, in ? in + i0 * lds : NULL, lds,
                                out + i0 * ldo, ldo);
                }
                for (int h = 0; h < 2; h++) {
                    int m = h ? t2 : t1;
                    prefetch_step(&pf);
                    PANELS_TILE_REM(m, xsl + i0 * KC, nv, kc, wbuf, in ? in + i0 * lds : NULL, lds,
                                    out + i0 * ldo, ldo);
                    i0 += m;
                }
            }
        }
    }
}

#undef PANELS_NAME
#undef PANELS_ATTR
#undef PANELS_STEP
#undef PANELS_MR
#undef PANELS_TILE
#undef PANELS_TILE_REM
