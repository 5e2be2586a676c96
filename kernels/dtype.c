#include "dtype.h"

#include <math.h>
#include <string.h>

#include "../core/util/checked.h"
#include "../core/util/error.h" /* TSR_ASSERT only */

/* One row per tsr_dtype: name, elements per block, bytes per block. Block
 * layouts are GGML's (ggml-common.h): Q8_0 {f16 d; i8 qs[32]}, Q4_0 {f16 d;
 * u8 qs[16]}, Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]}, Q6_K {u8 ql[128];
 * u8 qh[64]; i8 scales[16]; f16 d}. */
static const struct {
    const char *name;
    int block_elems;
    int block_bytes;
} dtype_table[TSR_DTYPE_COUNT] = {
    [TSR_DTYPE_F32] = {"f32", 1, 4},
    [TSR_DTYPE_F16] = {"f16", 1, 2},
    [TSR_DTYPE_BF16] = {"bf16", 1, 2},
    [TSR_DTYPE_F8_E4M3] = {"f8_e4m3", 1, 1},
    [TSR_DTYPE_Q8_0] = {"q8_0", 32, 34},
    [TSR_DTYPE_Q4_0] = {"q4_0", 32, 18},
    [TSR_DTYPE_Q4_K] = {"q4_k", 256, 144},
    [TSR_DTYPE_Q6_K] = {"q6_k", 256, 210},
    [TSR_DTYPE_I8] = {"i8", 1, 1},
    [TSR_DTYPE_I32] = {"i32", 1, 4},
    [TSR_DTYPE_I64] = {"i64", 1, 8},
};

const char *tsr_dtype_name(uint32_t dtype) {
    return dtype < TSR_DTYPE_COUNT ? dtype_table[dtype].name : "unknown";
}

uint32_t tsr_dtype_from_name(const char *name) {
    if (!name) return TSR_DTYPE_COUNT;
    for (uint32_t i = 0; i < TSR_DTYPE_COUNT; i++)
        if (strcmp(dtype_table[i].name, name) == 0) return i;
    return TSR_DTYPE_COUNT;
}

int tsr_dtype_block_elems(uint32_t dtype) {
    return dtype < TSR_DTYPE_COUNT ? dtype_table[dtype].block_elems : 0;
}

int tsr_dtype_block_bytes(uint32_t dtype) {
    return dtype < TSR_DTYPE_COUNT ? dtype_table[dtype].block_bytes : 0;
}

int tsr_dtype_row_bytes(uint32_t dtype, int64_t n, uint64_t *out) {
    if (dtype >= TSR_DTYPE_COUNT || n < 0) return -1;
    int64_t be = dtype_table[dtype].block_elems;
    if (n % be != 0) return -1;
    uint64_t bytes;
    if (tsr_mul_u64((uint64_t)(n / be), (uint64_t)dtype_table[dtype].block_bytes, &bytes))
        return -1;
    *out = bytes;
    return 0;
}

/* --- scalar conversions ----------------------------------------------------- */

