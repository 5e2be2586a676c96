/* request.c - JSON body -> validated tsr_srv_request (see request.h). */
#include "request.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/checked.h"

int tsr_srv_error_set(tsr_srv_error *e, int status, const char *param, const char *fmt, ...) {
    if (!e) return -1;
    e->status = status;
    e->type = status == 429   ? "rate_limit_error"
              : status >= 500 ? "server_error"
                              : "invalid_request_error";
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

void tsr_srv_request_clear(tsr_srv_request *r) {
    if (!r) return;
    free(r->model);
    for (int i = 0; i < r->n_msgs; i++) {
        free(r->msgs[i].role);
        free(r->msgs[i].content);
    }
    free(r->msgs);
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* A field's value, NULL when absent or null. */
static json_t *field(json_t *root, const char *name) {
    json_t *v = json_object_get(root, name);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_number(json_t *root, const char *name, double lo, double hi, int lo_open, float *out,
                      tsr_srv_error *e) {
    json_t *v = field(root, name);
    if (!v) return 0;
    if (!json_is_number(v))
        return tsr_srv_error_set(e, 400, name, "'%s' must be a number, not %s", name,
                                 json_type_name(v));
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
        return tsr_srv_error_set(e, 400, name, "'%s' is %g; it must be in %s%g, %g]", name, d,
                                 lo_open ? "(" : "[", lo, hi);
    *out = (float)d;
    return 0;
}

/* An integer field in [lo, hi]. Integral reals are accepted (1e3, and
 * integers beyond 64 bits, which the parser reads as reals). */
static int get_int(json_t *root, const char *name, double lo, double hi, int64_t *out, int *given,
                   tsr_srv_error *e) {
    json_t *v = field(root, name);
    if (given) *given = v != NULL;
    if (!v) return 0;
    double d;
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if ((double)i < lo || (double)i > hi)
            return tsr_srv_error_set(e, 400, name, "'%s' is %lld; it must be in [%.0f, %.0f]", name,
                                     (long long)i, lo, hi);
        *out = (int64_t)i;
        return 0;
    }
    if (!json_is_real(v))
        return tsr_srv_error_set(e, 400, name, "'%s' must be an integer, not %s", name,
                                 json_type_name(v));
    d = json_real_value(v);
    if (!isfinite(d) || d != floor(d))
        return tsr_srv_error_set(e, 400, name, "'%s' must be an integer, not %g", name, d);
    /* hi may be 2^63-1, which rounds to 2^63 as a double: compare with < 2^63. */
    if (d < lo || d > hi || d >= 9223372036854775808.0)
        return tsr_srv_error_set(e, 400, name, "'%s' is %.0f; it must be in [%.0f, %.0f]", name, d,
                                 lo, hi);
    *out = (int64_t)d;
    return 0;
}

static int get_bool(json_t *root, const char *name, int *out, tsr_srv_error *e) {
    json_t *v = field(root, name);
    if (!v) return 0;
    if (!json_is_boolean(v))
        return tsr_srv_error_set(e, 400, name, "'%s' must be a boolean, not %s", name,
                                 json_type_name(v));
    *out = json_is_true(v);
    return 0;
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* Message content: a string, or an array of {"type":"text","text":...}
 * parts, joined without separator. */
static int parse_content(json_t *c, int idx, char **out, tsr_srv_error *e) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", idx);
    if (!c) return tsr_srv_error_set(e, 400, param, "'%s' is required", param);
    if (json_is_string(c)) {
        *out = dup_n(json_string_value(c), json_string_length(c));
        return *out ? 0 : tsr_srv_error_set(e, 503, "", "out of memory");
    }
    if (!json_is_array(c))
        return tsr_srv_error_set(e, 400, param,
                                 "'%s' must be a string or an array of text parts, not %s", param,
                                 json_type_name(c));
    uint64_t total = 0;
    size_t i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        json_t *text = json_is_object(part) ? json_object_get(part, "text") : NULL;
        if (!json_is_object(part) || !json_is_string(type))
            return tsr_srv_error_set(e, 400, param,
                                     "'%s[%zu]' must be an object with a string 'type'", param, i);
        if (strcmp(json_string_value(type), "text") != 0)
            return tsr_srv_error_set(e, 400, param,
                                     "'%s[%zu]' has type '%.40s'; only 'text' parts are supported",
                                     param, i, json_string_value(type));
        if (!json_is_string(text))
            return tsr_srv_error_set(e, 400, param, "'%s[%zu].text' must be a string", param, i);
        if (tsr_add_u64(total, json_string_length(text), &total))
            return tsr_srv_error_set(e, 400, param, "'%s' is too long", param);
    }
    if (total > SIZE_MAX - 1) return tsr_srv_error_set(e, 400, param, "'%s' is too long", param);
    char *s = malloc((size_t)total + 1);
    if (!s) return tsr_srv_error_set(e, 503, "", "out of memory");
    size_t off = 0;
    json_array_foreach(c, i, part) {
        json_t *text = json_object_get(part, "text");
        size_t n = json_string_length(text);
        memcpy(s + off, json_string_value(text), n);
        off += n;
    }
    s[off] = '\0';
    *out = s;
    return 0;
}

static int parse_messages(json_t *root, tsr_srv_request *r, tsr_srv_error *e) {
    json_t *m = field(root, "messages");
    if (!m) return tsr_srv_error_set(e, 400, "messages", "'messages' is required");
    if (!json_is_array(m))
        return tsr_srv_error_set(e, 400, "messages", "'messages' must be an array, not %s",
                                 json_type_name(m));
    size_t n = json_array_size(m);
    if (n == 0) return tsr_srv_error_set(e, 400, "messages", "'messages' must not be empty");
    if (n > TSR_SRV_MAX_MESSAGES)
        return tsr_srv_error_set(e, 400, "messages", "'messages' has %zu entries; at most %d", n,
                                 TSR_SRV_MAX_MESSAGES);
    r->msgs = calloc(n, sizeof *r->msgs);
    if (!r->msgs) return tsr_srv_error_set(e, 503, "", "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *msg = json_array_get(m, i);
        char param[64];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(msg))
            return tsr_srv_error_set(e, 400, param, "'%s' must be an object, not %s", param,
                                     json_type_name(msg));
        json_t *role = json_object_get(msg, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!json_is_string(role))
            return tsr_srv_error_set(e, 400, param, "'%s' must be a string", param);
        const char *rs = json_string_value(role);
        const char *canon = !strcmp(rs, "system") || !strcmp(rs, "developer") ? "system"
                            : !strcmp(rs, "user")                             ? "user"
                            : !strcmp(rs, "assistant")                        ? "assistant"
                                                                              : NULL;
        if (!canon)
            return tsr_srv_error_set(e, 400, param,
                                     "'%s' is '%.40s'; it must be system, developer, user or "
                                     "assistant",
                                     param, rs);
        r->msgs[i].role = strdup(canon);
        r->n_msgs = (int)i + 1;
        if (!r->msgs[i].role) return tsr_srv_error_set(e, 503, "", "out of memory");
        if (parse_content(field(msg, "content"), (int)i, &r->msgs[i].content, e)) return -1;
    }
    return 0;
}

