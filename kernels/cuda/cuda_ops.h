/*
 * cuda_ops.h - the core's kernels on a CUDA device (C interface). Every
 * pointer is device memory unless named host_; stream is a cudaStream_t
 * (NULL: the legacy default stream). Launches are asynchronous; errors
 * surface at the next synchronising call (tsr_cuda_check in core/cuda).
 * pdl: launched as a programmatic dependent of the kernel before it
 * (runtime.pdl; kernels/cuda/pdl.cuh); every kernel here waits for that
 * kernel before it touches memory, so the results are the same.
 */
#ifndef TSR_KERNELS_CUDA_OPS_H
#define TSR_KERNELS_CUDA_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* x[r, :] = table row ids[r] widened to f32; dtype F32, F16 or BF16
 * (tsr_dtype values 0, 1, 2). ids: device int32 [rows]; one outside
 * [0, n_ids) reads row 0 (core/runtime/backend.h says when that happens). */
int tsr_cu_embed(float *x, const void *table, uint32_t dtype, int hidden, int n_ids, const int32_t *ids,
                 int rows, int pdl, void *stream);
/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, rows of n; y may equal x. */
int tsr_cu_rmsnorm(float *y, const float *x, const float *w, int rows, int n, float eps,
                   int pdl, void *stream);
/* x += o, then y = rmsnorm(x) * w, rows of n (add then rmsnorm in one pass) */
int tsr_cu_add_rmsnorm(float *x, const float *o, float *y, const float *w, int rows, int n, float eps,
                       int pdl, void *stream);
/* Rotate rows x [rows, n_heads, head_dim] to positions pos0 + r (pos0 read
 * from the device at dev_pos0 when that is not NULL). inv_freq: device
 * [head_dim / 2]. */
int tsr_cu_rope(float *x, const float *inv_freq, int rows, int n_heads, int head_dim, int pos0,
                const int32_t *dev_pos0, float pos_scale, int interleaved, int pdl, void *stream);
/* rmsnorm of each head of q [rows, n_heads, head_dim] by q_norm and of k
 * [rows, n_kv, head_dim] by k_norm, then RoPE at row r's position: the same
 * values as tsr_cu_rmsnorm over the heads and tsr_cu_rope, in one launch */
int tsr_cu_qk_norm_rope(float *q, float *k, const float *q_norm, const float *k_norm, int rows, int n_heads,
                        int n_kv, int head_dim, float eps, const float *inv_freq, int pos0, const int32_t *dev_pos0,
                        float pos_scale, int interleaved, int pdl, void *stream);
/* q [rows, n_heads, head_dim], k [rows, n_kv, head_dim] and v [rows, n_kv *
 * head_dim] out of their stacked projection src [rows, (n_heads + 2 n_kv) *
 * head_dim], q and k rotated as tsr_cu_rope rotates: one launch. */
int tsr_cu_rope_split(float *q, float *k, float *v, const float *src, const float *inv_freq, int rows, int n_heads,
                      int n_kv, int head_dim, int pos0, const int32_t *dev_pos0, float pos_scale, int interleaved,
                      int pdl, void *stream);
/* y[r, :f] = silu(gu[r, :f]) * gu[r, f:2f] (gate and up side by side) */
int tsr_cu_silu_mul_cat(float *y, const float *gu, int rows, int f, int pdl, void *stream);
/* each row of src [rows, a + b + c] cut into da [rows, a], db [rows, b],
 * dc [rows, c]: one launch */
int tsr_cu_split3(float *da, float *db, float *dc, const float *src, int rows, int a, int b, int c, int pdl, void *stream);
/* out[r] = index of the largest of x[r, :n], ties to the lowest index, NaN
 * and -inf never chosen (-1 when nothing else is there). */
int tsr_cu_argmax_rows(const float *x, int rows, int n, int32_t *out, int pdl, void *stream);
/* K/V (bf16, te elements per token) at token pos0 + r = k/v row r (f32);
 * pos0 read from the device at dev_pos0 when that is not NULL. */
int tsr_cu_kv_store_bf16(uint16_t *K, uint16_t *V, const float *k, const float *v, int rows, int64_t te,
                         int pos0, const int32_t *dev_pos0, int pdl, void *stream);
/* y = silu(g) * u */
int tsr_cu_silu_mul(float *y, const float *g, const float *u, int64_t n, int pdl, void *stream);
/* y += x */
int tsr_cu_add(float *y, const float *x, int64_t n, int pdl, void *stream);
/* y[r, :] += b for rows of n */
int tsr_cu_add_rows(float *y, const float *b, int rows, int n, int pdl, void *stream);
/* Mixture-of-experts routing of router logits p [rows, n_experts] (<= 1024;
 * made probabilities in place): each row's k most probable experts into
 * idx [rows, k] (decreasing, ties to the lower id, NaN never, -1 past the
 * last number), their probabilities (over their sum where norm) into w.
 * -5 for n_experts or k out of range. */
int tsr_cu_route(float *p, int rows, int n_experts, int k, int norm, int32_t *idx, float *w, int pdl, void *stream);
/* dst[j, :] = src[rows[j], :] for j < n, rows of cols */
int tsr_cu_gather_rows(float *dst, const float *src, const int32_t *rows, int n, int cols, int pdl, void *stream);
/* y[rows[j], :] += w[j] * src[j, :] for j < n; rows distinct */
int tsr_cu_scatter_axpy(float *y, const float *src, const int32_t *rows, const float *w, int n, int cols, int pdl,
                        void *stream);
/* y[r, :] = sum of w[r, j] * d[p, :] over j < k with idx[r, j] >= 0, where
 * p = pos[r k + j] (pos NULL: r k + j), in increasing idx (the sums
 * tsr_cu_zero then tsr_cu_scatter_axpy expert by expert give, bit for bit),
 * or with add y[r, :] += that sum (as tsr_cu_add of it); k <= 64, else -5 */
int tsr_cu_combine_experts(float *y, const float *d, const int32_t *idx, const float *w, int rows, int k, int cols,
                           int add, const int32_t *pos, int pdl, void *stream);
/* y[r, :] += sigmoid(gate[r]) * src[r, :] for rows of cols */
int tsr_cu_add_gated(float *y, const float *src, const float *gate, int rows, int cols, int pdl, void *stream);
/* y[:n] = 0 */
int tsr_cu_zero(float *y, int64_t n, int pdl, void *stream);
/* dst[i] = (bf16) src[i] */
int tsr_cu_f32_to_bf16(uint16_t *dst, const float *src, int64_t n, void *stream);
/* dst[r, c] = (bf16) src[r, c] for c < cols, 0 for cols <= c < ld (rows of
 * src are cols apart, rows of dst ld apart). */
int tsr_cu_f32_to_bf16_pad(uint16_t *dst, const float *src, int rows, int cols, int ld, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* TSR_KERNELS_CUDA_OPS_H */
