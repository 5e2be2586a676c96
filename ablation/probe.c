#include "probe.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../core/util/clock.h"
#include "bench.h"

#ifdef TESSERA_CUDA
#include "core/cuda/device.h"
#include "kernels/cuda/probe_cuda.h"
#endif

#ifdef TSR_ABL_HAVE_CBLAS
#include <cblas.h>
#endif

static double median(double *v, int n) { return tsr_stat3_of(v, n).med; }

static void read_machine(tsr_probe_result *r) {
    snprintf(r->cpu_model, sizeof r->cpu_model, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    if (f) {
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10)) continue;
            char *c = strchr(line, ':');
            if (!c) continue;
            c++;
            while (*c == ' ' || *c == '\t') c++;
            c[strcspn(c, "\n")] = 0;
            snprintf(r->cpu_model, sizeof r->cpu_model, "%s", c);
            break;
        }
        fclose(f);
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    r->n_cores = n > 0 ? (int)n : 1;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    r->mem_bytes = pages > 0 && psz > 0 ? (unsigned long long)pages * (unsigned long long)psz : 0;
    r->llc_bytes = 0;
    for (int idx = 0; idx < 8; idx++) { /* the largest cache level listed */
        char p[128];
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu0/cache/index%d/size", idx);
        FILE *g = fopen(p, "r");
        if (!g) break;
        unsigned long long v = 0;
        char unit = 0;
        if (fscanf(g, "%llu%c", &v, &unit) >= 1) {
            if (unit == 'K') v <<= 10;
            else if (unit == 'M') v <<= 20;
            if (v > r->llc_bytes) r->llc_bytes = v;
        }
        fclose(g);
    }
}

/* The read loops (read_pass's loop): 64-bit words; on x86-64 with AVX2
 * also the three loops above. */
enum { LOOP_WORDS, LOOP_INT4, LOOP_FLOAT2, LOOP_FLOAT2_PF, LOOP_FLOAT512_PF, N_LOOPS };
static const char *const loop_names[N_LOOPS] = {
    "64-bit loads, four chains",
    "32-byte loads, four chains of integer adds",
    "32-byte loads, two chains of float adds",
    "32-byte loads, two chains of float adds, software prefetch 3 KiB ahead",
    "64-byte loads, two chains of float adds, software prefetch 3 KiB ahead",
};

/* One thread's part of a timed pass: read n words at p with loop, or
 * (fma_iters > 0) run the multiply-add loop that many times. */
typedef struct pass_job {
    const uint64_t *p;
    size_t n;
    int loop;
    long fma_iters;
    uint64_t sum;
    atomic_int *go;
    double t0, t1;
} pass_job;

/* FLOPs of one iteration of fma_loop_avx2: 12 FMAs of 8 lanes. */
#define FMA_FLOPS_PER_ITER (12 * 8 * 2)

/* 64-bit loads: what any x86-64 (or other) CPU runs. */
static uint64_t read_words(const uint64_t *p, size_t n) {
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 += p[i] + p[i + 4];
        a1 += p[i + 1] + p[i + 5];
        a2 += p[i + 2] + p[i + 6];
        a3 += p[i + 3] + p[i + 7];
    }
    for (; i < n; i++) a0 += p[i];
    return a0 ^ a1 ^ a2 ^ a3;
}

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/cpu/cpu_features.h"

/* The read loops the probe tries, the fastest taken as the ceiling: what a
 * core's loads and the hardware prefetchers deliver depends on the loop.
 * Four streams of 32-byte integer adds: scalar loads left about half of an
 * EPYC's bandwidth unused (14-17 against 28 GB/s). On a 2-core Xeon VM the
 * same loop read 28-30 GB/s where two chains of float adds (a slower loop:
 * fewer demand misses at once, more room for the prefetchers) read 32-37
 * and, asking for the lines 3 KiB ahead, 39: a loop the engine's kernels
 * can match (their software prefetch, gemv_avx2.c), so no ceiling below
 * it. */
__attribute__((target("avx2"))) static uint64_t read_words_avx2(const uint64_t *p, size_t n) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_add_epi64(s0, _mm256_loadu_si256((const __m256i *)(p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_loadu_si256((const __m256i *)(p + i + 4)));
        s2 = _mm256_add_epi64(s2, _mm256_loadu_si256((const __m256i *)(p + i + 8)));
        s3 = _mm256_add_epi64(s3, _mm256_loadu_si256((const __m256i *)(p + i + 12)));
    }
    s0 = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, s0);
    return (lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3]) + read_words(p + i, n - i);
}

