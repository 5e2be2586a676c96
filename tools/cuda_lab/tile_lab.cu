// tile_lab - cuda_gemv_fp8's tensor-core GEMV (gemv_mma) reading its E4M3
// weights in a tile layout instead of rows. Not part of the engine; on the
// device:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o tile_lab tools/cuda_lab/tile_lab.cu && ./tile_lab
//
// The question behind it (issue #7): f8row_lab (thirty-second session) ran
// the FP8 tensor cores over the stored rows with the activations already
// quantised and gained 1-4% a GEMV (o 2.14 against 2.06 TB/s), where
// f8mma_lab, the same products over weights in 16-row tiles whose 64-column
// chunks are 1 KiB contiguous in the lanes' order, had gained 20% (2.47):
// so the layout, not the tensor cores' input type, carried that gain. In
// rows, a warp's load of one chunk is 16 pieces of 64 bytes, each half of
// a 128-byte line whose other half another warp loads; in tiles it is two
// 512-byte runs. gemv_mma's TL instances (kernels/cuda/gemv_mma.cuh) read
// the tiles with the same lanes getting the same bytes, so their sums are
// production's bit for bit (section 1; the commit after 719e7f4 made them
// production: cuda_gemv_fp8 stores such matrices in tiles). Section (2): TB/s of o and down at
// 1, 2 and 8 rows, weights out of L2; (3): one token's GEMVs as a graph with
// programmatic dependent launch at 1 and 8 rows, production everywhere
// against the tile layout on o and down (the matrices gemv_mma takes at
// one row). TILE_LAB_ROW=1: section (7) only, a one-row kernel over tiles
// without the tensor cores against gemv_row over rows; TILE_LAB_PAIR=1:
// section (8) only, a gate/up pair's one row with its norm and SiLU.
#include "kernels/cuda/gemv_mma.cuh"
#include "kernels/cuda/gemv_row.cuh"
#include "tools/cuda_lab/lab_util.cuh"

#include <vector>

using tsr_mma::Args;
using tsr_mma::kFp8;

// Row-major rows (ldw bytes apart, n_out a multiple of 16) -> tiles.
static void to_tiles(const uint8_t *src, int n_out, int64_t ldw, uint8_t *dst) {
    for (int64_t r = 0; r < n_out; r++)
        for (int64_t k = 0; k < ldw; k += 64) memcpy(dst + tsr_mma::tiled_offset(r, k, ldw), src + r * ldw + k, 64);
}

// The production launcher with Args.tl set (gemv_mma's TL instances).
static cudaError_t launch_tl(Args a, int rows, cudaStream_t st, bool pdl) {
    a.tl = 1;
    return tsr_mma::launch<kFp8>(a, rows, st, pdl);
}

// Any height in tiles at 2 or 8 rows with the tiles a warp and warps a tile
// production's launcher gives rows (tiles_for, 16 / TPW warps), which its
// TL path does not take above one tile a warp: the lab's own dispatch.
static cudaError_t launch_tl_tall(Args a, int rows, cudaStream_t st, bool pdl) {
    a.tl = 1;
    const int tpw = tsr_mma::tiles_for<kFp8>(a.n_out, rows);
    const dim3 grid((unsigned)((a.n_out + 16 * tpw - 1) / (16 * tpw)));
    switch (rows * 10 + tpw) {
#define C(R, T)                                                                                                 \
    case R * 10 + T:                                                                                            \
        return tsr_pdl::launch(tsr_mma::gemv_mma<kFp8, R, 16 / T, 1, 1, false, T, 0, false, true>, grid, 32 * 16 / T, \
                               0, st, pdl, a);
        C(2, 1) C(2, 2) C(2, 4) C(8, 1) C(8, 2) C(8, 4)
#undef C
    }
    return cudaErrorInvalidValue;
}

