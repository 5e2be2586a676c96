// gemv_mma.cuh - decode and verification GEMV on tensor cores, shared by the
// CUDA gemv plugins (cuda_gemv: bf16 weights; cuda_gemv_fp8: E4M3 weights).
//
// y[r, o] = scale(o) * sum_k x[r, k] w[o, k] for 1..8 input rows r.
//
// Why tensor cores for a memory-bound product: with CUDA cores every input
// row costs one multiply per weight element and one activation load per
// weight load, so 8 rows cost several times one row. mma.sync m16n8k16 takes
// 16 weight rows x 16 k against 8 activation rows x 16 k in one instruction:
// 1 to 8 rows cost the same, and the kernel is left with nothing to do but
// stream the weights.
//
// Layout trick: a dot product does not care in which order k is summed, so
// each lane feeds the mma the elements it loaded itself, in any order, as
// long as A (weights) and B (activations) agree. Lane (g = lane / 4,
// t = lane % 4) loads 16 contiguous bytes of weight rows g and g + 8 of its
// 16-row tile at byte 16 t of a 64-byte chunk of each row, and the matching
// activations of input row g; with that mapping the fragments need no
// shuffles and every load is 16 bytes wide.
//   bf16: a chunk is 32 k; lane words w0..w3 of row g, v0..v3 of row g + 8,
//         x0..x3 (bf16 pairs): mma j in {0,1} takes A = {w[2j], v[2j],
//         w[2j+1], v[2j+1]}, B = {x[2j], x[2j+1]}.
//   fp8:  a chunk is 64 k; each 4-byte word becomes two f16 pairs (lo, hi)
//         by the hardware conversion (E4M3 -> f16 is exact, also for
//         subnormals); mma i in 0..3 takes A = {lo(w_i), lo(v_i), hi(w_i),
//         hi(v_i)} and B = the f16 activations of the same 4 elements
//         (the columns those bytes hold: E4M3 rows are stored permuted
//         within 512-column steps, e4m3_stored_col below). The
//         activations are multiplied by 2^-4 before they are rounded to f16
//         (range to ~1e6, at least bf16's precision above 2^-10); the power
//         of two is undone exactly on the f32 result.
// The block is MT groups of TPW tiles of 16 rows times KW warps that split
// each row's chunks between them (see gemv_mma's work split); the KW partial
// sums are added in shared memory.
//
// Measured on the H200 (tools/cuda_lab/gemv_lab.cu, BENCHMARKS.md): 8 rows
// cost 1.0-1.06x one row; at one row a plain warp-per-row kernel that
// streams each row from start to end is faster for bf16 (4.47 against 3.87
// TB/s on the LM head), so cuda_gemv keeps that one for decode.
//
// Preconditions (the plugin checks them and uses its other kernels
// otherwise): weight rows ldw bytes apart, ldw a multiple of 64, the
// padding zero; x f32, 16-byte aligned, rows ldx floats apart, ldx and cols
// multiples of 4; y [rows, n_out] f32.
#ifndef TSR_GEMV_MMA_CUH
#define TSR_GEMV_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "pdl.cuh"
#include "silu.cuh"

namespace tsr_mma {

enum WeightKind { kBf16 = 0, kFp8 = 1 };

// 16 bytes of weights, not kept in L1 (each is read once per pass).
__device__ __forceinline__ uint4 load_w(const uint8_t *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b); // a in the low half
    return *reinterpret_cast<uint32_t *>(&h);
}

__device__ __forceinline__ uint32_t pack_f16(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
}

// Two E4M3 bytes of w (hi: bytes 2, 3, else 0, 1; the lower byte in the low
// half) as an f16 pair of the same values (exact: every E4M3 value,
// subnormals included, is an f16 value), by the hardware conversion: one
// instruction a pair, where moving the bits took four (PRMT, SHF, two LOP3)
// and cost a one-row pass 6% at the Llama-3-8B shape once the activations'
// loads no longer bounded it (2.78 -> 2.62 ms, the same sums: BENCHMARKS.md).
__device__ __forceinline__ uint32_t e4m3_pair(uint32_t w, bool hi) {
    uint32_t r;
    const unsigned short b = (unsigned short)(hi ? w >> 16 : w & 0xffffu);
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(b));
    return r;
}

