// mma_lab - the one-row E4M3 GEMV with its products on the tensor cores.
// Not part of the engine; run by hand on the device:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o mma_lab tools/cuda_lab/mma_lab.cu && ./mma_lab
//
// After the twelfth session's column permutation the one-row E4M3 kernel
// (gemv_row.cuh) looked bound by its instructions: per weight half a
// conversion E4M3 -> f16, a widening f16 -> f32 and an FMA. gemv_row_mma
// below keeps gemv_row's loads (512-byte runs of a row per warp load) and
// hands each lane's 16 weights to 4 mma.sync m16n8k16 as the B operand (n =
// g = lane / 4: which 64-byte eighth of the step; k: the lane's 4 f16 values
// of one stored word), the lane's activations of the same elements (rounded
// to f16 as gemv_row rounds them) as row g of A, rows 8..15 zero: C[g][g]
// sums eighth g's products, the rest of C is cross terms, never read. Per
// 16 weights 8 conversions and 4 mma remain, the activations are rounded
// once a step for all RPW rows.
//
// Result (thirteenth session, BENCHMARKS.md): correct (worst 2e-7), but
// slower than the FMA kernel at every shape and configuration (gate/up 3.22
// against 3.61 TB/s, LM head 3.81 against 4.17), and the engine's one-row
// FP8 pass 2.68 -> 2.90 ms: the FMA kernel was not bound by its
// instructions where it streams long (the LM head reads at 97% of the
// probe); what it loses is the fixed cost of each launch on the shorter
// matrices.
//
// Reports (1) the error against f64 of each configuration (weights stored
// permuted, as cuda_gemv_fp8 stores them), (2) TB/s per shape at one row,
// weights out of L2, FMA (production's kernel) against MMA configurations,
// (3) one token's GEMVs as one graph, production against the best
// configuration per shape.
#include <cuda_runtime.h>
#include <stdio.h>

#include "kernels/cuda/gemv_row.cuh"

#include "tools/cuda_lab/lab_util.cuh"

using tsr_mma::Args;
using tsr_mma::kFp8;

// gemv_row<kFp8, RPW, U, KS> (plain rows) with the products on the tensor
// cores (the header). The whole warp takes every step (mma.sync wants all
// its lanes), lanes past cols with zero weights and activations.
template <int RPW, int U, int KS>
__global__ void __launch_bounds__(256) gemv_row_mma(const Args p) {
    constexpr int K = 16, STEP = 32 * K;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, seg = warp % KS, grp = warp / KS;
    const int o0 = (blockIdx.x * (8 / KS) + grp) * RPW;
    if (KS == 1 && o0 >= p.n_out) return;
    const uint8_t *row[RPW];
    lab_rows<RPW>(p, o0, row);
    float c[RPW][4];
#pragma unroll
    for (int r = 0; r < RPW; r++) c[r][0] = c[r][1] = c[r][2] = c[r][3] = 0.0f;
    tsr_pdl::enter();
    for (int s0 = seg * STEP * U; s0 < p.cols; s0 += STEP * U * KS) {
        const int k0 = s0 + lane * K;
        uint4 w[U][RPW];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < RPW; r++)
                w[u][r] = k0 + u * STEP < p.cols ? tsr_mma::load_w(row[r] + k0 + u * STEP) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (s0 + u * STEP >= p.cols) break;
            float xv[K];
            tsr_mma::load_x_e4m3(p.x, k0 + u * STEP, p.cols, xv);
            uint32_t xh[K / 2];
#pragma unroll
            for (int i = 0; i < K / 2; i++) xh[i] = tsr_mma::pack_f16(xv[2 * i] * 0.0625f, xv[2 * i + 1] * 0.0625f);
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const uint32_t wv[4] = {w[u][r].x, w[u][r].y, w[u][r].z, w[u][r].w};
#pragma unroll
                for (int q = 0; q < 4; q++)
                    tsr_mma::mma_f16(c[r], xh[2 * q], 0u, xh[2 * q + 1], 0u, tsr_mma::e4m3_pair(wv[q], false),
                                     tsr_mma::e4m3_pair(wv[q], true));
            }
        }
    }
    // C[g][g] sits in lane 4 g + g / 2, element g % 2
    const int g = lane >> 2, t = lane & 3;
    float acc[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) acc[r] = t == g >> 1 ? c[r][g & 1] : 0.0f;
    lab_row_store<RPW, KS>(p, acc, warp, lane, seg, o0, 16.0f);
}

// configuration 0: production (launch_decode); then (mma, rows a warp, steps in flight, warps a row group)
struct Cfg {
    int mma, rpw, u, ks;
};
static const Cfg kCfgs[] = {{0, 0, 0, 0}, {0, 2, 1, 1}, {0, 4, 1, 1}, {1, 1, 1, 1}, {1, 1, 2, 1}, {1, 2, 1, 1},
                            {1, 2, 2, 1}, {1, 4, 1, 1}, {1, 1, 1, 2}, {1, 2, 1, 2}, {1, 1, 2, 2}, {1, 1, 1, 4},
                            {1, 2, 1, 4}, {1, 4, 1, 2}};
