/*
 * test_chat.c - chat formats: detection from templates, and rendering of a
 * system + user + assistant + user conversation compared with strings written
 * out by hand from each format's published template.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "core/tokenizer/tokenizer.h"
#include "tok_test_util.h"

static const tsr_chat_msg k_conv[] = {
    {"system", "You are a helpful assistant."},
    {"user", "Hi!"},
    {"assistant", "Hello! How can I help?"},
    {"user", "Tell me a joke."},
};

static void test_render_chatml(void **state) {
    tsr_error err;
    char *s = tsr_chat_render(TSR_CHAT_CHATML, k_conv, 4, 1, NULL, &err);
    assert_non_null(s);
    assert_string_equal(s,
                        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                        "<|im_start|>user\nHi!<|im_end|>\n"
                        "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
                        "<|im_start|>user\nTell me a joke.<|im_end|>\n"
                        "<|im_start|>assistant\n");
    free(s);
    /* no default system prompt; no generation prompt when not asked */
    s = tsr_chat_render(TSR_CHAT_CHATML, k_conv + 1, 1, 0, NULL, &err);
    assert_string_equal(s, "<|im_start|>user\nHi!<|im_end|>\n");
    free(s);
}

static void test_render_llama3(void **state) {
    tsr_error err;
    char *s = tsr_chat_render(TSR_CHAT_LLAMA3, k_conv, 4, 1, "<|begin_of_text|>", &err);
    assert_non_null(s);
    assert_string_equal(s,
                        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                        "You are a helpful assistant.<|eot_id|>"
                        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I help?<|eot_id|>"
                        "<|start_header_id|>user<|end_header_id|>\n\nTell me a joke.<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(s);
    /* content | trim */
    tsr_chat_msg m = {"user", "  \n spaced \t\n"};
    s = tsr_chat_render(TSR_CHAT_LLAMA3, &m, 1, 0, NULL, &err);
    assert_string_equal(s, "<|start_header_id|>user<|end_header_id|>\n\nspaced<|eot_id|>");
    free(s);
}

static void test_render_llama2(void **state) {
    tsr_error err;
    char *s = tsr_chat_render(TSR_CHAT_LLAMA2, k_conv, 4, 1, "<s>", &err);
    assert_non_null(s);
    assert_string_equal(s,
                        "<s>[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\nHi! [/INST]"
                        " Hello! How can I help? </s>"
                        "<s>[INST] Tell me a joke. [/INST]");
    free(s);
    s = tsr_chat_render(TSR_CHAT_LLAMA2, k_conv + 1, 1, 1, "<s>", &err);
    assert_string_equal(s, "<s>[INST] Hi! [/INST]");
    free(s);
    /* roles must alternate */
    tsr_chat_msg bad[] = {{"user", "a"}, {"user", "b"}};
    assert_null(tsr_chat_render(TSR_CHAT_LLAMA2, bad, 2, 1, "<s>", &err));
    assert_int_equal(err.code, TSR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "alternat") ? err.msg : strstr(err.msg, "user/assistant"));
    tsr_chat_msg nul[] = {{"user", NULL}};
    assert_null(tsr_chat_render(TSR_CHAT_CHATML, nul, 1, 1, NULL, &err));
    assert_int_equal(err.code, TSR_ERR_INVALID);
    assert_null(tsr_chat_render(TSR_CHAT_NONE, k_conv, 4, 1, NULL, &err));
}

static void test_detect(void **state) {
    tsr_chat_format f;
    tsr_error err;
    assert_int_equal(tsr_chat_format_detect_text(NULL, &f, &err), TSR_OK);
    assert_int_equal(f, TSR_CHAT_NONE);
    assert_int_equal(tsr_chat_format_detect_text(
                         "{% for m in messages %}{{'<|im_start|>' + m.role + '\\n'}}{% endfor %}", &f, &err),
                     TSR_OK);
    assert_int_equal(f, TSR_CHAT_CHATML);
    assert_int_equal(tsr_chat_format_detect_text("{{ bos_token }}{% for m in messages %}<|start_header_id|>"
                                                 "{{ m['role'] }}<|end_header_id|>{% endfor %}",
                                                 &f, &err),
                     TSR_OK);
    assert_int_equal(f, TSR_CHAT_LLAMA3);
    assert_int_equal(tsr_chat_format_detect_text("{{ bos_token + '[INST] ' + content + ' [/INST]' }}", &f, &err),
                     TSR_OK);
    assert_int_equal(f, TSR_CHAT_LLAMA2);
    assert_int_equal(tsr_chat_format_detect_text("{{ messages[0]['content'] }}<|user|>", &f, &err),
                     TSR_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "--chat-format chatml|llama3|llama2"));
    assert_int_equal(tsr_chat_format_from_name("chatml"), TSR_CHAT_CHATML);
    assert_int_equal(tsr_chat_format_from_name("llama3"), TSR_CHAT_LLAMA3);
    assert_int_equal(tsr_chat_format_from_name("llama2"), TSR_CHAT_LLAMA2);
    assert_int_equal(tsr_chat_format_from_name("vicuna"), -1);
}

static void test_detect_qwen3_config(void **state) {
    char p[4096];
    if (!tt_shared("data/tokenizers/qwen3/tokenizer.json", p, sizeof p)) skip();
    tsr_tokenizer *t;
    tsr_error err;
    assert_int_equal(tsr_tokenizer_load_json(p, &t, &err), TSR_OK);
    assert_non_null(tsr_tokenizer_chat_template(t));
    tsr_chat_format f = TSR_CHAT_NONE;
    assert_int_equal(tsr_chat_format_detect(t, &f, &err), TSR_OK);
    assert_int_equal(f, TSR_CHAT_CHATML);
    /* the rendered prompt tokenizes with its control tokens */
    char *s = tsr_chat_render(f, k_conv, 4, 1, NULL, &err);
    int32_t *ids;
    int n;
    assert_int_equal(tsr_tokenizer_encode(t, s, strlen(s), 0, 1, &ids, &n, &err), TSR_OK);
    int starts = 0;
    for (int i = 0; i < n; i++) starts += ids[i] == tsr_tokenizer_token_id(t, "<|im_start|>");
    assert_int_equal(starts, 5);
    free(ids);
    free(s);
    tsr_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_chatml),
        cmocka_unit_test(test_render_llama3),
        cmocka_unit_test(test_render_llama2),
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_detect_qwen3_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
