/*
 * The paged KV cache (cuda_kv_paged, bf16 and FP8 E4M3) read by
 * cuda_attention, on the GPU (ctest label "gpu"; skipped cleanly where no
 * CUDA device is present).
 *
 * - Against transformers: each fixture model and stories260K as one prefill
 *   and as a one-token prefill followed by passes of 1 and of 3 rows (CUDA
 *   graphs captured once and replayed, which is checked), through
 *   cuda-fast-paged.yaml, cuda-fast-paged-fp8.yaml and the same with blocks
 *   of 3 tokens (many blocks, boundaries inside every pass). Bound, stated:
 *       |logit - reference| <= TOL_ABS + TOL_REL * max|reference logit of the row|
 *   with TOL_ABS 0.02, TOL_REL 0.05 for bf16 KV (test_cuda.c's bound) and
 *   0.1, 0.75 for fp8 KV (test_cuda_fp8.c's: a catcher of garbage, see
 *   below), the argmax equal to the reference's wherever its top-2 margin
 *   exceeds twice the bound, and over the whole sequence the mean KL
 *   divergence from the reference's distribution and the perplexity ratio
 *   on the sequence's own next tokens within the quality the manifest
 *   declares (read from the catalog).
 * - Paged bf16 (blocks of 3 and 16) gives bit for bit the logits of
 *   contiguous bf16 (cuda_kv_cache in the same assembly): the same values,
 *   found through a table; the fixtures also on 100 random tokens in passes
 *   of 99 + 1 and 40 + 60 rows (the tensor-core prefill kernel, paged).
 * - Rollback: a sequence that runs every pass of 3 rows first with wrong
 *   tokens, truncates them away (blocks given back) and runs the right ones
 *   gives bit for bit the logits of a sequence never truncated.
 * - Pool exhaustion: a pool of 32 tokens (2 blocks of 16) answers
 *   TSR_ERR_RANGE to the append that needs a third block, and serves again
 *   once a truncate gave a block back; usage() counts the blocks taken; a
 *   sequence longer than the whole pool is refused at seq_alloc.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/gpu/gpu_env.h"

#include "core/format/safetensors.h"
#include "core/runtime/runtime.h"
#include "tests/gpu/gpu_check.h"
#ifdef TESSERA_CUDA
#include "core/cuda/device.h"
#endif

/* bf16 KV: test_cuda.c's bound for bf16 weights, activations and KV. */
#define TOL_ABS 0.02
#define TOL_REL 0.05
/* fp8 KV: loose on purpose, test_cuda_fp8.c's bound for FP8 weights and
 * activations (e4m3 keeps 3 mantissa bits and the tiny random fixtures
 * amplify rounding from layer to layer; a CPU simulation of FP8 weights and
 * activations moved their logits by up to 2.1 where max|logit| is about 5).
 * fp8 KV alone, simulated on the CPU (test_kv_fp8_quality), moved logits
 * by up to 1.35 where max|logit| is 7. This bound catches garbage (NaN,
 * wrong scales, wrong blocks); the mean KL and perplexity ratio against the
 * manifest's bound are the quality check. */
#define TOL_ABS_FP8 0.1
#define TOL_REL_FP8 0.75

/* An assembly like cuda-fast-paged.yaml with the cache's params (kv NULL:
 * cuda_kv_cache, contiguous bf16), written to a temporary file. */
static void write_assembly(char *path, size_t size, const char *dtype, int block_size, int capacity) {
    snprintf(path, size, "/tmp/tessera-paged-XXXXXX.yaml");
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fprintf(f, "name: test-paged\ndevice: cuda\nslots:\n  gemv: cuda_gemv\n  attention: cuda_attention\n");
    if (dtype)
        fprintf(f, "  kv_cache: {plugin: cuda_kv_paged, params: {dtype: %s, block_size: %d, capacity_tokens: %d}}\n",
                dtype, block_size, capacity);
    else
        fprintf(f, "  kv_cache: cuda_kv_cache\n");
    fprintf(f, "  drafter: drafter_none\n  expert_cache: expert_resident\nruntime:\n  cuda_graphs: true\n");
    fclose(f);
}

