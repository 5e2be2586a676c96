/*
 * sampling.h - sampling parameters and the sampler (sampler.c).
 *
 * Order in which the rules apply to a row of logits (documented here and in
 * the README; the server and the CLI share it):
 *   1. penalties over the tokens generated so far (and the prompt for the
 *      repetition penalty): repetition (divide positive logits, multiply
 *      negative ones, as in CTRL / transformers), then presence and frequency
 *      (subtract presence + frequency * count, as in OpenAI's API);
 *   2. temperature == 0 (or top_k == 1): greedy argmax, stop here;
 *   3. divide by temperature;
 *   4. top-k, then softmax;
 *   5. top-p (smallest set whose mass reaches p), then min-p (drop tokens
 *      below min_p times the top probability);
 *   6. renormalise and draw with the request's random stream.
 * Log-probabilities reported to the caller are those of the model's raw
 * distribution (log-softmax of the unmodified logits).
 *
 * Details of each rule (sampler.c):
 *   - history ids outside [0, vocab) are ignored; the repetition penalty
 *     applies once per distinct token; presence and frequency penalties count
 *     only history[n_prompt..n_history) (the generated tokens).
 *   - NaN logits are never chosen and -inf logits are banned tokens. If some
 *     logits are +inf, the distribution is uniform over those. If no token can
 *     be chosen (every logit NaN or -inf), the sampler answers -1.
 *   - greedy: the highest logit, ties to the lowest id; no random numbers used.
 *   - candidates are ordered by logit, ties to the lowest id; top-k keeps the
 *     first k of that order (partial selection, no full sort).
 *   - top-p keeps the shortest prefix of that order whose mass reaches p; the
 *     token that reaches p is kept, and "reaches" means mass >= p - 1e-6 so that
 *     p = 0.8f keeps {0.5, 0.3} of {0.5, 0.3, 0.2} despite rounding. At least
 *     one token is always kept (top_p <= 0 keeps only the best).
 *   - min-p keeps tokens with p >= min_p * p_max * (1 - 1e-6); min-p is
 *     relative, so applying it before or after top-p's renormalisation is the
 *     same.
 *   - softmax subtracts the maximum and accumulates in double (with every
 *     logit a candidate, each weight from a double polynomial within ~2 ulp
 *     of e^ in double, rounded to float: kernels/cpu/ops.h tsr_exp_weights).
 */
#ifndef TSR_SAMPLING_H
#define TSR_SAMPLING_H

#include <stdint.h>

#include "../util/error.h"

typedef struct tsr_sampling {
    float temperature;        /* 0: greedy */
    int top_k;                /* 0: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 1: off */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    uint64_t seed;            /* used when has_seed */
    int has_seed;             /* 0: seed from the clock */
} tsr_sampling;

/* Greedy, no penalties. */
tsr_sampling tsr_sampling_greedy(void);

/* TSR_OK, or TSR_ERR_INVALID naming the field when a value is outside the
 * range where it means something: temperature finite and >= 0, top_k >= 0,
 * top_p and min_p in [0, 1], repetition_penalty finite and > 0, presence and
 * frequency penalties finite. (The server may apply narrower API limits.)
 * tsr_sampler_new does not fail on such values: it reads them as the nearest
 * meaningful setting (NaN or negative temperature: greedy; bad top_p, min_p
 * or repetition_penalty: off; infinite temperature: uniform). */
int tsr_sampling_validate(const tsr_sampling *p, tsr_error *err);

/* A chosen token with its log-probability and the top alternatives. */
#define TSR_MAX_TOP_LOGPROBS 20
typedef struct tsr_token_info {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_ids[TSR_MAX_TOP_LOGPROBS];
    float top_logprobs[TSR_MAX_TOP_LOGPROBS];
} tsr_token_info;

typedef struct tsr_sampler tsr_sampler;
/* 1 when every draw of s is the highest raw logit (greedy with no penalty
 * in effect), so a caller may ask the model for argmax ids alone. */
int tsr_sampler_plain_greedy(const tsr_sampler *s);


/* NULL on allocation failure or vocab <= 0. The random stream is
 * xoshiro256** seeded through splitmix64 from p->seed (or from the clock when
 * !p->has_seed): the same seed gives the same stream. */
tsr_sampler *tsr_sampler_new(const tsr_sampling *p, int vocab);
void tsr_sampler_free(tsr_sampler *s); /* NULL does nothing */

/* The seed in use (the clock's when the request had none), to log or replay. */
uint64_t tsr_sampler_seed(const tsr_sampler *s);

/* The parameters as s reads them (out-of-range values already turned into
 * their meaningful setting, see tsr_sampling_validate): what a sampler on
 * another device must apply to sample as s does. */
const tsr_sampling *tsr_sampler_params(const tsr_sampler *s);
/* 1 when s takes the argmax (temperature 0 or top_k 1) and draws no number. */
int tsr_sampler_greedy_rule(const tsr_sampler *s);

/* Apply rules 1-5 to logits (modified in place) and write the final
 * distribution to probs [vocab] (zeros outside the kept set; one-hot when
 * greedy). history: prompt then generated ids; n_prompt of them are prompt. */
void tsr_sampler_dist(tsr_sampler *s, float *logits, const int32_t *history, int n_history,
                      int n_prompt, float *probs);

/* Draw from a distribution [vocab] with the sampler's random stream (one
 * uniform number). probs need not be normalised: they are weights, and NaN,
 * negative or infinite entries count as 0. -1 when no weight is positive. */
int32_t tsr_sampler_draw(tsr_sampler *s, const float *probs);

/* A uniform number in [0, 1) from the sampler's stream (rejection sampling). */
double tsr_sampler_uniform(tsr_sampler *s);

/* Speculative verification of one drafted token (Leviathan et al. / Chen et
 * al. rejection sampling), preserving the target distribution exactly.
 * p [vocab]: the target's final distribution (tsr_sampler_dist); q [vocab]:
 * the draft distribution the token was drawn from, or NULL when the drafter
 * was deterministic (q one-hot at drafted). Accepts with probability
 * min(1, p[drafted] / q[drafted]) and returns 1 with *out = drafted; otherwise
 * returns 0 with *out drawn from the residual max(0, p - q) renormalised (p
 * itself if that is empty). Returns -1 with *out = -1 when p has no positive
 * weight. Uses one uniform number, plus one draw when it rejects. */
int tsr_sampler_verify(tsr_sampler *s, const float *p, const float *q, int32_t drafted,
                       int32_t *out);

/* Sample one token from logits (modified in place). If info is not NULL,
 * fill it with the chosen id, its raw log-probability and the n_top best
 * alternatives (0 <= n_top <= TSR_MAX_TOP_LOGPROBS). Returns the same token
 * as tsr_sampler_dist followed by tsr_sampler_draw (no draw when greedy);
 * -1 when no token can be chosen. */
int32_t tsr_sampler_sample(tsr_sampler *s, float *logits, const int32_t *history, int n_history,
                           int n_prompt, int n_top, tsr_token_info *info);

/* Raw log-probability of id and the n_top best tokens of logits (not
 * modified), into info. The alternatives are sorted by logit (ties: lowest
 * id first) and exclude NaN and -inf logits, so info->n_top may be less than
 * n_top (which is clamped to [0, TSR_MAX_TOP_LOGPROBS]). An id outside
 * [0, vocab) or with a NaN logit gets -inf. */
void tsr_logprobs(const float *logits, int vocab, int32_t id, int n_top, tsr_token_info *info);

#endif /* TSR_SAMPLING_H */
