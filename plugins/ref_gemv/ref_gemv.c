/*
 * ref_gemv - the reference gemv plugin: y = x . W^T in plain f32 arithmetic.
 *
 * Weights stay as stored (borrowed from the model file's mmap); each output
 * row's weights are widened to f32 with the kernels' dequantiser and dotted
 * with each input row in order. Clarity and exactness over speed: this is the
 * baseline every other gemv plugin is tested and ablated against.
 *
 * Scaled weights (FP8 checkpoints, tsr_weight_scale): each widened element
 * is multiplied by its scale in f32 (one rounding) before the dot product,
 * so a checkpoint of those products stored as f32 gives the same bits.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "slots/tsr_gemv.h"

typedef struct ref_gemv {
    const tsr_plugin_ctx *ctx;
} ref_gemv;

typedef struct ref_weight {
    uint32_t dtype;
    int64_t rows, cols;
    uint64_t row_bytes;
    const uint8_t *data;
    tsr_weight_scale scale; /* scale.data NULL: unscaled */
} ref_weight;

static int ref_init(void *inst, const tsr_plugin_ctx *ctx) {
    ((ref_gemv *)inst)->ctx = ctx;
    return TSR_OK;
}

static int ref_prepare(void *inst, const tsr_weight *w, void **out) {
    ref_gemv *g = inst;
    uint64_t row_bytes;
    if (w->dtype >= TSR_DTYPE_COUNT || w->dtype == TSR_DTYPE_I32 || w->dtype == TSR_DTYPE_I64) {
        g->ctx->host->set_error(g->ctx, "%s: dtype %u is not a weight type", w->name, w->dtype);
        return TSR_ERR_UNSUPPORTED;
    }
    if (tsr_dtype_row_bytes(w->dtype, w->cols, &row_bytes) != 0 || w->rows <= 0 ||
        row_bytes * (uint64_t)w->rows > w->nbytes) {
        g->ctx->host->set_error(g->ctx, "%s: %lld x %lld %s does not fit its %llu bytes", w->name,
                                (long long)w->rows, (long long)w->cols, tsr_dtype_name(w->dtype),
                                (unsigned long long)w->nbytes);
        return TSR_ERR_INVALID;
    }
    const tsr_weight_scale *sc = tsr_weight_scale_of(g->ctx, w);
    if (sc && (!sc->data || sc->block_rows < 1 || sc->block_cols < 1)) {
        g->ctx->host->set_error(g->ctx, "%s: scale blocks of %lld x %lld", w->name,
                                (long long)sc->block_rows, (long long)sc->block_cols);
        return TSR_ERR_INVALID;
    }
    ref_weight *rw = g->ctx->host->alloc(g->ctx, sizeof *rw, 16);
    if (!rw) return TSR_ERR_NOMEM;
    if (sc) rw->scale = *sc;
    rw->dtype = w->dtype;
    rw->rows = w->rows;
    rw->cols = w->cols;
    rw->row_bytes = row_bytes;
    rw->data = w->data;
    *out = rw;
    return TSR_OK;
}

static void ref_release(void *inst, void *prepared) {
    ref_gemv *g = inst;
    g->ctx->host->free(g->ctx, prepared);
}

typedef struct run_job {
    const ref_weight *w;
    int rows;
    const float *x;
    float *y;
    int failed;
} run_job;

static void run_rows(void *arg, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    run_job *j = arg;
    const ref_weight *w = j->w;
    float *row = malloc((size_t)w->cols * sizeof *row);
    if (!row) {
        j->failed = 1;
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        tsr_dequant_row(w->dtype, w->data + (uint64_t)r * w->row_bytes, row, w->cols);
        if (w->scale.data) tsr_weight_scale_row(&w->scale, r, w->cols, row);
        for (int i = 0; i < j->rows; i++) {
            const float *x = j->x + (int64_t)i * w->cols;
            float acc = 0.0f;
            for (int64_t c = 0; c < w->cols; c++) acc += row[c] * x[c];
            j->y[(int64_t)i * w->rows + r] = acc;
        }
    }
    free(row);
}

static int ref_run(void *inst, const void *prepared, int rows, const float *x, float *y,
                   const tsr_exec *ex) {
    ref_gemv *g = inst;
    (void)ex;
    run_job j = {prepared, rows, x, y, 0};
    g->ctx->host->parallel_for(g->ctx, j.w->rows, run_rows, &j);
    if (j.failed) {
        g->ctx->host->set_error(g->ctx, "out of memory for a %lld-column row", (long long)j.w->cols);
        return TSR_ERR_NOMEM;
    }
    return TSR_OK;
}

static uint64_t ref_bytes(void *inst, const void *prepared) {
    (void)inst;
    const ref_weight *w = prepared;
    return w->row_bytes * (uint64_t)w->rows;
}

static const tsr_gemv_i ref_gemv_iface = {
    .struct_size = sizeof(tsr_gemv_i),
    .version = TSR_GEMV_IFACE_VERSION,
    .prepare = ref_prepare,
    .release = ref_release,
    .run = ref_run,
    .bytes = ref_bytes,
};

static const tsr_plugin_desc ref_gemv_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "ref_gemv",
    .slot = TSR_SLOT_GEMV,
    .version = "1.0.0",
    .instance_size = sizeof(ref_gemv),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = ref_init,
    .fini = NULL,
    .iface = &ref_gemv_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &ref_gemv_desc; }
