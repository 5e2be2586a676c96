/*
 * pipe.c - pipelined greedy decode (runtime.pipeline).
 *
 * A plain greedy step launches a one-row pass, waits for its argmax, hands
 * the token out, and only then launches the next pass: between two passes
 * the device idles while the host wakes, copies the id back, detokenises and
 * launches again (~0.05-0.08 ms a token on the H200, 1-3% of a pass). A
 * sequence's pipe queues the next pass before the token it follows is read:
 * that pass takes its input id from the device, where the pass before left
 * its argmax, so the host reads tokens one pass behind the device.
 *
 * Each pipelined pass is, in stream order: (graph: the step, from the
 * slot's pinned copy, into the staging memory), the pass with its id read
 * from pipe->dev_id, the argmax (or, for a request that samples, the id the
 * device sampler draws after the pass: dev_sampler.h) copied into the
 * slot's pinned id_out and into dev_id (the next pass's input), then a mark
 * the host waits on. The sampler's uniform numbers are taken as its passes
 * are queued, one each, so in the order of the tokens, and a drawn id joins
 * the penalties' history on the device. Two
 * slots alternate: a slot is written again only after its pass was waited
 * for. Other sequences' passes may be queued between them: they read their
 * own inputs and never touch dev_id. A pass queued after the token that
 * ends the generation is wasted; drop() waits for it and takes its KV back.
 * Where no token could be chosen the argmax is -1: the pass queued behind it
 * embeds row 0 instead (backend.h) and is discarded when the -1 is read.
 * Waits are for a sequence's own passes (its marks), never the whole queue,
 * and a finished sequence's pipe goes back to the model (m->pipes) instead of
 * being freed: freeing device and pinned memory waits for the device, which
 * would stall every other sequence's queued passes.
 */
#include <stdlib.h>
#include <string.h>

#include "dev_sampler.h"
#include "model_internal.h"

enum { PIPE_SLOTS = 2 };

typedef struct pipe_slot {
    tsr_step step;   /* the pass's position, copied in by its graph */
    int32_t id_in;   /* a queue's first token, copied into dev_id */
    int32_t id_out;  /* the pass's argmax */
} pipe_slot;

struct tsr_pipe {
    tsr_pipe *next;     /* in the model's pool of unused pipes */
    int32_t *dev_id;    /* backend memory: the next pass's input id */
    pipe_slot *host;    /* [PIPE_SLOTS], pinned */
    void *mark[PIPE_SLOTS];
    int pos[PIPE_SLOTS]; /* each queued pass's position */
    int first, n;       /* the oldest queued slot; passes queued */
};

static void pipe_free(const tsr_backend *be, tsr_pipe *p) {
    if (!p) return;
    for (int i = 0; i < PIPE_SLOTS; i++)
        if (p->mark[i]) be->mark_free(p->mark[i]);
    be->host_free(p->host);
    be->free(p->dev_id);
    free(p);
}

static tsr_pipe *pipe_new(tsr_model *m, tsr_error *err) {
    const tsr_backend *be = m->be;
    tsr_pipe *p = m->pipes;
    if (p) { /* one a finished sequence gave back */
        m->pipes = p->next;
        p->next = NULL;
        return p;
    }
    p = calloc(1, sizeof *p);
    if (!p) {
        tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
        return NULL;
    }
    int ok = (p->dev_id = be->alloc(sizeof *p->dev_id, err)) != NULL &&
             (p->host = be->host_alloc(PIPE_SLOTS * sizeof *p->host, err)) != NULL;
    for (int i = 0; ok && be->mark_new && i < PIPE_SLOTS; i++) ok = (p->mark[i] = be->mark_new(err)) != NULL;
    if (!ok) {
        pipe_free(be, p);
        return NULL;
    }
    return p;
}

typedef struct pipe_pass {
    tsr_pipe *p;
    int slot, kv_seq, pos0;
    tsr_fwd_out out; /* ARGMAX_LAST (greedy), or DEVICE_LAST (the sampler's draw follows) */
} pipe_pass;

/* The id at src (backend memory) into the slot's id_out and into dev_id. */
static int hand_on(const tsr_backend *be, tsr_pipe *p, int slot, const int32_t *src, tsr_error *err) {
    int rc = be->download_async(&p->host[slot].id_out, src, sizeof p->host[slot].id_out, err);
    return rc == TSR_OK ? be->copy_async(p->dev_id, src, sizeof *p->dev_id, err) : rc;
}

/* The pass of one row on the id in dev_id; greedy: its argmax handed on.
 * Issued eagerly, or captured once per slot and output kind (graph.c). */
static int pipe_body(tsr_model *m, const tsr_exec *ex, void *ctx, tsr_error *err) {
    const pipe_pass *a = ctx;
    const tsr_backend *be = m->be;
    pipe_slot *s = &a->p->host[a->slot];
    int rc = TSR_OK;
    if (ex->step) rc = be->upload_async(m->io, &s->step, sizeof s->step, err);
    int32_t *ids = m->ids;
    m->ids = a->p->dev_id;
    m->head_out = m->logits_dev;
    if (rc == TSR_OK) rc = tsr_forward_pass(m, ex, a->kv_seq, a->pos0, 1, a->out, err);
    m->ids = ids;
    if (rc == TSR_OK && a->out == TSR_FWD_ARGMAX_LAST) rc = hand_on(be, a->p, a->slot, m->argmax_dev, err);
    return rc;
}

int tsr_seq_pipe_queued(const tsr_seq *s) { return s->pipe ? s->pipe->n : 0; }

