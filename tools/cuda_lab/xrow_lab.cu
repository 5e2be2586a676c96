// xrow_lab - the one-row E4M3 GEMV (kernels/cuda/gemv_row.cuh) with its
// activations rounded once a block into shared memory. In gemv_row every
// warp multiplies each activation by 2^-4 and rounds it to f16 and back for
// every piece of its rows (16 conversions a lane a piece, on the same
// conversion unit as the E4M3 codes' own cvt), so a block of 8 warps rounds
// x eight times. The question: is the one-row E4M3 GEMV (3.2 TB/s on
// gate/up, the chain of a token's GEMVs at ~80% of its floor where bf16's is
// at ~96%) bound by that arithmetic? Not part of the engine; on the device:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o xrow_lab tools/cuda_lab/xrow_lab.cu && ./xrow_lab
// Modes of the lab kernel (E4M3 plain rows, RPW rows a warp, U steps in
// flight, one warp a row group, columns stored permuted as production's):
//   0 production's loop (x from global, rounded in the loop): the lab's own
//     baseline, which should time as gemv_row does
//   1 x rounded once into shared memory after the wait (the first U steps'
//     weights asked for before), the loop reading it there
//   2 x taken as already rounded, read from global (what a producer writing
//     the rounded activations would give: the bound of the idea)
// (1) each mode's outputs against production's launch_row, bit for bit
// (modes 0 and 1) or within f32 rounding (2: x pre-rounded on the host);
// (2) TB/s of each shape, weights out of L2, and the blocks an SM;
// (3) one token's GEMVs as a graph (PDL): production against each mode on
// the shapes gemv_row takes (q/k/v, gate/up as plain rows, LM head).
#include "kernels/cuda/gemv_mma.cuh"
#include "kernels/cuda/gemv_row.cuh"

#include "tools/cuda_lab/lab_util.cuh"

#include <vector>

using namespace tsr_mma;

