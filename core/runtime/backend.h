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
#include "../util/error.h"

typedef struct tsr_backend {
    int device;  /* tsr_device_kind */
    const char *name;
    /* zeroed memory of this backend; NULL and err set on failure */
    void *(*alloc)(size_t bytes, tsr_error *err);
    void (*free)(void *p);
    int (*upload)(void *dst, const void *host_src, size_t bytes, tsr_error *err);
    int (*download)(void *host_dst, const void *src, size_t bytes, tsr_error *err);
    /* x[r] = row ids[r] of table widened to f32. host_ids in host memory;
     * ids is backend scratch of rows int32 the backend may use. */
    int (*embed)(float *x, const void *table, uint32_t dtype, int hidden, const int32_t *host_ids,
                 int32_t *ids, int rows, tsr_error *err);
    int (*rmsnorm)(float *y, const float *x, const float *w, int rows, int n, float eps,
                   tsr_error *err);
    /* x [rows, n_heads, head_dim] to positions pos0 + r; inv_freq is the
     * backend's copy of r->inv_freq */
    int (*rope)(const tsr_rope *r, const float *inv_freq, float *x, int rows, int n_heads, int pos0,
                tsr_error *err);
    int (*silu_mul)(float *y, const float *g, const float *u, int64_t n, tsr_error *err);
    int (*add)(float *y, const float *x, int64_t n, tsr_error *err);
    int (*add_rows)(float *y, const float *b, int rows, int n, tsr_error *err);
    /* wait for queued work; surface asynchronous errors */
    int (*sync)(tsr_error *err);
} tsr_backend;

const tsr_backend *tsr_backend_cpu(void);
/* NULL when built without CUDA. */
const tsr_backend *tsr_backend_cuda(void);

#endif /* TSR_BACKEND_H */
