/*
 * conf_drafter.c - drafter cases: propose/accept scripts over random,
 * repetitive and short contexts at several max_draft values. drafter_none
 * proposes nothing, so the reference fixes the contract rather than the
 * tokens: a status of OK, 0 <= n <= max_draft, ids inside the vocabulary,
 * nothing written past max_draft (guard), proper draft distributions when
 * not deterministic, and identical proposals when the same script is
 * replayed on a fresh instance (the state each instance keeps must not make
 * it diverge).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf_cases.h"

#define VOCAB 96
#define CTX 256

typedef struct draft_case {
    const char *name;
    int kind;      /* 0 random, 1 repeating phrase, 2 short */
    int max_draft;
    const char *params[2]; /* applied when the plugin declares them */
} draft_case;

static const draft_case cases[] = {
    {"random context", 0, 4, {NULL, NULL}},      {"repetitive context", 1, 1, {NULL, NULL}},
    {"repetitive context", 1, 4, {NULL, NULL}},  {"repetitive context", 1, 8, {"max_draft=2", NULL}},
    {"repetitive context", 1, 8, {"n=2", NULL}}, {"short context", 2, 8, {NULL, NULL}},
};

static void make_context(int kind, uint64_t *rng, int32_t *t, int *n) {
    if (kind == 2) {
        t[0] = 1;
        *n = 1;
        return;
    }
    *n = 40 + (int)(conf_rand(rng) % 60);
    for (int i = 0; i < *n; i++) {
        if (kind == 0) t[i] = (int32_t)(conf_rand(rng) % VOCAB);
        else t[i] = (int32_t)((i % 7) * 11 + (i / 35)); /* a phrase that repeats, drifting slowly */
    }
}

typedef struct trace {
    int32_t tok[64][8];
    int n[64];
} trace;

/* Run the script once on a fresh instance: 0, -1 with why (failed), or 1
 * with why (refused as unsupported: e.g. it needs a model this host does
 * not lend). */
