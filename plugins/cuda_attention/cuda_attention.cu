// cuda_attention - attention on an NVIDIA GPU over bf16 contiguous KV
// (cuda_attention_ref), or bf16 / FP8 E4M3, contiguous / paged KV
// (cuda_attention).
//
// Built twice from this file:
// - cuda_attention_ref (the CUDA baseline): one thread block per (row, head);
//   scores in shared or global memory, a max-subtracted softmax, then the
//   weighted sum of values: plain and obviously right;
// - cuda_attention (CUDA_ATTN_SPLIT): split-K flash-decoding: the keys of
//   each (row, KV head) are cut into chunks processed by separate blocks with
//   an online softmax for every query head of the group (K/V read once per
//   group); the last block of each (row, KV head) to finish merges the
//   chunks' partial results (one launch). The kernel is
//   a template on the layout (contiguous or paged: a key's row found through
//   the block table) and the element type (bf16, or E4M3 times the token's
//   per-head scale); bf16 contiguous compiles to the same code as before.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>

#include <type_traits>

#include "slots/tsr_attention.h"
#ifdef CUDA_ATTN_SPLIT
#include <cooperative_groups.h>

#include "plugins/cuda_attention/merge.cuh"
#include "plugins/cuda_attention/packed.cuh"
#include "plugins/cuda_attention/prefill.h"
#endif

#ifdef CUDA_ATTN_SPLIT
#define PLUGIN_NAME "cuda_attention"
// Sums in another order than the baseline's (key splits, the prefill
// kernel's tiles): logits agree to ~1e-6, which can flip a near-tied greedy
// choice (measured: ablation/reports/2026-11-29-h200-cuda-fast-graphs), so lossy
// with a tight bound.
#define PLUGIN_CAPS TSR_CAP_DEVICE_CUDA
#else
#define PLUGIN_NAME "cuda_attention_ref"
#define PLUGIN_CAPS (TSR_CAP_DEVICE_CUDA | TSR_CAP_EXACT)
#endif

namespace {

#ifdef CUDA_ATTN_SPLIT
namespace cg = cooperative_groups;
#endif

constexpr int kMaxHeadDim = 256;

struct Attn {
    const tsr_plugin_ctx *ctx;
    float *scratch;       // scores (ref) or partial results (split)
    size_t scratch_floats;
    int chunk;            // fewest keys per split (split-K, eager passes)
    int graph_splits;     // splits of a captured pass
    int tile_rows;        // passes of at least this many rows: the tensor-core kernel (prefill.cu)
    int fused_merge;      // the last block of a split merges (1) or merge_kernel does (0)
    int tile_splits;      // key splits of the tensor-core kernel for passes of <= TSR_GRAPH_MAX_ROWS rows
    int cluster;          // split-K decode through cluster_kernel (1) or split_kernel (0)
    int cluster_splits;   // cluster_kernel: most blocks (key splits) per (row, KV head), <= kCMaxSplits
    int cluster_rows;     // passes of up to this many rows through cluster_kernel even where prefill.cu reads
    int packed_rows;      // passes of packed_rows..cluster_rows rows through packed_kernel where it reads (0: never)
    int packed_splits;    // packed_kernel: key splits (blocks of a cluster) per KV head, <= kPMaxSplits
    int graph_heads;      // query heads the captured-pass scratch was sized for
    int sms;              // multiprocessors of the device
    float *graph_scratch; // partial results of a captured pass (TSR_GRAPH_MAX_ROWS rows)
    unsigned *counts;     // finished splits per (row, KV head), zero between passes (eager)
    size_t n_counts;
    unsigned *graph_counts; // the same for captured passes (TSR_GRAPH_MAX_ROWS rows)
};

// Grows geometrically so that decoding (one more key per step) does not
// reallocate (and synchronise) at every step.
int ensure(Attn *a, size_t floats) {
    if (floats <= a->scratch_floats) return TSR_OK;
    if (floats < 2 * a->scratch_floats) floats = 2 * a->scratch_floats;
    if (a->scratch) a->ctx->host->dev_free(a->ctx, a->scratch);
    a->scratch = nullptr;
    a->scratch_floats = 0;
    int rc = a->ctx->host->dev_alloc(a->ctx, floats * sizeof(float), reinterpret_cast<void **>(&a->scratch));
    if (rc == TSR_OK) a->scratch_floats = floats;
    return rc;
}

#ifdef CUDA_ATTN_SPLIT
// Zeroed counters for n (row, KV head) pairs; each pass leaves them zero.
int counters(Attn *a, unsigned **c, size_t n) {
    int rc = a->ctx->host->dev_alloc(a->ctx, n * sizeof(unsigned), reinterpret_cast<void **>(c));
    if (rc != TSR_OK) return rc;
    if (cudaMemset(*c, 0, n * sizeof(unsigned)) != cudaSuccess) {
        cudaGetLastError();
        a->ctx->host->dev_free(a->ctx, *c);
        *c = nullptr;
        a->ctx->host->set_error(a->ctx, "clearing split counters failed");
        return TSR_ERR_DEVICE;
    }
    return TSR_OK;
}

// Partial results and merge counters for a pass of rows rows cut into
// n_splits: a captured pass uses those reserved at init (sized for
// TSR_GRAPH_MAX_ROWS rows and graph_splits), an eager one its own, grown as
// needed (geometrically: decoding must not reallocate at every step).
int split_scratch(Attn *a, bool captured, const tsr_attn_args *x, int n_splits, float **part, unsigned **count) {
    if (captured) {
        *part = a->graph_scratch, *count = a->graph_counts;
        return TSR_OK;
    }
    int rc = ensure(a, (size_t)x->rows * x->n_heads * n_splits * (2 + x->head_dim));
    if (rc != TSR_OK) return rc;
    const size_t pairs = (size_t)x->rows * x->n_kv_heads; // (row or row block, KV head)
    if (pairs > a->n_counts) {
        const size_t n = pairs < 2 * a->n_counts ? 2 * a->n_counts : pairs;
        if (a->counts) a->ctx->host->dev_free(a->ctx, a->counts);
        a->counts = nullptr, a->n_counts = 0;
        if ((rc = counters(a, &a->counts, n))) return rc;
        a->n_counts = n;
    }
    *part = a->scratch, *count = a->counts;
    return TSR_OK;
}
#endif

__device__ float block_reduce(float v, bool is_max, float *sh) {
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nw ? sh[lane] : (is_max ? -INFINITY : 0.0f);
        for (int o = 16; o > 0; o >>= 1) {
            float w = __shfl_xor_sync(0xffffffffu, v, o);
            v = is_max ? fmaxf(v, w) : v + w;
        }
        if (lane == 0) sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}

// Baseline: grid (rows * n_heads); scores for keys [first, last] in s.
__global__ void ref_kernel(const float *q, const __nv_bfloat16 *K, const __nv_bfloat16 *V,
                           float *out, float *scores, int n_heads, int group, int hd, int64_t ts,
                           int64_t hs, int pos0, int window, float scale, int max_keys) {
    __shared__ float sh[33];
    const int row = blockIdx.x / n_heads, h = blockIdx.x % n_heads, kvh = h / group;
    const int last = pos0 + row;
    const int first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
    const float *qr = q + ((int64_t)row * n_heads + h) * hd;
    float *s = scores + (int64_t)blockIdx.x * max_keys;
    float mx = -INFINITY;
    for (int t = first + threadIdx.x; t <= last; t += blockDim.x) {
        const __nv_bfloat16 *k = K + t * ts + kvh * hs;
        float acc = 0.0f;
        for (int d = 0; d < hd; d++) acc = fmaf(qr[d], __bfloat162float(k[d]), acc);
        acc *= scale;
        s[t - first] = acc;
        mx = fmaxf(mx, acc);
    }
    mx = block_reduce(mx, true, sh);
    float sum = 0.0f;
    for (int t = first + threadIdx.x; t <= last; t += blockDim.x) {
        const float e = __expf(s[t - first] - mx);
        s[t - first] = e;
        sum += e;
    }
    sum = block_reduce(sum, false, sh);
    float *o = out + (int64_t)row * n_heads * hd + (int64_t)h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = first; t <= last; t++) acc = fmaf(s[t - first], __bfloat162float(V[t * ts + kvh * hs + d]), acc);
        o[d] = acc / sum;
    }
}

