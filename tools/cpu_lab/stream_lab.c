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
 *   q8_0 COLS  the production Q8_0 x int16 kernel
 *             (tsr_gemv_q8_0_i16_rows_avx512_vnni, one input row) over the
 *             buffer as rows of COLS columns in 34-byte blocks
 *   q8 stored / split COLS  one lab loop over the same bytes two ways: the
 *             stored 34-byte blocks, or split (each row's codes in 64-byte
 *             lines, the f16 scales of all rows after the codes); each row
 *             summed across on its own, the same steps otherwise: is the
 *             stored layout (half the 32-byte code loads across two lines,
 *             two prefetches a 68-byte pair) what costs Q8_0 against int8?
 *             Also: split with each row's scales widened to f32 first;
 *             stored with each pair's codes permuted out of their two
 *             aligned lines, with one prefetch a pair, and with each row's
 *             scales gathered and widened first.
 * Prints the median GB/s of REPEATS interleaved passes of each (min, max).
 *   gcc -O2 -mavx2 -mfma -I. -o /tmp/stream_lab tools/cpu_lab/stream_lab.c \
 *       build/kernels/libtsr_kernels.a build/core/util/libtsr_util.a -lpthread -lm
 *   /tmp/stream_lab [REPEATS]   (needs AVX512-VNNI)
 */
#include "tools/cpu_lab/lab.h"
#include <pthread.h>

#include "kernels/cpu/gemv_cpu.h"

void tsr_gemv_i8_rows_avx512_vnni(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1);
void tsr_gemv_q8_0_i16_rows_avx512_vnni(const tsr_gemv_i8_args *a, int64_t r0, int64_t r1);

#define SZ ((size_t)512 << 20)
static uint8_t *buf;
static int16_t xq[8192];
static float ws[SZ / 896 + 16], xs[1], *yv;
static volatile float sink;

enum { NONE, T0, T1 };
typedef struct {
    const char *name;
    int kind; /* 0 probe32, 1 probe64, 2 i8 loop, 3 kernel, 4 Q8_0 kernel, 5-10 lab Q8_0 loops, 11 u8 x s8 loop */
    int hint;
    long dist; /* i8 loop: prefetch distance; kernel: columns */
} variant;
static const variant vs[] = {
    {"probe32 (t0 3 KiB)", 0, T0, 3072}, {"probe64 (t0 3 KiB)", 1, T0, 3072}, {"i8 loop, no prefetch", 2, NONE, 0},
    {"i8 loop, t0 3 KiB", 2, T0, 3072},  {"i8 loop, t1 3 KiB", 2, T1, 3072},  {"i8 loop, t1 6 KiB", 2, T1, 6144},
    {"i8 loop, t1 8 KiB", 2, T1, 8192},  {"kernel, 896 cols", 3, 0, 896},     {"kernel, 4864 cols", 3, 0, 4864},
    {"q8_0, 896 cols", 4, 0, 896},       {"q8_0, 4864 cols", 4, 0, 4864},
    {"q8 stored, 896 cols", 5, 0, 896},  {"q8 split, 896 cols", 6, 0, 896},
    {"q8 split, f32 d, 896", 7, 0, 896}, {"q8 lines, 896 cols", 8, 0, 896},
    {"q8 stored, 1 pf/pair", 9, 0, 896}, {"q8 stored, f32 d", 10, 0, 896},
    {"u8 x s8 loop, t1 6 KiB", 11, T1, 6144},
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

#define Q8_STEP(codes, d, b, h)                                                                    \
    do {                                                                                           \
        const __m512i q_ = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(codes))); \
        const __m512i t_ = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q_, _mm512_loadu_si512(xq + (b) * 32)); \
        acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(d)), _mm512_cvtepi32_ps(t_), acc[h]);     \
    } while (0)

static uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* rows of nb stored blocks (d, 32 codes) from w (one: a prefetch a pair, not two) */
__attribute__((target("avx512f,avx512bw,avx512vnni,f16c,fma"), noinline)) static void q8_stored(const uint8_t *w,
                                                                                              int64_t nb, int64_t rows,
                                                                                              float *y, int one) {
    for (int64_t r = 0; r < rows; r++, w += nb * 34) {
        __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int64_t b = 0; b + 2 <= nb; b += 2) {
            const uint8_t *blk = w + b * 34;
            _mm_prefetch((const char *)blk + 6144, _MM_HINT_T1);
            if (!one) _mm_prefetch((const char *)blk + 6144 + 64, _MM_HINT_T1);
            Q8_STEP(blk + 2, rd16(blk), b, 0);
            Q8_STEP(blk + 36, rd16(blk + 34), b + 1, 1);
        }
        y[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
    }
}

