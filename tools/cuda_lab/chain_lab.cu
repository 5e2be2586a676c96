// chain_lab - does one persistent kernel read a decode token's weights
// closer to the bandwidth floor than one kernel per GEMV? Not part of the
// engine; run by hand on the device:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o chain_lab tools/cuda_lab/chain_lab.cu && ./chain_lab
//
// The question behind it (issue #7): a one-row pass of the Llama-3-8B shape
// spends ~0.17 ms (bf16) and ~0.65 ms (E4M3) of its GEMVs above the floor in
// the ramp and tail of 129 separate kernels, however they are launched (CUDA
// graph, programmatic dependent launch). A persistent kernel keeps every SM
// resident across the chain: stage s + 1's first weights (which depend on
// nothing) are loaded before the grid-wide barrier that makes stage s's
// output visible, so the memory system need not drain between GEMVs.
//
// Measured here, in one run, for bf16 and E4M3 weights:
//  (1) the persistent chain against the production launcher (gemv_row.cuh's
//      launch_decode) on three GEMVs with independent inputs: every output
//      within 1e-5 of the largest |y| (relative; the summation order differs);
//  (2) one token's 129 GEMVs (32 layers of q/k/v, o, gate/up, down, then the
//      LM head, each its own weights, each reading the one before's output)
//      through the production launcher as programmatic dependents in a CUDA
//      graph, and through the persistent kernel at several configurations
//      (loads in flight per warp, weights loaded before the barrier or not).
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/gemv_row.cuh"
#include "tools/cuda_lab/lab_util.cuh"

using namespace tsr_mma;

// One GEMV of the chain: y[o] = scale(o) * sum_k w[o, k] x[k].
struct Stage {
    const uint8_t *w;
    const float *scale; // or null
    const float *x;     // written by an earlier stage of the same launch
    float *y;
    int64_t ldw;
    int n_out, cols;
};

// Arrive at the grid-wide barrier, wait until all blocks have: the count
// reaches target (counts only grow within a launch).
__device__ __forceinline__ void grid_sync(unsigned *count, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned v;
        asm volatile("atom.add.release.gpu.u32 %0, [%1], 1;" : "=r"(v) : "l"(count) : "memory");
        do asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
        while (v < target);
    }
    __syncthreads();
}

constexpr int kThreads = 512;

// Every warp of the grid owns rows gw, gw + T, ... of each stage (T warps in
// all) and walks each from start to end as gemv_row does, U loads of 16
// bytes per lane in flight; the stage's input is first copied into shared
// memory (from L2: it was written by other SMs in this launch). PRE: before
// the barrier at the end of a stage, each warp loads the first U pieces of
// its first row of the next stage.
template <int WK, int U, bool PRE>
__global__ void __launch_bounds__(kThreads, 1)
    chain_kernel(const Stage *__restrict__ stages, int n_stages, unsigned *bar) {
    extern __shared__ float4 xs4[];
    const float *xs = reinterpret_cast<const float *>(xs4);
    constexpr int K = tsr_row::Piece<WK>::k, ES = WK == kBf16 ? 2 : 1, STEP = 32 * K;
    const int lane = threadIdx.x & 31, warps = kThreads / 32;
    const int gw = blockIdx.x * warps + (threadIdx.x >> 5), T = gridDim.x * warps;
    uint4 pre[U];
    bool have_pre = false;
    for (int s = 0; s < n_stages; s++) {
        const Stage S = stages[s];
        for (int i = threadIdx.x; i < S.cols / 4; i += kThreads) {
            float4 f = __ldcg(reinterpret_cast<const float4 *>(S.x) + i);
            if (WK == kFp8) { // rounded once here rather than per row
                f.x = __half2float(__float2half_rn(f.x * 0.0625f)), f.y = __half2float(__float2half_rn(f.y * 0.0625f));
                f.z = __half2float(__float2half_rn(f.z * 0.0625f)), f.w = __half2float(__float2half_rn(f.w * 0.0625f));
            }
            xs4[i] = f;
        }
        __syncthreads();
        for (int o = gw; o < S.n_out; o += T) {
            const uint8_t *row = S.w + (int64_t)o * S.ldw;
            float acc = 0.0f;
            for (int k0 = lane * K; k0 < S.cols; k0 += STEP * U) {
                uint4 w[U];
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (have_pre) w[u] = pre[u];
                    else if (k0 + u * STEP < S.cols) w[u] = load_w(row + (int64_t)(k0 + u * STEP) * ES);
                have_pre = false;
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int k = k0 + u * STEP;
                    if (k >= S.cols) break;
                    float xv[K];
#pragma unroll
                    for (int q = 0; q < K / 4; q++) {
                        const float4 f = reinterpret_cast<const float4 *>(xs + k)[q];
                        xv[4 * q] = f.x, xv[4 * q + 1] = f.y, xv[4 * q + 2] = f.z, xv[4 * q + 3] = f.w;
                    }
                    acc = tsr_row::dot_piece<WK>(w[u], xv, acc);
                }
            }
            for (int m = 16; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
            if (lane == 0) S.y[o] = acc * (S.scale ? S.scale[o] : 1.0f) * kind_mul<WK>();
        }
        if (s + 1 == n_stages) break;
        if (PRE) {
            const Stage N = stages[s + 1];
            if (gw < N.n_out) {
                const uint8_t *row = N.w + (int64_t)gw * N.ldw;
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (lane * K + u * STEP < N.cols) pre[u] = load_w(row + (int64_t)(lane * K + u * STEP) * ES);
                have_pre = true;
            }
        }
        grid_sync(bar, (unsigned)(s + 1) * gridDim.x);
    }
}

