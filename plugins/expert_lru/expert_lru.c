/*
 * expert_lru - a budgeted expert cache: at most `budget` experts' prepared
 * weights are resident; the others are prepared on demand through the
 * runtime's tsr_expert_source (reading the memory-mapped file) and the least
 * recently used unpinned expert is released to make room.
 *
 * Entries returned by a lookup are pinned until the next lookup (the slot
 * contract keeps their pointers valid that long). With `prefetch` > 0, each
 * lookup also prepares up to that many experts of the next layer, ranked by
 * how often each followed the experts this layer chose (layer-to-layer
 * transition counts learned from the lookups themselves), with the same
 * expert ids as the fallback before anything has been learned.
 */
#include <string.h>

#include "core/util/checked.h"
#include "slots/tsr_expert_cache.h"

typedef struct lru_entry {
    int layer, expert;        /* -1 when free */
    tsr_expert_weights w;
    uint64_t bytes;
    uint64_t last_use;        /* tick of the last lookup or prefetch touching it */
    uint64_t pin;             /* lookup epoch that returned it */
} lru_entry;

typedef struct expert_lru {
    const tsr_plugin_ctx *ctx;
    const tsr_expert_source *src;
    int budget, prefetch;
    int n_slots;              /* min(budget, n_layers * n_experts) */
    lru_entry *slots;
    int32_t *where;           /* [n_layers * n_experts]: slot index or -1 */
    uint32_t *trans;          /* [n_layers - 1, n_experts, n_experts] transition counts */
    uint8_t *cur_set, *prev_set; /* [n_experts] experts of the current and the previous layer */
    int cur_layer, prev_layer;
    int32_t *scratch;         /* [n_experts] */
    uint64_t tick, epoch;
    uint64_t prefetched;      /* experts prepared by prefetch */
    tsr_expert_stats stats;
} expert_lru;

static int lru_init(void *inst, const tsr_plugin_ctx *ctx) {
    expert_lru *c = inst;
    c->ctx = ctx;
    const tsr_param *b = ctx->host->param(ctx, "budget");
    const tsr_param *p = ctx->host->param(ctx, "prefetch");
    c->budget = b && b->type == TSR_PARAM_INT ? (int)b->v.i : 32;
    c->prefetch = p && p->type == TSR_PARAM_INT ? (int)p->v.i : 0;
    c->cur_layer = c->prev_layer = -1;
    if (c->budget < 1) {
        ctx->host->set_error(ctx, "param budget=%d must be at least 1 expert", c->budget);
        return TSR_ERR_INVALID;
    }
    if (c->prefetch < 0) {
        ctx->host->set_error(ctx, "param prefetch=%d must not be negative", c->prefetch);
        return TSR_ERR_INVALID;
    }
    return TSR_OK;
}

static void release_entry(expert_lru *c, lru_entry *e) {
    c->src->unload(c->src->data, e->layer, e->expert, &e->w);
    c->where[(size_t)e->layer * c->src->n_experts + e->expert] = -1;
    c->stats.resident--;
    c->stats.resident_bytes -= e->bytes;
    memset(e, 0, sizeof *e);
    e->layer = e->expert = -1;
}

static void lru_fini(void *inst) {
    expert_lru *c = inst;
    if (!c->ctx) return;
    const tsr_host_api *h = c->ctx->host;
    if (c->src) /* attached: every array is set up */
        for (int i = 0; i < c->n_slots; i++)
            if (c->slots[i].layer >= 0) release_entry(c, &c->slots[i]);
    if (c->stats.hits + c->stats.misses)
        h->log(c->ctx, TSR_LOG_DEBUG, "%llu hits, %llu misses, %llu evictions, %llu prefetched",
               (unsigned long long)c->stats.hits, (unsigned long long)c->stats.misses,
               (unsigned long long)c->stats.evictions, (unsigned long long)c->prefetched);
    h->free(c->ctx, c->slots);
    h->free(c->ctx, c->where);
    h->free(c->ctx, c->trans);
    h->free(c->ctx, c->cur_set);
    h->free(c->ctx, c->prev_set);
    h->free(c->ctx, c->scratch);
}

static void *alloc_n(expert_lru *c, uint64_t n, uint64_t elem, int *bad) {
    uint64_t bytes;
    if (tsr_mul_u64(n ? n : 1, elem, &bytes) || bytes > SIZE_MAX) {
        *bad = 1;
        return NULL;
    }
    void *p = c->ctx->host->alloc(c->ctx, (size_t)bytes, 64);
    if (!p) *bad = 1;
    return p;
}

