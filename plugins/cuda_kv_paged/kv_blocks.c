/* kv_blocks.c - the block pool and block tables of a paged KV cache (kv_blocks.h). */
#include "plugins/cuda_kv_paged/kv_blocks.h"

void tsr_kv_blocks_init(tsr_kv_blocks *p, int n_blocks, int block_size, int32_t *free_storage) {
    p->free_ids = free_storage;
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->n_free = n_blocks;
    /* a stack popped from the top: id 0 on top, so blocks go out lowest first */
    for (int i = 0; i < n_blocks; i++) free_storage[i] = n_blocks - 1 - i;
}

int tsr_kv_blocks_for(const tsr_kv_blocks *p, int64_t n_tokens) {
    if (n_tokens <= 0) return 0;
    return (int)((n_tokens + p->block_size - 1) / p->block_size);
}

int tsr_kv_blocks_grow(tsr_kv_blocks *p, tsr_kv_table *t, int64_t n_tokens) {
    const int64_t want = n_tokens <= 0 ? 0 : (n_tokens + p->block_size - 1) / p->block_size;
    if (want <= t->held) return 0;
    if (want > t->cap) return 2;
    if (want - t->held > p->n_free) return 1;
    while (t->held < want) t->ids[t->held++] = p->free_ids[--p->n_free];
    return 0;
}

int tsr_kv_blocks_shrink(tsr_kv_blocks *p, tsr_kv_table *t, int64_t n_tokens) {
    const int keep = tsr_kv_blocks_for(p, n_tokens);
    int given = 0;
    while (t->held > keep) {
        p->free_ids[p->n_free++] = t->ids[--t->held];
        given++;
    }
    return given;
}