int tsr_seq_pipe_push(tsr_seq *s, const int32_t *token, const tsr_pipe_draw *draw, tsr_error *err) {
    tsr_model *m = s->m;
    const tsr_backend *be = m->be;
    if (!s->pipe && !(s->pipe = pipe_new(m, err))) return err->code;
    tsr_pipe *p = s->pipe;
    if (p->n == PIPE_SLOTS)
        return tsr_error_set(err, TSR_ERR_INVALID, "%d pipelined passes queued already", PIPE_SLOTS);
    if (!token && p->n == 0)
        return tsr_error_set(err, TSR_ERR_INVALID, "a pipelined pass needs a token or a pass queued before it");
    if (token && (*token < 0 || *token >= m->cfg.vocab))
        return tsr_error_set(err, TSR_ERR_INVALID, "token id %d is outside the vocabulary (%d)", *token,
                             m->cfg.vocab);
    if (s->n + 1 > s->max_tokens)
        return tsr_error_set(err, TSR_ERR_RANGE, "%d + 1 tokens exceed the sequence's %d", s->n, s->max_tokens);
    const int slot = (p->first + p->n) % PIPE_SLOTS;
    pipe_slot *hs = &p->host[slot];
    hs->step.pos0 = s->n;
    hs->step.rows = 1;
    int rc = TSR_OK;
    if (token) { /* the queue starts from a token the host knows */
        hs->id_in = *token;
        rc = be->upload_async(p->dev_id, &hs->id_in, sizeof hs->id_in, err);
    }
    pipe_pass a = {p, slot, s->kv_seq, s->n, draw ? TSR_FWD_DEVICE_LAST : TSR_FWD_ARGMAX_LAST};
    int done = 0;
    if (rc == TSR_OK) rc = tsr_graph_queue(m, s->kv_seq, s->n, 1, a.out, 1 + slot, pipe_body, &a, &done, err);
    if (rc == TSR_OK && !done) rc = pipe_body(m, &m->ex, &a, err);
    if (rc == TSR_OK && draw) { /* drawn after the pass, its input id joining the history first */
        const int32_t *at = NULL;
        rc = tsr_dev_sampler_queue(draw->dev, m->logits_dev, token ? draw->history : NULL, draw->n_history,
                                   draw->n_prompt, p->dev_id, &at, err);
        if (rc == TSR_OK) rc = hand_on(be, p, slot, at, err);
    }
    if (rc == TSR_OK && p->mark[slot]) rc = be->mark_record(p->mark[slot], err);
    if (rc != TSR_OK) {
        /* part of the pass may be queued, reading the slot: wait for all of it */
        tsr_error ignored;
        be->sync(&ignored);
        tsr_kv_truncate(m->kv, s->kv_seq, s->n); /* what the failed pass appended */
        return rc;
    }
    s->tokens[s->n] = token ? *token : -1; /* known when the pass before it is read */
    p->pos[slot] = s->n++;
    p->n++;
    return TSR_OK;
}

int tsr_seq_pipe_pop(tsr_seq *s, int32_t *choice, tsr_error *err) {
    tsr_pipe *p = s->pipe;
    if (!p || p->n == 0) return tsr_error_set(err, TSR_ERR_INVALID, "no pipelined pass is queued");
    const int slot = p->first;
    int rc = p->mark[slot] ? s->m->be->mark_wait(p->mark[slot], err) : TSR_OK;
    if (rc != TSR_OK) return rc;
    const int32_t id = p->host[slot].id_out;
    p->first = (slot + 1) % PIPE_SLOTS;
    p->n--;
    if (id == -1) return tsr_error_set(err, TSR_ERR_INVALID, "no token can be chosen: every logit is NaN or -inf");
    if (id < 0 || id >= s->m->cfg.vocab)
        return tsr_error_set(err, TSR_ERR_DEVICE, "the device's argmax is %d, outside the vocabulary (%d)", id,
                             s->m->cfg.vocab);
    if (p->pos[slot] + 1 < s->n) s->tokens[p->pos[slot] + 1] = id; /* the next queued pass's input */
    *choice = id;
    return TSR_OK;
}

/* Wait for every queued pass of p: for the newest one's mark (stream order
 * finishes the others first); nothing where the backend has no marks. */
static int wait_queued(const tsr_backend *be, const tsr_pipe *p, tsr_error *err) {
    if (p->n == 0) return TSR_OK;
    const int newest = (p->first + p->n - 1) % PIPE_SLOTS;
    return p->mark[newest] ? be->mark_wait(p->mark[newest], err) : TSR_OK;
}

int tsr_seq_pipe_drop(tsr_seq *s, tsr_error *err) {
    tsr_pipe *p = s->pipe;
    if (!p || p->n == 0) return TSR_OK;
    int rc = wait_queued(s->m->be, p, err);
    const int n = s->n - p->n;
    p->first = (p->first + p->n) % PIPE_SLOTS;
    p->n = 0;
    if (rc != TSR_OK) { /* the device failed: the host's count of tokens still goes back */
        s->n = n;
        return rc;
    }
    return tsr_seq_truncate(s, n, err);
}

void tsr_seq_pipe_free(tsr_seq *s) {
    tsr_pipe *p = s->pipe;
    if (!p) return;
    tsr_error err;
    tsr_error_clear(&err);
    /* nothing queued may still write what the next owner rewrites */
    if (wait_queued(s->m->be, p, &err) != TSR_OK) {
        pipe_free(s->m->be, p); /* the device failed: not worth keeping */
    } else {
        p->first = p->n = 0;
        p->next = s->m->pipes;
        s->m->pipes = p;
    }
    s->pipe = NULL;
}

void tsr_pipes_free(tsr_model *m) {
    while (m->pipes) {
        tsr_pipe *p = m->pipes;
        m->pipes = p->next;
        pipe_free(m->be, p);
    }
}
