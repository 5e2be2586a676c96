/*
 * generate.c - step-wise generation with speculative verification.
 *
 * Each step asks the drafter for up to k tokens, runs the last sampled token
 * and the drafts as k+1 rows in one forward pass, and accepts drafts in
 * order: greedy requests accept a draft iff it is the target's choice (so
 * the output is token for token that of plain greedy decoding); sampled
 * requests accept draft x with probability min(1, p(x)/q(x)) and on
 * rejection draw from normalise(max(0, p - q)) (Leviathan et al.), which
 * leaves the target distribution exactly as it is. Rejected rows are rolled
 * back in the KV cache. On a device backend, requests that sample without
 * asking for log-probabilities draw on the device (dev_sampler.h) and only
 * the id comes back; steps that verify drafts still bring their rows'
 * logits to the host (rejection sampling there). With runtime.pipeline,
 * greedy requests and those drawn on the device queue each pass before the
 * token it follows is read (pipe.c). Text is released only in complete UTF-8 and never while it could
 * still turn into a stop string.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dev_sampler.h"
#include "model_internal.h"
#include "../util/clock.h"

#define TSR_MAX_DRAFT 16

struct tsr_gen {
    tsr_model *m;
    tsr_seq *seq;
    tsr_gen_params p;
    tsr_sampler *sampler;
    int n_prompt;
    int32_t *hist;            /* prompt + generated, [ctx] */
    int n_hist;
    int started;
    int cancelled;
    tsr_finish finish;
    int drafter_seq;
    float *logits;            /* [TSR_MAX_DRAFT + 1, vocab] */
    float *probs;             /* [vocab] */
    float *raw;               /* [vocab] one row of logits as the model gave it */
    float *qprobs;            /* [TSR_MAX_DRAFT, vocab] */
    int32_t draft[TSR_MAX_DRAFT];
    int greedy_ids;           /* ask the model for argmax ids alone (plain greedy, no logprobs) */
    int pipe;                 /* runtime.pipeline, ids only (greedy_ids or dev): the next pass queued ahead (pipe.c) */
    tsr_dev_sampler *dev;     /* sample where the logits are (device backends, no logprobs) or NULL */
    int32_t choices[TSR_MAX_DRAFT + 1];
    tsr_token_info toks[TSR_MAX_DRAFT + 1];
    tsr_detok detok;
    char *text;               /* generated text so far */
    size_t text_len, text_cap, emitted;
    size_t max_stop;
    int greedy;               /* temperature 0 or top_k 1: the argmax, no draw */
    int want_raw;             /* log-probabilities asked for: keep the raw row */
    tsr_gen_stats stats;
    double t_start;
};

static int next_drafter_seq;

