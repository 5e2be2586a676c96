/*
 * gemv_avx2.c - the AVX2 + FMA + F16C path of gemv_cpu.h. Built with those
 * flags for this file only; called only after tsr_gemv_isa_runs() said yes.
 *
 * Each weight vector of 8 elements is decoded once in registers and used for
 * up to 4 input rows; wider batches take the row again from L1 per group of 4
 * (the AVX-512 section's int8 x int16, bf16 and Q8_0 kernels: up to 8).
 * f32 and f16 rows of at most ROW4_MAX_COLS columns go four weight rows at a
 * time against one input row after another (the four rows stay in L1), so
 * that one reduction serves four outputs.
 */
#include "gemv_cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../dtype.h"

#define INL static inline __attribute__((always_inline))
#define XG 4 /* input rows per pass over a weight row */

/* The drivers' loop over input rows, XG at a time from g (nn of them):
 * CALL(args..., g, N) with N the group's size as a constant (each dot's
 * loops over input rows then unroll), then STORE(g, i) for each i < nn.
 * CALL and STORE are macros of the driver. */
#define EACH_GROUP(NX, STORE, CALL, ...)                                                       \
    for (int g = 0; g < (NX); g += XG) {                                                       \
        const int nn = (NX) - g < XG ? (NX) - g : XG;                                          \
        switch (nn) {                                                                          \
        case 1: CALL(__VA_ARGS__, g, 1); break;                                                \
        case 2: CALL(__VA_ARGS__, g, 2); break;                                                \
        case 3: CALL(__VA_ARGS__, g, 3); break;                                                \
        default: CALL(__VA_ARGS__, g, 4); break;                                               \
        }                                                                                      \
        for (int i = 0; i < nn; i++) STORE(g, i);                                              \
    }
/* The same, XG8 rows at a time, for the AVX-512 kernels whose dots hold 8
 * rows' accumulators (32 vector registers): a pass of up to 8 rows (a
 * verification pass) widens each weight once. */
enum { XG8 = 8 };
#define EACH_GROUP8(NX, STORE, CALL, ...)                                                      \
    for (int g = 0; g < (NX); g += XG8) {                                                      \
        const int nn = (NX) - g < XG8 ? (NX) - g : XG8;                                        \
        switch (nn) {                                                                          \
        case 1: CALL(__VA_ARGS__, g, 1); break;                                                \
        case 2: CALL(__VA_ARGS__, g, 2); break;                                                \
        case 3: CALL(__VA_ARGS__, g, 3); break;                                                \
        case 4: CALL(__VA_ARGS__, g, 4); break;                                                \
        case 5: CALL(__VA_ARGS__, g, 5); break;                                                \
        case 6: CALL(__VA_ARGS__, g, 6); break;                                                \
        case 7: CALL(__VA_ARGS__, g, 7); break;                                                \
        default: CALL(__VA_ARGS__, g, 8); break;                                               \
        }                                                                                      \
        for (int i = 0; i < nn; i++) STORE(g, i);                                              \
    }
/* Independent chains of the f32-activation dots by input rows: U1 for one,
 * 4 for two, 2 for three or four. */
#define CHAINS(N, U1) ((N) == 1 ? (U1) : (N) == 2 ? 4 : 2)
/* the output of input row g + i and weight row r */
#define Y_AT(g, i) a->y[(int64_t)((g) + (i)) * a->ldy + r]
/* Bytes ahead of the weight stream that software prefetch asks for. 3 KiB
 * measured best of 1, 2, 3 and 4 KiB on a 2-core Xeon VM whose hardware
 * prefetchers follow these streams poorly (Q8_0 and bf16 decode passes 7-9%
 * faster than at 1 KiB, Llama-3.2-1B bf16 15-20%: BENCHMARKS.md, fourteenth
 * session); on the EPYC of earlier sessions 1 and 4 KiB measured the same. */
#ifndef PF_DIST
#define PF_DIST 3072
#endif

/* How far ahead the one-row bf16 and int8 streams ask for lines, into L2
 * (prefetcht1), where PF_DIST into L1 kept fewer lines in flight: a core's
 * L1 misses, software prefetches into L1 among them, hold its few fill
 * buffers until the line arrives, and a stream 3 KiB ahead on this Xeon VM
 * was bound by them. Two-thread lab over 512 MiB (int8 x int16, VNNI): T0
 * 3 KiB 26.8-27.4 GB/s, T1 3 KiB 28.2-28.6, T1 6 KiB 29.2-30.2, T1 8 KiB
 * 30.2; a pass's GEMVs in order (seq_lab, three rounds) int8 18.1-19.0 ->
 * 16.9-17.3 ms, bf16 35.0-37.6 -> 33.0-34.1 (BENCHMARKS.md, twenty-eighth
 * session). cpu_gemv's Q8_0 blocks (f32 activations) measured slower so
 * (they keep PF_DIST), verification rows no faster (bound by their
 * arithmetic); the VNNI Q8_0 x int16 decode takes PF_FAR as well. */
#define PF_FAR 6144

/* The first PF_FAR bytes of a take of weight rows, asked for at once: the
 * kernels' software prefetch runs PF_DIST or PF_FAR ahead of their loads, so
 * without this a take's first lines would come one demand miss after another
 * (a worker starts a new stream at each take, several times per call). */
INL void prefetch_start(const uint8_t *w, uint64_t bytes) {
    if (bytes > PF_FAR) bytes = PF_FAR;
    for (uint64_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)w + o, _MM_HINT_T0);
}

/* Decode's bf16 stream: into L2 PF_FAR ahead, into L1 only PF_NEAR ahead.
 * Against one T0 prefetch PF_DIST ahead: one-core lab over the down
 * projection's shape (896 x 4864 bf16) 13.5 -> 14.9 GB/s, the LM head's
 * (x 896) even; decode passes on a Xeon VM 0.5B ~3%, 1B 71-75 against
 * 75-76 ms (with the far prefetch PF_DIST ahead then; PF_FAR since the
 * twenty-eighth session). The same for the Q8_0 blocks was slower
 * (BENCHMARKS.md, fifteenth session). E4M3 rows (F8_STEP) share it. */
#define PF_NEAR 512
INL void prefetch_two_level(const uint8_t *p) {
    _mm_prefetch((const char *)p + PF_FAR, _MM_HINT_T1);
    _mm_prefetch((const char *)p + PF_NEAR, _MM_HINT_T0);
}

/* The software prefetch of a pair of Q8_0 blocks: 68 bytes a step, so one
 * prefetch a step would skip one line in 17 (a demand miss each); the line
 * 64 bytes further covers it. One-thread lab over the LM head's shape:
 * 16.7-16.8 -> 17.2 GB/s (BENCHMARKS.md, fourteenth session). */
INL void prefetch_q8_pair(const uint8_t *blk) {
    _mm_prefetch((const char *)blk + PF_DIST, _MM_HINT_T0);
    _mm_prefetch((const char *)blk + PF_DIST + 64, _MM_HINT_T0);
}

/* Output rows per run (a multiple of 8, so that runs keep the kernels'
 * groups of four rows where a take put them). Each run first asks for the
 * lines of y it will write with write intent (prefetchw): a kernel's store
 * to a line of y that is in no cache (y is written once per call, and the
 * weights streamed since have pushed it out) cost the weight stream what a
 * DRAM round trip costs, once per 16 rows. One-core lab over the LM head's
 * rows (896 bf16 columns, y cold): 18.0 -> 18.8 GB/s, two cores 34.8 ->
 * 36.8 GB/s, the read loop's rate; prefetching each line of y on its own a
 * few rows ahead did not help, a run's lines at once did (BENCHMARKS.md,
 * fifteenth session). */
#define Y_RUN 1024

/* Lines of y for output rows [r0, r1) of every input row, asked for with
 * write intent. PREFETCHW is a no-op on CPUs that lack it (it lies in the
 * prefetch hint space), so it is issued as an instruction, not through a
 * target flag. */
INL void prefetch_y(float *y, int64_t ldy, int nx, int64_t r0, int64_t r1) {
    for (int i = 0; i < nx; i++)
        for (int64_t r = r0; r < r1; r += 16) __asm__ volatile("prefetchw %0" ::"m"(y[i * ldy + r]));
}

/* The runs of rows [r0, r1): BODY(c0, c1) for each, its y asked for first. */
#define EACH_Y_RUN(a, r0, r1, BODY)                                                            \
    for (int64_t c0 = (r0); c0 < (r1); c0 += Y_RUN) {                                          \
        const int64_t c1 = (r1) - c0 > Y_RUN ? c0 + Y_RUN : (r1);                              \
        prefetch_y((a)->y, (a)->ldy, (a)->nx, c0, c1);                                         \
        BODY(c0, c1);                                                                          \
    }

INL float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INL uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

INL float h2f(const uint8_t *p) { return _cvtsh_ss(rd16(p)); }

/* --- plain types: 8 elements to 8 floats ------------------------------------ */

INL __m256 ld_f32(const uint8_t *p) { return _mm256_loadu_ps((const float *)(const void *)p); }
INL __m256 ld_f16(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p)); }
INL __m256 ld_bf16(const uint8_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
/* The low 8 signed bytes of v as f32. */
INL __m256 i8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }
INL __m256 ld_i8(const uint8_t *p) { return i8_to_ps(_mm_loadl_epi64((const __m128i *)(const void *)p)); }

/* 8 E4M3 bytes as f32, exactly (the widening for sgemm tiles and the GEMM's
 * panels; decode reads 32 at a time: dot_f8): (b & 0x7f) << 7 with the sign
 * moved to bit 15 is an f16 of the value times 2^-8, normal and subnormal
 * codes alike (4 exponent bits under bias 7 against 5 under bias 15);
 * S.1111.111, the NaN code, gets an all-ones exponent (an f16 NaN). */
INL __m256 ld_f8(const uint8_t *p) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)p));
    const __m128i m = _mm_and_si128(b, _mm_set1_epi16(0x7f));
    __m128i h = _mm_or_si128(_mm_slli_epi16(m, 7), _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8));
    h = _mm_or_si128(h, _mm_and_si128(_mm_cmpeq_epi16(m, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7c00)));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
}

INL float sc_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}
INL float sc_f16(const uint8_t *p) { return h2f(p); }
INL float sc_bf16(const uint8_t *p) { return tsr_bf16_to_f32(rd16(p)); }
INL float sc_i8(const uint8_t *p) { return (float)(int8_t)p[0]; }
INL float sc_f8(const uint8_t *p) { return tsr_f8e4m3_to_f32(p[0]); }

/* out[i] = dot(w[0..n), x[i * ldx ..]) for i < nx, u independent chains each. */
#define PLAIN_DOT(NAME, LOAD, SCALAR, ESZ)                                                       \
    INL void NAME(const uint8_t *w, const float *x, int64_t ldx, int64_t n, int nx, int u,      \
                  float *out) {                                                                  \
        __m256 acc[XG][8];                                                                       \
        for (int i = 0; i < nx; i++)                                                             \
            for (int k = 0; k < u; k++) acc[i][k] = _mm256_setzero_ps();                         \
        int64_t c = 0;                                                                           \
        for (; c + 8 * u <= n; c += 8 * u) {                                                     \
            for (int pb = 0; pb < 8 * u * ESZ; pb += 64)                                         \
                _mm_prefetch((const char *)(w + c * ESZ) + pb + PF_DIST, _MM_HINT_T0);           \
            for (int k = 0; k < u; k++) {                                                        \
                __m256 wv = LOAD(w + (c + 8 * k) * ESZ);                                         \
                for (int i = 0; i < nx; i++)                                                     \
                    acc[i][k] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * ldx + c + 8 * k),    \
                                                acc[i][k]);                                      \
            }                                                                                    \
        }                                                                                        \
        for (; c + 8 <= n; c += 8) {                                                             \
            __m256 wv = LOAD(w + c * ESZ);                                                       \
            for (int i = 0; i < nx; i++)                                                         \
                acc[i][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * ldx + c), acc[i][0]);    \
        }                                                                                        \
        for (int i = 0; i < nx; i++) {                                                           \
            __m256 s = acc[i][0];                                                                \
            for (int k = 1; k < u; k++) s = _mm256_add_ps(s, acc[i][k]);                         \
            float t = hsum8(s);                                                                  \
            for (int64_t cc = c; cc < n; cc++) t += SCALAR(w + cc * ESZ) * x[i * ldx + cc];      \
            out[i] = t;                                                                          \
        }                                                                                        \
    }

