/*
 * cpu_features.h - what the CPU running us can execute, read once with
 * cpuid/xgetbv (gcc and clang alike; __builtin_cpu_supports does not know
 * "f16c" on every compiler).
 */
#ifndef TSR_KERNELS_CPU_FEATURES_H
#define TSR_KERNELS_CPU_FEATURES_H

/* 1 if AVX2, FMA and F16C are present and the OS saves the AVX state. */
int tsr_cpu_has_avx2_fma_f16c(void);
/* 1 if that and AVX-512F are present and the OS saves the opmask and ZMM
 * state. */
int tsr_cpu_has_avx512f(void);
/* 1 if the CPU (and OS) run AVX-512F and AVX-512BW. */
int tsr_cpu_has_avx512bw(void);
/* 1 if that and AVX512-VNNI are present. */
int tsr_cpu_has_avx512vnni(void);

#endif
