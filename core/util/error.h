/*
 * error.h - the caller-owned error record every fallible core call fills.
 *
 * Tier 1: TSR_ASSERT for programmer errors (aborts with file:line).
 * Tier 2: a tsr_status return value (slots/tsr_plugin.h).
 * Tier 3: the details here: a fixed message buffer and, for documents
 * (YAML, JSON, model files), the file and the line:column of the problem.
 */
#ifndef TSR_ERROR_H
#define TSR_ERROR_H

#include <stdio.h>
#include <stdlib.h>

#include "../../slots/tsr_plugin.h"

typedef struct tsr_error {
    int code;            /* tsr_status, TSR_OK when nothing failed */
    char file[512];      /* document or library the error is about, or "" */
    int line;            /* 1-based, 0 when not known */
    int col;             /* 1-based, 0 when not known */
    char msg[1024];
} tsr_error;

#define TSR_ASSERT(x)                                                                      \
    do {                                                                                   \
        if (!(x)) {                                                                        \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #x);     \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

/* Reset to "no error". err may be NULL (then every set is a no-op). */
void tsr_error_clear(tsr_error *err);

/* Record code and a message; returns code so callers can
 * `return tsr_error_set(err, TSR_ERR_INVALID, "...")`. */
int tsr_error_set(tsr_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Same, with the document location (line/col 1-based, 0 = unknown). */
int tsr_error_set_at(tsr_error *err, int code, const char *file, int line, int col,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Prefix the existing message with "prefix: " (context while unwinding). */
void tsr_error_prefix(tsr_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Write "file:line:col: error: msg" (parts known) to buf. */
const char *tsr_error_format(const tsr_error *err, char *buf, size_t size);

/* Short name of a status ("invalid", "out of memory", ...). */
const char *tsr_status_str(int code);

#endif /* TSR_ERROR_H */
