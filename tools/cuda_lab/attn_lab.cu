// attn_lab - times cuda_attention's split-K decode kernel on the device the
// way a decode token runs it: 32 layers' launches captured into one CUDA
// graph, each layer its own K/V (so that L2 holds none of them), Llama-3-8B
// heads (32 query heads, 8 KV heads, head_dim 128). Not part of the engine:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -DCUDA_ATTN_SPLIT -o attn_lab \
//     tools/cuda_lab/attn_lab.cu plugins/cuda_attention/prefill.cu && ./attn_lab
// Prints the latency of a dependent load (L2, HBM), then microseconds per
// layer of the split-K decode kernel by rows, keys, splits and merge (in the
// last block, or a second kernel), and of the tensor-core kernel by rows,
// keys and key splits, against a graph of 32 empty kernels. ATTN_LAB_PACKED=1:
// the packed verification kernel (packed.cuh) against the cluster kernel only.
#include "plugins/cuda_attention/cuda_attention.cu"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "tools/cuda_lab/lab_check.cuh"

constexpr int kLayers = 32, kCtx = 2048, kKv = 8, kHeads = 32, kHd = 128;

__global__ void fill_bf16(__nv_bfloat16 *p, size_t n, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        p[i] = __float2bfloat16(((int)(h % 2001) - 1000) / 1000.0f);
    }
}
__global__ void empty_kernel() {}
__global__ void fill_q(float *q, int n, uint32_t seed) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        q[i] = ((int)(h % 2001) - 1000) / 1000.0f;
    }
}

// Layer l's view of the pool kv (K then V per layer, keys tokens held) and
// the attention of rows query rows at its end.
static void layer_args(const __nv_bfloat16 *kv, int l, int keys, int rows, const float *q, float *out, tsr_kv_view *v,
                       tsr_attn_args *x) {
    const size_t per = (size_t)kCtx * kKv * kHd;
    *v = tsr_kv_view{};
    v->dtype = TSR_DTYPE_BF16, v->layout = TSR_KV_CONTIGUOUS, v->n_tokens = keys;
    v->n_kv_heads = kKv, v->head_dim = kHd;
    v->k = kv + 2 * per * l, v->v = kv + 2 * per * l + per;
    v->token_stride = kKv * kHd, v->head_stride = kHd;
    *x = tsr_attn_args{};
    x->rows = rows, x->pos0 = keys - rows, x->n_heads = kHeads, x->n_kv_heads = kKv, x->head_dim = kHd;
    x->scale = 0.088f, x->q = q, x->kv = v, x->out = out;
}

