/*
 * conf_kv.c - kv_cache cases: scripted sequences (alloc, append in prefill
 * chunks and decode rows, view, truncate for rollback, re-append, free,
 * misuse that must fail) replayed on the plugin and on ref_kv_cache; each
 * step's status class and each view's token count must agree, and the
 * stored keys and values (widened to f32) must match the reference's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf_cases.h"
#include "kernels/dtype.h"

#define KV_TOL_LOSSY 1e-3 /* int8 per-token-per-head scales: ~5e-5 on random data */

int conf_kv_view_to_f32(const tsr_kv_view *v, float *k, float *vv, char *why, size_t size) {
    uint32_t dt = v->dtype;
    if (dt != TSR_DTYPE_F32 && dt != TSR_DTYPE_F16 && dt != TSR_DTYPE_BF16 && dt != TSR_DTYPE_I8 &&
        dt != TSR_DTYPE_F8_E4M3) {
        snprintf(why, size, "view dtype %u is not a KV dtype", dt);
        return -1;
    }
    if (v->layout != TSR_KV_CONTIGUOUS && v->layout != TSR_KV_PAGED) {
        snprintf(why, size, "view layout %u unknown", v->layout);
        return -1;
    }
    if (v->layout == TSR_KV_PAGED && (v->block_size <= 0 || !v->block_table)) {
        snprintf(why, size, "paged view without block_size or block_table");
        return -1;
    }
    int scaled = dt == TSR_DTYPE_I8 || dt == TSR_DTYPE_F8_E4M3;
    if (scaled && (!v->k_scale || !v->v_scale)) {
        snprintf(why, size, "%s view without scales", tsr_dtype_name(dt));
        return -1;
    }
    if (v->n_tokens > 0 && (!v->k || !v->v)) {
        snprintf(why, size, "view of %d tokens with NULL k or v", v->n_tokens);
        return -1;
    }
    size_t es = (size_t)tsr_dtype_block_bytes(dt);
    for (int t = 0; t < v->n_tokens; t++) {
        const char *kb = v->k, *vb = v->v;
        int64_t tt = t, slot = t;
        if (v->layout == TSR_KV_PAGED) {
            int32_t blk = v->block_table[t / v->block_size];
            kb += es * (size_t)(blk * v->block_stride);
            vb += es * (size_t)(blk * v->block_stride);
            tt = t % v->block_size;
            slot = (int64_t)blk * v->block_size + tt;
        }
        for (int h = 0; h < v->n_kv_heads; h++) {
            size_t off = es * (size_t)(tt * v->token_stride + h * v->head_stride);
            float *ko = k + ((int64_t)t * v->n_kv_heads + h) * v->head_dim;
            float *vo = vv + ((int64_t)t * v->n_kv_heads + h) * v->head_dim;
            tsr_dequant_row(dt, kb + off, ko, v->head_dim);
            tsr_dequant_row(dt, vb + off, vo, v->head_dim);
            if (scaled) {
                float ks = v->k_scale[slot * v->n_kv_heads + h], vs = v->v_scale[slot * v->n_kv_heads + h];
                for (int d = 0; d < v->head_dim; d++) ko[d] *= ks, vo[d] *= vs;
            }
        }
    }
    return 0;
}

typedef enum { OP_ALLOC, OP_APPEND, OP_TRUNCATE, OP_FREE, OP_CHECK } kv_opk;

/* One step of a script: seq is the script's sequence number (0, 1). */
typedef struct kv_op {
    kv_opk op;
    int seq;
    int a, b;   /* ALLOC: max_tokens; APPEND: rows, pos0 offset from the length (0 = correct);
                 * TRUNCATE: n_tokens */
} kv_op;

static const kv_op script[] = {
    {OP_ALLOC, 0, 40, 0},  {OP_ALLOC, 1, 24, 0},   {OP_APPEND, 0, 7, 0},  {OP_APPEND, 1, 3, 0},
    {OP_CHECK, 0, 0, 0},   {OP_CHECK, 1, 0, 0},    {OP_APPEND, 0, 1, 0},  {OP_APPEND, 0, 1, 0},
    {OP_APPEND, 0, 5, 0},  {OP_CHECK, 0, 0, 0},    {OP_TRUNCATE, 0, 9, 0}, {OP_CHECK, 0, 0, 0},
    {OP_APPEND, 0, 4, 0},  {OP_CHECK, 0, 0, 0},    {OP_TRUNCATE, 1, 0, 0}, {OP_APPEND, 1, 17, 0},
    {OP_CHECK, 1, 0, 0},   {OP_TRUNCATE, 0, 99, 0}, /* above the length: an error */
    {OP_APPEND, 0, 1, 3},  /* pos0 not the length: an error */
    {OP_APPEND, 1, 20, 0}, /* past max_tokens: an error */
    {OP_CHECK, 0, 0, 0},   {OP_CHECK, 1, 0, 0},    {OP_FREE, 1, 0, 0},    {OP_ALLOC, 1, 8, 0},
    {OP_APPEND, 1, 8, 0},  {OP_CHECK, 1, 0, 0},    {OP_TRUNCATE, 0, 0, 0}, {OP_CHECK, 0, 0, 0},
    {OP_APPEND, 0, 40, 0}, {OP_CHECK, 0, 0, 0},    {OP_FREE, 0, 0, 0},    {OP_FREE, 1, 0, 0},
};

