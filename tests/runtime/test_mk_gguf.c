/*
 * tools/mk_gguf against the checkpoints it converts: the llama, qwen2 and
 * qwen3 transformers fixtures written as GGUF (f32 and Q8_0, in a temporary
 * folder) and run by the reference assembly beside the safetensors they came
 * from.
 *
 * - f32: the same model, so the same logits up to summation order (llama's
 *   q/k rows are reordered into GGUF's interleaved RoPE pairs: a head's dot
 *   products add in another order): max |difference| <= 1e-4 of the largest
 *   |logit|, and the same greedy choice at every position. A converter that
 *   left q/k in Hugging Face order (or wrote a wrong dimension or offset)
 *   fails here.
 * - Q8_0: within the rounding of 32-weight blocks to 8 bits, mean KL over
 *   the positions < 0.01 (printed).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/runtime/runtime.h"
#include "tests/runtime/seq_logits.h"
#include "kernels/cpu/ops.h"

#ifndef MK_GGUF
#error "MK_GGUF: the path of the tool, set by the build"
#endif

static char g_tmp[256];

static const char *src_dir(void) {
    const char *s = getenv("TESSERA_SOURCE_DIR");
    return s ? s : ".";
}

static tsr_model *load(const char *model) {
    char asm_path[4096];
    snprintf(asm_path, sizeof asm_path, "%s/assemblies/cpu-reference.yaml", src_dir());
    tsr_model_opts o = {.model_path = model, .assembly_path = asm_path, .n_threads = 2, .no_tokenizer = 1};
    tsr_error err;
    tsr_error_clear(&err);
    tsr_model *m = NULL;
    if (tsr_model_load(&o, &m, &err) != TSR_OK) fail_msg("loading %s: %s", model, err.msg);
    return m;
}

/* KL(softmax(p) || softmax(q)) in f64. */
static double kl(const float *p, const float *q, int n) {
    double pm = -INFINITY, qm = -INFINITY, pz = 0, qz = 0, s = 0;
    for (int i = 0; i < n; i++) pm = fmax(pm, p[i]), qm = fmax(qm, q[i]);
    for (int i = 0; i < n; i++) pz += exp(p[i] - pm), qz += exp(q[i] - qm);
    for (int i = 0; i < n; i++) {
        const double lp = p[i] - pm - log(pz), lq = q[i] - qm - log(qz);
        s += exp(lp) * (lp - lq);
    }
    return s;
}

/* family's fixture converted with --type type, against the fixture. */
static void check(const char *family, const char *type) {
    char src[4096], dst[4096], cmd[12288];
    snprintf(src, sizeof src, "%s/tests/data/fixtures/transformers/%s", src_dir(), family);
    snprintf(dst, sizeof dst, "%s/%s-%s.gguf", g_tmp, family, type);
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' --type %s", MK_GGUF, src, dst, type);
    if (system(cmd) != 0) fail_msg("%s failed", cmd);
    tsr_model *a = load(src), *b = load(dst);
    const int vocab = tsr_model_get_config(a)->vocab, n = 12;
    assert_int_equal(tsr_model_get_config(b)->vocab, vocab);
    int32_t ids[12];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 7919 + 13) % vocab);
    float *la = seq_logits(a, ids, n), *lb = seq_logits(b, ids, n);
    double big = 0, diff = 0, kls = 0;
    int same = 0;
    for (size_t i = 0; i < (size_t)n * vocab; i++) big = fmax(big, fabs(la[i])), diff = fmax(diff, fabs(la[i] - lb[i]));
    for (int t = 0; t < n; t++) {
        same += tsr_argmax(la + (size_t)t * vocab, vocab) == tsr_argmax(lb + (size_t)t * vocab, vocab);
        kls += kl(la + (size_t)t * vocab, lb + (size_t)t * vocab, vocab);
    }
    printf("%s %s: max |logit difference| %.3g (largest |logit| %.3g), mean KL %.3g, greedy equal at %d of %d\n",
           family, type, diff, big, kls / n, same, n);
    if (!strcmp(type, "f32")) {
        assert_true(diff <= 1e-4 * big);
        assert_int_equal(same, n);
    } else {
        assert_true(kls / n < 0.01);
    }
    free(la);
    free(lb);
    tsr_model_free(a);
    tsr_model_free(b);
    unlink(dst);
}

static void test_llama_f32(void **st) { (void)st, check("llama", "f32"); }
static void test_llama_q8_0(void **st) { (void)st, check("llama", "q8_0"); }
static void test_qwen2_f32(void **st) { (void)st, check("qwen2", "f32"); }
static void test_qwen2_q8_0(void **st) { (void)st, check("qwen2", "q8_0"); }
static void test_qwen3_f32(void **st) { (void)st, check("qwen3", "f32"); }
static void test_qwen3_q8_0(void **st) { (void)st, check("qwen3", "q8_0"); }

static int setup(void **st) {
    (void)st;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/tsr_mk_gguf_XXXXXX");
    return mkdtemp(g_tmp) ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    return rmdir(g_tmp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_f32),
        cmocka_unit_test(test_llama_q8_0),
        cmocka_unit_test(test_qwen2_f32),
        cmocka_unit_test(test_qwen2_q8_0),
        cmocka_unit_test(test_qwen3_f32),
        cmocka_unit_test(test_qwen3_q8_0),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
