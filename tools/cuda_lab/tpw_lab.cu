// tpw_lab - the tensor-core decode GEMV (kernels/cuda/gemv_mma.cuh) with
// several 16-row tiles a warp (TPW): each lane's activations are loaded and
// rounded once for all of them, and a warp has TPW times the weight bytes in
// flight. The question: do verification rows (2..8) of E4M3 weights, where
// every lane loads 64 bytes of f32 activations for 32 bytes of weights, get
// closer to one row's rate? Not part of the engine; run on the device:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o tpw_lab tools/cuda_lab/tpw_lab.cu && ./tpw_lab
// (1) every configuration against an f64 product (bf16 and E4M3, 1..8 rows,
//     ragged shapes); (2) TB/s at the Llama-3-8B shapes, weights out of L2;
//     (3) one token's GEMVs as a graph by row count: the production launcher
//     against the fastest configuration per shape.
#include "kernels/cuda/gemv_mma.cuh"
#include "kernels/cuda/gemv_row.cuh"

#include "tools/cuda_lab/lab_util.cuh"

using namespace tsr_mma;

struct Cfg {
    int kw, tpw, minb; // warps a tile along K, tiles a warp, blocks an SM asked of the register allocator
};
static const Cfg kCfgs[] = {{16, 1, 1}, {16, 2, 1}, {16, 4, 1}, {8, 2, 1}, {8, 4, 1}, {4, 4, 1},
                            {16, 2, 2}, {8, 2, 4}, {16, 1, 3}, {8, 4, 3}, {4, 4, 4}};
static const int kNumCfgs = sizeof kCfgs / sizeof kCfgs[0];

template <int WK, int NR>
static cudaError_t launch_nr(int ci, const Args &a, cudaStream_t st, bool pdl) {
    const Cfg c = kCfgs[ci];
    const unsigned grid = (unsigned)((a.n_out + 16 * c.tpw - 1) / (16 * c.tpw));
    switch (ci) {
#define C(I, KW, TPW, MB)                                                                                 \
    case I: return tsr_pdl::launch(gemv_mma<WK, NR, KW, 1, 1, false, TPW, MB>, grid, 32 * KW, 0, st, pdl, a);
        C(0, 16, 1, 1) C(1, 16, 2, 1) C(2, 16, 4, 1) C(3, 8, 2, 1) C(4, 8, 4, 1) C(5, 4, 4, 1) C(6, 16, 2, 2)
        C(7, 8, 2, 4) C(8, 16, 1, 3) C(9, 8, 4, 3) C(10, 4, 4, 4)
#undef C
    }
    return cudaErrorInvalidValue;
}
template <int WK> static cudaError_t launch_cfg(int ci, int nr, const Args &a, cudaStream_t st, bool pdl) {
    switch (nr) {
    case 1: return launch_nr<WK, 1>(ci, a, st, pdl);
    case 2: return launch_nr<WK, 2>(ci, a, st, pdl);
    case 3: return launch_nr<WK, 3>(ci, a, st, pdl);
    case 4: return launch_nr<WK, 4>(ci, a, st, pdl);
    case 8: return launch_nr<WK, 8>(ci, a, st, pdl);
    }
    return cudaErrorInvalidValue;
}
static cudaError_t launch_any(int wk, int ci, int nr, const Args &a, cudaStream_t st, bool pdl) {
    return wk == kBf16 ? launch_cfg<kBf16>(ci, nr, a, st, pdl) : launch_cfg<kFp8>(ci, nr, a, st, pdl);
}

static Args args_for(const uint8_t *w, const float *s, const float *x, float *y, int n_out, int cols, int64_t ldw) {
    Args a = {};
    a.w = w, a.scale = s, a.x = x, a.y = y, a.n_out = n_out, a.cols = cols, a.ldw = ldw, a.ldx = cols;
    return a;
}

// Worst error of configuration ci over nr rows of a ragged case, relative to
// sum |w x| (the activations as gemv_mma rounds them: bf16, or f16 of x 2^-4;
// E4M3 rows stored with their columns permuted, e4m3_stored_col).
static double check(int wk, int ci, int nr, int n_out, int cols, cudaStream_t st) {
    const int64_t ldw = row_bytes(wk, cols);
    LabCase t = lab_case_new(wk == kFp8, n_out, cols, ldw, 8, 4.0f);
    CK(launch_any(wk, ci, nr, args_for(t.dw, wk == kFp8 ? t.ds : nullptr, t.dx, t.dy, n_out, cols, ldw), st, false));
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(t.hy, t.dy, sizeof(float) * 8 * n_out, cudaMemcpyDeviceToHost));
    double worst = 0;
    if (wk == kFp8) lab_case_x_as_stored(t, nr, cols);
    for (int r = 0; r < nr; r++) {
        float *xr = t.hx + (int64_t)r * cols;
        if (wk == kBf16) // lab_case_worst takes f32 activations against bf16 weights; gemv_mma rounds them
            for (int k = 0; k < cols; k++) {
                float &v = xr[k];
                uint32_t u;
                memcpy(&u, &v, 4);
                u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;
                memcpy(&v, &u, 4);
            }
        const double e = lab_case_worst(t, wk == kFp8, n_out, cols, r);
        if (!(e <= worst)) worst = e;
    }
    lab_case_free(&t);
    return worst;
}