// Four E4M3 codes (a word, the lower byte first) as four bf16 values, each
// times m (m = 1: exact, every E4M3 value is a bf16 value; else each
// product rounded once), in two bf16 pairs: out[0] the lower two codes'.
__device__ __forceinline__ void e4m3x4_bf16(uint32_t w, float m, uint32_t *out) {
    const uint32_t l = e4m3_pair(w, false), h = e4m3_pair(w, true);
    const float2 lo = __half22float2(*reinterpret_cast<const __half2 *>(&l));
    const float2 hi = __half22float2(*reinterpret_cast<const __half2 *>(&h));
    const __nv_bfloat162 a = __floats2bfloat162_rn(lo.x * m, lo.y * m), b = __floats2bfloat162_rn(hi.x * m, hi.y * m);
    out[0] = *reinterpret_cast<const uint32_t *>(&a);
    out[1] = *reinterpret_cast<const uint32_t *>(&b);
}

__device__ __forceinline__ void mma_bf16(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

struct Args {
    const uint8_t *w;     // weight rows ldw bytes apart
    const float *scale;   // per output row, or null (1)
    const float *x;       // input rows ldx floats apart
    float *y;             // [rows, n_out]
    int n_out, cols;
    int64_t ldw;
    int ldx;
    // E4M3 with scales in blocks along the rows (FP8 checkpoints such as
    // DeepSeek-V3's, 128 x 128): cm [ceil(n_out / cm_rows), cm_ld] holds
    // each block's scale over its row block's largest (<= 1), and scale[o]
    // that largest; weight (o, k) is then code * scale[o] *
    // cm[o / cm_rows][k >> cm_shift], and the kernels multiply each
    // activation by its block's cm before rounding it (load_x_e4m3 with
    // BS). cm_rows a multiple of 16 (a tile's rows in one row block). null:
    // no blocks (the launchers pick the kernels without them).
    const float *cm;
    int cm_rows, cm_shift, cm_ld;
    // E4M3 weights in 16-row tiles (tiled_offset; no block ratios, no
    // experts): the same bytes to the same lanes as rows in gemv_mma, so the
    // same sums, in fewer and longer runs of memory; one row of a matrix of
    // more than 4,096 rows, and of any pair, through gemv_tile.cuh. 1: the
    // rows in their order; 2 (pair tiles): a gate/up pair (n_out = 2f) with
    // each tile's rows 0-7 gate rows and 8-15 the same outputs' up rows
    // (pair_tile_row), so that a lane's two rows are one output's gate and up.
    int tl;
    // Experts chosen on the device (gemv_row only; tsr_gemv_i.run_experts):
    // grid row j computes with weights etab[sel[j]] (ldw apart, n_out x
    // cols as above), its row scales stab[sel[j]] (stab null: scale, which
    // is then null) and E4M3 block ratios ctab[sel[j]] (with cm: alike in
    // shape, cm itself unread) from input row x + (j / per_x) * ldx into y
    // + j * (outputs a row); sel[j] < 0: nothing. null: one matrix, w.
    const uint8_t *const *etab;
    const float *const *stab;
    const float *const *ctab;
    const int32_t *sel;
    int per_x;
    // The host's ops around the product done here (tsr_gemv_i.run_fused):
    // accum: y += the product, one f32 sum an output (the host's add, bit
    // for bit); nw (gemv_row only, without cm or etab): x RMS-normalised
    // first by these f32 weights [cols] in natural column order, eps its
    // epsilon: the kernel multiplies each activation by its weight, sums
    // the squares of x on the way, and multiplies each output's sum by
    // 1 / sqrt(mean + eps) at the end.
    int accum;
    const float *nw;
    float eps;
    // The fold (tsr_gemv_i.run_fused's fold_norm and folded; gemv_row only,
    // bf16 rows of a dense matrix, row groups of several warps or a gate/up
    // pair: tsr_row::fold_blocks, folded_takes). fold_out set (with accum):
    // each output of the stream after its add also multiplied by fold_g
    // into fold_out, and each block's sum of the squares of its outputs
    // written to fold_ss[block] (in its warps' order). fold_out null,
    // fold_ss set: x is such a product's fold_out, and the n_ss sums in
    // fold_ss (summed in a fixed order: the same in every block) give each
    // output's factor 1 / sqrt(sum / cols + eps), applied to each sum before
    // its scale (and before a gate/up pair's SiLU).
    const float *fold_g;
    float *fold_out;
    float *fold_ss;
    int n_ss;
};

// The tile layout (Args.tl): the rows ldw bytes each (ldw a multiple of
// 64, n_out padded to a multiple of 16) in 16-row tiles, tile T's 64-byte
// chunk c at (T * ldw / 64 + c) * 1024 holding its rows 0..7 then 8..15 (64
// bytes each): the 1 KiB a warp of gemv_mma loads for a chunk (lane 4 g + t
// takes bytes 16 t.. of rows g and g + 8) in two 512-byte runs, where rows
// put those bytes in 16 runs of 64, each half of a line another warp
// reads. tools/cuda_lab/tile_lab.cu on the H200, TB/s at 1 / 8 rows (rows ->
// tiles): o 4,096 x 4,096 2.02 -> 2.23 / 1.72 -> 1.97, down 4,096 x 14,336
// 3.05 -> 3.39 / 2.53 -> 3.03; one token's E4M3 GEMVs as a graph 2.151 ->
// 2.076 ms at one row, 2.594 -> 2.463 at 8 (BENCHMARKS.md, thirty-second
// session). Byte k of row r's stored row lies at tiled_offset(r, k, ldw).
__host__ __device__ inline int64_t tiled_offset(int64_t r, int64_t k, int64_t ldw) {
    const int64_t g = r % 16;
    return (r / 16) * 16 * ldw + (k / 64) * 1024 + (g < 8 ? 64 * g : 512 + 64 * (g - 8)) + k % 64;
}
// The inverse: byte i of the tiles is byte untiled_offset(i, ldw) of the rows
// (tile, then within it chunk (1 KiB), half (rows 0-7, 8-15), row, byte).
__host__ __device__ inline int64_t untiled_offset(int64_t i, int64_t ldw) {
    const int64_t in = i % (16 * ldw), q = in % 1024;
    return (i / (16 * ldw) * 16 + 8 * (q / 512) + q % 512 / 64) * ldw + in / 1024 * 64 + q % 64;
}

// Pair tiles (Args.tl 2): stacked row i of a gate/up pair of f outputs (gate
// i < f, up i - f) is row pair_tile_row(i, f) of the tile layout: output o's
// gate row 8 of tile o / 8's 16 rows at o % 8, its up row at 8 + o % 8.
__host__ __device__ inline int64_t pair_tile_row(int64_t i, int64_t f) {
    const int64_t o = i < f ? i : i - f;
    return o / 8 * 16 + (i < f ? 0 : 8) + o % 8;
}

// The stored (stacked) row that row v of p's tiles holds, -1 for padding:
// v itself with plain tiles, pair_tile_row's inverse with pair tiles.
__host__ __device__ inline int tile_out_row(const Args &p, int v) {
    if (p.tl != 2) return v < p.n_out ? v : -1;
    const int f = p.n_out / 2, o = v / 16 * 8 + v % 8;
    return o >= f ? -1 : v % 16 < 8 ? o : f + o;
}

// y = v, or y + v with accum (never contracted into a multiply-add, so that
// it is the host's add of run()'s result).
__device__ __forceinline__ void store_y(const Args &p, float *y, float v) { *y = p.accum ? __fadd_rn(*y, v) : v; }

// The row of the ratios cm (shaped as p's) for output row o's row block
// (rows past n_out: the last's).
__device__ __forceinline__ const float *cm_row(const Args &p, const float *cm, int o) {
    return cm + (int64_t)(min(o, p.n_out - 1) / p.cm_rows) * p.cm_ld;
}
__device__ __forceinline__ const float *cm_row(const Args &p, int o) { return cm_row(p, p.cm, o); }

// N floats (a multiple of 4) of input row xr from k0, zero at or past cols.
template <int N>
__device__ __forceinline__ void load_x(const float *xr, int k0, int cols, float *v) {
#pragma unroll
    for (int q = 0; q < N / 4; q++) {
        const int k = k0 + 4 * q;
        const float4 f = k < cols ? tsr_pdl::load(xr + k) : make_float4(0.f, 0.f, 0.f, 0.f);
        v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
    }
}

// E4M3 rows are stored with their columns permuted within each whole step
// of 512 (the columns past the last whole step stay in place): byte
// 16 i + 4 q + j of a step holds column 128 q + 4 i + j (i < 32; q, j < 4).
// A lane reading 16 stored bytes at 16 i of a step then needs x[128 q + 4 i
// .. + 3] for q < 4: four 16-byte loads that across a warp's lanes are each
// one 512-byte run, where 16 consecutive columns a lane put the lanes 64
// bytes apart (four times the L1 wavefronts for the same activations, which
// bounded the one-row E4M3 GEMV: tools/cuda_lab/perm_lab.cu, BENCHMARKS.md).
// The product is the same; cuda_gemv_fp8 stores its weights so and permutes
// the activations it hands cuBLASLt the same way.
//
// One rule both ways: bits 2..8 of a column within its step are q (2 bits)
// over i (5), of a stored byte i over q; e4m3_step_rot turns the one into
// the other (to_byte) or back.
__host__ __device__ constexpr int64_t e4m3_step_rot(int64_t r, bool to_byte) {
    const int64_t f = (r >> 2) & 127, s = to_byte ? 2 : 5;
    return (r & ~(int64_t)511) | ((((f << s) | (f >> (7 - s))) & 127) << 2) | (r & 3);
}

// The stored byte of column c of a row of cols columns.
__host__ __device__ inline int64_t e4m3_stored_col(int64_t c, int64_t cols) {
    return c >= cols / 512 * 512 ? c : e4m3_step_rot(c, true);
}

// The 16 activations of input row xr for the 16 stored E4M3 bytes at off (a
// multiple of 16) of a row of cols columns; zero at or past cols. With BS,
// each group of four (consecutive columns, so one block of at least four)
// multiplied by its block's entry of cmr (the row block's cm row, blocks of
// 1 << shift columns).
template <bool BS = false>
__device__ __forceinline__ void load_x_e4m3(const float *xr, int off, int cols, float *v, const float *cmr = nullptr,
                                            int shift = 0) {
    if (off >= cols / 512 * 512) {
        load_x<16>(xr, off, cols, v);
        if (BS)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float m = off + 4 * q < cols ? cmr[(off + 4 * q) >> shift] : 0.0f;
#pragma unroll
                for (int j = 0; j < 4; j++) v[4 * q + j] *= m;
            }
        return;
    }
    // bytes off + 4 q hold columns b + 128 q
    const int b = (int)e4m3_step_rot(off, false);
    constexpr int64_t kQ = e4m3_step_rot(4, false);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const float4 f = tsr_pdl::load(xr + b + kQ * q);
        const float m = BS ? cmr[(b + (int)kQ * q) >> shift] : 1.0f;
        v[4 * q] = f.x * m, v[4 * q + 1] = f.y * m, v[4 * q + 2] = f.z * m, v[4 * q + 3] = f.w * m;
    }
}

