/*
 * gemv_cpu.c - dispatch, the portable path, row widening and int8 row
 * quantisation. The AVX2 path lives in gemv_avx2.c (built with its own flags).
 */
#include "gemv_cpu.h"
#include "ops.h"
#include "cpu_features.h"

#include <math.h>
#include <string.h>

#include "../dtype.h"

#define CHUNK 256 /* elements decoded at once: a multiple of every block size */
#define GROUP 8   /* input rows accumulated together on the portable path */

int tsr_gemv_dtype_supported(uint32_t dtype) {
    return dtype < TSR_DTYPE_COUNT && dtype != TSR_DTYPE_I32 && dtype != TSR_DTYPE_I64;
}

const char *tsr_gemv_isa_name(tsr_gemv_isa isa) {
    switch (isa) {
    case TSR_GEMV_ISA_PORTABLE: return "portable";
    case TSR_GEMV_ISA_AVX2: return "avx2";
    case TSR_GEMV_ISA_AVX512: return "avx512";
    default: return "unknown";
    }
}

int tsr_gemv_isa_runs(tsr_gemv_isa isa) {
    switch (isa) {
    case TSR_GEMV_ISA_PORTABLE: return 1;
#if defined(__x86_64__) || defined(__i386__)
    case TSR_GEMV_ISA_AVX2:
        return tsr_cpu_has_avx2_fma_f16c();
    case TSR_GEMV_ISA_AVX512:
        return tsr_cpu_has_avx512f();
#endif
    default: return 0;
    }
}

tsr_gemv_isa tsr_gemv_isa_best(void) {
    static int best = -1; /* benign race: every thread computes the same value */
    if (best < 0)
        best = tsr_gemv_isa_runs(TSR_GEMV_ISA_AVX512) ? TSR_GEMV_ISA_AVX512
               : tsr_gemv_isa_runs(TSR_GEMV_ISA_AVX2) ? TSR_GEMV_ISA_AVX2
                                                       : TSR_GEMV_ISA_PORTABLE;
    return (tsr_gemv_isa)best;
}

/* The ISA of the GEMV kernels for isa: AVX-512 has its GEMM tile and the
 * 8-bit decode kernels of gemv_avx2.c's AVX-512 section (tsr_gemv_rows_avx512
 * hands the other dtypes to the AVX2 ones); the paths it lacks are AVX2's. */
static tsr_gemv_isa kernel_isa(tsr_gemv_isa isa) { return isa == TSR_GEMV_ISA_AVX512 ? TSR_GEMV_ISA_AVX2 : isa; }

/* 1 if isa is AVX-512 and the CPU has the BW instructions its decode
 * kernels use (every AVX-512 CPU but the Xeon Phi); else the AVX2 ones run. */
static int avx512_kernels(tsr_gemv_isa isa) {
#if defined(__x86_64__)
    return isa == TSR_GEMV_ISA_AVX512 && tsr_cpu_has_avx512bw();
#else
    (void)isa;
    return 0;
#endif
}

tsr_gemv_kernel_fn tsr_gemv_kernel(tsr_gemv_isa isa) {
    if (avx512_kernels(isa)) return tsr_gemv_rows_avx512;
    switch (kernel_isa(isa)) {
    case TSR_GEMV_ISA_PORTABLE: return tsr_gemv_rows_portable;
#if defined(__x86_64__)
    case TSR_GEMV_ISA_AVX2: return tsr_gemv_rows_avx2;
#endif
    default: return NULL;
    }
}

/* Pointer and element count of chunk [c, c + n) of a stored row. */
static const uint8_t *chunk_ptr(uint32_t dtype, const uint8_t *row, int64_t c) {
    return row + (uint64_t)(c / tsr_dtype_block_elems(dtype)) * (uint64_t)tsr_dtype_block_bytes(dtype);
}

void tsr_gemv_rows_portable(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int64_t r1) {
    float buf[CHUNK];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = a->w + (uint64_t)r * a->row_bytes;
        float rs = tsr_gemv_row_scaled(dtype) && a->scale ? a->scale[r] : 1.0f;
        for (int g = 0; g < a->nx; g += GROUP) {
            int ng = a->nx - g < GROUP ? a->nx - g : GROUP;
            float acc[GROUP][8];
            memset(acc, 0, sizeof acc);
            for (int64_t c = 0; c < a->cols; c += CHUNK) {
                int64_t n = a->cols - c < CHUNK ? a->cols - c : CHUNK;
                const float *wv = buf;
                if (dtype == TSR_DTYPE_F32)
                    memcpy(buf, row + (uint64_t)c * 4, (size_t)n * 4); /* row may be unaligned */
                else
                    tsr_dequant_row(dtype, chunk_ptr(dtype, row, c), buf, n);
                if (a->cscale) tsr_gemv_apply_cscale(a, r, c, n, buf); /* the row scale: on the sums below */
                for (int i = 0; i < ng; i++) {
                    const float *x = a->x + (int64_t)(g + i) * a->ldx + c;
                    for (int64_t k = 0; k < n; k++) acc[i][k & 7] += wv[k] * x[k];
                }
            }
            for (int i = 0; i < ng; i++) {
                float s = ((acc[i][0] + acc[i][4]) + (acc[i][1] + acc[i][5])) +
                          ((acc[i][2] + acc[i][6]) + (acc[i][3] + acc[i][7]));
                a->y[(int64_t)(g + i) * a->ldy + r] = s * rs;
            }
        }
    }
}

