#include "error.h"

#include <stdarg.h>
#include <string.h>

void tsr_error_clear(tsr_error *err) {
    if (!err) return;
    err->code = TSR_OK;
    err->file[0] = '\0';
    err->line = err->col = 0;
    err->msg[0] = '\0';
}

static int error_vset(tsr_error *err, int code, const char *file, int line, int col,
                      const char *fmt, va_list ap) {
    if (!err) return code;
    err->code = code;
    snprintf(err->file, sizeof err->file, "%s", file ? file : "");
    err->line = line;
    err->col = col;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return code;
}

int tsr_error_set(tsr_error *err, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vset(err, code, NULL, 0, 0, fmt, ap);
    va_end(ap);
    return code;
}

int tsr_error_set_at(tsr_error *err, int code, const char *file, int line, int col,
                     const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vset(err, code, file, line, col, fmt, ap);
    va_end(ap);
    return code;
}

void tsr_error_prefix(tsr_error *err, const char *fmt, ...) {
    if (!err) return;
    char pre[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    size_t pl = strlen(pre), cap = sizeof err->msg;
    /* shift the old message right (cut at the end if need be), then put "pre: " in front */
    memmove(err->msg + pl + 2, err->msg, cap - pl - 3);
    err->msg[cap - 1] = '\0';
    memcpy(err->msg, pre, pl);
    err->msg[pl] = ':';
    err->msg[pl + 1] = ' ';
}

const char *tsr_error_format(const tsr_error *err, char *buf, size_t size) {
    if (!err->file[0])
        snprintf(buf, size, "error: %s", err->msg);
    else if (err->line > 0 && err->col > 0)
        snprintf(buf, size, "%s:%d:%d: error: %s", err->file, err->line, err->col, err->msg);
    else if (err->line > 0)
        snprintf(buf, size, "%s:%d: error: %s", err->file, err->line, err->msg);
    else
        snprintf(buf, size, "%s: error: %s", err->file, err->msg);
    return buf;
}

const char *tsr_status_str(int code) {
    switch (code) {
    case TSR_OK: return "ok";
    case TSR_ERR_INVALID: return "invalid";
    case TSR_ERR_NOMEM: return "out of memory";
    case TSR_ERR_IO: return "i/o error";
    case TSR_ERR_FORMAT: return "malformed";
    case TSR_ERR_UNSUPPORTED: return "unsupported";
    case TSR_ERR_NOT_IMPLEMENTED: return "not implemented";
    case TSR_ERR_REFUSED: return "refused";
    case TSR_ERR_PLUGIN: return "plugin error";
    case TSR_ERR_RANGE: return "out of range";
    case TSR_ERR_DEVICE: return "device error";
    case TSR_ERR_CANCELLED: return "cancelled";
    default: return "unknown error";
    }
}
