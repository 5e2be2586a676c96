/* The CUDA backend: device memory (core/cuda/device.h) and kernels/cuda, all
 * on the engine stream. */
#include "../../kernels/cuda/cuda_ops.h"
#include "../../kernels/cuda/sample_cuda.h"
#include "../runtime/backend.h"
#include "device.h"

/* runtime.pdl: the kernels go out as programmatic dependents of the kernel
 * before them (kernels/cuda/pdl.cuh); set by the model before each pass. */
static int g_pdl;

static void cu_set_pdl(int on) { g_pdl = on; }

static void *cu_alloc(size_t bytes, tsr_error *err) { return tsr_cuda_malloc(bytes ? bytes : 1, err); }

static int cu_embed(float *x, const void *table, uint32_t dtype, int hidden, int n_ids, const int32_t *ids, int rows,
                    tsr_error *err) {
    if (dtype != TSR_DTYPE_F32 && dtype != TSR_DTYPE_F16 && dtype != TSR_DTYPE_BF16)
        return tsr_error_set(err, TSR_ERR_UNSUPPORTED,
                             "the CUDA backend reads f32, f16 or bf16 embeddings (dtype %u)", dtype);
    return tsr_cuda_check(tsr_cu_embed(x, table, dtype, hidden, n_ids, ids, rows, g_pdl, tsr_cuda_stream()),
                          "embedding", err);
}

static int cu_rmsnorm(float *y, const float *x, const float *w, int rows, int n, float eps,
                      tsr_error *err) {
    return tsr_cuda_check(tsr_cu_rmsnorm(y, x, w, rows, n, eps, g_pdl, tsr_cuda_stream()), "rmsnorm", err);
}

static int cu_add_rmsnorm(float *x, const float *o, float *y, const float *w, int rows, int n, float eps,
                          tsr_error *err) {
    return tsr_cuda_check(tsr_cu_add_rmsnorm(x, o, y, w, rows, n, eps, g_pdl, tsr_cuda_stream()), "add and rmsnorm", err);
}

static int cu_rope(const tsr_rope *r, const float *inv_freq, float *x, int rows, int n_heads, int pos0,
                   const int32_t *dev_pos0, tsr_error *err) {
    return tsr_cuda_check(tsr_cu_rope(x, inv_freq, rows, n_heads, r->head_dim, pos0, dev_pos0, r->pos_scale,
                                      r->interleaved, g_pdl, tsr_cuda_stream()),
                          "rope", err);
}

static int cu_qk_norm_rope(const tsr_rope *r, const float *inv_freq, float *q, float *k, const float *q_norm,
                           const float *k_norm, int rows, int n_heads, int n_kv, float eps, int pos0,
                           const int32_t *dev_pos0, tsr_error *err) {
    return tsr_cuda_check(tsr_cu_qk_norm_rope(q, k, q_norm, k_norm, rows, n_heads, n_kv, r->head_dim, eps, inv_freq,
                                              pos0, dev_pos0, r->pos_scale, r->interleaved, g_pdl, tsr_cuda_stream()),
                          "q/k norm and rope", err);
}

static int cu_rope_split(const tsr_rope *r, const float *inv_freq, float *q, float *k, float *v, const float *src,
                         int rows, int n_heads, int n_kv, int pos0, const int32_t *dev_pos0, tsr_error *err) {
    return tsr_cuda_check(tsr_cu_rope_split(q, k, v, src, inv_freq, rows, n_heads, n_kv, r->head_dim, pos0, dev_pos0,
                                            r->pos_scale, r->interleaved, g_pdl, tsr_cuda_stream()),
                          "q/k/v split and rope", err);
}

static int cu_silu_mul(float *y, const float *g, const float *u, int64_t n, tsr_error *err) {
    return tsr_cuda_check(tsr_cu_silu_mul(y, g, u, n, g_pdl, tsr_cuda_stream()), "silu", err);
}

static int cu_silu_mul_cat(float *y, const float *gu, int rows, int f, tsr_error *err) {
    return tsr_cuda_check(tsr_cu_silu_mul_cat(y, gu, rows, f, g_pdl, tsr_cuda_stream()), "silu", err);
}

static int cu_split3(float *da, float *db, float *dc, const float *src, int rows, int a, int b, int c,
                     tsr_error *err) {
    return tsr_cuda_check(tsr_cu_split3(da, db, dc, src, rows, a, b, c, g_pdl, tsr_cuda_stream()), "q/k/v split", err);
}

static int cu_argmax(const float *x, int rows, int n, int32_t *out, tsr_error *err) {
    return tsr_cuda_check(tsr_cu_argmax_rows(x, rows, n, out, g_pdl, tsr_cuda_stream()), "argmax", err);
}

static int cu_sample_history(int32_t *state, const int32_t *ids, int n, int gen_from, int vocab,
                             tsr_error *err) {
    return tsr_cuda_check(tsr_cu_sample_history(state, ids, n, gen_from, vocab, tsr_cuda_stream()),
                          "sampling history", err);
}

