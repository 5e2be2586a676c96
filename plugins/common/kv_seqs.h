/*
 * kv_seqs.h - the sequence bookkeeping every kv_cache plugin needs, written
 * once: a table of sequence slots (each plugin's sequence struct starts with
 * a tsr_kv_seq_hdr), the token budget, per-layer lengths, the append order
 * and capacity checks, and the truncate rule of slots/tsr_kv_cache.h.
 * Header-only and host-free: it calls the host only through ctx->host.
 */
#ifndef TSR_PLUGINS_KV_SEQS_H
#define TSR_PLUGINS_KV_SEQS_H

#include <string.h>

#include "slots/tsr_kv_cache.h"

/* The first member of a plugin's sequence struct. */
typedef struct tsr_kv_seq_hdr {
    int used;        /* the slot holds a sequence */
    int max_tokens;  /* tokens reserved */
    int *lens;       /* [n_layers] tokens stored per layer */
} tsr_kv_seq_hdr;

typedef struct tsr_kv_seqs {
    const tsr_plugin_ctx *ctx;
    size_t elem;              /* size of the plugin's sequence struct */
    int n_layers;
    int64_t capacity_tokens;  /* 0: unbounded */
    int64_t reserved_tokens;
    void *items;              /* [n] sequence structs */
    int n;
} tsr_kv_seqs;

static inline void tsr_kv_seqs_init(tsr_kv_seqs *t, const tsr_plugin_ctx *ctx, size_t elem,
                                    int n_layers, int64_t capacity_tokens) {
    memset(t, 0, sizeof *t);
    t->ctx = ctx;
    t->elem = elem;
    t->n_layers = n_layers;
    t->capacity_tokens = capacity_tokens;
}

static inline tsr_kv_seq_hdr *tsr_kv_seqs_at(const tsr_kv_seqs *t, int i) {
    return (tsr_kv_seq_hdr *)((char *)t->items + (size_t)i * t->elem);
}

/* Take a slot for max_tokens tokens (budget checked, lengths allocated);
 * *id and *out name it. The plugin then allocates its storage, calling
 * tsr_kv_seqs_release if that fails. */
static inline int tsr_kv_seqs_reserve(tsr_kv_seqs *t, int max_tokens, int *id, tsr_kv_seq_hdr **out) {
    const tsr_host_api *h = t->ctx->host;
    if (max_tokens <= 0) {
        h->set_error(t->ctx, "max_tokens %d must be positive", max_tokens);
        return TSR_ERR_INVALID;
    }
    if (t->capacity_tokens > 0 && t->reserved_tokens + max_tokens > t->capacity_tokens) {
        h->set_error(t->ctx, "%d tokens do not fit: %lld of %lld reserved", max_tokens,
                     (long long)t->reserved_tokens, (long long)t->capacity_tokens);
        return TSR_ERR_RANGE;
    }
    int i = 0;
    while (i < t->n && tsr_kv_seqs_at(t, i)->used) i++;
    if (i == t->n) { /* full: double the table */
        int n = t->n ? t->n * 2 : 8;
        void *grown = h->alloc(t->ctx, (size_t)n * t->elem, 16);
        if (!grown) return TSR_ERR_NOMEM;
        if (t->n) memcpy(grown, t->items, (size_t)t->n * t->elem);
        h->free(t->ctx, t->items);
        t->items = grown;
        t->n = n;
    }
    tsr_kv_seq_hdr *s = tsr_kv_seqs_at(t, i);
    memset(s, 0, t->elem);
    s->lens = (int *)h->alloc(t->ctx, (size_t)t->n_layers * sizeof(int), 16);
    if (!s->lens) return TSR_ERR_NOMEM;
    s->used = 1;
    s->max_tokens = max_tokens;
    t->reserved_tokens += max_tokens;
    *id = i;
    *out = s;
    return TSR_OK;
}

/* Give a slot back (after the plugin freed its own storage). */
static inline void tsr_kv_seqs_release(tsr_kv_seqs *t, tsr_kv_seq_hdr *s) {
    if (!s->used) return;
    t->ctx->host->free(t->ctx, s->lens);
    t->reserved_tokens -= s->max_tokens;
    memset(s, 0, t->elem);
}

