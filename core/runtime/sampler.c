/*
 * sampler.c - the rules of sampling.h, in the order documented there.
 *
 * Hot path costs for a vocabulary of V with h history tokens: penalties
 * O(h); temperature, candidate collection and one exp per candidate O(V);
 * top-k a partial selection O(V); top-p a bucketed pass O(V) plus a sort of
 * the one bucket where the mass reaches p; the draw two passes over V.
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../util/checked.h"
#include "sampling.h"
#include "../../kernels/cpu/ops.h"

/* Slack for "mass reaches p" and "p >= min_p * p_max": parameters arrive as
 * float and probabilities are rounded, so exact boundaries must not flip. */
#define TSR_SAMPLER_SLACK 1e-6

typedef struct tsr_cand {
    float logit;
    int32_t id;
} tsr_cand;

struct tsr_sampler {
    tsr_sampling p; /* as read: see read_params */
    int vocab;
    uint64_t seed;
    uint64_t rng[4];
    int32_t *count; /* [vocab] zero between calls */
    uint8_t *seen;  /* [vocab] zero between calls */
    tsr_cand *cand; /* [vocab] */
    float *probs;   /* [vocab] scratch of tsr_sampler_sample */
    float *raw;     /* [vocab] raw logits kept for log-probabilities */
    uint16_t *bucket; /* [vocab] top-p: each candidate's bucket */
    double bpart[4][32 * 32 + 1]; /* top-p bucket sums, four tables (TSR_TOPP_BUCKETS) */
};

/* --- random stream -------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t *s) {
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

static uint64_t clock_seed(const void *salt) {
    struct timespec a, b;
    clock_gettime(CLOCK_REALTIME, &a);
    clock_gettime(CLOCK_MONOTONIC, &b);
    uint64_t x = (uint64_t)a.tv_sec * 1000000000ull + (uint64_t)a.tv_nsec;
    x ^= rotl((uint64_t)b.tv_sec * 1000000000ull + (uint64_t)b.tv_nsec, 32);
    x ^= (uint64_t)(uintptr_t)salt;
    return splitmix64(&x);
}

double tsr_sampler_uniform(tsr_sampler *s) {
    TSR_ASSERT(s);
    return (double)(xoshiro_next(s->rng) >> 11) * 0x1.0p-53;
}

uint64_t tsr_sampler_seed(const tsr_sampler *s) {
    TSR_ASSERT(s);
    return s->seed;
}

const tsr_sampling *tsr_sampler_params(const tsr_sampler *s) {
    TSR_ASSERT(s);
    return &s->p;
}

/* --- parameters ----------------------------------------------------------- */

tsr_sampling tsr_sampling_greedy(void) {
    tsr_sampling p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    return p;
}

