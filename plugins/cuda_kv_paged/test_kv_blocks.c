/*
 * The block pool and tables of cuda_kv_paged (kv_blocks.c), on the CPU:
 * blocks taken on demand (ceil(tokens / block_size), lowest ids first, all
 * or none), given back on shrink, never in two tables at once, a pool
 * exhausted answered without taking anything; and a random script of grow /
 * shrink over several sequences checked against a model that counts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "plugins/cuda_kv_paged/kv_blocks.h"

/* Every block is either free or in exactly one of the tables. */
static void check_partition(const tsr_kv_blocks *p, tsr_kv_table *t, int n_tables) {
    int *seen = calloc((size_t)p->n_blocks, sizeof *seen);
    assert_non_null(seen);
    for (int i = 0; i < p->n_free; i++) {
        assert_true(p->free_ids[i] >= 0 && p->free_ids[i] < p->n_blocks);
        seen[p->free_ids[i]]++;
    }
    int held = 0;
    for (int j = 0; j < n_tables; j++)
        for (int i = 0; i < t[j].held; i++) {
            assert_true(t[j].ids[i] >= 0 && t[j].ids[i] < p->n_blocks);
            seen[t[j].ids[i]]++;
            held++;
        }
    for (int b = 0; b < p->n_blocks; b++) assert_int_equal(seen[b], 1);
    assert_int_equal(tsr_kv_blocks_used(p), held);
    free(seen);
}

static void test_grow_shrink(void **state) {
    (void)state;
    int32_t free_ids[8], ids[5];
    tsr_kv_blocks p;
    tsr_kv_blocks_init(&p, 8, 16, free_ids);
    tsr_kv_table t = {ids, 0, 5};
    assert_int_equal(tsr_kv_blocks_for(&p, 0), 0);
    assert_int_equal(tsr_kv_blocks_for(&p, 1), 1);
    assert_int_equal(tsr_kv_blocks_for(&p, 16), 1);
    assert_int_equal(tsr_kv_blocks_for(&p, 17), 2);
    assert_int_equal(tsr_kv_blocks_grow(&p, &t, 1), 0);
    assert_int_equal(t.held, 1);
    assert_int_equal(ids[0], 0); /* lowest first */
    assert_int_equal(tsr_kv_blocks_grow(&p, &t, 16), 0); /* still one block */
    assert_int_equal(t.held, 1);
    assert_int_equal(tsr_kv_blocks_grow(&p, &t, 33), 0);
    assert_int_equal(t.held, 3);
    assert_int_equal(ids[1], 1);
    assert_int_equal(ids[2], 2);
    assert_int_equal(tsr_kv_blocks_grow(&p, &t, 20), 0); /* never shrinks */
    assert_int_equal(t.held, 3);
    assert_int_equal(tsr_kv_blocks_grow(&p, &t, 81), 2); /* 6 blocks > cap 5: nothing taken */
    assert_int_equal(t.held, 3);
    assert_int_equal(tsr_kv_blocks_used(&p), 3);
    assert_int_equal(tsr_kv_blocks_shrink(&p, &t, 17), 1); /* 17 tokens keep 2 blocks */
    assert_int_equal(t.held, 2);
    assert_int_equal(tsr_kv_blocks_shrink(&p, &t, 32), 0);
    assert_int_equal(tsr_kv_blocks_grow(&p, &t, 40), 0); /* block 2 comes back first */
    assert_int_equal(ids[2], 2);
    check_partition(&p, &t, 1);
    assert_int_equal(tsr_kv_blocks_shrink(&p, &t, 0), 3);
    assert_int_equal(t.held, 0);
    assert_int_equal(p.n_free, 8);
    check_partition(&p, &t, 1);
}

static void test_exhausted(void **state) {
    (void)state;
    int32_t free_ids[4], a_ids[4], b_ids[4];
    tsr_kv_blocks p;
    tsr_kv_blocks_init(&p, 4, 4, free_ids);
    tsr_kv_table a = {a_ids, 0, 4}, b = {b_ids, 0, 4};
    assert_int_equal(tsr_kv_blocks_grow(&p, &a, 12), 0); /* 3 blocks */
    assert_int_equal(tsr_kv_blocks_grow(&p, &b, 5), 1);  /* 2 needed, 1 free: nothing taken */
    assert_int_equal(b.held, 0);
    assert_int_equal(p.n_free, 1);
    assert_int_equal(tsr_kv_blocks_grow(&p, &b, 4), 0); /* the last one */
    assert_int_equal(tsr_kv_blocks_grow(&p, &a, 13), 1);
    assert_int_equal(a.held, 3);
    tsr_kv_table both[2] = {a, b};
    check_partition(&p, both, 2);
    assert_int_equal(tsr_kv_blocks_shrink(&p, &a, 4), 2); /* freed blocks serve the other */
    assert_int_equal(tsr_kv_blocks_grow(&p, &b, 12), 0);
    assert_int_equal(b.held, 3);
    both[0] = a;
    both[1] = b;
    check_partition(&p, both, 2);
}

/* A random script over 3 sequences against counts kept here. */
static void test_random_script(void **state) {
    (void)state;
    enum { NB = 37, BS = 5, NS = 3, CAP = 20 };
    int32_t free_ids[NB], ids[NS][CAP];
    tsr_kv_blocks p;
    tsr_kv_blocks_init(&p, NB, BS, free_ids);
    tsr_kv_table t[NS];
    int tokens[NS] = {0};
    for (int i = 0; i < NS; i++) t[i] = (tsr_kv_table){ids[i], 0, CAP};
    srand(7);
    for (int step = 0; step < 5000; step++) {
        const int s = rand() % NS;
        if (rand() % 3) {
            const int n = tokens[s] + rand() % 13;
            const int need = (n + BS - 1) / BS, held = t[s].held, free_before = p.n_free;
            const int extra = need > held ? need - held : 0;
            const int rc = tsr_kv_blocks_grow(&p, &t[s], n);
            if (need > CAP) {
                assert_int_equal(rc, 2);
            } else if (extra > free_before) {
                assert_int_equal(rc, 1);
            } else {
                assert_int_equal(rc, 0);
                assert_int_equal(p.n_free, free_before - extra);
                tokens[s] = n;
            }
            if (rc) assert_int_equal(t[s].held, held);
        } else {
            const int n = tokens[s] ? rand() % (tokens[s] + 1) : 0;
            const int before = t[s].held;
            const int given = tsr_kv_blocks_shrink(&p, &t[s], n);
            assert_int_equal(t[s].held, (n + BS - 1) / BS);
            assert_int_equal(given, before - t[s].held);
            tokens[s] = n;
        }
        assert_int_equal(t[s].held, (tokens[s] + BS - 1) / BS);
        check_partition(&p, t, NS);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grow_shrink),
        cmocka_unit_test(test_exhausted),
        cmocka_unit_test(test_random_script),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