// One case: n x cols random E4M3 rows at rows input rows through
// production's launcher on rows and through tiled(a, rows) on the same
// bytes in tiles; 1 if every output is bit for bit the same.
template <typename F> static int same_in_tiles(cudaStream_t st, int n, int cols, int rows, F tiled) {
    const int64_t ldw = tsr_mma::row_bytes(kFp8, cols);
    LabCase c = lab_case_new(1, n, cols, ldw, rows, 1.0f);
    std::vector<uint8_t> tiles((size_t)n * ldw);
    to_tiles(c.hw, n, ldw, tiles.data());
    uint8_t *dt;
    float *dy2;
    CK(cudaMalloc(&dt, tiles.size()));
    CK(cudaMalloc(&dy2, sizeof(float) * rows * n));
    CK(cudaMemcpy(dt, tiles.data(), tiles.size(), cudaMemcpyHostToDevice));
    Args a = {};
    a.w = c.dw, a.scale = c.ds, a.x = c.dx, a.y = c.dy, a.n_out = n, a.cols = cols, a.ldw = ldw, a.ldx = cols;
    CK(tsr_mma::launch<kFp8>(a, rows, st, false));
    a.w = dt, a.y = dy2;
    CK(tiled(a, rows));
    CK(cudaStreamSynchronize(st));
    std::vector<float> y1((size_t)rows * n), y2(y1.size());
    CK(cudaMemcpy(y1.data(), c.dy, y1.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y2.data(), dy2, y2.size() * 4, cudaMemcpyDeviceToHost));
    const int same = memcmp(y1.data(), y2.data(), y1.size() * 4) == 0;
    if (!same) printf("  DIFFERS: %d x %d, %d rows\n", n, cols, rows);
    cudaFree(dt), cudaFree(dy2);
    lab_case_free(&c);
    return same;
}

static void check(cudaStream_t st) {
    const int shapes[][2] = {{64, 4096}, {48, 14336}, {32, 1024}, {16, 1040}};
    int same = 0, cases = 0;
    for (auto &s : shapes)
        for (int rows : {1, 2, 3, 8}) {
            cases++;
            same += same_in_tiles(st, s[0], s[1], rows, [&](const Args &a, int r) { return launch_tl(a, r, st, false); });
        }
    printf("  tile layout against rows, bit for bit: %d of %d cases equal\n", same, cases);
    same = 0, cases = 0; // several tiles a warp (tall matrices at 2 and 8 rows: launch_tl_tall)
    for (int n : {6144, 16384})
        for (int rows : {2, 8}) {
            cases++;
            same += same_in_tiles(st, n, 1024, rows,
                                  [&](const Args &a, int r) { return launch_tl_tall(a, r, st, false); });
        }
    printf("  several tiles a warp, bit for bit: %d of %d cases equal\n", same, cases);
}

// Two rounds of TB/s (weights out of L2) of kShapes[shapes] at each row
// count: production's launcher on rows, then tiled on the same bytes.
template <typename F>
static void print_tbps(cudaStream_t st, const LabBufs &b, float *xa, float *xb, std::initializer_list<int> shapes,
                       std::initializer_list<int> row_counts, int reps, F tiled) {
    for (int round = 0; round < 2; round++)
        for (int si : shapes)
            for (int rows : row_counts) {
                const Shape &S = kShapes[si];
                const size_t bytes = (size_t)S.out * S.in;
                const size_t copies = b.pool_bytes / bytes < 64 ? b.pool_bytes / bytes : 64;
                printf("%-20s %d", S.name, rows);
                for (int tl = 0; tl < 2; tl++) {
                    const float ms = lab_calls_ms(st, reps, [&](int k) {
                        Args a = {};
                        a.w = b.pool + (size_t)(k % copies) * bytes, a.scale = b.s, a.x = xa, a.y = xb;
                        a.n_out = S.out, a.cols = S.in, a.ldw = S.in, a.ldx = S.in;
                        CK(tl ? tiled(a, rows, st, false) : tsr_mma::launch<kFp8>(a, rows, st, false));
                    });
                    printf(" | %4.2f", bytes / ms / 1e9);
                }
                printf("\n");
            }
}