int tsr_sampling_validate(const tsr_sampling *p, tsr_error *err) {
    if (!p) return tsr_error_set(err, TSR_ERR_INVALID, "sampling: no parameters");
    if (!isfinite(p->temperature) || p->temperature < 0)
        return tsr_error_set(err, TSR_ERR_INVALID,
                             "sampling: temperature must be finite and >= 0 (got %g)",
                             (double)p->temperature);
    if (p->top_k < 0)
        return tsr_error_set(err, TSR_ERR_INVALID, "sampling: top_k must be >= 0 (got %d)",
                             p->top_k);
    if (!(p->top_p >= 0 && p->top_p <= 1))
        return tsr_error_set(err, TSR_ERR_INVALID, "sampling: top_p must be in [0, 1] (got %g)",
                             (double)p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return tsr_error_set(err, TSR_ERR_INVALID, "sampling: min_p must be in [0, 1] (got %g)",
                             (double)p->min_p);
    if (!isfinite(p->repetition_penalty) || p->repetition_penalty <= 0)
        return tsr_error_set(err, TSR_ERR_INVALID,
                             "sampling: repetition_penalty must be finite and > 0 (got %g)",
                             (double)p->repetition_penalty);
    if (!isfinite(p->presence_penalty))
        return tsr_error_set(err, TSR_ERR_INVALID,
                             "sampling: presence_penalty must be finite (got %g)",
                             (double)p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return tsr_error_set(err, TSR_ERR_INVALID,
                             "sampling: frequency_penalty must be finite (got %g)",
                             (double)p->frequency_penalty);
    return TSR_OK;
}

/* Out-of-range values read as the nearest meaningful setting (sampling.h). */
static tsr_sampling read_params(const tsr_sampling *in) {
    tsr_sampling p = in ? *in : tsr_sampling_greedy();
    if (!(p.temperature > 0)) p.temperature = 0;
    if (p.temperature > FLT_MAX) p.temperature = FLT_MAX;
    if (p.top_k < 0) p.top_k = 0;
    if (!(p.top_p < 1)) p.top_p = 1; /* NaN and >= 1: off */
    if (p.top_p < 0) p.top_p = 0;
    if (!(p.min_p > 0)) p.min_p = 0; /* NaN and <= 0: off */
    if (p.min_p > 1) p.min_p = 1;
    if (!(p.repetition_penalty > 0) || !isfinite(p.repetition_penalty)) p.repetition_penalty = 1;
    if (!isfinite(p.presence_penalty)) p.presence_penalty = 0;
    if (!isfinite(p.frequency_penalty)) p.frequency_penalty = 0;
    return p;
}

static void *alloc_array(int n, size_t elem) {
    uint64_t bytes;
    if (n <= 0 || tsr_mul_u64((uint64_t)n, elem, &bytes) || bytes > SIZE_MAX) return NULL;
    return calloc((size_t)n, elem);
}

tsr_sampler *tsr_sampler_new(const tsr_sampling *p, int vocab) {
    if (vocab <= 0) return NULL;
    tsr_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = read_params(p);
    s->vocab = vocab;
    s->count = alloc_array(vocab, sizeof *s->count);
    s->seen = alloc_array(vocab, sizeof *s->seen);
    s->cand = alloc_array(vocab, sizeof *s->cand);
    s->probs = alloc_array(vocab, sizeof *s->probs);
    s->raw = alloc_array(vocab, sizeof *s->raw);
    s->bucket = alloc_array(vocab, sizeof *s->bucket);
    if (!s->count || !s->seen || !s->cand || !s->probs || !s->raw || !s->bucket) {
        tsr_sampler_free(s);
        return NULL;
    }
    s->seed = s->p.has_seed ? s->p.seed : clock_seed(s);
    uint64_t x = s->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    return s;
}

void tsr_sampler_free(tsr_sampler *s) {
    if (!s) return;
    free(s->count);
    free(s->seen);
    free(s->cand);
    free(s->probs);
    free(s->bucket);
    free(s->raw);
    free(s);
}

/* --- rule 1: penalties ---------------------------------------------------- */

static void apply_penalties(tsr_sampler *s, float *logits, const int32_t *hist, int n_hist,
                            int n_prompt) {
    const int V = s->vocab;
    if (!hist || n_hist <= 0) return;
    if (n_prompt < 0) n_prompt = 0;
    if (n_prompt > n_hist) n_prompt = n_hist;

    float rep = s->p.repetition_penalty;
    if (rep != 1.0f) {
        for (int i = 0; i < n_hist; i++) {
            int32_t id = hist[i];
            if (id < 0 || id >= V || s->seen[id]) continue;
            s->seen[id] = 1;
            float l = logits[id];
            logits[id] = l > 0 ? l / rep : l * rep;
        }
        for (int i = 0; i < n_hist; i++)
            if (hist[i] >= 0 && hist[i] < V) s->seen[hist[i]] = 0;
    }

    double pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
    if (pres != 0 || freq != 0) {
        for (int i = n_prompt; i < n_hist; i++)
            if (hist[i] >= 0 && hist[i] < V) s->count[hist[i]]++;
        for (int i = n_prompt; i < n_hist; i++) {
            int32_t id = hist[i];
            if (id < 0 || id >= V || s->count[id] == 0) continue;
            logits[id] = (float)((double)logits[id] - (pres + freq * s->count[id]));
            s->count[id] = 0; /* applied once per distinct token */
        }
    }
}

/* --- ordering and partial selection --------------------------------------- */

/* a comes before b: higher logit, ties to the lower id (a total order). */
static int cand_before(const tsr_cand *a, const tsr_cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp(const void *pa, const void *pb) {
    const tsr_cand *a = pa, *b = pb;
    if (cand_before(a, b)) return -1;
    if (cand_before(b, a)) return 1;
    return 0;
}

static void cand_swap(tsr_cand *a, tsr_cand *b) {
    tsr_cand t = *a;
    *a = *b;
    *b = t;
}

/* Reorder c[0..n) so that its first k elements are the k first in order
 * (themselves in no particular order). Quickselect with a median of three;
 * keys are distinct (ids are), and a depth budget falls back to a sort so
 * the worst case stays O(n log n). */
static void select_first(tsr_cand *c, int n, int k) {
    if (k <= 0 || k >= n) return;
    int lo = 0, hi = n - 1, budget = 16;
    for (int m = n; m > 1; m >>= 1) budget += 2;
    while (hi > lo) {
        if (--budget < 0) {
            qsort(c + lo, (size_t)(hi - lo + 1), sizeof *c, cand_cmp);
            return;
        }
        int mid = lo + (hi - lo) / 2;
        if (cand_before(&c[mid], &c[lo])) cand_swap(&c[mid], &c[lo]);
        if (cand_before(&c[hi], &c[lo])) cand_swap(&c[hi], &c[lo]);
        if (cand_before(&c[hi], &c[mid])) cand_swap(&c[hi], &c[mid]);
        /* c[lo] <= c[mid] <= c[hi] in order: c[mid] is the pivot, parked at hi. */
        cand_swap(&c[mid], &c[hi]);
        tsr_cand piv = c[hi];
        int store = lo;
        for (int i = lo; i < hi; i++)
            if (cand_before(&c[i], &piv)) cand_swap(&c[i], &c[store++]);
        cand_swap(&c[store], &c[hi]);
        if (store == k - 1 || store == k) return;
        if (store < k) lo = store + 1;
        else hi = store - 1;
    }
}

/* --- rules 2-5 ------------------------------------------------------------ */

/* Top-p's kept set: the shortest prefix of the order whose weight reaches
 * need. Only its tokens matter, not their order, so instead of sorting, the
 * weights are summed per bucket of (max - logit) (32 per logit unit, beyond
 * 32 units one last bucket; in float, which keeps the buckets in the order):
 * buckets follow the order, the boundary bucket is found from their sums,
 * and only that bucket is sorted. Each candidate's bucket is computed once
 * (s->bucket), the sums go to four interleaved tables so that consecutive
 * candidates of one bucket do not wait for each other's add. Moves the kept
 * tokens to c[0..kept) and returns kept. */
#define TSR_TOPP_PER_UNIT 32
#define TSR_TOPP_UNITS 32
#define TSR_TOPP_BUCKETS (TSR_TOPP_PER_UNIT * TSR_TOPP_UNITS + 1)

static int top_p_cut(tsr_sampler *s, tsr_cand *c, int n, float mx, const float *w, double need) {
    uint16_t *bk = s->bucket;
    _Static_assert(sizeof(tsr_cand) == 2 * sizeof(float) && offsetof(tsr_cand, logit) == 0, "pairs of logit, id");
    tsr_topp_buckets(&c[0].logit, n, mx, (float)TSR_TOPP_PER_UNIT, TSR_TOPP_BUCKETS - 1, bk);
    double(*part)[TSR_TOPP_BUCKETS] = s->bpart;
    memset(part, 0, sizeof s->bpart);
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) part[j][bk[i + j]] += (double)w[c[i + j].id];
    for (; i < n; i++) part[0][bk[i]] += (double)w[c[i].id];
    double cum = 0;
    int bb = -1;
    for (int b = 0; b < TSR_TOPP_BUCKETS; b++) {
        const double sum = (part[0][b] + part[1][b]) + (part[2][b] + part[3][b]);
        if (cum + sum >= need) {
            bb = b;
            break;
        }
        cum += sum;
    }
    if (bb < 0) return n; /* rounding: the whole mass did not reach need */
    int a = 0;
    for (i = 0; i < n; i++)
        if (bk[i] < bb) {
            cand_swap(&c[a], &c[i]);
            const uint16_t t = bk[a];
            bk[a++] = bk[i], bk[i] = t;
        }
    int e = a;
    for (i = a; i < n; i++)
        if (bk[i] == bb) cand_swap(&c[e++], &c[i]); /* bk below i is not read again: not swapped */
    qsort(c + a, (size_t)(e - a), sizeof *c, cand_cmp);
    for (i = a; i < e; i++) {
        cum += (double)w[c[i].id];
        if (cum >= need) return i + 1;
    }
    return e;
}

/* Top-k for small k in one pass over the logits: a heap of the k first in
 * order whose root is the last of them, so most logits cost one comparison.
 * Writes the finite logits' k first (fewer if there are fewer) to c. */
#define TSR_HEAP_TOP_K 1024

static void heap_down(tsr_cand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && cand_before(&h[w], &h[l])) w = l;
        if (r < n && cand_before(&h[w], &h[r])) w = r;
        if (w == i) return;
        cand_swap(&h[i], &h[w]);
        i = w;
    }
}

