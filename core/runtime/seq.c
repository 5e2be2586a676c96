/*
 * seq.c - sequences: a KV sequence of the kv_cache plugin plus the tokens
 * it holds. Forward passes are cut into chunks of at most m->chunk rows.
 */
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

int tsr_seq_new(tsr_model *m, int max_tokens, tsr_seq **out, tsr_error *err) {
    *out = NULL;
    if (max_tokens <= 0 || max_tokens > m->ctx)
        return tsr_error_set(err, TSR_ERR_RANGE, "a sequence of %d tokens does not fit the context of %d",
                             max_tokens, m->ctx);
    tsr_seq *s = calloc(1, sizeof *s);
    if (!s) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    s->tokens = malloc((size_t)max_tokens * sizeof *s->tokens);
    if (!s->tokens) {
        free(s);
        return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    }
    int rc = tsr_kv_seq_alloc(m->kv, max_tokens, &s->kv_seq);
    if (rc != TSR_OK) {
        free(s->tokens);
        free(s);
        return tsr_model_slot_error(m, m->kv, rc, err, "allocating a KV sequence");
    }
    s->m = m;
    s->max_tokens = max_tokens;
    tsr_graphs_forget_seq(m, s->kv_seq); /* a reused id: its old graphs point at freed KV */
    *out = s;
    return TSR_OK;
}

void tsr_seq_free(tsr_seq *s) {
    if (!s) return;
    tsr_seq_pipe_free(s);
    tsr_graphs_forget_seq(s->m, s->kv_seq);
    tsr_kv_seq_free(s->m->kv, s->kv_seq);
    free(s->tokens);
    free(s);
}

int tsr_seq_len(const tsr_seq *s) { return s->n; }
const int32_t *tsr_seq_tokens(const tsr_seq *s) { return s->tokens; }

/* n tokens in chunks; the last chunk hands back out into dst (elem_size
 * bytes per value, per row values per row). */
static int seq_run(tsr_seq *s, const int32_t *tokens, int n, tsr_fwd_out out, void *dst, size_t row_bytes,
                   tsr_error *err) {
    tsr_model *m = s->m;
    if (n <= 0) return tsr_error_set(err, TSR_ERR_INVALID, "no tokens to run");
    if (s->n + n > s->max_tokens)
        return tsr_error_set(err, TSR_ERR_RANGE, "%d + %d tokens exceed the sequence's %d", s->n, n,
                             s->max_tokens);
    const int all = tsr_fwd_all_rows(out);
    for (int done = 0; done < n;) {
        int rows = n - done < m->chunk ? n - done : m->chunk;
        int last_chunk = done + rows == n;
        tsr_fwd_out o = all || last_chunk ? out : TSR_FWD_NONE;
        void *d = all ? (char *)dst + (size_t)done * row_bytes : dst;
        int rc = tsr_forward_chunk(m, s->kv_seq, s->n, tokens + done, rows, o, d, err);
        if (rc != TSR_OK) {
            /* drop what the failed chunk appended to some layers */
            tsr_kv_truncate(m->kv, s->kv_seq, s->n);
            return rc;
        }
        memcpy(s->tokens + s->n, tokens + done, (size_t)rows * sizeof *tokens);
        s->n += rows;
        done += rows;
    }
    return TSR_OK;
}

int tsr_seq_forward(tsr_seq *s, const int32_t *tokens, int n, float *logits, int all_rows,
                    tsr_error *err) {
    tsr_fwd_out out = !logits ? TSR_FWD_NONE : all_rows ? TSR_FWD_LOGITS_ALL : TSR_FWD_LOGITS_LAST;
    return seq_run(s, tokens, n, out, logits, (size_t)s->m->cfg.vocab * sizeof *logits, err);
}

int tsr_seq_forward_greedy(tsr_seq *s, const int32_t *tokens, int n, int32_t *choices, int all_rows,
                           tsr_error *err) {
    if (all_rows && n > TSR_GRAPH_MAX_ROWS)
        return tsr_error_set(err, TSR_ERR_INVALID, "greedy choices of %d rows at once (at most %d)", n,
                             TSR_GRAPH_MAX_ROWS);
    return seq_run(s, tokens, n, all_rows ? TSR_FWD_ARGMAX_ALL : TSR_FWD_ARGMAX_LAST, choices,
                   sizeof *choices, err);
}

int tsr_seq_forward_device(tsr_seq *s, const int32_t *tokens, int n, tsr_error *err) {
    if (s->m->be->device == TSR_DEVICE_CPU)
        return tsr_error_set(err, TSR_ERR_UNSUPPORTED, "logits kept on the device: the model runs on the CPU");
    return seq_run(s, tokens, n, TSR_FWD_DEVICE_LAST, NULL, 0, err);
}

int tsr_seq_truncate(tsr_seq *s, int n, tsr_error *err) {
    int rc;
    if (tsr_seq_pipe_queued(s) && (rc = tsr_seq_pipe_drop(s, err)) != TSR_OK) return rc;
    if (n < 0 || n > s->n)
        return tsr_error_set(err, TSR_ERR_INVALID, "truncate to %d of %d tokens", n, s->n);
    rc = tsr_kv_truncate(s->m->kv, s->kv_seq, n);
    if (rc != TSR_OK) return tsr_model_slot_error(s->m, s->m->kv, rc, err, "kv truncate");
    s->n = n;
    return TSR_OK;
}
