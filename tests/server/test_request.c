/* The request validation table: every field, in and out of range. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "core/server/request.h"
#include "core/server/response.h"

/* Allocation failure injection: the test is linked with
 * -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc (our objects' calls,
 * including the allocator request.c gives jansson). Allocation number fail_at
 * (1-based) fails; 0 fails none. */
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
static int fail_at, n_alloc;
static int should_fail(void) {
    return fail_at && ++n_alloc == fail_at;
}
void *__wrap_malloc(size_t n) {
    return should_fail() ? NULL : __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t m) {
    return should_fail() ? NULL : __real_calloc(n, m);
}
void *__wrap_realloc(void *p, size_t n) {
    return should_fail() ? NULL : __real_realloc(p, n);
}

typedef struct row {
    tsr_srv_kind kind;
    const char *fields; /* JSON members added after the required ones ("" for none) */
    int ok;             /* 1: accepted */
    const char *param;  /* the field a 400 must name ("" for none) */
} row;

#define C TSR_SRV_CHAT
#define P TSR_SRV_COMPLETION

static const row table[] = {
    /* model */
    {C, "\"model\": \"x\"", 1, ""},
    {C, "\"model\": 3", 0, "model"},
    {C, "\"model\": null", 1, ""},
    /* max_tokens / max_completion_tokens */
    {C, "\"max_tokens\": -1", 0, "max_tokens"},
    {C, "\"max_tokens\": 0", 0, "max_tokens"},
    {C, "\"max_tokens\": 1", 1, ""},
    {C, "\"max_tokens\": 1048576", 1, ""},
    {C, "\"max_tokens\": 1048577", 0, "max_tokens"},
    {C, "\"max_tokens\": 2147483648", 0, "max_tokens"},
    {C, "\"max_tokens\": 9223372036854775808", 0, "max_tokens"},
    {C, "\"max_tokens\": -9223372036854775809", 0, "max_tokens"},
    {C, "\"max_tokens\": 1.5", 0, "max_tokens"},
    {C, "\"max_tokens\": 2.0", 1, ""},
    {C, "\"max_tokens\": \"5\"", 0, "max_tokens"},
    {C, "\"max_tokens\": true", 0, "max_tokens"},
    {C, "\"max_tokens\": [5]", 0, "max_tokens"},
    {C, "\"max_completion_tokens\": 0", 0, "max_completion_tokens"},
    {C, "\"max_completion_tokens\": 2147483648", 0, "max_completion_tokens"},
    {C, "\"max_completion_tokens\": {}", 0, "max_completion_tokens"},
    /* temperature [0, 2] */
    {C, "\"temperature\": -1", 0, "temperature"},
    {C, "\"temperature\": -0.0001", 0, "temperature"},
    {C, "\"temperature\": 0", 1, ""},
    {C, "\"temperature\": 2", 1, ""},
    {C, "\"temperature\": 2.0001", 0, "temperature"},
    {C, "\"temperature\": 2147483648", 0, "temperature"},
    {C, "\"temperature\": 9223372036854775808", 0, "temperature"},
    {C, "\"temperature\": \"hot\"", 0, "temperature"},
    {C, "\"temperature\": false", 0, "temperature"},
    /* top_p [0, 1] */
    {C, "\"top_p\": -1", 0, "top_p"},
    {C, "\"top_p\": 0", 1, ""},
    {C, "\"top_p\": 1", 1, ""},
    {C, "\"top_p\": 1.01", 0, "top_p"},
    {C, "\"top_p\": 2147483648", 0, "top_p"},
    {C, "\"top_p\": []", 0, "top_p"},
    /* top_k [0, 2^20] */
    {C, "\"top_k\": -1", 0, "top_k"},
    {C, "\"top_k\": 0", 1, ""},
    {C, "\"top_k\": 1048576", 1, ""},
    {C, "\"top_k\": 1048577", 0, "top_k"},
    {C, "\"top_k\": 2147483648", 0, "top_k"},
    {C, "\"top_k\": 9223372036854775808", 0, "top_k"},
    {C, "\"top_k\": 0.5", 0, "top_k"},
    {C, "\"top_k\": \"1\"", 0, "top_k"},
    /* min_p [0, 1] */
    {C, "\"min_p\": -1", 0, "min_p"},
    {C, "\"min_p\": 0", 1, ""},
    {C, "\"min_p\": 1", 1, ""},
    {C, "\"min_p\": 1.5", 0, "min_p"},
    {C, "\"min_p\": null", 1, ""},
    /* penalties */
    {C, "\"presence_penalty\": -2", 1, ""},
    {C, "\"presence_penalty\": -2.5", 0, "presence_penalty"},
    {C, "\"presence_penalty\": 2.5", 0, "presence_penalty"},
    {C, "\"presence_penalty\": 2147483648", 0, "presence_penalty"},
    {C, "\"frequency_penalty\": 0", 1, ""},
    {C, "\"frequency_penalty\": 3", 0, "frequency_penalty"},
    {C, "\"frequency_penalty\": \"x\"", 0, "frequency_penalty"},
    {C, "\"repetition_penalty\": 0", 0, "repetition_penalty"},
    {C, "\"repetition_penalty\": -1", 0, "repetition_penalty"},
    {C, "\"repetition_penalty\": 1.1", 1, ""},
    {C, "\"repetition_penalty\": 10", 1, ""},
    {C, "\"repetition_penalty\": 11", 0, "repetition_penalty"},
    /* seed: any 64-bit integer */
    {C, "\"seed\": -1", 1, ""},
    {C, "\"seed\": 0", 1, ""},
    {C, "\"seed\": 2147483648", 1, ""},
    {C, "\"seed\": 9223372036854775807", 1, ""},
    {C, "\"seed\": 9223372036854775808", 0, "seed"},
    {C, "\"seed\": 1.5", 0, "seed"},
    {C, "\"seed\": \"42\"", 0, "seed"},
    /* n */
    {C, "\"n\": 1", 1, ""},
    {C, "\"n\": 2", 0, "n"},
    {C, "\"n\": 0", 0, "n"},
    {C, "\"n\": -1", 0, "n"},
    {C, "\"n\": 2147483648", 0, "n"},
    {C, "\"n\": 9223372036854775808", 0, "n"},
    {C, "\"n\": \"1\"", 0, "n"},
    /* stop */
    {C, "\"stop\": \"x\"", 1, ""},
    {C, "\"stop\": [\"a\", \"b\"]", 1, ""},
    {C, "\"stop\": \"\"", 0, "stop"},
    {C, "\"stop\": [\"a\", \"\"]", 0, "stop"},
    {C, "\"stop\": []", 1, ""},
    {C, "\"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\"]", 1, ""},
    {C, "\"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]", 0, "stop"},
    {C, "\"stop\": 5", 0, "stop"},
    {C, "\"stop\": [5]", 0, "stop"},
    {C, "\"stop\": \"a\\u0000b\"", 0, ""}, /* NUL inside a string: malformed */
    /* logprobs / top_logprobs (chat) */
    {C, "\"logprobs\": true", 1, ""},
    {C, "\"logprobs\": 1", 0, "logprobs"},
    {C, "\"logprobs\": true, \"top_logprobs\": 0", 1, ""},
    {C, "\"logprobs\": true, \"top_logprobs\": 20", 1, ""},
    {C, "\"logprobs\": true, \"top_logprobs\": 21", 0, "top_logprobs"},
    {C, "\"logprobs\": true, \"top_logprobs\": -1", 0, "top_logprobs"},
    {C, "\"logprobs\": true, \"top_logprobs\": 2147483648", 0, "top_logprobs"},
    {C, "\"logprobs\": true, \"top_logprobs\": \"3\"", 0, "top_logprobs"},
    {C, "\"top_logprobs\": 3", 0, "top_logprobs"},
    /* logprobs (completions): an integer */
    {P, "\"logprobs\": 0", 1, ""},
    {P, "\"logprobs\": 20", 1, ""},
    {P, "\"logprobs\": 21", 0, "logprobs"},
    {P, "\"logprobs\": -1", 0, "logprobs"},
    {P, "\"logprobs\": true", 0, "logprobs"},
    {P, "\"top_logprobs\": 2", 0, "top_logprobs"},
    /* stream / stream_options */
    {C, "\"stream\": true", 1, ""},
    {C, "\"stream\": 1", 0, "stream"},
    {C, "\"stream\": \"true\"", 0, "stream"},
    {C, "\"stream\": true, \"stream_options\": {\"include_usage\": true}", 1, ""},
    {C, "\"stream_options\": {\"include_usage\": true}", 0, "stream_options"},
    {C, "\"stream\": true, \"stream_options\": 1", 0, "stream_options"},
    {C, "\"stream\": true, \"stream_options\": {\"include_usage\": 1}", 0,
     "stream_options.include_usage"},
    /* unsupported */
    {C, "\"tools\": []", 0, "tools"},
    {C, "\"logit_bias\": {\"1\": 5}", 0, "logit_bias"},
    {C, "\"logit_bias\": {}", 1, ""},
    {C, "\"response_format\": {\"type\": \"json_object\"}", 0, "response_format"},
    {C, "\"response_format\": {\"type\": \"text\"}", 1, ""},
    {P, "\"echo\": true", 0, "echo"},
    {P, "\"best_of\": 2", 0, "best_of"},
    {P, "\"suffix\": \"x\"", 0, "suffix"},
    /* unknown fields are ignored */
    {C, "\"user\": \"me\", \"whatever\": [1, 2]", 1, ""},
    /* duplicate keys are refused as malformed JSON */
    {C, "\"top_k\": 1, \"top_k\": 2", 0, ""},
};