// ---- the chain's host side
struct Persist {
    int wk, u, pre;
    int grid;
    Stage *d_stages;
    int n;
    unsigned *bar;
    size_t smem;
};

template <int WK, int U, bool PRE> static void launch_t(const Persist &p, cudaStream_t st) {
    auto k = chain_kernel<WK, U, PRE>;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)p.smem));
    CK(cudaMemsetAsync(p.bar, 0, sizeof(unsigned), st));
    void *args[] = {(void *)&p.d_stages, (void *)&p.n, (void *)&p.bar};
    CK(cudaLaunchCooperativeKernel((void *)k, p.grid, kThreads, args, p.smem, st));
}

static void launch_persist(const Persist &p, cudaStream_t st) {
#define L(WK, U, PRE)                                                                                              \
    if (p.wk == WK && p.u == U && p.pre == PRE) return launch_t<WK, U, PRE>(p, st);
    L(kBf16, 4, 0) L(kBf16, 4, 1) L(kBf16, 8, 0) L(kBf16, 8, 1) L(kBf16, 2, 1);
    L(kFp8, 4, 0) L(kFp8, 4, 1) L(kFp8, 8, 0) L(kFp8, 8, 1) L(kFp8, 2, 1);
#undef L
    printf("no such configuration\n");
    exit(1);
}

static int64_t row_bytes(int wk, int cols) { return (int64_t)cols * (wk == kBf16 ? 2 : 1); }

static Persist make_persist(int wk, int u, int pre, const Stage *h, int n, unsigned *bar) {
    Persist p = {};
    p.wk = wk, p.u = u, p.pre = pre, p.n = n, p.bar = bar;
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    p.grid = sms; // one block of kThreads per SM (launch bounds: 1)
    int maxc = 0;
    for (int i = 0; i < n; i++) maxc = h[i].cols > maxc ? h[i].cols : maxc;
    p.smem = (size_t)maxc * sizeof(float);
    CK(cudaMalloc(&p.d_stages, n * sizeof(Stage)));
    CK(cudaMemcpy(p.d_stages, h, n * sizeof(Stage), cudaMemcpyHostToDevice));
    return p;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

// Median over 7 timings of 5 runs of f (run once before to warm).
template <typename F> static float median_ms(cudaStream_t st, F f) {
    f();
    CK(cudaStreamSynchronize(st));
    float t[7];
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int rep = 0; rep < 7; rep++) {
        CK(cudaEventRecord(a, st));
        for (int i = 0; i < 5; i++) f();
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&t[rep], a, b));
        t[rep] /= 5;
    }
    cudaEventDestroy(a), cudaEventDestroy(b);
    qsort(t, 7, sizeof *t, cmp_float);
    return t[3];
}

static Args stage_args(const Stage &s) {
    Args a = {};
    a.w = s.w, a.ldw = s.ldw, a.scale = s.scale, a.n_out = s.n_out, a.cols = s.cols, a.ldx = s.cols;
    a.x = s.x, a.y = s.y;
    return a;
}

static void production(int wk, const Stage *h, int n, cudaStream_t st, bool pdl) {
    for (int i = 0; i < n; i++) {
        const Args a = stage_args(h[i]);
        CK(wk == kBf16 ? tsr_row::launch_decode<kBf16>(a, 1, tsr_row::kRowDense, st, pdl)
                       : tsr_row::launch_decode<kFp8>(a, 1, tsr_row::kRowDense, st, pdl));
    }
}

__global__ void fill_x(float *x, int n, uint32_t seed) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        x[i] = ((float)(h & 0xffff) / 65536.0f - 0.5f) * 0.01f;
    }
}

// (1): three independent GEMVs (ragged row counts, three widths).
static int check(int wk, int u, int pre, uint8_t *pool, float *buf, float *scale, unsigned *bar, cudaStream_t st) {
    const int shapes[3][2] = {{6001, 4096}, {333, 14336}, {4099, 1024}};
    Stage h[3], r[3];
    size_t off = 0;
    float *x = buf, *y = buf + 3 * 16384, *yr = y + 3 * 16384;
    for (int i = 0; i < 3; i++) {
        h[i].w = pool + off, h[i].ldw = row_bytes(wk, shapes[i][1]);
        off += (size_t)shapes[i][0] * h[i].ldw;
        h[i].scale = wk == kFp8 ? scale : nullptr;
        h[i].x = x + i * 16384, h[i].y = y + i * 16384;
        h[i].n_out = shapes[i][0], h[i].cols = shapes[i][1];
        r[i] = h[i], r[i].y = yr + i * 16384;
    }
    Persist p = make_persist(wk, u, pre, h, 3, bar);
    launch_persist(p, st);
    production(wk, r, 3, st, false);
    CK(cudaStreamSynchronize(st));
    static float a[3 * 16384], b[3 * 16384];
    CK(cudaMemcpy(a, y, sizeof a, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b, yr, sizeof b, cudaMemcpyDeviceToHost));
    cudaFree(p.d_stages);
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        float big = 0, diff = 0;
        for (int o = 0; o < shapes[i][0]; o++) {
            big = fmaxf(big, fabsf(b[i * 16384 + o]));
            diff = fmaxf(diff, fabsf(a[i * 16384 + o] - b[i * 16384 + o]));
        }
        if (!(diff <= 1e-5f * big)) {
            printf("  %s u %d pre %d stage %d: max diff %g of max |y| %g\n", wk ? "E4M3" : "bf16", u, pre, i, diff, big);
            ok = 0;
        }
    }
    return ok;
}

