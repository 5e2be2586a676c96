/*
 * The HTTP server and scheduler end to end over loopback, in front of a
 * fake engine (no model needed): token k of a generation is the letter
 * 'a' + k % 26, one step per token, a few milliseconds each. It checks the
 * endpoints, errors over HTTP, the context check at n_ctx-1/n_ctx/n_ctx+1,
 * streaming framing, 429 with Retry-After, client aborts (every request
 * accounted for, KV back to idle) and shutdown with open streams.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/server/server.h"

/* ---- the fake engine ---------------------------------------------------- */

#define FAKE_CTX 64
#define FAKE_KV_PER_GEN 1000

typedef struct fake_gen {
    int max, produced, fail_at, fail_code;
    tsr_token_info info;
    char text[2];
} fake_gen;

static atomic_int fake_live;      /* generations alive (KV held) */
static atomic_int fake_step_us = 2000;
/* While set, generations make no progress past their first token: a test
 * holds the engine still until every request has its answer (no timing). */
static atomic_int fake_hold = 0;
static atomic_int fake_engine_threads; /* distinct callers seen: must stay 1 */
static pthread_t fake_engine_thread;
static atomic_int fake_thread_known;

static void note_thread(void) {
    if (!atomic_exchange(&fake_thread_known, 1)) fake_engine_thread = pthread_self();
    else if (!pthread_equal(fake_engine_thread, pthread_self()))
        atomic_fetch_add(&fake_engine_threads, 1);
}

static int fake_prompt(void *ctx, const tsr_srv_request *rq, int32_t **ids, int *n,
                       tsr_srv_error *e) {
    note_thread();
    tsr_srv_buf b = {0};
    if (rq->kind == TSR_SRV_CHAT) {
        for (int i = 0; i < rq->n_msgs; i++) {
            tsr_srv_buf_append(&b, rq->msgs[i].role, strlen(rq->msgs[i].role));
            tsr_srv_buf_append(&b, ":", 1);
            tsr_srv_buf_append(&b, rq->msgs[i].content, strlen(rq->msgs[i].content));
            tsr_srv_buf_append(&b, "\n", 1);
        }
    } else if (rq->prompt_ids) {
        for (int i = 0; i < rq->n_prompt_ids; i++)
            if (rq->prompt_ids[i] >= 256)
                return tsr_srv_error_set(e, 400, "prompt", "token id %d is beyond the vocabulary",
                                         rq->prompt_ids[i]);
        *ids = malloc(sizeof(int32_t) * (size_t)rq->n_prompt_ids);
        memcpy(*ids, rq->prompt_ids, sizeof(int32_t) * (size_t)rq->n_prompt_ids);
        *n = rq->n_prompt_ids;
        return 0;
    } else {
        tsr_srv_buf_append(&b, rq->prompt, strlen(rq->prompt));
    }
    *ids = malloc(sizeof(int32_t) * (b.len + 1));
    for (size_t i = 0; i < b.len; i++) (*ids)[i] = (unsigned char)b.data[i];
    *n = (int)b.len;
    int fail = b.len >= 4 && !memcmp(b.data, "FAIL", 4);
    int device = b.len >= 6 && !memcmp(b.data, "DEVICE", 6);
    tsr_srv_buf_free(&b);
    if (fail) (*ids)[0] = -1; /* start() sees the markers */
    if (device) (*ids)[0] = -2;
    return 0;
}

static atomic_int fake_kv_slots; /* 0: no KV budget; >0: generations it holds; -1: none fits */
static atomic_int fake_peak_live;
static atomic_int fake_hold_start;   /* start() (the prompt's processing) waits while set */
static atomic_int fake_in_start;     /* a start() is waiting on fake_hold_start */

static int fake_start(void *ctx, const int32_t *ids, int n, const tsr_gen_params *p, void **gen,
                      tsr_error *err) {
    note_thread();
    if (atomic_load(&fake_hold_start)) {
        atomic_store(&fake_in_start, 1);
        while (atomic_load(&fake_hold_start)) usleep(1000);
        atomic_store(&fake_in_start, 0);
    }
    if (n + p->max_tokens > FAKE_CTX) return tsr_error_set(err, TSR_ERR_RANGE, "too long");
    int slots = atomic_load(&fake_kv_slots);
    if (slots < 0 || (slots > 0 && atomic_load(&fake_live) >= slots))
        return tsr_error_set(err, TSR_ERR_RANGE, "KV budget exhausted");
    fake_gen *g = calloc(1, sizeof *g);
    g->max = p->max_tokens;
    g->fail_at = ids[0] == -1 ? 3 : ids[0] == -2 ? 2 : -1;
    g->fail_code = ids[0] == -2 ? TSR_ERR_DEVICE : TSR_ERR_PLUGIN;
    *gen = g;
    int live = atomic_fetch_add(&fake_live, 1) + 1;
    if (live > atomic_load(&fake_peak_live)) atomic_store(&fake_peak_live, live);
    return TSR_OK;
}

