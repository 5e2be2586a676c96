/*
 * Tests of core/runtime/sampler.c against references computed here in
 * double precision: each rule on hand-made logits, partial selection against
 * a full sort, seeds, chi-square goodness of fit of the draws (and of
 * speculative verification), log-probabilities.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/runtime/sampling.h"

/* --- references ----------------------------------------------------------- */

/* Softmax in double over the tokens with keep[i] (all when keep is NULL). */
static void ref_softmax(const double *l, const int *keep, int n, double *out) {
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < n; i++)
        if ((!keep || keep[i]) && l[i] > mx) mx = l[i];
    for (int i = 0; i < n; i++) {
        out[i] = (!keep || keep[i]) ? exp(l[i] - mx) : 0.0;
        z += out[i];
    }
    for (int i = 0; i < n; i++) out[i] /= z;
}

static void assert_probs_near(const float *got, const double *want, int n, double tol) {
    for (int i = 0; i < n; i++) {
        if (fabs((double)got[i] - want[i]) > tol) {
            fail_msg("token %d: probability %.9g, expected %.9g", i, (double)got[i], want[i]);
        }
    }
}

static tsr_sampling params_t1(uint64_t seed) {
    tsr_sampling p = tsr_sampling_greedy();
    p.temperature = 1.0f;
    p.seed = seed;
    p.has_seed = 1;
    return p;
}

/* A fixed pseudo-random sequence for test data, independent of the sampler. */
static uint64_t lcg_state;
static double lcg_uniform(void) {
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg_state >> 11) * 0x1.0p-53;
}

/* chi-square quantiles at 0.999 for df = 1..7 */
static const double chi2_999[] = {0, 10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322};

static double chi_square(const long *obs, const double *p, int n, long total, int *df) {
    double x = 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] == 0) {
            if (obs[i] != 0) fail_msg("token %d drawn %ld times with probability 0", i, obs[i]);
            continue;
        }
        double e = p[i] * (double)total;
        x += ((double)obs[i] - e) * ((double)obs[i] - e) / e;
        k++;
    }
    *df = k - 1;
    return x;
}

/* --- greedy --------------------------------------------------------------- */

