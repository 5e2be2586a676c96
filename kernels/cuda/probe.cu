// Device ceilings for `tessera probe`: a streaming read kernel and cuBLASLt
// matmuls, timed with CUDA events.
#include <algorithm>
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include "probe_cuda.h"

namespace {

// Each thread sums 16-byte loads, four in flight; the sum is written only
// if it is a value no input produces, so the loads cannot be removed.
__global__ void read_k(const uint4 *p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) acc ^= p[i].x ^ p[i].y ^ p[i].z ^ p[i].w;
    if (acc == 0x9e3779b9u) *sink = acc;
}

int fail(char *why, size_t size, const char *what, cudaError_t e) {
    snprintf(why, size, "%s: %s", what, cudaGetErrorString(e));
    return -10; // TSR_ERR_DEVICE
}

double median_of(double *v, int n) {
    std::sort(v, v + n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

} // namespace

extern "C" int tsr_cu_probe_read(size_t bytes, int repeats, double *median, double *min, double *max,
                                 char *why, size_t why_size) {
    if (repeats < 1 || repeats > 64) repeats = 5;
    uint4 *buf = nullptr;
    unsigned *sink = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    double t[64];
    int dev = 0, sms = 0;
    cudaError_t e = cudaMalloc(&buf, bytes);
    if (e == cudaSuccess) e = cudaMalloc(&sink, sizeof *sink);
    if (e == cudaSuccess) e = cudaMemset(buf, 1, bytes);
    if (e == cudaSuccess) e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaEventCreate(&e0);
    if (e == cudaSuccess) e = cudaEventCreate(&e1);
    const size_t n = bytes / sizeof(uint4);
    for (int r = -1; e == cudaSuccess && r < repeats; r++) { // one untimed pass
        cudaEventRecord(e0);
        read_k<<<sms * 8, 512>>>(buf, n, sink);
        cudaEventRecord(e1);
        e = cudaEventSynchronize(e1);
        float ms = 0;
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0, e1);
        if (r >= 0) t[r] = (double)bytes / (ms * 1e-3) / 1e9;
    }
    int rc = e == cudaSuccess ? 0 : fail(why, why_size, "read probe", e);
    if (rc == 0) {
        *min = *std::min_element(t, t + repeats);
        *max = *std::max_element(t, t + repeats);
        *median = median_of(t, repeats);
    }
    cudaFree(buf);
    cudaFree(sink);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return rc;
}

extern "C" int tsr_cu_probe_matmul(int n, int fp8, int repeats, double *tflops, char *why,
                                   size_t why_size) {
    if (repeats < 1 || repeats > 64) repeats = 5;
    const cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    const size_t esz = fp8 ? 1 : 2, ws_bytes = 64u << 20;
    void *a = nullptr, *b = nullptr, *d = nullptr, *ws = nullptr;
    cublasLtHandle_t lt = nullptr;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    double t[64];
    int rc = 0;
    cudaError_t e = cudaMalloc(&a, (size_t)n * n * esz);
    if (e == cudaSuccess) e = cudaMalloc(&b, (size_t)n * n * esz);
    if (e == cudaSuccess) e = cudaMalloc(&d, (size_t)n * n * 2);
    if (e == cudaSuccess) e = cudaMalloc(&ws, ws_bytes);
    if (e == cudaSuccess) e = cudaMemset(a, 0x3a, (size_t)n * n * esz); // small finite values
    if (e == cudaSuccess) e = cudaMemset(b, 0x3a, (size_t)n * n * esz);
    if (e == cudaSuccess) e = cudaEventCreate(&e0);
    if (e == cudaSuccess) e = cudaEventCreate(&e1);
    if (e != cudaSuccess) rc = fail(why, why_size, "matmul probe", e);
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N; // the "TN" layout fp8 requires
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (rc == 0 &&
        (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS ||
         cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS ||
         cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) != CUBLAS_STATUS_SUCCESS ||
         cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) != CUBLAS_STATUS_SUCCESS ||
         cublasLtMatrixLayoutCreate(&la, in, n, n, n) != CUBLAS_STATUS_SUCCESS ||
         cublasLtMatrixLayoutCreate(&lb, in, n, n, n) != CUBLAS_STATUS_SUCCESS ||
         cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, n, n) != CUBLAS_STATUS_SUCCESS ||
         cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS ||
         cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                              sizeof ws_bytes) != CUBLAS_STATUS_SUCCESS ||
         cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &res, &found) != CUBLAS_STATUS_SUCCESS ||
         found == 0)) {
        snprintf(why, why_size, "cuBLASLt offers no %s matmul here", fp8 ? "fp8 e4m3" : "bf16");
        rc = -5; // TSR_ERR_UNSUPPORTED
    }
    const float one = 1.0f, zero = 0.0f;
    for (int r = -1; rc == 0 && r < repeats; r++) { // one untimed call
        cudaEventRecord(e0);
        cublasStatus_t s = cublasLtMatmul(lt, op, &one, a, la, b, lb, &zero, d, ld, d, ld, &res.algo, ws,
                                          ws_bytes, 0);
        cudaEventRecord(e1);
        e = cudaEventSynchronize(e1);
        float ms = 0;
        if (s != CUBLAS_STATUS_SUCCESS) {
            snprintf(why, why_size, "cublasLtMatmul: status %d", (int)s);
            rc = -10;
        } else if (e != cudaSuccess || (e = cudaEventElapsedTime(&ms, e0, e1)) != cudaSuccess) {
            rc = fail(why, why_size, "matmul probe", e);
        } else if (r >= 0) {
            t[r] = 2.0 * n * (double)n * n / (ms * 1e-3) / 1e12;
        }
    }
    if (rc == 0) *tflops = median_of(t, repeats);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (op) cublasLtMatmulDescDestroy(op);
    if (lt) cublasLtDestroy(lt);
    cudaFree(a), cudaFree(b), cudaFree(d), cudaFree(ws);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return rc;
}
