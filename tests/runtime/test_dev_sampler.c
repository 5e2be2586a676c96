/*
 * The host side of sampling on the device (core/runtime/dev_sampler.c) on
 * the CPU, through a mock backend in host memory whose sample() is a
 * sequential model of kernels/cuda/sample.cu's algorithm (the same steps:
 * penalties from the per-token state, radix selection of the top-k and
 * top-p boundaries with top-p's mass in 2^-40 fixed point, min-p, the draw
 * in id order). Checked: the history state the device would hold (seen
 * bits, generated counts) against counts made here from the history, sent
 * incrementally and in batches; the uniform numbers against the sampler's
 * own stream; nothing sent when no penalty is in effect; refusals; and the
 * algorithm's draws against tsr_sampler_sample on random rows (allowed to
 * differ only within rounding of a boundary: at most 1 draw in 1000).
 * The CUDA kernel itself is checked against the CPU sampler by
 * tests/gpu/test_cuda_sample.c.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/runtime/dev_sampler.h"
#include "core/runtime/model_internal.h"

/* --- a sequential model of sample.cu --------------------------------------- */

static uint32_t ordered(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

static uint64_t fixed_w(float w) { return (uint64_t)llrint((double)w * 1099511627776.0); }

static int emu_select_first(const float *key, const float *wt, int V, int mass, uint64_t target, uint32_t *tu,
                            int *tid) {
    uint32_t prefix = 0, mask = 0;
    uint64_t above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        uint64_t hm[256] = {0};
        unsigned hc[256] = {0};
        for (int i = 0; i < V; i++) {
            if (isnan(key[i])) continue;
            uint32_t u = ordered(key[i]);
            if ((u & mask) != prefix) continue;
            int d = (int)((u >> shift) & 255u);
            hc[d]++;
            if (mass) hm[d] += fixed_w(wt[i]);
        }
        int chosen = -1;
        for (int d = 255; d >= 0; d--) {
            if (!hc[d]) continue;
            uint64_t v = mass ? hm[d] : hc[d];
            if (above + v >= target) {
                chosen = d;
                break;
            }
            above += v;
        }
        if (chosen < 0) return 0;
        prefix |= (uint32_t)chosen << shift;
        mask |= 0xffu << shift;
    }
    uint64_t cum = above;
    for (int i = 0; i < V; i++) {
        if (isnan(key[i]) || ordered(key[i]) != prefix) continue;
        cum += mass ? fixed_w(wt[i]) : 1;
        if (cum >= target) {
            *tu = prefix;
            *tid = i;
            return 1;
        }
    }
    return 0;
}

static void emu_keep_first(float *key, float *wt, int V, uint32_t tu, int tid) {
    for (int i = 0; i < V; i++) {
        if (isnan(key[i])) continue;
        uint32_t u = ordered(key[i]);
        if (!(u > tu || (u == tu && i <= tid))) key[i] = NAN, wt[i] = 0.0f;
    }
}

static long emu_compactions; /* draws that went through the compacted list */

static uint64_t emu_target(float p, double z) {
    double need = ((double)p - 1e-6) * z;
    return need <= 0 ? 0 : (uint64_t)ceil(need * 1099511627776.0);
}

static int emu_coarse(float k, double mx) {
    double d = (mx - (double)k) * 16.0;
    return d < 255.0 ? (int)d : 255;
}

/* scratch: key, wt, then the list's keys, weights and ids [V] each (as
 * sample.cu). */
