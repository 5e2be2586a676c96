/*
 * stream_lab.c - how fast two threads stream 512 MiB (each its half, in
 * 2 MiB pages) through read loops and int8 decode loops: the question
 * (BENCHMARKS.md, twenty-eighth session) was why cpu_gemv_int8's one-row
 * kernel read 80-85% of what `tessera probe` read, in the engine and in
 * seq_lab alike. Loops:
 *   probe32   the probe's 32-byte loop: two chains of float adds, prefetch
 *             into L1 3 KiB ahead (lab.h readloop)
 *   probe64   the same in 64-byte loads (AVX-512F)
 *   i8 HINT DIST  the int8 x int16 VNNI step (two 32-byte loads widened,
 *             two vpdpwssd against activations in L1) over one long stream,
 *             prefetching DIST bytes ahead with HINT (t0 into L1, t1 into
 *             L2, none)
 *   kernel COLS  the production kernel (tsr_gemv_i8_rows_avx512_vnni, one
 *             input row) over the buffer as rows of COLS int8 columns
 * Prints the median GB/s of REPEATS interleaved passes of each (min, max).
 *   gcc -O2 -mavx2 -mfma -I. -o /tmp/stream_lab tools/cpu_lab/stream_lab.c \
 *       build/kernels/libtsr_kernels.a build/core/util/libtsr_util.a -lpthread -lm
 *   /tmp/stream_lab [REPEATS]   (needs AVX512-VNNI)
 */
#include "tools/cpu_lab/lab.h"
#include <pthread.h>

#include "kernels/cpu/gemv_cpu.h"

void tsr_gemv_i8_rows_avx512_vnni(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1);

#define SZ ((size_t)512 << 20)
static uint8_t *buf;
static int16_t xq[8192];
static float ws[SZ / 896 + 16], xs[1], *yv;
static volatile float sink;

enum { NONE, T0, T1 };
typedef struct {
    const char *name;
    int kind; /* 0 probe32, 1 probe64, 2 i8 loop, 3 kernel */
    int hint;
    long dist; /* i8 loop: prefetch distance; kernel: columns */
} variant;
static const variant vs[] = {
    {"probe32 (t0 3 KiB)", 0, T0, 3072}, {"probe64 (t0 3 KiB)", 1, T0, 3072}, {"i8 loop, no prefetch", 2, NONE, 0},
    {"i8 loop, t0 3 KiB", 2, T0, 3072},  {"i8 loop, t1 3 KiB", 2, T1, 3072},  {"i8 loop, t1 6 KiB", 2, T1, 6144},
    {"i8 loop, t1 8 KiB", 2, T1, 8192},  {"kernel, 896 cols", 3, 0, 896},     {"kernel, 4864 cols", 3, 0, 4864},
};
enum { NV = sizeof vs / sizeof *vs };

__attribute__((target("avx512f"), noinline)) static float probe64(const uint8_t *w, long n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    for (long i = 0; i < n; i += 128) {
        _mm_prefetch((const char *)w + i + 3072, _MM_HINT_T0);
        _mm_prefetch((const char *)w + i + 3072 + 64, _MM_HINT_T0);
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps((const float *)(w + i)));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps((const float *)(w + i + 64)));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) static float i8loop(const uint8_t *w, long n, int hint,
                                                                                  long dist) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0;
    for (long i = 0; i < n; i += 64) {
        if (hint == T0) _mm_prefetch((const char *)w + i + dist, _MM_HINT_T0);
        if (hint == T1) _mm_prefetch((const char *)w + i + dist, _MM_HINT_T1);
        const long c = i & 2047; /* activations: 4 KiB, in L1 */
        a0 = _mm512_dpwssd_epi32(a0, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w + i))),
                                 _mm512_loadu_si512(xq + c));
        a1 = _mm512_dpwssd_epi32(a1, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w + i + 32))),
                                 _mm512_loadu_si512(xq + c + 32));
    }
    return (float)_mm512_reduce_add_epi32(_mm512_add_epi32(a0, a1));
}

typedef struct {
    const variant *v;
    int t;
    double sec;
} job;

static void *run(void *p) {
    job *j = p;
    const size_t h = SZ / 2;
    const uint8_t *w = buf + h * (size_t)j->t;
    const double t0 = now();
    switch (j->v->kind) {
    case 0: sink += readloop(w, (long)h); break;
    case 1: sink += probe64(w, (long)h); break;
    case 2: sink += i8loop(w, (long)h, j->v->hint, j->v->dist); break;
    default: {
        const int64_t cols = j->v->dist, rows = (int64_t)h / cols;
        tsr_gemv_i8_args a = {(const int8_t *)w, ws, cols, xq, xs, 1, yv + (size_t)j->t * (SZ / 896 / 2 + 16), 0};
        tsr_gemv_i8_rows_avx512_vnni(&a, 0, rows);
    }
    }
    j->sec = now() - t0;
    return NULL;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 && atoi(argv[1]) > 0 && atoi(argv[1]) <= 101 ? atoi(argv[1]) : 21;
    if (!__builtin_cpu_supports("avx512vnni")) {
        fprintf(stderr, "stream_lab: this CPU lacks AVX512-VNNI\n");
        return 1;
    }
    buf = aligned_alloc((size_t)2 << 20, SZ);
    yv = calloc(SZ / 896 + 64, sizeof *yv);
    if (!buf || !yv) return 1;
    madvise(buf, SZ, MADV_HUGEPAGE);
    for (size_t i = 0; i < SZ; i++) buf[i] = (uint8_t)(i * 2654435761u >> 13);
    for (int i = 0; i < 8192; i++) xq[i] = (int16_t)(i * 37 % 2001 - 1000);
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) ws[i] = 1.0f;
    xs[0] = 1.0f;
    static double g[NV][101];
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < NV; v++) {
            pthread_t th[2];
            job j[2] = {{&vs[v], 0, 0}, {&vs[v], 1, 0}};
            for (int k = 0; k < 2; k++) pthread_create(&th[k], NULL, run, &j[k]);
            for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
            g[v][r] = (double)SZ / (j[0].sec > j[1].sec ? j[0].sec : j[1].sec) / 1e9;
        }
    printf("two threads over %zu MiB, medians of %d interleaved passes (GB/s)\n", SZ >> 20, reps);
    for (int v = 0; v < NV; v++) {
        qsort(g[v], (size_t)reps, sizeof(double), lab_cmp_double);
        printf("  %-22s %5.1f  (min %.1f, max %.1f)\n", vs[v].name, g[v][reps / 2], g[v][0], g[v][reps - 1]);
    }
    return 0;
}
