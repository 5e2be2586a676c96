/*
 * forward.c - the decoder forward pass over a chunk of rows. The core does
 * embedding, norms, RoPE, activations and routing (through its backend:
 * backend.h); every
 * projection goes to the gemv slot, keys and values to the kv_cache slot,
 * attention to the attention slot, expert weights come from the
 * expert_cache slot.
 */
#include <math.h>
#include <string.h>

#include "../../kernels/dtype.h"
#include "model_internal.h"
#include "../util/clock.h"

#define CALL(slot, expr, what)                                                                 \
    do {                                                                                       \
        int rc_ = (expr);                                                                      \
        if (rc_ != TSR_OK) return tsr_model_slot_error(m, (slot), rc_, err, (what));          \
    } while (0)

#define BE(expr)                                                                               \
    do {                                                                                       \
        int rc_ = (expr);                                                                      \
        if (rc_ != TSR_OK) return rc_;                                                         \
    } while (0)

static int add_bias(tsr_model *m, float *y, const float *b, int rows, int n, tsr_error *err) {
    return b ? m->be->add_rows(y, b, rows, n, err) : TSR_OK;
}

/* The exec of the pass in flight (m->ex, or a copy with the step while
 * capturing a graph). */
#define EX (m->cur_ex)

/* With profiling on (tsr_model_opts.profile): wait for the backend after
 * an op begun at t0 and add its time to its kind (prefill or decode pass). */
static int prof_add(tsr_model *m, int kind, double t0, tsr_error *err) {
    if (!m->prof) return TSR_OK;
    BE(m->be->sync(err));
    tsr_prof *p = &m->prof[m->prof_phase];
    p->seconds[kind] += tsr_now_seconds() - t0;
    p->calls[kind]++;
    return TSR_OK;
}

#define OP(kind, stmt)                                                                         \
    do {                                                                                       \
        double t0_ = m->prof ? tsr_now_seconds() : 0;                                          \
        stmt;                                                                                  \
        BE(prof_add(m, (kind), t0_, err));                                                     \
    } while (0)

const char *const tsr_prof_names[TSR_PROF_KINDS] = {
    "embedding", "norms", "q/k/v", "rope", "kv append", "attention", "o proj",
    "gate/up",   "silu",  "down",  "adds", "lm head",   "argmax",
};

/* y[rows, w.rows] = x . W^T through the gemv slot. */
static int gemv(tsr_model *m, const void *w, int rows, const float *x, float *y, tsr_error *err) {
    CALL(m->gemv, tsr_gemv_run(m->gemv, w, rows, x, y, EX), "gemv");
    return TSR_OK;
}

/* The gemv plugin's run_fused (the norm before a product, the residual add
 * after it, in the product's own launch): *done = 1 where it took the call
 * (profiled as kind), 0 (nothing done) where it answered that it does not
 * fuse it. */
static int fused(tsr_model *m, int kind, const void *w, int rows, const float *x, float *y, const tsr_gemv_fuse *fu,
                 int *done, tsr_error *err) {
    const double t0 = m->prof ? tsr_now_seconds() : 0;
    int rc = tsr_gemv_run_fused(m->gemv, w, rows, x, y, fu, EX);
    *done = rc == TSR_OK;
    if (rc == TSR_OK) return prof_add(m, kind, t0, err);
    return rc == TSR_ERR_UNSUPPORTED ? TSR_OK : tsr_model_slot_error(m, m->gemv, rc, err, "gemv fused");
}

/* The product of the stream normed by nw, through the gemv plugin's fold
 * (tsr_gemv_fuse.folded) where the call before left m->xn as the stream
 * times nw (m->fold == nw); *done as fused's. The fold is spent either way. */
static int from_fold(tsr_model *m, int kind, const void *w, int rows, float *y, const float *nw, int glu,
                     int *done, tsr_error *err) {
    *done = 0;
    if (m->fold != nw) return TSR_OK;
    m->fold = NULL;
    return fused(m, kind, w, rows, m->xn, y, &(tsr_gemv_fuse){.norm = nw, .eps = m->cfg.norm_eps, .glu = glu,
                                                               .folded = 1},
                 done, err);
}