/* Whole bodies: messages and prompts, malformed JSON. */
typedef struct body_row {
    tsr_srv_kind kind;
    const char *body;
    int ok;
    const char *param;
} body_row;

static const body_row bodies[] = {
    {C, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", 1, ""},
    {C, "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", "
        "\"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}",
     1, ""},
    {C, "{\"messages\": [{\"role\": \"developer\", \"content\": \"s\"}]}", 1, ""},
    {C, "{\"messages\": [{\"role\": \"tool\", \"content\": \"s\"}]}", 0, "messages[0].role"},
    {C, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"wizard\", "
        "\"content\": \"s\"}]}",
     0, "messages[1].role"},
    {C, "{\"messages\": [{\"role\": 1, \"content\": \"s\"}]}", 0, "messages[0].role"},
    {C, "{\"messages\": [{\"content\": \"s\"}]}", 0, "messages[0].role"},
    {C, "{\"messages\": [{\"role\": \"user\"}]}", 0, "messages[0].content"},
    {C, "{\"messages\": [{\"role\": \"user\", \"content\": null}]}", 0, "messages[0].content"},
    {C, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 0, "messages[0].content"},
    {C, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
        "\"ab\"}, {\"type\": \"text\", \"text\": \"cd\"}]}]}",
     1, ""},
    {C, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", "
        "\"image_url\": {}}]}]}",
     0, "messages[0].content"},
    {C, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}", 0,
     "messages[0].content"},
    {C, "{\"messages\": [{\"role\": \"user\", \"content\": [\"x\"]}]}", 0, "messages[0].content"},
    {C, "{\"messages\": []}", 0, "messages"},
    {C, "{\"messages\": {}}", 0, "messages"},
    {C, "{\"messages\": [\"hi\"]}", 0, "messages[0]"},
    {C, "{}", 0, "messages"},
    {C, "{\"prompt\": \"hi\"}", 0, "messages"},
    {P, "{\"prompt\": \"hi\"}", 1, ""},
    {P, "{\"prompt\": [\"hi\"]}", 1, ""},
    {P, "{\"prompt\": [\"hi\", \"there\"]}", 0, "prompt"},
    {P, "{\"prompt\": [1, 2, 3]}", 1, ""},
    {P, "{\"prompt\": [1, -2]}", 0, "prompt"},
    {P, "{\"prompt\": [1, 2147483648]}", 0, "prompt"},
    {P, "{\"prompt\": [1, 1.5]}", 0, "prompt"},
    {P, "{\"prompt\": [[1, 2]]}", 0, "prompt"},
    {P, "{\"prompt\": []}", 0, "prompt"},
    {P, "{\"prompt\": 5}", 0, "prompt"},
    {P, "{}", 0, "prompt"},
    /* malformed: 400 without a field */
    {P, "", 0, ""},
    {P, "[]", 0, ""},
    {P, "\"prompt\"", 0, ""},
    {P, "{\"prompt\": \"hi\"", 0, ""},
    {P, "{\"prompt\": \"hi\", \"temperature\": NaN}", 0, ""},
    {P, "{\"prompt\": \"hi\", \"temperature\": Infinity}", 0, ""},
    {P, "{\"prompt\": \"hi\", \"temperature\": -Infinity}", 0, ""},
    {P, "{\"prompt\": \"hi\", \"temperature\": 1e400}", 0, ""},
    {P, "{\"prompt\": \"\xff\xfe\"}", 0, ""},
};

