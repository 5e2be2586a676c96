// Sampling on the device (sample_cuda.h): five kernels draw one token, step
// by step as sampler.c does (the passes over the whole vocabulary on many
// blocks, the rules on the candidate set in one). Rounding is explicit
// (__fdiv_rn, __dmul_rn, ...) so that nothing is contracted into an FMA that
// the CPU does not do. Keys are the penalised, temperature-divided logits
// (NaN marks a token that is not, or no longer, a candidate); weights are
// exp(key - max) rounded to float, 0 outside the kept set.
#include <cuda_runtime.h>
#include <float.h>
#include <limits.h>
#include <math.h>

#include "pdl.cuh"
#include "sample_cuda.h"

namespace {

constexpr int kT = 1024;                  // threads of the one block
constexpr double kSlack = 1e-6;           // sampler.c's TSR_SAMPLER_SLACK
constexpr double kFix = 1099511627776.0;  // 2^40: fixed-point unit of top-p's mass

typedef unsigned long long u64;

struct Shared {
    double d[kT];
    u64 u[kT];
    u64 hmass[256];
    unsigned int hcount[256];
    double hmd[256]; // pass 2's coarse masses (top-p alone)
    int i[32];
    int found, hit;
    u64 above;
};

// Bigger float, bigger code (for keys that are not NaN; -0 comes in as +0).
__device__ uint32_t ordered(float f) {
    const uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ u64 fixed(float w) { return __double2ull_rn(__dmul_rn((double)w, kFix)); }

// Sum over the block in a fixed order (a fixed tree): deterministic.
__device__ double block_sum(double v, Shared &sh) {
    for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sh.d[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = sh.d[lane];
        for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) sh.d[0] = v;
    }
    __syncthreads();
    const double total = sh.d[0];
    __syncthreads();
    return total;
}

__device__ int block_sum_int(int v, Shared &sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sh.i[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0;
        for (int w = 0; w < kT / 32; w++) s += sh.i[w];
        sh.i[0] = s;
    }
    __syncthreads();
    const int total = sh.i[0];
    __syncthreads();
    return total;
}

// Exclusive prefix over the threads in thread order (Hillis-Steele, a fixed
// order of additions, each rounded to nearest); *total gets the sum of all.
// buf: kT elements of shared memory (sh.u for counts, sh.d for masses).
template <typename T> __device__ T excl_scan(T v, T *buf, T *total) {
    const int t = threadIdx.x;
    buf[t] = v;
    __syncthreads();
    for (int off = 1; off < kT; off <<= 1) {
        const T add = t >= off ? buf[t - off] : T(0);
        __syncthreads();
        buf[t] += add;
        __syncthreads();
    }
    const T ex = t > 0 ? buf[t - 1] : T(0);
    *total = buf[kT - 1];
    __syncthreads();
    return ex;
}

// The first candidate in order (key descending, ties to the lowest id) at
// which the running sum of its values reaches target: 1 each when !mass
// (top-k: the target-th), else fixed(weight) (top-p). Radix selection on the
// key's 32 bits, 8 at a time: each pass sums the values of the candidates
// that share the bits found so far, per next digit, and walks the digits
// from the top; then the ties on the whole key are walked in id order.
// Writes the key's code and the id; false when the whole sum stays below
// target.
__device__ bool select_first(const float *__restrict__ key, const float *__restrict__ wt, int V, bool mass,
                             u64 target, uint32_t *tu, int *tid, Shared &sh) {
    const int t = threadIdx.x;
    uint32_t prefix = 0, mask = 0;
    u64 above = 0; // sum over candidates whose key is above the bits found so far
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = t; d < 256; d += kT) sh.hmass[d] = 0, sh.hcount[d] = 0;
        __syncthreads();
        // runs of one digit summed in the thread first: the first passes see
        // few digits, and one shared counter per element would serialise
        int cd = -1;
        unsigned int cc = 0;
        u64 cm = 0;
        for (int i = t; i < V; i += kT) {
            const float k = key[i];
            if (isnan(k)) continue;
            const uint32_t u = ordered(k);
            if ((u & mask) != prefix) continue;
            const int d = (int)((u >> shift) & 255u);
            if (d != cd) {
                if (cd >= 0) atomicAdd(&sh.hcount[cd], cc), atomicAdd(&sh.hmass[cd], cm);
                cd = d, cc = 0, cm = 0;
            }
            cc++;
            if (mass) cm += fixed(wt[i]);
        }
        if (cd >= 0) atomicAdd(&sh.hcount[cd], cc), atomicAdd(&sh.hmass[cd], cm);
        __syncthreads();
        if (t == 0) {
            int chosen = -1;
            for (int d = 255; d >= 0; d--) {
                if (!sh.hcount[d]) continue;
                const u64 v = mass ? sh.hmass[d] : (u64)sh.hcount[d];
                if (above + v >= target) {
                    chosen = d;
                    break;
                }
                above += v;
            }
            sh.found = chosen;
            sh.above = above;
        }
        __syncthreads();
        const int chosen = sh.found;
        above = sh.above;
        __syncthreads();
        if (chosen < 0) return false;
        prefix |= (uint32_t)chosen << shift;
        mask |= 0xffu << shift;
    }
    // ties on the whole key, in id order: thread t holds ids [lo, hi)
    const int chunk = (V + kT - 1) / kT, lo = t * chunk, hi = min(V, lo + chunk);
    u64 own = 0;
    for (int i = lo; i < hi; i++) {
        const float k = key[i];
        if (!isnan(k) && ordered(k) == prefix) own += mass ? fixed(wt[i]) : 1;
    }
    u64 total;
    const u64 ex = excl_scan(own, sh.u, &total);
    if (t == 0) sh.hit = INT_MAX;
    __syncthreads();
    if (above + ex + own >= target) {
        u64 cum = above + ex;
        for (int i = lo; i < hi; i++) {
            const float k = key[i];
            if (isnan(k) || ordered(k) != prefix) continue;
            cum += mass ? fixed(wt[i]) : 1;
            if (cum >= target) {
                atomicMin(&sh.hit, i);
                break;
            }
        }
    }
    __syncthreads();
    const int hit = sh.hit;
    __syncthreads();
    if (hit == INT_MAX) return false;
    *tu = prefix;
    *tid = hit;
    return true;
}

