#include "engine.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../util/checked.h"
#include "assembly.h"
#include "catalog.h"
#include "checker.h"
#include "diag.h"
#include "halloc.h"
#include "loader.h"

/* Header before every block a plugin allocates: a list per plugin, so what
 * a plugin forgets to free is freed with its engine. */
typedef struct ahdr {
    struct ahdr *prev, *next;
    void *raw;
    size_t size;
    uint64_t magic;
} ahdr;
#define AHDR_MAGIC 0x74737261686472ull

typedef struct eslot {
    tsr_slot_ref ref;
    struct tsr_engine *e;
    const tsr_manifest *m;
    void *dl;
    const tsr_plugin_desc *desc;
    tsr_plugin_ctx ctx;
    tsr_param *params;
    int n_params;
    ahdr *allocs;
    uint64_t bytes;
    int inited;
    char err[512];
} eslot;

struct tsr_engine {
    tsr_catalog *cat;
    tsr_assembly *asmb;
    tsr_plan *plan;
    int device;
    tsr_threadpool *pool;
    tsr_model_desc model;
    int has_model;
    char arch[32];
    pthread_mutex_t mu;
    const tsr_aux_api *aux; /* models lent by the runtime, or NULL */
    eslot slots[TSR_SLOT_COUNT];
};

/* --- host services ------------------------------------------------------------ */

static eslot *ctx_slot(const tsr_plugin_ctx *ctx) { return (eslot *)ctx->host_data; }

static int log_threshold(void) {
    const char *v = getenv("TESSERA_LOG_LEVEL");
    return v && v[0] >= '0' && v[0] <= '3' ? v[0] - '0' : TSR_LOG_WARN;
}

__attribute__((format(printf, 3, 4))) static void h_log(const tsr_plugin_ctx *ctx, int level, const char *fmt, ...) {
    if (level > log_threshold()) return;
    static const char *const names[] = {"error", "warning", "info", "debug"};
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tessera: [%s] %s: %s\n", ctx && ctx->name ? ctx->name : "?",
            level >= 0 && level <= 3 ? names[level] : "log", buf);
}

__attribute__((format(printf, 2, 3))) static void h_set_error(const tsr_plugin_ctx *ctx, const char *fmt, ...) {
    eslot *s = ctx_slot(ctx);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
}

/* Large blocks (prepared weights, caches) in transparent huge pages where
 * the kernel gives them only on request (THP "madvise"): a block read from
 * end to end each token then costs a TLB entry per 2 MiB instead of per
 * 4 KiB, and the hardware prefetchers, which stop at page boundaries, run
 * on. Such a block starts on a 2 MiB boundary; its whole 2 MiB pages are
 * advised, its tail stays in 4 KiB pages (no memory beyond size is made
 * resident). The advice must precede the first touch (the memset below); a
 * hint, ignored where THP is off. */
#define HUGE_PAGE ((size_t)2 << 20)

