// bal_lab - one-row decode GEMV with the work dealt evenly to resident warps.
// Not part of the engine; run by hand on the device:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o bal_lab tools/cuda_lab/bal_lab.cu && ./bal_lab
//
// The question. gemv_row (kernels/cuda/gemv_row.cuh) gives each warp whole
// rows: a grid of n_out / (rows per block) blocks, scheduled in waves of
// what fits on the 132 SMs. E4M3 rows are half as long as bf16 ones, so its
// kernels are short, few waves: the last wave's part-empty SMs (wave
// quantisation) and the ramp cost a larger share. fp8h_lab measured that
// cheaper arithmetic per weight (f16 pair products) barely helps (gate/up
// 3.18 -> 3.35 TB/s), so the loss is not in issue. The LM head, 4x longer,
// reads 4.2-4.3 TB/s with the same kernels.
//
// The variant: exactly as many blocks as are resident at once; the matrix
// cut into units (RPW rows x one warp step of 512 bytes a row) dealt to the
// warps in equal contiguous ranges (row-major over units), so every warp
// streams the same number of bytes and all finish together. A row group
// split between warps is summed by the last of its warps to arrive (partials
// in scratch, a per-group arrival counter that the last resets), adding the
// partials in warp order: deterministic.
//
// Reports (1) correctness against f64 (bf16 and E4M3, ragged shapes), (2)
// TB/s per shape at one row, weights out of L2, production against each
// variant, (3) one token's GEMVs (32 layers + LM head) as a CUDA graph with
// and without programmatic dependent launch.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/gemv_row.cuh"

#include "tools/cuda_lab/lab_util.cuh"

using tsr_mma::Args;
using tsr_mma::kBf16;
using tsr_mma::kFp8;

struct Bal {
    float *part; // [warps][2][RPW] partial sums of split row groups
    int *cnt;    // [groups] arrivals, zero between calls
};

// The warp whose range holds unit u (ranges: w * n / nw .. (w + 1) * n / nw).
__device__ __forceinline__ int64_t warp_of(int64_t u, int64_t n, int64_t nw) { return ((u + 1) * nw - 1) / n; }

template <int WK, int RPW, int U>
__global__ void __launch_bounds__(256) gemv_bal(const Args p, const Bal b) {
    constexpr int K = tsr_row::Piece<WK>::k, ES = WK == kBf16 ? 2 : 1, STEP = 32 * K;
    const int lane = threadIdx.x & 31;
    const int64_t S = (p.cols + STEP - 1) / STEP, groups = (p.n_out + RPW - 1) / RPW, n = groups * S;
    // at most one warp per unit, so that no range is empty (the arrival
    // count of a split group is the number of warps between its ends)
    const int64_t nw = ::min((int64_t)gridDim.x * 8, n), w = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (w >= nw) return;
    int64_t u = w * n / nw;
    const int64_t u1 = (w + 1) * n / nw;
    tsr_pdl::enter();
    int slot = 0;
    while (u < u1) {
        const int64_t g = u / S;
        const int s0 = (int)(u % S), s1 = (int)::min((int64_t)S, s0 + (u1 - u));
        const uint8_t *row[RPW];
#pragma unroll
        for (int r = 0; r < RPW; r++) row[r] = p.w + (int64_t)::min(g * RPW + r, (int64_t)p.n_out - 1) * p.ldw;
        float acc[RPW];
#pragma unroll
        for (int r = 0; r < RPW; r++) acc[r] = 0.0f;
        for (int s = s0; s < s1; s += U) {
            uint4 wv[U][RPW];
#pragma unroll
            for (int i = 0; i < U; i++) {
                const int k = (s + i) * STEP + lane * K;
                if (s + i < s1 && k < p.cols)
#pragma unroll
                    for (int r = 0; r < RPW; r++) wv[i][r] = tsr_mma::load_w(row[r] + (int64_t)k * ES);
            }
#pragma unroll
            for (int i = 0; i < U; i++) {
                const int k = (s + i) * STEP + lane * K;
                if (s + i >= s1) break;
                if (k >= p.cols) continue;
                float xv[K];
                lab_piece_x<WK, K>(p.x, k, p.cols, xv);
#pragma unroll
                for (int r = 0; r < RPW; r++) acc[r] = tsr_row::dot_piece<WK>(wv[i][r], xv, acc[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < RPW; r++)
            for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
        const float mul = tsr_mma::kind_mul<WK>();
        if (s0 == 0 && s1 == S) {
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < RPW; r++) {
                    const int64_t o = g * RPW + r;
                    if (o < p.n_out) p.y[o] = acc[r] * (p.scale ? p.scale[o] : 1.0f) * mul;
                }
        } else if (lane == 0) {
            float *mine = b.part + (w * 2 + slot) * RPW;
#pragma unroll
            for (int r = 0; r < RPW; r++) mine[r] = acc[r];
            const int64_t wa = warp_of(g * S, n, nw), wb = warp_of(g * S + S - 1, n, nw);
            __threadfence();
            if (atomicAdd(&b.cnt[g], 1) == (int)(wb - wa)) { // the last of the group's warps
                __threadfence();
                float sum[RPW];
#pragma unroll
                for (int r = 0; r < RPW; r++) sum[r] = 0.0f;
                for (int64_t v = wa; v <= wb; v++) {
                    const int sl = v * n / nw / S == g ? 0 : 1; // slot 0: the warp's first group
                    const volatile float *pp = b.part + (v * 2 + sl) * RPW;
#pragma unroll
                    for (int r = 0; r < RPW; r++) sum[r] += pp[r];
                }
#pragma unroll
                for (int r = 0; r < RPW; r++) {
                    const int64_t o = g * RPW + r;
                    if (o < p.n_out) p.y[o] = sum[r] * (p.scale ? p.scale[o] : 1.0f) * mul;
                }
                b.cnt[g] = 0;
            }
        }
        u += s1 - s0;
        slot = 1;
    }
}

static int g_sms;
template <int WK, int RPW, int U> static void launch_bal(const Args &p, const Bal &b, cudaStream_t st, bool pdl) {
    static int per_sm = 0;
    if (!per_sm) CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_bal<WK, RPW, U>, 256, 0));
    CK(tsr_pdl::launch(gemv_bal<WK, RPW, U>, (unsigned)(per_sm * g_sms), 256, 0, st, pdl, p, b));
}

