/*
 * graph.c - decode passes replayed as CUDA graphs (runtime.cuda_graphs).
 *
 * A pass of a few rows issues some 15 launches per layer; on the H200 each
 * costs ~5 us to issue, more than the GPU needs for most of them. So the
 * first pass of a (sequence, rows, outputs) kind is captured into a graph:
 * the copy of the staged inputs (tsr_step and ids from pinned host memory),
 * every launch of the core and the plugins, and the copy of the outputs back.
 * Later passes of that kind write their inputs into the staging memory, let
 * the kv_cache plugin record the appends (replayed()), and launch the graph
 * once. Plugins read the position from the step on the device (tsr_exec.step).
 * Only passes that qualify are captured: a device backend with graphs, every
 * forward-pass plugin providing cuda_graph (the checker refused the assembly
 * otherwise), no mixture of experts (routing runs on the host), at most
 * TSR_GRAPH_MAX_ROWS rows, and not a sequence's first pass (its prefill).
 * Pipelined passes (pipe.c) are kinds of their own: their inputs and outputs
 * are the pipe's, not the staging memory.
 */
#include <string.h>

#include "model_internal.h"

void tsr_graphs_forget_seq(tsr_model *m, int kv_seq) {
    for (int i = 0; i < TSR_GRAPH_CACHE; i++) {
        tsr_graph *g = &m->graphs[i];
        if (g->exec && (kv_seq < 0 || g->kv_seq == kv_seq)) {
            m->be->graph_free(g->exec);
            memset(g, 0, sizeof *g);
        }
    }
}

void tsr_graphs_free(tsr_model *m) {
    if (m->be && m->be->graph_free) tsr_graphs_forget_seq(m, -1);
}

/* Decode and verification passes: a few rows after a prefill (a prompt's
 * first pass, pos0 0, happens once: capturing it would only cost time). */
static int qualifies(const tsr_model *m, int pos0, int rows) {
    return m->graphs_on && m->be->capture_begin && pos0 > 0 && rows <= TSR_GRAPH_MAX_ROWS &&
           (m->cfg.n_experts == 0 || m->ex_tables) && m->gemv->graph && m->attn->graph && m->kv->graph;
}

/* The cached graph of this kind, or a free (or least recently used) entry. */
static tsr_graph *lookup(tsr_model *m, int kv_seq, int rows, tsr_fwd_out out, int pipe, int *hit) {
    tsr_graph *victim = &m->graphs[0];
    for (int i = 0; i < TSR_GRAPH_CACHE; i++) {
        tsr_graph *g = &m->graphs[i];
        if (g->exec && g->kv_seq == kv_seq && g->rows == rows && g->out == (int)out && g->pipe == pipe) {
            *hit = 1;
            return g;
        }
        if (!g->exec ? victim->exec != NULL : victim->exec && g->last_use < victim->last_use) victim = g;
    }
    *hit = 0;
    /* (a graph still running, a pipelined pass's, is freed when it completes) */
    if (victim->exec) m->be->graph_free(victim->exec);
    memset(victim, 0, sizeof *victim);
    return victim;
}

int tsr_graph_queue(tsr_model *m, int kv_seq, int pos0, int rows, tsr_fwd_out out, int pipe, tsr_graph_body body,
                    void *ctx, int *done, tsr_error *err) {
    const tsr_backend *be = m->be;
    *done = 0;
    if (!qualifies(m, pos0, rows)) return TSR_OK;
    *done = 1;
    int hit, rc;
    tsr_graph *g = lookup(m, kv_seq, rows, out, pipe, &hit);
    if (hit) {
        rc = tsr_kv_replayed(m->kv, kv_seq, m->cfg.n_layers, pos0, rows);
        if (rc != TSR_OK) return tsr_model_slot_error(m, m->kv, rc, err, "kv replayed");
        m->graph_replays++;
    } else {
        tsr_exec ex = m->ex;
        ex.step = (const tsr_step *)m->io;
        if ((rc = be->capture_begin(err))) return rc;
        rc = body(m, &ex, ctx, err);
        tsr_error end_err;
        tsr_error_clear(&end_err);
        int end_rc = be->capture_end(&g->exec, &end_err);
        if (rc != TSR_OK) return rc; /* the pass's own error says more than the capture's */
        if (end_rc != TSR_OK) {
            *err = end_err;
            return end_rc;
        }
        g->kv_seq = kv_seq;
        g->rows = rows;
        g->out = out;
        g->pipe = pipe;
        m->graph_captures++;
    }
    g->last_use = ++m->graph_tick;
    return be->graph_launch(g->exec, err);
}

typedef struct plain_pass {
    int kv_seq, pos0, rows;
    tsr_fwd_out out;
} plain_pass;

/* A pass as tsr_forward_chunk asks for it: inputs from the staging memory
 * (tsr_step and ids), outputs into out_host. */
static int plain_body(tsr_model *m, const tsr_exec *ex, void *ctx, tsr_error *err) {
    const plain_pass *p = ctx;
    const tsr_backend *be = m->be;
    const size_t in_bytes = sizeof(tsr_step) + (size_t)p->rows * sizeof(int32_t);
    const size_t out_bytes = tsr_fwd_out_bytes(m, p->out, p->rows);
    m->head_out = m->logits_dev;
    int rc = be->upload_async(m->io, m->io_host, in_bytes, err);
    if (rc == TSR_OK) rc = tsr_forward_pass(m, ex, p->kv_seq, p->pos0, p->rows, p->out, err);
    if (rc == TSR_OK && out_bytes) rc = be->download_async(m->out_host, tsr_fwd_out_src(m, p->out), out_bytes, err);
    return rc;
}

int tsr_graph_forward(tsr_model *m, int kv_seq, int pos0, const int32_t *tokens, int rows, tsr_fwd_out out,
                      void *dst, int *done, tsr_error *err) {
    *done = 0;
    if (!qualifies(m, pos0, rows)) return TSR_OK;
    /* inputs into the staging memory the graph's first copy reads */
    tsr_step *st = m->io_host;
    st->pos0 = pos0;
    st->rows = rows;
    memcpy((char *)m->io_host + sizeof(tsr_step), tokens, (size_t)rows * sizeof *tokens);
    plain_pass p = {kv_seq, pos0, rows, out};
    int rc = tsr_graph_queue(m, kv_seq, pos0, rows, out, 0, plain_body, &p, done, err);
    /* logits left on the device: the sampler's launches follow in stream order */
    if (rc != TSR_OK || out == TSR_FWD_DEVICE_LAST) return rc;
    if ((rc = m->be->sync(err)) != TSR_OK) return rc;
    const size_t out_bytes = tsr_fwd_out_bytes(m, out, rows);
    if (out_bytes) memcpy(dst, m->out_host, out_bytes);
    return TSR_OK;
}
