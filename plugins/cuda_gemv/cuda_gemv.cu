// cuda_gemv - gemv on an NVIDIA GPU with bf16 weights in device memory.
//
// Built twice from this file:
// - cuda_gemv_cublaslt (the CUDA baseline): every call is one cuBLASLt
//   matmul, bf16 x bf16 -> f32 with f32 accumulation;
// - cuda_gemv (CUDA_GEMV_DECODE): for one row (decode) a kernel streaming
//   whole weight rows, two or four warps per row group (kernels/cuda/gemv_row.cuh),
//   which for the stacked gate/up projection also applies the SiLU
//   (run_glu: one launch less per layer; param glu); for
//   2..8 rows (verification of drafts) a tensor-core GEMV
//   (kernels/cuda/gemv_mma.cuh) that streams each weight once for all input
//   rows, 8 rows costing about what 1 does; cuBLASLt above 8 rows (prefill).
// Weights are widened or narrowed to bf16 at prepare (exact for bf16
// checkpoints; f32/f16 weights are rounded: lossy there), activations are
// rounded to bf16 before the product. Scaled weights (FP8 checkpoints, any
// tsr_weight_scale layout: per tensor, row or block) are widened code by
// code, multiplied by their scale in f32 as ref_gemv does, then rounded to
// bf16. prepare_group stacks matrices (q/k/v,
// gate/up) into one so a decode pass reads them in one launch.
// run_experts (cuda_gemv): a mixture of experts' one-row products with the
// experts chosen on the device, each through the one-row kernel.
// Graph-capable: a captured pass (ex->step) uses activation scratch reserved
// at init for TSR_GRAPH_MAX_ROWS rows, never the growing eager one.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemv_row.cuh"
#include "plugins/common/grouped_tiles.h"
#include "kernels/dtype.h"
#include "slots/tsr_gemv.h"

#ifdef CUDA_GEMV_DECODE
#define PLUGIN_NAME "cuda_gemv"
#else
#define PLUGIN_NAME "cuda_gemv_cublaslt"
#endif

