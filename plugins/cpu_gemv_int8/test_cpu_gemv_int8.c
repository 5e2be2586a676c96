/*
 * Tests of cpu_gemv_int8: outputs against (a) the int8 matrix and scales
 * recomputed here and dotted in double (rounding tolerance), and (b) the
 * stored weights in double, within the quantisation bound
 * sum_c |x_c| * scale_r / 2. Both ISAs, kernels and sgemm; NaN weights
 * refused naming the row; allocation failure at every step; every stored
 * byte handed back through weight_done (host api version 3) once quantised,
 * and nothing asked of an older host. The two quantisers (weight rows to
 * int8, activations to int16) bit for bit against the rule written out here
 * (scale amax / bound, q = clamp(round-to-even(x * bound / amax)), zero rows,
 * Inf and NaN), at lengths with and without SIMD tails.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemv_cpu.h"
#include "kernels/dtype.h"
#include "plugins/cpu_gemv/test_host.h"

#define SEED 4242u

static uint64_t rng;
static float rndf(float lo, float hi) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)(rng >> 40) * 0x1p-24f;
}

extern const tsr_plugin_desc *tsr_plugin_entry(void);

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

static void *open_inst(int *rc) {
    const tsr_plugin_desc *d = tsr_plugin_entry();
    void *inst = calloc(1, d->instance_size);
    assert_non_null(inst);
    *rc = d->init(inst, &th_ctx);
    return inst;
}

/* A stored matrix of dtype (f32, f16 or bf16) from uniform values, one row
 * scaled up so rows have different scales. */
static uint8_t *make(uint32_t dtype, int64_t rows, int64_t cols, float *widened) {
    size_t esz = dtype == TSR_DTYPE_F32 ? 4 : 2;
    uint8_t *w = malloc((size_t)(rows * cols) * esz);
    assert_non_null(w);
    for (int64_t i = 0; i < rows * cols; i++) {
        float f = rndf(-1, 1) * (i / cols == 3 ? 50.0f : 1.0f);
        if (dtype == TSR_DTYPE_F32) memcpy(w + 4 * i, &f, 4);
        else {
            uint16_t h = dtype == TSR_DTYPE_F16 ? tsr_f32_to_f16(f) : tsr_f32_to_bf16(f);
            memcpy(w + 2 * i, &h, 2);
        }
    }
    for (int64_t r = 0; r < rows; r++) tsr_dequant_row(dtype, w + (size_t)(r * cols) * esz, widened + r * cols, cols);
    return w;
}

/* Input rows from which check's plugin takes the prefill path (f32 activations). */
static int blas_or_max(int blas) { return blas > 0 ? blas : INT32_MAX; }

/* x16 1: int16 activations; 2: u8 (param x_int8) */
static void check(uint32_t dtype, int64_t rows, int64_t cols, int nx, const char *isa, int blas, int x16) {
    th_n_params = 0;
    th_params[th_n_params++] = (tsr_param){.name = "x_int16", .type = TSR_PARAM_BOOL, .v.b = x16 != 0};
    th_params[th_n_params++] = (tsr_param){.name = "x_int8", .type = TSR_PARAM_BOOL, .v.b = x16 == 2};
    th_set_str("isa", isa);
    th_set_int("blas_min_rows", blas);
    th_set_int("blas_tile_rows", 8);
    int rc;
    const tsr_gemv_i *g = tsr_plugin_entry()->iface;
    void *inst = open_inst(&rc);
    assert_int_equal(rc, TSR_OK);
    float *wf = malloc((size_t)(rows * cols) * sizeof *wf);
    uint8_t *w = make(dtype, rows, cols, wf);
    float *x = malloc((size_t)(nx * cols) * sizeof *x), *y = malloc((size_t)(nx * rows) * sizeof *y);
    int8_t *q = malloc((size_t)cols);
    for (int64_t i = 0; i < nx * cols; i++) x[i] = rndf(-1, 1);
    size_t esz = dtype == TSR_DTYPE_F32 ? 4 : 2;
    tsr_weight tw = {"int8.weight", dtype, rows, cols, w, (uint64_t)(rows * cols) * esz, NULL, TSR_WEIGHT_DENSE};
    void *prep;
    assert_int_equal(g->prepare(inst, &tw, &prep), TSR_OK);
    assert_int_equal(g->bytes(inst, prep), (uint64_t)(rows * cols) + (x16 == 2 ? 8 : 4) * (uint64_t)rows);
    assert_int_equal(g->run(inst, prep, nx, x, y, NULL), TSR_OK);
    for (int64_t r = 0; r < rows; r++) {
        /* independent quantisation of the row, as gemv_cpu.h documents it */
        float amax = 0;
        for (int64_t c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(wf[r * cols + c]));
        double s = (double)(amax / 127.0f);
        float inv = 127.0f / amax;
        for (int64_t c = 0; c < cols; c++) q[c] = (int8_t)lrintf(wf[r * cols + c] * inv);
        for (int i = 0; i < nx; i++) {
            double yq = 0, yf = 0, a = 0, ax = 0, aw = 0, xmax = 0;
            for (int64_t c = 0; c < cols; c++) {
                double xv = x[i * cols + c];
                yq += q[c] * s * xv;
                a += fabs(q[c] * s * xv);
                aw += fabs(q[c] * s);
                yf += (double)wf[r * cols + c] * xv;
                ax += fabs(xv);
                xmax = fmax(xmax, fabs(xv));
            }
            double got = y[i * rows + r];
            /* rounding, plus int16 (u8) activations: each within half a step of max|x| / 32767 (127) */
            double tol = 4 * sqrt((double)cols) * FLT_EPSILON * a + 1e-6 * s * ax +
                         (x16 ? aw * xmax / (x16 == 2 && nx < blas_or_max(blas) ? 127 : 32767) * 0.5 : 0);
            if (!(fabs(got - yq) <= tol))
                fail_msg("%s %s nx=%d blas=%d x_int16=%d row %lld: %.9g, int8 reference %.9g (tol %.3g)",
                         tsr_dtype_name(dtype), isa, nx, blas, x16, (long long)r, got, yq, tol);
            if (!(fabs(got - yf) <= ax * s * 0.5 * 1.0001 + tol))
                fail_msg("%s row %lld: %.9g is outside the quantisation bound of %.9g", tsr_dtype_name(dtype),
                         (long long)r, got, yf);
        }
    }
    g->release(inst, prep);
    free(inst);
    assert_int_equal(atomic_load(&th_live), 0);
    free(wf), free(w), free(x), free(y), free(q);
}

