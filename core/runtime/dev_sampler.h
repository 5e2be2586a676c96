/*
 * dev_sampler.h - sampling where the logits are (issue #7): on a device
 * backend the token is drawn from a row of logits in backend memory and only
 * its id crosses to the host, instead of the whole row.
 *
 * The rules are those of a tsr_sampler (sampling.h), read from it
 * (tsr_sampler_params), and so is the random stream: the uniform number of
 * the draw is taken on the host from the sampler's stream, so the same seed
 * gives the same token as tsr_sampler_sample wherever the draw is not within
 * rounding of a cumulative boundary (kernels/cuda/sample_cuda.h says which
 * sums differ). The history is kept on the device as per-token state (seen,
 * generated count), sent incrementally: each pick uploads only the ids
 * added since the last one, and nothing at all when no penalty is in effect.
 */
#ifndef TSR_DEV_SAMPLER_H
#define TSR_DEV_SAMPLER_H

#include <stdint.h>

#include "../util/error.h"
#include "backend.h"
#include "sampling.h"

typedef struct tsr_dev_sampler tsr_dev_sampler;

/* A device sampler for s (borrowed: it must outlive the device sampler and
 * gives it its parameters and its random stream) over vocab tokens on be.
 * TSR_ERR_UNSUPPORTED naming the backend where be cannot sample;
 * TSR_ERR_UNSUPPORTED for a vocabulary over TSR_CU_SAMPLE_MAX_VOCAB. */
int tsr_dev_sampler_new(const tsr_backend *be, tsr_sampler *s, int vocab, tsr_dev_sampler **out,
                        tsr_error *err);
void tsr_dev_sampler_free(tsr_dev_sampler *d); /* NULL does nothing */

/* *id = the token tsr_sampler_sample(s, row, history, n_history, n_prompt,
 * 0, NULL) chooses from logits [vocab] in backend memory (not modified),
 * rounding aside; -1 when no token can be chosen. history is one growing
 * array across calls (prompt, then generated ids): the ids from the last
 * call's n_history on are sent; n_prompt must stay the same. Takes one
 * uniform number from s's stream unless the rule is greedy (also when no
 * token can be chosen, where tsr_sampler_draw takes none: generation stops
 * there). Waits for the backend (the id comes back). */
int tsr_dev_sampler_pick(tsr_dev_sampler *d, const float *logits, const int32_t *history, int n_history,
                         int n_prompt, int32_t *id, tsr_error *err);

/* The same draw left on the device for a pipelined pass (pipe.c): the
 * history first brought up to history[0..n_history) as pick does (history
 * NULL: nothing sent, then prev, one generated id in backend memory, added
 * to it where a penalty is in effect), then the id drawn into the
 * sampler's own backend memory, returned in *at (read it by a copy queued
 * after this call); one uniform number taken now. Queues work; waits for
 * nothing. */
int tsr_dev_sampler_queue(tsr_dev_sampler *d, const float *logits, const int32_t *history, int n_history,
                          int n_prompt, const int32_t *prev, const int32_t **at, tsr_error *err);

/* History ids sent so far (for tests). */
int tsr_dev_sampler_sent(const tsr_dev_sampler *d);

#endif /* TSR_DEV_SAMPLER_H */
