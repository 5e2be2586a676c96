/*
 * seq_lab.c - a decode pass's GEMVs alone: the Qwen2.5-0.5B shape's 24 layers
 * of q/k/v (1,152 x 896), o (896 x 896), gate/up (9,728 x 896) and down (896
 * x 4,864), then the output head (151,936 x 896), each matrix its own 2 MiB
 * pages, one after another on two threads of the pool (static halves), with
 * the production kernel (tsr_gemv_kernel, the best ISA) -- against the same
 * calls on one matrix of each shape cycled through copies (as bench_gemv and
 * q8_lab measure). The question (BENCHMARKS.md, twenty-second session): do
 * the engine's GEMV calls read slower on two threads than a lab's because
 * they run in a pass's order over distinct matrices?
 *   gcc -O2 -mavx2 -mfma -I. -o /tmp/seq_lab tools/cpu_lab/seq_lab.c build/kernels/libtsr_kernels.a \
 *       build/core/util/libtsr_util.a -lpthread -lm
 *   [BF16=1 for bf16 | REAL=1 for Q8_0] [XOFF=floats] [SUB=rows] /tmp/seq_lab [bf16|q8_0|int8] [THREADS]
 *       [0 static halves | 1 guided takes | 2 and gate/up as run_glu]
 * (The default fill is a byte pattern: Q8_0 blocks of small codes; as bf16 it
 * holds subnormals, which are slow: use BF16=1. int8: int8 rows x int16
 * activations, cpu_gemv_int8's decode. SUB: run_glu-style takes alternate
 * gate and up every SUB rows instead of the whole take of each.)
 * Prints, per shape, the median us a call and GB/s in the pass order and cycled.
 */
#include "tools/cpu_lab/lab.h"
#include "core/util/threadpool.h"
#include "kernels/cpu/gemv_cpu.h"
#include "kernels/dtype.h"

enum { QKV, O, GU, DOWN, HEAD, SHAPES, LAYERS = 24 };
static const int64_t shape[SHAPES][2] = {{1152, 896}, {896, 896}, {9728, 896}, {896, 4864}, {151936, 896}};
static const char *const name[SHAPES] = {"q/k/v", "o", "gate/up", "down", "head"};

typedef struct {
    uint32_t dtype;
    tsr_gemv_args a;
    int64_t rows;
    int threads;
    tsr_gemv_kernel_fn k;
    int guided;          /* takes as gemv_engine.c's take_items (else static halves) */
    int glu;             /* gate/up as run_glu takes them: gate rows [a, b), then up rows f + [a, b) */
    tsr_gemv_i8_kernel_fn i8; /* int8 rows x int16 activations (cpu_gemv_int8's decode), else NULL */
    tsr_gemv_i8_args ia;
    atomic_llong next;
} job;

static void run(void *arg, int64_t i0, int64_t i1, int tid) {
    (void)i0, (void)i1;
    job *j = arg;
    if (!j->guided) {
        const int64_t h = (j->rows / j->threads + 7) / 8 * 8, r0 = tid * h, r1 = r0 + h < j->rows ? r0 + h : j->rows;
        if (r0 < r1 && j->i8) j->i8(&j->ia, r0, r1);
        else if (r0 < r1) j->k(j->dtype, &j->a, r0, r1);
        return;
    }
    static long least_bytes = -1;
    if (least_bytes < 0) least_bytes = getenv("LEAST") ? atol(getenv("LEAST")) : 65536;
    const int64_t least0 = (int64_t)((least_bytes + j->a.row_bytes - 1) / j->a.row_bytes), f = j->rows / 2;
    int64_t a, b;
    if (!j->glu) {
        while (lab_take(&j->next, j->rows, j->threads, least0 < 1 ? 1 : least0, j->rows, &a, &b))
            if (j->i8) j->i8(&j->ia, a, b);
            else j->k(j->dtype, &j->a, a, b);
        return;
    }
    static __thread float buf[2 * 1024];
    while (lab_take(&j->next, f, j->threads, least0 > 1024 ? 1024 : least0, 1024, &a, &b)) {
        tsr_gemv_args g = j->a;
        tsr_gemv_i8_args ia = j->ia;
        const int64_t n = b - a;
        static long sub = -1;
        if (sub < 0) sub = getenv("SUB") ? atol(getenv("SUB")) : 1 << 30;
        for (int64_t c = 0; c < n; c += sub) { /* SUB rows of gate, then theirs of up */
            const int64_t m = n - c < sub ? n - c : sub;
            for (int h = 0; h < 2; h++) {
                const int64_t r = (h ? f + a : a) + c;
                g.y = ia.y = buf + h * n + c, g.ldy = ia.ldy = 2 * n;
                g.w = j->a.w + (uint64_t)r * g.row_bytes;
                ia.w = j->ia.w + r * j->ia.cols, ia.wscale = j->ia.wscale + r;
                if (j->i8) j->i8(&ia, 0, m);
                else j->k(j->dtype, &g, 0, m);
            }
        }
        for (int64_t i = 0; i < n; i++) j->a.y[a + i] = buf[i] / (1.0f + __builtin_expf(-buf[i])) * buf[n + i];
    }
}

