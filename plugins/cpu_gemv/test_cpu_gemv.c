/*
 * Tests of cpu_gemv against an independent reference: each stored row
 * widened with the kernels' dequantiser and dotted in double precision.
 * A table of cases (dtypes, shapes with and without SIMD tails, 1..9, 13 and
 * 70 input rows, both ISAs, the kernels, the blocked GEMM and sgemm), guard
 * words around the output, NaN parity, errors naming the tensor, and
 * allocation failure at every step.
 * Tolerance: 4 * sqrt(cols) * FLT_EPSILON * sum |w x| per output.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cpu/gemv_cpu.h"
#include "kernels/dtype.h"
#include "test_host.h"

#define SEED 20261129u
#define GUARD 16
static const uint32_t guard_bits = 0x7fc0deadu;

static uint64_t rng;
static uint32_t rnd32(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 32);
}
static float rndf(float lo, float hi) { return lo + (hi - lo) * (float)(rnd32() >> 8) * 0x1p-24f; }

/* Random stored weights of a dtype: plain types from uniform floats, block
 * types from random bytes with small finite f16 scales. */
static uint8_t *make_weights(uint32_t dtype, int64_t rows, int64_t cols, uint64_t *row_bytes) {
    assert_int_equal(tsr_dtype_row_bytes(dtype, cols, row_bytes), 0);
    size_t n = (size_t)(*row_bytes * (uint64_t)rows);
    uint8_t *w = malloc(n + 1);
    assert_non_null(w);
    for (size_t i = 0; i < n; i++) w[i] = (uint8_t)rnd32();
    int64_t count = rows * cols;
    uint16_t h;
    switch (dtype) {
    case TSR_DTYPE_F32:
        for (int64_t i = 0; i < count; i++) {
            float f = rndf(-1, 1);
            memcpy(w + 4 * i, &f, 4);
        }
        break;
    case TSR_DTYPE_F16:
    case TSR_DTYPE_BF16:
        for (int64_t i = 0; i < count; i++) {
            float f = rndf(-1, 1);
            h = dtype == TSR_DTYPE_F16 ? tsr_f32_to_f16(f) : tsr_f32_to_bf16(f);
            memcpy(w + 2 * i, &h, 2);
        }
        break;
    case TSR_DTYPE_F8_E4M3:
        for (int64_t i = 0; i < count; i++)
            if ((w[i] & 0x7f) == 0x7f) w[i] ^= 1; /* no NaN */
        break;
    case TSR_DTYPE_I8:
        for (int64_t i = 0; i < count; i++)
            if (w[i] == 0x80) w[i] = 0x81;
        break;
    default: {
        int bb = tsr_dtype_block_bytes(dtype);
        for (size_t b = 0; b < n / (size_t)bb; b++) {
            uint8_t *blk = w + b * (size_t)bb;
            h = tsr_f32_to_f16(rndf(0.001f, 0.05f));
            if (dtype == TSR_DTYPE_Q6_K) {
                memcpy(blk + 208, &h, 2);
            } else {
                memcpy(blk, &h, 2);
                if (dtype == TSR_DTYPE_Q4_K) {
                    h = tsr_f32_to_f16(rndf(0.001f, 0.05f));
                    memcpy(blk + 2, &h, 2);
                }
            }
        }
    }
    }
    return w;
}

/* y_ref[i, r] in double and the bound on each. */
static void reference(uint32_t dtype, const uint8_t *w, uint64_t row_bytes, int64_t rows, int64_t cols,
                      const float *x, int nx, double *yref, double *tol) {
    float *row = malloc((size_t)cols * sizeof *row);
    assert_non_null(row);
    for (int64_t r = 0; r < rows; r++) {
        tsr_dequant_row(dtype, w + (uint64_t)r * row_bytes, row, cols);
        for (int i = 0; i < nx; i++) {
            double s = 0, a = 0;
            for (int64_t c = 0; c < cols; c++) {
                double p = (double)row[c] * (double)x[i * cols + c];
                s += p;
                a += fabs(p);
            }
            yref[i * rows + r] = s;
            tol[i * rows + r] = 4.0 * sqrt((double)cols) * FLT_EPSILON * a + 1e-30;
        }
    }
    free(row);
}

extern const tsr_plugin_desc *tsr_plugin_entry(void);

typedef struct inst_box {
    const tsr_plugin_desc *d;
    const tsr_gemv_i *g;
    void *inst;
} inst_box;

static int open_inst_on(inst_box *b, const tsr_plugin_ctx *ctx) {
    b->d = tsr_plugin_entry();
    b->g = b->d->iface;
    b->inst = calloc(1, b->d->instance_size);
    assert_non_null(b->inst);
    th_err[0] = 0;
    return b->d->init(b->inst, ctx);
}
static int open_inst(inst_box *b) { return open_inst_on(b, &th_ctx); }

static void close_inst(inst_box *b) {
    if (b->d->fini) b->d->fini(b->inst);
    free(b->inst);
}

static int setup(void **state) {
    (void)state;
    th_pool = tsr_threadpool_new(2);
    return th_pool ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    tsr_threadpool_free(th_pool);
    return 0;
}

typedef struct gcase {
    uint32_t dtype;
    int64_t rows, cols;
} gcase;

