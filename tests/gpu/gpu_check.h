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

#endif /* TSR_TESTS_GPU_CHECK_H */
