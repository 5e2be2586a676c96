/*
 * lab.h - what the CPU kernel labs share (each lab is one file, built with
 * the line in its header; this header sits beside them): a monotonic clock,
 * a comparison for medians, guided takes from a shared counter, the horizontal sum, the read loop of `tessera probe` (prefetching PF bytes
 * ahead), the inputs they fill, and the bf16 decode kernel's shape (a 64-byte step: two 32-byte
 * loads split into even and odd halves, four FMA chains).
 */
#ifndef TSR_CPU_LAB_H
#define TSR_CPU_LAB_H

#define _GNU_SOURCE
#include <immintrin.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define PF 3072
static inline double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The next guided take of [0, items) from the shared counter *next, as
 * gemv_engine.c's take_items: 1 / (2 x threads) of what is left, within
 * [least, group], a multiple of 8 (at least 8); 0 when none is left. */
static inline int lab_take(atomic_llong *next, int64_t items, int threads, int64_t least, int64_t group,
                           int64_t *p0, int64_t *p1) {
    long long at = atomic_load(next);
    int64_t n;
    do {
        if (at >= items) return 0;
        n = (items - at) / (2 * (int64_t)threads);
        n = n < least ? least : n > group ? group : n;
        n -= n % 8;
        if (n < 8) n = 8;
        if (n > items - at) n = items - at;
    } while (!atomic_compare_exchange_weak(next, &at, at + n));
    *p0 = at, *p1 = at + n;
    return 1;
}

/* qsort's comparison of doubles (the labs' medians). */
static inline int lab_cmp_double(const void *p, const void *q) {
    const double a = *(const double *)p, b = *(const double *)q;
    return (a > b) - (a < b);
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

__attribute__((noinline, unused)) static float readloop(const uint8_t *w, long n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    for (long i = 0; i < n; i += 64) {
        _mm_prefetch((const char *)w + i + PF, _MM_HINT_T0);
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps((const float *)(w + i)));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps((const float *)(w + i + 32)));
    }
    return hsum8(_mm256_add_ps(s0, s1));
}

/* Inputs the labs read: n bf16 weights (16-bit values 1.0-2.0, a hash of the
 * index, so no page is all zeros) and n activations in [-1, 1]. */
static inline void lab_fill(uint8_t *w, size_t n, float *x, int nx) {
    for (size_t i = 0; i < n; i++) {
        const uint16_t h = 0x3c00 + (uint16_t)((i * 2654435761u >> 13) & 0x3ff);
        memcpy(w + 2 * i, &h, 2);
    }
    for (int i = 0; i < nx; i++) x[i] = (float)((i * 37) % 101 - 50) / 50;
}

/* The dot product of n bf16 weights at w with x, prefetching pf bytes ahead. */
static inline float row_dot(const uint8_t *w, const float *x, int n, long pf) {
    const __m256i hm = _mm256_set1_epi32((int)0xffff0000u);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int c = 0; c + 32 <= n; c += 32) {
        _mm_prefetch((const char *)w + 2 * c + pf, _MM_HINT_T0);
        __m256i v = _mm256_loadu_si256((const __m256i *)(w + 2 * c));
        __m256i u = _mm256_loadu_si256((const __m256i *)(w + 2 * c + 32));
        a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), _mm256_loadu_ps(x + c), a0);
        a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, hm)), _mm256_loadu_ps(x + c + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(u, 16)), _mm256_loadu_ps(x + c + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(u, hm)), _mm256_loadu_ps(x + c + 24), a3);
    }
    return hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

#endif /* TSR_CPU_LAB_H */
