/*
 * slot_calls.h - the only way the host calls into plugins: one small
 * wrapper per interface member. Each checks that an optional member exists
 * in the plugin's table (struct_size covers it and the pointer is set)
 * before calling it, and otherwise applies the default documented in
 * slots/tsr_*.h. Required members were checked at load (loader).
 */
#ifndef TSR_SLOT_CALLS_H
#define TSR_SLOT_CALLS_H

#include <stddef.h>

#include "engine.h"

/* 1 if the member at offset off (of size sz) lies within the table the
 * plugin was built with and is set. */
#define TSR_HAS_MEMBER(tbl, type, member)                                                   \
    ((tbl)->struct_size >= offsetof(type, member) + sizeof(((type *)0)->member) &&         \
     (tbl)->member != NULL)

#define TSR_IFACE(s, type) ((const type *)(s)->iface)

/* gemv */
static inline int tsr_gemv_prepare(const tsr_slot_ref *s, const tsr_weight *w, void **out) {
    return TSR_IFACE(s, tsr_gemv_i)->prepare(s->inst, w, out);
}
static inline void tsr_gemv_release(const tsr_slot_ref *s, void *prepared) {
    const tsr_gemv_i *i = TSR_IFACE(s, tsr_gemv_i);
    if (prepared && TSR_HAS_MEMBER(i, tsr_gemv_i, release)) i->release(s->inst, prepared);
}
static inline int tsr_gemv_run(const tsr_slot_ref *s, const void *prepared, int rows,
                               const float *x, float *y, const tsr_exec *ex) {
    return TSR_IFACE(s, tsr_gemv_i)->run(s->inst, prepared, rows, x, y, ex);
}
/* default: the stored bytes */
static inline uint64_t tsr_gemv_bytes(const tsr_slot_ref *s, const void *prepared,
                                      uint64_t stored_bytes) {
    const tsr_gemv_i *i = TSR_IFACE(s, tsr_gemv_i);
    return TSR_HAS_MEMBER(i, tsr_gemv_i, bytes) ? i->bytes(s->inst, prepared) : stored_bytes;
}

/* kv_cache */
static inline int tsr_kv_seq_alloc(const tsr_slot_ref *s, int max_tokens, int *seq) {
    return TSR_IFACE(s, tsr_kv_cache_i)->seq_alloc(s->inst, max_tokens, seq);
}
static inline void tsr_kv_seq_free(const tsr_slot_ref *s, int seq) {
    TSR_IFACE(s, tsr_kv_cache_i)->seq_free(s->inst, seq);
}
static inline int tsr_kv_append(const tsr_slot_ref *s, int seq, int layer, int pos0, int rows,
                                const float *k, const float *v, const tsr_exec *ex) {
    return TSR_IFACE(s, tsr_kv_cache_i)->append(s->inst, seq, layer, pos0, rows, k, v, ex);
}
static inline int tsr_kv_view_get(const tsr_slot_ref *s, int seq, int layer, tsr_kv_view *out) {
    return TSR_IFACE(s, tsr_kv_cache_i)->view(s->inst, seq, layer, out);
}
static inline int tsr_kv_truncate(const tsr_slot_ref *s, int seq, int n_tokens) {
    return TSR_IFACE(s, tsr_kv_cache_i)->truncate(s->inst, seq, n_tokens);
}
/* default: 0 and 0 */
static inline void tsr_kv_usage(const tsr_slot_ref *s, uint64_t *used, uint64_t *capacity) {
    const tsr_kv_cache_i *i = TSR_IFACE(s, tsr_kv_cache_i);
    *used = *capacity = 0;
    if (TSR_HAS_MEMBER(i, tsr_kv_cache_i, usage)) i->usage(s->inst, used, capacity);
}

/* attention */
static inline int tsr_attention_run(const tsr_slot_ref *s, const tsr_attn_args *a,
                                    const tsr_exec *ex) {
    return TSR_IFACE(s, tsr_attention_i)->run(s->inst, a, ex);
}

/* expert_cache */
static inline int tsr_expert_attach(const tsr_slot_ref *s, const tsr_expert_source *src) {
    return TSR_IFACE(s, tsr_expert_cache_i)->attach(s->inst, src);
}
static inline int tsr_expert_lookup(const tsr_slot_ref *s, int layer, int n,
                                    const int32_t *experts, const tsr_expert_weights **out) {
    return TSR_IFACE(s, tsr_expert_cache_i)->lookup(s->inst, layer, n, experts, out);
}
static inline void tsr_expert_stats_get(const tsr_slot_ref *s, tsr_expert_stats *out) {
    TSR_IFACE(s, tsr_expert_cache_i)->stats(s->inst, out);
}
/* default: nothing */
static inline void tsr_expert_prefetch(const tsr_slot_ref *s, int layer, int n,
                                       const int32_t *experts) {
    const tsr_expert_cache_i *i = TSR_IFACE(s, tsr_expert_cache_i);
    if (TSR_HAS_MEMBER(i, tsr_expert_cache_i, prefetch)) i->prefetch(s->inst, layer, n, experts);
}

/* drafter */
static inline int tsr_drafter_propose(const tsr_slot_ref *s, const tsr_draft_req *r,
                                      tsr_draft_out *out) {
    return TSR_IFACE(s, tsr_drafter_i)->propose(s->inst, r, out);
}
/* default: nothing */
static inline void tsr_drafter_accept(const tsr_slot_ref *s, int seq, int n_proposed,
                                      int n_accepted) {
    const tsr_drafter_i *i = TSR_IFACE(s, tsr_drafter_i);
    if (TSR_HAS_MEMBER(i, tsr_drafter_i, accept)) i->accept(s->inst, seq, n_proposed, n_accepted);
}
/* default: nothing */
static inline void tsr_drafter_seq_end(const tsr_slot_ref *s, int seq) {
    const tsr_drafter_i *i = TSR_IFACE(s, tsr_drafter_i);
    if (TSR_HAS_MEMBER(i, tsr_drafter_i, seq_end)) i->seq_end(s->inst, seq);
}

#endif /* TSR_SLOT_CALLS_H */
