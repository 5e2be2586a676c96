/*
 * kv_blocks.h - the host-side bookkeeping of a paged KV cache: a pool of
 * fixed-size blocks shared by every sequence, and each sequence's block
 * table (the ids of its blocks, in token order). Plain C, no device and no
 * allocation of its own (the caller hands in the storage), so that it is
 * tested on the CPU (test_kv_blocks.c) and used by cuda_kv_paged.
 *
 * A sequence of n tokens holds exactly ceil(n / block_size) blocks: grow
 * takes the missing ones from the pool (all or none), shrink gives back the
 * ones past the tokens kept. Block ids are in [0, n_blocks); a free block is
 * on the free stack, a taken one in exactly one table.
 */
#ifndef TSR_KV_BLOCKS_H
#define TSR_KV_BLOCKS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsr_kv_blocks {
    int32_t *free_ids; /* [n_blocks] storage; the free ids are free_ids[0, n_free) */
    int n_free;
    int n_blocks;
    int block_size;    /* tokens per block */
} tsr_kv_blocks;

/* One sequence's table: ids[0, held) are its blocks, token t in block
 * ids[t / block_size]; cap is the most it may hold. */
typedef struct tsr_kv_table {
    int32_t *ids; /* [cap] */
    int held;
    int cap;
} tsr_kv_table;

/* A pool of n_blocks blocks of block_size tokens, every block free;
 * free_storage holds n_blocks ids. Blocks are taken lowest id first. */
void tsr_kv_blocks_init(tsr_kv_blocks *p, int n_blocks, int block_size, int32_t *free_storage);

/* Blocks needed for n tokens: ceil(n / block_size) (0 for n <= 0). */
int tsr_kv_blocks_for(const tsr_kv_blocks *p, int64_t n_tokens);

/* Make t hold the blocks of n_tokens tokens, taking the missing ones.
 * Returns 0; 1 if the pool has too few free blocks (nothing taken); 2 if
 * the table's cap is too small (nothing taken). Never shrinks. */
int tsr_kv_blocks_grow(tsr_kv_blocks *p, tsr_kv_table *t, int64_t n_tokens);

/* Give back t's blocks past those of n_tokens tokens (n_tokens <= 0: all).
 * Returns how many were given back. */
int tsr_kv_blocks_shrink(tsr_kv_blocks *p, tsr_kv_table *t, int64_t n_tokens);

/* Blocks taken (by every table together). */
static inline int tsr_kv_blocks_used(const tsr_kv_blocks *p) { return p->n_blocks - p->n_free; }

#ifdef __cplusplus
}
#endif

#endif /* TSR_KV_BLOCKS_H */
