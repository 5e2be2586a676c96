/*
 * conf_gemv.c - gemv cases: every weight dtype x shape x row count (decode,
 * verification, prefill), one case per dtype with NaN and Inf in x; output
 * guarded, inputs checked untouched, NMSE against ref_gemv; E4M3 weights
 * with FP8 checkpoints' scales (per tensor, per row, 32 x 128 blocks:
 * tsr_weight_scale), which a plugin may refuse (reported unsupported: no
 * manifest field declares them). Plugins with
 * prepare_group: three matrices stacked, against the reference's products
 * of each alone; with run_glu: a gate/up pair, against silu(gate) * up of
 * the reference's products.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf_cases.h"
#include "kernels/dtype.h"

#define GEMV_TOL_EXACT 1e-7 /* ggml's mul_mat bound: f32 sums in another order */
#define GEMV_TOL_LOSSY 5e-3

static const struct { int out, in; } shapes[] = {{16, 256}, {67, 512}, {160, 768}};
static const int row_counts[] = {1, 5, 64};
static const uint32_t dtypes[] = {TSR_DTYPE_F32,  TSR_DTYPE_F16,  TSR_DTYPE_BF16, TSR_DTYPE_F8_E4M3, TSR_DTYPE_I8,
                                  TSR_DTYPE_Q8_0, TSR_DTYPE_Q4_0, TSR_DTYPE_Q4_K, TSR_DTYPE_Q6_K};

static void put_f16(unsigned char *p, float v) {
    uint16_t h = tsr_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* Random stored weights of dtype, with finite block scales. */
static unsigned char *make_weights(uint32_t dt, int out, int in, uint64_t *rng, uint64_t *nbytes) {
    uint64_t row;
    if (tsr_dtype_row_bytes(dt, in, &row)) return NULL;
    *nbytes = row * (uint64_t)out;
    unsigned char *w = malloc(*nbytes);
    if (!w) return NULL;
    for (uint64_t i = 0; i < *nbytes; i++) w[i] = (unsigned char)(conf_rand(rng) >> 56);
    int64_t n = (int64_t)out * in;
    switch (dt) {
    case TSR_DTYPE_F32:
        for (int64_t i = 0; i < n; i++) ((float *)w)[i] = 0.5f * conf_randf(rng);
        break;
    case TSR_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)w)[i] = tsr_f32_to_f16(0.5f * conf_randf(rng));
        break;
    case TSR_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)w)[i] = tsr_f32_to_bf16(0.5f * conf_randf(rng));
        break;
    case TSR_DTYPE_F8_E4M3:
        for (int64_t i = 0; i < n; i++)
            if ((w[i] & 0x7F) == 0x7F) w[i] &= 0xF0; /* 0x7F and 0xFF are NaN */
        break;
    case TSR_DTYPE_Q8_0:
    case TSR_DTYPE_Q4_0: {
        int bb = tsr_dtype_block_bytes(dt);
        for (uint64_t b = 0; b < *nbytes / (uint64_t)bb; b++) put_f16(w + b * bb, 0.002f + 0.01f * fabsf(conf_randf(rng)));
        break;
    }
    case TSR_DTYPE_Q4_K:
        for (uint64_t b = 0; b < *nbytes / 144; b++) {
            put_f16(w + b * 144, 0.001f + 0.004f * fabsf(conf_randf(rng)));
            put_f16(w + b * 144 + 2, 0.001f + 0.004f * fabsf(conf_randf(rng)));
        }
        break;
    case TSR_DTYPE_Q6_K:
        for (uint64_t b = 0; b < *nbytes / 210; b++) put_f16(w + b * 210 + 208, 0.0005f + 0.002f * fabsf(conf_randf(rng)));
        break;
    default: break;
    }
    return w;
}

static int declares_dtype(const tsr_manifest *m, uint32_t dt) {
    const tsr_mcap *c = tsr_manifest_provides(m, "weight_dtypes");
    for (int i = 0; c && i < c->n_values; i++)
        if (!strcmp(c->values[i], tsr_dtype_name(dt))) return 1;
    return 0;
}

static int64_t max_rows(const tsr_manifest *m) {
    const tsr_mcap *c = tsr_manifest_provides(m, "max_rows");
    return c && c->n_values == 1 && c->values[0][0] != '$' ? strtoll(c->values[0], NULL, 10) : 0;
}

typedef struct gemv_pair {
    conf_inst *ci, *ref;
} gemv_pair;

