/* The CPU backend: host memory and kernels/cpu/ops.h. The per-row ops of
 * a pass of many rows (prefill: embedding, norms, RoPE, SiLU) are split
 * over the engine's pool by rows; each row is computed as it would be
 * alone, so results do not depend on the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/dtype.h"
#include "../util/threadpool.h"
#include "backend.h"

/* The pool of the pass running on this thread (set_pool before each pass;
 * per thread, as a draft model's pass may run beside the target's). */
static __thread tsr_threadpool *t_pool;

static void cpu_set_pool(void *pool) { t_pool = pool; }

/* A per-row op: rows [r0, r1) of the op's arguments. */
typedef struct row_job row_job;
struct row_job {
    void (*rows)(const row_job *j, int r0, int r1);
    float *y;        /* the output rows (RoPE: rotated in place) */
    float *res;      /* add_rmsnorm's residual rows: res += add, then normalised */
    const float *x, *add, *w;
    const void *table;
    const int32_t *ids;
    int n_ids;       /* embedding: rows of the table */
    const tsr_rope *rope;
    uint64_t row_bytes;
    uint32_t dtype;
    int n, heads, pos0;
    float eps;
};

static void row_work(void *arg, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const row_job *j = arg;
    j->rows(j, (int)i0, (int)i1);
}

/* Below this many floats an op's rows stay on the calling thread: waking
 * the pool costs microseconds, a row of a few thousand floats less. */
#define POOL_MIN_FLOATS 32768

static void each_row(const row_job *j, int rows) {
    if (t_pool && rows > 1 && (int64_t)rows * j->n >= POOL_MIN_FLOATS)
        tsr_threadpool_run(t_pool, rows, row_work, (void *)j);
    else
        j->rows(j, 0, rows);
}

/* Zeroed and 64-byte aligned: the kernels read activations in whole
 * cache-line vectors, and calloc's 16-byte alignment split every 64-byte
 * load across two lines (tools/cpu_lab/seq_lab.c, two threads, Q8_0 of the
 * Qwen2.5-0.5B shape: down projection 156 -> 166 us, output head 4.42 ->
 * 4.50 ms with x 16 bytes off; BENCHMARKS.md, twenty-second session). */
static void *cpu_alloc(size_t bytes, tsr_error *err) {
    const size_t n = bytes ? (bytes + 63) / 64 * 64 : 64;
    void *p = NULL;
    if (n < bytes || posix_memalign(&p, 64, n) != 0) p = NULL;
    if (!p) tsr_error_set(err, TSR_ERR_NOMEM, "out of memory for %zu bytes", bytes);
    else memset(p, 0, n);
    return p;
}

static int cpu_copy(void *dst, const void *src, size_t bytes, tsr_error *err) {
    (void)err;
    memcpy(dst, src, bytes);
    return TSR_OK;
}

static void *cpu_host_alloc(size_t bytes, tsr_error *err) { return cpu_alloc(bytes, err); }

static void embed_rows(const row_job *j, int r0, int r1) {
    for (int r = r0; r < r1; r++) {
        const int32_t id = j->ids[r] >= 0 && j->ids[r] < j->n_ids ? j->ids[r] : 0;
        tsr_dequant_row(j->dtype, (const uint8_t *)j->table + j->row_bytes * (uint64_t)id, j->y + (int64_t)r * j->n,
                        j->n);
    }
}

static int cpu_embed(float *x, const void *table, uint32_t dtype, int hidden, int n_ids, const int32_t *ids,
                     int rows, tsr_error *err) {
    uint64_t row_bytes;
    if (tsr_dtype_row_bytes(dtype, hidden, &row_bytes) != 0)
        return tsr_error_set(err, TSR_ERR_UNSUPPORTED, "embedding dtype %s with %d columns",
                             tsr_dtype_name(dtype), hidden);
    row_job j = {.rows = embed_rows, .y = x, .table = table, .ids = ids, .n_ids = n_ids, .row_bytes = row_bytes,
                 .dtype = dtype, .n = hidden};
    each_row(&j, rows);
    return TSR_OK;
}

