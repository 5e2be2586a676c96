/*
 * model.c - loading a model: open the checkpoint, assemble the engine for
 * it, prepare every projection through the gemv plugin, attach the experts
 * to the expert cache, and size the scratch of a forward chunk.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../../kernels/dtype.h"
#include "../host/assembly.h" /* tsr_rt_switch */
#include "model_internal.h"
#include "../util/clock.h"

#ifndef TESSERA_SOURCE_DIR
#define TESSERA_SOURCE_DIR "."
#endif

/* Rows per forward pass on the CPU: a blocked GEMM widens each weight panel
 * once per pass, so a whole 128-token prompt in one pass pays that once. */
#define TSR_FORWARD_CHUNK 128

static const char *source_dir(void) {
    const char *env = getenv("TESSERA_SOURCE_DIR");
    return env && env[0] ? env : TESSERA_SOURCE_DIR;
}

int tsr_model_slot_error(const tsr_model *m, const tsr_slot_ref *s, int rc, tsr_error *err,
                         const char *what) {
    const char *msg = tsr_engine_plugin_error(m->engine, s->slot);
    return tsr_error_set(err, rc, "%s: plugin %s failed (%s)%s%s", what, s->plugin,
                         tsr_status_str(rc), msg && msg[0] ? ": " : "", msg ? msg : "");
}

/* A weight by canonical name, checked to be [rows, cols]. */
static int find_matrix(tsr_model *m, const char *name, int64_t rows, int64_t cols, int optional,
                       const tsr_tensor **out, tsr_error *err) {
    const tsr_tensor *t = tsr_model_file_tensor(m->file, name);
    *out = NULL;
    if (!t) {
        if (optional) return TSR_OK;
        return tsr_error_set_at(err, TSR_ERR_FORMAT, tsr_model_file_path(m->file), 0, 0,
                                "tensor %s is missing", name);
    }
    int64_t r = t->shape[0], c = t->n_dims > 1 ? t->shape[1] : 1;
    if (t->n_dims > 2 || r != rows || c != cols)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, tsr_model_file_path(m->file), 0, 0,
                                "tensor %s has shape [%lld, %lld], the config implies [%lld, %lld]",
                                name, (long long)r, (long long)c, (long long)rows, (long long)cols);
    *out = t;
    return TSR_OK;
}

/* Page-table entries for the pages of a weight now (at load, or when an
 * expert is prepared), not one fault per 64 KiB of the mapped file inside
 * the first forward pass: on a 1 GB model those were a fifth of a 128-token
 * prefill. Only what is prepared and still read through the mapping is
 * touched: experts left to the file stay unmapped, and a weight the plugin
 * copied (and gave back, weight_done) is not brought in again (nor before:
 * resident memory grows by the plugin's block, not by the whole matrix).
 * A hint: without MADV_POPULATE_READ (Linux 5.14) nothing. */
static void populate(const void *p, uint64_t n) {
#ifdef MADV_POPULATE_READ
    long pg = sysconf(_SC_PAGESIZE);
    if (!p || n == 0 || pg <= 0) return;
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1);
    (void)madvise((void *)a, (size_t)((uintptr_t)p - a + n), MADV_POPULATE_READ);
#else
    (void)p, (void)n;
#endif
}

/* The tsr_weight of t in its role (tsr_weight_role); *sc receives its
 * scales (w.scale points at it) when t is an F8_E4M3 matrix of an FP8
 * checkpoint. */
static tsr_weight weight_of(const tsr_tensor *t, int64_t rows, int64_t cols, uint32_t role, tsr_weight_scale *sc) {
    tsr_weight w = {t->name, t->dtype, rows, cols, t->data, t->nbytes, NULL, role};
    if (t->scale) {
        *sc = (tsr_weight_scale){t->scale, t->scale_block[0], t->scale_block[1]};
        w.scale = sc;
    }
    return w;
}

/* A scaled weight for a gemv plugin that predates tsr_weight.scale: refused
 * here rather than read without its scales. */
static int check_scaled(tsr_model *m, const tsr_weight *w, tsr_error *err) {
    if (!w->scale || tsr_gemv_reads_scales(m->gemv)) return TSR_OK;
    return tsr_error_set(err, TSR_ERR_UNSUPPORTED,
                         "preparing %s (%s with scales): plugin %s implements gemv interface "
                         "version %u, which predates scaled weights (version 3)", w->name,
                         tsr_dtype_name(w->dtype), m->gemv->plugin,
                         ((const uint32_t *)m->gemv->iface)[1]);
}

/* How a matrix is loaded (load_matrix's flags) and what it is. */
enum {
    LOAD_OPTIONAL = 1,  /* may be absent (*out NULL) */
    LOAD_ON_DEMAND = 2, /* prepared when asked for and released again (an expert), not for the model's life */
    LOAD_EXPERT = 4,    /* one expert's projection (TSR_WEIGHT_EXPERT) */
    LOAD_ROUTER = 8,    /* a router or shared expert's gate (TSR_WEIGHT_ROUTER) */
};

/* The tsr_weight_role load flags say. */
static uint32_t role_of(int flags) {
    return flags & LOAD_EXPERT ? TSR_WEIGHT_EXPERT : flags & LOAD_ROUTER ? TSR_WEIGHT_ROUTER : TSR_WEIGHT_DENSE;
}

/* Prepare t through the gemv plugin (flags: LOAD_*); adds its prepared size
 * to *bytes. A weight prepared for the model's life goes through
 * prepare_group (one matrix alone) where the plugin has it, one prepared on
 * demand (LOAD_ON_DEMAND) through
 * prepare (tsr_gemv.h: a plugin may keep the first in its own memory and
 * read the second in place). *gave_back (may be NULL): whether the plugin
 * handed t's pages back (weight_done): it no longer reads the mapping. */