// Baseline for a captured pass: the KV length is only known on the device,
// so no scratch is sized for it; the scores are computed twice instead (for
// the maximum, then 128 keys at a time into shared memory for the sum and
// the weighted values). grid (rows * n_heads), 128 threads. The same
// arithmetic as ref_kernel, value for value, so that runtime.cuda_graphs
// leaves the baseline's results as they are: each score is rounded before
// the maximum is subtracted from it (__fmul_rn: written as dot * scale - mx,
// nvcc contracts it into one fma, and stories260K's logits differed).
constexpr int kRefThreads = 128;

__global__ void ref_step_kernel(const float *q, const __nv_bfloat16 *K, const __nv_bfloat16 *V, float *out,
                                int n_heads, int group, int hd, int64_t ts, int64_t hs, const int32_t *dev_pos0,
                                int window, float scale) {
    __shared__ float sh[33];
    __shared__ float p[kRefThreads];
    const int row = blockIdx.x / n_heads, h = blockIdx.x % n_heads, kvh = h / group;
    const int last = *dev_pos0 + row;
    const int first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
    const float *qr = q + ((int64_t)row * n_heads + h) * hd;
    float mx = -INFINITY;
    for (int t = first + threadIdx.x; t <= last; t += blockDim.x) {
        const __nv_bfloat16 *k = K + t * ts + kvh * hs;
        float dot = 0.0f;
        for (int d = 0; d < hd; d++) dot = fmaf(qr[d], __bfloat162float(k[d]), dot);
        mx = fmaxf(mx, dot * scale);
    }
    mx = block_reduce(mx, true, sh);
    float sum = 0.0f, acc[kMaxHeadDim / kRefThreads] = {};
    for (int t0 = first; t0 <= last; t0 += blockDim.x) {
        const int t = t0 + threadIdx.x;
        float e = 0.0f;
        if (t <= last) {
            const __nv_bfloat16 *k = K + t * ts + kvh * hs;
            float dot = 0.0f;
            for (int d = 0; d < hd; d++) dot = fmaf(qr[d], __bfloat162float(k[d]), dot);
            e = __expf(__fmul_rn(dot, scale) - mx);
        }
        p[threadIdx.x] = e;
        sum += e;
        __syncthreads();
        const int n = min((int)blockDim.x, last - t0 + 1);
        for (int i = 0, d = threadIdx.x; d < hd; i++, d += blockDim.x)
            for (int j = 0; j < n; j++) acc[i] = fmaf(p[j], __bfloat162float(V[(t0 + j) * ts + kvh * hs + d]), acc[i]);
        __syncthreads();
    }
    sum = block_reduce(sum, false, sh);
    float *o = out + (int64_t)row * n_heads * hd + (int64_t)h * hd;
    for (int i = 0, d = threadIdx.x; d < hd; i++, d += blockDim.x) o[d] = acc[i] / sum;
}

#ifdef CUDA_ATTN_SPLIT
// Most query heads per KV head the split kernel takes (a warp each): its
// launch bounds (256 threads) let it hold a batch of 16 keys' K and V in
// registers; larger groups go to the baseline kernels (bf16 contiguous KV).
constexpr int kMaxGroup = 8;

// DPL elements of a K or V row as stored (bf16 or E4M3 bits), packed into
// 32-bit words (registers are what limits the split kernel's occupancy).
template <typename T, int DPL> struct Raw {
    static constexpr int ES = sizeof(T), PER = 4 / ES, N = DPL * ES, W = (N + 3) / 4;
    uint32_t w[W];
    // element i's bits (i known at compile time: constant shifts)
    __device__ __forceinline__ uint32_t bits(int i) const {
        return (w[i / PER] >> (8 * ES * (i % PER))) & (ES == 2 ? 0xffffu : 0xffu);
    }
};

// The lane's DPL elements of a K or V row from p (its dims d0..): one vector
// load where the dims are whole and aligned (vec), else one by one (dims
// past hd read the row's first element; widen zeroes them). Only loads, no
// use: a batch's loads all go out before any result is waited for (widening
// each right after its load, behind the vec branch, made the warp wait on
// memory once per key: tools/cuda_lab/attn_lab.cu).
template <int DPL, typename T>
__device__ __forceinline__ void load_raw(const T *p, int d0, int hd, bool vec, Raw<T, DPL> &r) {
    using R = Raw<T, DPL>;
    if constexpr (R::N == 4 || R::N == 8 || R::N == 16) {
        if (vec && d0 + DPL <= hd) {
            if constexpr (R::N == 4) r.w[0] = *reinterpret_cast<const uint32_t *>(p);
            if constexpr (R::N == 8) *reinterpret_cast<uint2 *>(r.w) = *reinterpret_cast<const uint2 *>(p);
            if constexpr (R::N == 16) *reinterpret_cast<uint4 *>(r.w) = *reinterpret_cast<const uint4 *>(p);
            return;
        }
    }
    const uint8_t *b = reinterpret_cast<const uint8_t *>(p);
#pragma unroll
    for (int k = 0; k < R::W; k++) r.w[k] = 0;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        const int at = (d0 + i < hd ? i : -d0) * R::ES;
        const uint32_t e = R::ES == 2 ? *reinterpret_cast<const uint16_t *>(b + at) : b[at];
        r.w[i / R::PER] |= e << (8 * R::ES * (i % R::PER));
    }
}

// load_raw's vector case (dims whole and aligned, as cluster_kernel's are) through L2 only (ld.global.cg):
// for a key loaded again after the programmatic-dependent wait, which must
// not be served a line that L1 holds from before it.
template <int DPL, typename T> __device__ __forceinline__ void load_raw_cg(const T *p, Raw<T, DPL> &r) {
    using R = Raw<T, DPL>;
    static_assert(R::N == 2 || R::N == 4 || R::N == 8 || R::N == 16, "whole 2, 4, 8 or 16 bytes");
    if constexpr (R::N == 2) r.w[0] = __ldcg(reinterpret_cast<const unsigned short *>(p));
    if constexpr (R::N == 4) r.w[0] = __ldcg(reinterpret_cast<const unsigned *>(p));
    if constexpr (R::N == 8) *reinterpret_cast<uint2 *>(r.w) = __ldcg(reinterpret_cast<const uint2 *>(p));
    if constexpr (R::N == 16) *reinterpret_cast<uint4 *>(r.w) = __ldcg(reinterpret_cast<const uint4 *>(p));
}