static const gcase cases[] = {
    {TSR_DTYPE_F32, 37, 33},   {TSR_DTYPE_F32, 64, 256},  {TSR_DTYPE_F16, 37, 40},
    {TSR_DTYPE_F16, 19, 896},  {TSR_DTYPE_BF16, 37, 33},  {TSR_DTYPE_BF16, 23, 512},
    {TSR_DTYPE_I8, 37, 31},    {TSR_DTYPE_I8, 21, 200},   {TSR_DTYPE_F8_E4M3, 13, 64},
    {TSR_DTYPE_F8_E4M3, 37, 1003}, {TSR_DTYPE_F8_E4M3, 150, 700},
    {TSR_DTYPE_Q8_0, 37, 96},  {TSR_DTYPE_BF16, 5, 4104},
    {TSR_DTYPE_Q8_0, 20, 896}, {TSR_DTYPE_Q4_0, 9, 64},   {TSR_DTYPE_Q4_K, 37, 256},
    {TSR_DTYPE_Q4_K, 11, 768}, {TSR_DTYPE_Q6_K, 7, 512},
    /* short rows, taken four weight rows at a time: row and column tails */
    {TSR_DTYPE_F32, 7, 172},   {TSR_DTYPE_F16, 6, 500},   {TSR_DTYPE_F32, 8, 512},
    /* several GEMM panels (16 rows) and column slices (256), both with tails */
    {TSR_DTYPE_BF16, 150, 700}, {TSR_DTYPE_F16, 67, 520}, {TSR_DTYPE_F32, 33, 300},
    {TSR_DTYPE_I8, 45, 300},    {TSR_DTYPE_Q8_0, 40, 544}, {TSR_DTYPE_Q4_K, 18, 512},
    /* takes (a quarter of the rows at first) longer than the AVX2 kernels' runs of 1,024 output rows */
    {TSR_DTYPE_BF16, 8200, 64}, {TSR_DTYPE_Q8_0, 4400, 64}, {TSR_DTYPE_F32, 4200, 40},
};
/* 8 and 9 rows: GEMM row tiles of 4 + 4 and 5 + 4; 13: 6 + 4 + 3; 70: 11 x 6 + 4. */
static const int nxs[] = {1, 2, 3, 4, 5, 8, 9, 13, 23, 70};

/* The three paths of run(): the kernels, the blocked GEMM, sgemm. */
static const char *const prefills[] = {"kernels", "gemm", "blas"};

/* Runs one case; returns the worst error / tolerance ratio. mode indexes
 * prefills: 0 keeps every row count on the kernels, 1 and 2 send 4 rows and
 * more to the GEMM or to sgemm. */
static double run_case(const gcase *gc, int nx, const char *isa, int mode) {
    int blas_min = mode ? 4 : 0;
    th_n_params = 0;
    th_set_str("isa", isa);
    th_set_str("prefill", mode == 2 ? "blas" : "gemm");
    th_set_int("blas_min_rows", blas_min);
    th_set_int("blas_min_rows_quant", blas_min);
    th_set_int("blas_tile_rows", 16);
    inst_box b;
    assert_int_equal(open_inst(&b), TSR_OK);
    uint64_t rb;
    uint8_t *w = make_weights(gc->dtype, gc->rows, gc->cols, &rb);
    float *x = malloc((size_t)(nx * gc->cols) * sizeof *x);
    assert_non_null(x);
    for (int64_t i = 0; i < nx * gc->cols; i++) x[i] = rndf(-1, 1);
    size_t ny = (size_t)(nx * gc->rows);
    float *ybuf = malloc((ny + 2 * GUARD) * sizeof *ybuf);
    double *yref = malloc(ny * sizeof *yref), *tol = malloc(ny * sizeof *tol);
    assert_true(ybuf && yref && tol);
    for (size_t i = 0; i < ny + 2 * GUARD; i++) memcpy(ybuf + i, &guard_bits, 4);
    float *y = ybuf + GUARD;

    tsr_weight tw = {"test.weight", gc->dtype, gc->rows, gc->cols, w, rb * (uint64_t)gc->rows, NULL, TSR_WEIGHT_DENSE};
    void *prep = NULL;
    assert_int_equal(b.g->prepare(b.inst, &tw, &prep), TSR_OK);
    assert_int_equal(b.g->bytes(b.inst, prep), rb * (uint64_t)gc->rows);
    tsr_exec ex = {.device = TSR_DEVICE_CPU, .n_threads = 2};
    assert_int_equal(b.g->run(b.inst, prep, nx, x, y, &ex), TSR_OK);
    reference(gc->dtype, w, rb, gc->rows, gc->cols, x, nx, yref, tol);
    /* five shares of the rows over the pool's two workers: three have no
     * owner and are taken from the back by whichever worker is idle (the
     * path of a worker slowed by its neighbour): the same sums bit for bit */
    float *y5 = malloc(ny * sizeof *y5);
    assert_non_null(y5);
    tsr_exec ex5 = {.device = TSR_DEVICE_CPU, .n_threads = 5};
    assert_int_equal(b.g->run(b.inst, prep, nx, x, y5, &ex5), TSR_OK);
    if (memcmp(y5, y, ny * sizeof *y5) != 0)
        fail_msg("%s %lldx%lld nx=%d %s %s: rows taken from other workers' shares differ", tsr_dtype_name(gc->dtype),
                 (long long)gc->rows, (long long)gc->cols, nx, isa, prefills[mode]);
    free(y5);

    for (int i = 0; i < GUARD; i++) {
        uint32_t u0, u1;
        memcpy(&u0, ybuf + i, 4);
        memcpy(&u1, ybuf + GUARD + ny + i, 4);
        if (u0 != guard_bits || u1 != guard_bits)
            fail_msg("%s %lldx%lld nx=%d %s %s: guard word %d overwritten", tsr_dtype_name(gc->dtype),
                     (long long)gc->rows, (long long)gc->cols, nx, isa, prefills[mode], i);
    }
    double worst = 0;
    for (size_t k = 0; k < ny; k++) {
        double e = fabs((double)y[k] - yref[k]);
        if (!(e <= tol[k]))
            fail_msg("%s %lldx%lld nx=%d %s %s: y[%zu] = %.9g, reference %.9g (tol %.3g)",
                     tsr_dtype_name(gc->dtype), (long long)gc->rows, (long long)gc->cols, nx, isa, prefills[mode], k,
                     (double)y[k], yref[k], tol[k]);
        if (e / tol[k] > worst) worst = e / tol[k];
    }
    b.g->release(b.inst, prep);
    close_inst(&b);
    assert_int_equal(atomic_load(&th_live), 0);
    free(w), free(x), free(ybuf), free(yref), free(tol);
    return worst;
}

