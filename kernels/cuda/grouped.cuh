// grouped.cuh - a mixture of experts' prompt rows through their experts'
// weights in one launch (tsr_gemv_i.run_grouped; cuda_gemv on bf16 weights,
// cuda_gemv_fp8 on E4M3 ones).
//
// The host has sorted a layer's (token, choice) rows by expert; the rows of
// expert e lie at [off[e], off[e + 1]). launch() cuts them into tiles of at
// most BM rows times BN weight rows of one expert (the tile list is built on
// the host, which knows the counts) and one block computes each tile on the
// tensor cores: mma.sync m16n8k16 bf16 with f32 accumulation, fragments by
// ldmatrix, K steps of BK columns brought into shared memory by cp.async
// one step ahead of the one being multiplied (no registers held for
// them). The activations come in bf16 (xb: the plugin converts the f32 rows
// first, rounding them as its cuBLASLt prompt GEMMs do; rows zero past the
// columns to a whole K step). GLU: a tile's BN columns are BN / 2 gate rows
// and the matching up rows of a [gate; up] pair, and it writes silu(gate) *
// up (silu.cuh) for its BN / 2 outputs.
//
// E4M3 weights (cuda_gemv_fp8; FP8 = true): the rows as that plugin stores
// them (columns permuted within 512-column steps, gemv_mma.cuh), so xb holds
// the activations in that order (as its prefill tiles take them); the codes
// are copied as they are and widened to a bf16 tile in shared memory before
// the products (exactly; with a block-scaled checkpoint each code times its
// block's ratio, rounded once, as the plugin's widen_bs_kernel does), and the
// epilogue multiplies by the expert's row scale: the arithmetic of the
// plugin's prefill tiles.
//
// Before this kernel the host ran each expert's rows through its own
// cuBLASLt call (with the gathers, SiLU and scatters around it): at the
// qwen3moe-7b-a1b shape 64 experts a layer, several launches each
// (BENCHMARKS.md, nineteenth and twentieth sessions).
//
// Preconditions (the plugins check them): weight rows ldw bytes apart, ldw a
// multiple of 16, zero from the columns to the end of the row (FP8: kx
// bytes, the stored row length); xb rows ldxb values apart, ldxb a
// multiple of 8, zero from the columns to kx; kx a multiple of BK.
#ifndef TSR_GROUPED_CUH
#define TSR_GROUPED_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "gemv_mma.cuh"
#include "silu.cuh"

