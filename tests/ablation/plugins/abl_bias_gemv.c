/* abl_bias_gemv: an f32 gemv that declares itself exact but adds a large
 * bias to one output row of the classifier (lm_head, or the tied embedding):
 * every greedy token becomes that row's token. ablate must flag it as
 * breaking exactness. With `from_call: N` > 0 the bias starts at the
 * instance's N-th classifier call: one prompt's greedy text then changes
 * from one request to the next, which bench must report as an engine that
 * is not deterministic. For the ablation tests only. */
#include <string.h>

#include "slots/tsr_gemv.h"

#define ABL_BIAS_ROW 5
#define ABL_BIAS 1000.0f

typedef struct inst {
    const tsr_plugin_ctx *ctx;
    int64_t from_call, calls; /* the bias from classifier call from_call on (0: always); calls so far */
} inst;

typedef struct prep {
    tsr_weight w;
    int classifier;
} prep;

static int g_init(void *p, const tsr_plugin_ctx *ctx) {
    inst *g = p;
    g->ctx = ctx;
    const tsr_param *t = ctx->host->param(ctx, "from_call");
    g->from_call = t ? t->v.i : 0;
    return TSR_OK;
}

static int g_prepare(void *p, const tsr_weight *w, void **out) {
    inst *g = p;
    if (w->dtype != TSR_DTYPE_F32) {
        g->ctx->host->set_error(g->ctx, "abl_bias_gemv reads f32 weights only");
        return TSR_ERR_UNSUPPORTED;
    }
    prep *q = g->ctx->host->alloc(g->ctx, sizeof *q, 16);
    if (!q) return TSR_ERR_NOMEM;
    q->w = *w;
    q->classifier = w->name && (strstr(w->name, "lm_head") || strstr(w->name, "embed_tokens")) &&
                    w->rows > ABL_BIAS_ROW;
    *out = q;
    return TSR_OK;
}

static void g_release(void *p, void *prepared) {
    inst *g = p;
    g->ctx->host->free(g->ctx, prepared);
}

static int g_run(void *p, const void *prepared, int rows, const float *x, float *y, const tsr_exec *ex) {
    (void)ex;
    inst *g = p;
    const prep *q = prepared;
    const int bias = q->classifier && ++g->calls >= g->from_call;
    const tsr_weight *w = &q->w;
    const float *W = w->data;
    for (int r = 0; r < rows; r++) {
        for (int64_t o = 0; o < w->rows; o++) {
            float acc = 0;
            for (int64_t i = 0; i < w->cols; i++) acc += x[r * w->cols + i] * W[o * w->cols + i];
            y[r * w->rows + o] = acc;
        }
        if (bias) y[r * w->rows + ABL_BIAS_ROW] += ABL_BIAS;
    }
    return TSR_OK;
}

static const tsr_gemv_i iface = {
    .struct_size = sizeof(tsr_gemv_i),
    .version = TSR_GEMV_IFACE_VERSION,
    .prepare = g_prepare,
    .release = g_release,
    .run = g_run,
};

static const tsr_plugin_desc desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "abl_bias_gemv",
    .slot = TSR_SLOT_GEMV,
    .version = "0.1.0",
    .instance_size = sizeof(inst),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = g_init,
    .iface = &iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *tsr_plugin_entry(void) { return &desc; }