// Keep the candidates up to (tu, tid) in order; the rest are dropped.
// Returns this thread's share (its ids, strided) of the weights kept.
__device__ double keep_first(float *__restrict__ key, float *__restrict__ wt, int V, uint32_t tu, int tid) {
    double part = 0;
    for (int i = threadIdx.x; i < V; i += kT) {
        const float k = key[i];
        if (isnan(k)) continue;
        const uint32_t u = ordered(k);
        if (!(u > tu || (u == tu && i <= tid))) key[i] = NAN, wt[i] = 0.0f;
        else part = __dadd_rn(part, (double)wt[i]);
    }
    __syncthreads();
    return part;
}

__device__ bool weight_ok(float v) { return v > 0 && v <= FLT_MAX; }

// Top-p's target in fixed point: the first in order whose running mass
// reaches (p - slack) * z (sampler.c's need).
__device__ u64 top_p_target(float p, double z) {
    const double need = __dmul_rn(__dsub_rn((double)p, kSlack), z);
    return need <= 0 ? 0 : (u64)ceil(__dmul_rn(need, kFix));
}

// The coarse bucket of a candidate's key: 16 per unit below the maximum,
// 255 for everything 15.94 or more below. Monotone: a higher key never
// falls in a later bucket.
__device__ int coarse(float k, double mx) {
    const double d = __dmul_rn(__dsub_rn(mx, (double)k), 16.0);
    return d < 255.0 ? (int)d : 255;
}

