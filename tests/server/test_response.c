/* SSE chunk and response formatting, error objects, metrics rendering. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/server/metrics.h"
#include "core/server/response.h"

static json_t *parse(const char *s) {
    assert_non_null(s);
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    if (!j) fail_msg("not JSON (%s): %s", je.text, s);
    return j;
}

static void test_error_object(void **state) {
    (void)state;
    tsr_srv_error e;
    tsr_srv_error_set(&e, 400, "top_logprobs", "'top_logprobs' is %d", 21);
    char *s = tsr_srv_error_json(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"'top_logprobs' is 21\",\"type\":"
                           "\"invalid_request_error\",\"param\":\"top_logprobs\",\"code\":null}}");
    free(s);
    tsr_srv_error_set(&e, 429, "", "full");
    s = tsr_srv_error_json(&e);
    json_t *j = parse(s);
    assert_true(json_is_null(json_object_get(json_object_get(j, "error"), "param")));
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "type")),
                        "rate_limit_error");
    json_decref(j);
    free(s);
    tsr_srv_error_set(&e, 500, NULL, "x");
    assert_string_equal(e.type, "server_error");
}

static void test_utf8_repair(void **state) {
    (void)state;
    const char *cases[][2] = {
        {"abc", "abc"},
        {"\xc3\xa9", "\xc3\xa9"},
        {"a\xff" "b", "a\xef\xbf\xbd" "b"},
        {"\xe2\x82", "\xef\xbf\xbd\xef\xbf\xbd"},          /* truncated 3-byte sequence */
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},          /* overlong */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* surrogate */
        {"\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = tsr_srv_json_text(cases[i][0], strlen(cases[i][0]));
        assert_non_null(j);
        assert_string_equal(json_string_value(j), cases[i][1]);
        json_decref(j);
    }
}

static void test_chat_chunks(void **state) {
    (void)state;
    tsr_srv_resp_info ri = {TSR_SRV_CHAT, "chatcmpl-1", "stories", 1700000000};
    char *s = tsr_srv_chunk_json(&ri, 1, "Once", 4, NULL, 0, NULL);
    json_t *j = parse(s);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion.chunk");
    assert_string_equal(json_string_value(json_object_get(j, "id")), "chatcmpl-1");
    assert_int_equal(json_integer_value(json_object_get(j, "created")), 1700000000);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    json_t *d = json_object_get(c, "delta");
    assert_string_equal(json_string_value(json_object_get(d, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(d, "content")), "Once");
    assert_true(json_is_null(json_object_get(c, "finish_reason")));
    json_decref(j);

    tsr_srv_buf b = {0};
    assert_int_equal(tsr_srv_sse_append(&b, s), 0);
    assert_int_equal(b.len, strlen(s) + 8);
    assert_memory_equal(b.data, "data: {", 7);
    assert_string_equal(b.data + b.len - 2, "\n\n");
    tsr_srv_buf_free(&b);
    free(s);

    /* Later chunk: no role; final chunk: empty delta, finish_reason. */
    s = tsr_srv_chunk_json(&ri, 0, " upon", 5, NULL, 4, NULL);
    j = parse(s);
    d = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    assert_null(json_object_get(d, "role"));
    assert_string_equal(json_string_value(json_object_get(d, "content")), " upon");
    json_decref(j);
    free(s);
    s = tsr_srv_chunk_json(&ri, 0, "", 0, NULL, 9, "length");
    j = parse(s);
    c = json_array_get(json_object_get(j, "choices"), 0);
    assert_int_equal(json_object_size(json_object_get(c, "delta")), 0);
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "length");
    json_decref(j);
    free(s);

    s = tsr_srv_usage_chunk_json(&ri, 7, 5);
    j = parse(s);
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 0);
    json_t *u = json_object_get(j, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), 7);
    assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 5);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), 12);
    json_decref(j);
    free(s);
}

static json_t *two_entries(void) {
    const char *top[2] = {" a", "b\xff"};
    size_t tl[2] = {2, 2};
    float tlp[2] = {-0.5f, -1.5f};
    json_t *a = json_array();
    json_array_append_new(a, tsr_srv_logprob_entry(" a", 2, -0.5f, 2, top, tl, tlp));
    json_array_append_new(a, tsr_srv_logprob_entry("xyz", 3, -2.0f, 0, NULL, NULL, NULL));
    return a;
}

static void test_logprobs_layouts(void **state) {
    (void)state;
    json_t *lp = two_entries();
    json_t *e0 = json_array_get(lp, 0);
    assert_string_equal(json_string_value(json_object_get(e0, "token")), " a");
    assert_float_equal(json_real_value(json_object_get(e0, "logprob")), -0.5, 1e-9);
    json_t *bytes = json_object_get(e0, "bytes");
    assert_int_equal(json_array_size(bytes), 2);
    assert_int_equal(json_integer_value(json_array_get(bytes, 0)), 32);
    json_t *t1 = json_array_get(json_object_get(e0, "top_logprobs"), 1);
    assert_string_equal(json_string_value(json_object_get(t1, "token")), "b\xef\xbf\xbd");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(t1, "bytes"), 1)), 255);

    tsr_srv_resp_info ri = {TSR_SRV_COMPLETION, "cmpl-1", "m", 1};
    char *s = tsr_srv_chunk_json(&ri, 0, " axyz", 5, lp, 10, NULL);
    json_t *j = parse(s);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
    assert_string_equal(json_string_value(json_object_get(c, "text")), " axyz");
    json_t *l = json_object_get(c, "logprobs");
    assert_string_equal(json_string_value(json_array_get(json_object_get(l, "tokens"), 1)), "xyz");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(l, "text_offset"), 0)), 10);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(l, "text_offset"), 1)), 12);
    json_t *top0 = json_array_get(json_object_get(l, "top_logprobs"), 0);
    assert_int_equal(json_object_size(top0), 2);
    assert_float_equal(json_real_value(json_object_get(top0, " a")), -0.5, 1e-9);
    json_decref(j);
    free(s);

    /* Whole responses. */
    s = tsr_srv_response_json(&ri, "hi", 2, NULL, "stop", 3, 1);
    j = parse(s);
    c = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c, "text")), "hi");
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "stop");
    assert_true(json_is_null(json_object_get(c, "logprobs")));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"),
                                                        "total_tokens")),
                     4);
    json_decref(j);
    free(s);
    ri.kind = TSR_SRV_CHAT;
    s = tsr_srv_response_json(&ri, "hi", 2, lp, "length", 3, 2);
    j = parse(s);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
    c = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(c, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "hi");
    assert_int_equal(json_array_size(json_object_get(json_object_get(c, "logprobs"), "content")),
                     2);
    json_decref(j);
    free(s);
    json_decref(lp);
}

