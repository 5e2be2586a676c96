/*
 * FP8 checkpoints on the GPU (ctest label "gpu"; skipped cleanly where no
 * CUDA device is present): the transformers fixtures converted at test time
 * by tools/mk_fp8_checkpoint (tests/runtime/fp8_fixture.h) with per-tensor
 * and per-channel scales (the output head converted too), run through
 * cuda-fast-fp8, which keeps the stored
 * e4m3 bytes and scales, against the reference assembly (ref_gemv, f32) on
 * the same checkpoint. The weights are then the same numbers on both sides,
 * so what differs is bf16 arithmetic (bf16 activations in prefill tiles,
 * bf16 KV): the bound is test_cuda.c's for bf16 arithmetic,
 *     |logit - reference| <= TOL_ABS + TOL_REL * max|reference logit of the row|,
 * with the argmax equal wherever the reference's top-2 margin exceeds twice
 * that. Each checkpoint runs as one prefill and as passes of 1 and 3 rows
 * (replayed as CUDA graphs). Block scales along the rows (DeepSeek-V3
 * style) run through cuda-fast-fp8 (the codes kept, each block's ratio to
 * its row block's largest scale applied to the activations in decode and to
 * the widened weights in the prefill tiles: one more f16 or bf16 rounding)
 * and through cuda-fast (cuda_gemv widens code x scale to bf16 at load, one
 * more bf16 rounding per weight), within the same bound; blocks the kernels
 * cannot apply are refused with TSR_ERR_UNSUPPORTED naming the weight.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/gpu/gpu_env.h"

#include "core/format/safetensors.h"
#include "core/runtime/runtime.h"
#include "tests/gpu/gpu_check.h"
#include "tests/runtime/fp8_fixture.h"
#ifdef TESSERA_CUDA
#include "core/cuda/device.h"
#endif

#define TOL_ABS 0.02
#define TOL_REL 0.05

static int try_load(const char *model, const char *assembly, tsr_model **m, tsr_error *err) {
    char asm_path[4096];
    snprintf(asm_path, sizeof asm_path, "%s/assemblies/%s", fp8_src_dir(), assembly);
    tsr_model_opts o = {.model_path = model, .assembly_path = asm_path, .no_tokenizer = 1};
    tsr_error_clear(err);
    *m = NULL;
    return tsr_model_load(&o, m, err);
}

/* Logits [n, vocab] of ids through assembly, as passes of step rows (0: one). */
static float *logits_of(const char *model, const char *assembly, const int32_t *ids, int n, int vocab, int step,
                        uint64_t *replays) {
    tsr_error err;
    tsr_model *m;
    if (try_load(model, assembly, &m, &err) != TSR_OK) fail_msg("%s with %s: %s", model, assembly, err.msg);
    float *got = malloc((size_t)n * vocab * sizeof *got);
    assert_non_null(got);
    tsr_seq *s;
    assert_int_equal(tsr_seq_new(m, n, &s, &err), TSR_OK);
    if (gpu_run_passes(s, ids, n, vocab, step, got, &err) != TSR_OK) fail_msg("forward: %s", err.msg);
    uint64_t captures;
    tsr_model_graph_stats(m, &captures, replays);
    tsr_seq_free(s);
    tsr_model_free(m);
    return got;
}

static void check(const char *family, const char *style, const char *args, const char *assembly) {
    GPU_REQUIRE("FP8 checkpoint checks");
    char dir[4096], fix[4096], ref_path[4200], name[128];
    snprintf(name, sizeof name, "%s-%s", family, style);
    fp8_make_ckpt(family, name, args, dir, NULL, sizeof dir);
    fp8_fixture_dir(family, fix, sizeof fix);
    snprintf(ref_path, sizeof ref_path, "%s/reference.safetensors", fix);
    gpu_ref ref;
    gpu_ref_open(&ref, ref_path, "input_ids", "logits");
    const int n = ref.n, vocab = ref.vocab;
    uint64_t replays = 0;
    float *want = logits_of(dir, "cpu-reference.yaml", ref.ids, n, vocab, 0, &replays);
    for (int step = 0; step <= 3; step += step ? 2 : 1) {
        float *got = logits_of(dir, assembly, ref.ids, n, vocab, step, &replays);
        if (step > 0 && n > 2 * step + 1 && replays == 0) fail_msg("%s: no pass was replayed as a graph", name);
        double worst = 0, worst_rel = 0;
        int argmax_checked = 0;
        for (int r = 0; r < n; r++) {
            const float *w = want + (size_t)r * vocab;
            const gpu_row c = gpu_check_row(w, got + (size_t)r * vocab, vocab, TOL_ABS, TOL_REL);
            if (!(c.worst <= c.bound)) fail_msg("%s row %d: |logit diff| %g > bound %g", name, r, c.worst, c.bound);
            if (c.worst > worst) worst = c.worst;
            if (c.worst / c.bound > worst_rel) worst_rel = c.worst / c.bound;
            if (w[c.want_top] - w[c.want_second] > 2 * c.bound) {
                argmax_checked++;
                if (c.got_top != c.want_top)
                    fail_msg("%s row %d: argmax %d, reference %d", name, r, c.got_top, c.want_top);
            }
        }
        printf("# %s via %s, passes of %d rows: max |diff| to ref_gemv on the same checkpoint %.4g "
               "(%.0f%% of the bound), argmax equal on %d/%d rows with a clear margin\n",
               name, assembly, step ? step : n, worst, 100 * worst_rel, argmax_checked, n);
        free(got);
    }
    free(want);
    gpu_ref_close(&ref);
}

