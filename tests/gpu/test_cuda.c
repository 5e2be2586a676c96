/*
 * The CUDA assemblies against transformers (ctest label "gpu"; skipped
 * cleanly where no CUDA device is present). Bound, stated and tested: bf16
 * weights, activations and KV give logits within
 *     |logit - reference| <= TOL_ABS + TOL_REL * max|reference logit of the row|
 * and wherever the reference's top-2 margin exceeds twice that bound, the
 * argmax is the reference's. Each assembly runs the tokens as one prefill
 * pass, and again as a one-token prefill followed by passes of 1 and of 3
 * rows (decode and verification: with runtime.cuda_graphs these are
 * captured once and replayed, which the test checks happened).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "tests/gpu/gpu_env.h"

#include "core/format/safetensors.h"
#include "core/runtime/runtime.h"
#include "tests/gpu/gpu_check.h"
#ifdef TESSERA_CUDA
#include "core/cuda/device.h"
#endif

#define TOL_ABS 0.02
#define TOL_REL 0.05

static void check(const char *model, const char *ref_path, const char *ids_name,
                  const char *logits_name, const char *assembly, int step) {
    char asm_path[4096];
    snprintf(asm_path, sizeof asm_path, "%s/assemblies/%s", gpu_src_dir(), assembly);
    gpu_ref ref;
    gpu_ref_open(&ref, ref_path, ids_name, logits_name);
    const int n = ref.n, vocab = ref.vocab;
    const int32_t *ids = ref.ids;
    const float *want = ref.want;
    float *got = malloc((size_t)n * vocab * sizeof *got);
    assert_non_null(got);
    tsr_error err;
    tsr_error_clear(&err);
    tsr_model_opts o = {.model_path = model, .assembly_path = asm_path, .no_tokenizer = 1};
    tsr_model *m;
    if (tsr_model_load(&o, &m, &err) != TSR_OK) fail_msg("%s with %s: %s", model, assembly, err.msg);
    tsr_seq *s;
    assert_int_equal(tsr_seq_new(m, n, &s, &err), TSR_OK);
    if (gpu_run_passes(s, ids, n, vocab, step, got, &err) != TSR_OK) fail_msg("forward: %s", err.msg);
    uint64_t captures, replays;
    tsr_model_graph_stats(m, &captures, &replays);
    if (step > 0 && !strstr(assembly, "eager") && strstr(assembly, "fast") && n > 2 * step + 1 && replays == 0)
        fail_msg("%s: no pass was replayed as a graph (%llu captured)", assembly, (unsigned long long)captures);
    double worst = 0, worst_rel = 0;
    int argmax_checked = 0;
    for (int r = 0; r < n; r++) {
        const gpu_row c = gpu_check_row(want + (size_t)r * vocab, got + (size_t)r * vocab, vocab, TOL_ABS, TOL_REL);
        const float *w = want + (size_t)r * vocab;
        if (!(c.worst <= c.bound))
            fail_msg("%s/%s row %d: |logit diff| %g > bound %g", model, assembly, r, c.worst, c.bound);
        if (c.worst > worst) worst = c.worst;
        if (c.worst / c.bound > worst_rel) worst_rel = c.worst / c.bound;
        if (w[c.want_top] - w[c.want_second] > 2 * c.bound) {
            argmax_checked++;
            if (c.got_top != c.want_top)
                fail_msg("%s/%s row %d: argmax %d, transformers %d", model, assembly, r, c.got_top, c.want_top);
        }
    }
    printf("# %s via %s, passes of %d rows: max |diff| %.4g (%.0f%% of the bound), argmax equal on %d/%d rows "
           "with a clear margin; graphs captured %llu, replayed %llu\n",
           model, assembly, step ? step : n, worst, 100 * worst_rel, argmax_checked, n, (unsigned long long)captures,
           (unsigned long long)replays);
    tsr_seq_free(s);
    tsr_model_free(m);
    free(got);
    gpu_ref_close(&ref);
}

static void run_all(const char *assembly) {
    if (!gpu_have()) {
        printf("# no CUDA device: %s checks skipped\n", assembly);
        skip();
    }
    const char *families[] = {"llama", "qwen2", "qwen3"};
    char dir[4096], ref[4200];
    for (size_t i = 0; i < 3; i++) {
        snprintf(dir, sizeof dir, "%s/tests/data/fixtures/transformers/%s", gpu_src_dir(), families[i]);
        snprintf(ref, sizeof ref, "%s/reference.safetensors", dir);
        for (int step = 0; step <= 3; step += step ? 2 : 1) check(dir, ref, "input_ids", "logits", assembly, step);
    }
    snprintf(dir, sizeof dir, "%s/models/stories260K/stories260K.gguf", gpu_src_dir());
    snprintf(ref, sizeof ref, "%s/models/stories260K/hf/reference.safetensors", gpu_src_dir());
    for (int step = 0; step <= 3; step += step ? 2 : 1) check(dir, ref, "input_ids_1", "logits_1", assembly, step);
}

static void test_cuda_baseline(void **state) { (void)state; run_all("cuda-baseline.yaml"); }
static void test_cuda_fast(void **state) { (void)state; run_all("cuda-fast.yaml"); }
static void test_cuda_fast_eager(void **state) { (void)state; run_all("cuda-fast-eager.yaml"); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_baseline),
        cmocka_unit_test(test_cuda_fast),
        cmocka_unit_test(test_cuda_fast_eager),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
