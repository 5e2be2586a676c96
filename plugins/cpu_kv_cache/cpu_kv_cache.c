/*
 * cpu_kv_cache - a compact CPU KV cache: keys and values stored as f16
 * (param dtype: f16) or as int8 with one f32 scale per token and head
 * (dtype: int8), contiguous per sequence and layer.
 *
 * Each sequence owns, per layer, K and V blocks laid out head-major
 * [n_kv_heads][max_tokens][head_dim] so that one KV head's tokens are one
 * sequential stream for the attention plugin, plus for int8 the scales
 * [max_tokens][n_kv_heads] (the order tsr_kv_view prescribes). Appends
 * convert rows in (F16C / in-register quantisation, kernels/cpu/attn_kernels.h),
 * truncate lowers the length (rollback), views point into the blocks.
 */
#include <string.h>

#include "core/util/checked.h"
#include "kernels/cpu/attn_kernels.h"
#include "plugins/common/kv_seqs.h"
#include "slots/tsr_kv_cache.h"

typedef struct kv_seq {
    tsr_kv_seq_hdr hdr; /* used, max_tokens, lens */
    void *k, *v;        /* [n_layers][n_kv_heads][max_tokens][head_dim] of the stored type */
    float *ks, *vs;     /* int8: [n_layers][max_tokens][n_kv_heads] */
} kv_seq;

typedef struct cpu_kv {
    const tsr_plugin_ctx *ctx;
    int n_layers, n_kv_heads, head_dim;
    int int8;             /* 0: f16, 1: int8 */
    size_t esz;           /* bytes per stored element */
    tsr_kv_seqs seqs;
} cpu_kv;

static uint64_t bytes_per_token(const cpu_kv *kv) {
    uint64_t per = (uint64_t)kv->n_layers * (uint64_t)kv->n_kv_heads *
                   ((uint64_t)kv->head_dim * kv->esz + (kv->int8 ? sizeof(float) : 0));
    return 2 * per;
}

static int kv_init(void *inst, const tsr_plugin_ctx *ctx) {
    cpu_kv *kv = inst;
    kv->ctx = ctx;
    const tsr_model_desc *md = ctx->model;
    if (!md || md->n_layers <= 0 || md->n_kv_heads <= 0 || md->head_dim <= 0) {
        ctx->host->set_error(ctx, "model has no layers or heads");
        return TSR_ERR_INVALID;
    }
    kv->n_layers = md->n_layers;
    kv->n_kv_heads = md->n_kv_heads;
    kv->head_dim = md->head_dim;
    const tsr_param *dt = ctx->host->param(ctx, "dtype");
    const char *s = dt && dt->type == TSR_PARAM_STRING && dt->v.s ? dt->v.s : "f16";
    if (!strcmp(s, "f16")) {
        kv->int8 = 0;
        kv->esz = 2;
    } else if (!strcmp(s, "int8")) {
        kv->int8 = 1;
        kv->esz = 1;
    } else {
        ctx->host->set_error(ctx, "param dtype = '%s': expected f16 or int8", s);
        return TSR_ERR_INVALID;
    }
    const tsr_param *cap = ctx->host->param(ctx, "capacity_tokens");
    int64_t capacity = cap && cap->type == TSR_PARAM_INT ? cap->v.i : 0;
    if (capacity < 0) {
        ctx->host->set_error(ctx, "param capacity_tokens = %lld must be >= 0", (long long)capacity);
        return TSR_ERR_INVALID;
    }
    tsr_kv_seqs_init(&kv->seqs, ctx, sizeof(kv_seq), kv->n_layers, capacity);
    uint64_t t;
    if (tsr_mul_u64((uint64_t)kv->n_kv_heads, (uint64_t)kv->head_dim, &t) ||
        tsr_mul_u64(t, (uint64_t)kv->n_layers, &t) || t > ((uint64_t)1 << 40)) {
        ctx->host->set_error(ctx, "model KV shape too large: %d layers x %d heads x %d", kv->n_layers,
                             kv->n_kv_heads, kv->head_dim);
        return TSR_ERR_INVALID;
    }
    return TSR_OK;
}

