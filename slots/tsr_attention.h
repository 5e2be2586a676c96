/*
 * tsr_attention.h - the attention slot: softmax(q K^T * scale) V over the
 * keys and values a kv_cache plugin stores.
 */
#ifndef TSR_ATTENTION_H
#define TSR_ATTENTION_H

#include "tsr_plugin.h"
#include "tsr_kv_cache.h"

#define TSR_ATTENTION_IFACE_VERSION 1

typedef struct tsr_attn_args {
    int rows;             /* query rows */
    int pos0;             /* row i is position pos0 + i and sees KV tokens [0, pos0 + i] */
    int n_heads;          /* query heads; a multiple of n_kv_heads (GQA) */
    int n_kv_heads;
    int head_dim;
    float scale;          /* usually 1 / sqrt(head_dim) */
    int window;           /* sliding window in tokens, 0 for none */
    const float *q;       /* [rows, n_heads, head_dim], RoPE applied */
    const tsr_kv_view *kv; /* holds at least pos0 + rows tokens */
    float *out;           /* [rows, n_heads * head_dim] */
} tsr_attn_args;

typedef struct tsr_attention_i {
    uint32_t struct_size;
    uint32_t version; /* TSR_ATTENTION_IFACE_VERSION */

    /* required: causal attention of every row over the view. Returns
     * TSR_ERR_UNSUPPORTED for a KV dtype or layout it cannot read (the checker
     * should have refused such an assembly already). */
    int (*run)(void *inst, const tsr_attn_args *a, const tsr_exec *ex);
} tsr_attention_i;

#endif /* TSR_ATTENTION_H */
