// Core kernels on the device: one thread block per row where a row needs a
// reduction, grid-stride loops elsewhere. f32 arithmetic throughout.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include <utility>

#include "cuda_ops.h"
#include "pdl.cuh"
#include "silu.cuh"

namespace {

constexpr int kThreads = 256;

__device__ float block_sum(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    const int n_warps = (blockDim.x + 31) >> 5;
    v = threadIdx.x < n_warps ? part[threadIdx.x] : 0.0f;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __shared__ float total;
    if (threadIdx.x == 0) total = v;
    __syncthreads();
    float t = total;
    __syncthreads();
    return t;
}

__global__ void embed_k(float *x, const void *table, uint32_t dtype, int hidden, int n_ids, const int32_t *ids) {
    tsr_pdl::enter();
    const int r = blockIdx.x;
    const int64_t row = ids[r] >= 0 && ids[r] < n_ids ? ids[r] : 0;
    float *out = x + (int64_t)r * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v;
        if (dtype == 0) v = ((const float *)table)[row * hidden + i];
        else if (dtype == 1) v = __half2float(((const __half *)table)[row * hidden + i]);
        else v = __bfloat162float(((const __nv_bfloat16 *)table)[row * hidden + i]);
        out[i] = v;
    }
}

// Values per thread held in registers by the norms (rows up to 8 x 1024).
constexpr int kNormRegs = 8;

// The norm weights of a thread's values i = threadIdx.x + j * blockDim.x,
// loaded before the programmatic-dependent wait (no earlier kernel writes
// them), so that their trip to memory overlaps the kernel before instead of
// following the sum of squares (with the angles of rope_k below: a one-row
// pass of the Llama-3-8B shape 4.280 -> 4.180 ms bf16, 3.100 -> 2.983 ms
// E4M3 on the H200, BENCHMARKS.md). false when a thread would hold more
// than kNormRegs: the loops below then read them after.
__device__ __forceinline__ bool norm_weights(const float *w, int n, float *wv) {
    const int per = (n + (int)blockDim.x - 1) / (int)blockDim.x;
    if (per > kNormRegs) return false;
#pragma unroll
    for (int j = 0; j < kNormRegs; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        wv[j] = j < per && i < n ? w[i] : 0.0f;
    }
    return true;
}