static int lru_attach(void *inst, const tsr_expert_source *src) {
    expert_lru *c = inst;
    const tsr_host_api *h = c->ctx->host;
    if (c->src) {
        h->set_error(c->ctx, "already attached");
        return TSR_ERR_INVALID;
    }
    if (!src || src->n_layers <= 0 || src->n_experts <= 0 || !src->load || !src->unload) {
        h->set_error(c->ctx, "expert source without layers, experts or load/unload");
        return TSR_ERR_INVALID;
    }
    uint64_t total = (uint64_t)src->n_layers * (uint64_t)src->n_experts, tn;
    c->n_slots = (uint64_t)c->budget < total ? c->budget : (int)total;
    int bad = 0;
    c->slots = alloc_n(c, (uint64_t)c->n_slots, sizeof *c->slots, &bad);
    c->where = alloc_n(c, total, sizeof *c->where, &bad);
    if (tsr_mul_u64((uint64_t)(src->n_layers - 1), (uint64_t)src->n_experts * (uint64_t)src->n_experts, &tn))
        bad = 1;
    else if (c->prefetch > 0)
        c->trans = alloc_n(c, tn, sizeof *c->trans, &bad);
    c->cur_set = alloc_n(c, (uint64_t)src->n_experts, 1, &bad);
    c->prev_set = alloc_n(c, (uint64_t)src->n_experts, 1, &bad);
    c->scratch = alloc_n(c, (uint64_t)src->n_experts, sizeof *c->scratch, &bad);
    if (bad) {
        h->set_error(c->ctx, "out of memory for %d slots over %d layers x %d experts", c->n_slots,
                     src->n_layers, src->n_experts);
        return TSR_ERR_NOMEM;
    }
    for (uint64_t i = 0; i < total; i++) c->where[i] = -1;
    for (int i = 0; i < c->n_slots; i++) c->slots[i].layer = c->slots[i].expert = -1;
    c->src = src;
    return TSR_OK;
}

/* A free slot, else the least recently used one not pinned by the current
 * lookup (released first); -1 if every slot is pinned. */
static int take_slot(expert_lru *c) {
    int best = -1;
    for (int i = 0; i < c->n_slots; i++) {
        lru_entry *e = &c->slots[i];
        if (e->layer < 0) return i;
        if (e->pin == c->epoch) continue;
        if (best < 0 || e->last_use < c->slots[best].last_use) best = i;
    }
    if (best >= 0) {
        release_entry(c, &c->slots[best]);
        c->stats.evictions++;
    }
    return best;
}

static int load_into(expert_lru *c, int slot, int layer, int expert) {
    lru_entry *e = &c->slots[slot];
    uint64_t bytes = 0;
    int rc = c->src->load(c->src->data, layer, expert, &e->w, &bytes);
    if (rc != TSR_OK) {
        memset(e, 0, sizeof *e);
        e->layer = e->expert = -1;
        return rc;
    }
    e->layer = layer;
    e->expert = expert;
    e->bytes = bytes;
    c->where[(size_t)layer * c->src->n_experts + expert] = slot;
    c->stats.resident++;
    c->stats.resident_bytes += bytes;
    return TSR_OK;
}

/* Prepare experts of layer that are not resident, without evicting what the
 * current lookup pinned. Counts neither hits nor misses. */
static void prefetch_ids(expert_lru *c, int layer, int n, const int32_t *ids) {
    const int E = c->src->n_experts;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= E || c->where[(size_t)layer * E + ids[i]] >= 0) continue;
        int s = take_slot(c);
        if (s < 0) return;
        if (load_into(c, s, layer, ids[i]) != TSR_OK) continue; /* a hint: failures are not errors */
        c->slots[s].last_use = ++c->tick;
        c->prefetched++;
    }
}

/* The prefetch experts of the next layer most often chosen after the
 * experts this layer chose so far; the same ids while nothing is learned. */
