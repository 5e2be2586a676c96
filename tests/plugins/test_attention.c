/* test_attention: causal softmax attention over a contiguous f32 view. */
#include <math.h>

#include "slots/tsr_attention.h"

typedef struct inst {
    const tsr_plugin_ctx *ctx;
} inst;

static int at_init(void *p, const tsr_plugin_ctx *ctx) {
    ((inst *)p)->ctx = ctx;
    return TSR_OK;
}

static int at_run(void *p, const tsr_attn_args *a, const tsr_exec *ex) {
    (void)ex;
    inst *at = p;
    const tsr_kv_view *kv = a->kv;
    if (kv->dtype != TSR_DTYPE_F32 || kv->layout != TSR_KV_CONTIGUOUS) {
        at->ctx->host->set_error(at->ctx, "reads contiguous f32 KV only");
        return TSR_ERR_UNSUPPORTED;
    }
    int group = a->n_heads / a->n_kv_heads, hd = a->head_dim;
    const float *K = kv->k, *V = kv->v;
    for (int r = 0; r < a->rows; r++)
        for (int h = 0; h < a->n_heads; h++) {
            const float *q = a->q + ((size_t)r * a->n_heads + h) * hd;
            float *o = a->out + ((size_t)r * a->n_heads + h) * hd;
            int kvh = h / group, n = a->pos0 + r + 1;
            double mx = -INFINITY, sum = 0;
            for (int t = 0; t < n; t++) {
                const float *k = K + t * kv->token_stride + kvh * kv->head_stride;
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)q[d] * k[d];
                if (s * a->scale > mx) mx = s * a->scale;
            }
            for (int d = 0; d < hd; d++) o[d] = 0;
            for (int t = 0; t < n; t++) {
                const float *k = K + t * kv->token_stride + kvh * kv->head_stride;
                const float *v = V + t * kv->token_stride + kvh * kv->head_stride;
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)q[d] * k[d];
                double w = exp(s * a->scale - mx);
                sum += w;
                for (int d = 0; d < hd; d++) o[d] += (float)(w * v[d]);
            }
            for (int d = 0; d < hd; d++) o[d] = (float)(o[d] / sum);
        }
    return TSR_OK;
}

static const tsr_attention_i iface = {
    .struct_size = sizeof(tsr_attention_i),
    .version = TSR_ATTENTION_IFACE_VERSION,
    .run = at_run,
};

static const tsr_plugin_desc desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "test_attention",
    .slot = TSR_SLOT_ATTENTION,
    .version = "0.1.0",
    .instance_size = sizeof(inst),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = at_init,
    .iface = &iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *tsr_plugin_entry(void) { return &desc; }
