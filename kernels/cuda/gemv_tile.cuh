// gemv_tile.cuh - one-row decode GEMV over E4M3 weights stored in
// gemv_mma.cuh's 16-row tiles (Args.tl), for cuda_gemv_fp8.
//
// Why: verification passes of 2..8 rows read tiles 9-15% faster than rows
// through gemv_mma (each warp's chunk two 512-byte runs instead of 16 runs
// of 64 bytes), but one row of a tall matrix went to gemv_row, which reads
// whole rows. This kernel reads the tiles as fast as gemv_row reads rows
// (tools/cuda_lab/tile_lab.cu section 7 on the H200, TB/s with the weights
// out of L2, gemv_row over rows against this over tiles: q/k/v 2.36-2.49 vs
// 2.45-2.54, gate/up 3.66-3.76 vs 3.65-3.79, LM head 4.29-4.30 vs
// 4.34-4.36; one token's GEMVs 2.077-2.082 -> 2.045-2.072 ms), so every
// plain E4M3 matrix and every gate/up pair can be stored in tiles. In the
// engine it did not hold (cuda_gemv_fp8's param tile_all, Llama-3-8B shape,
// H200, 2026-12-02): one-row passes 2.41-2.44 -> 2.50-2.51 ms, most of it
// the gate/up pair's one row with its norm and SiLU (43.2 against 40.2 us
// a layer, each op waited for, with one tile a block), while 8-row passes
// went 2.94-2.98 -> 2.84 and 2-row ones 2.67-2.70 -> 2.59: an opt-in for
// assemblies that verify drafts more than they decode single rows, not the
// default. Pair tiles two a block (4 warps each, below) took back a little
// (the thirty-fifth session, interleaved: one row 2.519-2.532 -> 2.503-2.508
// ms, the pair 42.6 -> 41.6 us a layer; 8 rows unchanged); tiling only the
// pairs (q/k/v and the LM head in rows) gave 2.464-2.468 / 2.892-2.895 ms
// at 1 / 8 rows (x1.17), between the default and every matrix tiled.
//
// A block of 8 warps takes one plain tile, or two pair tiles of 4 warps
// each (KS warps a tile, below). Chunk c (64 stored columns of the tile's
// 16 rows, 1 KiB) goes to the tile's warp c % KS, two chunks in flight a warp:
// lane L loads bytes 16 L of rows 0-7 and 512 + 16 L of rows 8-15, i.e. 16
// bytes of tile rows L / 4 and 8 + L / 4 at stored column 64 c + 16 (L % 4)
// (the bytes gemv_mma's lane L takes), and multiplies them with gemv_row's
// arithmetic (row_dot.cuh: E4M3 moved into f16, activations staged once a
// block times 2^-4 rounded to f16, products summed in f32 on the CUDA
// cores). The 4 lanes of a row add their sums by two shuffles, the tile's KS
// warps in warp order through shared memory. So the sums are gemv_row's products
// in another order: within f32 rounding of it, not bit for bit.
//
// Plain tiles (tl 1) or pair tiles (tl 2: tile rows 0-7 gate rows, 8-15
// their up rows, gemv_mma.cuh pair_tile_row): each tile row's output goes
// to its stored row (tile_out_row). GLU (pair tiles): y[o] = silu(gate_o)
// * up_o from the same sums, factors and scales as the plain kernel's
// outputs, so run_glu is run() and the SiLU bit for bit. NORM (Args.nw):
// the input's RMSNorm as gemv_row's staged NORM does it (x times the norm's
// weights in f32, each sum times 1 / sqrt(mean of x^2 + eps) before its
// scale). accum: the residual add (store_y).
//
// Preconditions (tile_reads): tiles, no block ratios, no experts chosen on
// the device, cols a multiple of 16 and at most kStageMaxCols, x 16-byte
// aligned.
#ifndef TSR_GEMV_TILE_CUH
#define TSR_GEMV_TILE_CUH

#include "gemv_mma.cuh"
#include "pdl.cuh"
#include "row_dot.cuh"
#include "silu.cuh"