PLAIN_DOT(dot_f32, ld_f32, sc_f32, 4)
PLAIN_DOT(dot_f16, ld_f16, sc_f16, 2)
PLAIN_DOT(dot_bf16, ld_bf16, sc_bf16, 2)
PLAIN_DOT(dot_i8, ld_i8, sc_i8, 1)

/* Four rows at once against one input row (decode): each x vector is loaded
 * once for four weight rows, eight chains are in flight, and the four sums are
 * reduced together (three hadds) instead of one horizontal sum per row, which
 * is what bounds a row of a few hundred bytes. */
INL __m128 hsum8x4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

#define PLAIN_DOT4(NAME, LOAD, SCALAR, ESZ)                                                      \
    INL void NAME(const uint8_t *w, uint64_t rb, const float *x, int64_t n, float *out) {        \
        __m256 a[4], b[4];                                                                       \
        for (int k = 0; k < 4; k++) a[k] = b[k] = _mm256_setzero_ps();                          \
        int64_t c = 0;                                                                           \
        for (; c + 16 <= n; c += 16) {                                                           \
            if (((c * ESZ) & 63) == 0)                                                           \
                for (int k = 0; k < 4; k++)                                                      \
                    _mm_prefetch((const char *)(w + k * rb + c * ESZ) + PF_DIST, _MM_HINT_T0);   \
            __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);                 \
            for (int k = 0; k < 4; k++) {                                                        \
                a[k] = _mm256_fmadd_ps(LOAD(w + k * rb + c * ESZ), x0, a[k]);                    \
                b[k] = _mm256_fmadd_ps(LOAD(w + k * rb + (c + 8) * ESZ), x1, b[k]);              \
            }                                                                                    \
        }                                                                                        \
        for (; c + 8 <= n; c += 8) {                                                             \
            __m256 x0 = _mm256_loadu_ps(x + c);                                                  \
            for (int k = 0; k < 4; k++) a[k] = _mm256_fmadd_ps(LOAD(w + k * rb + c * ESZ), x0, a[k]); \
        }                                                                                        \
        for (int k = 0; k < 4; k++) a[k] = _mm256_add_ps(a[k], b[k]);                            \
        _mm_storeu_ps(out, hsum8x4(a[0], a[1], a[2], a[3]));                                     \
        for (; c < n; c++)                                                                       \
            for (int k = 0; k < 4; k++) out[k] += SCALAR(w + k * rb + c * ESZ) * x[c];           \
    }

PLAIN_DOT4(dot4_f32, ld_f32, sc_f32, 4)
PLAIN_DOT4(dot4_f16, ld_f16, sc_f16, 2)

/* --- Q8_0: {f16 d; i8 q[32]}; sum_b d_b * (q_b . x_b), two blocks in flight -- */

/* Blocks [0, nb) of BB bytes each of the row at w through BLOCK(blk, b,
 * chain): two blocks a step in two chains (every index known at compile
 * time), PREFETCH(blk) of each pair, an odd last block into chain 0. */
#define BLOCK_PAIRS(BLOCK, nb, BB, PREFETCH)                                                   \
    do {                                                                                       \
        int64_t b_ = 0;                                                                        \
        for (; b_ + 2 <= (nb); b_ += 2) {                                                      \
            const uint8_t *blk_ = w + b_ * (BB);                                               \
            PREFETCH(blk_);                                                                    \
            BLOCK(blk_, b_, 0);                                                                \
            BLOCK(blk_ + (BB), b_ + 1, 1);                                                     \
        }                                                                                      \
        if (b_ < (nb)) BLOCK(w + b_ * (BB), b_, 0);                                            \
    } while (0)
#define Q8_PAIRS(BLOCK, nb) BLOCK_PAIRS(BLOCK, nb, 34, prefetch_q8_pair)

INL __m256 q8_part(const uint8_t *b, int k) { return ld_i8(b + 2 + 8 * k); }

/* acc[i][h] += d * (q . x) over one 32-element block at column 32 b of
 * each input row, q its four widened parts (Q8_0 and Q4_0 alike). */
INL void block32_acc(const __m256 q[4], __m256 d, const float *x, int64_t ldx, int64_t b, int nx,
                     __m256 acc[][2], int h) {
    for (int i = 0; i < nx; i++) {
        const float *xp = x + i * ldx + b * 32;
        __m256 s = _mm256_mul_ps(q[0], _mm256_loadu_ps(xp));
        __m256 t = _mm256_mul_ps(q[1], _mm256_loadu_ps(xp + 8));
        s = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xp + 16), s);
        t = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xp + 24), t);
        acc[i][h] = _mm256_fmadd_ps(d, _mm256_add_ps(s, t), acc[i][h]);
    }
}

INL void dot_q8_0(const uint8_t *w, const float *x, int64_t ldx, int64_t n, int nx, int u,
                  float *out) {
    (void)u;
    __m256 acc[XG][2];
    for (int i = 0; i < nx; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    int64_t nb = n / 32, b = 0;
    for (; b + 2 <= nb; b += 2) {
        for (int h = 0; h < 2; h++) {
            const uint8_t *blk = w + (b + h) * 34;
            if (h == 0) prefetch_q8_pair(blk);
            const __m256 q[4] = {q8_part(blk, 0), q8_part(blk, 1), q8_part(blk, 2), q8_part(blk, 3)};
            block32_acc(q, _mm256_set1_ps(h2f(blk)), x, ldx, b + h, nx, acc, h);
        }
    }
    for (; b < nb; b++) {
        const uint8_t *blk = w + b * 34;
        __m256 d = _mm256_set1_ps(h2f(blk));
        for (int i = 0; i < nx; i++) {
            const float *xp = x + i * ldx + b * 32;
            __m256 s = _mm256_mul_ps(q8_part(blk, 0), _mm256_loadu_ps(xp));
            s = _mm256_fmadd_ps(q8_part(blk, 1), _mm256_loadu_ps(xp + 8), s);
            s = _mm256_fmadd_ps(q8_part(blk, 2), _mm256_loadu_ps(xp + 16), s);
            s = _mm256_fmadd_ps(q8_part(blk, 3), _mm256_loadu_ps(xp + 24), s);
            acc[i][0] = _mm256_fmadd_ps(d, s, acc[i][0]);
        }
    }
    for (int i = 0; i < nx; i++) out[i] = hsum8(_mm256_add_ps(acc[i][0], acc[i][1]));
}

/* --- Q4_K: {f16 d, dmin; u8 scales[12]; u8 qs[128]} per 256 ------------------- */

/* The eight (d sc_j, dmin m_j) of a Q4_K block into dsc[8], dmn[8]: the 12
 * scale bytes as three words, each byte lane unpacked as dtype.c's
 * q4k_scale_min unpacks one (sc_j, m_j): j < 4 the low six bits of bytes j
 * and j + 4; j >= 4 a nibble of byte j + 4 with the top two bits of byte
 * j - 4 or j. The products d * sc and dmin * m are dequant_q4_k's. */
INL void q4k_scales(const uint8_t *q, float d, float dmin, float *dsc, float *dmn) {
    uint32_t w0, w1, w2;
    memcpy(&w0, q, 4), memcpy(&w1, q + 4, 4), memcpy(&w2, q + 8, 4);
    const uint32_t sc_lo = w0 & 0x3f3f3f3fu, m_lo = w1 & 0x3f3f3f3fu;
    const uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
    const uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
    const __m128i sc8 = _mm_set_epi32(0, 0, (int)sc_hi, (int)sc_lo), m8 = _mm_set_epi32(0, 0, (int)m_hi, (int)m_lo);
    _mm256_storeu_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc8))));
    _mm256_storeu_ps(dmn, _mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m8))));
}

INL __m256 u8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

INL void dot_q4_k(const uint8_t *w, const float *x, int64_t ldx, int64_t n, int nx, int u,
                  float *out) {
    (void)u;
    __m256 acc[XG][2];
    for (int i = 0; i < nx; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(0x0f);
    for (int64_t sb = 0; sb < n / 256; sb++) {
        const uint8_t *blk = w + sb * 144;
        const uint8_t *qs = blk + 16;
        float dsc[8], dmn[8];
        q4k_scales(blk + 4, h2f(blk), h2f(blk + 2), dsc, dmn);
        for (int p = 0; p < 4; p++) {
            const __m256 d1 = _mm256_broadcast_ss(dsc + 2 * p), m1 = _mm256_broadcast_ss(dmn + 2 * p);
            const __m256 d2 = _mm256_broadcast_ss(dsc + 2 * p + 1), m2 = _mm256_broadcast_ss(dmn + 2 * p + 1);
            for (int h = 0; h < 2; h++) {
                __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(qs + 32 * p + 16 * h));
                __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
                __m256 w0 = _mm256_fmsub_ps(d1, u8_to_ps(lo), m1);
                __m256 w1 = _mm256_fmsub_ps(d1, u8_to_ps(_mm_srli_si128(lo, 8)), m1);
                __m256 w2 = _mm256_fmsub_ps(d2, u8_to_ps(hi), m2);
                __m256 w3 = _mm256_fmsub_ps(d2, u8_to_ps(_mm_srli_si128(hi, 8)), m2);
                int64_t o = sb * 256 + 64 * p + 16 * h;
                for (int i = 0; i < nx; i++) {
                    const float *xp = x + i * ldx + o;
                    acc[i][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xp), acc[i][0]);
                    acc[i][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xp + 8), acc[i][1]);
                    acc[i][0] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xp + 32), acc[i][0]);
                    acc[i][1] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xp + 40), acc[i][1]);
                }
            }
        }
    }
    for (int i = 0; i < nx; i++) out[i] = hsum8(_mm256_add_ps(acc[i][0], acc[i][1]));
}

/* --- Q4_0: {f16 d; u8 qs[16]} per 32, low nibbles elements 0-15, high 16-31,
 * w = d * (q - 8): each block's codes widened in registers (q - 8 exact in
 * f32), its products scaled by d once, two blocks in flight ------------------ */

/* The four widened parts (d not applied) of a Q4_0 block: q - 8 for the
 * low nibbles (elements 0-15), then the high (16-31). */
INL void q4_0_parts(const uint8_t *blk, __m256 w[4]) {
    const __m128i m4 = _mm_set1_epi8(0x0f), k8 = _mm_set1_epi8(8);
    const __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(blk + 2));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, m4), k8);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), k8);
    w[0] = i8_to_ps(lo), w[1] = i8_to_ps(_mm_srli_si128(lo, 8));
    w[2] = i8_to_ps(hi), w[3] = i8_to_ps(_mm_srli_si128(hi, 8));
}

/* 36 bytes a step: one line in 16/9 steps, so two prefetches. */
INL void prefetch_q4_0_pair(const uint8_t *blk) {
    _mm_prefetch((const char *)blk + PF_DIST, _MM_HINT_T0);
    _mm_prefetch((const char *)blk + PF_DIST + 32, _MM_HINT_T0);
}
#define Q4_0_BLOCK(blk, b, h)                                                                  \
    do {                                                                                       \
        q4_0_parts(blk, q);                                                                    \
        block32_acc(q, _mm256_set1_ps(h2f(blk)), x, ldx, b, nx, acc, h);                       \
    } while (0)