static int prepare(tsr_model *m, const tsr_tensor *t, int flags, void **out, uint64_t *bytes,
                   int *gave_back, tsr_error *err) {
    tsr_weight_scale sc;
    tsr_weight w = weight_of(t, t->n_dims == 1 ? 1 : t->shape[0],
                             t->n_dims > 1 ? t->shape[1] : t->shape[0], role_of(flags), &sc);
    const int on_demand = (flags & LOAD_ON_DEMAND) != 0;
    int rc = check_scaled(m, &w, err);
    if (rc != TSR_OK) {
        *out = NULL;
        return rc;
    }
    const uint64_t dones = atomic_load(&m->weight_dones);
    rc = on_demand ? TSR_ERR_UNSUPPORTED : tsr_gemv_prepare_group(m->gemv, &w, 1, out);
    if (rc == TSR_ERR_UNSUPPORTED) rc = tsr_gemv_prepare(m->gemv, &w, out);
    const int given = atomic_load(&m->weight_dones) != dones;
    if (gave_back) *gave_back = rc == TSR_OK && given;
    if (rc == TSR_OK && m->be->device == TSR_DEVICE_CPU && !given) populate(t->data, t->nbytes);
    if (rc != TSR_OK) {
        *out = NULL;
        char what[300];
        snprintf(what, sizeof what, "preparing %s (%s%s)", t->name, tsr_dtype_name(t->dtype),
                 t->scale ? " with scales" : "");
        return tsr_model_slot_error(m, m->gemv, rc, err, what);
    }
    *bytes += tsr_gemv_bytes(m->gemv, *out, &w);
    return TSR_OK;
}

/* Find [rows, cols] and prepare it (flags: LOAD_*). */
static int load_matrix(tsr_model *m, const char *name, int64_t rows, int64_t cols, int flags,
                       void **out, uint64_t *bytes, tsr_error *err) {
    const tsr_tensor *t;
    *out = NULL;
    int rc = find_matrix(m, name, rows, cols, flags & LOAD_OPTIONAL, &t, err);
    if (rc != TSR_OK || !t) return rc;
    return prepare(m, t, flags, out, bytes, NULL, err);
}

/* Prepare the n matrices names[i] ([rows[i], cols]; flags: LOAD_EXPERT or
 * 0) as one stacked handle when the gemv plugin groups them
 * (TSR_ERR_UNSUPPORTED when it does not, or when they differ in dtype). */
static int load_group(tsr_model *m, const char *const *names, const int64_t *rows, int n, int64_t cols, int flags,
                      void **out, uint64_t *bytes, tsr_error *err) {
    tsr_weight ws[4];
    tsr_weight_scale sc[4];
    TSR_ASSERT(n <= 4);
    *out = NULL;
    for (int i = 0; i < n; i++) {
        const tsr_tensor *t;
        int rc = find_matrix(m, names[i], rows[i], cols, 0, &t, err);
        if (rc != TSR_OK) return rc;
        if (i > 0 && t->dtype != ws[0].dtype) return TSR_ERR_UNSUPPORTED;
        ws[i] = weight_of(t, rows[i], cols, role_of(flags), &sc[i]);
        if ((rc = check_scaled(m, &ws[i], err))) return rc;
    }
    int rc = tsr_gemv_prepare_group(m->gemv, ws, n, out);
    if (rc == TSR_ERR_UNSUPPORTED) return rc;
    if (rc != TSR_OK) {
        *out = NULL;
        char what[300];
        snprintf(what, sizeof what, "preparing %s and %d more as one", names[0], n - 1);
        return tsr_model_slot_error(m, m->gemv, rc, err, what);
    }
    *bytes += tsr_gemv_bytes(m->gemv, *out, NULL);
    return TSR_OK;
}

/* The n matrices stacked into *group where the plugin groups them, else
 * each alone into *each[i] (*group then NULL). */
static int load_stacked(tsr_model *m, const char *const *names, const int64_t *rows, int n, int64_t cols,
                        void **group, void **const *each, tsr_error *err) {
    int rc = load_group(m, names, rows, n, cols, 0, group, &m->weight_bytes_token, err);
    if (rc != TSR_ERR_UNSUPPORTED) return rc;
    for (int i = 0; i < n; i++)
        if ((rc = load_matrix(m, names[i], rows[i], cols, 0, each[i], &m->weight_bytes_token, err))) return rc;
    return TSR_OK;
}

/* A vector of n values widened to f32 (norm weights, biases), in the
 * backend's memory. */
static int load_vector(tsr_model *m, const char *name, int64_t n, int optional, float **out,
                       tsr_error *err) {
    const tsr_tensor *t = tsr_model_file_tensor(m->file, name);
    *out = NULL;
    if (!t) {
        if (optional) return TSR_OK;
        return tsr_error_set_at(err, TSR_ERR_FORMAT, tsr_model_file_path(m->file), 0, 0,
                                "tensor %s is missing", name);
    }
    if (t->n_dims != 1 || t->shape[0] != n)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, tsr_model_file_path(m->file), 0, 0,
                                "tensor %s should be a vector of %lld values", name, (long long)n);
    if (n % tsr_dtype_block_elems(t->dtype) != 0)
        return tsr_error_set(err, TSR_ERR_UNSUPPORTED, "tensor %s: %s vector of %lld values", name,
                             tsr_dtype_name(t->dtype), (long long)n);
    float *host = malloc((size_t)n * sizeof(float));
    if (!host) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory for %s", name);
    tsr_dequant_row(t->dtype, t->data, host, n);
    int rc = TSR_OK;
    if (m->be->device == TSR_DEVICE_CPU) {
        *out = host;
        return TSR_OK;
    }
    if (!(*out = m->be->alloc((size_t)n * sizeof(float), err)))
        rc = err->code;
    else
        rc = m->be->upload(*out, host, (size_t)n * sizeof(float), err);
    free(host);
    return rc;
}

