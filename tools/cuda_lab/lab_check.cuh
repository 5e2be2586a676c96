// lab_check.cuh - the labs' check of a CUDA call: print where and why, exit 1.
#ifndef TSR_LAB_CHECK_CUH
#define TSR_LAB_CHECK_CUH

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                             \
    do {                                                                                                  \
        cudaError_t e_ = (x);                                                                             \
        if (e_ != cudaSuccess) {                                                                          \
            printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                             \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

#endif // TSR_LAB_CHECK_CUH