/* split, each row's scales widened to f32 first (16 a conversion), then
 * broadcast from there block by block */
__attribute__((target("avx512f,avx512bw,avx512vnni,f16c,fma"), noinline)) static void q8_split32(const uint8_t *w,
                                                                                               int64_t nb, int64_t rows,
                                                                                               float *y) {
    const uint8_t *sc = w + rows * nb * 32;
    float d[64 + 16];
    for (int64_t r = 0; r < rows; r++, w += nb * 32, sc += nb * 2) {
        __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        _mm_prefetch((const char *)sc + 384, _MM_HINT_T1);
        for (int64_t b = 0; b < nb; b += 16)
            _mm512_storeu_ps(d + b, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(sc + 2 * b))));
        for (int64_t b = 0; b + 2 <= nb; b += 2) {
            _mm_prefetch((const char *)w + b * 32 + 6144, _MM_HINT_T1);
            const __m512i q0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(w + b * 32)));
            const __m512i q1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(w + b * 32 + 32)));
            const __m512i t0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q0, _mm512_loadu_si512(xq + b * 32));
            const __m512i t1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q1, _mm512_loadu_si512(xq + b * 32 + 32));
            acc[0] = _mm512_fmadd_ps(_mm512_set1_ps(d[b]), _mm512_cvtepi32_ps(t0), acc[0]);
            acc[1] = _mm512_fmadd_ps(_mm512_set1_ps(d[b + 1]), _mm512_cvtepi32_ps(t1), acc[1]);
        }
        y[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
    }
}

/* stored blocks, each row's scales first gathered and widened to f32 on
 * the stack, then broadcast from there block by block */
__attribute__((target("avx512f,avx512bw,avx512vnni,f16c,fma"), noinline)) static void q8_stored32(const uint8_t *w,
                                                                                                int64_t nb,
                                                                                                int64_t rows, float *y) {
    float d[256];
    for (int64_t r = 0; r < rows; r++, w += nb * 34) {
        __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int64_t b = 0; b < nb; b++) d[b] = _cvtsh_ss(rd16(w + b * 34));
        for (int64_t b = 0; b + 2 <= nb; b += 2) {
            const uint8_t *blk = w + b * 34;
            _mm_prefetch((const char *)blk + 6144, _MM_HINT_T1);
            _mm_prefetch((const char *)blk + 6144 + 64, _MM_HINT_T1);
            const __m512i q0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(blk + 2)));
            const __m512i q1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(blk + 36)));
            const __m512i t0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q0, _mm512_loadu_si512(xq + b * 32));
            const __m512i t1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q1, _mm512_loadu_si512(xq + b * 32 + 32));
            acc[0] = _mm512_fmadd_ps(_mm512_set1_ps(d[b]), _mm512_cvtepi32_ps(t0), acc[0]);
            acc[1] = _mm512_fmadd_ps(_mm512_set1_ps(d[b + 1]), _mm512_cvtepi32_ps(t1), acc[1]);
        }
        y[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
    }
}

/* stored blocks, each pair's 64 codes taken from the two aligned lines that
 * hold them (vpermi2b) instead of two 32-byte loads of which about half
 * cross a line */
__attribute__((target("avx512f,avx512bw,avx512vbmi,avx512vnni,f16c,fma"), noinline)) static void
q8_lines(const uint8_t *w, int64_t nb, int64_t rows, float *y) {
    uint8_t ib[64];
    for (int i = 0; i < 64; i++) ib[i] = (uint8_t)(i < 32 ? 2 + i : 4 + i);
    const __m512i base = _mm512_loadu_si512(ib);
    for (int64_t r = 0; r < rows; r++, w += nb * 34) {
        __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int64_t b = 0; b + 2 <= nb; b += 2) {
            const uint8_t *blk = w + b * 34;
            _mm_prefetch((const char *)blk + 6144, _MM_HINT_T1);
            _mm_prefetch((const char *)blk + 6144 + 64, _MM_HINT_T1);
            const uint8_t *a = (const uint8_t *)((uintptr_t)blk & ~(uintptr_t)63);
            const __m512i idx = _mm512_add_epi8(base, _mm512_set1_epi8((char)(blk - a)));
            const __m512i c = _mm512_permutex2var_epi8(_mm512_load_si512(a), idx, _mm512_load_si512(a + 64));
            const __m512i q0 = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(c));
            const __m512i q1 = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(c, 1));
            const __m512i t0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q0, _mm512_loadu_si512(xq + b * 32));
            const __m512i t1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q1, _mm512_loadu_si512(xq + b * 32 + 32));
            acc[0] = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(rd16(blk))), _mm512_cvtepi32_ps(t0), acc[0]);
            acc[1] = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(rd16(blk + 34))), _mm512_cvtepi32_ps(t1), acc[1]);
        }
        y[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
    }
}