/* Value of a metric line "name value" (exact name incl. labels). */
static double metric(const char *text, const char *name) {
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (!strncmp(p, name, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
    }
    fail_msg("metric %s missing", name);
    return -1;
}

static void test_metrics_render(void **state) {
    (void)state;
    tsr_srv_metrics m;
    tsr_srv_metrics_init(&m);
    tsr_srv_metrics_request(&m, 200);
    tsr_srv_metrics_request(&m, 200);
    tsr_srv_metrics_request(&m, 400);
    tsr_srv_metrics_finish(&m, TSR_SRV_FIN_STOP, 10, 5, 8, 6, 3);
    tsr_srv_metrics_finish(&m, TSR_SRV_FIN_CANCELLED, 4, 1, 0, 0, 0);
    tsr_srv_metrics_ttft(&m, 0.003);   /* bucket 0.005 */
    tsr_srv_metrics_ttft(&m, 0.005);   /* le is inclusive: bucket 0.005 */
    tsr_srv_metrics_ttft(&m, 100);     /* +Inf only */
    tsr_srv_metrics_itl(&m, 0.02);
    tsr_srv_metrics_load(&m, 3, 2);
    tsr_srv_metrics_kv(&m, 256, 1024);
    tsr_srv_metrics_experts(&m, 0, 0, 0);
    char *t = tsr_srv_metrics_render(&m);
    assert_non_null(t);
    assert_float_equal(metric(t, "tessera_requests_total{status=\"200\"}"), 2, 0);
    assert_float_equal(metric(t, "tessera_requests_total{status=\"400\"}"), 1, 0);
    assert_float_equal(metric(t, "tessera_requests_finished_total{reason=\"stop\"}"), 1, 0);
    assert_float_equal(metric(t, "tessera_requests_finished_total{reason=\"cancelled\"}"), 1, 0);
    assert_float_equal(metric(t, "tessera_requests_finished_total{reason=\"length\"}"), 0, 0);
    assert_float_equal(metric(t, "tessera_prompt_tokens_total"), 14, 0);
    assert_float_equal(metric(t, "tessera_generated_tokens_total"), 6, 0);
    assert_float_equal(metric(t, "tessera_time_to_first_token_seconds_bucket{le=\"0.0025\"}"), 0, 0);
    assert_float_equal(metric(t, "tessera_time_to_first_token_seconds_bucket{le=\"0.005\"}"), 2, 0);
    assert_float_equal(metric(t, "tessera_time_to_first_token_seconds_bucket{le=\"30\"}"), 2, 0);
    assert_float_equal(metric(t, "tessera_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), 3, 0);
    assert_float_equal(metric(t, "tessera_time_to_first_token_seconds_count"), 3, 0);
    assert_float_equal(metric(t, "tessera_time_to_first_token_seconds_sum"), 100.008, 1e-9);
    assert_float_equal(metric(t, "tessera_inter_token_latency_seconds_bucket{le=\"0.01\"}"), 0, 0);
    assert_float_equal(metric(t, "tessera_inter_token_latency_seconds_bucket{le=\"0.025\"}"), 1, 0);
    assert_float_equal(metric(t, "tessera_queue_depth"), 3, 0);
    assert_float_equal(metric(t, "tessera_requests_running"), 2, 0);
    assert_float_equal(metric(t, "tessera_kv_cache_used_bytes"), 256, 0);
    assert_float_equal(metric(t, "tessera_kv_cache_usage_ratio"), 0.25, 1e-9);
    assert_float_equal(metric(t, "tessera_draft_acceptance_length"), 2, 1e-9);
    assert_float_equal(metric(t, "tessera_expert_cache_hit_rate"), 0, 0);
    assert_non_null(strstr(t, "# HELP tessera_expert_cache_hit_rate Expert-cache hits over "
                              "lookups; 0: this engine has no expert cache"));
    assert_non_null(strstr(t, "# TYPE tessera_time_to_first_token_seconds histogram\n"));
    /* Every line is a comment or "name value". */
    for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        char *sp = strrchr(line, ' ');
        assert_non_null(sp);
        char *end;
        strtod(sp + 1, &end);
        assert_true(*end == '\0');
    }
    free(t);
    tsr_srv_metrics_experts(&m, 1, 3, 1);
    t = tsr_srv_metrics_render(&m);
    assert_float_equal(metric(t, "tessera_expert_cache_hit_rate"), 0.75, 1e-9);
    free(t);
    tsr_srv_metrics_destroy(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_object),    cmocka_unit_test(test_utf8_repair),
        cmocka_unit_test(test_chat_chunks),     cmocka_unit_test(test_logprobs_layouts),
        cmocka_unit_test(test_metrics_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
