// f8row_lab - the one-row E4M3 GEMV on the FP8 tensor cores, the weights as
// cuda_gemv_fp8 stores them, the activations quantised once a block into
// shared memory. Not part of the engine; on the device:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o f8row_lab tools/cuda_lab/f8row_lab.cu && ./f8row_lab
//
// The question behind it (issue #7): f8mma_lab (twenty-ninth session) ran
// mma.m16n8k32.e4m3 on the codes as they are, with the activations as two
// E4M3 halves (hi = e4m3(x / sx), lo = e4m3(x / sx - hi)), 3-20% faster a
// GEMV than production (o 2.47 against 2.06 TB/s, down 3.61 against 3.07),
// but with its weights in a tile layout of its own and the activations
// quantised by a kernel of their own (3.4-6 us a call, more than the gain);
// quantised by every warp for every chunk, it was slower than production.
// xrow_lab (thirty-first session) showed the middle way for gemv_row:
// the activations prepared once a block into shared memory after the wait,
// the first weights already asked for. Here the same for the tensor-core
// kernel: each block reads all of x, takes its largest |x| (one scale sx a
// vector, the same in every block), writes hi and lo in the stored byte
// order (e4m3_stored_col), and its warps feed the rows' 16-byte pieces as
// they are loaded (gemv_mma's production layout: rows g and g + 8 of a
// 16-row tile, lane t's 16 bytes of each 64-byte chunk) to two k32 mma per
// chunk, B's column 0 hi, column 1 lo. Lossy: ~8 significant bits of each
// activation against f16's 11 in production (the weights' own E4M3 rounding
// is 2^-4), so section (1) reports the error against f64 with exact x.
// Sections: (1) worst |y - f64| / sum |w x| of production and each
// configuration; (2) TB/s of each shape at one row, weights out of L2;
// (3) one token's GEMVs as a graph with programmatic dependent launch,
// production everywhere against this kernel on o and down (the 4,096-row
// matrices production runs on gemv_mma), then on q/k/v too. The "pre"
// configurations take x already quantised in global memory (quant_stored,
// not timed in (2) and (3)): the bound of a producer that writes it so.
#include <cuda_fp8.h>

#include "kernels/cuda/gemv_mma.cuh"
#include "kernels/cuda/gemv_row.cuh"
#include "tools/cuda_lab/lab_util.cuh"

using tsr_mma::Args;
using tsr_mma::kFp8;

