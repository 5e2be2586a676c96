/* test_expert_lru - the LRU expert cache against a reference LRU written
 * here (a recency list), with a source that records every load and unload. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/host/diag.h"
#include "core/host/manifest.h"
#include "tests/conformance/conf_host.h"

#define L 4
#define E 16

static tsr_manifest *man;
static conf_lib lib;
static const tsr_model_desc model = {.arch = "qwen3_moe", .n_layers = L, .n_experts = E, .n_experts_used = 2};

/* The fake source: each expert's "weights" point at a tag naming it. */
typedef struct fake_src {
    int tags[L][E][3];
    int loaded[L][E];
    int n_loads, n_unloads, live;
    int fail_layer, fail_expert; /* load of this one fails (-1: none) */
    int dense_layer;             /* answers TSR_ERR_INVALID (-1: none) */
} fake_src;

static int fake_load(void *data, int layer, int e, tsr_expert_weights *out, uint64_t *bytes) {
    fake_src *f = data;
    if (layer == f->dense_layer) return TSR_ERR_INVALID;
    if (layer == f->fail_layer && e == f->fail_expert) return TSR_ERR_IO;
    assert_false(f->loaded[layer][e]); /* never loaded twice */
    f->loaded[layer][e] = 1;
    f->n_loads++;
    f->live++;
    for (int i = 0; i < 3; i++) f->tags[layer][e][i] = (layer * E + e) * 3 + i;
    out->gate = &f->tags[layer][e][0];
    out->up = &f->tags[layer][e][1];
    out->down = &f->tags[layer][e][2];
    *bytes = 1000 + (uint64_t)e;
    return TSR_OK;
}

static void fake_unload(void *data, int layer, int e, tsr_expert_weights *w) {
    fake_src *f = data;
    assert_true(f->loaded[layer][e]);
    assert_ptr_equal(w->gate, &f->tags[layer][e][0]);
    f->loaded[layer][e] = 0;
    f->n_unloads++;
    f->live--;
}

static tsr_expert_source mksrc(fake_src *f) {
    memset(f, 0, sizeof *f);
    f->fail_layer = f->fail_expert = f->dense_layer = -1;
    return (tsr_expert_source){L, E, f, fake_load, fake_unload};
}

static int setup(void **state) {
    (void)state;
    return conf_catalog_open("expert_lru", &man, &lib);
}

static int teardown(void **state) {
    (void)state;
    conf_lib_close(&lib);
    tsr_manifest_free(man);
    return 0;
}

static conf_inst *make(const char *const *set, int n_set, const tsr_expert_source *src) {
    conf_inst *ci;
    int rc = conf_inst_new(lib.desc, man, &model, set, n_set, NULL, &ci);
    if (rc) fprintf(stderr, "init: %s\n", ci ? ci->err : "?");
    assert_int_equal(rc, TSR_OK);
    assert_int_equal(CONF_MEMBER(ci, tsr_expert_cache_i, attach)(CONF_INST(ci), src), TSR_OK);
    return ci;
}

static int lookup(conf_inst *ci, int layer, int n, const int32_t *ids, const tsr_expert_weights **out) {
    return CONF_MEMBER(ci, tsr_expert_cache_i, lookup)(CONF_INST(ci), layer, n, ids, out);
}

static tsr_expert_stats stats(conf_inst *ci) {
    tsr_expert_stats s;
    CONF_MEMBER(ci, tsr_expert_cache_i, stats)(CONF_INST(ci), &s);
    return s;
}

/* Reference LRU: keys in recency order, most recent last. */
typedef struct ref_lru {
    int keys[L * E];
    int n, budget;
    uint64_t hits, misses, evictions;
} ref_lru;

static void ref_lookup(ref_lru *r, int layer, int n, const int32_t *ids) {
    int pinned[8] = {0}, np = 0;
    for (int i = 0; i < n; i++) {
        int key = layer * E + ids[i], at = -1;
        for (int j = 0; j < r->n; j++)
            if (r->keys[j] == key) at = j;
        if (at >= 0) {
            r->hits++;
            memmove(r->keys + at, r->keys + at + 1, (size_t)(r->n - at - 1) * sizeof(int));
            r->n--;
        } else {
            r->misses++;
            if (r->n == r->budget) { /* oldest not pinned by this lookup */
                int v = 0;
                for (;; v++) {
                    int pin = 0;
                    for (int q = 0; q < np; q++) pin |= pinned[q] == r->keys[v];
                    if (!pin) break;
                }
                memmove(r->keys + v, r->keys + v + 1, (size_t)(r->n - v - 1) * sizeof(int));
                r->n--;
                r->evictions++;
            }
        }
        r->keys[r->n++] = key;
        pinned[np++] = key;
    }
}

