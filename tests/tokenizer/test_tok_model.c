/*
 * test_tok_model.c - the tokenizer that goes with a model: GGUF metadata,
 * tok*.bin beside a llama2.c checkpoint, an explicit override; and GGUF
 * vocabularies that are wrong in one field each.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <jansson.h>

#include "core/format/gguf.h"
#include "core/format/model_file.h"
#include "core/tokenizer/tokenizer.h"
#include "tok_test_util.h"

/* Every reference prompt of stories260K encodes to its input_ids. */
static void check_stories(const tsr_tokenizer *t) {
    char p[4096];
    tt_src("models/stories260K/hf/reference.json", p, sizeof p);
    json_error_t je;
    json_t *ref = json_load_file(p, 0, &je);
    assert_non_null(ref);
    size_t ci;
    json_t *c;
    json_array_foreach(json_object_get(ref, "cases"), ci, c) {
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        json_t *want = json_object_get(c, "input_ids");
        int32_t *ids;
        int n;
        tsr_error err;
        assert_int_equal(tsr_tokenizer_encode(t, prompt, strlen(prompt), tsr_tokenizer_adds_bos(t), 0, &ids, &n, &err),
                         TSR_OK);
        assert_int_equal((size_t)n, json_array_size(want));
        for (int i = 0; i < n; i++) assert_int_equal(ids[i], json_integer_value(json_array_get(want, (size_t)i)));
        free(ids);
    }
    json_decref(ref);
}

static tsr_tokenizer *for_model(const char *rel, const char *override_rel) {
    char p[4096], o[4096];
    tsr_model_file *f;
    tsr_error err;
    char buf[1600];
    tt_src(rel, p, sizeof p);
    if (tsr_model_file_open(p, &f, &err) != TSR_OK) fail_msg("%s", tsr_error_format(&err, buf, sizeof buf));
    tsr_tokenizer *t = NULL;
    int rc = tsr_tokenizer_load_for_model(f, override_rel ? tt_src(override_rel, o, sizeof o) : NULL, &t, &err);
    tsr_model_file_close(f);
    if (rc != TSR_OK) fail_msg("%s", tsr_error_format(&err, buf, sizeof buf));
    return t;
}

static void test_gguf_model(void **state) {
    tsr_tokenizer *t = for_model("models/stories260K/stories260K.gguf", NULL);
    assert_int_equal(tsr_tokenizer_vocab_size(t), 512);
    assert_int_equal(tsr_tokenizer_adds_bos(t), 1);
    check_stories(t);
    tsr_tokenizer_free(t);
}

static void test_llama2c_model(void **state) {
    tsr_tokenizer *t = for_model("models/stories260K/stories260K.bin", NULL); /* finds tok512.bin */
    check_stories(t);
    tsr_tokenizer_free(t);
}

static void test_override(void **state) {
    tsr_tokenizer *t = for_model("models/stories260K/hf", "models/stories260K/tok512.bin");
    check_stories(t);
    tsr_tokenizer_free(t);
    /* the HF copy has no tokenizer.json: a clear error */
    char p[4096];
    tsr_model_file *f;
    tsr_error err;
    tt_src("models/stories260K/hf", p, sizeof p);
    assert_int_equal(tsr_model_file_open(p, &f, &err), TSR_OK);
    assert_int_not_equal(tsr_tokenizer_load_for_model(f, NULL, &t, &err), TSR_OK);
    assert_null(t);
    assert_non_null(strstr(err.msg, "no tokenizer found"));
    tsr_model_file_close(f);
}

/* --- a GGUF written here, one field wrong at a time ----------------------- */

typedef struct gw {
    unsigned char *b;
    size_t n, cap;
    uint64_t n_kv;
} gw;

static void put(gw *w, const void *p, size_t n) {
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2;
        w->b = realloc(w->b, w->cap);
    }
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void put_u32(gw *w, uint32_t v) { put(w, &v, 4); }
static void put_u64(gw *w, uint64_t v) { put(w, &v, 8); }
static void put_s(gw *w, const char *s) {
    put_u64(w, strlen(s));
    put(w, s, strlen(s));
}
static void kv_str(gw *w, const char *k, const char *v) {
    put_s(w, k);
    put_u32(w, 8);
    put_s(w, v);
    w->n_kv++;
}
static void kv_u32(gw *w, const char *k, uint32_t v) {
    put_s(w, k);
    put_u32(w, 4);
    put_u32(w, v);
    w->n_kv++;
}
static void kv_strs(gw *w, const char *k, const char *const *v, int n) {
    put_s(w, k);
    put_u32(w, 9);
    put_u32(w, 8);
    put_u64(w, (uint64_t)n);
    for (int i = 0; i < n; i++) put_s(w, v[i]);
    w->n_kv++;
}
static void kv_arr(gw *w, const char *k, uint32_t type, const void *v, int n) {
    put_s(w, k);
    put_u32(w, 9);
    put_u32(w, type);
    put_u64(w, (uint64_t)n);
    put(w, v, (size_t)n * 4);
    w->n_kv++;
}

enum { F_NO_MODEL = 1, F_BAD_MODEL, F_BAD_PRE, F_BAD_MERGE, F_SCORES_SHORT, F_TYPES_FLOAT, F_BOS_RANGE, F_LLAMA3 };