// Four activations times inv as E4M3 hi (returned) and lo (*lo), a byte each.
__device__ __forceinline__ uint32_t split4(float4 f, float inv, uint32_t *lo) {
    const float2 p0 = make_float2(f.x * inv, f.y * inv), p1 = make_float2(f.z * inv, f.w * inv);
    const __nv_fp8x2_storage_t h0 = __nv_cvt_float2_to_fp8x2(p0, __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t h1 = __nv_cvt_float2_to_fp8x2(p1, __NV_SATFINITE, __NV_E4M3);
    const __half2_raw r0 = __nv_cvt_fp8x2_to_halfraw2(h0, __NV_E4M3), r1 = __nv_cvt_fp8x2_to_halfraw2(h1, __NV_E4M3);
    const float2 b0 = __half22float2(__half2(r0)), b1 = __half22float2(__half2(r1));
    const __nv_fp8x2_storage_t l0 =
        __nv_cvt_float2_to_fp8x2(make_float2(p0.x - b0.x, p0.y - b0.y), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t l1 =
        __nv_cvt_float2_to_fp8x2(make_float2(p1.x - b1.x, p1.y - b1.y), __NV_SATFINITE, __NV_E4M3);
    *lo = (uint32_t)l0 | (uint32_t)l1 << 16;
    return (uint32_t)h0 | (uint32_t)h1 << 16;
}

// One 16-row tile a block of KW warps (chunk c to warp c % KW, U chunks'
// loads in flight a warp), x staged as above in dynamic shared memory (2 ldw
// bytes: hi, then lo). cols a multiple of 4; bytes past cols zero.
template <int KW, int U, bool PRE = false> __global__ void __launch_bounds__(32 * KW) f8s(const Args p) {
    extern __shared__ __align__(16) uint8_t xsh[];
    __shared__ float red[KW];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16;
    const uint8_t *pa = p.w + (int64_t)min(row0 + g, p.n_out - 1) * p.ldw + 16 * t;
    const uint8_t *pb = p.w + (int64_t)min(row0 + g + 8, p.n_out - 1) * p.ldw + 16 * t;
    const int nch = (int)(p.ldw / 64);
    uint4 a[U], b[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = warp + u * KW;
        if (c < nch) a[u] = tsr_mma::load_w(pa + (int64_t)c * 64), b[u] = tsr_mma::load_w(pb + (int64_t)c * 64);
    }
    tsr_pdl::wait();
    // PRE: hi and lo already in global memory (p.x as bytes: hi [ldw], lo
    // [ldw], then sx as a float): the bound of a producer that writes them
    const uint8_t *xs = PRE ? reinterpret_cast<const uint8_t *>(p.x) : xsh;
    float sx = PRE ? *reinterpret_cast<const float *>(xs + 2 * p.ldw) : 1.0f;
    if (!PRE) {
    float m = 0.0f;
    for (int k = threadIdx.x * 4; k < p.cols; k += 32 * KW * 4) {
        const float4 f = __ldg(reinterpret_cast<const float4 *>(p.x + k));
        m = fmaxf(m, fmaxf(fmaxf(fabsf(f.x), fabsf(f.y)), fmaxf(fabsf(f.z), fabsf(f.w))));
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, s));
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = red[0];
#pragma unroll
    for (int w = 1; w < KW; w++) m = fmaxf(m, red[w]);
    sx = m > 0.0f ? m / 448.0f : 1.0f;
    const float inv = 1.0f / sx;
    for (int k = threadIdx.x * 4; k < p.cols; k += 32 * KW * 4) {
        const float4 f = __ldg(reinterpret_cast<const float4 *>(p.x + k));
        const int64_t sb = tsr_mma::e4m3_stored_col(k, p.cols); // four columns, four bytes
        uint32_t lo;
        *reinterpret_cast<uint32_t *>(xsh + sb) = split4(f, inv, &lo);
        *reinterpret_cast<uint32_t *>(xsh + p.ldw + sb) = lo;
    }
    for (int k = p.cols + threadIdx.x; k < p.ldw; k += 32 * KW) xsh[k] = 0, xsh[p.ldw + k] = 0;
    __syncthreads();
    }
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const uint8_t *xb = xs + (g == 1 ? p.ldw : 0) + 16 * t;
    for (int c0 = warp; c0 < nch; c0 += KW * U) {
        if (c0 != warp)
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + u * KW;
                if (c < nch) a[u] = tsr_mma::load_w(pa + (int64_t)c * 64), b[u] = tsr_mma::load_w(pb + (int64_t)c * 64);
            }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + u * KW;
            if (c >= nch) continue;
            uint4 xv = make_uint4(0, 0, 0, 0);
            if (g < 2)
                xv = PRE ? __ldg(reinterpret_cast<const uint4 *>(xb + 64 * c))
                         : *reinterpret_cast<const uint4 *>(xb + 64 * c);
            mma_e4m3(acc, a[u].x, b[u].x, a[u].y, b[u].y, xv.x, xv.y);
            mma_e4m3(acc, a[u].z, b[u].z, a[u].w, b[u].w, xv.z, xv.w);
        }
    }
    tsr_pdl::trigger();
    // C: rows g (acc 0, 1) and g + 8 (acc 2, 3), columns 2t, 2t + 1: hi and lo at t = 0
    __shared__ float2 part[KW][8];
    if (t == 0) part[warp][g] = make_float2(acc[0] + acc[1], acc[2] + acc[3]);
    __syncthreads();
    if (warp != 0 || t != 0) return;
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int w = 0; w < KW; w++) s0 += part[w][g].x, s1 += part[w][g].y;
    const int r0 = row0 + g, r1 = r0 + 8;
    if (r0 < p.n_out) p.y[r0] = s0 * sx * (p.scale ? p.scale[r0] : 1.0f);
    if (r1 < p.n_out) p.y[r1] = s1 * sx * (p.scale ? p.scale[r1] : 1.0f);
}

