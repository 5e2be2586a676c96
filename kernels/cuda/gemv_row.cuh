// gemv_row.cuh - one-row decode GEMV that streams whole weight rows, shared
// by the CUDA gemv plugins (cuda_gemv: bf16; cuda_gemv_fp8: E4M3) for passes
// of a single input row.
//
// y[o] = scale(o) * sum_k w[o, k] x[k].
//
// A warp owns RPW consecutive output rows and walks them from start to end:
// each step every lane loads 16 bytes of each of its rows at the same
// columns (8 bf16 or 16 E4M3 weights), the activations of those columns once
// for all RPW rows, with U steps' loads issued before any is used. With KS
// > 1, KS warps of a block share the same rows, taking turns at U steps of
// the columns, and add their sums through shared memory (more loads in
// flight, shorter chains per warp). Whole
// rows read front to back by 32 lanes make 512-byte runs per load, which the
// H200 serves faster than the tensor-core kernel's 64-byte pieces of 16 rows
// (gemv_mma.cuh); several rows per warp put more bytes in flight per warp and
// read the activations once per RPW weight rows (E4M3 rows are half as long,
// so one row per warp leaves too little in flight).
//
// E4M3 rows are stored with their columns permuted within 512-column steps
// (gemv_mma.cuh, e4m3_stored_col), so that the 16 activations of a lane's 16
// weights come as four loads of one 512-byte run across the warp each.
//
// Numbers: bf16 weights times f32 activations; E4M3 weights times the
// activations multiplied by 2^-4 and rounded to f16, as gemv_mma rounds them
// (so one row and 2..8 rows agree for E4M3); products exact in f32, summed in
// f32. E4M3 is moved into f16 by the same hardware conversion as gemv_mma
// (exact); the result is multiplied back by kind_mul.
//
// GLU (launch_glu): the matrix is a gate/up pair stacked by rows (f = n_out
// / 2 gate rows, then the f up rows); the first half of each block's row
// groups take gate rows, the second half the matching up rows, each as
// above, and the block writes y[i] = silu(gate_i) * up_i (silu.cuh) for its
// f-range: the same sums, scales and SiLU as the plain kernel followed by
// the core's silu_mul_cat, bit for bit, with one launch and no [2f] vector
// in between.
//
// Fused (Args.accum, Args.nw; tsr_gemv_i.run_fused, plain rows, and gate/up
// pairs with the norm where the activations are staged: XS below): the
// outputs added into y (the residual add), and with NORM (E4M3 only:
// fused_takes) the input's RMSNorm: each activation multiplied by its norm
// weight as it is loaded (staged: once a block, XS), the squares of x summed
// on the way (each row group's warps cover every column once: the same sum
// in every group), and
// each output's sum multiplied by 1 / sqrt(mean + eps) before its scale, so
// that the product no longer waits for a one-block norm kernel. The
// activations then stay in f32 (not rounded to f16 after 2^-4: the stream
// before its norm may lie outside f16's range, a layer's first far below
// it): within the rounding of the norm kernel followed by the plain kernel.
//
// Fold (Args.fold_*; FOLD 1: a product into the stream, 2: the product
// after it): the next norm split between the two launches so that no norm
// kernel runs between them. The first writes the stream times the norm's
// weights and its blocks' sums of squares; the second copies those sums
// into shared memory while its loop runs, and multiplies each output's sum
// by the factor after it, its loop unchanged (unlike NORM, no activation
// is loaded twice and no register is held for squares). bf16 only: E4M3 rounds its
// activations to f16, and the stream times a norm's weights before the
// factor may lie outside f16's range.
//
// Staged activations (XS; E4M3 plain rows and gate/up pairs without block
// ratios or experts, x of at most 12,032 columns: stages_x): after the wait
// each warp asks for its first steps' weights, then the block's threads
// multiply x by 2^-4, round it to f16 and back once into shared memory (cols
// floats, natural column order), and the loop reads each piece's
// activations there (four conflict-free 16-byte loads a lane, load_xs).
// Without it every warp rounded every activation for its own rows, 8 times
// a block, on the unit that also runs the E4M3 codes' conversion. The same
// values in the same sums: bit for bit the kernel without it.
// tools/cuda_lab/xrow_lab.cu on the H200 (TB/s, weights out of L2): q/k/v
// 2.32 -> 2.43, gate/up as plain rows 3.63-3.70 -> 3.81-3.82, LM head 4.33
// -> 4.37; one token's E4M3 GEMVs as a graph 2.204 -> 2.123 ms (floor 1.749;
// activations already rounded by their producer, the idea's bound: 2.108).
// With NORM the staging stores x times the norm's weights in f32 (not
// rounded, as NORM's loop did) and sums the squares of x: each thread its
// columns, each warp's across its lanes, the 8 warps' in warp order, the same
// sum in every block; so the norm costs a block one pass over x and the
// weights, where each warp loaded both for every piece, and a gate/up pair
// (GLU) can take it too: its factor multiplies each gate and up sum before
// the scales and the SiLU (the plugin's run_fused of the post-attention norm
// into gate/up; the norm's sum in another order than the one-warp loop's
// and than the norm kernel's, so within f32 rounding of either).
//
// Preconditions (row_reads): cols a multiple of 8 (bf16) or 16 (E4M3); w, ldw
// and x 16-byte aligned.
#ifndef TSR_GEMV_ROW_CUH
#define TSR_GEMV_ROW_CUH

