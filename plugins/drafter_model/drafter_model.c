/*
 * drafter_model - drafters that run a model: a smaller draft checkpoint that
 * shares the target's tokenizer (drafter_draft_model), or the target's own
 * first layers followed by its output head (drafter_self_spec). The host
 * runs the model (tsr_host_api version 2); this plugin keeps one sequence
 * of it per runtime sequence, re-synchronised with the context at each
 * proposal (the common prefix is kept, the rest is truncated and re-run),
 * and drafts greedily, so every proposal is deterministic.
 *
 * Built twice from this file: DRAFTER_SELF_SPEC selects the self-speculative
 * variant.
 */
#include <string.h>

#include "kernels/cpu/ops.h"
#include "slots/tsr_drafter.h"

#ifdef DRAFTER_SELF_SPEC
#define DRAFTER_NAME "drafter_self_spec"
#else
#define DRAFTER_NAME "drafter_draft_model"
#endif

typedef struct dm_seq {
    int id;                 /* the runtime's sequence id; -1 when free */
    tsr_aux_seq *s;
    int32_t *fed;           /* tokens the draft sequence holds */
    int n_fed;
    int cap;
} dm_seq;

typedef struct drafter_model {
    const tsr_plugin_ctx *ctx;
    const char *path;       /* draft checkpoint (NULL: the engine's own model) */
    const char *assembly;
    int layers;
    int max_draft;
    tsr_aux_model *model;
    int vocab, max_ctx;
    float *logits;
    dm_seq *seqs;
    int n_seqs;
} drafter_model;

static int dm_init(void *inst, const tsr_plugin_ctx *ctx) {
    drafter_model *d = inst;
    const tsr_host_api *h = ctx->host;
    d->ctx = ctx;
    if (h->struct_size < offsetof(tsr_host_api, seq_truncate) + sizeof(void *) || h->version < 2) {
        h->set_error(ctx, "the host lends no models to plugins (host API version %u < 2)", h->version);
        return TSR_ERR_UNSUPPORTED;
    }
    const tsr_param *p = h->param(ctx, "max_draft");
    d->max_draft = p ? (int)p->v.i : 4;
#ifdef DRAFTER_SELF_SPEC
    p = h->param(ctx, "layers");
    d->layers = p ? (int)p->v.i : 0;
    if (d->layers == 0) d->layers = (ctx->model->n_layers + 3) / 4;
    if (d->layers < 1 || d->layers >= ctx->model->n_layers) {
        h->set_error(ctx, "layers %d: the model has %d layers, a draft needs fewer", d->layers,
                     ctx->model->n_layers);
        return TSR_ERR_INVALID;
    }
#else
    p = h->param(ctx, "model");
    d->path = p && p->v.s[0] ? p->v.s : NULL;
    p = h->param(ctx, "assembly");
    d->assembly = p && p->v.s[0] ? p->v.s : NULL;
    if (!d->path) { /* nothing to draft with: this configuration cannot run */
        h->set_error(ctx, "param model (the draft checkpoint) is required");
        return TSR_ERR_UNSUPPORTED;
    }
#endif
    return TSR_OK;
}

static void seq_drop(drafter_model *d, dm_seq *s) {
    d->ctx->host->seq_close(d->ctx, s->s);
    d->ctx->host->free(d->ctx, s->fed);
    memset(s, 0, sizeof *s);
    s->id = -1;
}

static void dm_fini(void *inst) {
    drafter_model *d = inst;
    if (!d->ctx) return;
    for (int i = 0; i < d->n_seqs; i++)
        if (d->seqs[i].id >= 0) seq_drop(d, &d->seqs[i]);
    d->ctx->host->free(d->ctx, d->seqs);
    d->ctx->host->free(d->ctx, d->logits);
    d->ctx->host->model_close(d->ctx, d->model);
}

/* The model, opened on first use (never during init). */
static int ensure_model(drafter_model *d) {
    if (d->model) return TSR_OK;
    const tsr_host_api *h = d->ctx->host;
    int rc = h->model_open(d->ctx, d->path, d->assembly, d->layers, &d->model);
    if (rc != TSR_OK) return rc;
    if ((rc = h->model_dims(d->ctx, d->model, &d->vocab, &d->max_ctx)) != TSR_OK) return rc;
    d->logits = h->alloc(d->ctx, (size_t)d->vocab * sizeof(float), 64);
    return d->logits ? TSR_OK : TSR_ERR_NOMEM;
}