static int fake_step(void *ctx, void *gen, tsr_gen_event *ev, tsr_error *err) {
    note_thread();
    fake_gen *g = gen;
    usleep((useconds_t)atomic_load(&fake_step_us));
    while (atomic_load(&fake_hold) && g->produced >= 1) usleep(1000);
    if (g->produced == g->fail_at) return tsr_error_set(err, g->fail_code, "injected failure");
    int k = g->produced++;
    g->text[0] = (char)('a' + k % 26);
    g->info.id = g->text[0];
    g->info.logprob = -0.25f;
    g->info.n_top = 2;
    g->info.top_ids[0] = g->text[0];
    g->info.top_logprobs[0] = -0.25f;
    g->info.top_ids[1] = 'Z';
    g->info.top_logprobs[1] = -3.0f;
    ev->tokens = &g->info;
    ev->n_tokens = 1;
    ev->text = g->text;
    ev->text_len = 1;
    ev->finish = g->produced >= g->max ? TSR_FINISH_LENGTH : TSR_FINISH_NONE;
    return TSR_OK;
}

static void fake_free(void *ctx, void *gen) {
    note_thread();
    free(gen);
    atomic_fetch_sub(&fake_live, 1);
}

static size_t fake_token_text(void *ctx, int32_t id, char *buf, size_t size) {
    if (size) buf[0] = (char)id;
    return 1;
}

static void fake_kv(void *ctx, uint64_t *used, uint64_t *cap) {
    note_thread();
    *used = (uint64_t)atomic_load(&fake_live) * FAKE_KV_PER_GEN;
    *cap = (uint64_t)FAKE_CTX * FAKE_KV_PER_GEN;
}

static const tsr_srv_backend fake_backend = {
    .ctx = NULL,
    .model_id = "fake",
    .n_ctx = FAKE_CTX,
    .prompt = fake_prompt,
    .start = fake_start,
    .step = fake_step,
    .free_gen = fake_free,
    .token_text = fake_token_text,
    .kv_usage = fake_kv,
};

/* ---- HTTP client helpers ------------------------------------------------- */

typedef struct resp {
    long status;
    tsr_srv_buf body;
    char retry_after[32];
    size_t abort_after; /* abort the transfer after this many body bytes (0: never) */
} resp;

static size_t on_body(char *p, size_t sz, size_t n, void *ud) {
    resp *r = ud;
    tsr_srv_buf_append(&r->body, p, sz * n);
    if (r->abort_after && r->body.len >= r->abort_after) return 0;
    return sz * n;
}

static size_t on_header(char *p, size_t sz, size_t n, void *ud) {
    resp *r = ud;
    if (sz * n > 13 && !strncasecmp(p, "Retry-After: ", 13)) {
        size_t len = sz * n - 13;
        if (len >= sizeof r->retry_after) len = sizeof r->retry_after - 1;
        memcpy(r->retry_after, p + 13, len);
        r->retry_after[strcspn(r->retry_after, "\r\n")] = '\0';
    }
    return sz * n;
}

static int port;

static CURL *make(const char *path, const char *body, resp *r) {
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 20L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    return c;
}

static resp http(const char *path, const char *body) {
    resp r;
    memset(&r, 0, sizeof r);
    CURL *c = make(path, body, &r);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    tsr_srv_buf_append(&r.body, "", 0);
    return r;
}

static json_t *json_of(resp *r) {
    json_error_t je;
    json_t *j = json_loads(r->body.data ? r->body.data : "", 0, &je);
    if (!j) fail_msg("not JSON: %s", r->body.data);
    return j;
}