// The lane's activations of input row g for its 16 bytes at byte off of a
// row (zero for lanes whose g is not an input row), as the mma's B
// fragments: bf16 4 words, fp8 8 (two a product).
template <int WK> constexpr int kXWords = WK == kBf16 ? 4 : 8;
template <int WK, bool BS = false>
__device__ __forceinline__ void chunk_x(const Args &p, uint32_t *xp, const float *xr, int off, bool has_x,
                                        const float *cmr = nullptr) {
    if (WK == kBf16) {
        float xv[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (has_x) load_x<8>(xr, off / 2, p.cols, xv);
#pragma unroll
        for (int j = 0; j < 4; j++) xp[j] = pack_bf16(xv[2 * j], xv[2 * j + 1]);
    } else {
        float xv[16];
#pragma unroll
        for (int i = 0; i < 16; i++) xv[i] = 0.f;
        if (has_x) load_x_e4m3<BS>(xr, off, p.cols, xv, cmr, p.cm_shift);
#pragma unroll
        for (int j = 0; j < 8; j++) xp[j] = pack_f16(xv[2 * j] * 0.0625f, xv[2 * j + 1] * 0.0625f);
    }
}

// The lane's 16 bytes of its two rows (a: row g, b: row g + 8) against the
// activations chunk_x packed.
template <int WK>
__device__ __forceinline__ void chunk_mma(float *acc, const uint4 &a, const uint4 &b, const uint32_t *xp) {
    if (WK == kBf16) {
        mma_bf16(acc, a.x, b.x, a.y, b.y, xp[0], xp[1]);
        mma_bf16(acc, a.z, b.z, a.w, b.w, xp[2], xp[3]);
    } else {
        const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 4; i++)
            mma_f16(acc, e4m3_pair(aw[i], false), e4m3_pair(bw[i], false), e4m3_pair(aw[i], true),
                    e4m3_pair(bw[i], true), xp[2 * i], xp[2 * i + 1]);
    }
}

