#include "halloc.h"

#include "../util/checked.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic uint64_t g_count;
static _Atomic uint64_t g_live;
static _Atomic uint64_t g_fail_at; /* absolute allocation number that fails, 0 = none */

static int should_fail(void) {
    uint64_t n = atomic_fetch_add(&g_count, 1) + 1;
    uint64_t f = atomic_load(&g_fail_at);
    return f != 0 && n == f;
}

void tsr_halloc_fail_at(uint64_t n) {
    atomic_store(&g_fail_at, n ? atomic_load(&g_count) + n : 0);
}

uint64_t tsr_halloc_live(void) { return atomic_load(&g_live); }
uint64_t tsr_halloc_count(void) { return atomic_load(&g_count); }

void *tsr_halloc(size_t size) {
    if (should_fail()) return NULL;
    void *p = malloc(size ? size : 1);
    if (p) atomic_fetch_add(&g_live, 1);
    return p;
}

void *tsr_hcalloc(size_t n, size_t size) {
    uint64_t t;
    if (tsr_mul_u64(n, size, &t) || t > SIZE_MAX) return NULL;
    if (should_fail()) return NULL;
    void *p = calloc(t ? t : 1, 1);
    if (p) atomic_fetch_add(&g_live, 1);
    return p;
}

void *tsr_hrealloc(void *p, size_t size) {
    if (!p) return tsr_halloc(size);
    if (should_fail()) return NULL;
    return realloc(p, size ? size : 1);
}

void tsr_hfree(void *p) {
    if (!p) return;
    atomic_fetch_sub(&g_live, 1);
    free(p);
}

char *tsr_hstrndup(const char *s, size_t n) {
    if (!s) return NULL;
    size_t len = strnlen(s, n);
    char *d = tsr_halloc(len + 1);
    if (!d) return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *tsr_hstrdup(const char *s) { return s ? tsr_hstrndup(s, strlen(s)) : NULL; }

int tsr_hgrow(void **v, size_t elem, int need, int *cap) {
    if (need <= *cap) return 0;
    if (need < 0 || need > (1 << 28)) return -1;
    int nc = *cap ? *cap : 8;
    while (nc < need) nc *= 2;
    uint64_t bytes;
    if (tsr_mul_u64((uint64_t)nc, elem, &bytes) || bytes > SIZE_MAX) return -1;
    void *n = tsr_hrealloc(*v, bytes);
    if (!n) return -1;
    *v = n;
    *cap = nc;
    return 0;
}