static void check(tsr_srv_kind kind, const char *body, int ok, const char *param) {
    tsr_srv_request r;
    tsr_srv_error e;
    memset(&e, 0, sizeof e);
    int rc = tsr_srv_request_parse(kind, body, strlen(body), &r, &e);
    if (ok && rc != 0) fail_msg("refused %s: %s (param %s)", body, e.message, e.param);
    if (!ok && rc == 0) fail_msg("accepted %s", body);
    if (!ok) {
        if (e.status != 400 || strcmp(e.param, param) != 0)
            fail_msg("%s: status %d param '%s' (want 400 '%s'): %s", body, e.status, e.param,
                     param, e.message);
        assert_string_equal(e.type, "invalid_request_error");
        assert_true(e.message[0] != '\0');
    }
    tsr_srv_request_clear(&r);
}

static void test_field_table(void **state) {
    (void)state;
    char body[1024];
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const row *t = &table[i];
        const char *req = t->kind == C ? "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]"
                                       : "\"prompt\": \"hi\"";
        snprintf(body, sizeof body, "{%s%s%s}", req, t->fields[0] ? ", " : "", t->fields);
        check(t->kind, body, t->ok, t->param);
    }
}

static void test_body_table(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
        check(bodies[i].kind, bodies[i].body, bodies[i].ok, bodies[i].param);
}