static int parse_prompt(json_t *root, tsr_srv_request *r, tsr_srv_error *e) {
    json_t *p = field(root, "prompt");
    if (!p) return tsr_srv_error_set(e, 400, "prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        r->prompt = dup_n(json_string_value(p), json_string_length(p));
        if (!r->prompt) return tsr_srv_error_set(e, 503, "", "out of memory");
        return 0;
    }
    if (!json_is_array(p))
        return tsr_srv_error_set(e, 400, "prompt",
                                 "'prompt' must be a string or an array of token ids, not %s",
                                 json_type_name(p));
    size_t n = json_array_size(p);
    if (n == 0) return tsr_srv_error_set(e, 400, "prompt", "'prompt' must not be empty");
    if (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)))
        return tsr_srv_error_set(e, 400, "prompt",
                                 "'prompt' holds %zu prompts; one prompt per request is supported",
                                 n);
    if (n > TSR_SRV_MAX_PROMPT_IDS)
        return tsr_srv_error_set(e, 400, "prompt", "'prompt' has %zu token ids; at most %d", n,
                                 TSR_SRV_MAX_PROMPT_IDS);
    uint64_t bytes;
    if (tsr_mul_u64(n, sizeof(int32_t), &bytes) || bytes > SIZE_MAX)
        return tsr_srv_error_set(e, 400, "prompt", "'prompt' is too long");
    r->prompt_ids = malloc((size_t)bytes);
    if (!r->prompt_ids) return tsr_srv_error_set(e, 503, "", "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(p, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > INT32_MAX)
            return tsr_srv_error_set(e, 400, "prompt",
                                     "'prompt[%zu]' must be a token id (an integer in [0, 2^31)), "
                                     "not %s",
                                     i, json_type_name(v));
        r->prompt_ids[i] = (int32_t)json_integer_value(v);
    }
    r->n_prompt_ids = (int)n;
    return 0;
}