static int cu_sample(const float *logits, const int32_t *state, const tsr_cu_sample_args *a, void *scratch,
                     int32_t *out, tsr_error *err) {
    int rc = tsr_cu_sample(logits, state, a, scratch, out, tsr_cuda_stream());
    if (rc == -1)
        return tsr_error_set(err, TSR_ERR_INVALID,
                             "device sampling: vocab %d (1..%d), temperature %g, u %g or top_k %d out of range, "
                             "or the buffers overlap",
                             a ? a->vocab : 0, TSR_CU_SAMPLE_MAX_VOCAB, a ? (double)a->temperature : 0.0,
                             a ? a->u : 0.0, a ? a->top_k : 0);
    return tsr_cuda_check(rc, "sampling", err);
}

static int cu_route(float *p, int rows, int n_experts, int k, int norm, int32_t *idx, float *w, tsr_error *err) {
    int rc = tsr_cu_route(p, rows, n_experts, k, norm, idx, w, g_pdl, tsr_cuda_stream());
    if (rc == -5)
        return tsr_error_set(err, TSR_ERR_UNSUPPORTED,
                             "device routing: %d experts, %d per token (1..1024 experts, 1..64 and at most the "
                             "experts per token)",
                             n_experts, k);
    return tsr_cuda_check(rc, "routing", err);
}

static int cu_gather_rows(float *dst, const float *src, const int32_t *rows, int n, int cols, tsr_error *err) {
    return tsr_cuda_check(tsr_cu_gather_rows(dst, src, rows, n, cols, g_pdl, tsr_cuda_stream()), "row gather",
                          err);
}

static int cu_scatter_axpy(float *y, const float *src, const int32_t *rows, const float *w, int n, int cols,
                           tsr_error *err) {
    return tsr_cuda_check(tsr_cu_scatter_axpy(y, src, rows, w, n, cols, g_pdl, tsr_cuda_stream()),
                          "weighted row scatter", err);
}

static int cu_combine_experts(float *y, const float *d, const int32_t *idx, const float *w, int rows, int k,
                              int cols, int add, const int32_t *pos, tsr_error *err) {
    int rc = tsr_cu_combine_experts(y, d, idx, w, rows, k, cols, add, pos, g_pdl, tsr_cuda_stream());
    if (rc == -5) return tsr_error_set(err, TSR_ERR_UNSUPPORTED, "combining %d experts a token (1..64)", k);
    return tsr_cuda_check(rc, "expert combine", err);
}

static int cu_add_gated(float *y, const float *src, const float *gate, int rows, int cols, tsr_error *err) {
    return tsr_cuda_check(tsr_cu_add_gated(y, src, gate, rows, cols, g_pdl, tsr_cuda_stream()), "gated add", err);
}

static int cu_zero(float *y, int64_t n, tsr_error *err) {
    return tsr_cuda_check(tsr_cu_zero(y, n, g_pdl, tsr_cuda_stream()), "zero", err);
}

static int cu_add(float *y, const float *x, int64_t n, tsr_error *err) {
    return tsr_cuda_check(tsr_cu_add(y, x, n, g_pdl, tsr_cuda_stream()), "add", err);
}

static int cu_add_rows(float *y, const float *b, int rows, int n, tsr_error *err) {
    return tsr_cuda_check(tsr_cu_add_rows(y, b, rows, n, g_pdl, tsr_cuda_stream()), "bias", err);
}

static const tsr_backend cuda_backend = {
    .device = TSR_DEVICE_CUDA,
    .name = "cuda",
    .alloc = cu_alloc,
    .free = tsr_cuda_free,
    .upload = tsr_cuda_upload,
    .download = tsr_cuda_download,
    .upload_async = tsr_cuda_upload_async,
    .download_async = tsr_cuda_download_async,
    .copy_async = tsr_cuda_copy_async,
    .host_alloc = tsr_cuda_host_alloc,
    .host_free = tsr_cuda_host_free,
    .stream = tsr_cuda_stream,
    .set_pdl = cu_set_pdl,
    .embed = cu_embed,
    .rmsnorm = cu_rmsnorm,
    .add_rmsnorm = cu_add_rmsnorm,
    .rope = cu_rope,
    .qk_norm_rope = cu_qk_norm_rope,
    .rope_split = cu_rope_split,
    .silu_mul = cu_silu_mul,
    .silu_mul_cat = cu_silu_mul_cat,
    .split3 = cu_split3,
    .argmax = cu_argmax,
    .sample_history = cu_sample_history,
    .sample = cu_sample,
    .sample_scratch_bytes = tsr_cu_sample_scratch_bytes,
    .route = cu_route,
    .gather_rows = cu_gather_rows,
    .scatter_axpy = cu_scatter_axpy,
    .combine_experts = cu_combine_experts,
    .add_gated = cu_add_gated,
    .zero = cu_zero,
    .add = cu_add,
    .add_rows = cu_add_rows,
    .sync = tsr_cuda_sync,
    .capture_begin = tsr_cuda_capture_begin,
    .capture_end = tsr_cuda_capture_end,
    .graph_launch = tsr_cuda_graph_launch,
    .graph_free = tsr_cuda_graph_free,
    .mark_new = tsr_cuda_event_new,
    .mark_record = tsr_cuda_event_record,
    .mark_wait = tsr_cuda_event_wait,
    .mark_free = tsr_cuda_event_free,
};

const tsr_backend *tsr_backend_cuda(void) { return &cuda_backend; }