static int run_script(conf_env *env, const draft_case *c, const char **params, int n_params, uint64_t seed,
                      trace *tr, int *total, char *why, size_t size) {
    tsr_model_desc md = {.arch = "llama", .n_layers = 2, .hidden = 64, .n_heads = 2, .n_kv_heads = 2, .head_dim = 32,
                         .ffn = 128, .vocab = VOCAB, .max_ctx = CTX};
    conf_inst *ci = NULL;
    int rc = conf_inst_new(env->lib.desc, env->m, &md, params, n_params, env->pool, &ci), ret = 0;
    if (rc != TSR_OK) {
        snprintf(why, size, "init: status %d (%s): %s", rc, tsr_status_str(rc), ci ? ci->err : "?");
        conf_inst_free(ci);
        return rc == TSR_ERR_UNSUPPORTED ? 1 : -1;
    }
    ci->quiet = 1;
    int32_t ctx[CTX + 16];
    int len;
    uint64_t rng = seed;
    make_context(c->kind, &rng, ctx, &len);
    float *tok_guarded = conf_guarded_alloc(c->max_draft); /* int32 and float are both 4 bytes */
    float *probs = conf_guarded_alloc((int64_t)c->max_draft * VOCAB);
    *total = 0;
    for (int step = 0; step < 24 && len < CTX - 8; step++) {
        tsr_draft_req r = {7, ctx, len, c->max_draft};
        tsr_draft_out o = {(int32_t *)tok_guarded, probs, -1, 0};
        ci->err[0] = '\0';
        rc = CONF_MEMBER(ci, tsr_drafter_i, propose)(CONF_INST(ci), &r, &o);
        int32_t *tok = (int32_t *)tok_guarded;
        if (rc != TSR_OK) {
            snprintf(why, size, "step %d: status %d (%s): %s", step, rc, tsr_status_str(rc), ci->err);
            ret = rc == TSR_ERR_UNSUPPORTED ? 1 : -1;
            break;
        }
        if (o.n < 0 || o.n > c->max_draft) {
            snprintf(why, size, "step %d: proposed %d tokens, max_draft %d", step, o.n, c->max_draft);
            ret = -1;
            break;
        }
        if (!conf_guard_intact(tok_guarded, c->max_draft) || !conf_guard_intact(probs, (int64_t)c->max_draft * VOCAB)) {
            snprintf(why, size, "step %d: wrote outside tokens[max_draft] or probs (guard bytes changed)", step);
            ret = -1;
            break;
        }
        for (int i = 0; i < o.n && ret == 0; i++) {
            if (tok[i] < 0 || tok[i] >= VOCAB) {
                snprintf(why, size, "step %d: token %d is not a valid id (vocab %d)", step, tok[i], VOCAB);
                ret = -1;
            } else if (!o.deterministic) {
                double sum = 0.0;
                const float *p = probs + (int64_t)i * VOCAB;
                for (int v = 0; v < VOCAB; v++) sum += p[v] >= 0.0f && isfinite(p[v]) ? p[v] : 1e9;
                if (fabs(sum - 1.0) > 1e-3 || !(p[tok[i]] > 0.0f)) {
                    snprintf(why, size, "step %d: draft distribution %d sums to %g, p(token) %g", step, i, sum,
                             p[tok[i]]);
                    ret = -1;
                }
            }
        }
        if (ret) break;
        memcpy(tr->tok[step], tok, (size_t)o.n * sizeof *tok);
        tr->n[step] = o.n;
        *total += o.n;
        /* the "target" continues the phrase (repetitive) or draws (random):
         * accept the proposal's prefix that matches it */
        int acc = 0;
        int32_t next[9];
        for (int i = 0; i <= o.n; i++) {
            int p = len + i;
            next[i] = c->kind == 1 ? (int32_t)((p % 7) * 11 + (p / 35)) : (int32_t)(conf_rand(&rng) % VOCAB);
        }
        while (acc < o.n && tok[acc] == next[acc]) acc++;
        void (*accept)(void *, int, int, int) = CONF_MEMBER(ci, tsr_drafter_i, accept);
        if (accept) accept(CONF_INST(ci), 7, o.n, acc);
        for (int i = 0; i <= acc; i++) ctx[len++] = next[i];
    }
    void (*seq_end)(void *, int) = CONF_MEMBER(ci, tsr_drafter_i, seq_end);
    if (seq_end) seq_end(CONF_INST(ci), 7);
    conf_guarded_free(tok_guarded);
    conf_guarded_free(probs);
    conf_inst_free(ci);
    return ret;
}

void conf_run_drafter(conf_env *env) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const draft_case *c = &cases[i];
        const char *params[3];
        int np = conf_params(env, c->params, 2, params);
        char what[160], why[1400];
        snprintf(what, sizeof what, "drafter %s max_draft=%d%s%s", c->name, c->max_draft,
                 c->params[0] && np && params[0] == c->params[0] ? " " : "",
                 c->params[0] && np && params[0] == c->params[0] ? params[0] : "");
        trace *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
        int ta = 0, tb = 0;
        uint64_t seed = env->seed + i;
        int r1 = run_script(env, c, params, np, seed, a, &ta, why, sizeof why);
        if (r1 > 0) {
            conf_report(env, CONF_UNSUPPORTED, what, "%s", why);
        } else if (r1 < 0) {
            conf_report(env, CONF_FAIL, what, "%s", why);
        } else if (run_script(env, c, params, np, seed, b, &tb, why, sizeof why)) {
            conf_report(env, CONF_FAIL, what, "replay: %s", why);
        } else if (memcmp(a, b, sizeof *a)) {
            conf_report(env, CONF_FAIL, what, "replaying the script on a fresh instance proposed differently");
        } else {
            conf_report(env, CONF_PASS, what, "%d tokens proposed over the script, all valid", ta);
        }
        free(a);
        free(b);
    }
}