// yr = rmsnorm(v) * w over one row of n with v = xr (yr may be xr) or, with
// ADD, v = xr + orow stored back into xr; called by every thread of the
// block, wv and regs from norm_weights.
template <bool ADD>
__device__ __forceinline__ void norm_row(float *xr, const float *orow, float *yr, const float *w, const float *wv,
                                         bool regs, int n, float eps) {
    float ss = 0.0f;
    if (regs) {
        float v[kNormRegs];
#pragma unroll
        for (int j = 0; j < kNormRegs; j++) {
            const int i = threadIdx.x + j * blockDim.x;
            v[j] = 0.0f;
            if (i < n) {
                v[j] = ADD ? xr[i] + orow[i] : xr[i];
                if (ADD) xr[i] = v[j];
            }
            ss += v[j] * v[j];
        }
        ss = block_sum(ss);
        const float inv = rsqrtf(ss / (float)n + eps);
#pragma unroll
        for (int j = 0; j < kNormRegs; j++) {
            const int i = threadIdx.x + j * blockDim.x;
            if (i < n) yr[i] = v[j] * inv * wv[j];
        }
        return;
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = ADD ? xr[i] + orow[i] : xr[i];
        if (ADD) xr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss);
    const float inv = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

// y[r] = rmsnorm(v) * w with v = x[r] (rmsnorm; y may be x) or, with ADD,
// v = x[r] + o[r] stored back into x[r] (the residual add fused with the next
// norm: the same arithmetic as add then rmsnorm).
template <bool ADD>
__global__ void norm_k(float *x, const float *o, float *y, const float *w, int n, float eps) {
    float wv[kNormRegs];
    const bool regs = norm_weights(w, n, wv);
    tsr_pdl::enter();
    const int64_t r = blockIdx.x;
    norm_row<ADD>(x + r * n, ADD ? o + r * n : nullptr, y + r * n, w, wv, regs, n, eps);
}

// The sine and cosine of pair i's angle at the (scaled) position p.
__device__ __forceinline__ void angle(int i, float p, const float *inv_freq, float *s, float *c) {
    sincosf(p * inv_freq[i], s, c);
}

// Pair i of a head of half * 2 dims rotated by the angle of (s, c): dims
// (i, i + half), or (2i, 2i + 1) when interleaved; out may be in.
__device__ __forceinline__ void rotate_sc(const float *in, float *out, int i, int half, float s, float c,
                                          int interleaved) {
    const int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
    const float x0 = in[i0], x1 = in[i1];
    out[i0] = x0 * c - x1 * s;
    out[i1] = x1 * c + x0 * s;
}

// Pair i rotated to position p.
__device__ __forceinline__ void rotate_pair(const float *in, float *out, int i, int half, float p,
                                            const float *inv_freq, int interleaved) {
    float s, c;
    angle(i, p, inv_freq, &s, &c);
    rotate_sc(in, out, i, half, s, c, interleaved);
}

// The position and the angle of the thread's first pair depend on no
// earlier kernel (pos0 on the device is written before the pass starts):
// computed before the wait, as the norms load their weights.
__global__ void rope_k(float *x, const float *inv_freq, int n_heads, int head_dim, int pos0,
                       const int32_t *dev_pos0, float pos_scale, int interleaved) {
    const int r = blockIdx.y, half = head_dim / 2;
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (dev_pos0) pos0 = *dev_pos0;
    const float p = (float)(pos0 + r) * pos_scale;
    float s0 = 0.0f, c0 = 0.0f;
    if (j < n_heads * half) angle(j % half, p, inv_freq, &s0, &c0);
    tsr_pdl::enter();
    float *row = x + (int64_t)r * n_heads * head_dim;
    for (bool first = true; j < n_heads * half; j += gridDim.x * blockDim.x, first = false) {
        const int h = j / half;
        if (first) rotate_sc(row + h * head_dim, row + h * head_dim, j % half, half, s0, c0, interleaved);
        else rotate_pair(row + h * head_dim, row + h * head_dim, j % half, half, p, inv_freq, interleaved);
    }
}

// q/k/v out of their stacked projection (rows of src: nh query heads, nkv
// key heads, nkv value heads of hd), q and k rotated on the way (as rope_k,
// the first angle before the wait), v copied: split3 and two rope launches
// in one. grid (column blocks, rows).
__global__ void rope_split_k(float *q, float *k, float *v, const float *src, const float *inv_freq, int nh, int nkv,
                             int hd, int pos0, const int32_t *dev_pos0, float pos_scale, int interleaved) {
    const int r = blockIdx.y, half = hd / 2, pairs = (nh + nkv) * half, vd = nkv * hd;
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (dev_pos0) pos0 = *dev_pos0;
    const float p = (float)(pos0 + r) * pos_scale;
    float s0 = 0.0f, c0 = 0.0f;
    if (j < pairs) angle(j % half, p, inv_freq, &s0, &c0);
    tsr_pdl::enter();
    const float *in = src + (int64_t)r * (nh + 2 * nkv) * hd;
    for (bool first = true; j < pairs + vd; j += gridDim.x * blockDim.x, first = false) {
        if (j >= pairs) {
            v[(int64_t)r * vd + j - pairs] = in[(nh + nkv) * hd + j - pairs];
            continue;
        }
        const int h = j / half;
        float *o = h < nh ? q + ((int64_t)r * nh + h) * hd : k + ((int64_t)r * nkv + h - nh) * hd;
        if (first) rotate_sc(in + h * hd, o, j % half, half, s0, c0, interleaved);
        else rotate_pair(in + h * hd, o, j % half, half, p, inv_freq, interleaved);
    }
}

// Qwen3's q/k norms and RoPE in one launch: a block per (row, head) of q
// [rows, nh, hd] then k [rows, nkv, hd], each head normed as norm_k norms a
// row of hd (the same sums: launched with norm_threads(hd) threads) times
// the q or k norm's weights into shared memory, then its pairs rotated as
// rope_k rotates them: the same values as the two norm launches and the
// rope launch(es) it replaces. Weights and position before the wait.
__global__ void qk_norm_rope_k(float *q, float *k, const float *qw, const float *kw, int nh, int nkv, int hd,
                               float eps, const float *inv_freq, int pos0, const int32_t *dev_pos0, float pos_scale,
                               int interleaved) {
    extern __shared__ float normed[]; // [hd]
    const int heads = nh + nkv, r = blockIdx.x / heads, hh = blockIdx.x % heads, half = hd / 2;
    const float *w = hh < nh ? qw : kw;
    float wv[kNormRegs];
    const bool regs = norm_weights(w, hd, wv);
    if (dev_pos0) pos0 = *dev_pos0;
    const float p = (float)(pos0 + r) * pos_scale;
    tsr_pdl::enter();
    float *x = hh < nh ? q + ((int64_t)r * nh + hh) * hd : k + ((int64_t)r * nkv + hh - nh) * hd;
    norm_row<false>(x, nullptr, normed, w, wv, regs, hd, eps);
    __syncthreads();
    for (int i = threadIdx.x; i < half; i += blockDim.x) rotate_pair(normed, x, i, half, p, inv_freq, interleaved);
}

// y[r, i] = silu(gu[r, i]) * gu[r, f + i]: gate and up side by side; grid
// (column blocks, rows).
__global__ void silu_mul_cat_k(float *y, const float *gu, int f) {
    tsr_pdl::enter();
    const float *g = gu + (int64_t)blockIdx.y * 2 * f;
    float *out = y + (int64_t)blockIdx.y * f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < f; i += gridDim.x * blockDim.x) {
        out[i] = tsr_silu_mul(g[i], g[f + i]);
    }
}