struct Cfg {
    const char *name;
    void (*k)(const Args);
    int threads;
};
static const Cfg kCfgs[] = {
    {"kw 16 u 1", f8s<16, 1>, 512}, {"kw 16 u 2", f8s<16, 2>, 512}, {"kw 8 u 1", f8s<8, 1>, 256},
    {"kw 8 u 2", f8s<8, 2>, 256},   {"kw 8 u 4", f8s<8, 4>, 256},   {"kw 4 u 4", f8s<4, 4>, 128},
    {"pre 16 1", f8s<16, 1, true>, 512}, {"pre 16 2", f8s<16, 2, true>, 512}, {"pre 8 2", f8s<8, 2, true>, 256},
    {"pre 8 4", f8s<8, 4, true>, 256},
};
static const int kFirstPre = 6;

// PRE's input: x as hi and lo bytes in the stored order and sx after them
// (one block, as the staging does it), at xq (2 ldw + 4 bytes).
__global__ void quant_stored(const float *x, int cols, int64_t ldw, uint8_t *xq) {
    const float m = lab_block_absmax(x, cols);
    const float sx = m > 0.0f ? m / 448.0f : 1.0f, inv = 1.0f / sx;
    for (int k = threadIdx.x * 4; k < cols; k += blockDim.x * 4) {
        uint32_t lo;
        const int64_t sb = tsr_mma::e4m3_stored_col(k, cols);
        *reinterpret_cast<uint32_t *>(xq + sb) = split4(*reinterpret_cast<const float4 *>(x + k), inv, &lo);
        *reinterpret_cast<uint32_t *>(xq + ldw + sb) = lo;
    }
    for (int64_t k = cols + threadIdx.x; k < ldw; k += blockDim.x) xq[k] = 0, xq[ldw + k] = 0;
    if (threadIdx.x == 0) *reinterpret_cast<float *>(xq + 2 * ldw) = sx;
}
static uint8_t *g_xq; // PRE configurations' input (made from the call's x first)
static const int kNumCfg = sizeof kCfgs / sizeof *kCfgs;

static cudaError_t launch_cfg(int ci, const Args &a, cudaStream_t st, bool pdl, bool quant = true) {
    Args b = a;
    if (ci >= kFirstPre) {
        if (quant) quant_stored<<<1, 1024, 0, st>>>(a.x, a.cols, a.ldw, g_xq);
        b.x = reinterpret_cast<const float *>(g_xq);
    }
    return tsr_pdl::launch(kCfgs[ci].k, dim3((unsigned)((a.n_out + 15) / 16)), dim3(kCfgs[ci].threads),
                           ci >= kFirstPre ? 0 : (size_t)(2 * a.ldw), st, pdl, b);
}

static Args args_for(const uint8_t *w, const float *s, const float *x, float *y, int n_out, int cols) {
    Args a = {};
    a.w = w, a.scale = s, a.x = x, a.y = y, a.n_out = n_out, a.cols = cols;
    a.ldw = tsr_mma::row_bytes(kFp8, cols), a.ldx = cols;
    return a;
}