/* The residual stream x normed by nw into m->xn, for a layer's projections
 * that the plugin did not take the norm into; *pending: m->o is still to
 * be added into x (the add and the norm in one launch), 0 after. */
static int input_norm(tsr_model *m, const float *nw, int rows, int *pending, tsr_error *err) {
    const tsr_model_config *c = &m->cfg;
    if (*pending) OP(TSR_PROF_NORM, BE(m->be->add_rmsnorm(m->x, m->o, m->xn, nw, rows, c->hidden, c->norm_eps, err)));
    else OP(TSR_PROF_NORM, BE(m->be->rmsnorm(m->xn, m->x, nw, rows, c->hidden, c->norm_eps, err)));
    *pending = 0;
    return TSR_OK;
}

/* x += in . W^T, a projection into the residual stream (o, down): in the
 * product's launch where the plugin takes the add (*pending = 0), else
 * into m->o with its bias b, the add left to the next norm (*pending = 1).
 * next: the weights of the norm before the next product (NULL: none that
 * folds), folded into this call where the plugin folds (m->fold). */
static int into_stream(tsr_model *m, int kind, const void *w, const float *b, int rows, const float *in,
                       const float *next, int *pending, tsr_error *err) {
    int added = 0, rc;
    m->fold = NULL;
    if (!b && next && tsr_gemv_folds(m->gemv)) {
        BE(fused(m, kind, w, rows, in, m->x, &(tsr_gemv_fuse){.accumulate = 1, .fold_norm = next, .fold_out = m->xn},
                 &added, err));
        if (added) m->fold = next;
    }
    if (!b && !added) BE(fused(m, kind, w, rows, in, m->x, &(tsr_gemv_fuse){.accumulate = 1}, &added, err));
    if (!added) OP(kind, if ((rc = gemv(m, w, rows, in, m->o, err))) return rc;
                   BE(add_bias(m, m->o, b, rows, m->cfg.hidden, err)));
    *pending = !added;
    return TSR_OK;
}

/* down(silu(gate(x)) * up(x)) for rows rows of x into y. */
static int ffn(tsr_model *m, const void *wg, const void *wu, const void *wd, int rows, int f,
               const float *x, float *g, float *u, float *y, tsr_error *err) {
    int rc;
    OP(TSR_PROF_GATE_UP, if ((rc = gemv(m, wg, rows, x, g, err))) return rc;
       if ((rc = gemv(m, wu, rows, x, u, err))) return rc);
    OP(TSR_PROF_SILU, BE(m->be->silu_mul(g, g, u, (int64_t)rows * f, err)));
    OP(TSR_PROF_DOWN, if ((rc = gemv(m, wd, rows, g, y, err))) return rc);
    return TSR_OK;
}

/* The stacked gate/up projection of x into g: silu(gate) * up at once
 * where the plugin fuses them (run_glu: the same values; *fused = 1), else
 * the two products side by side into m->gu (*fused = 0). */
static int gate_up(tsr_model *m, const void *wgu, int rows, const float *x, float *g, int *fused,
                   tsr_error *err) {
    int rc = tsr_gemv_run_glu(m->gemv, wgu, rows, x, g, EX);
    *fused = rc == TSR_OK;
    if (rc == TSR_ERR_UNSUPPORTED) return gemv(m, wgu, rows, x, m->gu, err);
    return rc == TSR_OK ? TSR_OK : tsr_model_slot_error(m, m->gemv, rc, err, "gemv glu");
}

/* silu(gate) * up of x into g through gate and up stacked into one
 * matrix (prepare_group). */
static int glu_stacked(tsr_model *m, const void *wgu, int rows, int f, const float *x, float *g, tsr_error *err) {
    int rc, fused;
    OP(TSR_PROF_GATE_UP, if ((rc = gate_up(m, wgu, rows, x, g, &fused, err))) return rc);
    if (!fused) OP(TSR_PROF_SILU, BE(m->be->silu_mul_cat(g, m->gu, rows, f, err)));
    return TSR_OK;
}

