#include "ops.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "cpu_features.h"

#if defined(__x86_64__)
/* ops_avx2.c */
void tsr_silu_mul_avx2(float *y, const float *g, const float *u, int64_t n);
float tsr_sumsq_avx2(const float *x, int n);
void tsr_scale_mul_avx2(float *y, const float *x, float s, const float *w, int n);
void tsr_rotate_halves_avx2(float *x, const float *c, const float *s, int n_heads, int hd);
int64_t tsr_absmax_avx2(const float *x, int64_t n, float *amax, int *nan);
int64_t tsr_max_above_avx2(const float *x, int64_t n, float floor, float *best);
int64_t tsr_find_avx2(const float *x, int64_t n, float v);
int64_t tsr_sum_exp_avx2(const float *x, int64_t n, float mx, double *sum);
int64_t tsr_first_above_avx2(const float *x, int64_t n, float floor);
int64_t tsr_div_max_avx2(float *x, int64_t n, float t, float *mx, int *finite);
int64_t tsr_exp_weights_avx2(const float *x, int64_t n, float mx, float *w, double *sum);
int64_t tsr_div_by_avx2(float *w, int64_t n, double z);
int64_t tsr_weight_sums_avx2(const float *p, int64_t n, double *block, int64_t block_len);
int64_t tsr_topp_buckets_avx2(const float *x, int64_t n, float mx, float per_unit, int last, uint16_t *b);
#define HAS_AVX2() tsr_cpu_has_avx2_fma_f16c()
#else
#define HAS_AVX2() 0
#endif

void tsr_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
#if defined(__x86_64__)
    if (HAS_AVX2()) { /* the same formula; the squares summed in 32 lanes */
        tsr_scale_mul_avx2(y, x, 1.0f / sqrtf(tsr_sumsq_avx2(x, n) / (float)n + eps), w, n);
        return;
    }
#endif
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = (x[i] * inv) * w[i];
}

int tsr_rope_init(tsr_rope *r, int head_dim, float theta, int interleaved, int scaling,
                  float factor, float low_freq_factor, float high_freq_factor, int orig_ctx) {
    if (head_dim <= 0 || head_dim % 2 || head_dim / 2 > (int)(sizeof r->inv_freq / sizeof r->inv_freq[0]))
        return -1;
    r->head_dim = head_dim;
    r->interleaved = interleaved;
    r->pos_scale = 1.0f;
    for (int i = 0; i < head_dim / 2; i++)
        r->inv_freq[i] = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
    if (scaling == 1) { /* llama3: long wavelengths slowed by factor, smooth in between */
        float low_wavelen = (float)orig_ctx / low_freq_factor;
        float high_wavelen = (float)orig_ctx / high_freq_factor;
        for (int i = 0; i < head_dim / 2; i++) {
            float f = r->inv_freq[i], wavelen = 2.0f * (float)M_PI / f;
            if (wavelen < high_wavelen) continue;
            if (wavelen > low_wavelen) {
                r->inv_freq[i] = f / factor;
            } else {
                float smooth = ((float)orig_ctx / wavelen - low_freq_factor) /
                               (high_freq_factor - low_freq_factor);
                r->inv_freq[i] = (1.0f - smooth) * f / factor + smooth * f;
            }
        }
    } else if (scaling == 2) {
        r->pos_scale = 1.0f / factor;
    }
    return 0;
}

void tsr_rope_apply(const tsr_rope *r, float *x, int n_heads, int pos) {
    const int hd = r->head_dim, half = hd / 2;
    const float p = (float)pos * r->pos_scale;
    float c[sizeof r->inv_freq / sizeof r->inv_freq[0]], s[sizeof c / sizeof c[0]];
    for (int i = 0; i < half; i++) {
        float a = p * r->inv_freq[i];
        c[i] = cosf(a), s[i] = sinf(a);
    }
#if defined(__x86_64__)
    if (!r->interleaved && HAS_AVX2()) { /* head by head, 8 pairs at a time */
        tsr_rotate_halves_avx2(x, c, s, n_heads, hd);
        return;
    }
#endif
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (int64_t)h * hd;
        for (int i = 0; i < half; i++) {
            int i0 = r->interleaved ? 2 * i : i, i1 = r->interleaved ? 2 * i + 1 : i + half;
            float x0 = v[i0], x1 = v[i1];
            v[i0] = x0 * c[i] - x1 * s[i];
            v[i1] = x1 * c[i] + x0 * s[i];
        }
    }
}

