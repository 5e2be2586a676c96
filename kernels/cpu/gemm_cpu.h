/*
 * gemm_cpu.h - blocked CPU GEMM over stored weight rows, for many input rows
 * (prefill):
 *
 *     y[i * ldy + r] = scale[r] * sum_c W[r, c] * x[i * ldx + c]   (scale: I8 and F8_E4M3 only)
 *
 * the same contract as a gemv kernel (gemv_cpu.h, tsr_gemv_args), computed
 * the way BLIS computes a GEMM. The output columns (weight rows) are taken
 * in blocks of TSR_GEMM_GP panels of TSR_GEMM_NR; within a block, for each
 * slice of TSR_GEMM_KC columns each panel is widened to f32 once and
 * transposed into a k-major buffer of TSR_GEMM_NR x TSR_GEMM_KC floats (16
 * KiB: it stays in L1), then a register tile of TSR_GEMM_MR input rows x
 * TSR_GEMM_NR outputs is accumulated for every group of MR input rows.
 *
 * Inside the loops nothing is read with the caller's row strides, and y is
 * written once per element: rows a power-of-two multiple of 4 KiB apart (2,048 or 8,192 floats,
 * as in Llama-3.2-1B) fall into the same few sets of the 8-way L1 and L2
 * caches and keep evicting each other. So the activations are first copied
 * slice by slice into one contiguous buffer (tsr_gemm_pack_x: each slice's
 * nx x KC floats, 128 KiB at 128 rows, stay in L2 while the block's panels
 * take them in turn), and the block's partial sums are kept in the
 * per-thread scratch (nx x GP x NR floats) until the last slice, whose tiles
 * add them to their own sums and store the totals into y. Weights are read as stored: f32, f16 (F16C) and
 * bf16 (a shift) are widened in registers while packing; the other types go
 * through tsr_dequant_row one KC slice of a row at a time. Nothing wider
 * than a panel of weights is materialised.
 *
 * Sums are f32 in k order within each KC slice, slices added in order: a
 * different order from the reference's, so results differ by rounding only.
 * The AVX2 + FMA + F16C path and the portable C path compute the same sums
 * (up to FMA contraction).
 */
#ifndef TSR_KERNELS_GEMM_CPU_H
#define TSR_KERNELS_GEMM_CPU_H

#include <stdint.h>

#include "gemv_cpu.h"

#define TSR_GEMM_MR 6   /* input rows per register tile */
#define TSR_GEMM_NR 16  /* outputs (weight rows) per register tile and packed panel */
#define TSR_GEMM_KC 256 /* columns per packed panel: a multiple of every block size */
#ifndef TSR_GEMM_GP
#define TSR_GEMM_GP 8 /* panels per block: the block's sums are nx x GP x NR floats */
#endif

/* Number of KC-column slices of rows of `cols`: tsr_gemm_pack_x's items. */
static inline int64_t tsr_gemm_slice_count(int64_t cols) { return (cols + TSR_GEMM_KC - 1) / TSR_GEMM_KC; }

/* Floats of the packed activations of nx rows of `cols` (tsr_gemm_pack_x). */
static inline int64_t tsr_gemm_xpack_floats(int64_t nx, int64_t cols) {
    return nx * tsr_gemm_slice_count(cols) * TSR_GEMM_KC;
}

/* Floats of the per-thread scratch tsr_gemm_panels needs for nx input rows
 * (64-byte aligned): two widened panels (the AVX-512 tile takes a pair; the
 * other paths one), then the block's partial sums. */
static inline int64_t tsr_gemm_scratch_floats(int64_t nx) {
    return 2 * (int64_t)TSR_GEMM_NR * TSR_GEMM_KC + nx * TSR_GEMM_GP * TSR_GEMM_NR;
}

/* Number of NR-wide panels of a matrix of `rows` weight rows: the work items. */
static inline int64_t tsr_gemm_panel_count(int64_t rows) { return (rows + TSR_GEMM_NR - 1) / TSR_GEMM_NR; }

/* Slices [s0, s1) of a->x (a->nx rows of a->cols, row stride a->ldx) into
 * xs, tsr_gemm_xpack_floats(nx, cols) floats: slice s holds columns
 * [s * KC, s * KC + KC) of every row, row i at xs + (s * nx + i) * KC (a
 * last, partial slice keeps the KC stride). Slices are independent: callers
 * may pack them on several threads. */
void tsr_gemm_pack_x(const tsr_gemv_args *a, int64_t s0, int64_t s1, float *xs);

/* y for weight rows [p0 * NR, min(p1 * NR, rows)) and all a->nx input rows,
 * the activations read from xs (every slice packed by tsr_gemm_pack_x; a->x
 * is not read). rows: the matrix's weight-row count (the last panel may be
 * partial). scratch: tsr_gemm_scratch_floats(a->nx) floats, 32-byte
 * aligned, the calling thread's own. isa must run on this CPU
 * (tsr_gemv_isa_runs). */
void tsr_gemm_panels(tsr_gemv_isa isa, uint32_t dtype, const tsr_gemv_args *a, const float *xs, int64_t rows,
                     int64_t p0, int64_t p1, float *scratch);

/* Internal: per-ISA entry points (gemm_cpu.c, gemm_avx2.c). */
void tsr_gemm_panels_portable(uint32_t dtype, const tsr_gemv_args *a, const float *xs, int64_t rows, int64_t p0,
                              int64_t p1, float *scratch);
void tsr_gemm_panels_avx512(uint32_t dtype, const tsr_gemv_args *a, const float *xs, int64_t rows, int64_t p0,
                            int64_t p1, float *scratch);
void tsr_gemm_panels_avx2(uint32_t dtype, const tsr_gemv_args *a, const float *xs, int64_t rows, int64_t p0,
                          int64_t p1, float *scratch);

#endif /* TSR_KERNELS_GEMM_CPU_H */