int tsr_gen_start(tsr_model *m, const int32_t *prompt, int n_prompt, const tsr_gen_params *p,
                  tsr_gen **out, tsr_error *err) {
    *out = NULL;
    if (n_prompt < 1) return tsr_error_set(err, TSR_ERR_INVALID, "the prompt has no tokens");
    if (p->max_tokens < 1)
        return tsr_error_set(err, TSR_ERR_INVALID, "max_tokens %d must be at least 1", p->max_tokens);
    if ((int64_t)n_prompt + p->max_tokens > m->ctx)
        return tsr_error_set(err, TSR_ERR_RANGE,
                             "prompt of %d tokens plus max_tokens %d exceeds the context of %d tokens",
                             n_prompt, p->max_tokens, m->ctx);
    if (p->n_stop < 0 || p->n_stop > TSR_MAX_STOP || p->top_logprobs < 0 ||
        p->top_logprobs > TSR_MAX_TOP_LOGPROBS)
        return tsr_error_set(err, TSR_ERR_INVALID, "bad stop or top_logprobs count");
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0])
            return tsr_error_set(err, TSR_ERR_INVALID, "stop string %d is empty", i);
    tsr_gen *g = calloc(1, sizeof *g);
    if (!g) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    const int vocab = m->cfg.vocab;
    int total = n_prompt + p->max_tokens;
    g->m = m;
    g->p = *p;
    g->n_prompt = n_prompt;
    g->hist = malloc((size_t)total * sizeof *g->hist);
    g->logits = malloc((size_t)(TSR_MAX_DRAFT + 1) * vocab * sizeof(float));
    g->probs = malloc((size_t)vocab * sizeof(float));
    g->raw = malloc((size_t)vocab * sizeof(float));
    g->qprobs = malloc((size_t)TSR_MAX_DRAFT * vocab * sizeof(float));
    g->sampler = tsr_sampler_new(&p->sampling, vocab);
    g->text_cap = 256;
    g->text = malloc(g->text_cap);
    if (!g->hist || !g->logits || !g->probs || !g->raw || !g->qprobs || !g->sampler || !g->text) {
        tsr_gen_free(g);
        return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    }
    /* KV for every token that is ever run: the last generated one never is,
     * but drafts beyond it may be, within the same bound */
    int rc = tsr_seq_new(m, total, &g->seq, err);
    if (rc != TSR_OK) {
        tsr_gen_free(g);
        return rc;
    }
    memcpy(g->hist, prompt, (size_t)n_prompt * sizeof *prompt);
    g->n_hist = n_prompt;
    for (int i = 0; i < p->n_stop; i++) {
        size_t l = strlen(p->stop[i]);
        if (l > g->max_stop) g->max_stop = l;
    }
    if (m->tok) tsr_detok_init(&g->detok, m->tok, 0);
    g->drafter_seq = __atomic_fetch_add(&next_drafter_seq, 1, __ATOMIC_RELAXED);
    g->greedy = !(p->sampling.temperature > 0.0f && p->sampling.top_k != 1);
    g->want_raw = p->logprobs || p->top_logprobs;
    g->greedy_ids = tsr_sampler_plain_greedy(g->sampler) && !g->want_raw;
    if (!g->greedy_ids && !g->want_raw && m->be->sample && !m->host_sampling) {
        int rc2 = tsr_dev_sampler_new(m->be, g->sampler, vocab, &g->dev, err);
        if (rc2 != TSR_OK) {
            tsr_gen_free(g);
            return rc2;
        }
    }
    g->pipe = m->pipeline_on && (g->greedy_ids || g->dev);
    g->stats.n_prompt = n_prompt;
    g->t_start = tsr_now_seconds();
    *out = g;
    return TSR_OK;
}

void tsr_gen_free(tsr_gen *g) {
    if (!g) return;
    if (g->seq) tsr_drafter_seq_end(g->m->drafter, g->drafter_seq);
    tsr_seq_free(g->seq);
    tsr_dev_sampler_free(g->dev);
    tsr_sampler_free(g->sampler);
    free(g->hist);
    free(g->logits);
    free(g->probs);
    free(g->raw);
    free(g->qprobs);
    free(g->text);
    free(g);
}

void tsr_gen_cancel(tsr_gen *g) { g->cancelled = 1; }

void tsr_gen_get_stats(const tsr_gen *g, tsr_gen_stats *out) { *out = g->stats; }

static int text_append(tsr_gen *g, const char *s, size_t n) {
    if (g->text_len + n + 1 > g->text_cap) {
        size_t cap = g->text_cap * 2;
        while (cap < g->text_len + n + 1) cap *= 2;
        char *t = realloc(g->text, cap);
        if (!t) return -1;
        g->text = t;
        g->text_cap = cap;
    }
    memcpy(g->text + g->text_len, s, n);
    g->text_len += n;
    g->text[g->text_len] = '\0';
    return 0;
}

/* Earliest stop string match at or after from; returns its offset or -1. */
static long find_stop(const tsr_gen *g, size_t from) {
    long best = -1;
    for (int i = 0; i < g->p.n_stop; i++) {
        const char *hit = memmem(g->text + from, g->text_len - from, g->p.stop[i], strlen(g->p.stop[i]));
        if (hit && (best < 0 || hit - g->text < best)) best = hit - g->text;
    }
    return best;
}