#include "gemv_mma.cuh"
#include "gemv_tile.cuh"
#include "row_dot.cuh"
#include "silu.cuh"

namespace tsr_row {

using tsr_mma::Args;
using tsr_mma::kBf16;
using tsr_mma::kFp8;

// KS: warps per row group (the header); their sums added in warp order.
// GLU: gate rows and their up rows in one block (the header).
// BS: E4M3 with block scales (Args.cm): the warp's RPW rows lie in one row
// block, whose cm row multiplies the activations as gemv_mma's do.
// SEL: experts chosen on the device (Args.etab, sel): grid row j computes
// with the weights of expert sel[j] (a template flag: the kernel of one
// matrix keeps its code, which a runtime test made 2% slower at the
// Llama-3-8B shape).
// NORM: x RMS-normalised by p.nw first (the header; E4M3 plain rows only).
// The most sums of squares a fold leaves (4 floats a thread of a block).
constexpr int kFoldLoads = 4, kFoldMax = 256 * kFoldLoads;

template <int WK, int RPW, int U, int KS = 1, bool GLU = false, bool BS = false, bool SEL = false, bool NORM = false,
          int FOLD = 0, bool XS = false>
__global__ void __launch_bounds__(256, FOLD == 2 ? (RPW == 1 ? 8 : 6) : 1) gemv_row(const Args p) {
    constexpr int K = Piece<WK>::k, ES = WK == kBf16 ? 2 : 1, STEP = 32 * K;
    constexpr int G = 8 / KS, HG = G / 2; // row groups per block; GLU: the gate half
    static_assert(8 % KS == 0, "a block of 8 warps holds whole groups of KS");
    static_assert(!GLU || G % 2 == 0, "GLU pairs the block's row groups");
    static_assert(!NORM || (WK == kFp8 && !BS && !SEL && (!GLU || XS)), "the norm: fused_takes");
    static_assert(!XS || (WK == kFp8 && !BS && !SEL), "staged activations: stages_x");
    static_assert(FOLD == 0 || (WK == kBf16 && !BS && !SEL && !NORM && (KS > 1 || (FOLD == 2 && GLU)) &&
                                (FOLD != 1 || !GLU)),
                  "the fold: bf16 rows of several warps a group, or (after it) a gate/up pair (fold_blocks)");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, seg = warp % KS, grp = warp / KS;
    const int f = p.n_out / 2; // GLU: gate rows [0, f), up rows [f, 2f)
    const int o0 = !GLU           ? (blockIdx.x * G + grp) * RPW
                   : grp < HG     ? (blockIdx.x * HG + grp) * RPW
                                  : f + (blockIdx.x * HG + grp - HG) * RPW;
    if (!GLU && KS == 1 && !XS && o0 >= p.n_out) return; // else every warp reaches the barrier
    const uint8_t *row[RPW]; // rows past n_out read the last row (not stored)
#pragma unroll
    for (int r = 0; r < RPW; r++) row[r] = p.w + (int64_t)min(o0 + r, p.n_out - 1) * p.ldw;
    float acc[RPW], ss = 0.0f; // ss: NORM's squares of the lane's activations
#pragma unroll
    for (int r = 0; r < RPW; r++) acc[r] = 0.0f;
    const float *cmr = BS && !SEL ? tsr_mma::cm_row(p, o0) : nullptr;
    const float *scale = p.scale;
    const float *x = p.x;
    float *y = p.y;
    // Launched as a programmatic dependent (pdl.cuh): wait for the kernel
    // before, let the next one launch. Issuing the first weight loads before
    // the wait, as gemv_mma does, made a one-row pass slower on the H200
    // (4.437 against 4.395 ms at the Llama-3-8B shape), and so did asking
    // L2 for them (prefetch.global.L2 of each warp's first pieces: 4.280 ->
    // 4.575 ms), and so did copying them into shared memory (cp.async of the
    // first 1-4 chain steps: 4.11 -> 4.09-4.43 ms; BENCHMARKS.md).
    tsr_pdl::enter();
    if (SEL) { // grid row j: the expert the routing before chose (p.etab)
        const int e = p.sel[blockIdx.y];
        if (e < 0) return; // the whole block: no barrier is left waiting
#pragma unroll
        for (int r = 0; r < RPW; r++) row[r] = p.etab[e] + (int64_t)min(o0 + r, p.n_out - 1) * p.ldw;
        if (p.stab) scale = p.stab[e];
        if (BS) cmr = tsr_mma::cm_row(p, p.ctab[e], o0);
        x += (int64_t)(blockIdx.y / p.per_x) * p.ldx;
        y += (int64_t)blockIdx.y * (GLU ? f : p.n_out);
    }
    // FOLD 2: the fold's sums of squares copied into shared memory while the
    // loop runs (cp.async, 16 bytes a thread, zeros past n_ss), used after
    // it. Held in registers instead, they took 6-8 more a thread and fewer
    // blocks an SM (5 instead of 6 at 2 rows a warp, 6 instead of 8 at one):
    // one-row passes 4.02 -> 4.19 ms at the Llama-3-8B shape. The launch
    // bounds hold FOLD 2 to the plain kernels' registers (40 and 32, no
    // spills: ptxas -v).
    __shared__ __align__(16) float fold_buf[FOLD == 2 ? kFoldMax : 4];
    if constexpr (FOLD == 2) {
        const int j = threadIdx.x * kFoldLoads, n = min(max(p.n_ss - j, 0), kFoldLoads);
        const unsigned dst = (unsigned)__cvta_generic_to_shared(fold_buf + j);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(p.fold_ss + j), "r"(n * 4)
                     : "memory");
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    uint4 w[U][RPW];
    const auto load_step = [&](int k0) {
#pragma unroll
        for (int u = 0; u < U; u++)
            if (k0 + u * STEP < p.cols)
#pragma unroll
                for (int r = 0; r < RPW; r++) w[u][r] = tsr_mma::load_w(row[r] + (int64_t)(k0 + u * STEP) * ES);
    };
    extern __shared__ __align__(16) float xs[]; // XS: cols floats
    __shared__ float xs_ss[XS && NORM ? 8 : 1];  // XS with NORM: each warp's squares
    if constexpr (XS) { // the first weights on their way, then x rounded into xs
        load_step(lane * K + seg * STEP * U);
        ss = stage_x<NORM>(p, x, xs, xs_ss); // NORM: x times its norm weight, the squares of x summed
        if (!GLU && KS == 1 && o0 >= p.n_out) return;
    }
    for (int k0 = lane * K + seg * STEP * U, first = 1; k0 < p.cols; k0 += STEP * U * KS, first = 0) {
        if (!XS || !first) load_step(k0);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + u * STEP;
            if (k >= p.cols) break;
            float xv[K];
            if (XS) load_xs(xs, k, p.cols, xv);
            else if (WK == kFp8) tsr_mma::load_x_e4m3<BS>(x, k, p.cols, xv, cmr, p.cm_shift);
            else tsr_mma::load_x<K>(x, k, p.cols, xv);
            if constexpr (NORM && !XS) {
                float gv[K]; // the norm's weights, through load_x_e4m3's ordinary loads (tsr_pdl::load)
                tsr_mma::load_x_e4m3(p.nw, k, p.cols, gv);
#pragma unroll
                for (int i = 0; i < K; i++) ss = fmaf(xv[i], xv[i], ss), xv[i] *= gv[i];
            }
            if (WK == kFp8 && !NORM && !XS) // NORM: in f32 (the stream, not yet normalised, may lie outside f16's range)
#pragma unroll
                for (int i = 0; i < K; i++) xv[i] = round_x(xv[i]);
#pragma unroll
            for (int r = 0; r < RPW; r++) acc[r] = dot_piece<WK>(w[u][r], xv, acc[r]);
        }
    }
    const float mul = NORM ? 1.0f : tsr_mma::kind_mul<WK>();
    __shared__ float part[KS > 1 || GLU ? 8 : 1][RPW];
    __shared__ float part_ss[NORM && KS > 1 ? 8 : 1];
    __shared__ float fold_w[FOLD ? 8 : 1]; // FOLD 2: each warp's part of the sums; 1: each row group's squares
    if constexpr (FOLD == 2) { // each thread's own copy (visible to it after the wait), then the warp's
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        const float4 f4 = *reinterpret_cast<const float4 *>(fold_buf + threadIdx.x * kFoldLoads);
        float t = ((f4.x + f4.y) + f4.z) + f4.w;
        for (int s = 16; s > 0; s >>= 1) t += __shfl_xor_sync(0xffffffffu, t, s);
        if (lane == 0) fold_w[warp] = t;
    }
    // FOLD 2: the factor, once the barrier below has passed (in warp order: the same in every block)
    const auto fold_factor = [&]() {
        float t = 0.0f;
        for (int w = 0; w < 8; w++) t += fold_w[w];
        return rsqrtf(t / (float)p.cols + p.eps);
    };
    if (NORM && !XS) {
        for (int s = 16; s > 0; s >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, s);
        if (KS > 1 && lane == 0) part_ss[warp] = ss;
    }
    // NORM: the factor of the row group of warps g * KS .. (their squares in warp order)
    const auto inv_rms = [&](int g) {
        float t = ss;
        if (KS > 1 && !XS) {
            t = 0.0f;
            for (int s = 0; s < KS; s++) t += part_ss[g * KS + s];
        }
        return rsqrtf(t / (float)p.cols + p.eps);
    };
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        float v = acc[r];
        for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
        if (KS > 1 || GLU) {
            if (lane == 0) part[warp][r] = v;
            continue;
        }
        const int o = o0 + r;
        if (NORM) v *= inv_rms(0);
        if (lane == 0 && o < p.n_out) tsr_mma::store_y(p, y + o, v * (scale ? scale[o] : 1.0f) * mul);
    }
    if (GLU) { // thread t: gate row group t / RPW's row t % RPW and its up row
        __syncthreads();
        const int t = threadIdx.x, gi = t / RPW, r = t % RPW;
        const int i = (blockIdx.x * HG + gi) * RPW + r;
        if (t >= HG * RPW || i >= f) return;
        float g = KS > 1 ? 0.0f : part[gi][r], u = KS > 1 ? 0.0f : part[gi + HG][r];
        if (KS > 1) // in warp order, as the plain kernel adds them
            for (int s = 0; s < KS; s++) g += part[gi * KS + s][r], u += part[(gi + HG) * KS + s][r];
        if (FOLD == 2) {
            const float fac = fold_factor();
            g *= fac, u *= fac;
        }
        if (NORM) {
            const float fac = inv_rms(0);
            g *= fac, u *= fac;
        }
        g = g * (scale ? scale[i] : 1.0f) * mul;
        u = u * (scale ? scale[f + i] : 1.0f) * mul;
        y[i] = tsr_silu_mul(g, u);
        return;
    }
    if (KS > 1) {
        __syncthreads();
        float sq = 0.0f; // FOLD 1: the squares of the group's outputs after the add
        if (seg == 0 && lane == 0) {
            const float fac = FOLD == 2 ? fold_factor() : 1.0f;
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                float v = 0.0f;
                for (int s = 0; s < KS; s++) v += part[warp + s][r];
                if (NORM) v *= inv_rms(grp);
                if (FOLD == 2) v *= fac;
                const int o = o0 + r;
                if (o >= p.n_out) continue;
                tsr_mma::store_y(p, y + o, v * (scale ? scale[o] : 1.0f) * mul);
                if constexpr (FOLD == 1) {
                    const float t = y[o];
                    p.fold_out[o] = t * p.fold_g[o];
                    sq = fmaf(t, t, sq);
                }
            }
        }
        if constexpr (FOLD == 1) { // the block's sum, its row groups in order
            if (seg == 0 && lane == 0) fold_w[grp] = sq;
            __syncthreads();
            if (threadIdx.x == 0) {
                float t = 0.0f;
                for (int g = 0; g < G; g++) t += fold_w[g];
                p.fold_ss[blockIdx.x] = t;
            }
        }
    }
}

