// fp8h_lab - does the one-row E4M3 GEMV go faster with packed f16 products?
// Not part of the engine; run by hand on the device:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o fp8h_lab tools/cuda_lab/fp8h_lab.cu && ./fp8h_lab
//
// The production one-row E4M3 kernel (kernels/cuda/gemv_row.cuh) widens
// every weight to f32 and multiplies in f32: per 16 weights 8 bit-trick
// conversions (3 integer ops each), 16 f16 -> f32 conversions and 16 FMAs.
// It reads 1.8-3.2 TB/s on the Llama-3-8B shapes where bf16 reads 3.3-4.2:
// bound by issue, not by memory. The variant here multiplies in f16 pairs
// (HFMA2: two products an instruction) and widens only the partial sums:
// each lane's 16 weights of a step go into two f16x2 chains of 4 products
// each, added (f16x2) and widened once, then summed in f32. Weights enter
// f16 either by the same bit trick (CVT 0: value * 2^-8, activations * 2^-4
// as now) or by the hardware conversion cvt.rn.f16x2.e4m3x2 (CVT 1: exact
// value, activations * 2^-8 so that partial sums stay in range).
//
// Reports (1) the error against an f64 product of the same rounded operands,
// relative to sum |w x| (f16 partial sums: ~1e-3 expected, against 1e-7 for
// f32 products), (2) TB/s per shape at one row with weights out of L2, for the
// production launcher and each variant, (3) one token's GEMVs as a CUDA graph.
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

// The production kernels' conversion when this lab was written (gemv_mma.cuh
// now uses the hardware conversion): two E4M3 bytes (sel: 0x1404 bytes 0,1;
// 0x3424 bytes 2,3) as an f16 pair equal to the E4M3 values times 2^-8.
__device__ __forceinline__ uint32_t e4m3x2_f16(uint32_t w, uint32_t sel) {
    const uint32_t v = __byte_perm(w, 0u, sel); // each byte in the high half of a 16-bit lane
    return (v & 0x80008000u) | ((v >> 1) & 0x3F803F80u);
}

// Two E4M3 bytes (lo: bytes 0,1; hi: bytes 2,3) as f16 pairs.
template <int CVT> __device__ __forceinline__ void e4m3x4(uint32_t w, uint32_t &lo, uint32_t &hi) {
    if (CVT == 0) {
        lo = e4m3x2_f16(w, 0x1404), hi = e4m3x2_f16(w, 0x3424);
    } else {
        __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
        __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
        lo = (uint32_t)a.x | (uint32_t)a.y << 16, hi = (uint32_t)b.x | (uint32_t)b.y << 16;
    }
}
template <int CVT> __host__ __device__ constexpr float xmul() { return CVT == 0 ? 0.0625f : 0.00390625f; }
template <int CVT> __host__ __device__ constexpr float ymul() { return CVT == 0 ? 4096.0f : 256.0f; }

__device__ __forceinline__ __half2 h2(uint32_t u) { return *reinterpret_cast<__half2 *>(&u); }

template <int CVT, int RPW, int U, int KS>
__global__ void __launch_bounds__(256) gemv_h2(const Args p) {
    constexpr int K = 16, STEP = 32 * K;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, seg = warp % KS;
    const int o0 = (blockIdx.x * (8 / KS) + warp / KS) * RPW;
    if (KS == 1 && o0 >= p.n_out) return;
    const uint8_t *row[RPW];
    float acc[RPW];
    lab_rows<RPW>(p, o0, row, acc);
    tsr_pdl::enter();
    for (int k0 = lane * K + seg * STEP * U; k0 < p.cols; k0 += STEP * U * KS) {
        uint4 w[U][RPW];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (k0 + u * STEP < p.cols)
#pragma unroll
                for (int r = 0; r < RPW; r++) w[u][r] = tsr_mma::load_w(row[r] + (int64_t)(k0 + u * STEP));
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + u * STEP;
            if (k >= p.cols) break;
            float xv[K];
            tsr_mma::load_x<K>(p.x, k, p.cols, xv);
            __half2 xh[8];
#pragma unroll
            for (int i = 0; i < 8; i++) xh[i] = __floats2half2_rn(xv[2 * i] * xmul<CVT>(), xv[2 * i + 1] * xmul<CVT>());
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const uint32_t wv[4] = {w[u][r].x, w[u][r].y, w[u][r].z, w[u][r].w};
                __half2 a = __float2half2_rn(0.0f), b = a;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    uint32_t lo, hi;
                    e4m3x4<CVT>(wv[j], lo, hi);
                    a = __hfma2(h2(lo), xh[2 * j], a);
                    b = __hfma2(h2(hi), xh[2 * j + 1], b);
                }
                const float2 f = __half22float2(__hadd2(a, b));
                acc[r] += f.x + f.y;
            }
        }
    }
    lab_row_store<RPW, KS>(p, acc, warp, lane, seg, o0, ymul<CVT>());
}