// Element i widened to f32 (E4M3 unscaled), zero past hd.
template <typename T, int DPL>
__device__ __forceinline__ float widen(const Raw<T, DPL> &r, int i, int d0, int hd) {
    float f;
    if constexpr (sizeof(T) == 2) f = __uint_as_float(r.bits(i) << 16);
    else f = __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)r.bits(i), __NV_E4M3)));
    return d0 + i < hd ? f : 0.0f;
}

// What a paged or quantised view adds to (K, V, token stride, head stride).
struct Paging {
    const int32_t *table; // PAGED: block ids
    int bs;               // PAGED: tokens per block
    int64_t bstride;      // PAGED: elements between blocks
    const float *ks, *vs; // FP8: scale of (slot, KV head) at [slot * n_kv + h]
};

template <bool FP8> struct Elem { using T = __nv_bfloat16; };
template <> struct Elem<true> { using T = __nv_fp8_e4m3; };

// Where key t's row starts (elements, before the head offset) and its slot
// (the scales' index): t * ts and t when contiguous; through the table when
// paged (block b = table[t / bs]: b * bstride + (t % bs) * ts, b * bs + t % bs).
template <bool PAGED>
__device__ __forceinline__ void key_at(int t, int64_t ts, const Paging &pg, int64_t *off, int64_t *slot) {
    if constexpr (PAGED) {
        const int64_t b = pg.table[t / pg.bs], i = t % pg.bs;
        *off = b * pg.bstride + i * ts;
        *slot = b * pg.bs + i;
    } else {
        *off = (int64_t)t * ts;
        *slot = t;
    }
}

// Split-K: grid (rows * n_kv_heads, n_splits); block = one warp per query
// head of the group (group <= 8 warps), each lane holding head_dim/32 dims.
// Writes per split: max m, sum l and unnormalised o[hd] per query head.
// With dev_pos0 (a captured pass) the position is read on the device; with
// even, each row's keys are cut into n_splits equal chunks (chunk ignored):
// decode and verification passes do that captured or not, so a replayed
// graph computes exactly what the same pass issued eagerly does.
// PAGED / FP8: keys found through pg's table / E4M3 scaled by pg's scales.
template <int DPL, bool PAGED, bool FP8> // DPL: dims per lane, ceil(hd / 32); lanes past hd hold nothing
__global__ void __launch_bounds__(kMaxGroup * 32, 1)
    split_kernel(const float *q, const typename Elem<FP8>::T *K, const typename Elem<FP8>::T *V,
                             float *part, int n_heads, int n_kv, int group, int hd, int64_t ts, int64_t hs,
                             bool vec, int pos0, const int32_t *dev_pos0, bool even, int window, float scale,
                             int chunk, int n_splits, Paging pg, unsigned *count, float *out) {
    tsr_pdl::enter(); // launched as a programmatic dependent: kernels/cuda/pdl.cuh
    const int row = blockIdx.x / n_kv, kvh = blockIdx.x % n_kv, split = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = kvh * group + warp;
    if (dev_pos0) pos0 = *dev_pos0;
    const int last = pos0 + row;
    const int first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
    if (even) chunk = (last - first + n_splits) / n_splits; // ceil((last - first + 1) / n_splits)
    const int t0 = first + split * chunk, t1 = min(last, t0 + chunk - 1);
    float qv[DPL], acc[DPL];
    const float *qr = q + ((int64_t)row * n_heads + h) * hd;
    const int d0 = lane * DPL; // this lane's first dim
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        qv[i] = d0 + i < hd ? qr[d0 + i] * scale : 0.0f;
        acc[i] = 0.0f;
    }
    // KB keys at a time: the keys' and the values' loads are all issued
    // before any is used. (Loading and using each key in turn, inside its
    // bounds check, left the warp waiting on memory for every key: ~0.9 us a
    // key. tools/cuda_lab/attn_lab.cu measured batches of 4, 8 and 16 keys
    // at 128 and 255 registers: 16 at 255 was the fastest.)
    constexpr int KB = 16;
    float m = -INFINITY, l = 0.0f;
    for (int tb = t0; tb <= t1; tb += KB) {
        // paged: each key's row and slot looked up once; keys past t1 read
        // key t1 again (never past the table or the cache) and weigh nothing
        int64_t off[KB], slot[KB];
#pragma unroll
        for (int j = 0; j < KB; j++) {
            const int t = tb + j > t1 ? t1 : tb + j;
            if constexpr (PAGED || FP8) key_at<PAGED>(t, ts, pg, &off[j], &slot[j]);
            else off[j] = (int64_t)t * ts;
        }
        Raw<typename Elem<FP8>::T, DPL> kr[KB], vr[KB];
        float ksc[KB], vsc[KB]; // FP8: each key's scales (K's folded into its score, V's into its weight)
#pragma unroll
        for (int j = 0; j < KB; j++) {
            load_raw<DPL>(K + off[j] + kvh * hs + d0, d0, hd, vec, kr[j]);
            load_raw<DPL>(V + off[j] + kvh * hs + d0, d0, hd, vec, vr[j]);
            if constexpr (FP8) ksc[j] = pg.ks[slot[j] * n_kv + kvh], vsc[j] = pg.vs[slot[j] * n_kv + kvh];
        }
        float sc[KB];
#pragma unroll
        for (int j = 0; j < KB; j++) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; i++) s = fmaf(qv[i], widen(kr[j], i, d0, hd), s);
            sc[j] = s;
        }
#pragma unroll
        for (int j = 0; j < KB; j++)
            for (int o = 16; o > 0; o >>= 1) sc[j] += __shfl_xor_sync(0xffffffffu, sc[j], o);
        if constexpr (FP8) {
#pragma unroll
            for (int j = 0; j < KB; j++) sc[j] *= ksc[j];
        }
        float mn = m;
#pragma unroll
        for (int j = 0; j < KB; j++)
            if (tb + j <= t1) mn = fmaxf(mn, sc[j]);
        const float corr = __expf(m - mn);
        l *= corr;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] *= corr;
#pragma unroll
        for (int j = 0; j < KB; j++) {
            const float p = tb + j <= t1 ? __expf(sc[j] - mn) : 0.0f;
            l += p;
            float pv = p;
            if constexpr (FP8) pv = p * vsc[j];
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[i] = fmaf(pv, widen(vr[j], i, d0, hd), acc[i]);
        }
        m = mn;
    }
    // part layout: [rows * n_heads][n_splits][2 + hd]
    float *pp = part + (((int64_t)row * n_heads + h) * n_splits + split) * (2 + hd);
    if (lane == 0) {
        pp[0] = m;
        pp[1] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; i++)
        if (d0 + i < hd) pp[2 + d0 + i] = acc[i];
    // With count: the last of the n_splits blocks of this (row, KV head) to
    // finish merges them all (its counter back to zero for the next pass),
    // no second launch; without: merge_kernel follows.
    if (!count) return;
    if (!cuda_attn::last_of_splits(&count[blockIdx.x], n_splits)) return;
    cuda_attn::merge_head<DPL>(part + ((int64_t)row * n_heads + h) * n_splits * (2 + hd), n_splits, hd, lane,
                               out + ((int64_t)row * n_heads + h) * hd);
}

