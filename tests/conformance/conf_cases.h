/*
 * conf_cases.h - the conformance harness's case tables, one per slot, and
 * the result bookkeeping the slot runners share (test_conformance.c and
 * conf_*.c). A case names what it varies (shapes, rows, dtypes, params) and
 * the tolerance it is held to; a plugin's manifest decides which tolerance
 * applies (exact or lossy).
 */
#ifndef TSR_CONF_CASES_H
#define TSR_CONF_CASES_H

#include <stdint.h>

#include "conf_host.h"

typedef enum conf_outcome { CONF_PASS = 0, CONF_UNSUPPORTED = 1, CONF_FAIL = 2 } conf_outcome;

typedef struct conf_tally {
    int pass, unsupported, fail;
} conf_tally;

/* The plugin under test and what the runners need around it. */
typedef struct conf_env {
    const tsr_catalog *cat;
    const tsr_manifest *m;        /* plugin under test */
    conf_lib lib;                 /* its library */
    const tsr_manifest *ref_m;    /* the slot's reference plugin */
    conf_lib ref_lib;
    tsr_threadpool *pool;
    uint64_t seed;
    const char *variant;          /* "name=value" the run varies, or NULL: defaults */
    conf_tally tally;
} conf_env;

/* Print one case's line and count it. what: "gemv rows=1 64x256 f16". */
void conf_report(conf_env *env, conf_outcome o, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* rc of the plugin's init under a variant this machine cannot run
 * (TSR_ERR_UNSUPPORTED with a variant set: isa=avx512 on a CPU without it,
 * or under valgrind, which hides AVX-512): reported as unsupported with
 * why, 1; anything else 0, nothing reported. */
int conf_variant_declined(conf_env *env, int rc, const char *what, const char *why);

/* Params of a case ("name=value") that the plugin under test declares (the
 * others are dropped: cases name params their slot's plugins commonly take),
 * then the run's variant. Returns how many were written to out (room for
 * n_want + 1). */
int conf_params(const conf_env *env, const char *const *want, int n_want, const char **out);

/* The variants a plugin runs its cases under, from its manifest alone: ""
 * (every default), then each other value of each string param that lists
 * its values, then each bool param flipped. Returns how many (<= max). */
#define CONF_MAX_VARIANTS 12
int conf_variants(const tsr_manifest *m, char out[][96], int max);

/* Value i of provides key c of manifest m under variant (may be NULL):
 * "$param" resolved to the variant's value or the param's default. */
void conf_provided(const tsr_manifest *m, const tsr_mcap *c, int i, const char *variant, char *buf, size_t size);

/* Comparison of a result against the reference: NaN and Inf parity element
 * by element, then the normalised mean squared error over finite elements
 * (sum (a-b)^2 / sum b^2, ggml's NMSE). Returns 0 when parity holds and
 * writes the error; -1 with the first mismatching index otherwise. */
int conf_compare(const float *got, const float *want, int64_t n, int strict_nonfinite, double *nmse,
                 int64_t *bad_index);

/* Guard bytes around an output: a buffer of n floats with GUARD bytes of
 * pattern on each side. */
#define CONF_GUARD 64
float *conf_guarded_alloc(int64_t n);
int conf_guard_intact(const float *p, int64_t n); /* 1 if neither side was written */
void conf_guarded_free(float *p);

/* Deterministic random numbers (xorshift64*). */
uint64_t conf_rand(uint64_t *s);
float conf_randf(uint64_t *s); /* uniform in [-1, 1) */

/* Every stored token of a kv view widened to f32, [n_tokens, n_kv_heads,
 * head_dim] for K and V each (dequantised with the view's scales, paged
 * blocks followed through the block table). -1 with why for a dtype or
 * layout the harness does not know. */
int conf_kv_view_to_f32(const tsr_kv_view *v, float *k, float *vv, char *why, size_t size);

/* Slot runners. */
void conf_run_gemv(conf_env *env);
void conf_run_attention(conf_env *env);
void conf_run_kv_cache(conf_env *env);
void conf_run_drafter(conf_env *env);
void conf_run_expert_cache(conf_env *env);

#endif /* TSR_CONF_CASES_H */
