/*
 * checked.h - the one overflow-checked size arithmetic helper. Every size or
 * offset computed from untrusted input (file headers, requests) goes through
 * these; each returns 0 on success and -1 on overflow, leaving *out unset.
 */
#ifndef TSR_CHECKED_H
#define TSR_CHECKED_H

#include <stdint.h>

static inline int tsr_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

static inline int tsr_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

/* out = a * b + c */
static inline int tsr_muladd_u64(uint64_t a, uint64_t b, uint64_t c, uint64_t *out) {
    uint64_t t;
    if (__builtin_mul_overflow(a, b, &t)) return -1;
    return __builtin_add_overflow(t, c, out) ? -1 : 0;
}

/* Product of n dimensions (each must be >= 0 as int64). */
static inline int tsr_dims_product(const int64_t *dims, int n, uint64_t *out) {
    uint64_t p = 1;
    for (int i = 0; i < n; i++) {
        if (dims[i] < 0) return -1;
        if (__builtin_mul_overflow(p, (uint64_t)dims[i], &p)) return -1;
    }
    *out = p;
    return 0;
}

/* 1 if [off, off+len) lies within [0, size). */
static inline int tsr_range_in(uint64_t off, uint64_t len, uint64_t size) {
    uint64_t end;
    if (__builtin_add_overflow(off, len, &end)) return 0;
    return end <= size;
}

#endif /* TSR_CHECKED_H */