INL void dot_q4_0(const uint8_t *w, const float *x, int64_t ldx, int64_t n, int nx, int u, float *out) {
    (void)u;
    __m256 acc[XG][2], q[4];
    for (int i = 0; i < nx; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    BLOCK_PAIRS(Q4_0_BLOCK, n / 32, 18, prefetch_q4_0_pair);
    for (int i = 0; i < nx; i++) out[i] = hsum8(_mm256_add_ps(acc[i][0], acc[i][1]));
}
#undef Q4_0_BLOCK

/* --- other block types: decoded 256 elements at a time on the stack ----------- */

INL void dot_chunked(uint32_t dtype, const uint8_t *w, const float *x, int64_t ldx, int64_t n,
                     int nx, int u, float *out) {
    float buf[256] __attribute__((aligned(32)));
    float part[XG];
    int be = tsr_dtype_block_elems(dtype), bb = tsr_dtype_block_bytes(dtype);
    for (int i = 0; i < nx; i++) out[i] = 0.0f;
    for (int64_t c = 0; c < n; c += 256) {
        int64_t m = n - c < 256 ? n - c : 256;
        tsr_dequant_row(dtype, w + (uint64_t)(c / be) * (uint64_t)bb, buf, m);
        dot_f32((const uint8_t *)buf, x + c, ldx, m, nx, u, part);
        for (int i = 0; i < nx; i++) out[i] += part[i];
    }
}

/* --- E4M3 (FP8): 32 codes a step ---------------------------------------------
 * A code b in the high byte of a 16-bit lane, shifted right by one with its
 * sign and masked with 0xbf80, is an f16 of its value times 2^-8 (4 exponent
 * bits under bias 7 against 5 under bias 15, subnormals alike): three
 * operations per 16 codes and a conversion per 8, where ld_f8 takes ten
 * operations per 8 (Qwen2.5-0.5B-shaped gate/up, channel-scaled E4M3, two
 * threads: 10.9 GB/s with ld_f8, 19.2 with this; one thread 10-11 GB/s, the
 * shuffle and FMA ports, not memory, bound it; f16 halves stored and
 * converted from memory to spare the shuffle port: 3% on gate/up, not
 * kept). The sums are scaled by 2^8 at the end (exact). The NaN code
 * (S.1111.111) would read as 1.875 x 2^-8: its lanes are OR-ed into a mask
 * as they go, and a row that holds one is summed again through the exact
 * scalar path. */
INL void f8x32(__m256i v, __m256 *o) {
    const __m256i z = _mm256_setzero_si256(), m = _mm256_set1_epi16((short)0xbf80);
    const __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(z, v), 1), m); /* 0-7, 16-23 */
    const __m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(z, v), 1), m); /* 8-15, 24-31 */
    o[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(lo));
    o[1] = _mm256_cvtph_ps(_mm256_castsi256_si128(hi));
    o[2] = _mm256_cvtph_ps(_mm256_extracti128_si256(lo, 1));
    o[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(hi, 1));
}

/* The 32 codes from column c of w against each input row into acc (values
 * times 2^-8), their NaN codes OR-ed into nan: the step of dot_f8 and
 * dot_f8_blocks, written once (0.5B gate/up with 128 x 128 block scales
 * 489-515 us a call against 501-552 with the step written out in each, three
 * interleaved rounds: the same). */
#define F8_STEP(c)                                                                                       \
    do {                                                                                                 \
        if (((c) & 63) == 0) prefetch_two_level(w + (c));                                               \
        const __m256i v_ = _mm256_loadu_si256((const __m256i *)(const void *)(w + (c)));                  \
        nan = _mm256_or_si256(nan, _mm256_cmpeq_epi8(_mm256_and_si256(v_, m7), m7));                     \
        __m256 f_[4];                                                                                    \
        f8x32(v_, f_);                                                                                   \
        for (int i_ = 0; i_ < nx; i_++)                                                                  \
            for (int k_ = 0; k_ < 4; k_++)                                                               \
                acc[i_][k_] =                                                                            \
                    _mm256_fmadd_ps(f_[k_], _mm256_loadu_ps(x + i_ * ldx + (c) + 8 * k_), acc[i_][k_]);  \
    } while (0)

/* The sum of four accumulators' lanes. */
INL float hsum8x4v(const __m256 a[4]) {
    return hsum8(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
}

INL void dot_f8(const uint8_t *w, const float *x, int64_t ldx, int64_t n, int nx, int u, float *out) {
    (void)u;
    __m256 acc[XG][4];
    for (int i = 0; i < nx; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = _mm256_setzero_ps();
    const __m256i m7 = _mm256_set1_epi8(0x7f);
    __m256i nan = _mm256_setzero_si256();
    int64_t c = 0;
    for (; c + 32 <= n; c += 32) F8_STEP(c);
    if (!_mm256_testz_si256(nan, nan)) { /* a NaN code: the exact path */
        dot_chunked(TSR_DTYPE_F8_E4M3, w, x, ldx, n, nx, 1, out);
        return;
    }
    for (int i = 0; i < nx; i++) {
        float t = hsum8x4v(acc[i]) * 256.0f;
        for (int64_t cc = c; cc < n; cc++) t += sc_f8(w + cc) * x[i * ldx + cc];
        out[i] = t;
    }
}

/* One weight row against every input row, XG at a time, with nx and the
 * number of chains known at compile time inside each case. */
#define ROW_CALL(DOT, U1, g, N) DOT(row, a->x + (int64_t)(g) * a->ldx, a->ldx, a->cols, N, CHAINS(N, U1), out)
#define STORE_S(g, i) Y_AT(g, i) = out[i] * s
#define STORE_1(g, i) Y_AT(g, i) = out[i]
#define ROW_DRIVER(NAME, DOT, U1)                                                             \
    static void NAME(const tsr_gemv_args *a, int64_t r0, int64_t r1, const float *rs) {       \
        float out[XG];                                                                        \
        for (int64_t r = r0; r < r1; r++) {                                                   \
            const uint8_t *row = a->w + (uint64_t)r * a->row_bytes;                           \
            float s = rs ? rs[r] : 1.0f;                                                      \
            EACH_GROUP(a->nx, STORE_S, ROW_CALL, DOT, U1)                                     \
        }                                                                                     \
    }

/* Chains for one input row: enough that a row of 64 bytes per iteration or
 * more keeps the loads flowing. */
ROW_DRIVER(rows_f32, dot_f32, 4)
ROW_DRIVER(rows_f16, dot_f16, 4)
ROW_DRIVER(rows_bf16, dot_bf16, 4)
ROW_DRIVER(rows_i8, dot_i8, 8)
ROW_DRIVER(rows_f8, dot_f8, 8)

/* E4M3 with scales along the row (a->cscale, FP8 checkpoints' blocks): each
 * block's products summed in vectors as dot_f8 sums them, then added into
 * the row's vectors times the block's scale (one multiply-add a vector, no
 * horizontal sum a block); a block's columns past its whole 32-code steps
 * in exact scalars. Blocks narrower than a step, or a NaN code: each block
 * through dot_f8 (scalar tails, the exact path), its sum times its scale. */
INL void dot_f8_blocks(const uint8_t *w, const float *x, int64_t ldx, int64_t n, int nx, const float *cs,
                       int64_t bc, float *out) {
    float part[XG], tail[XG];
    const __m256i m7 = _mm256_set1_epi8(0x7f);
    __m256i nan = _mm256_setzero_si256();
    __m256 tot[XG][4];
    for (int i = 0; i < nx; i++) tot[i][0] = tot[i][1] = tot[i][2] = tot[i][3] = _mm256_setzero_ps(), tail[i] = 0.0f;
    for (int64_t c0 = 0, b = 0; c0 < n && bc >= 32; c0 += bc, b++) {
        const int64_t len = n - c0 < bc ? n - c0 : bc, end = c0 + len / 32 * 32;
        __m256 acc[XG][4];
        for (int i = 0; i < nx; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = _mm256_setzero_ps();
        for (int64_t c = c0; c < end; c += 32) F8_STEP(c);
        const __m256 s = _mm256_broadcast_ss(cs + b);
        for (int i = 0; i < nx; i++) {
            for (int k = 0; k < 4; k++) tot[i][k] = _mm256_fmadd_ps(acc[i][k], s, tot[i][k]);
            float t = 0.0f;
            for (int64_t cc = end; cc < c0 + len; cc++) t += sc_f8(w + cc) * x[i * ldx + cc];
            tail[i] = fmaf(cs[b], t, tail[i]);
        }
    }
    if (bc >= 32 && _mm256_testz_si256(nan, nan)) {
        for (int i = 0; i < nx; i++)
            out[i] = hsum8x4v(tot[i]) * 256.0f + tail[i];
        return;
    }
    for (int i = 0; i < nx; i++) out[i] = 0.0f;
    for (int64_t c0 = 0, b = 0; c0 < n; c0 += bc, b++) {
        dot_f8(w + c0, x + c0, ldx, n - c0 < bc ? n - c0 : bc, nx, 0, part);
        for (int i = 0; i < nx; i++) out[i] = fmaf(cs[b], part[i], out[i]);
    }
}
#define F8B_CALL(F, g, N) F(row, a->x + (int64_t)(g) * a->ldx, a->ldx, a->cols, N, cs, a->cscale_cols, out)
static void rows_f8_blocks(const tsr_gemv_args *a, int64_t r0, int64_t r1) {
    float out[XG];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = a->w + (uint64_t)r * a->row_bytes;
        const float *cs = tsr_gemv_cscale_row(a, r);
        EACH_GROUP(a->nx, STORE_1, F8B_CALL, dot_f8_blocks)
    }
}
ROW_DRIVER(rows_q8_0, dot_q8_0, 4)
ROW_DRIVER(rows_q4_k, dot_q4_k, 4)
ROW_DRIVER(rows_q4_0, dot_q4_0, 4)

/* Short rows: four weight rows per step against each input row in turn (the
 * four rows stay in L1 meanwhile), the rest one at a time. From a few hundred
 * columns on the per-row sum is amortised, and one weight stream at a time
 * serves DRAM better than four. */
#define ROW4_MAX_COLS 512
#define ROW4_DRIVER(NAME, DOT4, ROWS)                                                           \
    static void NAME(const tsr_gemv_args *a, int64_t r0, int64_t r1) {                          \
        int64_t r = r0;                                                                         \
        for (; r + 4 <= r1; r += 4)                                                             \
            for (int i = 0; i < a->nx; i++)                                                     \
                DOT4(a->w + (uint64_t)r * a->row_bytes, a->row_bytes, a->x + i * a->ldx, a->cols, \
                     a->y + i * a->ldy + r);                                                    \
        if (r < r1) ROWS(a, r, r1, NULL);                                                       \
    }

ROW4_DRIVER(rows4_f32, dot4_f32, rows_f32)
ROW4_DRIVER(rows4_f16, dot4_f16, rows_f16)


#define CHUNKED_CALL(dtype, g, N) \
    dot_chunked(dtype, row, a->x + (int64_t)(g) * a->ldx, a->ldx, a->cols, N, CHAINS(N, 4), out)
static void rows_chunked(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int64_t r1) {
    float out[XG];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = a->w + (uint64_t)r * a->row_bytes;
        EACH_GROUP(a->nx, STORE_1, CHUNKED_CALL, dtype)
    }
}

static int run_permuted(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int64_t r1);

static void rows_run(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int64_t r1) {
    if (run_permuted(dtype, a, r0, r1)) return; /* the dtypes with a permuted-activation path */
    switch (dtype) {
    case TSR_DTYPE_F32:
        if (a->cols <= ROW4_MAX_COLS) rows4_f32(a, r0, r1);
        else rows_f32(a, r0, r1, NULL);
        break;
    case TSR_DTYPE_F16:
        if (a->cols <= ROW4_MAX_COLS) rows4_f16(a, r0, r1);
        else rows_f16(a, r0, r1, NULL);
        break;
    case TSR_DTYPE_BF16: rows_bf16(a, r0, r1, NULL); break;
    case TSR_DTYPE_I8: rows_i8(a, r0, r1, a->scale); break;
    case TSR_DTYPE_F8_E4M3:
        if (a->cscale) rows_f8_blocks(a, r0, r1);
        else rows_f8(a, r0, r1, a->scale);
        break;
    case TSR_DTYPE_Q8_0: rows_q8_0(a, r0, r1, NULL); break;
    case TSR_DTYPE_Q4_K: rows_q4_k(a, r0, r1, NULL); break;
    case TSR_DTYPE_Q4_0: rows_q4_0(a, r0, r1, NULL); break;
    default: rows_chunked(dtype, a, r0, r1); break;
    }
}

void tsr_gemv_rows_avx2(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int64_t r1) {
    if (r1 > r0) prefetch_start(a->w + (uint64_t)r0 * a->row_bytes, (uint64_t)(r1 - r0) * a->row_bytes);
#define RUN(c0, c1) rows_run(dtype, a, c0, c1)
    EACH_Y_RUN(a, r0, r1, RUN)
#undef RUN
}

/* --- shuffle-free paths for bf16, i8, Q4_K (one or two rows) and Q6_K -------
 * Widening bytes or halves to 32-bit lanes takes a shuffle per 8 elements,
 * and the shuffle port, not memory, then bounds decode. Instead, a 32-byte
 * load is split with shifts: lane j of part k holds element G*j + k (G = 2
 * for bf16, 4 for int8). The activations are permuted the same way once per
 * call (xp[b*8G + 8k + j] = x[b*8G + G*j + k]; 16 lanes for the AVX-512
 * bf16 kernel), so the products and their sum are the same as in element
 * order, up to summation order.
 * Q8_0 had such a path too; on this project's AMD EPYC machine dot_q8_0's
 * widening loads were as fast or faster (bench_gemv -t 2, share of the
 * streaming read at one activation row, medians of three interleaved runs:
 * 4864 x 896 73% against 58%, 896 x 4864 67% against 66%; the LM head shape
 * once, 77% against 64%; two rows even), so it was removed. */

static void permute_x(const float *x, int64_t ldx, int nx, int64_t n, int g, int lanes, float *xp) {
    int64_t bw = (int64_t)lanes * g, nb = n / bw;
    for (int i = 0; i < nx; i++) {
        const float *xi = x + i * ldx;
        float *o = xp + i * n;
        for (int64_t b = 0; b < nb; b++)
            for (int k = 0; k < g; k++)
                for (int j = 0; j < lanes; j++) o[b * bw + lanes * k + j] = xi[b * bw + g * j + k];
        for (int64_t c = nb * bw; c < n; c++) o[c] = xi[c]; /* tail in order */
    }
}

INL __m256 i8_part(__m256i v, int k) {
    __m256i t = k == 3 ? v : _mm256_slli_epi32(v, 24 - 8 * k);
    return _mm256_cvtepi32_ps(_mm256_srai_epi32(t, 24));
}

/* bf16: 16 elements per 32-byte load: two chains per input row, four at
 * nx 1 (two loads per step). With two chains a row is bound by the FMA
 * latency (32 bytes per 4-5 cycles: about the DRAM rate of one core, no
 * slack), so decode takes 64 bytes per step in four independent chains:
 * bf16p_one, over the whole 32-element steps of n, leaves the row's lanes
 * in *acc0 and *acc1 (chains 0 + 2, 1 + 3) and returns the first column it
 * did not take. */
INL int64_t bf16p_one(const uint8_t *w, const float *xp, int64_t n, __m256 *acc0, __m256 *acc1) {
    const __m256i hi_mask = _mm256_set1_epi32((int)0xffff0000u);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t c = 0;
    for (; c + 32 <= n; c += 32) {
        prefetch_two_level(w + 2 * c);
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(w + 2 * c));
        __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)(w + 2 * c + 32));
        __m256 v0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        __m256 v1 = _mm256_castsi256_ps(_mm256_and_si256(v, hi_mask));
        __m256 u0 = _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
        __m256 u1 = _mm256_castsi256_ps(_mm256_and_si256(u, hi_mask));
        a0 = _mm256_fmadd_ps(v0, _mm256_loadu_ps(xp + c), a0);
        a1 = _mm256_fmadd_ps(v1, _mm256_loadu_ps(xp + c + 8), a1);
        a2 = _mm256_fmadd_ps(u0, _mm256_loadu_ps(xp + c + 16), a2);
        a3 = _mm256_fmadd_ps(u1, _mm256_loadu_ps(xp + c + 24), a3);
    }
    *acc0 = _mm256_add_ps(a0, a2);
    *acc1 = _mm256_add_ps(a1, a3);
    return c;
}