template <int CVT, int RPW, int U, int KS> static void launch_h2(const Args &p, cudaStream_t st, bool pdl) {
    const int rpb = 8 / KS * RPW;
    CK(tsr_pdl::launch(gemv_h2<CVT, RPW, U, KS>, (unsigned)((p.n_out + rpb - 1) / rpb), 256, 0, st, pdl, p));
}

// configuration 0: production (launch_decode); 1..: the variants below
struct Cfg {
    int cvt, rpw, u, ks;
};
static const Cfg kCfgs[] = {{0, 0, 0, 0}, {0, 1, 2, 1}, {0, 2, 1, 1}, {0, 2, 2, 1}, {0, 4, 1, 1}, {0, 4, 2, 1},
                            {0, 2, 1, 2}, {0, 4, 1, 2}, {0, 1, 2, 2}, {0, 2, 2, 2}, {1, 2, 1, 1}, {1, 2, 2, 1},
                            {1, 4, 1, 1}, {1, 4, 2, 1}, {1, 2, 1, 2}, {1, 4, 1, 2}, {1, 2, 2, 2}};
static const int kNumCfgs = sizeof kCfgs / sizeof kCfgs[0];

static void launch(int ci, const Args &p, cudaStream_t st, bool pdl) {
    switch (ci) {
    case 0: CK(tsr_row::launch_decode<kFp8>(p, 1, tsr_row::kRowDense, st, pdl)); break;
#define C(I, CV, R, U, KS)                                                                                   \
    case I: launch_h2<CV, R, U, KS>(p, st, pdl); break;
        C(1, 0, 1, 2, 1) C(2, 0, 2, 1, 1) C(3, 0, 2, 2, 1) C(4, 0, 4, 1, 1) C(5, 0, 4, 2, 1) C(6, 0, 2, 1, 2)
        C(7, 0, 4, 1, 2) C(8, 0, 1, 2, 2) C(9, 0, 2, 2, 2) C(10, 1, 2, 1, 1) C(11, 1, 2, 2, 1) C(12, 1, 4, 1, 1)
        C(13, 1, 4, 2, 1) C(14, 1, 2, 1, 2) C(15, 1, 4, 1, 2) C(16, 1, 2, 2, 2)
#undef C
    }
}

// Worst |y - f64| / sum |w x| over the shape, activations of magnitude amp.
static double check(int ci, int n_out, int cols, float amp, cudaStream_t st) {
    LabCase t = lab_case_new(1, n_out, cols, cols, 1, amp);
    Args a = {};
    a.w = t.dw, a.scale = t.ds, a.x = t.dx, a.y = t.dy, a.n_out = n_out, a.cols = cols, a.ldw = cols, a.ldx = cols;
    launch(ci, a, st, false);
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(t.hy, t.dy, sizeof(float) * n_out, cudaMemcpyDeviceToHost));
    const float xm = ci == 0 ? 0.0625f : kCfgs[ci].cvt ? xmul<1>() : xmul<0>();
    double worst = 0;
    for (int o = 0; o < n_out; o++) {
        double sum = 0, mag = 0;
        for (int c = 0; c < cols; c++) {
            const double wv = lab_case_w(t, 1, o, c);
            const double xv = (double)__half2float(__float2half_rn(t.hx[c] * xm)) / xm;
            sum += wv * xv, mag += fabs(wv * xv);
        }
        const double err = fabs(t.hy[o] - sum) / (mag + 1e-30);
        if (!(err <= worst)) worst = err; // NaN counts as worst
    }
    lab_case_free(&t);
    return worst;
}

static uint8_t *g_pool;
static size_t g_pool_bytes;

