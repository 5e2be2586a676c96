// bulk_lab.cu - is the one-row decode GEMV short of the bandwidth floor
// because of how its loads reach memory? A variant that streams the weights
// with the Hopper bulk copy engine (cp.async.bulk, completion counted on an
// mbarrier) into a ring of shared-memory stages, one producer lane per
// block issuing the copies, consumer warps multiplying what has landed.
// Each block owns one contiguous range of whole rows (the matrix dealt in
// equal shares to exactly the resident blocks), so every block streams one
// run of hundreds of KB with several stages in flight, whatever its warps
// are doing. The products are gemv_row's (tsr_row::dot_piece: the same
// arithmetic, per row, lanes over 16-byte pieces in column order).
//
// Prints (1) the worst |y - f64| / sum |w x| of production and the variants
// on odd shapes, (2) TB/s per Llama-3-8B shape (weights out of L2: a 15 GB
// pool cycled), (3) one token's GEMVs as a CUDA graph, production against
// the variants, bf16 and E4M3, ordinary launches.
//
// Result on the H200 (tenth session, BENCHMARKS.md): every variant exact to
// ~5e-8 and slower than production, E4M3 most (a token's GEMVs 2.48 ms
// against 3.89 at best): the copy engine keeps the bytes coming, but a few
// consumer warps per multiprocessor cannot turn them into products as fast
// as production's 64 warps streaming through registers.
//
// Build: nvcc -O3 -std=c++17 -arch=sm_90 -I. -o bulk_lab tools/cuda_lab/bulk_lab.cu
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

static constexpr int kMaxStages = 8;

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity) {
    asm volatile("{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra WAIT_%=;\n}" ::"r"(smem_u32(b)),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

// The producer (one lane): rows [r0, r1) in stages of c rows into a ring of
// ns stages, each stage's copies counted on full[slot], a slot refilled once
// its consumers have released it on empty[slot].
__device__ void produce(const Args &p, int r0, int r1, int c, int ns, uint32_t row_bytes, uint8_t *stage_mem,
                        uint64_t *full, uint64_t *empty) {
    const int n_stages = (r1 - r0 + c - 1) / c;
    for (int i = 0; i < n_stages; i++) {
        const int slot = i % ns;
        if (i >= ns) mbar_wait(&empty[slot], ((i / ns) - 1) & 1);
        const int rows = min(c, r1 - (r0 + i * c));
        mbar_expect_tx(&full[slot], row_bytes * rows);
        uint8_t *dst = stage_mem + (size_t)slot * row_bytes * c;
        for (int r = 0; r < rows; r++)
            bulk_copy(dst + (size_t)r * row_bytes, p.w + (int64_t)(r0 + i * c + r) * p.ldw, row_bytes, &full[slot]);
    }
}

// Block: warp 0 produces (its lane 0 issues the copies), warps 1..C consume
// (C fewer than asked where two stages of C rows would not fit).
// A stage is C whole rows (row c of a stage to consumer warp c); NS stages
// ring through dynamic shared memory. Rows [r0, r1) of block b: an equal
// share of n_out.
template <int WK, int C>
__global__ void __launch_bounds__(32 * (C + 1)) gemv_bulk(const Args p, int ns) {
    constexpr int K = tsr_row::Piece<WK>::k, ES = WK == kBf16 ? 2 : 1, STEP = 32 * K;
    extern __shared__ __align__(128) uint8_t stage_mem[];
    __shared__ __align__(8) uint64_t full[kMaxStages], empty[kMaxStages];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = (int)((int64_t)p.n_out * blockIdx.x / gridDim.x);
    const int r1 = (int)((int64_t)p.n_out * (blockIdx.x + 1) / gridDim.x);
    const int n_stages = (r1 - r0 + C - 1) / C;
    const uint32_t row_bytes = (uint32_t)p.cols * ES, stage_bytes = row_bytes * C;
    if (threadIdx.x == 0) {
        for (int s = 0; s < ns; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], C);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == 0) {
        if (lane == 0) produce(p, r0, r1, C, ns, row_bytes, stage_mem, full, empty);
        return;
    }
    const int c = warp - 1;
    const float mul = tsr_mma::kind_mul<WK>();
    for (int i = 0; i < n_stages; i++) {
        const int slot = i % ns, o = r0 + i * C + c;
        mbar_wait(&full[slot], (i / ns) & 1);
        if (o < r1) {
            const uint8_t *row = stage_mem + (size_t)slot * stage_bytes + (size_t)c * row_bytes;
            float acc = 0.0f;
            for (int k = lane * K; k < p.cols; k += STEP) {
                const uint4 w = *reinterpret_cast<const uint4 *>(row + (size_t)k * ES);
                float xv[K];
                lab_piece_x<WK, K>(p.x, k, p.cols, xv);
                acc = tsr_row::dot_piece<WK>(w, xv, acc);
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[slot]);
            for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
            if (lane == 0) p.y[o] = acc * (p.scale ? p.scale[o] : 1.0f) * mul;
        } else {
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[slot]);
        }
    }
}

