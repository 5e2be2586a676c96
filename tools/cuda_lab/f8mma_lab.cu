// f8mma_lab - could the one-row E4M3 GEMV run on the FP8 tensor cores,
// weights as stored, with the activations as two E4M3 halves?
// Not part of the engine; run by hand on the device:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I. -o f8mma_lab tools/cuda_lab/f8mma_lab.cu && ./f8mma_lab
//
// The question behind it (issue #7): E4M3 decode is far from its floor
// (2.19 ms a token for the GEMVs alone against 1.75), and its short
// matrices read well below the DRAM rate even from L2 (the o projection
// 8.9 us from L2 against 10.1 from DRAM: twenty-ninth session): each lane
// widens its codes to f16 (8 conversions a 16 bytes) for f16 mma. Here the
// codes go to mma.m16n8k32 e4m3 as they are stored; the activations,
// scaled by one factor sx per vector, are cut into hi = e4m3(x / sx) and
// lo = e4m3(x / sx - hi) (about 8 significant bits between them, against
// f16's 11 in the production kernels: lossy, and so its error is reported),
// column 0 of B holding hi, column 1 lo. Weights in 16-row tiles, each 64-
// column chunk of a tile 1 KiB contiguous in the order the lanes read it
// (two 512-byte loads a warp a chunk), as a plugin could store them at load.
//
// Reports (1) the worst error against f64 relative to sum |w x| for a few
// shapes and magnitudes, (2) per shape, weights out of L2, the production
// launcher (launch_decode<kFp8>, its column permutation) against this
// kernel at several warps a tile and chunks in flight, with the
// activations quantised by their own kernel first (quant_x, timed apart)
// or in the kernel with a scale per chunk ("q"). Measured (twenty-ninth
// session, BENCHMARKS.md): quantised first, 3-20% faster a GEMV than
// production but quant_x costs 3.4-6 us a call; quantised in the kernel,
// slower than production at every shape.
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/gemv_row.cuh"
#include "tools/cuda_lab/lab_util.cuh"

using tsr_mma::Args;
using tsr_mma::kFp8;

// x [cols] -> xq: per 64-column chunk c, 64 bytes of hi then 64 of lo; *sx
// the factor (largest |x| / 448). One block.
__global__ void quant_x(const float *x, int cols, uint8_t *xq, float *sx) {
    const float m = lab_block_absmax(x, cols), s = m > 0.0f ? m / 448.0f : 1.0f, inv = 1.0f / s;
    if (threadIdx.x == 0) *sx = s;
    for (int k = threadIdx.x; k < cols; k += blockDim.x) {
        const float v = x[k] * inv;
        const __nv_fp8_e4m3 h(v);
        const __nv_fp8_e4m3 l(v - (float)h);
        xq[128 * (k / 64) + k % 64] = h.__x;
        xq[128 * (k / 64) + 64 + k % 64] = l.__x;
    }
}

// The weights of chunks c0, c0 + KW, ... (U of them, those below nch) of a
// lane's tile (tw: the tile's first chunk plus the lane's 16 bytes): rows
// g into a, rows g + 8 into b.
template <int KW, int U>
__device__ __forceinline__ void load_chunks(const uint8_t *tw, int c0, int nch, uint4 *a, uint4 *b) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = c0 + u * KW;
        if (c < nch) {
            a[u] = tsr_mma::load_w(tw + (int64_t)c * 1024);
            b[u] = tsr_mma::load_w(tw + (int64_t)c * 1024 + 512);
        }
    }
}

// The KW warps' sums of a tile added in warp order; rows g and g + 8 of
// tile (columns 0 and 1 of C: hi and lo) times mul and their scales.
template <int KW>
__device__ __forceinline__ void store_tile(const float *acc, int tile, int n_out, float mul, const float *wscale,
                                           float *y) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    __shared__ float part[KW][32][2];
    part[warp][lane][0] = acc[0] + acc[1], part[warp][lane][1] = acc[2] + acc[3];
    __syncthreads();
    if (warp != 0 || t != 0) return;
    float s0 = 0.f, s1 = 0.f;
    for (int k = 0; k < KW; k++) s0 += part[k][lane][0], s1 += part[k][lane][1];
    const int r0 = tile * 16 + g, r1 = r0 + 8;
    if (r0 < n_out) y[r0] = s0 * mul * wscale[r0];
    if (r1 < n_out) y[r1] = s1 * mul * wscale[r1];
}