// ---- the passes over the whole vocabulary, spread over many blocks ------
//
// One block walking 128K logits was bound by its own memory latency: each
// of its passes (penalties and temperature, the weights, the draw's two)
// took tens of microseconds, ~0.17 ms a token at Llama-3's vocabulary on
// the H200. The passes that touch every id now run on kW-thread blocks of
// kSpan consecutive ids each, leaving per-block results (maxima, sums,
// counts) in the scratch's tail, which the next kernel reads in block
// order: sums stay in a fixed order, so a draw is reproducible. Only the
// rules that work on the candidate set (top-k, top-p, min-p) stay in the
// one block (select_k), on the compacted list where there is one.

constexpr int kW = 256;       // threads of a wide block
constexpr int kPer = 8;       // ids a thread
constexpr int kSpan = kW * kPer;

// What select_k hands the draw: the set's arrays, its size and its sum.
struct Ctrl {
    int done;   // out[0] is written: the later kernels do nothing
    int listed; // the set is the compacted list (lkey, lwt, lid), else key, wt
    int n;      // its size
    double mx;  // the top key (0 in inf_mode)
    double zk;  // the sum the draw divides by
};

// The tail of the scratch after the 5 vocab-sized arrays (blocks: the
// wide kernels' grid).
struct Tail {
    float *bmax;
    int *bidx, *bcnt, *dlast;
    double *bsum, *dsum, *hmd;
    unsigned int *hcount;
    Ctrl *ctrl;
};

int wide_blocks(int vocab) { return (vocab + kSpan - 1) / kSpan; }

__host__ __device__ inline uint64_t align8(uint64_t x) { return (x + 7) & ~7ull; }

__host__ __device__ inline Tail tail_of(void *scratch, int vocab) {
    uint8_t *p = (uint8_t *)scratch + align8(5ull * (uint64_t)vocab * sizeof(float));
    const uint64_t nb = (uint64_t)(vocab + kSpan - 1) / kSpan;
    Tail t;
    t.bsum = (double *)p, p += nb * 8;
    t.dsum = (double *)p, p += nb * 8;
    t.hmd = (double *)p, p += 256 * 8;
    t.ctrl = (Ctrl *)p, p += align8(sizeof(Ctrl));
    t.bmax = (float *)p, p += nb * 4;
    t.bidx = (int *)p, p += nb * 4;
    t.bcnt = (int *)p, p += nb * 4;
    t.dlast = (int *)p, p += nb * 4;
    t.hcount = (unsigned int *)p;
    return t;
}

// Sum over a wide block in a fixed order (a fixed tree); every thread gets it.
__device__ double wide_sum(double v, double *buf) {
    for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    double t = 0;
    if (threadIdx.x == 0) {
        for (int w = 0; w < kW / 32; w++) t = __dadd_rn(t, buf[w]);
        buf[0] = t;
    }
    __syncthreads();
    t = buf[0];
    __syncthreads();
    return t;
}

// The highest value over a wide block, ties to the lowest index; bi -1 and
// best -inf when no thread holds one (NaN and -inf never win).
__device__ void wide_argmax(float &best, int &bi, float *bf, int *bix) {
    for (int o = 16; o > 0; o >>= 1) {
        const float b = __shfl_xor_sync(0xffffffffu, best, o);
        const int j = __shfl_xor_sync(0xffffffffu, bi, o);
        if (j >= 0 && (bi < 0 || b > best || (b == best && j < bi))) best = b, bi = j;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) bf[warp] = best, bix[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < kW / 32; w++)
            if (bix[w] >= 0 && (bi < 0 || bf[w] > best || (bf[w] == best && bix[w] < bi))) best = bf[w], bi = bix[w];
        bf[0] = best, bix[0] = bi;
    }
    __syncthreads();
    best = bf[0], bi = bix[0];
    __syncthreads();
}

