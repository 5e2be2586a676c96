// cap_lab - does programmatic dependent launch cost the E4M3 GEMV chain
// through an uneven spread of blocks over the SMs?
// Not part of the engine; run by hand on the device:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o cap_lab tools/cuda_lab/cap_lab.cu && ./cap_lab
//
// A token's GEMVs as one graph take 2.50 ms in E4M3 launched the ordinary
// way and 2.67-2.70 as programmatic dependents (bf16: 3.65 against 3.69;
// fp8h_lab, bal_lab). The hypothesis: launched early, a kernel's blocks
// land on the SMs in the order the kernel before frees them, up to the
// occupancy limit each, instead of round-robin over all SMs; E4M3 grids of
// one to three waves then leave some SMs with more blocks than others and
// the kernel waits for the fullest. The test: the same kernels with dynamic
// shared memory that nothing uses, sized so that at most ceil(grid / SMs)
// blocks fit on an SM (so no SM can take more than its share), with and
// without PDL.
#include <cuda_runtime.h>
#include <stdio.h>

#include "kernels/cuda/gemv_row.cuh"

#include "tools/cuda_lab/lab_util.cuh"

using tsr_mma::Args;
using tsr_mma::kBf16;
using tsr_mma::kFp8;

static int g_sms, g_smem_sm; // SMs; shared memory an SM has for blocks

// Bytes of unused dynamic shared memory that cap a kernel at per_sm blocks
// an SM (each block also reserves 1 KiB); 0 when no cap is asked.
static size_t cap_smem(int per_sm) {
    if (per_sm <= 1) per_sm = 2; // one block an SM would ask more than a block may have
    if (per_sm >= 8) return 0;   // 8 blocks of 256 threads fill an SM anyway
    size_t b = (size_t)g_smem_sm / per_sm - 1024;
    return b & ~(size_t)127;
}

template <int WK, int RPW, int U, int KS>
static void launch_row(const Args &p, cudaStream_t st, bool pdl, bool cap) {
    const int rpb = 8 / KS * RPW;
    const unsigned grid = (unsigned)((p.n_out + rpb - 1) / rpb);
    auto k = tsr_row::gemv_row<WK, RPW, U, KS>;
    static bool opted = false; // before any capture: the largest dynamic share a block may ask
    if (!opted) {
        int optin;
        CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
        CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - 1024));
        opted = true;
    }
    const size_t smem = cap ? cap_smem((int)((grid + g_sms - 1) / g_sms)) : 0;
    CK(tsr_pdl::launch(k, grid, 256, smem, st, pdl, p));
}

// mode 0: the production launcher; 1: row kernels on every shape; 2: the
// same capped.
template <int WK> static void launch(int mode, const Args &p, cudaStream_t st, bool pdl) {
    if (mode == 0) {
        CK(tsr_row::launch_decode<WK>(p, 1, tsr_row::kRowDense, st, pdl));
        return;
    }
    const bool cap = mode == 2;
    if (WK == kBf16) {
        if (p.n_out >= 16384) launch_row<WK, 1, 2, 4>(p, st, pdl, cap);
        else launch_row<WK, 2, 2, 2>(p, st, pdl, cap);
    } else {
        if (p.n_out >= 16384) launch_row<WK, 4, 1, 1>(p, st, pdl, cap);
        else launch_row<WK, 2, 1, 1>(p, st, pdl, cap);
    }
}

int main(void) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaDeviceGetAttribute(&g_smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
    printf("%d SMs, %d bytes of shared memory an SM\n", g_sms, g_smem_sm);
    const LabBufs lb = lab_bufs(st, (size_t)15400 << 20);
    uint8_t *pool = lb.pool;
    float *x = lb.x, *s = lb.s;
    // the four row kernels opt in before the graphs are captured
    for (int wk = 0; wk < 2; wk++)
        for (int n_out : {4096, 28672}) {
            Args a = {};
            a.w = pool, a.scale = s, a.n_out = n_out, a.cols = 4096, a.ldw = 4096 * (wk ? 1 : 2), a.ldx = 4096;
            a.x = x, a.y = x + 128256;
            wk ? launch<kFp8>(2, a, st, false) : launch<kBf16>(2, a, st, false);
        }
    CK(cudaStreamSynchronize(st));
    const char *what[] = {"production launcher", "row kernels", "row kernels, capped"};
    for (int wk = 0; wk < 2; wk++)
        for (int round = 0; round < 2; round++)
            for (int mode = 0; mode < 3; mode++)
                for (bool pdl : {false, true}) {
                    const float ms = lab_token_ms(st, pool, wk == kBf16 ? 2 : 1, [&](int i, const Shape &S, const uint8_t *w) {
                        Args a = {};
                        a.w = w, a.scale = wk == kFp8 ? s : nullptr, a.n_out = S.out, a.cols = S.in;
                        a.ldw = (int64_t)S.in * (wk == kBf16 ? 2 : 1), a.ldx = S.in;
                        a.x = (i & 1) ? x + 128256 : x, a.y = (i & 1) ? x : x + 128256;
                        wk == kBf16 ? launch<kBf16>(mode, a, st, pdl) : launch<kFp8>(mode, a, st, pdl);
                    });
                    printf("%s round %d %-22s pdl %d: %.3f ms\n", wk ? "E4M3" : "bf16", round, what[mode], pdl, ms);
                }
    return 0;
}