#if defined(__x86_64__)
/* Skips the calling test where the CPU lacks AVX512-VNNI. */
static void require_vnni(void) {
    if (!tsr_cpu_has_avx512vnni()) {
        printf("# no AVX512-VNNI here: skipped\n");
        skip();
    }
}

/* Kernel k over one input row's weight rows [0, rows) in one call (its
 * decode blocks) and a row at a time (its row-by-row path), into y0 and y1:
 * whether the two agree bit for bit. */
static int blocks_equal_rows(tsr_gemv_i8_kernel_fn k, tsr_gemv_i8_args a, int64_t rows, float *y0, float *y1) {
    a.nx = 1, a.y = y0;
    k(&a, 0, rows);
    a.y = y1;
    for (int64_t r = 0; r < rows; r++) k(&a, r, r + 1);
    return memcmp(y0, y1, (size_t)rows * sizeof *y0) == 0;
}
#endif

/* The AVX512-VNNI int8 x int16 kernel (vpdpwssd, up to 8 input rows a
 * pass) gives the AVX-512 kernel's outputs bit for bit: 1..9 input rows,
 * columns with whole 1,024-column flushes, a partial one and a tail, the
 * largest codes and activations. Both take one input row in blocks of 16
 * weight rows where the columns are whole 64-column steps (a transposing
 * sum across 16 rows' lanes): each must equal the same kernel called a row
 * at a time (its row-by-row path), bit for bit. Skipped where the CPU
 * lacks VNNI. */
static void test_vnni_bits(void **state) {
    (void)state;
#if defined(__x86_64__)
    require_vnni();
    rng = SEED + 99;
    const int64_t rows = 37, shapes[] = {64, 1088, 2100, 4864 + 33};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t cols = shapes[si];
        int8_t *w = malloc((size_t)(rows * cols));
        int16_t *xq = malloc((size_t)(9 * cols) * sizeof *xq);
        float *ws = malloc((size_t)rows * sizeof *ws), xs[9], *y0 = malloc((size_t)(9 * rows) * sizeof *y0),
              *y1 = malloc((size_t)(9 * rows) * sizeof *y1);
        assert_true(w && xq && ws && y0 && y1);
        for (int64_t i = 0; i < rows * cols; i++) w[i] = (int8_t)(i % 97 == 0 ? -127 : lrintf(rndf(-127, 127)));
        for (int64_t i = 0; i < 9 * cols; i++) xq[i] = (int16_t)(i % 89 == 0 ? -32767 : lrintf(rndf(-32767, 32767)));
        for (int64_t r = 0; r < rows; r++) ws[r] = rndf(1e-4f, 1e-2f);
        for (int i = 0; i < 9; i++) xs[i] = rndf(1e-5f, 1e-3f);
        for (int nx = 1; nx <= 9; nx++) {
            tsr_gemv_i8_args a = {.w = w, .wscale = ws, .cols = cols, .xq = xq, .xscale = xs, .nx = nx, .y = y0, .ldy = rows};
            tsr_gemv_i8_rows_avx512(&a, 0, rows);
            a.y = y1;
            tsr_gemv_i8_rows_avx512_vnni(&a, 0, rows);
            if (memcmp(y0, y1, (size_t)(nx * rows) * sizeof *y0) != 0)
                fail_msg("%lld columns, %d rows: the VNNI kernel differs from the AVX-512 one", (long long)cols, nx);
        }
        for (int k = 0; k < 2; k++) /* one input row: whole ranges against a row at a time */
            if (!blocks_equal_rows(k ? tsr_gemv_i8_rows_avx512_vnni : tsr_gemv_i8_rows_avx512,
                                   (tsr_gemv_i8_args){.w = w, .wscale = ws, .cols = cols, .xq = xq, .xscale = xs, .nx = 1, .ldy = rows},
                                   rows, y0, y1))
                fail_msg("%lld columns, one row: the %s kernel's blocks of 16 rows differ from its rows one at a time",
                         (long long)cols, k ? "VNNI" : "AVX-512");
        free(w), free(xq), free(ws), free(y0), free(y1);
    }
    printf("# the AVX512-VNNI kernel equals the AVX-512 one bit for bit (1..9 rows)\n");
#else
    skip();
#endif
}

/* Q8_0 x int16 with AVX512-VNNI takes one input row in blocks of 16 weight
 * rows summed across together: equal, bit for bit, to the same kernel
 * called a row at a time, at 37 rows and 37 blocks a row (an odd block
 * last). (Its sums against the stored weights: test_q8_0_as_stored at isa
 * avx512.) Skipped where the CPU lacks VNNI. */