namespace {

constexpr size_t kWorkspace = 32u << 20;

struct Algo {
    int ready;
    int64_t m, k, ld;    // the weight's shape it was planned for
    int bucket;          // row_bucket of the row counts it serves
    int64_t n;           // the row count its layouts hold now
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
};

constexpr int kPlans = 128; // distinct (weight shape, row bucket) pairs planned once

struct Gemv {
    const tsr_plugin_ctx *ctx;
    cublasLtHandle_t lt;
    void *workspace;
    __nv_bfloat16 *xb;   // activations in bf16
    size_t xb_elems;
    __nv_bfloat16 *graph_xb; // the same for captured passes: fixed at init
    size_t graph_xb_elems;
    int decode_rows;     // rows up to which the tensor-core kernel runs
    int glu;             // param glu: run_glu fuses one row's gate/up and SiLU (CUDA_GEMV_DECODE)
    int fuse;            // param fuse: run_fused takes one row's residual add (CUDA_GEMV_DECODE)
    int fold;            // param fold: run_fused folds the next norm into the add and the product after
    float *fold_ss;      // [kFoldMax] device: the latest fold's sums of squares (fixed: graphs replay it)
    const float *fold_x; // that fold's output (the next product's x), until a product uses it
    int fold_n;          // its sums
    int64_t fold_cols;   // its outputs
    Algo plans[kPlans];  // cuBLASLt plans by shape (a heuristic query costs ~0.1 ms)
    GroupedTiles tiles; // run_grouped's tile lists
};

struct Weight {
    int64_t rows, cols;
    int64_t ld;          // cols rounded up to 32 (64-byte rows, as gemv_mma reads them); the padding is zero
    int pair;            // stacked from two matrices of equal rows (gate/up: run_glu)
    int role;            // tsr_weight_role (of the first matrix stacked): the one-row kernel's configuration
    __nv_bfloat16 *w;    // [rows, cols] device
};

int cuda_err(Gemv *g, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return TSR_OK;
    g->ctx->host->set_error(g->ctx, "%s: CUDA error %d (%s)", what, (int)e, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? TSR_ERR_NOMEM : TSR_ERR_DEVICE;
}

int lt_err(Gemv *g, cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return TSR_OK;
    g->ctx->host->set_error(g->ctx, "%s: cuBLASLt status %d", what, (int)s);
    return TSR_ERR_DEVICE;
}

// *xb: the eager bf16 scratch, grown to hold at least need values (never
// while a graph is captured: callers in a captured pass use graph_xb).
int eager_xb(Gemv *g, size_t need, __nv_bfloat16 **xb) {
    if (need > g->xb_elems) {
        if (need < 2 * g->xb_elems) need = 2 * g->xb_elems;
        if (g->xb) g->ctx->host->dev_free(g->ctx, g->xb);
        g->xb = nullptr;
        g->xb_elems = 0;
        int rc = g->ctx->host->dev_alloc(g->ctx, need * 2, reinterpret_cast<void **>(&g->xb));
        if (rc != TSR_OK) return rc;
        g->xb_elems = need;
    }
    *xb = g->xb;
    return TSR_OK;
}

#ifdef CUDA_GEMV_DECODE
constexpr int kMaxDecodeRows = 8;

// The decode kernels' arguments for x (rows cols apart, read as they are) through w into y.
tsr_mma::Args decode_args(const Weight *w, const float *x, float *y) {
    tsr_mma::Args a = {};
    a.w = reinterpret_cast<const uint8_t *>(w->w);
    a.x = x, a.y = y;
    a.n_out = (int)w->rows, a.cols = (int)w->cols, a.ldw = w->ld * 2, a.ldx = a.cols;
    return a;
}

// The handle's role as gemv_row.cuh's launch_row takes it.
tsr_row::RowRole row_role(const Weight *w) { return static_cast<tsr_row::RowRole>(w->role); }

// 1..8 rows: kernels/cuda/gemv_row.cuh's launch_decode (whole rows streamed
// for one row, the tensor-core GEMV of gemv_mma.cuh for 2..8).
int run_decode(Gemv *g, const Weight *w, int rows, const float *x, float *y, cudaStream_t st, bool pdl) {
    return cuda_err(g, tsr_row::launch_decode<tsr_mma::kBf16>(decode_args(w, x, y), rows, row_role(w), st, pdl),
                    "decode gemv launch");
}

// One row of a gate/up pair with its SiLU (kernels/cuda/gemv_row.cuh's
// launch_glu); TSR_ERR_UNSUPPORTED, nothing launched, where run() would not
// take gemv_row for it. Verification rows are refused: gemv_mma's GLU
// kernel (which cuda_gemv_fp8 takes) made a bf16 8-row pass slower at the
// Llama-3-8B shape on the H200 than the product and the core's SiLU kernel
// (4.853 / 4.833 against 4.742 / 4.720 ms; BENCHMARKS.md, twenty-seventh
// session): a tile's gate rows and up rows lie 117 MB apart. With two tiles
// a warp (16 consecutive gate rows and their up rows a block, the same sums)
// it measured the same as not fusing (4.723 / 4.720 against 4.724 / 4.728).
int run_glu(Gemv *g, const Weight *w, int rows, const float *x, float *y, cudaStream_t st, bool pdl) {
    const tsr_mma::Args a = decode_args(w, x, y);
    if (!g->glu || !w->pair || rows != 1 || g->decode_rows < 1 || !tsr_row::glu_reads<tsr_mma::kBf16>(a))
        return TSR_ERR_UNSUPPORTED;
    return cuda_err(g, tsr_row::launch_glu<tsr_mma::kBf16>(a, row_role(w), st, pdl), "gate/up gemv launch");
}

// A layer's experts for run_experts: their weight pointers in device memory.
struct Experts {
    Weight shape;          // the first handle's shape (w: its weights)
    const uint8_t **table; // [n] device: each handle's w
};

int prepare_experts(Gemv *g, const void *const *prepared, int n, void **out) {
    const tsr_host_api *h = g->ctx->host;
    if (n < 1 || !prepared || !prepared[0]) return TSR_ERR_UNSUPPORTED;
    const Weight *w0 = static_cast<const Weight *>(prepared[0]);
    const uint8_t **host = static_cast<const uint8_t **>(calloc((size_t)n, sizeof *host));
    if (!host) return TSR_ERR_NOMEM;
    for (int e = 0; e < n; e++) {
        const Weight *w = static_cast<const Weight *>(prepared[e]);
        if (!w || w->rows != w0->rows || w->cols != w0->cols || w->ld != w0->ld || w->pair != w0->pair) {
            free(host);
            h->set_error(g->ctx, "expert %d differs in shape from expert 0 (%lld x %lld)", e, (long long)w0->rows,
                         (long long)w0->cols);
            return TSR_ERR_INVALID;
        }
        host[e] = reinterpret_cast<const uint8_t *>(w->w);
    }
    Experts *x = static_cast<Experts *>(h->alloc(g->ctx, sizeof(Experts), 64));
    if (x) *x = Experts{};
    int rc = x ? h->dev_alloc(g->ctx, (size_t)n * sizeof *host, reinterpret_cast<void **>(&x->table)) : TSR_ERR_NOMEM;
    if (rc == TSR_OK)
        rc = cuda_err(g, cudaMemcpy(x->table, host, (size_t)n * sizeof *host, cudaMemcpyHostToDevice), "expert table");
    free(host);
    if (rc != TSR_OK) {
        if (x && x->table) h->dev_free(g->ctx, x->table);
        if (x) h->free(g->ctx, x);
        return rc;
    }
    x->shape = *w0;
    *out = x;
    return TSR_OK;
}

// k experts' one-row products (glu: gate/up pairs with their SiLU) through
// gemv_row's launch_experts; TSR_ERR_UNSUPPORTED, nothing launched, where
// run() (run_glu) would not take gemv_row for one row of this shape.
int run_experts(Gemv *g, const Experts *t, const int32_t *sel, int k, int per_x, int glu, const float *x, int ldx,
                float *y, cudaStream_t st, bool pdl) {
    tsr_mma::Args a = decode_args(&t->shape, x, y);
    a.ldx = ldx;
    a.etab = t->table, a.sel = sel, a.per_x = per_x;
    if (k < 1 || k > 65535 || per_x < 1 || ldx % 4 || g->decode_rows < 1 || (glu && !g->glu) ||
        (glu ? !t->shape.pair || !tsr_row::glu_reads<tsr_mma::kBf16>(a)
             : !tsr_row::row_reads(tsr_mma::kBf16, a) || !tsr_row::row_kernel_for(tsr_mma::kBf16, a.n_out)))
        return TSR_ERR_UNSUPPORTED;
    const tsr_row::RowRole role = row_role(&t->shape);
    const cudaError_t e = glu ? tsr_row::launch_experts<tsr_mma::kBf16, true>(a, role, k, st, pdl)
                              : tsr_row::launch_experts<tsr_mma::kBf16, false>(a, role, k, st, pdl);
    return cuda_err(g, e, "expert gemv launch");
}

// A layer's prompt rows grouped by expert (off, host) through their experts
// in one launch (kernels/cuda/grouped.cuh), the rows (cols apart, as the
// host gathers them) converted to bf16 first; TSR_ERR_UNSUPPORTED, nothing
// launched, for offsets, rows or shapes it does not take.
int run_grouped(Gemv *g, const Experts *t, const int32_t *off, int n, int glu, const float *x, int ldx, float *y,
                cudaStream_t st) {
    const Weight &w = t->shape;
    if (!grouped_offsets_ok(off, n) || ldx != w.cols || (glu && (!w.pair || w.rows % 2)))
        return TSR_ERR_UNSUPPORTED;
    const int64_t rows = off[n];
    if (rows == 0) return TSR_OK;
    const int kx = tsr_grouped::k_extent((int)w.cols);
    __nv_bfloat16 *xb = nullptr;
    int rc = eager_xb(g, (size_t)rows * (size_t)kx, &xb);
    if (rc != TSR_OK) return rc;
    if (tsr_cu_f32_to_bf16_pad(reinterpret_cast<uint16_t *>(xb), x, (int)rows, (int)w.cols, kx, st) != 0)
        return cuda_err(g, cudaGetLastError(), "grouped activations to bf16");
    int64_t k;
    if ((rc = grouped_tiles_upload(g->ctx, &g->tiles, off, n, (int)w.rows, glu != 0, st, &k))) return rc;
    tsr_grouped::Args a = {};
    a.etab = t->table, a.tiles = g->tiles.d, a.xb = xb, a.y = y, a.ldxb = kx, a.kx = kx;
    a.ldy = glu ? (int)w.rows / 2 : (int)w.rows;
    a.n_out = (int)w.rows, a.ldw = w.ld * 2;
    return cuda_err(g, tsr_grouped::launch(a, k, glu != 0, false, st), "grouped expert gemm launch");
}

// Whether run_decode takes these rows (x read as it is).
bool decodes(const Gemv *g, const Weight *w, int rows, const float *x) {
    return rows >= 1 && rows <= g->decode_rows && rows <= kMaxDecodeRows &&
           tsr_mma::reads_x(x, (int)w->cols, (int)w->cols);
}

// The product after a fold (tsr_gemv_fuse.folded: x is the fold's output,
// the stream times the norm's weights), its sums multiplied by the norm's
// factor from the sums of squares the fold left (gemv_row.cuh's FOLD 2);
// one row, plain or a gate/up pair with its SiLU. TSR_ERR_UNSUPPORTED,
// nothing launched, where x is not the latest fold's output or the kernel
// does not take the matrix (folded_takes).
int run_folded(Gemv *g, const Weight *w, const float *x, float *y, const tsr_gemv_fuse *fu, cudaStream_t st,
               bool pdl) {
    if (!fu->norm || fu->accumulate || x != g->fold_x || w->cols != g->fold_cols || (fu->glu && (!g->glu || !w->pair)))
        return TSR_ERR_UNSUPPORTED;
    tsr_mma::Args a = decode_args(w, x, y);
    a.fold_ss = g->fold_ss, a.n_ss = g->fold_n, a.eps = fu->eps;
    if (!tsr_row::folded_takes(tsr_mma::kBf16, a, row_role(w), fu->glu != 0) ||
        (fu->glu && !tsr_row::glu_reads<tsr_mma::kBf16>(a)))
        return TSR_ERR_UNSUPPORTED;
    g->fold_x = nullptr; // one use
    const cudaError_t e = fu->glu ? tsr_row::launch_glu<tsr_mma::kBf16>(a, row_role(w), st, pdl)
                                  : tsr_row::launch_decode<tsr_mma::kBf16>(a, 1, row_role(w), st, pdl);
    return cuda_err(g, e, "folded gemv launch");
}

// One row with the host's residual add (tsr_gemv_i.run_fused) through
// gemv_row.cuh's launch_decode, with the next norm's fold where asked and
// taken (fold_blocks; param fold), and the product after a fold
// (run_folded); TSR_ERR_UNSUPPORTED, nothing launched, for an input norm
// otherwise or a gate/up pair (bf16 rows read slower with the norm:
// fused_takes) and where run() would not take the decode kernels.
int run_fused(Gemv *g, const Weight *w, int rows, const float *x, float *y, const tsr_gemv_fuse *fu,
              cudaStream_t st, bool pdl) {
    if (!g->fuse || rows != 1 || !decodes(g, w, rows, x)) return TSR_ERR_UNSUPPORTED;
    if (fu->folded) return g->fold ? run_folded(g, w, x, y, fu, st, pdl) : TSR_ERR_UNSUPPORTED;
    if (fu->glu) return TSR_ERR_UNSUPPORTED;
    tsr_mma::Args a = decode_args(w, x, y);
    a.nw = fu->norm, a.eps = fu->eps, a.accum = fu->accumulate != 0;
    if (!tsr_row::fused_takes<tsr_mma::kBf16>(a)) return TSR_ERR_UNSUPPORTED;
    int n_ss = 0;
    if (fu->fold_norm) {
        if (!g->fold || !fu->accumulate || fu->norm || !fu->fold_out ||
            !(n_ss = tsr_row::fold_blocks(tsr_mma::kBf16, a, row_role(w))))
            return TSR_ERR_UNSUPPORTED;
        a.fold_g = fu->fold_norm, a.fold_out = fu->fold_out, a.fold_ss = g->fold_ss;
    }
    const int rc = cuda_err(g, tsr_row::launch_decode<tsr_mma::kBf16>(a, 1, row_role(w), st, pdl), "fused gemv launch");
    if (rc == TSR_OK && n_ss) g->fold_x = fu->fold_out, g->fold_n = n_ss, g->fold_cols = w->rows;
    return rc;
}
#endif

// A plan for D[n_out x rows] = W^T-view x X-view (column-major), found once.
// With a buffer to time on (xb, y: not while capturing a graph), the
// heuristic's first kCandidates algorithms are each run and the fastest
// kept: its first choice is at times several times slower than the best.
// Only candidates whose output equals the first choice's bit for bit on
// this input take part: two algorithms may order the sums over k
// differently (split-K, another k tile), and a choice made by a timing
// margin alone would give each process its own arithmetic, so the same
// assembly's greedy text could change from one run to the next.
constexpr int kCandidates = 8;

// *flag = 1 where a and b (n floats) differ in any bit.
__global__ void differ_kernel(const float *a, const float *b, int64_t n, int *flag) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        if (__float_as_uint(a[i]) != __float_as_uint(b[i])) *flag = 1;
}

// Whether y equals ref (n floats) bit for bit; flag is device scratch.
bool same_bits(const float *y, const float *ref, int64_t n, int *flag, cudaStream_t st) {
    int h = 1;
    if (cudaMemsetAsync(flag, 0, sizeof h, st) != cudaSuccess) return false;
    differ_kernel<<<264, 256, 0, st>>>(y, ref, n, flag);
    if (cudaMemcpyAsync(&h, flag, sizeof h, cudaMemcpyDeviceToHost, st) != cudaSuccess ||
        cudaStreamSynchronize(st) != cudaSuccess)
        return false;
    return h == 0;
}

int plan(Gemv *g, const Weight *w, int rows, Algo *a, const __nv_bfloat16 *xb, float *y, cudaStream_t st) {
    const uint64_t m = (uint64_t)w->rows, n = (uint64_t)rows, k = (uint64_t)w->cols, ld = (uint64_t)w->ld;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int rc;
    if ((rc = lt_err(g, cublasLtMatmulDescCreate(&a->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc")))
        return rc;
    cublasLtMatmulDescSetAttribute(a->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(a->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if ((rc = lt_err(g, cublasLtMatrixLayoutCreate(&a->a, CUDA_R_16BF, k, m, ld), "layout A")) ||
        (rc = lt_err(g, cublasLtMatrixLayoutCreate(&a->b, CUDA_R_16BF, k, n, ld), "layout B")) ||
        (rc = lt_err(g, cublasLtMatrixLayoutCreate(&a->d, CUDA_R_32F, m, n, m), "layout D")))
        return rc;
    cublasLtMatmulPreference_t pref;
    size_t ws = kWorkspace;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t res[kCandidates];
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(g->lt, a->op, a->a, a->b, a->d, a->d, pref, kCandidates,
                                                      res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
        g->ctx->host->set_error(g->ctx, "cuBLASLt has no algorithm for %llu x %llu x %llu bf16",
                                (unsigned long long)m, (unsigned long long)n, (unsigned long long)k);
        return TSR_ERR_UNSUPPORTED;
    }
    int best = 0;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    float *ref = nullptr; // the first choice's output, then an int flag
    const int64_t n_out = (int64_t)(m * n);
    if (xb && found > 1 && cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess &&
        g->ctx->host->dev_alloc(g->ctx, (size_t)(n_out + 4) * sizeof(float), reinterpret_cast<void **>(&ref)) ==
            TSR_OK) {
        const float one = 1.0f, zero = 0.0f;
        int *flag = reinterpret_cast<int *>(ref + n_out);
        float best_ms = 1e30f;
        bool have_ref = cublasLtMatmul(g->lt, a->op, &one, w->w, a->a, xb, a->b, &zero, ref, a->d, ref, a->d,
                                       &res[0].algo, g->workspace, kWorkspace, st) == CUBLAS_STATUS_SUCCESS;
        for (int i = 0; have_ref && i < found; i++) {
            bool ok = cublasLtMatmul(g->lt, a->op, &one, w->w, a->a, xb, a->b, &zero, y, a->d, y, a->d,
                                     &res[i].algo, g->workspace, kWorkspace, st) == CUBLAS_STATUS_SUCCESS;
            if (!ok || (i > 0 && !same_bits(y, ref, n_out, flag, st))) continue;
            cudaEventRecord(e0, st);
            for (int rep = 0; ok && rep < 3; rep++)
                ok = cublasLtMatmul(g->lt, a->op, &one, w->w, a->a, xb, a->b, &zero, y, a->d, y, a->d,
                                    &res[i].algo, g->workspace, kWorkspace, st) == CUBLAS_STATUS_SUCCESS;
            cudaEventRecord(e1, st);
            float ms = 0;
            if (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
                ok = false;
            if (ok && ms < best_ms) best_ms = ms, best = i;
        }
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (ref) {
        cudaStreamSynchronize(st);
        g->ctx->host->dev_free(g->ctx, ref);
    }
    int rc2 = cuda_err(g, cudaGetLastError(), "timing cuBLASLt algorithms");
    if (rc2 != TSR_OK) return rc2;
    a->algo = res[best].algo;
    a->ready = 1;
    return TSR_OK;
}

void unplan(Algo *a) {
    if (!a->ready) return;
    cublasLtMatrixLayoutDestroy(a->a);
    cublasLtMatrixLayoutDestroy(a->b);
    cublasLtMatrixLayoutDestroy(a->d);
    cublasLtMatmulDescDestroy(a->op);
    a->ready = 0;
}

// Row counts that share a plan: up to 16, then each power of two's
// (prefill of a mixture of experts gives each expert another count; one
// heuristic query apiece, ~0.1 ms, cost more than the products).
int row_bucket(int rows) {
    int b = 16;
    while (b < rows) b <<= 1;
    return b;
}

// a's layouts set to rows; false where its algorithm does not take them.
bool relayout(Gemv *g, Algo *a, int rows) {
    if (a->n == rows) return true;
    const uint64_t n = (uint64_t)rows;
    cublasLtMatmulHeuristicResult_t check;
    if (cublasLtMatrixLayoutSetAttribute(a->b, CUBLASLT_MATRIX_LAYOUT_COLS, &n, sizeof n) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutSetAttribute(a->d, CUBLASLT_MATRIX_LAYOUT_COLS, &n, sizeof n) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoCheck(g->lt, a->op, a->a, a->b, a->d, a->d, &a->algo, &check) != CUBLAS_STATUS_SUCCESS ||
        check.workspaceSize > kWorkspace) {
        const uint64_t back = (uint64_t)a->n; // as planned, for the counts that fit it
        cublasLtMatrixLayoutSetAttribute(a->b, CUBLASLT_MATRIX_LAYOUT_COLS, &back, sizeof back);
        cublasLtMatrixLayoutSetAttribute(a->d, CUBLASLT_MATRIX_LAYOUT_COLS, &back, sizeof back);
        return false;
    }
    a->n = rows;
    return true;
}

// The plan for w at rows: the table's for w and rows' bucket (its layouts
// set to rows), else planned into a free entry, or into tmp when the table
// is full or the bucket's algorithm does not take these rows.
int run_lt(Gemv *g, Weight *w, int rows, const __nv_bfloat16 *xb, float *y, cudaStream_t st, bool capturing) {
    Algo tmp = {};
    Algo *a = nullptr;
    int rc;
    const int bucket = row_bucket(rows);
    for (int i = 0; i < kPlans && !a; i++) {
        Algo *p = &g->plans[i];
        if (!p->ready || (p->m == w->rows && p->bucket == bucket && p->k == w->cols && p->ld == w->ld)) a = p;
    }
    if (!a || (a->ready && !relayout(g, a, rows))) a = &tmp;
    if (!a->ready) {
        /* timing the candidates pays off for prefill-sized passes, planned once each */
        const bool tune = !capturing && rows >= 128 && a != &tmp;
        if ((rc = plan(g, w, rows, a, tune ? xb : nullptr, y, st))) {
            unplan(a);
            return rc;
        }
        a->m = w->rows, a->n = rows, a->k = w->cols, a->ld = w->ld, a->bucket = bucket;
    }
    const float one = 1.0f, zero = 0.0f;
    rc = lt_err(g, cublasLtMatmul(g->lt, a->op, &one, w->w, a->a, xb, a->b, &zero, y, a->d, y, a->d,
                                  &a->algo, g->workspace, kWorkspace, st),
                "cublasLtMatmul");
    unplan(&tmp);
    return rc;
}

int g_init(void *inst, const tsr_plugin_ctx *ctx) {
    Gemv *g = static_cast<Gemv *>(inst);
    g->ctx = ctx;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        ctx->host->set_error(ctx, "no CUDA device");
        return TSR_ERR_DEVICE;
    }
    int rc;
    if ((rc = lt_err(g, cublasLtCreate(&g->lt), "cublasLtCreate"))) return rc;
    if ((rc = ctx->host->dev_alloc(ctx, kWorkspace, &g->workspace))) return rc;
#ifdef CUDA_GEMV_DECODE
    const tsr_param *p = ctx->host->param(ctx, "decode_rows");
    g->decode_rows = p ? (int)p->v.i : kMaxDecodeRows;
    p = ctx->host->param(ctx, "glu");
    g->glu = p && p->type == TSR_PARAM_BOOL ? p->v.b : 1;
    p = ctx->host->param(ctx, "fuse");
    g->fuse = p && p->type == TSR_PARAM_BOOL ? p->v.b : 1;
    p = ctx->host->param(ctx, "fold");
    g->fold = p && p->type == TSR_PARAM_BOOL ? p->v.b : 1;
    if (g->fold &&
        (rc = ctx->host->dev_alloc(ctx, tsr_row::kFoldMax * sizeof(float), reinterpret_cast<void **>(&g->fold_ss))))
        return rc;
#endif
    const tsr_model_desc *md = ctx->model;
    if (md) { // the widest input of any projection, for captured passes
        int64_t cols = md->hidden;
        const int64_t others[] = {md->ffn, (int64_t)md->n_heads * md->head_dim, md->expert_ffn};
        for (int64_t c : others) cols = c > cols ? c : cols;
        g->graph_xb_elems = (size_t)TSR_GRAPH_MAX_ROWS * (size_t)(tsr_mma::row_bytes(tsr_mma::kBf16, cols) / 2);
        if ((rc = ctx->host->dev_alloc(ctx, g->graph_xb_elems * 2, reinterpret_cast<void **>(&g->graph_xb))))
            return rc;
    }
    return TSR_OK;
}

void g_fini(void *inst) {
    Gemv *g = static_cast<Gemv *>(inst);
    if (!g->ctx) return;
    if (g->workspace) g->ctx->host->dev_free(g->ctx, g->workspace);
    if (g->xb) g->ctx->host->dev_free(g->ctx, g->xb);
    if (g->graph_xb) g->ctx->host->dev_free(g->ctx, g->graph_xb);
#ifdef CUDA_GEMV_DECODE
    if (g->fold_ss) g->ctx->host->dev_free(g->ctx, g->fold_ss);
#endif
    grouped_tiles_free(g->ctx, &g->tiles);
    for (int i = 0; i < kPlans; i++) unplan(&g->plans[i]);
    if (g->lt) cublasLtDestroy(g->lt);
}

int readable(Gemv *g, const tsr_weight *tw, uint64_t *row_bytes) {
    if (tw->dtype >= TSR_DTYPE_COUNT || tw->dtype == TSR_DTYPE_I32 || tw->dtype == TSR_DTYPE_I64 ||
        tsr_dtype_row_bytes(tw->dtype, tw->cols, row_bytes) != 0) {
        g->ctx->host->set_error(g->ctx, "%s: %s is not a weight type it reads", tw->name, tsr_dtype_name(tw->dtype));
        return TSR_ERR_UNSUPPORTED;
    }
    const tsr_weight_scale *sc = tsr_weight_scale_of(g->ctx, tw); // gemv interface 3: FP8 checkpoints
    if (sc && (!sc->data || sc->block_rows < 1 || sc->block_cols < 1)) {
        g->ctx->host->set_error(g->ctx, "%s: scale blocks of %lld x %lld", tw->name, (long long)sc->block_rows,
                                (long long)sc->block_cols);
        return TSR_ERR_INVALID;
    }
    return TSR_OK;
}

// Stored weights -> bf16 on the host (a row at a time), stacked by rows ->
// device: n matrices of equal cols become one [sum of rows, ld] matrix.
int make_weight(Gemv *g, const tsr_weight *ws, int n, void **out) {
    const tsr_host_api *h = g->ctx->host;
    int64_t rows = 0;
    for (int i = 0; i < n; i++) {
        uint64_t rb;
        int rc = readable(g, &ws[i], &rb);
        if (rc != TSR_OK) return rc;
        if (ws[i].cols != ws[0].cols) {
            h->set_error(g->ctx, "%s and %s differ in columns (%lld, %lld): they cannot be stacked", ws[0].name,
                         ws[i].name, (long long)ws[0].cols, (long long)ws[i].cols);
            return TSR_ERR_INVALID;
        }
        rows += ws[i].rows;
    }
    Weight *w = static_cast<Weight *>(h->alloc(g->ctx, sizeof(Weight), 64));
    if (!w) return TSR_ERR_NOMEM;
    w->rows = rows;
    w->cols = ws[0].cols;
    w->pair = n == 2 && ws[0].rows == ws[1].rows;
    w->role = tsr_weight_role_of(g->ctx, &ws[0]);
    w->ld = tsr_mma::row_bytes(tsr_mma::kBf16, w->cols) / 2;
    const size_t elems = (size_t)rows * (size_t)w->ld;
    int rc = h->dev_alloc(g->ctx, elems * 2, reinterpret_cast<void **>(&w->w));
    uint16_t *host = static_cast<uint16_t *>(calloc(elems, 2)); // zero padding
    float *row = static_cast<float *>(malloc((size_t)w->cols * sizeof(float)));
    if (rc == TSR_OK && (!host || !row)) rc = TSR_ERR_NOMEM;
    int64_t at = 0;
    for (int i = 0; rc == TSR_OK && i < n; i++) {
        const tsr_weight *tw = &ws[i];
        uint64_t row_bytes;
        readable(g, tw, &row_bytes);
        for (int64_t r = 0; r < tw->rows; r++, at++) {
            const uint8_t *src = static_cast<const uint8_t *>(tw->data) + (uint64_t)r * row_bytes;
            uint16_t *dst = host + (size_t)at * w->ld;
            const tsr_weight_scale *sc = tsr_weight_scale_of(g->ctx, tw);
            if (tw->dtype == TSR_DTYPE_BF16 && !sc) {
                memcpy(dst, src, (size_t)tw->cols * 2);
            } else {
                tsr_dequant_row(tw->dtype, src, row, tw->cols);
                // FP8 checkpoints: each code times its scale in f32 (as ref_gemv), then to bf16
                if (sc) tsr_weight_scale_row(sc, r, tw->cols, row);
                for (int64_t c = 0; c < tw->cols; c++) dst[c] = tsr_f32_to_bf16(row[c]);
            }
        }
    }
    if (rc == TSR_OK) rc = cuda_err(g, cudaMemcpy(w->w, host, elems * 2, cudaMemcpyHostToDevice), "upload");
    free(host);
    free(row);
    if (rc != TSR_OK) {
        if (w->w) h->dev_free(g->ctx, w->w);
        h->free(g->ctx, w);
        return rc;
    }
    *out = w;
    return TSR_OK;
}

int g_prepare(void *inst, const tsr_weight *tw, void **out) {
    return make_weight(static_cast<Gemv *>(inst), tw, 1, out);
}

int g_prepare_group(void *inst, const tsr_weight *ws, int n, void **out) {
    if (n < 1) return TSR_ERR_INVALID;
    return make_weight(static_cast<Gemv *>(inst), ws, n, out);
}

void g_release(void *inst, void *prepared) {
    Gemv *g = static_cast<Gemv *>(inst);
    Weight *w = static_cast<Weight *>(prepared);
    if (!w) return;
    g->ctx->host->dev_free(g->ctx, w->w);
    g->ctx->host->free(g->ctx, w);
}

int g_run(void *inst, const void *prepared, int rows, const float *x, float *y, const tsr_exec *ex) {
    Gemv *g = static_cast<Gemv *>(inst);
    Weight *w = static_cast<Weight *>(const_cast<void *>(prepared));
    cudaStream_t st = static_cast<cudaStream_t>(ex->stream);
#ifdef CUDA_GEMV_DECODE
    /* x as it is (cuBLASLt below for rows the kernel cannot read: cols % 4) */
    if (decodes(g, w, rows, x)) return run_decode(g, w, rows, x, y, st, ex->pdl != 0);
#endif
    const size_t need = (size_t)rows * (size_t)w->ld;
    __nv_bfloat16 *xb = g->xb;
    if (ex->step) { // captured: the fixed scratch; nothing may be allocated
        if (need > g->graph_xb_elems) {
            g->ctx->host->set_error(g->ctx, "a captured pass of %d rows x %lld columns exceeds the scratch "
                                    "reserved at init", rows, (long long)w->cols);
            return TSR_ERR_UNSUPPORTED;
        }
        xb = g->graph_xb;
    } else {
        int rc = eager_xb(g, need, &xb);
        if (rc != TSR_OK) return rc;
    }
    if (tsr_cu_f32_to_bf16_pad(reinterpret_cast<uint16_t *>(xb), x, rows, (int)w->cols, (int)w->ld, st) != 0)
        return cuda_err(g, cudaGetLastError(), "activations to bf16");
    return run_lt(g, w, rows, xb, y, st, ex->step != nullptr);
}

int g_run_glu(void *inst, const void *prepared, int rows, const float *x, float *y, const tsr_exec *ex) {
#ifdef CUDA_GEMV_DECODE
    return run_glu(static_cast<Gemv *>(inst), static_cast<const Weight *>(prepared), rows, x, y,
                   static_cast<cudaStream_t>(ex->stream), ex->pdl != 0);
#else
    (void)inst, (void)prepared, (void)rows, (void)x, (void)y, (void)ex;
    return TSR_ERR_UNSUPPORTED; // the baseline: cuBLASLt, then the core's SiLU
#endif
}

int g_prepare_experts(void *inst, const void *const *prepared, int n, void **out) {
#ifdef CUDA_GEMV_DECODE
    return prepare_experts(static_cast<Gemv *>(inst), prepared, n, out);
#else
    (void)inst, (void)prepared, (void)n, (void)out;
    return TSR_ERR_UNSUPPORTED; // the baseline: the host looks experts up
#endif
}

void g_release_experts(void *inst, void *table) {
#ifdef CUDA_GEMV_DECODE
    Gemv *g = static_cast<Gemv *>(inst);
    Experts *t = static_cast<Experts *>(table);
    if (!t) return;
    g->ctx->host->dev_free(g->ctx, t->table);
    g->ctx->host->free(g->ctx, t);
#else
    (void)inst, (void)table;
#endif
}

int g_run_experts(void *inst, const void *table, const int32_t *sel, int k, int per_x, int glu, const float *x,
                  int ldx, float *y, const tsr_exec *ex) {
#ifdef CUDA_GEMV_DECODE
    return run_experts(static_cast<Gemv *>(inst), static_cast<const Experts *>(table), sel, k, per_x, glu, x, ldx, y,
                       static_cast<cudaStream_t>(ex->stream), ex->pdl != 0);
#else
    (void)inst, (void)table, (void)sel, (void)k, (void)per_x, (void)glu, (void)x, (void)ldx, (void)y, (void)ex;
    return TSR_ERR_UNSUPPORTED;
#endif
}

int g_run_grouped(void *inst, const void *table, const int32_t *off, int n, int glu, const float *x, int ldx,
                  float *y, const tsr_exec *ex) {
#ifdef CUDA_GEMV_DECODE
    if (ex->step) return TSR_ERR_UNSUPPORTED; // a captured pass: its scratch and tile list grow
    return run_grouped(static_cast<Gemv *>(inst), static_cast<const Experts *>(table), off, n, glu, x, ldx, y,
                       static_cast<cudaStream_t>(ex->stream));
#else
    (void)inst, (void)table, (void)off, (void)n, (void)glu, (void)x, (void)ldx, (void)y, (void)ex;
    return TSR_ERR_UNSUPPORTED; // the baseline: each expert through cuBLASLt in turn
#endif
}

int g_run_fused(void *inst, const void *prepared, int rows, const float *x, float *y, const tsr_gemv_fuse *fu,
                const tsr_exec *ex) {
#ifdef CUDA_GEMV_DECODE
    return run_fused(static_cast<Gemv *>(inst), static_cast<const Weight *>(prepared), rows, x, y, fu,
                     static_cast<cudaStream_t>(ex->stream), ex->pdl != 0);
#else
    (void)inst, (void)prepared, (void)rows, (void)x, (void)y, (void)fu, (void)ex;
    return TSR_ERR_UNSUPPORTED; // the baseline: the core's norm, cuBLASLt, the core's add
#endif
}

uint64_t g_bytes(void *inst, const void *prepared) {
    (void)inst;
    const Weight *w = static_cast<const Weight *>(prepared);
    return (uint64_t)w->rows * (uint64_t)w->ld * 2;
}

const tsr_gemv_i iface = {
    sizeof(tsr_gemv_i), TSR_GEMV_IFACE_VERSION, g_prepare, g_release, g_run, g_bytes, g_prepare_group, g_run_glu,
    g_prepare_experts, g_release_experts, g_run_experts, g_run_grouped, g_run_fused,
};

const tsr_plugin_desc desc = {
    TSR_ABI_MAJOR, TSR_ABI_MINOR, PLUGIN_NAME, TSR_SLOT_GEMV, "1.0.0", sizeof(Gemv),
    TSR_CAP_DEVICE_CUDA, g_init, g_fini, &iface,
};

} // namespace

extern "C" TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &desc; }