/* ffn with gate and up stacked. */
static int ffn_stacked(tsr_model *m, const void *wgu, const void *wd, int rows, int f, const float *x,
                       float *g, float *y, tsr_error *err) {
    int rc;
    BE(glu_stacked(m, wgu, rows, f, x, g, err));
    OP(TSR_PROF_DOWN, if ((rc = gemv(m, wd, rows, g, y, err))) return rc);
    return TSR_OK;
}

/* A dense layer's MLP (gate and up stacked), its input the residual stream
 * normed by L->ffn_norm, its output added into the stream (*pending: as
 * into_stream). The norm goes into the gate/up product where the plugin
 * takes it (run_fused). */
static int layer_mlp(tsr_model *m, const tsr_layer_w *L, int rows, const float *next, int *pending,
                     tsr_error *err) {
    const tsr_model_config *c = &m->cfg;
    int done = 0;
    BE(from_fold(m, TSR_PROF_GATE_UP, L->w_gu, rows, m->g, L->ffn_norm, 1, &done, err));
    if (!done && !*pending)
        BE(fused(m, TSR_PROF_GATE_UP, L->w_gu, rows, m->x, m->g,
                 &(tsr_gemv_fuse){.norm = L->ffn_norm, .eps = c->norm_eps, .glu = 1}, &done, err));
    if (!done) {
        BE(input_norm(m, L->ffn_norm, rows, pending, err));
        BE(glu_stacked(m, L->w_gu, rows, c->ffn, m->xn, m->g, err));
    }
    return into_stream(m, TSR_PROF_DOWN, L->w_down, NULL, rows, m->g, next, pending, err);
}

enum { MAX_EXPERTS = 1024, MAX_USED = 64 };

/* What the gemv plugin answered to a call over a layer's experts
 * (run_grouped, run_experts; how: "grouped" or "chosen"): TSR_ERR_UNSUPPORTED
 * for the gate/up (down 0), where the host goes round it; for the down, the
 * gate/up already run, a refusal it cannot go round. */
static int experts_called(tsr_model *m, int rc, int down, const char *how, tsr_error *err) {
    if (rc == TSR_OK || (rc == TSR_ERR_UNSUPPORTED && !down)) return rc;
    if (rc == TSR_ERR_UNSUPPORTED)
        return tsr_error_set(err, TSR_ERR_INVALID, "plugin %s took the %s experts' gate/up but not their down",
                             m->gemv->plugin, how);
    return tsr_model_slot_error(m, m->gemv, rc, err, down ? "gemv experts' down" : "gemv experts' gate/up");
}

/* The rows of every expert of a prompt at once (m->gx_*, where the gemv
 * plugin groups them: run_grouped over the layer's tables): one gather of
 * the rows sorted by expert, the gate/up pairs with their SiLU and the downs
 * in one call each, then each row's experts' weighted downs summed in
 * increasing expert id as moe_on_host sums them (one combine_experts over
 * the rows, each choice's down at its sorted place m->ex_pos; one
 * scatter_axpy an expert where the backend has no combine) into moe_out.
 * start: the rows of expert e at [start[e], start[e + 1]) of m->ex_rows /
 * m->ex_wts (uploaded). TSR_ERR_UNSUPPORTED, with nothing but the gather
 * done, where the plugin does not take them. */
static int moe_grouped(tsr_model *m, int layer, int rows, const int *start, tsr_error *err) {
    const tsr_model_config *c = &m->cfg;
    const tsr_backend *be = m->be;
    const int E = c->n_experts, K = c->n_experts_used, h = c->hidden, f = c->expert_ffn;
    void *const *t = m->ex_tables + 2 * layer;
    int rc;
    BE(be->gather_rows(m->gx_in, m->xn, m->ex_rows, start[E], h, err));
    OP(TSR_PROF_GATE_UP, rc = tsr_gemv_run_grouped(m->gemv, t[0], start, E, 1, m->gx_in, h, m->gx_g, EX));
    if ((rc = experts_called(m, rc, 0, "grouped", err))) return rc;
    OP(TSR_PROF_DOWN, rc = tsr_gemv_run_grouped(m->gemv, t[1], start, E, 0, m->gx_g, f, m->gx_d, EX));
    if ((rc = experts_called(m, rc, 1, "grouped", err))) return rc;
    if (be->combine_experts)
        return be->combine_experts(m->moe_out, m->gx_d, m->route_idx, m->route_w, rows, K, h, 0, m->ex_pos, err);
    BE(be->zero(m->moe_out, (int64_t)rows * h, err));
    for (int e = 0; e < E; e++) {
        const int off = start[e], cnt = start[e + 1] - off;
        if (cnt > 0)
            BE(be->scatter_axpy(m->moe_out, m->gx_d + (int64_t)off * h, m->ex_rows + off, m->ex_wts + off, cnt, h,
                                err));
    }
    return TSR_OK;
}