namespace tsr_tile {

using tsr_mma::Args;
using tsr_mma::kFp8;

constexpr int kWarps = 8, kInFlight = 2; // warps a tile, chunks a warp has in flight

// One warp's share of a tile at one row (tools/cuda_lab/tile_lab.cu tries
// other KS and U): chunks seg, seg + KS, ... of the tile at base (which
// holds the lane's offset, 16 * lane), U chunks in flight, each the lane's 16
// bytes of tile rows lane / 4 and 8 + lane / 4. load(seg) first (before
// the activations are staged), then sums().
template <int KS, int U> struct TileLane {
    const uint8_t *base;
    int seg, nch;
    uint4 w[U][2];
    __device__ __forceinline__ void load(int c0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t c = c0 + u * KS;
            if (c < nch) w[u][0] = tsr_mma::load_w(base + c * 1024), w[u][1] = tsr_mma::load_w(base + c * 1024 + 512);
        }
    };
    // The lane's two sums against the staged activations xs (cols of them).
    __device__ __forceinline__ void sums(const float *xs, int cols, float *acc) {
        const int t = threadIdx.x & 3;
        for (int c0 = seg, first = 1; c0 < nch; c0 += KS * U, first = 0) {
            if (!first) load(c0);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + u * KS;
                if (c >= nch) break;
                if (64 * c + 16 * t >= cols) continue; // padding columns: zero weights, nothing staged
                float xv[16];
                tsr_row::load_xs(xs, 64 * c + 16 * t, cols, xv);
                acc[0] = tsr_row::dot_piece<kFp8>(w[u][0], xv, acc[0]);
                acc[1] = tsr_row::dot_piece<kFp8>(w[u][1], xv, acc[1]);
            }
        }
    }
};

// The lane's two sums added over the 4 lanes of its rows into part[16] (the
// warp's row of a block's partial sums; lanes lane % 4 == 0 write).
__device__ __forceinline__ void tile_part(const float *acc, float *part) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float v = acc[h];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if ((lane & 3) == 0) part[(lane >> 2) + 8 * h] = v;
    }
}

// Launch bounds: 4 blocks an SM asked, so at most 64 registers a thread (no
// spills; the compiler's own choice, 70 with NORM, left 3 blocks an SM:
// one-row passes 2.569-2.574 -> 2.510-2.511 ms at the Llama-3-8B shape with
// a gate/up pair in pair tiles; two tiles a block of 16 warps sharing the
// staged x, 2 blocks an SM: 2.549-2.550).
//
// KS warps a tile, kWarps / KS tiles a block: plain tiles take 8 (one tile
// a block), pair tiles 4 (two tiles, 16 outputs a block as gemv_row's GLU
// has: x and the norm's weights staged once for both). tile_lab section (8),
// a pair's one row with its norm and SiLU at 28,672 x 4,096, weights out of
// L2 (H200, 2026-12-02, three rounds): gemv_row's GLU over rows 31.2-31.8
// us, 8 warps a tile 33.5, 4 warps a tile 32.3-32.4 (3 chunks in flight
// 32.5-32.6; 2 warps a tile 34.1; 8 warps and 3 in flight 32.7).
template <bool GLU, bool NORM, int KS>
__global__ void __launch_bounds__(32 * kWarps, 4) gemv_tile(const Args p) {
    constexpr int TB = kWarps / KS; // tiles a block
    const int warp = threadIdx.x >> 5, ntiles = (p.n_out + 15) / 16;
    // a last block's spare warps read the last tile again (their sums unused)
    const int tile = min((int)blockIdx.x * TB + warp / KS, ntiles - 1);
    extern __shared__ __align__(16) float xs[]; // cols floats
    __shared__ float warp_ss[kWarps];
    __shared__ float part[kWarps][16];
    TileLane<KS, kInFlight> tl{p.w + tsr_mma::tiled_offset(16 * (int64_t)tile, 0, p.ldw) + 16 * (threadIdx.x & 31),
                               warp % KS, (int)(p.ldw / 64)};
    tsr_pdl::enter();
    tl.load(warp % KS); // the first weights on their way while x is staged
    const float ss = tsr_row::stage_x<NORM>(p, p.x, xs, warp_ss);
    float acc[2] = {0.0f, 0.0f}; // tile rows lane / 4 and 8 + lane / 4
    tl.sums(xs, p.cols, acc);
    tile_part(acc, part[warp]);
    __syncthreads();
    // NORM: activations in f32, not times 2^-4 (row_dot.cuh stage_x)
    const float mul = NORM ? 1.0f : tsr_mma::kind_mul<kFp8>();
    const auto sum = [&](int tt, int r) { // row r of the block's tile tt, its warps in order, times the norm's factor
        float v = 0.0f;
        for (int s = 0; s < KS; s++) v += part[tt * KS + s][r];
        return NORM ? v * rsqrtf(ss / (float)p.cols + p.eps) : v;
    };
    if constexpr (GLU) {
        const int tt = threadIdx.x / 8, r = threadIdx.x % 8, f = p.n_out / 2, o = 8 * ((int)blockIdx.x * TB + tt) + r;
        if (tt >= TB || o >= f) return;
        const float g = sum(tt, r) * (p.scale ? p.scale[o] : 1.0f) * mul;
        const float u = sum(tt, 8 + r) * (p.scale ? p.scale[f + o] : 1.0f) * mul;
        p.y[o] = tsr_silu_mul(g, u);
    } else {
        const int tt = threadIdx.x / 16, r = threadIdx.x % 16, t = (int)blockIdx.x * TB + tt;
        if (tt >= TB || t >= ntiles) return;
        const int o = tsr_mma::tile_out_row(p, 16 * t + r);
        if (o < 0) return;
        tsr_mma::store_y(p, p.y + o, sum(tt, r) * (p.scale ? p.scale[o] : 1.0f) * mul);
    }
}

