/* test_expert_cache: keeps every expert it has loaded resident. */
#include <string.h>

#include "slots/tsr_expert_cache.h"

#define MAX_N 64

typedef struct inst {
    const tsr_plugin_ctx *ctx;
    const tsr_expert_source *src;
    tsr_expert_weights *w;  /* [n_layers * n_experts] */
    unsigned char *loaded;
    tsr_expert_stats st;
    const tsr_expert_weights *out[MAX_N];
} inst;

static int ec_init(void *p, const tsr_plugin_ctx *ctx) {
    ((inst *)p)->ctx = ctx;
    return TSR_OK;
}

static void ec_fini(void *p) {
    inst *c = p;
    if (c->src && c->loaded)
        for (int i = 0; i < c->src->n_layers * c->src->n_experts; i++)
            if (c->loaded[i]) c->src->unload(c->src->data, i / c->src->n_experts, i % c->src->n_experts, &c->w[i]);
    c->ctx->host->free(c->ctx, c->w);
    c->ctx->host->free(c->ctx, c->loaded);
}

static int ec_attach(void *p, const tsr_expert_source *src) {
    inst *c = p;
    if (src->n_layers <= 0 || src->n_experts <= 0 || src->n_layers > 4096 || src->n_experts > 4096)
        return TSR_ERR_INVALID;
    size_t n = (size_t)src->n_layers * (size_t)src->n_experts;
    c->w = c->ctx->host->alloc(c->ctx, n * sizeof *c->w, 16);
    c->loaded = c->ctx->host->alloc(c->ctx, n, 16);
    if (!c->w || !c->loaded) return TSR_ERR_NOMEM;
    c->src = src;
    return TSR_OK;
}

static int ec_lookup(void *p, int layer, int n, const int32_t *experts, const tsr_expert_weights **out) {
    inst *c = p;
    if (!c->src || n > MAX_N || layer < 0 || layer >= c->src->n_layers) return TSR_ERR_RANGE;
    for (int i = 0; i < n; i++) {
        if (experts[i] < 0 || experts[i] >= c->src->n_experts) return TSR_ERR_INVALID;
        size_t at = (size_t)layer * (size_t)c->src->n_experts + (size_t)experts[i];
        if (!c->loaded[at]) {
            uint64_t bytes = 0;
            int rc = c->src->load(c->src->data, layer, experts[i], &c->w[at], &bytes);
            if (rc) return rc;
            c->loaded[at] = 1;
            c->st.misses++;
            c->st.resident++;
            c->st.resident_bytes += bytes;
        } else {
            c->st.hits++;
        }
        out[i] = &c->w[at];
    }
    return TSR_OK;
}

static void ec_stats(void *p, tsr_expert_stats *out) { *out = ((inst *)p)->st; }

static const tsr_expert_cache_i iface = {
    .struct_size = sizeof(tsr_expert_cache_i),
    .version = TSR_EXPERT_CACHE_IFACE_VERSION,
    .attach = ec_attach,
    .lookup = ec_lookup,
    .stats = ec_stats,
};

static const tsr_plugin_desc desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "test_expert_cache",
    .slot = TSR_SLOT_EXPERT_CACHE,
    .version = "0.1.0",
    .instance_size = sizeof(inst),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = ec_init,
    .fini = ec_fini,
    .iface = &iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *tsr_plugin_entry(void) { return &desc; }