static void seq_release(cpu_kv *kv, kv_seq *s) {
    const tsr_host_api *h = kv->ctx->host;
    h->free(kv->ctx, s->k);
    h->free(kv->ctx, s->v);
    h->free(kv->ctx, s->ks);
    h->free(kv->ctx, s->vs);
    tsr_kv_seqs_release(&kv->seqs, &s->hdr);
}

static void kv_fini(void *inst) {
    cpu_kv *kv = inst;
    if (!kv->ctx) return;
    for (int i = 0; i < kv->seqs.n; i++) seq_release(kv, (kv_seq *)tsr_kv_seqs_at(&kv->seqs, i));
    tsr_kv_seqs_free(&kv->seqs);
}

static int kv_seq_alloc(void *inst, int max_tokens, int *seq) {
    cpu_kv *kv = inst;
    const tsr_host_api *h = kv->ctx->host;
    uint64_t elems, bytes, sbytes;
    if (max_tokens > 0 &&
        (tsr_mul_u64((uint64_t)kv->n_layers * kv->n_kv_heads * kv->head_dim, (uint64_t)max_tokens, &elems) ||
         tsr_mul_u64(elems, kv->esz, &bytes) ||
         tsr_mul_u64((uint64_t)kv->n_layers * kv->n_kv_heads * sizeof(float), (uint64_t)max_tokens, &sbytes) ||
         bytes > SIZE_MAX / 2)) {
        h->set_error(kv->ctx, "KV for %d tokens overflows the address space", max_tokens);
        return TSR_ERR_RANGE;
    }
    tsr_kv_seq_hdr *hdr;
    int rc = tsr_kv_seqs_reserve(&kv->seqs, max_tokens, seq, &hdr);
    if (rc != TSR_OK) {
        if (rc == TSR_ERR_NOMEM) h->set_error(kv->ctx, "out of memory for the sequence table");
        return rc;
    }
    kv_seq *s = (kv_seq *)hdr;
    /* host memory is zeroed: unwritten slots read as 0 (and scale 0) */
    s->k = h->alloc(kv->ctx, (size_t)bytes, 64);
    s->v = h->alloc(kv->ctx, (size_t)bytes, 64);
    if (kv->int8) {
        s->ks = h->alloc(kv->ctx, (size_t)sbytes, 64);
        s->vs = h->alloc(kv->ctx, (size_t)sbytes, 64);
    }
    if (!s->k || !s->v || (kv->int8 && (!s->ks || !s->vs))) {
        seq_release(kv, s);
        h->set_error(kv->ctx, "out of memory for %d tokens of KV", max_tokens);
        return TSR_ERR_NOMEM;
    }
    return TSR_OK;
}

static kv_seq *seq_get(cpu_kv *kv, int seq) { return (kv_seq *)tsr_kv_seqs_get(&kv->seqs, seq); }

static void kv_seq_free(void *inst, int seq) {
    cpu_kv *kv = inst;
    if (seq >= 0 && seq < kv->seqs.n) seq_release(kv, (kv_seq *)tsr_kv_seqs_at(&kv->seqs, seq));
}

/* Elements from one layer's block to the next, and from a head to the next. */
static size_t layer_elems(const cpu_kv *kv, const kv_seq *s) {
    return (size_t)kv->n_kv_heads * (size_t)s->hdr.max_tokens * (size_t)kv->head_dim;
}

