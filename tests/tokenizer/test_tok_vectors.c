/*
 * test_tok_vectors.c - llama.cpp's tokenizer test vectors: every string
 * encodes (no BOS) to exactly the listed ids and decodes back to itself.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <time.h>

#include <cmocka.h>
#include <jansson.h>

#include "core/format/gguf.h"
#include "core/tokenizer/tokenizer.h"
#include "tok_test_util.h"

static void print_ids(const char *what, const int32_t *ids, int n) {
    printf("#   %s:", what);
    for (int i = 0; i < n; i++) printf(" %d", ids[i]);
    printf("\n");
}

/* Encode and decode every vector; returns the number of failures. */
static int check_vectors(const tsr_tokenizer *t, const char *inp, const char *out, const char *name,
                         int check_ids) {
    tt_vectors v;
    assert_int_equal(tt_vectors_load(&v, inp, out), 0);
    assert_int_equal(v.n, 46);
    int bad = 0;
    for (int i = 0; i < v.n; i++) {
        int32_t *ids;
        int n;
        tsr_error err;
        int rc = tsr_tokenizer_encode(t, v.str[i], v.len[i], 0, 0, &ids, &n, &err);
        assert_int_equal(rc, TSR_OK);
        int ok = !check_ids || (n == v.n_ids[i] && memcmp(ids, v.ids[i], (size_t)n * sizeof *ids) == 0);
        char *dec = tsr_tokenizer_decode(t, ids, n, 1);
        assert_non_null(dec);
        int dec_ok = strlen(dec) == v.len[i] && memcmp(dec, v.str[i], v.len[i]) == 0;
        if (!ok || !dec_ok) {
            bad++;
            printf("# %s vector %d '%s': %s%s\n", name, i, v.str[i], ok ? "" : "ids differ ",
                   dec_ok ? "" : "decode differs");
            if (!ok) {
                print_ids("want", v.ids[i], v.n_ids[i]);
                print_ids("got ", ids, n);
            }
            if (!dec_ok) printf("#   decoded '%s'\n", dec);
        }
        free(dec);
        free(ids);
    }
    printf("# %s: %d of %d vectors pass\n", name, v.n - bad, v.n);
    tt_vectors_free(&v);
    return bad;
}

static tsr_tokenizer *load_gguf(const char *path) {
    tsr_gguf *g;
    tsr_error err;
    tsr_tokenizer *t = NULL;
    if (tsr_gguf_open(path, &g, &err) != TSR_OK) {
        char buf[1600];
        fail_msg("%s", tsr_error_format(&err, buf, sizeof buf));
    }
    int rc = tsr_tokenizer_load_gguf(g, path, &t, &err);
    if (rc != TSR_OK) {
        char buf[1600];
        tsr_gguf_free(g);
        fail_msg("%s", tsr_error_format(&err, buf, sizeof buf));
    }
    tsr_gguf_free(g); /* the tokenizer keeps copies of what it needs */
    return t;
}

