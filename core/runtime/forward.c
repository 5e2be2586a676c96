/*
 * forward.c - the decoder forward pass over a chunk of rows. The core does
 * embedding, norms, RoPE, activations (through its backend: backend.h) and
 * routing (on the host); every
 * projection goes to the gemv slot, keys and values to the kv_cache slot,
 * attention to the attention slot, expert weights come from the
 * expert_cache slot.
 */
#include <math.h>
#include <string.h>

#include "../../kernels/dtype.h"
#include "model_internal.h"

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

/* y[rows, w.rows] = x . W^T through the gemv slot. */
static int gemv(tsr_model *m, const void *w, int rows, const float *x, float *y, tsr_error *err) {
    CALL(m->gemv, tsr_gemv_run(m->gemv, w, rows, x, y, &m->ex), "gemv");
    return TSR_OK;
}

/* down(silu(gate(x)) * up(x)) for rows rows of x into y. */
static int ffn(tsr_model *m, const void *wg, const void *wu, const void *wd, int rows, int f,
               const float *x, float *g, float *u, float *y, tsr_error *err) {
    int rc;
    if ((rc = gemv(m, wg, rows, x, g, err))) return rc;
    if ((rc = gemv(m, wu, rows, x, u, err))) return rc;
    BE(m->be->silu_mul(g, g, u, (int64_t)rows * f, err));
    return gemv(m, wd, rows, g, y, err);
}

/* Mixture of experts over m->xn, adding into m->x. */
static int moe(tsr_model *m, int layer, int rows, tsr_error *err) {
    const tsr_model_config *c = &m->cfg;
    const tsr_layer_w *L = &m->layers[layer];
    const int E = c->n_experts, K = c->n_experts_used, h = c->hidden, f = c->expert_ffn;
    int rc;
    if ((rc = gemv(m, L->w_router, rows, m->xn, m->router, err))) return rc;
    uint8_t used[1024] = {0};
    if (E > (int)sizeof used) return tsr_error_set(err, TSR_ERR_UNSUPPORTED, "%d experts", E);
    for (int r = 0; r < rows; r++) {
        float *p = m->router + (int64_t)r * E;
        int32_t *idx = m->topk_idx + (int64_t)r * K;
        float *w = m->topk_w + (int64_t)r * K;
        tsr_softmax(p, E);
        tsr_topk(p, E, K, idx);
        float sum = 0.0f;
        for (int k = 0; k < K; k++) sum += (w[k] = idx[k] >= 0 ? p[idx[k]] : 0.0f);
        if (c->norm_topk_prob && sum > 0.0f)
            for (int k = 0; k < K; k++) w[k] /= sum;
        for (int k = 0; k < K; k++)
            if (idx[k] >= 0) used[idx[k]] = 1;
    }
    memset(m->moe_out, 0, (size_t)rows * h * sizeof(float));
    /* experts in increasing id, looked up in groups of at most K */
    int32_t group[64];
    if (K > 64) return tsr_error_set(err, TSR_ERR_UNSUPPORTED, "%d experts per token", K);
    int e = 0;
    while (e < E) {
        int n = 0;
        for (; e < E && n < K; e++)
            if (used[e]) group[n++] = e;
        if (n == 0) break;
        const tsr_expert_weights *ew[64];
        CALL(m->experts, tsr_expert_lookup(m->experts, layer, n, group, ew), "expert lookup");
        for (int gi = 0; gi < n; gi++) {
            int cnt = 0;
            for (int r = 0; r < rows; r++)
                for (int k = 0; k < K; k++)
                    if (m->topk_idx[(int64_t)r * K + k] == group[gi]) {
                        m->ex_rows[cnt] = r;
                        m->ex_wts[cnt] = m->topk_w[(int64_t)r * K + k];
                        memcpy(m->ex_in + (int64_t)cnt * h, m->xn + (int64_t)r * h,
                               (size_t)h * sizeof(float));
                        cnt++;
                    }
            if ((rc = ffn(m, ew[gi]->gate, ew[gi]->up, ew[gi]->down, cnt, f, m->ex_in, m->ex_g,
                          m->ex_u, m->ex_d, err)))
                return rc;
            for (int j = 0; j < cnt; j++)
                tsr_axpy(m->moe_out + (int64_t)m->ex_rows[j] * h, m->ex_wts[j],
                         m->ex_d + (int64_t)j * h, h);
        }
    }
    if (L->sh_gate) { /* qwen2_moe: a shared expert behind a sigmoid gate */
        const int sf = c->shared_expert_ffn;
        if ((rc = ffn(m, L->sh_gate, L->sh_up, L->sh_down, rows, sf, m->xn, m->ex_g, m->ex_u,
                      m->ex_d, err)))
            return rc;
        if ((rc = gemv(m, L->sh_router, rows, m->xn, m->sh_gate_out, err))) return rc;
        for (int r = 0; r < rows; r++)
            tsr_axpy(m->moe_out + (int64_t)r * h, tsr_sigmoid(m->sh_gate_out[r]),
                     m->ex_d + (int64_t)r * h, h);
    }
    tsr_add(m->x, m->moe_out, (int64_t)rows * h);
    return TSR_OK;
}