/* Bytes at the end of the text that could begin a stop string. */
static size_t stop_holdback(const tsr_gen *g) {
    size_t hold = 0;
    for (int i = 0; i < g->p.n_stop; i++) {
        size_t sl = strlen(g->p.stop[i]);
        for (size_t k = sl - 1; k > hold; k--)
            if (k <= g->text_len - g->emitted &&
                !memcmp(g->text + g->text_len - k, g->p.stop[i], k)) {
                hold = k;
                break;
            }
    }
    return hold;
}

static int is_eos(const tsr_gen *g, int32_t id) {
    const tsr_model_config *c = &g->m->cfg;
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos[i] == id) return 1;
    return g->m->tok && id == tsr_tokenizer_eos(g->m->tok);
}

/* Account one chosen token; returns 1 when generation ends with it. */
static int take_token(tsr_gen *g, const tsr_token_info *info, tsr_gen_event *ev, long *stop_at,
                      tsr_error *err) {
    g->toks[ev->n_tokens++] = *info;
    g->hist[g->n_hist++] = info->id;
    g->stats.n_generated++;
    if (!g->p.ignore_eos && is_eos(g, info->id)) {
        g->finish = TSR_FINISH_STOP;
        return 1;
    }
    char buf[TSR_DETOK_OUT_MIN];
    size_t n = g->m->tok ? tsr_detok_push(&g->detok, info->id, buf, sizeof buf) : 0;
    size_t before = g->text_len;
    if (n && text_append(g, buf, n) != 0) {
        tsr_error_set(err, TSR_ERR_NOMEM, "out of memory for text");
        return -1;
    }
    if (g->p.n_stop && g->text_len > before) {
        size_t from = g->emitted;
        long at = find_stop(g, from);
        if (at >= 0) {
            *stop_at = at;
            g->finish = TSR_FINISH_STOP;
            return 1;
        }
    }
    if (g->stats.n_generated >= g->p.max_tokens || g->n_hist >= g->m->ctx) {
        g->finish = TSR_FINISH_LENGTH;
        return 1;
    }
    return 0;
}

/* The token tsr_sampler_dist and tsr_sampler_draw choose from row (penalised
 * in place); greedy requests take the argmax without building the one-hot
 * distribution and summing it (tsr_sampler_sample's equivalence). */
static int32_t choose(tsr_gen *g, float *row) {
    if (g->greedy)
        return tsr_sampler_sample(g->sampler, row, g->hist, g->n_hist, g->n_prompt, 0, NULL);
    tsr_sampler_dist(g->sampler, row, g->hist, g->n_hist, g->n_prompt, g->probs);
    return tsr_sampler_draw(g->sampler, g->probs);
}

/* Run tokens through the model and draw the next token where its logits
 * are (g->dev): only the id comes back. */
static int device_draw(tsr_gen *g, const int32_t *tokens, int n, int32_t *out, tsr_error *err) {
    int rc = tsr_seq_forward_device(g->seq, tokens, n, err);
    if (rc != TSR_OK) return rc;
    return tsr_dev_sampler_pick(g->dev, g->m->logits_dev, g->hist, g->n_hist, g->n_prompt, out, err);
}

/* Choose a token from logits row (raw copy kept for log-probabilities). */
static void token_info(tsr_gen *g, const float *raw, int32_t id, tsr_token_info *info) {
    if (g->want_raw)
        tsr_logprobs(raw, g->m->cfg.vocab, id, g->p.top_logprobs, info);
    else
        memset(info, 0, sizeof *info);
    info->id = id;
}

/* Hand out a chosen token (log-probabilities from raw where asked): 1 when
 * generation ends with it, 0 when not, -1 with err set (no token could be
 * chosen, or no memory for the text). */
static int emit(tsr_gen *g, const float *raw, int32_t choice, tsr_gen_event *ev, long *stop_at, tsr_error *err) {
    if (choice < 0) {
        tsr_error_set(err, TSR_ERR_INVALID, "no token can be chosen: every logit is NaN or -inf");
        return -1;
    }
    tsr_token_info info;
    token_info(g, raw, choice, &info);
    return take_token(g, &info, ev, stop_at, err);
}