// Cluster split-K (the decode and verification default): grid (rows *
// n_kv_heads, n_splits), a thread-block cluster of the n_splits (<= 8)
// blocks of a (row, KV head), kCWarps warps each.
//
// Within a block each warp takes tiles of kCTile consecutive keys. Scores:
// a key per kCLanes lanes, each of them holding a quarter of the key's row
// (16-byte pieces) against the group's queries in shared memory, two
// shuffles to add the quarters, so a key costs ~HD / 8 multiply-adds per
// head per lane and no 32-lane reduction. Values: each lane its HD / 32
// dims of every key of the tile, the key's weight shuffled from its lanes.
// (split_kernel gives every key a 32-lane reduction per query head: ncu on
// the H200 counted ~290 instructions per key and warp, issue-bound at 8
// warps a multiprocessor.) An online softmax per head; the warps of a block
// merged through shared memory, then the splits through distributed shared
// memory: block r merges heads r, r + n_splits, ..., each block writes its
// result for a head into the merging block's shared memory, then arrives at
// a cluster barrier; blocks with nothing to merge leave, the others wait and
// merge from their own shared memory (no partial results in global memory,
// no counters, no fences; pushing instead of each merging block reading the
// others' results saves a round trip to remote shared memory and the second
// barrier that kept every block alive until the reads were done).
constexpr int kCWarps = 8, kCMaxSplits = 8, kCLanes = 4, kCTile = 32 / kCLanes;
constexpr int kCPush = 14; // the most of n * ceil(g / n) for n splits and g heads in 1..8 (n 7, g 8)

// Whether cluster_kernel takes a head size and KV layout: 16-byte pieces of
// each key row (strides and bases aligned), head_dim 64 or 128.
inline bool cluster_reads(const tsr_attn_args *x, const tsr_kv_view *kv) {
    const int64_t piece = kv->dtype == TSR_DTYPE_F8_E4M3 ? 16 : 8; // elements in 16 bytes
    return (x->head_dim == 64 || x->head_dim == 128) && kv->token_stride % piece == 0 &&
           kv->head_stride % piece == 0 && (kv->layout != TSR_KV_PAGED || kv->block_stride % piece == 0) &&
           ((reinterpret_cast<uintptr_t>(kv->k) | reinterpret_cast<uintptr_t>(kv->v)) & 15) == 0;
}

// Element i of a 16-byte piece widened to f32 (E4M3 unscaled).
template <bool FP8> __device__ __forceinline__ void widen_piece(const uint4 &w, float *f) {
    const uint32_t v[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if constexpr (!FP8) {
            f[2 * k] = __uint_as_float(v[k] << 16);
            f[2 * k + 1] = __uint_as_float(v[k] & 0xffff0000u);
        } else {
            const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v[k] & 0xffffu), __NV_E4M3);
            const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v[k] >> 16), __NV_E4M3);
            const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
            f[4 * k] = a.x, f[4 * k + 1] = a.y, f[4 * k + 2] = b.x, f[4 * k + 3] = b.y;
        }
    }
}

