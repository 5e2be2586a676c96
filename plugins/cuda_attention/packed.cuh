// packed.cuh - cuda_attention's kernel for passes of a few rows (the
// verification of drafts) on the tensor cores, included by
// cuda_attention.cu.
//
// The rows of a verification pass read the same keys, and the query heads
// of a GQA group the same KV head: a block packs every (row, query head of
// the group) pair into "virtual rows" v = i * group + hg (row i, head
// kvh * group + hg; at most 64: rows * group <= 16 * MT) and takes them all
// through mma.sync m16n8k16 against each key once, where cluster_kernel
// gives each row its own blocks and reads every key once a row.
//
// Grid (n_kv, n_splits), a thread-block cluster of the n_splits blocks of a
// KV head, each a run of the keys [first of row 0, pos0 + rows - 1]. A block
// has kPWarps warps: MT groups of 16 virtual rows times KW = kPWarps / MT key
// warps; warp (mt, kw) takes steps of 16 keys, kw, kw + KW, ..., of the
// block's run for virtual rows 16 mt.., loading them straight from global
// memory into the mma fragments (no shared memory for K and V):
// - S = Q K^T: B (k x n = dims x keys) b0 = (dims 2t, 2t+1; key g). The sum
//   over dims does not care in which order the dims come, so lane (g, t)
//   loads 16 bytes of key g, dims 32c + 8t.. 8t + 7, as four words and the
//   k steps (c, 0), (c, 1) read virtual dims 2t.., 2t + 8.. as words (0, 1)
//   and (2, 3); Q's A fragments (shared memory) follow the same order.
// - O += P V: P's A fragments are S's C fragments (flash-attention-2); V's
//   B (keys x dims) b0 = (keys 2t, 2t+1; dim g) pairs two keys' values at
//   one dim: lane (g, t) loads 16 bytes of keys 2t, 2t+1, 2t+8, 2t+9 at
//   dims 64 s + 8g.., and n tile (s, j) pairs their elements j with a byte
//   permute, so its output column g is dim 64 s + 8g + j.
// Exactness as the prefill kernel's (prefill.h): q and P as hi + lo bf16
// halves, products exact in f32, sums in f32, base-2 exponentials.
//
// Merging: the key warps of a virtual-row group through shared memory,
// then the splits through distributed shared memory, pushed to the block
// that merges virtual row v (block v % n_splits), as cluster_kernel does.
#ifndef CUDA_ATTN_PACKED_CUH
#define CUDA_ATTN_PACKED_CUH

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/pdl.cuh"
#include "plugins/cuda_attention/mma.cuh"
#include "slots/tsr_attention.h"