INL void bf16p_dot(const uint8_t *w, const float *xp, int64_t ldx, int64_t n, int nx, float *out) {
    __m256 acc[XG][2];
    for (int i = 0; i < nx; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const __m256i hi_mask = _mm256_set1_epi32((int)0xffff0000u);
    int64_t c = 0;
    if (nx == 1) c = bf16p_one(w, xp, n, &acc[0][0], &acc[0][1]);
    for (; c + 16 <= n; c += 16) {
        if ((c & 31) == 0) _mm_prefetch((const char *)(w + 2 * c) + PF_DIST, _MM_HINT_T0);
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(w + 2 * c));
        __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        __m256 hi = _mm256_castsi256_ps(_mm256_and_si256(v, hi_mask));
        for (int i = 0; i < nx; i++) {
            const float *x = xp + i * ldx + c;
            acc[i][0] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x), acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + 8), acc[i][1]);
        }
    }
    for (int i = 0; i < nx; i++) {
        float t = hsum8(_mm256_add_ps(acc[i][0], acc[i][1]));
        for (int64_t cc = c; cc < n; cc++) t += sc_bf16(w + 2 * cc) * xp[i * ldx + cc];
        out[i] = t;
    }
}

/* int8 (no block scale): 32 elements per load. */
INL void i8p_dot(const uint8_t *w, const float *xp, int64_t ldx, int64_t n, int nx, float *out) {
    __m256 acc[XG][2];
    for (int i = 0; i < nx; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= n; c += 32) {
        _mm_prefetch((const char *)(w + c) + PF_DIST, _MM_HINT_T0);
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(w + c));
        __m256 p0 = i8_part(v, 0), p1 = i8_part(v, 1), p2 = i8_part(v, 2), p3 = i8_part(v, 3);
        for (int i = 0; i < nx; i++) {
            const float *x = xp + i * ldx + c;
            acc[i][0] = _mm256_fmadd_ps(p0, _mm256_loadu_ps(x), acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(p1, _mm256_loadu_ps(x + 8), acc[i][1]);
            acc[i][0] = _mm256_fmadd_ps(p2, _mm256_loadu_ps(x + 16), acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(p3, _mm256_loadu_ps(x + 24), acc[i][1]);
        }
    }
    for (int i = 0; i < nx; i++) {
        float t = hsum8(_mm256_add_ps(acc[i][0], acc[i][1]));
        for (int64_t cc = c; cc < n; cc++) t += (float)(int8_t)w[cc] * xp[i * ldx + cc];
        out[i] = t;
    }
}

#define PERM_CALL(DOT, g, N) DOT(row, xp + (int64_t)(g) * a->cols, a->cols, a->cols, N, out)
#define PERM_DRIVER(NAME, DOT)                                                                 \
    static void NAME(const tsr_gemv_args *a, int64_t r0, int64_t r1, const float *xp,          \
                     const float *rs) {                                                        \
        float out[XG];                                                                         \
        for (int64_t r = r0; r < r1; r++) {                                                    \
            const uint8_t *row = a->w + (uint64_t)r * a->row_bytes;                            \
            float s = rs ? rs[r] : 1.0f;                                                       \
            EACH_GROUP(a->nx, STORE_S, PERM_CALL, DOT)                                         \
        }                                                                                      \
    }

/* Eight vectors summed across: lane k of the result is the sum of v[k]'s
 * lanes, paired as hsum8 pairs them (lane j with j + 4, then j + 2, j + 1),
 * so each sum is bit for bit hsum8's (hsum16x16's counterpart). */
INL __m256 hsum8x8(const __m256 *v) {
    __m256 a[4], b[2];
    for (int i = 0; i < 4; i++) /* [v_i lanes j + j+4 | v_i+4's], j < 4 */
        a[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[i], v[i + 4], 0x20), _mm256_permute2f128_ps(v[i], v[i + 4], 0x31));
    for (int i = 0; i < 2; i++) /* halves [x_0, y_0, x_1, y_1]: rows i, i+2 | i+4, i+6, lanes j + j+2 */
        b[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[i], a[i + 2]), _mm256_unpackhi_ps(a[i], a[i + 2]));
    return _mm256_add_ps(_mm256_unpacklo_ps(b[0], b[1]), _mm256_unpackhi_ps(b[0], b[1]));
}

/* PERM_DRIVER's loop over bf16p_dot, with one input row (columns whole
 * 32-element steps) in blocks of 8 weight rows summed across together and
 * stored as one vector: the same sums, without a horizontal sum, a tail
 * and a scalar store a row (as the AVX-512 int8 and Q8_0 decode's blocks of
 * 16; BENCHMARKS.md, twenty-eighth session). */
static void rows_bf16p(const tsr_gemv_args *a, int64_t r0, int64_t r1, const float *xp) {
    float out[XG];
    int64_t r = r0;
    if (a->nx == 1 && a->cols % 32 == 0)
        for (; r + 8 <= r1; r += 8) {
            __m256 v[8];
            for (int k = 0; k < 8; k++) {
                __m256 s0, s1;
                (void)bf16p_one(a->w + (uint64_t)(r + k) * a->row_bytes, xp, a->cols, &s0, &s1);
                v[k] = _mm256_add_ps(s0, s1);
            }
            _mm256_storeu_ps(a->y + r, hsum8x8(v));
        }
    for (; r < r1; r++) {
        const uint8_t *row = a->w + (uint64_t)r * a->row_bytes;
        EACH_GROUP(a->nx, STORE_1, PERM_CALL, bf16p_dot)
    }
}
PERM_DRIVER(rows_i8p, i8p_dot)

/* Q4_K: a weight is d * sc_j * q - dmin * m_j (sub-block j of 32, q a
 * nibble), so a row's dot is sum_j d sc_j (q_j . x_j) - dmin m_j sum(x_j):
 * the activations' sub-block sums are made once per call (after the
 * permuted rows, tsr_gemv_permute_x_avx2) and the nibbles are widened with
 * shifts and masks (no shuffle: lane j of part k holds byte 4j + k of a
 * 32-byte run, as for int8), each converted once for up to four input rows.
 * The per-element work is then a shift, a mask, a conversion and an FMA. */
INL __m256 q4_part(__m256i v, int sh) {
    const __m256i m4 = _mm256_set1_epi32(0x0f);
    __m256i t = sh ? _mm256_srli_epi32(v, sh) : v;
    return _mm256_cvtepi32_ps(sh == 28 ? t : _mm256_and_si256(t, m4));
}

INL void q4kp_dot(const uint8_t *w, const float *xp, const float *xs, int64_t n, int nx, float *out) {
    __m256 acc[XG], mins[XG];
    for (int i = 0; i < nx; i++) acc[i] = mins[i] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < n / 256; sb++) {
        const uint8_t *blk = w + sb * 144;
        _mm_prefetch((const char *)blk + PF_DIST, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + PF_DIST + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + PF_DIST + 128, _MM_HINT_T0);
        float dsc[8], dmn[8];
        q4k_scales(blk + 4, h2f(blk), h2f(blk + 2), dsc, dmn);
        const __m256 dm = _mm256_loadu_ps(dmn);
        for (int i = 0; i < nx; i++)
            mins[i] = _mm256_fmadd_ps(dm, _mm256_loadu_ps(xs + i * (n / 32) + sb * 8), mins[i]);
        for (int p = 0; p < 4; p++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 16 + 32 * p));
            __m256 lo[4], hi[4];
            for (int k = 0; k < 4; k++) lo[k] = q4_part(v, 8 * k), hi[k] = q4_part(v, 8 * k + 4);
            const __m256 d0 = _mm256_broadcast_ss(dsc + 2 * p), d1 = _mm256_broadcast_ss(dsc + 2 * p + 1);
            const int64_t b = sb * 8 + 2 * p; /* the sub-block of the low nibbles */
            for (int i = 0; i < nx; i++) {
                const float *x0 = xp + i * n + b * 32, *x1 = x0 + 32;
                __m256 s0 = _mm256_mul_ps(lo[0], _mm256_loadu_ps(x0));
                __m256 s1 = _mm256_mul_ps(hi[0], _mm256_loadu_ps(x1));
                for (int k = 1; k < 4; k++) {
                    s0 = _mm256_fmadd_ps(lo[k], _mm256_loadu_ps(x0 + 8 * k), s0);
                    s1 = _mm256_fmadd_ps(hi[k], _mm256_loadu_ps(x1 + 8 * k), s1);
                }
                acc[i] = _mm256_fmadd_ps(d1, s1, _mm256_fmadd_ps(d0, s0, acc[i]));
            }
        }
    }
    for (int i = 0; i < nx; i++) out[i] = hsum8(_mm256_sub_ps(acc[i], mins[i]));
}