// GC: query heads per KV head, rounded up to 1, 2, 4, 8. MINB: blocks a
// multiprocessor must hold (register cap), launch_cluster's choice.
template <int HD, int GC, bool PAGED, bool FP8, int MINB>
__global__ void __launch_bounds__(kCWarps * 32, MINB)
    cluster_kernel(const float *q, const typename Elem<FP8>::T *K, const typename Elem<FP8>::T *V, int n_heads,
                   int n_kv, int group, int64_t ts, int64_t hs, int pos0, const int32_t *dev_pos0, int window,
                   float scale, int n_splits, Paging pg, float *out, int l2_kv) {
    constexpr int ES = FP8 ? 1 : 2, CD = 16 / ES; // bytes per element, elements per 16-byte piece
    constexpr int CPL = HD / CD / kCLanes;        // pieces of a key row per lane
    constexpr int DPL = HD / 32;                  // values: dims per lane
    static_assert(CPL >= 1 && HD % (CD * kCLanes) == 0, "head_dim 64 or 128");
    using T = typename Elem<FP8>::T;
    // The block's keys t0..t1, known before the wait (pos0 on the device is
    // written before the pass starts).
    cg::cluster_group cl = cg::this_cluster();
    const int row = blockIdx.x / n_kv, kvh = blockIdx.x % n_kv, split = (int)cl.block_rank();
    if (dev_pos0) pos0 = *dev_pos0;
    const int last = pos0 + row;
    const int first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
    const int chunk = (last - first + n_splits) / n_splits; // ceil((last - first + 1) / n_splits)
    const int t0 = first + split * chunk, t1 = min(last, t0 + chunk - 1);
    // l2_kv: those keys and values asked into L2 before the wait (they were
    // written by earlier passes, but for the newest, which L2 keeps
    // coherent); contiguous caches only (a block table is read after the
    // wait). One-row passes of the Llama-3-8B shape 4.281 -> 4.257 ms on the
    // H200; slower for 8 rows (4.740 -> 4.775), so the launcher asks for it
    // at one row only (BENCHMARKS.md).
    if (!PAGED && l2_kv) {
        constexpr int LINES = (HD * ES + 127) / 128;
        for (int i = threadIdx.x; i < (t1 - t0 + 1) * 2 * LINES; i += blockDim.x) {
            const int t = t0 + i / (2 * LINES), rem = i % (2 * LINES);
            const uint8_t *base = reinterpret_cast<const uint8_t *>((rem < LINES ? K : V) + (int64_t)t * ts + kvh * hs);
            asm volatile("prefetch.global.L2 [%0];" ::"l"(base + (rem % LINES) * 128));
        }
    }
    cl.barrier_arrive(); // matched by the wait before the first push into another block's shared memory
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kl = lane / kCLanes, part = lane % kCLanes; // the lane's key in a tile, its share of the row
    const int d0 = lane * DPL;                            // values: the lane's dims
    // A tile of kCTile keys: each lane's pieces of key tb + kl and its dims
    // of every key's values (keys past t1 read key t1 again, never past the
    // table or the cache, and weigh nothing). cg: through L2 only (__ldcg,
    // for a key loaded again after the wait) instead of __ldg.
    uint4 kc[CPL];
    Raw<T, DPL> vr[kCTile];
    float vsc[kCTile], ksc = 1.0f;
    auto load_key = [&](int tb, bool cg) {
        int64_t off, slot;
        key_at<PAGED>(min(tb + kl, t1), ts, pg, &off, &slot);
        const uint8_t *kp = reinterpret_cast<const uint8_t *>(K + off + kvh * hs);
#pragma unroll
        for (int c = 0; c < CPL; c++) {
            const uint4 *a = reinterpret_cast<const uint4 *>(kp + (part + kCLanes * c) * 16);
            kc[c] = cg ? __ldcg(a) : __ldg(a);
        }
        if constexpr (FP8) ksc = cg ? __ldcg(&pg.ks[slot * n_kv + kvh]) : pg.ks[slot * n_kv + kvh];
    };
    auto load_value = [&](int tb, int j, bool cg) {
        int64_t vo, vs;
        key_at<PAGED>(min(tb + j, t1), ts, pg, &vo, &vs);
        if (cg) load_raw_cg<DPL>(V + vo + kvh * hs + d0, vr[j]);
        else load_raw<DPL>(V + vo + kvh * hs + d0, d0, HD, true, vr[j]);
        if constexpr (FP8) vsc[j] = cg ? __ldcg(&pg.vs[vs * n_kv + kvh]) : pg.vs[vs * n_kv + kvh];
    };
    // after_wait: the pass's own keys (pos0 on) through L2, never L1, where
    // a block of another row of this KV head on the same multiprocessor may
    // have read their lines before the wait, before the append wrote them.
    auto load_tile = [&](int tb, bool after_wait) {
        load_key(tb, after_wait && min(tb + kl, t1) >= pos0);
#pragma unroll
        for (int j = 0; j < kCTile; j++) load_value(tb, j, after_wait && min(tb + j, t1) >= pos0);
    };
    // pre (contiguous caches): the warp's first tile loaded into registers
    // before the wait. Its keys were written by earlier passes but for the
    // pass's own, pos0..last, which the kv append just before this kernel
    // writes: wherever the tile reads one of those it is loaded again after
    // the wait, from L2 (L1 may hold the line read before). The same sums
    // (token ids of 64 greedy steps after 700 identical either way); one-row
    // passes of the Llama-3-8B shape on the H200 E4M3 2.594-2.615 ->
    // 2.577-2.578 ms, bf16 4.082-4.091 -> 4.073-4.097 (BENCHMARKS.md,
    // sixteenth session; at every row count since the thirtieth).
    const int tb0 = t0 + warp * kCTile;
    const bool pre = !PAGED && tb0 <= t1;
    if (pre) load_tile(tb0, false);
    tsr_pdl::enter(); // launched as a programmatic dependent: kernels/cuda/pdl.cuh
    if (pre && tb0 + kCTile - 1 >= pos0) {
        if (min(tb0 + kl, t1) >= pos0) load_key(tb0, true);
#pragma unroll
        for (int j = 0; j < kCTile; j++)
            if (min(tb0 + j, t1) >= pos0) load_value(tb0, j, true);
    }
    if (!pre && tb0 <= t1) load_tile(tb0, true);
    __shared__ __align__(16) float q_s[GC][HD];
    __shared__ float w_m[kCWarps][GC], w_l[kCWarps][GC], w_acc[kCWarps][GC][HD];
    // slots of the blocks' results for the heads this block merges: n_splits *
    // ceil(group / n_splits) <= kCPush
    __shared__ float p_m[kCPush], p_l[kCPush], p_acc[kCPush][HD];
    const float *qr = q + ((int64_t)row * n_heads + (int64_t)kvh * group) * HD;
    for (int i = threadIdx.x; i < GC * HD; i += blockDim.x)
        q_s[i / HD][i % HD] = i / HD < group ? qr[i] * scale : 0.0f;
    __syncthreads();
    float m[GC], l[GC], acc[GC][DPL];
#pragma unroll
    for (int g = 0; g < GC; g++) {
        m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[g][i] = 0.0f;
    }
    // Software-pipelined: a tile's registers are taken over (kq, vq) and the
    // warp's next tile's loads issued before its arithmetic, so a warp that
    // walks several tiles (verification: 2 splits at 8 rows, 4 tiles a warp
    // after 512 keys) waits for memory once, not once a tile. Passes of 8
    // rows after 512 keys, Llama-3-8B shape, H200: bf16 4.617-4.624 ->
    // 4.574-4.583 ms, E4M3 3.175-3.178 -> 3.132-3.143, one row unchanged
    // (BENCHMARKS.md, thirtieth session).
    for (int tb = tb0; tb <= t1; tb += kCWarps * kCTile) {
        uint4 kq[CPL];
        Raw<T, DPL> vq[kCTile];
        float vsq[kCTile], ksq = ksc;
#pragma unroll
        for (int c = 0; c < CPL; c++) kq[c] = kc[c];
#pragma unroll
        for (int j = 0; j < kCTile; j++) {
            vq[j] = vr[j];
            if constexpr (FP8) vsq[j] = vsc[j];
        }
        if (tb + kCWarps * kCTile <= t1) load_tile(tb + kCWarps * kCTile, true); // the next tile's loads in flight
        float s[GC];
#pragma unroll
        for (int g = 0; g < GC; g++) s[g] = 0.0f;
#pragma unroll
        for (int c = 0; c < CPL; c++) {
            float kf[CD];
            widen_piece<FP8>(kq[c], kf);
            const int db = (part + kCLanes * c) * CD;
#pragma unroll
            for (int g = 0; g < GC; g++)
#pragma unroll
                for (int e = 0; e < CD; e += 4) {
                    const float4 qq = *reinterpret_cast<const float4 *>(&q_s[g][db + e]);
                    s[g] = fmaf(qq.x, kf[e], fmaf(qq.y, kf[e + 1], fmaf(qq.z, kf[e + 2], fmaf(qq.w, kf[e + 3], s[g]))));
                }
        }
        float vf[kCTile][DPL];
#pragma unroll
        for (int j = 0; j < kCTile; j++)
#pragma unroll
            for (int i = 0; i < DPL; i++) vf[j][i] = widen(vq[j], i, d0, HD) * (FP8 ? vsq[j] : 1.0f);
        const bool valid = tb + kl <= t1;
#pragma unroll
        for (int g = 0; g < GC; g++) {
#pragma unroll
            for (int o = 1; o < kCLanes; o <<= 1) s[g] += __shfl_xor_sync(0xffffffffu, s[g], o);
            const float sg = valid ? s[g] * ksq : -INFINITY;
            float tm = sg; // the tile's largest score (key tb is always valid)
#pragma unroll
            for (int o = kCLanes; o < 32; o <<= 1) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, o));
            const float mn = fmaxf(m[g], tm);
            const float corr = __expf(m[g] - mn), p = __expf(sg - mn); // m[g] = -inf at first: 0
            l[g] = l[g] * corr + (part == 0 ? p : 0.0f);               // each key counted once
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[g][i] *= corr;
#pragma unroll
            for (int j = 0; j < kCTile; j++) {
                const float pj = __shfl_sync(0xffffffffu, p, j * kCLanes);
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[g][i] = fmaf(pj, vf[j][i], acc[g][i]);
            }
            m[g] = mn;
        }
    }
    // the block's warps merged through shared memory: warp w merges heads w,
    // w + kCWarps, ... and pushes the block's result for the head into the
    // shared memory of the block that merges the splits of that head (block
    // g % n_splits, its slot [split][g / n_splits]: p_*)
#pragma unroll
    for (int g = 0; g < GC; g++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) l[g] += __shfl_xor_sync(0xffffffffu, l[g], o);
        if (lane == 0) w_m[warp][g] = m[g], w_l[warp][g] = l[g];