static tsr_srv_request parse_ok(tsr_srv_kind kind, const char *body) {
    tsr_srv_request r;
    tsr_srv_error e;
    int rc = tsr_srv_request_parse(kind, body, strlen(body), &r, &e);
    if (rc) fail_msg("refused %s: %s", body, e.message);
    return r;
}

static void test_values(void **state) {
    (void)state;
    tsr_srv_request r = parse_ok(
        C, "{\"model\": \"m\", \"messages\": [{\"role\": \"developer\", \"content\": \"sys\"}, "
           "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"ab\"}, "
           "{\"type\": \"text\", \"text\": \"c\\u00e9\"}]}], \"max_tokens\": 7, "
           "\"max_completion_tokens\": 9, \"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 40, "
           "\"min_p\": 0.05, \"presence_penalty\": 0.5, \"frequency_penalty\": -0.5, "
           "\"repetition_penalty\": 1.2, \"seed\": -1, \"stop\": [\"x\", \"yz\"], "
           "\"logprobs\": true, \"top_logprobs\": 3, \"stream\": true, "
           "\"stream_options\": {\"include_usage\": true}}");
    assert_int_equal(r.kind, TSR_SRV_CHAT);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.n_msgs, 2);
    assert_string_equal(r.msgs[0].role, "system");
    assert_string_equal(r.msgs[1].role, "user");
    assert_string_equal(r.msgs[1].content, "abc\xc3\xa9");
    assert_int_equal(r.max_tokens, 9); /* max_completion_tokens wins */
    assert_float_equal(r.sampling.temperature, 0.5, 1e-6);
    assert_float_equal(r.sampling.top_p, 0.9, 1e-6);
    assert_int_equal(r.sampling.top_k, 40);
    assert_float_equal(r.sampling.min_p, 0.05, 1e-6);
    assert_float_equal(r.sampling.presence_penalty, 0.5, 1e-6);
    assert_float_equal(r.sampling.frequency_penalty, -0.5, 1e-6);
    assert_float_equal(r.sampling.repetition_penalty, 1.2, 1e-6);
    assert_true(r.sampling.has_seed);
    assert_true(r.sampling.seed == UINT64_MAX);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "yz");
    assert_int_equal(r.logprobs, 1);
    assert_int_equal(r.top_logprobs, 3);
    assert_int_equal(r.stream, 1);
    assert_int_equal(r.include_usage, 1);
    tsr_srv_request_clear(&r);

    /* Defaults. */
    r = parse_ok(P, "{\"prompt\": [5, 0, 2147483647]}");
    assert_int_equal(r.kind, TSR_SRV_COMPLETION);
    assert_null(r.model);
    assert_null(r.prompt);
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 2147483647);
    assert_int_equal(r.max_tokens, -1);
    assert_float_equal(r.sampling.temperature, 1.0, 0);
    assert_float_equal(r.sampling.top_p, 1.0, 0);
    assert_int_equal(r.sampling.top_k, 0);
    assert_float_equal(r.sampling.repetition_penalty, 1.0, 0);
    assert_false(r.sampling.has_seed);
    assert_int_equal(r.n_stop, 0);
    assert_int_equal(r.logprobs, 0);
    assert_int_equal(r.stream, 0);
    tsr_srv_request_clear(&r);

    r = parse_ok(P, "{\"prompt\": \"once\", \"logprobs\": 2, \"seed\": 9223372036854775807, "
                    "\"stop\": \"\\n\"}");
    assert_string_equal(r.prompt, "once");
    assert_int_equal(r.logprobs, 1);
    assert_int_equal(r.top_logprobs, 2);
    assert_true(r.sampling.seed == 9223372036854775807ULL);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "\n");
    tsr_srv_request_clear(&r);
}

