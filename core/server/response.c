/* response.c - JSON writers for responses, chunks and errors. */
#include "response.h"

#include <stdlib.h>
#include <string.h>

#include "../util/checked.h"

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, min = 0x10000;
    else return 0;
    if (len > n) return 0;
    unsigned cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

json_t *tsr_srv_json_text(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t k = utf8_seq(u + i, len - i);
        if (!k || u[i] == 0) break;
        i += k;
    }
    if (i == len) return json_stringn(s, len);
    /* Worst case every byte becomes the 3-byte U+FFFD. */
    uint64_t cap;
    if (tsr_muladd_u64(len, 3, 1, &cap) || cap > SIZE_MAX) return NULL;
    char *o = malloc((size_t)cap);
    if (!o) return NULL;
    size_t w = 0;
    for (i = 0; i < len;) {
        size_t k = utf8_seq(u + i, len - i);
        if (k && u[i] != 0) {
            memcpy(o + w, s + i, k);
            w += k;
            i += k;
        } else {
            memcpy(o + w, "\xEF\xBF\xBD", 3);
            w += 3;
            i++;
        }
    }
    json_t *j = json_stringn(o, w);
    free(o);
    return j;
}

static json_t *bytes_array(const char *s, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

static char *dump(json_t *j) {
    if (!j) return NULL;
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

char *tsr_srv_error_json(const tsr_srv_error *e) {
    json_t *err = json_pack("{s:o, s:s, s:o, s:n}", "message",
                            tsr_srv_json_text(e->message, strlen(e->message)), "type",
                            e->type ? e->type : "invalid_request_error", "param",
                            e->param[0] ? json_string(e->param) : json_null(), "code");
    return dump(err ? json_pack("{s:o}", "error", err) : NULL);
}

json_t *tsr_srv_logprob_entry(const char *tok, size_t tok_len, float logprob, int n_top,
                              const char *const *top_tok, const size_t *top_len,
                              const float *top_lp) {
    json_t *tops = json_array();
    for (int i = 0; tops && i < n_top; i++)
        json_array_append_new(tops, json_pack("{s:o, s:f, s:o}", "token",
                                              tsr_srv_json_text(top_tok[i], top_len[i]), "logprob",
                                              (double)top_lp[i], "bytes",
                                              bytes_array(top_tok[i], top_len[i])));
    return json_pack("{s:o, s:f, s:o, s:o}", "token", tsr_srv_json_text(tok, tok_len), "logprob",
                     (double)logprob, "bytes", bytes_array(tok, tok_len), "top_logprobs", tops);
}

json_t *tsr_srv_logprobs_completion(json_t *entries, size_t text_offset0) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
           *offs = json_array();
    size_t off = text_offset0, i;
    json_t *en;
    json_array_foreach(entries, i, en) {
        json_t *tok = json_object_get(en, "token");
        json_array_append(tokens, tok);
        json_array_append(lps, json_object_get(en, "logprob"));
        json_t *d = json_object();
        size_t k;
        json_t *t;
        json_array_foreach(json_object_get(en, "top_logprobs"), k, t)
            json_object_set(d, json_string_value(json_object_get(t, "token")),
                            json_object_get(t, "logprob"));
        json_array_append_new(tops, d);
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += json_array_size(json_object_get(en, "bytes"));
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

static json_t *usage(int n_prompt, int n_completion) {
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", n_prompt, "completion_tokens",
                     n_completion, "total_tokens", n_prompt + n_completion);
}

static json_t *head(const tsr_srv_resp_info *ri, const char *object) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", ri->id, "object", object, "created",
                     (json_int_t)ri->created, "model", ri->model ? ri->model : "");
}

static json_t *chat_logprobs(json_t *lp) {
    return lp ? json_pack("{s:O}", "content", lp) : json_null();
}

char *tsr_srv_response_json(const tsr_srv_resp_info *ri, const char *text, size_t len,
                            json_t *logprobs, const char *finish, int n_prompt, int n_completion) {
    json_t *r, *choice;
    if (ri->kind == TSR_SRV_CHAT) {
        r = head(ri, "chat.completion");
        choice = json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", 0, "message", "role",
                           "assistant", "content", tsr_srv_json_text(text, len), "logprobs",
                           chat_logprobs(logprobs), "finish_reason", finish);
    } else {
        r = head(ri, "text_completion");
        choice = json_pack("{s:i, s:o, s:o, s:s}", "index", 0, "text",
                           tsr_srv_json_text(text, len), "logprobs",
                           logprobs ? tsr_srv_logprobs_completion(logprobs, 0) : json_null(),
                           "finish_reason", finish);
    }
    if (!r || !choice) {
        json_decref(r);
        json_decref(choice);
        return NULL;
    }
    json_object_set_new(r, "choices", json_pack("[o]", choice));
    json_object_set_new(r, "usage", usage(n_prompt, n_completion));
    return dump(r);
}

char *tsr_srv_chunk_json(const tsr_srv_resp_info *ri, int first, const char *text, size_t len,
                         json_t *logprobs, size_t text_offset0, const char *finish) {
    json_t *r, *choice;
    json_t *fin = finish ? json_string(finish) : json_null();
    if (ri->kind == TSR_SRV_CHAT) {
        r = head(ri, "chat.completion.chunk");
        json_t *delta = json_object();
        if (first) json_object_set_new(delta, "role", json_string("assistant"));
        if (len || first) json_object_set_new(delta, "content", tsr_srv_json_text(text, len));
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "delta", delta, "logprobs",
                           chat_logprobs(logprobs), "finish_reason", fin);
    } else {
        r = head(ri, "text_completion");
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "text",
                           tsr_srv_json_text(text, len), "logprobs",
                           logprobs ? tsr_srv_logprobs_completion(logprobs, text_offset0)
                                    : json_null(),
                           "finish_reason", fin);
    }
    if (!r || !choice) {
        json_decref(r);
        json_decref(choice);
        return NULL;
    }
    json_object_set_new(r, "choices", json_pack("[o]", choice));
    return dump(r);
}

char *tsr_srv_usage_chunk_json(const tsr_srv_resp_info *ri, int n_prompt, int n_completion) {
    json_t *r = head(ri, ri->kind == TSR_SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    if (!r) return NULL;
    json_object_set_new(r, "choices", json_array());
    json_object_set_new(r, "usage", usage(n_prompt, n_completion));
    return dump(r);
}

int tsr_srv_buf_append(tsr_srv_buf *b, const char *s, size_t n) {
    uint64_t need;
    if (tsr_add_u64(b->len, n, &need) || tsr_add_u64(need, 1, &need) || need > SIZE_MAX) return -1;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) cap = cap > SIZE_MAX / 2 ? (size_t)need : cap * 2;
        char *d = realloc(b->data, cap);
        if (!d) return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int tsr_srv_sse_append(tsr_srv_buf *b, const char *json) {
    if (!json) return -1;
    if (tsr_srv_buf_append(b, "data: ", 6)) return -1;
    if (tsr_srv_buf_append(b, json, strlen(json))) return -1;
    return tsr_srv_buf_append(b, "\n\n", 2);
}

void tsr_srv_buf_free(tsr_srv_buf *b) {
    if (!b) return;
    free(b->data);
    memset(b, 0, sizeof *b);
}
