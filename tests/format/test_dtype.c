/* dtype kernels: conversions checked exhaustively against formulas written
 * from the formats' definitions, quantised blocks packed here by their GGML
 * layouts and compared with the values the definitions give. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/dtype.h"

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* IEEE binary16 by definition. */
static double f16_ref(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp(m, -24);
    else v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static double bf16_ref(uint16_t h) {
    int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v;
    if (e == 255) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp(m, -133);
    else v = ldexp(128 + m, e - 134);
    return s ? -v : v;
}

static double f8_ref(uint8_t x) {
    int s = x >> 7, e = (x >> 3) & 15, m = x & 7;
    double v;
    if (e == 15 && m == 7) v = NAN;
    else if (e == 0) v = ldexp(m, -9);
    else v = ldexp(8 + m, e - 10);
    return s ? -v : v;
}

static void test_f16_to_f32_exhaustive(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        double r = f16_ref((uint16_t)h);
        float got = tsr_f16_to_f32((uint16_t)h);
        if (isnan(r)) {
            assert_true(isnan(got));
            continue;
        }
        assert_true((double)got == r);
        assert_int_equal(signbit(got) != 0, (h >> 15) != 0);
    }
}

/* Rounding f32 -> f16: every f16 survives a round trip; each midpoint
 * between neighbours goes to the even one, and the floats just beside it to
 * the nearer. */
static void test_f32_to_f16_rounding(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 0x7c00; h++) {
        for (int sgn = 0; sgn < 2; sgn++) {
            uint16_t hs = (uint16_t)(h | (sgn ? 0x8000 : 0));
            float v = tsr_f16_to_f32(hs);
            assert_int_equal(tsr_f32_to_f16(v), hs);
            if (h == 0x7bff) continue;
            double a = f16_ref(hs), b = f16_ref((uint16_t)(hs + 1));
            float mid = (float)((a + b) / 2); /* exact: one more bit */
            assert_true((double)mid == (a + b) / 2);
            uint16_t even = (h & 1) ? (uint16_t)(hs + 1) : hs;
            assert_int_equal(tsr_f32_to_f16(mid), even);
            float toward_b = nextafterf(mid, sgn ? -INFINITY : INFINITY);
            float toward_a = nextafterf(mid, 0.0f);
            assert_int_equal(tsr_f32_to_f16(toward_b), (uint16_t)(hs + 1));
            assert_int_equal(tsr_f32_to_f16(toward_a), hs);
        }
    }
    assert_int_equal(tsr_f32_to_f16(65520.0f), 0x7c00);                   /* ties up to inf */
    assert_int_equal(tsr_f32_to_f16(nextafterf(65520.0f, 0)), 0x7bff);
    assert_int_equal(tsr_f32_to_f16(-1e10f), 0xfc00);
    assert_int_equal(tsr_f32_to_f16(INFINITY), 0x7c00);
    assert_true((tsr_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (tsr_f32_to_f16(NAN) & 0x3ff));
    assert_int_equal(tsr_f32_to_f16(0x1p-25f), 0);                        /* ties to 0 */
    assert_int_equal(tsr_f32_to_f16(nextafterf(0x1p-25f, 1)), 1);
    assert_int_equal(tsr_f32_to_f16(1e-30f), 0);
    assert_int_equal(tsr_f32_to_f16(1.0f), 0x3c00);
}

static void test_bf16_exhaustive(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        double r = bf16_ref((uint16_t)h);
        float got = tsr_bf16_to_f32((uint16_t)h);
        if (isnan(r)) {
            assert_true(isnan(got));
            assert_true(isnan(tsr_bf16_to_f32(tsr_f32_to_bf16(got))));
            continue;
        }
        assert_true((double)got == r);
        assert_int_equal(tsr_f32_to_bf16(got), h);
        uint32_t a = h & 0x7fff;
        if (a >= 0x7f7f) continue;
        double lo = bf16_ref((uint16_t)h), hi = bf16_ref((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2);
        assert_true((double)mid == (lo + hi) / 2);
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        assert_int_equal(tsr_f32_to_bf16(mid), even);
        assert_int_equal(tsr_f32_to_bf16(nextafterf(mid, (h >> 15) ? -INFINITY : INFINITY)),
                         (uint16_t)(h + 1));
        assert_int_equal(tsr_f32_to_bf16(nextafterf(mid, 0)), (uint16_t)h);
    }
}