/* the same rows split: codes [rows, 32 nb], then the scales [rows, nb] */
__attribute__((target("avx512f,avx512bw,avx512vnni,f16c,fma"), noinline)) static void q8_split(const uint8_t *w,
                                                                                             int64_t nb, int64_t rows,
                                                                                             float *y) {
    const uint8_t *sc = w + rows * nb * 32;
    for (int64_t r = 0; r < rows; r++, w += nb * 32, sc += nb * 2) {
        __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        _mm_prefetch((const char *)sc + 384, _MM_HINT_T1);
        for (int64_t b = 0; b + 2 <= nb; b += 2) {
            _mm_prefetch((const char *)w + b * 32 + 6144, _MM_HINT_T1);
            Q8_STEP(w + b * 32, rd16(sc + 2 * b), b, 0);
            Q8_STEP(w + b * 32 + 32, rd16(sc + 2 * b + 2), b + 1, 1);
        }
        y[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
    }
}

/* the int8 weights against 8-bit activations: one vpdpbusd a 64-byte line
 * (u8 activations times s8 weights, four products a lane), no widening */
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) static float u8loop(const uint8_t *w, long n,
                                                                                  long dist) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0;
    for (long i = 0; i < n; i += 128) {
        _mm_prefetch((const char *)w + i + dist, _MM_HINT_T1);
        _mm_prefetch((const char *)w + i + dist + 64, _MM_HINT_T1);
        const long c = i & 4095; /* activations: 4 KiB, in L1 */
        a0 = _mm512_dpbusd_epi32(a0, _mm512_loadu_si512((const uint8_t *)xq + c), _mm512_loadu_si512(w + i));
        a1 = _mm512_dpbusd_epi32(a1, _mm512_loadu_si512((const uint8_t *)xq + c + 64), _mm512_loadu_si512(w + i + 64));
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
    case 11: sink += u8loop(w, (long)h, j->v->dist); break;
    case 5:
    case 6:
    case 7:
    case 8:
    case 9:
    case 10: {
        const int64_t nb = j->v->dist / 32, rows = (int64_t)h / (nb * 34);
        float *y = yv + (size_t)j->t * (SZ / 896 / 2 + 16);
        if (j->v->kind == 5 || j->v->kind == 9) q8_stored(w, nb, rows, y, j->v->kind == 9);
        else if (j->v->kind == 6) q8_split(w, nb, rows, y);
        else if (j->v->kind == 8) q8_lines(w, nb, rows, y);
        else if (j->v->kind == 10) q8_stored32(w, nb, rows, y);
        else q8_split32(w, nb, rows, y);
        break;
    }
    case 4: { /* Q8_0 rows: cols / 32 blocks of 34 bytes (d, then 32 codes) */
        const int64_t cols = j->v->dist, rows = (int64_t)h / (cols / 32 * 34);
        tsr_gemv_i8_args a = {.w = (const int8_t *)w, .wscale = ws, .cols = cols, .xq = xq, .xscale = xs, .nx = 1,
                               .y = yv + (size_t)j->t * (SZ / 896 / 2 + 16)};
        tsr_gemv_q8_0_i16_rows_avx512_vnni(&a, 0, rows);
        break;
    }
    default: {
        const int64_t cols = j->v->dist, rows = (int64_t)h / cols;
        tsr_gemv_i8_args a = {.w = (const int8_t *)w, .wscale = ws, .cols = cols, .xq = xq, .xscale = xs, .nx = 1,
                               .y = yv + (size_t)j->t * (SZ / 896 / 2 + 16)};
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
    for (size_t t = 0; t < 2; t++) /* Q8_0 blocks from each half's start: d = 1.0 (f16), not a NaN */
        for (size_t o = t * (SZ / 2); o + 34 <= (t + 1) * (SZ / 2); o += 34) buf[o] = 0x00, buf[o + 1] = 0x3c;
    for (size_t t = 0; t < 2; t++) { /* and the split rows' scales (896 columns) */
        const size_t rows = SZ / 2 / (28 * 34), o0 = t * (SZ / 2) + rows * 28 * 32;
        for (size_t o = o0; o < o0 + rows * 28 * 2; o += 2) buf[o] = 0x00, buf[o + 1] = 0x3c;
    }
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
