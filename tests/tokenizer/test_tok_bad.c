/*
 * test_tok_bad.c - malformed tokenizer.json, tokenizer_config.json and
 * llama2.c tokenizers: each gives its status and a message naming the
 * problem, never a crash; plus a tiny valid tokenizer.json whose encoding is
 * worked out by hand.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/tokenizer/tokenizer.h"
#include "tok_test_util.h"

#define BL "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},\"decoder\":{\"type\":\"ByteLevel\"}"
#define VOC "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\\u0120\":3}"

typedef struct bad_case {
    const char *json;
    int code;
    const char *needle; /* must occur in the message */
} bad_case;

static const bad_case k_bad[] = {
    {"not json at all", TSR_ERR_FORMAT, "not valid JSON"},
    {"{\"model\": {\"type\": \"BPE\",", TSR_ERR_FORMAT, "not valid JSON"},
    {"[1, 2]", TSR_ERR_FORMAT, "not a JSON object"},
    {"{}", TSR_ERR_FORMAT, "'model' is missing"},
    {"{\"model\": 5}", TSR_ERR_FORMAT, "'model' is not an object"},
    {"{\"model\": {\"type\": 7}}", TSR_ERR_FORMAT, "model.type"},
    {"{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", TSR_ERR_UNSUPPORTED, "Unigram"},
    {"{\"model\": {\"type\": \"BPE\"}}", TSR_ERR_FORMAT, "model.vocab is missing"},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": [\"a\"]}}", TSR_ERR_FORMAT, "model.vocab is not an object"},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}", TSR_ERR_FORMAT, "empty"},
    {"{\"model\": {\"vocab\": {\"a\": \"0\"}}}", TSR_ERR_FORMAT, "model.vocab['a']"},
    {"{\"model\": {\"vocab\": {\"a\": -1}}}", TSR_ERR_FORMAT, "model.vocab['a']"},
    {"{\"model\": {\"vocab\": {\"a\": 1.5}}}", TSR_ERR_FORMAT, "model.vocab['a']"},
    {"{\"model\": {\"vocab\": {\"a\": 4000000000}}}", TSR_ERR_FORMAT, "model.vocab['a']"},
    {"{\"model\": {\"vocab\": {\"a\": 9223372036854775807}}}", TSR_ERR_FORMAT, "model.vocab['a']"},
    {"{\"model\": {\"vocab\": {\"a\": 4000000}}}", TSR_ERR_FORMAT, "sparse"},
    {"{\"model\": {\"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": 3000, \"content\": \"x\"}]}",
     TSR_ERR_FORMAT, "sparse"},
    {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 0}}, " BL "}", TSR_ERR_FORMAT, "given twice"},
    {"{\"model\": {\"vocab\": {\"a\": 0, \"a\": 1}}, " BL "}", TSR_ERR_FORMAT, "'a' is given twice"},
    {"{\"model\": {\"vocab\": {\"a\": 0}, \"vocab\": {\"b\": 0}}}", TSR_ERR_FORMAT, "duplicate"},
    {"{\"model\": {\"vocab\": {\"a\": 0, \"b\\x\": 1}}}", TSR_ERR_FORMAT, "not valid JSON"},
    {"{\"model\": {\"vocab\": {\"\\ud800\": 0}}}", TSR_ERR_FORMAT, "not valid JSON"},
    {"{\"model\": {\"vocab\": {\"a\": 0,}}}", TSR_ERR_FORMAT, "not valid JSON"},
    {"{\"model\": {\"vocab\": {\"a\": 1e3}}}", TSR_ERR_FORMAT, "model.vocab['a']"},
    {"{\"model\": {\"vocab\": {\"a\": 01}}}", TSR_ERR_FORMAT, "model.vocab['a']"},
    {"{\"model\": {" VOC ", \"merges\": {}}}", TSR_ERR_FORMAT, "model.merges"},
    {"{\"model\": {" VOC ", \"merges\": [\"a c\"]}, " BL "}", TSR_ERR_FORMAT, "'c' is not in the vocabulary"},
    {"{\"model\": {" VOC ", \"merges\": [\"b b\"]}, " BL "}", TSR_ERR_FORMAT, "merged token 'bb'"},
    {"{\"model\": {" VOC ", \"merges\": [\"ab\"]}, " BL "}", TSR_ERR_FORMAT, "model.merges[0]"},
    {"{\"model\": {" VOC ", \"merges\": [\"a b\", 5]}, " BL "}", TSR_ERR_FORMAT, "model.merges[1]"},
    {"{\"model\": {" VOC ", \"merges\": [[\"a\"]]}, " BL "}", TSR_ERR_FORMAT, "model.merges[0]"},
    {"{\"model\": {" VOC ", \"merges\": [[\"a\", 1]]}, " BL "}", TSR_ERR_FORMAT, "model.merges[0]"},
    {"{\"model\": {" VOC "}, \"added_tokens\": 5, " BL "}", TSR_ERR_FORMAT, "added_tokens"},
    {"{\"model\": {" VOC "}, \"added_tokens\": [{\"id\": 9}], " BL "}", TSR_ERR_FORMAT, "added_tokens"},
    {"{\"model\": {" VOC "}, \"added_tokens\": [{\"id\": 0, \"content\": \"zz\"}], " BL "}", TSR_ERR_FORMAT,
     "added_tokens: id 0"},
    {"{\"model\": {" VOC "}, \"added_tokens\": [{\"id\": 99999999, \"content\": \"x\"}], " BL "}",
     TSR_ERR_FORMAT, "added_tokens"},
    {"{\"model\": {" VOC ", \"ignore_merges\": \"yes\"}, " BL "}", TSR_ERR_FORMAT, "ignore_merges"},
    {"{\"model\": {" VOC "}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}}, "
     "\"decoder\": {\"type\": \"ByteLevel\"}}",
     TSR_ERR_FORMAT, "does not compile"},
    {"{\"model\": {" VOC "}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {}}, "
     "\"decoder\": {\"type\": \"ByteLevel\"}}",
     TSR_ERR_FORMAT, "neither Regex nor String"},
    {"{\"model\": {" VOC "}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, "
     "\"behavior\": \"Removed\"}, \"decoder\": {\"type\": \"ByteLevel\"}}",
     TSR_ERR_UNSUPPORTED, "Removed"},
    {"{\"model\": {" VOC "}, \"pre_tokenizer\": {\"type\": \"Whitespace\"}}", TSR_ERR_UNSUPPORTED, "Whitespace"},
    {"{\"model\": {" VOC "}, \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": 3}}", TSR_ERR_FORMAT,
     "pretokenizers"},
    {"{\"model\": {" VOC "}, \"pre_tokenizer\": {\"pattern\": 1}}", TSR_ERR_FORMAT, "'type'"},
    {"{\"model\": {" VOC "}}", TSR_ERR_UNSUPPORTED, "byte-level"},
    {"{\"model\": {" VOC "}, \"normalizer\": {\"type\": \"Lowercase\"}, " BL "}", TSR_ERR_UNSUPPORTED,
     "Lowercase"},
};