static const int kNumCfgs = sizeof kCfgs / sizeof kCfgs[0];

static void launch(int ci, const Args &p, cudaStream_t st, bool pdl) {
    if (ci == 0) {
        CK(tsr_row::launch_decode<kFp8>(p, 1, tsr_row::kRowDense, st, pdl));
        return;
    }
    const Cfg c = kCfgs[ci];
    const unsigned grid = (unsigned)((p.n_out + 8 / c.ks * c.rpw - 1) / (8 / c.ks * c.rpw));
#define C(R, U, KS)                                                                                          \
    if (c.rpw == R && c.u == U && c.ks == KS) {                                                              \
        if (c.mma) CK(tsr_pdl::launch(gemv_row_mma<R, U, KS>, grid, 256, 0, st, pdl, p));                     \
        else CK((tsr_row::launch_cfg<kFp8, R, U, KS>(p, st, pdl)));                                           \
        return;                                                                                              \
    }
    C(1, 1, 1) C(1, 2, 1) C(2, 1, 1) C(2, 2, 1) C(4, 1, 1) C(1, 1, 2) C(2, 1, 2) C(1, 2, 2) C(1, 1, 4) C(2, 1, 4)
    C(4, 1, 2)
#undef C
    printf("no configuration %d\n", ci);
    exit(1);
}

static void check_all(cudaStream_t st) {
    const int shapes[][2] = {{100, 4096}, {37, 4608}, {9, 512}, {5, 14336}, {70, 1040}, {33, 16}};
    for (int ci = 1; ci < kNumCfgs; ci++) {
        double worst = 0;
        for (float amp : {1.0f, 100.0f})
            for (auto &s : shapes) {
                const int n = s[0], cols = s[1];
                LabCase c = lab_case_new(1, n, cols, cols, 1, amp);
                uint8_t *pw = (uint8_t *)malloc((size_t)n * cols);
                for (int o = 0; o < n; o++)
                    for (int k = 0; k < cols; k++)
                        pw[(size_t)o * cols + tsr_mma::e4m3_stored_col(k, cols)] = c.hw[(size_t)o * cols + k];
                CK(cudaMemcpy(c.dw, pw, (size_t)n * cols, cudaMemcpyHostToDevice));
                CK(cudaDeviceSynchronize());
                free(pw);
                Args a = {};
                a.w = c.dw, a.scale = c.ds, a.x = c.dx, a.y = c.dy, a.n_out = n, a.cols = cols, a.ldw = cols,
                a.ldx = cols;
                launch(ci, a, st, false);
                CK(cudaStreamSynchronize(st));
                CK(cudaMemcpy(c.hy, c.dy, sizeof(float) * n, cudaMemcpyDeviceToHost));
                const double e = lab_case_worst(c, 1, n, cols);
                if (!(e <= worst)) worst = e;
                lab_case_free(&c);
            }
        printf("  mma %d rpw %d u %d ks %d: worst %.3g\n", kCfgs[ci].mma, kCfgs[ci].rpw, kCfgs[ci].u, kCfgs[ci].ks,
               worst);
    }
}

static LabBufs g_b;

static float one_ms(cudaStream_t st, int ci, const Shape &S) {
    const size_t bytes = (size_t)S.out * S.in, copies = g_b.pool_bytes / bytes;
    Args a = {};
    a.scale = g_b.s, a.x = g_b.x, a.y = g_b.y, a.n_out = S.out, a.cols = S.in, a.ldw = S.in, a.ldx = S.in;
    return lab_calls_ms(st, 60, [&](int i) {
        a.w = g_b.pool + (size_t)(i % (copies < 64 ? copies : 64)) * bytes;
        launch(ci, a, st, false);
    });
}

static float chain_ms(cudaStream_t st, const int *ci, bool pdl) {
    return lab_token_args_ms<Args>(st, g_b.pool, 1, g_b.s, g_b.x, g_b.x + 128256,
                                   [&](const Args &a, int si) { launch(ci[si], a, st, pdl); });
}

int main(void) {
    const cudaStream_t st = lab_start(check_all, (size_t)8000 << 20, &g_b);
    lab_study(
        "E4M3", 1, kNumCfgs, 2,
        [&](int ci) {
            if (ci == 0) printf("%-20s", "production");
            else printf("%s r%d u%d ks%d         ", kCfgs[ci].mma ? "mma" : "fma", kCfgs[ci].rpw, kCfgs[ci].u,
                        kCfgs[ci].ks);
        },
        [&](int ci, const Shape &S) { return one_ms(st, ci, S); },
        [&](const int *prod, const int *best, bool pdl) {
            printf("  pdl %d: production %.3f ms, best %.3f ms\n", pdl, chain_ms(st, prod, pdl),
                   chain_ms(st, best, pdl));
        });
    return 0;
}