// One 16-row tile a block of KW warps, each warp chunks kw, kw + KW, ...,
// U chunks' loads in flight. w: tiles of nch chunks of 1 KiB (lane l's 16
// bytes of row l / 4 at 16 l, of row 8 + l / 4 at 512 + 16 l; bytes 16 (l %
// 4) .. + 15 of the chunk's 64 columns).
template <int KW, int U>
__global__ void __launch_bounds__(32 * KW) f8mma(const uint8_t *w, const uint8_t *xq, const float *sx,
                                                 const float *wscale, float *y, int n_out, int cols) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const int tile = blockIdx.x, nch = cols / 64;
    const uint8_t *tw = w + (int64_t)tile * nch * 1024 + 16 * lane;
    const int n = lane >> 2; // B column: 0 hi, 1 lo
    const uint8_t *xb = xq + (n == 1 ? 64 : 0) + 16 * t;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int c0 = warp; c0 < nch; c0 += KW * U) {
        uint4 a[U], b[U], xv[U];
        load_chunks<KW, U>(tw, c0, nch, a, b);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + u * KW;
            if (c >= nch) continue;
            xv[u] = n < 2 ? *reinterpret_cast<const uint4 *>(xb + (int64_t)c * 128) : make_uint4(0, 0, 0, 0);
            mma_e4m3(acc, a[u].x, b[u].x, a[u].y, b[u].y, xv[u].x, xv[u].y);
            mma_e4m3(acc, a[u].z, b[u].z, a[u].w, b[u].w, xv[u].z, xv[u].w);
        }
    }
    store_tile<KW>(acc, tile, n_out, *sx, wscale, y);
}

// The same with the activations quantised in the kernel, a scale per
// 64-column chunk: lanes 0-7 of the warp taking a chunk load its 64 f32
// activations (16 a lane, lanes t and 4 + t the same ones), take the
// chunk's largest |x| by two shuffles, and pack hi (lanes 0-3) or lo (4-7);
// each chunk's two mma start from zero and are added into the sums times
// the chunk's scale. No separate kernel, nothing shared across blocks.
template <int KW, int U>
__global__ void __launch_bounds__(32 * KW) f8mma_q(const uint8_t *w, const float *x, const float *unused,
                                                   const float *wscale, float *y, int n_out, int cols) {
    (void)unused;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const int tile = blockIdx.x, nch = cols / 64;
    const uint8_t *tw = w + (int64_t)tile * nch * 1024 + 16 * lane;
    const int n = lane >> 2; // B column: 0 hi, 1 lo
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int c0 = warp; c0 < nch; c0 += KW * U) {
        uint4 a[U], b[U];
        load_chunks<KW, U>(tw, c0, nch, a, b);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + u * KW;
            if (c >= nch) continue;
            float v[16];
            float m = 0.0f;
            if (n < 2) {
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const float4 f = __ldg(reinterpret_cast<const float4 *>(x + 64 * c + 16 * t + 4 * q));
                    v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
                }
#pragma unroll
                for (int i = 0; i < 16; i++) m = fmaxf(m, fabsf(v[i]));
            }
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            const float sc = __shfl_sync(0xffffffffu, m, 0) > 0.0f ? __shfl_sync(0xffffffffu, m, 0) / 448.0f : 1.0f;
            uint32_t xw[4] = {0u, 0u, 0u, 0u};
            if (n < 2) {
                const float inv = 1.0f / sc;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float2 p = make_float2(v[2 * j] * inv, v[2 * j + 1] * inv);
                    const __nv_fp8x2_storage_t h = __nv_cvt_float2_to_fp8x2(p, __NV_SATFINITE, __NV_E4M3);
                    uint32_t bits = h;
                    if (n == 1) {
                        const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(h, __NV_E4M3);
                        const float2 hf = __half22float2(*reinterpret_cast<const __half2 *>(&hr));
                        bits = __nv_cvt_float2_to_fp8x2(make_float2(p.x - hf.x, p.y - hf.y), __NV_SATFINITE, __NV_E4M3);
                    }
                    xw[j >> 1] |= bits << (16 * (j & 1));
                }
            }
            float tmp[4] = {0.f, 0.f, 0.f, 0.f};
            mma_e4m3(tmp, a[u].x, b[u].x, a[u].y, b[u].y, xw[0], xw[1]);
            mma_e4m3(tmp, a[u].z, b[u].z, a[u].w, b[u].w, xw[2], xw[3]);