static int heap_top_k(const float *logits, int V, int k, tsr_cand *h) {
    int n = 0;
    for (int i = 0; i < V; i++) {
        float l = logits[i];
        if (!isfinite(l)) continue;
        if (n < k) {
            int j = n++;
            h[j] = (tsr_cand){l, i};
            while (j > 0 && cand_before(&h[(j - 1) / 2], &h[j])) {
                cand_swap(&h[(j - 1) / 2], &h[j]);
                j = (j - 1) / 2;
            }
        } else if (l > h[0].logit) { /* ids grow: an equal logit never wins */
            h[0] = (tsr_cand){l, i};
            heap_down(h, n, 0);
        }
    }
    return n;
}

static int is_greedy(const tsr_sampler *s) {
    return s->p.temperature == 0 || s->p.top_k == 1;
}

int tsr_sampler_greedy_rule(const tsr_sampler *s) {
    TSR_ASSERT(s);
    return is_greedy(s);
}

int tsr_sampler_plain_greedy(const tsr_sampler *s) {
    return is_greedy(s) && s->p.repetition_penalty == 1 && s->p.presence_penalty == 0 &&
           s->p.frequency_penalty == 0;
}

/* Highest non-NaN logit, ties to the lowest id; -1 if all are NaN or -inf
 * (the CPU kernels' scan: AVX2 where present). */