namespace tsr_grouped {

constexpr int BM = 64, BN = 128, BK = 64, PAD = 8, THREADS = 128;
// K steps in shared memory at once (one being multiplied, the next in
// flight) and blocks per SM (launch bounds: at most 128 registers a thread,
// no spills): 2 stages of 55 KiB (bf16) or 53 KiB (E4M3) let four blocks
// share an SM. At the qwen3moe-7b-a1b shape (a 512-token prompt, H200),
// against 3 stages (bf16) and registers unbounded (164-216 a thread: two
// blocks an SM): bf16 12.30 / 12.18 -> 12.02 / 11.96 ms, E4M3 14.25 / 14.56 ->
// 13.23 / 12.92 ms (BENCHMARKS.md, twentieth session).
constexpr int STAGES = 2, MIN_BLOCKS = 4;

// One block's work: rows [r0, r0 + nr) of the sorted input, all of expert
// e; weight rows o0.. (GLU: gate rows o0.. and up rows f + o0..).
struct Tile {
    int e, r0, nr, o0;
};

struct Args {
    const uint8_t *const *etab; // [experts] device: each expert's bf16 (FP8: E4M3) rows
    const Tile *tiles;          // device
    const __nv_bfloat16 *xb;    // [rows, ldxb] sorted by expert, bf16 (FP8: in the weights' stored column order)
    float *y;                   // [rows, ldy]
    int ldxb, ldy;
    int n_out;                  // the weights' rows (GLU: 2f)
    int kx;                     // columns multiplied: a multiple of BK, zero past the true ones
    int64_t ldw;                // bytes
    // FP8 only: each expert's row scales [n_out]; block-scaled checkpoints
    // also each expert's block ratios (Weight.cm: rows cm_ld apart, a row
    // per cm_rows weight rows, blocks of 1 << cm_shift columns), else null
    const float *const *stab, *const *ctab;
    int cm_rows, cm_shift, cm_ld;
    int wcols;                  // FP8: the weights' true columns (the ratios' columns)
};

__device__ __forceinline__ void mma_bf16(float *c, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8 x 8 b16 matrices from shared memory (ldmatrix): lanes 8 i .. 8 i + 7
// give the rows of matrix i; lane l receives in r[i] row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1 of matrix i (an mma.sync fragment).
__device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *row) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// 16 bytes global -> shared, asynchronously; the last 16 - bytes zero-filled
// (bytes 0: nothing read, g need only be a valid address).
__device__ __forceinline__ void cp16(void *s, const void *g, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((unsigned)__cvta_generic_to_shared(s)),
                 "l"(g), "r"(bytes));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// 8 stored E4M3 codes (v) at stored column pos of weight row o of expert e
// as 8 bf16 (exact; with block ratios, each code times its block's ratio
// rounded once).
__device__ __forceinline__ uint4 widen8(uint2 v, const Args &p, int e, int o, int pos) {
    const uint32_t words[2] = {v.x, v.y};
    uint32_t out[4];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float m = 1.0f;
        if (p.ctab) { // a lane's four consecutive columns lie in one block (blocks of at least four)
            const int at = pos + 4 * h, full = p.wcols / 512 * 512;
            const int c = at < full ? (int)tsr_mma::e4m3_step_rot(at, false) : at;
            m = c < p.wcols ? p.ctab[e][(int64_t)(o / p.cm_rows) * p.cm_ld + (c >> p.cm_shift)] : 0.0f;
        }
        tsr_mma::e4m3x4_bf16(words[h], m, out + 2 * h);
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}

// Shared memory of a block: STAGES x (A tile, B tile: bf16 rows, or FP8's
// codes), then (FP8) the widened B tile; the epilogue's f32 tile reuses it.
constexpr int LDS = BK + PAD; // bf16 tiles' row stride (elements): rows 144 bytes apart, ldmatrix without conflicts
constexpr int A_BYTES = BM * LDS * 2;
template <bool FP8> __host__ __device__ constexpr int b_bytes() { return FP8 ? BN * BK : BN * LDS * 2; }
template <bool FP8> __host__ __device__ constexpr int smem_bytes() {
    const int pipe = STAGES * (A_BYTES + b_bytes<FP8>()) + (FP8 ? BN * LDS * 2 : 0), epi = BM * (BN + 4) * 4;
    return pipe > epi ? pipe : epi;
}

template <bool GLU, bool FP8> __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) grouped_k(const Args p) {
    extern __shared__ __align__(16) unsigned char smem[];
    auto a_tile = [&](int st) {
        return reinterpret_cast<__nv_bfloat16(*)[LDS]>(smem + st * (A_BYTES + b_bytes<FP8>()));
    };
    auto b_raw = [&](int st) { return smem + st * (A_BYTES + b_bytes<FP8>()) + A_BYTES; };
    __nv_bfloat16(*wide)[LDS] = reinterpret_cast<__nv_bfloat16(*)[LDS]>(smem + STAGES * (A_BYTES + b_bytes<FP8>()));

    const Tile t = p.tiles[blockIdx.x];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const uint8_t *w = p.etab[t.e];
    const int f = p.n_out / 2, HB = BN / 2;
    // weight row of tile column j (-1: none)
    auto wrow = [&](int j) {
        if (GLU) {
            const int i = t.o0 + (j < HB ? j : j - HB);
            return i < f ? (j < HB ? i : f + i) : -1;
        }
        const int o = t.o0 + j;
        return o < p.n_out ? o : -1;
    };
    // K step ks into stage st: 16-byte pieces, zero-filled past the rows
    // and (bf16 weights) past each weight row's bytes
    auto issue = [&](int st, int ks) {
        const int k0 = ks * BK;
        __nv_bfloat16(*sa)[LDS] = a_tile(st);
#pragma unroll
        for (int i = 0; i < BM * BK / 8 / THREADS; i++) {
            const int idx = tid + i * THREADS, r = idx / (BK / 8), c = idx % (BK / 8) * 8;
            const bool in = r < t.nr;
            cp16(&sa[r][c], p.xb + (in ? (int64_t)(t.r0 + r) * p.ldxb + k0 + c : 0), in ? 16 : 0);
        }
        if constexpr (FP8) {
            uint8_t *sb = b_raw(st);
#pragma unroll
            for (int i = 0; i < BN * BK / 16 / THREADS; i++) {
                const int idx = tid + i * THREADS, j = idx / (BK / 16), c = idx % (BK / 16) * 16, o = wrow(j);
                cp16(sb + j * BK + c, w + (o >= 0 ? (int64_t)o * p.ldw + k0 + c : 0), o >= 0 ? 16 : 0);
            }
        } else {
            __nv_bfloat16(*sb)[LDS] = reinterpret_cast<__nv_bfloat16(*)[LDS]>(b_raw(st));
#pragma unroll
            for (int i = 0; i < BN * BK / 8 / THREADS; i++) {
                const int idx = tid + i * THREADS, j = idx / (BK / 8), c = idx % (BK / 8) * 8, o = wrow(j);
                const int64_t at = (int64_t)(k0 + c) * 2, left = o >= 0 ? p.ldw - at : 0;
                const int bytes = left >= 16 ? 16 : left > 0 ? (int)left : 0;
                cp16(&sb[j][c], w + (bytes ? (int64_t)o * p.ldw + at : 0), bytes);
            }
        }
        cp_commit();
    };

    float acc[4][4][4];
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[mi][ni][c] = 0.0f;

    const int steps = p.kx / BK;
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < steps) issue(st, st);
        else cp_commit(); // an empty group keeps the count of groups in flight
    }
    for (int ks = 0; ks < steps; ks++) {
        const int st = ks % STAGES;
        cp_wait<STAGES - 2>(); // step ks has landed (this thread's pieces)
        __syncthreads();       // everyone's, and step ks - 1's products are done with their stage
        if (ks + STAGES - 1 < steps) issue((ks + STAGES - 1) % STAGES, ks + STAGES - 1);
        else cp_commit();
        __nv_bfloat16(*sa)[LDS] = a_tile(st);
        __nv_bfloat16(*sb)[LDS];
        if constexpr (FP8) { // the codes widened into the bf16 tile
            const uint8_t *raw = b_raw(st);
#pragma unroll
            for (int i = 0; i < BN * BK / 8 / THREADS; i++) {
                const int idx = tid + i * THREADS, j = idx / (BK / 8), c = idx % (BK / 8) * 8, o = wrow(j);
                *reinterpret_cast<uint4 *>(&wide[j][c]) =
                    widen8(*reinterpret_cast<const uint2 *>(raw + j * BK + c), p, t.e, o < 0 ? 0 : o, ks * BK + c);
            }
            __syncthreads();
            sb = wide;
        } else {
            sb = reinterpret_cast<__nv_bfloat16(*)[LDS]>(b_raw(st));
        }
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            // lane l names row l % 16 of a 16-row A block (columns kk or kk +
            // 8 by l / 16), and row l % 8 of two 8-row B blocks (l / 16) at
            // columns kk or kk + 8 (l / 8 % 2)
            uint32_t a[4][4], b[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) ldsm_x4(a[mi], &sa[mi * 16 + (lane & 15)][kk + (lane >> 4) * 8]);
#pragma unroll
            for (int np = 0; np < 2; np++) {
                uint32_t r[4];
                ldsm_x4(r, &sb[warp * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3)][kk + ((lane >> 3) & 1) * 8]);
                b[2 * np][0] = r[0], b[2 * np][1] = r[1], b[2 * np + 1][0] = r[2], b[2 * np + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) mma_bf16(acc[mi][ni], a[mi], b[ni]);
        }
    }
    cp_wait<0>();
    __syncthreads(); // the stages are done with: the f32 tile takes their memory
    constexpr int CLD = BN + 4;
    float(*cs)[CLD] = reinterpret_cast<float(*)[CLD]>(smem);
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            const int r = mi * 16 + g, c = warp * 32 + ni * 8 + 2 * q;
            cs[r][c] = acc[mi][ni][0], cs[r][c + 1] = acc[mi][ni][1];
            cs[r + 8][c] = acc[mi][ni][2], cs[r + 8][c + 1] = acc[mi][ni][3];
        }
    __syncthreads();
    constexpr int OUT = GLU ? BN / 2 : BN;
    const float *sc = FP8 ? p.stab[t.e] : nullptr; // FP8: the expert's row scales
    for (int idx = tid; idx < BM * OUT; idx += THREADS) {
        const int r = idx / OUT, j = idx % OUT, o = t.o0 + j;
        if (r >= t.nr || o >= (GLU ? f : p.n_out)) continue;
        float *yr = p.y + (int64_t)(t.r0 + r) * p.ldy;
        float a = cs[r][j], b = GLU ? cs[r][j + HB] : 0.0f;
        if constexpr (FP8) a *= sc[o], b = GLU ? b * sc[f + o] : b;
        yr[o] = GLU ? tsr_silu_mul(a, b) : a;
    }
}