/* Q6_K ({u8 ql[128]; u8 qh[64]; i8 sc[16]; f16 d} per 256): each 32
 * consecutive weights are d * sc[16-group] * (q - 32), q six bits from a
 * nibble of ql and two bits of qh. The 32 codes of a group are put together
 * bytewise (16-bit shifts and byte masks), made signed (q - 32), and widened
 * as the int8 path widens (lane j of part k = byte 4j + k, activations
 * permuted alike), so that lanes 0-3 hold the first 16-group and lanes 4-7
 * the second: one vector of the two groups' d * sc scales each. */
/* The signed codes (q - 32) of half h of a Q6_K block (ql, qh its 64 and
 * 32 bytes): q[g] byte l is the code of element 128 h + 32 g + l. */
INL void q6k_codes(const uint8_t *ql, const uint8_t *qh, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)ql);
    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
    const __m256i hb = _mm256_loadu_si256((const __m256i *)(const void *)qh);
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
    for (int g = 0; g < 4; g++) q[g] = _mm256_sub_epi8(q[g], k32);
}

INL void q6kp_dot(const uint8_t *w, const float *xp, int64_t ldx, int64_t n, int nx, float *out) {
    __m256 acc[XG];
    for (int i = 0; i < nx; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < n / 256; sb++) {
        const uint8_t *blk = w + sb * 210;
        for (int o = 0; o < 256; o += 64) _mm_prefetch((const char *)blk + PF_DIST + o, _MM_HINT_T0);
        const __m256 d = _mm256_set1_ps(h2f(blk + 208));
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
            __m256i q[4];
            q6k_codes(ql, qh, q);
            /* d * sc[8 h + t] for t < 8: as dequant_q6_k, sc[is] for l < 16, sc[is + 1] after */
            const __m256 ds8 = _mm256_mul_ps(d, ld_i8(blk + 192 + 8 * h));
            for (int g = 0; g < 4; g++) { /* elements 128 h + 32 g + [0, 32) */
                const __m256i v = q[g];
                __m256 part[4];
                for (int k = 0; k < 4; k++) part[k] = i8_part(v, k);
                /* lanes 0-3 (elements 4j + k < 16) take scale 2g, lanes 4-7 scale 2g + 1 */
                const __m256 ds = _mm256_permutevar8x32_ps(ds8, _mm256_setr_epi32(2 * g, 2 * g, 2 * g, 2 * g, 2 * g + 1,
                                                                                  2 * g + 1, 2 * g + 1, 2 * g + 1));
                for (int i = 0; i < nx; i++) {
                    const float *xg = xp + i * ldx + sb * 256 + 128 * h + 32 * g;
                    __m256 t = _mm256_mul_ps(part[0], _mm256_loadu_ps(xg));
                    for (int k = 1; k < 4; k++) t = _mm256_fmadd_ps(part[k], _mm256_loadu_ps(xg + 8 * k), t);
                    acc[i] = _mm256_fmadd_ps(ds, t, acc[i]);
                }
            }
        }
    }
    for (int i = 0; i < nx; i++) out[i] = hsum8(acc[i]);
}
PERM_DRIVER(rows_q6kp, q6kp_dot)

#define Q4KP_CALL(XS, g, N) \
    q4kp_dot(row, xp + (int64_t)(g) * a->cols, (XS) + (int64_t)(g) * (a->cols / 32), a->cols, N, out)
static void rows_q4kp(const tsr_gemv_args *a, int64_t r0, int64_t r1, const float *xp) {
    const float *xs = xp + (int64_t)a->nx * a->cols;
    float out[XG];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = a->w + (uint64_t)r * a->row_bytes;
        EACH_GROUP(a->nx, STORE_1, Q4KP_CALL, xs)
    }
}

/* Permuted copy of x for this call's rows (a->xp when the caller made it
 * once for many calls); 0 when it cannot be had (then the in-order kernels
 * run). Large batches skip it: they come back to the activations often
 * enough that the copy is cheap, but its size is not. */
int64_t tsr_gemv_permuted_x_floats_avx2(uint32_t dtype, const tsr_gemv_args *a) {
    const int64_t n = (int64_t)a->nx * a->cols;
    if (n > ((int64_t)1 << 22)) return 0;
    /* Q4_K: with each sub-block's sum; from three input rows on the widened
     * weights (dot_q4_k: d sc q - dmin m made once for all rows) cost fewer
     * products (bench_gemv, 896 x 4864, 4 rows: 7.2 against 6.1 GB/s) */
    if (dtype == TSR_DTYPE_Q4_K) return a->nx <= 2 ? n + n / 32 : 0;
    return dtype == TSR_DTYPE_BF16 || dtype == TSR_DTYPE_I8 || dtype == TSR_DTYPE_Q6_K ? n : 0;
}

void tsr_gemv_permute_x_avx2(uint32_t dtype, const tsr_gemv_args *a, float *xp) {
    permute_x(a->x, a->ldx, a->nx, a->cols, dtype == TSR_DTYPE_BF16 ? 2 : 4, 8, xp);
    if (dtype != TSR_DTYPE_Q4_K) return;
    float *xs = xp + (int64_t)a->nx * a->cols; /* [nx][cols / 32], in element order */
    for (int i = 0; i < a->nx; i++)
        for (int64_t b = 0; b < a->cols / 32; b++) {
            const float *xb = a->x + i * a->ldx + b * 32;
            __m256 t = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)),
                                     _mm256_add_ps(_mm256_loadu_ps(xb + 16), _mm256_loadu_ps(xb + 24)));
            xs[i * (a->cols / 32) + b] = hsum8(t);
        }
}

static int run_permuted(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int64_t r1) {
    const int64_t n = tsr_gemv_permuted_x_floats_avx2(dtype, a);
    if (n == 0) return 0;
    float *own = NULL;
    const float *xp = a->xp;
    if (!xp) {
        if (!(own = malloc((size_t)n * sizeof *own))) return 0;
        tsr_gemv_permute_x_avx2(dtype, a, own);
        xp = own;
    }
    if (dtype == TSR_DTYPE_BF16) rows_bf16p(a, r0, r1, xp);
    else if (dtype == TSR_DTYPE_Q4_K) rows_q4kp(a, r0, r1, xp);
    else if (dtype == TSR_DTYPE_Q6_K) rows_q6kp(a, r0, r1, xp, NULL);
    else rows_i8p(a, r0, r1, xp, a->scale);
    free(own);
    return 1;
}

/* --- widening for sgemm tiles and the GEMM's panels: f16 with F16C, bf16 with
 * a shift, int8 and Q8_0 with sign extension (d * (float)q as tsr_dequant_row:
 * the same values, eight at a time instead of one) ------------------------- */

int tsr_gemv_widen_row_avx2(uint32_t dtype, const uint8_t *src, int64_t n, float *dst) {
    int64_t c = 0;
    if (dtype == TSR_DTYPE_I8) {
        for (; c + 8 <= n; c += 8) _mm256_storeu_ps(dst + c, ld_i8(src + c));
        for (; c < n; c++) dst[c] = sc_i8(src + c);
        return 1;
    }
    if (dtype == TSR_DTYPE_F8_E4M3) {
        for (; c + 8 <= n; c += 8) _mm256_storeu_ps(dst + c, ld_f8(src + c));
        for (; c < n; c++) dst[c] = sc_f8(src + c);
        return 1;
    }
    if (dtype == TSR_DTYPE_Q4_K) { /* d1 * q - m1 as dequant_q4_k, 256 at a time */
        for (; c + 256 <= n; c += 256) {
            const uint8_t *blk = src + c / 256 * 144;
            float dsc[8], dmn[8];
            q4k_scales(blk + 4, h2f(blk), h2f(blk + 2), dsc, dmn);
            for (int p = 0; p < 4; p++) {
                const __m128i m4 = _mm_set1_epi8(0x0f);
                for (int hn = 0; hn < 2; hn++) {
                    const __m256 d1 = _mm256_broadcast_ss(dsc + 2 * p + hn), m1 = _mm256_broadcast_ss(dmn + 2 * p + hn);
                    for (int hf = 0; hf < 2; hf++) {
                        __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(blk + 16 + 32 * p + 16 * hf));
                        q = hn ? _mm_and_si128(_mm_srli_epi16(q, 4), m4) : _mm_and_si128(q, m4);
                        float *o = dst + c + 64 * p + 32 * hn + 16 * hf;
                        _mm256_storeu_ps(o, _mm256_sub_ps(_mm256_mul_ps(d1, u8_to_ps(q)), m1));
                        _mm256_storeu_ps(o + 8, _mm256_sub_ps(_mm256_mul_ps(d1, u8_to_ps(_mm_srli_si128(q, 8))), m1));
                    }
                }
            }
        }
        return c == n;
    }
    if (dtype == TSR_DTYPE_Q6_K) { /* (d * sc) * (q - 32) as dequant_q6_k */
        for (; c + 256 <= n; c += 256) {
            const uint8_t *blk = src + c / 256 * 210;
            const float d = h2f(blk + 208);
            const int8_t *sc = (const int8_t *)(blk + 192);
            __m256i q[4];
            for (int h = 0; h < 2; h++) {
                q6k_codes(blk + 64 * h, blk + 128 + 32 * h, q);
                for (int g = 0; g < 4; g++)
                    for (int e = 0; e < 32; e += 8) {
                        const int is = 8 * h + 2 * g + e / 16;
                        __m128i b = e < 16 ? _mm256_castsi256_si128(q[g]) : _mm256_extracti128_si256(q[g], 1);
                        if (e & 8) b = _mm_srli_si128(b, 8);
                        _mm256_storeu_ps(dst + c + 128 * h + 32 * g + e,
                                         _mm256_mul_ps(_mm256_set1_ps(d * (float)sc[is]), i8_to_ps(b)));
                    }
            }
        }
        return c == n;
    }
    if (dtype == TSR_DTYPE_Q4_0) { /* d * (float)(q - 8) as dequant_q4_0 */
        for (; c + 32 <= n; c += 32) {
            const uint8_t *blk = src + c / 32 * 18;
            const __m256 d = _mm256_set1_ps(h2f(blk));
            __m256 q[4];
            q4_0_parts(blk, q);
            for (int k = 0; k < 4; k++) _mm256_storeu_ps(dst + c + 8 * k, _mm256_mul_ps(d, q[k]));
        }
        return c == n;
    }
    if (dtype == TSR_DTYPE_Q8_0) { /* n is a multiple of 32 (tsr_dequant_row's contract) */
        for (; c + 32 <= n; c += 32) {
            const uint8_t *blk = src + c / 32 * 34;
            const __m256 d = _mm256_set1_ps(h2f(blk));
            for (int k = 0; k < 4; k++) _mm256_storeu_ps(dst + c + 8 * k, _mm256_mul_ps(d, q8_part(blk, k)));
        }
        return c == n;
    }
    if (dtype == TSR_DTYPE_F16) {
        for (; c + 8 <= n; c += 8) _mm256_storeu_ps(dst + c, ld_f16(src + 2 * c));
        for (; c < n; c++) dst[c] = sc_f16(src + 2 * c);
        return 1;
    }
    if (dtype == TSR_DTYPE_BF16) {
        for (; c + 8 <= n; c += 8) _mm256_storeu_ps(dst + c, ld_bf16(src + 2 * c));
        for (; c < n; c++) dst[c] = sc_bf16(src + 2 * c);
        return 1;
    }
    return 0;
}

/* clamp(round_to_nearest_even(src[c..c+8) * inv), +-bound) as int32 lanes:
 * the portable loops' arithmetic (nearbyintf in the default rounding mode). */
INL __m256i quant8(const float *src, __m256 vi, __m256 lo, __m256 hi) {
    __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(src), vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
}

