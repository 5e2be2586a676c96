/*
 * q8_lab.c - exact Q8_0 x f32 decode (one input row) on the stored row layout
 * (the production AVX-512 kernel, tsr_gemv_kernel) against the same blocks
 * regrouped by 16 rows: for each block column, the 16 rows' f16 scales, then
 * their codes column-major (code k of rows r0..r0+15 as 16 consecutive
 * bytes), 544 bytes as 16 stored blocks are. A step widens one 16-byte
 * column of codes (one vpmovsxbd, one conversion) and multiplies it by one
 * broadcast activation; a block column's 16 sums meet their 16 scales in one
 * multiply-add, with no horizontal sum and no per-block broadcast (what
 * bounds the row kernel: BENCHMARKS.md, seventeenth session). Sums within
 * f32 rounding of the row kernel's (checked against f64).
 *   gcc -O2 -mavx512f -mavx512bw -mf16c -mfma -I. -o /tmp/q8_lab tools/cpu_lab/q8_lab.c \
 *       build/kernels/libtsr_kernels.a build/core/util/libtsr_util.a -lpthread -lm
 *   /tmp/q8_lab ROWS COLS      e.g. 896 4864 (the 0.5B down projection), 4864 896
 * Prints GB/s (medians): one core with the matrix in L2 (the kernels'
 * instruction ceilings), then one core and two threads streaming 1.5 GiB
 * of copies from DRAM.
 */
#include "tools/cpu_lab/lab.h"
#include <math.h>
#include "core/util/threadpool.h"
#include "kernels/cpu/gemv_cpu.h"

static float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* rows % 16 == 0, cols % 32 == 0: stored rows (34-byte blocks) -> groups */
static void regroup(const uint8_t *src, uint8_t *dst, int64_t rows, int64_t cols) {
    const int64_t nb = cols / 32, rb = nb * 34;
    for (int64_t g = 0; g < rows / 16; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = dst + (g * nb + b) * 544;
            for (int r = 0; r < 16; r++) {
                const uint8_t *blk = src + (g * 16 + r) * rb + b * 34;
                memcpy(o + 2 * r, blk, 2);
                for (int k = 0; k < 32; k++) o[32 + k * 16 + r] = blk[2 + k];
            }
        }
}

/* groups [g0, g1) of the regrouped matrix times x into y */
__attribute__((target("avx512f,avx512bw,f16c,fma"))) static void grouped_rows(const uint8_t *w, int64_t cols,
                                                                               const float *x, float *y, int64_t g0,
                                                                               int64_t g1) {
    const int64_t nb = cols / 32;
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *p = w + g * nb * 544;
        __m512 acc = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++, p += 544) {
            _mm_prefetch((const char *)p + 2048, _MM_HINT_T0);
            _mm_prefetch((const char *)p + 2048 + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)p + 2048 + 128, _MM_HINT_T0);
            _mm_prefetch((const char *)p + 2048 + 192, _MM_HINT_T0);
            _mm_prefetch((const char *)p + 2048 + 256, _MM_HINT_T0);
            _mm_prefetch((const char *)p + 2048 + 320, _MM_HINT_T0);
            _mm_prefetch((const char *)p + 2048 + 384, _MM_HINT_T0);
            _mm_prefetch((const char *)p + 2048 + 448, _MM_HINT_T0);
            _mm_prefetch((const char *)p + 2048 + 512, _MM_HINT_T0);
            const float *xb = x + b * 32;
            __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(),
                   s3 = _mm512_setzero_ps();
            for (int k = 0; k < 32; k += 4) {
                const __m128i *q = (const __m128i *)(const void *)(p + 32 + k * 16);
                s0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))),
                                     _mm512_set1_ps(xb[k]), s0);
                s1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))),
                                     _mm512_set1_ps(xb[k + 1]), s1);
                s2 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 2))),
                                     _mm512_set1_ps(xb[k + 2]), s2);
                s3 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 3))),
                                     _mm512_set1_ps(xb[k + 3]), s3);
            }
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
            const __m512 s = _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
            if (b & 1) acc2 = _mm512_fmadd_ps(d, s, acc2);
            else acc = _mm512_fmadd_ps(d, s, acc);
        }
        _mm512_storeu_ps(y + g * 16, _mm512_add_ps(acc, acc2));
    }
}

typedef struct {
    int mode; /* 0 rows (production), 1 groups */
    const uint8_t *w;
    int64_t rows, cols;
    const float *x;
    float *y;
    tsr_gemv_kernel_fn k;
} job;