static void test_greedy_argmax_ties_nan(void **state) {
    (void)state;
    tsr_sampling g = tsr_sampling_greedy();
    tsr_sampler *s = tsr_sampler_new(&g, 6);
    assert_non_null(s);
    float l1[6] = {1.0f, 3.0f, 2.0f, 3.0f, -INFINITY, NAN};
    assert_int_equal(tsr_sampler_sample(s, l1, NULL, 0, 0, 0, NULL), 1); /* tie: lowest id */
    float l2[6] = {NAN, -1.0f, NAN, -0.5f, NAN, -2.0f};
    assert_int_equal(tsr_sampler_sample(s, l2, NULL, 0, 0, 0, NULL), 3);
    float l3[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
    assert_int_equal(tsr_sampler_sample(s, l3, NULL, 0, 0, 0, NULL), -1);
    float l4[6] = {-INFINITY, NAN, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    assert_int_equal(tsr_sampler_sample(s, l4, NULL, 0, 0, 0, NULL), -1);
    float l5[6] = {0.0f, -3.0f, 7.0f, 6.9f, 7.0f, 1.0f};
    float probs[6];
    tsr_sampler_dist(s, l5, NULL, 0, 0, probs);
    for (int i = 0; i < 6; i++) assert_true(probs[i] == (i == 2 ? 1.0f : 0.0f));
    tsr_sampler_free(s);

    /* top_k == 1 at temperature 1 is greedy too, and uses no random numbers. */
    tsr_sampling p = params_t1(7);
    p.top_k = 1;
    tsr_sampler *a = tsr_sampler_new(&p, 6);
    tsr_sampling p2 = params_t1(7);
    tsr_sampler *b = tsr_sampler_new(&p2, 6);
    float l6[6] = {0.1f, 0.2f, 0.9f, 0.3f, 0.9f, NAN};
    assert_int_equal(tsr_sampler_sample(a, l6, NULL, 0, 0, 0, NULL), 2);
    assert_true(tsr_sampler_uniform(a) == tsr_sampler_uniform(b));
    tsr_sampler_free(a);
    tsr_sampler_free(b);
    tsr_sampler_free(NULL);
}

static void test_nan_never_sampled(void **state) {
    (void)state;
    printf("seed 11\n");
    tsr_sampling p = params_t1(11);
    tsr_sampler *s = tsr_sampler_new(&p, 5);
    float probs[5];
    for (int it = 0; it < 2000; it++) {
        float l[5] = {NAN, 0.0f, NAN, 0.5f, -INFINITY};
        int32_t id = tsr_sampler_sample(s, l, NULL, 0, 0, 0, NULL);
        assert_true(id == 1 || id == 3);
    }
    float l[5] = {NAN, 0.0f, NAN, 0.5f, -INFINITY};
    tsr_sampler_dist(s, l, NULL, 0, 0, probs);
    assert_true(probs[0] == 0.0f && probs[2] == 0.0f && probs[4] == 0.0f);
    double want = 1.0 / (1.0 + exp(0.5));
    assert_true(fabs(probs[1] - want) < 1e-7);
    /* +inf logits: uniform over them. */
    float li[5] = {1.0f, INFINITY, NAN, INFINITY, 100.0f};
    tsr_sampler_dist(s, li, NULL, 0, 0, probs);
    double wi[5] = {0, 0.5, 0, 0.5, 0};
    assert_probs_near(probs, wi, 5, 0);
    /* nothing allowed: all zeros and -1 */
    float ln[5] = {NAN, -INFINITY, NAN, -INFINITY, NAN};
    tsr_sampler_dist(s, ln, NULL, 0, 0, probs);
    for (int i = 0; i < 5; i++) assert_true(probs[i] == 0.0f);
    assert_int_equal(tsr_sampler_draw(s, probs), -1);
    float ln2[5] = {NAN, -INFINITY, NAN, -INFINITY, NAN};
    assert_int_equal(tsr_sampler_sample(s, ln2, NULL, 0, 0, 0, NULL), -1);
    tsr_sampler_free(s);
}

/* --- each rule on hand-made logits ----------------------------------------- */

static void test_temperature(void **state) {
    (void)state;
    const float raw[5] = {1.0f, 2.0f, 3.0f, 0.0f, -1.5f};
    const float temps[3] = {0.5f, 1.0f, 2.5f};
    for (int t = 0; t < 3; t++) {
        tsr_sampling p = params_t1(1);
        p.temperature = temps[t];
        tsr_sampler *s = tsr_sampler_new(&p, 5);
        float l[5], probs[5];
        double ld[5], want[5];
        memcpy(l, raw, sizeof l);
        for (int i = 0; i < 5; i++) ld[i] = (double)raw[i] / temps[t];
        ref_softmax(ld, NULL, 5, want);
        tsr_sampler_dist(s, l, NULL, 0, 0, probs);
        assert_probs_near(probs, want, 5, 1e-7);
        for (int i = 0; i < 5; i++) assert_true(fabs(l[i] - ld[i]) < 1e-6); /* in place */
        tsr_sampler_free(s);
    }
    /* Known numbers: logits {0, ln 2} at T = 0.5 -> weights 1 : 4. */
    tsr_sampling p = params_t1(1);
    p.temperature = 0.5f;
    tsr_sampler *s = tsr_sampler_new(&p, 2);
    float l[2] = {0.0f, (float)log(2.0)}, probs[2];
    tsr_sampler_dist(s, l, NULL, 0, 0, probs);
    assert_true(fabs(probs[0] - 0.2) < 1e-7 && fabs(probs[1] - 0.8) < 1e-7);
    tsr_sampler_free(s);
    /* A temperature so small that dividing overflows the largest logits to
     * +inf: uniform over those (rule: +inf logits), as over a row that
     * holds +inf; rows long enough for the vector passes. */
    p.temperature = 1e-40f;
    s = tsr_sampler_new(&p, 40);
    float big[40], pb[40];
    for (int i = 0; i < 40; i++) big[i] = i == 7 || i == 33 ? 3.0f : i % 5 == 0 ? -2.0f : 1e-3f; /* 1e-3 / t finite */
    tsr_sampler_dist(s, big, NULL, 0, 0, pb);
    for (int i = 0; i < 40; i++) {
        const double want = i == 7 || i == 33 ? 0.5 : 0.0;
        if (pb[i] != want) fail_msg("tiny temperature: token %d has %g, want %g", i, (double)pb[i], want);
    }
    tsr_sampler_free(s);
}

static void check_kept(const float *logits, int n, const tsr_sampling *p, const int *keep) {
    tsr_sampler *s = tsr_sampler_new(p, n);
    assert_non_null(s);
    float *l = malloc((size_t)n * sizeof *l), *probs = malloc((size_t)n * sizeof *probs);
    double *ld = calloc((size_t)n, sizeof *ld), *want = calloc((size_t)n, sizeof *want);
    assert_true(l && probs && ld && want);
    memcpy(l, logits, (size_t)n * sizeof *l);
    for (int i = 0; i < n; i++) ld[i] = (double)logits[i] / p->temperature;
    ref_softmax(ld, keep, n, want);
    tsr_sampler_dist(s, l, NULL, 0, 0, probs);
    for (int i = 0; i < n; i++) {
        if ((probs[i] > 0) != (keep[i] != 0))
            fail_msg("token %d: kept %d, expected %d (p %.9g)", i, probs[i] > 0, keep[i],
                     (double)probs[i]);
    }
    assert_probs_near(probs, want, n, 1e-6);
    free(l);
    free(probs);
    free(ld);
    free(want);
    tsr_sampler_free(s);
}

static void test_top_k(void **state) {
    (void)state;
    const float l[6] = {1.0f, 5.0f, 3.0f, 5.0f, 2.0f, 4.0f};
    tsr_sampling p = params_t1(3);
    p.top_k = 3;
    check_kept(l, 6, &p, (int[]){0, 1, 0, 1, 0, 1});
    p.top_k = 2;
    check_kept(l, 6, &p, (int[]){0, 1, 0, 1, 0, 0});
    p.top_k = 6;
    check_kept(l, 6, &p, (int[]){1, 1, 1, 1, 1, 1});
    p.top_k = 100; /* more than the vocabulary: off */
    check_kept(l, 6, &p, (int[]){1, 1, 1, 1, 1, 1});
    /* ties at the boundary go to the lowest ids */
    const float t[5] = {3.0f, 1.0f, 3.0f, 3.0f, 0.0f};
    p.top_k = 2;
    check_kept(t, 5, &p, (int[]){1, 0, 1, 0, 0});
    /* NaN and -inf are not candidates, even when k is larger than the rest */
    const float nn[5] = {NAN, 1.0f, -INFINITY, 2.0f, NAN};
    p.top_k = 4;
    check_kept(nn, 5, &p, (int[]){0, 1, 0, 1, 0});
    /* with temperature */
    p.top_k = 3;
    p.temperature = 0.7f;
    check_kept(l, 6, &p, (int[]){0, 1, 0, 1, 0, 1});
}

static void test_top_p(void **state) {
    (void)state;
    /* probabilities 0.5, 0.3, 0.2 (shuffled) */
    const float l[3] = {(float)log(0.3), (float)log(0.5), (float)log(0.2)};
    tsr_sampling p = params_t1(5);
    p.top_p = 0.8f; /* 0.5 + 0.3 reaches 0.8: the token reaching p is kept, nothing more */
    check_kept(l, 3, &p, (int[]){1, 1, 0});
    p.top_p = 0.79f;
    check_kept(l, 3, &p, (int[]){1, 1, 0});
    p.top_p = 0.81f;
    check_kept(l, 3, &p, (int[]){1, 1, 1});
    p.top_p = 0.5f;
    check_kept(l, 3, &p, (int[]){0, 1, 0});
    p.top_p = 0.49f;
    check_kept(l, 3, &p, (int[]){0, 1, 0});
    p.top_p = 0.0f; /* keeps the best one */
    check_kept(l, 3, &p, (int[]){0, 1, 0});
    p.top_p = 1.0f;
    check_kept(l, 3, &p, (int[]){1, 1, 1});
    /* exact renormalised numbers: {0.5, 0.3} -> {0.625, 0.375} */
    tsr_sampling q = params_t1(5);
    q.top_p = 0.8f;
    tsr_sampler *s = tsr_sampler_new(&q, 3);
    float x[3], probs[3];
    memcpy(x, l, sizeof x);
    tsr_sampler_dist(s, x, NULL, 0, 0, probs);
    assert_true(fabs(probs[1] - 0.625) < 1e-6 && fabs(probs[0] - 0.375) < 1e-6 && probs[2] == 0);
    tsr_sampler_free(s);
    /* top-k first, then top-p over the renormalised top-k: {0.5, 0.3} of
     * {0.5, 0.3, 0.2} become {0.625, 0.375}; p = 0.6 keeps only the first. */
    p.top_k = 2;
    p.top_p = 0.6f;
    check_kept(l, 3, &p, (int[]){0, 1, 0});
    p.top_p = 0.63f;
    check_kept(l, 3, &p, (int[]){1, 1, 0});
    /* ties: three tokens at 2 with p = 0.2854 each; 0.5 needs two of them,
     * the lowest ids */
    const float t[5] = {1.0f, 2.0f, 2.0f, 2.0f, 0.0f};
    tsr_sampling r = params_t1(5);
    r.top_p = 0.5f;
    check_kept(t, 5, &r, (int[]){0, 1, 1, 0, 0});
    r.top_p = 0.86f; /* 3 * 0.2854 = 0.856 < 0.86: token 0 joins */
    check_kept(t, 5, &r, (int[]){1, 1, 1, 1, 0});
}

static void test_min_p(void **state) {
    (void)state;
    /* probabilities 0.4, 0.2, 0.3, 0.1 */
    const float l[4] = {(float)log(0.4), (float)log(0.2), (float)log(0.3), (float)log(0.1)};
    tsr_sampling p = params_t1(9);
    p.min_p = 0.5f; /* threshold 0.2: token 1 sits on it and is kept */
    check_kept(l, 4, &p, (int[]){1, 1, 1, 0});
    p.min_p = 0.6f; /* threshold 0.24 */
    check_kept(l, 4, &p, (int[]){1, 0, 1, 0});
    p.min_p = 1.0f;
    check_kept(l, 4, &p, (int[]){1, 0, 0, 0});
    p.min_p = 0.2f;
    check_kept(l, 4, &p, (int[]){1, 1, 1, 1});
    /* min-p after top-p: 0.4 + 0.3 + 0.2 = 0.9 < 0.95, so top-p keeps all
     * four; min-p 0.6 then keeps 0.4 and 0.3. */
    p.top_p = 0.95f;
    p.min_p = 0.6f;
    check_kept(l, 4, &p, (int[]){1, 0, 1, 0});
    p.top_p = 0.65f; /* keeps 0.4, 0.3 (0.7); min-p 0.5 would keep 0.2 but top-p dropped it */
    p.min_p = 0.5f;
    check_kept(l, 4, &p, (int[]){1, 0, 1, 0});
}

static void test_penalties(void **state) {
    (void)state;
    float probs[5];
    /* repetition (CTRL): prompt {0}, generated {1, 1, 4}; once per distinct token. */
    tsr_sampling p = params_t1(2);
    p.repetition_penalty = 2.0f;
    tsr_sampler *s = tsr_sampler_new(&p, 5);
    const int32_t hist[6] = {0, 1, 1, 4, -3, 99}; /* out-of-range ids are ignored */
    for (int round = 0; round < 2; round++) {    /* scratch state must reset */
        float l[5] = {2.0f, -2.0f, 1.0f, 0.5f, 0.0f};
        tsr_sampler_dist(s, l, hist, 6, 1, probs);
        const float want[5] = {1.0f, -4.0f, 1.0f, 0.5f, 0.0f};
        for (int i = 0; i < 5; i++) assert_true(l[i] == want[i]);
    }
    tsr_sampler_free(s);

    /* presence 0.5, frequency 0.25 over generated tokens only (OpenAI). */
    p = params_t1(2);
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    s = tsr_sampler_new(&p, 5);
    const int32_t h2[5] = {0, 3, 1, 1, 3}; /* prompt {0, 3}; generated {1, 1, 3} */
    for (int round = 0; round < 2; round++) {
        float l[5] = {2.0f, -2.0f, 1.0f, 0.5f, 0.0f};
        tsr_sampler_dist(s, l, h2, 5, 2, probs);
        const float want[5] = {2.0f, -3.0f, 1.0f, -0.25f, 0.0f};
        for (int i = 0; i < 5; i++) assert_true(fabs(l[i] - want[i]) < 1e-6);
        double ld[5], wp[5];
        for (int i = 0; i < 5; i++) ld[i] = want[i];
        ref_softmax(ld, NULL, 5, wp);
        assert_probs_near(probs, wp, 5, 1e-7);
    }
    tsr_sampler_free(s);

    /* both, then temperature: repetition first (over prompt too), then
     * presence/frequency, then / T. token 3: 0.5 / 2 - 0.75 = -0.5 -> / 0.5 = -1. */
    p = params_t1(2);
    p.repetition_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.temperature = 0.5f;
    s = tsr_sampler_new(&p, 5);
    {
        float l[5] = {2.0f, -2.0f, 1.0f, 0.5f, 0.0f};
        tsr_sampler_dist(s, l, h2, 5, 2, probs);
        const float want[5] = {2.0f, -10.0f, 2.0f, -1.0f, 0.0f};
        for (int i = 0; i < 5; i++) assert_true(fabs(l[i] - want[i]) < 1e-6);
    }
    tsr_sampler_free(s);

    /* penalties change a greedy choice */
    tsr_sampling g = tsr_sampling_greedy();
    g.frequency_penalty = 1.0f;
    s = tsr_sampler_new(&g, 3);
    float l[3] = {3.0f, 2.5f, 0.0f};
    const int32_t h3[2] = {0, 0};
    assert_int_equal(tsr_sampler_sample(s, l, h3, 2, 0, 0, NULL), 1);
    float l2[3] = {3.0f, 2.5f, 0.0f};
    assert_int_equal(tsr_sampler_sample(s, l2, h3, 2, 2, 0, NULL), 0); /* prompt: no effect */
    tsr_sampler_free(s);
}

/* Partial selection against a full sort on a larger vocabulary. */
static int ref_cmp(const void *a, const void *b) {
    const float *x = a, *y = b;
    if (x[0] != y[0]) return x[0] > y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

static void test_partial_selection_large_vocab(void **state) {
    (void)state;
    enum { V = 20000 };
    static float logits[V], sorted[V][2];
    static int keep[V];
    lcg_state = 12345;
    printf("lcg seed 12345\n");
    for (int i = 0; i < V; i++) {
        logits[i] = (float)(8.0 * lcg_uniform());
        if (i % 97 == 0) logits[i] = logits[i / 2]; /* some exact ties */
    }
    logits[77] = NAN;
    for (int i = 0; i < V; i++) {
        sorted[i][0] = isnan(logits[i]) ? -INFINITY : logits[i];
        sorted[i][1] = (float)i;
    }
    qsort(sorted, V, sizeof sorted[0], ref_cmp);
    const int ks[5] = {0, 40, 1024, 1025, 3000}; /* 0: top-k off */
    const float ps[4] = {0.3f, 0.9f, 0.999f, 1.0f};
    for (int a = 0; a < 5; a++) {
        for (int b = 0; b < 4; b++) {
            tsr_sampling p = params_t1(1);
            p.top_k = ks[a];
            p.top_p = ps[b];
            /* reference kept set: first k of the order, then the prefix reaching p */
            int n = p.top_k ? p.top_k : V - 1; /* V-1: the NaN is last */
            double mx = sorted[0][0], z = 0, cum = 0;
            for (int i = 0; i < n; i++) z += exp((double)sorted[i][0] - mx);
            int kept = n;
            if (p.top_p < 1)
                for (int i = 0; i < n; i++) {
                    cum += exp((double)sorted[i][0] - mx) / z;
                    if (cum >= p.top_p - 1e-6) {
                        kept = i + 1;
                        break;
                    }
                }
            memset(keep, 0, sizeof keep);
            for (int i = 0; i < kept; i++) keep[(int)sorted[i][1]] = 1;
            check_kept(logits, V, &p, keep);
        }
    }
}

/* --- seeds and the random stream ----------------------------------------- */

static void run_seq(uint64_t seed, int has_seed, int32_t *out, int n) {
    tsr_sampling p = params_t1(seed);
    p.has_seed = has_seed;
    p.top_k = 50;
    tsr_sampler *s = tsr_sampler_new(&p, 100);
    if (has_seed) assert_true(tsr_sampler_seed(s) == seed);
    for (int i = 0; i < n; i++) {
        float l[100];
        for (int j = 0; j < 100; j++) l[j] = (float)((j * 37) % 11) * 0.3f;
        out[i] = tsr_sampler_sample(s, l, out, i, 0, 0, NULL);
    }
    tsr_sampler_free(s);
}

static void test_seed_reproducible(void **state) {
    (void)state;
    int32_t a[200], b[200], c[200], d[200], e[200];
    printf("seeds 42, 42, 43\n");
    run_seq(42, 1, a, 200);
    run_seq(42, 1, b, 200);
    run_seq(43, 1, c, 200);
    assert_memory_equal(a, b, sizeof a);
    assert_true(memcmp(a, c, sizeof a) != 0);
    run_seq(0, 0, d, 200); /* clock-seeded: differ from each other */
    run_seq(0, 0, e, 200);
    assert_true(memcmp(d, e, sizeof d) != 0);

    tsr_sampling p = params_t1(99);
    tsr_sampler *s = tsr_sampler_new(&p, 4);
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        double u = tsr_sampler_uniform(s);
        assert_true(u >= 0.0 && u < 1.0);
        sum += u;
    }
    /* mean of 1e5 uniforms: sd 0.00091; 5 sd */
    assert_true(fabs(sum / 100000 - 0.5) < 0.0046);
    tsr_sampler_free(s);
}

/* sample == dist + draw, token for token, from the same seed. */
static void test_sample_equals_dist_draw(void **state) {
    (void)state;
    tsr_sampling p = params_t1(2024);
    p.top_k = 20;
    p.top_p = 0.9f;
    p.min_p = 0.05f;
    p.temperature = 0.8f;
    p.repetition_penalty = 1.3f;
    tsr_sampler *a = tsr_sampler_new(&p, 64), *b = tsr_sampler_new(&p, 64);
    int32_t hist[300];
    lcg_state = 7;
    for (int i = 0; i < 300; i++) {
        float la[64], lb[64], probs[64];
        for (int j = 0; j < 64; j++) la[j] = lb[j] = (float)(4.0 * lcg_uniform());
        int32_t x = tsr_sampler_sample(a, la, hist, i, 0, 0, NULL);
        tsr_sampler_dist(b, lb, hist, i, 0, probs);
        int32_t y = tsr_sampler_draw(b, probs);
        assert_int_equal(x, y);
        assert_true(probs[x] > 0);
        hist[i] = x;
    }
    tsr_sampler_free(a);
    tsr_sampler_free(b);
}

/* --- statistics ----------------------------------------------------------- */

static const double six[6] = {0.30, 0.25, 0.20, 0.12, 0.08, 0.05};

static void draw_and_test(const tsr_sampling *p, const double *expect, int draws) {
    tsr_sampler *s = tsr_sampler_new(p, 6);
    long obs[6] = {0};
    for (int i = 0; i < draws; i++) {
        float l[6];
        for (int j = 0; j < 6; j++) l[j] = (float)(log(six[j]) + 3.0); /* shift: no effect */
        int32_t id = tsr_sampler_sample(s, l, NULL, 0, 0, 0, NULL);
        assert_true(id >= 0 && id < 6);
        obs[id]++;
    }
    int df;
    double x = chi_square(obs, expect, 6, draws, &df);
    printf("seed %llu: chi2 %.3f, df %d, limit %.3f\n", (unsigned long long)p->seed, x, df,
           chi2_999[df]);
    assert_true(x < chi2_999[df]);
    tsr_sampler_free(s);
}

static void test_chi_square_draws(void **state) {
    (void)state;
    tsr_sampling p = params_t1(314159);
    draw_and_test(&p, six, 60000);

    /* top-p 0.7: 0.30 + 0.25 + 0.20 = 0.75 reaches it; renormalised. */
    p.top_p = 0.7f;
    p.seed = 271828;
    double tp[6] = {0.30 / 0.75, 0.25 / 0.75, 0.20 / 0.75, 0, 0, 0};
    draw_and_test(&p, tp, 60000);

    /* temperature 0.6: p^(1/0.6), renormalised */
    p = params_t1(161803);
    p.temperature = 0.6f;
    double tt[6], z = 0;
    for (int i = 0; i < 6; i++) z += tt[i] = pow(six[i], 1.0 / 0.6);
    for (int i = 0; i < 6; i++) tt[i] /= z;
    draw_and_test(&p, tt, 60000);

    /* top-k 3 and min-p 0.5 (threshold 0.15: keeps 0.30, 0.25, 0.20) */
    p = params_t1(141421);
    p.top_k = 3;
    draw_and_test(&p, tp, 60000);
    p = params_t1(173205);
    p.min_p = 0.5f;
    draw_and_test(&p, tp, 60000);
    p.min_p = 0.35f; /* threshold 0.105: keeps 0.12 too */
    double mp[6] = {0.30 / 0.87, 0.25 / 0.87, 0.20 / 0.87, 0.12 / 0.87, 0, 0};
    draw_and_test(&p, mp, 60000);

    /* the draw really discriminates: the top-p distribution is not the full one */
    tsr_sampling q = params_t1(314159);
    tsr_sampler *s = tsr_sampler_new(&q, 6);
    long obs[6] = {0};
    for (int i = 0; i < 60000; i++) {
        float l[6];
        for (int j = 0; j < 6; j++) l[j] = (float)log(six[j]);
        obs[tsr_sampler_sample(s, l, NULL, 0, 0, 0, NULL)]++;
    }
    const double skew[6] = {0.32, 0.25, 0.20, 0.11, 0.07, 0.05};
    int df;
    assert_true(chi_square(obs, skew, 6, 60000, &df) > chi2_999[5]);
    tsr_sampler_free(s);
}

static void test_draw_weights(void **state) {
    (void)state;
    tsr_sampling p = params_t1(8);
    tsr_sampler *s = tsr_sampler_new(&p, 6);
    const float w[6] = {0.0f, 2.0f, NAN, -1.0f, 6.0f, INFINITY};
    long obs[6] = {0};
    for (int i = 0; i < 40000; i++) obs[tsr_sampler_draw(s, w)]++;
    const double want[6] = {0, 0.25, 0, 0, 0.75, 0};
    int df;
    double x = chi_square(obs, want, 6, 40000, &df);
    printf("seed 8: weights chi2 %.3f df %d\n", x, df);
    assert_true(x < chi2_999[df]);
    const float zero[6] = {0};
    assert_int_equal(tsr_sampler_draw(s, zero), -1);
    tsr_sampler_free(s);
}

/* Speculative verification preserves the target distribution exactly. */
static void test_verify_preserves_target(void **state) {
    (void)state;
    const float target[6] = {0.30f, 0.25f, 0.20f, 0.12f, 0.08f, 0.05f};
    const float draft[6] = {0.10f, 0.40f, 0.05f, 0.30f, 0.15f, 0.0f};
    tsr_sampling p = params_t1(555);
    tsr_sampler *s = tsr_sampler_new(&p, 6);
    printf("seed 555\n");
    long obs[6] = {0}, accepted = 0;
    const int N = 60000;
    for (int i = 0; i < N; i++) {
        int32_t x = tsr_sampler_draw(s, draft), out = -1;
        int r = tsr_sampler_verify(s, target, draft, x, &out);
        assert_true(r == 0 || r == 1);
        if (r == 1) {
            assert_int_equal(out, x);
            accepted++;
        }
        obs[out]++;
    }
    double expect[6];
    for (int i = 0; i < 6; i++) expect[i] = target[i];
    int df;
    double x = chi_square(obs, expect, 6, N, &df);
    /* acceptance rate = sum min(p, q) = 0.1+0.25+0.05+0.12+0.08+0 = 0.60 */
    printf("verify: chi2 %.3f df %d, accepted %.4f\n", x, df, (double)accepted / N);
    assert_true(x < chi2_999[df]);
    assert_true(fabs((double)accepted / N - 0.60) < 0.01);

    /* deterministic drafter (q NULL): always proposes token 3 */
    long obs2[6] = {0}, acc2 = 0;
    for (int i = 0; i < N; i++) {
        int32_t out = -1;
        acc2 += tsr_sampler_verify(s, target, NULL, 3, &out) == 1;
        obs2[out]++;
    }
    x = chi_square(obs2, expect, 6, N, &df);
    printf("verify (deterministic): chi2 %.3f df %d, accepted %.4f\n", x, df,
           (double)acc2 / N);
    assert_true(x < chi2_999[df]);
    assert_true(fabs((double)acc2 / N - 0.12) < 0.01);

    /* greedy target (one-hot) accepts iff the draft is the argmax */
    const float onehot[6] = {0, 0, 1, 0, 0, 0};
    int32_t out;
    assert_int_equal(tsr_sampler_verify(s, onehot, draft, 2, &out), 1);
    assert_int_equal(out, 2);
    assert_int_equal(tsr_sampler_verify(s, onehot, draft, 1, &out), 0);
    assert_int_equal(out, 2);
    const float none[6] = {0};
    assert_int_equal(tsr_sampler_verify(s, none, draft, 1, &out), -1);
    assert_int_equal(out, -1);
    tsr_sampler_free(s);
}

/* One verified token per seed, over many consecutive seeds: the output is
 * distributed as the target (and consecutive seeds are not correlated). */
static void test_verify_over_seeds(void **state) {
    (void)state;
    const float target[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    const float draft[4] = {0.4f, 0.3f, 0.2f, 0.1f};
    long obs[4] = {0};
    const int N = 40000;
    printf("seeds 1..%d\n", N);
    for (int seed = 1; seed <= N; seed++) {
        tsr_sampling p = params_t1((uint64_t)seed);
        tsr_sampler *s = tsr_sampler_new(&p, 4);
        int32_t x = tsr_sampler_draw(s, draft), out = -1;
        assert_true(tsr_sampler_verify(s, target, draft, x, &out) >= 0);
        obs[out]++;
        tsr_sampler_free(s);
    }
    const double expect[4] = {0.1, 0.2, 0.3, 0.4};
    int df;
    double x = chi_square(obs, expect, 4, N, &df);
    printf("verify over seeds: chi2 %.3f df %d\n", x, df);
    assert_true(x < chi2_999[df]);
}

/* Invariants on random logits (NaN, infinities), random parameters (in and
 * out of range) and random histories with bad ids. */
static void test_random_invariants(void **state) {
    (void)state;
    enum { V = 97 };
    lcg_state = 4242;
    printf("lcg seed 4242\n");
    for (int it = 0; it < 3000; it++) {
        tsr_sampling p = params_t1((uint64_t)it);
        p.temperature = (float)(lcg_uniform() * 3.0 - 0.5);
        p.top_k = (int)(lcg_uniform() * 120) - 10;
        p.top_p = (float)(lcg_uniform() * 1.4 - 0.2);
        p.min_p = (float)(lcg_uniform() * 1.4 - 0.2);
        p.repetition_penalty = (float)(lcg_uniform() * 3.0 - 0.5);
        p.presence_penalty = (float)(lcg_uniform() * 4.0 - 2.0);
        p.frequency_penalty = (float)(lcg_uniform() * 4.0 - 2.0);
        if (it % 50 == 0) p.temperature = NAN;
        tsr_sampler *s = tsr_sampler_new(&p, V);
        tsr_sampler *t = tsr_sampler_new(&p, V);
        assert_non_null(s);
        float l[V], l2[V], probs[V];
        int bad[V];
        int n_ok = 0;
        for (int i = 0; i < V; i++) {
            double r = lcg_uniform();
            l[i] = r < 0.05 ? NAN : r < 0.1 ? -INFINITY : r < 0.101 ? INFINITY
                                            : (float)(lcg_uniform() * 40.0 - 20.0);
            if (it % 7 == 0) l[i] = NAN; /* sometimes nothing is allowed */
            bad[i] = isnan(l[i]) || l[i] == -INFINITY;
            n_ok += !bad[i];
        }
        memcpy(l2, l, sizeof l);
        int32_t hist[30];
        int nh = (int)(lcg_uniform() * 30);
        for (int i = 0; i < nh; i++) hist[i] = (int32_t)(lcg_uniform() * (V + 20)) - 10;
        int np = (int)(lcg_uniform() * 40) - 5;
        tsr_sampler_dist(s, l, hist, nh, np, probs);
        double sum = 0;
        for (int i = 0; i < V; i++) {
            assert_true(probs[i] >= 0.0f && probs[i] <= 1.0f);
            if (bad[i]) assert_true(probs[i] == 0.0f);
            sum += probs[i];
        }
        if (n_ok > 0) assert_true(fabs(sum - 1.0) < 1e-5);
        else assert_true(sum == 0.0);
        tsr_token_info info;
        int32_t id = tsr_sampler_sample(t, l2, hist, nh, np, it % 25, &info);
        if (n_ok == 0) {
            assert_int_equal(id, -1);
        } else {
            assert_true(id >= 0 && id < V && !bad[id] && probs[id] > 0);
            assert_true(info.logprob <= 0.0f);
        }
        tsr_sampler_free(s);
        tsr_sampler_free(t);
    }
}

/* --- log-probabilities ---------------------------------------------------- */

static void test_logprobs(void **state) {
    (void)state;
    enum { V = 50 };
    float l[V];
    double ld[V], ref[V];
    lcg_state = 99;
    for (int i = 0; i < V; i++) ld[i] = l[i] = (float)(10.0 * lcg_uniform() - 5.0);
    l[7] = l[3]; /* a tie */
    ld[7] = ld[3];
    l[11] = NAN;
    l[12] = -INFINITY;
    int keep[V];
    for (int i = 0; i < V; i++) keep[i] = i != 11 && i != 12;
    ref_softmax(ld, keep, V, ref);
    tsr_token_info info;
    tsr_logprobs(l, V, 5, 8, &info);
    assert_int_equal(info.id, 5);
    assert_true(fabs(info.logprob - log(ref[5])) < 1e-5);
    assert_int_equal(info.n_top, 8);
    /* reference order: by logit, ties to the lowest id */
    float sorted[V][2];
    int n = 0;
    for (int i = 0; i < V; i++)
        if (keep[i]) {
            sorted[n][0] = l[i];
            sorted[n++][1] = (float)i;
        }
    qsort(sorted, (size_t)n, sizeof sorted[0], ref_cmp);
    for (int j = 0; j < 8; j++) {
        int id = (int)sorted[j][1];
        assert_int_equal(info.top_ids[j], id);
        assert_true(fabs(info.top_logprobs[j] - log(ref[id])) < 1e-5);
        if (j) assert_true(info.top_logprobs[j] <= info.top_logprobs[j - 1]);
    }
    tsr_logprobs(l, V, 11, 0, &info); /* NaN */
    assert_true(isinf(info.logprob) && info.logprob < 0);
    assert_int_equal(info.n_top, 0);
    tsr_logprobs(l, V, 12, 100, &info); /* -inf, n_top clamped */
    assert_true(isinf(info.logprob) && info.logprob < 0);
    assert_int_equal(info.n_top, TSR_MAX_TOP_LOGPROBS);
    tsr_logprobs(l, V, V, 3, &info); /* out of range */
    assert_true(isinf(info.logprob) && info.logprob < 0);
    const float few[4] = {NAN, 0.0f, -INFINITY, 0.0f};
    tsr_logprobs(few, 4, 3, 5, &info);
    assert_int_equal(info.n_top, 2);
    assert_int_equal(info.top_ids[0], 1);
    assert_int_equal(info.top_ids[1], 3);
    assert_true(fabs(info.logprob - log(0.5)) < 1e-7);

    const float pinf[3] = {INFINITY, 0.0f, INFINITY};
    tsr_logprobs(pinf, 3, 1, 3, &info);
    assert_true(isinf(info.logprob) && info.logprob < 0);
    assert_int_equal(info.n_top, 2);
    assert_int_equal(info.top_ids[0], 0);
    assert_int_equal(info.top_ids[1], 2);
    assert_true(fabs(info.top_logprobs[1] - log(0.5)) < 1e-7);
    {
        tsr_sampling g = tsr_sampling_greedy();
        tsr_sampler *s = tsr_sampler_new(&g, 3);
        float nan3[3] = {NAN, NAN, -INFINITY};
        assert_int_equal(tsr_sampler_sample(s, nan3, NULL, 0, 0, 2, &info), -1);
        assert_int_equal(info.id, -1);
        assert_true(isinf(info.logprob) && info.logprob < 0);
        assert_int_equal(info.n_top, 0);
        tsr_sampler_free(s);
    }

    /* sample reports the raw distribution, not the penalised/tempered one */
    tsr_sampling p = params_t1(17);
    p.temperature = 0.5f;
    p.repetition_penalty = 1.5f;
    p.top_k = 5;
    tsr_sampler *s = tsr_sampler_new(&p, V);
    float x[V];
    memcpy(x, l, sizeof x);
    const int32_t hist[3] = {(int32_t)sorted[0][1], (int32_t)sorted[1][1], 4};
    int32_t id = tsr_sampler_sample(s, x, hist, 3, 1, 3, &info);
    assert_true(id >= 0 && id < V && keep[id]);
    assert_int_equal(info.id, id);
    assert_true(fabs(info.logprob - log(ref[id])) < 1e-5);
    assert_int_equal(info.n_top, 3);
    for (int j = 0; j < 3; j++) assert_int_equal(info.top_ids[j], (int)sorted[j][1]);
    tsr_sampler_free(s);
}

/* A vocabulary's worth of logits on a coarse lattice (ties everywhere, the
 * best ones late as well as early), NaN and -inf among them: the chosen
 * token's log-probability against double precision and the top 1, 7 and 20
 * against a full sort (by logit, ties to the lowest id); the scan skips
 * ahead by vectors once its list is full (tsr_first_above). */
static void test_logprobs_vocab(void **state) {
    (void)state;
    enum { V = 20011 }; /* 8-wide body and a tail of 3 */
    static float l[V], sorted[V][2];
    static double ld[V], ref[V];
    static int keep[V];
    lcg_state = 7;
    for (int i = 0; i < V; i++) {
        l[i] = (float)(0.25 * (int)(80.0 * lcg_uniform()) - 10.0); /* 80 values, from -10 to 9.75 */
        keep[i] = 1;
        if (i % 101 == 17) l[i] = NAN, keep[i] = 0;
        if (i % 97 == 5 || i == V - 1) l[i] = -INFINITY, keep[i] = 0;
        ld[i] = l[i];
    }
    ref_softmax(ld, keep, V, ref);
    int n = 0;
    for (int i = 0; i < V; i++)
        if (keep[i]) sorted[n][0] = l[i], sorted[n++][1] = (float)i;
    qsort(sorted, (size_t)n, sizeof sorted[0], ref_cmp);
    const int tops[3] = {1, 7, TSR_MAX_TOP_LOGPROBS};
    for (int t = 0; t < 3; t++) {
        tsr_token_info info;
        tsr_logprobs(l, V, V - 2, tops[t], &info);
        assert_true(fabs(info.logprob - log(ref[V - 2])) < 1e-5);
        assert_int_equal(info.n_top, tops[t]);
        for (int j = 0; j < tops[t]; j++) {
            assert_int_equal(info.top_ids[j], (int)sorted[j][1]);
            assert_true(fabs(info.top_logprobs[j] - log(ref[info.top_ids[j]])) < 1e-5);
        }
    }
}

/* --- parameters ----------------------------------------------------------- */

static void test_validate(void **state) {
    (void)state;
    tsr_error e;
    tsr_sampling ok = params_t1(1);
    tsr_error_clear(&e);
    assert_int_equal(tsr_sampling_validate(&ok, &e), TSR_OK);
    struct {
        const char *field;
        tsr_sampling p;
    } bad[12];
    int n = 0;
#define BAD(f, member, value)                                                             \
    do {                                                                                  \
        bad[n].field = f;                                                                 \
        bad[n].p = ok;                                                                    \
        bad[n].p.member = value;                                                          \
        n++;                                                                              \
    } while (0)
    BAD("temperature", temperature, -0.1f);
    BAD("temperature", temperature, NAN);
    BAD("temperature", temperature, INFINITY);
    BAD("top_k", top_k, -1);
    BAD("top_p", top_p, 1.5f);
    BAD("top_p", top_p, NAN);
    BAD("min_p", min_p, -0.5f);
    BAD("repetition_penalty", repetition_penalty, 0.0f);
    BAD("repetition_penalty", repetition_penalty, INFINITY);
    BAD("presence_penalty", presence_penalty, NAN);
    BAD("frequency_penalty", frequency_penalty, -INFINITY);
#undef BAD
    for (int i = 0; i < n; i++) {
        tsr_error_clear(&e);
        assert_int_equal(tsr_sampling_validate(&bad[i].p, &e), TSR_ERR_INVALID);
        if (!strstr(e.msg, bad[i].field)) fail_msg("case %d: '%s' lacks '%s'", i, e.msg, bad[i].field);
        /* the sampler still works on them, read as documented */
        tsr_sampler *s = tsr_sampler_new(&bad[i].p, 4);
        assert_non_null(s);
        float l[4] = {0.0f, 1.0f, 2.0f, 0.5f};
        int32_t id = tsr_sampler_sample(s, l, NULL, 0, 0, 0, NULL);
        assert_true(id >= 0 && id < 4);
        tsr_sampler_free(s);
    }
    assert_null(tsr_sampler_new(&ok, 0));
    assert_null(tsr_sampler_new(&ok, -5));
    /* NaN temperature reads as greedy */
    tsr_sampling nt = params_t1(1);
    nt.temperature = NAN;
    tsr_sampler *s = tsr_sampler_new(&nt, 4);
    for (int i = 0; i < 50; i++) {
        float l[4] = {0.0f, 1.0f, 2.0f, 1.9f};
        assert_int_equal(tsr_sampler_sample(s, l, NULL, 0, 0, 0, NULL), 2);
    }
    tsr_sampler_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_argmax_ties_nan),
        cmocka_unit_test(test_nan_never_sampled),
        cmocka_unit_test(test_temperature),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_partial_selection_large_vocab),
        cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_sample_equals_dist_draw),
        cmocka_unit_test(test_chi_square_draws),
        cmocka_unit_test(test_draw_weights),
        cmocka_unit_test(test_verify_preserves_target),
        cmocka_unit_test(test_verify_over_seeds),
        cmocka_unit_test(test_random_invariants),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_logprobs_vocab),
        cmocka_unit_test(test_validate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