// Whether gemv_row can read these weights (rows, not Args.tl's tiles) and activations.
inline bool row_reads(int WK, const Args &p) {
    return !p.tl && p.cols % (WK == kBf16 ? 8 : 16) == 0 && p.ldw % 16 == 0 &&
           ((reinterpret_cast<uintptr_t>(p.w) | reinterpret_cast<uintptr_t>(p.x)) & 15) == 0;
}

// Whether gemv_row stages p's activations (XS, the header): E4M3 plain rows
// or a gate/up pair, without block ratios or experts, x of at most
// kStageMaxCols columns.
inline bool stages_x(int WK, const Args &p) { return WK == kFp8 && !p.cm && !p.sel && p.cols <= kStageMaxCols; }

// ny: grid rows (p.sel: one a chosen expert, the SEL kernel; else 1)
template <int WK, int RPW, int U, int KS = 1, bool GLU = false>
inline cudaError_t launch_cfg(const Args &p, cudaStream_t st, bool pdl, int ny = 1) {
    const int per_block = 8 / KS * RPW / (GLU ? 2 : 1); // outputs
    const int outs = GLU ? p.n_out / 2 : p.n_out;
    const dim3 grid((unsigned)((outs + per_block - 1) / per_block), (unsigned)ny);
    if (p.sel) { // experts chosen on the device (E4M3 block ratios: p.ctab, with p.cm giving their shape)
        if constexpr (WK == kFp8)
            if (p.cm) return tsr_pdl::launch(gemv_row<WK, RPW, U, KS, GLU, true, true>, grid, 256, 0, st, pdl, p);
        return tsr_pdl::launch(gemv_row<WK, RPW, U, KS, GLU, false, true>, grid, 256, 0, st, pdl, p);
    }
    if constexpr (WK == kFp8 && !GLU) // the norm: fused_takes
        if (p.nw && !stages_x(WK, p))
            return tsr_pdl::launch(gemv_row<WK, RPW, U, KS, GLU, false, false, true>, grid, 256, 0, st, pdl, p);
    if constexpr (GLU) // a pair takes the norm only staged (glu_fused_takes, the kernel's static_assert)
        if (p.nw && !stages_x(WK, p)) return cudaErrorInvalidValue;
    if constexpr (WK == kBf16 && KS > 1) { // the fold: fold_blocks, folded_takes
        if constexpr (!GLU)
            if (p.fold_out)
                return tsr_pdl::launch(gemv_row<WK, RPW, U, KS, GLU, false, false, false, 1>, grid, 256, 0, st, pdl, p);
        if (p.fold_ss && !p.fold_out)
            return tsr_pdl::launch(gemv_row<WK, RPW, U, KS, GLU, false, false, false, 2>, grid, 256, 0, st, pdl, p);
    }
    if constexpr (WK == kFp8) {
        if (p.cm) return tsr_pdl::launch(gemv_row<WK, RPW, U, KS, GLU, true>, grid, 256, 0, st, pdl, p);
        if (stages_x(WK, p)) {
            const size_t smem = (size_t)p.cols * sizeof(float);
            if (p.nw)
                return tsr_pdl::launch(gemv_row<WK, RPW, U, KS, GLU, false, false, true, 0, true>, grid, 256, smem,
                                       st, pdl, p);
            return tsr_pdl::launch(gemv_row<WK, RPW, U, KS, GLU, false, false, false, 0, true>, grid, 256, smem, st,
                                   pdl, p);
        }
    }
    return tsr_pdl::launch(gemv_row<WK, RPW, U, KS, GLU>, grid, 256, 0, st, pdl, p);
}

