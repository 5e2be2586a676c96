/* The CUDA backend: device memory (core/cuda/device.h) and kernels/cuda. */
#include "../../kernels/cuda/cuda_ops.h"
#include "../runtime/backend.h"
#include "device.h"

static void *cu_alloc(size_t bytes, tsr_error *err) { return tsr_cuda_malloc(bytes ? bytes : 1, err); }

static int cu_embed(float *x, const void *table, uint32_t dtype, int hidden, const int32_t *host_ids,
                    int32_t *ids, int rows, tsr_error *err) {
    if (dtype != TSR_DTYPE_F32 && dtype != TSR_DTYPE_F16 && dtype != TSR_DTYPE_BF16)
        return tsr_error_set(err, TSR_ERR_UNSUPPORTED,
                             "the CUDA backend reads f32, f16 or bf16 embeddings (dtype %u)", dtype);
    int rc = tsr_cuda_upload(ids, host_ids, (size_t)rows * sizeof *ids, err);
    if (rc != TSR_OK) return rc;
    return tsr_cuda_check(tsr_cu_embed(x, table, dtype, hidden, ids, rows, NULL), "embedding", err);
}

static int cu_rmsnorm(float *y, const float *x, const float *w, int rows, int n, float eps,
                      tsr_error *err) {
    return tsr_cuda_check(tsr_cu_rmsnorm(y, x, w, rows, n, eps, NULL), "rmsnorm", err);
}

static int cu_rope(const tsr_rope *r, const float *inv_freq, float *x, int rows, int n_heads, int pos0,
                   tsr_error *err) {
    return tsr_cuda_check(tsr_cu_rope(x, inv_freq, rows, n_heads, r->head_dim, pos0, r->pos_scale,
                                      r->interleaved, NULL),
                          "rope", err);
}

static int cu_silu_mul(float *y, const float *g, const float *u, int64_t n, tsr_error *err) {
    return tsr_cuda_check(tsr_cu_silu_mul(y, g, u, n, NULL), "silu", err);
}

static int cu_add(float *y, const float *x, int64_t n, tsr_error *err) {
    return tsr_cuda_check(tsr_cu_add(y, x, n, NULL), "add", err);
}

static int cu_add_rows(float *y, const float *b, int rows, int n, tsr_error *err) {
    return tsr_cuda_check(tsr_cu_add_rows(y, b, rows, n, NULL), "bias", err);
}

static const tsr_backend cuda_backend = {
    .device = TSR_DEVICE_CUDA,
    .name = "cuda",
    .alloc = cu_alloc,
    .free = tsr_cuda_free,
    .upload = tsr_cuda_upload,
    .download = tsr_cuda_download,
    .embed = cu_embed,
    .rmsnorm = cu_rmsnorm,
    .rope = cu_rope,
    .silu_mul = cu_silu_mul,
    .add = cu_add,
    .add_rows = cu_add_rows,
    .sync = tsr_cuda_sync,
};

const tsr_backend *tsr_backend_cuda(void) { return &cuda_backend; }
