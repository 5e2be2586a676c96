/* test_drafter_ngram - prompt lookup proposals on hand-worked contexts and a
 * property check on random ones, through the plugin's built library. */
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

static tsr_manifest *man;
static conf_lib lib;
static const tsr_model_desc model = {.arch = "llama", .n_layers = 1, .vocab = 100};

static int setup(void **state) {
    (void)state;
    return conf_catalog_open("drafter_ngram", &man, &lib);
}

static int teardown(void **state) {
    (void)state;
    conf_lib_close(&lib);
    tsr_manifest_free(man);
    return 0;
}

static conf_inst *make(const char *const *set, int n_set) {
    conf_inst *ci;
    int rc = conf_inst_new(lib.desc, man, &model, set, n_set, NULL, &ci);
    if (rc) fprintf(stderr, "init: %s\n", ci ? ci->err : "?");
    assert_int_equal(rc, TSR_OK);
    return ci;
}

static int propose(conf_inst *ci, const int32_t *t, int n, int max_draft, int32_t *out, int *det) {
    tsr_draft_req r = {0, t, n, max_draft};
    tsr_draft_out o = {.tokens = out};
    assert_int_equal(CONF_MEMBER(ci, tsr_drafter_i, propose)(CONF_INST(ci), &r, &o), TSR_OK);
    if (det) *det = o.deterministic;
    assert_true(o.n >= 0 && o.n <= max_draft);
    return o.n;
}

static void test_basic_continuation(void **state) {
    (void)state;
    conf_inst *ci = make(NULL, 0);
    const int32_t t[] = {1, 2, 3, 4, 5, 1, 2, 3};
    int32_t out[16];
    int det = 0;
    int n = propose(ci, t, 8, 16, out, &det);
    /* "1 2 3" occurred at 0; what followed it, up to the context's end */
    const int32_t want[] = {4, 5, 1, 2, 3};
    assert_int_equal(n, 5);
    assert_memory_equal(out, want, sizeof want);
    assert_int_equal(det, 1);
    /* the request's max_draft caps it */
    assert_int_equal(propose(ci, t, 8, 2, out, NULL), 2);
    assert_int_equal(out[0], 4);
    assert_int_equal(out[1], 5);
    conf_inst_free(ci);
}

static void test_longest_match_first(void **state) {
    (void)state;
    conf_inst *ci = make(NULL, 0);
    /* "9" alone last occurred at 6 (followed by 12); "7 8 9" at 0 (followed by 10) */
    const int32_t t[] = {7, 8, 9, 10, 11, 5, 9, 12, 7, 8, 9};
    int32_t out[4];
    int n = propose(ci, t, 11, 4, out, NULL);
    const int32_t want[] = {10, 11, 5, 9};
    assert_int_equal(n, 4);
    assert_memory_equal(out, want, sizeof want);
    /* with n = 1 only the newest "9" counts */
    const char *set[] = {"n=1"};
    conf_inst *c1 = make(set, 1);
    n = propose(c1, t, 11, 4, out, NULL);
    const int32_t want1[] = {12, 7, 8, 9};
    assert_int_equal(n, 4);
    assert_memory_equal(out, want1, sizeof want1);
    conf_inst_free(c1);
    conf_inst_free(ci);
}

static void test_newest_occurrence_and_param_cap(void **state) {
    (void)state;
    const char *set[] = {"n=2", "max_draft=3"};
    conf_inst *ci = make(set, 2);
    /* "4 5" at 0 (then 6) and at 4 (then 8): the newer one wins */
    const int32_t t[] = {4, 5, 6, 0, 4, 5, 8, 9, 7, 3, 4, 5};
    int32_t out[8];
    int n = propose(ci, t, 12, 8, out, NULL);
    const int32_t want[] = {8, 9, 7};
    assert_int_equal(n, 3); /* the param caps it below the request's 8 */
    assert_memory_equal(out, want, sizeof want);
    conf_inst_free(ci);
}

static void test_no_match(void **state) {
    (void)state;
    const char *set[] = {"n=3", "min_n=2"};
    conf_inst *ci = make(set, 2);
    int32_t out[8];
    /* the last token 9 recurs, but no 2-gram does: min_n = 2 proposes nothing */
    const int32_t t[] = {1, 9, 2, 3, 9};
    assert_int_equal(propose(ci, t, 5, 8, out, NULL), 0);
    conf_inst_free(ci);
    ci = make(NULL, 0);
    assert_int_equal(propose(ci, t, 5, 8, out, NULL), 3); /* min_n = 1: "9" -> 2 3 9 */
    assert_int_equal(propose(ci, t, 1, 8, out, NULL), 0);
    assert_int_equal(propose(ci, t, 0, 8, out, NULL), 0);
    assert_int_equal(propose(ci, t, 5, 0, out, NULL), 0);
    conf_inst_free(ci);
}

static void test_invalid_ids_not_proposed(void **state) {
    (void)state;
    conf_inst *ci = make(NULL, 0); /* vocab 100 */
    const int32_t t[] = {1, 2, 50, 150, 3, 1, 2};
    int32_t out[8];
    int n = propose(ci, t, 7, 8, out, NULL);
    assert_int_equal(n, 1); /* stops before 150, an id outside the vocabulary */
    assert_int_equal(out[0], 50);
    conf_inst_free(ci);
}