typedef struct kv_shape {
    int n_layers, n_kv_heads, head_dim;
} kv_shape;

static const kv_shape kv_shapes[] = {{2, 2, 16}, {3, 4, 64}, {1, 1, 128}};

typedef struct kv_side {
    conf_inst *ci;
    int seq[2];
    int len[2];
} kv_side;

static int side_op(kv_side *s, const kv_op *op, int layer, int rows, const float *k, const float *v) {
    void *inst = CONF_INST(s->ci);
    tsr_exec ex = {.device = TSR_DEVICE_CPU, .n_threads = 2};
    switch (op->op) {
    case OP_ALLOC: return CONF_MEMBER(s->ci, tsr_kv_cache_i, seq_alloc)(inst, op->a, &s->seq[op->seq]);
    case OP_APPEND:
        return CONF_MEMBER(s->ci, tsr_kv_cache_i, append)(inst, s->seq[op->seq], layer, s->len[op->seq] + op->b,
                                                          rows, k, v, &ex);
    case OP_TRUNCATE: return CONF_MEMBER(s->ci, tsr_kv_cache_i, truncate)(inst, s->seq[op->seq], op->a);
    case OP_FREE: CONF_MEMBER(s->ci, tsr_kv_cache_i, seq_free)(inst, s->seq[op->seq]); return TSR_OK;
    default: return TSR_OK;
    }
}

/* Compare every layer's view of script sequence q; 0 or -1 with why. */
static int compare_views(conf_env *env, kv_side *p, kv_side *r, int q, const kv_shape *sh, double *worst,
                         char *why, size_t size) {
    for (int l = 0; l < sh->n_layers; l++) {
        tsr_kv_view pv = {0}, rv = {0};
        int rc = CONF_MEMBER(p->ci, tsr_kv_cache_i, view)(CONF_INST(p->ci), p->seq[q], l, &pv);
        int rrc = CONF_MEMBER(r->ci, tsr_kv_cache_i, view)(CONF_INST(r->ci), r->seq[q], l, &rv);
        if (rrc != TSR_OK) return snprintf(why, size, "reference view failed: %s", r->ci->err), -1;
        if (rc != TSR_OK) return snprintf(why, size, "view of layer %d: status %d: %s", l, rc, p->ci->err), -1;
        if (pv.n_tokens != rv.n_tokens || pv.n_kv_heads != sh->n_kv_heads || pv.head_dim != sh->head_dim)
            return snprintf(why, size, "layer %d view: %d tokens, %d heads, head_dim %d; reference %d, %d, %d", l,
                            pv.n_tokens, pv.n_kv_heads, pv.head_dim, rv.n_tokens, sh->n_kv_heads, sh->head_dim),
                   -1;
        int64_t n = (int64_t)rv.n_tokens * sh->n_kv_heads * sh->head_dim;
        float *buf = malloc((size_t)(4 * n + 4) * sizeof *buf);
        float *pk = buf, *pvv = buf + n, *rk = buf + 2 * n, *rvv = buf + 3 * n;
        int bad = conf_kv_view_to_f32(&pv, pk, pvv, why, size) || conf_kv_view_to_f32(&rv, rk, rvv, why, size);
        double ek = 0, ev = 0;
        int64_t at = 0;
        if (!bad && (conf_compare(pk, rk, n, 1, &ek, &at) || conf_compare(pvv, rvv, n, 1, &ev, &at))) {
            snprintf(why, size, "layer %d: non-finite mismatch at %lld", l, (long long)at);
            bad = 1;
        }
        free(buf);
        if (bad) return -1;
        double tol = env->m->exact ? 0.0 : KV_TOL_LOSSY;
        double e = ek > ev ? ek : ev;
        if (e > *worst) *worst = e;
        if (!(e <= tol))
            return snprintf(why, size, "layer %d: stored values differ, nmse %.3g > %.0e", l, e, tol), -1;
    }
    return 0;
}

