/*
 * expert_resident - the baseline expert cache: every expert of every MoE
 * layer is prepared at attach and stays resident; every lookup is a hit.
 */
#include "slots/tsr_expert_cache.h"

typedef struct resident {
    const tsr_plugin_ctx *ctx;
    const tsr_expert_source *src;
    tsr_expert_weights *w;   /* [n_layers * n_experts] */
    uint8_t *loaded;         /* [n_layers * n_experts] */
    tsr_expert_stats stats;
} resident;

static int res_init(void *inst, const tsr_plugin_ctx *ctx) {
    ((resident *)inst)->ctx = ctx;
    return TSR_OK;
}

static void res_fini(void *inst) {
    resident *r = inst;
    if (!r->src) return;
    int n = r->src->n_layers * r->src->n_experts;
    for (int i = 0; i < n; i++)
        if (r->loaded && r->loaded[i])
            r->src->unload(r->src->data, i / r->src->n_experts, i % r->src->n_experts, &r->w[i]);
    r->ctx->host->free(r->ctx, r->w);
    r->ctx->host->free(r->ctx, r->loaded);
}

static int res_attach(void *inst, const tsr_expert_source *src) {
    resident *r = inst;
    const tsr_host_api *h = r->ctx->host;
    if (r->src) {
        h->set_error(r->ctx, "already attached");
        return TSR_ERR_INVALID;
    }
    size_t n = (size_t)src->n_layers * (size_t)src->n_experts;
    r->src = src;
    r->w = h->alloc(r->ctx, n * sizeof *r->w, 16);
    r->loaded = h->alloc(r->ctx, n, 16);
    if (!r->w || !r->loaded) return TSR_ERR_NOMEM;
    for (int l = 0; l < src->n_layers; l++) {
        for (int e = 0; e < src->n_experts; e++) {
            size_t i = (size_t)l * src->n_experts + e;
            uint64_t bytes = 0;
            int rc = src->load(src->data, l, e, &r->w[i], &bytes);
            if (rc == TSR_ERR_INVALID && e == 0) break; /* a dense layer: no experts */
            if (rc != TSR_OK) {
                h->set_error(r->ctx, "loading expert %d of layer %d failed (%d)", e, l, rc);
                return rc;
            }
            r->loaded[i] = 1;
            r->stats.resident++;
            r->stats.resident_bytes += bytes;
        }
    }
    return TSR_OK;
}

/* Whether layer can be asked for; the error set where not. */
static int layer_ok(resident *r, const char *what, int layer) {
    if (r->src && layer >= 0 && layer < r->src->n_layers) return 1;
    r->ctx->host->set_error(r->ctx, "%s in layer %d: not attached or out of range", what, layer);
    return 0;
}

/* Expert e of a valid layer as prepared at attach; NULL with the error set
 * where there is none (out of range, a dense layer). */
static const tsr_expert_weights *expert_at(resident *r, int layer, int e) {
    const size_t idx = (size_t)layer * r->src->n_experts + (size_t)e;
    if (e < 0 || e >= r->src->n_experts || !r->loaded[idx]) {
        r->ctx->host->set_error(r->ctx, "layer %d has no expert %d", layer, e);
        return NULL;
    }
    return &r->w[idx];
}

static int res_lookup(void *inst, int layer, int n, const int32_t *experts,
                      const tsr_expert_weights **out) {
    resident *r = inst;
    if (!layer_ok(r, "lookup", layer)) return TSR_ERR_INVALID;
    for (int i = 0; i < n; i++) {
        if (!(out[i] = expert_at(r, layer, experts[i]))) return TSR_ERR_INVALID;
        r->stats.hits++;
    }
    return TSR_OK;
}

static void res_stats(void *inst, tsr_expert_stats *out) { *out = ((resident *)inst)->stats; }

/* every expert of layer at once: prepared at attach, kept to the end */
static int res_resident(void *inst, int layer, const tsr_expert_weights **out) {
    resident *r = inst;
    if (!layer_ok(r, "resident", layer)) return TSR_ERR_INVALID;
    for (int e = 0; e < r->src->n_experts; e++)
        if (!(out[e] = expert_at(r, layer, e))) return TSR_ERR_INVALID;
    return TSR_OK;
}

static const tsr_expert_cache_i res_iface = {
    .struct_size = sizeof(tsr_expert_cache_i),
    .version = TSR_EXPERT_CACHE_IFACE_VERSION,
    .attach = res_attach,
    .lookup = res_lookup,
    .stats = res_stats,
    .prefetch = NULL,
    .resident = res_resident,
};

static const tsr_plugin_desc res_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "expert_resident",
    .slot = TSR_SLOT_EXPERT_CACHE,
    .version = "1.0.0",
    .instance_size = sizeof(resident),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_DEVICE_CUDA | TSR_CAP_EXACT,
    .init = res_init,
    .fini = res_fini,
    .iface = &res_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &res_desc; }