static int kv_append(void *inst, int seq, int layer, int pos0, int rows, const float *k,
                     const float *v, const tsr_exec *ex) {
    cpu_kv *kv = inst;
    (void)ex;
    kv_seq *s = seq_get(kv, seq);
    if (!s) return TSR_ERR_INVALID;
    int rc = tsr_kv_seqs_check_append(&kv->seqs, &s->hdr, layer, pos0, rows);
    if (rc != TSR_OK) return rc;
    if (rows > 0 && (!k || !v)) {
        kv->ctx->host->set_error(kv->ctx, "append of %d rows without k or v", rows);
        return TSR_ERR_INVALID;
    }
    const int nh = kv->n_kv_heads, hd = kv->head_dim;
    const size_t lbase = (size_t)layer * layer_elems(kv, s);
    for (int r = 0; r < rows; r++) {
        for (int h = 0; h < nh; h++) {
            size_t src = ((size_t)r * nh + h) * hd;
            size_t dst = lbase + ((size_t)h * s->hdr.max_tokens + (size_t)(pos0 + r)) * hd;
            if (kv->int8) {
                size_t si = ((size_t)layer * s->hdr.max_tokens + (size_t)(pos0 + r)) * nh + h;
                tsr_attn_quant_i8((int8_t *)s->k + dst, &s->ks[si], k + src, hd);
                tsr_attn_quant_i8((int8_t *)s->v + dst, &s->vs[si], v + src, hd);
            } else {
                tsr_attn_store_f16((uint16_t *)s->k + dst, k + src, hd);
                tsr_attn_store_f16((uint16_t *)s->v + dst, v + src, hd);
            }
        }
    }
    s->hdr.lens[layer] += rows;
    return TSR_OK;
}

static int kv_view(void *inst, int seq, int layer, tsr_kv_view *out) {
    cpu_kv *kv = inst;
    kv_seq *s = seq_get(kv, seq);
    if (!s) return TSR_ERR_INVALID;
    int rc = tsr_kv_seqs_check_layer(&kv->seqs, layer);
    if (rc != TSR_OK) return rc;
    memset(out, 0, sizeof *out);
    size_t lbytes = layer_elems(kv, s) * kv->esz * (size_t)layer;
    out->dtype = kv->int8 ? TSR_DTYPE_I8 : TSR_DTYPE_F16;
    out->layout = TSR_KV_CONTIGUOUS;
    out->n_tokens = s->hdr.lens[layer];
    out->n_kv_heads = kv->n_kv_heads;
    out->head_dim = kv->head_dim;
    out->k = (const char *)s->k + lbytes;
    out->v = (const char *)s->v + lbytes;
    out->token_stride = kv->head_dim;
    out->head_stride = (int64_t)s->hdr.max_tokens * kv->head_dim;
    if (kv->int8) {
        size_t so = (size_t)layer * s->hdr.max_tokens * kv->n_kv_heads;
        out->k_scale = s->ks + so;
        out->v_scale = s->vs + so;
    }
    return TSR_OK;
}

static int kv_truncate(void *inst, int seq, int n_tokens) {
    cpu_kv *kv = inst;
    kv_seq *s = seq_get(kv, seq);
    return s ? tsr_kv_seqs_truncate(&kv->seqs, &s->hdr, n_tokens) : TSR_ERR_INVALID;
}

static void kv_usage(void *inst, uint64_t *used, uint64_t *capacity) {
    cpu_kv *kv = inst;
    uint64_t per = bytes_per_token(kv);
    *used = tsr_kv_seqs_tokens(&kv->seqs) * per;
    *capacity = (uint64_t)kv->seqs.reserved_tokens * per;
}

static const tsr_kv_cache_i cpu_kv_iface = {
    .struct_size = sizeof(tsr_kv_cache_i),
    .version = TSR_KV_CACHE_IFACE_VERSION,
    .seq_alloc = kv_seq_alloc,
    .seq_free = kv_seq_free,
    .append = kv_append,
    .view = kv_view,
    .truncate = kv_truncate,
    .usage = kv_usage,
};

static const tsr_plugin_desc cpu_kv_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "cpu_kv_cache",
    .slot = TSR_SLOT_KV_CACHE,
    .version = "1.0.0",
    .instance_size = sizeof(cpu_kv),
    .caps = TSR_CAP_DEVICE_CPU,
    .init = kv_init,
    .fini = kv_fini,
    .iface = &cpu_kv_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &cpu_kv_desc; }
