// side_lab - can a second branch of the decode graph bring weights into L2
// while the attention keeps the memory idle? Not part of the engine; run by
// hand on the device:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o side_lab tools/cuda_lab/side_lab.cu && ./side_lab [0|1]
// (0: bf16 only, 1: E4M3 only).
//
// The question behind it (issue #7): a one-row pass at the Llama-3-8B shape
// spends ~9 us a layer in RoPE, the KV append and the attention, which read
// ~2 MB; the memory idles. The seventeenth session asked L2 for the o
// weights from a kernel on the chain, and the chain waited for it. Here the
// asking kernel runs on its own branch of the captured graph, forked after
// the q/k/v GEMV and joined only at the end of the token, so nothing on the
// chain waits for it.
//
// One token: 32 x (q/k/v, a stand-in for RoPE + KV append + attention that
// spins for W us on 64 blocks and reads nothing, o, gate/up with its SiLU,
// down), then the LM head, through the production launchers (gemv_row.cuh)
// as programmatic dependents in a CUDA graph, each layer its own weights.
// Variants: no side branch; a side kernel of B blocks asking L2 for the first
// MB of gate/up's gate rows and up rows (the order its GLU blocks read them)
// by prefetch.global.L2, with evict_last, or by loads. First, the o GEMV
// alone with its weights flushed from L2 and after they were asked in.
//
// What it found (twenty-ninth session, BENCHMARKS.md): the o GEMV from L2 is
// only ~17% faster (bf16 12.6 -> 10.4 us: it is bound by its chain of
// dependent loads, not by DRAM), so asking for o's weights gains ~0.04 ms a
// token; 24 MB of gate/up during a 6 us stand-in gains 0.05 ms (bf16) and
// 0.06 ms (E4M3) of the 0.21 ms the stand-in costs. In the engine (branch
// experiment/side-prefetch) the same side branch made one-row passes slower
// by 0.03-0.1 ms: the real attention reads its keys and values while the
// side kernel floods the memory, and it is bound by their latency.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/gemv_row.cuh"
#include "tools/cuda_lab/lab_util.cuh"

using namespace tsr_mma;

__global__ void spin_k(unsigned ns) {
    tsr_pdl::enter();
    if (threadIdx.x) return;
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - t0 < ns);
}

// mode 0: prefetch.global.L2 a 128-byte line; 1: with evict_last; 2: a
// 16-byte load a line (the sum kept from the compiler); 3: bulk prefetch of
// 64 KiB pieces (one thread a piece).
template <int MODE> __global__ void pf_k(const uint8_t *p, size_t bytes, float *sink) {
    if (MODE == 3) {
        const size_t piece = 65536;
        for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * piece; i < bytes;
             i += (size_t)gridDim.x * blockDim.x * piece) {
            const unsigned n = (unsigned)min((size_t)piece, bytes - i);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + i), "r"(n) : "memory");
        }
        return;
    }
    uint32_t acc = 0;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 128; i < bytes;
         i += (size_t)gridDim.x * blockDim.x * 128) {
        if (MODE == 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + i));
        if (MODE == 1) asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p + i));
        if (MODE == 2) {
            uint32_t v;
            asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p + i));
            acc += v;
        }
    }
    if (MODE == 2 && acc == 0x12345678u) sink[0] = 1.0f;
}

struct Mat {
    const uint8_t *w;
    int64_t ldw;
    int n_out, cols;
};

struct Variant {
    const char *name;
    int spin_ns;  // 0: no stand-in kernel
    int side;     // 0: none; else blocks of the side kernel
    int mode;     // pf_k's
    size_t extra; // bytes of gate/up asked for: the first rows of its gate half and of its up half
    int o;        // o's weights asked for first
};

static void gemv(int wk, const Mat &m, const float *x, float *y, const float *scale, bool glu, cudaStream_t st) {
    Args a = {};
    a.w = m.w, a.ldw = m.ldw, a.scale = scale, a.n_out = m.n_out, a.cols = m.cols, a.ldx = m.cols;
    a.x = x, a.y = y;
    if (glu)
        CK(wk == kBf16 ? tsr_row::launch_glu<kBf16>(a, tsr_row::kRowDense, st, true)
                       : tsr_row::launch_glu<kFp8>(a, tsr_row::kRowDense, st, true));
    else
        CK(wk == kBf16 ? tsr_row::launch_decode<kBf16>(a, 1, tsr_row::kRowDense, st, true)
                       : tsr_row::launch_decode<kFp8>(a, 1, tsr_row::kRowDense, st, true));
}

static void launch_pf(int mode, int blocks, const uint8_t *p, size_t bytes, float *sink, cudaStream_t st) {
    switch (mode) {
    case 0: pf_k<0><<<blocks, 256, 0, st>>>(p, bytes, sink); break;
    case 1: pf_k<1><<<blocks, 256, 0, st>>>(p, bytes, sink); break;
    case 2: pf_k<2><<<blocks, 256, 0, st>>>(p, bytes, sink); break;
    default: pf_k<3><<<blocks, 32, 0, st>>>(p, bytes, sink); break;
    }
    CK(cudaGetLastError());
}