namespace cuda_attn {

constexpr int kPWarps = 8, kPKeys = 16, kPMaxSplits = 8, kPMaxVirt = 64;

// Shared memory of an instance: Q's halves, then (the same bytes, once the
// keys are done) the key warps' partial results (outputs, max and sum, each
// warp's weight in the merge); after them the slots of the splits' pushed
// results (outputs, then max and sum: n_splits * ceil(n_virt / n_splits) <=
// kPMaxVirt + kPMaxSplits - 1 slots) and the merging block's weights, sized
// at launch (slots_bytes).
template <int HD, int MT> struct PackedSmem {
    static constexpr int kQStride = HD + 32; // bf16: rows 16 (8k + 4) bytes apart: 8 lanes' 16-byte loads conflict-free
    static constexpr int kKW = kPWarps / MT, kVirt = 16 * MT;
    static constexpr size_t kQ = (size_t)2 * kVirt * kQStride * 2;
    static constexpr size_t kW = (size_t)kKW * kVirt * (HD + 3) * 4;
    static constexpr size_t kSlots = kQ > kW ? kQ : kW; // where the slots start (a multiple of 16)
    static size_t slots_bytes(int n_slots, int merged) {
        return (size_t)n_slots * (HD + 2) * 4 + (size_t)merged * (kPMaxSplits + 1) * 4;
    }
    static constexpr size_t kMaxBytes = kSlots + (size_t)(kPMaxVirt + kPMaxSplits - 1) * (HD + 2) * 4 +
                                        (size_t)kPMaxVirt * (kPMaxSplits + 1) * 4;
};

// One 16-byte piece of a key or value row: through L2 only (cg) for the
// pass's own keys loaded after the programmatic-dependent wait (L1 may hold
// a line read before the kv append wrote it), else the read-only path.
__device__ __forceinline__ uint4 piece(const __nv_bfloat16 *p, bool cg) {
    const uint4 *a = reinterpret_cast<const uint4 *>(p);
    return cg ? __ldcg(a) : __ldg(a);
}

template <int HD, int MT, bool PAGED>
__global__ void __launch_bounds__(kPWarps * 32, 1)
    packed_kernel(const float *q, const __nv_bfloat16 *K, const __nv_bfloat16 *V, int rows, int n_heads, int n_kv,
                  int group, int64_t ts, int64_t hs, int pos0, const int32_t *dev_pos0, int window,
                  float scale_log2, int n_splits, Pages pg, float *out) {
    using SM = PackedSmem<HD, MT>;
    constexpr int KW = SM::kKW, QS = SM::kQStride, NC = HD / 32, NS = HD / 64, NT = HD / 8;
    static_assert(HD == 64 || HD == 128, "head_dim 64 or 128");
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16 *q_hi = reinterpret_cast<__nv_bfloat16 *>(smem), *q_lo = q_hi + 16 * MT * QS;

    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    const int kvh = blockIdx.x, split = (int)cl.block_rank();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int mt = warp % MT, kw = warp / MT;
    if (dev_pos0) pos0 = *dev_pos0;
    const int n_virt = rows * group;
    // The block's run of keys: every row's keys lie in [first of row 0, last of the last row].
    const int kfirst = window > 0 && pos0 - window + 1 > 0 ? pos0 - window + 1 : 0, klast = pos0 + rows - 1;
    const int chunk = (klast - kfirst + n_splits) / n_splits;
    const int t0 = kfirst + split * chunk, t1 = min(klast, t0 + chunk - 1);
    // This thread's two virtual rows (g, g + 8 of the warp's 16) see keys
    // [key_lo, key_hi] of the run (none past the block's virtual rows).
    int key_lo[2], key_hi[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int v = 16 * mt + g + 8 * h, i = v / group;
        key_hi[h] = v < n_virt ? min(pos0 + i, t1) : -1;
        key_lo[h] = window > 0 ? max(pos0 + i - window + 1, t0) : t0;
    }
    cl.barrier_arrive(); // matched by the wait before the first push into another block's shared memory

    // A step's fragments: kf[n][c] key tb + 8n + g, dims 32c + 8t..; vf[k][s]
    // keys tb + {2t, 2t+1, 2t+8, 2t+9}[k], dims 64s + 8g.. (keys past t1
    // read key t1 again: never past the table or the cache; they weigh 0).
    uint4 kf[2][NC], vf[4][NS];
    auto load_step = [&](int tb, bool after_wait) {
#pragma unroll
        for (int n = 0; n < 2; n++) {
            const int key = min(tb + 8 * n + g, t1);
            const __nv_bfloat16 *kp = K + key_row<PAGED>(key, ts, pg) + kvh * hs + 8 * t;
#pragma unroll
            for (int c = 0; c < NC; c++) kf[n][c] = piece(kp + 32 * c, after_wait && key >= pos0);
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int key = min(tb + 2 * t + (k & 1) + 8 * (k >> 1), t1);
            const __nv_bfloat16 *vp = V + key_row<PAGED>(key, ts, pg) + kvh * hs + 8 * g;
#pragma unroll
            for (int s = 0; s < NS; s++) vf[k][s] = piece(vp + 64 * s, after_wait && key >= pos0);
        }
    };
    // Contiguous caches: the warp's first step loaded before the wait (its
    // keys written by earlier passes but for the pass's own, pos0 on, which
    // the kv append just before writes: those loaded again after it).
    const int tb0 = t0 + kw * kPKeys;
    const bool pre = !PAGED && tb0 <= t1;
    if (pre) load_step(tb0, false);
    tsr_pdl::enter(); // launched as a programmatic dependent: kernels/cuda/pdl.cuh
    if (pre && min(tb0 + kPKeys - 1, t1) >= pos0) load_step(tb0, true);
    if (!pre && tb0 <= t1) load_step(tb0, true);

    // Q's halves, virtual row v at row v (zero past n_virt), every load
    // issued before any is used (one at a time, a load and a store a turn,
    // they cost a pass of 8 rows ~8 us a layer: BENCHMARKS.md).
    {
        constexpr int Q4 = 16 * MT * HD / 4, QPT = Q4 / (kPWarps * 32);
        static_assert(Q4 % (kPWarps * 32) == 0, "whole float4s a thread");
        const float *qb = q + (int64_t)kvh * group * HD;
        float4 qv[QPT];
#pragma unroll
        for (int k = 0; k < QPT; k++) {
            const int idx = threadIdx.x + k * kPWarps * 32, v = idx / (HD / 4), d = idx % (HD / 4) * 4;
            qv[k] = v < n_virt ? *reinterpret_cast<const float4 *>(qb + ((int64_t)(v / group) * n_heads + v % group) * HD + d)
                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int k = 0; k < QPT; k++) {
            const int idx = threadIdx.x + k * kPWarps * 32, v = idx / (HD / 4), d = idx % (HD / 4) * 4;
            uint32_t hi[2], lo[2];
            split_pair(qv[k].x, qv[k].y, &hi[0], &lo[0]);
            split_pair(qv[k].z, qv[k].w, &hi[1], &lo[1]);
            *reinterpret_cast<uint2 *>(q_hi + v * QS + d) = make_uint2(hi[0], hi[1]);
            *reinterpret_cast<uint2 *>(q_lo + v * QS + d) = make_uint2(lo[0], lo[1]);
        }
    }
    __syncthreads();

    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f}; // row_sum: this thread's keys
    const __nv_bfloat16 *qh0 = q_hi + (16 * mt + g) * QS + 8 * t, *ql0 = q_lo + (16 * mt + g) * QS + 8 * t;
    for (int tb = tb0; tb <= t1; tb += KW * kPKeys) {
        if (tb != tb0) load_step(tb, true);
        // S = Q K^T: s[n] keys tb + 8n.., C layout (rows g, g + 8; keys 2t, 2t + 1)
        float s[2][4] = {};
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const uint4 h0 = *reinterpret_cast<const uint4 *>(qh0 + 32 * c);
            const uint4 h1 = *reinterpret_cast<const uint4 *>(qh0 + 8 * QS + 32 * c);
            const uint4 l0 = *reinterpret_cast<const uint4 *>(ql0 + 32 * c);
            const uint4 l1 = *reinterpret_cast<const uint4 *>(ql0 + 8 * QS + 32 * c);
            const uint32_t ah[2][4] = {{h0.x, h1.x, h0.y, h1.y}, {h0.z, h1.z, h0.w, h1.w}};
            const uint32_t al[2][4] = {{l0.x, l1.x, l0.y, l1.y}, {l0.z, l1.z, l0.w, l1.w}};
#pragma unroll
            for (int n = 0; n < 2; n++) {
                mma_bf16(s[n], al[0], kf[n][c].x, kf[n][c].y);
                mma_bf16(s[n], ah[0], kf[n][c].x, kf[n][c].y);
                mma_bf16(s[n], al[1], kf[n][c].z, kf[n][c].w);
                mma_bf16(s[n], ah[1], kf[n][c].z, kf[n][c].w);
            }
        }
        // Mask, scale to base 2, online softmax per virtual row.
        float mx[2] = {row_max[0], row_max[1]};
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int h = c >> 1, key = tb + 8 * n + 2 * t + (c & 1);
                const float x = key < key_lo[h] || key > key_hi[h] ? -INFINITY : s[n][c] * scale_log2;
                s[n][c] = x;
                mx[h] = fmaxf(mx[h], x);
            }
        float base[2];