static void test_qwen2_vectors_with_qwen3_json(void **state) {
    char p[4096], inp[4096], out[4096];
    if (!tt_shared("data/tokenizers/qwen3/tokenizer.json", p, sizeof p)) skip();
    tt_src("tests/data/tokenizers/ggml-vocab-qwen2.gguf.inp", inp, sizeof inp);
    tt_src("tests/data/tokenizers/ggml-vocab-qwen2.gguf.out", out, sizeof out);
    tsr_tokenizer *t;
    tsr_error err;
    struct timespec a, b;
    clock_t c0 = clock();
    clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = tsr_tokenizer_load_json(p, &t, &err);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double cpu = (double)(clock() - c0) / CLOCKS_PER_SEC;
    if (rc) {
        char buf[1600];
        fail_msg("%s", tsr_error_format(&err, buf, sizeof buf));
    }
    printf("# qwen3 tokenizer.json loaded in %.3f s (%.3f s of CPU)\n",
           (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9, cpu);
    assert_int_equal(tsr_tokenizer_vocab_size(t), 151669);
    assert_int_equal(tsr_tokenizer_eos(t), 151645); /* <|im_end|> from tokenizer_config.json */
    assert_int_equal(tsr_tokenizer_bos(t), -1);
    assert_int_equal(tsr_tokenizer_adds_bos(t), 0);
    assert_int_equal(check_vectors(t, inp, out, "qwen2", 1), 0);

    /* special tokens: split on them only with parse_special */
    const char *s = "<|im_start|>user\nhi<|im_end|>";
    int32_t *ids;
    int n;
    assert_int_equal(tsr_tokenizer_encode(t, s, strlen(s), 0, 1, &ids, &n, &err), TSR_OK);
    assert_true(n >= 4);
    assert_int_equal(ids[0], 151644);
    assert_int_equal(ids[n - 1], 151645);
    assert_true(tsr_tokenizer_is_special(t, ids[0]));
    char *d = tsr_tokenizer_decode(t, ids, n, 1);
    assert_string_equal(d, "user\nhi");
    free(d);
    d = tsr_tokenizer_decode(t, ids, n, 0);
    assert_string_equal(d, s);
    free(d);
    free(ids);
    assert_int_equal(tsr_tokenizer_encode(t, s, strlen(s), 0, 0, &ids, &n, &err), TSR_OK);
    for (int i = 0; i < n; i++) assert_false(tsr_tokenizer_is_special(t, ids[i]));
    free(ids);
    /* every byte value, invalid UTF-8 included, survives a round trip */
    char all[512];
    for (int i = 0; i < 512; i++) all[i] = (char)(i < 256 ? 255 - i : i - 256);
    assert_int_equal(tsr_tokenizer_encode(t, all, sizeof all, 0, 0, &ids, &n, &err), TSR_OK);
    d = tsr_tokenizer_decode(t, ids, n, 0);
    assert_memory_equal(d, all, 255); /* byte 0 ends the C string */
    size_t total = 0;
    char piece[TSR_TOKEN_MAX_BYTES + 1];
    for (int i = 0; i < n; i++) {
        size_t k = tsr_tokenizer_token_bytes(t, ids[i], 1, piece, sizeof piece);
        assert_true(total + k <= sizeof all);
        assert_memory_equal(piece, all + total, k);
        total += k;
    }
    assert_int_equal(total, sizeof all);
    free(d);
    free(ids);
    /* non-special added tokens (<think>) are always matched */
    assert_true(tsr_tokenizer_token_id(t, "<think>") >= 151643);
    assert_int_equal(tsr_tokenizer_encode(t, "a<think>b", 9, 0, 0, &ids, &n, &err), TSR_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], tsr_tokenizer_token_id(t, "<think>"));
    free(ids);
    tsr_tokenizer_free(t);
}

static void test_llama_spm_vectors(void **state) {
    char g[4096], inp[4096], out[4096];
    tt_src("tests/data/tokenizers/ggml-vocab-llama-spm.gguf", g, sizeof g);
    tt_src("tests/data/tokenizers/ggml-vocab-llama-spm.gguf.inp", inp, sizeof inp);
    tt_src("tests/data/tokenizers/ggml-vocab-llama-spm.gguf.out", out, sizeof out);
    tsr_tokenizer *t = load_gguf(g);
    assert_int_equal(tsr_tokenizer_vocab_size(t), 32000);
    assert_int_equal(tsr_tokenizer_bos(t), 1);
    assert_int_equal(tsr_tokenizer_eos(t), 2);
    assert_int_equal(check_vectors(t, inp, out, "llama-spm", 1), 0);
    /* with BOS; <s> in the text is only a control token with parse_special */
    int32_t *ids;
    int n;
    tsr_error err;
    assert_int_equal(tsr_tokenizer_encode(t, "<s>Hi", 5, 1, 1, &ids, &n, &err), TSR_OK);
    assert_true(n >= 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 1);
    free(ids);
    assert_int_equal(tsr_tokenizer_encode(t, "<s>Hi", 5, 1, 0, &ids, &n, &err), TSR_OK);
    assert_int_equal(ids[0], 1);
    for (int i = 1; i < n; i++) assert_int_not_equal(ids[i], 1);
    free(ids);
    tsr_tokenizer_free(t);
}

