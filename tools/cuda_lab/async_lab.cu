// async_lab - does the one-row GEMV read closer to the memory's rate when
// each warp keeps several steps of its rows in flight through cp.async?
// Not part of the engine; run by hand on the device:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o async_lab tools/cuda_lab/async_lab.cu && ./async_lab
//
// The production kernel (kernels/cuda/gemv_row.cuh) loads a step of its rows
// (16 bytes a lane a row) into registers, waits, multiplies, then loads the
// next: while a warp multiplies nothing of its own is in flight, and more
// steps in flight cost registers (occupancy). E4M3 reads 1.9-3.2 TB/s on
// the Llama-3-8B shapes where bf16 reads 3.0-4.4 with the same bytes;
// cheaper arithmetic (fp8h_lab), a copy engine feeding few consumer warps
// (bulk_lab) and balanced ranges (bal_lab) did not close it.
//
// The variant: each warp owns RPW rows as in gemv_row (one warp a row
// group), with a ring of S steps in shared memory; each lane copies its own
// 16-byte pieces with cp.async.cg (to L2 and shared memory, not L1) S - 1
// steps ahead of the step it multiplies, and reads back only what it copied
// itself, so a lane waits on its own copies (cp.async.wait_group) and never
// on the other lanes. Bytes in flight per warp: (S - 1) x RPW x 512 without
// registers. The arithmetic and each lane's order of products are
// gemv_row's (dot_piece), so with one warp a row group the outputs are
// gemv_row's bit for bit (checked). EARLY: the first S - 1 steps' copies are
// issued before the programmatic-dependent wait (weights depend on nothing).
//
// Reports (1) bit-identity with gemv_row (E4M3, RPW 2 and 4) and the error
// against f64 on odd shapes, (2) TB/s per shape at one row with weights out of
// L2, production against each configuration, (3) one token's GEMVs as one
// graph, production against the best configuration per shape, with and
// without programmatic dependent launch.
#include <cuda_runtime.h>
#include <stdio.h>

#include "kernels/cuda/gemv_row.cuh"

#include "tools/cuda_lab/lab_util.cuh"

using tsr_mma::Args;
using tsr_mma::kBf16;
using tsr_mma::kFp8;

__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

template <int WK, int RPW, int S, bool EARLY>
__global__ void __launch_bounds__(256) gemv_async(const Args p) {
    constexpr int K = tsr_row::Piece<WK>::k, ES = WK == kBf16 ? 2 : 1, STEP = 32 * K;
    extern __shared__ uint4 ring[]; // [warp][S][RPW][32 lanes]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int o0 = (blockIdx.x * 8 + warp) * RPW;
    if (o0 >= p.n_out) return;
    uint4 *mine = ring + warp * S * RPW * 32 + lane;
    const uint8_t *row[RPW];
    lab_rows<RPW>(p, o0, row);
    const int steps = (p.cols + STEP - 1) / STEP;
    auto issue = [&](int j) { // step j into stage j % S; always one group
        const int k = j * STEP + lane * K;
        if (j < steps && k < p.cols)
#pragma unroll
            for (int r = 0; r < RPW; r++) cp_async16(mine + ((j % S) * RPW + r) * 32, row[r] + (int64_t)k * ES);
        cp_commit();
    };
    if (EARLY) {
        for (int j = 0; j < S - 1; j++) issue(j);
        tsr_pdl::enter();
    } else {
        tsr_pdl::enter();
        for (int j = 0; j < S - 1; j++) issue(j);
    }
    float acc[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) acc[r] = 0.0f;
    for (int j = 0; j < steps; j++) {
        issue(j + S - 1);
        cp_wait<S - 1>(); // step j's group is complete
        const int k = j * STEP + lane * K;
        if (k < p.cols) {
            float xv[K];
            lab_piece_x<WK, K>(p.x, k, p.cols, xv);
#pragma unroll
            for (int r = 0; r < RPW; r++) acc[r] = tsr_row::dot_piece<WK>(mine[((j % S) * RPW + r) * 32], xv, acc[r]);
        }
    }
    const float mul = tsr_mma::kind_mul<WK>();
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        float v = acc[r];
        for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
        const int o = o0 + r;
        if (lane == 0 && o < p.n_out) p.y[o] = v * (p.scale ? p.scale[o] : 1.0f) * mul;
    }
}

template <int WK, int RPW, int S, bool EARLY> static void launch_async(const Args &p, cudaStream_t st, bool pdl) {
    auto k = gemv_async<WK, RPW, S, EARLY>;
    const size_t smem = (size_t)8 * S * RPW * 512;
    static bool opted = false; // before any capture
    if (!opted) {
        CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        opted = true;
    }
    CK(tsr_pdl::launch(k, (unsigned)((p.n_out + 8 * RPW - 1) / (8 * RPW)), 256, smem, st, pdl, p));
}

// configuration 0: production (launch_decode); then (rows a warp, stages)
struct Cfg {
    int rpw, s;
};
static const Cfg kCfgs[] = {{0, 0}, {1, 4}, {1, 8}, {2, 3}, {2, 4}, {2, 8}, {4, 2}, {4, 3}, {4, 4}};
static const int kNumCfgs = sizeof kCfgs / sizeof kCfgs[0];

