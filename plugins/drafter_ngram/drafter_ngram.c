/*
 * drafter_ngram - prompt lookup decoding: propose the tokens that followed
 * the most recent earlier occurrence of the context's last n tokens.
 *
 * For m = n down to min_n, the last m tokens of the context are searched for
 * in the context before them, newest occurrence first; the first match wins
 * and the tokens after it (at most max_draft, never past the context's end)
 * are the proposal. Proposals depend only on the context, so they are
 * deterministic (probability 1 each): sampled verification then uses the
 * one-hot draft distribution.
 *
 * With adaptive (param), each sequence's draft length follows what was
 * accepted: all accepted, it grows by 2 (up to max_draft); some, it becomes
 * accepted + 1; none, it halves, and after two proposals in a row with none
 * accepted the sequence drafts nothing for 2, 4, ... up to 32 steps (each a
 * plain one-row decode) before trying again. A verification pass of k + 1
 * rows costs more than a decode step, so drafts that keep being rejected
 * only slow decoding down; output is unchanged either way (verification).
 */
#include <string.h>

#include "slots/tsr_drafter.h"

enum { kSeqs = 64, kMaxBackoff = 32 }; /* sequences with adaptive state; longest pause */

typedef struct ngram {
    const tsr_plugin_ctx *ctx;
    int n;          /* longest match tried */
    int min_n;      /* shortest match tried */
    int max_draft;  /* most tokens proposed */
    int vocab;      /* 0: unknown, no id check */
    int adaptive;   /* param adaptive: per-sequence draft length and back-off */
    uint64_t proposals, proposed, accepted;
    /* adaptive state of up to kSeqs sequences (more: not adaptive) */
    struct seq_state {
        int used, seq;
        int k;       /* draft length now */
        int misses;  /* proposals in a row with nothing accepted */
        int skip;    /* steps left without drafting */
        int backoff; /* the last skip given */
    } seqs[kSeqs];
} ngram;

/* The state of seq (made on first use when make), or NULL. */
static struct seq_state *seq_state(ngram *g, int seq, int make) {
    struct seq_state *free_slot = NULL;
    for (int i = 0; i < kSeqs; i++) {
        struct seq_state *st = &g->seqs[((unsigned)seq + (unsigned)i) % kSeqs];
        if (st->used && st->seq == seq) return st;
        if (!st->used && !free_slot) free_slot = st;
    }
    if (!make || !free_slot) return NULL;
    *free_slot = (struct seq_state){.used = 1, .seq = seq, .k = g->max_draft};
    return free_slot;
}

static int param_int(const tsr_plugin_ctx *ctx, const char *name, int def) {
    const tsr_param *p = ctx->host->param(ctx, name);
    return p && p->type == TSR_PARAM_INT ? (int)p->v.i : def;
}

static int ng_init(void *inst, const tsr_plugin_ctx *ctx) {
    ngram *g = inst;
    g->ctx = ctx;
    g->n = param_int(ctx, "n", 3);
    g->min_n = param_int(ctx, "min_n", 1);
    g->max_draft = param_int(ctx, "max_draft", 8);
    g->vocab = ctx->model ? ctx->model->vocab : 0;
    const tsr_param *ad = ctx->host->param(ctx, "adaptive");
    g->adaptive = ad && ad->type == TSR_PARAM_BOOL && ad->v.b;
    if (g->n < 1 || g->min_n < 1 || g->min_n > g->n) {
        ctx->host->set_error(ctx, "params n=%d and min_n=%d: need 1 <= min_n <= n", g->n, g->min_n);
        return TSR_ERR_INVALID;
    }
    if (g->max_draft < 1) {
        ctx->host->set_error(ctx, "param max_draft=%d must be at least 1", g->max_draft);
        return TSR_ERR_INVALID;
    }
    return TSR_OK;
}

static void ng_fini(void *inst) {
    ngram *g = inst;
    if (g->ctx && g->proposals)
        g->ctx->host->log(g->ctx, TSR_LOG_DEBUG, "%llu proposals, %llu tokens proposed, %llu accepted",
                          (unsigned long long)g->proposals, (unsigned long long)g->proposed,
                          (unsigned long long)g->accepted);
}

