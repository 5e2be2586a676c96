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
 */
#ifndef TSR_SAMPLING_H
#define TSR_SAMPLING_H

#include <stdint.h>

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

/* NULL on allocation failure. vocab > 0. */
tsr_sampler *tsr_sampler_new(const tsr_sampling *p, int vocab);
void tsr_sampler_free(tsr_sampler *s);

/* Apply rules 1-5 to logits (modified in place) and write the final
 * distribution to probs [vocab] (zeros outside the kept set; one-hot when
 * greedy). history: prompt then generated ids; n_prompt of them are prompt. */
void tsr_sampler_dist(tsr_sampler *s, float *logits, const int32_t *history, int n_history,
                      int n_prompt, float *probs);

/* Draw from a distribution with the sampler's random stream. */
int32_t tsr_sampler_draw(tsr_sampler *s, const float *probs);

/* A uniform number in [0, 1) from the sampler's stream (rejection sampling). */
double tsr_sampler_uniform(tsr_sampler *s);

/* Sample one token from logits (modified in place). If info is not NULL,
 * fill it with the chosen id, its raw log-probability and the n_top best
 * alternatives (0 <= n_top <= TSR_MAX_TOP_LOGPROBS). */
int32_t tsr_sampler_sample(tsr_sampler *s, float *logits, const int32_t *history, int n_history,
                           int n_prompt, int n_top, tsr_token_info *info);

/* Raw log-probability of id and the n_top best tokens of logits (not
 * modified), into info. */
void tsr_logprobs(const float *logits, int vocab, int32_t id, int n_top, tsr_token_info *info);

#endif /* TSR_SAMPLING_H */