static double metric(const char *name) {
    resp r = http("/metrics", NULL);
    double v = -1;
    size_t n = strlen(name);
    for (const char *p = r.body.data; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ') v = strtod(p + n + 1, NULL);
    tsr_srv_buf_free(&r.body);
    return v < 0 ? 0 : v;
}

/* Parse an SSE body: concatenated content, the finish reason, chunk count. */
typedef struct sse {
    char text[1024];
    char finish[16];
    int chunks, done, usage_total, role_first, error;
} sse;

static sse parse_sse(const char *body, int chat) {
    sse s;
    memset(&s, 0, sizeof s);
    const char *p = body;
    while (p && *p) {
        if (strncmp(p, "data: ", 6) != 0) fail_msg("not an SSE data line: %.40s", p);
        const char *end = strstr(p, "\n\n");
        assert_non_null(end);
        char *line = strndup(p + 6, (size_t)(end - p - 6));
        if (!strcmp(line, "[DONE]")) {
            s.done = 1;
            assert_string_equal(end + 2, ""); /* nothing after [DONE] */
        } else {
            json_t *j = json_loads(line, 0, NULL);
            if (!j) fail_msg("chunk is not JSON: %s", line);
            if (json_object_get(j, "error")) s.error = 1;
            json_t *u = json_object_get(j, "usage");
            if (u) s.usage_total = (int)json_integer_value(json_object_get(u, "total_tokens"));
            json_t *c = json_array_get(json_object_get(j, "choices"), 0);
            if (c) {
                json_t *t = chat ? json_object_get(json_object_get(c, "delta"), "content")
                                 : json_object_get(c, "text");
                if (s.chunks == 0 && chat)
                    s.role_first = json_object_get(json_object_get(c, "delta"), "role") != NULL;
                if (json_is_string(t)) strncat(s.text, json_string_value(t), 1000 - strlen(s.text));
                json_t *f = json_object_get(c, "finish_reason");
                if (json_is_string(f)) snprintf(s.finish, sizeof s.finish, "%s", json_string_value(f));
                s.chunks++;
            }
            json_decref(j);
        }
        free(line);
        p = end + 2;
    }
    return s;
}

/* ---- fixture --------------------------------------------------------------- */

static tsr_server *srv;

static int start_server(int parallel, int queue) {
    tsr_server_opts o = {.host = "127.0.0.1", .port = 0, .parallel = parallel, .queue = queue,
                         .max_body = 4096, .max_header = 8192, .retry_after_s = 2};
    tsr_error err;
    atomic_store(&fake_thread_known, 0); /* a new server, a new engine thread */
    if (tsr_server_start(&o, &srv, &err)) return -1;
    port = tsr_server_port(srv);
    return 0;
}

static void stop_server(void) {
    tsr_server_shutdown(srv, 5);
    tsr_server_free(srv);
    srv = NULL;
}

#define CHAT "/v1/chat/completions"
#define CMPL "/v1/completions"

static void test_health_and_basic(void **state) {
    (void)state;
    assert_int_equal(start_server(2, 8), 0);
    assert_true(port > 0);
    resp r = http("/health", NULL);
    assert_int_equal(r.status, 503); /* loading */
    assert_non_null(strstr(r.body.data, "loading"));
    tsr_srv_buf_free(&r.body);
    r = http(CMPL, "{\"prompt\": \"hi\"}");
    assert_int_equal(r.status, 503);
    tsr_srv_buf_free(&r.body);

    tsr_error err;
    assert_int_equal(tsr_server_set_backend(srv, &fake_backend, &err), 0);
    r = http("/health", NULL);
    assert_int_equal(r.status, 200);
    tsr_srv_buf_free(&r.body);

    r = http("/v1/models", NULL);
    assert_int_equal(r.status, 200);
    json_t *j = json_of(&r);
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")), "fake");
    json_decref(j);
    tsr_srv_buf_free(&r.body);

    /* Non-streamed completion: exact text, usage, finish. */
    r = http(CMPL, "{\"prompt\": \"hello\", \"max_tokens\": 5}");
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c, "text")), "abcde");
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "length");
    json_t *u = json_object_get(j, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), 5);
    assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 5);
    assert_string_equal(json_string_value(json_object_get(j, "model")), "fake");
    json_decref(j);
    tsr_srv_buf_free(&r.body);

    /* Chat with logprobs. */
    r = http(CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 3, "
                   "\"logprobs\": true, \"top_logprobs\": 2}");
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    c = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(c, "message"), "content")), "abc");
    json_t *lp = json_object_get(json_object_get(c, "logprobs"), "content");
    assert_int_equal(json_array_size(lp), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(lp, 2), "token")), "c");
    assert_int_equal(json_array_size(json_object_get(json_array_get(lp, 0), "top_logprobs")), 2);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")), 7); /* "user:x\n" */
    json_decref(j);
    tsr_srv_buf_free(&r.body);

    /* Chat without max_tokens: the rest of the context. */
    r = http(CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}");
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), FAKE_CTX - 7);
    json_decref(j);
    tsr_srv_buf_free(&r.body);
    stop_server();
}

