/*
 * bench_gemv - GB/s of the gemv kernels (kernels/cpu/gemv_cpu.h) against a
 * plain read loop over the same bytes, the ceiling of a memory-bound gemv.
 *
 * usage: bench_gemv [-t THREADS] [-i portable|avx2|avx512] [-s SECONDS] [--shape 0|1|2] [--panel COLS] [--prefill]
 *
 * Per dtype and shape (Qwen2.5-0.5B's [4864 x 896] FFN up/gate, [151936 x 896]
 * output head and [896 x 4864] FFN down, the only one whose rows are whole
 * K-quant blocks), enough copies of the matrix are cycled through that
 * every pass comes from DRAM (>= 256 MiB in all, several times the L3), as a
 * model's successive layers do. Each figure is the median over passes.
 * i8x16 is int8 weights with int16 activations (cpu_gemv_int8's decode),
 * q8x16 Q8_0 weights as stored with int16 activations (its Q8_0 decode).
 * Copies lie in 2 MiB pages (MADV_HUGEPAGE), as the plugins hold resident
 * weights. --panel COLS stores each copy as column panels of COLS (rounded
 * up to whole blocks; the last panel the rest): panel p holds columns
 * [p COLS, p COLS + COLS) of every row, row after row, and a call runs the
 * kernel over each panel and adds the sums (one input row only: the other
 * columns print 0) -- the layout that streams a matrix of wide rows as one
 * contiguous run per panel (BENCHMARKS.md, sixteenth session).
 * --resident instead keeps one matrix of about 384 KiB (the first --shape's
 * columns) in the cores' L2 caches: the kernels' instruction ceilings, what
 * they could read per second if memory kept up.
 * --prefill also times the kernels against the blocked GEMM (gemm_cpu.h) and
 * widened tiles + OpenBLAS sgemm at 4..256 rows (the cpu_gemv plugin's
 * blas_min_rows threshold), in ms per call and GFLOP/s; --gemm ROWS COLS does
 * that for another [ROWS x COLS] matrix (e.g. Llama-3.2-1B's down projection,
 * 2048 x 8192, whose activation rows lie 32 KiB apart) and skips the gemv table.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

#include <cblas.h>

#include "core/util/threadpool.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/gemv_cpu.h"
#include "kernels/dtype.h"

extern void openblas_set_num_threads(int n) __attribute__((weak));

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t rng = 12345;
static uint32_t rnd32(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 32);
}
static float rndf(void) { return (float)(rnd32() >> 8) * 0x1p-23f - 1.0f; }

/* Random finite weights (no subnormals) of a dtype. */
static void fill(uint32_t dtype, uint8_t *w, uint64_t n_bytes, int64_t n_elems) {
    for (uint64_t i = 0; i < n_bytes; i++) w[i] = (uint8_t)rnd32();
    if (dtype == TSR_DTYPE_F32)
        for (int64_t i = 0; i < n_elems; i++) ((float *)(void *)w)[i] = rndf();
    else if (dtype == TSR_DTYPE_F16 || dtype == TSR_DTYPE_BF16)
        for (int64_t i = 0; i < n_elems; i++) {
            uint16_t h = dtype == TSR_DTYPE_F16 ? tsr_f32_to_f16(rndf()) : tsr_f32_to_bf16(rndf());
            memcpy(w + 2 * i, &h, 2);
        }
    else if (dtype == TSR_DTYPE_F8_E4M3) {
        for (int64_t i = 0; i < n_elems; i++)
            if ((w[i] & 0x7f) == 0x7f) w[i] ^= 1; /* no NaN code */
    } else if (tsr_dtype_block_elems(dtype) > 1) {
        int bb = tsr_dtype_block_bytes(dtype);
        uint16_t h = tsr_f32_to_f16(0.01f);
        for (uint64_t b = 0; b < n_bytes / (uint64_t)bb; b++) {
            memcpy(w + b * (uint64_t)bb + (dtype == TSR_DTYPE_Q6_K ? 208 : 0), &h, 2);
            if (dtype == TSR_DTYPE_Q4_K) memcpy(w + b * (uint64_t)bb + 2, &h, 2);
        }
    }
}

