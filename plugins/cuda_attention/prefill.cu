// prefill.cu - causal attention of many query rows over bf16 KV (contiguous,
// or paged: each key's row found through the block table),
// flash-attention-2 style on tensor cores (mma.sync m16n8k16, bf16 in, f32
// accumulate).
//
// Grid (row blocks, KV heads); 4 warps per block. A block holds 64 "virtual
// rows": v = i * group + hg is query row r0 + i under query head
// kvh * group + hg, so every K/V tile loaded into shared memory serves all
// the query heads of the KV head's group (GQA). Each warp owns 16 virtual
// rows and walks the block's key tiles (64 keys, double-buffered with
// cp.async), keeping its scores in registers: S = Q K^T, causal / window
// mask, online softmax (running max and sum in f32, base-2 exponentials),
// O += P V, O / sum at the end.
//
// Exactness: q (f32) and the probabilities P (f32) are each split into
// hi = bf16(x) and lo = bf16(x - hi); both halves go through the tensor
// cores against the stored bf16 K and V (products of two bf16 are exact in
// f32), so each term keeps 16 significant bits and the sums are f32.
//
// Fragment layouts: mma.cuh. ldmatrix x4: lanes 8m..8m+7 give the row
// addresses of 8x8 matrix m, and register m of lane L receives row L/4,
// columns 2(L%4)..+1 of it (.trans: column L/4, rows 2(L%4)..+1).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "plugins/cuda_attention/merge.cuh"
#include "plugins/cuda_attention/mma.cuh"
#include "plugins/cuda_attention/prefill.h"

namespace {

constexpr int kBM = 64;            // virtual rows per block
constexpr int kBN = 64;            // keys per tile
constexpr int kWarps = kBM / 16;   // 16 virtual rows per warp
constexpr int kThreads = 32 * kWarps;

template <int HD>
struct Layout {
    static_assert(HD % 16 == 0 && HD >= 16 && HD <= 128, "head_dim: 16, 32, 64 or 128");
    // bf16 elements per shared-memory row: a multiple of 8 (16-byte rows for
    // ldmatrix and cp.async) whose 8 consecutive rows start in distinct
    // 4-bank groups (conflict-free ldmatrix).
    static constexpr int kStride = HD + 8;
    static constexpr int kQ = kBM * kStride;   // one of q_hi, q_lo
    static constexpr int kKV = kBN * kStride;  // one K or V buffer
    static constexpr size_t kBytes = (size_t)(2 * kQ + 4 * kKV) * sizeof(__nv_bfloat16);
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)),
                 "l"(__cvta_generic_to_global(src))
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const __nv_bfloat16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const __nv_bfloat16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

using cuda_attn::mma_bf16;
using cuda_attn::Pages;
using cuda_attn::split_pair;