static void test_q8_0_vnni_blocks(void **state) {
    (void)state;
#if defined(__x86_64__)
    require_vnni();
    rng = SEED + 7;
    const int64_t rows = 37, cols = 32 * 37, nb = cols / 32;
    uint8_t *w = malloc((size_t)(rows * nb * 34));
    int16_t *xq = malloc((size_t)cols * sizeof *xq);
    float xs[1] = {rndf(1e-5f, 1e-3f)}, *y0 = malloc((size_t)rows * sizeof *y0), *y1 = malloc((size_t)rows * sizeof *y1);
    assert_true(w && xq && y0 && y1);
    for (int64_t b = 0; b < rows * nb; b++) {
        const uint16_t d = tsr_f32_to_f16(rndf(1e-4f, 1e-2f));
        memcpy(w + b * 34, &d, 2);
        for (int k = 0; k < 32; k++) w[b * 34 + 2 + k] = (uint8_t)(int8_t)lrintf(rndf(-127, 127));
    }
    for (int64_t i = 0; i < cols; i++) xq[i] = (int16_t)lrintf(rndf(-32767, 32767));
    if (!blocks_equal_rows(tsr_gemv_q8_0_i16_rows_avx512_vnni,
                           (tsr_gemv_i8_args){.w = (const int8_t *)w, .cols = cols, .xq = xq, .xscale = xs, .nx = 1, .ldy = rows},
                           rows, y0, y1))
        fail_msg("Q8_0 x int16 VNNI: blocks of 16 weight rows differ from rows one at a time");
    printf("# Q8_0 x int16 VNNI: blocks of 16 weight rows equal rows one at a time\n");
    free(w), free(xq), free(y0), free(y1);
#else
    skip();
#endif
}

/* int8 x u8 (gemv_cpu.h: tsr_gemv_i8_args with xu, wsum): the AVX512-VNNI kernel against
 * the portable one, which sums in int64, and against y computed here from
 * the formula, bit for bit, at 1..11 input rows (groups of 8 and a rest),
 * columns with a masked last line, 37 weight rows (blocks of 16 and a
 * rest), codes at +-127 and activations at 1 and 255; and a row at a time
 * against whole ranges. tsr_gemv_quant_x_u8 against nearbyintf here. */
static void test_u8_kernel(void **state) {
    (void)state;
    rng = SEED + 55;
    const int64_t rows = 37, shapes[] = {64, 100, 1088, 2100, 4864 + 33};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t cols = shapes[si];
        int8_t *w = malloc((size_t)(rows * cols));
        uint8_t *xu = malloc((size_t)(11 * cols));
        int32_t *wsum = malloc((size_t)rows * sizeof *wsum);
        float *ws = malloc((size_t)rows * sizeof *ws), xs[11], *y0 = malloc((size_t)(11 * rows) * sizeof *y0),
              *y1 = malloc((size_t)(11 * rows) * sizeof *y1), *yr = malloc((size_t)(11 * rows) * sizeof *yr);
        assert_true(w && xu && wsum && ws && y0 && y1 && yr);
        for (int64_t i = 0; i < rows * cols; i++) w[i] = (int8_t)(i % 97 == 0 ? -127 : i % 89 == 0 ? 127 : lrintf(rndf(-127, 127)));
        for (int64_t i = 0; i < 11 * cols; i++) xu[i] = (uint8_t)(i % 83 == 0 ? 1 : i % 79 == 0 ? 255 : lrintf(rndf(1, 255)));
        for (int64_t r = 0; r < rows; r++) {
            int64_t t = 0;
            for (int64_t c = 0; c < cols; c++) t += w[r * cols + c];
            wsum[r] = (int32_t)t, ws[r] = rndf(1e-4f, 1e-2f);
        }
        for (int i = 0; i < 11; i++) xs[i] = rndf(1e-5f, 1e-3f);
        for (int nx = 1; nx <= 11; nx++) {
            for (int i = 0; i < nx; i++)
                for (int64_t r = 0; r < rows; r++) {
                    int64_t t = 0;
                    for (int64_t c = 0; c < cols; c++) t += (int64_t)w[r * cols + c] * ((int64_t)xu[i * cols + c] - 128);
                    yr[i * rows + r] = (float)t * ws[r] * xs[i];
                }
            tsr_gemv_i8_args a = {.w = w, .wscale = ws, .cols = cols, .xscale = xs, .nx = nx, .y = y0, .ldy = rows,
                                  .xu = xu, .wsum = wsum};
            tsr_gemv_i8u8_rows_portable(&a, 0, rows);
            if (memcmp(y0, yr, (size_t)(nx * rows) * sizeof *y0) != 0)
                fail_msg("%lld columns, %d rows: the portable int8 x u8 kernel differs from the formula", (long long)cols, nx);
#if defined(__x86_64__)
            if (!tsr_cpu_has_avx512vnni()) continue;
            a.y = y1;
            tsr_gemv_i8u8_rows_avx512_vnni(&a, 0, rows);
            if (memcmp(y1, yr, (size_t)(nx * rows) * sizeof *y1) != 0)
                fail_msg("%lld columns, %d rows: the VNNI int8 x u8 kernel differs from the formula", (long long)cols, nx);
            if (nx == 1) { /* a row at a time (no blocks of 16) against the whole range */
                for (int64_t r = 0; r < rows; r++) tsr_gemv_i8u8_rows_avx512_vnni(&a, r, r + 1);
                if (memcmp(y1, yr, (size_t)rows * sizeof *y1) != 0)
                    fail_msg("%lld columns: the VNNI int8 x u8 kernel a row at a time differs", (long long)cols);
            }
#endif
        }
        float *x = malloc((size_t)cols * sizeof *x);
        assert_non_null(x);
        for (int64_t c = 0; c < cols; c++) x[c] = rndf(-3, 3);
        x[cols / 2] = -4.0f;
        const float s = tsr_gemv_quant_x_u8(x, cols, xu);
        assert_true(s == 4.0f / 127.0f);
        for (int64_t c = 0; c < cols; c++)
            if (xu[c] != (uint8_t)(int)(nearbyintf(x[c] * (127.0f / 4.0f)) + 128.0f))
                fail_msg("tsr_gemv_quant_x_u8: column %lld of %lld", (long long)c, (long long)cols);
        assert_int_equal(xu[cols / 2], 1);
        free(x), free(w), free(xu), free(wsum), free(ws), free(y0), free(y1), free(yr);
    }
    float z[20] = {0};
    uint8_t q[20];
    assert_true(tsr_gemv_quant_x_u8(z, 20, q) == 0.0f && q[0] == 128 && q[19] == 128);
    z[3] = NAN;
    assert_true(isnan(tsr_gemv_quant_x_u8(z, 20, q)));
    printf("# int8 x u8: the portable and VNNI kernels equal the formula bit for bit (1..11 rows)\n");
}

