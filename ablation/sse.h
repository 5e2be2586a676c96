/*
 * sse.h - an incremental parser of server-sent events (the WHATWG
 * text/event-stream format) for the bench's streaming client: bytes arrive
 * in arbitrary pieces; each complete event is handed to a callback.
 *
 * Lines end in LF, CRLF or CR. "data:" lines (one optional space after the
 * colon dropped) are joined with LF; "event:" sets the type; lines starting
 * with ':' are comments; other fields (id, retry) are ignored. A blank line
 * dispatches the event if it has data. Bytes after the last blank line stay
 * pending until more arrive (tsr_sse_pending tells whether any do).
 */
#ifndef TSR_ABL_SSE_H
#define TSR_ABL_SSE_H

#include <stddef.h>

#include "../core/util/error.h"

#define TSR_SSE_MAX_EVENT (4u << 20) /* bytes of one event's line + data */

/* Return 0 to go on, non-zero to stop (tsr_sse_feed then returns
 * TSR_ERR_CANCELLED). data is NUL-terminated; type is "message" unless set. */
typedef int (*tsr_sse_event_fn)(void *ud, const char *type, const char *data, size_t len);

typedef struct tsr_sse {
    tsr_sse_event_fn fn;
    void *ud;
    char *line;        /* the current, unfinished line */
    size_t line_len, line_cap;
    char *data;        /* data of the current event */
    size_t data_len, data_cap;
    int has_data;
    char type[64];
    int last_cr;       /* the previous byte was CR (a following LF belongs to it) */
    size_t n_events;
} tsr_sse;

void tsr_sse_init(tsr_sse *p, tsr_sse_event_fn fn, void *ud);
void tsr_sse_free(tsr_sse *p);
/* Feed len bytes. TSR_ERR_RANGE: an event beyond TSR_SSE_MAX_EVENT;
 * TSR_ERR_NOMEM; TSR_ERR_CANCELLED: the callback stopped. */
int tsr_sse_feed(tsr_sse *p, const char *buf, size_t len, tsr_error *err);
/* 1 if an unfinished line or undispatched data is pending (a stream cut
 * short). */
int tsr_sse_pending(const tsr_sse *p);

#endif
