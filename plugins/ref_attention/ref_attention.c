/*
 * ref_attention - the reference attention: for each row and query head, the
 * scores of every visible key, a max-subtracted softmax, and the weighted sum
 * of values, in f32 and in index order. Reads contiguous KV stored as f32
 * in place; f16 and int8 (with per-token, per-head scales) are first
 * widened, once per call, into an f32 copy of the tokens the call reads,
 * holding the values they stand for (an int8 code times its scale: one f32
 * product), which then goes through the same arithmetic: so the output over
 * a compact KV is bit for bit the output over its widened copy (its
 * manifest requires such a kv_cache plugin).
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/dtype.h"
#include "slots/tsr_attention.h"

#ifndef REF_ATTENTION_NAME /* a test build may give it another name */
#define REF_ATTENTION_NAME "ref_attention"
#endif

typedef struct ref_attn {
    const tsr_plugin_ctx *ctx;
} ref_attn;

static int attn_init(void *inst, const tsr_plugin_ctx *ctx) {
    ((ref_attn *)inst)->ctx = ctx;
    return TSR_OK;
}

typedef struct attn_job {
    const tsr_attn_args *a;
    int failed;
} attn_job;

/* Scores q . k_t * scale for t in [first, last], each summed in head
 * dimension order; four keys at a time only so that four independent sums
 * are in flight (the arithmetic of each is unchanged). */
static float scores_of(const float *q, const float *K, int64_t ts, int hd, float scale, int first,
                       int last, float *scores) {
    float mx = -INFINITY;
    int t = first;
    for (; t + 3 <= last; t += 4) {
        const float *k0 = K + t * ts, *k1 = k0 + ts, *k2 = k1 + ts, *k3 = k2 + ts;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int d = 0; d < hd; d++) {
            s0 += q[d] * k0[d];
            s1 += q[d] * k1[d];
            s2 += q[d] * k2[d];
            s3 += q[d] * k3[d];
        }
        float s[4] = {s0 * scale, s1 * scale, s2 * scale, s3 * scale};
        for (int i = 0; i < 4; i++) {
            scores[t + i] = s[i];
            if (s[i] > mx) mx = s[i];
        }
    }
    for (; t <= last; t++) {
        const float *k = K + t * ts;
        float s = 0.0f;
        for (int d = 0; d < hd; d++) s += q[d] * k[d];
        s *= scale;
        scores[t] = s;
        if (s > mx) mx = s;
    }
    return mx;
}

/* out[d] = sum_t p[t] * v_t[d], each sum in t order from 0; four dimensions
 * at a time in registers (independent sums, unchanged arithmetic). */
static void weighted_values(const float *p, const float *V, int64_t ts, int hd, int first, int last,
                            float *out) {
    int d = 0;
    for (; d + 4 <= hd; d += 4) {
        float o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f;
        for (int t = first; t <= last; t++) {
            const float *v = V + t * ts + d;
            o0 += p[t] * v[0];
            o1 += p[t] * v[1];
            o2 += p[t] * v[2];
            o3 += p[t] * v[3];
        }
        out[d] = o0, out[d + 1] = o1, out[d + 2] = o2, out[d + 3] = o3;
    }
    for (; d < hd; d++) {
        float o = 0.0f;
        for (int t = first; t <= last; t++) o += p[t] * V[t * ts + d];
        out[d] = o;
    }
}

/* One work item is one (row, head) pair. */
static void attn_items(void *arg, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    attn_job *j = arg;
    const tsr_attn_args *a = j->a;
    const tsr_kv_view *kv = a->kv;
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    float *scores = malloc(((size_t)a->pos0 + a->rows) * sizeof *scores);
    if (!scores) {
        j->failed = 1;
        return;
    }
    for (int64_t item = i0; item < i1; item++) {
        int row = (int)(item / a->n_heads), h = (int)(item % a->n_heads), kvh = h / group;
        int last = a->pos0 + row; /* inclusive */
        int first = a->window > 0 && last - a->window + 1 > 0 ? last - a->window + 1 : 0;
        const float *q = a->q + ((int64_t)row * a->n_heads + h) * hd;
        const float *K = (const float *)kv->k + kvh * kv->head_stride;
        const float *V = (const float *)kv->v + kvh * kv->head_stride;
        float mx = scores_of(q, K, kv->token_stride, hd, a->scale, first, last, scores);
        float sum = 0.0f;
        for (int t = first; t <= last; t++) {
            scores[t] = expf(scores[t] - mx);
            sum += scores[t];
        }
        int t = first;
        for (; t + 3 <= last; t += 4) { /* four independent divisions: one packed divide */
            scores[t] = scores[t] / sum;
            scores[t + 1] = scores[t + 1] / sum;
            scores[t + 2] = scores[t + 2] / sum;
            scores[t + 3] = scores[t + 3] / sum;
        }
        for (; t <= last; t++) scores[t] = scores[t] / sum;
        weighted_values(scores, V, kv->token_stride, hd, first, last,
                        a->out + (int64_t)row * a->n_heads * hd + (int64_t)h * hd);
    }
    free(scores);
}

