// cuda_kv_paged - a paged KV cache in GPU memory: one pool of fixed-size
// blocks shared by every sequence, bf16 or FP8 E4M3 with a per-token,
// per-head scale.
//
// Memory (allocated once at init, never moved):
//   K, V pools    [n_layers][n_blocks][block_size][n_kv_heads][head_dim]
//   K, V scales   [n_layers][n_blocks * block_size][n_kv_heads] f32 (fp8 only)
// One block id covers block_size tokens of every layer, so a sequence has
// ONE block table shared by its layers: ids[i] holds tokens
// [i * block_size, (i + 1) * block_size). A layer's view is its slice of the
// pool (k = K + layer * n_blocks * block_size * te, block_stride =
// block_size * te elements) with that table.
//
// Each sequence's table lives twice: a pinned host mirror (the bookkeeping of
// kv_blocks.c writes it) and an int32 array on the device that kernels read,
// allocated at seq_alloc for the sequence's most blocks and never moved.
// Entries reach the device in stream order:
// - eager appends copy the entries they added (cudaMemcpyAsync on ex->stream);
// - in a pass captured into a CUDA graph (ex->step set) the append of layer 0
//   captures a copy of the whole table from the pinned mirror, so every
//   replay first brings the table up to date from the mirror as replayed()
//   left it (replayed() takes the blocks the pass will write), then stores.
// The mirror's entries below a sequence's length change only after they were
// given back (truncate, seq_free), which first waits for the stream: no
// queued copy can then still read an entry that is rewritten.
//
// Graph-capable: the store kernel reads the position from ex->step while
// captured; the pool, scale and table pointers never move.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <string.h>

#include "plugins/common/kv_seqs.h"
#include "plugins/cuda_kv_paged/kv_blocks.h"
#include "slots/tsr_kv_cache.h"