static void expect_error(const char *path, const char *body, int status, const char *param,
                         const char *const *words) {
    resp r = http(path, body);
    if (r.status != status) fail_msg("%s -> %ld (want %d): %s", body, r.status, status, r.body.data);
    json_t *j = json_of(&r);
    json_t *e = json_object_get(j, "error");
    assert_non_null(e);
    assert_non_null(json_string_value(json_object_get(e, "message")));
    assert_true(json_is_null(json_object_get(e, "code")));
    if (param) assert_string_equal(json_string_value(json_object_get(e, "param")), param);
    else assert_true(json_is_null(json_object_get(e, "param")));
    for (int i = 0; words && words[i]; i++)
        if (!strstr(json_string_value(json_object_get(e, "message")), words[i]))
            fail_msg("message '%s' lacks '%s'", json_string_value(json_object_get(e, "message")), words[i]);
    json_decref(j);
    tsr_srv_buf_free(&r.body);
}

static void test_errors_over_http(void **state) {
    (void)state;
    assert_int_equal(start_server(2, 8), 0);
    tsr_error err;
    assert_int_equal(tsr_server_set_backend(srv, &fake_backend, &err), 0);
    expect_error(CMPL, "{\"prompt\": \"hi\", \"n\": 2}", 400, "n", NULL);
    expect_error(CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, \"top_logprobs\": 21}", 400, "top_logprobs", NULL);
    expect_error(CMPL, "{\"prompt\": \"hi\", \"temperature\": NaN}", 400, NULL, NULL);
    expect_error(CMPL, "{\"prompt\": \"hi\", \"max_tokens\": 9223372036854775808}", 400, "max_tokens", NULL);
    expect_error(CMPL, "not json", 400, NULL, NULL);
    expect_error(CMPL, "", 400, NULL, NULL);
    expect_error(CMPL, "{\"prompt\": [300]}", 400, "prompt", NULL);
    expect_error("/v1/nothing", NULL, 404, NULL, NULL);
    expect_error(CMPL, NULL, 405, NULL, NULL);

    /* The context check at n_ctx - 1, n_ctx, n_ctx + 1 (prompt + max_tokens). */
    char body[256], prompt[64];
    for (int total = FAKE_CTX - 1; total <= FAKE_CTX + 1; total++) {
        int np = total - 5;
        memset(prompt, 'p', (size_t)np);
        prompt[np] = '\0';
        snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 5}", prompt);
        if (total <= FAKE_CTX) {
            resp r = http(CMPL, body);
            assert_int_equal(r.status, 200);
            tsr_srv_buf_free(&r.body);
        } else {
            char n1[16], n2[16];
            snprintf(n1, sizeof n1, "%d", np);
            snprintf(n2, sizeof n2, "%d", FAKE_CTX);
            const char *words[] = {n1, n2, "max_tokens (5)", NULL};
            expect_error(CMPL, body, 400, "max_tokens", words);
            /* Streaming requests get the same plain 400. */
            snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 5, \"stream\": true}", prompt);
            expect_error(CMPL, body, 400, "max_tokens", words);
        }
    }

    /* Body and header limits. */
    char *big = malloc(8000);
    memset(big, ' ', 7999);
    big[7999] = '\0';
    memcpy(big, "{\"prompt\": \"x\"", 14);
    big[7998] = '}';
    expect_error(CMPL, big, 413, NULL, NULL);
    free(big);
    resp r;
    memset(&r, 0, sizeof r);
    CURL *c = make("/health", NULL, &r);
    char *hdr = malloc(10000);
    strcpy(hdr, "X-Big: ");
    memset(hdr + 7, 'a', 9990);
    hdr[9997] = '\0';
    struct curl_slist *h = curl_slist_append(NULL, hdr);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    assert_true(r.status == 431 || r.status == 413);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    free(hdr);
    tsr_srv_buf_free(&r.body);

    /* A failure after the stream began: an error event, no [DONE]. */
    r = http(CMPL, "{\"prompt\": \"FAIL\", \"max_tokens\": 10, \"stream\": true}");
    assert_int_equal(r.status, 200);
    sse s = parse_sse(r.body.data, 0);
    assert_true(s.error);
    assert_false(s.done);
    assert_string_equal(s.text, "abc");
    tsr_srv_buf_free(&r.body);
    r = http(CMPL, "{\"prompt\": \"FAIL\", \"max_tokens\": 10}");
    assert_int_equal(r.status, 500);
    tsr_srv_buf_free(&r.body);
    /* The server lives on. */
    r = http("/health", NULL);
    assert_int_equal(r.status, 200);
    tsr_srv_buf_free(&r.body);
    assert_float_equal(metric("tessera_requests_finished_total{reason=\"error\"}"), 2, 0);
    assert_float_equal(metric("tessera_requests_finished_total{reason=\"rejected\"}"), 2 + 1, 0);
    stop_server();
}