static int parse_stop(json_t *root, tsr_srv_request *r, tsr_srv_error *e) {
    json_t *s = field(root, "stop");
    if (!s) return 0;
    json_t *one[1] = {s};
    json_t **items = one;
    size_t n = 1;
    if (json_is_array(s)) {
        n = json_array_size(s);
        if (n > TSR_SRV_MAX_STOP)
            return tsr_srv_error_set(e, 400, "stop", "'stop' has %zu strings; at most %d", n,
                                     TSR_SRV_MAX_STOP);
        items = NULL;
    } else if (!json_is_string(s)) {
        return tsr_srv_error_set(e, 400, "stop",
                                 "'stop' must be a string or an array of strings, not %s",
                                 json_type_name(s));
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = items ? items[i] : json_array_get(s, i);
        if (!json_is_string(v))
            return tsr_srv_error_set(e, 400, "stop", "'stop[%zu]' must be a string, not %s", i,
                                     json_type_name(v));
        size_t len = json_string_length(v);
        if (len == 0)
            return tsr_srv_error_set(e, 400, "stop", "'stop' strings must not be empty");
        if (len > TSR_SRV_MAX_STOP_LEN)
            return tsr_srv_error_set(e, 400, "stop", "'stop[%zu]' is %zu bytes; at most %d", i, len,
                                     TSR_SRV_MAX_STOP_LEN);
        if (memchr(json_string_value(v), '\0', len))
            return tsr_srv_error_set(e, 400, "stop", "'stop[%zu]' contains a NUL character", i);
        r->stop[r->n_stop] = dup_n(json_string_value(v), len);
        if (!r->stop[r->n_stop]) return tsr_srv_error_set(e, 503, "", "out of memory");
        r->n_stop++;
    }
    return 0;
}

/* Fields we know but do not implement: refuse rather than ignore them. */
static int refuse_unsupported(json_t *root, tsr_srv_error *e) {
    static const char *const never[] = {"tools", "tool_choice", "functions", "function_call",
                                        "suffix"};
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
        if (field(root, never[i]))
            return tsr_srv_error_set(e, 400, never[i], "'%s' is not supported", never[i]);
    json_t *v;
    if ((v = field(root, "echo")) && !json_is_false(v))
        return tsr_srv_error_set(e, 400, "echo", "'echo' is not supported");
    if ((v = field(root, "best_of")) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return tsr_srv_error_set(e, 400, "best_of", "'best_of' must be 1 (or left out)");
    if ((v = field(root, "logit_bias")) && !(json_is_object(v) && json_object_size(v) == 0))
        return tsr_srv_error_set(e, 400, "logit_bias", "'logit_bias' is not supported");
    if ((v = field(root, "response_format"))) {
        json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0)
            return tsr_srv_error_set(e, 400, "response_format",
                                     "'response_format' other than {\"type\": \"text\"} is not "
                                     "supported");
    }
    return 0;
}