/* q[c] = clamp(round_to_nearest_even(src[c] * inv), +-127), as the portable
 * loop, for the first n / 8 * 8 values; returns how many (the caller's loop
 * does the rest). */
int64_t tsr_gemv_quant_i8_avx2(const float *src, int64_t n, float inv, int8_t *q) {
    const __m256 vi = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256i i32 = quant8(src + c, vi, lo, hi);
        __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
        _mm_storel_epi64((__m128i *)(void *)(q + c), _mm_packs_epi16(i16, i16));
    }
    return c;
}

/* The same to +-32767 into int16. */
int64_t tsr_gemv_quant_i16_avx2(const float *src, int64_t n, float inv, int16_t *q) {
    const __m256 vi = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-32767.0f), hi = _mm256_set1_ps(32767.0f);
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256i i32 = quant8(src + c, vi, lo, hi);
        _mm_storeu_si128((__m128i *)(void *)(q + c),
                         _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1)));
    }
    return c;
}

/* --- int8 x int16: vpmaddwd, int32 sums flushed to f32 every 1024 ----------- */

/* The columns [c, n) past a kernel's whole steps, exactly in int32. */
INL int32_t i8_tail(const int8_t *w, const int16_t *x, int64_t c, int64_t n) {
    int32_t t = 0;
    for (; c < n; c++) t += (int32_t)w[c] * (int32_t)x[c];
    return t;
}

INL void i8_dot(const int8_t *w, const int16_t *x, int64_t ldx, int64_t n, int nx, float *out) {
    __m256 accf[XG];
    for (int i = 0; i < nx; i++) accf[i] = _mm256_setzero_ps();
    int64_t c = 0;
    while (c + 32 <= n) {
        int64_t end = c + 1024 < n ? c + 1024 : n;
        __m256i acc[XG][2];
        for (int i = 0; i < nx; i++) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
        for (; c + 32 <= end; c += 32) {
            _mm_prefetch((const char *)(w + c) + PF_DIST, _MM_HINT_T0);
            __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(w + c)));
            __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(w + c + 16)));
            for (int i = 0; i < nx; i++) {
                const int16_t *xp = x + i * ldx + c;
                acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)(const void *)xp)));
                acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(const void *)(xp + 16))));
            }
        }
        for (int i = 0; i < nx; i++)
            accf[i] = _mm256_add_ps(accf[i], _mm256_cvtepi32_ps(_mm256_add_epi32(acc[i][0], acc[i][1])));
    }
    for (int i = 0; i < nx; i++) out[i] = hsum8(accf[i]) + (float)i8_tail(w, x + i * ldx, c, n);
}

/* int16 activations (tsr_gemv_i8_args): DOT over LEN (columns or blocks) */
#define XQ_CALL(DOT, LEN, g, N) DOT(w, a->xq + (int64_t)(g) * a->cols, a->cols, LEN, N, out)
#define STORE_I8(g, i) Y_AT(g, i) = out[i] * a->wscale[r] * a->xscale[(g) + (i)]
#define STORE_XS(g, i) Y_AT(g, i) = out[i] * a->xscale[(g) + (i)]

/* The int8 x int16 driver NAME (declared with the qualifiers before it) over
 * the dot DOT: rows [r0, r1) in runs, each input row group through DOT. */
#define I8_ROWS(NAME, DOT)                                                                     \
    void NAME(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) {                             \
        float out[XG];                                                                         \
        if (r1 > r0) prefetch_start((const uint8_t *)a->w + (uint64_t)r0 * (uint64_t)a->cols,  \
                                    (uint64_t)(r1 - r0) * (uint64_t)a->cols);                  \
        EACH_Y_RUN(a, r0, r1, I8_RUN_##DOT)                                                    \
    }
#define I8_RUN(DOT, c0, c1)                                                                    \
    for (int64_t r = c0; r < c1; r++) {                                                        \
        const int8_t *w = a->w + (uint64_t)r * (uint64_t)a->cols;                              \
        EACH_GROUP(a->nx, STORE_I8, XQ_CALL, DOT, a->cols)                                     \
    }
#define I8_RUN_i8_dot(c0, c1) I8_RUN(i8_dot, c0, c1)
I8_ROWS(tsr_gemv_i8_rows_avx2, i8_dot)

/* --- Q8_0 (as stored) x int16: per block two vpmaddwd; a lane's four
 * products stay below 2^24 in magnitude (4 x 128 x 32767), so the block's
 * int32 lanes convert to f32 exactly; then times d, accumulated in f32. ---- */

/* One block's products for nx input rows into acc[i][h]. */
#define Q8I16_BLOCK(blk, b, h)                                                                  \
    do {                                                                                       \
        __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)((blk) + 2)));  \
        __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)((blk) + 18))); \
        __m256 d = _mm256_set1_ps(h2f(blk));                                                   \
        for (int i = 0; i < nx; i++) {                                                         \
            const __m256i *xp = (const __m256i *)(const void *)(x + i * ldx + (b) * 32);       \
            __m256i t = _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(xp)),          \
                                         _mm256_madd_epi16(w1, _mm256_loadu_si256(xp + 1)));     \
            acc[i][h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(t), acc[i][h]);                   \
        }                                                                                      \
    } while (0)

INL void q8i16_dot(const uint8_t *w, const int16_t *x, int64_t ldx, int64_t nb, int nx, float *out) {
    __m256 acc[XG][2];
    for (int i = 0; i < nx; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    Q8_PAIRS(Q8I16_BLOCK, nb);
    for (int i = 0; i < nx; i++) out[i] = hsum8(_mm256_add_ps(acc[i][0], acc[i][1]));
}
#undef Q8I16_BLOCK

void tsr_gemv_q8_0_i16_rows_avx2(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) {
    const int64_t nb = a->cols / 32;
    float out[XG];
    const uint64_t rb = (uint64_t)nb * 34;
    if (r1 > r0) prefetch_start((const uint8_t *)a->w + (uint64_t)r0 * rb, (uint64_t)(r1 - r0) * rb);
#define RUN(c0, c1)                                                                            \
    for (int64_t r = c0; r < c1; r++) {                                                        \
        const uint8_t *w = (const uint8_t *)a->w + (uint64_t)r * rb;                           \
        EACH_GROUP(a->nx, STORE_XS, XQ_CALL, q8i16_dot, nb)                                    \
    }
    EACH_Y_RUN(a, r0, r1, RUN)
#undef RUN
}

/* --- AVX-512: two 8-bit decode kernels with 512-bit vectors ---------------
 * Functions marked target(...) (as gemm_avx2.c's tile), reached only through
 * gemv_cpu.c's dispatch where the CPU runs AVX-512F and BW. The AVX2 kernels
 * above spend three to four vector operations on each 8 to 16 weights of
 * int8 (x int16) or Q8_0 (x f32), which bounds a core near its share of the
 * memory's rate (bench_gemv --resident on a Xeon VM, one core: int8 x int16
 * 28 GB/s, Q8_0 x f32 18); here each operation takes twice the weights
 * (43-50 and 20-21). Same products, sums in another lane grouping. In the
 * engine (Qwen2.5-0.5B shape, 2 threads, BENCHMARKS.md, seventeenth
 * session): cpu_gemv_int8 one-row passes 18.3-19.1 -> 17.3-18.0 ms,
 * cpu_gemv on Q8_0 21.1-22.2 -> 19.5-20.7 ms. Not here, measured no faster:
 * Q8_0 x int16 (each block's scale costs as much as its products, with a
 * 512-bit vector or two 256-bit ones alike), bf16 (slower in the pass) and
 * E4M3 (its f16 conversions bound it either way: 3% in the pass, not worth
 * a second copy of its kernels). */
#define AVX512BW __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))
#define INL512 AVX512BW static inline __attribute__((always_inline))

/* int8 x int16: 64 weights a step in two chains, int32 sums flushed to f32
 * every 1024 elements (a lane's 64 products stay below 2^31). NAME with the
 * qualifiers QUAL, up to G input rows, MAC(acc, w, x): acc plus the
 * pairwise products of w and x (vpmaddwd then vpaddd, or VNNI's vpdpwssd:
 * the same int32 sums). NAME leaves each input row's 16 f32 lanes in
 * accf[i] and returns the first column it did not take (the tail, fewer
 * than 64); I8_DOT512's NAME sums them across as out[i]. */
#define MAC_MADD(acc, w, x) _mm512_add_epi32(acc, _mm512_madd_epi16(w, x))
#define MAC_DPWSSD(acc, w, x) _mm512_dpwssd_epi32(acc, w, x)
#define I8_SUMS512(NAME, QUAL, G, MAC)                                                                         \
    QUAL int64_t NAME(const int8_t *w, const int16_t *x, int64_t ldx, int64_t n, int nx, __m512 *accf) {       \
        for (int i = 0; i < nx; i++) accf[i] = _mm512_setzero_ps();                                            \
        int64_t c = 0;                                                                                         \
        while (c + 64 <= n) {                                                                                  \
            const int64_t end = c + 1024 < n ? c + 1024 : n;                                                   \
            __m512i acc[G][2];                                                                                 \
            for (int i = 0; i < nx; i++) acc[i][0] = acc[i][1] = _mm512_setzero_si512();                       \
            for (; c + 64 <= end; c += 64) {                                                                   \
                if (nx == 1) _mm_prefetch((const char *)(w + c) + PF_FAR, _MM_HINT_T1);                       \
                else _mm_prefetch((const char *)(w + c) + PF_DIST, _MM_HINT_T0);                               \
                const __m256i *wp = (const __m256i *)(const void *)(w + c);                                    \
                const __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(wp));                               \
                const __m512i w1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(wp + 1));                           \
                for (int i = 0; i < nx; i++) {                                                                 \
                    const int16_t *xp = x + i * ldx + c;                                                       \
                    acc[i][0] = MAC(acc[i][0], w0, _mm512_loadu_si512(xp));                                    \
                    acc[i][1] = MAC(acc[i][1], w1, _mm512_loadu_si512(xp + 32));                               \
                }                                                                                              \
            }                                                                                                  \
            for (int i = 0; i < nx; i++) {                                                                     \
                const __m512i t = _mm512_add_epi32(acc[i][0], acc[i][1]);                                      \
                accf[i] = _mm512_add_ps(accf[i], _mm512_cvtepi32_ps(t));                                       \
            }                                                                                                  \
        }                                                                                                      \
        return c;                                                                                              \
    }
#define I8_DOT512(NAME, QUAL, SUMS)                                                                            \
    QUAL void NAME(const int8_t *w, const int16_t *x, int64_t ldx, int64_t n, int nx, float *out) {            \
        __m512 accf[XG8];                                                                                      \
        const int64_t c = SUMS(w, x, ldx, n, nx, accf);                                                        \
        for (int i = 0; i < nx; i++)                                                                           \
            out[i] = _mm512_reduce_add_ps(accf[i]) + (float)i8_tail(w, x + i * ldx, c, n);                     \
    }

/* Sixteen vectors summed across: lane k of the result is the sum of v[k]'s
 * lanes, paired as _mm512_reduce_add_ps pairs them (lane j with j + 8, then
 * j + 4, j + 2, j + 1; GCC's and the intrinsics guide's order), so each sum
 * is bit for bit that function's, in ~46 vector operations for sixteen rows
 * where the reduction takes ~8 a row. */
INL512 __m512 hsum16x16(const __m512 *v) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) /* [v_i lanes j + j+8 | v_i+8's], j < 8 */
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44), _mm512_shuffle_f32x4(v[i], v[i + 8], 0xee));
    for (int i = 0; i < 4; i++) /* 128-bit blocks: rows i, i+8, i+4, i+12, lanes j + j+4 */
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[i + 4], 0x88), _mm512_shuffle_f32x4(a[i], a[i + 4], 0xdd));
    for (int i = 0; i < 2; i++) /* a block [x_0, y_0, x_1, y_1]: rows x of b[i], y of b[i+2], lanes j + j+2 */
        c[i] = _mm512_add_ps(_mm512_unpacklo_ps(b[i], b[i + 2]), _mm512_unpackhi_ps(b[i], b[i + 2]));
    /* the sums of rows 0-3, 8-11, 4-7, 12-15; blocks 1 and 2 swapped */
    const __m512 t = _mm512_add_ps(_mm512_unpacklo_ps(c[0], c[1]), _mm512_unpackhi_ps(c[0], c[1]));
    return _mm512_shuffle_f32x4(t, t, 0xd8);
}

