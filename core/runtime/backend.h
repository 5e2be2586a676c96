/*
 * backend.h - where the core's own work of a forward pass runs: memory for
 * activations and the core kernels (embedding, RMSNorm, RoPE, SiLU, adds).
 * The CPU backend (backend_cpu.c) works in host memory; the CUDA backend
 * (core/cuda/backend_cuda.c, built with CUDA) in device memory. Plugins get
 * the same pointers through tsr_exec.
 */
#ifndef TSR_BACKEND_H
#define TSR_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "../../kernels/cpu/ops.h"
#include "../../kernels/cuda/sample_cuda.h" /* tsr_cu_sample_args (plain C) */
#include "../util/error.h"

typedef struct tsr_backend {
    int device;  /* tsr_device_kind */
    const char *name;
    /* zeroed memory of this backend; NULL and err set on failure */
    void *(*alloc)(size_t bytes, tsr_error *err);
    void (*free)(void *p);
    /* copies that wait for the backend's queued work */
    int (*upload)(void *dst, const void *host_src, size_t bytes, tsr_error *err);
    int (*download)(void *host_dst, const void *src, size_t bytes, tsr_error *err);
    /* copies queued after the backend's work (host memory from host_alloc
     * where a graph will replay them) */
    int (*upload_async)(void *dst, const void *host_src, size_t bytes, tsr_error *err);
    int (*download_async)(void *host_dst, const void *src, size_t bytes, tsr_error *err);
    /* a copy within backend memory, queued after the backend's work */
    int (*copy_async)(void *dst, const void *src, size_t bytes, tsr_error *err);
    /* host memory the device copies to and from while replaying (pinned) */
    void *(*host_alloc)(size_t bytes, tsr_error *err);
    void (*host_free)(void *p);
    /* the queue plugins launch on (tsr_exec.stream); NULL on the CPU */
    void *(*stream)(void);
    /* runtime.pdl (NULL where the backend has none): launch the kernels of
     * the passes that follow as programmatic dependents of the kernel before
     * them (kernels/cuda/pdl.cuh) */
    void (*set_pdl)(int on);
    /* the engine's thread pool (a tsr_threadpool) for the per-row ops of the
     * passes this thread runs next (NULL where the backend has no use for it) */
    void (*set_pool)(void *pool);
    /* x[r] = row ids[r] of table [n_ids, hidden] widened to f32; ids in
     * backend memory. An id outside [0, n_ids) reads row 0: the host refuses
     * such ids before a pass, but a pipelined pass (pipe.c) takes its id from
     * the argmax before it, which is -1 where no token could be chosen (that
     * pass is then discarded). */
    int (*embed)(float *x, const void *table, uint32_t dtype, int hidden, int n_ids, const int32_t *ids,
                 int rows, tsr_error *err);
    int (*rmsnorm)(float *y, const float *x, const float *w, int rows, int n, float eps,
                   tsr_error *err);
    /* x += o, then y = rmsnorm(x) * w: the residual add and the next norm */
    int (*add_rmsnorm)(float *x, const float *o, float *y, const float *w, int rows, int n, float eps,
                       tsr_error *err);
    /* x [rows, n_heads, head_dim] to positions pos0 + r; inv_freq is the
     * backend's copy of r->inv_freq; dev_pos0 (device backends, while
     * capturing a graph) holds pos0 in backend memory instead */
    int (*rope)(const tsr_rope *r, const float *inv_freq, float *x, int rows, int n_heads, int pos0,
                const int32_t *dev_pos0, tsr_error *err);
    /* q [rows, n_heads, head_dim] and k [rows, n_kv, head_dim] each head
     * rmsnormed by q_norm / k_norm then rotated: the same values as rmsnorm
     * over the heads then rope, in one pass (NULL where the backend has none:
     * the runtime runs the three) */
    int (*qk_norm_rope)(const tsr_rope *r, const float *inv_freq, float *q, float *k, const float *q_norm,
                        const float *k_norm, int rows, int n_heads, int n_kv, float eps, int pos0,
                        const int32_t *dev_pos0, tsr_error *err);
    /* split3 of a stacked q/k/v projection src [rows, (n_heads + 2 n_kv) *
     * head_dim] into q, k, v, then rope of q and k: one pass where it can */
    int (*rope_split)(const tsr_rope *r, const float *inv_freq, float *q, float *k, float *v, const float *src,
                      int rows, int n_heads, int n_kv, int pos0, const int32_t *dev_pos0, tsr_error *err);
    int (*silu_mul)(float *y, const float *g, const float *u, int64_t n, tsr_error *err);
    /* y[r, :f] = silu(gu[r, :f]) * gu[r, f:2f] */
    int (*silu_mul_cat)(float *y, const float *gu, int rows, int f, tsr_error *err);
    /* each row of src [rows, a + b + c] cut into da [rows, a], db [rows, b]
     * and dc [rows, c] (q, k and v out of their stacked projection) */
    int (*split3)(float *da, float *db, float *dc, const float *src, int rows, int a, int b, int c,
                  tsr_error *err);
    /* out[r] = argmax of x[r, :n] (ties to the lowest index, NaN and -inf
     * never chosen, -1 if nothing else), out in backend memory */
    int (*argmax)(const float *x, int rows, int n, int32_t *out, tsr_error *err);
    /* Sampling where the logits are (NULL where the backend has none: the
     * host samples). state [vocab] int32, scratch (sample_scratch_bytes),
     * ids and out in backend memory; see kernels/cuda/sample_cuda.h. */
    int (*sample_history)(int32_t *state, const int32_t *ids, int n, int gen_from, int vocab, tsr_error *err);
    int (*sample)(const float *logits, const int32_t *state, const tsr_cu_sample_args *a, void *scratch,
                  int32_t *out, tsr_error *err);
    uint64_t (*sample_scratch_bytes)(int vocab);
    /* Mixture-of-experts routing of router logits p [rows, n_experts] (made
     * probabilities in place): each row's k most probable experts, in
     * decreasing probability with ties to the lower id and NaN never chosen
     * (kernels/cpu/ops.h tsr_topk; -1 past the last number), into idx [rows,
     * k], their probabilities (divided by their sum where norm) into w. */
    int (*route)(float *p, int rows, int n_experts, int k, int norm, int32_t *idx, float *w, tsr_error *err);
    /* dst[j, :] = src[rows[j], :] for j < n, rows of cols floats; rows in
     * backend memory */
    int (*gather_rows)(float *dst, const float *src, const int32_t *rows, int n, int cols, tsr_error *err);
    /* y[rows[j], :] += w[j] * src[j, :] for j < n, the rows distinct (rows
     * and w in backend memory) */
    int (*scatter_axpy)(float *y, const float *src, const int32_t *rows, const float *w, int n, int cols,
                        tsr_error *err);
    /* y[r, :] = sum of w[r, j] * d[p, :] over the row's experts idx[r, j]
     * >= 0 in increasing id, p = pos[r k + j] (pos NULL: r k + j): zero then
     * scatter_axpy expert by expert, in one pass; with add, y += that sum
     * (add of it) (NULL where the backend has none: the CPU, whose gemv
     * plugins choose no experts themselves) */
    int (*combine_experts)(float *y, const float *d, const int32_t *idx, const float *w, int rows, int k, int cols,
                           int add, const int32_t *pos, tsr_error *err);
    /* y[r, :] += sigmoid(gate[r]) * src[r, :] for rows rows of cols */
    int (*add_gated)(float *y, const float *src, const float *gate, int rows, int cols, tsr_error *err);
    /* y[:n] = 0 */
    int (*zero)(float *y, int64_t n, tsr_error *err);
    int (*add)(float *y, const float *x, int64_t n, tsr_error *err);
    int (*add_rows)(float *y, const float *b, int rows, int n, tsr_error *err);
    /* wait for queued work; surface asynchronous errors */
    int (*sync)(tsr_error *err);
    /* CUDA graphs (NULL where the backend has none): capture what is queued
     * between begin and end into an instantiated graph; launch replays it. */
    int (*capture_begin)(tsr_error *err);
    int (*capture_end)(void **graph, tsr_error *err);
    int (*graph_launch)(void *graph, tsr_error *err);
    void (*graph_free)(void *graph);
    /* Marks in the queue (NULL where every call returns with its work done,
     * as on the CPU): record one after the work queued so far; wait until
     * the queue has passed it. */
    void *(*mark_new)(tsr_error *err);
    int (*mark_record)(void *mark, tsr_error *err);
    int (*mark_wait)(void *mark, tsr_error *err);
    void (*mark_free)(void *mark);
} tsr_backend;

const tsr_backend *tsr_backend_cpu(void);
/* NULL when built without CUDA. */
const tsr_backend *tsr_backend_cuda(void);

#endif /* TSR_BACKEND_H */
