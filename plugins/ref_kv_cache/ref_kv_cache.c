/*
 * ref_kv_cache - the reference KV cache: f32, contiguous per sequence.
 *
 * Each sequence owns one block of [n_layers][max_tokens][n_kv_heads][head_dim]
 * floats for K and one for V, allocated at seq_alloc. Appends copy rows in,
 * truncate just lowers the length (rollback), views point into the block.
 */
#include <string.h>

#include "slots/tsr_kv_cache.h"

typedef struct kv_seq {
    int used;        /* slot taken */
    int max_tokens;
    int *lens;       /* [n_layers] tokens stored per layer */
    float *k, *v;    /* [n_layers, max_tokens, n_kv_heads, head_dim] */
} kv_seq;

typedef struct ref_kv {
    const tsr_plugin_ctx *ctx;
    int n_layers, n_kv_heads, head_dim;
    int64_t capacity_tokens; /* 0: unbounded */
    int64_t reserved_tokens;
    int n_seqs;
    kv_seq *seqs;
} ref_kv;

static int64_t token_floats(const ref_kv *kv) { return (int64_t)kv->n_kv_heads * kv->head_dim; }

static int kv_init(void *inst, const tsr_plugin_ctx *ctx) {
    ref_kv *kv = inst;
    kv->ctx = ctx;
    kv->n_layers = ctx->model->n_layers;
    kv->n_kv_heads = ctx->model->n_kv_heads;
    kv->head_dim = ctx->model->head_dim;
    const tsr_param *cap = ctx->host->param(ctx, "capacity_tokens");
    kv->capacity_tokens = cap ? cap->v.i : 0;
    if (kv->n_layers <= 0 || kv->n_kv_heads <= 0 || kv->head_dim <= 0) {
        ctx->host->set_error(ctx, "model has no layers or heads");
        return TSR_ERR_INVALID;
    }
    return TSR_OK;
}

static void seq_release(ref_kv *kv, kv_seq *s) {
    kv->ctx->host->free(kv->ctx, s->k);
    kv->ctx->host->free(kv->ctx, s->v);
    kv->ctx->host->free(kv->ctx, s->lens);
    kv->reserved_tokens -= s->max_tokens;
    memset(s, 0, sizeof *s);
}

static void kv_fini(void *inst) {
    ref_kv *kv = inst;
    for (int i = 0; i < kv->n_seqs; i++)
        if (kv->seqs[i].used) seq_release(kv, &kv->seqs[i]);
    if (kv->ctx) kv->ctx->host->free(kv->ctx, kv->seqs);
}

static int kv_seq_alloc(void *inst, int max_tokens, int *seq) {
    ref_kv *kv = inst;
    const tsr_host_api *h = kv->ctx->host;
    if (max_tokens <= 0) {
        h->set_error(kv->ctx, "max_tokens %d must be positive", max_tokens);
        return TSR_ERR_INVALID;
    }
    if (kv->capacity_tokens > 0 && kv->reserved_tokens + max_tokens > kv->capacity_tokens) {
        h->set_error(kv->ctx, "%d tokens do not fit: %lld of %lld reserved", max_tokens,
                     (long long)kv->reserved_tokens, (long long)kv->capacity_tokens);
        return TSR_ERR_RANGE;
    }
    int id = -1;
    for (int i = 0; i < kv->n_seqs; i++)
        if (!kv->seqs[i].used) {
            id = i;
            break;
        }
    if (id < 0) {
        int n = kv->n_seqs ? kv->n_seqs * 2 : 8;
        kv_seq *grown = h->alloc(kv->ctx, (size_t)n * sizeof *grown, 16);
        if (!grown) return TSR_ERR_NOMEM;
        if (kv->n_seqs) memcpy(grown, kv->seqs, (size_t)kv->n_seqs * sizeof *grown);
        h->free(kv->ctx, kv->seqs);
        kv->seqs = grown;
        id = kv->n_seqs;
        kv->n_seqs = n;
    }
    kv_seq *s = &kv->seqs[id];
    size_t floats = (size_t)kv->n_layers * (size_t)max_tokens * (size_t)token_floats(kv);
    s->k = h->alloc(kv->ctx, floats * sizeof(float), 64);
    s->v = h->alloc(kv->ctx, floats * sizeof(float), 64);
    s->lens = h->alloc(kv->ctx, (size_t)kv->n_layers * sizeof(int), 16);
    s->max_tokens = max_tokens;
    kv->reserved_tokens += max_tokens;
    if (!s->k || !s->v || !s->lens) {
        seq_release(kv, s);
        h->set_error(kv->ctx, "out of memory for %d tokens of KV", max_tokens);
        return TSR_ERR_NOMEM;
    }
    s->used = 1;
    *seq = id;
    return TSR_OK;
}