// The result multiplier the activations' scaling leaves: 1 for bf16, 2^4 for fp8.
template <int WK> __host__ __device__ constexpr float kind_mul() { return WK == kBf16 ? 1.0f : 16.0f; }

// Work split: each row's 64-byte chunks are dealt to the tile's KW warps in
// turn (chunk c to warp c % KW), each warp issuing the loads of U chunks
// before it multiplies them, for TPW consecutive 16-row tiles (the lane's
// activations of a chunk loaded once for all of them: tiles_for). MINB:
// blocks an SM asked of the register allocator (the labs try it; the
// launcher leaves it 0, the compiler's choice: an explicit 1 lets it take up
// to 128 registers a thread, and the bf16 kernel at 8 rows went from 40 to
// 88, a third of the blocks an SM; 2..8-row passes of the Llama-3-8B shape
// 4.52-4.62 -> 4.82-5.41 ms, measured before this was found).
// Launched as a programmatic dependent (pdl.cuh), the kernel issues its
// first weight loads (which depend on nothing) before it waits for the
// kernel before it, and lets the next kernel launch once its products are
// done (measured on the H200 at the Llama-3-8B shape, an 8-row pass: 5.097
// ms waiting first, 4.909 loading first and letting the next launch at
// once, 4.778 loading first and letting it launch at the end).
//
// GLU: the matrix is a gate/up pair stacked by rows (n_out = 2f: gate rows
// [0, f), up rows [f, 2f)) and y [rows, f] = silu(gate) * up. A tile's rows
// g are gate rows and rows g + 8 the same outputs' up rows, so each lane
// holds an output's gate and up sums (acc 0 and 2, 1 and 3) and applies the
// SiLU in registers. Each sum is the one the plain kernel (same KW, same
// chunks a warp, same order) gives that row wherever its tile puts it, so
// the result is bit for bit run() followed by the core's SiLU kernel
// (tests/gpu/test_cuda_gemv.c). cuda_gemv_fp8's verification rows take it
// (an E4M3 8-row pass 3.36 -> 3.29 ms at the Llama-3-8B shape on the H200);
// in bf16 it made that pass slower (4.73 -> 4.84 ms: a tile's gate and up
// rows lie 117 MB apart; two tiles a warp: no faster than not fusing), so
// cuda_gemv does not (BENCHMARKS.md).
template <int WK, int NR, int KW, int MT, int U, bool BS = false, int TPW = 1, int MINB = 0, bool GLU = false,
          bool TL = false>
