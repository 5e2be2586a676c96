/*
 * probe_cuda.h - the device's ceilings, measured with CUDA events: read
 * bandwidth of a streaming kernel over a buffer far larger than the L2,
 * and cuBLASLt matmul rates (bf16, and fp8 e4m3 where cuBLASLt offers it).
 * Each returns 0, or a negative tsr_status with why filled.
 */
#ifndef TSR_KERNELS_PROBE_CUDA_H
#define TSR_KERNELS_PROBE_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* GB/s (1e9 bytes): median, min and max over repeats passes. */
int tsr_cu_probe_read(size_t bytes, int repeats, double *median, double *min, double *max,
                      char *why, size_t why_size);
/* TFLOP/s of an n x n x n matmul: fp8 0 for bf16 inputs, 1 for e4m3 inputs
 * (both with f32 accumulation); median of repeats. */
int tsr_cu_probe_matmul(int n, int fp8, int repeats, double *tflops, char *why, size_t why_size);

#ifdef __cplusplus
}
#endif
#endif
