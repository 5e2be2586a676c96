// grouped.cuh - a mixture of experts' prompt rows through their experts'
// bf16 weights in one launch (tsr_gemv_i.run_grouped; cuda_gemv).
//
// The host has sorted a layer's (token, choice) rows by expert; the rows of
// expert e lie at [off[e], off[e + 1]). launch() cuts them into tiles of at
// most BM rows times BN weight rows of one expert (the tile list is built on
// the host, which knows the counts) and one block computes each tile on the
// tensor cores: x rows widened from f32 and rounded to bf16 as they are
// staged in shared memory (as the prompt GEMMs through cuBLASLt round their
// activations), bf16 weights, mma.sync m16n8k16 with f32 accumulation, K
// steps of BK columns, each thread's loads of the next step issued before
// the products of this one (22.7 -> 14.8 ms for that prompt). GLU: a tile's BN columns are BN / 2 gate rows and the
// matching up rows of a [gate; up] pair, and it writes silu(gate) * up
// (silu.cuh) for its BN / 2 outputs.
//
// Before this kernel the host ran each expert's rows through its own
// cuBLASLt call (with the gathers, SiLU and scatters around it): at the
// qwen3moe-7b-a1b shape 64 experts a layer, several launches each
// (BENCHMARKS.md, nineteenth session).
//
// E4M3 weights (cuda_gemv_fp8; FP8 = true): the rows as that plugin stores
// them (columns permuted within 512-column steps, gemv_mma.cuh), so the
// activations come in bf16 already in that order (xb; the plugin converts
// them as its prefill tiles do); the B tile's codes are widened to bf16 as
// they are staged (exactly; with a block-scaled checkpoint's ratios, each
// product rounded once, as the plugin's widen_bs_kernel does) and the
// epilogue multiplies by the expert's row scale: the arithmetic of the
// plugin's prefill tiles.
//
// Preconditions (the plugins check them): weight rows ldw bytes apart, ldw a
// multiple of 16, zero from cols to the end of the row; x rows ldx
// floats apart, ldx a multiple of 4, x 16-byte aligned. FP8: cols (the
// stored row length) a multiple of BK, xb rows ldx values apart, ldx a
// multiple of 4.
#ifndef TSR_GROUPED_CUH
#define TSR_GROUPED_CUH

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "gemv_mma.cuh"
#include "silu.cuh"

namespace tsr_grouped {

constexpr int BM = 64, BN = 128, PAD = 8, THREADS = 128;

// One block's work: rows [r0, r0 + nr) of the sorted input, all of expert
// e; weight rows o0.. (GLU: gate rows o0.. and up rows f + o0..).
struct Tile {
    int e, r0, nr, o0;
};

struct Args {
    const uint8_t *const *etab; // [experts] device: each expert's bf16 (FP8: E4M3) rows
    const Tile *tiles;          // device
    const float *x;             // [rows, ldx] sorted by expert (bf16 weights)
    const __nv_bfloat16 *xb;    // FP8: the same rows in bf16, in the weights' stored column order
    float *y;                   // [rows, ldy]
    int ldx, ldy;
    int n_out;                  // the weights' rows (GLU: 2f)
    int cols;                   // FP8: the stored row length (whole K steps, zero past the columns)
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
        const float2 lo = __half22float2(
            __half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(words[h] & 0xffffu), __NV_E4M3)));
        const float2 hi =
            __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(words[h] >> 16), __NV_E4M3)));
        const __nv_bfloat162 a = __floats2bfloat162_rn(lo.x * m, lo.y * m), b = __floats2bfloat162_rn(hi.x * m, hi.y * m);
        out[2 * h] = *reinterpret_cast<const uint32_t *>(&a);
        out[2 * h + 1] = *reinterpret_cast<const uint32_t *>(&b);
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}