static int32_t argmax(const float *logits, int V) { return V > 0 ? tsr_argmax_above(logits, V, -INFINITY) : -1; }

/* Rules 3-5 on penalised logits, writing the final distribution into probs
 * (zeroed first). */
static void dist_sampled(tsr_sampler *s, float *logits, float *probs) {
    const int V = s->vocab;
    /* Rule 3, with the maximum in the same pass. */
    int finite;
    float mx = tsr_div_max(logits, V, s->p.temperature, &finite);
    if (mx == -INFINITY) { /* nothing can be chosen */
        memset(probs, 0, (size_t)V * sizeof *probs);
        return;
    }

    /* Candidates: the +inf logits if any (then uniform), else every finite
     * one; rule 4's top-k straight from the logits when k is small. */
    int n = 0, k = s->p.top_k;
    tsr_cand *c = s->cand;
    double z = 0;
    if (finite && (k <= 0 || k >= V)) {
        /* Every logit a candidate, in id order: the softmax's weights
         * (relative to the top, the sum in double) straight from the row. */
        z = tsr_exp_weights(logits, V, mx, probs);
        if (s->p.top_p >= 1.0f && s->p.min_p <= 0) { /* rule 6 over them all */
            tsr_div_by(probs, V, z);
            return;
        }
        for (int i = 0; i < V; i++) c[i] = (tsr_cand){logits[i], i};
        n = V;
    } else {
        memset(probs, 0, (size_t)V * sizeof *probs);
        if (mx == INFINITY) {
            for (int i = 0; i < V; i++)
                if (logits[i] == INFINITY) c[n++] = (tsr_cand){0.0f, i};
            mx = 0.0f;
        } else if (k > 0 && k <= TSR_HEAP_TOP_K) {
            n = heap_top_k(logits, V, k, c);
        } else {
            for (int i = 0; i < V; i++)
                if (isfinite(logits[i])) c[n++] = (tsr_cand){logits[i], i};
        }
        if (k > 0 && k < n) {
            select_first(c, n, k);
            n = k;
        }
        /* Softmax: weights relative to the top, in probs; the sum in double. */
        for (int i = 0; i < n; i++) {
            double w = exp((double)c[i].logit - (double)mx);
            probs[c[i].id] = (float)w;
            z += (double)probs[c[i].id];
        }
    }

    /* Rule 5: top-p, then min-p (a threshold: a filter in any order). */
    int kept = n;
    if (s->p.top_p < 1.0f)
        kept = top_p_cut(s, c, n, mx, probs, ((double)s->p.top_p - TSR_SAMPLER_SLACK) * z);
    for (int i = kept; i < n; i++) probs[c[i].id] = 0.0f;
    if (s->p.min_p > 0) {
        double thr = (double)s->p.min_p * (1.0 - TSR_SAMPLER_SLACK);
        int j = 0;
        for (int i = 0; i < kept; i++)
            if ((double)probs[c[i].id] >= thr) cand_swap(&c[j++], &c[i]);
        for (int i = j; i < kept; i++) probs[c[i].id] = 0.0f;
        kept = j; /* the top token has weight 1 >= thr: j >= 1 */
    }

    /* Rule 6 (first half): renormalise over the kept set. */
    double zk = 0;
    for (int i = 0; i < kept; i++) zk += (double)probs[c[i].id];
    for (int i = 0; i < kept; i++) probs[c[i].id] = (float)((double)probs[c[i].id] / zk);
}