struct Cfg {
    int rpw, u;
};
static const Cfg kCfgs[] = {{0, 0}, {1, 2}, {1, 4}, {2, 1}, {2, 2}, {4, 1}, {4, 2}};
static const int kNumCfgs = sizeof kCfgs / sizeof kCfgs[0];

template <int WK> static void launch_k(int ci, const Args &p, const Bal &b, cudaStream_t st, bool pdl) {
    switch (ci) {
    case 0: CK(tsr_row::launch_decode<WK>(p, 1, tsr_row::kRowDense, st, pdl)); break;
    case 1: launch_bal<WK, 1, 2>(p, b, st, pdl); break;
    case 2: launch_bal<WK, 1, 4>(p, b, st, pdl); break;
    case 3: launch_bal<WK, 2, 1>(p, b, st, pdl); break;
    case 4: launch_bal<WK, 2, 2>(p, b, st, pdl); break;
    case 5: launch_bal<WK, 4, 1>(p, b, st, pdl); break;
    case 6: launch_bal<WK, 4, 2>(p, b, st, pdl); break;
    }
}
static void launch(int wk, int ci, const Args &p, const Bal &b, cudaStream_t st, bool pdl) {
    wk == kBf16 ? launch_k<kBf16>(ci, p, b, st, pdl) : launch_k<kFp8>(ci, p, b, st, pdl);
}

static int64_t row_bytes(int wk, int cols) { return wk == kBf16 ? 2 * (int64_t)cols : (int64_t)cols; }
static double check(int wk, int ci, int n_out, int cols, const Bal &b, cudaStream_t st) {
    const int64_t ldw = (row_bytes(wk, cols) + 15) / 16 * 16;
    LabCase t = lab_case_new(wk == kFp8, n_out, cols, ldw, 1, 4.0f);
    Args a = {};
    a.w = t.dw, a.scale = wk == kFp8 ? t.ds : nullptr, a.x = t.dx, a.y = t.dy, a.n_out = n_out, a.cols = cols, a.ldw = ldw;
    a.ldx = cols;
    double worst = 0;
    for (int rep = 0; rep < 2; rep++) { // twice: the counters must have been left at zero
        launch(wk, ci, a, b, st, false);
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(t.hy, t.dy, sizeof(float) * n_out, cudaMemcpyDeviceToHost));
        const double e = lab_case_worst(t, wk == kFp8, n_out, cols);
        if (!(e <= worst)) worst = e;
    }
    lab_case_free(&t);
    return worst;
}

static uint8_t *g_pool;
static size_t g_pool_bytes;

static float one_ms(cudaStream_t st, int wk, int ci, const Shape &S, float *x, float *y, float *s, const Bal &b) {
    const size_t bytes = (size_t)S.out * row_bytes(wk, S.in), copies = g_pool_bytes / bytes;
    Args a = {};
    a.scale = wk == kFp8 ? s : nullptr, a.x = x, a.y = y, a.n_out = S.out, a.cols = S.in, a.ldw = row_bytes(wk, S.in);
    a.ldx = S.in;
    return lab_calls_ms(st, 60, [&](int i) {
        a.w = g_pool + (size_t)(i % (copies < 64 ? copies : 64)) * bytes;
        launch(wk, ci, a, b, st, false);
    });
}

