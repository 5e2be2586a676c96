/*
 * gemv_cpu.h - CPU matrix-vector kernels over stored weight rows.
 *
 * A kernel computes, for weight rows [r0, r1) of a matrix stored row-major in
 * one of the tsr_dtype layouts (row_bytes apart), the dot product of each row
 * with each of nx f32 input rows:
 *
 *     y[i * ldy + r] = scale[r] * sum_c W[r, c] * x[i * ldx + c]   (scale: I8 and F8_E4M3 only;
 *                                                                   F8_E4M3 may instead scale
 *                                                                   blocks of columns: cscale)
 *
 * Weights are read as stored: plain types are converted in registers, GGUF
 * block types (Q8_0, Q4_0, Q4_K, Q6_K) are decoded block by block in registers; the other
 * block types go through tsr_dequant_row one 256-element chunk at a time on
 * the stack. Nothing wider than a chunk is ever materialised, and each weight
 * row is read from memory once for all nx input rows (verification and small
 * batches pay the weight traffic once; short f32/f16 rows are taken four at a
 * time and re-read from L1 for each input row). Accumulation is f32; the order differs from the
 * reference's, so results differ from it by rounding only.
 *
 * The ISA is picked at run time (cpuid, cpu_features.h): AVX-512 where the
 * CPU has AVX-512F (and BW for its 8-bit decode kernels), else AVX2+FMA+F16C
 * where present, otherwise a portable C path that computes the same sums.
 */
#ifndef TSR_KERNELS_GEMV_CPU_H
#define TSR_KERNELS_GEMV_CPU_H

#include <stdint.h>

#include "../../slots/tsr_plugin.h"

typedef enum tsr_gemv_isa {
    TSR_GEMV_ISA_PORTABLE = 0,
    TSR_GEMV_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    TSR_GEMV_ISA_AVX512 = 2, /* and AVX-512F: the GEMM's AVX-512 tile (gemm_cpu.h); with AVX-512BW
                                the 8-bit decode kernels (Q8_0, int8 x int16) in 512-bit
                                vectors; the AVX2 kernels for the rest */
    TSR_GEMV_ISA_COUNT = 3
} tsr_gemv_isa;

/* 1 for the dtypes whose rows take tsr_gemv_args.scale: int8 (cpu_gemv_int8's
 * per-row scales) and E4M3 (FP8 checkpoints' per-tensor or per-channel scales). */
static inline int tsr_gemv_row_scaled(uint32_t dtype) {
    return dtype == TSR_DTYPE_I8 || dtype == TSR_DTYPE_F8_E4M3;
}

/* Arguments of one kernel call. w points at row 0 of the matrix. */
typedef struct tsr_gemv_args {
    const uint8_t *w;     /* [rows, row_bytes] as stored */
    uint64_t row_bytes;   /* bytes of one stored row */
    const float *scale;   /* [rows] per-row scale of I8 and F8_E4M3 rows (tsr_gemv_row_scaled; NULL: 1) */
    int64_t cols;         /* a multiple of the dtype's block size */
    const float *x;       /* [nx, ldx] */
    int64_t ldx;
    int nx;               /* >= 1, any count (taken 4 at a time) */
    float *y;             /* [nx, ldy]; y[i * ldy + r] for r in [r0, r1) */
    int64_t ldy;
    const float *xp;      /* NULL, or x as tsr_gemv_permute_x wrote it for this dtype and ISA:
                             callers that split one call's rows into many kernel calls
                             permute once instead of once per call */
    const float *cscale;  /* F8_E4M3 only, NULL: none. Scales that change along a row (FP8
                             checkpoints' blocks): W[r, c] is the code times
                             cscale[r * ceil(cols / cscale_cols) + c / cscale_cols] */
    int64_t cscale_cols;
} tsr_gemv_args;

/* Row r's column-block scales (a->cscale: tsr_gemv_args), or NULL. */
static inline const float *tsr_gemv_cscale_row(const tsr_gemv_args *a, int64_t r) {
    return a->cscale ? a->cscale + r * ((a->cols + a->cscale_cols - 1) / a->cscale_cols) : NULL;
}

/* dst[k] *= the column-block scale of W[r, c0 + k] for k < n (a->cscale set). */
static inline void tsr_gemv_apply_cscale(const tsr_gemv_args *a, int64_t r, int64_t c0, int64_t n, float *dst) {
    const float *s = tsr_gemv_cscale_row(a, r);
    for (int64_t k = 0; k < n; k++) dst[k] *= s[(c0 + k) / a->cscale_cols];
}