__global__ void split3_k(float *da, float *db, float *dc, const float *src, int a, int b, int c) {
    tsr_pdl::enter();
    const int64_t r = blockIdx.y;
    const float *in = src + r * (a + b + c);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < a + b + c; i += gridDim.x * blockDim.x) {
        const float v = in[i];
        if (i < a) da[r * a + i] = v;
        else if (i < a + b) db[r * b + i - a] = v;
        else dc[r * c + i - a - b] = v;
    }
}

// Per row the highest value, ties to the lowest index, NaN never chosen; -1
// when no value is a number above -inf.
__global__ void argmax_k(const float *x, int n, int32_t *out) {
    tsr_pdl::enter();
    const float *row = x + (int64_t)blockIdx.x * n;
    float best = -INFINITY;
    int idx = -1;
    // each thread sees its values in increasing index, so its first largest
    // stays (NaN and -inf never compare greater); rows of whole 16-byte
    // pieces four pieces a step, loaded before they are compared: one
    // Qwen3 vocabulary row (151,936) took 36 us with a load at a time
    auto see = [&](float v, int i) {
        if (v > best) best = v, idx = i;
    };
    const int bd = (int)blockDim.x;
    if (n % 4 == 0 && (reinterpret_cast<uintptr_t>(row) & 15) == 0) {
        const float4 *r4 = reinterpret_cast<const float4 *>(row);
        const int n4 = n / 4;
        int i = threadIdx.x;
        for (; i + 3 * bd < n4; i += 4 * bd) {
            float4 a[4];
#pragma unroll
            for (int u = 0; u < 4; u++) a[u] = r4[i + u * bd];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int b = 4 * (i + u * bd);
                see(a[u].x, b), see(a[u].y, b + 1), see(a[u].z, b + 2), see(a[u].w, b + 3);
            }
        }
        for (; i < n4; i += bd) {
            const float4 a = r4[i];
            see(a.x, 4 * i), see(a.y, 4 * i + 1), see(a.z, 4 * i + 2), see(a.w, 4 * i + 3);
        }
    } else {
        for (int i = threadIdx.x; i < n; i += bd) see(row[i], i);
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float b = __shfl_xor_sync(0xffffffffu, best, o);
        const int j = __shfl_xor_sync(0xffffffffu, idx, o);
        if (j >= 0 && (idx < 0 || b > best || (b == best && j < idx))) best = b, idx = j;
    }
    __shared__ float sb[32];
    __shared__ int si[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    if (lane == 0) sb[warp] = best, si[warp] = idx;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < nw; w++)
            if (si[w] >= 0 && (idx < 0 || sb[w] > best || (sb[w] == best && si[w] < idx)))
                best = sb[w], idx = si[w];
        out[blockIdx.x] = idx;
    }
}