/* Two chains of float adds over 64 bytes a step; with pf, each step asks
 * for the line 3 KiB ahead. */
__attribute__((target("avx2"))) static uint64_t read_floats_avx2(const uint64_t *p, size_t n, int pf) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        if (pf) _mm_prefetch((const char *)(p + i) + 3072, _MM_HINT_T0);
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps((const float *)(p + i)));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps((const float *)(p + i + 4)));
    }
    uint32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, _mm256_castps_si256(_mm256_add_ps(s0, s1)));
    return (uint64_t)(lanes[0] ^ lanes[7]) + read_words(p + i, n - i);
}

/* The same in 64-byte loads (a line a load) where the CPU runs AVX-512F:
 * on a 2-core Xeon VM (Sapphire Rapids) 31.4-32.8 GB/s where the 32-byte
 * loop read 28.2-30.5 in the same minutes (a two-thread lab over 512 MiB,
 * BENCHMARKS.md, twenty-eighth session): fewer load instructions a line
 * leave more of the core's misses in flight. A ceiling the kernels must
 * be measured against, so it is one of the loops. */
__attribute__((target("avx512f"))) static uint64_t read_floats_avx512(const uint64_t *p, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm_prefetch((const char *)(p + i) + 3072, _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i) + 3072 + 64, _MM_HINT_T0);
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps((const float *)(p + i)));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps((const float *)(p + i + 8)));
    }
    const float f = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint64_t)u + read_words(p + i, n - i);
}

/* The f32 multiply-add ceiling of a core: twelve independent chains of
 * 8-lane FMAs in registers (more than latency x issue width on current
 * x86-64), nothing else; a GEMM kernel can at best approach it. */
