// silu.cuh - SiLU-and-multiply, the one definition shared by the core's
// activation kernels (ops.cu) and the gemv plugins' fused gate/up epilogue
// (gemv_row.cuh), so that a fused and an unfused pass give the same bits.
#ifndef TSR_CUDA_SILU_CUH
#define TSR_CUDA_SILU_CUH

// silu(g) * u = g / (1 + e^-g) * u (IEEE division; __expf, as every pass).
__device__ __forceinline__ float tsr_silu_mul(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

#endif // TSR_CUDA_SILU_CUH
