/*
 * slot_calls.h - the only way the host calls a plugin's slot interface.
 *
 * Each wrapper takes the engine's tsr_slot_ref, checks that the member
 * exists in the plugin's table (struct_size/version) before touching it, and
 * applies the default the slot header documents when an optional member is
 * absent. Required members were checked at load; the wrappers still answer
 * TSR_ERR_UNSUPPORTED rather than crash if handed an unloaded slot (a
 * tsr_engine opened with no_init has iface but no instance).
 */
#ifndef TSR_SLOT_CALLS_H
#define TSR_SLOT_CALLS_H

#include <stddef.h>

#include "engine.h"

/* 1 if the table at s->iface has member at byte offset off (of size ptr). */
static inline int tsr_slot_has(const tsr_slot_ref *s, size_t off) {
    if (!s || !s->iface || !s->inst) return 0;
    const uint32_t *hdr = (const uint32_t *)s->iface; /* struct_size, version */
    return hdr[1] >= 1 && (size_t)hdr[0] >= off + sizeof(void *);
}

#define TSR_SLOT_MEMBER(s, type, member) \
    (tsr_slot_has((s), offsetof(type, member)) ? ((const type *)(s)->iface)->member : NULL)

/* --- gemv --- */
/* 1 if the plugin reads tsr_weight.scale (gemv interface version >= 3): the
 * host hands scaled weights to no other. */
static inline int tsr_gemv_reads_scales(const tsr_slot_ref *s) {
    return s && s->iface && ((const uint32_t *)s->iface)[1] >= 3;
}
static inline int tsr_gemv_prepare(const tsr_slot_ref *s, const tsr_weight *w, void **out) {
    int (*f)(void *, const tsr_weight *, void **) = TSR_SLOT_MEMBER(s, tsr_gemv_i, prepare);
    return f ? f(s->inst, w, out) : TSR_ERR_UNSUPPORTED;
}
static inline void tsr_gemv_release(const tsr_slot_ref *s, void *prepared) {
    void (*f)(void *, void *) = TSR_SLOT_MEMBER(s, tsr_gemv_i, release);
    if (f && prepared) f(s->inst, prepared); /* default: nothing; never called with NULL */
}
static inline int tsr_gemv_run(const tsr_slot_ref *s, const void *prepared, int rows, const float *x,
                               float *y, const tsr_exec *ex) {
    int (*f)(void *, const void *, int, const float *, float *, const tsr_exec *) =
        TSR_SLOT_MEMBER(s, tsr_gemv_i, run);
    return f ? f(s->inst, prepared, rows, x, y, ex) : TSR_ERR_UNSUPPORTED;
}
/* default: TSR_ERR_UNSUPPORTED (the caller prepares the matrices alone) */
static inline int tsr_gemv_prepare_group(const tsr_slot_ref *s, const tsr_weight *ws, int n, void **out) {
    int (*f)(void *, const tsr_weight *, int, void **) = TSR_SLOT_MEMBER(s, tsr_gemv_i, prepare_group);
    return f ? f(s->inst, ws, n, out) : TSR_ERR_UNSUPPORTED;
}
/* default: TSR_ERR_UNSUPPORTED (the caller runs run() and its SiLU) */
static inline int tsr_gemv_run_glu(const tsr_slot_ref *s, const void *prepared, int rows, const float *x,
                                   float *y, const tsr_exec *ex) {
    int (*f)(void *, const void *, int, const float *, float *, const tsr_exec *) =
        TSR_SLOT_MEMBER(s, tsr_gemv_i, run_glu);
    return f ? f(s->inst, prepared, rows, x, y, ex) : TSR_ERR_UNSUPPORTED;
}
/* default: TSR_ERR_UNSUPPORTED (the host looks experts up itself) */
static inline int tsr_gemv_prepare_experts(const tsr_slot_ref *s, const void *const *prepared, int n, void **out) {
    int (*f)(void *, const void *const *, int, void **) = TSR_SLOT_MEMBER(s, tsr_gemv_i, prepare_experts);
    return f ? f(s->inst, prepared, n, out) : TSR_ERR_UNSUPPORTED;
}
static inline void tsr_gemv_release_experts(const tsr_slot_ref *s, void *table) {
    void (*f)(void *, void *) = TSR_SLOT_MEMBER(s, tsr_gemv_i, release_experts);
    if (f && table) f(s->inst, table);
}
static inline int tsr_gemv_run_experts(const tsr_slot_ref *s, const void *table, const int32_t *sel, int k,
                                       int per_x, int glu, const float *x, int ldx, float *y, const tsr_exec *ex) {
    int (*f)(void *, const void *, const int32_t *, int, int, int, const float *, int, float *, const tsr_exec *) =
        TSR_SLOT_MEMBER(s, tsr_gemv_i, run_experts);
    return f ? f(s->inst, table, sel, k, per_x, glu, x, ldx, y, ex) : TSR_ERR_UNSUPPORTED;
}
/* default: TSR_ERR_UNSUPPORTED (the host runs each expert's rows in turn) */
static inline int tsr_gemv_run_grouped(const tsr_slot_ref *s, const void *table, const int32_t *off, int n, int glu,
                                       const float *x, int ldx, float *y, const tsr_exec *ex) {
    int (*f)(void *, const void *, const int32_t *, int, int, const float *, int, float *, const tsr_exec *) =
        TSR_SLOT_MEMBER(s, tsr_gemv_i, run_grouped);
    return f ? f(s->inst, table, off, n, glu, x, ldx, y, ex) : TSR_ERR_UNSUPPORTED;
}
/* 1 if the plugin has run_fused and reads tsr_gemv_fuse's fold fields
 * (version >= 8): the host asks no other to fold (an older plugin would
 * ignore them; one without run_fused would answer no twice a layer). */
