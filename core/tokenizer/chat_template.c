/*
 * chat_template.c - the three chat formats, recognised from a model's
 * chat_template text and rendered as their published templates do:
 *   ChatML (Qwen):  <|im_start|>ROLE\nCONTENT<|im_end|>\n ... <|im_start|>assistant\n
 *   Llama-3:        BOS <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT|trim<|eot_id|> ...
 *   Llama-2:        BOS[INST] <<SYS>>\nSYS\n<</SYS>>\n\nUSER [/INST] ANSWER </s>BOS[INST] ...
 * No default system prompt is inserted. Jinja itself is not interpreted:
 * model-specific additions (Qwen3's <think> blocks for the last assistant
 * turn, tools, Llama 3.1's date header) are not rendered.
 */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Jinja's trim / Python's strip on ASCII whitespace. */
static void sb_trimmed(sbuf *b, const char *s) {
    size_t n = strlen(s), a = 0;
    while (a < n && is_ws(s[a])) a++;
    while (n > a && is_ws(s[n - 1])) n--;
    sb_add(b, s + a, n - a);
}

int tsr_chat_format_from_name(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "chatml")) return TSR_CHAT_CHATML;
    if (!strcmp(name, "llama3")) return TSR_CHAT_LLAMA3;
    if (!strcmp(name, "llama2")) return TSR_CHAT_LLAMA2;
    return -1;
}

int tsr_chat_format_detect_text(const char *tmpl, tsr_chat_format *out, tsr_error *err) {
    *out = TSR_CHAT_NONE;
    if (!tmpl || !tmpl[0]) return TSR_OK;
    if (strstr(tmpl, "<|im_start|>")) *out = TSR_CHAT_CHATML;
    else if (strstr(tmpl, "<|start_header_id|>")) *out = TSR_CHAT_LLAMA3;
    else if (strstr(tmpl, "[INST]")) *out = TSR_CHAT_LLAMA2;
    else
        return tsr_error_set(err, TSR_ERR_UNSUPPORTED,
                             "unrecognised chat template; choose one with --chat-format chatml|llama3|llama2");
    return TSR_OK;
}

int tsr_chat_format_detect(const tsr_tokenizer *t, tsr_chat_format *out, tsr_error *err) {
    return tsr_chat_format_detect_text(t->chat_template, out, err);
}

char *tsr_chat_render(tsr_chat_format fmt, const tsr_chat_msg *msgs, int n, int add_generation,
                      const char *bos_text, tsr_error *err) {
    sbuf b = {0};
    if (n < 0 || (n > 0 && !msgs)) {
        tsr_error_set(err, TSR_ERR_INVALID, "chat: no messages");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) {
            tsr_error_set(err, TSR_ERR_INVALID, "chat: message %d has no %s", i, msgs[i].role ? "content" : "role");
            return NULL;
        }
    if (!bos_text) bos_text = "";
    sb_add(&b, "", 0);
    switch (fmt) {
    case TSR_CHAT_CHATML:
        for (int i = 0; i < n; i++) {
            sb_str(&b, "<|im_start|>");
            sb_str(&b, msgs[i].role);
            sb_str(&b, "\n");
            sb_str(&b, msgs[i].content);
            sb_str(&b, "<|im_end|>\n");
        }
        if (add_generation) sb_str(&b, "<|im_start|>assistant\n");
        break;
    case TSR_CHAT_LLAMA3:
        sb_str(&b, bos_text);
        for (int i = 0; i < n; i++) {
            sb_str(&b, "<|start_header_id|>");
            sb_str(&b, msgs[i].role);
            sb_str(&b, "<|end_header_id|>\n\n");
            sb_trimmed(&b, msgs[i].content);
            sb_str(&b, "<|eot_id|>");
        }
        if (add_generation) sb_str(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case TSR_CHAT_LLAMA2: {
        int first = 0;
        const char *sys = NULL;
        if (n > 0 && !strcmp(msgs[0].role, "system")) {
            sys = msgs[0].content;
            first = 1;
        }
        for (int i = first; i < n; i++) {
            int want_user = (i - first) % 2 == 0;
            if (strcmp(msgs[i].role, want_user ? "user" : "assistant") != 0) {
                free(b.p);
                tsr_error_set(err, TSR_ERR_INVALID,
                              "chat: llama2 format needs roles user/assistant/user/... after an optional "
                              "system message; message %d is '%.40s'", i, msgs[i].role);
                return NULL;
            }
            if (want_user) {
                sbuf c = {0};
                if (i == first && sys) {
                    sb_str(&c, "<<SYS>>\n");
                    sb_str(&c, sys);
                    sb_str(&c, "\n<</SYS>>\n\n");
                }
                sb_str(&c, msgs[i].content);
                sb_str(&b, bos_text);
                sb_str(&b, "[INST] ");
                if (c.oom) b.oom = 1;
                else sb_trimmed(&b, c.p);
                sb_str(&b, " [/INST]");
                free(c.p);
            } else {
                sb_str(&b, " ");
                sb_trimmed(&b, msgs[i].content);
                sb_str(&b, " </s>");
            }
        }
        break; /* the prompt already ends with [/INST]: nothing to add for generation */
    }
    default:
        free(b.p);
        tsr_error_set(err, TSR_ERR_INVALID, "chat: no chat format chosen");
        return NULL;
    }
    if (b.oom) {
        free(b.p);
        tsr_error_set(err, TSR_ERR_NOMEM, "chat: out of memory");
        return NULL;
    }
    return b.p;
}