// Rows of f32 keys and values rounded into bf16 KV at token pos0 + r
// (pos0 read on the device when dev_pos0 is given); te elements per token.
__global__ void kv_store_bf16_k(__nv_bfloat16 *K, __nv_bfloat16 *V, const float *k, const float *v,
                                int64_t te, int pos0, const int32_t *dev_pos0) {
    tsr_pdl::enter();
    if (dev_pos0) pos0 = *dev_pos0;
    const int64_t r = blockIdx.y, base = ((int64_t)pos0 + r) * te;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < te;
         i += (int64_t)gridDim.x * blockDim.x) {
        K[base + i] = __float2bfloat16_rn(k[r * te + i]);
        V[base + i] = __float2bfloat16_rn(v[r * te + i]);
    }
}

__global__ void silu_mul_k(float *y, const float *g, const float *u, int64_t n) {
    tsr_pdl::enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        y[i] = tsr_silu_mul(g[i], u[i]);
    }
}

__global__ void add_k(float *y, const float *x, int64_t n) {
    tsr_pdl::enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

__global__ void add_rows_k(float *y, const float *b, int n) {
    tsr_pdl::enter();
    float *row = y + (int64_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) row[i] += b[i];
}

__global__ void f32_to_bf16_k(__nv_bfloat16 *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void f32_to_bf16_pad_k(__nv_bfloat16 *dst, const float *src, int cols, int ld) {
    const float *in = src + (int64_t)blockIdx.x * cols;
    __nv_bfloat16 *out = dst + (int64_t)blockIdx.x * ld;
    for (int c = threadIdx.x; c < ld; c += blockDim.x)
        out[c] = c < cols ? __float2bfloat16_rn(in[c]) : __float2bfloat16_rn(0.0f);
}

// Mixture-of-experts routing, a warp per row of n_experts (<= 32 VPL)
// router logits: softmax in place, then k (<= 64) rounds of the largest
// number not chosen yet (ties to the lower id, NaN never; -1 once none is
// left), as kernels/cpu/ops.c tsr_softmax and tsr_topk choose. Lane l holds
// experts l + 32 t in registers (the softmax's arithmetic in the order the
// CPU's takes, bit for bit the one-number-at-a-time kernel before it) and
// its best candidate as a key that orders as the numbers do; a round is two
// warp reductions (the largest key, then the lowest id holding it), and only
// the lane whose candidate was taken looks for its next. Round j's choice is
// kept by lane j % 32 and written at the end, divided by the total where
// norm asks. (Reading the row from memory each round, a warp argmax of five
// shuffle steps a round: 6.2 us of a Qwen3-MoE decode layer's ~80 on the
// H200 with 64 experts.)
__device__ __forceinline__ uint32_t order_key(float v) { // increasing with v (-0 below +0); 0: a NaN only
    const uint32_t b = __float_as_uint(v);
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ float key_value(uint32_t key) {
    return __uint_as_float(key & 0x80000000u ? key & 0x7fffffffu : ~key);
}

template <int VPL>
__global__ void route_k(float *p, int n_experts, int k, int norm, int32_t *idx, float *w) {
    tsr_pdl::enter();
    float *row = p + (int64_t)blockIdx.x * n_experts;
    const int lane = threadIdx.x;
    float v[VPL];
#pragma unroll
    for (int t = 0; t < VPL; t++) v[t] = lane + 32 * t < n_experts ? row[lane + 32 * t] : 0.0f;
    float mx = -INFINITY;
#pragma unroll
    for (int t = 0; t < VPL; t++)
        if (lane + 32 * t < n_experts && v[t] > mx) mx = v[t];
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
#pragma unroll
    for (int t = 0; t < VPL; t++)
        if (lane + 32 * t < n_experts) sum += (v[t] = expf(v[t] - mx));
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    uint32_t avail = 0; // bit t: expert lane + 32 t not chosen yet (and not NaN)
#pragma unroll
    for (int t = 0; t < VPL; t++)
        if (lane + 32 * t < n_experts) {
            row[lane + 32 * t] = v[t] /= sum;
            if (!isnan(v[t])) avail |= 1u << t;
        }
    int bt = 0;                        // the lane's candidate: expert lane + 32 bt
    auto next = [&]() -> uint32_t { // the lane's best key among avail (lowest t of equals), 0: none
        uint32_t key = 0;
#pragma unroll
        for (int t = 0; t < VPL; t++) {
            const uint32_t kt = order_key(v[t]);
            if ((avail >> t & 1u) && kt > key) key = kt, bt = t;
        }
        return key;
    };
    uint32_t key = next();
    int32_t i0 = -1, i1 = -1; // rounds lane and lane + 32
    float v0 = 0.0f, v1 = 0.0f, total = 0.0f;
    for (int j = 0; j < k; j++) {
        const uint32_t best = __reduce_max_sync(0xffffffffu, key);
        int bi = -1;
        float bv = 0.0f;
        if (best != 0) {
            bi = (int)__reduce_min_sync(0xffffffffu, key == best ? (uint32_t)(lane + 32 * bt) : 0xffffffffu);
            bv = key_value(best);
            if (bi == lane + 32 * bt) {
                avail &= ~(1u << bt);
                key = next();
            }
        }
        total += bv;
        if ((j & 31) == lane) {
            if (j < 32) i0 = bi, v0 = bv;
            else i1 = bi, v1 = bv;
        }
    }
    const bool scale = norm && total > 0.0f;
    int32_t *ir = idx + (int64_t)blockIdx.x * k;
    float *wr = w + (int64_t)blockIdx.x * k;
    if (lane < k) ir[lane] = i0, wr[lane] = scale ? v0 / total : v0;
    if (lane + 32 < k) ir[lane + 32] = i1, wr[lane + 32] = scale ? v1 / total : v1;
}

// dst[j] = src[rows[j]], a block per row of cols
__global__ void gather_rows_k(float *dst, const float *src, const int32_t *rows, int cols) {
    tsr_pdl::enter();
    const float *in = src + (int64_t)rows[blockIdx.x] * cols;
    float *out = dst + (int64_t)blockIdx.x * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) out[i] = in[i];
}

// y[rows[j]] += w[j] * src[j], a block per j (the rows are distinct)
__global__ void scatter_axpy_k(float *y, const float *src, const int32_t *rows, const float *w, int cols) {
    tsr_pdl::enter();
    const float a = w[blockIdx.x];
    const float *in = src + (int64_t)blockIdx.x * cols;
    float *out = y + (int64_t)rows[blockIdx.x] * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) out[i] = fmaf(a, in[i], out[i]);
}

// y[r] = sum of w[r, j] * d[row (r, j)] over the row's chosen experts j in
// increasing expert id (idx[r, j] < 0: none), grid (column blocks, rows):
// each element the fmaf chain that zeroing then scatter_axpy_k expert by
// expert gives; with add, y[r] += that sum (one rounding more, as add_k's).
// Row (r, j) of d: pos[r k + j] (rows sorted by expert, as the grouped
// experts write them), or r k + j where pos is null. (A block a row took
// 10 us of a Qwen3-MoE decode layer's ~80 at 2,048 columns; one thread
// sorting the choices from memory, then one load a step, ~5 us.)
__global__ void combine_experts_k(float *y, const float *d, const int32_t *idx, const float *w, int k, int cols,
                                  int add, const int32_t *pos) {
    tsr_pdl::enter();
    __shared__ int32_t ids[64];
    __shared__ const float *rows[64]; // each chosen expert's row of d, in increasing id
    __shared__ float wt[64];          // and its weight
    __shared__ int n;
    const int r = blockIdx.y;
    if (threadIdx.x < 32) { // warp 0 places the row's k (<= 64) choices: lane l takes l and l + 32
        const int lane = threadIdx.x;
        int32_t id[2];
        float wj[2];
        int64_t at[2];
#pragma unroll
        for (int h = 0; h < 2; h++) { // every load at once
            const int j = lane + 32 * h;
            const int64_t rj = (int64_t)r * k + j;
            id[h] = j < k ? idx[rj] : -1;
            wj[h] = j < k ? w[rj] : 0.0f;
            at[h] = j < k ? (pos ? (int64_t)pos[rj] : rj) : 0;
            if (j < k) ids[j] = id[h];
        }
        __syncwarp();
#pragma unroll
        for (int h = 0; h < 2; h++) { // place: the chosen before it in id, equal ids in j (insertion sort's order)
            const int j = lane + 32 * h;
            if (j >= k || id[h] < 0) continue;
            int place = 0;
            for (int i = 0; i < k; i++) place += ids[i] >= 0 && (ids[i] < id[h] || (ids[i] == id[h] && i < j));
            rows[place] = d + at[h] * cols;
            wt[place] = wj[h];
        }
        const int chosen =
            __popc(__ballot_sync(0xffffffffu, id[0] >= 0)) + __popc(__ballot_sync(0xffffffffu, id[1] >= 0));
        if (lane == 0) n = chosen;
    }
    __syncthreads();
    float *out = y + (int64_t)r * cols;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < cols; i += gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int t0 = 0; t0 < n; t0 += 8) { // eight loads in flight, then their chain in order
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = t0 + u < n ? rows[t0 + u][i] : 0.0f;
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (t0 + u < n) acc = fmaf(wt[t0 + u], v[u], acc);
        }
        out[i] = add ? out[i] + acc : acc;
    }
}