// Rule 1, penalties (sampler.c apply_penalties), then rule 3, into key;
// each block's maximum (the argmax for greedy requests) into the tail.
// The inputs never overlap anything else (checked by tsr_cu_sample):
// __restrict__ lets their loads run ahead.
__global__ void __launch_bounds__(kW) keys_k(const float *__restrict__ logits, const int32_t *__restrict__ state,
                                             tsr_cu_sample_args a, float *__restrict__ key, Tail tl) {
    tsr_pdl::enter(); // each kernel after the first launched as a programmatic dependent
    __shared__ float bf[kW / 32];
    __shared__ int bix[kW / 32];
    const int V = a.vocab, t = threadIdx.x, end = min(V, (int)(blockIdx.x + 1) * kSpan);
    if (blockIdx.x == 0)
        for (int d = t; d < 256; d += kW) tl.hcount[d] = 0, tl.hmd[d] = 0; // weights_k's histogram
    const float rep = a.repetition_penalty;
    const double pres = a.presence_penalty, freq = a.frequency_penalty;
    const bool pf = pres != 0 || freq != 0;
    float best = -INFINITY;
    int bi = -1;
    for (int i = blockIdx.x * kSpan + t; i < end; i += kW) {
        float l = logits[i];
        const int32_t s = state ? state[i] : 0;
        if ((s & 1) && rep != 1.0f) l = l > 0 ? __fdiv_rn(l, rep) : __fmul_rn(l, rep);
        const int c = s >> 1;
        if (c && pf) l = (float)__dsub_rn((double)l, __dadd_rn(pres, __dmul_rn(freq, (double)c)));
        if (!a.greedy && a.temperature != 1.0f && isfinite(l)) l = __fdiv_rn(l, a.temperature);
        key[i] = l;
        if (l > best) best = l, bi = i;
    }
    wide_argmax(best, bi, bf, bix);
    if (t == 0) tl.bmax[blockIdx.x] = best, tl.bidx[blockIdx.x] = bi;
}

// The maximum over keys_k's blocks (every block reduces them, in block
// order); greedy requests (or no number above -inf) end here. Else the
// candidates: the +inf keys if any (uniform: key 0), else the finite ones,
// their weights relative to the top (exp in double, rounded to float) into
// wt, NaN keys for the rest; each block's sum of weights and count into
// the tail, and with top-k (or top-p alone) their coarse buckets counted
// (and weighed) into the tail's histogram.
__global__ void __launch_bounds__(kW) weights_k(tsr_cu_sample_args a, float *__restrict__ key,
                                                float *__restrict__ wt, int nb, Tail tl, int32_t *out) {
    tsr_pdl::enter(); // each kernel after the first launched as a programmatic dependent
    __shared__ float bf[kW / 32];
    __shared__ int bix[kW / 32];
    __shared__ double buf[kW / 32];
    __shared__ unsigned int hc[256];
    __shared__ double hm[256];
    const int V = a.vocab, t = threadIdx.x, end = min(V, (int)(blockIdx.x + 1) * kSpan);
    float best = -INFINITY;
    int bi = -1;
    for (int j = t; j < nb; j += kW) {
        const float b = tl.bmax[j];
        const int i = tl.bidx[j];
        if (i >= 0 && (bi < 0 || b > best || (b == best && i < bi))) best = b, bi = i;
    }
    wide_argmax(best, bi, bf, bix);
    if (a.greedy || best == -INFINITY) {
        if (blockIdx.x == 0 && t == 0) out[0] = a.greedy ? bi : -1, tl.ctrl->done = 1;
        return;
    }
    const bool inf_mode = best == INFINITY;
    const double mx = inf_mode ? 0.0 : (double)best;
    if (blockIdx.x == 0 && t == 0) tl.ctrl->done = 0, tl.ctrl->mx = mx;
    const bool hist = a.top_k > 0 || a.top_p < 1.0f, hist_p = a.top_k <= 0 && a.top_p < 1.0f;
    if (hist)
        for (int d = t; d < 256; d += kW) hc[d] = 0, hm[d] = 0;
    __syncthreads();
    int nc = 0;
    double part = 0;
    for (int i = blockIdx.x * kSpan + t; i < end; i += kW) {
        const float l = key[i];
        const bool c = inf_mode ? l == INFINITY : isfinite(l);
        const float k = __fadd_rn(inf_mode ? 0.0f : l, 0.0f); // -0 as +0: equal keys, equal codes
        const float w = c ? (float)exp(__dsub_rn((double)k, mx)) : 0.0f;
        key[i] = c ? k : NAN;
        wt[i] = w;
        part = __dadd_rn(part, (double)w);
        nc += c;
        if (hist && c) {
            const int b = coarse(k, mx);
            if (b < 255) {
                atomicAdd(&hc[b], 1u);
                if (hist_p) atomicAdd(&hm[b], (double)w);
            }
        }
    }
    const double z = wide_sum(part, buf);
    const double n = wide_sum((double)nc, buf); // exact: at most kSpan
    if (t == 0) tl.bsum[blockIdx.x] = z, tl.bcnt[blockIdx.x] = (int)n;
    if (hist)
        for (int d = t; d < 256; d += kW)
            if (hc[d]) atomicAdd(&tl.hcount[d], hc[d]), atomicAdd(&tl.hmd[d], hm[d]);
}