typedef struct job {
    tsr_gemv_kernel_fn k;
    tsr_gemv_i8_kernel_fn k8;
    tsr_gemv_i8_kernel_fn kq8;
    const int16_t *xq;
    const float *xs;
    uint32_t dtype;
    tsr_gemv_args a;
    int64_t panel;      /* --panel: columns a panel (0: rows whole) */
    int64_t rows;
    float *tmp[64];     /* per thread: a panel's sums before they are added */
    const uint8_t *buf; /* read loop */
    uint64_t nbytes;
    double sink[64];
} job;

#define DT_I8X16 100 /* pseudo dtype: int8 weights x int16 activations */
#define DT_Q8X16 101 /* pseudo dtype: Q8_0 weights as stored x int16 activations */

static void run_kernel(void *arg, int64_t r0, int64_t r1, int tid);

/* --panel: the matrix stored as column panels [p][rows][panel cols] (the
 * last panel the rest), each panel's sums added into y. */
static void run_panels(job *j, int64_t r0, int64_t r1, int tid) {
    job pj = *j;
    pj.panel = 0;
    const uint32_t dt = j->dtype == DT_I8X16 ? TSR_DTYPE_I8 : j->dtype == DT_Q8X16 ? TSR_DTYPE_Q8_0 : j->dtype;
    const uint8_t *w = j->a.w;
    for (int64_t c0 = 0; c0 < j->a.cols; c0 += j->panel) {
        const int64_t pc = c0 + j->panel <= j->a.cols ? j->panel : j->a.cols - c0;
        uint64_t rb;
        tsr_dtype_row_bytes(dt, pc, &rb);
        pj.a.w = w, pj.a.row_bytes = rb, pj.a.cols = pc, pj.a.x = j->a.x + c0;
        pj.xq = j->xq + c0;
        pj.a.y = c0 ? j->tmp[tid] : j->a.y;
        run_kernel(&pj, r0, r1, tid);
        if (c0)
            for (int i = 0; i < j->a.nx; i++)
                for (int64_t r = r0; r < r1; r++) j->a.y[i * j->a.ldy + r] += pj.a.y[i * j->a.ldy + r];
        w += rb * (uint64_t)j->rows;
    }
}

static void run_kernel(void *arg, int64_t r0, int64_t r1, int tid) {
    job *j = arg;
    if (j->panel) {
        run_panels(j, r0, r1, tid);
        return;
    }
    if (j->dtype == DT_I8X16 || j->dtype == DT_Q8X16) {
        tsr_gemv_i8_args ia = {.w = (const int8_t *)j->a.w, .wscale = j->a.scale, .cols = j->a.cols, .xq = j->xq,
                               .xscale = j->xs, .nx = j->a.nx, .y = j->a.y, .ldy = j->a.ldy};
        (j->dtype == DT_I8X16 ? j->k8 : j->kq8)(&ia, r0, r1);
    } else {
        j->k(j->dtype, &j->a, r0, r1);
    }
}

/* The ceiling: sum every 8-byte word of the buffer, 32 bytes a load. */
__attribute__((target("avx2"))) static void read_loop(void *arg, int64_t i0, int64_t i1, int tid) {
    job *j = arg;
    typedef long long v4 __attribute__((vector_size(32)));
    const v4 *p = (const v4 *)(const void *)j->buf;
    v4 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    int64_t i = i0 * 4;
    for (; i + 4 <= i1 * 4; i += 4) {
        s0 += p[i], s1 += p[i + 1], s2 += p[i + 2], s3 += p[i + 3];
    }
    v4 s = s0 + s1 + s2 + s3;
    j->sink[tid & 63] += (double)(s[0] + s[1] + s[2] + s[3]);
}

static double median_time(tsr_threadpool *tp, job *j, uint8_t **copies, int ncopies, int64_t items,
                          tsr_work_fn fn, double seconds) {
    double t[4096];
    int n = 0;
    double t_end = now() + seconds;
    for (int c = 0; c < ncopies; c++) { /* warm-up pass over every copy */
        j->a.w = copies[c], j->buf = copies[c];
        tsr_threadpool_run(tp, items, fn, j);
    }
    while (n < 4096 && (n < 5 || now() < t_end)) {
        int c = n % ncopies;
        j->a.w = copies[c], j->buf = copies[c];
        double t0 = now();
        tsr_threadpool_run(tp, items, fn, j);
        t[n++] = now() - t0;
    }
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return t[n / 2];
}

