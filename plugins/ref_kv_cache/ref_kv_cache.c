/*
 * ref_kv_cache - the reference KV cache: f32, contiguous per sequence.
 *
 * Each sequence owns one block of [n_layers][max_tokens][n_kv_heads][head_dim]
 * floats for K and one for V, allocated at seq_alloc. Appends copy rows in,
 * truncate just lowers the length (rollback), views point into the block.
 *
 * Built a second time with KV_FP8_SIM as kv_fp8_sim: a CPU simulation of
 * cuda_kv_paged's f8_e4m3 storage for measuring its quality bound on the CPU
 * (plugins/cuda_kv_paged/test_kv_fp8_quality.c, a catalog of its own, never
 * the engine's): each appended token's head is rounded through E4M3 at
 * scale amax / 448 and kept widened to f32 (the values cuda_attention reads).
 */
#include <string.h>

#include "plugins/common/kv_seqs.h"
#include "slots/tsr_kv_cache.h"

#ifdef KV_FP8_SIM
#include <math.h>

#include "kernels/dtype.h"

/* dst = each of n heads of hd values rounded through E4M3 as cuda_kv_paged's
 * store kernel does: scale amax / 448, q = e4m3(x * (448 / amax)) (saturating,
 * nearest even), read back as q * scale; an all-zero head stays zero; NaN
 * or Inf in a head makes it NaN. */
static void quantise(float *dst, const float *src, int64_t n, int hd) {
    for (int64_t i = 0; i < n; i++) {
        const float *x = src + i * hd;
        float amax = 0.0f;
        for (int d = 0; d < hd; d++) {
            const float a = fabsf(x[d]);
            if (a > amax || a != a) amax = a;
            if (amax != amax) break;
        }
        const float inv = amax > 0.0f ? 448.0f / amax : 0.0f, scale = amax / 448.0f;
        for (int d = 0; d < hd; d++) dst[i * hd + d] = tsr_f8e4m3_to_f32(tsr_f32_to_f8e4m3(x[d] * inv)) * scale;
    }
}
#define KV_NAME "kv_fp8_sim"
#define KV_CAPS TSR_CAP_DEVICE_CPU
#else
#define KV_NAME "ref_kv_cache"
#define KV_CAPS (TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT)
#endif

typedef struct kv_seq {
    tsr_kv_seq_hdr hdr;  /* used, max_tokens, lens */
    float *k, *v;        /* [n_layers, max_tokens, n_kv_heads, head_dim] */
} kv_seq;

typedef struct ref_kv {
    const tsr_plugin_ctx *ctx;
    int n_layers, n_kv_heads, head_dim;
    tsr_kv_seqs seqs;
} ref_kv;

static int64_t token_floats(const ref_kv *kv) { return (int64_t)kv->n_kv_heads * kv->head_dim; }

static int kv_init(void *inst, const tsr_plugin_ctx *ctx) {
    ref_kv *kv = inst;
    kv->ctx = ctx;
    kv->n_layers = ctx->model->n_layers;
    kv->n_kv_heads = ctx->model->n_kv_heads;
    kv->head_dim = ctx->model->head_dim;
    const tsr_param *cap = ctx->host->param(ctx, "capacity_tokens");
    if (kv->n_layers <= 0 || kv->n_kv_heads <= 0 || kv->head_dim <= 0) {
        ctx->host->set_error(ctx, "model has no layers or heads");
        return TSR_ERR_INVALID;
    }
    tsr_kv_seqs_init(&kv->seqs, ctx, sizeof(kv_seq), kv->n_layers, cap ? cap->v.i : 0);
    return TSR_OK;
}

static void seq_release(ref_kv *kv, kv_seq *s) {
    kv->ctx->host->free(kv->ctx, s->k);
    kv->ctx->host->free(kv->ctx, s->v);
    tsr_kv_seqs_release(&kv->seqs, &s->hdr);
}

static void kv_fini(void *inst) {
    ref_kv *kv = inst;
    for (int i = 0; i < kv->seqs.n; i++) seq_release(kv, (kv_seq *)tsr_kv_seqs_at(&kv->seqs, i));
    tsr_kv_seqs_free(&kv->seqs);
}

static int kv_seq_alloc(void *inst, int max_tokens, int *seq) {
    ref_kv *kv = inst;
    tsr_kv_seq_hdr *hdr;
    int rc = tsr_kv_seqs_reserve(&kv->seqs, max_tokens, seq, &hdr);
    if (rc != TSR_OK) return rc;
    kv_seq *s = (kv_seq *)hdr;
    size_t floats = (size_t)kv->n_layers * (size_t)max_tokens * (size_t)token_floats(kv);
    s->k = kv->ctx->host->alloc(kv->ctx, floats * sizeof(float), 64);
    s->v = kv->ctx->host->alloc(kv->ctx, floats * sizeof(float), 64);
    if (!s->k || !s->v) {
        seq_release(kv, s);
        kv->ctx->host->set_error(kv->ctx, "out of memory for %d tokens of KV", max_tokens);
        return TSR_ERR_NOMEM;
    }
    return TSR_OK;
}

