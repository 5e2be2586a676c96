/*
 * libFuzzer harness: a request body -> validated request (core/server/
 * request.c), as both endpoints read it. Accepted requests must satisfy the
 * validation table; refused ones carry a 400 whose error object is valid
 * JSON. The text of accepted requests also goes through the response
 * writers (invalid UTF-8 must come out repaired, never as bad JSON).
 */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/server/request.h"
#include "core/server/response.h"

#define CHECK(x)                                                                         \
    do {                                                                                 \
        if (!(x)) {                                                                      \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #x);   \
            abort();                                                                     \
        }                                                                                \
    } while (0)

static void check_json(char *s) {
    CHECK(s != NULL);
    json_t *j = json_loads(s, 0, NULL);
    CHECK(j != NULL);
    json_decref(j);
    free(s);
}

static void check_accepted(const tsr_srv_request *r) {
    const tsr_sampling *s = &r->sampling;
    CHECK(r->max_tokens == -1 || (r->max_tokens >= 1 && r->max_tokens <= TSR_SRV_MAX_TOKENS));
    CHECK(isfinite(s->temperature) && s->temperature >= 0 && s->temperature <= 2);
    CHECK(s->top_p >= 0 && s->top_p <= 1);
    CHECK(s->min_p >= 0 && s->min_p <= 1);
    CHECK(s->top_k >= 0 && s->top_k <= TSR_SRV_MAX_TOP_K);
    CHECK(s->repetition_penalty > 0 && s->repetition_penalty <= 10);
    CHECK(fabsf(s->presence_penalty) <= 2 && fabsf(s->frequency_penalty) <= 2);
    CHECK(r->n_stop >= 0 && r->n_stop <= TSR_SRV_MAX_STOP);
    for (int i = 0; i < r->n_stop; i++) CHECK(r->stop[i] && r->stop[i][0]);
    CHECK(r->top_logprobs >= 0 && r->top_logprobs <= TSR_SRV_MAX_TOP_LOGPROBS);
    CHECK(!r->include_usage || r->stream);
    tsr_srv_resp_info ri = {r->kind, "id", r->model ? r->model : "m", 0};
    if (r->kind == TSR_SRV_CHAT) {
        CHECK(r->n_msgs >= 1 && r->n_msgs <= TSR_SRV_MAX_MESSAGES);
        for (int i = 0; i < r->n_msgs; i++) {
            CHECK(r->msgs[i].role && r->msgs[i].content);
            const char *c = r->msgs[i].content;
            check_json(tsr_srv_chunk_json(&ri, i == 0, c, strlen(c), NULL, 0, NULL));
        }
    } else {
        CHECK(!!r->prompt != !!r->prompt_ids);
        if (r->prompt) check_json(tsr_srv_response_json(&ri, r->prompt, strlen(r->prompt), NULL,
                                                        "stop", 1, 1));
        for (int i = 0; i < r->n_prompt_ids; i++) CHECK(r->prompt_ids[i] >= 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int k = 0; k < 2; k++) {
        tsr_srv_request r;
        tsr_srv_error e;
        memset(&e, 0, sizeof e);
        tsr_srv_kind kind = k ? TSR_SRV_COMPLETION : TSR_SRV_CHAT;
        if (tsr_srv_request_parse(kind, (const char *)data, size, &r, &e) == 0) {
            CHECK(r.kind == kind);
            check_accepted(&r);
            tsr_srv_request_clear(&r);
        } else {
            CHECK(e.status == 400 || e.status == 503);
            CHECK(e.message[0] != '\0');
            check_json(tsr_srv_error_json(&e));
        }
    }
    return 0;
}
