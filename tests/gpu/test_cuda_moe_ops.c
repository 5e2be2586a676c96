/*
 * The CUDA backend's mixture-of-experts ops (routing, row gather, weighted
 * scatter, gated add; kernels/cuda/ops.cu) against the CPU backend's
 * (core/runtime/backend_cpu.c over kernels/cpu/ops.c), and its fused ops
 * against the device ops they replace, ctest label "gpu"; skipped cleanly
 * where no CUDA device is present.
 *
 * Bound, stated and tested: routing chooses the same experts in the same
 * order as the CPU (logits on a grid of 1/64, apart or exactly equal: ties go to
 * the lower id on both; NaN never chosen, -1 past the last number) and the
 * weights agree within 1e-5 relative (softmax sums in another order); the
 * data movers are exact; the gated add within 1e-6 relative (expf); the
 * experts' combination equals zero-then-scatter expert by expert bit for bit;
 * Qwen3's q/k norms and RoPE in one launch equal the two norms and the
 * rope(s) bit for bit; argmax chooses the CPU's index (ties to the lowest,
 * NaN and -inf never, -1 for a row of nothing else).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/gpu/gpu_env.h"

#include "core/runtime/backend.h"

/* The CUDA backend, device 0 initialised (after GPU_REQUIRE: a device is
 * present, so one that does not start fails the test). */
static const tsr_backend *device(void) {
    assert_true(gpu_ready());
    return tsr_backend_cuda();
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform(void) { /* [0, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / (float)(1u << 24);
}

/* bytes of host data copied into fresh device memory */
static void *on_device(const tsr_backend *be, const void *host, size_t bytes) {
    tsr_error err;
    tsr_error_clear(&err);
    void *d = be->alloc(bytes, &err);
    assert_non_null(d);
    assert_int_equal(be->upload(d, host, bytes, &err), TSR_OK);
    return d;
}

static void back(const tsr_backend *be, void *host, const void *dev, size_t bytes) {
    tsr_error err;
    tsr_error_clear(&err);
    assert_int_equal(be->download(host, dev, bytes, &err), TSR_OK);
}

/* One routing case: rows of E logits, K chosen; ties: every row repeats some
 * values exactly; special: row 0 one NaN (every probability NaN: nothing
 * chosen), row 1 -inf but for two equal values, row 2 -inf but for one. */
static void route_case(const tsr_backend *dev, int rows, int E, int K, int norm) {
    const tsr_backend *cpu = tsr_backend_cpu();
    const size_t n = (size_t)rows * E, nk = (size_t)rows * K;
    float *p = malloc(n * sizeof *p), *pc = malloc(n * sizeof *pc), *w = malloc(nk * sizeof *w),
          *wd = malloc(nk * sizeof *wd);
    int32_t *idx = malloc(nk * sizeof *idx), *idd = malloc(nk * sizeof *idd);
    assert_true(p && pc && w && wd && idx && idd);
    /* on a grid of 1/64: distinct logits are 1.6% apart in probability,
     * far beyond either expf's rounding; equal ones tie exactly */
    for (size_t i = 0; i < n; i++) p[i] = (float)(int)(512.0f * uniform()) / 64.0f - 4.0f;
    for (int r = 0; r < rows; r++) /* exact ties */
        for (int t = 0; t < E / 4; t++) p[(size_t)r * E + (size_t)(uniform() * E)] = p[(size_t)r * E + t];
    if (rows >= 3) {
        p[E / 3] = NAN;
        for (int e = 0; e < E; e++) p[E + e] = -INFINITY, p[2 * E + e] = -INFINITY;
        p[E + E / 2] = 1.0f, p[E] = 1.0f; /* two numbers: a tie */
        p[2 * E + E - 1] = 0.0f;
    }
    memcpy(pc, p, n * sizeof *p);
    tsr_error err;
    tsr_error_clear(&err);
    assert_int_equal(cpu->route(pc, rows, E, K, norm, idx, w, &err), TSR_OK);
    float *dp = on_device(dev, p, n * sizeof *p);
    int32_t *didx = on_device(dev, idx, nk * sizeof *idx); /* overwritten */
    float *dw = on_device(dev, w, nk * sizeof *w);
    assert_int_equal(dev->route(dp, rows, E, K, norm, didx, dw, &err), TSR_OK);
    back(dev, idd, didx, nk * sizeof *idd);
    back(dev, wd, dw, nk * sizeof *wd);
    for (size_t i = 0; i < nk; i++) {
        if (idd[i] != idx[i])
            fail_msg("E %d K %d row %zu choice %zu: device %d, CPU %d", E, K, i / K, i % K, idd[i], idx[i]);
        if (!(fabsf(wd[i] - w[i]) <= 1e-5f * fabsf(w[i]) + 1e-30f))
            fail_msg("E %d K %d row %zu choice %zu: weight %.9g, CPU %.9g", E, K, i / K, i % K, wd[i], w[i]);
    }
    if (rows >= 3) { /* what tsr_topk says directly */
        for (int k = 0; k < K; k++) assert_int_equal(idx[k], -1);
        assert_int_equal(idx[K], 0);
        if (K > 1) assert_int_equal(idx[K + 1], E / 2);
        assert_int_equal(idx[2 * K], E - 1);
    }
    dev->free(dp);
    dev->free(didx);
    dev->free(dw);
    free(p), free(pc), free(w), free(wd), free(idx), free(idd);
}

static void test_route(void **state) {
    (void)state;
    GPU_REQUIRE("MoE ops");
    const tsr_backend *dev = device();
    const int shapes[][2] = {{8, 1}, {8, 2}, {16, 2}, {60, 4}, {64, 8}, {65, 8}, {128, 8}, {129, 40},
                              {256, 16}, {257, 4}, {1024, 8}, {1024, 64}, {33, 33}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int norm = 0; norm <= 1; norm++) route_case(dev, 37, shapes[s][0], shapes[s][1], norm);
    tsr_error err;
    tsr_error_clear(&err);
    assert_int_equal(dev->route(NULL, 1, 1025, 2, 1, NULL, NULL, &err), TSR_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "1025 experts"));
    assert_int_equal(dev->route(NULL, 1, 128, 65, 1, NULL, NULL, &err), TSR_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "65 per token"));
}

