/*
 * tsr_kv_cache.h - the kv_cache slot: where keys and values are kept.
 *
 * A kv_cache plugin owns the storage for any number of sequences. The
 * runtime appends the keys and values of new rows (f32, RoPE applied), asks
 * for a view that the attention plugin reads, and truncates a sequence when
 * drafted tokens are rejected. The view describes the plugin's layout so an
 * attention plugin can read it in place; the manifest's provides
 * (kv_dtype, kv_layout) let the checker refuse an attention plugin that
 * cannot read it.
 */
#ifndef TSR_KV_CACHE_H
#define TSR_KV_CACHE_H

#include "tsr_plugin.h"

#define TSR_KV_CACHE_IFACE_VERSION 2

typedef enum tsr_kv_layout {
    TSR_KV_CONTIGUOUS = 0, /* one run of tokens per sequence and layer */
    TSR_KV_PAGED = 1       /* fixed-size blocks found through a block table */
} tsr_kv_layout;

/* A read-only view of one layer of one sequence, valid until the next
 * append, truncate or seq_free on that sequence. */
typedef struct tsr_kv_view {
    uint32_t dtype;        /* tsr_dtype of stored elements: F32, F16, BF16, I8, F8_E4M3 */
    uint32_t layout;       /* tsr_kv_layout */
    int n_tokens;          /* tokens stored */
    int n_kv_heads;
    int head_dim;
    /* Element d of head h of token t of K is at k + elem_size *
     * (t * token_stride + h * head_stride + d) for CONTIGUOUS; for PAGED, t
     * is replaced by (t % block_size) and k by the block's base,
     * k + elem_size * block_table[t / block_size] * block_stride. Same for V. */
    const void *k;
    const void *v;
    int64_t token_stride;  /* elements */
    int64_t head_stride;   /* elements */
    /* I8 / F8_E4M3 only (NULL otherwise): the dequantisation scale of token
     * t, head h is k_scale[s * n_kv_heads + h] with s the token's slot index
     * computed like its elements (t for CONTIGUOUS, block*block_size+t%bs for PAGED). */
    const float *k_scale;
    const float *v_scale;
    /* PAGED only. */
    int block_size;
    const int32_t *block_table;
    int64_t block_stride;  /* elements */
} tsr_kv_view;

typedef struct tsr_kv_cache_i {
    uint32_t struct_size;
    uint32_t version; /* TSR_KV_CACHE_IFACE_VERSION */

    /* required: reserve a sequence for up to max_tokens tokens (every
     * layer). TSR_ERR_RANGE when the budget cannot hold it. */
    int (*seq_alloc)(void *inst, int max_tokens, int *seq);

    /* required: free a sequence; unknown ids are ignored. */
    void (*seq_free)(void *inst, int seq);

    /* required: store rows tokens at positions [pos0, pos0 + rows) of
     * layer. pos0 equals the layer's current length (append only).
     * k, v: f32 [rows, n_kv_heads, head_dim] on ex->device. */
    int (*append)(void *inst, int seq, int layer, int pos0, int rows, const float *k,
                  const float *v, const tsr_exec *ex);

    /* required: fill *out with a view of every token stored for layer. */
    int (*view)(void *inst, int seq, int layer, tsr_kv_view *out);

    /* required: cut every layer of the sequence holding more than n_tokens
     * to n_tokens (rollback of rejected drafts); layers holding fewer keep
     * theirs (a model cut to its first layers fills only those). n_tokens
     * above the longest layer, or negative, is an error. */
    int (*truncate)(void *inst, int seq, int n_tokens);

    /* optional (default: 0 and 0): bytes of KV in use and reserved. */
    void (*usage)(void *inst, uint64_t *used, uint64_t *capacity);

    /* --- version 2 --- */
    /* required of plugins that provide cuda_graph, else optional (default:
     * TSR_ERR_UNSUPPORTED): the host is about to replay a captured forward
     * pass whose kernels store rows tokens at [pos0, pos0 + rows) of layers
     * [0, n_layers) of seq; record it exactly as append() would have (check
     * and advance the lengths, find room), with no kernel of its own needed
     * for the stores. Called on the host before the replay is launched. */
    int (*replayed)(void *inst, int seq, int n_layers, int pos0, int rows);
} tsr_kv_cache_i;

#endif /* TSR_KV_CACHE_H */