#pragma unroll
            for (int i = 0; i < 4; i++) acc[i] = fmaf(tmp[i], sc, acc[i]);
        }
    }
    store_tile<KW>(acc, tile, n_out, 1.0f, wscale, y);
}

// Row-major E4M3 [n_out, cols] -> the tile layout above (n_out a multiple of 16).
static void to_tiles(const uint8_t *src, int n_out, int cols, uint8_t *dst) {
    const int nch = cols / 64;
    for (int T = 0; T < n_out / 16; T++)
        for (int c = 0; c < nch; c++)
            for (int l = 0; l < 32; l++)
                for (int j = 0; j < 16; j++) {
                    const int col = 64 * c + 16 * (l % 4) + j;
                    uint8_t *d = dst + ((int64_t)T * nch + c) * 1024;
                    d[16 * l + j] = src[(int64_t)(16 * T + l / 4) * cols + col];
                    d[512 + 16 * l + j] = src[(int64_t)(16 * T + 8 + l / 4) * cols + col];
                }
}

typedef void (*Kern)(const uint8_t *, const uint8_t *, const float *, const float *, float *, int, int);
typedef void (*KernQ)(const uint8_t *, const float *, const float *, const float *, float *, int, int);
struct KCfg {
    const char *name;
    Kern k;   // activations quantised by quant_x first
    KernQ kq; // or in the kernel, a scale per chunk
    int threads;
};
static const KCfg kCfgs[] = {
    {"kw 4 u 1", f8mma<4, 1>, nullptr, 128},   {"kw 4 u 2", f8mma<4, 2>, nullptr, 128},
    {"kw 8 u 1", f8mma<8, 1>, nullptr, 256},   {"kw 8 u 2", f8mma<8, 2>, nullptr, 256},
    {"kw 16 u 1", f8mma<16, 1>, nullptr, 512}, {"kw 16 u 2", f8mma<16, 2>, nullptr, 512},
    {"q kw 4 u 2", nullptr, f8mma_q<4, 2>, 128}, {"q kw 8 u 1", nullptr, f8mma_q<8, 1>, 256},
    {"q kw 8 u 2", nullptr, f8mma_q<8, 2>, 256}, {"q kw 16 u 1", nullptr, f8mma_q<16, 1>, 512},
    {"q kw 16 u 2", nullptr, f8mma_q<16, 2>, 512},
};
static const int kNumK = sizeof kCfgs / sizeof *kCfgs;