/* Compact KV widened to f32: items are tokens, each token's heads of K and V
 * into k32/v32 [n_tokens, n_kv_heads * head_dim]. */
typedef struct widen_job {
    const tsr_kv_view *kv;
    float *k32, *v32;
} widen_job;

static void widen_tokens(void *arg, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const widen_job *w = arg;
    const tsr_kv_view *kv = w->kv;
    const int hd = kv->head_dim;
    const size_t es = (size_t)tsr_dtype_block_bytes(kv->dtype);
    for (int64_t t = t0; t < t1; t++)
        for (int h = 0; h < kv->n_kv_heads; h++) {
            const size_t off = es * (size_t)(t * kv->token_stride + h * kv->head_stride);
            float *ko = w->k32 + (t * kv->n_kv_heads + h) * hd, *vo = w->v32 + (t * kv->n_kv_heads + h) * hd;
            tsr_dequant_row(kv->dtype, (const char *)kv->k + off, ko, hd);
            tsr_dequant_row(kv->dtype, (const char *)kv->v + off, vo, hd);
            if (kv->k_scale) {
                const float ks = kv->k_scale[t * kv->n_kv_heads + h], vs = kv->v_scale[t * kv->n_kv_heads + h];
                for (int d = 0; d < hd; d++) ko[d] *= ks, vo[d] *= vs;
            }
        }
}

static int attn_run(void *inst, const tsr_attn_args *a, const tsr_exec *ex) {
    ref_attn *r = inst;
    (void)ex;
    const tsr_kv_view *kv = a->kv;
    const int scaled = kv->dtype == TSR_DTYPE_I8;
    if ((kv->dtype != TSR_DTYPE_F32 && kv->dtype != TSR_DTYPE_F16 && !scaled) || kv->layout != TSR_KV_CONTIGUOUS ||
        (scaled && (!kv->k_scale || !kv->v_scale))) {
        r->ctx->host->set_error(r->ctx, "reads contiguous f32, f16 or int8 (with scales) KV only (got dtype %s, "
                                "layout %u%s)", tsr_dtype_name(kv->dtype), kv->layout,
                                scaled ? ", no scales" : "");
        return TSR_ERR_UNSUPPORTED;
    }
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads != 0 || kv->n_tokens < a->pos0 + a->rows ||
        kv->head_dim != a->head_dim || kv->n_kv_heads != a->n_kv_heads) {
        r->ctx->host->set_error(r->ctx, "inconsistent shapes: %d heads, %d kv heads, %d KV tokens for rows %d..%d",
                                a->n_heads, a->n_kv_heads, kv->n_tokens, a->pos0, a->pos0 + a->rows - 1);
        return TSR_ERR_INVALID;
    }
    tsr_kv_view wide;
    tsr_attn_args aw;
    float *k32 = NULL;
    if (kv->dtype != TSR_DTYPE_F32) { /* the tokens this call reads, widened once */
        const int64_t T = (int64_t)a->pos0 + a->rows, n = T * kv->n_kv_heads * kv->head_dim;
        if (!(k32 = malloc(2 * (size_t)n * sizeof *k32))) {
            r->ctx->host->set_error(r->ctx, "out of memory for %lld tokens of KV widened to f32", (long long)T);
            return TSR_ERR_NOMEM;
        }
        widen_job w = {kv, k32, k32 + n};
        r->ctx->host->parallel_for(r->ctx, T, widen_tokens, &w);
        wide = (tsr_kv_view){.dtype = TSR_DTYPE_F32, .layout = TSR_KV_CONTIGUOUS, .n_tokens = (int)T,
                             .n_kv_heads = kv->n_kv_heads, .head_dim = kv->head_dim, .k = w.k32, .v = w.v32,
                             .token_stride = (int64_t)kv->n_kv_heads * kv->head_dim, .head_stride = kv->head_dim};
        aw = *a;
        aw.kv = &wide;
        a = &aw;
    }
    attn_job j = {a, 0};
    r->ctx->host->parallel_for(r->ctx, (int64_t)a->rows * a->n_heads, attn_items, &j);
    free(k32);
    if (j.failed) {
        r->ctx->host->set_error(r->ctx, "out of memory for scores");
        return TSR_ERR_NOMEM;
    }
    return TSR_OK;
}

static const tsr_attention_i ref_attn_iface = {
    .struct_size = sizeof(tsr_attention_i),
    .version = TSR_ATTENTION_IFACE_VERSION,
    .run = attn_run,
};

static const tsr_plugin_desc ref_attn_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = REF_ATTENTION_NAME,
    .slot = TSR_SLOT_ATTENTION,
    .version = "1.0.0",
    .instance_size = sizeof(ref_attn),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = attn_init,
    .fini = NULL,
    .iface = &ref_attn_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &ref_attn_desc; }