// The K extent of a launch over weights of cols columns (bf16 weights: xb's
// row length, zero-padded).
inline int k_extent(int cols) { return (cols + BK - 1) / BK * BK; }

// How many tiles rows grouped as off[0..n] (host) make over weights of
// n_out rows (glu: a [gate; up] pair of n_out / 2 each).
inline int64_t tile_count(const int32_t *off, int n, int n_out, bool glu) {
    const int outs = glu ? n_out / 2 : n_out, step = glu ? BN / 2 : BN;
    int64_t k = 0;
    for (int e = 0; e < n; e++) k += (int64_t)((off[e + 1] - off[e] + BM - 1) / BM) * ((outs + step - 1) / step);
    return k;
}

// Those tiles, written into tiles (tile_count of them).
inline void make_tiles(const int32_t *off, int n, int n_out, bool glu, Tile *tiles) {
    const int outs = glu ? n_out / 2 : n_out, step = glu ? BN / 2 : BN;
    int64_t k = 0;
    for (int e = 0; e < n; e++)
        for (int r0 = off[e]; r0 < off[e + 1]; r0 += BM)
            for (int o0 = 0; o0 < outs; o0 += step)
                tiles[k++] = Tile{e, r0, off[e + 1] - r0 < BM ? off[e + 1] - r0 : BM, o0};
}

template <bool GLU, bool FP8> inline cudaError_t launch_t(const Args &p, int64_t n_tiles, cudaStream_t st) {
    constexpr int bytes = smem_bytes<FP8>();
    static bool set = false; // the opt-in above 48 KiB, once a process per instantiation
    if (!set) {
        const cudaError_t e =
            cudaFuncSetAttribute(grouped_k<GLU, FP8>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        if (e != cudaSuccess) return e;
        set = true;
    }
    grouped_k<GLU, FP8><<<(unsigned)n_tiles, THREADS, bytes, st>>>(p);
    return cudaGetLastError();
}

// The launch over bf16 weights (fp8 false) or E4M3 ones (Args' FP8 fields set).
inline cudaError_t launch(const Args &p, int64_t n_tiles, bool glu, bool fp8, cudaStream_t st) {
    if (n_tiles < 1) return cudaSuccess;
    return fp8 ? (glu ? launch_t<true, true>(p, n_tiles, st) : launch_t<false, true>(p, n_tiles, st))
               : (glu ? launch_t<true, false>(p, n_tiles, st) : launch_t<false, false>(p, n_tiles, st));
}

} // namespace tsr_grouped

#endif // TSR_GROUPED_CUH
