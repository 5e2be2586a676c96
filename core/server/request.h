/*
 * request.h - the body of an OpenAI-style request, parsed and validated.
 *
 * tsr_srv_request_parse turns the JSON body of POST /v1/chat/completions or
 * POST /v1/completions into a tsr_srv_request, checking every field against
 * the validation table below. It needs no model: what depends on the model
 * (the prompt's length against the context, token ids against the
 * vocabulary, whether a chat template exists) is checked by the scheduler.
 *
 * Validation table (anything else is a 400 naming the field):
 *   field                     JSON type            range / rule
 *   model                     string               any (one model is served)
 *   messages (chat)           non-empty array      <= TSR_SRV_MAX_MESSAGES objects
 *     .role                   string               system, developer (= system), user, assistant
 *     .content                string or array      array of {"type":"text","text":string} parts
 *   prompt (completions)      string, [string], [int...]  ids in [0, 2^31); one prompt only
 *   max_tokens,               integer              1 .. TSR_SRV_MAX_TOKENS (max_completion_tokens
 *   max_completion_tokens                          wins when both are given)
 *   temperature               number               0 .. 2
 *   top_p                     number               0 .. 1
 *   top_k                     integer              0 (off) .. TSR_SRV_MAX_TOP_K
 *   min_p                     number               0 .. 1
 *   presence_penalty,         number               -2 .. 2
 *   frequency_penalty
 *   repetition_penalty        number               > 0 .. 10
 *   seed                      integer              -2^63 .. 2^63-1 (used modulo 2^64)
 *   stop                      string or array      <= TSR_SRV_MAX_STOP non-empty strings of
 *                                                  <= TSR_SRV_MAX_STOP_LEN bytes
 *   logprobs                  chat: boolean; completions: integer 0 .. TSR_SRV_MAX_TOP_LOGPROBS
 *   top_logprobs (chat)       integer              0 .. 20, needs logprobs true
 *   n                         integer              1 only
 *   stream                    boolean
 *   stream_options            object               {include_usage: boolean}; needs stream true
 *   echo, best_of, suffix, logit_bias, tools, tool_choice, functions,
 *   function_call, response_format (other than text)   not supported: 400
 * null is the same as leaving a field out. Unknown fields are ignored.
 * Numbers: JSON has no NaN or Infinity, so those (and 1e400) are malformed
 * JSON (400). Integers too large for 64 bits are read as numbers and then
 * fail their field's range check.
 */
#ifndef TSR_SRV_REQUEST_H
#define TSR_SRV_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "../runtime/sampling.h"

#define TSR_SRV_MAX_MESSAGES 4096
#define TSR_SRV_MAX_TOKENS 1048576
#define TSR_SRV_MAX_TOP_K 1048576
#define TSR_SRV_MAX_STOP 8
#define TSR_SRV_MAX_STOP_LEN 256
#define TSR_SRV_MAX_TOP_LOGPROBS 20
#define TSR_SRV_MAX_PROMPT_IDS 1048576

typedef enum tsr_srv_kind {
    TSR_SRV_CHAT = 0,        /* /v1/chat/completions */
    TSR_SRV_COMPLETION = 1   /* /v1/completions */
} tsr_srv_kind;

/* An OpenAI-style error: HTTP status, "type", the offending field ("" for
 * none) and a message. */
typedef struct tsr_srv_error {
    int status;            /* 400, 404, 413, 429, 500, 503 */
    const char *type;      /* "invalid_request_error", "server_error", ... */
    char param[64];
    char message[512];
} tsr_srv_error;

/* Fill e and return -1 (so callers can `return tsr_srv_error_set(...)`). */
int tsr_srv_error_set(tsr_srv_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

typedef struct tsr_srv_msg {
    char *role;            /* "system", "user", "assistant" */
    char *content;         /* text parts joined */
} tsr_srv_msg;

typedef struct tsr_srv_request {
    tsr_srv_kind kind;
    char *model;           /* NULL when not given */
    /* chat */
    tsr_srv_msg *msgs;
    int n_msgs;
    /* completions: text, or token ids when prompt_ids != NULL */
    char *prompt;
    int32_t *prompt_ids;
    int n_prompt_ids;

    int max_tokens;        /* -1: not given (chat: the rest of the context; completions: 16) */
    tsr_sampling sampling; /* defaults: temperature 1, top_p 1, no penalties, no seed */
    char *stop[TSR_SRV_MAX_STOP];
    int n_stop;
    int logprobs;          /* report log-probabilities */
    int top_logprobs;      /* alternatives per token */
    int stream;
    int include_usage;     /* stream_options.include_usage */
} tsr_srv_request;

/* Parse and validate len bytes of body. On success *out is filled (free it
 * with tsr_srv_request_clear) and 0 returned; on failure e says why (400;
 * 503 when memory ran out) and -1 is returned, leaving *out empty. */
int tsr_srv_request_parse(tsr_srv_kind kind, const char *body, size_t len, tsr_srv_request *out,
                          tsr_srv_error *e);
void tsr_srv_request_clear(tsr_srv_request *r);

#endif /* TSR_SRV_REQUEST_H */