static int32_t emu_sample(const float *logits, const int32_t *state, const tsr_cu_sample_args *a, float *scratch) {
    const int V = a->vocab;
    float *key = scratch, *wt = scratch + V;
    const float rep = a->repetition_penalty;
    const double pres = a->presence_penalty, freq = a->frequency_penalty;
    const int pf = pres != 0 || freq != 0;
    float best = -INFINITY;
    int bi = -1;
    for (int i = 0; i < V; i++) {
        float l = logits[i];
        int32_t s = state ? state[i] : 0;
        if ((s & 1) && rep != 1.0f) l = l > 0 ? l / rep : l * rep;
        int c = s >> 1;
        if (c && pf) l = (float)((double)l - (pres + freq * (double)c));
        if (!a->greedy && a->temperature != 1.0f && isfinite(l)) l = l / a->temperature;
        key[i] = l;
        if (l > best) best = l, bi = i;
    }
    if (a->greedy || best == -INFINITY) return a->greedy ? bi : -1;
    const int inf_mode = best == INFINITY;
    const double mx = inf_mode ? 0.0 : (double)best;
    int nc = 0;
    unsigned hc[256] = {0};
    double hm[256] = {0};
    const int hist_p = !(a->top_k > 0) && a->top_p < 1.0f;
    for (int i = 0; i < V; i++) {
        float l = key[i];
        int c = inf_mode ? l == INFINITY : isfinite(l);
        float k = (inf_mode ? 0.0f : l) + 0.0f;
        key[i] = c ? k : NAN;
        wt[i] = c ? (float)exp((double)k - mx) : 0.0f;
        nc += c;
        if ((a->top_k > 0 || hist_p) && c && emu_coarse(k, mx) < 255) {
            hc[emu_coarse(k, mx)]++;
            hm[emu_coarse(k, mx)] += (double)wt[i];
        }
    }
    float *K = key, *W = wt;
    const int32_t *ids = NULL;
    int n = V;
    const int do_top_k = a->top_k > 0 && a->top_k < nc, do_top_p = a->top_p < 1.0f;
    double z = 0;
    for (int i = 0; i < V; i++) z += (double)wt[i];
    const uint64_t target_p = do_top_k || !do_top_p ? 0 : emu_target(a->top_p, z);
    if (do_top_k || hist_p) {
        unsigned cum = 0;
        double cum_m = 0;
        int bound = -1;
        for (int b = 0; b < 255 && bound < 0; b++) {
            cum += hc[b];
            cum_m += hm[b];
            if (do_top_k ? cum >= (unsigned)a->top_k
                         : cum > 0 && cum_m * (1.0 - 1e-9) >= ((double)target_p + 0.5 * cum + 1.0) / 1099511627776.0)
                bound = b;
        }
        if (bound >= 0) {
            float *lkey = scratch + 2 * (size_t)V, *lwt = scratch + 3 * (size_t)V;
            int32_t *lid = (int32_t *)(scratch + 4 * (size_t)V);
            int m = 0;
            for (int i = 0; i < V; i++)
                if (!isnan(key[i]) && emu_coarse(key[i], mx) <= bound) lkey[m] = key[i], lwt[m] = wt[i], lid[m] = i, m++;
            K = lkey, W = lwt, ids = lid, n = m;
            emu_compactions++;
        }
    }
    uint32_t tu;
    int tid;
    if (do_top_k) {
        if (emu_select_first(K, W, n, 0, (uint64_t)a->top_k, &tu, &tid)) emu_keep_first(K, W, n, tu, tid);
        z = 0;
        for (int i = 0; i < n; i++) z += (double)W[i];
    }
    if (do_top_p) {
        uint64_t target = do_top_k ? emu_target(a->top_p, z) : target_p;
        if (emu_select_first(K, W, n, 1, target, &tu, &tid)) emu_keep_first(K, W, n, tu, tid);
    }
    if (a->min_p > 0) {
        double thr = (double)a->min_p * (1.0 - 1e-6);
        for (int i = 0; i < n; i++)
            if (!((double)W[i] >= thr)) W[i] = 0.0f;
    }
    double zk = 0, total = 0;
    for (int i = 0; i < n; i++) zk += (double)W[i];
    int last = -1;
    for (int i = 0; i < n; i++) {
        float p = W[i] > 0 ? (float)((double)W[i] / zk) : 0.0f;
        if (p > 0 && p <= FLT_MAX) total += (double)p, last = i;
    }
    if (!(total > 0)) return -1;
    double target = a->u * total, cum = 0;
    int pos = last;
    for (int i = 0; i < n; i++) {
        float p = W[i] > 0 ? (float)((double)W[i] / zk) : 0.0f;
        if (!(p > 0 && p <= FLT_MAX)) continue;
        cum += (double)p;
        if (target < cum) {
            pos = i;
            break;
        }
    }
    return pos < 0 || !ids ? pos : ids[pos];
}

/* --- the mock backend ------------------------------------------------------- */

static struct {
    int history_calls, sample_calls;
    int32_t *last_state;
    tsr_cu_sample_args last;
} mock;

static void *m_alloc(size_t bytes, tsr_error *err) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) tsr_error_set(err, TSR_ERR_NOMEM, "mock: out of memory");
    return p;
}
static int m_copy(void *dst, const void *src, size_t bytes, tsr_error *err) {
    (void)err;
    memcpy(dst, src, bytes);
    return TSR_OK;
}
static int m_sync(tsr_error *err) {
    (void)err;
    return TSR_OK;
}
static int m_history(int32_t *state, const int32_t *ids, int n, int gen_from, int vocab, tsr_error *err) {
    (void)err;
    mock.history_calls++;
    for (int j = 0; j < n; j++) {
        if (ids[j] < 0 || ids[j] >= vocab) continue;
        state[ids[j]] |= 1;
        if (j >= gen_from) state[ids[j]] += 2;
    }
    return TSR_OK;
}
static int m_sample(const float *logits, const int32_t *state, const tsr_cu_sample_args *a, void *scratch,
                    int32_t *out, tsr_error *err) {
    (void)err;
    mock.sample_calls++;
    mock.last_state = (int32_t *)state;
    mock.last = *a;
    out[0] = emu_sample(logits, state, a, scratch);
    return TSR_OK;
}
static uint64_t m_scratch(int vocab) { return 5ull * (uint64_t)vocab * sizeof(float); } /* as sample.cu */

