// gemv_lab - measurements that decide the decode GEMV configuration
// (kernels/cuda/gemv_mma.cuh) on the device. Not part of the engine; run by
// hand or by tools/device_cuda.sh:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o gemv_lab tools/cuda_lab/gemv_lab.cu && ./gemv_lab
// (1) correctness of every configuration against an f64 product on the host
//     (bf16 and E4M3 weights, 1..8 rows, ragged shapes);
// (2) bandwidth of each configuration at the Llama-3-8B shapes, 1 and 8
//     rows, weights rotated over copies so that L2 holds none of them;
// (3) the GEMVs of a whole decode token (32 layers of q/k/v, o, gate/up,
//     down + the LM head, each its own weights) replayed as one CUDA graph,
//     with and without programmatic dependent launch, against the 15.0 GB /
//     7.5 GB floors and the kernel cuda_gemv used before.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/gemv_mma.cuh"
#include "kernels/cuda/gemv_row.cuh"

#include "tools/cuda_lab/lab_util.cuh"

using namespace tsr_mma;

// ---- the kernel cuda_gemv ran for 1..8 rows before (commit 4f2caee: one
// warp per output row, 16-byte loads, x read as f32 16 bytes at a time)
__device__ __forceinline__ void old_load8(const __nv_bfloat16 *p, float *v) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(p));
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&raw);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float2 f = __bfloat1622float2(h[j]);
        v[2 * j] = f.x, v[2 * j + 1] = f.y;
    }
}
__device__ __forceinline__ void old_load8(const float *p, float *v) {
    const float4 a = __ldg(reinterpret_cast<const float4 *>(p)), b = __ldg(reinterpret_cast<const float4 *>(p) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
template <int R>
__global__ void __launch_bounds__(256) old_kernel(const __nv_bfloat16 *__restrict__ w, const float *__restrict__ x,
                                                  float *__restrict__ y, int64_t n_out, int ld) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t o = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp;
    if (o >= n_out) return;
    const __nv_bfloat16 *wr = w + o * ld;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
#pragma unroll 4
    for (int i = lane * 8; i < ld; i += 32 * 8) {
        float wf[8];
        old_load8(wr + i, wf);
#pragma unroll
        for (int r = 0; r < R; r++) {
            float xf[8];
            old_load8(x + (int64_t)r * ld + i, xf);
#pragma unroll
            for (int j = 0; j < 8; j++) acc[r] = fmaf(wf[j], xf[j], acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float v = acc[r];
        for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
        if (lane == 0) y[(int64_t)r * n_out + o] = v;
    }
}

// ---- configurations
struct Cfg {
    int kw, mt, u;
};
static const Cfg kCfgs[] = {{8, 1, 1}, {16, 1, 1}, {8, 1, 2}, {16, 1, 2}, {8, 2, 1}, {32, 1, 1}, {16, 1, 4}, {4, 1, 4}};
static const int kNumCfgs = sizeof kCfgs / sizeof kCfgs[0];

template <int WK, int NR, bool PDL>
static void launch_cfg(int ci, const uint8_t *w, const float *s, const float *x, float *y, int n_out, int cols,
                       int64_t ldw, int ldx, cudaStream_t st) {
    const Cfg c = kCfgs[ci];
    const unsigned grid = (unsigned)((n_out + 16 * c.mt - 1) / (16 * c.mt));
    void (*k)(const Args) = nullptr;
    switch (ci) {
#define C(I, KW, MT, U)                                                                                   \
    case I: k = gemv_mma<WK, NR, KW, MT, U>; break;
        C(0, 8, 1, 1) C(1, 16, 1, 1) C(2, 8, 1, 2) C(3, 16, 1, 2) C(4, 8, 2, 1) C(5, 32, 1, 1) C(6, 16, 1, 4)
        C(7, 4, 1, 4)
#undef C
    }
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3(grid);
    lc.blockDim = dim3(32 * c.kw * c.mt);
    lc.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    lc.attrs = at;
    lc.numAttrs = PDL ? 1 : 0;
    Args a = {};
    a.w = w, a.scale = s, a.x = x, a.y = y, a.n_out = n_out, a.cols = cols, a.ldw = ldw, a.ldx = ldx;
    CK(cudaLaunchKernelEx(&lc, k, a));
}

// ---- one-row kernels (kernels/cuda/gemv_row.cuh): configuration kRowBase + i
constexpr int kRowBase = 100;
struct RowCfg {
    int rpw, u, ks;
};
static const RowCfg kRowCfgs[] = {{1, 1, 1}, {1, 2, 1}, {1, 4, 1}, {2, 1, 1}, {2, 2, 1}, {4, 1, 1},
                                  {4, 2, 1}, {8, 1, 1}, {1, 1, 2}, {1, 2, 2}, {1, 4, 2}, {1, 2, 4},
                                  {2, 1, 2}, {2, 2, 2}, {4, 1, 2}, {1, 1, 4}};
static const int kNumRowCfgs = sizeof kRowCfgs / sizeof kRowCfgs[0];

template <int WK>
static void launch_row(int i, const Args &a, cudaStream_t st) {
    switch (i) {
#define C(I, R, U, KS)                                                                                    \
    case I: CK((tsr_row::launch_cfg<WK, R, U, KS>(a, st, false))); break;
        C(0, 1, 1, 1) C(1, 1, 2, 1) C(2, 1, 4, 1) C(3, 2, 1, 1) C(4, 2, 2, 1) C(5, 4, 1, 1) C(6, 4, 2, 1)
        C(7, 8, 1, 1) C(8, 1, 1, 2) C(9, 1, 2, 2) C(10, 1, 4, 2) C(11, 1, 2, 4) C(12, 2, 1, 2) C(13, 2, 2, 2)
        C(14, 4, 1, 2) C(15, 1, 1, 4)
#undef C
    }
}

static void launch(int wk, int nr, bool pdl, int ci, const uint8_t *w, const float *s, const float *x, float *y,
                   int n_out, int cols, int64_t ldw, cudaStream_t st) {
    if (ci >= kRowBase) {
        Args a = {};
        a.w = w, a.scale = s, a.x = x, a.y = y, a.n_out = n_out, a.cols = cols, a.ldw = ldw, a.ldx = cols;
        if (nr != 1 || pdl || !tsr_row::row_reads(wk, a)) { printf("row kernel: one row, aligned only\n"); exit(1); }
        wk == kBf16 ? launch_row<kBf16>(ci - kRowBase, a, st) : launch_row<kFp8>(ci - kRowBase, a, st);
        return;
    }
#define L(WK, NR, P) launch_cfg<WK, NR, P>(ci, w, s, x, y, n_out, cols, ldw, cols, st)
    if (wk == kBf16) {
        if (pdl) nr == 1 ? L(kBf16, 1, true) : nr == 2 ? L(kBf16, 2, true) : L(kBf16, 8, true);
        else nr == 1 ? L(kBf16, 1, false) : nr == 2 ? L(kBf16, 2, false) : nr == 3 ? L(kBf16, 3, false) : L(kBf16, 8, false);
    } else {
        if (pdl) nr == 1 ? L(kFp8, 1, true) : nr == 2 ? L(kFp8, 2, true) : L(kFp8, 8, true);
        else nr == 1 ? L(kFp8, 1, false) : nr == 2 ? L(kFp8, 2, false) : nr == 3 ? L(kFp8, 3, false) : L(kFp8, 8, false);
    }
#undef L
}

static void launch_old(int nr, const uint8_t *w, const float *x, float *y, int n_out, int cols, cudaStream_t st) {
    const unsigned grid = (unsigned)((n_out + 7) / 8);
    const __nv_bfloat16 *wb = reinterpret_cast<const __nv_bfloat16 *>(w);
    if (nr == 1) old_kernel<1><<<grid, 256, 0, st>>>(wb, x, y, n_out, cols);
    else old_kernel<8><<<grid, 256, 0, st>>>(wb, x, y, n_out, cols);
}

// ---- host reference
static double bf16_round(double v) { // as cvt.rn.bf16 rounds a float
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;
    memcpy(&f, &u, 4);
    return f;
}
static int check(int wk, int nr, int ci, int n_out, int cols, cudaStream_t st) {
    const int64_t ldw = row_bytes(wk, cols);
    LabCase t = lab_case_new(wk == kFp8, n_out, cols, ldw, 8, 4.0f);
    launch(wk, nr, false, ci, t.dw, wk == kFp8 ? t.ds : nullptr, t.dx, t.dy, n_out, cols, ldw, st);
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(t.hy, t.dy, sizeof(float) * 8 * n_out, cudaMemcpyDeviceToHost));
    if (wk == kFp8) lab_case_x_as_stored(t, nr, cols); // the production E4M3 layout (the check had missed it)
    double worst = 0;
    for (int r = 0; r < nr; r++)
        for (int o = 0; o < n_out; o++) {
            double sum = 0, mag = 0;
            for (int c = 0; c < cols; c++) {
                const double wv = lab_case_w(t, wk == kFp8, o, c);
                // activations as the kernel rounds them: bf16, or f16 after * 2^-4
                double xv = t.hx[(int64_t)r * cols + c];
                if (wk == kFp8) xv = (double)__half2float(__float2half_rn((float)(xv * 0.0625))) * 16;
                else if (ci < kRowBase) xv = bf16_round(xv); // the row kernel multiplies f32 activations
                sum += wv * xv, mag += fabs(wv * xv);
            }
            const double err = fabs(t.hy[(int64_t)r * n_out + o] - sum) / (mag + 1e-30);
            if (err > worst) worst = err;
        }
    lab_case_free(&t);
    const int ok = worst < 1e-5; // f32 accumulation of exactly rounded products
    if (!ok) printf("FAIL %s rows %d cfg %d shape %dx%d: worst relative error %.3g\n", wk ? "fp8" : "bf16", nr, ci,
                    n_out, cols, worst);
    return ok;
}

// ---- bandwidth (kShapes: lab_util.cuh)

static uint8_t *g_pool; // weights of a whole model, 15 GB
static size_t g_pool_bytes;

struct One {
    int wk, nr, ci, out, in; // ci < 0: the old kernel
    float *x, *y, *s;
};
static void one_body(cudaStream_t st, int i, void *arg) {
    One *p = (One *)arg;
    const int64_t ldw = row_bytes(p->wk, p->in);
    const size_t bytes = (size_t)p->out * ldw;
    const size_t copies = g_pool_bytes / bytes;
    const uint8_t *w = g_pool + (size_t)(i % (copies < 64 ? copies : 64)) * bytes;
    if (p->ci < 0) launch_old(p->nr, w, p->x, p->y, p->out, p->in, st);
    else launch(p->wk, p->nr, false, p->ci, w, p->s, p->x, p->y, p->out, p->in, ldw, st);
}

// ---- one token's GEMVs as a graph
struct Chain {
    int wk, pdl, nr;
    int ci[kNumShapes]; // per shape, -1 = old kernel
    float *x[2], *s;
};
// Each matrix of one decode token in order (32 layers of q/k/v, o, gate/up,
// down, then the LM head), each its own weights in g_pool: f(shape, w, ldw).
template <typename F> static void for_token(int wk, F f) {
    size_t off = 0;
    for (int i = 0; i < 32 * 4 + 1; i++) {
        const int sh = i < 32 * 4 ? i % 4 : 4;
        const int64_t ldw = row_bytes(wk, kShapes[sh].in);
        const uint8_t *w = g_pool + off;
        off += (size_t)kShapes[sh].out * ldw;
        if (off > g_pool_bytes) { printf("pool too small\n"); exit(1); }
        f(sh, w, ldw);
    }
}
static void chain_launches(cudaStream_t st, Chain *c) {
    int flip = 0;
    for_token(c->wk, [&](int sh, const uint8_t *w, int64_t ldw) {
        const Shape &S = kShapes[sh];
        float *x = c->x[flip], *y = c->x[flip ^ 1];
        flip ^= 1;
        if (c->ci[sh] < 0) launch_old(c->nr, w, x, y, S.out, S.in, st);
        else launch(c->wk, c->nr, c->pdl, c->ci[sh], w, c->s, x, y, S.out, S.in, ldw, st);
    });
}
static double chain_bytes(int wk) {
    double b = 0;
    for_token(wk, [&](int sh, const uint8_t *, int64_t ldw) { b += (double)kShapes[sh].out * ldw; });
    return b;
}
static float chain_ms(cudaStream_t st, Chain *c) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    chain_launches(st, c);
    CK(cudaStreamEndCapture(st, &g));
    return lab_graph_ms(st, g);
}

// ---- a decode layer with the latency-bound kernels between the GEMVs
// stood in for by one-block waits, with or without bringing the next
// matrix's first bytes into L2 during each wait (a side branch of the graph).
__global__ void spin_kernel(long long ns) {
    if (threadIdx.x) return;
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while ((long long)(t - t0) < ns);
}
__global__ void prefetch_l2(const uint8_t *p, size_t bytes) {
    const size_t piece = 65536;
    for (size_t off = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * piece; off < bytes;
         off += (size_t)gridDim.x * blockDim.x * piece) {
        const size_t n = bytes - off < piece ? bytes - off : piece;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"((unsigned)n) : "memory");
    }
}
static float layers_ms(cudaStream_t st, cudaStream_t side, Chain *c, size_t prefetch, int gaps) {
    const long long gap_ns[4] = {6000, 15000, 4000, 3000}; // norm; rope+kv+attention; norm; silu
    cudaEvent_t ev[2 * 4 * 33];
    for (auto &e : ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    int flip = 0, ei = 0;
    for_token(c->wk, [&](int sh, const uint8_t *w, int64_t ldw) {
        const Shape &S = kShapes[sh];
        const size_t mb = (size_t)S.out * ldw;
        cudaEvent_t done = nullptr;
        if (prefetch) {
            CK(cudaEventRecord(ev[ei], st));
            CK(cudaStreamWaitEvent(side, ev[ei++], 0));
            prefetch_l2<<<16, 32, 0, side>>>(w, prefetch < mb ? prefetch : mb);
            done = ev[ei++];
            CK(cudaEventRecord(done, side));
        }
        if (gaps) spin_kernel<<<1, 32, 0, st>>>(gap_ns[sh < 4 ? sh : 0]);
        if (done) CK(cudaStreamWaitEvent(st, done, 0));
        float *x = c->x[flip], *y = c->x[flip ^ 1];
        flip ^= 1;
        launch(c->wk, c->nr, false, c->ci[sh], w, c->s, x, y, S.out, S.in, ldw, st);
    });
    CK(cudaStreamEndCapture(st, &g));
    const float ms = lab_graph_ms(st, g);
    for (auto &e : ev) cudaEventDestroy(e);
    return ms;
}

// ---- one token's GEMVs through the production launcher (gemv_row.cuh's
// launch_decode: the row kernel or gemv_mma by shape and row count)
static float production_chain_ms(cudaStream_t st, int wk, int rows, bool pdl, float *xa, float *xb, float *s) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for_token(wk, [&](int sh, const uint8_t *w, int64_t ldw) {
        const Shape &S = kShapes[sh];
        Args a = {};
        a.w = w, a.ldw = ldw;
        a.scale = wk == kFp8 ? s : nullptr;
        a.n_out = S.out, a.cols = S.in, a.ldx = S.in, a.x = xa, a.y = xb;
        CK(wk == kBf16 ? tsr_row::launch_decode<kBf16>(a, rows, tsr_row::kRowDense, st, pdl)
                       : tsr_row::launch_decode<kFp8>(a, rows, tsr_row::kRowDense, st, pdl));
    });
    CK(cudaStreamEndCapture(st, &g));
    return lab_graph_ms(st, g);
}

int main(void) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    // (1) correctness
    int ok = 1, n = 0;
    const int shapes[][2] = {{100, 4096}, {16, 64}, {37, 4100}, {300, 1000}, {8, 8}};
    for (int wk = 0; wk < 2; wk++)
        for (int ci = 0; ci < kNumCfgs; ci++)
            for (int nr : {1, 2, 3, 8})
                for (auto &s : shapes) ok &= check(wk, nr, ci, s[0], s[1], st), n++;
    const int row_shapes[][2] = {{100, 4096}, {16, 64}, {37, 4112}, {301, 1024}, {9, 16}, {5, 14336}};
    for (int wk = 0; wk < 2; wk++)
        for (int i = 0; i < kNumRowCfgs; i++)
            for (auto &s : row_shapes) ok &= check(wk, 1, kRowBase + i, s[0], s[1], st), n++;
    printf("correctness: %d cases %s\n", n, ok ? "all within 1e-5 of f64 (relative to sum |w x|)" : "FAILED");
    // (2) bandwidth
    g_pool_bytes = (size_t)15400 << 20;
    CK(cudaMalloc(&g_pool, g_pool_bytes));
    lab_fill<<<4096, 256, 0, st>>>(g_pool, g_pool_bytes, 7);
    float *x, *y, *s;
    CK(cudaMalloc(&x, 2 * 8 * 14336 * 4));
    CK(cudaMalloc(&y, 8 * 128256 * 4));
    CK(cudaMalloc(&s, 128256 * 4));
    CK(cudaMemset(x, 0, 2 * 8 * 14336 * 4));
    CK(cudaMemset(s, 0, 128256 * 4));
    CK(cudaStreamSynchronize(st));
    int best[2][kNumShapes], best_any[2][kNumShapes]; // fastest mma config; fastest of all at one row
    for (int wk = 0; wk < 2; wk++) {
        printf("\n%s weights: TB/s (time in us), rows 1 | rows 8\n%-22s", wk ? "E4M3" : "bf16", "config");
        for (int i = 0; i < kNumShapes; i++) printf(" | %-22s", kShapes[i].name);
        printf("\n");
        float best_t[kNumShapes], best_any_t[kNumShapes];
        for (int i = 0; i < kNumShapes; i++) best_t[i] = best_any_t[i] = 1e30f, best[wk][i] = best_any[wk][i] = 0;
        for (int ci = wk ? 0 : -1; ci < kRowBase + kNumRowCfgs; ci++) {
            if (ci == kNumCfgs) ci = kRowBase;
            if (ci < 0) printf("%-22s", "old warp/row u4");
            else if (ci >= kRowBase) printf("row rpw %d u %d ks %d   ", kRowCfgs[ci - kRowBase].rpw, kRowCfgs[ci - kRowBase].u,
                                      kRowCfgs[ci - kRowBase].ks);
            else printf("kw %2d mt %d u %d        ", kCfgs[ci].kw, kCfgs[ci].mt, kCfgs[ci].u);
            for (int i = 0; i < kNumShapes; i++) {
                const Shape &S = kShapes[i];
                const double bytes = (double)S.out * row_bytes(wk, S.in);
                float t[2] = {1e30f, 1e30f};
                for (int k = 0; k < (ci >= kRowBase ? 1 : 2); k++) {
                    One o = {wk, k ? 8 : 1, ci, S.out, S.in, x, y, s};
                    t[k] = lab_calls_ms(st, 40, [&](int i) { one_body(st, i, &o); });
                }
                if (ci >= 0 && ci < kRowBase && t[0] < best_t[i]) best_t[i] = t[0], best[wk][i] = ci;
                if (ci >= 0 && t[0] < best_any_t[i]) best_any_t[i] = t[0], best_any[wk][i] = ci;
                if (ci >= kRowBase) printf(" | %4.2f (%5.1f) %-12s", bytes / t[0] / 1e9, t[0] * 1e3, "-");
                else printf(" | %4.2f (%5.1f) %4.2f (%5.1f)", bytes / t[0] / 1e9, t[0] * 1e3, bytes / t[1] / 1e9, t[1] * 1e3);
            }
            printf("\n");
        }
    }
    // (3) one token's GEMVs
    printf("\none decode token's GEMVs (32 layers + LM head) as one graph, median of 7x5 replays:\n");
    for (int wk = 0; wk < 2; wk++) {
        const double bytes = chain_bytes(wk);
        for (int variant = 0; variant < 5; variant++) {
            Chain c = {};
            c.wk = wk, c.nr = variant == 3 ? 8 : 1, c.pdl = variant == 2 || variant == 3, c.s = s;
            c.x[0] = x, c.x[1] = x + 8 * 14336;
            for (int i = 0; i < kNumShapes; i++)
                c.ci[i] = variant == 0 && wk == 0 ? -1 : variant == 4 ? best_any[wk][i] : best[wk][i];
            if (variant == 0 && wk) continue;
            const float ms = chain_ms(st, &c);
            const char *what[] = {"old kernel", "mma, best config per shape", "mma + PDL", "mma + PDL, 8 rows",
                                  "row or mma, best per shape"};
            printf("%s %-28s %.3f ms  %.2f TB/s  (%.2f GB; floor at 4.29 TB/s %.3f ms)\n", wk ? "E4M3" : "bf16",
                   what[variant], ms, bytes / ms / 1e9, bytes / 1e9, bytes / 4.29e12 * 1e3);
        }
    }
    // (5) the production launcher
    {
        float *xa, *xb;
        CK(cudaMalloc(&xa, 8 * 14336 * 4));
        CK(cudaMalloc(&xb, 8 * 128256 * 4));
        CK(cudaMemset(xa, 0, 8 * 14336 * 4));
        printf("\nproduction launcher (kernels/cuda/gemv_row.cuh launch_decode), one token's GEMVs as a graph:\n");
        for (int wk = 0; wk < 2; wk++)
            for (int rows : {1, 2, 4, 8})
                printf("%s rows %d: %.3f ms, as programmatic dependents %.3f ms\n", wk ? "E4M3" : "bf16", rows,
                       production_chain_ms(st, wk, rows, false, xa, xb, s),
                       production_chain_ms(st, wk, rows, true, xa, xb, s));
    }
    // (4) the same with waits standing in for the small kernels, and L2 prefetch
    printf("\nwith 28 us of one-block waits per layer (norm 6, attention 15, norm 4, silu 3):\n");
    cudaStream_t side;
    CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    for (int wk = 0; wk < 2; wk++) {
        Chain c = {};
        c.wk = wk, c.nr = 1, c.s = s, c.x[0] = x, c.x[1] = x + 8 * 14336;
        for (int i = 0; i < kNumShapes; i++) c.ci[i] = best_any[wk][i];
        printf("%s GEMVs alone %.3f ms; with waits: no prefetch %.3f ms", wk ? "E4M3" : "bf16",
               layers_ms(st, side, &c, 0, 0), layers_ms(st, side, &c, 0, 1));
        for (size_t mb : {4, 16, 32})
            printf(", prefetch %zu MB %.3f ms", mb, layers_ms(st, side, &c, mb << 20, 1));
        printf("; prefetch 16 MB without waits %.3f ms\n", layers_ms(st, side, &c, (size_t)16 << 20, 0));
    }
    return ok ? 0 : 1;
}
