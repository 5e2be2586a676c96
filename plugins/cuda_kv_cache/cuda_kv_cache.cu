// cuda_kv_cache - the CUDA baseline KV cache: bf16, one contiguous block per
// sequence in device memory ([n_layers][max_tokens][n_kv_heads][head_dim]
// for K and for V), reserved at seq_alloc. Append rounds the f32 keys and
// values to bf16 on the device; truncate lowers lengths (rollback).
// Graph-capable: while the host captures a pass (ex->step), the store kernel
// reads the position on the device; replayed() advances the lengths.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <string.h>

#include "kernels/cuda/cuda_ops.h"
#include "plugins/common/kv_seqs.h"
#include "slots/tsr_kv_cache.h"

namespace {

struct Seq {
    tsr_kv_seq_hdr hdr;   // used, max_tokens, lens (host)
    __nv_bfloat16 *k, *v; // device
};

struct Kv {
    const tsr_plugin_ctx *ctx;
    int n_layers, n_kv_heads, head_dim;
    tsr_kv_seqs seqs;
};

int64_t token_elems(const Kv *kv) { return (int64_t)kv->n_kv_heads * kv->head_dim; }

int kv_init(void *inst, const tsr_plugin_ctx *ctx) {
    Kv *kv = static_cast<Kv *>(inst);
    kv->ctx = ctx;
    kv->n_layers = ctx->model->n_layers;
    kv->n_kv_heads = ctx->model->n_kv_heads;
    kv->head_dim = ctx->model->head_dim;
    const tsr_param *cap = ctx->host->param(ctx, "capacity_tokens");
    tsr_kv_seqs_init(&kv->seqs, ctx, sizeof(Seq), kv->n_layers, cap ? cap->v.i : 0);
    return TSR_OK;
}

void release(Kv *kv, Seq *s) {
    if (!s->hdr.used) return;
    if (s->k) kv->ctx->host->dev_free(kv->ctx, s->k);
    if (s->v) kv->ctx->host->dev_free(kv->ctx, s->v);
    tsr_kv_seqs_release(&kv->seqs, &s->hdr);
}

Seq *at(Kv *kv, int i) { return reinterpret_cast<Seq *>(tsr_kv_seqs_at(&kv->seqs, i)); }

void kv_fini(void *inst) {
    Kv *kv = static_cast<Kv *>(inst);
    if (!kv->ctx) return;
    for (int i = 0; i < kv->seqs.n; i++) release(kv, at(kv, i));
    tsr_kv_seqs_free(&kv->seqs);
}

int kv_seq_alloc(void *inst, int max_tokens, int *seq) {
    Kv *kv = static_cast<Kv *>(inst);
    tsr_kv_seq_hdr *hdr;
    int rc = tsr_kv_seqs_reserve(&kv->seqs, max_tokens, seq, &hdr);
    if (rc != TSR_OK) return rc;
    Seq *s = reinterpret_cast<Seq *>(hdr);
    const size_t bytes = (size_t)kv->n_layers * max_tokens * token_elems(kv) * 2;
    rc = kv->ctx->host->dev_alloc(kv->ctx, bytes, reinterpret_cast<void **>(&s->k));
    if (rc == TSR_OK) rc = kv->ctx->host->dev_alloc(kv->ctx, bytes, reinterpret_cast<void **>(&s->v));
    if (rc != TSR_OK) release(kv, s);
    return rc;
}

Seq *get(Kv *kv, int seq) { return reinterpret_cast<Seq *>(tsr_kv_seqs_get(&kv->seqs, seq)); }

void kv_seq_free(void *inst, int seq) {
    Kv *kv = static_cast<Kv *>(inst);
    if (seq >= 0 && seq < kv->seqs.n) release(kv, at(kv, seq));
}

int kv_append(void *inst, int seq, int layer, int pos0, int rows, const float *k, const float *v,
              const tsr_exec *ex) {
    Kv *kv = static_cast<Kv *>(inst);
    Seq *s = get(kv, seq);
    if (!s) return TSR_ERR_INVALID;
    int rc = tsr_kv_seqs_check_append(&kv->seqs, &s->hdr, layer, pos0, rows);
    if (rc != TSR_OK) return rc;
    const int64_t te = token_elems(kv), off = (int64_t)layer * s->hdr.max_tokens * te;
    if (tsr_cu_kv_store_bf16(reinterpret_cast<uint16_t *>(s->k + off), reinterpret_cast<uint16_t *>(s->v + off),
                             k, v, rows, te, pos0, ex->step ? &ex->step->pos0 : nullptr, ex->pdl, ex->stream) != 0) {
        kv->ctx->host->set_error(kv->ctx, "append: %s", cudaGetErrorString(cudaGetLastError()));
        return TSR_ERR_DEVICE;
    }
    s->hdr.lens[layer] += rows;
    return TSR_OK;
}

int kv_view(void *inst, int seq, int layer, tsr_kv_view *out) {
    Kv *kv = static_cast<Kv *>(inst);
    Seq *s = get(kv, seq);
    if (!s) return TSR_ERR_INVALID;
    int rc = tsr_kv_seqs_check_layer(&kv->seqs, layer);
    if (rc != TSR_OK) return rc;
    memset(out, 0, sizeof *out);
    const int64_t te = token_elems(kv);
    out->dtype = TSR_DTYPE_BF16;
    out->layout = TSR_KV_CONTIGUOUS;
    out->n_tokens = s->hdr.lens[layer];
    out->n_kv_heads = kv->n_kv_heads;
    out->head_dim = kv->head_dim;
    out->k = s->k + (int64_t)layer * s->hdr.max_tokens * te;
    out->v = s->v + (int64_t)layer * s->hdr.max_tokens * te;
    out->token_stride = te;
    out->head_stride = kv->head_dim;
    return TSR_OK;
}

int kv_truncate(void *inst, int seq, int n_tokens) {
    Kv *kv = static_cast<Kv *>(inst);
    Seq *s = get(kv, seq);
    return s ? tsr_kv_seqs_truncate(&kv->seqs, &s->hdr, n_tokens) : TSR_ERR_INVALID;
}

int kv_replayed(void *inst, int seq, int n_layers, int pos0, int rows) {
    Kv *kv = static_cast<Kv *>(inst);
    Seq *s = get(kv, seq);
    if (!s) return TSR_ERR_INVALID;
    int rc = tsr_kv_seqs_check_replay(&kv->seqs, &s->hdr, n_layers, pos0, rows);
    if (rc != TSR_OK) return rc;
    tsr_kv_seqs_advance(&s->hdr, n_layers, rows);
    return TSR_OK;
}

void kv_usage(void *inst, uint64_t *used, uint64_t *capacity) {
    Kv *kv = static_cast<Kv *>(inst);
    const uint64_t per = (uint64_t)kv->n_layers * token_elems(kv) * 2 * 2;
    *used = tsr_kv_seqs_tokens(&kv->seqs) * per;
    *capacity = (uint64_t)kv->seqs.reserved_tokens * per;
}

const tsr_kv_cache_i iface = {
    sizeof(tsr_kv_cache_i), TSR_KV_CACHE_IFACE_VERSION, kv_seq_alloc, kv_seq_free, kv_append,
    kv_view, kv_truncate, kv_usage, kv_replayed,
};

const tsr_plugin_desc desc = {
    TSR_ABI_MAJOR, TSR_ABI_MINOR, "cuda_kv_cache", TSR_SLOT_KV_CACHE, "1.0.0", sizeof(Kv),
    TSR_CAP_DEVICE_CUDA, kv_init, kv_fini, &iface,
};

} // namespace

extern "C" TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &desc; }