static const tsr_backend mock_be = {
    .device = 1,
    .name = "mock",
    .alloc = m_alloc,
    .free = free,
    .upload = m_copy,
    .download = m_copy,
    .upload_async = m_copy,
    .download_async = m_copy,
    .host_alloc = m_alloc,
    .host_free = free,
    .sync = m_sync,
    .sample_history = m_history,
    .sample = m_sample,
    .sample_scratch_bytes = m_scratch,
};

/* --- tests ------------------------------------------------------------------ */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static double rnd_normal(void) {
    double u = (double)(rnd() >> 11) * 0x1.0p-53, v = (double)(rnd() >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static tsr_dev_sampler *new_dev(tsr_sampler *s, int vocab) {
    tsr_dev_sampler *d;
    tsr_error err;
    tsr_error_clear(&err);
    if (tsr_dev_sampler_new(&mock_be, s, vocab, &d, &err) != TSR_OK) fail_msg("%s", err.msg);
    return d;
}

static int32_t pick(tsr_dev_sampler *d, const float *row, const int32_t *hist, int n_hist, int n_prompt) {
    tsr_error err;
    tsr_error_clear(&err);
    int32_t id = -2;
    if (tsr_dev_sampler_pick(d, row, hist, n_hist, n_prompt, &id, &err) != TSR_OK) fail_msg("%s", err.msg);
    return id;
}

/* The state the device holds equals counts made here; sent in batches
 * (a prompt longer than one batch) and then a token at a time. */
static void test_history_state(void **state) {
    (void)state;
    enum { V = 300, NP = 9000, NG = 20 };
    tsr_sampling sp = tsr_sampling_greedy();
    sp.temperature = 0.9f;
    sp.repetition_penalty = 1.2f;
    sp.has_seed = 1;
    sp.seed = 5;
    tsr_sampler *s = tsr_sampler_new(&sp, V);
    tsr_dev_sampler *d = new_dev(s, V);
    static int32_t hist[NP + NG];
    static float row[V];
    for (int i = 0; i < V; i++) row[i] = (float)rnd_normal();
    for (int i = 0; i < NP; i++) hist[i] = (int32_t)(rnd() % (V + 10)) - 5; /* some out of range */
    int n = NP;
    mock.history_calls = 0;
    for (int g = 0; g < NG; g++) {
        int32_t id = pick(d, row, hist, n, NP);
        assert_true(id >= 0 && id < V);
        assert_int_equal(tsr_dev_sampler_sent(d), n);
        hist[n++] = g % 3 ? id : (int32_t)(rnd() % V);
        /* expected state of the history sent so far: hist[0, n - 1) */
        int seen[V] = {0}, count[V] = {0};
        for (int i = 0; i < n - 1; i++) {
            if (hist[i] < 0 || hist[i] >= V) continue;
            seen[hist[i]] = 1;
            if (i >= NP) count[hist[i]]++;
        }
        for (int t = 0; t < V; t++)
            if (mock.last_state[t] != (seen[t] | count[t] << 1))
                fail_msg("after %d picks: token %d state %d, expected seen %d count %d", g + 1, t,
                         mock.last_state[t], seen[t], count[t]);
    }
    /* the prompt in ceil(9000 / 4096) = 3 copies, then one per pick */
    assert_int_equal(mock.history_calls, 3 + NG - 1);
    /* a history that shrinks is refused */
    tsr_error err;
    tsr_error_clear(&err);
    int32_t id;
    assert_int_equal(tsr_dev_sampler_pick(d, row, hist, n - 5, NP, &id, &err), TSR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "shrank"));
    tsr_dev_sampler_free(d);
    tsr_sampler_free(s);
}

/* No penalty: no state, nothing sent. Uniform numbers: the sampler's own
 * stream, one per sampled pick, none for greedy. */
static void test_stream_and_no_history(void **state) {
    (void)state;
    enum { V = 50 };
    float row[V];
    int32_t hist[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    for (int i = 0; i < V; i++) row[i] = (float)rnd_normal();
    tsr_sampling sp = tsr_sampling_greedy();
    sp.temperature = 1.0f;
    sp.has_seed = 1;
    sp.seed = 77;
    tsr_sampler *s = tsr_sampler_new(&sp, V), *twin = tsr_sampler_new(&sp, V);
    tsr_dev_sampler *d = new_dev(s, V);
    mock.history_calls = 0;
    for (int k = 0; k < 5; k++) {
        pick(d, row, hist, 3 + k, 2);
        assert_null(mock.last_state);
        assert_true(mock.last.u == tsr_sampler_uniform(twin));
        assert_int_equal(mock.last.greedy, 0);
    }
    assert_int_equal(mock.history_calls, 0);
    tsr_dev_sampler_free(d);
    tsr_sampler_free(s);
    /* greedy (top_k 1) with a penalty: no number taken from the stream */
    sp.top_k = 1;
    sp.frequency_penalty = 0.5f;
    s = tsr_sampler_new(&sp, V);
    tsr_sampler *twin2 = tsr_sampler_new(&sp, V);
    d = new_dev(s, V);
    for (int k = 0; k < 3; k++) {
        pick(d, row, hist, 3 + k, 2);
        assert_int_equal(mock.last.greedy, 1);
        assert_non_null(mock.last_state);
    }
    assert_true(tsr_sampler_uniform(s) == tsr_sampler_uniform(twin2));
    tsr_dev_sampler_free(d);
    tsr_sampler_free(s);
    tsr_sampler_free(twin);
    tsr_sampler_free(twin2);
}

/* The parameters sent are the sampler's as it reads them. */
static void test_params_as_read(void **state) {
    (void)state;
    tsr_sampling sp = tsr_sampling_greedy();
    sp.temperature = 0.5f;
    sp.top_p = 1.5f;               /* off: 1 */
    sp.min_p = NAN;                /* off: 0 */
    sp.repetition_penalty = -2.0f; /* off: 1 */
    sp.top_k = -3;                 /* off: 0 */
    tsr_sampler *s = tsr_sampler_new(&sp, 10);
    const tsr_sampling *p = tsr_sampler_params(s);
    assert_true(p->top_p == 1.0f && p->min_p == 0.0f && p->repetition_penalty == 1.0f && p->top_k == 0);
    assert_int_equal(tsr_sampler_greedy_rule(s), 0);
    tsr_dev_sampler *d = new_dev(s, 10);
    float row[10] = {0};
    int32_t h = 0;
    pick(d, row, &h, 1, 1);
    assert_true(mock.last.top_p == 1.0f && mock.last.min_p == 0.0f && mock.last.repetition_penalty == 1.0f &&
                mock.last.top_k == 0 && mock.last.temperature == 0.5f && mock.last.vocab == 10);
    assert_null(mock.last_state); /* the penalty read as off */
    tsr_dev_sampler_free(d);
    tsr_sampler_free(s);
}

/* The CPU backend cannot sample on a device; a vocabulary too large is refused. */
static void test_refusals(void **state) {
    (void)state;
    tsr_sampling sp = tsr_sampling_greedy();
    tsr_sampler *s = tsr_sampler_new(&sp, 10);
    tsr_dev_sampler *d = NULL;
    tsr_error err;
    tsr_error_clear(&err);
    assert_int_equal(tsr_dev_sampler_new(tsr_backend_cpu(), s, 10, &d, &err), TSR_ERR_UNSUPPORTED);
    assert_null(d);
    assert_non_null(strstr(err.msg, "cpu"));
    tsr_error_clear(&err);
    assert_int_equal(tsr_dev_sampler_new(&mock_be, s, TSR_CU_SAMPLE_MAX_VOCAB + 1, &d, &err), TSR_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "8388609"));
    tsr_sampler_free(s);
}

/* The algorithm against tsr_sampler_sample on random rows and parameters. */
static void test_algorithm_against_sampler(void **state) {
    (void)state;
    static const struct {
        float t, p, min_p, rep, pres, freq;
        int k;
    } ps[] = {
        {1.0f, 1.0f, 0, 1, 0, 0, 0},        {0.7f, 0.9f, 0, 1, 0, 0, 40},       {1.3f, 0.95f, 0.05f, 1, 0, 0, 0},
        {1.0f, 1.0f, 0, 1, 0, 0, 1000},     {1.0f, 0.5f, 0, 1, 0, 0, 5000},     {0.5f, 0.3f, 0, 1.3f, 0.5f, 0.2f, 0},
        {1.0f, 1.0f, 0.2f, 1, 0, 0, 0},     {2.0f, 1.0f, 0, 1, 0, 0, 3},        {0.0f, 1.0f, 0, 1.5f, 0, 1.0f, 0},
        {1.0f, 1e-7f, 0, 1, 0, 0, 0},       {1.0f, 0.8f, 0, 0.7f, 0, 0, 0},     {1.0f, 0.0f, 0, 1, 0, 0, 0},
        {1.0f, 1.0f, 1.0f, 1, 0, 0, 0},     {0.9f, 0.95f, 0.02f, 1.1f, 0.1f, 0.05f, 50},
    };
    const int vocabs[] = {1, 5, 1000, 32000};
    long cases = 0, differ = 0;
    for (size_t vi = 0; vi < sizeof vocabs / sizeof *vocabs; vi++) {
        const int V = vocabs[vi];
        float *row = malloc((size_t)V * sizeof *row), *copy = malloc((size_t)V * sizeof *copy);
        int32_t hist[64];
        assert_true(row && copy);
        for (size_t pi = 0; pi < sizeof ps / sizeof *ps; pi++)
            for (int kind = 0; kind < 6; kind++) {
                tsr_sampling sp = tsr_sampling_greedy();
                sp.temperature = ps[pi].t, sp.top_k = ps[pi].k, sp.top_p = ps[pi].p, sp.min_p = ps[pi].min_p;
                sp.repetition_penalty = ps[pi].rep, sp.presence_penalty = ps[pi].pres;
                sp.frequency_penalty = ps[pi].freq;
                sp.has_seed = 1;
                sp.seed = rnd();
                tsr_sampler *cpu = tsr_sampler_new(&sp, V), *ds = tsr_sampler_new(&sp, V);
                tsr_dev_sampler *d = new_dev(ds, V);
                const int np = 30;
                for (int i = 0; i < np; i++) hist[i] = (int32_t)(rnd() % (uint64_t)(V < 40 ? V : 40));
                int n = np;
                for (int draw = 0; draw < 8; draw++) {
                    for (int i = 0; i < V; i++) {
                        double x = rnd_normal();
                        row[i] = kind == 3 ? (float)(round(x * 4) / 2) : (float)(x * (kind == 0 ? 1 : kind == 1 ? 3 : 8));
                        if (kind == 4) {
                            uint64_t r = rnd() % 40;
                            row[i] = r == 0 ? NAN : r == 1 ? -INFINITY : r == 2 ? -0.0f : r == 3 ? 0.0f : row[i];
                        }
                    }
                    if (kind == 5) row[rnd() % (uint64_t)V] = INFINITY, row[rnd() % (uint64_t)V] = INFINITY;
                    memcpy(copy, row, (size_t)V * sizeof *row);
                    int32_t want = tsr_sampler_sample(cpu, copy, hist, n, np, 0, NULL);
                    int32_t got = pick(d, row, hist, n, np);
                    cases++;
                    if (got != want) {
                        differ++;
                        printf("# vocab %d set %zu kind %d draw %d: model %d, CPU %d\n", V, pi, kind, draw, got, want);
                    }
                    if (want < 0) break;
                    hist[n++] = want;
                }
                tsr_dev_sampler_free(d);
                tsr_sampler_free(cpu);
                tsr_sampler_free(ds);
            }
        free(row);
        free(copy);
    }
    printf("# %ld draws (%ld through the compacted list), %ld differ from tsr_sampler_sample (allowed: 1 in 1000)\n",
           cases, emu_compactions, differ);
    assert_true(differ * 1000 <= cases);
    assert_true(emu_compactions > 300); /* the top-k and top-p lists are exercised */
}

/* Logits left on the device are refused on the CPU. */
static void test_forward_device_on_cpu(void **state) {
    (void)state;
    tsr_model_opts o = {.n_threads = 1};
    tsr_model *m;
    tsr_error err;
    tsr_error_clear(&err);
    if (tsr_model_load(&o, &m, &err) != TSR_OK) fail_msg("%s", err.msg);
    tsr_seq *s;
    assert_int_equal(tsr_seq_new(m, 8, &s, &err), TSR_OK);
    int32_t ids[2] = {1, 2};
    assert_int_equal(tsr_seq_forward_device(s, ids, 2, &err), TSR_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "CPU"));
    assert_int_equal(tsr_seq_len(s), 0);
    tsr_seq_free(s);
    tsr_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_history_state),
        cmocka_unit_test(test_stream_and_no_history),
        cmocka_unit_test(test_params_as_read),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_algorithm_against_sampler),
        cmocka_unit_test(test_forward_device_on_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