/* The error names the numbers it compared. */
static void test_messages_name_numbers(void **state) {
    (void)state;
    tsr_srv_request r;
    tsr_srv_error e;
    const char *b = "{\"prompt\": \"x\", \"top_logprobs\": 1}";
    assert_int_equal(tsr_srv_request_parse(P, b, strlen(b), &r, &e), -1);
    b = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, "
        "\"top_logprobs\": 21}";
    assert_int_equal(tsr_srv_request_parse(C, b, strlen(b), &r, &e), -1);
    assert_non_null(strstr(e.message, "21"));
    assert_non_null(strstr(e.message, "20"));
    b = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 2}";
    assert_int_equal(tsr_srv_request_parse(C, b, strlen(b), &r, &e), -1);
    assert_non_null(strstr(e.message, "n = 1"));
    b = "{\"prompt\": \"hi\", \n \"temperature\": NaN}";
    assert_int_equal(tsr_srv_request_parse(P, b, strlen(b), &r, &e), -1);
    assert_non_null(strstr(e.message, "line 2"));
    /* A body that is not NUL-terminated is read only up to its length. */
    char raw[] = {'{', '"', 'p', 'r', 'o', 'm', 'p', 't', '"', ':', '"', 'a', '"', '}', 'X'};
    assert_int_equal(tsr_srv_request_parse(P, raw, sizeof raw - 1, &r, &e), 0);
    assert_string_equal(r.prompt, "a");
    tsr_srv_request_clear(&r);
}

/* Fail the Nth allocation for every N: each parse fails cleanly with 503
 * (ASan builds check that nothing leaks), until N is past the last one. */
static void test_allocation_failures(void **state) {
    (void)state;
    const char *bodies_[] = {
        "{\"model\": \"m\", \"messages\": [{\"role\": \"system\", \"content\": \"s\"}, "
        "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"ab\"}, "
        "{\"type\": \"text\", \"text\": \"cd\"}]}], \"stop\": [\"x\", \"y\"], \"seed\": 3, "
        "\"logprobs\": true, \"top_logprobs\": 2, \"stream\": true}",
        "{\"prompt\": [1, 2, 3], \"max_tokens\": 9223372036854775808}",
        "{\"prompt\": \"once\", \"stop\": \"a\"}",
    };
    const tsr_srv_kind kinds[] = {TSR_SRV_CHAT, TSR_SRV_COMPLETION, TSR_SRV_COMPLETION};
    for (size_t b = 0; b < sizeof bodies_ / sizeof bodies_[0]; b++) {
        /* The reference outcome, with no failure. */
        tsr_srv_request r;
        tsr_srv_error e0, e;
        fail_at = 0;
        int want = tsr_srv_request_parse(kinds[b], bodies_[b], strlen(bodies_[b]), &r, &e0);
        tsr_srv_request_clear(&r);
        int n;
        for (n = 1; n < 10000; n++) {
            fail_at = n;
            n_alloc = 0;
            memset(&e, 0, sizeof e);
            int rc = tsr_srv_request_parse(kinds[b], bodies_[b], strlen(bodies_[b]), &r, &e);
            int injected = n_alloc >= n;
            fail_at = 0;
            if (!injected) { /* past the last allocation: the normal outcome */
                assert_int_equal(rc, want);
                tsr_srv_request_clear(&r);
                break;
            }
            if (rc == 0) fail_msg("body %zu: allocation %d failed but the parse succeeded", b, n);
            /* Either out of memory, or (for the refused body) the same 400. */
            if (!(e.status == 503 || (want != 0 && e.status == 400 && !strcmp(e.param, e0.param))))
                fail_msg("body %zu, failing allocation %d: status %d '%s'", b, n, e.status,
                         e.message);
            /* The error object itself under memory pressure: NULL or valid. */
            fail_at = 1;
            n_alloc = 0;
            char *js = tsr_srv_error_json(&e);
            fail_at = 0;
            free(js);
        }
        assert_true(n > 1); /* some allocation was failed */
        printf("body %zu: %d allocation failure points, all clean\n", b, n - 1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_field_table),
        cmocka_unit_test(test_body_table),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_messages_name_numbers),
        cmocka_unit_test(test_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
