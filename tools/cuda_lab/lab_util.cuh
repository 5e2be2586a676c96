// lab_util.cuh - what the GEMV labs share: random operands, host
// references of the weight formats, a pool filler, and two timers.
#ifndef TSR_LAB_UTIL_CUH
#define TSR_LAB_UTIL_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cuda_lab/lab_check.cuh"

// xorshift32: the labs' reproducible operands.
static uint32_t lab_rng = 12345;
static inline uint32_t lab_rnd(void) {
    lab_rng ^= lab_rng << 13, lab_rng ^= lab_rng >> 17, lab_rng ^= lab_rng << 5;
    return lab_rng;
}

static inline double lab_e4m3_to_f64(uint8_t b) {
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -v : v;
}

// The bf16 value at p (little-endian).
static inline double lab_bf16_to_f64(const uint8_t *p) {
    const uint32_t u = (uint32_t)(p[0] | p[1] << 8) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// A correctness case: n_out weight rows (ldw bytes apart; bf16 near +-1
// when fp8 is 0, any finite E4M3 byte when 1) with row scales in
// [0.01, 1], nx input rows of cols activations in [-amp, amp], on the host
// (h*) and on the device (d*; dy filled with NaN).
struct LabCase {
    int64_t ldw;
    uint8_t *hw, *dw;
    float *hs, *hx, *hy, *ds, *dx, *dy;
};
static LabCase lab_case_new(int fp8, int n_out, int cols, int64_t ldw, int nx, float amp) {
    LabCase c;
    c.ldw = ldw;
    c.hw = (uint8_t *)calloc((size_t)n_out, (size_t)ldw);
    c.hs = (float *)malloc(sizeof(float) * n_out), c.hx = (float *)malloc(sizeof(float) * nx * cols);
    c.hy = (float *)malloc(sizeof(float) * nx * n_out);
    for (int o = 0; o < n_out; o++) {
        c.hs[o] = 0.01f * (1 + (int)(lab_rnd() % 100));
        for (int k = 0; k < cols; k++) {
            if (!fp8) {
                const uint16_t h = (uint16_t)(0x3c00 + (lab_rnd() % 0x400) - 0x200) ^ (uint16_t)(lab_rnd() & 0x8000);
                memcpy(c.hw + (int64_t)o * ldw + 2 * k, &h, 2);
            } else {
                uint8_t b = (uint8_t)(lab_rnd() & 0xff);
                if ((b & 0x7f) == 0x7f) b &= 0xfe; // no NaN
                c.hw[(int64_t)o * ldw + k] = b;
            }
        }
    }
    for (int i = 0; i < nx * cols; i++) c.hx[i] = amp * ((int)(lab_rnd() % 2001) - 1000) / 1000.0f;
    CK(cudaMalloc(&c.dw, (size_t)n_out * ldw));
    CK(cudaMalloc(&c.ds, sizeof(float) * n_out));
    CK(cudaMalloc(&c.dx, sizeof(float) * nx * cols));
    CK(cudaMalloc(&c.dy, sizeof(float) * nx * n_out));
    CK(cudaMemcpy(c.dw, c.hw, (size_t)n_out * ldw, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c.ds, c.hs, sizeof(float) * n_out, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c.dx, c.hx, sizeof(float) * nx * cols, cudaMemcpyHostToDevice));
    CK(cudaMemset(c.dy, 0xff, sizeof(float) * nx * n_out));
    // copies from pageable memory may return before they land, and the labs
    // launch on non-blocking streams, which do not wait for them
    CK(cudaDeviceSynchronize());
    return c;
}
// Weight (o, k) of a case as the kernels read it (E4M3 times its row scale).
static double lab_case_w(const LabCase &c, int fp8, int o, int k) {
    return fp8 ? lab_e4m3_to_f64(c.hw[(int64_t)o * c.ldw + k]) * c.hs[o] : lab_bf16_to_f64(c.hw + (int64_t)o * c.ldw + 2 * k);
}
static void lab_case_free(LabCase *c) {
    cudaFree(c->dw), cudaFree(c->ds), cudaFree(c->dx), cudaFree(c->dy);
    free(c->hw), free(c->hs), free(c->hx), free(c->hy);
}

// Worst |y - f64| / sum |w x| over the n_out outputs of input row r, read
// back into c.hy by the caller; the f64 sums take the activations as
// gemv_row does (f32 against bf16 weights; against E4M3, times 2^-4 rounded
// to f16). A NaN output counts as the worst.
static double lab_case_worst(const LabCase &c, int fp8, int n_out, int cols, int r = 0) {
    double worst = 0;
    for (int o = 0; o < n_out; o++) {
        double sum = 0, mag = 0;
        for (int k = 0; k < cols; k++) {
            const double wv = lab_case_w(c, fp8, o, k);
            double xv = c.hx[(int64_t)r * cols + k];
            if (fp8) xv = (double)__half2float(__float2half_rn((float)(xv * 0.0625))) * 16;
            sum += wv * xv, mag += fabs(wv * xv);
        }
        const double err = fabs(c.hy[(int64_t)r * n_out + o] - sum) / (mag + 1e-30);
        if (!(err <= worst)) worst = err;
    }
    return worst;
}

// The host activations of a case's nx rows put in the byte order of the
// production kernels' E4M3 rows (gemv_mma.cuh: columns permuted within whole
// 512-column steps, e4m3_stored_col), so that lab_case_worst's sum over
// bytes b of w[b] x[b] is the product those kernels compute from the
// stored bytes and the device's activations (which stay as they are: call
// after the case is on the device). Needs kernels/cuda/gemv_mma.cuh.
static void lab_case_x_as_stored(LabCase &c, int nx, int cols) {
    float *row = (float *)malloc(sizeof(float) * cols);
    for (int r = 0; r < nx; r++) {
        float *xr = c.hx + (int64_t)r * cols;
        memcpy(row, xr, sizeof(float) * cols);
        for (int b = 0; b < cols; b++) xr[b] = row[b >= cols / 512 * 512 ? b : tsr_mma::e4m3_step_rot(b, false)];
    }
    free(row);
}

// n bytes of bf16 pairs and E4M3 quads of modest magnitude, no NaN.
__global__ void lab_fill(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n / 4; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        reinterpret_cast<uint32_t *>(p)[i] = (h & 0x3f3f3f3fu) | 0x38003800u;
    }
}