/* A gpt2 vocabulary: a b ab Ġ <|end|>; or with fault f. */
static int load_built(int f, int spm, tsr_tokenizer **t, tsr_error *err) {
    gw w = {0};
    put(&w, "GGUF", 4);
    put_u32(&w, 3);
    put_u64(&w, 0); /* tensors */
    size_t nkv_at = w.n;
    put_u64(&w, 0);
    const char *toks[] = {"a", "b", "ab", "\xc4\xa0", "<|end|>"};
    const char *spm_toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "\xe2\x96\x81" "a"};
    int32_t types[] = {1, 1, 1, 1, 3};
    int32_t spm_types[] = {2, 3, 3, 1, 1, 1};
    float scores[] = {0, 0, 0, -1, -2, -0.5f};
    if (f != F_NO_MODEL) kv_str(&w, "tokenizer.ggml.model", f == F_BAD_MODEL ? "bert" : spm ? "llama" : "gpt2");
    if (spm) {
        kv_strs(&w, "tokenizer.ggml.tokens", spm_toks, 6);
        kv_arr(&w, "tokenizer.ggml.scores", 6, scores, f == F_SCORES_SHORT ? 5 : 6);
        kv_arr(&w, "tokenizer.ggml.token_type", f == F_TYPES_FLOAT ? 6 : 5, spm_types, 6);
        kv_str(&w, "tokenizer.chat_template", "{% for m in messages %}[INST] {{ m.content }}{% endfor %}");
    } else {
        kv_strs(&w, "tokenizer.ggml.tokens", toks, 5);
        kv_arr(&w, "tokenizer.ggml.token_type", 5, types, 5);
        const char *merges[] = {"a b", f == F_BAD_MERGE ? "b q" : "b a"};
        kv_strs(&w, "tokenizer.ggml.merges", merges, f == F_BAD_MERGE ? 2 : 1);
        kv_str(&w, "tokenizer.ggml.pre", f == F_BAD_PRE ? "mystery" : f == F_LLAMA3 ? "llama-bpe" : "gpt-2");
        kv_str(&w, "tokenizer.chat_template", "{{'<|im_start|>'}}");
    }
    if (f == F_BOS_RANGE) kv_u32(&w, "tokenizer.ggml.bos_token_id", 77);
    memcpy(w.b + nkv_at, &w.n_kv, 8);
    while (w.n % 32) put(&w, "", 1);
    tsr_gguf *g;
    int rc = tsr_gguf_parse(w.b, w.n, "built.gguf", &g, err);
    assert_int_equal(rc, TSR_OK);
    rc = tsr_tokenizer_load_gguf(g, "built.gguf", t, err);
    tsr_gguf_free(g);
    free(w.b);
    return rc;
}

static void test_built_gguf(void **state) {
    tsr_tokenizer *t;
    tsr_error err;
    assert_int_equal(load_built(0, 0, &t, &err), TSR_OK);
    int32_t *ids;
    int n;
    assert_int_equal(tsr_tokenizer_encode(t, "ab ab<|end|>", 12, 0, 1, &ids, &n, &err), TSR_OK);
    assert_int_equal(n, 4); /* "ab" -> ab; " ab" -> Ġ a b -> Ġ ab; <|end|> */
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 2);
    assert_int_equal(ids[3], 4);
    free(ids);
    tsr_chat_format f;
    assert_int_equal(tsr_chat_format_detect(t, &f, &err), TSR_OK);
    assert_int_equal(f, TSR_CHAT_CHATML);
    tsr_tokenizer_free(t);

    assert_int_equal(load_built(0, 1, &t, &err), TSR_OK);
    assert_int_equal(tsr_tokenizer_encode(t, "a a", 3, 1, 0, &ids, &n, &err), TSR_OK);
    assert_int_equal(n, 3); /* <s> ▁a ▁a */
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 5);
    assert_int_equal(ids[2], 5);
    free(ids);
    assert_int_equal(tsr_chat_format_detect(t, &f, &err), TSR_OK);
    assert_int_equal(f, TSR_CHAT_LLAMA2);
    tsr_tokenizer_free(t);

    static const struct {
        int fault, spm, code;
        const char *needle;
    } bad[] = {
        {F_NO_MODEL, 0, TSR_ERR_FORMAT, "tokenizer.ggml.model"},
        {F_BAD_MODEL, 0, TSR_ERR_UNSUPPORTED, "'bert'"},
        {F_BAD_PRE, 0, TSR_ERR_UNSUPPORTED, "tokenizer.ggml.pre 'mystery'"},
        {F_BAD_MERGE, 0, TSR_ERR_FORMAT, "tokenizer.ggml.merges[1]"},
        {F_SCORES_SHORT, 1, TSR_ERR_FORMAT, "tokenizer.ggml.scores"},
        {F_TYPES_FLOAT, 1, TSR_ERR_FORMAT, "tokenizer.ggml.token_type"},
        {F_BOS_RANGE, 0, TSR_ERR_FORMAT, "bos_token_id"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        t = (tsr_tokenizer *)&t;
        int rc = load_built(bad[i].fault, bad[i].spm, &t, &err);
        char buf[1600];
        printf("# fault %d: %s\n", bad[i].fault, tsr_error_format(&err, buf, sizeof buf));
        assert_int_equal(rc, bad[i].code);
        assert_null(t);
        assert_string_equal(err.file, "built.gguf");
        if (!strstr(err.msg, bad[i].needle)) fail_msg("'%s' lacks '%s'", err.msg, bad[i].needle);
    }
    /* llama-bpe: whole pre-tokens that are tokens are taken as is (ignore_merges) */
    assert_int_equal(load_built(F_LLAMA3, 0, &t, &err), TSR_OK);
    tsr_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_model),
        cmocka_unit_test(test_llama2c_model),
        cmocka_unit_test(test_override),
        cmocka_unit_test(test_built_gguf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
