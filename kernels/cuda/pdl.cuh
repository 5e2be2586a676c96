// pdl.cuh - programmatic dependent launch (sm_90), shared by the core's
// kernels (ops.cu) and the CUDA plugins (runtime.pdl in an assembly).
//
// A kernel launched as a programmatic dependent of the kernel before it on
// its stream may start while that kernel is still running: its launch and
// block scheduling overlap the other's tail instead of following it. It
// must then wait (wait(), PTX griddepcontrol.wait: the kernel before has
// completed and its writes are visible) before it reads anything an earlier
// kernel wrote and before it writes anything an earlier kernel may still
// read. What depends on nothing (weights) may be loaded before: the
// tensor-core GEMV (gemv_mma.cuh) issues its first weight loads, the norms
// (ops.cu) load their weights and rope_k computes its first angles, the
// cluster attention kernel asks L2 for its keys and values (one-row
// passes), then each waits. (The one-row GEMV does not: its first loads
// before the wait, into registers, L2 or shared memory, made a pass slower.)
//
// The convention of every kernel on the forward pass: wait() before the
// first dependent access (and such reads never through the read-only path:
// load() below), trigger() (griddepcontrol.launch_dependents: the
// next kernel may launch once every block of this one has triggered or
// exited) right after, enter() for both at the top (gemv_mma triggers after
// its products, which measured faster). Both are no-ops in a kernel launched the ordinary
// way, so the kernels are the same whether runtime.pdl is on or off; only
// the launch attribute (launch() below) differs. A kernel launched without
// the attribute starts after the kernel before it completes, whatever that
// one did, so plugins that ignore tsr_exec.pdl stay correct.
#ifndef TSR_CUDA_PDL_CUH
#define TSR_CUDA_PDL_CUH

#include <cuda_runtime.h>

#include <utility>

namespace tsr_pdl {

__device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// 16 bytes an earlier kernel wrote (activations), read after wait(): an
// ordinary global load, never __ldg / ld.global.nc (nor a load the compiler
// turns into one, through const __restrict__). The non-coherent path is for
// data read-only over the kernel's whole life (ptxas may move such loads
// ahead of griddepcontrol.wait, and the read-only cache keeps no
// coherence), and a programmatic dependent lives while the kernel before it
// still writes. gemv_mma read its activations so, and in its 8-row bf16
// instances ptxas issued two of them before the wait (their SASS): those
// passes gave other logits with runtime.pdl on than off, a wrong token in
// speculative decoding (tests/gpu/test_cuda.c, test_pdl_passes_exact and
// test_drafting_greedy; BENCHMARKS.md, thirty-sixth session). Weights and
// other constants keep the read-only path.
__device__ __forceinline__ float4 load(const float *p) { return *reinterpret_cast<const float4 *>(p); }

// The start of a kernel that touches nothing before the kernel before it is
// done: wait for it, then let the next one launch.
__device__ __forceinline__ void enter() {
    wait();
    trigger();
}

// kernel<<<grid, block, smem, st>>>(args...) in thread-block clusters of
// cluster blocks (none when cluster is null), as a programmatic dependent
// of the kernel before it when pdl; returns the launch's status.
template <typename... KArgs, typename... Args>
inline cudaError_t launch_ex(void (*kernel)(KArgs...), dim3 grid, dim3 block, const dim3 *cluster, size_t smem,
                             cudaStream_t st, bool pdl, Args &&...args) {
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    if (cluster) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = cluster->x, at[n].val.clusterDim.y = cluster->y, at[n].val.clusterDim.z = cluster->z;
        n++;
    }
    if (pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = st;
    cfg.attrs = at, cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// kernel<<<grid, block, smem, st>>>(args...), as a programmatic dependent
// of the kernel before it when pdl.
template <typename... KArgs, typename... Args>
inline cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, bool pdl,
                          Args &&...args) {
    return launch_ex(kernel, grid, block, nullptr, smem, st, pdl, std::forward<Args>(args)...);
}

} // namespace tsr_pdl

#endif // TSR_CUDA_PDL_CUH