// The decode GEMV of 1..8 rows: one row through gemv_row where it reads the
// operands and is the faster kernel at the shape, else gemv_mma. Measured at
// the Llama-3-8B shapes on the H200 (tools/cuda_lab/gemv_lab.cu, weights out
// of L2; BENCHMARKS.md, seventh session; TB/s at one row for q/k/v, o,
// gate/up, down, LM head):
// - bf16: two warps per group of 2 rows (KS 2) on matrices below 16,384 rows,
//   3.34, 2.95, -, 3.93, - against one warp per row's 3.33, 2.88, -, 3.81, -;
//   four warps per row on the tall ones, 4.19 (gate/up) and 4.45 (LM head)
//   against two rows per warp's 4.07 and 4.47. A one-row pass 4.36 -> 4.23 ms
//   (decode 228.8 -> 235.6 tok/s). Every gemv_mma configuration is slower.
// - E4M3: 4 rows per warp on tall matrices (gate/up 3.18, LM head 4.17) and 2
//   on q/k/v (2.19), gemv_mma's 16 warps per tile on the 4,096-row ones (o
//   1.84, down 2.70). KS 2 read faster alone (2.31, 1.90, 3.38, 2.81, 4.12)
//   but made the one-row pass slower as programmatic dependents (3.13 ->
//   3.21 ms), so E4M3 keeps one warp per row group. With the columns
//   permuted (twelfth session, tools/cuda_lab/perm_lab.cu): 2.33, 1.98,
//   3.60, 2.81, 4.15 with the same choices; KS 2 on the shorter matrices and
//   2 rows a warp on the tall ones read faster alone again (2.47, 2.11, -,
//   3.04, -; gate/up 3.56 with 2 rows a warp) and again made the engine's
//   one-row pass slower (2.78 -> 3.00-3.03 ms; 2 rows a warp on the tall
//   ones alone: 2.84).
// pdl: launched as a programmatic dependent of the kernel before it.