__attribute__((target("avx2,fma"))) static uint64_t fma_loop_avx2(long iters) {
    __m256 a[12];
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps(0.001f * (float)i);
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
    for (long k = 0; k < iters; k++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
    for (int i = 1; i < 12; i++) a[0] = _mm256_add_ps(a[0], a[i]);
    float f[8];
    _mm256_storeu_ps(f, a[0]);
    uint32_t u;
    memcpy(&u, &f[0], 4);
    return u;
}

/* The same with 16-lane FMAs where the CPU has AVX-512F (the ceiling of the
 * GEMM's AVX-512 tile, gemm_avx2.c): twelve chains again, half the
 * iterations, so the same FLOPs. */
__attribute__((target("avx512f"))) static uint64_t fma_loop_avx512(long iters) {
    __m512 a[12];
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps(0.001f * (float)i);
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
    for (long k = 0; k < iters / 2; k++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);
    for (int i = 1; i < 12; i++) a[0] = _mm512_add_ps(a[0], a[i]);
    float f = _mm512_reduce_add_ps(a[0]);
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
#endif

static void *pass_thread(void *arg) {
    pass_job *j = arg;
    while (!atomic_load(j->go)) {
    }
    j->t0 = tsr_now_seconds();
#if defined(__x86_64__)
    if (j->fma_iters) /* only asked where AVX2 + FMA run */
        j->sum = tsr_cpu_has_avx512f() ? fma_loop_avx512(j->fma_iters) : fma_loop_avx2(j->fma_iters);
    else if (j->loop == LOOP_INT4) j->sum = read_words_avx2(j->p, j->n);
    else if (j->loop == LOOP_FLOAT512_PF) j->sum = read_floats_avx512(j->p, j->n);
    else if (j->loop != LOOP_WORDS) j->sum = read_floats_avx2(j->p, j->n, j->loop == LOOP_FLOAT2_PF);
    else j->sum = read_words(j->p, j->n);
#else
    j->sum = read_words(j->p, j->n);
#endif
    j->t1 = tsr_now_seconds();
    return NULL;
}

/* One timed pass of nt threads over buf (words to read), or of the FMA loop
 * (fma_iters a thread, buf unused): seconds from the first start to the
 * last end; -1 if the threads cannot be started. */
static double timed_pass(const uint64_t *buf, size_t words, int loop, long fma_iters, int nt, uint64_t *sink) {
    pthread_t th[256];
    pass_job jobs[256];
    atomic_int go = 0;
    size_t per = words / (size_t)nt;
    int started = 0;
    for (int t = 0; t < nt; t++) {
        jobs[t] = (pass_job){.p = buf + per * (size_t)t,
                           .n = t == nt - 1 ? words - per * (size_t)t : per,
                           .loop = loop,
                           .fma_iters = fma_iters,
                           .go = &go};
        if (pthread_create(&th[t], NULL, pass_thread, &jobs[t])) break;
        started++;
    }
    atomic_store(&go, 1);
    if (started < nt) {
        for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
        return -1;
    }
    double t0 = 1e300, t1 = 0;
    for (int t = 0; t < nt; t++) {
        pthread_join(th[t], NULL);
        if (jobs[t].t0 < t0) t0 = jobs[t].t0;
        if (jobs[t].t1 > t1) t1 = jobs[t].t1;
        *sink ^= jobs[t].sum;
    }
    return t1 - t0;
}

/* One timed read pass with loop: GB/s. */
static int read_pass(const uint64_t *buf, size_t words, int loop, int nt, double *gbs, uint64_t *sink) {
    double sec = timed_pass(buf, words, loop, 0, nt, sink);
    if (sec < 0) return -1;
    *gbs = (double)words * 8 / sec / 1e9;
    return 0;
}

/* The multiply-add ceiling on r->n_threads threads (GFLOP/s, median of
 * repeats of about 0.06 s each); NAN where AVX2 + FMA do not run. */
static void probe_fma(tsr_probe_result *r) {
    r->fma_gflops = r->fma_gflops_min = r->fma_gflops_max = NAN;
#if defined(__x86_64__)
    if (!tsr_cpu_has_avx2_fma_f16c()) return;
    r->fma_avx512 = tsr_cpu_has_avx512f();
    double s[100];
    uint64_t sink = 0;
    const long iters = 30000000; /* 5.8 GFLOP a thread: ~0.06 s at this machine's 95 GFLOP/s a core */
    for (int k = 0; k < r->repeats; k++) {
        double sec = timed_pass(NULL, 0, LOOP_WORDS, iters, r->n_threads, &sink);
        if (sec <= 0) return;
        s[k] = (double)iters * FMA_FLOPS_PER_ITER * r->n_threads / sec / 1e9;
    }
    r->fma_gflops = median(s, r->repeats);
    r->fma_gflops_min = s[0];
    r->fma_gflops_max = s[r->repeats - 1];
    if (sink == 0x1234) fputc(' ', stderr); /* keep the loop */
#endif
}

/* The device's ceilings: read bandwidth over 4 GiB, 8192^3 matmuls. */
static void probe_gpu(tsr_probe_result *r) {
    r->gpu_read_gbs = r->gpu_read_gbs_min = r->gpu_read_gbs_max = NAN;
    r->gpu_bf16_tflops = r->gpu_fp8_tflops = NAN;
#ifdef TESSERA_CUDA
    tsr_error err;
    tsr_error_clear(&err);
    if (tsr_cuda_device_count() == 0 || tsr_cuda_init(0, &err) != TSR_OK) {
        snprintf(r->gpu_note, sizeof r->gpu_note, "no CUDA device");
        return;
    }
    r->have_gpu = 1;
    tsr_cuda_describe(r->gpu_name, sizeof r->gpu_name);
    char why[256] = "";
    size_t n = strlen(r->gpu_note);
    if (tsr_cu_probe_read((size_t)4 << 30, r->repeats, &r->gpu_read_gbs, &r->gpu_read_gbs_min,
                          &r->gpu_read_gbs_max, why, sizeof why) != 0)
        n += (size_t)snprintf(r->gpu_note + n, sizeof r->gpu_note - n, "read: %s; ", why);
    if (tsr_cu_probe_matmul(8192, 0, r->repeats, &r->gpu_bf16_tflops, why, sizeof why) != 0 &&
        n < sizeof r->gpu_note)
        n += (size_t)snprintf(r->gpu_note + n, sizeof r->gpu_note - n, "bf16: %s; ", why);
    if (tsr_cu_probe_matmul(8192, 1, r->repeats, &r->gpu_fp8_tflops, why, sizeof why) != 0 &&
        n < sizeof r->gpu_note)
        snprintf(r->gpu_note + n, sizeof r->gpu_note - n, "fp8: %s", why);
#else
    snprintf(r->gpu_note, sizeof r->gpu_note, "this tessera was built without CUDA");
#endif
}

/* The read buffer's default size for the machine m: 8 x its last-level
 * cache, at least 256 MiB (no cache holds a pass's reads twice over). */
static size_t default_buffer_bytes(const tsr_probe_result *m) {
    size_t bytes = (size_t)256 << 20;
    if (m->llc_bytes && m->llc_bytes * 8 > bytes) bytes = (size_t)m->llc_bytes * 8;
    return bytes;
}

/* A buffer of bytes (a multiple of 64) held as the engine holds prepared
 * weights (engine.c, h_alloc): on a 2 MiB boundary, its whole 2 MiB pages
 * advised into transparent huge pages before the first touch. In 4 KiB
 * pages the same loop read 30 against 34 GB/s on a 2-core Xeon VM (THP on
 * request only), below what the engine's GEMVs then streamed: no ceiling.
 * Every page touched; NULL on no memory. */
static uint64_t *read_buffer(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    uint64_t *buf = NULL;
    if (posix_memalign((void **)&buf, bytes >= huge ? huge : 64, bytes)) return NULL;
#ifdef MADV_HUGEPAGE
    if (bytes >= huge) (void)madvise(buf, bytes & ~(huge - 1), MADV_HUGEPAGE);
#endif
    for (size_t i = 0; i < bytes / 8; i++) buf[i] = i * 0x9e3779b97f4a7c15ull;
    return buf;
}

/* Every read loop this CPU runs, repeats passes of nt threads over buf
 * each: the loop of the fastest median (*won), that median (returned, GB/s)
 * and its passes sorted into best[repeats] (s: repeats of scratch). */
static double fastest_loop(const uint64_t *buf, size_t words, int nt, int repeats, double *s, double *best,
                           int *won, uint64_t *sink) {
    int loop0 = LOOP_WORDS, loop1 = LOOP_WORDS;
    *won = LOOP_WORDS;
#if defined(__x86_64__)
    if (tsr_cpu_has_avx2_fma_f16c()) loop0 = LOOP_INT4, loop1 = LOOP_FLOAT2_PF, *won = loop0;
    if (loop1 == LOOP_FLOAT2_PF && tsr_cpu_has_avx512f()) loop1 = LOOP_FLOAT512_PF;
#endif
    double top = 0;
    for (int l = loop0; l <= loop1; l++) {
        for (int k = 0; k < repeats; k++) read_pass(buf, words, l, nt, &s[k], sink);
        double med = median(s, repeats);
        if (med > top) {
            top = med, *won = l;
            memcpy(best, s, sizeof(double) * (size_t)repeats);
        }
    }
    return top;
}

int tsr_probe_run(const tsr_probe_opts *o, tsr_probe_result *r, tsr_error *err) {
    memset(r, 0, sizeof *r);
    read_machine(r);
    r->n_threads = o && o->n_threads > 0 ? o->n_threads : r->n_cores;
    if (r->n_threads > 256) r->n_threads = 256;
    r->repeats = o && o->repeats > 0 ? o->repeats : 5;
    if (r->repeats > 100) r->repeats = 100;
    r->gemm_n = o && o->gemm_n > 0 ? o->gemm_n : 1024;
    size_t bytes = o && o->buffer_bytes ? o->buffer_bytes : default_buffer_bytes(r);
    bytes &= ~(size_t)63;
    if (bytes < 4096) return tsr_error_set(err, TSR_ERR_INVALID, "probe: buffer of %zu bytes", bytes);
    r->buffer_bytes = bytes;

    uint64_t *buf = read_buffer(bytes);
    if (!buf) return tsr_error_set(err, TSR_ERR_NOMEM, "probe: no memory for a %zu-byte buffer", bytes);
    size_t words = bytes / 8;
    double *s = malloc(sizeof(double) * 2 * (size_t)r->repeats);
    if (!s) {
        free(buf);
        return tsr_error_set(err, TSR_ERR_NOMEM, "probe: out of memory");
    }
    double *best = s + r->repeats;
    uint64_t sink = 0;
    double warm;
    if (read_pass(buf, words, LOOP_WORDS, r->n_threads, &warm, &sink)) {
        free(buf);
        free(s);
        return tsr_error_set(err, TSR_ERR_IO, "probe: cannot start %d threads", r->n_threads);
    }
    /* every loop this CPU runs, repeats passes each; the fastest median wins */
    int won;
    r->read_gbs = fastest_loop(buf, words, r->n_threads, r->repeats, s, best, &won, &sink);
    snprintf(r->read_loop, sizeof r->read_loop, "%s", loop_names[won]);
    double t_all = 0, bytes_all = 0;
    for (double t0 = tsr_now_seconds(); tsr_now_seconds() - t0 < 1.0;) {
        double g;
        if (read_pass(buf, words, won, r->n_threads, &g, &sink)) break;
        t_all += (double)words * 8 / g / 1e9;
        bytes_all += (double)words * 8;
    }
    r->read_gbs_sustained = t_all > 0 ? bytes_all / t_all / 1e9 : 0;
    r->read_gbs_min = best[0];
    r->read_gbs_max = best[r->repeats - 1];
    free(buf);
    if (sink == 0x1234) fputc(' ', stderr); /* keep the reads */
    probe_fma(r);

#ifdef TSR_ABL_HAVE_CBLAS
    int n = r->gemm_n;
    size_t nn = (size_t)n * (size_t)n;
    float *a = malloc(nn * sizeof *a), *b = malloc(nn * sizeof *b), *c = malloc(nn * sizeof *c);
    if (!a || !b || !c) {
        free(a), free(b), free(c), free(s);
        return tsr_error_set(err, TSR_ERR_NOMEM, "probe: no memory for %dx%d matrices", n, n);
    }
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)((i * 7) % 13) * 0.01f;
        b[i] = (float)((i * 5) % 11) * 0.01f;
    }
    openblas_set_num_threads(r->n_threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    for (int k = 0; k < r->repeats; k++) {
        double t0 = tsr_now_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        s[k] = 2.0 * n * (double)n * n / (tsr_now_seconds() - t0) / 1e9;
    }
    r->gemm_gflops = median(s, r->repeats);
    r->gemm_gflops_min = s[0];
    r->gemm_gflops_max = s[r->repeats - 1];
    r->have_gemm = 1;
    free(a), free(b), free(c);
#endif
    free(s);
    probe_gpu(r);
    return TSR_OK;
}

struct tsr_probe_reader {
    uint64_t *buf;
    size_t words, window; /* the buffer's, a read's (in words) */
    size_t next;          /* the next window's first word */
    int loop, n_threads;
    uint64_t sink;
};

int tsr_probe_reader_new(int n_threads, size_t window_bytes, size_t buffer_bytes, tsr_probe_reader **out,
                         tsr_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 256)
        return tsr_error_set(err, TSR_ERR_INVALID, "probe reader: %d threads", n_threads);
    window_bytes &= ~(size_t)63;
    if (window_bytes < 4096)
        return tsr_error_set(err, TSR_ERR_INVALID, "probe reader: a window of %zu bytes", window_bytes);
    /* windows in turn through a buffer no cache holds twice over */
    size_t bytes = buffer_bytes;
    if (!bytes) {
        tsr_probe_result m;
        memset(&m, 0, sizeof m);
        read_machine(&m);
        bytes = default_buffer_bytes(&m);
    }
    if (bytes < window_bytes * 4) bytes = window_bytes * 4;
    bytes = bytes / window_bytes * window_bytes;
    tsr_probe_reader *rd = calloc(1, sizeof *rd);
    if (!rd || !(rd->buf = read_buffer(bytes))) {
        free(rd);
        return tsr_error_set(err, TSR_ERR_NOMEM, "probe reader: no memory for a %zu-byte buffer", bytes);
    }
    rd->words = bytes / 8, rd->window = window_bytes / 8, rd->n_threads = n_threads;
    double s[3], best[3], warm;
    if (read_pass(rd->buf, rd->words, LOOP_WORDS, n_threads, &warm, &rd->sink)) {
        tsr_probe_reader_free(rd);
        return tsr_error_set(err, TSR_ERR_IO, "probe reader: cannot start %d threads", n_threads);
    }
    fastest_loop(rd->buf, rd->words, n_threads, 3, s, best, &rd->loop, &rd->sink);
    *out = rd;
    return TSR_OK;
}