/* Widened tiles + sgemm, tile rows per call, over the pool. */
typedef struct pjob {
    const tsr_gemv_args *a;
    uint32_t dtype;
    int64_t rows, tile;
    float **scratch;
    float *xs; /* the blocked GEMM's packed activations, packed in every timed call */
} pjob;

static tsr_gemv_isa g_isa;

/* The blocked GEMM over NR-wide panels (scratch: tsr_gemm_scratch_floats a thread). */
static void run_gemm(void *arg, int64_t p0, int64_t p1, int tid) {
    pjob *p = arg;
    tsr_gemm_panels(g_isa, p->dtype, p->a, p->xs, p->rows, p0, p1, p->scratch[tid]);
}

static void pack_x(void *arg, int64_t s0, int64_t s1, int tid) {
    (void)tid;
    pjob *p = arg;
    tsr_gemm_pack_x(p->a, s0, s1, p->xs);
}

/* One call: for the blocked GEMM, its activations packed first (as cpu_gemv does). */
static void pjob_call(tsr_threadpool *tp, pjob *p, int64_t items, tsr_work_fn fn) {
    if (p->xs) tsr_threadpool_run(tp, tsr_gemm_slice_count(p->a->cols), pack_x, p);
    tsr_threadpool_run(tp, items, fn, p);
}

static double median_pjob(tsr_threadpool *tp, pjob *p, int64_t items, tsr_work_fn fn, double seconds) {
    double tb[64];
    int n = 0;
    pjob_call(tp, p, items, fn);
    double t_end = now() + seconds;
    while (n < 64 && (n < 3 || now() < t_end)) {
        double t0 = now();
        pjob_call(tp, p, items, fn);
        tb[n++] = now() - t0;
    }
    qsort(tb, (size_t)n, sizeof *tb, cmp_d);
    return tb[n / 2];
}

static void run_blas(void *arg, int64_t t0, int64_t t1, int tid) {
    pjob *p = arg;
    for (int64_t t = t0; t < t1; t++) {
        int64_t r0 = t * p->tile, r1 = r0 + p->tile < p->rows ? r0 + p->tile : p->rows;
        tsr_gemv_widen_rows(p->dtype, p->a, r0, r1, p->scratch[tid]);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, p->a->nx, (int)(r1 - r0), (int)p->a->cols, 1.0f,
                    p->a->x, (int)p->a->cols, p->scratch[tid], (int)p->a->cols, 0.0f, p->a->y + r0,
                    (int)p->a->ldy);
    }
}