#pragma unroll
        for (int i = 0; i < DPL; i++) w_acc[warp][g][d0 + i] = acc[g][i];
    }
    __syncthreads();
    const int hpb = (group + n_splits - 1) / n_splits; // heads whose splits a block merges
    cl.barrier_wait(); // every block of the cluster has started (arrived at the top): its shared memory exists
    for (int g = warp; g < group; g += kCWarps) {
        float M = -INFINITY;
        for (int w = 0; w < kCWarps; w++) M = fmaxf(M, w_m[w][g]);
        float L = 0.0f, a[DPL] = {};
        for (int w = 0; w < kCWarps; w++) {
            const float e = w_m[w][g] > -INFINITY ? __expf(w_m[w][g] - M) : 0.0f; // a warp without keys: 0
            L += w_l[w][g] * e;
#pragma unroll
            for (int i = 0; i < DPL; i++) a[i] = fmaf(e, w_acc[w][g][d0 + i], a[i]);
        }
        const unsigned dst = (unsigned)(g % n_splits);
        const int slot = split * hpb + g / n_splits;
        if (lane == 0) *cl.map_shared_rank(&p_m[slot], dst) = M, *cl.map_shared_rank(&p_l[slot], dst) = L;
        float *pa = cl.map_shared_rank(&p_acc[slot][0], dst);
#pragma unroll
        for (int i = 0; i < DPL; i++) pa[d0 + i] = a[i];
    }
    // the splits merged: block r, warp w merges head r + n_splits * w from
    // the n_splits slots pushed to it. A block with no head to merge leaves
    // at once (a cluster barrier waits for the threads that have not exited).
    cl.barrier_arrive();
    if (split >= group) return;
    cl.barrier_wait();
    for (int g = split + n_splits * warp; g < group; g += n_splits * kCWarps) {
        const int j = (g - split) / n_splits;
        float ms[kCMaxSplits];
        float M = -INFINITY;
#pragma unroll
        for (int r = 0; r < kCMaxSplits; r++) {
            ms[r] = r < n_splits ? p_m[r * hpb + j] : -INFINITY;
            M = fmaxf(M, ms[r]);
        }
        float L = 0.0f, a[DPL] = {};
#pragma unroll
        for (int r = 0; r < kCMaxSplits; r++) {
            if (r >= n_splits) break;
            const float e = ms[r] > -INFINITY ? __expf(ms[r] - M) : 0.0f; // a split without keys: 0
            L += p_l[r * hpb + j] * e;
            const float *ra = &p_acc[r * hpb + j][0];
#pragma unroll
            for (int i = 0; i < DPL; i++) a[i] = fmaf(e, ra[d0 + i], a[i]);
        }
        float *o = out + ((int64_t)row * n_heads + (int64_t)kvh * group + g) * HD;
#pragma unroll
        for (int i = 0; i < DPL; i++) o[d0 + i] = a[i] / L;
    }
}

// One cluster_kernel launch: clusters of the n_splits blocks of a (row, KV
// head); as a programmatic dependent when pdl. cluster_reads holds.
template <bool PAGED, bool FP8>
cudaError_t launch_cluster(int n_splits, cudaStream_t st, bool pdl, const tsr_attn_args *x, const tsr_kv_view *kv,
                           int group, const int32_t *dev_pos0) {
    using T = typename Elem<FP8>::T;
    const T *K = static_cast<const T *>(kv->k), *V = static_cast<const T *>(kv->v);
    const Paging pg = {kv->block_table, kv->block_size, kv->block_stride, kv->k_scale, kv->v_scale};
    const dim3 grid((unsigned)(x->rows * x->n_kv_heads), (unsigned)n_splits), cluster(1, (unsigned)n_splits, 1);
    const int gc = group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
    // Two blocks a multiprocessor (at most 128 registers) for passes of up to
    // 4 rows, whose 4-8 splits a (row, KV head) make clusters of 4-8 blocks
    // that one block a multiprocessor could not all place at once; one (the
    // pipelined loop's registers, no spills) for more rows. Passes after 512
    // keys at the Llama-3-8B shape, H200, 2 / 4 / 8 rows: one block
    // 4.740 / 4.907 / 4.654 ms, two 4.616 / 4.730 / 4.750 (BENCHMARKS.md,
    // thirtieth session). Group 8 needs more registers than two blocks allow.
    const int minb = gc <= 4 && x->rows <= 4 ? 2 : 1;
    switch (x->head_dim * 100 + gc * 10 + minb) {
#define CASE(HD, GC, MB)                                                                                  \
    case HD * 100 + GC * 10 + MB:                                                                         \
        return tsr_pdl::launch_ex(cluster_kernel<HD, GC, PAGED, FP8, MB>, grid, kCWarps * 32, &cluster, 0, st, \
                                  pdl, x->q, K, V, x->n_heads, x->n_kv_heads, group, kv->token_stride,     \
                                  kv->head_stride, x->pos0, dev_pos0, x->window, x->scale, n_splits, pg, x->out, \
                                  x->rows == 1);
#define CASE2(HD, GC) CASE(HD, GC, 1) CASE(HD, GC, 2)
        CASE2(64, 1) CASE2(64, 2) CASE2(64, 4) CASE(64, 8, 1) CASE2(128, 1) CASE2(128, 2) CASE2(128, 4) CASE(128, 8, 1)
#undef CASE2
#undef CASE
    }
    return cudaErrorInvalidValue;
}

constexpr int kMaxSplits = 1024;

// One split_kernel launch of the instance for head_dim's dims per lane.
template <bool PAGED, bool FP8>
cudaError_t launch_split(dim3 grid, int threads, cudaStream_t st, bool pdl, const tsr_attn_args *x,
                         const tsr_kv_view *kv, float *part, unsigned *count, int group, bool vec,
                         const int32_t *dev_pos0, bool even, int chunk, int n_splits) {
    using T = typename Elem<FP8>::T;
    const T *K = static_cast<const T *>(kv->k), *V = static_cast<const T *>(kv->v);
    const Paging pg = {kv->block_table, kv->block_size, kv->block_stride, kv->k_scale, kv->v_scale};
    switch ((x->head_dim + 31) / 32) {
#define CASE(D)                                                                                          \
    case D:                                                                                              \
        return tsr_pdl::launch(split_kernel<D, PAGED, FP8>, grid, threads, 0, st, pdl, x->q, K, V, part,    \
                               x->n_heads, x->n_kv_heads, group, x->head_dim, kv->token_stride,            \
                               kv->head_stride, vec, x->pos0, dev_pos0, even, x->window, x->scale, chunk,  \
                               n_splits, pg, count, x->out);
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    }
    return cudaErrorInvalidValue;
}

#endif

#ifdef CUDA_ATTN_SPLIT
// f(paged, fp8) with the view's layout and element type as compile-time
// constants (std::bool_constant), for the kernels' template instances.
template <class F> cudaError_t for_view(const tsr_kv_view *kv, F &&f) {
    const bool paged = kv->layout == TSR_KV_PAGED, fp8 = kv->dtype == TSR_DTYPE_F8_E4M3;
    if (!paged) return fp8 ? f(std::false_type{}, std::true_type{}) : f(std::false_type{}, std::false_type{});
    return fp8 ? f(std::true_type{}, std::true_type{}) : f(std::true_type{}, std::false_type{});
}

