/*
 * test_tok_spm.c - llama2.c's tok512.bin against stories260K's reference
 * (transformers' input ids and greedy text), and streaming detokenization.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <jansson.h>

#include "core/format/gguf.h"
#include "core/tokenizer/tokenizer.h"
#include "tok_test_util.h"

/* Independent UTF-8 check (RFC 3629 table 3-7): 1 if s[0..n) is valid. */
static int valid_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c <= 0x7F) { i++; continue; }
        else if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c == 0xE0) { k = 2; lo = 0xA0; }
        else if (c >= 0xE1 && c <= 0xEC) k = 2;
        else if (c == 0xED) { k = 2; hi = 0x9F; }
        else if (c >= 0xEE && c <= 0xEF) k = 2;
        else if (c == 0xF0) { k = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) k = 3;
        else if (c == 0xF4) { k = 3; hi = 0x8F; }
        else return 0;
        if (i + k >= n) return 0; /* truncated */
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t j = 2; j <= k; j++)
            if (s[i + j] < 0x80 || s[i + j] > 0xBF) return 0;
        i += k + 1;
    }
    return 1;
}

static tsr_tokenizer *load_tok512(void) {
    char p[4096];
    tsr_tokenizer *t;
    tsr_error err;
    tt_src("models/stories260K/tok512.bin", p, sizeof p);
    int rc = tsr_tokenizer_load_llama2c(p, 512, &t, &err);
    if (rc) {
        char b[1600];
        fail_msg("%s", tsr_error_format(&err, b, sizeof b));
    }
    return t;
}

static void test_stories260k_reference(void **state) {
    char p[4096];
    tt_src("models/stories260K/hf/reference.json", p, sizeof p);
    json_error_t je;
    json_t *ref = json_load_file(p, 0, &je);
    assert_non_null(ref);
    tsr_tokenizer *t = load_tok512();
    assert_int_equal(tsr_tokenizer_vocab_size(t), 512);
    assert_int_equal(tsr_tokenizer_bos(t), 1);
    assert_int_equal(tsr_tokenizer_eos(t), 2);
    json_t *cases = json_object_get(ref, "cases");
    assert_int_equal(json_array_size(cases), 3);
    size_t ci;
    json_t *c;
    json_array_foreach(cases, ci, c) {
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        json_t *want = json_object_get(c, "input_ids");
        int32_t *ids;
        int n;
        tsr_error err;
        assert_int_equal(tsr_tokenizer_encode(t, prompt, strlen(prompt), 1, 0, &ids, &n, &err), TSR_OK);
        assert_int_equal((size_t)n, json_array_size(want));
        for (int i = 0; i < n; i++) assert_int_equal(ids[i], json_integer_value(json_array_get(want, (size_t)i)));
        char *d = tsr_tokenizer_decode(t, ids, n, 1); /* BOS skipped, dummy prefix dropped */
        assert_string_equal(d, prompt);
        free(d);
        free(ids);

        json_t *g = json_object_get(c, "greedy_ids");
        const char *text = json_string_value(json_object_get(c, "greedy_text"));
        int ng = (int)json_array_size(g);
        int32_t gids[64];
        assert_true(ng > 0 && ng <= 64);
        for (int i = 0; i < ng; i++) gids[i] = (int32_t)json_integer_value(json_array_get(g, (size_t)i));
        d = tsr_tokenizer_decode_ex(t, gids, ng, 1, 0); /* a continuation keeps its space */
        assert_string_equal(d, text);
        free(d);
        /* streamed, the same text */
        tsr_detok dt;
        tsr_detok_init(&dt, t, 0);
        char all[4096] = "", out[TSR_DETOK_OUT_MIN];
        for (int i = 0; i < ng; i++) {
            tsr_detok_push(&dt, gids[i], out, sizeof out);
            strcat(all, out);
        }
        tsr_detok_flush(&dt, out, sizeof out);
        strcat(all, out);
        assert_string_equal(all, text);
    }
    json_decref(ref);
    tsr_tokenizer_free(t);
}

/* Push ids one by one: no chunk splits a character, the chunks add up to decode. */
static int stream_check(const tsr_tokenizer *t, const int32_t *ids, int n, int strip, const char *want) {
    tsr_detok d;
    tsr_detok_init(&d, t, strip);
    size_t cap = 1 << 16, len = 0;
    char *all = calloc(1, cap), out[TSR_DETOK_OUT_MIN];
    int held = 0;
    for (int i = 0; i <= n; i++) {
        size_t k = i < n ? tsr_detok_push(&d, ids[i], out, sizeof out) : tsr_detok_flush(&d, out, sizeof out);
        assert_int_equal(k, strlen(out));
        assert_true(valid_utf8((const unsigned char *)out, k));
        if (k == 0 && i < n && !tsr_tokenizer_is_special(t, ids[i])) held++;
        assert_true(len + k < cap);
        memcpy(all + len, out, k);
        len += k;
    }
    all[len] = '\0';
    assert_string_equal(all, want);
    free(all);
    return held;
}