/* Kernel k over one input row's weight rows [0, a.rows) in one call (its
 * decode blocks) and a row at a time (its row-by-row path), into y0 and y1:
 * whether the two agree bit for bit. */
static int blocks_equal_rows(tsr_gemv_kernel_fn k, uint32_t dtype, tsr_gemv_args a, int64_t rows, float *y0,
                             float *y1) {
    a.nx = 1, a.y = y0;
    k(dtype, &a, 0, rows);
    a.y = y1;
    for (int64_t r = 0; r < rows; r++) k(dtype, &a, r, r + 1);
    return memcmp(y0, y1, (size_t)rows * sizeof *y0) == 0;
}

/* The AVX-512 Q8_0 kernel groups up to 8 input rows a pass and shares only
 * the widened codes between them: each row's outputs are those of a call
 * of that row alone, bit for bit, at 1-9 rows (so a verification pass gives
 * the one-row pass's logits for the same context); and one input row, whose
 * weight rows go in blocks of 16 summed across together, equals the same
 * kernel called a row at a time. Skipped without AVX-512BW. */
static void test_q8_0_rows_independent(void **state) {
    (void)state;
    const tsr_gemv_kernel_fn k = tsr_gemv_kernel(TSR_GEMV_ISA_AVX512);
    if (!tsr_gemv_isa_runs(TSR_GEMV_ISA_AVX512) || !k || k != tsr_gemv_rows_avx512) {
        printf("# no AVX-512 (BW) kernels here: skipped\n");
        skip();
    }
    const int64_t rows = 37, cols = 32 * 37;
    uint64_t rb;
    uint8_t *w = make_weights(TSR_DTYPE_Q8_0, rows, cols, &rb);
    float *x = malloc((size_t)(9 * cols) * sizeof *x), *ya = malloc((size_t)(9 * rows) * sizeof *ya),
          *y1 = malloc((size_t)rows * sizeof *y1);
    assert_true(x && ya && y1);
    for (int64_t i = 0; i < 9 * cols; i++) x[i] = rndf(-2, 2);
    for (int nx = 1; nx <= 9; nx++) {
        tsr_gemv_args a = {.w = w, .row_bytes = rb, .cols = cols, .x = x, .ldx = cols, .nx = nx, .y = ya, .ldy = rows};
        k(TSR_DTYPE_Q8_0, &a, 0, rows);
        for (int i = 0; i < nx; i++) {
            tsr_gemv_args one = a;
            one.x = x + (int64_t)i * cols, one.nx = 1, one.y = y1;
            k(TSR_DTYPE_Q8_0, &one, 0, rows);
            if (memcmp(ya + (int64_t)i * rows, y1, (size_t)rows * sizeof *y1) != 0)
                fail_msg("Q8_0 AVX-512: input row %d of %d differs from the same row alone", i, nx);
        }
    }
    /* one input row: weight rows in blocks of 16 (summed across together) against a row at a time */
    const tsr_gemv_args one = {.w = w, .row_bytes = rb, .cols = cols, .x = x, .ldx = cols, .ldy = rows};
    if (!blocks_equal_rows(k, TSR_DTYPE_Q8_0, one, rows, ya, y1))
        fail_msg("Q8_0 AVX-512: one input row's blocks of 16 weight rows differ from its rows one at a time");
    printf("# Q8_0 AVX-512: each of 1-9 input rows equals its own one-row call bit for bit, blocks of 16 rows"
           " a row at a time\n");
    free(w), free(x), free(ya), free(y1);
}

/* bf16 decode (one input row, columns whole 32-element steps) goes in
 * blocks of 8 weight rows summed across together: the AVX2 kernel (which
 * the AVX-512 one uses for one row) equals itself called a row at a time,
 * bit for bit, at 37 rows (four blocks and a rest) and 1,184 columns. */
static void test_bf16_decode_blocks(void **state) {
    (void)state;
    const tsr_gemv_isa isas[] = {TSR_GEMV_ISA_AVX2, TSR_GEMV_ISA_AVX512};
    const int64_t rows = 37, cols = 32 * 37;
    uint64_t rb;
    uint8_t *w = make_weights(TSR_DTYPE_BF16, rows, cols, &rb);
    float *x = malloc((size_t)cols * sizeof *x), *ya = malloc((size_t)rows * sizeof *ya),
          *y1 = malloc((size_t)rows * sizeof *y1);
    assert_true(x && ya && y1);
    for (int64_t i = 0; i < cols; i++) x[i] = rndf(-2, 2);
    int ran = 0;
    for (size_t s = 0; s < sizeof isas / sizeof *isas; s++) {
        const tsr_gemv_kernel_fn k = tsr_gemv_kernel(isas[s]);
        if (!tsr_gemv_isa_runs(isas[s]) || !k) continue;
        const tsr_gemv_args a = {.w = w, .row_bytes = rb, .cols = cols, .x = x, .ldx = cols, .ldy = rows};
        if (!blocks_equal_rows(k, TSR_DTYPE_BF16, a, rows, ya, y1))
            fail_msg("bf16 %s: one input row's blocks of 8 weight rows differ from its rows one at a time",
                     tsr_gemv_isa_name(isas[s]));
        ran++;
    }
    free(w), free(x), free(ya), free(y1);
    if (!ran) {
        printf("# no AVX2 here: skipped\n");
        skip();
    }
    printf("# bf16 decode: blocks of 8 weight rows equal rows one at a time (%d isa)\n", ran);
}

