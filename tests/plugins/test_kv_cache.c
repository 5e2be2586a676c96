/* test_kv_cache: contiguous f32 KV, one fixed-size sequence table. */
#include <string.h>

#include "slots/tsr_kv_cache.h"

#define MAX_SEQ 8

typedef struct seq {
    int used, max_tokens;
    int *len;     /* [n_layers] */
    float *k, *v; /* [n_layers, max_tokens, n_kv_heads, head_dim] */
} seq;

typedef struct inst {
    const tsr_plugin_ctx *ctx;
    int n_layers, n_kv_heads, head_dim;
    seq seqs[MAX_SEQ];
    uint64_t used_bytes;
} inst;

static int kv_init(void *p, const tsr_plugin_ctx *ctx) {
    inst *c = p;
    c->ctx = ctx;
    const tsr_param *dt = ctx->host->param(ctx, "dtype");
    if (!dt || strcmp(dt->v.s, "f32")) {
        ctx->host->set_error(ctx, "dtype %s is declared but only f32 is stored", dt ? dt->v.s : "?");
        return TSR_ERR_UNSUPPORTED;
    }
    if (ctx->model) {
        c->n_layers = ctx->model->n_layers;
        c->n_kv_heads = ctx->model->n_kv_heads;
        c->head_dim = ctx->model->head_dim;
    }
    return TSR_OK;
}

static void seq_release(inst *c, seq *s) {
    c->ctx->host->free(c->ctx, s->len);
    c->ctx->host->free(c->ctx, s->k);
    c->ctx->host->free(c->ctx, s->v);
    memset(s, 0, sizeof *s);
}

static void kv_fini(void *p) {
    inst *c = p;
    for (int i = 0; i < MAX_SEQ; i++)
        if (c->seqs[i].used) seq_release(c, &c->seqs[i]);
}

static size_t per_layer(const inst *c, int max_tokens) {
    return (size_t)max_tokens * (size_t)c->n_kv_heads * (size_t)c->head_dim;
}

static int kv_seq_alloc(void *p, int max_tokens, int *out) {
    inst *c = p;
    if (!c->n_layers || max_tokens <= 0 || max_tokens > (1 << 20)) {
        c->ctx->host->set_error(c->ctx, "no model, or max_tokens %d out of range", max_tokens);
        return TSR_ERR_INVALID;
    }
    for (int i = 0; i < MAX_SEQ; i++) {
        seq *s = &c->seqs[i];
        if (s->used) continue;
        size_t n = per_layer(c, max_tokens) * (size_t)c->n_layers;
        s->len = c->ctx->host->alloc(c->ctx, sizeof(int) * (size_t)c->n_layers, 16);
        s->k = c->ctx->host->alloc(c->ctx, n * sizeof(float), 64);
        s->v = c->ctx->host->alloc(c->ctx, n * sizeof(float), 64);
        if (!s->len || !s->k || !s->v) {
            seq_release(c, s);
            return TSR_ERR_NOMEM;
        }
        s->used = 1;
        s->max_tokens = max_tokens;
        *out = i;
        return TSR_OK;
    }
    return TSR_ERR_RANGE;
}

static void kv_seq_free(void *p, int id) {
    inst *c = p;
    if (id >= 0 && id < MAX_SEQ && c->seqs[id].used) seq_release(c, &c->seqs[id]);
}

static seq *get(inst *c, int id, int layer) {
    if (id < 0 || id >= MAX_SEQ || !c->seqs[id].used || layer < 0 || layer >= c->n_layers) return NULL;
    return &c->seqs[id];
}

static int kv_append(void *p, int id, int layer, int pos0, int rows, const float *k, const float *v,
                     const tsr_exec *ex) {
    (void)ex;
    inst *c = p;
    seq *s = get(c, id, layer);
    if (!s || pos0 != s->len[layer] || rows < 0 || pos0 + rows > s->max_tokens) return TSR_ERR_RANGE;
    size_t tok = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    float *kb = s->k + per_layer(c, s->max_tokens) * (size_t)layer + tok * (size_t)pos0;
    float *vb = s->v + per_layer(c, s->max_tokens) * (size_t)layer + tok * (size_t)pos0;
    memcpy(kb, k, tok * (size_t)rows * sizeof(float));
    memcpy(vb, v, tok * (size_t)rows * sizeof(float));
    s->len[layer] += rows;
    return TSR_OK;
}

static int kv_view(void *p, int id, int layer, tsr_kv_view *out) {
    inst *c = p;
    seq *s = get(c, id, layer);
    if (!s) return TSR_ERR_INVALID;
    memset(out, 0, sizeof *out);
    out->dtype = TSR_DTYPE_F32;
    out->layout = TSR_KV_CONTIGUOUS;
    out->n_tokens = s->len[layer];
    out->n_kv_heads = c->n_kv_heads;
    out->head_dim = c->head_dim;
    out->k = s->k + per_layer(c, s->max_tokens) * (size_t)layer;
    out->v = s->v + per_layer(c, s->max_tokens) * (size_t)layer;
    out->token_stride = (int64_t)c->n_kv_heads * c->head_dim;
    out->head_stride = c->head_dim;
    return TSR_OK;
}

static int kv_truncate(void *p, int id, int n_tokens) {
    inst *c = p;
    seq *s = get(c, id, 0);
    if (!s) return TSR_ERR_INVALID;
    for (int l = 0; l < c->n_layers; l++)
        if (n_tokens < 0 || n_tokens > s->len[l]) return TSR_ERR_RANGE;
    for (int l = 0; l < c->n_layers; l++) s->len[l] = n_tokens;
    return TSR_OK;
}

static const tsr_kv_cache_i iface = {
    .struct_size = sizeof(tsr_kv_cache_i),
    .version = TSR_KV_CACHE_IFACE_VERSION,
    .seq_alloc = kv_seq_alloc,
    .seq_free = kv_seq_free,
    .append = kv_append,
    .view = kv_view,
    .truncate = kv_truncate,
};

static const tsr_plugin_desc desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "test_kv_cache",
    .slot = TSR_SLOT_KV_CACHE,
    .version = "0.1.0",
    .instance_size = sizeof(inst),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = kv_init,
    .fini = kv_fini,
    .iface = &iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *tsr_plugin_entry(void) { return &desc; }