template <int RPW, int U, int MODE> __global__ void __launch_bounds__(256, 1) xrow(const Args p) {
    constexpr int K = 16, STEP = 32 * K;
    extern __shared__ __align__(16) float xs[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int o0 = (blockIdx.x * 8 + warp) * RPW;
    const uint8_t *row[RPW];
    float acc[RPW];
    lab_rows<RPW>(p, o0, row, acc);
    tsr_pdl::enter();
    uint4 w[U][RPW];
    int k0 = lane * K;
    if (MODE == 1) { // the first steps' weights on their way, then x into shared memory
#pragma unroll
        for (int u = 0; u < U; u++)
            if (k0 + u * STEP < p.cols)
#pragma unroll
                for (int r = 0; r < RPW; r++) w[u][r] = load_w(row[r] + k0 + u * STEP);
        for (int c = threadIdx.x * 4; c < p.cols; c += 256 * 4) {
            float4 f = __ldg(reinterpret_cast<const float4 *>(p.x + c));
            f.x = __half2float(__float2half_rn(f.x * 0.0625f)), f.y = __half2float(__float2half_rn(f.y * 0.0625f));
            f.z = __half2float(__float2half_rn(f.z * 0.0625f)), f.w = __half2float(__float2half_rn(f.w * 0.0625f));
            *reinterpret_cast<float4 *>(xs + c) = f;
        }
        __syncthreads();
    }
    for (bool first = true; k0 < p.cols; k0 += STEP * U, first = false) {
        if (MODE != 1 || !first)
#pragma unroll
            for (int u = 0; u < U; u++)
                if (k0 + u * STEP < p.cols)
#pragma unroll
                    for (int r = 0; r < RPW; r++) w[u][r] = load_w(row[r] + k0 + u * STEP);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + u * STEP;
            if (k >= p.cols) break;
            float xv[K];
            if (MODE == 1) { // load_x_e4m3's columns, from shared memory
                if (k >= p.cols / 512 * 512) {
#pragma unroll
                    for (int i = 0; i < K; i++) xv[i] = xs[k + i];
                } else {
                    const int b = (int)e4m3_step_rot(k, false);
                    constexpr int kQ = (int)e4m3_step_rot(4, false);
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const float4 f = *reinterpret_cast<const float4 *>(xs + b + kQ * q);
                        xv[4 * q] = f.x, xv[4 * q + 1] = f.y, xv[4 * q + 2] = f.z, xv[4 * q + 3] = f.w;
                    }
                }
            } else {
                load_x_e4m3(p.x, k, p.cols, xv);
                if (MODE == 0)
#pragma unroll
                    for (int i = 0; i < K; i++) xv[i] = __half2float(__float2half_rn(xv[i] * 0.0625f));
            }
#pragma unroll
            for (int r = 0; r < RPW; r++) acc[r] = tsr_row::dot_piece<kFp8>(w[u][r], xv, acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        float v = acc[r];
        for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
        const int o = o0 + r;
        if (lane == 0 && o < p.n_out) p.y[o] = v * (p.scale ? p.scale[o] : 1.0f) * 16.0f;
    }
}

// production's rows a warp for the shape (row_cfg: 4 from 16,384 rows, else 2)
static int rpw_for(int n_out) { return n_out >= 16384 ? 4 : 2; }

template <int RPW, int MODE> static void *kern() { return (void *)xrow<RPW, 1, MODE>; }

static cudaError_t launch_lab(int mode, const Args &a, cudaStream_t st, bool pdl) {
    const int rpw = rpw_for(a.n_out);
    const unsigned grid = (unsigned)((a.n_out + 8 * rpw - 1) / (8 * rpw));
    const size_t smem = mode == 1 ? (size_t)a.cols * 4 : 0;
#define L(R, M) return tsr_pdl::launch(xrow<R, 1, M>, grid, 256, smem, st, pdl, a)
    if (rpw == 4) {
        if (mode == 0) L(4, 0);
        if (mode == 1) L(4, 1);
        L(4, 2);
    }
    if (mode == 0) L(2, 0);
    if (mode == 1) L(2, 1);
    L(2, 2);
#undef L
}

static int blocks_per_sm(int mode, int n_out, int cols) {
    int n = 0;
    const size_t smem = mode == 1 ? (size_t)cols * 4 : 0;
    const void *k = rpw_for(n_out) == 4 ? (mode == 0 ? (void *)xrow<4, 1, 0> : mode == 1 ? (void *)xrow<4, 1, 1> : (void *)xrow<4, 1, 2>)
                                        : (mode == 0 ? (void *)xrow<2, 1, 0> : mode == 1 ? (void *)xrow<2, 1, 1> : (void *)xrow<2, 1, 2>);
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, 256, smem));
    return n;
}
static int prod_blocks_per_sm(int n_out) {
    int n = 0;
    const void *k = rpw_for(n_out) == 4 ? (void *)tsr_row::gemv_row<kFp8, 4, 1, 1> : (void *)tsr_row::gemv_row<kFp8, 2, 1, 1>;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, 256, 0));
    return n;
}

// production's one-row kernel for plain rows
static cudaError_t prod_row(const Args &a, cudaStream_t st, bool pdl) {
    return tsr_row::launch_row<kFp8, false>(a, tsr_row::kRowDense, st, pdl);
}

static Args args_for(const uint8_t *w, const float *s, const float *x, float *y, int n_out, int cols) {
    Args a = {};
    a.w = w, a.scale = s, a.x = x, a.y = y, a.n_out = n_out, a.cols = cols, a.ldw = cols, a.ldx = cols;
    return a;
}