static int g_sms;

// Stages of C rows in at most ~100 KB (two blocks a multiprocessor), at
// least 2; past that one block of 2 stages; rows too long for 2 stages of C
// (bf16 down: 28 KB a row) take fewer consumers.
template <int WK, int C> static void launch_c(const Args &p, cudaStream_t st) {
    const size_t stage = (size_t)p.cols * (WK == kBf16 ? 2 : 1) * C;
    int ns = (int)((100u << 10) / stage), per_sm = 2;
    if (ns < 2) ns = 2, per_sm = 1;
    if (ns > kMaxStages) ns = kMaxStages;
    static bool attr_set;
    if (!attr_set) {
        CK(cudaFuncSetAttribute(gemv_bulk<WK, C>, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 << 10));
        attr_set = true;
    }
    int grid = g_sms * per_sm;
    if (grid > (p.n_out + C - 1) / C) grid = (p.n_out + C - 1) / C;
    gemv_bulk<WK, C><<<grid, 32 * (C + 1), stage * ns, st>>>(p, ns);
    CK(cudaGetLastError());
}
template <int WK> static void launch_bulk(const Args &p, cudaStream_t st, int c) {
    const size_t row = (size_t)p.cols * (WK == kBf16 ? 2 : 1);
    while (c > 1 && 2 * row * c > (220u << 10)) c /= 2;
    switch (c) {
    case 8: launch_c<WK, 8>(p, st); break;
    case 4: launch_c<WK, 4>(p, st); break;
    case 2: launch_c<WK, 2>(p, st); break;
    default: launch_c<WK, 1>(p, st); break;
    }
}