// The rules on the candidate set, in the one block (sampler.c's order),
// from weights_k's keys, weights, block sums and histogram; hands the draw
// the set (a prefix of the order: the vocabulary, or the compacted list)
// and the sum it divides by (tl.ctrl). scratch: key [V], wt [V], then the
// compacted list's keys, weights and ids [V] each.
__global__ void __launch_bounds__(kT) select_k(tsr_cu_sample_args a, float *scratch, int nb, Tail tl) {
    tsr_pdl::enter(); // each kernel after the first launched as a programmatic dependent
    __shared__ Shared sh;
    if (tl.ctrl->done) return;
    const int V = a.vocab, t = threadIdx.x;
    float *key = scratch, *wt = scratch + V;
    const double mx = tl.ctrl->mx;
    const bool top_k = a.top_k > 0, hist_p = !top_k && a.top_p < 1.0f;
    for (int d = t; d < 256; d += kT) sh.hcount[d] = tl.hcount[d], sh.hmd[d] = tl.hmd[d];
    // the candidates' count and weight: weights_k's blocks in order (a
    // contiguous run of them a thread, then the fixed tree); part: this
    // thread's share of the weights of the current set, kept up to date by
    // every filter (the whole sum on thread 0 until one cuts the set)
    int nc = 0;
    double zb = 0;
    {
        const int per = (nb + kT - 1) / kT, lo = t * per, hi = min(nb, lo + per);
        for (int j = lo; j < hi; j++) nc += tl.bcnt[j], zb = __dadd_rn(zb, tl.bsum[j]);
    }
    nc = block_sum_int(nc, sh);
    const double zall = block_sum(zb, sh);
    double part = t == 0 ? zall : 0.0;

    // The set the later rules work on: K, W [n], in id order (the ids: lid
    // where listed, else position is id). The kept set is a prefix of the order, and so are the
    // coarse buckets up to any one: with top-k, up to the bucket where the
    // count reaches k; with top-p alone, up to the bucket where the mass
    // surely reaches p's target (the double sums of the histogram, in no
    // fixed order, with a margin for their rounding and for the fixed
    // point's). Those buckets are compacted, in id order, into a list that
    // every later step works on instead of the vocabulary; which bucket
    // bounds the list never changes the result, only what is read.
    float *K = key, *W = wt;
    int n = V;
    const bool do_top_k = top_k && a.top_k < nc, do_top_p = a.top_p < 1.0f;
    double z = do_top_k ? 0.0 : zall; // top-k: after its cut
    const u64 target_p = do_top_k || !do_top_p ? 0 : top_p_target(a.top_p, z);
    bool listed = false;
    if (do_top_k || hist_p) {
        if (t == 0) {
            unsigned int cum = 0;
            double cum_m = 0;
            int bound = -1;
            for (int b = 0; b < 255 && bound < 0; b++) {
                cum += sh.hcount[b];
                cum_m += sh.hmd[b];
                if (do_top_k ? cum >= (unsigned int)a.top_k
                             : cum > 0 && cum_m * (1.0 - 1e-9) >= ((double)target_p + 0.5 * cum + 1.0) / kFix)
                    bound = b;
            }
            sh.found = bound;
        }
        __syncthreads();
        const int bound = sh.found;
        __syncthreads();
        if (bound >= 0) {
            float *lkey = scratch + 2 * (size_t)V, *lwt = scratch + 3 * (size_t)V;
            int32_t *lid = (int32_t *)(scratch + 4 * (size_t)V);
            const int chunk = (V + kT - 1) / kT, lo = t * chunk, hi = min(V, lo + chunk);
            int cnt = 0;
            for (int i = lo; i < hi; i++) {
                const float k = key[i];
                if (!isnan(k) && coarse(k, mx) <= bound) cnt++;
            }
            u64 m;
            int o = (int)excl_scan((u64)cnt, sh.u, &m);
            part = 0;
            for (int i = lo; i < hi; i++) {
                const float k = key[i];
                if (isnan(k) || coarse(k, mx) > bound) continue;
                lkey[o] = k, lwt[o] = wt[i], lid[o] = i, o++;
                part = __dadd_rn(part, (double)wt[i]);
            }
            __syncthreads();
            K = lkey, W = lwt, n = (int)m; // ids: lid (ctrl.listed)
            listed = true;
        }
    }

    // Rule 4: top-k, then the softmax's sum over what it keeps.
    uint32_t tu;
    int tid;
    if (do_top_k) {
        if (select_first(K, W, n, false, (u64)a.top_k, &tu, &tid, sh)) part = keep_first(K, W, n, tu, tid);
        z = block_sum(part, sh);
    }

    // Rule 5: top-p (the shortest prefix whose mass reaches p), then min-p.
    // filtered: the weights left differ from those z sums (a list cut by
    // top-p alone holds less than every candidate).
    bool filtered = listed && !do_top_k;
    if (do_top_p) {
        const u64 target = do_top_k ? top_p_target(a.top_p, z) : target_p;
        if (select_first(K, W, n, true, target, &tu, &tid, sh)) {
            part = keep_first(K, W, n, tu, tid);
            filtered = true;
        }
    }
    if (a.min_p > 0) {
        const double thr = __dmul_rn((double)a.min_p, 1.0 - kSlack);
        part = 0;
        for (int i = t; i < n; i += kT) {
            const float w = W[i];
            if (!((double)w >= thr)) W[i] = 0.0f;
            else part = __dadd_rn(part, (double)w);
        }
        __syncthreads();
        filtered = true;
    }
    // Rule 6's renormaliser; the draw follows (draw_k, pick_k).
    const double zk = filtered ? block_sum(part, sh) : z;
    if (t == 0) tl.ctrl->listed = listed, tl.ctrl->n = n, tl.ctrl->zk = zk;
}