__global__ void __launch_bounds__(32 * KW * MT, MINB) gemv_mma(const Args p) {
    static_assert(!BS || TPW == 1, "block ratios are a row block's: one tile a warp");
    static_assert(!BS || !GLU, "a pair's gate and up rows lie in two row blocks");
    static_assert(!TL || !BS, "the tile layout: no block ratios (GLU: pair tiles, Args.tl 2)");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int mt = warp / KW, kw = warp % KW;
    const int g = lane >> 2, t = lane & 3;
    const int tile0 = (blockIdx.x * MT + mt) * TPW, row0 = tile0 * 16;
    const int f = p.n_out / 2; // GLU: outputs
    // rows past n_out (GLU: outputs past f) read the last (their results are not stored)
    const uint8_t *pa[TPW], *pb[TPW];
#pragma unroll
    for (int j = 0; j < TPW; j++) {
        if constexpr (TL) { // rows g and 8 + g of the tile's chunk (padding rows hold zeros; GLU: gate and up)
            const int tt = min(tile0 + j, (p.n_out + 15) / 16 - 1); // tiles past the last read the last
            pa[j] = p.w + tiled_offset(16 * tt, 16 * t, p.ldw) + 64 * g, pb[j] = pa[j] + 512;
        } else {
            const int o = min((tile0 + j) * 8 + g, f - 1);
            const int ra = GLU ? o : min(row0 + 16 * j + g, p.n_out - 1);
            const int rb = GLU ? f + o : min(row0 + 16 * j + g + 8, p.n_out - 1);
            pa[j] = p.w + (int64_t)ra * p.ldw + 16 * t, pb[j] = p.w + (int64_t)rb * p.ldw + 16 * t;
        }
    }
    constexpr int64_t CS = TL ? 1024 : 64; // bytes from one chunk of a lane's row to its next
    const bool has_x = g < NR;
    const float *xr = p.x + (int64_t)(has_x ? g : 0) * p.ldx;
    const int nch = (int)(p.ldw / 64);
    const float *cmr = BS ? cm_row(p, row0) : nullptr; // a tile's 16 rows lie in one row block
    float acc[TPW][4];
#pragma unroll
    for (int j = 0; j < TPW; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    bool waited = false;
    for (int c0 = kw; c0 < nch; c0 += KW * U) {
        uint4 a[U][TPW], b[U][TPW];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + u * KW;
            if (c < nch)
#pragma unroll
                for (int j = 0; j < TPW; j++) {
                    a[u][j] = load_w(pa[j] + (int64_t)c * CS);
                    b[u][j] = load_w(pb[j] + (int64_t)c * CS);
                }
        }
        if (!waited) { // the first weights are on their way before anything waits on x
            tsr_pdl::wait();
            waited = true;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + u * KW;
            if (c >= nch) continue;
            uint32_t xp[kXWords<WK>]; // the activations once for the warp's TPW tiles
            chunk_x<WK, BS>(p, xp, xr, c * 64 + 16 * t, has_x, cmr);
#pragma unroll
            for (int j = 0; j < TPW; j++) chunk_mma<WK>(acc[j], a[u][j], b[u][j], xp);
        }
    }
    if (!waited) tsr_pdl::wait(); // before y is written
    tsr_pdl::trigger();
    // acc[j]: rows 16 j + g (acc 0, 1) and 16 j + g + 8 (acc 2, 3) for input rows 2t, 2t + 1
    if (KW > 1) {
        __shared__ float4 part[MT][KW][TPW][32];
#pragma unroll
        for (int j = 0; j < TPW; j++) part[mt][kw][j][lane] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
        __syncthreads();
        if (kw != 0) return;
        for (int i = 1; i < KW; i++)
#pragma unroll
            for (int j = 0; j < TPW; j++) {
                const float4 q = part[mt][i][j][lane];
                acc[j][0] += q.x, acc[j][1] += q.y, acc[j][2] += q.z, acc[j][3] += q.w;
            }
    }
    const float mul = kind_mul<WK>();
    if constexpr (GLU) {
#pragma unroll
        for (int j = 0; j < TPW; j++) {
            const int o = (tile0 + j) * 8 + g;
            if (o >= f) continue;
            const float sg = (p.scale ? p.scale[o] : 1.0f) * mul, su = (p.scale ? p.scale[f + o] : 1.0f) * mul;
#pragma unroll
            for (int r = 0; r < 2; r++)
                if (2 * t + r < NR)
                    p.y[(int64_t)(2 * t + r) * f + o] = tsr_silu_mul(acc[j][r] * sg, acc[j][2 + r] * su);
        }
    } else {
#pragma unroll
        for (int j = 0; j < TPW; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int o = TL ? tile_out_row(p, row0 + 16 * j + g + 8 * h) : row0 + 16 * j + g + 8 * h;
                if (o < 0 || o >= p.n_out) continue;
                const float s = (p.scale ? p.scale[o] : 1.0f) * mul;
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    if (2 * t + r >= NR) continue;
                    store_y(p, p.y + (int64_t)(2 * t + r) * p.n_out + o, acc[j][2 * h + r] * s);
                }
            }
    }
}