static void check(cudaStream_t st) {
    const int shapes[][2] = {{64, 4096}, {32, 14336}, {48, 1024}};
    for (int ki = 0; ki < kNumK; ki++) {
        double worst = 0;
        for (float amp : {1.0f, 100.0f, 0.01f})
            for (auto &s : shapes) {
                const int n = s[0], cols = s[1];
                LabCase c = lab_case_new(1, n, cols, cols, 1, amp);
                uint8_t *tiles = (uint8_t *)malloc((size_t)n * cols), *dt, *dxq;
                float *dsx;
                to_tiles(c.hw, n, cols, tiles);
                CK(cudaMalloc(&dt, (size_t)n * cols));
                CK(cudaMalloc(&dxq, (size_t)cols * 2));
                CK(cudaMalloc(&dsx, sizeof(float)));
                CK(cudaMemcpy(dt, tiles, (size_t)n * cols, cudaMemcpyHostToDevice));
                if (kCfgs[ki].k) {
                    quant_x<<<1, 1024, 0, st>>>(c.dx, cols, dxq, dsx);
                    kCfgs[ki].k<<<n / 16, kCfgs[ki].threads, 0, st>>>(dt, dxq, dsx, c.ds, c.dy, n, cols);
                } else {
                    kCfgs[ki].kq<<<n / 16, kCfgs[ki].threads, 0, st>>>(dt, c.dx, nullptr, c.ds, c.dy, n, cols);
                }
                CK(cudaStreamSynchronize(st));
                CK(cudaMemcpy(c.hy, c.dy, sizeof(float) * n, cudaMemcpyDeviceToHost));
                for (int o = 0; o < n; o++) {
                    double sum = 0, mag = 0;
                    for (int k = 0; k < cols; k++) {
                        const double wv = lab_case_w(c, 1, o, k), xv = c.hx[k];
                        sum += wv * xv, mag += fabs(wv * xv);
                    }
                    const double e = fabs(c.hy[o] - sum) / (mag + 1e-30);
                    if (!(e <= worst)) worst = e;
                }
                cudaFree(dt), cudaFree(dxq), cudaFree(dsx);
                free(tiles);
                lab_case_free(&c);
            }
        printf("  %-10s worst |y - f64| / sum |w x|: %.3g\n", kCfgs[ki].name, worst);
    }
}

int main(void) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    printf("correctness (E4M3 weights exact; activations as two E4M3 halves):\n");
    check(st);
    LabBufs b = lab_bufs(st, (size_t)8 << 30);
    uint8_t *xq;
    float *sx;
    CK(cudaMalloc(&xq, 2 * 128256));
    CK(cudaMalloc(&sx, sizeof(float)));
    CK(cudaMemsetAsync(xq, 0x38, 2 * 128256, st));
    float one = 1.0f;
    CK(cudaMemcpy(sx, &one, sizeof one, cudaMemcpyHostToDevice));
    printf("\nTB/s at one row, weights out of L2 (copies in turn), E4M3:\n");
    for (int si = 0; si < kNumShapes; si++) {
        const Shape &S = kShapes[si];
        const size_t bytes = (size_t)S.out * S.in, copies = b.pool_bytes / bytes < 64 ? b.pool_bytes / bytes : 64;
        Args a = {};
        a.scale = b.s, a.x = b.x, a.y = b.y, a.n_out = S.out, a.cols = S.in, a.ldw = S.in, a.ldx = S.in;
        const float prod = lab_calls_ms(st, 60, [&](int i) {
            a.w = b.pool + (size_t)(i % copies) * bytes;
            CK(tsr_row::launch_decode<kFp8>(a, 1, tsr_row::kRowDense, st, false));
        });
        printf("%-22s production %.2f", S.name, bytes / prod / 1e9);
        for (int ki = 0; ki < kNumK; ki++) {
            const float ms = lab_calls_ms(st, 60, [&](int i) {
                const uint8_t *wp = b.pool + (size_t)(i % copies) * bytes;
                if (kCfgs[ki].k) kCfgs[ki].k<<<S.out / 16, kCfgs[ki].threads, 0, st>>>(wp, xq, sx, b.s, b.y, S.out, S.in);
                else kCfgs[ki].kq<<<S.out / 16, kCfgs[ki].threads, 0, st>>>(wp, b.x, nullptr, b.s, b.y, S.out, S.in);
            });
            printf(" | %s %.2f", kCfgs[ki].name, bytes / ms / 1e9);
        }
        const float q = lab_calls_ms(st, 60, [&](int) { quant_x<<<1, 1024, 0, st>>>(b.x, S.in, xq, sx); });
        printf(" | quant_x %.1f us\n", q * 1e3);
    }
    return 0;
}