/* dst[k] *= the scale of W[r, c0 + k] for k < n, dst its stored values
 * widened: the row's (tsr_gemv_row_scaled dtypes with a->scale) and its
 * block of columns' (a->cscale). What the GEMM's panels and the sgemm
 * tiles apply after widening. */
static inline void tsr_gemv_scale_widened(uint32_t dtype, const tsr_gemv_args *a, int64_t r, int64_t c0, int64_t n,
                                          float *dst) {
    if (tsr_gemv_row_scaled(dtype) && a->scale)
        for (int64_t k = 0; k < n; k++) dst[k] *= a->scale[r];
    if (a->cscale) tsr_gemv_apply_cscale(a, r, c0, n, dst);
}

typedef void (*tsr_gemv_kernel_fn)(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int64_t r1);

/* The best ISA this CPU runs (cached after the first call). */
tsr_gemv_isa tsr_gemv_isa_best(void);
/* "portable", "avx2", "avx512". */
const char *tsr_gemv_isa_name(tsr_gemv_isa isa);
/* 1 if the running CPU can execute kernels of isa. */
int tsr_gemv_isa_runs(tsr_gemv_isa isa);

/* 1 if the kernels read dtype as a weight (every stored type except i32/i64). */
int tsr_gemv_dtype_supported(uint32_t dtype);

/* The kernel for isa; NULL if isa is unknown or this build lacks it. The
 * caller checks tsr_gemv_isa_runs(isa) before calling an explicit ISA. */
tsr_gemv_kernel_fn tsr_gemv_kernel(tsr_gemv_isa isa);

/* Floats of the permuted copy of a->x that isa's kernel would make for
 * dtype on each call (0: it reads x as it is), and that copy written into
 * xp (tsr_gemv_args.xp). */
int64_t tsr_gemv_permuted_x_floats(tsr_gemv_isa isa, uint32_t dtype, const tsr_gemv_args *a);
void tsr_gemv_permute_x(tsr_gemv_isa isa, uint32_t dtype, const tsr_gemv_args *a, float *xp);

/* Widen stored rows [r0, r1) to f32 into dst[(r - r0) * cols + c] (with the
 * I8 row scale applied): the tile a BLAS sgemm reads in prefill. f16 and bf16
 * use the best ISA the CPU runs (the values are the same on every path). */
void tsr_gemv_widen_rows(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int64_t r1, float *dst);

/* Symmetric int8 quantisation of one f32 row: with m = max|src|, returns
 * s = m / 127 and sets q[c] = nearbyintf(src[c] * (127 / m)) (f32 arithmetic,
 * clamped to +-127). An all-zero row gives s = 0 and q = 0. NaN or Inf in src
 * give s = NaN or Inf (q zeroed), for the caller to reject. */
float tsr_gemv_quant_row_i8(const float *src, int64_t n, int8_t *q);

/* --- int8 weights x int16 activations (lossy, for int8 weight plugins) ----
 *
 * Activations are quantised per input row to int16 (xq = nearbyintf(x *
 * (32767 / max|x|)), scale max|x| / 32767) so that the weight stream is
 * consumed with integer multiply-adds (vpmaddwd): 16 weights per three
 * instructions instead of 8 per three converted to f32. Sums are exact in
 * int32 over 1024 elements and then moved to f32, so both ISAs give the same
 * result up to that f32 accumulation:
 *
 *     y[i * ldy + r] = wscale[r] * xscale[i] * sum_c w[r, c] * xq[i, c]
 */
typedef struct tsr_gemv_i8_args {
    const int8_t *w;       /* [rows, cols] (Q8_0 blocks for tsr_gemv_q8_0_i16_kernel) */
    const float *wscale;   /* [rows] */
    int64_t cols;
    const int16_t *xq;     /* [nx, cols] (the u8 kernels: unused) */
    const float *xscale;   /* [nx] */
    int nx;
    float *y;              /* [nx, ldy] */
    int64_t ldy;
    const uint8_t *xu;     /* the u8 kernels' activations [nx, cols] (below), else unused */
    const int32_t *wsum;   /* the u8 kernels' [rows]: sum_c w[r, c], else unused */
} tsr_gemv_i8_args;

typedef void (*tsr_gemv_i8_kernel_fn)(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1);

/* Quantise n activations to int16; returns the scale (0 for an all-zero
 * row, NaN or Inf when x holds one: the caller falls back to f32). */
float tsr_gemv_quant_x_i16(const float *x, int64_t n, int16_t *q);

