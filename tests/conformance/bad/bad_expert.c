/* bad_expert - planted defects for the harness's own test, built twice:
 * bad_expert_swap, an expert cache that keeps everything it loads but
 * answers every id of a lookup with the first id's weights; with
 * BAD_RESIDENT, bad_expert_resident, whose lookups are right but whose
 * resident (every expert at once) counts its answers as lookup hits. */
#include <string.h>

#include "slots/tsr_expert_cache.h"

#define MAXE 4096

typedef struct bad {
    const tsr_plugin_ctx *ctx;
    const tsr_expert_source *src;
    tsr_expert_weights w[MAXE];
    unsigned char loaded[MAXE];
    tsr_expert_stats st;
} bad;

static int bad_init(void *inst, const tsr_plugin_ctx *ctx) {
    ((bad *)inst)->ctx = ctx;
    return TSR_OK;
}

static void bad_fini(void *inst) {
    bad *b = inst;
    for (int i = 0; b->src && i < b->src->n_layers * b->src->n_experts; i++)
        if (b->loaded[i]) b->src->unload(b->src->data, i / b->src->n_experts, i % b->src->n_experts, &b->w[i]);
}

static int bad_attach(void *inst, const tsr_expert_source *src) {
    bad *b = inst;
    if (src->n_layers * src->n_experts > MAXE) return TSR_ERR_UNSUPPORTED;
    b->src = src;
    return TSR_OK;
}

static int bad_lookup(void *inst, int layer, int n, const int32_t *experts, const tsr_expert_weights **out) {
    bad *b = inst;
    for (int i = 0; i < n; i++) {
        int k = layer * b->src->n_experts + experts[i];
        if (!b->loaded[k]) {
            uint64_t bytes;
            int rc = b->src->load(b->src->data, layer, experts[i], &b->w[k], &bytes);
            if (rc) return rc;
            b->loaded[k] = 1;
            b->st.misses++;
            b->st.resident++;
        } else {
            b->st.hits++;
        }
#ifdef BAD_RESIDENT
        out[i] = &b->w[k];
#else
        out[i] = &b->w[layer * b->src->n_experts + experts[0]];
#endif
    }
    return TSR_OK;
}

#ifdef BAD_RESIDENT
/* every expert of layer, loaded on the way, each answer counted as a hit */
static int bad_resident(void *inst, int layer, const tsr_expert_weights **out) {
    bad *b = inst;
    for (int e = 0; e < b->src->n_experts; e++) {
        int k = layer * b->src->n_experts + e;
        if (!b->loaded[k]) {
            uint64_t bytes;
            int rc = b->src->load(b->src->data, layer, e, &b->w[k], &bytes);
            if (rc) return rc;
            b->loaded[k] = 1;
            b->st.resident++;
        }
        b->st.hits++;
        out[e] = &b->w[k];
    }
    return TSR_OK;
}
#endif

static void bad_stats(void *inst, tsr_expert_stats *out) { *out = ((bad *)inst)->st; }

static const tsr_expert_cache_i bad_iface = {
    .struct_size = sizeof(tsr_expert_cache_i),
    .version = TSR_EXPERT_CACHE_IFACE_VERSION,
    .attach = bad_attach,
    .lookup = bad_lookup,
    .stats = bad_stats,
#ifdef BAD_RESIDENT
    .resident = bad_resident,
#endif
};

static const tsr_plugin_desc bad_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = BAD_NAME,
    .slot = TSR_SLOT_EXPERT_CACHE,
    .version = "0.0.1",
    .instance_size = sizeof(bad),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = bad_init,
    .fini = bad_fini,
    .iface = &bad_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &bad_desc; }