// Worst |y - f64| / sum |w x| with x exact, the stored byte b of a row
// against column e4m3_step_rot(b) (the production layout).
static double worst_exact(const LabCase &c, int n_out, int cols) {
    double worst = 0;
    for (int o = 0; o < n_out; o++) {
        double sum = 0, mag = 0;
        for (int b = 0; b < cols; b++) {
            const int col = b >= cols / 512 * 512 ? b : (int)tsr_mma::e4m3_step_rot(b, false);
            const double v = lab_case_w(c, 1, o, b) * c.hx[col];
            sum += v, mag += fabs(v);
        }
        const double e = fabs(c.hy[o] - sum) / (mag + 1e-30);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

static void check(cudaStream_t st) {
    const int shapes[][2] = {{64, 4096}, {48, 14336}, {40, 1536}, {16, 1028}};
    for (int ci = -1; ci < kNumCfg; ci++) {
        double worst = 0;
        for (float amp : {1.0f, 100.0f, 0.01f})
            for (auto &s : shapes) {
                const int n = s[0], cols = s[1];
                const int64_t ldw = tsr_mma::row_bytes(kFp8, cols);
                LabCase c = lab_case_new(1, n, cols, ldw, 1, amp);
                const Args a = args_for(c.dw, c.ds, c.dx, c.dy, n, cols);
                CK(ci < 0 ? tsr_row::launch_decode<kFp8>(a, 1, tsr_row::kRowDense, st, false)
                          : launch_cfg(ci, a, st, false));
                CK(cudaStreamSynchronize(st));
                CK(cudaMemcpy(c.hy, c.dy, sizeof(float) * n, cudaMemcpyDeviceToHost));
                const double e = worst_exact(c, n, cols);
                if (!(e <= worst)) worst = e;
                lab_case_free(&c);
            }
        printf("  %-12s %.3g\n", ci < 0 ? "production" : kCfgs[ci].name, worst);
    }
}

int main(void) {
    CK(cudaMalloc(&g_xq, 2 * 14336 + 64));
    LabBufs b;
    cudaStream_t st = lab_start(check, (size_t)8 << 30, &b);
    CK(cudaMemset(g_xq, 0, 2 * 14336 + 64)); // PRE's timed input: zeros (sx 0)
    float *xb;
    CK(cudaMalloc(&xb, 128256 * 4));
    CK(cudaMemset(xb, 0, 128256 * 4));
    printf("\n(2) TB/s at one row, weights out of L2 (two rounds): production | configurations\n");
    for (int round = 0; round < 2; round++)
        for (int si = 0; si < 4; si++) {
            const Shape &S = kShapes[si];
            const size_t bytes = (size_t)S.out * S.in, copies = b.pool_bytes / bytes < 64 ? b.pool_bytes / bytes : 64;
            printf("%-20s", S.name);
            for (int ci = -1; ci < kNumCfg; ci++) {
                const float ms = lab_calls_ms(st, 40, [&](int k) {
                    const Args a = args_for(b.pool + (size_t)(k % copies) * bytes, b.s, b.x, b.y, S.out, S.in);
                    CK(ci < 0 ? tsr_row::launch_decode<kFp8>(a, 1, tsr_row::kRowDense, st, false)
                              : launch_cfg(ci, a, st, false, false));
                });
                printf(" | %s%4.2f", ci < 0 ? "" : "", bytes / ms / 1e9);
            }
            printf("\n");
        }
    printf("\n(3) one token's GEMVs as a graph with PDL, ms (floor at 4.29 TB/s %.3f): production | each "
           "configuration on o and down | on q/k/v, o and down\n",
           lab_token_bytes(1) / 4.29e9);
    for (int round = 0; round < 3; round++) {
        for (int ci = -1; ci < kNumCfg; ci++)
            for (int with_qkv = 0; with_qkv < (ci < 0 ? 1 : 2); with_qkv++) {
                const float t = lab_token_args_ms<Args>(st, b.pool, 1, b.s, b.x, xb, [&](Args &a, int sh) {
                    const bool mine = ci >= 0 && (sh == 1 || sh == 3 || (with_qkv && sh == 0));
                    CK(mine ? launch_cfg(ci, a, st, true, false)
                            : tsr_row::launch_decode<kFp8>(a, 1, tsr_row::kRowDense, st, true));
                });
                printf("%s%.3f", ci < 0 ? "" : " | ", t);
            }
        printf("\n");
    }
    return 0;
}