/* The experts of the routing in m->route_idx / route_w looked up by the
 * host: it reads each row's experts back (a wait on a device: the
 * expert_cache slot decides on the host what is resident), sorts the rows
 * by expert and looks the experts up in groups of at most n_experts_used,
 * in increasing id; each expert's rows are gathered, run through its FFN
 * and added into moe_out weighted, on the backend (or, where the gemv
 * plugin groups them, all at once: moe_grouped). */
static int moe_on_host(tsr_model *m, int layer, int rows, tsr_error *err) {
    const tsr_model_config *c = &m->cfg;
    const tsr_backend *be = m->be;
    const int E = c->n_experts, K = c->n_experts_used, h = c->hidden, f = c->expert_ffn;
    const int nk = rows * K;
    int rc;
    BE(be->download(m->route_idx_h, m->route_idx, (size_t)nk * sizeof(int32_t), err));
    BE(be->download(m->route_w_h, m->route_w, (size_t)nk * sizeof(float), err));
    /* the rows of each expert in turn (row order within one) */
    int start[MAX_EXPERTS + 1] = {0};
    for (int i = 0; i < nk; i++)
        if (m->route_idx_h[i] >= 0) start[m->route_idx_h[i] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    int fill[MAX_EXPERTS];
    memcpy(fill, start, (size_t)E * sizeof(int));
    const int grouped = m->gx_in && m->ex_tables; /* the plugin may take the rows at once (moe_grouped) */
    for (int i = 0; i < nk; i++) {
        const int e = m->route_idx_h[i];
        if (grouped) m->ex_pos_h[i] = e < 0 ? 0 : fill[e]; /* its place in that order (no expert: never read) */
        if (e < 0) continue;
        m->ex_rows_h[fill[e]] = i / K;
        m->ex_wts_h[fill[e]++] = m->route_w_h[i];
    }
    BE(be->upload(m->ex_rows, m->ex_rows_h, (size_t)start[E] * sizeof(int32_t), err));
    BE(be->upload(m->ex_wts, m->ex_wts_h, (size_t)start[E] * sizeof(float), err));
    if (grouped) {
        BE(be->upload(m->ex_pos, m->ex_pos_h, (size_t)nk * sizeof(int32_t), err));
        if ((rc = moe_grouped(m, layer, rows, start, err)) != TSR_ERR_UNSUPPORTED) return rc;
    }
    BE(be->zero(m->moe_out, (int64_t)rows * h, err));
    int32_t group[MAX_USED];
    /* a lookup may release the experts of the one before, still read by
     * queued work on a device, unless the cache keeps every expert for its
     * life (m->ex_resident) */
    const int may_release = !m->ex_resident;
    for (int e = 0, looked_up = 0; e < E;) {
        int n = 0;
        for (; e < E && n < K; e++)
            if (start[e + 1] > start[e]) group[n++] = e;
        if (n == 0) break;
        if (looked_up++ && may_release) BE(be->sync(err));
        const tsr_expert_weights *ew[MAX_USED];
        CALL(m->experts, tsr_expert_lookup(m->experts, layer, n, group, ew), "expert lookup");
        for (int gi = 0; gi < n; gi++) {
            const int off = start[group[gi]], cnt = start[group[gi] + 1] - off;
            const float *in = m->xn; /* every row (in order): as they are */
            if (cnt < rows) {
                BE(be->gather_rows(m->ex_in, m->xn, m->ex_rows + off, cnt, h, err));
                in = m->ex_in;
            }
            const tsr_expert_weights *w = ew[gi];
            rc = w->up ? ffn(m, w->gate, w->up, w->down, cnt, f, in, m->ex_g, m->ex_u, m->ex_d, err)
                       : ffn_stacked(m, w->gate, w->down, cnt, f, in, m->ex_g, m->ex_d, err);
            if (rc) return rc;
            BE(be->scatter_axpy(m->moe_out, m->ex_d, m->ex_rows + off, m->ex_wts + off, cnt, h, err));
        }
    }
    return TSR_OK;
}

/* The experts of a pass of few rows chosen on the device (the gemv
 * plugin's run_experts over expert_resident's tables, model.c): each row's
 * K gate/up pairs with their SiLU into ex_g [rows K, f], their downs into
 * ex_d [rows K, h], summed in increasing expert id as the host path sums
 * them, into moe_out, or (into_x: no shared expert to add) straight into
 * m->x as the add of moe_out would: one launch less. Nothing crosses to
 * the host, so such passes are captured in graphs. TSR_ERR_UNSUPPORTED,
 * with nothing launched, where the plugin does not take them. */
static int moe_on_device(tsr_model *m, int layer, int rows, int into_x, tsr_error *err) {
    const tsr_model_config *c = &m->cfg;
    const int K = c->n_experts_used, h = c->hidden, f = c->expert_ffn;
    void *const *t = m->ex_tables + 2 * layer;
    int rc;
    OP(TSR_PROF_GATE_UP, rc = tsr_gemv_run_experts(m->gemv, t[0], m->route_idx, rows * K, K, 1, m->xn, h, m->ex_g, EX));
    if ((rc = experts_called(m, rc, 0, "chosen", err))) return rc;
    OP(TSR_PROF_DOWN, rc = tsr_gemv_run_experts(m->gemv, t[1], m->route_idx, rows * K, 1, 0, m->ex_g, f, m->ex_d, EX));
    if ((rc = experts_called(m, rc, 1, "chosen", err))) return rc;
    return m->be->combine_experts(into_x ? m->x : m->moe_out, m->ex_d, m->route_idx, m->route_w, rows, K, h, into_x,
                                  NULL, err);
}

/* Mixture of experts over m->xn, adding into m->x. The router and the
 * routing (softmax, top-k) run on the backend; the experts are then chosen
 * on the device where the engine can (moe_on_device), else looked up by the
 * host (moe_on_host); both sum the same products in the same order. */
static int moe(tsr_model *m, int layer, int rows, tsr_error *err) {
    const tsr_model_config *c = &m->cfg;
    const tsr_layer_w *L = &m->layers[layer];
    const tsr_backend *be = m->be;
    const int E = c->n_experts, K = c->n_experts_used, h = c->hidden;
    if (E > MAX_EXPERTS) return tsr_error_set(err, TSR_ERR_UNSUPPORTED, "%d experts", E);
    if (K > MAX_USED) return tsr_error_set(err, TSR_ERR_UNSUPPORTED, "%d experts per token", K);
    int rc;
    if ((rc = gemv(m, L->w_router, rows, m->xn, m->router, err))) return rc;
    BE(be->route(m->router, rows, E, K, c->norm_topk_prob, m->route_idx, m->route_w, err));
    rc = TSR_ERR_UNSUPPORTED;
    const int into_x = !L->sh_gate;
    if (m->ex_tables && rows <= TSR_GRAPH_MAX_ROWS && rows * K <= m->chunk) {
        rc = moe_on_device(m, layer, rows, into_x, err);
        if (rc == TSR_OK && into_x) return TSR_OK;
    }
    if (rc == TSR_ERR_UNSUPPORTED && EX->step)
        return tsr_error_set(err, TSR_ERR_UNSUPPORTED,
                             "a pass of %d rows captured as a CUDA graph needs plugin %s to choose the experts "
                             "on the device (run_experts), which it declined",
                             rows, m->gemv->plugin);
    if (rc == TSR_ERR_UNSUPPORTED) rc = moe_on_host(m, layer, rows, err);
    if (rc != TSR_OK) return rc;
    if (L->sh_gate) { /* qwen2_moe: a shared expert behind a sigmoid gate */
        const int sf = c->shared_expert_ffn;
        if ((rc = ffn(m, L->sh_gate, L->sh_up, L->sh_down, rows, sf, m->xn, m->ex_g, m->ex_u,
                      m->ex_d, err)))
            return rc;
        if ((rc = gemv(m, L->sh_router, rows, m->xn, m->sh_gate_out, err))) return rc;
        BE(be->add_gated(m->moe_out, m->ex_d, m->sh_gate_out, rows, h, err));
    }
    return be->add(m->x, m->moe_out, (int64_t)rows * h, err);
}

/* The attention half of a layer over the residual stream (*pending: m->o
 * still to be added into x, as into_stream leaves it), its output added
 * into the stream the same way. The input norm goes into a stacked q/k/v
 * product where the plugin takes it (run_fused). */
static int attention_block(tsr_model *m, int layer, int kv_seq, int pos0, int rows, int *pending,
                           tsr_error *err) {
    const tsr_model_config *c = &m->cfg;
    const tsr_backend *be = m->be;
    const tsr_layer_w *L = &m->layers[layer];
    const int hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    int rc, qkv_done = 0;
    if (L->wqkv) BE(from_fold(m, TSR_PROF_QKV, L->wqkv, rows, m->qkv, L->attn_norm, 0, &qkv_done, err));
    if (L->wqkv && !*pending && !qkv_done)
        BE(fused(m, TSR_PROF_QKV, L->wqkv, rows, m->x, m->qkv,
                 &(tsr_gemv_fuse){.norm = L->attn_norm, .eps = c->norm_eps}, &qkv_done, err));
    if (!qkv_done) BE(input_norm(m, L->attn_norm, rows, pending, err));
    float *q = m->q, *k = m->k, *v = m->v;
    const int32_t *dev_pos0 = EX->step ? &EX->step->pos0 : NULL;
    /* rotated while split out of the stacked projection (nothing between) */
    int rotated = 0;
    if (L->wqkv) { /* one pass over q, k, v stacked: [rows, qd + 2 kvd] */
        if (!qkv_done) OP(TSR_PROF_QKV, if ((rc = gemv(m, L->wqkv, rows, m->xn, m->qkv, err))) return rc);
        if (rows == 1) { /* a single row is already three contiguous vectors */
            q = m->qkv, k = m->qkv + qd, v = m->qkv + qd + kvd;
        } else if (!L->bq && !L->bk && !L->bv && !L->q_norm) {
            OP(TSR_PROF_ROPE, BE(be->rope_split(&m->rope, m->inv_freq, q, k, v, m->qkv, rows, c->n_heads,
                                                c->n_kv_heads, pos0, dev_pos0, err)));
            rotated = 1;
        } else {
            OP(TSR_PROF_QKV, BE(be->split3(q, k, v, m->qkv, rows, qd, kvd, kvd, err)));
        }
    } else {
        OP(TSR_PROF_QKV, if ((rc = gemv(m, L->wq, rows, m->xn, q, err))) return rc;
           if ((rc = gemv(m, L->wk, rows, m->xn, k, err))) return rc;
           if ((rc = gemv(m, L->wv, rows, m->xn, v, err))) return rc);
    }
    if (L->bq || L->bk || L->bv)
        OP(TSR_PROF_ADD, BE(add_bias(m, q, L->bq, rows, qd, err)); BE(add_bias(m, k, L->bk, rows, kvd, err));
           BE(add_bias(m, v, L->bv, rows, kvd, err)));
    if (L->q_norm && !rotated && be->qk_norm_rope) { /* per head, then RoPE: one pass */
        OP(TSR_PROF_NORM, BE(be->qk_norm_rope(&m->rope, m->inv_freq, q, k, L->q_norm, L->k_norm, rows, c->n_heads,
                                              c->n_kv_heads, c->norm_eps, pos0, dev_pos0, err)));
        rotated = 1;
    } else if (L->q_norm) { /* per head, before RoPE */
        OP(TSR_PROF_NORM, BE(be->rmsnorm(q, q, L->q_norm, rows * c->n_heads, hd, c->norm_eps, err));
           BE(be->rmsnorm(k, k, L->k_norm, rows * c->n_kv_heads, hd, c->norm_eps, err)));
    }
    if (!rotated) {
        if (rows == 1 && k == q + qd) /* one row of stacked q/k: one rotation over both */
            OP(TSR_PROF_ROPE,
               BE(be->rope(&m->rope, m->inv_freq, q, 1, c->n_heads + c->n_kv_heads, pos0, dev_pos0, err)));
        else
            OP(TSR_PROF_ROPE, BE(be->rope(&m->rope, m->inv_freq, q, rows, c->n_heads, pos0, dev_pos0, err));
               BE(be->rope(&m->rope, m->inv_freq, k, rows, c->n_kv_heads, pos0, dev_pos0, err)));
    }
    OP(TSR_PROF_KV, CALL(m->kv, tsr_kv_append(m->kv, kv_seq, layer, pos0, rows, k, v, EX), "kv append"));
    tsr_kv_view view;
    CALL(m->kv, tsr_kv_view_get(m->kv, kv_seq, layer, &view), "kv view");
    tsr_attn_args a = {
        .rows = rows,
        .pos0 = pos0,
        .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads,
        .head_dim = hd,
        .scale = 1.0f / sqrtf((float)hd),
        .window = c->sliding_window,
        .q = q,
        .kv = &view,
        .out = m->att,
    };
    OP(TSR_PROF_ATTN, CALL(m->attn, tsr_attention_run(m->attn, &a, EX), "attention"));
    return into_stream(m, TSR_PROF_O, L->wo, L->bo, rows, m->att, L->w_gu && !L->moe ? L->ffn_norm : NULL, pending,
                       err);
}

/* The embedding lookup of a table whose pages the gemv plugin gave back
 * (model.c: embed_read, CPU only): each row read from the file into
 * embed_rows, then looked up there. Reading through the mapping would make
 * resident again the pages around each row, up to 2 MiB of them where the
 * kernel caches the file in large folios. */
static int embed_from_file(tsr_model *m, int rows, tsr_error *err) {
    const uint64_t rb = m->embed_read;
    for (int r = 0; r < rows; r++) {
        const uint8_t *src = (const uint8_t *)m->embed->data + (uint64_t)m->ids[r] * rb;
        uint8_t *dst = m->embed_rows + (uint64_t)r * rb;
        if (!tsr_model_file_read(m->file, src, rb, dst)) memcpy(dst, src, (size_t)rb);
    }
    return m->be->embed(m->x, m->embed_rows, m->embed->dtype, m->cfg.hidden, rows, m->embed_iota, rows, err);
}

int tsr_forward_pass(tsr_model *m, const tsr_exec *ex, int kv_seq, int pos0, int rows, tsr_fwd_out out,
                     tsr_error *err) {
    const tsr_model_config *c = &m->cfg;
    const tsr_backend *be = m->be;
    const int h = c->hidden;
    int rc;
    m->cur_ex = ex;
    if (be->set_pdl) be->set_pdl(ex->pdl);
    if (be->set_pool) be->set_pool(tsr_engine_pool(m->engine));
    m->prof_phase = pos0 == 0 || rows > TSR_GRAPH_MAX_ROWS ? 0 : 1;
    if (m->embed_read) OP(TSR_PROF_EMBED, BE(embed_from_file(m, rows, err)));
    else OP(TSR_PROF_EMBED, BE(be->embed(m->x, m->embed_data, m->embed->dtype, h, c->vocab, m->ids, rows, err)));
    /* the residual stream: x, and m->o still to be added into it where pending
     * (each add goes with the next norm, or into the product's launch) */
    int pending = 0;
    m->fold = NULL;
    for (int l = 0; l < c->n_layers; l++) {
        const tsr_layer_w *L = &m->layers[l];
        if ((rc = attention_block(m, l, kv_seq, pos0, rows, &pending, err))) return rc;
        if (L->w_gu && !L->moe) {
            /* the norm after the MLP: the next layer's (a stacked q/k/v), or the head's */
            const float *next = l + 1 < c->n_layers ? (m->layers[l + 1].wqkv ? m->layers[l + 1].attn_norm : NULL)
                                : out != TSR_FWD_NONE ? m->final_norm
                                                      : NULL;
            if ((rc = layer_mlp(m, L, rows, next, &pending, err))) return rc;
            continue;
        }
        BE(input_norm(m, L->ffn_norm, rows, &pending, err)); /* no fold: o's next was NULL */
        if (L->moe) {
            if ((rc = moe(m, l, rows, err))) return rc; /* adds into x */
        } else {
            if ((rc = ffn(m, L->w_gate, L->w_up, L->w_down, rows, c->ffn, m->xn, m->g, m->u, m->o, err))) return rc;
            pending = 1;
        }
    }
    if (pending) OP(TSR_PROF_ADD, BE(be->add(m->x, m->o, (int64_t)rows * h, err)));
    if (out == TSR_FWD_NONE) return TSR_OK;
    const int first = tsr_fwd_all_rows(out) ? 0 : rows - 1, n = rows - first;
    int head_done = 0;
    if (first == 0) BE(from_fold(m, TSR_PROF_HEAD, m->lm_head, n, m->head_out, m->final_norm, 0, &head_done, err));
    if (!head_done)
        BE(fused(m, TSR_PROF_HEAD, m->lm_head, n, m->x + (int64_t)first * h, m->head_out,
                 &(tsr_gemv_fuse){.norm = m->final_norm, .eps = c->norm_eps}, &head_done, err));
    if (!head_done)
        OP(TSR_PROF_HEAD, BE(be->rmsnorm(m->xn, m->x + (int64_t)first * h, m->final_norm, n, h, c->norm_eps, err));
           if ((rc = gemv(m, m->lm_head, n, m->xn, m->head_out, err))) return rc);
    if (tsr_fwd_argmax(out))
        OP(TSR_PROF_ARGMAX, BE(be->argmax(m->head_out, n, c->vocab, m->argmax_dev, err)));
    return TSR_OK;
}

int tsr_forward_chunk(tsr_model *m, int kv_seq, int pos0, const int32_t *tokens, int rows, tsr_fwd_out out,
                      void *dst, tsr_error *err) {
    const tsr_model_config *c = &m->cfg;
    const tsr_backend *be = m->be;
    int rc;
    TSR_ASSERT(rows >= 1 && rows <= m->chunk);
    if (out == TSR_FWD_ARGMAX_ALL && rows > TSR_GRAPH_MAX_ROWS)
        return tsr_error_set(err, TSR_ERR_INVALID, "greedy choices of %d rows at once (at most %d)", rows,
                             TSR_GRAPH_MAX_ROWS);
    for (int r = 0; r < rows; r++)
        if (tokens[r] < 0 || tokens[r] >= c->vocab)
            return tsr_error_set(err, TSR_ERR_INVALID, "token id %d is outside the vocabulary (%d)",
                                 tokens[r], c->vocab);
    int done = 0;
    if ((rc = tsr_graph_forward(m, kv_seq, pos0, tokens, rows, out, dst, &done, err)) || done) return rc;
    /* eager: every launch issued now */
    /* on the CPU the head writes the caller's logits; elsewhere they come back from the device */
    m->head_out = tsr_fwd_logits(out) && be->device == TSR_DEVICE_CPU ? (float *)dst : m->logits_dev;
    BE(be->upload_async(m->ids, tokens, (size_t)rows * sizeof *tokens, err));
    if ((rc = tsr_forward_pass(m, &m->ex, kv_seq, pos0, rows, out, err))) return rc;
    if (out == TSR_FWD_DEVICE_LAST) return TSR_OK; /* the sampler's launches follow in stream order */
    if (out == TSR_FWD_NONE || m->head_out == dst) return be->sync(err);
    return be->download(dst, tsr_fwd_out_src(m, out), tsr_fwd_out_bytes(m, out, rows), err);
}
