/*
 * bad_gemv - a gemv plugin with a planted defect, for the harness's own
 * test: BAD_GUARD writes one float past y; BAD_DRIFT scales every output by
 * 1.001 (NMSE 1e-6, above the exact bound); BAD_NAN turns non-finite
 * outputs into 0; BAD_GLU stacks matrices (prepare_group) and its run_glu
 * multiplies silu(up) by gate, the pair swapped. Otherwise it is a plain
 * f32-only gemv.
 */
#include <math.h>
#include <stdlib.h>

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

#if defined(BAD_GLU)
/* Handles: the matrices stacked, copied views (at most 4). */
typedef struct stack {
    int n;
    tsr_weight w[4];
} stack;

static int glu_prepare_group(void *inst, const tsr_weight *ws, int n, void **out) {
    bad *b = inst;
    if (n < 1 || n > 4) return TSR_ERR_UNSUPPORTED;
    stack *s = calloc(1, sizeof *s);
    if (!s) return TSR_ERR_NOMEM;
    s->n = n;
    for (int i = 0; i < n; i++) {
        void *unused;
        int rc = bad_prepare(b, &ws[i], &unused);
        if (rc != TSR_OK || ws[i].cols != ws[0].cols) {
            free(s);
            return rc != TSR_OK ? rc : TSR_ERR_INVALID;
        }
        s->w[i] = ws[i];
    }
    *out = s;
    return TSR_OK;
}

static int glu_prepare(void *inst, const tsr_weight *w, void **out) { return glu_prepare_group(inst, w, 1, out); }

static void glu_release(void *inst, void *prepared) {
    (void)inst;
    free(prepared);
}

/* each matrix's products into its columns of y */
static int glu_run(void *inst, const void *prepared, int rows, const float *x, float *y, const tsr_exec *ex) {
    const stack *s = prepared;
    int64_t all = 0, off = 0;
    for (int i = 0; i < s->n; i++) all += s->w[i].rows;
    float *t = malloc(sizeof(float) * (size_t)rows * (size_t)all);
    if (!t) return TSR_ERR_NOMEM;
    for (int i = 0; i < s->n; off += s->w[i].rows, i++) {
        bad_run(inst, &s->w[i], rows, x, t, ex);
        for (int r = 0; r < rows; r++)
            for (int64_t o = 0; o < s->w[i].rows; o++) y[r * all + off + o] = t[r * s->w[i].rows + o];
    }
    free(t);
    return TSR_OK;
}

static int glu_run_glu(void *inst, const void *prepared, int rows, const float *x, float *y, const tsr_exec *ex) {
    const stack *s = prepared;
    if (s->n != 2 || s->w[0].rows != s->w[1].rows) return TSR_ERR_UNSUPPORTED;
    const int64_t f = s->w[0].rows;
    float *gu = malloc(sizeof(float) * (size_t)rows * 2 * (size_t)f);
    if (!gu) return TSR_ERR_NOMEM;
    glu_run(inst, s, rows, x, gu, ex);
    for (int r = 0; r < rows; r++)
        for (int64_t i = 0; i < f; i++) {
            const float g = gu[r * 2 * f + f + i], u = gu[r * 2 * f + i]; /* the defect: swapped */
            y[r * f + i] = g / (1.0f + expf(-g)) * u;
        }
    free(gu);
    return TSR_OK;
}

static const tsr_gemv_i bad_iface = {
    .struct_size = sizeof(tsr_gemv_i),
    .version = TSR_GEMV_IFACE_VERSION,
    .prepare = glu_prepare,
    .release = glu_release,
    .run = glu_run,
    .prepare_group = glu_prepare_group,
    .run_glu = glu_run_glu,
};
#else
static const tsr_gemv_i bad_iface = {
    .struct_size = sizeof(tsr_gemv_i),
    .version = TSR_GEMV_IFACE_VERSION,
    .prepare = bad_prepare,
    .run = bad_run,
};
#endif

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