static void run_shape(conf_env *env, const kv_shape *sh, uint64_t *rng) {
    char what[128], why[1400];
    snprintf(what, sizeof what, "kv_cache script %d layers x %d heads x %d", sh->n_layers, sh->n_kv_heads,
             sh->head_dim);
    tsr_model_desc md = {.arch = "llama", .n_layers = sh->n_layers, .hidden = 64, .n_heads = sh->n_kv_heads,
                         .n_kv_heads = sh->n_kv_heads, .head_dim = sh->head_dim, .ffn = 128, .vocab = 256,
                         .max_ctx = 64};
    kv_side p = {0}, r = {0};
    const char *params[1];
    int np = conf_params(env, NULL, 0, params);
    int rc = conf_inst_new(env->lib.desc, env->m, &md, params, np, env->pool, &p.ci);
    int rrc = conf_inst_new(env->ref_lib.desc, env->ref_m, &md, NULL, 0, env->pool, &r.ci);
    if (rc != TSR_OK || rrc != TSR_OK) {
        conf_report(env, CONF_FAIL, what, "init: %s", rc != TSR_OK ? (p.ci ? p.ci->err : "?") : (r.ci ? r.ci->err : "?"));
        goto out;
    }
    p.ci->quiet = r.ci->quiet = 1;
    const int tf = sh->n_kv_heads * sh->head_dim;
    double worst = 0.0;
    for (size_t i = 0; i < sizeof script / sizeof script[0]; i++) {
        const kv_op *op = &script[i];
        if (op->op == OP_CHECK) {
            if (compare_views(env, &p, &r, op->seq, sh, &worst, why, sizeof why)) {
                conf_report(env, CONF_FAIL, what, "step %zu (view of seq %d): %s", i, op->seq, why);
                goto out;
            }
            continue;
        }
        int rows = op->op == OP_APPEND ? op->a : 0;
        float *k = malloc(((size_t)rows * tf + 1) * sizeof *k), *v = malloc(((size_t)rows * tf + 1) * sizeof *v);
        float *kc = malloc(((size_t)rows * tf + 1) * sizeof *k);
        for (int64_t j = 0; j < (int64_t)rows * tf; j++) k[j] = 2.0f * conf_randf(rng), v[j] = conf_randf(rng);
        memcpy(kc, k, (size_t)rows * tf * sizeof *k);
        int nl = op->op == OP_APPEND ? sh->n_layers : 1, res_p = TSR_OK, res_r = TSR_OK;
        for (int l = 0; l < nl; l++) {
            p.ci->err[0] = '\0';
            int a = side_op(&p, op, l, rows, k, v), b = side_op(&r, op, l, rows, k, v);
            if (a != TSR_OK) res_p = a;
            if (b != TSR_OK) res_r = b;
        }
        int changed = memcmp(k, kc, (size_t)rows * tf * sizeof *k) != 0;
        free(k);
        free(v);
        free(kc);
        if (changed) {
            conf_report(env, CONF_FAIL, what, "step %zu: append wrote into its input", i);
            goto out;
        }
        if (res_p == TSR_ERR_NOT_IMPLEMENTED || (res_p != TSR_OK) != (res_r != TSR_OK)) {
            conf_report(env, CONF_FAIL, what, "step %zu (op %d on seq %d): status %d (%s), reference %d%s%s", i,
                        op->op, op->seq, res_p, tsr_status_str(res_p), res_r, p.ci->err[0] ? ": " : "", p.ci->err);
            goto out;
        }
        if (res_r == TSR_OK) {
            if (op->op == OP_APPEND) p.len[op->seq] += rows, r.len[op->seq] += rows;
            if (op->op == OP_TRUNCATE) p.len[op->seq] = r.len[op->seq] = op->a;
            if (op->op == OP_ALLOC || op->op == OP_FREE) p.len[op->seq] = r.len[op->seq] = 0;
        }
    }
    uint64_t used = 0, cap = 0;
    void (*usage)(void *, uint64_t *, uint64_t *) = CONF_MEMBER(p.ci, tsr_kv_cache_i, usage);
    if (usage) usage(CONF_INST(p.ci), &used, &cap);
    if (used != 0) {
        conf_report(env, CONF_FAIL, what, "%llu bytes still in use after every sequence was freed",
                    (unsigned long long)used);
        goto out;
    }
    conf_report(env, CONF_PASS, what, "%zu steps, views match (worst nmse %.3g)", sizeof script / sizeof script[0],
                worst);
out:
    conf_inst_free(p.ci);
    conf_inst_free(r.ci);
}

void conf_run_kv_cache(conf_env *env) {
    uint64_t rng = env->seed ^ 0x6b76ull;
    for (size_t i = 0; i < sizeof kv_shapes / sizeof kv_shapes[0]; i++) run_shape(env, &kv_shapes[i], &rng);
}