// A pass through cluster_kernel (cluster_reads holds, group <= kMaxGroup).
// Splits per (row, KV head): passes of up to TSR_GRAPH_MAX_ROWS rows (as
// captured) about 16 / rows, at most cluster_splits, a fixed count for a row
// count (tools/cuda_lab/attn_lab.cu, after 512 keys, us a layer by splits:
// 1 row 6.1 with 8, 7.6 with 4; 2 rows 7.6 with 4 or 8; 4 rows 9.2 with 4;
// 8 rows 11.0 with 2, 15.3 with 4); bigger passes enough blocks to fill the
// GPU, at least split_keys keys each.
int run_cluster(Attn *a, const tsr_attn_args *x, const tsr_exec *ex, int group, int keys) {
    const tsr_kv_view *kv = x->kv;
    cudaStream_t st = static_cast<cudaStream_t>(ex->stream);
    const int32_t *dev_pos0 = ex->step ? &ex->step->pos0 : nullptr;
    int n_splits;
    if (dev_pos0 || x->rows <= TSR_GRAPH_MAX_ROWS) {
        n_splits = 16 / x->rows;
    } else {
        const int blocks = x->rows * x->n_kv_heads, want = (2 * a->sms + blocks - 1) / blocks;
        const int most = (keys + a->chunk - 1) / a->chunk;
        n_splits = want < most ? want : most;
    }
    if (n_splits > a->cluster_splits) n_splits = a->cluster_splits;
    if (n_splits < 1) n_splits = 1;
    const cudaError_t e = for_view(kv, [&](auto paged, auto fp8) {
        return launch_cluster<decltype(paged)::value, decltype(fp8)::value>(n_splits, st, ex->pdl != 0, x, kv, group,
                                                                            dev_pos0);
    });
    if (e != cudaSuccess) {
        a->ctx->host->set_error(a->ctx, "cluster attention: %s", cudaGetErrorString(e));
        return TSR_ERR_DEVICE;
    }
    return TSR_OK;
}
#endif

int a_init(void *inst, const tsr_plugin_ctx *ctx) {
    Attn *a = static_cast<Attn *>(inst);
    a->ctx = ctx;
    const tsr_param *p = ctx->host->param(ctx, "split_keys");
    a->chunk = p ? (int)p->v.i : 32;
    if (a->chunk <= 0) a->chunk = 32;
    a->sms = 132;
    int dev = 0;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&a->sms, cudaDevAttrMultiProcessorCount, dev);
    cudaGetLastError();
#ifdef CUDA_ATTN_SPLIT
    p = ctx->host->param(ctx, "tile_rows");
    a->tile_rows = p ? (int)p->v.i : CUDA_ATTN_PREFILL_MIN_ROWS;
    p = ctx->host->param(ctx, "tile_splits");
    a->tile_splits = p ? (int)p->v.i : 8;
    if (a->tile_splits < 1) a->tile_splits = 1;
    p = ctx->host->param(ctx, "fused_merge");
    a->fused_merge = p ? (int)p->v.i : 1;
    p = ctx->host->param(ctx, "cluster");
    a->cluster = p ? (int)p->v.i : 1;
    p = ctx->host->param(ctx, "cluster_rows");
    a->cluster_rows = p ? (int)p->v.i : 8;
    p = ctx->host->param(ctx, "packed_rows");
    a->packed_rows = p ? (int)p->v.i : 2;
    p = ctx->host->param(ctx, "packed_splits");
    a->packed_splits = p ? (int)p->v.i : cuda_attn::kPMaxSplits;
    if (a->packed_splits < 1 || a->packed_splits > cuda_attn::kPMaxSplits) a->packed_splits = cuda_attn::kPMaxSplits;
    p = ctx->host->param(ctx, "cluster_splits");
    a->cluster_splits = p ? (int)p->v.i : kCMaxSplits;
    if (a->cluster_splits < 1 || a->cluster_splits > kCMaxSplits) a->cluster_splits = kCMaxSplits;
    p = ctx->host->param(ctx, "graph_splits");
    a->graph_splits = p ? (int)p->v.i : 16;
    if (a->graph_splits <= 0) a->graph_splits = 16;
    const tsr_model_desc *md = ctx->model;
    if (md && md->n_heads > 0 && md->head_dim > 0) { // scratch for captured passes, reserved now
        const int most = a->graph_splits > a->tile_splits ? a->graph_splits : a->tile_splits;
        const size_t floats = (size_t)TSR_GRAPH_MAX_ROWS * md->n_heads * most * (2 + md->head_dim);
        a->graph_heads = md->n_heads;
        int rc = ctx->host->dev_alloc(ctx, floats * sizeof(float), reinterpret_cast<void **>(&a->graph_scratch));
        if (rc == TSR_OK) rc = counters(a, &a->graph_counts, (size_t)TSR_GRAPH_MAX_ROWS * md->n_heads);
        if (rc != TSR_OK) return rc;
    }
#endif
    return TSR_OK;
}

void a_fini(void *inst) {
    Attn *a = static_cast<Attn *>(inst);
    if (a->ctx && a->scratch) a->ctx->host->dev_free(a->ctx, a->scratch);
    if (a->ctx && a->graph_scratch) a->ctx->host->dev_free(a->ctx, a->graph_scratch);
    if (a->ctx && a->counts) a->ctx->host->dev_free(a->ctx, a->counts);
    if (a->ctx && a->graph_counts) a->ctx->host->dev_free(a->ctx, a->graph_counts);
}