/* Param x_int8 is refused, naming what it needs, without x_int16 and
 * where no AVX512-VNNI kernel runs (isa avx2; the CPU's own lack). */
static void test_x_int8_refused(void **state) {
    (void)state;
    const char *isas[] = {"auto", "avx2"};
    for (int k = 0; k < 3; k++) {
        th_n_params = 0;
        th_set_bool("x_int8", 1);
        th_set_bool("x_int16", k != 0);
        th_set_str("isa", isas[k == 2]);
        th_err[0] = 0;
        int rc;
        void *inst = open_inst(&rc);
        const int refused = k == 0 || k == 2 || !tsr_gemv_u8_kernel(TSR_GEMV_ISA_AVX512);
        if (refused) {
            assert_int_not_equal(rc, TSR_OK);
            assert_non_null(strstr(th_err, k == 0 ? "x_int16" : "AVX512-VNNI"));
        } else {
            assert_int_equal(rc, TSR_OK);
        }
        const tsr_plugin_desc *d = tsr_plugin_entry();
        if (rc == TSR_OK) d->fini(inst);
        free(inst);
    }
    th_n_params = 0;
}

static void test_table(void **state) {
    (void)state;
    rng = SEED;
    printf("seed %u\n", SEED);
    const uint32_t dts[] = {TSR_DTYPE_F32, TSR_DTYPE_F16, TSR_DTYPE_BF16};
    int ran = 0;
    for (int s = 0; s < TSR_GEMV_ISA_COUNT; s++) {
        if (!tsr_gemv_isa_runs((tsr_gemv_isa)s)) {
            printf("isa %s unsupported here: its cases are skipped\n", tsr_gemv_isa_name((tsr_gemv_isa)s));
            continue;
        }
        const char *isa = tsr_gemv_isa_name((tsr_gemv_isa)s);
        for (int d = 0; d < 3; d++)
            for (int nx = 1; nx <= 9; nx += 4)
                for (int blas = 0; blas < 2; blas++)
                    for (int x16 = 0; x16 < 3; x16++) {
                        if (x16 == 2 && !tsr_gemv_u8_kernel((tsr_gemv_isa)s)) continue; /* x_int8 refused */
                        check(dts[d], 29, 67, nx, isa, blas ? 2 : 0, x16);
                        check(dts[d], 7, 512, nx, isa, blas ? 2 : 0, x16);
                        check(dts[d], 5, 160, nx, isa, blas ? 2 : 0, x16); /* 64-column steps and a tail of 32 */
                        check(dts[d], 3, 2100, nx, isa, blas ? 2 : 0, x16); /* > 1024: int32 flushes */
                        check(dts[d], 2100, 32, nx, isa, blas ? 2 : 0, x16); /* > 1,024 output rows a take */
                        check(dts[d], 37, 128, nx, isa, blas ? 2 : 0, x16); /* AVX-512 decode: blocks of 16 rows */
                        ran += 6;
                    }
    }
    printf("%d cases passed\n", ran);
    assert_true(ran > 0);
}

/* Q8_0 weights are kept as stored (bytes() = the stored blocks) and read
 * as they are: against the stored values in double, within f32 rounding
 * plus, with x_int16, half an int16 step of max|x| per activation. Random
 * block scales, codes over the whole int8 range (-128 too), every ISA the CPU runs, decode
 * rows and the GEMM, rows of 1 to 70 blocks. */