static tsr_model *load(const char *model, const char *asm_path, int max_ctx) {
    tsr_error err;
    tsr_error_clear(&err);
    tsr_model_opts o = {.model_path = model, .assembly_path = asm_path, .no_tokenizer = 1, .max_ctx = max_ctx};
    tsr_model *m;
    if (tsr_model_load(&o, &m, &err) != TSR_OK) fail_msg("%s with %s: %s", model, asm_path, err.msg);
    return m;
}

/* log-softmax of a row into out */

/* Logits of every row of ids run in passes of step rows (0: one prefill). */
static float *run(tsr_model *m, const int32_t *ids, int n, int vocab, int step, uint64_t *replays) {
    float *got = malloc((size_t)n * vocab * sizeof *got);
    assert_non_null(got);
    tsr_error err;
    tsr_error_clear(&err);
    tsr_seq *s;
    assert_int_equal(tsr_seq_new(m, n, &s, &err), TSR_OK);
    uint64_t c0, r0, c1, r1;
    tsr_model_graph_stats(m, &c0, &r0);
    if (gpu_run_passes(s, ids, n, vocab, step, got, &err) != TSR_OK) fail_msg("forward: %s", err.msg);
    tsr_model_graph_stats(m, &c1, &r1);
    if (replays) *replays = r1 - r0;
    tsr_seq_free(s);
    return got;
}

/* got against the reference: per-row bound, argmax, mean KL and ppl ratio
 * within cuda_kv_paged's manifest. */
static void check_quality(const char *what, const gpu_ref *ref, const float *got, double tol_abs, double tol_rel) {
    const gpu_quality q = gpu_check_quality(what, ref, got, tol_abs, tol_rel, "cuda_kv_paged");
    printf("# %s: max |diff| %.4g (%.0f%% of the bound), argmax equal on %d/%d rows with a clear margin, "
           "mean KL %.3g, ppl ratio %.5f\n", what, q.worst, 100 * q.worst_rel, q.argmax_checked, ref->n, q.kl, q.ppl);
}

typedef struct model_case {
    char dir[4096], ref[4200];
    const char *ids_name, *logits_name;
} model_case;

static int model_cases(model_case *c) {
    const char *families[] = {"llama", "qwen2", "qwen3"};
    for (int i = 0; i < 3; i++) {
        snprintf(c[i].dir, sizeof c[i].dir, "%s/tests/data/fixtures/transformers/%s", gpu_src_dir(), families[i]);
        snprintf(c[i].ref, sizeof c[i].ref, "%s/reference.safetensors", c[i].dir);
        c[i].ids_name = "input_ids";
        c[i].logits_name = "logits";
    }
    snprintf(c[3].dir, sizeof c[3].dir, "%s/models/stories260K/stories260K.gguf", gpu_src_dir());
    snprintf(c[3].ref, sizeof c[3].ref, "%s/models/stories260K/hf/reference.safetensors", gpu_src_dir());
    c[3].ids_name = "input_ids_1";
    c[3].logits_name = "logits_1";
    return 4;
}

/* Every model through the assembly, as one prefill and in passes of 1 and 3. */
static void against_transformers(const char *asm_path, const char *label, int fp8) {
    model_case cases[4];
    const int n_cases = model_cases(cases);
    for (int i = 0; i < n_cases; i++) {
        gpu_ref ref;
        gpu_ref_open(&ref, cases[i].ref, cases[i].ids_name, cases[i].logits_name);
        tsr_model *m = load(cases[i].dir, asm_path, 0);
        for (int step = 0; step <= 3; step += step ? 2 : 1) {
            uint64_t replays;
            float *got = run(m, ref.ids, ref.n, ref.vocab, step, &replays);
            if (step > 0 && ref.n > 2 * step + 1 && replays == 0) fail_msg("%s: no pass was replayed", label);
            char what[4400];
            snprintf(what, sizeof what, "%.3000s via %.1000s, passes of %d rows (%llu replayed)", cases[i].dir, label,
                     step ? step : ref.n, (unsigned long long)replays);
            check_quality(what, &ref, got, fp8 ? TOL_ABS_FP8 : TOL_ABS, fp8 ? TOL_REL_FP8 : TOL_REL);
            free(got);
        }
        tsr_model_free(m);
        gpu_ref_close(&ref);
    }
}