// y[r] += sigmoid(gate[r]) * src[r], a block per row
__global__ void add_gated_k(float *y, const float *src, const float *gate, int cols) {
    tsr_pdl::enter();
    const float a = 1.0f / (1.0f + expf(-gate[blockIdx.x]));
    const int64_t base = (int64_t)blockIdx.x * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) y[base + i] = fmaf(a, src[base + i], y[base + i]);
}

__global__ void zero_k(float *y, int64_t n) {
    tsr_pdl::enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = 0.0f;
}

int grid_for(int64_t n) {
    int64_t b = (n + kThreads - 1) / kThreads;
    return (int)(b > 65535 ? 65535 : b < 1 ? 1 : b);
}

int launched() { return cudaGetLastError() == cudaSuccess ? 0 : -10; }

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic
// dependent when pdl; 0 or -10 (the launch's error left as the last error
// for the caller's message).
template <typename... KArgs, typename... Args>
int launch_smem(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, void *stream, int pdl,
                Args &&...args) {
    const cudaError_t e = tsr_pdl::launch(kernel, grid, block, smem, static_cast<cudaStream_t>(stream), pdl != 0,
                                          std::forward<Args>(args)...);
    return e == cudaSuccess ? launched() : -10;
}

// launch_smem without dynamic shared memory.
template <typename... KArgs, typename... Args>
int launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, void *stream, int pdl, Args &&...args) {
    return launch_smem(kernel, grid, block, 0, stream, pdl, std::forward<Args>(args)...);
}

} // namespace