#pragma unroll
        for (int h = 0; h < 2; h++) { // the 4 lanes of a row share its max
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            base[h] = mx[h] == -INFINITY ? 0.0f : mx[h]; // no key yet: every weight 0
            const float corr = exp2f(row_max[h] - base[h]);
            row_max[h] = mx[h];
            row_sum[h] *= corr;
#pragma unroll
            for (int n = 0; n < NT; n++) acc[n][2 * h] *= corr, acc[n][2 * h + 1] *= corr;
        }
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float p = exp2f(s[n][c] - base[c >> 1]);
                s[n][c] = p;
                row_sum[c >> 1] += p;
            }
        // O += P V: P's A fragment from S's C fragments (keys 2t.. of n tile 0, 2t + 8.. of 1).
        uint32_t ph[4], pl[4];
        split_pair(s[0][0], s[0][1], &ph[0], &pl[0]);
        split_pair(s[0][2], s[0][3], &ph[1], &pl[1]);
        split_pair(s[1][0], s[1][1], &ph[2], &pl[2]);
        split_pair(s[1][2], s[1][3], &ph[3], &pl[3]);
#pragma unroll
        for (int sl = 0; sl < NS; sl++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint32_t sel = j & 1 ? 0x7632u : 0x5410u;
                const uint32_t *w0 = &vf[0][sl].x, *w1 = &vf[1][sl].x, *w2 = &vf[2][sl].x, *w3 = &vf[3][sl].x;
                const uint32_t b0 = __byte_perm(w0[j >> 1], w1[j >> 1], sel);
                const uint32_t b1 = __byte_perm(w2[j >> 1], w3[j >> 1], sel);
                mma_bf16(acc[8 * sl + j], pl, b0, b1);
                mma_bf16(acc[8 * sl + j], ph, b0, b1);
            }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
        row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
    }
    __syncthreads(); // every warp done with Q, whose bytes now take the partial results
    constexpr int VR = SM::kVirt, D4 = HD / 4;
    float *w_acc = reinterpret_cast<float *>(smem); // [KW][VR][HD]
    float *w_ml = w_acc + KW * VR * HD;              // [KW][VR][2]: max (base 2), sum
    float *w_e = w_ml + KW * VR * 2;                 // [VR][KW]: each key warp's weight
    // The warp's partial results: n tile (sl, j), column 2t (+1) is dim 64 sl + 8 (2t) + j (+8).
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = kw * VR + 16 * mt + g + 8 * h;
        if (t == 0) w_ml[2 * r] = row_max[h], w_ml[2 * r + 1] = row_sum[h];
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const int d = 64 * (n / 8) + 16 * t + n % 8;
            w_acc[r * HD + d] = acc[n][2 * h];
            w_acc[r * HD + d + 8] = acc[n][2 * h + 1];
        }
    }
    __syncthreads();
    // The key warps merged and pushed to the block that merges virtual row
    // v's splits (block v % n_splits, slot split * hpb + v / n_splits): a
    // thread a row for the weights, then 4 dims a thread for the outputs.
    const int hpb = (n_virt + n_splits - 1) / n_splits, n_slots = n_splits * hpb;
    float *p_acc = reinterpret_cast<float *>(smem + SM::kSlots); // [n_slots][HD]
    float *p_ml = p_acc + n_slots * HD;                           // [n_slots][2]
    float *p_e = p_ml + n_slots * 2;                              // [hpb][kPMaxSplits + 1]: weights, sum
    cl.barrier_wait(); // every block of the cluster has started: its shared memory exists
    for (int v = threadIdx.x; v < n_virt; v += blockDim.x) {
        float m[KW], M = -INFINITY, L = 0.0f;
#pragma unroll
        for (int w = 0; w < KW; w++) m[w] = w_ml[2 * (w * VR + v)], M = fmaxf(M, m[w]);
#pragma unroll
        for (int w = 0; w < KW; w++) {
            const float e = m[w] > -INFINITY ? exp2f(m[w] - M) : 0.0f; // a warp without keys: 0
            w_e[v * KW + w] = e;
            L += w_ml[2 * (w * VR + v) + 1] * e;
        }
        float *pm = cl.map_shared_rank(p_ml + 2 * (split * hpb + v / n_splits), (unsigned)(v % n_splits));
        pm[0] = M, pm[1] = L;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < n_virt * D4; idx += blockDim.x) {
        const int v = idx / D4, d = idx % D4 * 4;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < KW; w++) {
            const float e = w_e[v * KW + w];
            const float4 x = *reinterpret_cast<const float4 *>(w_acc + (w * VR + v) * HD + d);
            a.x = fmaf(e, x.x, a.x), a.y = fmaf(e, x.y, a.y), a.z = fmaf(e, x.z, a.z), a.w = fmaf(e, x.w, a.w);
        }
        *reinterpret_cast<float4 *>(cl.map_shared_rank(p_acc + (split * hpb + v / n_splits) * HD + d,
                                                       (unsigned)(v % n_splits))) = a;
    }
    // The splits merged: block r, virtual rows r, r + n_splits, ... (a block
    // with none leaves at once: a cluster barrier waits only for threads
    // that have not exited).
    cl.barrier_arrive();
    if (split >= n_virt) return;
    cl.barrier_wait();
    const int mine = (n_virt - split + n_splits - 1) / n_splits; // virtual rows split + n_splits * j
    for (int j = threadIdx.x; j < mine; j += blockDim.x) {
        float m[kPMaxSplits], M = -INFINITY, L = 0.0f;
#pragma unroll
        for (int r = 0; r < kPMaxSplits; r++) {
            m[r] = r < n_splits ? p_ml[2 * (r * hpb + j)] : -INFINITY;
            M = fmaxf(M, m[r]);
        }
#pragma unroll
        for (int r = 0; r < kPMaxSplits; r++) {
            const float e = m[r] > -INFINITY ? exp2f(m[r] - M) : 0.0f; // a split without keys: 0
            p_e[j * (kPMaxSplits + 1) + r] = e;
            if (r < n_splits) L += p_ml[2 * (r * hpb + j) + 1] * e;
        }
        p_e[j * (kPMaxSplits + 1) + kPMaxSplits] = L;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < mine * D4; idx += blockDim.x) {
        const int j = idx / D4, d = idx % D4 * 4, v = split + n_splits * j, i = v / group, hg = v % group;
        const float *e = p_e + j * (kPMaxSplits + 1);
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int r = 0; r < kPMaxSplits; r++) {
            if (r >= n_splits) break;
            const float4 x = *reinterpret_cast<const float4 *>(p_acc + (r * hpb + j) * HD + d);
            a.x = fmaf(e[r], x.x, a.x), a.y = fmaf(e[r], x.y, a.y), a.z = fmaf(e[r], x.z, a.z), a.w = fmaf(e[r], x.w, a.w);
        }
        const float L = e[kPMaxSplits];
        *reinterpret_cast<float4 *>(out + ((int64_t)i * n_heads + (int64_t)kvh * group + hg) * HD + d) =
            make_float4(a.x / L, a.y / L, a.z / L, a.w / L);
    }
}

