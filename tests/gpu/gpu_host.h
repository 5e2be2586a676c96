/*
 * gpu_host.h - the host services of a GPU test that calls plugins directly
 * (dlopen, init, its slot's functions) instead of through an engine: logs
 * to stdout, the last error in plugin_err, device memory through core/cuda,
 * work run inline, the params the test sets on ctx->params (none: the
 * plugin's defaults), no auxiliary models, nothing mapped to give back; and
 * the instances themselves, and copies to and from the device.
 * Include once, after cmocka.h, in a TESSERA_CUDA build.
 */
#ifndef TSR_TESTS_GPU_HOST_H
#define TSR_TESTS_GPU_HOST_H

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda/device.h"
#include "slots/tsr_plugin.h"

static char plugin_err[1024];

static void h_log(const tsr_plugin_ctx *ctx, int level, const char *fmt, ...) {
    (void)ctx, (void)level;
    va_list ap;
    va_start(ap, fmt);
    printf("# plugin: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

static void h_set_error(const tsr_plugin_ctx *ctx, const char *fmt, ...) {
    (void)ctx;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(plugin_err, sizeof plugin_err, fmt, ap);
    va_end(ap);
}

static void *h_alloc(const tsr_plugin_ctx *ctx, size_t size, size_t align) {
    (void)ctx;
    void *p = NULL;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size ? size : 1)) return NULL;
    memset(p, 0, size);
    return p;
}

static void h_free(const tsr_plugin_ctx *ctx, void *p) {
    (void)ctx;
    free(p);
}

static int h_dev_alloc(const tsr_plugin_ctx *ctx, size_t size, void **out) {
    (void)ctx;
    tsr_error err;
    tsr_error_clear(&err);
    *out = tsr_cuda_malloc(size, &err);
    return *out ? TSR_OK : TSR_ERR_NOMEM;
}

static void h_dev_free(const tsr_plugin_ctx *ctx, void *p) {
    (void)ctx;
    tsr_cuda_free(p);
}

static int h_parallel_for(const tsr_plugin_ctx *ctx, int64_t n, tsr_work_fn fn, void *arg) {
    (void)ctx;
    if (n > 0) fn(arg, 0, n, 0);
    return TSR_OK;
}

/* The params a test sets on an instance (ctx->params); others: defaults. */
static const tsr_param *h_param(const tsr_plugin_ctx *ctx, const char *name) {
    for (int i = 0; i < ctx->n_params; i++)
        if (!strcmp(ctx->params[i].name, name)) return &ctx->params[i];
    return NULL;
}

static int h_model_open(const tsr_plugin_ctx *ctx, const char *path, const char *assembly, int n_layers,
                        tsr_aux_model **out) {
    (void)ctx, (void)path, (void)assembly, (void)n_layers;
    *out = NULL;
    return TSR_ERR_UNSUPPORTED;
}
static void h_model_close(const tsr_plugin_ctx *ctx, tsr_aux_model *m) { (void)ctx, (void)m; }
static int h_model_dims(const tsr_plugin_ctx *ctx, const tsr_aux_model *m, int *vocab, int *max_ctx) {
    (void)ctx, (void)m, (void)vocab, (void)max_ctx;
    return TSR_ERR_UNSUPPORTED;
}
static int h_seq_open(const tsr_plugin_ctx *ctx, tsr_aux_model *m, int max_tokens, tsr_aux_seq **out) {
    (void)ctx, (void)m, (void)max_tokens;
    *out = NULL;
    return TSR_ERR_UNSUPPORTED;
}
static void h_seq_close(const tsr_plugin_ctx *ctx, tsr_aux_seq *s) { (void)ctx, (void)s; }
static int h_seq_forward(const tsr_plugin_ctx *ctx, tsr_aux_seq *s, const int32_t *tokens, int n, float *logits) {
    (void)ctx, (void)s, (void)tokens, (void)n, (void)logits;
    return TSR_ERR_UNSUPPORTED;
}
static int h_seq_truncate(const tsr_plugin_ctx *ctx, tsr_aux_seq *s, int n_tokens) {
    (void)ctx, (void)s, (void)n_tokens;
    return TSR_ERR_UNSUPPORTED;
}
static uint64_t h_weight_done(const tsr_plugin_ctx *ctx, const void *data, uint64_t nbytes) {
    (void)ctx, (void)data, (void)nbytes;
    return 0;
}

static const tsr_host_api host_api = {
    sizeof(tsr_host_api), 3, h_log, h_set_error, h_alloc, h_free, h_dev_alloc, h_dev_free, h_parallel_for, h_param,
    h_model_open, h_model_close, h_model_dims, h_seq_open, h_seq_close, h_seq_forward, h_seq_truncate,
    h_weight_done,
};

/* One instance of the catalog's plugin name (its slot checked) for md and
 * params, initialised (ctx, md and params live as long as the instance, as
 * the ABI asks of a host); gpu_instance_free finishes and unloads it. */
typedef struct gpu_instance {
    void *handle;
    const tsr_plugin_desc *desc;
    tsr_model_desc md;
    tsr_param params[4];
    tsr_plugin_ctx ctx;
    void *inst;
} gpu_instance;

static gpu_instance *gpu_instance_new(const char *name, int slot, const tsr_model_desc *md,
                                     const tsr_param *params, int n_params) {
    gpu_instance *in = calloc(1, sizeof *in);
    assert_non_null(in);
    const char *cat = getenv("TESSERA_CATALOG");
    char path[4096];
    snprintf(path, sizeof path, "%s/lib%s.so", cat ? cat : "build/catalog", name);
    in->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!in->handle) fail_msg("dlopen %s: %s", path, dlerror());
    tsr_plugin_entry_fn entry = (tsr_plugin_entry_fn)dlsym(in->handle, TSR_PLUGIN_ENTRY_NAME);
    assert_non_null(entry);
    in->desc = entry();
    assert_non_null(in->desc);
    assert_string_equal(in->desc->name, name);
    assert_int_equal(in->desc->slot, slot);
    in->md = *md;
    assert_true(n_params <= 4);
    if (n_params) memcpy(in->params, params, (size_t)n_params * sizeof *params);
    in->ctx = (tsr_plugin_ctx){.host = &host_api, .name = in->desc->name, .device = TSR_DEVICE_CUDA,
                               .model = &in->md, .params = in->params, .n_params = n_params};
    if (posix_memalign(&in->inst, 64, in->desc->instance_size)) fail_msg("out of memory");
    memset(in->inst, 0, in->desc->instance_size);
    plugin_err[0] = 0;
    if (in->desc->init(in->inst, &in->ctx) != TSR_OK) fail_msg("%s init: %s", name, plugin_err);
    return in;
}

static void gpu_instance_free(gpu_instance *in) {
    if (in->desc->fini) in->desc->fini(in->inst);
    free(in->inst);
    dlclose(in->handle);
    free(in);
}

static void gpu_upload(void *dst, const void *src, size_t bytes) {
    tsr_error err;
    tsr_error_clear(&err);
    if (tsr_cuda_upload(dst, src, bytes, &err) != TSR_OK) fail_msg("upload: %s", err.msg);
}

static void gpu_download(void *dst, const void *src, size_t bytes) {
    tsr_error err;
    tsr_error_clear(&err);
    if (tsr_cuda_sync(&err) != TSR_OK || tsr_cuda_download(dst, src, bytes, &err) != TSR_OK)
        fail_msg("download: %s", err.msg);
}

#endif /* TSR_TESTS_GPU_HOST_H */