void tsr_gemv_widen_rows(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int64_t r1, float *dst) {
    for (int64_t r = r0; r < r1; r++, dst += a->cols) {
        const uint8_t *row = a->w + (uint64_t)r * a->row_bytes;
        if (dtype == TSR_DTYPE_F32) {
            memcpy(dst, row, (size_t)a->cols * 4);
            continue;
        }
        int widened = 0;
#if defined(__x86_64__)
        widened = tsr_gemv_isa_best() != TSR_GEMV_ISA_PORTABLE && tsr_gemv_widen_row_avx2(dtype, row, a->cols, dst);
#endif
        if (!widened) tsr_dequant_row(dtype, row, dst, a->cols);
        tsr_gemv_scale_widened(dtype, a, r, 0, a->cols, dst);
    }
}

/* The quantisers' start (weight rows and activations): max|x| (NaN when x
 * holds one, q untouched); *go 0 where that is the answer (0 or Inf: q's n
 * codes of code_bytes each set to bytes of fill), 1 where the codes are
 * still to be made. */
static float quant_start(const float *x, int64_t n, void *q, size_t code_bytes, int fill, int *go) {
    int nan;
    const float amax = tsr_absmax(x, n, &nan);
    *go = 0;
    if (nan) return NAN;
    if (amax == 0.0f || !isfinite(amax)) {
        if (n > 0) memset(q, fill, (size_t)n * code_bytes);
        return amax;
    }
    *go = 1;
    return amax;
}

float tsr_gemv_quant_row_i8(const float *src, int64_t n, int8_t *q) {
    if (n <= 0) return 0.0f;
    int go;
    const float amax = quant_start(src, n, q, 1, 0, &go);
    if (!go) {
        if (isnan(amax)) memset(q, 0, (size_t)n); /* a row's codes are zero whatever it held */
        return amax;
    }
    float s = amax / 127.0f;
    float inv = 127.0f / amax;
    int64_t c = 0;
#if defined(__x86_64__)
    if (tsr_gemv_isa_best() != TSR_GEMV_ISA_PORTABLE) c = tsr_gemv_quant_i8_avx2(src, n, inv, q); /* the rest below */
#endif
    for (; c < n; c++) {
        float v = nearbyintf(src[c] * inv);
        if (v > 127.0f) v = 127.0f;
        if (v < -127.0f) v = -127.0f;
        q[c] = (int8_t)v;
    }
    return s;
}

int64_t tsr_gemv_permuted_x_floats(tsr_gemv_isa isa, uint32_t dtype, const tsr_gemv_args *a) {
#if defined(__x86_64__)
    /* bf16 from two rows on AVX-512: the same size, blocks of 32 (tsr_gemv_rows_avx512) */
    if (kernel_isa(isa) == TSR_GEMV_ISA_AVX2) return tsr_gemv_permuted_x_floats_avx2(dtype, a);
#endif
    (void)isa, (void)dtype, (void)a;
    return 0;
}

void tsr_gemv_permute_x(tsr_gemv_isa isa, uint32_t dtype, const tsr_gemv_args *a, float *xp) {
#if defined(__x86_64__)
    if (avx512_kernels(isa) && dtype == TSR_DTYPE_BF16 && tsr_gemv_bf16_512_rows(a)) {
        tsr_gemv_permute_x_bf16_512(a, xp);
        return;
    }
    if (kernel_isa(isa) == TSR_GEMV_ISA_AVX2) tsr_gemv_permute_x_avx2(dtype, a, xp);
#endif
    (void)isa, (void)dtype, (void)a, (void)xp;
}

/* --- int8 x int16 ------------------------------------------------------------- */

tsr_gemv_i8_kernel_fn tsr_gemv_i8_kernel(tsr_gemv_isa isa) {
#if defined(__x86_64__)
    if (avx512_kernels(isa) && tsr_cpu_has_avx512vnni()) return tsr_gemv_i8_rows_avx512_vnni;
#endif
    if (avx512_kernels(isa)) return tsr_gemv_i8_rows_avx512;
    switch (kernel_isa(isa)) {
    case TSR_GEMV_ISA_PORTABLE: return tsr_gemv_i8_rows_portable;
#if defined(__x86_64__)
    case TSR_GEMV_ISA_AVX2: return tsr_gemv_i8_rows_avx2;
#endif
    default: return NULL;
    }
}