template <int WK> static void launch(int ci, bool early, const Args &p, cudaStream_t st, bool pdl) {
    switch (ci * 2 + early) {
    case 0:
    case 1: CK(tsr_row::launch_decode<WK>(p, 1, tsr_row::kRowDense, st, pdl)); break;
#define C(I, R, S)                                                                                           \
    case 2 * I: launch_async<WK, R, S, false>(p, st, pdl); break;                                            \
    case 2 * I + 1: launch_async<WK, R, S, true>(p, st, pdl); break;
        C(1, 1, 4) C(2, 1, 8) C(3, 2, 3) C(4, 2, 4) C(5, 2, 8) C(6, 4, 2) C(7, 4, 3) C(8, 4, 4)
#undef C
    }
}
static void launch_wk(int wk, int ci, bool early, const Args &p, cudaStream_t st, bool pdl) {
    if (wk == kBf16) launch<kBf16>(ci, early, p, st, pdl);
    else launch<kFp8>(ci, early, p, st, pdl);
}

// (1): worst error against f64 over odd shapes; for E4M3 with RPW 2 or 4
// also whether the outputs equal gemv_row's (same rows a warp) bit for bit.
static void check_all(cudaStream_t st) {
    const int shapes[][2] = {{100, 4096}, {37, 4112}, {9, 16}, {5, 14336}, {70, 528}};
    for (int wk = 0; wk < 2; wk++)
        for (int ci = 1; ci < kNumCfgs; ci++)
            for (int early = 0; early < 2; early++) {
            double worst = 0;
            int same = 1;
            for (float amp : {1.0f, 100.0f})
                for (auto &s : shapes) {
                    const int n = s[0], cols = s[1];
                    const int64_t ldw = (int64_t)cols * (wk ? 1 : 2);
                    LabCase c = lab_case_new(wk, n, cols, ldw, 1, amp);
                    Args a = {}; // lab_case_worst takes bf16 weights unscaled
                    a.w = c.dw, a.scale = wk ? c.ds : nullptr, a.x = c.dx, a.y = c.dy, a.n_out = n, a.cols = cols, a.ldw = ldw,
                    a.ldx = cols;
                    launch_wk(wk, ci, early, a, st, false);
                    CK(cudaStreamSynchronize(st));
                    CK(cudaMemcpy(c.hy, c.dy, sizeof(float) * n, cudaMemcpyDeviceToHost));
                    const double e = lab_case_worst(c, wk, n, cols);
                    if (!(e <= worst)) worst = e;
                    if (wk == kFp8 && (kCfgs[ci].rpw == 2 || kCfgs[ci].rpw == 4)) {
                        float *ref = (float *)malloc(sizeof(float) * n);
                        CK(cudaMemset(c.dy, 0xff, sizeof(float) * n));
                        if (kCfgs[ci].rpw == 2) CK((tsr_row::launch_cfg<kFp8, 2, 1, 1, false>(a, st, false)));
                        else CK((tsr_row::launch_cfg<kFp8, 4, 1, 1, false>(a, st, false)));
                        CK(cudaStreamSynchronize(st));
                        CK(cudaMemcpy(ref, c.dy, sizeof(float) * n, cudaMemcpyDeviceToHost));
                        if (memcmp(ref, c.hy, sizeof(float) * n)) same = 0;
                        free(ref);
                    }
                    lab_case_free(&c);
                }
            printf("  %s rpw %d stages %d early %d: worst %.3g%s\n", wk ? "E4M3" : "bf16", kCfgs[ci].rpw, kCfgs[ci].s,
                   early, worst, wk == kFp8 && kCfgs[ci].rpw != 1 ? (same ? ", = gemv_row" : ", DIFFERS from gemv_row") : "");
        }
}

static LabBufs g_b;

static float one_ms(cudaStream_t st, int wk, int ci, const Shape &S) {
    const size_t bytes = (size_t)S.out * S.in * (wk ? 1 : 2), copies = g_b.pool_bytes / bytes;
    Args a = {};
    a.scale = g_b.s, a.x = g_b.x, a.y = g_b.y, a.n_out = S.out, a.cols = S.in, a.ldw = (int64_t)S.in * (wk ? 1 : 2),
    a.ldx = S.in;
    return lab_calls_ms(st, 60, [&](int i) {
        a.w = g_b.pool + (size_t)(i % (copies < 64 ? copies : 64)) * bytes;
        launch_wk(wk, ci, false, a, st, false);
    });
}

static float chain_ms(cudaStream_t st, int wk, const int *ci, bool early, bool pdl) {
    return lab_token_args_ms<Args>(st, g_b.pool, wk ? 1 : 2, g_b.s, g_b.x, g_b.x + 128256,
                                   [&](const Args &a, int si) { launch_wk(wk, ci[si], early, a, st, pdl); });
}

int main(void) {
    const cudaStream_t st = lab_start(check_all, (size_t)15400 << 20, &g_b);
    for (int wk = 1; wk >= 0; wk--)
        lab_study(
            wk ? "E4M3" : "bf16", wk ? 1 : 2, kNumCfgs, 1,
            [&](int ci) {
                if (ci == 0) printf("%-20s", "production");
                else printf("rpw %d stages %d      ", kCfgs[ci].rpw, kCfgs[ci].s);
            },
            [&](int ci, const Shape &S) { return one_ms(st, wk, ci, S); },
            [&](const int *prod, const int *best, bool pdl) {
                printf("  pdl %d: production %.3f ms, best %.3f ms, best early %.3f ms\n", pdl,
                       chain_ms(st, wk, prod, false, pdl), chain_ms(st, wk, best, false, pdl),
                       chain_ms(st, wk, best, true, pdl));
            });
    return 0;
}
