/*
 * attn_test_host.h - a minimal plugin host for the tests of cpu_attention
 * and cpu_kv_cache: dlopen of a plugin from $TESSERA_CATALOG, the host
 * services (accounted zeroed allocation with fail-at-N, parallel_for over
 * core/util's thread pool, params, captured set_error) and one instance.
 * Header-only; tests include it once.
 */
#ifndef ATTN_TEST_HOST_H
#define ATTN_TEST_HOST_H

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util/threadpool.h"
#include "slots/tsr_plugin.h"

typedef struct th_inst {
    tsr_plugin_ctx ctx; /* first: callbacks cast ctx back to th_inst */
    tsr_host_api api;
    tsr_param params[8];
    int n_params;
    tsr_model_desc model;
    void *handle;
    const tsr_plugin_desc *desc;
    void *inst;
    int inited;
    tsr_threadpool *pool;
    char err[1024];
    int64_t live_allocs;
    uint64_t n_allocs, fail_at; /* the fail_at-th allocation (1-based, counted from 0 at set) fails */
} th_inst;

static void th_log(const tsr_plugin_ctx *ctx, int level, const char *fmt, ...) {
    (void)ctx;
    (void)level;
    (void)fmt;
}

static void th_set_error(const tsr_plugin_ctx *ctx, const char *fmt, ...) {
    th_inst *t = (th_inst *)ctx;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->err, sizeof t->err, fmt, ap);
    va_end(ap);
}

static void *th_alloc(const tsr_plugin_ctx *ctx, size_t size, size_t align) {
    th_inst *t = (th_inst *)ctx;
    t->n_allocs++;
    if (t->fail_at && t->n_allocs == t->fail_at) return NULL;
    void *p = NULL;
    if (align < sizeof(void *)) align = sizeof(void *);
    if (posix_memalign(&p, align, size ? size : 1)) return NULL;
    memset(p, 0, size);
    t->live_allocs++;
    return p;
}

static void th_free(const tsr_plugin_ctx *ctx, void *p) {
    th_inst *t = (th_inst *)ctx;
    if (!p) return;
    t->live_allocs--;
    free(p);
}

static int th_dev_alloc(const tsr_plugin_ctx *ctx, size_t size, void **out) {
    (void)ctx;
    (void)size;
    *out = NULL;
    return TSR_ERR_UNSUPPORTED;
}

static void th_dev_free(const tsr_plugin_ctx *ctx, void *p) {
    (void)ctx;
    (void)p;
}

static int th_parallel_for(const tsr_plugin_ctx *ctx, int64_t n, tsr_work_fn fn, void *arg) {
    th_inst *t = (th_inst *)ctx;
    tsr_threadpool_run(t->pool, n, fn, arg);
    return TSR_OK;
}

static const tsr_param *th_param(const tsr_plugin_ctx *ctx, const char *name) {
    th_inst *t = (th_inst *)ctx;
    for (int i = 0; i < t->n_params; i++)
        if (!strcmp(t->params[i].name, name)) return &t->params[i];
    return NULL;
}

/* The catalog's library path of plugin name, or NULL (test then skips). */
static const char *th_lib_path(const char *name, char *buf, size_t size) {
    const char *dir = getenv("TESSERA_CATALOG");
    if (!dir) return NULL;
    snprintf(buf, size, "%s/lib%s.so", dir, name);
    return buf;
}

/* Open plugin name and make an instance for model with params (NULL-named
 * end). Returns init's status (-100 if the library cannot be opened). */
static int th_open(th_inst *t, const char *name, const tsr_model_desc *model, const tsr_param *params,
                   tsr_threadpool *pool) {
    memset(t, 0, sizeof *t);
    char path[1024];
    if (!th_lib_path(name, path, sizeof path)) return -100;
    t->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!t->handle) {
        snprintf(t->err, sizeof t->err, "%s", dlerror());
        return -100;
    }
    tsr_plugin_entry_fn entry = (tsr_plugin_entry_fn)dlsym(t->handle, TSR_PLUGIN_ENTRY_NAME);
    if (!entry) return -100;
    t->desc = entry();
    t->model = *model;
    for (; params && params[t->n_params].name && t->n_params < 8; t->n_params++)
        t->params[t->n_params] = params[t->n_params];
    /* members past version 1 (auxiliary models) stay NULL: these plugins never call them */
    t->api = (tsr_host_api){.struct_size = sizeof(tsr_host_api), .version = 1, .log = th_log,
                            .set_error = th_set_error, .alloc = th_alloc, .free = th_free,
                            .dev_alloc = th_dev_alloc, .dev_free = th_dev_free,
                            .parallel_for = th_parallel_for, .param = th_param};
    t->ctx.host = &t->api;
    t->ctx.name = t->desc->name;
    t->ctx.device = TSR_DEVICE_CPU;
    t->ctx.model = &t->model;
    t->ctx.params = t->params;
    t->ctx.n_params = t->n_params;
    t->pool = pool;
    t->inst = calloc(1, t->desc->instance_size ? t->desc->instance_size : 1);
    if (!t->inst) return TSR_ERR_NOMEM;
    t->inited = 1;
    return t->desc->init(t->inst, &t->ctx);
}

static void th_close(th_inst *t) {
    if (t->inited && t->desc->fini) t->desc->fini(t->inst);
    free(t->inst);
    if (t->handle) dlclose(t->handle);
    memset(t, 0, sizeof *t);
}

#endif /* ATTN_TEST_HOST_H */