// Whether one row of a matrix of n_out rows goes to gemv_row (E4M3 matrices
// of at most 4,096 rows go to gemv_mma), where it is stored in rows (one row
// of tiles goes to gemv_mma or gemv_tile.cuh: tile_kernel_for).
inline bool row_kernel_for(int WK, int n_out) { return WK == kBf16 || n_out > 4096; }

// What a matrix is to the model, for launch_row's choice: the values of
// slots/tsr_gemv.h's tsr_weight_role, which the plugins keep with each
// handle. A chosen expert runs beside the token's other chosen experts (k
// times the blocks of one matrix), a router is a few rows.
enum RowRole { kRowDense = 0, kRowExpert = 1, kRowRouter = 2 };

// One row through gemv_row at the configuration for the matrix (rows a
// warp, steps in flight, warps a row group), as plain rows or (GLU) as a
// gate/up pair. The choice depends on the shape and the role only, never on
// GLU or ny, so that run_glu is run() and the SiLU bit for bit and an
// expert chosen on the device gets the sums run() gives it. ny: as
// launch_cfg's. Beyond the choices above (bf16 1, 2, 4 on tall matrices,
// else 2, 2, 2; E4M3 4, 1, 1 tall, else 2, 1, 1), measured at the
// qwen3moe-7b-a1b shape (hidden 2,048, 64 experts of 1,024 rows, 8 a token)
// in the engine's one-row pass on the H200 (BENCHMARKS.md, twenty-second
// session; ms a pass, cuda-fast 1.111 and cuda-fast-fp8 0.842 before):
// - bf16 rows of at most 2,048 columns (q/k/v, o): 4 warps a row, 1.095
//   (2, 1, 4: 1.103; 2, 2, 1: 1.134; 4, 2, 1: 1.127);
// - bf16 routers: 8 warps a row (one row a block), 1.093 (2, 2, 2 gave the
//   64 rows 8 blocks);
// - bf16 experts' rows of at most 1,024 columns (the downs): 2 rows a warp,
//   one warp a group, 1.096 (1, 2, 4: 1.190); their gate/up pairs keep 2,
//   2, 2 (1, 2, 4: 1.173);
// - E4M3 experts of at most 2,048 columns: 4 rows a warp, downs 0.826 and
//   gate/up 0.822 (1, 1, 2 / 1, 1, 4: 0.90-0.99).
struct RowCfg {
    int rpw, u, ks; // rows a warp, steps in flight, warps a row group
};
inline RowCfg row_cfg(int WK, const Args &p, RowRole role, bool glu) {
    if (WK == kBf16) {
        if (!glu && role == kRowRouter) return {1, 2, 8};
        if (role == kRowExpert && p.n_out < 16384 && p.cols <= 1024) return {2, 2, 1};
        return p.n_out >= 16384 || (role != kRowExpert && p.cols <= 2048) ? RowCfg{1, 2, 4} : RowCfg{2, 2, 2};
    }
    return p.n_out >= 16384 || (role == kRowExpert && p.cols <= 2048) ? RowCfg{4, 1, 1} : RowCfg{2, 1, 1};
}