// Bytes between weight rows the kernels need: a multiple of 64.
inline int64_t row_bytes(int WK, int64_t cols) { return (cols * (WK == kBf16 ? 2 : 1) + 63) / 64 * 64; }

// Warps per row tile chosen by shape (tools/cuda_lab/gemv_lab.cu measured
// the variants at the Llama-3-8B shapes on the H200, BENCHMARKS.md): more
// warps splitting K where a matrix has few row tiles or long rows (E4M3:
// always, its rows being half as long), so that enough loads are in flight
// (8 bf16 rows, TB/s with 16 warps against 8: q/k/v 3.02 vs 2.85, o 2.68 vs
// 2.16, down 3.55 vs 2.57; gate/up 3.66 vs 3.64, LM head 3.93 vs 4.01); one
// chunk per warp in flight at a time (U = 1) was as fast as more (and
// faster than double-buffered loads) and keeps registers for occupancy.
template <int WK> inline int warps_for(int n_out, int cols) {
    return WK == kFp8 || n_out <= 8192 || cols >= 8192 ? 16 : 8;
}

// 16-row tiles a warp: E4M3 weights at 2..8 rows take several on tall
// matrices. Every lane of a tile then loads 64 bytes of f32 activations for
// 32 bytes of weights, which bounded those passes; a warp with TPW tiles
// loads and rounds them once for all its tiles, and has TPW times the weight
// bytes in flight. tools/cuda_lab/tpw_lab.cu on the H200 (TB/s at 8 rows, 16
// warps a tile and one tile a warp against the choice here): q/k/v 6,144 x
// 4,096 1.74 -> 1.97 (8 warps, 2 tiles), gate/up 28,672 x 4,096 2.87 ->
// 3.34 and the LM head 3.25 -> 3.87 (4 warps, 4 tiles); o and down (4,096
// rows: too few tiles to share) keep one; one token's GEMVs 2.86 -> 2.60 ms
// at 8 rows, 2.52 -> 2.35 at 2. bf16 (activations half as many a weight
// byte) gained nothing and one row keeps gemv_row or one tile.
template <int WK> inline int tiles_for(int n_out, int rows) {
    if (WK != kFp8 || rows < 2) return 1;
    return n_out >= 16384 ? 4 : n_out >= 6144 ? 2 : 1;
}