/* Decode (one input row, columns a multiple of 64) in blocks of 16 weight
 * rows: SUMS leaves each row's lanes in a vector, hsum16x16 sums the 16
 * across, and the 16 outputs are scaled and stored as one vector: the same
 * sums, products and stores as a row at a time (out * wscale * xscale, in
 * that order), without a horizontal sum, a tail and a scalar store a row.
 * A short row (896 columns: 14 steps) spent about as many instructions on
 * them as on its weights, which left fewer of a core's misses in flight.
 * Two-thread lab over 512 MiB as 896-column rows: 23.9 -> 26.8 GB/s, as
 * 4,864-column rows 27.9 -> 29.5 (BENCHMARKS.md, twenty-eighth session). */
#define I8_ROW16(SUMS)                                                                         \
    do {                                                                                       \
        __m512 v_[16];                                                                         \
        for (int k_ = 0; k_ < 16; k_++)                                                        \
            (void)SUMS(a->w + (uint64_t)(r + k_) * (uint64_t)a->cols, a->xq, a->cols, a->cols, 1, &v_[k_]); \
        const __m512 s_ = _mm512_mul_ps(hsum16x16(v_), _mm512_loadu_ps(a->wscale + r));        \
        _mm512_storeu_ps(a->y + r, _mm512_mul_ps(s_, _mm512_set1_ps(a->xscale[0])));           \
    } while (0)

/* The AVX-512 drivers: rows [c0, c1), decode's in blocks of 16 where it
 * can, the rest (and verification rows) a row at a time through DOT with
 * input rows in groups by EACH (EACH_GROUP: 4, EACH_GROUP8: 8). */
#define I8_RUN512(SUMS, DOT, EACH, c0, c1)                                                     \
    do {                                                                                       \
        int64_t r = c0;                                                                        \
        if (a->nx == 1 && a->cols % 64 == 0)                                                   \
            for (; r + 16 <= (c1); r += 16) I8_ROW16(SUMS);                                    \
        for (; r < (c1); r++) {                                                                \
            const int8_t *w = a->w + (uint64_t)r * (uint64_t)a->cols;                          \
            EACH(a->nx, STORE_I8, XQ_CALL, DOT, a->cols)                                       \
        }                                                                                      \
    } while (0)

I8_SUMS512(i8_sums512, INL512, XG, MAC_MADD)
I8_DOT512(i8_dot512, INL512, i8_sums512)
#define I8_RUN_512(c0, c1) I8_RUN512(i8_sums512, i8_dot512, EACH_GROUP, c0, c1)
AVX512BW static void i8_rows512(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) {
    float out[XG];
    if (r1 > r0) prefetch_start((const uint8_t *)a->w + (uint64_t)r0 * (uint64_t)a->cols, (uint64_t)(r1 - r0) * (uint64_t)a->cols);
    EACH_Y_RUN(a, r0, r1, I8_RUN_512)
}
#undef I8_RUN_512
void tsr_gemv_i8_rows_avx512(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) { i8_rows512(a, r0, r1); }

/* The same with AVX512-VNNI: vpdpwssd is vpmaddwd and vpaddd in one (the
 * same int32 sums: no pair of products here comes near 2^31), and up to 8
 * input rows a pass over a weight row (26 of the 32 vector registers), so
 * that a verification pass of k + 1 <= 8 rows widens each weight once. The
 * results are bit for bit i8_dot512's (test_cpu_gemv_int8). bench_gemv
 * i8x16 [4864 x 896] on the Xeon VM, 2 threads, GB/s at 1 / 2 / 4 / 8 rows:
 * 31.6, 26.6, 18.6, 10.2 -> 32.1, 28.5, 20.5, 12.0; cpu_gemv_int8's 8-row
 * passes of the Qwen2.5-0.5B shape 49.0-50.2 -> 41.6-42.3 ms (BENCHMARKS.md,
 * twenty-seventh session). Bound by vpdpwssd's one-a-cycle issue at 8 rows. */
#define AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma,f16c")))
#define INLVNNI AVX512VNNI static inline __attribute__((always_inline))

I8_SUMS512(i8_sums_vnni, INLVNNI, XG8, MAC_DPWSSD)
I8_DOT512(i8_dot_vnni, INLVNNI, i8_sums_vnni)
#define I8_RUN_VNNI(c0, c1) I8_RUN512(i8_sums_vnni, i8_dot_vnni, EACH_GROUP8, c0, c1)
AVX512VNNI static void i8_rows_vnni(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) {
    float out[XG8];
    const uint64_t rb = (uint64_t)a->cols;
    if (r1 > r0) prefetch_start((const uint8_t *)a->w + (uint64_t)r0 * rb, (uint64_t)(r1 - r0) * rb);
    EACH_Y_RUN(a, r0, r1, I8_RUN_VNNI)
}
#undef I8_RUN_VNNI
void tsr_gemv_i8_rows_avx512_vnni(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) { i8_rows_vnni(a, r0, r1); }

/* --- int8 x u8 (gemv_cpu.h: tsr_gemv_i8_args with xu, wsum) ------------------- */

/* hsum16x16 in integers: lane k the sum of v[k]'s lanes (exact, so the
 * pairing does not matter). */
INL512 __m512i hsum16x16_epi32(const __m512i *v) {
    __m512i a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(v[i], v[i + 8], 0x44), _mm512_shuffle_i32x4(v[i], v[i + 8], 0xee));
    for (int i = 0; i < 4; i++)
        b[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(a[i], a[i + 4], 0x88), _mm512_shuffle_i32x4(a[i], a[i + 4], 0xdd));
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(b[i], b[i + 2]), _mm512_unpackhi_epi32(b[i], b[i + 2]));
    const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi32(c[0], c[1]), _mm512_unpackhi_epi32(c[0], c[1]));
    return _mm512_shuffle_i32x4(t, t, 0xd8);
}

/* The lanes of sum_c w[c] * xu[i, c] for nx input rows (ldx apart): one
 * vpdpbusd a 64-byte line and input row, the last line masked (zero bytes
 * add nothing); one input row in two chains (even and odd lines). */
INLVNNI void i8u8_sums(const int8_t *w, const uint8_t *xu, int64_t ldx, int64_t n, int nx, __m512i *acc) {
    for (int i = 0; i < nx; i++) acc[i] = _mm512_setzero_si512();
    int64_t c = 0;
    if (nx == 1) {
        __m512i odd = _mm512_setzero_si512();
        for (; c + 128 <= n; c += 128) {
            _mm_prefetch((const char *)(w + c) + PF_FAR, _MM_HINT_T1);
            _mm_prefetch((const char *)(w + c) + PF_FAR + 64, _MM_HINT_T1);
            acc[0] = _mm512_dpbusd_epi32(acc[0], _mm512_loadu_si512(xu + c), _mm512_loadu_si512(w + c));
            odd = _mm512_dpbusd_epi32(odd, _mm512_loadu_si512(xu + c + 64), _mm512_loadu_si512(w + c + 64));
        }
        acc[0] = _mm512_add_epi32(acc[0], odd);
    }
    for (; c + 64 <= n; c += 64) {
        if (nx == 1) _mm_prefetch((const char *)(w + c) + PF_FAR, _MM_HINT_T1);
        else _mm_prefetch((const char *)(w + c) + PF_DIST, _MM_HINT_T0);
        const __m512i wv = _mm512_loadu_si512(w + c);
        for (int i = 0; i < nx; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], _mm512_loadu_si512(xu + i * ldx + c), wv);
    }
    if (c < n) {
        const __mmask64 m = ((__mmask64)1 << (n - c)) - 1; /* n - c < 64 */
        const __m512i wv = _mm512_maskz_loadu_epi8(m, w + c);
        for (int i = 0; i < nx; i++)
            acc[i] = _mm512_dpbusd_epi32(acc[i], _mm512_maskz_loadu_epi8(m, xu + i * ldx + c), wv);
    }
}

/* Rows [c0, c1): one input row in blocks of 16 weight rows (their lanes
 * summed across by hsum16x16_epi32, the 16 outputs one vector), the rest a
 * row at a time for up to 8 input rows a pass over it. */
#define I8U8_RUN(c0, c1)                                                                       \
    do {                                                                                       \
        int64_t r = c0;                                                                        \
        if (a->nx == 1)                                                                        \
            for (; r + 16 <= (c1); r += 16) {                                                  \
                __m512i v[16];                                                                 \
                for (int k = 0; k < 16; k++)                                                   \
                    i8u8_sums(a->w + (uint64_t)(r + k) * (uint64_t)a->cols, a->xu, a->cols, a->cols, 1, &v[k]); \
                const __m512i s_ = _mm512_sub_epi32(hsum16x16_epi32(v), _mm512_slli_epi32(_mm512_loadu_si512(a->wsum + r), 7)); \
                const __m512 f_ = _mm512_mul_ps(_mm512_cvtepi32_ps(s_), _mm512_loadu_ps(a->wscale + r)); \
                _mm512_storeu_ps(a->y + r, _mm512_mul_ps(f_, _mm512_set1_ps(a->xscale[0])));   \
            }                                                                                  \
        for (; r < (c1); r++) {                                                                \
            const int8_t *w = a->w + (uint64_t)r * (uint64_t)a->cols;                          \
            for (int i0 = 0; i0 < a->nx; i0 += 8) {                                            \
                const int g = a->nx - i0 < 8 ? a->nx - i0 : 8;                                 \
                __m512i acc[8];                                                                \
                i8u8_sums(w, a->xu + (int64_t)i0 * a->cols, a->cols, a->cols, g, acc);         \
                for (int i = 0; i < g; i++) {                                                  \
                    const int32_t s = _mm512_reduce_add_epi32(acc[i]) - 128 * a->wsum[r];      \
                    a->y[(int64_t)(i0 + i) * a->ldy + r] = (float)s * a->wscale[r] * a->xscale[i0 + i]; \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    } while (0)
AVX512VNNI void tsr_gemv_i8u8_rows_avx512_vnni(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) {
    if (r1 > r0) prefetch_start((const uint8_t *)a->w + (uint64_t)r0 * (uint64_t)a->cols, (uint64_t)(r1 - r0) * (uint64_t)a->cols);
    EACH_Y_RUN(a, r0, r1, I8U8_RUN)
}
#undef I8U8_RUN

/* tsr_gemv_quant_x_u8's values, 16 a step: nearbyint(x * inv) + 128 (the
 * conversion rounds to nearest even, as nearbyintf does; |x * inv| <= 127
 * needs no clamp). Returns how many it did (a multiple of 16). */
AVX512BW int64_t tsr_gemv_quant_u8_avx512(const float *src, int64_t n, float inv, uint8_t *q) {
    const __m512 vi = _mm512_set1_ps(inv);
    const __m512i off = _mm512_set1_epi32(128);
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) {
        const __m512i v = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(src + c), vi)), off);
        _mm_storeu_si128((__m128i *)(void *)(q + c), _mm512_cvtepi32_epi8(v));
    }
    return c;
}

/* Q8_0 as stored x int16 with AVX512-VNNI, one input row (decode): a block's
 * 32 codes widened to int16 in one vector, one vpdpwssd against its 32
 * activations (16 int32 lanes of two products each: exact in f32), times
 * the block's d into f32 lanes, two blocks a step in two chains; weight
 * rows in blocks of 16 summed across together (hsum16x16), the lines asked
 * into L2 PF_FAR ahead. The same products as the AVX2 kernel, whose blocks
 * take two vpmaddwd and an add into 8 lanes: sums in another grouping. Lab
 * (two threads, 512 MiB of 896-column Q8_0 rows): the AVX2 kernel 24.9
 * GB/s, this 26.5 (BENCHMARKS.md, twenty-eighth session). Verification
 * rows keep the AVX2 kernel (groups of 4). */