// Position i's weight over the renormaliser, W[i] / zk rounded to float (0
// where not a weight; weight_ok says which count).
__device__ __forceinline__ float set_weight(const float *W, int i, double zk) {
    return W[i] > 0 ? (float)__ddiv_rn((double)W[i], zk) : 0.0f;
}

// The set's weights summed in id order: thread t of block b the kPer
// positions from (b kW + t) kPer, then the block's threads in order. draw_k
// keeps each block's sum (dsum) and its last position with a weight
// (dlast); pick_k sums the drawn block again the same way.
__device__ void draw_chunk(const float *W, int n, double zk, int b, double *own, int *last) {
    const int lo = (b * kW + threadIdx.x) * kPer, hi = min(n, lo + kPer);
    *own = 0, *last = -1;
    for (int i = lo; i < hi; i++) {
        const float p = set_weight(W, i, zk);
        if (weight_ok(p)) *own = __dadd_rn(*own, (double)p), *last = i;
    }
}

// Exclusive prefix over a wide block's threads in thread order (fixed).
__device__ double wide_scan(double v, double *buf, double *total) {
    const int t = threadIdx.x;
    buf[t] = v;
    __syncthreads();
    for (int off = 1; off < kW; off <<= 1) {
        const double add = t >= off ? buf[t - off] : 0.0;
        __syncthreads();
        buf[t] = __dadd_rn(buf[t], add);
        __syncthreads();
    }
    const double ex = t > 0 ? buf[t - 1] : 0.0;
    *total = buf[kW - 1];
    __syncthreads();
    return ex;
}