static void test_table(void **state) {
    (void)state;
    rng = SEED;
    printf("seed %u, isa best: %s\n", SEED, tsr_gemv_isa_name(tsr_gemv_isa_best()));
    const char *isas[] = {"portable", "avx2", "avx512"};
    const tsr_gemv_isa ids[] = {TSR_GEMV_ISA_PORTABLE, TSR_GEMV_ISA_AVX2, TSR_GEMV_ISA_AVX512};
    int ran = 0, unsupported = 0;
    for (int s = 0; s < 3; s++) {
        if (!tsr_gemv_isa_runs(ids[s])) {
            printf("isa %s: unsupported on this CPU, %zu cases skipped\n", isas[s], sizeof cases / sizeof *cases);
            unsupported++;
            continue;
        }
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            double worst[3] = {0, 0, 0};
            for (size_t k = 0; k < sizeof nxs / sizeof *nxs; k++)
                for (int mode = 0; mode < 3; mode++) {
                    double r = run_case(&cases[c], nxs[k], isas[s], mode);
                    if (r > worst[mode]) worst[mode] = r;
                    ran++;
                }
            printf("  %-8s %-8s %4lld x %-4lld worst error/tol: kernels %.3f, gemm %.3f, sgemm %.3f\n", isas[s],
                   tsr_dtype_name(cases[c].dtype), (long long)cases[c].rows, (long long)cases[c].cols, worst[0],
                   worst[1], worst[2]);
        }
    }
    printf("%d cases passed, %d isa unsupported\n", ran, unsupported);
    assert_true(ran > 0);
}

/* NaN in one input row turns exactly that output row to NaN. */
static void test_nan_parity(void **state) {
    (void)state;
    rng = SEED + 1;
    const uint32_t dts[] = {TSR_DTYPE_F16, TSR_DTYPE_Q8_0, TSR_DTYPE_Q4_K, TSR_DTYPE_BF16};
    const char *isas[] = {"portable", "avx2", "avx512"};
    const tsr_gemv_isa ids[] = {TSR_GEMV_ISA_PORTABLE, TSR_GEMV_ISA_AVX2, TSR_GEMV_ISA_AVX512};
    for (int s = 0; s < 3; s++) {
        if (!tsr_gemv_isa_runs(ids[s])) continue;
        for (int mode = 0; mode < 3; mode++)
            for (size_t d = 0; d < 4; d++) {
                th_n_params = 0;
                th_set_str("isa", isas[s]);
                th_set_str("prefill", mode == 2 ? "blas" : "gemm");
                th_set_int("blas_min_rows", mode ? 2 : 0);
                th_set_int("blas_min_rows_quant", mode ? 2 : 0);
                inst_box b;
                assert_int_equal(open_inst(&b), TSR_OK);
                int64_t rows = 21, cols = 256;
                uint64_t rb;
                uint8_t *w = make_weights(dts[d], rows, cols, &rb);
                float x[3 * 256], y[3 * 21];
                for (int i = 0; i < 3 * 256; i++) x[i] = rndf(-1, 1);
                x[256 + 77] = NAN;
                tsr_weight tw = {"nan.weight", dts[d], rows, cols, w, rb * (uint64_t)rows, NULL, TSR_WEIGHT_DENSE};
                void *prep;
                assert_int_equal(b.g->prepare(b.inst, &tw, &prep), TSR_OK);
                assert_int_equal(b.g->run(b.inst, prep, 3, x, y, NULL), TSR_OK);
                for (int r = 0; r < rows; r++) {
                    assert_true(isfinite(y[r]));
                    assert_true(isnan(y[rows + r]));
                    assert_true(isfinite(y[2 * rows + r]));
                }
                b.g->release(b.inst, prep);
                close_inst(&b);
                free(w);
            }
    }
}

static void test_errors(void **state) {
    (void)state;
    th_n_params = 0;
    inst_box b;
    assert_int_equal(open_inst(&b), TSR_OK);
    uint8_t buf[4096] = {0};
    void *prep = (void *)1;
    /* too few bytes for the shape */
    tsr_weight w1 = {"blk.0.short", TSR_DTYPE_F16, 10, 100, buf, 1999, NULL, TSR_WEIGHT_DENSE};
    assert_int_equal(b.g->prepare(b.inst, &w1, &prep), TSR_ERR_INVALID);
    assert_non_null(strstr(th_err, "blk.0.short"));
    /* cols not a multiple of the block */
    tsr_weight w2 = {"blk.0.q8", TSR_DTYPE_Q8_0, 2, 33, buf, sizeof buf, NULL, TSR_WEIGHT_DENSE};
    assert_int_equal(b.g->prepare(b.inst, &w2, &prep), TSR_ERR_INVALID);
    assert_non_null(strstr(th_err, "blk.0.q8"));
    /* rows * row_bytes overflows */
    tsr_weight w3 = {"huge", TSR_DTYPE_F32, INT64_MAX / 4, 1024, buf, UINT64_MAX, NULL, TSR_WEIGHT_DENSE};
    assert_int_equal(b.g->prepare(b.inst, &w3, &prep), TSR_ERR_INVALID);
    /* negative and zero shapes */
    tsr_weight w4 = {"neg", TSR_DTYPE_F32, -1, 4, buf, sizeof buf, NULL, TSR_WEIGHT_DENSE};
    assert_int_equal(b.g->prepare(b.inst, &w4, &prep), TSR_ERR_INVALID);
    tsr_weight w5 = {"zero", TSR_DTYPE_F32, 4, 0, buf, sizeof buf, NULL, TSR_WEIGHT_DENSE};
    assert_int_equal(b.g->prepare(b.inst, &w5, &prep), TSR_ERR_INVALID);
    /* not a weight type */
    tsr_weight w6 = {"ids", TSR_DTYPE_I32, 4, 4, buf, sizeof buf, NULL, TSR_WEIGHT_DENSE};
    assert_int_equal(b.g->prepare(b.inst, &w6, &prep), TSR_ERR_UNSUPPORTED);
    assert_non_null(strstr(th_err, "i32"));
    tsr_weight w7 = {"bad", 99, 4, 4, buf, sizeof buf, NULL, TSR_WEIGHT_DENSE};
    assert_int_equal(b.g->prepare(b.inst, &w7, &prep), TSR_ERR_UNSUPPORTED);
    /* run with no rows */
    tsr_weight ok = {"ok", TSR_DTYPE_F32, 4, 4, buf, sizeof buf, NULL, TSR_WEIGHT_DENSE};
    assert_int_equal(b.g->prepare(b.inst, &ok, &prep), TSR_OK);
    float x[4] = {0}, y[4];
    assert_int_equal(b.g->run(b.inst, prep, 0, x, y, NULL), TSR_ERR_INVALID);
    assert_int_equal(b.g->run(b.inst, prep, 1, x, y, NULL), TSR_OK);
    b.g->release(b.inst, prep);
    close_inst(&b);
    /* bad params */
    th_set_str("isa", "sse9");
    assert_int_equal(open_inst(&b), TSR_ERR_INVALID);
    assert_non_null(strstr(th_err, "sse9"));
    close_inst(&b);
    th_n_params = 0;
    th_set_int("blas_min_rows", -3);
    assert_int_equal(open_inst(&b), TSR_ERR_INVALID);
    close_inst(&b);
    th_n_params = 0;
    th_set_str("prefill", "mkl");
    assert_int_equal(open_inst(&b), TSR_ERR_INVALID);
    assert_non_null(strstr(th_err, "mkl"));
    close_inst(&b);
    assert_int_equal(atomic_load(&th_live), 0);
}