#define Q8I16_VNNI_BLOCK(blk, b, h)                                                            \
    do {                                                                                       \
        const __m512i q_ = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)((blk) + 2))); \
        const __m512i t_ = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q_, _mm512_loadu_si512(x + (b) * 32)); \
        acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(h2f(blk)), _mm512_cvtepi32_ps(t_), acc[h]);     \
    } while (0)
INL void prefetch_q8_far(const uint8_t *blk) {
    _mm_prefetch((const char *)blk + PF_FAR, _MM_HINT_T1);
    _mm_prefetch((const char *)blk + PF_FAR + 64, _MM_HINT_T1);
}
INLVNNI __m512 q8i16_lanes_vnni(const uint8_t *w, const int16_t *x, int64_t nb) {
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    BLOCK_PAIRS(Q8I16_VNNI_BLOCK, nb, 34, prefetch_q8_far);
    return _mm512_add_ps(acc[0], acc[1]);
}
#undef Q8I16_VNNI_BLOCK

AVX512VNNI static void q8i16_rows_vnni(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) {
    const int64_t nb = a->cols / 32;
    const uint64_t rb = (uint64_t)nb * 34;
    const uint8_t *w = (const uint8_t *)a->w;
    if (r1 > r0) prefetch_start(w + (uint64_t)r0 * rb, (uint64_t)(r1 - r0) * rb);
#define RUN(c0, c1)                                                                            \
    do {                                                                                       \
        int64_t r = c0;                                                                        \
        for (; r + 16 <= (c1); r += 16) {                                                      \
            __m512 v[16];                                                                      \
            for (int k = 0; k < 16; k++) v[k] = q8i16_lanes_vnni(w + (uint64_t)(r + k) * rb, a->xq, nb); \
            _mm512_storeu_ps(a->y + r, _mm512_mul_ps(hsum16x16(v), _mm512_set1_ps(a->xscale[0]))); \
        }                                                                                      \
        for (; r < (c1); r++)                                                                  \
            a->y[r] = _mm512_reduce_add_ps(q8i16_lanes_vnni(w + (uint64_t)r * rb, a->xq, nb)) * a->xscale[0]; \
    } while (0)
    EACH_Y_RUN(a, r0, r1, RUN)
#undef RUN
}
void tsr_gemv_q8_0_i16_rows_avx512_vnni(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) {
    if (a->nx == 1) q8i16_rows_vnni(a, r0, r1);
    else tsr_gemv_q8_0_i16_rows_avx2(a, r0, r1);
}

/* Q8_0 x f32: a block's 32 codes widened to f32 in two vectors, its two
 * products summed, then times d; two blocks a step in two chains. */
#define Q8F_BLOCK512(blk, b, h)                                                                  \
    do {                                                                                       \
        const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)((blk) + 2)))); \
        const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)((blk) + 18)))); \
        const __m512 d = _mm512_set1_ps(h2f(blk));                                         \
        for (int i = 0; i < nx; i++) {                                                         \
            const float *xp = x + i * ldx + (b) * 32;                                          \
            const __m512 s = _mm512_fmadd_ps(q1, _mm512_loadu_ps(xp + 16), _mm512_mul_ps(q0, _mm512_loadu_ps(xp))); \
            acc[i][h] = _mm512_fmadd_ps(d, s, acc[i][h]);                                      \
        }                                                                                      \
    } while (0)

INL512 void dot_q8_0_512(const uint8_t *w, const float *x, int64_t ldx, int64_t n, int nx, int u, float *out) {
    (void)u;
    __m512 acc[XG8][2];
    for (int i = 0; i < nx; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    Q8_PAIRS(Q8F_BLOCK512, n / 32);
    for (int i = 0; i < nx; i++) out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
}
/* dot_q8_0_512's lanes for one input row, before the sum across. */
INL512 __m512 lanes_q8_0_512(const uint8_t *w, const float *x, int64_t n) {
    const int nx = 1;
    const int64_t ldx = 0;
    __m512 acc[1][2] = {{_mm512_setzero_ps(), _mm512_setzero_ps()}};
    Q8_PAIRS(Q8F_BLOCK512, n / 32);
    return _mm512_add_ps(acc[0][0], acc[0][1]);
}
#undef Q8F_BLOCK512
/* ROW_DRIVER's loop with groups of up to XG8 input rows (each row's sums as
 * in groups of 4: the rows of a group share only the widened codes); one
 * input row in blocks of 16 weight rows summed across together (hsum16x16:
 * the same sums; its 952-byte rows at the 0.5B shape's 896 columns spent
 * as much on a sum across as int8's: lab, BENCHMARKS.md, twenty-eighth
 * session). */
AVX512BW static void rows_q8_0_512(const tsr_gemv_args *a, int64_t r0, int64_t r1, const float *rs) {
    float out[XG8];
    int64_t r = r0;
    if (a->nx == 1)
        for (; r + 16 <= r1; r += 16) {
            __m512 v[16];
            for (int k = 0; k < 16; k++) v[k] = lanes_q8_0_512(a->w + (uint64_t)(r + k) * a->row_bytes, a->x, a->cols);
            const __m512 s = hsum16x16(v);
            _mm512_storeu_ps(a->y + r, rs ? _mm512_mul_ps(s, _mm512_loadu_ps(rs + r)) : s);
        }
    for (; r < r1; r++) {
        const uint8_t *row = a->w + (uint64_t)r * a->row_bytes;
        float s = rs ? rs[r] : 1.0f;
        EACH_GROUP8(a->nx, STORE_S, ROW_CALL, dot_q8_0_512, 4)
    }
}

/* bf16 verification rows (2 and more input rows) in 512-bit vectors: 32
 * weights a 64-byte load split with a shift and a mask as bf16p_dot splits
 * 16, against activations permuted by blocks of 32 (permute_x with 16
 * lanes: xp[b*32 + 16k + j] = x[b*32 + 2j + k]), up to XG8 input rows a
 * pass over a weight row (16 accumulators), two chains a row. One row
 * keeps bf16p_dot (the 512-bit one-row variant made the pass slower,
 * below). Products exact in
 * f32 as before; sums in another lane grouping. bench_gemv bf16 [4864 x
 * 896], 2 threads, GB/s at 2 / 4 / 8 rows: 28.4, 21.2, 11.9 (AVX2, groups
 * of 4) -> 32.0, 24.3, 14.1; cpu_gemv's 8-row passes of the Qwen2.5-0.5B
 * shape 81.4-81.5 -> 64.1-69.9 ms (BENCHMARKS.md, twenty-seventh session). */
int tsr_gemv_bf16_512_rows(const tsr_gemv_args *a) { return a->nx >= 2; }

void tsr_gemv_permute_x_bf16_512(const tsr_gemv_args *a, float *xp) {
    permute_x(a->x, a->ldx, a->nx, a->cols, 2, 16, xp);
}

INL512 void bf16p_dot512(const uint8_t *w, const float *xp, int64_t ldx, int64_t n, int nx, float *out) {
    __m512 acc[XG8][2];
    for (int i = 0; i < nx; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u);
    int64_t c = 0;
    for (; c + 32 <= n; c += 32) {
        _mm_prefetch((const char *)(w + 2 * c) + PF_DIST, _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512((const void *)(w + 2 * c));
        const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
        for (int i = 0; i < nx; i++) {
            const float *x = xp + i * ldx + c;
            acc[i][0] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x), acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 16), acc[i][1]);
        }
    }
    for (int i = 0; i < nx; i++) {
        float t = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
        for (int64_t cc = c; cc < n; cc++) t += sc_bf16(w + 2 * cc) * xp[i * ldx + cc];
        out[i] = t;
    }
}

#define PERM_CALL8(DOT, g, N) DOT(row, xp + (int64_t)(g) * a->cols, a->cols, a->cols, N, out)
AVX512BW static void rows_bf16p512(const tsr_gemv_args *a, int64_t r0, int64_t r1, const float *xp) {
    float out[XG8];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = a->w + (uint64_t)r * a->row_bytes;
        EACH_GROUP8(a->nx, STORE_1, PERM_CALL8, bf16p_dot512)
    }
}
#undef PERM_CALL8

/* The AVX-512 decode kernels where there is one (Q8_0; bf16 from two input
 * rows), else the AVX2 ones.
 * (bf16 in 512-bit vectors, its activations permuted by 32s, read 17% more
 * from L2 but made the 0.5B pass slower, 31.8-32.7 -> 32.8-33.4 ms; E4M3,
 * 32 codes widened in two 16-lane conversions, 5% more from L2 and a 3%
 * faster pass: neither kept, BENCHMARKS.md, seventeenth session.) */
void tsr_gemv_rows_avx512(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int64_t r1) {
    if (dtype == TSR_DTYPE_BF16 && tsr_gemv_bf16_512_rows(a)) {
        float *own = NULL;
        const float *xp = a->xp;
        if (!xp) { /* as tsr_gemv_permute_x makes it for this ISA */
            if (!(own = malloc((size_t)a->nx * (size_t)a->cols * sizeof *own))) {
                tsr_gemv_rows_avx2(dtype, a, r0, r1);
                return;
            }
            tsr_gemv_permute_x_bf16_512(a, own);
            xp = own;
        }
        if (r1 > r0) prefetch_start(a->w + (uint64_t)r0 * a->row_bytes, (uint64_t)(r1 - r0) * a->row_bytes);
#define RUN(c0, c1) rows_bf16p512(a, c0, c1, xp)
        EACH_Y_RUN(a, r0, r1, RUN)
#undef RUN
        free(own);
        return;
    }
    if (dtype != TSR_DTYPE_Q8_0) {
        tsr_gemv_rows_avx2(dtype, a, r0, r1);
        return;
    }
    if (r1 > r0) prefetch_start(a->w + (uint64_t)r0 * a->row_bytes, (uint64_t)(r1 - r0) * a->row_bytes);
#define RUN(c0, c1) rows_q8_0_512(a, c0, c1, NULL)
    EACH_Y_RUN(a, r0, r1, RUN)
#undef RUN
}

#else
int tsr_gemv_widen_row_avx2(uint32_t dtype, const uint8_t *src, int64_t n, float *dst) {
    (void)dtype, (void)src, (void)n, (void)dst;
    return 0;
}
void tsr_gemv_i8_rows_avx2(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) {
    tsr_gemv_i8_rows_portable(a, r0, r1);
}
void tsr_gemv_q8_0_i16_rows_avx2(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) {
    tsr_gemv_q8_0_i16_rows_portable(a, r0, r1);
}
void tsr_gemv_i8_rows_avx512(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) { tsr_gemv_i8_rows_portable(a, r0, r1); }
void tsr_gemv_i8_rows_avx512_vnni(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) {
    tsr_gemv_i8_rows_portable(a, r0, r1);
}
void tsr_gemv_q8_0_i16_rows_avx512_vnni(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) {
    tsr_gemv_q8_0_i16_rows_portable(a, r0, r1);
}
void tsr_gemv_i8u8_rows_avx512_vnni(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1) {
    tsr_gemv_i8u8_rows_portable(a, r0, r1);
}
int64_t tsr_gemv_quant_u8_avx512(const float *src, int64_t n, float inv, uint8_t *q) {
    (void)src, (void)n, (void)inv, (void)q;
    return 0;
}
int tsr_gemv_bf16_512_rows(const tsr_gemv_args *a) {
    (void)a;
    return 0;
}
void tsr_gemv_permute_x_bf16_512(const tsr_gemv_args *a, float *xp) { (void)a, (void)xp; }
void tsr_gemv_rows_avx512(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int64_t r1) {
    tsr_gemv_rows_portable(dtype, a, r0, r1);
}
void tsr_gemv_rows_avx2(uint32_t dtype, const tsr_gemv_args *a, int64_t r0, int64_t r1) {
    tsr_gemv_rows_portable(dtype, a, r0, r1);
}
int64_t tsr_gemv_permuted_x_floats_avx2(uint32_t dtype, const tsr_gemv_args *a) {
    (void)dtype, (void)a;
    return 0;
}
void tsr_gemv_permute_x_avx2(uint32_t dtype, const tsr_gemv_args *a, float *xp) { (void)dtype, (void)a, (void)xp; }
#endif