/* y = rmsnorm(x) * w; with res, res += add first and res is normalised */
static void norm_rows(const row_job *j, int r0, int r1) {
    for (int r = r0; r < r1; r++) {
        const int64_t at = (int64_t)r * j->n;
        if (j->res) tsr_add(j->res + at, j->add + at, j->n);
        tsr_rmsnorm(j->y + at, j->res ? j->res + at : j->x + at, j->w, j->n, j->eps);
    }
}

static int cpu_rmsnorm(float *y, const float *x, const float *w, int rows, int n, float eps,
                       tsr_error *err) {
    (void)err;
    row_job j = {.rows = norm_rows, .y = y, .x = x, .w = w, .n = n, .eps = eps};
    each_row(&j, rows);
    return TSR_OK;
}

static int cpu_add_rmsnorm(float *x, const float *o, float *y, const float *w, int rows, int n, float eps,
                           tsr_error *err) {
    (void)err;
    row_job j = {.rows = norm_rows, .y = y, .res = x, .add = o, .w = w, .n = n, .eps = eps};
    each_row(&j, rows);
    return TSR_OK;
}

static void rope_rows(const row_job *j, int r0, int r1) {
    for (int r = r0; r < r1; r++) tsr_rope_apply(j->rope, j->y + (int64_t)r * j->n, j->heads, j->pos0 + r);
}

static int cpu_rope(const tsr_rope *rp, const float *inv_freq, float *x, int rows, int n_heads,
                    int pos0, const int32_t *dev_pos0, tsr_error *err) {
    (void)inv_freq;
    if (dev_pos0) return tsr_error_set(err, TSR_ERR_INVALID, "the CPU backend has no device positions");
    row_job j = {.rows = rope_rows, .y = x, .rope = rp, .n = n_heads * rp->head_dim, .heads = n_heads,
                 .pos0 = pos0};
    each_row(&j, rows);
    return TSR_OK;
}

static int cpu_silu_mul(float *y, const float *g, const float *u, int64_t n, tsr_error *err) {
    (void)err;
    tsr_silu_mul(y, g, u, n);
    return TSR_OK;
}

static void silu_rows(const row_job *j, int r0, int r1) {
    for (int r = r0; r < r1; r++) {
        const float *gu = j->x + (int64_t)r * 2 * j->n;
        tsr_silu_mul(j->y + (int64_t)r * j->n, gu, gu + j->n, j->n);
    }
}

static int cpu_silu_mul_cat(float *y, const float *gu, int rows, int f, tsr_error *err) {
    (void)err;
    row_job j = {.rows = silu_rows, .y = y, .x = gu, .n = f};
    each_row(&j, rows);
    return TSR_OK;
}

static int cpu_split3(float *da, float *db, float *dc, const float *src, int rows, int a, int b, int c,
                      tsr_error *err) {
    (void)err;
    for (int r = 0; r < rows; r++) {
        const float *in = src + (int64_t)r * (a + b + c);
        memcpy(da + (int64_t)r * a, in, (size_t)a * sizeof(float));
        memcpy(db + (int64_t)r * b, in + a, (size_t)b * sizeof(float));
        memcpy(dc + (int64_t)r * c, in + a + b, (size_t)c * sizeof(float));
    }
    return TSR_OK;
}

static int cpu_rope_split(const tsr_rope *rp, const float *inv_freq, float *q, float *k, float *v, const float *src,
                          int rows, int n_heads, int n_kv, int pos0, const int32_t *dev_pos0, tsr_error *err) {
    const int hd = rp->head_dim;
    int rc = cpu_split3(q, k, v, src, rows, n_heads * hd, n_kv * hd, n_kv * hd, err);
    if (rc == TSR_OK) rc = cpu_rope(rp, inv_freq, q, rows, n_heads, pos0, dev_pos0, err);
    if (rc == TSR_OK) rc = cpu_rope(rp, inv_freq, k, rows, n_kv, pos0, dev_pos0, err);
    return rc;
}