// One thread following a chain of dependent loads: the latency of a load.
__global__ void chase_kernel(const unsigned *next, unsigned start, int steps, unsigned *out, long long *ns) {
    unsigned i = start;
    long long t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (int s = 0; s < steps; s++) i = __ldcg(next + i);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    *out = i;
    *ns = t1 - t0;
}
__global__ void chain_init(unsigned *next, size_t n, unsigned stride) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        next[i] = (unsigned)((i + stride) % n);
}
static void chase(cudaStream_t st, size_t bytes, unsigned stride_words, const char *what) {
    unsigned *next, *out;
    long long *ns, h;
    const size_t n = bytes / 4;
    CK(cudaMalloc(&next, bytes));
    CK(cudaMalloc(&out, 4));
    CK(cudaMalloc(&ns, 8));
    chain_init<<<1024, 256, 0, st>>>(next, n, stride_words);
    chase_kernel<<<1, 1, 0, st>>>(next, 0, 2000, out, ns); // warm (L2: the same lines follow)
    chase_kernel<<<1, 1, 0, st>>>(next, bytes > (64u << 20) ? (unsigned)(n / 2 + 7) : 0, 2000, out, ns);
    CK(cudaMemcpyAsync(&h, ns, 8, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    printf("dependent load, %s: %.0f ns\n", what, h / 2000.0);
    cudaFree(next), cudaFree(out), cudaFree(ns);
}

static float graph_us(cudaStream_t st, cudaGraph_t g) { // per replay, median of 7 x 10
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    float t[7];
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    for (int r = 0; r < 7; r++) {
        CK(cudaEventRecord(a, st));
        for (int i = 0; i < 10; i++) CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        cudaEventElapsedTime(&t[r], a, b);
        t[r] *= 100.0f; // us per replay
    }
    for (int i = 0; i < 7; i++)
        for (int j = i + 1; j < 7; j++)
            if (t[j] < t[i]) { float u = t[i]; t[i] = t[j]; t[j] = u; }
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
    cudaEventDestroy(a), cudaEventDestroy(b);
    return t[3];
}

// Microseconds per layer of launch(x, v) issued for each of the 32 layers
// (rows query rows at the end of keys keys), captured into one graph.
template <typename F>
static float layers_us(cudaStream_t st, const __nv_bfloat16 *kv, int keys, int rows, const float *q, float *out,
                       int32_t *pos, F launch) {
    const int p0 = keys - rows;
    CK(cudaMemcpy(pos, &p0, 4, cudaMemcpyHostToDevice));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < kLayers; l++) {
        tsr_kv_view v;
        tsr_attn_args x;
        layer_args(kv, l, keys, rows, q, out, &v, &x);
        launch(&x, &v);
    }
    CK(cudaStreamEndCapture(st, &g));
    return graph_us(st, g) / kLayers;
}

// Layer 0's attention of rows rows after keys keys (q random) through
// first(x, v) then second(x, v): prints the largest |difference| of their
// outputs (and the largest output), then clears q again.
template <typename A, typename B>
static void print_diff(cudaStream_t st, const __nv_bfloat16 *kv, int keys, int rows, float *q, float *out,
                       int32_t *pos, A first, B second) {
    tsr_kv_view v;
    tsr_attn_args x;
    fill_q<<<64, 256, 0, st>>>(q, rows * kHeads * kHd, 7);
    layer_args(kv, 0, keys, rows, q, out, &v, &x);
    const int p0 = keys - rows;
    CK(cudaMemcpy(pos, &p0, 4, cudaMemcpyHostToDevice));
    std::vector<float> a((size_t)rows * kHeads * kHd), b(a.size());
    first(&x, &v);
    CK(cudaMemcpyAsync(a.data(), out, a.size() * 4, cudaMemcpyDeviceToHost, st));
    second(&x, &v);
    CK(cudaMemcpyAsync(b.data(), out, b.size() * 4, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    double worst = 0, big = 0;
    for (size_t i = 0; i < a.size(); i++) worst = fmax(worst, fabs(a[i] - b[i])), big = fmax(big, fabs(a[i]));
    printf(" | %.2g (of %.2g)\n", worst, big);
    CK(cudaMemset(q, 0, 16 * kHeads * kHd * 4));
}

int main(void) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const size_t per = (size_t)kCtx * kKv * kHd;
    __nv_bfloat16 *kv;
    CK(cudaMalloc(&kv, 2 * per * kLayers * sizeof *kv));
    fill_bf16<<<4096, 256, 0, st>>>(kv, 2 * per * kLayers, 3);
    float *q, *out, *part;
    unsigned *count;
    int32_t *pos;
    CK(cudaMalloc(&q, 16 * kHeads * kHd * 4));
    CK(cudaMalloc(&out, 16 * kHeads * kHd * 4));
    CK(cudaMalloc(&part, (size_t)16 * kHeads * 256 * (2 + kHd) * 4));
    CK(cudaMalloc(&count, 8 * kKv * 4));
    CK(cudaMalloc(&pos, 4));
    CK(cudaMemset(q, 0, 16 * kHeads * kHd * 4));
    CK(cudaMemset(count, 0, 8 * kKv * 4));
    CK(cudaStreamSynchronize(st));
    {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < kLayers; l++) empty_kernel<<<1, 32, 0, st>>>();
        CK(cudaStreamEndCapture(st, &g));
        printf("32 empty kernels: %.2f us per layer\n", graph_us(st, g) / kLayers);
    }
    chase(st, 4 << 20, 1024 + 32, "4 MB (L2)");
    chase(st, (size_t)1 << 30, (1u << 20) + 1040, "1 GB, ~4 MB strides, lines not touched before (HBM)");
    if (getenv("ATTN_LAB_NCU")) { // a few eager launches for ncu: packed and cluster at 1 and 8 rows, 160 / 512 keys
        tsr_kv_view v;
        tsr_attn_args x;
        for (int rows : {1, 8})
            for (int keys : {160, 512}) {
                layer_args(kv, 0, keys, rows, q, out, &v, &x);
                for (int i = 0; i < 3; i++) CK(cuda_attn::launch_packed(8, st, false, &x, &v, nullptr));
                for (int i = 0; i < 3; i++)
                    CK((launch_cluster<false, false>(16 / rows > 8 ? 8 : 16 / rows, st, false, &x, &v, kHeads / kKv,
                                                     nullptr)));
            }
        CK(cudaStreamSynchronize(st));
        return 0;
    }
    if (getenv("ATTN_LAB_PACKED")) { // the packed kernel only
        printf("packed kernel (packed.cuh: rows x group on the tensor cores): rows keys | us per layer with 2, 4, 8 "
               "splits | 8 splits as programmatic dependents | cluster kernel (16 / rows splits, PDL) | max |diff| "
               "against the cluster kernel\n");
        for (int rows : {1, 2, 4, 8})
            for (int keys : {160, 512, 768, 2048}) {
                printf("%d %4d", rows, keys);
                for (int mode = 0; mode < 5; mode++) {
                    const int splits = mode == 0 ? 2 : mode == 1 ? 4 : 8;
                    printf(" | %6.2f", layers_us(st, kv, keys, rows, q, out, pos, [&](tsr_attn_args *x, tsr_kv_view *v) {
                               if (mode == 4)
                                   CK((launch_cluster<false, false>(16 / rows > 8 ? 8 : 16 / rows, st, true, x, v,
                                                                    kHeads / kKv, pos)));
                               else
                                   CK(cuda_attn::launch_packed(splits, st, mode == 3, x, v, pos));
                           }));
                }
                print_diff(
                    st, kv, keys, rows, q, out, pos,
                    [&](tsr_attn_args *x, tsr_kv_view *v) {
                        CK((launch_cluster<false, false>(8, st, false, x, v, kHeads / kKv, pos)));
                    },
                    [&](tsr_attn_args *x, tsr_kv_view *v) { CK(cuda_attn::launch_packed(8, st, false, x, v, pos)); });
            }
        return 0;
    }
    printf("us per layer (32 layers in one graph): rows keys splits | merge in last block | merge kernel | "
           "partials only (no merge) | merge in last block, as programmatic dependents\n");
    for (int rows : {1, 2, 4, 8})
        for (int keys : {512, 768})
            for (int splits : {8, 16, 32, 64}) {
                if (rows > 2 && splits == 64) continue;
                printf("%d %4d %3d", rows, keys, splits);
                for (int mode = 0; mode < 4; mode++) // fused merge, merge kernel, neither, fused + PDL
                    printf(" | %6.2f", layers_us(st, kv, keys, rows, q, out, pos, [&](tsr_attn_args *x, tsr_kv_view *v) {
                               const bool fused = mode == 0 || mode == 3;
                               CK((launch_split<false, false>(dim3(rows * kKv, splits), 32 * (kHeads / kKv), st,
                                                             mode == 3, x, v, part, fused ? count : nullptr,
                                                             kHeads / kKv, true, pos, true, 0, splits)));
                               if (mode == 1)
                                   CK(cuda_attn::launch_merge(part, out, rows * kHeads, kHd, splits, st, false));
                           }));
                printf("\n");
            }
    printf("cluster kernel (splits merged through distributed shared memory): rows keys | us per layer with 2, 4, "
           "8 splits | 8 splits as programmatic dependents | max |diff| against the split kernel\n");
    for (int rows : {1, 2, 4, 8})
        for (int keys : {512, 768, 2048}) {
            printf("%d %4d", rows, keys);
            for (int mode = 0; mode < 4; mode++) {
                const int splits = mode == 0 ? 2 : mode == 1 ? 4 : 8;
                printf(" | %6.2f", layers_us(st, kv, keys, rows, q, out, pos, [&](tsr_attn_args *x, tsr_kv_view *v) {
                           CK((launch_cluster<false, false>(splits, st, mode == 3, x, v, kHeads / kKv, pos)));
                       }));
            }
            // correctness: layer 0 through both kernels, q random
            print_diff(
                st, kv, keys, rows, q, out, pos,
                [&](tsr_attn_args *x, tsr_kv_view *v) {
                    CK((launch_split<false, false>(dim3(rows * kKv, 16), 32 * (kHeads / kKv), st, false, x, v, part,
                                                  count, kHeads / kKv, true, pos, true, 0, 16)));
                },
                [&](tsr_attn_args *x, tsr_kv_view *v) {
                    CK((launch_cluster<false, false>(8, st, false, x, v, kHeads / kKv, pos)));
                });
        }
    printf("tensor-core kernel (prefill.cu, captured with the position on the device): rows keys | us per layer "
           "with 1, 2, 4, 8, 16 key splits\n");
    for (int rows : {3, 8, 16})
        for (int keys : {512, 768}) {
          printf("%2d %4d", rows, keys);
          for (int splits : {1, 2, 4, 8, 16}) {
            printf(" | %6.2f", layers_us(st, kv, keys, rows, q, out, pos, [&](tsr_attn_args *x, tsr_kv_view *) {
                       CK(static_cast<cudaError_t>(cuda_attn_prefill_split(x, pos, part, splits, 0, st)));
                   }));
          }
          printf("\n");
        }
    CK(cudaGetLastError());
    return 0;
}