static inline int tsr_gemv_folds(const tsr_slot_ref *s) {
    return s && s->iface && ((const uint32_t *)s->iface)[1] >= 8 && TSR_SLOT_MEMBER(s, tsr_gemv_i, run_fused);
}
/* default: TSR_ERR_UNSUPPORTED (the host runs its norm, run() and add) */
static inline int tsr_gemv_run_fused(const tsr_slot_ref *s, const void *prepared, int rows, const float *x, float *y,
                                     const tsr_gemv_fuse *fu, const tsr_exec *ex) {
    int (*f)(void *, const void *, int, const float *, float *, const tsr_gemv_fuse *, const tsr_exec *) =
        TSR_SLOT_MEMBER(s, tsr_gemv_i, run_fused);
    return f ? f(s->inst, prepared, rows, x, y, fu, ex) : TSR_ERR_UNSUPPORTED;
}
/* default: w->nbytes */
static inline uint64_t tsr_gemv_bytes(const tsr_slot_ref *s, const void *prepared, const tsr_weight *w) {
    uint64_t (*f)(void *, const void *) = TSR_SLOT_MEMBER(s, tsr_gemv_i, bytes);
    return f ? f(s->inst, prepared) : (w ? w->nbytes : 0);
}

/* --- kv_cache (the view member is tsr_kv_view_get: tsr_kv_view is its struct) --- */
static inline int tsr_kv_seq_alloc(const tsr_slot_ref *s, int max_tokens, int *seq) {
    int (*f)(void *, int, int *) = TSR_SLOT_MEMBER(s, tsr_kv_cache_i, seq_alloc);
    return f ? f(s->inst, max_tokens, seq) : TSR_ERR_UNSUPPORTED;
}
static inline void tsr_kv_seq_free(const tsr_slot_ref *s, int seq) {
    void (*f)(void *, int) = TSR_SLOT_MEMBER(s, tsr_kv_cache_i, seq_free);
    if (f) f(s->inst, seq);
}
static inline int tsr_kv_append(const tsr_slot_ref *s, int seq, int layer, int pos0, int rows,
                                const float *k, const float *v, const tsr_exec *ex) {
    int (*f)(void *, int, int, int, int, const float *, const float *, const tsr_exec *) =
        TSR_SLOT_MEMBER(s, tsr_kv_cache_i, append);
    return f ? f(s->inst, seq, layer, pos0, rows, k, v, ex) : TSR_ERR_UNSUPPORTED;
}
static inline int tsr_kv_view_get(const tsr_slot_ref *s, int seq, int layer, tsr_kv_view *out) {
    int (*f)(void *, int, int, tsr_kv_view *) = TSR_SLOT_MEMBER(s, tsr_kv_cache_i, view);
    return f ? f(s->inst, seq, layer, out) : TSR_ERR_UNSUPPORTED;
}
static inline int tsr_kv_truncate(const tsr_slot_ref *s, int seq, int n_tokens) {
    int (*f)(void *, int, int) = TSR_SLOT_MEMBER(s, tsr_kv_cache_i, truncate);
    return f ? f(s->inst, seq, n_tokens) : TSR_ERR_UNSUPPORTED;
}
/* default: TSR_ERR_UNSUPPORTED */
static inline int tsr_kv_replayed(const tsr_slot_ref *s, int seq, int n_layers, int pos0, int rows) {
    int (*f)(void *, int, int, int, int) = TSR_SLOT_MEMBER(s, tsr_kv_cache_i, replayed);
    return f ? f(s->inst, seq, n_layers, pos0, rows) : TSR_ERR_UNSUPPORTED;
}
/* default: 0 and 0 */
static inline void tsr_kv_usage(const tsr_slot_ref *s, uint64_t *used, uint64_t *capacity) {
    void (*f)(void *, uint64_t *, uint64_t *) = TSR_SLOT_MEMBER(s, tsr_kv_cache_i, usage);
    *used = 0;
    *capacity = 0;
    if (f) f(s->inst, used, capacity);
}

