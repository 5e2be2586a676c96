/*
 * tsr_expert_cache.h - the expert_cache slot: which experts' weights of a
 * mixture-of-experts model are resident, prepared for the gemv plugin.
 *
 * The runtime attaches a source that prepares (through the engine's gemv
 * plugin) and releases one expert's three matrices. The cache decides what
 * stays resident; lookup returns prepared weights for a list of expert ids.
 */
#ifndef TSR_EXPERT_CACHE_H
#define TSR_EXPERT_CACHE_H

#include "tsr_plugin.h"

/* Version 2: resident (every expert's weights at once, for the device path). */
#define TSR_EXPERT_CACHE_IFACE_VERSION 2

/* One expert's prepared matrices (gemv handles). up NULL: gate is gate and
 * up stacked into one handle [2 expert_ffn, hidden] (prepare_group; the
 * runtime stacks them where the gemv plugin does on a device). A cache
 * holds the three as they come. */
typedef struct tsr_expert_weights {
    const void *gate; /* [expert_ffn, hidden], or [gate; up] */
    const void *up;   /* [expert_ffn, hidden] or NULL */
    const void *down; /* [hidden, expert_ffn] */
} tsr_expert_weights;

/* Given by the runtime: loads (prepares) and unloads one expert. */
typedef struct tsr_expert_source {
    int n_layers;
    int n_experts;
    void *data;
    /* Prepare expert of layer into *out; *bytes receives its prepared size.
     * Layers without experts answer TSR_ERR_INVALID. */
    int (*load)(void *data, int layer, int expert, tsr_expert_weights *out, uint64_t *bytes);
    void (*unload)(void *data, int layer, int expert, tsr_expert_weights *w);
} tsr_expert_source;

typedef struct tsr_expert_stats {
    uint64_t hits;
    uint64_t misses;
    uint64_t evictions;
    uint64_t resident;       /* experts resident now */
    uint64_t resident_bytes;
} tsr_expert_stats;

typedef struct tsr_expert_cache_i {
    uint32_t struct_size;
    uint32_t version; /* TSR_EXPERT_CACHE_IFACE_VERSION */

    /* required: called once after init for a mixture-of-experts model (never
     * for a dense one). The source outlives the instance. */
    int (*attach)(void *inst, const tsr_expert_source *src);

    /* required: out[i] = weights of experts[i] in layer, for n distinct ids.
     * The pointers stay valid until the next lookup call. TSR_ERR_RANGE if
     * the cache cannot hold n experts at once. Counts a hit or a miss per id. */
    int (*lookup)(void *inst, int layer, int n, const int32_t *experts,
                  const tsr_expert_weights **out);

    /* required: counters since init. */
    void (*stats)(void *inst, tsr_expert_stats *out);

    /* optional (default: nothing): a hint that these experts of layer will
     * be looked up soon. */
    void (*prefetch)(void *inst, int layer, int n, const int32_t *experts);

    /* --- version 2 --- */
    /* optional (default: TSR_ERR_UNSUPPORTED): for a cache that keeps every
     * expert prepared for its life, out[e] = the weights of expert e of
     * layer for every e < n_experts, valid until the instance is freed,
     * whatever is looked up meanwhile. Counts nothing. The runtime then
     * lets the gemv plugin choose the experts on the device
     * (tsr_gemv_i.run_experts) and captures such passes in CUDA graphs. */
    int (*resident)(void *inst, int layer, const tsr_expert_weights **out);
} tsr_expert_cache_i;

#endif /* TSR_EXPERT_CACHE_H */