/* The committed assembly of one KV dtype, then the same with blocks of 3
 * tokens (every pass crossing blocks), against transformers. */
static void paged_dtype(const char *assembly, const char *dtype, int fp8) {
    if (!gpu_have()) skip();
    char path[4096], label[64];
    snprintf(path, sizeof path, "%s/assemblies/%s.yaml", gpu_src_dir(), assembly);
    against_transformers(path, assembly, fp8);
    write_assembly(path, sizeof path, dtype, 3, 0);
    snprintf(label, sizeof label, "paged %s, blocks of 3", fp8 ? "fp8" : "bf16");
    against_transformers(path, label, fp8);
    unlink(path);
}

static void test_paged_bf16(void **state) {
    (void)state;
    paged_dtype("cuda-fast-paged", "bf16", 0);
}

static void test_paged_fp8(void **state) {
    (void)state;
    paged_dtype("cuda-fast-paged-fp8", "f8_e4m3", 1);
}

/* Logits of every row of ids run as a pass of first rows, then one of the rest. */
static float *run_two(tsr_model *m, const int32_t *ids, int n, int vocab, int first) {
    float *got = malloc((size_t)n * vocab * sizeof *got);
    assert_non_null(got);
    tsr_error err;
    tsr_error_clear(&err);
    tsr_seq *s;
    assert_int_equal(tsr_seq_new(m, n, &s, &err), TSR_OK);
    if (tsr_seq_forward(s, ids, first, got, 1, &err) != TSR_OK ||
        tsr_seq_forward(s, ids + first, n - first, got + (size_t)first * vocab, 1, &err) != TSR_OK)
        fail_msg("forward: %s", err.msg);
    tsr_seq_free(s);
    return got;
}

static size_t differing(const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t j = 0; j < n; j++) d += memcmp(&a[j], &b[j], sizeof *a) != 0;
    return d;
}

/* Paged bf16 (blocks of 3 and 16) against contiguous bf16: bit for bit. The
 * fixtures also take 100 random tokens as one pass and as passes of 40 + 60
 * rows: passes of more than 32 rows run the tensor-core prefill kernel,
 * which reads the paged cache through its table. */
static void test_paged_equals_contiguous(void **state) {
    (void)state;
    if (!gpu_have()) skip();
    char contig[4096], paged3[4096], paged16[4096];
    write_assembly(contig, sizeof contig, NULL, 0, 0);
    write_assembly(paged3, sizeof paged3, "bf16", 3, 0);
    write_assembly(paged16, sizeof paged16, "bf16", 16, 0);
    model_case cases[4];
    const int n_cases = model_cases(cases);
    for (int i = 0; i < n_cases; i++) {
        gpu_ref ref;
        gpu_ref_open(&ref, cases[i].ref, cases[i].ids_name, cases[i].logits_name);
        const size_t n = (size_t)ref.n * ref.vocab;
        tsr_model *mc = load(cases[i].dir, contig, 0), *m3 = load(cases[i].dir, paged3, 0),
                  *m16 = load(cases[i].dir, paged16, 0);
        for (int step = 0; step <= 3; step += step ? 2 : 1) {
            float *a = run(mc, ref.ids, ref.n, ref.vocab, step, NULL);
            float *b = run(m3, ref.ids, ref.n, ref.vocab, step, NULL);
            float *c = run(m16, ref.ids, ref.n, ref.vocab, step, NULL);
            size_t diff3 = 0, diff16 = 0;
            for (size_t j = 0; j < n; j++) {
                diff3 += memcmp(&a[j], &b[j], sizeof *a) != 0;
                diff16 += memcmp(&a[j], &c[j], sizeof *a) != 0;
            }
            printf("# %s, passes of %d rows: paged bf16 logits differing from contiguous: %zu (blocks of 3), "
                   "%zu (blocks of 16) of %zu\n", cases[i].dir, step ? step : ref.n, diff3, diff16, n);
            assert_int_equal(diff3, 0);
            assert_int_equal(diff16, 0);
            free(a);
            free(b);
            free(c);
        }
        if (i < 3) { /* head_dim 16: the prefill kernel's */
            enum { N = 100 };
            int32_t ids[N];
            uint64_t x = 0x2545F4914F6CDD1Dull;
            for (int j = 0; j < N; j++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                ids[j] = (int32_t)(x % (uint64_t)ref.vocab);
            }
            for (int first = N; first >= 40; first -= 60) {
                float *a = run_two(mc, ids, N, ref.vocab, first == N ? N - 1 : first);
                float *b = run_two(m3, ids, N, ref.vocab, first == N ? N - 1 : first);
                float *c = run_two(m16, ids, N, ref.vocab, first == N ? N - 1 : first);
                const size_t nn = (size_t)N * ref.vocab, d3 = differing(a, b, nn), d16 = differing(a, c, nn);
                printf("# %s, 100 random tokens in passes of %d + %d rows: paged bf16 logits differing from "
                       "contiguous: %zu (blocks of 3), %zu (blocks of 16) of %zu\n", cases[i].dir,
                       first == N ? N - 1 : first, first == N ? 1 : N - first, d3, d16, nn);
                assert_int_equal(d3, 0);
                assert_int_equal(d16, 0);
                free(a);
                free(b);
                free(c);
            }
        }
        tsr_model_free(mc);
        tsr_model_free(m3);
        tsr_model_free(m16);
        gpu_ref_close(&ref);
    }
    unlink(contig);
    unlink(paged3);
    unlink(paged16);
}