static void predict_next(expert_lru *c, int layer) {
    const int E = c->src->n_experts;
    int n = 0;
    const uint32_t *t = c->trans + (size_t)layer * E * E;
    for (int k = 0; k < c->prefetch && k < E; k++) {
        uint64_t best_score = 0;
        int best = -1;
        for (int e2 = 0; e2 < E; e2++) {
            int taken = 0;
            for (int j = 0; j < n; j++) taken |= c->scratch[j] == e2;
            if (taken) continue;
            uint64_t s = 0;
            for (int e = 0; e < E; e++)
                if (c->cur_set[e]) s += t[(size_t)e * E + e2];
            if (s > best_score) best_score = s, best = e2;
        }
        if (best < 0) break;
        c->scratch[n++] = best;
    }
    if (n == 0) /* nothing learned yet: the same ids */
        for (int e = 0; e < E && n < c->prefetch; e++)
            if (c->cur_set[e]) c->scratch[n++] = e;
    prefetch_ids(c, layer + 1, n, c->scratch);
}

static int lru_lookup(void *inst, int layer, int n, const int32_t *experts, const tsr_expert_weights **out) {
    expert_lru *c = inst;
    const tsr_host_api *h = c->ctx->host;
    if (!c->src || layer < 0 || layer >= c->src->n_layers || n < 0 || (n > 0 && (!experts || !out))) {
        h->set_error(c->ctx, "lookup of %d experts in layer %d: not attached or out of range", n, layer);
        return TSR_ERR_INVALID;
    }
    const int E = c->src->n_experts;
    for (int i = 0; i < n; i++)
        if (experts[i] < 0 || experts[i] >= E) {
            h->set_error(c->ctx, "layer %d has no expert %d (%d experts)", layer, experts[i], E);
            return TSR_ERR_INVALID;
        }
    if (n > c->n_slots) {
        h->set_error(c->ctx, "%d experts at once do not fit a budget of %d", n, c->n_slots);
        return TSR_ERR_RANGE;
    }
    c->epoch++;
    for (int i = 0; i < n; i++) {
        size_t key = (size_t)layer * E + experts[i];
        int s = c->where[key];
        if (s >= 0) {
            c->stats.hits++;
        } else {
            c->stats.misses++;
            s = take_slot(c);
            if (s < 0) { /* only with repeated ids beyond the budget */
                h->set_error(c->ctx, "every slot is in use by this lookup");
                return TSR_ERR_RANGE;
            }
            int rc = load_into(c, s, layer, experts[i]);
            if (rc != TSR_OK) {
                h->set_error(c->ctx, "loading expert %d of layer %d failed (%d)", experts[i], layer, rc);
                return rc;
            }
        }
        c->slots[s].last_use = ++c->tick;
        c->slots[s].pin = c->epoch;
        out[i] = &c->slots[s].w;
    }
    /* the routing seen, for the transition counts and the prefetch */
    if (layer != c->cur_layer) {
        uint8_t *t = c->prev_set;
        c->prev_set = c->cur_set;
        c->cur_set = t;
        c->prev_layer = c->cur_layer;
        c->cur_layer = layer;
        memset(c->cur_set, 0, (size_t)E);
    }
    for (int i = 0; i < n; i++) c->cur_set[experts[i]] = 1;
    if (c->trans && c->prev_layer == layer - 1 && layer > 0) {
        uint32_t *t = c->trans + (size_t)(layer - 1) * E * E;
        for (int e = 0; e < E; e++)
            if (c->prev_set[e])
                for (int i = 0; i < n; i++) t[(size_t)e * E + experts[i]]++;
    }
    if (c->prefetch > 0 && layer + 1 < c->src->n_layers) predict_next(c, layer);
    return TSR_OK;
}

static void lru_prefetch(void *inst, int layer, int n, const int32_t *experts) {
    expert_lru *c = inst;
    if (!c->src || layer < 0 || layer >= c->src->n_layers || n <= 0 || !experts) return;
    prefetch_ids(c, layer, n, experts);
}

static void lru_stats(void *inst, tsr_expert_stats *out) { *out = ((expert_lru *)inst)->stats; }

static const tsr_expert_cache_i lru_iface = {
    .struct_size = sizeof(tsr_expert_cache_i),
    .version = TSR_EXPERT_CACHE_IFACE_VERSION,
    .attach = lru_attach,
    .lookup = lru_lookup,
    .stats = lru_stats,
    .prefetch = lru_prefetch,
};

static const tsr_plugin_desc lru_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "expert_lru",
    .slot = TSR_SLOT_EXPERT_CACHE,
    .version = "1.0.0",
    .instance_size = sizeof(expert_lru),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_DEVICE_CUDA | TSR_CAP_EXACT,
    .init = lru_init,
    .fini = lru_fini,
    .iface = &lru_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &lru_desc; }