/* --lm-head: the output head stored as FP8 too, so that no weight is
 * quantised at load (which would add e4m3 rounding on one side only). */
#define FP8 "cuda-fast-fp8.yaml"
static void test_llama_tensor(void **s) { (void)s; check("llama", "tensor", "--style tensor --lm-head", FP8); }
static void test_llama_channel(void **s) {
    (void)s;
    check("llama", "channel", "--style channel --scale-dtype bf16 --lm-head", FP8);
}
static void test_qwen2_channel(void **s) { (void)s; check("qwen2", "channel", "--style channel --lm-head", FP8); }
static void test_qwen3_tensor(void **s) { (void)s; check("qwen3", "tensor", "--style tensor --lm-head", FP8); }
/* Blocks through cuda-fast: cuda_gemv widens code x scale to bf16 at load
 * (one bf16 rounding of each weight, within the same bf16 bound). */
static void test_llama_blocks_bf16(void **s) {
    (void)s;
    check("llama", "block", "--style block --block 16,24", "cuda-fast.yaml");
}
static void test_qwen3_blocks_bf16(void **s) { (void)s; check("qwen3", "block128", "--style block", "cuda-fast.yaml"); }

/* Blocks through cuda-fast-fp8: 16 x 16 and 32 x 32 split every projection of
 * the fixtures (64 and 128 columns) into column blocks; Qwen3-FP8's 128 x 128
 * leaves them one block wide (a scale per row block). */
static void test_llama_blocks(void **s) { (void)s; check("llama", "block16", "--style block --block 16,16 --lm-head", FP8); }
static void test_qwen2_blocks(void **s) { (void)s; check("qwen2", "block32", "--style block --block 32,32 --lm-head", FP8); }
static void test_qwen3_blocks(void **s) { (void)s; check("qwen3", "block128fp8", "--style block --lm-head", FP8); }
/* Mixtures of experts (the experts chosen on the device, replayed as graphs;
 * the router stays f32 in the checkpoint, as real ones keep theirs
 * unquantised, and cuda_gemv_fp8 holds it in bf16): per channel, and blocks
 * of 16 x 16 (each expert's block ratios through run_experts' table). */
static void test_mixtral_channel(void **s) { (void)s; check("mixtral", "channel", "--style channel --lm-head", FP8); }
static void test_qwen3_moe_blocks(void **s) {
    (void)s;
    check("qwen3_moe", "block16", "--style block --block 16,16 --lm-head", FP8);
}

static void test_blocks_refused(void **s) {
    (void)s;
    GPU_REQUIRE("FP8 checkpoint checks");
    char dir[4096];
    fp8_make_ckpt("llama", "blocks24", "--style block --block 16,24", dir, NULL, sizeof dir);
    tsr_model *m;
    tsr_error err;
    int rc = try_load(dir, "cuda-fast-fp8.yaml", &m, &err);
    printf("# %s: %s\n", dir, err.msg);
    assert_int_equal(rc, TSR_ERR_UNSUPPORTED);
    assert_null(m);
    if (!strstr(err.msg, "_proj.weight") || !strstr(err.msg, "power of two"))
        fail_msg("the refusal names neither the weight nor why: %s", err.msg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_tensor),  cmocka_unit_test(test_llama_channel),
        cmocka_unit_test(test_qwen2_channel), cmocka_unit_test(test_qwen3_tensor),
        cmocka_unit_test(test_llama_blocks_bf16), cmocka_unit_test(test_qwen3_blocks_bf16),
        cmocka_unit_test(test_llama_blocks),  cmocka_unit_test(test_qwen2_blocks),
        cmocka_unit_test(test_qwen3_blocks),
        cmocka_unit_test(test_mixtral_channel),
        cmocka_unit_test(test_qwen3_moe_blocks),  cmocka_unit_test(test_blocks_refused),
    };
    return cmocka_run_group_tests(tests, fp8_setup, fp8_teardown);
}