/* Passes of 3 rows, each first with wrong tokens that are truncated away. */
static void rollback(const char *dtype) {
    char path[4096];
    write_assembly(path, sizeof path, dtype, 2, 0); /* blocks of 2: every rollback gives blocks back */
    model_case cases[4];
    const int n_cases = model_cases(cases);
    for (int i = 0; i < n_cases; i++) {
        gpu_ref ref;
        gpu_ref_open(&ref, cases[i].ref, cases[i].ids_name, cases[i].logits_name);
        const int n = ref.n, vocab = ref.vocab;
        tsr_model *m = load(cases[i].dir, path, 0);
        float *want = run(m, ref.ids, n, vocab, 3, NULL);
        float *got = malloc((size_t)n * vocab * sizeof *got), *junk = malloc((size_t)3 * vocab * sizeof *junk);
        int32_t wrong[3];
        assert_true(got && junk);
        tsr_error err;
        tsr_error_clear(&err);
        tsr_seq *s;
        assert_int_equal(tsr_seq_new(m, n, &s, &err), TSR_OK);
        uint64_t c0, r0, c1, r1, used, cap;
        tsr_model_graph_stats(m, &c0, &r0);
        if (tsr_seq_forward(s, ref.ids, 1, got, 1, &err) != TSR_OK) fail_msg("forward: %s", err.msg);
        for (int at = 1; at < n;) {
            const int rows = n - at < 3 ? n - at : 3;
            for (int j = 0; j < rows; j++) wrong[j] = (ref.ids[at + j] + 1 + j) % vocab;
            if (tsr_seq_forward(s, wrong, rows, junk, 1, &err) != TSR_OK) fail_msg("forward: %s", err.msg);
            if (tsr_seq_truncate(s, at, &err) != TSR_OK) fail_msg("truncate: %s", err.msg);
            if (tsr_seq_forward(s, ref.ids + at, rows, got + (size_t)at * vocab, 1, &err) != TSR_OK)
                fail_msg("forward: %s", err.msg);
            at += rows;
        }
        tsr_model_graph_stats(m, &c1, &r1);
        tsr_model_kv_usage(m, &used, &cap);
        size_t differ = 0;
        for (size_t j = 0; j < (size_t)n * vocab; j++) differ += memcmp(&want[j], &got[j], sizeof *got) != 0;
        printf("# %s, %s KV in blocks of 2: rolled back every pass of 3 rows; logits differing from a sequence "
               "never rolled back: %zu of %zu (%llu passes replayed); %llu of %llu KV bytes in use\n", cases[i].dir,
               dtype, differ, (size_t)n * vocab, (unsigned long long)(r1 - r0), (unsigned long long)used,
               (unsigned long long)cap);
        assert_int_equal(differ, 0);
        if (n > 7) assert_true(r1 - r0 > 0);
        assert_true(used > 0 && used <= cap);
        tsr_seq_free(s);
        tsr_model_kv_usage(m, &used, &cap);
        assert_int_equal(used, 0); /* every block back in the pool */
        free(want);
        free(got);
        free(junk);
        tsr_model_free(m);
        gpu_ref_close(&ref);
    }
    unlink(path);
}