static const char *k_text = "Hi 🦙 and 😀! 日本語のテキスト, naïve café — ok 🇯🇵";

static void test_detok_byte_fallback_spm(void **state) {
    tsr_tokenizer *t = load_tok512();
    int32_t *ids;
    int n;
    tsr_error err;
    assert_int_equal(tsr_tokenizer_encode(t, k_text, strlen(k_text), 1, 0, &ids, &n, &err), TSR_OK);
    /* the tiny vocabulary has no CJK or emoji: they fall back to byte tokens */
    int bytes = 0;
    for (int i = 0; i < n; i++) bytes += ids[i] >= 3 && ids[i] <= 258;
    assert_true(bytes > 20);
    char *d = tsr_tokenizer_decode(t, ids, n, 1);
    assert_string_equal(d, k_text);
    int held = stream_check(t, ids, n, 1, d);
    assert_true(held > 10); /* bytes of split characters were held back */
    free(d);
    free(ids);

    /* invalid bytes never leave as such: lone 0xFF at once, a dangling lead at flush */
    tsr_detok dt;
    char out[TSR_DETOK_OUT_MIN];
    tsr_detok_init(&dt, t, 0);
    assert_int_equal(tsr_detok_push(&dt, 3 + 0xFF, out, sizeof out), 3);
    assert_string_equal(out, "\xEF\xBF\xBD");
    assert_int_equal(tsr_detok_push(&dt, 3 + 0xE6, out, sizeof out), 0);
    assert_int_equal(tsr_detok_push(&dt, 3 + 0x97, out, sizeof out), 0);
    assert_int_equal(tsr_detok_push(&dt, 3 + 'A', out, sizeof out), 7); /* E6 97 then A: broken */
    assert_string_equal(out, "\xEF\xBF\xBD\xEF\xBF\xBD" "A");
    assert_int_equal(tsr_detok_push(&dt, 3 + 0xE6, out, sizeof out), 0);
    assert_int_equal(tsr_detok_flush(&dt, out, sizeof out), 3);
    assert_string_equal(out, "\xEF\xBF\xBD");
    assert_int_equal(tsr_detok_flush(&dt, out, sizeof out), 0);
    tsr_tokenizer_free(t);
}

static void test_detok_llama_spm_and_qwen(void **state) {
    char p[4096];
    tsr_error err;
    tsr_tokenizer *t = NULL;
    tsr_gguf *g;
    tt_src("tests/data/tokenizers/ggml-vocab-llama-spm.gguf", p, sizeof p);
    assert_int_equal(tsr_gguf_open(p, &g, &err), TSR_OK);
    assert_int_equal(tsr_tokenizer_load_gguf(g, p, &t, &err), TSR_OK);
    tsr_gguf_free(g);
    int32_t *ids;
    int n;
    assert_int_equal(tsr_tokenizer_encode(t, k_text, strlen(k_text), 1, 0, &ids, &n, &err), TSR_OK);
    char *d = tsr_tokenizer_decode(t, ids, n, 1);
    assert_string_equal(d, k_text);
    assert_true(stream_check(t, ids, n, 1, d) > 0);
    free(d);
    free(ids);
    tsr_tokenizer_free(t);

    if (!tt_shared("data/tokenizers/qwen3/tokenizer.json", p, sizeof p)) skip();
    assert_int_equal(tsr_tokenizer_load_json(p, &t, &err), TSR_OK);
    assert_int_equal(tsr_tokenizer_encode(t, k_text, strlen(k_text), 0, 0, &ids, &n, &err), TSR_OK);
    d = tsr_tokenizer_decode(t, ids, n, 1);
    assert_string_equal(d, k_text);
    /* byte-level BPE splits rare emoji across tokens too */
    stream_check(t, ids, n, 0, d);
    free(d);
    free(ids);
    tsr_tokenizer_free(t);
}

/* SentencePiece-style tokenizer.json, ids worked out by hand from the merge
 * ranks: "\u2581 a" 0, "a b" 1, "\u2581a b" 2, "\u2581 \u2581" 3. */