/* prepare_group: n matrices stacked by rows give, row for row, each
 * matrix's products within the bound of the f64 reference, as each gives
 * alone (one row: the kernels; 70 rows: the GEMM), with weights: copy (the
 * default: each copy's stored bytes handed back through weight_done; a
 * group of one copied too, prepare() reading in place) and refused as
 * unsupported with weights: map, where one matrix is read in place. */
static atomic_ullong done_bytes;
static uint64_t count_done(const tsr_plugin_ctx *ctx, const void *data, uint64_t nbytes) {
    (void)ctx, (void)data;
    atomic_fetch_add(&done_bytes, nbytes);
    return 0;
}

static void test_group(void **state) {
    (void)state;
    tsr_host_api api3 = th_api; /* a version-3 host: weight_done counted */
    api3.version = 3;
    api3.weight_done = count_done;
    tsr_plugin_ctx ctx3 = {.host = &api3, .name = "test"};
    const uint32_t dtypes[] = {TSR_DTYPE_BF16, TSR_DTYPE_F16, TSR_DTYPE_Q8_0, TSR_DTYPE_Q4_K};
    const int64_t rows[3] = {20, 7, 9}, cols = 256, all = 36;
    for (size_t di = 0; di < sizeof dtypes / sizeof *dtypes; di++) {
        rng = SEED + 7 + di;
        tsr_weight ws[3];
        uint8_t *w[3];
        uint64_t rb;
        for (int i = 0; i < 3; i++) {
            w[i] = make_weights(dtypes[di], rows[i], cols, &rb);
            ws[i] = (tsr_weight){i == 0 ? "blk.wq" : i == 1 ? "blk.wk" : "blk.wv", dtypes[di], rows[i], cols, w[i],
                                 rb * (uint64_t)rows[i], NULL, TSR_WEIGHT_DENSE};
        }
        float *x = malloc(70 * cols * sizeof *x), *yg = malloc(70 * all * sizeof *yg), *y1 = malloc(70 * 20 * sizeof *y1);
        double *yref = malloc(70 * 20 * sizeof *yref), *tol = malloc(70 * 20 * sizeof *tol);
        assert_true(x && yg && y1 && yref && tol);
        for (int64_t i = 0; i < 70 * cols; i++) x[i] = rndf(-1, 1);
        th_n_params = 0;
        inst_box b;
        b.d = tsr_plugin_entry(), b.g = b.d->iface, b.inst = calloc(1, b.d->instance_size);
        assert_int_equal(b.d->init(b.inst, &ctx3), TSR_OK);
        void *g = NULL, *one[3];
        atomic_store(&done_bytes, 0);
        assert_int_equal(b.g->prepare_group(b.inst, ws, 3, &g), TSR_OK);
        assert_true(atomic_load(&done_bytes) >= ws[0].nbytes + ws[1].nbytes + ws[2].nbytes);
        assert_int_equal(b.g->bytes(b.inst, g), ws[0].nbytes + ws[1].nbytes + ws[2].nbytes);
        /* prepare(): on demand (an expert), read in place: nothing copied or given back */
        const unsigned long long done = atomic_load(&done_bytes);
        for (int i = 0; i < 3; i++) assert_int_equal(b.g->prepare(b.inst, &ws[i], &one[i]), TSR_OK);
        assert_int_equal(atomic_load(&done_bytes), done);
        /* a group of one: copied */
        void *g1 = NULL;
        assert_int_equal(b.g->prepare_group(b.inst, &ws[1], 1, &g1), TSR_OK);
        assert_true(atomic_load(&done_bytes) >= done + ws[1].nbytes);
        b.g->release(b.inst, g1);
        for (int nx = 1; nx <= 70; nx += 69) {
            assert_int_equal(b.g->run(b.inst, g, nx, x, yg, NULL), TSR_OK);
            for (int i = 0, off = 0; i < 3; off += (int)rows[i], i++) {
                assert_int_equal(b.g->run(b.inst, one[i], nx, x, y1, NULL), TSR_OK);
                reference(dtypes[di], w[i], rb, rows[i], cols, x, nx, yref, tol);
                for (int r = 0; r < nx; r++)
                    for (int64_t o = 0; o < rows[i]; o++) {
                        const int64_t k = (int64_t)r * rows[i] + o;
                        assert_true(fabs(yg[(int64_t)r * all + off + o] - yref[k]) <= tol[k]);
                        assert_true(fabs(y1[k] - yref[k]) <= tol[k]);
                    }
            }
        }
        b.g->release(b.inst, g);
        for (int i = 0; i < 3; i++) b.g->release(b.inst, one[i]);
        /* of another dtype: refused, naming it */
        tsr_weight odd[2] = {ws[0], ws[1]};
        odd[1].dtype = dtypes[di] == TSR_DTYPE_F16 ? TSR_DTYPE_BF16 : TSR_DTYPE_F16;
        odd[1].nbytes = (uint64_t)rows[1] * cols * 2;
        assert_int_equal(b.g->prepare_group(b.inst, odd, 2, &g), TSR_ERR_INVALID);
        assert_non_null(strstr(th_err, "blk.wk"));
        close_inst(&b);
        /* weights: map */
        th_set_str("weights", "map");
        b.inst = calloc(1, b.d->instance_size);
        assert_int_equal(b.d->init(b.inst, &ctx3), TSR_OK);
        atomic_store(&done_bytes, 0);
        assert_int_equal(b.g->prepare_group(b.inst, ws, 3, &g), TSR_ERR_UNSUPPORTED);
        assert_int_equal(b.g->prepare(b.inst, &ws[1], &one[1]), TSR_OK);
        assert_int_equal(atomic_load(&done_bytes), 0);
        assert_int_equal(b.g->run(b.inst, one[1], 1, x, y1, NULL), TSR_OK);
        b.g->release(b.inst, one[1]);
        close_inst(&b);
        th_set_str("weights", "mmap");
        assert_int_equal(open_inst(&b), TSR_ERR_INVALID);
        assert_non_null(strstr(th_err, "mmap"));
        close_inst(&b);
        assert_int_equal(atomic_load(&th_live), 0);
        for (int i = 0; i < 3; i++) free(w[i]);
        free(x), free(yg), free(y1), free(yref), free(tol);
    }
}