double tsr_probe_reader_pass(tsr_probe_reader *rd) {
    double gbs;
    if (read_pass(rd->buf + rd->next, rd->window, rd->loop, rd->n_threads, &gbs, &rd->sink)) return -1;
    rd->next += rd->window;
    if (rd->next + rd->window > rd->words) rd->next = 0;
    return gbs;
}

const char *tsr_probe_reader_loop(const tsr_probe_reader *rd) { return loop_names[rd->loop]; }

void tsr_probe_reader_free(tsr_probe_reader *rd) {
    if (!rd) return;
    if (rd->sink == 0x1234) fputc(' ', stderr); /* keep the reads */
    free(rd->buf);
    free(rd);
}

json_t *tsr_jnum(double x) { return isfinite(x) ? json_real(x) : json_null(); }

double tsr_jnum_at(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static json_t *probe_json(const tsr_probe_result *r);

json_t *tsr_probe_to_json(const tsr_probe_result *r) {
    json_t *j = probe_json(r);
    json_t *g = j ? json_object_get(j, "gpu") : NULL;
    if (!g) return j;
    json_t *f = json_pack("{s:o, s:o, s:o, s:i, s:s, s:s}", "gflops", tsr_jnum(r->fma_gflops), "gflops_min",
                          tsr_jnum(r->fma_gflops_min), "gflops_max", tsr_jnum(r->fma_gflops_max), "threads",
                          r->n_threads, "isa", r->fma_avx512 ? "avx512" : "avx2", "method",
                          isfinite(r->fma_gflops)
                              ? (r->fma_avx512 ? "12 independent chains of 16-lane (AVX-512) f32 FMAs in registers on "
                                                 "every thread, median of repeats: the ceiling of this engine's GEMM "
                                                 "(its AVX-512 tile)"
                                               : "12 independent chains of 8-lane (AVX2) f32 FMAs in registers on every "
                                                 "thread, median of repeats: the ceiling of this engine's AVX2 kernels")
                              : "not measured: no AVX2 + FMA here, or read from a record without it");
    if (!f || json_object_set_new(j, "fma", f)) {
        json_decref(j);
        return NULL;
    }
    json_object_set_new(g, "name", r->have_gpu ? json_string(r->gpu_name) : json_null());
    json_object_set_new(g, "read_gbs", tsr_jnum(r->gpu_read_gbs));
    json_object_set_new(g, "read_gbs_min", tsr_jnum(r->gpu_read_gbs_min));
    json_object_set_new(g, "read_gbs_max", tsr_jnum(r->gpu_read_gbs_max));
    json_object_set_new(g, "bf16_tflops", tsr_jnum(r->gpu_bf16_tflops));
    json_object_set_new(g, "fp8_tflops", tsr_jnum(r->gpu_fp8_tflops));
    json_object_set_new(g, "method", json_string("read: 16-byte loads over 4 GiB, CUDA events, median; "
                                                 "matmul: cuBLASLt 8192^3, f32 accumulation, median"));
    json_object_set_new(g, "note", json_string(r->gpu_note));
    return j;
}

static json_t *probe_json(const tsr_probe_result *r) {
    return json_pack(
        "{s:s, s:{s:s, s:i, s:I, s:I}, s:{s:f, s:f, s:f, s:f, s:i, s:I, s:i, s:s, s:s}, s:{s:o, s:f, s:f, s:f, "
        "s:i, s:i, s:s}, s:{s:n, s:n, s:n, s:n, s:n, s:s}}",
        "schema", "tessera.device/1",
        "machine", "cpu_model", r->cpu_model, "cores", r->n_cores, "memory_bytes",
        (json_int_t)r->mem_bytes, "llc_bytes", (json_int_t)r->llc_bytes,
        "memory_read", "gbs", r->read_gbs, "gbs_min", r->read_gbs_min, "gbs_max", r->read_gbs_max,
        "gbs_sustained", r->read_gbs_sustained,
        "threads", r->n_threads, "buffer_bytes", (json_int_t)r->buffer_bytes, "repeats", r->repeats,
        "method",
        "streaming read of the buffer split across threads by the fastest of the read loops this CPU runs "
        "(loop: the one taken), the buffer in transparent huge pages where the kernel gives them (as the "
        "engine holds weights); median of repeats; sustained: passes back to back for a second, bytes over "
        "the whole time",
        "loop", r->read_loop,
        "gemm", "available", json_boolean(r->have_gemm), "gflops", r->gemm_gflops, "gflops_min",
        r->gemm_gflops_min, "gflops_max", r->gemm_gflops_max, "n", r->gemm_n, "threads",
        r->n_threads, "method",
        r->have_gemm ? "OpenBLAS cblas_sgemm, square f32, median of repeats"
                     : "not measured: built without cblas",
        "gpu", "name", "driver", "read_gbs", "bf16_tflops", "fp8_tflops", "note", "");
}


int tsr_probe_from_json(const json_t *j, tsr_probe_result *r, tsr_error *err) {
    memset(r, 0, sizeof *r);
    const json_t *sch = json_object_get(j, "schema");
    if (!json_is_string(sch) || strcmp(json_string_value(sch), "tessera.device/1"))
        return tsr_error_set(err, TSR_ERR_FORMAT, "device record: schema is not \"tessera.device/1\"");
    const json_t *m = json_object_get(j, "machine"), *mr = json_object_get(j, "memory_read"),
                 *g = json_object_get(j, "gemm");
    if (!json_is_object(m) || !json_is_object(mr) || !json_is_object(g))
        return tsr_error_set(err, TSR_ERR_FORMAT,
                             "device record: needs objects machine, memory_read and gemm");
    r->read_gbs = tsr_jnum_at(mr, "gbs");
    r->gemm_gflops = tsr_jnum_at(g, "gflops");
    if (!isfinite(r->read_gbs) || r->read_gbs <= 0)
        return tsr_error_set(err, TSR_ERR_FORMAT, "device record: memory_read.gbs must be > 0");
    if (!isfinite(r->gemm_gflops) || r->gemm_gflops < 0)
        return tsr_error_set(err, TSR_ERR_FORMAT, "device record: gemm.gflops must be >= 0");
    r->read_gbs_min = tsr_jnum_at(mr, "gbs_min");
    r->read_gbs_max = tsr_jnum_at(mr, "gbs_max");
    r->read_gbs_sustained = tsr_jnum_at(mr, "gbs_sustained"); /* NAN in records written before it existed */
    const json_t *lp = json_object_get(mr, "loop"); /* absent in records written before it existed */
    if (json_is_string(lp)) snprintf(r->read_loop, sizeof r->read_loop, "%s", json_string_value(lp));
    r->gemm_gflops_min = tsr_jnum_at(g, "gflops_min");
    r->gemm_gflops_max = tsr_jnum_at(g, "gflops_max");
    r->have_gemm = json_is_true(json_object_get(g, "available"));
    const json_t *f = json_object_get(j, "fma"); /* absent in records written before it existed */
    r->fma_gflops = json_is_object(f) ? tsr_jnum_at(f, "gflops") : NAN;
    r->fma_gflops_min = json_is_object(f) ? tsr_jnum_at(f, "gflops_min") : NAN;
    r->fma_gflops_max = json_is_object(f) ? tsr_jnum_at(f, "gflops_max") : NAN;
    const json_t *fi = json_is_object(f) ? json_object_get(f, "isa") : NULL; /* absent before AVX-512: avx2 */
    r->fma_avx512 = json_is_string(fi) && !strcmp(json_string_value(fi), "avx512");
    r->n_threads = (int)tsr_jnum_at(mr, "threads");
    r->n_cores = (int)tsr_jnum_at(m, "cores");
    const json_t *cm = json_object_get(m, "cpu_model");
    snprintf(r->cpu_model, sizeof r->cpu_model, "%s", json_is_string(cm) ? json_string_value(cm) : "unknown");
    double mb = tsr_jnum_at(m, "memory_bytes");
    r->mem_bytes = isfinite(mb) && mb > 0 ? (unsigned long long)mb : 0;
    /* the GPU (a CUDA engine's ceilings): a name where one was probed */
    const json_t *gpu = json_object_get(j, "gpu"), *gn = json_object_get(gpu, "name");
    const json_t *note = json_object_get(gpu, "note");
    r->have_gpu = json_is_string(gn);
    snprintf(r->gpu_name, sizeof r->gpu_name, "%s", r->have_gpu ? json_string_value(gn) : "");
    r->gpu_read_gbs = tsr_jnum_at(gpu, "read_gbs"), r->gpu_read_gbs_min = tsr_jnum_at(gpu, "read_gbs_min");
    r->gpu_read_gbs_max = tsr_jnum_at(gpu, "read_gbs_max");
    r->gpu_bf16_tflops = tsr_jnum_at(gpu, "bf16_tflops"), r->gpu_fp8_tflops = tsr_jnum_at(gpu, "fp8_tflops");
    snprintf(r->gpu_note, sizeof r->gpu_note, "%s", json_is_string(note) ? json_string_value(note) : "");
    return TSR_OK;
}