template <int WK, bool GLU>
inline cudaError_t launch_row(const Args &p, RowRole role, cudaStream_t st, bool pdl, int ny = 1) {
    const RowCfg c = row_cfg(WK, p, role, GLU);
    if (WK == kBf16) {
        if constexpr (!GLU)
            if (c.ks == 8) return launch_cfg<WK, 1, 2, 8, GLU>(p, st, pdl, ny);
        if (c.ks == 1) return launch_cfg<WK, 2, 2, 1, GLU>(p, st, pdl, ny);
        return c.ks == 4 ? launch_cfg<WK, 1, 2, 4, GLU>(p, st, pdl, ny) : launch_cfg<WK, 2, 2, 2, GLU>(p, st, pdl, ny);
    }
    return c.rpw == 4 ? launch_cfg<WK, 4, 1, 1, GLU>(p, st, pdl, ny) : launch_cfg<WK, 2, 1, 1, GLU>(p, st, pdl, ny);
}

// The fold (the header; Args.fold_*): one row of a dense bf16 matrix
// through gemv_row, on either side of it.
inline bool fold_reads(int WK, const Args &p, RowRole role) {
    return WK == kBf16 && role == kRowDense && row_reads(WK, p) && row_kernel_for(WK, p.n_out);
}

// The blocks (sums of squares) that launch_decode of p with fold_out set
// leaves, 0 where it does not fold p (its rows in groups of one warp, or
// more sums than the product after can load).
inline int fold_blocks(int WK, const Args &p, RowRole role) {
    if (!fold_reads(WK, p, role)) return 0;
    const RowCfg c = row_cfg(WK, p, role, false);
    if (c.ks < 2) return 0;
    const int per_block = 8 / c.ks * c.rpw, n = (p.n_out + per_block - 1) / per_block;
    return n <= kFoldMax ? n : 0;
}