static void test_bad_json_table(void **state) {
    for (size_t i = 0; i < sizeof k_bad / sizeof *k_bad; i++) {
        const bad_case *c = &k_bad[i];
        tsr_tokenizer *t = (tsr_tokenizer *)&t; /* must be reset to NULL */
        tsr_error err;
        int rc = tsr_tokenizer_load_json_mem(c->json, strlen(c->json), "bad.json", &t, &err);
        char buf[1600];
        tsr_error_format(&err, buf, sizeof buf);
        printf("# case %zu: %s\n", i, buf);
        assert_int_equal(rc, c->code);
        assert_int_equal(err.code, c->code);
        assert_null(t);
        assert_string_equal(err.file, "bad.json");
        if (!strstr(err.msg, c->needle)) fail_msg("case %zu: '%s' lacks '%s'", i, err.msg, c->needle);
    }
}

static void test_not_json_has_position(void **state) {
    const char *s = "{\n  \"model\": {\n    \"vocab\": {\"a\": 0,,}\n}";
    tsr_tokenizer *t;
    tsr_error err;
    assert_int_equal(tsr_tokenizer_load_json_mem(s, strlen(s), "pos.json", &t, &err), TSR_ERR_FORMAT);
    assert_int_equal(err.line, 3);
    assert_true(err.col > 0);
    /* positions from the direct vocab/merges reader, and from jansson after a blanked span */
    s = "{\"model\": {\n  \"vocab\": {\"a\": 0,\n    \"b\": 1.5}}}";
    assert_int_equal(tsr_tokenizer_load_json_mem(s, strlen(s), "pos.json", &t, &err), TSR_ERR_FORMAT);
    assert_int_equal(err.line, 3);
    assert_int_equal(err.col, 10);
    assert_non_null(strstr(err.msg, "model.vocab['b']"));
    s = "{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2},\n\"merges\": [\"a b\",\n  \"a q\"]}, " BL "}";
    assert_int_equal(tsr_tokenizer_load_json_mem(s, strlen(s), "pos.json", &t, &err), TSR_ERR_FORMAT);
    assert_int_equal(err.line, 3);
    assert_int_equal(err.col, 3);
    assert_non_null(strstr(err.msg, "model.merges[1]: 'q'"));
    s = "{\"model\": {\"vocab\": {\"a\": 0,\n \"b\": 1}},\n \"added_tokens\": [,]}";
    assert_int_equal(tsr_tokenizer_load_json_mem(s, strlen(s), "pos.json", &t, &err), TSR_ERR_FORMAT);
    assert_int_equal(err.line, 3);
    assert_int_equal(err.col, 19);
}

