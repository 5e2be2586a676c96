#include "device.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

static uint64_t allocated;
static int sticky;
static cudaStream_t stream; /* the engine stream */

static int status_of(cudaError_t e, const char *what, tsr_error *err) {
    if (e == cudaSuccess) return TSR_OK;
    /* errors that leave the context unusable */
    if (e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure || e == cudaErrorAssert ||
        e == cudaErrorHardwareStackError || e == cudaErrorIllegalInstruction ||
        e == cudaErrorMisalignedAddress || e == cudaErrorInvalidPc || e == cudaErrorECCUncorrectable)
        sticky = 1;
    return tsr_error_set(err, e == cudaErrorMemoryAllocation ? TSR_ERR_NOMEM : TSR_ERR_DEVICE,
                         "%s: CUDA error %d (%s)%s", what, (int)e, cudaGetErrorString(e),
                         sticky ? "; the device context is lost" : "");
}

int tsr_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: not an error here */
        return 0;
    }
    return n;
}

int tsr_cuda_init(int device_id, tsr_error *err) {
    int n = tsr_cuda_device_count();
    if (device_id < 0 || device_id >= n)
        return tsr_error_set(err, TSR_ERR_DEVICE, "CUDA device %d requested, %d present", device_id, n);
    int rc = status_of(cudaSetDevice(device_id), "cudaSetDevice", err);
    if (rc == TSR_OK) rc = status_of(cudaFree(0), "creating the CUDA context", err);
    if (rc == TSR_OK && !stream) rc = status_of(cudaStreamCreate(&stream), "cudaStreamCreate", err);
    return rc;
}

void tsr_cuda_describe(char *buf, size_t size) {
    int dev = 0, drv = 0;
    struct cudaDeviceProp p;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        cudaGetLastError();
        snprintf(buf, size, "no CUDA device");
        return;
    }
    cudaDriverGetVersion(&drv);
    snprintf(buf, size, "%s, %d SMs, %.1f GiB, compute %d.%d, driver %d.%d", p.name,
             p.multiProcessorCount, (double)p.totalGlobalMem / (1u << 30), p.major, p.minor,
             drv / 1000, (drv % 1000) / 10);
}

/* A header before each block records its size for the accounting. */
typedef struct blk {
    uint64_t bytes;
    uint64_t pad;
} blk;

void *tsr_cuda_malloc(size_t bytes, tsr_error *err) {
    void *p = NULL;
    size_t total = bytes + 256; /* keep 256-byte alignment for the caller */
    if (status_of(cudaMalloc(&p, total), "cudaMalloc", err) != TSR_OK) return NULL;
    if (status_of(cudaMemset(p, 0, total), "cudaMemset", err) != TSR_OK) {
        cudaFree(p);
        return NULL;
    }
    blk h = {bytes, 0};
    if (status_of(cudaMemcpy(p, &h, sizeof h, cudaMemcpyHostToDevice), "cudaMemcpy", err) != TSR_OK) {
        cudaFree(p);
        return NULL;
    }
    __atomic_add_fetch(&allocated, bytes, __ATOMIC_RELAXED);
    return (char *)p + 256;
}

void tsr_cuda_free(void *p) {
    if (!p) return;
    char *base = (char *)p - 256;
    blk h;
    if (cudaMemcpy(&h, base, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess)
        __atomic_sub_fetch(&allocated, h.bytes, __ATOMIC_RELAXED);
    cudaFree(base);
}

uint64_t tsr_cuda_bytes_allocated(void) { return __atomic_load_n(&allocated, __ATOMIC_RELAXED); }

void *tsr_cuda_stream(void) { return stream; }

void *tsr_cuda_host_alloc(size_t bytes, tsr_error *err) {
    void *p = NULL;
    if (status_of(cudaMallocHost(&p, bytes ? bytes : 1), "cudaMallocHost", err) != TSR_OK) return NULL;
    memset(p, 0, bytes);
    return p;
}

void tsr_cuda_host_free(void *p) {
    if (p) cudaFreeHost(p);
}

int tsr_cuda_upload_async(void *dst, const void *src, size_t bytes, tsr_error *err) {
    return status_of(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream), "upload", err);
}

int tsr_cuda_download_async(void *dst, const void *src, size_t bytes, tsr_error *err) {
    return status_of(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream), "download", err);
}

int tsr_cuda_copy_async(void *dst, const void *src, size_t bytes, tsr_error *err) {
    return status_of(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "device copy", err);
}

int tsr_cuda_upload(void *dst, const void *src, size_t bytes, tsr_error *err) {
    int rc = tsr_cuda_upload_async(dst, src, bytes, err);
    return rc == TSR_OK ? tsr_cuda_sync(err) : rc;
}

int tsr_cuda_download(void *dst, const void *src, size_t bytes, tsr_error *err) {
    int rc = tsr_cuda_download_async(dst, src, bytes, err);
    return rc == TSR_OK ? tsr_cuda_sync(err) : rc;
}

int tsr_cuda_sync(tsr_error *err) {
    return status_of(cudaStreamSynchronize(stream), "device synchronise", err);
}

int tsr_cuda_capture_begin(tsr_error *err) {
    return status_of(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                     "beginning a graph capture", err);
}

int tsr_cuda_capture_end(void **graph, tsr_error *err) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    *graph = NULL;
    int rc = status_of(cudaStreamEndCapture(stream, &g), "ending a graph capture", err);
    if (rc == TSR_OK) rc = status_of(cudaGraphInstantiate(&ge, g, 0), "instantiating a graph", err);
    if (g) cudaGraphDestroy(g);
    if (rc == TSR_OK) *graph = ge;
    return rc;
}

int tsr_cuda_graph_launch(void *graph, tsr_error *err) {
    return status_of(cudaGraphLaunch((cudaGraphExec_t)graph, stream), "launching a graph", err);
}

void tsr_cuda_graph_free(void *graph) {
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

void *tsr_cuda_event_new(tsr_error *err) {
    cudaEvent_t ev = NULL;
    if (status_of(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "creating an event", err) != TSR_OK)
        return NULL;
    return ev;
}

int tsr_cuda_event_record(void *ev, tsr_error *err) {
    return status_of(cudaEventRecord((cudaEvent_t)ev, stream), "recording an event", err);
}

int tsr_cuda_event_wait(void *ev, tsr_error *err) {
    return status_of(cudaEventSynchronize((cudaEvent_t)ev), "waiting for an event", err);
}

void tsr_cuda_event_free(void *ev) {
    if (ev) cudaEventDestroy((cudaEvent_t)ev);
}

int tsr_cuda_check(int rc, const char *what, tsr_error *err) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return status_of(e, what, err);
    if (rc != 0) return tsr_error_set(err, rc, "%s: %s", what, tsr_status_str(rc));
    return TSR_OK;
}

int tsr_cuda_failed(void) { return sticky; }
