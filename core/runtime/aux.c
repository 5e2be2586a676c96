/*
 * aux.c - models the runtime lends to plugins (tsr_host_api version 2):
 * another checkpoint assembled from plugins (a draft model), or a cut of
 * the engine's own model to its first layers (self-speculation), which
 * shares every weight and costs only its scratch; and (version 3) the
 * pages of the model file a plugin has its own copy of, given back.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

/* The handles are the runtime's own objects behind opaque names. */
#define AUX_MODEL(p) ((tsr_model *)(p))
#define AUX_SEQ(p) ((tsr_seq *)(p))

static int report(const tsr_plugin_ctx *ctx, const tsr_error *err) {
    ctx->host->set_error(ctx, "%s%s%s", err->file[0] ? err->file : "", err->file[0] ? ": " : "",
                         err->msg);
    return err->code;
}

static int view_open(tsr_model *parent, int n_layers, tsr_model **out, tsr_error *err) {
    tsr_model *v = malloc(sizeof *v);
    if (!v) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    *v = *parent; /* shares file, engine, weights, tokenizer */
    v->is_view = 1;
    v->cfg.n_layers = n_layers;
    v->x = v->xn = v->q = v->k = v->v = v->att = v->o = v->g = v->u = NULL;
    v->router = v->moe_out = v->ex_in = v->ex_g = v->ex_u = v->ex_d = v->sh_gate_out = NULL;
    v->gx_in = v->gx_g = v->gx_d = NULL;
    v->route_w = v->ex_wts = v->route_w_h = v->ex_wts_h = NULL;
    v->route_idx = v->ex_rows = v->route_idx_h = v->ex_rows_h = v->ex_pos = v->ex_pos_h = v->ids = NULL;
    v->logits_dev = NULL;
    v->qkv = v->gu = NULL;
    v->io = v->io_host = v->out_host = NULL;
    v->argmax_dev = NULL;
    v->embed_rows = NULL;
    v->embed_iota = NULL;
    memset(v->graphs, 0, sizeof v->graphs); /* its own graphs: they hold its own scratch */
    v->graph_tick = v->graph_captures = v->graph_replays = 0;
    v->pipes = NULL; /* its own pool of pipes */
    v->pipeline_on = 0; /* a drafter's view decodes step by step */
    int rc = tsr_model_alloc_scratch(v, err);
    if (rc != TSR_OK) {
        tsr_model_free(v);
        return rc;
    }
    *out = v;
    return TSR_OK;
}

static int aux_model_open(void *data, const tsr_plugin_ctx *ctx, const char *path,
                          const char *assembly, int n_layers, tsr_aux_model **out) {
    tsr_model *parent = data, *m = NULL;
    tsr_error err;
    tsr_error_clear(&err);
    int rc;
    if (!path) {
        if (n_layers < 0 || n_layers > parent->cfg.n_layers) {
            tsr_error_set(&err, TSR_ERR_INVALID, "the model has %d layers, asked for %d",
                          parent->cfg.n_layers, n_layers);
            return report(ctx, &err);
        }
        rc = view_open(parent, n_layers ? n_layers : parent->cfg.n_layers, &m, &err);
    } else {
        tsr_model_opts o = {.model_path = path, .assembly_path = assembly && assembly[0] ? assembly : NULL,
                            .catalog_dir = parent->catalog_dir, .n_threads = parent->n_threads,
                            .no_tokenizer = 1};
        rc = tsr_model_load(&o, &m, &err);
        if (rc == TSR_OK && m->cfg.vocab != parent->cfg.vocab) {
            tsr_error_set(&err, TSR_ERR_INVALID,
                          "%s has a vocabulary of %d tokens, the engine's model %d: they must share "
                          "one tokenizer",
                          path, m->cfg.vocab, parent->cfg.vocab);
            tsr_model_free(m);
            return report(ctx, &err);
        }
    }
    if (rc != TSR_OK) return report(ctx, &err);
    *out = (tsr_aux_model *)m;
    return TSR_OK;
}

static void aux_model_close(void *data, tsr_aux_model *m) {
    (void)data;
    tsr_model_free(AUX_MODEL(m));
}

static int aux_model_dims(void *data, const tsr_aux_model *am, int *vocab, int *max_ctx) {
    (void)data;
    const tsr_model *m = (const tsr_model *)am;
    *vocab = m->cfg.vocab;
    *max_ctx = m->ctx;
    return TSR_OK;
}

static int aux_seq_open(void *data, const tsr_plugin_ctx *ctx, tsr_aux_model *m, int max_tokens,
                        tsr_aux_seq **out) {
    (void)data;
    tsr_error err;
    tsr_error_clear(&err);
    tsr_seq *s;
    if (tsr_seq_new(AUX_MODEL(m), max_tokens, &s, &err) != TSR_OK) return report(ctx, &err);
    *out = (tsr_aux_seq *)s;
    return TSR_OK;
}

static void aux_seq_close(void *data, tsr_aux_seq *s) {
    (void)data;
    tsr_seq_free(AUX_SEQ(s));
}

static int aux_seq_forward(void *data, const tsr_plugin_ctx *ctx, tsr_aux_seq *s,
                           const int32_t *tokens, int n, float *logits) {
    (void)data;
    tsr_error err;
    tsr_error_clear(&err);
    if (tsr_seq_forward(AUX_SEQ(s), tokens, n, logits, 0, &err) != TSR_OK) return report(ctx, &err);
    return TSR_OK;
}

static int aux_seq_truncate(void *data, const tsr_plugin_ctx *ctx, tsr_aux_seq *s, int n_tokens) {
    (void)data;
    tsr_error err;
    tsr_error_clear(&err);
    if (tsr_seq_truncate(AUX_SEQ(s), n_tokens, &err) != TSR_OK) return report(ctx, &err);
    return TSR_OK;
}

/* Pages of the model file a plugin has its own copy of. With the embedding
 * table tied to the output head they are given back too: the lookup reads
 * one row per token and faults back only the pages of the rows it reads. */
static uint64_t aux_weight_done(void *data, const void *p, uint64_t n) {
    tsr_model *m = data;
    atomic_fetch_add(&m->weight_dones, 1);
    return m->file ? tsr_model_file_give_back(m->file, p, n) : 0;
}

void tsr_model_lend_models(tsr_model *m) {
    m->aux = (tsr_aux_api){
        .data = m,
        .model_open = aux_model_open,
        .model_close = aux_model_close,
        .model_dims = aux_model_dims,
        .seq_open = aux_seq_open,
        .seq_close = aux_seq_close,
        .seq_forward = aux_seq_forward,
        .seq_truncate = aux_seq_truncate,
        .weight_done = aux_weight_done,
    };
    tsr_engine_set_aux(m->engine, &m->aux);
}