// (7) One row over the tiles without the tensor cores: gemv_row's
// arithmetic (dot_piece over 16 E4M3 bytes against 16 staged activations,
// XS) with a lane's bytes where gemv_mma's tile instances read them: a
// block of 8 warps holds 8 / KS tiles, the KS warps of a tile take turns at
// U of its 1 KiB chunks (chunk c: lane L loads bytes 16 L of rows 0-7 and
// 512 + 16 L of rows 8-15, i.e. 16 bytes of rows L / 4 and 8 + L / 4 at
// stored column 64 c + 16 (L % 4)), the 4 lanes of a row add their sums by
// two shuffles, the KS warps through shared memory. The question: can one
// row read tiles as fast as gemv_row reads rows (then q/k/v, gate/up and
// the LM head could be stored in tiles too, and the 8-row pass read them
// 9-15% faster: section 4)? The warp's loop and the lanes' sums are now
// the engine's kernel's (kernels/cuda/gemv_tile.cuh TileLane, tile_part),
// which grew out of this lab.
//
// NT threads a block (NT / 32 / KS tiles a block): the thirty-fifth
// session's question is whether the short matrices (q/k/v, o: 384 and 256
// tiles, 8 warps a tile leaving ~16 warps an SM, each warp's 8 chunks in
// four round trips at U 2) read faster with 16 or 32 warps a tile, each
// warp's few chunks all in flight at once. Answer (H200, 2026-12-02, two
// rounds, TB/s back to back without PDL): no. o 2.00-2.09 at 16 or 32 warps
// a tile against 2.01-2.02 at 8 (production's gemv_mma 2.11-2.16), q/k/v
// 2.43-2.49 against 2.52-2.54; registers capped at 32 for 64 warps an SM
// (m8 at 256 threads, m4 at 512, m2 at 1,024 with U 2) spill and lose
// 40-50% everywhere; U 1 at 32 registers holds gate/up and the LM head
// (3.86 / 4.48) but not down (2.57). The (7b) graph of a token's GEMVs with
// PDL, the best per shape: 2.011-2.012 ms against production's 2.049-2.052.
template <int KS, int U, int NT = 256, int MINB = 1>
__global__ void __launch_bounds__(NT, MINB) tile_row(const Args p) {
    constexpr int TB = NT / 32 / KS; // tiles a block
    const int warp = threadIdx.x >> 5, tile = blockIdx.x * TB + warp / KS;
    extern __shared__ __align__(16) float xs[];
    __shared__ float part[NT / 32][16];
    tsr_tile::TileLane<KS, U> tl{p.w + tsr_mma::tiled_offset(16 * tile, 0, p.ldw) + 16 * (threadIdx.x & 31), warp % KS,
                                 (int)(p.ldw / 64)};
    tsr_pdl::enter();
    tl.load(warp % KS);
    tsr_row::stage_x<false, NT>(p, p.x, xs, nullptr);
    float acc[2] = {0.0f, 0.0f};
    tl.sums(xs, p.cols, acc);
    tsr_tile::tile_part(acc, part[warp]);
    __syncthreads();
    if (threadIdx.x < TB * 16) {
        const int tt = threadIdx.x / 16, r = threadIdx.x % 16, o = 16 * (blockIdx.x * TB + tt) + r;
        float v = 0.0f;
        for (int s2 = 0; s2 < KS; s2++) v += part[tt * KS + s2][r];
        if (o < p.n_out) p.y[o] = v * (p.scale ? p.scale[o] : 1.0f) * tsr_mma::kind_mul<kFp8>();
    }
}

