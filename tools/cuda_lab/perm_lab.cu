// perm_lab - is the one-row E4M3 GEMV bound by how its lanes load the
// activations?
// Not part of the engine; run by hand on the device:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o perm_lab tools/cuda_lab/perm_lab.cu && ./perm_lab
//
// In gemv_row.cuh a lane's 16 bytes of an E4M3 row are 16 consecutive
// columns, so its activations are 64 consecutive bytes of f32: each of its
// four 16-byte activation loads has the warp's lanes 64 bytes apart, 2 KiB
// for 512 useful bytes, 16 L1 wavefronts where 4 would do (bf16: lanes 32
// bytes apart, 8). Per 512 bytes of weights a warp then moves 64 wavefronts
// of activations; with one row a warp that alone bounds an SM at ~8 bytes of
// weights a clock (~2.1 TB/s on 132 SMs), and rows a warp divide it.
//
// The variant stores each row's columns permuted within every 512-column
// step: the lane's 16 bytes hold columns 4i + 128q + j (lane i, q, j in
// 0..3) at byte 16i + 4q + j, so its four activation loads are x[128q + 4i
// .. + 3]: every load one 512-byte run across the warp (4 wavefronts). A
// plugin that prepares its E4M3 weights at load can store them so; the
// products are the same, added in another order. Rows whose columns are not
// a multiple of 512 are not covered here.
//
// Reports (1) the error against f64 (the weights permuted on the host), (2)
// TB/s per shape at one row, weights out of L2, production against the
// permuted kernel at several configurations, (3) one token's GEMVs as one
// graph, production against the best configuration per shape.
#include <cuda_runtime.h>
#include <stdio.h>

#include "kernels/cuda/gemv_row.cuh"

#include "tools/cuda_lab/lab_util.cuh"

using tsr_mma::Args;
using tsr_mma::kBf16;
using tsr_mma::kFp8;

// gemv_row<WK, RPW, U, KS> with the columns permuted within each step of
// STEP columns (cols % STEP == 0): a lane's K stored weights are columns
// 128 q + 4 i + j (q < K / 4, j < 4). bf16 (K = 8, STEP = 256) the same way:
// its lanes' activations are 32 bytes apart in gemv_row (8 wavefronts a
// load where 4 would do).
template <int WK, int RPW, int U, int KS>
__global__ void __launch_bounds__(256) gemv_perm(const Args p) {
    constexpr int K = tsr_row::Piece<WK>::k, ES = WK == kBf16 ? 2 : 1, STEP = 32 * K;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, seg = warp % KS, grp = warp / KS;
    const int o0 = (blockIdx.x * (8 / KS) + grp) * RPW;
    if (KS == 1 && o0 >= p.n_out) return;
    const uint8_t *row[RPW];
    float acc[RPW];
    lab_rows<RPW>(p, o0, row, acc, 16 * lane);
    tsr_pdl::enter();
    for (int s0 = seg * STEP * U; s0 < p.cols; s0 += STEP * U * KS) {
        uint4 w[U][RPW];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (s0 + u * STEP < p.cols)
#pragma unroll
                for (int r = 0; r < RPW; r++) w[u][r] = tsr_mma::load_w(row[r] + (int64_t)(s0 + u * STEP) * ES);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int sb = s0 + u * STEP;
            if (sb >= p.cols) break;
            float xv[K];
#pragma unroll
            for (int q = 0; q < K / 4; q++) {
                const float4 f = __ldg(reinterpret_cast<const float4 *>(p.x + sb + 128 * q + 4 * lane));
                xv[4 * q] = f.x, xv[4 * q + 1] = f.y, xv[4 * q + 2] = f.z, xv[4 * q + 3] = f.w;
            }
            if (WK == kFp8)
#pragma unroll
                for (int i = 0; i < K; i++) xv[i] = __half2float(__float2half_rn(xv[i] * 0.0625f));
#pragma unroll
            for (int r = 0; r < RPW; r++) acc[r] = tsr_row::dot_piece<WK>(w[u][r], xv, acc[r]);
        }
    }
    lab_row_store<RPW, KS>(p, acc, warp, lane, seg, o0, tsr_mma::kind_mul<WK>());
}

template <int WK, int RPW, int U, int KS> static void launch_perm(const Args &p, cudaStream_t st, bool pdl) {
    const int rpb = 8 / KS * RPW;
    CK(tsr_pdl::launch(gemv_perm<WK, RPW, U, KS>, (unsigned)((p.n_out + rpb - 1) / rpb), 256, 0, st, pdl, p));
}

// configuration 0: production (launch_decode); then (rows a warp, steps in flight, warps a row group)
struct Cfg {
    int rpw, u, ks;
};
static const Cfg kCfgs[2][12] = {
    {{0, 0, 0}, {2, 2, 2}, {1, 2, 4}, {1, 2, 2}, {2, 2, 1}, {1, 2, 1}, {2, 1, 2}, {4, 1, 1}, {1, 4, 4}, {2, 1, 1},
     {1, 4, 2}, {2, 2, 4}},
    {{0, 0, 0}, {1, 1, 1}, {1, 2, 1}, {2, 1, 1}, {2, 2, 1}, {4, 1, 1}, {1, 2, 2}, {2, 1, 2}, {2, 2, 2}, {4, 1, 2},
     {1, 2, 4}, {2, 1, 4}}};
static const int kNumCfgs = 12;