static int gemv_run(conf_inst *ci, const void *h, int rows, const float *x, float *y) {
    tsr_exec ex = {.device = TSR_DEVICE_CPU, .n_threads = 2};
    return CONF_MEMBER(ci, tsr_gemv_i, run)(CONF_INST(ci), h, rows, x, y, &ex);
}

static void release(conf_inst *ci, void *h) {
    void (*rel)(void *, void *) = CONF_MEMBER(ci, tsr_gemv_i, release);
    if (rel && h) rel(CONF_INST(ci), h);
}

/* One weight, every row count (and the non-finite case when nonfinite);
 * with sc, its scales (label names them). */
static void weight_cases(conf_env *env, gemv_pair *p, uint32_t dt, int out, int in, int nonfinite,
                         const tsr_weight_scale *sc, const char *label, uint64_t *rng) {
    char what[160];
    uint64_t nbytes;
    unsigned char *wb = make_weights(dt, out, in, rng, &nbytes);
    if (!wb) {
        snprintf(what, sizeof what, "gemv %dx%d %s", out, in, tsr_dtype_name(dt));
        conf_report(env, CONF_FAIL, what, "harness: no memory for the weights");
        return;
    }
    unsigned char *wcopy = malloc(nbytes);
    memcpy(wcopy, wb, nbytes);
    tsr_weight w = {"conf.weight", dt, out, in, wb, nbytes, sc, TSR_WEIGHT_DENSE};
    void *h = NULL, *rh = NULL;
    snprintf(what, sizeof what, "gemv prepare %dx%d %s%s", out, in, tsr_dtype_name(dt), label);
    int rc = CONF_MEMBER(p->ref, tsr_gemv_i, prepare)(CONF_INST(p->ref), &w, &rh);
    if (rc != TSR_OK) {
        conf_report(env, CONF_FAIL, what, "reference refused it: %s", p->ref->err);
        goto out;
    }
    p->ci->err[0] = '\0';
    if (sc && ((const tsr_gemv_i *)p->ci->ref.iface)->version < 3) { /* the host never hands it scales */
        conf_report(env, CONF_UNSUPPORTED, what, "gemv interface version %u: no scales",
                    ((const tsr_gemv_i *)p->ci->ref.iface)->version);
        goto out;
    }
    rc = CONF_MEMBER(p->ci, tsr_gemv_i, prepare)(CONF_INST(p->ci), &w, &h);
    if (rc == TSR_ERR_UNSUPPORTED) {
        if (declares_dtype(env->m, dt) && !sc)
            conf_report(env, CONF_FAIL, what, "refused a dtype its manifest's weight_dtypes lists: %s", p->ci->err);
        else
            conf_report(env, CONF_UNSUPPORTED, what, "%s", p->ci->err);
        goto out;
    }
    if (rc != TSR_OK) {
        conf_report(env, CONF_FAIL, what, "status %d (%s): %s", rc, tsr_status_str(rc), p->ci->err);
        goto out;
    }
    const int n_cases = (int)(sizeof row_counts / sizeof row_counts[0]) + (nonfinite ? 1 : 0);
    for (int c = 0; c < n_cases; c++) {
        int rows = c < (int)(sizeof row_counts / sizeof row_counts[0]) ? row_counts[c] : 3;
        int nf = c == n_cases - 1 && nonfinite;
        snprintf(what, sizeof what, "gemv rows=%d %dx%d %s%s%s", rows, out, in, tsr_dtype_name(dt), label,
                 nf ? " nan/inf in x" : "");
        float *x = malloc((size_t)rows * in * sizeof *x), *xc = malloc((size_t)rows * in * sizeof *x);
        float *y = conf_guarded_alloc((int64_t)rows * out), *yr = malloc((size_t)rows * out * sizeof *yr);
        for (int64_t i = 0; i < (int64_t)rows * in; i++) x[i] = conf_randf(rng);
        if (nf) {
            x[5] = NAN;
            x[2 * in + 9] = INFINITY;
        }
        memcpy(xc, x, (size_t)rows * in * sizeof *x);
        int rrc = gemv_run(p->ref, rh, rows, x, yr);
        p->ci->err[0] = '\0';
        rc = gemv_run(p->ci, h, rows, x, y);
        double nmse = 0.0;
        int64_t bad = 0;
        double tol = env->m->exact ? GEMV_TOL_EXACT : GEMV_TOL_LOSSY;
        int64_t mr = max_rows(env->m);
        if (rrc != TSR_OK) {
            conf_report(env, CONF_FAIL, what, "reference failed: %s", p->ref->err);
        } else if (rc == TSR_ERR_UNSUPPORTED && mr > 0 && rows > mr) {
            conf_report(env, CONF_UNSUPPORTED, what, "rows above the declared max_rows %lld", (long long)mr);
        } else if (rc != TSR_OK) {
            conf_report(env, CONF_FAIL, what, "status %d (%s): %s", rc, tsr_status_str(rc), p->ci->err);
        } else if (!conf_guard_intact(y, (int64_t)rows * out)) {
            conf_report(env, CONF_FAIL, what, "wrote outside y (guard bytes changed)");
        } else if (memcmp(x, xc, (size_t)rows * in * sizeof *x) || memcmp(wb, wcopy, nbytes)) {
            conf_report(env, CONF_FAIL, what, "wrote into its input (x or the stored weight)");
        } else if (conf_compare(y, yr, (int64_t)rows * out, env->m->exact, &nmse, &bad)) {
            conf_report(env, CONF_FAIL, what, "NaN/Inf parity: y[%lld] = %g, reference %g", (long long)bad,
                        y[bad], yr[bad]);
        } else if (!(nmse <= tol)) {
            conf_report(env, CONF_FAIL, what, "nmse %.3g > %.0e", nmse, tol);
        } else {
            conf_report(env, CONF_PASS, what, "nmse %.3g <= %.0e", nmse, tol);
        }
        free(x);
        free(xc);
        free(yr);
        conf_guarded_free(y);
    }
out:
    release(p->ci, h);
    release(p->ref, rh);
    free(wb);
    free(wcopy);
}

