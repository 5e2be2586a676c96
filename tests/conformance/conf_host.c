/* conf_host.c - see conf_host.h. */
#include "conf_host.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Host memory carries a header in front: the caller's size and the start of
 * the underlying block, so free can account and release it. */
typedef struct conf_hdr {
    void *base;
    size_t size;
    conf_inst *owner;
    size_t pad;
} conf_hdr;

static conf_inst *inst_of(const tsr_plugin_ctx *ctx) { return (conf_inst *)ctx->host_data; }

static void h_log(const tsr_plugin_ctx *ctx, int level, const char *fmt, ...) {
    if (inst_of(ctx)->quiet && level > TSR_LOG_ERROR) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[%s] ", ctx->name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void h_set_error(const tsr_plugin_ctx *ctx, const char *fmt, ...) {
    conf_inst *ci = inst_of(ctx);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ci->err, sizeof ci->err, fmt, ap);
    va_end(ap);
}

/* Plugins allocate from their workers too (cpu_gemv's GEMM takes a panel
 * buffer per worker): the counters and the fault countdown under one lock. */
static pthread_mutex_t alloc_mu = PTHREAD_MUTEX_INITIALIZER;

static void *h_alloc(const tsr_plugin_ctx *ctx, size_t size, size_t align) {
    conf_inst *ci = inst_of(ctx);
    pthread_mutex_lock(&alloc_mu);
    const int fail = ci->fail_at && --ci->fail_at == 0;
    pthread_mutex_unlock(&alloc_mu);
    if (fail) return NULL;
    if (align < 16 || (align & (align - 1))) align = 16;
    size_t total;
    if (__builtin_add_overflow(size, sizeof(conf_hdr) + align, &total)) return NULL;
    void *base = calloc(1, total);
    if (!base) return NULL;
    uintptr_t p = ((uintptr_t)base + sizeof(conf_hdr) + align - 1) & ~(uintptr_t)(align - 1);
    conf_hdr *h = (conf_hdr *)p - 1;
    h->base = base;
    h->size = size;
    h->owner = ci;
    pthread_mutex_lock(&alloc_mu);
    ci->live_allocs++;
    ci->live_bytes += size;
    pthread_mutex_unlock(&alloc_mu);
    return (void *)p;
}

static void h_free(const tsr_plugin_ctx *ctx, void *p) {
    if (!p) return;
    conf_hdr *h = (conf_hdr *)p - 1;
    conf_inst *ci = inst_of(ctx);
    pthread_mutex_lock(&alloc_mu);
    ci->live_allocs--;
    ci->live_bytes -= h->size;
    pthread_mutex_unlock(&alloc_mu);
    free(h->base);
}

static int h_dev_alloc(const tsr_plugin_ctx *ctx, size_t size, void **out) {
    (void)ctx;
    (void)size;
    *out = NULL;
    return TSR_ERR_UNSUPPORTED;
}

static void h_dev_free(const tsr_plugin_ctx *ctx, void *p) {
    (void)ctx;
    (void)p;
}

static int h_parallel_for(const tsr_plugin_ctx *ctx, int64_t n, tsr_work_fn fn, void *arg) {
    tsr_threadpool_run(inst_of(ctx)->pool, n, fn, arg);
    return TSR_OK;
}

static const tsr_param *h_param(const tsr_plugin_ctx *ctx, const char *name) {
    conf_inst *ci = inst_of(ctx);
    for (int i = 0; i < ci->n_params; i++)
        if (!strcmp(ci->params[i].name, name)) return &ci->params[i];
    return NULL;
}

/* Version 2: this host lends no models. */
static int h_model_open(const tsr_plugin_ctx *ctx, const char *path, const char *assembly, int n_layers,
                        tsr_aux_model **out) {
    (void)path, (void)assembly, (void)n_layers;
    *out = NULL;
    h_set_error(ctx, "the test host lends no models");
    return TSR_ERR_UNSUPPORTED;
}
static void h_model_close(const tsr_plugin_ctx *ctx, tsr_aux_model *m) { (void)ctx, (void)m; }
static int h_model_dims(const tsr_plugin_ctx *ctx, const tsr_aux_model *m, int *vocab, int *max_ctx) {
    (void)m, (void)vocab, (void)max_ctx;
    h_set_error(ctx, "the test host lends no models");
    return TSR_ERR_UNSUPPORTED;
}
static int h_seq_open(const tsr_plugin_ctx *ctx, tsr_aux_model *m, int max_tokens, tsr_aux_seq **out) {
    (void)m, (void)max_tokens;
    *out = NULL;
    h_set_error(ctx, "the test host lends no models");
    return TSR_ERR_UNSUPPORTED;
}
static void h_seq_close(const tsr_plugin_ctx *ctx, tsr_aux_seq *s) { (void)ctx, (void)s; }
static int h_seq_forward(const tsr_plugin_ctx *ctx, tsr_aux_seq *s, const int32_t *tokens, int n, float *logits) {
    (void)s, (void)tokens, (void)n, (void)logits;
    h_set_error(ctx, "the test host lends no models");
    return TSR_ERR_UNSUPPORTED;
}
static int h_seq_truncate(const tsr_plugin_ctx *ctx, tsr_aux_seq *s, int n_tokens) {
    (void)s, (void)n_tokens;
    h_set_error(ctx, "the test host lends no models");
    return TSR_ERR_UNSUPPORTED;
}

