// cuda_lab - measurements that decide how tessera's CUDA decode path is built:
// (1) what a kernel launch costs on this machine (stream launches, graph
// replay, capture + exec update), (2) what bandwidth decode GEMV kernel
// variants reach at Llama-3-8B shapes. Not part of the engine; run by hand:
//   nvcc -O3 -arch=sm_90 -o lab tools/cuda_lab/lab.cu && ./lab
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tools/cuda_lab/lab_check.cuh"

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

__global__ void empty_k(int *p, int v) { if (p && threadIdx.x == 0 && v < 0) *p = v; }

static void launch_costs(cudaStream_t st) {
    const int N = 600;
    for (int w = 0; w < 100; w++) empty_k<<<1, 32, 0, st>>>(nullptr, w);
    CK(cudaStreamSynchronize(st));
    double t0 = now();
    for (int i = 0; i < N; i++) empty_k<<<1, 32, 0, st>>>(nullptr, i);
    double t1 = now();
    CK(cudaStreamSynchronize(st));
    double t2 = now();
    printf("stream: %d launches issue %.2f us each, complete %.2f us each\n", N, (t1 - t0) / N * 1e6, (t2 - t0) / N * 1e6);
    // legacy default stream
    t0 = now();
    for (int i = 0; i < N; i++) empty_k<<<1, 32>>>(nullptr, i);
    t1 = now();
    CK(cudaDeviceSynchronize());
    t2 = now();
    printf("legacy stream: issue %.2f us, complete %.2f us each\n", (t1 - t0) / N * 1e6, (t2 - t0) / N * 1e6);
    // capture
    cudaGraph_t g; cudaGraphExec_t ge;
    t0 = now();
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < N; i++) empty_k<<<1, 32, 0, st>>>(nullptr, i);
    CK(cudaStreamEndCapture(st, &g));
    t1 = now();
    CK(cudaGraphInstantiate(&ge, g, 0));
    t2 = now();
    printf("capture %.2f us/node, instantiate %.1f ms\n", (t1 - t0) / N * 1e6, (t2 - t1) * 1e3);
    CK(cudaGraphLaunch(ge, st)); CK(cudaStreamSynchronize(st));
    const int R = 20;
    t0 = now();
    for (int r = 0; r < R; r++) CK(cudaGraphLaunch(ge, st));
    t1 = now();
    CK(cudaStreamSynchronize(st));
    t2 = now();
    printf("graph replay: launch %.1f us, %.2f us per node on device\n", (t1 - t0) / R * 1e6, (t2 - t0) / R / N * 1e6);
    // capture again + exec update (the 'capture every step' design)
    double tc = 0, tu = 0;
    for (int r = 0; r < R; r++) {
        cudaGraph_t g2;
        double a = now();
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < N; i++) empty_k<<<1 + (r & 1), 32, 0, st>>>(nullptr, i + r);
        CK(cudaStreamEndCapture(st, &g2));
        double b = now();
        cudaGraphExecUpdateResultInfo info;
        CK(cudaGraphExecUpdate(ge, g2, &info));
        double c = now();
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        cudaGraphDestroy(g2);
        tc += b - a; tu += c - b;
    }
    printf("re-capture %.2f us/node, exec update %.2f us/node\n", tc / R / N * 1e6, tu / R / N * 1e6);
    cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
}