static void test_streaming(void **state) {
    (void)state;
    assert_int_equal(start_server(2, 8), 0);
    tsr_error err;
    assert_int_equal(tsr_server_set_backend(srv, &fake_backend, &err), 0);
    resp r = http(CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 8, "
                        "\"stream\": true, \"stream_options\": {\"include_usage\": true}}");
    assert_int_equal(r.status, 200);
    sse s = parse_sse(r.body.data, 1);
    assert_string_equal(s.text, "abcdefgh");
    assert_string_equal(s.finish, "length");
    assert_true(s.done);
    assert_true(s.role_first);
    assert_int_equal(s.usage_total, 7 + 8);
    assert_true(s.chunks >= 2);
    tsr_srv_buf_free(&r.body);
    r = http(CMPL, "{\"prompt\": \"x\", \"max_tokens\": 30, \"stream\": true}");
    s = parse_sse(r.body.data, 0);
    assert_string_equal(s.text, "abcdefghijklmnopqrstuvwxyzabcd");
    assert_int_equal(s.usage_total, 0); /* not asked */
    tsr_srv_buf_free(&r.body);
    stop_server();
}

/* One turn of the multi handle m: transfers, a wait of up to poll_ms, and
 * the number of transfers that finished in it. */
static int multi_turn(CURLM *m, int *running, int poll_ms) {
    curl_multi_perform(m, running);
    curl_multi_poll(m, NULL, 0, poll_ms, NULL);
    int done = 0, left;
    CURLMsg *msg;
    while ((msg = curl_multi_info_read(m, &left)))
        if (msg->msg == CURLMSG_DONE) done++;
    return done;
}

static void test_queue_full(void **state) {
    (void)state;
    assert_int_equal(start_server(1, 1), 0);
    tsr_error err;
    assert_int_equal(tsr_server_set_backend(srv, &fake_backend, &err), 0);
    atomic_store(&fake_step_us, 20000);
    CURLM *m = curl_multi_init();
    resp rs[4];
    CURL *cs[4];
    const char *body = "{\"prompt\": \"x\", \"max_tokens\": 20, \"stream\": true}";
    for (int i = 0; i < 4; i++) {
        memset(&rs[i], 0, sizeof rs[i]);
        cs[i] = make(CMPL, body, &rs[i]);
        curl_multi_add_handle(m, cs[i]);
    }
    /* hold the engine: one request runs, one waits, two are turned away */
    atomic_store(&fake_hold, 1);
    int running = 4, done = 0;
    while (running) {
        done += multi_turn(m, &running, 50);
        if (done >= 2) atomic_store(&fake_hold, 0);
    }
    atomic_store(&fake_hold, 0);
    int ok = 0, busy = 0;
    for (int i = 0; i < 4; i++) {
        curl_easy_getinfo(cs[i], CURLINFO_RESPONSE_CODE, &rs[i].status);
        if (rs[i].status == 200) {
            ok++;
            tsr_srv_buf_append(&rs[i].body, "", 0);
            sse s = parse_sse(rs[i].body.data, 0);
            assert_int_equal(strlen(s.text), 20);
        } else if (rs[i].status == 429) {
            busy++;
            assert_string_equal(rs[i].retry_after, "2");
        }
        curl_multi_remove_handle(m, cs[i]);
        curl_easy_cleanup(cs[i]);
        tsr_srv_buf_free(&rs[i].body);
    }
    curl_multi_cleanup(m);
    atomic_store(&fake_step_us, 2000);
    if (ok != 2 || busy != 2)
        fail_msg("statuses %ld %ld %ld %ld", rs[0].status, rs[1].status, rs[2].status, rs[3].status);
    assert_int_equal(busy, 2);
    assert_float_equal(metric("tessera_requests_total{status=\"429\"}"), 2, 0);
    stop_server();
}