static inline float bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t f32_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float tsr_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) /* inf or NaN: keep the payload */
        return bits_to_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in f32 */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t tsr_f32_to_f16(float f) {
    uint32_t u = f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) { /* inf or NaN (NaN stays NaN, quiet) */
        if (a == 0x7f800000u) return sign | 0x7c00;
        return sign | 0x7e00 | (uint16_t)((a >> 13) & 0x3ff);
    }
    if (a >= 0x477ff000u) return sign | 0x7c00; /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {
        /* result is subnormal or zero: value / 2^-24 rounded to nearest even */
        if (a < 0x33000000u) return sign; /* < 2^-25: rounds to zero (2^-25 ties to 0) */
        uint32_t e = a >> 23;             /* 102..112 */
        uint32_t m = (a & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e;         /* 14..24: f16 units are 2^-24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return sign | (uint16_t)q;
    }
    /* normal: rebias and round the 13 dropped bits to nearest even */
    uint32_t r = a - (112u << 23);
    uint32_t q = r >> 13;
    uint32_t rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
    return sign | (uint16_t)q;
}

float tsr_bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

uint16_t tsr_f32_to_bf16(float f) {
    uint32_t u = f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    uint32_t lsb = (u >> 16) & 1;
    return (uint16_t)((u + 0x7fffu + lsb) >> 16);
}

float tsr_f8e4m3_to_f32(uint8_t v) {
    /* float8_e4m3fn: bias 7, no infinities, S.1111.111 is NaN */
    int sign = v >> 7;
    int exp = (v >> 3) & 0xf;
    int man = v & 7;
    float r;
    if (exp == 0xf && man == 7)
        r = NAN;
    else if (exp == 0)
        r = (float)man * 0x1p-9f; /* subnormal: man/8 * 2^-6 */
    else
        r = bits_to_f32((uint32_t)(exp + 120) << 23 | (uint32_t)man << 20); /* 1.man * 2^(exp-7), exactly */
    return sign ? -r : r;
}

uint8_t tsr_f32_to_f8e4m3(float f) {
    uint32_t u = f32_to_bits(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7f;      /* NaN */
    if (a >= 0x43e00000u) return sign | 0x7e;     /* >= 448 (and inf): saturate */
    if (a < 0x3c800000u) {
        /* below 2^-6: subnormal or zero, in units of 2^-9 rounded to nearest even */
        if (a <= 0x3a800000u) return sign;        /* <= 2^-10: rounds to zero (2^-10 ties to 0) */
        uint32_t e = a >> 23;                     /* 117..120 */
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 141 - e;                 /* 21..24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return sign | (uint8_t)q;                 /* q 8 is 2^-6, the smallest normal */
    }
    /* normal: rebias (127 -> 7) and round the 20 dropped mantissa bits to
     * nearest even; a carry moves into the exponent, and a < 448 keeps the
     * result <= 0x7e (448) */
    uint32_t r = a - (120u << 23);
    uint32_t q = r >> 20;
    uint32_t rem = r & 0xfffffu;
    if (rem > 0x80000u || (rem == 0x80000u && (q & 1))) q++;
    return sign | (uint8_t)q;
}

/* --- rows -------------------------------------------------------------------- */

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static void dequant_q8_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 34, y += 32) {
        float d = tsr_f16_to_f32(rd16(b));
        for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
    }
}

static void dequant_q4_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 18, y += 32) {
        float d = tsr_f16_to_f32(rd16(b));
        const uint8_t *qs = b + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((qs[j] & 0xf) - 8);
            y[j + 16] = d * (float)((qs[j] >> 4) - 8);
        }
    }
}

/* 6-bit scale and min j (0..7) of a Q4_K super-block's 12 packed bytes. */
static void q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void dequant_q4_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 144) {
        float d = tsr_f16_to_f32(rd16(b));
        float dmin = tsr_f16_to_f32(rd16(b + 2));
        const uint8_t *scales = b + 4;
        const uint8_t *q = b + 16;
        for (int j = 0; j < 8; j += 2, q += 32) {
            uint8_t sc, m;
            q4k_scale_min(j, scales, &sc, &m);
            float d1 = d * sc, m1 = dmin * m;
            q4k_scale_min(j + 1, scales, &sc, &m);
            float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xf) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static void dequant_q6_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 210) {
        const uint8_t *ql = b;
        const uint8_t *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = tsr_f16_to_f32(rd16(b + 208));
        for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is + 0] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

static uint8_t clamp_code(float v, float hi) { return (uint8_t)(v < 0 ? 0 : v > hi ? hi : v); }

