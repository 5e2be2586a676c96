// row_dot.cuh - the CUDA-core dot products of the one-row GEMVs (gemv_row.cuh
// over whole rows, gemv_tile.cuh over gemv_mma.cuh's 16-row tiles): a lane's
// 16 weight bytes against their activations, and the activations staged
// once a block in shared memory (E4M3; gemv_row's XS). Both kernels do the
// same arithmetic with these, in another order.
#ifndef TSR_ROW_DOT_CUH
#define TSR_ROW_DOT_CUH

#include "gemv_mma.cuh"

namespace tsr_row {

using tsr_mma::Args;
using tsr_mma::kBf16;
using tsr_mma::kFp8;

// Lane-load of 16 bytes against its activations: 8 bf16 or 16 E4M3 weights.
template <int WK> struct Piece {
    static constexpr int k = WK == kBf16 ? 8 : 16;
};

template <int WK>
__device__ __forceinline__ float dot_piece(const uint4 &w, const float *xv, float acc) {
    const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
    if (WK == kBf16) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&wv[j]));
            acc = fmaf(f.x, xv[2 * j], acc);
            acc = fmaf(f.y, xv[2 * j + 1], acc);
        }
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t lo = tsr_mma::e4m3_pair(wv[j], false), hi = tsr_mma::e4m3_pair(wv[j], true);
            const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&lo));
            const float2 b = __half22float2(*reinterpret_cast<const __half2 *>(&hi));
            acc = fmaf(a.x, xv[4 * j], acc);
            acc = fmaf(a.y, xv[4 * j + 1], acc);
            acc = fmaf(b.x, xv[4 * j + 2], acc);
            acc = fmaf(b.y, xv[4 * j + 3], acc);
        }
    }
    return acc;
}

// The 16 staged activations (rounded, natural column order in xs) of the
// 16 stored E4M3 bytes at k, as load_x_e4m3 takes them from x.
__device__ __forceinline__ void load_xs(const float *xs, int k, int cols, float *v) {
    if (k >= cols / 512 * 512) {
#pragma unroll
        for (int i = 0; i < 16; i += 4) {
            const float4 f = *reinterpret_cast<const float4 *>(xs + k + i);
            v[i] = f.x, v[i + 1] = f.y, v[i + 2] = f.z, v[i + 3] = f.w;
        }
        return;
    }
    const int b = (int)tsr_mma::e4m3_step_rot(k, false); // bytes k + 4 q hold columns b + 128 q
    constexpr int kQ = (int)tsr_mma::e4m3_step_rot(4, false);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const float4 f = *reinterpret_cast<const float4 *>(xs + b + kQ * q);
        v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
    }
}

// An E4M3 activation as both kernels take it: times 2^-4, rounded to f16.
__device__ __forceinline__ float round_x(float v) { return __half2float(__float2half_rn(v * 0.0625f)); }

// The most columns whose activations a block stages: x (f32) and the
// kernels' other shared memory (under 1 KiB) within the 48 KiB a block has
// without asking: at most 47 KiB, 12,032 columns.
constexpr int kStageMaxCols = 47 * 1024 / 4;

// The activations x (p.cols of them, a multiple of 4) staged by a block of
// NT threads into xs: times 2^-4 and rounded to f16 (round_x), or with
// NORM times the norm's weights p.nw in f32 (not rounded: the stream before
// its norm may lie outside f16's range), returning the sum of the squares
// of x (each thread its columns, each warp's across its lanes, the NT / 32
// warps' in warp order through warp_ss[NT / 32]: the same in every thread
// and every block). Ends with a barrier, after which xs is the block's.
template <bool NORM, int NT = 256>
__device__ __forceinline__ float stage_x(const Args &p, const float *x, float *xs, float *warp_ss) {
    float ss = 0.0f;
    for (int c = threadIdx.x * 4; c < p.cols; c += NT * 4) {
        const float4 f = tsr_pdl::load(x + c);
        if constexpr (NORM) {
            const float4 g = __ldg(reinterpret_cast<const float4 *>(p.nw + c));
            ss = fmaf(f.x, f.x, ss), ss = fmaf(f.y, f.y, ss), ss = fmaf(f.z, f.z, ss), ss = fmaf(f.w, f.w, ss);
            *reinterpret_cast<float4 *>(xs + c) = make_float4(f.x * g.x, f.y * g.y, f.z * g.z, f.w * g.w);
        } else {
            *reinterpret_cast<float4 *>(xs + c) = make_float4(round_x(f.x), round_x(f.y), round_x(f.z), round_x(f.w));
        }
    }
    if constexpr (NORM) {
        for (int s = 16; s > 0; s >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, s);
        if ((threadIdx.x & 31) == 0) warp_ss[threadIdx.x >> 5] = ss;
    }
    __syncthreads();
    if constexpr (NORM) {
        ss = 0.0f;
        for (int w = 0; w < NT / 32; w++) ss += warp_ss[w];
    }
    return ss;
}

} // namespace tsr_row

#endif // TSR_ROW_DOT_CUH
