// merge.cuh - the merge of key splits shared by cuda_attention's kernels
// (split-K decode in cuda_attention.cu, the tensor-core kernel's key splits
// in prefill.cu): each split of a (row, query head) leaves its running max
// m (natural-log units), sum l and unnormalised output o[hd] in
// part[(row * n_heads + head) * n_splits + split][2 + hd]; then either the
// last block of a group of splits to finish merges them (no second launch:
// the decode kernel, whose block merges its own few heads) or a pass of its
// own does, a warp per (row, head) (the tensor-core kernel, whose block
// holds up to 64 (row, head) pairs: merging them in one block is serial).
#ifndef CUDA_ATTN_MERGE_CUH
#define CUDA_ATTN_MERGE_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/pdl.cuh"

namespace cuda_attn {

// One warp merges a query head's n_splits partial results (max m, sum l,
// unnormalised o, written by other blocks: read through L2) into out[hd]:
// weights exp(m_s - M) / L, each lane its DPL dims. Loads are issued in
// batches so that the merge waits on memory a few times, not per split.
template <int DPL>
__device__ __forceinline__ void merge_head(const float *pp, int n_splits, int hd, int lane, float *out) {
    constexpr int B = 32 / DPL; // splits whose values are in flight at once
    const int64_t stride = 2 + hd;
    const int d0 = lane * DPL;
    float m0 = -INFINITY, l0 = 0.0f; // split `lane` (the first 32 stay in registers)
    if (lane < n_splits) m0 = __ldcg(pp + lane * stride), l0 = __ldcg(pp + lane * stride + 1);
    float M = m0;
    for (int s = lane + 32; s < n_splits; s += 32) M = fmaxf(M, __ldcg(pp + s * stride));
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float L = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;
    for (int s0 = 0; s0 < n_splits; s0 += 32) {
        float m = m0, l = l0; // split s0 + lane
        if (s0 > 0) {
            m = -INFINITY, l = 0.0f;
            if (s0 + lane < n_splits) m = __ldcg(pp + (s0 + lane) * stride), l = __ldcg(pp + (s0 + lane) * stride + 1);
        }
        const float w = m > -INFINITY ? __expf(m - M) : 0.0f;
        L += l * w;
        const int n = min(32, n_splits - s0);
        for (int j0 = 0; j0 < n; j0 += B) {
            float v[B][DPL];
#pragma unroll
            for (int j = 0; j < B; j++)
#pragma unroll
                for (int i = 0; i < DPL; i++)
                    v[j][i] = j0 + j < n && d0 + i < hd ? __ldcg(pp + (s0 + j0 + j) * stride + 2 + d0 + i) : 0.0f;
#pragma unroll
            for (int j = 0; j < B; j++) {
                const float wj = __shfl_sync(0xffffffffu, w, (j0 + j) & 31);
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[i] = fmaf(wj, v[j][i], acc[i]);
            }
        }
    }
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
#pragma unroll
    for (int i = 0; i < DPL; i++)
        if (d0 + i < hd) out[d0 + i] = acc[i] / L;
}

// Called by every thread of a block after it wrote its split's results:
// true in the one block of the count's group to finish last (the counter is
// left at zero for the next pass); that block may then read every split.
__device__ __forceinline__ bool last_of_splits(unsigned *count, int n_splits) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(count, 1u) == (unsigned)n_splits - 1;
        if (last) *count = 0;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// The merge as a pass of its own: a warp per (row, head), grid rows * n_heads.
template <int DPL>
__global__ void merge_kernel(const float *part, float *out, int hd, int n_splits) {
    tsr_pdl::enter(); // launched as a programmatic dependent: kernels/cuda/pdl.cuh
    const int64_t rh = blockIdx.x; // row * n_heads + head
    merge_head<DPL>(part + rh * n_splits * (2 + hd), n_splits, hd, threadIdx.x, out + rh * hd);
}

inline cudaError_t launch_merge(const float *part, float *out, int rows_heads, int hd, int n_splits,
                                cudaStream_t st, bool pdl) {
    switch ((hd + 31) / 32) {
#define CUDA_ATTN_MERGE_CASE(D)                                                                           \
    case D: return tsr_pdl::launch(merge_kernel<D>, rows_heads, 32, 0, st, pdl, part, out, hd, n_splits);
        CUDA_ATTN_MERGE_CASE(1) CUDA_ATTN_MERGE_CASE(2) CUDA_ATTN_MERGE_CASE(3) CUDA_ATTN_MERGE_CASE(4)
        CUDA_ATTN_MERGE_CASE(5) CUDA_ATTN_MERGE_CASE(6) CUDA_ATTN_MERGE_CASE(7) CUDA_ATTN_MERGE_CASE(8)
#undef CUDA_ATTN_MERGE_CASE
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

} // namespace cuda_attn

#endif // CUDA_ATTN_MERGE_CUH
