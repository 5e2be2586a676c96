/*
 * conf_attention.c - attention cases (decode, verification, prefill, GQA
 * ratios, a sliding window, NaN in q) over the KV of every kv_cache plugin in
 * the catalog whose provides satisfy the attention plugin's requires. The
 * reference is ref_attention over the same view widened to f32 contiguous,
 * so a plugin reading f16 or int8 KV in place is held to the same bound.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf_cases.h"
#include "kernels/dtype.h"

#define ATTN_TOL_EXACT 1e-7
#define ATTN_TOL_LOSSY 1e-4

typedef struct attn_case {
    int rows, pos0, n_heads, n_kv_heads, head_dim, window, nan_q;
} attn_case;

static const attn_case cases[] = {
    {1, 0, 4, 4, 64, 0, 0},    {1, 37, 8, 2, 64, 0, 0},  {1, 200, 14, 2, 64, 0, 0}, {5, 60, 8, 2, 64, 0, 0},
    {32, 0, 4, 1, 128, 0, 0},  {17, 9, 6, 2, 32, 0, 0},  {8, 40, 4, 2, 64, 16, 0},  {3, 10, 4, 2, 64, 0, 1},
};

/* 1 if kv plugin k (under its variant kvar) provides what attention plugin
 * a requires of kv_cache. */
static int kv_acceptable(const tsr_manifest *a, const tsr_manifest *k, const char *kvar) {
    for (int i = 0; i < a->n_requires; i++) {
        const tsr_mcap *r = &a->requires[i];
        if (strncmp(r->key, "kv_cache.", 9)) continue;
        const tsr_mcap *c = tsr_manifest_provides(k, r->key + 9);
        if (!c) return 0;
        int ok = 0;
        for (int j = 0; j < c->n_values && !ok; j++) {
            char v[128];
            conf_provided(k, c, j, kvar, v, sizeof v);
            for (int q = 0; q < r->n_values; q++) ok |= !strcmp(v, r->values[q]);
        }
        if (!ok) return 0;
    }
    return 1;
}