// Keys [t0, t0 + kBN) of KV head kvh into one buffer: cp.async for keys
// <= last, zeros past it (never read from global memory).
template <int HD, bool PAGED>
__device__ __forceinline__ void load_tile(__nv_bfloat16 *ks, __nv_bfloat16 *vs, const __nv_bfloat16 *K,
                                          const __nv_bfloat16 *V, int t0, int last, int kvh, int64_t ts,
                                          int64_t hs, const Pages &pg) {
    constexpr int kPieces = HD / 8; // 16-byte pieces per key
    constexpr int S = Layout<HD>::kStride;
    for (int idx = threadIdx.x; idx < kBN * kPieces; idx += kThreads) {
        const int r = idx / kPieces, c = (idx % kPieces) * 8, t = t0 + r;
        __nv_bfloat16 *kd = ks + r * S + c, *vd = vs + r * S + c;
        if (t <= last) {
            const int64_t off = cuda_attn::key_row<PAGED>(t, ts, pg) + (int64_t)kvh * hs + c;
            cp_async16(kd, K + off);
            cp_async16(vd, V + off);
        } else {
            *reinterpret_cast<uint4 *>(kd) = make_uint4(0u, 0u, 0u, 0u);
            *reinterpret_cast<uint4 *>(vd) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
    cp_async_commit();
}

template <int HD, bool PAGED>
__global__ void __launch_bounds__(kThreads, 2)
prefill_kernel(const float *q, const __nv_bfloat16 *K, const __nv_bfloat16 *V, float *__restrict__ out, int rows,
               int pos0, const int32_t *dev_pos0, int n_heads,
               int group, int rows_per_block, int64_t ts, int64_t hs, int window, float scale_log2, Pages pg,
               float *__restrict__ part, int n_splits) {
    tsr_pdl::enter(); // launched as a programmatic dependent: kernels/cuda/pdl.cuh
    if (dev_pos0) pos0 = *dev_pos0; // a captured pass: the position of this replay
    using L = Layout<HD>;
    constexpr int S = L::kStride;
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16 *q_hi = reinterpret_cast<__nv_bfloat16 *>(smem);
    __nv_bfloat16 *q_lo = q_hi + L::kQ;
    __nv_bfloat16 *k_s = q_lo + L::kQ; // [2][kBN][S]
    __nv_bfloat16 *v_s = k_s + 2 * L::kKV;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kvh = blockIdx.y;
    const int r0 = (gridDim.x - 1 - blockIdx.x) * rows_per_block; // latest rows (most keys) first
    const int r_end = min(rows, r0 + rows_per_block);
    const int n_virt = rows_per_block * group; // <= kBM

    // Keys of the block: [kb0, kb1]; first keys grow with the row.
    const int kb1 = pos0 + r_end - 1;
    const int kb0 = window > 0 ? max(0, pos0 + r0 - window + 1) : 0;
    const int n_tiles = (kb1 - kb0 + kBN) / kBN;
    // Key splits (blockIdx.z, n_splits > 1 with part): this block's tiles [j0, j1).
    const int per = (n_tiles + n_splits - 1) / n_splits;
    const int j0 = min(n_tiles, (int)blockIdx.z * per), j1 = min(n_tiles, j0 + per);

    if (j0 < j1) load_tile<HD, PAGED>(k_s, v_s, K, V, kb0 + j0 * kBN, kb1, kvh, ts, hs, pg);

    // Q as hi and lo bf16 halves; virtual rows past the block's rows are 0.
    for (int idx = threadIdx.x; idx < kBM * HD; idx += kThreads) {
        const int v = idx / HD, d = idx % HD, i = v / group, hg = v % group;
        float x = 0.0f;
        if (v < n_virt && r0 + i < rows) x = q[((int64_t)(r0 + i) * n_heads + kvh * group + hg) * HD + d];
        const __nv_bfloat16 hi = __float2bfloat16_rn(x);
        q_hi[v * S + d] = hi;
        q_lo[v * S + d] = __float2bfloat16_rn(x - __bfloat162float(hi));
    }

    // This thread's two rows (g and g + 8 of the warp's 16) see keys [lo, hi];
    // a row past the block's rows sees none (lo > hi).
    const int vb = warp * 16;
    int key_lo[2], key_hi[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int v = vb + (lane >> 2) + 8 * h, i = v / group;
        if (v < n_virt && r0 + i < rows) {
            key_hi[h] = pos0 + r0 + i;
            key_lo[h] = window > 0 ? max(0, key_hi[h] - window + 1) : 0;
        } else {
            key_hi[h] = -1;
            key_lo[h] = INT_MAX;
        }
    }
    int warp_lo = min(key_lo[0], key_lo[1]), warp_hi = max(key_hi[0], key_hi[1]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        warp_lo = min(warp_lo, __shfl_xor_sync(0xffffffffu, warp_lo, o));
        warp_hi = max(warp_hi, __shfl_xor_sync(0xffffffffu, warp_hi, o));
    }

    float acc[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f}; // row_sum: this thread's columns

    for (int j = j0; j < j1; j++) {
        if (j + 1 < j1) {
            const int b = (j + 1 - j0) & 1;
            load_tile<HD, PAGED>(k_s + b * L::kKV, v_s + b * L::kKV, K, V, kb0 + (j + 1) * kBN, kb1, kvh, ts, hs, pg);
            cp_async_wait<1>(); // tile j has landed (this thread's copies)
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); // everyone's copies of tile j (and Q) visible
        const int t0 = kb0 + j * kBN;
        if (t0 <= warp_hi && t0 + kBN - 1 >= warp_lo) { // warp-uniform: some key of the tile is seen
            const __nv_bfloat16 *ks = k_s + ((j - j0) & 1) * L::kKV, *vs = v_s + ((j - j0) & 1) * L::kKV;
            float s[kBN / 8][4];
#pragma unroll
            for (int n = 0; n < kBN / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            // S = Q K^T over head_dim in steps of 16.
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t ah[4], al[4];
                const int qoff = (vb + (lane & 15)) * S + kk * 16 + (lane >> 4) * 8;
                ldsm_x4(ah, q_hi + qoff);
                ldsm_x4(al, q_lo + qoff);
#pragma unroll
                for (int np = 0; np < kBN / 16; np++) { // key n-tiles 2np, 2np + 1
                    uint32_t b[4];
                    ldsm_x4(b, ks + (np * 16 + ((lane >> 4) << 3) + (lane & 7)) * S + kk * 16 + ((lane >> 3) & 1) * 8);
                    mma_bf16(s[2 * np], al, b[0], b[1]);
                    mma_bf16(s[2 * np], ah, b[0], b[1]);
                    mma_bf16(s[2 * np + 1], al, b[2], b[3]);
                    mma_bf16(s[2 * np + 1], ah, b[2], b[3]);
                }
            }
            // Mask, scale to base 2, new running max per row.
            float mx[2] = {row_max[0], row_max[1]};
#pragma unroll
            for (int n = 0; n < kBN / 8; n++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int h = c >> 1, key = t0 + n * 8 + 2 * (lane & 3) + (c & 1);
                    float x = s[n][c] * scale_log2;
                    if (key < key_lo[h] || key > key_hi[h]) x = -INFINITY;
                    s[n][c] = x;
                    mx[h] = fmaxf(mx[h], x);
                }
            float base[2], corr[2];
#pragma unroll
            for (int h = 0; h < 2; h++) { // the 4 lanes of a row share its max
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                base[h] = mx[h] == -INFINITY ? 0.0f : mx[h]; // a row with no key yet: all weights 0
                corr[h] = exp2f(row_max[h] - base[h]);
                row_max[h] = mx[h];
            }
            float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int n = 0; n < kBN / 8; n++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const float p = exp2f(s[n][c] - base[c >> 1]);
                    s[n][c] = p;
                    tile_sum[c >> 1] += p;
                }
#pragma unroll
            for (int h = 0; h < 2; h++) row_sum[h] = row_sum[h] * corr[h] + tile_sum[h];
#pragma unroll
            for (int n = 0; n < HD / 8; n++) {
                acc[n][0] *= corr[0];
                acc[n][1] *= corr[0];
                acc[n][2] *= corr[1];
                acc[n][3] *= corr[1];
            }
            // O += P V over the tile's keys in steps of 16: the C fragments of
            // key n-tiles 2kk and 2kk + 1 are the A fragment of the step.
#pragma unroll
            for (int kk = 0; kk < kBN / 16; kk++) {
                uint32_t ph[4], pl[4];
                split_pair(s[2 * kk][0], s[2 * kk][1], &ph[0], &pl[0]);
                split_pair(s[2 * kk][2], s[2 * kk][3], &ph[1], &pl[1]);
                split_pair(s[2 * kk + 1][0], s[2 * kk + 1][1], &ph[2], &pl[2]);
                split_pair(s[2 * kk + 1][2], s[2 * kk + 1][3], &ph[3], &pl[3]);
#pragma unroll
                for (int dp = 0; dp < HD / 16; dp++) { // dim n-tiles 2dp, 2dp + 1
                    uint32_t b[4];
                    ldsm_x4_trans(b, vs + (kk * 16 + (lane & 15)) * S + dp * 16 + (lane >> 4) * 8);
                    mma_bf16(acc[2 * dp], pl, b[0], b[1]);
                    mma_bf16(acc[2 * dp], ph, b[0], b[1]);
                    mma_bf16(acc[2 * dp + 1], pl, b[2], b[3]);
                    mma_bf16(acc[2 * dp + 1], ph, b[2], b[3]);
                }
            }
        }
        __syncthreads(); // the buffer of tile j is refilled at iteration j + 1
    }

#pragma unroll
    for (int h = 0; h < 2; h++) {
        row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
        row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
    }
    if (part) { // this split's max (natural-log units), sum and unnormalised output (merge.cuh)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int v = vb + (lane >> 2) + 8 * h, i = v / group, hg = v % group;
            if (v >= n_virt || r0 + i >= rows) continue;
            float *pp = part + (((int64_t)(r0 + i) * n_heads + kvh * group + hg) * n_splits + blockIdx.z) * (2 + HD);
            if ((lane & 3) == 0) {
                pp[0] = row_max[h] == -INFINITY ? -INFINITY : row_max[h] * 0.6931471805599453f;
                pp[1] = row_sum[h];
            }
#pragma unroll
            for (int n = 0; n < HD / 8; n++) {
                pp[2 + n * 8 + 2 * (lane & 3)] = acc[n][2 * h];
                pp[2 + n * 8 + 2 * (lane & 3) + 1] = acc[n][2 * h + 1];
            }
        }
        return;
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int v = vb + (lane >> 2) + 8 * h, i = v / group, hg = v % group;
        if (v >= n_virt || r0 + i >= rows) continue;
        float *o = out + ((int64_t)(r0 + i) * n_heads + kvh * group + hg) * HD + 2 * (lane & 3);
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            o[n * 8] = acc[n][2 * h] / row_sum[h];
            o[n * 8 + 1] = acc[n][2 * h + 1] / row_sum[h];
        }
    }
}