#define STREAM(s) ((cudaStream_t)(s))

extern "C" int tsr_cu_embed(float *x, const void *table, uint32_t dtype, int hidden, int n_ids,
                            const int32_t *ids, int rows, int pdl, void *stream) {
    if (dtype > 2) return -5;
    return launch(embed_k, rows, kThreads, stream, pdl, x, table, dtype, hidden, n_ids, ids);
}

/* a thread per 4 values up to 1024 threads: one wave of loads for a 4096-wide row */
static int norm_threads(int n) {
    int threads = (n / 4 + 31) / 32 * 32;
    return threads < 64 ? 64 : threads > 1024 ? 1024 : threads;
}

extern "C" int tsr_cu_rmsnorm(float *y, const float *x, const float *w, int rows, int n, float eps,
                              int pdl, void *stream) {
    return launch(norm_k<false>, rows, norm_threads(n), stream, pdl, const_cast<float *>(x),
                  static_cast<const float *>(nullptr), y, w, n, eps);
}

extern "C" int tsr_cu_add_rmsnorm(float *x, const float *o, float *y, const float *w, int rows, int n, float eps,
                                  int pdl, void *stream) {
    return launch(norm_k<true>, rows, norm_threads(n), stream, pdl, x, o, y, w, n, eps);
}