static void test_rows(void **state) {
    (void)state;
    GPU_REQUIRE("MoE ops");
    const tsr_backend *dev = device(), *cpu = tsr_backend_cpu();
    enum { ROWS = 40, COLS = 2053, N = 17 };
    float *src = malloc(ROWS * COLS * sizeof *src), *y = malloc(ROWS * COLS * sizeof *y),
          *got = malloc(ROWS * COLS * sizeof *got), *gate = malloc(ROWS * sizeof *gate), w[N];
    assert_true(src && y && got && gate);
    int32_t rows[N];
    for (int i = 0; i < ROWS * COLS; i++) src[i] = uniform() - 0.5f, y[i] = uniform();
    for (int r = 0; r < ROWS; r++) gate[r] = 6.0f * uniform() - 3.0f;
    for (int j = 0; j < N; j++) rows[j] = (j * 7 + 3) % ROWS, w[j] = uniform(); /* distinct */
    float *d_src = on_device(dev, src, ROWS * COLS * sizeof *src), *d_y = on_device(dev, y, ROWS * COLS * sizeof *y),
          *d_g = on_device(dev, gate, ROWS * sizeof *gate), *d_w = on_device(dev, w, sizeof w);
    int32_t *d_rows = on_device(dev, rows, sizeof rows);
    float *d_dst = on_device(dev, y, ROWS * COLS * sizeof *y);
    tsr_error err;
    tsr_error_clear(&err);
    /* gather: exact */
    float *want = malloc(ROWS * COLS * sizeof *want);
    assert_non_null(want);
    assert_int_equal(cpu->gather_rows(want, src, rows, N, COLS, &err), TSR_OK);
    assert_int_equal(dev->gather_rows(d_dst, d_src, d_rows, N, COLS, &err), TSR_OK);
    back(dev, got, d_dst, (size_t)N * COLS * sizeof *got);
    assert_memory_equal(got, want, (size_t)N * COLS * sizeof *got);
    /* weighted scatter: a product and a sum each, as the CPU's (FMA allowed) */
    memcpy(want, y, ROWS * COLS * sizeof *want);
    assert_int_equal(cpu->scatter_axpy(want, src, rows, w, N, COLS, &err), TSR_OK);
    assert_int_equal(dev->scatter_axpy(d_y, d_src, d_rows, d_w, N, COLS, &err), TSR_OK);
    back(dev, got, d_y, ROWS * COLS * sizeof *got);
    for (int i = 0; i < ROWS * COLS; i++)
        if (!(fabsf(got[i] - want[i]) <= 1e-6f * (fabsf(want[i]) + 1.0f)))
            fail_msg("scatter element %d: %.9g, CPU %.9g", i, got[i], want[i]);
    /* gated add on top */
    assert_int_equal(cpu->add_gated(want, src, gate, ROWS, COLS, &err), TSR_OK);
    assert_int_equal(dev->add_gated(d_y, d_src, d_g, ROWS, COLS, &err), TSR_OK);
    back(dev, got, d_y, ROWS * COLS * sizeof *got);
    for (int i = 0; i < ROWS * COLS; i++)
        if (!(fabsf(got[i] - want[i]) <= 1e-6f * (fabsf(want[i]) + 1.0f)))
            fail_msg("gated add element %d: %.9g, CPU %.9g", i, got[i], want[i]);
    /* zero */
    assert_int_equal(dev->zero(d_y, ROWS * COLS, &err), TSR_OK);
    back(dev, got, d_y, ROWS * COLS * sizeof *got);
    for (int i = 0; i < ROWS * COLS; i++) assert_true(got[i] == 0.0f);
    void *d[] = {d_src, d_y, d_g, d_w, d_rows, d_dst};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) dev->free(d[i]);
    free(src), free(y), free(got), free(gate), free(want);
}