static kv_seq *seq_get(ref_kv *kv, int seq) {
    if (seq < 0 || seq >= kv->n_seqs || !kv->seqs[seq].used) {
        kv->ctx->host->set_error(kv->ctx, "unknown sequence %d", seq);
        return NULL;
    }
    return &kv->seqs[seq];
}

static void kv_seq_free(void *inst, int seq) {
    ref_kv *kv = inst;
    if (seq >= 0 && seq < kv->n_seqs && kv->seqs[seq].used) seq_release(kv, &kv->seqs[seq]);
}

static int kv_append(void *inst, int seq, int layer, int pos0, int rows, const float *k,
                     const float *v, const tsr_exec *ex) {
    ref_kv *kv = inst;
    (void)ex;
    kv_seq *s = seq_get(kv, seq);
    if (!s) return TSR_ERR_INVALID;
    if (layer < 0 || layer >= kv->n_layers || rows < 0 || pos0 != s->lens[layer]) {
        kv->ctx->host->set_error(kv->ctx, "append at layer %d position %d: layer holds %d tokens",
                                 layer, pos0, layer >= 0 && layer < kv->n_layers ? s->lens[layer] : -1);
        return TSR_ERR_INVALID;
    }
    if (pos0 + rows > s->max_tokens) {
        kv->ctx->host->set_error(kv->ctx, "sequence full: %d + %d tokens > %d", pos0, rows,
                                 s->max_tokens);
        return TSR_ERR_RANGE;
    }
    int64_t tf = token_floats(kv);
    size_t off = ((size_t)layer * s->max_tokens + pos0) * tf;
    memcpy(s->k + off, k, (size_t)rows * tf * sizeof(float));
    memcpy(s->v + off, v, (size_t)rows * tf * sizeof(float));
    s->lens[layer] += rows;
    return TSR_OK;
}

static int kv_view(void *inst, int seq, int layer, tsr_kv_view *out) {
    ref_kv *kv = inst;
    kv_seq *s = seq_get(kv, seq);
    if (!s) return TSR_ERR_INVALID;
    if (layer < 0 || layer >= kv->n_layers) {
        kv->ctx->host->set_error(kv->ctx, "layer %d out of range", layer);
        return TSR_ERR_INVALID;
    }
    memset(out, 0, sizeof *out);
    int64_t tf = token_floats(kv);
    out->dtype = TSR_DTYPE_F32;
    out->layout = TSR_KV_CONTIGUOUS;
    out->n_tokens = s->lens[layer];
    out->n_kv_heads = kv->n_kv_heads;
    out->head_dim = kv->head_dim;
    out->k = s->k + (size_t)layer * s->max_tokens * tf;
    out->v = s->v + (size_t)layer * s->max_tokens * tf;
    out->token_stride = tf;
    out->head_stride = kv->head_dim;
    return TSR_OK;
}

static int kv_truncate(void *inst, int seq, int n_tokens) {
    ref_kv *kv = inst;
    kv_seq *s = seq_get(kv, seq);
    if (!s) return TSR_ERR_INVALID;
    int longest = 0;
    for (int l = 0; l < kv->n_layers; l++)
        if (s->lens[l] > longest) longest = s->lens[l];
    if (n_tokens < 0 || n_tokens > longest) {
        kv->ctx->host->set_error(kv->ctx, "truncate to %d tokens: the sequence holds %d", n_tokens,
                                 longest);
        return TSR_ERR_INVALID;
    }
    for (int l = 0; l < kv->n_layers; l++)
        if (s->lens[l] > n_tokens) s->lens[l] = n_tokens;
    return TSR_OK;
}

static void kv_usage(void *inst, uint64_t *used, uint64_t *capacity) {
    ref_kv *kv = inst;
    uint64_t per_token = (uint64_t)kv->n_layers * (uint64_t)token_floats(kv) * 2 * sizeof(float);
    uint64_t u = 0;
    for (int i = 0; i < kv->n_seqs; i++)
        if (kv->seqs[i].used) u += (uint64_t)kv->seqs[i].lens[0] * per_token;
    *used = u;
    *capacity = (uint64_t)kv->reserved_tokens * per_token;
}

/* Exported through the manifest (libffi): bytes of K and V per token. */
TSR_PLUGIN_EXPORT int64_t ref_kv_cache_bytes_per_token(int32_t n_layers, int32_t n_kv_heads,
                                                       int32_t head_dim) {
    if (n_layers < 0 || n_kv_heads < 0 || head_dim < 0) return -1;
    return (int64_t)n_layers * n_kv_heads * head_dim * 2 * (int64_t)sizeof(float);
}

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
    .name = "ref_kv_cache",
    .slot = TSR_SLOT_KV_CACHE,
    .version = "1.0.0",
    .instance_size = sizeof(ref_kv),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = kv_init,
    .fini = kv_fini,
    .iface = &ref_kv_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &ref_kv_desc; }