void tsr_sampler_dist(tsr_sampler *s, float *logits, const int32_t *history, int n_history,
                      int n_prompt, float *probs) {
    TSR_ASSERT(s && logits && probs);
    apply_penalties(s, logits, history, n_history, n_prompt);
    if (is_greedy(s)) {
        memset(probs, 0, (size_t)s->vocab * sizeof *probs);
        int32_t id = argmax(logits, s->vocab);
        if (id >= 0) probs[id] = 1.0f;
        return;
    }
    dist_sampled(s, logits, probs);
}

/* --- rule 6: the draw ----------------------------------------------------- */

int32_t tsr_sampler_draw(tsr_sampler *s, const float *probs) {
    TSR_ASSERT(s && probs);
    /* the uniform number is drawn only where a token can be (as before) */
    if (!tsr_weights_any(probs, s->vocab)) return -1;
    return (int32_t)tsr_draw_weights(probs, s->vocab, tsr_sampler_uniform(s));
}

/* The residual max(0, p - q) (q NULL: one-hot at x) into r [vocab], as
 * floats: weights that do not count (tsr_draw_weights) count as 0 in p and
 * q. Returns 1 when some weight of it is positive. */
static int residual(const float *p, const float *q, int32_t x, int V, float *r) {
    if (!q) { /* p but at x, where 1 - p is not below 0 */
        memcpy(r, p, (size_t)V * sizeof *r);
        if (x >= 0 && x < V) r[x] = 0.0f;
    } else {
        for (int i = 0; i < V; i++) {
            const float pi = tsr_weight_counts(p[i]) ? p[i] : 0.0f, qi = tsr_weight_counts(q[i]) ? q[i] : 0.0f;
            r[i] = pi > qi ? pi - qi : 0.0f;
        }
    }
    return tsr_weights_any(r, V);
}

int tsr_sampler_verify(tsr_sampler *s, const float *p, const float *q, int32_t drafted,
                       int32_t *out) {
    TSR_ASSERT(s && p && out);
    const int V = s->vocab;
    if (!tsr_weights_any(p, V)) {
        *out = -1;
        return -1;
    }
    int in = drafted >= 0 && drafted < V;
    double px = in && tsr_weight_counts(p[drafted]) ? (double)p[drafted] : 0.0;
    double qx = !in ? 0.0 : q ? (tsr_weight_counts(q[drafted]) ? (double)q[drafted] : 0.0) : 1.0;
    double u = tsr_sampler_uniform(s);
    if (px > 0 && u * qx < px) { /* probability min(1, px / qx) */
        *out = drafted;
        return 1;
    }
    TSR_ASSERT(p != s->probs && q != s->probs);
    if (!residual(p, q, drafted, V, s->probs)) {
        *out = tsr_sampler_draw(s, p);
        return 0;
    }
    *out = (int32_t)tsr_draw_weights(s->probs, V, tsr_sampler_uniform(s));
    return 0;
}