/* combine_experts against zero then scatter_axpy expert by expert in
 * increasing id (the host path's sums): bit for bit. K choices a row of E
 * experts (K <= 64); ids distinct per row where E allows (else repeated:
 * equal ids in choice order, as the host path takes them), row 2 with -1s. */
static void combine_case(const tsr_backend *dev, const int K, const int E) {
    enum { ROWS = 5, COLS = 777 };
    int32_t idx[ROWS * 64];
    float w[ROWS * 64];
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < K; j++) {
            idx[r * K + j] = r == 2 && j >= 5 ? -1 : (r * 7 + j * 3 + (j > 3)) % E;
            w[r * K + j] = uniform();
        }
    float *d = malloc(sizeof(float) * ROWS * K * COLS), *got = malloc(sizeof(float) * ROWS * COLS),
          *want = malloc(sizeof(float) * ROWS * COLS);
    assert_true(d && got && want);
    for (int i = 0; i < ROWS * K * COLS; i++) d[i] = uniform() - 0.5f;
    float *dd = on_device(dev, d, sizeof(float) * ROWS * K * COLS), *dw = on_device(dev, w, sizeof(float) * ROWS * K);
    int32_t *didx = on_device(dev, idx, sizeof(int32_t) * ROWS * K);
    float *dy = on_device(dev, got, sizeof(float) * ROWS * COLS), *dy2 = on_device(dev, got, sizeof(float) * ROWS * COLS);
    tsr_error err;
    tsr_error_clear(&err);
    assert_int_equal(dev->combine_experts(dy, dd, didx, dw, ROWS, K, COLS, 0, NULL, &err), TSR_OK);
    assert_int_equal(dev->zero(dy2, ROWS * COLS, &err), TSR_OK);
    for (int e = 0; e < E; e++) { /* each expert's rows and their products, as forward.c's host path */
        for (int i = 0; i < ROWS * K; i++)
            if (idx[i] == e) {
                float *src = on_device(dev, d + (size_t)i * COLS, sizeof(float) * COLS);
                int32_t r = i / K;
                int32_t *dr = on_device(dev, &r, sizeof r);
                float *dws = on_device(dev, &w[i], sizeof(float));
                assert_int_equal(dev->scatter_axpy(dy2, src, dr, dws, 1, COLS, &err), TSR_OK);
                assert_int_equal(dev->sync(&err), TSR_OK);
                dev->free(src), dev->free(dr), dev->free(dws);
            }
    }
    back(dev, got, dy, sizeof(float) * ROWS * COLS);
    back(dev, want, dy2, sizeof(float) * ROWS * COLS);
    assert_memory_equal(got, want, sizeof(float) * ROWS * COLS);
    /* d's rows elsewhere (pos: a permutation, as the grouped experts' sorted
     * rows lie): the same sums */
    int32_t pos[ROWS * 64];
    float *dp = malloc(sizeof(float) * ROWS * K * COLS);
    assert_non_null(dp);
    for (int i = 0; i < ROWS * K; i++) {
        pos[i] = (i * 17 + 5) % (ROWS * K); /* 17 and 5 K coprime: a permutation */
        memcpy(dp + (size_t)pos[i] * COLS, d + (size_t)i * COLS, sizeof(float) * COLS);
    }
    float *ddp = on_device(dev, dp, sizeof(float) * ROWS * K * COLS);
    int32_t *dpos = on_device(dev, pos, sizeof(int32_t) * ROWS * K);
    float *dy3 = on_device(dev, d, sizeof(float) * ROWS * COLS); /* overwritten */
    assert_int_equal(dev->combine_experts(dy3, ddp, didx, dw, ROWS, K, COLS, 0, dpos, &err), TSR_OK);
    back(dev, got, dy3, sizeof(float) * ROWS * COLS);
    assert_memory_equal(got, want, sizeof(float) * ROWS * COLS);
    dev->free(ddp), dev->free(dpos), dev->free(dy3);
    free(dp);
    /* with add: onto y as add() of the sum does */
    for (int i = 0; i < ROWS * COLS; i++) got[i] = uniform();
    float *dz = on_device(dev, got, sizeof(float) * ROWS * COLS), *dz2 = on_device(dev, got, sizeof(float) * ROWS * COLS);
    assert_int_equal(dev->combine_experts(dz, dd, didx, dw, ROWS, K, COLS, 1, NULL, &err), TSR_OK);
    assert_int_equal(dev->add(dz2, dy2, ROWS * COLS, &err), TSR_OK);
    back(dev, got, dz, sizeof(float) * ROWS * COLS);
    back(dev, want, dz2, sizeof(float) * ROWS * COLS);
    assert_memory_equal(got, want, sizeof(float) * ROWS * COLS);
    dev->free(dz), dev->free(dz2);
    assert_int_equal(dev->combine_experts(dy, dd, didx, dw, ROWS, 65, COLS, 0, NULL, &err), TSR_ERR_UNSUPPORTED);
    void *p[] = {dd, dw, didx, dy, dy2};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) dev->free(p[i]);
    free(d), free(got), free(want);
}

