/*
 * conf_expert.c - expert_cache cases: a scripted routing trace (skewed, in
 * layer order like a forward pass, with prefill-sized groups) replayed on
 * the plugin and on expert_resident, both fed by a source that prepares real
 * weights through a ref_gemv instance. After each lookup every returned
 * expert's three matrices are run through ref_gemv on fixed inputs (all of
 * them, after the lookup: they must be valid at once) and compared with the
 * resident cache's; the counters must add up (hits + misses = ids looked up,
 * resident = what the source holds) and, at the end, every prepared expert
 * must be released. A plugin that answers resident (interface version 2)
 * must answer it for every MoE layer with the handles its lookups return,
 * the same throughout the trace, counting nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf_cases.h"

#define EX_LAYERS 3
#define EX_N 8
#define EX_USED 2
#define EX_HIDDEN 32
#define EX_FFN 64
#define EX_TOL_LOSSY 1e-4

typedef struct ex_source {
    conf_inst *gemv;                                  /* a ref_gemv instance */
    float *data;                                      /* [layers, experts, 3, EX_FFN * EX_HIDDEN] */
    int live[EX_LAYERS][EX_N];
    int n_live, n_loads;
    int dense_layer;                                  /* answers TSR_ERR_INVALID, or -1 */
} ex_source;

static const float *mat(const ex_source *s, int layer, int e, int which) {
    return s->data + (((size_t)layer * EX_N + e) * 3 + which) * EX_FFN * EX_HIDDEN;
}

static int ex_load(void *data, int layer, int e, tsr_expert_weights *out, uint64_t *bytes) {
    ex_source *s = data;
    if (layer < 0 || layer >= EX_LAYERS || e < 0 || e >= EX_N || layer == s->dense_layer) return TSR_ERR_INVALID;
    if (s->live[layer][e]) return TSR_ERR_INVALID; /* loaded twice without an unload: a cache bug */
    void *h[3] = {0};
    for (int w = 0; w < 3; w++) {
        int64_t rows = w == 2 ? EX_HIDDEN : EX_FFN, cols = w == 2 ? EX_FFN : EX_HIDDEN;
        tsr_weight tw = {"conf.expert", TSR_DTYPE_F32, rows, cols, mat(s, layer, e, w),
                         (uint64_t)(rows * cols * 4), NULL, TSR_WEIGHT_DENSE};
        int rc = CONF_MEMBER(s->gemv, tsr_gemv_i, prepare)(CONF_INST(s->gemv), &tw, &h[w]);
        if (rc != TSR_OK) return rc;
    }
    out->gate = h[0];
    out->up = h[1];
    out->down = h[2];
    *bytes = 3ull * EX_FFN * EX_HIDDEN * 4;
    s->live[layer][e] = 1;
    s->n_live++;
    s->n_loads++;
    return TSR_OK;
}

static void ex_unload(void *data, int layer, int e, tsr_expert_weights *w) {
    ex_source *s = data;
    void (*rel)(void *, void *) = CONF_MEMBER(s->gemv, tsr_gemv_i, release);
    if (rel) {
        rel(CONF_INST(s->gemv), (void *)w->gate);
        rel(CONF_INST(s->gemv), (void *)w->up);
        rel(CONF_INST(s->gemv), (void *)w->down);
    }
    if (layer >= 0 && layer < EX_LAYERS && e >= 0 && e < EX_N && s->live[layer][e]) {
        s->live[layer][e] = 0;
        s->n_live--;
    } else {
        s->n_live -= 1000; /* unloading what is not loaded: flagged by the count */
    }
}

typedef struct ex_case {
    const char *params[2];
    int dense_layer;
    int prefill_groups; /* lookups of EX_USED ids per layer per step (prefill-like) */
} ex_case;

