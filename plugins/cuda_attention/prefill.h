/*
 * prefill.h - cuda_attention's prefill kernel: causal attention of many
 * query rows at once over bf16 KV (contiguous or paged), flash-attention-2 style on
 * tensor cores (prefill.cu). C linkage so that the GPU tests can call it
 * directly as well as through the plugin.
 *
 * Exact in the sense of the plugin's manifest: q and the softmax weights
 * are each split into two bf16 halves (hi + lo, 16 significant bits), so the
 * tensor cores' bf16 products with the stored bf16 keys and values lose
 * nothing an f32 computation keeps to 2^-17 of each term; sums are f32.
 */
#ifndef CUDA_ATTN_PREFILL_H
#define CUDA_ATTN_PREFILL_H

#include "slots/tsr_attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cuda_attention runs passes of at least this many rows through this kernel
 * by default (param tile_rows): prefill, and verification of 2+ drafts,
 * where one block per KV head reading each key once for every row beat
 * split-K on the H200 (8 rows: 6.06 against 6.70 ms a pass, BENCHMARKS.md);
 * fewer rows (decode) keep the split-K kernel. */
#define CUDA_ATTN_PREFILL_MIN_ROWS 3

/* 1 if cuda_attn_prefill can run a: bf16 KV, contiguous or paged (a block
 * table, block_stride a multiple of 8 elements), whose k and v are
 * 16-byte aligned with token and head strides multiples of 8 elements,
 * head_dim 16, 32, 64 or 128, n_heads a multiple of n_kv_heads with at most
 * 64 query heads per KV head, rows >= 1, pos0 >= 0, and a view holding
 * pos0 + rows tokens; else 0 (nothing is launched). */
int cuda_attn_prefill_supported(const tsr_attn_args *a);

/* Launch the kernel for a on stream (a cudaStream_t): a->out [rows,
 * n_heads * head_dim] receives softmax(q K^T * scale) V, row i over keys
 * [first, pos0 + i] (first = max(0, pos0 + i - window + 1) with a window,
 * else 0). Only keys below pos0 + rows are read. Asynchronous; returns 0
 * (cudaSuccess) or the cudaError_t of the launch. Precondition:
 * cuda_attn_prefill_supported(a). */
int cuda_attn_prefill(const tsr_attn_args *a, void *stream);

/* The same for a pass captured into a CUDA graph: the kernel reads pos0
 * from dev_pos0 (device memory) when it runs, so that each replay attends
 * at its own position; a->pos0 is the capture's (supported() checks it).
 * The grid depends on a->rows only. dev_pos0 NULL: a->pos0. */
int cuda_attn_prefill_at(const tsr_attn_args *a, const int32_t *dev_pos0, void *stream);

/* The same with each (row block, KV head)'s keys cut into n_splits groups
 * of tiles run by separate blocks (passes of few rows, which otherwise keep
 * one block per KV head walking every key), then merged by a second kernel
 * (merge.cuh). part: device scratch of rows * n_heads * n_splits *
 * (2 + head_dim) floats. n_splits 1: as cuda_attn_prefill_at (part unused).
 * pdl: launched as programmatic dependents (kernels/cuda/pdl.cuh). */
int cuda_attn_prefill_split(const tsr_attn_args *a, const int32_t *dev_pos0, float *part, int n_splits, int pdl,
                            void *stream);

#ifdef __cplusplus
}
#endif

#endif /* CUDA_ATTN_PREFILL_H */