// Whether packed_kernel takes a pass: bf16 KV (contiguous, or paged with
// 16-byte aligned blocks), head_dim 64 or 128 (16-byte pieces of aligned
// rows; q and out 16-byte aligned), at most kPMaxVirt (row, query head) pairs per
// KV head.
inline bool packed_reads(const tsr_attn_args *x, const tsr_kv_view *kv) {
    return kv->dtype == TSR_DTYPE_BF16 && (x->head_dim == 64 || x->head_dim == 128) && x->n_kv_heads > 0 &&
           x->n_heads % x->n_kv_heads == 0 && x->rows * (x->n_heads / x->n_kv_heads) <= kPMaxVirt &&
           kv->token_stride % 8 == 0 && kv->head_stride % 8 == 0 &&
           (kv->layout != TSR_KV_PAGED || kv->block_stride % 8 == 0) &&
           ((reinterpret_cast<uintptr_t>(kv->k) | reinterpret_cast<uintptr_t>(kv->v) |
             reinterpret_cast<uintptr_t>(x->q) | reinterpret_cast<uintptr_t>(x->out)) & 15) == 0;
}

template <int HD, int MT, bool PAGED>
cudaError_t launch_packed_as(int n_splits, cudaStream_t st, bool pdl, const tsr_attn_args *x, const tsr_kv_view *kv,
                             const Pages &pg, const int32_t *dev_pos0) {
    using SM = PackedSmem<HD, MT>;
    auto kernel = packed_kernel<HD, MT, PAGED>;
    static bool sized = false; // the attribute set once an instance (setting it again is harmless)
    if (!sized) {
        const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SM::kMaxBytes);
        if (e != cudaSuccess) return e;
        sized = true;
    }
    const int virt = x->rows * (x->n_heads / x->n_kv_heads), hpb = (virt + n_splits - 1) / n_splits;
    const size_t smem = SM::kSlots + SM::slots_bytes(n_splits * hpb, hpb);
    const dim3 grid((unsigned)x->n_kv_heads, (unsigned)n_splits), cluster(1, (unsigned)n_splits, 1);
    return tsr_pdl::launch_ex(kernel, grid, kPWarps * 32, &cluster, smem, st, pdl, x->q,
                              static_cast<const __nv_bfloat16 *>(kv->k), static_cast<const __nv_bfloat16 *>(kv->v),
                              x->rows, x->n_heads, x->n_kv_heads, x->n_heads / x->n_kv_heads, kv->token_stride,
                              kv->head_stride, x->pos0, dev_pos0, x->window, x->scale * 1.4426950408889634f,
                              n_splits, pg, x->out);
}