static void run_case(conf_env *env, const tsr_manifest *km, const char *kvar, const attn_case *c, uint64_t *rng) {
    char what[160], why[256];
    snprintf(what, sizeof what, "attention rows=%d pos0=%d heads=%d/%d d=%d%s%s kv=%s", c->rows, c->pos0, c->n_heads,
             c->n_kv_heads, c->head_dim, c->window ? " window" : "", c->nan_q ? " nan-q" : "", km->name);
    if (kvar) snprintf(what + strlen(what), sizeof what - strlen(what), "[%s]", kvar);
    const int T = c->pos0 + c->rows, tf = c->n_kv_heads * c->head_dim;
    tsr_model_desc md = {.arch = "llama", .n_layers = 1, .hidden = c->n_heads * c->head_dim, .n_heads = c->n_heads,
                         .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .ffn = 64, .vocab = 256,
                         .max_ctx = T};
    conf_lib kl = {0};
    conf_inst *kv = NULL, *ci = NULL, *ref = NULL;
    float *k = malloc((size_t)T * tf * sizeof *k), *v = malloc((size_t)T * tf * sizeof *v);
    float *kf = malloc((size_t)T * tf * sizeof *k), *vf = malloc((size_t)T * tf * sizeof *v);
    int64_t qn = (int64_t)c->rows * c->n_heads * c->head_dim;
    float *q = malloc((size_t)qn * sizeof *q), *qc = malloc((size_t)qn * sizeof *q);
    float *out = conf_guarded_alloc(qn), *want = malloc((size_t)qn * sizeof *want);
    for (int64_t i = 0; i < (int64_t)T * tf; i++) k[i] = 2.0f * conf_randf(rng), v[i] = conf_randf(rng);
    for (int64_t i = 0; i < qn; i++) q[i] = 2.0f * conf_randf(rng);
    if (c->nan_q) q[1 * c->head_dim + 3] = NAN; /* row 0, head 1 */
    memcpy(qc, q, (size_t)qn * sizeof *q);
    tsr_exec ex = {.device = TSR_DEVICE_CPU, .n_threads = 2};
    int seq = -1;
    if (conf_lib_open(km, &kl, why, sizeof why) ||
        conf_inst_new(kl.desc, km, &md, &kvar, kvar ? 1 : 0, env->pool, &kv) != TSR_OK ||
        CONF_MEMBER(kv, tsr_kv_cache_i, seq_alloc)(CONF_INST(kv), T, &seq) != TSR_OK ||
        CONF_MEMBER(kv, tsr_kv_cache_i, append)(CONF_INST(kv), seq, 0, 0, T, k, v, &ex) != TSR_OK) {
        conf_report(env, CONF_UNSUPPORTED, what, "kv_cache plugin %s could not hold the KV: %s", km->name,
                    kv ? kv->err : why);
        goto out;
    }
    kv->quiet = 1;
    tsr_kv_view view = {0};
    if (CONF_MEMBER(kv, tsr_kv_cache_i, view)(CONF_INST(kv), seq, 0, &view) != TSR_OK ||
        conf_kv_view_to_f32(&view, kf, vf, why, sizeof why)) {
        conf_report(env, CONF_UNSUPPORTED, what, "kv_cache plugin %s gave no readable view", km->name);
        goto out;
    }
    tsr_kv_view fview = {.dtype = TSR_DTYPE_F32, .layout = TSR_KV_CONTIGUOUS, .n_tokens = T,
                         .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .k = kf, .v = vf,
                         .token_stride = tf, .head_stride = c->head_dim};
    tsr_attn_args a = {c->rows, c->pos0, c->n_heads, c->n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim),
                       c->window, q, &fview, want};
    if (conf_inst_new(env->ref_lib.desc, env->ref_m, &md, NULL, 0, env->pool, &ref) != TSR_OK ||
        CONF_MEMBER(ref, tsr_attention_i, run)(CONF_INST(ref), &a, &ex) != TSR_OK) {
        conf_report(env, CONF_FAIL, what, "reference failed: %s", ref ? ref->err : "?");
        goto out;
    }
    const char *params[1];
    int np = conf_params(env, NULL, 0, params);
    int rc = conf_inst_new(env->lib.desc, env->m, &md, params, np, env->pool, &ci);
    if (conf_variant_declined(env, rc, what, ci ? ci->err : NULL)) goto out;
    if (rc != TSR_OK) {
        conf_report(env, CONF_FAIL, what, "init: %s", ci ? ci->err : "?");
        goto out;
    }
    ci->quiet = 1;
    a.kv = &view;
    a.out = out;
    rc = CONF_MEMBER(ci, tsr_attention_i, run)(CONF_INST(ci), &a, &ex);
    double nmse = 0.0, tol = env->m->exact ? ATTN_TOL_EXACT : ATTN_TOL_LOSSY;
    int64_t bad = 0;
    if (rc == TSR_ERR_UNSUPPORTED)
        conf_report(env, CONF_UNSUPPORTED, what, "%s", ci->err);
    else if (rc != TSR_OK)
        conf_report(env, CONF_FAIL, what, "status %d (%s): %s", rc, tsr_status_str(rc), ci->err);
    else if (!conf_guard_intact(out, qn))
        conf_report(env, CONF_FAIL, what, "wrote outside out (guard bytes changed)");
    else if (memcmp(q, qc, (size_t)qn * sizeof *q))
        conf_report(env, CONF_FAIL, what, "wrote into q");
    else if (conf_compare(out, want, qn, 1, &nmse, &bad))
        conf_report(env, CONF_FAIL, what, "NaN/Inf parity: out[%lld] = %g, reference %g", (long long)bad, out[bad],
                    want[bad]);
    else if (!(nmse <= tol))
        conf_report(env, CONF_FAIL, what, "nmse %.3g > %.0e", nmse, tol);
    else
        conf_report(env, CONF_PASS, what, "nmse %.3g <= %.0e", nmse, tol);
out:
    if (kv && seq >= 0) CONF_MEMBER(kv, tsr_kv_cache_i, seq_free)(CONF_INST(kv), seq);
    conf_inst_free(ci);
    conf_inst_free(ref);
    conf_inst_free(kv);
    conf_lib_close(&kl);
    free(k), free(v), free(kf), free(vf), free(q), free(qc), free(want);
    conf_guarded_free(out);
}

void conf_run_attention(conf_env *env) {
    uint64_t rng = env->seed ^ 0x617474ull;
    int n_kv = 0;
    for (int i = 0; i < env->cat->n; i++) {
        const tsr_manifest *km = env->cat->items[i];
        if (km->slot != TSR_SLOT_KV_CACHE || km->test || !(km->devices & TSR_DEVMASK_CPU)) continue;
        char kvars[CONF_MAX_VARIANTS][96];
        int nk = conf_variants(km, kvars, CONF_MAX_VARIANTS);
        for (int kv = 0; kv < nk; kv++) {
            const char *kvar = kvars[kv][0] ? kvars[kv] : NULL;
            if (!kv_acceptable(env->m, km, kvar)) continue;
            n_kv++;
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) run_case(env, km, kvar, &cases[c], &rng);
        }
    }
    if (n_kv == 0)
        conf_report(env, CONF_UNSUPPORTED, "attention", "no kv_cache plugin in the catalog provides what it requires");
}