// The same stream, more of the block multiplying: W consumer warps share
// every stage of C rows, warp w taking column steps w, w + W, ... of all C
// rows (the activations of a step read once for C rows, from a copy of x
// the block makes in shared memory first, rounded as gemv_row rounds it);
// each warp's C sums go to shared memory, the consumers meet at a named
// barrier, and lanes 0..C-1 of the first consumer add the W sums of a row
// in warp order (deterministic) and release the stage.
template <int WK, int C, int W>
__global__ void __launch_bounds__(32 * (W + 1)) gemv_bulk2(const Args p, int ns) {
    constexpr int K = tsr_row::Piece<WK>::k, ES = WK == kBf16 ? 2 : 1, STEP = 32 * K;
    extern __shared__ __align__(128) uint8_t stage_mem[];
    __shared__ __align__(8) uint64_t full[kMaxStages], empty[kMaxStages];
    __shared__ float part[kMaxStages][W][C];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = (int)((int64_t)p.n_out * blockIdx.x / gridDim.x);
    const int r1 = (int)((int64_t)p.n_out * (blockIdx.x + 1) / gridDim.x);
    const int n_stages = (r1 - r0 + C - 1) / C;
    const uint32_t row_bytes = (uint32_t)p.cols * ES, stage_bytes = row_bytes * C;
    float *xs = reinterpret_cast<float *>(stage_mem + (size_t)ns * stage_bytes);
    if (threadIdx.x == 0) {
        for (int s = 0; s < ns; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == 0) {
        if (lane == 0) produce(p, r0, r1, C, ns, row_bytes, stage_mem, full, empty);
        return;
    }
    const int seg = warp - 1;
    for (int k = threadIdx.x - 32; k < p.cols; k += 32 * W) {
        const float v = p.x[k];
        xs[k] = WK == kFp8 ? __half2float(__float2half_rn(v * 0.0625f)) : v;
    }
    asm volatile("bar.sync 1, %0;" ::"r"(32 * W) : "memory");
    const float mul = tsr_mma::kind_mul<WK>();
    for (int i = 0; i < n_stages; i++) {
        const int slot = i % ns, o0 = r0 + i * C, rows = min(C, r1 - o0);
        mbar_wait(&full[slot], (i / ns) & 1);
        const uint8_t *st = stage_mem + (size_t)slot * stage_bytes;
        float acc[C];
#pragma unroll
        for (int r = 0; r < C; r++) acc[r] = 0.0f;
        for (int k = seg * STEP + lane * K; k < p.cols; k += STEP * W) {
            float xv[K];
#pragma unroll
            for (int q = 0; q < K / 4; q++) {
                const float4 f = *reinterpret_cast<const float4 *>(xs + k + 4 * q);
                xv[4 * q] = f.x, xv[4 * q + 1] = f.y, xv[4 * q + 2] = f.z, xv[4 * q + 3] = f.w;
            }
#pragma unroll
            for (int r = 0; r < C; r++)
                if (r < rows)
                    acc[r] = tsr_row::dot_piece<WK>(*reinterpret_cast<const uint4 *>(st + (size_t)r * row_bytes + (size_t)k * ES),
                                                     xv, acc[r]);
        }
#pragma unroll
        for (int r = 0; r < C; r++) {
            float v = acc[r];
            for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
            if (lane == 0) part[slot][seg][r] = v;
        }
        asm volatile("bar.sync 1, %0;" ::"r"(32 * W) : "memory");
        if (seg == 0) {
            if (lane < rows) {
                float v = 0.0f;
                for (int w = 0; w < W; w++) v += part[slot][w][lane];
                const int o = o0 + lane;
                p.y[o] = v * (p.scale ? p.scale[o] : 1.0f) * mul;
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[slot]);
        }
    }
}

template <int WK, int C, int W> static void launch_c2(const Args &p, cudaStream_t st) {
    const size_t stage = (size_t)p.cols * (WK == kBf16 ? 2 : 1) * C, xbytes = (size_t)p.cols * 4;
    int ns = (int)((100u << 10) / stage), per_sm = 2;
    if (ns < 2) ns = 2, per_sm = 1;
    if (ns > kMaxStages) ns = kMaxStages;
    static bool attr_set;
    if (!attr_set) {
        CK(cudaFuncSetAttribute(gemv_bulk2<WK, C, W>, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 << 10));
        attr_set = true;
    }
    int grid = g_sms * per_sm;
    if (grid > (p.n_out + C - 1) / C) grid = (p.n_out + C - 1) / C;
    gemv_bulk2<WK, C, W><<<grid, 32 * (W + 1), stage * ns + xbytes, st>>>(p, ns);
    CK(cudaGetLastError());
}
// C rows a stage, halved while two stages and x would not fit.
template <int WK, int W> static void launch_bulk2(const Args &p, cudaStream_t st, int c) {
    const size_t row = (size_t)p.cols * (WK == kBf16 ? 2 : 1), xbytes = (size_t)p.cols * 4;
    while (c > 1 && 2 * row * c + xbytes > (220u << 10)) c /= 2;
    switch (c) {
    case 8: launch_c2<WK, 8, W>(p, st); break;
    case 4: launch_c2<WK, 4, W>(p, st); break;
    case 2: launch_c2<WK, 2, W>(p, st); break;
    default: launch_c2<WK, 1, W>(p, st); break;
    }
}

// 0: production (launch_decode, one row); 1, 2: gemv_bulk with 4 and 8
// consumer warps; 3-5: gemv_bulk2 (rows a stage, consumer warps).
template <int WK> static void launch(int v, const Args &p, cudaStream_t st) {
    if (v == 0) CK(tsr_row::launch_decode<WK>(p, 1, tsr_row::kRowDense, st, false));
    else if (v == 1) launch_bulk<WK>(p, st, 4);
    else if (v == 2) launch_bulk<WK>(p, st, 8);
    else if (v == 3) launch_bulk2<WK, 8>(p, st, 4);
    else if (v == 4) launch_bulk2<WK, 8>(p, st, 8);
    else launch_bulk2<WK, 16>(p, st, 8);
}
static const int kVariants = 6;
static const char *kNames[] = {"production", "bulk, 4 consumers", "bulk, 8 consumers", "bulk2 4 rows 8 warps",
                               "bulk2 8 rows 8 warps", "bulk2 8 rows 16 warps"};

template <int WK> static double check(int v, int n_out, int cols, float amp, cudaStream_t st) {
    const int fp8 = WK == kFp8, es = fp8 ? 1 : 2;
    LabCase t = lab_case_new(fp8, n_out, cols, (int64_t)cols * es, 1, amp);
    Args a = {};
    a.w = t.dw, a.scale = fp8 ? t.ds : nullptr, a.x = t.dx, a.y = t.dy, a.n_out = n_out, a.cols = cols;
    a.ldw = (int64_t)cols * es, a.ldx = cols;
    launch<WK>(v, a, st);
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(t.hy, t.dy, sizeof(float) * n_out, cudaMemcpyDeviceToHost));
    const double worst = lab_case_worst(t, fp8, n_out, cols);
    lab_case_free(&t);
    return worst;
}