// y = scale * x W^T for 1..8 rows of x (GLU: y = silu(gate) * up of a
// gate/up pair, glu_takes); the preconditions above hold (reads_x) or the
// result is wrong, so the callers check them. Tiles and warps are chosen by
// the matrix's rows (2f for a pair) either way, so that GLU's sums are
// run()'s. pdl: launched as a programmatic dependent of the kernel before it.
template <int WK, bool GLU = false>
inline cudaError_t launch(const Args &p, int rows, cudaStream_t st, bool pdl) {
    // block scales: a tile's ratios, so one tile a warp
    const int tpw = p.cm ? 1 : tiles_for<WK>(p.n_out, rows);
    const int per_tile = GLU ? 8 : 16, outs = GLU ? p.n_out / 2 : p.n_out;
    const unsigned grid = (unsigned)((outs + per_tile * tpw - 1) / (per_tile * tpw));
    if constexpr (WK == kFp8) {
        if (p.cm) { // block ratios: one tile a warp, 16 warps (as warps_for gives E4M3)
            if (GLU || p.tl || tpw != 1) return cudaErrorInvalidValue;
            switch (rows) {
#define TSR_MMA_BS(R) \
    case R: return tsr_pdl::launch(gemv_mma<WK, R, 16, 1, 1, true>, grid, 32 * 16, 0, st, pdl, p);
                TSR_MMA_BS(1) TSR_MMA_BS(2) TSR_MMA_BS(3) TSR_MMA_BS(4)
                TSR_MMA_BS(5) TSR_MMA_BS(6) TSR_MMA_BS(7) TSR_MMA_BS(8)
#undef TSR_MMA_BS
            default: return cudaErrorInvalidValue;
            }
        }
        if (p.tl) { // tiles: as rows, tiles_for's tiles a warp (16 / tpw warps); GLU over pair tiles
            if (GLU && p.tl != 2) return cudaErrorInvalidValue;
            switch (rows * 10 + tpw) {
#define TSR_MMA_TL(R, T)                                                                                    \
    case R * 10 + T:                                                                                        \
        return tsr_pdl::launch(gemv_mma<WK, R, 16 / T, 1, 1, false, T, 0, GLU, true>, grid, 32 * 16 / T, 0, st, pdl, p);
#define TSR_MMA_TL_ROWS(R) TSR_MMA_TL(R, 1) TSR_MMA_TL(R, 2) TSR_MMA_TL(R, 4)
                TSR_MMA_TL(1, 1) TSR_MMA_TL_ROWS(2) TSR_MMA_TL_ROWS(3) TSR_MMA_TL_ROWS(4)
                TSR_MMA_TL_ROWS(5) TSR_MMA_TL_ROWS(6) TSR_MMA_TL_ROWS(7) TSR_MMA_TL_ROWS(8)
#undef TSR_MMA_TL_ROWS
#undef TSR_MMA_TL
            default: return cudaErrorInvalidValue;
            }
        }
        if (tpw > 1) { // 8 warps a tile for 2 tiles, 4 for 4
            switch (rows * 10 + tpw) {
#define TSR_MMA_TPW(R, T)                                                                                   \
    case R * 10 + T:                                                                                        \
        return tsr_pdl::launch(gemv_mma<WK, R, 16 / T, 1, 1, false, T, 0, GLU>, grid, 32 * 16 / T, 0, st, pdl, p);
#define TSR_MMA_TPW_ROWS(R) TSR_MMA_TPW(R, 2) TSR_MMA_TPW(R, 4)
                TSR_MMA_TPW_ROWS(2) TSR_MMA_TPW_ROWS(3) TSR_MMA_TPW_ROWS(4)
                TSR_MMA_TPW_ROWS(5) TSR_MMA_TPW_ROWS(6) TSR_MMA_TPW_ROWS(7) TSR_MMA_TPW_ROWS(8)
#undef TSR_MMA_TPW_ROWS
#undef TSR_MMA_TPW
            default: return cudaErrorInvalidValue;
            }
        }
    }
    switch (rows * 100 + warps_for<WK>(p.n_out, p.cols)) {
#define TSR_MMA_CASE(R, KW)                                                                                 \
    case R * 100 + KW:                                                                                      \
        return tsr_pdl::launch(gemv_mma<WK, R, KW, 1, 1, false, 1, 0, GLU>, grid, 32 * KW, 0, st, pdl, p);
#define TSR_MMA_ROWS(R) TSR_MMA_CASE(R, 16) TSR_MMA_CASE(R, 8)
        TSR_MMA_ROWS(1) TSR_MMA_ROWS(2) TSR_MMA_ROWS(3) TSR_MMA_ROWS(4)
        TSR_MMA_ROWS(5) TSR_MMA_ROWS(6) TSR_MMA_ROWS(7) TSR_MMA_ROWS(8)
#undef TSR_MMA_ROWS
#undef TSR_MMA_CASE
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

// Whether launch<WK, true> takes a pair: an even n_out, no block ratios, rows
// or pair tiles.
inline bool glu_takes(const Args &p) {
    return p.n_out >= 2 && p.n_out % 2 == 0 && !p.cm && !p.accum && (p.tl == 0 || p.tl == 2);
}

// Whether x can be read by the kernels as it is.
inline bool reads_x(const float *x, int cols, int ldx) {
    return cols % 4 == 0 && ldx % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
}

} // namespace tsr_mma

#endif // TSR_GEMV_MMA_CUH