/* --- log-probabilities and the whole step --------------------------------- */

/* log p of a logit l given the maximum and the log-normaliser: l - lse; when
 * some logits are +inf the distribution is uniform over them (-log n). */
static float logprob_of(float l, float mx, double lse) {
    if (lse == INFINITY || !(l > -INFINITY)) return -INFINITY;
    if (mx == INFINITY) return l == INFINITY ? (float)(0.0 - lse) : -INFINITY;
    return (float)((double)l - lse);
}

void tsr_logprobs(const float *logits, int vocab, int32_t id, int n_top, tsr_token_info *info) {
    TSR_ASSERT(info && (logits || vocab <= 0));
    memset(info, 0, sizeof *info);
    info->id = id;
    if (n_top < 0) n_top = 0;
    if (n_top > TSR_MAX_TOP_LOGPROBS) n_top = TSR_MAX_TOP_LOGPROBS;

    /* the largest logit (NaN never; -inf where none is larger), +inf counted */
    const int32_t at = argmax(logits, vocab);
    const float mx = at >= 0 ? logits[at] : -INFINITY;
    int n_pinf = 0;
    if (mx == INFINITY)
        for (int i = 0; i < vocab; i++) n_pinf += logits[i] == INFINITY;
    /* Log-normaliser; lse == INFINITY: no distribution (every logit NaN or
     * -inf), every token gets -inf. */
    double lse;
    if (mx == -INFINITY) {
        lse = INFINITY;
    } else if (mx == INFINITY) {
        lse = log((double)n_pinf);
    } else {
        lse = (double)mx + log(tsr_sum_exp(logits, vocab, mx));
    }
    info->logprob = (id >= 0 && id < vocab) ? logprob_of(logits[id], mx, lse) : -INFINITY;

    /* The n_top first in order by insertion into a short sorted list. */
    tsr_cand top[TSR_MAX_TOP_LOGPROBS];
    int nt = 0;
    if (n_top > 0) {
        for (int i = 0; i < vocab; i++) {
            if (nt == n_top && mx != INFINITY) { /* full: only a larger logit enters (ids grow) */
                i += (int)tsr_first_above(logits + i, vocab - i, top[nt - 1].logit);
                if (i == vocab) break;
            }
            float l = logits[i];
            if (!(l > -INFINITY)) continue;           /* NaN or -inf */
            if (mx == INFINITY && l != INFINITY) continue; /* probability 0 */
            tsr_cand c = {l, i};
            if (nt == n_top && !cand_before(&c, &top[nt - 1])) continue;
            int j = nt < n_top ? nt++ : nt - 1;
            while (j > 0 && cand_before(&c, &top[j - 1])) {
                top[j] = top[j - 1];
                j--;
            }
            top[j] = c;
        }
    }
    info->n_top = nt;
    for (int j = 0; j < nt; j++) {
        info->top_ids[j] = top[j].id;
        info->top_logprobs[j] = logprob_of(top[j].logit, mx, lse);
    }
}

int32_t tsr_sampler_sample(tsr_sampler *s, float *logits, const int32_t *history, int n_history,
                           int n_prompt, int n_top, tsr_token_info *info) {
    TSR_ASSERT(s && logits);
    const int V = s->vocab;
    if (info) memcpy(s->raw, logits, (size_t)V * sizeof *logits);
    apply_penalties(s, logits, history, n_history, n_prompt);
    int32_t id;
    if (is_greedy(s)) {
        id = argmax(logits, V);
    } else {
        dist_sampled(s, logits, s->probs);
        id = tsr_sampler_draw(s, s->probs);
    }
    if (info) tsr_logprobs(s->raw, V, id, n_top, info);
    return id;
}