/* --- attention --- */
static inline int tsr_attention_run(const tsr_slot_ref *s, const tsr_attn_args *a, const tsr_exec *ex) {
    int (*f)(void *, const tsr_attn_args *, const tsr_exec *) = TSR_SLOT_MEMBER(s, tsr_attention_i, run);
    return f ? f(s->inst, a, ex) : TSR_ERR_UNSUPPORTED;
}

/* --- expert_cache --- */
static inline int tsr_expert_attach(const tsr_slot_ref *s, const tsr_expert_source *src) {
    int (*f)(void *, const tsr_expert_source *) = TSR_SLOT_MEMBER(s, tsr_expert_cache_i, attach);
    return f ? f(s->inst, src) : TSR_ERR_UNSUPPORTED;
}
static inline int tsr_expert_lookup(const tsr_slot_ref *s, int layer, int n, const int32_t *experts,
                                    const tsr_expert_weights **out) {
    int (*f)(void *, int, int, const int32_t *, const tsr_expert_weights **) =
        TSR_SLOT_MEMBER(s, tsr_expert_cache_i, lookup);
    return f ? f(s->inst, layer, n, experts, out) : TSR_ERR_UNSUPPORTED;
}
static inline void tsr_expert_stats_get(const tsr_slot_ref *s, tsr_expert_stats *out) {
    void (*f)(void *, tsr_expert_stats *) = TSR_SLOT_MEMBER(s, tsr_expert_cache_i, stats);
    *out = (tsr_expert_stats){0};
    if (f) f(s->inst, out);
}
/* default: nothing */
static inline void tsr_expert_prefetch(const tsr_slot_ref *s, int layer, int n, const int32_t *experts) {
    void (*f)(void *, int, int, const int32_t *) = TSR_SLOT_MEMBER(s, tsr_expert_cache_i, prefetch);
    if (f) f(s->inst, layer, n, experts);
}
/* default: TSR_ERR_UNSUPPORTED (experts come and go: looked up each pass) */
static inline int tsr_expert_resident(const tsr_slot_ref *s, int layer, const tsr_expert_weights **out) {
    int (*f)(void *, int, const tsr_expert_weights **) = TSR_SLOT_MEMBER(s, tsr_expert_cache_i, resident);
    return f ? f(s->inst, layer, out) : TSR_ERR_UNSUPPORTED;
}

/* --- drafter --- */
static inline int tsr_drafter_propose(const tsr_slot_ref *s, const tsr_draft_req *r, tsr_draft_out *out) {
    int (*f)(void *, const tsr_draft_req *, tsr_draft_out *) = TSR_SLOT_MEMBER(s, tsr_drafter_i, propose);
    return f ? f(s->inst, r, out) : TSR_ERR_UNSUPPORTED;
}
/* default: nothing */
static inline void tsr_drafter_accept(const tsr_slot_ref *s, int seq, int n_proposed, int n_accepted) {
    void (*f)(void *, int, int, int) = TSR_SLOT_MEMBER(s, tsr_drafter_i, accept);
    if (f) f(s->inst, seq, n_proposed, n_accepted);
}
/* default: nothing */
static inline void tsr_drafter_seq_end(const tsr_slot_ref *s, int seq) {
    void (*f)(void *, int) = TSR_SLOT_MEMBER(s, tsr_drafter_i, seq_end);
    if (f) f(s->inst, seq);
}

#endif /* TSR_SLOT_CALLS_H */
