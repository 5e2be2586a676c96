/*
 * seq_logits.h - the logits of every position of a token sequence run
 * through a loaded model in one forward pass (a fresh sequence; or, with
 * seq_logits_by's stepwise, one token a pass: the path decode and
 * verification take, not prefill's), for the
 * runtime tests that compare two models on the same ids. cmocka asserts;
 * the caller frees the [n, vocab] result.
 */
#ifndef TSR_TESTS_SEQ_LOGITS_H
#define TSR_TESTS_SEQ_LOGITS_H

#include <stdlib.h>

#include "core/runtime/runtime.h"

static inline float *seq_logits_by(tsr_model *m, const int32_t *ids, int n, int stepwise) {
    const int vocab = tsr_model_get_config(m)->vocab;
    float *out = malloc((size_t)n * vocab * sizeof *out);
    assert_non_null(out);
    tsr_seq *s;
    tsr_error err;
    tsr_error_clear(&err);
    assert_int_equal(tsr_seq_new(m, n, &s, &err), TSR_OK);
    if (!stepwise) {
        if (tsr_seq_forward(s, ids, n, out, 1, &err) != TSR_OK) fail_msg("forward: %s", err.msg);
    } else {
        for (int t = 0; t < n; t++)
            if (tsr_seq_forward(s, ids + t, 1, out + (size_t)t * vocab, 0, &err) != TSR_OK)
                fail_msg("decode: %s", err.msg);
    }
    tsr_seq_free(s);
    return out;
}

static inline float *seq_logits(tsr_model *m, const int32_t *ids, int n) { return seq_logits_by(m, ids, n, 0); }

#endif /* TSR_TESTS_SEQ_LOGITS_H */