template <int WK> static void launch(int ci, const Args &p, cudaStream_t st, bool pdl) {
    if (ci == 0) {
        CK(tsr_row::launch_decode<WK>(p, 1, tsr_row::kRowDense, st, pdl));
        return;
    }
    const Cfg c = kCfgs[WK][ci];
#define C(R, U, KS)                                                                                          \
    if (c.rpw == R && c.u == U && c.ks == KS) return launch_perm<WK, R, U, KS>(p, st, pdl);
    C(1, 1, 1) C(1, 2, 1) C(2, 1, 1) C(2, 2, 1) C(4, 1, 1) C(1, 2, 2) C(2, 1, 2) C(2, 2, 2) C(4, 1, 2) C(1, 2, 4)
    C(2, 1, 4) C(1, 4, 4) C(1, 4, 2) C(2, 2, 4)
#undef C
    printf("no configuration %d\n", ci);
    exit(1);
}
static void launch_wk(int wk, int ci, const Args &p, cudaStream_t st, bool pdl) {
    if (wk == kBf16) launch<kBf16>(ci, p, st, pdl);
    else launch<kFp8>(ci, p, st, pdl);
}

// The stored element of logical column k of a row (k = 4 lanes' ... see
// gemv_perm): per = the lane's elements (16 E4M3, 8 bf16).
static int perm_elem(int k, int per) {
    const int step = 32 * per, s = k / step, r = k % step, q = r / 128, i = (r % 128) / 4, j = r % 4;
    return s * step + per * i + 4 * q + j;
}

static void check_all(cudaStream_t st) {
    const int shapes[][2] = {{100, 4096}, {37, 4608}, {9, 512}, {5, 14336}, {70, 1024}};
    for (int wk = 0; wk < 2; wk++)
        for (int ci = 1; ci < kNumCfgs; ci++) {
            double worst = 0;
            const int es = wk ? 1 : 2;
            for (float amp : {1.0f, 100.0f})
                for (auto &s : shapes) {
                    const int n = s[0], cols = s[1];
                    LabCase c = lab_case_new(wk, n, cols, (int64_t)cols * es, 1, amp);
                    uint8_t *pw = (uint8_t *)malloc((size_t)n * cols * es);
                    for (int o = 0; o < n; o++)
                        for (int k = 0; k < cols; k++)
                            memcpy(pw + ((size_t)o * cols + perm_elem(k, wk ? 16 : 8)) * es,
                                   c.hw + ((size_t)o * cols + k) * es, es);
                    CK(cudaMemcpy(c.dw, pw, (size_t)n * cols * es, cudaMemcpyHostToDevice));
                    CK(cudaDeviceSynchronize()); // pageable copies may return before they land
                    free(pw);
                    Args a = {}; // lab_case_worst takes bf16 weights unscaled
                    a.w = c.dw, a.scale = wk ? c.ds : nullptr, a.x = c.dx, a.y = c.dy, a.n_out = n, a.cols = cols,
                    a.ldw = (int64_t)cols * es, a.ldx = cols;
                    launch_wk(wk, ci, a, st, false);
                    CK(cudaStreamSynchronize(st));
                    CK(cudaMemcpy(c.hy, c.dy, sizeof(float) * n, cudaMemcpyDeviceToHost));
                    const double e = lab_case_worst(c, wk, n, cols);
                    if (!(e <= worst)) worst = e;
                    lab_case_free(&c);
                }
            printf("  %s rpw %d u %d ks %d: worst %.3g\n", wk ? "E4M3" : "bf16", kCfgs[wk][ci].rpw, kCfgs[wk][ci].u,
                   kCfgs[wk][ci].ks, worst);
        }
}

static LabBufs g_b;

static float one_ms(cudaStream_t st, int wk, int ci, const Shape &S) {
    const int es = wk ? 1 : 2;
    const size_t bytes = (size_t)S.out * S.in * es, copies = g_b.pool_bytes / bytes;
    Args a = {};
    a.scale = g_b.s, a.x = g_b.x, a.y = g_b.y, a.n_out = S.out, a.cols = S.in, a.ldw = (int64_t)S.in * es, a.ldx = S.in;
    return lab_calls_ms(st, 60, [&](int i) {
        a.w = g_b.pool + (size_t)(i % (copies < 64 ? copies : 64)) * bytes;
        launch_wk(wk, ci, a, st, false);
    });
}

static float chain_ms(cudaStream_t st, int wk, const int *ci, bool pdl) {
    return lab_token_args_ms<Args>(st, g_b.pool, wk ? 1 : 2, g_b.s, g_b.x, g_b.x + 128256,
                                   [&](const Args &a, int si) { launch_wk(wk, ci[si], a, st, pdl); });
}

int main(void) {
    const cudaStream_t st = lab_start(check_all, (size_t)15400 << 20, &g_b);
    for (int wk = 0; wk < 2; wk++)
        lab_study(
            wk ? "E4M3" : "bf16", wk ? 1 : 2, kNumCfgs, 2,
            [&](int ci) {
                if (ci == 0) printf("%-20s", "production");
                else printf("rpw %d u %d ks %d     ", kCfgs[wk][ci].rpw, kCfgs[wk][ci].u, kCfgs[wk][ci].ks);
            },
            [&](int ci, const Shape &S) { return one_ms(st, wk, ci, S); },
            [&](const int *prod, const int *best, bool pdl) {
                printf("  pdl %d: production %.3f ms, best %.3f ms\n", pdl, chain_ms(st, wk, prod, pdl),
                       chain_ms(st, wk, best, pdl));
            });
    return 0;
}