static float chain_ms(cudaStream_t st, int wk, const int *ci, bool pdl, float *xa, float *xb, float *s, const Bal &b) {
    return lab_token_ms(st, g_pool, wk == kBf16 ? 2 : 1, [&](int i, const Shape &S, const uint8_t *w) {
        Args a = {};
        a.w = w, a.scale = wk == kFp8 ? s : nullptr, a.n_out = S.out, a.cols = S.in;
        a.ldw = row_bytes(wk, S.in), a.ldx = S.in;
        a.x = (i & 1) ? xb : xa, a.y = (i & 1) ? xa : xb;
        launch(wk, ci[&S - kShapes], a, b, st, pdl);
    });
}

int main(void) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
    Bal b;
    CK(cudaMalloc(&b.part, (size_t)g_sms * 64 * 2 * 4 * sizeof(float)));
    CK(cudaMalloc(&b.cnt, 128256 * sizeof(int)));
    CK(cudaMemset(b.cnt, 0, 128256 * sizeof(int)));
    printf("(1) correctness: worst |y - f64| / sum |w x| over shapes, two calls each\n");
    const int shapes[][2] = {{100, 4096}, {16, 64}, {37, 4112}, {301, 1024}, {9, 16}, {5, 14336}, {6144, 4096},
                             {3, 40000}};
    int ok = 1;
    for (int wk = 0; wk < 2; wk++)
        for (int ci = 1; ci < kNumCfgs; ci++) {
            double worst = 0;
            for (auto &s : shapes) {
                const double e = check(wk, ci, s[0], s[1], b, st);
                if (!(e <= worst)) worst = e;
            }
            ok &= worst < 1e-5;
            printf("  %s rpw %d u %d: %.3g%s\n", wk ? "E4M3" : "bf16", kCfgs[ci].rpw, kCfgs[ci].u, worst,
                   worst < 1e-5 ? "" : "  FAIL");
        }
    const LabBufs lb = lab_bufs(st, (size_t)15400 << 20);
    g_pool = lb.pool, g_pool_bytes = lb.pool_bytes;
    float *x = lb.x, *s = lb.s;
    for (int wk = 0; wk < 2; wk++) {
        printf("\n(2) %s: TB/s at one row (us)\n", wk ? "E4M3" : "bf16");
        lab_table_head("config", 16);
        int best[kNumShapes] = {};
        float best_t[kNumShapes] = {1e30f, 1e30f, 1e30f, 1e30f, 1e30f};
        for (int ci = 0; ci < kNumCfgs; ci++) {
            if (ci == 0) printf("%-16s", "production");
            else printf("bal rpw %d u %d   ", kCfgs[ci].rpw, kCfgs[ci].u);
            for (int i = 0; i < kNumShapes; i++) {
                const float t = one_ms(st, wk, ci, kShapes[i], x, x + 128256, s, b);
                if (t < best_t[i]) best_t[i] = t, best[i] = ci;
                printf(" | %4.2f (%6.1f)        ",
                       (double)kShapes[i].out * row_bytes(wk, kShapes[i].in) / t / 1e9, t * 1e3);
            }
            printf("\n");
        }
        double bytes = 0;
        for (int i = 0; i < 4; i++) bytes += 32.0 * kShapes[i].out * row_bytes(wk, kShapes[i].in);
        bytes += (double)kShapes[4].out * row_bytes(wk, kShapes[4].in);
        int prod[kNumShapes] = {0, 0, 0, 0, 0}, bal_only[kNumShapes];
        for (int i = 0; i < kNumShapes; i++) {
            float bt = 1e30f;
            bal_only[i] = 1;
            for (int ci = 1; ci < kNumCfgs; ci++) {
                const float t = one_ms(st, wk, ci, kShapes[i], x, x + 128256, s, b);
                if (t < bt) bt = t, bal_only[i] = ci;
            }
        }
        printf("(3) %s one token's GEMVs as a graph (floor at 4.29 TB/s %.3f ms); best per shape:", wk ? "E4M3" : "bf16",
               bytes / 4.29e9);
        for (int i = 0; i < kNumShapes; i++) printf(" %d", best[i]);
        printf("; best balanced:");
        for (int i = 0; i < kNumShapes; i++) printf(" %d", bal_only[i]);
        printf("\n");
        for (int round = 0; round < 2; round++)
            for (bool pdl : {false, true})
                printf("  pdl %d: production %.3f ms, best %.3f ms, balanced %.3f ms\n", pdl,
                       chain_ms(st, wk, prod, pdl, x, x + 128256, s, b), chain_ms(st, wk, best, pdl, x, x + 128256, s, b),
                       chain_ms(st, wk, bal_only, pdl, x, x + 128256, s, b));
    }
    return ok ? 0 : 1;
}