extern "C" int tsr_cu_rope(float *x, const float *inv_freq, int rows, int n_heads, int head_dim,
                           int pos0, const int32_t *dev_pos0, float pos_scale, int interleaved,
                           int pdl, void *stream) {
    dim3 grid((unsigned)((n_heads * (head_dim / 2) + kThreads - 1) / kThreads), (unsigned)rows);
    return launch(rope_k, grid, kThreads, stream, pdl, x, inv_freq, n_heads, head_dim, pos0, dev_pos0, pos_scale,
                  interleaved);
}

extern "C" int tsr_cu_qk_norm_rope(float *q, float *k, const float *q_norm, const float *k_norm, int rows,
                                   int n_heads, int n_kv, int head_dim, float eps, const float *inv_freq, int pos0,
                                   const int32_t *dev_pos0, float pos_scale, int interleaved, int pdl, void *stream) {
    return launch_smem(qk_norm_rope_k, (unsigned)(rows * (n_heads + n_kv)), norm_threads(head_dim),
                       (size_t)head_dim * sizeof(float), stream, pdl, q, k, q_norm, k_norm, n_heads, n_kv, head_dim,
                       eps, inv_freq, pos0, dev_pos0, pos_scale, interleaved);
}

extern "C" int tsr_cu_rope_split(float *q, float *k, float *v, const float *src, const float *inv_freq, int rows,
                                 int n_heads, int n_kv, int head_dim, int pos0, const int32_t *dev_pos0,
                                 float pos_scale, int interleaved, int pdl, void *stream) {
    const int n = (n_heads + n_kv) * (head_dim / 2) + n_kv * head_dim;
    dim3 grid((unsigned)((n + kThreads - 1) / kThreads), (unsigned)rows);
    return launch(rope_split_k, grid, kThreads, stream, pdl, q, k, v, src, inv_freq, n_heads, n_kv, head_dim, pos0,
                  dev_pos0, pos_scale, interleaved);
}

extern "C" int tsr_cu_silu_mul(float *y, const float *g, const float *u, int64_t n, int pdl, void *stream) {
    return launch(silu_mul_k, grid_for(n), kThreads, stream, pdl, y, g, u, n);
}

extern "C" int tsr_cu_add(float *y, const float *x, int64_t n, int pdl, void *stream) {
    return launch(add_k, grid_for(n), kThreads, stream, pdl, y, x, n);
}

extern "C" int tsr_cu_add_rows(float *y, const float *b, int rows, int n, int pdl, void *stream) {
    return launch(add_rows_k, rows, kThreads, stream, pdl, y, b, n);
}

extern "C" int tsr_cu_f32_to_bf16(uint16_t *dst, const float *src, int64_t n, void *stream) {
    f32_to_bf16_k<<<grid_for(n), kThreads, 0, STREAM(stream)>>>((__nv_bfloat16 *)dst, src, n);
    return launched();
}