/* run_glu against run() on the same stacked [gate; up] handle followed by
 * tsr_silu_mul over each whole row: equal bit for bit (the takes align to
 * 8 gate rows, so neither the four-row kernels nor the SiLU's vector part
 * group rows differently), for row counts of several takes and with tails;
 * nothing written past y; TSR_ERR_UNSUPPORTED (no error set) for handles
 * that are no gate/up pair and for row counts of the prefill path. */
static void test_glu(void **state) {
    (void)state;
    const gcase gl[] = {
        {TSR_DTYPE_F32, 600, 96},  {TSR_DTYPE_F32, 76, 172}, {TSR_DTYPE_F16, 600, 520},
        {TSR_DTYPE_BF16, 900, 512}, {TSR_DTYPE_I8, 300, 200}, {TSR_DTYPE_Q8_0, 172, 96},
        {TSR_DTYPE_Q4_K, 40, 256},
    };
    for (size_t ci = 0; ci < sizeof gl / sizeof *gl; ci++) {
        const gcase *gc = &gl[ci];
        const int64_t f = gc->rows, cols = gc->cols;
        rng = SEED + 101 + ci;
        uint64_t rb;
        uint8_t *w[2] = {make_weights(gc->dtype, f, cols, &rb), make_weights(gc->dtype, f, cols, &rb)};
        tsr_weight ws[3] = {{"blk.gate", gc->dtype, f, cols, w[0], rb * (uint64_t)f, NULL, TSR_WEIGHT_DENSE},
                            {"blk.up", gc->dtype, f, cols, w[1], rb * (uint64_t)f, NULL, TSR_WEIGHT_DENSE}};
        ws[2] = ws[1];
        const int nmax = 3;
        float *x = malloc((size_t)(nmax * cols) * sizeof *x), *gu = malloc((size_t)(nmax * 2 * f) * sizeof *gu);
        float *want = malloc((size_t)(nmax * f) * sizeof *want), *ybuf = malloc((size_t)(nmax * f + GUARD) * sizeof *ybuf);
        assert_true(x && gu && want && ybuf);
        for (int64_t i = 0; i < nmax * cols; i++) x[i] = rndf(-2, 2);
        th_n_params = 0;
        th_set_int("blas_min_rows", 4);
        th_set_int("blas_min_rows_quant", 4);
        inst_box b;
        assert_int_equal(open_inst(&b), TSR_OK); /* glu off (the default): declined */
        void *g = NULL, *g3 = NULL, *odd = NULL;
        assert_int_equal(b.g->prepare_group(b.inst, ws, 2, &g), TSR_OK);
        assert_int_equal(b.g->run_glu(b.inst, g, 1, x, ybuf, &(tsr_exec){.device = TSR_DEVICE_CPU, .n_threads = 2}),
                         TSR_ERR_UNSUPPORTED);
        b.g->release(b.inst, g);
        close_inst(&b);
        th_set_bool("glu", 1);
        assert_int_equal(open_inst(&b), TSR_OK);
        assert_int_equal(b.g->prepare_group(b.inst, ws, 2, &g), TSR_OK);
        tsr_exec ex = {.device = TSR_DEVICE_CPU, .n_threads = 2};
        for (int nx = 1; nx <= nmax; nx += 2)
            for (int shares = 2; shares <= 5; shares += 3) { /* 5: three shares taken by the idle worker */
                tsr_exec exs = {.device = TSR_DEVICE_CPU, .n_threads = shares};
                for (int64_t i = 0; i < nx * f + GUARD; i++) memcpy(ybuf + i, &guard_bits, 4);
                const int rc = th_glu_check(b.g, b.inst, g, nx, x, f, &exs, gu, want, ybuf);
                if (rc != TSR_OK)
                    fail_msg("%s %lld x %lld, %d rows, %d shares: run_glu differs from run + silu (%d)",
                             tsr_dtype_name(gc->dtype), (long long)f, (long long)cols, nx, shares, rc);
                for (int i = 0; i < GUARD; i++) assert_memory_equal(ybuf + nx * f + i, &guard_bits, 4);
            }
        /* not fused: the prefill path's row counts, three matrices, two of unequal rows, f not a
         * multiple of 4 */
        th_err[0] = 0;
        assert_int_equal(b.g->run_glu(b.inst, g, 4, x, ybuf, &ex), TSR_ERR_UNSUPPORTED);
        assert_int_equal(b.g->prepare_group(b.inst, ws, 3, &g3), TSR_OK);
        assert_int_equal(b.g->run_glu(b.inst, g3, 1, x, ybuf, &ex), TSR_ERR_UNSUPPORTED);
        tsr_weight uneq[2] = {ws[0], ws[1]};
        uneq[1].rows = f - 1, uneq[1].nbytes = rb * (uint64_t)(f - 1);
        assert_int_equal(b.g->prepare_group(b.inst, uneq, 2, &odd), TSR_OK);
        assert_int_equal(b.g->run_glu(b.inst, odd, 1, x, ybuf, &ex), TSR_ERR_UNSUPPORTED);
        b.g->release(b.inst, odd);
        uneq[0].rows = f - 1, uneq[0].nbytes = uneq[1].nbytes;
        assert_int_equal(b.g->prepare_group(b.inst, uneq, 2, &odd), TSR_OK);
        assert_int_equal(b.g->run_glu(b.inst, odd, 1, x, ybuf, &ex), TSR_ERR_UNSUPPORTED);
        assert_string_equal(th_err, "");
        b.g->release(b.inst, g), b.g->release(b.inst, g3), b.g->release(b.inst, odd);
        close_inst(&b);
        assert_int_equal(atomic_load(&th_live), 0);
        free(w[0]), free(w[1]), free(x), free(gu), free(want), free(ybuf);
    }
}

