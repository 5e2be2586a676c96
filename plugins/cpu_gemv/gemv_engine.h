/*
 * gemv_engine.h - what cpu_gemv and cpu_gemv_int8 share: a prepared matrix
 * and its run over the host's thread pool (SIMD kernels for few rows, widened
 * tiles through OpenBLAS sgemm for many).
 */
#ifndef CPU_GEMV_ENGINE_H
#define CPU_GEMV_ENGINE_H

#include <stdint.h>

#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/gemv_cpu.h"
#include "slots/tsr_gemv.h"

/* Tunables from the plugin's params. */
typedef struct gemv_engine_cfg {
    tsr_gemv_kernel_fn kernel; /* the ISA picked at init */
    tsr_gemv_i8_kernel_fn i8_kernel;       /* I8 x int16 */
    tsr_gemv_i8_kernel_fn q8_0_i16_kernel; /* Q8_0 as stored x int16 */
    tsr_gemv_i8_kernel_fn u8_kernel;       /* I8 x u8 (AVX512-VNNI only, else NULL) */
    tsr_gemv_isa isa;
    int use_blas;              /* prefill through OpenBLAS sgemm (1) or the blocked GEMM (0) */
    int64_t blas_min_rows;     /* run() with >= this many rows takes the prefill path; 0: never */
    int64_t blas_min_rows_q;   /* the same for block-quantised dtypes (slower to widen) */
    int64_t tile_rows;         /* weight rows widened per sgemm call */
    int copy_weights;          /* weights as stored: copied at prepare (1) or read through the mapping (0) */
    int glu;                   /* param glu: run_glu takes decode rows (1) or declines them (0) */
} gemv_engine_cfg;

/* Resident weights packed into shared blocks of whole 2 MiB pages (host
 * alloc asks the kernel to back those with transparent huge pages): each
 * block is a matrix's size rounded up to 2 MiB, and the room left at its
 * end takes later matrices that fit. Allocated alone, a matrix's tail past
 * its last 2 MiB boundary stays in 4 KiB pages, and a matrix under 2 MiB
 * (q/k/v, o of small models) lies in 4 KiB pages whole: on a Xeon VM a
 * Q8_0 GEMV read 15.1 against 19.0 GB/s on one core in 4 KiB pages (TLB
 * misses under nested paging; BENCHMARKS.md, fourteenth session). Blocks
 * are freed when their last matrix is (gemv_arena_put) or at gemv_arena_free.
 * Not thread-safe: the host prepares weights one call at a time. */
typedef struct gemv_block gemv_block;
typedef struct gemv_arena {
    gemv_block *blocks; /* every block, newest first */
} gemv_arena;

/* bytes (64-byte aligned, zeroed) in a block with room, or a new block;
 * *block: what to give back to gemv_arena_put. NULL when out of memory. */
void *gemv_arena_get(gemv_arena *a, const tsr_plugin_ctx *ctx, uint64_t bytes, gemv_block **block);
/* One allocation of block no longer used; the block is freed with its last. */
void gemv_arena_put(gemv_arena *a, const tsr_plugin_ctx *ctx, gemv_block *block);
/* Every block (plugin fini). */
void gemv_arena_free(gemv_arena *a, const tsr_plugin_ctx *ctx);

/* A prepared matrix: borrowed (cpu_gemv) or owned (cpu_gemv_int8) data. */
typedef struct gemv_matrix {
    uint32_t dtype;
    int64_t rows, cols;
    uint64_t row_bytes;
    const uint8_t *data;
    const float *scale; /* [rows], I8 and F8_E4M3 (tsr_gemv_row_scaled) only */
    uint64_t bytes;     /* bytes read per full pass */
    void *owned;        /* host allocation behind data and scale, or NULL */
    gemv_block *block;  /* the arena block behind data and scale, or NULL */
    int x_i16;          /* I8 (with scale) or Q8_0: decode with int16 activations (lossy) */
    const int32_t *wsum; /* I8 with x_i16: each row's sum of codes, for decode with u8 activations
                            (tsr_gemv_u8_kernel; cpu_gemv_int8's x_int8), or NULL */
    int64_t glu_rows;   /* f when stacked from two matrices of f rows ([gate; up]: run_glu), else 0 */
    const float *cscale; /* F8_E4M3 with scales along rows (tsr_gemv_args.cscale), or NULL */
    int64_t cscale_cols;
} gemv_matrix;

/* Reads ctx params "weights" (copy, the default when absent; map), "isa"
 * (auto, avx512, avx2, portable), "prefill" (gemm: the
 * blocked GEMM of gemm_cpu.h, the default when absent; blas: widened tiles
 * through OpenBLAS sgemm), "blas_min_rows", "blas_min_rows_quant",
 * "blas_tile_rows"; sets up OpenBLAS to one thread (the host's pool is the
 * only source of threads). set_error and a negative status on bad params. */