void tsr_quant_q4_k(const float *w, uint8_t *blk) {
    float step[8], off[8], smax = 0, omax = 0;
    for (int j = 0; j < 8; j++) {
        float lo = w[32 * j], hi = lo;
        for (int k = 1; k < 32; k++) lo = fminf(lo, w[32 * j + k]), hi = fmaxf(hi, w[32 * j + k]);
        off[j] = lo < 0 ? -lo : 0;
        step[j] = (hi + off[j]) / 15.0f;
        smax = fmaxf(smax, step[j]), omax = fmaxf(omax, off[j]);
    }
    const uint16_t dh = tsr_f32_to_f16(smax / 63.0f), mh = tsr_f32_to_f16(omax / 63.0f);
    const float d = tsr_f16_to_f32(dh), dmin = tsr_f16_to_f32(mh);
    uint8_t sc[8], m[8];
    memset(blk, 0, 144);
    for (int j = 0; j < 8; j++) {
        sc[j] = d > 0 ? clamp_code(roundf(step[j] / d), 63) : 0;
        m[j] = dmin > 0 ? clamp_code(roundf(off[j] / dmin), 63) : 0;
    }
    memcpy(blk, &dh, 2), memcpy(blk + 2, &mh, 2);
    for (int j = 0; j < 4; j++) { /* the layout q4k_scale_min reads */
        blk[4 + j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        blk[8 + j] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        blk[12 + j] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
    for (int j = 0; j < 8; j++) {
        const float st = d * sc[j], o = dmin * m[j];
        for (int k = 0; k < 32; k++) {
            const uint8_t q = st > 0 ? clamp_code(roundf((w[32 * j + k] + o) / st), 15) : 0;
            blk[16 + 32 * (j / 2) + k] |= (uint8_t)(j % 2 ? q << 4 : q);
        }
    }
}

void tsr_quant_q6_k(const float *w, uint8_t *blk) {
    float step[16], smax = 0;
    for (int g = 0; g < 16; g++) {
        float a = 0;
        for (int k = 0; k < 16; k++) a = fmaxf(a, fabsf(w[16 * g + k]));
        smax = fmaxf(smax, step[g] = a / 31.0f);
    }
    const uint16_t dh = tsr_f32_to_f16(smax / 127.0f);
    const float d = tsr_f16_to_f32(dh);
    memset(blk, 0, 210);
    for (int g = 0; g < 16; g++) {
        const uint8_t sc = d > 0 ? clamp_code(roundf(step[g] / d), 127) : 0;
        blk[192 + g] = sc;
        const float st = d * sc;
        for (int k = 0; k < 16; k++) { /* element e: half h, group gi of 32, lane l (dequant_q6_k) */
            const int e = 16 * g + k, h = e / 128, gi = (e % 128) / 32, l = e % 32;
            const uint8_t q = st > 0 ? clamp_code(roundf(w[e] / st) + 32, 63) : 32;
            blk[64 * h + (gi % 2) * 32 + l] |= (uint8_t)(gi < 2 ? q & 15 : (q & 15) << 4);
            blk[128 + 32 * h + l] |= (uint8_t)((q >> 4) << (2 * gi));
        }
    }
    memcpy(blk + 208, &dh, 2);
}

void tsr_dequant_row(uint32_t dtype, const void *src, float *dst, int64_t n) {
    TSR_ASSERT(dtype < TSR_DTYPE_COUNT && n >= 0 && n % dtype_table[dtype].block_elems == 0);
    const uint8_t *s = src;
    switch ((tsr_dtype)dtype) {
    case TSR_DTYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case TSR_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = tsr_f16_to_f32(rd16(s + 2 * i));
        break;
    case TSR_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = tsr_bf16_to_f32(rd16(s + 2 * i));
        break;
    case TSR_DTYPE_F8_E4M3:
        for (int64_t i = 0; i < n; i++) dst[i] = tsr_f8e4m3_to_f32(s[i]);
        break;
    case TSR_DTYPE_Q8_0: dequant_q8_0(s, dst, n / 32); break;
    case TSR_DTYPE_Q4_0: dequant_q4_0(s, dst, n / 32); break;
    case TSR_DTYPE_Q4_K: dequant_q4_k(s, dst, n / 256); break;
    case TSR_DTYPE_Q6_K: dequant_q6_k(s, dst, n / 256); break;
    case TSR_DTYPE_I8:
        for (int64_t i = 0; i < n; i++) dst[i] = (float)(int8_t)s[i];
        break;
    case TSR_DTYPE_I32:
        for (int64_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, s + 4 * i, 4);
            dst[i] = (float)v;
        }
        break;
    case TSR_DTYPE_I64:
        for (int64_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, s + 8 * i, 8);
            dst[i] = (float)v;
        }
        break;
    case TSR_DTYPE_COUNT: break;
    }
}