static void check_q8_0(int64_t rows, int64_t cols, int nx, const char *isa, int blas, int x16) {
    th_n_params = 0;
    th_params[th_n_params++] = (tsr_param){.name = "x_int16", .type = TSR_PARAM_BOOL, .v.b = x16};
    th_set_str("isa", isa);
    th_set_int("blas_min_rows", blas);
    int rc;
    const tsr_gemv_i *g = tsr_plugin_entry()->iface;
    void *inst = open_inst(&rc);
    assert_int_equal(rc, TSR_OK);
    const int64_t nb = cols / 32;
    uint8_t *w = malloc((size_t)(rows * nb * 34));
    float *x = malloc((size_t)(nx * cols) * sizeof *x), *y = malloc((size_t)(nx * rows) * sizeof *y);
    assert_true(w && x && y);
    for (int64_t b = 0; b < rows * nb; b++) {
        uint16_t h = tsr_f32_to_f16(rndf(0.001f, 0.1f));
        memcpy(w + 34 * b, &h, 2);
        for (int k = 0; k < 32; k++) w[34 * b + 2 + k] = (uint8_t)(int)rndf(0, 256);
    }
    for (int64_t i = 0; i < nx * cols; i++) x[i] = rndf(-1, 1) * (i % 97 == 0 ? 20.0f : 1.0f);
    tsr_weight tw = {"q8.weight", TSR_DTYPE_Q8_0, rows, cols, w, (uint64_t)(rows * nb * 34), NULL, TSR_WEIGHT_DENSE};
    void *prep;
    assert_int_equal(g->prepare(inst, &tw, &prep), TSR_OK);
    assert_int_equal(g->bytes(inst, prep), tw.nbytes); /* the stored blocks, no copy */
    assert_int_equal(g->run(inst, prep, nx, x, y, NULL), TSR_OK);
    for (int i = 0; i < nx; i++) {
        double xmax = 0;
        for (int64_t c = 0; c < cols; c++) xmax = fmax(xmax, fabs(x[i * cols + c]));
        for (int64_t r = 0; r < rows; r++) {
            double want = 0, a = 0, aw = 0;
            for (int64_t c = 0; c < cols; c++) {
                const uint8_t *blk = w + 34 * (r * nb + c / 32);
                uint16_t h;
                memcpy(&h, blk, 2);
                double wv = (double)tsr_f16_to_f32(h) * (int8_t)blk[2 + c % 32];
                want += wv * x[i * cols + c];
                a += fabs(wv * x[i * cols + c]);
                aw += fabs(wv);
            }
            double got = y[i * rows + r];
            double tol = 4 * sqrt((double)cols) * FLT_EPSILON * a + (x16 ? aw * xmax / 32767 * 0.5 : 0) + 1e-30;
            if (!(fabs(got - want) <= tol))
                fail_msg("q8_0 %s nx=%d blas=%d x_int16=%d %lld x %lld row %lld: %.9g, stored weights give %.9g "
                         "(tol %.3g)", isa, nx, blas, x16, (long long)rows, (long long)cols, (long long)r, got, want,
                         tol);
        }
    }
    g->release(inst, prep);
    free(inst);
    assert_int_equal(atomic_load(&th_live), 0);
    free(w), free(x), free(y);
}

static void test_q8_0_as_stored(void **state) {
    (void)state;
    rng = SEED + 3;
    int ran = 0;
    for (int s = 0; s < TSR_GEMV_ISA_COUNT; s++) {
        if (!tsr_gemv_isa_runs((tsr_gemv_isa)s)) continue;
        const char *isa = tsr_gemv_isa_name((tsr_gemv_isa)s);
        for (int nx = 1; nx <= 9; nx += 4)
            for (int blas = 0; blas < 2; blas++)
                for (int x16 = 0; x16 < 2; x16++) {
                    check_q8_0(29, 32, nx, isa, blas ? 2 : 0, x16);
                    check_q8_0(7, 96, nx, isa, blas ? 2 : 0, x16);
                    check_q8_0(3, 2240, nx, isa, blas ? 2 : 0, x16);
                    check_q8_0(2100, 32, nx, isa, blas ? 2 : 0, x16); /* > 1,024 output rows a take */
                    ran += 4;
                }
    }
    printf("%d Q8_0 cases passed\n", ran);
    assert_true(ran > 0);
}

static void test_errors(void **state) {
    (void)state;
    int rc;
    th_n_params = 0;
    const tsr_gemv_i *g = tsr_plugin_entry()->iface;
    void *inst = open_inst(&rc);
    assert_int_equal(rc, TSR_OK);
    float w[4 * 8];
    for (int i = 0; i < 32; i++) w[i] = (float)i;
    w[2 * 8 + 5] = NAN;
    tsr_weight tw = {"blk.1.nan", TSR_DTYPE_F32, 4, 8, w, sizeof w, NULL, TSR_WEIGHT_DENSE};
    void *prep = NULL;
    assert_int_equal(g->prepare(inst, &tw, &prep), TSR_ERR_INVALID);
    assert_non_null(strstr(th_err, "blk.1.nan"));
    assert_non_null(strstr(th_err, "row 2"));
    tsr_weight big = {"huge", TSR_DTYPE_I8, INT64_MAX / 2, 4, w, UINT64_MAX, NULL, TSR_WEIGHT_DENSE};
    assert_int_equal(g->prepare(inst, &big, &prep), TSR_ERR_NOMEM); /* its int8 copy cannot exist */
    assert_non_null(strstr(th_err, "huge"));
    tsr_weight sh = {"short", TSR_DTYPE_F32, 4, 8, w, sizeof w - 1, NULL, TSR_WEIGHT_DENSE};
    assert_int_equal(g->prepare(inst, &sh, &prep), TSR_ERR_INVALID);
    assert_int_equal(atomic_load(&th_live), 0);
    /* an all-zero row has scale 0 and gives 0 */
    float z[8] = {0}, x[8] = {1, 1, 1, 1, 1, 1, 1, 1}, y[1] = {5};
    tsr_weight zw = {"zero", TSR_DTYPE_F32, 1, 8, z, sizeof z, NULL, TSR_WEIGHT_DENSE};
    assert_int_equal(g->prepare(inst, &zw, &prep), TSR_OK);
    assert_int_equal(g->run(inst, prep, 1, x, y, NULL), TSR_OK);
    assert_true(y[0] == 0.0f);
    g->release(inst, prep);
    /* NaN in the activations propagates (the int16 path steps aside) */
    float wv[8] = {1, -2, 3, -4, 5, -6, 7, -8};
    tsr_weight nw = {"w", TSR_DTYPE_F32, 1, 8, wv, sizeof wv, NULL, TSR_WEIGHT_DENSE};
    assert_int_equal(g->prepare(inst, &nw, &prep), TSR_OK);
    x[3] = NAN;
    assert_int_equal(g->run(inst, prep, 1, x, y, NULL), TSR_OK);
    assert_true(isnan(y[0]));
    x[3] = 1;
    assert_int_equal(g->run(inst, prep, 1, x, y, NULL), TSR_OK);
    assert_true(fabsf(y[0] + 4) < 0.1f); /* int8 weights: steps of 8/127 */
    g->release(inst, prep);
    free(inst);
    assert_int_equal(atomic_load(&th_live), 0);
}