int gemv_engine_init(gemv_engine_cfg *cfg, const tsr_plugin_ctx *ctx);

/* Check w's shape against its bytes. TSR_OK, or set_error and an error. */
int gemv_engine_check(const tsr_plugin_ctx *ctx, const tsr_weight *w, uint64_t *row_bytes);

/* gemv_engine_check of n >= 1 matrices to be stacked by rows: one dtype
 * and width, *row_bytes theirs, *rows the sum. TSR_OK, or set_error and an
 * error naming the matrix. */
int gemv_engine_check_group(const tsr_plugin_ctx *ctx, const tsr_weight *ws, int n, uint64_t *row_bytes,
                            int64_t *rows);

/* FP8 checkpoints' scales (tsr_weight_scale) of n matrices of cols
 * columns stacked by rows (rows in all), set into m: one f32 per row
 * (m->scale: tsr_gemv_args.scale) where no scale changes along a row (per
 * tensor, per channel), else every row's scale of each block of columns
 * (m->cscale, m->cscale_cols: tsr_gemv_args.cscale; the matrices' blocks
 * one width). One host allocation, m->owned; nothing when none is scaled.
 * TSR_OK, or set_error and TSR_ERR_UNSUPPORTED (blocks of two widths),
 * TSR_ERR_NOMEM. */
int gemv_engine_scales(const tsr_plugin_ctx *ctx, const tsr_weight *ws, int n, gemv_matrix *m);

/* Whether the host gives mapped weight pages back (weight_done, host API 3). */
int gemv_engine_can_give_back(const tsr_host_api *h);

/* The weights as stored of the n matrices ws (one dtype, cols and
 * row_bytes; n > 1: stacked by rows in order, as prepare_group asks). With
 * resident (prepare_group: the host keeps them prepared for the model's
 * life) and cfg->copy_weights: copied into the plugin's memory (host
 * alloc, which asks the kernel for 2 MiB pages on large blocks) over the
 * host's pool, each block's mapped pages given back as soon as it is
 * copied, so that resident memory grows by about a block. Else, for one
 * matrix, its data itself (prepare(): experts prepared on demand are read
 * in place, not copied at every miss), and for several
 * TSR_ERR_UNSUPPORTED (the host then prepares them one by one). Why copy:
 * a decode token reads every weight once, from many rows at a time; behind
 * 4 KiB pages of the file mapping each thread's streams cross a page every
 * 4 KiB (a TLB miss, a prefetcher restart), and stacked matrices make one
 * GEMV (one wake-up of the pool) of several. *data: what to read; *block:
 * the arena block of the copy (gemv_arena_put), or NULL. */
int gemv_engine_weights(const gemv_engine_cfg *cfg, gemv_arena *arena, const tsr_plugin_ctx *ctx,
                        const tsr_weight *ws, int n, int resident, uint64_t row_bytes, const uint8_t **data,
                        gemv_block **block);

/* y[rows, m->rows] = x[rows, m->cols] . W^T. With m->x_i16, the kernel path
 * quantises x to int16 per row first (tsr_gemv_i8_args); NaN or Inf in x
 * takes the f32 path so that they propagate. ex (may be NULL) gives the
 * pool's thread count, which sizes the GEMM's shares. */
int gemv_engine_run(const gemv_engine_cfg *cfg, const tsr_plugin_ctx *ctx, const gemv_matrix *m,
                    int rows, const float *x, float *y, const tsr_exec *ex);

/* The gemv slot's run_glu (tsr_gemv.h) over a matrix with glu_rows f:
 * y[rows, f] = silu(gate) * up, the rows of run() (the same kernels and
 * takes, so the same sums) and tsr_silu_mul's arithmetic (takes aligned to
 * 8 gate rows: its vector part covers the same elements as over whole
 * rows). TSR_ERR_UNSUPPORTED, nothing set, where run() would take the
 * prefill path or m is no gate/up pair (gemv_engine_glu_rows). */
int gemv_engine_run_glu(const gemv_engine_cfg *cfg, const tsr_plugin_ctx *ctx, const gemv_matrix *m,
                        int rows, const float *x, float *y, const tsr_exec *ex);

/* Two matrices of equal rows f stacked (prepare_group with n = 2), f a
 * multiple of 4: f, for gemv_matrix.glu_rows; else 0 (not fused). With f a
 * multiple of 4 the up rows start where run()'s would, on a multiple of 4,
 * so the kernels that take four rows at a time group them alike. */
static inline int64_t gemv_engine_glu_rows(const tsr_weight *ws, int n) {
    return n == 2 && ws[0].rows == ws[1].rows && ws[0].rows % 4 == 0 ? ws[0].rows : 0;
}

#endif /* CPU_GEMV_ENGINE_H */
