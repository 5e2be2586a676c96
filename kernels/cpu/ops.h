/*
 * ops.h - the core's elementwise and per-row kernels on the CPU: norms,
 * rotary embeddings, activations, softmax, top-k. f32, written to match the
 * arithmetic of the reference implementation (transformers) closely.
 */
#ifndef TSR_KERNELS_CPU_OPS_H
#define TSR_KERNELS_CPU_OPS_H

#include <float.h>
#include <stdint.h>

/* y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], n elements; y may equal x. */
void tsr_rmsnorm(float *y, const float *x, const float *w, int n, float eps);

/* Rotary embedding tables: inv_freq[i] for i < head_dim/2, from theta and
 * the scaling rule (tsr_rope_scaling in core/format/model_config.h). */
typedef struct tsr_rope {
    int head_dim;
    int interleaved;   /* rotate pairs (2i, 2i+1) instead of (i, i + d/2) */
    float inv_freq[512];
    float pos_scale;   /* linear scaling: positions multiplied by this */
} tsr_rope;

/* scaling: 0 none, 1 llama3, 2 linear (values of tsr_rope_scaling). */
int tsr_rope_init(tsr_rope *r, int head_dim, float theta, int interleaved, int scaling,
                  float factor, float low_freq_factor, float high_freq_factor, int orig_ctx);
/* Rotate n_heads heads of head_dim at x (contiguous [n_heads, head_dim]) to position pos. */
void tsr_rope_apply(const tsr_rope *r, float *x, int n_heads, int pos);

/* y = silu(g) * u, n elements; y may equal g. With AVX2 + FMA (ops_avx2.c)
 * e^-g comes from an 8-wide polynomial (about 2 ulp) instead of expf. */
void tsr_silu_mul(float *y, const float *g, const float *u, int64_t n);
/* max |x[i]| over n elements (0 for n <= 0); *nan = 1 when x holds a NaN
 * (the maximum is then meaningless), else 0. Inf counts as a value. */
float tsr_absmax(const float *x, int64_t n, int *nan);
/* y += x */
void tsr_add(float *y, const float *x, int64_t n);
/* y += a * x */
void tsr_axpy(float *y, float a, const float *x, int64_t n);
/* The sum of e^(x[i] - mx) over the x[i] > -inf (NaN skipped), in double:
 * a softmax's normaliser over a vocabulary (mx finite, >= every x[i]). With
 * AVX2 + FMA each term from tsr_exp256 (about 2 ulp; terms below e^-87
 * count 0), else exp in double. */
double tsr_sum_exp(const float *x, int64_t n, float mx);
/* A sampler's softmax over a row (core/runtime/sampler.c), in three
 * passes of the vocabulary:
 *   tsr_div_max: x[i] /= t for the finite x[i] (t != 1; the same float
 *   division), returns the largest x[i] after it (NaN skipped; -inf when
 *   none) and *finite = 1 when every x[i] is finite after it (a small t
 *   overflows large logits to inf);
 *   tsr_exp_weights: w[i] = (float)e^((double)x[i] - (double)mx) for x
 *   finite and <= mx, returns the sum of the w[i] in double. With AVX2 + FMA
 *   e^ comes from a double polynomial within ~2 ulp of a double, so a w[i]
 *   differs from the C library's rounding only where e^ lies that close to
 *   a float rounding boundary (rare: one float ulp); summed in another order;
 *   tsr_div_by: w[i] = (float)((double)w[i] / z). */
float tsr_div_max(float *x, int64_t n, float t, int *finite);
double tsr_exp_weights(const float *x, int64_t n, float mx, float *w);
void tsr_div_by(float *w, int64_t n, double z);
/* A sampler's top-p buckets (sampler.c): for the logits l_i = x[2 * i] of n
 * {float logit, int32 id} pairs, all finite and <= mx, b[i] = (int)min((mx -
 * l_i) * per_unit, last) (per_unit a power of two, so that the product is
 * exact; last <= 65,535). */
void tsr_topp_buckets(const float *x, int64_t n, float mx, float per_unit, int last, uint16_t *b);
/* A weight of a draw counts when it lies in (0, FLT_MAX]: not 0, negative,
 * infinite or NaN. */
static inline int tsr_weight_counts(float v) { return v > 0 && v <= FLT_MAX; }
/* Whether some weight of p[n] counts. */
int tsr_weights_any(const float *p, int64_t n);
/* A draw from weights p[n] (those that count; others weigh nothing): the first i whose cumulative weight exceeds u * total, the last
 * counted one where rounding leaves none, -1 when the total is not > 0.
 * The total and the cumulative sums of whole blocks in double, summed in
 * another order than one sequential sum (a draw within that rounding of a
 * boundary may fall on its other side). */
int64_t tsr_draw_weights(const float *p, int64_t n, double u);
/* In-place softmax of n values (max-subtracted, f32). */
void tsr_softmax(float *x, int n);
/* Indices of the k largest values of x[n] (ties: lower index first), in
 * descending order of value. */
void tsr_topk(const float *x, int n, int k, int32_t *idx);
/* Index of the largest value (ties: lowest index; NaN never chosen; all
 * NaN: 0). */
int32_t tsr_argmax(const float *x, int n);
/* The same among the values greater than floor; -1 when there is none. */
int32_t tsr_argmax_above(const float *x, int n, float floor);
/* Index of the first x[i] > floor (NaN never), n when there is none. */
int64_t tsr_first_above(const float *x, int64_t n, float floor);
static inline float tsr_sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }

#endif /* TSR_KERNELS_CPU_OPS_H */