static char *spm_json(const char *normalizer, const char *pre) {
    static char buf[16384];
    char *o = buf;
    o += sprintf(o, "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\", "
                    "\"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, ");
    for (int b = 0; b < 256; b++) o += sprintf(o, "\"<0x%02X>\": %d, ", b, 3 + b);
    o += sprintf(o, "\"\u2581\": 259, \"a\": 260, \"b\": 261, \"\u2581a\": 262, \"ab\": 263, "
                    "\"\u2581ab\": 264, \"\u2581\u2581\": 265}, "
                    "\"merges\": [\"\u2581 a\", \"a b\", \"\u2581a b\", \"\u2581 \u2581\"]}, "
                    "\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true}, "
                    "{\"id\": 1, \"content\": \"<s>\", \"special\": true}, "
                    "{\"id\": 2, \"content\": \"</s>\", \"special\": true}], "
                    "\"normalizer\": %s, \"pre_tokenizer\": %s, "
                    "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": ["
                    "{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\"}}]}}",
                 normalizer, pre);
    return buf;
}

static void expect_ids(const tsr_tokenizer *t, const char *text, int bos, int special, const int32_t *want, int n_want) {
    int32_t *ids;
    int n;
    tsr_error err;
    assert_int_equal(tsr_tokenizer_encode(t, text, strlen(text), bos, special, &ids, &n, &err), TSR_OK);
    if (n != n_want || memcmp(ids, want, (size_t)n * sizeof *ids) != 0) {
        printf("# '%s':", text);
        for (int i = 0; i < n; i++) printf(" %d", ids[i]);
        printf("\n");
        fail_msg("ids differ for '%s'", text);
    }
    char *d = tsr_tokenizer_decode(t, ids, n, 1);
    if (!special) assert_string_equal(d, text);
    free(d);
    free(ids);
}

static void test_spm_tokenizer_json(void **state) {
    tsr_tokenizer *t;
    tsr_error err;
    /* Llama 2 on the Hub (legacy): Prepend + Replace normalizer, no pre-tokenizer */
    const char *j = spm_json("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", "
                             "\"prepend\": \"\u2581\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
                             "\"content\": \"\u2581\"}]}",
                             "null");
    if (tsr_tokenizer_load_json_mem(j, strlen(j), "llama2.json", &t, &err) != TSR_OK) fail_msg("%s", err.msg);
    assert_int_equal(tsr_tokenizer_bos(t), 1);
    assert_int_equal(tsr_tokenizer_adds_bos(t), 1);
    assert_true(tsr_tokenizer_strips_leading_space(t));
    expect_ids(t, "ab a", 1, 0, (const int32_t[]){1, 264, 262}, 3);
    expect_ids(t, "\xc3\xa9", 0, 0, (const int32_t[]){259, 3 + 0xC3, 3 + 0xA9}, 3); /* byte fallback */
    expect_ids(t, "  a", 0, 0, (const int32_t[]){265, 262}, 2);
    expect_ids(t, "<s>ab", 0, 1, (const int32_t[]){1, 264}, 2); /* Prepend: every fragment */
    tsr_tokenizer_free(t);

    /* Metaspace, prepend_scheme first, split: pieces start at each U+2581 */
    j = spm_json("null", "{\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"first\", "
                         "\"split\": true}");
    if (tsr_tokenizer_load_json_mem(j, strlen(j), "metaspace.json", &t, &err) != TSR_OK) fail_msg("%s", err.msg);
    expect_ids(t, "ab a", 0, 0, (const int32_t[]){264, 262}, 2);
    expect_ids(t, "  a", 0, 0, (const int32_t[]){259, 259, 262}, 3);
    expect_ids(t, "<s>ab", 0, 1, (const int32_t[]){1, 263}, 2); /* first: no prefix after <s> */
    expect_ids(t, "q", 0, 0, (const int32_t[]){259, 3 + 'q'}, 2);
    tsr_tokenizer_free(t);

    /* unsupported variants say so */
    j = spm_json("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Lowercase\"}, {\"type\": \"Replace\", "
                 "\"pattern\": {\"String\": \" \"}, \"content\": \"\u2581\"}]}",
                 "null");
    assert_int_equal(tsr_tokenizer_load_json_mem(j, strlen(j), "bad.json", &t, &err), TSR_ERR_UNSUPPORTED);
    j = spm_json("{\"type\": \"Lowercase\"}", "{\"type\": \"Metaspace\", \"replacement\": \"\u2581\"}");
    assert_int_equal(tsr_tokenizer_load_json_mem(j, strlen(j), "bad.json", &t, &err), TSR_ERR_UNSUPPORTED);
    j = spm_json("null", "{\"type\": \"Metaspace\", \"replacement\": \"_\"}");
    assert_int_equal(tsr_tokenizer_load_json_mem(j, strlen(j), "bad.json", &t, &err), TSR_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "replacement"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k_reference),
        cmocka_unit_test(test_detok_byte_fallback_spm),
        cmocka_unit_test(test_detok_llama_spm_and_qwen),
        cmocka_unit_test(test_spm_tokenizer_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