static void gguf_vectors(const char *vocab, int check_ids) {
    char g[4096], inp[4200], out[4200], rel[256];
    snprintf(rel, sizeof rel, "data/tokenizers/llamacpp-vocab/ggml-vocab-%s.gguf", vocab);
    if (!tt_shared(rel, g, sizeof g)) skip();
    if (check_ids) {
        snprintf(inp, sizeof inp, "%s.inp", g);
        snprintf(out, sizeof out, "%s.out", g);
    } else { /* no vectors of its own: round-trip the qwen2 strings */
        tt_src("tests/data/tokenizers/ggml-vocab-qwen2.gguf.inp", inp, sizeof inp);
        tt_src("tests/data/tokenizers/ggml-vocab-qwen2.gguf.out", out, sizeof out);
    }
    tsr_tokenizer *t = load_gguf(g);
    assert_int_equal(check_vectors(t, inp, out, vocab, check_ids), 0);
    tsr_tokenizer_free(t);
}

/* pystd's GPT-2-style tokenizer.json (trained with HF tokenizers): the 16
 * held-out prompts of eval.json decode to their text and encode back to
 * exactly their ids. */
static void test_pystd_eval_prompts(void **state) {
    char p[4096], e[4096];
    if (!tt_shared("data/models/pystd/target/tokenizer.json", p, sizeof p)) skip();
    if (!tt_shared("data/models/pystd/eval.json", e, sizeof e)) skip();
    tsr_tokenizer *t;
    tsr_error err;
    assert_int_equal(tsr_tokenizer_load_json(p, &t, &err), TSR_OK);
    assert_int_equal(tsr_tokenizer_bos(t), 1); /* <|bos|> from tokenizer_config.json */
    assert_int_equal(tsr_tokenizer_eos(t), 0);
    json_error_t je;
    json_t *ev = json_load_file(e, 0, &je);
    assert_non_null(ev);
    json_t *prompts = json_object_get(ev, "prompts"), *texts = json_object_get(ev, "prompts_text");
    assert_int_equal(json_array_size(prompts), 16);
    for (size_t i = 0; i < json_array_size(prompts); i++) {
        json_t *pi = json_array_get(prompts, i);
        int n = (int)json_array_size(pi);
        int32_t *want = malloc((size_t)n * sizeof *want);
        for (int k = 0; k < n; k++) want[k] = (int32_t)json_integer_value(json_array_get(pi, (size_t)k));
        const char *text = json_string_value(json_array_get(texts, i));
        char *d = tsr_tokenizer_decode(t, want, n, 0);
        assert_string_equal(d, text);
        free(d);
        int32_t *ids;
        int m;
        assert_int_equal(tsr_tokenizer_encode(t, text, strlen(text), 0, 0, &ids, &m, &err), TSR_OK);
        assert_int_equal(m, n);
        assert_memory_equal(ids, want, (size_t)n * sizeof *ids);
        free(ids);
        free(want);
    }
    json_decref(ev);
    tsr_tokenizer_free(t);
}

static void test_phi3_vectors(void **state) { gguf_vectors("phi-3", 1); }
static void test_gpt2_vectors(void **state) { gguf_vectors("gpt-2", 1); }
static void test_deepseek_llm_round_trip(void **state) { gguf_vectors("deepseek-llm", 0); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen2_vectors_with_qwen3_json),
        cmocka_unit_test(test_llama_spm_vectors),
        cmocka_unit_test(test_phi3_vectors),
        cmocka_unit_test(test_gpt2_vectors),
        cmocka_unit_test(test_deepseek_llm_round_trip),
        cmocka_unit_test(test_pystd_eval_prompts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
