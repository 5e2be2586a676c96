#include "sse.h"

#include <stdlib.h>
#include <string.h>

void tsr_sse_init(tsr_sse *p, tsr_sse_event_fn fn, void *ud) {
    memset(p, 0, sizeof *p);
    p->fn = fn;
    p->ud = ud;
    strcpy(p->type, "message");
}

void tsr_sse_free(tsr_sse *p) {
    if (!p) return;
    free(p->line);
    free(p->data);
    p->line = p->data = NULL;
}

static int grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *g = realloc(*buf, c);
    if (!g) return -1;
    *buf = g;
    *cap = c;
    return 0;
}

/* One complete line (without its end). */
static int on_line(tsr_sse *p, tsr_error *err) {
    const char *l = p->line ? p->line : "";
    size_t n = p->line_len;
    if (n == 0) { /* dispatch */
        int rc = TSR_OK;
        if (p->has_data) {
            p->n_events++;
            if (p->fn(p->ud, p->type, p->data, p->data_len))
                rc = tsr_error_set(err, TSR_ERR_CANCELLED, "event stream: stopped by the reader");
        }
        p->has_data = 0;
        p->data_len = 0;
        strcpy(p->type, "message");
        return rc;
    }
    if (l[0] == ':') return TSR_OK; /* comment */
    const char *colon = memchr(l, ':', n);
    size_t fl = colon ? (size_t)(colon - l) : n;
    const char *v = colon ? colon + 1 : l + n;
    size_t vl = (size_t)(l + n - v);
    if (vl && *v == ' ') v++, vl--;
    if (fl == 4 && !memcmp(l, "data", 4)) {
        size_t need = p->data_len + vl + 2;
        if (need > TSR_SSE_MAX_EVENT)
            return tsr_error_set(err, TSR_ERR_RANGE, "event stream: an event over %u bytes",
                                 TSR_SSE_MAX_EVENT);
        if (grow(&p->data, &p->data_cap, need))
            return tsr_error_set(err, TSR_ERR_NOMEM, "event stream: out of memory");
        if (p->has_data) p->data[p->data_len++] = '\n';
        memcpy(p->data + p->data_len, v, vl);
        p->data_len += vl;
        p->data[p->data_len] = 0;
        p->has_data = 1;
    } else if (fl == 5 && !memcmp(l, "event", 5)) {
        size_t k = vl < sizeof p->type - 1 ? vl : sizeof p->type - 1;
        memcpy(p->type, v, k);
        p->type[k] = 0;
        if (!k) strcpy(p->type, "message");
    }
    return TSR_OK;
}

int tsr_sse_feed(tsr_sse *p, const char *buf, size_t len, tsr_error *err) {
    for (size_t i = 0; i < len; i++) {
        char c = buf[i];
        if (c == '\n' && p->last_cr) { /* the LF of a CRLF */
            p->last_cr = 0;
            continue;
        }
        p->last_cr = c == '\r';
        if (c == '\n' || c == '\r') {
            int rc = on_line(p, err);
            p->line_len = 0;
            if (rc != TSR_OK) return rc;
            continue;
        }
        if (p->line_len + 2 > TSR_SSE_MAX_EVENT)
            return tsr_error_set(err, TSR_ERR_RANGE, "event stream: a line over %u bytes",
                                 TSR_SSE_MAX_EVENT);
        if (grow(&p->line, &p->line_cap, p->line_len + 2))
            return tsr_error_set(err, TSR_ERR_NOMEM, "event stream: out of memory");
        p->line[p->line_len++] = c;
        p->line[p->line_len] = 0;
    }
    return TSR_OK;
}

int tsr_sse_pending(const tsr_sse *p) { return p->line_len > 0 || p->has_data; }