int main(void) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const size_t pool_bytes = (size_t)15400 << 20;
    uint8_t *pool;
    float *buf, *scale;
    unsigned *bar;
    CK(cudaMalloc(&pool, pool_bytes));
    CK(cudaMalloc(&buf, 16 * 16384 * sizeof(float) + 2 * 128256 * sizeof(float)));
    CK(cudaMalloc(&scale, 128256 * sizeof(float)));
    CK(cudaMalloc(&bar, sizeof(unsigned)));
    lab_fill<<<4096, 256, 0, st>>>(pool, pool_bytes, 7);
    fill_x<<<64, 256, 0, st>>>(buf, 16 * 16384, 11);
    fill_x<<<64, 256, 0, st>>>(scale, 128256, 13);
    CK(cudaStreamSynchronize(st));

    const int cfgs[][2] = {{4, 0}, {4, 1}, {8, 0}, {8, 1}, {2, 1}}; // u, pre
    int ok = 1;
    for (int wk = 0; wk < 2; wk++)
        for (auto &c : cfgs) ok &= check(wk, c[0], c[1], pool, buf, scale, bar, st);
    printf("correctness: persistent chain %s the production launcher\n", ok ? "within 1e-5 of" : "DIFFERS from");

    // (2) one token: 32 x (q/k/v 6144 x 4096, o 4096 x 4096, gate/up 28672 x
    // 4096, down 4096 x 14336), LM head 128256 x 4096; ping-pong activations
    const int shapes[5][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
    float *act[2] = {buf, buf + 128256};
    printf("\none token's 129 GEMVs, median of 7x5 (ms, TB/s; floor at 4.29 TB/s):\n");
    for (int wk = 0; wk < 2; wk++) {
        Stage h[129];
        size_t off = 0;
        double bytes = 0;
        for (int i = 0; i < 129; i++) {
            const int sh = i < 128 ? i % 4 : 4;
            h[i].ldw = row_bytes(wk, shapes[sh][1]);
            h[i].w = pool + off, off += (size_t)shapes[sh][0] * h[i].ldw;
            bytes += (double)shapes[sh][0] * h[i].ldw;
            h[i].scale = wk == kFp8 ? scale : nullptr;
            h[i].x = act[i & 1], h[i].y = act[(i & 1) ^ 1];
            h[i].n_out = shapes[sh][0], h[i].cols = shapes[sh][1];
        }
        if (off > pool_bytes) return printf("pool too small\n"), 1;
        const char *name = wk ? "E4M3" : "bf16";
        printf("%s: %.2f GB, floor %.3f ms\n", name, bytes / 1e9, bytes / 4.29e12 * 1e3);
        for (int pdl = 0; pdl < 2; pdl++) {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            production(wk, h, 129, st, pdl);
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            const float ms = median_ms(st, [&] { CK(cudaGraphLaunch(ge, st)); });
            printf("  production launcher, graph%s: %.3f ms  %.2f TB/s\n", pdl ? " + PDL" : "", ms, bytes / ms / 1e9);
            cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
        }
        for (auto &c : cfgs) {
            Persist p = make_persist(wk, c[0], c[1], h, 129, bar);
            const float ms = median_ms(st, [&] { launch_persist(p, st); });
            printf("  persistent, %d loads in flight per lane, %s: %.3f ms  %.2f TB/s\n", c[0],
                   c[1] ? "first loads before the barrier" : "loads after the barrier", ms, bytes / ms / 1e9);
            cudaFree(p.d_stages);
        }
        // the persistent kernel's fixed costs: 129 stages of no rows
        for (int cols : {0, 4096, 14336}) {
            Stage e[129];
            for (int i = 0; i < 129; i++) e[i] = h[i], e[i].n_out = 0, e[i].cols = cols;
            Persist p = make_persist(wk, 8, 0, e, 129, bar);
            if (!p.smem) p.smem = 16;
            const float ms = median_ms(st, [&] { launch_persist(p, st); });
            printf("  persistent, 129 stages of no rows, %5d activations copied in: %.3f ms (%.2f us a stage)\n", cols,
                   ms, ms * 1e3 / 129);
            cudaFree(p.d_stages);
        }
    }
    return ok ? 0 : 1;
}