// ---- GEMV variants: y[r, o] = sum_c x[r, c] w[o, c], bf16 w, f32 x.
__device__ __forceinline__ void w8(const uint4 &raw, float *v) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&raw);
#pragma unroll
    for (int j = 0; j < 4; j++) { float2 f = __bfloat1622float2(h[j]); v[2 * j] = f.x; v[2 * j + 1] = f.y; }
}
__device__ __forceinline__ void x8(const float *p, float *v) {
    const float4 a = __ldg(reinterpret_cast<const float4 *>(p)), b = __ldg(reinterpret_cast<const float4 *>(p) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// V0: today's kernel: one warp per output row, 16-byte loads, no unrolling.
template <int R>
__global__ void __launch_bounds__(256) v0(const __nv_bfloat16 *w, const float *x, float *y, int n_out, int ld) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int o = blockIdx.x * 8 + warp;
    if (o >= n_out) return;
    const __nv_bfloat16 *wr = w + (size_t)o * ld;
    float acc[R] = {};
    for (int i = lane * 8; i < ld; i += 256) {
        float wf[8]; w8(__ldg(reinterpret_cast<const uint4 *>(wr + i)), wf);
#pragma unroll
        for (int r = 0; r < R; r++) { float xf[8]; x8(x + (size_t)r * ld + i, xf);
#pragma unroll
            for (int j = 0; j < 8; j++) acc[r] = fmaf(wf[j], xf[j], acc[r]); }
    }
#pragma unroll
    for (int r = 0; r < R; r++) { float v = acc[r]; for (int s = 16; s; s >>= 1) v += __shfl_xor_sync(~0u, v, s); if (!lane) y[(size_t)r * n_out + o] = v; }
}

// V1: a block of T threads per output row, U 16-byte loads in flight per
// thread before any arithmetic; block reduction through shared memory.
template <int R, int T, int U>
__global__ void __launch_bounds__(T) v1(const __nv_bfloat16 *w, const float *x, float *y, int n_out, int ld) {
    const int o = blockIdx.x;
    const __nv_bfloat16 *wr = w + (size_t)o * ld;
    float acc[R] = {};
    const int step = T * 8 * U;
    for (int base = threadIdx.x * 8; base < ld; base += step) {
        uint4 raw[U];
#pragma unroll
        for (int u = 0; u < U; u++) { int i = base + u * T * 8; raw[u] = i < ld ? __ldg(reinterpret_cast<const uint4 *>(wr + i)) : make_uint4(0, 0, 0, 0); }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int i = base + u * T * 8; if (i >= ld) break;
            float wf[8]; w8(raw[u], wf);
#pragma unroll
            for (int r = 0; r < R; r++) { float xf[8]; x8(x + (size_t)r * ld + i, xf);
#pragma unroll
                for (int j = 0; j < 8; j++) acc[r] = fmaf(wf[j], xf[j], acc[r]); }
        }
    }
    __shared__ float part[T / 32][R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < R; r++) { float v = acc[r]; for (int s = 16; s; s >>= 1) v += __shfl_xor_sync(~0u, v, s); if (!lane) part[warp][r] = v; }
    __syncthreads();
    if (threadIdx.x < R) { float v = 0; for (int k = 0; k < T / 32; k++) v += part[k][threadIdx.x]; y[(size_t)threadIdx.x * n_out + o] = v; }
}

// V2: one warp per row, U loads in flight per lane, 4 rows per block.
template <int R, int U>
__global__ void __launch_bounds__(128) v2(const __nv_bfloat16 *w, const float *x, float *y, int n_out, int ld) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int o = blockIdx.x * 4 + warp;
    if (o >= n_out) return;
    const __nv_bfloat16 *wr = w + (size_t)o * ld;
    float acc[R] = {};
    const int step = 32 * 8 * U;
    for (int base = lane * 8; base < ld; base += step) {
        uint4 raw[U];
#pragma unroll
        for (int u = 0; u < U; u++) { int i = base + u * 256; raw[u] = i < ld ? __ldg(reinterpret_cast<const uint4 *>(wr + i)) : make_uint4(0, 0, 0, 0); }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int i = base + u * 256; if (i >= ld) break;
            float wf[8]; w8(raw[u], wf);
#pragma unroll
            for (int r = 0; r < R; r++) { float xf[8]; x8(x + (size_t)r * ld + i, xf);
#pragma unroll
                for (int j = 0; j < 8; j++) acc[r] = fmaf(wf[j], xf[j], acc[r]); }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) { float v = acc[r]; for (int s = 16; s; s >>= 1) v += __shfl_xor_sync(~0u, v, s); if (!lane) y[(size_t)r * n_out + o] = v; }
}

