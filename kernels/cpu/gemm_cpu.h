/*
 * gemm_cpu.h - blocked CPU GEMM over stored weight rows, for many input rows
 * (prefill):
 *
 *     y[i * ldy + r] = scale[r] * sum_c W[r, c] * x[i * ldx + c]   (scale: I8 only)
 *
 * the same contract as a gemv kernel (gemv_cpu.h, tsr_gemv_args), computed
 * the way BLIS computes a GEMM. The output columns (weight rows) are taken
 * in blocks of 8 panels of TSR_GEMM_NR; within a block, for each slice of
 * TSR_GEMM_KC columns (the activations' slice, nx x KC floats, stays in L2)
 * each panel is widened to f32 once and transposed into a k-major buffer of
 * TSR_GEMM_NR x TSR_GEMM_KC floats (16 KiB: it stays in L1), then a register
 * tile of TSR_GEMM_MR input rows x TSR_GEMM_NR outputs is accumulated for
 * every group of MR input rows. Weights
 * are read as stored: f32, f16 (F16C) and bf16 (a shift) are widened in
 * registers while packing; the other types go through tsr_dequant_row one
 * KC slice of a row at a time. Nothing wider than a panel is materialised.
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

/* Floats of the per-thread panel buffer tsr_gemm_panels needs (64-byte aligned). */
#define TSR_GEMM_WBUF_FLOATS ((int64_t)TSR_GEMM_NR * TSR_GEMM_KC)

/* Number of NR-wide panels of a matrix of `rows` weight rows: the work items. */
static inline int64_t tsr_gemm_panel_count(int64_t rows) { return (rows + TSR_GEMM_NR - 1) / TSR_GEMM_NR; }

/* y for weight rows [p0 * NR, min(p1 * NR, rows)) and all a->nx input rows.
 * rows: the matrix's weight-row count (the last panel may be partial).
 * wbuf: TSR_GEMM_WBUF_FLOATS floats, 32-byte aligned, the caller's scratch.
 * isa must run on this CPU (tsr_gemv_isa_runs). */
void tsr_gemm_panels(tsr_gemv_isa isa, uint32_t dtype, const tsr_gemv_args *a, int64_t rows, int64_t p0,
                     int64_t p1, float *wbuf);

/* Internal: per-ISA entry points (gemm_cpu.c, gemm_avx2.c). */
void tsr_gemm_panels_portable(uint32_t dtype, const tsr_gemv_args *a, int64_t rows, int64_t p0, int64_t p1,
                              float *wbuf);
void tsr_gemm_panels_avx2(uint32_t dtype, const tsr_gemv_args *a, int64_t rows, int64_t p0, int64_t p1,
                          float *wbuf);

#endif /* TSR_KERNELS_GEMM_CPU_H */
