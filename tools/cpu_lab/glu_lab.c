/*
 * glu_lab.c - the gate/up pair's takes on two threads of the pool: each take
 * of gate rows [a, b) read as two streams (rows a..b and f + a..f + b, as
 * run_glu does) or, were the pair stored interleaved, one (rows 2a..2b);
 * takes fixed (TAKE > 0) or guided as gemv_engine.c's take_items (TAKE < 0:
 * at most 1,024, at least -TAKE rows). Production kernel, 2 MiB pages, 1.5
 * GiB of copies, medians (BENCHMARKS.md, twentieth session; the interleave
 * built into the CPU plugins: branch experiment/cpu-glu-interleave,
 * twenty-third session).
 *   gcc -O2 -I. -o /tmp/glu_lab tools/cpu_lab/glu_lab.c build/kernels/libtsr_kernels.a \
 *       build/core/util/libtsr_util.a -lpthread -lm
 *   /tmp/glu_lab F COLS TAKE      e.g. 4864 896 -40
 */
#include "tools/cpu_lab/lab.h"
#include "core/util/threadpool.h"
#include "kernels/cpu/gemv_cpu.h"

enum { TWO_STREAMS, ONE_STREAM };

typedef struct job {
    const uint8_t *w; /* [gate; up] (TWO_STREAMS) or interleaved by take (ONE_STREAM), bf16 */
    int64_t f, cols;
    const float *x;
    float *y;
    atomic_llong next;
    tsr_gemv_kernel_fn k;
    int mode;
    long take;
} job;

/* The job's next take of gate rows [*a, *b): guided, or fixed at j->take. */
static int next_take(job *j, int64_t *a, int64_t *b) {
    if (j->take < 0) return lab_take(&j->next, j->f, 2, -j->take, 1024, a, b);
    *a = atomic_fetch_add(&j->next, j->take);
    if (*a >= j->f) return 0;
    *b = *a + j->take < j->f ? *a + j->take : j->f;
    return 1;
}

static void run(void *arg, int64_t i0, int64_t i1, int tid) {
    (void)i0, (void)i1, (void)tid;
    job *j = arg;
    const tsr_gemv_args g = {.w = j->w, .row_bytes = (uint64_t)j->cols * 2, .cols = j->cols, .x = j->x,
                             .ldx = j->cols, .nx = 1, .y = j->y, .ldy = 2 * j->f};
    int64_t a, b;
    while (next_take(j, &a, &b)) {
        if (j->mode == ONE_STREAM) {
            j->k(TSR_DTYPE_BF16, &g, 2 * a, 2 * b);
            continue;
        }
        j->k(TSR_DTYPE_BF16, &g, a, b);
        j->k(TSR_DTYPE_BF16, &g, j->f + a, j->f + b);
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s F COLS TAKE\n", argv[0]);
        return 2;
    }
    const int64_t f = atol(argv[1]), cols = atol(argv[2]);
    const long take = atol(argv[3]);
    const size_t mb = (size_t)(2 * f * cols * 2);
    const int copies = (int)((1500L << 20) / mb + 1);
    const size_t tot = (mb * copies + (2 << 20)) / (2 << 20) * (2 << 20);
    uint8_t *w = aligned_alloc(2 << 20, tot);
    float *x = aligned_alloc(64, (size_t)cols * 4), *y = aligned_alloc(64, (size_t)(2 * f * 4 + 64));
    if (!w || !x || !y) return 1;
    madvise(w, tot, MADV_HUGEPAGE);
    lab_fill(w, tot / 2, x, (int)cols);
    tsr_threadpool *tp = tsr_threadpool_new(2);
    static double t[2][4000];
    int n = 0;
    for (const double t0 = now(); now() - t0 < 10 && n < 4000; n++)
        for (int m = TWO_STREAMS; m <= ONE_STREAM; m++) {
            job j = {.w = w + (size_t)((2 * n + m) % copies) * mb, .f = f, .cols = cols, .x = x, .y = y,
                     .k = tsr_gemv_kernel(TSR_GEMV_ISA_AVX512), .mode = m, .take = take};
            const double a = now();
            tsr_threadpool_run(tp, 2, run, &j);
            t[m][n] = now() - a;
        }
    qsort(t[0], n, sizeof(double), lab_cmp_double);
    qsort(t[1], n, sizeof(double), lab_cmp_double);
    printf("f %ld cols %ld take %ld: two streams %.2f GB/s, one stream %.2f GB/s (%d)\n", (long)f, (long)cols, take,
           mb / t[0][n / 2] / 1e9, mb / t[1][n / 2] / 1e9, n);
    tsr_threadpool_free(tp);
    free(w), free(x), free(y);
    return 0;
}