/* The verdict on n outputs y of a call that returned rc against want (the
 * reference's, bad_ref if it failed): guard bytes, NaN/Inf parity, NMSE
 * within tol (hint: what a larger one suggests). */
static void judge(conf_env *env, gemv_pair *p, const char *what, int bad_ref, int rc, const float *y,
                  const float *want, int64_t n, double tol, const char *hint) {
    double nmse = 0.0;
    int64_t bad = 0;
    if (bad_ref) conf_report(env, CONF_FAIL, what, "reference failed: %s", p->ref->err);
    else if (rc != TSR_OK) conf_report(env, CONF_FAIL, what, "status %d (%s): %s", rc, tsr_status_str(rc), p->ci->err);
    else if (!conf_guard_intact(y, n)) conf_report(env, CONF_FAIL, what, "wrote outside y");
    else if (conf_compare(y, want, n, env->m->exact, &nmse, &bad))
        conf_report(env, CONF_FAIL, what, "NaN/Inf parity at %lld", (long long)bad);
    else if (!(nmse <= tol)) conf_report(env, CONF_FAIL, what, "nmse %.3g > %.0e (%s)", nmse, tol, hint);
    else conf_report(env, CONF_PASS, what, "nmse %.3g <= %.0e", nmse, tol);
}

/* prepare_group (gemv interface 2, optional): q/k/v-like matrices of one
 * dtype stacked by rows give, row for row, each matrix's products (the
 * reference runs each alone); TSR_ERR_UNSUPPORTED is the plugin's answer
 * that it would rather have them alone (reported as unsupported). */
