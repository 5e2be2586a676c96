/*
 * forward.c - the decoder forward pass over a chunk of rows. The core does
 * embedding, norms, RoPE, activations and routing (kernels/cpu/ops.h); every
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

static void add_bias(float *y, const float *b, int rows, int n) {
    if (!b) return;
    for (int r = 0; r < rows; r++) tsr_add(y + (int64_t)r * n, b, n);
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
    tsr_silu_mul(g, g, u, (int64_t)rows * f);
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
    const tsr_layer_w *L = &m->layers[layer];
    const int h = c->hidden, hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    int rc;
    for (int r = 0; r < rows; r++)
        tsr_rmsnorm(m->xn + (int64_t)r * h, m->x + (int64_t)r * h, L->attn_norm, h, c->norm_eps);
    if ((rc = gemv(m, L->wq, rows, m->xn, m->q, err))) return rc;
    if ((rc = gemv(m, L->wk, rows, m->xn, m->k, err))) return rc;
    if ((rc = gemv(m, L->wv, rows, m->xn, m->v, err))) return rc;
    add_bias(m->q, L->bq, rows, qd);
    add_bias(m->k, L->bk, rows, kvd);
    add_bias(m->v, L->bv, rows, kvd);
    for (int r = 0; r < rows; r++) {
        float *q = m->q + (int64_t)r * qd, *k = m->k + (int64_t)r * kvd;
        if (L->q_norm) {
            for (int hh = 0; hh < c->n_heads; hh++)
                tsr_rmsnorm(q + hh * hd, q + hh * hd, L->q_norm, hd, c->norm_eps);
            for (int hh = 0; hh < c->n_kv_heads; hh++)
                tsr_rmsnorm(k + hh * hd, k + hh * hd, L->k_norm, hd, c->norm_eps);
        }
        tsr_rope_apply(&m->rope, q, c->n_heads, pos0 + r);
        tsr_rope_apply(&m->rope, k, c->n_kv_heads, pos0 + r);
    }
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
    add_bias(m->o, L->bo, rows, h);
    tsr_add(m->x, m->o, (int64_t)rows * h);
    return TSR_OK;
}

int tsr_forward_chunk(tsr_model *m, int kv_seq, int pos0, const int32_t *tokens, int rows,
                      float *logits, int all_rows, tsr_error *err) {
    const tsr_model_config *c = &m->cfg;
    const int h = c->hidden;
    int rc;
    TSR_ASSERT(rows >= 1 && rows <= m->chunk);
    uint64_t row_bytes;
    if (tsr_dtype_row_bytes(m->embed->dtype, h, &row_bytes) != 0)
        return tsr_error_set(err, TSR_ERR_UNSUPPORTED, "embedding dtype %s with %d columns",
                             tsr_dtype_name(m->embed->dtype), h);
    for (int r = 0; r < rows; r++) {
        if (tokens[r] < 0 || tokens[r] >= c->vocab)
            return tsr_error_set(err, TSR_ERR_INVALID, "token id %d is outside the vocabulary (%d)",
                                 tokens[r], c->vocab);
        tsr_dequant_row(m->embed->dtype, (const uint8_t *)m->embed->data + row_bytes * tokens[r],
                        m->x + (int64_t)r * h, h);
    }
    for (int l = 0; l < c->n_layers; l++) {
        const tsr_layer_w *L = &m->layers[l];
        if ((rc = attention_block(m, l, kv_seq, pos0, rows, err))) return rc;
        for (int r = 0; r < rows; r++)
            tsr_rmsnorm(m->xn + (int64_t)r * h, m->x + (int64_t)r * h, L->ffn_norm, h, c->norm_eps);
        if (L->moe) {
            if ((rc = moe(m, l, rows, err))) return rc;
        } else {
            if ((rc = ffn(m, L->w_gate, L->w_up, L->w_down, rows, c->ffn, m->xn, m->g, m->u, m->o,
                          err)))
                return rc;
            tsr_add(m->x, m->o, (int64_t)rows * h);
        }
    }
    if (!logits) return TSR_OK;
    int first = all_rows ? 0 : rows - 1, n = rows - first;
    for (int r = first; r < rows; r++)
        tsr_rmsnorm(m->xn + (int64_t)(r - first) * h, m->x + (int64_t)r * h, m->final_norm, h,
                    c->norm_eps);
    return gemv(m, m->lm_head, n, m->xn, logits, err);
}