static const ex_case cases[] = {
    {{"budget=2", NULL}, -1, 1}, {{"budget=5", NULL}, -1, 1}, {{"budget=5", "prefetch=2"}, -1, 1},
    {{"budget=24", NULL}, -1, 3}, {{NULL, NULL}, -1, 1},      {{"budget=4", "prefetch=1"}, 1, 2},
};

/* Run gate, up and down of w on the case's fixed x; out [EX_FFN * 2 + EX_HIDDEN]. */
static int eval_expert(conf_inst *g, const tsr_expert_weights *w, const float *x, const float *xf, float *out) {
    tsr_exec ex = {.device = TSR_DEVICE_CPU, .n_threads = 1};
    int (*run)(void *, const void *, int, const float *, float *, const tsr_exec *) = CONF_MEMBER(g, tsr_gemv_i, run);
    if (!w || !w->gate || !w->up || !w->down) return -1;
    if (run(CONF_INST(g), w->gate, 1, x, out, &ex) || run(CONF_INST(g), w->up, 1, x, out + EX_FFN, &ex) ||
        run(CONF_INST(g), w->down, 1, xf, out + 2 * EX_FFN, &ex))
        return -1;
    return 0;
}

static void run_case(conf_env *env, const ex_case *c, int idx) {
    const char *params[3];
    int np = conf_params(env, c->params, 2, params);
    char what[160], why[1400] = "";
    snprintf(what, sizeof what, "expert_cache trace %dx%d%s%s%s%s%s groups=%d", EX_LAYERS, EX_N,
             c->params[0] ? " " : "", c->params[0] ? c->params[0] : "", c->params[1] ? " " : "",
             c->params[1] ? c->params[1] : "", c->dense_layer >= 0 ? " dense-layer" : "", c->prefill_groups);
    tsr_model_desc md = {.arch = "qwen3_moe", .n_layers = EX_LAYERS, .hidden = EX_HIDDEN, .n_heads = 2,
                         .n_kv_heads = 2, .head_dim = 16, .vocab = 256, .max_ctx = 64, .n_experts = EX_N,
                         .n_experts_used = EX_USED, .expert_ffn = EX_FFN};
    conf_lib gl = {0};
    const tsr_manifest *gm = tsr_catalog_find(env->cat, "ref_gemv");
    ex_source sp = {.dense_layer = c->dense_layer}, sr = {.dense_layer = c->dense_layer};
    conf_inst *ci = NULL, *ref = NULL;
    uint64_t rng = env->seed ^ (0x6578ull + (uint64_t)idx);
    size_t nf = (size_t)EX_LAYERS * EX_N * 3 * EX_FFN * EX_HIDDEN;
    float *data = malloc(nf * sizeof *data);
    for (size_t i = 0; i < nf; i++) data[i] = 0.2f * conf_randf(&rng);
    sp.data = sr.data = data;
    if (!gm || conf_lib_open(gm, &gl, why, sizeof why) ||
        conf_inst_new(gl.desc, gm, &md, NULL, 0, env->pool, &sp.gemv) != TSR_OK ||
        conf_inst_new(gl.desc, gm, &md, NULL, 0, env->pool, &sr.gemv) != TSR_OK) {
        conf_report(env, CONF_FAIL, what, "harness: ref_gemv unavailable %s", why);
        goto out;
    }
    tsr_expert_source src_p = {EX_LAYERS, EX_N, &sp, ex_load, ex_unload};
    tsr_expert_source src_r = {EX_LAYERS, EX_N, &sr, ex_load, ex_unload};
    int rc = conf_inst_new(env->lib.desc, env->m, &md, params, np, env->pool, &ci);
    if (rc == TSR_OK) rc = CONF_MEMBER(ci, tsr_expert_cache_i, attach)(CONF_INST(ci), &src_p);
    if (rc != TSR_OK) {
        conf_report(env, CONF_FAIL, what, "init/attach: status %d (%s): %s", rc, tsr_status_str(rc), ci ? ci->err : "?");
        goto out;
    }
    if (conf_inst_new(env->ref_lib.desc, env->ref_m, &md, NULL, 0, env->pool, &ref) != TSR_OK ||
        CONF_MEMBER(ref, tsr_expert_cache_i, attach)(CONF_INST(ref), &src_r) != TSR_OK) {
        conf_report(env, CONF_FAIL, what, "reference attach failed: %s", ref ? ref->err : "?");
        goto out;
    }
    ci->quiet = ref->quiet = 1;
    /* resident: every expert's handles once, to hold the lookups to */
    int (*resident)(void *, int, const tsr_expert_weights **) = CONF_MEMBER(ci, tsr_expert_cache_i, resident);
    tsr_expert_weights table[EX_LAYERS][EX_N];
    for (int layer = 0; resident && layer < EX_LAYERS; layer++) {
        if (layer == c->dense_layer) continue;
        const tsr_expert_weights *all[EX_N];
        rc = resident(CONF_INST(ci), layer, all);
        if (rc == TSR_ERR_UNSUPPORTED && layer == (c->dense_layer == 0)) {
            resident = NULL; /* declined: lookups only */
            break;
        }
        if (rc != TSR_OK) {
            snprintf(why, sizeof why, "resident layer %d: status %d (%s): %s", layer, rc, tsr_status_str(rc), ci->err);
            break;
        }
        for (int e = 0; e < EX_N; e++) table[layer][e] = *all[e];
    }
    float x[EX_HIDDEN], xf[EX_FFN], got[EX_USED][2 * EX_FFN + EX_HIDDEN], want[2 * EX_FFN + EX_HIDDEN];
    for (int i = 0; i < EX_HIDDEN; i++) x[i] = conf_randf(&rng);
    for (int i = 0; i < EX_FFN; i++) xf[i] = conf_randf(&rng);
    uint64_t ids_looked = 0;
    double worst = 0.0, tol = env->m->exact ? 0.0 : EX_TOL_LOSSY;
    int steps = 0, unsupported = 0;
    for (int tok = 0; tok < 60 && !why[0]; tok++) {
        for (int layer = 0; layer < EX_LAYERS && !why[0]; layer++) {
            if (layer == c->dense_layer) continue;
            for (int g = 0; g < c->prefill_groups && !why[0]; g++) {
                int32_t ids[EX_USED];
                /* skewed: expert 0..2 often, per layer shifted */
                ids[0] = (int32_t)(conf_rand(&rng) % 4 < 3 ? (layer + conf_rand(&rng) % 3) % EX_N : conf_rand(&rng) % EX_N);
                do ids[1] = (int32_t)(conf_rand(&rng) % EX_N); while (ids[1] == ids[0]);
                int n = (conf_rand(&rng) % 5 == 0) ? 1 : EX_USED;
                const tsr_expert_weights *wp[EX_USED] = {0}, *wr[EX_USED] = {0};
                ci->err[0] = '\0';
                rc = CONF_MEMBER(ci, tsr_expert_cache_i, lookup)(CONF_INST(ci), layer, n, ids, wp);
                int rrc = CONF_MEMBER(ref, tsr_expert_cache_i, lookup)(CONF_INST(ref), layer, n, ids, wr);
                if (rrc != TSR_OK) {
                    snprintf(why, sizeof why, "reference lookup failed: %s", ref->err);
                    break;
                }
                if (rc == TSR_ERR_RANGE) { /* a budget below n: allowed, counted */
                    unsupported++;
                    continue;
                }
                if (rc != TSR_OK) {
                    snprintf(why, sizeof why, "lookup layer %d: status %d (%s): %s", layer, rc, tsr_status_str(rc),
                             ci->err);
                    break;
                }
                ids_looked += (uint64_t)n;
                steps++;
                for (int i = 0; i < n && !why[0]; i++)
                    if (eval_expert(sp.gemv, wp[i], x, xf, got[i]))
                        snprintf(why, sizeof why, "layer %d expert %d: returned weights do not run", layer, ids[i]);
                for (int i = 0; i < n && !why[0]; i++) {
                    double e = 0.0;
                    int64_t at;
                    if (eval_expert(sr.gemv, wr[i], x, xf, want) ||
                        conf_compare(got[i], want, 2 * EX_FFN + EX_HIDDEN, 1, &e, &at) || !(e <= tol))
                        snprintf(why, sizeof why, "layer %d expert %d (%d of %d in the lookup): weights behave "
                                 "unlike the resident cache's (nmse %.3g)", layer, ids[i], i, n, e);
                    if (e > worst) worst = e;
                }
                tsr_expert_stats st;
                CONF_MEMBER(ci, tsr_expert_cache_i, stats)(CONF_INST(ci), &st);
                if (resident && !why[0]) { /* the lookup's handles, and resident again: the same */
                    const tsr_expert_weights *all[EX_N];
                    tsr_expert_stats st2;
                    for (int i = 0; i < n && !why[0]; i++)
                        if (wp[i]->gate != table[layer][ids[i]].gate || wp[i]->up != table[layer][ids[i]].up ||
                            wp[i]->down != table[layer][ids[i]].down)
                            snprintf(why, sizeof why, "layer %d expert %d: lookup's handles are not resident's",
                                     layer, ids[i]);
                    if (!why[0] && resident(CONF_INST(ci), layer, all) != TSR_OK)
                        snprintf(why, sizeof why, "resident layer %d failed mid-trace: %s", layer, ci->err);
                    for (int e = 0; e < EX_N && !why[0]; e++)
                        if (all[e]->gate != table[layer][e].gate || all[e]->down != table[layer][e].down)
                            snprintf(why, sizeof why, "resident layer %d expert %d moved during the trace", layer, e);
                    CONF_MEMBER(ci, tsr_expert_cache_i, stats)(CONF_INST(ci), &st2);
                    if (!why[0] && (st2.hits != st.hits || st2.misses != st.misses))
                        snprintf(why, sizeof why, "resident counted as lookups (hits %llu -> %llu)",
                                 (unsigned long long)st.hits, (unsigned long long)st2.hits);
                }
                if (!why[0] && st.resident != (uint64_t)sp.n_live)
                    snprintf(why, sizeof why, "stats: %llu resident, the source holds %d", (unsigned long long)st.resident,
                             sp.n_live);
            }
        }
    }
    tsr_expert_stats st;
    CONF_MEMBER(ci, tsr_expert_cache_i, stats)(CONF_INST(ci), &st);
    if (!why[0] && st.hits + st.misses != ids_looked)
        snprintf(why, sizeof why, "stats: %llu hits + %llu misses, %llu ids looked up", (unsigned long long)st.hits,
                 (unsigned long long)st.misses, (unsigned long long)ids_looked);
    if (!why[0]) {
        conf_inst_free(ci);
        ci = NULL;
        if (sp.n_live != 0) snprintf(why, sizeof why, "%d prepared experts not released at fini", sp.n_live);
    }
    if (why[0])
        conf_report(env, CONF_FAIL, what, "%s", why);
    else if (steps == 0)
        conf_report(env, CONF_UNSUPPORTED, what, "every lookup was out of budget (TSR_ERR_RANGE)");
    else
        conf_report(env, CONF_PASS, what, "%d lookups match%s (%llu hits, %llu misses, %d loads)%s", steps,
                    unsupported ? " (some out of budget)" : "", (unsigned long long)st.hits,
                    (unsigned long long)st.misses, sp.n_loads, resident ? "; resident tables held" : ""); 
out:
    conf_inst_free(ci);
    conf_inst_free(ref);
    conf_inst_free(sp.gemv);
    conf_inst_free(sr.gemv);
    conf_lib_close(&gl);
    free(data);
}

void conf_run_expert_cache(conf_env *env) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(env, &cases[i], (int)i);
}