static void test_combine(void **state) {
    (void)state;
    GPU_REQUIRE("MoE ops");
    const tsr_backend *dev = device();
    combine_case(dev, 8, 20);
    combine_case(dev, 40, 64); /* two choices a lane of the placing warp; repeated ids */
    combine_case(dev, 64, 128);
}

/* qk_norm_rope against rmsnorm over q's heads and k's, then rope of each:
 * bit for bit, at head_dim 64 and 128, 1 and 3 rows, pairs (i, i + d/2)
 * and interleaved, the position given and read from the device. */
static void test_qk_norm_rope(void **state) {
    (void)state;
    GPU_REQUIRE("MoE ops");
    const tsr_backend *dev = device();
    enum { NH = 6, NKV = 2 };
    for (int hd = 64; hd <= 128; hd *= 2)
        for (int rows = 1; rows <= 3; rows += 2)
            for (int inter = 0; inter < 2; inter++)
                for (int on_dev = 0; on_dev < 2; on_dev++) {
                    tsr_rope rp;
                    assert_int_equal(tsr_rope_init(&rp, hd, 1e6f, inter, 0, 0, 0, 0, 0), TSR_OK);
                    const size_t nq = (size_t)rows * NH * hd, nk = (size_t)rows * NKV * hd;
                    float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *qw = malloc(hd * sizeof *qw),
                          *kw = malloc(hd * sizeof *kw), *a = malloc((nq + nk) * sizeof *a),
                          *b = malloc((nq + nk) * sizeof *b);
                    assert_true(q && k && qw && kw && a && b);
                    for (size_t i = 0; i < nq; i++) q[i] = 4 * uniform() - 2;
                    for (size_t i = 0; i < nk; i++) k[i] = 4 * uniform() - 2;
                    for (int i = 0; i < hd; i++) qw[i] = 2 * uniform(), kw[i] = 2 * uniform();
                    const int pos0 = 37;
                    float *dq1 = on_device(dev, q, nq * sizeof *q), *dk1 = on_device(dev, k, nk * sizeof *k);
                    float *dq2 = on_device(dev, q, nq * sizeof *q), *dk2 = on_device(dev, k, nk * sizeof *k);
                    float *dqw = on_device(dev, qw, hd * sizeof *qw), *dkw = on_device(dev, kw, hd * sizeof *kw);
                    float *dfreq = on_device(dev, rp.inv_freq, sizeof rp.inv_freq);
                    int32_t *dpos = on_device(dev, &pos0, sizeof pos0);
                    const int32_t *dp = on_dev ? dpos : NULL;
                    const int p0 = on_dev ? 0 : pos0; /* ignored where the device holds it */
                    tsr_error err;
                    tsr_error_clear(&err);
                    assert_int_equal(dev->rmsnorm(dq1, dq1, dqw, rows * NH, hd, 1e-6f, &err), TSR_OK);
                    assert_int_equal(dev->rmsnorm(dk1, dk1, dkw, rows * NKV, hd, 1e-6f, &err), TSR_OK);
                    assert_int_equal(dev->rope(&rp, dfreq, dq1, rows, NH, p0, dp, &err), TSR_OK);
                    assert_int_equal(dev->rope(&rp, dfreq, dk1, rows, NKV, p0, dp, &err), TSR_OK);
                    assert_int_equal(
                        dev->qk_norm_rope(&rp, dfreq, dq2, dk2, dqw, dkw, rows, NH, NKV, 1e-6f, p0, dp, &err), TSR_OK);
                    back(dev, a, dq1, nq * sizeof *a), back(dev, a + nq, dk1, nk * sizeof *a);
                    back(dev, b, dq2, nq * sizeof *b), back(dev, b + nq, dk2, nk * sizeof *b);
                    assert_memory_equal(a, b, (nq + nk) * sizeof *a);
                    int moved = 0; /* and it did something */
                    for (size_t i = 0; i < nq; i++) moved |= a[i] != q[i];
                    assert_true(moved);
                    void *d[] = {dq1, dk1, dq2, dk2, dqw, dkw, dfreq, dpos};
                    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) dev->free(d[i]);
                    free(q), free(k), free(qw), free(kw), free(a), free(b);
                }
}