/* Fail the Nth host allocation for every N: prepare and the GEMM and sgemm
 * paths fail with NOMEM or succeed, and nothing leaks. */
static void test_alloc_failure(void **state) {
    (void)state;
    rng = SEED + 2;
    int64_t rows = 40, cols = 64;
    uint64_t rb;
    uint8_t *w = make_weights(TSR_DTYPE_F16, rows, cols, &rb);
    float x[8 * 64], y[8 * 40];
    for (int i = 0; i < 8 * 64; i++) x[i] = rndf(-1, 1);
    int failures = 0, run_failures[2] = {0, 0};
    for (long k = 0; k < 40; k++) {
        long n = k % 20 + 1;
        th_n_params = 0;
        th_set_str("prefill", k < 20 ? "gemm" : "blas");
        th_set_int("blas_min_rows", 2);
        th_set_int("blas_tile_rows", 8);
        inst_box b;
        assert_int_equal(open_inst(&b), TSR_OK);
        atomic_store(&th_fail_at, atomic_load(&th_count) + n);
        tsr_weight tw = {"f.weight", TSR_DTYPE_F16, rows, cols, w, rb * (uint64_t)rows, NULL, TSR_WEIGHT_DENSE};
        void *prep = NULL;
        int rc = b.g->prepare(b.inst, &tw, &prep);
        if (rc == TSR_OK) {
            rc = b.g->run(b.inst, prep, 8, x, y, NULL);
            if (rc == TSR_ERR_NOMEM) run_failures[k >= 20]++;
            b.g->release(b.inst, prep);
        }
        atomic_store(&th_fail_at, 0);
        assert_true(rc == TSR_OK || rc == TSR_ERR_NOMEM);
        if (rc) failures++;
        close_inst(&b);
        assert_int_equal(atomic_load(&th_live), 0);
    }
    assert_true(failures > 0);
    assert_true(run_failures[0] > 0 && run_failures[1] > 0); /* the GEMM's and sgemm's scratch */
    free(w);
}

/* The test host as a host of version 4, whose weights may carry FP8
 * checkpoints' scales (tsr_weight.scale). */
static tsr_host_api th_api4;
static tsr_plugin_ctx th_ctx4;
static int open_inst4(inst_box *b) {
    th_api4 = th_api;
    th_api4.version = 4;
    th_ctx4 = th_ctx;
    th_ctx4.host = &th_api4;
    return open_inst_on(b, &th_ctx4);
}

/* y_ref of E4M3 weights times block scales s ([ceil(rows / br), ceil(cols /
 * bc)]): sum_c code * s[r / br, c / bc] * x, in f64, and its bound. */
static void reference_blocks(const uint8_t *w, uint64_t rb, int64_t rows, int64_t cols, const float *s, int64_t br,
                             int64_t bc, const float *x, int nx, double *yref, double *tol) {
    const int64_t gc = (cols + bc - 1) / bc;
    for (int64_t r = 0; r < rows; r++)
        for (int i = 0; i < nx; i++) {
            double sum = 0, a = 0;
            for (int64_t c = 0; c < cols; c++) {
                const double p = (double)tsr_f8e4m3_to_f32(w[r * rb + c]) * s[(r / br) * gc + c / bc] * x[i * cols + c];
                sum += p, a += fabs(p);
            }
            yref[i * rows + r] = sum;
            tol[i * rows + r] = 4.0 * sqrt((double)cols) * FLT_EPSILON * a + 1e-30;
        }
}