// The largest |x[k]| of x[0..n) over the whole block (blockDim.x a
// multiple of 32, at most 1,024), in every thread.
__device__ __forceinline__ float lab_block_absmax(const float *x, int n) {
    __shared__ float red[32];
    float m = 0.0f;
    for (int k = threadIdx.x; k < n; k += blockDim.x) m = fmaxf(m, fabsf(x[k]));
    for (int s = 16; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, s));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = 0.0f;
    for (int w = 0; w < (int)blockDim.x / 32; w++) m = fmaxf(m, red[w]);
    return m;
}

// c += A B on the FP8 tensor cores (mma.m16n8k32, E4M3 x E4M3, f32 sums):
// a0..a3 the lane's A fragment (rows g, g + 8 at k 4t.. and 16 + 4t..), b0,
// b1 its B fragment (column g at the same k). sm_89 and later.
__device__ __forceinline__ void mma_e4m3(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The bandwidth labs' device buffers: a pool of weights filled by lab_fill,
// two activation rows (zeros), an output row and a row of scales (zeros),
// each for up to the LM head's 128,256 outputs.
struct LabBufs {
    uint8_t *pool;
    size_t pool_bytes;
    float *x, *y, *s;
};
static LabBufs lab_bufs(cudaStream_t st, size_t pool_bytes) {
    LabBufs b;
    b.pool_bytes = pool_bytes;
    CK(cudaMalloc(&b.pool, pool_bytes));
    lab_fill<<<4096, 256, 0, st>>>(b.pool, pool_bytes, 7);
    CK(cudaMalloc(&b.x, 2 * 128256 * 4));
    CK(cudaMalloc(&b.y, 128256 * 4));
    CK(cudaMalloc(&b.s, 128256 * 4));
    CK(cudaMemset(b.x, 0, 2 * 128256 * 4));
    CK(cudaMemset(b.s, 0, 128256 * 4));
    CK(cudaStreamSynchronize(st));
    return b;
}

// Milliseconds per call of body(i) for i = 1..reps, after body(0) warms.
template <typename F> static float lab_calls_ms(cudaStream_t st, int reps, F body) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    body(0);
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < reps; i++) body(i + 1);
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ms / reps;
}