// mode against production on a random case: 0 if bit for bit (modes 0, 1),
// else the count of outputs that differ.
static int check(int mode, int n_out, int cols, cudaStream_t st) {
    LabCase t = lab_case_new(1, n_out, cols, cols, 1, 4.0f);
    float *dy2, *dx2;
    CK(cudaMalloc(&dy2, sizeof(float) * n_out));
    CK(cudaMalloc(&dx2, sizeof(float) * cols));
    std::vector<float> xr(t.hx, t.hx + cols), y1(n_out), y2(n_out);
    if (mode == 2) // pre-rounded on the host as the kernels round
        for (float &v : xr) v = __half2float(__float2half_rn(v * 0.0625f));
    CK(cudaMemcpy(dx2, xr.data(), sizeof(float) * cols, cudaMemcpyHostToDevice));
    CK(prod_row(args_for(t.dw, t.ds, t.dx, t.dy, n_out, cols), st, false));
    CK(launch_lab(mode, args_for(t.dw, t.ds, dx2, dy2, n_out, cols), st, false));
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(y1.data(), t.dy, sizeof(float) * n_out, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y2.data(), dy2, sizeof(float) * n_out, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int o = 0; o < n_out; o++)
        if (memcmp(&y1[o], &y2[o], 4) != 0) bad++;
    cudaFree(dy2), cudaFree(dx2);
    lab_case_free(&t);
    return bad;
}

int main(void) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaFuncSetAttribute(kern<4, 1>(), cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
    CK(cudaFuncSetAttribute(kern<2, 1>(), cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
    printf("(1) outputs against production's launch_row (count differing bit for bit)\n");
    const int shapes[][2] = {{6144, 4096}, {16400, 4096}, {300, 1040}, {37, 528}, {20000, 2048}};
    for (int m = 0; m < 3; m++) {
        printf("mode %d:", m);
        for (auto &s : shapes) printf(" %dx%d %d", s[0], s[1], check(m, s[0], s[1], st));
        printf("\n");
    }

    LabBufs b = lab_bufs(st, (size_t)15400 << 20);
    float *xb;
    CK(cudaMalloc(&xb, 128256 * 4));
    CK(cudaMemset(xb, 0, 128256 * 4));
    const int rs[3] = {0, 2, 4}; // q/k/v, gate/up (as plain rows), LM head
    printf("\n(2) TB/s, weights out of L2 (blocks an SM): production | mode 0 | 1 | 2\n");
    for (int round = 0; round < 2; round++)
        for (int i : rs) {
            const Shape &S = kShapes[i];
            const size_t bytes = (size_t)S.out * S.in, copies = b.pool_bytes / bytes;
            printf("%-20s", S.name);
            for (int v = -1; v < 3; v++) {
                const float ms = lab_calls_ms(st, 40, [&](int k) {
                    const uint8_t *w = b.pool + (size_t)(k % (copies < 64 ? copies : 64)) * bytes;
                    const Args a = args_for(w, b.s, b.x, b.y, S.out, S.in);
                    CK(v < 0 ? prod_row(a, st, false) : launch_lab(v, a, st, false));
                });
                printf(" | %4.2f (%d)", bytes / ms / 1e9, v < 0 ? prod_blocks_per_sm(S.out) : blocks_per_sm(v, S.out, S.in));
            }
            printf("\n");
        }

    printf("\n(3) one token's GEMVs as a graph with PDL, ms (floor at 4.29 TB/s %.3f): production | mode 0 | 1 | 2\n",
           lab_token_bytes(1) / 4.29e9);
    for (int round = 0; round < 3; round++) {
        for (int v = -1; v < 3; v++) {
            const float t = lab_token_args_ms<Args>(st, b.pool, 1, b.s, b.x, xb, [&](Args &a, int sh) {
                const bool row = sh == 0 || sh == 2 || sh == 4;
                if (v < 0 || !row) CK(tsr_row::launch_decode<kFp8>(a, 1, tsr_row::kRowDense, st, true));
                else CK(launch_lab(v, a, st, true));
            });
            printf("%s%.3f", v < 0 ? "" : " | ", t);
        }
        printf("\n");
    }
    return 0;
}