static void kv_seq_free(void *inst, int seq) {
    ref_kv *kv = inst;
    if (seq >= 0 && seq < kv->seqs.n) seq_release(kv, (kv_seq *)tsr_kv_seqs_at(&kv->seqs, seq));
}

static int kv_append(void *inst, int seq, int layer, int pos0, int rows, const float *k,
                     const float *v, const tsr_exec *ex) {
    ref_kv *kv = inst;
    (void)ex;
    kv_seq *s = (kv_seq *)tsr_kv_seqs_get(&kv->seqs, seq);
    if (!s) return TSR_ERR_INVALID;
    int rc = tsr_kv_seqs_check_append(&kv->seqs, &s->hdr, layer, pos0, rows);
    if (rc != TSR_OK) return rc;
    int64_t tf = token_floats(kv);
    size_t off = ((size_t)layer * s->hdr.max_tokens + pos0) * tf;
#ifdef KV_FP8_SIM
    quantise(s->k + off, k, (int64_t)rows * kv->n_kv_heads, kv->head_dim);
    quantise(s->v + off, v, (int64_t)rows * kv->n_kv_heads, kv->head_dim);
#else
    memcpy(s->k + off, k, (size_t)rows * tf * sizeof(float));
    memcpy(s->v + off, v, (size_t)rows * tf * sizeof(float));
#endif
    s->hdr.lens[layer] += rows;
    return TSR_OK;
}

static int kv_view(void *inst, int seq, int layer, tsr_kv_view *out) {
    ref_kv *kv = inst;
    kv_seq *s = (kv_seq *)tsr_kv_seqs_get(&kv->seqs, seq);
    if (!s) return TSR_ERR_INVALID;
    int rc = tsr_kv_seqs_check_layer(&kv->seqs, layer);
    if (rc != TSR_OK) return rc;
    memset(out, 0, sizeof *out);
    int64_t tf = token_floats(kv);
    out->dtype = TSR_DTYPE_F32;
    out->layout = TSR_KV_CONTIGUOUS;
    out->n_tokens = s->hdr.lens[layer];
    out->n_kv_heads = kv->n_kv_heads;
    out->head_dim = kv->head_dim;
    out->k = s->k + (size_t)layer * s->hdr.max_tokens * tf;
    out->v = s->v + (size_t)layer * s->hdr.max_tokens * tf;
    out->token_stride = tf;
    out->head_stride = kv->head_dim;
    return TSR_OK;
}

static int kv_truncate(void *inst, int seq, int n_tokens) {
    ref_kv *kv = inst;
    tsr_kv_seq_hdr *s = tsr_kv_seqs_get(&kv->seqs, seq);
    return s ? tsr_kv_seqs_truncate(&kv->seqs, s, n_tokens) : TSR_ERR_INVALID;
}

static void kv_usage(void *inst, uint64_t *used, uint64_t *capacity) {
    ref_kv *kv = inst;
    uint64_t per_token = (uint64_t)kv->n_layers * (uint64_t)token_floats(kv) * 2 * sizeof(float);
    *used = tsr_kv_seqs_tokens(&kv->seqs) * per_token;
    *capacity = (uint64_t)kv->seqs.reserved_tokens * per_token;
}

#ifndef KV_FP8_SIM
/* Exported through the manifest (libffi): bytes of K and V per token. */
TSR_PLUGIN_EXPORT int64_t ref_kv_cache_bytes_per_token(int32_t n_layers, int32_t n_kv_heads,
                                                       int32_t head_dim) {
    if (n_layers < 0 || n_kv_heads < 0 || head_dim < 0) return -1;
    return (int64_t)n_layers * n_kv_heads * head_dim * 2 * (int64_t)sizeof(float);
}
#endif

static const tsr_kv_cache_i ref_kv_iface = {
    .struct_size = sizeof(tsr_kv_cache_i),
    .version = TSR_KV_CACHE_IFACE_VERSION,
    .seq_alloc = kv_seq_alloc,
    .seq_free = kv_seq_free,
    .append = kv_append,
    .view = kv_view,
    .truncate = kv_truncate,
    .usage = kv_usage,
};

static const tsr_plugin_desc ref_kv_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = KV_NAME,
    .slot = TSR_SLOT_KV_CACHE,
    .version = "1.0.0",
    .instance_size = sizeof(ref_kv),
    .caps = KV_CAPS,
    .init = kv_init,
    .fini = kv_fini,
    .iface = &ref_kv_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &ref_kv_desc; }