static dm_seq *seq_for(drafter_model *d, int id) {
    dm_seq *free_slot = NULL;
    for (int i = 0; i < d->n_seqs; i++) {
        if (d->seqs[i].id == id) return &d->seqs[i];
        if (d->seqs[i].id < 0 && !free_slot) free_slot = &d->seqs[i];
    }
    if (!free_slot) {
        int n = d->n_seqs ? d->n_seqs * 2 : 4;
        dm_seq *g = d->ctx->host->alloc(d->ctx, (size_t)n * sizeof *g, 16);
        if (!g) return NULL;
        if (d->n_seqs) memcpy(g, d->seqs, (size_t)d->n_seqs * sizeof *g);
        for (int i = d->n_seqs; i < n; i++) g[i].id = -1;
        d->ctx->host->free(d->ctx, d->seqs);
        free_slot = &g[d->n_seqs];
        d->seqs = g;
        d->n_seqs = n;
    }
    const tsr_host_api *h = d->ctx->host;
    free_slot->cap = d->max_ctx;
    free_slot->fed = h->alloc(d->ctx, (size_t)free_slot->cap * sizeof(int32_t), 16);
    if (!free_slot->fed || h->seq_open(d->ctx, d->model, d->max_ctx, &free_slot->s) != TSR_OK) {
        h->free(d->ctx, free_slot->fed);
        free_slot->fed = NULL;
        return NULL;
    }
    free_slot->id = id;
    free_slot->n_fed = 0;
    return free_slot;
}

/* Run tokens after what s holds, recording them. */
static int feed(drafter_model *d, dm_seq *s, const int32_t *tokens, int n) {
    int rc = d->ctx->host->seq_forward(d->ctx, s->s, tokens, n, d->logits);
    if (rc != TSR_OK) return rc;
    memcpy(s->fed + s->n_fed, tokens, (size_t)n * sizeof *tokens);
    s->n_fed += n;
    return TSR_OK;
}

static int dm_propose(void *inst, const tsr_draft_req *r, tsr_draft_out *out) {
    drafter_model *d = inst;
    out->n = 0;
    out->deterministic = 1;
    int rc = ensure_model(d);
    if (rc != TSR_OK) return rc;
    dm_seq *s = seq_for(d, r->seq);
    if (!s) return TSR_ERR_NOMEM;
    int k = r->max_draft < d->max_draft ? r->max_draft : d->max_draft;
    if (r->n_tokens + k > s->cap) k = s->cap - r->n_tokens;
    if (k <= 0 || r->n_tokens < 1) return TSR_OK;
    /* keep the common prefix, but always re-run at least the last token to get its logits */
    int common = 0;
    while (common < s->n_fed && common < r->n_tokens && s->fed[common] == r->tokens[common]) common++;
    if (common == r->n_tokens) common--;
    if (common < s->n_fed) {
        if ((rc = d->ctx->host->seq_truncate(d->ctx, s->s, common)) != TSR_OK) return rc;
        s->n_fed = common;
    }
    if ((rc = feed(d, s, r->tokens + common, r->n_tokens - common)) != TSR_OK) return rc;
    for (int i = 0; i < k; i++) {
        int32_t t = tsr_argmax(d->logits, d->vocab); /* NaN never chosen */
        out->tokens[out->n++] = t;
        if (i + 1 < k && (rc = feed(d, s, &t, 1)) != TSR_OK) return rc;
    }
    return TSR_OK;
}

static void dm_seq_end(void *inst, int seq) {
    drafter_model *d = inst;
    for (int i = 0; i < d->n_seqs; i++)
        if (d->seqs[i].id == seq) seq_drop(d, &d->seqs[i]);
}

static const tsr_drafter_i dm_iface = {
    .struct_size = sizeof(tsr_drafter_i),
    .version = TSR_DRAFTER_IFACE_VERSION,
    .propose = dm_propose,
    .accept = NULL,
    .seq_end = dm_seq_end,
};

static const tsr_plugin_desc dm_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = DRAFTER_NAME,
    .slot = TSR_SLOT_DRAFTER,
    .version = "1.0.0",
    .instance_size = sizeof(drafter_model),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,
    .init = dm_init,
    .fini = dm_fini,
    .iface = &dm_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &dm_desc; }