// Whether launch_decode (glu: launch_glu) of one row takes p as the product
// after a fold (fold_ss set, n_ss of them, fold_out null).
inline bool folded_takes(int WK, const Args &p, RowRole role, bool glu) {
    if (!fold_reads(WK, p, role) || p.n_ss < 1 || p.n_ss > kFoldMax) return false;
    return glu || row_cfg(WK, p, role, false).ks > 1;
}

// k experts chosen on the device (p.etab, p.sel, p.per_x; their scales
// p.stab, or p.scale null; E4M3 block ratios p.ctab), each row through
// launch_row's configuration for its shape and role: each output row the
// same sums as launch_row (GLU: launch_glu) of that one row, which
// launch_decode takes where row_kernel_for (cuda_gemv_fp8 also for its
// experts' smaller matrices). Requires row_reads of the first expert (all
// alike).
template <int WK, bool GLU>
inline cudaError_t launch_experts(const Args &p, RowRole role, int k, cudaStream_t st, bool pdl) {
    return launch_row<WK, GLU>(p, role, st, pdl, k);
}

// One row of E4M3 tiles (Args.tl) goes to gemv_tile.cuh where tile_kernel_for.
template <int WK> inline cudaError_t launch_decode(const Args &p, int rows, RowRole role, cudaStream_t st, bool pdl) {
    if (rows == 1 && WK == kFp8 && tsr_tile::tile_kernel_for(p)) return tsr_tile::launch<false>(p, st, pdl);
    if (rows == 1 && row_reads(WK, p) && row_kernel_for(WK, p.n_out)) return launch_row<WK, false>(p, role, st, pdl);
    return tsr_mma::launch<WK>(p, rows, st, pdl);
}