static void test_huge_token(void **state) {
    size_t n = 5000;
    char *s = malloc(n + 200);
    char *p = s + sprintf(s, "{\"model\": {\"vocab\": {\"");
    memset(p, 'x', n);
    p += n;
    sprintf(p, "\": 0}}, " BL "}");
    tsr_tokenizer *t;
    tsr_error err;
    assert_int_equal(tsr_tokenizer_load_json_mem(s, strlen(s), "huge.json", &t, &err), TSR_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "bytes long"));
    free(s);
}

/* vocab a, b, ab, Ġ (space); merge "a b". GPT-2 regex: "ab ab" -> "ab", " ab"
 * -> [ab] [Ġ a b -> Ġ ab] = 2 3 2; "c" has no byte token and is dropped. */
static void test_tiny_valid(void **state) {
    const char *s = "{\"model\": {\"type\": \"BPE\", " VOC ", \"merges\": [\"a b\"]}, "
                    "\"added_tokens\": [{\"id\": 4, \"content\": \"<|end|>\", \"special\": true}], " BL "}";
    tsr_tokenizer *t;
    tsr_error err;
    assert_int_equal(tsr_tokenizer_load_json_mem(s, strlen(s), "tiny.json", &t, &err), TSR_OK);
    assert_int_equal(tsr_tokenizer_vocab_size(t), 5);
    int32_t *ids;
    int n;
    assert_int_equal(tsr_tokenizer_encode(t, "ab abc<|end|>", 13, 0, 1, &ids, &n, &err), TSR_OK);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 2);
    assert_int_equal(ids[3], 4);
    char *d = tsr_tokenizer_decode(t, ids, n, 1);
    assert_string_equal(d, "ab ab");
    free(d);
    d = tsr_tokenizer_decode(t, ids, n, 0);
    assert_string_equal(d, "ab ab<|end|>");
    free(d);
    free(ids);
    /* "ba" has no merge: b a */
    assert_int_equal(tsr_tokenizer_encode(t, "ba", 2, 0, 0, &ids, &n, &err), TSR_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 0);
    free(ids);
    /* arbitrary bytes, invalid UTF-8 included: no crash */
    const char junk[] = "\xff\xfe a\x80\xc3 b\xe2\x82";
    assert_int_equal(tsr_tokenizer_encode(t, junk, sizeof junk - 1, 0, 1, &ids, &n, &err), TSR_OK);
    free(ids);
    tsr_tokenizer_free(t);
}