__global__ void __launch_bounds__(kW) draw_k(float *scratch, int V, Tail tl) {
    tsr_pdl::enter(); // each kernel after the first launched as a programmatic dependent
    __shared__ double buf[kW];
    __shared__ int lmax;
    if (tl.ctrl->done) return;
    const int n = tl.ctrl->n;
    if ((int)blockIdx.x * kSpan >= n) return;
    const float *W = scratch + (tl.ctrl->listed ? 3 * (size_t)V : (size_t)V);
    double own, total;
    int last;
    draw_chunk(W, n, tl.ctrl->zk, (int)blockIdx.x, &own, &last);
    if (threadIdx.x == 0) lmax = -1;
    wide_scan(own, buf, &total);
    if (last >= 0) atomicMax(&lmax, last);
    __syncthreads();
    if (threadIdx.x == 0) tl.dsum[blockIdx.x] = total, tl.dlast[blockIdx.x] = lmax;
}

// Rule 6's draw (tsr_sampler_draw): the first position whose running sum
// exceeds u times the total (blocks in order, then the block's threads,
// then its positions), else the last with a weight; -1 when none has one.
__global__ void __launch_bounds__(kW) pick_k(float *scratch, tsr_cu_sample_args a, Tail tl, int32_t *out) {
    tsr_pdl::enter(); // each kernel after the first launched as a programmatic dependent
    __shared__ double buf[kW];
    __shared__ int blk, hit, lastp;
    __shared__ double before, target;
    if (tl.ctrl->done) return;
    const int V = a.vocab, n = tl.ctrl->n, nb = (n + kSpan - 1) / kSpan, t = threadIdx.x;
    if (t == 0) {
        double total = 0;
        int last = -1;
        for (int b = 0; b < nb; b++) {
            total = __dadd_rn(total, tl.dsum[b]);
            if (tl.dlast[b] > last) last = tl.dlast[b];
        }
        const double tg = __dmul_rn(a.u, total);
        double cum = 0;
        int b = 0;
        if (total > 0 && last >= 0)
            for (; b < nb; b++) {
                const double next = __dadd_rn(cum, tl.dsum[b]);
                if (tg < next) break;
                cum = next;
            }
        blk = total > 0 && last >= 0 && b < nb ? b : -1;
        lastp = total > 0 ? last : -1;
        before = cum, target = tg, hit = INT_MAX;
    }
    __syncthreads();
    const int b = blk;
    int pos = lastp;
    if (b >= 0) {
        // block b's sums again, as draw_k made them
        const float *W = scratch + (tl.ctrl->listed ? 3 * (size_t)V : (size_t)V);
        const double zk = tl.ctrl->zk;
        const int lo = (b * kW + t) * kPer, hi = min(n, lo + kPer);
        double own;
        int unused;
        draw_chunk(W, n, zk, b, &own, &unused);
        double total;
        const double ex = wide_scan(own, buf, &total);
        double cum = __dadd_rn(before, ex);
        if (target < __dadd_rn(cum, own))
            for (int i = lo; i < hi; i++) {
                const float p = set_weight(W, i, zk);
                if (!weight_ok(p)) continue;
                cum = __dadd_rn(cum, (double)p);
                if (target < cum) {
                    atomicMin(&hit, i);
                    break;
                }
            }
        __syncthreads();
        if (hit != INT_MAX) pos = hit;
    }
    if (t == 0) {
        const int32_t *ids = tl.ctrl->listed ? (const int32_t *)(scratch + 4 * (size_t)V) : NULL;
        out[0] = pos < 0 || !ids ? pos : ids[pos];
    }
}