void tsr_silu_mul(float *y, const float *g, const float *u, int64_t n) {
#if defined(__x86_64__)
    if (HAS_AVX2()) {
        tsr_silu_mul_avx2(y, g, u, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        float a = g[i];
        y[i] = a / (1.0f + expf(-a)) * u[i];
    }
}

float tsr_absmax(const float *x, int64_t n, int *nan) {
    float amax = 0.0f;
    int64_t i = 0;
    *nan = 0;
#if defined(__x86_64__)
    if (HAS_AVX2()) i = tsr_absmax_avx2(x, n, &amax, nan); /* whole blocks of 8; the rest below */
#endif
    for (; i < n; i++) {
        float v = fabsf(x[i]);
        if (v != v) *nan = 1;
        else if (v > amax) amax = v;
    }
    return amax;
}

void tsr_add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void tsr_axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

double tsr_sum_exp(const float *x, int64_t n, float mx) {
    double z = 0;
    int64_t i = 0;
#if defined(__x86_64__)
    if (HAS_AVX2()) i = tsr_sum_exp_avx2(x, n, mx, &z); /* whole vectors; the tail below */
#endif
    for (; i < n; i++)
        if (x[i] > -INFINITY) z += exp((double)x[i] - (double)mx);
    return z;
}

float tsr_div_max(float *x, int64_t n, float t, int *finite) {
    float mx = -INFINITY;
    int fin = 1;
    int64_t i = 0;
#if defined(__x86_64__)
    if (HAS_AVX2()) i = tsr_div_max_avx2(x, n, t, &mx, &fin);
#endif
    for (; i < n; i++) {
        if (isfinite(x[i]) && t != 1.0f) x[i] /= t;
        if (!isfinite(x[i])) fin = 0; /* after the division, which may overflow */
        if (x[i] > mx) mx = x[i];
    }
    *finite = fin;
    return mx;
}

double tsr_exp_weights(const float *x, int64_t n, float mx, float *w) {
    double z = 0;
    int64_t i = 0;
#if defined(__x86_64__)
    if (HAS_AVX2()) i = tsr_exp_weights_avx2(x, n, mx, w, &z);
#endif
    for (; i < n; i++) {
        w[i] = (float)exp((double)x[i] - (double)mx);
        z += (double)w[i];
    }
    return z;
}

void tsr_div_by(float *w, int64_t n, double z) {
    int64_t i = 0;
#if defined(__x86_64__)
    if (HAS_AVX2()) i = tsr_div_by_avx2(w, n, z);
#endif
    for (; i < n; i++) w[i] = (float)((double)w[i] / z);
}

void tsr_topp_buckets(const float *x, int64_t n, float mx, float per_unit, int last, uint16_t *b) {
    int64_t i = 0;
#if defined(__x86_64__)
    if (HAS_AVX2()) i = tsr_topp_buckets_avx2(x, n, mx, per_unit, last, b);
#endif
    for (; i < n; i++) {
        const float t = (mx - x[2 * i]) * per_unit;
        b[i] = (uint16_t)(int)(t < (float)last ? t : (float)last);
    }
}

int tsr_weights_any(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (tsr_weight_counts(p[i])) return 1;
    return 0;
}

/* Sums of the counted weights of blocks of TSR_DRAW_BLOCK (the last one
 * shorter) into block[]; returns the number of blocks. */
#define TSR_DRAW_BLOCK 1024
static int64_t weight_sums(const float *p, int64_t n, double *block) {
    int64_t nb = (n + TSR_DRAW_BLOCK - 1) / TSR_DRAW_BLOCK, b = 0;
#if defined(__x86_64__)
    if (HAS_AVX2()) b = tsr_weight_sums_avx2(p, n, block, TSR_DRAW_BLOCK);
#endif
    for (; b < nb; b++) {
        double s = 0;
        const int64_t e = (b + 1) * TSR_DRAW_BLOCK < n ? (b + 1) * TSR_DRAW_BLOCK : n;
        for (int64_t i = b * TSR_DRAW_BLOCK; i < e; i++)
            if (tsr_weight_counts(p[i])) s += (double)p[i];
        block[b] = s;
    }
    return nb;
}

int64_t tsr_draw_weights(const float *p, int64_t n, double u) {
    double stack[256], *block = stack;
    const int64_t nb = (n + TSR_DRAW_BLOCK - 1) / TSR_DRAW_BLOCK;
    if (nb > (int64_t)(sizeof stack / sizeof stack[0])) block = malloc((size_t)nb * sizeof *block);
    double total = 0;
    if (block) {
        weight_sums(p, n, block);
        for (int64_t b = 0; b < nb; b++) total += block[b];
    } else { /* out of memory: no blocks to skip */
        for (int64_t i = 0; i < n; i++)
            if (tsr_weight_counts(p[i])) total += (double)p[i];
    }
    int64_t pick = -1;
    if (total > 0) {
        const double target = u * total;
        double cum = 0;
        int64_t b = 0;
        if (block) /* the blocks the cumulative sum stays within */
            for (; b < nb && cum + block[b] <= target; b++) cum += block[b];
        for (int64_t i = b * TSR_DRAW_BLOCK; i < n && pick < 0; i++)
            if (tsr_weight_counts(p[i]) && target < (cum += (double)p[i])) pick = i;
        /* rounding left target at the very end: the last counted weight */
        for (int64_t i = n; pick < 0 && i-- > 0;)
            if (tsr_weight_counts(p[i])) pick = i;
    }
    if (block != stack) free(block);
    return pick;
}

void tsr_softmax(float *x, int n) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

void tsr_topk(const float *x, int n, int k, int32_t *idx) {
    /* k is small (experts per token): selection by insertion. */
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(x[i])) continue;
        if (m == k && !(x[i] > x[idx[m - 1]])) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && x[i] > x[idx[j - 1]]) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
    for (int j = m; j < k; j++) idx[j] = -1;
}