static void *h_alloc(const tsr_plugin_ctx *ctx, size_t size, size_t align) {
    eslot *s = ctx_slot(ctx);
    if (align < 16) align = 16;
    if (align & (align - 1)) return NULL;
    if (size >= HUGE_PAGE && align < HUGE_PAGE) align = HUGE_PAGE;
    uint64_t total; /* size comes from plugins (instance_size, their requests) */
    if (tsr_add_u64(size, sizeof(ahdr) + align, &total) || total > SIZE_MAX) return NULL;
    uint8_t *raw = tsr_halloc(total);
    if (!raw) return NULL;
    uintptr_t p = ((uintptr_t)(raw + sizeof(ahdr)) + align - 1) & ~(uintptr_t)(align - 1);
    ahdr *h = (ahdr *)p - 1;
    h->raw = raw;
    h->size = size;
    h->magic = AHDR_MAGIC;
#ifdef MADV_HUGEPAGE
    if (size >= HUGE_PAGE) (void)madvise((void *)p, size & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
    memset((void *)p, 0, size);
    pthread_mutex_lock(&s->e->mu);
    h->prev = NULL;
    h->next = s->allocs;
    if (s->allocs) s->allocs->prev = h;
    s->allocs = h;
    s->bytes += size;
    pthread_mutex_unlock(&s->e->mu);
    return (void *)p;
}

static void h_free(const tsr_plugin_ctx *ctx, void *p) {
    if (!p) return;
    eslot *s = ctx_slot(ctx);
    ahdr *h = (ahdr *)p - 1;
    TSR_ASSERT(h->magic == AHDR_MAGIC); /* a pointer this plugin did not get from alloc */
    pthread_mutex_lock(&s->e->mu);
    if (h->prev) h->prev->next = h->next;
    else s->allocs = h->next;
    if (h->next) h->next->prev = h->prev;
    s->bytes -= h->size;
    pthread_mutex_unlock(&s->e->mu);
    h->magic = 0;
    tsr_hfree(h->raw);
}

#ifdef TESSERA_CUDA
#include "../cuda/device.h"
#endif

static int h_dev_alloc(const tsr_plugin_ctx *ctx, size_t size, void **out) {
    *out = NULL;
#ifdef TESSERA_CUDA
    eslot *s = ctx_slot(ctx);
    tsr_error err;
    tsr_error_clear(&err);
    if (!(*out = tsr_cuda_malloc(size, &err))) {
        h_set_error(ctx, "%s", err.msg);
        return err.code;
    }
    pthread_mutex_lock(&s->e->mu);
    s->bytes += size;
    pthread_mutex_unlock(&s->e->mu);
    return TSR_OK;
#else
    (void)size;
    h_set_error(ctx, "this tessera was built without CUDA");
    return TSR_ERR_UNSUPPORTED;
#endif
}

static void h_dev_free(const tsr_plugin_ctx *ctx, void *p) {
#ifdef TESSERA_CUDA
    (void)ctx;
    tsr_cuda_free(p);
#else
    (void)ctx;
    (void)p;
#endif
}

static int h_parallel_for(const tsr_plugin_ctx *ctx, int64_t n, tsr_work_fn fn, void *arg) {
    eslot *s = ctx_slot(ctx);
    if (n <= 0) return TSR_OK;
    tsr_threadpool_run(s->e->pool, n, fn, arg);
    return TSR_OK;
}

static const tsr_param *h_param(const tsr_plugin_ctx *ctx, const char *name) {
    eslot *s = ctx_slot(ctx);
    for (int i = 0; name && i < s->n_params; i++)
        if (!strcmp(s->params[i].name, name)) return &s->params[i];
    return NULL;
}

/* Version 2: models lent by the runtime (tsr_engine_set_aux). */
static const tsr_aux_api *ctx_aux(const tsr_plugin_ctx *ctx) {
    const tsr_aux_api *a = ctx_slot(ctx)->e->aux;
    if (!a) h_set_error(ctx, "this host lends no models to plugins");
    return a;
}

static int h_model_open(const tsr_plugin_ctx *ctx, const char *path, const char *assembly,
                        int n_layers, tsr_aux_model **out) {
    const tsr_aux_api *a = ctx_aux(ctx);
    *out = NULL;
    return a ? a->model_open(a->data, ctx, path, assembly, n_layers, out) : TSR_ERR_UNSUPPORTED;
}

static void h_model_close(const tsr_plugin_ctx *ctx, tsr_aux_model *m) {
    const tsr_aux_api *a = ctx_slot(ctx)->e->aux;
    if (a && m) a->model_close(a->data, m);
}

static int h_model_dims(const tsr_plugin_ctx *ctx, const tsr_aux_model *m, int *vocab, int *max_ctx) {
    const tsr_aux_api *a = ctx_aux(ctx);
    return a ? a->model_dims(a->data, m, vocab, max_ctx) : TSR_ERR_UNSUPPORTED;
}

static int h_seq_open(const tsr_plugin_ctx *ctx, tsr_aux_model *m, int max_tokens, tsr_aux_seq **out) {
    const tsr_aux_api *a = ctx_aux(ctx);
    *out = NULL;
    return a ? a->seq_open(a->data, ctx, m, max_tokens, out) : TSR_ERR_UNSUPPORTED;
}

static void h_seq_close(const tsr_plugin_ctx *ctx, tsr_aux_seq *s) {
    const tsr_aux_api *a = ctx_slot(ctx)->e->aux;
    if (a && s) a->seq_close(a->data, s);
}

static int h_seq_forward(const tsr_plugin_ctx *ctx, tsr_aux_seq *s, const int32_t *tokens, int n,
                         float *logits) {
    const tsr_aux_api *a = ctx_aux(ctx);
    return a ? a->seq_forward(a->data, ctx, s, tokens, n, logits) : TSR_ERR_UNSUPPORTED;
}

static int h_seq_truncate(const tsr_plugin_ctx *ctx, tsr_aux_seq *s, int n_tokens) {
    const tsr_aux_api *a = ctx_aux(ctx);
    return a ? a->seq_truncate(a->data, ctx, s, n_tokens) : TSR_ERR_UNSUPPORTED;
}

static uint64_t h_weight_done(const tsr_plugin_ctx *ctx, const void *data, uint64_t nbytes) {
    const tsr_aux_api *a = ctx_slot(ctx)->e->aux;
    return a && a->weight_done && data && nbytes ? a->weight_done(a->data, data, nbytes) : 0;
}

void tsr_engine_set_aux(tsr_engine *e, const tsr_aux_api *api) { e->aux = api; }

static const tsr_host_api host_api = {
    .struct_size = sizeof(tsr_host_api),
    .version = 5,
    .log = h_log,
    .set_error = h_set_error,
    .alloc = h_alloc,
    .free = h_free,
    .dev_alloc = h_dev_alloc,
    .dev_free = h_dev_free,
    .parallel_for = h_parallel_for,
    .param = h_param,
    .model_open = h_model_open,
    .model_close = h_model_close,
    .model_dims = h_model_dims,
    .seq_open = h_seq_open,
    .seq_close = h_seq_close,
    .seq_forward = h_seq_forward,
    .seq_truncate = h_seq_truncate,
    .weight_done = h_weight_done,
};

/* --- interface tables --------------------------------------------------------- */

size_t tsr_slot_iface_min_size(tsr_slot s) {
    switch (s) {
    case TSR_SLOT_ATTENTION: return offsetof(tsr_attention_i, run) + sizeof(void *);
    case TSR_SLOT_KV_CACHE: return offsetof(tsr_kv_cache_i, truncate) + sizeof(void *);
    case TSR_SLOT_DRAFTER: return offsetof(tsr_drafter_i, propose) + sizeof(void *);
    case TSR_SLOT_EXPERT_CACHE: return offsetof(tsr_expert_cache_i, stats) + sizeof(void *);
    case TSR_SLOT_GEMV: return offsetof(tsr_gemv_i, run) + sizeof(void *);
    default: return 0;
    }
}

int tsr_slot_iface_check(tsr_slot s, const void *iface, char *missing, size_t size) {
#define REQ(type, member)                                                        \
    do {                                                                         \
        if (!((const type *)iface)->member) {                                    \
            snprintf(missing, size, "%s.%s", #type, #member);                    \
            return -1;                                                           \
        }                                                                        \
    } while (0)
    switch (s) {
    case TSR_SLOT_ATTENTION: REQ(tsr_attention_i, run); break;
    case TSR_SLOT_KV_CACHE:
        REQ(tsr_kv_cache_i, seq_alloc);
        REQ(tsr_kv_cache_i, seq_free);
        REQ(tsr_kv_cache_i, append);
        REQ(tsr_kv_cache_i, view);
        REQ(tsr_kv_cache_i, truncate);
        break;
    case TSR_SLOT_DRAFTER: REQ(tsr_drafter_i, propose); break;
    case TSR_SLOT_EXPERT_CACHE:
        REQ(tsr_expert_cache_i, attach);
        REQ(tsr_expert_cache_i, lookup);
        REQ(tsr_expert_cache_i, stats);
        break;
    case TSR_SLOT_GEMV:
        REQ(tsr_gemv_i, prepare);
        REQ(tsr_gemv_i, run);
        break;
    default: snprintf(missing, size, "slot"); return -1;
    }
#undef REQ
    return 0;
}

/* --- loading ------------------------------------------------------------------ */

static int dl_open(const tsr_manifest *m, void **out, tsr_error *err) {
    dlerror();
    /* CUDA plugins stay mapped after dlclose: the CUDA libraries they pull in
     * (cuBLASLt, the runtime's registrations) do not survive being unloaded
     * while the process goes on using the device. */
    int flags = RTLD_NOW | RTLD_LOCAL | (m->devices & TSR_DEVMASK_CUDA ? RTLD_NODELETE : 0);
    void *h = dlopen(m->library_path, flags);
    if (!h) {
        const char *why = dlerror();
        return tsr_error_set_at(err, TSR_ERR_REFUSED, m->library_path, 0, 0, "plugin %s (%s): dlopen failed: %s",
                                m->name, m->library_path, why ? why : "unknown");
    }
    *out = h;
    return TSR_OK;
}

int tsr_export_bind(const tsr_manifest *m, const char *fn, void **handle, void (**out)(void), tsr_error *err) {
    *handle = NULL;
    *out = NULL;
    if (!tsr_manifest_export(m, fn))
        return tsr_error_set_at(err, TSR_ERR_INVALID, m->path, 0, 0, "plugin %s exports no '%s'", m->name, fn);
    tsr_diag d;
    tsr_diag_init(&d);
    if (tsr_check_library(m, &d)) {
        tsr_diag_to_error(&d, err);
        tsr_diag_free(&d);
        return err ? err->code : TSR_ERR_REFUSED;
    }
    tsr_diag_free(&d);
    void *h = NULL;
    int rc = dl_open(m, &h, err);
    if (rc) return rc;
    dlerror();
    void *sym = dlsym(h, fn);
    if (!sym) {
        dlclose(h);
        return tsr_error_set_at(err, TSR_ERR_REFUSED, m->library_path, 0, 0,
                                "plugin %s (%s): export '%s' is not in the library", m->name, m->library_path, fn);
    }
    *handle = h;
    memcpy(out, &sym, sizeof sym); /* object pointer -> function pointer, as dlsym intends */
    return TSR_OK;
}

static int load_slot(tsr_engine *e, int s, const tsr_engine_opts *o, tsr_diag *d) {
    eslot *es = &e->slots[s];
    const tsr_plan_slot *ps = &e->plan->slots[s];
    const tsr_manifest *m = ps->m;
    const char *lib = m->library_path;
    es->e = e;
    es->m = m;
    tsr_error err;
    tsr_error_clear(&err);
    if (dl_open(m, &es->dl, &err)) {
        tsr_diag_add_error(d, &err);
        return err.code;
    }
#define REFUSE(...) return tsr_diag_add(d, TSR_ERR_REFUSED, lib, 0, 0, __VA_ARGS__)
    dlerror();
    void *sym = dlsym(es->dl, TSR_PLUGIN_ENTRY_NAME);
    if (!sym) REFUSE("plugin %s (%s): no entry symbol %s", m->name, lib, TSR_PLUGIN_ENTRY_NAME);
    tsr_plugin_entry_fn entry;
    memcpy(&entry, &sym, sizeof sym);
    const tsr_plugin_desc *desc = entry();
    if (!desc) REFUSE("plugin %s (%s): %s returned no descriptor", m->name, lib, TSR_PLUGIN_ENTRY_NAME);
    es->desc = desc;
    if (desc->abi_major != TSR_ABI_MAJOR || desc->abi_minor > TSR_ABI_MINOR)
        REFUSE("plugin %s (%s): built for ABI %u.%u, this host is ABI %d.%d", m->name, lib, desc->abi_major,
               desc->abi_minor, TSR_ABI_MAJOR, TSR_ABI_MINOR);
    if ((int)desc->abi_major != m->abi_major || (int)desc->abi_minor != m->abi_minor)
        REFUSE("plugin %s (%s): descriptor ABI %u.%u differs from the manifest's %d.%d", m->name, lib,
               desc->abi_major, desc->abi_minor, m->abi_major, m->abi_minor);
    if (!desc->name || strcmp(desc->name, m->name))
        REFUSE("plugin %s (%s): descriptor name '%s' differs from the manifest's", m->name, lib,
               desc->name ? desc->name : "(null)");
    if (desc->slot != m->slot)
        REFUSE("plugin %s (%s): descriptor slot %u differs from the manifest's %s", m->name, lib, desc->slot,
               tsr_slot_name(m->slot));
    if (!desc->version || strcmp(desc->version, m->version))
        REFUSE("plugin %s (%s): descriptor version '%s' differs from the manifest's %s", m->name, lib,
               desc->version ? desc->version : "(null)", m->version);
    unsigned devs = (desc->caps & TSR_CAP_DEVICE_CPU ? TSR_DEVMASK_CPU : 0) |
                    (desc->caps & TSR_CAP_DEVICE_CUDA ? TSR_DEVMASK_CUDA : 0);
    if (devs != m->devices) {
        char a[32], b[32];
        tsr_devmask_format(devs, a, sizeof a);
        tsr_devmask_format(m->devices, b, sizeof b);
        REFUSE("plugin %s (%s): descriptor devices [%s] differ from the manifest's [%s]", m->name, lib, a, b);
    }
    if (!!(desc->caps & TSR_CAP_EXACT) != m->exact)
        REFUSE("plugin %s (%s): descriptor says %s, the manifest says %s", m->name, lib,
               desc->caps & TSR_CAP_EXACT ? "exact" : "lossy", m->exact ? "exact" : "lossy");
    if (!desc->init) REFUSE("plugin %s (%s): required member init is NULL", m->name, lib);
    if (!desc->iface) REFUSE("plugin %s (%s): required member iface is NULL", m->name, lib);
    const uint32_t *hdr = desc->iface;
    size_t min = tsr_slot_iface_min_size(m->slot);
    if (hdr[1] < 1 || hdr[0] < min)
        REFUSE("plugin %s (%s): %s interface version %u, struct_size %u is older than this host reads (%zu)",
               m->name, lib, tsr_slot_name(m->slot), hdr[1], hdr[0], min);
    char missing[96];
    if (tsr_slot_iface_check(m->slot, desc->iface, missing, sizeof missing))
        REFUSE("plugin %s (%s): required member %s is NULL", m->name, lib, missing);
    for (int i = 0; i < m->n_exports; i++) {
        dlerror();
        if (!dlsym(es->dl, m->exports[i].name))
            REFUSE("plugin %s (%s): export '%s' is not in the library", m->name, lib, m->exports[i].name);
    }
#undef REFUSE
    es->ref.slot = (tsr_slot)s;
    es->ref.plugin = m->name;
    es->ref.version = m->version;
    es->ref.iface = desc->iface;
    es->ref.exact = m->exact;
    es->ref.baseline = !!(m->baseline & (1u << e->device));
    const tsr_mcap *graph = tsr_manifest_provides(m, "cuda_graph");
    es->ref.graph = graph && graph->n_values == 1 && !strcmp(graph->values[0], "true");
    es->ref.ctx = &es->ctx;
    /* params: host-owned copies */
    if (ps->n_params) {
        es->params = tsr_hcalloc((size_t)ps->n_params, sizeof *es->params);
        if (!es->params) return tsr_diag_add(d, TSR_ERR_NOMEM, lib, 0, 0, "out of memory");
        for (int i = 0; i < ps->n_params; i++) {
            es->params[i] = ps->params[i];
            es->params[i].name = NULL;
            if (ps->params[i].type == TSR_PARAM_STRING) es->params[i].v.s = NULL;
        }
        es->n_params = ps->n_params;
        for (int i = 0; i < ps->n_params; i++) {
            es->params[i].name = tsr_hstrdup(ps->params[i].name);
            if (!es->params[i].name) return tsr_diag_add(d, TSR_ERR_NOMEM, lib, 0, 0, "out of memory");
            if (ps->params[i].type == TSR_PARAM_STRING) {
                es->params[i].v.s = tsr_hstrdup(ps->params[i].v.s);
                if (!es->params[i].v.s) return tsr_diag_add(d, TSR_ERR_NOMEM, lib, 0, 0, "out of memory");
            }
        }
    }
    es->ctx.host = &host_api;
    es->ctx.host_data = es;
    es->ctx.name = m->name;
    es->ctx.device = e->device;
    es->ctx.device_id = o->device_id;
    es->ctx.model = e->has_model ? &e->model : NULL;
    es->ctx.params = es->params;
    es->ctx.n_params = es->n_params;
    if (o->no_init) return TSR_OK;
    void *inst = h_alloc(&es->ctx, desc->instance_size ? desc->instance_size : 1, 64);
    if (!inst)
        return tsr_diag_add(d, TSR_ERR_NOMEM, lib, 0, 0, "plugin %s (%s): cannot allocate its instance (%zu bytes)",
                            m->name, lib, desc->instance_size);
    es->ref.inst = inst;
    es->err[0] = '\0';
    int rc = desc->init(inst, &es->ctx);
    if (rc != TSR_OK) {
        if (desc->fini) desc->fini(inst);
        es->ref.inst = NULL;
        h_free(&es->ctx, inst);
        return tsr_diag_add(d, rc < 0 ? TSR_ERR_PLUGIN : TSR_ERR_PLUGIN, lib, 0, 0,
                            "plugin %s (%s): init failed: %s", m->name, lib,
                            es->err[0] ? es->err : tsr_status_str(rc));
    }
    es->inited = 1;
    return TSR_OK;
}

static void unload_slot(eslot *es) {
    if (es->inited && es->desc->fini) es->desc->fini(es->ref.inst);
    es->inited = 0;
    if (es->ref.inst) h_free(&es->ctx, es->ref.inst);
    es->ref.inst = NULL;
    int leaked = 0;
    while (es->allocs) {
        ahdr *h = es->allocs;
        es->allocs = h->next;
        h->magic = 0;
        tsr_hfree(h->raw);
        leaked++;
    }
    if (leaked && es->m)
        fprintf(stderr, "tessera: [%s] warning: %d allocation%s not freed by the plugin (freed now)\n", es->m->name,
                leaked, leaked == 1 ? "" : "s");
    for (int i = 0; i < es->n_params; i++) {
        tsr_hfree((char *)es->params[i].name);
        if (es->params[i].type == TSR_PARAM_STRING) tsr_hfree((char *)es->params[i].v.s);
    }
    tsr_hfree(es->params);
    es->params = NULL;
    es->n_params = 0;
    if (es->dl) dlclose(es->dl);
    es->dl = NULL;
}

void tsr_engine_free(tsr_engine *e) {
    if (!e) return;
    /* slot order puts gemv last: the expert cache releases its experts through it */
    for (int s = 0; s < TSR_SLOT_COUNT; s++) unload_slot(&e->slots[s]);
    tsr_threadpool_free(e->pool);
    tsr_plan_free(e->plan);
    tsr_assembly_free(e->asmb);
    tsr_catalog_free(e->cat);
    pthread_mutex_destroy(&e->mu);
    tsr_hfree(e);
}

static void desc_from_config(const tsr_model_config *c, tsr_model_desc *d, char *arch, size_t size) {
    memset(d, 0, sizeof *d);
    snprintf(arch, size, "%s", c->arch_name);
    d->arch = arch;
    d->n_layers = c->n_layers;
    d->hidden = c->hidden;
    d->n_heads = c->n_heads;
    d->n_kv_heads = c->n_kv_heads;
    d->head_dim = c->head_dim;
    d->ffn = c->ffn;
    d->vocab = c->vocab;
    d->max_ctx = c->max_ctx;
    d->n_experts = c->n_experts;
    d->n_experts_used = c->n_experts_used;
    d->expert_ffn = c->expert_ffn;
    d->weight_dtype = c->dtype;
}

int tsr_engine_open_diag(const char *assembly_path, const tsr_model_config *cfg, const tsr_model_desc *desc,
                         const tsr_engine_opts *opts, tsr_engine **out, tsr_diag *d) {
    *out = NULL;
    tsr_engine_opts none = {0};
    if (!opts) opts = &none;
    tsr_engine *e = tsr_hcalloc(1, sizeof *e);
    if (!e) return tsr_diag_add(d, TSR_ERR_NOMEM, assembly_path, 0, 0, "out of memory");
    pthread_mutex_init(&e->mu, NULL);
    int rc = tsr_catalog_load(opts->catalog_dir, &e->cat, d);
    if (rc) goto fail;
    int present = TSR_DEVICE_CPU; /* what Lua's tessera.device() reports */
#ifdef TESSERA_CUDA
    if (tsr_cuda_device_count() > 0) present = TSR_DEVICE_CUDA;
#endif
    tsr_assembly_env env = {.catalog = e->cat, .model = cfg, .device = present, .allow_test = opts->allow_test};
    rc = tsr_assembly_load(assembly_path, &env, &e->asmb, d);
    if (rc) goto fail;
    e->device = e->asmb->device;
    tsr_check_opts co = {.model = cfg, .allow_test = opts->allow_test};
    rc = tsr_check(e->cat, e->asmb, &co, &e->plan, d);
    if (rc) goto fail;
    if (e->device == TSR_DEVICE_CUDA && !opts->no_init) {
#ifdef TESSERA_CUDA
        tsr_error cerr;
        tsr_error_clear(&cerr);
        if (tsr_cuda_init(opts->device_id, &cerr) != TSR_OK) {
            rc = tsr_diag_add(d, cerr.code, e->asmb->path, e->asmb->line, e->asmb->col,
                              "device cuda: %s", cerr.msg);
            goto fail;
        }
#else
        rc = tsr_diag_add(d, TSR_ERR_UNSUPPORTED, e->asmb->path, e->asmb->line, e->asmb->col,
                          "device %s: this host is built without CUDA", tsr_device_name(e->device));
        goto fail;
#endif
    }
    if (desc) {
        e->model = *desc;
        e->has_model = 1;
        if (desc->arch) {
            snprintf(e->arch, sizeof e->arch, "%s", desc->arch);
            e->model.arch = e->arch;
        }
    } else if (cfg) {
        desc_from_config(cfg, &e->model, e->arch, sizeof e->arch);
        e->has_model = 1;
    }
    if (!opts->no_init) {
        int n = opts->n_threads > 0 ? opts->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (n < 1) n = 1;
        if (n > 1024) n = 1024;
        e->pool = tsr_threadpool_new(n);
        if (!e->pool) {
            rc = tsr_diag_add(d, TSR_ERR_NOMEM, assembly_path, 0, 0, "cannot start a pool of %d threads", n);
            goto fail;
        }
    }
    for (int s = 0; s < TSR_SLOT_COUNT; s++) {
        rc = load_slot(e, s, opts, d);
        if (rc) goto fail;
    }
    *out = e;
    return TSR_OK;
fail:
    tsr_engine_free(e);
    return rc ? rc : TSR_ERR_REFUSED;
}

int tsr_engine_open(const char *assembly_path, const tsr_model_config *cfg, const tsr_model_desc *desc,
                    const tsr_engine_opts *opts, tsr_engine **out, tsr_error *err) {
    tsr_diag d;
    tsr_diag_init(&d);
    int rc = tsr_engine_open_diag(assembly_path, cfg, desc, opts, out, &d);
    if (rc) {
        if (tsr_diag_count(&d)) tsr_diag_to_error(&d, err);
        else tsr_error_set(err, rc, "cannot open the engine");
    } else {
        tsr_error_clear(err);
    }
    tsr_diag_free(&d);
    return rc;
}

const tsr_slot_ref *tsr_engine_slot(const tsr_engine *e, tsr_slot slot) {
    return (unsigned)slot < TSR_SLOT_COUNT ? &e->slots[slot].ref : NULL;
}

tsr_threadpool *tsr_engine_pool(const tsr_engine *e) { return e->pool; }
int tsr_engine_device(const tsr_engine *e) { return e->device; }
int tsr_engine_runtime(const tsr_engine *e, int s) {
    return s >= 0 && s < TSR_RT_COUNT && e->asmb->runtime[s].on;
}
const char *tsr_engine_name(const tsr_engine *e) { return e->asmb->name; }

uint64_t tsr_engine_host_bytes(const tsr_engine *e) {
    uint64_t n = 0;
    pthread_mutex_lock((pthread_mutex_t *)&e->mu);
    for (int s = 0; s < TSR_SLOT_COUNT; s++) n += e->slots[s].bytes;
    pthread_mutex_unlock((pthread_mutex_t *)&e->mu);
    return n;
}

const char *tsr_engine_plugin_error(const tsr_engine *e, tsr_slot slot) {
    return (unsigned)slot < TSR_SLOT_COUNT ? e->slots[slot].err : "";
}

void tsr_engine_describe(const tsr_engine *e, FILE *f) {
    fprintf(f, "engine %s (device %s)\n", e->asmb->name, tsr_device_name(e->device));
    if (e->asmb->description) fprintf(f, "  %s\n", e->asmb->description);
    for (int s = 0; s < TSR_SLOT_COUNT; s++) {
        const eslot *es = &e->slots[s];
        const tsr_plan_slot *ps = &e->plan->slots[s];
        const tsr_manifest *m = ps->m;
        fprintf(f, "  %-12s %-20s %-8s %-5s%s", tsr_slot_name((tsr_slot)s), m->name, m->version,
                m->exact ? "exact" : "lossy", ps->given ? "" : " (baseline)");
        fprintf(f, "  params:");
        if (!es->n_params) fprintf(f, " -");
        for (int i = 0; i < es->n_params; i++) {
            char v[256];
            tsr_param_format(&es->params[i], v, sizeof v);
            fprintf(f, " %s=%s", es->params[i].name, v);
        }
        fprintf(f, "  provides:");
        if (!m->n_provides) fprintf(f, " -");
        for (int i = 0; i < m->n_provides; i++) {
            fprintf(f, " %s=", m->provides[i].key);
            for (int j = 0; j < m->provides[i].n_values; j++) {
                char v[256];
                tsr_plan_provided(ps, &m->provides[i], j, v, sizeof v);
                fprintf(f, "%s%s", j ? "," : "", v);
            }
        }
        fprintf(f, "\n");
    }
    for (int s = 0; s < TSR_RT_COUNT; s++)
        if (e->asmb->runtime[s].on) fprintf(f, "  runtime      %s=true\n", tsr_rt_switch_name((tsr_rt_switch)s));
}
