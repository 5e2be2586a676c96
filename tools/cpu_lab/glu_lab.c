/*
 * glu_lab.c - the gate/up pair's takes on two threads of the pool: each take
 * of gate rows [a, b) read as two streams (rows a..b and f + a..f + b, as
 * run_glu does) or, were the pair stored interleaved, one (rows 2a..2b);
 * takes fixed (TAKE > 0) or guided as gemv_engine.c's take_items (TAKE < 0:
 * at most 1,024, at least -TAKE rows). Production kernel, 2 MiB pages, 1.5
 * GiB of copies, medians (BENCHMARKS.md, twentieth session).
 *   gcc -O2 -I. -o /tmp/glu_lab tools/cpu_lab/glu_lab.c build/kernels/libtsr_kernels.a \
 *       build/core/util/libtsr_util.a -lpthread -lm
 *   /tmp/glu_lab F COLS TAKE      e.g. 4864 896 -40
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include "core/util/threadpool.h"
#include "kernels/cpu/gemv_cpu.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
typedef struct { const uint8_t *w; int64_t f, cols; const float *x; float *y; atomic_long next; tsr_gemv_kernel_fn k; int mode; long take; } J;
/* mode 0: glu-like: take [a,b) gate rows => kernel over rows a..b and f+a..f+b (two streams)
   mode 1: interleaved blocks of 16: take [a,b) gate rows => rows 2a..2b contiguous (one stream) */
static int take_items(J *j, long items, long group, long least, long *p0, long *p1) {
    long at = atomic_load(&j->next), n;
    do {
        if (at >= items) return 0;
        n = (items - at) / 4;
        n = n < least ? least : n > group ? group : n;
        n -= n % 8; if (n < 8) n = 8;
        if (n > items - at) n = items - at;
    } while (!atomic_compare_exchange_weak(&j->next, &at, at + n));
    *p0 = at; *p1 = at + n; return 1;
}
static void run(void *arg, int64_t i0, int64_t i1, int tid) {
    J *j = arg;
    long a, b;
    while (j->take < 0 ? take_items(j, j->f, 1024, -j->take, &a, &b) : ((a = atomic_fetch_add(&j->next, j->take)) < j->f && ((b = a + j->take < j->f ? a + j->take : j->f), 1))) {
        tsr_gemv_args g = {.w = j->w, .row_bytes = j->cols * 2, .cols = j->cols, .x = j->x, .ldx = j->cols, .nx = 1, .y = j->y, .ldy = 2 * j->f};
        if (j->mode == 0) { j->k(TSR_DTYPE_BF16, &g, a, b); j->k(TSR_DTYPE_BF16, &g, j->f + a, j->f + b); }
        else j->k(TSR_DTYPE_BF16, &g, 2 * a, 2 * b);
    }
}
int main(int argc, char **argv) {
    int64_t f = atol(argv[1]), cols = atol(argv[2]); long take = atol(argv[3]);
    size_t mb = 2 * f * cols * 2; int copies = (int)((1500L << 20) / mb + 1);
    size_t tot = (mb * copies + (2 << 20)) / (2 << 20) * (2 << 20);
    uint8_t *w = aligned_alloc(2 << 20, tot); madvise(w, tot, MADV_HUGEPAGE);
    for (size_t i = 0; i < tot / 2; i++) ((uint16_t *)w)[i] = 0x3c00 + (i * 2654435761u >> 13 & 0x3ff);
    float *x = aligned_alloc(64, cols * 4), *y = aligned_alloc(64, 2 * f * 4 + 64);
    for (int i = 0; i < cols; i++) x[i] = (i % 7) * 0.1f;
    tsr_threadpool *tp = tsr_threadpool_new(2);
    static double t[2][4000]; int n = 0;
    for (double t0 = now(); now() - t0 < 10 && n < 4000; n++)
        for (int m = 0; m < 2; m++) {
            J j = {.w = w + (size_t)((2 * n + m) % copies) * mb, .f = f, .cols = cols, .x = x, .y = y, .k = tsr_gemv_kernel(TSR_GEMV_ISA_AVX512), .mode = m, .take = take};
            double a = now(); tsr_threadpool_run(tp, 2, run, &j); t[m][n] = now() - a;
        }
    int cmp(const void *p, const void *q) { double a = *(double *)p, b = *(double *)q; return (a > b) - (a < b); }
    qsort(t[0], n, 8, cmp); qsort(t[1], n, 8, cmp);
    printf("f %ld cols %ld take %ld: two streams %.2f GB/s, one stream %.2f GB/s (%d)\n", f, cols, take, mb / t[0][n / 2] / 1e9, mb / t[1][n / 2] / 1e9, n);
}