// Milliseconds per replay of a captured graph: median of 7 timings of 5
// replays each (instantiated, run once to warm, then freed with g).
static float lab_graph_ms(cudaStream_t st, cudaGraph_t g) {
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    float t[7];
    for (int rep = 0; rep < 7; rep++)
        t[rep] = lab_calls_ms(st, 5, [&](int) { CK(cudaGraphLaunch(ge, st)); });
    for (int i = 0; i < 7; i++)
        for (int j = i + 1; j < 7; j++)
            if (t[j] < t[i]) {
                const float u = t[i];
                t[i] = t[j], t[j] = u;
            }
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
    return t[3];
}

// The Llama-3-8B decode GEMVs: [out x in] weights.
struct Shape {
    const char *name;
    int out, in;
};
static const Shape kShapes[] = {
    {"qkv 6144x4096", 6144, 4096}, {"o 4096x4096", 4096, 4096}, {"gate/up 28672x4096", 28672, 4096},
    {"down 4096x14336", 4096, 14336}, {"lm head 128256x4096", 128256, 4096},
};
static const int kNumShapes = 5;

// The head of a table of one figure per shape: the first column width wide.
static void lab_table_head(const char *first, int width) {
    printf("%-*s", width, first);
    for (int i = 0; i < kNumShapes; i++) printf(" | %-20s", kShapes[i].name);
    printf("\n");
}

// One decode token's GEMVs (32 layers of q/k/v, o, gate/up, down, then the
// LM head), each its own weights laid end to end in pool (es bytes a
// weight), captured as one graph: ms per replay. launch(i, shape, w) issues
// the i-th; inputs and outputs are the caller's.
template <typename F> static float lab_token_ms(cudaStream_t st, const uint8_t *pool, int es, F launch) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    size_t off = 0;
    for (int i = 0; i < 32 * 4 + 1; i++) {
        const Shape &S = kShapes[i < 32 * 4 ? i % 4 : 4];
        launch(i, S, pool + off);
        off += (size_t)S.out * S.in * es;
    }
    CK(cudaStreamEndCapture(st, &g));
    return lab_graph_ms(st, g);
}

// The K activations from column k of x as the labs' gemv_row variants with
// columns in order take them (tsr_mma::load_x; E4M3: times 2^-4, rounded
// to f16, as gemv_row rounds them).
template <int WK, int K> __device__ __forceinline__ void lab_piece_x(const float *x, int k, int cols, float *xv) {
    tsr_mma::load_x<K>(x, k, cols, xv);
    if (WK == tsr_mma::kFp8)
#pragma unroll
        for (int i = 0; i < K; i++) xv[i] = __half2float(__float2half_rn(xv[i] * 0.0625f));
}

// The start of the labs' gemv_row variants: the RPW rows a warp walks from
// o0 (rows past n_out read the last; their sums are not stored), each from
// byte off of its row, and (acc set) their sums zeroed.
template <int RPW, typename A>
__device__ __forceinline__ void lab_rows(const A &p, int o0, const uint8_t **row, float *acc = nullptr, int64_t off = 0) {
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        row[r] = p.w + (int64_t)min(o0 + r, p.n_out - 1) * p.ldw + off;
        if (acc) acc[r] = 0.0f;
    }
}

// The end of the labs' gemv_row variants (kernels/cuda/gemv_row.cuh, plain
// rows): each lane's sums acc[RPW] added across the warp; with KS warps a
// row group (seg the warp's place in it), their sums through shared memory
// in warp order; y[o0 + r] = sum * scale[o] (scale null: 1) * mul. Called by
// every thread of the block (it holds a barrier when KS > 1).
template <int RPW, int KS, typename A>
__device__ __forceinline__ void lab_row_store(const A &p, const float *acc, int warp, int lane, int seg, int o0,
                                              float mul) {
    __shared__ float part[KS > 1 ? 8 : 1][RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        float v = acc[r];
        for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
        if (KS > 1) {
            if (lane == 0) part[warp][r] = v;
            continue;
        }
        const int o = o0 + r;
        if (lane == 0 && o < p.n_out) p.y[o] = v * (p.scale ? p.scale[o] : 1.0f) * mul;
    }
    if (KS > 1) {
        __syncthreads();
        if (seg != 0 || lane != 0) return;
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            float v = 0.0f;
            for (int s = 0; s < KS; s++) v += part[warp + s][r];
            const int o = o0 + r;
            if (o < p.n_out) p.y[o] = v * (p.scale ? p.scale[o] : 1.0f) * mul;
        }
    }
}

