/*
 * gpu_env.h - where a GPU test runs: the source tree (TESSERA_SOURCE_DIR,
 * "." when unset) and whether a CUDA device is there (0 in a build without
 * CUDA). Every GPU test skips cleanly when gpu_have() is 0.
 */
#ifndef TSR_TESTS_GPU_ENV_H
#define TSR_TESTS_GPU_ENV_H

#include <stdio.h>
#include <stdlib.h>

#ifdef TESSERA_CUDA
#include "core/cuda/device.h"
#endif

static inline const char *gpu_src_dir(void) {
    const char *s = getenv("TESSERA_SOURCE_DIR");
    return s ? s : ".";
}

static inline int gpu_have(void) {
#ifdef TESSERA_CUDA
    return tsr_cuda_device_count() > 0;
#else
    return 0;
#endif
}

/* In a cmocka test (a macro: skip() is cmocka's): where there is no CUDA
 * device, print "# no CUDA device: WHAT skipped" (printf-style) and skip. */
#define GPU_REQUIRE(...)                                                                                           \
    do {                                                                                                           \
        if (!gpu_have()) {                                                                                         \
            printf("# no CUDA device: ");                                                                          \
            printf(__VA_ARGS__);                                                                                   \
            printf(" skipped\n");                                                                                  \
            skip();                                                                                                \
        }                                                                                                          \
    } while (0)

/* gpu_have() and device 0 initialised (once), for tests that call the
 * backend or the kernels directly */
static inline int gpu_ready(void) {
#ifdef TESSERA_CUDA
    static int ok = -1;
    if (ok < 0) {
        tsr_error err;
        tsr_error_clear(&err);
        ok = gpu_have() && tsr_cuda_init(0, &err) == TSR_OK;
    }
    return ok;
#else
    return 0;
#endif
}

#endif /* TSR_TESTS_GPU_ENV_H */
