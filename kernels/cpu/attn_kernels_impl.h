/*
 * attn_kernels_impl.h - what attn_kernels.c (portable path, dispatch),
 * attn_kernels_avx2.c (built with -mavx2 -mfma -mf16c) and
 * attn_kernels_avx512.c (with -mavx512f besides) share. Private to
 * kernels/cpu.
 */
#ifndef TSR_KERNELS_CPU_ATTN_KERNELS_IMPL_H
#define TSR_KERNELS_CPU_ATTN_KERNELS_IMPL_H

#include "attn_kernels.h"

/* Tokens per block of the online softmax (scores of a block stay in L1). */
#define TSR_ATTN_BLOCK 64

#if defined(__x86_64__) || defined(__i386__)
#define TSR_ATTN_HAVE_AVX2_BUILD 1
void tsr_attn_tile_run_avx2(tsr_attn_tile *t, const tsr_attn_kv *kv, int head_dim, float scale,
                            int t0, int t1);
void tsr_attn_store_f16_avx2(uint16_t *dst, const float *src, int64_t n);
void tsr_attn_quant_i8_avx2(int8_t *dst, float *scale, const float *src, int64_t n);
#define TSR_ATTN_HAVE_AVX512_BUILD 1
/* 0 (nothing done) where head_dim is not a multiple of 16 or above 256. */
int tsr_attn_tile_run_avx512(tsr_attn_tile *t, const tsr_attn_kv *kv, int head_dim, float scale,
                             int t0, int t1);
#endif

#endif /* TSR_KERNELS_CPU_ATTN_KERNELS_IMPL_H */
