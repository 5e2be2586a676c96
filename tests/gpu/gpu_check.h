/*
 * gpu_check.h - what the GPU model tests share: a reference's ids and
 * logits, running a sequence as one prefill or as passes of a few rows
 * (replayed as graphs where the assembly asks for it), and the per-row
 * comparison of logits with the reference. Include after cmocka.h.
 */
#ifndef TSR_TESTS_GPU_CHECK_H
#define TSR_TESTS_GPU_CHECK_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/format/safetensors.h"
#include "core/host/catalog.h"
#include "core/host/diag.h"
#include "core/runtime/runtime.h"

/* The token ids and the logits [n, vocab] a reference file holds (read in
 * place from its mapping). */
typedef struct gpu_ref {
    tsr_safetensors *st;
    const int32_t *ids;
    const float *want;
    int n, vocab;
} gpu_ref;

static inline void gpu_ref_open(gpu_ref *r, const char *path, const char *ids_name, const char *logits_name) {
    tsr_error err;
    tsr_error_clear(&err);
    if (tsr_safetensors_open(path, &r->st, &err) != TSR_OK) fail_msg("%s: %s", path, err.msg);
    const tsr_tensor *ti = tsr_safetensors_find(r->st, ids_name), *tl = tsr_safetensors_find(r->st, logits_name);
    if (!ti || !tl || ti->dtype != TSR_DTYPE_I32 || tl->dtype != TSR_DTYPE_F32 || tl->n_dims != 2)
        fail_msg("%s: no i32 %s and f32 [n, vocab] %s", path, ids_name, logits_name);
    r->ids = ti->data;
    r->want = tl->data;
    r->n = (int)(ti->nbytes / 4);
    r->vocab = (int)tl->shape[1];
}

static inline void gpu_ref_close(gpu_ref *r) { tsr_safetensors_free(r->st); }

/* The n tokens into s with every row's logits in got [n, vocab]: one pass
 * (step 0), or a one-token prefill then passes of step rows. */
static inline int gpu_run_passes(tsr_seq *s, const int32_t *ids, int n, int vocab, int step, float *got,
                                 tsr_error *err) {
    if (step == 0) return tsr_seq_forward(s, ids, n, got, 1, err);
    for (int at = 0; at < n;) {
        int rows = at == 0 ? 1 : n - at < step ? n - at : step;
        int rc = tsr_seq_forward(s, ids + at, rows, got + (size_t)at * vocab, 1, err);
        if (rc != TSR_OK) return rc;
        at += rows;
    }
    return TSR_OK;
}

/* One row against its reference: the largest |difference| (NaN compares as
 * a failure: it never lowers worst), the bound tol_abs + tol_rel * max|want|,
 * the reference's top two ids and the row's own argmax. */
typedef struct gpu_row {
    double worst, bound;
    int want_top, want_second, got_top;
} gpu_row;

static inline gpu_row gpu_check_row(const float *want, const float *got, int vocab, double tol_abs,
                                    double tol_rel) {
    gpu_row r = {0, 0, 0, -1, 0};
    double mx = 0;
    for (int i = 0; i < vocab; i++) {
        if (fabs(want[i]) > mx) mx = fabs(want[i]);
        if (want[i] > want[r.want_top]) r.want_top = i;
    }
    for (int i = 0; i < vocab; i++)
        if (i != r.want_top && (r.want_second < 0 || want[i] > want[r.want_second])) r.want_second = i;
    r.bound = tol_abs + tol_rel * mx;
    for (int i = 0; i < vocab; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= r.worst)) r.worst = d; /* NaN propagates as a failure of the caller's bound check */
        if (got[i] > got[r.got_top]) r.got_top = i;
    }
    return r;
}

/* A lossy plugin's logits got [n, vocab] against the reference's, all held
 * in one place: every row within tol_abs + tol_rel * max|reference| (fails
 * naming what and the row), argmax equal wherever the reference's top-2
 * margin exceeds twice that, and the mean KL(reference || got) and the
 * perplexity ratio over the reference's next tokens within the bound the
 * plugin's manifest declares (read from $TESSERA_CATALOG). */
typedef struct gpu_quality {
    double worst, worst_rel; /* largest |diff|, and largest share of a row's bound */
    int argmax_checked;      /* rows with a clear margin (all checked equal) */
    double kl, ppl;          /* measured */
    double max_kl, max_ppl;  /* the manifest's */
} gpu_quality;

static inline void gpu_log_softmax(const float *x, int n, double *out) {
    double mx = x[0], s = 0;
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) s += exp(x[i] - mx);
    for (int i = 0; i < n; i++) out[i] = x[i] - mx - log(s);
}

static inline gpu_quality gpu_check_quality(const char *what, const gpu_ref *ref, const float *got, double tol_abs,
                                            double tol_rel, const char *plugin) {
    const int n = ref->n, vocab = ref->vocab;
    double *lw = malloc((size_t)vocab * sizeof *lw), *lg = malloc((size_t)vocab * sizeof *lg);
    assert_true(lw && lg);
    gpu_quality q = {0};
    double nll_want = 0, nll_got = 0;
    for (int r = 0; r < n; r++) {
        const float *w = ref->want + (size_t)r * vocab, *g = got + (size_t)r * vocab;
        const gpu_row c = gpu_check_row(w, g, vocab, tol_abs, tol_rel);
        if (!(c.worst <= c.bound)) fail_msg("%s row %d: |logit diff| %g > bound %g", what, r, c.worst, c.bound);
        if (c.worst > q.worst) q.worst = c.worst;
        if (c.worst / c.bound > q.worst_rel) q.worst_rel = c.worst / c.bound;
        if (w[c.want_top] - w[c.want_second] > 2 * c.bound) {
            q.argmax_checked++;
            if (c.got_top != c.want_top) fail_msg("%s row %d: argmax %d, transformers %d", what, r, c.got_top, c.want_top);
        }
        gpu_log_softmax(w, vocab, lw);
        gpu_log_softmax(g, vocab, lg);
        for (int i = 0; i < vocab; i++) q.kl += exp(lw[i]) * (lw[i] - lg[i]);
        if (r + 1 < n) nll_want -= lw[ref->ids[r + 1]], nll_got -= lg[ref->ids[r + 1]];
    }
    free(lw);
    free(lg);
    q.kl /= n;
    q.ppl = n > 1 ? exp((nll_got - nll_want) / (n - 1)) : 1.0;
    tsr_catalog *cat;
    tsr_diag d;
    tsr_diag_init(&d);
    if (tsr_catalog_load(getenv("TESSERA_CATALOG"), &cat, &d) != TSR_OK) fail_msg("catalog does not load");
    const tsr_manifest *m = tsr_catalog_find(cat, plugin);
    if (!m || !m->has_quality) fail_msg("%s: no manifest with a quality bound in the catalog", plugin);
    q.max_kl = m->max_mean_kl;
    q.max_ppl = m->max_ppl_ratio;
    tsr_catalog_free(cat);
    tsr_diag_free(&d);
    if (!(q.kl <= q.max_kl)) fail_msg("%s: mean KL %g > %g (%s's manifest)", what, q.kl, q.max_kl, plugin);
    if (!(q.ppl <= q.max_ppl)) fail_msg("%s: perplexity ratio %g > %g (%s's manifest)", what, q.ppl, q.max_ppl, plugin);
    return q;
}

#endif /* TSR_TESTS_GPU_CHECK_H */
