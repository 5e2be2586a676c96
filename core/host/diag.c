#include "diag.h"

#include <stdarg.h>
#include <string.h>

#include "halloc.h"

void tsr_diag_init(tsr_diag *d) { memset(d, 0, sizeof *d); }

void tsr_diag_free(tsr_diag *d) {
    if (!d) return;
    tsr_hfree(d->errors);
    for (int i = 0; i < d->n_notes; i++) tsr_hfree(d->notes[i]);
    tsr_hfree(d->notes);
    memset(d, 0, sizeof *d);
}

static tsr_error *diag_slot(tsr_diag *d) {
    if (d->n_errors >= TSR_DIAG_MAX ||
        tsr_hgrow((void **)&d->errors, sizeof *d->errors, d->n_errors + 1, &d->cap_errors)) {
        d->n_dropped++;
        return NULL;
    }
    return &d->errors[d->n_errors++];
}

int tsr_diag_add(tsr_diag *d, int code, const char *file, int line, int col, const char *fmt, ...) {
    tsr_error *e = diag_slot(d);
    if (!e) return code;
    tsr_error_clear(e);
    e->code = code;
    snprintf(e->file, sizeof e->file, "%s", file ? file : "");
    e->line = line;
    e->col = col;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return code;
}

void tsr_diag_add_error(tsr_diag *d, const tsr_error *src) {
    tsr_error *e = diag_slot(d);
    if (e) *e = *src;
}

void tsr_diag_note(tsr_diag *d, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    for (int i = 0; i < d->n_notes; i++)
        if (!strcmp(d->notes[i], buf)) return;
    if (tsr_hgrow((void **)&d->notes, sizeof *d->notes, d->n_notes + 1, &d->cap_notes)) return;
    char *s = tsr_hstrdup(buf);
    if (s) d->notes[d->n_notes++] = s;
}

int tsr_diag_count(const tsr_diag *d) { return d->n_errors + d->n_dropped; }

int tsr_diag_to_error(const tsr_diag *d, tsr_error *err) {
    if (!err) return d->n_errors ? d->errors[0].code : TSR_ERR_NOMEM;
    if (d->n_errors == 0) {
        if (d->n_dropped)
            return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory while reporting errors");
        tsr_error_clear(err);
        return TSR_OK;
    }
    *err = d->errors[0];
    int more = tsr_diag_count(d) - 1;
    if (more > 0) {
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, " (and %d more error%s)", more,
                 more == 1 ? "" : "s");
    }
    return err->code;
}

void tsr_diag_print(const tsr_diag *d, FILE *f) {
    char buf[2048];
    for (int i = 0; i < d->n_errors; i++)
        fprintf(f, "%s\n", tsr_error_format(&d->errors[i], buf, sizeof buf));
    if (d->n_dropped) fprintf(f, "error: %d more errors not shown\n", d->n_dropped);
    for (int i = 0; i < d->n_notes; i++) fprintf(f, "note: %s\n", d->notes[i]);
}