/* The sequence with id seq, or NULL (set_error) if there is none. */
static inline tsr_kv_seq_hdr *tsr_kv_seqs_get(const tsr_kv_seqs *t, int seq) {
    if (seq < 0 || seq >= t->n || !tsr_kv_seqs_at(t, seq)->used) {
        t->ctx->host->set_error(t->ctx, "unknown sequence %d", seq);
        return NULL;
    }
    return tsr_kv_seqs_at(t, seq);
}

/* Appends go at the end of a layer and within the reservation. */
static inline int tsr_kv_seqs_check_append(const tsr_kv_seqs *t, const tsr_kv_seq_hdr *s, int layer,
                                           int pos0, int rows) {
    if (layer < 0 || layer >= t->n_layers || rows < 0 || pos0 != s->lens[layer]) {
        t->ctx->host->set_error(t->ctx, "append at layer %d position %d: layer holds %d tokens", layer,
                                pos0, layer >= 0 && layer < t->n_layers ? s->lens[layer] : -1);
        return TSR_ERR_INVALID;
    }
    if ((int64_t)pos0 + rows > s->max_tokens) {
        t->ctx->host->set_error(t->ctx, "sequence full: %d + %d tokens > %d", pos0, rows, s->max_tokens);
        return TSR_ERR_RANGE;
    }
    return TSR_OK;
}

static inline int tsr_kv_seqs_check_layer(const tsr_kv_seqs *t, int layer) {
    if (layer >= 0 && layer < t->n_layers) return TSR_OK;
    t->ctx->host->set_error(t->ctx, "layer %d out of range", layer);
    return TSR_ERR_INVALID;
}

/* A captured pass of rows rows at pos0 replayed over layers [0, n_layers):
 * the same checks as each layer's append (kv_cache slot's replayed()). */
static inline int tsr_kv_seqs_check_replay(const tsr_kv_seqs *t, const tsr_kv_seq_hdr *s, int n_layers,
                                           int pos0, int rows) {
    if (n_layers <= 0 || n_layers > t->n_layers) return tsr_kv_seqs_check_layer(t, n_layers - 1);
    for (int l = 0; l < n_layers; l++) {
        int rc = tsr_kv_seqs_check_append(t, s, l, pos0, rows);
        if (rc != TSR_OK) return rc;
    }
    return TSR_OK;
}

/* rows more tokens stored in each of layers [0, n_layers). */
static inline void tsr_kv_seqs_advance(tsr_kv_seq_hdr *s, int n_layers, int rows) {
    for (int l = 0; l < n_layers; l++) s->lens[l] += rows;
}

/* Cut every layer holding more than n_tokens; layers holding fewer keep
 * theirs; n_tokens above the longest layer is an error. */
static inline int tsr_kv_seqs_truncate(const tsr_kv_seqs *t, tsr_kv_seq_hdr *s, int n_tokens) {
    int longest = 0;
    for (int l = 0; l < t->n_layers; l++)
        if (s->lens[l] > longest) longest = s->lens[l];
    if (n_tokens < 0 || n_tokens > longest) {
        t->ctx->host->set_error(t->ctx, "truncate to %d tokens: the sequence holds %d", n_tokens, longest);
        return TSR_ERR_INVALID;
    }
    for (int l = 0; l < t->n_layers; l++)
        if (s->lens[l] > n_tokens) s->lens[l] = n_tokens;
    return TSR_OK;
}

/* Tokens stored (layer 0) over every sequence. */
static inline uint64_t tsr_kv_seqs_tokens(const tsr_kv_seqs *t) {
    uint64_t n = 0;
    for (int i = 0; i < t->n; i++)
        if (tsr_kv_seqs_at(t, i)->used) n += (uint64_t)tsr_kv_seqs_at(t, i)->lens[0];
    return n;
}

/* Free the table itself (every sequence released first). */
static inline void tsr_kv_seqs_free(tsr_kv_seqs *t) {
    if (t->ctx) t->ctx->host->free(t->ctx, t->items);
    t->items = NULL;
    t->n = 0;
}

#endif /* TSR_PLUGINS_KV_SEQS_H */