__global__ void history_k(int32_t *state, const int32_t *ids, int n, int gen_from, int vocab) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    const int32_t id = ids[j];
    if (id < 0 || id >= vocab) return;
    atomicOr(&state[id], 1);
    if (j >= gen_from) atomicAdd(&state[id], 2);
}

int launched() { return cudaGetLastError() == cudaSuccess ? 0 : -10; }

// [a, a + na) and [b, b + nb) share a byte
bool overlap(const void *a, uint64_t na, const void *b, uint64_t nb) {
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + nb && y < x + na;
}

} // namespace

extern "C" uint64_t tsr_cu_sample_scratch_bytes(int vocab) {
    if (vocab < 1) return 0;
    const uint64_t nb = (uint64_t)wide_blocks(vocab);
    return align8(5ull * (uint64_t)vocab * sizeof(float)) + nb * 16 + 256 * 8 + align8(sizeof(Ctrl)) + nb * 16 +
           256 * 4;
}

extern "C" int tsr_cu_sample(const float *logits, const int32_t *state, const tsr_cu_sample_args *a,
                             void *scratch, int32_t *out, void *stream) {
    if (!a || !logits || !scratch || !out || a->vocab < 1 || a->vocab > TSR_CU_SAMPLE_MAX_VOCAB) return -1;
    if (!a->greedy && !(a->temperature > 0 && a->temperature <= FLT_MAX)) return -1;
    if (!(a->u >= 0 && a->u < 1) || a->top_k < 0) return -1;
    const uint64_t row = (uint64_t)a->vocab * sizeof(float), scr = tsr_cu_sample_scratch_bytes(a->vocab);
    if (overlap(logits, row, scratch, scr) || overlap(out, 4, scratch, scr) || overlap(out, 4, logits, row) ||
        (state && (overlap(state, row, scratch, scr) || overlap(state, row, out, 4))))
        return -1;
    cudaStream_t st = (cudaStream_t)stream;
    const int nb = wide_blocks(a->vocab);
    float *key = (float *)scratch;
    const Tail tl = tail_of(scratch, a->vocab);
    // The kernels after the first are launched as programmatic dependents
    // of the one before (kernels/cuda/pdl.cuh) where the device has them
    // (sm_90): each waits at its top, so its launch overlaps the other's
    // run instead of following it. stories260K (vocabulary 512: each kernel
    // one block) sampled through cuda-fast on the H200, 9,944 tok/s with
    // plain launches (BENCHMARKS.md, twenty-seventh session).
    static int pdl = -1; // the same answer from any thread
    if (pdl < 0) {
        int dev = 0, major = 0;
        pdl = cudaGetDevice(&dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
    }
    const bool dep = pdl == 1;
    keys_k<<<nb, kW, 0, st>>>(logits, state, *a, key, tl);
    cudaError_t e = tsr_pdl::launch(weights_k, nb, kW, 0, st, dep, *a, key, key + a->vocab, nb, tl, out);
    if (e != cudaSuccess) return -10;
    if (a->greedy) return launched();
    if ((e = tsr_pdl::launch(select_k, 1, kT, 0, st, dep, *a, key, nb, tl)) == cudaSuccess &&
        (e = tsr_pdl::launch(draw_k, nb, kW, 0, st, dep, key, a->vocab, tl)) == cudaSuccess)
        e = tsr_pdl::launch(pick_k, 1, kW, 0, st, dep, key, *a, tl, out);
    return e == cudaSuccess ? launched() : -10;
}

extern "C" int tsr_cu_sample_history(int32_t *state, const int32_t *ids, int n, int gen_from, int vocab,
                                     void *stream) {
    if (!state || vocab < 1 || n < 0 || (n > 0 && !ids)) return -1;
    if (n == 0) return 0;
    history_k<<<(n + 255) / 256, 256, 0, (cudaStream_t)stream>>>(state, ids, n, gen_from, vocab);
    return launched();
}