static void test_alloc_failure(void **state) {
    (void)state;
    rng = SEED + 1;
    float wf[16 * 64];
    for (int i = 0; i < 16 * 64; i++) wf[i] = rndf(-1, 1);
    float x[4 * 64], y[4 * 16];
    for (int i = 0; i < 4 * 64; i++) x[i] = rndf(-1, 1);
    int failures = 0;
    for (long n = 1; n < 16; n++) {
        int rc;
        th_n_params = 0;
        th_set_int("blas_min_rows", 2);
        th_set_int("blas_tile_rows", 4);
        const tsr_gemv_i *g = tsr_plugin_entry()->iface;
        void *inst = open_inst(&rc);
        assert_int_equal(rc, TSR_OK);
        atomic_store(&th_fail_at, atomic_load(&th_count) + n);
        tsr_weight tw = {"f.weight", TSR_DTYPE_F32, 16, 64, wf, sizeof wf, NULL, TSR_WEIGHT_DENSE};
        void *prep = NULL;
        rc = g->prepare(inst, &tw, &prep);
        if (rc == TSR_OK) {
            rc = g->run(inst, prep, 4, x, y, NULL);
            g->release(inst, prep);
        }
        atomic_store(&th_fail_at, 0);
        assert_true(rc == TSR_OK || rc == TSR_ERR_NOMEM);
        failures += rc != TSR_OK;
        free(inst);
        assert_int_equal(atomic_load(&th_live), 0);
    }
    assert_true(failures > 0);
}

/* A version-3 host: weight_done marks the bytes it was handed (workers call
 * it concurrently, on disjoint blocks; the final whole-range call comes
 * after them). */
static const uint8_t *wd_base;
static uint8_t *wd_seen;
static uint64_t wd_n;
static atomic_long wd_calls, wd_outside;

static uint64_t wd_weight_done(const tsr_plugin_ctx *ctx, const void *data, uint64_t nbytes) {
    (void)ctx;
    atomic_fetch_add(&wd_calls, 1);
    const uint8_t *p = data;
    if (!wd_base || p < wd_base || (uint64_t)(p - wd_base) > wd_n || nbytes > wd_n - (uint64_t)(p - wd_base)) {
        atomic_fetch_add(&wd_outside, 1);
        return 0;
    }
    memset(wd_seen + (p - wd_base), 1, nbytes);
    return 0;
}

static void test_weight_done(void **state) {
    (void)state;
    rng = SEED + 7;
    tsr_host_api api3 = th_api;
    api3.version = 3;
    api3.weight_done = wd_weight_done;
    tsr_plugin_ctx ctx3 = {.host = &api3, .name = "test"};
    th_n_params = 0;
    /* 1200 rows of 512 f32: 2.4 MB, several quantisation blocks and a short last one */
    const int64_t rows = 1200, cols = 512;
    float *wf = malloc((size_t)(rows * cols) * sizeof *wf), *x = malloc((size_t)cols * sizeof *x);
    float *y1 = malloc((size_t)rows * sizeof *y1), *y3 = malloc((size_t)rows * sizeof *y3);
    uint8_t *w = make(TSR_DTYPE_F32, rows, cols, wf);
    for (int64_t c = 0; c < cols; c++) x[c] = rndf(-1, 1);
    tsr_weight tw = {"int8.weight", TSR_DTYPE_F32, rows, cols, w, (uint64_t)(rows * cols) * 4, NULL, TSR_WEIGHT_DENSE};
    wd_base = w;
    wd_n = tw.nbytes;
    wd_seen = calloc(1, wd_n);
    assert_true(wf && x && y1 && y3 && wd_seen);
    const tsr_plugin_desc *d = tsr_plugin_entry();
    const tsr_gemv_i *g = d->iface;
    for (int v = 1; v <= 3; v += 2) {
        atomic_store(&wd_calls, 0);
        void *inst = calloc(1, d->instance_size), *prep;
        assert_int_equal(d->init(inst, v == 3 ? &ctx3 : &th_ctx), TSR_OK);
        assert_int_equal(g->prepare(inst, &tw, &prep), TSR_OK);
        assert_int_equal(g->run(inst, prep, 1, x, v == 3 ? y3 : y1, NULL), TSR_OK);
        g->release(inst, prep);
        free(inst);
        if (v == 1) assert_int_equal(atomic_load(&wd_calls), 0); /* the old host has no such member */
        else assert_true(atomic_load(&wd_calls) >= 3);            /* blocks, then the whole range */
    }
    assert_int_equal(atomic_load(&wd_outside), 0);
    for (uint64_t i = 0; i < wd_n; i++)
        if (!wd_seen[i]) fail_msg("stored byte %llu was never handed back", (unsigned long long)i);
    assert_memory_equal(y1, y3, (size_t)rows * sizeof *y1);
    assert_int_equal(atomic_load(&th_live), 0);
    wd_base = NULL;
    free(wd_seen), free(wf), free(x), free(y1), free(y3), free(w);
}