template <bool GLU, int BK, bool FP8> __global__ void __launch_bounds__(THREADS) grouped_k(const Args p) {
    struct Stage {
        __nv_bfloat16 a[BM][BK + PAD]; // x rows, k contiguous
        __nv_bfloat16 b[BN][BK + PAD]; // weight rows, k contiguous
    };
    constexpr int CLD = BN + 4;        // the f32 tile staged for the epilogue
    constexpr size_t kBytes = sizeof(Stage) > (size_t)BM * CLD * 4 ? sizeof(Stage) : (size_t)BM * CLD * 4;
    __shared__ __align__(16) unsigned char smem[kBytes];
    Stage &s = *reinterpret_cast<Stage *>(smem);
    float(*cs)[CLD] = reinterpret_cast<float(*)[CLD]>(smem);

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
    float acc[4][4][4];
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[mi][ni][c] = 0.0f;

    // each thread's share of a K step: NA x loads of 4 floats (FP8: 4 bf16),
    // NB weight loads of 8 bf16 (FP8: 8 codes); the next step's are issued
    // before this one's products
    constexpr int NA = BM * BK / 4 / THREADS, NB = BN * BK / 8 / THREADS;
    float4 ra[NA];
    uint4 rb[NB];
    uint2 rx[FP8 ? NA : 1], rq[FP8 ? NB : 1]; // FP8: 4 bf16 activations, 8 E4M3 codes
    auto load_bf16 = [&](int k0) {
#pragma unroll
        for (int i = 0; i < NA; i++) {
            const int idx = tid + i * THREADS, r = idx / (BK / 4), c = idx % (BK / 4) * 4, k = k0 + c;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < t.nr) {
                const float *xr = p.x + (int64_t)(t.r0 + r) * p.ldx;
                if (k + 3 < p.cols) {
                    v = *reinterpret_cast<const float4 *>(xr + k);
                } else {
                    v.x = k < p.cols ? xr[k] : 0.f;
                    v.y = k + 1 < p.cols ? xr[k + 1] : 0.f;
                    v.z = k + 2 < p.cols ? xr[k + 2] : 0.f;
                }
            }
            ra[i] = v;
        }
#pragma unroll
        for (int i = 0; i < NB; i++) {
            const int idx = tid + i * THREADS, j = idx / (BK / 8), c = idx % (BK / 8) * 8, o = wrow(j);
            // past the row's padding (a K step wider than it): zeros
            rb[i] = o >= 0 && (int64_t)(k0 + c + 8) * 2 <= p.ldw
                        ? *reinterpret_cast<const uint4 *>(w + (int64_t)o * p.ldw + (int64_t)(k0 + c) * 2)
                        : make_uint4(0, 0, 0, 0);
        }
    };
    auto load = [&](int k0) {
        if constexpr (FP8) {
#pragma unroll
            for (int i = 0; i < NA; i++) {
                const int idx = tid + i * THREADS, r = idx / (BK / 4), c = idx % (BK / 4) * 4;
                rx[i] = r < t.nr ? *reinterpret_cast<const uint2 *>(p.xb + (int64_t)(t.r0 + r) * p.ldx + k0 + c)
                                 : make_uint2(0, 0);
            }
#pragma unroll
            for (int i = 0; i < NB; i++) {
                const int idx = tid + i * THREADS, j = idx / (BK / 8), c = idx % (BK / 8) * 8, o = wrow(j);
                rq[i] = o >= 0 ? *reinterpret_cast<const uint2 *>(w + (int64_t)o * p.ldw + k0 + c) : make_uint2(0, 0);
            }
        } else {
            load_bf16(k0);
        }
    };
    load(0);
    for (int k0 = 0; k0 < p.cols; k0 += BK) {
        if constexpr (FP8) {
#pragma unroll
            for (int i = 0; i < NA; i++) {
                const int idx = tid + i * THREADS, r = idx / (BK / 4), c = idx % (BK / 4) * 4;
                *reinterpret_cast<uint2 *>(&s.a[r][c]) = rx[i];
            }
#pragma unroll
            for (int i = 0; i < NB; i++) {
                const int idx = tid + i * THREADS, j = idx / (BK / 8), c = idx % (BK / 8) * 8, o = wrow(j);
                *reinterpret_cast<uint4 *>(&s.b[j][c]) = widen8(rq[i], p, t.e, o < 0 ? 0 : o, k0 + c);
            }
        } else {
#pragma unroll
            for (int i = 0; i < NA; i++) { // x rounded to bf16 as staged
                const int idx = tid + i * THREADS, r = idx / (BK / 4), c = idx % (BK / 4) * 4;
                *reinterpret_cast<__nv_bfloat162 *>(&s.a[r][c]) = __floats2bfloat162_rn(ra[i].x, ra[i].y);
                *reinterpret_cast<__nv_bfloat162 *>(&s.a[r][c + 2]) = __floats2bfloat162_rn(ra[i].z, ra[i].w);
            }
#pragma unroll
            for (int i = 0; i < NB; i++) {
                const int idx = tid + i * THREADS, j = idx / (BK / 8), c = idx % (BK / 8) * 8;
                *reinterpret_cast<uint4 *>(&s.b[j][c]) = rb[i];
            }
        }
        __syncthreads();
        if (k0 + BK < p.cols) load(k0 + BK);
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t a[4][4], b[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                const int r = mi * 16 + g;
                a[mi][0] = *reinterpret_cast<const uint32_t *>(&s.a[r][kk + 2 * q]);
                a[mi][1] = *reinterpret_cast<const uint32_t *>(&s.a[r + 8][kk + 2 * q]);
                a[mi][2] = *reinterpret_cast<const uint32_t *>(&s.a[r][kk + 2 * q + 8]);
                a[mi][3] = *reinterpret_cast<const uint32_t *>(&s.a[r + 8][kk + 2 * q + 8]);
            }
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const int n = warp * 32 + ni * 8 + g;
                b[ni][0] = *reinterpret_cast<const uint32_t *>(&s.b[n][kk + 2 * q]);
                b[ni][1] = *reinterpret_cast<const uint32_t *>(&s.b[n][kk + 2 * q + 8]);
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) mma_bf16(acc[mi][ni], a[mi], b[ni]);
        }
        __syncthreads();
    }
    // the tile through shared memory (the stage is done with), then out
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

// K steps of 64 columns: a 512-token prompt at the qwen3moe-7b-a1b shape
// 14.47 ms against 14.76-14.90 with 32 (H200, BENCHMARKS.md).
constexpr int BK = 64;

inline cudaError_t launch(const Args &p, int64_t n_tiles, bool glu, cudaStream_t st) {
    if (n_tiles < 1) return cudaSuccess;
    if (glu) grouped_k<true, BK, false><<<(unsigned)n_tiles, THREADS, 0, st>>>(p);
    else grouped_k<false, BK, false><<<(unsigned)n_tiles, THREADS, 0, st>>>(p);
    return cudaGetLastError();
}

// The same over E4M3 experts (Args' FP8 fields set).
inline cudaError_t launch_fp8(const Args &p, int64_t n_tiles, bool glu, cudaStream_t st) {
    if (n_tiles < 1) return cudaSuccess;
    if (glu) grouped_k<true, BK, true><<<(unsigned)n_tiles, THREADS, 0, st>>>(p);
    else grouped_k<false, BK, true><<<(unsigned)n_tiles, THREADS, 0, st>>>(p);
    return cudaGetLastError();
}

} // namespace tsr_grouped

#endif // TSR_GROUPED_CUH