int main(int argc, char **argv) {
    const int wk_only = argc > 1 ? atoi(argv[1]) : -1;
    cudaStream_t st, side;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    const size_t pool_bytes = (size_t)15400 << 20;
    LabBufs b = lab_bufs(st, pool_bytes);
    float *sink = b.y;
    const int L = 32;
    cudaEvent_t ev[L + 1];
    for (auto &e : ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (int wk = 0; wk < 2; wk++) {
        if (wk_only >= 0 && wk != wk_only) continue;
        // weights: per layer qkv, o, gate/up, down; then the head
        const int shp[5][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
        Mat m[L][4], head;
        size_t off = 0;
        double bytes = 0;
        for (int l = 0; l <= L; l++)
            for (int j = 0; j < (l < L ? 4 : 1); j++) {
                const int s = l < L ? j : 4;
                Mat &t = l < L ? m[l][j] : head;
                t.ldw = row_bytes(wk, shp[s][1]), t.n_out = shp[s][0], t.cols = shp[s][1];
                t.w = b.pool + off, off += (size_t)t.n_out * t.ldw, bytes += (double)t.n_out * t.ldw;
            }
        if (off > pool_bytes) return printf("pool too small\n"), 1;
        const float *scale = wk == kFp8 ? b.s : nullptr;
        float *x = b.x, *t = b.x + 128256, *y = b.y;
        const size_t ob = (size_t)m[0][1].n_out * m[0][1].ldw;
        printf("%s: %.2f GB a token (floor %.3f ms at 4.29 TB/s); o %.1f MB a layer\n", wk ? "E4M3" : "bf16",
               bytes / 1e9, bytes / 4.29e12 * 1e3, ob / 1e6);
        const size_t MB = 1 << 20;
        const Variant vs[] = {
            {"chain, no stand-in", 0, 0, 0, 0, 0},
            {"chain + 6 us stand-in", 6000, 0, 0, 0, 0},
            {"chain + 9 us stand-in", 9000, 0, 0, 0, 0},
            {"+ side prefetch 24 MB gate/up, 132", 6000, 132, 0, 24 * MB, 0},
            {"+ side prefetch 24 MB gate/up, evict_last 132", 6000, 132, 1, 24 * MB, 0},
            {"+ side prefetch 32 MB gate/up, evict_last 132", 6000, 132, 1, 32 * MB, 0},
            {"+ side prefetch 40 MB gate/up, evict_last 132", 6000, 132, 1, 40 * MB, 0},
            {"(9 us) + side prefetch 24 MB gate/up, ev_l 132", 9000, 132, 1, 24 * MB, 0},
            {"(9 us) + side prefetch 32 MB gate/up, ev_l 132", 9000, 132, 1, 32 * MB, 0},
            {"(9 us) + side prefetch 40 MB gate/up, ev_l 132", 9000, 132, 1, 40 * MB, 0},
            {"+ side prefetch 24 MB gate/up, evict_last 264", 6000, 264, 1, 24 * MB, 0},
            {"chain + 6 us stand-in (again)", 6000, 0, 0, 0, 0},
        };
        // the o GEMV alone after its weights were flushed from L2 (a read of
        // 256 MB of other weights), and after a kernel asked L2 for them
        for (int mode = -1; mode < 3; mode++) {
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            float tm[15];
            for (int r = 0; r < 15; r++) {
                launch_pf(2, 264, m[5][2].w, (size_t)256 << 20, sink, st);
                if (mode >= 0) launch_pf(mode, 132, m[0][1].w, ob, sink, st);
                CK(cudaEventRecord(e0, st));
                gemv(wk, m[0][1], t, x, scale, false, st);
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                CK(cudaEventElapsedTime(&tm[r], e0, e1));
            }
            qsort(tm, 15, sizeof *tm, [](const void *a, const void *b) {
                const float x = *(const float *)a, y = *(const float *)b;
                return (x > y) - (x < y);
            });
            printf("  o GEMV alone, %-28s %.2f us (%.2f TB/s)\n",
                   mode < 0 ? "weights flushed from L2" : mode == 0 ? "after prefetch.global.L2" : mode == 1 ? "after prefetch evict_last" : "after loads",
                   tm[7] * 1e3, ob / (tm[7] * 1e-3) / 1e12);
            cudaEventDestroy(e0), cudaEventDestroy(e1);
        }
        for (const Variant &v : vs) {
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            bool forked = false;
            for (int l = 0; l < L; l++) {
                gemv(wk, m[l][0], x, t, scale, false, st);
                if (v.side) {
                    CK(cudaEventRecord(ev[l], st));
                    CK(cudaStreamWaitEvent(side, ev[l], 0));
                    if (v.o) launch_pf(v.mode, v.side, m[l][1].w, ob, sink, side);
                    if (v.extra) { // gate/up (GLU): block i reads gate rows and the same up rows
                        const Mat &gu = m[l][2];
                        const size_t half = (size_t)gu.n_out / 2 * gu.ldw;
                        launch_pf(v.mode, v.side, gu.w, v.extra / 2, sink, side);
                        launch_pf(v.mode, v.side, gu.w + half, v.extra / 2, sink, side);
                    }
                    forked = true;
                }
                if (v.spin_ns)
                    CK(tsr_pdl::launch(spin_k, 64, 128, 0, st, true, (unsigned)v.spin_ns));
                gemv(wk, m[l][1], t, x, scale, false, st);
                gemv(wk, m[l][2], x, t, scale, true, st);
                gemv(wk, m[l][3], t, x, scale, false, st);
            }
            gemv(wk, head, x, y, scale, false, st);
            if (forked) {
                CK(cudaEventRecord(ev[L], side));
                CK(cudaStreamWaitEvent(st, ev[L], 0));
            }
            CK(cudaStreamEndCapture(st, &g));
            const float ms = lab_graph_ms(st, g);
            printf("  %-42s %.3f ms  %.2f TB/s\n", v.name, ms, bytes / ms / 1e9);
        }
    }
    return 0;
}
