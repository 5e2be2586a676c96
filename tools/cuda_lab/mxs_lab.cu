// mxs_lab - the tensor-core E4M3 GEMV (kernels/cuda/gemv_mma.cuh) with each
// block's activations staged once in shared memory as the mma's f16
// B fragments. In gemv_mma every lane of a tile loads 64 bytes of f32
// activations for its 32 bytes of weights a chunk, multiplies them by 2^-4
// and packs them to f16 pairs (at one row the lanes of the other 7 input
// rows issue the packing on zeros); staged, a lane of an input row takes
// its 8 words with two 16-byte shared loads. The question: are the
// 4,096-row E4M3 products (o, down: 2.0 and 3.0 TB/s at one row, 1.7 and
// 2.5 at eight, where the floor is 4.29) bound by that? Not part of the
// engine; on the device:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o mxs_lab tools/cuda_lab/mxs_lab.cu && ./mxs_lab
// (1) the staged kernel against production's launch (same warps, tiles and
// chunk order: bit for bit); (2) TB/s at 1 and 8 rows, weights out of L2.
#include "kernels/cuda/gemv_mma.cuh"

#include "tools/cuda_lab/lab_util.cuh"

#include <vector>

using namespace tsr_mma;

// gemv_mma<kFp8, NR, KW, 1, 1> (one tile a block, U = 1) with x staged:
// words ((c * 2 + h) * NR * 4 + g * 4 + t) * 4 .. + 3 of xs hold the lane
// (g, t)'s B words 4 h .. 4 h + 3 of chunk c (chunk_x's xp).
template <int NR, int KW> __global__ void __launch_bounds__(32 * KW) mma_xs(const Args p) {
    extern __shared__ __align__(16) uint4 xs[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kw = warp;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16;
    const uint8_t *pa = p.w + (int64_t)min(row0 + g, p.n_out - 1) * p.ldw + 16 * t;
    const uint8_t *pb = p.w + (int64_t)min(row0 + g + 8, p.n_out - 1) * p.ldw + 16 * t;
    const int nch = (int)(p.ldw / 64);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    uint4 a = {}, b = {};
    if (kw < nch) a = load_w(pa + (int64_t)kw * 64), b = load_w(pb + (int64_t)kw * 64);
    tsr_pdl::wait();
    for (int i = threadIdx.x; i < nch * 4 * NR; i += 32 * KW) { // item (c, r, tt)
        const int c = i / (4 * NR), r = (i / 4) % NR, tt = i % 4;
        uint32_t xp[8];
        chunk_x<kFp8>(p, xp, p.x + (int64_t)r * p.ldx, c * 64 + 16 * tt, true);
        xs[(c * 2 + 0) * NR * 4 + r * 4 + tt] = make_uint4(xp[0], xp[1], xp[2], xp[3]);
        xs[(c * 2 + 1) * NR * 4 + r * 4 + tt] = make_uint4(xp[4], xp[5], xp[6], xp[7]);
    }
    __syncthreads();
    for (int c = kw; c < nch; c += KW) {
        const uint4 ca = a, cb = b;
        if (c + KW < nch) a = load_w(pa + (int64_t)(c + KW) * 64), b = load_w(pb + (int64_t)(c + KW) * 64);
        uint32_t xp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (g < NR) {
            const uint4 u = xs[(c * 2 + 0) * NR * 4 + g * 4 + t], v = xs[(c * 2 + 1) * NR * 4 + g * 4 + t];
            xp[0] = u.x, xp[1] = u.y, xp[2] = u.z, xp[3] = u.w, xp[4] = v.x, xp[5] = v.y, xp[6] = v.z, xp[7] = v.w;
        }
        chunk_mma<kFp8>(acc, ca, cb, xp);
    }
    tsr_pdl::trigger();
    __shared__ float4 part[KW][32];
    part[kw][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (kw != 0) return;
    for (int i = 1; i < KW; i++) {
        const float4 q = part[i][lane];
        acc[0] += q.x, acc[1] += q.y, acc[2] += q.z, acc[3] += q.w;
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int o = row0 + g + 8 * h;
        if (o >= p.n_out) continue;
        const float s = (p.scale ? p.scale[o] : 1.0f) * 16.0f;
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (2 * t + r < NR) store_y(p, p.y + (int64_t)(2 * t + r) * p.n_out + o, acc[2 * h + r] * s);
    }
}

static size_t smem_for(int nr, int64_t ldw) { return (size_t)(ldw / 64) * 2 * nr * 4 * 16; }
// whether the staged x and the kernel's 8 KiB of partial sums fit a block's shared memory (227 KiB)
static bool fits(int nr, int64_t ldw) { return smem_for(nr, ldw) + 8192 <= 232448; }

template <int NR> static cudaError_t launch_nr(const Args &a, cudaStream_t st, bool pdl) {
    const size_t smem = smem_for(NR, a.ldw);
    CK(cudaFuncSetAttribute(mma_xs<NR, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    return tsr_pdl::launch(mma_xs<NR, 16>, (unsigned)((a.n_out + 15) / 16), 16 * 32, smem, st, pdl, a);
}
static cudaError_t launch_xs(const Args &a, int rows, cudaStream_t st, bool pdl) {
    switch (rows) {
    case 1: return launch_nr<1>(a, st, pdl);
    case 2: return launch_nr<2>(a, st, pdl);
    case 8: return launch_nr<8>(a, st, pdl);
    }
    return cudaErrorInvalidValue;
}

static Args args_for(const uint8_t *w, const float *s, const float *x, float *y, int n_out, int cols) {
    Args a = {};
    a.w = w, a.scale = s, a.x = x, a.y = y, a.n_out = n_out, a.cols = cols, a.ldw = row_bytes(kFp8, cols), a.ldx = cols;
    return a;
}

// outputs of the staged kernel that differ bit for bit from production's (16 warps a tile: o and down)
static int check(int n_out, int cols, int rows, cudaStream_t st) {
    const int64_t ldw = row_bytes(kFp8, cols);
    if (!fits(rows, ldw)) return -1;
    LabCase t = lab_case_new(1, n_out, cols, ldw, 8, 4.0f);
    float *dy2;
    CK(cudaMalloc(&dy2, sizeof(float) * 8 * n_out));
    CK(launch<kFp8>(args_for(t.dw, t.ds, t.dx, t.dy, n_out, cols), rows, st, false));
    CK(launch_xs(args_for(t.dw, t.ds, t.dx, dy2, n_out, cols), rows, st, false));
    CK(cudaStreamSynchronize(st));
    std::vector<float> y1((size_t)rows * n_out), y2((size_t)rows * n_out);
    CK(cudaMemcpy(y1.data(), t.dy, sizeof(float) * rows * n_out, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y2.data(), dy2, sizeof(float) * rows * n_out, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (size_t i = 0; i < y1.size(); i++) bad += memcmp(&y1[i], &y2[i], 4) != 0;
    cudaFree(dy2);
    lab_case_free(&t);
    return bad;
}

int main(void) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    printf("(1) staged against production's launch, outputs differing bit for bit\n");
    for (int rows : {1, 2, 8})
        printf("rows %d: 4096x4096 %d, 4096x14336 %d, 300x1040 %d, 37x528 %d\n", rows, check(4096, 4096, rows, st),
               check(4096, 14336, rows, st), check(300, 1040, rows, st), check(37, 528, rows, st));
    LabBufs b = lab_bufs(st, (size_t)15400 << 20);
    float *x8;
    CK(cudaMalloc(&x8, 8 * 14336 * 4));
    CK(cudaMemset(x8, 0, 8 * 14336 * 4));
    float *y8;
    CK(cudaMalloc(&y8, 8 * 128256 * 4));
    printf("\n(2) TB/s, weights out of L2: production | staged\n");
    for (int round = 0; round < 2; round++)
        for (int i : {0, 1, 3}) {
            const Shape &S = kShapes[i];
            const int64_t ldw = row_bytes(kFp8, S.in);
            const size_t bytes = (size_t)S.out * ldw, copies = b.pool_bytes / bytes;
            printf("%-20s", S.name);
            for (int rows : {1, 2, 8}) {
                printf(" | rows %d", rows);
                for (int v = 0; v < 2; v++) {
                    if (v && !fits(rows, ldw)) {
                        printf("   - ");
                        continue;
                    }
                    const float ms = lab_calls_ms(st, 40, [&](int k) {
                        const uint8_t *w = b.pool + (size_t)(k % (copies < 64 ? copies : 64)) * bytes;
                        const Args a = args_for(w, b.s, x8, y8, S.out, S.in);
                        CK(v ? launch_xs(a, rows, st, false) : launch<kFp8>(a, rows, st, false));
                    });
                    printf(" %4.2f", bytes / ms / 1e9);
                }
            }
            printf("\n");
        }
    return 0;
}