/* A job whose prompt is being processed (taken off the queue, not running
 * yet) still counts against the capacity: with one slot and a queue of one,
 * while A is being started B queues and C is turned away at once. */
static void test_queue_counts_admitting(void **state) {
    (void)state;
    assert_int_equal(start_server(1, 1), 0);
    tsr_error err;
    assert_int_equal(tsr_server_set_backend(srv, &fake_backend, &err), 0);
    atomic_store(&fake_hold_start, 1);
    CURLM *m = curl_multi_init();
    resp rs[3];
    CURL *cs[3];
    const char *body = "{\"prompt\": \"x\", \"max_tokens\": 2}";
    int running = 0, done = 0, added = 0;
    for (int i = 0; i < 3; i++) memset(&rs[i], 0, sizeof rs[i]);
    cs[0] = make(CMPL, body, &rs[0]);
    curl_multi_add_handle(m, cs[0]);
    added = 1;
    for (int t = 0; done < 3 && t < 1000; t++) { /* at most ~10 s */
        if (added == 1 && atomic_load(&fake_in_start)) { /* A is being admitted: now B and C */
            for (int i = 1; i < 3; i++) {
                cs[i] = make(CMPL, body, &rs[i]);
                curl_multi_add_handle(m, cs[i]);
            }
            added = 3;
        }
        done += multi_turn(m, &running, 10);
        if (added == 3 && done >= 1) atomic_store(&fake_hold_start, 0); /* C answered: let A start */
    }
    atomic_store(&fake_hold_start, 0);
    long st[3];
    for (int i = 0; i < added; i++) {
        curl_easy_getinfo(cs[i], CURLINFO_RESPONSE_CODE, &st[i]);
        curl_multi_remove_handle(m, cs[i]);
        curl_easy_cleanup(cs[i]);
        tsr_srv_buf_free(&rs[i].body);
    }
    curl_multi_cleanup(m);
    assert_int_equal(added, 3);
    if (st[0] != 200 || st[1] + st[2] != 200 + 429)
        fail_msg("statuses %ld %ld %ld (A 200; of B and C one 200, one 429)", st[0], st[1], st[2]);
    stop_server();
}

/* Streams aborted by the client at varied points: every request is
 * accounted for and the KV goes back to idle. */
static void test_client_aborts(void **state) {
    (void)state;
    enum { N = 40, CONC = 8 };
    assert_int_equal(start_server(4, 64), 0);
    tsr_error err;
    assert_int_equal(tsr_server_set_backend(srv, &fake_backend, &err), 0);
    CURLM *m = curl_multi_init();
    resp *rs = calloc(N, sizeof *rs);
    CURL **cs = calloc(N, sizeof *cs);
    unsigned seed = 12345;
    printf("abort test seed %u\n", seed);
    int started = 0, finished = 0, running = 0, completed_ok = 0;
    while (finished < N) {
        while (started < N && started - finished < CONC) {
            rs[started].abort_after = (size_t)(rand_r(&seed) % 3000); /* 0: reads to the end */
            cs[started] = make(CMPL, "{\"prompt\": \"x\", \"max_tokens\": 40, \"stream\": true}",
                               &rs[started]);
            curl_easy_setopt(cs[started], CURLOPT_PRIVATE, &rs[started]);
            curl_multi_add_handle(m, cs[started]);
            started++;
        }
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 20, NULL);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            if (msg->data.result == CURLE_OK) completed_ok++;
            curl_multi_remove_handle(m, msg->easy_handle);
            curl_easy_cleanup(msg->easy_handle);
            finished++;
        }
    }
    curl_multi_cleanup(m);
    for (int i = 0; i < N; i++) tsr_srv_buf_free(&rs[i].body);
    free(rs);
    free(cs);
    /* Wait for the engine to see every abort. */
    double fin = 0;
    for (int i = 0; i < 200; i++) {
        fin = metric("tessera_requests_finished_total{reason=\"stop\"}") +
              metric("tessera_requests_finished_total{reason=\"length\"}") +
              metric("tessera_requests_finished_total{reason=\"cancelled\"}") +
              metric("tessera_requests_finished_total{reason=\"error\"}") +
              metric("tessera_requests_finished_total{reason=\"rejected\"}");
        if (fin == N && metric("tessera_kv_cache_used_bytes") == 0) break;
        usleep(20000);
    }
    assert_float_equal(fin, N, 0);
    assert_float_equal(metric("tessera_requests_total{status=\"200\"}"), N, 0);
    assert_float_equal(metric("tessera_kv_cache_used_bytes"), 0, 0);
    assert_float_equal(metric("tessera_requests_running"), 0, 0);
    assert_float_equal(metric("tessera_queue_depth"), 0, 0);
    assert_int_equal(atomic_load(&fake_live), 0);
    assert_true(metric("tessera_requests_finished_total{reason=\"cancelled\"}") >= 1);
    assert_float_equal(metric("tessera_requests_finished_total{reason=\"length\"}"), completed_ok, 0);
    assert_int_equal(atomic_load(&fake_engine_threads), 0);
    stop_server();
}