static void group_cases(conf_env *env, gemv_pair *p, uint32_t dt, uint64_t *rng) {
    int (*grp)(void *, const tsr_weight *, int, void **) = CONF_MEMBER(p->ci, tsr_gemv_i, prepare_group);
    if (!grp) return;
    enum { N = 3, IN = 256 };
    const int outs[N] = {32, 9, 9}, all = 50;
    char what[128];
    snprintf(what, sizeof what, "gemv prepare_group 32+9+9 x %d %s", IN, tsr_dtype_name(dt));
    tsr_weight ws[N];
    unsigned char *wb[N] = {0};
    void *rh[N] = {0}, *h = NULL;
    float *x = malloc((size_t)5 * IN * sizeof *x), *yr = malloc((size_t)5 * 32 * sizeof *yr);
    float *y = conf_guarded_alloc((int64_t)5 * all), *want = malloc((size_t)5 * all * sizeof *want);
    int ok = x && yr && y && want;
    for (int i = 0; ok && i < N; i++) {
        uint64_t nb;
        ok = (wb[i] = make_weights(dt, outs[i], IN, rng, &nb)) != NULL;
        if (ok) ws[i] = (tsr_weight){i == 0 ? "conf.q" : i == 1 ? "conf.k" : "conf.v", dt, outs[i], IN, wb[i], nb,
                                     NULL, TSR_WEIGHT_DENSE};
        ok = ok && CONF_MEMBER(p->ref, tsr_gemv_i, prepare)(CONF_INST(p->ref), &ws[i], &rh[i]) == TSR_OK;
    }
    if (!ok) {
        conf_report(env, CONF_FAIL, what, "harness: no memory, or the reference refused a matrix");
        goto out;
    }
    for (int64_t i = 0; i < 5 * IN; i++) x[i] = conf_randf(rng);
    p->ci->err[0] = '\0';
    int rc = grp(CONF_INST(p->ci), ws, N, &h);
    if (rc == TSR_ERR_UNSUPPORTED) {
        conf_report(env, CONF_UNSUPPORTED, what, "%s", p->ci->err[0] ? p->ci->err : "prefers them alone");
        goto out;
    }
    if (rc != TSR_OK) {
        conf_report(env, CONF_FAIL, what, "status %d (%s): %s", rc, tsr_status_str(rc), p->ci->err);
        goto out;
    }
    for (int rows = 1; rows <= 5; rows += 4) {
        snprintf(what, sizeof what, "gemv prepare_group rows=%d 32+9+9 x %d %s", rows, IN, tsr_dtype_name(dt));
        int bad_ref = 0;
        for (int i = 0, off = 0; i < N; off += outs[i], i++) {
            bad_ref |= gemv_run(p->ref, rh[i], rows, x, yr) != TSR_OK;
            for (int r = 0; r < rows; r++)
                memcpy(want + (int64_t)r * all + off, yr + (int64_t)r * outs[i], (size_t)outs[i] * sizeof *yr);
        }
        p->ci->err[0] = '\0';
        rc = gemv_run(p->ci, h, rows, x, y);
        judge(env, p, what, bad_ref, rc, y, want, (int64_t)rows * all,
              env->m->exact ? GEMV_TOL_EXACT : GEMV_TOL_LOSSY, "matrices out of order?");
    }
out:
    release(p->ci, h);
    for (int i = 0; i < N; i++) {
        release(p->ref, rh[i]);
        free(wb[i]);
    }
    free(x), free(yr), free(want);
    conf_guarded_free(y);
}

/* run_glu (gemv interface 4, optional) on a gate/up pair stacked by
 * prepare_group: silu(gate) * up, against the reference's products of each
 * matrix put through SiLU in double precision; TSR_ERR_UNSUPPORTED (the host
 * then runs run() and its SiLU) reported as unsupported. */
static void glu_cases(conf_env *env, gemv_pair *p, uint32_t dt, uint64_t *rng) {
    int (*grp)(void *, const tsr_weight *, int, void **) = CONF_MEMBER(p->ci, tsr_gemv_i, prepare_group);
    int (*glu)(void *, const void *, int, const float *, float *, const tsr_exec *) =
        CONF_MEMBER(p->ci, tsr_gemv_i, run_glu);
    if (!grp || !glu) return;
    enum { F = 64, IN = 256, ROWS = 5 };
    char what[128];
    snprintf(what, sizeof what, "gemv run_glu %d+%d x %d %s", F, F, IN, tsr_dtype_name(dt));
    tsr_weight ws[2];
    unsigned char *wb[2] = {0};
    void *rh[2] = {0}, *h = NULL;
    float *x = malloc((size_t)ROWS * IN * sizeof *x), *yr = malloc((size_t)2 * ROWS * F * sizeof *yr);
    float *y = conf_guarded_alloc((int64_t)ROWS * F), *want = malloc((size_t)ROWS * F * sizeof *want);
    int ok = x && yr && y && want;
    for (int i = 0; ok && i < 2; i++) {
        uint64_t nb;
        ok = (wb[i] = make_weights(dt, F, IN, rng, &nb)) != NULL;
        if (ok) ws[i] = (tsr_weight){i ? "conf.up" : "conf.gate", dt, F, IN, wb[i], nb, NULL, TSR_WEIGHT_DENSE};
        ok = ok && CONF_MEMBER(p->ref, tsr_gemv_i, prepare)(CONF_INST(p->ref), &ws[i], &rh[i]) == TSR_OK;
    }
    if (!ok) {
        conf_report(env, CONF_FAIL, what, "harness: no memory, or the reference refused a matrix");
        goto out;
    }
    for (int64_t i = 0; i < ROWS * IN; i++) x[i] = 4.0f * conf_randf(rng);
    p->ci->err[0] = '\0';
    int rc = grp(CONF_INST(p->ci), ws, 2, &h);
    if (rc != TSR_OK) {
        conf_report(env, rc == TSR_ERR_UNSUPPORTED ? CONF_UNSUPPORTED : CONF_FAIL, what, "prepare_group: status %d (%s): %s",
                    rc, tsr_status_str(rc), p->ci->err);
        goto out;
    }
    for (int rows = 1; rows <= ROWS; rows += ROWS - 1) {
        snprintf(what, sizeof what, "gemv run_glu rows=%d %d+%d x %d %s", rows, F, F, IN, tsr_dtype_name(dt));
        int bad_ref = 0;
        for (int i = 0; i < 2; i++) bad_ref |= gemv_run(p->ref, rh[i], rows, x, yr + (int64_t)i * ROWS * F) != TSR_OK;
        for (int64_t k = 0; k < (int64_t)rows * F; k++) {
            const double g = yr[k], u = yr[(int64_t)ROWS * F + k];
            want[k] = (float)(g / (1.0 + exp(-g)) * u);
        }
        tsr_exec ex = {.device = TSR_DEVICE_CPU, .n_threads = 2};
        p->ci->err[0] = '\0';
        rc = glu(CONF_INST(p->ci), h, rows, x, y, &ex);
        if (!bad_ref && rc == TSR_ERR_UNSUPPORTED) {
            conf_report(env, CONF_UNSUPPORTED, what, "declined (this row count, or the plugin's params)");
            continue;
        }
        /* a product of two outputs each within a lossy plugin's bound e: its
         * relative error is at most the sum of theirs, NMSE <= (2 sqrt(e))^2 */
        judge(env, p, what, bad_ref, rc, y, want, (int64_t)rows * F,
              env->m->exact ? GEMV_TOL_EXACT : 4 * GEMV_TOL_LOSSY, "gate and up swapped?");
    }
out:
    release(p->ci, h);
    for (int i = 0; i < 2; i++) {
        release(p->ref, rh[i]);
        free(wb[i]);
    }
    free(x), free(yr), free(want);
    conf_guarded_free(y);
}