int main(int argc, char **argv) {
    int threads = 2, prefill = 0, only = -1, resident = 0, table = 1; /* table: the gemv table (not with --gemm) */
    int64_t prows = 4864, pcols = 896, panel = 0;
    double seconds = 0.4;
    tsr_gemv_isa isa = tsr_gemv_isa_best();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--prefill")) prefill = 1;
        else if (!strcmp(argv[i], "--gemm") && i + 2 < argc) {
            prefill = 1, table = 0, prows = atoll(argv[i + 1]), pcols = atoll(argv[i + 2]), i += 2;
            if (prows < 1 || pcols < 1 || pcols % 32) {
                fprintf(stderr, "bench_gemv: --gemm ROWS COLS: COLS a multiple of 32 (whole Q8_0 blocks)\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--resident")) resident = 1;
        else if (!strcmp(argv[i], "--panel") && i + 1 < argc) panel = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) only = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-i") && i + 1 < argc) {
            i++;
            isa = !strcmp(argv[i], "portable") ? TSR_GEMV_ISA_PORTABLE
                  : !strcmp(argv[i], "avx512")  ? TSR_GEMV_ISA_AVX512
                                                : TSR_GEMV_ISA_AVX2;
        } else {
            fprintf(stderr, "usage: %s [-t THREADS] [-i portable|avx2|avx512] [-s SECONDS] [--shape 0|1|2] [--panel COLS] [--resident] [--prefill | --gemm ROWS COLS]\n", argv[0]);
            return 2;
        }
    }
    if (threads < 1 || threads > 256 || !tsr_gemv_isa_runs(isa)) {
        fprintf(stderr, "bench_gemv: bad thread count or ISA %s not runnable here\n", tsr_gemv_isa_name(isa));
        return 2;
    }
    if (openblas_set_num_threads) openblas_set_num_threads(1);
    g_isa = isa;
    tsr_threadpool *tp = tsr_threadpool_new(threads);
    if (!tp) return 1;
    printf("bench_gemv: %d threads, isa %s, median of passes over %s\n", threads, tsr_gemv_isa_name(isa),
           resident ? "one matrix of ~384 KiB held in L2" : ">= 256 MiB of copies");
    const int64_t shapes[3][2] = {{4864, 896}, {151936, 896}, {896, 4864}};
    const uint32_t dtypes[] = {TSR_DTYPE_F32, TSR_DTYPE_F16, TSR_DTYPE_BF16, TSR_DTYPE_F8_E4M3, TSR_DTYPE_I8, DT_I8X16,
                               TSR_DTYPE_Q8_0, DT_Q8X16, TSR_DTYPE_Q4_0, TSR_DTYPE_Q4_K, TSR_DTYPE_Q6_K};
    const int nxs[] = {1, 2, 4, 8};
    if (table)
        printf("%-7s %-14s %9s %9s | %8s %8s %8s %8s | %8s %8s %8s %8s\n", "dtype", "shape", "MiB", "ceilGB/s",
               "GB/s@1", "GB/s@2", "GB/s@4", "GB/s@8", "%ceil@1", "%ceil@2", "%ceil@4", "%ceil@8");
    for (int s = 0; s < 3 && table; s++)
        for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++) {
            uint32_t dt = dtypes[d] == DT_I8X16 ? TSR_DTYPE_I8 : dtypes[d] == DT_Q8X16 ? TSR_DTYPE_Q8_0 : dtypes[d];
            if (only >= 0 && s != only) continue;
            int64_t rows = shapes[s][0], cols = shapes[s][1];
            uint64_t rb;
            if (tsr_dtype_row_bytes(dt, cols, &rb)) continue;
            if (resident) rows = (int64_t)((384u << 10) / rb);
            uint64_t bytes = rb * (uint64_t)rows;
            bytes = (bytes + 127) / 128 * 128; /* whole 128-byte read-loop steps */
            int ncopies = resident ? 1 : (int)((256ull << 20) / bytes) + 1;
            if (ncopies > 64) ncopies = 64;
            uint8_t *copies[64];
            for (int c = 0; c < ncopies; c++) {
                const size_t hb = (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
                copies[c] = aligned_alloc(2u << 20, hb); /* in 2 MiB pages, as the plugins hold weights */
                if (!copies[c]) return 1;
                madvise(copies[c], hb, MADV_HUGEPAGE);
                fill(dt, copies[c], bytes, rows * cols);
            }
            float *scale = malloc((size_t)rows * sizeof *scale);
            float *x = malloc((size_t)(8 * cols) * sizeof *x), *y = malloc((size_t)(8 * rows) * sizeof *y);
            for (int64_t i = 0; i < rows; i++) scale[i] = 0.01f;
            for (int64_t i = 0; i < 8 * cols; i++) x[i] = rndf();
            int16_t *xq = malloc((size_t)(8 * cols) * sizeof *xq);
            float xs[8];
            for (int i = 0; i < 8; i++) xs[i] = tsr_gemv_quant_x_i16(x + i * cols, cols, xq + i * cols);
            job j = {.k = tsr_gemv_kernel(isa), .k8 = tsr_gemv_i8_kernel(isa), .kq8 = tsr_gemv_q8_0_i16_kernel(isa),
                     .xq = xq, .xs = xs,
                     .dtype = dtypes[d], .nbytes = bytes};
            j.a = (tsr_gemv_args){copies[0], rb, scale, cols, x, cols, 1, y, rows, NULL, NULL, 0};
            int64_t bk = tsr_dtype_block_elems(dt) > 32 ? tsr_dtype_block_elems(dt) : 32;
            j.panel = panel > 0 && panel < cols ? (panel + bk - 1) / bk * bk : 0, j.rows = rows;
            for (int t = 0; t < threads && j.panel; t++) j.tmp[t] = malloc((size_t)(8 * rows) * sizeof(float));
            double tc = median_time(tp, &j, copies, ncopies, (int64_t)(bytes / 128), read_loop, seconds);
            double ceil_gbs = (double)bytes / tc * 1e-9;
            double gbs[4];
            for (int k = 0; k < 4; k++) {
                j.a.nx = nxs[k];
                if (j.panel && nxs[k] > 1) { /* the int16 kernels have no activation row stride: one row only */
                    gbs[k] = 0;
                    continue;
                }
                gbs[k] = (double)(rb * (uint64_t)rows) / median_time(tp, &j, copies, ncopies, rows, run_kernel, seconds) * 1e-9;
            }
            char shape[32];
            snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)cols);
            printf("%-7s %-14s %9.1f %9.2f | %8.2f %8.2f %8.2f %8.2f | %7.0f%% %7.0f%% %7.0f%% %7.0f%%\n",
                   dtypes[d] == DT_I8X16 ? "i8x16" : dtypes[d] == DT_Q8X16 ? "q8x16" : tsr_dtype_name(dt), shape, (double)bytes / 1048576.0, ceil_gbs, gbs[0], gbs[1], gbs[2], gbs[3],
                   100 * gbs[0] / ceil_gbs, 100 * gbs[1] / ceil_gbs, 100 * gbs[2] / ceil_gbs, 100 * gbs[3] / ceil_gbs);
            fflush(stdout);
            for (int c = 0; c < ncopies; c++) free(copies[c]);
            free(scale), free(x), free(y), free(xq);
            for (int t = 0; t < threads && j.panel; t++) free(j.tmp[t]);
        }
    if (prefill) {
        const uint32_t pdt[] = {TSR_DTYPE_F16, TSR_DTYPE_BF16, TSR_DTYPE_Q8_0};
        const int prow[] = {2, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256};
        int64_t rows = prows, cols = pcols;
        printf("\nprefill [%lld x %lld]: ms per call (GFLOP/s), kernels vs blocked GEMM vs widened 64-row tiles + sgemm\n",
               (long long)rows, (long long)cols);
        printf("%-7s %6s %18s %18s %18s %8s\n", "dtype", "rows", "kernel_ms", "gemm_ms", "sgemm_ms", "winner");
        for (size_t d = 0; d < 3; d++) {
            uint64_t rb;
            tsr_dtype_row_bytes(pdt[d], cols, &rb);
            uint8_t *w = aligned_alloc(64, rb * (uint64_t)rows);
            fill(pdt[d], w, rb * (uint64_t)rows, rows * cols);
            float *x = malloc((size_t)(256 * cols) * sizeof *x), *y = malloc((size_t)(256 * rows) * sizeof *y);
            float *xs = aligned_alloc(64, (size_t)tsr_gemm_xpack_floats(256, cols) * sizeof *xs);
            for (int64_t i = 0; i < 256 * cols; i++) x[i] = rndf();
            float *scr[256], *pan[256];
            for (int t = 0; t < threads; t++) {
                scr[t] = aligned_alloc(64, (size_t)(64 * cols) * sizeof(float));
                pan[t] = aligned_alloc(64, (size_t)tsr_gemm_scratch_floats(256) * sizeof(float));
            }
            for (size_t k = 0; k < sizeof prow / sizeof *prow; k++) {
                job j = {.k = tsr_gemv_kernel(isa), .dtype = pdt[d]};
                j.a = (tsr_gemv_args){w, rb, NULL, cols, x, cols, prow[k], y, rows, NULL, NULL, 0};
                uint8_t *cp[1] = {w};
                double tk = median_time(tp, &j, cp, 1, rows, run_kernel, seconds / 2);
                pjob pg = {&j.a, pdt[d], rows, 64, pan, xs};
                double tg = median_pjob(tp, &pg, tsr_gemm_panel_count(rows), run_gemm, seconds / 2);
                pjob pb = {&j.a, pdt[d], rows, 64, scr, NULL};
                double tb = median_pjob(tp, &pb, (rows + 63) / 64, run_blas, seconds / 2);
                double fl = 2.0 * (double)rows * (double)cols * prow[k] * 1e-9;
                printf("%-7s %6d %9.3f (%6.1f) %9.3f (%6.1f) %9.3f (%6.1f) %8s\n", tsr_dtype_name(pdt[d]), prow[k],
                       tk * 1e3, fl / tk, tg * 1e3, fl / tg, tb * 1e3, fl / tb,
                       tk < tg && tk < tb ? "kernel" : tg < tb ? "gemm" : "sgemm");
                fflush(stdout);
            }
            for (int t = 0; t < threads; t++) free(scr[t]), free(pan[t]);
            free(w), free(x), free(y), free(xs);
        }
    }
    tsr_threadpool_free(tp);
    return 0;
}