static void test_rollback_bf16(void **state) {
    (void)state;
    if (!gpu_have()) skip();
    rollback("bf16");
}

static void test_rollback_fp8(void **state) {
    (void)state;
    if (!gpu_have()) skip();
    rollback("f8_e4m3");
}

/* A pool of 32 tokens (2 blocks of 16): a third block is TSR_ERR_RANGE. */
static void test_pool_exhausted(void **state) {
    (void)state;
    if (!gpu_have()) skip();
    char path[4096], model[4096];
    write_assembly(path, sizeof path, "bf16", 16, 32);
    snprintf(model, sizeof model, "%s/tests/data/fixtures/transformers/llama", gpu_src_dir());
    tsr_model *m = load(model, path, 32); /* context 32: the load's warm-up sequence fits the pool */
    int32_t ids[20];
    for (int i = 0; i < 20; i++) ids[i] = i + 1;
    tsr_error err;
    tsr_error_clear(&err);
    tsr_seq *a, *b;
    uint64_t used, cap, used_one;
    tsr_model_kv_usage(m, &used, &cap);
    assert_int_equal(used, 0);
    assert_true(cap > 0);
    assert_int_equal(tsr_seq_new(m, 32, &a, &err), TSR_OK);
    assert_int_equal(tsr_seq_new(m, 32, &b, &err), TSR_OK); /* reserving is free: blocks are taken on demand */
    assert_int_equal(tsr_seq_forward(a, ids, 10, NULL, 0, &err), TSR_OK); /* 1 block */
    tsr_model_kv_usage(m, &used_one, &cap);
    assert_int_equal(used_one * 2, cap);
    assert_int_equal(tsr_seq_forward(b, ids, 16, NULL, 0, &err), TSR_OK); /* the other block */
    tsr_model_kv_usage(m, &used, &cap);
    assert_int_equal(used, cap);
    int rc = tsr_seq_forward(a, ids + 10, 7, NULL, 0, &err); /* 17 tokens: a second block, none free */
    printf("# a third block of a pool of two: status %d (%s)\n", rc, err.msg);
    assert_int_equal(rc, TSR_ERR_RANGE);
    assert_non_null(strstr(err.msg, "exhausted"));
    assert_int_equal(tsr_seq_len(a), 10);
    tsr_error_clear(&err);
    assert_int_equal(tsr_seq_truncate(b, 0, &err), TSR_OK); /* its block back in the pool */
    assert_int_equal(tsr_seq_forward(a, ids + 10, 7, NULL, 0, &err), TSR_OK);
    tsr_model_kv_usage(m, &used, &cap);
    assert_int_equal(used, cap);
    tsr_seq_free(a);
    tsr_seq_free(b);
    tsr_model_kv_usage(m, &used, &cap);
    assert_int_equal(used, 0);
    tsr_model_free(m);
    /* a context of 64 over the same pool: the load's warm-up sequence (64
     * tokens) is longer than the whole pool, refused at seq_alloc */
    tsr_model_opts o = {.model_path = model, .assembly_path = path, .no_tokenizer = 1, .max_ctx = 64};
    tsr_error_clear(&err);
    rc = tsr_model_load(&o, &m, &err);
    printf("# a 64-token sequence over a pool of 32: status %d (%s)\n", rc, err.msg);
    assert_int_equal(rc, TSR_ERR_RANGE);
    assert_non_null(strstr(err.msg, "pool"));
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paged_bf16),
        cmocka_unit_test(test_paged_fp8),
        cmocka_unit_test(test_paged_equals_contiguous),
        cmocka_unit_test(test_rollback_bf16),
        cmocka_unit_test(test_rollback_fp8),
        cmocka_unit_test(test_pool_exhausted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