void conf_run_gemv(conf_env *env) {
    tsr_model_desc md = {.arch = "llama", .n_layers = 1, .hidden = 256, .n_heads = 4, .n_kv_heads = 4,
                         .head_dim = 64, .ffn = 768, .vocab = 256, .max_ctx = 256};
    gemv_pair p = {0};
    const char *params[1];
    int np = conf_params(env, NULL, 0, params);
    int rc = conf_inst_new(env->lib.desc, env->m, &md, params, np, env->pool, &p.ci);
    int rrc = conf_inst_new(env->ref_lib.desc, env->ref_m, &md, NULL, 0, env->pool, &p.ref);
    if (rrc == TSR_OK && conf_variant_declined(env, rc, "gemv init", p.ci ? p.ci->err : NULL)) {
        /* reported */
    } else if (rc != TSR_OK || rrc != TSR_OK) {
        conf_report(env, CONF_FAIL, "gemv init", "%s", rc != TSR_OK ? (p.ci ? p.ci->err : "no memory")
                                                                   : (p.ref ? p.ref->err : "no memory"));
    } else {
        p.ci->quiet = p.ref->quiet = 1;
        uint64_t rng = env->seed;
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                weight_cases(env, &p, dtypes[d], shapes[s].out, shapes[s].in, s == 1, NULL, "", &rng);
        float sv[67];
        for (int i = 0; i < 67; i++) sv[i] = 0.01f + 0.09f * fabsf(conf_randf(&rng));
        const tsr_weight_scale scs[] = {{sv, 67, 512}, {sv, 1, 512}, {sv, 32, 128}}; /* 1, 67, 3 x 4 values */
        const char *labels[] = {" per-tensor scale", " per-row scales", " 32x128 block scales"};
        for (int k = 0; k < 3; k++) weight_cases(env, &p, TSR_DTYPE_F8_E4M3, 67, 512, 0, &scs[k], labels[k], &rng);
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
            if (declares_dtype(env->m, dtypes[d])) group_cases(env, &p, dtypes[d], &rng), glu_cases(env, &p, dtypes[d], &rng);
        if (p.ci->live_allocs > 1)
            conf_report(env, CONF_FAIL, "gemv release", "%lld host allocations (%llu bytes) still held after "
                         "every prepared handle was released", (long long)p.ci->live_allocs - 1,
                         (unsigned long long)p.ci->live_bytes);
    }
    conf_inst_free(p.ci);
    conf_inst_free(p.ref);
}