/* Shutdown with open streams: they run to their end. */
static void *stream_thread(void *arg) {
    resp *r = arg;
    *r = http(CMPL, "{\"prompt\": \"x\", \"max_tokens\": 40, \"stream\": true}");
    return NULL;
}

static void test_shutdown_with_streams(void **state) {
    (void)state;
    assert_int_equal(start_server(2, 4), 0);
    tsr_error err;
    assert_int_equal(tsr_server_set_backend(srv, &fake_backend, &err), 0);
    atomic_store(&fake_step_us, 10000);
    resp r[3];
    pthread_t t[3];
    for (int i = 0; i < 3; i++) pthread_create(&t[i], NULL, stream_thread, &r[i]);
    usleep(150000);
    int cancelled = tsr_server_shutdown(srv, 10);
    assert_int_equal(cancelled, 0);
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(r[i].status, 200);
        sse s = parse_sse(r[i].body.data, 0);
        assert_true(s.done);
        assert_int_equal(strlen(s.text), 40);
        tsr_srv_buf_free(&r[i].body);
    }
    /* After shutdown nothing listens. */
    resp h = http("/health", NULL);
    assert_int_equal(h.status, 0);
    tsr_srv_buf_free(&h.body);
    tsr_server_free(srv);
    srv = NULL;

    /* A timeout shorter than the work cancels what is left. */
    assert_int_equal(start_server(1, 4), 0);
    assert_int_equal(tsr_server_set_backend(srv, &fake_backend, &err), 0);
    pthread_create(&t[0], NULL, stream_thread, &r[0]);
    usleep(100000);
    cancelled = tsr_server_shutdown(srv, 0.05);
    assert_int_equal(cancelled, 1);
    pthread_join(t[0], NULL);
    sse s = parse_sse(r[0].body.data ? r[0].body.data : "", 0);
    assert_false(s.done);
    tsr_srv_buf_free(&r[0].body);
    tsr_server_free(srv);
    srv = NULL;
    atomic_store(&fake_step_us, 2000);
    assert_int_equal(atomic_load(&fake_live), 0);
}

/* A client that leaves a non-streamed request is seen while it waits. */
static void test_abort_not_streamed(void **state) {
    (void)state;
    assert_int_equal(start_server(1, 4), 0);
    tsr_error err;
    assert_int_equal(tsr_server_set_backend(srv, &fake_backend, &err), 0);
    atomic_store(&fake_step_us, 20000);
    resp r;
    memset(&r, 0, sizeof r);
    CURL *c = make(CMPL, "{\"prompt\": \"x\", \"max_tokens\": 50}", &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 150L); /* leaves after ~7 of 50 steps */
    assert_int_equal(curl_easy_perform(c), CURLE_OPERATION_TIMEDOUT);
    curl_easy_cleanup(c);
    tsr_srv_buf_free(&r.body);
    double cancelled = 0;
    for (int i = 0; i < 100 && cancelled < 1; i++) {
        usleep(20000);
        cancelled = metric("tessera_requests_finished_total{reason=\"cancelled\"}");
    }
    assert_float_equal(cancelled, 1, 0);
    assert_true(metric("tessera_generated_tokens_total") < 50);
    assert_float_equal(metric("tessera_requests_total{status=\"499\"}"), 1, 0);
    assert_float_equal(metric("tessera_kv_cache_used_bytes"), 0, 0);
    atomic_store(&fake_step_us, 2000);
    stop_server();
}