// Whether launch_glu takes a one-row pass over this gate/up pair (p.n_out
// = 2f rows): where launch_decode's one row goes to gemv_row (gemv_mma's
// sums differ in rounding), or in pair tiles to gemv_tile.
template <int WK> inline bool glu_reads(const Args &p) {
    if (p.n_out < 2 || p.n_out % 2) return false;
    if (p.tl) return WK == kFp8 && p.tl == 2 && tsr_tile::tile_reads(p);
    return row_reads(WK, p) && row_kernel_for(WK, p.n_out);
}

// One row of a gate/up pair: y[f] = silu(gate) * up, through launch_decode's
// kernel and configuration for the 2f rows. Requires glu_reads.
template <int WK> inline cudaError_t launch_glu(const Args &p, RowRole role, cudaStream_t st, bool pdl) {
    if (p.tl) return tsr_tile::launch<true>(p, st, pdl);
    return launch_row<WK, true>(p, role, st, pdl);
}

// Whether launch_decode takes one row of a matrix (not a gate/up pair) with
// these fusions (tsr_gemv_i.run_fused): the residual add (Args.accum) through either kernel; the
// norm (Args.nw) only where it made the one-row pass shorter, E4M3 rows
// through gemv_row below 16,384 rows (q/k/v) without block ratios.
// Measured on the H200 at the Llama-3-8B shape (one-row passes, two rounds,
// none / the adds / the adds and the norm into q/k/v / ... into gate/up /
// ... into the LM head; BENCHMARKS.md, twenty-third session): bf16 4.060-
// 4.069, 4.022, 4.089-4.100, 4.883-4.888, 4.143-4.152 ms; E4M3 2.584-2.597,
// 2.578-2.579, 2.550-2.555, 2.665-2.671, 2.570-2.576. Multiplying each
// activation by its norm weight doubles the activations' loads, which
// bound the one-row kernel where a warp holds one or two bf16 rows. With
// the activations staged (E4M3, XS: the norm once a block) a gate/up pair
// takes the norm through launch_glu (cuda_gemv_fp8's run_fused), the LM head
// still not (2026-12-02, two rounds, cuda-fast-fp8: 2.530 / 2.541 ms staged
// without either, 2.510 / 2.508 with the pair's, 2.540 / 2.556 with the
// head's).
// One row of tiles takes the norm where it goes to gemv_tile (the same
// staged norm, under the same 16,384-row limit).
template <int WK> inline bool fused_takes(const Args &p) {
    if (!p.nw) return true;
    if (WK != kFp8 || p.cm || p.n_out >= 16384) return false;
    return p.tl ? tsr_tile::tile_reads(p) && tsr_tile::tile_kernel_for(p)
                : row_reads(WK, p) && row_kernel_for(WK, p.n_out);
}

// Whether launch_glu takes one row of a gate/up pair (p.n_out = 2f rows)
// with its input norm (Args.nw; no add): E4M3 whose activations it stages.
template <int WK> inline bool glu_fused_takes(const Args &p) {
    return WK == kFp8 && p.nw && !p.accum && stages_x(WK, p) && glu_reads<WK>(p);
}


} // namespace tsr_row

#endif // TSR_GEMV_ROW_CUH
