/*
 * The CPU backend's per-row ops split over a thread pool (a pass of many
 * rows: prefill) against the same ops run on the calling thread alone:
 * every output bit-identical, for row counts that split unevenly over the
 * pool and for one row. Outputs start as NaN, so a row no worker wrote
 * differs. The ops' arithmetic itself is checked against double precision
 * by test_ops; what is checked here is the split by rows (each row computed
 * once, as it would be alone, whatever the thread count).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/runtime/backend.h"
#include "core/util/threadpool.h"
#include "slots/tsr_plugin.h"

enum { HIDDEN = 1536, HEADS = 12, KV_HEADS = 2, HEAD_DIM = 128, FFN = 4096, VOCAB = 300 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float rndf(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng >> 40) * 0x1p-24f * 2.0f - 1.0f;
}
static float *rnd_buf(int64_t n) {
    float *p = malloc((size_t)n * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = rndf();
    return p;
}
static float *nan_buf(int64_t n) {
    float *p = malloc((size_t)n * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

/* The outputs of every per-row op for `rows` rows, with the pool or without. */
typedef struct outs {
    float *embed, *norm, *x_added, *add_norm, *rope_q, *rq, *rk, *rv, *silu;
} outs;

static void run_ops(const tsr_backend *be, tsr_threadpool *pool, int rows, outs *o) {
    const int64_t qd = HEADS * HEAD_DIM, kvd = KV_HEADS * HEAD_DIM;
    rng = 12345; /* the same inputs for both runs */
    float *table = rnd_buf((int64_t)VOCAB * HIDDEN), *x = rnd_buf((int64_t)rows * HIDDEN);
    float *delta = rnd_buf((int64_t)rows * HIDDEN), *w = rnd_buf(HIDDEN);
    float *qkv = rnd_buf((int64_t)rows * (qd + 2 * kvd)), *gu = rnd_buf((int64_t)rows * 2 * FFN);
    int32_t *ids = malloc((size_t)rows * sizeof *ids);
    assert_non_null(ids);
    for (int r = 0; r < rows; r++) ids[r] = (r * 37 + 11) % VOCAB;
    tsr_rope rope;
    assert_int_equal(tsr_rope_init(&rope, HEAD_DIM, 500000.0f, 0, 0, 0, 0, 0, 0), 0);
    tsr_error err;
    be->set_pool(pool);

    o->embed = nan_buf((int64_t)rows * HIDDEN);
    assert_int_equal(be->embed(o->embed, table, TSR_DTYPE_F32, HIDDEN, VOCAB, ids, rows, &err), TSR_OK);
    { /* ids outside the table read row 0 (a pipelined pass after an argmax of -1) */
        const int32_t bad[2] = {-1, VOCAB};
        float *e2 = nan_buf(2 * HIDDEN);
        assert_int_equal(be->embed(e2, table, TSR_DTYPE_F32, HIDDEN, VOCAB, bad, 2, &err), TSR_OK);
        assert_memory_equal(e2, table, HIDDEN * sizeof(float));
        assert_memory_equal(e2 + HIDDEN, table, HIDDEN * sizeof(float));
        free(e2);
    }
    o->norm = nan_buf((int64_t)rows * HIDDEN);
    assert_int_equal(be->rmsnorm(o->norm, x, w, rows, HIDDEN, 1e-5f, &err), TSR_OK);
    o->x_added = x; /* x += delta in place */
    o->add_norm = nan_buf((int64_t)rows * HIDDEN);
    assert_int_equal(be->add_rmsnorm(x, delta, o->add_norm, w, rows, HIDDEN, 1e-5f, &err), TSR_OK);
    o->rope_q = malloc((size_t)(rows * qd) * sizeof(float));
    assert_non_null(o->rope_q);
    for (int r = 0; r < rows; r++) memcpy(o->rope_q + r * qd, qkv + r * (qd + 2 * kvd), (size_t)qd * sizeof(float));
    assert_int_equal(be->rope(&rope, NULL, o->rope_q, rows, HEADS, 7, NULL, &err), TSR_OK);
    o->rq = nan_buf(rows * qd), o->rk = nan_buf(rows * kvd), o->rv = nan_buf(rows * kvd);
    assert_int_equal(be->rope_split(&rope, NULL, o->rq, o->rk, o->rv, qkv, rows, HEADS, KV_HEADS, 7, NULL, &err),
                     TSR_OK);
    o->silu = nan_buf((int64_t)rows * FFN);
    assert_int_equal(be->silu_mul_cat(o->silu, gu, rows, FFN, &err), TSR_OK);
    be->set_pool(NULL);
    free(table), free(delta), free(w), free(qkv), free(gu), free(ids);
}

static void free_outs(outs *o) {
    free(o->embed), free(o->norm), free(o->x_added), free(o->add_norm), free(o->rope_q);
    free(o->rq), free(o->rk), free(o->rv), free(o->silu);
}

static void same(const float *a, const float *b, int64_t n, const char *what, int rows) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a) != 0 || isnan(a[i]))
            fail_msg("%s, %d rows: element %lld is %g alone, %g on the pool", what, rows, (long long)i, (double)a[i],
                     (double)b[i]);
}

static void test_rows_split_over_the_pool(void **state) {
    (void)state;
    const tsr_backend *be = tsr_backend_cpu();
    assert_non_null(be->set_pool);
    tsr_threadpool *pool = tsr_threadpool_new(3);
    assert_non_null(pool);
    const int counts[] = {1, 2, 7, 64, 128};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
        const int rows = counts[c];
        const int64_t qd = HEADS * HEAD_DIM, kvd = KV_HEADS * HEAD_DIM;
        outs alone, pooled;
        run_ops(be, NULL, rows, &alone);
        run_ops(be, pool, rows, &pooled);
        same(alone.embed, pooled.embed, (int64_t)rows * HIDDEN, "embed", rows);
        same(alone.norm, pooled.norm, (int64_t)rows * HIDDEN, "rmsnorm", rows);
        same(alone.x_added, pooled.x_added, (int64_t)rows * HIDDEN, "add_rmsnorm's residual", rows);
        same(alone.add_norm, pooled.add_norm, (int64_t)rows * HIDDEN, "add_rmsnorm", rows);
        same(alone.rope_q, pooled.rope_q, rows * qd, "rope", rows);
        same(alone.rq, pooled.rq, rows * qd, "rope_split q", rows);
        same(alone.rk, pooled.rk, rows * kvd, "rope_split k", rows);
        same(alone.rv, pooled.rv, rows * kvd, "rope_split v", rows);
        same(alone.silu, pooled.silu, (int64_t)rows * FFN, "silu_mul_cat", rows);
        free_outs(&alone);
        free_outs(&pooled);
    }
    tsr_threadpool_free(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_split_over_the_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