typedef void (*kfn)(const __nv_bfloat16 *, const float *, float *, int, int);

static float time_kernel(cudaStream_t st, void (*launch)(cudaStream_t, int), int reps) {
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    launch(st, 0);
    cudaEventRecord(a, st);
    for (int i = 0; i < reps; i++) launch(st, i);
    cudaEventRecord(b, st);
    CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b);
    return ms / reps;
}

// Rotates over several copies of the weights so that L2 (50 MB) holds none.
static const int kCopies = 8;
static __nv_bfloat16 *W[kCopies]; static float *X, *Y; static int g_out, g_in, g_kind, g_rows;

template <int R> static void go(cudaStream_t st, int i) {
    const __nv_bfloat16 *w = W[i % kCopies];
    switch (g_kind) {
    case 0: v0<R><<<(g_out + 7) / 8, 256, 0, st>>>(w, X, Y, g_out, g_in); break;
    case 1: v1<R, 128, 2><<<g_out, 128, 0, st>>>(w, X, Y, g_out, g_in); break;
    case 2: v1<R, 256, 2><<<g_out, 256, 0, st>>>(w, X, Y, g_out, g_in); break;
    case 3: v1<R, 128, 4><<<g_out, 128, 0, st>>>(w, X, Y, g_out, g_in); break;
    case 4: v2<R, 4><<<(g_out + 3) / 4, 128, 0, st>>>(w, X, Y, g_out, g_in); break;
    case 5: v2<R, 8><<<(g_out + 3) / 4, 128, 0, st>>>(w, X, Y, g_out, g_in); break;
    }
}
static void launch_any(cudaStream_t st, int i) {
    switch (g_rows) { case 1: go<1>(st, i); break; case 2: go<2>(st, i); break; case 4: go<4>(st, i); break; case 8: go<8>(st, i); break; }
}

static void gemv_bw(cudaStream_t st) {
    const int shapes[][2] = {{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}};
    const char *names[] = {"v0 warp/row", "v1 128t/row u2", "v1 256t/row u2", "v1 128t/row u4", "v2 warp/row u4", "v2 warp/row u8"};
    size_t maxw = (size_t)128256 * 4096;
    for (int c = 0; c < kCopies; c++) { CK(cudaMalloc(&W[c], maxw * 2 / (c ? 4 : 1))); CK(cudaMemset(W[c], 0x3c, maxw * 2 / (c ? 4 : 1))); }
    CK(cudaMalloc(&X, 8 * 14336 * 4)); CK(cudaMemset(X, 0, 8 * 14336 * 4));
    CK(cudaMalloc(&Y, 8 * 128256 * 4));
    printf("%-16s", "GB/s out x in");
    for (int s = 0; s < 5; s++) printf(" %13dx%-6d", shapes[s][0], shapes[s][1]);
    printf("\n");
    for (int rows = 1; rows <= 8; rows *= 2) {
        for (int k = 0; k < 6; k++) {
            printf("R%d %-14s", rows, names[k]);
            for (int s = 0; s < 5; s++) {
                g_out = shapes[s][0]; g_in = shapes[s][1]; g_kind = k; g_rows = rows;
                // the big head only fits once: rotate over copy 0 only
                float ms;
                if (g_out == 128256) { __nv_bfloat16 *keep[kCopies]; for (int c = 0; c < kCopies; c++) { keep[c] = W[c]; W[c] = W[0]; }
                    ms = time_kernel(st, launch_any, 20); for (int c = 0; c < kCopies; c++) W[c] = keep[c]; }
                else ms = time_kernel(st, launch_any, 40);
                CK(cudaGetLastError());
                printf(" %8.0f (%4.1fus)", (double)g_out * g_in * 2 / (ms * 1e-3) / 1e9, ms * 1e3);
            }
            printf("\n");
        }
    }
}

int main(void) {
    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    launch_costs(st);
    gemv_bw(st);
    return 0;
}