/* Start of the newest occurrence of t[len-m, len) that ends before len-1
 * (so at least one token follows it), or -1. */
static int find_match(const int32_t *t, int len, int m) {
    const int32_t *suf = t + len - m;
    for (int i = len - m - 1; i >= 0; i--) {
        if (t[i + m - 1] != suf[m - 1]) continue; /* cheap reject on the last token */
        if (!memcmp(t + i, suf, (size_t)m * sizeof *t)) return i;
    }
    return -1;
}

static int ng_propose(void *inst, const tsr_draft_req *r, tsr_draft_out *out) {
    ngram *g = inst;
    out->n = 0;
    out->deterministic = 1;
    if (!r || r->n_tokens < 0 || (r->n_tokens > 0 && !r->tokens) || r->max_draft < 0 ||
        (r->max_draft > 0 && !out->tokens)) {
        g->ctx->host->set_error(g->ctx, "bad request: n_tokens %d, max_draft %d", r ? r->n_tokens : -1,
                                r ? r->max_draft : -1);
        return TSR_ERR_INVALID;
    }
    int k = r->max_draft < g->max_draft ? r->max_draft : g->max_draft;
    struct seq_state *st = g->adaptive ? seq_state(g, r->seq, 1) : NULL;
    if (st) {
        if (st->skip > 0) { /* backing off: a plain decode step */
            st->skip--;
            return TSR_OK;
        }
        if (st->k < k) k = st->k;
    }
    if (k == 0 || r->n_tokens < 2) return TSR_OK;
    const int32_t *t = r->tokens;
    int len = r->n_tokens;
    int hi = g->n < len - 1 ? g->n : len - 1;
    for (int m = hi; m >= g->min_n; m--) {
        int i = find_match(t, len, m);
        if (i < 0) continue;
        int from = i + m, n = len - from < k ? len - from : k;
        for (int j = 0; j < n; j++) {
            int32_t tok = t[from + j];
            if (tok < 0 || (g->vocab > 0 && tok >= g->vocab)) break; /* never propose an invalid id */
            out->tokens[out->n++] = tok;
        }
        break;
    }
    g->proposals++;
    g->proposed += (uint64_t)out->n;
    return TSR_OK;
}

static void ng_accept(void *inst, int seq, int n_proposed, int n_accepted) {
    ngram *g = inst;
    if (n_accepted > 0) g->accepted += (uint64_t)n_accepted;
    struct seq_state *st = g->adaptive ? seq_state(g, seq, 0) : NULL;
    if (!st || n_proposed <= 0) return;
    if (n_accepted > 0) {
        st->misses = 0, st->backoff = 0;
        st->k = n_accepted >= n_proposed ? st->k + 2 : n_accepted + 1;
        if (st->k > g->max_draft) st->k = g->max_draft;
        return;
    }
    st->k = st->k > 1 ? st->k / 2 : 1;
    if (++st->misses >= 2) {
        st->backoff = st->backoff ? 2 * st->backoff : 2;
        if (st->backoff > kMaxBackoff) st->backoff = kMaxBackoff;
        st->skip = st->backoff;
        st->misses = 0;
    }
}

static void ng_seq_end(void *inst, int seq) {
    struct seq_state *st = seq_state(inst, seq, 0);
    if (st) st->used = 0;
}

static const tsr_drafter_i ng_iface = {
    .struct_size = sizeof(tsr_drafter_i),
    .version = TSR_DRAFTER_IFACE_VERSION,
    .propose = ng_propose,
    .accept = ng_accept,
    .seq_end = ng_seq_end, /* the adaptive state; the request carries the context */
};

static const tsr_plugin_desc ng_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .name = "drafter_ngram",
    .slot = TSR_SLOT_DRAFTER,
    .version = "1.0.0",
    .instance_size = sizeof(ngram),
    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_DEVICE_CUDA | TSR_CAP_EXACT,
    .init = ng_init,
    .fini = ng_fini,
    .iface = &ng_iface,
};

TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &ng_desc; }