/* Llama 3: BOS comes from the post_processor's template */
static void test_post_processor_bos(void **state) {
    const char *s = "{\"model\": {" VOC "}, \"added_tokens\": [{\"id\": 7, \"content\": \"<|begin|>\", "
                    "\"special\": true}], \"post_processor\": {\"type\": \"Sequence\", \"processors\": ["
                    "{\"type\": \"ByteLevel\"}, {\"type\": \"TemplateProcessing\", \"single\": ["
                    "{\"SpecialToken\": {\"id\": \"<|begin|>\", \"type_id\": 0}}, "
                    "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}]}]}, " BL "}";
    tsr_tokenizer *t;
    tsr_error err;
    assert_int_equal(tsr_tokenizer_load_json_mem(s, strlen(s), "pp.json", &t, &err), TSR_OK);
    assert_int_equal(tsr_tokenizer_bos(t), 7);
    assert_int_equal(tsr_tokenizer_adds_bos(t), 1);
    tsr_tokenizer_free(t);
    const char *bad = "{\"model\": {" VOC "}, \"post_processor\": {\"type\": \"TemplateProcessing\", "
                      "\"single\": [{\"SpecialToken\": {\"id\": \"<nope>\"}}]}, " BL "}";
    assert_int_equal(tsr_tokenizer_load_json_mem(bad, strlen(bad), "pp.json", &t, &err), TSR_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "post_processor"));
}

/* A regex that can match the empty string at the end of a piece (found by
 * fuzz_tokenizer: stepping past that match read one byte beyond the text). */
static void test_empty_regex_match(void **state) {
    const char *s = "{\"model\": {" VOC ", \"merges\": [\"a b\"]}, \"pre_tokenizer\": {\"type\": \"Sequence\", "
                    "\"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s*(?!\\\\S)|\\\\p{L}+\"}, "
                    "\"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}, "
                    "\"decoder\": {\"type\": \"ByteLevel\"}}";
    tsr_tokenizer *t;
    tsr_error err;
    if (tsr_tokenizer_load_json_mem(s, strlen(s), "empty.json", &t, &err) != TSR_OK) fail_msg("%s", err.msg);
    /* text, and its decoding ("!" has no token in this vocabulary and is dropped);
     * a piece ending in a character no alternative matches is the hard case */
    const char *texts[][2] = {{"ab", "ab"}, {"ab ", "ab "}, {" ab", " ab"}, {"a b  ab", "a b  ab"},
                              {"", ""}, {"ab!", "ab"}, {"!", ""}, {"a !", "a "}};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        int32_t *ids;
        int n;
        size_t len = strlen(texts[i][0]);
        char *exact = malloc(len ? len : 1); /* no NUL after the text: reads past it are caught */
        memcpy(exact, texts[i][0], len);
        assert_int_equal(tsr_tokenizer_encode(t, exact, len, 0, 0, &ids, &n, &err), TSR_OK);
        free(exact);
        char *d = tsr_tokenizer_decode(t, ids, n, 0);
        assert_string_equal(d, texts[i][1]);
        free(d);
        free(ids);
    }
    tsr_tokenizer_free(t);
}

static char tmpdir[256];

static void write_file(const char *name, const char *text, size_t n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fwrite(text, 1, n, f);
    fclose(f);
}