int a_run(void *inst, const tsr_attn_args *x, const tsr_exec *ex) {
    Attn *a = static_cast<Attn *>(inst);
    const tsr_kv_view *kv = x->kv;
    cudaStream_t st = static_cast<cudaStream_t>(ex->stream);
    const bool plain = kv->dtype == TSR_DTYPE_BF16 && kv->layout == TSR_KV_CONTIGUOUS;
#ifdef CUDA_ATTN_SPLIT
    if ((kv->dtype != TSR_DTYPE_BF16 && kv->dtype != TSR_DTYPE_F8_E4M3) ||
        (kv->layout != TSR_KV_CONTIGUOUS && kv->layout != TSR_KV_PAGED)) {
        a->ctx->host->set_error(a->ctx, "reads bf16 or f8_e4m3 KV, contiguous or paged (dtype %u layout %u)",
                                kv->dtype, kv->layout);
        return TSR_ERR_UNSUPPORTED;
    }
    if (kv->dtype == TSR_DTYPE_F8_E4M3 && (!kv->k_scale || !kv->v_scale)) {
        a->ctx->host->set_error(a->ctx, "f8_e4m3 KV without its scales");
        return TSR_ERR_INVALID;
    }
    if (kv->layout == TSR_KV_PAGED && (!kv->block_table || kv->block_size <= 0 || kv->block_stride < 0)) {
        a->ctx->host->set_error(a->ctx, "paged KV without a block table (block_size %d)", kv->block_size);
        return TSR_ERR_INVALID;
    }
#else
    if (!plain) {
        a->ctx->host->set_error(a->ctx, "reads bf16 contiguous KV only (dtype %u layout %u)", kv->dtype, kv->layout);
        return TSR_ERR_UNSUPPORTED;
    }
#endif
    if (x->n_kv_heads <= 0 || x->n_heads % x->n_kv_heads || x->head_dim > kMaxHeadDim ||
        kv->n_tokens < x->pos0 + x->rows) {
        a->ctx->host->set_error(a->ctx, "unsupported shape: %d heads, %d kv heads, head_dim %d", x->n_heads,
                                x->n_kv_heads, x->head_dim);
        return TSR_ERR_UNSUPPORTED;
    }
    const int group = x->n_heads / x->n_kv_heads, keys = x->pos0 + x->rows;
    const __nv_bfloat16 *K = static_cast<const __nv_bfloat16 *>(kv->k);
    const __nv_bfloat16 *V = static_cast<const __nv_bfloat16 *>(kv->v);
    int rc;
#ifdef CUDA_ATTN_SPLIT
    const int32_t *dev_pos0 = ex->step ? &ex->step->pos0 : nullptr;
    const bool tiles = x->rows >= a->tile_rows && cuda_attn_prefill_supported(x);
    if (a->packed_rows > 0 && x->rows >= a->packed_rows && x->rows <= a->cluster_rows && cuda_attn::packed_reads(x, kv)) {
        /* verification of drafts over bf16 KV: rows x group on the tensor cores */
        const cudaError_t e = cuda_attn::launch_packed(a->packed_splits, st, ex->pdl != 0, x, kv, dev_pos0);
        if (e != cudaSuccess) {
            a->ctx->host->set_error(a->ctx, "packed attention: %s", cudaGetErrorString(e));
            return TSR_ERR_DEVICE;
        }
        return TSR_OK;
    }
    if (a->cluster && group <= kMaxGroup && cluster_reads(x, kv) && (x->rows <= a->cluster_rows || !tiles))
        return run_cluster(a, x, ex, group, keys); /* decode, verification; prefill prefill.cu cannot take */
    if (tiles) { // prefill.cu, captured or not
        /* passes of few rows (verification of drafts) cut each KV head's keys
         * into tile_splits blocks (prefill has row blocks enough); a captured
         * pass only at the shape its scratch was reserved for */
        const bool fits = !dev_pos0 || (a->graph_scratch && x->n_heads <= a->graph_heads &&
                                        x->head_dim <= a->ctx->model->head_dim);
        const int splits = x->rows <= TSR_GRAPH_MAX_ROWS && fits ? a->tile_splits : 1;
        float *part = nullptr;
        unsigned *count = nullptr; /* unused: the tensor-core kernel's splits are merged by a pass of their own */
        if (splits > 1 && (rc = split_scratch(a, dev_pos0 != nullptr, x, splits, &part, &count))) return rc;
        const cudaError_t e = static_cast<cudaError_t>(cuda_attn_prefill_split(x, dev_pos0, part, splits, ex->pdl, st));
        if (e != cudaSuccess) {
            a->ctx->host->set_error(a->ctx, "prefill attention: %s", cudaGetErrorString(e));
            return TSR_ERR_DEVICE;
        }
        return TSR_OK;
    }
    const bool split_ok = group <= kMaxGroup && x->head_dim <= 256;
    if (!split_ok && !plain) { /* the baseline kernels below read bf16 contiguous KV only */
        a->ctx->host->set_error(a->ctx, "%d query heads per kv head over paged or fp8 KV: at most %d", group,
                                kMaxGroup);
        return TSR_ERR_UNSUPPORTED;
    }
    if (dev_pos0 && split_ok && (!a->graph_scratch || x->rows > TSR_GRAPH_MAX_ROWS ||
                                 x->n_heads != a->ctx->model->n_heads || x->head_dim != a->ctx->model->head_dim)) {
        a->ctx->host->set_error(a->ctx, "a captured pass of %d rows, %d heads of %d, %d kv heads is not one "
                                "it can replay", x->rows, x->n_heads, x->head_dim, x->n_kv_heads);
        return TSR_ERR_UNSUPPORTED;
    }
    if (split_ok) {
        /* passes of a few rows: graph_splits even splits (as captured); more
         * rows: enough blocks to fill the GPU, at least chunk keys each */
        const bool even = dev_pos0 || x->rows <= TSR_GRAPH_MAX_ROWS;
        const bool paged = kv->layout == TSR_KV_PAGED, fp8 = kv->dtype == TSR_DTYPE_F8_E4M3;
        const bool pdl = ex->pdl != 0;
        const int dpl = (x->head_dim + 31) / 32;
        const size_t esize = fp8 ? 1 : 2;
        const bool vec = kv->token_stride % dpl == 0 && kv->head_stride % dpl == 0 &&
                         (!paged || kv->block_stride % dpl == 0) &&
                         (reinterpret_cast<uintptr_t>(kv->k) | reinterpret_cast<uintptr_t>(kv->v)) % (esize * dpl) == 0;
        int n_splits = a->graph_splits;
        if (!even) {
            const int blocks = x->rows * x->n_kv_heads, want = (4 * a->sms + blocks - 1) / blocks;
            const int most = (keys + a->chunk - 1) / a->chunk, least = (keys + 255) / 256;
            n_splits = want < most ? want : most;
            if (n_splits < least) n_splits = least; /* no block walks more than 256 keys */
            if (n_splits < 1) n_splits = 1;
            if (n_splits > kMaxSplits) n_splits = kMaxSplits;
        }
        const int chunk = (keys + n_splits - 1) / n_splits;
        float *part;
        unsigned *count;
        if ((rc = split_scratch(a, dev_pos0 != nullptr, x, n_splits, &part, &count))) return rc;
        if (!a->fused_merge) count = nullptr;
        dim3 grid(x->rows * x->n_kv_heads, n_splits);
        const int threads = 32 * group;
        cudaError_t e = for_view(kv, [&](auto paged_c, auto fp8_c) {
            return launch_split<decltype(paged_c)::value, decltype(fp8_c)::value>(
                grid, threads, st, pdl, x, kv, part, count, group, vec, dev_pos0, even, chunk, n_splits);
        });
        if (e == cudaSuccess && !count)
            e = cuda_attn::launch_merge(part, x->out, x->rows * x->n_heads, x->head_dim, n_splits, st, pdl);
        if (e != cudaSuccess) {
            a->ctx->host->set_error(a->ctx, "split attention: %s", cudaGetErrorString(e));
            return TSR_ERR_DEVICE;
        }
        return TSR_OK;
    }
#endif
    if (ex->step) {
        ref_step_kernel<<<x->rows * x->n_heads, kRefThreads, 0, st>>>(
            x->q, K, V, x->out, x->n_heads, group, x->head_dim, kv->token_stride, kv->head_stride,
            &ex->step->pos0, x->window, x->scale);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) {
            a->ctx->host->set_error(a->ctx, "attention: %s", cudaGetErrorString(e));
            return TSR_ERR_DEVICE;
        }
        return TSR_OK;
    }
    if ((rc = ensure(a, (size_t)x->rows * x->n_heads * keys))) return rc;
    ref_kernel<<<x->rows * x->n_heads, 128, 0, st>>>(x->q, K, V, x->out, a->scratch, x->n_heads, group,
                                                     x->head_dim, kv->token_stride, kv->head_stride,
                                                     x->pos0, x->window, x->scale, keys);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        a->ctx->host->set_error(a->ctx, "attention: %s", cudaGetErrorString(e));
        return TSR_ERR_DEVICE;
    }
    return TSR_OK;
}

const tsr_attention_i iface = {sizeof(tsr_attention_i), TSR_ATTENTION_IFACE_VERSION, a_run};

const tsr_plugin_desc desc = {
    TSR_ABI_MAJOR, TSR_ABI_MINOR, PLUGIN_NAME, TSR_SLOT_ATTENTION, "1.0.0", sizeof(Attn),
    PLUGIN_CAPS, a_init, a_fini, &iface,
};

} // namespace

extern "C" TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &desc; }