template <int HD, bool PAGED>
cudaError_t launch(const tsr_attn_args *a, const int32_t *dev_pos0, float *part, int n_splits, cudaStream_t st,
                   bool pdl) {
    const tsr_kv_view *kv = a->kv;
    const int group = a->n_heads / a->n_kv_heads, rows_per_block = kBM / group;
    const size_t smem = Layout<HD>::kBytes;
    cudaError_t e =
        cudaFuncSetAttribute(prefill_kernel<HD, PAGED>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((a->rows + rows_per_block - 1) / rows_per_block, a->n_kv_heads, part ? n_splits : 1);
    const float scale_log2 = a->scale * 1.4426950408889634f; // exp(x) = exp2(x * log2(e))
    const Pages pg = {kv->block_table, kv->block_size, kv->block_stride};
    e = tsr_pdl::launch(prefill_kernel<HD, PAGED>, grid, kThreads, smem, st, pdl, a->q,
                        static_cast<const __nv_bfloat16 *>(kv->k), static_cast<const __nv_bfloat16 *>(kv->v), a->out,
                        a->rows, a->pos0, dev_pos0, a->n_heads, group, rows_per_block, kv->token_stride,
                        kv->head_stride, a->window, scale_log2, pg, part, part ? n_splits : 1);
    if (e != cudaSuccess || !part) return e;
    return cuda_attn::launch_merge(part, a->out, a->rows * a->n_heads, HD, n_splits, st, pdl);
}

template <int HD>
cudaError_t launch(const tsr_attn_args *a, const int32_t *dev_pos0, float *part, int n_splits, cudaStream_t st,
                   bool pdl) {
    return a->kv->layout == TSR_KV_PAGED ? launch<HD, true>(a, dev_pos0, part, n_splits, st, pdl)
                                         : launch<HD, false>(a, dev_pos0, part, n_splits, st, pdl);
}

} // namespace