static uint8_t *pages(size_t bytes) {
    const size_t huge = 2 << 20, n = (bytes + huge - 1) / huge * huge;
    uint8_t *p = aligned_alloc(huge, n);
    if (!p) exit(1);
    madvise(p, n, MADV_HUGEPAGE);
    if (getenv("BF16")) { /* bf16 values of magnitude 2^-7..2^-4, either sign (no subnormals) */
        uint64_t r = 88172645463325252ull;
        for (size_t i = 0; i < n; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            p[i] = i & 1 ? (uint8_t)(0x3c | (r & 0x83)) : (uint8_t)r;
        }
        return p;
    }
    if (getenv("REAL")) { /* Q8_0 blocks as a quantised random matrix holds them: d ~ 6e-4, codes over +-127 */
        uint64_t r = 88172645463325252ull;
        for (size_t i = 0; i < n; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            p[i] = (uint8_t)r;
        }
        for (size_t b = 0; b + 34 <= n; b += 34) {
            const uint16_t d = 0x1100 + (uint16_t)(p[b] & 0xff);
            memcpy(p + b, &d, 2);
        }
        return p;
    }
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 2654435761u >> 13) & 0x3b; /* finite codes, small scales */
    return p;
}

int main(int argc, char **argv) {
    const int int8 = argc > 1 && !strcmp(argv[1], "int8");
    const uint32_t dtype = argc > 1 && !strcmp(argv[1], "bf16") ? TSR_DTYPE_BF16 : int8 ? TSR_DTYPE_I8 : TSR_DTYPE_Q8_0;
    const int threads = argc > 2 ? atoi(argv[2]) : 2;
    const int guided = argc > 3 ? atoi(argv[3]) : 0; /* 1: guided takes; 2: and gate/up as run_glu */
    uint64_t rb[SHAPES];
    for (int s = 0; s < SHAPES; s++) tsr_dtype_row_bytes(dtype, shape[s][1], &rb[s]);
    uint8_t *w[LAYERS + 1][SHAPES] = {{0}};
    for (int l = 0; l < LAYERS; l++)
        for (int s = 0; s < HEAD; s++) w[l][s] = pages(shape[s][0] * rb[s]);
    w[LAYERS][HEAD] = pages(shape[HEAD][0] * rb[HEAD]);
    float *x = aligned_alloc(64, 4864 * 4 + 64), *y = aligned_alloc(64, 151936 * 4);
    float *ws = aligned_alloc(64, 151936 * 4);
    int16_t *xq = aligned_alloc(64, 4864 * 2);
    for (int i = 0; i < 151936; i++) ws[i] = 1e-3f;
    if (getenv("XOFF")) x += atoi(getenv("XOFF")); /* activations off a 64-byte boundary by XOFF floats */
    for (int i = 0; i < 4864; i++) x[i] = (float)(i % 13) * 0.01f;
    tsr_threadpool *tp = tsr_threadpool_new(threads);
    const tsr_gemv_kernel_fn k = tsr_gemv_kernel(tsr_gemv_isa_best());
    const tsr_gemv_i8_kernel_fn i8k = tsr_gemv_i8_kernel(tsr_gemv_isa_best());
    const float xs = tsr_gemv_quant_x_i16(x, 4864, xq);
    enum { PASSES = 60 };
    static double t[2][SHAPES][PASSES * LAYERS];
    int cnt[2][SHAPES] = {{0}};
    for (int p = 0; p < PASSES; p++)
        for (int mode = 0; mode < 2; mode++) /* 0: the pass's order; 1: each shape cycled over its copies */
            for (int s0 = 0; s0 < (mode ? SHAPES : 1); s0++)
                for (int l = 0; l <= LAYERS; l++)
                    for (int s = mode ? s0 : 0; s < (mode ? s0 + 1 : SHAPES); s++) {
                        if ((l == LAYERS) != (s == HEAD)) continue;
                        const uint8_t *m = s == HEAD ? w[LAYERS][HEAD] : w[l][s];
                        if (mode && s == HEAD && l != LAYERS) continue;
                        job j = {dtype,
                                 {.w = m, .row_bytes = rb[s], .cols = shape[s][1], .x = x, .ldx = shape[s][1],
                                  .nx = 1, .y = y, .ldy = shape[s][0]},
                                 shape[s][0], threads, k, guided > 0, guided > 1 && s == GU, int8 ? i8k : NULL,
                                 {(const int8_t *)m, ws, shape[s][1], xq, &xs, 1, y, shape[s][0]}, 0};
                        const double a = now();
                        tsr_threadpool_run(tp, threads, run, &j);
                        t[mode][s][cnt[mode][s]++] = now() - a;
                    }
    printf("%s, %d thread(s), %s, medians of %d passes\n", tsr_dtype_name(dtype), threads,
           guided > 1 ? "guided takes, gate/up as run_glu" : guided ? "guided takes" : "static halves", PASSES);
    for (int s = 0; s < SHAPES; s++) {
        const double mb = shape[s][0] * rb[s] / 1e9;
        double m[2];
        for (int mode = 0; mode < 2; mode++) {
            qsort(t[mode][s], cnt[mode][s], 8, lab_cmp_double);
            m[mode] = t[mode][s][cnt[mode][s] / 2];
        }
        printf("  %-8s pass order %7.1f us (%.1f GB/s)   cycled %7.1f us (%.1f GB/s)\n", name[s], m[0] * 1e6,
               mb / m[0], m[1] * 1e6, mb / m[1]);
    }
    return 0;
}