static void part(job *j, int64_t i0, int64_t i1) { /* groups of 16 rows [i0, i1) */
    if (j->mode == 1) {
        grouped_rows(j->w, j->cols, j->x, j->y, i0, i1);
        return;
    }
    tsr_gemv_args a = {.w = j->w, .row_bytes = (uint64_t)j->cols / 32 * 34, .cols = j->cols, .x = j->x,
                       .ldx = j->cols, .nx = 1, .y = j->y, .ldy = j->rows};
    j->k(TSR_DTYPE_Q8_0, &a, i0 * 16, i1 * 16);
}
static void run(void *arg, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    part(arg, i0, i1);
}

int main(int argc, char **argv) {
    if (argc < 3) return 1;
    const int64_t rows = atol(argv[1]) / 16 * 16, cols = atol(argv[2]) / 32 * 32, nb = cols / 32;
    const size_t mb = (size_t)rows * nb * 34;
    const int copies = (int)((1500L << 20) / mb + 1);
    const size_t tot = (mb * copies + (2 << 20)) / (2 << 20) * (2 << 20);
    uint8_t *w = aligned_alloc(2 << 20, tot), *wg = aligned_alloc(2 << 20, tot);
    madvise(w, tot, MADV_HUGEPAGE), madvise(wg, tot, MADV_HUGEPAGE);
    srand(1);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = w + (size_t)r * nb * 34 + b * 34;
            const uint16_t d = _cvtss_sh(0.001f + (rand() % 1000) * 1e-5f, 0);
            memcpy(blk, &d, 2);
            for (int k = 0; k < 32; k++) blk[2 + k] = (uint8_t)(rand() % 255 - 127);
        }
    for (int c = 1; c < copies; c++) memcpy(w + c * mb, w, mb);
    for (int c = 0; c < copies; c++) regroup(w + c * mb, wg + c * mb, rows, cols);
    float *x = aligned_alloc(64, cols * 4), *y0 = aligned_alloc(64, rows * 4), *y1 = aligned_alloc(64, rows * 4);
    for (int64_t i = 0; i < cols; i++) x[i] = (float)((rand() % 2001) - 1000) * 1e-3f;
    job j0 = {0, w, rows, cols, x, y0, tsr_gemv_kernel(TSR_GEMV_ISA_AVX512)}, j1 = {1, wg, rows, cols, x, y1, NULL};
    part(&j0, 0, rows / 16), part(&j1, 0, rows / 16);
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double s = 0, mag = 0;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + (size_t)r * nb * 34 + b * 34;
            uint16_t d;
            memcpy(&d, blk, 2);
            for (int k = 0; k < 32; k++) {
                const double v = (double)h2f(d) * (int8_t)blk[2 + k] * x[b * 32 + k];
                s += v, mag += fabs(v);
            }
        }
        const double e = fmax(fabs(y0[r] - s), fabs(y1[r] - s)) / (mag * 0x1p-20 + 1e-30);
        if (e > worst) worst = e;
    }
    printf("%ld x %ld: worst |error| %.3f of 2^-20 x the magnitude (both layouts)\n", (long)rows, (long)cols, worst);
    /* one core, in L2: the first 256 KiB of rows */
    const int64_t lg = (int64_t)(262144 / (nb * 34 * 16)) < rows / 16 ? 262144 / (nb * 34 * 16) : rows / 16;
    for (int m = 0; m < 2; m++) {
        job *j = m ? &j1 : &j0;
        static double t[20000];
        int n = 0;
        for (double t0 = now(); now() - t0 < 2 && n < 20000; n++) {
            const double a = now();
            part(j, 0, lg > 0 ? lg : 1);
            t[n] = now() - a;
        }
        qsort(t, n, 8, lab_cmp_double);
        printf("%s, one core, %ld KiB in L2: %.1f GB/s\n", m ? "groups of 16" : "rows (production)",
               (long)(lg * nb * 34 * 16 / 1024), lg * nb * 34 * 16 / t[n / 2] / 1e9);
    }
    tsr_threadpool *tp = tsr_threadpool_new(2);
    for (int th = 1; th <= 2; th++) {
        static double t[2][4000];
        int n = 0;
        for (double t0 = now(); now() - t0 < 8 && n < 4000; n++)
            for (int m = 0; m < 2; m++) {
                job j = m ? j1 : j0;
                j.w = (m ? wg : w) + (size_t)((2 * n + m) % copies) * mb;
                const double a = now();
                if (th == 1) part(&j, 0, rows / 16);
                else tsr_threadpool_run(tp, rows / 16, run, &j);
                t[m][n] = now() - a;
            }
        qsort(t[0], n, 8, lab_cmp_double), qsort(t[1], n, 8, lab_cmp_double);
        printf("%d thread(s) from DRAM: rows %.1f GB/s, groups %.1f GB/s (%d)\n", th, mb / t[0][n / 2] / 1e9,
               mb / t[1][n / 2] / 1e9, n);
    }
    return 0;
}
