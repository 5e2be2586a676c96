/*
 * dev_sampler.c - the host side of sampling on the device: parameters, the
 * incremental history and the uniform number (dev_sampler.h).
 */
#include <stdlib.h>
#include <string.h>

#include "dev_sampler.h"

/* History ids sent per copy (a long prompt goes in several). */
#define TSR_DEV_SAMPLER_BATCH 4096

struct tsr_dev_sampler {
    const tsr_backend *be;
    tsr_sampler *s;
    int vocab;
    tsr_cu_sample_args a; /* all but u, from the sampler's parameters */
    int32_t *state;       /* [vocab] backend memory; NULL when no penalty is in effect */
    void *scratch;        /* backend memory */
    int32_t *dev_io;      /* backend memory: [1] out, then [BATCH] history ids */
    int32_t *host_io;     /* host staging of the same (pageable: no copy of it is replayed by a graph,
                           * and an upload from it has read it when it returns) */
    int n_sent;
};

int tsr_dev_sampler_sent(const tsr_dev_sampler *d) { return d->n_sent; }

void tsr_dev_sampler_free(tsr_dev_sampler *d) {
    if (!d) return;
    if (d->state) d->be->free(d->state);
    if (d->scratch) d->be->free(d->scratch);
    if (d->dev_io) d->be->free(d->dev_io);
    free(d->host_io);
    free(d);
}

int tsr_dev_sampler_new(const tsr_backend *be, tsr_sampler *s, int vocab, tsr_dev_sampler **out,
                        tsr_error *err) {
    *out = NULL;
    if (!be->sample || !be->sample_history || !be->sample_scratch_bytes)
        return tsr_error_set(err, TSR_ERR_UNSUPPORTED, "the %s backend cannot sample on its device", be->name);
    if (vocab < 1 || vocab > TSR_CU_SAMPLE_MAX_VOCAB)
        return tsr_error_set(err, TSR_ERR_UNSUPPORTED,
                             "device sampling takes vocabularies of 1 to %d tokens (this one has %d)",
                             TSR_CU_SAMPLE_MAX_VOCAB, vocab);
    tsr_dev_sampler *d = calloc(1, sizeof *d);
    if (!d) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    d->be = be;
    d->s = s;
    d->vocab = vocab;
    const tsr_sampling *p = tsr_sampler_params(s);
    d->a = (tsr_cu_sample_args){
        .vocab = vocab,
        .greedy = tsr_sampler_greedy_rule(s),
        .temperature = p->temperature,
        .top_k = p->top_k,
        .top_p = p->top_p,
        .min_p = p->min_p,
        .repetition_penalty = p->repetition_penalty,
        .presence_penalty = p->presence_penalty,
        .frequency_penalty = p->frequency_penalty,
    };
    const int penalties = p->repetition_penalty != 1.0f || p->presence_penalty != 0 || p->frequency_penalty != 0;
    const size_t io_bytes = (size_t)(1 + TSR_DEV_SAMPLER_BATCH) * sizeof(int32_t);
    if ((penalties && !(d->state = be->alloc((size_t)vocab * sizeof(int32_t), err))) ||
        !(d->scratch = be->alloc((size_t)be->sample_scratch_bytes(vocab), err)) ||
        !(d->dev_io = be->alloc(io_bytes, err))) {
        tsr_dev_sampler_free(d);
        return err->code;
    }
    if (!(d->host_io = malloc(io_bytes))) {
        tsr_dev_sampler_free(d);
        return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    }
    *out = d;
    return TSR_OK;
}

/* Send history[n_sent..n) into the state, n_prompt of the history being
 * prompt (only later ids count as generated). */
static int send_history(tsr_dev_sampler *d, const int32_t *history, int n, int n_prompt, tsr_error *err) {
    const tsr_backend *be = d->be;
    while (d->n_sent < n) {
        const int from = d->n_sent, cnt = n - from < TSR_DEV_SAMPLER_BATCH ? n - from : TSR_DEV_SAMPLER_BATCH;
        const int gen_from = n_prompt <= from ? 0 : n_prompt - from; /* may exceed cnt: all prompt */
        memcpy(d->host_io + 1, history + from, (size_t)cnt * sizeof *history);
        int rc = be->upload_async(d->dev_io + 1, d->host_io + 1, (size_t)cnt * sizeof *history, err);
        if (rc == TSR_OK) rc = be->sample_history(d->state, d->dev_io + 1, cnt, gen_from, d->vocab, err);
        if (rc != TSR_OK) return rc;
        d->n_sent = from + cnt;
    }
    return TSR_OK;
}

/* The history brought up to n_history (pick's checks), then the draw into
 * dev_io[0], queued. */
static int draw(tsr_dev_sampler *d, const float *logits, const int32_t *history, int n_history, int n_prompt,
                tsr_error *err) {
    if (n_history < d->n_sent)
        return tsr_error_set(err, TSR_ERR_INVALID, "device sampler: the history shrank from %d to %d ids",
                             d->n_sent, n_history);
    if (n_history > d->n_sent && !history)
        return tsr_error_set(err, TSR_ERR_INVALID, "device sampler: %d history ids and no history", n_history);
    if (n_prompt < 0) n_prompt = 0;
    if (n_prompt > n_history) n_prompt = n_history;
    int rc;
    if (d->state) {
        if ((rc = send_history(d, history, n_history, n_prompt, err))) return rc;
    } else {
        d->n_sent = n_history; /* no penalty: the history changes nothing */
    }
    tsr_cu_sample_args a = d->a;
    a.u = a.greedy ? 0.0 : tsr_sampler_uniform(d->s);
    return d->be->sample(logits, d->state, &a, d->scratch, d->dev_io, err);
}

int tsr_dev_sampler_queue(tsr_dev_sampler *d, const float *logits, const int32_t *history, int n_history,
                          int n_prompt, const int32_t *prev, const int32_t **at, tsr_error *err) {
    int rc;
    if (!history) { /* one more generated id, on the device only */
        if (d->state && (rc = d->be->sample_history(d->state, prev, 1, 0, d->vocab, err))) return rc;
        n_history = ++d->n_sent;
    }
    if ((rc = draw(d, logits, history, n_history, n_prompt, err))) return rc;
    *at = d->dev_io;
    return TSR_OK;
}

int tsr_dev_sampler_pick(tsr_dev_sampler *d, const float *logits, const int32_t *history, int n_history,
                         int n_prompt, int32_t *id, tsr_error *err) {
    *id = -1;
    int rc = draw(d, logits, history, n_history, n_prompt, err);
    if (rc != TSR_OK) return rc;
    if ((rc = d->be->download(d->host_io, d->dev_io, sizeof(int32_t), err))) return rc;
    *id = d->host_io[0];
    if (*id < -1 || *id >= d->vocab)
        return tsr_error_set(err, TSR_ERR_DEVICE, "device sampler: chose id %d of a vocabulary of %d", *id,
                             d->vocab);
    return TSR_OK;
}
