/*
 * test_host.h - a host for the gemv plugins' unit tests: counted allocations
 * with a fail-at-N switch, parallel_for over a real 2-thread pool, params
 * from a table the test sets, set_error into a buffer.
 */
#ifndef CPU_GEMV_TEST_HOST_H
#define CPU_GEMV_TEST_HOST_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util/threadpool.h"
#include "kernels/cpu/ops.h"
#include "slots/tsr_gemv.h"

static char th_err[1024];
static atomic_long th_live, th_count, th_fail_at; /* fail_at: 0 = never */
static tsr_param th_params[8];
static int th_n_params;
static tsr_threadpool *th_pool;

static void th_log(const tsr_plugin_ctx *ctx, int level, const char *fmt, ...) {
    (void)ctx;
    if (level > TSR_LOG_WARN) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static void th_set_error(const tsr_plugin_ctx *ctx, const char *fmt, ...) {
    (void)ctx;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(th_err, sizeof th_err, fmt, ap);
    va_end(ap);
}

static void *th_alloc(const tsr_plugin_ctx *ctx, size_t size, size_t align) {
    (void)ctx;
    long n = atomic_fetch_add(&th_count, 1) + 1;
    long f = atomic_load(&th_fail_at);
    if (f && n >= f) return NULL;
    size_t sz = (size + align - 1) / align * align;
    void *p = aligned_alloc(align, sz ? sz : align);
    if (p) {
        memset(p, 0, sz);
        atomic_fetch_add(&th_live, 1);
    }
    return p;
}

static void th_free(const tsr_plugin_ctx *ctx, void *p) {
    (void)ctx;
    if (!p) return;
    atomic_fetch_sub(&th_live, 1);
    free(p);
}

static int th_dev_alloc(const tsr_plugin_ctx *ctx, size_t size, void **out) {
    (void)ctx, (void)size, (void)out;
    return TSR_ERR_UNSUPPORTED;
}
static void th_dev_free(const tsr_plugin_ctx *ctx, void *p) { (void)ctx, (void)p; }

static int th_parallel_for(const tsr_plugin_ctx *ctx, int64_t n, tsr_work_fn fn, void *arg) {
    (void)ctx;
    tsr_threadpool_run(th_pool, n, fn, arg);
    return TSR_OK;
}

static const tsr_param *th_param(const tsr_plugin_ctx *ctx, const char *name) {
    (void)ctx;
    for (int i = 0; i < th_n_params; i++)
        if (!strcmp(th_params[i].name, name)) return &th_params[i];
    return NULL;
}

static const tsr_host_api th_api = {
    .struct_size = sizeof(tsr_host_api), .version = 1, .log = th_log, .set_error = th_set_error,
    .alloc = th_alloc, .free = th_free, .dev_alloc = th_dev_alloc, .dev_free = th_dev_free,
    .parallel_for = th_parallel_for, .param = th_param,
};

static tsr_plugin_ctx th_ctx = {.host = &th_api, .name = "test"};

/* Param p.name set to p (replacing one of that name, else added). */
static void th_set(tsr_param p) {
    for (int i = 0; i < th_n_params; i++)
        if (!strcmp(th_params[i].name, p.name)) {
            th_params[i] = p;
            return;
        }
    th_params[th_n_params++] = p;
}

static void th_set_int(const char *name, int64_t v) {
    th_set((tsr_param){.name = name, .type = TSR_PARAM_INT, .v.i = v});
}

static void th_set_bool(const char *name, int v) {
    th_set((tsr_param){.name = name, .type = TSR_PARAM_BOOL, .v.b = v});
}

static void th_set_str(const char *name, const char *v) {
    th_set((tsr_param){.name = name, .type = TSR_PARAM_STRING, .v.s = v});
}

/* run_glu of nx rows of x through the gate/up handle h (f rows each) into
 * y against run() into gu (nx x 2f floats) followed by tsr_silu_mul over
 * each whole row into want (nx x f): TSR_OK when equal bit for bit, 1 when
 * they differ, or the failing call's status. */
static int th_glu_check(const tsr_gemv_i *g, void *inst, const void *h, int nx, const float *x, int64_t f,
                        const tsr_exec *ex, float *gu, float *want, float *y) {
    int rc = g->run(inst, h, nx, x, gu, ex);
    if (rc != TSR_OK) return rc;
    for (int i = 0; i < nx; i++) tsr_silu_mul(want + i * f, gu + i * 2 * f, gu + i * 2 * f + f, f);
    if ((rc = g->run_glu(inst, h, nx, x, y, ex)) != TSR_OK) return rc;
    return memcmp(y, want, (size_t)(nx * f) * sizeof *y) != 0;
}

#endif /* CPU_GEMV_TEST_HOST_H */