static int attention_block(tsr_model *m, int layer, int kv_seq, int pos0, int rows,
                           tsr_error *err) {
    const tsr_model_config *c = &m->cfg;
    const tsr_backend *be = m->be;
    const tsr_layer_w *L = &m->layers[layer];
    const int h = c->hidden, hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    int rc;
    BE(be->rmsnorm(m->xn, m->x, L->attn_norm, rows, h, c->norm_eps, err));
    if ((rc = gemv(m, L->wq, rows, m->xn, m->q, err))) return rc;
    if ((rc = gemv(m, L->wk, rows, m->xn, m->k, err))) return rc;
    if ((rc = gemv(m, L->wv, rows, m->xn, m->v, err))) return rc;
    BE(add_bias(m, m->q, L->bq, rows, qd, err));
    BE(add_bias(m, m->k, L->bk, rows, kvd, err));
    BE(add_bias(m, m->v, L->bv, rows, kvd, err));
    if (L->q_norm) { /* per head, before RoPE */
        BE(be->rmsnorm(m->q, m->q, L->q_norm, rows * c->n_heads, hd, c->norm_eps, err));
        BE(be->rmsnorm(m->k, m->k, L->k_norm, rows * c->n_kv_heads, hd, c->norm_eps, err));
    }
    BE(be->rope(&m->rope, m->inv_freq, m->q, rows, c->n_heads, pos0, err));
    BE(be->rope(&m->rope, m->inv_freq, m->k, rows, c->n_kv_heads, pos0, err));
    CALL(m->kv, tsr_kv_append(m->kv, kv_seq, layer, pos0, rows, m->k, m->v, &m->ex), "kv append");
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
        .q = m->q,
        .kv = &view,
        .out = m->att,
    };
    CALL(m->attn, tsr_attention_run(m->attn, &a, &m->ex), "attention");
    if ((rc = gemv(m, L->wo, rows, m->att, m->o, err))) return rc;
    BE(add_bias(m, m->o, L->bo, rows, h, err));
    return be->add(m->x, m->o, (int64_t)rows * h, err);
}

int tsr_forward_chunk(tsr_model *m, int kv_seq, int pos0, const int32_t *tokens, int rows,
                      float *logits, int all_rows, tsr_error *err) {
    const tsr_model_config *c = &m->cfg;
    const tsr_backend *be = m->be;
    const int h = c->hidden;
    int rc;
    TSR_ASSERT(rows >= 1 && rows <= m->chunk);
    for (int r = 0; r < rows; r++)
        if (tokens[r] < 0 || tokens[r] >= c->vocab)
            return tsr_error_set(err, TSR_ERR_INVALID, "token id %d is outside the vocabulary (%d)",
                                 tokens[r], c->vocab);
    BE(be->embed(m->x, m->embed_data, m->embed->dtype, h, tokens, m->ids, rows, err));
    for (int l = 0; l < c->n_layers; l++) {
        const tsr_layer_w *L = &m->layers[l];
        if ((rc = attention_block(m, l, kv_seq, pos0, rows, err))) return rc;
        BE(be->rmsnorm(m->xn, m->x, L->ffn_norm, rows, h, c->norm_eps, err));
        if (L->moe) {
            if ((rc = moe(m, l, rows, err))) return rc;
        } else {
            if ((rc = ffn(m, L->w_gate, L->w_up, L->w_down, rows, c->ffn, m->xn, m->g, m->u, m->o,
                          err)))
                return rc;
            BE(be->add(m->x, m->o, (int64_t)rows * h, err));
        }
    }
    if (!logits) return be->sync(err);
    int first = all_rows ? 0 : rows - 1, n = rows - first;
    BE(be->rmsnorm(m->xn, m->x + (int64_t)first * h, m->final_norm, n, h, c->norm_eps, err));
    /* on the CPU the head writes the caller's logits; elsewhere they come back from the device */
    float *out = be->device == TSR_DEVICE_CPU ? logits : m->logits_dev;
    if ((rc = gemv(m, m->lm_head, n, m->xn, out, err))) return rc;
    if (out != logits) BE(be->download(logits, out, (size_t)n * c->vocab * sizeof(float), err));
    return be->sync(err);
}