static void test_matches_reference_lru(void **state) {
    (void)state;
    const int budgets[] = {2, 3, 8, 17, 64};
    printf("seed 777\n");
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
        fake_src f;
        tsr_expert_source src = mksrc(&f);
        char set0[32];
        snprintf(set0, sizeof set0, "budget=%d", budgets[b]);
        const char *set[] = {set0};
        conf_inst *ci = make(set, 1, &src);
        ref_lru ref = {.budget = budgets[b]};
        uint32_t s = 777u;
        for (int step = 0; step < 3000; step++) {
            int layer = step % L;
            /* skewed routing: experts 0..3 most of the time */
            int32_t ids[2];
            s = s * 1664525u + 1013904223u;
            ids[0] = (int32_t)((s >> 28) < 12 ? (s >> 20) % 4 : (s >> 20) % E);
            s = s * 1664525u + 1013904223u;
            ids[1] = (int32_t)((s >> 20) % E);
            int n = ids[1] == ids[0] ? 1 : 2;
            const tsr_expert_weights *out[2];
            assert_int_equal(lookup(ci, layer, n, ids, out), TSR_OK);
            ref_lookup(&ref, layer, n, ids);
            for (int i = 0; i < n; i++) { /* the right weights, all valid at once */
                assert_ptr_equal(out[i]->gate, &f.tags[layer][ids[i]][0]);
                assert_ptr_equal(out[i]->down, &f.tags[layer][ids[i]][2]);
                assert_true(f.loaded[layer][ids[i]]);
            }
            tsr_expert_stats st = stats(ci);
            assert_int_equal(st.resident, (uint64_t)f.live);
            assert_true(f.live <= budgets[b]);
        }
        tsr_expert_stats st = stats(ci);
        assert_int_equal(st.hits, ref.hits);
        assert_int_equal(st.misses, ref.misses);
        assert_int_equal(st.evictions, ref.evictions);
        assert_int_equal(st.misses, (uint64_t)f.n_loads);
        assert_int_equal(st.evictions, (uint64_t)f.n_unloads);
        uint64_t want_bytes = 0;
        for (int l = 0; l < L; l++)
            for (int e = 0; e < E; e++)
                if (f.loaded[l][e]) want_bytes += 1000 + (uint64_t)e;
        assert_int_equal(st.resident_bytes, want_bytes);
        printf("budget %2d: %llu hits, %llu misses\n", budgets[b], (unsigned long long)st.hits,
               (unsigned long long)st.misses);
        conf_inst_free(ci);
        assert_int_equal(f.live, 0); /* fini releases every resident expert */
    }
}

static void test_budget_too_small_and_errors(void **state) {
    (void)state;
    fake_src f;
    tsr_expert_source src = mksrc(&f);
    const char *set[] = {"budget=2"};
    conf_inst *ci = make(set, 1, &src);
    const tsr_expert_weights *out[3];
    const int32_t three[] = {1, 2, 3};
    assert_int_equal(lookup(ci, 0, 3, three, out), TSR_ERR_RANGE);
    assert_non_null(strstr(ci->err, "budget"));
    const int32_t bad[] = {1, 16};
    assert_int_equal(lookup(ci, 0, 2, bad, out), TSR_ERR_INVALID);
    assert_int_equal(lookup(ci, 4, 1, three, out), TSR_ERR_INVALID);
    /* a failing load is reported and leaves the cache consistent */
    f.fail_layer = 1;
    f.fail_expert = 5;
    const int32_t five[] = {4, 5};
    assert_int_equal(lookup(ci, 1, 2, five, out), TSR_ERR_IO);
    assert_non_null(strstr(ci->err, "expert 5 of layer 1"));
    f.fail_layer = -1;
    assert_int_equal(lookup(ci, 1, 2, five, out), TSR_OK);
    assert_int_equal(stats(ci).resident, 2);
    /* a dense layer */
    f.dense_layer = 2;
    assert_int_equal(lookup(ci, 2, 1, three, out), TSR_ERR_INVALID);
    conf_inst_free(ci);
    assert_int_equal(f.live, 0);
    /* a second attach is refused */
    ci = make(set, 1, &src);
    assert_int_equal(CONF_MEMBER(ci, tsr_expert_cache_i, attach)(CONF_INST(ci), &src), TSR_ERR_INVALID);
    conf_inst_free(ci);
}