struct TileRowCfg {
    const char *name;
    void (*k)(const Args);
    int ks, nt;
};
static const TileRowCfg kTileRow[] = { // KS / U, threads a block, blocks an SM asked (registers capped)
    {"tile_row 8 / 2", tile_row<8, 2>, 8, 256},                {"tr 8/2 x256 m4", tile_row<8, 2, 256, 4>, 8, 256},
    {"tr 8/2 x256 m8", tile_row<8, 2, 256, 8>, 8, 256},        {"tr 16/2 x512 m2", tile_row<16, 2, 512, 2>, 16, 512},
    {"tr 16/4 x512 m2", tile_row<16, 4, 512, 2>, 16, 512},     {"tr 16/2 x512 m4", tile_row<16, 2, 512, 4>, 16, 512},
    {"tr 32/1 x1024 m1", tile_row<32, 1, 1024, 1>, 32, 1024},  {"tr 32/2 x1024 m1", tile_row<32, 2, 1024, 1>, 32, 1024},
    {"tr 32/1 x1024 m2", tile_row<32, 1, 1024, 2>, 32, 1024},  {"tr 32/2 x1024 m2", tile_row<32, 2, 1024, 2>, 32, 1024},
    {"tr 16/1 x512 m4", tile_row<16, 1, 512, 4>, 16, 512},     {"tr 8/1 x256 m8", tile_row<8, 1, 256, 8>, 8, 256},
};
static cudaError_t launch_tile_row(const TileRowCfg &c, const Args &a, cudaStream_t st, bool pdl) {
    const size_t smem = (size_t)a.cols * 4;
    static bool sized[16];
    const int i = (int)(&c - kTileRow);
    if (!sized[i]) {
        CK(cudaFuncSetAttribute(c.k, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
        sized[i] = true;
    }
    const int tb = c.nt / 32 / c.ks;
    return tsr_pdl::launch(c.k, dim3((unsigned)((a.n_out / 16 + tb - 1) / tb)), dim3(c.nt), smem, st, pdl, a);
}

static void tile_row_section(cudaStream_t st, const LabBufs &b, float *xa, float *xb) {
    const int nc = (int)(sizeof kTileRow / sizeof *kTileRow);
    // correctness: production on rows and tile_row on the same bytes in
    // tiles against f64 (lab_case_worst: worst |y - f64| / sum |w x|)
    {
        const int n = 1024, cols = 4096 + 1040; // a last part of the row past the whole 512-column steps
        const int64_t ldw = tsr_mma::row_bytes(kFp8, cols);
        LabCase c = lab_case_new(1, n, cols, ldw, 1, 1.0f);
        lab_case_x_as_stored(c, 1, cols);
        std::vector<uint8_t> tiles((size_t)n * ldw);
        to_tiles(c.hw, n, ldw, tiles.data());
        uint8_t *dt;
        CK(cudaMalloc(&dt, tiles.size()));
        CK(cudaMemcpy(dt, tiles.data(), tiles.size(), cudaMemcpyHostToDevice));
        Args a = {};
        a.w = c.dw, a.scale = c.ds, a.x = c.dx, a.y = c.dy, a.n_out = n, a.cols = cols, a.ldw = ldw, a.ldx = cols;
        for (int ci = -1; ci < nc; ci++) {
            CK(cudaMemset(c.dy, 0xff, n * 4)); // NaN: a row left unwritten shows
            if (ci < 0) {
                a.w = c.dw;
                CK((tsr_row::launch_row<kFp8, false>(a, tsr_row::kRowDense, st, false))); // gemv_row at any height
            } else {
                a.w = dt;
                CK(launch_tile_row(kTileRow[ci], a, st, false));
            }
            CK(cudaStreamSynchronize(st)); // st does not wait for the legacy stream's copies, nor they for it
            CK(cudaMemcpy(c.hy, c.dy, n * 4, cudaMemcpyDeviceToHost));
            printf("  %-20s %d x %d: worst |y - f64| / sum |w x| %.3g\n", ci < 0 ? "gemv_row (rows)" : kTileRow[ci].name,
                   n, cols, lab_case_worst(c, 1, n, cols));
        }
        cudaFree(dt);
        lab_case_free(&c);
    }
    int best[kNumShapes];
    lab_sweep(nc + 1, 2, 1.0,
              [&](int ci) { printf("%-20s", ci ? kTileRow[ci - 1].name : "production"); },
              [&](int ci, const Shape &S) {
                  const size_t bytes = (size_t)S.out * S.in;
                  const size_t copies = b.pool_bytes / bytes < 64 ? b.pool_bytes / bytes : 64;
                  return lab_calls_ms(st, 30, [&](int k) {
                      Args a = {};
                      a.w = b.pool + (size_t)(k % copies) * bytes, a.scale = b.s, a.x = xa, a.y = xb;
                      a.n_out = S.out, a.cols = S.in, a.ldw = S.in, a.ldx = S.in;
                      // production: gemv_row on rows, o and down gemv_mma on tiles (as the engine stores them)
                      if (!ci) CK(S.out <= 4096 ? launch_tl(a, 1, st, false)
                                                : tsr_row::launch_decode<kFp8>(a, 1, tsr_row::kRowDense, st, false));
                      else CK(launch_tile_row(kTileRow[ci - 1], a, st, false));
                  });
              },
              best);
    printf("best per shape (0 production):");
    for (int i = 0; i < kNumShapes; i++) printf(" %d", best[i]);
    printf("\n(7b) one token's GEMVs at one row as a graph with PDL, ms: production | the best tile_row on q/k/v, "
           "gate/up (plain rows) and the LM head\n");
    for (int round = 0; round < 3; round++)
        for (int mode = 0; mode < 2; mode++) {
            const float t = lab_token_args_ms<Args>(st, b.pool, 1, b.s, xa, xb, [&](Args &a, int sh) {
                if (sh == 1 || sh == 3) CK(launch_tl(a, 1, st, true));
                else if (mode && best[sh]) CK(launch_tile_row(kTileRow[best[sh] - 1], a, st, true));
                else CK(tsr_row::launch_decode<kFp8>(a, 1, tsr_row::kRowDense, st, true));
            });
            printf("%s%.3f%s", mode ? " | " : "", t, mode ? "\n" : "");
        }
}

// (8) A gate/up pair's one row with its input norm and SiLU (run_fused's
// glu: the post-attention norm) at the Llama-3-8B shape, 28,672 x 4,096
// E4M3 (f = 14,336), weights out of L2: production's gemv_row GLU over rows
// (launch_glu with the norm: 16 outputs a block) against gemv_tile over pair
// tiles, as production launches it (tsr_tile::launch<true>: 4 warps a tile,
// two tiles a block) and with 8 warps a tile (one tile a block, the kernel
// before the thirty-fifth session). Correctness first: both on the same
// weights (the rows' bytes moved into pair tiles), worst |diff| / max |y|
// against gemv_row. The thirty-fifth session's run of the lab's other
// shapes (KS warps a tile / U chunks in flight / blocks an SM asked), us:
// rows 31.2-31.8, 4/2/4 32.3-32.4, 4/3/4 32.5-32.6, 4/3/3 36.5, 4/4/3 34.0,
// 2/3/4 34.1, 2/4/3 38.7-39.0, 8/2/4 33.5, 8/3/4 and 8/4/3 32.7, 4/2/5 34.4.
static cudaError_t launch_pair8(const Args &a, cudaStream_t st, bool pdl) {
    const dim3 grid((unsigned)((a.n_out + 15) / 16));
    return tsr_pdl::launch(tsr_tile::gemv_tile<true, true, 8>, grid, dim3(256), (size_t)a.cols * 4, st, pdl, a);
}

static void pair_section(cudaStream_t st, const LabBufs &b) {
    const int f = 14336, n = 2 * f, cols = 4096;
    const int64_t ldw = tsr_mma::row_bytes(kFp8, cols);
    LabCase c = lab_case_new(1, n, cols, ldw, 1, 1.0f);
    std::vector<uint8_t> tiles((size_t)n * ldw);
    for (int64_t i = 0; i < n; i++) // stacked row i into its pair-tile row
        for (int64_t k = 0; k < ldw; k += 64)
            memcpy(tiles.data() + tsr_mma::tiled_offset(tsr_mma::pair_tile_row(i, f), k, ldw), c.hw + i * ldw + k, 64);
    uint8_t *dt;
    float *nw;
    CK(cudaMalloc(&dt, tiles.size()));
    CK(cudaMalloc(&nw, cols * 4));
    CK(cudaMemcpy(dt, tiles.data(), tiles.size(), cudaMemcpyHostToDevice));
    std::vector<float> hnw(cols);
    for (int k = 0; k < cols; k++) hnw[k] = 0.5f + (float)(lab_rnd() % 1000) / 1000.0f;
    CK(cudaMemcpy(nw, hnw.data(), cols * 4, cudaMemcpyHostToDevice));
    constexpr int kNumPair = 3;
    const auto name = [&](int ci) {
        return ci == 0 ? "gemv_row GLU (rows)" : ci == 1 ? "gemv_tile (production)" : "gemv_tile 8 warps a tile";
    };
    const auto run = [&](int ci, Args a, bool pdl) {
        a.nw = nw, a.eps = 1e-5f;
        if (ci == 0) return tsr_row::launch_glu<kFp8>(a, tsr_row::kRowDense, st, pdl);
        a.tl = 2;
        return ci == 1 ? tsr_tile::launch<true>(a, st, pdl) : launch_pair8(a, st, pdl);
    };
    std::vector<float> y0(f), y1(f);
    for (int ci = 0; ci < kNumPair; ci++) {
        Args a = {};
        a.w = ci ? dt : c.dw, a.scale = c.ds, a.x = c.dx, a.y = c.dy, a.n_out = n, a.cols = cols, a.ldw = ldw;
        a.ldx = cols;
        CK(cudaMemset(c.dy, 0xff, f * 4));
        CK(run(ci, a, false));
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(ci ? y1.data() : y0.data(), c.dy, f * 4, cudaMemcpyDeviceToHost));
        if (!ci) continue;
        double worst = 0, big = 0;
        for (int o = 0; o < f; o++) big = fmax(big, fabs(y0[o]));
        for (int o = 0; o < f; o++) {
            const double d = fabs((double)y1[o] - y0[o]) / big;
            if (!(d <= worst)) worst = d;
        }
        printf("  %-28s worst |y - gemv_row's| / max |y| %.3g\n", name(ci), worst);
    }
    const size_t bytes = (size_t)n * ldw, copies = b.pool_bytes / bytes < 64 ? b.pool_bytes / bytes : 64;
    for (int round = 0; round < 3; round++)
        for (int ci = 0; ci < kNumPair; ci++) {
            const float ms = lab_calls_ms(st, 50, [&](int k) {
                Args a = {};
                a.w = b.pool + (size_t)(k % copies) * bytes, a.scale = b.s, a.x = b.x, a.y = b.y, a.n_out = n;
                a.cols = cols, a.ldw = ldw, a.ldx = cols;
                CK(run(ci, a, true));
            });
            printf("  %-28s %.2f TB/s (%.1f us)\n", name(ci), bytes / ms / 1e9, ms * 1e3);
        }
    cudaFree(dt), cudaFree(nw);
    lab_case_free(&c);
}

int main(void) {
    LabBufs b;
    cudaStream_t st = lab_start(check, (size_t)8 << 30, &b);
    float *xa, *xb;
    CK(cudaMalloc(&xa, 8 * 128256 * 4));
    CK(cudaMalloc(&xb, 8 * 128256 * 4));
    CK(cudaMemset(xa, 0, 8 * 128256 * 4));
    CK(cudaMemset(xb, 0, 8 * 128256 * 4));
    if (getenv("TILE_LAB_PAIR")) { // section (8) only
        printf("\n(8) a gate/up pair's one row with its norm and SiLU, 28672 x 4096, weights out of L2\n");
        pair_section(st, b);
        return 0;
    }
    if (getenv("TILE_LAB_ROW")) { // section (7) only
        printf("\n(7) one row over tiles without the tensor cores (tile_row KS / U), TB/s (us), weights out of L2\n");
        tile_row_section(st, b, xa, xb);
        return 0;
    }
    printf("\n(2) TB/s, weights out of L2 (two rounds): rows | production | tiles\n");
    print_tbps(st, b, xa, xb, {1, 3}, {1, 2, 8}, 40, launch_tl);
    printf("\n(3) one token's GEMVs as a graph with PDL, ms (floor at 4.29 TB/s %.3f): rows | production | tiles "
           "on o and down\n",
           lab_token_bytes(1) / 4.29e9);
    for (int round = 0; round < 3; round++)
        for (int rows : {1, 8}) {
            printf("%d", rows);
            for (int tl = 0; tl < 2; tl++) {
                const float t = lab_token_args_ms<Args>(st, b.pool, 1, b.s, xa, xb, [&](Args &a, int sh) {
                    if (tl && (sh == 1 || sh == 3)) CK(launch_tl(a, rows, st, true));
                    else CK(tsr_row::launch_decode<kFp8>(a, rows, tsr_row::kRowDense, st, true));
                });
                printf(" | %.3f", t);
            }
            printf("\n");
        }
    printf("\n(4) the other matrices at 2 and 8 rows (several tiles a warp), TB/s, weights out of L2: rows | "
           "production | tiles\n");
    print_tbps(st, b, xa, xb, {0, 2, 4}, {2, 8}, 20, launch_tl_tall);
    printf("\n(5) one token's GEMVs at 8 rows as a graph with PDL, ms: production | tiles on o and down | tiles "
           "everywhere (a verification pass's bound with tiles)\n");
    for (int round = 0; round < 3; round++) {
        for (int mode = 0; mode < 3; mode++) {
            const float t = lab_token_args_ms<Args>(st, b.pool, 1, b.s, xa, xb, [&](Args &a, int sh) {
                if (mode == 2 || (mode == 1 && (sh == 1 || sh == 3))) CK(launch_tl_tall(a, 8, st, true));
                else CK(tsr_row::launch_decode<kFp8>(a, 8, tsr_row::kRowDense, st, true));
            });
            printf("%s%.3f", mode ? " | " : "", t);
        }
        printf("\n");
    }
    printf("\n(6) o and down at one row in tiles, warps a tile / chunks in flight a warp: TB/s | one token's "
           "GEMVs (graph, PDL) with that on o and down, ms\n");
    struct V {
        const char *name;
        void (*k)(const Args);
        int threads;
    };
    const V vs[] = {
        {"16 / 1", tsr_mma::gemv_mma<kFp8, 1, 16, 1, 1, false, 1, 0, false, true>, 512},
        {"16 / 2", tsr_mma::gemv_mma<kFp8, 1, 16, 1, 2, false, 1, 0, false, true>, 512},
        {"8 / 2", tsr_mma::gemv_mma<kFp8, 1, 8, 1, 2, false, 1, 0, false, true>, 256},
        {"8 / 4", tsr_mma::gemv_mma<kFp8, 1, 8, 1, 4, false, 1, 0, false, true>, 256},
        {"32 / 1", tsr_mma::gemv_mma<kFp8, 1, 32, 1, 1, false, 1, 0, false, true>, 1024},
        {"4 / 4", tsr_mma::gemv_mma<kFp8, 1, 4, 1, 4, false, 1, 0, false, true>, 128},
    };
    for (int round = 0; round < 2; round++)
        for (const V &v : vs) {
            printf("%-8s", v.name);
            for (int si : {1, 3}) {
                const Shape &S = kShapes[si];
                const size_t bytes = (size_t)S.out * S.in;
                const size_t copies = b.pool_bytes / bytes < 64 ? b.pool_bytes / bytes : 64;
                const float ms = lab_calls_ms(st, 40, [&](int k) {
                    Args a = {};
                    a.w = b.pool + (size_t)(k % copies) * bytes, a.scale = b.s, a.x = xa, a.y = xb, a.tl = 1;
                    a.n_out = S.out, a.cols = S.in, a.ldw = S.in, a.ldx = S.in;
                    CK(tsr_pdl::launch(v.k, dim3((unsigned)(S.out / 16)), dim3(v.threads), 0, st, false, a));
                });
                printf(" | %s %4.2f", S.name, bytes / ms / 1e9);
            }
            const float t = lab_token_args_ms<Args>(st, b.pool, 1, b.s, xa, xb, [&](Args &a, int sh) {
                if (sh == 1 || sh == 3) {
                    a.tl = 1;
                    CK(tsr_pdl::launch(v.k, dim3((unsigned)(a.n_out / 16)), dim3(v.threads), 0, st, true, a));
                } else {
                    CK(tsr_row::launch_decode<kFp8>(a, 1, tsr_row::kRowDense, st, true));
                }
            });
            printf(" | token %.3f\n", t);
        }
    return 0;
}
