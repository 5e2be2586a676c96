/*
 * bad_gemv - a gemv plugin with a planted defect, for the harness's own
 * test: BAD_GUARD writes one float past y; BAD_DRIFT scales every output by
 * 1.001 (NMSE 1e-6, above the exact bound); BAD_NAN turns non-finite
 * outputs into 0. Otherwise it is a plain f32-only gemv.
 */
#include <math.h>

#include "slots/tsr_gemv.h"

typedef struct bad {
    const tsr_plugin_ctx *ctx;
} bad;

static int bad_init(void *inst, const tsr_plugin_ctx *ctx) {
    ((bad *)inst)->ctx = ctx;
    return TSR_OK;
}

static int bad_prepare(void *inst, const tsr_weight *w, void **out) {
    bad *b = inst;
    if (w->dtype != TSR_DTYPE_F32) {
        b->ctx->host->set_error(b->ctx, "%s: only f32", w->name);
        return TSR_ERR_UNSUPPORTED;
    }
    *out = (void *)w;
    return TSR_OK;
}

static int bad_run(void *inst, const void *prepared, int rows, const float *x, float *y, const tsr_exec *ex) {
    (void)inst, (void)ex;
    const tsr_weight *w = prepared;
    const float *W = w->data;
    for (int r = 0; r < rows; r++)
        for (int64_t o = 0; o < w->rows; o++) {
            float s = 0.0f;
            for (int64_t i = 0; i < w->cols; i++) s += x[r * w->cols + i] * W[o * w->cols + i];
#if defined(BAD_DRIFT)
            s *= 1.001f;
#elif defined(BAD_NAN)
            if (!isfinite(s)) s = 0.0f;
#endif
            y[r * w->rows + o] = s;
        }
#if defined(BAD_GUARD)
    y[rows * w->rows] = 1.0f;
#endif
    return TSR_OK;
}

static const tsr_gemv_i bad_iface = {
    .struct_size = sizeof(tsr_gemv_i),
    .version = TSR_GEMV_IFACE_VERSION,
    .prepare = bad_prepare,
    .run = bad_run,
};

static const tsr_plugin_desc bad_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = BAD_NAME,
    .slot = TSR_SLOT_GEMV,
    .version = "0.0.1",
    .instance_size = sizeof(bad),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = bad_init,
    .iface = &bad_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &bad_desc; }
