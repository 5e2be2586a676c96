// cuda_kv_cache - the CUDA baseline KV cache: bf16, one contiguous block per
// sequence in device memory ([n_layers][max_tokens][n_kv_heads][head_dim]
// for K and for V), reserved at seq_alloc. Append rounds the f32 keys and
// values to bf16 on the device; truncate lowers lengths (rollback).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <string.h>

#include "kernels/cuda/cuda_ops.h"
#include "slots/tsr_kv_cache.h"

namespace {

struct Seq {
    int used, max_tokens;
    int *lens;          // host [n_layers]
    __nv_bfloat16 *k, *v;
};

struct Kv {
    const tsr_plugin_ctx *ctx;
    int n_layers, n_kv_heads, head_dim;
    int64_t capacity_tokens, reserved_tokens;
    Seq *seqs;
    int n_seqs;
};

int64_t token_elems(const Kv *kv) { return (int64_t)kv->n_kv_heads * kv->head_dim; }

int kv_init(void *inst, const tsr_plugin_ctx *ctx) {
    Kv *kv = static_cast<Kv *>(inst);
    kv->ctx = ctx;
    kv->n_layers = ctx->model->n_layers;
    kv->n_kv_heads = ctx->model->n_kv_heads;
    kv->head_dim = ctx->model->head_dim;
    const tsr_param *cap = ctx->host->param(ctx, "capacity_tokens");
    kv->capacity_tokens = cap ? cap->v.i : 0;
    return TSR_OK;
}

void release(Kv *kv, Seq *s) {
    const tsr_host_api *h = kv->ctx->host;
    if (s->k) h->dev_free(kv->ctx, s->k);
    if (s->v) h->dev_free(kv->ctx, s->v);
    h->free(kv->ctx, s->lens);
    kv->reserved_tokens -= s->max_tokens;
    memset(s, 0, sizeof *s);
}

void kv_fini(void *inst) {
    Kv *kv = static_cast<Kv *>(inst);
    if (!kv->ctx) return;
    for (int i = 0; i < kv->n_seqs; i++)
        if (kv->seqs[i].used) release(kv, &kv->seqs[i]);
    kv->ctx->host->free(kv->ctx, kv->seqs);
}

int kv_seq_alloc(void *inst, int max_tokens, int *seq) {
    Kv *kv = static_cast<Kv *>(inst);
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
    for (int i = 0; i < kv->n_seqs && id < 0; i++)
        if (!kv->seqs[i].used) id = i;
    if (id < 0) {
        int n = kv->n_seqs ? kv->n_seqs * 2 : 8;
        Seq *g = static_cast<Seq *>(h->alloc(kv->ctx, (size_t)n * sizeof(Seq), 16));
        if (!g) return TSR_ERR_NOMEM;
        if (kv->n_seqs) memcpy(g, kv->seqs, (size_t)kv->n_seqs * sizeof(Seq));
        h->free(kv->ctx, kv->seqs);
        kv->seqs = g;
        id = kv->n_seqs;
        kv->n_seqs = n;
    }
    Seq *s = &kv->seqs[id];
    const size_t bytes = (size_t)kv->n_layers * max_tokens * token_elems(kv) * 2;
    s->max_tokens = max_tokens;
    kv->reserved_tokens += max_tokens;
    s->lens = static_cast<int *>(h->alloc(kv->ctx, (size_t)kv->n_layers * sizeof(int), 16));
    int rc = s->lens ? TSR_OK : TSR_ERR_NOMEM;
    if (rc == TSR_OK) rc = h->dev_alloc(kv->ctx, bytes, reinterpret_cast<void **>(&s->k));
    if (rc == TSR_OK) rc = h->dev_alloc(kv->ctx, bytes, reinterpret_cast<void **>(&s->v));
    if (rc != TSR_OK) {
        release(kv, s);
        return rc;
    }
    s->used = 1;
    *seq = id;
    return TSR_OK;
}

Seq *get(Kv *kv, int seq) {
    if (seq < 0 || seq >= kv->n_seqs || !kv->seqs[seq].used) {
        kv->ctx->host->set_error(kv->ctx, "unknown sequence %d", seq);
        return nullptr;
    }
    return &kv->seqs[seq];
}

void kv_seq_free(void *inst, int seq) {
    Kv *kv = static_cast<Kv *>(inst);
    if (seq >= 0 && seq < kv->n_seqs && kv->seqs[seq].used) release(kv, &kv->seqs[seq]);
}

int kv_append(void *inst, int seq, int layer, int pos0, int rows, const float *k, const float *v,
              const tsr_exec *ex) {
    Kv *kv = static_cast<Kv *>(inst);
    Seq *s = get(kv, seq);
    if (!s) return TSR_ERR_INVALID;
    if (layer < 0 || layer >= kv->n_layers || pos0 != s->lens[layer] || rows < 0) {
        kv->ctx->host->set_error(kv->ctx, "append at layer %d position %d out of order", layer, pos0);
        return TSR_ERR_INVALID;
    }
    if (pos0 + rows > s->max_tokens) {
        kv->ctx->host->set_error(kv->ctx, "sequence full: %d + %d tokens > %d", pos0, rows, s->max_tokens);
        return TSR_ERR_RANGE;
    }
    const int64_t te = token_elems(kv), off = ((int64_t)layer * s->max_tokens + pos0) * te;
    if (tsr_cu_f32_to_bf16(reinterpret_cast<uint16_t *>(s->k + off), k, rows * te, ex->stream) != 0 ||
        tsr_cu_f32_to_bf16(reinterpret_cast<uint16_t *>(s->v + off), v, rows * te, ex->stream) != 0) {
        kv->ctx->host->set_error(kv->ctx, "append: %s", cudaGetErrorString(cudaGetLastError()));
        return TSR_ERR_DEVICE;
    }
    s->lens[layer] += rows;
    return TSR_OK;
}

int kv_view(void *inst, int seq, int layer, tsr_kv_view *out) {
    Kv *kv = static_cast<Kv *>(inst);
    Seq *s = get(kv, seq);
    if (!s) return TSR_ERR_INVALID;
    if (layer < 0 || layer >= kv->n_layers) {
        kv->ctx->host->set_error(kv->ctx, "layer %d out of range", layer);
        return TSR_ERR_INVALID;
    }
    memset(out, 0, sizeof *out);
    const int64_t te = token_elems(kv);
    out->dtype = TSR_DTYPE_BF16;
    out->layout = TSR_KV_CONTIGUOUS;
    out->n_tokens = s->lens[layer];
    out->n_kv_heads = kv->n_kv_heads;
    out->head_dim = kv->head_dim;
    out->k = s->k + (int64_t)layer * s->max_tokens * te;
    out->v = s->v + (int64_t)layer * s->max_tokens * te;
    out->token_stride = te;
    out->head_stride = kv->head_dim;
    return TSR_OK;
}

int kv_truncate(void *inst, int seq, int n_tokens) {
    Kv *kv = static_cast<Kv *>(inst);
    Seq *s = get(kv, seq);
    if (!s) return TSR_ERR_INVALID;
    int longest = 0;
    for (int l = 0; l < kv->n_layers; l++)
        if (s->lens[l] > longest) longest = s->lens[l];
    if (n_tokens < 0 || n_tokens > longest) {
        kv->ctx->host->set_error(kv->ctx, "truncate to %d tokens: the sequence holds %d", n_tokens, longest);
        return TSR_ERR_INVALID;
    }
    for (int l = 0; l < kv->n_layers; l++)
        if (s->lens[l] > n_tokens) s->lens[l] = n_tokens;
    return TSR_OK;
}

void kv_usage(void *inst, uint64_t *used, uint64_t *capacity) {
    Kv *kv = static_cast<Kv *>(inst);
    const uint64_t per = (uint64_t)kv->n_layers * token_elems(kv) * 2 * 2;
    uint64_t u = 0;
    for (int i = 0; i < kv->n_seqs; i++)
        if (kv->seqs[i].used) u += (uint64_t)kv->seqs[i].lens[0] * per;
    *used = u;
    *capacity = (uint64_t)kv->reserved_tokens * per;
}

const tsr_kv_cache_i iface = {
    sizeof(tsr_kv_cache_i), TSR_KV_CACHE_IFACE_VERSION, kv_seq_alloc, kv_seq_free, kv_append,
    kv_view, kv_truncate, kv_usage,
};

const tsr_plugin_desc desc = {
    TSR_ABI_MAJOR, TSR_ABI_MINOR, "cuda_kv_cache", TSR_SLOT_KV_CACHE, "1.0.0", sizeof(Kv),
    TSR_CAP_DEVICE_CUDA, kv_init, kv_fini, &iface,
};

} // namespace

extern "C" TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &desc; }