int main(void) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int shapes[][2] = {{100, 4096}, {16, 64}, {37, 4100}, {300, 1000}, {8, 8}, {129, 1536}};
    int n = 0, bad = 0;
    for (int wk = 0; wk < 2; wk++)
        for (int ci = 0; ci < kNumCfgs; ci++)
            for (int nr : {1, 3, 8})
                for (auto &s : shapes) {
                    const double e = check(wk, ci, nr, s[0], s[1], st);
                    n++;
                    if (!(e < 1e-5)) {
                        bad++;
                        printf("FAIL %s kw %d tpw %d b %d rows %d %dx%d: %.3g\n", wk ? "fp8" : "bf16", kCfgs[ci].kw,
                               kCfgs[ci].tpw, kCfgs[ci].minb, nr, s[0], s[1], e);
                    }
                }
    printf("correctness: %d cases, %d beyond 1e-5 of f64 (relative to sum |w x|)\n", n, bad);

    LabBufs b = lab_bufs(st, (size_t)15400 << 20);
    float *x8;
    CK(cudaMalloc(&x8, 8 * 128256 * 4));
    CK(cudaMemset(x8, 0, 8 * 128256 * 4));
    float *y8, *xb; // y8: the bandwidth runs' outputs; x8, xb: the token's activations back and forth
    CK(cudaMalloc(&y8, 8 * 128256 * 4));
    CK(cudaMalloc(&xb, 8 * 128256 * 4));
    CK(cudaMemset(xb, 0, 8 * 128256 * 4));
    int best[2][4][kNumShapes];
    const int rows_list[4] = {1, 2, 4, 8};
    for (int wk = 0; wk < 2; wk++) {
        printf("\n%s weights, TB/s by rows 1 / 2 / 4 / 8 (weights out of L2)\n", wk ? "E4M3" : "bf16");
        lab_table_head("config", 14);
        float bt[4][kNumShapes];
        for (int r = 0; r < 4; r++)
            for (int i = 0; i < kNumShapes; i++) bt[r][i] = 1e30f, best[wk][r][i] = 0;
        for (int ci = 0; ci < kNumCfgs; ci++) {
            printf("kw %2d tpw %d b %d", kCfgs[ci].kw, kCfgs[ci].tpw, kCfgs[ci].minb);
            for (int i = 0; i < kNumShapes; i++) {
                const Shape &S = kShapes[i];
                const int64_t ldw = row_bytes(wk, S.in);
                const size_t bytes = (size_t)S.out * ldw, copies = b.pool_bytes / bytes;
                printf(" |");
                for (int r = 0; r < 4; r++) {
                    const float ms = lab_calls_ms(st, 40, [&](int k) {
                        const uint8_t *w = b.pool + (size_t)(k % (copies < 64 ? copies : 64)) * bytes;
                        CK(launch_any(wk, ci, rows_list[r], args_for(w, b.s, x8, y8, S.out, S.in, ldw), st, false));
                    });
                    if (ms < bt[r][i]) bt[r][i] = ms, best[wk][r][i] = ci;
                    printf(" %4.2f", bytes / ms / 1e9);
                }
            }
            printf("\n");
        }
    }

    printf("\none token's GEMVs (32 layers + LM head) as one graph, ms: production launcher (launch_decode) / "
           "fastest configuration per shape above, each without | with programmatic dependent launch\n");
    for (int wk = 0; wk < 2; wk++)
        for (int r = 0; r < 4; r++) {
            const int rows = rows_list[r];
            float t[4];
            for (int v = 0; v < 4; v++)
                t[v] = lab_token_args_ms<Args>(st, b.pool, wk == kFp8 ? 1 : 2, b.s, x8, xb, [&](Args &a, int sh) {
                    if (v < 2)
                        CK(wk == kBf16 ? tsr_row::launch_decode<kBf16>(a, rows, tsr_row::kRowDense, st, v)
                                       : tsr_row::launch_decode<kFp8>(a, rows, tsr_row::kRowDense, st, v));
                    else
                        CK(launch_any(wk, best[wk][r][sh], rows, a, st, v == 3));
                });
            printf("%s rows %d: production %.3f | %.3f, best per shape %.3f | %.3f  (configs", wk ? "E4M3" : "bf16",
                   rows, t[0], t[1], t[2], t[3]);
            for (int i = 0; i < kNumShapes; i++) printf(" %d/%d/%d", kCfgs[best[wk][r][i]].kw, kCfgs[best[wk][r][i]].tpw, kCfgs[best[wk][r][i]].minb);
            printf(")\n");
        }
    return bad ? 1 : 0;
}