static void test_files(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tsr_tok_bad.XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    char p[512];
    tsr_tokenizer *t;
    tsr_error err;
    snprintf(p, sizeof p, "%s/none.json", tmpdir);
    assert_int_equal(tsr_tokenizer_load_json(p, &t, &err), TSR_ERR_IO);
    assert_string_equal(err.file, p);

    const char *tok = "{\"model\": {" VOC "}, " BL "}";
    write_file("tokenizer.json", tok, strlen(tok));
    snprintf(p, sizeof p, "%s/tokenizer.json", tmpdir);
    const char *cfg_bad[][2] = {
        {"{\"eos_token\": \"<nope>\"}", "eos_token '<nope>'"},
        {"{\"bos_token\": 3}", "bos_token"},
        {"{\"add_bos_token\": \"yes\"}", "add_bos_token"},
        {"{\"chat_template\": 5}", "chat_template"},
        {"[", "not valid JSON"},
    };
    char cp[512];
    snprintf(cp, sizeof cp, "%s/tokenizer_config.json", tmpdir);
    for (size_t i = 0; i < sizeof cfg_bad / sizeof *cfg_bad; i++) {
        write_file("tokenizer_config.json", cfg_bad[i][0], strlen(cfg_bad[i][0]));
        assert_int_equal(tsr_tokenizer_load_json(p, &t, &err), TSR_ERR_FORMAT);
        assert_null(t);
        assert_string_equal(err.file, cp);
        if (!strstr(err.msg, cfg_bad[i][1])) fail_msg("'%s' lacks '%s'", err.msg, cfg_bad[i][1]);
    }
    const char *cfg = "{\"bos_token\": {\"content\": \"a\"}, \"eos_token\": \"b\", \"add_bos_token\": true, "
                      "\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}, "
                      "{\"name\": \"default\", \"template\": \"[INST]\"}]}";
    write_file("tokenizer_config.json", cfg, strlen(cfg));
    assert_int_equal(tsr_tokenizer_load_json(p, &t, &err), TSR_OK);
    assert_int_equal(tsr_tokenizer_bos(t), 0);
    assert_int_equal(tsr_tokenizer_eos(t), 1);
    assert_int_equal(tsr_tokenizer_adds_bos(t), 1);
    assert_string_equal(tsr_tokenizer_chat_template(t), "[INST]");
    tsr_tokenizer_free(t);

    /* llama2.c tokenizer: truncated at every byte of a valid 3-token file */
    unsigned char bin[64];
    size_t n = 0;
    int32_t maxlen = 4;
    memcpy(bin, &maxlen, 4);
    n = 4;
    const char *pieces[3] = {"<unk>", "a", " b"};
    pieces[0] = "u";
    for (int i = 0; i < 3; i++) {
        float sc = (float)-i;
        int32_t l = (int32_t)strlen(pieces[i]);
        memcpy(bin + n, &sc, 4);
        memcpy(bin + n + 4, &l, 4);
        memcpy(bin + n + 8, pieces[i], (size_t)l);
        n += 8 + (size_t)l;
    }
    snprintf(p, sizeof p, "%s/tok.bin", tmpdir);
    for (size_t cut = 0; cut < n; cut++) {
        write_file("tok.bin", (const char *)bin, cut);
        assert_int_equal(tsr_tokenizer_load_llama2c(p, 3, &t, &err), TSR_ERR_FORMAT);
        assert_int_equal(tsr_tokenizer_load_llama2c(p, 0, &t, &err), 
                         /* without a vocab_size, whole records are a shorter vocabulary */
                         (cut == 13 || cut == 22) ? TSR_OK : TSR_ERR_FORMAT);
        if (t) tsr_tokenizer_free(t);
    }
    write_file("tok.bin", (const char *)bin, n);
    assert_int_equal(tsr_tokenizer_load_llama2c(p, 3, &t, &err), TSR_OK);
    tsr_tokenizer_free(t);
    int32_t neg = -5;
    memcpy(bin + 8, &neg, 4);
    write_file("tok.bin", (const char *)bin, n);
    assert_int_equal(tsr_tokenizer_load_llama2c(p, 3, &t, &err), TSR_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "token 0"));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_json_table),
        cmocka_unit_test(test_not_json_has_position),
        cmocka_unit_test(test_huge_token),
        cmocka_unit_test(test_tiny_valid),
        cmocka_unit_test(test_post_processor_bos),
        cmocka_unit_test(test_empty_regex_match),
        cmocka_unit_test(test_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