/* Canonical names of one expert's matrices. */
static void expert_names(const tsr_model *m, int layer, int e, char *gate, char *up, char *down,
                         size_t size) {
    if (m->cfg.arch == TSR_ARCH_MIXTRAL) {
        snprintf(gate, size, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", layer, e);
        snprintf(up, size, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", layer, e);
        snprintf(down, size, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", layer, e);
    } else {
        snprintf(gate, size, "model.layers.%d.mlp.experts.%d.gate_proj.weight", layer, e);
        snprintf(up, size, "model.layers.%d.mlp.experts.%d.up_proj.weight", layer, e);
        snprintf(down, size, "model.layers.%d.mlp.experts.%d.down_proj.weight", layer, e);
    }
}

/* tsr_expert_source.load: prepare one expert through the gemv plugin. */
static int expert_load(void *data, int layer, int e, tsr_expert_weights *out, uint64_t *bytes) {
    tsr_model *m = data;
    if (layer < 0 || layer >= m->cfg.n_layers || !m->layers[layer].moe || e < 0 ||
        e >= m->cfg.n_experts)
        return TSR_ERR_INVALID;
    char gn[160], un[160], dn[160];
    expert_names(m, layer, e, gn, un, dn, sizeof gn);
    tsr_error err;
    tsr_error_clear(&err);
    void *g = NULL, *u = NULL, *d = NULL;
    int64_t h = m->cfg.hidden, f = m->cfg.expert_ffn;
    *bytes = 0;
    /* on a device gate and up stacked (run_glu: one launch for both, and
     * SiLU), as prepare would copy them there anyway; the CPU reads an
     * expert's matrices in place */
    int rc = TSR_ERR_UNSUPPORTED;
    if (m->be->device != TSR_DEVICE_CPU) {
        const char *const gu_names[] = {gn, un};
        const int64_t gu_rows[] = {f, f};
        rc = load_group(m, gu_names, gu_rows, 2, h, LOAD_EXPERT, &g, bytes, &err);
    }
    const int ex = LOAD_ON_DEMAND | LOAD_EXPERT;
    if (rc == TSR_ERR_UNSUPPORTED) {
        rc = load_matrix(m, gn, f, h, ex, &g, bytes, &err);
        if (rc == TSR_OK) rc = load_matrix(m, un, f, h, ex, &u, bytes, &err);
    }
    if (rc == TSR_OK) rc = load_matrix(m, dn, h, f, ex, &d, bytes, &err);
    if (rc != TSR_OK) {
        fprintf(stderr, "tessera: expert %d of layer %d: %s\n", e, layer, err.msg);
        tsr_gemv_release(m->gemv, g);
        tsr_gemv_release(m->gemv, u);
        tsr_gemv_release(m->gemv, d);
        return rc;
    }
    out->gate = g;
    out->up = u;
    out->down = d;
    return TSR_OK;
}

static void expert_unload(void *data, int layer, int e, tsr_expert_weights *w) {
    tsr_model *m = data;
    (void)layer;
    (void)e;
    tsr_gemv_release(m->gemv, (void *)w->gate);
    tsr_gemv_release(m->gemv, (void *)w->up);
    tsr_gemv_release(m->gemv, (void *)w->down);
    memset(w, 0, sizeof *w);
}

/* Whether this engine may choose experts on the device: a device backend,
 * an expert cache that keeps every expert resident, a gemv plugin with
 * run_experts (slots/tsr_expert_cache.h, tsr_gemv.h). */
static int experts_on_device(const tsr_model *m) {
    return m->be->device != TSR_DEVICE_CPU && m->be->combine_experts &&
           TSR_SLOT_MEMBER(m->experts, tsr_expert_cache_i, resident) &&
           TSR_SLOT_MEMBER(m->gemv, tsr_gemv_i, run_experts);
}

static void free_expert_tables(tsr_model *m) {
    if (!m->ex_tables) return;
    for (int i = 0; i < 2 * m->cfg.n_layers; i++) tsr_gemv_release_experts(m->gemv, m->ex_tables[i]);
    free(m->ex_tables);
    m->ex_tables = NULL;
}

/* The expert cache's answers to resident, once a MoE layer: m->ex_resident
 * (every layer answered: the cache keeps every expert for its life, and a
 * lookup never releases one) and, where this engine may choose experts on
 * the device (experts_on_device), m->ex_tables: each MoE layer's gate/up
 * pairs and downs as tables of the gemv plugin. No tables (still TSR_OK)
 * where the cache or the plugin declines, or the experts' gate and up are
 * not stacked; an error from either only fails the load where tables are
 * wanted. */
static int expert_residency(tsr_model *m, tsr_error *err) {
    const int E = m->cfg.n_experts, n_layers = m->cfg.n_layers;
    int tables = experts_on_device(m);
    const tsr_expert_weights **ew = calloc((size_t)E, sizeof *ew);
    const void **gu = calloc((size_t)E, sizeof *gu), **dn = calloc((size_t)E, sizeof *dn);
    int rc = ew && gu && dn && (!tables || (m->ex_tables = calloc(2 * (size_t)n_layers, sizeof *m->ex_tables)))
                 ? TSR_OK
                 : tsr_error_set(err, TSR_ERR_NOMEM, "out of memory for expert tables");
    m->ex_resident = rc == TSR_OK;
    for (int l = 0; rc == TSR_OK && m->ex_resident && l < n_layers; l++) {
        if (!m->layers[l].moe) continue;
        int r = tsr_expert_resident(m->experts, l, ew);
        if (r != TSR_OK) {
            m->ex_resident = 0;
            if (tables && r != TSR_ERR_UNSUPPORTED)
                rc = tsr_model_slot_error(m, m->experts, r, err, "the resident experts");
            break;
        }
        if (!tables) continue;
        for (int e = 0; r == TSR_OK && e < E; e++) {
            if (ew[e]->up) r = TSR_ERR_UNSUPPORTED; /* gate and up apart: no run_experts pairs */
            gu[e] = ew[e]->gate;
            dn[e] = ew[e]->down;
        }
        if (r == TSR_OK) r = tsr_gemv_prepare_experts(m->gemv, gu, E, &m->ex_tables[2 * l]);
        if (r == TSR_OK) r = tsr_gemv_prepare_experts(m->gemv, dn, E, &m->ex_tables[2 * l + 1]);
        if (r == TSR_ERR_UNSUPPORTED) {
            free_expert_tables(m);
            tables = 0;
        } else if (r != TSR_OK) {
            rc = tsr_model_slot_error(m, m->gemv, r, err, "preparing the expert tables");
        }
    }
    if (rc != TSR_OK || !m->ex_resident) free_expert_tables(m);
    free(ew);
    free(gu);
    free(dn);
    return rc;
}

static int load_layer(tsr_model *m, int l, tsr_error *err) {
    const tsr_model_config *c = &m->cfg;
    tsr_layer_w *L = &m->layers[l];
    char n[200];
    const int64_t h = c->hidden, qd = (int64_t)c->n_heads * c->head_dim,
                  kvd = (int64_t)c->n_kv_heads * c->head_dim;
    int rc;
#define NAME(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
    if ((rc = load_vector(m, NAME("input_layernorm.weight"), h, 0, &L->attn_norm, err))) return rc;
    if ((rc = load_vector(m, NAME("post_attention_layernorm.weight"), h, 0, &L->ffn_norm, err)))
        return rc;
    char qn[200], kn[200], vn[200];
    snprintf(qn, sizeof qn, "model.layers.%d.self_attn.q_proj.weight", l);
    snprintf(kn, sizeof kn, "model.layers.%d.self_attn.k_proj.weight", l);
    snprintf(vn, sizeof vn, "model.layers.%d.self_attn.v_proj.weight", l);
    const char *qkv_names[] = {qn, kn, vn};
    const int64_t qkv_rows[] = {qd, kvd, kvd};
    void **qkv_each[] = {&L->wq, &L->wk, &L->wv};
    if ((rc = load_stacked(m, qkv_names, qkv_rows, 3, h, &L->wqkv, qkv_each, err))) return rc;
    if ((rc = load_matrix(m, NAME("self_attn.o_proj.weight"), h, qd, 0, &L->wo, &m->weight_bytes_token, err))) return rc;
    if (c->attn_bias) {
        if ((rc = load_vector(m, NAME("self_attn.q_proj.bias"), qd, 0, &L->bq, err))) return rc;
        if ((rc = load_vector(m, NAME("self_attn.k_proj.bias"), kvd, 0, &L->bk, err))) return rc;
        if ((rc = load_vector(m, NAME("self_attn.v_proj.bias"), kvd, 0, &L->bv, err))) return rc;
    }
    if (c->attn_out_bias &&
        (rc = load_vector(m, NAME("self_attn.o_proj.bias"), h, 0, &L->bo, err)))
        return rc;
    if (c->qk_norm) {
        if ((rc = load_vector(m, NAME("self_attn.q_norm.weight"), c->head_dim, 0, &L->q_norm, err)))
            return rc;
        if ((rc = load_vector(m, NAME("self_attn.k_norm.weight"), c->head_dim, 0, &L->k_norm, err)))
            return rc;
    }
    L->moe = c->n_experts > 0 && c->layer_moe[l];
    if (!L->moe) {
        char gn[200], un[200];
        snprintf(gn, sizeof gn, "model.layers.%d.mlp.gate_proj.weight", l);
        snprintf(un, sizeof un, "model.layers.%d.mlp.up_proj.weight", l);
        const char *gu_names[] = {gn, un};
        const int64_t gu_rows[] = {c->ffn, c->ffn};
        void **gu_each[] = {&L->w_gate, &L->w_up};
        if ((rc = load_stacked(m, gu_names, gu_rows, 2, h, &L->w_gu, gu_each, err))) return rc;
        if ((rc = load_matrix(m, NAME("mlp.down_proj.weight"), h, c->ffn, 0, &L->w_down, &m->weight_bytes_token, err)))
            return rc;
    } else {
        const char *router = c->arch == TSR_ARCH_MIXTRAL ? "block_sparse_moe.gate.weight"
                                                         : "mlp.gate.weight";
        snprintf(n, sizeof n, "model.layers.%d.%s", l, router);
        if ((rc = load_matrix(m, n, c->n_experts, h, LOAD_ROUTER, &L->w_router, &m->weight_bytes_token, err)))
            return rc;
        if (c->shared_expert_ffn > 0) {
            const int64_t sf = c->shared_expert_ffn;
            if ((rc = load_matrix(m, NAME("mlp.shared_expert.gate_proj.weight"), sf, h, 0,
                                  &L->sh_gate, &m->weight_bytes_token, err)))
                return rc;
            if ((rc = load_matrix(m, NAME("mlp.shared_expert.up_proj.weight"), sf, h, 0, &L->sh_up,
                                  &m->weight_bytes_token, err)))
                return rc;
            if ((rc = load_matrix(m, NAME("mlp.shared_expert.down_proj.weight"), h, sf, 0,
                                  &L->sh_down, &m->weight_bytes_token, err)))
                return rc;
            if ((rc = load_matrix(m, NAME("mlp.shared_expert_gate.weight"), 1, h, LOAD_ROUTER, &L->sh_router,
                                  &m->weight_bytes_token, err)))
                return rc;
        }
        /* experts read per token: n_experts_used of them, at the stored size */
        char gn[160], un[160], dn[160];
        expert_names(m, l, 0, gn, un, dn, sizeof gn);
        const tsr_tensor *tg = tsr_model_file_tensor(m->file, gn);
        const tsr_tensor *tu = tsr_model_file_tensor(m->file, un);
        const tsr_tensor *td = tsr_model_file_tensor(m->file, dn);
        if (!tg || !tu || !td)
            return tsr_error_set_at(err, TSR_ERR_FORMAT, tsr_model_file_path(m->file), 0, 0,
                                    "tensor %s is missing", !tg ? gn : !tu ? un : dn);
        m->weight_bytes_token += (uint64_t)c->n_experts_used * (tg->nbytes + tu->nbytes + td->nbytes);
    }
#undef NAME
    return TSR_OK;
}

static void free_layer(tsr_model *m, tsr_layer_w *L) {
    float *vecs[] = {L->attn_norm, L->ffn_norm, L->q_norm, L->k_norm, L->bq, L->bk, L->bv, L->bo};
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
        if (vecs[i]) m->be->free(vecs[i]);
    void *mats[] = {L->wq,     L->wk,      L->wv,    L->wo,    L->w_gate,  L->w_up, L->w_down,
                    L->w_router, L->sh_gate, L->sh_up, L->sh_down, L->sh_router, L->wqkv, L->w_gu};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) tsr_gemv_release(m->gemv, mats[i]);
}

int tsr_model_alloc_scratch(tsr_model *m, tsr_error *err) {
    const tsr_model_config *c = &m->cfg;
    const tsr_backend *be = m->be;
    const size_t R = (size_t)m->chunk, h = (size_t)c->hidden,
                 qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t f = (size_t)c->ffn;
    if ((size_t)c->expert_ffn > f) f = (size_t)c->expert_ffn;
    if ((size_t)c->shared_expert_ffn > f) f = (size_t)c->shared_expert_ffn;
    if (f == 0) f = 1;
    float **dev[] = {&m->x, &m->xn, &m->q, &m->k, &m->v, &m->att, &m->o, &m->g, &m->u};
    size_t dev_sizes[] = {R * h, R * h, R * qd, R * kvd, R * kvd, R * qd, R * h, R * f, R * f};
    for (size_t i = 0; i < sizeof dev_sizes / sizeof dev_sizes[0]; i++)
        if (!(*dev[i] = be->alloc(dev_sizes[i] * sizeof(float), err))) return err->code;
    int grouped_qkv = 0, grouped_gu = 0;
    for (int l = 0; l < c->n_layers; l++) {
        grouped_qkv |= m->layers[l].wqkv != NULL;
        grouped_gu |= m->layers[l].w_gu != NULL;
    }
    if (grouped_qkv && !(m->qkv = be->alloc(R * (qd + 2 * kvd) * sizeof(float), err))) return err->code;
    grouped_gu |= c->n_experts > 0 && be->device != TSR_DEVICE_CPU; /* experts' gate/up (expert_load) */
    if (grouped_gu && !(m->gu = be->alloc(R * 2 * f * sizeof(float), err))) return err->code;
    /* inputs: the step then the ids, in backend memory and staged on the host */
    const size_t io_bytes = sizeof(tsr_step) + R * sizeof(int32_t);
    if (!(m->io = be->alloc(io_bytes, err)) || !(m->io_host = be->host_alloc(io_bytes, err)))
        return err->code;
    m->ids = (int32_t *)((char *)m->io + sizeof(tsr_step));
    /* outputs: the head's logits, and argmax ids, of up to TSR_GRAPH_MAX_ROWS rows
     * (the CPU writes logits straight into the caller's buffer, or here for argmax) */
    const size_t lrows = be->device != TSR_DEVICE_CPU ? R : TSR_GRAPH_MAX_ROWS;
    if (!(m->logits_dev = be->alloc(lrows * (size_t)c->vocab * sizeof(float), err)) ||
        !(m->argmax_dev = be->alloc(R * sizeof(int32_t), err)))
        return err->code;
    if (be->device != TSR_DEVICE_CPU &&
        !(m->out_host = be->host_alloc(TSR_GRAPH_MAX_ROWS * (size_t)c->vocab * sizeof(float), err)))
        return err->code;
    if (m->embed_read) { /* the rows a chunk looks up, read from the file (forward.c) */
        if (!(m->embed_rows = malloc(R * (size_t)m->embed_read)) ||
            !(m->embed_iota = malloc(R * sizeof(int32_t))))
            return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory for scratch");
        for (size_t i = 0; i < R; i++) m->embed_iota[i] = (int32_t)i;
    }
    if (c->n_experts == 0) return TSR_OK;
    const size_t E = (size_t)c->n_experts, K = c->n_experts_used > 0 ? (size_t)c->n_experts_used : 1;
    void **moe_dev[] = {(void **)&m->router, (void **)&m->moe_out, (void **)&m->ex_in, (void **)&m->ex_g,
                        (void **)&m->ex_u, (void **)&m->ex_d, (void **)&m->sh_gate_out, (void **)&m->route_idx,
                        (void **)&m->route_w, (void **)&m->ex_rows, (void **)&m->ex_wts};
    const size_t moe_floats[] = {R * E, R * h, R * h, R * f, R * f, R * h, R, R * K, R * K, R * K, R * K};
    for (size_t i = 0; i < sizeof moe_floats / sizeof moe_floats[0]; i++) /* int32 and float alike 4 bytes */
        if (!(*moe_dev[i] = be->alloc(moe_floats[i] * sizeof(float), err))) return err->code;
    if (m->ex_tables && TSR_SLOT_MEMBER(m->gemv, tsr_gemv_i, run_grouped)) { /* forward.c moe_grouped */
        float **gx[] = {&m->gx_in, &m->gx_g, &m->gx_d};
        const size_t gx_floats[] = {R * K * h, R * K * (size_t)c->expert_ffn, R * K * h};
        for (size_t i = 0; i < 3; i++)
            if (!(*gx[i] = be->alloc(gx_floats[i] * sizeof(float), err))) return err->code;
        if (!(m->ex_pos = be->alloc(R * K * sizeof(int32_t), err))) return err->code;
        if (!(m->ex_pos_h = calloc(R * K, sizeof(int32_t))))
            return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory for scratch");
    }
    m->route_idx_h = calloc(R * K, sizeof(int32_t));
    m->ex_rows_h = calloc(R * K, sizeof(int32_t));
    m->route_w_h = calloc(R * K, sizeof(float));
    m->ex_wts_h = calloc(R * K, sizeof(float));
    if (!m->route_idx_h || !m->ex_rows_h || !m->route_w_h || !m->ex_wts_h)
        return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory for scratch");
    return TSR_OK;
}

static void fill_desc(tsr_model *m) {
    const tsr_model_config *c = &m->cfg;
    tsr_model_desc *d = &m->desc;
    d->arch = c->arch_name;
    d->n_layers = c->n_layers;
    d->hidden = c->hidden;
    d->n_heads = c->n_heads;
    d->n_kv_heads = c->n_kv_heads;
    d->head_dim = c->head_dim;
    d->ffn = c->ffn;
    d->vocab = c->vocab;
    d->max_ctx = m->ctx;
    d->n_experts = c->n_experts;
    d->n_experts_used = c->n_experts_used;
    d->expert_ffn = c->expert_ffn;
    d->weight_dtype = c->dtype;
}

/* On a device: a prefill-sized pass and a decode pass of a throwaway
 * sequence at load, so that what a first pass does once (loading kernels,
 * planning and timing the GEMMs of that size) is load time, not the first
 * request's. */
static int warm_up(tsr_model *m, tsr_error *err) {
    const int n = m->chunk < m->ctx - 1 ? m->chunk : m->ctx - 1;
    if (n < 1) return TSR_OK;
    int32_t *ids = calloc((size_t)n + 1, sizeof *ids); /* token 0: any id would do */
    if (!ids) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    tsr_seq *s = NULL;
    int32_t choice;
    int rc = tsr_seq_new(m, n + 1, &s, err);
    if (rc == TSR_OK) rc = tsr_seq_forward_greedy(s, ids, n, &choice, 0, err);
    if (rc == TSR_OK) rc = tsr_seq_forward_greedy(s, ids + n, 1, &choice, 0, err);
    tsr_seq_free(s);
    free(ids);
    return rc;
}

int tsr_model_load(const tsr_model_opts *o, tsr_model **out, tsr_error *err) {
    double t0 = tsr_now_seconds();
    char default_model[4096], default_asm[4096];
    const char *model_path = o->model_path, *asm_path = o->assembly_path;
    if (!model_path) {
        snprintf(default_model, sizeof default_model, "%s/models/stories260K/stories260K.gguf",
                 source_dir());
        model_path = default_model;
    }
    if (!asm_path) {
        snprintf(default_asm, sizeof default_asm, "%s/assemblies/cpu-reference.yaml", source_dir());
        asm_path = default_asm;
    }
    *out = NULL;
    tsr_model *m = calloc(1, sizeof *m);
    if (!m) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    int rc = tsr_model_file_open(model_path, &m->file, err);
    if (rc != TSR_OK) goto fail;
    m->cfg = *tsr_model_file_config(m->file);
    const tsr_model_config *c = &m->cfg;
    m->ctx = o->max_ctx > 0 ? o->max_ctx : c->max_ctx;
    if (m->ctx <= 0) m->ctx = 2048;
    m->chunk = TSR_FORWARD_CHUNK;
    fill_desc(m);

    tsr_engine_opts eo = {.catalog_dir = o->catalog_dir, .n_threads = o->n_threads};
    rc = tsr_engine_open(asm_path, &m->cfg, &m->desc, &eo, &m->engine, err);
    if (rc != TSR_OK) goto fail;
    m->n_threads = o->n_threads;
    if (o->catalog_dir && !(m->catalog_dir = strdup(o->catalog_dir))) {
        rc = tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
        goto fail;
    }
    tsr_model_lend_models(m);
    m->gemv = tsr_engine_slot(m->engine, TSR_SLOT_GEMV);
    m->attn = tsr_engine_slot(m->engine, TSR_SLOT_ATTENTION);
    m->kv = tsr_engine_slot(m->engine, TSR_SLOT_KV_CACHE);
    m->drafter = tsr_engine_slot(m->engine, TSR_SLOT_DRAFTER);
    m->experts = tsr_engine_slot(m->engine, TSR_SLOT_EXPERT_CACHE);
    m->ex.device = tsr_engine_device(m->engine);
    m->ex.n_threads = tsr_threadpool_size(tsr_engine_pool(m->engine));
    m->be = m->ex.device == TSR_DEVICE_CUDA ? tsr_backend_cuda() : tsr_backend_cpu();
    if (!m->be) {
        rc = tsr_error_set(err, TSR_ERR_UNSUPPORTED,
                           "assembly %s runs on cuda, but this tessera was built without CUDA", asm_path);
        goto fail;
    }
    m->ex.stream = m->be->stream ? m->be->stream() : NULL;
    m->graphs_on = tsr_engine_runtime(m->engine, TSR_RT_CUDA_GRAPHS) && !o->profile;
    m->ex.pdl = tsr_engine_runtime(m->engine, TSR_RT_PDL) && m->be->set_pdl;
    m->host_sampling = o->host_sampling;
    m->pipeline_on = tsr_engine_runtime(m->engine, TSR_RT_PIPELINE) || o->force_pipeline;
    if (o->profile && !(m->prof = calloc(2, sizeof *m->prof))) {
        rc = tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (c->n_experts > 0 && tsr_engine_runtime(m->engine, TSR_RT_CUDA_GRAPHS) && !experts_on_device(m)) {
        const int resident = TSR_SLOT_MEMBER(m->experts, tsr_expert_cache_i, resident) != NULL;
        rc = tsr_error_set(err, TSR_ERR_UNSUPPORTED,
                           "assembly %s: runtime.cuda_graphs cannot capture this mixture-of-experts model's "
                           "passes (%s): %s plugin %s %s, so the host would look each layer's experts up; a graph "
                           "needs every expert resident (expert_resident) and a gemv plugin that chooses them on "
                           "the device (run_experts: cuda_gemv, cuda_gemv_fp8); or set runtime.cuda_graphs: false "
                           "(assemblies/cuda-moe.yaml)",
                           asm_path, c->arch_name, resident ? "gemv" : "expert_cache",
                           resident ? m->gemv->plugin : m->experts->plugin,
                           resident ? "cannot choose experts on the device" : "does not keep every expert resident");
        goto fail;
    }

    if (!o->no_tokenizer) {
        rc = tsr_tokenizer_load_for_model(m->file, o->tokenizer_path, &m->tok, err);
        if (rc != TSR_OK) goto fail;
    }

    if (tsr_rope_init(&m->rope, c->head_dim, c->rope_theta, c->rope_interleaved,
                      (int)c->rope_scaling, c->rope_factor, c->rope_low_freq_factor,
                      c->rope_high_freq_factor, c->rope_orig_ctx) != 0) {
        rc = tsr_error_set(err, TSR_ERR_UNSUPPORTED, "head_dim %d is not supported by RoPE",
                           c->head_dim);
        goto fail;
    }
    m->embed = tsr_model_file_tensor(m->file, "model.embed_tokens.weight");
    if (!m->embed || m->embed->n_dims != 2 || m->embed->shape[0] != c->vocab ||
        m->embed->shape[1] != c->hidden) {
        rc = tsr_error_set_at(err, TSR_ERR_FORMAT, tsr_model_file_path(m->file), 0, 0,
                              "tensor model.embed_tokens.weight is missing or not [%d, %d]",
                              c->vocab, c->hidden);
        goto fail;
    }
    if (m->embed->scale) { /* the lookup reads rows as stored */
        rc = tsr_error_set(err, TSR_ERR_UNSUPPORTED,
                           "tensor model.embed_tokens.weight: F8_E4M3 embeddings with scales are not "
                           "read (FP8 checkpoints keep them in bf16; only projections are read as FP8)");
        goto fail;
    }
    if ((rc = load_vector(m, "model.norm.weight", c->hidden, 0, &m->final_norm, err))) goto fail;
    m->embed_data = m->embed->data;
    if (m->be->device != TSR_DEVICE_CPU) { /* the table and RoPE frequencies on the device */
        if (!(m->embed_copy = m->be->alloc(m->embed->nbytes, err)) ||
            m->be->upload(m->embed_copy, m->embed->data, m->embed->nbytes, err) != TSR_OK ||
            !(m->inv_freq = m->be->alloc(sizeof m->rope.inv_freq, err)) ||
            m->be->upload(m->inv_freq, m->rope.inv_freq, sizeof m->rope.inv_freq, err) != TSR_OK) {
            rc = err->code;
            goto fail;
        }
        m->embed_data = m->embed_copy;
    }
    if (c->tie_embeddings) {
        int gave_back;
        rc = prepare(m, m->embed, 0, &m->lm_head, &m->weight_bytes_token, &gave_back, err);
        /* the plugin copied the head and gave the table's pages back: the
         * lookup reads its rows from the file instead of faulting them in */
        if (rc == TSR_OK && gave_back && m->be->device == TSR_DEVICE_CPU &&
            tsr_dtype_row_bytes(m->embed->dtype, c->hidden, &m->embed_read) != 0)
            m->embed_read = 0;
    } else
        rc = load_matrix(m, "lm_head.weight", c->vocab, c->hidden, 0, &m->lm_head,
                         &m->weight_bytes_token, err);
    if (rc != TSR_OK) goto fail;

    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        rc = tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* a counter rewritten in place on a terminal; one line when done elsewhere
     * (a log or a pipe, where the rewrites would run together) */
    const int show = o->progress && tsr_model_file_bytes(m->file) > (64u << 20), tty = show && isatty(STDERR_FILENO);
    for (int l = 0; l < c->n_layers; l++) {
        if ((rc = load_layer(m, l, err))) goto fail;
        if (tty) fprintf(stderr, "\rtessera: loading layer %d/%d", l + 1, c->n_layers);
    }
    if (tty) fprintf(stderr, "\n");
    else if (show) fprintf(stderr, "tessera: loaded %d layers\n", c->n_layers);
    if (c->n_experts > 0) {
        m->esrc = (tsr_expert_source){c->n_layers, c->n_experts, m, expert_load, expert_unload};
        rc = tsr_expert_attach(m->experts, &m->esrc);
        if (rc != TSR_OK) {
            tsr_model_slot_error(m, m->experts, rc, err, "attaching the experts");
            goto fail;
        }
        if ((rc = expert_residency(m, err)) != TSR_OK) goto fail;
        if (!m->ex_tables && tsr_engine_runtime(m->engine, TSR_RT_CUDA_GRAPHS)) {
            rc = tsr_error_set(err, TSR_ERR_UNSUPPORTED,
                               "assembly %s: runtime.cuda_graphs: plugin %s declined to choose this model's "
                               "experts on the device (prepare_experts), so its passes cannot be captured; set "
                               "runtime.cuda_graphs: false",
                               asm_path, m->gemv->plugin);
            goto fail;
        }
    }
    /* a GPU wants whole prompts per pass; the CPU's caches want moderate chunks */
    if (m->be->device != TSR_DEVICE_CPU) m->chunk = 512;
    if ((rc = tsr_model_alloc_scratch(m, err))) goto fail;
    if (m->be->device != TSR_DEVICE_CPU && (rc = warm_up(m, err))) goto fail;
    if (m->prof) memset(m->prof, 0, 2 * sizeof *m->prof);
    m->load_seconds = tsr_now_seconds() - t0;
    *out = m;
    return TSR_OK;
fail:
    tsr_model_free(m);
    return rc;
}

void tsr_model_free_scratch(tsr_model *m) {
    tsr_graphs_free(m);
    tsr_pipes_free(m);
    void *dev[] = {m->x,        m->xn,         m->q,     m->k,       m->v,       m->att,       m->o,
                   m->g,        m->u,          m->logits_dev, m->qkv, m->gu,     m->io,        m->argmax_dev,
                   m->router,   m->moe_out,    m->ex_in, m->ex_g,    m->ex_u,    m->ex_d,      m->sh_gate_out,
                   m->route_idx, m->route_w,   m->ex_rows, m->ex_wts,    m->gx_in,   m->gx_g,      m->gx_d,
                   m->ex_pos};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) m->be->free(dev[i]);
    void *host_io[] = {m->io_host, m->out_host};
    for (size_t i = 0; i < sizeof host_io / sizeof host_io[0]; i++)
        if (host_io[i]) m->be->host_free(host_io[i]);
    free(m->route_idx_h);
    free(m->ex_rows_h);
    free(m->route_w_h);
    free(m->ex_wts_h);
    free(m->ex_pos_h);
    free(m->embed_rows);
    free(m->embed_iota);
}

void tsr_model_free(tsr_model *m) {
    if (!m) return;
    if (m->is_view) {
        tsr_model_free_scratch(m);
        free(m);
        return;
    }
    /* the engine (and with it the expert cache) goes before the weights it borrows */
    if (m->engine) {
        free_expert_tables(m);
        if (m->layers)
            for (int l = 0; l < m->cfg.n_layers; l++) free_layer(m, &m->layers[l]);
        if (m->gemv) tsr_gemv_release(m->gemv, m->lm_head);
    }
    tsr_engine_free(m->engine);
    free(m->layers);
    if (m->be) {
        if (m->final_norm) m->be->free(m->final_norm);
        if (m->embed_copy) m->be->free(m->embed_copy);
        if (m->inv_freq) m->be->free(m->inv_freq);
        tsr_model_free_scratch(m);
    }
    free(m->catalog_dir);
    free(m->prof);
    tsr_tokenizer_free(m->tok);
    tsr_model_file_close(m->file);
    free(m);
}

const tsr_model_config *tsr_model_get_config(const tsr_model *m) { return &m->cfg; }
const tsr_tokenizer *tsr_model_get_tokenizer(const tsr_model *m) { return m->tok; }
tsr_engine *tsr_model_get_engine(const tsr_model *m) { return m->engine; }
int tsr_model_ctx(const tsr_model *m) { return m->ctx; }
double tsr_model_load_seconds(const tsr_model *m) { return m->load_seconds; }
uint64_t tsr_model_weight_bytes_per_token(const tsr_model *m) { return m->weight_bytes_token; }

void tsr_model_profile_print(const tsr_model *m, FILE *f) {
    if (!m->prof) return;
    static const char *phase[2] = {"prefill", "decode"};
    for (int p = 0; p < 2; p++) {
        double total = 0;
        for (int k = 0; k < TSR_PROF_KINDS; k++) total += m->prof[p].seconds[k];
        if (total <= 0) continue;
        fprintf(f, "profile of %s passes (each op waited for): %.3f s\n", phase[p], total);
        for (int k = 0; k < TSR_PROF_KINDS; k++)
            if (m->prof[p].calls[k])
                fprintf(f, "  %-10s %9.3f ms %5.1f%%  %8lld calls  %8.1f us/call\n", tsr_prof_names[k],
                        m->prof[p].seconds[k] * 1e3, 100 * m->prof[p].seconds[k] / total,
                        (long long)m->prof[p].calls[k], m->prof[p].seconds[k] * 1e6 / (double)m->prof[p].calls[k]);
    }
}

void tsr_model_profile_reset(tsr_model *m) {
    if (m->prof) memset(m->prof, 0, 2 * sizeof *m->prof);
}

void tsr_model_graph_stats(const tsr_model *m, uint64_t *captures, uint64_t *replays) {
    *captures = m->graph_captures;
    *replays = m->graph_replays;
}

void tsr_model_kv_usage(const tsr_model *m, uint64_t *used, uint64_t *capacity) {
    tsr_kv_usage(m->kv, used, capacity);
}