/* argmax against the CPU backend's: rows of a vocabulary (whole 16-byte
 * pieces, the vector path), of odd widths and at an odd offset (the scalar
 * path); values on a coarse grid (many ties), NaN and -inf scattered, the
 * largest value repeated far apart, a row of only NaN and -inf. */
static void test_argmax(void **state) {
    (void)state;
    GPU_REQUIRE("MoE ops");
    const tsr_backend *dev = device(), *cpu = tsr_backend_cpu();
    const int widths[] = {151936, 128256, 4097, 1001, 7, 4};
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
        for (int shift = 0; shift < 2; shift++) {
            enum { ROWS = 4 };
            const int n = widths[wi];
            float *x = malloc(((size_t)ROWS * n + 1) * sizeof *x);
            assert_non_null(x);
            for (size_t i = 0; i < (size_t)ROWS * n + 1; i++) {
                const float u = uniform();
                x[i] = u < 0.01f ? NAN : u < 0.02f ? -INFINITY : (float)(int)(uniform() * 64) / 8;
            }
            for (int r = 0; r < ROWS; r++) { /* the largest twice, far apart, past every grid value */
                float *row = x + shift + (size_t)r * n;
                row[n - 1] = 9.0f;
                if (r == 1) row[n / 3] = 9.0f;
                if (r == 2) row[0] = 9.0f;
            }
            for (int i = 0; i < n; i++) x[shift + (size_t)3 * n + i] = i % 2 ? NAN : -INFINITY;
            int32_t want[ROWS], got[ROWS] = {0};
            tsr_error err;
            tsr_error_clear(&err);
            assert_int_equal(cpu->argmax(x + shift, ROWS, n, want, &err), TSR_OK);
            float *dx = on_device(dev, x, ((size_t)ROWS * n + 1) * sizeof *x);
            int32_t *dout = on_device(dev, got, sizeof got);
            assert_int_equal(dev->argmax(dx + shift, ROWS, n, dout, &err), TSR_OK);
            back(dev, got, dout, sizeof got);
            for (int r = 0; r < ROWS; r++)
                if (got[r] != want[r])
                    fail_msg("width %d, offset %d, row %d: argmax %d, CPU %d", n, shift, r, got[r], want[r]);
            assert_int_equal(want[3], -1);
            dev->free(dx), dev->free(dout);
            free(x);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_combine),
        cmocka_unit_test(test_qk_norm_rope),
        cmocka_unit_test(test_argmax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