static int parse_root(tsr_srv_kind kind, json_t *root, tsr_srv_request *r, tsr_srv_error *e) {
    if (!json_is_object(root))
        return tsr_srv_error_set(e, 400, "", "the request body must be a JSON object, not %s",
                                 json_type_name(root));
    r->kind = kind;
    r->max_tokens = -1;
    r->sampling = (tsr_sampling){.temperature = 1.0f,
                                 .top_k = 0,
                                 .top_p = 1.0f,
                                 .min_p = 0.0f,
                                 .repetition_penalty = 1.0f,
                                 .presence_penalty = 0.0f,
                                 .frequency_penalty = 0.0f};
    json_t *v;
    if ((v = field(root, "model"))) {
        if (!json_is_string(v))
            return tsr_srv_error_set(e, 400, "model", "'model' must be a string, not %s",
                                     json_type_name(v));
        r->model = dup_n(json_string_value(v), json_string_length(v));
        if (!r->model) return tsr_srv_error_set(e, 503, "", "out of memory");
    }
    if (kind == TSR_SRV_CHAT ? parse_messages(root, r, e) : parse_prompt(root, r, e)) return -1;
    if (refuse_unsupported(root, e)) return -1;

    int64_t iv;
    int given;
    if (get_int(root, "n", -9.3e18, 9.3e18, &iv, &given, e)) return -1;
    if (given && iv != 1)
        return tsr_srv_error_set(e, 400, "n", "'n' is %lld; only n = 1 is supported",
                                 (long long)iv);
    if (get_int(root, "max_tokens", 1, TSR_SRV_MAX_TOKENS, &iv, &given, e)) return -1;
    if (given) r->max_tokens = (int)iv;
    if (get_int(root, "max_completion_tokens", 1, TSR_SRV_MAX_TOKENS, &iv, &given, e)) return -1;
    if (given) r->max_tokens = (int)iv;

    tsr_sampling *s = &r->sampling;
    if (get_number(root, "temperature", 0, 2, 0, &s->temperature, e)) return -1;
    if (get_number(root, "top_p", 0, 1, 0, &s->top_p, e)) return -1;
    if (get_number(root, "min_p", 0, 1, 0, &s->min_p, e)) return -1;
    if (get_number(root, "presence_penalty", -2, 2, 0, &s->presence_penalty, e)) return -1;
    if (get_number(root, "frequency_penalty", -2, 2, 0, &s->frequency_penalty, e)) return -1;
    if (get_number(root, "repetition_penalty", 0, 10, 1, &s->repetition_penalty, e)) return -1;
    if (get_int(root, "top_k", 0, TSR_SRV_MAX_TOP_K, &iv, &given, e)) return -1;
    if (given) s->top_k = (int)iv;
    if (get_int(root, "seed", -9223372036854775808.0, 9223372036854775807.0, &iv, &given, e))
        return -1;
    if (given) {
        s->seed = (uint64_t)iv;
        s->has_seed = 1;
    }
    if (parse_stop(root, r, e)) return -1;

    if (kind == TSR_SRV_CHAT) {
        if (get_bool(root, "logprobs", &r->logprobs, e)) return -1;
        if (get_int(root, "top_logprobs", 0, TSR_SRV_MAX_TOP_LOGPROBS, &iv, &given, e)) return -1;
        if (given) {
            if (!r->logprobs)
                return tsr_srv_error_set(e, 400, "top_logprobs",
                                         "'top_logprobs' needs 'logprobs' set to true");
            r->top_logprobs = (int)iv;
        }
    } else {
        if (field(root, "top_logprobs"))
            return tsr_srv_error_set(e, 400, "top_logprobs",
                                     "'top_logprobs' belongs to chat completions; completions "
                                     "take an integer 'logprobs'");
        if (get_int(root, "logprobs", 0, TSR_SRV_MAX_TOP_LOGPROBS, &iv, &given, e)) return -1;
        if (given) {
            r->logprobs = 1;
            r->top_logprobs = (int)iv;
        }
    }

    if (get_bool(root, "stream", &r->stream, e)) return -1;
    if ((v = field(root, "stream_options"))) {
        if (!json_is_object(v))
            return tsr_srv_error_set(e, 400, "stream_options",
                                     "'stream_options' must be an object, not %s",
                                     json_type_name(v));
        if (!r->stream)
            return tsr_srv_error_set(e, 400, "stream_options",
                                     "'stream_options' is only allowed when 'stream' is true");
        json_t *iu = json_object_get(v, "include_usage");
        if (iu && !json_is_null(iu)) {
            if (!json_is_boolean(iu))
                return tsr_srv_error_set(e, 400, "stream_options.include_usage",
                                         "'stream_options.include_usage' must be a boolean");
            r->include_usage = json_is_true(iu);
        }
    }
    return 0;
}

/* jansson reports some allocation failures as syntax errors; its allocator
 * is wrapped (same malloc and free, so mixing with other jansson users is
 * harmless) to tell "out of memory" (503) from malformed JSON (400). */
static _Thread_local int json_oom;
static void *json_malloc(size_t n) {
    void *p = malloc(n);
    if (!p) json_oom = 1;
    return p;
}
static pthread_once_t json_alloc_once = PTHREAD_ONCE_INIT;
static void json_alloc_install(void) {
    json_set_alloc_funcs(json_malloc, free);
}

int tsr_srv_request_parse(tsr_srv_kind kind, const char *body, size_t len, tsr_srv_request *out,
                          tsr_srv_error *e) {
    memset(out, 0, sizeof *out);
    if (!body || len == 0)
        return tsr_srv_error_set(e, 400, "", "the request body is empty; expected a JSON object");
    pthread_once(&json_alloc_once, json_alloc_install);
    json_oom = 0;
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root && strstr(je.text, "too big") && strstr(je.text, "integer"))
        root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &je);
    /* jansson fails some allocations without a message (line -1, empty text). */
    if (!root && (json_oom || json_error_code(&je) == json_error_out_of_memory || !je.text[0]))
        return tsr_srv_error_set(e, 503, "", "out of memory while reading the request");
    if (!root)
        return tsr_srv_error_set(e, 400, "", "malformed JSON at line %d column %d: %s", je.line,
                                 je.column, je.text);
    if (json_oom) { /* a failure jansson swallowed (it may have read a truncated token) */
        json_decref(root);
        return tsr_srv_error_set(e, 503, "", "out of memory while reading the request");
    }
    int rc = parse_root(kind, root, out, e);
    json_decref(root);
    if (rc) tsr_srv_request_clear(out);
    return rc;
}