static float one_ms(cudaStream_t st, int ci, const Shape &S, float *x, float *y, float *s) {
    const size_t bytes = (size_t)S.out * S.in, copies = g_pool_bytes / bytes;
    Args a = {};
    a.scale = s, a.x = x, a.y = y, a.n_out = S.out, a.cols = S.in, a.ldw = S.in, a.ldx = S.in;
    return lab_calls_ms(st, 60, [&](int i) {
        a.w = g_pool + (size_t)(i % (copies < 64 ? copies : 64)) * bytes;
        launch(ci, a, st, false);
    });
}

static float chain_ms(cudaStream_t st, const int *ci, bool pdl, float *xa, float *xb, float *s) {
    return lab_token_args_ms<Args>(st, g_pool, 1, s, xa, xb, [&](const Args &a, int si) { launch(ci[si], a, st, pdl); });
}

int main(void) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    printf("(1) worst error / sum|w x| (shapes 100x4096, 37x4112, 9x16, 5x14336; activations to 1, 100, 3000)\n");
    const int shapes[][2] = {{100, 4096}, {37, 4112}, {9, 16}, {5, 14336}};
    for (int ci = 0; ci < kNumCfgs; ci++) {
        double worst = 0;
        for (float amp : {1.0f, 100.0f, 3000.0f})
            for (auto &s : shapes) {
                if (ci == 0 && s[1] % 64) continue; // production's gemv_mma wants rows of whole 64-byte chunks
                const double e = check(ci, s[0], s[1], amp, st);
                if (!(e <= worst)) worst = e;
            }
        printf("  cfg %2d: %.3g\n", ci, worst);
    }
    const LabBufs b = lab_bufs(st, (size_t)7700 << 20);
    g_pool = b.pool, g_pool_bytes = b.pool_bytes;
    float *x = b.x, *y = b.y, *s = b.s;
    printf("\n(2) TB/s at one row (us)\n");
    lab_table_head("config", 24);
    int best[kNumShapes] = {};
    float best_t[kNumShapes] = {1e30f, 1e30f, 1e30f, 1e30f, 1e30f};
    for (int ci = 0; ci < kNumCfgs; ci++) {
        if (ci == 0) printf("%-24s", "production");
        else printf("h2 cvt %d rpw %d u %d ks %d  ", kCfgs[ci].cvt, kCfgs[ci].rpw, kCfgs[ci].u, kCfgs[ci].ks);
        for (int i = 0; i < kNumShapes; i++) {
            const float t = one_ms(st, ci, kShapes[i], x, y, s);
            if (t < best_t[i]) best_t[i] = t, best[i] = ci;
            printf(" | %4.2f (%6.1f)        ", (double)kShapes[i].out * kShapes[i].in / t / 1e9, t * 1e3);
        }
        printf("\n");
    }
    const double bytes = 32.0 * (6144.0 * 4096 + 4096.0 * 4096 + 28672.0 * 4096 + 4096.0 * 14336) + 128256.0 * 4096;
    int prod[kNumShapes] = {0, 0, 0, 0, 0};
    int best_cvt0[kNumShapes];
    for (int i = 0; i < kNumShapes; i++) {
        float bt = 1e30f;
        best_cvt0[i] = 0;
        for (int ci = 1; ci < kNumCfgs; ci++)
            if (kCfgs[ci].cvt == 0) {
                const float t = one_ms(st, ci, kShapes[i], x, y, s);
                if (t < bt) bt = t, best_cvt0[i] = ci;
            }
    }
    printf("\n(3) one token's GEMVs as a graph (floor at 4.29 TB/s %.3f ms); best per shape:", bytes / 4.29e9);
    for (int i = 0; i < kNumShapes; i++) printf(" %d", best[i]);
    printf("; best bit-trick:");
    for (int i = 0; i < kNumShapes; i++) printf(" %d", best_cvt0[i]);
    printf("\n");
    for (int round = 0; round < 2; round++)
        for (bool pdl : {false, true})
            printf("  pdl %d: production %.3f ms, best %.3f ms, best bit-trick %.3f ms\n", pdl,
                   chain_ms(st, prod, pdl, x, x + 128256, s), chain_ms(st, best, pdl, x, x + 128256, s),
                   chain_ms(st, best_cvt0, pdl, x, x + 128256, s));
    return 0;
}