/* The maximum in eight independent chains (one chain waits out a compare
 * and a select per element: ~150 us over a 151,936-entry vocabulary), then
 * the first index holding it. "v > m ? v : m" never takes a NaN, and a max
 * does not depend on the order of the chains, so the result is the one
 * element-by-element scan's. */
int32_t tsr_argmax_above(const float *x, int n, float floor) {
    float best = floor;
    int i = 0;
#if defined(__x86_64__)
    if (HAS_AVX2()) /* the same scans in 32 lanes (a decode's 151,936 logits: 113 -> 50 us) */
        i = (int)tsr_max_above_avx2(x, n, floor, &best);
#endif
    float m[8] = {best, best, best, best, best, best, best, best};
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    for (int j = 0; j < 8; j++) best = m[j] > best ? m[j] : best;
    for (; i < n; i++) best = x[i] > best ? x[i] : best;
    if (!(best > floor)) return -1;
    i = 0;
#if defined(__x86_64__)
    if (HAS_AVX2()) {
        const int64_t at = tsr_find_avx2(x, n, best);
        if (at >= 0) return (int32_t)at;
        i = n / 8 * 8; /* not in the vector part: in the tail */
    }
#endif
    while (x[i] != best) i++; /* best is one of x's values */
    return i;
}

int64_t tsr_first_above(const float *x, int64_t n, float floor) {
    int64_t i = 0;
#if defined(__x86_64__)
    if (HAS_AVX2()) {
        const int64_t at = tsr_first_above_avx2(x, n, floor);
        if (at >= 0) return at;
        i = n / 8 * 8; /* not in the vector part: in the tail */
    }
#endif
    while (i < n && !(x[i] > floor)) i++;
    return i;
}

int32_t tsr_argmax(const float *x, int n) {
    const int32_t best = tsr_argmax_above(x, n, -INFINITY);
    if (best >= 0) return best;
    for (int i = 0; i < n; i++) /* nothing above -inf: the first that is not NaN */
        if (!isnan(x[i])) return i;
    return 0;
}