static int cpu_argmax(const float *x, int rows, int n, int32_t *out, tsr_error *err) {
    (void)err;
    for (int r = 0; r < rows; r++) /* -1 for a row of NaN and -inf */
        out[r] = tsr_argmax_above(x + (int64_t)r * n, n, -INFINITY);
    return TSR_OK;
}

static int cpu_add(float *y, const float *x, int64_t n, tsr_error *err) {
    (void)err;
    tsr_add(y, x, n);
    return TSR_OK;
}

static int cpu_add_rows(float *y, const float *b, int rows, int n, tsr_error *err) {
    (void)err;
    for (int r = 0; r < rows; r++) tsr_add(y + (int64_t)r * n, b, n);
    return TSR_OK;
}

static int cpu_route(float *p, int rows, int n_experts, int k, int norm, int32_t *idx, float *w, tsr_error *err) {
    (void)err;
    for (int r = 0; r < rows; r++) {
        float *pr = p + (int64_t)r * n_experts, *wr = w + (int64_t)r * k;
        int32_t *ir = idx + (int64_t)r * k;
        tsr_softmax(pr, n_experts);
        tsr_topk(pr, n_experts, k, ir);
        float sum = 0.0f;
        for (int j = 0; j < k; j++) sum += (wr[j] = ir[j] >= 0 ? pr[ir[j]] : 0.0f);
        if (norm && sum > 0.0f)
            for (int j = 0; j < k; j++) wr[j] /= sum;
    }
    return TSR_OK;
}

static int cpu_gather_rows(float *dst, const float *src, const int32_t *rows, int n, int cols, tsr_error *err) {
    (void)err;
    for (int j = 0; j < n; j++)
        memcpy(dst + (int64_t)j * cols, src + (int64_t)rows[j] * cols, (size_t)cols * sizeof(float));
    return TSR_OK;
}

static int cpu_scatter_axpy(float *y, const float *src, const int32_t *rows, const float *w, int n, int cols,
                            tsr_error *err) {
    (void)err;
    for (int j = 0; j < n; j++) tsr_axpy(y + (int64_t)rows[j] * cols, w[j], src + (int64_t)j * cols, cols);
    return TSR_OK;
}

static int cpu_add_gated(float *y, const float *src, const float *gate, int rows, int cols, tsr_error *err) {
    (void)err;
    for (int r = 0; r < rows; r++)
        tsr_axpy(y + (int64_t)r * cols, tsr_sigmoid(gate[r]), src + (int64_t)r * cols, cols);
    return TSR_OK;
}

static int cpu_zero(float *y, int64_t n, tsr_error *err) {
    (void)err;
    memset(y, 0, (size_t)n * sizeof(float));
    return TSR_OK;
}

static int cpu_sync(tsr_error *err) {
    (void)err;
    return TSR_OK;
}

static const tsr_backend cpu_backend = {
    .device = 0,
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .upload_async = cpu_copy,
    .download_async = cpu_copy,
    .copy_async = cpu_copy,
    .host_alloc = cpu_host_alloc,
    .host_free = free,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add_rmsnorm = cpu_add_rmsnorm,
    .rope = cpu_rope,
    .rope_split = cpu_rope_split,
    .silu_mul = cpu_silu_mul,
    .silu_mul_cat = cpu_silu_mul_cat,
    .split3 = cpu_split3,
    .argmax = cpu_argmax,
    .route = cpu_route,
    .gather_rows = cpu_gather_rows,
    .scatter_axpy = cpu_scatter_axpy,
    .add_gated = cpu_add_gated,
    .zero = cpu_zero,
    .add = cpu_add,
    .add_rows = cpu_add_rows,
    .sync = cpu_sync,
    .set_pool = cpu_set_pool,
};

const tsr_backend *tsr_backend_cpu(void) { return &cpu_backend; }

#ifndef TESSERA_CUDA
const tsr_backend *tsr_backend_cuda(void) { return NULL; }
#endif