/* E4M3 weights (random codes: subnormals, +-448, every exponent) on every
 * ISA and path (kernels, blocked GEMM, sgemm): with a scale per row, per
 * tensor and per block (FP8 checkpoints: 128-column blocks, and 24-column
 * ones narrower than a kernel step) against f64 references; the NaN code
 * turns its row's outputs to NaN and no other. */
static void test_f8(void **state) {
    (void)state;
    rng = SEED + 7;
    const char *isas[] = {"portable", "avx2", "avx512"};
    const tsr_gemv_isa ids[] = {TSR_GEMV_ISA_PORTABLE, TSR_GEMV_ISA_AVX2, TSR_GEMV_ISA_AVX512};
    const int64_t rows = 37, cols = 1003;
    const int nx = 3;
    for (int s = 0; s < 3; s++) {
        if (!tsr_gemv_isa_runs(ids[s])) continue;
        for (int mode = 0; mode < 3; mode++) {
            th_n_params = 0;
            th_set_str("isa", isas[s]);
            th_set_str("prefill", mode == 2 ? "blas" : "gemm");
            th_set_int("blas_min_rows", mode ? 2 : 0);
            inst_box b;
            assert_int_equal(open_inst4(&b), TSR_OK);
            uint64_t rb;
            uint8_t *w = make_weights(TSR_DTYPE_F8_E4M3, rows, cols, &rb);
            float x[nx * cols], y[nx * rows], sc_rows[rows], sc_tensor = 0.0371f;
            double yref[nx * rows], tol[nx * rows];
            for (int64_t i = 0; i < nx * cols; i++) x[i] = rndf(-1, 1);
            for (int64_t r = 0; r < rows; r++) sc_rows[r] = rndf(0.001f, 0.1f);
            reference(TSR_DTYPE_F8_E4M3, w, rb, rows, cols, x, nx, yref, tol);
            const tsr_weight_scale per_row = {sc_rows, 1, cols}, per_tensor = {&sc_tensor, rows, cols};
            const tsr_weight_scale *scs[] = {&per_row, &per_tensor};
            for (int k = 0; k < 2; k++) {
                tsr_weight tw = {"f8.weight", TSR_DTYPE_F8_E4M3, rows, cols, w, rb * (uint64_t)rows,
                                 scs[k], TSR_WEIGHT_DENSE};
                void *prep;
                assert_int_equal(b.g->prepare(b.inst, &tw, &prep), TSR_OK);
                assert_int_equal(b.g->run(b.inst, prep, nx, x, y, NULL), TSR_OK);
                for (int64_t i = 0; i < nx * rows; i++) {
                    const double sc = k ? sc_tensor : sc_rows[i % rows];
                    if (!(fabs((double)y[i] - yref[i] * sc) <= tol[i] * sc))
                        fail_msg("%s %s %s: y[%lld] = %.9g, reference %.9g", isas[s], prefills[mode],
                                 k ? "per tensor" : "per row", (long long)i, (double)y[i], yref[i] * sc);
                }
                b.g->release(b.inst, prep);
            }
            w[5 * rb + 17] = 0x7f; /* the NaN code in row 5 */
            tsr_weight tn = {"f8.weight", TSR_DTYPE_F8_E4M3, rows, cols, w, rb * (uint64_t)rows,
                             NULL, TSR_WEIGHT_DENSE};
            void *prep;
            assert_int_equal(b.g->prepare(b.inst, &tn, &prep), TSR_OK);
            assert_int_equal(b.g->run(b.inst, prep, nx, x, y, NULL), TSR_OK);
            for (int64_t i = 0; i < nx * rows; i++)
                if (i % rows == 5 ? !isnan(y[i]) : !isfinite(y[i]))
                    fail_msg("%s %s: y[%lld] = %g with the NaN code in row 5", isas[s], prefills[mode], (long long)i,
                             (double)y[i]);
            b.g->release(b.inst, prep);
            w[5 * rb + 17] = 0x7e;
            const int64_t bsz[][2] = {{16, 128}, {8, 24}};
            for (int k = 0; k < 2; k++) {
                const int64_t br = bsz[k][0], bc = bsz[k][1], nb = ((rows + br - 1) / br) * ((cols + bc - 1) / bc);
                float *sblk = malloc((size_t)nb * sizeof *sblk);
                for (int64_t i = 0; i < nb; i++) sblk[i] = rndf(0.001f, 0.1f);
                const tsr_weight_scale blocks = {sblk, br, bc};
                tsr_weight tb = {"f8.blocks", TSR_DTYPE_F8_E4M3, rows, cols, w, rb * (uint64_t)rows,
                                 &blocks, TSR_WEIGHT_DENSE};
                assert_int_equal(b.g->prepare(b.inst, &tb, &prep), TSR_OK);
                assert_int_equal(b.g->run(b.inst, prep, nx, x, y, NULL), TSR_OK);
                reference_blocks(w, rb, rows, cols, sblk, br, bc, x, nx, yref, tol);
                for (int64_t i = 0; i < nx * rows; i++)
                    if (!(fabs((double)y[i] - yref[i]) <= tol[i]))
                        fail_msg("%s %s blocks of %lld x %lld: y[%lld] = %.9g, reference %.9g", isas[s], prefills[mode],
                                 (long long)br, (long long)bc, (long long)i, (double)y[i], yref[i]);
                b.g->release(b.inst, prep);
                free(sblk);
            }
            close_inst(&b);
            assert_int_equal(atomic_load(&th_live), 0);
            free(w);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f8),
        cmocka_unit_test(test_q8_0_rows_independent),
        cmocka_unit_test(test_bf16_decode_blocks),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_nan_parity),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_alloc_failure),
        cmocka_unit_test(test_group),
        cmocka_unit_test(test_glu),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