/* The int8 x int16 kernel of isa; NULL if this build lacks it. */
tsr_gemv_i8_kernel_fn tsr_gemv_i8_kernel(tsr_gemv_isa isa);

/* Q8_0 weights as stored x int16 activations: the same with the block
 * scales in place of wscale (unused): w holds rows of cols / 32 blocks {f16
 * d; int8 q[32]} (34 bytes each, cols a multiple of 32), and
 *
 *     y[i * ldy + r] = xscale[i] * sum_b d_b * sum_{k < 32} q[r, 32 b + k] * xq[i, 32 b + k]
 *
 * each block's sum exact in integers, the rest accumulated in f32. */
tsr_gemv_i8_kernel_fn tsr_gemv_q8_0_i16_kernel(tsr_gemv_isa isa);

/* --- int8 weights x 8-bit activations (lossy, opt-in: cpu_gemv_int8's x_int8) ---
 *
 * Activations are quantised per input row to u8 = nearbyintf(x * (127 /
 * max|x|)) + 128 (scale max|x| / 127) and multiplied with the int8 rows by
 * AVX512-VNNI's vpdpbusd (four u8 x s8 products a lane: 64 weights an
 * instruction, none widened); 128 times each row's sum of codes (wsum,
 * computed once at load) is taken off in integers, so that
 *
 *     y[i * ldy + r] = (float)(sum_c w[r, c] * (xu[i, c] - 128)) * wscale[r] * xscale[i]
 *
 * with the sum exact (cols at most TSR_GEMV_U8_MAX_COLS keeps it in int32):
 * the same for every input row count, ISA and row blocking. Coarser than
 * int16 activations (1/254 of max|x| a step instead of 1/65534). The
 * kernels take tsr_gemv_i8_args with xu and wsum set (xq unused) and cols
 * at most TSR_GEMV_U8_MAX_COLS. */
#define TSR_GEMV_U8_MAX_COLS 65536

/* Quantise n activations to u8 as above; returns the scale (0 for an
 * all-zero row, every code 128; NaN or Inf when x holds one). */
float tsr_gemv_quant_x_u8(const float *x, int64_t n, uint8_t *q);

/* The int8 x u8 kernel of isa: AVX512-VNNI's where isa allows AVX-512 and
 * the CPU has it, else NULL (the portable one is the tests' second
 * implementation, not a fallback: too slow to be worth the lost precision). */
tsr_gemv_i8_kernel_fn tsr_gemv_u8_kernel(tsr_gemv_isa isa);
void tsr_gemv_i8u8_rows_portable(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1);
void tsr_gemv_i8u8_rows_avx512_vnni(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1);
int64_t tsr_gemv_quant_u8_avx512(const float *src, int64_t n, float inv, uint8_t *q); /* values done */

/* Internal: per-ISA entry points (one file each). */
void tsr_gemv_i8_rows_portable(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1);
void tsr_gemv_i8_rows_avx2(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1);
void tsr_gemv_q8_0_i16_rows_portable(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1);
void tsr_gemv_q8_0_i16_rows_avx2(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1);
void tsr_gemv_rows_portable(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int64_t r1);
void tsr_gemv_rows_avx2(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int64_t r1);
void tsr_gemv_rows_avx512(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int64_t r1);
/* 1 where tsr_gemv_rows_avx512 runs bf16 rows in 512-bit vectors (a->nx >= 2),
 * with their own permutation of x (tsr_gemv_permute_x_bf16_512). */
int tsr_gemv_bf16_512_rows(const tsr_gemv_args *a);
void tsr_gemv_permute_x_bf16_512(const tsr_gemv_args *a, float *xp);
void tsr_gemv_i8_rows_avx512(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1);
void tsr_gemv_i8_rows_avx512_vnni(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1); /* AVX512-VNNI too */
void tsr_gemv_q8_0_i16_rows_avx512_vnni(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1); /* one row VNNI */
int64_t tsr_gemv_permuted_x_floats_avx2(uint32_t dtype, const tsr_gemv_args *a);
void tsr_gemv_permute_x_avx2(uint32_t dtype, const tsr_gemv_args *a, float *xp);
int tsr_gemv_widen_row_avx2(uint32_t dtype, const uint8_t *src, int64_t n, float *dst); /* 0: not handled */
int64_t tsr_gemv_quant_i8_avx2(const float *src, int64_t n, float inv, int8_t *q);   /* values done */
int64_t tsr_gemv_quant_i16_avx2(const float *src, int64_t n, float inv, int16_t *q); /* values done */

#endif /* TSR_KERNELS_GEMV_CPU_H */