// lab_token_ms with each GEMV's arguments (A: the kernels' Args) made here:
// rows of S.in weights es bytes each, row scales s, one activation row that
// goes back and forth between xa and xb (each GEMV's output the next one's
// input); launch(a, shape index) issues it.
template <typename A, typename F>
static float lab_token_args_ms(cudaStream_t st, const uint8_t *pool, int es, const float *s, float *xa, float *xb,
                               F launch) {
    return lab_token_ms(st, pool, es, [&](int i, const Shape &S, const uint8_t *w) {
        A a = {};
        a.w = w, a.scale = s, a.n_out = S.out, a.cols = S.in, a.ldw = (int64_t)S.in * es, a.ldx = S.in;
        a.x = (i & 1) ? xb : xa, a.y = (i & 1) ? xa : xb;
        launch(a, (int)(&S - kShapes));
    });
}

// Bytes of one token's GEMVs (lab_token_ms's 129 matrices), es bytes a weight.
static inline double lab_token_bytes(double es) {
    return es * (32.0 * (6144.0 * 4096 + 4096.0 * 4096 + 28672.0 * 4096 + 4096.0 * 14336) + 128256.0 * 4096);
}

// The table of TB/s at one row (us) of configurations 0..n-1 over the shapes,
// rounds times: label(ci) prints a row's name (20 columns), ms(ci, shape)
// times it; best[i] is left the fastest configuration of shape i.
template <typename L, typename T> static void lab_sweep(int n, int rounds, double es, L label, T ms, int *best) {
    lab_table_head("config", 20);
    float best_t[kNumShapes];
    for (int i = 0; i < kNumShapes; i++) best_t[i] = 1e30f, best[i] = 0;
    for (int round = 0; round < rounds; round++)
        for (int ci = 0; ci < n; ci++) {
            label(ci);
            for (int i = 0; i < kNumShapes; i++) {
                const float t = ms(ci, kShapes[i]);
                if (t < best_t[i]) best_t[i] = t, best[i] = ci;
                printf(" | %4.2f (%6.1f)        ", es * kShapes[i].out * kShapes[i].in / t / 1e9, t * 1e3);
            }
            printf("\n");
        }
}

// The heading of a lab's section (3): one token's GEMVs of weight kind
// `kind` (es bytes a weight), its floor, and the best configuration per shape.
static void lab_chain_head(const char *kind, double es, const int *best) {
    printf("(3) %s: one token's GEMVs as a graph (floor at 4.29 TB/s %.3f ms); best per shape:", kind,
           lab_token_bytes(es) / 4.29e9);
    for (int i = 0; i < kNumShapes; i++) printf(" %d", best[i]);
    printf("\n");
}

// A lab's sections (2) and (3) for one weight kind (es bytes a weight): the
// sweep of n configurations (label and ms as lab_sweep, rounds times), then
// one token's GEMVs with production's configuration (0 on every shape)
// against the best per shape, twice each way (ordinary, PDL):
// report(prod, best, pdl) times and prints a line.
template <typename L, typename T, typename R>
static void lab_study(const char *kind, double es, int n, int rounds, L label, T ms, R report) {
    printf("\n(2) %s: TB/s at one row (us)\n", kind);
    int best[kNumShapes];
    lab_sweep(n, rounds, es, label, ms, best);
    const int prod[kNumShapes] = {0, 0, 0, 0, 0};
    lab_chain_head(kind, es, best);
    for (int round = 0; round < 2; round++)
        for (bool pdl : {false, true}) report(prod, best, pdl);
}

// A lab's start: a non-blocking stream, section (1) (check(st): each
// configuration's error against f64), then the bandwidth buffers with a
// pool of pool_bytes of weights into *b.
template <typename C> static cudaStream_t lab_start(C check, size_t pool_bytes, LabBufs *b) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    printf("(1) correctness (worst |y - f64| / sum |w x|)\n");
    check(st);
    *b = lab_bufs(st, pool_bytes);
    return st;
}

#endif // TSR_LAB_UTIL_CUH