// One packed_kernel launch (packed_reads holds; 1 <= n_splits <= kPMaxSplits).
inline cudaError_t launch_packed(int n_splits, cudaStream_t st, bool pdl, const tsr_attn_args *x,
                                 const tsr_kv_view *kv, const int32_t *dev_pos0) {
    const Pages pg = {kv->block_table, kv->block_size, kv->block_stride};
    const int virt = x->rows * (x->n_heads / x->n_kv_heads), mt = virt <= 16 ? 1 : virt <= 32 ? 2 : 4;
    const bool paged = kv->layout == TSR_KV_PAGED;
    switch (x->head_dim * 100 + mt * 10 + (paged ? 1 : 0)) {
#define CASE(HD, MT, P) \
    case HD * 100 + MT * 10 + P: return launch_packed_as<HD, MT, (P) != 0>(n_splits, st, pdl, x, kv, pg, dev_pos0);
        CASE(64, 1, 0) CASE(64, 2, 0) CASE(64, 4, 0) CASE(64, 1, 1) CASE(64, 2, 1) CASE(64, 4, 1)
        CASE(128, 1, 0) CASE(128, 2, 0) CASE(128, 4, 0) CASE(128, 1, 1) CASE(128, 2, 1) CASE(128, 4, 1)
#undef CASE
    }
    return cudaErrorInvalidValue;
}

} // namespace cuda_attn

#endif // CUDA_ATTN_PACKED_CUH
