/*
 * response.h - the JSON the server writes: OpenAI-style error objects,
 * whole responses, streaming chunks and their server-sent-event framing.
 * Every function returns a malloc'ed NUL-terminated string (caller frees),
 * or NULL when out of memory. Text is written as valid UTF-8: invalid bytes
 * become U+FFFD (the "bytes" arrays of log-probabilities keep the raw bytes).
 */
#ifndef TSR_SRV_RESPONSE_H
#define TSR_SRV_RESPONSE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "request.h"

/* What every response of one request shares. */
typedef struct tsr_srv_resp_info {
    tsr_srv_kind kind;
    const char *id;      /* "chatcmpl-..." or "cmpl-..." */
    const char *model;
    int64_t created;     /* unix seconds */
} tsr_srv_resp_info;

/* {"error": {"message", "type", "param" (null when ""), "code": null}} */
char *tsr_srv_error_json(const tsr_srv_error *e);

/* A json string of len bytes, invalid UTF-8 replaced by U+FFFD. */
json_t *tsr_srv_json_text(const char *s, size_t len);

/* One log-probability entry in the chat layout:
 * {"token", "logprob", "bytes": [..], "top_logprobs": [{"token", "logprob", "bytes"}]}.
 * top_tok[i] has top_len[i] bytes. */
json_t *tsr_srv_logprob_entry(const char *tok, size_t tok_len, float logprob, int n_top,
                              const char *const *top_tok, const size_t *top_len,
                              const float *top_lp);

/* The chat entries converted to the completions layout: {"tokens",
 * "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"},
 * offsets counted from text_offset0. New reference. */
json_t *tsr_srv_logprobs_completion(json_t *entries, size_t text_offset0);

/* A whole (non-streamed) response. logprobs: chat entries or NULL (borrowed).
 * finish: "stop" or "length". */
char *tsr_srv_response_json(const tsr_srv_resp_info *ri, const char *text, size_t len,
                            json_t *logprobs, const char *finish, int n_prompt, int n_completion);

/* One streaming chunk. first: the chat chunk carries role "assistant".
 * finish: NULL while running. usage chunks: see below. */
char *tsr_srv_chunk_json(const tsr_srv_resp_info *ri, int first, const char *text, size_t len,
                         json_t *logprobs, size_t text_offset0, const char *finish);
/* The final chunk of stream_options.include_usage: empty choices, usage. */
char *tsr_srv_usage_chunk_json(const tsr_srv_resp_info *ri, int n_prompt, int n_completion);

/* "data: " json "\n\n" appended to *buf (growing it); 0 or -1 (no memory). */
typedef struct tsr_srv_buf {
    char *data;
    size_t len, cap;
} tsr_srv_buf;
int tsr_srv_buf_append(tsr_srv_buf *b, const char *s, size_t n);
int tsr_srv_sse_append(tsr_srv_buf *b, const char *json);
void tsr_srv_buf_free(tsr_srv_buf *b);

#endif /* TSR_SRV_RESPONSE_H */