static void test_bad_request_and_params(void **state) {
    (void)state;
    conf_inst *ci = make(NULL, 0);
    tsr_draft_req r = {0, NULL, 4, 2};
    int32_t out[2];
    tsr_draft_out o = {.tokens = out};
    assert_int_equal(CONF_MEMBER(ci, tsr_drafter_i, propose)(CONF_INST(ci), &r, &o), TSR_ERR_INVALID);
    assert_non_null(strstr(ci->err, "n_tokens"));
    conf_inst_free(ci);
    const char *set[] = {"n=2", "min_n=3"};
    conf_inst *bad;
    assert_int_equal(conf_inst_new(lib.desc, man, &model, set, 2, NULL, &bad), TSR_ERR_INVALID);
    assert_non_null(strstr(bad->err, "min_n"));
    conf_inst_free(bad);
}

/* Random contexts over a small alphabet: every proposal must be the
 * continuation of an earlier occurrence of the context's last m tokens for
 * the largest m that has one, and that occurrence the newest. */
static void test_random_property(void **state) {
    (void)state;
    const char *set[] = {"n=4", "max_draft=6"};
    conf_inst *ci = make(set, 2);
    uint32_t s = 12345u;
    printf("seed 12345\n");
    int32_t t[64], out[6];
    int proposals = 0;
    for (int iter = 0; iter < 2000; iter++) {
        int len = 2 + (int)((s = s * 1664525u + 1013904223u) >> 27) % 60;
        for (int i = 0; i < len; i++) t[i] = (int32_t)(((s = s * 1664525u + 1013904223u) >> 24) % 5);
        int n = propose(ci, t, len, 6, out, NULL);
        /* independent check: best m and newest start by brute force over every start */
        int best_m = 0, best_i = -1;
        for (int m = 1; m <= 4 && m < len; m++)
            for (int i = 0; i + m < len; i++) {
                int eq = 1;
                for (int j = 0; j < m; j++) eq &= t[i + j] == t[len - m + j];
                if (eq && (m > best_m || (m == best_m && i > best_i))) best_m = m, best_i = i;
            }
        if (best_i < 0) {
            assert_int_equal(n, 0);
            continue;
        }
        int avail = len - (best_i + best_m);
        assert_int_equal(n, avail < 6 ? avail : 6);
        for (int j = 0; j < n; j++) assert_int_equal(out[j], t[best_i + best_m + j]);
        proposals += n > 0;
    }
    assert_true(proposals > 1000);
    assert_int_equal(ci->live_allocs, 1); /* only the instance itself */
    conf_inst_free(ci);
}

/* adaptive: the draft length follows acceptance, drafting pauses after
 * rejections (2 steps, then 4), sequences keep their own state, and
 * seq_end forgets it. */
static void test_adaptive(void **state) {
    (void)state;
    const char *set[] = {"max_draft=8", "adaptive=true"};
    conf_inst *ci = make(set, 2);
    void (*accept)(void *, int, int, int) = CONF_MEMBER(ci, tsr_drafter_i, accept);
    void (*seq_end)(void *, int) = CONF_MEMBER(ci, tsr_drafter_i, seq_end);
    assert_non_null(accept);
    assert_non_null(seq_end);
    int32_t t[40], out[8];
    for (int i = 0; i < 40; i++) t[i] = i % 10; /* every suffix has a match: 8 tokens available */
    int n = propose(ci, t, 40, 8, out, NULL);
    assert_int_equal(n, 8);
    accept(CONF_INST(ci), 0, 8, 3); /* some accepted: k = 3 + 1 */
    assert_int_equal(propose(ci, t, 40, 8, out, NULL), 4);
    accept(CONF_INST(ci), 0, 4, 4); /* all accepted: k + 2 */
    assert_int_equal(propose(ci, t, 40, 8, out, NULL), 6);
    accept(CONF_INST(ci), 0, 6, 0); /* none: halved */
    assert_int_equal(propose(ci, t, 40, 8, out, NULL), 3);
    accept(CONF_INST(ci), 0, 3, 0); /* none twice: halved, and 2 steps without drafts */
    assert_int_equal(propose(ci, t, 40, 8, out, NULL), 0);
    assert_int_equal(propose(ci, t, 40, 8, out, NULL), 0);
    assert_int_equal(propose(ci, t, 40, 8, out, NULL), 1);
    accept(CONF_INST(ci), 0, 1, 0);
    assert_int_equal(propose(ci, t, 40, 8, out, NULL), 1);
    accept(CONF_INST(ci), 0, 1, 0); /* again: 4 steps this time */
    for (int i = 0; i < 4; i++) assert_int_equal(propose(ci, t, 40, 8, out, NULL), 0);
    assert_int_equal(propose(ci, t, 40, 8, out, NULL), 1);
    /* another sequence starts fresh */
    tsr_draft_req r = {7, t, 40, 8};
    tsr_draft_out o = {.tokens = out};
    assert_int_equal(CONF_MEMBER(ci, tsr_drafter_i, propose)(CONF_INST(ci), &r, &o), TSR_OK);
    assert_int_equal(o.n, 8);
    /* seq 0 ended: its state goes, a new seq 0 starts at max_draft */
    seq_end(CONF_INST(ci), 0);
    assert_int_equal(propose(ci, t, 40, 8, out, NULL), 8);
    conf_inst_free(ci);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adaptive),
        cmocka_unit_test(test_basic_continuation),
        cmocka_unit_test(test_longest_match_first),
        cmocka_unit_test(test_newest_occurrence_and_param_cap),
        cmocka_unit_test(test_no_match),
        cmocka_unit_test(test_invalid_ids_not_proposed),
        cmocka_unit_test(test_bad_request_and_params),
        cmocka_unit_test(test_random_property),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