/* prepare_group: matrices stacked by rows (q/k/v, gate/up) give each
 * matrix's outputs as it gives alone, quantised (bf16) and as stored
 * (Q8_0, copied; refused with weights: map, which cannot stack), for the
 * int16 kernels (1 row) and the GEMM (40 rows). */
static void test_group(void **state) {
    (void)state;
    const int64_t rows[2] = {24, 9}, cols = 256, all = 33;
    for (int q8 = 0; q8 < 2; q8++) {
        rng = SEED + 11 + q8;
        tsr_weight ws[2];
        uint8_t *w[2];
        float *wf = malloc((size_t)(rows[0] * cols) * sizeof *wf);
        for (int i = 0; i < 2; i++) {
            if (q8) { /* Q8_0 blocks: an f16 scale, 32 int8 */
                w[i] = malloc((size_t)(rows[i] * cols / 32 * 34));
                for (int64_t b = 0; b < rows[i] * cols / 32; b++) {
                    uint16_t h = tsr_f32_to_f16(rndf(0.001f, 0.02f));
                    memcpy(w[i] + 34 * b, &h, 2);
                    for (int k = 0; k < 32; k++) w[i][34 * b + 2 + k] = (uint8_t)(int8_t)lrintf(rndf(-127, 127));
                }
            } else {
                w[i] = make(TSR_DTYPE_BF16, rows[i], cols, wf);
            }
            ws[i] = (tsr_weight){i ? "blk.up" : "blk.gate", q8 ? TSR_DTYPE_Q8_0 : TSR_DTYPE_BF16, rows[i], cols,
                                 w[i], q8 ? (uint64_t)(rows[i] * cols / 32 * 34) : (uint64_t)(rows[i] * cols * 2),
                                 NULL, TSR_WEIGHT_DENSE};
        }
        float *x = malloc(40 * cols * sizeof *x), *yg = malloc(40 * all * sizeof *yg), *y1 = malloc(40 * 24 * sizeof *y1);
        assert_true(wf && x && yg && y1);
        for (int64_t i = 0; i < 40 * cols; i++) x[i] = rndf(-1, 1);
        const tsr_gemv_i *g = tsr_plugin_entry()->iface;
        for (int map = 0; map < 2; map++) {
            th_n_params = 0;
            if (map) th_set_str("weights", "map");
            int rc;
            void *inst = open_inst(&rc), *grp = NULL, *one;
            assert_int_equal(rc, TSR_OK);
            if (map && q8) {
                assert_int_equal(g->prepare_group(inst, ws, 2, &grp), TSR_ERR_UNSUPPORTED);
                free(inst);
                continue;
            }
            assert_int_equal(g->prepare_group(inst, ws, 2, &grp), TSR_OK);
            for (int nx = 1; nx <= 40; nx += 39) {
                assert_int_equal(g->run(inst, grp, nx, x, yg, NULL), TSR_OK);
                for (int i = 0, off = 0; i < 2; off += (int)rows[i], i++) {
                    assert_int_equal(g->prepare(inst, &ws[i], &one), TSR_OK);
                    assert_int_equal(g->run(inst, one, nx, x, y1, NULL), TSR_OK);
                    g->release(inst, one);
                    for (int r = 0; r < nx; r++)
                        for (int64_t o = 0; o < rows[i]; o++) {
                            const double a = y1[(int64_t)r * rows[i] + o], b = yg[(int64_t)r * all + off + o];
                            if (!(fabs(a - b) <= 1e-5 * fabs(a) + 1e-6))
                                fail_msg("q8 %d map %d nx %d matrix %d row %lld: stacked %.9g, alone %.9g", q8, map,
                                         nx, i, (long long)o, b, a);
                        }
                }
            }
            g->release(inst, grp);
            free(inst);
        }
        assert_int_equal(atomic_load(&th_live), 0);
        for (int i = 0; i < 2; i++) free(w[i]);
        free(wf), free(x), free(yg), free(y1);
    }
}

/* run_glu on the decode path (int16 activations, int8 from bf16 and Q8_0 as
 * stored; x with a NaN: the f32 path) equals run() on the same stacked
 * [gate; up] handle followed by tsr_silu_mul over each whole row, bit for bit. */