const char *conf_catalog_dir(void) {
    const char *d = getenv("TESSERA_CATALOG");
    return d && *d ? d : NULL;
}

int conf_catalog_open(const char *name, tsr_manifest **m, conf_lib *lib) {
    const char *cat = conf_catalog_dir();
    if (!cat) {
        fprintf(stderr, "TESSERA_CATALOG is not set: run through ctest\n");
        return -1;
    }
    char path[1024], why[512];
    snprintf(path, sizeof path, "%s/%s.yaml", cat, name);
    tsr_diag d;
    tsr_diag_init(&d);
    int rc = tsr_manifest_load(path, m, &d);
    if (rc) tsr_diag_print(&d, stderr);
    tsr_diag_free(&d);
    if (rc) return -1;
    if (conf_lib_open(*m, lib, why, sizeof why)) {
        fprintf(stderr, "%s\n", why);
        return -1;
    }
    return 0;
}

/* Required members per slot, as byte offsets into the interface table. */
static int required_missing(tsr_slot s, const void *iface, const char **which) {
    const uint32_t *hdr = iface;
    static const struct {
        tsr_slot slot;
        size_t off;
        const char *name;
    } req[] = {
        {TSR_SLOT_GEMV, offsetof(tsr_gemv_i, prepare), "prepare"},
        {TSR_SLOT_GEMV, offsetof(tsr_gemv_i, run), "run"},
        {TSR_SLOT_ATTENTION, offsetof(tsr_attention_i, run), "run"},
        {TSR_SLOT_KV_CACHE, offsetof(tsr_kv_cache_i, seq_alloc), "seq_alloc"},
        {TSR_SLOT_KV_CACHE, offsetof(tsr_kv_cache_i, seq_free), "seq_free"},
        {TSR_SLOT_KV_CACHE, offsetof(tsr_kv_cache_i, append), "append"},
        {TSR_SLOT_KV_CACHE, offsetof(tsr_kv_cache_i, view), "view"},
        {TSR_SLOT_KV_CACHE, offsetof(tsr_kv_cache_i, truncate), "truncate"},
        {TSR_SLOT_DRAFTER, offsetof(tsr_drafter_i, propose), "propose"},
        {TSR_SLOT_EXPERT_CACHE, offsetof(tsr_expert_cache_i, attach), "attach"},
        {TSR_SLOT_EXPERT_CACHE, offsetof(tsr_expert_cache_i, lookup), "lookup"},
        {TSR_SLOT_EXPERT_CACHE, offsetof(tsr_expert_cache_i, stats), "stats"},
    };
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
        if (req[i].slot != s) continue;
        void *fn = NULL;
        if (hdr[0] >= req[i].off + sizeof(void *)) memcpy(&fn, (const char *)iface + req[i].off, sizeof fn);
        if (!fn) {
            *which = req[i].name;
            return 1;
        }
    }
    return 0;
}

int conf_lib_open_path(const char *path, conf_lib *lib, char *why, size_t size) {
    memset(lib, 0, sizeof *lib);
    lib->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib->handle) {
        snprintf(why, size, "dlopen %s: %s", path, dlerror());
        return -1;
    }
    tsr_plugin_entry_fn entry;
    void *sym = dlsym(lib->handle, TSR_PLUGIN_ENTRY_NAME);
    memcpy(&entry, &sym, sizeof entry);
    if (!entry) {
        snprintf(why, size, "%s: no symbol %s", path, TSR_PLUGIN_ENTRY_NAME);
        conf_lib_close(lib);
        return -1;
    }
    const tsr_plugin_desc *d = entry();
    const char *missing = NULL;
    if (!d || d->abi_major != TSR_ABI_MAJOR || d->abi_minor > TSR_ABI_MINOR || !d->init || !d->iface ||
        d->slot >= TSR_SLOT_COUNT || !d->name) {
        snprintf(why, size, "%s: bad descriptor (ABI, init, iface, slot or name)", path);
        conf_lib_close(lib);
        return -1;
    }
    if (required_missing((tsr_slot)d->slot, d->iface, &missing)) {
        snprintf(why, size, "%s: required member %s is NULL", path, missing);
        conf_lib_close(lib);
        return -1;
    }
    lib->desc = d;
    return 0;
}