extern "C" int cuda_attn_prefill_supported(const tsr_attn_args *a) {
    const tsr_kv_view *kv = a ? a->kv : nullptr;
    if (!kv || !a->q || !a->out || kv->dtype != TSR_DTYPE_BF16) return 0;
    if (kv->layout == TSR_KV_PAGED) {
        if (!kv->block_table || kv->block_size <= 0 || kv->block_stride % 8 || kv->block_stride < 0) return 0;
    } else if (kv->layout != TSR_KV_CONTIGUOUS) {
        return 0;
    }
    if (a->rows < 1 || a->pos0 < 0 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads ||
        a->n_heads / a->n_kv_heads > kBM || a->n_kv_heads > 65535)
        return 0;
    if (a->head_dim != 16 && a->head_dim != 32 && a->head_dim != 64 && a->head_dim != 128) return 0;
    if (kv->n_tokens - a->rows < a->pos0 || kv->n_kv_heads < a->n_kv_heads || kv->head_dim != a->head_dim) return 0;
    if ((reinterpret_cast<uintptr_t>(kv->k) | reinterpret_cast<uintptr_t>(kv->v)) % 16 || kv->token_stride % 8 ||
        kv->head_stride % 8 || kv->token_stride < 0 || kv->head_stride < 0)
        return 0;
    return 1;
}

extern "C" int cuda_attn_prefill_split(const tsr_attn_args *a, const int32_t *dev_pos0, float *part, int n_splits,
                                       int pdl, void *stream) {
    if (!cuda_attn_prefill_supported(a) || n_splits < 1 || (n_splits > 1 && !part)) return (int)cudaErrorInvalidValue;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (n_splits == 1) part = nullptr;
    switch (a->head_dim) {
    case 16: return (int)launch<16>(a, dev_pos0, part, n_splits, st, pdl != 0);
    case 32: return (int)launch<32>(a, dev_pos0, part, n_splits, st, pdl != 0);
    case 64: return (int)launch<64>(a, dev_pos0, part, n_splits, st, pdl != 0);
    default: return (int)launch<128>(a, dev_pos0, part, n_splits, st, pdl != 0);
    }
}

extern "C" int cuda_attn_prefill_at(const tsr_attn_args *a, const int32_t *dev_pos0, void *stream) {
    return cuda_attn_prefill_split(a, dev_pos0, nullptr, 1, 0, stream);
}

extern "C" int cuda_attn_prefill(const tsr_attn_args *a, void *stream) { return cuda_attn_prefill_at(a, nullptr, stream); }