static void test_f8e4m3_exhaustive(void **state) {
    (void)state;
    for (int x = 0; x < 256; x++) {
        double r = f8_ref((uint8_t)x);
        float got = tsr_f8e4m3_to_f32((uint8_t)x);
        if (isnan(r))
            assert_true(isnan(got));
        else
            assert_true((double)got == r);
    }
    assert_true(tsr_f8e4m3_to_f32(0x7e) == 448.0f); /* largest finite */
    assert_true(tsr_f8e4m3_to_f32(0x38) == 1.0f);
    assert_true(tsr_f8e4m3_to_f32(0x01) == 0x1p-9f); /* smallest subnormal */
    assert_true(tsr_f8e4m3_to_f32(0xb8) == -1.0f);
    assert_true(isnan(tsr_f8e4m3_to_f32(0x7f)) && isnan(tsr_f8e4m3_to_f32(0xff)));
}

/* The float8_e4m3fn code nearest to v by search over every finite code,
 * ties to the even code, beyond 448 saturated: the definition
 * tsr_f32_to_f8e4m3 must meet. */
static uint8_t f8_nearest(double v) {
    uint8_t sign = signbit(v) ? 0x80 : 0;
    double a = fabs(v);
    if (a > 448) return sign | 0x7e;
    int best = 0;
    for (int c = 1; c <= 0x7e; c++) {
        double d = fabs(f8_ref((uint8_t)c) - a), db = fabs(f8_ref((uint8_t)best) - a);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return sign | (uint8_t)best;
}

static void check_to_f8(float f) {
    uint8_t want = f8_nearest(f), got = tsr_f32_to_f8e4m3(f);
    if (got != want) fail_msg("tsr_f32_to_f8e4m3(%a) = 0x%02x, nearest-even is 0x%02x", (double)f, got, want);
}

static void test_f32_to_f8e4m3(void **state) {
    (void)state;
    for (int c = 0; c <= 0x7e; c++) { /* every value, the midpoints to the next, and one ulp either side */
        float v = (float)f8_ref((uint8_t)c), next = c < 0x7e ? (float)f8_ref((uint8_t)(c + 1)) : 464.0f;
        float mid = (v + next) / 2; /* exact: 5 significant bits */
        const float probe[] = {v, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), nextafterf(v, 0),
                               nextafterf(v, INFINITY)};
        for (size_t i = 0; i < sizeof probe / sizeof *probe; i++) {
            check_to_f8(probe[i]);
            check_to_f8(-probe[i]);
        }
        assert_int_equal(tsr_f32_to_f8e4m3(v), c);
        assert_int_equal(tsr_f32_to_f8e4m3(-v), 0x80 | c);
    }
    for (uint32_t u = 0; u < 0x44000000u; u += 4099) { /* a sweep over [0, 512) */
        float f;
        memcpy(&f, &u, 4);
        check_to_f8(f);
        check_to_f8(-f);
    }
    assert_int_equal(tsr_f32_to_f8e4m3(464.0f), 0x7e); /* would round up past 448: saturates */
    assert_int_equal(tsr_f32_to_f8e4m3(INFINITY), 0x7e);
    assert_int_equal(tsr_f32_to_f8e4m3(-INFINITY), 0xfe);
    assert_int_equal(tsr_f32_to_f8e4m3(1e30f), 0x7e);
    assert_int_equal(tsr_f32_to_f8e4m3(0x1p-10f), 0x00);         /* half the smallest subnormal: to even 0 */
    assert_int_equal(tsr_f32_to_f8e4m3(0x1.8p-9f), 0x02);        /* 1.5 units: to even 2 */
    assert_int_equal(tsr_f32_to_f8e4m3(0x1.1p-6f), 0x08);        /* 2^-6 * 1.0625: to 2^-6 */
    assert_int_equal(tsr_f32_to_f8e4m3(-0.0f), 0x80);
    assert_true(isnan(tsr_f8e4m3_to_f32(tsr_f32_to_f8e4m3(NAN))));
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void test_q8_0(void **state) {
    (void)state;
    uint8_t blk[2 * 34];
    float out[64];
    put16(blk, tsr_f32_to_f16(0.5f));
    put16(blk + 34, tsr_f32_to_f16(-0.125f));
    for (int j = 0; j < 32; j++) {
        blk[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
        blk[36 + j] = (uint8_t)(int8_t)(127 - j);
    }
    tsr_dequant_row(TSR_DTYPE_Q8_0, blk, out, 64);
    for (int j = 0; j < 32; j++) {
        assert_true(out[j] == 0.5f * (float)(j * 8 - 128));
        assert_true(out[32 + j] == -0.125f * (float)(127 - j));
    }
}

static void test_q4_0(void **state) {
    (void)state;
    uint8_t blk[18];
    int q[32];
    float out[32];
    put16(blk, tsr_f32_to_f16(0.25f));
    for (int j = 0; j < 32; j++) q[j] = (j * 7 + 3) % 16;
    /* element j < 16 in the low nibble of byte j, element j + 16 in its high nibble */
    for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    tsr_dequant_row(TSR_DTYPE_Q4_0, blk, out, 32);
    for (int j = 0; j < 32; j++) assert_true(out[j] == 0.25f * (float)(q[j] - 8));
}

static void test_q4_k(void **state) {
    (void)state;
    /* super-block of 8 sub-blocks x 32: x = d * sc[s] * q - dmin * m[s],
     * sc and m 6-bit; d, dmin powers of two so every product is exact */
    uint8_t blk[144] = {0};
    int sc[8], m[8], q[256];
    const float d = 0x1p-4f, dmin = 0x1p-5f;
    for (int s = 0; s < 8; s++) {
        sc[s] = (s * 23 + 5) % 64;
        m[s] = (s * 41 + 60) % 64;
    }
    for (int i = 0; i < 256; i++) q[i] = (i * 5 + i / 7) % 16;
    put16(blk, tsr_f32_to_f16(d));
    put16(blk + 2, tsr_f32_to_f16(dmin));
    uint8_t *scales = blk + 4, *qs = blk + 16;
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    float out[256];
    tsr_dequant_row(TSR_DTYPE_Q4_K, blk, out, 256);
    for (int i = 0; i < 256; i++) {
        int s = i / 32;
        double want = (double)d * sc[s] * q[i] - (double)dmin * m[s];
        assert_true((double)out[i] == want);
    }
}

static void test_q6_k(void **state) {
    (void)state;
    uint8_t blk[210] = {0};
    int q6[256];
    int8_t sc[16];
    const float d = 0x1p-6f;
    for (int i = 0; i < 256; i++) q6[i] = (i * 37 + 11) % 64;
    for (int s = 0; s < 16; s++) sc[s] = (int8_t)(s * 17 - 128);
    uint8_t *ql = blk, *qh = blk + 128;
    for (int i = 0; i < 256; i++) {
        int n = i / 128, r = i % 128, g = r / 32, l = r % 32;
        int lo = q6[i] & 15, hi = q6[i] >> 4;
        int qli = n * 64 + l + ((g & 1) ? 32 : 0);
        ql[qli] |= (uint8_t)(g < 2 ? lo : lo << 4);
        qh[n * 32 + l] |= (uint8_t)(hi << (2 * g));
    }
    memcpy(blk + 192, sc, 16);
    put16(blk + 208, tsr_f32_to_f16(d));
    float out[256];
    tsr_dequant_row(TSR_DTYPE_Q6_K, blk, out, 256);
    for (int i = 0; i < 256; i++) {
        int n = i / 128, r = i % 128, g = r / 32, l = r % 32;
        int s = n * 8 + g * 2 + l / 16; /* 16 elements per scale */
        double want = (double)d * sc[s] * (q6[i] - 32);
        assert_true((double)out[i] == want);
    }
}

/* tsr_quant_q4_k / tsr_quant_q6_k read back by tsr_dequant_row: every
 * weight within its sub-block's quantisation step (half a step of the
 * codes, plus what rounding the scales to 6 or 8 bits and f16 moves), on
 * blocks of different ranges and signs. A code or scale written into the
 * wrong bits comes back steps away. */
static void roundtrip(uint32_t dtype, double slack) {
    uint32_t r = 12345;
    for (int t = 0; t < 40; t++) {
        float w[256], back[256];
        uint8_t blk[210];
        const float lo = t % 4 == 0 ? 0.5f : -1.0f - (float)(t % 7), hi = t % 5 == 0 ? -0.25f : 1.0f + (float)(t % 3);
        for (int i = 0; i < 256; i++) {
            r = r * 1664525u + 1013904223u;
            w[i] = lo + (hi - lo) * (float)(r >> 8) / 16777216.0f * (i % 16 == 3 ? 1.0f : 0.5f + 0.5f * (float)(i % 32) / 32);
        }
        if (dtype == TSR_DTYPE_Q4_K) tsr_quant_q4_k(w, blk);
        else tsr_quant_q6_k(w, blk);
        tsr_dequant_row(dtype, blk, back, 256);
        const int g = dtype == TSR_DTYPE_Q4_K ? 32 : 16, levels = dtype == TSR_DTYPE_Q4_K ? 15 : 62;
        for (int s0 = 0; s0 < 256; s0 += g) {
            float mn = w[s0], mx = w[s0];
            for (int i = s0; i < s0 + g; i++) mn = fminf(mn, w[i]), mx = fmaxf(mx, w[i]);
            const double span = dtype == TSR_DTYPE_Q4_K ? fmax(mx, 0) - fmin(mn, 0) : 2 * fmax(fabs(mn), fabs(mx));
            for (int i = s0; i < s0 + g; i++)
                if (fabs((double)back[i] - w[i]) > slack * span / levels)
                    fail_msg("%s block %d weight %d: %.6g came back %.6g (step %.3g)", tsr_dtype_name(dtype), t,
                             i, w[i], back[i], span / levels);
        }
    }
}

static void test_quant_q4_k(void **state) { (void)state, roundtrip(TSR_DTYPE_Q4_K, 1.0); }
static void test_quant_q6_k(void **state) { (void)state, roundtrip(TSR_DTYPE_Q6_K, 1.0); }

static void test_plain_rows(void **state) {
    (void)state;
    float out[4];
    int8_t i8[4] = {-128, -1, 0, 127};
    tsr_dequant_row(TSR_DTYPE_I8, i8, out, 4);
    assert_true(out[0] == -128.0f && out[1] == -1.0f && out[3] == 127.0f);
    int32_t i32[2] = {-7, 1 << 20};
    tsr_dequant_row(TSR_DTYPE_I32, i32, out, 2);
    assert_true(out[0] == -7.0f && out[1] == 1048576.0f);
    int64_t i64[2] = {-3, 1LL << 40};
    tsr_dequant_row(TSR_DTYPE_I64, i64, out, 2);
    assert_true(out[0] == -3.0f && out[1] == 0x1p40f);
    uint16_t bf[2] = {0x3f80, 0xc040};
    tsr_dequant_row(TSR_DTYPE_BF16, bf, out, 2);
    assert_true(out[0] == 1.0f && out[1] == -3.0f);
    uint16_t h[2] = {0x3c00, 0xc000};
    tsr_dequant_row(TSR_DTYPE_F16, h, out, 2);
    assert_true(out[0] == 1.0f && out[1] == -2.0f);
    uint8_t f8[2] = {0x38, 0x7e};
    tsr_dequant_row(TSR_DTYPE_F8_E4M3, f8, out, 2);
    assert_true(out[0] == 1.0f && out[1] == 448.0f);
    float f[2] = {1.5f, -0.0f};
    tsr_dequant_row(TSR_DTYPE_F32, f, out, 2);
    assert_true(out[0] == 1.5f && fbits(out[1]) == 0x80000000u);
}

static void test_sizes_and_names(void **state) {
    (void)state;
    uint64_t b;
    assert_int_equal(tsr_dtype_row_bytes(TSR_DTYPE_Q4_K, 512, &b), 0);
    assert_int_equal(b, 288);
    assert_int_equal(tsr_dtype_row_bytes(TSR_DTYPE_Q6_K, 256, &b), 0);
    assert_int_equal(b, 210);
    assert_int_equal(tsr_dtype_row_bytes(TSR_DTYPE_Q8_0, 64, &b), 0);
    assert_int_equal(b, 68);
    assert_int_equal(tsr_dtype_row_bytes(TSR_DTYPE_Q4_0, 32, &b), 0);
    assert_int_equal(b, 18);
    assert_int_equal(tsr_dtype_row_bytes(TSR_DTYPE_BF16, 3, &b), 0);
    assert_int_equal(b, 6);
    assert_int_equal(tsr_dtype_row_bytes(TSR_DTYPE_Q4_K, 100, &b), -1);
    assert_int_equal(tsr_dtype_row_bytes(TSR_DTYPE_F32, -4, &b), -1);
    assert_int_equal(tsr_dtype_row_bytes(TSR_DTYPE_I64, INT64_MAX, &b), -1); /* overflow */
    assert_int_equal(tsr_dtype_row_bytes(TSR_DTYPE_COUNT, 1, &b), -1);
    assert_int_equal(tsr_dtype_block_elems(TSR_DTYPE_Q6_K), 256);
    assert_int_equal(tsr_dtype_block_bytes(TSR_DTYPE_Q8_0), 34);
    for (uint32_t t = 0; t < TSR_DTYPE_COUNT; t++)
        assert_int_equal(tsr_dtype_from_name(tsr_dtype_name(t)), t);
    assert_string_equal(tsr_dtype_name(TSR_DTYPE_F8_E4M3), "f8_e4m3");
    assert_int_equal(tsr_dtype_from_name("f64"), TSR_DTYPE_COUNT);
    assert_string_equal(tsr_dtype_name(99), "unknown");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_to_f32_exhaustive), cmocka_unit_test(test_f32_to_f16_rounding),
        cmocka_unit_test(test_bf16_exhaustive),       cmocka_unit_test(test_f8e4m3_exhaustive),
        cmocka_unit_test(test_f32_to_f8e4m3),
        cmocka_unit_test(test_q8_0),                  cmocka_unit_test(test_q4_0),
        cmocka_unit_test(test_q4_k),                  cmocka_unit_test(test_q6_k),
        cmocka_unit_test(test_quant_q4_k),            cmocka_unit_test(test_quant_q6_k),
        cmocka_unit_test(test_plain_rows),            cmocka_unit_test(test_sizes_and_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