static void test_glu(void **state) {
    (void)state;
    const int64_t f = 520, cols = 256; /* several takes; f % 8 = 0, 520 = 65 x 8 */
    for (int q8 = 0; q8 < 2; q8++) {
        rng = SEED + 21 + q8;
        uint8_t *w[2];
        float *wf = malloc((size_t)(f * cols) * sizeof *wf);
        tsr_weight ws[2];
        for (int i = 0; i < 2; i++) {
            if (q8) {
                w[i] = malloc((size_t)(f * cols / 32 * 34));
                for (int64_t b = 0; b < f * cols / 32; b++) {
                    uint16_t h = tsr_f32_to_f16(rndf(0.001f, 0.02f));
                    memcpy(w[i] + 34 * b, &h, 2);
                    for (int k = 0; k < 32; k++) w[i][34 * b + 2 + k] = (uint8_t)(int8_t)lrintf(rndf(-127, 127));
                }
            } else {
                w[i] = make(TSR_DTYPE_BF16, f, cols, wf);
            }
            ws[i] = (tsr_weight){i ? "blk.up" : "blk.gate", q8 ? TSR_DTYPE_Q8_0 : TSR_DTYPE_BF16, f, cols, w[i],
                                 q8 ? (uint64_t)(f * cols / 32 * 34) : (uint64_t)(f * cols * 2),
                                 NULL, TSR_WEIGHT_DENSE};
        }
        float *x = malloc(3 * cols * sizeof *x), *gu = malloc(3 * 2 * f * sizeof *gu);
        float *want = malloc(3 * f * sizeof *want), *y = malloc(3 * f * sizeof *y);
        assert_true(wf && x && gu && want && y);
        for (int64_t i = 0; i < 3 * cols; i++) x[i] = rndf(-3, 3);
        const tsr_gemv_i *g = tsr_plugin_entry()->iface;
        th_n_params = 0;
        th_set_int("blas_min_rows", 4);
        th_set_int("blas_min_rows_quant", 4);
        th_set_bool("glu", 1); /* off by default: the host runs the pair and its SiLU */
        int rc;
        void *inst = open_inst(&rc), *grp = NULL;
        assert_int_equal(rc, TSR_OK);
        assert_int_equal(g->prepare_group(inst, ws, 2, &grp), TSR_OK);
        for (int nan = 0; nan < 2; nan++) {
            x[cols + 7] = nan ? NAN : 0.5f;
            for (int nx = 1; nx <= 3; nx += 2) {
                const int rc = th_glu_check(g, inst, grp, nx, x, f, NULL, gu, want, y);
                if (rc != TSR_OK)
                    fail_msg("q8 %d, NaN %d, %d rows: run_glu differs from run + silu (%d)", q8, nan, nx, rc);
            }
        }
        assert_int_equal(g->run_glu(inst, grp, 4, x, y, NULL), TSR_ERR_UNSUPPORTED); /* the prefill path */
        g->release(inst, grp);
        free(inst);
        assert_int_equal(atomic_load(&th_live), 0);
        for (int i = 0; i < 2; i++) free(w[i]);
        free(wf), free(x), free(gu), free(want), free(y);
    }
}

/* The quantisation rule, as documented, for a row of n: the scale, q. */
static float quant_rule(const float *x, int64_t n, float bound, int32_t *q) {
    float amax = 0.0f;
    for (int64_t c = 0; c < n; c++) {
        if (isnan(x[c])) return NAN;
        if (fabsf(x[c]) > amax) amax = fabsf(x[c]);
    }
    for (int64_t c = 0; c < n; c++) q[c] = 0;
    if (amax == 0.0f || isinf(amax)) return amax;
    float inv = bound / amax;
    for (int64_t c = 0; c < n; c++) {
        float v = rintf(x[c] * inv);
        q[c] = (int32_t)(v > bound ? bound : v < -bound ? -bound : v);
    }
    return amax / bound;
}

static void test_quantisers(void **state) {
    (void)state;
    const int64_t lens[] = {1, 7, 8, 9, 31, 33, 896, 4867};
    enum { N = 4867 };
    static float x[N];
    static int32_t want[N];
    static int16_t q16[N];
    static int8_t q8[N];
    rng = SEED;
    for (size_t l = 0; l < sizeof lens / sizeof *lens; l++)
        for (int kind = 0; kind < 5; kind++) { /* random, halves, zeros, an Inf, a NaN */
            const int64_t n = lens[l];
            for (int64_t c = 0; c < n; c++)
                x[c] = kind == 1 ? (float)((c % 9) - 4) * 0.5f : kind == 2 ? 0.0f : rndf(-3.0f, 3.0f);
            if (kind >= 3) x[n / 2] = kind == 3 ? -INFINITY : NAN;
            for (int b = 0; b < 2; b++) {
                const float bound = b ? 32767.0f : 127.0f;
                float ws = quant_rule(x, n, bound, want);
                float s = b ? tsr_gemv_quant_x_i16(x, n, q16) : tsr_gemv_quant_row_i8(x, n, q8);
                if (isnan(ws)) {
                    assert_true(isnan(s));
                    continue;
                }
                if (memcmp(&s, &ws, sizeof s) != 0)
                    fail_msg("bound %g, n %lld, kind %d: scale %g, want %g", (double)bound, (long long)n, kind,
                             (double)s, (double)ws);
                for (int64_t c = 0; c < n; c++)
                    if ((b ? q16[c] : q8[c]) != want[c])
                        fail_msg("bound %g, n %lld, kind %d: q[%lld] = %d, want %d", (double)bound, (long long)n,
                                 kind, (long long)c, b ? q16[c] : q8[c], want[c]);
            }
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vnni_bits),
        cmocka_unit_test(test_q8_0_vnni_blocks),
        cmocka_unit_test(test_u8_kernel),
        cmocka_unit_test(test_x_int8_refused),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_q8_0_as_stored),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_alloc_failure),
        cmocka_unit_test(test_weight_done),
        cmocka_unit_test(test_group),
        cmocka_unit_test(test_glu),
        cmocka_unit_test(test_quantisers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