/* Routing with a fixed layer-to-layer pattern: expert e in layer l is
 * followed by (e * 5 + 3) % E in layer l + 1. Once learned, prefetch turns
 * the next layer's misses into hits; without it a small budget misses. */
static void test_prefetch_learns_transitions(void **state) {
    (void)state;
    uint64_t hits[2];
    for (int pf = 0; pf < 2; pf++) {
        fake_src f;
        tsr_expert_source src = mksrc(&f);
        const char *set[] = {"budget=6", pf ? "prefetch=2" : "prefetch=0"};
        conf_inst *ci = make(set, 2, &src);
        uint32_t s = 99u;
        for (int tok = 0; tok < 400; tok++) {
            s = s * 1664525u + 1013904223u;
            int32_t ids[2] = {(int32_t)((s >> 20) % E), 0};
            ids[1] = (ids[0] + 1 + (int32_t)((s >> 8) % (E - 1))) % E;
            for (int l = 0; l < L; l++) {
                const tsr_expert_weights *out[2];
                assert_int_equal(lookup(ci, l, 2, ids, out), TSR_OK);
                for (int i = 0; i < 2; i++) assert_ptr_equal(out[i]->up, &f.tags[l][ids[i]][1]);
                for (int i = 0; i < 2; i++) ids[i] = (ids[i] * 5 + 3) % E;
                if (ids[0] > ids[1]) {
                    int32_t t = ids[0];
                    ids[0] = ids[1];
                    ids[1] = t;
                }
            }
        }
        hits[pf] = stats(ci).hits;
        assert_true(f.live <= 6);
        conf_inst_free(ci);
        assert_int_equal(f.live, 0);
    }
    printf("hits without prefetch %llu, with %llu of 3200\n", (unsigned long long)hits[0],
           (unsigned long long)hits[1]);
    assert_true(hits[1] > hits[0] + 1500); /* layers 1..3 become hits */
}

static void test_prefetch_member_and_bad_params(void **state) {
    (void)state;
    fake_src f;
    tsr_expert_source src = mksrc(&f);
    const char *set[] = {"budget=4"};
    conf_inst *ci = make(set, 1, &src);
    const int32_t ids[] = {7, 9};
    CONF_MEMBER(ci, tsr_expert_cache_i, prefetch)(CONF_INST(ci), 3, 2, ids);
    assert_int_equal(f.n_loads, 2);
    const tsr_expert_weights *out[2];
    assert_int_equal(lookup(ci, 3, 2, ids, out), TSR_OK);
    tsr_expert_stats st = stats(ci);
    assert_int_equal(st.hits, 2);
    assert_int_equal(st.misses, 0);
    conf_inst_free(ci);
    const char *bad[] = {"budget=0"};
    conf_inst *b;
    assert_int_equal(conf_inst_new(lib.desc, man, &model, bad, 1, NULL, &b), TSR_ERR_INVALID);
    assert_non_null(strstr(b->err, "budget"));
    conf_inst_free(b);
}

static void test_alloc_failure_is_clean(void **state) {
    (void)state;
    for (uint64_t n = 1; n < 12; n++) {
        fake_src f;
        tsr_expert_source src = mksrc(&f);
        const char *set[] = {"budget=8", "prefetch=1"};
        conf_inst *ci;
        assert_int_equal(conf_inst_new(lib.desc, man, &model, set, 2, NULL, &ci), TSR_OK);
        ci->fail_at = n;
        int rc = CONF_MEMBER(ci, tsr_expert_cache_i, attach)(CONF_INST(ci), &src);
        assert_true(rc == TSR_OK || rc == TSR_ERR_NOMEM);
        conf_inst_free(ci); /* fini copes with a half-attached instance (ASan checks leaks) */
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_reference_lru),
        cmocka_unit_test(test_budget_too_small_and_errors),
        cmocka_unit_test(test_prefetch_learns_transitions),
        cmocka_unit_test(test_prefetch_member_and_bad_params),
        cmocka_unit_test(test_alloc_failure_is_clean),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