extern "C" int tsr_cu_f32_to_bf16_pad(uint16_t *dst, const float *src, int rows, int cols, int ld,
                                      void *stream) {
    f32_to_bf16_pad_k<<<rows, kThreads, 0, STREAM(stream)>>>((__nv_bfloat16 *)dst, src, cols, ld);
    return launched();
}

extern "C" int tsr_cu_silu_mul_cat(float *y, const float *gu, int rows, int f, int pdl, void *stream) {
    dim3 grid((unsigned)((f + kThreads - 1) / kThreads), (unsigned)rows);
    return launch(silu_mul_cat_k, grid, kThreads, stream, pdl, y, gu, f);
}

extern "C" int tsr_cu_split3(float *da, float *db, float *dc, const float *src, int rows, int a, int b, int c,
                             int pdl, void *stream) {
    dim3 grid((unsigned)((a + b + c + kThreads - 1) / kThreads), (unsigned)rows);
    return launch(split3_k, grid, kThreads, stream, pdl, da, db, dc, src, a, b, c);
}

extern "C" int tsr_cu_argmax_rows(const float *x, int rows, int n, int32_t *out, int pdl, void *stream) {
    return launch(argmax_k, rows, 1024, stream, pdl, x, n, out);
}

extern "C" int tsr_cu_kv_store_bf16(uint16_t *K, uint16_t *V, const float *k, const float *v, int rows,
                                    int64_t te, int pos0, const int32_t *dev_pos0, int pdl, void *stream) {
    dim3 grid((unsigned)((te + kThreads - 1) / kThreads), (unsigned)rows);
    return launch(kv_store_bf16_k, grid, kThreads, stream, pdl, (__nv_bfloat16 *)K, (__nv_bfloat16 *)V, k, v, te,
                  pos0, dev_pos0);
}

extern "C" int tsr_cu_route(float *p, int rows, int n_experts, int k, int norm, int32_t *idx, float *w, int pdl,
                            void *stream) {
    if (n_experts < 1 || n_experts > 1024 || k < 1 || k > n_experts || k > 64) return -5;
    auto *kernel = n_experts <= 64 ? route_k<2> : n_experts <= 128 ? route_k<4> : n_experts <= 256 ? route_k<8>
                                                                                                 : route_k<32>;
    return launch(kernel, rows, 32, stream, pdl, p, n_experts, k, norm, idx, w);
}

extern "C" int tsr_cu_gather_rows(float *dst, const float *src, const int32_t *rows, int n, int cols, int pdl,
                                  void *stream) {
    if (n <= 0) return 0;
    return launch(gather_rows_k, n, kThreads, stream, pdl, dst, src, rows, cols);
}

extern "C" int tsr_cu_scatter_axpy(float *y, const float *src, const int32_t *rows, const float *w, int n, int cols,
                                   int pdl, void *stream) {
    if (n <= 0) return 0;
    return launch(scatter_axpy_k, n, kThreads, stream, pdl, y, src, rows, w, cols);
}

extern "C" int tsr_cu_add_gated(float *y, const float *src, const float *gate, int rows, int cols, int pdl,
                                void *stream) {
    return launch(add_gated_k, rows, kThreads, stream, pdl, y, src, gate, cols);
}

extern "C" int tsr_cu_zero(float *y, int64_t n, int pdl, void *stream) {
    return launch(zero_k, grid_for(n), kThreads, stream, pdl, y, n);
}

extern "C" int tsr_cu_combine_experts(float *y, const float *d, const int32_t *idx, const float *w, int rows, int k,
                                      int cols, int add, const int32_t *pos, int pdl, void *stream) {
    if (k < 1 || k > 64) return -5;
    const dim3 grid((unsigned)((cols + kThreads - 1) / kThreads), (unsigned)rows);
    return launch(combine_experts_k, grid, kThreads, stream, pdl, y, d, idx, w, k, cols, add, pos);
}