int conf_lib_open(const tsr_manifest *m, conf_lib *lib, char *why, size_t size) {
    if (conf_lib_open_path(m->library_path, lib, why, size)) return -1;
    const tsr_plugin_desc *d = lib->desc;
    if (strcmp(d->name, m->name) || d->slot != (uint32_t)m->slot || strcmp(d->version, m->version) ||
        !!(d->caps & TSR_CAP_EXACT) != !!m->exact) {
        snprintf(why, size, "%s: descriptor disagrees with manifest %s (name, slot, version or exactness)",
                 m->library_path, m->path);
        conf_lib_close(lib);
        return -1;
    }
    return 0;
}

void conf_lib_close(conf_lib *lib) {
    if (lib->handle) dlclose(lib->handle);
    memset(lib, 0, sizeof *lib);
}

static int set_param(conf_inst *ci, const tsr_manifest *m, const char *kv) {
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) return -1;
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(eq - kv), kv);
    const char *val = eq + 1;
    int i = 0;
    for (; i < ci->n_params; i++)
        if (!strcmp(ci->params[i].name, name)) break;
    if (i == ci->n_params) {
        snprintf(ci->err, sizeof ci->err, "case sets param '%s' that %s does not declare", name,
                 m ? m->name : "the plugin");
        return -1;
    }
    tsr_param *p = &ci->params[i];
    char *end;
    errno = 0;
    switch (p->type) {
    case TSR_PARAM_INT: p->v.i = strtoll(val, &end, 10); break;
    case TSR_PARAM_FLOAT: p->v.f = strtod(val, &end); break;
    case TSR_PARAM_BOOL:
        p->v.b = !strcmp(val, "true") || !strcmp(val, "1");
        end = (char *)val + strlen(val);
        break;
    default:
        snprintf(ci->strs[i], sizeof ci->strs[i], "%s", val);
        p->v.s = ci->strs[i];
        end = (char *)val + strlen(val);
        break;
    }
    if (*end || errno) {
        snprintf(ci->err, sizeof ci->err, "param %s: bad value '%s'", name, val);
        return -1;
    }
    return 0;
}

int conf_inst_new(const tsr_plugin_desc *desc, const tsr_manifest *m, const tsr_model_desc *model,
                  const char *const *set, int n_set, tsr_threadpool *pool, conf_inst **out) {
    conf_inst *ci = calloc(1, sizeof *ci);
    *out = ci;
    if (!ci) return TSR_ERR_NOMEM;
    ci->api = (tsr_host_api){.struct_size = sizeof(tsr_host_api), .version = 5, .log = h_log,
                             .set_error = h_set_error, .alloc = h_alloc, .free = h_free,
                             .dev_alloc = h_dev_alloc, .dev_free = h_dev_free, .parallel_for = h_parallel_for,
                             .param = h_param, .model_open = h_model_open, .model_close = h_model_close,
                             .model_dims = h_model_dims, .seq_open = h_seq_open, .seq_close = h_seq_close,
                             .seq_forward = h_seq_forward, .seq_truncate = h_seq_truncate};
    ci->desc = desc;
    ci->pool = pool;
    ci->model = *model;
    for (int i = 0; m && i < m->n_params && i < CONF_MAX_PARAMS; i++) {
        ci->params[i] = m->params[i].def;
        ci->params[i].name = m->params[i].name;
        if (ci->params[i].type == TSR_PARAM_STRING) {
            snprintf(ci->strs[i], sizeof ci->strs[i], "%s", m->params[i].def.v.s ? m->params[i].def.v.s : "");
            ci->params[i].v.s = ci->strs[i];
        }
        ci->n_params++;
    }
    for (int i = 0; i < n_set; i++)
        if (set_param(ci, m, set[i])) return TSR_ERR_INVALID;
    ci->ctx = (tsr_plugin_ctx){&ci->api, ci, desc->name, TSR_DEVICE_CPU, 0, &ci->model, ci->params,
                               ci->n_params};
    void *inst = h_alloc(&ci->ctx, desc->instance_size ? desc->instance_size : 1, 64);
    if (!inst) return TSR_ERR_NOMEM;
    ci->ref = (tsr_slot_ref){(tsr_slot)desc->slot, desc->name, desc->version, desc->iface, inst,
                             &ci->ctx, !!(desc->caps & TSR_CAP_EXACT), 0, 0};
    int rc = desc->init(inst, &ci->ctx);
    if (rc != TSR_OK && !ci->err[0]) snprintf(ci->err, sizeof ci->err, "init failed (%d) with no message", rc);
    return rc;
}

void conf_inst_free(conf_inst *ci) {
    if (!ci) return;
    if (ci->ref.inst) {
        if (ci->desc->fini) ci->desc->fini(ci->ref.inst);
        h_free(&ci->ctx, ci->ref.inst);
    }
    free(ci);
}