static uint8_t *g_pool;
static size_t g_pool_bytes;

template <int WK> static float one_ms(cudaStream_t st, int v, const Shape &S, float *x, float *y, float *s) {
    const int es = WK == kBf16 ? 2 : 1;
    const size_t bytes = (size_t)S.out * S.in * es, copies = g_pool_bytes / bytes;
    Args a = {};
    a.scale = WK == kFp8 ? s : nullptr, a.x = x, a.y = y, a.n_out = S.out, a.cols = S.in;
    a.ldw = (int64_t)S.in * es, a.ldx = S.in;
    return lab_calls_ms(st, 60, [&](int i) {
        a.w = g_pool + (size_t)(i % (copies < 64 ? copies : 64)) * bytes;
        launch<WK>(v, a, st);
    });
}

template <int WK> static float chain_ms(cudaStream_t st, int v, float *xa, float *xb, float *s) {
    const int es = WK == kBf16 ? 2 : 1;
    return lab_token_ms(st, g_pool, es, [&](int i, const Shape &S, const uint8_t *w) {
        Args a = {};
        a.w = w, a.scale = WK == kFp8 ? s : nullptr, a.n_out = S.out, a.cols = S.in, a.ldw = (int64_t)S.in * es;
        a.ldx = S.in, a.x = (i & 1) ? xb : xa, a.y = (i & 1) ? xa : xb;
        launch<WK>(v, a, st);
    });
}

template <int WK> static void run(const char *name, cudaStream_t st, float *x, float *y, float *s) {
    printf("== %s\n(1) worst error / sum|w x| (shapes 100x4096, 37x4160, 9x64, 5x14336; activations to 1, 100)\n",
           name);
    const int shapes[][2] = {{100, 4096}, {37, 4160}, {9, 64}, {5, 14336}};
    for (int v = 0; v < kVariants; v++) {
        double worst = 0;
        for (float amp : {1.0f, 100.0f})
            for (auto &sh : shapes) {
                const double e = check<WK>(v, sh[0], sh[1], amp, st);
                if (!(e <= worst)) worst = e;
            }
        printf("  %-20s %.3g\n", kNames[v], worst);
    }
    const int es = WK == kBf16 ? 2 : 1;
    printf("(2) TB/s at one row (us)\n");
    lab_table_head("kernel", 22);
    for (int v = 0; v < kVariants; v++) {
        printf("%-22s", kNames[v]);
        for (int i = 0; i < kNumShapes; i++) {
            const float t = one_ms<WK>(st, v, kShapes[i], x, y, s);
            printf(" | %4.2f (%6.1f)        ", (double)kShapes[i].out * kShapes[i].in * es / t / 1e9, t * 1e3);
        }
        printf("\n");
    }
    const double bytes =
        es * (32.0 * (6144.0 * 4096 + 4096.0 * 4096 + 28672.0 * 4096 + 4096.0 * 14336) + 128256.0 * 4096);
    printf("(3) one token's GEMVs as a graph, ordinary launches (floor at 4.29 TB/s %.3f ms)\n", bytes / 4.29e9);
    for (int round = 0; round < 2; round++)
        for (int v : {0, 3, 4, 5})
            printf("  %-22s %.3f ms%s", kNames[v], chain_ms<WK>(st, v, x, x + 128256, s), v == 5 ? "\n" : ";");
}

int main(void) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
    const LabBufs b = lab_bufs(st, (size_t)15400 << 20); // a token's bf16 weights
    g_pool = b.pool, g_pool_bytes = b.pool_bytes;
    run<kFp8>("E4M3", st, b.x, b.y, b.s);
    run<kBf16>("bf16", st, b.x, b.y, b.s);
    return 0;
}