// Whether gemv_tile reads rows of cols columns (it stages all of x).
inline bool tile_cols_ok(int64_t cols) { return cols % 16 == 0 && cols <= tsr_row::kStageMaxCols; }

// Whether gemv_tile reads p (the header's preconditions).
inline bool tile_reads(const Args &p) {
    return (p.tl == 1 || p.tl == 2) && !p.cm && !p.sel && tile_cols_ok(p.cols) && p.ldw % 64 == 0 &&
           (reinterpret_cast<uintptr_t>(p.x) & 15) == 0;
}

// Whether one row of tiles goes to gemv_tile rather than gemv_mma: matrices
// of more than 4,096 rows (gemv_mma reads o and down, 4,096 x 4,096 and
// 4,096 x 14,336 at the Llama-3-8B shape, faster: 2.23 and 3.39 TB/s, the
// thirty-second session) and every pair (whose run_glu is gemv_tile's GLU,
// which must be run() and the SiLU bit for bit).
inline bool tile_kernel_for(int tl, int64_t n_out) { return tl == 2 || (tl == 1 && n_out > 4096); }
inline bool tile_kernel_for(const Args &p) { return tile_kernel_for(p.tl, p.n_out); }

// One row through gemv_tile (GLU: a pair's silu(gate) * up, y [n_out / 2]),
// with the norm where p.nw; requires tile_reads (else cudaErrorInvalidValue,
// nothing launched). pdl: a programmatic dependent of the kernel before it.
template <bool GLU> inline cudaError_t launch(const Args &p, cudaStream_t st, bool pdl) {
    if (!tile_reads(p) || (GLU && (p.tl != 2 || p.accum))) return cudaErrorInvalidValue;
    const int tb = p.tl == 2 ? 2 : 1, ntiles = (int)((p.n_out + 15) / 16); // tiles a block: KS 4 or 8
    const dim3 grid((unsigned)((ntiles + tb - 1) / tb));
    const size_t smem = (size_t)p.cols * sizeof(float);
    if (p.tl == 2) {
        if (p.nw) return tsr_pdl::launch(gemv_tile<GLU, true, 4>, grid, 32 * kWarps, smem, st, pdl, p);
        return tsr_pdl::launch(gemv_tile<GLU, false, 4>, grid, 32 * kWarps, smem, st, pdl, p);
    }
    if constexpr (!GLU) {
        if (p.nw) return tsr_pdl::launch(gemv_tile<false, true, 8>, grid, 32 * kWarps, smem, st, pdl, p);
        return tsr_pdl::launch(gemv_tile<false, false, 8>, grid, 32 * kWarps, smem, st, pdl, p);
    }
    return cudaErrorInvalidValue; // unreachable: GLU needs pair tiles
}

} // namespace tsr_tile

#endif // TSR_GEMV_TILE_CUH