/* runtime.pipeline: the next token (greedy, or drawn on the device), the
 * pass of the token after it queued before this one is read (pipe.c). The
 * drafter is not asked: the checker let runtime.pipeline through only with
 * one that proposes nothing. */
static int pipe_next(tsr_gen *g, int32_t *choice, tsr_error *err) {
    const tsr_pipe_draw draw = {g->dev, g->hist, g->n_hist, g->n_prompt}, *d = g->dev ? &draw : NULL;
    int rc, queued = tsr_seq_pipe_queued(g->seq);
    if (queued == 0) { /* the last generated token leads, as in a plain step */
        if ((rc = tsr_seq_pipe_push(g->seq, &g->hist[g->n_hist - 1], d, err)) != TSR_OK) return rc;
        queued = 1;
    }
    /* the pass whose token follows this one's, where one may */
    if (queued == 1 && g->stats.n_generated + 2 <= g->p.max_tokens &&
        (rc = tsr_seq_pipe_push(g->seq, NULL, d, err)) != TSR_OK)
        return rc;
    return tsr_seq_pipe_pop(g->seq, choice, err);
}

int tsr_gen_step(tsr_gen *g, tsr_gen_event *ev, tsr_error *err) {
    tsr_model *m = g->m;
    const int vocab = m->cfg.vocab;
    memset(ev, 0, sizeof *ev);
    if (g->finish != TSR_FINISH_NONE) {
        ev->finish = g->finish;
        return TSR_OK;
    }
    size_t emit_from = g->emitted;
    long stop_at = -1;
    int rc, done = 0;
    if (g->cancelled) {
        g->finish = TSR_FINISH_CANCELLED;
        ev->finish = g->finish;
        return TSR_OK;
    }
    float *raw = g->raw;
    if (!g->started) {
        double t0 = tsr_now_seconds();
        int32_t choice;
        if (g->greedy_ids) {
            rc = tsr_seq_forward_greedy(g->seq, g->hist, g->n_hist, &choice, 0, err);
        } else if (g->dev) {
            rc = device_draw(g, g->hist, g->n_hist, &choice, err);
        } else {
            rc = tsr_seq_forward(g->seq, g->hist, g->n_hist, g->logits, 0, err);
            if (rc == TSR_OK) {
                if (g->want_raw) memcpy(raw, g->logits, (size_t)vocab * sizeof(float));
                choice = choose(g, g->logits);
            }
        }
        if (rc != TSR_OK) goto out;
        g->started = 1;
        g->stats.prefill_seconds = tsr_now_seconds() - t0;
        g->stats.first_token_seconds = tsr_now_seconds() - g->t_start;
        done = emit(g, raw, choice, ev, &stop_at, err);
        if (done < 0) {
            rc = err->code;
            goto out;
        }
    } else if (g->pipe) {
        double t0 = tsr_now_seconds();
        int32_t choice;
        if ((rc = pipe_next(g, &choice, err)) != TSR_OK) goto out;
        g->stats.decode_passes++;
        done = emit(g, raw, choice, ev, &stop_at, err);
        if (done < 0) {
            rc = err->code;
            goto out;
        }
        /* a pass queued after the last token: waited for, its KV taken back */
        if (done && (rc = tsr_seq_pipe_drop(g->seq, err)) != TSR_OK) goto out;
        g->stats.decode_seconds += tsr_now_seconds() - t0;
    } else {
        double t0 = tsr_now_seconds();
        /* the last generated token is not in the KV yet: it leads the rows */
        int room = g->p.max_tokens - g->stats.n_generated - 1;
        int ctx_room = m->ctx - g->n_hist - 1;
        int k_max = TSR_MAX_DRAFT;
        if (room < k_max) k_max = room;
        if (ctx_room < k_max) k_max = ctx_room;
        int k = 0;
        int sampled = !g->greedy;
        tsr_draft_out dout = {.tokens = g->draft, .probs = sampled ? g->qprobs : NULL};
        if (k_max > 0) {
            tsr_draft_req req = {g->drafter_seq, g->hist, g->n_hist, k_max};
            rc = tsr_drafter_propose(m->drafter, &req, &dout);
            if (rc != TSR_OK) {
                rc = tsr_model_slot_error(m, m->drafter, rc, err, "drafter propose");
                goto out;
            }
            k = dout.n < 0 ? 0 : dout.n > k_max ? k_max : dout.n;
        }
        int32_t rows[TSR_MAX_DRAFT + 1];
        rows[0] = g->hist[g->n_hist - 1];
        memcpy(rows + 1, g->draft, (size_t)k * sizeof *rows);
        int kv_before = tsr_seq_len(g->seq);
        /* the choices come back as ids: greedy ones, or one drawn on the device (no drafts) */
        const int ids_only = g->greedy_ids || (g->dev && k == 0);
        if (g->greedy_ids) {
            rc = tsr_seq_forward_greedy(g->seq, rows, k + 1, g->choices, 1, err);
        } else if (ids_only) {
            rc = device_draw(g, rows, 1, g->choices, err);
        } else {
            rc = tsr_seq_forward(g->seq, rows, k + 1, g->logits, 1, err);
        }
        if (rc != TSR_OK) goto out;
        g->stats.decode_passes++;
        int accepted = 0;
        for (int i = 0; i <= k && !done; i++) {
            int32_t choice = -1;
            int accept_draft = 0;
            if (ids_only) { /* the model's argmax or the device's draw is the choice */
                choice = g->choices[i];
                accept_draft = i < k && choice == g->draft[i];
            } else {
                float *row = g->logits + (int64_t)i * vocab;
                if (g->want_raw) memcpy(raw, row, (size_t)vocab * sizeof(float));
                if (i < k && sampled) {
                    tsr_sampler_dist(g->sampler, row, g->hist, g->n_hist, g->n_prompt, g->probs);
                    const float *q = dout.deterministic ? NULL : g->qprobs + (int64_t)i * vocab;
                    accept_draft = tsr_sampler_verify(g->sampler, g->probs, q, g->draft[i], &choice) == 1;
                } else {
                    choice = choose(g, row);
                    accept_draft = i < k && choice == g->draft[i];
                }
            }
            done = emit(g, raw, choice, ev, &stop_at, err);
            if (done < 0) {
                rc = err->code;
                goto out;
            }
            if (!accept_draft) break;
            accepted++;
        }
        /* keep the KV of the rows whose tokens were accepted: row 0 and accepted drafts */
        rc = tsr_seq_truncate(g->seq, kv_before + 1 + accepted, err);
        if (rc != TSR_OK) goto out;
        if (k > 0) {
            g->stats.draft_proposed += k;
            g->stats.draft_accepted += accepted;
            g->stats.verify_passes++;
            tsr_drafter_accept(m->drafter, g->drafter_seq, k, accepted);
        }
        g->stats.decode_seconds += tsr_now_seconds() - t0;
    }
    if (done) {
        if (stop_at < 0) { /* nothing more can match: release what was held */
            char buf[TSR_DETOK_OUT_MIN];
            size_t n = g->m->tok ? tsr_detok_flush(&g->detok, buf, sizeof buf) : 0;
            if (n && text_append(g, buf, n) != 0) {
                rc = tsr_error_set(err, TSR_ERR_NOMEM, "out of memory for text");
                goto out;
            }
            g->emitted = g->text_len;
        } else {
            g->emitted = (size_t)stop_at;
        }
        ev->finish = g->finish;
    } else {
        g->emitted = g->text_len - (g->p.n_stop ? stop_holdback(g) : 0);
    }
    ev->tokens = g->toks;
    ev->text = g->text + emit_from;
    ev->text_len = g->emitted > emit_from ? g->emitted - emit_from : 0;
    rc = TSR_OK;
out:
    return rc;
}