namespace {

constexpr float kFp8Max = 448.0f; // largest finite E4M3

struct Seq {
    tsr_kv_seq_hdr hdr;   // used, max_tokens, lens (host)
    tsr_kv_table table;   // ids: pinned host mirror
    int32_t *table_dev;   // [table.cap] on the device
    int on_dev;           // entries [0, on_dev) copied by eager appends
};

struct Kv {
    const tsr_plugin_ctx *ctx;
    int n_layers, n_kv_heads, head_dim;
    int fp8;              // 1: F8_E4M3 with scales, 0: BF16
    int n_blocks, block_size;
    void *k, *v;          // pools (device)
    float *k_scale, *v_scale; // fp8 only (device)
    int32_t *free_ids;    // host, [n_blocks]
    tsr_kv_blocks blocks;
    tsr_kv_seqs seqs;
    cudaStream_t stream;  // of the last append: what truncate / seq_free wait for
    int have_stream;
};

int64_t token_elems(const Kv *kv) { return (int64_t)kv->n_kv_heads * kv->head_dim; }
size_t elem_size(const Kv *kv) { return kv->fp8 ? 1 : 2; }
// elements of one layer's slice of a pool
int64_t layer_elems(const Kv *kv) { return (int64_t)kv->n_blocks * kv->block_size * token_elems(kv); }
// scales of one layer
int64_t layer_scales(const Kv *kv) { return (int64_t)kv->n_blocks * kv->block_size * kv->n_kv_heads; }

// bytes of one block over every layer, K and V (and their scales)
uint64_t block_bytes(const Kv *kv) {
    uint64_t b = (uint64_t)kv->n_layers * kv->block_size * token_elems(kv) * elem_size(kv) * 2;
    if (kv->fp8) b += (uint64_t)kv->n_layers * kv->block_size * kv->n_kv_heads * sizeof(float) * 2;
    return b;
}

int cuda_fail(Kv *kv, const char *what, cudaError_t e) {
    kv->ctx->host->set_error(kv->ctx, "%s: %s", what, cudaGetErrorString(e));
    return TSR_ERR_DEVICE;
}

// The larger of a and b, NaN if either is (fmaxf would drop a NaN).
__device__ __forceinline__ float amax(float a, float b) { return b > a || b != b ? b : a; }

// grid (rows, n_kv_heads), one warp: token pos0 + row (pos0 read on the
// device when dev_pos0 is given), head h: found through the table, rounded
// to bf16, or quantised to E4M3 with scale amax / 448 (amax over the head's
// dims; an all-zero head stores zeros with scale 0; NaN or Inf in a head
// makes the whole head read back as NaN, never as a finite value).
template <bool FP8>
__global__ void store_kernel(void *K, void *V, float *ks, float *vs, const float *k, const float *v,
                             const int32_t *table, int bs, int n_kv, int hd, int pos0, const int32_t *dev_pos0) {
    if (dev_pos0) pos0 = *dev_pos0;
    const int row = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const int pos = pos0 + row;
    const int64_t slot = (int64_t)table[pos / bs] * bs + pos % bs;
    const int64_t dst = (slot * n_kv + h) * hd, src = ((int64_t)row * n_kv + h) * hd;
    if constexpr (!FP8) {
        __nv_bfloat16 *Kb = static_cast<__nv_bfloat16 *>(K), *Vb = static_cast<__nv_bfloat16 *>(V);
        for (int d = lane; d < hd; d += 32) {
            Kb[dst + d] = __float2bfloat16_rn(k[src + d]);
            Vb[dst + d] = __float2bfloat16_rn(v[src + d]);
        }
    } else {
        float ka = 0.0f, va = 0.0f;
        for (int d = lane; d < hd; d += 32) {
            ka = amax(ka, fabsf(k[src + d]));
            va = amax(va, fabsf(v[src + d]));
        }
        for (int o = 16; o > 0; o >>= 1) {
            ka = amax(ka, __shfl_xor_sync(0xffffffffu, ka, o));
            va = amax(va, __shfl_xor_sync(0xffffffffu, va, o));
        }
        const float kinv = ka > 0.0f ? kFp8Max / ka : 0.0f, vinv = va > 0.0f ? kFp8Max / va : 0.0f;
        __nv_fp8_e4m3 *Kq = static_cast<__nv_fp8_e4m3 *>(K), *Vq = static_cast<__nv_fp8_e4m3 *>(V);
        for (int d = lane; d < hd; d += 32) { // saturating: x * inv rounds to at most 448
            Kq[dst + d] = __nv_fp8_e4m3(k[src + d] * kinv);
            Vq[dst + d] = __nv_fp8_e4m3(v[src + d] * vinv);
        }
        if (lane == 0) {
            ks[slot * n_kv + h] = ka / kFp8Max;
            vs[slot * n_kv + h] = va / kFp8Max;
        }
    }
}

int kv_init(void *inst, const tsr_plugin_ctx *ctx) {
    Kv *kv = static_cast<Kv *>(inst);
    kv->ctx = ctx;
    const tsr_host_api *h = ctx->host;
    kv->n_layers = ctx->model->n_layers;
    kv->n_kv_heads = ctx->model->n_kv_heads;
    kv->head_dim = ctx->model->head_dim;
    const tsr_param *p = h->param(ctx, "block_size");
    kv->block_size = p ? (int)p->v.i : 16;
    p = h->param(ctx, "dtype");
    kv->fp8 = p && p->v.s && !strcmp(p->v.s, "f8_e4m3");
    if (p && p->v.s && !kv->fp8 && strcmp(p->v.s, "bf16")) {
        h->set_error(ctx, "dtype %s: bf16 or f8_e4m3", p->v.s);
        return TSR_ERR_UNSUPPORTED;
    }
    p = h->param(ctx, "capacity_tokens");
    int64_t cap = p ? p->v.i : 0;
    if (cap <= 0) cap = ctx->model->max_ctx;
    if (kv->block_size <= 0 || cap <= 0 || kv->n_layers <= 0 || kv->n_kv_heads <= 0 || kv->head_dim <= 0) {
        h->set_error(ctx, "block_size %d, capacity %lld tokens, %d layers, %d kv heads of %d: all must be positive",
                     kv->block_size, (long long)cap, kv->n_layers, kv->n_kv_heads, kv->head_dim);
        return TSR_ERR_INVALID;
    }
    const int64_t n_blocks = (cap + kv->block_size - 1) / kv->block_size;
    if (n_blocks > INT32_MAX / kv->block_size) {
        h->set_error(ctx, "capacity %lld tokens: too many", (long long)cap);
        return TSR_ERR_RANGE;
    }
    kv->n_blocks = (int)n_blocks;
    tsr_kv_seqs_init(&kv->seqs, ctx, sizeof(Seq), kv->n_layers, 0); // the pool is the budget (checked at append)
    kv->free_ids = static_cast<int32_t *>(h->alloc(ctx, (size_t)n_blocks * sizeof(int32_t), 16));
    if (!kv->free_ids) return TSR_ERR_NOMEM;
    tsr_kv_blocks_init(&kv->blocks, kv->n_blocks, kv->block_size, kv->free_ids);
    const size_t pool = (size_t)kv->n_layers * layer_elems(kv) * elem_size(kv);
    int rc = h->dev_alloc(ctx, pool, &kv->k);
    if (rc == TSR_OK) rc = h->dev_alloc(ctx, pool, &kv->v);
    if (rc == TSR_OK && kv->fp8) {
        const size_t sb = (size_t)kv->n_layers * layer_scales(kv) * sizeof(float);
        rc = h->dev_alloc(ctx, sb, reinterpret_cast<void **>(&kv->k_scale));
        if (rc == TSR_OK) rc = h->dev_alloc(ctx, sb, reinterpret_cast<void **>(&kv->v_scale));
    }
    return rc; // fini frees what was allocated
}

Seq *at(Kv *kv, int i) { return reinterpret_cast<Seq *>(tsr_kv_seqs_at(&kv->seqs, i)); }
Seq *get(Kv *kv, int seq) { return reinterpret_cast<Seq *>(tsr_kv_seqs_get(&kv->seqs, seq)); }

// Wait until the stream has done what was queued (before blocks or table
// entries are given back and may be rewritten). Never called while capturing.
int wait_stream(Kv *kv) {
    if (!kv->have_stream) return TSR_OK;
    const cudaError_t e = cudaStreamSynchronize(kv->stream);
    return e == cudaSuccess ? TSR_OK : cuda_fail(kv, "waiting for the stream before giving blocks back", e);
}

// wait: for the stream first (seq_free; fini frees the whole pool anyway).
void release(Kv *kv, Seq *s, bool wait) {
    if (!s->hdr.used) return;
    if (s->table.held) {
        if (wait) wait_stream(kv); // an error is left in set_error: seq_free cannot return it
        tsr_kv_blocks_shrink(&kv->blocks, &s->table, 0);
    }
    if (s->table.ids) cudaFreeHost(s->table.ids);
    if (s->table_dev) kv->ctx->host->dev_free(kv->ctx, s->table_dev);
    tsr_kv_seqs_release(&kv->seqs, &s->hdr);
}

void kv_fini(void *inst) {
    Kv *kv = static_cast<Kv *>(inst);
    if (!kv->ctx) return;
    const tsr_host_api *h = kv->ctx->host;
    for (int i = 0; i < kv->seqs.n; i++) release(kv, at(kv, i), false);
    tsr_kv_seqs_free(&kv->seqs);
    if (kv->k) h->dev_free(kv->ctx, kv->k);
    if (kv->v) h->dev_free(kv->ctx, kv->v);
    if (kv->k_scale) h->dev_free(kv->ctx, kv->k_scale);
    if (kv->v_scale) h->dev_free(kv->ctx, kv->v_scale);
    h->free(kv->ctx, kv->free_ids);
}

int kv_seq_alloc(void *inst, int max_tokens, int *seq) {
    Kv *kv = static_cast<Kv *>(inst);
    if (max_tokens > 0 && tsr_kv_blocks_for(&kv->blocks, max_tokens) > kv->n_blocks) {
        kv->ctx->host->set_error(kv->ctx, "a sequence of %d tokens cannot fit a pool of %d tokens", max_tokens,
                                 kv->n_blocks * kv->block_size);
        return TSR_ERR_RANGE;
    }
    tsr_kv_seq_hdr *hdr;
    int rc = tsr_kv_seqs_reserve(&kv->seqs, max_tokens, seq, &hdr);
    if (rc != TSR_OK) return rc;
    Seq *s = reinterpret_cast<Seq *>(hdr);
    s->table.cap = tsr_kv_blocks_for(&kv->blocks, max_tokens);
    const size_t bytes = (size_t)s->table.cap * sizeof(int32_t);
    cudaError_t e = cudaMallocHost(reinterpret_cast<void **>(&s->table.ids), bytes);
    if (e != cudaSuccess) {
        s->table.ids = nullptr;
        rc = cuda_fail(kv, "pinned block table", e);
    }
    if (rc == TSR_OK) rc = kv->ctx->host->dev_alloc(kv->ctx, bytes, reinterpret_cast<void **>(&s->table_dev));
    if (rc == TSR_OK) { // entries not yet written name block 0: any stray read stays inside the pool
        memset(s->table.ids, 0, bytes);
        if ((e = cudaMemset(s->table_dev, 0, bytes)) != cudaSuccess) rc = cuda_fail(kv, "block table", e);
    }
    if (rc != TSR_OK) release(kv, s, false);
    return rc;
}

void kv_seq_free(void *inst, int seq) {
    Kv *kv = static_cast<Kv *>(inst);
    if (seq >= 0 && seq < kv->seqs.n) release(kv, at(kv, seq), true);
}

// Blocks for n_tokens tokens of s (taken from the pool when missing).
int grow(Kv *kv, Seq *s, int64_t n_tokens) {
    const int rc = tsr_kv_blocks_grow(&kv->blocks, &s->table, n_tokens);
    if (rc == 0) return TSR_OK;
    if (rc == 1)
        kv->ctx->host->set_error(kv->ctx, "block pool exhausted: %lld tokens need %d blocks of %d, the sequence "
                                 "holds %d and %d of %d are free", (long long)n_tokens,
                                 tsr_kv_blocks_for(&kv->blocks, n_tokens), kv->block_size, s->table.held,
                                 kv->blocks.n_free, kv->n_blocks);
    else
        kv->ctx->host->set_error(kv->ctx, "%lld tokens past the sequence's %d", (long long)n_tokens,
                                 s->hdr.max_tokens);
    return TSR_ERR_RANGE;
}

int kv_append(void *inst, int seq, int layer, int pos0, int rows, const float *k, const float *v,
              const tsr_exec *ex) {
    Kv *kv = static_cast<Kv *>(inst);
    Seq *s = get(kv, seq);
    if (!s) return TSR_ERR_INVALID;
    int rc = tsr_kv_seqs_check_append(&kv->seqs, &s->hdr, layer, pos0, rows);
    if (rc != TSR_OK) return rc;
    if ((rc = grow(kv, s, (int64_t)pos0 + rows)) != TSR_OK) return rc;
    cudaStream_t st = static_cast<cudaStream_t>(ex->stream);
    kv->stream = st;
    kv->have_stream = 1;
    cudaError_t e = cudaSuccess;
    if (ex->step) {
        // captured: every replay copies the whole table from the pinned mirror first
        if (layer == 0)
            e = cudaMemcpyAsync(s->table_dev, s->table.ids, (size_t)s->table.cap * sizeof(int32_t),
                                cudaMemcpyHostToDevice, st);
    } else if (s->on_dev < s->table.held) {
        e = cudaMemcpyAsync(s->table_dev + s->on_dev, s->table.ids + s->on_dev,
                            (size_t)(s->table.held - s->on_dev) * sizeof(int32_t), cudaMemcpyHostToDevice, st);
        if (e == cudaSuccess) s->on_dev = s->table.held;
    }
    if (e != cudaSuccess) return cuda_fail(kv, "copying the block table", e);
    if (rows > 0) {
        const int64_t le = (int64_t)layer * layer_elems(kv) * elem_size(kv);
        void *K = static_cast<char *>(kv->k) + le, *V = static_cast<char *>(kv->v) + le;
        const int32_t *dev_pos0 = ex->step ? &ex->step->pos0 : nullptr;
        const dim3 grid(rows, kv->n_kv_heads);
        if (kv->fp8) {
            const int64_t ls = (int64_t)layer * layer_scales(kv);
            store_kernel<true><<<grid, 32, 0, st>>>(K, V, kv->k_scale + ls, kv->v_scale + ls, k, v, s->table_dev,
                                                    kv->block_size, kv->n_kv_heads, kv->head_dim, pos0, dev_pos0);
        } else {
            store_kernel<false><<<grid, 32, 0, st>>>(K, V, nullptr, nullptr, k, v, s->table_dev, kv->block_size,
                                                     kv->n_kv_heads, kv->head_dim, pos0, dev_pos0);
        }
        if ((e = cudaGetLastError()) != cudaSuccess) return cuda_fail(kv, "append", e);
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
    const int64_t le = (int64_t)layer * layer_elems(kv) * elem_size(kv);
    out->dtype = kv->fp8 ? TSR_DTYPE_F8_E4M3 : TSR_DTYPE_BF16;
    out->layout = TSR_KV_PAGED;
    out->n_tokens = s->hdr.lens[layer];
    out->n_kv_heads = kv->n_kv_heads;
    out->head_dim = kv->head_dim;
    out->k = static_cast<const char *>(kv->k) + le;
    out->v = static_cast<const char *>(kv->v) + le;
    out->token_stride = token_elems(kv);
    out->head_stride = kv->head_dim;
    if (kv->fp8) {
        out->k_scale = kv->k_scale + (int64_t)layer * layer_scales(kv);
        out->v_scale = kv->v_scale + (int64_t)layer * layer_scales(kv);
    }
    out->block_size = kv->block_size;
    out->block_table = s->table_dev;
    out->block_stride = (int64_t)kv->block_size * token_elems(kv);
    return TSR_OK;
}

int longest(const Kv *kv, const Seq *s) {
    int n = 0;
    for (int l = 0; l < kv->n_layers; l++)
        if (s->hdr.lens[l] > n) n = s->hdr.lens[l];
    return n;
}

int kv_truncate(void *inst, int seq, int n_tokens) {
    Kv *kv = static_cast<Kv *>(inst);
    Seq *s = get(kv, seq);
    if (!s) return TSR_ERR_INVALID;
    int rc = tsr_kv_seqs_truncate(&kv->seqs, &s->hdr, n_tokens);
    if (rc != TSR_OK) return rc;
    const int keep = longest(kv, s);
    if (tsr_kv_blocks_for(&kv->blocks, keep) < s->table.held) {
        if ((rc = wait_stream(kv)) != TSR_OK) return rc;
        tsr_kv_blocks_shrink(&kv->blocks, &s->table, keep);
        if (s->on_dev > s->table.held) s->on_dev = s->table.held;
    }
    return TSR_OK;
}

int kv_replayed(void *inst, int seq, int n_layers, int pos0, int rows) {
    Kv *kv = static_cast<Kv *>(inst);
    Seq *s = get(kv, seq);
    if (!s) return TSR_ERR_INVALID;
    int rc = tsr_kv_seqs_check_replay(&kv->seqs, &s->hdr, n_layers, pos0, rows);
    if (rc != TSR_OK) return rc;
    // the blocks the pass writes; the graph copies the mirror to the device first
    if ((rc = grow(kv, s, (int64_t)pos0 + rows)) != TSR_OK) return rc;
    tsr_kv_seqs_advance(&s->hdr, n_layers, rows);
    return TSR_OK;
}

// used: the blocks taken; capacity: the whole pool (reserved at init)
void kv_usage(void *inst, uint64_t *used, uint64_t *capacity) {
    Kv *kv = static_cast<Kv *>(inst);
    *used = (uint64_t)tsr_kv_blocks_used(&kv->blocks) * block_bytes(kv);
    *capacity = (uint64_t)kv->n_blocks * block_bytes(kv);
}

const tsr_kv_cache_i iface = {
    sizeof(tsr_kv_cache_i), TSR_KV_CACHE_IFACE_VERSION, kv_seq_alloc, kv_seq_free, kv_append,
    kv_view, kv_truncate, kv_usage, kv_replayed,
};

const tsr_plugin_desc desc = {
    TSR_ABI_MAJOR, TSR_ABI_MINOR, "cuda_kv_paged", TSR_SLOT_KV_CACHE, "1.0.0", sizeof(Kv),
    TSR_CAP_DEVICE_CUDA, kv_init, kv_fini, &iface,
};

} // namespace

extern "C" TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &desc; }