float tsr_gemv_quant_x_i16(const float *x, int64_t n, int16_t *q) {
    int go;
    const float amax = quant_start(x, n, q, sizeof *q, 0, &go);
    if (!go) return amax;
    float inv = 32767.0f / amax;
    int64_t c = 0;
#if defined(__x86_64__)
    if (tsr_gemv_isa_best() != TSR_GEMV_ISA_PORTABLE) c = tsr_gemv_quant_i16_avx2(x, n, inv, q); /* the rest below */
#endif
    for (; c < n; c++) {
        float v = nearbyintf(x[c] * inv);
        q[c] = (int16_t)(v > 32767.0f ? 32767.0f : v < -32767.0f ? -32767.0f : v);
    }
    return amax / 32767.0f;
}

void tsr_gemv_i8_rows_portable(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const int8_t *w = a->w + (uint64_t)r * (uint64_t)a->cols;
        for (int i = 0; i < a->nx; i++) {
            const int16_t *x = a->xq + (int64_t)i * a->cols;
            float acc = 0.0f;
            for (int64_t c0 = 0; c0 < a->cols; c0 += 1024) {
                int64_t c1 = c0 + 1024 < a->cols ? c0 + 1024 : a->cols;
                int64_t s = 0; /* 1024 * 127 * 32767 does not fit int32 */
                for (int64_t c = c0; c < c1; c++) s += (int32_t)w[c] * (int32_t)x[c];
                acc += (float)s;
            }
            a->y[(int64_t)i * a->ldy + r] = acc * a->wscale[r] * a->xscale[i];
        }
    }
}

/* --- int8 x u8 ------------------------------------------------------------------ */

tsr_gemv_i8_kernel_fn tsr_gemv_u8_kernel(tsr_gemv_isa isa) {
#if defined(__x86_64__)
    if (avx512_kernels(isa) && tsr_cpu_has_avx512vnni()) return tsr_gemv_i8u8_rows_avx512_vnni;
#endif
    (void)isa;
    return NULL;
}

float tsr_gemv_quant_x_u8(const float *x, int64_t n, uint8_t *q) {
    int go;
    const float amax = quant_start(x, n, q, 1, 128, &go);
    if (!go) return amax;
    float inv = 127.0f / amax;
    int64_t c = 0;
#if defined(__x86_64__)
    if (tsr_cpu_has_avx512bw()) c = tsr_gemv_quant_u8_avx512(x, n, inv, q); /* the rest below */
#endif
    for (; c < n; c++) {
        float v = nearbyintf(x[c] * inv);
        q[c] = (uint8_t)(int)((v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v) + 128.0f);
    }
    return amax / 127.0f;
}

void tsr_gemv_i8u8_rows_portable(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const int8_t *w = a->w + (uint64_t)r * (uint64_t)a->cols;
        for (int i = 0; i < a->nx; i++) {
            const uint8_t *x = a->xu + (int64_t)i * a->cols;
            int64_t s = 0;
            for (int64_t c = 0; c < a->cols; c++) s += (int32_t)w[c] * (int32_t)x[c];
            s -= 128 * (int64_t)a->wsum[r];
            a->y[(int64_t)i * a->ldy + r] = (float)s * a->wscale[r] * a->xscale[i];
        }
    }
}

/* --- Q8_0 (as stored) x int16 ------------------------------------------------- */

tsr_gemv_i8_kernel_fn tsr_gemv_q8_0_i16_kernel(tsr_gemv_isa isa) {
#if defined(__x86_64__)
    if (avx512_kernels(isa) && tsr_cpu_has_avx512vnni()) return tsr_gemv_q8_0_i16_rows_avx512_vnni;
#endif
    switch (kernel_isa(isa)) {
    case TSR_GEMV_ISA_PORTABLE: return tsr_gemv_q8_0_i16_rows_portable;
#if defined(__x86_64__)
    case TSR_GEMV_ISA_AVX2: return tsr_gemv_q8_0_i16_rows_avx2;
#endif
    default: return NULL;
    }
}

void tsr_gemv_q8_0_i16_rows_portable(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) {
    const int64_t nb = a->cols / 32;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *w = (const uint8_t *)a->w + (uint64_t)r * (uint64_t)nb * 34;
        for (int i = 0; i < a->nx; i++) {
            const int16_t *x = a->xq + (int64_t)i * a->cols;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = w + b * 34;
                uint16_t dh;
                memcpy(&dh, blk, 2);
                int32_t s = 0; /* |s| < 32 x 128 x 32767: fits */
                for (int k = 0; k < 32; k++) s += (int32_t)(int8_t)blk[2 + k] * (int32_t)x[b * 32 + k];
                acc += tsr_f16_to_f32(dh) * (float)s;
            }
            a->y[(int64_t)i * a->ldy + r] = acc * a->xscale[i];
        }
    }
}