/* A device error is fatal: /health 503, new requests 503, fatal flag set. */
static void test_fatal_engine_error(void **state) {
    (void)state;
    assert_int_equal(start_server(2, 4), 0);
    tsr_error err;
    assert_int_equal(tsr_server_set_backend(srv, &fake_backend, &err), 0);
    assert_int_equal(tsr_server_fatal(srv), 0);
    resp r = http(CMPL, "{\"prompt\": \"DEVICE\", \"max_tokens\": 10}");
    assert_int_equal(r.status, 500);
    tsr_srv_buf_free(&r.body);
    assert_int_equal(tsr_server_fatal(srv), 1);
    r = http("/health", NULL);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.body.data, "error"));
    tsr_srv_buf_free(&r.body);
    r = http(CMPL, "{\"prompt\": \"x\", \"max_tokens\": 10}");
    assert_int_equal(r.status, 503);
    tsr_srv_buf_free(&r.body);
    stop_server();
    assert_int_equal(atomic_load(&fake_live), 0);
}

/* A KV budget smaller than --parallel: requests wait for KV in FIFO order
 * instead of failing; with no budget at all they get a 503. */
static void test_kv_budget(void **state) {
    (void)state;
    assert_int_equal(start_server(4, 8), 0);
    tsr_error err;
    assert_int_equal(tsr_server_set_backend(srv, &fake_backend, &err), 0);
    atomic_store(&fake_kv_slots, 2);
    atomic_store(&fake_peak_live, 0);
    CURLM *m = curl_multi_init();
    resp rs[5];
    CURL *cs[5];
    for (int i = 0; i < 5; i++) {
        memset(&rs[i], 0, sizeof rs[i]);
        cs[i] = make(CMPL, "{\"prompt\": \"x\", \"max_tokens\": 12, \"stream\": true}", &rs[i]);
        curl_multi_add_handle(m, cs[i]);
    }
    int running = 1;
    while (running) multi_turn(m, &running, 20);
    for (int i = 0; i < 5; i++) {
        curl_easy_getinfo(cs[i], CURLINFO_RESPONSE_CODE, &rs[i].status);
        assert_int_equal(rs[i].status, 200);
        tsr_srv_buf_append(&rs[i].body, "", 0);
        sse s = parse_sse(rs[i].body.data, 0);
        assert_string_equal(s.text, "abcdefghijkl");
        assert_true(s.done);
        curl_multi_remove_handle(m, cs[i]);
        curl_easy_cleanup(cs[i]);
        tsr_srv_buf_free(&rs[i].body);
    }
    curl_multi_cleanup(m);
    assert_int_equal(atomic_load(&fake_peak_live), 2);
    atomic_store(&fake_kv_slots, -1);
    expect_error(CMPL, "{\"prompt\": \"x\", \"max_tokens\": 5}", 503, NULL, NULL);
    atomic_store(&fake_kv_slots, 0);
    resp r = http(CMPL, "{\"prompt\": \"x\", \"max_tokens\": 5}");
    assert_int_equal(r.status, 200);
    tsr_srv_buf_free(&r.body);
    stop_server();
}

/* After every test, passed or failed: a server a failed test left running
 * is stopped and the fake engine's knobs put back, so that one failure does
 * not become the next test's (its engine thread would still be calling the
 * fake backend). */
static int teardown(void **state) {
    (void)state;
    atomic_store(&fake_hold, 0);
    atomic_store(&fake_hold_start, 0);
    if (srv) stop_server();
    atomic_store(&fake_step_us, 2000);
    atomic_store(&fake_kv_slots, 0);
    return 0;
}

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
#define T(f) cmocka_unit_test_teardown(f, teardown)
    const struct CMUnitTest tests[] = {
        T(test_health_and_basic),   T(test_errors_over_http),  T(test_streaming), T(test_queue_full),
        T(test_queue_counts_admitting),
        T(test_client_aborts),      T(test_shutdown_with_streams), T(test_abort_not_streamed),
        T(test_fatal_engine_error), T(test_kv_budget),
    };
#undef T
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
