/*
 * dtype.h - element types: sizes, block layouts, and conversion of stored
 * rows to f32. Knows nothing of plugins or files; used by core and plugins.
 */
#ifndef TSR_KERNELS_DTYPE_H
#define TSR_KERNELS_DTYPE_H

#include <stdint.h>

#include "../slots/tsr_plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "f32", "f16", "bf16", "f8_e4m3", "q8_0", "q4_0", "q4_k", "q6_k", "i8", "i32", "i64". */
const char *tsr_dtype_name(uint32_t dtype);
/* TSR_DTYPE_COUNT if unknown. */
uint32_t tsr_dtype_from_name(const char *name);

/* Elements per block (1 for plain types, 32 for Q8_0/Q4_0, 256 for K-quants)
 * and bytes per block. */
int tsr_dtype_block_elems(uint32_t dtype);
int tsr_dtype_block_bytes(uint32_t dtype);

/* Bytes of a row of n elements: 0 on success, -1 if n is not a multiple of
 * the block size, negative, or the size overflows. */
int tsr_dtype_row_bytes(uint32_t dtype, int64_t n, uint64_t *out);

/* Convert n elements (n a multiple of the block size) starting at src to
 * f32. Exact for every stored value. */
void tsr_dequant_row(uint32_t dtype, const void *src, float *dst, int64_t n);

/* One block of 256 f32 weights quantised into a Q4_K block (144 bytes:
 * per 32-weight sub-block a step (max - min) / 15 and an offset max(0, -min)
 * as 6-bit multiples of the block's f16 d and dmin, codes round((w + offset)
 * / step)) or a Q6_K block (210 bytes: per 16 weights a step max|w| / 31 as
 * an int8 multiple of the f16 d, codes round(w / step) + 32), in GGML's
 * layouts (what tsr_dequant_row reads). Plain min-max / absmax scales, not
 * llama.cpp's searched ones: for files that benchmark K-quant kernels. */
void tsr_quant_q4_k(const float *w, uint8_t *blk);
void tsr_quant_q6_k(const float *w, uint8_t *blk);

/* Scalar conversions. */
float tsr_f16_to_f32(uint16_t h);
uint16_t tsr_f32_to_f16(float f);   /* round to nearest even */
float tsr_bf16_to_f32(uint16_t h);
uint16_t tsr_f32_to_bf16(float f);  /* round to nearest even */
float tsr_f8e4m3_to_f32(uint8_t v);
/* float8_e4m3fn nearest to f, ties to even; magnitudes beyond 448 (and
 * infinities) saturate to +-448; NaN gives NaN (0x7f with f's sign). The
 * same as the CUDA cvt with __NV_SATFINITE. */
uint8_t tsr_f32_to_f8e4m3(float f);

#ifdef __cplusplus
}
#endif

#endif /* TSR_KERNELS_DTYPE_H */
